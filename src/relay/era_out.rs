//! The era's part of a server's message, at the relay's edge: the hooks the routing core
//! (`server.rs`) calls, so that it never reads an era or the bridge's state itself — a legacy
//! server's logs, listens and requests in a session held for modern clients, a parked MRTR
//! call's answer, the answers that name the server's era (the two handshakes, the proxy's own
//! probe and session) and the listens the proxy serves or holds.

use bytes::Bytes;

use crate::era::bridge::{self, Era};
use crate::upstream::Outgoing;
use crate::wire::jsonrpc;
use crate::wire::message::{self, Id, Kind};

use super::bridged::LegacySession;
use super::era_state::EraFlight;
use super::flights::Pending;
use super::mrtr::MAX_KEPT_BYTES;
use super::{Delivery, Relay, State};

/// A listen the server ends is opened again at most this many times a session.
const REOPEN_LISTEN: u8 = 3;

impl Relay {
    /// A server notification or request the era decides (`None`: the core routes it).
    /// `restored` gets the client's id of what is delivered as an answer to a client.
    pub(super) fn era_server_message(
        &self,
        kind: &Kind,
        line: &Bytes,
        related: Option<&Id>,
        restored: &mut Option<Id>,
    ) -> Option<Delivery> {
        let delivery = match kind {
            // A legacy server's logs reach modern clients only for requests that asked for
            // them, at or above the level asked; its requests get answers from the proxy.
            Kind::Notification { method }
                if method == "notifications/message" && self.bridging_legacy_server() =>
            {
                if self.log_wanted(bridge::message_level(line)) {
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
            Kind::Notification { method }
                if (crate::era::subscriptions::is_listened(method)
                    || method == "notifications/subscriptions/acknowledged")
                    && let Some(delivery) = self.on_held_listen(method, line) =>
            {
                delivery
            }
            // Its list changes and resource updates reach only the listens that asked.
            Kind::Notification { method }
                if crate::era::subscriptions::is_listened(method)
                    && self.bridging_legacy_server() =>
            {
                self.to_listens(method, line)
            }
            Kind::Request { id, method, .. } if self.bridging_legacy_server() => {
                match self.park(id, method, line, related) {
                    Ok(Some((client, answer))) => {
                        *restored = Some(client);
                        Delivery::Rewritten(answer)
                    }
                    Ok(None) => Delivery::Drop,
                    Err(()) => {
                        self.answer_server_request(id, method);
                        Delivery::Drop
                    }
                }
            }
            _ => return None,
        };
        Some(delivery)
    }

    /// A parked call's answer, before its client retried: kept for the retry (`None`: the
    /// answer is not a parked call's).
    pub(super) fn parked_answer(
        &self,
        state: &mut State,
        id: &Id,
        bytes: &[u8],
    ) -> Option<Delivery> {
        if self.bridge_on
            && let Some(n) = state.pending.get(id.key()).and_then(|f| f.era.parked)
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
            return Some(Delivery::Drop);
        }
        None
    }

    /// A modern server asks a legacy client's call for input: the proxy asks the client
    /// (`Err`: what reaches the client now). `Ok` gives the pending request back.
    pub(super) fn input_required(
        &self,
        pending: Result<Pending, bool>,
        client: &mut Option<(Id, String)>,
        era: &mut EraFlight,
        bytes: &[u8],
    ) -> Result<Result<Pending, bool>, Delivery> {
        let asks = pending.is_ok()
            && client.is_some()
            && !era.modern
            && era.kept.is_some()
            && bridge::incomplete_kind(bytes).as_deref() == Some("input_required");
        match (asks, pending, client.take(), era.kept.take()) {
            (true, Ok(pending), Some((client_id, method)), Some(sent)) => {
                Err(self.ask_legacy_client(&client_id, &method, pending, sent, era.rounds, bytes))
            }
            (_, pending, taken, kept) => {
                *client = taken;
                era.kept = kept;
                Ok(pending)
            }
        }
    }

    /// The answer to a request whose answer the era decides: the handshakes (`initialize`,
    /// `server/discover`), the proxy's probe and legacy session, and the listens and
    /// subscriptions it serves. `client`: the client's id.
    pub(super) fn era_answer(
        &self,
        pending: Pending,
        id: &Id,
        bytes: &[u8],
        client: Option<&Id>,
        era: &EraFlight,
        aliased: bool,
    ) -> Delivery {
        let client = client.map(|id| (id, era.modern));
        let unchanged = || match aliased {
            true => Delivery::Rewritten(bytes.to_vec()),
            false => Delivery::Unchanged,
        };
        match pending {
            Pending::Discover => {
                // A legacy server has no discover: the proxy answers from its session.
                let init = match &self.state().bridge.session {
                    LegacySession::Open(init) if bridge::is_error(bytes) => Some(init.clone()),
                    _ => None,
                };
                match (init, client) {
                    (Some(init), Some((client_id, true))) => Delivery::Rewritten(
                        jsonrpc::result_response(client_id, &bridge::discover_result(&init)),
                    ),
                    _ => {
                        self.interceptor.discover_response(bytes);
                        unchanged()
                    }
                }
            }
            Pending::Probe => {
                let bridged = self.bridge_on;
                let era = bridge::era_of_discover_answer(bytes);
                if !bridged || era == Era::Modern {
                    self.interceptor.discover_response(bytes);
                }
                self.learned(era);
                Delivery::Drop
            }
            Pending::BridgeInitialize => {
                self.legacy_session_answer(bytes);
                Delivery::Drop
            }
            Pending::Initialize => {
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
                match (ask, client) {
                    // The server refused initialize: perhaps it is modern-only. Ask it.
                    (true, Some((client_id, _))) => {
                        self.ask_after_refusal(client_id, bytes);
                        Delivery::Drop
                    }
                    _ => {
                        if refused {
                            // Refused (say, for want of a sign-in): the client may try again.
                            self.state().initialized = false;
                        }
                        self.interceptor.initialize_response(bytes);
                        unchanged()
                    }
                }
            }
            Pending::InitializeByDiscover { refused } => {
                let era = bridge::era_of_discover_answer(bytes);
                let result = bridge::result_of(bytes);
                match (era, result, client) {
                    (Era::Modern, Some(result), Some((client_id, _))) => {
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
                            // The initialize stays refused: the client may try again.
                            self.state().initialized = false;
                        }
                        match refused {
                            Some(refused) => Delivery::Rewritten(refused),
                            None => unchanged(),
                        }
                    }
                }
            }
            Pending::Subscription(uri) => {
                if bridge::is_error(bytes) {
                    tracing::warn!(excerpt = %jsonrpc::excerpt(bytes, 200), "the server refused a resource subscription a listen asked for: its updates will not come");
                }
                self.subscribed(&uri);
                Delivery::Drop
            }
            // A listen held while the server's era was learned, refused by a legacy server:
            // the proxy serves it from the session it opened.
            Pending::Listen {
                filter: Some(filter),
                served: false,
            } if bridge::is_error(bytes) && self.bridging_legacy_server() => {
                let mut state = self.state();
                let (Some((client_id, true)), LegacySession::Open(init)) =
                    (client, &state.bridge.session)
                else {
                    return unchanged();
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
            Pending::Listen { .. } => unchanged(),
            Pending::HeldListen => {
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
            Pending::Other
            | Pending::ToolsList(_)
            | Pending::ToolsCall(_)
            | Pending::TaskResult { .. } => unchanged(),
        }
    }

    /// Whether a request in flight asked for logs at `level` or below.
    fn log_wanted(&self, level: u8) -> bool {
        self.state()
            .pending
            .values()
            .any(|f| f.era.log_level.is_some_and(|asked| asked <= level))
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
}
