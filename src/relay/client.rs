//! The client's path: what goes upstream, and what the proxy answers itself, for each client
//! frame (a message or a batch). What its era changes is asked of the hooks in `era_in.rs`.

use std::time::Instant;

use crate::intercept::{CallDecision, Substituted};
use crate::recording::Dir;
use crate::upstream::Outgoing;
use crate::wire::framing::Frame;
use crate::wire::jsonrpc::{self, INVALID_REQUEST, PARSE_ERROR};
use crate::wire::message::{self, Id, Kind, Parsed};

use super::era_state::Request;
use super::flights::{InFlight, Pending};

use super::*;

impl Relay {
    /// A frame from the client.
    pub fn from_client(&self, frame: Frame) -> Routed {
        self.from_client_with(frame, None)
    }

    /// A frame from the client, and what became of the result references it passed (see
    /// [`crate::session::client_frame`], which replaces them first).
    pub fn from_client_with(&self, frame: Frame, references: Option<Substituted>) -> Routed {
        let mut routed = self.route_client(frame, references);
        // What the era holds of it, and a parked call's answer for its retry.
        let done = self.era_held(&mut routed);
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

    pub(super) fn route_client(&self, frame: Frame, references: Option<Substituted>) -> Routed {
        match frame {
            Frame::Line(line) => self.client_line(line, None, references),
            Frame::Read { line, parsed } => self.client_line(line, Some(parsed), references),
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

    pub(super) fn client_line(
        &self,
        line: Vec<u8>,
        read: Option<Parsed>,
        references: Option<Substituted>,
    ) -> Routed {
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
                let forward =
                    self.client_message(kind, &line, &mut routed, &mut out, references.as_ref());
                if let Some(recorder) = &self.recorder {
                    let forwarded = match &forward {
                        Forward::Rewritten(bytes) => Some(("forwarded", bytes.as_slice())),
                        _ => None,
                    };
                    // The client's own line, and what went upstream of it.
                    match &references {
                        Some(Substituted::Replaced { original, .. }) => {
                            let sent = forwarded.or(match &forward {
                                Forward::Unchanged => Some(("forwarded", line.as_slice())),
                                _ => None,
                            });
                            recorder.message(Dir::ClientToServer, original, sent)
                        }
                        _ => recorder.message(Dir::ClientToServer, &line, forwarded),
                    }
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
    pub(super) fn client_message(
        &self,
        kind: Kind,
        bytes: &[u8],
        routed: &mut Routed,
        out: &mut Outgoing,
        references: Option<&Substituted>,
    ) -> Forward {
        match kind {
            Kind::Request {
                id,
                method,
                progress,
                modern: meta,
                call,
            } => {
                tracing::debug!(id = id.raw(), %method, "request");
                let request = Request {
                    id: &id,
                    method: &method,
                    bytes,
                    meta: meta.as_deref(),
                };
                if let Some(refusal) = self.refused_in_client_era(&request) {
                    bad_input();
                    routed.to_client.push(refusal);
                    return Forward::Drop;
                }
                // Admission and the entry in flight happen under one lock: two requests with one
                // id can never both be admitted.
                let mut state = self.state();
                let mut upstream = match self.admit(&mut state, &id, &method) {
                    Ok(upstream) => upstream,
                    Err(refusal) => {
                        routed.to_client.push(refusal);
                        return Forward::Drop;
                    }
                };
                let mut opened = match self.era_request(&mut state, &request, &mut upstream, routed)
                {
                    Ok(opened) => opened,
                    Err(forward) => return forward,
                };
                let task_forward = match opened.rewritten.take() {
                    Some(rewritten) => Forward::Rewritten(rewritten),
                    None => Forward::Unchanged,
                };
                let routed_by_era =
                    self.era_pending(&mut state, &request, &mut upstream, task_forward);
                let (pending, forward) = match routed_by_era {
                    Ok(decided) => decided,
                    Err(task_forward) => match method.as_str() {
                        "tools/list" => (Pending::ToolsList(meta.clone()), Forward::Unchanged),
                        "server/discover" => (Pending::Discover, Forward::Unchanged),
                        "initialize" => {
                            self.interceptor.initialize_request(bytes);
                            (Pending::Initialize, Forward::Unchanged)
                        }
                        "tools/call" => {
                            match self.interceptor.tools_call_request(
                                &id,
                                bytes,
                                request.meta,
                                call.as_ref(),
                                references,
                            ) {
                                CallDecision::Answer(answer) => {
                                    let answer =
                                        self.answer_in_client_era(&state, &request, answer);
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
                        // A task named by the token the client was shown: every answer about it
                        // is read as a task's state (a completed one carries its result).
                        // Otherwise: the answers that carry results.
                        "tasks/result" | "tasks/get" | "tasks/update" | "tasks/cancel" => {
                            let pending = match opened.task.clone() {
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
                    },
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
                if method == "initialize" {
                    state.initialized = true;
                    out.initialize = true;
                }
                let (forward, era) =
                    self.era_outgoing(&mut state, &request, &pending, &opened, forward, out);
                out.requests
                    .push(upstream.clone().unwrap_or_else(|| id.clone()));
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
                        era,
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
                if let Some(forward) = self.era_notification(&method, routed) {
                    return forward;
                }
                // A notification always goes upstream (a cancellation perhaps rewritten).
                out.initialized |= method == "notifications/initialized";
                if method == "notifications/cancelled"
                    && let Some(id) = message::cancelled_request_id(bytes)
                {
                    tracing::debug!(id = id.raw(), "client cancelled a request");
                    let mut state = self.state();
                    if let Some(forward) = self.era_cancelled(&mut state, &id, routed) {
                        return forward;
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
            Kind::Response { id: Some(id), .. } if self.answers_a_round(&id) => {
                self.answered_in_round(&id, bytes, routed, out)
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
