//! A large item list narrowed where it lies (`budget::reduce`) gives the client exactly the
//! bytes the whole pipeline gives: every scenario runs through two relays on the same policy
//! and cursor key, one of them reading results whole, and their answers must be equal byte for
//! byte. The fast path is also checked to be the one taken (or declined) where it should be.

#[path = "../examples/fleet/record.rs"]
mod record;

use std::path::Path;

use mcp_budget::budget::Budget;
use mcp_budget::budget::cursor::CursorKey;
use mcp_budget::budget::{args, reduce};
use mcp_budget::intercept::Interceptor;
use mcp_budget::policy::Policy;
use mcp_budget::relay::Relay;
use mcp_budget::wire::framing::Frame;
use serde_json::{Value, json};

fn policy() -> Policy {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/fleet.toml");
    Policy::load(&path).expect("policies/fleet.toml")
}

fn relay(whole: bool) -> Relay {
    relay_for(None, whole)
}

/// A relay whose session was initialized by `client` (its profile fits the pages).
fn relay_for(client: Option<&str>, whole: bool) -> Relay {
    let budget = Budget::with_key(policy(), CursorKey::from_secret(b"reduce test"));
    let budget = if whole {
        budget.reading_whole()
    } else {
        budget
    };
    let relay = Relay::new(Interceptor::new(budget));
    if let Some(name) = client {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": name, "version": "1"}}});
        relay.from_client(Frame::Line(init.to_string().into_bytes()));
        let answer = r#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"fleet","version":"1"}}}"#;
        relay.from_server(Frame::Line(answer.as_bytes().to_vec()));
    }
    relay
}

/// What the client receives for `fleet_show(arguments)` answered with `result`.
fn call(relay: &Relay, id: u64, arguments: &Value, result: &str) -> Vec<u8> {
    let request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "fleet_show", "arguments": arguments}});
    let routed = relay.from_client(Frame::Line(request.to_string().into_bytes()));
    if routed.to_server.is_none() {
        return routed.to_client.concat();
    }
    let reply = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#);
    relay
        .from_server(Frame::Line(reply.into_bytes()))
        .expect("an answer")
}

/// The fleet server's result, spelled as it spells it: the record as JSON text and as
/// `structuredContent`.
fn fleet_result(record: &Value) -> Value {
    json!({
        "content": [{"type": "text", "text": record.to_string()}],
        "structuredContent": record,
        "isError": false,
    })
}

/// Both relays answer `arguments`, then follow `next_after` for up to `pages` pages; every
/// answer must be the same bytes. Returns the pages' texts.
fn same_answers(result: &Value, arguments: Value, pages: usize) -> Vec<String> {
    same_answers_for(None, &result.to_string(), arguments, pages)
}

fn same_answers_for(
    client: Option<&str>,
    result: &str,
    arguments: Value,
    pages: usize,
) -> Vec<String> {
    let (fast, whole) = (relay_for(client, false), relay_for(client, true));
    let mut arguments = arguments;
    let mut out = Vec::new();
    for page in 0..pages {
        let id = page as u64 + 1;
        let a = call(&fast, id, &arguments, result);
        let b = call(&whole, id, &arguments, result);
        assert_eq!(
            String::from_utf8_lossy(&a),
            String::from_utf8_lossy(&b),
            "page {page} of {arguments} for {client:?}"
        );
        let text = String::from_utf8(a).expect("UTF-8");
        let answer: Value = serde_json::from_str(&text).expect("JSON");
        out.push(text);
        let next = answer["result"]["structuredContent"]["next_after"].as_str();
        match next {
            Some(next) => {
                arguments["after"] = json!(next);
            }
            None => break,
        }
    }
    out
}

#[test]
fn pages_of_a_reduced_list_are_the_whole_pipelines_bytes() {
    let record = record::fleet_show(300, 11);
    let result = fleet_result(&record);
    let scenarios = [
        json!({}),
        json!({"limit": 7}),
        json!({"horizon": "all", "detail": "full", "limit": 40}),
        json!({"horizon": "all", "detail": "full", "limit": 100}),
        json!({"format": "csv", "limit": 30}),
        json!({"format": "tsv", "horizon": "all"}),
        json!({"state": "running", "limit": 9}),
        json!({"state": ["gated", "blocked"], "detail": "full", "limit": 4}),
        json!({"streams": ["st-0003", "st-0007", "st-0150"]}),
        json!({"state": "no-such-state"}),
        json!({"limit": 1000}),
    ];
    let mut paged = 0;
    for arguments in scenarios {
        paged += same_answers(&result, arguments, 4).len();
    }
    assert!(paged > 11, "the scenarios follow cursors ({paged} pages)");
}

/// A client whose budget is smaller than a default page gets the page made again with fewer
/// items: from the reduced list, the same bytes as from the whole one.
#[test]
fn pages_fitted_to_a_client_are_the_same_bytes() {
    let record = record::fleet_show(300, 17);
    let result = fleet_result(&record);
    for client in [
        "codex-mcp-client",
        "github-copilot-developer",
        "claude-code",
        "another-ide",
    ] {
        for arguments in [json!({}), json!({"horizon": "all"}), json!({"limit": 40})] {
            let pages = same_answers_for(Some(client), &result.to_string(), arguments.clone(), 3);
            assert!(!pages.is_empty());
            if client == "github-copilot-developer" && arguments == json!({}) {
                // The default of 10 items does not fit 10,240 bytes (both halves count for
                // Copilot CLI): fewer were sent, and said.
                assert!(pages[0].len() < 10_240, "{}", pages[0].len());
                assert!(pages[0].contains("lowered"), "{}", &pages[0][..300]);
            }
        }
    }
}

/// A list in the JSON of a text block (no structuredContent, or one that repeats the text):
/// reduced, and the same bytes.
#[test]
fn lists_in_a_text_block_are_reduced_to_the_same_bytes() {
    let record = record::fleet_show(200, 23);
    let text = record.to_string();
    let only_text = json!({"content": [{"type": "text", "text": text}]});
    let mirrored = json!({"content": [{"type": "text", "text": text}],
        "structuredContent": {"path": "/x", "content": text}});
    for result in [&only_text, &mirrored] {
        for arguments in [
            json!({}),
            json!({"limit": 9, "horizon": "all"}),
            json!({"format": "csv"}),
            json!({"state": "running", "detail": "full"}),
        ] {
            let pages = same_answers(result, arguments.clone(), 3);
            assert!(!pages.is_empty(), "{arguments}");
        }
    }
    let policy = policy();
    let items = policy
        .rule_for("fleet_show")
        .and_then(|r| r.items.clone())
        .unwrap();
    let key = CursorKey::from_secret(b"reduce test");
    let mut none = serde_json::Map::new();
    let args = args::take("fleet_show", &mut none, &items, &key).unwrap();
    for result in [&only_text, &mirrored] {
        let reduced = reduce::reduce(&items, &args, &result.to_string()).expect("reduced");
        assert!(reduced.text.len() < text.len() / 4);
        let small: Value = serde_json::from_str(&reduced.text).unwrap();
        let inner: Value =
            serde_json::from_str(small["content"][0]["text"].as_str().unwrap()).unwrap();
        assert!(inner["streams"].as_array().unwrap().len() <= 25);
        if result == &mirrored {
            assert_eq!(
                small["structuredContent"]["content"],
                small["content"][0]["text"]
            );
        }
    }
}

#[test]
fn other_shapes_give_the_same_bytes_whether_reduced_or_declined() {
    let record = record::fleet_show(60, 5);
    let text = record.to_string();
    let pretty = serde_json::to_string_pretty(&record).expect("JSON");
    let shapes = [
        // structuredContent alone.
        json!({"structuredContent": record}),
        // The text block is a pretty copy (not the exact one): declined, same bytes.
        json!({"content": [{"type": "text", "text": pretty}], "structuredContent": record}),
        // Another JSON text block before the copy: declined.
        json!({"content": [{"type": "text", "text": "{\"note\":1}"}, {"type": "text", "text": text}],
            "structuredContent": record}),
        // A plain text block first, an image after, the copy in between.
        json!({"content": [{"type": "text", "text": "Fleet:"}, {"type": "text", "text": text},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"}], "structuredContent": record}),
        // Members in another order, a member the budget does not know, an explicit isError.
        json!({"isError": false, "structuredContent": record, "_meta": {"x": [1.50, 2e3]},
            "content": [{"text": text, "type": "text"}]}),
        // A tool error is never paged.
        json!({"isError": true, "content": [{"type": "text", "text": text}], "structuredContent": record}),
        // The list is not where the rule says: the text is searched, as before.
        json!({"content": [{"type": "text", "text": text}], "structuredContent": {"other": 1}}),
    ];
    for (n, shape) in shapes.iter().enumerate() {
        for arguments in [
            json!({}),
            json!({"limit": 5, "horizon": "all"}),
            json!({"format": "csv"}),
        ] {
            let pages = same_answers(shape, arguments.clone(), 3);
            assert!(!pages.is_empty(), "shape {n}, {arguments}");
        }
    }
}

/// The server's own spelling of numbers, escapes and key order survives in the page.
#[test]
fn kept_items_keep_the_servers_spelling() {
    let items: Vec<String> = (0..40)
        .map(|n| {
            format!(
                r#"{{"stream_id":"st-{n:04}" , "state":"running","score":1.50,"title":"caf\u00e9 {n}","owner":"o","updated_at":"2026-11-30T00:00:{:02}Z"}}"#,
                n % 60
            )
        })
        .collect();
    let structured = format!(
        r#"{{ "streams" : [ {} ], "wave":"w1" }}"#,
        items.join(" ,\n ")
    );
    let literal = serde_json::to_string(&structured).expect("string");
    let raw = format!(
        r#"{{"content":[{{"type":"text","text":{literal}}}],"structuredContent":{structured}}}"#
    );
    let (fast, whole) = (relay(false), relay(true));
    let arguments = json!({"detail": "full", "limit": 3});
    let request = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "fleet_show", "arguments": arguments}})
        .to_string()
        .into_bytes()
    };
    let reply = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{raw}}}"#).into_bytes();
    fast.from_client(Frame::Line(request(1)));
    whole.from_client(Frame::Line(request(1)));
    let a = fast
        .from_server(Frame::Line(reply.clone()))
        .expect("answer");
    let b = whole.from_server(Frame::Line(reply)).expect("answer");
    assert_eq!(a, b);
    let text = String::from_utf8(a).expect("UTF-8");
    assert!(text.contains(r#""score":1.50"#), "{text}");
    assert!(text.contains(r#"caf\u00e9 0"#), "{text}");
    // The text block's copy of structuredContent is written from the same bytes.
    let answer: Value = serde_json::from_str(&text).expect("JSON");
    let copy = answer["result"]["content"][0]["text"]
        .as_str()
        .expect("text");
    assert!(copy.contains(r#""score":1.50"#), "{copy}");
    assert!(copy.contains(r#"caf\u00e9 0"#), "{copy}");
}

/// The fast path is the one taken for the fleet's result, and declined where it must be.
#[test]
fn the_fleet_result_is_reduced_and_odd_shapes_are_not() {
    let policy = policy();
    let rule = policy.rule_for("fleet_show").expect("rule");
    let items = rule.items.as_ref().expect("items");
    let key = CursorKey::from_secret(b"reduce test");
    let take = |arguments: Value| {
        let Value::Object(mut map) = arguments else {
            unreachable!()
        };
        args::take("fleet_show", &mut map, items, &key).expect("arguments")
    };
    let record = record::fleet_show(200, 3);
    let raw = fleet_result(&record).to_string();
    let reduced = reduce::reduce(items, &take(json!({"limit": 10})), &raw).expect("reduced");
    // Only the page's items are left, in both copies.
    let small: Value = serde_json::from_str(&reduced.text).expect("JSON");
    let kept = small["structuredContent"]["streams"]
        .as_array()
        .expect("list");
    assert!(kept.len() <= 10, "{}", kept.len());
    assert!(reduced.text.len() < raw.len() / 5);
    let copy: Value =
        serde_json::from_str(small["content"][0]["text"].as_str().expect("text")).expect("JSON");
    assert_eq!(copy, small["structuredContent"]);
    assert_eq!(reduced.narrowed.total_count, 200);
    assert!(reduced.narrowed.matching <= 200 && reduced.narrowed.next.is_some());
    // Declined: a nested rule's path, a tool error, a pretty copy of the record.
    let error = json!({"isError": true, "structuredContent": record}).to_string();
    assert!(reduce::reduce(items, &take(json!({})), &error).is_none());
    let pretty = serde_json::to_string_pretty(&record).expect("JSON");
    let declined =
        json!({"content": [{"type": "text", "text": "{}"}, {"type": "text", "text": pretty}],
        "structuredContent": record})
        .to_string();
    assert!(reduce::reduce(items, &take(json!({})), &declined).is_none());
}

/// 500 random results, spelled as servers spell them (spaces, escapes, number forms, duplicate
/// keys, missing fields, items that are not objects, copies and other text blocks), with random
/// arguments and cursors: the reduced list and the whole one always give the same bytes.
#[test]
fn random_results_give_the_same_bytes_either_way() {
    let mut reduced = 0;
    for seed in 0..500u64 {
        let mut rng = record::Rng::new(seed);
        let (result, arguments, client) = random_case(&mut rng);
        if let Err(err) = serde_json::from_str::<Value>(&result) {
            panic!("seed {seed}: the generator wrote bad JSON ({err}): {result}");
        }
        let pages = same_answers_for(client, &result, arguments, 3);
        assert!(!pages.is_empty(), "seed {seed}");
        let policy = policy();
        let items = policy.rule_for("fleet_show").and_then(|r| r.items.clone());
        let key = CursorKey::from_secret(b"reduce test");
        let mut none = serde_json::Map::new();
        if let Some(items) = items
            && let Ok(args) = args::take("fleet_show", &mut none, &items, &key)
            && reduce::reduce(&items, &args, &result).is_some()
        {
            reduced += 1;
        }
    }
    // Many cases take the fast path (the rest check the declines: isError, other blocks, …).
    assert!(reduced > 150, "{reduced} of 500 reduced");
}

fn ws(rng: &mut record::Rng) -> &'static str {
    ["", "", "", " ", "\n  ", "\t"][rng.below(6)]
}

/// A random JSON string literal, sometimes with escapes.
fn string(rng: &mut record::Rng, text: &str) -> String {
    match rng.below(6) {
        0 => format!("\"{text}\\u00e9\""),
        1 => format!("\"{text}\\n\\\"q\\\"\""),
        2 => format!("\"\\u0073{text}\""),
        _ => format!("\"{text}\""),
    }
}

fn number(rng: &mut record::Rng) -> String {
    ["1.50", "2", "-0", "1e3", "0.1", "12345678901234567890"][rng.below(6)].to_string()
}

fn object(rng: &mut record::Rng, members: Vec<(String, String)>) -> String {
    let mut out = String::from("{");
    for (n, (key, value)) in members.iter().enumerate() {
        if n > 0 {
            out.push(',');
        }
        out.push_str(ws(rng));
        out.push_str(&format!("\"{key}\"{}:{}{value}", ws(rng), ws(rng)));
    }
    out.push_str(ws(rng));
    out.push('}');
    out
}

fn random_item(rng: &mut record::Rng, n: usize) -> String {
    if rng.below(40) == 0 {
        return ["7", "\"loose\"", "null", "[1,2]"][rng.below(4)].to_string();
    }
    let states = [
        "running",
        "merged",
        "closed-without-merge",
        "gated",
        "blocked",
    ];
    let mut members: Vec<(String, String)> = Vec::new();
    if rng.below(20) != 0 {
        let id = if rng.below(25) == 0 {
            format!("{n}")
        } else {
            string(rng, &format!("st-{n:04}"))
        };
        members.push(("stream_id".into(), id));
    }
    if rng.below(15) != 0 {
        let state = states[rng.below(states.len())];
        members.push(("state".into(), string(rng, state)));
    }
    members.push(("title".into(), string(rng, &format!("Stream {n}"))));
    members.push(("owner".into(), string(rng, "agent-ada")));
    members.push(("score".into(), number(rng)));
    let gate = vec![
        ("verdict".to_string(), string(rng, "pass")),
        ("at".to_string(), number(rng)),
    ];
    let verdict = object(rng, gate);
    members.push(("last_gate".into(), verdict));
    if rng.below(10) == 0 {
        // A duplicate key: the last one counts.
        let state = states[rng.below(states.len())];
        members.push(("state".into(), format!("\"{state}\"")));
    }
    for _ in 0..rng.below(3) {
        let k = rng.below(members.len());
        let j = rng.below(members.len());
        members.swap(k, j);
    }
    object(rng, members)
}

/// A result's text, the call's arguments and the client.
fn random_case(rng: &mut record::Rng) -> (String, Value, Option<&'static str>) {
    let count = rng.below(40);
    let items: Vec<String> = (0..count).map(|n| random_item(rng, n)).collect();
    let mut list = String::from("[");
    for (n, item) in items.iter().enumerate() {
        if n > 0 {
            list.push_str(ws(rng));
            list.push(',');
        }
        list.push_str(ws(rng));
        list.push_str(item);
    }
    list.push_str(ws(rng));
    list.push(']');
    let mut structured_members = vec![("streams".to_string(), list)];
    if rng.below(3) == 0 {
        structured_members.insert(0, ("wave".into(), string(rng, "w4")));
    }
    if rng.below(8) == 0 {
        structured_members.insert(0, ("streams".into(), "[{\"stream_id\":\"decoy\"}]".into()));
    }
    let structured = object(rng, structured_members);
    let copy = serde_json::to_string(&structured).expect("string");
    let pretty = serde_json::to_string(
        &serde_json::to_string_pretty(&serde_json::from_str::<Value>(&structured).expect("JSON"))
            .expect("JSON"),
    )
    .expect("string");
    let block = |text: &str| format!("{{\"type\":\"text\",\"text\":{text}}}");
    let content = match rng.below(7) {
        0 => None,
        1 => Some(vec![block(&pretty)]),
        2 => Some(vec![block("\"Fleet follows.\""), block(&copy)]),
        3 => Some(vec![block(&copy), block("\"{\\\"other\\\":1}\"")]),
        4 => Some(vec![block("\"[1]\""), block(&copy)]),
        _ => Some(vec![block(&copy)]),
    };
    let mut members = Vec::new();
    match rng.below(4) {
        // The list in the JSON of a text block only (the server's own spelling inside).
        0 => {
            let mut blocks = Vec::new();
            if rng.below(3) == 0 {
                blocks.push(block("\"Fleet follows.\""));
            }
            blocks.push(block(&copy));
            if rng.below(3) == 0 {
                blocks.push(block("\"{\\\"later\\\":1}\""));
            }
            members.push(("content".to_string(), format!("[{}]", blocks.join(","))));
        }
        // ... and repeated in a field of structuredContent (as server-filesystem does).
        1 => {
            members.push(("content".to_string(), format!("[{}]", block(&copy))));
            let mut fields = vec![("content".to_string(), copy.clone())];
            if rng.below(2) == 0 {
                fields.insert(0, ("path".into(), "\"/tmp/x\"".into()));
            }
            members.push(("structuredContent".to_string(), object(rng, fields)));
        }
        _ => {
            members.push(("structuredContent".to_string(), structured));
            if let Some(blocks) = content {
                members.push(("content".into(), format!("[{}]", blocks.join(","))));
            }
        }
    }
    match rng.below(6) {
        0 => members.push(("isError".into(), "true".into())),
        1 => members.push(("isError".into(), "false".into())),
        2 => members.push(("isError".into(), "null".into())),
        _ => {}
    }
    if rng.below(2) == 0 {
        members.reverse();
    }
    let result = object(rng, members);
    let mut arguments = serde_json::Map::new();
    if rng.below(2) == 0 {
        arguments.insert("limit".into(), json!(rng.range(1, 30)));
    }
    match rng.below(3) {
        0 => {
            arguments.insert("horizon".into(), json!("all"));
        }
        1 => {
            arguments.insert("horizon".into(), json!("live"));
        }
        _ => {}
    }
    match rng.below(3) {
        0 => {
            arguments.insert("detail".into(), json!("full"));
        }
        1 => {
            arguments.insert("format".into(), json!(["csv", "tsv"][rng.below(2)]));
        }
        _ => {}
    }
    if rng.below(4) == 0 {
        arguments.insert("state".into(), json!(["running", "gated"]));
    }
    if rng.below(6) == 0 {
        arguments.insert("streams".into(), json!(["st-0001", "st-0005", "3"]));
    }
    let client = [None, None, Some("codex-mcp-client"), Some("claude-code")][rng.below(4)];
    (result, Value::Object(arguments), client)
}

/// Found by review: a content block with two "text" members (the first the copy), and an
/// item spelled like an equal one the horizon drops.
#[test]
fn a_block_naming_its_text_twice_is_declined_and_each_item_keeps_its_own_spelling() {
    let twice = r#"{"content":[{"type":"text","text":"{\"streams\":[ {\"stream_id\": \"a\"} ]}","text":"hi"}],"structuredContent":{"streams":[ {"stream_id": "a"} ]}}"#;
    same_answers_for(None, twice, json!({}), 2);
    same_answers_for(None, twice, json!({"horizon": "all"}), 2);
    // Equal values, different spellings: the page's item is written as it was sent.
    let twins = r#"{"structuredContent":{"streams":[{"stream_id":"a","state":"merged"},{"stream_id":"\u0061"}]}}"#;
    let answer = call(&relay(false), 1, &json!({}), twins);
    let text = String::from_utf8(answer).expect("UTF-8");
    assert!(text.contains(r#"{"stream_id":"\u0061"}"#), "{text}");
    // An item the horizon drops that no parser would read into a value (a lone surrogate):
    // the page is made all the same (the whole pipeline could not parse the result).
    let odd = r#"{"structuredContent":{"streams":[{"stream_id":"a","state":"merged","title":"\ud800"},{"stream_id":"b"}]}}"#;
    let answer = call(&relay(false), 1, &json!({}), odd);
    let answer: Value = serde_json::from_slice(&answer).expect("JSON");
    let page = &answer["result"]["structuredContent"];
    assert_eq!(page["total_count"], json!(2), "{answer}");
    assert_eq!(page["streams"], json!([{"stream_id": "b"}]), "{answer}");
}

/// Found by the second review: text the walk would read but a JSON parser refuses (a form feed,
/// a vertical tab after the document), and a field of structuredContent equal to the smaller
/// text: the same bytes as the whole pipeline (the reduction declines).
#[test]
fn what_a_parser_refuses_or_could_mistake_is_left_to_the_whole_pipeline() {
    let form_feed = r#"{"content":[{"type":"text","text":"{\"streams\":[\f]}"}]}"#;
    let vertical_tab = r#"{"content":[
 {"type":"text","text":"{\"streams\":[{\"stream_id\":\"a\",\"state\":\"open\"},{\"stream_id\":\"c\",\"state\":\"merged\"}]}\u000b"},
 {"type":"text","text":"{\"streams\":[{\"stream_id\":\"b\",\"state\":\"open\"}]}"}]}"#;
    let lookalike = r#"{"content":[{"type":"text","text":"{\"streams\":[{\"stream_id\":\"a\",\"state\":\"merged\"},{\"stream_id\":\"b\",\"state\":\"open\"}]}"}],
 "structuredContent":{"a":"{\"streams\":[{\"stream_id\":\"b\",\"state\":\"open\"}]}"}}"#;
    for raw in [form_feed, vertical_tab, lookalike] {
        for arguments in [json!({}), json!({"format": "csv"})] {
            same_answers_for(None, raw, arguments, 2);
        }
    }
    // A page is still made from the block that parses, as the whole pipeline makes it.
    let answer = call(&relay(false), 1, &json!({}), vertical_tab);
    let answer: Value = serde_json::from_slice(&answer).expect("JSON");
    let page: Value = serde_json::from_str(
        answer["result"]["content"][1]["text"]
            .as_str()
            .expect("text"),
    )
    .expect("JSON");
    assert_eq!(page["total_count"], json!(1), "{answer}");
}
