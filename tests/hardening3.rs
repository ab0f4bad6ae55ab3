//! Hardening, round three: one reading decides. A message the proxy cannot classify with
//! certainty is refused (from the client) or dropped (from the server), never forwarded for a
//! server to read another way. Each test is an attack that got past allow/deny or the cap
//! before: a null id, a batch element whose key serde cannot decode, numeric ids a double-based
//! server reads as one, a server's null-id result.

mod common;

use std::path::PathBuf;

use common::{Peer, example, handshake};
use serde_json::{Value, json};

/// A policy that denies `big` (a tool that returns `arguments.bytes` bytes).
fn deny_big() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mcp-budget-hardening3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("deny-big.toml");
    std::fs::write(&path, "[tools]\ndeny = [\"big\"]\n").unwrap();
    path
}

async fn quirky_behind_deny() -> Peer {
    let policy = deny_big();
    let quirky = example("quirky_server");
    let mut peer = Peer::proxy(
        &["--policy", policy.to_str().unwrap()],
        &[quirky.to_str().unwrap()],
    );
    handshake(&mut peer).await;
    peer
}

/// How many times the server ran `tool`.
async fn executions(peer: &mut Peer, tool: &str) -> u64 {
    peer.send(r#"{"jsonrpc":"2.0","id":"count","method":"tools/call","params":{"name":"executions","arguments":{}}}"#).await;
    loop {
        let answer = peer.recv_json().await;
        if answer["id"] == "count" {
            return answer["result"]["structuredContent"][tool]
                .as_u64()
                .unwrap_or(0);
        }
    }
}

/// The next line, which must be an Invalid Request error naming `words`; returns its id.
async fn refused(peer: &mut Peer, words: &str) -> Value {
    let line = peer.recv().await;
    assert!(
        line.len() < 10_000,
        "a raw result came back: {} bytes",
        line.len()
    );
    let answer: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(answer["error"]["code"], -32600, "{line}");
    assert!(
        answer["error"]["message"].as_str().unwrap().contains(words),
        "{line}"
    );
    answer["id"].clone()
}

/// The next `n` answers, whether they come alone or in a batch; none a raw result.
async fn answers(peer: &mut Peer, n: usize) -> Vec<Value> {
    let mut seen = Vec::new();
    while seen.len() < n {
        let line = peer.recv().await;
        assert!(line.len() < 10_000, "a raw result: {} bytes", line.len());
        let value: Value = serde_json::from_str(&line).unwrap();
        seen.extend(value.as_array().cloned().unwrap_or_else(|| vec![value]));
    }
    seen
}

#[tokio::test]
async fn a_null_id_request_is_refused_never_run_as_a_notification() {
    let mut peer = quirky_behind_deny().await;
    // Before: read as a notification, forwarded with no deny check and no cap; the denied tool
    // ran and its 1,000,076-byte result passed the 200,000-byte cap.
    peer.send(r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"big","arguments":{"bytes":1000000}}}"#).await;
    assert_eq!(refused(&mut peer, "must not be null").await, Value::Null);
    // Before: the unfiltered list, hidden tools included.
    peer.send(r#"{"jsonrpc":"2.0","id":null,"method":"tools/list"}"#)
        .await;
    assert_eq!(refused(&mut peer, "must not be null").await, Value::Null);
    // In a batch, the same: the element is refused, the rest goes on.
    peer.send(r#"[{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"big","arguments":{"bytes":1000000}}},{"jsonrpc":"2.0","id":5,"method":"ping"}]"#).await;
    let seen = answers(&mut peer, 2).await;
    assert!(
        seen.iter()
            .any(|v| v["id"].is_null() && v["error"]["code"] == -32600)
    );
    assert!(seen.iter().any(|v| v["id"] == 5 && v["result"].is_object()));
    assert_eq!(executions(&mut peer, "big").await, 0, "the denied tool ran");
}

#[tokio::test]
async fn a_batch_element_that_serde_cannot_decode_is_refused_alone() {
    let mut peer = quirky_behind_deny().await;
    // A lone surrogate in a key: serde cannot decode it, JavaScript and Python can. Before: the
    // element was "other" and forwarded untouched; the denied tool ran, and a ping of the same
    // id got its raw 1 MB result.
    for place in [
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","\ud800":1,"params":{"name":"big","arguments":{"bytes":1000000}}}"#,
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"\ud800":1,"name":"big","arguments":{"bytes":1000000}}}"#,
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"big","_meta":{"\udc00":1},"arguments":{"bytes":1000000}}}"#,
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"big","arguments":{"bytes":1000000,"\ud800x":1}}}"#,
    ] {
        peer.send(&format!(
            r#"[{place},{{"jsonrpc":"2.0","id":7,"method":"ping"}}]"#
        ))
        .await;
        let seen = answers(&mut peer, 2).await;
        assert!(
            seen.iter().any(|v| v["error"]["code"] == -32600),
            "{place}: {seen:?}"
        );
        assert!(
            seen.iter()
                .any(|v| v["id"] == 7 && v["result"] == json!({})),
            "{place}: the ping's own answer: {seen:?}"
        );
    }
    assert_eq!(executions(&mut peer, "big").await, 0, "the denied tool ran");
}

#[tokio::test]
async fn numeric_ids_a_double_cannot_hold_are_refused() {
    let mut peer = quirky_behind_deny().await;
    // Two ids to the proxy and one to a JavaScript server: the answers would cross.
    for id in [
        "1e16",
        "10000000000000000",
        "9007199254740992",
        "9007199254740993",
        "12345678901234567890",
        "1.5",
        "-0",
    ] {
        peer.send(&format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#))
            .await;
        assert_eq!(
            refused(&mut peer, "an integer written plainly").await,
            Value::Null,
            "{id}"
        );
    }
    // The largest a double holds exactly is an id like any other.
    peer.send(r#"{"jsonrpc":"2.0","id":9007199254740991,"method":"ping"}"#)
        .await;
    assert_eq!(
        peer.recv().await,
        r#"{"jsonrpc":"2.0","id":9007199254740991,"result":{}}"#
    );
    // A number in the arguments that readers read differently: refused, the id kept.
    peer.send(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"executions","arguments":{"n":9007199254740993}}}"#).await;
    assert_eq!(refused(&mut peer, "send it as a string").await, 3);
}

#[tokio::test]
async fn any_key_twice_in_the_envelope_is_refused() {
    let mut peer = quirky_behind_deny().await;
    // An MRTR retry that gives requestState twice was not read as a retry: the tool ran again.
    peer.send(r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"executions","arguments":{},"requestState":"a","requestState":"b"}}"#).await;
    assert_eq!(refused(&mut peer, "a key of params appears twice").await, 4);
    peer.send(r#"{"jsonrpc":"2.0","id":5,"x":1,"method":"ping","x":2}"#)
        .await;
    assert_eq!(
        refused(&mut peer, "a key of the message appears twice").await,
        5
    );
}

/// A server that answers every tools/call first with a 1 MB result under a null id, then with
/// its real answer.
fn null_id_server() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mcp-budget-hardening3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("null_id_server.py");
    std::fs::write(
        &path,
        r#"import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    if m["method"] == "initialize":
        r = {"protocolVersion": m["params"]["protocolVersion"], "capabilities": {"tools": {}}, "serverInfo": {"name": "nullid", "version": "1"}}
    elif m["method"] == "tools/list":
        r = {"tools": [{"name": "x", "inputSchema": {"type": "object"}}]}
    elif m["params"]["name"] == "noresult":
        print(json.dumps({"jsonrpc": "2.0", "id": m["id"]}), flush=True)
        continue
    else:
        big = {"content": [{"type": "text", "text": "x" * 1000000}]}
        print(json.dumps({"jsonrpc": "2.0", "id": None, "result": big}), flush=True)
        print(json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "x" * 1000000}}), flush=True)
        print(json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}), flush=True)
        r = {"content": [{"type": "text", "text": "done"}]}
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": r}), flush=True)
"#,
    )
    .unwrap();
    path
}

#[tokio::test]
async fn a_servers_null_id_result_never_reaches_the_client() {
    let server = null_id_server();
    let mut peer = Peer::proxy(
        &["--policy", "none"],
        &["python3", server.to_str().unwrap()],
    );
    handshake(&mut peer).await;
    peer.send(
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x","arguments":{}}}"#,
    )
    .await;
    // The small null-id error (JSON-RPC's "I could not read that") passes; the 1 MB result
    // and the 1 MB error under a null id do not.
    let first = peer.recv().await;
    assert_eq!(
        first,
        r#"{"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "Parse error"}}"#
    );
    let answer = peer.recv_json().await;
    assert_eq!(answer["id"], 2);
    assert_eq!(answer["result"]["content"][0]["text"], "done");
    // An answer with neither result nor error: the call ends with an error that says so,
    // never passed on, never left to hang.
    peer.send(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"noresult","arguments":{}}}"#).await;
    let answer = peer.recv_json().await;
    assert_eq!(answer["id"], 3, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("could not be read for certain"),
        "{answer}"
    );
}

#[tokio::test]
async fn over_http_a_null_id_is_refused_in_a_session_and_without_one() {
    let quirky = example("quirky_server");
    let policy = deny_big();
    let (_proxy, url) = common::listen(
        &[
            "--policy",
            policy.to_str().unwrap(),
            "--",
            quirky.to_str().unwrap(),
        ],
        &[],
    )
    .await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    // A legacy session.
    let session = common::mcp_initialize(&http, &url).await;
    let answer = common::mcp_post(&http, &url, Some(&session), r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"big","arguments":{"bytes":1000000}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 400);
    let body = answer.text().await.unwrap();
    assert!(body.contains("must not be null"), "{body}");
    // A 2026-07-28 request without a session (answered 202 before, as a notification).
    let modern = r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"big","arguments":{"bytes":1000000},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}"#;
    let answer = http
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "big")
        .body(modern)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 400);
    let body = answer.text().await.unwrap();
    assert!(body.contains("must not be null"), "{body}");
}
