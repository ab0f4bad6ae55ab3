//! The era bridge, through the real binary: a modern (2026-07-28) client in front of a legacy
//! server (the quirky server, which knows only `initialize`), and a legacy client in front of a
//! modern-only server (`examples/modern_server.rs`), on stdio and through `--listen`. Each
//! pairing fails directly (the spec's compatibility matrix says so; the tests show it), and
//! works through the proxy: list, call, automatic paging that follows `after`, each side's era
//! in what it reads.

mod common;

use common::{Peer, example, last_message};
use serde_json::{Value, json};

const MODERN: &str = "2026-07-28";

fn meta(client: &str) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}, "sampling": {}},
        "io.modelcontextprotocol/clientInfo": {"name": client, "version": "1"},
    })
}

/// A line-speaking client of one era over a child's stdio (the proxy, or a server directly).
struct Client {
    peer: Peer,
    next: u64,
    modern: bool,
    /// Messages that came for no request (notifications), in order.
    notes: Vec<Value>,
}

impl Client {
    fn over(peer: Peer, modern: bool) -> Client {
        Client {
            peer,
            next: 0,
            modern,
            notes: Vec::new(),
        }
    }

    async fn request(&mut self, method: &str, mut params: Value) -> Value {
        self.next += 1;
        if self.modern {
            let own = params["_meta"].take();
            params["_meta"] = meta("bridge-test");
            if let Value::Object(extra) = own {
                for (key, value) in extra {
                    params["_meta"][key] = value;
                }
            }
        }
        let request =
            json!({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params});
        self.peer.send(&request.to_string()).await;
        loop {
            let message = self.peer.recv_json().await;
            if message["id"] == self.next {
                return message;
            }
            self.notes.push(message);
        }
    }

    async fn initialize(&mut self, version: &str) -> Value {
        let params = json!({"protocolVersion": version, "capabilities": {"roots": {}},
            "clientInfo": {"name": "codex", "version": "0.9"}});
        let answer = self.request("initialize", params).await;
        self.peer.send(common::INITIALIZED).await;
        answer
    }
}

fn proxy(server: &str, env: &[(&str, &str)]) -> Peer {
    let mut command = tokio::process::Command::new(common::proxy_bin());
    command
        .args(["--policy", "none", "--"])
        .arg(example(server));
    for (key, value) in env {
        command.env(key, value);
    }
    Peer::from_command(command)
}

/// Every page of a tool's answer, following `after` on the tool.
async fn pages(client: &mut Client, tool: &str, arguments: Value) -> Vec<Value> {
    let first = client
        .request("tools/call", json!({"name": tool, "arguments": arguments}))
        .await;
    let mut pages = vec![first["result"].clone()];
    while let Some(after) = common::continuation(pages.last().unwrap()) {
        let mut args = arguments.clone();
        args["after"] = json!(after);
        let answer = client
            .request("tools/call", json!({"name": tool, "arguments": args}))
            .await;
        assert!(answer["result"].is_object(), "{answer:.300}");
        pages.push(answer["result"].clone());
        assert!(pages.len() < 200);
    }
    pages
}

fn rows_of(pages: &[Value]) -> Vec<Value> {
    pages
        .iter()
        .flat_map(|p| {
            p["structuredContent"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}

#[tokio::test]
async fn a_modern_client_with_a_legacy_server_fails_directly() {
    let mut direct = Client::over(Peer::quirky(), true);
    let answer = direct.request("server/discover", json!({})).await;
    assert_eq!(answer["error"]["code"], -32601, "{answer}");
}

#[tokio::test]
async fn a_modern_clients_first_requests_cannot_be_mistaken_for_the_proxys_own() {
    // The first modern request is spelled like the proxy's own probe, and the next is a
    // method 2026-07-28 removed: each gets its own answer, nothing hangs.
    let mut peer = proxy("quirky_server", &[]);
    let mut params = json!({});
    params["_meta"] = meta("bridge-test");
    let first = json!({"jsonrpc": "2.0", "id": "mcp-budget-discover-1", "method": "tools/list", "params": params});
    peer.send(&first.to_string()).await;
    let ping = json!({"jsonrpc": "2.0", "id": "p", "method": "ping", "params": params});
    peer.send(&ping.to_string()).await;
    let mut answers = std::collections::HashMap::new();
    while answers.len() < 2 {
        let message = peer.recv_json().await;
        if let Some(id) = message["id"].as_str() {
            answers.insert(id.to_string(), message);
        }
    }
    let list = &answers["mcp-budget-discover-1"];
    assert!(list["result"]["tools"].is_array(), "{list:.300}");
    assert_eq!(list["result"]["resultType"], "complete");
    assert_eq!(answers["p"]["error"]["code"], -32601, "{}", answers["p"]);
}

#[tokio::test]
async fn a_modern_client_is_served_by_a_legacy_server_through_the_proxy() {
    let mut client = Client::over(proxy("quirky_server", &[]), true);
    // server/discover, answered from the legacy server's InitializeResult.
    let discover = client.request("server/discover", json!({})).await;
    let result = &discover["result"];
    assert_eq!(result["resultType"], "complete", "{discover}");
    assert_eq!(result["supportedVersions"], json!([MODERN]));
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "quirky"
    );
    assert_eq!(result["capabilities"]["tools"]["listChanged"], true);
    // A list, modern: resultType and the caching fields.
    let list = client.request("tools/list", json!({})).await;
    assert_eq!(list["result"]["resultType"], "complete", "{list:.300}");
    assert_eq!(list["result"]["cacheScope"], "private");
    assert!(list["result"]["ttlMs"].is_number());
    assert!(list["result"]["tools"].as_array().unwrap().len() > 3);
    // A call, paged automatically; `after` on the tool reassembles it, every page modern.
    let pages = pages(&mut client, "rows", json!({"rows": 3000})).await;
    assert!(pages.len() > 2, "paged: {} pages", pages.len());
    for page in &pages {
        assert_eq!(page["resultType"], "complete", "{page:.200}");
    }
    let rows = rows_of(&pages);
    assert_eq!(rows.len(), 3000);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row["n"], i);
    }
    // The legacy server's logs reach no modern request that did not ask for them.
    assert!(
        client
            .notes
            .iter()
            .all(|n| n["method"] != "notifications/message"),
        "{:?}",
        client.notes
    );
    // Asked for: they come, at or above the level asked.
    let params = json!({"name": "flood", "arguments": {"count": 2, "bytes": 10},
        "_meta": {"io.modelcontextprotocol/logLevel": "info"}});
    let answer = client.request("tools/call", params).await;
    assert!(answer["result"].is_object(), "{answer:.300}");
    let logs = client
        .notes
        .iter()
        .filter(|n| n["method"] == "notifications/message")
        .count();
    assert_eq!(logs, 2, "{:?}", client.notes);
    // A legacy server's error passes as it wrote it.
    let answer = client.request("x/nothing", json!({})).await;
    assert_eq!(answer["error"]["code"], -32601, "{answer}");
}

/// The quirky server's `report` asks its client for sampling mid-call (a legacy server
/// request): through the proxy, a modern client gets `input_required` for it.
async fn report_asks(client: &mut Client) -> Value {
    let answer = client
        .request(
            "tools/call",
            json!({"name": "report", "arguments": {"quarter": "Q3"}}),
        )
        .await;
    let result = &answer["result"];
    assert_eq!(result["resultType"], "input_required", "{answer}");
    result.clone()
}

fn sampled() -> Value {
    json!({"role": "assistant", "content": {"type": "text", "text": "Q3 was fine"},
        "model": "test-model", "stopReason": "endTurn"})
}

#[tokio::test]
async fn a_legacy_servers_request_reaches_a_modern_client_as_input_required() {
    let mut client = Client::over(proxy("quirky_server", &[]), true);
    let asked = report_asks(&mut client).await;
    let (key, request) = asked["inputRequests"]
        .as_object()
        .and_then(|m| m.iter().next())
        .map(|(k, v)| (k.clone(), v.clone()))
        .unwrap();
    assert_eq!(request["method"], "sampling/createMessage", "{asked}");
    // The server's request params as it wrote them.
    assert_eq!(
        request["params"]["messages"][0]["content"]["text"],
        "Summarize Q3"
    );
    assert_eq!(request["params"]["_meta"]["x-origin"], "report");
    let state = asked["requestState"].as_str().unwrap().to_string();
    // A forged state, a state for other arguments: refused, and the call still waits.
    let mut forged = state.clone();
    forged.insert(3, 'x');
    for (state, quarter) in [(forged.as_str(), "Q3"), (state.as_str(), "Q4")] {
        let retry = client
            .request(
                "tools/call",
                json!({"name": "report", "arguments": {"quarter": quarter},
                    "inputResponses": {key.clone(): sampled()}, "requestState": state}),
            )
            .await;
        assert_eq!(retry["error"]["code"], -32602, "{retry}");
    }
    // The retry (a new id) delivers the answer; the call, still running upstream, ends.
    let retry = json!({"name": "report", "arguments": {"quarter": "Q3"},
        "inputResponses": {key.clone(): sampled()}, "requestState": state});
    let answer = client.request("tools/call", retry.clone()).await;
    let result = &answer["result"];
    assert_eq!(result["resultType"], "complete", "{answer}");
    assert!(answer.to_string().contains("Q3 was fine"), "{answer}");
    // Replayed: the call is no longer held, and the tool is not run again.
    let again = client.request("tools/call", retry).await;
    assert_eq!(again["error"]["code"], -32602, "{again}");
    assert!(
        again["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no longer held"),
        "{again}"
    );
    let runs = client
        .request("tools/call", json!({"name": "executions", "arguments": {}}))
        .await;
    assert_eq!(runs["result"]["structuredContent"]["report"], 1, "{runs}");
}

#[tokio::test]
async fn a_legacy_server_that_needs_an_undeclared_capability_fails_the_call_with_32021() {
    let mut client = Client::over(proxy("quirky_server", &[]), true);
    // This call declares elicitation only; quirky's report asks for sampling.
    let params = json!({"name": "report", "arguments": {"quarter": "Q3"},
        "_meta": {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}});
    let answer = client.request("tools/call", params).await;
    assert_eq!(answer["error"]["code"], -32021, "{answer}");
    assert_eq!(
        answer["error"]["data"]["requiredCapabilities"],
        json!({"sampling": {}})
    );
    // What 2026-07-28 removed is refused, though the legacy server would answer it.
    let ping = client.request("ping", json!({})).await;
    assert_eq!(ping["error"]["code"], -32601, "{ping}");
}

#[tokio::test]
async fn a_client_that_never_retries_has_its_call_cancelled_upstream() {
    let mut command = tokio::process::Command::new(common::proxy_bin());
    command
        .args(["--policy", "none", "--input-timeout-secs", "2", "--"])
        .arg(example("quirky_server"));
    let mut client = Client::over(Peer::from_command(command), true);
    let asked = report_asks(&mut client).await;
    let key = asked["inputRequests"]
        .as_object()
        .and_then(|m| m.keys().next().cloned())
        .unwrap();
    // The server hears of it: its log of the cancellation reaches a request that asks for
    // logs (a modern client gets none otherwise), sent now, well within the 2 s bound (only
    // one call may be open when the server asks, so it cannot go first).
    let wait = json!({"name": "slow", "arguments": {},
        "_meta": {"io.modelcontextprotocol/logLevel": "info"}});
    client.next += 1;
    let id = client.next;
    let mut params = wait;
    let own = params["_meta"].take();
    params["_meta"] = meta("bridge-test");
    params["_meta"]["io.modelcontextprotocol/logLevel"] =
        own["io.modelcontextprotocol/logLevel"].clone();
    client
        .peer
        .send(
            &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
                .to_string(),
        )
        .await;
    let cancelled = loop {
        let message = client.peer.recv_json().await;
        if message["method"] == "notifications/message"
            && message["params"]["data"]
                .as_str()
                .is_some_and(|d| d.starts_with("cancelled"))
        {
            break message;
        }
    };
    assert!(cancelled.to_string().contains("cancelled"), "{cancelled}");
    // A retry after the bound: a clear error; the tool is not run again behind its back.
    let retry = client
        .request(
            "tools/call",
            json!({"name": "report", "arguments": {"quarter": "Q3"},
                "inputResponses": {key: sampled()}, "requestState": asked["requestState"]}),
        )
        .await;
    assert_eq!(retry["error"]["code"], -32602, "{retry}");
    assert!(
        retry["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--input-timeout-secs"),
        "{retry}"
    );
}

#[tokio::test]
async fn a_legacy_client_with_a_modern_only_server_fails_directly() {
    let direct = Peer::spawn(example("modern_server"), &[]);
    let mut client = Client::over(direct, false);
    let answer = client.initialize("2025-11-25").await;
    assert!(answer["error"]["code"].is_number(), "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains(MODERN),
        "{answer}"
    );
}

#[tokio::test]
async fn a_legacy_client_is_served_by_a_modern_only_server_through_the_proxy() {
    let mut client = Client::over(proxy("modern_server", &[]), false);
    let init = client.initialize("2025-06-18").await;
    let result = &init["result"];
    assert_eq!(result["protocolVersion"], "2025-06-18", "{init}");
    assert_eq!(result["serverInfo"]["name"], "modern-only");
    assert_eq!(result["instructions"], "A server of rows.");
    assert!(result["capabilities"]["tools"].is_object());
    assert!(result.get("resultType").is_none(), "{init}");
    // The proxy answers what a modern server has no use for.
    let ping = client.request("ping", json!({})).await;
    assert_eq!(ping["result"], json!({}), "{ping}");
    let list = client.request("tools/list", json!({})).await;
    assert!(list["result"].get("resultType").is_none(), "{list:.300}");
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.starts_with(&["rows", "meta", "ask"]), "{names:?}");
    // No task crosses the eras: the client is shown no tasks (either form), and a tool that
    // runs only as a task is shown as one that runs plainly, and called so.
    let capabilities = &result["capabilities"];
    assert!(capabilities.get("tasks").is_none(), "{capabilities}");
    assert!(
        capabilities["extensions"]
            .get("io.modelcontextprotocol/tasks")
            .is_none(),
        "{capabilities}"
    );
    assert!(
        capabilities["extensions"]["vendor/x"].is_object(),
        "{capabilities}"
    );
    let research = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "research")
        .unwrap();
    assert_eq!(
        research["execution"]["taskSupport"], "forbidden",
        "{research}"
    );
    let answer = client
        .request("tools/call", json!({"name": "research", "arguments": {}}))
        .await;
    assert_eq!(
        answer["result"]["content"][0]["text"], "researched, without a task",
        "{answer}"
    );
    // Every forwarded request carries the modern _meta, from what initialize declared.
    let answer = client
        .request("tools/call", json!({"name": "meta", "arguments": {}}))
        .await;
    let text = answer["result"]["content"][0]["text"].as_str().unwrap();
    let sent: Value = serde_json::from_str(text).unwrap();
    assert_eq!(sent["io.modelcontextprotocol/protocolVersion"], MODERN);
    assert_eq!(sent["io.modelcontextprotocol/clientInfo"]["name"], "codex");
    assert_eq!(
        sent["io.modelcontextprotocol/clientCapabilities"],
        json!({"roots": {}})
    );
    assert!(sent.get("io.modelcontextprotocol/logLevel").is_none());
    // logging/setLevel is kept, and sent as logLevel from then on; the server's logs come.
    let set = client
        .request("logging/setLevel", json!({"level": "info"}))
        .await;
    assert_eq!(set["result"], json!({}), "{set}");
    let answer = client
        .request("tools/call", json!({"name": "meta", "arguments": {}}))
        .await;
    let text = answer["result"]["content"][0]["text"].as_str().unwrap();
    let sent: Value = serde_json::from_str(text).unwrap();
    assert_eq!(sent["io.modelcontextprotocol/logLevel"], "info");
    assert!(
        client
            .notes
            .iter()
            .any(|n| n["method"] == "notifications/message"),
        "{:?}",
        client.notes
    );
    // Paged for the client (Codex), every page legacy, reassembled by `after`; ran once.
    let file = std::env::temp_dir().join(format!("mcp-budget-bridge-runs-{}", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let arguments = json!({"rows": 3000, "file": file.to_str().unwrap()});
    let pages = pages(&mut client, "rows", arguments).await;
    assert!(pages.len() > 2);
    for page in &pages {
        assert!(page.get("resultType").is_none(), "{page:.200}");
        assert!(serde_json::to_string(page).unwrap().len() < 40_000);
    }
    let rows = rows_of(&pages);
    assert_eq!(rows.len(), 3000);
    assert_eq!(rows[2999]["n"], 2999);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "ran\n");
    let _ = std::fs::remove_file(&file);
    // A modern server's input_required: the legacy client is asked by a real request, and
    // the call is retried with its answer and the server's requestState.
    let done = ask(&mut client, |asked| {
        assert_eq!(asked["method"], "elicitation/create", "{asked}");
        assert_eq!(asked["params"]["message"], "Go on?");
        json!({"result": {"action": "accept", "content": {"ok": true}}})
    })
    .await;
    let text = done["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.starts_with("confirmed: "), "{done}");
    assert!(text.contains(r#""ok":true"#), "{done}");
    assert!(done["result"].get("resultType").is_none(), "{done}");
    // A client that refuses: the call ends with an error that says so.
    let done = ask(
        &mut client,
        |_| json!({"error": {"code": -1, "message": "user said no"}}),
    )
    .await;
    assert!(
        done["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("user said no"),
        "{done}"
    );
}

/// modern_server's `ask` called by a legacy client: the server request the proxy makes of it
/// is answered with what `answer` returns (a `result` or an `error` member); the call's end.
async fn ask(client: &mut Client, answer: impl Fn(&Value) -> Value) -> Value {
    client.next += 1;
    let call = client.next;
    let request = json!({"jsonrpc": "2.0", "id": call, "method": "tools/call",
        "params": {"name": "ask", "arguments": {}}});
    client.peer.send(&request.to_string()).await;
    let asked = next_request(client).await;
    let mut reply = answer(&asked);
    reply["jsonrpc"] = json!("2.0");
    reply["id"] = asked["id"].clone();
    client.peer.send(&reply.to_string()).await;
    loop {
        let message = client.peer.recv_json().await;
        if message["id"] == call {
            return message;
        }
    }
}

/// The next request the client is sent (notifications skipped).
async fn next_request(client: &mut Client) -> Value {
    loop {
        let message = client.peer.recv_json().await;
        if message.get("method").is_some() && message.get("id").is_some() {
            return message;
        }
    }
}

#[tokio::test]
async fn a_forced_server_era_is_not_asked() {
    // --server-era modern: the legacy client's initialize goes to the server as discover at
    // once (no refused initialize first).
    let mut command = tokio::process::Command::new(common::proxy_bin());
    command
        .args(["--policy", "none", "--server-era", "modern", "--"])
        .arg(example("modern_server"));
    let mut client = Client::over(Peer::from_command(command), false);
    let init = client.initialize("2025-11-25").await;
    assert_eq!(
        init["result"]["serverInfo"]["name"], "modern-only",
        "{init}"
    );
    // A bad value names the choices.
    let out = common::run(["--server-era", "2024", "--", "true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("auto, modern"), "{stderr}");
}

/// A reqwest client (rustls needs its crypto provider chosen first).
fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// A modern POST to the proxy's listener.
async fn modern_post(
    http: &reqwest::Client,
    url: &str,
    id: u64,
    method: &str,
    params: Value,
    name: Option<&str>,
) -> Value {
    let mut params = params;
    params["_meta"] = meta("claude-ai");
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let mut request = modern_request(http, url, &body);
    if let Some(name) = name {
        request = request.header("mcp-name", name);
    }
    let text = request.send().await.unwrap().text().await.unwrap();
    last_message(&text)
}

/// A 2026-07-28 POST of `message` (its `method` in the header) to the proxy's listener.
fn modern_request(http: &reqwest::Client, url: &str, message: &Value) -> reqwest::RequestBuilder {
    http.post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", MODERN)
        .header("mcp-method", message["method"].as_str().unwrap_or(""))
        .body(message.to_string())
}

#[tokio::test]
async fn over_http_a_modern_client_reaches_a_legacy_stdio_server() {
    let quirky = example("quirky_server");
    let (_proxy, url) =
        common::listen(&["--policy", "none", "--", quirky.to_str().unwrap()], &[]).await;
    let http = http_client();
    let discover = modern_post(&http, &url, 1, "server/discover", json!({}), None).await;
    assert_eq!(
        discover["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "quirky",
        "{discover}"
    );
    let call = modern_post(
        &http,
        &url,
        2,
        "tools/call",
        json!({"name": "rows", "arguments": {"rows": 3000}}),
        Some("rows"),
    )
    .await;
    assert_eq!(call["result"]["resultType"], "complete", "{call:.300}");
    assert!(
        common::continuation(&call["result"]).is_some(),
        "paged: {call:.300}"
    );
}

#[tokio::test]
async fn over_http_a_legacy_client_reaches_a_modern_only_stdio_server() {
    let server = example("modern_server");
    let (_proxy, url) =
        common::listen(&["--policy", "none", "--", server.to_str().unwrap()], &[]).await;
    let http = http_client();
    let session = common::mcp_initialize(&http, &url).await;
    let list = common::mcp_post(
        &http,
        &url,
        Some(&session),
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    )
    .send()
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    let list = last_message(&list);
    assert_eq!(list["result"]["tools"][0]["name"], "rows", "{list}");
    assert!(list["result"].get("resultType").is_none());
}

#[tokio::test]
async fn a_request_state_from_another_principal_is_refused() {
    let (_proxy, url) = common::two_principals().await;
    let http = http_client();
    let call = |token: &'static str, id: u64, params: Value| {
        let mut params = params;
        params["_meta"] = meta("claude-ai");
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
        http.post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", MODERN)
            .header("mcp-method", "tools/call")
            .header("mcp-name", "report")
            .header("authorization", format!("Bearer {token}"))
            .body(body.to_string())
            .send()
    };
    let report = json!({"name": "report", "arguments": {"quarter": "Q3"}});
    let asked = last_message(
        &call("a-secret", 1, report)
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(asked["result"]["resultType"], "input_required", "{asked}");
    let key = asked["result"]["inputRequests"]
        .as_object()
        .and_then(|m| m.keys().next().cloned())
        .unwrap();
    let retry = json!({"name": "report", "arguments": {"quarter": "Q3"},
        "inputResponses": {key: sampled()}, "requestState": asked["result"]["requestState"]});
    // Principal B with A's state: refused; nothing of A's call reaches B.
    let other = last_message(
        &call("b-secret", 2, retry.clone())
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(other["error"]["code"], -32602, "{other}");
    assert!(!other.to_string().contains("Q3 was fine"));
    // A itself: the call completes.
    let own = last_message(
        &call("a-secret", 3, retry)
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(own["result"]["resultType"], "complete", "{own}");
    assert!(own.to_string().contains("Q3 was fine"), "{own}");
}

#[test]
fn explain_says_which_era_it_found() {
    let dir =
        std::env::temp_dir().join(format!("mcp-budget-bridge-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, "[budget]\n").unwrap();
    for (server, tool, said) in [
        (
            "modern_server",
            "rows",
            "server modern-only: modern (2026-07-28)",
        ),
        (
            "quirky_server",
            "rows",
            "server quirky: legacy (2025-11-25, by initialize)",
        ),
    ] {
        let out = common::run([
            "explain".as_ref(),
            policy.as_os_str(),
            "--tool".as_ref(),
            tool.as_ref(),
            "--".as_ref(),
            example(server).as_os_str(),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{server}: {stderr}");
        assert!(stderr.contains(said), "{server}: {stderr}");
        let descriptor: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(descriptor["name"], tool);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A legacy Streamable HTTP server (rmcp, opened as 2025-11-25 by `--server-era legacy`):
/// `hold` answers once the test lets it; `ask` samples its client mid-call, on the stream of
/// the call's own POST.
mod legacy_http {
    #![allow(deprecated)] // rmcp marks sampling deprecated (SEP-2577); MCP clients still use it.

    use std::sync::Arc;

    use rmcp::model::*;
    use rmcp::service::RequestContext;
    use rmcp::{ErrorData, RoleServer, ServerHandler};
    use tokio::sync::Notify;

    #[derive(Clone, Default)]
    pub struct Asking {
        pub holding: Arc<Notify>,
        pub release: Arc<Notify>,
    }

    impl ServerHandler for Asking {
        fn get_info(&self) -> ServerConfig {
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
                .with_server_info(Implementation::new("asking-http", "1.0.0"))
        }

        async fn list_tools(
            &self,
            _r: Option<PaginatedRequestParams>,
            _c: RequestContext<RoleServer>,
        ) -> Result<ListToolsResult, ErrorData> {
            let schema: JsonObject =
                serde_json::from_value(serde_json::json!({"type": "object"})).unwrap();
            Ok(ListToolsResult::with_all_items(vec![
                Tool::new("hold", "Answers when released.", schema.clone()),
                Tool::new("ask", "Samples its client.", schema),
            ]))
        }

        async fn call_tool(
            &self,
            request: CallToolRequestParams,
            context: RequestContext<RoleServer>,
        ) -> Result<CallToolResponse, ErrorData> {
            let text = match request.name.as_ref() {
                "hold" => {
                    let released = self.release.notified();
                    self.holding.notify_one();
                    released.await;
                    "released".to_string()
                }
                "ask" => {
                    let reply = context
                        .peer
                        .create_message(CreateMessageRequestParams::new(
                            vec![SamplingMessage::user_text("Summarize Q3")],
                            64,
                        ))
                        .await
                        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
                    let said = reply.message.content.first().and_then(|c| c.as_text());
                    format!("sampled: {}", said.map(|t| t.text.as_str()).unwrap_or(""))
                }
                other => return Err(ErrorData::invalid_params(format!("no {other}"), None)),
            };
            Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
        }
    }
}

/// Over `--upstream`, a legacy server's request comes on the stream of the call it belongs
/// to: with two calls open, it still reaches the right one's client as `input_required` (it
/// was refused when the proxy could not tell the calls apart).
#[tokio::test]
async fn over_an_http_upstream_a_request_for_input_finds_its_call_among_several() {
    let server = legacy_http::Asking::default();
    let upstream = common::rmcp_http({
        let server = server.clone();
        move || server.clone()
    })
    .await;
    let (_proxy, url) = common::listen(
        &[
            "--policy",
            "none",
            "--server-era",
            "legacy",
            "--upstream",
            &upstream,
        ],
        &[],
    )
    .await;
    let http = http_client();
    let holding = server.holding.notified();
    let hold = tokio::spawn({
        let (http, url) = (http.clone(), url.clone());
        async move {
            let params = json!({"name": "hold", "arguments": {}});
            modern_post(&http, &url, 1, "tools/call", params, Some("hold")).await
        }
    });
    tokio::time::timeout(common::PATIENCE, holding)
        .await
        .expect("the first call reached the server");
    let params = json!({"name": "ask", "arguments": {}});
    let asked = modern_post(&http, &url, 2, "tools/call", params, Some("ask")).await;
    assert_eq!(asked["result"]["resultType"], "input_required", "{asked}");
    let (key, request) = asked["result"]["inputRequests"]
        .as_object()
        .and_then(|m| m.iter().next())
        .map(|(k, v)| (k.clone(), v.clone()))
        .unwrap();
    assert_eq!(request["method"], "sampling/createMessage", "{asked}");
    let retry = json!({"name": "ask", "arguments": {}, "inputResponses": {key: sampled()},
        "requestState": asked["result"]["requestState"]});
    let answer = modern_post(&http, &url, 3, "tools/call", retry, Some("ask")).await;
    assert_eq!(answer["result"]["resultType"], "complete", "{answer}");
    assert!(
        answer.to_string().contains("sampled: Q3 was fine"),
        "{answer}"
    );
    // The other call was never touched: it answers once released.
    server.release.notify_one();
    let held = tokio::time::timeout(common::PATIENCE, hold)
        .await
        .expect("the held call answered")
        .unwrap();
    assert_eq!(held["result"]["resultType"], "complete", "{held}");
    assert!(held.to_string().contains("released"), "{held}");
}

/// A modern `subscriptions/listen` over a line peer: the request (it is never answered while
/// it is open) and its acknowledgement, which names the subscription by the request's id.
async fn listen_on(client: &mut Client, id: u64, notifications: Value) -> Value {
    let params = json!({"_meta": meta("bridge-test"), "notifications": notifications});
    let request =
        json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": params});
    client.peer.send(&request.to_string()).await;
    loop {
        let message = client.peer.recv_json().await;
        if message["method"] == "notifications/subscriptions/acknowledged" {
            assert_eq!(
                message["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], id,
                "{message}"
            );
            return message["params"]["notifications"].clone();
        }
        assert!(
            message.get("id").is_none(),
            "the listen was answered: {message}"
        );
        client.notes.push(message);
    }
}

/// Calls the server's `touch` tool (an update of `uri`, and a resource list change).
async fn touch(client: &mut Client, uri: &str) {
    let answer = client
        .request(
            "tools/call",
            json!({"name": "touch", "arguments": {"uri": uri}}),
        )
        .await;
    assert!(answer["result"].is_object(), "{answer}");
}

/// The JSON a tool of the server answers with, as its text (quirky's `subscribed`: the URIs it
/// is subscribed to; modern_server's `listens`: the `resourceSubscriptions` of its open listens).
async fn json_of(client: &mut Client, tool: &str) -> Value {
    let answer = client
        .request("tools/call", json!({"name": tool, "arguments": {}}))
        .await;
    let text = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or("null");
    serde_json::from_str(text).unwrap_or_else(|_| panic!("{answer}"))
}

/// The notifications a call brought, as (method, subscription id, uri).
fn brought(client: &mut Client) -> Vec<(String, Value, Value)> {
    let mut notes: Vec<(String, Value, Value)> = client
        .notes
        .drain(..)
        .map(|n| {
            (
                n["method"].as_str().unwrap_or("").to_string(),
                n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"].clone(),
                n["params"]["uri"].clone(),
            )
        })
        .collect();
    notes.sort_by_key(|(m, s, u)| format!("{m}{s}{u}"));
    notes
}

#[tokio::test]
async fn a_modern_clients_listen_is_served_in_front_of_a_legacy_server() {
    let mut client = Client::over(proxy("quirky_server", &[("QUIRKY_RESOURCES", "1")]), true);
    // The first request: held while the server's era is learned, refused by the legacy
    // server, then served by the proxy.
    let granted = listen_on(
        &mut client,
        100,
        json!({"toolsListChanged": true, "promptsListChanged": true, "resourceSubscriptions": ["file:///a"], "x-future": true}),
    )
    .await;
    // quirky has no prompts: only what its capabilities offer is granted.
    assert_eq!(
        granted,
        json!({"toolsListChanged": true, "resourceSubscriptions": ["file:///a"]})
    );
    let granted = listen_on(
        &mut client,
        101,
        json!({"resourcesListChanged": true, "resourceSubscriptions": ["file:///a", "file:///b"]}),
    )
    .await;
    assert_eq!(
        granted,
        json!({"resourcesListChanged": true, "resourceSubscriptions": ["file:///a", "file:///b"]})
    );
    assert_eq!(
        json_of(&mut client, "subscribed").await,
        json!(["file:///a", "file:///b"])
    );
    client.notes.clear();

    // An update of a URI both listen to reaches both, each tagged with its own id, as the
    // server wrote it otherwise; the list change only the listen that asked for it.
    touch(&mut client, "file:///a").await;
    let updated = "notifications/resources/updated".to_string();
    assert_eq!(
        brought(&mut client),
        vec![
            (
                "notifications/resources/list_changed".into(),
                json!(101),
                Value::Null
            ),
            (updated.clone(), json!(100), json!("file:///a")),
            (updated.clone(), json!(101), json!("file:///a")),
        ]
    );
    client
        .request(
            "tools/call",
            json!({"name": "list_changed", "arguments": {}}),
        )
        .await;
    assert_eq!(
        brought(&mut client),
        vec![(
            "notifications/tools/list_changed".into(),
            json!(100),
            Value::Null
        )]
    );

    // The client cancels 101: b is unsubscribed upstream, a is kept for 100.
    client
        .peer
        .send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":101}}"#)
        .await;
    assert_eq!(
        json_of(&mut client, "subscribed").await,
        json!(["file:///a"])
    );
    client.notes.clear();
    touch(&mut client, "file:///a").await;
    assert_eq!(
        brought(&mut client),
        vec![(updated.clone(), json!(100), json!("file:///a"))]
    );

    // A filter the proxy cannot read is refused, naming the fix; the listen's id is free
    // again for another request.
    let refused = client
        .request(
            "subscriptions/listen",
            json!({"notifications": {"resourceSubscriptions": "file:///a"}}),
        )
        .await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("list of URI strings")),
        "{refused}"
    );
}

#[tokio::test]
async fn over_http_a_listen_streams_a_legacy_servers_updates_and_ends_with_its_stream() {
    let quirky = example("quirky_server");
    let (_proxy, url) = common::listen(
        &["--policy", "none", "--", quirky.to_str().unwrap()],
        &[("QUIRKY_RESOURCES", "1")],
    )
    .await;
    let http = http_client();
    let discover = modern_post(&http, &url, 1, "server/discover", json!({}), None).await;
    assert!(discover["result"].is_object(), "{discover}");
    let mut params = json!({"notifications": {"resourceSubscriptions": ["file:///x"]}});
    params["_meta"] = meta("claude-ai");
    let body = json!({"jsonrpc": "2.0", "id": "watch", "method": "subscriptions/listen", "params": params});
    let response = modern_request(&http, &url, &body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let mut events = common::Events::new(response.bytes_stream());
    let ack = events.next().await;
    assert_eq!(
        ack["method"], "notifications/subscriptions/acknowledged",
        "{ack}"
    );
    assert_eq!(
        ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "watch",
        "the client's own id: {ack}"
    );
    let touch = modern_post(
        &http,
        &url,
        2,
        "tools/call",
        json!({"name": "touch", "arguments": {"uri": "file:///x"}}),
        Some("touch"),
    )
    .await;
    assert!(touch["result"].is_object(), "{touch}");
    let update = events.next().await;
    assert_eq!(
        update["method"], "notifications/resources/updated",
        "{update}"
    );
    assert_eq!(update["params"]["uri"], "file:///x");
    assert_eq!(
        update["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "watch",
        "{update}"
    );
    let subscribed_now = |answer: &Value| {
        answer["result"]["content"][0]["text"]
            .as_str()
            .map(String::from)
            .unwrap_or_default()
    };
    let answer = modern_post(
        &http,
        &url,
        3,
        "tools/call",
        json!({"name": "subscribed", "arguments": {}}),
        Some("subscribed"),
    )
    .await;
    assert_eq!(subscribed_now(&answer), r#"["file:///x"]"#, "{answer}");
    // The client closes the listen's stream: the subscription ends upstream.
    drop(events);
    let mut id = 4;
    loop {
        let answer = modern_post(
            &http,
            &url,
            id,
            "tools/call",
            json!({"name": "subscribed", "arguments": {}}),
            Some("subscribed"),
        )
        .await;
        if subscribed_now(&answer) == "[]" {
            break;
        }
        id += 1;
        assert!(
            id < 400,
            "still subscribed after the stream closed: {answer}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

fn proxy_with(options: &[&str], server: &str) -> Peer {
    let mut command = tokio::process::Command::new(common::proxy_bin());
    command
        .args(["--policy", "none"])
        .args(options)
        .arg("--")
        .arg(example(server));
    Peer::from_command(command)
}

#[tokio::test]
async fn a_forced_legacy_client_era_answers_modern_requests_as_a_legacy_server_does() {
    let mut client = Client::over(
        proxy_with(&["--client-era", "legacy"], "modern_server"),
        true,
    );
    // What a dual-era client's probe reads as a legacy server: it falls back to initialize.
    let discover = client.request("server/discover", json!({})).await;
    assert_eq!(discover["error"]["code"], -32601, "{discover}");
    let list = client.request("tools/list", json!({})).await;
    assert_eq!(list["error"]["code"], -32600, "{list}");
    assert!(
        list["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("--client-era legacy") && m.contains("initialize")),
        "{list}"
    );
    // A legacy client is served (bridged to the modern-only server behind).
    client.modern = false;
    let init = client.initialize("2025-11-25").await;
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
    let list = client.request("tools/list", json!({})).await;
    assert!(list["result"]["tools"].is_array(), "{list}");
}

#[tokio::test]
async fn a_forced_modern_client_era_refuses_initialize_naming_the_version_it_serves() {
    let mut client = Client::over(
        proxy_with(&["--client-era", "modern"], "quirky_server"),
        false,
    );
    let init = client.initialize("2025-11-25").await;
    assert_eq!(init["error"]["code"], -32022, "{init}");
    assert_eq!(
        init["error"]["data"],
        json!({"supported": ["2026-07-28"], "requested": "2025-11-25"})
    );
    // A modern client is served (bridged to the legacy server behind).
    client.modern = true;
    let list = client.request("tools/list", json!({})).await;
    assert_eq!(list["result"]["resultType"], "complete", "{list:.300}");
}

/// `--listen` in front of `server`, serving clients of `era` only.
async fn serving(server: &str, era: &str) -> (tokio::process::Child, String) {
    common::listen(
        &["--client-era", era, "--policy", "none", "--", server],
        &[],
    )
    .await
}

#[tokio::test]
async fn over_http_a_forced_client_era_refuses_the_other_era_before_any_session() {
    let quirky = example("quirky_server");
    let http = http_client();
    let quirky = quirky.to_str().unwrap();
    let (_legacy_only, url) = serving(quirky, "legacy").await;
    let answer = modern_post(&http, &url, 7, "tools/list", json!({}), None).await;
    assert_eq!(answer["id"], 7, "{answer}");
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
    // A modern notification alone opens no session either.
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7, "_meta": meta("claude-ai")}});
    let response = modern_request(&http, &url, &cancel).send().await.unwrap();
    assert_eq!(response.status(), 400);
    let session = common::mcp_initialize(&http, &url).await;
    assert!(!session.is_empty());

    let (_modern_only, url) = serving(quirky, "modern").await;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}});
    let response = http
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(init.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert!(response.headers().get("mcp-session-id").is_none());
    let answer: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(answer["error"]["code"], -32022, "{answer}");
    assert_eq!(
        answer["error"]["data"]["requested"], "2025-06-18",
        "{answer}"
    );
    let list = modern_post(&http, &url, 2, "tools/list", json!({}), None).await;
    assert_eq!(list["result"]["resultType"], "complete", "{list:.300}");
}

/// Asks until the server holds exactly `expected` (the proxy cancels a replaced listen once the
/// new one is acknowledged, which may come after the next call).
async fn until_listens(client: &mut Client, expected: Value) {
    for _ in 0..200 {
        if json_of(client, "listens").await == expected {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!(
        "the server never held {expected}: {}",
        json_of(client, "listens").await
    );
}

#[tokio::test]
async fn a_legacy_clients_subscriptions_are_served_from_a_listen_at_a_modern_server() {
    let mut client = Client::over(proxy("modern_server", &[("MODERN_RESOURCES", "1")]), false);
    let init = client.initialize("2025-11-25").await;
    assert_eq!(
        init["result"]["capabilities"]["resources"]["subscribe"], true,
        "{init}"
    );
    // After initialized, one listen for the list changes the server offers.
    until_listens(&mut client, json!([null])).await;
    let subscribe = client
        .request("resources/subscribe", json!({"uri": "file:///a"}))
        .await;
    assert_eq!(subscribe["result"], json!({}), "{subscribe}");
    until_listens(&mut client, json!([["file:///a"]])).await;
    client.notes.clear();
    touch(&mut client, "file:///a").await;
    let methods: Vec<String> = client
        .notes
        .drain(..)
        .map(|n| {
            format!(
                "{} {}",
                n["method"].as_str().unwrap_or(""),
                n["params"]["uri"]
            )
        })
        .collect();
    assert_eq!(
        methods,
        [
            "notifications/resources/updated \"file:///a\"",
            "notifications/resources/list_changed null"
        ]
    );
    // Unsubscribed: the server's listen no longer names the URI, and its updates stop.
    let unsubscribe = client
        .request("resources/unsubscribe", json!({"uri": "file:///a"}))
        .await;
    assert_eq!(unsubscribe["result"], json!({}), "{unsubscribe}");
    until_listens(&mut client, json!([null])).await;
    client.notes.clear();
    touch(&mut client, "file:///a").await;
    let methods: Vec<Value> = client
        .notes
        .drain(..)
        .map(|n| n["method"].clone())
        .collect();
    assert_eq!(methods, [json!("notifications/resources/list_changed")]);
    let refused = client
        .request("resources/subscribe", json!({"uri": 7}))
        .await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    // The server ends its listens (as one shutting down does): the proxy opens its own again.
    client
        .request(
            "tools/call",
            json!({"name": "end_listens", "arguments": {}}),
        )
        .await;
    until_listens(&mut client, json!([null])).await;
}

#[tokio::test]
async fn a_legacy_servers_requests_written_together_reach_a_modern_client_in_one_round() {
    one_round_of_two(json!({})).await;
}

/// Two writes 2 ms apart are two reads for the proxy: the round waits a moment for more
/// (the conformance suite's three elicitations through `--listen --upstream` were split so).
#[tokio::test]
async fn a_legacy_servers_requests_written_apart_in_one_turn_reach_a_modern_client_in_one_round() {
    one_round_of_two(json!({"gap_ms": 2})).await;
}

async fn one_round_of_two(arguments: Value) {
    let mut client = Client::over(proxy("quirky_server", &[]), true);
    let call = json!({"name": "ask_two", "arguments": arguments});
    let first = client.request("tools/call", call.clone()).await;
    let asked = &first["result"];
    assert_eq!(asked["resultType"], "input_required", "{first}");
    let requests = asked["inputRequests"].as_object().unwrap();
    let mut methods: Vec<&str> = requests
        .values()
        .map(|r| r["method"].as_str().unwrap())
        .collect();
    methods.sort();
    assert_eq!(
        methods,
        ["elicitation/create", "sampling/createMessage"],
        "{first}"
    );
    // One retry answers both; the server gets each answer and ends the call.
    let mut responses = serde_json::Map::new();
    for (key, request) in requests {
        let answer = match request["method"].as_str() {
            Some("elicitation/create") => json!({"action": "accept", "content": {"ok": true}}),
            _ => sampled(),
        };
        responses.insert(key.clone(), answer);
    }
    let mut retry = call;
    retry["inputResponses"] = Value::Object(responses);
    retry["requestState"] = asked["requestState"].clone();
    let done = client.request("tools/call", retry).await;
    assert_eq!(done["result"]["resultType"], "complete", "{done}");
    let text = done["result"]["content"][0]["text"].as_str().unwrap_or("");
    assert!(
        text.contains(r#""srv-e": {"action":"accept""#) && text.contains(r#""srv-s": {"#),
        "{done}"
    );
}

#[tokio::test]
async fn a_call_whose_round_of_input_is_held_gets_an_error_when_the_server_exits() {
    let mut client = Client::over(proxy("quirky_server", &[]), true);
    let answer = client
        .request(
            "tools/call",
            json!({"name": "ask_and_crash", "arguments": {}}),
        )
        .await;
    // The server asked and exited in one breath: the call is answered (never left waiting):
    // with why, or with its round of input when it went out before the exit was read.
    assert!(
        answer["error"]["message"].is_string()
            || answer["result"]["resultType"] == "input_required",
        "{answer}"
    );
}

/// Over stdio the proxy has one server process, whose legacy session declared what the first
/// modern request declared: a call that declares other capabilities gets a process (and a
/// session) of its own, reused by the next call that declares the same.
#[tokio::test]
async fn over_stdio_a_call_declaring_other_capabilities_gets_a_legacy_session_of_its_own() {
    let mut client = Client::over(proxy("quirky_server", &[]), true);
    let declared = |caps: Value| {
        json!({"name": "declared", "arguments": {},
            "_meta": {"io.modelcontextprotocol/clientCapabilities": caps}})
    };
    let mut seen = Vec::new();
    for caps in [
        json!({"elicitation": {}}),
        json!({"sampling": {}}),
        json!({"elicitation": {}}),
        json!({"sampling": {}}),
    ] {
        let answer = client.request("tools/call", declared(caps.clone())).await;
        let who = answer["result"]["structuredContent"].clone();
        assert_eq!(who["capabilities"], caps, "{answer}");
        seen.push(who["pid"].as_u64().unwrap());
    }
    assert_ne!(
        seen[0], seen[1],
        "another process for another capability set"
    );
    assert_eq!((seen[0], seen[1]), (seen[2], seen[3]), "each reused");
    // The first session declared no sampling; quirky's report asks for it: in the session
    // that declared it, the round trip works (the retry, declaring the same, finds its call).
    let asked = report_asks(&mut client).await;
    let key = asked["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    let retry = json!({"name": "report", "arguments": {"quarter": "Q3"},
        "inputResponses": {key: sampled()}, "requestState": asked["requestState"]});
    let answer = client.request("tools/call", retry).await;
    assert_eq!(answer["result"]["resultType"], "complete", "{answer}");
    assert!(answer.to_string().contains("Q3 was fine"), "{answer}");
}

/// A lane's server that exits answers its call with an error; the session goes on, and the
/// next call declaring those capabilities gets a new process.
#[tokio::test]
async fn over_stdio_a_lane_whose_server_exits_is_started_again() {
    let mut client = Client::over(proxy("quirky_server", &[]), true);
    let call = |name: &str, caps: Value| {
        json!({"name": name, "arguments": {},
            "_meta": {"io.modelcontextprotocol/clientCapabilities": caps}})
    };
    let first = client
        .request("tools/call", call("declared", json!({})))
        .await;
    let first = first["result"]["structuredContent"]["pid"]
        .as_u64()
        .unwrap();
    let lane = client
        .request("tools/call", call("declared", json!({"roots": {}})))
        .await;
    let lane = lane["result"]["structuredContent"]["pid"].as_u64().unwrap();
    let crashed = client
        .request("tools/call", call("crash", json!({"roots": {}})))
        .await;
    assert!(crashed["error"]["message"].is_string(), "{crashed}");
    let again = client
        .request("tools/call", call("declared", json!({"roots": {}})))
        .await;
    let again = again["result"]["structuredContent"]["pid"]
        .as_u64()
        .unwrap();
    assert_ne!(again, lane, "a new process for the lane");
    let still = client
        .request("tools/call", call("declared", json!({})))
        .await;
    assert_eq!(still["result"]["structuredContent"]["pid"], first);
    // The replaced lane's tasks ended with it: the proxy exits once the client closes (it
    // hung, the dropped lane's sweeper holding the client's writer open).
    client.peer.close_stdin();
    assert!(client.peer.wait().await.success());
}

/// The JSON a tool answers once the server is back, asked until it is `expected` (requests
/// while the server restarts are answered with an error naming it; a subscription made again
/// may still be on its way): the last answer.
async fn after_restart(client: &mut Client, tool: &str, expected: Value) -> Value {
    let mut last = Value::Null;
    for _ in 0..200 {
        let answer = client
            .request("tools/call", json!({"name": tool, "arguments": {}}))
            .await;
        if let Some(text) = answer["result"]["content"][0]["text"].as_str() {
            last = serde_json::from_str(text).unwrap_or(Value::Null);
            if last == expected {
                break;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    last
}

/// A legacy client's subscriptions live in the listen the proxy holds at the modern server:
/// after the server crashed and `--restart on-failure` started it again, the new process gets
/// that listen again, and its updates reach the client, which was never told of the restart.
#[tokio::test]
async fn a_legacy_clients_subscriptions_are_made_again_at_a_restarted_modern_server() {
    let mut command = tokio::process::Command::new(common::proxy_bin());
    command
        .args(["--policy", "none", "--restart", "on-failure", "--"])
        .arg(example("modern_server"))
        .env("MODERN_RESOURCES", "1");
    let mut client = Client::over(Peer::from_command(command), false);
    client.initialize("2025-11-25").await;
    let subscribe = client
        .request("resources/subscribe", json!({"uri": "file:///a"}))
        .await;
    assert_eq!(subscribe["result"], json!({}), "{subscribe}");
    until_listens(&mut client, json!([["file:///a"]])).await;
    let crashed = client
        .request("tools/call", json!({"name": "crash", "arguments": {}}))
        .await;
    assert!(crashed["error"]["message"].is_string(), "{crashed}");
    let open = after_restart(&mut client, "listens", json!([["file:///a"]])).await;
    assert_eq!(
        open,
        json!([["file:///a"]]),
        "the new server holds the listen"
    );
    client.notes.clear();
    touch(&mut client, "file:///a").await;
    let updated: Vec<&Value> = client
        .notes
        .iter()
        .filter(|n| n["method"] == "notifications/resources/updated")
        .collect();
    assert_eq!(updated.len(), 1, "{:?}", client.notes);
    assert_eq!(updated[0]["params"]["uri"], "file:///a");
}

/// A legacy client's resource subscriptions at a legacy server that crashed are made again
/// in the server `--restart on-failure` started (its `initialize` is replayed, and so are
/// they): the client is told only to list its tools again.
#[tokio::test]
async fn a_legacy_clients_subscriptions_are_made_again_at_a_restarted_legacy_server() {
    let mut command = tokio::process::Command::new(common::proxy_bin());
    command
        .args(["--policy", "none", "--restart", "on-failure", "--"])
        .arg(example("quirky_server"))
        .env("QUIRKY_RESOURCES", "1");
    let mut client = Client::over(Peer::from_command(command), false);
    client.initialize("2025-11-25").await;
    for uri in ["file:///a", "file:///b"] {
        let subscribe = client
            .request("resources/subscribe", json!({"uri": uri}))
            .await;
        assert_eq!(subscribe["result"], json!({}), "{subscribe}");
    }
    let unsubscribe = client
        .request("resources/unsubscribe", json!({"uri": "file:///b"}))
        .await;
    assert_eq!(unsubscribe["result"], json!({}), "{unsubscribe}");
    assert_eq!(
        json_of(&mut client, "subscribed").await,
        json!(["file:///a"])
    );
    let crashed = client
        .request("tools/call", json!({"name": "crash", "arguments": {}}))
        .await;
    assert!(crashed["error"]["message"].is_string(), "{crashed}");
    let held = after_restart(&mut client, "subscribed", json!(["file:///a"])).await;
    assert_eq!(
        held,
        json!(["file:///a"]),
        "the new server is subscribed again"
    );
    // The proxy's own subscribe answers never reach the client.
    assert!(
        !client
            .notes
            .iter()
            .any(|n| n.to_string().contains("resubscribe")),
        "{:?}",
        client.notes
    );
}

/// A lane knows the tools as the client listed them through the first session: `history` has
/// an `after` of its own, which the lane passes to the server as the first would (it is not
/// the proxy's cursor there).
#[tokio::test]
async fn over_stdio_a_lane_knows_the_tools_the_client_listed() {
    let mut client = Client::over(proxy("quirky_server", &[]), true);
    let listed = client.request("tools/list", json!({})).await;
    assert!(listed["result"]["tools"].is_array(), "{listed}");
    let call = |caps: Value| {
        json!({"name": "history", "arguments": {"after": 40, "lines": 2},
            "_meta": {"io.modelcontextprotocol/clientCapabilities": caps}})
    };
    for caps in [
        json!({"elicitation": {}, "sampling": {}}),
        json!({"roots": {}}),
    ] {
        let answer = client.request("tools/call", call(caps)).await;
        let text = answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or("");
        assert!(text.starts_with("history run 1 line 000041\n"), "{answer}");
    }
}
