//! Clients over Streamable HTTP: `--listen http://127.0.0.1:PORT/mcp`.
//!
//! Each client session (minted at `initialize`, named by `Mcp-Session-Id`) gets a relay and an
//! upstream of its own (`session`). A POST carries one client message; when it holds
//! requests, the answer is an SSE stream that carries the server messages related to them and
//! ends with their responses — or plain JSON when the client accepts only that. GET opens the
//! stream for server-initiated messages; DELETE ends the session (`handlers`).
//!
//! Security defaults: loopback only unless the URL says otherwise, `Host` and `Origin`
//! checked against DNS rebinding (403), optional bearer tokens (401), all checked before the
//! body is read; body limit (413); caps on sessions, in total and per client (503, 429); a cap
//! on connections; a timeout for request headers that also closes idle connections. The
//! client's `Authorization` header is never passed upstream: only the message bodies are.
//! `GET /healthz` answers a load balancer (200 while sessions are taken, else 503) and needs
//! no token: it says nothing else.

mod body;
mod checks;
pub mod guard;
mod handlers;
pub mod metrics;
mod replay;
mod session;
mod sessions;
mod streams;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::post;
use futures_util::future::Either;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tower::ServiceExt;
use url::Url;

use crate::session::Options;
use crate::upstream::UpstreamSpec;

use guard::refuse_connection_with;
use sessions::Sessions;

/// The default of `--max-body-bytes-in-flight`: one message of the largest size
/// (`--max-message-bytes`' default) at a time. A body is held until it is written upstream, and
/// the proxy may hold a second copy of it meanwhile (a call's arguments read, or rewritten):
/// sixteen 60 MB requests at once peak near 150 MiB with this, near 390 MiB with twice it.
pub const DEFAULT_BODY_BYTES_IN_FLIGHT: usize = 64 * 1024 * 1024;

/// Where a load balancer asks whether this instance takes sessions (outside the MCP path).
pub const HEALTH_PATH: &str = "/healthz";
/// Where `--metrics listen` serves the metrics (behind the token).
pub const METRICS_PATH: &str = "/metrics";

/// How the listener behaves.
#[derive(Debug, Clone)]
pub struct ListenOptions {
    /// The URL clients use; its path is the MCP endpoint.
    pub url: Url,
    pub allow_hosts: Vec<String>,
    pub allow_origins: Vec<String>,
    /// Accepted bearer tokens (none: no token is required).
    pub auth_tokens: Vec<String>,
    pub max_sessions: usize,
    /// At most this many sessions for one client (one token, or one address without tokens).
    pub max_sessions_per_client: usize,
    /// At most this many open connections; more are refused at once.
    pub max_connections: usize,
    /// Request bodies of 64 KiB and more hold at most this many bytes together while they are
    /// read and passed on; past it a body waits briefly, then gets 503.
    pub max_body_bytes_in_flight: usize,
    /// At most this many upstream server processes at once (a session each); more sessions
    /// are refused with 503.
    pub max_children: usize,
    /// Requests per second per client (token, or address without tokens), with bursts of
    /// twice that; more get 429 and `Retry-After`. 0: no limit.
    pub rate_limit: f64,
    /// A connection must send a request's headers within this long, and an idle one is
    /// closed after it.
    pub header_timeout: Duration,
    /// A request body must arrive within this long.
    pub body_timeout: Duration,
    pub idle: Duration,
    /// Each session keeps the SSE events it sent, up to this many bytes, for clients that
    /// resume a stream with `Last-Event-ID`.
    pub replay_bytes: usize,
    /// How long a POST stream cut before its answers waits for the client to resume it
    /// (clients on 2025-11-25 and later); then its requests are cancelled upstream.
    pub resume_window: Duration,
    /// End a POST's event stream after this long, for the client to resume it (SSE polling;
    /// only for clients that can resume). `None`: never.
    pub stream_limit: Option<Duration>,
    /// The `retry` (milliseconds) a POST stream's priming event tells clients to wait before
    /// they resume.
    pub retry: Duration,
    pub session: Options,
    /// Records every session's messages (each line names its session).
    pub recorder: Option<crate::recording::Recorder>,
}

impl ListenOptions {
    /// Options with the defaults of the command line for `url`.
    pub fn new(url: Url) -> ListenOptions {
        ListenOptions {
            url,
            allow_hosts: Vec::new(),
            allow_origins: Vec::new(),
            auth_tokens: Vec::new(),
            max_sessions: 64,
            max_sessions_per_client: 32,
            max_connections: 512,
            max_body_bytes_in_flight: DEFAULT_BODY_BYTES_IN_FLIGHT,
            max_children: 64,
            rate_limit: 1000.0,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle: Duration::from_secs(1800),
            replay_bytes: 2 * 1024 * 1024,
            resume_window: Duration::from_secs(60),
            stream_limit: None,
            retry: Duration::from_secs(1),
            session: Options::default(),
            recorder: None,
        }
    }
}

/// The listener could not start or failed.
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

/// Binds the address of a `--listen` URL; returns the listener and the URL with the port it got.
pub async fn bind(url: &Url, addr: SocketAddr) -> Result<(TcpListener, Url), ListenError> {
    let tcp = TcpListener::bind(addr)
        .await
        .map_err(|source| ListenError::Bind { addr, source })?;
    let local = tcp.local_addr().map_err(ListenError::Serve)?;
    let mut url = url.clone();
    // An http URL always takes a port.
    let _ = url.set_port(Some(local.port()));
    Ok((tcp, url))
}

/// Serves clients on `tcp` until `shutdown` completes; then ends every session and waits for
/// every connection and session task (bounded by the shutdown grace).
pub async fn serve(
    tcp: TcpListener,
    options: ListenOptions,
    spec: UpstreamSpec,
    budget: Arc<crate::reload::Shared>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ListenError> {
    let local = tcp.local_addr().map_err(ListenError::Serve)?;
    if !local.ip().is_loopback() {
        tracing::warn!(%local, "listening on a non-loopback address: anyone who can reach it can use the server (consider --auth-token-env)");
    }
    if options.auth_tokens.is_empty() && options.max_sessions_per_client < options.max_sessions {
        tracing::debug!("without tokens, sessions are counted per client address");
    }
    let path = options.url.path().to_string();
    let header_timeout = options.header_timeout;
    let max_connections = options.max_connections.max(1);
    let idle = options.idle;
    let grace = options.session.shutdown_grace;
    let sessions = Arc::new(Sessions::new(options, spec, budget));
    let state = Arc::new(checks::Listener::new(sessions.clone(), local));
    let mut app = Router::new().route(
        &path,
        post(handlers::post)
            .get(handlers::get)
            .delete(handlers::delete),
    );
    if path != HEALTH_PATH {
        app = app.route(HEALTH_PATH, axum::routing::get(handlers::health));
    }
    if crate::metrics::get().is_some() && path != METRICS_PATH {
        app = app.route(METRICS_PATH, axum::routing::get(handlers::metrics));
    }
    let app = app.with_state(state.clone());
    tracing::info!(%local, %path, "listening");

    let (stop_tx, stop_rx) = watch::channel(false);
    let slots = Arc::new(Semaphore::new(max_connections));
    let mut connections = JoinSet::new();
    // The reaper ticks at least twice per header timeout. Besides expiring sessions, that
    // keeps a timer due sooner than any request's header timer: tokio wakes its driver (a
    // write to an eventfd) whenever a new timer is due before every other, which each request
    // would otherwise do when hyper arms its header timer (measured: ~6% of the CPU of a call).
    let mut reap = tokio::time::interval(
        (idle / 4)
            .min(header_timeout / 2)
            .clamp(Duration::from_millis(100), Duration::from_secs(30)),
    );
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = reap.tick() => sessions.end_idle(),
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = tcp.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // Out of file descriptors, most likely: let connections close first.
                        tracing::warn!(%err, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    tracing::warn!(%peer, max_connections, "connection refused: at --max-connections");
                    refuse_connection(stream);
                    continue;
                };
                // Small SSE events must not wait for Nagle's algorithm (a 40 ms stall per event).
                let _ = stream.set_nodelay(true);
                let app = app.clone();
                let state = state.clone();
                let path = path.clone();
                let mut stop = stop_rx.clone();
                // Polled quietly: hyper reads the body in this task for the handler this task
                // polls too, a wake of its own task a request (see `crate::quiet`).
                connections.spawn(crate::quiet::Quiet::new(async move {
                    let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
                        // Every call is a POST to the MCP path: it goes to its handler without
                        // the router (the same handler the router names for it).
                        if request.method() == hyper::Method::POST && request.uri().path() == path {
                            let state = state.clone();
                            return Either::Left(async move {
                                Ok::<_, std::convert::Infallible>(
                                    handlers::post_direct(state, peer, request).await,
                                )
                            });
                        }
                        request.extensions_mut().insert(ConnectInfo(peer));
                        Either::Right(app.clone().oneshot(request))
                    });
                    let mut builder = hyper::server::conn::http1::Builder::new();
                    builder.timer(TokioTimer::new()).header_read_timeout(header_timeout);
                    let connection = builder.serve_connection(TokioIo::new(stream), service);
                    tokio::pin!(connection);
                    tokio::select! {
                        result = connection.as_mut() => {
                            if let Err(err) = result {
                                tracing::debug!(%peer, %err, "connection ended with an error");
                            }
                        }
                        _ = stop.changed() => {
                            connection.as_mut().graceful_shutdown();
                            let _ = connection.await;
                        }
                    }
                    drop(slot);
                }));
            }
        }
    }
    drop(tcp);
    // End every session first: that ends their open streams, so connections can finish.
    sessions.shut_down().await;
    let _ = stop_tx.send(true);
    let bound = grace + Duration::from_secs(3);
    if tokio::time::timeout(bound, async {
        while connections.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        connections.shutdown().await;
    }
    Ok(())
}

/// Tells a connection over the cap why it is closed (best effort: it is not waited on).
fn refuse_connection(stream: tokio::net::TcpStream) {
    refuse_connection_with(
        stream,
        "too many connections (--max-connections); try again later",
    );
}
