//! Latency of one `tools/call` over Streamable HTTP through mcp-budget (to a stdio server),
//! against the same server called over stdio directly.
//!
//! Run with `cargo bench --bench http_latency`. The server is this binary in server mode (see
//! `support`). The HTTP client is reqwest on a current-thread runtime, one session, sequential
//! calls; both answer modes are measured: plain JSON (`Accept: application/json`) and an SSE
//! stream per call. Direct and HTTP rounds alternate in one run.

mod support;

use std::time::{Duration, Instant};

use support::{CALLS_PER_ROUND, ROUNDS, SERVE_ENV, Session, WARMUP, report, request};

struct HttpSession {
    client: reqwest::Client,
    url: String,
    session: String,
    accept: &'static str,
    next_id: u64,
}

impl HttpSession {
    async fn call(&mut self) -> Duration {
        let id = self.next_id;
        self.next_id += 1;
        let start = Instant::now();
        let body = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", self.accept)
            .header("mcp-session-id", &self.session)
            .body(request(id))
            .send()
            .await
            .expect("POST")
            .bytes()
            .await
            .expect("body");
        let elapsed = start.elapsed();
        let text = String::from_utf8_lossy(&body);
        assert!(
            text.contains(&format!(r#""id":{id},"#)),
            "unexpected reply: {text}"
        );
        elapsed
    }
}

fn main() {
    if std::env::var_os(SERVE_ENV).is_some() {
        support::serve();
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run());
}

async fn run() {
    let me = std::env::current_exe().expect("own path");
    // MCP_BUDGET_BIN: another build (a baseline, run after this one in the same session).
    let proxy = std::env::var_os("MCP_BUDGET_BIN")
        .filter(|bin| !bin.is_empty())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_mcp-budget").into());
    let mut command = tokio::process::Command::new(proxy);
    command
        // One client sends thousands of calls a second: no rate limit. HTTP_LATENCY_THREADS
        // sets --threads (default: the proxy's own, one per core).
        .args(["--listen", "http://127.0.0.1:0/mcp", "--rate-limit", "0"])
        .args(
            std::env::var("HTTP_LATENCY_THREADS")
                .ok()
                .filter(|n| !n.is_empty())
                .map(|n| vec!["--threads".to_string(), n])
                .unwrap_or_default(),
        )
        .arg("--")
        .arg(&me)
        .env(SERVE_ENV, "1");
    let (mut proxy, url, client, session) = support::listen_and_initialize(command).await;

    let mut direct = Session::start(std::process::Command::new(&me));
    let mut modes = [
        ("application/json", Vec::new()),
        ("application/json, text/event-stream", Vec::new()),
    ];
    let mut direct_samples = Vec::new();
    let mut http: Vec<HttpSession> = modes
        .iter()
        .map(|(accept, _)| HttpSession {
            client: client.clone(),
            url: url.clone(),
            session: session.clone(),
            accept,
            next_id: 1_000_000 * (1 + accept.len() as u64),
        })
        .collect();
    for _ in 0..WARMUP {
        direct.call();
        for h in http.iter_mut() {
            h.call().await;
        }
    }
    for _ in 0..ROUNDS {
        for _ in 0..CALLS_PER_ROUND {
            direct_samples.push(direct.call());
        }
        for (k, h) in http.iter_mut().enumerate() {
            for _ in 0..CALLS_PER_ROUND {
                modes[k].1.push(h.call().await);
            }
        }
    }
    direct.stop();
    println!("tools/call round trip, sequential, one client, no policy:");
    let d = report("stdio, direct", &mut direct_samples);
    for (accept, samples) in modes.iter_mut() {
        let name = if accept.contains("event-stream") {
            "HTTP+SSE via proxy"
        } else {
            "HTTP+JSON via proxy"
        };
        let p = report(name, samples);
        println!(
            "  {name}: p50 {:+.1} µs over stdio direct ({:.2}×)",
            (p.as_secs_f64() - d.as_secs_f64()) * 1e6,
            p.as_secs_f64() / d.as_secs_f64()
        );
    }
    let _ = proxy.start_kill();
}
