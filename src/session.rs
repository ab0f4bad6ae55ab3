//! The session driver: what every transport runs for one client session, whatever carries it.
//!
//! A session is a [`Relay`] between a client and an [`Upstream`](crate::upstream::Upstream).
//! The driver moves the server's messages through the relay to the client (and answers the
//! requests a restarted server lost), and times out what the server leaves unanswered. A
//! transport adds only what is its own: stdio reads the client's frames and writes its lines;
//! the HTTP listener routes each message to the client stream it belongs to. It hands the
//! driver a [`ClientSide`] and gets back why the upstream ended.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::intercept::Interceptor;
use crate::queue;
use crate::relay::Relay;
use crate::upstream::Event;
use crate::wire::message::{self, Id, Kind};

/// Settings of a session, whatever the transport.
#[derive(Debug, Clone)]
pub struct Options {
    /// Messages above this size are refused with an error instead of being buffered.
    pub max_message_bytes: usize,
    /// How long the server may take to exit by itself once its stdin is closed.
    pub shutdown_grace: Duration,
    /// Requests unanswered this long get an error and are cancelled upstream.
    pub request_timeout: Option<Duration>,
    /// `initialize` unanswered this long gets an error (the server never came up).
    pub initialize_timeout: Duration,
    /// At most this many requests in flight per session.
    pub max_in_flight: usize,
    /// The server's protocol era, or `auto` to learn it (`--server-era`).
    pub server_era: crate::era::bridge::EraChoice,
    /// The clients' protocol era, or `auto` to serve both (`--client-era`).
    pub client_era: crate::era::bridge::EraChoice,
    /// How long a call waits upstream for a modern client's retry with the input a legacy
    /// server asked for (`--input-timeout-secs`).
    pub input_timeout: Duration,
    /// Whether a client of one era is bridged to a server of the other (off for a recording:
    /// it answers as the server did).
    pub bridge: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_message_bytes: crate::wire::framing::DEFAULT_MAX_MESSAGE_BYTES,
            shutdown_grace: Duration::from_secs(3),
            request_timeout: None,
            initialize_timeout: crate::relay::DEFAULT_INITIALIZE_TIMEOUT,
            max_in_flight: crate::relay::DEFAULT_MAX_IN_FLIGHT,
            server_era: crate::era::bridge::EraChoice::Auto,
            client_era: crate::era::bridge::EraChoice::Auto,
            input_timeout: crate::relay::DEFAULT_INPUT_TIMEOUT,
            bridge: true,
        }
    }
}

impl Options {
    /// A relay for one session under these options.
    pub fn relay(&self, interceptor: Interceptor) -> Relay {
        let relay = Relay::new(interceptor)
            .with_max_message_bytes(self.max_message_bytes)
            .with_request_timeout(self.request_timeout)
            .with_initialize_timeout(self.initialize_timeout)
            .with_max_in_flight(self.max_in_flight)
            .with_input_timeout(self.input_timeout)
            .with_client_era(self.client_era);
        match self.bridge {
            true => relay.with_bridge(self.server_era),
            false => relay,
        }
    }
}

/// Where a session's messages for the client go.
pub trait ClientSide: Send + Sync {
    /// Delivers one message (its envelope read, when known), waiting while the client is slow;
    /// `false` once the client is gone.
    fn deliver(&self, bytes: Vec<u8>, kind: Option<Kind>) -> impl Future<Output = bool> + Send;

    /// Delivers a server message that relates to the client request `request` (it came on the
    /// upstream stream of that request): a client with several streams sends it on that
    /// request's stream.
    fn deliver_related(
        &self,
        bytes: Vec<u8>,
        kind: Option<Kind>,
        request: Id,
    ) -> impl Future<Output = bool> + Send {
        let _ = request;
        self.deliver(bytes, kind)
    }
}

/// A client that is one queue of lines (stdio).
impl ClientSide for queue::Sender<Vec<u8>> {
    async fn deliver(&self, bytes: Vec<u8>, _kind: Option<Kind>) -> bool {
        self.send(bytes).await.is_ok()
    }
}

/// Delivers a message the proxy wrote itself (its envelope is read here: such messages are
/// small and rare).
async fn deliver_own(client: &impl ClientSide, bytes: Vec<u8>) -> bool {
    let kind = message::parse(&bytes)
        .ok()
        .and_then(message::Parsed::single);
    client.deliver(bytes, kind).await
}

/// What a request in flight is answered with when the server crashed and is restarted.
pub fn restarting(reason: &str) -> String {
    format!("{reason}; mcp-budget is restarting the server: send the request again")
}

/// Relays the upstream's messages to the client until the upstream ends; returns why it ended
/// and whether it was asked to (`None` when the client went away first).
pub async fn server_to_client(
    mut events: queue::Receiver<Event>,
    relay: &Arc<Relay>,
    client: &impl ClientSide,
    to_server: &queue::WeakSender<crate::upstream::Outgoing>,
) -> Option<(String, bool)> {
    // A policy reload that changes descriptors: the client is told to list the tools again.
    // (Without a policy file to reload, the loop waits on the server alone.)
    let mut reloads = relay.descriptor_changes();
    if let Some(reloads) = &mut reloads {
        reloads.mark_unchanged();
    }
    loop {
        // A round of input the era bridge holds goes out once the server wrote nothing more
        // for a moment: what it asked at once, it asked in one round.
        let window = async {
            if relay.rounds_waiting() {
                tokio::time::sleep(crate::relay::ROUND_WINDOW).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let event = tokio::select! {
            biased;
            event = events.recv() => event,
            Some(()) = async {
                match &mut reloads {
                    Some(reloads) => reloads.changed().await.ok(),
                    None => std::future::pending().await,
                }
            } => {
                if relay.initialized()
                    && !deliver_own(client, crate::wire::jsonrpc::tools_list_changed()).await
                {
                    return None;
                }
                continue;
            }
            () = window => {
                relay.release_rounds(true);
                if !send_later(relay, client, to_server).await {
                    return None;
                }
                continue;
            }
        };
        match event? {
            Event::Ended { reason, stopped } => return Some((reason, stopped)),
            event => {
                if !handle_event(event, relay, client).await {
                    return None;
                }
                // (A round held past many more server messages goes out anyway.)
                relay.release_rounds(false);
                // What the era bridge sent or answered on the way (see `Relay::take_later`).
                if !send_later(relay, client, to_server).await {
                    return None;
                }
            }
        }
    }
}

/// What the relay sent or answered while it handled a server message or a timeout goes on:
/// `false` once the client is gone.
async fn send_later(
    relay: &Relay,
    client: &impl ClientSide,
    to_server: &queue::WeakSender<crate::upstream::Outgoing>,
) -> bool {
    let later = relay.take_later();
    if later.is_empty() {
        return true;
    }
    for message in later.to_server {
        let Some(sender) = to_server.upgrade() else {
            break;
        };
        if sender.send(message).await.is_err() {
            break;
        }
    }
    for (bytes, kind, related) in later.to_client {
        let delivered = match related {
            Some(request) => client.deliver_related(bytes, kind, request).await,
            None => client.deliver(bytes, kind).await,
        };
        if !delivered {
            return false;
        }
    }
    true
}

/// One server event through the relay to the client: `false` once the client is gone.
async fn handle_event(event: Event, relay: &Arc<Relay>, client: &impl ClientSide) -> bool {
    match event {
        Event::Frame(frame) => {
            if let Some((bytes, kind)) = budgeted(relay, frame).await
                && !client.deliver(bytes, kind).await
            {
                return false;
            }
        }
        Event::Large(frame, hold) => {
            let budgeted = budgeted(relay, frame).await;
            // Budgeted: the next large message may be read (a client slow to take this
            // one's page holds up no other session).
            drop(hold);
            if let Some((bytes, kind)) = budgeted
                && !client.deliver(bytes, kind).await
            {
                return false;
            }
        }
        Event::Related { frame, request } => {
            if let Some((bytes, kind)) = budgeted_related(relay, frame, Some(&request)).await
                && !client.deliver_related(bytes, kind, request).await
            {
                return false;
            }
        }
        Event::Ended { .. } => {}
        Event::Restarting { reason } => {
            for error in relay.fail_pending(&restarting(&reason)) {
                if !deliver_own(client, error).await {
                    return false;
                }
            }
        }
    }
    true
}

/// A server message at least this large may take the budget milliseconds of CPU (a 10 MB
/// result: ~90 ms): on a multi-thread runtime it runs off the I/O threads.
const HEAVY_BYTES: usize = 256 * 1024;

/// Passes one server message through the relay (and so the budget). A large one, when the
/// heavy-work pool runs (the listener), goes there, where it cannot block the I/O of other
/// sessions. The session's own order is kept: this task waits for it.
async fn budgeted(
    relay: &Arc<Relay>,
    frame: crate::wire::framing::Frame,
) -> Option<(Vec<u8>, Option<Kind>)> {
    budgeted_related(relay, frame, None).await
}

/// [`budgeted`], for a message that came on the stream of the request `related`.
async fn budgeted_related(
    relay: &Arc<Relay>,
    frame: crate::wire::framing::Frame,
    related: Option<&Id>,
) -> Option<(Vec<u8>, Option<Kind>)> {
    let size = match &frame {
        crate::wire::framing::Frame::Line(line)
        | crate::wire::framing::Frame::Read { line, .. } => line.len(),
        crate::wire::framing::Frame::TooLarge { .. } => 0,
    };
    let budgeted = if size >= HEAVY_BYTES && crate::heavy::started() {
        let relay = relay.clone();
        let related = related.cloned();
        crate::heavy::run(move || relay.from_server_related(frame, related.as_ref())).await
    } else {
        relay.from_server_related(frame, related)
    };
    // The chains it cut go to the shared cache before their first page goes out.
    flush(relay).await;
    budgeted
}

/// One client frame through `relay`, as every transport runs it: the page a call asks for read
/// from the shared cache first, then the relay's routing, then the chains it cut written to
/// the shared cache, before any of its pages goes out. What is routed is the transport's to
/// send.
pub async fn client_frame(
    relay: &Relay,
    frame: crate::wire::framing::Frame,
) -> crate::relay::Routed {
    use crate::wire::framing::Frame;
    let mut job = None;
    let mut looked = false;
    if let Frame::Line(line) | Frame::Read { line, .. } = &frame {
        prefetch(relay, line).await;
        prefetch_references(relay, line).await;
        job = relay
            .interceptor()
            .references_job(line, relay.max_message_bytes());
        looked = job.is_none();
    }
    let (frame, references) = match job {
        Some(job) => replace_references(job, frame).await,
        None => (frame, None),
    };
    let (references, room) = match references {
        Some((references, room)) => (Some(references), room),
        // The line names no reference: its call is not searched again.
        None => (
            looked.then_some(crate::intercept::Substituted::Unmentioned),
            None,
        ),
    };
    let mut routed = relay.from_client_with(frame, references);
    // What a call grew by holds its room until it is written upstream.
    if let (Some(out), Some(room)) = (routed.to_server.as_mut(), room) {
        out.held = crate::upstream::Held(Some(std::sync::Arc::new(room)));
    }
    // (A rule chain automatic paging took over is cut on the way in.)
    flush(relay).await;
    routed
}

/// The whole results a line's references name, where this replica's memory does not hold
/// them and the shared cache does: read before the references are replaced.
async fn prefetch_references(relay: &Relay, line: &[u8]) {
    let Some(remote) = crate::remote::get() else {
        return;
    };
    // At most a message's worth of results is read for one line.
    let mut budget = relay.max_message_bytes();
    for key in relay.interceptor().reference_lookups(line) {
        match remote.fetch(&key).await {
            Ok(Some(value)) if value.len() <= budget => {
                budget -= value.len();
                relay.interceptor().fetched_whole(key, &value);
            }
            Ok(Some(_)) => {}
            Ok(None) => {
                if let Some(metrics) = crate::metrics::get() {
                    metrics.remote_misses.inc();
                }
            }
            // Logged and counted by `fetch`: the reference is a cache miss.
            Err(_) => {}
        }
    }
}

/// A client line's result references replaced, on the heavy-work pool: the line to route, and
/// what became of them (with the room the line grew into).
async fn replace_references(
    job: crate::intercept::ReferenceJob,
    frame: crate::wire::framing::Frame,
) -> (
    crate::wire::framing::Frame,
    Option<(
        crate::intercept::Substituted,
        Option<tokio::sync::OwnedSemaphorePermit>,
    )>,
) {
    use crate::intercept::Substituted;
    use crate::wire::framing::Frame;
    let (line, parsed) = match frame {
        Frame::Line(line) => (line, None),
        Frame::Read { line, parsed } => (line, Some(parsed)),
        other => return (other, None),
    };
    let (line, outcome) = crate::heavy::run(move || {
        let outcome = job.run(&line);
        (line, outcome)
    })
    .await;
    let as_it_came = |line| match parsed {
        Some(parsed) => Frame::Read { line, parsed },
        None => Frame::Line(line),
    };
    match outcome {
        None => (as_it_came(line), None),
        Some(Ok(replaced)) => {
            let kept_out = replaced.line.len().saturating_sub(line.len());
            if let Some(metrics) = crate::metrics::get() {
                metrics.reference_bytes.inc_by(kept_out as u64);
            }
            let original = line;
            let references = Substituted::Replaced { original };
            let frame = Frame::Read {
                line: replaced.line,
                parsed: replaced.parsed,
            };
            (frame, Some((references, replaced.room)))
        }
        Some(Err(refused)) => {
            tracing::warn!(%refused, "a call's result reference refused");
            (
                as_it_came(line),
                Some((Substituted::Refused(refused), None)),
            )
        }
    }
}

/// Before a client's call reaches the relay: the page it asks for, read from the shared cache
/// into the session (when the call continues a chain this replica does not hold).
pub async fn prefetch(relay: &Relay, line: &[u8]) {
    let Some(remote) = crate::remote::get() else {
        return;
    };
    let Some(key) = relay.interceptor().remote_lookup(line) else {
        return;
    };
    match remote.fetch(&key).await {
        Ok(Some(value)) => relay.interceptor().fetched(key, &value),
        Ok(None) => {
            if let Some(metrics) = crate::metrics::get() {
                metrics.remote_misses.inc();
            }
        }
        // Logged and counted by `fetch`: the call goes on as a miss.
        Err(_) => {}
    }
}

/// After a server message went through the budget: the chains it cut, written to the shared
/// cache before the first page goes out (so that the next page, on any replica, finds them).
pub async fn flush(relay: &Relay) {
    let Some(remote) = crate::remote::get() else {
        return;
    };
    let _flushing = relay.interceptor().flushing().await;
    for write in relay.interceptor().take_writes() {
        // Logged and counted by `store`: the page goes out either way.
        let _ = remote.store(write).await;
    }
}

/// Answers timed-out requests and cancels them upstream, until the client or the upstream is
/// gone (or the caller drops this future). No timer is armed while nothing has a deadline
/// (with the defaults: once `initialize` is answered), so an idle session costs no wake-ups.
pub async fn sweep_timeouts(
    relay: &Relay,
    to_server: &queue::Sender<crate::upstream::Outgoing>,
    client: &impl ClientSide,
) {
    loop {
        match relay.next_deadline() {
            None => relay.deadline_added().await,
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at.into()) => {}
                    () = relay.deadline_added() => continue,
                }
            }
        }
        let expired = relay.expire(Instant::now());
        for cancel in expired.to_server {
            let cancel = crate::upstream::Outgoing::notification(cancel);
            if to_server.send(cancel).await.is_err() {
                return;
            }
        }
        for error in expired.to_client {
            if !deliver_own(client, error).await {
                return;
            }
        }
        if !send_later(relay, client, &to_server.downgrade()).await {
            return;
        }
    }
}
