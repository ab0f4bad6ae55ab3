//! How a request ends without an answer: timeouts, progress that restarts them, the
//! upstream going away, and the answers owed to a client whose request is over.

use std::time::Instant;

use crate::wire::jsonrpc::{self, UPSTREAM_ERROR};
use crate::wire::message::{self, Id};

use super::flights::InFlight;
use super::{Expired, Relay, State};

/// Every request in flight, finished; those whose client still waits for their answer: not
/// the proxy's own, and not a parked call whose client has its `input_required` already (one
/// whose round is still held is waited for).
pub(super) fn finish_waiting(state: &mut State) -> Vec<InFlight> {
    let waits = super::era_ends::client_waits(state);
    let flights = state.finish_all().into_iter();
    flights.filter(|f| waits(f)).collect()
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
        self.expire_rounds(now, &mut out);
        for flight in expired {
            let Some(flight) = self.era_expired(flight, &mut out) else {
                continue;
            };
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
            self.era_restarted(&mut state);
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
        self.era_unread(flight, why)
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
