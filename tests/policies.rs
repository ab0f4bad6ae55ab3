//! The shipped policies, against recordings of the real servers (tests/fixtures): a large
//! directory tree, a large file and a long git log come back paged under the budget, and the
//! page chain reassembles the full content exactly.

mod common;

use std::path::Path;

use common::{Peer, handshake};
use serde_json::{Value, json};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn behind(policy: &str, fixture: &str) -> Peer {
    common::replay_behind(
        &root().join("policies").join(policy),
        &root().join("tests/fixtures").join(fixture),
    )
}

/// The text the server sent for the recorded call to `tool` with `arguments`.
fn recorded_text(fixture: &str, tool: &str) -> String {
    let text = std::fs::read_to_string(root().join("tests/fixtures").join(fixture)).unwrap();
    let entries: Vec<Value> = text
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let id = entries
        .iter()
        .find(|e| e["dir"] == "c2s" && e["msg"]["params"]["name"] == tool)
        .map(|e| e["msg"]["id"].clone())
        .unwrap();
    let response = entries
        .iter()
        .find(|e| e["dir"] == "s2c" && e["msg"]["id"] == id && e["msg"].get("result").is_some())
        .unwrap();
    response["msg"]["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Follows the page chain of one call; returns (pages, notices).
async fn chain(
    peer: &mut Peer,
    tool: &str,
    arguments: Value,
    budget: usize,
) -> (Vec<String>, Vec<String>) {
    let mut pages = Vec::new();
    let mut notices = Vec::new();
    let mut arguments = arguments;
    for id in 100.. {
        assert!(id < 300, "the chain does not end");
        let request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}});
        peer.send(&request.to_string()).await;
        let reply = peer.recv_json().await;
        assert_eq!(reply["id"], id, "{reply}");
        let result = &reply["result"];
        assert_ne!(result["isError"], true, "{reply}");
        let page = result["content"][0]["text"].as_str().unwrap().to_string();
        assert!(
            page.len() <= budget,
            "a page of {} bytes, over the {budget}-byte budget",
            page.len()
        );
        // structuredContent carries the same page as the text block.
        if let Some(content) = result["structuredContent"]["content"].as_str() {
            assert_eq!(content, page);
        }
        let notice = result["content"][1]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        pages.push(page);
        notices.push(notice.clone());
        match notice
            .split("after:\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
        {
            Some(cursor) => arguments["after"] = json!(cursor),
            None => break,
        }
    }
    (pages, notices)
}

#[tokio::test]
async fn filesystem_a_large_file_a_large_tree_and_many_search_hits_come_back_in_pages_that_reassemble()
 {
    let mut peer = behind("filesystem.toml", "filesystem.jsonl");
    handshake(&mut peer).await;
    peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .await;
    let tools = peer.recv_json().await;
    let read = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "read_text_file")
        .unwrap();
    assert!(read["inputSchema"]["properties"]["after"].is_object());
    assert!(
        read["description"]
            .as_str()
            .unwrap()
            .contains("pages of whole lines, at most 20000 bytes")
    );

    // directory_tree answers a JSON document as text: its pages are JSON, each one parses, and
    // their lists make up the whole document.
    let whole: Value =
        serde_json::from_str(&recorded_text("filesystem.jsonl", "directory_tree")).unwrap();
    let (pages, notices) = chain(
        &mut peer,
        "directory_tree",
        json!({"path": "/tmp/mcp-budget-fs-fixture"}),
        16_000,
    )
    .await;
    assert!(pages.len() > 2, "directory_tree: {} pages", pages.len());
    let mut items = Vec::new();
    for (page, notice) in pages.iter().zip(&notices) {
        let page: Value = serde_json::from_str(page).expect("every page of a JSON document parses");
        items.extend(page.as_array().unwrap().iter().cloned());
        assert!(notice.is_empty() || notice.contains(" in $"), "{notice}");
    }
    assert_eq!(
        Value::Array(items),
        whole,
        "directory_tree: the pages' items are not the tree"
    );

    let cases = [
        (
            "read_text_file",
            json!({"path": "/tmp/mcp-budget-fs-fixture/big.log"}),
            20_000,
        ),
        (
            "search_files",
            json!({"path": "/tmp/mcp-budget-fs-fixture", "pattern": "**/*.txt"}),
            16_000,
        ),
    ];
    for (tool, arguments, budget) in cases {
        let whole = recorded_text("filesystem.jsonl", tool);
        assert!(
            whole.len() > 2 * budget,
            "{tool}: the recording must be large"
        );
        let (pages, notices) = chain(&mut peer, tool, arguments, budget).await;
        assert!(pages.len() > 2, "{tool}: {} pages", pages.len());
        assert_eq!(
            pages.concat(),
            whole,
            "{tool}: the pages do not reassemble the original"
        );
        assert!(notices[0].starts_with("Lines 1-"), "{}", notices[0]);
        assert!(
            notices.last().unwrap().contains(" This is the last page."),
            "{}",
            notices.last().unwrap()
        );
        // Pages end on line boundaries, except where one line is longer than a page.
        for (page, notice) in pages.iter().zip(&notices).take(pages.len() - 1) {
            assert!(
                page.ends_with('\n') || notice.contains("is longer than the page budget"),
                "{tool}: {notice}"
            );
        }
    }
    // big.log holds one line of 15,000 é (30,000 bytes): split, at character boundaries, and said so.
    let (pages, notices) = chain(
        &mut peer,
        "read_text_file",
        json!({"path": "/tmp/mcp-budget-fs-fixture/big.log"}),
        20_000,
    )
    .await;
    assert!(notices.iter().any(|n| {
        n.contains("is longer than the page budget of 20000 bytes, so it is split across pages")
    }));
    assert!(pages.iter().all(|p| !p.contains('\u{fffd}')));
    // A small result is untouched: no notice block.
    peer.send(r#"{"jsonrpc":"2.0","id":50,"method":"tools/call","params":{"name":"list_directory","arguments":{"path":"/tmp/mcp-budget-fs-fixture"}}}"#).await;
    let small = peer.recv_json().await;
    assert_eq!(small["result"]["content"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn git_a_long_log_and_a_large_diff_come_back_in_pages_that_reassemble() {
    let mut peer = behind("git.toml", "git.jsonl");
    handshake(&mut peer).await;
    for (tool, arguments) in [
        (
            "git_log",
            json!({"repo_path": "/tmp/mcp-budget-git-fixture", "max_count": 300}),
        ),
        (
            "git_diff_unstaged",
            json!({"repo_path": "/tmp/mcp-budget-git-fixture"}),
        ),
    ] {
        let whole = recorded_text("git.jsonl", tool);
        let (pages, notices) = chain(&mut peer, tool, arguments, 16_000).await;
        assert!(pages.len() >= 5, "{tool}: {} pages", pages.len());
        assert_eq!(
            pages.concat(),
            whole,
            "{tool}: the pages do not reassemble the original"
        );
        assert!(
            notices[0].contains(&format!(" of {})", whole.len())),
            "{}",
            notices[0]
        );
    }
    // A cursor of one log is refused for another call.
    peer.send(r#"{"jsonrpc":"2.0","id":60,"method":"tools/call","params":{"name":"git_log","arguments":{"repo_path":"/tmp/mcp-budget-git-fixture","max_count":300}}}"#).await;
    let first = peer.recv_json().await;
    let notice = first["result"]["content"][1]["text"].as_str().unwrap();
    let cursor = notice
        .split("after:\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    let other = json!({"jsonrpc": "2.0", "id": 61, "method": "tools/call", "params": {"name": "git_diff_unstaged", "arguments": {"repo_path": "/tmp/mcp-budget-git-fixture", "after": cursor}}});
    peer.send(&other.to_string()).await;
    let refused = peer.recv_json().await;
    assert!(
        refused["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("after belongs to a different query")
    );
}

#[tokio::test]
async fn everything_small_results_pass_unchanged_under_its_policy() {
    let mut peer = behind("everything.toml", "everything.jsonl");
    let first = handshake(&mut peer).await;
    assert!(first.contains("list_changed"));
    assert_eq!(peer.recv_json().await["id"], 1);
    peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .await;
    let tools = peer.recv_json().await;
    let annotated = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "get-annotated-message")
        .unwrap();
    assert_eq!(annotated["_meta"]["anthropic/maxResultSizeChars"], 200000);
    let echo = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "echo")
        .unwrap();
    assert!(
        echo.get("_meta").is_none(),
        "tools without a rule are unchanged"
    );
    peer.send(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"get-annotated-message","arguments":{"messageType":"success","includeImage":true}}}"#).await;
    let reply = peer.recv_json().await;
    assert_eq!(reply["result"]["content"][1]["type"], "image");
}

fn suggest(fixture: &str) -> String {
    common::run_ok([
        "suggest".as_ref(),
        root().join("tests/fixtures").join(fixture).as_os_str(),
    ])
}

fn check(policy_text: &str, name: &str) {
    let dir = std::env::temp_dir().join(format!("mcp-budget-suggest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, policy_text).unwrap();
    let out = common::run([std::ffi::OsStr::new("check"), path.as_os_str()]);
    assert!(
        out.status.success(),
        "suggested policy fails check: {}\n{policy_text}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn suggest_finds_what_the_fleet_policy_uses_and_its_output_passes_check() {
    let text = suggest("fleet-68.jsonl");
    let policy: toml::Table = toml::from_str(&text).unwrap();
    let rule = &policy["tool"].as_array().unwrap()[0];
    assert_eq!(
        rule["name"].as_array().unwrap(),
        &vec![
            toml::Value::from("fleet_show"),
            toml::Value::from("wave_show")
        ]
    );
    // What policies/fleet.toml uses.
    let fleet: toml::Table =
        toml::from_str(&std::fs::read_to_string(root().join("policies/fleet.toml")).unwrap())
            .unwrap();
    let shipped = &fleet["tool"].as_array().unwrap()[0];
    assert_eq!(rule["items"], shipped["items"]);
    assert_eq!(rule["key"], shipped["key"]);
    assert_eq!(rule["horizon"]["field"], shipped["horizon"]["field"]);
    let mut terminal: Vec<String> = rule["horizon"]["terminal"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    terminal.sort();
    assert_eq!(terminal, vec!["closed-without-merge", "merged"]);
    // The bulkiest fields are proposed for leaving out of the summary.
    let summary: Vec<&str> = rule["detail"]["summary"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        !summary.contains(&"gate_history")
            && summary.contains(&"stream_id")
            && summary.contains(&"state"),
        "{summary:?}"
    );
    assert!(text.contains("# the heaviest fields, left out of the summary: gate_history"));
    check(&text, "fleet.toml");
}

#[test]
fn suggest_proposes_text_paging_for_long_text_and_passes_check() {
    for fixture in ["filesystem.jsonl", "git.jsonl", "everything.jsonl"] {
        let text = suggest(fixture);
        check(&text, &format!("{fixture}.toml"));
        if fixture != "everything.jsonl" {
            assert!(text.contains("[tool.text]"), "{fixture}: {text}");
        }
    }
    let git = suggest("git.jsonl");
    assert!(
        git.contains(r#"name = ["git_diff_unstaged", "git_log"]"#),
        "{git}"
    );
}

// ---- Built-in policies ------------------------------------------------------------------------

#[test]
fn the_shipped_policies_are_built_in_and_listed() {
    let listed = common::run_ok(["policies"]);
    for (name, server) in [
        ("builtin:fleet", "fleet-server"),
        ("builtin:filesystem", "secure-filesystem-server"),
        ("builtin:git", "mcp-git"),
        ("builtin:everything", "mcp-servers/everything"),
    ] {
        assert!(
            listed.contains(name) && listed.contains(server),
            "{name}: {listed}"
        );
    }
    // The same text as the files in policies/, so a checkout and an installed binary agree.
    for builtin in mcp_budget::builtin::BUILTINS {
        let file = root()
            .join("policies")
            .join(format!("{}.toml", builtin.name));
        assert_eq!(std::fs::read_to_string(file).unwrap(), builtin.text);
    }
    let checked = common::run_ok(["check", "builtin:git"]);
    assert!(checked.starts_with("builtin:git: OK"), "{checked}");
    let unknown = common::run(["check", "builtin:nope"]);
    assert_eq!(unknown.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        stderr.contains("no built-in policy \"nope\"") && stderr.contains("builtin:filesystem"),
        "{stderr}"
    );
}

/// fleet_show's input properties through the proxy with `policy`.
async fn fleet_show_arguments(policy: &str) -> Vec<String> {
    let fleet = common::example("fleet_server");
    let mut peer = Peer::proxy(&["--policy", policy], &[fleet.to_str().unwrap()]);
    handshake(&mut peer).await;
    peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .await;
    let list = peer.recv_json().await;
    let tool = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "fleet_show")
        .unwrap()
        .clone();
    tool["inputSchema"]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

#[tokio::test]
async fn policy_builtin_name_and_none() {
    let budgeted = fleet_show_arguments("builtin:fleet").await;
    for argument in ["horizon", "detail", "limit", "after", "format", "state"] {
        assert!(budgeted.contains(&argument.to_string()), "{budgeted:?}");
    }
    assert_eq!(
        fleet_show_arguments("none").await,
        vec!["after".to_string()]
    );
}

#[tokio::test]
async fn tools_allow_and_deny_hide_tools_from_the_list_and_refuse_calls_to_them() {
    let dir = std::env::temp_dir().join(format!("mcp-budget-tools-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("deny.toml");
    std::fs::write(
        &policy,
        "[tools]\nallow = [\"fleet_*\", \"stream_detail\", \"wave_show\"]\ndeny = [\"wave_*\"]\n",
    )
    .unwrap();
    let fleet = common::example("fleet_server");
    let mut proxy = Peer::proxy(
        &["--policy", policy.to_str().unwrap()],
        &[fleet.to_str().unwrap(), "--streams", "12"],
    );
    handshake(&mut proxy).await;
    proxy
        .send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .await;
    let names = tool_names(&answer(&mut proxy, 2).await);
    let has = |name: &str| names.iter().any(|n| n == name);
    assert!(has("fleet_show") && has("stream_detail"), "{names:?}");
    assert!(!has("wave_show"), "deny wins over allow: {names:?}");
    // The server has more tools than these; what is shown is exactly what allow/deny leave.
    let mut direct = Peer::spawn(&fleet, &["--streams", "12"]);
    handshake(&mut direct).await;
    direct
        .send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .await;
    let expected: Vec<String> = tool_names(&answer(&mut direct, 2).await)
        .into_iter()
        .filter(|n| (n.starts_with("fleet_") || n == "stream_detail") && !n.starts_with("wave_"))
        .chain(["mcp_budget_search".to_string()])
        .collect();
    assert_eq!(names, expected);
    // A call to a hidden tool never reaches the server.
    proxy
        .send(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"wave_show","arguments":{"wave":"w1"}}}"#)
        .await;
    let refused: Value = serde_json::from_str(&proxy.recv().await).unwrap();
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert!(
        refused["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("wave_show is not available through this proxy"),
        "{refused}"
    );
    // The shown tools work as before.
    proxy
        .send(r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"stream_detail","arguments":{"stream_id":"st-0003"}}}"#)
        .await;
    let shown: Value = serde_json::from_str(&proxy.recv().await).unwrap();
    assert_ne!(shown["result"]["isError"], true, "{shown}");
    // An empty allow would hide everything: an error that says so.
    std::fs::write(&policy, "[tools]\nallow = []\n").unwrap();
    let out = common::run(["check".as_ref(), policy.as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("deny.toml:2:9: tools.allow is empty"));
}

/// The next message with `id`, skipping notifications.
async fn answer(peer: &mut Peer, id: u64) -> Value {
    loop {
        let message: Value = serde_json::from_str(&peer.recv().await).unwrap();
        if message["id"] == id {
            return message;
        }
    }
}

/// The tool names a `tools/list` response lists.
fn tool_names(list: &Value) -> Vec<String> {
    list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_reload_mid_session_changes_descriptors_loses_nothing_and_survives_a_broken_policy() {
    let dir = std::env::temp_dir().join(format!("mcp-budget-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("p.toml");
    std::fs::write(&policy, "[tools]\ndeny = [\"flood\"]\n").unwrap();
    let quirky = common::example("quirky_server");
    let mut proxy = Peer::proxy(
        &["--policy", policy.to_str().unwrap(), "--watch"],
        &[quirky.to_str().unwrap()],
    );
    let mut log = proxy.stderr_lines();
    handshake(&mut proxy).await;
    proxy
        .send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .await;
    let names = tool_names(&answer(&mut proxy, 2).await);
    assert!(!names.contains(&"flood".to_string()) && names.contains(&"journal".to_string()));
    // A call in flight while the policy changes.
    proxy
        .send(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"late","arguments":{"ms":1500,"bytes":10}}}"#)
        .await;
    std::fs::write(&policy, "[tools]\ndeny = [\"journal\"]\n").unwrap();
    let (mut told, mut answered) = (false, false);
    while !(told && answered) {
        let message: Value = serde_json::from_str(&proxy.recv().await).unwrap();
        if message["method"] == "notifications/tools/list_changed" {
            told = true;
        } else if message["id"] == 3 {
            assert_eq!(message["result"]["content"][0]["text"], "y".repeat(10));
            answered = true;
        }
    }
    proxy
        .send(r#"{"jsonrpc":"2.0","id":4,"method":"tools/list"}"#)
        .await;
    let names = tool_names(&answer(&mut proxy, 4).await);
    assert!(
        names.contains(&"flood".to_string()) && !names.contains(&"journal".to_string()),
        "the new policy is in force: {names:?}"
    );
    // A broken policy: the error is logged with its position, and the old policy stays.
    std::fs::write(&policy, "[tools]\ndeny = [\"journal\"\n").unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(proxy.child.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let failed = loop {
        let line = tokio::time::timeout(std::time::Duration::from_secs(20), log.next_line())
            .await
            .expect("the reload's outcome is logged")
            .unwrap()
            .expect("a log line");
        if line.contains("policy reload failed") {
            break line;
        }
    };
    assert!(failed.contains("p.toml:2:"), "file:line:column: {failed}");
    proxy
        .send(r#"{"jsonrpc":"2.0","id":5,"method":"tools/list"}"#)
        .await;
    let names = tool_names(&answer(&mut proxy, 5).await);
    assert!(!names.contains(&"journal".to_string()), "{names:?}");
    // The session is still there for calls.
    proxy
        .send(r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"big","arguments":{"bytes":100}}}"#)
        .await;
    let big = answer(&mut proxy, 6).await;
    assert_ne!(big["result"]["isError"], true, "{big}");
}
