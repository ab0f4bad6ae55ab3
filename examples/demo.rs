//! The main job on the bundled example: mcp-budget with `policies/fleet.toml` in front of the
//! example fleet server, driven by a short scripted client session whose exchanges and sizes
//! it prints, then the before/after of `fleet_show` in bytes and tokens (tiktoken o200k).
//!
//! ```text
//! cargo run --release --example demo [-- --streams 240]
//! ```
//!
//! It builds the proxy and the fleet server (release) and speaks raw MCP to them on stdio.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

struct Client {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

/// One answer: the response and its size on the wire.
struct Reply {
    message: Value,
    bytes: usize,
}

impl Client {
    fn start(program: &Path, args: &[&str]) -> Result<Client> {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        let mut client = Client {
            stdin: child.stdin.take().context("stdin")?,
            stdout: BufReader::new(child.stdout.take().context("stdout")?),
            child,
            next_id: 1,
        };
        client.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "demo", "version": "1"}}),
        )?;
        writeln!(
            client.stdin,
            "{}",
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
        )?;
        Ok(client)
    }

    fn request(&mut self, method: &str, params: Value) -> Result<Reply> {
        let id = self.next_id;
        self.next_id += 1;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(self.stdin, "{line}")?;
        self.stdin.flush()?;
        loop {
            let mut reply = String::new();
            if self.stdout.read_line(&mut reply)? == 0 {
                bail!("the server closed its output");
            }
            let message: Value = serde_json::from_str(&reply).context("reply is not JSON")?;
            if message["id"] == json!(id) {
                return Ok(Reply {
                    message,
                    bytes: reply.trim_end().len(),
                });
            }
        }
    }

    fn call(&mut self, tool: &str, arguments: Value) -> Result<Reply> {
        self.request("tools/call", json!({"name": tool, "arguments": arguments}))
    }

    fn stop(mut self) -> Result<()> {
        drop(self.stdin);
        self.child.wait()?;
        Ok(())
    }
}

/// The text a model reads from a tool result: every text block.
fn model_text(result: &Value) -> String {
    result["content"]
        .as_array()
        .map(|blocks| {
            blocks
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

fn describe(result: &Value) -> String {
    if result["isError"] == json!(true) {
        let text = model_text(result);
        let short: String = text.chars().take(110).collect();
        return format!(
            "isError: {short}{}",
            if text.len() > 110 { "…" } else { "" }
        );
    }
    let page = &result["structuredContent"];
    let mut parts = Vec::new();
    if let Some(streams) = page["streams"].as_array() {
        parts.push(format!("{} streams", streams.len()));
    } else if let Some(returned) = page["returned"].as_u64() {
        parts.push(format!("{returned} rows"));
    } else if page["stream"].is_object() {
        parts.push("one stream".into());
    }
    if let Some(total) = page["total_count"].as_u64() {
        parts.push(format!("total_count {total}"));
    }
    if page["next_after"].is_string() {
        parts.push("next_after".into());
    }
    if let Some(notices) = page["notices"].as_array() {
        parts.push(format!("{} notices", notices.len()));
    }
    parts.join(", ")
}

fn main() -> Result<()> {
    let streams = std::env::args()
        .skip_while(|a| a != "--streams")
        .nth(1)
        .unwrap_or_else(|| "240".into());
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(&cargo);
    // `cargo run` hands this program the variables it sets for a crate being run
    // (CARGO_MANIFEST_DIR, CARGO_PKG_*, …). Passed on to the inner build, they change its
    // environment, and cargo rebuilds whatever depends on it: the second run of the demo
    // recompiled half the dependency tree. The inner build gets the user's environment.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let set_by_cargo_run = name.starts_with("CARGO_PKG_")
            || matches!(
                name.as_ref(),
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "CARGO_RUSTC_CURRENT_DIR"
                    | "OUT_DIR"
            );
        if set_by_cargo_run {
            build.env_remove(name.as_ref());
        }
    }
    build.args(["build", "--quiet"]);
    // The same profile as the demo itself: the binaries sit next to it.
    if !cfg!(debug_assertions) {
        build.arg("--release");
    }
    let status = build
        .args(["--bin", "mcp-budget", "--example", "fleet_server"])
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("cargo build failed");
    }
    let exe = std::env::current_exe()?;
    let examples = exe.parent().context("example dir")?;
    let proxy: PathBuf = examples.parent().context("target dir")?.join("mcp-budget");
    let fleet: PathBuf = examples.join("fleet_server");
    let policy = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/fleet.toml");
    let bpe = tiktoken_rs::o200k_base().context("loading the o200k tokenizer")?;
    let tokens = |result: &Value| bpe.encode_ordinary(&model_text(result)).len();

    println!("$ mcp-budget --policy policies/fleet.toml -- fleet_server --streams {streams}\n");
    let fleet_str = fleet.to_str().context("path")?;
    let policy_str = policy.to_str().context("path")?;
    // A fixed cursor key (written 0600 to a file of the demo's own), so that the output is the
    // README's on every machine: a cursor's MAC changes the token count of a page by a few.
    let key = demo_cursor_key()?;
    let key_str = key.to_str().context("path")?;
    let mut client = Client::start(
        &proxy,
        &[
            "--cursor-key-file",
            key_str,
            "--policy",
            policy_str,
            "--",
            fleet_str,
            "--streams",
            &streams,
        ],
    )?;
    let tools = client.request("tools/list", json!({}))?;
    let added: Vec<String> = tools.message["result"]["tools"][0]["inputSchema"]["properties"]
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    println!(
        "→ {:<58} ← {:>7} bytes  fleet_show takes {}",
        "tools/list",
        tools.bytes,
        added.join(", ")
    );

    let script = [
        ("fleet_show", json!({})),
        ("fleet_show", json!({"format": "csv"})),
        ("fleet_show", json!({"state": "blocked", "limit": 5})),
        (
            "fleet_show",
            json!({"horizon": "all", "detail": "full", "limit": 100}),
        ),
        ("fleet_show", json!({"limit": 101})),
        ("wave_show", json!({"wave": "w2"})),
        ("stream_detail", json!({"stream_id": "st-0003"})),
    ];
    let mut measured = Vec::new();
    for (tool, arguments) in script {
        let reply = client.call(tool, arguments.clone())?;
        let result = &reply.message["result"];
        let label = format!("tools/call {tool} {arguments}");
        println!(
            "→ {label:<58} ← {:>7} bytes  {}",
            reply.bytes,
            describe(result)
        );
        measured.push((label, reply.bytes, tokens(result)));
    }

    // The page chain: every live stream, 25 at a time.
    let mut chain = (0usize, 0usize, 0usize);
    let mut arguments = json!({});
    loop {
        let reply = client.call("fleet_show", arguments.clone())?;
        let result = &reply.message["result"];
        chain = (chain.0 + 1, chain.1 + reply.bytes, chain.2 + tokens(result));
        match result["structuredContent"]["next_after"].as_str() {
            Some(next) => arguments = json!({"after": next}),
            None => break,
        }
    }
    println!(
        "→ {:<58} ← {:>7} bytes  {} pages: every live stream",
        "fleet_show page chain (following next_after)", chain.1, chain.0
    );
    client.stop()?;

    // Before: the server itself.
    let mut direct = Client::start(&fleet, &["--streams", &streams])?;
    let raw = direct.call("fleet_show", json!({}))?;
    let raw_tokens = tokens(&raw.message["result"]);
    direct.stop()?;

    println!(
        "\nfleet_show on {streams} streams, before and after (tokens: o200k, of the text the model reads):\n"
    );
    println!("| call | bytes | tokens |\n|---|---:|---:|");
    println!(
        "| raw, server directly (no budget) | {} | {} |",
        raw.bytes, raw_tokens
    );
    for (label, bytes, tokens) in measured.iter().take(3) {
        println!(
            "| {} | {bytes} | {tokens} |",
            label.trim_start_matches("tools/call ")
        );
    }
    println!(
        "| page chain: all {} pages of live streams | {} | {} |",
        chain.0, chain.1, chain.2
    );
    Ok(())
}

/// The demo's cursor key (not a secret: it only makes the demo's output the same everywhere;
/// tests/readme.rs checks the README against it).
const DEMO_CURSOR_KEY: &str = "mcp-budget README demo cursor key: not a secret, 0123456789";

fn demo_cursor_key() -> Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::env::temp_dir().join(format!("mcp-budget-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).context("making the demo's key folder")?;
    let path = dir.join("cursor.key");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .context("writing the demo's cursor key")?;
    file.write_all(DEMO_CURSOR_KEY.as_bytes())?;
    Ok(path)
}
