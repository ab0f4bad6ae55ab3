//! Shared by the latency benchmarks: a minimal stdio MCP responder (the bench binary itself in
//! server mode), a blocking line client for it, and the percentile report.
#![allow(dead_code)]

pub mod floors;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

pub const SERVE_ENV: &str = "MCP_BUDGET_BENCH_SERVE";
/// Relay mode: the bench binary is a bare relay (`stdio`: to itself in server mode; the HTTP
/// bench has other modes).
pub const BARE_ENV: &str = "MCP_BUDGET_BENCH_BARE";
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

/// The CPU time a process's threads have used (`/proc/<pid>/task/*/schedstat`).
pub fn cpu(pid: u32) -> Duration {
    let mut total = 0u64;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) {
                total += text
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    Duration::from_nanos(total)
}

/// This binary in server mode, as a relay's child: its stdin and stdout piped.
pub fn server_command() -> Command {
    let mut command = Command::new(std::env::current_exe().expect("own path"));
    command
        .env_remove(BARE_ENV)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    command
}

/// The floor of a stdio relay: this binary in server mode as its child, lines copied each way
/// by a blocking thread (no protocol work, no runtime), the shape of a `poll` + read/write relay
/// in C.
pub fn bare_stdio_relay() {
    let mut child = server_command().spawn().expect("spawn the server");
    let mut to_child = child.stdin.take().expect("stdin");
    let mut from_child = BufReader::new(child.stdout.take().expect("stdout"));
    std::thread::spawn(move || {
        let mut out = std::io::stdout().lock();
        let mut answer = Vec::new();
        loop {
            answer.clear();
            if from_child.read_until(b'\n', &mut answer).unwrap_or(0) == 0 {
                return;
            }
            if out.write_all(&answer).and_then(|()| out.flush()).is_err() {
                return;
            }
        }
    });
    let mut input = std::io::stdin().lock();
    let mut line = Vec::new();
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line).unwrap_or(0) == 0 {
            break;
        }
        if to_child
            .write_all(&line)
            .and_then(|()| to_child.flush())
            .is_err()
        {
            break;
        }
    }
    drop(to_child);
    let _ = child.wait();
}
