//! Bad input never panics: random bytes and well-formed-but-wrong JSON-RPC fed to the framing,
//! the envelope reader, the relay, the cursor decoder and the policy loader — always a typed
//! error or a clear JSON-RPC error, never a crash.

use std::path::Path;

use mcp_budget::budget::Budget;
use mcp_budget::budget::cursor::CursorKey;
use mcp_budget::intercept::Interceptor;
use mcp_budget::policy::Policy;
use mcp_budget::relay::Relay;
use mcp_budget::wire::framing::{Frame, FrameReader};
use mcp_budget::wire::message;
use proptest::prelude::*;
use serde_json::{Value, json};

fn fleet_relay() -> Relay {
    let policy =
        Policy::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/fleet.toml")).unwrap();
    Relay::new(Interceptor::new(Budget::with_key(
        policy,
        CursorKey::from_secret(b"t"),
    )))
}

/// Arbitrary JSON values, nested a few levels.
fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// JSON-RPC-shaped messages with wrong parts: odd ids, methods, params, results.
fn arb_message() -> impl Strategy<Value = Value> {
    let method = prop_oneof![
        Just(json!("tools/call")),
        Just(json!("tools/list")),
        Just(json!("initialize")),
        Just(json!("notifications/cancelled")),
        ".{0,10}".prop_map(Value::from),
        arb_json(),
    ];
    (
        prop::option::of(arb_json()),
        prop::option::of(method),
        prop::option::of(arb_json()),
        prop::option::of(arb_json()),
        prop::option::of(arb_json()),
    )
        .prop_map(|(id, method, params, result, error)| {
            let mut m = serde_json::Map::new();
            m.insert("jsonrpc".into(), json!("2.0"));
            for (k, v) in [
                ("id", id),
                ("method", method),
                ("params", params),
                ("result", result),
                ("error", error),
            ] {
                if let Some(v) = v {
                    m.insert(k.into(), v);
                }
            }
            Value::Object(m)
        })
}

fn tools_call(arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "fleet_show", "arguments": arguments}})
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn the_envelope_reader_accepts_exactly_the_json_text(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        // It reads a line as JSON exactly when serde_json does, and never panics.
        let ours = message::parse(&bytes).is_ok();
        let theirs = serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_ok();
        prop_assert_eq!(ours, theirs);
        if message::cancelled_request_id(&bytes).is_some() {
            prop_assert!(bytes.windows(9).any(|w| w == b"requestId"));
        }
    }

    #[test]
    fn the_envelope_reader_classifies_json_rpc_objects(id in 0u32..1000, method in "[a-z/]{1,12}", kind in 0u8..3) {
        let line = match kind {
            0 => json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {"x": [1, 2]}}),
            1 => json!({"jsonrpc": "2.0", "method": method}),
            _ => json!({"jsonrpc": "2.0", "id": id, "result": {"method": method}}),
        };
        let parsed = message::parse(line.to_string().as_bytes()).unwrap();
        let expected = match kind {
            0 => message::Kind::Request {
                id: message::Id::from_json_text(&id.to_string()),
                method: method.clone(),
                progress: None,
                modern: None,
                // Where a call's parts are: a call's params here have neither.
                call: (method == "tools/call").then(message::CallAt::default),
            },
            1 => message::Kind::Notification { method: method.clone() },
            _ => {
                // The result's range is where `"result":` puts it.
                let text = line.to_string();
                let start = text.find("\"result\":").unwrap() + "\"result\":".len();
                message::Kind::Response {
                    id: Some(message::Id::from_json_text(&id.to_string())),
                    result: Some(start..text.len() - 1),
                }
            }
        };
        prop_assert_eq!(parsed, message::Parsed::Single(expected));
    }

    #[test]
    fn framing_keeps_every_line_exactly(bytes in prop::collection::vec(prop_oneof![Just(b'\n'), Just(b' '), any::<u8>()], 0..2000), max in 1usize..300) {
        // What the reader must produce, worked out independently: each line (the last one
        // even without its newline), blank ones skipped, those over `max` as TooLarge.
        let mut segments: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
        if bytes.last() == Some(&b'\n') || bytes.is_empty() {
            segments.pop();
        }
        let expected: Vec<(bool, Vec<u8>, usize)> = segments
            .into_iter()
            .filter_map(|line| {
                if line.len() > max {
                    Some((false, Vec::new(), line.len()))
                } else if line.iter().all(u8::is_ascii_whitespace) {
                    None
                } else {
                    Some((true, line.to_vec(), line.len()))
                }
            })
            .collect();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let got = runtime.block_on(async {
            let mut reader = FrameReader::new(bytes.as_slice(), max);
            let mut got = Vec::new();
            while let Ok(Some(frame)) = reader.next_frame().await {
                got.push(match frame {
                    Frame::Line(line) => (true, line.clone(), line.len()),
                    Frame::TooLarge { bytes, .. } => (false, Vec::new(), bytes),
                    Frame::Read { .. } => unreachable!("the reader does not read envelopes"),
                });
            }
            got
        });
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn the_relay_answers_every_wrong_message_without_panicking(messages in prop::collection::vec(arb_message(), 1..8)) {
        let relay = fleet_relay();
        // The ids of the requests that went upstream: only those may be answered.
        let mut asked = std::collections::HashSet::new();
        for message in messages {
            let routed = relay.from_client(Frame::Line(message.to_string().into_bytes()));
            if routed.to_server.is_some()
                && message.get("method").is_some()
                && let Some(id) = message.get("id").filter(|id| !id.is_null())
            {
                asked.insert(message::Id::from_json_text(&id.to_string()).key().to_string());
            }
            for answer in routed.to_client {
                let answer: Value = serde_json::from_slice(&answer).expect("the proxy writes JSON");
                prop_assert_eq!(&answer["jsonrpc"], "2.0");
            }
            // And the same shapes coming back from a server: whatever passes is still the JSON
            // that came in, and no response for an id nobody asked passes.
            if let Some(delivered) = relay.from_server(Frame::Line(message.to_string().into_bytes())) {
                let delivered: Value = serde_json::from_slice(&delivered).expect("the proxy forwards JSON");
                let is_response = delivered.get("method").is_none()
                    && (delivered.get("result").is_some() || delivered.get("error").is_some());
                let id = delivered
                    .get("id")
                    .filter(|id| !id.is_null())
                    .map(|id| message::Id::from_json_text(&id.to_string()).key().to_string());
                prop_assert!(
                    !is_response || id.is_none_or(|id| asked.contains(&id)),
                    "an answer to a request never sent passed: {}", delivered
                );
            }
        }
    }

    #[test]
    fn wrong_budget_arguments_are_tool_errors(arguments in arb_json()) {
        let relay = fleet_relay();
        let routed = relay.from_client(Frame::Line(tools_call(arguments).to_string().into_bytes()));
        // Either forwarded upstream, or answered with a tool error the model can read: never
        // neither, never both.
        prop_assert_eq!(routed.to_server.is_some(), routed.to_client.is_empty());
        for answer in routed.to_client {
            let answer: Value = serde_json::from_slice(&answer).unwrap();
            // A number JSON readers read differently is refused before any tool sees it.
            if answer["error"]["message"].as_str().is_some_and(|m| m.contains("a number JSON readers read differently")) {
                continue;
            }
            prop_assert_eq!(&answer["result"]["isError"], true);
            prop_assert!(answer["result"]["content"][0]["text"].as_str().is_some_and(|t| !t.is_empty()));
        }
    }

    #[test]
    fn the_cursor_decoder_refuses_random_cursors(cursor in ".{0,120}") {
        let relay = fleet_relay();
        let routed = relay.from_client(Frame::Line(tools_call(json!({"after": cursor})).to_string().into_bytes()));
        prop_assert!(routed.to_server.is_none());
        let answer: Value = serde_json::from_slice(&routed.to_client[0]).unwrap();
        prop_assert!(answer["result"]["content"][0]["text"].as_str().unwrap().starts_with("after is not a cursor this proxy issued"));
    }

    #[test]
    fn the_policy_loader_returns_typed_errors(text in "(\\[\\[tool\\]\\]|\\[budget\\]|name|items|max_bytes|limit|=|\"\\$\\.x\"|\"\\[\"|[0-9]{1,3}|\n| |\\{|\\}|\\[|\\]|,|-){0,40}") {
        let _ = Policy::parse(&text, Path::new("random.toml"));
    }
}

#[test]
fn deep_nesting_huge_numbers_and_invalid_utf8_get_clear_errors() {
    let relay = fleet_relay();
    // A 10,000-deep JSON array: refused as an invalid request before anything parses it.
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let routed = relay.from_client(Frame::Line(deep.into_bytes()));
    assert!(routed.to_server.is_none());
    let answer: Value = serde_json::from_slice(&routed.to_client[0]).unwrap();
    assert_eq!(answer["error"]["code"], -32600);
    assert_eq!(
        answer["error"]["message"],
        "Invalid Request: the message nests deeper than 128 levels; send a flatter value"
    );
    // Deep arguments of a budgeted tool: refused before the budget (or the server) reads them,
    // under the request's id.
    let deep_arguments = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"fleet_show","arguments":{{"x":{}1{}}}}}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let routed = relay.from_client(Frame::Line(deep_arguments.into_bytes()));
    assert!(routed.to_server.is_none());
    let answer: Value = serde_json::from_slice(&routed.to_client[0]).unwrap();
    assert_eq!(
        (answer["id"].clone(), answer["error"]["code"].clone()),
        (json!(7), json!(-32600))
    );
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nests deeper than 128 levels"),
        "{answer}"
    );
    // A number JSON readers read differently is refused as such, before the budget reads it.
    let line = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"fleet_show","arguments":{"limit":18446744073709551616}}}"#;
    let routed = relay.from_client(Frame::Line(line.as_bytes().to_vec()));
    assert!(routed.to_server.is_none());
    let answer: Value = serde_json::from_slice(&routed.to_client[0]).unwrap();
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("send it as a string")
    );
    // Huge numbers as limits.
    for limit in ["1e300", "-0", "100.0"] {
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"fleet_show","arguments":{{"limit":{limit}}}}}}}"#
        );
        let routed = relay.from_client(Frame::Line(line.into_bytes()));
        let answer: Value = serde_json::from_slice(&routed.to_client[0]).unwrap();
        assert_eq!(
            answer["result"]["content"][0]["text"], "limit must be an integer between 1 and 100",
            "limit {limit}"
        );
    }
    // Invalid UTF-8 from a client.
    let mut bytes = br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":""#.to_vec();
    bytes.extend_from_slice(&[0xff, 0xfe]);
    bytes.extend_from_slice(br#""}}"#);
    let routed = relay.from_client(Frame::Line(bytes));
    let answer: Value = serde_json::from_slice(&routed.to_client[0]).unwrap();
    assert_eq!(answer["error"]["code"], -32700);
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid unicode")
            || answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("UTF-8"),
        "{answer}"
    );
}
