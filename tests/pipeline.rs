//! The budget pipeline as pure functions: exact outputs, and properties over random lists.

use std::path::Path;

use mcp_budget::budget::Budget;
use mcp_budget::budget::cursor::CursorKey;
use mcp_budget::policy::Policy;
use proptest::prelude::*;
use serde_json::{Value, json};

const POLICY: &str = r#"
[budget]
max_bytes = 4000

[[tool]]
name = "list_*"
items = "$.items"
key = "id"
noun = "things"
limit = { default = 2, max = 5 }
filters = { color = "color" }

[tool.horizon]
field = "state"
terminal = ["done", "dropped"]

[tool.detail]
summary = ["id", "state", "meta.size"]

[tool.format]
columns = ["id", "color"]
"#;

fn budget(policy: &str) -> Budget {
    let policy = Policy::parse(policy, Path::new("test.toml")).unwrap();
    Budget::with_key(policy, CursorKey::from_secret(b"test"))
}

fn upstream(items: Vec<Value>) -> Value {
    let document = json!({"kind": "things", "items": items});
    json!({
        "content": [{"type": "text", "text": document.to_string()}],
        "structuredContent": document,
        "isError": false,
    })
}

fn item(id: usize, state: &str, color: &str) -> Value {
    json!({"id": format!("t{id}"), "state": state, "color": color, "meta": {"size": id, "note": "long prose"}})
}

/// Runs one call: arguments in, the serialized result out.
fn call(budget: &Budget, tool: &str, arguments: Value, items: Vec<Value>) -> Value {
    let mut params = json!({"name": tool, "arguments": arguments});
    match budget.prepare_call(&mut params) {
        Err(error) => json!({"error": error.to_string()}),
        Ok(plan) => serde_json::from_slice(
            &budget
                .finish_call(&plan, upstream(items))
                .unwrap()
                .bytes()
                .unwrap(),
        )
        .unwrap(),
    }
}

fn text(result: &Value, block: usize) -> &str {
    result["content"][block]["text"].as_str().unwrap()
}

#[test]
fn the_default_envelope_is_exact() {
    let b = budget(POLICY);
    let items = vec![
        item(1, "open", "red"),
        item(2, "done", "red"),
        item(3, "open", "blue"),
        item(4, "open", "red"),
    ];
    let result = call(&b, "list_things", json!({}), items);
    let structured = &result["structuredContent"];
    let next = structured["next_after"].as_str().unwrap().to_string();
    let expected = json!({
        "kind": "things",
        "items": [
            {"id": "t1", "state": "open", "meta": {"size": 1}},
            {"id": "t3", "state": "open", "meta": {"size": 3}},
        ],
        "total_count": 4,
        "next_after": next,
        "notices": [
            "This query used the default live-only horizon because \"horizon\" was not provided (done/dropped things are excluded). If results seem incomplete, pass horizon:\"all\" to include them.",
            "This query used the default summary detail because \"detail\" was not provided (each of the things carries only id, state, meta.size). Pass detail:\"full\" for every field.",
            "This query used the default limit of 2 because \"limit\" was not provided: 2 of 3 matching things are shown. Pass the next_after value as after for the next page, or a larger limit (at most 5).",
        ],
    });
    assert_eq!(structured.to_string(), expected.to_string());
    // The text the model reads is the same envelope.
    assert_eq!(text(&result, 0), expected.to_string());
    assert_eq!(result["isError"], false);
}

#[test]
fn explicit_arguments_fire_no_notices_and_all_full_is_upstream_exactly() {
    let b = budget(POLICY);
    let items = vec![item(1, "open", "red"), item(2, "done", "red")];
    let result = call(
        &b,
        "list_things",
        json!({"horizon": "all", "detail": "full", "limit": 5}),
        items.clone(),
    );
    assert_eq!(
        result["structuredContent"].to_string(),
        json!({"kind": "things", "items": items, "total_count": 2}).to_string()
    );
}

#[test]
fn csv_and_tsv_pages_are_exact() {
    let b = budget(POLICY);
    let items = vec![
        item(1, "open", "red"),
        item(2, "open", "blue, green"),
        item(3, "open", "red"),
    ];
    let result = call(&b, "list_things", json!({"format": "csv"}), items.clone());
    assert_eq!(text(&result, 0), "id,color\nt1,red\nt2,\"blue, green\"\n");
    let next = result["structuredContent"]["next_after"].as_str().unwrap();
    assert_eq!(
        text(&result, 1),
        format!(
            "Rows 1-2 of 3 matching things (total_count 3: what the server returned before the horizon and filters). \
             More remain: call list_things again with after:\"{next}\" and the same other arguments for the next page.\n\
             This query used the default limit of 2 because \"limit\" was not provided: 2 of 3 matching things are shown. \
             Pass the next_after value as after for the next page, or a larger limit (at most 5)."
        )
    );
    assert_eq!(result["content"].as_array().unwrap().len(), 2);
    let last = call(
        &b,
        "list_things",
        json!({"format": "tsv", "after": next}),
        items,
    );
    assert_eq!(text(&last, 0), "id\tcolor\nt3\tred\n");
    assert_eq!(
        text(&last, 1),
        "Rows 3-3 of 3 matching things (total_count 3: what the server returned before the horizon and filters). This is the last page."
    );
    assert_eq!(
        last["structuredContent"],
        json!({"format": "tsv", "returned": 1, "columns": ["id", "color"], "rows": [["t3", "red"]], "total_count": 3})
    );
}

#[test]
fn argument_errors_are_exact() {
    let b = budget(POLICY);
    let cases = [
        (
            json!({"limit": 0}),
            "limit must be an integer between 1 and 5",
        ),
        (
            json!({"limit": 6}),
            "limit must be an integer between 1 and 5",
        ),
        (
            json!({"limit": 2.5}),
            "limit must be an integer between 1 and 5",
        ),
        (
            json!({"limit": "ten"}),
            "limit must be an integer between 1 and 5",
        ),
        (
            json!({"limit": -1}),
            "limit must be an integer between 1 and 5",
        ),
        (
            json!({"horizon": "recent"}),
            "horizon must be \"live\" or \"all\"",
        ),
        (
            json!({"detail": 1}),
            "detail must be \"summary\" or \"full\"",
        ),
        (
            json!({"format": "xml"}),
            "format must be \"json\", \"csv\" or \"tsv\"",
        ),
        (
            json!({"color": {"a": 1}}),
            "color must be a string or a non-empty list of strings",
        ),
        (
            json!({"color": []}),
            "color must be a string or a non-empty list of strings",
        ),
        (
            json!({"after": 5}),
            "after must be the next_after string of a previous page; call again without after to start from the first page",
        ),
        (
            json!({"after": "nonsense"}),
            "after is not a cursor this proxy issued (it is malformed or was altered); call again without after to start from the first page",
        ),
    ];
    for (arguments, message) in cases {
        let result = call(&b, "list_things", arguments.clone(), vec![]);
        assert_eq!(result["error"], message, "for {arguments}");
    }
}

#[test]
fn cursors_are_bound_to_their_query() {
    let b = budget(POLICY);
    let items: Vec<Value> = (0..6).map(|i| item(i, "open", "red")).collect();
    let first = call(&b, "list_things", json!({"q": 1}), items.clone());
    let next = first["structuredContent"]["next_after"].as_str().unwrap();
    let other_query = "after belongs to a different query (another tool, other arguments, horizon or filters); repeat the exact arguments of the list_things call that returned it, or call again without after to start from the first page";
    for arguments in [
        json!({"q": 2, "after": next}),
        json!({"after": next}),
        json!({"q": 1, "horizon": "all", "after": next}),
        json!({"q": 1, "color": "red", "after": next}),
    ] {
        assert_eq!(
            call(&b, "list_things", arguments, items.clone())["error"],
            other_query
        );
    }
    let other_tool = call(
        &b,
        "list_others",
        json!({"q": 1, "after": next}),
        items.clone(),
    );
    assert!(
        other_tool["error"]
            .as_str()
            .unwrap()
            .starts_with("after belongs to a different query")
    );
    // detail, limit and format may change between pages.
    let ok = call(
        &b,
        "list_things",
        json!({"q": 1, "after": next, "limit": 3, "detail": "full"}),
        items.clone(),
    );
    assert_eq!(ok["structuredContent"]["items"][0]["id"], "t2");
    // Another proxy instance with another key refuses it; one with the same key accepts it.
    let stranger = Budget::with_key(
        Policy::parse(POLICY, Path::new("p")).unwrap(),
        CursorKey::from_secret(b"other"),
    );
    assert!(
        call(
            &stranger,
            "list_things",
            json!({"q": 1, "after": next}),
            items.clone()
        )["error"]
            .as_str()
            .unwrap()
            .starts_with("after was issued by another mcp-budget instance")
    );
    let twin = budget(POLICY);
    assert_eq!(
        call(&twin, "list_things", json!({"q": 1, "after": next}), items)["structuredContent"]["items"]
            [0]["id"],
        "t2"
    );
}

#[test]
fn the_cap_refuses_with_the_moves_of_the_call_and_passes_errors_untouched() {
    let b = budget(POLICY);
    let big: Vec<Value> = (0..5)
        .map(|i| json!({"id": format!("t{i}"), "state": "open", "color": "red", "blob": "x".repeat(900)}))
        .collect();
    let result = call(
        &b,
        "list_things",
        json!({"detail": "full", "limit": 5}),
        big,
    );
    assert_eq!(result["isError"], true);
    let message = text(&result, 0);
    assert!(
        message.starts_with("result-too-large: list_things response is "),
        "{message}"
    );
    assert!(
        message.ends_with("bytes, exceeds the 4000-byte cap — narrow with a color filter, lower limit below its current value, or omit detail:full (summary, the default, is far smaller)"),
        "{message}"
    );
    // An upstream error result is never mangled.
    let mut params = json!({"name": "list_things", "arguments": {}});
    let plan = b.prepare_call(&mut params).unwrap();
    let error = json!({"content": [{"type": "text", "text": "boom"}], "isError": true});
    assert_eq!(
        b.finish_call(&plan, error.clone())
            .unwrap()
            .bytes()
            .unwrap(),
        serde_json::to_vec(&error).unwrap()
    );
    // A result with no item list where the rule says is paged automatically (from the
    // first page), not passed raw.
    let prose = json!({"content": [{"type": "text", "text": "no JSON here"}]});
    assert!(matches!(
        b.finish_call(&plan, prose.clone()).unwrap(),
        mcp_budget::budget::Finished::Auto { at: None, .. }
    ));
}

#[test]
fn text_only_results_are_paged_in_the_text() {
    let b = budget(POLICY);
    let document =
        json!({"items": [item(1, "open", "r"), item(2, "open", "r"), item(3, "open", "r")]});
    let mut params = json!({"name": "list_things", "arguments": {"detail": "full"}});
    let plan = b.prepare_call(&mut params).unwrap();
    let result = json!({"content": [{"type": "text", "text": document.to_string()}]});
    let out: Value =
        serde_json::from_slice(&b.finish_call(&plan, result).unwrap().bytes().unwrap()).unwrap();
    assert!(out.get("structuredContent").is_none());
    let page: Value = serde_json::from_str(text(&out, 0)).unwrap();
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    assert_eq!(page["total_count"], 3);
}

fn arb_items() -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec(
        (
            prop::sample::select(vec!["open", "done", "dropped"]),
            prop::sample::select(vec!["red", "blue", "green"]),
        ),
        0..60,
    )
    .prop_map(|v| {
        v.into_iter()
            .map(|(s, c)| (s.to_string(), c.to_string()))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Following next_after yields each matching item exactly once, in order; no success
    /// result reaches the cap, and a page that would is refused (notes up to 1,500 bytes and
    /// `detail:"full"` make pages over the 4,000-byte cap common).
    #[test]
    fn a_cursor_chain_enumerates_every_match_once(
        states in arb_items(),
        limit in 1usize..=5,
        horizon_all in any::<bool>(),
        colors in prop::option::of(prop::sample::subsequence(vec!["red", "blue", "green"], 1..=2)),
        csv in any::<bool>(),
        full in any::<bool>(),
        note in 0usize..1500,
    ) {
        let b = budget(POLICY);
        let items: Vec<Value> = states
            .iter()
            .enumerate()
            .map(|(i, (s, c))| {
                let mut it = item(i, s, c);
                it["meta"]["note"] = json!("n".repeat(note));
                it
            })
            .collect();
        let expected: Vec<String> = items
            .iter()
            .filter(|it| horizon_all || !["done", "dropped"].contains(&it["state"].as_str().unwrap()))
            .filter(|it| colors.as_ref().is_none_or(|cs| cs.contains(&it["color"].as_str().unwrap())))
            .map(|it| it["id"].as_str().unwrap().to_string())
            .collect();
        let mut arguments = json!({"limit": limit, "format": if csv { "csv" } else { "json" }});
        if horizon_all { arguments["horizon"] = json!("all"); }
        if let Some(cs) = &colors { arguments["color"] = json!(cs); }
        if full { arguments["detail"] = json!("full"); }
        let mut seen = Vec::new();
        for _ in 0..=items.len() + 1 {
            let result = call(&b, "list_things", arguments.clone(), items.clone());
            if result["isError"] == json!(true) {
                // Refused, never cut: the page would have reached the cap.
                prop_assert!(text(&result, 0).starts_with("result-too-large: list_things response is "), "{}", result);
                prop_assert!(full && !csv, "only full JSON items can be that large: {}", result);
                return Ok(());
            }
            prop_assert!(serde_json::to_vec(&result).unwrap().len() < 4000);
            if csv {
                let table = text(&result, 0);
                seen.extend(table.lines().skip(1).map(|l| l.split(',').next().unwrap().to_string()));
            } else {
                for it in result["structuredContent"]["items"].as_array().unwrap() {
                    seen.push(it["id"].as_str().unwrap().to_string());
                }
            }
            match result["structuredContent"]["next_after"].as_str() {
                Some(next) => arguments["after"] = json!(next),
                None => break,
            }
        }
        prop_assert_eq!(seen, expected);
    }
}

fn run(budget: &Budget, tool: &str, arguments: Value, result: Value) -> Value {
    let mut params = json!({"name": tool, "arguments": arguments});
    match budget.prepare_call(&mut params) {
        Err(error) => json!({"error": error.to_string()}),
        Ok(plan) => {
            serde_json::from_slice(&budget.finish_call(&plan, result).unwrap().bytes().unwrap())
                .unwrap()
        }
    }
}

#[test]
fn a_root_array_is_paged_and_wrapped_in_an_envelope() {
    let b = budget(
        "[[tool]]\nname = \"list\"\nitems = \"$\"\nkey = \"id\"\nnoun = \"entries\"\nlimit = { default = 2, max = 5 }\n",
    );
    let entries: Vec<Value> = (0..5)
        .map(|i| json!({"id": i, "name": format!("e{i}")}))
        .collect();
    let result =
        json!({"content": [{"type": "text", "text": Value::Array(entries.clone()).to_string()}]});
    let mut seen = Vec::new();
    let mut arguments = json!({});
    for _ in 0..5 {
        let out = run(&b, "list", arguments.clone(), result.clone());
        let page: Value = serde_json::from_str(text(&out, 0)).unwrap();
        assert_eq!(page["total_count"], 5);
        seen.extend(page["entries"].as_array().unwrap().iter().cloned());
        match page["next_after"].as_str() {
            Some(next) => arguments = json!({"after": next}),
            None => break,
        }
    }
    assert_eq!(seen, entries);
}

#[test]
fn nested_lists_get_the_horizon_and_the_outer_list_is_paged() {
    let b = budget(
        "[[tool]]\nname = \"waves\"\nitems = \"$.waves[*].streams\"\nkey = \"wave\"\nnoun = \"streams\"\nlimit = { default = 2, max = 10 }\n\
         [tool.horizon]\nfield = \"state\"\nterminal = [\"merged\"]\n[tool.detail]\nsummary = [\"id\", \"state\"]\n",
    );
    let waves: Vec<Value> = (1..=3)
        .map(|w| {
            json!({"wave": format!("w{w}"), "opened": "2026-11-01", "streams": [
                {"id": format!("s{w}a"), "state": "running", "prose": "long"},
                {"id": format!("s{w}b"), "state": "merged", "prose": "long"},
            ]})
        })
        .collect();
    let document = json!({"fleet": "atlas", "waves": waves});
    let result = json!({"content": [{"type": "text", "text": document.to_string()}], "structuredContent": document});
    let first = run(&b, "waves", json!({}), result.clone());
    let page = &first["structuredContent"];
    assert_eq!(page["total_count"], 3, "total_count counts the outer list");
    assert_eq!(
        page["waves"],
        json!([
            {"wave": "w1", "opened": "2026-11-01", "streams": [{"id": "s1a", "state": "running"}]},
            {"wave": "w2", "opened": "2026-11-01", "streams": [{"id": "s2a", "state": "running"}]},
        ])
    );
    assert!(
        page["notices"][0]
            .as_str()
            .unwrap()
            .starts_with("This query used the default live-only horizon")
    );
    let next = page["next_after"].as_str().unwrap();
    let second = run(
        &b,
        "waves",
        json!({"after": next, "horizon": "all", "detail": "full"}),
        result.clone(),
    );
    assert!(
        second.get("error").is_some(),
        "another horizon is another query: {second}"
    );
    let second = run(
        &b,
        "waves",
        json!({"after": next, "detail": "full"}),
        result,
    );
    assert_eq!(second["structuredContent"]["waves"][0]["wave"], "w3");
    assert_eq!(
        second["structuredContent"]["waves"][0]["streams"],
        json!([{"id": "s3a", "state": "running", "prose": "long"}])
    );
}

#[test]
fn items_spread_over_text_blocks_are_paged_as_blocks() {
    let b = budget(
        "[[tool]]\nname = \"hits\"\nitems = \"$\"\nkey = \"id\"\nnoun = \"hits\"\nlimit = { default = 2, max = 5 }\n[tool.format]\ncolumns = [\"id\"]\n",
    );
    let blocks: Vec<Value> = (0..5).map(|i| json!({"type": "text", "text": json!({"id": format!("h{i}"), "score": i}).to_string()})).collect();
    let result = json!({"content": blocks});
    let out = run(&b, "hits", json!({}), result.clone());
    let content = out["content"].as_array().unwrap();
    assert_eq!(
        content.len(),
        3,
        "two item blocks and the continuation: {out}"
    );
    assert_eq!(content[0]["text"], r#"{"id":"h0","score":0}"#);
    assert_eq!(content[1]["text"], r#"{"id":"h1","score":1}"#);
    let tail: Value = serde_json::from_str(content[2]["text"].as_str().unwrap()).unwrap();
    assert_eq!(tail["total_count"], 5);
    let mut seen = vec![content[0]["text"].clone(), content[1]["text"].clone()];
    let mut next = tail["next_after"].as_str().map(String::from);
    while let Some(cursor) = next {
        let out = run(&b, "hits", json!({"after": cursor}), result.clone());
        let content = out["content"].as_array().unwrap();
        let (items, last) = content.split_at(content.len() - 1);
        seen.extend(items.iter().map(|b| b["text"].clone()));
        next =
            serde_json::from_str::<Value>(last[0]["text"].as_str().unwrap()).unwrap()["next_after"]
                .as_str()
                .map(String::from);
    }
    assert_eq!(seen.len(), 5);
    let csv = run(&b, "hits", json!({"format": "csv", "limit": 5}), result);
    assert_eq!(text(&csv, 0), "id\nh0\nh1\nh2\nh3\nh4\n");
}

#[test]
fn budget_arguments_are_stripped_before_the_call_goes_upstream_unless_passed_through() {
    let stripped = budget("[[tool]]\nname = \"t\"\nitems = \"$.items\"\n");
    // Null means absent (models send null for optional arguments), and is stripped too.
    let mut params = json!({"name": "t", "arguments": {"q": "x", "limit": null, "after": null}});
    stripped.prepare_call(&mut params).unwrap();
    assert_eq!(params["arguments"], json!({"q": "x"}));
    let mut params = json!({"name": "t", "arguments": {"q": "x", "limit": 5}});
    stripped.prepare_call(&mut params).unwrap();
    assert_eq!(params["arguments"], json!({"q": "x"}));
    let passed = budget("[[tool]]\nname = \"t\"\nitems = \"$.items\"\npassthrough = [\"limit\"]\n");
    let mut params = json!({"name": "t", "arguments": {"q": "x", "limit": 5}});
    passed.prepare_call(&mut params).unwrap();
    assert_eq!(params["arguments"], json!({"q": "x", "limit": 5}));
    let err = Policy::parse(
        "[[tool]]\nname = \"t\"\nitems = \"$.items\"\npassthrough = [\"nope\"]\n",
        Path::new("p.toml"),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("passthrough: \"nope\" is not an argument the proxy adds"),
        "{err}"
    );
}

#[test]
fn numbers_reach_the_client_exactly_as_the_server_wrote_them() {
    // Values a float would change (a 30-digit integer, 36 digits of pi), forms a writer would
    // re-spell (1.50, -0, 1e3, 2.5E-7) and escapes (\u00e9, \/): the page keeps the server's
    // bytes for every value it keeps, in structuredContent and in the JSON text alike.
    let b = budget(POLICY);
    let forms = [
        "123456789012345678901234567890",
        "3.14159265358979323846264338327950288",
        "1.50",
        "1e3",
        "-0",
        "2.5E-7",
    ];
    let items: Vec<String> = forms
        .iter()
        .enumerate()
        .map(|(i, n)| {
            format!(
                r#"{{"id":"t{i}","state":"open","color":"red","meta":{{"size":{n},"note":"caf\u00e9 \/"}}}}"#
            )
        })
        .collect();
    let document = format!(r#"{{"kind":"things","items":[{}]}}"#, items.join(","));
    let raw = format!(
        r#"{{"content":[{{"type":"text","text":{}}}],"structuredContent":{document},"isError":false}}"#,
        serde_json::to_string(&document).unwrap()
    );
    let mut params = json!({"name": "list_things", "arguments": {"limit": 5}});
    let plan = b.prepare_call(&mut params).unwrap();
    let bytes = b.finish_call_raw(&plan, &raw).unwrap().bytes().unwrap();
    let text = String::from_utf8(bytes).unwrap();
    // The default summary keeps meta.size only.
    for form in &forms[..5] {
        let kept = format!(r#""size":{form}}}"#);
        assert!(text.contains(&kept), "{form} did not survive: {text}");
        // The text copy holds the same bytes, inside its string.
        let in_text = serde_json::to_string(&kept).unwrap();
        assert!(
            text.contains(&in_text[1..in_text.len() - 1]),
            "{form} did not survive in the text: {text}"
        );
    }
    // horizon all + detail full keep every item: the server's bytes, exactly.
    let mut params = json!({"name": "list_things", "arguments": {"horizon": "all", "detail": "full", "limit": 5}});
    let plan = b.prepare_call(&mut params).unwrap();
    let bytes = b.finish_call_raw(&plan, &raw).unwrap().bytes().unwrap();
    let text = String::from_utf8(bytes).unwrap();
    let kept = format!(r#""items":[{}]"#, items[..5].join(","));
    assert!(text.contains(&kept), "{text}");
    let in_text = serde_json::to_string(&kept).unwrap();
    assert!(text.contains(&in_text[1..in_text.len() - 1]), "{text}");
}

#[test]
fn rewritten_descriptors_keep_the_servers_bytes_elsewhere() {
    let interceptor = mcp_budget::intercept::Interceptor::new(budget(POLICY));
    let message = r#"{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"list_things","description":"Th\u00e9 things \/ all","inputSchema":{"type":"object","properties":{"q":{"type":"string","x-weight":1e3}}},"x-cost":1.50},{"name":"other","inputSchema":{"type":"object","x-limit":2.5E-7}}],"x-list":-0}}"#;
    let out = interceptor
        .tools_list_response(message.as_bytes(), None)
        .expect("rewritten");
    let out = String::from_utf8(out).unwrap();
    for kept in [
        r#""x-weight":1e3"#,
        r#""x-cost":1.50"#,
        r#""x-limit":2.5E-7"#,
        r#""x-list":-0"#,
        r#""q":{"type":"string","x-weight":1e3}"#,
    ] {
        assert!(out.contains(kept), "{kept} re-spelled: {out}");
    }
    // The rule's tool got its budget arguments; the other tool only automatic paging's after.
    let value: Value = serde_json::from_str(&out).unwrap();
    let tools = value["result"]["tools"].as_array().unwrap();
    assert!(tools[0]["inputSchema"]["properties"]["limit"].is_object());
    assert!(tools[1]["inputSchema"]["properties"]["after"].is_object());
    assert!(
        tools[0]["description"]
            .as_str()
            .unwrap()
            .starts_with("Thé things / all")
    );
}
