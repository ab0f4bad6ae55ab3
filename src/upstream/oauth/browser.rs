//! The browser step of a sign-in: the authorization URL opened with `$BROWSER` (else the
//! platform's opener) and always logged, and a loopback listener on 127.0.0.1 (a port of the
//! system's choosing) that takes the one redirect carrying this sign-in's `state`, then closes.
//! A redirect with another `state` is answered 400 and changes nothing.

use std::convert::Infallible;
use std::process::Stdio;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// Connections the listener serves at once (a browser opens a few).
const MAX_CONNECTIONS: usize = 16;
/// How long a connection has to send its request's head.
const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the authorization server sent back through the browser.
#[derive(Debug)]
pub enum Redirect {
    /// The whole redirect URL (code, state, iss), as the browser requested it.
    Code(String),
    /// The server's refusal (`error`, `error_description`).
    Refused(String),
}

/// The loopback listener of one sign-in.
pub struct Loopback {
    listener: TcpListener,
    port: u16,
}

impl Loopback {
    /// Listens on 127.0.0.1:`port` (0: a port the system picks).
    pub async fn bind(port: u16) -> std::io::Result<Loopback> {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let port = listener.local_addr()?.port();
        Ok(Loopback { listener, port })
    }

    /// Where the authorization server sends the browser back.
    pub fn redirect_uri(&self) -> String {
        format!("http://127.0.0.1:{}/callback", self.port)
    }

    /// Serves the listener until a redirect with `state` arrives; the listener and every
    /// connection to it close with it. At most [`MAX_CONNECTIONS`] at once, each given
    /// [`HEADER_TIMEOUT`] to send its request.
    pub async fn wait(self, state: String) -> Redirect {
        let (found, mut got) = mpsc::channel::<Redirect>(1);
        let port = self.port;
        let mut connections = tokio::task::JoinSet::new();
        loop {
            while connections.try_join_next().is_some() {}
            tokio::select! {
                redirect = got.recv() => {
                    if let Some(redirect) = redirect {
                        // The browser gets its page (connections end after one answer), then
                        // whatever is left is closed.
                        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), async {
                            while connections.join_next().await.is_some() {}
                        })
                        .await;
                        return redirect;
                    }
                }
                accepted = self.listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _)) => stream,
                        Err(err) => {
                            // Out of descriptors, say: not a busy loop.
                            tracing::debug!(%err, "the sign-in listener could not accept");
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    if connections.len() >= MAX_CONNECTIONS {
                        continue;
                    }
                    let found = found.clone();
                    let state = state.clone();
                    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                        let answer = answer(&request, port, &state, &found);
                        async move { Ok::<_, Infallible>(answer) }
                    });
                    connections.spawn(async move {
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let served = hyper::server::conn::http1::Builder::new()
                            .timer(hyper_util::rt::TokioTimer::new())
                            .header_read_timeout(HEADER_TIMEOUT)
                            .keep_alive(false)
                            .serve_connection(io, service)
                            .await;
                        if let Err(err) = served {
                            tracing::debug!(%err, "a connection to the sign-in listener ended");
                        }
                    });
                }
            }
        }
    }
}

fn answer(
    request: &Request<hyper::body::Incoming>,
    port: u16,
    state: &str,
    found: &mpsc::Sender<Redirect>,
) -> Response<Full<Bytes>> {
    let page = |status: StatusCode, text: &str| {
        let mut response = Response::new(Full::new(Bytes::from(format!(
            "<!doctype html><meta charset=utf-8><title>mcp-budget</title><p>{text}</p>\n"
        ))));
        *response.status_mut() = status;
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/html; charset=utf-8"),
        );
        response
    };
    if request.uri().path() != "/callback" {
        return page(StatusCode::NOT_FOUND, "Not a sign-in redirect.");
    }
    let query = request.uri().query().unwrap_or("");
    let mut got_state = None;
    let mut error = None;
    let mut description = None;
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match key.as_ref() {
            "state" => got_state = Some(value.into_owned()),
            "error" => error = Some(value.into_owned()),
            "error_description" => description = Some(value.into_owned()),
            _ => {}
        }
    }
    if got_state.as_deref() != Some(state) {
        tracing::warn!("the sign-in listener got a redirect with another state; ignored");
        return page(
            StatusCode::BAD_REQUEST,
            "This sign-in link is not the one mcp-budget is waiting for (its state differs).",
        );
    }
    let redirect = match error {
        Some(error) => Redirect::Refused(match description {
            Some(description) => format!("{error}: {description}"),
            None => error,
        }),
        None => Redirect::Code(format!("http://127.0.0.1:{port}/callback?{query}")),
    };
    let refused = matches!(redirect, Redirect::Refused(_));
    if found.try_send(redirect).is_err() {
        return page(StatusCode::CONFLICT, "This sign-in was already completed.");
    }
    if refused {
        page(
            StatusCode::OK,
            "The authorization server refused the sign-in; mcp-budget says why on its log.",
        )
    } else {
        page(
            StatusCode::OK,
            "Signed in. mcp-budget goes on; you can close this tab.",
        )
    }
}

/// Opens `url` in a browser: `$BROWSER` when set (its words, then the URL), else `open` on
/// macOS and `xdg-open` elsewhere. The opener's output goes to stderr, never to stdout (the
/// protocol's, in stdio mode). Whether it started.
pub fn open(url: &str) -> bool {
    let browser = std::env::var("BROWSER")
        .ok()
        .filter(|b| !b.trim().is_empty());
    let (program, mut args): (String, Vec<String>) = match &browser {
        Some(command) => {
            let mut words = command.split_whitespace().map(String::from);
            match words.next() {
                Some(program) => (program, words.collect()),
                None => return false,
            }
        }
        None if cfg!(target_os = "macos") => ("open".into(), Vec::new()),
        None => ("xdg-open".into(), Vec::new()),
    };
    args.push(url.to_string());
    let spawned = tokio::process::Command::new(&program)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(false)
        .spawn();
    match spawned {
        Ok(mut child) => {
            tokio::spawn(async move {
                match child.wait().await {
                    Ok(status) if !status.success() => {
                        tracing::warn!(%status, "the browser command failed; open the sign-in URL yourself")
                    }
                    Ok(_) => {}
                    Err(err) => tracing::debug!(%err, "waiting for the browser command"),
                }
            });
            true
        }
        Err(err) => {
            tracing::warn!(%err, %program, "cannot start a browser; open the sign-in URL yourself");
            false
        }
    }
}
