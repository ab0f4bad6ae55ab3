//! MCP 2026-07-28 ("modern") clients through the proxy, on stdio and `--listen`, with the
//! server a stdio child or a Streamable HTTP endpoint: the budget holds, fitted to the client
//! each request names; HTTP requests are checked against their headers; every result the
//! proxy writes is complete; the server's errors pass as it wrote them.

#![allow(deprecated)] // rmcp's ServerInfo alias

mod common;

#[path = "../examples/fleet/record.rs"]
mod record;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{Peer, example};
use rmcp::model::*;
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RequestContext};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};

/// A reqwest client (rustls needs its crypto provider chosen first).
fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

fn fleet_policy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/fleet.toml")
}

fn meta(client: &str) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": client, "version": "1"},
    })
}

/// A modern request's body.
fn request(id: Value, method: &str, mut params: Value, client: &str) -> String {
    params["_meta"] = meta(client);
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

/// A modern POST with the headers its body implies (`name`: `Mcp-Name`).
fn post(
    http: &reqwest::Client,
    url: &str,
    method: &str,
    name: Option<&str>,
    body: String,
) -> reqwest::RequestBuilder {
    let mut builder = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .body(body);
    if let Some(name) = name {
        builder = builder.header("mcp-name", name);
    }
    builder
}

/// The JSON-RPC message of a response, JSON or the last SSE event's data.
async fn message(response: reqwest::Response) -> (reqwest::StatusCode, Value) {
    let status = response.status();
    let text = response.text().await.unwrap();
    let json = if text.trim_start().starts_with('{') {
        text
    } else {
        text.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .next_back()
            .unwrap_or_else(|| panic!("no event in {text}"))
            .to_string()
    };
    (status, serde_json::from_str(&json).unwrap())
}

async fn listen_fleet() -> (tokio::process::Child, String) {
    let fleet = example("fleet_server");
    common::listen(
        &[
            "--policy",
            fleet_policy().to_str().unwrap(),
            "--",
            fleet.to_str().unwrap(),
            "--streams",
            "240",
        ],
        &[],
    )
    .await
}

fn tools_call(id: Value, tool: &str, arguments: Value, client: &str) -> String {
    request(
        id,
        "tools/call",
        json!({"name": tool, "arguments": arguments}),
        client,
    )
}

#[tokio::test]
async fn each_modern_request_is_budgeted_for_the_client_it_names() {
    let (_proxy, url) = listen_fleet().await;
    let http = http_client();
    let mut sizes = Vec::new();
    for client in ["codex-mcp-client", "claude-code", "some-client"] {
        let body = tools_call(json!(3), "fleet_show", json!({}), client);
        let (status, answer) = message(
            post(&http, &url, "tools/call", Some("fleet_show"), body)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(answer["id"], 3);
        assert_eq!(answer["result"]["resultType"], "complete");
        assert_eq!(answer["result"]["structuredContent"]["total_count"], 240);
        // What each model reads: structuredContent, for Codex and Claude Code.
        sizes.push(answer["result"]["structuredContent"].to_string().len());
    }
    // Codex reads 10,000 bytes (its profile); the others get the policy's 25 streams.
    assert!(sizes[0] < 10_000, "codex: {sizes:?}");
    assert!(sizes[1] > 10_000 && sizes[2] > 10_000, "{sizes:?}");
}

#[tokio::test]
async fn a_list_fitted_to_a_client_is_private() {
    let (_proxy, url) = listen_fleet().await;
    let http = http_client();
    let body = request(json!(1), "tools/list", json!({}), "codex-mcp-client");
    let (_, answer) = message(
        post(&http, &url, "tools/list", None, body)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(answer["result"]["cacheScope"], "private");
    // A client with no profile gets a list fitted to the default budget: its bytes depend on
    // who asked too (codex's says 10 per page, this one 25), so it is private as well.
    let other = request(json!(2), "tools/list", json!({}), "no-such-profile");
    let (_, unknown) = message(
        post(&http, &url, "tools/list", None, other)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(unknown["result"]["cacheScope"], "private", "{unknown:.300}");
    assert_ne!(unknown["result"]["tools"], answer["result"]["tools"]);
    assert!(
        answer["result"]["ttlMs"].as_u64().is_some(),
        "{}",
        answer["result"]["ttlMs"]
    );
    let names: Vec<&str> = answer["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "fleet_show",
            "wave_show",
            "stream_detail",
            "mcp_budget_search"
        ],
        "the server's order"
    );
}

#[tokio::test]
async fn every_result_the_proxy_writes_for_a_modern_request_is_complete() {
    let (_proxy, url) = listen_fleet().await;
    let http = http_client();
    for (n, arguments) in [
        json!({"limit": 500}),
        json!({"after": "not-a-cursor"}),
        json!({"horizon": "all", "detail": "full", "limit": 100}),
    ]
    .into_iter()
    .enumerate()
    {
        let id = json!(format!("r{n}"));
        let body = tools_call(id.clone(), "fleet_show", arguments.clone(), "x");
        let (_, answer) = message(
            post(&http, &url, "tools/call", Some("fleet_show"), body)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(answer["id"], id);
        assert_eq!(
            answer["result"]["resultType"], "complete",
            "{arguments}: {answer}"
        );
        assert_eq!(answer["result"]["isError"], true, "{arguments}: {answer}");
    }
}

#[tokio::test]
async fn modern_headers_are_checked_against_the_body() {
    let (_proxy, url) = listen_fleet().await;
    let http = http_client();
    let call = || tools_call(json!("q-7"), "fleet_show", json!({}), "x");
    let cases: Vec<(reqwest::RequestBuilder, i64)> = vec![
        // The version header missing, or another than _meta's.
        (
            http.post(&url)
                .header("content-type", "application/json")
                .header("accept", "application/json")
                .header("mcp-method", "tools/call")
                .header("mcp-name", "fleet_show")
                .body(call()),
            -32020,
        ),
        (
            post(&http, &url, "tools/call", Some("fleet_show"), call())
                .header("mcp-protocol-version", "2025-11-25"),
            -32020,
        ),
        (post(&http, &url, "tools/list", Some("fleet_show"), call()), -32020),
        (post(&http, &url, "tools/call", None, call()), -32020),
        (post(&http, &url, "tools/call", Some("stream_detail"), call()), -32020),
        // _meta missing.
        (
            post(
                &http,
                &url,
                "tools/call",
                Some("fleet_show"),
                json!({"jsonrpc":"2.0","id":"q-7","method":"tools/call","params":{"name":"fleet_show"}})
                    .to_string(),
            ),
            -32602,
        ),
        // Capabilities missing.
        (
            post(
                &http,
                &url,
                "tools/call",
                Some("fleet_show"),
                json!({"jsonrpc":"2.0","id":"q-7","method":"tools/call","params":{"name":"fleet_show","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}})
                    .to_string(),
            ),
            -32602,
        ),
    ];
    for (n, (builder, code)) in cases.into_iter().enumerate() {
        let (status, answer) = message(builder.send().await.unwrap()).await;
        assert_eq!(status, 400, "case {n}: {answer}");
        assert_eq!(answer["id"], "q-7", "case {n}: the id is echoed: {answer}");
        assert_eq!(answer["error"]["code"], code, "case {n}: {answer}");
    }
    // An unsupported version: -32022 with the versions to try.
    let body = call().replace("2026-07-28", "2099-01-01");
    let (status, answer) = message(
        http.post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .header("mcp-protocol-version", "2099-01-01")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "fleet_show")
            .body(body)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(answer["error"]["code"], -32022, "{answer}");
    assert_eq!(answer["error"]["data"]["supported"][0], "2026-07-28");
    assert_eq!(answer["id"], "q-7");
    // The base64 form of a name is the name.
    let body = tools_call(
        json!(9),
        "stream_detail",
        json!({"stream_id": "st-0001"}),
        "x",
    );
    let (status, answer) = message(
        post(
            &http,
            &url,
            "tools/call",
            Some("=?base64?c3RyZWFtX2RldGFpbA==?="),
            body,
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"]["resultType"], "complete");
    // GET and DELETE: no stream, no session.
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let response = http
            .request(method.clone(), &url)
            .header("accept", "text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 405, "{method}");
        assert_eq!(response.headers()["allow"], "POST");
    }
}

#[tokio::test]
async fn concurrent_modern_requests_with_one_id_each_get_their_own_answer() {
    let (_proxy, url) = listen_fleet().await;
    let http = http_client();
    let big = post(
        &http,
        &url,
        "tools/call",
        Some("fleet_show"),
        tools_call(json!(1), "fleet_show", json!({"format": "csv"}), "x"),
    )
    .send();
    let small = post(
        &http,
        &url,
        "ping",
        None,
        request(json!(1), "ping", json!({}), "x"),
    )
    .send();
    let (big, small) = tokio::join!(big, small);
    let (_, big) = message(big.unwrap()).await;
    let (_, small) = message(small.unwrap()).await;
    assert_eq!(big["id"], 1);
    assert_eq!(small["id"], 1);
    assert!(big["result"]["content"].is_array(), "{big}");
    assert!(small["result"]["content"].is_null(), "{small}");
    // A session id the proxy never gave names nothing.
    let response = post(
        &http,
        &url,
        "ping",
        None,
        request(json!(2), "ping", json!({}), "x"),
    )
    .header("mcp-session-id", "0000")
    .send()
    .await
    .unwrap();
    assert_eq!(response.status(), 404);
}

#[tokio::test]
async fn a_modern_client_over_stdio_is_budgeted_without_initialize() {
    let fleet = example("fleet_server");
    let policy = fleet_policy();
    let mut peer = Peer::proxy(
        &["--policy", policy.to_str().unwrap()],
        &[fleet.to_str().unwrap(), "--streams", "240"],
    );
    let mut sizes = Vec::new();
    for (id, client) in [(1, "codex-mcp-client"), (2, "claude-code")] {
        peer.send(&tools_call(json!(id), "fleet_show", json!({}), client))
            .await;
        let line = peer.recv().await;
        let answer: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(answer["id"], id);
        assert_eq!(answer["result"]["resultType"], "complete");
        // What each model reads: structuredContent.
        sizes.push(answer["result"]["structuredContent"].to_string().len());
    }
    assert!(sizes[0] < 10_000, "{sizes:?}");
    assert!(sizes[1] > 10_000, "{sizes:?}");
    // A proxy-made refusal is complete too.
    peer.send(&tools_call(
        json!(3),
        "fleet_show",
        json!({"limit": 0}),
        "x",
    ))
    .await;
    let answer = peer.recv_json().await;
    assert_eq!(answer["result"]["resultType"], "complete", "{answer}");
    // A legacy client of the same proxy sees no resultType it did not ask for.
    peer.send(r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"fleet_show","arguments":{"limit":0}}}"#).await;
    let answer = peer.recv_json().await;
    assert!(answer["result"].get("resultType").is_none(), "{answer}");
}

/// An rmcp Streamable HTTP server (dual-era) with the fleet's `fleet_show`.
#[derive(Clone)]
struct Fleet;

impl ServerHandler for Fleet {
    fn get_info(&self) -> ServerInfo {
        ServerInfo::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("fleet-http", "0.1.0"))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema: serde_json::Map<String, Value> =
            serde_json::from_value(json!({"type": "object", "properties": {}})).unwrap();
        Ok(ListToolsResult::with_all_items(vec![Tool::new(
            "fleet_show",
            "Show the fleet",
            Arc::new(schema),
        )]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        match request.name.as_ref() {
            "fleet_show" => Ok(CallToolResult::structured(record::fleet_show(120, 7)).into()),
            other => Err(ErrorData::invalid_params(
                format!("unknown tool {other}"),
                Some(json!({"tool": other})),
            )),
        }
    }
}

async fn fleet_http() -> String {
    common::rmcp_http(|| Fleet).await
}

#[derive(Clone, Default)]
struct ModernClient;

impl ClientHandler for ModernClient {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("codex-mcp-client", "1.0.0"),
        )
    }
}

#[tokio::test]
async fn an_rmcp_modern_client_through_listen_and_an_http_upstream() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let upstream = fleet_http().await;
    let (_proxy, url) = common::listen(
        &[
            "--policy",
            fleet_policy().to_str().unwrap(),
            "--upstream",
            &upstream,
        ],
        &[],
    )
    .await;
    let client = ModernClient
        .serve_with_lifecycle(
            StreamableHttpClientTransport::from_uri(url.clone()),
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .expect("a modern session through the proxy");
    let tools = client.list_all_tools().await.unwrap();
    let fleet = tools.iter().find(|t| t.name == "fleet_show").unwrap();
    let properties = fleet.input_schema["properties"].as_object().unwrap();
    assert!(properties.contains_key("horizon") && properties.contains_key("after"));
    let result = client
        .call_tool(CallToolRequestParams::new("fleet_show"))
        .await
        .unwrap();
    let result = serde_json::to_value(result).unwrap();
    assert_eq!(result["structuredContent"]["total_count"], 120);
    // Codex's model reads structuredContent: that is what its budget holds.
    assert!(
        result["structuredContent"].to_string().len() < 10_000,
        "codex's page"
    );
    client.cancel().await.unwrap();

    // The server's own error, as it wrote it: code, message and data.
    let http = http_client();
    let body = tools_call(json!(5), "nope", json!({}), "x");
    let (_, answer) = message(
        post(&http, &url, "tools/call", Some("nope"), body)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(answer["id"], 5);
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert_eq!(answer["error"]["message"], "unknown tool nope");
    assert_eq!(answer["error"]["data"]["tool"], "nope");
}

/// A modern HTTP server that answers every call with the id it was sent, after `delay` for a
/// call whose arguments say `slow`.
struct EchoIds {
    delay: std::time::Duration,
}

impl wiremock::Respond for EchoIds {
    fn respond(&self, request: &wiremock::Request) -> wiremock::ResponseTemplate {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or_default();
        let answer = wiremock::ResponseTemplate::new(200).set_body_json(json!({
            "jsonrpc": "2.0",
            "id": body["id"],
            "result": {
                "resultType": "complete",
                "content": [{"type": "text", "text": body["params"]["arguments"]["n"].to_string()}]
            }
        }));
        match body["params"]["arguments"]["slow"] == true {
            true => answer.set_delay(self.delay),
            false => answer,
        }
    }
}

#[tokio::test]
async fn a_modern_requests_id_goes_upstream_as_written_unless_another_has_it_in_flight() {
    use wiremock::matchers::{header, method};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(header("mcp-method", "server/discover"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "jsonrpc": "2.0",
            "id": "mcp-budget-discover-1",
            "result": {"resultType": "complete", "supportedVersions": ["2026-07-28"],
                       "capabilities": {"tools": {}},
                       "serverInfo": {"name": "echo", "version": "1"}}
        })))
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(header("mcp-method", "tools/call"))
        .respond_with(EchoIds {
            delay: std::time::Duration::from_secs(4),
        })
        .mount(&server)
        .await;
    let upstream = format!("{}/mcp", server.uri());
    let (_proxy, url) = common::listen(&["--policy", "none", "--upstream", &upstream], &[]).await;
    let http = http_client();
    let call = |id: Value, n: u32, slow: bool| {
        post(
            &http,
            &url,
            "tools/call",
            Some("echo"),
            tools_call(id, "echo", json!({"n": n, "slow": slow}), "x"),
        )
        .send()
    };
    let upstream_ids = || async {
        let sent = server.received_requests().await.unwrap_or_default();
        sent.iter()
            .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
            .filter(|b| b["method"] == "tools/call")
            .map(|b| b["id"].clone())
            .collect::<Vec<Value>>()
    };
    // Free: the id goes as the client wrote it, and comes back so.
    let (_, answer) = message(call(json!("c1"), 1, false).await.unwrap()).await;
    assert_eq!(answer["id"], "c1", "{answer}");
    assert_eq!(upstream_ids().await, vec![json!("c1")]);
    // In flight: a second request of the same principal with that id goes under another.
    let slow = tokio::spawn(call(json!(7), 2, true));
    while upstream_ids().await.len() < 2 {
        tokio::task::yield_now().await;
    }
    let (_, quick) = message(call(json!(7), 3, false).await.unwrap()).await;
    let (_, slow) = message(slow.await.unwrap().unwrap()).await;
    assert_eq!(quick["id"], 7, "{quick}");
    assert_eq!(quick["result"]["content"][0]["text"], "3", "{quick}");
    assert_eq!(slow["id"], 7, "{slow}");
    assert_eq!(slow["result"]["content"][0]["text"], "2", "{slow}");
    let ids = upstream_ids().await;
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert_eq!(ids[1], json!(7), "{ids:?}");
    assert_ne!(
        ids[2],
        json!(7),
        "the second 7 went upstream under its own: {ids:?}"
    );
    // Answered, the id is the client's to use again.
    let (_, again) = message(call(json!(7), 4, false).await.unwrap()).await;
    assert_eq!(again["id"], 7, "{again}");
    assert_eq!(again["result"]["content"][0]["text"], "4", "{again}");
}

/// A listen's id used before (its listen ended) is one the relay would send under an id of its
/// own: the listen goes under the proxy's, and its notifications name the client's.
#[tokio::test]
async fn a_listen_under_an_id_used_before_is_acknowledged_under_that_id() {
    let server = example("modern_server");
    let (_proxy, url) = common::listen(
        &["--policy", "none", "--", server.to_str().unwrap()],
        &[("MODERN_RESOURCES", "1")],
    )
    .await;
    let http = http_client();
    for round in 0..2 {
        let body = request(
            json!("watch"),
            "subscriptions/listen",
            json!({"notifications": {"resourceSubscriptions": ["file:///x"]}}),
            "x",
        );
        let response = post(&http, &url, "subscriptions/listen", None, body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let mut events = common::Events::new(response.bytes_stream());
        let ack = events.next().await;
        assert_eq!(
            ack["method"], "notifications/subscriptions/acknowledged",
            "round {round}: {ack}"
        );
        assert_eq!(
            ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "watch",
            "round {round}: {ack}"
        );
        // The server ends its listens: this one's stream ends with its result.
        let ended = post(
            &http,
            &url,
            "tools/call",
            Some("end_listens"),
            tools_call(json!(10 + round), "end_listens", json!({}), "x"),
        )
        .send()
        .await
        .unwrap();
        let (_, ended) = message(ended).await;
        assert!(ended["result"].is_object(), "{ended}");
        let last = events.next().await;
        assert_eq!(last["id"], "watch", "round {round}: {last}");
    }
}

#[tokio::test]
async fn an_http_upstreams_error_status_passes_with_its_json_rpc_error() {
    use wiremock::matchers::{header, method};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    // A modern server that serves another revision: its discover says so, a modern error
    // (so the proxy takes it as modern, and bridges nothing).
    Mock::given(method("POST"))
        .and(header("mcp-method", "server/discover"))
        .respond_with(ResponseTemplate::new(400).set_body_json(json!({
            "jsonrpc": "2.0",
            "id": "mcp-budget-discover-1",
            "error": {"code": -32022, "message": "Unsupported protocol version",
                      "data": {"supported": ["2025-11-25"], "requested": "2026-07-28"}}
        })))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(header("mcp-protocol-version", "2026-07-28"))
        .and(header("mcp-method", "tools/call"))
        .and(header("mcp-name", "fleet_show"))
        .respond_with(ResponseTemplate::new(400).set_body_json(json!({
            "jsonrpc": "2.0",
            "id": "c1",
            "error": {"code": -32022, "message": "Unsupported protocol version",
                      "data": {"supported": ["2025-11-25"], "requested": "2026-07-28"}}
        })))
        .mount(&server)
        .await;
    let upstream = format!("{}/mcp", server.uri());
    let (_proxy, url) = common::listen(&["--policy", "none", "--upstream", &upstream], &[]).await;
    let http = http_client();
    let body = tools_call(json!("c1"), "fleet_show", json!({}), "x");
    let (_, answer) = message(
        post(&http, &url, "tools/call", Some("fleet_show"), body)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(answer["id"], "c1", "{answer}");
    assert_eq!(answer["error"]["code"], -32022, "{answer}");
    assert_eq!(answer["error"]["data"]["supported"][0], "2025-11-25");
}

#[tokio::test]
async fn a_modern_call_before_any_discover_is_budgeted_under_the_servers_builtin_policy() {
    let fleet = example("fleet_server");
    // No --policy: the proxy asks the server who it is on the way (its own server/discover),
    // and the fleet server's built-in policy pages the call; the client sees only its answer.
    let mut peer = Peer::proxy(&[], &[fleet.to_str().unwrap(), "--streams", "240"]);
    peer.send(&tools_call(json!("m1"), "fleet_show", json!({}), "x"))
        .await;
    let answer = peer.recv_json().await;
    assert_eq!(answer["id"], "m1", "{answer:.300}");
    let structured = &answer["result"]["structuredContent"];
    assert_eq!(structured["total_count"], 240);
    assert_eq!(structured["streams"].as_array().unwrap().len(), 25);
    peer.send(&request(json!("m2"), "ping", json!({}), "x"))
        .await;
    let answer = peer.recv_json().await;
    assert_eq!(
        answer["id"], "m2",
        "nothing of the proxy's own reached the client: {answer}"
    );
}

#[tokio::test]
async fn a_legacy_call_sent_before_the_initialize_answer_gets_the_builtin_policy() {
    let fleet = example("fleet_server");
    let mut peer = Peer::proxy(&[], &[fleet.to_str().unwrap(), "--streams", "240"]);
    peer.send(common::INITIALIZE).await;
    peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fleet_show","arguments":{}}}"#).await;
    peer.send(common::INITIALIZED).await;
    let mut call = Value::Null;
    for _ in 0..2 {
        let answer = peer.recv_json().await;
        if answer["id"] == 2 {
            call = answer;
        }
    }
    let structured = &call["result"]["structuredContent"];
    assert_eq!(structured["total_count"], 240, "{call:.300}");
    assert_eq!(structured["streams"].as_array().unwrap().len(), 25);
    assert!(structured["notices"].is_array());
}

/// A modern client's first call through the proxy (no --policy, so the proxy asks the server
/// who it is on the way) to the legacy quirky server, which takes unknown methods as `mode`
/// says; the client's next line.
async fn first_call_to_a_legacy_server(mode: &str) -> Value {
    let quirky = example("quirky_server");
    let mut command = tokio::process::Command::new(common::proxy_bin());
    command.arg("--").arg(&quirky).env("QUIRKY_UNKNOWN", mode);
    let mut peer = Peer::from_command(command);
    peer.send(&tools_call(json!("q1"), "big", json!({"bytes": 100}), "x"))
        .await;
    peer.recv_json().await
}

#[tokio::test]
async fn the_proxys_discover_never_reaches_the_client_whatever_a_legacy_server_makes_of_it() {
    // An error for the unknown method, or silence: the client's own call is answered, and
    // nothing else comes first.
    for mode in ["error", "silent"] {
        let answer = first_call_to_a_legacy_server(mode).await;
        assert_eq!(answer["id"], "q1", "{mode}: {answer}");
        assert_eq!(
            answer["result"]["content"][0]["text"]
                .as_str()
                .map(str::len),
            Some(100),
            "{mode}: {answer}"
        );
    }
    // A server that exits on it: the client's call gets an error, not silence.
    let answer = first_call_to_a_legacy_server("exit").await;
    assert_eq!(answer["id"], "q1", "{answer}");
    assert!(answer["error"]["message"].is_string(), "{answer}");
}

#[tokio::test]
async fn a_stdio_servers_logs_ride_the_stream_of_the_only_request_open() {
    let quirky = example("quirky_server");
    let (_proxy, url) =
        common::listen(&["--policy", "none", "--", quirky.to_str().unwrap()], &[]).await;
    let http = http_client();
    let mut params = json!({"name": "flood", "arguments": {"count": 3, "bytes": 10}});
    params["_meta"] = meta("x");
    params["_meta"]["io.modelcontextprotocol/logLevel"] = json!("info");
    let body =
        json!({"jsonrpc": "2.0", "id": "l1", "method": "tools/call", "params": params}).to_string();
    let response = post(&http, &url, "tools/call", Some("flood"), body)
        .header("accept", "application/json, text/event-stream")
        .send()
        .await
        .unwrap();
    let text = response.text().await.unwrap();
    let messages: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let logs = messages
        .iter()
        .filter(|m| m["method"] == "notifications/message")
        .count();
    assert_eq!(logs, 3, "{text:.600}");
    assert_eq!(messages.last().unwrap()["id"], "l1");
}

#[tokio::test]
async fn what_a_server_said_of_itself_holds_for_every_principal_of_its_origin() {
    use tokio::io::AsyncBufReadExt;
    let fleet = example("fleet_server");
    let mut proxy = tokio::process::Command::new(common::proxy_bin())
        .args([
            "--listen",
            "http://127.0.0.1:0/mcp",
            "--auth-token-env",
            "TOKEN_A",
        ])
        .args(["--auth-token-env", "TOKEN_B", "--"])
        .arg(&fleet)
        .args(["--streams", "240"])
        .env("TOKEN_A", "a-secret")
        .env("TOKEN_B", "b-secret")
        .env("RUST_LOG", "mcp_budget::relay=debug")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = tokio::io::BufReader::new(proxy.stdout.take().unwrap()).lines();
    let url = out
        .next_line()
        .await
        .unwrap()
        .unwrap()
        .replace("listening on ", "");
    let http = http_client();
    for token in ["a-secret", "b-secret"] {
        let body = tools_call(json!(1), "fleet_show", json!({}), "x");
        let (_, answer) = message(
            post(&http, &url, "tools/call", Some("fleet_show"), body)
                .header("authorization", format!("Bearer {token}"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        // Each principal's first call is budgeted under the fleet's built-in policy.
        let structured = &answer["result"]["structuredContent"];
        assert_eq!(
            structured["streams"].as_array().map(Vec::len),
            Some(25),
            "{answer:.300}"
        );
    }
    drop(proxy.kill().await);
    let mut err = tokio::io::BufReader::new(proxy.stderr.take().unwrap()).lines();
    let mut probes = 0;
    while let Ok(Some(line)) = err.next_line().await {
        probes += usize::from(line.contains("asking the server who it is"));
    }
    // The second principal's session (its own server process of the same command) was not
    // asked again: the first one's answer holds for its origin.
    assert_eq!(probes, 1);
}

#[tokio::test]
async fn a_cursor_from_another_principal_is_refused() {
    let (_proxy, url) = common::two_principals().await;
    let http = http_client();
    let call = |token: &'static str, arguments: Value| {
        let body = tools_call(json!(1), "journal", arguments, "x");
        post(&http, &url, "tools/call", Some("journal"), body)
            .header("authorization", format!("Bearer {token}"))
            .send()
    };
    // `journal` has a side effect: a page is served only from the chain's own cache.
    let (_, first) = message(call("a-secret", json!({"lines": 20_000})).await.unwrap()).await;
    let notice = first["result"]["content"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["text"]
        .as_str()
        .unwrap()
        .to_string();
    let start = notice.find("after:\"").expect("a cursor") + 7;
    let cursor = &notice[start..start + notice[start..].find('"').unwrap()];
    let (_, other) = message(
        call("b-secret", json!({"lines": 20_000, "after": cursor}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(other["result"]["isError"], true, "{other:.300}");
    assert_eq!(other["result"]["resultType"], "complete");
    // Its own principal follows it.
    let (_, next) = message(
        call("a-secret", json!({"lines": 20_000, "after": cursor}))
            .await
            .unwrap(),
    )
    .await;
    assert!(
        next["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("entry "),
        "{next:.300}"
    );
}

#[tokio::test]
async fn a_search_with_a_cursor_from_another_principal_finds_nothing_of_it() {
    let (_proxy, url) = common::two_principals().await;
    let http = http_client();
    let call = |token: &'static str, tool: &'static str, arguments: Value| {
        let body = tools_call(json!(1), tool, arguments, "x");
        post(&http, &url, "tools/call", Some(tool), body)
            .header("authorization", format!("Bearer {token}"))
            .send()
    };
    let (_, first) = message(
        call("a-secret", "journal", json!({"lines": 20_000}))
            .await
            .unwrap(),
    )
    .await;
    let cursor = first["result"]["structuredContent"]["next_after"]
        .as_str()
        .map(String::from)
        .unwrap_or_else(|| {
            let notice = first["result"]["content"]
                .as_array()
                .unwrap()
                .last()
                .unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string();
            let start = notice.find("after:\"").expect("a cursor") + 7;
            notice[start..start + notice[start..].find('"').unwrap()].to_string()
        });
    let search = json!({"cursor": cursor, "pattern": "entry 01234"});
    let (_, other) = message(
        call("b-secret", "mcp_budget_search", search.clone())
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(other["result"]["isError"], true, "{other:.300}");
    assert_eq!(other["result"]["resultType"], "complete");
    let (_, own) = message(call("a-secret", "mcp_budget_search", search).await.unwrap()).await;
    assert_eq!(own["result"]["resultType"], "complete", "{own:.300}");
    assert_eq!(
        own["result"]["structuredContent"]["total_matches"], 10,
        "{own:.300}"
    );
}
