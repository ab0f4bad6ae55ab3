//! Peak memory under floods, with the defaults: the proxy's peak RSS (`VmHWM`) under each
//! flood against the 256 MiB bound, beside its RSS when idle and the bytes the flood sends
//! through it. Every flood runs against a fresh proxy, so each peak is that flood's alone.
//!
//! - large results: four concurrent 55 MB results in one stdio session (a text of lines, one
//!   JSON document in a text block, 55,000 text blocks), and eight sessions' 55 MB results at
//!   once over `--listen`; one 50 MB JSON-in-text result;
//! - large requests: sixteen 60 MB `tools/call` bodies at once, each in a session of its own
//!   with a valid token;
//! - search: an 89-byte JSONPath of nested wildcards and a 1,008-byte union over a cached
//!   20,000-item result (both refused by the node bound, which is what keeps them small), and
//!   a filter over a cached 250,000-item result (refused by the bound on values a path reads).
//!
//! Run with `cargo bench --bench memory`. The server is this binary in server mode.
//! `MCP_BUDGET_BIN` measures another build of the proxy.

#[path = "support/text.rs"]
mod text;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use text::Peer;

const SERVE_ENV: &str = "MCP_BUDGET_MEMORY_SERVE";
const BOUND_MIB: u64 = 256;
const MB: usize = 1_000_000;
/// The first id of a flood's calls (the initialize has taken 1).
const FIRST_ID: usize = 100;

fn main() {
    if std::env::var_os(SERVE_ENV).is_some() {
        serve();
        return;
    }
    // `cargo bench` passes --bench; nothing else is taken.
    let proxy = std::env::var_os("MCP_BUDGET_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_mcp-budget")));
    let me = std::env::current_exe().expect("the bench's own path");
    println!(
        "peak RSS of {} under each flood (defaults)",
        proxy.display()
    );
    println!(
        "| flood | sent through | idle | peak | peak ÷ {BOUND_MIB} MiB bound | took |\n|---|---:|---:|---:|---:|---:|"
    );
    type Run = fn(&Flood) -> Outcome;
    let floods: [(&str, Run); 9] = [
        ("4 × 55 MB text results, one stdio session", |f| {
            f.stdio_results("text", 4, 55 * MB)
        }),
        ("4 × 55 MB JSON-in-text results, one stdio session", |f| {
            f.stdio_results("json", 4, 55 * MB)
        }),
        (
            "4 × 55 MB results of 55,000 text blocks, one stdio session",
            |f| f.stdio_results("blocks", 4, 55 * MB),
        ),
        ("1 × 50 MB JSON-in-text result", |f| {
            f.stdio_results("json", 1, 50 * MB)
        }),
        ("8 sessions × 55 MB text results, --listen", |f| {
            f.listen_results(8, 55 * MB)
        }),
        ("16 × 60 MB request bodies in sessions, --listen", |f| {
            f.listen_bodies(16, 60 << 20)
        }),
        ("89-byte JSONPath of nested wildcards, 20,000 items", |f| {
            let nested = format!("$.items[*]{}", "[*]".repeat(20));
            f.search(&nested, 20_000, "nodes on the way")
        }),
        ("1,008-byte JSONPath union, 20,000 items", |f| {
            let union = format!("$.items[*][{}]", vec!["'id'"; 199].join(","));
            f.search(&union, 20_000, "nodes on the way")
        }),
        (
            "a JSONPath filter over 250,000 items (2.5 million values)",
            |f| f.search("$.items[?@.id == 7].name", 250_000, "values"),
        ),
    ];
    let flood = Flood { proxy, me };
    let mut over = Vec::new();
    for (name, run) in floods {
        let start = Instant::now();
        let outcome = run(&flood);
        let took = start.elapsed();
        let peak = outcome.peak_kib >> 10;
        println!(
            "| {name} | {:.1} MB | {} MiB | {peak} MiB | {:.2} | {:.1} s |",
            outcome.sent as f64 / MB as f64,
            outcome.idle_kib >> 10,
            peak as f64 / BOUND_MIB as f64,
            took.as_secs_f64()
        );
        if peak > BOUND_MIB {
            over.push(name);
        }
    }
    if !over.is_empty() {
        println!("over the bound: {over:?}");
    }
}

struct Flood {
    proxy: PathBuf,
    me: PathBuf,
}

struct Outcome {
    sent: usize,
    idle_kib: u64,
    peak_kib: u64,
}

/// A figure of `/proc/<pid>/status`, in KiB.
fn status(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

impl Flood {
    fn command(&self) -> Command {
        let mut command = Command::new(&self.proxy);
        command.stderr(Stdio::null());
        command
    }

    /// `calls` concurrent calls of `tool` for `bytes` each, in one stdio session; every answer
    /// must be a page or a refusal, never the result.
    fn stdio_results(&self, tool: &str, calls: usize, bytes: usize) -> Outcome {
        let mut command = self.command();
        command.arg("--").arg(&self.me).env(SERVE_ENV, "1");
        let mut peer = Peer::spawn(command, "memory-bench");
        let idle = status(peer.pid(), "VmRSS");
        // Ids the initialize did not use: a reused id goes upstream under a fresh one, and its
        // answer is copied to be given the client's id back (one more copy of each result).
        for id in FIRST_ID..FIRST_ID + calls {
            peer.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": tool, "arguments": {"bytes": bytes}}}));
        }
        for _ in 0..calls {
            let answer = peer.line();
            assert!(
                answer.len() < MB,
                "a page, not the result: {} bytes",
                answer.len()
            );
        }
        Outcome {
            sent: calls * bytes,
            idle_kib: idle,
            peak_kib: status(peer.pid(), "VmHWM"),
        }
    }

    /// `sessions` sessions over `--listen`, each receiving a `bytes` result at once.
    fn listen_results(&self, sessions: usize, bytes: usize) -> Outcome {
        let listener = Listener::start(self, &[]);
        let idle = status(listener.pid(), "VmRSS");
        let ids: Vec<String> = (0..sessions).map(|_| listener.initialize(None)).collect();
        let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "text", "arguments": {"bytes": bytes}}})
        .to_string();
        std::thread::scope(|scope| {
            for id in &ids {
                let (listener, call) = (&listener, &call);
                scope.spawn(move || {
                    let (status, body) = listener.post(Some(id), None, call.as_bytes());
                    assert_eq!(status, 200, "{body:.200}");
                    assert!(
                        body.len() < MB,
                        "a page, not the result: {} bytes",
                        body.len()
                    );
                });
            }
        });
        Outcome {
            sent: sessions * bytes,
            idle_kib: idle,
            peak_kib: status(listener.pid(), "VmHWM"),
        }
    }

    /// `bodies` concurrent `tools/call` POSTs of `bytes` each, one session each, with a valid
    /// token: each is passed on (200) or refused for room (503), never lost.
    fn listen_bodies(&self, bodies: usize, bytes: usize) -> Outcome {
        let token = "memory-bench";
        let listener = Listener::start(self, &["--auth-token-env", "MEMORY_BENCH_TOKEN"]);
        let idle = status(listener.pid(), "VmRSS");
        let ids: Vec<String> = (0..bodies)
            .map(|_| listener.initialize(Some(token)))
            .collect();
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"sink","arguments":{{"x":"{}"}}}}}}"#,
            "x".repeat(bytes)
        );
        std::thread::scope(|scope| {
            for id in &ids {
                let (listener, body) = (&listener, &body);
                scope.spawn(move || {
                    let (status, answer) = listener.post(Some(id), Some(token), body.as_bytes());
                    assert!(status == 200 || status == 503, "{status}: {answer:.200}");
                });
            }
        });
        Outcome {
            sent: bodies * bytes,
            idle_kib: idle,
            peak_kib: status(listener.pid(), "VmHWM"),
        }
    }

    /// A JSON result of `n` items paged (so cached), then `path` searched over it: the answer
    /// must be the refusal of the bound that `bound` names, never an error or a hang.
    fn search(&self, path: &str, n: usize, bound: &str) -> Outcome {
        let mut command = self.command();
        command.arg("--").arg(&self.me).env(SERVE_ENV, "1");
        let mut peer = Peer::spawn(command, "memory-bench");
        let idle = status(peer.pid(), "VmRSS");
        peer.send(
            &json!({"jsonrpc": "2.0", "id": FIRST_ID, "method": "tools/call",
            "params": {"name": "items", "arguments": {"items": n}}}),
        );
        let page: Value = serde_json::from_str(&peer.line()).expect("a JSON answer");
        // The notice names the next page's cursor: `after:"…"`.
        let cursor = page["result"]["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|block| block["text"].as_str())
            .find_map(|text| text.split_once("after:\"")?.1.split('"').next())
            .expect("a paged result names its next page's cursor")
            .to_string();
        peer.send(&json!({"jsonrpc": "2.0", "id": FIRST_ID + 1, "method": "tools/call",
            "params": {"name": "mcp_budget_search", "arguments": {"cursor": cursor, "path": path}}}));
        let answer: Value = serde_json::from_str(&peer.line()).expect("a JSON answer");
        let said = answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or("");
        assert!(said.contains(bound), "the bound on {bound}: {answer:.300}");
        Outcome {
            sent: items(n).len(),
            idle_kib: idle,
            peak_kib: status(peer.pid(), "VmHWM"),
        }
    }
}

/// The proxy over `--listen`, in front of this binary in server mode.
struct Listener {
    child: Child,
    address: String,
    path: String,
}

impl Listener {
    fn start(flood: &Flood, options: &[&str]) -> Listener {
        let mut child = flood
            .command()
            .args(["--listen", "http://127.0.0.1:0/mcp"])
            .args(options)
            .arg("--")
            .arg(&flood.me)
            .env(SERVE_ENV, "1")
            .env("MEMORY_BENCH_TOKEN", "memory-bench")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start mcp-budget --listen");
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut first)
            .expect("the listening line");
        let url = first
            .trim()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line: {first}"));
        let (address, path) = url.split_at(url.find('/').expect("a path"));
        Listener {
            child,
            address: address.to_string(),
            path: path.to_string(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A new legacy session's id.
    fn initialize(&self, token: Option<&str>) -> String {
        let init = br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"memory-bench","version":"1"}}}"#;
        let (status, _, headers) = self.exchange(None, token, init);
        assert_eq!(status, 200);
        headers
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("mcp-session-id")
                    .then(|| value.trim().to_string())
            })
            .expect("a session id")
    }

    fn post(&self, session: Option<&str>, token: Option<&str>, body: &[u8]) -> (u16, String) {
        let (status, body, _) = self.exchange(session, token, body);
        (status, body)
    }

    /// One POST on a connection of its own (`Connection: close`): status, body, headers.
    fn exchange(
        &self,
        session: Option<&str>,
        token: Option<&str>,
        body: &[u8],
    ) -> (u16, String, String) {
        let mut stream = TcpStream::connect(&self.address).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(300)))
            .expect("timeout");
        let mut head = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.path,
            self.address,
            body.len()
        );
        if let Some(session) = session {
            head.push_str(&format!(
                "Mcp-Session-Id: {session}\r\nMcp-Protocol-Version: 2025-11-25\r\n"
            ));
        }
        if let Some(token) = token {
            head.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        head.push_str("\r\n");
        // A refused body may be answered before it is all written: the answer still counts.
        let _ = stream
            .write_all(head.as_bytes())
            .and_then(|()| stream.write_all(body));
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let (headers, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        let status = headers
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or(0);
        (status, body.to_string(), headers.to_string())
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Server mode: a stdio MCP server whose tools answer large results of several shapes.
fn serve() {
    let stdin = std::io::stdin();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return };
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let Some(id) = message
            .get("id")
            .filter(|_| message.get("method").is_some())
        else {
            continue;
        };
        let result = match message["method"].as_str().unwrap_or("") {
            "initialize" => json!({"protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}}, "serverInfo": {"name": "memory-bench", "version": "1"}})
            .to_string(),
            "tools/list" => {
                let tools = ["text", "json", "blocks", "items", "sink"].map(|name| {
                    json!({"name": name, "inputSchema": {"type": "object"},
                        "annotations": {"readOnlyHint": true}})
                });
                json!({ "tools": tools }).to_string()
            }
            "tools/call" => {
                let arguments = &message["params"]["arguments"];
                let bytes = arguments["bytes"].as_u64().unwrap_or(1000) as usize;
                let text_result = |text: &str| json!({"content": [{"type": "text", "text": text}]});
                match message["params"]["name"].as_str().unwrap_or("") {
                    "text" => {
                        let line = format!("{}\n", "x".repeat(999));
                        text_result(&line.repeat(bytes / line.len())).to_string()
                    }
                    "json" => {
                        let item = json!({"name": "x".repeat(80), "n": 1}).to_string();
                        let items = vec![item.as_str(); bytes / (item.len() + 1)].join(",");
                        text_result(&format!("[{items}]")).to_string()
                    }
                    "blocks" => {
                        let block = json!({"type": "text", "text": "y".repeat(970)}).to_string();
                        let blocks = vec![block.as_str(); bytes / (block.len() + 1)].join(",");
                        format!(r#"{{"content":[{blocks}]}}"#)
                    }
                    "items" => {
                        let n = arguments["items"].as_u64().unwrap_or(10) as usize;
                        text_result(&items(n)).to_string()
                    }
                    _ => text_result("ok").to_string(),
                }
            }
            _ => "{}".to_string(),
        };
        let _ = writeln!(out, r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#);
        let _ = out.flush();
    }
}

/// A JSON document of `n` items, as the `items` tool answers it in a text block.
fn items(n: usize) -> String {
    let items: Vec<Value> = (0..n)
        .map(|i| json!({"id": i, "name": format!("item-{i}"), "tags": ["a", "b", "c"], "state": {"open": i % 2 == 0, "owner": "x"}}))
        .collect();
    json!({ "items": items }).to_string()
}
