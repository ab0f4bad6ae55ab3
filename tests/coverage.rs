//! What a proxy must be tested for and was not: session expiry, the restart limit, cursors
//! across processes, the cursor-key fallback, csv fields with newlines, text paging over
//! multi-byte characters, the Host/Origin allowances, and batches and timeouts over HTTP.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{INITIALIZE, PATIENCE, Peer, example, handshake};
use mcp_budget::budget::text;
use proptest::prelude::*;
use serde_json::{Value, json};

fn quirky() -> String {
    example("quirky_server").to_str().unwrap().to_string()
}

fn tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn http() -> reqwest::Client {
    tls();
    reqwest::Client::new()
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mcp-budget-coverage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn fleet_policy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/fleet.toml")
}

/// fleet.toml with its cursor key taken from `MCP_BUDGET_TEST_KEY`.
fn shared_key_policy() -> PathBuf {
    let path = temp("fleet-shared.toml");
    let text = std::fs::read_to_string(fleet_policy()).unwrap().replace(
        "[budget]\n",
        "[budget]\ncursor_key_env = \"MCP_BUDGET_TEST_KEY\"\n",
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn ping(client: &reqwest::Client, url: &str, session: &str, id: u64) -> u16 {
    let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
    let response = common::mcp_post(client, url, Some(session), &body)
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let _ = response.text().await;
    status
}

#[tokio::test]
async fn activity_and_a_request_in_flight_keep_a_session_from_expiring() {
    let (_proxy, url) = common::listen(&["--session-idle-secs", "2", "--", &quirky()], &[]).await;
    let client = http();
    let busy = common::mcp_initialize(&client, &url).await;
    let waiting = common::mcp_initialize(&client, &url).await;
    let idle = common::mcp_initialize(&client, &url).await;
    // `waiting` has a call in flight that the server never answers.
    let slow = common::mcp_post(
        &client,
        &url,
        Some(&waiting),
        r#"{"jsonrpc":"2.0","id":"w1","method":"tools/call","params":{"name":"slow"}}"#,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(slow.status(), 200);
    // `busy` pings every 200 ms for 4 s: twice the idle time.
    for k in 0..20 {
        assert_eq!(ping(&client, &url, &busy, 100 + k).await, 200, "ping {k}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // By now `idle` has expired (polled, so a slow machine only waits longer).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut k = 1000;
    while ping(&client, &url, &idle, k).await != 404 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the idle session never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        k += 1;
    }
    assert_eq!(
        ping(&client, &url, &waiting, 2000).await,
        200,
        "a session with a request in flight expired"
    );
    assert_eq!(ping(&client, &url, &busy, 2001).await, 200);
    drop(slow);
}

#[tokio::test]
async fn the_restart_limit_ends_the_session_and_requests_during_a_restart_are_answered() {
    let mut peer = Peer::proxy(&["--restart", "on-failure"], &[&quirky()]);
    handshake(&mut peer).await;
    let crash = |id: u64| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"crash"}}}}"#
        )
    };
    for k in 1..=5u64 {
        peer.send(&crash(k)).await;
        let error = peer.recv_json().await;
        assert_eq!(error["id"], k, "{error}");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("restarting the server"),
            "{error}"
        );
        // Sent while the server is being restarted (the backoff is at least 250 ms): it waits
        // for the new server, which answers it.
        peer.send(&format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"ping"}}"#,
            100 + k
        ))
        .await;
        let mut got = vec![peer.recv_json().await, peer.recv_json().await];
        got.sort_by_key(|m| m.get("id").is_some());
        assert_eq!(
            got[0]["method"], "notifications/tools/list_changed",
            "{got:?}"
        );
        assert_eq!(
            got[1],
            json!({"jsonrpc":"2.0","id":100 + k,"result":{}}),
            "{got:?}"
        );
    }
    // The sixth crash within the minute is one too many.
    peer.send(&crash(6)).await;
    let last = peer.recv_json().await;
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("crashed 6 times within a minute; not restarting it again"),
        "{last}"
    );
    assert_eq!(peer.wait().await.code(), Some(1));
}

#[tokio::test]
async fn restart_works_behind_the_listener_too() {
    let (_proxy, url) = common::listen(&["--restart", "on-failure", "--", &quirky()], &[]).await;
    let client = http();
    let session = common::mcp_initialize(&client, &url).await;
    let crashed = common::mcp_post(
        &client,
        &url,
        Some(&session),
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"crash"}}"#,
    )
    .header("accept", "application/json")
    .send()
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(crashed.contains("restarting the server"), "{crashed}");
    assert_eq!(
        ping(&client, &url, &session, 6).await,
        200,
        "the session goes on after the restart"
    );
}

/// One fleet_show page through a fresh proxy (with `env`), as the JSON result.
async fn fleet_page(policy: &Path, env: &[(&str, &str)], arguments: Value) -> Value {
    let server = example("fleet_server");
    let mut command = tokio::process::Command::new(common::proxy_bin());
    command
        .arg("--policy")
        .arg(policy)
        .arg("--")
        .arg(&server)
        .args(["--streams", "80"])
        .envs(env.iter().copied());
    let mut peer = Peer::from_command(command);
    handshake(&mut peer).await;
    let request = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fleet_show","arguments":arguments}});
    peer.send(&request.to_string()).await;
    let reply = peer.recv_json().await;
    reply["result"].clone()
}

#[tokio::test]
async fn a_cursor_from_one_process_is_accepted_by_another_with_the_same_key() {
    let policy = shared_key_policy();
    let first = fleet_page(&policy, &[("MCP_BUDGET_TEST_KEY", "same")], json!({})).await;
    let after = first["structuredContent"]["next_after"]
        .as_str()
        .unwrap()
        .to_string();
    let second = fleet_page(
        &policy,
        &[("MCP_BUDGET_TEST_KEY", "same")],
        json!({"after": after}),
    )
    .await;
    assert_eq!(second["isError"], false, "{second}");
    let ids = |page: &Value| -> Vec<String> {
        page["structuredContent"]["streams"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["stream_id"].as_str().unwrap().to_string())
            .collect()
    };
    let (a, b) = (ids(&first), ids(&second));
    assert!(!b.is_empty());
    assert!(a.iter().all(|id| !b.contains(id)), "page 2 repeats page 1");
    // Another key does not accept it.
    let foreign = fleet_page(
        &policy,
        &[("MCP_BUDGET_TEST_KEY", "other")],
        json!({"after": after}),
    )
    .await;
    assert_eq!(foreign["isError"], true, "{foreign}");
}

#[tokio::test]
async fn an_unset_cursor_key_variable_is_not_silent() {
    let policy = temp("unset-key.toml");
    std::fs::write(
        &policy,
        "[budget]\ncursor_key_env = \"MCP_BUDGET_SURELY_UNSET_KEY\"\n",
    )
    .unwrap();
    let mut peer = Peer::proxy(&["--policy", policy.to_str().unwrap()], &[&quirky()]);
    handshake(&mut peer).await;
    peer.close_stdin();
    peer.wait().await;
    let stderr = peer.stderr().await;
    assert!(
        stderr.contains("cursor key variable is unset or empty")
            && stderr.contains("MCP_BUDGET_SURELY_UNSET_KEY"),
        "{stderr}"
    );
}

#[test]
fn csv_fields_with_newlines_commas_and_quotes_survive_a_real_csv_parser() {
    use mcp_budget::budget::Budget;
    use mcp_budget::budget::cursor::CursorKey;
    use mcp_budget::policy::Policy;
    let policy = Policy::parse(
        "[[tool]]\nname = \"t\"\nitems = \"$.items\"\n[tool.format]\ncolumns = [\"id\", \"note\"]\n",
        Path::new("csv.toml"),
    )
    .unwrap();
    let budget = Budget::with_key(policy, CursorKey::from_secret(b"csv"));
    let notes = [
        "two\nlines",
        "comma, inside",
        "a \"quoted\" word",
        "crlf\r\nline",
        "",
        "tab\there",
    ];
    let items: Vec<Value> = notes
        .iter()
        .enumerate()
        .map(|(i, n)| json!({"id": format!("i{i}"), "note": n}))
        .collect();
    let document = json!({"items": items});
    let result = json!({"content": [{"type": "text", "text": document.to_string()}], "structuredContent": document});
    let mut params = json!({"name": "t", "arguments": {"format": "csv", "limit": 25}});
    let plan = budget.prepare_call(&mut params).unwrap();
    let out: Value =
        serde_json::from_slice(&budget.finish_call(&plan, result).unwrap().bytes().unwrap())
            .unwrap();
    let table = out["content"][0]["text"].as_str().unwrap();
    let mut reader = csv::ReaderBuilder::new().from_reader(table.as_bytes());
    let rows: Vec<(String, String)> = reader
        .records()
        .map(|r| {
            let r = r.unwrap();
            (r[0].to_string(), r[1].to_string())
        })
        .collect();
    let expected: Vec<(String, String)> = notes
        .iter()
        .enumerate()
        .map(|(i, n)| (format!("i{i}"), n.to_string()))
        .collect();
    assert_eq!(rows, expected);
}

/// Text made of pieces that stress paging: 1- to 4-byte characters, CRLF and LF line ends.
fn arb_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("a".to_string()),
            Just("é".to_string()),
            Just("€".to_string()),
            Just("😀".to_string()),
            Just("\n".to_string()),
            Just("\r\n".to_string()),
            "[a-z ]{0,30}".prop_map(String::from),
            any::<char>().prop_map(|c| c.to_string()),
        ],
        0..200,
    )
    .prop_map(|pieces| pieces.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Pages are valid UTF-8, within the budget, end after a line end unless one line is longer
    /// than the budget, and concatenate to the text exactly.
    #[test]
    fn text_pages_reassemble_exactly_over_multibyte_characters_and_crlf(
        text in arb_text(),
        budget in 4usize..64,
    ) {
        let mut start = 0;
        let mut rebuilt = String::new();
        let mut guard = 0;
        while start < text.len() {
            let page = text::page(&text, start, budget);
            prop_assert!(page.end > page.start, "no progress at {}", start);
            prop_assert!(page.end - page.start <= budget);
            let piece = &text[page.start..page.end]; // panics off a char boundary
            if !page.split_line && page.end < text.len() {
                prop_assert!(piece.ends_with('\n'), "{:?}", piece);
            }
            rebuilt.push_str(piece);
            start = page.end;
            guard += 1;
            prop_assert!(guard <= text.len() + 1);
        }
        prop_assert_eq!(rebuilt, text);
    }
}

#[tokio::test]
async fn allow_host_and_allow_origin_extend_what_is_accepted() {
    let (_proxy, url) = common::listen(
        &[
            "--allow-host",
            "mcp.internal",
            "--allow-origin",
            "https://app.example",
            "--",
            &quirky(),
        ],
        &[],
    )
    .await;
    let client = http();
    let post = |host: Option<&str>, origin: Option<&str>| {
        let mut request = common::mcp_post(&client, &url, None, INITIALIZE);
        if let Some(host) = host {
            request = request.header("host", host);
        }
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send()
    };
    assert_eq!(
        post(Some("mcp.internal:8080"), None)
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        post(Some("other.internal"), None).await.unwrap().status(),
        403
    );
    assert_eq!(
        post(None, Some("https://app.example"))
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        post(None, Some("https://evil.example"))
            .await
            .unwrap()
            .status(),
        403
    );
}

#[tokio::test]
async fn batches_and_request_timeouts_over_http() {
    let (_proxy, url) =
        common::listen(&["--request-timeout-secs", "0.5", "--", &quirky()], &[]).await;
    let client = http();
    let session = common::mcp_initialize(&client, &url).await;
    let batch = r#"[{"jsonrpc":"2.0","id":"b1","method":"ping"},{"jsonrpc":"2.0","id":"b2","method":"tools/call","params":{"name":"slow"}}]"#;
    let body = client
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .header("mcp-session-id", &session)
        .body(batch)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let answers: Vec<Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(answers.len(), 2, "{body}");
    let by_id = |id: &str| {
        answers
            .iter()
            .find(|a| a["id"] == id)
            .unwrap_or_else(|| panic!("no {id}: {body}"))
    };
    assert_eq!(by_id("b1")["result"], json!({}));
    assert_eq!(
        by_id("b2")["error"]["message"],
        "the server did not answer tools/call within 0.5 s (--request-timeout-secs); the request was cancelled"
    );
}

#[tokio::test]
async fn healthz_answers_a_load_balancer_without_a_token() {
    let (_proxy, url) = common::listen(
        &[
            "--auth-token-env",
            "T",
            "--max-sessions",
            "1",
            "--",
            &quirky(),
        ],
        &[("T", "s3cret")],
    )
    .await;
    let client = http();
    let health = url.replace("/mcp", "/healthz");
    let response = client.get(&health).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "ok\n");
    // The MCP path itself still wants the token.
    let refused = common::mcp_post(&client, &url, None, INITIALIZE)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    // Full: the one session slot is taken, so the balancer should send new sessions elsewhere.
    let opened = common::mcp_post(&client, &url, None, INITIALIZE)
        .header("authorization", "Bearer s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(opened.status(), 200);
    let response = client.get(&health).send().await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.text().await.unwrap(), "unavailable\n");
}
