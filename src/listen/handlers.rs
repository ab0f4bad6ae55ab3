//! The HTTP handlers of the listener: who is asking, then what they sent.
//!
//! Every request is checked in this order, each step before anything costlier: the `Host`
//! header (DNS rebinding), `Origin`, the bearer token, `Accept` and `Content-Type`, the session
//! (its id, its protocol version, the credential it is bound to), the declared body size; only
//! then is the body read, under the size limit and the body timeout.

use std::collections::{HashSet, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use url::Url;

use crate::framing::Frame;
use crate::jsonrpc;
use crate::message::{self, Id, Kind};

use super::session::{
    Client, OpenError, Outbound, PostState, PostStream, Resume, ResumeError, Session, Sessions,
    StreamRx, event_id,
};

use crate::era::headers::{
    METHOD as METHOD_HEADER, NAME as NAME_HEADER, SESSION as SESSION_HEADER,
    VERSION as VERSION_HEADER,
};
/// Protocol versions whose `MCP-Protocol-Version` header is accepted.
const KNOWN_VERSIONS: [&str; 5] = [
    "2024-11-05",
    "2025-03-26",
    "2025-06-18",
    "2025-11-25",
    "2026-07-28",
];

/// What the handlers share.
pub(super) struct Listener {
    sessions: Arc<Sessions>,
    /// Room for large request bodies, in KiB (`--max-body-bytes-in-flight`).
    bodies: Arc<tokio::sync::Semaphore>,
    /// Hosts accepted in the `Host` header (lowercase, without port).
    hosts: HashSet<String>,
    /// Each client's request budget (`--rate-limit`).
    buckets: std::sync::Mutex<std::collections::HashMap<Client, Bucket>>,
}

/// A token bucket: `tokens` at `at`, refilled at the rate limit, up to twice it.
struct Bucket {
    tokens: f64,
    at: std::time::Instant,
}

/// At most this many clients' buckets are kept; full ones are dropped first.
const MAX_BUCKETS: usize = 10_000;

impl Listener {
    /// Takes one request from `client`'s budget; `Err(seconds)` until one is there.
    fn admit(&self, client: &Client) -> Result<(), u64> {
        let rate = self.sessions.options().rate_limit;
        if rate <= 0.0 {
            return Ok(());
        }
        let burst = 2.0 * rate;
        let now = std::time::Instant::now();
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(client) {
            // A full bucket holds nothing a new one would not: drop those.
            buckets.retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() * rate < burst);
            if buckets.len() >= MAX_BUCKETS {
                return Err(1);
            }
        }
        let bucket = buckets.entry(client.clone()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        bucket.tokens =
            (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * rate).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        Err(((1.0 - bucket.tokens) / rate).ceil().max(1.0) as u64)
    }
}

impl Listener {
    pub fn new(sessions: Arc<Sessions>, local: SocketAddr) -> Listener {
        let hosts = super::guard::allowed_hosts(local.ip(), &sessions.options().allow_hosts);
        let room = (sessions.options().max_body_bytes_in_flight / 1024)
            .clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        Listener {
            bodies: Arc::new(tokio::sync::Semaphore::new(room)),
            sessions,
            hosts,
            buckets: Default::default(),
        }
    }
}

/// An HTTP refusal (boxed: a `Response` is large for an `Err`).
type Refusal = Box<Response>;

fn refuse(status: StatusCode, message: &str) -> Refusal {
    let body = jsonrpc::error_response(None, jsonrpc::INVALID_REQUEST, message, None);
    Box::new((status, [(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// An HTTP refusal with a JSON-RPC error for the request `id` (echoed as the client wrote it).
fn rpc_refusal(
    status: StatusCode,
    id: Option<&Id>,
    code: i64,
    message: &str,
    data: Option<&serde_json::Value>,
) -> Refusal {
    let body = jsonrpc::error_response(id, code, message, data);
    Box::new((status, [(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// The checks of a modern (2026-07-28) request: its `_meta` names a version the proxy serves
/// and its capabilities, and its headers match its body (`MCP-Protocol-Version`, `Mcp-Method`,
/// `Mcp-Name`, plain or in the base64 form).
fn check_modern(
    seen: &ModernHeaders<'_>,
    id: &Id,
    method: &str,
    modern: Option<&message::Modern>,
) -> Result<(), Refusal> {
    let refuse = |code: i64, message: &str, data: Option<&serde_json::Value>| {
        tracing::debug!(
            id = id.raw(),
            method,
            code,
            message,
            "modern request refused"
        );
        rpc_refusal(StatusCode::BAD_REQUEST, Some(id), code, message, data)
    };
    let Some(modern) = modern else {
        return Err(refuse(
            jsonrpc::INVALID_PARAMS,
            &format!(
                "Invalid params: a 2026-07-28 request carries params._meta[\"{}\"] and [\"{}\"]; send them, or send initialize first for an earlier revision",
                message::META_VERSION,
                message::META_CLIENT_CAPABILITIES
            ),
            None,
        ));
    };
    if !modern.capabilities {
        return Err(refuse(
            jsonrpc::INVALID_PARAMS,
            &format!(
                "Invalid params: params._meta[\"{}\"] is missing; a 2026-07-28 request declares its capabilities (an empty object for none)",
                message::META_CLIENT_CAPABILITIES
            ),
            None,
        ));
    }
    let mismatch = |header: &str, expected: &str, got: Option<&str>| {
        let message = match got {
            None => format!(
                "Header mismatch: the {header} header is missing; send {header}: {}",
                crate::era::header_value(expected)
            ),
            Some(got) => format!(
                "Header mismatch: {header} is {got:?} but the body says {expected:?}; send the header the body implies"
            ),
        };
        refuse(jsonrpc::HEADER_MISMATCH, &message, None)
    };
    let version = seen.version.text();
    if version != Some(&*modern.version) {
        return Err(mismatch("MCP-Protocol-Version", &modern.version, version));
    }
    if !crate::era::is_modern(&modern.version) {
        let data = serde_json::json!({
            "supported": [crate::message::MODERN],
            "requested": modern.version,
        });
        return Err(refuse(
            jsonrpc::UNSUPPORTED_VERSION,
            &format!(
                "Unsupported protocol version {:?}: without a session this proxy serves {}; earlier revisions send initialize first",
                modern.version,
                crate::message::MODERN
            ),
            Some(&data),
        ));
    }
    let sent_method = seen.method.text();
    if !sent_method.is_some_and(|sent| crate::era::header_says(sent, method)) {
        return Err(mismatch("Mcp-Method", method, sent_method));
    }
    if crate::message::name_member(method).is_some() {
        let sent_name = seen.name.text();
        let expected = modern.named.as_deref().unwrap_or_default();
        if !sent_name.is_some_and(|sent| crate::era::header_says(sent, expected)) {
            return Err(mismatch("Mcp-Name", expected, sent_name));
        }
    }
    Ok(())
}

/// The headers a modern request is checked by, found in one pass over the request's.
#[derive(Default)]
struct ModernHeaders<'a> {
    version: Seen<'a>,
    method: Seen<'a>,
    name: Seen<'a>,
    /// Some `Mcp-Param-*` header is there.
    params: bool,
}

/// A header, as often as it was sent.
#[derive(Default)]
enum Seen<'a> {
    #[default]
    Not,
    Once(&'a HeaderValue),
    More,
}

impl<'a> Seen<'a> {
    fn add(&mut self, value: &'a HeaderValue) {
        *self = match self {
            Seen::Not => Seen::Once(value),
            _ => Seen::More,
        };
    }

    /// Its text; a header sent twice says two things, so neither is taken.
    fn text(&self) -> Option<&'a str> {
        match self {
            Seen::Not => None,
            Seen::Once(value) => value.to_str().ok(),
            Seen::More => Some("(sent more than once)"),
        }
    }
}

impl<'a> ModernHeaders<'a> {
    fn of(headers: &'a HeaderMap) -> ModernHeaders<'a> {
        let mut seen = ModernHeaders::default();
        for (name, value) in headers {
            if *name == VERSION_HEADER {
                seen.version.add(value);
            } else if *name == METHOD_HEADER {
                seen.method.add(value);
            } else if *name == NAME_HEADER {
                seen.name.add(value);
            } else if name.as_str().starts_with("mcp-param-") {
                seen.params = true;
            }
        }
        seen
    }
}

/// The `Mcp-Param-*` headers of a modern request: each one readable (its base64 form too),
/// and for a `tools/call`, one for each argument the tool's descriptor marks with
/// `x-mcp-header`, carrying the argument's value (-32020 otherwise).
fn check_params(
    headers: &HeaderMap,
    seen: &ModernHeaders<'_>,
    id: &Id,
    session: &Session,
    method: &str,
    tool: Option<&str>,
    body: &[u8],
) -> Result<(), Refusal> {
    let mismatch = |message: String| {
        tracing::debug!(id = id.raw(), %message, "modern request refused");
        rpc_refusal(
            StatusCode::BAD_REQUEST,
            Some(id),
            jsonrpc::HEADER_MISMATCH,
            &message,
            None,
        )
    };
    // (Most requests have none: the headers are not read again for them.)
    if seen.params {
        for (name, value) in headers {
            if name.as_str().starts_with("mcp-param-")
                && value
                    .to_str()
                    .ok()
                    .and_then(crate::era::header_text)
                    .is_none()
            {
                return Err(mismatch(format!(
                    "Header mismatch: {name} is not a header value the revision allows (visible ASCII, or =?base64?…?= around valid Base64 of UTF-8 text)"
                )));
            }
        }
    }
    if method != "tools/call" {
        return Ok(());
    }
    let tool = tool.unwrap_or_default();
    let annotated = session.relay.interceptor().param_headers(tool);
    if annotated.is_empty() {
        return Ok(());
    }
    for (header, value) in crate::era::param_values(body, &annotated) {
        let name = format!("mcp-param-{}", header.to_ascii_lowercase());
        let sent: Vec<&HeaderValue> = headers.get_all(name.as_str()).iter().collect();
        let sent = match sent.as_slice() {
            [] => None,
            [one] => one.to_str().ok().and_then(crate::era::header_text),
            _ => {
                return Err(mismatch(format!(
                    "Header mismatch: Mcp-Param-{header} is sent twice"
                )));
            }
        };
        if sent != value {
            return Err(mismatch(match value {
                Some(value) => format!(
                    "Header mismatch: Mcp-Param-{header} must carry the {tool} argument's value {value:?} (its descriptor marks it with x-mcp-header)"
                ),
                None => format!(
                    "Header mismatch: Mcp-Param-{header} is sent but the call gives no value for the argument it carries"
                ),
            }));
        }
    }
    Ok(())
}

fn header_str(headers: &HeaderMap, name: impl header::AsHeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn origin_allowed(origin: &str, extra: &[String]) -> bool {
    if extra
        .iter()
        .any(|o| o.trim_end_matches('/') == origin.trim_end_matches('/'))
    {
        return true;
    }
    let Ok(url) = Url::parse(origin) else {
        return false;
    };
    matches!(url.scheme(), "http" | "https")
        && matches!(url.host_str(), Some("localhost" | "127.0.0.1" | "[::1]"))
}

/// Host, Origin and token checks, common to every method; who is asking.
fn check_access(
    listener: &Listener,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Result<Client, Refusal> {
    if let Err((status, message)) = super::guard::check_host(&listener.hosts, headers) {
        return Err(refuse(status, &message));
    }
    let options = listener.sessions.options();
    if let Some(origin) = header_str(headers, header::ORIGIN)
        && !origin_allowed(origin, &options.allow_origins)
    {
        tracing::warn!(%origin, "request refused: Origin not allowed");
        return Err(refuse(
            StatusCode::FORBIDDEN,
            &format!("Origin {origin:?} is not allowed; allow it with --allow-origin"),
        ));
    }
    if options.auth_tokens.is_empty() {
        return Ok(Client::Address(peer.ip()));
    }
    // The scheme is case-insensitive (RFC 7235 §2.1).
    let given = header_str(headers, header::AUTHORIZATION)
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    let matched = given.and_then(|given| {
        options
            .auth_tokens
            .iter()
            .find(|token| constant_time_eq(given.as_bytes(), token.as_bytes()))
    });
    match matched {
        Some(token) => Ok(Client::by_token(token)),
        None => {
            let mut response = refuse(
                StatusCode::UNAUTHORIZED,
                "missing or wrong bearer token (Authorization: Bearer <token>)",
            );
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"mcp-budget\""),
            );
            Err(response)
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The session named by the request, checked: its protocol version, and that the same
/// credential that opened it is asking.
fn find_session(
    listener: &Listener,
    headers: &HeaderMap,
    client: &Client,
) -> Result<Arc<Session>, Refusal> {
    let Some(id) = header_str(headers, SESSION_HEADER) else {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "missing Mcp-Session-Id header: send initialize first, then the session id it returned",
        ));
    };
    let Some(session) = listener
        .sessions
        .get(id)
        .filter(|session| !session.is_stateless())
    else {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            "unknown or ended session: initialize a new one",
        ));
    };
    if matches!(client, Client::Token(_)) && session.client != *client {
        tracing::warn!(session = %session.id, "request refused: the session belongs to another credential");
        return Err(refuse(
            StatusCode::FORBIDDEN,
            "this session was opened with another credential: use the token that initialized it",
        ));
    }
    check_version(&session, headers)?;
    Ok(session)
}

/// Takes one request from `client`'s `--rate-limit` budget: every POST, GET and DELETE of
/// the MCP endpoint counts; past it, 429 with `Retry-After`.
fn rate_limit(listener: &Listener, client: &Client) -> Result<(), Refusal> {
    let Err(seconds) = listener.admit(client) else {
        return Ok(());
    };
    tracing::warn!(?client, "request refused: over --rate-limit");
    let mut response = refuse(
        StatusCode::TOO_MANY_REQUESTS,
        &format!(
            "too many requests from this client (at most {} a second, --rate-limit); retry after {seconds} s",
            listener.sessions.options().rate_limit
        ),
    );
    if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    Err(response)
}

/// Access checks, then the session the request names (GET and DELETE). A 2026-07-28 client
/// has neither: 405, as that revision says.
fn checked_session(
    listener: &Listener,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Result<Arc<Session>, Refusal> {
    let client = check_access(listener, headers, peer)?;
    rate_limit(listener, &client)?;
    if header_str(headers, SESSION_HEADER).is_none()
        && header_str(headers, VERSION_HEADER).is_some_and(crate::era::is_modern)
    {
        let mut response = refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            "2026-07-28 has no GET stream and no session to delete: send requests with POST (subscriptions/listen for notifications)",
        );
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return Err(response);
    }
    find_session(listener, headers, &client)
}

fn check_version(session: &Session, headers: &HeaderMap) -> Result<(), Refusal> {
    let Some(version) = header_str(headers, VERSION_HEADER) else {
        return Ok(()); // absent: the spec says assume 2025-03-26
    };
    if !KNOWN_VERSIONS.contains(&version) {
        let negotiated = session
            .protocol()
            .map(|n| format!("; this session negotiated {n:?}"))
            .unwrap_or_default();
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            &format!(
                "unsupported MCP-Protocol-Version {version:?}{negotiated}; supported: {}",
                KNOWN_VERSIONS.join(", ")
            ),
        ));
    }
    Ok(())
}

/// What a request's `Accept` takes, read once: (JSON, an event stream); without one, both.
fn accepted(headers: &HeaderMap) -> (bool, bool) {
    let Some(accept) = header_str(headers, header::ACCEPT) else {
        return (true, true);
    };
    // (The searchers are made once: a request's header is short, and searched three times.)
    let accept = accept.as_bytes();
    let any = crate::holds!(accept, b"*/*");
    (
        any || crate::holds!(accept, b"application/json"),
        any || crate::holds!(accept, b"text/event-stream"),
    )
}

/// `Content-Type`, when given, must be JSON (every one of them, if several are sent).
fn check_content_type(headers: &HeaderMap) -> Result<(), Refusal> {
    for value in headers.get_all(header::CONTENT_TYPE) {
        let essence = value
            .to_str()
            .unwrap_or_default()
            .split(';')
            .next()
            .unwrap_or_default()
            .trim();
        if !essence.eq_ignore_ascii_case("application/json") {
            let essence = essence.to_ascii_lowercase();
            return Err(refuse(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                &format!("Content-Type {essence:?} is not accepted: send application/json"),
            ));
        }
    }
    Ok(())
}

/// Why a body could not be read: no room for it, or the body itself.
enum Readable {
    Room(Refusal),
    Body(Box<dyn std::error::Error + Send + Sync>),
}

impl From<Box<dyn std::error::Error + Send + Sync>> for Readable {
    fn from(err: Box<dyn std::error::Error + Send + Sync>) -> Readable {
        Readable::Body(err)
    }
}

/// Bodies under this size take no room of `--max-body-bytes-in-flight`.
const SMALL_BODY: usize = 64 * 1024;
/// How long a large body waits for room before it is refused.
const BODY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Room for a body of `bytes` among the bodies in flight: `None` for a small one; an error
/// (503, Retry-After) when none comes within [`BODY_WAIT`].
async fn body_room(
    listener: &Listener,
    bytes: usize,
) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, Refusal> {
    if bytes < SMALL_BODY {
        return Ok(None);
    }
    let kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
    let acquire = listener.bodies.clone().acquire_many_owned(kib);
    match tokio::time::timeout(BODY_WAIT, acquire).await {
        Ok(Ok(permit)) => Ok(Some(permit)),
        _ => {
            let limit = listener.sessions.options().max_body_bytes_in_flight;
            tracing::warn!(
                bytes,
                limit,
                "request body refused: the listener holds as many large bodies as --max-body-bytes-in-flight allows"
            );
            let mut response = refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "the proxy is reading as many large request bodies as it holds at once ({limit} bytes, --max-body-bytes-in-flight); retry in a moment"
                ),
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            Err(response)
        }
    }
}

/// Reads the body under the message size limit and the body timeout, with room for it among
/// the bodies in flight (kept by the caller until the message has been passed on).
async fn read_body(
    listener: &Listener,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Vec<u8>, Option<tokio::sync::OwnedSemaphorePermit>), Refusal> {
    let options = listener.sessions.options();
    let limit = options.session.max_message_bytes;
    let too_large = || {
        refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!(
                "the message is over the proxy's message size limit of {limit} bytes (raise it with --max-message-bytes)"
            ),
        )
    };
    let declared = header_str(headers, header::CONTENT_LENGTH).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    // Room for what the body says it is; one without a length is read in room for the limit
    // only once it grows past a small body.
    let mut room = body_room(listener, declared.map_or(0, |n| n as usize)).await?;
    let read = async {
        use http_body_util::BodyExt;
        let mut body = http_body_util::Limited::new(body, limit);
        let mut bytes: Vec<u8> = Vec::with_capacity(declared.map_or(0, |n| n as usize));
        while let Some(frame) = body.frame().await {
            let frame = frame?;
            if let Ok(data) = frame.into_data() {
                bytes.extend_from_slice(&data);
                if room.is_none() && declared.is_none() && bytes.len() >= SMALL_BODY {
                    room = body_room(listener, limit).await.map_err(Readable::Room)?;
                }
            }
        }
        Ok::<_, Readable>(bytes)
    };
    match tokio::time::timeout(options.body_timeout, read).await {
        Ok(Ok(bytes)) => Ok((bytes, room)),
        Ok(Err(Readable::Room(refusal))) => Err(refusal),
        Ok(Err(Readable::Body(err))) => {
            let over = err.is::<http_body_util::LengthLimitError>();
            if over {
                Err(too_large())
            } else {
                Err(refuse(
                    StatusCode::BAD_REQUEST,
                    &format!("the request body could not be read: {err}"),
                ))
            }
        }
        Err(_) => Err(refuse(
            StatusCode::REQUEST_TIMEOUT,
            &format!(
                "the request body did not arrive within {} s",
                options.body_timeout.as_secs()
            ),
        )),
    }
}

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
    let parsed = match message::parse_from_client(&body) {
        Ok(parsed) => parsed,
        Err(err) => {
            let body = jsonrpc::error_response(
                None,
                jsonrpc::PARSE_ERROR,
                &format!("Parse error: {err}"),
                None,
            );
            return Ok(json_response(
                StatusCode::BAD_REQUEST,
                HeaderMap::new(),
                body,
            ));
        }
    };
    if parsed.is_invalid() {
        let body = jsonrpc::error_response(
            None,
            jsonrpc::INVALID_REQUEST,
            "Invalid Request: a JSON-RPC message is an object (or a non-empty batch of objects)",
            None,
        );
        return Ok(json_response(
            StatusCode::BAD_REQUEST,
            HeaderMap::new(),
            body,
        ));
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
    let stateless = existing.is_none()
        && (header_version.is_some_and(crate::era::is_modern)
            || (initialize.is_none() && any_modern));
    // A forced client era (`--client-era`) refuses the other era before any session opens.
    if existing.is_none()
        && let Some(forced) = listener.sessions.options().session.client_era.forced()
    {
        for kind in parsed.kinds() {
            if let Kind::Request {
                id,
                method,
                modern: meta,
                ..
            } = kind
                && let Some((code, message, data)) = crate::bridge::refused_by_client_era(
                    forced,
                    method,
                    meta.is_some() || stateless,
                    &body,
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
        if forced == crate::bridge::Era::Legacy && stateless {
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
    // A modern request goes upstream under an id of the proxy's, and its answer comes back
    // under the client's own.
    let mut restore: Option<(Id, Id)> = None;
    // Or it goes under its own, held for this POST.
    let mut claim: Option<super::session::Claim> = None;
    let (session, opened, body, parsed) = match (existing, &initialize) {
        (Some(session), _) => (session, false, body, parsed),
        (None, Some(init)) if !stateless => {
            let session = listener.sessions.open(client).await.map_err(open_refusal)?;
            session.set_initialize_key(init.key());
            (session, true, body, parsed)
        }
        (None, _) if stateless => {
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
                        claim = Some(held);
                        ids = vec![id.clone()];
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
                        ids = vec![fresh.clone()];
                        restore = Some((fresh.clone(), id.clone()));
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
            return Err(match header_version {
                // A client of an earlier revision that lost its session.
                Some(version) if KNOWN_VERSIONS.contains(&version) => rpc_refusal(
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
    session.touch();
    if !sse {
        tokens.clear();
    }
    crate::session::prefetch(&session.relay, &body).await;
    let post = match claim.as_mut().and_then(super::session::Claim::take_post) {
        Some(post) => post,
        None => session.open_post(),
    };
    let mut routed = session
        .relay
        .from_client(Frame::Read { line: body, parsed });
    // (A rule chain automatic paging took over is cut on the way in.)
    crate::session::flush(&session.relay).await;
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
    let mut guard = StreamGuard {
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
        message.held = crate::upstream::Held(room.take().map(std::sync::Arc::new));
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

/// `answer` under the client's id, where its envelope (the members before any nested value)
/// says `"id":` and the proxy's `fresh` one: one search, no parse. The answer back when not
/// found so (the caller then reads the message for its id).
fn restore_id(mut answer: Vec<u8>, fresh: &Id, client: &Id) -> Result<Vec<u8>, Vec<u8>> {
    match id_at(&answer, fresh) {
        Some(at) => {
            // In place: the bytes after the id move (no second buffer; a longer id may grow it).
            answer.splice(at..at + fresh.raw().len(), client.raw().bytes());
            Ok(answer)
        }
        None => Err(answer),
    }
}

/// Where `fresh` is in `answer` as its envelope's id.
fn id_at(answer: &[u8], fresh: &Id) -> Option<usize> {
    // The id comes first, or near it (`{"jsonrpc":"2.0","id":…`): looked for there by hand
    // (a searcher costs more to build than this short look), then anywhere.
    let needle = fresh.raw().as_bytes();
    if needle.is_empty() {
        return None;
    }
    let head = &answer[..answer.len().min(64 + needle.len())];
    let at = match memchr::memchr_iter(needle[0], head).find(|&at| head[at..].starts_with(needle)) {
        Some(at) => at,
        None => memchr::memmem::find(answer, needle)?,
    };
    let before = answer[..at]
        .trim_ascii_end()
        .strip_suffix(b":")?
        .trim_ascii_end();
    let envelope = before.strip_suffix(b"\"id\"")?;
    // Nothing nested comes first: only the object's own opening brace.
    if envelope.iter().filter(|b| matches!(b, b'{' | b'[')).count() != 1 {
        return None;
    }
    Some(at)
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

/// One POST's stream: its queue and the proxy's own answers, until its requests are answered.
/// Dropped — answered, or the client went away — it gives the stream up (what was queued for
/// it goes to another stream, what it left unanswered is cancelled upstream); an SSE stream
/// cut before its answers is parked instead when the client can resume it.
struct StreamGuard {
    session: Arc<Session>,
    sse: bool,
    /// A modern request's id upstream, and the client's: its answer is given the client's.
    restore: Option<(Id, Id)>,
    /// `None` once given up or parked.
    state: Option<PostState>,
    /// Something other than a result was taken from the stream (an error, say): what the
    /// HTTP status of a modern answer depends on.
    not_results: bool,
}

impl StreamGuard {
    /// The next message for this POST; `None` once every request of it is answered.
    async fn next(&mut self) -> Option<Vec<u8>> {
        let state = self.state.as_mut()?;
        if state.awaiting.is_empty() {
            return None;
        }
        let message = match state.own.pop_front() {
            Some(message) => message,
            None => {
                self.session.pull_backlog();
                state.rx.recv().await?
            }
        };
        message.response_keys(|key| {
            state.awaiting.remove(key);
        });
        self.not_results |= !matches!(
            message.kind,
            Some(Kind::Response {
                result: Some(_),
                ..
            })
        );
        if let Some((fresh, client)) = &self.restore {
            match &message.kind {
                Some(Kind::Response { id: Some(id), .. }) if id.key() == fresh.key() => {
                    return Some(match restore_id(message.bytes, fresh, client) {
                        Ok(restored) => restored,
                        Err(bytes) => message::with_id(&bytes, client.raw()).unwrap_or(bytes),
                    });
                }
                // A subscription's notifications name it by the client's id.
                Some(Kind::Notification { .. })
                    if message::subscription_id(&message.bytes)
                        .is_some_and(|id| id.key() == fresh.key()) =>
                {
                    return Some(
                        message::with_subscription_id(&message.bytes, client.raw())
                            .unwrap_or(message.bytes),
                    );
                }
                _ => {}
            }
        }
        Some(message.bytes)
    }

    /// The event that sends `bytes` on this stream, numbered and kept for a resume.
    fn event(&mut self, bytes: &[u8]) -> Bytes {
        let Some(state) = self.state.as_mut() else {
            return sse_event(None, None, bytes);
        };
        state.seq += 1;
        let event = sse_event(Some(&event_id(state.number, state.seq)), None, bytes);
        self.session.log(state.number, state.seq, event.clone());
        event
    }

    fn number(&self) -> u64 {
        self.state.as_ref().map_or(0, |s| s.number)
    }

    /// Whether every request of this POST is answered.
    fn answered(&self) -> bool {
        self.state.as_ref().is_none_or(|s| s.awaiting.is_empty())
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let Some(state) = self.state.take() else {
            return;
        };
        if self.sse
            && !state.awaiting.is_empty()
            && !self.session.is_ended()
            && self.session.resumable()
        {
            self.session.park(state);
        } else {
            self.session.abandon_post(state);
        }
    }
}

/// Where an SSE response's live events come from, after its replayed ones.
enum Source {
    /// A POST's stream, and what tells its writer to stop (a resume elsewhere takes it over).
    Post(StreamGuard, Arc<tokio::sync::Notify>),
    Get(GetStream),
    Done,
}

/// A GET stream's writer. Dropped — the client went away, or a newer GET stream replaced it —
/// it passes on what was queued for it but not sent (to the newer stream, or to wait).
struct GetStream {
    session: Arc<Session>,
    number: u64,
    seq: u64,
    rx: Option<StreamRx>,
}

impl GetStream {
    async fn next(&mut self) -> Option<Bytes> {
        self.session.pull_backlog();
        let message = self.rx.as_mut()?.recv().await?;
        let seq = self.seq + 1;
        let event = sse_event(Some(&event_id(self.number, seq)), None, &message.bytes);
        if !self.session.log_get(self.number, seq, &event) {
            // Replaced: this message, and the rest, go to the stream that replaced it.
            self.session.route_now(message.bytes, message.kind);
            return None;
        }
        self.seq = seq;
        Some(event)
    }
}

impl Drop for GetStream {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            while let Some(message) = rx.try_recv() {
                self.session.route_now(message.bytes, message.kind);
            }
        }
    }
}

/// One SSE response: the events to send first (a priming event, or those asked for again),
/// then the live ones.
struct Writer {
    /// Events to send before the live ones, as they are written: a priming event, or those
    /// sent before and asked for again (`Last-Event-ID`).
    replay: VecDeque<Bytes>,
    /// When a POST stream is ended for the client to resume it (SSE polling).
    deadline: Option<tokio::time::Instant>,
    source: Source,
    /// Sends a comment when the stream has been idle for [`KEEP_ALIVE`].
    keep_alive: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// When the last event went out.
    last_sent: tokio::time::Instant,
}

/// The first event of stream `number` for a client that can resume: an id to resume from, how
/// long to wait before it does, and empty data.
fn priming(number: u64, retry: std::time::Duration) -> Bytes {
    sse_event(Some(&event_id(number, 0)), Some(retry), b"")
}

/// An idle event stream sends a comment this often, so that nothing between drops it.
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(15);

/// One SSE event: its id, its `retry`, and its data (`data:` lines, one per line of `bytes`;
/// empty data is one empty `data:` line, so the event is still dispatched).
fn sse_event(id: Option<&str>, retry: Option<std::time::Duration>, bytes: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(bytes.len() + 48);
    if let Some(id) = id {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(id.as_bytes());
        out.push(b'\n');
    }
    if let Some(retry) = retry {
        out.extend_from_slice(format!("retry: {}\n", retry.as_millis()).as_bytes());
    }
    // A line ends at CRLF, LF or CR (a message read from an HTTP upstream may be pretty-printed).
    let mut rest = bytes;
    loop {
        out.extend_from_slice(b"data: ");
        match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            Some(end) => {
                out.extend_from_slice(&rest[..end]);
                out.push(b'\n');
                let skip = if rest[end] == b'\r' && rest.get(end + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                rest = &rest[end + skip..];
            }
            None => {
                out.extend_from_slice(rest);
                out.push(b'\n');
                break;
            }
        }
    }
    out.push(b'\n');
    Bytes::from(out)
}

impl Writer {
    /// The next event; `None` once the stream ends.
    async fn next(&mut self) -> Option<Bytes> {
        if let Some(event) = self.replay.pop_front() {
            return Some(event);
        }
        // One timer for the stream's keep-alive. An event only notes when it was sent; the
        // timer, when it fires, sends a comment if the stream has been idle that long, else
        // waits for the rest (no timer work per event).
        let keep_alive = self
            .keep_alive
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(KEEP_ALIVE)));
        loop {
            // What `live` waits on is cancel-safe: a keep-alive loses nothing.
            tokio::select! {
                event = live(&mut self.source, self.deadline) => {
                    self.last_sent = tokio::time::Instant::now();
                    return event;
                }
                () = keep_alive.as_mut() => {
                    let now = tokio::time::Instant::now();
                    let due = self.last_sent + KEEP_ALIVE;
                    if now >= due {
                        self.last_sent = now;
                        keep_alive.as_mut().reset(now + KEEP_ALIVE);
                        return Some(Bytes::from_static(b":\n\n"));
                    }
                    keep_alive.as_mut().reset(due);
                }
            }
        }
    }
}

impl Writer {
    /// The response: an event stream that ends with the writer.
    fn into_body(self) -> Response {
        let events = futures_util::stream::unfold(self, |mut writer| async move {
            let event = writer.next().await?;
            Some((Ok::<_, Infallible>(event), writer))
        });
        (
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            Body::from_stream(events),
        )
            .into_response()
    }
}

/// The next live event of `source`.
async fn live(source: &mut Source, deadline: Option<tokio::time::Instant>) -> Option<Bytes> {
    match source {
        Source::Post(guard, stop) => {
            let until_deadline = async {
                match deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            let bytes = tokio::select! {
                bytes = guard.next() => bytes?,
                () = until_deadline => {
                    tracing::debug!(session = %guard.session.id, stream = guard.number(), "ending a long POST stream for the client to resume");
                    return None;
                }
                () = stop.notified() => {
                    tracing::debug!(session = %guard.session.id, stream = guard.number(), "the stream is resumed on another connection");
                    return None;
                }
            };
            Some(guard.event(&bytes))
        }
        Source::Get(get) => get.next().await,
        Source::Done => None,
    }
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
) -> Result<(super::session::Replayed, Resume), Refusal> {
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
