//! The client's path: what goes upstream, and what the proxy answers itself, for each client
//! frame (a message or a batch), era by era.

use std::time::Instant;

use crate::era::bridge::{self, Era, LegacyClient};
use crate::intercept::CallDecision;
use crate::recording::Dir;
use crate::upstream::Outgoing;
use crate::wire::framing::Frame;
use crate::wire::jsonrpc::{self, INVALID_REQUEST, PARSE_ERROR};
use crate::wire::message::{self, Id, Kind, Parsed};

use super::flights::{InFlight, Pending};
use super::mrtr::{MAX_KEPT_BYTES, MAX_KEPT_REQUEST, kept_bytes};

use super::*;

impl Relay {
    /// A frame from the client.
    pub fn from_client(&self, frame: Frame) -> Routed {
        let mut routed = self.route_client(frame);
        // The era bridge, when on (what is held, and a parked call's answer for its retry).
        let done = match self.bridge_on {
            true => self.bridge_outgoing(&mut routed),
            false => None,
        };
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

    pub(super) fn route_client(&self, frame: Frame) -> Routed {
        match frame {
            Frame::Line(line) => self.client_line(line, None),
            Frame::Read { line, parsed } => self.client_line(line, Some(parsed)),
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

    pub(super) fn client_line(&self, line: Vec<u8>, read: Option<Parsed>) -> Routed {
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
                let forward = self.client_message(kind, &line, &mut routed, &mut out);
                if let Some(recorder) = &self.recorder {
                    let forwarded = match &forward {
                        Forward::Rewritten(bytes) => Some(("forwarded", bytes.as_slice())),
                        _ => None,
                    };
                    recorder.message(Dir::ClientToServer, &line, forwarded);
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
    ) -> Forward {
        match kind {
            Kind::Request {
                id,
                method,
                progress,
                modern,
                call,
            } => {
                tracing::debug!(id = id.raw(), %method, "request");
                if let Some(forced) = self.client_era
                    && let Some((code, message, data)) =
                        bridge::refused_by_client_era(forced, &method, modern.is_some(), bytes)
                {
                    bad_input();
                    routed.to_client.push(jsonrpc::error_response(
                        Some(&id),
                        code,
                        &message,
                        data.as_ref(),
                    ));
                    return Forward::Drop;
                }
                // Admission and the entry in flight happen under one lock: two requests with one
                // id can never both be admitted.
                let mut state = self.state();
                let upstream = match self.admit(&mut state, &id, &method) {
                    Ok(upstream) => upstream,
                    Err(refusal) => {
                        routed.to_client.push(refusal);
                        return Forward::Drop;
                    }
                };
                let mut upstream = upstream;
                if self.bridge_on
                    && let Some(forward) = self.bridge_request(
                        &mut state,
                        &id,
                        &method,
                        modern.as_deref(),
                        bytes,
                        &mut upstream,
                        routed,
                    )
                {
                    return forward;
                }
                if let Some(meta) = &modern
                    && !state.probed
                    && method != "server/discover"
                    && state.bridge.server != Some(Era::Legacy)
                    && self.interceptor.unsettled()
                {
                    state.probed = true;
                    routed.probe = Some(self.probe(&mut state, &meta.version));
                }
                // A modern client names tasks by the tokens the proxy showed it: the server
                // gets its own ids, and a token that does not open is refused. A task id the
                // proxy did not hand to this principal never reaches the server (which sees one
                // client, the proxy, and would answer with another principal's task): a client
                // that did not declare the tasks extension has no tasks, and is told so here
                // (-32021, as the extension says), its request never forwarded.
                let mut named_task: Option<(String, String)> = None;
                let mut task_forward: Option<Vec<u8>> = None;
                let names_a_task = matches!(
                    method.as_str(),
                    "tasks/get" | "tasks/update" | "tasks/cancel"
                );
                if modern.is_some()
                    && names_a_task
                    && !crate::holds!(bytes, b"modelcontextprotocol/tasks")
                {
                    bad_input();
                    tracing::warn!(id = id.raw(), %method, "a task method from a client without the tasks extension; refused");
                    routed.to_client.push(jsonrpc::error_response(
                        Some(&id),
                        jsonrpc::MISSING_CAPABILITY,
                        &format!(
                            "Missing required client capability: {method} needs the tasks extension (io.modelcontextprotocol/tasks) in the request's clientCapabilities; a client that did not declare it has no tasks"
                        ),
                        Some(&serde_json::json!({"requiredCapabilities": {"extensions": {
                            "io.modelcontextprotocol/tasks": {}
                        }}})),
                    ));
                    return Forward::Drop;
                }
                if modern.is_some() && (names_a_task || method == "subscriptions/listen") {
                    match self.interceptor.task_request(&method, bytes) {
                        Ok(None) => {}
                        Ok(Some(named)) => {
                            named_task = named.task;
                            task_forward = Some(named.rewritten);
                        }
                        Err(refused) => {
                            bad_input();
                            tracing::warn!(id = id.raw(), %method, %refused, "a task token refused");
                            routed.to_client.push(jsonrpc::error_response(
                                Some(&id),
                                jsonrpc::INVALID_PARAMS,
                                &refused.to_string(),
                                None,
                            ));
                            return Forward::Drop;
                        }
                    }
                }
                let task_forward = task_forward.map_or(Forward::Unchanged, Forward::Rewritten);
                let (pending, forward) = match method.as_str() {
                    "tools/list" => (Pending::ToolsList(modern.clone()), Forward::Unchanged),
                    "server/discover" => (Pending::Discover, Forward::Unchanged),
                    // Held while the server's era is learned: should it be a legacy one, the
                    // proxy serves the listen when the server refuses it.
                    "subscriptions/listen"
                        if modern.is_some()
                            && self.bridge_on
                            && state.bridge.server != Some(Era::Modern) =>
                    {
                        (
                            Pending::Listen {
                                filter: crate::era::subscriptions::Filter::requested(bytes)
                                    .ok()
                                    .map(Box::new),
                                served: false,
                            },
                            task_forward,
                        )
                    }
                    "initialize" if self.bridge_on => {
                        self.interceptor.initialize_request(bytes);
                        let client = LegacyClient::of(bytes);
                        // A modern server may speak both eras: unless it is forced modern, or
                        // refused a legacy initialize before, the client's own initialize is
                        // tried first (a refusal is bridged: `ask_after_refusal`).
                        let by_discover = state.bridge.server == Some(Era::Modern)
                            && (state.bridge.forced
                                || self.interceptor.origin().is_some_and(bridge::modern_only));
                        let forward = if by_discover {
                            // A modern server has no initialize: its discover answers it.
                            let fresh = upstream.get_or_insert_with(|| {
                                state.fresh += 1;
                                Id::from_json_text(&format!(
                                    "\"mcp-budget-discover-{}\"",
                                    state.fresh
                                ))
                            });
                            Forward::Rewritten(bridge::discover_for(fresh, &client))
                        } else {
                            Forward::Unchanged
                        };
                        state.bridge.legacy_client = Some(client);
                        match by_discover {
                            true => (Pending::InitializeByDiscover { refused: None }, forward),
                            false => (Pending::Initialize, forward),
                        }
                    }
                    "initialize" => {
                        self.interceptor.initialize_request(bytes);
                        (Pending::Initialize, Forward::Unchanged)
                    }
                    "tools/call" => {
                        match self.interceptor.tools_call_request(
                            &id,
                            bytes,
                            modern.as_deref(),
                            call.as_ref(),
                        ) {
                            CallDecision::Answer(answer) => {
                                // Written in the client's era (a legacy client's page of a
                                // modern server's result has no resultType).
                                let answer = match state.bridge.serving_legacy && modern.is_none() {
                                    true => bridge::legacy_answer(&answer).unwrap_or(answer),
                                    false => answer,
                                };
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
                    // A modern client's task, named by its token: every answer about it is
                    // read as a task's state (a completed one carries its result). A legacy
                    // one: the answers that carry results.
                    "tasks/result" | "tasks/get" | "tasks/update" | "tasks/cancel" => {
                        let pending = match named_task.clone() {
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
                let by_discover = matches!(pending, Pending::InitializeByDiscover { .. });
                if method == "initialize" {
                    state.initialized = true;
                    out.initialize = !by_discover;
                }
                // A legacy client's request to a modern server carries the modern `_meta`.
                let bridged = state.bridge.serving_legacy && modern.is_none() && !by_discover;
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
                out.requests
                    .push(upstream.clone().unwrap_or_else(|| id.clone()));
                let headers = match &modern {
                    Some(modern) => Some((
                        &*modern.version,
                        method.as_str(),
                        // A task named by its token: the server's id (Mcp-Name is the body's).
                        match &named_task {
                            Some((task, _)) => Some(task.clone()),
                            None => modern.named.clone(),
                        },
                    )),
                    None if by_discover => Some((crate::protocol::MODERN, "server/discover", None)),
                    None if bridged => {
                        let sent = match &forward {
                            Forward::Rewritten(b) => b.as_slice(),
                            _ => bytes,
                        };
                        Some((
                            crate::protocol::MODERN,
                            method.as_str(),
                            bridge::named(&method, sent),
                        ))
                    }
                    None => None,
                };
                if let Some((version, header_method, named)) = headers {
                    let sent = match &forward {
                        Forward::Rewritten(b) => b.as_slice(),
                        _ => bytes,
                    };
                    let annotated = match &pending {
                        Pending::ToolsCall(context) => {
                            self.interceptor.param_headers(context.tool())
                        }
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
                let to_legacy = modern.is_some()
                    && self.bridge_on
                    && matches!(state.bridge.server, Some(Era::Legacy) | None);
                let log_level = to_legacy
                    .then(|| bridge::requested_log_level(bytes))
                    .flatten();
                let digest = (to_legacy && crate::protocol::takes_input(&method))
                    .then(|| bridge::call_digest(&method, bytes));
                let kept = match &forward {
                    Forward::Rewritten(b)
                        if bridged
                            && crate::protocol::takes_input(&method)
                            && b.len() <= MAX_KEPT_REQUEST
                            && kept_bytes(&state) + b.len() <= MAX_KEPT_BYTES =>
                    {
                        Some(b.clone().into_boxed_slice())
                    }
                    _ => None,
                };
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
                        modern: modern.is_some(),
                        log_level,
                        digest,
                        parked: None,
                        kept,
                        rounds: 0,
                        caps: digest.map(|_| bridge::capability_profile(bytes).into_boxed_str()),
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
                if method == "notifications/initialized" && self.state().bridge.serving_legacy {
                    // A modern server has no session to be told of; the list changes the
                    // client gets unasked come on a listen the proxy holds for it.
                    let mut state = self.state();
                    let listen = self.relisten(&mut state);
                    routed.also_to_server.extend(listen);
                    return Forward::Drop;
                }
                // A notification always goes upstream (a cancellation perhaps rewritten).
                out.initialized |= method == "notifications/initialized";
                if method == "notifications/cancelled"
                    && let Some(id) = message::cancelled_request_id(bytes)
                {
                    tracing::debug!(id = id.raw(), "client cancelled a request");
                    let mut state = self.state();
                    // A call waiting for the client's own answers to a server's input requests
                    // ends here: nothing of it is upstream.
                    let round = state
                        .bridge
                        .rounds
                        .iter()
                        .find(|(_, r)| r.client.key() == id.key())
                        .map(|(n, _)| *n);
                    // A listen the proxy serves ends here: nothing of it is upstream but the
                    // subscriptions no other listen needs.
                    if let Some(gone) = state.bridge.listens.close(id.key()) {
                        let key = state
                            .aliases
                            .get(id.key())
                            .cloned()
                            .unwrap_or_else(|| id.key().into());
                        state.finish(&key);
                        state.retired.add(id.key().into());
                        for uri in gone {
                            let unsubscribe = self.subscription_request(
                                &mut state,
                                "resources/unsubscribe",
                                &uri,
                            );
                            routed.also_to_server.extend(unsubscribe);
                        }
                        return Forward::Drop;
                    }
                    if let Some(n) = round {
                        state.bridge.rounds.remove(&n);
                        state.bridge.inputs.retain(|_, (m, _)| *m != n);
                        state.retired.add(id.key().into());
                        return Forward::Drop;
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
            Kind::Response { id: Some(id), .. }
                if self.state().bridge.inputs.contains_key(id.key()) =>
            {
                self.answered_by_legacy_client(&id, bytes, routed, out)
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
