//! Streamable HTTP on both sides: real listeners on 127.0.0.1, real rmcp peers, raw HTTP for
//! the security checks, and wiremock for upstream behaviours that are hard to provoke.
#![allow(deprecated)] // rmcp marks sampling deprecated (SEP-2577); MCP clients still use it.

mod common;

#[path = "../examples/fleet/record.rs"]
mod record;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::{Peer, example, gone, handshake};
use futures_util::StreamExt;
use rmcp::model::*;
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ErrorData, RoleClient, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};

const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"sampling":{}},"clientInfo":{"name":"raw","version":"0"}}}"#;

fn fleet_policy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/fleet.toml")
}

/// A policy like fleet.toml whose cursor key is shared through the environment, so that two
/// proxies produce identical cursors.
fn shared_key_policy() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mcp-budget-http-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fleet-shared-key.toml");
    let text = std::fs::read_to_string(fleet_policy()).unwrap().replace(
        "[budget]\n",
        "[budget]\ncursor_key_env = \"MCP_BUDGET_TEST_KEY\"\n",
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// mcp-budget listening on 127.0.0.1:0, with the test environment; the process and its URL.
async fn listen(options: &[&str], server: &[&str]) -> (tokio::process::Child, String) {
    let mut args: Vec<&str> = options.to_vec();
    if !server.is_empty() {
        args.push("--");
        args.extend_from_slice(server);
    }
    common::listen(
        &args,
        &[
            ("MCP_BUDGET_TEST_KEY", "shared secret"),
            ("MCP_TEST_TOKEN", "s3cret"),
        ],
    )
    .await
}

/// reqwest here is built without a default TLS provider (the proxy installs ring at start).
fn tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

// ---- An rmcp server and client ---------------------------------------------------------------

#[derive(Clone)]
struct TestServer {
    streams: usize,
}

impl ServerHandler for TestServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_logging()
                .build(),
        )
        .with_server_info(Implementation::new("http-test-server", "1.0.0"))
    }

    async fn list_tools(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema: JsonObject = serde_json::from_value(json!({"type": "object"})).unwrap();
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new("fleet_show", "Every stream.", schema.clone()),
            Tool::new(
                "work",
                "Reports progress and asks the client to sample.",
                schema,
            ),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        match request.name.as_ref() {
            "fleet_show" => {
                Ok(CallToolResult::structured(record::fleet_show(self.streams, 7)).into())
            }
            "work" => {
                let token = context
                    .meta
                    .get_progress_token()
                    .ok_or_else(|| ErrorData::invalid_params("progress token required", None))?;
                for step in 1..=3 {
                    context
                        .peer
                        .notify_progress(
                            ProgressNotificationParam::new(token.clone(), step as f64)
                                .with_total(3.0),
                        )
                        .await
                        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
                }
                let reply = context
                    .peer
                    .create_message(CreateMessageRequestParams::new(
                        vec![SamplingMessage::user_text("Proceed?")],
                        64,
                    ))
                    .await
                    .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
                let text = reply
                    .message
                    .content
                    .first()
                    .and_then(|c| c.as_text())
                    .map(|t| t.text.clone())
                    .unwrap_or_default();
                Ok(
                    CallToolResult::success(vec![ContentBlock::text(format!("sampled: {text}"))])
                        .into(),
                )
            }
            other => Err(ErrorData::invalid_params(
                format!("unknown tool {other}"),
                None,
            )),
        }
    }
}

/// An rmcp Streamable HTTP server on 127.0.0.1:0; returns its URL.
async fn rmcp_http_server(streams: usize) -> String {
    common::rmcp_http(move || TestServer { streams }).await
}

#[derive(Clone, Default)]
struct TestClient {
    progress: Arc<Mutex<Vec<f64>>>,
    sampled: Arc<Mutex<usize>>,
}

impl ClientHandler for TestClient {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::builder().enable_sampling().build(),
            Implementation::new("http-test-client", "1.0.0"),
        )
    }

    async fn create_message(
        &self,
        _params: CreateMessageRequestParams,
        _ctx: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        *self.sampled.lock().unwrap() += 1;
        Ok(CreateMessageResult::new(
            SamplingMessage::assistant_text("yes"),
            "test-model".to_string(),
        ))
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _ctx: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params.progress);
    }
}

async fn call(
    client: &rmcp::service::RunningService<RoleClient, TestClient>,
    tool: &str,
    arguments: Value,
) -> Value {
    let mut params = CallToolRequestParams::new(tool.to_string());
    if let Value::Object(map) = arguments {
        params = params.with_arguments(map);
    }
    serde_json::to_value(client.call_tool(params).await.unwrap()).unwrap()
}

/// The budget calls whose results must not depend on the transport.
const BUDGET_CALLS: [&str; 3] = [
    r#"{}"#,
    r#"{"format":"csv","limit":10}"#,
    r#"{"state":"blocked","limit":3}"#,
];

async fn budget_results(
    client: &rmcp::service::RunningService<RoleClient, TestClient>,
) -> Vec<Value> {
    let mut out = Vec::new();
    for arguments in BUDGET_CALLS {
        let first = call(
            client,
            "fleet_show",
            serde_json::from_str(arguments).unwrap(),
        )
        .await;
        let next = first["structuredContent"]["next_after"]
            .as_str()
            .map(String::from);
        out.push(without_owner(first));
        if let Some(next) = next {
            let mut arguments: Value = serde_json::from_str(arguments).unwrap();
            arguments["after"] = json!(next);
            out.push(without_owner(call(client, "fleet_show", arguments).await));
        }
    }
    out
}

/// A result with its result references written `mcpb-ref.…`: a reference is sealed to the
/// principal it was shown to (here stdio, there an address), the rest of a page is not.
fn without_owner(result: Value) -> Value {
    let text = result.to_string();
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find("mcpb-ref.") {
        out.push_str(&rest[..at + "mcpb-ref.".len()]);
        rest = &rest[at + "mcpb-ref.".len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || "-_.".contains(c)))
            .unwrap_or(rest.len());
        out.push('…');
        rest = &rest[end..];
    }
    out.push_str(rest);
    serde_json::from_str(&out).unwrap()
}

#[tokio::test]
async fn rmcp_http_client_through_the_proxy_gets_the_same_budget_as_over_stdio() {
    tls();
    let policy = shared_key_policy();
    let fleet = example("fleet_server");
    let (_proxy, url) = listen(
        &["--policy", policy.to_str().unwrap()],
        &[fleet.to_str().unwrap(), "--streams", "240"],
    )
    .await;
    let client = TestClient::default()
        .serve(StreamableHttpClientTransport::from_uri(url))
        .await
        .unwrap();
    let tools = client.list_all_tools().await.unwrap();
    assert!(
        tools
            .iter()
            .any(|t| t.name == "fleet_show" && t.input_schema.contains_key("properties"))
    );
    let over_http = budget_results(&client).await;
    client.cancel().await.unwrap();

    let mut stdio = tokio::process::Command::new(common::proxy_bin());
    stdio
        .env("MCP_BUDGET_TEST_KEY", "shared secret")
        .args(["--policy", policy.to_str().unwrap(), "--"])
        .arg(&fleet)
        .args(["--streams", "240"]);
    let client = TestClient::default()
        .serve(rmcp::transport::TokioChildProcess::new(stdio).unwrap())
        .await
        .unwrap();
    let over_stdio = budget_results(&client).await;
    client.cancel().await.unwrap();

    assert_eq!(over_http.len(), 6);
    assert_eq!(over_http, over_stdio);
    assert_eq!(over_http[0]["structuredContent"]["total_count"], 240);
}

#[tokio::test]
async fn http_to_http_budget_progress_and_sampling() {
    tls();
    let upstream = rmcp_http_server(120).await;
    let policy = fleet_policy();
    let (_proxy, url) = listen(
        &[
            "--policy",
            policy.to_str().unwrap(),
            "--upstream",
            &upstream,
        ],
        &[],
    )
    .await;
    let handler = TestClient::default();
    let client = handler
        .clone()
        .serve(StreamableHttpClientTransport::from_uri(url))
        .await
        .unwrap();
    let page = call(&client, "fleet_show", json!({})).await;
    assert_eq!(page["structuredContent"]["total_count"], 120);
    assert_eq!(
        page["structuredContent"]["streams"]
            .as_array()
            .unwrap()
            .len(),
        25
    );
    let work = call(&client, "work", json!({})).await;
    assert_eq!(work["content"][0]["text"], "sampled: yes");
    assert_eq!(*handler.progress.lock().unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(*handler.sampled.lock().unwrap(), 1);
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn over_http_upstream_a_calls_sampling_request_rides_that_calls_stream_not_the_get_stream() {
    tls();
    let upstream = rmcp_http_server(20).await;
    let (_proxy, url) = listen(&["--policy", "none", "--upstream", &upstream], &[]).await;
    let session = initialize(&url).await;
    // With a GET stream open, a server message that names no request would go there; the
    // sampling request came on the upstream stream of the call: it belongs to the call's stream.
    let get = common::mcp_get(&http(), &url, &session, None).await;
    assert_eq!(get.status(), 200);
    let get_events = sse_stream::SseStream::from_bytes_stream(get.bytes_stream());
    let call = r#"{"jsonrpc":"2.0","id":"w1","method":"tools/call","params":{"name":"work","arguments":{},"_meta":{"progressToken":"wp"}}}"#;
    let response = post(&url, Some(&session), call).send().await.unwrap();
    let mut events = sse_stream::SseStream::from_bytes_stream(response.bytes_stream());
    let mut on_post = Vec::new();
    while let Some(event) = tokio::time::timeout(common::PATIENCE, events.next())
        .await
        .unwrap()
    {
        let Some(data) = event.unwrap().data.filter(|d| !d.trim().is_empty()) else {
            continue;
        };
        let message: Value = serde_json::from_str(&data).unwrap();
        if message["method"] == "sampling/createMessage" {
            let answer = json!({"jsonrpc": "2.0", "id": message["id"], "result": {"role": "assistant", "content": {"type": "text", "text": "yes"}, "model": "m"}});
            let ack = post(&url, Some(&session), &answer.to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(ack.status(), 202);
        }
        on_post.push(
            message["method"]
                .as_str()
                .map_or_else(|| format!("response {}", message["id"]), String::from),
        );
    }
    assert_eq!(
        on_post,
        [
            "notifications/progress",
            "notifications/progress",
            "notifications/progress",
            "sampling/createMessage",
            "response \"w1\""
        ]
    );
    // (Had the sampling request gone to the open GET stream, the call would never have been
    // answered on this one.)
    drop(get_events);
}

#[tokio::test]
async fn stdio_to_http_budget_progress_and_sampling() {
    tls();
    let upstream = rmcp_http_server(120).await;
    let mut proxy = tokio::process::Command::new(common::proxy_bin());
    proxy.args([
        "--policy",
        fleet_policy().to_str().unwrap(),
        "--upstream",
        &upstream,
    ]);
    let handler = TestClient::default();
    let client = handler
        .clone()
        .serve(rmcp::transport::TokioChildProcess::new(proxy).unwrap())
        .await
        .unwrap();
    let page = call(&client, "fleet_show", json!({"format": "csv", "limit": 5})).await;
    assert_eq!(
        page["content"][0]["text"].as_str().unwrap().lines().count(),
        6
    );
    let work = call(&client, "work", json!({})).await;
    assert_eq!(work["content"][0]["text"], "sampled: yes");
    assert_eq!(*handler.progress.lock().unwrap(), vec![1.0, 2.0, 3.0]);
    client.cancel().await.unwrap();
}

// ---- Raw HTTP: routing over SSE, sessions, security -------------------------------------------

fn http() -> reqwest::Client {
    reqwest::Client::new()
}

fn post(url: &str, session: Option<&str>, body: &str) -> reqwest::RequestBuilder {
    common::mcp_post(&http(), url, session, body)
}

async fn initialize(url: &str) -> String {
    common::mcp_initialize(&http(), url).await
}

#[tokio::test]
async fn progress_and_a_sampling_request_ride_the_calls_sse_stream() {
    tls();
    let quirky = example("quirky_server");
    let (_proxy, url) = listen(&[], &[quirky.to_str().unwrap()]).await;
    let session = initialize(&url).await;
    let call = r#"{"jsonrpc":"2.0","id":"c1","method":"tools/call","params":{"name":"report","arguments":{"quarter":"Q3"},"_meta":{"progressToken":"p-1"}}}"#;
    let response = post(&url, Some(&session), call).send().await.unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut events = sse_stream::SseStream::from_bytes_stream(response.bytes_stream());
    let mut next = async || -> Value {
        loop {
            let event = tokio::time::timeout(common::PATIENCE, events.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            if let Some(data) = event.data.filter(|d| !d.is_empty()) {
                return serde_json::from_str(&data).unwrap();
            }
        }
    };
    assert_eq!(next().await["params"]["progress"], 1);
    assert_eq!(next().await["params"]["progress"], 2);
    assert_eq!(next().await["method"], "notifications/message");
    let sampling = next().await;
    assert_eq!(sampling["method"], "sampling/createMessage");
    // The client answers the server's request with a POST of its own.
    let answer = json!({"jsonrpc": "2.0", "id": sampling["id"], "result": {"role": "assistant", "content": {"type": "text", "text": "fine"}, "model": "m"}});
    let ack = post(&url, Some(&session), &answer.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(ack.status(), 202);
    assert_eq!(next().await["params"]["progress"], 3);
    let result = next().await;
    assert_eq!(result["id"], "c1");
    assert_eq!(result["result"]["content"][0]["text"], "Q3: fine café");
    // The stream ends after the response.
    assert!(
        tokio::time::timeout(common::PATIENCE, events.next())
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn json_only_clients_get_json_and_delete_ends_the_child() {
    tls();
    let quirky = example("quirky_server");
    let (proxy, url) = listen(&[], &[quirky.to_str().unwrap()]).await;
    let session = initialize(&url).await;
    let response = http()
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-06-18")
        .body(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["content-type"], "application/json");
    assert_eq!(
        response.text().await.unwrap(),
        r#"{"jsonrpc":"2.0","id":2,"result":{}}"#
    );

    let child = common::wait_for_child(proxy.id().unwrap()).await;
    assert!(common::alive(child));
    let deleted = http()
        .delete(&url)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert!(
        gone(child).await,
        "the session's server {child} outlived DELETE"
    );
    let after = post(
        &url,
        Some(&session),
        r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(after.status(), 404);
}

#[tokio::test]
async fn each_refusal_has_its_status() {
    tls();
    let quirky = example("quirky_server");
    let server = [quirky.to_str().unwrap()];
    let (_proxy, url) = listen(
        &[
            "--auth-token-env",
            "MCP_TEST_TOKEN",
            "--max-sessions",
            "1",
            "--max-message-bytes",
            "2000",
        ],
        &server,
    )
    .await;
    let authed =
        |request: reqwest::RequestBuilder| request.header("authorization", "Bearer s3cret");

    // No token, or a wrong one: 401 with a challenge.
    let response = post(&url, None, INIT).send().await.unwrap();
    assert_eq!(response.status(), 401);
    assert!(
        response.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Bearer")
    );
    assert_eq!(
        post(&url, None, INIT)
            .header("authorization", "Bearer nope")
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    // A foreign Origin, or a Host that is not ours (DNS rebinding): 403.
    assert_eq!(
        authed(post(&url, None, INIT))
            .header("origin", "https://evil.example")
            .send()
            .await
            .unwrap()
            .status(),
        403
    );
    assert_eq!(
        authed(post(&url, None, INIT))
            .header("host", "evil.example")
            .send()
            .await
            .unwrap()
            .status(),
        403
    );
    // A local Origin is fine.
    let response = authed(post(&url, None, INIT))
        .header("origin", "http://localhost:3000")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let _ = response.text().await;
    // The session cap: 503 with a clear body.
    let response = authed(post(&url, None, INIT)).send().await.unwrap();
    assert_eq!(response.status(), 503);
    assert!(response.text().await.unwrap().contains("too many sessions"));
    // Body over the limit: 413.
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":9,"method":"ping","params":{{"pad":"{}"}}}}"#,
        "x".repeat(5000)
    );
    assert_eq!(
        authed(post(&url, Some(&session), &big))
            .send()
            .await
            .unwrap()
            .status(),
        413
    );
    // No session header: 400; an unknown one: 404.
    let ping = r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#;
    assert_eq!(
        authed(post(&url, None, ping))
            .send()
            .await
            .unwrap()
            .status(),
        400
    );
    assert_eq!(
        authed(post(&url, Some("nope"), ping))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    // A protocol version the proxy does not know: 400.
    let response = authed(post(&url, Some(&session), ping))
        .header("mcp-protocol-version", "1999-01-01")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let response = authed(post(&url, Some(&session), ping))
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        200,
        "another supported version is accepted, as the reference server does"
    );
    let _ = response.text().await;
    let response = authed(post(&url, Some(&session), ping))
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

// ---- The upstream client's connections --------------------------------------------------------

/// A raw HTTP/1.1 MCP responder on 127.0.0.1:0 that counts the connections it accepts; with
/// `close_after_each`, it answers as if keeping the connection alive and then closes it (the
/// race a pooled connection must survive). Returns its URL and the count.
async fn counting_server(close_after_each: bool) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                loop {
                    // One request: the head, then content-length bytes of body.
                    let head_end = loop {
                        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                            break at + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buffer[..head_end]).to_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buffer.len() < head_end + length {
                        let mut chunk = [0u8; 4096];
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body: Vec<u8> = buffer.drain(..head_end + length).skip(head_end).collect();
                    let reply = match serde_json::from_slice::<Value>(&body) {
                        _ if head.starts_with("get ") => {
                            "HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n"
                                .to_string()
                        }
                        Ok(message) if message.get("id").is_some() => {
                            let answer =
                                json!({"jsonrpc": "2.0", "id": message["id"], "result": {}})
                                    .to_string();
                            format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
                                answer.len()
                            )
                        }
                        _ => "HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n".to_string(),
                    };
                    if stream.write_all(reply.as_bytes()).await.is_err() || close_after_each {
                        return;
                    }
                }
            });
        }
    });
    (url, accepted)
}

#[tokio::test]
async fn the_upstream_connection_is_kept_alive_and_a_closed_one_replaced() {
    use std::sync::atomic::Ordering;
    const CALLS: u64 = 40;
    for close_after_each in [false, true] {
        let (url, accepted) = counting_server(close_after_each).await;
        let mut peer = Peer::spawn(common::proxy_bin(), &["--upstream", &url]);
        handshake(&mut peer).await;
        for id in 0..CALLS {
            peer.send(&format!(
                r#"{{"jsonrpc":"2.0","id":{},"method":"ping"}}"#,
                100 + id
            ))
            .await;
            assert_eq!(
                peer.recv().await,
                format!(r#"{{"jsonrpc":"2.0","id":{},"result":{{}}}}"#, 100 + id),
                "every call is answered (server closing each connection: {close_after_each})"
            );
        }
        let connections = accepted.load(Ordering::SeqCst);
        if close_after_each {
            // initialize, initialized, the GET attempt and every call: each on a new connection.
            assert!(connections as u64 >= CALLS, "{connections} connections");
        } else {
            // One for the exchanges, one the GET stream's attempt may have taken.
            assert!(
                connections <= 2,
                "{connections} connections for {CALLS} calls"
            );
        }
    }
}

// ---- Upstream behaviours, with wiremock -------------------------------------------------------

mod upstream {
    use super::*;
    use wiremock::matchers::{body_partial_json, header, method};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    fn json_reply(id: u64, result: Value) -> ResponseTemplate {
        ResponseTemplate::new(200).set_body_raw(
            json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string(),
            "application/json",
        )
    }

    async fn mock_with_session(server: &MockServer, session: &str) {
        Mock::given(method("POST"))
            .and(body_partial_json(json!({"method": "initialize"})))
            .respond_with(
                ResponseTemplate::new(200)
                    .insert_header("mcp-session-id", session)
                    .set_body_raw(json!({"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": {"name": "mock", "version": "1"}}}).to_string(), "application/json"),
            )
            .mount(server)
            .await;
        Mock::given(method("POST"))
            .and(body_partial_json(
                json!({"method": "notifications/initialized"}),
            ))
            .respond_with(ResponseTemplate::new(202))
            .mount(server)
            .await;
        Mock::given(method("GET"))
            .respond_with(ResponseTemplate::new(405))
            .mount(server)
            .await;
        Mock::given(method("DELETE"))
            .respond_with(ResponseTemplate::new(204))
            .mount(server)
            .await;
    }

    async fn proxy_to(server: &MockServer) -> Peer {
        let mut peer = Peer::spawn(
            common::proxy_bin(),
            &["--upstream", &format!("{}/mcp", server.uri())],
        );
        handshake(&mut peer).await;
        peer
    }

    #[tokio::test]
    async fn json_and_sse_answers_and_static_headers() {
        tls();
        let server = MockServer::start().await;
        mock_with_session(&server, "s1").await;
        Mock::given(method("POST"))
            .and(header("x-api-key", "k-123"))
            .and(header("mcp-session-id", "s1"))
            .and(header("mcp-protocol-version", "2025-06-18"))
            .and(body_partial_json(json!({"method": "ping"})))
            .respond_with(json_reply(2, json!({})))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(body_partial_json(json!({"method": "tools/list"})))
            .respond_with(ResponseTemplate::new(200).set_body_raw(
                "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"listing\"}}\n\nid: 7\ndata: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"tools\":[]}}\n\n",
                "text/event-stream",
            ))
            .mount(&server)
            .await;
        let mut peer = proxy_to_with_key(&server).await;
        peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#)
            .await;
        assert_eq!(peer.recv().await, r#"{"jsonrpc":"2.0","id":2,"result":{}}"#);
        peer.send(r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#)
            .await;
        assert_eq!(peer.recv_json().await["method"], "notifications/message");
        assert_eq!(
            peer.recv().await,
            r#"{"jsonrpc":"2.0","id":3,"result":{"tools":[]}}"#
        );
    }

    async fn proxy_to_with_key(server: &MockServer) -> Peer {
        let mut command = tokio::process::Command::new(common::proxy_bin());
        command
            .args([
                "--upstream",
                &format!("{}/mcp", server.uri()),
                "--upstream-header",
                "X-Api-Key: ${MCP_BUDGET_TEST_API_KEY}",
            ])
            .env("MCP_BUDGET_TEST_API_KEY", "k-123");
        let mut peer = Peer::from_command(command);
        handshake(&mut peer).await;
        peer
    }

    #[tokio::test]
    async fn an_expired_session_is_reopened_and_the_request_retried_once() {
        tls();
        let server = MockServer::start().await;
        // The first initialize gets s1, the replayed one s2.
        Mock::given(method("POST"))
            .and(body_partial_json(json!({"method": "initialize"})))
            .respond_with(ResponseTemplate::new(200).insert_header("mcp-session-id", "s1").set_body_raw(
                json!({"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": {"name": "mock", "version": "1"}}}).to_string(),
                "application/json",
            ))
            .up_to_n_times(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(body_partial_json(json!({"method": "initialize"})))
            .respond_with(ResponseTemplate::new(200).insert_header("mcp-session-id", "s2").set_body_raw(
                json!({"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": {"name": "mock", "version": "1"}}}).to_string(),
                "application/json",
            ))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(body_partial_json(
                json!({"method": "notifications/initialized"}),
            ))
            .respond_with(ResponseTemplate::new(202))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .respond_with(ResponseTemplate::new(405))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(header("mcp-session-id", "s1"))
            .and(body_partial_json(json!({"method": "tools/call"})))
            .respond_with(ResponseTemplate::new(404))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(header("mcp-session-id", "s2"))
            .and(body_partial_json(json!({"method": "tools/call"})))
            .respond_with(json_reply(
                5,
                json!({"content": [{"type": "text", "text": "done"}]}),
            ))
            .mount(&server)
            .await;
        // Subscribed to a and b, then not to b: the renewed session is subscribed to a again.
        let subscriptions = [
            (3, "resources/subscribe", "file:///a"),
            (4, "resources/subscribe", "file:///b"),
            (6, "resources/unsubscribe", "file:///b"),
        ];
        for session in ["s1", "s2"] {
            for (id, method_name, uri) in subscriptions {
                Mock::given(method("POST"))
                    .and(header("mcp-session-id", session))
                    .and(body_partial_json(
                        json!({"method": method_name, "params": {"uri": uri}}),
                    ))
                    .respond_with(json_reply(id, json!({})))
                    .mount(&server)
                    .await;
            }
        }
        let mut peer = proxy_to(&server).await;
        for (id, method_name, uri) in subscriptions {
            let request =
                json!({"jsonrpc": "2.0", "id": id, "method": method_name, "params": {"uri": uri}});
            peer.send(&request.to_string()).await;
            assert_eq!(peer.recv_json().await["result"], json!({}));
        }
        peer.send(r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"t","arguments":{}}}"#).await;
        let mut got = [peer.recv_json().await, peer.recv_json().await];
        got.sort_by_key(|m| m.get("id").is_some());
        assert_eq!(got[0]["method"], "notifications/message");
        assert!(
            got[0]["params"]["data"]
                .as_str()
                .unwrap()
                .contains("nothing was lost")
        );
        assert_eq!(
            got[1],
            json!({"jsonrpc": "2.0", "id": 5, "result": {"content": [{"type": "text", "text": "done"}]}})
        );
        // The replayed initialize was the client's own.
        let inits = server
            .received_requests()
            .await
            .unwrap()
            .into_iter()
            .filter(|r| String::from_utf8_lossy(&r.body).contains("\"initialize\""))
            .count();
        assert_eq!(inits, 2);
        let again: Vec<Value> = server
            .received_requests()
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.headers.get("mcp-session-id").is_some_and(|v| v == "s2"))
            .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
            .filter(|m| m["method"] == "resources/subscribe")
            .collect();
        assert_eq!(again.len(), 1, "{again:?}");
        assert_eq!(again[0]["params"]["uri"], "file:///a");
    }

    #[tokio::test]
    async fn server_errors_and_broken_streams_become_json_rpc_errors() {
        tls();
        let server = MockServer::start().await;
        mock_with_session(&server, "s1").await;
        Mock::given(method("POST"))
            .and(body_partial_json(json!({"params": {"name": "boom"}})))
            .respond_with(ResponseTemplate::new(503).set_body_string("upstream overloaded"))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(body_partial_json(json!({"params": {"name": "torn"}})))
            .respond_with(ResponseTemplate::new(200).set_body_raw(
                "data: {\"jsonrpc\":\"2.0\",\"id\":7,\"res",
                "text/event-stream",
            ))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(body_partial_json(json!({"params": {"name": "empty"}})))
            .respond_with(ResponseTemplate::new(200).set_body_raw("", "application/json"))
            .mount(&server)
            .await;
        let mut peer = proxy_to(&server).await;
        peer.send(r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"boom"}}"#)
            .await;
        let error = peer.recv_json().await;
        assert_eq!(error["id"], 6);
        assert_eq!(
            error["error"]["message"],
            "the upstream server answered HTTP 503 Service Unavailable: upstream overloaded"
        );
        peer.send(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"torn"}}"#)
            .await;
        let error = peer.recv_json().await;
        assert_eq!(error["id"], 7);
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("the upstream server's event stream"),
            "{error}"
        );
        peer.send(r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"empty"}}"#)
            .await;
        let error = peer.recv_json().await;
        assert_eq!(error["id"], 8);
        assert_eq!(
            error["error"]["message"],
            "the upstream server's HTTP response did not contain the answer"
        );
    }

    #[tokio::test]
    async fn the_upstream_get_stream_delivers_server_notifications() {
        tls();
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(header("mcp-session-id", "s-get"))
            .respond_with(ResponseTemplate::new(200).set_body_raw(
                "id: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n\n",
                "text/event-stream",
            ))
            .mount(&server)
            .await;
        mock_with_session(&server, "s-get").await;
        let mut peer = proxy_to(&server).await;
        // After initialized, the proxy opens the GET stream; what the server sends there arrives.
        assert_eq!(
            peer.recv().await,
            r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#
        );
    }

    #[tokio::test]
    async fn the_upstream_session_is_deleted_when_the_proxy_stops() {
        tls();
        let server = MockServer::start().await;
        mock_with_session(&server, "s-del").await;
        let mut peer = proxy_to(&server).await;
        peer.close_stdin();
        assert!(peer.wait().await.success());
        let requests = server.received_requests().await.unwrap();
        let deleted = requests.iter().any(|r| {
            r.method.as_str() == "DELETE"
                && r.headers
                    .get("mcp-session-id")
                    .and_then(|v| v.to_str().ok())
                    == Some("s-del")
        });
        assert!(deleted, "no DELETE for the upstream session: {requests:?}");
    }

    #[tokio::test]
    async fn a_missing_upstream_header_variable_stops_the_start_with_its_name() {
        let out = common::run([
            "--upstream",
            "http://127.0.0.1:9/mcp",
            "--upstream-header",
            "Authorization: Bearer ${MCP_BUDGET_SURELY_UNSET_VAR}",
        ]);
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--upstream-header Authorization: the environment variable MCP_BUDGET_SURELY_UNSET_VAR is not set"),
            "{stderr}"
        );
    }

    #[tokio::test]
    async fn upstream_header_secrets_stay_out_of_recordings() {
        tls();
        let server = MockServer::start().await;
        mock_with_session(&server, "s-rec").await;
        Mock::given(method("POST"))
            .and(body_partial_json(json!({"method": "ping"})))
            .respond_with(json_reply(2, json!({})))
            .mount(&server)
            .await;
        let dir = std::env::temp_dir().join(format!("mcp-budget-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let recording = dir.join("secret.jsonl");
        let mut command = tokio::process::Command::new(common::proxy_bin());
        command
            .args([
                "record",
                "--out",
                recording.to_str().unwrap(),
                "--upstream",
                &format!("{}/mcp", server.uri()),
                "--upstream-header",
                "Authorization: Bearer ${MCP_BUDGET_TEST_SECRET}",
            ])
            .env("MCP_BUDGET_TEST_SECRET", "hunter2-very-secret");
        let mut peer = Peer::from_command(command);
        handshake(&mut peer).await;
        peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#)
            .await;
        assert_eq!(peer.recv().await, r#"{"jsonrpc":"2.0","id":2,"result":{}}"#);
        peer.close_stdin();
        assert!(peer.wait().await.success());
        // The secret went upstream, and nowhere near the recording.
        let sent = server.received_requests().await.unwrap();
        assert!(sent.iter().any(
            |r| r.headers.get("authorization").and_then(|v| v.to_str().ok())
                == Some("Bearer hunter2-very-secret")
        ));
        let text = std::fs::read_to_string(&recording).unwrap();
        assert!(
            text.contains(r#""method":"ping""#),
            "the recording has the session"
        );
        assert!(!text.contains("hunter2"), "the secret is in the recording");
    }

    #[tokio::test]
    async fn an_unreachable_upstream_fails_each_request_clearly() {
        tls();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}/mcp"); // nothing listens there any more
        let mut peer = Peer::spawn(common::proxy_bin(), &["--upstream", &url]);
        peer.send(common::INITIALIZE).await;
        let error = peer.recv_json().await;
        assert_eq!(error["id"], 1);
        let message = error["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("could not reach the upstream server at {url}")),
            "{message}"
        );
    }
}

#[tokio::test]
async fn each_session_has_its_own_server_and_idle_sessions_end() {
    tls();
    let quirky = example("quirky_server");
    let (proxy, url) = listen(&["--session-idle-secs", "1"], &[quirky.to_str().unwrap()]).await;
    let first = initialize(&url).await;
    let second = initialize(&url).await;
    assert_ne!(first, second);
    let pid = proxy.id().unwrap();
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    let servers = loop {
        let servers = common::children(pid);
        if servers.len() == 2 || tokio::time::Instant::now() > deadline {
            break servers;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert_eq!(servers.len(), 2, "one server per session");
    for server in servers {
        assert!(
            gone(server).await,
            "idle session's server {server} still runs"
        );
    }
    let ping = r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#;
    assert_eq!(
        post(&url, Some(&first), ping)
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
}

#[tokio::test]
async fn sigterm_ends_the_listener_and_every_session() {
    tls();
    let quirky = example("quirky_server");
    let (mut proxy, url) = listen(&[], &[quirky.to_str().unwrap()]).await;
    initialize(&url).await;
    let server = common::wait_for_child(proxy.id().unwrap()).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(proxy.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(common::PATIENCE, proxy.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    assert!(gone(server).await);
}

/// In-process: `serve` takes a listener the caller bound (port 0) and a shutdown future, and
/// returns only after every session task ended — the session's server is gone by then.
#[tokio::test]
async fn serve_takes_a_bound_listener_and_shutdown_awaits_every_session() {
    use mcp_budget::budget::Budget;
    use mcp_budget::listen::{self, ListenOptions};
    use mcp_budget::policy::Policy;
    use mcp_budget::upstream::UpstreamSpec;
    tls();
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = reqwest::Url::parse(&format!("http://{}/mcp", tcp.local_addr().unwrap())).unwrap();
    let quirky = example("quirky_server").to_str().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(listen::serve(
        tcp,
        ListenOptions::new(url.clone()),
        UpstreamSpec::Command(vec![quirky]),
        mcp_budget::reload::Shared::new(Arc::new(Budget::new(Policy::default()))),
        async move {
            let _ = stopped.await;
        },
    ));
    let before = common::children(std::process::id());
    let session = common::mcp_initialize(&http(), url.as_str()).await;
    assert!(!session.is_empty());
    let server = common::children(std::process::id())
        .into_iter()
        .find(|pid| !before.contains(pid))
        .expect("the session's server runs as our child");
    stop.send(()).unwrap();
    tokio::time::timeout(common::PATIENCE, serving)
        .await
        .expect("serve returned after the shutdown signal")
        .unwrap()
        .unwrap();
    assert!(
        !common::alive(server),
        "serve returned while the session's server still ran"
    );
}

/// The listener with `options` in front of a 12-stream fleet server.
async fn listen_fleet(options: &[&str]) -> (tokio::process::Child, String) {
    tls();
    let fleet = example("fleet_server");
    let mut args = options.to_vec();
    args.extend(["--", fleet.to_str().unwrap(), "--streams", "12"]);
    common::listen(&args, &[]).await
}

#[tokio::test]
async fn a_client_over_its_rate_limit_gets_429_with_retry_after_and_others_go_on() {
    let (_proxy, url) = listen_fleet(&["--rate-limit", "5"]).await;
    let session = initialize(&url).await;
    // initialize and initialized took 2 of the burst of 10; the next ones run out.
    let mut statuses = Vec::new();
    let mut retry_after = None;
    let mut message = String::new();
    // 60 requests: without a limit they would all be served (no refill in that time could
    // cover 50 over the burst).
    for id in 10..70 {
        let response = post(
            &url,
            Some(&session),
            &format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#),
        )
        .send()
        .await
        .unwrap();
        let status = response.status().as_u16();
        if status == 429 && retry_after.is_none() {
            retry_after = response
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_string());
            message = response.text().await.unwrap();
        } else {
            let _ = response.text().await;
        }
        statuses.push(status);
    }
    let served = statuses.iter().filter(|s| **s == 200).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    // The rest of the burst is served whatever the timing; then refusals, with refills between.
    assert!(statuses[..8].iter().all(|s| *s == 200), "{statuses:?}");
    assert!(refused > 0, "{statuses:?}");
    assert_eq!(served + refused, statuses.len(), "{statuses:?}");
    let seconds: u64 = retry_after.expect("Retry-After").parse().unwrap();
    assert!(seconds >= 1, "{seconds}");
    assert!(message.contains("--rate-limit"), "{message}");
    // Bad values are refused at start.
    let out = common::run([
        "--listen",
        "http://127.0.0.1:0/mcp",
        "--rate-limit=-1",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--rate-limit -1"));
}

#[tokio::test]
async fn past_max_children_a_new_session_gets_503_and_the_open_one_goes_on() {
    let (_proxy, url) = listen_fleet(&["--max-children", "1"]).await;
    let first = initialize(&url).await;
    let second = post(&url, None, common::INITIALIZE).send().await.unwrap();
    assert_eq!(second.status(), 503);
    let text = second.text().await.unwrap();
    assert!(text.contains("--max-children"), "{text}");
    let ping = post(
        &url,
        Some(&first),
        r#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(ping.status(), 200);
}

#[tokio::test]
async fn the_rate_limit_counts_get_and_delete_too() {
    let (_proxy, url) = listen_fleet(&["--rate-limit", "5"]).await;
    let session = initialize(&url).await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    // Burst of 10, 2 taken by the handshake: 40 GET streams opened (and dropped) in a row
    // cannot all pass.
    let mut statuses = Vec::new();
    for _ in 0..40 {
        let response = common::mcp_get(&http, &url, &session, None).await;
        statuses.push(response.status().as_u16());
    }
    assert!(statuses.contains(&429), "GET is not limited: {statuses:?}");
    let response = http
        .delete(&url)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429, "DELETE is not limited");
    assert!(response.headers().contains_key("retry-after"));
}

/// The result of a `tools/call` answered in a POST's body (JSON or SSE).
async fn call_result(url: &str, session: &str, id: u64, tool: &str, arguments: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}});
    let text = post(url, Some(session), &body.to_string())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let message: Value = match serde_json::from_str(&text) {
        Ok(value) => value,
        Err(_) => text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find(|m| m["id"] == id)
            .unwrap_or_else(|| panic!("no answer in {text:.300}")),
    };
    message["result"].clone()
}

/// The cursor of an automatically paged result (in its last text block).
fn auto_cursor(result: &Value) -> String {
    let notice = result["content"].as_array().unwrap().last().unwrap()["text"]
        .as_str()
        .unwrap()
        .to_string();
    let start = notice.find("after:\"").expect("a cursor") + 7;
    notice[start..start + notice[start..].find('"').unwrap()].to_string()
}

#[tokio::test]
async fn one_session_flooding_the_cache_never_evicts_another_sessions_chain() {
    tls();
    let quirky = example("quirky_server");
    let (_proxy, url) = listen(
        &["--policy", "none", "--cache-bytes", "8000000"],
        &[quirky.to_str().unwrap()],
    )
    .await;
    let (victim, flood) = (initialize(&url).await, initialize(&url).await);
    // `journal` has a side effect: a page that left the cache is refused, never re-run.
    let first = call_result(&url, &victim, 2, "journal", json!({"lines": 20_000})).await;
    let cursor = auto_cursor(&first);
    // Twelve results of about a megabyte each from another session: 1.5 times the cache.
    for n in 0..12u64 {
        let page = call_result(
            &url,
            &flood,
            10 + n,
            "journal",
            json!({"lines": 30_000 + n}),
        )
        .await;
        assert!(page["content"].is_array());
    }
    let next = call_result(
        &url,
        &victim,
        3,
        "journal",
        json!({"lines": 20_000, "after": cursor}),
    )
    .await;
    let text = next["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("entry "),
        "the victim's next page was lost: {text:.300}"
    );
}

#[tokio::test]
async fn two_posts_with_ids_equal_as_values_never_get_each_others_answers() {
    tls();
    let (_proxy, url) = listen(
        &["--policy", "none"],
        &[example("fleet_server").to_str().unwrap(), "--streams", "68"],
    )
    .await;
    let session = initialize(&url).await;
    let call = r#"{"jsonrpc":"2.0","id":"\u0061","method":"tools/call","params":{"name":"fleet_show","arguments":{}}}"#;
    let ping = r#"{"jsonrpc":"2.0","id":"a","method":"ping"}"#;
    let (a, b) = tokio::join!(
        post(&url, Some(&session), call).send(),
        post(&url, Some(&session), ping).send()
    );
    let (a, b) = (
        a.unwrap().text().await.unwrap(),
        b.unwrap().text().await.unwrap(),
    );
    let answer = |text: &str| -> String {
        text.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .find(|d| d.contains("\"id\""))
            .unwrap_or(text)
            .to_string()
    };
    let (a, b) = (answer(&a), answer(&b));
    // Each POST gets its own answer, under its own spelling; the paged result stays paged.
    assert!(
        a.starts_with(r#"{"jsonrpc":"2.0","id":"\u0061","#),
        "{:.200}",
        a
    );
    assert!(b.starts_with(r#"{"jsonrpc":"2.0","id":"a","#), "{:.200}", b);
    assert!(
        a.len() < 200_000 && b.len() < 200_000,
        "{} and {} bytes",
        a.len(),
        b.len()
    );
    // The ping came second or first: either it was answered, or refused as an id in flight.
    assert!(
        b.contains("\"result\"") || b.contains("already used by a request in flight"),
        "{b}"
    );
}
