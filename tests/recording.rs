//! Record, replay and report: real recordings of real servers, replayed through the real binary.

mod common;

use std::path::{Path, PathBuf};

use common::{Peer, example, handshake};
use serde_json::{Value, json};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn fixture(name: &str) -> PathBuf {
    root().join("tests/fixtures").join(name)
}

fn fleet_policy() -> PathBuf {
    root().join("policies/fleet.toml")
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mcp-budget-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// fleet.toml with a cursor key shared through the environment, so two runs mint equal cursors.
fn shared_key_policy() -> PathBuf {
    let path = temp_dir("recording").join("fleet-shared.toml");
    let text = std::fs::read_to_string(fleet_policy()).unwrap().replace(
        "[budget]\n",
        "[budget]\ncursor_key_env = \"MCP_BUDGET_TEST_KEY\"\n",
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn proxy_command(args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(common::proxy_bin());
    command.args(args).env("MCP_BUDGET_TEST_KEY", "k");
    command
}

fn replay_behind(policy: &Path, recording: &Path) -> Peer {
    common::replay_behind(policy, recording)
}

async fn call(peer: &mut Peer, id: u64, tool: &str, arguments: Value) -> Value {
    let request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}});
    peer.send(&request.to_string()).await;
    let reply = peer.recv_json().await;
    assert_eq!(reply["id"], id, "{reply}");
    reply["result"].clone()
}

/// The streams of the fixture's recorded fleet_show, as the server sent them.
fn recorded_streams() -> Vec<Value> {
    let text = std::fs::read_to_string(fixture("fleet-68.jsonl")).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains(r#""dir":"s2c""#) && l.contains(r#""stream_count":68"#))
        .unwrap();
    let entry: Value = serde_json::from_str(line).unwrap();
    entry["msg"]["result"]["structuredContent"]["streams"]
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test]
async fn the_budget_works_on_the_replayed_fleet_without_the_server() {
    let mut peer = replay_behind(&fleet_policy(), &fixture("fleet-68.jsonl"));
    handshake(&mut peer).await;
    peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .await;
    let tools = peer.recv_json().await;
    assert_eq!(
        tools["result"]["tools"][0]["inputSchema"]["properties"]["limit"]["maximum"],
        100
    );

    // The default query fits, with notices, and the page chain reaches every live stream.
    let live: Vec<Value> = recorded_streams()
        .into_iter()
        .filter(|s| !["merged", "closed-without-merge"].contains(&s["state"].as_str().unwrap()))
        .map(|s| s["stream_id"].clone())
        .collect();
    let mut seen = Vec::new();
    let mut arguments = json!({"limit": 10});
    for id in 10..40 {
        let page = call(&mut peer, id, "fleet_show", arguments.clone()).await;
        assert_eq!(page["isError"], false);
        assert!(serde_json::to_string(&page).unwrap().len() < 50_000);
        seen.extend(
            page["structuredContent"]["streams"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["stream_id"].clone()),
        );
        match page["structuredContent"]["next_after"].as_str() {
            Some(next) => arguments["after"] = json!(next),
            None => break,
        }
    }
    assert_eq!(seen, live);
    // The regression and the argument checks hold against the replay too.
    let refused = call(
        &mut peer,
        50,
        "fleet_show",
        json!({"horizon": "all", "detail": "full", "limit": 100}),
    )
    .await;
    assert!(
        refused["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("result-too-large: fleet_show response is ")
    );
    let bad = call(&mut peer, 51, "fleet_show", json!({"limit": 101})).await;
    assert_eq!(
        bad["content"][0]["text"],
        "limit must be an integer between 1 and 100"
    );
    // Full detail, all horizons: the recorded items, byte for byte.
    let dir = temp_dir("replay-big");
    let big = dir.join("big.toml");
    std::fs::write(
        &big,
        std::fs::read_to_string(fleet_policy())
            .unwrap()
            .replace("max_bytes = 200000", "max_bytes = 50000000"),
    )
    .unwrap();
    let mut peer = replay_behind(&big, &fixture("fleet-68.jsonl"));
    handshake(&mut peer).await;
    let all = call(
        &mut peer,
        2,
        "fleet_show",
        json!({"horizon": "all", "detail": "full", "limit": 100}),
    )
    .await;
    assert_eq!(
        all["structuredContent"]["streams"].as_array().unwrap(),
        &recorded_streams()
    );
}

#[tokio::test]
async fn the_everything_recording_replays_its_results_and_a_cap_refuses_the_large_one() {
    let dir = temp_dir("everything");
    let policy = dir.join("small.toml");
    std::fs::write(
        &policy,
        "[budget]\nmax_bytes = 2000\n\n[[tool]]\nname = \"get-*\"\n",
    )
    .unwrap();
    let mut peer = replay_behind(&policy, &fixture("everything.jsonl"));
    // The server announced list_changed before it answered initialize; so does its replay.
    let first = handshake(&mut peer).await;
    assert!(
        first.contains("notifications/tools/list_changed"),
        "{first}"
    );
    assert_eq!(peer.recv_json().await["id"], 1);
    let echo = call(&mut peer, 2, "echo", json!({"message": "hello, budget"})).await;
    assert_eq!(
        echo,
        json!({"content": [{"type": "text", "text": "Echo: hello, budget"}]})
    );
    let sum = call(&mut peer, 3, "get-sum", json!({"a": 2, "b": 3.5})).await;
    assert_eq!(sum["content"][0]["text"], "The sum of 2 and 3.5 is 5.5.");
    let structured = call(
        &mut peer,
        4,
        "get-structured-content",
        json!({"location": "Chicago"}),
    )
    .await;
    assert!(structured["structuredContent"]["temperature"].is_number());
    let annotated = call(
        &mut peer,
        5,
        "get-annotated-message",
        json!({"messageType": "success", "includeImage": true}),
    )
    .await;
    // Its rule only caps it: automatic paging would split it by blocks, but the image alone is
    // more than the whole 2000-byte budget, so the first call is refused (never a first page
    // that promises a second one no page can hold).
    assert_eq!(annotated["isError"], true);
    let refusal = annotated["content"][0]["text"].as_str().unwrap();
    assert!(
        refusal.starts_with("result-too-large: get-annotated-message's result is 5603 bytes")
            && refusal.contains("one image block alone is"),
        "{refusal}"
    );
    // Recorded progress is emitted in its place, addressed to the caller's token.
    peer.send(r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"trigger-long-running-operation","arguments":{"duration":1,"steps":3},"_meta":{"progressToken":"mine"}}}"#).await;
    for step in 1..=3 {
        let progress = peer.recv_json().await;
        assert_eq!(progress["method"], "notifications/progress");
        assert_eq!(progress["params"]["progressToken"], "mine");
        assert_eq!(progress["params"]["progress"], step);
    }
    assert_eq!(peer.recv_json().await["id"], 6);
    // An unrecorded request names the closest recorded one.
    let missing = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"message":"something else"}}}"#;
    peer.send(missing).await;
    let error = peer.recv_json().await;
    assert_eq!(
        error["error"]["message"],
        r#"no recorded response for tools/call {"name":"echo","arguments":{"message":"something else"}}; the closest recorded request is tools/call {"name":"echo","arguments":{"message":"hello, budget"}}"#
    );
}

/// Runs a dynamic fleet session (page 2 follows page 1's cursor) and returns every line received.
async fn fleet_session(mut peer: Peer) -> Vec<String> {
    let mut lines = vec![handshake(&mut peer).await];
    peer.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .await;
    lines.push(peer.recv().await);
    let mut after: Option<String> = None;
    for (id, arguments) in [
        (3, json!({"limit": 7})),
        (4, json!({"limit": 7})),
        (5, json!({"format": "csv", "state": "blocked"})),
        (6, json!({"limit": "ten"})),
        (7, json!({"horizon": "all", "detail": "full", "limit": 100})),
    ] {
        let mut arguments = arguments;
        if id == 4 {
            arguments["after"] = json!(after.clone().unwrap());
        }
        peer.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "fleet_show", "arguments": arguments}}).to_string()).await;
        let line = peer.recv().await;
        let message: Value = serde_json::from_str(&line).unwrap();
        after = message["result"]["structuredContent"]["next_after"]
            .as_str()
            .map(String::from);
        lines.push(line);
    }
    peer.send(r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"stream_detail","arguments":{"stream_id":"st-0002"}}}"#).await;
    lines.push(peer.recv().await);
    peer.close_stdin();
    assert!(peer.wait().await.success());
    lines
}

#[tokio::test]
async fn record_then_replay_reproduces_what_the_client_saw() {
    let dir = temp_dir("roundtrip");
    let recording = dir.join("live.jsonl");
    let policy = shared_key_policy();
    let fleet = example("fleet_server");
    let live = Peer::from_command(proxy_command(&[
        "record",
        "--out",
        recording.to_str().unwrap(),
        "--policy",
        policy.to_str().unwrap(),
        "--",
        fleet.to_str().unwrap(),
        "--streams",
        "68",
    ]));
    let live = fleet_session(live).await;
    assert!(
        recording.exists(),
        "the recording is renamed into place when the session ends"
    );
    assert!(!dir.join("live.jsonl.partial").exists());
    let replayed = fleet_session(replay_behind(&policy, &recording)).await;
    assert_eq!(live.len(), 8);
    for (k, (a, b)) in live.iter().zip(&replayed).enumerate() {
        assert_eq!(a, b, "message {k} differs");
    }
    // The recording holds both sides of what the proxy changed.
    let text = std::fs::read_to_string(&recording).unwrap();
    assert!(
        text.lines()
            .next()
            .unwrap()
            .contains(r#""mcp_budget_recording":1"#)
    );
    assert!(
        text.contains(r#""forwarded":"#),
        "stripped budget arguments are recorded"
    );
    assert!(
        text.contains(r#""delivered":"#),
        "budgeted results are recorded next to the server's"
    );
    assert!(
        text.contains(r#""dir":"p2c""#),
        "the proxy's own answers are recorded"
    );
}

#[tokio::test]
async fn a_recording_cut_mid_line_replays_up_to_the_cut_and_says_so() {
    let text = std::fs::read_to_string(fixture("fleet-68.jsonl")).unwrap();
    // Cut inside the last line (stream_detail's response).
    let cut = text.trim_end().len() - 5000;
    let dir = temp_dir("cut");
    let path = dir.join("cut.jsonl.partial");
    std::fs::write(&path, &text[..cut]).unwrap();
    let lines = text[..cut].lines().count();
    let bin = common::proxy_bin();
    let mut peer = Peer::spawn(&bin, &["replay", path.to_str().unwrap()]);
    handshake(&mut peer).await;
    let wave = call(&mut peer, 2, "wave_show", json!({"wave": "w2"})).await;
    assert_eq!(wave["structuredContent"]["stream_count"], 12);
    peer.send(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"stream_detail","arguments":{"stream_id":"st-0003"}}}"#).await;
    let error = peer.recv_json().await;
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("no recorded response for tools/call")
    );
    peer.close_stdin();
    peer.wait().await;
    let stderr = peer.stderr().await;
    assert!(
        stderr.contains(&format!("was cut off at line {lines}")),
        "{stderr}"
    );
}

#[tokio::test]
async fn the_report_of_the_fleet_recording() {
    let policy = fleet_policy();
    let recording = fixture("fleet-68.jsonl");
    let stdout = common::run_ok([
        "report".as_ref(),
        "--policy".as_ref(),
        policy.as_os_str(),
        "--json".as_ref(),
        recording.as_os_str(),
    ]);
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let calls = report["calls"].as_array().unwrap();
    let row = |k: usize| {
        let c = &calls[k];
        (
            c["tool"].as_str().unwrap().to_string(),
            c["received_bytes"].as_u64().unwrap(),
            c["budget_bytes"].as_u64().unwrap(),
            c["outcome"].as_str().unwrap().to_string(),
        )
    };
    assert_eq!(calls.len(), 4);
    // The budgeted sizes, computed a second way: the same calls, with the recorded ids, through
    // the real binary in front of the recording.
    let mut proxied = replay_behind(&policy, &recording);
    handshake(&mut proxied).await;
    let mut live = Vec::new();
    for (k, c) in calls.iter().enumerate() {
        let request = json!({"jsonrpc": "2.0", "id": 3 + k, "method": "tools/call", "params": {"name": c["tool"], "arguments": c["arguments"]}});
        proxied.send(&request.to_string()).await;
        live.push(proxied.recv().await.len() as u64);
    }
    assert_eq!(
        row(0),
        (
            "fleet_show".into(),
            758124,
            live[0],
            "page of 25 (total 68, more pages)".into()
        )
    );
    assert_eq!(
        row(1),
        (
            "wave_show".into(),
            117216,
            live[1],
            "page of 6 (total 12)".into()
        )
    );
    assert_eq!(
        row(2),
        (
            "wave_show".into(),
            138028,
            live[2],
            "page of 5 (total 12)".into()
        )
    );
    // stream_detail has no paging rule: what the client gets is what the server sent.
    assert_eq!(
        row(3),
        ("stream_detail".into(), 25952, 25952, "unchanged".into())
    );
    assert_eq!(live[3], 25952);
    // Received bytes are the recorded messages' exact sizes.
    let text = std::fs::read_to_string(fixture("fleet-68.jsonl")).unwrap();
    let fleet_line = text
        .lines()
        .find(|l| l.contains(r#""stream_count":68"#))
        .unwrap();
    let msg_len = fleet_line.len()
        - r#"{"t":"#.len()
        - fleet_line[5..].find(',').unwrap()
        - r#","dir":"s2c","msg":"#.len()
        - 1;
    assert_eq!(msg_len, 758124);
    // Tokens: o200k is deterministic; allow nothing but a tokenizer-version wobble.
    let tokens = calls[0]["received_tokens"].as_u64().unwrap();
    assert!((99_000..=100_100).contains(&tokens), "{tokens}");
    assert_eq!(report["received_bytes"], 758124 + 117216 + 138028 + 25952);
    assert_eq!(report["capped_tools"], json!([]));
    assert_eq!(report["tools_without_rule"], json!([]));

    // With --policy none: fleet_show is over the default budget and is paged automatically
    // by its largest list; nothing is refused.
    let table = common::run_ok([
        "report".as_ref(),
        "--policy".as_ref(),
        "none".as_ref(),
        recording.as_os_str(),
    ]);
    let fleet_row = table.lines().find(|l| l.contains("fleet_show")).unwrap();
    assert!(
        fleet_row.contains("paged automatically: items 1-") && fleet_row.contains("more pages"),
        "{table}"
    );
    assert!(
        table.contains("tools the cap would refuse with default arguments: none"),
        "{table}"
    );
    assert!(
        table.contains("tools with no budget rule: fleet_show, stream_detail, wave_show"),
        "{table}"
    );
}

#[tokio::test]
async fn replay_serves_over_http_too_and_recordings_never_hold_secrets() {
    let dir = temp_dir("http-record");
    let recording = dir.join("http.jsonl");
    let quirky = example("quirky_server");
    let mut proxy = proxy_command(&[
        "record",
        "--out",
        recording.to_str().unwrap(),
        "--listen",
        "http://127.0.0.1:0/mcp",
        "--auth-token-env",
        "MCP_TEST_TOKEN",
        "--",
        quirky.to_str().unwrap(),
    ]);
    proxy
        .env("MCP_TEST_TOKEN", "tok-SECRET-1")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut proxy = proxy.spawn().unwrap();
    let url = first_line(&mut proxy)
        .await
        .trim_start_matches("listening on ")
        .to_string();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let post = |body: &'static str, session: Option<String>| {
        let mut request = client
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .header("authorization", "Bearer tok-SECRET-1")
            .body(body);
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        request.send()
    };
    let init = post(common::INITIALIZE, None).await.unwrap();
    let session = init.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let _ = init.text().await;
    let ping = post(
        r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#,
        Some(session.clone()),
    )
    .await
    .unwrap();
    assert_eq!(
        ping.text().await.unwrap(),
        r#"{"jsonrpc":"2.0","id":2,"result":{}}"#
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(proxy.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(proxy.wait().await.unwrap().success());
    let text = std::fs::read_to_string(&recording).unwrap();
    assert!(
        text.contains(&format!(r#""session":"{session}""#)),
        "{text}"
    );
    assert!(
        !text.contains("tok-SECRET-1"),
        "a header secret reached the recording"
    );
    assert!(!text.to_lowercase().contains("authorization"));

    // The recording, served over HTTP.
    let mut replay = tokio::process::Command::new(common::proxy_bin());
    replay
        .args([
            "replay",
            recording.to_str().unwrap(),
            "--listen",
            "http://127.0.0.1:0/mcp",
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut replay = replay.spawn().unwrap();
    let url = first_line(&mut replay)
        .await
        .trim_start_matches("listening on ")
        .to_string();
    let init = client
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(common::INITIALIZE)
        .send()
        .await
        .unwrap();
    let session = init.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let body: Value = init.json().await.unwrap();
    assert_eq!(body["result"]["serverInfo"]["name"], "quirky");
    let ping = client
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .header("mcp-session-id", session)
        .body(r#"{"jsonrpc":"2.0","id":"p","method":"ping"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(
        ping.text().await.unwrap(),
        r#"{"jsonrpc":"2.0","id":"p","result":{}}"#
    );
}

async fn first_line(child: &mut tokio::process::Child) -> String {
    use tokio::io::AsyncBufReadExt;
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    tokio::time::timeout(common::PATIENCE, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}

#[test]
fn check_with_a_recording_reports_items_paths_that_match_nothing() {
    let recording = fixture("fleet-68.jsonl");
    let good = common::run_ok([
        "check".as_ref(),
        fleet_policy().as_os_str(),
        "--recording".as_ref(),
        recording.as_os_str(),
    ]);
    assert!(
        good.contains("fleet_show: items = \"$.streams\" finds a list in 1 of 1 recorded results"),
        "{good}"
    );
    let dir = temp_dir("check-paths");
    let broken = dir.join("broken.toml");
    std::fs::write(
        &broken,
        "[[tool]]\nname = \"fleet_show\"\nitems = \"$.stream\"\nkey = \"stream_id\"\n",
    )
    .unwrap();
    let out = common::run([
        "check".as_ref(),
        broken.as_os_str(),
        "--recording".as_ref(),
        recording.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "warning: items = \"$.stream\" for fleet_show matches nothing in its 1 recorded result"
        ),
        "{text}"
    );
}

#[tokio::test]
async fn the_report_of_a_plain_recording_shows_what_the_server_sent_and_what_the_client_got() {
    // The README's `record --out … -- server`: with no policy, the proxy picks the built-in
    // one for fleet-server, so the client received a page of a much larger result.
    let dir = temp_dir("plain");
    let recording = dir.join("plain.jsonl");
    let fleet = example("fleet_server");
    let mut live = Peer::from_command(proxy_command(&[
        "record",
        "--out",
        recording.to_str().unwrap(),
        "--",
        fleet.to_str().unwrap(),
    ]));
    handshake(&mut live).await;
    live.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fleet_show","arguments":{}}}"#)
        .await;
    let page = live.recv().await;
    live.close_stdin();
    live.wait().await;
    let stdout = common::run_ok(["report".as_ref(), "--json".as_ref(), recording.as_os_str()]);
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let call = &report["calls"][0];
    let (server, received) = (
        call["server_bytes"].as_u64().unwrap(),
        call["received_bytes"].as_u64().unwrap(),
    );
    assert_eq!(
        received as usize,
        page.len(),
        "what the client got, as it got it"
    );
    assert!(
        server > 10 * received,
        "the server's {server} bytes, not the client's {received}"
    );
    assert!(call["server_tokens"].as_u64().unwrap() > call["received_tokens"].as_u64().unwrap());
    let table = common::run_ok(["report".as_ref(), recording.as_os_str()]);
    assert!(
        table.contains("sent by the server") && table.contains("received by the client"),
        "{table}"
    );
    assert!(table.contains(&server.to_string()), "{table}");
}

#[test]
fn replay_help_says_what_replay_does() {
    let help = common::run_ok(["replay", "--help"]);
    assert!(
        help.contains("Without it, replay applies no budget"),
        "{help}"
    );
    for refused in ["--upstream", "SERVER COMMAND", "--restart"] {
        assert!(!help.contains(refused), "replay refuses {refused}: {help}");
    }
}

#[tokio::test]
async fn newcomer_text_slips_stay_fixed() {
    // "(1 call recorded)", never "(1 calls recorded)".
    let suggested = common::run_ok(["suggest".as_ref(), fixture("fleet-68.jsonl").as_os_str()]);
    assert!(suggested.contains("(1 call recorded)"), "{suggested}");
    assert!(suggested.contains("(3 calls recorded)"), "{suggested}");
    assert!(!suggested.contains("1 calls"), "{suggested}");
    // -v logs on a stderr that is not a terminal carry no colour codes.
    let fleet = example("fleet_server");
    let mut proxy = Peer::proxy(&["-vv"], &[fleet.to_str().unwrap(), "--streams", "12"]);
    handshake(&mut proxy).await;
    proxy.close_stdin();
    proxy.wait().await;
    let log = proxy.stderr().await;
    assert!(log.contains("INFO") || log.contains("DEBUG"), "{log}");
    assert!(!log.contains('\u{1b}'), "ANSI escape codes in a piped log");
}
