//! The era's part of a client's message, at the relay's edge: the hooks the routing core
//! (`client.rs`) calls at each step of a request, so that the core never reads an era or the
//! bridge's state itself. A request's era was read once, with its envelope (its 2026-07-28
//! `_meta`), and travels in its [`Request`].

use crate::era::bridge::{self, Era, LegacyClient};
use crate::upstream::Outgoing;
use crate::wire::jsonrpc;
use crate::wire::message::Id;

use super::era_state::{EraFlight, Request};
use super::flights::Pending;
use super::mrtr::{MAX_KEPT_BYTES, MAX_KEPT_REQUEST, kept_bytes};
use super::{Forward, Relay, Routed, State, bad_input};

/// What the era's hooks opened of a request before it is routed.
#[derive(Default)]
pub(super) struct Opened {
    /// The task it names by the token the proxy showed a modern client: (the server's id, the
    /// token).
    pub(super) task: Option<(String, String)>,
    /// The request as it goes upstream with the server's task id in place of the token.
    pub(super) rewritten: Option<Vec<u8>>,
}

impl Relay {
    /// A request the era of clients served (`--client-era`) does not take: its error.
    pub(super) fn refused_in_client_era(&self, request: &Request) -> Option<Vec<u8>> {
        let forced = self.client_era?;
        let (code, message, data) = bridge::refused_by_client_era(
            forced,
            request.method,
            request.meta.is_some(),
            request.bytes,
        )?;
        Some(jsonrpc::error_response(
            Some(request.id),
            code,
            &message,
            data.as_ref(),
        ))
    }

    /// The era's part of an admitted request, before it is routed: the bridge's (the server's
    /// era asked for first, what the proxy answers itself in the client's era), the proxy's
    /// own `server/discover` ahead of a modern client's first request, and the tasks a modern
    /// client names by token. `Err`: the request was answered or taken here.
    pub(super) fn era_request(
        &self,
        state: &mut State,
        request: &Request,
        upstream: &mut Option<Id>,
        routed: &mut Routed,
    ) -> Result<Opened, Forward> {
        let (id, method, bytes) = (request.id, request.method, request.bytes);
        if self.bridge_on
            && let Some(forward) = self.bridge_request(state, request, upstream, routed)
        {
            return Err(forward);
        }
        let Some(meta) = request.meta else {
            return Ok(Opened::default());
        };
        if !state.probed
            && method != "server/discover"
            && state.bridge.server != Some(Era::Legacy)
            && self.interceptor.unsettled()
        {
            state.probed = true;
            routed.probe = Some(self.probe(state, &meta.version));
        }
        // A modern client names tasks by the tokens the proxy showed it: the server gets its
        // own ids, and a token that does not open is refused. A task id the proxy did not
        // hand to this principal never reaches the server (which sees one client, the proxy,
        // and would answer with another principal's task): a client that did not declare the
        // tasks extension has no tasks, and is told so here (-32021, as the extension says),
        // its request never forwarded.
        let names_a_task = matches!(method, "tasks/get" | "tasks/update" | "tasks/cancel");
        if names_a_task && !crate::holds!(bytes, b"modelcontextprotocol/tasks") {
            bad_input();
            tracing::warn!(id = id.raw(), %method, "a task method from a client without the tasks extension; refused");
            routed.to_client.push(jsonrpc::error_response(
                Some(id),
                jsonrpc::MISSING_CAPABILITY,
                &format!(
                    "Missing required client capability: {method} needs the tasks extension (io.modelcontextprotocol/tasks) in the request's clientCapabilities; a client that did not declare it has no tasks"
                ),
                Some(&serde_json::json!({"requiredCapabilities": {"extensions": {
                    "io.modelcontextprotocol/tasks": {}
                }}})),
            ));
            return Err(Forward::Drop);
        }
        if !names_a_task && method != "subscriptions/listen" {
            return Ok(Opened::default());
        }
        match self.interceptor.task_request(method, bytes) {
            Ok(None) => Ok(Opened::default()),
            Ok(Some(named)) => Ok(Opened {
                task: named.task,
                rewritten: Some(named.rewritten),
            }),
            Err(refused) => {
                bad_input();
                tracing::warn!(id = id.raw(), %method, %refused, "a task token refused");
                routed.to_client.push(jsonrpc::error_response(
                    Some(id),
                    jsonrpc::INVALID_PARAMS,
                    &refused.to_string(),
                    None,
                ));
                Err(Forward::Drop)
            }
        }
    }

    /// What a request waits for, where its era decides it: a modern listen held while the
    /// server's era is learned, and a legacy `initialize` with the bridge on. `Err` gives
    /// `forward` back for the core to route.
    pub(super) fn era_pending(
        &self,
        state: &mut State,
        request: &Request,
        upstream: &mut Option<Id>,
        forward: Forward,
    ) -> Result<(Pending, Forward), Forward> {
        if !self.bridge_on {
            return Err(forward);
        }
        let bytes = request.bytes;
        match request.method {
            // Held while the server's era is learned: should it be a legacy one, the proxy
            // serves the listen when the server refuses it.
            "subscriptions/listen"
                if request.meta.is_some() && state.bridge.server != Some(Era::Modern) =>
            {
                let filter = crate::era::subscriptions::Filter::requested(bytes);
                let pending = Pending::Listen {
                    filter: filter.ok().map(Box::new),
                    served: false,
                };
                Ok((pending, forward))
            }
            "initialize" => {
                self.interceptor.initialize_request(bytes);
                let client = LegacyClient::of(bytes);
                // A modern server may speak both eras: unless it is forced modern, or refused
                // a legacy initialize before, the client's own initialize is tried first (a
                // refusal is bridged: `ask_after_refusal`).
                let by_discover = state.bridge.server == Some(Era::Modern)
                    && (state.bridge.forced
                        || self.interceptor.origin().is_some_and(bridge::modern_only));
                let routed = if by_discover {
                    // A modern server has no initialize: its discover answers it.
                    let fresh = upstream.get_or_insert_with(|| {
                        state.fresh += 1;
                        Id::from_json_text(&format!("\"mcp-budget-discover-{}\"", state.fresh))
                    });
                    let forward = Forward::Rewritten(bridge::discover_for(fresh, &client));
                    (Pending::InitializeByDiscover { refused: None }, forward)
                } else {
                    (Pending::Initialize, Forward::Unchanged)
                };
                state.bridge.legacy_client = Some(client);
                Ok(routed)
            }
            _ => Err(forward),
        }
    }

    /// An answer the proxy wrote itself, in its client's era (a legacy client's page of a
    /// modern server's result has no `resultType`).
    pub(super) fn answer_in_client_era(
        &self,
        state: &State,
        request: &Request,
        answer: Vec<u8>,
    ) -> Vec<u8> {
        match state.bridge.serving_legacy && request.meta.is_none() {
            true => bridge::legacy_answer(&answer).unwrap_or(answer),
            false => answer,
        }
    }

    /// The era's part of a request on its way upstream: a legacy client's request to a modern
    /// server carries the modern `_meta`; a modern request (or a bridged one) the 2026-07-28
    /// headers; and what the bridge keeps of it for its MRTR rounds and the log filter.
    pub(super) fn era_outgoing(
        &self,
        state: &mut State,
        request: &Request,
        pending: &Pending,
        opened: &Opened,
        forward: Forward,
        out: &mut Outgoing,
    ) -> (Forward, EraFlight) {
        let (method, bytes) = (request.method, request.bytes);
        let by_discover = matches!(pending, Pending::InitializeByDiscover { .. });
        if by_discover {
            out.initialize = false;
        }
        let bridged = state.bridge.serving_legacy && request.meta.is_none() && !by_discover;
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
        let sent = match &forward {
            Forward::Rewritten(b) => b.as_slice(),
            _ => bytes,
        };
        let headers = match request.meta {
            Some(meta) => Some((
                &*meta.version,
                method,
                // A task named by its token: the server's id; a search by call: the tool it
                // runs (Mcp-Name is the body's).
                match (&opened.task, pending) {
                    (Some((task, _)), _) => Some(task.clone()),
                    (None, Pending::ToolsCall(call)) if call.searches() => {
                        Some(call.tool().to_string())
                    }
                    (None, _) => meta.named.clone(),
                },
            )),
            None if by_discover => Some((crate::protocol::MODERN, "server/discover", None)),
            None if bridged => Some((crate::protocol::MODERN, method, bridge::named(method, sent))),
            None => None,
        };
        if let Some((version, header_method, named)) = headers {
            let annotated = match pending {
                Pending::ToolsCall(context) => self.interceptor.param_headers(context.tool()),
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
        let to_legacy = request.meta.is_some()
            && self.bridge_on
            && matches!(state.bridge.server, Some(Era::Legacy) | None);
        let log_level = to_legacy
            .then(|| bridge::requested_log_level(bytes))
            .flatten();
        let digest = (to_legacy && crate::protocol::takes_input(method))
            .then(|| bridge::call_digest(method, bytes));
        let kept = match &forward {
            Forward::Rewritten(b)
                if bridged
                    && crate::protocol::takes_input(method)
                    && b.len() <= MAX_KEPT_REQUEST
                    && kept_bytes(state) + b.len() <= MAX_KEPT_BYTES =>
            {
                Some(b.clone().into_boxed_slice())
            }
            _ => None,
        };
        let era = EraFlight {
            modern: request.meta.is_some(),
            log_level,
            digest,
            parked: None,
            kept,
            rounds: 0,
            caps: digest.map(|_| bridge::capability_profile(bytes).into_boxed_str()),
        };
        (forward, era)
    }

    /// A client notification the era answers itself: a legacy client's `initialized` to a
    /// modern server, which has no session to be told of (the list changes the client gets
    /// unasked come on a listen the proxy holds for it).
    pub(super) fn era_notification(&self, method: &str, routed: &mut Routed) -> Option<Forward> {
        if method != "notifications/initialized" || !self.state().bridge.serving_legacy {
            return None;
        }
        let mut state = self.state();
        let listen = self.relisten(&mut state);
        routed.also_to_server.extend(listen);
        Some(Forward::Drop)
    }

    /// A client's cancellation of what only the era's hooks hold: a call waiting for the
    /// client's own answers to a server's input requests, or a listen the proxy serves.
    /// Nothing of either is upstream (but the subscriptions no other listen needs).
    pub(super) fn era_cancelled(
        &self,
        state: &mut State,
        id: &Id,
        routed: &mut Routed,
    ) -> Option<Forward> {
        let round = state
            .bridge
            .rounds
            .iter()
            .find(|(_, r)| r.client.key() == id.key())
            .map(|(n, _)| *n);
        if let Some(gone) = state.bridge.listens.close(id.key()) {
            let key = state
                .aliases
                .get(id.key())
                .cloned()
                .unwrap_or_else(|| id.key().into());
            state.finish(&key);
            state.retired.add(id.key().into());
            for uri in gone {
                let unsubscribe = self.subscription_request(state, "resources/unsubscribe", &uri);
                routed.also_to_server.extend(unsubscribe);
            }
            return Some(Forward::Drop);
        }
        let n = round?;
        state.bridge.rounds.remove(&n);
        state.bridge.inputs.retain(|_, (m, _)| *m != n);
        state.retired.add(id.key().into());
        Some(Forward::Drop)
    }

    /// Whether a client's response answers an input request the proxy asked it on a server's
    /// behalf (an MRTR round).
    pub(super) fn answers_a_round(&self, id: &Id) -> bool {
        self.state().bridge.inputs.contains_key(id.key())
    }
}
