//! Operating the proxy: `--metrics` (a scripted session against the fleet example through the
//! real binary, then a scrape of `/metrics`, parsed as the Prometheus text format, with every
//! counter checked against the exact amounts the session caused) and `--otlp-endpoint` (a
//! minimal OTLP/HTTP receiver on loopback: one span per request, with the tool, the bytes, the
//! budget's decision and the caller's trace context, which reaches the server unchanged).

mod common;

use std::collections::HashMap;

use common::{Peer, example, handshake};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

/// One sample: metric name and labels → value.
type Samples = HashMap<(String, Vec<(String, String)>), f64>;

/// Parses an exposition in the Prometheus/OpenMetrics text format; panics on any line that is
/// not a comment (`# HELP`, `# TYPE`, `# UNIT`, `# EOF`) or a well-formed sample.
fn parse(text: &str) -> Samples {
    let mut samples = Samples::new();
    let mut types = HashMap::new();
    assert!(text.ends_with("# EOF\n"), "no # EOF at the end");
    for line in text.lines() {
        if let Some(comment) = line.strip_prefix("# ") {
            let mut parts = comment.splitn(3, ' ');
            let kind = parts.next().unwrap();
            match kind {
                "EOF" => continue,
                "HELP" | "UNIT" => {
                    assert!(parts.next().is_some(), "{line}");
                }
                "TYPE" => {
                    let name = parts.next().unwrap().to_string();
                    let ty = parts.next().unwrap();
                    assert!(["counter", "gauge", "histogram"].contains(&ty), "{line}");
                    types.insert(name, ty.to_string());
                }
                _ => panic!("unknown comment: {line}"),
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("value: {line}"));
        let (name, labels) = match series.split_once('{') {
            None => (series.to_string(), Vec::new()),
            Some((name, rest)) => {
                let inner = rest.strip_suffix('}').unwrap_or_else(|| panic!("{line}"));
                let mut labels = Vec::new();
                for pair in inner.split("\",").filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once("=\"").unwrap_or_else(|| panic!("{line}"));
                    labels.push((k.to_string(), v.trim_end_matches('"').to_string()));
                }
                labels.sort();
                (name.to_string(), labels)
            }
        };
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "{line}"
        );
        // Every sample belongs to a declared metric family.
        assert!(
            types
                .keys()
                .any(|family: &String| name.starts_with(family.as_str())),
            "undeclared: {line}"
        );
        samples.insert((name, labels), value);
    }
    samples
}

fn value(samples: &Samples, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut key: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    key.sort();
    samples
        .get(&(name.to_string(), key))
        .copied()
        .unwrap_or(0.0)
}

#[derive(Deserialize)]
struct ResultOf<'a> {
    #[serde(borrow)]
    result: &'a RawValue,
}

/// The exact bytes of a response's result.
fn result_bytes(line: &str) -> usize {
    serde_json::from_str::<ResultOf<'_>>(line)
        .unwrap()
        .result
        .get()
        .len()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn request(peer: &mut Peer, id: u64, tool: &str, arguments: Value) -> String {
    let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}});
    peer.send(&call.to_string()).await;
    peer.recv().await
}

#[tokio::test]
async fn the_counters_move_by_what_the_session_did() {
    let fleet = example("fleet_server");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut proxy = Peer::proxy(
        &["--metrics", &addr, "--policy", "builtin:fleet"],
        &[fleet.to_str().unwrap(), "--streams", "68"],
    );
    handshake(&mut proxy).await;
    proxy
        .send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .await;
    proxy.recv().await;
    // The server's own bytes for the same calls, directly (the fleet is deterministic).
    let mut direct = Peer::spawn(&fleet, &["--streams", "68"]);
    handshake(&mut direct).await;
    let server_show = result_bytes(&request(&mut direct, 2, "fleet_show", json!({})).await);
    let server_all = result_bytes(
        &request(
            &mut direct,
            3,
            "fleet_show",
            json!({"horizon": "all", "detail": "full", "limit": 100}),
        )
        .await,
    );
    let server_detail = result_bytes(
        &request(
            &mut direct,
            4,
            "stream_detail",
            json!({"stream_id": "st-0003"}),
        )
        .await,
    );

    // 1. The default page (a page of 25 of the live streams).
    let page = request(&mut proxy, 3, "fleet_show", json!({})).await;
    assert!(page.contains("next_after"), "{page}");
    // 2. A budget argument out of range: refused, nothing upstream.
    let bad = request(&mut proxy, 4, "fleet_show", json!({"limit": 500})).await;
    assert!(bad.contains("limit must be an integer"), "{bad}");
    // 3. Over the cap: refused as result-too-large.
    let refused = request(
        &mut proxy,
        5,
        "fleet_show",
        json!({"horizon": "all", "detail": "full", "limit": 100}),
    )
    .await;
    assert!(refused.contains("result-too-large"), "{refused}");
    // 4. A small result, unchanged.
    let detail = request(
        &mut proxy,
        6,
        "stream_detail",
        json!({"stream_id": "st-0003"}),
    )
    .await;
    assert_eq!(result_bytes(&detail), server_detail);
    // 5. A name the server never listed: one label for all such names.
    request(&mut proxy, 7, "no such tool", json!({})).await;
    // 6. Bad input.
    proxy.send("this is not JSON").await;
    proxy.recv().await;

    let _ = rustls::crypto::ring::default_provider().install_default();
    let response = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = response.text().await.unwrap();
    let samples = parse(&text);
    fn tool(name: &str) -> [(&str, &str); 1] {
        [("tool", name)]
    }
    let get = |metric: &str, labels: &[(&str, &str)]| value(&samples, metric, labels);

    assert_eq!(get("mcp_budget_tool_calls_total", &tool("fleet_show")), 3.0);
    assert_eq!(
        get("mcp_budget_tool_calls_total", &tool("stream_detail")),
        1.0
    );
    assert_eq!(get("mcp_budget_tool_calls_total", &tool("(unlisted)")), 1.0);
    assert_eq!(get("mcp_budget_pages_total", &tool("fleet_show")), 1.0);
    assert_eq!(get("mcp_budget_pages_total", &tool("stream_detail")), 0.0);
    assert_eq!(
        get(
            "mcp_budget_refusals_total",
            &[("tool", "fleet_show"), ("class", "bad_arguments")]
        ),
        1.0
    );
    assert_eq!(
        get(
            "mcp_budget_refusals_total",
            &[("tool", "fleet_show"), ("class", "result_too_large")]
        ),
        1.0
    );
    // Bytes: what the server sent for the two calls that reached it, and what the client got.
    assert_eq!(
        get("mcp_budget_upstream_bytes_total", &tool("fleet_show")),
        (server_show + server_all) as f64
    );
    assert_eq!(
        get("mcp_budget_delivered_bytes_total", &tool("fleet_show")),
        (result_bytes(&page) + result_bytes(&refused)) as f64
    );
    assert_eq!(
        get("mcp_budget_upstream_bytes_total", &tool("stream_detail")),
        server_detail as f64
    );
    assert_eq!(
        get("mcp_budget_delivered_bytes_total", &tool("stream_detail")),
        server_detail as f64
    );
    let saved = ((server_show - result_bytes(&page)) / 4
        + (server_all - result_bytes(&refused)) / 4) as f64;
    assert_eq!(
        get("mcp_budget_tokens_saved_total", &tool("fleet_show")),
        saved
    );
    assert_eq!(get("mcp_budget_bad_input_total", &[]), 1.0);
    assert_eq!(get("mcp_budget_active_sessions", &[]), 1.0);
    // initialize, tools/list, three calls upstream and the unlisted tool's: six answers timed.
    assert_eq!(get("mcp_budget_upstream_latency_seconds_count", &[]), 6.0);
    assert!(
        text.contains("estimate"),
        "the help says tokens saved are estimated"
    );
}

/// A call made a task counts once, though its result is budgeted when `tasks/result` brings
/// it: one call, one page, the task's bytes once.
#[tokio::test]
async fn a_task_counts_as_one_call() {
    let quirky = example("quirky_server");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut proxy = Peer::proxy(
        &["--metrics", &addr, "--policy", "none"],
        &[quirky.to_str().unwrap()],
    );
    // The answer to `id` (quirky logs before some answers).
    async fn answer(proxy: &mut Peer, id: u64) -> String {
        loop {
            let line = proxy.recv().await;
            if serde_json::from_str::<Value>(&line).unwrap()["id"] == id {
                return line;
            }
        }
    }
    proxy
        .send(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"metrics-test","version":"1"}}}"#)
        .await;
    answer(&mut proxy, 1).await;
    proxy.send(common::INITIALIZED).await;
    proxy
        .send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .await;
    answer(&mut proxy, 2).await;
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "journal", "arguments": {"lines": 33_000}, "task": {"ttl": 60000}}});
    proxy.send(&call.to_string()).await;
    let created: Value = serde_json::from_str(&answer(&mut proxy, 3).await).unwrap();
    let task = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap()
        .to_string();
    let result =
        json!({"jsonrpc": "2.0", "id": 4, "method": "tasks/result", "params": {"taskId": task}});
    proxy.send(&result.to_string()).await;
    let page = answer(&mut proxy, 4).await;
    assert!(page.len() < 200_000, "{} bytes", page.len());
    let _ = rustls::crypto::ring::default_provider().install_default();
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let samples = parse(&text);
    let journal = [("tool", "journal")];
    assert_eq!(
        value(&samples, "mcp_budget_tool_calls_total", &journal),
        1.0
    );
    assert_eq!(value(&samples, "mcp_budget_pages_total", &journal), 1.0);
    assert_eq!(
        value(&samples, "mcp_budget_delivered_bytes_total", &journal),
        result_bytes(&page) as f64
    );
}

#[tokio::test]
async fn metrics_on_the_listener_need_the_token() {
    let fleet = example("fleet_server");
    let (_child, url) = common::listen(
        &[
            "--metrics",
            "listen",
            "--auth-token-env",
            "MCP_BUDGET_METRICS_TOKEN",
            "--",
            fleet.to_str().unwrap(),
        ],
        &[("MCP_BUDGET_METRICS_TOKEN", "s3cret")],
    )
    .await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let metrics = url.replace("/mcp", "/metrics");
    let client = reqwest::Client::new();
    let anonymous = client.get(&metrics).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let scraped = client
        .get(&metrics)
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(scraped.status(), 200);
    let samples = parse(&scraped.text().await.unwrap());
    assert_eq!(value(&samples, "mcp_budget_active_sessions", &[]), 0.0);
    // Without --listen, `listen` is an error that says what to do.
    let out = common::run(["--metrics", "listen", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("add --listen URL"));
}

#[cfg(feature = "otlp")]
mod traces {
    use super::*;

    /// A minimal OTLP/HTTP (JSON) receiver on loopback: the bodies it was sent.
    async fn otlp_receiver() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
        use axum::http::header;
        let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let store = received.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let store = store.clone();
                async move {
                    let value: Value = serde_json::from_slice(&body).expect("OTLP JSON");
                    store.lock().unwrap().push(value);
                    ([(header::CONTENT_TYPE, "application/json")], "{}")
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, received)
    }

    /// Every span in the OTLP bodies.
    fn spans(bodies: &[Value]) -> Vec<Value> {
        bodies
            .iter()
            .flat_map(|b| b["resourceSpans"].as_array().cloned().unwrap_or_default())
            .flat_map(|r| r["scopeSpans"].as_array().cloned().unwrap_or_default())
            .flat_map(|s| s["spans"].as_array().cloned().unwrap_or_default())
            .collect()
    }

    fn attribute(span: &Value, key: &str) -> Value {
        span["attributes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["key"] == key)
            .map(|a| {
                let v = &a["value"];
                v.get("stringValue")
                    .cloned()
                    .or_else(|| v.get("intValue").cloned())
                    .unwrap_or(Value::Null)
            })
            .unwrap_or(Value::Null)
    }

    #[tokio::test]
    async fn a_span_per_request_with_the_tool_the_bytes_and_the_callers_trace() {
        let (endpoint, received) = otlp_receiver().await;
        let dir = std::env::temp_dir().join(format!("mcp-budget-traces-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let recording = dir.join("traced.jsonl");
        let fleet = example("fleet_server");
        let mut command = tokio::process::Command::new(common::proxy_bin());
        command.args([
            "record",
            "--out",
            recording.to_str().unwrap(),
            "--otlp-endpoint",
            &endpoint,
            "--policy",
            "builtin:fleet",
            "--",
            fleet.to_str().unwrap(),
            "--streams",
            "40",
        ]);
        let mut proxy = Peer::from_command(command);
        handshake(&mut proxy).await;
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "fleet_show", "arguments": {}, "_meta": {"traceparent": traceparent}}});
        proxy.send(&call.to_string()).await;
        let page = proxy.recv().await;
        let detail = request(
            &mut proxy,
            3,
            "stream_detail",
            json!({"stream_id": "st-0003"}),
        )
        .await;
        let bad = request(&mut proxy, 4, "fleet_show", json!({"limit": 0})).await;
        proxy.close_stdin();
        proxy.wait().await;
        // The exporter sends what is left as the process ends.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let all = loop {
            let all = spans(&received.lock().unwrap());
            if all.len() >= 4 || std::time::Instant::now() > deadline {
                break all;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        // initialize and three calls: one span each.
        let names: Vec<&str> = all.iter().map(|s| s["name"].as_str().unwrap()).collect();
        assert_eq!(names.len(), 4, "{names:?}");
        assert_eq!(names.iter().filter(|n| **n == "tools/call").count(), 3);
        assert!(names.contains(&"initialize"));
        let show = all
            .iter()
            .find(|s| {
                attribute(s, "mcp.bytes_out") == json!(page.len().to_string())
                    || attribute(s, "mcp.bytes_out") == json!(page.len())
            })
            .unwrap_or_else(|| panic!("no span with the page's bytes: {all:?}"));
        assert_eq!(attribute(show, "mcp.tool"), "fleet_show");
        assert_eq!(attribute(show, "mcp.budget"), "paged");
        assert_eq!(
            show["traceId"].as_str().unwrap().to_lowercase(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(
            show["parentSpanId"].as_str().unwrap().to_lowercase(),
            "00f067aa0ba902b7"
        );
        let by_budget = |b: &str| {
            all.iter()
                .filter(|s| attribute(s, "mcp.budget") == b)
                .count()
        };
        assert_eq!(by_budget("passed"), 2, "initialize and stream_detail");
        assert_eq!(by_budget("answered by the proxy"), 1, "{bad}");
        assert!(detail.contains("st-0003"));
        // The traceparent reached the server unchanged.
        let text = std::fs::read_to_string(&recording).unwrap();
        let upstream = text
            .lines()
            .find(|l| l.contains(r#""dir":"c2s""#) && l.contains("fleet_show"))
            .unwrap();
        assert!(upstream.contains(traceparent), "{upstream}");
    }
}
