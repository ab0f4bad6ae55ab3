//! The budget end to end: the real binary, `policies/fleet.toml`, the real example fleet server.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use common::{Peer, example, handshake};
use serde_json::{Value, json};

fn fleet_policy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/fleet.toml")
}

/// The proxy with `policy` in front of the fleet server with `streams` streams, initialized.
async fn fleet(policy: &Path, streams: usize) -> Peer {
    let server = example("fleet_server");
    let streams = streams.to_string();
    let mut peer = Peer::proxy(
        &["--policy", policy.to_str().unwrap()],
        &[server.to_str().unwrap(), "--streams", &streams],
    );
    handshake(&mut peer).await;
    peer
}

/// The fleet server itself, initialized.
async fn fleet_direct(streams: usize) -> Peer {
    let streams = streams.to_string();
    let mut peer = Peer::spawn(example("fleet_server"), &["--streams", &streams]);
    handshake(&mut peer).await;
    peer
}

struct Client {
    peer: Peer,
    next_id: u64,
}

impl Client {
    fn new(peer: Peer) -> Client {
        Client { peer, next_id: 100 }
    }

    /// A tools/call; returns (the result, the response line's length).
    async fn call(&mut self, tool: &str, arguments: Value) -> (Value, String) {
        self.next_id += 1;
        let request = json!({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}});
        self.peer.send(&request.to_string()).await;
        let line = self.peer.recv().await;
        let message: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(message["id"], self.next_id, "{line}");
        (message["result"].clone(), line)
    }

    async fn tools(&mut self) -> Vec<Value> {
        self.next_id += 1;
        self.peer
            .send(
                &json!({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/list"}).to_string(),
            )
            .await;
        let message = self.peer.recv_json().await;
        message["result"]["tools"].as_array().unwrap().clone()
    }
}

/// The exact JSON text at `path` (object keys) in a line.
fn raw_at(line: &str, path: &[&str]) -> String {
    let mut text = line.to_string();
    for key in path {
        let object: serde_json::Map<String, Value> = serde_json::from_str(&text).unwrap();
        assert!(
            object.contains_key(*key),
            "no {key} in {}",
            &text[..text.len().min(200)]
        );
        let raw: std::collections::HashMap<String, Box<serde_json::value::RawValue>> =
            serde_json::from_str(&text).unwrap();
        text = raw[*key].get().to_string();
    }
    text
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

const TERMINAL: [&str; 2] = ["merged", "closed-without-merge"];

#[tokio::test]
async fn regression_240_streams_fit_the_default_budget_with_margin() {
    let mut proxy = Client::new(fleet(&fleet_policy(), 240).await);
    let (result, line) = proxy.call("fleet_show", json!({})).await;
    let serialized = serde_json::to_vec(&result).unwrap().len();
    assert!(
        serialized < 200_000 / 4,
        "default fleet_show is {serialized} bytes; it must fit with margin"
    );
    assert!(line.len() < 200_000 / 4);
    assert_eq!(result["isError"], false);
    let page = &result["structuredContent"];
    assert_eq!(page["total_count"], 240);
    let streams = page["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 25);
    for stream in streams {
        assert!(!TERMINAL.contains(&stream["state"].as_str().unwrap()));
        assert!(
            stream
                .get("last_gate")
                .unwrap()
                .get("justification")
                .is_none()
        );
        assert!(stream.get("gate_history").is_none());
    }
    assert!(page["next_after"].is_string());
    let notices: Vec<&str> = page["notices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(
        notices[0],
        "This query used the default live-only horizon because \"horizon\" was not provided (merged/closed-without-merge streams are excluded). If results seem incomplete, pass horizon:\"all\" to include them."
    );
    assert!(notices[1].starts_with("This query used the default summary detail"));
    assert!(notices[2].starts_with("This query used the default limit of 25"));
    // The text the model reads is the same envelope, notices included.
    assert_eq!(serde_json::from_str::<Value>(text(&result)).unwrap(), *page);
}

#[tokio::test]
async fn regression_all_full_limit_100_is_refused_with_the_actionable_message() {
    let mut proxy = Client::new(fleet(&fleet_policy(), 240).await);
    let (result, _) = proxy
        .call(
            "fleet_show",
            json!({"horizon": "all", "detail": "full", "limit": 100}),
        )
        .await;
    assert_eq!(result["isError"], true);
    let message = text(&result);
    let bytes: usize = message
        .strip_prefix("result-too-large: fleet_show response is ")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{message}"));
    assert!(bytes >= 200_000);
    assert_eq!(
        message,
        format!(
            "result-too-large: fleet_show response is {bytes} bytes, exceeds the 200000-byte cap — narrow with a state/streams filter, lower limit below its current value, or omit detail:full (summary, the default, is far smaller)"
        )
    );
}

#[tokio::test]
async fn horizon_all_detail_full_returns_upstreams_items_byte_for_byte() {
    // A policy whose cap and page size let the whole record through.
    let dir = std::env::temp_dir().join(format!("mcp-budget-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("big.toml");
    let text = std::fs::read_to_string(fleet_policy())
        .unwrap()
        .replace("max_bytes = 200000", "max_bytes = 50000000")
        .replace("max = 100", "max = 1000");
    std::fs::write(&policy, text).unwrap();

    let mut direct = Client::new(fleet_direct(68).await);
    let (upstream, upstream_line) = direct.call("fleet_show", json!({})).await;
    let mut proxy = Client::new(fleet(&policy, 68).await);
    let (result, line) = proxy
        .call(
            "fleet_show",
            json!({"horizon": "all", "detail": "full", "limit": 1000}),
        )
        .await;
    let ours = result["structuredContent"]["streams"].as_array().unwrap();
    assert_eq!(ours.len(), 68);
    // The bytes of the item list, as each side wrote them: the same bytes.
    let path = ["result", "structuredContent", "streams"];
    let theirs = raw_at(&upstream_line, &path);
    assert!(theirs.len() > 10_000, "the list is the record, not a stub");
    assert_eq!(raw_at(&line, &path), theirs);
    assert_eq!(
        ours,
        upstream["structuredContent"]["streams"].as_array().unwrap()
    );
    assert!(result["structuredContent"].get("notices").is_none());
    assert!(result["structuredContent"].get("next_after").is_none());
}

#[tokio::test]
async fn bad_limits_are_refused_with_the_exact_message() {
    let mut proxy = Client::new(fleet(&fleet_policy(), 68).await);
    for limit in [json!(0), json!(101), json!(2.5), json!("ten")] {
        let (result, _) = proxy.call("fleet_show", json!({"limit": limit})).await;
        assert_eq!(result["isError"], true);
        assert_eq!(
            text(&result),
            "limit must be an integer between 1 and 100",
            "for {limit}"
        );
    }
}

#[tokio::test]
async fn the_page_chain_enumerates_every_live_stream_once_in_order() {
    let mut direct = Client::new(fleet_direct(240).await);
    let (upstream, _) = direct.call("fleet_show", json!({})).await;
    let live: Vec<String> = upstream["structuredContent"]["streams"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| !TERMINAL.contains(&s["state"].as_str().unwrap()))
        .map(|s| s["stream_id"].as_str().unwrap().to_string())
        .collect();
    assert!(
        live.len() > 60,
        "the record has {} live streams",
        live.len()
    );

    let mut proxy = Client::new(fleet(&fleet_policy(), 240).await);
    for format in ["json", "csv"] {
        let mut seen = Vec::new();
        let mut arguments = json!({"limit": 30, "format": format});
        let mut pages = 0;
        loop {
            pages += 1;
            assert!(pages < 50, "the chain does not end");
            let (result, _) = proxy.call("fleet_show", arguments.clone()).await;
            assert_eq!(result["isError"], false, "{result}");
            if format == "csv" {
                seen.extend(
                    text(&result)
                        .lines()
                        .skip(1)
                        .map(|row| row.split(',').next().unwrap().to_string()),
                );
            } else {
                seen.extend(
                    result["structuredContent"]["streams"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|s| s["stream_id"].as_str().unwrap().to_string()),
                );
            }
            match result["structuredContent"]["next_after"].as_str() {
                Some(next) => arguments["after"] = json!(next),
                None => break,
            }
        }
        assert_eq!(seen, live, "{format} chain");
        assert_eq!(seen.iter().collect::<HashSet<_>>().len(), seen.len());
    }
}

#[tokio::test]
async fn filters_narrow_and_their_cursors_stay_with_them() {
    let mut proxy = Client::new(fleet(&fleet_policy(), 240).await);
    let (result, _) = proxy
        .call(
            "fleet_show",
            json!({"state": ["blocked", "gated"], "limit": 5}),
        )
        .await;
    let streams = result["structuredContent"]["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 5);
    assert!(
        streams
            .iter()
            .all(|s| ["blocked", "gated"].contains(&s["state"].as_str().unwrap()))
    );
    let next = result["structuredContent"]["next_after"].as_str().unwrap();
    // The same cursor with another filter, or for another tool, is refused.
    let (refused, _) = proxy
        .call(
            "fleet_show",
            json!({"state": "blocked", "limit": 5, "after": next}),
        )
        .await;
    assert_eq!(refused["isError"], true);
    assert!(
        text(&refused).starts_with("after belongs to a different query"),
        "{}",
        text(&refused)
    );
    let (refused, _) = proxy
        .call("wave_show", json!({"wave": "w1", "after": next}))
        .await;
    assert!(text(&refused).starts_with("after belongs to a different query"));
    // A tampered cursor.
    let mut tampered = next.to_string();
    tampered.insert(3, 'x');
    let (refused, _) = proxy
        .call(
            "fleet_show",
            json!({"state": ["blocked", "gated"], "after": tampered}),
        )
        .await;
    assert_eq!(
        text(&refused),
        "after is not a cursor this proxy issued (it is malformed or was altered); call again without after to start from the first page"
    );
    // A single stream by id.
    let (one, _) = proxy
        .call(
            "fleet_show",
            json!({"streams": "st-0005", "horizon": "all"}),
        )
        .await;
    let streams = one["structuredContent"]["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 1);
    assert_eq!(streams[0]["stream_id"], "st-0005");
}

#[tokio::test]
async fn every_structured_content_validates_against_the_advertised_output_schema() {
    let mut proxy = Client::new(fleet(&fleet_policy(), 240).await);
    let tools = proxy.tools().await;
    let fleet_show = tools.iter().find(|t| t["name"] == "fleet_show").unwrap();
    let schema = &fleet_show["outputSchema"];
    let validator = jsonschema::validator_for(schema).unwrap();
    let calls = [
        json!({}),
        json!({"detail": "full"}),
        json!({"horizon": "all", "limit": 3}),
        json!({"format": "csv"}),
        json!({"format": "tsv", "state": "blocked"}),
        json!({"streams": ["st-0001", "st-0002"], "horizon": "all", "detail": "full"}),
    ];
    for arguments in calls {
        let (result, _) = proxy.call("fleet_show", arguments.clone()).await;
        let structured = &result["structuredContent"];
        assert!(structured.is_object(), "{arguments}: {result}");
        if let Err(error) = validator.validate(structured) {
            panic!("{arguments}: structuredContent does not validate: {error}");
        }
    }
    // And the upstream's own schema would have rejected the summary: the rewrite is needed.
    let mut direct = Client::new(fleet_direct(10).await);
    let upstream_tools = direct.tools().await;
    let upstream_schema = &upstream_tools[0]["outputSchema"];
    let (summary, _) = proxy.call("fleet_show", json!({})).await;
    assert!(!jsonschema::is_valid(
        upstream_schema,
        &summary["structuredContent"]
    ));
}

#[tokio::test]
async fn descriptors_carry_the_budget_arguments_and_the_allowance() {
    let mut proxy = Client::new(fleet(&fleet_policy(), 10).await);
    let tools = proxy.tools().await;
    let fleet_show = tools.iter().find(|t| t["name"] == "fleet_show").unwrap();
    let properties = &fleet_show["inputSchema"]["properties"];
    assert_eq!(properties["horizon"]["enum"], json!(["live", "all"]));
    assert_eq!(properties["horizon"]["default"], "live");
    assert_eq!(properties["detail"]["enum"], json!(["summary", "full"]));
    let detail = properties["detail"]["description"].as_str().unwrap();
    assert!(
        detail.contains("\"summary\" (default)") && detail.contains("\"full\": every field"),
        "{detail}"
    );
    assert_eq!(properties["limit"]["minimum"], 1);
    assert_eq!(properties["limit"]["maximum"], 100);
    assert_eq!(properties["limit"]["default"], 25);
    assert_eq!(properties["format"]["enum"], json!(["json", "csv", "tsv"]));
    assert!(properties["after"]["type"] == "string");
    assert!(properties["state"]["anyOf"].is_array());
    assert!(
        properties["streams"]["description"]
            .as_str()
            .unwrap()
            .contains("stream_id")
    );
    let description = fleet_show["description"].as_str().unwrap();
    assert!(description.starts_with("Show the fleet"));
    assert!(description.contains("horizon:\"all\"") && description.contains("next_after"));
    assert_eq!(fleet_show["_meta"]["anthropic/maxResultSizeChars"], 200000);
    let detail_tool = tools.iter().find(|t| t["name"] == "stream_detail").unwrap();
    assert_eq!(detail_tool["_meta"]["anthropic/maxResultSizeChars"], 200000);
    assert!(
        detail_tool["inputSchema"]["properties"]
            .get("limit")
            .is_none()
    );
}

#[tokio::test]
async fn tools_without_a_rule_gain_only_after_and_are_still_budgeted() {
    let quirky = example("quirky_server");
    let policy = fleet_policy();
    let mut direct = Peer::quirky();
    handshake(&mut direct).await;
    let mut proxied = Peer::proxy(
        &["--policy", policy.to_str().unwrap()],
        &[quirky.to_str().unwrap()],
    );
    handshake(&mut proxied).await;
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    direct.send(list).await;
    proxied.send(list).await;
    // Automatic paging adds `after` to each tool no rule governs, and changes nothing else.
    for _ in 0..2 {
        let through = proxied.recv().await;
        let restored = common::without_auto_after(&through);
        assert_eq!(direct.recv().await, restored);
    }
    let big = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"big","arguments":{"bytes":300000}}}"#;
    proxied.send(big).await;
    let reply = proxied.recv_json().await;
    assert_eq!(reply["id"], 3);
    assert_eq!(reply["result"]["isError"], true);
    let message = reply["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        message.starts_with("result-too-large: big's result is 3000"),
        "{message}"
    );
    assert!(message.contains("cannot be paged"), "{message}");
    // Under the cap, untouched.
    let small = r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"big","arguments":{"bytes":10}}}"#;
    proxied.send(small).await;
    direct.send(small).await;
    assert_eq!(proxied.recv().await, direct.recv().await);
}

#[tokio::test]
async fn without_a_policy_the_default_budget_still_applies() {
    let quirky = example("quirky_server");
    let mut proxied = Peer::proxy(&[], &[quirky.to_str().unwrap()]);
    handshake(&mut proxied).await;
    proxied
        .send(r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"big","arguments":{"bytes":250000}}}"#)
        .await;
    let reply = proxied.recv_json().await;
    assert_eq!(reply["result"]["isError"], true);
    assert!(
        reply["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("more than the whole 200000-byte budget")
    );
}

#[tokio::test]
async fn stream_detail_is_budgeted_though_no_rule_pages_it() {
    let dir = std::env::temp_dir().join(format!("mcp-budget-cap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("small.toml");
    let text = std::fs::read_to_string(fleet_policy())
        .unwrap()
        .replace("max_bytes = 200000", "max_bytes = 5000");
    std::fs::write(&policy, text).unwrap();
    let mut proxy = Client::new(fleet(&policy, 10).await);
    let (result, _) = proxy
        .call("stream_detail", json!({"stream_id": "st-0003"}))
        .await;
    let message = text_of(&result);
    // Its rule only caps it, so automatic paging applies: one JSON line of 12 KB cannot be
    // split under a 5000-byte budget, and the refusal says so.
    assert!(
        message.starts_with("result-too-large: stream_detail's result is")
            && message.contains("more than the whole 5000-byte budget, so it cannot be paged"),
        "{message}"
    );
    // Its arguments pass through untouched (it takes no budget arguments).
    let (unknown, _) = proxy
        .call("stream_detail", json!({"stream_id": "st-9999", "limit": 5}))
        .await;
    assert_eq!(text_of(&unknown), "no stream named \"st-9999\"");
}

fn text_of(result: &Value) -> String {
    text(result).to_string()
}

#[tokio::test]
async fn check_and_explain() {
    let stdout = common::run_ok([std::ffi::OsStr::new("check"), fleet_policy().as_os_str()]);
    assert!(stdout.contains("fleet_show, wave_show: paged"), "{stdout}");

    let dir = std::env::temp_dir().join(format!("mcp-budget-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[[tool]]\nname = \"t\"\nitems = \"$.[x\"\n").unwrap();
    let out = common::run([std::ffi::OsStr::new("check"), bad.as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}:3:9: items: \"$.[x\" is not a valid JSONPath",
            bad.display()
        )),
        "{stderr}"
    );
    // The proxy refuses to start on a bad policy too.
    let out = common::run([
        std::ffi::OsStr::new("--policy"),
        bad.as_os_str(),
        "--".as_ref(),
        "true".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(2));

    let fleet = example("fleet_server");
    let policy = fleet_policy();
    let stdout = common::run_ok([
        "explain".as_ref(),
        policy.as_os_str(),
        "--tool".as_ref(),
        "wave_show".as_ref(),
        "--".as_ref(),
        fleet.as_os_str(),
    ]);
    let descriptor: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(descriptor["name"], "wave_show");
    assert!(descriptor["inputSchema"]["properties"]["wave"].is_object());
    assert_eq!(
        descriptor["inputSchema"]["properties"]["limit"]["maximum"],
        100
    );

    let file = dir.join("tools.json");
    std::fs::write(
        &file,
        r#"{"tools":[{"name":"fleet_show","inputSchema":{"type":"object"}}]}"#,
    )
    .unwrap();
    let out = common::run([
        "explain".as_ref(),
        policy.as_os_str(),
        "--tool".as_ref(),
        "nope".as_ref(),
        "--descriptor".as_ref(),
        file.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("no tool named \"nope\"; the descriptors have: fleet_show")
    );
}

#[tokio::test]
async fn csv_rows_cost_at_least_a_quarter_fewer_tokens_than_json_summary_rows() {
    let bpe = tiktoken_rs::o200k_base().unwrap();
    let mut proxy = Client::new(fleet(&fleet_policy(), 240).await);
    let (json_page, _) = proxy.call("fleet_show", json!({"limit": 100})).await;
    let (csv_page, _) = proxy
        .call("fleet_show", json!({"limit": 100, "format": "csv"}))
        .await;
    let rows = json_page["structuredContent"]["streams"]
        .as_array()
        .unwrap();
    let table = text(&csv_page);
    assert_eq!(table.lines().count(), rows.len() + 1);
    let json_tokens = bpe
        .encode_ordinary(&serde_json::to_string(rows).unwrap())
        .len();
    let csv_tokens = bpe.encode_ordinary(table).len();
    let saving = 1.0 - csv_tokens as f64 / json_tokens as f64;
    // For the record: the same six columns as JSON objects, against the table.
    let same_columns: Vec<Value> = rows
        .iter()
        .map(|r| json!({"stream_id": r["stream_id"], "state": r["state"], "owner": r["owner"], "wave": r["wave"], "updated_at": r["updated_at"], "last_gate.verdict": r["last_gate"]["verdict"]}))
        .collect();
    let same_tokens = bpe
        .encode_ordinary(&serde_json::to_string(&same_columns).unwrap())
        .len();
    println!(
        "{} rows: json summary {json_tokens} tokens, csv {csv_tokens} tokens ({:.0}% fewer); json of the same columns {same_tokens} ({:.0}% fewer as csv)",
        rows.len(),
        saving * 100.0,
        (1.0 - csv_tokens as f64 / same_tokens as f64) * 100.0
    );
    assert!(saving >= 0.25, "csv saves only {:.0}%", saving * 100.0);
}

#[tokio::test]
async fn terminal_streams_carry_80_to_85_percent_of_an_unbudgeted_fleet_show() {
    // Calibrated on the design text's measured record (83%): live gated and blocked streams
    // carry their own gate history and prose, terminal ones their expired liveness and history.
    for seed in ["1", "7", "42"] {
        let mut peer = Peer::spawn(
            example("fleet_server"),
            &["--streams", "240", "--seed", seed],
        );
        handshake(&mut peer).await;
        let mut direct = Client::new(peer);
        let (result, _) = direct.call("fleet_show", json!({})).await;
        let record = &result["structuredContent"];
        let total = serde_json::to_string(record).unwrap().len();
        let streams = record["streams"].as_array().unwrap();
        let size = |s: &Value| serde_json::to_string(s).unwrap().len();
        let is_terminal = |s: &&Value| TERMINAL.contains(&s["state"].as_str().unwrap());
        let terminal: usize = streams.iter().filter(is_terminal).map(size).sum();
        let share = terminal as f64 / total as f64;
        assert!(
            (0.80..=0.85).contains(&share),
            "seed {seed}: terminal streams are {:.1}% of the payload",
            share * 100.0
        );
        // Live gated/blocked streams have a gate history of their own.
        assert!(streams.iter().any(|s| {
            ["gated", "blocked"].contains(&s["state"].as_str().unwrap())
                && !s["gate_history"].as_array().unwrap().is_empty()
        }));
        // And the text content carries the same JSON as structuredContent.
        assert_eq!(
            serde_json::from_str::<Value>(text(&result)).unwrap(),
            *record
        );
    }
}

#[tokio::test]
async fn a_cursor_chain_returns_every_stream_that_stayed_live_once_while_the_fleet_moves() {
    // Each fleet_show call advances 12 live streams (running → gated → blocked → merged), so
    // that streams leave the live selection between pages, the last one of a page among them.
    let server = example("fleet_server");
    let policy = fleet_policy();
    let mut peer = Peer::proxy(
        &["--policy", policy.to_str().unwrap()],
        &[
            server.to_str().unwrap(),
            "--streams",
            "120",
            "--churn",
            "12",
        ],
    );
    handshake(&mut peer).await;
    let mut client = Client::new(peer);
    let mut seen: Vec<String> = Vec::new();
    let mut arguments = json!({"limit": 5});
    for _ in 0..60 {
        let (page, _) = client.call("fleet_show", arguments.clone()).await;
        assert_eq!(page["isError"], false, "{page}");
        for stream in page["structuredContent"]["streams"].as_array().unwrap() {
            seen.push(stream["stream_id"].as_str().unwrap().to_string());
        }
        match page["structuredContent"]["next_after"].as_str() {
            Some(next) => arguments = json!({"limit": 5, "after": next}),
            None => break,
        }
    }
    // The fleet as it ended (wave_show does not move it): the streams still live stayed live
    // throughout, since states only advance.
    let mut stayed = Vec::new();
    for wave in 1..=10 {
        let (result, _) = client
            .call("wave_show", json!({"wave": format!("w{wave}")}))
            .await;
        for stream in result["structuredContent"]["streams"].as_array().unwrap() {
            if !TERMINAL.contains(&stream["state"].as_str().unwrap()) {
                stayed.push(stream["stream_id"].as_str().unwrap().to_string());
            }
        }
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "a stream came twice: {seen:?}");
    let missing: Vec<&String> = stayed.iter().filter(|id| !seen.contains(id)).collect();
    assert!(
        missing.is_empty(),
        "streams that stayed live were never returned: {missing:?}"
    );
    assert!(
        stayed.len() >= 10,
        "the fleet must keep live streams for the test to mean anything"
    );
}
