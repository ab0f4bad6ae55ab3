//! Shared by the latency benchmarks: a minimal stdio MCP responder (the bench binary itself in
//! server mode), a blocking line client for it, and the percentile report.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

pub const SERVE_ENV: &str = "MCP_BUDGET_BENCH_SERVE";
pub const ROUNDS: usize = 4;
pub const CALLS_PER_ROUND: usize = 1500;
pub const WARMUP: usize = 500;

/// A tools/call request with this id, as the benchmarks send it.
pub fn request(id: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"stream_detail","arguments":{{"stream_id":"st-0042"}},"_meta":{{"progressToken":{id}}}}}}}"#
    )
}

/// The same request as [`request`], in the 2026-07-28 era: its `_meta` says the version, the
/// client's capabilities and name (no session).
pub fn modern_request(id: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"stream_detail","arguments":{{"stream_id":"st-0042"}},"_meta":{{"progressToken":{id},"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}},"io.modelcontextprotocol/clientInfo":{{"name":"bench","version":"1"}}}}}}}}"#
    )
}

/// Server mode: answer every request with a small tool result carrying its id.
pub fn serve() {
    let stdin = std::io::stdin();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return };
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let Some(id) = message.get("id") else {
            continue;
        };
        let reply = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{{\"stream_id\":\"st-0042\",\"state\":\"running\",\"owner\":\"agent-ada\",\"wave\":\"w4\"}}"}}],"structuredContent":{{"stream_id":"st-0042","state":"running","owner":"agent-ada","wave":"w4"}},"isError":false}}}}"#
        );
        if writeln!(out, "{reply}").and_then(|()| out.flush()).is_err() {
            return;
        }
    }
}

pub struct Session {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
    line: String,
}

impl Session {
    pub fn start(mut command: Command) -> Session {
        let mut child = command
            .env(SERVE_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the bench server");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Session {
            child,
            stdin,
            stdout,
            next_id: 1,
            line: String::new(),
        }
    }

    pub fn call(&mut self) -> Duration {
        let id = self.next_id;
        self.next_id += 1;
        let request = request(id);
        let start = Instant::now();
        self.stdin.write_all(request.as_bytes()).expect("write");
        self.stdin.write_all(b"\n").expect("write");
        self.stdin.flush().expect("flush");
        self.line.clear();
        self.stdout.read_line(&mut self.line).expect("read");
        let elapsed = start.elapsed();
        assert!(
            self.line.contains(&format!(r#""id":{id},"#)),
            "unexpected reply: {}",
            self.line
        );
        elapsed
    }

    /// The process this session talks to.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stop(mut self) {
        drop(self.stdin);
        let _ = self.child.wait();
    }
}

/// The initialize request the HTTP benchmarks open a session with.
pub const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}"#;

/// Starts `command` (an `mcp-budget --listen` or a bare relay that prints "listening on URL"),
/// opens a session with `initialize`; the process, its URL, a client, and the session id.
pub async fn listen_and_initialize(
    mut command: tokio::process::Command,
) -> (tokio::process::Child, String, reqwest::Client, String) {
    use tokio::io::AsyncBufReadExt;
    let mut proxy = command
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the proxy");
    let mut lines = tokio::io::BufReader::new(proxy.stdout.take().expect("stdout")).lines();
    let line = lines.next_line().await.expect("read").expect("a line");
    let url = line.trim_start_matches("listening on ").to_string();
    let client = reqwest::Client::new();
    let response = client
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(INIT)
        .send()
        .await
        .expect("initialize");
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .expect("session")
        .to_string();
    let _ = response.bytes().await;
    (proxy, url, client, session)
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

pub fn report(name: &str, samples: &mut [Duration]) -> Duration {
    samples.sort();
    let total: Duration = samples.iter().sum();
    let p50 = percentile(samples, 0.50);
    println!(
        "{name:<22} p50 {:>7.1} µs   p99 {:>7.1} µs   {:>8.0} calls/s   ({} calls)",
        p50.as_secs_f64() * 1e6,
        percentile(samples, 0.99).as_secs_f64() * 1e6,
        samples.len() as f64 / total.as_secs_f64(),
        samples.len()
    );
    p50
}
