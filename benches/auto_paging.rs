//! Automatic paging of a large text, side by side in one run: the whole chain of pages of a
//! 3 MB text through the proxy (no policy) against one direct read of the whole text, and the
//! proxy's peak memory against its memory before the chain; the chain of a text rule (20,000-
//! byte pages, as policies/filesystem.toml pages files) against the same direct read. Then the cost of a token budget:
//! the same chain for Claude Code (50,000 bytes and 25,000 o200k tokens a page, so every page
//! is counted) against a byte budget of the same 50,000 bytes.
//!
//! Run with `cargo bench --bench auto_paging`. The server is this binary in server mode: it
//! answers every `tools/call` with a text of `MCP_BUDGET_BENCH_TEXT` bytes of log lines.
//! Set `MCP_BUDGET_BASELINE_BIN` to another build to measure it side by side.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const TEXT_ENV: &str = "MCP_BUDGET_BENCH_TEXT";
const BYTES: usize = 3_000_000;
const ROUNDS: usize = 5;

fn serve(bytes: usize) {
    let mut text = String::with_capacity(bytes);
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

struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Peer {
    fn start(command: Command) -> Peer {
        Peer::start_as(command, "bench")
    }

    /// Started by a client that calls itself `client` in `initialize`.
    fn start_as(mut command: Command, client: &str) -> Peer {
        let mut child = command
            .env(TEXT_ENV, BYTES.to_string())
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
        writeln!(
            peer.stdin,
            r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#
        )
        .expect("write");
        peer.request("tools/list", json!({}));
        peer
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let request =
            json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        writeln!(self.stdin, "{request}").expect("write");
        self.stdin.flush().expect("flush");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read");
        let message: Value = serde_json::from_str(&line).expect("JSON");
        message["result"].clone()
    }

    /// Memory of the process: (current RSS, peak RSS) in KiB.
    fn memory(&self) -> (u64, u64) {
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

/// The time to read the whole text directly, and its length.
fn direct(me: &Path) -> (Duration, usize) {
    let mut peer = Peer::start(Command::new(me));
    let start = Instant::now();
    let result = peer.request("tools/call", json!({"name": "read", "arguments": {}}));
    let elapsed = start.elapsed();
    let text = result["content"][0]["text"].as_str().expect("text");
    (elapsed, text.len())
}

/// The time to follow the whole chain through `proxy`; pages, bytes, and the proxy's memory
/// (RSS before the chain, peak RSS) in KiB.
fn chained(proxy: &Path, me: &Path) -> (Duration, usize, usize, (u64, u64)) {
    chained_as(proxy, me, &[], "bench", false)
}

/// [`chained`], with `options` before `--`, for a client called `client`; `warm`: the chain is
/// followed once before the one measured (the steady state of a session).
fn chained_as(
    proxy: &Path,
    me: &Path,
    options: &[&str],
    client: &str,
    warm: bool,
) -> (Duration, usize, usize, (u64, u64)) {
    let mut command = Command::new(proxy);
    command.args(options).arg("--").arg(me);
    let mut peer = Peer::start_as(command, client);
    if warm {
        follow(&mut peer);
    }
    let before = peer.memory().0;
    let start = Instant::now();
    let (pages, bytes) = follow(&mut peer);
    let elapsed = start.elapsed();
    let (_, peak) = peer.memory();
    (elapsed, pages, bytes, (before, peak))
}

/// Follows the chain of `read` from its first page; pages and text bytes.
fn follow(peer: &mut Peer) -> (usize, usize) {
    let mut after: Option<String> = None;
    let (mut pages, mut bytes) = (0, 0);
    loop {
        let mut arguments = json!({});
        if let Some(cursor) = &after {
            arguments["after"] = json!(cursor);
        }
        let result = peer.request(
            "tools/call",
            json!({"name": "read", "arguments": arguments}),
        );
        let blocks = result["content"].as_array().expect("blocks");
        pages += 1;
        bytes += blocks[0]["text"].as_str().map_or(0, str::len);
        let notice = blocks.last().and_then(|b| b["text"].as_str()).unwrap_or("");
        after = notice
            .split("after:\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .map(String::from);
        if after.is_none() {
            return (pages, bytes);
        }
    }
}

fn main() {
    if let Some(bytes) = std::env::var_os(TEXT_ENV) {
        serve(bytes.to_string_lossy().parse().unwrap_or(BYTES));
        return;
    }
    let _ = support::SERVE_ENV;
    let me = std::env::current_exe().expect("own path");
    let mut builds: Vec<(String, PathBuf)> = vec![(
        "this build".into(),
        PathBuf::from(env!("CARGO_BIN_EXE_mcp-budget")),
    )];
    if let Some(baseline) = std::env::var_os("MCP_BUDGET_BASELINE_BIN") {
        builds.push(("baseline".into(), PathBuf::from(baseline)));
    }
    // A byte budget the size of Claude Code's, for a client the policy adds.
    let policy = std::env::temp_dir().join(format!("mcp-budget-bench-{}.toml", std::process::id()));
    std::fs::write(&policy, "[client.\"bench-bytes\"]\nmax_bytes = 50000\n").expect("policy");
    let policy_arg = policy.to_string_lossy().to_string();
    // A text rule, as policies/filesystem.toml has for read_text_file: 20,000-byte pages.
    let rule =
        std::env::temp_dir().join(format!("mcp-budget-bench-rule-{}.toml", std::process::id()));
    std::fs::write(
        &rule,
        "[[tool]]\nname = \"read\"\n[tool.text]\npage_bytes = 20000\n",
    )
    .expect("policy");
    let rule_arg = rule.to_string_lossy().to_string();
    let mut rule_times: Vec<Vec<f64>> = builds.iter().map(|_| Vec::new()).collect();
    let mut rule_pages = vec![0; builds.len()];
    let this = PathBuf::from(env!("CARGO_BIN_EXE_mcp-budget"));
    let (mut bytes_times, mut tokens_times, mut cold_times) = (Vec::new(), Vec::new(), Vec::new());
    let mut budget_pages = (0, 0);
    let mut direct_times = Vec::new();
    let mut chain_times: Vec<Vec<f64>> = builds.iter().map(|_| Vec::new()).collect();
    let mut summary = vec![String::new(); builds.len()];
    for round in 0..ROUNDS {
        let (d, length) = direct(&me);
        direct_times.push(d.as_secs_f64());
        for (k, (name, bin)) in builds.iter().enumerate() {
            let (t, pages, bytes, (before, peak)) = chained(bin, &me);
            chain_times[k].push(t.as_secs_f64());
            eprintln!(
                "round {round} {name}: chain of {pages} pages ({bytes} of {length} bytes) in {:.1} ms; direct read {:.1} ms; proxy RSS {before} KiB before, peak {peak} KiB",
                t.as_secs_f64() * 1e3,
                d.as_secs_f64() * 1e3
            );
            summary[k] = format!(
                "{pages} pages, {bytes} bytes; proxy RSS {:.1} MiB before the chain, peak {:.1} MiB",
                before as f64 / 1024.0,
                peak as f64 / 1024.0
            );
        }
        for (k, (name, bin)) in builds.iter().enumerate() {
            let rule_options = ["--policy", rule_arg.as_str()];
            let (t, pages, bytes, _) = chained_as(bin, &me, &rule_options, "bench", false);
            assert_eq!(bytes, length, "the rule chain lost bytes");
            eprintln!(
                "round {round} {name}: rule chain of {pages} pages in {:.1} ms",
                t.as_secs_f64() * 1e3
            );
            rule_times[k].push(t.as_secs_f64());
            rule_pages[k] = pages;
        }
        let options = ["--policy", policy_arg.as_str()];
        let (b, b_pages, b_bytes, _) = chained_as(&this, &me, &options, "bench-bytes", true);
        let (t, t_pages, t_bytes, _) = chained_as(&this, &me, &options, "claude-code", true);
        let (cold, _, _, _) = chained_as(&this, &me, &options, "claude-code", false);
        assert_eq!((b_bytes, t_bytes), (length, length), "a chain lost bytes");
        eprintln!(
            "round {round} 50,000-byte budget: {b_pages} pages in {:.1} ms; claude-code (50,000 bytes, 25,000 tokens): {t_pages} pages in {:.1} ms ({:.1} ms in a new proxy, the tokenizer loading)",
            b.as_secs_f64() * 1e3,
            t.as_secs_f64() * 1e3,
            cold.as_secs_f64() * 1e3
        );
        bytes_times.push(b.as_secs_f64());
        tokens_times.push(t.as_secs_f64());
        cold_times.push(cold.as_secs_f64());
        budget_pages = (b_pages, t_pages);
    }
    let _ = std::fs::remove_file(&policy);
    let _ = std::fs::remove_file(&rule);
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let d = median(&mut direct_times);
    println!("a {BYTES}-byte text, {ROUNDS} rounds (medians):");
    println!("  one direct read of the whole text   {:.1} ms", d * 1e3);
    for (k, (name, _)) in builds.iter().enumerate() {
        let t = median(&mut chain_times[k]);
        println!(
            "  {name}: the whole chain through the proxy {:.1} ms = {:.2}× the direct read (target ≤ 3×); {}",
            t * 1e3,
            t / d,
            summary[k]
        );
    }
    for (k, (name, _)) in builds.iter().enumerate() {
        let t = median(&mut rule_times[k]);
        println!(
            "  {name}: the rule chain (a text rule, 20,000-byte pages: {} pages) {:.1} ms = {:.2}× the direct read (target ≤ 3×)",
            rule_pages[k],
            t * 1e3,
            t / d
        );
    }
    let (b, t, cold) = (
        median(&mut bytes_times),
        median(&mut tokens_times),
        median(&mut cold_times),
    );
    println!(
        "  token budget (a session's second chain): claude-code (50,000 bytes and 25,000 o200k tokens a page) {:.1} ms, {} pages, against a 50,000-byte budget {:.1} ms, {} pages = {:.2}×; the first chain of a new proxy {:.1} ms (the tokenizer loads)",
        t * 1e3,
        budget_pages.1,
        b * 1e3,
        budget_pages.0,
        t / b,
        cold * 1e3
    );
}
