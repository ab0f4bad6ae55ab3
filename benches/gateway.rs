//! The HTTP gateway on every core (`--listen`), the same build side by side with itself forced
//! onto one thread (`--threads 1`), in one run:
//!
//! 1. calls/s of N concurrent sessions on the fleet default query (`fleet_show`, fleet policy,
//!    20 streams), N = 1, 2, 8, 32; every answer checked (`support/load.rs`);
//! 2. the p50/p99 latency of `ping` in one session, alone and while four other sessions each
//!    page a 1,000-stream fleet (`fleet_show`: ~11 MB from the server per call, cut to a page
//!    by the proxy).
//!
//! Run with `cargo bench --bench gateway` (builds the fleet example first if needed).
//! `GATEWAY_CALLS` sets the calls per point (default 6,000, shared among the sessions);
//! `GATEWAY_ONLY=calls` or `=ping` runs one part.

#[path = "support/load.rs"]
mod load;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

/// A proxy listening in front of the fleet server; its URL.
async fn start(
    proxy: &Path,
    policy: &Path,
    threads: &[&str],
    streams: usize,
) -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new(proxy)
        .args(["--listen", "http://127.0.0.1:0/mcp"])
        .args(["--max-sessions", "64", "--max-sessions-per-client", "64"])
        .args(threads)
        .arg("--policy")
        .arg(policy)
        .arg("--")
        .arg(load::fleet_server())
        .args(["--streams", &streams.to_string()])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the proxy");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = lines
        .next_line()
        .await
        .expect("read")
        .expect("the listening line");
    (child, line.trim_start_matches("listening on ").to_string())
}

/// A JSON-only MCP session over HTTP.
struct Session {
    client: reqwest::Client,
    url: String,
    id: String,
}

impl Session {
    async fn open(client: &reqwest::Client, url: &str) -> Session {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "gateway-bench", "version": "1"}}});
        let response = client
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .body(init.to_string())
            .send()
            .await
            .expect("initialize");
        let id = response.headers()["mcp-session-id"]
            .to_str()
            .expect("session id")
            .to_string();
        let _ = response.bytes().await;
        let session = Session {
            client: client.clone(),
            url: url.to_string(),
            id,
        };
        session
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        session
    }

    async fn post(&self, body: Value) -> Vec<u8> {
        self.client
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .header("mcp-session-id", &self.id)
            .body(body.to_string())
            .send()
            .await
            .expect("post")
            .bytes()
            .await
            .expect("body")
            .to_vec()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// `pings` sequential pings in one session (after a warm-up); sorted latencies.
async fn pings(session: &Session, pings: usize) -> Vec<Duration> {
    for k in 0..50 {
        session
            .post(json!({"jsonrpc": "2.0", "id": format!("w{k}"), "method": "ping"}))
            .await;
    }
    let mut latencies = Vec::with_capacity(pings);
    for k in 0..pings {
        let start = Instant::now();
        let answer = session
            .post(json!({"jsonrpc": "2.0", "id": format!("p{k}"), "method": "ping"}))
            .await;
        latencies.push(start.elapsed());
        let answer: Value = serde_json::from_slice(&answer).expect("ping answer");
        assert_eq!(answer["id"], json!(format!("p{k}")), "a wrong ping answer");
    }
    latencies.sort();
    latencies
}

struct PingFigures {
    alone: Vec<Duration>,
    loaded: Vec<Duration>,
    pages: usize,
}

/// Ping alone, then while four sessions page the big fleet.
async fn ping_under_load(proxy: &Path, policy: &Path, threads: &[&str]) -> PingFigures {
    let (_child, url) = start(proxy, policy, threads, 1000).await;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(16)
        .build()
        .expect("client");
    let ping = Session::open(&client, &url).await;
    let alone = pings(&ping, 1000).await;
    let stop = Arc::new(AtomicBool::new(false));
    let pages = Arc::new(AtomicUsize::new(0));
    let mut loaders = Vec::new();
    for index in 0..4 {
        let session = Session::open(&client, &url).await;
        let stop = stop.clone();
        let pages = pages.clone();
        loaders.push(tokio::spawn(async move {
            let mut k = 0;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                let answer = session
                    .post(json!({"jsonrpc": "2.0", "id": format!("l{index}-{k}"), "method": "tools/call", "params": {"name": "fleet_show", "arguments": {"detail": "full", "limit": 20}}}))
                    .await;
                let answer: Value = serde_json::from_slice(&answer).expect("a page");
                assert_eq!(answer["result"]["isError"], json!(false), "{answer}");
                pages.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // Every loader has a page under way before the pings start.
    while pages.load(Ordering::Relaxed) < 4 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = pages.load(Ordering::Relaxed);
    let loaded = pings(&ping, 1000).await;
    let pages = pages.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    for loader in loaders {
        loader.await.expect("loader");
    }
    PingFigures {
        alone,
        loaded,
        pages,
    }
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let proxy = PathBuf::from(env!("CARGO_BIN_EXE_mcp-budget"));
    let policy = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies/fleet.toml");
    let fleet = load::fleet_server();
    let total: usize = std::env::var("GATEWAY_CALLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6000);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // The load generator gets the cores too; it is the same for both builds.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!("proxy: {} ({cores} cores)", proxy.display());
    println!(
        "calls/s, fleet default query (fleet_show / stream_detail, 20 streams, fleet policy):"
    );
    println!("  sessions   every core   one thread   ratio");
    let mut at_eight = None;
    // GATEWAY_ONLY=ping skips the calls/s part (GATEWAY_ONLY=calls, the ping part).
    let only = std::env::var("GATEWAY_ONLY").unwrap_or_default();
    let counts: &[usize] = if only == "ping" { &[] } else { &[1, 2, 8, 32] };
    for &sessions in counts {
        let calls = (total / sessions).max(1);
        let mut rates = Vec::new();
        for threads in [&[][..], &["--threads", "1"][..]] {
            let report = runtime.block_on(load::run_with(
                &proxy, &fleet, &policy, sessions, calls, threads,
            ));
            assert!(
                report.errors.is_empty(),
                "the load failed: {:?}",
                &report.errors[..report.errors.len().min(3)]
            );
            rates.push(report.latencies.len() as f64 / report.wall.as_secs_f64());
        }
        let ratio = rates[0] / rates[1];
        if sessions == 8 {
            at_eight = Some(ratio);
        }
        println!(
            "  {sessions:>8}   {:>10.0}   {:>10.0}   {ratio:.2}×",
            rates[0], rates[1]
        );
    }
    println!(
        "ping in one session, alone and while 4 sessions page a 1,000-stream fleet (~11 MB a call):"
    );
    let mut loaded_ratio = None;
    let modes: &[(&str, &[&str])] = if only == "calls" {
        &[]
    } else {
        &[("every core", &[]), ("one thread", &["--threads", "1"])]
    };
    for &(name, threads) in modes {
        let figures = runtime.block_on(ping_under_load(&proxy, &policy, threads));
        let (a50, a99) = (
            percentile(&figures.alone, 0.5),
            percentile(&figures.alone, 0.99),
        );
        let (l50, l99) = (
            percentile(&figures.loaded, 0.5),
            percentile(&figures.loaded, 0.99),
        );
        let ratio = l99.as_secs_f64() / a99.as_secs_f64();
        if loaded_ratio.is_none() {
            loaded_ratio = Some(ratio);
        }
        println!(
            "  {name}: alone p50 {:.0} µs p99 {:.0} µs; loaded p50 {:.0} µs p99 {:.0} µs ({} pages meanwhile); p99 loaded/alone {ratio:.2}×",
            a50.as_secs_f64() * 1e6,
            a99.as_secs_f64() * 1e6,
            l50.as_secs_f64() * 1e6,
            l99.as_secs_f64() * 1e6,
            figures.pages,
        );
    }
    println!(
        "targets: calls/s at 8 sessions ≥ 1.5× one thread: {:.2}×; ping p99 under load ≤ 3× alone: {:.2}×",
        at_eight.unwrap_or(0.0),
        loaded_ratio.unwrap_or(0.0)
    );
}
