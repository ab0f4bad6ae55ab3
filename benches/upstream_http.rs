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

use support::{BARE_ENV, SERVE_ENV, Session, cpu, modern_request, percentile, request};

const ROUNDS: usize = 4;
const CALLS: usize = 2000;
const WARMUP: usize = 300;

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
            // A 2026-07-28 request is answered as a 2026-07-28 server does: every result says
            // its kind (the proxy has nothing to mend).
            let kind = match message["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"]
                .is_string()
            {
                true => r#""resultType":"complete","#,
                false => "",
            };
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{{kind}"content":[{{"type":"text","text":"{{\"stream_id\":\"st-0042\",\"state\":\"running\",\"owner\":\"agent-ada\",\"wave\":\"w4\"}}"}}],"structuredContent":{{"stream_id":"st-0042","state":"running","owner":"agent-ada","wave":"w4"}},"isError":false}}}}"#
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
    cpu_per_call(command)
}

/// The CPU per call of the process `command` starts (after a warm-up), driven over stdio.
fn cpu_per_call(command: Command) -> Duration {
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
    /// Speaks 2026-07-28: the request's `_meta` and headers, no session.
    modern: bool,
    /// (Legacy, profile mode `padded`) sends a request of a modern one's size: the same
    /// `_meta` under another prefix of the same length, and the same extra headers.
    padded: bool,
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
            .header("accept", "application/json");
        post = if self.modern {
            post.header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", "tools/call")
                .header("mcp-name", "stream_detail")
                .body(modern_request(id))
        } else if self.padded {
            post.header("x-pad-protocol-version", "2026-07-28")
                .header("x-pad-method", "tools/call")
                .header("x-pad-name", "stream_detail")
                .body(
                    modern_request(id)
                        .replace("io.modelcontextprotocol/", "x-same-length-padding-0/"),
                )
        } else {
            post.body(request(id))
        };
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
    through(listening(bin, upstream)).await
}

/// `bin --listen … --upstream url`, with the options this build has: no rate limit for this
/// one client's thousands of calls a second, and UPSTREAM_HTTP_THREADS as `--threads`
/// (default: the build's own).
fn listening(bin: &Path, upstream: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(bin);
    command.args(["--listen", "http://127.0.0.1:0/mcp", "--upstream", upstream]);
    let help = Command::new(bin).arg("--help").output();
    let help = help.map(|out| String::from_utf8_lossy(&out.stdout).into_owned());
    if help.as_deref().is_ok_and(|h| h.contains("--rate-limit")) {
        command.args(["--rate-limit", "0"]);
    }
    if let Some(threads) = std::env::var("UPSTREAM_HTTP_THREADS")
        .ok()
        .filter(|n| !n.is_empty())
        && help.as_deref().is_ok_and(|h| h.contains("--threads"))
    {
        command.args(["--threads", &threads]);
    }
    command
}

/// The proxy (or bare relay) that `command` starts, listening, with an initialized client.
async fn through(mut command: tokio::process::Command) -> (HttpClient, tokio::process::Child) {
    command.stderr(Stdio::null());
    let (proxy, url, client, session) = support::listen_and_initialize(command).await;
    (
        HttpClient {
            client,
            url,
            session: Some(session),
            next_id: 1,
            modern: false,
            padded: false,
        },
        proxy,
    )
}

/// `bin --listen … --upstream url` with a 2026-07-28 client: no session, nothing before the
/// first call.
async fn modern_http_to_http(bin: &Path, upstream: &str) -> (HttpClient, tokio::process::Child) {
    use tokio::io::AsyncBufReadExt;
    let mut command = listening(bin, upstream);
    command
        .stderr(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    let mut proxy = command.spawn().expect("start the proxy");
    let mut lines = tokio::io::BufReader::new(proxy.stdout.take().expect("stdout")).lines();
    let line = lines.next_line().await.expect("read").expect("a line");
    let url = line.trim_start_matches("listening on ").to_string();
    (
        HttpClient {
            client: reqwest::Client::new(),
            url,
            session: None,
            next_id: 1,
            modern: true,
            padded: false,
        },
        proxy,
    )
}

/// Calls through `through` and `direct` alternately; (p50 added in µs, the proxy's CPU per
/// call in µs).
async fn added_and_cpu(
    through: &mut HttpClient,
    direct: &mut HttpClient,
    proxy: &tokio::process::Child,
) -> (f64, f64) {
    for _ in 0..WARMUP {
        through.call().await;
    }
    let pid = proxy.id().unwrap_or(0);
    let before = cpu(pid);
    let (mut d, mut t) = (Vec::new(), Vec::new());
    for _ in 0..CALLS {
        d.push(direct.call().await);
        t.push(through.call().await);
    }
    let spent = (cpu(pid) - before).as_secs_f64() * 1e6 / CALLS as f64;
    let added = (p50(&mut t).as_secs_f64() - p50(&mut d).as_secs_f64()) * 1e6;
    (added, spent)
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

/// The floor: a blocking relay that does no protocol work at all. `stdio` relays lines to a
/// child server and back; `http:URL` POSTs each line on one kept-alive connection and writes
/// the body back. What the proxy spends above these is its own.
fn bare_relay(mode: &str) {
    use std::io::{BufRead, Read, Write};
    // The async floors (tokio and hyper, no protocol work).
    if mode == "tokio-stdio" {
        support::floors::tokio_stdio_relay();
        return;
    }
    if let Some(url) = mode.strip_prefix("tokio-http-relay:") {
        support::floors::tokio_http_forwarder(url);
        return;
    }
    if let Some(url) = mode.strip_prefix("tokio-http:") {
        support::floors::tokio_http_relay(url);
        return;
    }
    if let Some(url) = mode.strip_prefix("http-relay:") {
        bare_http_relay(url);
        return;
    }
    if let Some(url) = mode.strip_prefix("http:") {
        // Locked here only: the stdio relay locks stdin itself (a second lock would deadlock).
        let mut input = std::io::stdin().lock();
        let mut line = Vec::new();
        let rest = url.trim_start_matches("http://");
        let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let stream = std::net::TcpStream::connect(host).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let mut reader = std::io::BufReader::new(stream.try_clone().expect("clone"));
        let mut writer = stream;
        let mut out = std::io::stdout().lock();
        let mut head = String::new();
        loop {
            line.clear();
            if input.read_until(b'\n', &mut line).unwrap_or(0) == 0 {
                return;
            }
            let body = line.trim_ascii_end();
            let mut request = format!(
                "POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\ncontent-length: {}\r\n\r\n",
                body.len()
            )
            .into_bytes();
            request.extend_from_slice(body);
            writer.write_all(&request).expect("send");
            let mut length = 0;
            loop {
                head.clear();
                reader.read_line(&mut head).expect("head");
                if head == "\r\n" || head.is_empty() {
                    break;
                }
                if let Some((name, value)) = head.split_once(':')
                    && name.eq_ignore_ascii_case("content-length")
                {
                    length = value.trim().parse().expect("length");
                }
            }
            let mut answer = vec![0; length];
            reader.read_exact(&mut answer).expect("body");
            if length > 0 {
                answer.push(b'\n');
                out.write_all(&answer)
                    .and_then(|()| out.flush())
                    .expect("write");
            }
        }
    }
    support::bare_stdio_relay();
}

/// Reads one HTTP/1.1 message (head and a content-length body); `None` at the end.
fn read_http(reader: &mut impl std::io::BufRead) -> Option<(String, Vec<u8>)> {
    let mut head = String::new();
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().ok()?;
        }
        head.push_str(&line);
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((head, body))
}

/// The HTTP→HTTP floor: a blocking forwarder, a thread per client connection, each with its
/// own kept-alive connection upstream; bodies pass as they are, with a fixed session id.
fn bare_http_relay(upstream: &str) {
    use std::io::Write;
    let rest = upstream.trim_start_matches("http://");
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (host, path) = (host.to_string(), path.to_string());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    println!(
        "listening on http://{}/mcp",
        listener.local_addr().expect("addr")
    );
    let _ = std::io::stdout().flush();
    for client in listener.incoming().flatten() {
        let (host, path) = (host.clone(), path.clone());
        std::thread::spawn(move || {
            let _ = client.set_nodelay(true);
            let server = std::net::TcpStream::connect(&host).expect("connect");
            let _ = server.set_nodelay(true);
            let mut from_client = std::io::BufReader::new(client.try_clone().expect("clone"));
            let mut to_client = client;
            let mut from_server = std::io::BufReader::new(server.try_clone().expect("clone"));
            let mut to_server = server;
            while let Some((_, body)) = read_http(&mut from_client) {
                let mut request = format!(
                    "POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                )
                .into_bytes();
                request.extend_from_slice(&body);
                if to_server.write_all(&request).is_err() {
                    return;
                }
                let Some((head, answer)) = read_http(&mut from_server) else {
                    return;
                };
                let status = head.lines().next().unwrap_or("HTTP/1.1 502 Bad Gateway");
                let mut response = format!(
                    "{status}\r\ncontent-type: application/json\r\nmcp-session-id: bare\r\ncontent-length: {}\r\n\r\n",
                    answer.len()
                )
                .into_bytes();
                response.extend_from_slice(&answer);
                if to_client.write_all(&response).is_err() {
                    return;
                }
            }
        });
    }
}

/// The p50 a relay (`mode` as in [`bare_relay`], one that listens) adds over `direct`.
async fn relay_added(me: &Path, mode: &str, direct: &mut HttpClient) -> f64 {
    let mut command = tokio::process::Command::new(me);
    command.env(BARE_ENV, mode);
    let (mut relayed, relay) = through(command).await;
    let (added, _) = added_and_cpu(&mut relayed, direct, &relay).await;
    drop(relay);
    added
}

/// CPU per call of a bare relay (`mode` as in [`bare_relay`]).
fn bare_cpu_per_call(me: &Path, mode: &str) -> Duration {
    let mut command = Command::new(me);
    command.env(BARE_ENV, mode).stderr(Stdio::null());
    cpu_per_call(command)
}

fn main() {
    if let Some(mode) = std::env::var_os(BARE_ENV) {
        bare_relay(&mode.to_string_lossy());
        return;
    }
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
    // For a profiler: `UPSTREAM_HTTP_PROFILE=<calls>` runs only one process for that many
    // calls, its pid on stderr (attach `perf record -p` to it), and nothing else:
    // `UPSTREAM_HTTP_PROFILE_MODE` `http` (default: this build's stdio→HTTP proxy), `stdio`
    // (its stdio→stdio proxy), `listen` (its HTTP→HTTP proxy), `modern` (the same with a
    // 2026-07-28 client), `padded` (a legacy client whose requests are a modern one's size:
    // the same `_meta` under a prefix of the same length, three more headers), `bare` (the bare stdio→HTTP
    // relay), `forwarder` or `async-forwarder` (the HTTP→HTTP floors); `UPSTREAM_HTTP_PROFILE_BIN`
    // another build (one with frame pointers, say), or for a floor a wrapper that runs its first
    // argument (valgrind, say).
    if let Some(calls) = std::env::var("UPSTREAM_HTTP_PROFILE")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
    {
        let mode = std::env::var("UPSTREAM_HTTP_PROFILE_MODE").unwrap_or_default();
        let bin = std::env::var_os("UPSTREAM_HTTP_PROFILE_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_mcp-budget")));
        if ["listen", "modern", "padded", "forwarder", "async-forwarder"].contains(&mode.as_str()) {
            let (mut through, proxy) = match mode.as_str() {
                "modern" => modern_http_to_http(&bin, &upstream).await,
                "forwarder" | "async-forwarder" => {
                    // A wrapper (`UPSTREAM_HTTP_PROFILE_BIN`) runs this bench binary, its first
                    // argument, as the floor.
                    let mut command = match std::env::var_os("UPSTREAM_HTTP_PROFILE_BIN") {
                        Some(wrapper) => {
                            let mut command = tokio::process::Command::new(wrapper);
                            command.arg(&me);
                            command
                        }
                        None => tokio::process::Command::new(&me),
                    };
                    let floor = if mode == "forwarder" {
                        "http-relay"
                    } else {
                        "tokio-http-relay"
                    };
                    command.env(BARE_ENV, format!("{floor}:{upstream}"));
                    through(command).await
                }
                "padded" => {
                    let (mut client, proxy) = http_to_http(&bin, &upstream).await;
                    client.padded = true;
                    (client, proxy)
                }
                _ => http_to_http(&bin, &upstream).await,
            };
            eprintln!("profile: pid {}", proxy.id().unwrap_or(0));
            let started = Instant::now();
            for _ in 0..calls {
                through.call().await;
            }
            eprintln!("profile: {calls} calls in {:?}", started.elapsed());
            // Ended as a user would (SIGTERM): a profiler that writes at exit gets its output.
            let mut proxy = proxy;
            if let Some(pid) = proxy.id() {
                let _ = Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
                let _ = tokio::time::timeout(Duration::from_secs(30), proxy.wait()).await;
            }
            return;
        }
        let mut command = match mode.as_str() {
            "bare" => {
                let mut command = Command::new(&me);
                command.env(BARE_ENV, format!("http:{upstream}"));
                command
            }
            "stdio" => {
                let mut command = Command::new(&bin);
                command.arg("--").arg(&me);
                command
            }
            _ => {
                let mut command = Command::new(&bin);
                command.args(["--upstream", &upstream]);
                command
            }
        };
        command.stderr(Stdio::null());
        let mut session = Session::start(command);
        eprintln!("profile: pid {}", session.pid());
        let started = Instant::now();
        for _ in 0..calls {
            session.call();
        }
        eprintln!("profile: {calls} calls in {:?}", started.elapsed());
        session.stop();
        return;
    }
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
        modern: false,
        padded: false,
    };
    let mut direct_modern = HttpClient {
        client: reqwest::Client::new(),
        url: upstream.clone(),
        session: None,
        next_id: 1,
        modern: true,
        padded: false,
    };
    for _ in 0..WARMUP {
        direct.call().await;
        direct_modern.call().await;
    }
    // This build's HTTP→HTTP, per round: legacy (a session) and modern (stateless) calls, p50
    // added and the proxy's CPU per call.
    let mut eras: [Vec<f64>; 4] = Default::default();
    // The bare relays' CPU per call: stdio→stdio, stdio→HTTP, per round.
    let mut bare: [Vec<f64>; 3] = Default::default();
    // The async floors (tokio and hyper, no protocol work), the same three figures.
    let mut asynchronous: [Vec<f64>; 3] = Default::default();
    for round in 0..ROUNDS {
        let floor_stdio = bare_cpu_per_call(&me, "stdio").as_secs_f64() * 1e6;
        let floor_http = bare_cpu_per_call(&me, &format!("http:{upstream}")).as_secs_f64() * 1e6;
        eprintln!(
            "round {round} bare relays: stdio→stdio {floor_stdio:.1} µs CPU/call, stdio→HTTP {floor_http:.1} µs CPU/call"
        );
        bare[0].push(floor_stdio);
        bare[1].push(floor_http);
        bare[2].push(relay_added(&me, &format!("http-relay:{upstream}"), &mut direct).await);
        let tokio_stdio = bare_cpu_per_call(&me, "tokio-stdio").as_secs_f64() * 1e6;
        let tokio_http =
            bare_cpu_per_call(&me, &format!("tokio-http:{upstream}")).as_secs_f64() * 1e6;
        let tokio_added =
            relay_added(&me, &format!("tokio-http-relay:{upstream}"), &mut direct).await;
        eprintln!(
            "round {round} bare HTTP→HTTP relay: +{:.1} µs p50; async relays: stdio→stdio {tokio_stdio:.1} µs CPU/call, stdio→HTTP {tokio_http:.1} µs CPU/call, HTTP→HTTP +{tokio_added:.1} µs p50",
            bare[2][round]
        );
        for (figure, value) in asynchronous
            .iter_mut()
            .zip([tokio_stdio, tokio_http, tokio_added])
        {
            figure.push(value);
        }
        {
            let bin = &builds[0].1;
            let (mut legacy, proxy) = http_to_http(bin, &upstream).await;
            let (legacy_added, legacy_cpu) = added_and_cpu(&mut legacy, &mut direct, &proxy).await;
            drop(proxy);
            let (mut modern, proxy) = modern_http_to_http(bin, &upstream).await;
            let (modern_added, modern_cpu) =
                added_and_cpu(&mut modern, &mut direct_modern, &proxy).await;
            drop(proxy);
            eprintln!(
                "round {round} HTTP→HTTP by era: legacy +{legacy_added:.1} µs p50, {legacy_cpu:.1} µs CPU/call; 2026-07-28 +{modern_added:.1} µs p50, {modern_cpu:.1} µs CPU/call"
            );
            for (figure, value) in
                eras.iter_mut()
                    .zip([legacy_added, legacy_cpu, modern_added, modern_cpu])
            {
                figure.push(value);
            }
        }
        // Which build goes first alternates by round: on a busy VM the first of a pair can run
        // slower, even on a path the change measured does not touch.
        let order: Vec<usize> = (0..builds.len())
            .map(|i| (i + round) % builds.len())
            .collect();
        for k in order {
            let bin = &builds[k].1;
            let stdio = stdio_cpu_per_call(bin, &[], &me);
            let http = stdio_cpu_per_call(bin, &["--upstream", &upstream], &me);
            let (mut through, proxy) = http_to_http(bin, &upstream).await;
            let (added, _) = added_and_cpu(&mut through, &mut direct, &proxy).await;
            drop(proxy);
            figures[k][0].push(stdio.as_secs_f64() * 1e6);
            figures[k][1].push(http.as_secs_f64() * 1e6);
            figures[k][2].push(added);
            eprintln!(
                "round {round} {}: stdio→stdio {:.1} µs CPU/call, stdio→HTTP {:.1} µs CPU/call, HTTP→HTTP +{:.1} µs p50",
                builds[k].0,
                stdio.as_secs_f64() * 1e6,
                http.as_secs_f64() * 1e6,
                added
            );
        }
    }
    println!(
        "proxy in front of a Streamable HTTP server ({ROUNDS} rounds × {CALLS} calls; min / median / max over rounds):"
    );
    let (b0, b1, b2) = spread(&mut bare[0].clone());
    let (c0, c1, c2) = spread(&mut bare[1].clone());
    println!("  bare blocking relays (the floor: no protocol work, no runtime):");
    println!("    stdio→stdio CPU/call        {b0:.1} / {b1:.1} / {b2:.1} µs");
    println!("    stdio→HTTP  CPU/call        {c0:.1} / {c1:.1} / {c2:.1} µs");
    let (d0, d1, d2) = spread(&mut bare[2].clone());
    println!(
        "    HTTP→HTTP p50 added         {d0:.1} / {d1:.1} / {d2:.1} µs over the server direct"
    );
    println!("  async relays (tokio, and hyper for HTTP: the proxy's stack, no protocol work):");
    let [t_stdio, t_http, t_added] = &asynchronous;
    let (t0, t1, t2) = spread(&mut t_stdio.clone());
    println!("    stdio→stdio CPU/call        {t0:.1} / {t1:.1} / {t2:.1} µs");
    let (t0, t1, t2) = spread(&mut t_http.clone());
    println!("    stdio→HTTP  CPU/call        {t0:.1} / {t1:.1} / {t2:.1} µs");
    let (t0, t1, t2) = spread(&mut t_added.clone());
    println!(
        "    HTTP→HTTP p50 added         {t0:.1} / {t1:.1} / {t2:.1} µs over the server direct"
    );
    let ratio = |a: &[f64], b: &[f64]| {
        let mut ratios: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
        spread(&mut ratios)
    };
    let (m0, m1, m2) = ratio(&eras[2], &eras[0]);
    let (n0, n1, n2) = ratio(&eras[3], &eras[1]);
    let [la, lc, ma, mc] = &mut eras;
    let ((la0, la1, la2), (lc0, lc1, lc2)) = (spread(la), spread(lc));
    let ((ma0, ma1, ma2), (mc0, mc1, mc2)) = (spread(ma), spread(mc));
    println!(
        "  HTTP→HTTP by era, this build (the same call, each against the server direct in its era):"
    );
    println!(
        "    legacy (session) p50 added  {la0:.1} / {la1:.1} / {la2:.1} µs, CPU/call {lc0:.1} / {lc1:.1} / {lc2:.1} µs"
    );
    println!(
        "    2026-07-28 p50 added        {ma0:.1} / {ma1:.1} / {ma2:.1} µs, CPU/call {mc0:.1} / {mc1:.1} / {mc2:.1} µs"
    );
    println!(
        "    modern ÷ legacy             added {m0:.2} / {m1:.2} / {m2:.2}×, CPU {n0:.2} / {n1:.2} / {n2:.2}×  (target ≤ 1×)"
    );
    for (k, (name, _)) in builds.iter().enumerate() {
        let over_floor = |mine: &[f64], floor: &[f64]| {
            let mut ratios: Vec<f64> = mine.iter().zip(floor).map(|(m, f)| m / f).collect();
            spread(&mut ratios)
        };
        let (f0, f1, f2) = over_floor(&figures[k][0], &bare[0]);
        let (g0, g1, g2) = over_floor(&figures[k][1], &bare[1]);
        let (e0, e1, e2) = over_floor(&figures[k][2], &bare[2]);
        let (u0, u1, u2) = over_floor(&figures[k][0], &asynchronous[0]);
        let (v0, v1, v2) = over_floor(&figures[k][1], &asynchronous[1]);
        let (w0, w1, w2) = over_floor(&figures[k][2], &asynchronous[2]);
        let [stdio, http, added] = &mut figures[k];
        let (s0, s1, s2) = spread(stdio);
        let (h0, h1, h2) = spread(http);
        let (a0, a1, a2) = spread(added);
        println!(
            "  {name} (min / median / max; ratios per round, against the bare floor and the async one):"
        );
        println!("    stdio→stdio proxy CPU/call  {s0:.1} / {s1:.1} / {s2:.1} µs");
        println!(
            "      ÷ bare {f0:.2} / {f1:.2} / {f2:.2}×  (#28: ≤ 1.5×), ÷ async {u0:.2} / {u1:.2} / {u2:.2}×"
        );
        println!("    stdio→HTTP  proxy CPU/call  {h0:.1} / {h1:.1} / {h2:.1} µs");
        println!(
            "      ÷ bare {g0:.2} / {g1:.2} / {g2:.2}×  (#28: ≤ 2×), ÷ async {v0:.2} / {v1:.2} / {v2:.2}×"
        );
        println!(
            "    HTTP→HTTP p50 added         {a0:.1} / {a1:.1} / {a2:.1} µs over the server direct"
        );
        println!(
            "      ÷ bare {e0:.2} / {e1:.2} / {e2:.2}×  (#28: ≤ 2×), ÷ async {w0:.2} / {w1:.2} / {w2:.2}×"
        );
    }
}
