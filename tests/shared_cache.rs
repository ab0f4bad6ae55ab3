//! The shared result cache (`--cache redis://…`): two `--listen` replicas with one cursor key
//! and one real `redis-server`, each in front of its own modern server (examples/
//! modern_server.rs, whose `rows` tool is not read-only and notes every run in a file).
//!
//! A chain goes on at the other replica from the shared cache (the tool ran once); what Redis
//! holds is sealed (no text of the result), an entry moved under another principal's key or
//! tampered with does not open (the call is a cache miss, counted); with Redis gone, calls
//! are answered and a later page elsewhere gets the documented miss.
//!
//! `redis-server` must be installed (Debian's package; `.ci/run` installs it). Without it these
//! tests fail with the install command; `MCP_BUDGET_SKIP_REDIS=1` skips them instead, each
//! saying so (never under `MCP_BUDGET_REQUIRE_REDIS=1`, which CI sets).
//! `MCP_BUDGET_REDIS_SERVER=valkey-server` runs them all on Valkey instead (`.ci/run` does both).

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::{continuation, example, last_message, listen};
use serde_json::{Value, json};

const MODERN: &str = "2026-07-28";

/// A real redis-server on a free port, in a directory of its own; stopped when dropped.
struct Redis {
    child: std::process::Child,
    port: u16,
    /// What the replicas are given as `--cache` (the plain port, a unix socket, or TLS).
    cache: String,
    /// The environment the replicas need for it (the test CA, for TLS).
    env: Vec<(String, String)>,
    dir: PathBuf,
}

/// How the replicas reach Redis (the test itself always uses the plain port).
#[derive(Clone, Copy, PartialEq)]
enum Transport {
    Tcp,
    Unix,
    /// `rediss://`, the server's certificate signed by a test CA the replicas trust through
    /// `SSL_CERT_FILE`.
    Tls,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A test CA and a certificate for 127.0.0.1 it signed, made with the openssl command in
/// `dir`: (ca.pem, cert.pem, key.pem).
fn certificates(dir: &std::path::Path) -> (PathBuf, PathBuf, PathBuf) {
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("the openssl command (apt-get install openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=mcp-budget test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "key.pem",
        "-out",
        "cert.csr",
    ]);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "cert.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        "-out",
        "cert.pem",
    ]);
    (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    )
}

impl Redis {
    fn start(name: &str) -> Option<Redis> {
        Redis::start_on(name, Transport::Tcp)
    }

    fn start_on(name: &str, transport: Transport) -> Option<Redis> {
        let server =
            std::env::var("MCP_BUDGET_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        if std::process::Command::new(&server)
            .arg("--version")
            .output()
            .is_err()
        {
            // Never a quiet pass: without the server this fails with the install command,
            // unless the run says it skips these tests (and then each says so).
            assert!(
                std::env::var("MCP_BUDGET_SKIP_REDIS").as_deref() == Ok("1")
                    && std::env::var("MCP_BUDGET_REQUIRE_REDIS").as_deref() != Ok("1"),
                "{server} is not installed: apt-get install redis-server (or valkey-server from bookworm-backports); \
                 MCP_BUDGET_SKIP_REDIS=1 skips the shared-cache tests instead"
            );
            eprintln!(
                "SKIPPED (MCP_BUDGET_SKIP_REDIS=1): {server} is not installed (apt-get install redis-server)"
            );
            return None;
        }
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("mcp-budget-redis-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut command = std::process::Command::new(&server);
        command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir);
        let mut cache = format!("redis://127.0.0.1:{port}/0");
        let mut env = Vec::new();
        match transport {
            Transport::Tcp => {}
            Transport::Unix => {
                let socket = dir.join("redis.sock");
                command
                    .arg("--unixsocket")
                    .arg(&socket)
                    .args(["--unixsocketperm", "700"]);
                cache = format!("unix://{}", socket.display());
            }
            Transport::Tls => {
                let (ca, cert, key) = certificates(&dir);
                let tls = free_port();
                command
                    .args(["--tls-port", &tls.to_string()])
                    .arg("--tls-cert-file")
                    .arg(&cert)
                    .arg("--tls-key-file")
                    .arg(&key)
                    .arg("--tls-ca-cert-file")
                    .arg(&ca)
                    .args(["--tls-auth-clients", "no"]);
                cache = format!("rediss://127.0.0.1:{tls}/0");
                env.push(("SSL_CERT_FILE".into(), ca.display().to_string()));
            }
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {server}: {e}"));
        let redis = Redis {
            child,
            port,
            cache,
            env,
            dir,
        };
        for _ in 0..500 {
            let socket_ready =
                transport != Transport::Unix || redis.dir.join("redis.sock").exists();
            if socket_ready && redis.connection().is_some() {
                return Some(redis);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("{server} did not start on port {port}");
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    fn connection(&self) -> Option<redis::Connection> {
        let client = redis::Client::open(self.url()).ok()?;
        let mut connection = client.get_connection().ok()?;
        redis::cmd("PING")
            .query::<String>(&mut connection)
            .ok()
            .map(|_| connection)
    }

    /// Every key under `prefix`, with its value.
    fn entries(&self, prefix: &str) -> Vec<(String, Vec<u8>)> {
        let mut connection = self.connection().expect("redis");
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query(&mut connection)
            .unwrap();
        keys.into_iter()
            .map(|k| {
                let v: Vec<u8> = redis::cmd("GET").arg(&k).query(&mut connection).unwrap();
                (k, v)
            })
            .collect()
    }

    fn set(&self, key: &str, value: &[u8]) {
        let mut connection = self.connection().expect("redis");
        let () = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .query(&mut connection)
            .unwrap();
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// A modern `tools/call rows` at `url`, as `token` (when given).
async fn rows(
    http: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    id: u64,
    arguments: Value,
) -> Value {
    call(http, url, token, id, "rows", arguments).await
}

/// A modern `tools/call` of `tool` at `url`, as `token` (when given).
async fn call(
    http: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    id: u64,
    tool: &str,
    arguments: Value,
) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
    "name": tool, "arguments": arguments,
    "_meta": {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "replica-test", "version": "1"},
    }}});
    let mut request = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", MODERN)
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .body(body.to_string());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let text = request.send().await.unwrap().text().await.unwrap();
    last_message(&text)
}

/// The text of a page's first block (the rows' JSON text, cut).
fn page_text(answer: &Value) -> String {
    answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {answer}"))
        .to_string()
}

/// The rows of a page: its text is a JSON array of some of them.
fn page_rows(answer: &Value) -> Vec<Value> {
    serde_json::from_str(&page_text(answer)).unwrap_or_else(|e| panic!("{e}: {answer:.300}"))
}

/// A metric's value summed over its labels, from a replica's `/metrics`.
async fn metric(http: &reqwest::Client, url: &str, name: &str) -> f64 {
    let metrics_url = url.replace("/mcp", "/metrics");
    let text = http
        .get(metrics_url)
        .bearer_auth("a-secret")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

struct Replicas {
    urls: Vec<String>,
    _children: Vec<tokio::process::Child>,
    runs: PathBuf,
}

/// `n` replicas, one cursor key, one Redis; tokens `a-secret` and `b-secret` (two principals).
async fn replicas(redis: &Redis, n: usize, name: &str, extra: &[&str]) -> Replicas {
    let server = example("modern_server");
    let server = [server.to_str().unwrap()];
    replicas_of(
        redis,
        n,
        name,
        &[&["--policy", "none"], extra].concat(),
        &server,
    )
    .await
}

/// [`replicas`] in front of `server`, with these options (a policy among them).
async fn replicas_of(
    redis: &Redis,
    n: usize,
    name: &str,
    extra: &[&str],
    server: &[&str],
) -> Replicas {
    let dir =
        std::env::temp_dir().join(format!("mcp-budget-replicas-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("cursor.key");
    std::fs::write(&key, b"one key for every replica of this test").unwrap();
    let mut permissions = std::fs::metadata(&key).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o600);
    std::fs::set_permissions(&key, permissions).unwrap();
    let runs = dir.join("runs");
    let _ = std::fs::remove_file(&runs);
    let cache = redis.cache.clone();
    let mut env: Vec<(&str, &str)> = vec![("TOKEN_A", "a-secret"), ("TOKEN_B", "b-secret")];
    env.extend(redis.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let mut urls = Vec::new();
    let mut children = Vec::new();
    for _ in 0..n {
        let mut args = vec![
            "--metrics",
            "listen",
            "--cursor-key-file",
            key.to_str().unwrap(),
            "--cache",
            &cache,
            "--auth-token-env",
            "TOKEN_A",
            "--auth-token-env",
            "TOKEN_B",
        ];
        args.extend_from_slice(extra);
        args.push("--");
        args.extend_from_slice(server);
        let (child, url) = listen(&args, &env).await;
        urls.push(url);
        children.push(child);
    }
    Replicas {
        urls,
        _children: children,
        runs,
    }
}

fn runs(file: &PathBuf) -> usize {
    std::fs::read_to_string(file).map_or(0, |t| t.lines().count())
}

const ROWS: u64 = 12_000;

#[tokio::test]
async fn a_chain_goes_on_at_any_replica_from_the_shared_cache_and_the_tool_runs_once() {
    if let Some(redis) = Redis::start("chain") {
        chain_across_replicas(&redis, "chain").await;
    }
}

#[tokio::test]
async fn the_shared_cache_works_over_a_unix_socket() {
    if let Some(redis) = Redis::start_on("unix", Transport::Unix) {
        assert!(redis.cache.starts_with("unix:///"), "{}", redis.cache);
        chain_across_replicas(&redis, "unix").await;
    }
}

#[tokio::test]
async fn the_shared_cache_works_over_tls_with_a_private_ca() {
    if let Some(redis) = Redis::start_on("tls", Transport::Tls) {
        assert!(redis.cache.starts_with("rediss://"), "{}", redis.cache);
        chain_across_replicas(&redis, "tls").await;
    }
}

/// TLS is verified: a replica that does not trust the test CA cannot use the cache (counted
/// errors), and its calls are still answered.
#[tokio::test]
async fn a_tls_cache_whose_certificate_is_not_trusted_is_not_used() {
    let Some(mut redis) = Redis::start_on("untrusted", Transport::Tls) else {
        return;
    };
    redis.env.clear();
    let set = replicas(&redis, 2, "untrusted", &["--cache-timeout-ms", "500"]).await;
    let http = http_client();
    let arguments = json!({"rows": ROWS, "file": set.runs.to_str().unwrap()});
    let first = rows(&http, &set.urls[0], Some("a-secret"), 1, arguments.clone()).await;
    let cursor =
        continuation(&first["result"]).expect("the first page, answered without the cache");
    let mut after = arguments;
    after["after"] = json!(cursor);
    let elsewhere = rows(&http, &set.urls[1], Some("a-secret"), 2, after).await;
    assert_eq!(elsewhere["result"]["isError"], json!(true), "{elsewhere}");
    assert!(page_text(&elsewhere).contains("no longer in mcp-budget's cache"));
    assert!(metric(&http, &set.urls[0], "mcp_budget_remote_cache_errors_total").await >= 1.0);
    assert!(redis.entries("mcpb:").is_empty(), "nothing was written");
    assert_eq!(runs(&set.runs), 1);
}

/// A replica that never saw the tools listed still knows a read-only tool from the cursor the
/// first page carried: on a miss (Redis gone) it runs the tool again and serves the page, where
/// it would otherwise tell the client to start over.
#[tokio::test]
async fn a_read_only_tool_is_run_again_by_a_replica_that_never_saw_it_listed() {
    let Some(mut redis) = Redis::start("rerun") else {
        return;
    };
    let set = replicas(&redis, 2, "rerun", &["--cache-timeout-ms", "300"]).await;
    let http = http_client();
    // Only the first replica sees the list (and learns read_rows is read-only).
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
    }}});
    let listed = http
        .post(&set.urls[0])
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", MODERN)
        .header("mcp-method", "tools/list")
        .bearer_auth("a-secret")
        .body(list.to_string())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(listed.contains("readOnlyHint"), "{listed}");
    let arguments = json!({"rows": ROWS, "file": set.runs.to_str().unwrap()});
    let first = call(
        &http,
        &set.urls[0],
        Some("a-secret"),
        2,
        "read_rows",
        arguments.clone(),
    )
    .await;
    let mut rebuilt = page_rows(&first);
    let cursor = continuation(&first["result"]).expect("more than one page");
    redis.stop();
    let mut after = arguments;
    after["after"] = json!(cursor);
    let second = call(&http, &set.urls[1], Some("a-secret"), 3, "read_rows", after).await;
    assert!(
        second["result"]["isError"] != json!(true),
        "the page was refused: {second:.400}"
    );
    let page = page_rows(&second);
    assert_eq!(
        page[0]["n"],
        json!(rebuilt.len()),
        "the page after the first"
    );
    rebuilt.extend(page);
    assert_eq!(
        runs(&set.runs),
        2,
        "run once, then again by the replica that missed"
    );
    assert!(metric(&http, &set.urls[1], "mcp_budget_remote_cache_errors_total").await >= 1.0);
}

/// A TCP forwarder to Redis whose connections can be silenced: `silence` makes every
/// connection open now stop passing bytes both ways, without closing (a blackholed path);
/// connections made later pass bytes again.
struct Blackhole {
    port: u16,
    /// Connections numbered up to this one pass nothing.
    silenced: std::sync::Arc<std::sync::atomic::AtomicU64>,
    opened: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Blackhole {
    async fn to(port: u16) -> Blackhole {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front = listener.local_addr().unwrap().port();
        let silenced = Arc::new(AtomicU64::new(0));
        let opened = Arc::new(AtomicU64::new(0));
        let (s, o) = (silenced.clone(), opened.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let number = o.fetch_add(1, Ordering::SeqCst) + 1;
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                for (mut from, mut to) in [(cr, sw), (sr, cw)] {
                    let s = s.clone();
                    tokio::spawn(async move {
                        use tokio::io::{AsyncReadExt, AsyncWriteExt};
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n) = from.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                            if number <= s.load(Ordering::SeqCst) {
                                // Silent from now on: hold the bytes and the socket.
                                std::future::pending::<()>().await;
                            }
                            if to.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    });
                }
            }
        });
        Blackhole {
            port: front,
            silenced,
            opened,
        }
    }

    fn silence(&self) {
        use std::sync::atomic::Ordering;
        self.silenced
            .store(self.opened.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

/// A connection to Redis that goes silent (blackholed, never closed) is replaced after a
/// timeout: the next chains cross replicas from the cache again. Before, every operation
/// timed out on the silent connection until the kernel gave up on it, many minutes later.
#[tokio::test]
async fn a_silent_connection_to_redis_is_replaced_after_a_timeout() {
    let Some(mut redis) = Redis::start("silent") else {
        return;
    };
    let hole = Blackhole::to(redis.port).await;
    redis.cache = format!("redis://127.0.0.1:{}/0", hole.port);
    let set = replicas(&redis, 2, "silent", &["--cache-timeout-ms", "300"]).await;
    let http = http_client();
    let hits = |i: usize| metric(&http, &set.urls[i], "mcp_budget_remote_cache_hits_total");
    // A chain crossing replicas: both hold a connection through the forwarder.
    let chain = |rows_n: u64, id: u64| {
        let http = http.clone();
        let urls = set.urls.clone();
        let file = set.runs.to_str().unwrap().to_string();
        async move {
            let arguments = json!({"rows": rows_n, "file": file});
            let first = rows(&http, &urls[0], Some("a-secret"), id, arguments.clone()).await;
            let cursor = continuation(&first["result"]).expect("more than one page");
            let mut after = arguments;
            after["after"] = json!(cursor);
            rows(&http, &urls[1], Some("a-secret"), id + 1, after).await
        }
    };
    let second = chain(ROWS, 1).await;
    assert!(second["result"]["isError"] != json!(true), "{second:.300}");
    assert_eq!(hits(1).await, 1.0);
    hole.silence();
    // Both replicas time out on their silent connections (the page is a counted miss)...
    let missed = chain(ROWS + 1, 10).await;
    assert_eq!(missed["result"]["isError"], json!(true), "{missed:.300}");
    assert!(metric(&http, &set.urls[1], "mcp_budget_remote_cache_errors_total").await >= 1.0);
    // ...and then use new ones.
    let again = chain(ROWS + 2, 20).await;
    assert!(
        again["result"]["isError"] != json!(true),
        "after the timeouts, still no cache: {again:.300}"
    );
    assert_eq!(hits(1).await, 2.0);
}

/// An automatic chain alternating between two replicas on `redis`: it reassembles, the tool
/// ran once, the second replica read its pages from Redis, and Redis holds no text of it.
async fn chain_across_replicas(redis: &Redis, name: &str) {
    let set = replicas(redis, 2, name, &[]).await;
    let http = http_client();
    let arguments = json!({"rows": ROWS, "file": set.runs.to_str().unwrap()});
    let mut answer = rows(&http, &set.urls[0], Some("a-secret"), 1, arguments.clone()).await;
    let mut rebuilt: Vec<Value> = page_rows(&answer);
    let mut pages = 1;
    while let Some(next) = continuation(&answer["result"]) {
        // Every later page at the other replica than the one before.
        let url = &set.urls[pages % 2];
        let mut args = arguments.clone();
        args["after"] = json!(next);
        answer = rows(&http, url, Some("a-secret"), 1 + pages as u64, args).await;
        assert!(
            answer["result"]["isError"] != json!(true),
            "page {} refused: {answer}",
            pages + 1
        );
        rebuilt.extend(page_rows(&answer));
        pages += 1;
    }
    assert!(pages >= 4, "the result took {pages} pages");
    assert_eq!(rebuilt.len() as u64, ROWS);
    assert_eq!(
        rebuilt[4321]["label"],
        format!("row {:06} {}", 4321, "m".repeat(40))
    );
    assert_eq!(runs(&set.runs), 1, "the tool (not read-only) ran once");
    // The first replica holds the chain in memory; the other read every page it served from
    // the shared cache.
    assert_eq!(
        metric(&http, &set.urls[1], "mcp_budget_remote_cache_hits_total").await as usize,
        pages / 2
    );
    assert_eq!(
        metric(&http, &set.urls[0], "mcp_budget_remote_cache_hits_total").await,
        0.0
    );
    // What Redis holds is sealed: no row, no label, no text of the result.
    let entries = redis.entries("mcpb:");
    assert!(entries.len() >= pages - 1, "{} entries", entries.len());
    for (key, value) in &entries {
        assert!(
            !key.contains("rows") && !key.contains(ROWS.to_string().as_str()),
            "{key}"
        );
        for needle in [b"row 0".as_slice(), b"mmmmmmmm", b"label", b"content"] {
            assert!(
                !value.windows(needle.len()).any(|w| w == needle),
                "{key} holds {:?} in clear",
                String::from_utf8_lossy(needle)
            );
        }
    }
}

#[tokio::test]
async fn a_rule_chain_goes_on_at_any_replica_with_the_pages_one_replica_serves() {
    let Some(redis) = Redis::start("rules") else {
        return;
    };
    let fleet = example("fleet_server");
    let server = [fleet.to_str().unwrap(), "--streams", "600", "--seed", "7"];
    let set = replicas_of(&redis, 2, "rules", &["--policy", "builtin:fleet"], &server).await;
    let http = http_client();
    let chain = |alternate: bool| {
        let http = http.clone();
        let urls = set.urls.clone();
        async move {
            let arguments = json!({"horizon": "all", "limit": 25});
            let mut answer = call(
                &http,
                &urls[0],
                Some("a-secret"),
                1,
                "fleet_show",
                arguments.clone(),
            )
            .await;
            let mut pages = vec![answer["result"].clone()];
            while let Some(next) = continuation(&answer["result"]) {
                let url = &urls[if alternate { pages.len() % 2 } else { 0 }];
                let mut args = arguments.clone();
                args["after"] = json!(next);
                answer = call(
                    &http,
                    url,
                    Some("a-secret"),
                    1 + pages.len() as u64,
                    "fleet_show",
                    args,
                )
                .await;
                assert!(answer["result"]["isError"] != json!(true), "{answer:.400}");
                pages.push(answer["result"].clone());
            }
            pages
        }
    };
    let held = chain(false).await;
    assert!(held.len() >= 4, "{} pages", held.len());
    let crossing = chain(true).await;
    assert_eq!(crossing.len(), held.len());
    for (k, (a, b)) in held.iter().zip(&crossing).enumerate() {
        assert_eq!(a, b, "page {} differs", k + 1);
    }
    assert_eq!(
        metric(&http, &set.urls[1], "mcp_budget_remote_cache_hits_total").await as usize,
        held.len() / 2,
        "every page the second replica served came from the shared cache"
    );
}

#[tokio::test]
async fn an_entry_moved_to_another_principal_or_tampered_with_does_not_open() {
    let Some(redis) = Redis::start("sealed") else {
        return;
    };
    let set = replicas(&redis, 2, "sealed", &[]).await;
    let http = http_client();
    let arguments = json!({"rows": ROWS, "file": set.runs.to_str().unwrap()});
    let first = rows(&http, &set.urls[0], Some("a-secret"), 1, arguments.clone()).await;
    let cursor = continuation(&first["result"]).expect("a paged result");
    let pages = |entries: Vec<(String, Vec<u8>)>| -> Vec<(String, Vec<u8>)> {
        entries
            .into_iter()
            .filter(|(k, _)| !k.ends_with(":bytes"))
            .collect()
    };
    let a_pages = pages(redis.entries("mcpb:"));
    assert!(!a_pages.is_empty());
    // mcpb:<key id>:<principal digest>:<chain>:<position>
    let a_owner = a_pages[0].0.split(':').nth(2).unwrap().to_string();
    // B cuts a chain of its own: its entries name B's principal digest.
    let b_first = rows(
        &http,
        &set.urls[1],
        Some("b-secret"),
        2,
        json!({"rows": ROWS / 2}),
    )
    .await;
    assert!(continuation(&b_first["result"]).is_some());
    let b_owner = redis
        .entries("mcpb:")
        .into_iter()
        .map(|(k, _)| k.split(':').nth(2).unwrap().to_string())
        .find(|owner| *owner != a_owner)
        .expect("B's entries");
    // Every page of A's chain, copied under B's key; B then asks the other replica with A's
    // cursor (stolen): nothing opens, and B gets the documented miss, not A's rows.
    for (key, value) in &a_pages {
        redis.set(&key.replacen(&a_owner, &b_owner, 1), value);
    }
    let mut after = arguments.clone();
    after["after"] = json!(cursor);
    let errors = metric(&http, &set.urls[1], "mcp_budget_remote_cache_errors_total").await;
    let stolen = rows(&http, &set.urls[1], Some("b-secret"), 3, after.clone()).await;
    assert_eq!(stolen["result"]["isError"], json!(true), "{stolen}");
    let said = page_text(&stolen);
    assert!(said.contains("no longer in mcp-budget's cache"), "{said}");
    assert!(!said.contains("row 0"), "B read A's rows: {said}");
    assert!(
        metric(&http, &set.urls[1], "mcp_budget_remote_cache_errors_total").await > errors,
        "the refused entry is counted"
    );
    // A's own entries, one byte changed in each: A at the other replica is refused too.
    for (key, value) in &a_pages {
        let mut changed = value.clone();
        let at = changed.len() / 2;
        changed[at] ^= 0x20;
        redis.set(key, &changed);
    }
    let errors = metric(&http, &set.urls[1], "mcp_budget_remote_cache_errors_total").await;
    let refused = rows(&http, &set.urls[1], Some("a-secret"), 4, after.clone()).await;
    assert_eq!(refused["result"]["isError"], json!(true), "{refused}");
    assert!(page_text(&refused).contains("no longer in mcp-budget's cache"));
    assert!(metric(&http, &set.urls[1], "mcp_budget_remote_cache_errors_total").await > errors);
    // Where the chain is in memory, it goes on (the shared cache is never asked).
    let own = rows(&http, &set.urls[0], Some("a-secret"), 5, after).await;
    assert!(own["result"]["isError"] != json!(true), "{own}");
    assert_eq!(runs(&set.runs), 1, "the tool was never run again");
}

#[tokio::test]
async fn with_redis_gone_calls_are_answered_and_a_page_elsewhere_is_a_counted_miss() {
    let Some(mut redis) = Redis::start("down") else {
        return;
    };
    let set = replicas(&redis, 2, "down", &["--cache-timeout-ms", "300"]).await;
    let (_required, required_url) = {
        let dir =
            std::env::temp_dir().join(format!("mcp-budget-replicas-down-{}", std::process::id()));
        let key = dir.join("cursor.key");
        listen(
            &[
                "--policy",
                "none",
                "--cursor-key-file",
                key.to_str().unwrap(),
                "--cache",
                &redis.url(),
                "--cache-required",
                "--cache-timeout-ms",
                "300",
                "--",
                example("modern_server").to_str().unwrap(),
            ],
            &[],
        )
        .await
    };
    let http = http_client();
    let health = |url: &str| url.replace("/mcp", "/healthz");
    let status = |url: String| {
        let http = http.clone();
        async move { http.get(url).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(status(health(&required_url)).await, 200);
    redis.stop();
    let arguments = json!({"rows": ROWS, "file": set.runs.to_str().unwrap()});
    let first = rows(&http, &set.urls[0], Some("a-secret"), 1, arguments.clone()).await;
    let cursor = continuation(&first["result"]).expect("the first page, answered without Redis");
    let mut after = arguments.clone();
    after["after"] = json!(cursor);
    // Its own replica still holds the chain in memory.
    let second = rows(&http, &set.urls[0], Some("a-secret"), 2, after.clone()).await;
    assert!(second["result"]["isError"] != json!(true), "{second}");
    // The other one cannot read it: the documented miss for a tool that is not read-only.
    let elsewhere = rows(&http, &set.urls[1], Some("a-secret"), 3, after).await;
    assert_eq!(elsewhere["result"]["isError"], json!(true), "{elsewhere}");
    assert!(page_text(&elsewhere).contains("no longer in mcp-budget's cache"));
    assert!(metric(&http, &set.urls[0], "mcp_budget_remote_cache_errors_total").await >= 1.0);
    assert!(metric(&http, &set.urls[1], "mcp_budget_remote_cache_errors_total").await >= 1.0);
    assert_eq!(runs(&set.runs), 1);
    // Health: only the replica that asked for it reports the cache.
    assert_eq!(status(health(&set.urls[0])).await, 200);
    assert_eq!(status(health(&required_url)).await, 503);
}

#[test]
fn a_password_on_the_command_line_is_refused_and_not_echoed() {
    let output = common::run(["--cache", "redis://:hunter2@127.0.0.1:1/0", "--", "true"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("MCP_BUDGET_CACHE"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
    let output = common::run(["--cache", "memcached://127.0.0.1:1", "--", "true"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("redis://host:port/db"));
}

#[tokio::test]
async fn a_result_reference_opens_at_any_replica_for_its_principal_alone() {
    let Some(redis) = Redis::start("refs") else {
        return;
    };
    let set = replicas(&redis, 2, "refs", &[]).await;
    let http = http_client();
    let arguments = json!({"rows": ROWS, "file": set.runs.to_str().unwrap()});
    let page = rows(&http, &set.urls[0], Some("a-secret"), 1, arguments).await;
    let text = page.to_string();
    let at = text
        .find("result_ref:\\\"")
        .unwrap_or_else(|| panic!("{text:.1000}"));
    let rest = &text[at + "result_ref:\\\"".len()..];
    let reference = rest[..rest.find("\\\"").unwrap()].to_string();
    let arguments = json!({"content": reference});
    let sink = |url: String, token: &'static str, id: u64| {
        let (http, arguments) = (http.clone(), arguments.clone());
        async move { call(&http, &url, Some(token), id, "sink", arguments).await }
    };
    let here = sink(set.urls[0].clone(), "a-secret", 2).await;
    let there = sink(set.urls[1].clone(), "a-secret", 3).await;
    assert_ne!(here["result"]["isError"], true, "{here}");
    let bytes = here["result"]["structuredContent"]["bytes"].as_u64();
    assert!(bytes.unwrap_or(0) > 500_000, "{here:.800}");
    // The other replica never held the result: it read it from the shared cache.
    assert_eq!(
        here["result"]["structuredContent"], there["result"]["structuredContent"],
        "{there:.500}"
    );
    assert_eq!(runs(&set.runs), 1, "the tool ran once");
    let other = sink(set.urls[1].clone(), "b-secret", 4).await;
    assert_eq!(other["result"]["isError"], true, "{other}");
    let text = other["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("belongs to another client"), "{text}");
}
