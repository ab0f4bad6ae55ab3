//! Clients over Streamable HTTP: `--listen http://127.0.0.1:PORT/mcp`.
//!
//! Each client session (minted at `initialize`, named by `Mcp-Session-Id`) gets a relay and an
//! upstream of its own. A POST carries one client message; when it holds requests, the answer
//! is an SSE stream that carries the server messages related to them (progress for their
//! progress tokens, and whatever the server sends while they are the newest open stream) and
//! ends with their responses — or plain JSON when the client accepts only that. GET opens the
//! stream for server-initiated messages; DELETE ends the session. Messages with no open stream
//! to go to wait in a bounded backlog for the next stream, so that nothing is dropped silently.
//!
//! Security defaults: loopback only unless the URL says otherwise, `Host` and `Origin`
//! checked against DNS rebinding (403), optional bearer token (401), body limit (413), and a cap
//! on sessions (503). The client's `Authorization` header is never passed upstream: only the
//! message bodies are.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures_util::Stream;
use reqwest::Url;
use tokio::sync::mpsc;

use crate::budget::Budget;
use crate::framing::Frame;
use crate::intercept::Interceptor;
use crate::jsonrpc;
use crate::message::{self, Id, Kind, Parsed};
use crate::relay::Relay;
use crate::stdio::Options;
use crate::upstream::{Event, Stopper, Upstream, UpstreamSpec};

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";
/// Protocol versions whose `MCP-Protocol-Version` header is accepted.
const KNOWN_VERSIONS: [&str; 5] = [
    "2024-11-05",
    "2025-03-26",
    "2025-06-18",
    "2025-11-25",
    "2026-07-28",
];
/// Server messages kept for a client that has no stream open.
const BACKLOG: usize = 1024;

/// How the listener behaves.
#[derive(Debug, Clone)]
pub struct ListenOptions {
    pub url: Url,
    pub allow_hosts: Vec<String>,
    pub allow_origins: Vec<String>,
    pub auth_token: Option<String>,
    pub max_sessions: usize,
    pub idle: Duration,
    pub session: Options,
    /// Records every session's messages (each line names its session).
    pub recorder: Option<crate::record::Recorder>,
}

/// The listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("--listen {0:?}: {1}")]
    Url(String, String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the HTTP server failed: {0}")]
    Serve(#[source] std::io::Error),
}

/// Parses `--listen`: an http URL whose host is an IP address or `localhost`.
pub fn parse_listen_url(text: &str) -> Result<(Url, SocketAddr), ListenError> {
    let bad = |why: &str| ListenError::Url(text.to_string(), why.to_string());
    let url = Url::parse(text).map_err(|e| bad(&format!("{e}; e.g. http://127.0.0.1:8080/mcp")))?;
    if url.scheme() != "http" {
        return Err(bad(
            "only http:// is served (put a TLS proxy in front for https)",
        ));
    }
    let host = match url.host_str() {
        Some("localhost") => "127.0.0.1".to_string(),
        Some(host) => host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        None => return Err(bad("no host; e.g. http://127.0.0.1:8080/mcp")),
    };
    let ip: std::net::IpAddr = host
        .parse()
        .map_err(|_| bad("the host must be an IP address or localhost"))?;
    let port = url.port().unwrap_or(80);
    Ok((url, SocketAddr::new(ip, port)))
}

struct Listener {
    options: ListenOptions,
    spec: UpstreamSpec,
    budget: Arc<Budget>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Hosts accepted in the `Host` header (lowercase, without port).
    hosts: HashSet<String>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Serves clients until `shutdown` completes; then ends every session.
pub async fn serve(
    options: ListenOptions,
    addr: SocketAddr,
    spec: UpstreamSpec,
    budget: Arc<Budget>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ListenError> {
    let tcp = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ListenError::Bind { addr, source })?;
    let local = tcp.local_addr().map_err(ListenError::Serve)?;
    if !local.ip().is_loopback() {
        tracing::warn!(%local, "listening on a non-loopback address: anyone who can reach it can use the server (consider --auth-token-env)");
    }
    let mut url = options.url.clone();
    let _ = url.set_port(Some(local.port()));
    let mut hosts: HashSet<String> = ["localhost", "127.0.0.1", "[::1]", "::1"]
        .iter()
        .map(|h| h.to_string())
        .collect();
    hosts.insert(local.ip().to_string());
    hosts.extend(options.allow_hosts.iter().map(|h| h.to_lowercase()));
    let path = options.url.path().to_string();
    let max_body = options.session.max_message_bytes;
    let listener = Arc::new(Listener {
        options,
        spec,
        budget,
        sessions: Mutex::new(HashMap::new()),
        hosts,
    });
    let reaper = tokio::spawn(reap_idle(listener.clone()));
    let app = Router::new()
        .route(
            &path,
            post(handle_post).get(handle_get).delete(handle_delete),
        )
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(listener.clone());
    println!("listening on {url}");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    tracing::info!(%url, "listening");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopping = listener.clone();
    tokio::spawn(async move {
        shutdown.await;
        // End every session first: that ends their open streams, so the server can stop.
        let sessions: Vec<Arc<Session>> =
            lock(&stopping.sessions).drain().map(|(_, s)| s).collect();
        for session in sessions {
            session.end(
                "the proxy is shutting down",
                stopping.options.session.shutdown_grace,
            );
        }
        let _ = stop_tx.send(true);
    });
    let mut stop_rx2 = stop_rx.clone();
    // Small SSE events must not wait for Nagle's algorithm (a 40 ms stall per event).
    let tcp = axum::serve::ListenerExt::tap_io(tcp, |stream| {
        let _ = stream.set_nodelay(true);
    });
    axum::serve(tcp, app)
        .with_graceful_shutdown(async move {
            let _ = stop_rx2.wait_for(|stopped| *stopped).await;
        })
        .await
        .map_err(ListenError::Serve)?;
    reaper.abort();
    drop(stop_rx);
    // Give the upstreams their grace to stop.
    let grace = listener.options.session.shutdown_grace + Duration::from_secs(3);
    let _ = tokio::time::timeout(grace, async {
        while Arc::strong_count(&listener) > 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    Ok(())
}

async fn reap_idle(listener: Arc<Listener>) {
    let every =
        (listener.options.idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
    loop {
        tokio::time::sleep(every).await;
        let now = Instant::now();
        let idle: Vec<Arc<Session>> = {
            let mut sessions = lock(&listener.sessions);
            let ids: Vec<String> = sessions
                .iter()
                .filter(|(_, s)| {
                    s.relay.in_flight() == 0
                        && now.duration_since(*lock(&s.last_active)) >= listener.options.idle
                })
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter().filter_map(|id| sessions.remove(id)).collect()
        };
        for session in idle {
            tracing::info!(session = %session.id, "session idle; ending it");
            session.end(
                "the session was idle too long and was ended",
                listener.options.session.shutdown_grace,
            );
        }
    }
}

// ---- One client session ---------------------------------------------------------------------

#[derive(Default)]
struct Routes {
    /// Requests waiting for their response: id key → the POST that carried them.
    waiting: HashMap<String, mpsc::Sender<Vec<u8>>>,
    /// Progress tokens (JSON text) → the POST stream of the request that named them.
    progress: HashMap<String, u64>,
    /// Open POST SSE streams, by number (the newest has the highest).
    streams: BTreeMap<u64, mpsc::Sender<Vec<u8>>>,
    get: Option<mpsc::Sender<Vec<u8>>>,
    backlog: VecDeque<Vec<u8>>,
    next_stream: u64,
}

struct Session {
    id: String,
    relay: Relay,
    to_server: mpsc::Sender<Vec<u8>>,
    routes: Mutex<Routes>,
    stopper: Mutex<Stopper>,
    last_active: Mutex<Instant>,
    /// The negotiated protocol version, once the initialize response passed.
    protocol: Mutex<Option<String>>,
    initialize_key: Mutex<Option<String>>,
    ended: AtomicBool,
}

impl Session {
    fn touch(&self) {
        *lock(&self.last_active) = Instant::now();
    }

    /// Sends a server message to the client stream it belongs to, waiting while that stream
    /// is full (a slow client slows its own session, nothing else).
    async fn route(&self, bytes: Vec<u8>) {
        let kind = classify(&bytes);
        self.route_kind(bytes, kind).await;
    }

    /// `route`, for a message whose envelope was already read.
    async fn route_kind(&self, bytes: Vec<u8>, kind: Option<Kind>) {
        let target = self.target(&bytes, kind);
        let bytes = match target {
            Some(tx) => match tx.send(bytes).await {
                Ok(()) => return,
                Err(mpsc::error::SendError(bytes)) => bytes,
            },
            None => bytes,
        };
        self.keep(bytes);
    }

    /// Like `route`, without waiting: a full stream gets the message in the backlog.
    fn route_now(&self, bytes: Vec<u8>) {
        let kind = classify(&bytes);
        let bytes = match self.target(&bytes, kind) {
            Some(tx) => match tx.try_send(bytes) {
                Ok(()) => return,
                Err(
                    mpsc::error::TrySendError::Full(bytes)
                    | mpsc::error::TrySendError::Closed(bytes),
                ) => bytes,
            },
            None => bytes,
        };
        self.keep(bytes);
    }

    /// Keeps a message for the next stream the client opens.
    fn keep(&self, bytes: Vec<u8>) {
        let mut routes = lock(&self.routes);
        if routes.backlog.len() == BACKLOG {
            routes.backlog.pop_front();
            tracing::warn!(session = %self.id, "no client stream open and the backlog is full: the oldest server message was dropped");
        }
        routes.backlog.push_back(bytes);
    }

    /// Where a server message goes: the POST waiting for it, the stream of the request whose
    /// progress it reports, else the GET stream, else the newest POST stream.
    fn target(&self, bytes: &[u8], kind: Option<Kind>) -> Option<mpsc::Sender<Vec<u8>>> {
        if let Some(Kind::Response { id: Some(id) }) = &kind
            && lock(&self.initialize_key).as_deref() == Some(id.key())
        {
            self.remember_protocol(bytes);
        }
        let mut routes = lock(&self.routes);
        let target = match &kind {
            Some(Kind::Response { id: Some(id) }) => routes.waiting.remove(id.key()),
            Some(Kind::Notification { method }) if method == "notifications/progress" => {
                message::progress_token(bytes, "")
                    .and_then(|token| routes.progress.get(&token).copied())
                    .and_then(|n| routes.streams.get(&n).cloned())
            }
            _ => None,
        };
        target
            .or_else(|| routes.get.clone())
            .or_else(|| routes.streams.values().next_back().cloned())
    }

    fn remember_protocol(&self, bytes: &[u8]) {
        if let Some(version) = message::protocol_version(bytes) {
            *lock(&self.protocol) = Some(version);
        }
    }

    /// Ends the session: answers what is in flight, stops the upstream, closes the streams.
    fn end(&self, reason: &str, grace: Duration) {
        if self.ended.swap(true, Ordering::SeqCst) {
            return;
        }
        for error in self.relay.close(reason) {
            self.route_now(error);
        }
        lock(&self.stopper).stop(grace);
        let mut routes = lock(&self.routes);
        routes.waiting.clear();
        routes.streams.clear();
        routes.get = None;
    }
}

/// The progress tokens of the requests in a client message.
fn request_progress_tokens(body: &[u8]) -> Vec<String> {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Vec::new();
    };
    let messages = match value {
        serde_json::Value::Array(list) => list,
        single => vec![single],
    };
    messages
        .iter()
        .filter_map(|m| {
            m.get("params")?
                .get("_meta")?
                .get("progressToken")
                .map(|t| t.to_string())
        })
        .collect()
}

/// Answers a session's timed-out requests and cancels them upstream, until it ends.
async fn sweep_timeouts(session: std::sync::Weak<Session>, timeout: Duration) {
    let mut tick = tokio::time::interval(crate::stdio::sweep_interval(timeout));
    loop {
        tick.tick().await;
        let Some(session) = session.upgrade() else {
            return;
        };
        if session.ended.load(Ordering::SeqCst) {
            return;
        }
        let expired = session.relay.expire(Instant::now());
        for cancel in expired.to_server {
            let _ = session.to_server.send(cancel).await;
        }
        for error in expired.to_client {
            session.route(error).await;
        }
    }
}

/// The envelope a message is routed by (for a batch, its first response).
fn classify(bytes: &[u8]) -> Option<Kind> {
    match message::parse(bytes) {
        Ok(Parsed::Single(kind)) => Some(kind),
        Ok(Parsed::Batch(kinds)) => kinds
            .into_iter()
            .find(|k| matches!(k, Kind::Response { id: Some(_) })),
        Err(_) => None,
    }
}

/// Reads the upstream's messages into the session until it ends.
async fn pump(listener: Arc<Listener>, session: Arc<Session>, mut events: mpsc::Receiver<Event>) {
    while let Some(event) = events.recv().await {
        match event {
            Event::Frame(frame) => {
                if let Some((bytes, kind)) = session.relay.from_server_classified(frame) {
                    session.route_kind(bytes, kind).await;
                }
            }
            Event::Restarting { reason } => {
                let why = format!(
                    "{reason}; mcp-budget is restarting the server: send the request again"
                );
                for error in session.relay.fail_pending(&why) {
                    session.route(error).await;
                }
            }
            Event::Ended { reason, stopped } => {
                if !stopped {
                    tracing::warn!(session = %session.id, %reason, "upstream ended; ending the session");
                    lock(&listener.sessions).remove(&session.id);
                }
                session.end(&reason, Duration::ZERO);
                return;
            }
        }
    }
}

// ---- HTTP handlers --------------------------------------------------------------------------

/// An HTTP refusal (boxed: a `Response` is large for an `Err`).
type Refusal = Box<Response>;

fn refuse(status: StatusCode, message: &str) -> Response {
    let body = jsonrpc::error_response(None, jsonrpc::INVALID_REQUEST, message, None);
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
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

/// Host, Origin and token checks, common to every method.
fn check_access(listener: &Listener, headers: &HeaderMap) -> Result<(), Refusal> {
    let host = header_str(headers, "host")
        .unwrap_or_default()
        .to_lowercase();
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) && !name.is_empty() => name,
        _ => host.as_str(),
    };
    if !listener.hosts.contains(name) && !listener.hosts.contains(&host) {
        tracing::warn!(%host, "request refused: Host not allowed");
        return Err(Box::new(refuse(
            StatusCode::FORBIDDEN,
            &format!(
                "Host {host:?} is not allowed (DNS rebinding protection); allow it with --allow-host"
            ),
        )));
    }
    if let Some(origin) = header_str(headers, "origin")
        && !origin_allowed(origin, &listener.options.allow_origins)
    {
        tracing::warn!(%origin, "request refused: Origin not allowed");
        return Err(Box::new(refuse(
            StatusCode::FORBIDDEN,
            &format!("Origin {origin:?} is not allowed; allow it with --allow-origin"),
        )));
    }
    if let Some(token) = &listener.options.auth_token {
        let given = header_str(headers, "authorization").and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes())) {
            let mut response = refuse(
                StatusCode::UNAUTHORIZED,
                "missing or wrong bearer token (Authorization: Bearer <token>)",
            );
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"mcp-budget\""),
            );
            return Err(Box::new(response));
        }
    }
    Ok(())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The session named by the request, with its protocol-version header checked.
fn find_session(listener: &Listener, headers: &HeaderMap) -> Result<Arc<Session>, Refusal> {
    let Some(id) = header_str(headers, SESSION_HEADER) else {
        return Err(Box::new(refuse(
            StatusCode::BAD_REQUEST,
            "missing Mcp-Session-Id header: send initialize first, then the session id it returned",
        )));
    };
    let Some(session) = lock(&listener.sessions).get(id).cloned() else {
        return Err(Box::new(refuse(
            StatusCode::NOT_FOUND,
            "unknown or ended session: initialize a new one",
        )));
    };
    check_version(&session, headers)?;
    Ok(session)
}

fn check_version(session: &Session, headers: &HeaderMap) -> Result<(), Refusal> {
    let Some(version) = header_str(headers, VERSION_HEADER) else {
        return Ok(()); // absent: the spec says assume 2025-03-26
    };
    let negotiated = lock(&session.protocol).clone();
    let known = KNOWN_VERSIONS.contains(&version);
    if !known || negotiated.as_deref().is_some_and(|n| n != version) {
        return Err(Box::new(refuse(
            StatusCode::BAD_REQUEST,
            &format!(
                "unsupported MCP-Protocol-Version {version:?}{}",
                negotiated
                    .map(|n| format!("; this session negotiated {n:?}"))
                    .unwrap_or_default()
            ),
        )));
    }
    Ok(())
}

fn accepts(headers: &HeaderMap, kind: &str) -> bool {
    header_str(headers, "accept")
        .is_none_or(|accept| accept.contains(kind) || accept.contains("*/*"))
}

async fn new_session(listener: &Arc<Listener>) -> Result<Arc<Session>, Refusal> {
    if lock(&listener.sessions).len() >= listener.options.max_sessions {
        return Err(Box::new(refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!(
                "too many sessions (at most {}); end one with DELETE or try again later",
                listener.options.max_sessions
            ),
        )));
    }
    let mut upstream = Upstream::start(&listener.spec, listener.options.session.max_message_bytes)
        .await
        .map_err(|err| {
            tracing::error!(%err, "cannot start the upstream for a new session");
            refuse(
                StatusCode::BAD_GATEWAY,
                &format!("cannot start the upstream server: {err}"),
            )
        })?;
    let mut raw = [0u8; 16];
    let _ = getrandom::fill(&mut raw);
    let id: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let stopper = upstream.stopper();
    let _task = upstream.take_task();
    let session = Arc::new(Session {
        id: id.clone(),
        relay: {
            let relay = Relay::new(Interceptor::shared(listener.budget.clone()))
                .with_request_timeout(listener.options.session.request_timeout);
            match &listener.options.recorder {
                Some(recorder) => relay.with_recorder(recorder.for_session(&id)),
                None => relay,
            }
        },
        to_server: upstream.to_server.clone(),
        routes: Mutex::new(Routes::default()),
        stopper: Mutex::new(stopper),
        last_active: Mutex::new(Instant::now()),
        protocol: Mutex::new(None),
        initialize_key: Mutex::new(None),
        ended: AtomicBool::new(false),
    });
    tokio::spawn(pump(listener.clone(), session.clone(), upstream.events));
    if let Some(timeout) = listener.options.session.request_timeout {
        tokio::spawn(sweep_timeouts(Arc::downgrade(&session), timeout));
    }
    lock(&listener.sessions).insert(id.clone(), session.clone());
    tracing::info!(session = %id, "new session");
    Ok(session)
}

/// Unregisters a POST's stream, and cancels upstream what it left unanswered when the client
/// went away before the answers came.
struct StreamGuard {
    session: Arc<Session>,
    stream: u64,
    pending: HashSet<String>,
    ids: Vec<Id>,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut routes = lock(&self.session.routes);
        routes.streams.remove(&self.stream);
        routes.progress.retain(|_, n| *n != self.stream);
        for key in &self.pending {
            routes.waiting.remove(key);
        }
        drop(routes);
        for id in self.ids.iter().filter(|id| self.pending.contains(id.key())) {
            tracing::info!(session = %self.session.id, id = id.raw(), "client went away before the answer; cancelling upstream");
            let cancel = format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{},"reason":"the client disconnected"}}}}"#,
                id.raw()
            );
            let routed = self
                .session
                .relay
                .from_client(Frame::Line(cancel.into_bytes()));
            if let Some(bytes) = routed.to_server {
                let _ = self.session.to_server.try_send(bytes);
            }
        }
    }
}

async fn handle_post(
    State(listener): State<Arc<Listener>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(response) = check_access(&listener, &headers) {
        return *response;
    }
    if !accepts(&headers, "application/json") && !accepts(&headers, "text/event-stream") {
        return refuse(
            StatusCode::NOT_ACCEPTABLE,
            "Accept must include application/json and/or text/event-stream",
        );
    }
    let parsed = match message::parse(&body) {
        Ok(parsed) => parsed,
        Err(err) => {
            let body = jsonrpc::error_response(
                None,
                jsonrpc::PARSE_ERROR,
                &format!("Parse error: {err}"),
                None,
            );
            return (
                StatusCode::BAD_REQUEST,
                [(header::CONTENT_TYPE, "application/json")],
                body,
            )
                .into_response();
        }
    };
    let kinds = match parsed {
        Parsed::Single(kind) => vec![kind],
        Parsed::Batch(kinds) => kinds,
    };
    let mut ids = Vec::new();
    let mut initialize = None;
    for kind in &kinds {
        if let Kind::Request { id, method } = kind {
            if method == "initialize" {
                initialize = Some(id.clone());
            }
            ids.push(id.clone());
        }
    }
    let session = match (header_str(&headers, SESSION_HEADER), &initialize) {
        (None, Some(init)) => match new_session(&listener).await {
            Ok(session) => {
                *lock(&session.initialize_key) = Some(init.key().to_string());
                session
            }
            Err(response) => return *response,
        },
        _ => match find_session(&listener, &headers) {
            Ok(session) => session,
            Err(response) => return *response,
        },
    };
    session.touch();
    let sse = accepts(&headers, "text/event-stream");
    let (tx, rx) = mpsc::channel::<Vec<u8>>(256);
    let stream_number = {
        let mut routes = lock(&session.routes);
        routes.next_stream += 1;
        let n = routes.next_stream;
        for id in &ids {
            routes.waiting.insert(id.key().to_string(), tx.clone());
        }
        if sse && !ids.is_empty() {
            for token in request_progress_tokens(&body) {
                routes.progress.insert(token, n);
            }
            routes.streams.insert(n, tx.clone());
            // What waited for a stream goes out on this one.
            while let Some(waiting) = routes.backlog.pop_front() {
                if tx.try_send(waiting).is_err() {
                    break;
                }
            }
        }
        n
    };
    drop(tx);
    let routed = session.relay.from_client(Frame::Line(body.to_vec()));
    for reply in routed.to_client {
        session.route(reply).await;
    }
    if let Some(bytes) = routed.to_server
        && session.to_server.send(bytes).await.is_err()
    {
        // The upstream is gone; its end answers the waiting requests through `route`.
        tracing::warn!(session = %session.id, "upstream no longer takes messages");
    }
    let guard = StreamGuard {
        session: session.clone(),
        stream: stream_number,
        pending: ids.iter().map(|id| id.key().to_string()).collect(),
        ids: ids.clone(),
    };
    let mut response_headers = HeaderMap::new();
    if initialize.is_some()
        && let Ok(value) = HeaderValue::from_str(&session.id)
    {
        response_headers.insert(SESSION_HEADER, value);
    }
    if ids.is_empty() {
        drop(guard);
        return (StatusCode::ACCEPTED, response_headers).into_response();
    }
    if sse {
        let stream = answer_stream(rx, guard);
        return (
            response_headers,
            Sse::new(stream).keep_alive(KeepAlive::default()),
        )
            .into_response();
    }
    // JSON only: wait for every response of this POST.
    let mut guard = guard;
    let mut rx = rx;
    let mut answers = Vec::new();
    while !guard.pending.is_empty() {
        let Some(bytes) = rx.recv().await else { break };
        for key in message::response_keys(&bytes) {
            guard.pending.remove(&key);
        }
        answers.push(bytes);
    }
    let body = if answers.len() == 1 && kinds.len() == 1 {
        answers.remove(0)
    } else {
        let joined: Vec<String> = answers
            .iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        format!("[{}]", joined.join(",")).into_bytes()
    };
    response_headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    (StatusCode::OK, response_headers, body).into_response()
}

/// The SSE stream of one POST: related messages, then the responses; it ends after the last.
fn answer_stream(
    rx: mpsc::Receiver<Vec<u8>>,
    guard: StreamGuard,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    futures_util::stream::unfold((rx, guard), |(mut rx, mut guard)| async move {
        if guard.pending.is_empty() {
            return None;
        }
        let bytes = rx.recv().await?;
        for key in message::response_keys(&bytes) {
            guard.pending.remove(&key);
        }
        let event = SseEvent::default().data(String::from_utf8_lossy(&bytes));
        Some((Ok(event), (rx, guard)))
    })
}

async fn handle_get(State(listener): State<Arc<Listener>>, headers: HeaderMap) -> Response {
    if let Err(response) = check_access(&listener, &headers) {
        return *response;
    }
    let session = match find_session(&listener, &headers) {
        Ok(session) => session,
        Err(response) => return *response,
    };
    if !accepts(&headers, "text/event-stream") {
        return refuse(
            StatusCode::NOT_ACCEPTABLE,
            "GET opens an event stream: Accept must include text/event-stream",
        );
    }
    session.touch();
    let (tx, rx) = mpsc::channel::<Vec<u8>>(256);
    {
        let mut routes = lock(&session.routes);
        while let Some(waiting) = routes.backlog.pop_front() {
            if tx.try_send(waiting).is_err() {
                break;
            }
        }
        routes.get = Some(tx);
    }
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let bytes = rx.recv().await?;
        Some((
            Ok::<_, Infallible>(SseEvent::default().data(String::from_utf8_lossy(&bytes))),
            rx,
        ))
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn handle_delete(State(listener): State<Arc<Listener>>, headers: HeaderMap) -> Response {
    if let Err(response) = check_access(&listener, &headers) {
        return *response;
    }
    let session = match find_session(&listener, &headers) {
        Ok(session) => session,
        Err(response) => return *response,
    };
    lock(&listener.sessions).remove(&session.id);
    tracing::info!(session = %session.id, "session ended by the client");
    session.end(
        "the client ended the session",
        listener.options.session.shutdown_grace,
    );
    StatusCode::NO_CONTENT.into_response()
}
