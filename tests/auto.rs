//! Automatic paging through the real binary, with no policy or a policy without rules for the
//! tools: the real quirky server behind, results followed page by page as a client would.

mod common;

use common::{Peer, example, handshake};
use serde_json::{Value, json};

struct Client {
    peer: Peer,
    next_id: u64,
}

impl Client {
    /// The proxy with `options` in front of the quirky server, initialized, tools listed.
    async fn start(options: &[&str]) -> Client {
        let quirky = example("quirky_server");
        let mut peer = Peer::proxy(options, &[quirky.to_str().unwrap()]);
        handshake(&mut peer).await;
        let mut client = Client { peer, next_id: 10 };
        client.request("tools/list", json!({})).await;
        client
    }

    /// One request; returns (the response, its line).
    async fn request(&mut self, method: &str, params: Value) -> (Value, String) {
        self.next_id += 1;
        let request =
            json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        self.peer.send(&request.to_string()).await;
        loop {
            let line = self.peer.recv().await;
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == self.next_id {
                return (message, line);
            }
        }
    }

    async fn call(&mut self, tool: &str, arguments: Value) -> (Value, String) {
        let (message, line) = self
            .request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await;
        (message["result"].clone(), line)
    }

    /// How many times each tool ran on the server.
    async fn executions(&mut self) -> Value {
        self.call("executions", json!({})).await.0["structuredContent"].clone()
    }
}

/// A policy file with `text`, in a temporary folder of this test run.
fn policy_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mcp-budget-auto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The cursor a page's notice gives, if any.
fn next_after(result: &Value) -> Option<String> {
    let blocks = result["content"].as_array()?;
    let notice = blocks.last()?["text"].as_str()?;
    let start = notice.find("after:\"")? + "after:\"".len();
    let end = notice[start..].find('"')? + start;
    Some(notice[start..end].to_string())
}

/// Follows a chain of pages of `tool`; returns each page's result and response line.
async fn chain(client: &mut Client, tool: &str, arguments: Value) -> Vec<(Value, String)> {
    chain_by(client, tool, arguments, "after").await
}

/// [`chain`], continuing with `argument` (the proxy's `after`, or `mcp_budget_after`).
async fn chain_by(
    client: &mut Client,
    tool: &str,
    arguments: Value,
    argument: &str,
) -> Vec<(Value, String)> {
    let mut pages = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut args = arguments.clone();
        if let Some(cursor) = &after {
            args[argument] = json!(cursor);
        }
        let (result, line) = client.call(tool, args).await;
        assert_ne!(result["isError"], true, "{line}");
        after = next_after(&result);
        pages.push((result, line));
        if after.is_none() {
            return pages;
        }
        assert!(pages.len() < 100, "the chain does not end");
    }
}

/// The text of a page: its blocks but the notice, joined.
fn page_text(result: &Value) -> String {
    let blocks = result["content"].as_array().unwrap();
    blocks[..blocks.len() - 1]
        .iter()
        .map(|b| b["text"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn without_a_policy_a_long_text_is_paged_and_the_pages_are_the_text() {
    let mut proxied = Client::start(&[]).await;
    let arguments = json!({"bytes": 450_000, "line": 100});
    let pages = chain(&mut proxied, "big", arguments.clone()).await;
    assert!(pages.len() >= 3, "{} pages", pages.len());
    let mut direct = Peer::quirky();
    handshake(&mut direct).await;
    direct
        .send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "big", "arguments": arguments}}).to_string())
        .await;
    let whole: Value = direct.recv_json().await;
    let whole = whole["result"]["content"][0]["text"].as_str().unwrap();
    let mut joined = String::new();
    for (result, line) in &pages {
        let size = line.len() - line.find(r#""result":"#).unwrap();
        assert!(size < 200_000, "a page of {size} bytes");
        joined.push_str(&page_text(result));
    }
    assert_eq!(joined, whole, "the pages concatenate to the server's text");
    // The first page says where it is and how to go on; the last says it is the last.
    let first = pages[0].0["content"].as_array().unwrap().last().unwrap()["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(first.contains("lines 1-"), "{first}");
    assert!(first.contains("of 4500"), "{first}");
    let last = pages.last().unwrap().0["content"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(last.contains(" This is the last page."), "{last}");
    // The server ran once for the whole chain: the next pages came from the cache.
    assert_eq!(proxied.executions().await["big"], 1);
}

#[tokio::test]
async fn tools_gain_only_after_spliced_into_the_servers_bytes() {
    let quirky = example("quirky_server");
    let mut direct = Peer::quirky();
    handshake(&mut direct).await;
    let mut proxied = Peer::proxy(&[], &[quirky.to_str().unwrap()]);
    handshake(&mut proxied).await;
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    direct.send(list).await;
    proxied.send(list).await;
    // The server logs before it answers; the answer is the line with the id.
    let mut direct_line = direct.recv().await;
    while !direct_line.contains(r#""id":2"#) {
        direct_line = direct.recv().await;
    }
    let mut proxied_line = proxied.recv().await;
    while !proxied_line.contains(r#""id":2"#) {
        proxied_line = proxied.recv().await;
    }
    let (direct, proxied) = (direct_line, proxied_line);
    assert_ne!(direct, proxied);
    let restored = common::without_auto_after(&proxied);
    assert_eq!(
        restored, direct,
        "nothing but `after` changed, byte for byte"
    );
    let tools: Value = serde_json::from_str(&proxied).unwrap();
    for tool in tools["result"]["tools"].as_array().unwrap() {
        if tool["name"] == "closed" {
            // Its schema takes no other argument: left as the server wrote it.
            continue;
        }
        // `history` has an `after` of its own: the proxy's is called mcp_budget_after there.
        let name = if tool["name"] == "history" {
            "mcp_budget_after"
        } else {
            "after"
        };
        assert_eq!(
            tool["inputSchema"]["properties"][name]["type"], "string",
            "{}",
            tool["name"]
        );
    }
}

#[tokio::test]
async fn what_cannot_be_split_is_refused_with_the_tools_own_arguments() {
    let mut proxied = Client::start(&[]).await;
    // One line of 300,000 bytes: more than the whole budget.
    let (result, line) = proxied.call("big", json!({"bytes": 300_000})).await;
    assert_eq!(result["isError"], true, "{line}");
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("result-too-large: big's result is 3000"),
        "{text}"
    );
    assert!(
        text.contains("line 1 of its text alone is 300000 bytes"),
        "{text}"
    );
    assert!(text.contains("(bytes, line)"), "{text}");
    assert!(
        !text.contains("policy"),
        "operator advice is for the log: {text}"
    );
    // Under the budget: untouched.
    let mut direct = Peer::quirky();
    handshake(&mut direct).await;
    let small = json!({"bytes": 10});
    direct
        .send(&json!({"jsonrpc": "2.0", "id": proxied.next_id + 1, "method": "tools/call", "params": {"name": "big", "arguments": small}}).to_string())
        .await;
    let (_, through) = proxied.call("big", small).await;
    assert_eq!(through, direct.recv().await);
}

#[tokio::test]
async fn a_tool_with_side_effects_runs_once_per_chain_and_is_never_rerun() {
    let mut proxied = Client::start(&[]).await;
    let pages = chain(&mut proxied, "journal", json!({"lines": 20_000})).await;
    assert!(pages.len() >= 3);
    let joined: String = pages.iter().map(|(r, _)| page_text(r)).collect();
    let expected: String = (1..=20_000)
        .map(|i| format!("entry {i:06}: the journal line\n"))
        .collect();
    assert_eq!(joined, expected);
    assert_eq!(proxied.executions().await["journal"], 1);
}

#[tokio::test]
async fn when_the_cache_cannot_hold_a_result_read_only_tools_are_recalled_and_others_refused() {
    let policy = policy_file("tiny-cache.toml", "[budget]\ncache_bytes = 1000\n");
    let mut proxied = Client::start(&["--policy", policy.to_str().unwrap()]).await;
    // A read-only tool: the chain goes on, the tool is called again for each page.
    let pages = chain(&mut proxied, "big", json!({"bytes": 450_000, "line": 100})).await;
    let joined: String = pages.iter().map(|(r, _)| page_text(r)).collect();
    assert_eq!(joined.len(), 450_000);
    assert_eq!(
        proxied.executions().await["big"],
        pages.len() as u64,
        "one execution per page"
    );
    // A tool with side effects: page 2 is refused, clearly, and the tool is not run again.
    let (first, _) = proxied.call("journal", json!({"lines": 20_000})).await;
    let cursor = next_after(&first).expect("a second page");
    let (second, line) = proxied
        .call("journal", json!({"lines": 20_000, "after": cursor}))
        .await;
    assert_eq!(second["isError"], true, "{line}");
    let text = second["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("no longer in mcp-budget's cache") && text.contains("without after"),
        "{text}"
    );
    assert_eq!(proxied.executions().await["journal"], 1);
    // A cursor for other arguments is refused as such.
    let (other, _) = proxied
        .call(
            "journal",
            json!({"lines": 5, "after": next_after(&first).unwrap()}),
        )
        .await;
    assert!(
        other["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("different query"),
        "{other}"
    );
}

#[tokio::test]
async fn an_expired_entry_is_never_served_and_the_ttl_is_a_flag() {
    let mut proxied = Client::start(&["--cache-ttl-secs", "0"]).await;
    let (first, _) = proxied.call("journal", json!({"lines": 20_000})).await;
    let cursor = next_after(&first).expect("a second page");
    let (second, line) = proxied
        .call("journal", json!({"lines": 20_000, "after": cursor}))
        .await;
    assert_eq!(second["isError"], true, "{line}");
    assert!(
        second["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("results are kept 0 minutes"),
        "{line}"
    );
    assert_eq!(proxied.executions().await["journal"], 1);
}

#[tokio::test]
async fn auto_false_turns_automatic_paging_off() {
    let policy = policy_file("off.toml", "[budget]\nauto = false\n");
    let quirky = example("quirky_server");
    let mut direct = Peer::quirky();
    handshake(&mut direct).await;
    let mut proxied = Peer::proxy(
        &["--policy", policy.to_str().unwrap()],
        &[quirky.to_str().unwrap()],
    );
    handshake(&mut proxied).await;
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    direct.send(list).await;
    proxied.send(list).await;
    for _ in 0..2 {
        assert_eq!(
            direct.recv().await,
            proxied.recv().await,
            "descriptors untouched"
        );
    }
    let big = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "big", "arguments": {"bytes": 450_000, "line": 100}}});
    proxied.send(&big.to_string()).await;
    let reply = proxied.recv_json().await;
    assert_eq!(reply["result"]["isError"], true);
    // The model reads a move it can make; the operator's (a rule, auto) goes to the log.
    let text = reply["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains(
            "exceeds the 200000-byte cap — call big again with arguments that select less"
        ),
        "{reply}"
    );
    assert!(
        !text.contains("[[tool]]") && !text.contains("policy"),
        "{text}"
    );
    proxied.close_stdin();
    proxied.wait().await;
    let log = proxied.stderr().await;
    assert!(
        log.contains("the tool has no budget rule and automatic paging is off"),
        "{log}"
    );
}

/// A policy with an items rule for quirky's `tree` (JSON text, repeated as
/// structuredContent.content, as server-filesystem sends it).
fn tree_policy() -> std::path::PathBuf {
    policy_file(
        "tree.toml",
        "[[tool]]\nname = \"tree\"\nitems = \"$.entries\"\nkey = \"name\"\nnoun = \"entries\"\n[tool.format]\ncolumns = [\"name\", \"size\"]\n",
    )
}

#[tokio::test]
async fn an_items_rule_pages_the_structured_copy_of_the_text_too() {
    let policy = tree_policy();
    let mut proxied = Client::start(&["--policy", policy.to_str().unwrap()]).await;
    let (tools, _) = proxied.request("tools/list", json!({})).await;
    let tree = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "tree")
        .unwrap()
        .clone();
    let schema = jsonschema::validator_for(&tree["outputSchema"]).unwrap();
    // JSON: a 2-entry page of a 20,000-entry listing is small, in both copies.
    let (page, line) = proxied
        .call("tree", json!({"entries": 20_000, "limit": 2}))
        .await;
    assert!(line.len() < 5_000, "a 2-entry page is {} bytes", line.len());
    let text = page["content"][0]["text"].as_str().unwrap();
    assert_eq!(
        page["structuredContent"]["content"], text,
        "both copies agree"
    );
    let envelope: Value = serde_json::from_str(text).unwrap();
    assert_eq!(envelope["entries"].as_array().unwrap().len(), 2);
    assert_eq!(envelope["total_count"], 20_000);
    assert!(envelope["next_after"].is_string());
    assert!(schema.is_valid(&page["structuredContent"]));
    // csv: one row, and the same row in structuredContent, which validates.
    let (page, line) = proxied
        .call(
            "tree",
            json!({"entries": 20_000, "limit": 1, "format": "csv"}),
        )
        .await;
    assert!(line.len() < 5_000, "a 1-row page is {} bytes", line.len());
    assert_eq!(
        page["content"][0]["text"], "name,size\nfile-00000.txt,0\n",
        "{line}"
    );
    let structured = &page["structuredContent"];
    assert_eq!(structured["columns"], json!(["name", "size"]));
    assert_eq!(structured["rows"], json!([["file-00000.txt", 0]]));
    assert!(structured["next_after"].is_string());
    assert!(
        schema.is_valid(structured),
        "{:?}",
        schema
            .iter_errors(structured)
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
    );
}

/// One JSON-RPC request over HTTP; its response (read from JSON or from the SSE stream).
async fn http_call(client: &reqwest::Client, url: &str, session: &str, request: Value) -> Value {
    let text = common::mcp_post(client, url, Some(session), &request.to_string())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let id = &request["id"];
    let messages: Vec<Value> = if text.trim_start().starts_with('{') {
        vec![serde_json::from_str(&text).unwrap()]
    } else {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    };
    messages
        .into_iter()
        .find(|m| &m["id"] == id)
        .unwrap_or_else(|| panic!("no answer to {request} in {text}"))
}

#[tokio::test]
async fn no_session_reads_another_sessions_cached_result() {
    let quirky = example("quirky_server");
    let (_proxy, url) = common::listen(&["--", quirky.to_str().unwrap()], &[]).await;
    // reqwest is built here without a default TLS provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let a = common::mcp_initialize(&client, &url).await;
    let b = common::mcp_initialize(&client, &url).await;
    for session in [&a, &b] {
        http_call(
            &client,
            &url,
            session,
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        )
        .await;
    }
    let call = |id: u64, arguments: Value| json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "journal", "arguments": arguments}});
    let first = http_call(&client, &url, &a, call(2, json!({"lines": 20_000}))).await;
    let cursor = next_after(&first["result"]).expect("a second page");
    // Session B holds A's cursor: the cursor is genuine, but B has no such result, and the
    // tool has side effects, so it is not run again for B either.
    let stolen = http_call(
        &client,
        &url,
        &b,
        call(3, json!({"lines": 20_000, "after": cursor})),
    )
    .await;
    assert_eq!(stolen["result"]["isError"], true, "{stolen}");
    assert!(
        stolen["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("no longer in mcp-budget's cache"),
        "{stolen}"
    );
    // A goes on from its cache.
    let second = http_call(
        &client,
        &url,
        &a,
        call(4, json!({"lines": 20_000, "after": cursor})),
    )
    .await;
    assert_ne!(second["result"]["isError"], true, "{second}");
    assert!(
        page_text(&second["result"]).starts_with("entry 0"),
        "{second}"
    );
}

/// The proxy in front of quirky with its state directory at `state`, initialized, tools listed.
async fn start_with_state(state: &std::path::Path) -> Client {
    let quirky = example("quirky_server");
    let mut command = tokio::process::Command::new(common::proxy_bin());
    command.arg("--").arg(&quirky).env("XDG_STATE_HOME", state);
    let mut peer = Peer::from_command(command);
    handshake(&mut peer).await;
    let mut client = Client { peer, next_id: 10 };
    client.request("tools/list", json!({})).await;
    client
}

#[tokio::test]
async fn cursors_survive_a_restart_and_another_keys_cursor_says_so() {
    use std::os::unix::fs::PermissionsExt;
    let base = std::env::temp_dir().join(format!("mcp-budget-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (state, other) = (base.join("a"), base.join("b"));
    let arguments = json!({"bytes": 450_000, "line": 100});
    let mut before = start_with_state(&state).await;
    let (first, _) = before.call("big", arguments.clone()).await;
    let cursor = next_after(&first).expect("a second page");
    drop(before);
    let key = state.join("mcp-budget/cursor.key");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the key file is private");
    // After a restart, the chain goes on (the read-only tool is called again for the page).
    let mut after = start_with_state(&state).await;
    let mut args = arguments.clone();
    args["after"] = json!(cursor);
    let (second, line) = after.call("big", args.clone()).await;
    assert_ne!(second["isError"], true, "{line}");
    assert!(page_text(&second).starts_with('x'));
    // Another instance with its own key: the cursor is refused as another key's, not as altered.
    let mut stranger = start_with_state(&other).await;
    let (refused, line) = stranger.call("big", args).await;
    assert_eq!(refused["isError"], true, "{line}");
    let text = refused["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("issued by another mcp-budget instance"),
        "{text}"
    );
    drop(stranger);
    // A key file others can read stops the proxy at start, with the fix.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = std::process::Command::new(common::proxy_bin())
        .arg("--")
        .arg(example("quirky_server"))
        .env("XDG_STATE_HOME", &state)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("chmod 600"), "{stderr}");
    let _ = std::fs::remove_dir_all(&base);
}

#[tokio::test]
async fn a_result_that_changed_since_its_first_page_is_never_cut_at_an_old_position() {
    let policy = policy_file("tiny-cache-drift.toml", "[budget]\ncache_bytes = 1000\n");
    let mut proxied = Client::start(&["--policy", policy.to_str().unwrap()]).await;
    let (first, _) = proxied.call("drift", json!({"lines": 12_000})).await;
    let cursor = next_after(&first).expect("a second page");
    // Not cached (too large for a 1000-byte cache): the read-only tool runs again, answers
    // otherwise, and the proxy says so instead of cutting the new answer at the old offset.
    let (second, line) = proxied
        .call("drift", json!({"lines": 12_000, "after": cursor}))
        .await;
    assert_eq!(second["isError"], true, "{line}");
    let text = second["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("changed since the page"), "{text}");
}

#[tokio::test]
async fn a_tool_with_an_after_of_its_own_continues_under_another_name() {
    let mut proxied = Client::start(&[]).await;
    let (tools, _) = proxied.request("tools/list", json!({})).await;
    let history = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "history")
        .unwrap()
        .clone();
    let properties = &history["inputSchema"]["properties"];
    assert_eq!(properties["after"]["type"], "integer", "the tool's own");
    assert_eq!(properties["mcp_budget_after"]["type"], "string");
    // Its own `after` reaches it; the chain follows mcp_budget_after.
    let arguments = json!({"after": 100, "lines": 12_000});
    let pages = chain_by(&mut proxied, "history", arguments, "mcp_budget_after").await;
    let notice = pages[0].0["content"].as_array().unwrap().last().unwrap()["text"]
        .as_str()
        .unwrap();
    assert!(notice.contains("mcp_budget_after:\""), "{notice}");
    assert!(pages.len() > 1);
    let joined: String = pages.iter().map(|(page, _)| page_text(page)).collect();
    let expected: String = (101..=12_100)
        .map(|i| format!("history run 1 line {i:06}\n"))
        .collect();
    assert_eq!(joined, expected);
    assert_eq!(proxied.executions().await["history"], 1);
}

#[tokio::test]
async fn refusals_name_the_right_size_and_line_ranges_do_not_overlap() {
    let mut proxied = Client::start(&[]).await;
    // One line longer than the whole budget, its size named (not the whole text's).
    let (result, line) = proxied
        .call("big", json!({"bytes": 250_000, "line": 240_000}))
        .await;
    assert_eq!(result["isError"], true, "{line}");
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("line 1 of its text alone is 24000"), "{text}");
    // Consecutive pages name consecutive line ranges.
    let pages = chain(&mut proxied, "big", json!({"bytes": 600_000, "line": 100})).await;
    let mut expected_first = 1;
    for (page, _) in &pages {
        let notice = page["content"].as_array().unwrap().last().unwrap()["text"]
            .as_str()
            .unwrap();
        let range = notice
            .split("lines ")
            .nth(1)
            .unwrap()
            .split(" of")
            .next()
            .unwrap();
        let (first, last) = range.split_once('-').unwrap();
        let (first, last): (usize, usize) = (first.parse().unwrap(), last.parse().unwrap());
        assert_eq!(first, expected_first, "{notice}");
        assert_eq!(
            last - first + 1,
            page_text(page).lines().count(),
            "{notice}"
        );
        expected_first = last + 1;
    }
    assert_eq!(expected_first, 6_001);
}

#[tokio::test]
async fn a_structured_array_is_paged_as_the_list_and_stays_valid_against_its_schema() {
    let mut client = Client::start(&["--policy", "none"]).await;
    let (list, _) = client.request("tools/list", json!({})).await;
    let tool = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "rows")
        .unwrap()
        .clone();
    // The list's schema is the server's: an array has no room for the proxy's fields.
    assert_eq!(tool["outputSchema"]["type"], "array");
    assert!(tool["outputSchema"].get("properties").is_none());
    assert!(tool["inputSchema"]["properties"]["after"].is_object());
    let schema = jsonschema::validator_for(&tool["outputSchema"]).unwrap();
    let mut rows = Vec::new();
    let mut arguments = json!({"rows": 5000});
    let mut pages = 0;
    loop {
        let (result, line) = client.call("rows", arguments.clone()).await;
        pages += 1;
        assert!(line.len() < 200_000, "page {pages}: {} bytes", line.len());
        let structured = &result["structuredContent"];
        assert!(
            schema.is_valid(structured),
            "page {pages} breaks the outputSchema"
        );
        rows.extend(structured.as_array().unwrap().iter().cloned());
        let continuation = &result["_meta"]["mcp-budget/continuation"];
        assert_eq!(continuation["total_count"], 5000);
        // The text says so too, for a client that reads only the text.
        let notice = result["content"].as_array().unwrap().last().unwrap()["text"]
            .as_str()
            .unwrap()
            .to_string();
        match continuation["next_after"].as_str() {
            Some(next) => {
                assert!(notice.contains(next), "{notice}");
                arguments = json!({"rows": 5000, "after": next});
            }
            None => break,
        }
        assert!(pages < 20, "the chain does not end");
    }
    assert!(pages > 1);
    assert_eq!(rows.len(), 5000);
    for (n, row) in rows.iter().enumerate() {
        assert_eq!(row["n"], n as u64, "every row once, in order");
    }
    // The tool ran once for the whole chain.
    assert_eq!(client.executions().await["rows"], 1);
}

#[tokio::test]
async fn a_schema_closed_to_other_arguments_leaves_its_tool_unbudgeted() {
    let mut client = Client::start(&["--policy", "none"]).await;
    let (list, _) = client.request("tools/list", json!({})).await;
    let tools = list["result"]["tools"].as_array().unwrap();
    let closed = tools.iter().find(|t| t["name"] == "closed").unwrap();
    // Not a byte of its descriptor changed: a client validating against the $ref'd schema
    // (additionalProperties: false) would refuse an `after`.
    assert_eq!(
        closed["inputSchema"],
        json!({"$ref":"#/$defs/Args","$defs":{"Args":{"type":"object","properties":{"bytes":{"type":"integer"}},"additionalProperties":false}}})
    );
    let big = tools.iter().find(|t| t["name"] == "big").unwrap();
    assert!(big["inputSchema"]["properties"]["after"].is_object());
    // Not paged (no `after` to continue with): a small result passes as it is, and the cap
    // still refuses one over the budget rather than let it through.
    let (result, line) = client.call("closed", json!({"bytes": 3_000})).await;
    assert_eq!(
        result["content"][0]["text"].as_str().unwrap().len(),
        3_000,
        "{line:.200}"
    );
    let (result, _) = client.call("closed", json!({"bytes": 300_000})).await;
    assert_eq!(result["isError"], true);
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("result-too-large: closed")
    );
}
