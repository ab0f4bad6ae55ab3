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

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;

use crate::bridge::{self, Era, EraChoice, LegacyClient};
use crate::framing::Frame;
use crate::intercept::{CallContext, CallDecision, Interceptor};
use crate::jsonrpc::{self, INVALID_REQUEST, MISSING_CAPABILITY, PARSE_ERROR, UPSTREAM_ERROR};
use crate::message::{self, Id, Kind, Modern, Parsed};
use crate::recording::{Dir, Recorder};
use crate::upstream::Outgoing;

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
/// How long the proxy's own `server/discover` may go unanswered.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How many ids of finished requests are remembered (not reused; their late answers dropped).
const RETIRED: usize = 4096;

// Most requests in flight are calls: boxing their context would cost an allocation each.
#[allow(clippy::large_enum_variant)]
enum Pending {
    Initialize,
    /// `modern`: the request's 2026-07-28 `_meta`, when it had one (its list is fitted to its
    /// client and marked as such).
    ToolsList(Option<Box<Modern>>),
    ToolsCall(CallContext),
    /// `tasks/result`, `tasks/get` (or a modern `tasks/update` / `tasks/cancel`) for this task
    /// id: a task's final result is budgeted as the call that made the task. `shown`: the token
    /// a modern client named the task by (its answer names the task so too).
    TaskResult {
        task: Option<String>,
        shown: Option<String>,
    },
    /// `server/discover`: its answer names the server (for the built-in policy).
    Discover,
    /// The proxy's own `server/discover` (see [`Routed::probe`]): its answer is the proxy's.
    Probe,
    /// A modern client's `subscriptions/listen`. `filter`: what it asks for (read when the
    /// bridge is on, for a legacy server's session); `served`: the proxy serves it itself (it
    /// never went upstream), and it ends only when the client cancels it or the session ends.
    Listen {
        filter: Option<Box<crate::subscriptions::Filter>>,
        served: bool,
    },
    /// The proxy's own `resources/subscribe` / `resources/unsubscribe` for the listens it
    /// serves, of this URI: its answer is the proxy's.
    Subscription(Box<str>),
    /// The listen the proxy holds at a modern server for a legacy client: its answer (the
    /// server ended it) is the proxy's.
    HeldListen,
    /// The proxy's own `initialize`, opening a legacy session for modern clients (the era
    /// bridge): its answer is the proxy's.
    BridgeInitialize,
    /// A legacy client's `initialize`, answered from the modern server's `server/discover`
    /// (the era bridge). `refused`: the server's answer to the `initialize` itself, given to
    /// the client (under its id) if the server turns out not to be modern either.
    InitializeByDiscover {
        refused: Option<Vec<u8>>,
    },
    Other,
}

/// A client request waiting for its response.
struct InFlight {
    /// The id as the client wrote it.
    id: Id,
    /// The id the server saw, when the proxy gave the request a fresh one (a reused id).
    upstream: Option<Id>,
    method: String,
    pending: Pending,
    /// When the request times out (`--request-timeout-secs`).
    deadline: Option<Instant>,
    /// Its `_meta.progressToken` (JSON text), read only when timeouts are on: progress for
    /// it restarts the timeout.
    progress_token: Option<String>,
    /// When it went upstream (only with metrics on).
    sent: Option<Instant>,
    /// Its span (only with traces on).
    span: Option<tracing::Span>,
    /// Whether it was a modern (2026-07-28) request.
    modern: bool,
    /// The log level it asked for (a rank), when it is a modern request bridged to a legacy
    /// server: only such requests get the server's `notifications/message`.
    log_level: Option<u8>,
    /// What identifies it across MRTR rounds ([`bridge::call_digest`]), when it is a modern
    /// request a legacy server may ask input for.
    digest: Option<[u8; 16]>,
    /// Parked: its client got `input_required` and the call waits upstream for the retry
    /// (the number of its entry in [`Bridge::parked`]).
    parked: Option<u64>,
    /// A legacy client's request to a modern server that may be answered `input_required`:
    /// the bytes it went upstream as (the proxy retries it with the client's answers), and
    /// how many rounds it had.
    kept: Option<Box<[u8]>>,
    rounds: u8,
    /// What a modern call bridged to a legacy server declared that the server may use
    /// ([`bridge::capability_profile`]).
    caps: Option<Box<str>>,
}

/// A legacy client's call a modern server asked input for: the proxy asks the client (real
/// server-to-client requests) and retries the call with the answers (the era bridge's MRTR).
struct Round {
    /// The client's call.
    client: Id,
    method: String,
    pending: Pending,
    /// The call as it went upstream.
    sent: Box<[u8]>,
    /// The server's `requestState`, echoed on the retry.
    state: Option<String>,
    /// The answers so far (input key, result JSON), and how many are still awaited.
    answers: Vec<(String, String)>,
    waiting: usize,
    rounds: u8,
    deadline: Instant,
}

/// At most this many rounds of input per call, and rounds open per session.
const MAX_ROUNDS: u8 = 8;
const MAX_OPEN_ROUNDS: usize = 64;
/// A legacy client's request kept for a retry with input is at most this large, and such
/// requests (and the answers collected for them) hold at most this many bytes per session.
const MAX_KEPT_REQUEST: usize = 1024 * 1024;
const MAX_KEPT_BYTES: usize = 16 * 1024 * 1024;
/// At most this many input requests in one `input_required` are relayed to a legacy client.
const MAX_INPUTS: usize = 64;

/// The bytes a session keeps for MRTR retries: requests in flight and rounds waiting.
fn kept_bytes(state: &State) -> usize {
    let calls: usize = state
        .pending
        .values()
        .filter_map(|f| f.kept.as_ref().map(|k| k.len()))
        .sum();
    let rounds: usize = state
        .bridge
        .rounds
        .values()
        .map(|r| {
            r.sent.len()
                + r.answers
                    .iter()
                    .map(|(k, v)| k.len() + v.len())
                    .sum::<usize>()
        })
        .sum();
    calls + rounds
}

impl InFlight {
    /// A request of the proxy's own (its era probe, its `initialize`, an MRTR retry), or one
    /// it sends for a client, with nothing else known of it yet.
    fn own(id: Id, method: &str, pending: Pending, deadline: Option<Instant>) -> InFlight {
        InFlight {
            id,
            upstream: None,
            method: method.into(),
            pending,
            deadline,
            progress_token: None,
            sent: None,
            span: None,
            modern: false,
            log_level: None,
            digest: None,
            parked: None,
            kept: None,
            rounds: 0,
            caps: None,
        }
    }
}

/// A legacy server's call parked while its modern client answers the server's request (the
/// era bridge's MRTR, [`crate::bridge`]).
struct Parked {
    /// The call's key in `pending` (it stays there, its client id detached).
    upstream_key: Box<str>,
    /// The server's requests the client was asked: input key, server request id.
    asked: Vec<(String, Id)>,
    /// The server's answer, when it came before the retry.
    done: Option<Vec<u8>>,
    /// The server's requests that came after the client was answered (method, params,
    /// server request id): the retry gets them as the next `input_required`.
    extra: Vec<(String, String, Id)>,
    /// The round's requests (input key, method, params) while its `input_required` is not
    /// sent yet: the server's requests already read join it (a server asking several things
    /// at once asks them in one round); see [`Relay::release_rounds`].
    unsent: Option<Vec<(String, String, String)>>,
}

/// A round is sent once no server message came for [`ROUND_WINDOW`], or after this many more.
const ROUND_HOLD_EVENTS: usize = 64;

/// How long a round of input waits for more of the server's requests once none waits to be
/// read. A server asks several things at once in one turn of its loop, but its writes may
/// still reach the proxy in separate reads (an SSE event each, microseconds apart): waiting
/// only for an empty queue split a round of three in two of three conformance runs.
pub const ROUND_WINDOW: Duration = Duration::from_millis(25);

/// At most this many calls are parked per session; a server request past it is refused.
const MAX_PARKED: usize = 64;
/// A listen the server ends is opened again at most this many times a session.
const REOPEN_LISTEN: u8 = 3;
/// At most this many listens the proxy cancelled keep delivering to a legacy client.
const RETIRING_LISTENS: usize = 4;
/// How long a parked call waits for its retry by default (`--input-timeout-secs`).
pub const DEFAULT_INPUT_TIMEOUT: Duration = Duration::from_secs(300);

/// Ids of requests that are over (answered, timed out, cancelled by the client): the server may
/// still answer them, late or again, so they are not taken again. Oldest first, bounded.
#[derive(Default)]
struct Retired {
    order: VecDeque<Box<str>>,
    set: HashSet<Box<str>>,
}

impl Retired {
    fn add(&mut self, key: Box<str>) {
        if self.set.insert(key.clone()) {
            self.order.push_back(key);
        }
        while self.order.len() > RETIRED {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    fn contains(&self, key: &str) -> bool {
        self.set.contains(key)
    }
}

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
    /// The era bridge of this session (see [`crate::bridge`]).
    bridge: Bridge,
    /// Messages for the server that a server message or a timeout produced (the era bridge's
    /// own requests, and the client requests it held): see [`Relay::take_later`].
    later: Later,
}

/// A legacy session the proxy opens for modern clients (the era bridge).
#[derive(Default)]
enum LegacySession {
    #[default]
    Closed,
    /// Its `initialize` is in flight.
    Opening,
    /// Open: the server's `InitializeResult` (JSON text).
    Open(std::sync::Arc<str>),
}

/// One session's era bridge ([`crate::bridge`]).
#[derive(Default)]
struct Bridge {
    /// The server's era, when known (learned, remembered for its origin, or forced).
    server: Option<crate::bridge::Era>,
    /// Whether the server's era was forced (`--server-era`): nothing is asked.
    forced: bool,
    /// Whether the proxy's `server/discover` is in flight to learn it.
    asking: bool,
    session: LegacySession,
    /// What the legacy session declared, from the modern request that opened it (see
    /// [`bridge::capability_profile`]).
    profile: Option<Box<str>>,
    /// Modern client messages held until the server's era is known and, for a legacy server,
    /// its session is open; and their bytes.
    held: Vec<Outgoing>,
    held_bytes: usize,
    /// What a legacy client declared in its `initialize`.
    legacy_client: Option<crate::bridge::LegacyClient>,
    /// Whether the proxy serves that legacy client in front of a modern server.
    serving_legacy: bool,
    /// Whether the server's era was asked again after it refused the proxy's `initialize`
    /// (once a session: a server that refuses both ways is not asked forever).
    reprobed: bool,
    /// Calls parked for MRTR, by number; the last number given.
    parked: HashMap<u64, Parked>,
    parked_seq: u64,
    /// A random name of this session, in every `requestState` it mints: another session's
    /// (another principal's) state is refused.
    nonce: String,
    /// A parked call whose server answer came before the retry: it is answered (under the
    /// retry's id) once the retry is routed.
    resumed_done: Option<(Id, Vec<u8>)>,
    /// Legacy clients' calls waiting for their answers to a modern server's input requests;
    /// the proxy's requests to the client, by id key: (round, input key).
    rounds: HashMap<u64, Round>,
    round_seq: u64,
    inputs: HashMap<Box<str>, (u64, String)>,
    /// Modern clients' `subscriptions/listen`, served by the proxy in front of a legacy
    /// server ([`crate::subscriptions`]).
    listens: crate::subscriptions::Listens,
    /// The modern server's `DiscoverResult` (JSON text), when a legacy client is served from it.
    discovered: Option<std::sync::Arc<str>>,
    /// That legacy client's resource subscriptions (at most [`crate::subscriptions::MAX_URIS`]),
    /// and the listen the proxy holds at the server for it: the current one, and the one it
    /// replaces until the server acknowledges the new one.
    legacy_uris: Vec<String>,
    held_listen: Option<Id>,
    replaced_listen: Option<Id>,
    /// Whether the server acknowledged `held_listen`.
    held_acked: bool,
    /// How many times a listen the server ended was opened again.
    reopened: u8,
    /// The last listens the proxy cancelled: what they still deliver (written before the
    /// server read the cancellation) reaches the client; a repeat does no harm, a loss would.
    retiring: VecDeque<Id>,
    /// The URIs whose `resources/subscribe` or `resources/unsubscribe` is in flight, and what
    /// to send for each once it is answered: one after the other, so that over HTTP (where
    /// each goes in its own POST) the server reads them in the order they were meant.
    subscribing: HashMap<String, Option<&'static str>>,
}

/// A modern client's request as it goes into the proxy's legacy session: without the modern
/// headers and the `_meta` revision (the session negotiated its own in `initialize`).
fn into_legacy_session(out: &mut Outgoing) {
    out.modern = None;
    if let Some(bytes) = bridge::legacy_request(&out.bytes) {
        out.bytes = bytes;
    }
}

/// The held requests that are still in flight (not cancelled or timed out while held), taken.
fn still_in_flight(state: &mut State) -> Vec<Outgoing> {
    let held = std::mem::take(&mut state.bridge.held);
    state.bridge.held_bytes = 0;
    held.into_iter()
        .filter(|out| {
            out.requests.is_empty()
                || out
                    .requests
                    .iter()
                    .any(|id| state.pending.contains_key(id.key()))
        })
        .collect()
}

impl Bridge {
    /// The proxy's requests to the client for round `n`, no longer awaited: their id keys.
    fn take_inputs(&mut self, n: u64) -> Vec<Box<str>> {
        let keys: Vec<Box<str>> = self
            .inputs
            .iter()
            .filter(|(_, (m, _))| *m == n)
            .map(|(k, _)| k.clone())
            .collect();
        for key in &keys {
            self.inputs.remove(key);
        }
        keys
    }
}

/// At most this many bytes of modern requests are held while the server's era is learned.
const MAX_HELD_BYTES: usize = 8 * 1024 * 1024;

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

/// A message of the proxy's own for a modern server on a legacy client's behalf: the client's
/// `_meta` (from its `initialize`) added, and the headers a 2026-07-28 POST carries.
fn for_modern_server(state: &State, method: &str, message: Vec<u8>) -> Outgoing {
    let bytes = match &state.bridge.legacy_client {
        Some(client) => client.modern_request(&message).unwrap_or(message),
        None => message,
    };
    Outgoing {
        modern: Some(Box::new(crate::era::Headers::of(
            crate::message::MODERN,
            method,
            None,
            &bytes,
            &[],
        ))),
        ..Outgoing::notification(bytes)
    }
}

/// Every request in flight, finished; those whose client still waits for their answer: not
/// the proxy's own, and not a parked call whose client has its `input_required` already (one
/// whose round is still held is waited for).
fn finish_waiting(state: &mut State) -> Vec<InFlight> {
    let unsent: HashSet<u64> = state
        .bridge
        .parked
        .iter()
        .filter(|(_, p)| p.unsent.is_some())
        .map(|(n, _)| *n)
        .collect();
    state
        .finish_all()
        .into_iter()
        .filter(|f| {
            !matches!(
                f.pending,
                Pending::Probe
                    | Pending::BridgeInitialize
                    | Pending::Subscription(_)
                    | Pending::HeldListen
            ) && f.parked.is_none_or(|n| unsent.contains(&n))
        })
        .collect()
}

/// A listen the proxy serves ([`Relay::serve_listen`]): whether it is open, its
/// acknowledgement (or refusal), and the subscriptions it needs upstream.
struct ServedListen {
    open: bool,
    to_client: Vec<u8>,
    to_server: Vec<Outgoing>,
}

/// Whether a client's id is spelled like one the proxy mints for its own requests upstream
/// (its era probe, its `initialize`, an MRTR retry): such a request goes upstream under a
/// fresh id, so that the two can never meet.
fn reserved(id: &Id) -> bool {
    let raw = id.raw();
    [
        "\"mcp-budget-discover-",
        "\"mcp-budget-initialize-",
        "\"mcp-budget-retry-",
        "\"mcp-budget-subscribe-",
        "\"mcp-budget-listen-",
    ]
    .iter()
    .any(|prefix| raw.starts_with(prefix))
}

/// Counts a client message refused as bad input, when metrics are on.
fn bad_input() {
    if let Some(metrics) = crate::metrics::get() {
        metrics.bad_input.inc();
    }
}

/// The largest null-id error a server's message may be and still pass (JSON-RPC's error about
/// a message the server could not read): an error, never a payload.
const NULL_ID_ERROR_BYTES: usize = 8 * 1024;

/// A server message the proxy cannot classify with certainty: logged and counted, never
/// passed on for the client to read its own way.
fn unclassified_from_server(kind: &Kind, bytes: &[u8]) {
    if let Some(metrics) = crate::metrics::get() {
        metrics.server_dropped.inc();
    }
    let why = match kind {
        Kind::Malformed { problem, .. } => format!("{problem:?}"),
        Kind::Response { id: None, .. } => {
            "a response with a null id (it answers no request the proxy sent)".into()
        }
        _ => "no JSON-RPC message".into(),
    };
    tracing::warn!(why, excerpt = %jsonrpc::excerpt(bytes, 120), "the server sent a message the proxy cannot classify; dropped");
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
}

/// What reaches the client of one server message.
enum Delivery {
    Unchanged,
    Rewritten(Vec<u8>),
    /// Nothing: the server answered an id that is not in flight.
    Drop,
}

fn delivery_bytes(delivery: &Delivery) -> Option<&[u8]> {
    match delivery {
        Delivery::Rewritten(bytes) => Some(bytes),
        _ => None,
    }
}

/// What a timeout sweep produced.
#[derive(Debug, Default)]
pub struct Expired {
    /// Errors for the client, one per timed-out request.
    pub to_client: Vec<Vec<u8>>,
    /// `notifications/cancelled` for the server, one per timed-out request.
    pub to_server: Vec<Vec<u8>>,
}

impl State {
    /// Takes a request out of flight (by the key of the id the server saw) and remembers its
    /// id as used.
    fn finish(&mut self, key: &str) -> Option<InFlight> {
        let (key, flight) = self.pending.remove_entry(key)?;
        if flight.upstream.is_some() && flight.parked.is_none() {
            self.aliases.remove(flight.id.key());
        }
        self.retired.add(key);
        Some(flight)
    }

    /// Every request in flight, finished.
    fn finish_all(&mut self) -> Vec<InFlight> {
        let keys: Vec<Box<str>> = self.pending.keys().cloned().collect();
        keys.iter().filter_map(|k| self.finish(k)).collect()
    }
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
        }
    }

    /// The earliest deadline of a request in flight.
    pub fn next_deadline(&self) -> Option<Instant> {
        let state = self.state();
        let calls = state.pending.values().filter_map(|f| f.deadline);
        let rounds = state.bridge.rounds.values().map(|r| r.deadline);
        calls.chain(rounds).min()
    }

    /// Completes when a request with a deadline went in flight (since the last call).
    pub async fn deadline_added(&self) {
        self.deadline_added.notified().await;
    }

    /// Turns the era bridge on ([`crate::bridge`]): a client of one protocol era is served in
    /// front of a server of the other. `server`: the server's era, or `auto` to learn it (what
    /// was learned of the server's origin in this process is used).
    pub fn with_bridge(mut self, server: EraChoice) -> Self {
        self.bridge_on = true;
        {
            let mut state = self.state();
            let bridge = &mut state.bridge;
            bridge.forced = server.forced().is_some();
            let mut raw = [0u8; 8];
            let _ = getrandom::fill(&mut raw);
            bridge.nonce = crate::canonical::hex(&raw);
            bridge.server = server
                .forced()
                .or_else(|| self.interceptor.origin().and_then(bridge::verdict));
        }
        self
    }

    /// How long a call the era bridge parked (its client answering the server's request)
    /// waits for the client's retry before it is cancelled upstream.
    /// Serves clients of one era only (`--client-era`); `auto` serves both.
    pub fn with_client_era(mut self, era: EraChoice) -> Self {
        self.client_era = era.forced();
        self
    }

    pub fn with_input_timeout(mut self, timeout: Duration) -> Self {
        self.input_timeout = timeout;
        self
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

    /// Times out the requests whose deadline passed by `now`.
    pub fn expire(&self, now: Instant) -> Expired {
        let expired: Vec<InFlight> = {
            let mut state = self.state();
            let keys: Vec<Box<str>> = state
                .pending
                .iter()
                .filter(|(_, f)| f.deadline.is_some_and(|d| d <= now))
                .map(|(k, _)| k.clone())
                .collect();
            keys.iter().filter_map(|k| state.finish(k)).collect()
        };
        let mut out = Expired::default();
        // A legacy client that did not answer a modern server's request for input in time:
        // its call gets an error, and the proxy's requests are withdrawn.
        {
            let mut state = self.state();
            let late: Vec<u64> = state
                .bridge
                .rounds
                .iter()
                .filter(|(_, r)| r.deadline <= now)
                .map(|(n, _)| *n)
                .collect();
            for n in late {
                let Some(round) = state.bridge.rounds.remove(&n) else {
                    continue;
                };
                for key in state.bridge.take_inputs(n) {
                    out.to_client.push(jsonrpc::cancelled(
                        &Id::from_json_text(&key),
                        "mcp-budget: no answer within --input-timeout-secs",
                    ));
                }
                tracing::warn!(
                    id = round.client.raw(),
                    "the client did not answer the server's request for input in time"
                );
                out.to_client.push(jsonrpc::error_response(
                    Some(&round.client),
                    UPSTREAM_ERROR,
                    &format!(
                        "the server asked for input that the client did not give within {} s (--input-timeout-secs); {} was not completed",
                        self.input_timeout.as_secs_f64(),
                        round.method
                    ),
                    None,
                ));
            }
        }
        for flight in expired {
            if matches!(flight.pending, Pending::Probe) {
                tracing::info!(
                    "the server did not answer the proxy's server/discover; its built-in policy, if any, is not known yet"
                );
                out.to_server
                    .push(jsonrpc::cancelled(&flight.id, "mcp-budget: no answer"));
                // No answer is a legacy server's (basic/versioning, "Backward Compatibility").
                self.learned(Era::Legacy);
                continue;
            }
            if let Some(n) = flight.parked {
                // Its client never retried: the call is cancelled, its server requests refused.
                tracing::info!(
                    id = flight.id.raw(),
                    "a parked call's client did not retry; cancelling it upstream"
                );
                let upstream = flight.upstream.as_ref().unwrap_or(&flight.id);
                out.to_server.push(jsonrpc::cancelled(
                    upstream,
                    "mcp-budget: the client did not answer the server's request in time",
                ));
                if let Some(parked) = self.state().bridge.parked.remove(&n) {
                    let extra = parked.extra.into_iter().map(|(_, _, id)| id);
                    for server_id in parked.asked.into_iter().map(|(_, id)| id).chain(extra) {
                        out.to_server.push(jsonrpc::error_response(
                            Some(&server_id),
                            jsonrpc::UPSTREAM_ERROR,
                            "mcp-budget: the client did not answer within --input-timeout-secs",
                            None,
                        ));
                    }
                }
                continue;
            }
            if matches!(flight.pending, Pending::BridgeInitialize) {
                let seconds = self.initialize_timeout.as_secs_f64();
                let refusal = jsonrpc::error_response(
                    Some(&flight.id),
                    UPSTREAM_ERROR,
                    &format!(
                        "the server did not answer mcp-budget's initialize within {seconds} s (--initialize-timeout-secs)"
                    ),
                    None,
                );
                out.to_server
                    .push(jsonrpc::cancelled(&flight.id, "mcp-budget: no answer"));
                self.legacy_session_answer(&refusal);
                continue;
            }
            let (seconds, flag) = match (flight.method.as_str(), self.request_timeout) {
                ("initialize", _) | (_, None) => (
                    self.initialize_timeout.as_secs_f64(),
                    "--initialize-timeout-secs",
                ),
                (_, Some(timeout)) => (timeout.as_secs_f64(), "--request-timeout-secs"),
            };
            tracing::warn!(id = flight.id.raw(), method = %flight.method, seconds, "request timed out; cancelling it upstream");
            let message = format!(
                "the server did not answer {} within {seconds} s ({flag}); the request was cancelled",
                flight.method
            );
            out.to_client.push(jsonrpc::error_response(
                Some(&flight.id),
                UPSTREAM_ERROR,
                &message,
                None,
            ));
            out.to_server.push(jsonrpc::cancelled(
                flight.upstream.as_ref().unwrap_or(&flight.id),
                &format!("mcp-budget: no answer within {seconds} s"),
            ));
        }
        self.record_answers(&out.to_client);
        out
    }

    /// Progress for a request in flight restarts its timeout: the server is working on it.
    fn progress_seen(&self, line: &[u8]) {
        let (Some(token), Some(timeout)) = (message::progress_token(line), self.request_timeout)
        else {
            return;
        };
        let mut state = self.state();
        if let Some(flight) = state
            .pending
            .values_mut()
            .find(|f| f.progress_token.as_deref() == Some(token.as_str()))
        {
            flight.deadline = Some(Instant::now() + timeout);
        }
    }

    /// Every request in flight gets an error naming `reason` (the upstream was restarted);
    /// new requests are accepted as before.
    pub fn fail_pending(&self, reason: &str) -> Vec<Vec<u8>> {
        // The new server is asked again who it is.
        self.interceptor.server_restarted();
        let waiting = {
            let mut state = self.state();
            let waiting = finish_waiting(&mut state);
            state.probed = false;
            // The new server is asked its era again, and a legacy one gets a new session.
            let bridge = &mut state.bridge;
            if self.bridge_on {
                bridge.held.clear();
                bridge.held_bytes = 0;
                bridge.asking = false;
                bridge.reprobed = false;
                bridge.session = LegacySession::Closed;
                // (`profile` stays until the session is opened again: the lanes beside this
                // session keep serving their capability sets meanwhile.)
                // The new server holds no subscription: every listen ends with an error.
                bridge.listens.clear();
                bridge.held_listen = None;
                bridge.replaced_listen = None;
                bridge.held_acked = false;
                bridge.retiring.clear();
                bridge.subscribing.clear();
                bridge.parked.clear();
                bridge.rounds.clear();
                bridge.inputs.clear();
                // A legacy client's session stays bridged to the same command, modern again:
                // its requests are not held for a verdict (only a modern client's request
                // asks for one, so they waited for ever).
                if !bridge.forced && !bridge.serving_legacy {
                    bridge.server = None;
                    if let Some(origin) = self.interceptor.origin() {
                        bridge::forget(origin);
                    }
                }
                // A legacy client's subscriptions live in the listen the proxy holds: the new
                // server gets it again, naming the same URIs (the client is not told of the
                // restart, so nothing else would make them again).
                if bridge.serving_legacy && state.initialized {
                    let listen = self.relisten(&mut state);
                    state.later.to_server.extend(listen);
                }
            }
            waiting
        };
        let errors: Vec<Vec<u8>> = waiting
            .into_iter()
            .map(|f| jsonrpc::error_response(Some(&f.id), UPSTREAM_ERROR, reason, None))
            .collect();
        self.record_answers(&errors);
        errors
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

    /// What a modern request that may take input declares (sampling, elicitation, roots), and
    /// whether it is what the legacy session this relay opened for modern clients declared:
    /// another needs a legacy session of its own (see `stdio`'s lanes). `None` for any other
    /// message, and while the server is not known to be legacy or no session was opened.
    pub fn call_capabilities(&self, frame: &Frame) -> Option<(String, bool)> {
        if !self.bridge_on {
            return None;
        }
        let Frame::Read {
            line,
            parsed:
                Parsed::Single(Kind::Request {
                    method,
                    modern: Some(modern),
                    ..
                }),
        } = frame
        else {
            return None;
        };
        if !crate::era::is_modern(&modern.version) || !bridge::takes_input(method) {
            return None;
        }
        // (While a restarted server's era is asked again, the session's profile stands.)
        let session = {
            let state = self.state();
            if state.bridge.server == Some(Era::Modern) {
                return None;
            }
            state.bridge.profile.clone()?
        };
        let profile = bridge::capability_profile(line);
        let same = *profile == *session;
        Some((profile, same))
    }

    /// This relay knows the tools as `other`'s client listed them (see
    /// [`Interceptor::sharing_tools_of`]).
    pub fn sharing_tools_of(mut self, other: &Relay) -> Self {
        self.interceptor = self.interceptor.sharing_tools_of(&other.interceptor);
        self
    }

    /// Whether this relay serves modern clients from a legacy session it opened (so that a
    /// request may need another: [`Relay::call_capabilities`]).
    pub fn in_legacy_session(&self) -> bool {
        if !self.bridge_on {
            return false;
        }
        let state = self.state();
        state.bridge.server != Some(Era::Modern) && state.bridge.profile.is_some()
    }

    /// Whether a request under `id` would go upstream under that very id: nothing in flight
    /// has it (a client's request, a listen, a held round, or the server's answer still owed to
    /// the proxy under it), it was not used before, and the server reads it back as written
    /// (see `admit`, which sends the others under a fresh id).
    pub fn takes_as_written(&self, id: &Id) -> bool {
        if !id.is_plain() || reserved(id) {
            return false;
        }
        let key = id.key();
        let state = self.state();
        !state.aliases.contains_key(key)
            && !state.pending.contains_key(key)
            && !state.retired.contains(key)
            && !state.bridge.listens.is_open(key)
            && !state.bridge.rounds.values().any(|r| r.client.key() == key)
    }

    /// Whether `id` names a client request this relay has in flight: a call (or its held round
    /// of input) or a listen.
    pub fn holds(&self, id: &Id) -> bool {
        let state = self.state();
        let key = state.aliases.get(id.key()).map_or(id.key(), |k| &**k);
        state
            .pending
            .get(key)
            .is_some_and(|f| f.id.key() == id.key())
            || state.bridge.listens.is_open(id.key())
            || state
                .bridge
                .rounds
                .values()
                .any(|r| r.client.key() == id.key())
    }

    /// A frame from the client.
    pub fn from_client(&self, frame: Frame) -> Routed {
        let mut routed = self.route_client(frame);
        // The era bridge, when on (what is held, and a parked call's answer for its retry).
        let done = match self.bridge_on {
            true => self.bridge_outgoing(&mut routed),
            false => None,
        };
        if let Some((upstream, answer)) = done {
            let mut restored = None;
            let parsed = message::parse(&answer).ok();
            let result = match parsed.and_then(Parsed::single) {
                Some(Kind::Response { result, .. }) => result,
                _ => None,
            };
            match self.server_response(&upstream, &answer, result, &mut restored) {
                Delivery::Rewritten(bytes) => routed.to_client.push(bytes),
                Delivery::Unchanged => routed.to_client.push(answer),
                Delivery::Drop => {}
            }
        }
        self.record_answers(&routed.to_client);
        routed
    }

    /// A modern client's message on its way to a server whose era is not known yet, or to a
    /// legacy server whose session is not open yet, is held (and the session opened); to an
    /// open legacy session it goes without the modern headers (its session carries it).
    /// Returns the answer of a parked call whose retry this frame was, if it came first.
    fn bridge_outgoing(&self, routed: &mut Routed) -> Option<(Id, Vec<u8>)> {
        let mut state = self.state();
        let done = state.bridge.resumed_done.take();
        let Some(out) = routed.to_server.as_mut() else {
            return done;
        };
        if out.modern.is_none() {
            return done;
        }
        match (state.bridge.server, &state.bridge.session) {
            (Some(Era::Modern), _) => return done,
            (Some(Era::Legacy), LegacySession::Open(_)) => {
                into_legacy_session(out);
                return done;
            }
            _ => {}
        }
        let Some(out) = routed.to_server.take() else {
            return done;
        };
        if state.bridge.held_bytes + out.bytes.len() > MAX_HELD_BYTES {
            bad_input();
            tracing::warn!(
                held = state.bridge.held_bytes,
                "too many modern requests wait for the server's era to be learned; refused"
            );
            for id in &out.requests {
                if let Some(flight) = state.finish(id.key()) {
                    routed.to_client.push(jsonrpc::error_response(
                        Some(&flight.id),
                        UPSTREAM_ERROR,
                        "mcp-budget is still learning which protocol era the server speaks, and \
                         more requests wait for it than it holds (8 MiB); send this one again \
                         once an earlier one is answered",
                        None,
                    ));
                }
            }
            return done;
        }
        if state.bridge.server == Some(Era::Legacy)
            && matches!(state.bridge.session, LegacySession::Closed)
        {
            routed.probe = Some(self.open_legacy(&mut state, &out.bytes));
        }
        state.bridge.held_bytes += out.bytes.len();
        state.bridge.held.push(out);
        done
    }

    /// The proxy's own `initialize`, opening a legacy session for modern clients with what
    /// `request` (the first modern request) declared, in flight.
    fn open_legacy(&self, state: &mut State, request: &[u8]) -> Outgoing {
        state.fresh += 1;
        let id = Id::from_json_text(&format!("\"mcp-budget-initialize-{}\"", state.fresh));
        let bytes = bridge::initialize_for(&id, request);
        tracing::info!(
            "the server speaks a legacy revision: mcp-budget opens its session (initialize) for modern clients"
        );
        state.bridge.session = LegacySession::Opening;
        state.bridge.profile = Some(bridge::capability_profile(request).into());
        state.pending.insert(
            id.key().into(),
            InFlight::own(
                id.clone(),
                "initialize",
                Pending::BridgeInitialize,
                Some(Instant::now() + self.initialize_timeout),
            ),
        );
        self.deadline_added.notify_one();
        Outgoing {
            bytes,
            requests: vec![id],
            initialize: true,
            ..Outgoing::default()
        }
    }

    /// What the server's era turned out to be: kept for its origin; held modern requests go
    /// on to a modern server, or wait for the legacy session the proxy now opens.
    fn learned(&self, era: Era) {
        let mut state = self.state();
        state.bridge.asking = false;
        if !self.bridge_on || state.bridge.forced {
            return;
        }
        state.bridge.server = Some(era);
        if let Some(origin) = self.interceptor.origin() {
            bridge::record(origin, era);
        }
        tracing::info!(era = era.as_str(), "the server's protocol era");
        match era {
            Era::Modern => {
                let held = still_in_flight(&mut state);
                state.later.to_server.extend(held);
                // A modern server serves its listens itself: their filters are not kept.
                for flight in state.pending.values_mut() {
                    if let Pending::Listen { filter, .. } = &mut flight.pending {
                        *filter = None;
                    }
                }
            }
            Era::Legacy => {
                if matches!(state.bridge.session, LegacySession::Closed)
                    && let Some(first) = state.bridge.held.first().map(|o| o.bytes.clone())
                {
                    let initialize = self.open_legacy(&mut state, &first);
                    state.later.to_server.push(initialize);
                }
            }
        }
    }

    /// The legacy server answered the proxy's `initialize`: the session is open and the held
    /// requests go on; or it refused, and they get its error.
    fn legacy_session_answer(&self, message: &[u8]) {
        let result = bridge::result_of(message).map(std::sync::Arc::<str>::from);
        if result.is_some() {
            self.interceptor.initialize_response(message);
        }
        let mut state = self.state();
        if result.is_none()
            && !state.bridge.forced
            && !state.bridge.reprobed
            && !state.bridge.held.is_empty()
        {
            // Refused: perhaps the server is modern after all (a probe that timed out while
            // it started). It is asked once more; the requests stay held.
            state.bridge.reprobed = true;
            state.bridge.session = LegacySession::Closed;
            state.bridge.server = None;
            state.bridge.asking = true;
            if let Some(origin) = self.interceptor.origin() {
                bridge::forget(origin);
            }
            tracing::info!("the server refused the proxy's initialize; asking its era again");
            let probe = self.probe(&mut state, crate::message::MODERN);
            state.later.to_server.push(probe);
            return;
        }
        let held = still_in_flight(&mut state);
        match result {
            Some(init) => {
                state.bridge.session = LegacySession::Open(init);
                state.later.to_server.push(Outgoing {
                    bytes: jsonrpc::initialized(),
                    initialized: true,
                    ..Outgoing::default()
                });
                for mut out in held {
                    into_legacy_session(&mut out);
                    state.later.to_server.push(out);
                }
            }
            None => {
                state.bridge.session = LegacySession::Closed;
                tracing::warn!(excerpt = %jsonrpc::excerpt(message, 200), "the legacy server refused the proxy's initialize");
                for out in held {
                    for id in &out.requests {
                        if let Some(flight) = state.finish(id.key()) {
                            let answer =
                                message::with_id(message, flight.id.raw()).unwrap_or_else(|| {
                                    jsonrpc::error_response(
                                        Some(&flight.id),
                                        UPSTREAM_ERROR,
                                        "the server refused mcp-budget's initialize",
                                        None,
                                    )
                                });
                            let kind = Kind::Response {
                                id: Some(flight.id.clone()),
                                result: None,
                            };
                            state.later.to_client.push((answer, Some(kind), None));
                        }
                    }
                }
            }
        }
    }

    fn route_client(&self, frame: Frame) -> Routed {
        match frame {
            Frame::Line(line) => self.client_line(line, None),
            Frame::Read { line, parsed } => self.client_line(line, Some(parsed)),
            Frame::TooLarge { bytes, id, method } => {
                bad_input();
                tracing::warn!(
                    bytes,
                    method = method.as_deref(),
                    "client message over the size limit"
                );
                if let Some(recorder) = &self.recorder {
                    recorder.too_large(Dir::ClientToServer, bytes);
                }
                let message = format!(
                    "{} message is {bytes} bytes, over the proxy's message size limit \
                     (raise it with --max-message-bytes)",
                    method.as_deref().unwrap_or("the")
                );
                Routed {
                    to_client: vec![jsonrpc::error_response(
                        id.as_ref(),
                        INVALID_REQUEST,
                        &message,
                        None,
                    )],
                    ..Routed::default()
                }
            }
        }
    }

    fn client_line(&self, line: Vec<u8>, read: Option<Parsed>) -> Routed {
        let parsed = match read.map_or_else(|| message::parse_from_client(&line), Ok) {
            Ok(parsed) => parsed,
            Err(err) => {
                bad_input();
                tracing::warn!(excerpt = %jsonrpc::excerpt(&line, 120), %err, "client sent a line that is not JSON");
                if let Some(recorder) = &self.recorder {
                    recorder.text(Dir::ClientToServer, &line);
                }
                let message = format!("Parse error: {err}");
                return Routed {
                    to_client: vec![jsonrpc::error_response(None, PARSE_ERROR, &message, None)],
                    ..Routed::default()
                };
            }
        };
        if parsed.is_invalid() {
            bad_input();
            tracing::warn!(excerpt = %jsonrpc::excerpt(&line, 120), "client sent JSON that is not a JSON-RPC object");
            if let Some(recorder) = &self.recorder {
                recorder.text(Dir::ClientToServer, &line);
            }
            let message = "Invalid Request: a JSON-RPC message is an object (or a non-empty batch of objects)";
            return Routed {
                to_client: vec![jsonrpc::error_response(
                    None,
                    INVALID_REQUEST,
                    message,
                    None,
                )],
                ..Routed::default()
            };
        }
        match parsed {
            Parsed::Single(kind) => {
                let mut routed = Routed::default();
                let mut out = Outgoing::default();
                let forward = self.client_message(kind, &line, &mut routed, &mut out);
                if let Some(recorder) = &self.recorder {
                    let forwarded = match &forward {
                        Forward::Rewritten(bytes) => Some(("forwarded", bytes.as_slice())),
                        _ => None,
                    };
                    recorder.message(Dir::ClientToServer, &line, forwarded);
                }
                routed.to_server = match forward {
                    Forward::Drop => None,
                    Forward::Unchanged => Some(Outgoing { bytes: line, ..out }),
                    Forward::Rewritten(bytes) => Some(Outgoing { bytes, ..out }),
                };
                routed
            }
            Parsed::Batch(kinds) => {
                let original = self.recorder.as_ref().map(|_| line.clone());
                let routed = self.client_batch(kinds, line);
                if let (Some(recorder), Some(original)) = (&self.recorder, original) {
                    let changed = routed
                        .to_server
                        .as_deref()
                        .filter(|s| *s != original.as_slice());
                    recorder.message(
                        Dir::ClientToServer,
                        &original,
                        changed.map(|f| ("forwarded", f)),
                    );
                }
                routed
            }
        }
    }

    /// Handles one client message: what goes upstream; answers and accepted ids go to `routed`,
    /// what the transport needs to know of a forwarded message to `out`.
    fn client_message(
        &self,
        kind: Kind,
        bytes: &[u8],
        routed: &mut Routed,
        out: &mut Outgoing,
    ) -> Forward {
        match kind {
            Kind::Request {
                id,
                method,
                progress,
                modern,
                call,
            } => {
                tracing::debug!(id = id.raw(), %method, "request");
                if let Some(forced) = self.client_era
                    && let Some((code, message, data)) =
                        bridge::refused_by_client_era(forced, &method, modern.is_some(), bytes)
                {
                    bad_input();
                    routed.to_client.push(jsonrpc::error_response(
                        Some(&id),
                        code,
                        &message,
                        data.as_ref(),
                    ));
                    return Forward::Drop;
                }
                // Admission and the entry in flight happen under one lock: two requests with one
                // id can never both be admitted.
                let mut state = self.state();
                let upstream = match self.admit(&mut state, &id, &method) {
                    Ok(upstream) => upstream,
                    Err(refusal) => {
                        routed.to_client.push(refusal);
                        return Forward::Drop;
                    }
                };
                let mut upstream = upstream;
                if self.bridge_on {
                    if let Some(meta) = &modern {
                        if state.bridge.server.is_none() && !state.bridge.asking {
                            // The server's era is learned before this request goes on.
                            state.bridge.asking = true;
                            state.probed = true;
                            routed.probe = Some(self.probe(&mut state, &meta.version));
                        }
                        if method == "server/discover"
                            && state.bridge.server == Some(Era::Legacy)
                            && let LegacySession::Open(init) = &state.bridge.session
                        {
                            let result = bridge::discover_result(init);
                            routed
                                .to_client
                                .push(jsonrpc::result_response(&id, &result));
                            return Forward::Drop;
                        }
                        // What 2026-07-28 removed is not served to a modern client, though
                        // the legacy server behind would answer it.
                        if state.bridge.server == Some(Era::Legacy)
                            && matches!(
                                method.as_str(),
                                "ping"
                                    | "logging/setLevel"
                                    | "resources/subscribe"
                                    | "resources/unsubscribe"
                            )
                        {
                            routed.to_client.push(jsonrpc::error_response(
                                Some(&id),
                                jsonrpc::METHOD_NOT_FOUND,
                                &format!(
                                    "Method not found: {method} is not part of MCP 2026-07-28"
                                ),
                                None,
                            ));
                            return Forward::Drop;
                        }
                        // A legacy server has no listen: the proxy serves it from its session.
                        if method == "subscriptions/listen"
                            && state.bridge.server == Some(Era::Legacy)
                            && let LegacySession::Open(init) = &state.bridge.session
                        {
                            let init = init.clone();
                            let filter = crate::subscriptions::Filter::requested(bytes);
                            let served =
                                self.serve_listen(&mut state, &id, upstream, filter, &init);
                            if served.open {
                                routed.accepted.push(id.clone());
                            }
                            routed.to_client.push(served.to_client);
                            routed.also_to_server.extend(served.to_server);
                            return Forward::Drop;
                        }
                        // A retry of a call the proxy parked (MRTR to a legacy server).
                        if state.bridge.server == Some(Era::Legacy)
                            && bridge::takes_input(&method)
                            && let Some(token) = bridge::request_state(bytes)
                        {
                            return self.resume(&mut state, &id, &method, bytes, &token, routed);
                        }
                    } else if state.bridge.serving_legacy {
                        // What a modern server has no use for, the proxy answers itself.
                        match method.as_str() {
                            "resources/subscribe" | "resources/unsubscribe"
                                if state
                                    .bridge
                                    .discovered
                                    .as_deref()
                                    .is_some_and(crate::subscriptions::offers_subscribe) =>
                            {
                                let answer =
                                    self.legacy_subscription(&mut state, &method, bytes, routed);
                                routed.to_client.push(match answer {
                                    Ok(()) => jsonrpc::result_response(&id, "{}"),
                                    Err(why) => jsonrpc::error_response(
                                        Some(&id),
                                        jsonrpc::INVALID_PARAMS,
                                        &why,
                                        None,
                                    ),
                                });
                                return Forward::Drop;
                            }
                            "ping" => {
                                routed.to_client.push(jsonrpc::result_response(&id, "{}"));
                                return Forward::Drop;
                            }
                            "logging/setLevel" => {
                                let level = bridge::log_level(bytes);
                                if let Some(client) = state.bridge.legacy_client.as_mut() {
                                    client.log_level = level;
                                }
                                routed.to_client.push(jsonrpc::result_response(&id, "{}"));
                                return Forward::Drop;
                            }
                            _ => {}
                        }
                    }
                }
                if let Some(meta) = &modern
                    && !state.probed
                    && method != "server/discover"
                    && state.bridge.server != Some(Era::Legacy)
                    && self.interceptor.unsettled()
                {
                    state.probed = true;
                    routed.probe = Some(self.probe(&mut state, &meta.version));
                }
                // A modern client names tasks by the tokens the proxy showed it: the server
                // gets its own ids, and a token that does not open is refused. Whether or not
                // the client declared the tasks extension: a task id the proxy did not hand to
                // this principal never reaches the server (which sees one client, the proxy,
                // and would answer with another principal's task).
                let mut named_task: Option<(String, String)> = None;
                let mut task_forward: Option<Vec<u8>> = None;
                if modern.is_some()
                    && matches!(
                        method.as_str(),
                        "tasks/get"
                            | "tasks/update"
                            | "tasks/cancel"
                            | "tasks/result"
                            | "subscriptions/listen"
                    )
                {
                    match self.interceptor.task_request(&method, bytes) {
                        Ok(None) => {}
                        Ok(Some(named)) => {
                            named_task = named.task;
                            task_forward = Some(named.rewritten);
                        }
                        Err(refused) => {
                            bad_input();
                            tracing::warn!(id = id.raw(), %method, %refused, "a task token refused");
                            routed.to_client.push(jsonrpc::error_response(
                                Some(&id),
                                jsonrpc::INVALID_PARAMS,
                                &refused.to_string(),
                                None,
                            ));
                            return Forward::Drop;
                        }
                    }
                }
                let task_forward = task_forward.map_or(Forward::Unchanged, Forward::Rewritten);
                let (pending, forward) = match method.as_str() {
                    "tools/list" => (Pending::ToolsList(modern.clone()), Forward::Unchanged),
                    "server/discover" => (Pending::Discover, Forward::Unchanged),
                    // Held while the server's era is learned: should it be a legacy one, the
                    // proxy serves the listen when the server refuses it.
                    "subscriptions/listen"
                        if modern.is_some()
                            && self.bridge_on
                            && state.bridge.server != Some(Era::Modern) =>
                    {
                        (
                            Pending::Listen {
                                filter: crate::subscriptions::Filter::requested(bytes)
                                    .ok()
                                    .map(Box::new),
                                served: false,
                            },
                            task_forward,
                        )
                    }
                    "initialize" if self.bridge_on => {
                        self.interceptor.initialize_request(bytes);
                        let client = LegacyClient::of(bytes);
                        // A modern server may speak both eras: unless it is forced modern, or
                        // refused a legacy initialize before, the client's own initialize is
                        // tried first (a refusal is bridged: `ask_after_refusal`).
                        let by_discover = state.bridge.server == Some(Era::Modern)
                            && (state.bridge.forced
                                || self.interceptor.origin().is_some_and(bridge::modern_only));
                        let forward = if by_discover {
                            // A modern server has no initialize: its discover answers it.
                            let fresh = upstream.get_or_insert_with(|| {
                                state.fresh += 1;
                                Id::from_json_text(&format!(
                                    "\"mcp-budget-discover-{}\"",
                                    state.fresh
                                ))
                            });
                            Forward::Rewritten(bridge::discover_for(fresh, &client))
                        } else {
                            Forward::Unchanged
                        };
                        state.bridge.legacy_client = Some(client);
                        match by_discover {
                            true => (Pending::InitializeByDiscover { refused: None }, forward),
                            false => (Pending::Initialize, forward),
                        }
                    }
                    "initialize" => {
                        self.interceptor.initialize_request(bytes);
                        (Pending::Initialize, Forward::Unchanged)
                    }
                    "tools/call" => {
                        match self.interceptor.tools_call_request(
                            &id,
                            bytes,
                            modern.as_deref(),
                            call.as_ref(),
                        ) {
                            CallDecision::Answer(answer) => {
                                // Written in the client's era (a legacy client's page of a
                                // modern server's result has no resultType).
                                let answer = match state.bridge.serving_legacy && modern.is_none() {
                                    true => bridge::legacy_answer(&answer).unwrap_or(answer),
                                    false => answer,
                                };
                                if crate::traces::enabled() {
                                    let span = crate::traces::request_span(&method, bytes);
                                    crate::traces::finish(
                                        &span,
                                        answer.len(),
                                        "answered by the proxy",
                                    );
                                }
                                routed.to_client.push(answer);
                                return Forward::Drop;
                            }
                            CallDecision::Defer(job) => {
                                routed.deferred.push(job);
                                return Forward::Drop;
                            }
                            CallDecision::Forward { rewritten, context } => (
                                Pending::ToolsCall(context),
                                rewritten.map_or(Forward::Unchanged, Forward::Rewritten),
                            ),
                        }
                    }
                    // A modern client's task, named by its token: every answer about it is
                    // read as a task's state (a completed one carries its result). A legacy
                    // one: the answers that carry results.
                    "tasks/result" | "tasks/get" | "tasks/update" | "tasks/cancel" => {
                        let pending = match named_task.clone() {
                            Some((task, shown)) => Pending::TaskResult {
                                task: Some(task),
                                shown: Some(shown),
                            },
                            None if matches!(method.as_str(), "tasks/result" | "tasks/get") => {
                                Pending::TaskResult {
                                    task: self.interceptor.task_of(bytes),
                                    shown: None,
                                }
                            }
                            None => Pending::Other,
                        };
                        (pending, task_forward)
                    }
                    _ => (Pending::Other, task_forward),
                };
                let forward = match &upstream {
                    None => forward,
                    Some(fresh) => {
                        let current = match &forward {
                            Forward::Rewritten(b) => b.as_slice(),
                            _ => bytes,
                        };
                        match message::with_id(current, fresh.raw()) {
                            Some(b) => Forward::Rewritten(b),
                            None => {
                                routed.to_client.push(jsonrpc::error_response(
                                    Some(&id),
                                    INVALID_REQUEST,
                                    "Invalid Request: the request's id could not be read",
                                    None,
                                ));
                                return Forward::Drop;
                            }
                        }
                    }
                };
                // (The clock is read only for a deadline: most requests have none.)
                let deadline = if method == "initialize" {
                    Some(Instant::now() + self.initialize_timeout)
                } else {
                    self.request_timeout.map(|t| Instant::now() + t)
                };
                let progress_token = self.request_timeout.and(progress).map(String::from);
                let by_discover = matches!(pending, Pending::InitializeByDiscover { .. });
                if method == "initialize" {
                    state.initialized = true;
                    out.initialize = !by_discover;
                }
                // A legacy client's request to a modern server carries the modern `_meta`.
                let bridged = state.bridge.serving_legacy && modern.is_none() && !by_discover;
                let forward = match (bridged, &state.bridge.legacy_client) {
                    (true, Some(client)) => {
                        let current = match &forward {
                            Forward::Rewritten(b) => b.as_slice(),
                            _ => bytes,
                        };
                        match client.modern_request(current) {
                            Some(b) => Forward::Rewritten(b),
                            None => forward,
                        }
                    }
                    _ => forward,
                };
                out.requests
                    .push(upstream.clone().unwrap_or_else(|| id.clone()));
                let headers = match &modern {
                    Some(modern) => Some((
                        &*modern.version,
                        method.as_str(),
                        // A task named by its token: the server's id (Mcp-Name is the body's).
                        match &named_task {
                            Some((task, _)) => Some(task.clone()),
                            None => modern.named.clone(),
                        },
                    )),
                    None if by_discover => Some((crate::message::MODERN, "server/discover", None)),
                    None if bridged => {
                        let sent = match &forward {
                            Forward::Rewritten(b) => b.as_slice(),
                            _ => bytes,
                        };
                        Some((
                            crate::message::MODERN,
                            method.as_str(),
                            bridge::named(&method, sent),
                        ))
                    }
                    None => None,
                };
                if let Some((version, header_method, named)) = headers {
                    let sent = match &forward {
                        Forward::Rewritten(b) => b.as_slice(),
                        _ => bytes,
                    };
                    let annotated = match &pending {
                        Pending::ToolsCall(context) => {
                            self.interceptor.param_headers(context.tool())
                        }
                        _ => Vec::new(),
                    };
                    out.modern = Some(Box::new(crate::era::Headers::of(
                        version,
                        header_method,
                        named,
                        sent,
                        &annotated,
                    )));
                }
                let to_legacy = modern.is_some()
                    && self.bridge_on
                    && matches!(state.bridge.server, Some(Era::Legacy) | None);
                let log_level = to_legacy
                    .then(|| bridge::requested_log_level(bytes))
                    .flatten();
                let digest = (to_legacy && bridge::takes_input(&method))
                    .then(|| bridge::call_digest(&method, bytes));
                let kept = match &forward {
                    Forward::Rewritten(b)
                        if bridged
                            && bridge::takes_input(&method)
                            && b.len() <= MAX_KEPT_REQUEST
                            && kept_bytes(&state) + b.len() <= MAX_KEPT_BYTES =>
                    {
                        Some(b.clone().into_boxed_slice())
                    }
                    _ => None,
                };
                let key: Box<str> = match &upstream {
                    Some(fresh) => {
                        state.aliases.insert(id.key().into(), fresh.key().into());
                        fresh.key().into()
                    }
                    None => id.key().into(),
                };
                let span =
                    crate::traces::enabled().then(|| crate::traces::request_span(&method, bytes));
                state.pending.insert(
                    key,
                    InFlight {
                        id: id.clone(),
                        upstream,
                        method,
                        pending,
                        deadline,
                        progress_token,
                        sent: crate::metrics::get().map(|_| Instant::now()),
                        span,
                        modern: modern.is_some(),
                        log_level,
                        digest,
                        parked: None,
                        kept,
                        rounds: 0,
                        caps: digest.map(|_| bridge::capability_profile(bytes).into_boxed_str()),
                    },
                );
                drop(state);
                if deadline.is_some() {
                    self.deadline_added.notify_one();
                }
                routed.accepted.push(id);
                forward
            }
            Kind::Notification { method } => {
                if method == "notifications/initialized" && self.state().bridge.serving_legacy {
                    // A modern server has no session to be told of; the list changes the
                    // client gets unasked come on a listen the proxy holds for it.
                    let mut state = self.state();
                    let listen = self.relisten(&mut state);
                    routed.also_to_server.extend(listen);
                    return Forward::Drop;
                }
                // A notification always goes upstream (a cancellation perhaps rewritten).
                out.initialized |= method == "notifications/initialized";
                if method == "notifications/cancelled"
                    && let Some(id) = message::cancelled_request_id(bytes)
                {
                    tracing::debug!(id = id.raw(), "client cancelled a request");
                    let mut state = self.state();
                    // A call waiting for the client's own answers to a server's input requests
                    // ends here: nothing of it is upstream.
                    let round = state
                        .bridge
                        .rounds
                        .iter()
                        .find(|(_, r)| r.client.key() == id.key())
                        .map(|(n, _)| *n);
                    // A listen the proxy serves ends here: nothing of it is upstream but the
                    // subscriptions no other listen needs.
                    if let Some(gone) = state.bridge.listens.close(id.key()) {
                        let key = state
                            .aliases
                            .get(id.key())
                            .cloned()
                            .unwrap_or_else(|| id.key().into());
                        state.finish(&key);
                        state.retired.add(id.key().into());
                        for uri in gone {
                            let unsubscribe = self.subscription_request(
                                &mut state,
                                "resources/unsubscribe",
                                &uri,
                            );
                            routed.also_to_server.extend(unsubscribe);
                        }
                        return Forward::Drop;
                    }
                    if let Some(n) = round {
                        state.bridge.rounds.remove(&n);
                        state.bridge.inputs.retain(|_, (m, _)| *m != n);
                        state.retired.add(id.key().into());
                        return Forward::Drop;
                    }
                    let key = state
                        .aliases
                        .get(id.key())
                        .cloned()
                        .unwrap_or_else(|| id.key().into());
                    // Only the client's own request: never one in flight under a fresh id
                    // that happens to be spelled like the cancelled id.
                    let own = state
                        .pending
                        .get(&key)
                        .is_some_and(|f| f.id.key() == id.key());
                    // The server may still answer it; that answer is the client's no more.
                    if own && let Some(flight) = state.finish(&key) {
                        // The server knows the request by the id it saw.
                        if let Some(upstream) = flight.upstream
                            && let Some(b) = message::with_cancelled_id(bytes, upstream.raw())
                        {
                            return Forward::Rewritten(b);
                        }
                    }
                }
                Forward::Unchanged
            }
            Kind::Malformed { id, problem } => {
                bad_input();
                tracing::warn!(
                    id = id.as_ref().map(Id::raw),
                    ?problem,
                    "client message refused"
                );
                routed.to_client.push(jsonrpc::error_response(
                    id.as_ref(),
                    INVALID_REQUEST,
                    &problem.message(),
                    None,
                ));
                Forward::Drop
            }
            Kind::Response { id: Some(id), .. }
                if self.state().bridge.inputs.contains_key(id.key()) =>
            {
                self.answered_by_legacy_client(&id, bytes, routed, out)
            }
            // An answer to no request: no id to answer under, and nothing the server asked.
            Kind::Response { id: None, .. } => {
                bad_input();
                tracing::warn!(excerpt = %jsonrpc::excerpt(bytes, 120), "client sent a response with a null id; dropped");
                Forward::Drop
            }
            Kind::Response { .. } => Forward::Unchanged,
            // What the proxy cannot classify is never forwarded for the server to read its way.
            Kind::Other | Kind::Invalid => {
                bad_input();
                tracing::warn!(excerpt = %jsonrpc::excerpt(bytes, 120), "client message is no JSON-RPC message; refused");
                let problem = message::Problem::NotJsonRpc;
                routed.to_client.push(jsonrpc::error_response(
                    None,
                    INVALID_REQUEST,
                    &problem.message(),
                    None,
                ));
                Forward::Drop
            }
        }
    }

    /// A modern server's `input_required` for a legacy client's call: each of its requests
    /// goes to the client as a real server-to-client request (on the call's stream); the
    /// answers are collected and the call retried ([`Relay::answered_by_legacy_client`]).
    fn ask_legacy_client(
        &self,
        client: &Id,
        method: &str,
        pending: Pending,
        sent: Box<[u8]>,
        rounds: u8,
        answer: &[u8],
    ) -> Delivery {
        let refuse = |why: &str| {
            tracing::warn!(method, why, "a modern server's input_required not relayed");
            Delivery::Rewritten(jsonrpc::error_response(
                Some(client),
                UPSTREAM_ERROR,
                &format!(
                    "the server needs input for {method} that mcp-budget could not ask this client for: {why}"
                ),
                None,
            ))
        };
        let Some(asked) = bridge::input_requests(answer) else {
            return refuse("its input_required result could not be read");
        };
        if rounds >= MAX_ROUNDS {
            return refuse(&format!("it asked more than {MAX_ROUNDS} rounds"));
        }
        let mut state = self.state();
        if state.bridge.rounds.len() >= MAX_OPEN_ROUNDS {
            return refuse("too many calls of this session wait for input");
        }
        state.bridge.round_seq += 1;
        let n = state.bridge.round_seq;
        if asked.requests.len() > MAX_INPUTS {
            drop(state);
            return refuse(&format!(
                "it asked {} inputs at once, more than {MAX_INPUTS}",
                asked.requests.len()
            ));
        }
        let waiting = asked.requests.len();
        for request in &asked.requests {
            state.fresh += 1;
            let id = Id::from_json_text(&format!("\"mcp-budget-input-{}\"", state.fresh));
            let bytes = format!(
                r#"{{"jsonrpc":"2.0","id":{},"method":{},"params":{}}}"#,
                id.raw(),
                serde_json::Value::from(request.method.as_str()),
                request.params
            )
            .into_bytes();
            let kind = Kind::Request {
                id: id.clone(),
                method: request.method.clone(),
                progress: None,
                modern: None,
                call: None,
            };
            state
                .bridge
                .inputs
                .insert(id.key().into(), (n, request.key.clone()));
            state
                .later
                .to_client
                .push((bytes, Some(kind), Some(client.clone())));
        }
        tracing::info!(
            method,
            requests = waiting,
            "a modern server asks for input: mcp-budget asks the legacy client"
        );
        state.bridge.rounds.insert(
            n,
            Round {
                client: client.clone(),
                method: method.to_string(),
                pending,
                sent,
                state: asked.state,
                answers: Vec::new(),
                waiting,
                rounds: rounds + 1,
                deadline: Instant::now() + self.input_timeout,
            },
        );
        if waiting == 0 {
            // Only a requestState: the call is retried at once.
            match self.retry_round(&mut state, n) {
                Some(Ok(retry)) => state.later.to_server.push(retry),
                Some(Err(error)) => {
                    let kind = Kind::Response {
                        id: Some(client.clone()),
                        result: None,
                    };
                    state.later.to_client.push((error, Some(kind), None));
                }
                None => {}
            }
        }
        drop(state);
        self.deadline_added.notify_one();
        Delivery::Drop
    }

    /// A legacy client's answer to one of the proxy's input requests; once every answer is in,
    /// the call goes upstream again with them.
    fn answered_by_legacy_client(
        &self,
        id: &Id,
        bytes: &[u8],
        routed: &mut Routed,
        out: &mut Outgoing,
    ) -> Forward {
        let mut state = self.state();
        let Some((n, key)) = state.bridge.inputs.remove(id.key()) else {
            return Forward::Drop;
        };
        let Some(result) = bridge::result_of(bytes).map(str::to_string) else {
            // The client refused (an error): the call ends with it.
            state.bridge.take_inputs(n);
            if let Some(round) = state.bridge.rounds.remove(&n) {
                let message = serde_json::from_slice::<serde_json::Value>(bytes)
                    .ok()
                    .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                    .unwrap_or_default();
                routed.to_client.push(jsonrpc::error_response(
                    Some(&round.client),
                    UPSTREAM_ERROR,
                    &format!(
                        "the client answered the server's request for input with an error ({message}); {} was not completed",
                        round.method
                    ),
                    None,
                ));
            }
            return Forward::Drop;
        };
        if kept_bytes(&state) + result.len() > MAX_KEPT_BYTES {
            if let Some(round) = state.bridge.rounds.remove(&n) {
                state.bridge.inputs.retain(|_, (m, _)| *m != n);
                routed.to_client.push(jsonrpc::error_response(
                    Some(&round.client),
                    UPSTREAM_ERROR,
                    &format!(
                        "the client's answers to the server's requests for input are more than mcp-budget holds for a retry ({MAX_KEPT_BYTES} bytes a session); {} was not completed",
                        round.method
                    ),
                    None,
                ));
            }
            return Forward::Drop;
        }
        let Some(round) = state.bridge.rounds.get_mut(&n) else {
            return Forward::Drop;
        };
        round.answers.push((key, result));
        round.waiting = round.waiting.saturating_sub(1);
        if round.waiting > 0 {
            return Forward::Drop;
        }
        match self.retry_round(&mut state, n) {
            Some(Ok(retry)) => {
                let Outgoing {
                    bytes,
                    requests,
                    modern,
                    ..
                } = retry;
                let id = requests.first().cloned();
                out.requests.extend(requests);
                out.modern = modern;
                drop(state);
                if id.is_some() && self.request_timeout.is_some() {
                    self.deadline_added.notify_one();
                }
                Forward::Rewritten(bytes)
            }
            Some(Err(error)) => {
                routed.to_client.push(error);
                Forward::Drop
            }
            None => Forward::Drop,
        }
    }

    /// Round `n`'s call, retried upstream with the client's answers and the server's
    /// `requestState`, under a fresh id (in flight again, as the client's call). `Err`: the
    /// client's error (the call could not be retried).
    fn retry_round(&self, state: &mut State, n: u64) -> Option<Result<Outgoing, Vec<u8>>> {
        let round = state.bridge.rounds.remove(&n)?;
        state.fresh += 1;
        let fresh = Id::from_json_text(&format!("\"mcp-budget-retry-{}\"", state.fresh));
        let Some(bytes) =
            bridge::retry(&round.sent, &fresh, &round.answers, round.state.as_deref())
        else {
            return Some(Err(jsonrpc::error_response(
                Some(&round.client),
                UPSTREAM_ERROR,
                &format!(
                    "mcp-budget could not retry {} with the client's input",
                    round.method
                ),
                None,
            )));
        };
        let annotated = match &round.pending {
            Pending::ToolsCall(context) => self.interceptor.param_headers(context.tool()),
            _ => Vec::new(),
        };
        let headers = crate::era::Headers::of(
            crate::message::MODERN,
            &round.method,
            bridge::named(&round.method, &bytes),
            &bytes,
            &annotated,
        );
        state
            .aliases
            .insert(round.client.key().into(), fresh.key().into());
        state.pending.insert(
            fresh.key().into(),
            InFlight {
                upstream: Some(fresh.clone()),
                kept: Some(round.sent),
                rounds: round.rounds,
                ..InFlight::own(
                    round.client,
                    &round.method,
                    round.pending,
                    self.request_timeout.map(|t| Instant::now() + t),
                )
            },
        );
        tracing::debug!("a legacy client's answers: its call goes upstream again with them");
        Some(Ok(Outgoing {
            bytes,
            requests: vec![fresh],
            modern: Some(Box::new(headers)),
            ..Outgoing::default()
        }))
    }

    /// The proxy's own `server/discover`, in flight (see [`Routed::probe`]).
    fn probe(&self, state: &mut State, version: &str) -> Outgoing {
        state.fresh += 1;
        let id = Id::from_json_text(&format!("\"mcp-budget-discover-{}\"", state.fresh));
        let meta = serde_json::json!({
            message::META_VERSION: version,
            message::META_CLIENT_CAPABILITIES: {},
            message::META_CLIENT_INFO: {"name": "mcp-budget", "version": env!("CARGO_PKG_VERSION")},
        });
        let bytes = format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"server/discover","params":{{"_meta":{meta}}}}}"#,
            id.raw()
        )
        .into_bytes();
        tracing::debug!(
            "asking the server who it is (server/discover) before the first modern request is budgeted"
        );
        state.pending.insert(
            id.key().into(),
            InFlight::own(
                id.clone(),
                "server/discover",
                Pending::Probe,
                Some(Instant::now() + PROBE_TIMEOUT),
            ),
        );
        self.deadline_added.notify_one();
        Outgoing {
            modern: Some(Box::new(crate::era::Headers::of(
                version,
                "server/discover",
                None,
                &bytes,
                &[],
            ))),
            requests: vec![id],
            bytes,
            ..Outgoing::default()
        }
    }

    /// Whether a request may go upstream: the upstream is there, its id is not in flight, it is
    /// not a second `initialize`, and the session is under its bound on requests in flight.
    /// `Ok(Some(id))`: it goes upstream under that fresh id (its own was used before).
    fn admit(&self, state: &mut State, id: &Id, method: &str) -> Result<Option<Id>, Vec<u8>> {
        let refuse = |code: i64, message: &str| {
            bad_input();
            tracing::warn!(id = id.raw(), method, message, "request refused");
            Err(jsonrpc::error_response(Some(id), code, message, None))
        };
        if let Some(reason) = &state.closed {
            return Err(jsonrpc::error_response(
                Some(id),
                UPSTREAM_ERROR,
                reason,
                None,
            ));
        }
        let in_flight = state.aliases.contains_key(id.key())
            || state
                .pending
                .get(id.key())
                .is_some_and(|f| f.upstream.is_none());
        if in_flight {
            return refuse(
                INVALID_REQUEST,
                &format!(
                    "Invalid Request: id {} is already used by a request in flight; \
                     give every request its own id (JSON-RPC ids are unique among pending requests)",
                    id.raw()
                ),
            );
        }
        if method == "initialize" && state.initialized {
            return refuse(
                INVALID_REQUEST,
                "Invalid Request: this session is already initialized; \
                 start a new session to initialize again",
            );
        }
        if state.pending.len() >= self.max_in_flight {
            return refuse(
                UPSTREAM_ERROR,
                &format!(
                    "too many requests in flight ({} unanswered, the limit is {}); \
                     wait for answers before sending more (raise it with --max-in-flight)",
                    state.pending.len(),
                    self.max_in_flight
                ),
            );
        }
        // The id was used before (the server may still answer that request), or it is one of
        // the proxy's fresh ids in flight, or the server might read it otherwise than written
        // (`"\u0061"`, `1.50`: servers answer those under their own spelling, or refuse them):
        // this request goes upstream under a fresh id.
        if state.retired.contains(id.key())
            || state.pending.contains_key(id.key())
            || !id.is_plain()
            || reserved(id)
        {
            loop {
                state.fresh += 1;
                let fresh = Id::from_json_text(&format!("\"mcp-budget-{}\"", state.fresh));
                if !state.pending.contains_key(fresh.key()) && !state.retired.contains(fresh.key())
                {
                    tracing::debug!(
                        id = id.raw(),
                        upstream = fresh.raw(),
                        "reused id; the request goes upstream under a fresh id"
                    );
                    return Ok(Some(fresh));
                }
            }
        }
        Ok(None)
    }

    fn client_batch(&self, kinds: Vec<Kind>, line: Vec<u8>) -> Routed {
        let mut routed = Routed::default();
        let elements: Vec<&RawValue> = match serde_json::from_slice(&line) {
            Ok(elements) => elements,
            Err(err) => {
                // `parse` accepted it as an array, so this cannot happen; answer rather than drop.
                let message = format!("Parse error: {err}");
                routed
                    .to_client
                    .push(jsonrpc::error_response(None, PARSE_ERROR, &message, None));
                return routed;
            }
        };
        let mut kept = Vec::with_capacity(elements.len());
        let mut changed = false;
        let mut out = Outgoing::default();
        for (kind, element) in kinds.into_iter().zip(&elements) {
            match self.client_message(kind, element.get().as_bytes(), &mut routed, &mut out) {
                Forward::Drop => changed = true,
                Forward::Unchanged => kept.push(element.get().to_owned()),
                Forward::Rewritten(rewritten) => {
                    changed = true;
                    kept.push(String::from_utf8_lossy(&rewritten).into_owned());
                }
            }
        }
        routed.to_server = if !changed {
            Some(Outgoing { bytes: line, ..out })
        } else if kept.is_empty() {
            None
        } else {
            Some(Outgoing {
                bytes: format!("[{}]", kept.join(",")).into_bytes(),
                ..out
            })
        };
        routed
    }

    /// A frame from the server: the bytes to send to the client, if any.
    pub fn from_server(&self, frame: Frame) -> Option<Vec<u8>> {
        self.from_server_classified(frame).map(|(bytes, _)| bytes)
    }

    /// Like [`Relay::from_server`], with the envelope read on the way (for a batch, its first
    /// response), so a transport that routes by it need not parse the message again.
    pub fn from_server_classified(&self, frame: Frame) -> Option<(Vec<u8>, Option<Kind>)> {
        self.from_server_related(frame, None)
    }

    /// Like [`Relay::from_server_classified`], for a message that came on the stream of one
    /// request (`related`, its id as the server knows it: an HTTP upstream's POST stream).
    pub fn from_server_related(
        &self,
        frame: Frame,
        related: Option<&Id>,
    ) -> Option<(Vec<u8>, Option<Kind>)> {
        let (line, read) = match frame {
            Frame::Line(line) => (line, None),
            Frame::Read { line, parsed } => (line, Some(parsed)),
            Frame::TooLarge { bytes, id, method } => {
                if let Some(recorder) = &self.recorder {
                    recorder.too_large(Dir::ServerToClient, bytes);
                }
                let answer = self.server_too_large(bytes, id, method);
                self.record_answers(answer.as_slice());
                return answer.map(|bytes| (bytes, None));
            }
        };
        let parsed = match read.map_or_else(|| message::parse(&line), Ok) {
            Ok(parsed) => parsed,
            Err(err) => {
                tracing::warn!(excerpt = %jsonrpc::excerpt(&line, 120), %err, "server wrote a line that is not JSON; dropped");
                if let Some(recorder) = &self.recorder {
                    recorder.text(Dir::ServerToClient, &line);
                }
                // A broken answer to a request in flight still names its id: that request gets
                // an error now rather than waiting for a timeout that may never come.
                let mut scanner = crate::message::EnvelopeScanner::default();
                scanner.feed(&line);
                let (id, method) = scanner.finish();
                let finished = match (id, method) {
                    (Some(id), None) => self.state().finish(id.key()),
                    _ => None,
                };
                let finished =
                    finished.and_then(|f| self.clients_flight(f, "its answer is not JSON"));
                let answer = finished.map(|finished| {
                    jsonrpc::error_response(
                        Some(&finished.id),
                        UPSTREAM_ERROR,
                        &format!("the server's answer to this request is not valid JSON ({err}); the proxy dropped it"),
                        None,
                    )
                })?;
                self.record_answers(std::slice::from_ref(&answer));
                return Some((answer, None));
            }
        };
        let kind = match &parsed {
            Parsed::Single(kind) => Some(kind.clone()),
            Parsed::Batch(kinds) => kinds
                .iter()
                .find(|k| matches!(k, Kind::Response { id: Some(_), .. }))
                .cloned(),
        };
        // The id the client sees, where the proxy gave the request a fresh one upstream: the
        // message is routed by it.
        let mut restored: Option<Id> = None;
        let delivered = match parsed {
            Parsed::Single(Kind::Response {
                id: Some(id),
                result,
            }) => self.server_response(&id, &line, result, &mut restored),
            Parsed::Single(Kind::Notification { method })
                if method == "notifications/progress" && self.request_timeout.is_some() =>
            {
                self.progress_seen(&line);
                Delivery::Unchanged
            }
            // A legacy server's logs reach modern clients only for requests that asked for
            // them, at or above the level asked; its requests get answers from the proxy.
            Parsed::Single(Kind::Notification { method })
                if method == "notifications/message" && self.bridging_legacy_server() =>
            {
                if self.log_wanted(bridge::message_level(&line)) {
                    Delivery::Unchanged
                } else {
                    tracing::debug!(
                        "a legacy server's log message no modern request asked for; dropped"
                    );
                    Delivery::Drop
                }
            }
            // The listen the proxy holds for a legacy client: its acknowledgement is the
            // proxy's, its notifications the client's.
            Parsed::Single(Kind::Notification { method })
                if (crate::subscriptions::is_listened(&method)
                    || method == "notifications/subscriptions/acknowledged")
                    && let Some(delivery) = self.on_held_listen(&method, &line) =>
            {
                delivery
            }
            // Its list changes and resource updates reach only the listens that asked.
            Parsed::Single(Kind::Notification { method })
                if crate::subscriptions::is_listened(&method) && self.bridging_legacy_server() =>
            {
                self.to_listens(&method, &line)
            }
            Parsed::Single(Kind::Request { id, method, .. }) if self.bridging_legacy_server() => {
                match self.park(&id, &method, &line, related) {
                    Ok(Some((client, answer))) => {
                        restored = Some(client);
                        Delivery::Rewritten(answer)
                    }
                    Ok(None) => Delivery::Drop,
                    Err(()) => {
                        self.answer_server_request(&id, &method);
                        Delivery::Drop
                    }
                }
            }
            // A completed task's result, delivered on a listen stream, is budgeted too.
            Parsed::Single(Kind::Notification { method }) if method == "notifications/tasks" => {
                match self.interceptor.task_notification(&line) {
                    Ok(Some(rewritten)) => Delivery::Rewritten(rewritten),
                    Ok(None) => Delivery::Unchanged,
                    Err(_) => Delivery::Drop,
                }
            }
            // The tasks a listen stream was granted are named by their tokens.
            Parsed::Single(Kind::Notification { method })
                if method == "notifications/subscriptions/acknowledged" =>
            {
                match self.interceptor.tasks_acknowledged(&line) {
                    Some(rewritten) => Delivery::Rewritten(rewritten),
                    None => Delivery::Unchanged,
                }
            }
            // An answer whose result a client could read two ways is never passed unbudgeted.
            Parsed::Single(Kind::Malformed {
                id: Some(id),
                problem: message::Problem::Duplicate(key) | message::Problem::DuplicateIn(key),
            }) => match self.twice_answered(&id, key) {
                Some((client, answer)) => {
                    restored = Some(client);
                    Delivery::Rewritten(answer)
                }
                None => Delivery::Drop,
            },
            // A task's state a client could read two ways (a key twice) is never passed: the
            // proxy could not know which result to budget.
            Parsed::Single(Kind::Malformed {
                id: None,
                problem: message::Problem::Duplicate(key),
            }) => {
                tracing::warn!(key, excerpt = %jsonrpc::excerpt(&line, 120), "a server notification names a key twice (a client could read it two ways); withheld");
                Delivery::Drop
            }
            // What the proxy cannot classify (an id that is no id, a response to no request, a
            // message of no kind) answers nothing a client asked: dropped, logged and counted.
            // JSON-RPC's one null-id message, an error about a message the server could not
            // read (a batch, say), passes while it is the size of an error.
            Parsed::Single(Kind::Response {
                id: None,
                result: None,
            }) if line.len() <= NULL_ID_ERROR_BYTES => Delivery::Unchanged,
            // An answer to a request in flight that cannot be read for certain ends that request
            // with an error that says so: never passed, never left to hang.
            Parsed::Single(Kind::Malformed {
                id: Some(id),
                problem,
            }) => {
                let why = format!("could not be read for certain ({problem:?})");
                match self.withheld_answer(&id, &why) {
                    Some((client, answer)) => {
                        restored = Some(client);
                        Delivery::Rewritten(answer)
                    }
                    None => {
                        let kind = Kind::Malformed {
                            id: Some(id),
                            problem,
                        };
                        unclassified_from_server(&kind, &line);
                        Delivery::Drop
                    }
                }
            }
            Parsed::Single(
                kind @ (Kind::Malformed { .. } | Kind::Response { id: None, .. } | Kind::Other),
            ) => {
                unclassified_from_server(&kind, &line);
                Delivery::Drop
            }
            Parsed::Single(_) => Delivery::Unchanged,
            Parsed::Batch(kinds) => self.server_batch(kinds, &line, &mut restored),
        };
        let kind = match restored {
            Some(id) => Some(Kind::Response {
                id: Some(id),
                result: None,
            }),
            None => kind,
        };
        if let Some(recorder) = &self.recorder {
            let changed = delivery_bytes(&delivered).map(|bytes| ("delivered", bytes));
            recorder.message(Dir::ServerToClient, &line, changed);
        }
        match delivered {
            Delivery::Unchanged => Some((line, kind)),
            // The range of the result was the server's line's, not these bytes'.
            Delivery::Rewritten(bytes) => Some((
                bytes,
                kind.map(|kind| match kind {
                    Kind::Response { id, .. } => Kind::Response { id, result: None },
                    other => other,
                }),
            )),
            Delivery::Drop => None,
        }
    }

    /// What reaches the client of a response from the server.
    /// `restored` gets the client's id when the request went upstream under a fresh one.
    fn server_response(
        &self,
        id: &Id,
        bytes: &[u8],
        result: Option<std::ops::Range<usize>>,
        restored: &mut Option<Id>,
    ) -> Delivery {
        let finished = {
            let mut state = self.state();
            // A parked call's answer, before its client retried: kept for the retry.
            if self.bridge_on
                && let Some(n) = state.pending.get(id.key()).and_then(|f| f.parked)
            {
                let held: usize = state
                    .bridge
                    .parked
                    .values()
                    .filter_map(|p| p.done.as_ref().map(Vec::len))
                    .sum();
                if held + bytes.len() <= MAX_KEPT_BYTES {
                    if let Some(parked) = state.bridge.parked.get_mut(&n) {
                        parked.done = Some(bytes.to_vec());
                    }
                } else {
                    // Too much to hold for a retry that may never come: the call is over.
                    tracing::warn!(
                        bytes = bytes.len(),
                        "a parked call's answer is more than the proxy holds for its retry; dropped"
                    );
                    state.finish(id.key());
                }
                return Delivery::Drop;
            }
            match state.finish(id.key()) {
                Some(flight) => Ok(flight),
                None => Err(state.retired.contains(id.key())),
            }
        };
        if let (
            Ok(InFlight {
                sent: Some(sent), ..
            }),
            Some(metrics),
        ) = (&finished, crate::metrics::get())
        {
            metrics.latency(sent.elapsed());
        }
        // A request that went upstream under a fresh id, or whose id the server spelled
        // otherwise (`"a"` for `"\u0061"`, `1.5` for `1.50`), gets its answer under the client's
        // own id, as the client wrote it.
        let respell = finished
            .as_ref()
            .is_ok_and(|f| f.upstream.is_some() || f.id.raw() != id.raw());
        let restored_bytes;
        let bytes = match &finished {
            Ok(InFlight { id: client_id, .. }) if respell => {
                match message::with_id(bytes, client_id.raw()) {
                    Some(b) => {
                        *restored = Some(client_id.clone());
                        restored_bytes = b;
                        restored_bytes.as_slice()
                    }
                    None => {
                        tracing::error!(
                            id = client_id.raw(),
                            "the answer to a request sent under a fresh id has no readable id"
                        );
                        return Delivery::Rewritten(jsonrpc::error_response(
                            Some(client_id),
                            UPSTREAM_ERROR,
                            "the server's answer could not be read back to this request's id",
                            None,
                        ));
                    }
                }
            }
            _ => bytes,
        };
        let aliased = respell;
        let changed = |d: Option<Vec<u8>>| match (d, aliased) {
            (Some(b), _) => Delivery::Rewritten(b),
            (None, true) => Delivery::Rewritten(bytes.to_vec()),
            (None, false) => Delivery::Unchanged,
        };
        let (pending, span, client, sent, rounds) = match finished {
            Ok(flight) => (
                Ok(flight.pending),
                flight.span,
                Some((flight.id, flight.method, flight.modern)),
                flight.kept,
                flight.rounds,
            ),
            Err(over) => (Err(over), None, None, None, 0),
        };
        // A modern server asks a legacy client's call for input: the proxy asks the client.
        let pending = match (pending, &client, sent) {
            (Ok(pending), Some((client_id, method, false)), Some(sent))
                if bridge::incomplete_kind(bytes).as_deref() == Some("input_required") =>
            {
                return self.ask_legacy_client(client_id, method, pending, sent, rounds, bytes);
            }
            (pending, _, _) => pending,
        };
        // Whether the budget rewrote a tools/call answer (not only its id).
        let mut budgeted = false;
        let delivery = match pending {
            Ok(Pending::ToolsList(modern)) => changed(
                self.interceptor
                    .tools_list_response(bytes, modern.as_deref()),
            ),
            Ok(Pending::Discover) => {
                // A legacy server has no discover: the proxy answers from its session.
                let init = match &self.state().bridge.session {
                    LegacySession::Open(init) if bridge::is_error(bytes) => Some(init.clone()),
                    _ => None,
                };
                match (init, &client) {
                    (Some(init), Some((client_id, _, true))) => Delivery::Rewritten(
                        jsonrpc::result_response(client_id, &bridge::discover_result(&init)),
                    ),
                    _ => {
                        self.interceptor.discover_response(bytes);
                        changed(None)
                    }
                }
            }
            Ok(Pending::Probe) => {
                let bridged = self.bridge_on;
                let era = bridge::era_of_discover_answer(bytes);
                if !bridged || era == Era::Modern {
                    self.interceptor.discover_response(bytes);
                }
                self.learned(era);
                Delivery::Drop
            }
            Ok(Pending::BridgeInitialize) => {
                self.legacy_session_answer(bytes);
                Delivery::Drop
            }
            Ok(Pending::Initialize) => {
                let refused = bridge::is_error(bytes);
                if !refused && self.bridge_on {
                    let mut state = self.state();
                    if state.bridge.server == Some(Era::Modern) && !state.bridge.forced {
                        // A modern server that took a legacy initialize speaks both eras: this
                        // client's session is a legacy one, end to end.
                        tracing::info!(
                            "the server speaks both eras: this legacy client gets a legacy session"
                        );
                        state.bridge.server = Some(Era::Legacy);
                    }
                }
                let ask = {
                    let state = self.state();
                    refused
                        && self.bridge_on
                        && state.bridge.server != Some(Era::Legacy)
                        && state.bridge.legacy_client.is_some()
                };
                match (ask, &client) {
                    // The server refused initialize: perhaps it is modern-only. Ask it.
                    (true, Some((client_id, _, _))) => {
                        self.ask_after_refusal(client_id, bytes);
                        Delivery::Drop
                    }
                    _ => {
                        self.interceptor.initialize_response(bytes);
                        changed(None)
                    }
                }
            }
            Ok(Pending::InitializeByDiscover { refused }) => {
                let era = bridge::era_of_discover_answer(bytes);
                let result = bridge::result_of(bytes);
                match (era, result, &client) {
                    (Era::Modern, Some(result), Some((client_id, _, _))) => {
                        self.interceptor.discover_response(bytes);
                        self.learned(Era::Modern);
                        if refused.is_some()
                            && let Some(origin) = self.interceptor.origin()
                        {
                            // It refused the legacy initialize: later legacy clients go
                            // straight to the bridge.
                            bridge::record_modern_only(origin);
                        }
                        let mut state = self.state();
                        state.bridge.serving_legacy = true;
                        state.bridge.discovered = Some(result.into());
                        let init = state
                            .bridge
                            .legacy_client
                            .as_ref()
                            .map(|c| c.initialize_result(result))
                            .unwrap_or_default();
                        tracing::info!(
                            "the server speaks only 2026-07-28: mcp-budget answers this legacy client's initialize from its server/discover and bridges the session"
                        );
                        Delivery::Rewritten(jsonrpc::result_response(client_id, &init))
                    }
                    _ => {
                        if refused.is_some() {
                            self.learned(era);
                        }
                        match refused {
                            Some(refused) => Delivery::Rewritten(refused),
                            None => changed(None),
                        }
                    }
                }
            }
            Ok(Pending::ToolsCall(context)) => {
                // The envelope's range of the result holds for these bytes unless the id was
                // written back (then the interceptor finds the result itself).
                let result = result.filter(|_| !aliased);
                let rewritten = self.interceptor.tools_call_response(context, bytes, result);
                budgeted = rewritten.is_some();
                changed(rewritten)
            }
            Ok(Pending::TaskResult { task, shown }) => {
                let result = result.filter(|_| !aliased);
                let rewritten = self.interceptor.task_response(
                    task.as_deref(),
                    shown.as_deref(),
                    bytes,
                    result,
                );
                budgeted = rewritten.is_some();
                changed(rewritten)
            }
            Ok(Pending::Other) => changed(None),
            Ok(Pending::Subscription(uri)) => {
                if bridge::is_error(bytes) {
                    tracing::warn!(excerpt = %jsonrpc::excerpt(bytes, 200), "the server refused a resource subscription a listen asked for: its updates will not come");
                }
                self.subscribed(&uri);
                Delivery::Drop
            }
            // A listen held while the server's era was learned, refused by a legacy server:
            // the proxy serves it from the session it opened.
            Ok(Pending::Listen {
                filter: Some(filter),
                served: false,
            }) if bridge::is_error(bytes) && self.bridging_legacy_server() => {
                let mut state = self.state();
                let (Some((client_id, _, true)), LegacySession::Open(init)) =
                    (&client, &state.bridge.session)
                else {
                    return changed(None);
                };
                let init = init.clone();
                // Kept under the id the server saw (a fresh one when the client's was used).
                let upstream = (id.key() != client_id.key()).then(|| id.clone());
                let served = self.serve_listen(&mut state, client_id, upstream, Ok(*filter), &init);
                let kind = message::parse(&served.to_client)
                    .ok()
                    .and_then(message::Parsed::single);
                state.later.to_client.push((served.to_client, kind, None));
                state.later.to_server.extend(served.to_server);
                Delivery::Drop
            }
            Ok(Pending::Listen { .. }) => changed(None),
            Ok(Pending::HeldListen) => {
                let mut state = self.state();
                state.bridge.retiring.retain(|r| r.key() != id.key());
                if state
                    .bridge
                    .held_listen
                    .as_ref()
                    .is_some_and(|h| h.key() == id.key())
                {
                    state.bridge.held_listen = None;
                    state.bridge.held_acked = false;
                    match bridge::is_error(bytes) {
                        true => {
                            tracing::warn!(excerpt = %jsonrpc::excerpt(bytes, 200), "the server refused the listen mcp-budget holds for a legacy client: its list changes and resource updates will not come")
                        }
                        // Ended by the server (a graceful end): opened again, a few times a
                        // session at most (a server that keeps ending it is not asked forever).
                        false if state.bridge.reopened < REOPEN_LISTEN => {
                            state.bridge.reopened += 1;
                            tracing::info!(
                                "the server ended the listen mcp-budget holds for a legacy client; opening it again"
                            );
                            let listen = self.relisten(&mut state);
                            state.later.to_server.extend(listen);
                        }
                        false => tracing::warn!(
                            "the server ended the listen mcp-budget holds for a legacy client again: not opened again until the client's subscriptions change"
                        ),
                    }
                }
                Delivery::Drop
            }
            Err(true) => {
                tracing::info!(
                    id = id.raw(),
                    bytes = bytes.len(),
                    "an answer to a request that is over (answered, timed out or cancelled); dropped"
                );
                Delivery::Drop
            }
            Err(false) => {
                tracing::warn!(
                    id = id.raw(),
                    bytes = bytes.len(),
                    "the server answered an id that was never requested; dropped"
                );
                Delivery::Drop
            }
        };
        let delivery = match &client {
            Some((_, method, modern)) => self.in_client_era(delivery, bytes, method, *modern),
            None => delivery,
        };
        if let Some(span) = span {
            let (out, budget) = match &delivery {
                Delivery::Rewritten(b) if budgeted => {
                    (b.len(), crate::intercept::Outcome::of(b).as_str())
                }
                Delivery::Rewritten(b) => (b.len(), "passed"),
                _ => (bytes.len(), "passed"),
            };
            crate::traces::finish(&span, out, budget);
        }
        delivery
    }

    /// A bridged answer written in its client's era: a legacy server's answer to a modern
    /// request made modern; a modern server's answer to a legacy client made legacy.
    fn in_client_era(
        &self,
        delivery: Delivery,
        bytes: &[u8],
        method: &str,
        modern: bool,
    ) -> Delivery {
        if !self.bridge_on {
            return delivery;
        }
        let (server, serving_legacy) = {
            let state = self.state();
            (state.bridge.server, state.bridge.serving_legacy)
        };
        let current = match &delivery {
            Delivery::Drop => return delivery,
            Delivery::Unchanged => bytes,
            Delivery::Rewritten(b) => b.as_slice(),
        };
        if modern && server == Some(Era::Legacy) {
            if matches!(
                method,
                "ping" | "logging/setLevel" | "resources/subscribe" | "resources/unsubscribe"
            ) {
                // Held while the era was learned, then answered by the legacy server: still
                // not a 2026-07-28 method.
                let id = message::parse(current).ok().and_then(|p| match p.single() {
                    Some(Kind::Response { id, .. }) => id,
                    _ => None,
                });
                return Delivery::Rewritten(jsonrpc::error_response(
                    id.as_ref(),
                    jsonrpc::METHOD_NOT_FOUND,
                    &format!("Method not found: {method} is not part of MCP 2026-07-28"),
                    None,
                ));
            }
            let dropped = match method {
                "tools/list" => bridge::without_required_tasks(current),
                _ => None,
            };
            let current = dropped.as_deref().unwrap_or(current);
            return match bridge::modern_answer(method, current) {
                Some(b) => Delivery::Rewritten(b),
                None if dropped.is_some() => Delivery::Rewritten(current.to_vec()),
                None => delivery,
            };
        }
        if !modern && serving_legacy && method != "initialize" {
            if let Some(kind) = bridge::incomplete_kind(current) {
                let id = message::parse(current).ok().and_then(|p| match p.single() {
                    Some(Kind::Response { id, .. }) => id,
                    _ => None,
                });
                tracing::warn!(
                    kind,
                    method,
                    "a modern server's answer a legacy client cannot take"
                );
                return Delivery::Rewritten(jsonrpc::error_response(
                    id.as_ref(),
                    UPSTREAM_ERROR,
                    &format!(
                        "the server answered {method} with a result of type {kind:?}, which \
                         2025 clients have no form for; mcp-budget relays input_required by asking \
                         the client, but kept no copy of this request to retry it (over 1 MiB, or \
                         the session holds 16 MiB for retries already), and relays no task \
                         across the eras"
                    ),
                    None,
                ));
            }
            let dropped = match method {
                "tools/list" => bridge::without_required_tasks(current),
                _ => None,
            };
            let current = dropped.as_deref().unwrap_or(current);
            return match bridge::legacy_answer(current) {
                Some(b) => Delivery::Rewritten(b),
                None if dropped.is_some() => Delivery::Rewritten(current.to_vec()),
                None => delivery,
            };
        }
        delivery
    }

    /// A legacy server's request for input (elicitation, sampling, roots) during a modern
    /// client's call: the call is parked upstream and its client answered `input_required`,
    /// carrying the request and a `requestState` minted under the cursor key for this session
    /// and this call. `None`: no single call can take it (it is refused, see
    /// [`Relay::answer_server_request`]). The client's id and the answer to it.
    /// `related`: the call whose stream the request came on, when the transport knows it.
    fn park(
        &self,
        server_id: &Id,
        method: &str,
        line: &[u8],
        related: Option<&Id>,
    ) -> Result<Option<(Id, Vec<u8>)>, ()> {
        if !bridge::is_input_request(method) {
            return Err(());
        }
        self.park_inner(server_id, method, line, related).ok_or(())
    }

    fn park_inner(
        &self,
        server_id: &Id,
        method: &str,
        line: &[u8],
        related: Option<&Id>,
    ) -> Option<Option<(Id, Vec<u8>)>> {
        let mut state = self.state();
        // Parked calls that ended otherwise (the server restarted, the answer was unreadable)
        // are forgotten.
        let fields = &mut *state;
        let pending = &fields.pending;
        fields
            .bridge
            .parked
            .retain(|_, p| pending.contains_key(&p.upstream_key));
        if state.bridge.parked.len() >= MAX_PARKED {
            tracing::warn!(
                method,
                "too many calls wait for their clients' input; refused"
            );
            return None;
        }
        // Over HTTP the request came on the stream of the call it belongs to (a parked one:
        // it joins that call's next round). A stream that names a request that cannot take
        // input (not a modern call, or one over) is not guessed past.
        let related = match related {
            None => None,
            Some(r) => match state.pending.get(r.key()) {
                Some(flight) if flight.modern && flight.digest.is_some() => {
                    Some((Box::<str>::from(r.key()), flight.parked))
                }
                _ => {
                    tracing::warn!(
                        method,
                        "a legacy server's request for input came on the stream of a request that cannot take input; refused"
                    );
                    return None;
                }
            },
        };
        // On stdio a server request names no call: it is the only one open that can take
        // input; with none open, the call parked last (a server asking several things at
        // once asks them for one call).
        let open: Vec<Box<str>> = state
            .pending
            .iter()
            .filter(|(_, f)| f.modern && f.digest.is_some() && f.parked.is_none())
            .map(|(k, _)| k.clone())
            .collect();
        let latest = state
            .pending
            .iter()
            .filter_map(|(k, f)| f.parked.filter(|_| f.modern).map(|n| (n, k.clone())))
            .max_by_key(|(n, _)| *n);
        let (upstream_key, parked) = match (related, open.as_slice(), latest) {
            (Some(call), _, _) => call,
            (None, [one], _) => (one.clone(), None),
            (None, [], Some((n, key))) => (key, Some(n)),
            _ => {
                tracing::warn!(
                    method,
                    "a legacy server's request for input with no single modern call it belongs to; refused"
                );
                return None;
            }
        };
        if let Some(n) = parked {
            let entry = state.bridge.parked.get_mut(&n)?;
            if entry.asked.len() + entry.extra.len() >= MAX_INPUTS {
                return None;
            }
            // Its round is not sent yet: this one joins it.
            if let Some(unsent) = entry.unsent.as_mut() {
                let input_key = format!("mcp-budget-{n}-{}", entry.asked.len());
                unsent.push((
                    input_key.clone(),
                    method.to_string(),
                    bridge::params_of(line),
                ));
                entry.asked.push((input_key, server_id.clone()));
                return Some(None);
            }
            // The client has its input_required already: this one goes with the next round.
            entry.extra.push((
                method.to_string(),
                bridge::params_of(line),
                server_id.clone(),
            ));
            return Some(None);
        }
        state.bridge.parked_seq += 1;
        let n = state.bridge.parked_seq;
        let deadline = Instant::now() + self.input_timeout;
        let flight = state.pending.get_mut(&upstream_key)?;
        let client = flight.id.clone();
        // Only a call that can take input (a modern call, its digest kept) is parked.
        flight.digest?;
        let capability = bridge::capability_of(method);
        let declared = flight.caps.as_deref().is_some_and(|caps| {
            caps.split(';')
                .any(|c| c.starts_with(&format!("{capability}(")))
        });
        if !declared {
            // The server needs what the client did not declare: the call fails as a modern
            // server fails it (-32021), and the server's call is cancelled.
            let upstream = flight.upstream.clone().unwrap_or_else(|| flight.id.clone());
            let finished = state.finish(&upstream_key);
            state
                .later
                .to_server
                .push(Outgoing::notification(jsonrpc::error_response(
                    Some(server_id),
                    jsonrpc::METHOD_NOT_FOUND,
                    &format!("mcp-budget: the client did not declare the {capability} capability"),
                    None,
                )));
            state
                .later
                .to_server
                .push(Outgoing::notification(jsonrpc::cancelled(
                    &upstream,
                    "mcp-budget: the client did not declare the capability this call needs",
                )));
            drop(state);
            tracing::info!(
                method,
                "a legacy server needs a capability the modern call did not declare: -32021"
            );
            let data = serde_json::json!({"requiredCapabilities": {capability: {}}});
            let answer = jsonrpc::error_response(
                Some(&client),
                MISSING_CAPABILITY,
                &format!("Server requires the {capability} capability for this request"),
                Some(&data),
            );
            return finished.map(|_| Some((client, answer)));
        }
        if flight.upstream.is_none() {
            // The server knows it by the client's id; a new request under that id goes
            // upstream under a fresh one.
            flight.upstream = Some(flight.id.clone());
        }
        flight.parked = Some(n);
        flight.deadline = Some(deadline);
        state.aliases.remove(client.key());
        let input_key = format!("mcp-budget-{n}");
        let params = bridge::params_of(line);
        state.bridge.parked.insert(
            n,
            Parked {
                upstream_key,
                asked: vec![(input_key.clone(), server_id.clone())],
                done: None,
                extra: Vec::new(),
                unsent: Some(vec![(input_key, method.to_string(), params)]),
            },
        );
        drop(state);
        self.rounds_held
            .store(1, std::sync::atomic::Ordering::Relaxed);
        self.deadline_added.notify_one();
        tracing::info!(
            method,
            "a legacy server asks for input: the modern client gets input_required, the call waits for its retry"
        );
        Some(None)
    }

    /// Whether a round of input is held unsent: the caller then calls
    /// [`Relay::release_rounds`] with `now` once no server message came for [`ROUND_WINDOW`].
    pub fn rounds_waiting(&self) -> bool {
        self.rounds_held.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    /// Sends the `input_required` of every round not sent yet: `now` when no server message
    /// came for [`ROUND_WINDOW`] (what the server asked at once is in its round), or anyway
    /// once [`ROUND_HOLD_EVENTS`] more messages were handled. The answers go to
    /// [`Relay::take_later`].
    pub fn release_rounds(&self, now: bool) {
        use std::sync::atomic::Ordering;
        let age = self.rounds_held.load(Ordering::Relaxed);
        if age == 0 {
            return;
        }
        if !now && age <= ROUND_HOLD_EVENTS {
            self.rounds_held.store(age + 1, Ordering::Relaxed);
            return;
        }
        self.rounds_held.store(0, Ordering::Relaxed);
        let key = self.interceptor.cursor_key();
        let mut state = self.state();
        let nonce = state.bridge.nonce.clone();
        let mut answers = Vec::new();
        let fields = &mut *state;
        for (n, parked) in fields.bridge.parked.iter_mut() {
            let Some(requests) = parked.unsent.take() else {
                continue;
            };
            let Some(flight) = fields.pending.get(&parked.upstream_key) else {
                continue;
            };
            let Some(digest) = flight.digest else {
                continue;
            };
            let token = key.mint(
                &crate::budget::page::Position {
                    offset: usize::try_from(*n).unwrap_or(usize::MAX),
                    key: Some(format!("mrtr.{nonce}")),
                },
                &digest,
            );
            let result = bridge::input_required(&requests, &token);
            let client = flight.id.clone();
            answers.push((client.clone(), jsonrpc::result_response(&client, &result)));
        }
        for (client, answer) in answers {
            self.record_answers(std::slice::from_ref(&answer));
            let kind = Kind::Response {
                id: Some(client),
                result: None,
            };
            state.later.to_client.push((answer, Some(kind), None));
        }
    }

    /// A modern client's retry of a parked call: its answers go to the server's requests, and
    /// the call, still running upstream, is the retry's from now on.
    fn resume(
        &self,
        state: &mut State,
        id: &Id,
        method: &str,
        bytes: &[u8],
        token: &str,
        routed: &mut Routed,
    ) -> Forward {
        let mut refuse = |message: &str| {
            bad_input();
            tracing::warn!(id = id.raw(), message, "an MRTR retry refused");
            routed.to_client.push(jsonrpc::error_response(
                Some(id),
                jsonrpc::INVALID_PARAMS,
                message,
                None,
            ));
            Forward::Drop
        };
        let digest = bridge::call_digest(method, bytes);
        let position = match self.interceptor.cursor_key().verify(token, &digest) {
            Ok(position) => position,
            Err(_) => {
                return refuse(
                    "Invalid params: this requestState was not minted by mcp-budget for this request (it was altered, or is another request's); send the request again without requestState and inputResponses",
                );
            }
        };
        if position.key.as_deref() != Some(format!("mrtr.{}", state.bridge.nonce).as_str()) {
            return refuse(
                "Invalid params: this requestState belongs to another session or principal; send the request again without requestState and inputResponses",
            );
        }
        let n = position.offset as u64;
        let Some(parked) = state.bridge.parked.remove(&n) else {
            return refuse(&format!(
                "Invalid params: the call this requestState continues is no longer held by mcp-budget (it was retried already, or waited longer than {} s, --input-timeout-secs); send the request again without requestState and inputResponses (the tool was not run again)",
                self.input_timeout.as_secs()
            ));
        };
        let answers = bridge::input_responses(bytes);
        let mut to_server: Vec<String> = Vec::new();
        for (key, server_id) in &parked.asked {
            let answer = match answers.get(key) {
                Some(value) => jsonrpc::result_response(server_id, value),
                None => jsonrpc::error_response(
                    Some(server_id),
                    jsonrpc::INVALID_PARAMS,
                    "the client's retry gave no answer to this request",
                    None,
                ),
            };
            to_server.push(String::from_utf8_lossy(&answer).into_owned());
        }
        // Each answer on its own line (2025 servers take no batches).
        let bytes = to_server.remove(0);
        routed.also_to_server.extend(
            to_server
                .into_iter()
                .map(|answer| Outgoing::notification(answer.into_bytes())),
        );
        if !parked.extra.is_empty() {
            // The server asked more meanwhile: the retry gets it, as the next round.
            state.bridge.parked_seq += 1;
            let m = state.bridge.parked_seq;
            let nonce = state.bridge.nonce.clone();
            let Some(flight) = state.pending.get_mut(&parked.upstream_key) else {
                return refuse("Invalid params: the call this requestState continues has ended");
            };
            flight.id = id.clone();
            flight.parked = Some(m);
            flight.deadline = Some(Instant::now() + self.input_timeout);
            let token = self.interceptor.cursor_key().mint(
                &crate::budget::page::Position {
                    offset: usize::try_from(m).unwrap_or(usize::MAX),
                    key: Some(format!("mrtr.{nonce}")),
                },
                &digest,
            );
            let mut requests = Vec::new();
            let mut asked = Vec::new();
            for (i, (method, params, server_id)) in parked.extra.into_iter().enumerate() {
                let key = format!("mcp-budget-{m}-{i}");
                asked.push((key.clone(), server_id));
                requests.push((key, method, params));
            }
            state.bridge.parked.insert(
                m,
                Parked {
                    upstream_key: parked.upstream_key,
                    asked,
                    done: parked.done,
                    extra: Vec::new(),
                    unsent: None,
                },
            );
            let result = bridge::input_required(&requests, &token);
            routed.to_client.push(jsonrpc::result_response(id, &result));
            return Forward::Rewritten(bytes.into_bytes());
        }
        let deadline = self.request_timeout.map(|t| Instant::now() + t);
        let Some(flight) = state.pending.get_mut(&parked.upstream_key) else {
            return refuse("Invalid params: the call this requestState continues has ended");
        };
        flight.id = id.clone();
        flight.parked = None;
        flight.deadline = deadline;
        let upstream = flight.upstream.clone();
        state
            .aliases
            .insert(id.key().into(), parked.upstream_key.clone());
        routed.accepted.push(id.clone());
        if let (Some(done), Some(upstream)) = (parked.done, upstream) {
            state.bridge.resumed_done = Some((upstream, done));
        }
        tracing::debug!(
            id = id.raw(),
            "an MRTR retry: the client's answers go to the legacy server"
        );
        Forward::Rewritten(bytes.into_bytes())
    }

    /// Serves a modern client's `subscriptions/listen` in front of a legacy server: the part
    /// of its filter the server's `InitializeResult` (`init`) can honor is granted and
    /// acknowledged, and the URIs no other listen names are subscribed to upstream. The
    /// listen stays in flight (under `upstream`, a fresh id, when its own was used before)
    /// until the client cancels it or the session ends.
    fn serve_listen(
        &self,
        state: &mut State,
        id: &Id,
        upstream: Option<Id>,
        filter: Result<crate::subscriptions::Filter, crate::subscriptions::Refused>,
        init: &str,
    ) -> ServedListen {
        let opened = filter.and_then(|filter| {
            let granted = filter.granted(init);
            let new = state.bridge.listens.open(id.clone(), granted.clone())?;
            Ok((granted, new))
        });
        let (granted, new) = match opened {
            Ok(opened) => opened,
            Err(refused) => {
                bad_input();
                return ServedListen {
                    open: false,
                    to_client: jsonrpc::error_response(
                        Some(id),
                        jsonrpc::INVALID_PARAMS,
                        &refused.to_string(),
                        None,
                    ),
                    to_server: Vec::new(),
                };
            }
        };
        tracing::debug!(
            id = id.raw(),
            uris = granted.uris.len(),
            "a listen served for a legacy server"
        );
        let key: Box<str> = match &upstream {
            Some(fresh) => {
                state.aliases.insert(id.key().into(), fresh.key().into());
                fresh.key().into()
            }
            None => id.key().into(),
        };
        let mut flight = InFlight::own(
            id.clone(),
            "subscriptions/listen",
            Pending::Listen {
                filter: None,
                served: true,
            },
            None,
        );
        flight.upstream = upstream;
        flight.modern = true;
        state.pending.insert(key, flight);
        let to_server = new
            .iter()
            .filter_map(|uri| self.subscription_request(state, "resources/subscribe", uri))
            .collect();
        ServedListen {
            open: true,
            to_client: crate::subscriptions::acknowledged(id, &granted),
            to_server,
        }
    }

    /// A legacy client's `resources/subscribe` or `resources/unsubscribe` in front of a modern
    /// server: its set of URIs changes, and the listen the proxy holds is replaced.
    fn legacy_subscription(
        &self,
        state: &mut State,
        method: &str,
        request: &[u8],
        routed: &mut Routed,
    ) -> Result<(), String> {
        let uri = crate::subscriptions::requested_uri(request).ok_or_else(|| {
            format!(
                "Invalid params: {method} takes params.uri, a string of at most {} bytes",
                crate::subscriptions::MAX_URI_BYTES
            )
        })?;
        let uris = &mut state.bridge.legacy_uris;
        let changed = match method {
            "resources/subscribe" if uris.contains(&uri) => false,
            "resources/subscribe"
                if uris.len() >= crate::subscriptions::MAX_URIS
                    || uris.iter().map(String::len).sum::<usize>() + uri.len()
                        > crate::subscriptions::MAX_SESSION_URI_BYTES =>
            {
                return Err(format!(
                    "mcp-budget holds at most {} resource subscriptions ({} bytes of URIs) per session; unsubscribe one first",
                    crate::subscriptions::MAX_URIS,
                    crate::subscriptions::MAX_SESSION_URI_BYTES
                ));
            }
            "resources/subscribe" => {
                uris.push(uri);
                true
            }
            _ => {
                let before = uris.len();
                uris.retain(|u| *u != uri);
                uris.len() != before
            }
        };
        if changed {
            let listen = self.relisten(state);
            routed.also_to_server.extend(listen);
        }
        Ok(())
    }

    /// Opens the listen the proxy holds at a modern server for a legacy client, with what it
    /// should now ask for. The acknowledged listen keeps serving until the server acknowledges
    /// the new one, and is cancelled then; one never acknowledged is cancelled at once (nothing
    /// came on it).
    fn relisten(&self, state: &mut State) -> Vec<Outgoing> {
        let Some(discovered) = state.bridge.discovered.clone() else {
            return Vec::new();
        };
        let filter = crate::subscriptions::held_filter(&discovered, &state.bridge.legacy_uris);
        let mut out = Vec::new();
        let current = state.bridge.held_listen.take();
        let acked = std::mem::take(&mut state.bridge.held_acked);
        match current {
            Some(current) if acked && filter.is_some() => {
                if let Some(older) = state.bridge.replaced_listen.replace(current) {
                    out.push(self.cancel_held(state, &older));
                }
            }
            Some(current) => out.push(self.cancel_held(state, &current)),
            None => {}
        }
        let Some(filter) = filter else {
            if let Some(older) = state.bridge.replaced_listen.take() {
                out.push(self.cancel_held(state, &older));
            }
            return out;
        };
        state.fresh += 1;
        let id = Id::from_json_text(&format!("\"mcp-budget-listen-{}\"", state.fresh));
        let request = crate::subscriptions::listen_request(&id, &filter);
        state.pending.insert(
            id.key().into(),
            InFlight::own(
                id.clone(),
                "subscriptions/listen",
                Pending::HeldListen,
                None,
            ),
        );
        tracing::debug!(
            uris = filter.uris.len(),
            "a listen held for a legacy client"
        );
        out.push(Outgoing {
            requests: vec![id.clone()],
            ..for_modern_server(state, "subscriptions/listen", request)
        });
        state.bridge.held_listen = Some(id);
        out
    }

    /// The cancellation of a listen the proxy held for a legacy client (what it still
    /// delivers reaches the client: see `retiring`).
    fn cancel_held(&self, state: &mut State, listen: &Id) -> Outgoing {
        state.finish(listen.key());
        if state.bridge.retiring.len() >= RETIRING_LISTENS {
            state.bridge.retiring.pop_front();
        }
        state.bridge.retiring.push_back(listen.clone());
        let cancel = jsonrpc::cancelled(listen, "mcp-budget: the client's subscriptions changed");
        for_modern_server(state, "notifications/cancelled", cancel)
    }

    /// A modern server's notification on a listen the proxy holds for a legacy client: the
    /// acknowledgement of the current one cancels the one it replaces (dropped: the client
    /// asked for no listen); a list change or resource update on the current listen, the one
    /// it replaces, or one cancelled lately goes to the client, on any other of the proxy's
    /// listens nowhere. `None`: not one of these listens' (routed as before).
    fn on_held_listen(&self, method: &str, line: &[u8]) -> Option<Delivery> {
        if !self.bridge_on {
            return None;
        }
        let mut state = self.state();
        if !state.bridge.serving_legacy {
            return None;
        }
        let tag = message::subscription_id(line)?;
        let ours = tag.raw().starts_with("\"mcp-budget-listen-");
        let is = |listen: &Option<Id>| listen.as_ref().is_some_and(|l| l.key() == tag.key());
        let current = is(&state.bridge.held_listen);
        if method == "notifications/subscriptions/acknowledged" {
            if current {
                state.bridge.held_acked = true;
                if let Some(older) = state.bridge.replaced_listen.take() {
                    let cancel = self.cancel_held(&mut state, &older);
                    state.later.to_server.push(cancel);
                }
            }
            return ours.then_some(Delivery::Drop);
        }
        let known = current
            || is(&state.bridge.replaced_listen)
            || state.bridge.retiring.iter().any(|r| r.key() == tag.key());
        match known {
            true => Some(Delivery::Unchanged),
            false => ours.then_some(Delivery::Drop),
        }
    }

    /// The proxy's own `resources/subscribe` or `resources/unsubscribe` (`method`) for a URI
    /// of the listens it serves, in flight; `None` while one for that URI is in flight (it
    /// goes once that one is answered: [`Relay::subscribed`]).
    fn subscription_request(
        &self,
        state: &mut State,
        method: &'static str,
        uri: &str,
    ) -> Option<Outgoing> {
        if let Some(next) = state.bridge.subscribing.get_mut(uri) {
            *next = Some(method);
            return None;
        }
        state.bridge.subscribing.insert(uri.to_string(), None);
        state.fresh += 1;
        let id = Id::from_json_text(&format!("\"mcp-budget-subscribe-{}\"", state.fresh));
        let bytes = crate::subscriptions::upstream_request(&id, method, uri);
        state.pending.insert(
            id.key().into(),
            InFlight::own(id.clone(), method, Pending::Subscription(uri.into()), None),
        );
        Some(Outgoing {
            requests: vec![id],
            bytes,
            ..Outgoing::default()
        })
    }

    /// A `resources/subscribe` or `resources/unsubscribe` of the proxy's own for `uri` is
    /// over: the one asked for since, if any, goes now.
    fn subscribed(&self, uri: &str) {
        let mut state = self.state();
        if let Some(Some(next)) = state.bridge.subscribing.remove(uri)
            && let Some(request) = self.subscription_request(&mut state, next, uri)
        {
            state.later.to_server.push(request);
        }
    }

    /// A legacy server's list change or resource update, for modern clients: each listen that
    /// asked for it gets it, tagged with its id (by [`Relay::take_later`]); none asked, nobody
    /// gets it (2026-07-28 sends nothing a client did not ask for).
    fn to_listens(&self, method: &str, line: &[u8]) -> Delivery {
        let mut state = self.state();
        let deliveries = state.bridge.listens.deliveries(method, line);
        if deliveries.is_empty() {
            tracing::debug!(
                method,
                "a legacy server's notification no listen asked for; dropped"
            );
        }
        // Every copy goes by its listen's id alone (over HTTP, not to the stream of a request
        // the server's message came with).
        for copy in deliveries {
            let kind = Kind::Notification {
                method: method.to_string(),
            };
            state.later.to_client.push((copy, Some(kind), None));
        }
        Delivery::Drop
    }

    /// Whether the proxy opened (or is opening) a legacy session for modern clients.
    fn bridging_legacy_server(&self) -> bool {
        if !self.bridge_on {
            return false;
        }
        let state = self.state();
        state.bridge.server == Some(Era::Legacy)
            && !matches!(state.bridge.session, LegacySession::Closed)
    }

    /// Whether a request in flight asked for logs at `level` or below.
    fn log_wanted(&self, level: u8) -> bool {
        self.state()
            .pending
            .values()
            .any(|f| f.log_level.is_some_and(|asked| asked <= level))
    }

    /// A legacy server's request in a session the proxy holds for modern clients, which take
    /// no server requests: `ping` is answered; anything else gets an error at once, so that
    /// the server never waits on a client that cannot answer.
    fn answer_server_request(&self, id: &Id, method: &str) {
        let answer = if method == "ping" {
            jsonrpc::result_response(id, "{}")
        } else {
            tracing::warn!(
                method,
                "a legacy server's request to modern clients; refused"
            );
            jsonrpc::error_response(
                Some(id),
                jsonrpc::METHOD_NOT_FOUND,
                &format!(
                    "mcp-budget: {method} cannot reach this server's clients: they speak MCP 2026-07-28, which has no server-to-client requests, and the proxy turns one into an input_required result only for a tools/call, prompts/get or resources/read it can tell it belongs to (the one open, or the one whose stream it came on), and only elicitation, sampling and roots"
                ),
                None,
            )
        };
        self.state()
            .later
            .to_server
            .push(Outgoing::notification(answer));
    }

    /// A legacy client's `initialize` the server refused: the proxy asks it `server/discover`
    /// (it may be modern-only); `refused` (the server's answer, under the client's id) goes to
    /// the client if it is not.
    fn ask_after_refusal(&self, client_id: &Id, refused: &[u8]) {
        let mut state = self.state();
        let Some(client) = state.bridge.legacy_client.clone() else {
            return;
        };
        state.fresh += 1;
        let fresh = Id::from_json_text(&format!("\"mcp-budget-discover-{}\"", state.fresh));
        let bytes = bridge::discover_for(&fresh, &client);
        tracing::info!(
            "the server refused initialize; asking it server/discover (it may speak only 2026-07-28)"
        );
        state
            .aliases
            .insert(client_id.key().into(), fresh.key().into());
        state.pending.insert(
            fresh.key().into(),
            InFlight {
                upstream: Some(fresh.clone()),
                ..InFlight::own(
                    client_id.clone(),
                    "initialize",
                    Pending::InitializeByDiscover {
                        refused: Some(refused.to_vec()),
                    },
                    Some(Instant::now() + PROBE_TIMEOUT),
                )
            },
        );
        let headers =
            crate::era::Headers::of(crate::message::MODERN, "server/discover", None, &bytes, &[]);
        state.later.to_server.push(Outgoing {
            bytes,
            requests: vec![fresh],
            modern: Some(Box::new(headers)),
            ..Outgoing::default()
        });
        drop(state);
        self.deadline_added.notify_one();
    }

    /// Takes request `id` out of flight, when it is a client's to be told (see
    /// [`Relay::clients_flight`]).
    fn finish_for_client(&self, id: &Id, why: &str) -> Option<InFlight> {
        let finished = self.state().finish(id.key());
        finished.and_then(|f| self.clients_flight(f, why))
    }

    /// A request whose answer could not be read: the client's, to be told; or the proxy's own
    /// (its era probe, its `initialize`, a call whose client already has `input_required`),
    /// whose failure is the bridge's to handle, and that no client hears of (`None`).
    fn clients_flight(&self, flight: InFlight, why: &str) -> Option<InFlight> {
        match flight.pending {
            Pending::Probe => {
                tracing::info!(
                    why,
                    "the server's answer to the proxy's server/discover could not be read"
                );
                self.learned(Era::Legacy);
                None
            }
            Pending::BridgeInitialize => {
                let refusal = jsonrpc::error_response(
                    Some(&flight.id),
                    UPSTREAM_ERROR,
                    &format!(
                        "the server's answer to mcp-budget's initialize could not be read: {why}"
                    ),
                    None,
                );
                self.legacy_session_answer(&refusal);
                None
            }
            Pending::Subscription(uri) => {
                tracing::warn!(
                    why,
                    "the server's answer to a resource subscription of the proxy's own could not be read"
                );
                self.subscribed(&uri);
                None
            }
            Pending::HeldListen => {
                tracing::warn!(
                    why,
                    "the server's answer to a request of the proxy's own for a listen could not be read"
                );
                None
            }
            _ if flight.parked.is_some() => None,
            _ => Some(flight),
        }
    }

    /// The batch as it reaches the client: responses for ids not in flight are left out.
    /// `first` gets the client's id of the first response the client receives.
    fn server_batch(&self, kinds: Vec<Kind>, line: &[u8], first: &mut Option<Id>) -> Delivery {
        let Ok(elements) = serde_json::from_slice::<Vec<&RawValue>>(line) else {
            return Delivery::Unchanged; // `parse` accepted it as an array: unreachable
        };
        let mut out = Vec::with_capacity(elements.len());
        let mut changed = false;
        let mut seen_response = false;
        for (kind, element) in kinds.into_iter().zip(&elements) {
            let delivery = match kind {
                Kind::Response { id: Some(id), .. } => {
                    let mut restored = None;
                    let delivery =
                        self.server_response(&id, element.get().as_bytes(), None, &mut restored);
                    // The batch is routed by its first response the client receives.
                    if !seen_response && !matches!(delivery, Delivery::Drop) {
                        seen_response = true;
                        *first = Some(restored.unwrap_or(id));
                    }
                    delivery
                }
                // In a batch as alone: what a client could read two ways is withheld.
                Kind::Malformed {
                    id,
                    problem: message::Problem::Duplicate(key) | message::Problem::DuplicateIn(key),
                } if id.is_some() => match id.and_then(|id| self.twice_answered(&id, key)) {
                    Some((client, answer)) => {
                        if !seen_response {
                            seen_response = true;
                            *first = Some(client);
                        }
                        Delivery::Rewritten(answer)
                    }
                    None => {
                        tracing::warn!(
                            key,
                            "a server message in a batch names a key twice; withheld"
                        );
                        Delivery::Drop
                    }
                },
                // In a batch as alone: a task's state names it by its token, and a completed
                // task's result is budgeted.
                Kind::Notification { method } => {
                    let element = element.get().as_bytes();
                    let rewritten = match method.as_str() {
                        "notifications/tasks" => self.interceptor.task_notification(element),
                        "notifications/subscriptions/acknowledged" => {
                            Ok(self.interceptor.tasks_acknowledged(element))
                        }
                        _ => Ok(None),
                    };
                    match rewritten {
                        Ok(Some(bytes)) => Delivery::Rewritten(bytes),
                        Ok(None) => Delivery::Unchanged,
                        Err(_) => Delivery::Drop,
                    }
                }
                Kind::Response {
                    id: None,
                    result: None,
                } if element.get().len() <= NULL_ID_ERROR_BYTES => Delivery::Unchanged,
                kind @ (Kind::Malformed { .. }
                | Kind::Response { id: None, .. }
                | Kind::Other
                | Kind::Invalid) => {
                    unclassified_from_server(&kind, element.get().as_bytes());
                    Delivery::Drop
                }
                _ => Delivery::Unchanged,
            };
            match delivery {
                Delivery::Unchanged => out.push(element.get().to_owned()),
                Delivery::Rewritten(bytes) => {
                    changed = true;
                    out.push(String::from_utf8_lossy(&bytes).into_owned());
                }
                Delivery::Drop => changed = true,
            }
        }
        match (changed, out.is_empty()) {
            (false, _) => Delivery::Unchanged,
            (true, true) => Delivery::Drop,
            (true, false) => Delivery::Rewritten(format!("[{}]", out.join(",")).into_bytes()),
        }
    }

    /// A server's answer that names `key` twice: a client could read it two ways, and the
    /// proxy could not know which it budgeted, so the call ends with an error that says so.
    /// The client's id and that error; `None`: it answers no call in flight (dropped).
    fn twice_answered(&self, id: &Id, key: &str) -> Option<(Id, Vec<u8>)> {
        self.withheld_answer(id, &format!("names a key twice ({key})"))
    }

    /// A server's answer to `id` that the proxy cannot read for certain (`why`): the call ends
    /// with an error that says so. The client's id and that error; `None`: it answers no call
    /// in flight.
    fn withheld_answer(&self, id: &Id, why: &str) -> Option<(Id, Vec<u8>)> {
        let flight = self.finish_for_client(id, &format!("its answer {why}"))?;
        tracing::warn!(id = flight.id.raw(), why, "the server's answer withheld");
        let answer = jsonrpc::error_response(
            Some(&flight.id),
            UPSTREAM_ERROR,
            &format!(
                "mcp-budget: the server's answer {why}, so the proxy cannot know what a client would read; it was withheld"
            ),
            None,
        );
        Some((flight.id.clone(), answer))
    }

    fn server_too_large(
        &self,
        bytes: usize,
        id: Option<Id>,
        method: Option<String>,
    ) -> Option<Vec<u8>> {
        tracing::warn!(
            bytes,
            method = method.as_deref(),
            "server message over the size limit; dropped"
        );
        let id = id?;
        let finished = self.state().finish(id.key())?;
        let id = self
            .clients_flight(finished, "its answer is over the size limit")?
            .id;
        let message = format!(
            "the server's response is {bytes} bytes, over the proxy's message size limit \
             (raise it with --max-message-bytes, or narrow the request)"
        );
        Some(jsonrpc::error_response(
            Some(&id),
            UPSTREAM_ERROR,
            &message,
            None,
        ))
    }

    /// The upstream is gone: every request in flight gets an error naming `reason`, and so will
    /// every request that arrives from now on.
    pub fn close(&self, reason: &str) -> Vec<Vec<u8>> {
        let errors: Vec<Vec<u8>> = {
            let mut state = self.state();
            state.closed = Some(reason.to_string());
            finish_waiting(&mut state)
                .into_iter()
                .map(|f| jsonrpc::error_response(Some(&f.id), UPSTREAM_ERROR, reason, None))
                .collect()
        };
        self.record_answers(&errors);
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
