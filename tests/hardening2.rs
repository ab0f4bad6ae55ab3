//! Attacks of the second round (issue #30), each through the real binary: the standalone
//! metrics endpoint (Host check, a connection cap and header timeout, tool names in labels), a
//! watched policy path that is not a regular file, an HTTP upstream that keeps a request's
//! stream resumable after the request is over, and hostile recordings. Memory is the peak
//! resident set (`VmHWM` from /proc, or the same kernel figure from `wait4` for a command
//! that has exited).

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{PATIENCE, Peer, example, handshake, memory, proxy_bin};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

const MIB: u64 = 1024 * 1024;
/// The peak resident set any command below may reach.
const PEAK_LIMIT: u64 = 256 * MIB;
/// A virtual-memory ceiling for a proxy fed hostile input: if it reads without bound, it
/// aborts here instead of taking the machine's memory.
const GUARD_KIB: u64 = 2 * 1024 * 1024;

fn quirky() -> String {
    example("quirky_server").to_str().unwrap().to_string()
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mcp-budget-hardening2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// `sh -c 'ulimit …; exec mcp-budget ARGS'`: the proxy under a file-descriptor limit and the
/// virtual-memory guard.
fn guarded(fds: Option<u32>, args: &[&str]) -> tokio::process::Command {
    let mut script = format!("ulimit -v {GUARD_KIB}; ");
    if let Some(fds) = fds {
        script.push_str(&format!("ulimit -n {fds}; "));
    }
    script.push_str("exec \"$0\" \"$@\"");
    let mut command = tokio::process::Command::new("sh");
    command.arg("-c").arg(script).arg(proxy_bin()).args(args);
    command
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Reads stderr lines until one contains `needle`; panics if none does within `PATIENCE`.
async fn stderr_until(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
    needle: &str,
) -> String {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match tokio::time::timeout_at(deadline, lines.next_line()).await {
            Ok(Ok(Some(line))) if line.contains(needle) => return line,
            Ok(Ok(Some(_))) => continue,
            Ok(_) => panic!("stderr ended before a line with {needle:?}"),
            Err(_) => panic!("no stderr line with {needle:?} within {PATIENCE:?}"),
        }
    }
}

// ---- 4. The standalone metrics endpoint -------------------------------------------------------

#[tokio::test]
async fn the_metrics_endpoint_checks_the_host_header() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut proxy = Peer::proxy(&["--metrics", &addr], &[&quirky()]);
    handshake(&mut proxy).await;
    let rebound = common::raw_http(
        &addr,
        b"GET /metrics HTTP/1.1\r\nhost: attacker.example:9464\r\nconnection: close\r\n\r\n",
    )
    .await;
    // Before: 200 with the metrics (tool names included) for any Host.
    assert!(rebound.starts_with("HTTP/1.1 403"), "{rebound}");
    assert!(rebound.contains("--allow-host"), "{rebound}");
    assert!(!rebound.contains("mcp_budget_"), "{rebound}");
    for host in [addr.as_str(), "localhost", "[::1]:9464"] {
        let request = format!("GET /metrics HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n");
        let answer = common::raw_http(&addr, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{host}: {answer}");
    }
    // --allow-host applies to it too.
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut proxy = Peer::proxy(
        &["--metrics", &addr, "--allow-host", "metrics.internal"],
        &[&quirky()],
    );
    handshake(&mut proxy).await;
    let answer = common::raw_http(
        &addr,
        b"GET /metrics HTTP/1.1\r\nhost: metrics.internal:9464\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn idle_metrics_connections_neither_exhaust_descriptors_nor_keep_clients_out() {
    let metrics_port = free_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    let mut command = guarded(
        Some(256),
        &[
            "--listen",
            "http://127.0.0.1:0/mcp",
            "--metrics",
            &metrics,
            "--header-timeout-secs",
            "30",
            "--",
            &quirky(),
        ],
    );
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let mut proxy = command.spawn().unwrap();
    let pid = proxy.id().unwrap();
    let stdout = proxy.stdout.take().unwrap();
    let line = tokio::time::timeout(PATIENCE, BufReader::new(stdout).lines().next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let url = line.strip_prefix("listening on ").unwrap().to_string();
    let baseline = fd_count(pid);
    // 300 idle connections to the metrics port, more than the proxy has descriptors for.
    let mut idle = Vec::new();
    for _ in 0..300 {
        if let Ok(stream) = tokio::net::TcpStream::connect(&metrics).await {
            idle.push(stream);
        }
    }
    // Each is accepted (held, or refused over the cap) before a scrape on a fresh connection
    // is answered: the listener takes connections in order.
    let scrape = tokio::time::timeout(
        PATIENCE,
        common::raw_http(
            &metrics,
            b"GET /metrics HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n",
        ),
    )
    .await
    .unwrap_or_default();
    let fds = fd_count(pid);
    // An MCP client still gets in and is served.
    let client = http();
    let initialize = common::mcp_post(&client, &url, None, common::INITIALIZE)
        .send()
        .await;
    let fds_after = fd_count(pid).max(fds);
    eprintln!(
        "300 idle metrics connections: fds {baseline} before, {fds_after} after; initialize: {}",
        initialize
            .as_ref()
            .map(|r| r.status().to_string())
            .unwrap_or_else(|e| e.to_string())
    );
    // Before: every connection kept an fd (256 = the limit) and initialize timed out.
    let response = initialize.expect("initialize through --listen");
    assert_eq!(response.status(), 200);
    assert!(
        fds_after <= baseline + 64 + 16,
        "{fds_after} fds (baseline {baseline})"
    );
    assert!(
        scrape.is_empty() || scrape.starts_with("HTTP/1.1 "),
        "{scrape}"
    );
    drop(idle);
}

#[tokio::test]
async fn idle_metrics_connections_are_closed_after_the_header_timeout() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut proxy = Peer::proxy(
        &["--metrics", &addr, "--header-timeout-secs", "1"],
        &[&quirky()],
    );
    handshake(&mut proxy).await;
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut buf = [0u8; 256];
    // Before: kept open forever (this read hit PATIENCE).
    let n = tokio::time::timeout(
        PATIENCE,
        tokio::io::AsyncReadExt::read(&mut stream, &mut buf),
    )
    .await
    .expect("the idle metrics connection was closed")
    .unwrap_or(0);
    let _ = n;
}

/// Checks `text` is a valid exposition (OpenMetrics text): every sample line is
/// `name{label="value",…} number`, label values escaped; returns the sample lines.
fn valid_exposition(text: &str) -> Vec<String> {
    assert!(text.ends_with("# EOF\n"), "no # EOF at the end");
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(comment) = line.strip_prefix("# ") {
            let kind = comment.split(' ').next().unwrap_or_default();
            assert!(
                ["HELP", "TYPE", "UNIT", "EOF"].contains(&kind),
                "not a valid comment line: {line:?}"
            );
            continue;
        }
        let bytes: Vec<char> = line.chars().collect();
        let mut i = 0;
        let name_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
        while i < bytes.len() && name_char(bytes[i]) {
            i += 1;
        }
        assert!(i > 0, "no metric name: {line:?}");
        if bytes.get(i) == Some(&'{') {
            i += 1;
            loop {
                let start = i;
                while i < bytes.len() && name_char(bytes[i]) {
                    i += 1;
                }
                assert!(i > start, "no label name: {line:?}");
                assert_eq!(bytes.get(i), Some(&'='), "{line:?}");
                assert_eq!(bytes.get(i + 1), Some(&'"'), "{line:?}");
                i += 2;
                loop {
                    match bytes.get(i) {
                        Some('\\') => {
                            assert!(
                                matches!(bytes.get(i + 1), Some('\\' | '"' | 'n')),
                                "bad escape: {line:?}"
                            );
                            i += 2;
                        }
                        Some('"') => {
                            i += 1;
                            break;
                        }
                        Some(_) => i += 1,
                        None => panic!("unterminated label value: {line:?}"),
                    }
                }
                match bytes.get(i) {
                    Some(',') => i += 1,
                    Some('}') => {
                        i += 1;
                        break;
                    }
                    _ => panic!("bad label set: {line:?}"),
                }
            }
        }
        assert_eq!(bytes.get(i), Some(&' '), "{line:?}");
        let rest: String = bytes[i + 1..].iter().collect();
        let value = rest.split(' ').next().unwrap_or_default();
        assert!(
            value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value),
            "bad value: {line:?}"
        );
        samples.push(line.to_string());
    }
    samples
}

const EVIL_TOOL: &str = "x\"} 1\nmcp_budget_active_sessions 31337\n#";

/// A stdio MCP server (Python) whose one tool has the name `EVIL_TOOL`.
fn evil_server() -> PathBuf {
    let path = temp("evil_server.py");
    let name = serde_json::to_string(EVIL_TOOL).unwrap();
    let script = format!(
        r#"import json, sys
NAME = {name}
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    if "id" not in msg or "method" not in msg:
        continue
    method = msg["method"]
    if method == "initialize":
        result = {{"protocolVersion": "2025-06-18", "capabilities": {{"tools": {{}}}}, "serverInfo": {{"name": "evil", "version": "1"}}}}
    elif method == "tools/list":
        result = {{"tools": [{{"name": NAME, "description": "d", "inputSchema": {{"type": "object"}}}}]}}
    elif method == "tools/call":
        result = {{"content": [{{"type": "text", "text": "ok"}}], "isError": False}}
    else:
        result = {{}}
    sys.stdout.write(json.dumps({{"jsonrpc": "2.0", "id": msg["id"], "result": result}}) + "\n")
    sys.stdout.flush()
"#
    );
    std::fs::write(&path, script).unwrap();
    path
}

#[tokio::test]
async fn a_tool_name_cannot_inject_metric_lines() {
    let server = evil_server();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut proxy = Peer::proxy(
        &["--metrics", &addr],
        &["python3", server.to_str().unwrap()],
    );
    handshake(&mut proxy).await;
    proxy
        .send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .await;
    let list = proxy.recv_json().await;
    assert_eq!(list["result"]["tools"][0]["name"], EVIL_TOOL);
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": EVIL_TOOL, "arguments": {}}});
    proxy.send(&call.to_string()).await;
    let answer = proxy.recv_json().await;
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    let text = common::raw_http(
        &addr,
        b"GET /metrics HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n",
    )
    .await;
    let (_, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    // A chunked body: take the exposition from its first line on.
    let body = body
        .split_once("\r\n")
        .map_or(body, |(_, rest)| rest)
        .rsplit_once("\r\n0\r\n")
        .map_or(body, |(exposition, _)| exposition);
    let body = body.strip_suffix("\r\n").unwrap_or(body);
    // Before: `mcp_budget_active_sessions 31337` stood as a line of its own.
    assert!(
        !body
            .lines()
            .any(|l| l.starts_with("mcp_budget_active_sessions 31337")),
        "an injected line: {body}"
    );
    let samples = valid_exposition(body);
    let escaped = r#"tool="x\"} 1\nmcp_budget_active_sessions 31337\n#""#;
    assert!(
        samples
            .iter()
            .any(|s| s.starts_with("mcp_budget_tool_calls_total{") && s.contains(escaped)),
        "{body}"
    );
}

// ---- 8. A watched policy path that is not a regular file --------------------------------------

const POLICY: &str = "[tools]\ndeny = [\"crash\"]\n";

/// The proxy with `--policy PATH --watch` in front of the quirky server, its stderr as lines.
async fn watched(
    path: &Path,
) -> (
    Peer,
    tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
) {
    let mut command = guarded(
        None,
        &[
            "--policy",
            path.to_str().unwrap(),
            "--watch",
            "--",
            &quirky(),
        ],
    );
    command.env("RUST_LOG", "mcp_budget=info");
    let mut peer = Peer::from_command(command);
    let stderr = peer.stderr_lines();
    handshake(&mut peer).await;
    (peer, stderr)
}

async fn tool_names(peer: &mut Peer, id: u64) -> Vec<String> {
    peer.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}).to_string())
        .await;
    let list = loop {
        let message = peer.recv_json().await;
        if message["id"] == id {
            break message;
        }
    };
    list["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_watched_policy_replaced_by_a_fifo_is_refused_and_the_proxy_answers() {
    let path = temp("fifo-policy.toml");
    let _ = std::fs::remove_file(&path);
    std::fs::write(&path, POLICY).unwrap();
    let (mut peer, mut stderr) = watched(&path).await;
    assert!(!tool_names(&mut peer, 2).await.contains(&"crash".into()));
    std::fs::remove_file(&path).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap();
    assert!(made.success());
    // Before: the reload opened the FIFO and waited for a writer forever; no error came.
    let error = stderr_until(&mut stderr, "policy reload failed").await;
    assert!(error.contains("not a regular file"), "{error}");
    // The proxy still answers, under the old policy.
    peer.send(r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#)
        .await;
    assert_eq!(peer.recv().await, r#"{"jsonrpc":"2.0","id":3,"result":{}}"#);
    assert!(!tool_names(&mut peer, 4).await.contains(&"crash".into()));
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn a_watched_policy_replaced_by_dev_zero_or_a_huge_file_is_refused() {
    let path = temp("zero-policy.toml");
    let _ = std::fs::remove_file(&path);
    std::fs::write(&path, POLICY).unwrap();
    let (mut peer, mut stderr) = watched(&path).await;
    let pid = peer.child.id().unwrap();
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
    // Before: the reload read /dev/zero until the memory guard stopped the process.
    let error = stderr_until(&mut stderr, "policy reload failed").await;
    assert!(error.contains("not a regular file"), "{error}");
    peer.send(r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#)
        .await;
    assert_eq!(peer.recv().await, r#"{"jsonrpc":"2.0","id":3,"result":{}}"#);
    // A regular file over the bound: named in the error, the old policy stays.
    std::fs::remove_file(&path).unwrap();
    let mut huge = String::from(POLICY);
    huge.push('#');
    huge.push_str(&"x".repeat(2 * 1024 * 1024));
    huge.push('\n');
    std::fs::write(&path, huge).unwrap();
    let error = stderr_until(&mut stderr, "policy reload failed").await;
    assert!(error.contains("1 MiB"), "{error}");
    assert!(!tool_names(&mut peer, 4).await.contains(&"crash".into()));
    let peak = memory(pid, "VmHWM");
    assert!(peak < PEAK_LIMIT, "peak {} MiB", peak / MIB);
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn a_policy_that_is_not_a_regular_file_is_refused_at_startup() {
    for bad in ["/dev/zero", "/dev/stdin"] {
        let mut command = guarded(None, &["--policy", bad, "--", "true"]);
        command.stdin(Stdio::piped()).kill_on_drop(true);
        let child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Before: /dev/zero was read until the memory guard stopped the process.
        let out = tokio::time::timeout(PATIENCE, child.wait_with_output())
            .await
            .expect("the proxy ended")
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("not a regular file"), "{bad}: {stderr}");
        assert!(stderr.contains(bad), "{bad}: {stderr}");
    }
}

// ---- 10. The HTTP upstream stops resuming when the request is over ---------------------------

mod resume {
    use super::*;
    use wiremock::matchers::{body_partial_json, header_exists, method};
    use wiremock::{Mock, MockServer, Request, ResponseTemplate};

    fn sse(body: String) -> ResponseTemplate {
        ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
    }

    /// A server that ends every event stream at once, with a new event id and `retry: 5`:
    /// a request's answer never comes, and its stream can always be resumed.
    async fn server() -> MockServer {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(body_partial_json(json!({"method": "initialize"})))
            .respond_with(
                ResponseTemplate::new(200)
                    .insert_header("mcp-session-id", "s-1")
                    .set_body_raw(json!({"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "mock", "version": "1"}}}).to_string(), "application/json"),
            )
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(body_partial_json(json!({"method": "tools/call"})))
            .respond_with(sse("id: p-0\nretry: 5\ndata: \n\n".to_string()))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(body_partial_json(json!({"method": "ping"})))
            .respond_with(|request: &Request| {
                let ping: Value = serde_json::from_slice(&request.body).unwrap_or_default();
                ResponseTemplate::new(200).set_body_raw(
                    json!({"jsonrpc": "2.0", "id": ping["id"], "result": {}}).to_string(),
                    "application/json",
                )
            })
            .mount(&server)
            .await;
        // Notifications (initialized, cancelled): accepted.
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(202))
            .mount(&server)
            .await;
        let next = Arc::new(AtomicU64::new(1));
        Mock::given(method("GET"))
            .and(header_exists("last-event-id"))
            .respond_with(move |_: &Request| {
                let n = next.fetch_add(1, Ordering::Relaxed);
                sse(format!("id: p-{n}\nretry: 5\ndata: \n\n"))
            })
            .mount(&server)
            .await;
        // No stream for server-initiated messages.
        Mock::given(method("GET"))
            .respond_with(ResponseTemplate::new(405))
            .mount(&server)
            .await;
        server
    }

    async fn resumes(server: &MockServer) -> usize {
        server
            .received_requests()
            .await
            .unwrap_or_default()
            .iter()
            .filter(|r| {
                r.method == wiremock::http::Method::GET && r.headers.contains_key("last-event-id")
            })
            .count()
    }

    #[tokio::test]
    async fn a_timed_out_request_is_no_longer_resumed() {
        let server = server().await;
        let mut peer = Peer::spawn(
            proxy_bin(),
            &["--upstream", &server.uri(), "--request-timeout-secs", "1"],
        );
        handshake(&mut peer).await;
        for id in 2..5 {
            peer.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "wait", "arguments": {}}}).to_string())
                .await;
        }
        for _ in 2..5 {
            let timeout = peer.recv_json().await;
            assert!(
                timeout["error"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("--request-timeout-secs"),
                "{timeout}"
            );
        }
        let at_timeout = resumes(&server).await;
        // An observation window, not a deadline: what the proxy still asks for in it.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = resumes(&server).await - at_timeout;
        eprintln!("resumes: {at_timeout} before the timeouts, {after} in the 2 s after");
        // Before: ~450 a second went on. At most one resume per request may have been under
        // way when the request ended.
        assert!(after <= 3, "{after} resumes after the requests timed out");
        // The session still works.
        peer.send(r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"wait","arguments":{}}}"#)
            .await;
        let timeout = peer.recv_json().await;
        assert_eq!(timeout["id"], 9);
    }

    #[tokio::test]
    async fn a_cancelled_request_is_no_longer_resumed() {
        let server = server().await;
        let mut peer = Peer::spawn(proxy_bin(), &["--upstream", &server.uri()]);
        handshake(&mut peer).await;
        peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"wait","arguments":{}}}"#)
            .await;
        // Wait (bounded) until it is being resumed.
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while resumes(&server).await < 3 {
            assert!(tokio::time::Instant::now() < deadline, "never resumed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        peer.send(
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}"#,
        )
        .await;
        peer.send(r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#)
            .await;
        let _ = peer.recv().await;
        let at_cancel = resumes(&server).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = resumes(&server).await - at_cancel;
        eprintln!("resumes in the 2 s after a cancel: {after}");
        assert!(
            after <= 1,
            "{after} resumes after the request was cancelled"
        );
    }
}

// ---- 11. Hostile recordings --------------------------------------------------------------------

const HEADER: &str = r#"{"mcp_budget_recording":1,"version":"0.1.0","transport":"stdio→command"}"#;

/// Runs `mcp-budget ARGS` to its end under the memory guard, stdin from /dev/null; kills it
/// after `PATIENCE` (a hang guard). Returns its exit code, stderr and peak resident set (from
/// `wait4`: the kernel's figure that /proc shows as VmHWM).
fn run_bounded(args: &[&str]) -> (Option<i32>, String, u64) {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let err_path = temp(&format!("stderr-{}", RUNS.fetch_add(1, Ordering::Relaxed)));
    let err_file = std::fs::File::create(&err_path).unwrap();
    let mut script = format!("ulimit -v {GUARD_KIB}; ");
    script.push_str("exec \"$0\" \"$@\"");
    // Reaped by wait4 below, which also gives its peak resident set.
    #[allow(clippy::zombie_processes)]
    let child = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(proxy_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err_file)
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let deadline = std::time::Instant::now() + PATIENCE;
    let (status, usage) = loop {
        let mut status = 0;
        // SAFETY: a zeroed rusage is a valid value for wait4 to fill.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: pid is our own child; the pointers are to live locals.
        let got = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if got == pid {
            break (status, usage);
        }
        if std::time::Instant::now() > deadline {
            // SAFETY: killing our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
            panic!(
                "mcp-budget {args:?} did not finish within {PATIENCE:?}; stderr: {}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_file(&err_path);
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    (code, stderr, usage.ru_maxrss as u64 * 1024)
}

fn line(dir: &str, msg: Value) -> String {
    json!({"t": 0, "dir": dir, "msg": msg}).to_string()
}

/// `requests` tools/calls never answered, each with a progress token, then `progress` progress
/// notifications for tokens no request named.
fn unmatched_recording(name: &str, requests: usize, progress: usize) -> PathBuf {
    use std::io::Write;
    let path = temp(name);
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    writeln!(out, "{HEADER}").unwrap();
    for id in 0..requests {
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "t", "arguments": {"n": id}, "_meta": {"progressToken": format!("mine-{id}")}}});
        writeln!(out, "{}", line("c2s", msg)).unwrap();
    }
    for n in 0..progress {
        let msg = json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": format!("other-{n}"), "progress": n}});
        writeln!(out, "{}", line("s2c", msg)).unwrap();
    }
    // One answered call, so that report and suggest have something to measure.
    let call = json!({"jsonrpc": "2.0", "id": "last", "method": "tools/call", "params": {"name": "t", "arguments": {}}});
    writeln!(out, "{}", line("c2s", call)).unwrap();
    let answer = json!({"jsonrpc": "2.0", "id": "last", "result": {"content": [{"type": "text", "text": "done"}], "isError": false}});
    writeln!(out, "{}", line("s2c", answer)).unwrap();
    out.flush().unwrap();
    path
}

#[test]
fn unmatched_progress_and_unanswered_requests_are_read_in_linear_time() {
    // Before: 5,000 unmatched progress lines took 23 s, 10,000 took 85 s; 60,000 more than 45 s.
    let path = unmatched_recording("unmatched.jsonl", 60_000, 60_000);
    let file = path.to_str().unwrap();
    for command in [
        vec!["report", file],
        vec!["suggest", file],
        vec!["replay", file],
    ] {
        let started = std::time::Instant::now();
        let (code, stderr, peak) = run_bounded(&command);
        eprintln!(
            "{} on 60,000 unanswered + 60,000 unmatched progress: {:?}, peak {} MiB",
            command[0],
            started.elapsed(),
            peak / MIB
        );
        assert_eq!(code, Some(0), "{command:?}: {stderr}");
        assert!(peak < PEAK_LIMIT, "{command:?}: peak {} MiB", peak / MIB);
    }
}

#[test]
fn a_line_over_the_bound_is_refused_with_its_file_and_line() {
    use std::io::Write;
    let path = temp("huge-result.jsonl");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    writeln!(out, "{HEADER}").unwrap();
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t", "arguments": {}}});
    writeln!(out, "{}", line("c2s", call)).unwrap();
    write!(
        out,
        r#"{{"t":0,"dir":"s2c","msg":{{"jsonrpc":"2.0","id":1,"result":{{"content":[{{"type":"text","text":""#
    )
    .unwrap();
    let chunk = "y".repeat(1024 * 1024);
    for _ in 0..120 {
        out.write_all(chunk.as_bytes()).unwrap();
    }
    writeln!(out, r#""}}],"isError":false}}}}}}"#).unwrap();
    out.flush().unwrap();
    drop(out);
    let file = path.to_str().unwrap();
    for command in ["report", "suggest", "replay"] {
        let (code, stderr, peak) = run_bounded(&[command, file]);
        eprintln!(
            "{command} on a 120 MB line: {code:?}, peak {} MiB",
            peak / MIB
        );
        // Before: exit 0 (report, suggest) after reading it all, peak > 256 MiB.
        assert_eq!(code, Some(2), "{command}: {stderr}");
        assert!(
            stderr.contains(&format!("{file}:3:")),
            "{command}: {stderr}"
        );
        assert!(stderr.contains("64 MiB"), "{command}: {stderr}");
        assert!(peak < PEAK_LIMIT, "{command}: peak {} MiB", peak / MIB);
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_recording_that_is_not_a_regular_file_is_refused() {
    for command in ["report", "suggest", "replay"] {
        // Before: /dev/zero was read until the memory guard stopped the process.
        let (code, stderr, peak) = run_bounded(&[command, "/dev/zero"]);
        eprintln!("{command} /dev/zero: {code:?}, peak {} MiB", peak / MIB);
        assert_eq!(code, Some(2), "{command}: {stderr}");
        assert!(stderr.contains("/dev/zero"), "{command}: {stderr}");
        assert!(stderr.contains("not a regular file"), "{command}: {stderr}");
        assert!(peak < PEAK_LIMIT, "{command}: peak {} MiB", peak / MIB);
    }
}
