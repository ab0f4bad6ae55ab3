//! `mcp-budget check` and `mcp-budget explain`: what a policy is, and what it does to a tool
//! (without `--policy`, the policy the proxy picks for the server, as it picks it).

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::budget::Budget;
use crate::policy::Policy;
use crate::upstream::child::ChildServer;
use crate::wire::framing::{DEFAULT_MAX_MESSAGE_BYTES, Frame, FrameReader};

/// What `check` warns about in a valid policy: rules that overlap (the first matching rule
/// wins: an exact name, then the first glob), text pages the cap would refuse, and items rules
/// without the key or noun their pages need.
pub fn warnings(policy: &Policy) -> Vec<String> {
    let mut warnings = Vec::new();
    let is_glob = |n: &str| n.contains(['*', '?']);
    let index_of = |name: &str| policy.rule_index_for(name);
    for (j, rule) in policy.rules.iter().enumerate() {
        for name in &rule.names {
            let other = if is_glob(name) {
                policy.rules[..j].iter().position(|earlier| {
                    earlier
                        .names
                        .iter()
                        .any(|e| is_glob(e) && globs_intersect(e, name))
                })
            } else {
                index_of(name).filter(|i| *i != j)
            };
            if let Some(i) = other {
                warnings.push(format!(
                    "rules {} and {} both match {name:?}; the first matching rule wins (an exact name before any glob, then the first glob), so rule {} applies",
                    i.min(j) + 1,
                    i.max(j) + 1,
                    i + 1
                ));
            }
        }
    }
    for (k, rule) in policy.rules.iter().enumerate() {
        let names = rule.names.join(", ");
        if let Some(text) = &rule.text
            && text.page_bytes >= policy.max_bytes
        {
            warnings.push(format!(
                "rule {} ({names}): page_bytes = {} is not below budget.max_bytes = {}, so a full page would be refused by the cap; lower page_bytes",
                k + 1,
                text.page_bytes,
                policy.max_bytes
            ));
        }
        if let Some(items) = &rule.items {
            if items.key.is_none() {
                warnings.push(format!(
                    "rule {} ({names}): no key, so cursors hold an offset and an item added or removed upstream between two pages shifts the next page; name the item's unique field with key = \"…\"",
                    k + 1
                ));
            }
            if items.noun_defaulted {
                warnings.push(format!(
                    "rule {} ({names}): no noun, so notices call the items \"items\"; say what they are with noun = \"…\"",
                    k + 1
                ));
            }
        }
    }
    warnings
}

/// Whether some tool name matches both globs (`*` any run, `?` any one character).
fn globs_intersect(a: &str, b: &str) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![(0usize, 0usize)];
    while let Some((i, j)) = stack.pop() {
        if !seen.insert((i, j)) {
            continue;
        }
        if i == a.len() && j == b.len() {
            return true;
        }
        // A star may match nothing.
        if a.get(i) == Some(&'*') {
            stack.push((i + 1, j));
        }
        if b.get(j) == Some(&'*') {
            stack.push((i, j + 1));
        }
        // Or both produce one more character of the name.
        if let (Some(&x), Some(&y)) = (a.get(i), b.get(j)) {
            let any = |c: char| c == '*' || c == '?';
            if any(x) || any(y) || x == y {
                let next_i = if x == '*' { i } else { i + 1 };
                let next_j = if y == '*' { j } else { j + 1 };
                if (next_i, next_j) != (i, j) {
                    stack.push((next_i, next_j));
                }
            }
        }
    }
    false
}

/// A one-paragraph description of a valid policy, for `check`.
pub fn summary(policy: &Policy) -> String {
    let mut lines = vec![format!(
        "cap: {} bytes on every tool result; maxResultSizeChars allowance {}",
        policy.max_bytes, policy.max_result_size_chars
    )];
    if !policy.allow.is_empty() {
        lines.push(format!("tools shown: only {}", policy.allow.join(", ")));
    }
    if !policy.deny.is_empty() {
        lines.push(format!("tools hidden: {}", policy.deny.join(", ")));
    }
    for rule in &policy.rules {
        let names = rule.names.join(", ");
        match &rule.items {
            None if rule.text.is_some() => lines.push(format!(
                "{names}: text paged by lines, at most {} bytes a page",
                rule.text.as_ref().map_or(0, |t| t.page_bytes)
            )),
            None => lines.push(format!("{names}: capped, not paged")),
            Some(items) => {
                let mut parts = vec![format!("items {}", items.path_text)];
                if let Some(key) = &items.key {
                    parts.push(format!("key {}", key.join(".")));
                }
                if let Some(h) = &items.horizon {
                    parts.push(format!(
                        "live horizon drops {} = {}",
                        h.field.join("."),
                        h.terminal.join("/")
                    ));
                }
                if let Some(summary) = &items.summary {
                    parts.push(format!("summary of {} fields", summary.len()));
                }
                parts.push(format!(
                    "limit {} (max {})",
                    items.default_limit, items.max_limit
                ));
                if let Some(columns) = &items.columns {
                    parts.push(format!("csv/tsv of {} columns", columns.len()));
                }
                if !items.filters.is_empty() {
                    let names: Vec<&str> = items.filters.iter().map(|(n, _)| n.as_str()).collect();
                    parts.push(format!("filters {}", names.join(", ")));
                }
                lines.push(format!("{names}: paged — {}", parts.join(", ")));
            }
        }
    }
    lines.join("\n")
}

/// Why `explain` could not produce a descriptor.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Spawn(#[from] crate::upstream::child::SpawnError),
    #[error("talking to the server: {0}")]
    Io(#[from] std::io::Error),
}

/// The tool descriptors in a JSON document: one descriptor, a `tools/list` result, or a
/// whole `tools/list` response.
pub fn tools_in(document: &Value) -> Vec<Value> {
    let result = document.get("result").unwrap_or(document);
    match result.get("tools") {
        Some(Value::Array(tools)) => tools.clone(),
        _ if result.get("name").is_some() => vec![result.clone()],
        _ => Vec::new(),
    }
}

/// What `explain` found for one tool.
#[derive(Debug)]
pub struct Explained {
    /// The descriptor the client sees; `None`: the policy hides the tool.
    pub descriptor: Option<Value>,
    /// With a client: its page sizes, for a person.
    pub pages: Option<String>,
    /// The tools the policy hides.
    pub hidden: Vec<String>,
    /// The policy it runs under, and why.
    pub policy: crate::commands::report::PolicyChoice,
}

/// Whether `client` names a client profile (built in, or a section of `policy`), looked up as
/// the proxy looks up `--client`; else the proxy's error, which lists the known ones.
pub fn check_client(policy: Option<&Policy>, client: Option<&str>) -> Result<(), ExplainError> {
    let Some(name) = client else { return Ok(()) };
    let profiles = crate::client::profiles(policy.map_or(&[][..], |p| p.clients.as_slice()));
    match crate::client::find(&profiles, name) {
        Some(_) => Ok(()),
        None => Err(ExplainError::Input(crate::client::unknown(name, &profiles))),
    }
}

/// The descriptor of `tool` as a client sees it through the proxy, under `given` (`--policy`:
/// its text and the policy) or, without one, the policy the proxy picks for the server that
/// calls itself `server`; with `client` (a profile or a `clientInfo.name`; an unknown one is the
/// proxy's `--client` error), as that client sees it, and the page sizes it gets. The
/// descriptors go through the proxy's own interceptor, set up as the proxy sets it up.
pub fn explain(
    given: Option<(&std::path::Path, Policy)>,
    server: Option<&str>,
    tools: Vec<Value>,
    tool: &str,
    client: Option<&str>,
) -> Result<Explained, ExplainError> {
    let (path, policy) = match given {
        Some((path, policy)) => (Some(path), policy),
        None => (None, Policy::default()),
    };
    // As `mcp-budget [--policy P] [--client NAME] -- SERVER` sets up its budget.
    let base = std::sync::Arc::new(
        Budget::new(policy)
            .choosing(client, path.is_none(), true)
            .map_err(ExplainError::Input)?,
    );
    let choice = crate::commands::report::policy_for(path, server).map_err(ExplainError::Input)?;
    let profile = base.choice().forced.clone();
    let session = base.for_session(choice.policy.as_ref(), profile.as_ref());
    let name_of = |t: &Value| t.get("name").and_then(Value::as_str).map(String::from);
    let names: Vec<String> = tools.iter().filter_map(name_of).collect();
    let hidden: Vec<String> = names
        .iter()
        .filter(|name| session.policy().hides(name))
        .cloned()
        .collect();
    if session.policy().hides(tool) {
        return Ok(Explained {
            descriptor: None,
            pages: None,
            hidden,
            policy: choice,
        });
    }
    if !names.iter().any(|name| name == tool) {
        return Err(ExplainError::Input(format!(
            "no tool named {tool:?}; the descriptors have: {}",
            if names.is_empty() {
                "no tools".to_string()
            } else {
                names.join(", ")
            }
        )));
    }
    // The proxy's interceptor: the server names itself (its built-in policy is picked, as in
    // the proxy), then its tools/list passes.
    let interceptor = crate::intercept::Interceptor::shared(base.clone());
    if let Some(server) = server {
        let named = json!({"jsonrpc": "2.0", "id": 0, "result": {"serverInfo": {"name": server}}});
        interceptor.initialize_response(named.to_string().as_bytes());
    }
    let list = json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": tools}});
    let rewritten = interceptor
        .tools_list_response(list.to_string().as_bytes(), None)
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        .unwrap_or(list);
    let descriptor = rewritten["result"]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t.get("name").and_then(Value::as_str) == Some(tool))
        .cloned()
        .ok_or_else(|| {
            ExplainError::Input(format!(
                "the proxy's tools/list has no tool named {tool:?} (it hides it)"
            ))
        })?;
    let pages = profile.map(|p| client_pages(&session, &p, tool));
    Ok(Explained {
        descriptor: Some(descriptor),
        pages,
        hidden,
        policy: choice,
    })
}

/// What a client's profile makes of `tool`'s results, for a person.
fn client_pages(budget: &Budget, profile: &crate::client::Profile, tool: &str) -> String {
    let limits = budget.limits();
    let cap = budget.cap_for(tool);
    let mut lines = vec![format!(
        "client {} (clientInfo.name {}): source: {}",
        profile.name,
        profile
            .clients
            .iter()
            .map(|c| format!("{c:?}"))
            .collect::<Vec<_>>()
            .join(" or "),
        profile.source
    )];
    let allowance = if cap != limits.bytes {
        " (the maxResultSizeChars allowance the proxy declares on this tool)"
    } else {
        ""
    };
    lines.push(format!("  result cap: {cap} bytes{allowance}"));
    if let Some(tokens) = limits.tokens {
        lines.push(format!("  token budget: {tokens} tokens (o200k)"));
    }
    if let Some(lines_max) = limits.lines {
        lines.push(format!("  line budget: {lines_max} lines"));
    }
    match budget.policy().rule_for(tool) {
        Some(rule) if rule.text.is_some() => {
            let page = rule.text.as_ref().map_or(0, |t| t.page_bytes);
            lines.push(format!("  text pages: at most {page} bytes of whole lines"));
        }
        Some(rule) if rule.items.is_some() => {
            if let Some(items) = &rule.items {
                lines.push(format!(
                    "  items: default limit {} (lowered further when a default page is over the budget), max {}",
                    items.default_limit, items.max_limit
                ));
            }
        }
        _ => {}
    }
    if budget.auto_for(tool) {
        lines.push(format!(
            "  automatic pages: under {} bytes each",
            budget.page_max(tool)
        ));
    }
    lines.join("\n")
}

/// What `fetch_tools` learned of a live server.
#[derive(Debug)]
pub struct Fetched {
    /// Every tool of its `tools/list`.
    pub tools: Vec<Value>,
    /// Its era, in words.
    pub detected: String,
    /// Its `serverInfo.name`, if it gave one.
    pub server: Option<String>,
}

/// Starts `command`, learns its protocol era as the proxy does (`server/discover`, else
/// `initialize`), and reads every page of its `tools/list`; with what was detected.
pub async fn fetch_tools(command: &[String]) -> Result<Fetched, ExplainError> {
    let (mut child, pipes) = ChildServer::spawn(command)?;
    let mut stdin = pipes.stdin;
    let mut frames = FrameReader::new(pipes.stdout, DEFAULT_MAX_MESSAGE_BYTES);
    let mut next_id = 0u64;
    let mut request =
        async |method: &str, params: Value, secs: u64| -> Result<Value, ExplainError> {
            next_id += 1;
            let mut line = json!({"jsonrpc": "2.0", "id": next_id, "method": method});
            // No params rather than empty ones (a first tools/list): what clients send, and what
            // a recorded server (`mcp-budget replay`) matches.
            if params.as_object().is_none_or(|p| !p.is_empty()) {
                line["params"] = params;
            }
            stdin.write_all(format!("{line}\n").as_bytes()).await?;
            stdin.flush().await?;
            loop {
                let frame = tokio::time::timeout(Duration::from_secs(secs), frames.next_frame())
                    .await
                    .map_err(|_| {
                        ExplainError::Input(format!(
                            "the server did not answer {method} within {secs} s"
                        ))
                    })??;
                let Some(Frame::Line(line)) = frame else {
                    return Err(ExplainError::Input(format!(
                        "the server closed its output before answering {method}"
                    )));
                };
                let Ok(message) = serde_json::from_slice::<Value>(&line) else {
                    continue;
                };
                if message.get("id") == Some(&json!(next_id)) {
                    if let Some(error) = message.get("error") {
                        return Err(ExplainError::Input(format!(
                            "the server answered {method} with an error: {error}"
                        )));
                    }
                    return Ok(message.get("result").cloned().unwrap_or(Value::Null));
                }
            }
        };
    let client_info = json!({"name": "mcp-budget explain", "version": env!("CARGO_PKG_VERSION")});
    let meta = json!({
        crate::wire::message::META_VERSION: crate::protocol::MODERN,
        crate::wire::message::META_CLIENT_CAPABILITIES: {},
        crate::wire::message::META_CLIENT_INFO: client_info,
    });
    let (modern, detected, server) = match request("server/discover", json!({"_meta": meta}), 10)
        .await
    {
        Ok(result) => {
            let server = result["_meta"][crate::wire::message::META_SERVER_INFO]["name"]
                .as_str()
                .map(String::from);
            let name = server.as_deref().unwrap_or("unnamed");
            (
                true,
                format!("server {name}: modern (2026-07-28), it answered server/discover"),
                server,
            )
        }
        Err(why) => {
            let init = request(
                "initialize",
                json!({"protocolVersion": crate::era::bridge::LEGACY, "capabilities": {}, "clientInfo": client_info}),
                30,
            )
            .await?;
            let server = init["serverInfo"]["name"].as_str().map(String::from);
            let name = server.as_deref().unwrap_or("unnamed");
            let version = init["protocolVersion"].as_str().unwrap_or("?");
            (
                false,
                format!(
                    "server {name}: legacy ({version}, by initialize); server/discover: {why}; a 2026-07-28 client reaches it through mcp-budget's era bridge"
                ),
                server,
            )
        }
    };
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..1000 {
        let mut params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        if modern {
            params["_meta"] = meta.clone();
        }
        let page = request("tools/list", params, 30).await?;
        tools.extend(tools_in(&page));
        cursor = page
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(String::from);
        if cursor.is_none() {
            break;
        }
    }
    drop(stdin);
    child.terminate(Duration::from_millis(500)).await.ok();
    Ok(Fetched {
        tools,
        detected,
        server,
    })
}

/// What `check --recording` found.
pub struct PathFindings {
    pub text: String,
    /// Rules whose items path matched none of their tool's recorded results.
    pub unmatched: usize,
}

/// For each rule with an items path, in how many of its tools' recorded results the path
/// finds a list. A path that finds none is reported: at run time those results are paged
/// automatically instead, which is rarely what the rule meant.
pub fn paths_in_recording(
    budget: &Budget,
    recording: &crate::recording::Recording,
) -> PathFindings {
    use std::collections::BTreeMap;
    // tool → (results, matched)
    let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for exchange in recording.exchanges() {
        if exchange.method != "tools/call" {
            continue;
        }
        let Some(result) = exchange.response.as_ref().and_then(|r| r.get("result")) else {
            continue;
        };
        let tool = exchange
            .upstream_request
            .pointer("/params/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if let Some(matched) = budget.items_match(tool, result) {
            let entry = counts.entry(tool.to_string()).or_default();
            entry.0 += 1;
            entry.1 += usize::from(matched);
        }
    }
    let mut text = String::new();
    let mut unmatched = 0;
    for (tool, (results, matched)) in &counts {
        let path = budget
            .policy()
            .rule_for(tool)
            .and_then(|r| r.items.as_ref())
            .map_or("", |i| i.path_text.as_str());
        if *matched == 0 {
            unmatched += 1;
            text.push_str(&format!(
                "warning: items = {path:?} for {tool} matches nothing in its {results} recorded result{}: those results would be paged automatically instead; fix the path (`mcp-budget explain` shows the descriptor)\n",
                if *results == 1 { "" } else { "s" }
            ));
        } else {
            text.push_str(&format!(
                "{tool}: items = {path:?} finds a list in {matched} of {results} recorded results\n"
            ));
        }
    }
    if counts.is_empty() {
        text.push_str("no recorded tools/call result is governed by an items rule\n");
    }
    PathFindings { text, unmatched }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_that_share_a_name_intersect() {
        assert!(globs_intersect("fleet_*", "*_show"));
        assert!(globs_intersect("w?ve_*", "wave_show"));
        assert!(!globs_intersect("fleet_*", "wave_*"));
        assert!(!globs_intersect("a?c", "abcd"));
        assert!(globs_intersect("*", "anything"));
    }

    #[test]
    fn check_warns_about_overlaps_pages_over_the_cap_and_missing_keys() {
        let policy = Policy::parse(
            "[budget]\nmax_bytes = 10000\n[[tool]]\nname = \"fleet_*\"\n[[tool]]\nname = [\"fleet_show\", \"*_show\"]\nitems = \"$.streams[*]\"\n[[tool]]\nname = \"log\"\n[tool.text]\npage_bytes = 20000\n",
            std::path::Path::new("w.toml"),
        )
        .unwrap();
        let found = warnings(&policy).join("\n");
        assert!(
            found.contains("rules 1 and 2 both match \"*_show\""),
            "{found}"
        );
        assert!(
            found.contains("page_bytes = 20000 is not below budget.max_bytes = 10000"),
            "{found}"
        );
        assert!(
            found.contains("rule 2 (fleet_show, *_show): no key"),
            "{found}"
        );
        assert!(found.contains("no noun"), "{found}");
        for shipped in crate::builtin::BUILTINS {
            let policy = Policy::parse(shipped.text, std::path::Path::new(shipped.name)).unwrap();
            assert_eq!(warnings(&policy), Vec::<String>::new(), "{}", shipped.name);
        }
    }
}
