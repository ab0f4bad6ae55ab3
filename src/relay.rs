//! The relay core: routes one client session's messages, without doing any I/O.
//!
//! Transports (stdio, HTTP) read frames and hand them here; `Relay` says what goes to the
//! server and what goes back to the client. It remembers the client's requests in flight so
//! that responses can be matched to the `tools/list` and `tools/call` hooks, and so that every
//! waiting request gets an error — never silence — when the server goes away.
//!
//! Ids are never rewritten: one relay serves one client and one upstream.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;

use crate::framing::Frame;
use crate::intercept::{CallContext, CallDecision, Interceptor};
use crate::jsonrpc::{self, INVALID_REQUEST, PARSE_ERROR, UPSTREAM_ERROR};
use crate::message::{self, Id, Kind, Parsed};
use crate::record::{Dir, Recorder};

/// Where the messages from one client frame go.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Routed {
    /// The bytes to send to the server, if any.
    pub to_server: Option<Vec<u8>>,
    /// Messages the proxy answers the client with directly (errors, intercepted calls).
    pub to_client: Vec<Vec<u8>>,
}

enum Pending {
    ToolsList,
    ToolsCall(CallContext),
    Other,
}

/// A client request waiting for its response.
struct InFlight {
    id: Id,
    method: String,
    pending: Pending,
    /// When the request times out (`--request-timeout-secs`).
    deadline: Option<Instant>,
    /// Its `_meta.progressToken` (JSON text), read only when timeouts are on: progress for
    /// it restarts the timeout.
    progress_token: Option<String>,
}

#[derive(Default)]
struct State {
    pending: HashMap<Box<str>, InFlight>,
    /// Set once the upstream is gone: new requests are answered with this reason.
    closed: Option<String>,
}

/// One client session's routing state.
pub struct Relay {
    interceptor: Interceptor,
    state: Mutex<State>,
    recorder: Option<Recorder>,
    request_timeout: Option<Duration>,
}

/// What a timeout sweep produced.
#[derive(Debug, Default)]
pub struct Expired {
    /// Errors for the client, one per timed-out request.
    pub to_client: Vec<Vec<u8>>,
    /// `notifications/cancelled` for the server, one per timed-out request.
    pub to_server: Vec<Vec<u8>>,
}

impl Relay {
    pub fn new(interceptor: Interceptor) -> Self {
        Relay {
            interceptor,
            state: Mutex::new(State::default()),
            recorder: None,
            request_timeout: None,
        }
    }

    /// Requests unanswered after `timeout` get an error and are cancelled upstream (see
    /// [`Relay::expire`]).
    pub fn with_request_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Times out the requests whose deadline passed by `now`.
    pub fn expire(&self, now: Instant) -> Expired {
        let Some(timeout) = self.request_timeout else {
            return Expired::default();
        };
        let expired: Vec<InFlight> = {
            let mut state = self.state();
            let keys: Vec<Box<str>> = state
                .pending
                .iter()
                .filter(|(_, f)| f.deadline.is_some_and(|d| d <= now))
                .map(|(k, _)| k.clone())
                .collect();
            keys.iter()
                .filter_map(|k| state.pending.remove(k))
                .collect()
        };
        let mut out = Expired::default();
        for flight in expired {
            let seconds = timeout.as_secs_f64();
            tracing::warn!(id = flight.id.raw(), method = %flight.method, seconds, "request timed out; cancelling it upstream");
            let message = format!(
                "the server did not answer {} within {seconds} s (--request-timeout-secs); the request was cancelled",
                flight.method
            );
            out.to_client.push(jsonrpc::error_response(
                Some(&flight.id),
                UPSTREAM_ERROR,
                &message,
                None,
            ));
            out.to_server.push(
                format!(
                    r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{},"reason":"mcp-budget: no answer within {seconds} s"}}}}"#,
                    flight.id.raw()
                )
                .into_bytes(),
            );
        }
        self.record_answers(&out.to_client);
        out
    }

    /// Progress for a request in flight restarts its timeout: the server is working on it.
    fn progress_seen(&self, line: &[u8]) {
        let (Some(token), Some(timeout)) =
            (message::progress_token(line, ""), self.request_timeout)
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
        let errors: Vec<Vec<u8>> = self
            .state()
            .pending
            .drain()
            .map(|(_, f)| jsonrpc::error_response(Some(&f.id), UPSTREAM_ERROR, reason, None))
            .collect();
        self.record_answers(&errors);
        errors
    }

    /// Records every message of this session.
    pub fn with_recorder(mut self, recorder: Recorder) -> Self {
        self.recorder = Some(recorder);
        self
    }

    fn record_answers(&self, answers: &[Vec<u8>]) {
        if let Some(recorder) = &self.recorder {
            for answer in answers {
                recorder.message(Dir::ProxyToClient, answer, None);
            }
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means another thread panicked mid-update of a plain map; the
        // map itself is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Number of client requests waiting for a response.
    pub fn in_flight(&self) -> usize {
        self.state().pending.len()
    }

    /// A frame from the client.
    pub fn from_client(&self, frame: Frame) -> Routed {
        let routed = self.route_client(frame);
        self.record_answers(&routed.to_client);
        routed
    }

    fn route_client(&self, frame: Frame) -> Routed {
        match frame {
            Frame::Line(line) => self.client_line(line),
            Frame::TooLarge { bytes, id, method } => {
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
                    to_server: None,
                    to_client: vec![jsonrpc::error_response(
                        id.as_ref(),
                        INVALID_REQUEST,
                        &message,
                        None,
                    )],
                }
            }
        }
    }

    fn client_line(&self, line: Vec<u8>) -> Routed {
        let parsed = match message::parse(&line) {
            Ok(parsed) => parsed,
            Err(err) => {
                tracing::warn!(excerpt = %jsonrpc::excerpt(&line, 120), %err, "client sent a line that is not JSON");
                if let Some(recorder) = &self.recorder {
                    recorder.text(Dir::ClientToServer, &line);
                }
                let message = format!("Parse error: {err}");
                return Routed {
                    to_server: None,
                    to_client: vec![jsonrpc::error_response(None, PARSE_ERROR, &message, None)],
                };
            }
        };
        let invalid = match &parsed {
            Parsed::Single(kind) => *kind == Kind::Invalid,
            Parsed::Batch(kinds) => kinds.is_empty() || kinds.contains(&Kind::Invalid),
        };
        if invalid {
            tracing::warn!(excerpt = %jsonrpc::excerpt(&line, 120), "client sent JSON that is not a JSON-RPC object");
            if let Some(recorder) = &self.recorder {
                recorder.text(Dir::ClientToServer, &line);
            }
            let message = "Invalid Request: a JSON-RPC message is an object (or a non-empty batch of objects)";
            return Routed {
                to_server: None,
                to_client: vec![jsonrpc::error_response(
                    None,
                    INVALID_REQUEST,
                    message,
                    None,
                )],
            };
        }
        match parsed {
            Parsed::Single(kind) => {
                let mut to_client = Vec::new();
                let to_server = self.client_message(kind, &line, &mut to_client);
                if let Some(recorder) = &self.recorder {
                    let forwarded = to_server.as_ref().and_then(|r| r.as_deref());
                    recorder.message(
                        Dir::ClientToServer,
                        &line,
                        forwarded.map(|f| ("forwarded", f)),
                    );
                }
                let to_server = to_server.map(|rewritten| rewritten.unwrap_or(line));
                Routed {
                    to_server,
                    to_client,
                }
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

    /// Handles one client message. Returns `None` when nothing goes upstream, `Some(None)` to
    /// forward the bytes unchanged, `Some(Some(bytes))` to forward rewritten bytes.
    fn client_message(
        &self,
        kind: Kind,
        bytes: &[u8],
        to_client: &mut Vec<Vec<u8>>,
    ) -> Option<Option<Vec<u8>>> {
        match kind {
            Kind::Request { id, method } => {
                tracing::debug!(id = id.raw(), %method, "request");
                let (pending, rewritten) = match method.as_str() {
                    "tools/list" => (Pending::ToolsList, None),
                    "tools/call" => match self.interceptor.tools_call_request(&id, bytes) {
                        CallDecision::Answer(answer) => {
                            to_client.push(answer);
                            return None;
                        }
                        CallDecision::Forward { rewritten, context } => {
                            (Pending::ToolsCall(context), rewritten)
                        }
                    },
                    _ => (Pending::Other, None),
                };
                let mut state = self.state();
                if let Some(reason) = &state.closed {
                    to_client.push(jsonrpc::error_response(
                        Some(&id),
                        UPSTREAM_ERROR,
                        reason,
                        None,
                    ));
                    return None;
                }
                let deadline = self.request_timeout.map(|t| Instant::now() + t);
                let progress_token = self
                    .request_timeout
                    .and_then(|_| message::progress_token(bytes, "_meta"));
                state.pending.insert(
                    id.key().into(),
                    InFlight {
                        id,
                        method,
                        pending,
                        deadline,
                        progress_token,
                    },
                );
                Some(rewritten)
            }
            Kind::Notification { method } => {
                if method == "notifications/cancelled"
                    && let Some(id) = message::cancelled_request_id(bytes)
                {
                    tracing::debug!(id = id.raw(), "client cancelled a request");
                    self.state().pending.remove(id.key());
                }
                Some(None)
            }
            Kind::Response { .. } | Kind::Other | Kind::Invalid => Some(None),
        }
    }

    fn client_batch(&self, kinds: Vec<Kind>, line: Vec<u8>) -> Routed {
        let mut to_client = Vec::new();
        let elements: Vec<&RawValue> = match serde_json::from_slice(&line) {
            Ok(elements) => elements,
            Err(_) => return Routed::default(), // unreachable: `parse` accepted it as an array
        };
        let mut kept = Vec::with_capacity(elements.len());
        let mut changed = false;
        for (kind, element) in kinds.into_iter().zip(&elements) {
            match self.client_message(kind, element.get().as_bytes(), &mut to_client) {
                None => changed = true,
                Some(None) => kept.push(element.get().to_owned()),
                Some(Some(rewritten)) => {
                    changed = true;
                    kept.push(String::from_utf8_lossy(&rewritten).into_owned());
                }
            }
        }
        let to_server = if !changed {
            Some(line)
        } else if kept.is_empty() {
            None
        } else {
            Some(format!("[{}]", kept.join(",")).into_bytes())
        };
        Routed {
            to_server,
            to_client,
        }
    }

    /// A frame from the server: the bytes to send to the client, if any.
    pub fn from_server(&self, frame: Frame) -> Option<Vec<u8>> {
        self.from_server_classified(frame).map(|(bytes, _)| bytes)
    }

    /// Like [`Relay::from_server`], with the envelope read on the way (for a batch, its first
    /// response), so a transport that routes by it need not parse the message again.
    pub fn from_server_classified(&self, frame: Frame) -> Option<(Vec<u8>, Option<Kind>)> {
        let line = match frame {
            Frame::Line(line) => line,
            Frame::TooLarge { bytes, id, method } => {
                if let Some(recorder) = &self.recorder {
                    recorder.too_large(Dir::ServerToClient, bytes);
                }
                let answer = self.server_too_large(bytes, id, method);
                self.record_answers(answer.as_slice());
                return answer.map(|bytes| (bytes, None));
            }
        };
        let parsed = match message::parse(&line) {
            Ok(parsed) => parsed,
            Err(err) => {
                tracing::warn!(excerpt = %jsonrpc::excerpt(&line, 120), %err, "server wrote a line that is not JSON; dropped");
                if let Some(recorder) = &self.recorder {
                    recorder.text(Dir::ServerToClient, &line);
                }
                return None;
            }
        };
        let kind = match &parsed {
            Parsed::Single(kind) => Some(kind.clone()),
            Parsed::Batch(kinds) => kinds
                .iter()
                .find(|k| matches!(k, Kind::Response { id: Some(_) }))
                .cloned(),
        };
        let rewritten = match parsed {
            Parsed::Single(Kind::Response { id: Some(id) }) => self.server_response(&id, &line),
            Parsed::Single(Kind::Notification { method })
                if method == "notifications/progress" && self.request_timeout.is_some() =>
            {
                self.progress_seen(&line);
                None
            }
            Parsed::Single(_) => None,
            Parsed::Batch(kinds) => self.server_batch(kinds, &line),
        };
        if let Some(recorder) = &self.recorder {
            recorder.message(
                Dir::ServerToClient,
                &line,
                rewritten.as_deref().map(|d| ("delivered", d)),
            );
        }
        Some((rewritten.unwrap_or(line), kind))
    }

    /// The rewritten bytes of a response, or `None` to forward it unchanged.
    fn server_response(&self, id: &Id, bytes: &[u8]) -> Option<Vec<u8>> {
        let pending = self.state().pending.remove(id.key()).map(|f| f.pending);
        match pending {
            Some(Pending::ToolsList) => self.interceptor.tools_list_response(bytes),
            Some(Pending::ToolsCall(context)) => {
                self.interceptor.tools_call_response(context, bytes)
            }
            Some(Pending::Other) | None => None,
        }
    }

    /// The rewritten batch, or `None` when no element changed.
    fn server_batch(&self, kinds: Vec<Kind>, line: &[u8]) -> Option<Vec<u8>> {
        let elements: Vec<&RawValue> = serde_json::from_slice(line).ok()?;
        let mut out = Vec::with_capacity(elements.len());
        let mut changed = false;
        for (kind, element) in kinds.into_iter().zip(&elements) {
            let rewritten = match kind {
                Kind::Response { id: Some(id) } => {
                    self.server_response(&id, element.get().as_bytes())
                }
                _ => None,
            };
            match rewritten {
                Some(bytes) => {
                    changed = true;
                    out.push(String::from_utf8_lossy(&bytes).into_owned());
                }
                None => out.push(element.get().to_owned()),
            }
        }
        changed.then(|| format!("[{}]", out.join(",")).into_bytes())
    }

    fn server_too_large(
        &self,
        bytes: usize,
        id: Option<Id>,
        method: Option<String>,
    ) -> Option<Vec<u8>> {
        tracing::warn!(
            bytes,
            method = method.as_deref(),
            "server message over the size limit; dropped"
        );
        let id = id?;
        let id = self.state().pending.remove(id.key())?.id;
        let message = format!(
            "the server's response is {bytes} bytes, over the proxy's message size limit \
             (raise it with --max-message-bytes, or narrow the request)"
        );
        Some(jsonrpc::error_response(
            Some(&id),
            UPSTREAM_ERROR,
            &message,
            None,
        ))
    }

    /// The upstream is gone: every request in flight gets an error naming `reason`, and so will
    /// every request that arrives from now on.
    pub fn close(&self, reason: &str) -> Vec<Vec<u8>> {
        let errors: Vec<Vec<u8>> = {
            let mut state = self.state();
            state.closed = Some(reason.to_string());
            state
                .pending
                .drain()
                .map(|(_, f)| jsonrpc::error_response(Some(&f.id), UPSTREAM_ERROR, reason, None))
                .collect()
        };
        self.record_answers(&errors);
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str) -> Frame {
        Frame::Line(text.as_bytes().to_vec())
    }

    fn text(bytes: &[u8]) -> &str {
        std::str::from_utf8(bytes).unwrap()
    }

    #[test]
    fn requests_pass_unchanged_and_are_tracked_until_answered() {
        let relay = Relay::new(Interceptor::passthrough());
        let req = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x-extra":1.50}}"#;
        let routed = relay.from_client(line(req));
        assert_eq!(routed.to_server.as_deref(), Some(req.as_bytes()));
        assert!(routed.to_client.is_empty());
        assert_eq!(relay.in_flight(), 1);
        let resp = r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}"#;
        assert_eq!(
            relay.from_server(line(resp)).as_deref(),
            Some(resp.as_bytes())
        );
        assert_eq!(relay.in_flight(), 0);
    }

    #[test]
    fn garbage_from_client_gets_a_parse_error() {
        let relay = Relay::new(Interceptor::passthrough());
        let routed = relay.from_client(line("hello"));
        assert_eq!(routed.to_server, None);
        assert_eq!(routed.to_client.len(), 1);
        assert!(text(&routed.to_client[0]).starts_with(
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error: "#
        ));
    }

    #[test]
    fn garbage_from_server_is_dropped() {
        let relay = Relay::new(Interceptor::passthrough());
        assert_eq!(relay.from_server(line("Starting server...")), None);
    }

    #[test]
    fn close_answers_every_pending_request_and_later_ones() {
        let relay = Relay::new(Interceptor::passthrough());
        relay.from_client(line(r#"{"jsonrpc":"2.0","id":"a","method":"tools/call"}"#));
        relay.from_client(line(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#));
        let mut errors: Vec<String> = relay
            .close("server exited")
            .iter()
            .map(|b| text(b).to_string())
            .collect();
        errors.sort();
        assert_eq!(
            errors,
            vec![
                r#"{"jsonrpc":"2.0","id":"a","error":{"code":-32000,"message":"server exited"}}"#,
                r#"{"jsonrpc":"2.0","id":2,"error":{"code":-32000,"message":"server exited"}}"#,
            ]
        );
        let routed = relay.from_client(line(r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#));
        assert_eq!(routed.to_server, None);
        assert_eq!(
            text(&routed.to_client[0]),
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32000,"message":"server exited"}}"#
        );
    }

    #[test]
    fn cancelled_requests_are_forgotten_and_the_notification_forwarded() {
        let relay = Relay::new(Interceptor::passthrough());
        relay.from_client(line(r#"{"jsonrpc":"2.0","id":5,"method":"tools/call"}"#));
        let cancel =
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5}}"#;
        let routed = relay.from_client(line(cancel));
        assert_eq!(routed.to_server.as_deref(), Some(cancel.as_bytes()));
        assert_eq!(relay.in_flight(), 0);
    }

    #[test]
    fn batches_are_tracked_per_element_and_forwarded_unchanged() {
        let relay = Relay::new(Interceptor::passthrough());
        let batch = r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"n"}]"#;
        let routed = relay.from_client(line(batch));
        assert_eq!(routed.to_server.as_deref(), Some(batch.as_bytes()));
        assert_eq!(relay.in_flight(), 1);
        let reply = r#"[{"jsonrpc":"2.0","id":1,"result":{}}]"#;
        assert_eq!(
            relay.from_server(line(reply)).as_deref(),
            Some(reply.as_bytes())
        );
        assert_eq!(relay.in_flight(), 0);
    }

    #[test]
    fn oversized_request_gets_an_error_with_its_id() {
        let relay = Relay::new(Interceptor::passthrough());
        let routed = relay.from_client(Frame::TooLarge {
            bytes: 70_000_000,
            id: Some(Id::from_json_text("9")),
            method: Some("tools/call".into()),
        });
        assert_eq!(routed.to_server, None);
        assert_eq!(
            text(&routed.to_client[0]),
            r#"{"jsonrpc":"2.0","id":9,"error":{"code":-32600,"message":"tools/call message is 70000000 bytes, over the proxy's message size limit (raise it with --max-message-bytes)"}}"#
        );
    }
}
