//! `mcp_budget_search` over a cached result, side by side with its floors in one run:
//! - a regex over the lines of a cached 3 MB text (a rule pages it) against `grep -n -E` on the
//!   same bytes as a file (the process included: what a client that spills to a file pays);
//! - a JSONPath over the cached 11 MB fleet result against parsing that document once with
//!   serde_json (the floor of any JSONPath evaluation over it).
//!
//! Run with `cargo bench --bench search`. Both go through the relay exactly as in the proxy:
//! the call's first page puts the result in the cache, and each search is a `tools/call` of
//! the search tool whose answer the relay writes (the job the heavy-work pool would run).

#[path = "../examples/fleet/record.rs"]
mod record;

use std::time::{Duration, Instant};

use mcp_budget::budget::Budget;
use mcp_budget::budget::cursor::CursorKey;
use mcp_budget::intercept::Interceptor;
use mcp_budget::policy::Policy;
use mcp_budget::relay::Relay;
use mcp_budget::wire::framing::Frame;
use serde_json::{Value, json};

const ROUNDS: usize = 15;
const TEXT_BYTES: usize = 3_000_000;

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A relay under `policy` (TOML), the result of `tool` put in its cache by a first call; the
/// cursor of that first page.
fn cached(policy: &str, tool: &str, result: &Value, arguments: Value) -> (Relay, String) {
    let policy = Policy::parse(policy, std::path::Path::new("bench.toml")).expect("policy");
    let relay = Relay::new(Interceptor::new(Budget::with_key(
        policy,
        CursorKey::from_secret(b"bench"),
    )));
    let request = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}});
    let routed = relay.from_client(Frame::Line(request.to_string().into_bytes()));
    assert!(routed.to_server.is_some());
    let reply = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{result}}}"#).into_bytes();
    let page = relay.from_server(Frame::Line(reply)).expect("a page");
    let page: Value = serde_json::from_slice(&page).expect("JSON");
    let cursor = continuation(&page["result"]).expect("the result is paged");
    (relay, cursor)
}

/// The continuation of a page: structuredContent's, the envelope's, or the notice's.
fn continuation(result: &Value) -> Option<String> {
    if let Some(next) = result["structuredContent"]["next_after"].as_str() {
        return Some(next.to_string());
    }
    for block in result["content"].as_array()? {
        let text = block["text"].as_str().unwrap_or_default();
        if let Ok(doc) = serde_json::from_str::<Value>(text)
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

/// One search through the relay: its time and its answer.
fn search(relay: &Relay, id: u64, arguments: Value) -> (Duration, Value) {
    let request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "mcp_budget_search", "arguments": arguments}});
    let start = Instant::now();
    let mut routed = relay.from_client(Frame::Line(request.to_string().into_bytes()));
    let job = routed.deferred.pop().expect("the search is the proxy's");
    let answer = job.run();
    let elapsed = start.elapsed();
    let answer: Value = serde_json::from_slice(&answer).expect("JSON");
    assert_ne!(answer["result"]["isError"], true, "{answer}");
    (elapsed, answer["result"]["structuredContent"].clone())
}

fn main() {
    // The text: log lines, as a server reading a log file would return them.
    let mut text = String::with_capacity(TEXT_BYTES + 200);
    let mut i = 0;
    while text.len() < TEXT_BYTES {
        let state = if i % 997 == 0 { "ERROR timeout" } else { "ok" };
        text.push_str(&format!(
            "2026-11-20T12:00:{:02}Z worker-{} stream st-{:04} state {state}, gate passed by reviewer {} line {i}\n",
            i % 60,
            i % 7,
            i % 240,
            i % 13
        ));
        i += 1;
    }
    let file = std::env::temp_dir().join(format!(
        "mcp-budget-bench-search-{}.txt",
        std::process::id()
    ));
    std::fs::write(&file, &text).expect("write the text");
    let pattern = "ERROR timeout";
    let result = json!({"content": [{"type": "text", "text": text}]});
    let (relay, cursor) = cached(
        "[[tool]]\nname = \"read\"\n[tool.text]\npage_bytes = 20000\n",
        "read",
        &result,
        json!({}),
    );
    // The fleet: 1,000 streams, JSON text plus structuredContent, as the example server sends.
    let record = record::fleet_show(1_000, 7);
    let fleet = json!({
        "content": [{"type": "text", "text": record.to_string()}],
        "structuredContent": record,
        "isError": false,
    });
    let document = fleet["structuredContent"].to_string();
    let policy =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/policies/fleet.toml"))
            .expect("policies/fleet.toml");
    let (fleet_relay, fleet_cursor) =
        cached(&policy, "fleet_show", &fleet, json!({"horizon": "all"}));
    let path = "$.streams[?(@.state == 'blocked')].stream_id";

    let (mut grep_times, mut regex_times, mut parse_times, mut path_times) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut grep_lines, mut regex_matches, mut path_matches) = (0, 0, 0);
    for round in 0..ROUNDS as u64 {
        let start = Instant::now();
        let output = std::process::Command::new("grep")
            .args(["-n", "-E", pattern])
            .arg(&file)
            .output()
            .expect("grep");
        grep_times.push(start.elapsed());
        grep_lines = output.stdout.iter().filter(|b| **b == b'\n').count();
        let (t, answer) = search(
            &relay,
            100 + round,
            json!({"cursor": cursor, "pattern": pattern}),
        );
        regex_times.push(t);
        regex_matches = answer["total_matches"].as_u64().unwrap_or(0) as usize;
        let start = Instant::now();
        let value: Value = serde_json::from_str(&document).expect("parse");
        parse_times.push(start.elapsed());
        std::hint::black_box(value);
        let (t, answer) = search(
            &fleet_relay,
            200 + round,
            json!({"cursor": fleet_cursor, "path": path}),
        );
        path_times.push(t);
        path_matches = answer["total_matches"].as_u64().unwrap_or(0) as usize;
    }
    let _ = std::fs::remove_file(&file);
    assert_eq!(regex_matches, grep_lines, "the search and grep agree");
    let (g, r, p, j) = (
        median(&mut grep_times),
        median(&mut regex_times),
        median(&mut parse_times),
        median(&mut path_times),
    );
    println!("{ROUNDS} rounds, medians:");
    println!(
        "  regex over the cached {:.1} MB text ({regex_matches} matching lines): {:.2} ms; grep -n -E on the same bytes as a file {:.2} ms = {:.2}×",
        text.len() as f64 / 1e6,
        ms(r),
        ms(g),
        ms(r) / ms(g)
    );
    println!(
        "  JSONPath over the cached {:.1} MB fleet result ({path_matches} matches): {:.1} ms; one serde_json parse of the document {:.1} ms = {:.2}×",
        fleet.to_string().len() as f64 / 1e6,
        ms(j),
        ms(p),
        ms(j) / ms(p)
    );
}
