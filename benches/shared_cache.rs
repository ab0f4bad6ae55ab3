//! The shared result cache (`--cache redis://…`, issue #27), side by side in one run against
//! the replica's memory (`--cache memory`), on a real `redis-server` on loopback:
//!
//! 1. **a page from Redis against a page from memory**: the later pages of an automatic chain
//!    of a 4 MB text, each served by a proxy that never held the chain (the first call went to
//!    another proxy, so every page is read from Redis and opened), against the same pages from
//!    the memory of the proxy that made the first call (`--cache memory`);
//! 2. **the first page**: the first call with `--cache redis` (every later page cut, sealed and
//!    written before the first page goes out) against the first call with `--cache memory`;
//! 3. **a chain on 3 replicas against 1**: the whole chain, page `k` on replica `k mod 3`, all
//!    three on one Redis, against the whole chain on one replica (memory, and Redis).
//!
//! Every chain is checked to reassemble the text exactly. The proxies are stdio processes with one
//! cursor key file (a stdio client is one principal in every process), each with its own copy
//! of the server: the bench binary in server mode.
//!
//! Run with `cargo bench --bench shared_cache` (skipped, saying so, when `redis-server` is not
//! installed). `SHARED_CACHE_BYTES` sets the text's size.

#[path = "support/text.rs"]
mod text;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use text::{Chain, Peer, TEXT_ENV, follow, follow_routed, median, serve};

const BYTES: usize = 4_000_000;
const ROUNDS: usize = 5;

struct Redis(Child);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `redis-server` on a free loopback port, answering PING; None when it is not installed.
fn redis(dir: &Path) -> Option<(Redis, u16)> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "no", "--maxmemory", "1gb"])
        .args(["--maxmemory-policy", "allkeys-lru", "--dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let redis = Redis(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
            let mut answer = [0u8; 7];
            if stream.write_all(b"PING\r\n").is_ok()
                && stream.read_exact(&mut answer).is_ok()
                && &answer == b"+PONG\r\n"
            {
                return Some((redis, port));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("redis-server did not answer PING on port {port} within 10 s");
}

fn proxy(bin: &Path, me: &Path, key: &Path, cache: &str, bytes: usize) -> Peer {
    let mut command = Command::new(bin);
    command
        .arg("--cursor-key-file")
        .arg(key)
        .args(["--cache", cache, "--"])
        .arg(me);
    Peer::start(command, "bench", bytes)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    if let Some(bytes) = std::env::var_os(TEXT_ENV) {
        serve(bytes.to_string_lossy().parse().unwrap_or(BYTES));
        return;
    }
    let bytes: usize = std::env::var("SHARED_CACHE_BYTES")
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or(BYTES);
    let me = std::env::current_exe().expect("own path");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_mcp-budget"));
    let dir = std::env::temp_dir().join(format!("mcp-budget-bench-cache-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let Some((_redis, port)) = redis(&dir) else {
        println!(
            "shared_cache: skipped (redis-server is not installed; apt-get install redis-server)"
        );
        return;
    };
    let key = dir.join("cursor.key");
    let mut secret = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut secret))
        .expect("random bytes");
    // As hex: raw bytes could begin or end with one the key reader trims as white space.
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&key, hex).expect("the cursor key");
    // The proxy refuses a key file others can read.
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("the cursor key's mode");
    let shared = format!("redis://127.0.0.1:{port}/0");
    let expected = text::text(bytes);

    let mut memory = [proxy(&bin, &me, &key, "memory", bytes)];
    let mut one = [proxy(&bin, &me, &key, &shared, bytes)];
    // Two replicas: the first call on [0], every later page on [1].
    let mut elsewhere = [
        proxy(&bin, &me, &key, &shared, bytes),
        proxy(&bin, &me, &key, &shared, bytes),
    ];
    let mut three = [
        proxy(&bin, &me, &key, &shared, bytes),
        proxy(&bin, &me, &key, &shared, bytes),
        proxy(&bin, &me, &key, &shared, bytes),
    ];

    let check = |what: &str, chain: &Chain| {
        assert!(chain.pages > 1, "{what}: the text was not paged");
        assert!(
            chain.text == expected,
            "{what}: the chain did not reassemble the text ({} of {} bytes)",
            chain.text.len(),
            expected.len()
        );
    };
    let per_page = |chain: &Chain| chain.rest.as_secs_f64() / (chain.pages - 1) as f64;
    let (mut page_memory, mut page_redis, mut page_local) = (Vec::new(), Vec::new(), Vec::new());
    let (mut first_memory, mut first_redis) = (Vec::new(), Vec::new());
    let (mut chain_memory, mut chain_one, mut chain_three) = (Vec::new(), Vec::new(), Vec::new());
    let mut pages = 0;
    // A warm-up chain on every proxy (the first call of a process connects to Redis).
    follow(&mut memory);
    follow(&mut one);
    follow(&mut elsewhere);
    follow(&mut three);
    for round in 0..ROUNDS {
        let m = follow(&mut memory);
        check("memory", &m);
        let o = follow(&mut one);
        check("one replica on Redis", &o);
        let e = follow_routed(&mut elsewhere, |k| usize::from(k > 0));
        check("pages from Redis", &e);
        let t = follow(&mut three);
        check("three replicas", &t);
        pages = m.pages;
        eprintln!(
            "round {round}: {} pages; a later page from memory {:.3} ms, from Redis {:.3} ms (from the memory of a Redis replica {:.3} ms); first page {:.1} ms (memory) {:.1} ms (Redis); chain on 1 replica {:.1} ms (memory) {:.1} ms (Redis), on 3 replicas {:.1} ms",
            m.pages,
            per_page(&m) * 1e3,
            per_page(&e) * 1e3,
            per_page(&o) * 1e3,
            ms(m.first),
            ms(o.first),
            ms(m.first + m.rest),
            ms(o.first + o.rest),
            ms(t.first + t.rest),
        );
        page_memory.push(per_page(&m));
        page_redis.push(per_page(&e));
        page_local.push(per_page(&o));
        first_memory.push(m.first.as_secs_f64());
        first_redis.push(o.first.as_secs_f64());
        chain_memory.push((m.first + m.rest).as_secs_f64());
        chain_one.push((o.first + o.rest).as_secs_f64());
        chain_three.push((t.first + t.rest).as_secs_f64());
    }
    drop((memory, one, elsewhere, three));
    let _ = std::fs::remove_dir_all(&dir);
    let (pm, pr, pl) = (
        median(&mut page_memory),
        median(&mut page_redis),
        median(&mut page_local),
    );
    let (fm, fr) = (median(&mut first_memory), median(&mut first_redis));
    let (cm, co, ct) = (
        median(&mut chain_memory),
        median(&mut chain_one),
        median(&mut chain_three),
    );
    println!(
        "a {bytes}-byte text in {pages} automatic pages, {ROUNDS} rounds (medians), one redis-server on loopback:"
    );
    println!(
        "  a later page from Redis (a replica that never held the chain) {:.3} ms, from memory (--cache memory) {:.3} ms = {:.2}×; from the memory of a --cache redis replica {:.3} ms",
        pr * 1e3,
        pm * 1e3,
        pr / pm,
        pl * 1e3
    );
    println!(
        "  the first page with --cache redis (every later page sealed and written first) {:.1} ms, with --cache memory {:.1} ms = {:.2}×",
        fr * 1e3,
        fm * 1e3,
        fr / fm
    );
    println!(
        "  the whole chain on 3 replicas (round robin, one Redis) {:.1} ms, on 1 replica {:.1} ms (--cache memory) = {:.2}×, {:.1} ms (--cache redis) = {:.2}×",
        ct * 1e3,
        cm * 1e3,
        ct / cm,
        co * 1e3,
        ct / co
    );
}
