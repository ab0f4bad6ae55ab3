//! A bounded load on loopback: N concurrent Streamable HTTP sessions × M `tools/call` each,
//! through `mcp-budget --listen` with `policies/fleet.toml` to the example fleet server.
//! Used by `benches/load.rs` (50 × 200) and, as a smoke test, by `tests/load.rs`.
#![allow(dead_code)]

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

pub struct LoadReport {
    pub sessions: usize,
    pub calls: usize,
    pub latencies: Vec<Duration>,
    pub errors: Vec<String>,
    pub wall: Duration,
    pub peak_rss_kib: u64,
    pub servers_during: usize,
    pub servers_left: usize,
}

impl LoadReport {
    pub fn percentile(&self, p: f64) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort();
        if sorted.is_empty() {
            return Duration::ZERO;
        }
        sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
    }
}

fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
                out.extend(
                    list.split_whitespace()
                        .filter_map(|p| p.parse::<u32>().ok()),
                );
            }
        }
    }
    out
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// One session's calls: its own ids (`s<index>-<k>`) and its own arguments, so that an answer
/// that went to the wrong session, or to the wrong request, cannot pass the checks.
async fn session(
    client: reqwest::Client,
    url: String,
    calls: usize,
    index: usize,
) -> Result<Vec<Duration>, String> {
    let post = |body: String, session: Option<String>| {
        let mut request = client
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .body(body);
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        request.send()
    };
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "load", "version": "1"}}});
    let response = post(init.to_string(), None)
        .await
        .map_err(|e| e.to_string())?;
    let id = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from)
        .ok_or_else(|| format!("initialize: HTTP {}", response.status()))?;
    let _ = response.bytes().await;
    post(
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string(),
        Some(id.clone()),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut latencies = Vec::with_capacity(calls);
    for k in 1..=calls {
        let limit = 1 + (index + k) % 10;
        let (tool, arguments) = if k % 2 == 0 {
            ("fleet_show", json!({"limit": limit}))
        } else {
            (
                "stream_detail",
                json!({"stream_id": format!("st-{:04}", (index * 7 + k) % 20)}),
            )
        };
        let call_id = format!("s{index}-{k}");
        let request = json!({"jsonrpc": "2.0", "id": call_id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}});
        let start = Instant::now();
        let body = post(request.to_string(), Some(id.clone()))
            .await
            .map_err(|e| e.to_string())?
            .bytes()
            .await
            .map_err(|e| e.to_string())?;
        latencies.push(start.elapsed());
        let reply: Value = serde_json::from_slice(&body).map_err(|e| format!("call {k}: {e}"))?;
        let result = &reply["result"];
        let ok = reply["id"] == json!(call_id)
            && result["isError"] == json!(false)
            && match tool {
                "fleet_show" => {
                    // A full page of this session's own limit, unless it is the last page.
                    let len = result["structuredContent"]["streams"]
                        .as_array()
                        .map_or(0, Vec::len);
                    let more = result["structuredContent"]["next_after"].is_string();
                    (if more {
                        len == limit
                    } else {
                        (1..=limit).contains(&len)
                    }) && result["structuredContent"]["total_count"] == json!(20)
                }
                _ => result["structuredContent"]["stream"]["stream_id"] == arguments["stream_id"],
            };
        if !ok {
            return Err(format!(
                "call {k} ({tool}) got a wrong answer: {}",
                &reply.to_string()[..reply.to_string().len().min(300)]
            ));
        }
    }
    client
        .delete(&url)
        .header("mcp-session-id", id)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    Ok(latencies)
}

/// The release build of the example fleet server next to this bench (built when missing).
pub fn fleet_server() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("own path");
    let release = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .to_path_buf();
    let fleet = release.join("examples").join("fleet_server");
    if !fleet.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args(["build", "--release", "--example", "fleet_server"])
            .status()
            .expect("cargo build");
        assert!(status.success());
    }
    fleet
}

/// Runs the load and stops everything it started.
pub async fn run(
    proxy: &Path,
    fleet: &Path,
    policy: &Path,
    sessions: usize,
    calls: usize,
) -> LoadReport {
    run_with(proxy, fleet, policy, sessions, calls, &[]).await
}

/// Like `run`, with more arguments for the proxy (before `--`).
pub async fn run_with(
    proxy: &Path,
    fleet: &Path,
    policy: &Path,
    sessions: usize,
    calls: usize,
    proxy_args: &[&str],
) -> LoadReport {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Every session comes from this one address: the per-client cap must allow them all (on
    // builds that have one).
    let per_client = std::process::Command::new(proxy)
        .arg("--help")
        .output()
        .is_ok_and(|out| {
            String::from_utf8_lossy(&out.stdout).contains("--max-sessions-per-client")
        });
    let cap = (sessions + 1).to_string();
    let per_client_args: Vec<&str> = if per_client {
        vec!["--max-sessions-per-client", &cap]
    } else {
        Vec::new()
    };
    let mut child = tokio::process::Command::new(proxy)
        .args(["--listen", "http://127.0.0.1:0/mcp", "--max-sessions"])
        .arg(&cap)
        .args(&per_client_args)
        .args(proxy_args)
        .arg("--policy")
        .arg(policy)
        .arg("--")
        .arg(fleet)
        .args(["--streams", "20"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the proxy");
    let pid = child.id().expect("pid");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = lines
        .next_line()
        .await
        .expect("read")
        .expect("the listening line");
    let url = line.trim_start_matches("listening on ").to_string();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(sessions)
        .build()
        .expect("client");
    let servers_seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let watcher = {
        let seen = servers_seen.clone();
        tokio::spawn(async move {
            loop {
                seen.fetch_max(children(pid).len(), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let start = Instant::now();
    let tasks: Vec<_> = (0..sessions)
        .map(|index| tokio::spawn(session(client.clone(), url.clone(), calls, index)))
        .collect();
    let mut latencies = Vec::with_capacity(sessions * calls);
    let mut errors = Vec::new();
    for task in tasks {
        match task.await {
            Ok(Ok(l)) => latencies.extend(l),
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(e.to_string()),
        }
    }
    let wall = start.elapsed();
    watcher.abort();
    // Every session was deleted: its server must go.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !children(pid).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let servers_left = children(pid).len();
    let peak = peak_rss_kib(pid);
    let _ = child.start_kill();
    LoadReport {
        sessions,
        calls,
        latencies,
        errors,
        wall,
        peak_rss_kib: peak,
        servers_during: servers_seen.load(std::sync::atomic::Ordering::Relaxed),
        servers_left,
    }
}
