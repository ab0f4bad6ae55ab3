//! The HTTP handlers of the listener: who is asking, then what they sent.
//!
//! Every request is checked in this order, each step before anything costlier: the `Host`
//! header (DNS rebinding), `Origin`, the bearer token, `Accept` and `Content-Type`, the session
//! (its id, its protocol version, the credential it is bound to), the declared body size; only
//! then is the body read, under the size limit and the body timeout.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use crate::wire::framing::Frame;
use crate::wire::jsonrpc;
use crate::wire::message::{self, Id, Kind};

use super::session::{Client, Outbound, PostState, PostStream, Resume, ResumeError, Session};
use super::sessions::OpenError;

use super::body::*;
use super::checks::*;
use super::streams::*;
use crate::era::headers::{SESSION as SESSION_HEADER, VERSION as VERSION_HEADER};

fn open_refusal(err: OpenError) -> Refusal {
    match err {
        OpenError::Full(max) => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("too many sessions (at most {max}); end one with DELETE or try again later"),
        ),
        OpenError::ClientFull(max) => refuse(
            StatusCode::TOO_MANY_REQUESTS,
            &format!(
                "too many sessions for this client (at most {max}, --max-sessions-per-client); end one with DELETE"
            ),
        ),
        OpenError::Children(max) => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!(
                "cannot start another upstream server: {max} run already (--max-children); try again when a session ends"
            ),
        ),
        OpenError::Upstream(err) => {
            tracing::error!(%err, "cannot start the upstream for a new session");
            refuse(
                StatusCode::BAD_GATEWAY,
                &format!("cannot start the upstream server: {err}"),
            )
        }
        OpenError::Closing => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "the proxy is shutting down; try again later",
        ),
        OpenError::Id(err) => {
            tracing::error!(%err, "cannot make a session id");
            refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("cannot make a session id: the system's random source failed ({err})"),
            )
        }
    }
}

fn unwrap_refusal(result: Result<Response, Refusal>) -> Response {
    result.unwrap_or_else(|refusal| *refusal)
}

pub(super) async fn post(
    State(listener): State<Arc<Listener>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    unwrap_refusal(handle_post(&listener, peer, &headers, body).await)
}

/// A POST to the MCP path, straight from the connection: the request is taken apart as it
/// came (the router's extractors would copy its header map, one allocation per header name
/// hyper did not know, and add an extension map for the route's parameters).
pub(super) async fn post_direct(
    listener: Arc<Listener>,
    peer: SocketAddr,
    request: hyper::Request<hyper::body::Incoming>,
) -> Response {
    let (parts, body) = request.into_parts();
    unwrap_refusal(handle_post(&listener, peer, &parts.headers, Body::new(body)).await)
}

async fn handle_post(
    listener: &Listener,
    peer: SocketAddr,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    let client = check_access(listener, headers, peer)?;
    rate_limit(listener, &client)?;
    // Read once: whether the client takes an event stream decides the answer's form below.
    let (json, sse) = accepted(headers);
    if !sse && !json {
        return Err(refuse(
            StatusCode::NOT_ACCEPTABLE,
            "Accept must include application/json and/or text/event-stream",
        ));
    }
    check_content_type(headers)?;
    let existing = match header_str(headers, SESSION_HEADER) {
        Some(_) => Some(find_session(listener, headers, &client)?),
        None => None,
    };
    let (body, mut room) = read_body(listener, headers, body).await?;
    let (parsed, read) = classify(listener, headers, existing.is_some(), &body)?;
    let mut post = Post {
        read,
        restore: None,
        claim: None,
    };
    let (session, opened, body, parsed) =
        post_session(listener, client, existing, headers, body, parsed, &mut post).await?;
    let Post {
        read:
            Classified {
                batch,
                ids,
                mut tokens,
                stateless,
                ..
            },
        restore,
        mut claim,
    } = post;
    session.touch();
    if !sse {
        tokens.clear();
    }
    let post = match claim.as_mut().and_then(super::session::Claim::take_post) {
        Some(post) => post,
        None => session.open_post(),
    };
    let mut routed =
        crate::session::client_frame(&session.relay, Frame::Read { line: body, parsed }).await;
    // The proxy's own answers that take work (a search) are written off the I/O threads.
    for job in std::mem::take(&mut routed.deferred) {
        routed.to_client.push(job.run_heavy().await);
    }
    session.register_post(&post, &routed.accepted, tokens, sse, claim.is_some());
    // Accepted, the request's stream answers for its id; refused, the id is let go.
    if let Some(claim) = claim
        && !routed.accepted.is_empty()
    {
        claim.settle();
    }
    let PostStream { number, tx, rx } = post;
    drop(tx);
    // From here on, whatever happens to this handler, the guard cleans up after the POST.
    let guard = StreamGuard {
        session: session.clone(),
        sse,
        restore,
        state: Some(PostState {
            number,
            seq: 0,
            awaiting: ids.iter().map(|id| id.key().to_string()).collect(),
            accepted: routed.accepted,
            // The proxy's own answers (refusals, intercepted calls) belong to this POST: they
            // come first, and never wait on the POST's own queue (nobody reads it yet).
            own: routed
                .to_client
                .into_iter()
                .map(|bytes| {
                    let kind = message::parse(&bytes)
                        .ok()
                        .and_then(message::Parsed::single);
                    Outbound {
                        bytes,
                        kind,
                        directed: true,
                    }
                })
                .collect(),
            rx,
        }),
        not_results: false,
    };
    if let Some(probe) = routed.probe
        && session.to_server.send(probe).await.is_err()
    {
        tracing::warn!(session = %session.id, "upstream no longer takes messages");
    }
    if let Some(mut message) = routed.to_server {
        // The body's room goes with its bytes until they are written upstream.
        // (A call whose references were replaced holds room of its own already.)
        if let Some(room) = room.take() {
            message.held = crate::upstream::Held(Some(std::sync::Arc::new(room)));
        }
        if session.to_server.send(message).await.is_err() {
            // The upstream is gone; its end answers the waiting requests through `route`.
            tracing::warn!(session = %session.id, "upstream no longer takes messages");
        }
    }
    for message in routed.also_to_server {
        if session.to_server.send(message).await.is_err() {
            tracing::warn!(session = %session.id, "upstream no longer takes messages");
            break;
        }
    }
    // Passed on: its room goes to the next large body.
    drop(room);
    let mut response_headers = HeaderMap::new();
    if opened && let Ok(value) = HeaderValue::from_str(&session.id) {
        response_headers.insert(SESSION_HEADER.clone(), value);
    }
    if ids.is_empty() {
        drop(guard);
        return Ok((StatusCode::ACCEPTED, response_headers).into_response());
    }
    post_answer(
        listener,
        &session,
        guard,
        number,
        (batch, stateless, sse),
        response_headers,
    )
    .await
}

/// A POST's answer, once its message went on: with an event stream, the stream (a modern
/// request's answer that comes first is the response itself, with the status its error calls
/// for); with JSON only, every answer of this POST, gathered.
async fn post_answer(
    listener: &Listener,
    session: &Arc<Session>,
    mut guard: StreamGuard,
    number: u64,
    (batch, stateless, sse): (bool, bool, bool),
    response_headers: HeaderMap,
) -> Result<Response, Refusal> {
    if sse {
        let options = listener.sessions.options();
        let resumable = session.resumable();
        let stop = session.stop_signal(number);
        // A modern request's answer, when it comes before anything else, is the response
        // itself, with the HTTP status its error calls for (2026-07-28: 404 for an unknown
        // method, 400 for bad params or headers); anything before it opens the stream.
        let mut first = VecDeque::new();
        if stateless {
            let Some(message) = guard.next().await else {
                return Ok(json_response(StatusCode::OK, response_headers, Vec::new()));
            };
            if guard.answered() {
                let status = modern_status(&message, guard.not_results);
                return Ok(json_response(status, response_headers, message));
            }
            first.push_back(guard.event(&message));
        }
        let writer = Writer {
            // A client that can resume gets a first event with an id, to resume from.
            replay: resumable
                .then(|| priming(number, options.retry))
                .into_iter()
                .chain(first)
                .collect(),
            deadline: options
                .stream_limit
                .filter(|_| resumable)
                .and_then(|limit| tokio::time::Instant::now().checked_add(limit)),
            source: Source::Post(guard, stop),
            keep_alive: None,
            last_sent: tokio::time::Instant::now(),
        };
        return Ok((response_headers, writer.into_body()).into_response());
    }
    // JSON only: wait for every response of this POST, then answer with them all.
    let mut answers: Vec<Vec<u8>> = Vec::new();
    while let Some(bytes) = guard.next().await {
        answers.extend(batch_elements(bytes));
    }
    let body = if !batch && answers.len() == 1 {
        answers.remove(0)
    } else {
        let mut body = Vec::with_capacity(answers.iter().map(|a| a.len() + 1).sum::<usize>() + 2);
        body.push(b'[');
        for (n, answer) in answers.iter().enumerate() {
            if n > 0 {
                body.push(b',');
            }
            body.extend_from_slice(answer);
        }
        body.push(b']');
        body
    };
    let status = match stateless {
        true => modern_status(&body, guard.not_results),
        false => StatusCode::OK,
    };
    Ok(json_response(status, response_headers, body))
}

/// What a POST's message is, read once: refused here when the proxy cannot act on it (not
/// JSON, no JSON-RPC kind, a message read two ways, the wrong era for `--client-era`), else its
/// requests' ids, progress tokens and initialize, and whether it is a 2026-07-28 request with
/// no session (`existing`: the POST names a session).
fn classify<'h>(
    listener: &Listener,
    headers: &'h HeaderMap,
    existing: bool,
    body: &[u8],
) -> Result<(message::Parsed, Classified<'h>), Refusal> {
    let parsed = match message::parse_from_client(body) {
        Ok(parsed) => parsed,
        Err(err) => {
            let body = jsonrpc::error_response(
                None,
                jsonrpc::PARSE_ERROR,
                &format!("Parse error: {err}"),
                None,
            );
            return Err(Box::new(json_response(
                StatusCode::BAD_REQUEST,
                HeaderMap::new(),
                body,
            )));
        }
    };
    if parsed.is_invalid() {
        let body = jsonrpc::error_response(
            None,
            jsonrpc::INVALID_REQUEST,
            "Invalid Request: a JSON-RPC message is an object (or a non-empty batch of objects)",
            None,
        );
        return Err(Box::new(json_response(
            StatusCode::BAD_REQUEST,
            HeaderMap::new(),
            body,
        )));
    }
    // A message the proxy cannot act on is answered here, under its id when it has one.
    if let message::Parsed::Single(Kind::Malformed { id, problem }) = &parsed {
        return Err(rpc_refusal(
            StatusCode::BAD_REQUEST,
            id.as_ref(),
            jsonrpc::INVALID_REQUEST,
            &problem.message(),
            None,
        ));
    }
    // An object of no JSON-RPC kind, or an answer to no request (a null id): never forwarded.
    if let message::Parsed::Single(kind @ (Kind::Other | Kind::Response { id: None, .. })) = &parsed
    {
        let text = match kind {
            Kind::Other => message::Problem::NotJsonRpc.message(),
            _ => "Invalid Request: a response's id is the id of the request it answers, never null"
                .into(),
        };
        return Err(rpc_refusal(
            StatusCode::BAD_REQUEST,
            None,
            jsonrpc::INVALID_REQUEST,
            &text,
            None,
        ));
    }
    let batch = matches!(parsed, message::Parsed::Batch(_));
    let mut ids = Vec::new();
    let mut initialize = None;
    // The progress tokens of the requests, read with their envelopes.
    let mut tokens = Vec::new();
    let mut any_modern = false;
    for kind in parsed.kinds() {
        match kind {
            Kind::Request {
                id,
                method,
                progress,
                modern: meta,
                ..
            } => {
                if method == "initialize" {
                    initialize = Some(id.clone());
                }
                any_modern |= meta.is_some();
                ids.push(id.clone());
                tokens.extend(progress.as_deref().map(str::to_string));
            }
            // The relay answers it, on this POST.
            Kind::Malformed { id: Some(id), .. } => ids.push(id.clone()),
            _ => {}
        }
    }
    let header_version = header_str(headers, VERSION_HEADER);
    let stateless = !existing
        && (header_version.is_some_and(crate::era::is_modern)
            || (initialize.is_none() && any_modern));
    // A forced client era (`--client-era`) refuses the other era before any session opens.
    if !existing && let Some(forced) = listener.sessions.options().session.client_era.forced() {
        for kind in parsed.kinds() {
            if let Kind::Request {
                id,
                method,
                modern: meta,
                ..
            } = kind
                && let Some((code, message, data)) = crate::era::bridge::refused_by_client_era(
                    forced,
                    method,
                    meta.is_some() || stateless,
                    body,
                )
            {
                return Err(rpc_refusal(
                    StatusCode::BAD_REQUEST,
                    Some(id),
                    code,
                    &message,
                    data.as_ref(),
                ));
            }
        }
        // A modern notification alone (no request to answer under) opens nothing either.
        if forced == crate::era::bridge::Era::Legacy && stateless {
            return Err(rpc_refusal(
                StatusCode::BAD_REQUEST,
                None,
                jsonrpc::INVALID_REQUEST,
                "Invalid Request: this mcp-budget serves 2025-11-25 and earlier only (--client-era legacy): send initialize first",
                None,
            ));
        }
    }
    if stateless && let Some(id) = &initialize {
        // 2026-07-28 has no initialize: a modern client that sends one is told so.
        return Err(rpc_refusal(
            StatusCode::NOT_FOUND,
            Some(id),
            jsonrpc::METHOD_NOT_FOUND,
            "Method not found: initialize is not part of MCP 2026-07-28 (send requests with their _meta; for an earlier revision, send initialize with that revision's MCP-Protocol-Version or none)",
            None,
        ));
    }
    Ok((
        parsed,
        Classified {
            batch,
            ids,
            initialize,
            tokens,
            header_version,
            stateless,
        },
    ))
}

/// A POST's message as [`classify`] read it.
struct Classified<'h> {
    batch: bool,
    /// The ids this POST answers for.
    ids: Vec<Id>,
    initialize: Option<Id>,
    /// The progress tokens of its requests.
    tokens: Vec<String>,
    header_version: Option<&'h str>,
    /// A 2026-07-28 request with no session.
    stateless: bool,
}

/// The session a POST goes to, and the message as it goes there: the one it names; a new one
/// for an initialize; the principal's stateless one for a 2026-07-28 request (its id held for
/// this POST, or replaced by one of the proxy's when another request of the principal has it
/// in flight). Whether the session was opened here.
#[allow(clippy::too_many_arguments)]
async fn post_session(
    listener: &Listener,
    client: Client,
    existing: Option<Arc<Session>>,
    headers: &HeaderMap,
    body: Vec<u8>,
    parsed: message::Parsed,
    post: &mut Post<'_>,
) -> Result<(Arc<Session>, bool, Vec<u8>, message::Parsed), Refusal> {
    let found = match (existing, &post.initialize) {
        (Some(session), _) => (session, false, body, parsed),
        (None, Some(init)) if !post.stateless => {
            let session = listener.sessions.open(client).await.map_err(open_refusal)?;
            session.set_initialize_key(init.key());
            (session, true, body, parsed)
        }
        (None, _) if post.stateless => {
            let message::Parsed::Single(kind) = parsed else {
                return Err(rpc_refusal(
                    StatusCode::BAD_REQUEST,
                    None,
                    jsonrpc::INVALID_REQUEST,
                    "Invalid Request: a 2026-07-28 request is sent alone in its POST (no batches)",
                    None,
                ));
            };
            let session = match kind {
                Kind::Request {
                    id: client_id,
                    method,
                    modern: meta,
                    progress,
                    call,
                } => {
                    let id = &client_id;
                    let seen = ModernHeaders::of(headers);
                    check_modern(&seen, id, &method, meta.as_deref())?;
                    let profile = listener.sessions.capability_profile(&body);
                    let session = listener
                        .sessions
                        .stateless(client, profile)
                        .await
                        .map_err(open_refusal)?;
                    let named = meta.as_ref().and_then(|m| m.named.as_deref());
                    check_params(headers, &seen, id, &session, &method, named, &body)?;
                    // The client's id goes upstream as it is, unless another request of this
                    // principal has it in flight: then one of the proxy's goes instead.
                    if let Some(held) = session.claim(id) {
                        post.claim = Some(held);
                        post.ids = vec![id.clone()];
                        let kind = Kind::Request {
                            id: client_id,
                            method,
                            progress,
                            modern: meta,
                            call,
                        };
                        (session, body, message::Parsed::Single(kind))
                    } else {
                        let fresh = session.fresh_id();
                        let id_at = meta.as_ref().map(|m| m.id_at.clone()).unwrap_or_default();
                        let (line, call) = under_fresh_id(&body, id, &fresh, id_at, call)?;
                        post.ids = vec![fresh.clone()];
                        post.restore = Some((fresh.clone(), id.clone()));
                        let kind = Kind::Request {
                            id: fresh,
                            method,
                            progress,
                            modern: meta,
                            call,
                        };
                        (session, line, message::Parsed::Single(kind))
                    }
                }
                // A notification (a cancellation, say) goes to the principal's session.
                other => {
                    let session = listener
                        .sessions
                        .stateless(client, None)
                        .await
                        .map_err(open_refusal)?;
                    (session, body, message::Parsed::Single(other))
                }
            };
            (session.0, false, session.1, session.2)
        }
        (None, _) => {
            let id = parsed.kinds().iter().find_map(|kind| match kind {
                Kind::Request { id, .. } => Some(id.clone()),
                _ => None,
            });
            return Err(match post.header_version {
                // A client of an earlier revision that lost its session.
                Some(version) if crate::protocol::SUPPORTED.contains(&version) => rpc_refusal(
                    StatusCode::BAD_REQUEST,
                    id.as_ref(),
                    jsonrpc::INVALID_REQUEST,
                    "missing Mcp-Session-Id header: send initialize first, then the session id it returned",
                    None,
                ),
                _ => rpc_refusal(
                    StatusCode::BAD_REQUEST,
                    id.as_ref(),
                    jsonrpc::INVALID_PARAMS,
                    &format!(
                        "Invalid params: a request without a session is a 2026-07-28 request, and carries params._meta[\"{}\"] and [\"{}\"]; send them (with the MCP-Protocol-Version header), or send initialize first for an earlier revision",
                        message::META_VERSION,
                        message::META_CLIENT_CAPABILITIES
                    ),
                    None,
                ),
            });
        }
    };
    Ok(found)
}

/// A POST on its way: what [`classify`] read, and how its answer comes back.
struct Post<'h> {
    read: Classified<'h>,
    /// A modern request sent upstream under an id of the proxy's: (that id, the client's).
    restore: Option<(Id, Id)>,
    /// Or under its own, held for this POST.
    claim: Option<super::session::Claim>,
}

impl<'h> std::ops::Deref for Post<'h> {
    type Target = Classified<'h>;
    fn deref(&self) -> &Classified<'h> {
        &self.read
    }
}

impl std::ops::DerefMut for Post<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.read
    }
}

/// A modern request's `body` under the proxy's `fresh` id instead of the client's `id`:
/// spliced where the envelope reader found it (`id_at`; the call's places move with it), else
/// written anew (the call's places are then read again: `None`).
fn under_fresh_id(
    body: &[u8],
    id: &Id,
    fresh: &Id,
    id_at: std::ops::Range<usize>,
    mut call: Option<message::CallAt>,
) -> Result<(Vec<u8>, Option<message::CallAt>), Refusal> {
    match body.get(id_at.clone()) {
        Some(text) if !id_at.is_empty() && text == id.raw().as_bytes() => {
            let mut line = Vec::with_capacity(body.len() + fresh.raw().len());
            line.extend_from_slice(&body[..id_at.start]);
            line.extend_from_slice(fresh.raw().as_bytes());
            line.extend_from_slice(&body[id_at.end..]);
            if let Some(call) = &mut call {
                call.shift_after(id_at.end, id_at.len(), fresh.raw().len());
            }
            Ok((line, call))
        }
        _ => {
            let line = message::with_id(body, fresh.raw()).ok_or_else(|| {
                rpc_refusal(
                    StatusCode::BAD_REQUEST,
                    Some(id),
                    jsonrpc::INVALID_REQUEST,
                    "Invalid Request: the request's id could not be read",
                    None,
                )
            })?;
            Ok((line, None))
        }
    }
}

/// The HTTP status of a modern request's answer: an error names it (2026-07-28, Streamable
/// HTTP): an unknown method 404, a request the server refused as malformed 400.
/// `maybe_error`: the answer is not known to be results only.
fn modern_status(answer: &[u8], maybe_error: bool) -> StatusCode {
    // A result says nothing of errors: no read at all.
    if !maybe_error || !crate::holds!(answer, b"\"error\"") {
        return StatusCode::OK;
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        error: Option<Code>,
    }
    #[derive(serde::Deserialize)]
    struct Code {
        code: i64,
    }
    let code = serde_json::from_slice::<Answer>(answer)
        .ok()
        .and_then(|a| a.error)
        .map(|e| e.code);
    match code {
        Some(jsonrpc::METHOD_NOT_FOUND) => StatusCode::NOT_FOUND,
        Some(
            jsonrpc::PARSE_ERROR
            | jsonrpc::INVALID_REQUEST
            | jsonrpc::INVALID_PARAMS
            | jsonrpc::HEADER_MISMATCH
            | jsonrpc::MISSING_CAPABILITY
            | jsonrpc::UNSUPPORTED_VERSION,
        ) => StatusCode::BAD_REQUEST,
        _ => StatusCode::OK,
    }
}

/// The messages of one line: a batch's elements, or the message itself.
fn batch_elements(bytes: Vec<u8>) -> Vec<Vec<u8>> {
    // Only a line that begins as an array is read again (a message is passed on as it is).
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[')
        && let Ok(elements) = serde_json::from_slice::<Vec<&serde_json::value::RawValue>>(&bytes)
    {
        return elements
            .iter()
            .map(|e| e.get().as_bytes().to_vec())
            .collect();
    }
    vec![bytes]
}

fn json_response(status: StatusCode, headers: HeaderMap, body: Vec<u8>) -> Response {
    // Built as it is sent: one header map (a `(status, headers, body)` response first types
    // the body as octets, then merges a second map over it).
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    let sent = response.headers_mut();
    // Room for what follows: the type, `Content-Length` (axum sets it), any of `headers`.
    sent.reserve(4 + headers.len());
    sent.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if !headers.is_empty() {
        sent.extend(headers);
    }
    response
}

/// `GET /metrics` on the listener (`--metrics listen`): behind the same Host, Origin and token
/// checks as the MCP endpoint.
pub(super) async fn metrics(
    State(listener): State<Arc<Listener>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    if let Err(refusal) = check_access(&listener, &headers, peer) {
        return unwrap_refusal(Err(refusal));
    }
    match crate::metrics::get() {
        Some(m) => (
            [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
            m.encode(),
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// `GET /healthz`, for a load balancer: 200 while this instance takes new sessions, 503 when it
/// is full or shutting down. No token, no session, and nothing in the body but that.
pub(super) async fn health(State(listener): State<Arc<Listener>>) -> Response {
    if let Some(remote) = crate::remote::get()
        && remote.settings().required
        && !remote.ping().await
    {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the shared cache does not answer\n",
        )
            .into_response();
    }
    if listener.sessions.accepting() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "unavailable\n").into_response()
    }
}

pub(super) async fn get(
    State(listener): State<Arc<Listener>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    unwrap_refusal(handle_get(&listener, peer, &headers).await)
}

async fn handle_get(
    listener: &Listener,
    peer: SocketAddr,
    headers: &HeaderMap,
) -> Result<Response, Refusal> {
    let session = checked_session(listener, headers, peer)?;
    if !accepted(headers).1 {
        return Err(refuse(
            StatusCode::NOT_ACCEPTABLE,
            "GET opens an event stream: Accept must include text/event-stream",
        ));
    }
    session.touch();
    let last_event = match headers.get("last-event-id") {
        None => None,
        Some(value) => Some(value.to_str().map_err(|_| {
            refuse(
                StatusCode::BAD_REQUEST,
                "Last-Event-ID is not an event id this proxy sent (those are ASCII: stream-number); open the stream without it",
            )
        })?),
    };
    let (replay, resume) = match last_event {
        None => {
            let (number, rx) = session.open_get();
            (Vec::new(), Resume::Get(number, rx))
        }
        Some(last) => resume(&session, last).await?,
    };
    let mut replay: VecDeque<Bytes> = replay.into();
    let (source, deadline) = match resume {
        Resume::Get(number, rx) => {
            // A client that can resume gets an id on the new stream at once (after what it
            // asked for again): an idle GET stream is then resumed as itself, not from an old id.
            if session.resumable() {
                replay.push_back(priming(number, listener.sessions.options().retry));
            }
            let source = Source::Get(GetStream {
                session,
                number,
                seq: 0,
                rx: Some(rx),
            });
            (source, None)
        }
        Resume::Post(state) => {
            let number = state.number;
            let stop = session.stop_signal(number);
            let guard = StreamGuard {
                session,
                sse: true,
                restore: None,
                state: Some(state),
                not_results: false,
            };
            let deadline = listener
                .sessions
                .options()
                .stream_limit
                .and_then(|limit| tokio::time::Instant::now().checked_add(limit));
            (Source::Post(guard, stop), deadline)
        }
        Resume::Done => (Source::Done, None),
    };
    let writer = Writer {
        replay,
        deadline,
        source,
        keep_alive: None,
        last_sent: tokio::time::Instant::now(),
    };
    Ok(writer.into_body().into_response())
}

/// Resumes the stream of `last`. A stream still being written on another connection (one
/// the proxy has not yet seen go) is taken over: its writer is told to stop and park it.
async fn resume(
    session: &Arc<Session>,
    last: &str,
) -> Result<(super::replay::Replayed, Resume), Refusal> {
    let deadline = tokio::time::Instant::now() + TAKEOVER;
    loop {
        match session.resume(last) {
            Ok(resumed) => {
                tracing::debug!(session = %session.id, replayed = resumed.0.len(), "stream resumed");
                return Ok(resumed);
            }
            Err(ResumeError::Busy)
                if session.resumable() && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            Err(err) => return Err(resume_refusal(err, last)),
        }
    }
}

/// How long a resume waits for the old writer of its stream to let go.
const TAKEOVER: std::time::Duration = std::time::Duration::from_secs(2);

fn resume_refusal(err: ResumeError, last: &str) -> Refusal {
    match err {
        ResumeError::Expired => refuse(
            StatusCode::GONE,
            &format!(
                "the stream of event {last:?} was not resumed within --resume-secs: its requests were cancelled; send them again"
            ),
        ),
        ResumeError::Unknown => refuse(
            StatusCode::BAD_REQUEST,
            &format!(
                "Last-Event-ID {last:?} is not an event this session sent; open the stream without it"
            ),
        ),
        ResumeError::Lost => refuse(
            StatusCode::GONE,
            &format!(
                "the events after {last:?} are no longer held (each session keeps its latest events up to --replay-bytes); they cannot be sent again"
            ),
        ),
        ResumeError::Busy => refuse(
            StatusCode::CONFLICT,
            &format!(
                "the stream of event {last:?} is still open on another connection; close it first"
            ),
        ),
    }
}

pub(super) async fn delete(
    State(listener): State<Arc<Listener>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    unwrap_refusal(handle_delete(&listener, peer, &headers))
}

fn handle_delete(
    listener: &Listener,
    peer: SocketAddr,
    headers: &HeaderMap,
) -> Result<Response, Refusal> {
    let session = checked_session(listener, headers, peer)?;
    tracing::info!(session = %session.id, "session ended by the client");
    listener
        .sessions
        .end(&session, "the client ended the session");
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_modern_answer_gets_the_clients_id_back_in_place() {
        let fresh = Id::numbered("mcp-budget-s", 12);
        let client = Id::from_json_text("7");
        let answer = br#"{"jsonrpc":"2.0","id":"mcp-budget-s12","result":{"id":"mcp-budget-s12"}}"#;
        assert_eq!(
            restore_id(answer.to_vec(), &fresh, &client)
                .as_deref()
                .map_err(Vec::as_slice),
            Ok(br#"{"jsonrpc":"2.0","id":7,"result":{"id":"mcp-budget-s12"}}"#.as_slice())
        );
        // Found only nested (the envelope's id is elsewhere): given back for a full read.
        let nested = br#"{"result":{"id":"mcp-budget-s12"},"id":"mcp-budget-s12"}"#;
        assert_eq!(
            restore_id(nested.to_vec(), &fresh, &client)
                .as_deref()
                .map_err(Vec::as_slice),
            Err(nested.as_slice())
        );
        let longer = Id::from_json_text(r#""a client's much longer id, with spaces""#);
        let restored = restore_id(answer.to_vec(), &fresh, &longer).unwrap_or_default();
        assert!(restored.starts_with(
            br#"{"jsonrpc":"2.0","id":"a client's much longer id, with spaces","result""#
        ));
    }
}
