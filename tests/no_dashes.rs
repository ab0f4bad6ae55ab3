//! The server command without `--` (#29): launchers such as npx and the MCP Inspector eat one
//! `--`, so `mcp-budget node server.js` must run `node server.js`, and `--` stays only for a
//! server whose first word is one of mcp-budget's subcommands.

mod common;

use common::{Peer, example, handshake, proxy_bin};
use serde_json::Value;

/// `fleet_show {}` through `peer`: the page's `total_count` (the server's `--streams`).
async fn fleet_total(peer: &mut Peer) -> u64 {
    handshake(peer).await;
    peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fleet_show","arguments":{}}}"#)
        .await;
    let answer = peer.recv_json().await;
    let text = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text content: {answer}"));
    let page: Value = serde_json::from_str(text).expect("the page is JSON");
    page["total_count"]
        .as_u64()
        .unwrap_or_else(|| panic!("no total_count: {page}"))
}

#[tokio::test]
async fn the_server_command_runs_without_dashes_and_keeps_its_own_options() {
    let server = example("fleet_server");
    let server = server.to_str().expect("UTF-8 path");
    // Options of the proxy first, then the server with options of its own: after the server's
    // first word, every word is the server's.
    let mut peer = Peer::spawn(
        proxy_bin(),
        &["--policy", "policies/fleet.toml", server, "--streams", "37"],
    );
    assert_eq!(fleet_total(&mut peer).await, 37);
}

#[tokio::test]
async fn the_server_command_after_dashes_still_runs() {
    let server = example("fleet_server");
    let server = server.to_str().expect("UTF-8 path");
    let mut peer = Peer::spawn(
        proxy_bin(),
        &[
            "--policy",
            "policies/fleet.toml",
            "--",
            server,
            "--streams",
            "41",
        ],
    );
    assert_eq!(fleet_total(&mut peer).await, 41);
}

#[test]
fn a_subcommand_name_is_the_subcommand_and_after_dashes_a_server() {
    let listed = common::run(["policies"]);
    assert!(listed.status.success());
    assert!(String::from_utf8_lossy(&listed.stdout).contains("builtin:fleet"));
    // After `--`, `policies` is a server command (none is installed under that name).
    let started = common::run(["--", "policies"]);
    assert_eq!(started.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&started.stderr);
    assert!(
        stderr.contains("could not start the server `policies`"),
        "{stderr}"
    );
}

#[test]
fn a_mistyped_option_is_refused_not_run_as_a_server() {
    let out = common::run(["--polcy", "none", "node", "server.js"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unexpected argument '--polcy'"), "{stderr}");
}
