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

mod batch;
mod bridged;
mod ends;
mod flights;
mod listens;
mod mrtr;
mod server;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::bridge::{self, Era, EraChoice, LegacyClient};
use crate::framing::Frame;
use crate::intercept::{CallDecision, Interceptor};
use crate::jsonrpc::{self, INVALID_REQUEST, PARSE_ERROR};
use crate::message::{self, Id, Kind, Parsed};
use crate::recording::{Dir, Recorder};
use crate::upstream::Outgoing;

use bridged::{Bridge, LegacySession};
use flights::{InFlight, Pending, Retired};
use mrtr::{MAX_KEPT_BYTES, MAX_KEPT_REQUEST, kept_bytes};

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
    /// The era bridge of this session (see [`crate::bridge`]).
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
            let answer = bytes::Bytes::from(answer);
            match self.server_response(&upstream, &answer, result, &mut restored) {
                Delivery::Rewritten(bytes) => routed.to_client.push(bytes),
                Delivery::Unchanged => routed.to_client.push(answer.into()),
                Delivery::Drop => {}
            }
        }
        self.record_answers(&routed.to_client);
        routed
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
                // gets its own ids, and a token that does not open is refused. A task id the
                // proxy did not hand to this principal never reaches the server (which sees one
                // client, the proxy, and would answer with another principal's task): a client
                // that did not declare the tasks extension has no tasks, and is told so here
                // (-32021, as the extension says), its request never forwarded.
                let mut named_task: Option<(String, String)> = None;
                let mut task_forward: Option<Vec<u8>> = None;
                let names_a_task = matches!(
                    method.as_str(),
                    "tasks/get" | "tasks/update" | "tasks/cancel"
                );
                if modern.is_some()
                    && names_a_task
                    && !crate::holds!(bytes, b"modelcontextprotocol/tasks")
                {
                    bad_input();
                    tracing::warn!(id = id.raw(), %method, "a task method from a client without the tasks extension; refused");
                    routed.to_client.push(jsonrpc::error_response(
                        Some(&id),
                        jsonrpc::MISSING_CAPABILITY,
                        &format!(
                            "Missing required client capability: {method} needs the tasks extension (io.modelcontextprotocol/tasks) in the request's clientCapabilities; a client that did not declare it has no tasks"
                        ),
                        Some(&serde_json::json!({"requiredCapabilities": {"extensions": {
                            "io.modelcontextprotocol/tasks": {}
                        }}})),
                    ));
                    return Forward::Drop;
                }
                if modern.is_some() && (names_a_task || method == "subscriptions/listen") {
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
