//! The server side of a session: a child process or a Streamable HTTP endpoint, behind one
//! interface — a sender of messages to the server and a receiver of what it sends back.
//!
//! Every upstream ends with exactly one [`Event::Ended`], whether it was stopped or died, so
//! the session above it always learns why and can answer the requests still in flight.

pub mod body;
pub mod child;
pub mod conn;
mod exchanges;
pub mod http;
mod http_spec;
#[cfg(feature = "oauth")]
pub mod oauth;
pub mod replay;
pub mod supervise;

use std::future::Future;
use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::queue::{self, Weigh};
use crate::wire::framing::{Frame, FrameReader};
use crate::wire::message::Id;
use child::{ChildServer, SpawnError};

/// Where the server is.
#[derive(Debug, Clone)]
pub enum UpstreamSpec {
    /// A command to start, speaking MCP on its stdio.
    Command(Vec<String>),
    /// A command restarted when it crashes (`--restart on-failure`).
    Supervised(Vec<String>),
    /// A Streamable HTTP endpoint.
    Http(http::HttpSpec),
    /// A recorded server (`mcp-budget replay`).
    Replay(std::sync::Arc<crate::replay::Replayer>),
}

impl UpstreamSpec {
    /// What identifies the server this spec reaches, for remembering who it said it is: its
    /// command line, or its URL (a recording names nothing).
    pub fn origin(&self) -> Option<String> {
        match self {
            UpstreamSpec::Command(args) | UpstreamSpec::Supervised(args) => {
                Some(args.join("\u{0}"))
            }
            UpstreamSpec::Http(spec) => Some(spec.url.to_string()),
            UpstreamSpec::Replay(_) => None,
        }
    }
}

/// What comes from the server.
#[derive(Debug)]
pub enum Event {
    Frame(Frame),
    /// A large message, with its place among those held at once (see
    /// [`crate::wire::framing::LARGE_LINE`]): given up once it is budgeted.
    Large(Frame, crate::wire::framing::LargeHold),
    /// A server request or notification that came related to one client request (on the HTTP
    /// stream of that request's POST): it goes to the client stream of that request.
    Related {
        frame: Frame,
        request: Id,
    },
    /// The upstream is gone. `stopped` is true when we asked it to stop.
    Ended {
        reason: String,
        stopped: bool,
    },
    /// The server crashed and is being restarted: the requests in flight are lost.
    Restarting {
        reason: String,
    },
}

impl Weigh for Event {
    fn weight(&self) -> usize {
        match self {
            Event::Frame(Frame::Line(line) | Frame::Read { line, .. })
            | Event::Large(Frame::Line(line) | Frame::Read { line, .. }, _)
            | Event::Related {
                frame: Frame::Line(line) | Frame::Read { line, .. },
                ..
            } => line.len(),
            _ => 0,
        }
    }
}

/// A message for the server: its bytes, and what a transport needs to know of them, read with
/// the envelope where the message was read (the relay), not again on the way out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outgoing {
    pub bytes: Vec<u8>,
    /// The ids of the requests in it, as the server sees them.
    pub requests: Vec<Id>,
    /// It holds the `initialize` request.
    pub initialize: bool,
    /// It holds `notifications/initialized`.
    pub initialized: bool,
    /// It is a modern request (2026-07-28): the HTTP headers it travels with.
    pub modern: Option<Box<crate::era::Headers>>,
    /// The room a large client body took of `--max-body-bytes-in-flight`: held until these
    /// bytes are written upstream (dropped with the message), so that the bound counts what
    /// the proxy really holds, queued bytes included.
    pub held: Held,
}

/// Room held for a message's bytes (see [`Outgoing::held`]); two messages compare equal
/// whatever they hold.
#[derive(Debug, Clone, Default)]
pub struct Held(pub Option<std::sync::Arc<tokio::sync::OwnedSemaphorePermit>>);

impl PartialEq for Held {
    fn eq(&self, _: &Held) -> bool {
        true
    }
}

impl Eq for Held {}

impl Outgoing {
    /// A message the proxy wrote itself that asks nothing of the server (a notification).
    pub fn notification(bytes: Vec<u8>) -> Outgoing {
        Outgoing {
            bytes,
            ..Outgoing::default()
        }
    }
}

impl std::ops::Deref for Outgoing {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl AsRef<[u8]> for Outgoing {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Weigh for Outgoing {
    fn weight(&self) -> usize {
        self.bytes.len()
    }
}

/// The upstream could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error(transparent)]
    Http(#[from] http::HttpError),
}

/// A running upstream.
pub struct Upstream {
    /// Messages to the server, one per element, without a trailing newline.
    pub to_server: queue::Sender<Outgoing>,
    /// Messages from the server, then one `Ended`.
    pub events: queue::Receiver<Event>,
    /// Stop control, taken by [`Upstream::stopper`].
    stop: Option<oneshot::Sender<Duration>>,
    task: Option<JoinHandle<()>>,
}

/// Asks an upstream to stop (give the server `grace` to finish, then end it).
pub struct Stopper(Option<oneshot::Sender<Duration>>);

impl Stopper {
    pub fn stop(&mut self, grace: Duration) {
        if let Some(stop) = self.0.take() {
            let _ = stop.send(grace);
        }
    }
}

/// The upstream's ends of its queues, for the task that drives it.
pub(crate) struct Link {
    /// What the session sends to the server.
    pub messages: queue::Receiver<Outgoing>,
    /// What the server sends, then one `Ended`.
    pub events: queue::Sender<Event>,
    /// The session asks the upstream to stop, with a grace period.
    pub stop: oneshot::Receiver<Duration>,
}

impl Upstream {
    /// Starts the upstream.
    pub async fn start(
        spec: &UpstreamSpec,
        max_message_bytes: usize,
    ) -> Result<Upstream, StartError> {
        match spec {
            UpstreamSpec::Command(command) => Ok(Upstream::child(command, max_message_bytes)?),
            UpstreamSpec::Supervised(command) => {
                Ok(supervise::start(command.clone(), max_message_bytes)?)
            }
            UpstreamSpec::Http(spec) => Ok(http::start(spec.clone(), max_message_bytes)?),
            UpstreamSpec::Replay(replayer) => Ok(replay::upstream(replayer.clone())),
        }
    }

    pub(crate) fn child(
        command: &[String],
        max_message_bytes: usize,
    ) -> Result<Upstream, SpawnError> {
        let (child, pipes) = ChildServer::spawn(command)?;
        Ok(Upstream::spawn(move |link| {
            run_child(child, pipes, link, max_message_bytes)
        }))
    }

    /// The one place an upstream is assembled: its queues (bounded in bytes), its stop
    /// control, and the task `drive` returns, which owns the upstream's ends.
    pub(crate) fn spawn<F, Fut>(drive: F) -> Upstream
    where
        F: FnOnce(Link) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (to_server, messages) = queue::channel(queue::DEFAULT_QUEUE_BYTES);
        let (events_tx, events) = queue::channel(queue::DEFAULT_QUEUE_BYTES);
        let (stop, stop_rx) = oneshot::channel();
        let task = tokio::spawn(drive(Link {
            messages,
            events: events_tx,
            stop: stop_rx,
        }));
        Upstream {
            to_server,
            events,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// The stop control (once).
    pub fn stopper(&mut self) -> Stopper {
        Stopper(self.stop.take())
    }

    /// The task driving the upstream; it ends after `Ended` was sent.
    pub fn take_task(&mut self) -> Option<JoinHandle<()>> {
        self.task.take()
    }
}

async fn run_child(
    mut child: ChildServer,
    pipes: child::ChildPipes,
    link: Link,
    max_message_bytes: usize,
) {
    let Link {
        messages: to_server,
        events,
        stop,
    } = link;
    let mut writer = tokio::spawn(write_lines(pipes.stdin, to_server, "server"));
    let frames_out = events.clone();
    let mut reader = tokio::spawn(async move {
        let mut frames = FrameReader::new(pipes.stdout, max_message_bytes).holding_large_lines();
        loop {
            match frames.next_frame().await {
                Ok(Some(frame)) => {
                    let event = match frames.take_hold() {
                        Some(hold) => Event::Large(frame, hold),
                        None => Event::Frame(frame),
                    };
                    if frames_out.send(event).await.is_err() {
                        return;
                    }
                }
                Ok(None) => return,
                Err(err) => {
                    tracing::warn!(%err, "reading from the server failed");
                    return;
                }
            }
        }
    });
    tokio::pin!(stop);
    let mut reader_done = false;
    let (reason, stopped) = tokio::select! {
        grace = &mut stop => {
            let grace = grace.unwrap_or(Duration::ZERO);
            // Let queued messages reach the server, then close its stdin.
            if tokio::time::timeout(grace.min(Duration::from_secs(1)), &mut writer).await.is_err() {
                writer.abort();
            }
            let status = child.terminate(grace).await;
            tracing::info!(status = ?status.ok(), "server stopped");
            (String::from("stopped"), true)
        }
        _ = &mut reader => {
            reader_done = true;
            // Its input was closed (every sender dropped and the writer done): exiting is
            // what a server should do then, not a failure.
            let input_closed = writer.is_finished();
            let status = tokio::time::timeout(Duration::from_millis(500), child.wait()).await;
            let status = match status {
                Ok(Ok(status)) => Some(status),
                _ => {
                    child.terminate(Duration::ZERO).await.ok();
                    None
                }
            };
            child.drain_stderr(Duration::from_millis(500)).await;
            (child::exit_reason(status, &child.stderr_tail()), input_closed && status.is_some_and(|s| s.success()))
        }
        status = child.wait() => {
            child.drain_stderr(Duration::from_millis(500)).await;
            (child::exit_reason(status.ok(), &child.stderr_tail()), false)
        }
    };
    // However the server ended, nothing it started outlives it: end its process group.
    child.signal_group(nix::sys::signal::Signal::SIGTERM);
    if !stopped {
        tracing::error!(%reason, "upstream server ended");
    }
    // Everything the server wrote before it ended reaches the session before `Ended`.
    if !reader_done
        && tokio::time::timeout(Duration::from_secs(1), &mut reader)
            .await
            .is_err()
    {
        reader.abort();
    }
    writer.abort();
    let _ = events.send(Event::Ended { reason, stopped }).await;
}

/// Writes each message as one line, flushing whenever the queue is empty.
pub(crate) async fn write_lines<W: AsyncWrite + Unpin, M: AsRef<[u8]> + Weigh>(
    out: W,
    mut queue: queue::Receiver<M>,
    peer: &'static str,
) {
    let mut out = BufWriter::with_capacity(64 * 1024, out);
    while let Some(message) = queue.recv().await {
        let written = async {
            out.write_all(message.as_ref()).await?;
            out.write_all(b"\n").await?;
            if queue.is_empty() {
                out.flush().await?;
            }
            std::io::Result::Ok(())
        }
        .await;
        if let Err(err) = written {
            tracing::warn!(%err, peer, "writing failed; the peer is gone");
            return;
        }
    }
    let _ = out.flush().await;
    let _ = out.shutdown().await;
}

/// The resources a session subscribed to (`resources/subscribe` sent, and no
/// `resources/unsubscribe` since), made again in the session that replaces it (a renewed HTTP
/// session, a restarted child): the client made them and is not told they are gone.
#[derive(Default)]
pub struct Subscribed {
    uris: std::collections::BTreeSet<String>,
    bytes: usize,
}

impl Subscribed {
    /// At most this many bytes of URIs are kept.
    const MAX_BYTES: usize = 1 << 20;

    /// Notes a request sent in the session, when it subscribes or unsubscribes.
    pub fn track(&mut self, request: &[u8]) {
        let Some((on, uri)) = subscription(request) else {
            return;
        };
        if !on {
            if self.uris.remove(&uri) {
                self.bytes -= uri.len();
            }
        } else if self.bytes + uri.len() <= Self::MAX_BYTES {
            let len = uri.len();
            if self.uris.insert(uri) {
                self.bytes += len;
            }
        } else {
            tracing::warn!(
                "over 1 MiB of subscribed resource URIs: this one is not made again if the server's session is replaced"
            );
        }
    }

    pub fn clear(&mut self) {
        self.uris.clear();
        self.bytes = 0;
    }

    /// The `resources/subscribe` requests that make them again (ids the proxy's own:
    /// `mcp-budget-resubscribe-N`), with their URIs.
    pub fn requests(&self) -> Vec<(String, Vec<u8>)> {
        self.uris
            .iter()
            .enumerate()
            .map(|(n, uri)| {
                let request = serde_json::json!({"jsonrpc": "2.0",
                    "id": format!("{RESUBSCRIBE_ID}{n}"),
                    "method": "resources/subscribe", "params": {"uri": uri}});
                (uri.clone(), request.to_string().into_bytes())
            })
            .collect()
    }
}

/// The prefix of the ids of [`Subscribed::requests`].
pub const RESUBSCRIBE_ID: &str = "mcp-budget-resubscribe-";

/// The URI of a `resources/subscribe` (`true`) or `resources/unsubscribe` (`false`) request.
fn subscription(bytes: &[u8]) -> Option<(bool, String)> {
    if !crate::holds!(bytes, b"resources/") {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct Request<'a> {
        #[serde(borrow)]
        method: std::borrow::Cow<'a, str>,
        params: Params,
    }
    #[derive(serde::Deserialize)]
    struct Params {
        uri: String,
    }
    let request: Request = serde_json::from_slice(bytes).ok()?;
    match &*request.method {
        "resources/subscribe" => Some((true, request.params.uri)),
        "resources/unsubscribe" => Some((false, request.params.uri)),
        _ => None,
    }
}
