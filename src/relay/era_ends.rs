//! The era's part of how a request ends without an answer: the proxy's own requests of the
//! era (its probe, its legacy session, its subscriptions and listens), MRTR rounds and parked
//! calls that time out, and the era learned again when the upstream restarts.

use std::collections::HashSet;
use std::time::Instant;

use crate::era::bridge::{self, Era};
use crate::wire::jsonrpc::{self, UPSTREAM_ERROR};
use crate::wire::message::Id;

use super::bridged::LegacySession;
use super::flights::{InFlight, Pending};
use super::{Expired, Relay, State};

/// Which of the requests in flight a client still waits an answer for: not the proxy's own,
/// and not a parked call whose client has its `input_required` already (one whose round is
/// still held is waited for).
pub(super) fn client_waits(state: &State) -> impl Fn(&InFlight) -> bool + use<> {
    let unsent: HashSet<u64> = state
        .bridge
        .parked
        .iter()
        .filter(|(_, p)| p.unsent.is_some())
        .map(|(n, _)| *n)
        .collect();
    move |f: &InFlight| {
        !matches!(
            f.pending,
            Pending::Probe
                | Pending::BridgeInitialize
                | Pending::Subscription(_)
                | Pending::HeldListen
        ) && f.era.parked.is_none_or(|n| unsent.contains(&n))
    }
}

impl Relay {
    /// The rounds of input whose client did not answer by `now`.
    pub(super) fn expire_rounds(&self, now: Instant, out: &mut Expired) {
        // A legacy client that did not answer a modern server's request for input in time:
        // its call gets an error, and the proxy's requests are withdrawn.
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

    /// A request of the era's that timed out: handled here (`None`), or given back.
    pub(super) fn era_expired(&self, flight: InFlight, out: &mut Expired) -> Option<InFlight> {
        if matches!(flight.pending, Pending::Probe) {
            tracing::info!(
                "the server did not answer the proxy's server/discover; its built-in policy, if any, is not known yet"
            );
            out.to_server
                .push(jsonrpc::cancelled(&flight.id, "mcp-budget: no answer"));
            // No answer is a legacy server's (basic/versioning, "Backward Compatibility").
            self.learned(Era::Legacy);
            return None;
        }
        if let Some(n) = flight.era.parked {
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
            return None;
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
            return None;
        }
        Some(flight)
    }

    /// The upstream restarted: the new server is asked its era again, and a legacy one gets a
    /// new session.
    pub(super) fn era_restarted(&self, state: &mut State) {
        if !self.bridge_on {
            return;
        }
        let bridge = &mut state.bridge;
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
            let listen = self.relisten(state);
            state.later.to_server.extend(listen);
        }
    }

    /// A request whose answer could not be read: the client's, to be told (`Some`); or the
    /// proxy's own (its era probe, its `initialize`, a call whose client already has
    /// `input_required`), whose failure is the bridge's to handle, and that no client hears of.
    pub(super) fn era_unread(&self, flight: InFlight, why: &str) -> Option<InFlight> {
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
            _ if flight.era.parked.is_some() => None,
            _ => Some(flight),
        }
    }
}
