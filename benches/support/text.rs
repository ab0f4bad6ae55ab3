//! Shared by the paging benchmarks (`auto_paging`, `shared_cache`): a stdio server (the bench
//! binary itself in server mode) whose one tool, `read`, answers a text of log lines, and a
//! blocking line client that follows the proxy's page chain, on one proxy or round-robin over
//! several.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Server mode: set to the text's size in bytes.
pub const TEXT_ENV: &str = "MCP_BUDGET_BENCH_TEXT";

/// The text `serve` answers, `bytes` long or a line more.
pub fn text(bytes: usize) -> String {
    let mut text = String::with_capacity(bytes + 128);
    let mut i = 0;
    while text.len() < bytes {
        text.push_str(&format!(
            "2026-11-20T12:00:{:02}Z worker-{} stream st-{:04} state ok, gate passed by reviewer {} line {i}\n",
            i % 60,
            i % 7,
            i % 240,
            i % 13
        ));
        i += 1;
    }
    text
}

/// Server mode: a legacy stdio server with one read-only tool answering [`text`].
pub fn serve(bytes: usize) {
    let text = text(bytes);
    let stdin = std::io::stdin();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for request in stdin.lock().lines() {
        let Ok(request) = request else { return };
        let Ok(message) = serde_json::from_str::<Value>(&request) else {
            continue;
        };
        let Some(id) = message.get("id") else {
            continue;
        };
        let result = match message["method"].as_str() {
            Some("initialize") => {
                json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "bench-text", "version": "1"}})
            }
            Some("tools/list") => {
                json!({"tools": [{"name": "read", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": true}}]})
            }
            _ => json!({"content": [{"type": "text", "text": text}]}),
        };
        let reply = json!({"jsonrpc": "2.0", "id": id, "result": result});
        if writeln!(out, "{reply}").and_then(|()| out.flush()).is_err() {
            return;
        }
    }
}

pub struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Peer {
    /// Started by a client that calls itself `client` in `initialize`; the server (if `command`
    /// starts one) answers `bytes` of text.
    pub fn start(mut command: Command, client: &str, bytes: usize) -> Peer {
        command.env(TEXT_ENV, bytes.to_string());
        let mut peer = Peer::spawn(command, client);
        peer.request("tools/list", json!({}));
        peer
    }

    /// `command` started and initialized by a client that calls itself `client`.
    pub fn spawn(mut command: Command, client: &str) -> Peer {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut peer = Peer {
            child,
            stdin,
            stdout,
            next_id: 0,
        };
        peer.request("initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": client, "version": "1"}}));
        peer.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        peer
    }

    /// The process's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// One message, written as it is (for requests whose answers are read later).
    pub fn send(&mut self, message: &Value) {
        writeln!(self.stdin, "{message}").expect("write");
        self.stdin.flush().expect("flush");
    }

    /// The next line the process writes.
    pub fn line(&mut self) -> String {
        let mut line = String::new();
        let read = self.stdout.read_line(&mut line).expect("read");
        assert!(read > 0, "the process closed its output");
        line
    }

    /// One request, and its `result` (panics on an error: a bench measures working paths).
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let request =
            json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        self.send(&request);
        let line = self.line();
        let mut message: Value = serde_json::from_str(&line).expect("JSON");
        assert!(
            message.get("error").is_none(),
            "{method} failed: {}",
            message["error"]
        );
        message["result"].take()
    }

    /// Memory of the process: (current RSS, peak RSS) in KiB.
    pub fn memory(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What following one chain took.
pub struct Chain {
    pub pages: usize,
    /// The text of every page, in order.
    pub text: String,
    /// The first call (the whole result read, cut, and for a shared cache written).
    pub first: Duration,
    /// Every later page, together.
    pub rest: Duration,
}

/// Follows the chain of `read` from its first page, page `k` on `peers[k % peers.len()]`.
pub fn follow(peers: &mut [Peer]) -> Chain {
    let n = peers.len();
    follow_routed(peers, |k| k % n)
}

/// Follows the chain of `read` from its first page, page `k` on `peers[route(k)]`.
pub fn follow_routed(peers: &mut [Peer], route: impl Fn(usize) -> usize) -> Chain {
    let mut after: Option<String> = None;
    let mut chain = Chain {
        pages: 0,
        text: String::new(),
        first: Duration::ZERO,
        rest: Duration::ZERO,
    };
    loop {
        let mut arguments = json!({});
        if let Some(cursor) = &after {
            arguments["after"] = json!(cursor);
        }
        let peer = &mut peers[route(chain.pages)];
        let start = Instant::now();
        let result = peer.request(
            "tools/call",
            json!({"name": "read", "arguments": arguments}),
        );
        let took = start.elapsed();
        if chain.pages == 0 {
            chain.first = took;
        } else {
            chain.rest += took;
        }
        let blocks = result["content"].as_array().expect("blocks");
        chain.pages += 1;
        chain
            .text
            .push_str(blocks[0]["text"].as_str().unwrap_or(""));
        let notice = blocks.last().and_then(|b| b["text"].as_str()).unwrap_or("");
        after = notice
            .split("after:\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .map(String::from);
        if after.is_none() {
            return chain;
        }
    }
}

/// The median of `v` (sorted in place).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
