//! Async floors: the relays of the bare floors rebuilt on the proxy's own stack (tokio, and
//! hyper for HTTP), with no protocol work at all: no JSON read, no budget, no routing. They
//! say what the runtime and the HTTP library cost by themselves, so that a proxy's figure
//! can be split into the stack's share and its own.
//!
//! Each runs in this bench binary under `MCP_BUDGET_BENCH_BARE` (see the benches' `main`).

use std::convert::Infallible;
use std::os::fd::AsFd;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The process's stdin and stdout as non-blocking pipes on the reactor (as the proxy opens
/// them).
fn stdio_pipes() -> (
    tokio::net::unix::pipe::Receiver,
    tokio::net::unix::pipe::Sender,
) {
    let input = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .and_then(tokio::net::unix::pipe::Receiver::from_owned_fd)
        .expect("stdin is a pipe");
    let output = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .and_then(tokio::net::unix::pipe::Sender::from_owned_fd)
        .expect("stdout is a pipe");
    (input, output)
}

/// stdio→stdio on tokio's current-thread runtime (the proxy's in stdio mode): this binary in
/// server mode as the child, one task a direction, each line written as it is read.
pub fn tokio_stdio_relay() {
    current_thread().block_on(async {
        let mut child = tokio::process::Command::from(super::server_command())
            .spawn()
            .expect("spawn the server");
        let mut to_child = child.stdin.take().expect("stdin");
        let from_child = BufReader::new(child.stdout.take().expect("stdout"));
        let (input, output) = stdio_pipes();
        let answers = tokio::spawn(copy_lines(from_child, output));
        copy_lines(BufReader::new(input), &mut to_child).await;
        drop(to_child);
        let _ = child.wait().await;
        answers.abort();
    });
}

/// Copies lines from `from` to `to`, each written as it is read, until either side ends.
async fn copy_lines(
    mut from: impl tokio::io::AsyncBufRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin,
) {
    let mut line = Vec::new();
    loop {
        line.clear();
        if from.read_until(b'\n', &mut line).await.unwrap_or(0) == 0 {
            return;
        }
        if to.write_all(&line).await.is_err() {
            return;
        }
    }
}

/// A hyper HTTP/1.1 client connection to `url` (`http://host:port/path`): the sender and the
/// path.
async fn connect(url: &str) -> (hyper::client::conn::http1::SendRequest<Full<Bytes>>, String) {
    let rest = url.trim_start_matches("http://");
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let stream = tokio::net::TcpStream::connect(host).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    (sender, path.to_string())
}

/// One POST of `body` on `sender`: the answer's status and body.
async fn post(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    path: &str,
    body: Bytes,
) -> Option<(hyper::StatusCode, Bytes)> {
    sender.ready().await.ok()?;
    let request = Request::post(path)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(Full::new(body))
        .ok()?;
    let response = sender.send_request(request).await.ok()?;
    let status = response.status();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some((status, body))
}

/// stdio→HTTP on tokio's current-thread runtime with hyper's client: each line POSTed on one
/// kept-alive connection, each answer written as a line.
pub fn tokio_http_relay(url: &str) {
    current_thread().block_on(async {
        let (mut sender, path) = connect(url).await;
        let (input, mut output) = stdio_pipes();
        let mut input = BufReader::new(input);
        let mut line = Vec::new();
        loop {
            line.clear();
            if input.read_until(b'\n', &mut line).await.unwrap_or(0) == 0 {
                return;
            }
            let body = Bytes::copy_from_slice(line.trim_ascii_end());
            let Some((_, answer)) = post(&mut sender, &path, body).await else {
                return;
            };
            if answer.is_empty() {
                continue;
            }
            let mut out = Vec::with_capacity(answer.len() + 1);
            out.extend_from_slice(&answer);
            out.push(b'\n');
            if output.write_all(&out).await.is_err() {
                return;
            }
        }
    });
}

/// HTTP→HTTP on the proxy's `--listen` runtime (work-stealing, every core) with hyper's
/// server and client: a connection upstream per client connection, bodies passed as they
/// are, with a fixed session id. Prints its address as the proxy does.
pub fn tokio_http_forwarder(url: &str) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        println!(
            "listening on http://{}/mcp",
            listener.local_addr().expect("addr")
        );
        let url = url.to_string();
        loop {
            let Ok((client, _)) = listener.accept().await else {
                continue;
            };
            let _ = client.set_nodelay(true);
            let url = url.clone();
            tokio::spawn(async move {
                let (sender, path) = connect(&url).await;
                let upstream = std::sync::Arc::new(tokio::sync::Mutex::new((sender, path)));
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let upstream = upstream.clone();
                    async move {
                        let body = request
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        let mut upstream = upstream.lock().await;
                        let (sender, path) = &mut *upstream;
                        let path = path.clone();
                        let (status, answer) = post(sender, &path, body)
                            .await
                            .unwrap_or((hyper::StatusCode::BAD_GATEWAY, Bytes::new()));
                        let mut response = Response::new(Full::new(answer));
                        *response.status_mut() = status;
                        let headers = response.headers_mut();
                        headers.insert(
                            "content-type",
                            hyper::header::HeaderValue::from_static("application/json"),
                        );
                        headers.insert(
                            "mcp-session-id",
                            hyper::header::HeaderValue::from_static("bare"),
                        );
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(client), service)
                    .await;
            });
        }
    });
}
