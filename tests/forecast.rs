//! `mcp-budget report` is a forecast: for a recorded session and a client, the pages of each
//! call, the bytes the client's model reads of each page, and the refusals are what that client
//! then gets from the real proxy (no --policy: the built-in policy it picks for the server) in
//! front of the same recording.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::Peer;
use mcp_budget::budget::cap::read_bytes;
use mcp_budget::client::Reads;
use serde_json::value::RawValue;
use serde_json::{Value, json};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("mcp-budget-forecast-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What a client got for each call: the bytes its model read of each page, and whether the
/// proxy refused it (or one of its pages).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Got {
    tool: String,
    pages: Vec<usize>,
    refused: bool,
}

/// Per tool: (pages, refusals).
fn per_tool(calls: &[Got]) -> BTreeMap<String, (usize, usize)> {
    let mut out = BTreeMap::new();
    for call in calls {
        let entry: &mut (usize, usize) = out.entry(call.tool.clone()).or_default();
        entry.0 += call.pages.len();
        entry.1 += usize::from(call.refused);
    }
    out
}

/// `report --json ARGS…`, parsed.
fn report(args: &[&str]) -> Value {
    let mut all = vec!["report", "--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&common::run_ok(all)).unwrap()
}

/// The forecast's calls.
fn forecast(report: &Value) -> Vec<Got> {
    report["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|call| Got {
            tool: call["tool"].as_str().unwrap().to_string(),
            pages: call["page_read_bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_u64().unwrap() as usize)
                .collect(),
            refused: call["refused"].as_bool().unwrap(),
        })
        .collect()
}

/// The next answer to `id`, past notifications.
async fn answer(peer: &mut Peer, id: &Value) -> (String, Value) {
    loop {
        let line = peer.recv().await;
        let message: Value = serde_json::from_str(&line).unwrap();
        if message.get("method").is_none() && message["id"] == *id {
            return (line, message);
        }
    }
}

/// The argument a page's notice names for its cursor: `mcp_budget_after` for a tool with an
/// `after` of its own, else `after`.
fn continuing_argument(result: &Value) -> &'static str {
    let own = result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["text"].as_str())
        .any(|t| t.contains("mcp_budget_after:\""));
    if own { "mcp_budget_after" } else { "after" }
}

/// The recorded session, replayed through the real proxy (no --policy, no --client) in front of
/// `mcp-budget replay`, as a client whose `initialize` says `client`: each call's pages followed
/// to the last; what the client got for each call.
async fn through_the_proxy(recording: &Path, client: &str, reads: Reads) -> Vec<Got> {
    let bin = common::proxy_bin();
    let dir = temp_dir("key");
    let mut command = tokio::process::Command::new(&bin);
    command
        .arg("--cursor-key-file")
        .arg(dir.join("cursor.key"))
        .arg("--")
        .arg(&bin)
        .arg("replay")
        .arg(recording);
    let mut peer = Peer::from_command(command);
    let text = std::fs::read_to_string(recording).unwrap();
    let mut got = Vec::new();
    let mut fresh = 0;
    for line in text.lines().skip(1) {
        let entry: Value = serde_json::from_str(line).unwrap();
        if entry["dir"] != "c2s" || entry["msg"].get("method").is_none() {
            continue;
        }
        let mut message = entry["msg"].clone();
        if message["method"] == "initialize" {
            message["params"]["clientInfo"]["name"] = json!(client);
        }
        peer.send(&message.to_string()).await;
        let Some(id) = message.get("id").cloned() else {
            continue;
        };
        let (mut line, mut reply) = answer(&mut peer, &id).await;
        if message["method"] != "tools/call" {
            continue;
        }
        let mut call = Got {
            tool: message["params"]["name"].as_str().unwrap().to_string(),
            pages: Vec::new(),
            refused: false,
        };
        loop {
            assert!(
                call.pages.len() < 1000,
                "{}: the pages do not end",
                call.tool
            );
            let result = &reply["result"];
            if reply.get("error").is_some() {
                break;
            }
            if result["isError"] == true
                && result["content"][0]["text"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("result-too-large"))
            {
                call.refused = true;
                break;
            }
            #[derive(serde::Deserialize)]
            struct Envelope<'a> {
                #[serde(borrow)]
                result: &'a RawValue,
            }
            let raw: Envelope<'_> = serde_json::from_str(&line).unwrap();
            call.pages.push(read_bytes(reads, raw.result.get()));
            let Some(cursor) = common::continuation(result) else {
                break;
            };
            let mut next = message.clone();
            fresh += 1;
            next["id"] = json!(format!("next-{fresh}"));
            next["params"]["arguments"][continuing_argument(result)] = json!(cursor);
            peer.send(&next.to_string()).await;
            (line, reply) = answer(&mut peer, &next["id"]).await;
        }
        got.push(call);
    }
    peer.close_stdin();
    peer.wait().await;
    let _ = std::fs::remove_dir_all(&dir);
    got
}

/// `report --client codex` on `name`, and the same session through the proxy as codex.
async fn codex_forecast_holds(name: &str) -> Vec<Got> {
    let recording = fixture(name);
    let report = report(&["--client", "codex", recording.to_str().unwrap()]);
    assert_eq!(report["client"], "codex", "{name}");
    let forecast = forecast(&report);
    let live = through_the_proxy(&recording, "codex-mcp-client", Reads::Structured).await;
    assert_eq!(
        per_tool(&forecast),
        per_tool(&live),
        "{name}: pages and refusals per tool, forecast vs. through the proxy"
    );
    // Call by call, page by page: the bytes codex's model reads.
    assert_eq!(forecast, live, "{name}");
    for call in &forecast {
        assert!(
            call.pages.iter().all(|&read| read < 10_000),
            "{name}: {call:?} reads 10000 bytes or more"
        );
    }
    forecast
}

#[tokio::test]
async fn the_forecast_for_codex_is_what_codex_gets_filesystem() {
    let calls = codex_forecast_holds("filesystem.jsonl").await;
    let pages = per_tool(&calls);
    assert!(pages["read_text_file"].0 > 10, "{pages:?}");
    assert!(pages["directory_tree"].0 > 2, "{pages:?}");
}

#[tokio::test]
async fn the_forecast_for_codex_is_what_codex_gets_git() {
    let calls = codex_forecast_holds("git.jsonl").await;
    let pages = per_tool(&calls);
    assert!(
        pages["git_log"].0 > 5 && pages["git_diff_unstaged"].0 > 5,
        "{pages:?}"
    );
}

#[tokio::test]
async fn the_forecast_for_codex_is_what_codex_gets_everything() {
    let calls = codex_forecast_holds("everything.jsonl").await;
    assert!(
        calls.iter().all(|c| c.pages.len() == 1 && !c.refused),
        "{calls:?}"
    );
}

#[tokio::test]
async fn the_forecast_for_codex_is_what_codex_gets_a_refusal_included() {
    // stream_detail's one line is larger than codex's whole 10000-byte budget: refused.
    let calls = codex_forecast_holds("fleet-68.jsonl").await;
    let refused: Vec<&str> = calls
        .iter()
        .filter(|c| c.refused)
        .map(|c| c.tool.as_str())
        .collect();
    assert_eq!(refused, ["stream_detail"]);
}

#[test]
fn without_client_the_report_takes_the_recorded_client_and_the_servers_builtin_policy() {
    // The fleet recording, made by a client that said it is codex.
    let dir = temp_dir("as-codex");
    let recording = dir.join("fleet-codex.jsonl");
    let text = std::fs::read_to_string(fixture("fleet-68.jsonl")).unwrap();
    let from = r#""clientInfo":{"name":"fixture""#;
    assert_eq!(text.matches(from).count(), 1);
    std::fs::write(
        &recording,
        text.replace(from, r#""clientInfo":{"name":"codex-mcp-client""#),
    )
    .unwrap();
    let recorded = report(&[recording.to_str().unwrap()]);
    assert_eq!(recorded["policy"], "builtin:fleet");
    assert_eq!(recorded["server"], "fleet-server");
    assert_eq!(recorded["client"], "codex");
    assert!(
        recorded["client_reason"]
            .as_str()
            .unwrap()
            .starts_with(r#"the recorded clientInfo.name "codex-mcp-client""#),
        "{}",
        recorded["client_reason"]
    );
    assert_eq!(recorded["capped_tools"], json!(["stream_detail"]));
    // The same as --client codex on the original.
    let forced = report(&[
        "--client",
        "codex",
        fixture("fleet-68.jsonl").to_str().unwrap(),
    ]);
    assert_eq!(forecast(&recorded), forecast(&forced));
    // The table names the policy and the client it used.
    let table = common::run_ok(["report", recording.to_str().unwrap()]);
    assert!(
        table.starts_with(
            "policy: builtin:fleet — the built-in policy for serverInfo.name \"fleet-server\""
        ),
        "{table}"
    );
    assert!(table.contains("\nclient: codex — "), "{table}");
    assert!(
        table.contains("tools the cap would refuse with default arguments: stream_detail"),
        "{table}"
    );

    // A client with no profile gets the policy's budget; --policy none is automatic paging only.
    let plain = report(&[fixture("fleet-68.jsonl").to_str().unwrap()]);
    assert_eq!(plain["policy"], "builtin:fleet");
    assert_eq!(plain["client"], Value::Null);
    assert_eq!(plain["capped_tools"], json!([]));
    let none = report(&[
        "--policy",
        "none",
        fixture("fleet-68.jsonl").to_str().unwrap(),
    ]);
    assert_eq!(none["policy"], "none");
    assert_eq!(
        none["tools_without_rule"],
        json!(["fleet_show", "stream_detail", "wave_show"])
    );
    assert!(
        none["calls"][0]["outcome"]
            .as_str()
            .unwrap()
            .starts_with("paged automatically: items 1-"),
        "{}",
        none["calls"][0]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unknown_client_is_the_proxys_error() {
    let dir = temp_dir("unknown");
    let key = dir.join("cursor.key");
    let proxy = common::run([
        "--cursor-key-file",
        key.to_str().unwrap(),
        "--client",
        "nobody",
        "--",
        "true",
    ]);
    let proxy_error = String::from_utf8_lossy(&proxy.stderr).into_owned();
    assert!(
        proxy_error
            .contains("--client \"nobody\" matches no client profile; known: claude-code, codex"),
        "{proxy_error}"
    );
    let recording = fixture("fleet-68.jsonl");
    let bin = common::proxy_bin();
    for args in [
        vec!["report", "--client", "nobody", recording.to_str().unwrap()],
        vec![
            "explain",
            "--tool",
            "fleet_show",
            "--client",
            "nobody",
            "--",
            bin.to_str().unwrap(),
            "replay",
            recording.to_str().unwrap(),
        ],
    ] {
        let out = common::run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            proxy_error,
            "{args:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn explain_without_a_policy_uses_the_servers_builtin_policy_as_the_client_sees_it() {
    let bin = common::proxy_bin();
    let recording = fixture("filesystem.jsonl");
    let server = [bin.to_str().unwrap(), "replay", recording.to_str().unwrap()];
    let mut args = vec![
        "explain",
        "--tool",
        "read_text_file",
        "--client",
        "codex",
        "--",
    ];
    args.extend(server);
    let out = common::run(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "policy: builtin:filesystem — the built-in policy for serverInfo.name \"secure-filesystem-server\""
        ),
        "{stderr}"
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let (descriptor, pages) = stdout.split_once("\n\n").unwrap();
    let descriptor: Value = serde_json::from_str(descriptor).unwrap();
    assert!(descriptor["inputSchema"]["properties"]["after"].is_object());
    assert!(
        pages.starts_with("client codex (clientInfo.name \"codex-mcp-client\")")
            && pages.contains("result cap: 10000 bytes")
            && pages.contains("text pages: at most 8000 bytes"),
        "{pages}"
    );
    // --policy none: automatic paging only, as for the proxy.
    let mut args = vec![
        "explain",
        "--policy",
        "none",
        "--tool",
        "read_text_file",
        "--",
    ];
    args.extend(server);
    let out = common::run(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("policy: none — --policy none: automatic paging only"),
        "{stderr}"
    );
    let descriptor: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        descriptor["inputSchema"]["properties"]["after"]["description"],
        mcp_budget::budget::descriptor::AUTO_AFTER
    );
}
