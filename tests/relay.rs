//! The transparent relay, end to end: the real binary in front of real child-process servers.

mod common;

use common::{Peer, example, gone, handshake};
use serde_json::{Value, json};

/// One scripted exchange: lines the client sends, then how many lines it then reads.
const SCRIPT: &[(&[&str], usize)] = &[
    (&[common::INITIALIZE], 1),
    (&[common::INITIALIZED], 0),
    // A logging notification, then the tools with outputSchema, _meta, annotations, x- fields.
    (
        &[r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":{"x-client":"t"}}}"#],
        2,
    ),
    // An unknown method whose unknown fields and number forms must arrive intact.
    (
        &[
            r#"{"jsonrpc":"2.0","id":3,"method":"x/echo","params":{"z":1,"a":[1.0,2e5,"\u00e9",-0.0],"_meta":{"k":"v"},"x-unknown":{}}}"#,
        ],
        1,
    ),
    // Progress ×2, logging, then a server→client sampling request.
    (
        &[
            r#"{"jsonrpc":"2.0","id":"call-4","method":"tools/call","params":{"name":"report","arguments":{"quarter":"Q3"},"_meta":{"progressToken":"tok-1"}}}"#,
        ],
        4,
    ),
    // The client answers the sampling request: last progress, then the rich result.
    (
        &[
            r#"{"jsonrpc":"2.0","id":"srv-1","result":{"role":"assistant","content":{"type":"text","text":"up 12%"},"model":"m-1","stopReason":"endTurn"}}"#,
        ],
        2,
    ),
    // A JSON-RPC batch.
    (
        &[r#"[{"jsonrpc":"2.0","id":5,"method":"ping"},{"jsonrpc":"2.0","id":6,"method":"ping"}]"#],
        1,
    ),
    // list_changed notification, then the result.
    (
        &[
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"list_changed","arguments":{}}}"#,
        ],
        2,
    ),
    // An unknown method gets the server's own error.
    (&[r#"{"jsonrpc":"2.0","id":8,"method":"foo/bar"}"#], 1),
    (&[r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#], 1),
];

async fn transcript(mut peer: Peer) -> Vec<String> {
    let mut received = Vec::new();
    for (lines, replies) in SCRIPT {
        for line in *lines {
            peer.send(line).await;
        }
        for _ in 0..*replies {
            received.push(peer.recv().await);
        }
    }
    peer.close_stdin();
    let rest = peer.rest().await;
    assert!(rest.is_empty(), "unexpected extra output: {rest:?}");
    assert!(peer.wait().await.success());
    received
}

#[tokio::test]
async fn what_the_client_receives_is_byte_identical_direct_and_through_the_proxy() {
    let direct = transcript(Peer::quirky()).await;
    let quirky = example("quirky_server");
    let proxied = transcript(Peer::proxy(&[], &[quirky.to_str().unwrap()])).await;
    assert_eq!(direct.len(), 15);
    for (k, (d, p)) in direct.iter().zip(&proxied).enumerate() {
        // Automatic paging adds `after` to each descriptor, spliced in; nothing else changes.
        assert_eq!(d, &common::without_auto_after(p), "message {k} differs");
    }
    // The transcript really exercised what it claims to.
    let all = direct.join("\n");
    for needle in [
        "notifications/progress",
        "notifications/message",
        "sampling/createMessage",
        "notifications/tools/list_changed",
        r#""outputSchema""#,
        r#""structuredContent":{"total":1e3"#,
        r#""type":"hologram""#,
        r#""x-owner":"team-q""#,
        r#""execution":{"taskSupport":"optional"}"#,
        r#""echo":{"z":1,"a":[1.0,2e5,"\u00e9",-0.0]"#,
        r#""id":9,"#,
    ] {
        assert!(all.contains(needle), "transcript lacks {needle}");
    }
}

#[tokio::test]
async fn rmcp_client_sees_the_same_fleet_through_the_proxy() {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::TokioChildProcess;

    async fn session(command: tokio::process::Command) -> (Value, Value) {
        let client = ().serve(TokioChildProcess::new(command).unwrap()).await.unwrap();
        let tools = client.list_all_tools().await.unwrap();
        let result = client
            .call_tool(CallToolRequestParams::new("fleet_show"))
            .await
            .unwrap();
        client.cancel().await.unwrap();
        (
            serde_json::to_value(tools).unwrap(),
            serde_json::to_value(result).unwrap(),
        )
    }

    // 12 streams keep fleet_show under the default 200000-byte cap that applies without a
    // policy (the budget tests cover what happens above it). `--policy none`: without it the
    // built-in policy written for fleet-server would apply.
    let fleet = example("fleet_server");
    let mut direct = tokio::process::Command::new(&fleet);
    direct.args(["--streams", "12"]);
    let direct = session(direct).await;
    let mut via = tokio::process::Command::new(common::proxy_bin());
    via.args(["--policy", "none", "--"])
        .arg(&fleet)
        .args(["--streams", "12"]);
    let mut proxied = session(via).await;
    // The proxy's search tool, listed after the server's.
    let tools = proxied.0.as_array_mut().unwrap();
    assert_eq!(
        tools.pop().map(|t| t["name"].clone()),
        Some(json!("mcp_budget_search"))
    );
    // Automatic paging's `after`, the one addition to each descriptor.
    for tool in proxied.0.as_array_mut().unwrap() {
        let after = tool["inputSchema"]["properties"]
            .as_object_mut()
            .unwrap()
            .shift_remove("after");
        assert!(after.is_some(), "{tool}");
        // And the continuation fields a paged structuredContent may carry.
        if let Some(output) = tool
            .get_mut("outputSchema")
            .and_then(|schema| schema.get_mut("properties"))
            .and_then(Value::as_object_mut)
        {
            for name in ["next_after", "total_count", "notice", "mcp_budget"] {
                assert!(output.shift_remove(name).is_some(), "{name}");
            }
        }
    }
    assert_eq!(direct, proxied);
    assert_eq!(
        direct.1["structuredContent"]["streams"]
            .as_array()
            .unwrap()
            .len(),
        12
    );
}

#[tokio::test]
async fn a_garbage_client_line_gets_a_parse_error_and_the_relay_goes_on() {
    let quirky = example("quirky_server");
    let mut peer = Peer::proxy(&[], &[quirky.to_str().unwrap()]);
    handshake(&mut peer).await;
    peer.send("this is not json {").await;
    let error = peer.recv_json().await;
    assert_eq!(error["id"], Value::Null);
    assert_eq!(error["error"]["code"], -32700);
    peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#)
        .await;
    assert_eq!(peer.recv().await, r#"{"jsonrpc":"2.0","id":2,"result":{}}"#);
}

#[tokio::test]
async fn a_non_json_server_line_never_reaches_the_client() {
    let quirky = example("quirky_server");
    let mut peer = Peer::proxy(&[], &[quirky.to_str().unwrap()]);
    handshake(&mut peer).await;
    peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"noise"}}"#)
        .await;
    // The very next line is the response: the noise line was dropped.
    let line = peer.recv().await;
    assert!(
        line.starts_with(r#"{"jsonrpc":"2.0","id":2,"result""#),
        "{line}"
    );
    peer.close_stdin();
    peer.wait().await;
    let stderr = peer.stderr().await;
    assert!(stderr.contains("not JSON"), "the drop is logged: {stderr}");
}

#[tokio::test]
async fn cancellation_reaches_the_server() {
    let quirky = example("quirky_server");
    let mut peer = Peer::proxy(&[], &[quirky.to_str().unwrap()]);
    handshake(&mut peer).await;
    peer.send(r#"{"jsonrpc":"2.0","id":"s-1","method":"tools/call","params":{"name":"slow"}}"#)
        .await;
    peer.send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"s-1","reason":"user"}}"#).await;
    let note = peer.recv_json().await;
    assert_eq!(note["params"]["data"], "cancelled 's-1'");
}

#[tokio::test]
async fn a_server_crash_mid_call_answers_every_request_in_flight_then_exits_non_zero() {
    let quirky = example("quirky_server");
    let mut peer = Peer::proxy(&[], &[quirky.to_str().unwrap()]);
    handshake(&mut peer).await;
    peer.send(r#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"slow"}}"#)
        .await;
    peer.send(r#"{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"crash"}}"#)
        .await;
    let mut errors = [peer.recv_json().await, peer.recv_json().await];
    errors.sort_by_key(|e| e["id"].as_i64());
    for (error, id) in errors.iter().zip([10, 11]) {
        assert_eq!(error["id"], id);
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains("exit status: 3"), "{message}");
        assert!(
            message.contains("fatal: simulated crash in tool `crash`"),
            "{message}"
        );
    }
    assert_eq!(peer.rest().await, Vec::<String>::new());
    assert_eq!(peer.wait().await.code(), Some(1));
}

#[tokio::test]
async fn oversized_messages_get_errors_in_both_directions_and_the_relay_goes_on() {
    let quirky = example("quirky_server");
    let mut peer = Peer::proxy(
        &["--max-message-bytes", "2000"],
        &[quirky.to_str().unwrap()],
    );
    handshake(&mut peer).await;
    let padding = "p".repeat(5000);
    let request =
        format!(r#"{{"jsonrpc":"2.0","params":{{"pad":"{padding}"}},"id":21,"method":"x/echo"}}"#);
    peer.send(&request).await;
    let error = peer.recv_json().await;
    assert_eq!(error["id"], 21);
    assert_eq!(
        error["error"]["message"],
        format!(
            "x/echo message is {} bytes, over the proxy's message size limit (raise it with --max-message-bytes)",
            request.len()
        )
    );
    peer.send(r#"{"jsonrpc":"2.0","id":22,"method":"tools/call","params":{"name":"big","arguments":{"bytes":3000}}}"#).await;
    let error = peer.recv_json().await;
    assert_eq!(error["id"], 22);
    let response_len =
        r#"{"jsonrpc":"2.0","id":22,"result":{"content":[{"type":"text","text":""}]}}"#.len()
            + 3000;
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("the server's response is {response_len} bytes")),
        "{message}"
    );
    peer.send(r#"{"jsonrpc":"2.0","id":23,"method":"ping"}"#)
        .await;
    assert_eq!(
        peer.recv().await,
        r#"{"jsonrpc":"2.0","id":23,"result":{}}"#
    );
}

#[tokio::test]
async fn a_message_just_under_64_mib_passes_both_ways() {
    let quirky = example("quirky_server");
    let mut peer = Peer::proxy(&[], &[quirky.to_str().unwrap()]);
    handshake(&mut peer).await;
    let payload = "m".repeat(63 * 1024 * 1024);
    let request =
        format!(r#"{{"jsonrpc":"2.0","id":31,"method":"x/echo","params":{{"blob":"{payload}"}}}}"#);
    peer.send(&request).await;
    let reply = peer.recv().await;
    let expected =
        format!(r#"{{"jsonrpc":"2.0","id":31,"result":{{"echo":{{"blob":"{payload}"}}}}}}"#);
    assert!(
        reply == expected,
        "the 63 MiB echo came back altered ({} bytes)",
        reply.len()
    );
}

#[tokio::test]
async fn client_eof_stops_the_server_and_its_children() {
    let quirky = example("quirky_server");
    let mut peer = Peer::proxy(&[], &[quirky.to_str().unwrap()]);
    handshake(&mut peer).await;
    peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"spawn"}}"#)
        .await;
    let reply = peer.recv_json().await;
    let pid: u32 = reply["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(common::alive(pid), "the grandchild runs");
    peer.close_stdin();
    assert!(peer.wait().await.success());
    assert!(gone(pid).await, "grandchild {pid} was orphaned");
}

#[tokio::test]
async fn a_server_that_ignores_eof_and_sigterm_is_killed_after_the_grace_period() {
    let mut peer = Peer::proxy(
        &["--shutdown-grace-ms", "100"],
        &["sh", "-c", "trap '' TERM; sleep 600; echo never"],
    );
    let proxy = peer.child.id().unwrap();
    let server = common::wait_for_child(proxy).await;
    let grandchild = common::wait_for_child(server).await;
    peer.close_stdin();
    assert!(peer.wait().await.success());
    assert!(gone(server).await, "server {server} survived");
    assert!(gone(grandchild).await, "grandchild {grandchild} survived");
}

#[tokio::test]
async fn sigterm_ends_the_proxy_cleanly_and_stops_the_server() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let quirky = example("quirky_server");
    let mut peer = Peer::proxy(&[], &[quirky.to_str().unwrap()]);
    handshake(&mut peer).await;
    peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"spawn"}}"#)
        .await;
    let reply = peer.recv_json().await;
    let grandchild: u32 = reply["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    kill(
        Pid::from_raw(peer.child.id().unwrap() as i32),
        Signal::SIGTERM,
    )
    .unwrap();
    assert!(peer.wait().await.success());
    assert!(gone(grandchild).await);
}

#[tokio::test]
async fn a_server_that_fails_on_its_first_request_makes_the_proxy_exit_non_zero_with_its_stderr() {
    let mut peer = Peer::proxy(
        &[],
        &[
            "sh",
            "-c",
            "read line; echo 'cannot open database' >&2; exit 4",
        ],
    );
    peer.send(common::INITIALIZE).await;
    let error = peer.recv_json().await;
    assert_eq!(error["id"], 1);
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("exit status: 4"), "{message}");
    assert!(message.contains("cannot open database"), "{message}");
    assert_eq!(peer.wait().await.code(), Some(1));
}

#[tokio::test]
async fn an_unknown_server_command_is_a_clear_usage_error() {
    let mut peer = Peer::proxy(&[], &["/nonexistent/server"]);
    assert_eq!(peer.wait().await.code(), Some(2));
    let stderr = peer.stderr().await;
    assert!(
        stderr.contains("could not start the server `/nonexistent/server`"),
        "{stderr}"
    );
}

#[tokio::test]
async fn logs_go_to_stderr_never_stdout() {
    let quirky = example("quirky_server");
    let mut peer = Peer::proxy(&["-vvv"], &[quirky.to_str().unwrap()]);
    handshake(&mut peer).await;
    peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#)
        .await;
    assert_eq!(peer.recv().await, r#"{"jsonrpc":"2.0","id":2,"result":{}}"#);
    peer.close_stdin();
    assert!(peer.rest().await.is_empty());
    peer.wait().await;
    assert!(peer.stderr().await.contains("DEBUG"));
}
