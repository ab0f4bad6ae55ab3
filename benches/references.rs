//! A result passed on by its reference, against the same argument written inline: the proxy's
//! own CPU a call for `write` whose `content` is the `result_ref` of a cached 1 MB text (the
//! proxy puts the text in its place, off the I/O threads), and for `write` whose `content` is
//! that text itself (the proxy reads and forwards 1 MB). Rounds alternate the two, on one
//! proxy (stdio → stdio, no policy, as claude-code); the target is ≤ 1.5× the inline call.
//!
//! Run with `cargo bench --bench references`. The server is this binary in server mode.
//! `MCP_BUDGET_BIN` measures another build of the proxy; `REFERENCES_BYTES` the text's size.

mod support;
#[path = "support/text.rs"]
mod text;

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::Command;

use serde_json::{Value, json};
use text::Peer;

const SERVE_ENV: &str = "MCP_BUDGET_REFERENCES_SERVE";
const ROUNDS: usize = 8;
const CALLS: usize = 20;

fn main() {
    let bytes: usize = std::env::var("REFERENCES_BYTES")
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or(1_000_000);
    if std::env::var_os(SERVE_ENV).is_some() {
        serve(bytes);
        return;
    }
    let proxy = std::env::var_os("MCP_BUDGET_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_mcp-budget")));
    let me = std::env::current_exe().expect("the bench's own path");
    let mut command = Command::new(&proxy);
    command
        .args(["--policy", "none", "--"])
        .arg(&me)
        .env(SERVE_ENV, "1")
        .env("REFERENCES_BYTES", bytes.to_string());
    let mut peer = Peer::spawn(command, "claude-code");
    peer.request("tools/list", json!({}));
    let page = peer.request("tools/call", json!({"name": "read", "arguments": {}}));
    let notice = page.to_string();
    let reference = notice
        .split("result_ref:\\\"")
        .nth(1)
        .and_then(|rest| rest.split("\\\"").next())
        .expect("a result_ref on the first page")
        .to_string();
    let whole = text::text(bytes);
    let by_reference = json!({"content": reference});
    let inline = json!({"content": whole});
    // Both give the server the same text.
    let a = peer.request(
        "tools/call",
        json!({"name": "write", "arguments": by_reference}),
    );
    let b = peer.request("tools/call", json!({"name": "write", "arguments": inline}));
    assert_eq!(a, b, "the reference did not give the server the text");
    let pid = peer.pid();
    let mut referenced = Vec::new();
    let mut written = Vec::new();
    for round in 0..ROUNDS {
        let mut run = |arguments: &Value| {
            let before = support::cpu(pid);
            for _ in 0..CALLS {
                peer.request(
                    "tools/call",
                    json!({"name": "write", "arguments": arguments}),
                );
            }
            (support::cpu(pid) - before).as_secs_f64() * 1e6 / CALLS as f64
        };
        // Alternated, and the order swapped every round.
        let (r, w) = if round % 2 == 0 {
            let r = run(&by_reference);
            (r, run(&inline))
        } else {
            let w = run(&inline);
            (run(&by_reference), w)
        };
        println!("round {round}: by reference {r:.0} µs CPU a call, inline {w:.0} µs");
        referenced.push(r);
        written.push(w);
    }
    let ratios: Vec<f64> = referenced
        .iter()
        .zip(&written)
        .map(|(r, w)| r / w)
        .collect();
    let mut sorted = ratios.clone();
    let median = text::median(&mut sorted);
    let (min, max) = (sorted[0], sorted[sorted.len() - 1]);
    println!(
        "a {bytes}-byte argument, the proxy's own CPU a call (median of {ROUNDS} rounds of {CALLS}): by reference {:.0} µs, inline {:.0} µs",
        text::median(&mut referenced),
        text::median(&mut written)
    );
    println!(
        "by reference ÷ inline: {min:.2} / {median:.2} / {max:.2}× (min / median / max; target ≤ 1.5×)"
    );
}

/// Server mode: `read` answers the text; `write` answers how long its `content` is and a
/// digest of it (so that both forms are checked to deliver the same text).
fn serve(bytes: usize) {
    let whole = text::text(bytes);
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
        let result = match (
            message["method"].as_str(),
            message["params"]["name"].as_str(),
        ) {
            (Some("initialize"), _) => {
                json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "bench-references", "version": "1"}})
            }
            (Some("tools/list"), _) => json!({"tools": [
                {"name": "read", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": true}},
                {"name": "write", "inputSchema": {"type": "object", "properties": {"content": {"type": "string"}}}},
            ]}),
            (_, Some("write")) => {
                let content = message["params"]["arguments"]["content"]
                    .as_str()
                    .unwrap_or("");
                let sum = content
                    .bytes()
                    .fold(0u64, |s, b| s.wrapping_mul(31).wrapping_add(u64::from(b)));
                json!({"content": [{"type": "text", "text": format!("{} bytes, sum {sum}", content.len())}]})
            }
            _ => json!({"content": [{"type": "text", "text": whole}]}),
        };
        let reply = json!({"jsonrpc": "2.0", "id": id, "result": result});
        if writeln!(out, "{reply}").and_then(|()| out.flush()).is_err() {
            return;
        }
    }
}
