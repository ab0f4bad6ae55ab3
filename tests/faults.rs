//! Servers that misbehave: hang, crash, flood, or lose their client. Every waiting client gets a
//! clear answer, and nothing is left behind.

mod common;

use common::{Peer, example, gone, handshake};
use futures_util::StreamExt;
use serde_json::{Value, json};

fn quirky() -> String {
    example("quirky_server").to_str().unwrap().to_string()
}

#[tokio::test]
async fn a_hung_request_times_out_and_the_server_is_told_to_cancel_it() {
    let mut peer = Peer::proxy(&["--request-timeout-secs", "0.3"], &[&quirky()]);
    handshake(&mut peer).await;
    peer.send(r#"{"jsonrpc":"2.0","id":"h1","method":"tools/call","params":{"name":"slow"}}"#)
        .await;
    let mut got = [peer.recv_json().await, peer.recv_json().await];
    got.sort_by_key(|m| m.get("id").is_none());
    assert_eq!(got[0]["id"], "h1");
    assert_eq!(
        got[0]["error"]["message"],
        "the server did not answer tools/call within 0.3 s (--request-timeout-secs); the request was cancelled"
    );
    // The server logs each notifications/cancelled it receives.
    assert_eq!(got[1]["params"]["data"], "cancelled 'h1'");
    peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#)
        .await;
    assert_eq!(peer.recv().await, r#"{"jsonrpc":"2.0","id":2,"result":{}}"#);
}

#[tokio::test]
async fn progress_keeps_a_long_request_alive_past_the_timeout() {
    let mut peer = Peer::proxy(&["--request-timeout-secs", "1"], &[&quirky()]);
    handshake(&mut peer).await;
    // Fifteen ticks of 100 ms: 1.5 s in all, but never a second without a sign of life.
    peer.send(r#"{"jsonrpc":"2.0","id":"t1","method":"tools/call","params":{"name":"ticking","arguments":{"ticks":15},"_meta":{"progressToken":"tk"}}}"#).await;
    for k in 1..=15 {
        let progress = peer.recv_json().await;
        assert_eq!(progress["params"]["progress"], k, "{progress}");
    }
    let done = peer.recv_json().await;
    assert_eq!(done["id"], "t1");
    assert_eq!(done["result"]["content"][0]["text"], "ticked 15");
}

#[tokio::test]
async fn a_100_mb_result_gets_a_clear_error_and_the_relay_goes_on() {
    let mut peer = Peer::proxy(&[], &[&quirky()]);
    handshake(&mut peer).await;
    peer.send(r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"big","arguments":{"bytes":100000000}}}"#).await;
    let error = peer.recv_json().await;
    assert_eq!(error["id"], 5);
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("the server's response is 1000000"),
        "{message}"
    );
    assert!(
        message.contains("over the proxy's message size limit"),
        "{message}"
    );
    peer.send(r#"{"jsonrpc":"2.0","id":6,"method":"ping"}"#)
        .await;
    assert_eq!(peer.recv().await, r#"{"jsonrpc":"2.0","id":6,"result":{}}"#);
}

#[tokio::test]
async fn restart_on_failure_answers_the_lost_requests_and_brings_the_server_back_initialized() {
    // The fleet server (rmcp) refuses requests before initialize: a working call after the
    // crash proves the proxy re-initialized the new process with the client's initialize.
    let fleet = example("fleet_server");
    let mut peer = Peer::proxy(
        &["--restart", "on-failure"],
        &[fleet.to_str().unwrap(), "--streams", "5"],
    );
    handshake(&mut peer).await;
    let call = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"stream_detail","arguments":{"stream_id":"st-0001"}}}"#;
    peer.send(call).await;
    assert_eq!(peer.recv_json().await["result"]["isError"], false);
    let first = common::wait_for_child(peer.child.id().unwrap()).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // The client is told to read the tools again once the new server is ready.
    let note = peer.recv_json().await;
    assert_eq!(
        note,
        json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    );
    let second = common::wait_for_child(peer.child.id().unwrap()).await;
    assert_ne!(first, second);
    peer.send(&call.replace(r#""id":3"#, r#""id":4"#)).await;
    let reply = peer.recv_json().await;
    assert_eq!(reply["id"], 4);
    assert_eq!(
        reply["result"]["structuredContent"]["stream"]["stream_id"],
        "st-0001"
    );
    peer.close_stdin();
    assert!(peer.wait().await.success());
    assert!(gone(second).await);
}

#[tokio::test]
async fn requests_in_flight_when_the_server_crashes_get_errors_under_restart() {
    let mut peer = Peer::proxy(&["--restart", "on-failure"], &[&quirky()]);
    handshake(&mut peer).await;
    peer.send(r#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"slow"}}"#)
        .await;
    peer.send(r#"{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"crash"}}"#)
        .await;
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(peer.recv_json().await);
    }
    let errors: Vec<&Value> = got.iter().filter(|m| m.get("error").is_some()).collect();
    assert_eq!(errors.len(), 2, "{got:?}");
    for error in errors {
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains("exit status: 3"), "{message}");
        assert!(
            message.ends_with("mcp-budget is restarting the server: send the request again"),
            "{message}"
        );
    }
    assert!(
        got.iter()
            .any(|m| m["method"] == "notifications/tools/list_changed")
    );
    peer.send(r#"{"jsonrpc":"2.0","id":12,"method":"ping"}"#)
        .await;
    assert_eq!(
        peer.recv().await,
        r#"{"jsonrpc":"2.0","id":12,"result":{}}"#
    );
}

#[tokio::test]
async fn an_http_client_that_disconnects_mid_call_cancels_it_upstream_and_leaks_nothing() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (proxy, url) = common::listen(&["--max-sessions", "1", "--", &quirky()], &[]).await;
    let client = reqwest::Client::new();
    let session = common::mcp_initialize(&client, &url).await;
    // The GET stream receives what belongs to no open request: the server's log of the cancel.
    let get = client
        .get(&url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    let mut server_events = sse_stream::SseStream::from_bytes_stream(get.bytes_stream());
    let call = common::mcp_post(
        &client,
        &url,
        Some(&session),
        r#"{"jsonrpc":"2.0","id":"gone-1","method":"tools/call","params":{"name":"slow"}}"#,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(call.status(), 200);
    drop(call); // the client goes away before the answer
    let cancelled = loop {
        let event = tokio::time::timeout(common::PATIENCE, server_events.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Some(data) = event.data.filter(|d| !d.is_empty()) {
            break serde_json::from_str::<Value>(&data).unwrap();
        }
    };
    assert_eq!(cancelled["params"]["data"], "cancelled 'gone-1'");
    drop(server_events);
    // Ending the session ends its server; the session slot is free again.
    let server = common::wait_for_child(proxy.id().unwrap()).await;
    let deleted = client
        .delete(&url)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert!(gone(server).await);
    // The server has exited; the proxy reaps it (its child list empties) on its own schedule.
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    while !common::children(proxy.id().unwrap()).is_empty()
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        common::children(proxy.id().unwrap()).is_empty(),
        "no server process left"
    );
    let again = common::mcp_post(&client, &url, None, common::INITIALIZE)
        .send()
        .await
        .unwrap();
    assert_eq!(
        again.status(),
        200,
        "the ended session no longer counts against --max-sessions"
    );
}

#[tokio::test]
async fn one_sessions_crash_leaves_the_others_serving() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (_proxy, url) = common::listen(&["--", &quirky()], &[]).await;
    let client = reqwest::Client::new();
    let a = common::mcp_initialize(&client, &url).await;
    let b = common::mcp_initialize(&client, &url).await;
    let crash = common::mcp_post(
        &client,
        &url,
        Some(&a),
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"crash"}}"#,
    )
    .send()
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(crash.contains("exit status: 3"), "{crash}");
    let ping = common::mcp_post(
        &client,
        &url,
        Some(&b),
        r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#,
    )
    .send()
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(
        ping.contains(r#"{"jsonrpc":"2.0","id":2,"result":{}}"#),
        "{ping}"
    );
    // The crashed session is gone: its client is told to start a new one.
    let after = common::mcp_post(
        &client,
        &url,
        Some(&a),
        r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(after.status(), 404);
}

#[tokio::test]
async fn a_broken_answer_still_answers_its_request_with_an_error() {
    let quirky = common::example("quirky_server");
    let mut peer = Peer::proxy(&[], &[quirky.to_str().unwrap()]);
    common::handshake(&mut peer).await;
    peer.send(r#"{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"broken","arguments":{}}}"#)
        .await;
    let reply = peer.recv_json().await;
    assert_eq!(reply["id"], 77, "{reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(message.contains("not valid JSON"), "{message}");
    // The relay goes on.
    peer.send(r#"{"jsonrpc":"2.0","id":78,"method":"ping"}"#)
        .await;
    assert_eq!(peer.recv_json().await["id"], 78);
}
