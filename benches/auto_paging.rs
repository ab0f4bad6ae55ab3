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

#[path = "support/text.rs"]
mod text;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use text::{Peer, TEXT_ENV, follow, median, serve};

const BYTES: usize = 3_000_000;
const ROUNDS: usize = 5;

/// The time to read the whole text directly, and its length.
fn direct(me: &Path) -> (Duration, usize) {
    let mut peer = Peer::start(Command::new(me), "bench", BYTES);
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
    let mut peer = [Peer::start(command, client, BYTES)];
    if warm {
        follow(&mut peer);
    }
    let before = peer[0].memory().0;
    let start = Instant::now();
    let chain = follow(&mut peer);
    let elapsed = start.elapsed();
    let (_, peak) = peer[0].memory();
    (elapsed, chain.pages, chain.text.len(), (before, peak))
}

fn main() {
    if let Some(bytes) = std::env::var_os(TEXT_ENV) {
        serve(bytes.to_string_lossy().parse().unwrap_or(BYTES));
        return;
    }
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
