//! The proxy in front of a Streamable HTTP server: its own CPU per call for stdio→HTTP against
//! stdio→stdio, and the latency HTTP→HTTP adds over calling the server directly.
//!
//! Run with `cargo bench --bench upstream_http`. The HTTP server is a minimal Streamable HTTP
//! responder inside this bench (JSON answers, no session), on a thread of its own; the stdio
//! server is this binary in server mode (see `support`). The proxy's CPU is read from
//! `/proc/<pid>/task/*/schedstat` (nanoseconds on a CPU) before and after a run of calls.
//! Set `MCP_BUDGET_BASELINE_BIN` to another build of mcp-budget to measure it side by side, in
//! alternating rounds of the same run.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{SERVE_ENV, Session, percentile, request};
use tokio::io::{AsyncBufReadExt, BufReader};

const ROUNDS: usize = 4;
const CALLS: usize = 2000;
const WARMUP: usize = 300;

const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}"#;

/// CPU time of every thread of `pid` so far.
fn cpu(pid: u32) -> Duration {
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

/// The HTTP server: answers each POSTed request with the same small result as `support`.
async fn http_server() -> String {
    use axum::http::{HeaderMap, StatusCode, header};
    use axum::response::IntoResponse;
    async fn mcp(_headers: HeaderMap, body: axum::body::Bytes) -> axum::response::Response {
        let Ok(message) = serde_json::from_slice::<serde_json::Value>(&body) else {
            return StatusCode::BAD_REQUEST.into_response();
        };
        let Some(id) = message.get("id") else {
            return StatusCode::ACCEPTED.into_response();
        };
        let reply = if message["method"] == "initialize" {
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"protocolVersion":"2025-06-18","capabilities":{{"tools":{{}}}},"serverInfo":{{"name":"bench-http","version":"1"}}}}}}"#
            )
        } else {
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{{\"stream_id\":\"st-0042\",\"state\":\"running\",\"owner\":\"agent-ada\",\"wave\":\"w4\"}}"}}],"structuredContent":{{"stream_id":"st-0042","state":"running","owner":"agent-ada","wave":"w4"}},"isError":false}}}}"#
            )
        };
        ([(header::CONTENT_TYPE, "application/json")], reply).into_response()
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("server runtime");
        runtime.block_on(async move {
            let app = axum::Router::new().route(
                "/mcp",
                axum::routing::post(mcp).get(|| async { StatusCode::METHOD_NOT_ALLOWED }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("addr");
            let _ = tx.send(format!("http://{addr}/mcp"));
            let listener = axum::serve::ListenerExt::tap_io(listener, |s| {
                let _ = s.set_nodelay(true);
            });
            let _ = axum::serve(listener, app).await;
        });
    });
    rx.recv().expect("server URL")
}

/// CPU the proxy spends per call over stdio (client) with `args` before `--`-less upstreams.
fn stdio_cpu_per_call(bin: &Path, args: &[&str], me: &Path) -> Duration {
    let mut command = Command::new(bin);
    command.args(args);
    if !args.contains(&"--upstream") {
        command.arg("--").arg(me);
    }
    command.stderr(Stdio::null());
    let mut session = Session::start(command);
    for _ in 0..WARMUP {
        session.call();
    }
    let pid = session.pid();
    let before = cpu(pid);
    for _ in 0..CALLS {
        session.call();
    }
    let spent = cpu(pid) - before;
    session.stop();
    spent / CALLS as u32
}

struct HttpClient {
    client: reqwest::Client,
    url: String,
    session: Option<String>,
    next_id: u64,
}

impl HttpClient {
    async fn call(&mut self) -> Duration {
        let id = self.next_id;
        self.next_id += 1;
        let start = Instant::now();
        let mut post = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .body(request(id));
        if let Some(session) = &self.session {
            post = post.header("mcp-session-id", session);
        }
        let body = post
            .send()
            .await
            .expect("POST")
            .bytes()
            .await
            .expect("body");
        let elapsed = start.elapsed();
        assert!(
            String::from_utf8_lossy(&body).contains(&format!(r#""id":{id},"#)),
            "unexpected reply"
        );
        elapsed
    }
}

/// `bin --listen … --upstream url`, initialized; the client and the proxy process.
async fn http_to_http(bin: &Path, upstream: &str) -> (HttpClient, tokio::process::Child) {
    let mut proxy = tokio::process::Command::new(bin)
        .args(["--listen", "http://127.0.0.1:0/mcp", "--upstream", upstream])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the proxy");
    let mut lines = BufReader::new(proxy.stdout.take().expect("stdout")).lines();
    let line = lines.next_line().await.expect("read").expect("a line");
    let url = line.trim_start_matches("listening on ").to_string();
    let client = reqwest::Client::new();
    let response = client
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(INIT)
        .send()
        .await
        .expect("initialize");
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .expect("session")
        .to_string();
    let _ = response.bytes().await;
    (
        HttpClient {
            client,
            url,
            session: Some(session),
            next_id: 1,
        },
        proxy,
    )
}

fn p50(samples: &mut [Duration]) -> Duration {
    samples.sort();
    percentile(samples, 0.5)
}

fn spread(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        values[0],
        values[values.len() / 2],
        values[values.len() - 1],
    )
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
    let upstream = http_server().await;
    let mut builds: Vec<(String, PathBuf)> = vec![(
        "this build".into(),
        PathBuf::from(env!("CARGO_BIN_EXE_mcp-budget")),
    )];
    if let Some(baseline) = std::env::var_os("MCP_BUDGET_BASELINE_BIN") {
        builds.push(("baseline".into(), PathBuf::from(baseline)));
    }
    // Per build: stdio→stdio CPU/call, stdio→HTTP CPU/call, HTTP→HTTP added p50 (µs), per round.
    let mut figures: Vec<[Vec<f64>; 3]> = builds.iter().map(|_| Default::default()).collect();
    let mut direct = HttpClient {
        client: reqwest::Client::new(),
        url: upstream.clone(),
        session: None,
        next_id: 1,
    };
    for _ in 0..WARMUP {
        direct.call().await;
    }
    for round in 0..ROUNDS {
        for (k, (_, bin)) in builds.iter().enumerate() {
            let stdio = stdio_cpu_per_call(bin, &[], &me);
            let http = stdio_cpu_per_call(bin, &["--upstream", &upstream], &me);
            let (mut through, proxy) = http_to_http(bin, &upstream).await;
            for _ in 0..WARMUP {
                through.call().await;
            }
            let (mut d, mut t) = (Vec::new(), Vec::new());
            for _ in 0..CALLS {
                d.push(direct.call().await);
                t.push(through.call().await);
            }
            drop(proxy);
            let added = p50(&mut t).as_secs_f64() - p50(&mut d).as_secs_f64();
            figures[k][0].push(stdio.as_secs_f64() * 1e6);
            figures[k][1].push(http.as_secs_f64() * 1e6);
            figures[k][2].push(added * 1e6);
            eprintln!(
                "round {round} {}: stdio→stdio {:.1} µs CPU/call, stdio→HTTP {:.1} µs CPU/call, HTTP→HTTP +{:.1} µs p50",
                builds[k].0,
                stdio.as_secs_f64() * 1e6,
                http.as_secs_f64() * 1e6,
                added * 1e6
            );
        }
    }
    println!(
        "proxy in front of a Streamable HTTP server ({ROUNDS} rounds × {CALLS} calls; min / median / max over rounds):"
    );
    for (k, (name, _)) in builds.iter().enumerate() {
        let [stdio, http, added] = &mut figures[k];
        let ratios: Vec<f64> = http.iter().zip(stdio.iter()).map(|(h, s)| h / s).collect();
        let (s0, s1, s2) = spread(stdio);
        let (h0, h1, h2) = spread(http);
        let (r0, r1, r2) = spread(&mut ratios.clone());
        let (a0, a1, a2) = spread(added);
        println!("  {name}:");
        println!("    stdio→stdio proxy CPU/call  {s0:.1} / {s1:.1} / {s2:.1} µs");
        println!("    stdio→HTTP  proxy CPU/call  {h0:.1} / {h1:.1} / {h2:.1} µs");
        println!("    stdio→HTTP ÷ stdio→stdio    {r0:.2} / {r1:.2} / {r2:.2}×  (target ≤ 1.5×)");
        println!(
            "    HTTP→HTTP p50 added         {a0:.1} / {a1:.1} / {a2:.1} µs over the server direct  (target ≤ 60 µs)"
        );
    }
}
