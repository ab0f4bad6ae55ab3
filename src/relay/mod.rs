//! The relay core: routes one client session's messages, without doing any I/O.
//!
//! Transports (stdio, HTTP) read frames and hand them here; `Relay` says what goes to the
//! server and what goes back to the client. It remembers the client's requests in flight so
//! that responses can be matched to the `tools/list` and `tools/call` hooks, and so that every
//! waiting request gets an error — never silence — when the server goes away.
//!
//! Ids are never rewritten: one relay serves one client and one upstream. So that a response
//! can never reach the wrong request: a request whose id is in flight (compared as JSON-RPC
//! compares them: `1` and `1.0` are one id) is refused; a response the server sends for an id
//! that is not in flight is dropped, never forwarded. The ids of finished requests (answered,
//! timed out, cancelled) are remembered up to a bound, because the server may still answer them,
//! late or twice: a client that reuses one (MCP forbids it, plain JSON-RPC allows it) is served,
//! but its request goes upstream under a fresh id of the proxy's (`"mcp-budget-N"`), and the
//! answer is given back the client's id. The common path — a new id — is never rewritten.
//!
//! Its files: the routing core, which names no era — `client.rs` (a client's frame),
//! `server.rs` (a server's message), `batch.rs`, `flights.rs` (ids in flight, admission),
//! `ends.rs` (how a request ends without an answer) — and the era's hooks it calls at each step:
//! `era_in.rs` (a client request's era: refusals, task tokens, headers, what the bridge keeps
//! of it), `era_out.rs` (a server message's era: the handshakes, a legacy server's logs and
//! requests), `era_ends.rs` (timeouts and restarts of what the era holds), `bridged.rs` (the
//! bridge's state and the legacy session it opens), `mrtr.rs` (MRTR rounds), `listens.rs`
//! (listens the proxy serves or holds) and `era_state.rs` (the request context, and what the
//! era keeps of a request in flight).

mod batch;
mod bridged;
mod client;
mod ends;
mod era_ends;
mod era_in;
mod era_out;
mod era_state;
mod flights;
mod listens;
mod mrtr;
mod server;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::era::bridge::Era;
use crate::intercept::Interceptor;
use crate::recording::{Dir, Recorder};
use crate::upstream::Outgoing;
use crate::wire::message::{Id, Kind};

use bridged::Bridge;
use flights::{InFlight, Retired};

/// Where the messages from one client frame go.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Routed {
    /// The message to send to the server, if any.
    pub to_server: Option<Outgoing>,
    /// Messages the proxy answers the client with directly (errors, intercepted calls).
    pub to_client: Vec<Vec<u8>>,
    /// The requests now in flight, waiting for the server's answer.
    pub accepted: Vec<Id>,
    /// The proxy's own `server/discover`, to send before `to_server`: a modern client's
    /// first request, while the server has not named itself, asks it who it is (for its
    /// built-in policy) on the way.
    pub probe: Option<Outgoing>,
    /// Answers the proxy writes off the I/O threads (a search): run each on the heavy-work
    /// pool ([`crate::heavy::run`]) and send what it returns, after `to_client`.
    pub deferred: Vec<crate::intercept::Deferred>,
    /// More messages for the server, after `to_server`, each on its own (a modern client's
    /// answers to several of a legacy server's requests: 2025 servers take no batches).
    pub also_to_server: Vec<Outgoing>,
}

/// What happens to one client message.
enum Forward {
    /// Nothing goes upstream (the proxy answered it).
    Drop,
    /// The bytes go upstream as they arrived.
    Unchanged,
    /// These bytes go upstream instead.
    Rewritten(Vec<u8>),
}

/// The default bound on requests in flight in one session.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// How long `initialize` may go unanswered by default (the server never came up).
pub const DEFAULT_INITIALIZE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a round of input waits for more of the server's requests once none waits to be
/// read. A server asks several things at once in one turn of its loop, but its writes may
/// still reach the proxy in separate reads (an SSE event each, microseconds apart): waiting
/// only for an empty queue split a round of three in two of three conformance runs.
pub const ROUND_WINDOW: Duration = Duration::from_millis(25);

/// How long a parked call waits for its retry by default (`--input-timeout-secs`).
pub const DEFAULT_INPUT_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Default)]
struct State {
    /// Requests in flight, by the key of the id the server saw.
    pending: HashMap<Box<str>, InFlight>,
    /// Client id key → upstream id key, for requests in flight under a fresh id.
    aliases: HashMap<Box<str>, Box<str>>,
    /// How many fresh ids were made.
    fresh: u64,
    retired: Retired,
    /// Whether the client sent `initialize` in this session.
    initialized: bool,
    /// Whether the proxy asked the server who it is (`server/discover`).
    probed: bool,
    /// Set once the upstream is gone: new requests are answered with this reason.
    closed: Option<String>,
    /// The era bridge of this session (see [`crate::era::bridge`]).
    bridge: Bridge,
    /// Messages for the server that a server message or a timeout produced (the era bridge's
    /// own requests, and the client requests it held): see [`Relay::take_later`].
    later: Later,
}

/// What went out of the relay while it handled a server message or a timeout.
#[derive(Default, Debug)]
pub struct Later {
    /// Messages for the server.
    pub to_server: Vec<Outgoing>,
    /// Messages for the client (with their envelope, for routing, and the client request
    /// they belong to, if any).
    pub to_client: Vec<(Vec<u8>, Option<Kind>, Option<Id>)>,
}

impl Later {
    pub fn is_empty(&self) -> bool {
        self.to_server.is_empty() && self.to_client.is_empty()
    }
}

/// Counts a client message refused as bad input, when metrics are on.
fn bad_input() {
    if let Some(metrics) = crate::metrics::get() {
        metrics.bad_input.inc();
    }
}

/// One client session's routing state.
pub struct Relay {
    interceptor: Interceptor,
    state: Mutex<State>,
    recorder: Option<Recorder>,
    request_timeout: Option<Duration>,
    initialize_timeout: Duration,
    max_in_flight: usize,
    /// Whether the era bridge works at all (off for recordings and the relay's own tests):
    /// when off, nothing of it is looked at.
    bridge_on: bool,
    /// The one era of clients served (`--client-era`), when one is forced.
    client_era: Option<Era>,
    /// How many server messages were handled since a round of input was held unsent (0:
    /// none is; see [`Relay::release_rounds`]).
    rounds_held: std::sync::atomic::AtomicUsize,
    /// How long a parked MRTR call waits for its client's retry.
    input_timeout: Duration,
    /// Signalled when a request with a deadline goes in flight.
    deadline_added: tokio::sync::Notify,
    /// The most a client message may be (`--max-message-bytes`): a call whose result
    /// references are replaced may not grow past it.
    max_message_bytes: usize,
}

/// What reaches the client of one server message.
enum Delivery {
    Unchanged,
    Rewritten(Vec<u8>),
    /// Nothing: the server answered an id that is not in flight.
    Drop,
}

/// What a timeout sweep produced.
#[derive(Debug, Default)]
pub struct Expired {
    /// Errors for the client, one per timed-out request.
    pub to_client: Vec<Vec<u8>>,
    /// `notifications/cancelled` for the server, one per timed-out request.
    pub to_server: Vec<Vec<u8>>,
}

impl Relay {
    pub fn new(interceptor: Interceptor) -> Self {
        Relay {
            interceptor,
            state: Mutex::new(State::default()),
            recorder: None,
            request_timeout: None,
            initialize_timeout: DEFAULT_INITIALIZE_TIMEOUT,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            input_timeout: DEFAULT_INPUT_TIMEOUT,
            bridge_on: false,
            client_era: None,
            rounds_held: std::sync::atomic::AtomicUsize::new(0),
            deadline_added: tokio::sync::Notify::new(),
            max_message_bytes: crate::wire::framing::DEFAULT_MAX_MESSAGE_BYTES,
        }
    }

    /// A client message may be at most `max` bytes, its result references replaced.
    pub fn with_max_message_bytes(mut self, max: usize) -> Self {
        self.max_message_bytes = max;
        self
    }

    /// The most a client message may be.
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// The earliest deadline of a request in flight.
    pub fn next_deadline(&self) -> Option<Instant> {
        let state = self.state();
        let calls = state.pending.values().filter_map(|f| f.deadline);
        calls.chain(state.bridge.next_deadline()).min()
    }

    /// Completes when a request with a deadline went in flight (since the last call).
    pub async fn deadline_added(&self) {
        self.deadline_added.notified().await;
    }

    /// What the relay sent or answered while it handled server messages and timeouts since
    /// the last call: the transport sends it on (after the message it handled).
    pub fn take_later(&self) -> Later {
        std::mem::take(&mut self.state().later)
    }

    /// At most `max` requests in flight; more are refused with an error until answers come.
    pub fn with_max_in_flight(mut self, max: usize) -> Self {
        self.max_in_flight = max.max(1);
        self
    }

    /// How long `initialize` may go unanswered (whatever `--request-timeout-secs` says).
    pub fn with_initialize_timeout(mut self, timeout: Duration) -> Self {
        self.initialize_timeout = timeout;
        self
    }

    /// The session's interceptor (what its `tools/list` said of each tool).
    pub fn interceptor(&self) -> &Interceptor {
        &self.interceptor
    }

    /// Changes when a policy reload changed what descriptors say.
    pub fn descriptor_changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.interceptor.descriptor_changes()
    }

    /// Whether the client initialized this session.
    pub fn initialized(&self) -> bool {
        self.state().initialized
    }

    /// Requests unanswered after `timeout` get an error and are cancelled upstream (see
    /// [`Relay::expire`]).
    pub fn with_request_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Records every message of this session.
    pub fn with_recorder(mut self, recorder: Recorder) -> Self {
        self.recorder = Some(recorder);
        self
    }

    fn record_answers(&self, answers: &[Vec<u8>]) {
        if let Some(recorder) = &self.recorder {
            for answer in answers {
                recorder.message(Dir::ProxyToClient, answer, None);
            }
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means another thread panicked mid-update of a plain map; the
        // map itself is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Number of client requests waiting for a response.
    pub fn in_flight(&self) -> usize {
        self.state().pending.len()
    }

    /// This relay knows the tools as `other`'s client listed them (see
    /// [`Interceptor::sharing_tools_of`]).
    pub fn sharing_tools_of(mut self, other: &Relay) -> Self {
        self.interceptor = self.interceptor.sharing_tools_of(&other.interceptor);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::framing::Frame;
    use crate::wire::message;

    fn line(text: &str) -> Frame {
        Frame::Line(text.as_bytes().to_vec())
    }

    fn text(bytes: &[u8]) -> &str {
        std::str::from_utf8(bytes).unwrap()
    }

    #[test]
    fn requests_pass_unchanged_and_are_tracked_until_answered() {
        let relay = Relay::new(Interceptor::passthrough());
        let req = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x-extra":1.50}}"#;
        let routed = relay.from_client(line(req));
        assert_eq!(routed.to_server.as_deref(), Some(req.as_bytes()));
        assert!(routed.to_client.is_empty());
        assert_eq!(relay.in_flight(), 1);
        let resp = r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}"#;
        assert_eq!(
            relay.from_server(line(resp)).as_deref(),
            Some(resp.as_bytes())
        );
        assert_eq!(relay.in_flight(), 0);
    }

    #[test]
    fn what_goes_upstream_carries_its_envelope_as_the_server_sees_it() {
        let relay = Relay::new(Interceptor::passthrough());
        let sent = |text: &str| relay.from_client(line(text)).to_server.unwrap();
        let init = sent(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#);
        assert!(init.initialize && !init.initialized);
        assert_eq!(init.requests, vec![Id::from_json_text("0")]);
        relay.from_server(line(r#"{"jsonrpc":"2.0","id":0,"result":{}}"#));
        let note = sent(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        assert!(note.initialized && !note.initialize && note.requests.is_empty());
        // A reused id goes upstream under a fresh one: that is the id the transport knows.
        let again = sent(r#"{"jsonrpc":"2.0","id":0,"method":"ping"}"#);
        let fresh = message::parse(&again.bytes).unwrap().single().unwrap();
        let Kind::Request { id: fresh, .. } = fresh else {
            panic!("not a request: {}", text(&again.bytes));
        };
        assert_ne!(fresh.key(), "0");
        assert_eq!(again.requests, vec![fresh]);
        // A batch: the requests that went, not the one the proxy refused (a second initialize).
        let batch = sent(
            r#"[{"jsonrpc":"2.0","id":7,"method":"ping"},{"jsonrpc":"2.0","id":8,"method":"initialize"},{"jsonrpc":"2.0","id":9,"method":"tools/list"}]"#,
        );
        let keys: Vec<&str> = batch.requests.iter().map(Id::key).collect();
        assert_eq!(keys, vec!["7", "9"]);
        assert!(!batch.initialize);
        // The same facts as reading the bytes again would give.
        let mut reread = Outgoing {
            bytes: batch.bytes.clone(),
            ..Outgoing::default()
        };
        for kind in message::parse(&batch.bytes).unwrap().kinds() {
            match kind {
                Kind::Request { id, method, .. } => {
                    reread.initialize |= method == "initialize";
                    reread.requests.push(id.clone());
                }
                Kind::Notification { method } => {
                    reread.initialized |= method == "notifications/initialized";
                }
                _ => {}
            }
        }
        assert_eq!(reread, batch);
    }

    #[test]
    fn garbage_from_client_gets_a_parse_error() {
        let relay = Relay::new(Interceptor::passthrough());
        let routed = relay.from_client(line("hello"));
        assert_eq!(routed.to_server, None);
        assert_eq!(routed.to_client.len(), 1);
        assert!(text(&routed.to_client[0]).starts_with(
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error: "#
        ));
    }

    #[test]
    fn garbage_from_server_is_dropped() {
        let relay = Relay::new(Interceptor::passthrough());
        assert_eq!(relay.from_server(line("Starting server...")), None);
    }

    #[test]
    fn close_answers_every_pending_request_and_later_ones() {
        let relay = Relay::new(Interceptor::passthrough());
        relay.from_client(line(r#"{"jsonrpc":"2.0","id":"a","method":"tools/call"}"#));
        relay.from_client(line(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#));
        let mut errors: Vec<String> = relay
            .close("server exited")
            .iter()
            .map(|b| text(b).to_string())
            .collect();
        errors.sort();
        assert_eq!(
            errors,
            vec![
                r#"{"jsonrpc":"2.0","id":"a","error":{"code":-32000,"message":"server exited"}}"#,
                r#"{"jsonrpc":"2.0","id":2,"error":{"code":-32000,"message":"server exited"}}"#,
            ]
        );
        let routed = relay.from_client(line(r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#));
        assert_eq!(routed.to_server, None);
        assert_eq!(
            text(&routed.to_client[0]),
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32000,"message":"server exited"}}"#
        );
    }

    #[test]
    fn cancelled_requests_are_forgotten_and_the_notification_forwarded() {
        let relay = Relay::new(Interceptor::passthrough());
        relay.from_client(line(r#"{"jsonrpc":"2.0","id":5,"method":"tools/call"}"#));
        let cancel =
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5}}"#;
        let routed = relay.from_client(line(cancel));
        assert_eq!(routed.to_server.as_deref(), Some(cancel.as_bytes()));
        assert_eq!(relay.in_flight(), 0);
    }

    #[test]
    fn batches_are_tracked_per_element_and_forwarded_unchanged() {
        let relay = Relay::new(Interceptor::passthrough());
        let batch = r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"n"}]"#;
        let routed = relay.from_client(line(batch));
        assert_eq!(routed.to_server.as_deref(), Some(batch.as_bytes()));
        assert_eq!(relay.in_flight(), 1);
        let reply = r#"[{"jsonrpc":"2.0","id":1,"result":{}}]"#;
        assert_eq!(
            relay.from_server(line(reply)).as_deref(),
            Some(reply.as_bytes())
        );
        assert_eq!(relay.in_flight(), 0);
    }

    #[test]
    fn oversized_request_gets_an_error_with_its_id() {
        let relay = Relay::new(Interceptor::passthrough());
        let routed = relay.from_client(Frame::TooLarge {
            bytes: 70_000_000,
            id: Some(Id::from_json_text("9")),
            method: Some("tools/call".into()),
        });
        assert_eq!(routed.to_server, None);
        assert_eq!(
            text(&routed.to_client[0]),
            r#"{"jsonrpc":"2.0","id":9,"error":{"code":-32600,"message":"tools/call message is 70000000 bytes, over the proxy's message size limit (raise it with --max-message-bytes)"}}"#
        );
    }
}
