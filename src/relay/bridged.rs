//! The era bridge inside the relay (see [`crate::era::bridge`]): its state, the legacy session
//! the proxy opens for modern clients, learning the server's era, and answers rewritten into
//! the client's era.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::era::bridge::{self, Era, EraChoice};
use crate::upstream::Outgoing;
use crate::wire::framing::Frame;
use crate::wire::jsonrpc::{self, UPSTREAM_ERROR};
use crate::wire::message::{self, Id, Kind, Parsed};

use super::era_state::{EraFlight, Request};
use super::flights::{InFlight, Pending};
use super::mrtr::{Parked, Round};
use super::{Delivery, Forward, Relay, Routed, State, bad_input};

/// How long the proxy's own `server/discover` may go unanswered.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// A legacy session the proxy opens for modern clients (the era bridge).
#[derive(Default)]
pub(super) enum LegacySession {
    #[default]
    Closed,
    /// Its `initialize` is in flight.
    Opening,
    /// Open: the server's `InitializeResult` (JSON text).
    Open(std::sync::Arc<str>),
}

/// One session's era bridge ([`crate::era::bridge`]).
#[derive(Default)]
pub(super) struct Bridge {
    /// The server's era, when known (learned, remembered for its origin, or forced).
    pub(super) server: Option<crate::era::bridge::Era>,
    /// Whether the server's era was forced (`--server-era`): nothing is asked.
    pub(super) forced: bool,
    /// Whether the proxy's `server/discover` is in flight to learn it.
    pub(super) asking: bool,
    pub(super) session: LegacySession,
    /// What the legacy session declared, from the modern request that opened it (see
    /// [`bridge::capability_profile`]).
    pub(super) profile: Option<Box<str>>,
    /// Modern client messages held until the server's era is known and, for a legacy server,
    /// its session is open; and their bytes.
    pub(super) held: Vec<Outgoing>,
    pub(super) held_bytes: usize,
    /// What a legacy client declared in its `initialize`.
    pub(super) legacy_client: Option<crate::era::bridge::LegacyClient>,
    /// Whether the proxy serves that legacy client in front of a modern server.
    pub(super) serving_legacy: bool,
    /// Whether the server's era was asked again after it refused the proxy's `initialize`
    /// (once a session: a server that refuses both ways is not asked forever).
    pub(super) reprobed: bool,
    /// Calls parked for MRTR, by number; the last number given.
    pub(super) parked: HashMap<u64, Parked>,
    pub(super) parked_seq: u64,
    /// A random name of this session, in every `requestState` it mints: another session's
    /// (another principal's) state is refused.
    pub(super) nonce: String,
    /// A parked call whose server answer came before the retry: it is answered (under the
    /// retry's id) once the retry is routed.
    pub(super) resumed_done: Option<(Id, Vec<u8>)>,
    /// Legacy clients' calls waiting for their answers to a modern server's input requests;
    /// the proxy's requests to the client, by id key: (round, input key).
    pub(super) rounds: HashMap<u64, Round>,
    pub(super) round_seq: u64,
    pub(super) inputs: HashMap<Box<str>, (u64, String)>,
    /// Modern clients' `subscriptions/listen`, served by the proxy in front of a legacy
    /// server ([`crate::era::subscriptions`]).
    pub(super) listens: crate::era::subscriptions::Listens,
    /// The modern server's `DiscoverResult` (JSON text), when a legacy client is served from it.
    pub(super) discovered: Option<std::sync::Arc<str>>,
    /// That legacy client's resource subscriptions (at most [`crate::era::subscriptions::MAX_URIS`]),
    /// and the listen the proxy holds at the server for it: the current one, and the one it
    /// replaces until the server acknowledges the new one.
    pub(super) legacy_uris: Vec<String>,
    pub(super) held_listen: Option<Id>,
    pub(super) replaced_listen: Option<Id>,
    /// Whether the server acknowledged `held_listen`.
    pub(super) held_acked: bool,
    /// How many times a listen the server ended was opened again.
    pub(super) reopened: u8,
    /// The last listens the proxy cancelled: what they still deliver (written before the
    /// server read the cancellation) reaches the client; a repeat does no harm, a loss would.
    pub(super) retiring: VecDeque<Id>,
    /// The URIs whose `resources/subscribe` or `resources/unsubscribe` is in flight, and what
    /// to send for each once it is answered: one after the other, so that over HTTP (where
    /// each goes in its own POST) the server reads them in the order they were meant.
    pub(super) subscribing: HashMap<String, Option<&'static str>>,
}

/// A modern client's request as it goes into the proxy's legacy session: without the modern
/// headers and the `_meta` revision (the session negotiated its own in `initialize`).
pub(super) fn into_legacy_session(out: &mut Outgoing) {
    out.modern = None;
    if let Some(bytes) = bridge::legacy_request(&out.bytes) {
        out.bytes = bytes;
    }
}

/// The held requests that are still in flight (not cancelled or timed out while held), taken.
pub(super) fn still_in_flight(state: &mut State) -> Vec<Outgoing> {
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
    /// Whether `key` names a client request only the era's hooks hold: a listen the proxy
    /// serves, or a call waiting for its client's answers to a server's input requests.
    pub(super) fn holds(&self, key: &str) -> bool {
        self.listens.is_open(key) || self.rounds.values().any(|r| r.client.key() == key)
    }

    /// When the next round of input times out.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.rounds.values().map(|r| r.deadline).min()
    }

    /// The proxy's requests to the client for round `n`, no longer awaited: their id keys.
    pub(super) fn take_inputs(&mut self, n: u64) -> Vec<Box<str>> {
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
pub(super) const MAX_HELD_BYTES: usize = 8 * 1024 * 1024;

/// A message of the proxy's own for a modern server on a legacy client's behalf: the client's
/// `_meta` (from its `initialize`) added, and the headers a 2026-07-28 POST carries.
pub(super) fn for_modern_server(state: &State, method: &str, message: Vec<u8>) -> Outgoing {
    let bytes = match &state.bridge.legacy_client {
        Some(client) => client.modern_request(&message).unwrap_or(message),
        None => message,
    };
    Outgoing {
        modern: Some(Box::new(crate::era::Headers::of(
            crate::protocol::MODERN,
            method,
            None,
            &bytes,
            &[],
        ))),
        ..Outgoing::notification(bytes)
    }
}

impl Relay {
    /// Turns the era bridge on ([`crate::era::bridge`]): a client of one protocol era is served in
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
            bridge.nonce = crate::wire::canonical::hex(&raw);
            bridge.server = server
                .forced()
                .or_else(|| self.interceptor.origin().and_then(bridge::verdict));
        }
        self
    }

    /// Serves clients of one era only (`--client-era`); `auto` serves both.
    pub fn with_client_era(mut self, era: EraChoice) -> Self {
        self.client_era = era.forced();
        self
    }

    /// How long a call the era bridge parked (its client answering the server's request)
    /// waits for the client's retry before it is cancelled upstream.
    pub fn with_input_timeout(mut self, timeout: Duration) -> Self {
        self.input_timeout = timeout;
        self
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
        if !crate::era::is_modern(&modern.version) || !crate::protocol::takes_input(method) {
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

    /// Whether this relay serves modern clients from a legacy session it opened (so that a
    /// request may need another: [`Relay::call_capabilities`]).
    pub fn in_legacy_session(&self) -> bool {
        if !self.bridge_on {
            return false;
        }
        let state = self.state();
        state.bridge.server != Some(Era::Modern) && state.bridge.profile.is_some()
    }

    /// A modern client's message on its way to a server whose era is not known yet, or to a
    /// legacy server whose session is not open yet, is held (and the session opened); to an
    /// open legacy session it goes without the modern headers (its session carries it).
    /// Returns the answer of a parked call whose retry this frame was, if it came first.
    pub(super) fn era_held(&self, routed: &mut Routed) -> Option<(Id, Vec<u8>)> {
        if !self.bridge_on {
            return None;
        }
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
    pub(super) fn open_legacy(&self, state: &mut State, request: &[u8]) -> Outgoing {
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
    pub(super) fn learned(&self, era: Era) {
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
    pub(super) fn legacy_session_answer(&self, message: &[u8]) {
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
            let probe = self.probe(&mut state, crate::protocol::MODERN);
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

    /// The proxy's own `server/discover`, in flight (see [`Routed::probe`]).
    pub(super) fn probe(&self, state: &mut State, version: &str) -> Outgoing {
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

    /// A bridged answer written in its client's era: a legacy server's answer to a modern
    /// request made modern; a modern server's answer to a legacy client made legacy.
    pub(super) fn in_client_era(
        &self,
        delivery: Delivery,
        bytes: &[u8],
        method: &str,
        era: &EraFlight,
    ) -> Delivery {
        let modern = era.modern;
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
            if crate::protocol::removed_in_modern(method) {
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

    /// Whether the proxy opened (or is opening) a legacy session for modern clients.
    pub(super) fn bridging_legacy_server(&self) -> bool {
        if !self.bridge_on {
            return false;
        }
        let state = self.state();
        state.bridge.server == Some(Era::Legacy)
            && !matches!(state.bridge.session, LegacySession::Closed)
    }

    /// A legacy client's `initialize` the server refused: the proxy asks it `server/discover`
    /// (it may be modern-only); `refused` (the server's answer, under the client's id) goes to
    /// the client if it is not.
    pub(super) fn ask_after_refusal(&self, client_id: &Id, refused: &[u8]) {
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
        let headers = crate::era::Headers::of(
            crate::protocol::MODERN,
            "server/discover",
            None,
            &bytes,
            &[],
        );
        state.later.to_server.push(Outgoing {
            bytes,
            requests: vec![fresh],
            modern: Some(Box::new(headers)),
            ..Outgoing::default()
        });
        drop(state);
        self.deadline_added.notify_one();
    }
}

impl Relay {
    /// The bridge's part of a client request, before it is routed (the era bridge on): the
    /// server's era asked for first, and what the proxy answers itself in the client's era.
    /// `Some`: the request was answered or taken here.
    pub(super) fn bridge_request(
        &self,
        state: &mut State,
        request: &Request,
        upstream: &mut Option<Id>,
        routed: &mut Routed,
    ) -> Option<Forward> {
        let (id, method, bytes) = (request.id, request.method, request.bytes);
        if let Some(meta) = request.meta {
            if state.bridge.server.is_none() && !state.bridge.asking {
                // The server's era is learned before this request goes on.
                state.bridge.asking = true;
                state.probed = true;
                routed.probe = Some(self.probe(state, &meta.version));
            }
            if method == "server/discover"
                && state.bridge.server == Some(Era::Legacy)
                && let LegacySession::Open(init) = &state.bridge.session
            {
                let result = bridge::discover_result(init);
                routed.to_client.push(jsonrpc::result_response(id, &result));
                return Some(Forward::Drop);
            }
            // What 2026-07-28 removed is not served to a modern client, though
            // the legacy server behind would answer it.
            if state.bridge.server == Some(Era::Legacy)
                && crate::protocol::removed_in_modern(method)
            {
                routed.to_client.push(jsonrpc::error_response(
                    Some(id),
                    jsonrpc::METHOD_NOT_FOUND,
                    &format!("Method not found: {method} is not part of MCP 2026-07-28"),
                    None,
                ));
                return Some(Forward::Drop);
            }
            // A legacy server has no listen: the proxy serves it from its session.
            if method == "subscriptions/listen"
                && state.bridge.server == Some(Era::Legacy)
                && let LegacySession::Open(init) = &state.bridge.session
            {
                let init = init.clone();
                let filter = crate::era::subscriptions::Filter::requested(bytes);
                let served = self.serve_listen(state, id, upstream.take(), filter, &init);
                if served.open {
                    routed.accepted.push(id.clone());
                }
                routed.to_client.push(served.to_client);
                routed.also_to_server.extend(served.to_server);
                return Some(Forward::Drop);
            }
            // A retry of a call the proxy parked (MRTR to a legacy server).
            if state.bridge.server == Some(Era::Legacy)
                && crate::protocol::takes_input(method)
                && let Some(token) = bridge::request_state(bytes)
            {
                return Some(self.resume(state, id, method, bytes, &token, routed));
            }
        } else if state.bridge.serving_legacy {
            // What a modern server has no use for, the proxy answers itself.
            match method {
                "resources/subscribe" | "resources/unsubscribe"
                    if state
                        .bridge
                        .discovered
                        .as_deref()
                        .is_some_and(crate::era::subscriptions::offers_subscribe) =>
                {
                    let answer = self.legacy_subscription(state, method, bytes, routed);
                    routed.to_client.push(match answer {
                        Ok(()) => jsonrpc::result_response(id, "{}"),
                        Err(why) => {
                            jsonrpc::error_response(Some(id), jsonrpc::INVALID_PARAMS, &why, None)
                        }
                    });
                    return Some(Forward::Drop);
                }
                "ping" => {
                    routed.to_client.push(jsonrpc::result_response(id, "{}"));
                    return Some(Forward::Drop);
                }
                "logging/setLevel" => {
                    let level = bridge::log_level(bytes);
                    if let Some(client) = state.bridge.legacy_client.as_mut() {
                        client.log_level = level;
                    }
                    routed.to_client.push(jsonrpc::result_response(id, "{}"));
                    return Some(Forward::Drop);
                }
                _ => {}
            }
        }
        None
    }
}
