//! The main job on the bundled example: mcp-budget in front of the example fleet server,
//! driven by a short scripted client session whose exchanges and sizes it prints.
//!
//! ```text
//! cargo run --release --example demo [-- --streams 68]
//! ```
//!
//! It builds the proxy and the fleet server (release), starts
//! `mcp-budget -- fleet_server --streams N`, and speaks raw MCP to it on stdio.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

struct Client {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Client {
    fn request(&mut self, method: &str, params: Value) -> Result<(Value, usize)> {
        let id = self.next_id;
        self.next_id += 1;
        let line =
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        writeln!(self.stdin, "{line}")?;
        self.stdin.flush()?;
        loop {
            let mut reply = String::new();
            if self.stdout.read_line(&mut reply)? == 0 {
                bail!("the proxy closed its output");
            }
            let message: Value = serde_json::from_str(&reply).context("reply is not JSON")?;
            if message["id"] == json!(id) {
                return Ok((message, reply.trim_end().len()));
            }
        }
    }

    fn notify(&mut self, method: &str) -> Result<()> {
        writeln!(
            self.stdin,
            "{}",
            json!({"jsonrpc": "2.0", "method": method})
        )?;
        Ok(())
    }
}

fn built(dir: &std::path::Path, name: &str) -> PathBuf {
    dir.join(name)
}

fn main() -> Result<()> {
    let streams = std::env::args()
        .skip_while(|a| a != "--streams")
        .nth(1)
        .unwrap_or_else(|| "68".into());
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args([
            "build",
            "--release",
            "--quiet",
            "--bin",
            "mcp-budget",
            "--example",
            "fleet_server",
        ])
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("cargo build failed");
    }
    let exe = std::env::current_exe()?;
    let examples = exe.parent().context("example dir")?;
    let release = examples.parent().context("target dir")?;
    let proxy = built(release, "mcp-budget");
    let fleet = built(examples, "fleet_server");

    println!("$ mcp-budget -- fleet_server --streams {streams}\n");
    let mut child = Command::new(&proxy)
        .arg("--")
        .arg(&fleet)
        .args(["--streams", &streams])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", proxy.display()))?;
    let mut client = Client {
        stdin: child.stdin.take().context("stdin")?,
        stdout: BufReader::new(child.stdout.take().context("stdout")?),
        child,
        next_id: 1,
    };

    let (init, bytes) = client.request(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "demo", "version": "1"}}),
    )?;
    println!(
        "→ {:<50} ← {bytes:>9} bytes  server {}",
        "initialize", init["result"]["serverInfo"]["name"]
    );
    client.notify("notifications/initialized")?;
    let (tools, bytes) = client.request("tools/list", json!({}))?;
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    println!("→ {:<50} ← {bytes:>9} bytes  tools {names:?}", "tools/list");

    let calls = [
        ("fleet_show", json!({})),
        ("wave_show", json!({"wave": "w2"})),
        ("stream_detail", json!({"stream_id": "st-0003"})),
    ];
    for (tool, arguments) in calls {
        let (reply, bytes) =
            client.request("tools/call", json!({"name": tool, "arguments": arguments}))?;
        let result = &reply["result"];
        let items = result["structuredContent"]["streams"]
            .as_array()
            .map(|s| format!("{} streams", s.len()))
            .unwrap_or_else(|| "one record".into());
        let label = format!("tools/call {tool} {arguments}");
        println!(
            "→ {label:<50} ← {bytes:>9} bytes  {items}, isError {}",
            result["isError"]
        );
    }
    drop(client.stdin);
    let status = client.child.wait()?;
    println!("\nproxy exited: {status}");
    Ok(())
}
