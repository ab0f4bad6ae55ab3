//! The server's path: what reaches the client of each server message (responses, notifications,
//! a legacy server's requests), and the server's requests the proxy answers itself.

use bytes::Bytes;

use crate::recording::Dir;
use crate::wire::framing::Frame;
use crate::wire::jsonrpc::{self, UPSTREAM_ERROR};
use crate::wire::message::{self, Id, Kind, Parsed};

use super::era_state::EraFlight;
use super::flights::{InFlight, Pending};
use super::{Delivery, Relay};

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
        let by_era = match &parsed {
            Parsed::Single(kind) => self.era_server_message(kind, &line, related, &mut restored),
            Parsed::Batch(_) => None,
        };
        let delivered = match (by_era, parsed) {
            (Some(delivered), _) => delivered,
            (None, parsed) => match parsed {
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
                // A completed task's result, delivered on a listen stream, is budgeted too.
                Parsed::Single(Kind::Notification { method })
                    if method == "notifications/tasks" =>
                {
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
            },
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
            if let Some(delivery) = self.parked_answer(&mut state, id, bytes) {
                return delivery;
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
        let (pending, span, mut client, mut era) = match finished {
            Ok(flight) => (
                Ok(flight.pending),
                flight.span,
                Some((flight.id, flight.method)),
                flight.era,
            ),
            Err(over) => (Err(over), None, None, EraFlight::default()),
        };
        let pending = match self.input_required(pending, &mut client, &mut era, bytes) {
            Ok(pending) => pending,
            Err(delivery) => return delivery,
        };
        // Whether the budget rewrote a tools/call answer (not only its id).
        let mut budgeted = false;
        let delivery = match pending {
            Ok(Pending::ToolsList(meta)) => {
                changed(self.interceptor.tools_list_response(bytes, meta.as_deref()))
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
            Ok(pending) => {
                let client = client.as_ref().map(|(id, _)| id);
                self.era_answer(pending, id, bytes, client, &era, aliased)
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
            Some((_, method)) => self.in_client_era(delivery, bytes, method, &era),
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
}
