//! `--restart on-failure`: a child server restarted when it crashes.
//!
//! The supervisor sits between the session and the current child. When the child dies
//! unexpectedly it tells the session (whose requests in flight then get errors — they are lost
//! with the process), waits with exponential backoff, starts a new child, initializes it with
//! the client's original `initialize` (and `notifications/initialized`), and sends the client
//! `notifications/tools/list_changed` so that it reads the tools again. Messages the client sends
//! meanwhile wait in the queue. More than five crashes in a minute end the session.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use super::child::SpawnError;
use super::{Event, Link, Outgoing, Upstream};
use crate::queue;
use crate::wire::framing::Frame;
use crate::wire::jsonrpc;
use crate::wire::message::{self, Kind, Parsed};

const MAX_CRASHES: usize = 5;
const CRASH_WINDOW: Duration = Duration::from_secs(60);
const INIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts the first child now (so that a bad command fails at once), then supervises.
pub fn start(command: Vec<String>, max_message_bytes: usize) -> Result<Upstream, SpawnError> {
    let first = Upstream::child(&command, max_message_bytes)?;
    Ok(Upstream::spawn(move |link| {
        supervise(command, max_message_bytes, first, link)
    }))
}

fn kind(bytes: &[u8]) -> Option<Kind> {
    match message::parse(bytes) {
        Ok(Parsed::Single(kind)) => Some(kind),
        _ => None,
    }
}

async fn supervise(
    command: Vec<String>,
    max_message_bytes: usize,
    mut current: Upstream,
    link: Link,
) {
    let Link {
        mut messages,
        events,
        stop,
    } = link;
    let mut initialize: Option<Outgoing> = None;
    let mut initialized = false;
    let mut subscribed = super::Subscribed::default();
    // The ids of the resubscriptions whose answers are still to come (kept from the client).
    let mut resubscribing: HashSet<String> = HashSet::new();
    let mut crashes: VecDeque<Instant> = VecDeque::new();
    let mut stopper = current.stopper();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            message = messages.recv() => {
                let Some(message) = message else {
                    // The session is gone: stop the child the ordinary way.
                    stopper.stop(Duration::from_secs(3));
                    drain_until_ended(&mut current, &events).await;
                    return;
                };
                if message.initialize && initialize.is_none() {
                    initialize = Some(message.clone());
                }
                if message.requests.len() == 1 {
                    subscribed.track(&message);
                }
                initialized |= message.initialized;
                let _ = current.to_server.send(message).await;
            }
            grace = &mut stop => {
                stopper.stop(grace.unwrap_or(Duration::ZERO));
                drain_until_ended(&mut current, &events).await;
                return;
            }
            event = current.events.recv() => match event {
                Some(event) if resubscribe_answer(&event, &mut resubscribing) => {}
                Some(event @ (Event::Frame(_) | Event::Large(..) | Event::Related { .. })) => {
                    if events.send(event).await.is_err() {
                        return;
                    }
                }
                Some(Event::Ended { reason, stopped: false }) => {
                    let now = Instant::now();
                    crashes.push_back(now);
                    while crashes.front().is_some_and(|t| now.duration_since(*t) > CRASH_WINDOW) {
                        crashes.pop_front();
                    }
                    if crashes.len() > MAX_CRASHES {
                        let reason = format!("{reason} (it crashed {} times within a minute; not restarting it again)", crashes.len());
                        let _ = events.send(Event::Ended { reason, stopped: false }).await;
                        return;
                    }
                    tracing::warn!(%reason, restarts = crashes.len(), "the server crashed; restarting it");
                    if let Some(metrics) = crate::metrics::get() {
                        metrics.upstream_restarts.inc();
                    }
                    let _ = events.send(Event::Restarting { reason: reason.clone() }).await;
                    let backoff = Duration::from_millis(250 * (1 << (crashes.len() - 1).min(5)));
                    tokio::time::sleep(backoff).await;
                    match restart(&command, max_message_bytes, initialize.as_ref(), initialized).await {
                        Ok(fresh) => {
                            current = fresh;
                            stopper = current.stopper();
                            tracing::info!("the server was restarted and re-initialized");
                            if initialized {
                                resubscribing = resubscribe(&current, &subscribed).await;
                            }
                            let _ = events.send(Event::Frame(Frame::Line(jsonrpc::tools_list_changed()))).await;
                        }
                        Err(why) => {
                            let _ = events.send(Event::Ended { reason: format!("{reason}; restarting it failed: {why}"), stopped: false }).await;
                            return;
                        }
                    }
                }
                Some(ended @ Event::Ended { .. }) => {
                    let _ = events.send(ended).await;
                    return;
                }
                Some(Event::Restarting { .. }) => {}
                None => {
                    let _ = events.send(Event::Ended { reason: "the server's events ended".into(), stopped: false }).await;
                    return;
                }
            },
        }
    }
}

async fn drain_until_ended(current: &mut Upstream, events: &queue::Sender<Event>) {
    while let Some(event) = current.events.recv().await {
        let ended = matches!(event, Event::Ended { .. });
        let _ = events.send(event).await;
        if ended {
            return;
        }
    }
}

/// A new child, initialized like the first one was.
async fn restart(
    command: &[String],
    max_message_bytes: usize,
    initialize: Option<&Outgoing>,
    initialized: bool,
) -> Result<Upstream, String> {
    let mut fresh = Upstream::child(command, max_message_bytes).map_err(|e| e.to_string())?;
    let Some(initialize) = initialize else {
        return Ok(fresh);
    };
    let Some(id) = initialize.requests.first().cloned() else {
        return Ok(fresh);
    };
    fresh
        .to_server
        .send(initialize.clone())
        .await
        .map_err(|_| "the new server closed its input".to_string())?;
    let answered = tokio::time::timeout(INIT_TIMEOUT, async {
        while let Some(event) = fresh.events.recv().await {
            match event {
                // Its answer to the replayed initialize is ours: the client already has one.
                Event::Frame(Frame::Line(line)) if matches!(kind(&line), Some(Kind::Response { id: Some(ref got), .. }) if got.key() == id.key()) => {
                    return Ok(());
                }
                Event::Ended { reason, .. } => return Err(reason),
                _ => {}
            }
        }
        Err("the new server ended".to_string())
    })
    .await
    .map_err(|_| format!("the new server did not answer initialize within {} s", INIT_TIMEOUT.as_secs()))?;
    answered?;
    if initialized {
        fresh
            .to_server
            .send(Outgoing::notification(jsonrpc::initialized()))
            .await
            .map_err(|_| "the new server closed its input".to_string())?;
    }
    Ok(fresh)
}

/// Makes the crashed server's resource subscriptions again in the new one (the client made
/// them, and is told only to list its tools again): the requests go now, and their ids are
/// returned, so that their answers (the proxy's) are kept from the client. Nothing waits for
/// them: what the new server sends meanwhile (a `roots/list`, say) reaches the client.
async fn resubscribe(fresh: &Upstream, subscribed: &super::Subscribed) -> HashSet<String> {
    let mut ids = HashSet::new();
    for (n, (_, request)) in subscribed.requests().into_iter().enumerate() {
        let id = message::Id::from_json_text(&format!("\"{}{n}\"", super::RESUBSCRIBE_ID));
        ids.insert(id.key().to_string());
        let sent = fresh
            .to_server
            .send(Outgoing {
                bytes: request,
                requests: vec![id],
                ..Outgoing::default()
            })
            .await;
        if sent.is_err() {
            break;
        }
    }
    if !ids.is_empty() {
        tracing::info!(
            subscriptions = ids.len(),
            "resource subscriptions made again in the restarted server"
        );
    }
    ids
}

/// Whether `event` answers one of the proxy's own `resubscribe` requests (taken from `ids`).
fn resubscribe_answer(event: &Event, ids: &mut HashSet<String>) -> bool {
    if ids.is_empty() {
        return false;
    }
    let Event::Frame(Frame::Line(line) | Frame::Read { line, .. }) = event else {
        return false;
    };
    if !crate::holds!(line, super::RESUBSCRIBE_ID.as_bytes()) {
        return false;
    }
    let Some(Kind::Response { id: Some(id), .. }) = kind(line) else {
        return false;
    };
    if !ids.remove(id.key()) {
        return false;
    }
    if crate::holds!(line, b"\"error\"") {
        tracing::warn!(excerpt = %jsonrpc::excerpt(line, 200), "the restarted server refused a resource subscription made again");
    }
    true
}
