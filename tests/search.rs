//! `mcp_budget_search` through the real binary: a regex over the lines of a 3 MB text a rule
//! pages, a JSONPath and a regex over the items of the 11 MB fleet result, a result paged
//! automatically (no policy); matches equal what `grep -n` and a JSONPath evaluation of the
//! same document give, search answers over the budget are paged, and costly queries are
//! refused without a stall.

mod common;

use common::{Peer, example, handshake};
use serde_json::{Value, json};

struct Client {
    peer: Peer,
    next_id: u64,
}

impl Client {
    async fn over(mut peer: Peer) -> Client {
        handshake(&mut peer).await;
        let mut client = Client { peer, next_id: 10 };
        let listed = client.request("tools/list", json!({})).await;
        let names: Vec<&str> = listed["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert!(names.contains(&"mcp_budget_search"), "{names:?}");
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

    async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let answer = self
            .request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await;
        assert!(answer.get("error").is_none(), "{answer}");
        answer["result"].clone()
    }

    /// Every match of a search, following its own pages; and how many pages it took.
    async fn search_all(&mut self, mut arguments: Value) -> (Vec<Value>, usize, Value) {
        let mut matches = Vec::new();
        let mut pages = 0;
        loop {
            let result = self.call("mcp_budget_search", arguments.clone()).await;
            assert_ne!(result["isError"], true, "{result}");
            let answer = result["structuredContent"].clone();
            // The text block holds the same answer.
            let text: Value =
                serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
            assert_eq!(text, answer);
            matches.extend(answer["matches"].as_array().unwrap().iter().cloned());
            pages += 1;
            match answer["next_after"].as_str() {
                Some(next) => arguments["after"] = json!(next),
                None => return (matches, pages, answer),
            }
            assert!(pages < 200, "the search's pages do not end");
        }
    }
}

/// A file of its own for `name` (tests run at once: each call gets another file).
fn temp(name: &str) -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("mcp-budget-search-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{n}-{name}"))
}

/// The continuation of a page (a first page here always has one).
fn next_after(result: &Value) -> String {
    common::continuation(result).unwrap_or_else(|| panic!("no continuation: {result}"))
}

/// `grep -n [-C n] pattern` over `text` (as a file): (line, text, is a match) in order.
fn grep(text: &str, pattern: &str, context: usize) -> Vec<(u64, String, bool)> {
    let file = temp(&format!("grep-{context}.txt"));
    std::fs::write(&file, text).unwrap();
    let output = std::process::Command::new("grep")
        .args(["-n", "-E", &format!("-C{context}"), pattern])
        .arg(&file)
        .output()
        .unwrap();
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter(|line| *line != "--")
        .map(|line| {
            let at = line.find([':', '-']).unwrap();
            let number = line[..at].parse().unwrap();
            (number, line[at + 1..].to_string(), &line[at..=at] == ":")
        })
        .collect()
}

fn as_grep(matches: &[Value]) -> Vec<(u64, String, bool)> {
    matches
        .iter()
        .map(|m| {
            (
                m["line"].as_u64().unwrap(),
                m["text"].as_str().unwrap().to_string(),
                m.get("context").is_none(),
            )
        })
        .collect()
}

fn journal(lines: usize) -> String {
    (1..=lines)
        .map(|i| format!("entry {i:06}: the journal line\n"))
        .collect()
}

const TEXT_POLICY: &str = r#"
[[tool]]
name = "journal"
[tool.text]
page_bytes = 20000
"#;

#[tokio::test]
async fn a_regex_with_context_over_a_3_mb_text_a_rule_pages_is_grep() {
    let policy = temp("text.toml");
    std::fs::write(&policy, TEXT_POLICY).unwrap();
    let quirky = example("quirky_server");
    let peer = Peer::proxy(
        &["--policy", policy.to_str().unwrap()],
        &[quirky.to_str().unwrap()],
    );
    let mut client = Client::over(peer).await;
    let lines = 100_000; // 3.1 MB
    let first = client.call("journal", json!({"lines": lines})).await;
    let cursor = next_after(&first);
    let pattern = "entry 0(1234|55[0-9]{2}|9999)[0-9]:";
    let (matches, _, answer) = client
        .search_all(json!({"cursor": cursor, "pattern": pattern, "context": 2}))
        .await;
    let text = journal(lines);
    assert!(text.len() > 3_000_000);
    let expected = grep(&text, pattern, 2);
    assert!(expected.len() > 100);
    let got = as_grep(&matches);
    let differs = got.iter().zip(&expected).position(|(g, e)| g != e);
    assert_eq!(
        got.len(),
        expected.len(),
        "first difference at {differs:?}: {:?}",
        differs.map(|k| (
            &got[k.saturating_sub(2)..k + 1],
            &expected[k.saturating_sub(2)..k + 1]
        ))
    );
    assert_eq!(got, expected);
    assert_eq!(
        answer["total_matches"],
        expected.iter().filter(|m| m.2).count()
    );
    assert_eq!(answer["total"], lines);
    // A search that matches 3,000 lines is over the budget: it comes in pages.
    let (matches, pages, _) = client
        .search_all(json!({"cursor": cursor, "pattern": "^entry 00[0-2]"}))
        .await;
    assert_eq!(matches.len(), 2999);
    assert!(pages > 1, "{pages} page");
    assert_eq!(as_grep(&matches), grep(&text, "^entry 00[0-2]", 0));
    // Matches beyond the bound are counted, and the answer says that only the first are listed.
    let (matches, _, answer) = client
        .search_all(json!({"cursor": cursor, "pattern": "^entry"}))
        .await;
    assert_eq!(answer["total_matches"], lines);
    assert_eq!(matches.len(), 10_000);
    let notice = answer["notice"].as_str().unwrap();
    assert!(notice.contains("Only the first 10000"), "{notice}");
    // The tool ran once: the search read the cache.
    let runs = client.call("executions", json!({})).await;
    assert_eq!(runs["structuredContent"]["journal"], 1);
}

#[tokio::test]
async fn without_a_policy_the_automatic_chain_is_searched() {
    let quirky = example("quirky_server");
    let peer = Peer::proxy(&["--policy", "none"], &[quirky.to_str().unwrap()]);
    let mut client = Client::over(peer).await;
    let first = client.call("journal", json!({"lines": 30000})).await;
    let notice = first["content"].as_array().unwrap().last().unwrap()["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(notice.contains("mcp_budget_search"), "{notice}");
    let cursor = next_after(&first);
    let (matches, _, _) = client
        .search_all(json!({"cursor": cursor, "pattern": "entry 0(0042|1234|29999)"}))
        .await;
    let text = journal(30000);
    assert_eq!(
        as_grep(&matches),
        grep(&text, "entry 0(0042|1234|29999)", 0)
    );
}

#[tokio::test]
async fn a_jsonpath_and_a_regex_over_the_11_mb_fleet_result() {
    let fleet = example("fleet_server");
    let args = ["--streams", "1000", "--seed", "7"];
    // The document, straight from the server.
    let mut direct = Peer::spawn(&fleet, &args);
    handshake(&mut direct).await;
    direct
        .send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fleet_show","arguments":{}}}"#)
        .await;
    let line = direct.recv().await;
    assert!(line.len() > 10_000_000, "{} bytes", line.len());
    let whole: Value = serde_json::from_str(&line).unwrap();
    let document = whole["result"]["structuredContent"].clone();
    let path = "$.streams[?(@.state == 'blocked')].stream_id";
    let expected: Vec<Value> = jsonpath_rust::query::js_path_vals(path, &document)
        .unwrap()
        .into_iter()
        .cloned()
        .collect();
    assert!(
        !expected.is_empty(),
        "{} streams, states {:?}",
        document["streams"].as_array().map_or(0, Vec::len),
        document["streams"][0]["state"]
    );

    let proxied = Peer::proxy(
        &["--policy", "policies/fleet.toml"],
        &[fleet.to_str().unwrap(), "--streams", "1000", "--seed", "7"],
    );
    let mut client = Client::over(proxied).await;
    let first = client.call("fleet_show", json!({"horizon": "all"})).await;
    let cursor = next_after(&first);
    let (matches, _, _) = client
        .search_all(json!({"cursor": cursor, "path": path}))
        .await;
    let values: Vec<Value> = matches.iter().map(|m| m["value"].clone()).collect();
    assert_eq!(values, expected);

    // A regex over the items, by their JSON text (the server's bytes).
    let pattern = r#""state":"blocked""#;
    let regex = regex::Regex::new(pattern).unwrap();
    let streams = document["streams"].as_array().unwrap();
    let expected: Vec<(usize, Value)> = streams
        .iter()
        .enumerate()
        .filter(|(_, s)| regex.is_match(&s.to_string()))
        .map(|(i, s)| (i, s.clone()))
        .collect();
    assert!(!expected.is_empty());
    let (matches, pages, answer) = client
        .search_all(json!({"cursor": cursor, "pattern": pattern}))
        .await;
    let got: Vec<(usize, Value)> = matches
        .iter()
        .map(|m| (m["index"].as_u64().unwrap() as usize, m["item"].clone()))
        .collect();
    assert_eq!(got, expected);
    assert_eq!(answer["total"], 1000);
    assert!(
        pages > 1,
        "the full items are over the budget: {pages} page"
    );
}

#[tokio::test]
async fn costly_or_forged_queries_are_refused_with_a_way_out() {
    let quirky = example("quirky_server");
    let peer = Peer::proxy(&[], &[quirky.to_str().unwrap()]);
    let mut client = Client::over(peer).await;
    // Lines of 100 KB: `(x+)+y$` backtracks catastrophically in a backtracking engine.
    let first = client
        .call("big", json!({"bytes": 600_000, "line": 100_000}))
        .await;
    let cursor = next_after(&first);
    let answer = client
        .call(
            "mcp_budget_search",
            json!({"cursor": cursor, "pattern": "(x+)+y$"}),
        )
        .await;
    assert_ne!(answer["isError"], true, "{answer}");
    assert_eq!(answer["structuredContent"]["total_matches"], 0);
    assert_eq!(answer["structuredContent"]["total"], 6);
    let refusals = [
        (
            json!({"cursor": cursor, "pattern": "x".repeat(5000)}),
            "limit",
        ),
        (
            json!({"cursor": cursor, "pattern": "(\\w{100}){100}"}),
            "simpler pattern",
        ),
        (
            json!({"cursor": cursor, "path": format!("$.{}a{}", "[?(".repeat(40), ")]".repeat(40))}),
            "nests",
        ),
        (
            json!({"cursor": cursor, "path": "$.a"}),
            "is text, not JSON",
        ),
        (json!({"cursor": cursor}), "pattern"),
        (
            json!({"cursor": format!("{cursor}x"), "pattern": "x"}),
            "not a next_after",
        ),
        (
            json!({"cursor": "forged.token", "pattern": "x"}),
            "not a next_after",
        ),
    ];
    for (arguments, says) in refusals {
        let answer = client.call("mcp_budget_search", arguments.clone()).await;
        assert_eq!(answer["isError"], true, "{arguments}: {answer}");
        let text = answer["content"][0]["text"].as_str().unwrap();
        assert!(text.contains(says), "{arguments}: {text}");
    }
    // Another proxy (another principal, another key) cannot search this one's result.
    let other = Peer::proxy(&[], &[quirky.to_str().unwrap()]);
    let mut other = Client::over(other).await;
    let answer = other
        .call(
            "mcp_budget_search",
            json!({"cursor": cursor, "pattern": "x"}),
        )
        .await;
    assert_eq!(answer["isError"], true, "{answer}");
}

/// A path is bounded by what it does, not by its text: a union of 199 names over 20,000 items
/// selects 4 million nodes (the unit tests hold nested wildcards and descendants to the same
/// bound). It is refused, naming the bound and a narrower path, before that work is done, and
/// the proxy stays small (a 1,008-byte union took it to 970 MiB before the bound).
#[tokio::test]
async fn a_path_that_selects_millions_of_nodes_is_refused_and_memory_stays_small() {
    let quirky = example("quirky_server");
    let peer = Peer::proxy(&[], &[quirky.to_str().unwrap()]);
    let pid = peer.child.id().unwrap();
    let mut client = Client::over(peer).await;
    let first = client.call("rows", json!({"rows": 20_000})).await;
    let cursor = next_after(&first);
    let union = format!("$[*][{}]", vec!["'n'"; 199].join(","));
    for path in [union.clone(), union.replace("$[*]", "$[0:]")] {
        let answer = client
            .call("mcp_budget_search", json!({"cursor": cursor, "path": path}))
            .await;
        assert_eq!(answer["isError"], true, "{answer}");
        let text = answer["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("more than 200000 nodes"), "{text}");
        assert!(text.contains("$.items[*].id"), "a narrower path: {text}");
    }
    // The same result's narrow path still answers.
    let answer = client
        .call(
            "mcp_budget_search",
            json!({"cursor": cursor, "path": "$[?@.n == 7].label"}),
        )
        .await;
    assert_ne!(answer["isError"], true, "{answer}");
    assert_eq!(answer["structuredContent"]["total_matches"], 1, "{answer}");
    let peak = common::memory(pid, "VmHWM");
    assert!(peak < 128 << 20, "peak {} MiB", peak >> 20);
}

/// A path reads its document as a tree, whatever it selects: over a document of more than
/// 500,000 values it is refused before that tree is built (pointing to pattern, which reads
/// the items' own text), and the proxy stays small (a filter over 250,000 items took it to
/// 542 MiB before). A pattern over the same result still answers.
#[tokio::test]
async fn a_path_over_a_document_of_millions_of_values_is_refused_before_it_is_read() {
    let quirky = example("quirky_server");
    let peer = Peer::proxy(&[], &[quirky.to_str().unwrap()]);
    let pid = peer.child.id().unwrap();
    let mut client = Client::over(peer).await;
    let first = client.call("rows", json!({"rows": 200_000})).await;
    let cursor = next_after(&first);
    let answer = client
        .call(
            "mcp_budget_search",
            json!({"cursor": cursor, "path": "$[?@.n == 7].label"}),
        )
        .await;
    assert_eq!(answer["isError"], true, "{answer}");
    let text = answer["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("more than 500000 values"), "{text}");
    assert!(text.contains("search it with pattern"), "{text}");
    let peak = common::memory(pid, "VmHWM");
    assert!(peak < 256 << 20, "peak {} MiB", peak >> 20);
    let (matches, _, _) = client
        .search_all(json!({"cursor": cursor, "pattern": "\"n\":77777,"}))
        .await;
    assert_eq!(matches.len(), 1, "{matches:?}");
}

#[tokio::test]
async fn a_policy_can_turn_search_off() {
    let policy = temp("off.toml");
    std::fs::write(&policy, "[budget]\nsearch = false\n").unwrap();
    let quirky = example("quirky_server");
    let mut peer = Peer::proxy(
        &["--policy", policy.to_str().unwrap()],
        &[quirky.to_str().unwrap()],
    );
    handshake(&mut peer).await;
    let mut client = Client { peer, next_id: 10 };
    let listed = client.request("tools/list", json!({})).await;
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(!names.contains(&"mcp_budget_search"), "{names:?}");
    let first = client.call("journal", json!({"lines": 20000})).await;
    let notice = first["content"].as_array().unwrap().last().unwrap()["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(notice.contains("More remain"), "{notice}");
    assert!(!notice.contains("mcp_budget_search"), "{notice}");
    // The name is the server's business then: the call goes to it, and its answer comes back.
    let answer = client
        .request(
            "tools/call",
            json!({"name": "mcp_budget_search", "arguments": {"cursor": "x", "pattern": "y"}}),
        )
        .await;
    assert_eq!(
        answer["error"]["message"], "unknown tool mcp_budget_search",
        "{answer}"
    );
}
