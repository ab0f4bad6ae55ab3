//! Attacks on the proxy, each through the real binary: reused ids, late answers, floods from a
//! server whose client does not read, huge and slow bodies on both HTTP sides, idle
//! connections, and the small checks of the listener. Memory is read from /proc (VmHWM, the
//! peak resident set) and must stay under 128 MiB with the default limits.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{INITIALIZE, INITIALIZED, PATIENCE, Peer, example, handshake, memory, proxy_bin};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

const MIB: u64 = 1024 * 1024;
/// The peak resident set the proxy may reach in any flood below, with the default limits.
const PEAK_LIMIT: u64 = 128 * MIB;

fn quirky() -> String {
    example("quirky_server").to_str().unwrap().to_string()
}

fn fleet_policy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/fleet.toml")
}

fn tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mcp-budget-hardening-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Waits until the number in `file` stops growing for half a second (the writer is blocked),
/// or reaches `total`; returns it.
async fn settled_count(file: &Path, total: u64) -> u64 {
    let read = || {
        std::fs::read_to_string(file)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut last = read();
    let mut still = 0;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = read();
        if now >= total {
            return now;
        }
        if now == last && now > 0 {
            still += 1;
            if still >= 5 {
                return now;
            }
        } else {
            still = 0;
        }
        last = now;
    }
    panic!("the flood neither finished nor stopped within {PATIENCE:?}");
}

// ---- 1. Ids that cannot cross -----------------------------------------------------------------

#[tokio::test]
async fn a_reused_id_is_refused_and_the_budgeted_answer_still_reaches_its_request() {
    let server = example("fleet_server");
    let policy = fleet_policy();
    let mut peer = Peer::proxy(
        &["--policy", policy.to_str().unwrap()],
        &[server.to_str().unwrap(), "--streams", "240"],
    );
    handshake(&mut peer).await;
    peer.send(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"fleet_show","arguments":{}}}"#).await;
    peer.send(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
        .await;
    let first = peer.recv().await;
    assert_eq!(
        first,
        r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32600,"message":"Invalid Request: id 1 is already used by a request in flight; give every request its own id (JSON-RPC ids are unique among pending requests)"}}"#
    );
    let answer = peer.recv().await;
    // Before: the ping took over id 1, and the raw 2,669,922-byte result went through.
    assert!(answer.len() < 50_000, "{} bytes", answer.len());
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["id"], 1);
    assert_eq!(answer["result"]["isError"], false);
    assert_eq!(answer["result"]["structuredContent"]["total_count"], 240);
    // Nothing else came: the next answer is the next request's.
    peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#)
        .await;
    assert_eq!(peer.recv().await, r#"{"jsonrpc":"2.0","id":2,"result":{}}"#);
}

/// Reads messages until the response to `id` arrives; returns every message read.
async fn until_response(peer: &mut Peer, id: Value) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let message = peer.recv_json().await;
        let done = message.get("id") == Some(&id) && message.get("method").is_none();
        seen.push(message);
        if done {
            return seen;
        }
    }
}

/// Reads messages until the server's log says it handled the cancellation of `id` (it does so
/// after it wrote its answer to that request); returns every message read.
async fn until_cancel_logged(peer: &mut Peer, id: &str) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let message = peer.recv_json().await;
        let done = message["params"]["data"] == format!("cancelled {id}");
        seen.push(message);
        if done {
            return seen;
        }
    }
}

#[tokio::test]
async fn a_late_answer_after_a_timeout_is_dropped_even_when_the_id_is_reused() {
    let mut peer = Peer::proxy(&["--request-timeout-secs", "1"], &[&quirky()]);
    handshake(&mut peer).await;
    // The server answers id 5 after 2 s with 150 KB; the proxy gave up at 1 s.
    peer.send(r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"late","arguments":{"ms":2000,"bytes":150000}}}"#).await;
    let timeout = peer.recv_json().await;
    assert_eq!(timeout["id"], 5);
    assert!(
        timeout["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--request-timeout-secs"),
        "{timeout}"
    );
    // The server wrote its late answer before it logged the cancellation.
    let seen = until_cancel_logged(&mut peer, "5").await;
    assert!(
        seen.iter().all(|m| m.get("id").is_none()),
        "the late answer for id 5 reached the client: {seen:?}"
    );
    // A request that reuses id 5 goes upstream under a fresh id of the proxy's, and its answer
    // comes back as id 5.
    peer.send(r#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#)
        .await;
    assert_eq!(peer.recv().await, r#"{"jsonrpc":"2.0","id":5,"result":{}}"#);
}

#[tokio::test]
async fn an_answer_after_a_cancel_is_dropped_even_when_the_id_is_reused_at_once() {
    let mut peer = Peer::proxy(&[], &[&quirky()]);
    handshake(&mut peer).await;
    peer.send(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"late","arguments":{"ms":300,"bytes":150000}}}"#).await;
    peer.send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}"#)
        .await;
    // Reused at once, while the server still works on the cancelled request.
    peer.send(r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#)
        .await;
    peer.send(r#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#)
        .await;
    let seen = until_response(&mut peer, json!(8)).await;
    let sevens: Vec<&Value> = seen
        .iter()
        .filter(|m| m.get("id") == Some(&json!(7)))
        .collect();
    assert_eq!(
        sevens,
        vec![&json!({"jsonrpc":"2.0","id":7,"result":{}})],
        "only the ping's answer may reach id 7: {seen:?}"
    );
}

#[tokio::test]
async fn a_server_that_never_answers_initialize_gets_its_client_an_error() {
    let mut peer = Peer::proxy(
        &["--initialize-timeout-secs", "0.5"],
        &["sh", "-c", "cat > /dev/null"],
    );
    peer.send(INITIALIZE).await;
    let error = peer.recv_json().await;
    assert_eq!(error["id"], 1);
    assert_eq!(
        error["error"]["message"],
        "the server did not answer initialize within 0.5 s (--initialize-timeout-secs); the request was cancelled"
    );
}

#[tokio::test]
async fn a_second_initialize_is_refused() {
    let mut peer = Peer::proxy(&[], &[&quirky()]);
    handshake(&mut peer).await;
    peer.send(&INITIALIZE.replace(r#""id":1"#, r#""id":2"#))
        .await;
    let refused = peer.recv_json().await;
    assert_eq!(refused["id"], 2);
    assert_eq!(
        refused["error"]["message"],
        "Invalid Request: this session is already initialized; start a new session to initialize again"
    );
}

#[tokio::test]
async fn null_budget_arguments_mean_absent() {
    let server = example("fleet_server");
    let policy = fleet_policy();
    let mut peer = Peer::proxy(
        &["--policy", policy.to_str().unwrap()],
        &[server.to_str().unwrap(), "--streams", "60"],
    );
    handshake(&mut peer).await;
    peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fleet_show","arguments":{}}}"#).await;
    let plain = peer.recv_json().await;
    peer.send(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"fleet_show","arguments":{"horizon":null,"detail":null,"limit":null,"after":null,"format":null,"state":null}}}"#).await;
    let nulls = peer.recv_json().await;
    assert_eq!(nulls["result"]["isError"], false, "{nulls}");
    assert_eq!(nulls["result"], plain["result"]);
}

// ---- 5. Memory bounded in bytes ---------------------------------------------------------------

/// A proxy in front of the quirky server whose stdout nobody reads while the server floods.
async fn flood_unread(bytes: u64, count: u64) {
    let file = temp(&format!("flood-{bytes}"));
    let _ = std::fs::remove_file(&file);
    let mut peer = Peer::proxy(&[], &[&quirky()]);
    let pid = peer.child.id().unwrap();
    handshake(&mut peer).await;
    let call = json!({"jsonrpc":"2.0","id":"f","method":"tools/call","params":{"name":"flood","arguments":{"count":count,"bytes":bytes,"file":file}}});
    peer.send(&call.to_string()).await;
    let written = settled_count(&file, count).await;
    let peak = memory(pid, "VmHWM");
    assert!(
        written < count,
        "the server wrote all {count} lines: no backpressure reached it"
    );
    assert!(
        peak < PEAK_LIMIT,
        "proxy peak RSS {} MiB with {bytes}-byte lines",
        peak / MIB
    );
    // Nothing is lost: once the client reads, every line and the answer arrive.
    for k in 1..=count {
        let line = peer.recv().await;
        assert!(
            line.contains(&format!(r#""k":{k},"#)),
            "line {k} out of order"
        );
    }
    let done = peer.recv_json().await;
    assert_eq!(
        done["result"]["content"][0]["text"],
        format!("flooded {count}")
    );
    eprintln!(
        "flood of {count} × {bytes} B: the server had written {written} when it was blocked; proxy peak {} MiB",
        peak / MIB
    );
}

#[tokio::test]
async fn a_client_that_does_not_read_slows_the_server_and_memory_stays_bounded_1mb_lines() {
    flood_unread(MIB, 300).await;
}

#[tokio::test]
async fn a_client_that_does_not_read_slows_the_server_and_memory_stays_bounded_8mb_lines() {
    flood_unread(8 * MIB, 40).await;
}

#[tokio::test]
async fn requests_in_flight_are_capped_and_memory_stays_bounded() {
    const CALLS: usize = 400_000;
    let mut child = tokio::process::Command::new(proxy_bin())
        .args(["--", &quirky()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    stdin
        .write_all(format!("{INITIALIZE}\n{INITIALIZED}\n").as_bytes())
        .await
        .unwrap();
    let writer = tokio::spawn(async move {
        let mut batch = String::new();
        for i in 0..CALLS {
            batch.push_str(&format!(
                r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":"slow"}}}}"#,
                i + 10
            ));
            batch.push('\n');
            if batch.len() > 1 << 20 {
                stdin.write_all(batch.as_bytes()).await.unwrap();
                batch.clear();
            }
        }
        stdin.write_all(batch.as_bytes()).await.unwrap();
        stdin
    });
    let mut refused = 0;
    let mut initialized = false;
    while refused < CALLS - 1024 || !initialized {
        let line = tokio::time::timeout(PATIENCE, lines.next_line())
            .await
            .expect("answers keep coming")
            .unwrap()
            .expect("a line");
        if line.contains("protocolVersion") {
            initialized = true;
            continue;
        }
        assert!(
            line.contains("too many requests in flight (1024 unanswered, the limit is 1024)"),
            "{line}"
        );
        refused += 1;
    }
    let _stdin = writer.await.unwrap();
    let peak = memory(pid, "VmHWM");
    assert!(peak < PEAK_LIMIT, "proxy peak RSS {} MiB", peak / MIB);
    eprintln!(
        "{CALLS} calls: {refused} refused over the cap; proxy peak {} MiB",
        peak / MIB
    );
}

// ---- The HTTP listener ------------------------------------------------------------------------

fn http() -> reqwest::Client {
    tls();
    reqwest::Client::new()
}

fn post(url: &str, session: Option<&str>, body: &str) -> reqwest::RequestBuilder {
    common::mcp_post(&http(), url, session, body)
}

#[tokio::test]
async fn over_http_a_reused_id_on_another_post_is_refused_there_and_crosses_nothing() {
    let (_proxy, url) = common::listen(&["--", &quirky()], &[]).await;
    let client = http();
    let session = common::mcp_initialize(&client, &url).await;
    let late = common::mcp_post(&client, &url, Some(&session), r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"late","arguments":{"ms":500,"bytes":150000}}}"#)
        .send()
        .await
        .unwrap();
    let ping = common::mcp_post(
        &client,
        &url,
        Some(&session),
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    )
    .send()
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(
        ping.len() < 1000,
        "the ping's POST got {} bytes",
        ping.len()
    );
    assert!(
        ping.contains("is already used by a request in flight"),
        "{ping}"
    );
    let late = late.text().await.unwrap();
    assert!(
        late.contains(&"y".repeat(150000)),
        "the call's POST lost its answer: {}",
        &late[..late.len().min(600)]
    );
}

#[tokio::test]
async fn a_json_only_batch_gets_one_flat_array() {
    let (_proxy, url) = common::listen(&["--", &quirky()], &[]).await;
    let client = http();
    let session = common::mcp_initialize(&client, &url).await;
    let response = client
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .header("mcp-session-id", &session)
        .body(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping"}]"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // Before: `[[{…},{…}]]`.
    assert_eq!(
        response.text().await.unwrap(),
        r#"[{"jsonrpc":"2.0","id":1,"result":{}},{"jsonrpc":"2.0","id":2,"result":{}}]"#
    );
}

#[tokio::test]
async fn bodies_are_not_read_before_the_token_is_checked() {
    let (proxy, url) = common::listen(
        &["--auth-token-env", "T", "--", &quirky()],
        &[("T", "s3cret")],
    )
    .await;
    let addr = common::authority(&url);
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let head = format!(
                "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\naccept: application/json\r\ncontent-length: 60000000\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).await.unwrap();
            // Send a little of the body, then wait for the verdict without sending the rest.
            let _ = stream.write_all(&vec![b' '; 1 << 20]).await;
            let mut buf = vec![0u8; 4096];
            let n = tokio::time::timeout(PATIENCE, stream.read(&mut buf))
                .await
                .expect("an answer before the body was sent")
                .unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        }));
    }
    for task in tasks {
        let head = task.await.unwrap();
        assert!(head.starts_with("HTTP/1.1 401"), "{head}");
    }
    let peak = memory(proxy.id().unwrap(), "VmHWM");
    assert!(peak < PEAK_LIMIT, "proxy peak RSS {} MiB", peak / MIB);
    eprintln!(
        "ten unauthenticated 60 MB POSTs: all 401 before the body; proxy peak {} MiB",
        peak / MIB
    );
}

#[tokio::test]
async fn idle_connections_are_closed_and_do_not_keep_clients_out() {
    let (_proxy, url) = common::listen(&["--header-timeout-secs", "1", "--", &quirky()], &[]).await;
    let addr = common::authority(&url);
    let mut idle = Vec::new();
    for _ in 0..500 {
        idle.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    // A normal client still gets in.
    let session = common::mcp_initialize(&http(), &url).await;
    assert!(!session.is_empty());
    // And every idle connection is closed by the proxy.
    for mut stream in idle {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(PATIENCE, stream.read(&mut buf))
            .await
            .expect("the idle connection was closed")
            .unwrap_or(0);
        assert_eq!(n, 0, "{}", String::from_utf8_lossy(&buf[..n]));
    }
}

#[tokio::test]
async fn connections_over_the_cap_are_refused_at_once() {
    let (_proxy, url) = common::listen(&["--max-connections", "5", "--", &quirky()], &[]).await;
    let addr = common::authority(&url);
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    let answer = common::raw_http(&addr, b"").await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("--max-connections"), "{answer}");
    drop(held);
}

#[tokio::test]
async fn the_small_checks_of_the_listener() {
    let (_proxy, url) = common::listen(
        &[
            "--auth-token-env",
            "TA",
            "--auth-token-env",
            "TB",
            "--max-sessions-per-client",
            "1",
            "--",
            &quirky(),
        ],
        &[("TA", "token-a"), ("TB", "token-b")],
    )
    .await;
    let addr = common::authority(&url);
    // `bearer` in lower case is a bearer token (RFC 7235).
    let response = post(&url, None, INITIALIZE)
        .header("authorization", "bearer token-a")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let _ = response.text().await;
    let ping = r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#;
    // Another credential cannot use the session.
    let response = post(&url, Some(&session), ping)
        .header("authorization", "Bearer token-b")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    // One client cannot hold more than its share of sessions.
    let response = post(&url, None, INITIALIZE)
        .header("authorization", "Bearer token-a")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    assert!(
        response
            .text()
            .await
            .unwrap()
            .contains("--max-sessions-per-client")
    );
    // The other client can.
    let response = post(&url, None, INITIALIZE)
        .header("authorization", "Bearer token-b")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let _ = response.text().await;
    // A body that is not a JSON-RPC message: 400, not a 202.
    for body in ["42", "[]"] {
        let response = post(&url, Some(&session), body)
            .header("authorization", "Bearer token-a")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{body}");
        let text = response.text().await.unwrap();
        assert!(text.contains("Invalid Request"), "{text}");
    }
    // A body that is not JSON by its type: 415.
    let response = post(&url, Some(&session), ping)
        .header("authorization", "Bearer token-a")
        .header("content-type", "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 415);
    // A second initialize in the session is refused.
    let response = post(
        &url,
        Some(&session),
        &INITIALIZE.replace(r#""id":1"#, r#""id":3"#),
    )
    .header("authorization", "Bearer token-a")
    .header("accept", "application/json")
    .send()
    .await
    .unwrap();
    let text = response.text().await.unwrap();
    assert!(text.contains("already initialized"), "{text}");
    // Two Host headers: 400.
    let request = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\nhost: {addr}\r\nauthorization: Bearer token-a\r\ncontent-type: application/json\r\naccept: application/json\r\nmcp-session-id: {session}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{ping}",
        ping.len()
    );
    let answer = common::raw_http(&addr, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("more than one Host header"), "{answer}");
}

// ---- 3. The upstream HTTP side, with a test server that streams without holding ----------------

/// A test upstream whose answers are endless or huge bodies, produced as they are sent; counts
/// the bytes it sent.
async fn hostile_upstream(sent: Arc<AtomicU64>) -> String {
    use axum::body::Body;
    use axum::routing::post;
    use futures_util::stream;

    fn chunks(
        prefix: &'static [u8],
        byte: u8,
        total: u64,
        sent: Arc<AtomicU64>,
        pause: Option<Duration>,
    ) -> Body {
        let chunk = if pause.is_some() { 1 } else { 1 << 20 };
        let first = bytes::Bytes::from_static(prefix);
        let rest = stream::unfold(0u64, move |done| {
            let sent = sent.clone();
            async move {
                if done >= total {
                    return None;
                }
                if let Some(pause) = pause {
                    tokio::time::sleep(pause).await;
                }
                sent.fetch_add(chunk, Ordering::Relaxed);
                Some((
                    Ok::<_, std::io::Error>(bytes::Bytes::from(vec![byte; chunk as usize])),
                    done + chunk,
                ))
            }
        });
        Body::from_stream(stream::once(async move { Ok(first) }).chain(rest))
    }
    use futures_util::StreamExt;
    let gib = 1u64 << 30;
    let (a, b, c) = (sent.clone(), sent.clone(), sent.clone());
    let app = axum::Router::new()
        .route(
            "/error",
            post(move || async move {
                (
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    chunks(b"", b'e', gib, a, None),
                )
            }),
        )
        .route(
            "/sse",
            post(move || async move {
                (
                    [("content-type", "text/event-stream")],
                    chunks(b"data: ", b'x', gib, b, None),
                )
            }),
        )
        .route(
            "/trickle",
            post(move || async move {
                (
                    [("content-type", "application/json")],
                    chunks(b"{", b' ', gib, c, Some(Duration::from_millis(100))),
                )
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

async fn initialize_through(upstream: &str, extra: &[&str]) -> (Value, u64) {
    let mut args = vec!["--upstream", upstream];
    args.extend_from_slice(extra);
    let mut peer = Peer::spawn(proxy_bin(), &args);
    let pid = peer.child.id().unwrap();
    peer.send(INITIALIZE).await;
    let answer = peer.recv_json().await;
    (answer, memory(pid, "VmHWM"))
}

#[tokio::test]
async fn a_gigabyte_error_body_is_not_read() {
    let sent = Arc::new(AtomicU64::new(0));
    let base = hostile_upstream(sent.clone()).await;
    let (answer, peak) = initialize_through(&format!("{base}/error"), &[]).await;
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("the upstream server answered HTTP 500 Internal Server Error: eeee"),
        "{message}"
    );
    assert!(peak < PEAK_LIMIT, "proxy peak RSS {} MiB", peak / MIB);
    let sent = sent.load(Ordering::Relaxed);
    assert!(sent < 1 << 30, "the whole body was read");
    eprintln!(
        "1 GiB error body: the server got to send {} MiB; proxy peak {} MiB",
        sent / MIB,
        peak / MIB
    );
}

#[tokio::test]
async fn a_gigabyte_sse_event_is_cut_at_the_message_limit() {
    let sent = Arc::new(AtomicU64::new(0));
    let base = hostile_upstream(sent.clone()).await;
    let (answer, peak) = initialize_through(&format!("{base}/sse"), &[]).await;
    assert_eq!(
        answer["error"]["message"],
        "the upstream server's message is over the proxy's message size limit of 67108864 bytes (raise it with --max-message-bytes, or narrow the request)"
    );
    assert!(peak < PEAK_LIMIT, "proxy peak RSS {} MiB", peak / MIB);
    let sent = sent.load(Ordering::Relaxed);
    assert!(sent < 1 << 30, "the whole body was read");
    eprintln!(
        "1 GiB SSE event: the server got to send {} MiB; proxy peak {} MiB",
        sent / MIB,
        peak / MIB
    );
}

#[tokio::test]
async fn a_body_that_trickles_is_given_up_on() {
    let sent = Arc::new(AtomicU64::new(0));
    let base = hostile_upstream(sent).await;
    let (answer, _) = initialize_through(
        &format!("{base}/trickle"),
        &["--upstream-read-timeout-secs", "1"],
    )
    .await;
    assert_eq!(
        answer["error"]["message"],
        "the upstream server took more than 1 s to send one message (--upstream-read-timeout-secs)"
    );
}

#[tokio::test]
async fn over_http_a_flood_with_no_stream_open_waits_for_the_client_and_memory_returns() {
    use futures_util::StreamExt;
    let (proxy, url) = common::listen(&["--", &quirky()], &[]).await;
    let pid = proxy.id().unwrap();
    let client = http();
    let session = common::mcp_initialize(&client, &url).await;
    let before = memory(pid, "VmRSS");
    let file = temp("http-flood");
    let _ = std::fs::remove_file(&file);
    const COUNT: u64 = 300;
    let call = json!({"jsonrpc":"2.0","id":"f","method":"tools/call","params":{"name":"flood","arguments":{"count":COUNT,"bytes":MIB,"file":file}}});
    // Accepting JSON only, the call's POST is no stream; with no GET open either, the flood
    // has nowhere to go but the session's backlog.
    let pending = client
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .header("mcp-session-id", &session)
        .body(call.to_string())
        .send();
    let pending = tokio::spawn(async move { pending.await.unwrap().text().await.unwrap() });
    let written = settled_count(&file, COUNT).await;
    let peak = memory(pid, "VmHWM");
    assert!(written < COUNT, "no backpressure reached the server");
    assert!(peak < PEAK_LIMIT, "proxy peak RSS {} MiB", peak / MIB);
    // The client opens its GET stream: everything arrives, in order, and then the answer.
    let get = client
        .get(&url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    let mut events = sse_stream::SseStream::from_bytes_stream(get.bytes_stream());
    let mut k = 0;
    while k < COUNT {
        let event = tokio::time::timeout(PATIENCE, events.next())
            .await
            .expect("the flood keeps coming")
            .expect("the stream stays open")
            .unwrap();
        let Some(data) = event.data.filter(|d| !d.is_empty()) else {
            continue;
        };
        k += 1;
        assert!(
            data.contains(&format!(r#""k":{k},"#)),
            "message {k} out of order"
        );
    }
    drop(events);
    let answer = tokio::time::timeout(PATIENCE, pending)
        .await
        .unwrap()
        .unwrap();
    assert!(answer.contains(&format!("flooded {COUNT}")), "{answer}");
    let deleted = client
        .delete(&url)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let after = memory(pid, "VmRSS");
    assert!(
        after < before + 64 * MIB,
        "RSS {} MiB after the session, {} MiB before",
        after / MIB,
        before / MIB
    );
    eprintln!(
        "HTTP flood of {COUNT} × 1 MiB with no stream open: the server had written {written} when it was blocked; proxy peak {} MiB; RSS {} MiB before, {} MiB after",
        peak / MIB,
        before / MIB,
        after / MIB
    );
}

/// An upstream whose `tools/call` results are large (over 4 MiB, so each waits for its place
/// among the large messages read at once) and slow: the first 4.3 MB at once, the rest after a
/// pause, 1.5 s for the first call; the second call answers 0.3 s later (so the first holds
/// the place) and pauses 2.5 s.
/// With `sse`, every answer is one SSE event on a `text/event-stream` body.
async fn slow_large_upstream(sse: bool) -> String {
    use axum::body::Body;
    use axum::response::IntoResponse;
    use axum::routing::post;
    use futures_util::{StreamExt, stream};

    let calls = Arc::new(AtomicU64::new(0));
    let app = axum::Router::new().route(
        "/mcp",
        post(move |body: String| {
            let calls = calls.clone();
            async move {
                let request: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                let Some(id) = request.get("id").cloned() else {
                    return axum::http::StatusCode::ACCEPTED.into_response();
                };
                let json = [("content-type", "application/json")];
                let answer = |result: Value| {
                    (json, json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string())
                        .into_response()
                };
                match request["method"].as_str() {
                    Some("initialize") => answer(json!({
                        "protocolVersion": "2025-06-18",
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "slow-large", "version": "1"}
                    })),
                    Some("tools/list") => answer(json!({"tools": [
                        {"name": "big", "inputSchema": {"type": "object"}}
                    ]})),
                    Some("tools/call") => {
                        let pause = if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                            Duration::from_millis(1500)
                        } else {
                            // The first call's result takes the one place first.
                            tokio::time::sleep(Duration::from_millis(300)).await;
                            Duration::from_millis(2500)
                        };
                        let line = "a line of a large result, 40 bytes long\n".repeat(115_000);
                        let message = json!({"jsonrpc": "2.0", "id": id, "result": {
                            "content": [{"type": "text", "text": line}]
                        }});
                        let whole = if sse {
                            format!("event: message\ndata: {message}\n\n").into_bytes()
                        } else {
                            message.to_string().into_bytes()
                        };
                        let kind = if sse {
                            "text/event-stream"
                        } else {
                            "application/json"
                        };
                        let rest = whole[4_300_000..].to_vec();
                        let mut first = whole;
                        first.truncate(4_300_000);
                        let later = stream::once(async move {
                            tokio::time::sleep(pause).await;
                            Ok::<_, std::io::Error>(bytes::Bytes::from(rest))
                        });
                        let body = stream::once(async move {
                            Ok::<_, std::io::Error>(bytes::Bytes::from(first))
                        })
                        .chain(later);
                        ([("content-type", kind)], Body::from_stream(body)).into_response()
                    }
                    _ => (
                        json,
                        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no such method"}})
                            .to_string(),
                    )
                        .into_response(),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/mcp")
}

/// Two large results at once with `--max-large-results 1`: the second waits, mid-read, for
/// the first to be budgeted. That wait is the proxy's, and must not count against the
/// server's `--upstream-read-timeout-secs` (2 s): the second result takes 2.5 s to send, of
/// which at least 1.2 s is spent waiting for its place, so the server's own time is 1.3 s.
#[tokio::test]
async fn waiting_for_a_large_place_is_not_the_servers_slowness() {
    two_large_results_at_once(false).await;
}

/// The same for results sent as SSE events: the event's clock stops while it waits.
#[tokio::test]
async fn waiting_for_a_large_place_is_not_the_servers_slowness_in_sse() {
    two_large_results_at_once(true).await;
}

async fn two_large_results_at_once(sse: bool) {
    let upstream = slow_large_upstream(sse).await;
    let mut peer = Peer::spawn(
        proxy_bin(),
        &[
            "--upstream",
            &upstream,
            "--upstream-read-timeout-secs",
            "2",
            "--max-large-results",
            "1",
        ],
    );
    handshake(&mut peer).await;
    for id in [2, 3] {
        peer.send(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"big","arguments":{{}}}}}}"#
        ))
        .await;
    }
    for _ in 0..2 {
        let answer = peer.recv_json().await;
        assert!(
            answer.get("error").is_none(),
            "a large result was refused: {}",
            answer["error"]
        );
        let text = answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or("");
        assert!(text.starts_with("a line of a large result"), "{answer}");
    }
}
