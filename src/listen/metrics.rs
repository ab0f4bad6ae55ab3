//! The standalone metrics endpoint (`--metrics ADDR`): `GET /metrics` on an address of its own,
//! guarded as `--listen` is (the Host check, a cap on connections, a header timeout). The
//! registry it serves is [`crate::metrics`]; `--metrics listen` serves it on the `--listen`
//! address instead (`handlers`).

use std::time::Duration;

use crate::metrics;

use super::guard::{allowed_hosts, check_host, refuse_connection_with};

/// At most this many connections to the standalone endpoint at once, by default
/// (`--metrics-max-connections`): a scraper needs one or two.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;

/// How the standalone endpoint (`--metrics ADDR`) guards itself.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Host header values accepted besides the loopback names and the bound address
    /// (`--allow-host`, as for `--listen`).
    pub allow_hosts: Vec<String>,
    /// At most this many open connections; more are answered 503 and closed at once.
    pub max_connections: usize,
    /// A connection must send a request's headers within this long, and an idle one is closed
    /// after it (`--header-timeout-secs`).
    pub header_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> ServeOptions {
        ServeOptions {
            allow_hosts: Vec::new(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: Duration::from_secs(10),
        }
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown`: the Host header checked against DNS
/// rebinding as `--listen` checks it (403), at most `max_connections` connections (503
/// beyond), and a header timeout that also closes idle connections.
pub async fn serve(
    listener: tokio::net::TcpListener,
    options: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use std::sync::Arc;

    use axum::http::{HeaderMap, StatusCode, header};
    use axum::response::IntoResponse;
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;

    let local = listener.local_addr()?;
    let hosts = Arc::new(allowed_hosts(local.ip(), &options.allow_hosts));
    let metrics = move |headers: HeaderMap| {
        let hosts = hosts.clone();
        async move {
            if let Err((status, message)) = check_host(&hosts, &headers) {
                return (status, [(header::CONTENT_TYPE, "text/plain")], message).into_response();
            }
            match metrics::get() {
                Some(m) => {
                    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], m.encode()).into_response()
                }
                None => StatusCode::NOT_FOUND.into_response(),
            }
        }
    };
    let app = axum::Router::new().route("/metrics", axum::routing::get(metrics));
    let max_connections = options.max_connections.max(1);
    let header_timeout = options.header_timeout;
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // Out of file descriptors, most likely: let connections close first.
                        tracing::warn!(%err, "accepting a metrics connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    tracing::warn!(%peer, max_connections, "metrics connection refused: at --metrics-max-connections");
                    refuse_connection_with(
                        stream,
                        "too many connections (--metrics-max-connections); try again later",
                    );
                    continue;
                };
                let app = app.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(
                        move |request: hyper::Request<hyper::body::Incoming>| {
                            app.clone().oneshot(request)
                        },
                    );
                    let mut builder = hyper::server::conn::http1::Builder::new();
                    builder.timer(TokioTimer::new()).header_read_timeout(header_timeout);
                    if let Err(err) = builder
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                    {
                        tracing::debug!(%peer, %err, "metrics connection ended with an error");
                    }
                    drop(slot);
                });
            }
        }
    }
    connections.shutdown().await;
    Ok(())
}
