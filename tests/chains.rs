//! Rule chains (items, text, csv) are served from the result cache: through the real binary in
//! front of the quirky server, which counts how many times each tool ran, a chain runs its tool
//! once, the pages are the same bytes as when every page re-ran the tool, and rule text pages
//! carry the continuation in structuredContent too.

mod common;

use common::{Peer, example, handshake};
use serde_json::{Value, json};

struct Client {
    peer: Peer,
    next_id: u64,
}

impl Client {
    async fn start(options: &[&str]) -> Client {
        let quirky = example("quirky_server");
        let mut peer = Peer::proxy(options, &[quirky.to_str().unwrap()]);
        handshake(&mut peer).await;
        let mut client = Client { peer, next_id: 10 };
        client.request("tools/list", json!({})).await;
        client
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let request =
            json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        self.peer.send(&request.to_string()).await;
        loop {
            let line = self.peer.recv().await;
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == self.next_id {
                return message;
            }
        }
    }

    /// A call's result, and the result's exact bytes as the client received them.
    async fn call(&mut self, tool: &str, arguments: Value) -> (Value, String) {
        self.next_id += 1;
        let request = json!({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}});
        self.peer.send(&request.to_string()).await;
        loop {
            let line = self.peer.recv().await;
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == self.next_id {
                let prefix = format!(r#"{{"jsonrpc":"2.0","id":{},"result":"#, self.next_id);
                let raw = line
                    .strip_prefix(&prefix)
                    .and_then(|rest| rest.strip_suffix('}'))
                    .unwrap_or(&line)
                    .to_string();
                return (message["result"].clone(), raw);
            }
        }
    }

    async fn executions(&mut self, tool: &str) -> u64 {
        let (result, _) = self.call("executions", json!({})).await;
        result["structuredContent"][tool].as_u64().unwrap_or(0)
    }
}

fn policy_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mcp-budget-chains-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

const POLICY: &str = r#"
[budget]
max_bytes = 60000

[[tool]]
name = "journal"
[tool.text]
page_bytes = 20000

[[tool]]
name = "tree"
items = "$.entries"
key = "name"
noun = "entries"
[tool.limit]
default = 50
max = 100
[tool.format]
columns = ["name", "size"]
"#;

/// The continuation of a page.
fn next_after(result: &Value) -> Option<String> {
    common::continuation(result)
}

/// Follows a chain: each page's result and its exact bytes.
async fn chain(client: &mut Client, tool: &str, arguments: Value) -> Vec<(Value, String)> {
    let mut pages = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut args = arguments.clone();
        if let Some(cursor) = &after {
            args["after"] = json!(cursor);
        }
        let (result, raw) = client.call(tool, args).await;
        assert_ne!(result["isError"], true, "{raw}");
        after = next_after(&result);
        pages.push((result, raw));
        if after.is_none() {
            return pages;
        }
        assert!(pages.len() < 400, "the chain does not end");
    }
}

/// A page's line without its result reference: its sentence (in a notice's text, a table's
/// text or an element of `notices`), and the `mcp_budget` member beside a structured
/// continuation.
fn without_reference(line: &str) -> String {
    let mut line = line.to_string();
    let (start, end) = (
        "To pass the whole result to another tool",
        "one part of JSON).",
    );
    while let Some(mut at) = line.find(start) {
        let mut stop = at + line[at..].find(end).unwrap() + end.len();
        // What joined it to what came before, and closed it.
        for (before, after) in [
            (",\\\"", "\\\""),
            (",\"", "\""),
            ("\\n", ""),
            ("\n", ""),
            (" ", ""),
        ] {
            if line[..at].ends_with(before) && line[stop..].starts_with(after) {
                at -= before.len();
                stop += after.len();
                break;
            }
        }
        line.replace_range(at..stop, "");
    }
    // A list of notices that held only the sentence is gone with it.
    for empty in [r#",\"notices\":[\"\"]"#, r#","notices":[""]"#] {
        line = line.replace(empty, "");
    }
    for (member, close) in [
        (r#","mcp_budget":{"result_ref":""#, r#""}"#),
        (r#",\"mcp_budget\":{\"result_ref\":\""#, r#"\"}"#),
    ] {
        while let Some(at) = line.find(member) {
            let rest = &line[at + member.len()..];
            let end = at + member.len() + rest.find(close).unwrap() + close.len();
            line.replace_range(at..end, "");
        }
    }
    line
}

/// The same chain through a proxy whose cache holds nothing (every page re-runs the tool,
/// as rule chains did before they were cached), with the same cursor key.
async fn uncached(tool: &str, arguments: Value, key_env: &str) -> Vec<(Value, String)> {
    let policy = policy_file(
        "uncached.toml",
        &POLICY
            .replace(
                "max_bytes = 60000",
                &format!("max_bytes = 60000\ncache_bytes = 1\ncursor_key_env = \"{key_env}\""),
            )
            // Declared safe to run again: so every page re-runs it.
            .replace(
                "name = \"journal\"",
                "name = \"journal\"\nidempotent = true",
            )
            .replace("name = \"tree\"", "name = \"tree\"\nidempotent = true"),
    );
    let mut client = Client::start(&["--policy", policy.to_str().unwrap()]).await;
    chain(&mut client, tool, arguments).await
}

fn cached_policy(key_env: &str) -> std::path::PathBuf {
    policy_file(
        "cached.toml",
        &POLICY.replace(
            "max_bytes = 60000",
            &format!("max_bytes = 60000\ncursor_key_env = \"{key_env}\""),
        ),
    )
}

#[tokio::test]
async fn a_text_rule_chain_runs_the_tool_once_and_its_pages_are_unchanged() {
    // SAFETY of the test: the variable is set before any proxy starts, for the children only.
    let key_env = "MCP_BUDGET_CHAINS_KEY";
    unsafe { std::env::set_var(key_env, "chains-test-key") };
    let policy = cached_policy(key_env);
    let mut client = Client::start(&["--policy", policy.to_str().unwrap()]).await;
    let arguments = json!({"lines": 20000});
    let pages = chain(&mut client, "journal", arguments.clone()).await;
    assert!(pages.len() > 20, "{} pages", pages.len());
    // journal has a side effect and is not read-only: it ran once for the whole chain.
    assert_eq!(client.executions("journal").await, 1);
    let text: String = pages
        .iter()
        .map(|(r, _)| r["content"][0]["text"].as_str().unwrap().to_string())
        .collect();
    let expected: String = (1..=20000)
        .map(|i| format!("entry {i:06}: the journal line\n"))
        .collect();
    assert_eq!(text, expected);
    // The first page's notice names the search tool.
    let notice = pages[0].0["content"][1]["text"].as_str().unwrap();
    assert!(notice.contains("mcp_budget_search"), "{notice}");
    // Byte for byte what a proxy that re-ran the tool for every page sends.
    let again = uncached("journal", arguments, key_env).await;
    assert_eq!(again.len(), pages.len());
    // (but for the result reference, which only a proxy that keeps the result can honour).
    for ((_, cached), (_, rerun)) in pages.iter().zip(&again) {
        assert!(cached.contains("result_ref"), "{cached:.300}");
        assert_eq!(without_reference(cached), *rerun);
    }
}

#[tokio::test]
async fn items_and_csv_rule_chains_run_the_tool_once_and_their_pages_are_unchanged() {
    let key_env = "MCP_BUDGET_CHAINS_KEY_ITEMS";
    unsafe { std::env::set_var(key_env, "chains-items-key") };
    let policy = cached_policy(key_env);
    for format in ["json", "csv"] {
        let mut client = Client::start(&["--policy", policy.to_str().unwrap()]).await;
        let arguments = json!({"entries": 2000, "format": format, "limit": 100});
        let pages = chain(&mut client, "tree", arguments.clone()).await;
        assert_eq!(pages.len(), 20, "{format}");
        assert_eq!(client.executions("tree").await, 1, "{format}");
        let again = uncached("tree", arguments, key_env).await;
        assert_eq!(again.len(), pages.len());
        for ((_, cached), (_, rerun)) in pages.iter().zip(&again) {
            let stripped = without_reference(cached);
            let at = stripped
                .bytes()
                .zip(rerun.bytes())
                .position(|(a, b)| a != b);
            assert_eq!(
                stripped,
                *rerun,
                "{format}: first difference at {at:?}: {:?} | {:?}",
                at.map(|a| &stripped[a.saturating_sub(80)..(a + 80).min(stripped.len())]),
                at.map(|a| &rerun[a.saturating_sub(80)..(a + 80).min(rerun.len())])
            );
        }
    }
}

#[tokio::test]
async fn a_rule_chain_whose_result_left_the_cache_is_not_re_run_for_a_tool_with_side_effects() {
    let policy = policy_file(
        "tiny.toml",
        &POLICY.replace("max_bytes = 60000", "max_bytes = 60000\ncache_bytes = 1"),
    );
    let mut client = Client::start(&["--policy", policy.to_str().unwrap()]).await;
    let (first, raw) = client.call("journal", json!({"lines": 5000})).await;
    let cursor = next_after(&first).unwrap_or_else(|| panic!("{raw}"));
    let (second, raw) = client
        .call("journal", json!({"lines": 5000, "after": cursor}))
        .await;
    assert_eq!(second["isError"], true, "{raw}");
    assert!(raw.contains("no longer in mcp-budget's cache"), "{raw}");
    assert_eq!(client.executions("journal").await, 1);
}

#[tokio::test]
async fn a_rule_page_of_one_item_over_the_cap_does_not_say_lower_the_limit() {
    // One entry, of a list in a text block's JSON, over a tiny cap.
    let policy = policy_file(
        "one.toml",
        &POLICY.replace("max_bytes = 60000", "max_bytes = 120"),
    );
    let mut client = Client::start(&["--policy", policy.to_str().unwrap()]).await;
    let (result, raw) = client.call("tree", json!({"entries": 1, "limit": 5})).await;
    assert_eq!(result["isError"], true, "{raw}");
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("single item"), "{text}");
    assert!(!text.contains("lower limit"), "{text}");
}

#[tokio::test]
async fn rule_text_pages_carry_the_continuation_in_structured_content_as_the_schema_says() {
    // tree: a JSON listing as text, repeated as structuredContent.content, under an output
    // schema that allows no other property.
    let policy = policy_file(
        "tree-text.toml",
        "[[tool]]\nname = \"tree\"\n[tool.text]\npage_bytes = 4000\n",
    );
    let quirky = example("quirky_server");
    let mut peer = Peer::proxy(
        &["--policy", policy.to_str().unwrap()],
        &[quirky.to_str().unwrap()],
    );
    handshake(&mut peer).await;
    let mut client = Client { peer, next_id: 10 };
    let listed = client.request("tools/list", json!({})).await;
    let tree = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "tree")
        .unwrap()
        .clone();
    let schema = jsonschema::validator_for(&tree["outputSchema"]).unwrap();
    let pages = chain(&mut client, "tree", json!({"entries": 300})).await;
    assert!(pages.len() > 3);
    // The text is a JSON document: each page is JSON (paged by its list), and parses.
    let mut entries = Vec::new();
    for (k, (page, raw)) in pages.iter().enumerate() {
        let structured = &page["structuredContent"];
        assert!(schema.is_valid(structured), "page {k}: {raw}");
        assert_eq!(structured["content"], page["content"][0]["text"]);
        assert_eq!(
            structured["next_after"].is_string(),
            k + 1 < pages.len(),
            "page {k}"
        );
        assert!(structured["notice"].is_string());
        let text = page["content"][0]["text"].as_str().unwrap();
        let document: Value = serde_json::from_str(text).expect("a page of JSON parses");
        entries.extend(document["entries"].as_array().unwrap().iter().cloned());
    }
    assert_eq!(entries.len(), 300);
    let names: std::collections::HashSet<String> = entries.iter().map(|e| e.to_string()).collect();
    assert_eq!(names.len(), 300, "an entry was served twice");
    assert_eq!(client.executions("tree").await, 1);
}

/// Follows a fleet_show chain through a proxy under `policy`: every page's exact bytes.
async fn fleet_chain(policy: &std::path::Path, arguments: Value) -> Vec<String> {
    let fleet = example("fleet_server");
    let mut peer = Peer::proxy(
        &["--policy", policy.to_str().unwrap()],
        &[fleet.to_str().unwrap(), "--streams", "300", "--seed", "7"],
    );
    handshake(&mut peer).await;
    let mut client = Client { peer, next_id: 10 };
    chain(&mut client, "fleet_show", arguments)
        .await
        .into_iter()
        .map(|(_, raw)| raw)
        .collect()
}

#[tokio::test]
async fn a_list_in_structured_content_is_walked_once_and_its_pages_are_unchanged() {
    // The fleet's list is in structuredContent (and copied in the text block): later pages
    // come from the walk the first page made.
    let key_env = "MCP_BUDGET_CHAINS_KEY_FLEET";
    unsafe { std::env::set_var(key_env, "chains-fleet-key") };
    let base = std::fs::read_to_string("policies/fleet.toml").unwrap();
    let keyed = base.replace(
        "[budget]\n",
        &format!("[budget]\ncursor_key_env = \"{key_env}\"\n"),
    );
    let cached = policy_file("fleet-cached.toml", &keyed);
    let uncached = policy_file(
        "fleet-uncached.toml",
        &keyed.replace("[budget]\n", "[budget]\ncache_bytes = 1\n"),
    );
    for arguments in [
        json!({"horizon": "all", "limit": 40}),
        json!({"state": ["running", "blocked"], "detail": "full", "limit": 10}),
        json!({"format": "csv", "limit": 100, "horizon": "all"}),
    ] {
        let pages = fleet_chain(&cached, arguments.clone()).await;
        assert!(pages.len() > 2, "{arguments}: {} pages", pages.len());
        let again = fleet_chain(&uncached, arguments.clone()).await;
        let pages: Vec<String> = pages.iter().map(|p| without_reference(p)).collect();
        assert_eq!(pages, again, "{arguments}");
    }
}

#[tokio::test]
async fn a_chain_over_a_result_that_changes_with_every_call_is_one_result() {
    // With --churn, every fleet_show call first advances 20 live streams: pages cut from
    // several calls would mix states; pages from the cache are all the first call's.
    let args = ["--streams", "300", "--seed", "7", "--churn", "20"];
    let fleet = example("fleet_server");
    let mut direct = Peer::spawn(&fleet, &args);
    handshake(&mut direct).await;
    direct
        .send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fleet_show","arguments":{}}}"#)
        .await;
    let whole: Value = serde_json::from_str(&direct.recv().await).unwrap();
    let states = |streams: &Value| -> Vec<(String, String)> {
        streams
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["stream_id"].as_str().unwrap().to_string(),
                    s["state"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let expected = states(&whole["result"]["structuredContent"]["streams"]);
    let mut peer = Peer::proxy(
        &["--policy", "policies/fleet.toml"],
        &[
            fleet.to_str().unwrap(),
            "--streams",
            "300",
            "--seed",
            "7",
            "--churn",
            "20",
        ],
    );
    handshake(&mut peer).await;
    let mut client = Client { peer, next_id: 10 };
    let pages = chain(
        &mut client,
        "fleet_show",
        json!({"horizon": "all", "limit": 40}),
    )
    .await;
    assert!(pages.len() > 5);
    let got: Vec<(String, String)> = pages
        .iter()
        .flat_map(|(page, _)| states(&page["structuredContent"]["streams"]))
        .collect();
    assert_eq!(got, expected);
}
