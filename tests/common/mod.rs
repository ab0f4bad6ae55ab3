//! Test support: paths to the built binaries and a raw line-speaking peer over a child's stdio.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};

/// How long a test waits for a line before declaring the peer hung.
pub const PATIENCE: Duration = Duration::from_secs(20);

pub fn proxy_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mcp-budget"))
}

/// An example binary built by `cargo test` next to the test binaries.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is not built; run the tests with `cargo test`",
        path.display()
    );
    path
}

/// A process we talk to line by line on its stdin/stdout.
pub struct Peer {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    stderr: Option<ChildStderr>,
}

impl Peer {
    pub fn spawn(program: impl Into<PathBuf>, args: &[&str]) -> Peer {
        let mut command = Command::new(program.into());
        command.args(args);
        Peer::from_command(command)
    }

    /// Starts a prepared command with piped stdio.
    pub fn from_command(mut command: Command) -> Peer {
        let program = command.as_std().get_program().to_owned();
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take();
        Peer {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            stderr,
        }
    }

    /// The quirky test server, directly.
    pub fn quirky() -> Peer {
        Peer::spawn(example("quirky_server"), &[])
    }

    /// mcp-budget with `options`, in front of `server`.
    pub fn proxy(options: &[&str], server: &[&str]) -> Peer {
        let mut args: Vec<&str> = options.to_vec();
        args.push("--");
        args.extend_from_slice(server);
        Peer::spawn(proxy_bin(), &args)
    }

    pub async fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        stdin.write_all(line.as_bytes()).await.expect("write");
        stdin.write_all(b"\n").await.expect("write");
        stdin.flush().await.expect("flush");
    }

    pub async fn send_bytes(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        stdin.write_all(bytes).await.expect("write");
        stdin.flush().await.expect("flush");
    }

    /// The next line; panics if none comes within `PATIENCE`.
    pub async fn recv(&mut self) -> String {
        match tokio::time::timeout(PATIENCE, self.lines.next_line()).await {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) => panic!("peer closed its output while a line was expected"),
            Ok(Err(e)) => panic!("read error: {e}"),
            Err(_) => panic!("no line within {PATIENCE:?}: the peer hung"),
        }
    }

    pub async fn recv_json(&mut self) -> serde_json::Value {
        let line = self.recv().await;
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// Reads until end of output; returns the lines that were still to come.
    pub async fn rest(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        loop {
            match tokio::time::timeout(PATIENCE, self.lines.next_line()).await {
                Ok(Ok(Some(line))) => out.push(line),
                Ok(Ok(None)) | Ok(Err(_)) => return out,
                Err(_) => panic!("output did not end within {PATIENCE:?}"),
            }
        }
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    pub async fn wait(&mut self) -> ExitStatus {
        tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("process did not exit in time")
            .expect("wait")
    }

    /// The process's stderr, line by line, as it writes it.
    pub fn stderr_lines(&mut self) -> Lines<BufReader<ChildStderr>> {
        BufReader::new(self.stderr.take().expect("stderr not taken yet")).lines()
    }

    /// Everything the process wrote to stderr (call after it exited).
    pub async fn stderr(&mut self) -> String {
        let mut text = String::new();
        if let Some(mut stderr) = self.stderr.take() {
            let _ = tokio::time::timeout(PATIENCE, stderr.read_to_string(&mut text)).await;
        }
        text
    }
}

pub const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"sampling":{}},"clientInfo":{"name":"raw-test","version":"0"}}}"#;
pub const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

/// Sends initialize + initialized and returns the initialize response line.
pub async fn handshake(peer: &mut Peer) -> String {
    peer.send(INITIALIZE).await;
    let response = peer.recv().await;
    peer.send(INITIALIZED).await;
    response
}

/// Whether a process is still alive (a zombie counts as gone).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits (bounded) until `pid` is gone; returns whether it went.
pub async fn gone(pid: u32) -> bool {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while tokio::time::Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The pids of `pid`'s children (from every thread of it).
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
                out.extend(
                    list.split_whitespace()
                        .filter_map(|p| p.parse::<u32>().ok()),
                );
            }
        }
    }
    out
}

/// Waits (bounded) for `pid` to have a child and returns its pid.
pub async fn wait_for_child(pid: u32) -> u32 {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while tokio::time::Instant::now() < deadline {
        if let Some(child) = children(pid).first() {
            return *child;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("process {pid} started no child");
}

/// mcp-budget listening on 127.0.0.1:0 with `args` (then `--` and the server, if any) and
/// extra environment; returns the process and the URL it printed.
pub async fn listen(args: &[&str], env: &[(&str, &str)]) -> (tokio::process::Child, String) {
    let mut command = Command::new(proxy_bin());
    command
        .args(["--listen", "http://127.0.0.1:0/mcp"])
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("start mcp-budget --listen");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .expect("the listening line in time")
        .expect("read")
        .expect("a line");
    let url = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line}"))
        .to_string();
    (child, url)
}

/// A POST of one JSON-RPC message to an MCP endpoint, accepting JSON or SSE.
pub fn mcp_post(
    client: &reqwest::Client,
    url: &str,
    session: Option<&str>,
    body: &str,
) -> reqwest::RequestBuilder {
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_string());
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    request
}

/// GET of a session's event stream, resumed from `last` when given.
pub async fn mcp_get(
    client: &reqwest::Client,
    url: &str,
    session: &str,
    last: Option<&str>,
) -> reqwest::Response {
    let mut request = client
        .get(url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", session);
    if let Some(last) = last {
        request = request.header("last-event-id", last);
    }
    request.send().await.expect("GET")
}

/// `initialize` then `notifications/initialized` over HTTP; the session id.
pub async fn mcp_initialize(client: &reqwest::Client, url: &str) -> String {
    mcp_initialize_with(client, url, INITIALIZE).await
}

/// [`mcp_initialize`] with this `initialize` request.
pub async fn mcp_initialize_with(client: &reqwest::Client, url: &str, initialize: &str) -> String {
    let response = mcp_post(client, url, None, initialize)
        .send()
        .await
        .expect("initialize");
    assert_eq!(response.status(), 200);
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .expect("session id")
        .to_string();
    let _ = response.text().await;
    let ack = mcp_post(client, url, Some(&session), INITIALIZED)
        .send()
        .await
        .expect("initialized");
    assert_eq!(ack.status(), 202);
    session
}

/// `mcp-budget --policy P -- mcp-budget replay FILE`: a recorded server behind a policy (with
/// `MCP_BUDGET_TEST_KEY` set, for policies that share their cursor key through it).
pub fn replay_behind(policy: &std::path::Path, recording: &std::path::Path) -> Peer {
    let bin = proxy_bin();
    let mut command = Command::new(&bin);
    command
        .env("MCP_BUDGET_TEST_KEY", "k")
        .arg("--policy")
        .arg(policy)
        .arg("--")
        .arg(&bin)
        .arg("replay")
        .arg(recording);
    Peer::from_command(command)
}

/// Runs the mcp-budget binary to completion.
pub fn run<I, S>(args: I) -> std::process::Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    std::process::Command::new(proxy_bin())
        .args(args)
        .output()
        .expect("run mcp-budget")
}

/// Runs the mcp-budget binary, asserts it succeeded, and returns its stdout.
pub fn run_ok<I, S>(args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let out = run(args);
    assert!(
        out.status.success(),
        "mcp-budget failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// A memory figure of a process from `/proc/<pid>/status`, in bytes (`VmHWM`: peak resident
/// set; `VmRSS`: resident set now).
pub fn memory(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches(" kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kib| kib * 1024)
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// One raw HTTP/1.1 exchange: writes `request` and reads until the server closes the
/// connection or `PATIENCE` runs out; returns what the server sent.
pub async fn raw_http(addr: &str, request: &[u8]) -> String {
    use tokio::net::TcpStream;
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write request");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// `host:port` of an http URL.
pub fn authority(url: &str) -> String {
    let rest = url.strip_prefix("http://").expect("an http URL");
    rest.split('/').next().expect("authority").to_string()
}

/// A `tools/list` line through the proxy, without what automatic paging adds (`after`, the
/// continuation's properties, and the search tool).
pub fn without_auto_after(line: &str) -> String {
    let after = format!(
        r#""after":{}"#,
        serde_json::json!({"type": "string", "description": mcp_budget::budget::descriptor::AUTO_AFTER})
    );
    let continuation: Vec<String> = mcp_budget::budget::descriptor::continuation_properties()
        .into_iter()
        .map(|(name, value)| format!("{}:{value}", serde_json::Value::from(name)))
        .collect();
    let continuation = continuation.join(",");
    let own = after.replacen(r#""after""#, r#""mcp_budget_after""#, 1);
    line.replace(&format!(r#""properties":{{{after}}},"#), "")
        .replace(&format!("{after},"), "")
        .replace(&format!("{own},"), "")
        .replace(&format!(r#""properties":{{{continuation}}},"#), "")
        .replace(&format!("{continuation},"), "")
        .replace(&format!(",{}", mcp_budget::search::descriptor()), "")
}

/// An rmcp Streamable HTTP server (dual-era) on 127.0.0.1:0 serving the handlers `make` makes;
/// its URL.
pub async fn rmcp_http<S>(make: impl Fn() -> S + Send + Sync + 'static) -> String
where
    S: rmcp::ServerHandler + Send + 'static,
{
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let service = StreamableHttpService::new(
        move || Ok(make()),
        std::sync::Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_sse_keep_alive(None),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://{addr}/mcp")
}

/// The continuation of a page, wherever the proxy put it: `structuredContent.next_after`, the
/// `_meta` continuation (a list), the envelope of an items page written as JSON text, or the
/// `after:"…"` of a notice block.
pub fn continuation(result: &serde_json::Value) -> Option<String> {
    if let Some(next) = result["structuredContent"]["next_after"].as_str() {
        return Some(next.to_string());
    }
    if let Some(next) = result["_meta"]["mcp-budget/continuation"]["next_after"].as_str() {
        return Some(next.to_string());
    }
    for block in result["content"].as_array()? {
        let text = block["text"].as_str().unwrap_or_default();
        if let Ok(doc) = serde_json::from_str::<serde_json::Value>(text)
            && let Some(next) = doc["next_after"].as_str()
        {
            return Some(next.to_string());
        }
        if let Some(at) = text.find("after:\"") {
            let rest = &text[at + 7..];
            return rest.find('"').map(|end| rest[..end].to_string());
        }
    }
    None
}

/// The last JSON-RPC message of an HTTP response body (JSON, or an SSE stream).
pub fn last_message(text: &str) -> serde_json::Value {
    if text.trim_start().starts_with('{') {
        return serde_json::from_str(text).unwrap();
    }
    let data = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .rfind(|d| !d.is_empty())
        .unwrap_or_else(|| panic!("no event in {text}"));
    serde_json::from_str(data).unwrap()
}

/// `--listen` in front of quirky (no policy), with two bearer tokens (`a-secret`, `b-secret`):
/// two principals.
pub async fn two_principals() -> (tokio::process::Child, String) {
    two_principals_with(&[]).await
}

/// [`two_principals`], with more options before the server's command.
pub async fn two_principals_with(options: &[&str]) -> (tokio::process::Child, String) {
    let quirky = example("quirky_server");
    let mut args = vec![
        "--policy",
        "none",
        "--auth-token-env",
        "TOKEN_A",
        "--auth-token-env",
        "TOKEN_B",
    ];
    args.extend_from_slice(options);
    args.extend(["--", quirky.to_str().unwrap()]);
    listen(&args, &[("TOKEN_A", "a-secret"), ("TOKEN_B", "b-secret")]).await
}

/// An SSE response's events, read as they come.
pub struct Events<S> {
    stream: S,
    seen: String,
}

impl<S> Events<S>
where
    S: futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin,
{
    pub fn new(stream: S) -> Events<S> {
        Events {
            stream,
            seen: String::new(),
        }
    }

    /// The first data line of the next event, as JSON ([`PATIENCE`] at most, a guard).
    pub async fn next(&mut self) -> serde_json::Value {
        use futures_util::StreamExt;
        loop {
            if let Some(end) = self.seen.find("\n\n") {
                let event: String = self.seen.drain(..end + 2).collect();
                if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data:")) {
                    return serde_json::from_str(data.trim()).expect("an event's data is JSON");
                }
                continue;
            }
            let chunk = tokio::time::timeout(PATIENCE, self.stream.next())
                .await
                .expect("an event in time")
                .expect("the stream is open")
                .expect("the stream reads");
            self.seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}
