//! The ids that cannot cross: requests in flight, the ids of finished requests, and the
//! admission of a client's id (as written, or under a fresh id of the proxy's).

use std::collections::{HashSet, VecDeque};
use std::time::Instant;

use crate::intercept::CallContext;
use crate::wire::jsonrpc::{self, INVALID_REQUEST, UPSTREAM_ERROR};
use crate::wire::message::{Id, Modern};

use super::era_state::EraFlight;
use super::{Relay, State, bad_input};

/// How many ids of finished requests are remembered (not reused; their late answers dropped).
pub(super) const RETIRED: usize = 4096;

// Most requests in flight are calls: boxing their context would cost an allocation each.
#[allow(clippy::large_enum_variant)]
pub(super) enum Pending {
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
    ///
    /// [`Routed::probe`]: super::Routed::probe
    Probe,
    /// A modern client's `subscriptions/listen`. `filter`: what it asks for (read when the
    /// bridge is on, for a legacy server's session); `served`: the proxy serves it itself (it
    /// never went upstream), and it ends only when the client cancels it or the session ends.
    Listen {
        filter: Option<Box<crate::era::subscriptions::Filter>>,
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
pub(super) struct InFlight {
    /// The id as the client wrote it.
    pub(super) id: Id,
    /// The id the server saw, when the proxy gave the request a fresh one (a reused id).
    pub(super) upstream: Option<Id>,
    pub(super) method: String,
    pub(super) pending: Pending,
    /// When the request times out (`--request-timeout-secs`).
    pub(super) deadline: Option<Instant>,
    /// Its `_meta.progressToken` (JSON text), read only when timeouts are on: progress for
    /// it restarts the timeout.
    pub(super) progress_token: Option<String>,
    /// When it went upstream (only with metrics on).
    pub(super) sent: Option<Instant>,
    /// Its span (only with traces on).
    pub(super) span: Option<tracing::Span>,
    /// What its era hooks keep of it (see [`super::bridged`]).
    pub(super) era: EraFlight,
}

impl InFlight {
    /// A request of the proxy's own (its era probe, its `initialize`, an MRTR retry), or one
    /// it sends for a client, with nothing else known of it yet.
    pub(super) fn own(
        id: Id,
        method: &str,
        pending: Pending,
        deadline: Option<Instant>,
    ) -> InFlight {
        InFlight {
            id,
            upstream: None,
            method: method.into(),
            pending,
            deadline,
            progress_token: None,
            sent: None,
            span: None,
            era: EraFlight::default(),
        }
    }
}

/// Ids of requests that are over (answered, timed out, cancelled by the client): the server may
/// still answer them, late or again, so they are not taken again. Oldest first, bounded.
#[derive(Default)]
pub(super) struct Retired {
    pub(super) order: VecDeque<Box<str>>,
    pub(super) set: HashSet<Box<str>>,
}

impl Retired {
    pub(super) fn add(&mut self, key: Box<str>) {
        if self.set.insert(key.clone()) {
            self.order.push_back(key);
        }
        while self.order.len() > RETIRED {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    pub(super) fn contains(&self, key: &str) -> bool {
        self.set.contains(key)
    }
}

/// Whether a client's id is spelled like one the proxy mints for its own requests upstream
/// (its era probe, its `initialize`, an MRTR retry): such a request goes upstream under a
/// fresh id, so that the two can never meet.
pub(super) fn reserved(id: &Id) -> bool {
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

impl State {
    /// Takes a request out of flight (by the key of the id the server saw) and remembers its
    /// id as used.
    pub(super) fn finish(&mut self, key: &str) -> Option<InFlight> {
        let (key, flight) = self.pending.remove_entry(key)?;
        if flight.upstream.is_some() && flight.era.parked.is_none() {
            self.aliases.remove(flight.id.key());
        }
        self.retired.add(key);
        Some(flight)
    }

    /// Every request in flight, finished.
    pub(super) fn finish_all(&mut self) -> Vec<InFlight> {
        let keys: Vec<Box<str>> = self.pending.keys().cloned().collect();
        keys.iter().filter_map(|k| self.finish(k)).collect()
    }
}

impl Relay {
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
            && !state.bridge.holds(key)
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
            || state.bridge.holds(id.key())
    }

    /// Whether a request may go upstream: the upstream is there, its id is not in flight, it is
    /// not a second `initialize`, and the session is under its bound on requests in flight.
    /// `Ok(Some(id))`: it goes upstream under that fresh id (its own was used before).
    pub(super) fn admit(
        &self,
        state: &mut State,
        id: &Id,
        method: &str,
    ) -> Result<Option<Id>, Vec<u8>> {
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
}
