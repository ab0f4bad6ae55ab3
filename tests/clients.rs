//! Budgets that fit the client, through the real binary: the same large result paged for
//! Claude Code, Codex, opencode and an unknown client, each page held to that client's profile;
//! `--client` and a policy's `[client."name"]` overriding detection; token budgets counted with
//! o200k; and the built-in policy picked from the server's `serverInfo.name`.

mod common;

use common::{Peer, example};
use serde_json::{Value, json};

struct Client {
    peer: Peer,
    next_id: u64,
}

impl Client {
    /// The proxy with `options` in front of `server`, initialized as `client`, tools listed.
    async fn start(options: &[&str], server: &str, client: &str) -> (Client, Value) {
        let server = example(server);
        let peer = Peer::proxy(options, &[server.to_str().unwrap()]);
        let mut c = Client { peer, next_id: 1 };
        c.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": client, "version": "1"}}),
        )
        .await;
        c.peer
            .send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .await;
        let tools = c.request("tools/list", json!({})).await["result"].clone();
        (c, tools)
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
        self.request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await["result"]
            .clone()
    }

    /// Follows the pages of `tool` from the first; returns every page's result.
    async fn chain(&mut self, tool: &str, arguments: Value) -> Vec<Value> {
        let mut pages = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut args = arguments.clone();
            if let Some(cursor) = &after {
                args["after"] = json!(cursor);
            }
            let result = self.call(tool, args).await;
            assert_ne!(result["isError"], true, "{result}");
            after = next_after(&result);
            pages.push(result);
            if after.is_none() {
                return pages;
            }
            assert!(pages.len() < 400, "the chain does not end");
        }
    }
}

/// The cursor a page's notice gives, if any.
fn next_after(result: &Value) -> Option<String> {
    let notice = notice(result)?;
    let start = notice.find("after:\"")? + "after:\"".len();
    let end = notice[start..].find('"')? + start;
    Some(notice[start..end].to_string())
}

/// A page's notice (its last block), if it has one.
fn notice(result: &Value) -> Option<&str> {
    let text = result["content"].as_array()?.last()?["text"].as_str()?;
    text.starts_with("mcp-budget paged").then_some(text)
}

/// The text of a page, but its notice block.
fn page_text(result: &Value) -> String {
    let blocks = result["content"].as_array().unwrap();
    let end = blocks.len() - usize::from(notice(result).is_some());
    blocks[..end]
        .iter()
        .map(|b| b["text"].as_str().unwrap())
        .collect()
}

/// The descriptor of `name` in a `tools/list` result.
fn descriptor(tools: &Value, name: &str) -> Value {
    tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {tools}"))
        .clone()
}

/// The text the model reads of a page (as the token budget counts it).
fn read_text(result: &Value) -> String {
    mcp_budget::tokens::result_text(result)
}

fn policy_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mcp-budget-clients-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The journal's whole text, `lines` lines (what the server returns).
fn journal(lines: usize) -> String {
    (1..=lines)
        .map(|i| format!("entry {i:06}: the journal line\n"))
        .collect()
}

/// Pages the same 450,000-byte text for `client` and checks each page against `max_bytes`:
/// every page under it, the pages filling it (not sized for a smaller budget), the text whole.
async fn paged_for(client: &str, options: &[&str], max_bytes: usize, budget_named: &str) {
    let (mut c, _) = Client::start(options, "quirky_server", client).await;
    let arguments = json!({"bytes": 450_000, "line": 100});
    let pages = c.chain("big", arguments).await;
    let sizes: Vec<usize> = pages.iter().map(|p| p.to_string().len()).collect();
    for (i, size) in sizes.iter().enumerate() {
        assert!(
            *size < max_bytes,
            "{client}: page {i} is {size} bytes, over {max_bytes}"
        );
    }
    let largest = sizes.iter().max().copied().unwrap_or(0);
    assert!(
        largest > max_bytes * 3 / 4,
        "{client}: the largest page is {largest} bytes, far under its {max_bytes}-byte budget"
    );
    let text: String = pages.iter().map(page_text).collect();
    assert_eq!(
        text.len(),
        450_000,
        "{client}: the pages are not the whole text ({} pages of {sizes:?} bytes)",
        pages.len()
    );
    let first = notice(&pages[0]).unwrap();
    assert!(
        first.contains(budget_named),
        "{client}: the notice does not name {budget_named:?}: {first}"
    );
}

#[tokio::test]
async fn each_client_gets_pages_sized_by_its_profile() {
    // Claude Code: under the 50,000-character spill threshold (and its 25,000 tokens).
    paged_for(
        "claude-code",
        &[],
        50_000,
        "over the 50000-byte budget for claude-code",
    )
    .await;
    // Codex: its 10,000-byte truncation.
    paged_for(
        "codex-mcp-client",
        &[],
        10_000,
        "over the 10000-byte budget for codex",
    )
    .await;
    // An unknown client: the policy's 200,000 bytes.
    paged_for("some-new-ide", &[], 200_000, "over the 200000-byte budget").await;
}

#[tokio::test]
async fn the_client_option_overrides_detection() {
    // The client says it is Claude Code; --client codex wins.
    paged_for(
        "claude-code",
        &["--client", "codex"],
        10_000,
        "10000-byte budget for codex",
    )
    .await;
    let out = common::run(["--client", "no-such-client", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "--client \"no-such-client\" matches no client profile; known: claude-code, codex"
        ),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_policy_section_overrides_a_builtin_profile_and_adds_one() {
    let policy = policy_file(
        "clients.toml",
        "[client.\"codex-mcp-client\"]\nmax_bytes = 6000\n\n[client.\"my-ide\"]\nmax_bytes = 30000\n",
    );
    let options = ["--policy", policy.to_str().unwrap()];
    paged_for(
        "codex-mcp-client",
        &options,
        6_000,
        "6000-byte budget for codex",
    )
    .await;
    paged_for("my-ide", &options, 30_000, "30000-byte budget for my-ide").await;
}

#[tokio::test]
async fn under_a_token_budget_every_page_stays_under_it_in_o200k() {
    // 5,000 journal lines: ~155 KB, ~45,000 tokens; the bytes would allow 200,000.
    let policy = policy_file(
        "tokens.toml",
        "[client.\"token-counter\"]\nmax_tokens = 3000\n",
    );
    let (mut c, _) = Client::start(
        &["--policy", policy.to_str().unwrap()],
        "quirky_server",
        "token-counter",
    )
    .await;
    let pages = c.chain("journal", json!({"lines": 5000})).await;
    let mut tokens = Vec::new();
    for page in &pages {
        let count = mcp_budget::tokens::count(&read_text(page)).unwrap();
        assert!(count <= 3000, "a page of {count} tokens");
        tokens.push(count);
    }
    // The pages are sized by the tokens, not far below them.
    assert!(
        tokens.iter().max().copied().unwrap_or(0) > 2000,
        "{tokens:?}"
    );
    let text: String = pages.iter().map(page_text).collect();
    assert!(text == journal(5000), "the pages are not the journal");
    let first = notice(&pages[0]).unwrap();
    assert!(first.contains("for token-counter"), "{first}");
}

#[tokio::test]
async fn under_a_line_budget_every_page_stays_under_it() {
    // opencode shows 2,000 lines: 5,000 lines (~155 KB, under its 51,200 bytes only in pages).
    let (mut c, _) = Client::start(&[], "quirky_server", "opencode").await;
    let pages = c.chain("journal", json!({"lines": 5000})).await;
    for page in &pages {
        let lines = read_text(page).lines().count();
        assert!(lines <= 2000, "a page of {lines} lines");
        assert!(page.to_string().len() < 51_200);
    }
    let text: String = pages.iter().map(page_text).collect();
    assert!(text == journal(5000), "the pages are not the journal");
}

#[tokio::test]
async fn a_rule_path_refusal_names_the_clients_budget_and_defaults_follow_the_profile() {
    // fleet-server has a built-in policy, picked with no --policy.
    let (mut c, tools) = Client::start(&[], "fleet_server", "github-copilot-developer").await;
    let show = descriptor(&tools, "fleet_show");
    assert_eq!(
        show["inputSchema"]["properties"]["limit"]["default"], 10,
        "copilot-cli's default item limit: {show}"
    );
    let result = c
        .call(
            "fleet_show",
            json!({"horizon": "all", "detail": "full", "limit": 100}),
        )
        .await;
    let text = result["content"][0]["text"].as_str().unwrap();
    assert_eq!(result["isError"], true, "{result}");
    assert!(
        text.starts_with("result-too-large: fleet_show response is ")
            && text.contains("bytes, exceeds the 10240-byte budget for copilot-cli — "),
        "{text}"
    );
    // The default page fits Copilot CLI (both halves count): the default limit is lowered,
    // and the page says so.
    let page = c.call("fleet_show", json!({})).await;
    assert_ne!(page["isError"], true, "{page}");
    assert!(page.to_string().len() < 10_240);
    let notices = page["structuredContent"]["notices"].to_string();
    assert!(
        notices.contains("the default limit, lowered from 10 to ")
            && notices.contains("so that the page fits the 10240-byte budget for copilot-cli"),
        "{notices}"
    );
    // Followed to the end, the pages hold every live stream once.
    let mut seen = Vec::new();
    let mut page = page;
    loop {
        for stream in page["structuredContent"]["streams"].as_array().unwrap() {
            seen.push(stream["stream_id"].as_str().unwrap().to_string());
        }
        let Some(after) = page["structuredContent"]["next_after"].as_str() else {
            break;
        };
        page = c.call("fleet_show", json!({"after": after})).await;
        assert!(page.to_string().len() < 10_240);
    }
    let total = page["structuredContent"]["total_count"].as_u64().unwrap();
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "a stream was shown twice");
    assert!(
        seen.len() > 10 && seen.len() as u64 <= total,
        "{} of {total}",
        seen.len()
    );
}

#[tokio::test]
async fn with_no_policy_the_servers_builtin_policy_is_picked_and_none_turns_it_off() {
    let has_detail = |tools: &Value| {
        tools["tools"].as_array().unwrap().iter().any(|t| {
            t["name"] == "fleet_show" && t["inputSchema"]["properties"]["detail"].is_object()
        })
    };
    let (_, tools) = Client::start(&[], "fleet_server", "raw-test").await;
    assert!(has_detail(&tools), "builtin:fleet was not picked: {tools}");
    let (_, tools) = Client::start(&["--policy", "none"], "fleet_server", "raw-test").await;
    assert!(!has_detail(&tools), "--policy none still applied a policy");
    // A server without a built-in policy: every tool is paged automatically (`after` added).
    let (_, tools) = Client::start(&[], "quirky_server", "raw-test").await;
    let big = descriptor(&tools, "big");
    assert!(
        big["inputSchema"]["properties"]["after"].is_object(),
        "{big}"
    );
}

/// The JSON-RPC answer in a POST's response body (JSON, or an SSE stream).
fn answer(body: &str) -> Value {
    if let Ok(value) = serde_json::from_str::<Value>(body) {
        return value;
    }
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(|message| message.get("id").is_some())
        .unwrap_or_else(|| panic!("no answer in {body}"))
}

#[tokio::test]
async fn over_http_each_session_is_fitted_to_its_own_client() {
    let quirky = example("quirky_server");
    let (_listener, url) = common::listen(&["--", quirky.to_str().unwrap()], &[]).await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let mut sessions = Vec::new();
    for client in ["codex-mcp-client", "claude-code", "another-ide"] {
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": client, "version": "1"}}});
        let response = common::mcp_post(&http, &url, None, &init.to_string())
            .send()
            .await
            .unwrap();
        let session = response.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_string();
        let _ = response.text().await;
        common::mcp_post(&http, &url, Some(&session), common::INITIALIZED)
            .send()
            .await
            .unwrap();
        sessions.push((client, session));
    }
    // The sessions interleave: each call is answered under its own session's budget.
    for (client, max) in [
        ("codex-mcp-client", 10_000),
        ("claude-code", 50_000),
        ("another-ide", 200_000),
    ] {
        let session = &sessions.iter().find(|(c, _)| *c == client).unwrap().1;
        let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "big", "arguments": {"bytes": 450_000, "line": 100}}});
        let body = common::mcp_post(&http, &url, Some(session), &call.to_string())
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let result = answer(&body)["result"].clone();
        let size = result.to_string().len();
        assert!(
            size < max && size > max * 3 / 4,
            "{client}: a first page of {size} bytes for a {max}-byte budget"
        );
    }
}

#[tokio::test]
async fn claude_code_gets_the_declared_allowance_and_its_token_budget_on_budgeted_tools() {
    // fleet_show has a rule (builtin:fleet), so the proxy declares maxResultSizeChars = 200000
    // on it and Claude Code's 50,000-character spill threshold does not apply; its 25,000
    // tokens do.
    let (mut c, tools) = Client::start(&[], "fleet_server", "claude-code").await;
    let show = descriptor(&tools, "fleet_show");
    assert_eq!(show["_meta"]["anthropic/maxResultSizeChars"], 200_000);
    let page = c
        .call("fleet_show", json!({"horizon": "all", "limit": 100}))
        .await;
    assert_ne!(page["isError"], true, "{page}");
    let size = page.to_string().len();
    assert!(size > 50_000, "{size} bytes: the allowance was not used");
    let tokens = mcp_budget::tokens::count(&read_text(&page)).unwrap();
    assert!(tokens <= 25_000, "{tokens} tokens");
    let refused = c
        .call("fleet_show", json!({"detail": "full", "limit": 40}))
        .await;
    let text = refused["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("tokens (o200k), exceeds the 25000-token budget for claude-code — "),
        "{text}"
    );
}

#[test]
fn explain_shows_what_a_client_gets() {
    let fleet = example("fleet_server");
    let out = common::run_ok([
        "explain",
        "builtin:fleet",
        "--tool",
        "fleet_show",
        "--client",
        "codex",
        "--",
        fleet.to_str().unwrap(),
    ]);
    let (descriptor, pages) = out.split_once("\n\n").unwrap();
    let descriptor: Value = serde_json::from_str(descriptor).unwrap();
    assert_eq!(
        descriptor["inputSchema"]["properties"]["limit"]["default"],
        10
    );
    assert!(
        pages.starts_with(
            "client codex (clientInfo.name \"codex-mcp-client\"): source: openai/codex"
        ) && pages.contains("result cap: 10000 bytes")
            && pages.contains("default limit 10"),
        "{pages}"
    );
}
