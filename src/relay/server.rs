//! The server's path: what reaches the client of each server message (responses, notifications,
//! a legacy server's requests), and the server's requests the proxy answers itself.

use bytes::Bytes;

use crate::era::bridge::{self, Era};
use crate::recording::Dir;
use crate::upstream::Outgoing;
use crate::wire::framing::Frame;
use crate::wire::jsonrpc::{self, UPSTREAM_ERROR};
use crate::wire::message::{self, Id, Kind, Parsed};

use super::bridged::LegacySession;
use super::flights::{InFlight, Pending};
use super::mrtr::MAX_KEPT_BYTES;
use super::{Delivery, Relay};

/// A listen the server ends is opened again at most this many times a session.
const REOPEN_LISTEN: u8 = 3;

/// The largest null-id error a server's message may be and still pass (JSON-RPC's error about
/// a message the server could not read): an error, never a payload.
pub(super) const NULL_ID_ERROR_BYTES: usize = 8 * 1024;

/// A server message the proxy cannot classify with certainty: logged and counted, never
/// passed on for the client to read its own way.
pub(super) fn unclassified_from_server(kind: &Kind, bytes: &[u8]) {
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

fn delivery_bytes(delivery: &Delivery) -> Option<&[u8]> {
    match delivery {
        Delivery::Rewritten(bytes) => Some(bytes),
        _ => None,
    }
}

impl Relay {
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
        // Shared, not copied, with what keeps a part of it (the result cache).
        let (line, read) = match frame {
            Frame::Line(line) => (message::shared_line(line), None),
            Frame::Read { line, parsed } => (message::shared_line(line), Some(parsed)),
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
                let mut scanner = crate::wire::message::EnvelopeScanner::default();
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
                if (crate::era::subscriptions::is_listened(&method)
                    || method == "notifications/subscriptions/acknowledged")
                    && let Some(delivery) = self.on_held_listen(&method, &line) =>
            {
                delivery
            }
            // Its list changes and resource updates reach only the listens that asked.
            Parsed::Single(Kind::Notification { method })
                if crate::era::subscriptions::is_listened(&method)
                    && self.bridging_legacy_server() =>
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
            Delivery::Unchanged => Some((line.into(), kind)),
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
    pub(super) fn server_response(
        &self,
        id: &Id,
        bytes: &Bytes,
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
                        restored_bytes = Bytes::from(b);
                        &restored_bytes
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
}
