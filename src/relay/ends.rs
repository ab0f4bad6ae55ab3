//! How a request ends without an answer: timeouts, progress that restarts them, the
//! upstream going away, and the answers owed to a client whose request is over.

use std::collections::HashSet;
use std::time::Instant;

use crate::era::bridge::{self, Era};
use crate::wire::jsonrpc::{self, UPSTREAM_ERROR};
use crate::wire::message::{self, Id};

use super::bridged::LegacySession;
use super::flights::{InFlight, Pending};
use super::{Expired, Relay, State};

/// Every request in flight, finished; those whose client still waits for their answer: not
/// the proxy's own, and not a parked call whose client has its `input_required` already (one
/// whose round is still held is waited for).
pub(super) fn finish_waiting(state: &mut State) -> Vec<InFlight> {
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

impl Relay {
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
    pub(super) fn progress_seen(&self, line: &[u8]) {
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

    /// Takes request `id` out of flight, when it is a client's to be told (see
    /// [`Relay::clients_flight`]).
    pub(super) fn finish_for_client(&self, id: &Id, why: &str) -> Option<InFlight> {
        let finished = self.state().finish(id.key());
        finished.and_then(|f| self.clients_flight(f, why))
    }

    /// A request whose answer could not be read: the client's, to be told; or the proxy's own
    /// (its era probe, its `initialize`, a call whose client already has `input_required`),
    /// whose failure is the bridge's to handle, and that no client hears of (`None`).
    pub(super) fn clients_flight(&self, flight: InFlight, why: &str) -> Option<InFlight> {
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
