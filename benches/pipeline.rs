//! The budget pipeline on a large result, against the floor of a bare parse + serialize.
//!
//! Run with `cargo bench --bench pipeline`. A 1,000-stream fleet record (~11 MB, as the
//! example server would send it: JSON text plus `structuredContent`) goes through the relay
//! exactly as in the proxy — envelope, `tools/call` hook, pipeline, splice — under
//! `policies/fleet.toml`, and again through a relay whose budget reads every result whole (the
//! pipeline without `budget::reduce`; both must give the same bytes). Two baselines run in the
//! same rounds: a bare
//! `serde_json::from_slice::<Value>` + `to_vec` of the same bytes (the floor of any rewrite),
//! and the parse alone (the pipeline cannot avoid it, but only serializes a page). Medians,
//! min–max spread over the rounds, and the ratios to both baselines are printed (target ≤ 2×
//! the floor).

#[path = "../examples/fleet/record.rs"]
mod record;

use std::path::Path;
use std::time::{Duration, Instant};

use mcp_budget::budget::Budget;
use mcp_budget::budget::cursor::CursorKey;
use mcp_budget::intercept::Interceptor;
use mcp_budget::policy::Policy;
use mcp_budget::relay::Relay;
use mcp_budget::wire::framing::Frame;
use serde_json::{Value, json};

const STREAMS: usize = 1_000;
const ROUNDS: usize = 31;

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// "min–max" of sorted samples, in ms.
fn spread(sorted: &[Duration]) -> String {
    format!(
        "{:.1}–{:.1}",
        sorted[0].as_secs_f64() * 1e3,
        sorted[sorted.len() - 1].as_secs_f64() * 1e3
    )
}

fn main() {
    let policy_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/fleet.toml");
    let policy = Policy::load(&policy_path).expect("policies/fleet.toml");
    // The proxy as it runs (a large list narrowed where it lies), and the same budget reading
    // every result whole (the pipeline before `budget::reduce`), side by side.
    let relay = Relay::new(Interceptor::new(Budget::with_key(
        policy.clone(),
        CursorKey::from_secret(b"bench"),
    )));
    let whole = Relay::new(Interceptor::new(
        Budget::with_key(policy, CursorKey::from_secret(b"bench")).reading_whole(),
    ));

    let record = record::fleet_show(STREAMS, 7);
    let result = json!({
        "content": [{"type": "text", "text": record.to_string()}],
        "structuredContent": record,
        "isError": false,
    });
    let response = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{result}}}"#).into_bytes();
    println!(
        "fleet_show result: {STREAMS} streams, {:.1} MB on the wire",
        response.len() as f64 / 1e6
    );

    let scenarios = [
        ("default (live, summary, 25)", json!({})),
        ("csv, limit 100", json!({"format": "csv", "limit": 100})),
        (
            "all + full, limit 100",
            json!({"horizon": "all", "detail": "full", "limit": 100}),
        ),
    ];
    let mut floor = Vec::new();
    let mut parse_only = Vec::new();
    let mut ours: Vec<Vec<Duration>> = vec![Vec::new(); scenarios.len()];
    let mut read_whole: Vec<Vec<Duration>> = vec![Vec::new(); scenarios.len()];
    let mut out_bytes = vec![0; scenarios.len()];
    // Every request has an id of its own, as a client's do (a reused id would go upstream
    // under a fresh one, and this reply would not be its answer).
    let mut next_id = 0u64;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        let value: Value = serde_json::from_slice(&response).expect("parse");
        let bytes = serde_json::to_vec(&value).expect("serialize");
        floor.push(start.elapsed());
        std::hint::black_box(bytes);
        let start = Instant::now();
        let value: Value = serde_json::from_slice(&response).expect("parse");
        parse_only.push(start.elapsed());
        std::hint::black_box(value);
        for (k, (_, arguments)) in scenarios.iter().enumerate() {
            next_id += 1;
            let request = json!({"jsonrpc": "2.0", "id": next_id, "method": "tools/call", "params": {"name": "fleet_show", "arguments": arguments}});
            let request = request.to_string().into_bytes();
            let request_whole = Frame::Line(request.clone());
            let request = Frame::Line(request);
            let reply = mcp_budget::wire::message::with_id(&response, &next_id.to_string())
                .expect("the reply has an id");
            let reply_whole = reply.clone();
            let start = Instant::now();
            let routed = relay.from_client(request);
            assert!(routed.to_server.is_some());
            let fast = relay.from_server(Frame::Line(reply)).expect("a reply");
            ours[k].push(start.elapsed());
            out_bytes[k] = fast.len();
            let start = Instant::now();
            let routed = whole.from_client(request_whole);
            assert!(routed.to_server.is_some());
            let slow = whole
                .from_server(Frame::Line(reply_whole))
                .expect("a reply");
            read_whole[k].push(start.elapsed());
            assert_eq!(fast, slow, "the same page either way");
        }
    }
    let floor_median = median(&mut floor);
    let parse_median = median(&mut parse_only);
    println!("({ROUNDS} rounds; median, and min–max over the rounds)");
    println!(
        "{:<42} {:>7.1} ms  ({} ms)  serde_json parse + serialize of the same bytes",
        "floor: parse + serialize",
        floor_median.as_secs_f64() * 1e3,
        spread(&floor)
    );
    println!(
        "{:<42} {:>7.1} ms  ({} ms)  serde_json parse alone",
        "parse alone",
        parse_median.as_secs_f64() * 1e3,
        spread(&parse_only)
    );
    for (k, (name, _)) in scenarios.iter().enumerate() {
        let m = median(&mut read_whole[k]);
        println!(
            "{:<42} {:>7.1} ms  ({} ms)  {:.2}× the floor, {:.2}× the parse",
            format!("{name}, read whole"),
            m.as_secs_f64() * 1e3,
            spread(&read_whole[k]),
            m.as_secs_f64() / floor_median.as_secs_f64(),
            m.as_secs_f64() / parse_median.as_secs_f64(),
        );
    }
    for (k, (name, _)) in scenarios.iter().enumerate() {
        let m = median(&mut ours[k]);
        println!(
            "{name:<42} {:>7.1} ms  ({} ms)  {:.2}× the floor, {:.2}× the parse   → {} bytes to the client",
            m.as_secs_f64() * 1e3,
            spread(&ours[k]),
            m.as_secs_f64() / floor_median.as_secs_f64(),
            m.as_secs_f64() / parse_median.as_secs_f64(),
            out_bytes[k]
        );
    }
    let next_id = text_only(&record, &relay, &whole, next_id);
    later_pages(&response, &relay, next_id);
}

/// The chain's later pages: each served from the result cache (the tool does not run again),
/// against the first page of the same chain, same rounds.
fn later_pages(response: &[u8], relay: &Relay, mut next_id: u64) {
    let (mut first, mut later) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        next_id += 1;
        let request = json!({"jsonrpc": "2.0", "id": next_id, "method": "tools/call",
            "params": {"name": "fleet_show", "arguments": {"horizon": "all"}}});
        let reply =
            mcp_budget::wire::message::with_id(response, &next_id.to_string()).expect("an id");
        let start = Instant::now();
        relay.from_client(Frame::Line(request.to_string().into_bytes()));
        let page = relay.from_server(Frame::Line(reply)).expect("a reply");
        first.push(start.elapsed());
        let page: Value = serde_json::from_slice(&page).expect("JSON");
        let mut after = page["result"]["structuredContent"]["next_after"]
            .as_str()
            .map(String::from);
        for _ in 0..4 {
            let Some(cursor) = after.take() else { break };
            next_id += 1;
            let request = json!({"jsonrpc": "2.0", "id": next_id, "method": "tools/call",
                "params": {"name": "fleet_show", "arguments": {"horizon": "all", "after": cursor}}});
            let start = Instant::now();
            let mut routed = relay.from_client(Frame::Line(request.to_string().into_bytes()));
            let answer = routed.to_client.pop().expect("answered from the cache");
            later.push(start.elapsed());
            assert!(routed.to_server.is_none(), "the tool ran again");
            let answer: Value = serde_json::from_slice(&answer).expect("JSON");
            after = answer["result"]["structuredContent"]["next_after"]
                .as_str()
                .map(String::from);
        }
    }
    let (first, later) = (median(&mut first), median(&mut later));
    println!(
        "a chain's later pages (horizon all), from the cache: {:.2} ms each, against {:.1} ms for its first page ({:.3}×)",
        later.as_secs_f64() * 1e3,
        first.as_secs_f64() * 1e3,
        later.as_secs_f64() / first.as_secs_f64()
    );
}

/// The same record as the JSON of a text block only (as many servers send lists): the
/// default query, read whole against this build, same rounds.
fn text_only(record: &Value, relay: &Relay, whole: &Relay, mut next_id: u64) -> u64 {
    let result = json!({"content": [{"type": "text", "text": record.to_string()}]});
    let response = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{result}}}"#).into_bytes();
    let (mut fast, mut slow) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        for (relay, times) in [(relay, &mut fast), (whole, &mut slow)] {
            next_id += 1;
            let request = json!({"jsonrpc": "2.0", "id": next_id, "method": "tools/call",
                "params": {"name": "fleet_show", "arguments": {}}});
            let reply = mcp_budget::wire::message::with_id(&response, &next_id.to_string())
                .expect("the reply has an id");
            let start = Instant::now();
            relay.from_client(Frame::Line(request.to_string().into_bytes()));
            let answer = relay.from_server(Frame::Line(reply)).expect("a reply");
            times.push(start.elapsed());
            std::hint::black_box(answer);
        }
    }
    let (fast, slow) = (median(&mut fast), median(&mut slow));
    println!(
        "text block only ({:.1} MB), default query: read whole {:.1} ms, this build {:.1} ms ({:.2}×)",
        response.len() as f64 / 1e6,
        slow.as_secs_f64() * 1e3,
        fast.as_secs_f64() * 1e3,
        fast.as_secs_f64() / slow.as_secs_f64()
    );
    next_id
}
