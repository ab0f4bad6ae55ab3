//! Hardening, second round, at the envelope: a key read twice, ids spelled two ways, requests
//! that cannot be served. Each test runs the real binary in front of the real fleet server and
//! fails on the code before this round (the hidden tool ran, an answer never came, or a raw
//! result reached the client).

mod common;

use std::time::{Duration, Instant};

use common::{Peer, example, handshake};
use serde_json::Value;

/// A policy that hides `fleet_show` (a 1 MB answer at 68 streams).
fn deny_policy() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mcp-budget-envelope-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("deny.toml");
    std::fs::write(&path, "[tools]\ndeny = [\"fleet_show\"]\n").unwrap();
    path
}

async fn proxy_with(policy: &str) -> Peer {
    let fleet = example("fleet_server");
    let mut peer = Peer::proxy(
        &["--policy", policy],
        &[fleet.to_str().unwrap(), "--streams", "68"],
    );
    handshake(&mut peer).await;
    peer
}

async fn denied() -> Peer {
    let policy = deny_policy();
    proxy_with(policy.to_str().unwrap()).await
}

/// The next line that answers `id` (JSON text), skipping notifications.
async fn answer(peer: &mut Peer, id: &str) -> (String, Value) {
    loop {
        let line = peer.recv().await;
        let value: Value = serde_json::from_str(&line).unwrap();
        if value.get("method").is_none() {
            let got = serde_json::to_string(&value["id"]).unwrap();
            let want: Value = serde_json::from_str(id).unwrap_or(Value::Null);
            if value["id"] == want || got == id {
                return (line, value);
            }
        }
    }
}

#[tokio::test]
async fn a_duplicate_name_never_runs_a_denied_tool() {
    let mut peer = denied().await;
    for (id, call) in [
        (
            2,
            r#""name":"stream_detail","name":"fleet_show","arguments":{}"#,
        ),
        (
            3,
            r#""name":"fleet_show","name":"fleet_show","arguments":{}"#,
        ),
        (
            4,
            r#""n\u0061me":"stream_detail","name":"fleet_show","arguments":{}"#,
        ),
    ] {
        peer.send(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{{call}}}}}"#
        ))
        .await;
        let (line, value) = answer(&mut peer, &id.to_string()).await;
        assert_eq!(value["error"]["code"], -32600, "{line}");
        let message = value["error"]["message"].as_str().unwrap();
        assert!(message.contains("\"params.name\" twice"), "{message}");
        assert!(
            line.len() < 1000,
            "no result of the hidden tool: {} bytes",
            line.len()
        );
    }
    // The proxy still serves the session.
    peer.send(r#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#)
        .await;
    let (_, value) = answer(&mut peer, "5").await;
    assert!(value["result"].is_object());
}

#[tokio::test]
async fn duplicate_arguments_and_budget_arguments_are_refused() {
    let policy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/fleet.toml");
    let mut peer = proxy_with(policy.to_str().unwrap()).await;
    peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fleet_show","arguments":{},"arguments":{"horizon":"all","detail":"full","limit":100}}}"#).await;
    let (line, value) = answer(&mut peer, "2").await;
    assert!(
        value["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"params.arguments\" twice"),
        "{line}"
    );
    peer.send(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"fleet_show","arguments":{"limit":5,"limit":500}}}"#).await;
    let (line, value) = answer(&mut peer, "3").await;
    assert_eq!(value["error"]["code"], -32602, "{line}");
    assert!(line.contains(r#"the key \"limit\" twice"#), "{line}");
}

#[tokio::test]
async fn ids_spelled_otherwise_are_answered_under_their_own_spelling() {
    let mut peer = proxy_with("none").await;
    // Numbers other than plain integers are no ids at all (below); strings spelled otherwise
    // are answered under their own spelling.
    for id in ["1.50", "15e-1", "9007199254740993", "-0"] {
        peer.send(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"fleet_show","arguments":{{}}}}}}"#
        ))
        .await;
        let line = peer.recv().await;
        assert!(
            line.starts_with(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"#)
                && line.contains("an integer written plainly"),
            "{id}: {line}"
        );
    }
    for id in [r#""\u0061""#, r#""\/x""#] {
        peer.send(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"fleet_show","arguments":{{}}}}}}"#
        ))
        .await;
        let line = tokio::time::timeout(Duration::from_secs(20), peer.recv())
            .await
            .expect("an answer");
        assert!(
            line.starts_with(&format!(r#"{{"jsonrpc":"2.0","id":{id},"#)),
            "{id}: {}",
            &line[..80.min(line.len())]
        );
        // Paged: the raw result is over a megabyte.
        assert!(line.len() < 200_000, "{id}: {} bytes", line.len());
    }
}

#[tokio::test]
async fn two_requests_with_ids_equal_as_values_never_share_an_answer() {
    let mut peer = proxy_with("none").await;
    peer.send(r#"{"jsonrpc":"2.0","id":"\u0061","method":"tools/call","params":{"name":"fleet_show","arguments":{}}}"#).await;
    peer.send(r#"{"jsonrpc":"2.0","id":"a","method":"ping"}"#)
        .await;
    let mut lines = [peer.recv().await, peer.recv().await];
    lines.sort_by_key(String::len);
    // The second is refused as an id in flight (they are one id), the first is paged.
    assert!(
        lines[0].contains("already used by a request in flight"),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].starts_with(r#"{"jsonrpc":"2.0","id":"a","#),
        "{}",
        lines[0]
    );
    assert!(lines[1].starts_with(r#"{"jsonrpc":"2.0","id":"\u0061","result""#));
    assert!(lines[1].len() < 200_000, "{} bytes", lines[1].len());
}

#[tokio::test]
async fn a_batch_element_with_a_duplicate_id_is_refused_alone() {
    let mut peer = proxy_with("none").await;
    peer.send(r#"[{"jsonrpc":"2.0","id":7,"id":8,"method":"tools/call","params":{"name":"fleet_show","arguments":{}}},{"jsonrpc":"2.0","id":9,"method":"ping"}]"#).await;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let line = peer.recv().await;
        assert!(line.len() < 200_000, "a raw result: {} bytes", line.len());
        let value: Value = serde_json::from_str(&line).unwrap();
        for element in value.as_array().cloned().unwrap_or_else(|| vec![value]) {
            seen.push(element);
        }
    }
    let refused = seen.iter().find(|v| v["error"].is_object()).unwrap();
    assert_eq!(refused["id"], 8, "the id a parser reads (the last)");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"id\" twice")
    );
    // The rest of the batch went on (what the server makes of a batch is its own business).
    assert!(seen.iter().any(|v| v["id"] != 8));
}

#[tokio::test]
async fn requests_that_cannot_be_served_are_answered_at_once() {
    let mut peer = proxy_with("none").await;
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":40,"method":"tools/call","params":{{"name":"stream_detail","arguments":{{"x":{}1{}}}}}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let deep_id = format!(
        r#"{{"jsonrpc":"2.0","id":{}1{},"method":"ping"}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let cases: Vec<(String, Value)> = vec![
        (
            r#"{"jsonrpc":"2.0","id":1e999999,"method":"ping"}"#.into(),
            Value::Null,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1E400,"method":"ping"}"#.into(),
            Value::Null,
        ),
        (
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#.into(),
            Value::Null,
        ),
        (
            r#"{"jsonrpc":"2.0","id":[1],"method":"ping"}"#.into(),
            Value::Null,
        ),
        (
            r#"{"jsonrpc":"2.0","id":31,"params":{}}"#.into(),
            Value::from(31),
        ),
        (deep, Value::from(40)),
        (deep_id, Value::Null),
    ];
    for (line, id) in cases {
        let started = Instant::now();
        peer.send(&line).await;
        let answer = tokio::time::timeout(Duration::from_secs(5), peer.recv_json())
            .await
            .expect("an answer, not silence");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(answer["id"], id, "{answer}");
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
    }
    let memory = common::memory(peer.child.id().unwrap(), "VmHWM");
    assert!(memory < 256 << 20, "peak {memory} bytes");
}

#[tokio::test]
async fn a_huge_tool_name_is_refused_before_it_is_matched() {
    let dir =
        std::env::temp_dir().join(format!("mcp-budget-envelope-globs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("globs.toml");
    std::fs::write(
        &policy,
        "[tools]\ndeny = [\"*secret*\", \"fleet_*_x\", \"?big\"]\n",
    )
    .unwrap();
    let mut peer = proxy_with(policy.to_str().unwrap()).await;
    let name = "n".repeat(60 * 1024 * 1024);
    peer.send(&format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"{name}","arguments":{{}}}}}}"#
    ))
    .await;
    drop(name);
    let (line, value) = answer(&mut peer, "5").await;
    assert_eq!(value["error"]["code"], -32602, "{line:.300}");
    assert!(
        line.contains("no tool name is longer than 1024"),
        "{line:.300}"
    );
    let peak = common::memory(peer.child.id().unwrap(), "VmHWM");
    assert!(peak < 256 << 20, "peak {} MiB", peak >> 20);
}
