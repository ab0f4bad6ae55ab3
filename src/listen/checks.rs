//! Who is asking, and whether the request may be read: the listener's shared state, its
//! rate limit, and the Host, Origin, token, session, version, `Accept` and `Content-Type`
//! checks, each with the refusal that names its fix.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use url::Url;

use crate::wire::jsonrpc;
use crate::wire::message::{self, Id};

use super::session::{Client, Session};
use super::sessions::Sessions;

use crate::era::headers::{
    METHOD as METHOD_HEADER, NAME as NAME_HEADER, SESSION as SESSION_HEADER,
    VERSION as VERSION_HEADER,
};

/// What the handlers share.
pub(super) struct Listener {
    pub(super) sessions: Arc<Sessions>,
    /// Room for large request bodies, in KiB (`--max-body-bytes-in-flight`).
    pub(super) bodies: Arc<tokio::sync::Semaphore>,
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
pub(super) type Refusal = Box<Response>;

pub(super) fn refuse(status: StatusCode, message: &str) -> Refusal {
    let body = jsonrpc::error_response(None, jsonrpc::INVALID_REQUEST, message, None);
    Box::new((status, [(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// An HTTP refusal with a JSON-RPC error for the request `id` (echoed as the client wrote it).
pub(super) fn rpc_refusal(
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
pub(super) fn check_modern(
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
            "supported": [crate::protocol::MODERN],
            "requested": modern.version,
        });
        return Err(refuse(
            jsonrpc::UNSUPPORTED_VERSION,
            &format!(
                "Unsupported protocol version {:?}: without a session this proxy serves {}; earlier revisions send initialize first",
                modern.version,
                crate::protocol::MODERN
            ),
            Some(&data),
        ));
    }
    let sent_method = seen.method.text();
    if !sent_method.is_some_and(|sent| crate::era::header_says(sent, method)) {
        return Err(mismatch("Mcp-Method", method, sent_method));
    }
    if crate::protocol::name_member(method).is_some() {
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
pub(super) struct ModernHeaders<'a> {
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
    pub(super) fn of(headers: &'a HeaderMap) -> ModernHeaders<'a> {
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
pub(super) fn check_params(
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

pub(super) fn header_str(headers: &HeaderMap, name: impl header::AsHeaderName) -> Option<&str> {
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
pub(super) fn check_access(
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
pub(super) fn find_session(
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
pub(super) fn rate_limit(listener: &Listener, client: &Client) -> Result<(), Refusal> {
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
pub(super) fn checked_session(
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
    if !crate::protocol::SUPPORTED.contains(&version) {
        let negotiated = session
            .protocol()
            .map(|n| format!("; this session negotiated {n:?}"))
            .unwrap_or_default();
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            &format!(
                "unsupported MCP-Protocol-Version {version:?}{negotiated}; supported: {}",
                // Oldest first, as the revisions are dated.
                crate::protocol::SUPPORTED
                    .iter()
                    .rev()
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    Ok(())
}

/// What a request's `Accept` takes, read once: (JSON, an event stream); without one, both.
pub(super) fn accepted(headers: &HeaderMap) -> (bool, bool) {
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
pub(super) fn check_content_type(headers: &HeaderMap) -> Result<(), Refusal> {
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
