//! `mcp-budget suggest`: a starting policy, proposed from a recording.
//!
//! For each tool whose recorded results were large: the list worth paging (as a JSONPath), a
//! likely key field (unique values, named like an id), a likely state field (few distinct
//! values, named like a state) with the values that look terminal, and the fields that carry
//! the most bytes — candidates to leave out of the summary. Long plain text gets text paging.
//! The output is a commented TOML file that `mcp-budget check` accepts; it is a start, to be
//! read and edited, not a verdict.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use crate::recording::Recording;

/// Words that usually name a finished state.
const TERMINAL_WORDS: [&str; 16] = [
    "merged",
    "closed",
    "done",
    "completed",
    "complete",
    "cancelled",
    "canceled",
    "archived",
    "deleted",
    "resolved",
    "finished",
    "abandoned",
    "expired",
    "rejected",
    "superseded",
    "obsolete",
];

/// What was found for one tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proposal {
    Items {
        path: String,
        count: usize,
        key: Option<String>,
        state: Option<(String, Vec<String>, Vec<String>)>,
        summary: Vec<String>,
        heavy: Vec<(String, usize)>,
    },
    Text {
        bytes: usize,
    },
    CapOnly {
        bytes: usize,
    },
}

fn size(value: &Value) -> usize {
    serde_json::to_string(value).map_or(0, |s| s.len())
}

/// The largest array of objects in `value`, with its JSONPath.
fn largest_list(value: &Value, path: &str, best: &mut Option<(String, usize, Vec<Value>)>) {
    match value {
        Value::Array(items)
            if items.iter().filter(|i| i.is_object()).count() * 2 >= items.len()
                && !items.is_empty() =>
        {
            let bytes = size(value);
            if best.as_ref().is_none_or(|(_, b, _)| bytes > *b) {
                *best = Some((path.to_string(), bytes, items.clone()));
            }
        }
        Value::Object(map) => {
            for (k, v) in map {
                let simple = k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                let child = if simple {
                    format!("{path}.{k}")
                } else {
                    format!("{path}['{k}']")
                };
                largest_list(v, &child, best);
            }
        }
        _ => {}
    }
}

fn analyse_items(path: String, items: &[Value]) -> Proposal {
    let objects: Vec<&Map<String, Value>> = items.iter().filter_map(Value::as_object).collect();
    let mut fields: Vec<String> = Vec::new();
    for object in &objects {
        for key in object.keys() {
            if !fields.contains(key) {
                fields.push(key.clone());
            }
        }
    }
    let scalar_values = |field: &str| -> Vec<String> {
        objects
            .iter()
            .filter_map(|o| o.get(field))
            .filter_map(|v| match v {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            })
            .collect()
    };
    let idlike = |f: &str| {
        let f = f.to_lowercase();
        f == "id"
            || f.ends_with("_id")
            || f.ends_with("id")
            || f == "key"
            || f == "name"
            || f == "uri"
            || f == "path"
    };
    let key = fields
        .iter()
        .filter(|f| {
            let values = scalar_values(f);
            values.len() == objects.len()
                && values.iter().collect::<BTreeSet<_>>().len() == values.len()
        })
        .max_by_key(|f| {
            (
                idlike(f),
                std::cmp::Reverse(fields.iter().position(|x| x == *f)),
            )
        })
        .cloned();
    let statelike = |f: &str| {
        matches!(
            f.to_lowercase().as_str(),
            "state" | "status" | "phase" | "stage" | "lifecycle"
        )
    };
    let state = fields
        .iter()
        .filter_map(|f| {
            let values = scalar_values(f);
            let distinct: BTreeSet<String> = values.iter().cloned().collect();
            (values.len() * 2 >= objects.len()
                && (2..=8).contains(&distinct.len())
                && distinct.len() < objects.len())
            .then(|| (f.clone(), distinct))
        })
        .max_by_key(|(f, distinct)| {
            let terminal = distinct
                .iter()
                .filter(|v| {
                    TERMINAL_WORDS
                        .iter()
                        .any(|w| v.to_lowercase().starts_with(w))
                })
                .count();
            (
                statelike(f),
                terminal > 0,
                std::cmp::Reverse(distinct.len()),
            )
        })
        .map(|(f, distinct)| {
            let (terminal, live): (Vec<String>, Vec<String>) =
                distinct.into_iter().partition(|v| {
                    TERMINAL_WORDS
                        .iter()
                        .any(|w| v.to_lowercase().starts_with(w))
                });
            (f, terminal, live)
        })
        .filter(|(f, terminal, _)| statelike(f) || !terminal.is_empty());
    let mut heavy: Vec<(String, usize)> = fields
        .iter()
        .map(|f| {
            (
                f.clone(),
                objects
                    .iter()
                    .filter_map(|o| o.get(f))
                    .map(size)
                    .sum::<usize>(),
            )
        })
        .collect();
    heavy.sort_by_key(|(_, bytes)| std::cmp::Reverse(*bytes));
    let total: usize = heavy.iter().map(|(_, b)| b).sum();
    // Leave out the heaviest fields until the rest is at most a quarter of the bytes, but keep
    // the key and state, and at least three fields.
    let mut left_out: Vec<(String, usize)> = Vec::new();
    let mut kept_bytes = total;
    for (field, bytes) in &heavy {
        if kept_bytes * 4 <= total || fields.len() - left_out.len() <= 3 {
            break;
        }
        if Some(field) == key.as_ref() || state.as_ref().is_some_and(|(s, _, _)| s == field) {
            continue;
        }
        left_out.push((field.clone(), *bytes));
        kept_bytes -= bytes;
    }
    let summary = fields
        .iter()
        .filter(|f| !left_out.iter().any(|(l, _)| l == *f))
        .cloned()
        .collect();
    Proposal::Items {
        path,
        count: objects.len(),
        key,
        state,
        summary,
        heavy: left_out,
    }
}

/// The proposal for one result of `bytes` bytes.
pub fn analyse(result: &Value, bytes: usize) -> Proposal {
    // A list in structuredContent; or, when there is none, in the JSON of the text.
    let structured = result
        .get("structuredContent")
        .filter(|s| s.is_object() || s.is_array());
    let document = match structured {
        Some(document) => Some(document.clone()),
        None => result["content"][0]["text"]
            .as_str()
            .and_then(|text| serde_json::from_str::<Value>(text).ok())
            .filter(|v| v.is_object() || v.is_array()),
    };
    if let Some(document) = document {
        let mut best = None;
        largest_list(&document, "$", &mut best);
        if let Some((path, list_bytes, items)) = best
            && list_bytes * 2 >= size(&document)
            && items.len() >= 3
        {
            return analyse_items(path, &items);
        }
    }
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    // Long text (the server may repeat it in structuredContent): pages of lines.
    if text.len() * 3 >= bytes && text.lines().count() > 20 {
        return Proposal::Text { bytes };
    }
    Proposal::CapOnly { bytes }
}

fn quoted(list: &[String]) -> String {
    list.iter()
        .map(|s| format!("{s:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The commented TOML for a recording.
pub fn suggest(recording: &Recording, min_bytes: usize) -> String {
    // tool → (largest result bytes, its proposal, calls)
    let mut tools: BTreeMap<String, (usize, Proposal, usize)> = BTreeMap::new();
    for exchange in recording.exchanges() {
        if exchange.method != "tools/call" {
            continue;
        }
        let Some(response) = &exchange.response else {
            continue;
        };
        let tool = exchange.upstream_request["params"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let bytes = exchange.response_bytes;
        let entry = tools
            .entry(tool)
            .or_insert((0, Proposal::CapOnly { bytes: 0 }, 0));
        entry.2 += 1;
        if bytes > entry.0
            && response
                .get("result")
                .is_some_and(|r| r["isError"] != Value::Bool(true))
        {
            *entry = (bytes, analyse(&response["result"], bytes), entry.2);
        }
    }
    let mut out = String::from(
        "# A starting policy proposed by `mcp-budget suggest` from a recording.\n\
         # Read it, edit it, then check it: mcp-budget check FILE\n\n\
         [budget]\nmax_bytes = 200000\n",
    );
    let (large, small): (Vec<_>, Vec<_>) = tools
        .into_iter()
        .partition(|(_, (bytes, _, _))| *bytes >= min_bytes);
    // Tools with the same proposal share one rule.
    let mut groups: Vec<(Vec<String>, usize, usize, Proposal)> = Vec::new();
    for (tool, (bytes, proposal, calls)) in large {
        match groups
            .iter_mut()
            .find(|(_, _, _, p)| *p == proposal || same_items(p, &proposal))
        {
            Some(group) => {
                group.0.push(tool);
                group.1 = group.1.max(bytes);
                group.2 += calls;
            }
            None => groups.push((vec![tool], bytes, calls, proposal)),
        }
    }
    for (names, bytes, calls, proposal) in groups {
        let calls = match calls {
            1 => "1 call recorded".to_string(),
            n => format!("{n} calls recorded"),
        };
        out.push_str(&format!(
            "\n# {}: largest result {bytes} bytes ({calls})\n",
            names.join(", ")
        ));
        out.push_str(&format!("[[tool]]\nname = [{}]\n", quoted(&names)));
        match proposal {
            Proposal::Items {
                path,
                count,
                key,
                state,
                summary,
                heavy,
            } => {
                out.push_str(&format!(
                    "items = {path:?}  # a list of {count} objects, the bulk of the result\n"
                ));
                match &key {
                    Some(key) => out.push_str(&format!("key = {key:?}  # unique in every item\n")),
                    None => out.push_str(
                        "# key: no field was unique in every item; cursors will use offsets\n",
                    ),
                }
                out.push_str("noun = \"items\"  # what an item is called in notices: edit\n");
                if let Some((field, terminal, live)) = &state {
                    out.push_str(&format!(
                        "\n# {field} takes the values {}\n",
                        quoted(&[terminal.clone(), live.clone()].concat())
                    ));
                    if terminal.is_empty() {
                        out.push_str(&format!("# no value looks terminal: name the finished ones to add a live horizon\n# [tool.horizon]\n# field = {field:?}\n# terminal = []\n"));
                    } else {
                        out.push_str(&format!("[tool.horizon]\nfield = {field:?}\nterminal = [{}]  # these look finished\n", quoted(terminal)));
                    }
                }
                if !heavy.is_empty() {
                    let notes: Vec<String> = heavy
                        .iter()
                        .map(|(f, b)| format!("{f} ({b} bytes)"))
                        .collect();
                    out.push_str(&format!(
                        "\n# the heaviest fields, left out of the summary: {}\n",
                        notes.join(", ")
                    ));
                    out.push_str(&format!(
                        "[tool.detail]\nsummary = [{}]\n",
                        quoted(&summary)
                    ));
                }
                out.push_str("\n[tool.limit]\ndefault = 25\nmax = 100\n");
                if let Some((field, _, _)) = &state {
                    out.push_str(&format!(
                        "\n[tool.filters]\n{} = {field:?}\n",
                        field.replace('.', "_")
                    ));
                }
            }
            Proposal::Text { .. } => {
                out.push_str(
                    "# long plain text: paged by lines\n[tool.text]\npage_bytes = 20000\n",
                );
            }
            Proposal::CapOnly { .. } => {
                out.push_str("# no list or long text to page: capped only\n");
            }
        }
    }
    if !small.is_empty() {
        let names: Vec<String> = small
            .iter()
            .map(|(t, (b, _, _))| format!("{t} ({b} bytes)"))
            .collect();
        out.push_str(&format!(
            "\n# small results, no rule needed (the cap still applies): {}\n",
            names.join(", ")
        ));
    }
    out
}

/// Whether two tools can share one rule.
fn same_items(a: &Proposal, b: &Proposal) -> bool {
    match (a, b) {
        (
            Proposal::Items {
                path: p1,
                key: k1,
                state: s1,
                ..
            },
            Proposal::Items {
                path: p2,
                key: k2,
                state: s2,
                ..
            },
        ) => p1 == p2 && k1 == k2 && s1.as_ref().map(|s| &s.0) == s2.as_ref().map(|s| &s.0),
        (Proposal::Text { .. }, Proposal::Text { .. })
        | (Proposal::CapOnly { .. }, Proposal::CapOnly { .. }) => true,
        _ => false,
    }
}
