//! Result references through the real binary: a page of a big result names it
//! (`result_ref:"…"`), and a call that passes the reference as an argument's whole value gets
//! the result in its place before it goes upstream (quirky's `sink` tells what it received).
//! Every reference the proxy cannot open for certain is refused with a clear error, and the
//! server never sees that call.

mod common;

use common::{Peer, example, handshake, last_message};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

struct Client {
    peer: Peer,
    next_id: u64,
}

impl Client {
    async fn over(mut peer: Peer) -> Client {
        handshake(&mut peer).await;
        let mut client = Client { peer, next_id: 10 };
        client.request("tools/list", json!({})).await;
        client
    }

    /// The proxy with `options` in front of quirky.
    async fn proxy(options: &[&str]) -> Client {
        let quirky = example("quirky_server");
        Client::over(Peer::proxy(options, &[quirky.to_str().unwrap()])).await
    }

    /// Sends `message` (a request with id `id`, or a batch) and returns the answer with that id,
    /// with the size of the line it came on.
    async fn exchange(&mut self, message: &Value, id: u64) -> (Value, usize) {
        self.exchange_line(&message.to_string(), id).await
    }

    /// [`Client::exchange`] of a line written as it is.
    async fn exchange_line(&mut self, line: &str, id: u64) -> (Value, usize) {
        self.peer.send(line).await;
        loop {
            let line = self.peer.recv().await;
            let answer: Value = serde_json::from_str(&line).unwrap();
            let answer = match answer {
                Value::Array(answers) => answers.into_iter().find(|a| a["id"] == id),
                answer => Some(answer),
            };
            if let Some(answer) = answer.filter(|a| a["id"] == id) {
                return (answer, line.len());
            }
        }
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let request =
            json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        self.exchange(&request, self.next_id).await.0
    }

    /// A call's result, and the bytes of the line it came on.
    async fn call_sized(&mut self, tool: &str, arguments: Value) -> (Value, usize) {
        self.next_id += 1;
        let request = json!({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}});
        let (answer, bytes) = self.exchange(&request, self.next_id).await;
        assert!(answer.get("error").is_none(), "{answer}");
        (answer["result"].clone(), bytes)
    }

    async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        self.call_sized(tool, arguments).await.0
    }

    /// How many times quirky ran `tool`.
    async fn runs(&mut self, tool: &str) -> u64 {
        let runs = self.call("executions", json!({})).await;
        runs["structuredContent"][tool].as_u64().unwrap_or(0)
    }
}

/// The reference a page names in its notice.
fn reference_of(result: &Value) -> String {
    let text = result.to_string();
    let at = text
        .find("result_ref:\\\"")
        .unwrap_or_else(|| panic!("no result_ref in {text:.2000}"));
    let rest = &text[at + "result_ref:\\\"".len()..];
    rest[..rest.find("\\\"").unwrap()].to_string()
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The text of a result (its text blocks, joined).
fn text_of(result: &Value) -> String {
    result["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect()
}

/// quirky's own answer to a call, directly (no proxy).
async fn direct(tool: &str, arguments: Value) -> Value {
    let mut client = Client::over(Peer::quirky()).await;
    client.call(tool, arguments).await
}

/// A refused call: its error text; and the server never ran `sink`.
async fn refused(client: &mut Client, arguments: Value) -> String {
    refused_after_runs(client, arguments, 0).await
}

#[tokio::test]
async fn a_big_text_is_passed_to_another_tool_by_its_reference() {
    let mut client = Client::proxy(&["--policy", "none", "--client", "claude-code"]).await;
    let arguments = json!({"bytes": 300_000, "line": 97});
    let (page, page_bytes) = client.call_sized("big", arguments.clone()).await;
    let reference = reference_of(&page);
    assert!(reference.starts_with("mcpb-ref."), "{reference}");
    let (sunk, sunk_bytes) = client
        .call_sized("sink", json!({"content": reference}))
        .await;
    assert_ne!(sunk["isError"], true, "{sunk}");
    let whole = text_of(&direct("big", arguments).await);
    assert!(whole.len() >= 299_000);
    let got = &sunk["structuredContent"]["content"];
    assert_eq!(got["string_bytes"], whole.len(), "{got}");
    assert_eq!(got["string_sha256"], sha256(whole.as_bytes()));
    // The model read one page and a short answer: the result itself never passed through it.
    assert!(
        page_bytes + sunk_bytes < 64 * 1024,
        "{page_bytes} + {sunk_bytes}"
    );
    assert_eq!(client.runs("big").await, 1);
    assert_eq!(client.runs("sink").await, 1);
    // The same reference, deep in the arguments (where it is the whole value of a string).
    let nested = json!({"item": {"a": [[{"b": [reference]}]]}});
    let sunk = client.call("sink", nested).await;
    let raw = sunk["structuredContent"]["item"]["raw_bytes"]
        .as_u64()
        .unwrap();
    assert!(raw > whole.len() as u64, "{sunk}");
    // Inside a longer string it is text, passed as written.
    let sunk = client
        .call("sink", json!({"content": format!("see {reference}")}))
        .await;
    assert_eq!(
        sunk["structuredContent"]["content"]["string_bytes"],
        reference.len() + 4
    );
}

#[tokio::test]
async fn one_item_of_a_paged_json_list_is_passed_on_byte_for_byte() {
    let mut client = Client::proxy(&["--policy", "none", "--client", "claude-code"]).await;
    let arguments = json!({"rows": 20_000});
    let page = client.call("rows", arguments.clone()).await;
    let reference = reference_of(&page);
    let sunk = client
        .call("sink", json!({"item": format!("{reference}#/17")}))
        .await;
    let whole = text_of(&direct("rows", arguments).await);
    let items: Vec<&serde_json::value::RawValue> = serde_json::from_str(&whole).unwrap();
    let item = items[17].get();
    let got = &sunk["structuredContent"]["item"];
    assert_eq!(
        got["raw_sha256"],
        sha256(item.as_bytes()),
        "{got} for {item}"
    );
    // The whole list, as JSON (an argument not declared a string takes the value).
    let sunk = client.call("sink", json!({"item": reference})).await;
    let got = &sunk["structuredContent"]["item"];
    assert_eq!(got["raw_sha256"], sha256(whole.as_bytes()), "{got}");
    // A pointer that names nothing is refused, and says what is there.
    let text = refused_after_runs(
        &mut client,
        json!({"item": format!("{reference}#/20000")}),
        2,
    )
    .await;
    assert!(
        text.contains("names nothing") && text.contains("20000 items"),
        "{text}"
    );
}

/// A refused call, when `sink` ran `runs` times before: its error text.
async fn refused_after_runs(client: &mut Client, arguments: Value, runs: u64) -> String {
    let result = client.call("sink", arguments).await;
    assert_eq!(result["isError"], true, "{result}");
    assert_eq!(client.runs("sink").await, runs, "the server saw the call");
    result["content"][0]["text"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn an_altered_cut_deep_or_batched_reference_is_refused_and_never_sent() {
    let mut client = Client::proxy(&["--policy", "none", "--client", "claude-code"]).await;
    let page = client
        .call("big", json!({"bytes": 100_000, "line": 50}))
        .await;
    let reference = reference_of(&page);
    // One character changed.
    let at = reference.len() - 5;
    let swapped = if &reference[at..=at] == "A" { "B" } else { "A" };
    let altered = format!("{}{swapped}{}", &reference[..at], &reference[at + 1..]);
    let text = refused(&mut client, json!({"content": altered})).await;
    assert!(text.contains("not issued by this proxy"), "{text}");
    // Cut.
    let text = refused(&mut client, json!({"content": &reference[..40]})).await;
    assert!(text.contains("not issued by this proxy"), "{text}");
    // Nested past the depth references are replaced at.
    let mut deep = json!(reference);
    for _ in 0..40 {
        deep = json!([deep]);
    }
    let text = refused(&mut client, json!({"item": deep})).await;
    assert!(text.contains("deeper than 32 levels"), "{text}");
    // In a batch: that call is refused, the rest is served.
    let batch = json!([
        {"jsonrpc": "2.0", "id": 900, "method": "tools/call",
         "params": {"name": "sink", "arguments": {"content": reference}}},
        {"jsonrpc": "2.0", "id": 901, "method": "ping"},
    ]);
    let (answer, _) = client.exchange(&batch, 900).await;
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let text = answer["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("not inside a JSON-RPC batch"), "{text}");
    assert_eq!(client.runs("sink").await, 0);
}

#[tokio::test]
async fn a_reference_whose_result_left_the_cache_is_refused() {
    let policy = std::env::temp_dir().join(format!("refs-cache-{}.toml", std::process::id()));
    std::fs::write(&policy, "[budget]\nauto = true\ncache_bytes = 700000\n").unwrap();
    let mut client = Client::proxy(&[
        "--policy",
        policy.to_str().unwrap(),
        "--client",
        "claude-code",
    ])
    .await;
    let first = client
        .call("big", json!({"bytes": 300_000, "line": 60}))
        .await;
    let reference = reference_of(&first);
    // Another result pushes it out of the cache (least recently used first).
    client
        .call("big", json!({"bytes": 500_000, "line": 61}))
        .await;
    let text = refused(&mut client, json!({"content": reference})).await;
    assert!(text.contains("no longer in mcp-budget's cache"), "{text}");
}

#[tokio::test]
async fn a_call_that_would_grow_past_the_message_limit_is_refused() {
    let mut client = Client::proxy(&[
        "--policy",
        "none",
        "--client",
        "claude-code",
        "--max-message-bytes",
        "250000",
    ])
    .await;
    let page = client
        .call("big", json!({"bytes": 150_000, "line": 70}))
        .await;
    let reference = reference_of(&page);
    // Once fits; twice would be 300 KB.
    let once = client.call("sink", json!({"content": reference})).await;
    assert_ne!(once["isError"], true, "{once}");
    let text = refused_after_runs(
        &mut client,
        json!({"content": reference, "item": reference}),
        1,
    )
    .await;
    assert!(text.contains("--max-message-bytes"), "{text}");
}

#[tokio::test]
async fn a_denied_tool_or_one_without_references_never_receives_one() {
    let policy = std::env::temp_dir().join(format!("refs-deny-{}.toml", std::process::id()));
    std::fs::write(&policy, "[tools]\ndeny = [\"sink\"]\n").unwrap();
    let mut client = Client::proxy(&[
        "--policy",
        policy.to_str().unwrap(),
        "--client",
        "claude-code",
    ])
    .await;
    let page = client
        .call("big", json!({"bytes": 100_000, "line": 50}))
        .await;
    let reference = reference_of(&page);
    let text = refused(&mut client, json!({"content": reference})).await;
    assert!(text.contains("policy hides it"), "{text}");

    let policy = std::env::temp_dir().join(format!("refs-off-{}.toml", std::process::id()));
    std::fs::write(&policy, "[tools]\nno_references = [\"si*\"]\n").unwrap();
    let mut client = Client::proxy(&[
        "--policy",
        policy.to_str().unwrap(),
        "--client",
        "claude-code",
    ])
    .await;
    let page = client
        .call("big", json!({"bytes": 100_000, "line": 50}))
        .await;
    let reference = reference_of(&page);
    let text = refused(&mut client, json!({"content": reference})).await;
    assert!(text.contains("does not take result references"), "{text}");

    // Off everywhere: pages name no reference.
    let policy = std::env::temp_dir().join(format!("refs-none-{}.toml", std::process::id()));
    std::fs::write(&policy, "[budget]\nreferences = false\n").unwrap();
    let mut client = Client::proxy(&[
        "--policy",
        policy.to_str().unwrap(),
        "--client",
        "claude-code",
    ])
    .await;
    let page = client
        .call("big", json!({"bytes": 100_000, "line": 50}))
        .await;
    assert!(!page.to_string().contains("result_ref"), "{page:.3000}");
}

const MODERN: &str = "2026-07-28";

#[tokio::test]
async fn over_http_a_reference_is_its_principals_alone() {
    let (_proxy, url) = common::two_principals_with(&["--server-era", "modern"]).await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "claude-code", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let call = |token: &'static str, id: u64, tool: &'static str, arguments: Value| {
        let params = json!({"name": tool, "arguments": arguments, "_meta": meta.clone()});
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
        let request = http
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", MODERN)
            .header("mcp-method", "tools/call")
            .header("mcp-name", tool)
            .header("authorization", format!("Bearer {token}"))
            .body(body.to_string());
        async move {
            let text = request.send().await.unwrap().text().await.unwrap();
            last_message(&text)
        }
    };
    let page = call("a-secret", 1, "big", json!({"bytes": 300_000, "line": 90})).await;
    let reference = reference_of(&page["result"]);
    let other = call("b-secret", 2, "sink", json!({"content": reference})).await;
    assert_eq!(other["result"]["isError"], true, "{other}");
    let text = other["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("belongs to another client"), "{text}");
    let own = call("a-secret", 3, "sink", json!({"content": reference})).await;
    assert_ne!(own["result"]["isError"], true, "{own}");
    let whole = text_of(&direct("big", json!({"bytes": 300_000, "line": 90})).await);
    let got = &own["result"]["structuredContent"]["content"];
    assert_eq!(got["string_sha256"], sha256(whole.as_bytes()), "{got}");
    let runs = call("a-secret", 4, "executions", json!({})).await;
    assert_eq!(runs["result"]["structuredContent"]["sink"], 1, "{runs}");
}

#[tokio::test]
async fn an_items_rules_pages_name_the_whole_result_too() {
    let policy = std::env::temp_dir().join(format!("refs-items-{}.toml", std::process::id()));
    std::fs::write(
        &policy,
        "[[tool]]\nname = \"rows\"\nitems = \"$\"\nkey = \"n\"\n[tool.limit]\ndefault = 25\nmax = 100\n",
    )
    .unwrap();
    let mut client = Client::proxy(&["--policy", policy.to_str().unwrap()]).await;
    let arguments = json!({"rows": 2_000});
    let first = client.call("rows", arguments.clone()).await;
    let reference = reference_of(&first);
    let sunk = client
        .call("sink", json!({"item": format!("{reference}#/1500")}))
        .await;
    let whole = text_of(&direct("rows", arguments).await);
    let items: Vec<&serde_json::value::RawValue> = serde_json::from_str(&whole).unwrap();
    let got = &sunk["structuredContent"]["item"];
    assert_eq!(
        got["raw_sha256"],
        sha256(items[1500].get().as_bytes()),
        "{got}"
    );
    assert_eq!(client.runs("rows").await, 1);
}

#[tokio::test]
async fn a_tasks_paged_result_names_the_whole_result() {
    let mut client = Client::proxy(&["--policy", "none", "--client", "claude-code"]).await;
    let params = json!({"name": "journal", "arguments": {"lines": 33_000}, "task": {"ttl": 60000}});
    let created = client.request("tools/call", params).await;
    let task = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap()
        .to_string();
    let answer = client
        .request("tasks/result", json!({"taskId": task}))
        .await;
    let reference = reference_of(&answer["result"]);
    let sunk = client.call("sink", json!({"content": reference})).await;
    let whole = text_of(&direct("journal", json!({"lines": 33_000})).await);
    let got = &sunk["structuredContent"]["content"];
    assert_eq!(got["string_sha256"], sha256(whole.as_bytes()), "{got}");
}

#[tokio::test]
async fn a_recording_keeps_what_went_upstream_and_the_report_counts_what_a_reference_kept_out() {
    let dir = std::env::temp_dir().join(format!("refs-record-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let recording = dir.join("copy.jsonl");
    let quirky = example("quirky_server");
    let peer = Peer::spawn(
        common::proxy_bin(),
        &[
            "record",
            "--out",
            recording.to_str().unwrap(),
            "--policy",
            "none",
            "--client",
            "claude-code",
            "--",
            quirky.to_str().unwrap(),
        ],
    );
    let mut client = Client::over(peer).await;
    let page = client
        .call("big", json!({"bytes": 300_000, "line": 97}))
        .await;
    let reference = reference_of(&page);
    let sunk = client.call("sink", json!({"content": reference})).await;
    assert_ne!(sunk["isError"], true, "{sunk}");
    client.peer.close_stdin();
    client.peer.wait().await;
    // The client's own line, and the call as it went upstream.
    let text = std::fs::read_to_string(&recording).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("\"c2s\"") && l.contains("\"sink\""))
        .unwrap();
    let entry: Value = serde_json::from_str(line).unwrap();
    assert_eq!(entry["msg"]["params"]["arguments"]["content"], reference);
    let forwarded = entry["forwarded"]["params"]["arguments"]["content"]
        .as_str()
        .unwrap();
    assert_eq!(forwarded.len(), 300_000 / 97 * 97);
    let json = common::run_ok(["report".as_ref(), "--json".as_ref(), recording.as_os_str()]);
    let report: Value = serde_json::from_str(&json).unwrap();
    let kept = report["reference_bytes"].as_u64().unwrap();
    assert!(kept > 290_000, "{kept}");
    assert_eq!(report["reference_calls"], 1);
    let table = common::run_ok(["report".as_ref(), recording.as_os_str()]);
    assert!(table.contains("result references kept"), "{table}");
}

#[tokio::test]
async fn a_search_by_call_runs_the_tool_once_and_answers_only_the_matches() {
    let mut client = Client::proxy(&["--policy", "none", "--client", "claude-code"]).await;
    let arguments = json!({"rows": 20_000});
    let whole = direct("rows", arguments.clone()).await;
    assert!(whole.to_string().len() > 3_000_000);
    let search = json!({"tool": "rows", "arguments": arguments, "path": "$[?(@.n < 12)].label"});
    let (answer, bytes) = client.call_sized("mcp_budget_search", search.clone()).await;
    assert_ne!(answer["isError"], true, "{answer}");
    let found = &answer["structuredContent"];
    let labels: Vec<&Value> = found["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["value"])
        .collect();
    let expected: Vec<&Value> = whole["structuredContent"].as_array().unwrap()[..12]
        .iter()
        .map(|row| &row["label"])
        .collect();
    assert_eq!(labels, expected);
    assert!(bytes < 4096, "the client received {bytes} bytes");
    assert_eq!(client.runs("rows").await, 1);
    // Again, with a pattern: the kept result answers, the tool does not run.
    let again =
        json!({"tool": "rows", "arguments": {"rows": 20_000}, "pattern": "row 01999[0-9] "});
    let answer = client.call("mcp_budget_search", again).await;
    assert_eq!(
        answer["structuredContent"]["total_matches"], 10,
        "{answer:.2000}"
    );
    assert_eq!(client.runs("rows").await, 1);
    // The answer names the chain's cursor (the tool's pages follow from the kept result) and
    // the whole result's reference.
    let cursor = found["cursor"].as_str().unwrap();
    let page = client
        .call("rows", json!({"rows": 20_000, "after": cursor}))
        .await;
    assert_ne!(page["isError"], true, "{page:.500}");
    assert_eq!(client.runs("rows").await, 1);
    let reference = found["result_ref"].as_str().unwrap();
    let sunk = client
        .call("sink", json!({"item": format!("{reference}#/3")}))
        .await;
    let text = text_of(&whole);
    let items: Vec<&serde_json::value::RawValue> = serde_json::from_str(&text).unwrap();
    let got = &sunk["structuredContent"]["item"];
    assert_eq!(
        got["raw_sha256"],
        sha256(items[3].get().as_bytes()),
        "{got}"
    );
}

#[tokio::test]
async fn a_search_by_call_keeps_the_policys_rules() {
    let policy = std::env::temp_dir().join(format!("refs-search-{}.toml", std::process::id()));
    std::fs::write(&policy, "[tools]\ndeny = [\"rows\"]\n").unwrap();
    let mut client = Client::proxy(&["--policy", policy.to_str().unwrap()]).await;
    let search = json!({"tool": "rows", "arguments": {"rows": 100}, "pattern": "row"});
    let answer = client.call("mcp_budget_search", search).await;
    assert_eq!(answer["isError"], true, "{answer}");
    let text = answer["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("policy hides it"), "{text}");
    assert_eq!(client.runs("rows").await, 0);
    let both = json!({"tool": "big", "cursor": "x", "pattern": "x"});
    let answer = client.call("mcp_budget_search", both).await;
    assert_eq!(answer["isError"], true, "{answer}");
}

#[tokio::test]
async fn a_reference_spelled_with_an_escape_is_one_reference_to_every_reader() {
    let mut client = Client::proxy(&["--policy", "none", "--client", "claude-code"]).await;
    let arguments = json!({"bytes": 120_000, "line": 60});
    let page = client.call("big", arguments.clone()).await;
    let reference = reference_of(&page);
    let escaped = format!(r#"\u006d{}"#, &reference[1..]);
    // Written by hand: the escape is in the line the proxy reads.
    client.next_id += 1;
    let line = format!(
        r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":"sink","arguments":{{"content":"{escaped}"}}}}}}"#,
        client.next_id
    );
    let (answer, _) = client.exchange_line(&line, client.next_id).await;
    let whole = text_of(&direct("big", arguments).await);
    let got = &answer["result"]["structuredContent"]["content"];
    assert_eq!(
        got["string_sha256"],
        sha256(whole.as_bytes()),
        "{answer:.500}"
    );
    // In a batch, the escaped spelling is refused as the plain one is.
    let batch = format!(
        r#"[{{"jsonrpc":"2.0","id":950,"method":"tools/call","params":{{"name":"sink","arguments":{{"content":"{escaped}"}}}}}},{{"jsonrpc":"2.0","id":951,"method":"ping"}}]"#
    );
    let (refused, _) = client.exchange_line(&batch, 950).await;
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert_eq!(client.runs("sink").await, 1);
}

/// A 2026-07-28 `tools/call` at `url`; its `Mcp-Name` is the body's.
async fn modern_call(
    http: &reqwest::Client,
    url: &str,
    id: u64,
    tool: &str,
    arguments: Value,
) -> Value {
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "claude-code", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let params = json!({"name": tool, "arguments": arguments, "_meta": meta});
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
    let text = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", MODERN)
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    last_message(&text)
}

#[tokio::test]
async fn a_modern_search_by_call_names_the_tool_it_runs_to_an_http_upstream() {
    // The upstream is another proxy over HTTP, which checks Mcp-Name against the body: the
    // search's call goes there as the call of `rows`, and must be named so.
    let quirky = example("quirky_server");
    let (_inner, inner_url) = common::listen(
        &[
            "--policy",
            "none",
            "--server-era",
            "modern",
            "--",
            quirky.to_str().unwrap(),
        ],
        &[],
    )
    .await;
    let outer = [
        "--policy",
        "none",
        "--server-era",
        "modern",
        "--upstream",
        &inner_url,
    ];
    let (_outer, url) = common::listen(&outer, &[]).await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let search =
        json!({"tool": "rows", "arguments": {"rows": 2_000}, "pattern": "row 00000[0-4] "});
    let answer = modern_call(&http, &url, 1, "mcp_budget_search", search).await;
    assert_ne!(answer["result"]["isError"], true, "{answer:.800}");
    assert_eq!(
        answer["result"]["structuredContent"]["total_matches"], 5,
        "{answer:.800}"
    );
    assert_eq!(answer["result"]["resultType"], "complete", "{answer:.300}");
    // And a reference of the result passes on through both proxies.
    let reference = answer["result"]["structuredContent"]["result_ref"]
        .as_str()
        .unwrap()
        .to_string();
    let sunk = modern_call(
        &http,
        &url,
        2,
        "sink",
        json!({"item": format!("{reference}#/4")}),
    )
    .await;
    let item = sunk["result"]["structuredContent"]["item"]["raw_bytes"].as_u64();
    assert!(item.unwrap_or(0) > 20, "{sunk:.800}");
}
