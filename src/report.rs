//! `mcp-budget report`: what a policy would do to the `tools/call` results of a recording.
//!
//! For every call that reached the server: the bytes and tokens (tiktoken o200k, of the text the
//! model reads) the server sent, what the client received (through the proxy that recorded, with
//! whatever budget it ran), and what it would receive under the policy with default arguments —
//! the server's recorded result run through the same pipeline the proxy runs.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Value, json};

use crate::budget::Budget;
use crate::framing::Frame;
use crate::intercept::Interceptor;
use crate::recording::Recording;
use crate::relay::Relay;

/// One `tools/call` of the recording.
#[derive(Debug, Clone, Serialize)]
pub struct Call {
    pub index: usize,
    pub tool: String,
    pub arguments: Value,
    /// What the server sent.
    pub server_bytes: usize,
    pub server_tokens: usize,
    /// What the client received from the proxy that recorded.
    pub received_bytes: usize,
    pub received_tokens: usize,
    pub budget_bytes: usize,
    pub budget_tokens: usize,
    /// What the policy does to it: "unchanged", "page: 25 of 40 (total 68)", "refused by the cap", …
    pub outcome: String,
    pub has_rule: bool,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub calls: Vec<Call>,
    pub server_bytes: usize,
    pub server_tokens: usize,
    pub received_bytes: usize,
    pub received_tokens: usize,
    pub budget_bytes: usize,
    pub budget_tokens: usize,
    /// Tools whose default call the cap would refuse.
    pub capped_tools: Vec<String>,
    pub tools_without_rule: Vec<String>,
    /// Where the recording was cut mid-line, if it was.
    pub cut_at_line: Option<usize>,
    pub missed_messages: u64,
}

/// Counts tokens of the text a model reads.
pub struct Tokenizer(tiktoken_rs::CoreBPE);

impl Tokenizer {
    pub fn o200k() -> Result<Tokenizer, String> {
        tiktoken_rs::o200k_base()
            .map(Tokenizer)
            .map_err(|e| format!("cannot load the o200k tokenizer: {e}"))
    }

    pub fn count(&self, text: &str) -> usize {
        self.0.encode_ordinary(text).len()
    }

    /// Tokens of a JSON-RPC response as a model sees it: the text blocks of a result, or the
    /// message of an error.
    pub fn response(&self, message: &Value) -> usize {
        if let Some(error) = message.get("error") {
            return self.count(
                error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
            );
        }
        let texts: Vec<&str> = message["result"]["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|block| block.get("text").and_then(Value::as_str))
            .collect();
        self.count(&texts.join("\n"))
    }
}

fn outcome(original: &Value, budgeted: &Value, page_len: Option<usize>) -> String {
    let result = &budgeted["result"];
    if result["isError"] == json!(true)
        && result["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("result-too-large"))
    {
        return "refused by the cap".into();
    }
    if original["result"] == *result {
        return "unchanged".into();
    }
    if let Some(notice) = result["content"]
        .as_array()
        .and_then(|blocks| blocks.last())
        .and_then(|block| block["text"].as_str())
        && notice.starts_with("mcp-budget paged this result")
    {
        let holds = notice
            .split("this page holds ")
            .nth(1)
            .map(|rest| {
                rest.split(". ")
                    .next()
                    .unwrap_or(rest)
                    .trim_end_matches('.')
            })
            .unwrap_or_default();
        let more = if notice.contains("More remain") {
            ", more pages"
        } else {
            ""
        };
        return format!("paged automatically: {holds}{more}");
    }
    if let Some(notice) = result["content"][1]["text"].as_str()
        && notice.starts_with("Lines ")
    {
        let lines = notice
            .split(" (")
            .next()
            .unwrap_or(notice)
            .trim_start_matches("Lines ");
        let more = if notice.contains("More remain") {
            ", more pages"
        } else {
            ""
        };
        return format!("text page: lines {lines}{more}");
    }
    let structured = &result["structuredContent"];
    if let Some(total) = structured.get("total_count").and_then(Value::as_u64) {
        let shown = structured
            .get("returned")
            .and_then(Value::as_u64)
            .or(page_len.map(|n| n as u64))
            .unwrap_or(0);
        let more = if structured.get("next_after").is_some() {
            ", more pages"
        } else {
            ""
        };
        return format!("page of {shown} (total {total}{more})");
    }
    "trimmed".into()
}

/// What a client receives for `request` when the server answers `response`, through a relay
/// under `budget` (the live path, message for message).
fn live_path(budget: &Arc<Budget>, request: &Value, response: &Value) -> Value {
    let relay = Relay::new(Interceptor::shared(budget.clone()));
    let mut routed = relay.from_client(Frame::Line(request.to_string().into_bytes()));
    let delivered = match routed.to_server {
        Some(_) => relay.from_server(Frame::Line(response.to_string().into_bytes())),
        None => routed
            .to_client
            .pop()
            .or_else(|| routed.deferred.pop().map(|job| job.run())),
    };
    delivered
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or(Value::Null)
}

/// Builds the report; `progress(done, total)` is called as calls are measured.
pub fn build(
    recording: &Recording,
    budget: &Arc<Budget>,
    tokenizer: &Tokenizer,
    mut progress: impl FnMut(usize, usize),
) -> Report {
    let exchanges: Vec<_> = recording
        .exchanges()
        .into_iter()
        .filter(|e| e.method == "tools/call" && e.response.is_some())
        .collect();
    let total = exchanges.len();
    let mut calls = Vec::with_capacity(total);
    let mut capped = BTreeSet::new();
    let mut without_rule = BTreeSet::new();
    for (index, exchange) in exchanges.iter().enumerate() {
        progress(index, total);
        let Some(response) = &exchange.response else {
            continue;
        };
        let received = exchange.received().unwrap_or(response);
        let params = exchange
            .upstream_request
            .get("params")
            .cloned()
            .unwrap_or(Value::Null);
        let tool = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let arguments = params.get("arguments").cloned().unwrap_or(json!({}));
        let has_rule = budget.policy().rule_for(&tool).is_some();
        if !has_rule {
            without_rule.insert(tool.clone());
        }
        // Exactly the live path: a relay under the budget sees the client's request, then the
        // server's response, and what it delivers is what a client would have received.
        let budgeted = live_path(budget, &exchange.request, response);
        let page_len = budget.page_len(&tool, &budgeted["result"]["structuredContent"]);
        let outcome = outcome(response, &budgeted, page_len);
        if outcome == "refused by the cap" {
            capped.insert(tool.clone());
        }
        calls.push(Call {
            index: index + 1,
            tool,
            arguments,
            server_bytes: exchange.response_bytes,
            server_tokens: tokenizer.response(response),
            received_bytes: exchange.delivered_bytes,
            received_tokens: tokenizer.response(received),
            budget_bytes: budgeted.to_string().len(),
            budget_tokens: tokenizer.response(&budgeted),
            outcome,
            has_rule,
        });
    }
    progress(total, total);
    Report {
        server_bytes: calls.iter().map(|c| c.server_bytes).sum(),
        server_tokens: calls.iter().map(|c| c.server_tokens).sum(),
        received_bytes: calls.iter().map(|c| c.received_bytes).sum(),
        received_tokens: calls.iter().map(|c| c.received_tokens).sum(),
        budget_bytes: calls.iter().map(|c| c.budget_bytes).sum(),
        budget_tokens: calls.iter().map(|c| c.budget_tokens).sum(),
        calls,
        capped_tools: capped.into_iter().collect(),
        tools_without_rule: without_rule.into_iter().collect(),
        cut_at_line: recording.cut_at,
        missed_messages: recording.missed,
    }
}

/// The human-readable table.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let w = report
        .calls
        .iter()
        .map(|c| c.tool.chars().count())
        .max()
        .unwrap_or(4)
        .max(5);
    out.push_str(&format!(
        "{:>4}  {:<w$} {:<28} {:>10} {:>9}   {:>10} {:>9}   {:>10} {:>9}   {}\n",
        "#",
        "tool",
        "arguments",
        "bytes",
        "tokens",
        "bytes",
        "tokens",
        "bytes",
        "tokens",
        "under the policy"
    ));
    out.push_str(&format!(
        "{:>4}  {:<w$} {:<28} {:>20}   {:>20}   {:>20}\n",
        "", "", "", "sent by the server", "received by the client", "with default arguments"
    ));
    for call in &report.calls {
        let mut arguments = call.arguments.to_string();
        if arguments.chars().count() > 28 {
            arguments = format!("{}…", arguments.chars().take(27).collect::<String>());
        }
        out.push_str(&format!(
            "{:>4}  {:<w$} {:<28} {:>10} {:>9}   {:>10} {:>9}   {:>10} {:>9}   {}{}\n",
            call.index,
            call.tool,
            arguments,
            call.server_bytes,
            call.server_tokens,
            call.received_bytes,
            call.received_tokens,
            call.budget_bytes,
            call.budget_tokens,
            call.outcome,
            if call.has_rule { "" } else { " (no rule)" }
        ));
    }
    out.push_str(&format!(
        "{:>4}  {:<w$} {:<28} {:>10} {:>9}   {:>10} {:>9}   {:>10} {:>9}\n",
        "",
        "total",
        format!("{} calls", report.calls.len()),
        report.server_bytes,
        report.server_tokens,
        report.received_bytes,
        report.received_tokens,
        report.budget_bytes,
        report.budget_tokens
    ));
    let list = |names: &[String]| {
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    };
    out.push_str(&format!(
        "\ntools the cap would refuse with default arguments: {}\n",
        list(&report.capped_tools)
    ));
    out.push_str(&format!(
        "tools with no budget rule: {}\n",
        list(&report.tools_without_rule)
    ));
    if let Some(line) = report.cut_at_line {
        out.push_str(&format!(
            "note: the recording was cut off at line {line}; the report covers what came before\n"
        ));
    }
    if report.missed_messages > 0 {
        out.push_str(&format!(
            "note: the recorder missed {} messages\n",
            report.missed_messages
        ));
    }
    out
}
