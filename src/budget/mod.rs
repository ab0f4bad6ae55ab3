//! The budget: a policy applied to `tools/list` descriptors and `tools/call` calls.
//!
//! The stages are pure, synchronous functions over `serde_json::Value` (no I/O), one module
//! each, run in this order on a result (contract §3):
//! items → total_count → [`horizon`] → [`filter`] → [`page`] → [`project`] → [`render`] →
//! [`cap`]. [`args`] reads and strips the budget arguments of a call, [`cursor`] mints and
//! verifies `next_after`, [`notice`] words what a default narrowed, and [`descriptor`]
//! rewrites `tools/list`.
//!
//! Pages are stateless: a call with `after` re-calls the server with the same upstream
//! arguments and pages the fresh result, so nothing is cached and any proxy instance that
//! shares the cursor key can serve the next page.

pub mod args;
pub mod cap;
pub mod cursor;
pub mod descriptor;
pub mod field;
pub mod filter;
pub mod horizon;
pub mod notice;
pub mod page;
pub mod project;
pub mod render;
pub mod text;

use jsonpath_rust::query::{js_path_process, queryable::Queryable};
use serde_json::{Map, Value, json};

use crate::policy::{Items, Policy, Rule};
use args::{ArgError, CallArgs, Detail, Format, HorizonArg};
use cursor::CursorKey;
use render::Continuation;

/// A policy, ready to apply.
#[derive(Debug)]
pub struct Budget {
    policy: Policy,
    key: CursorKey,
}

/// What the response hook needs to know about one call.
#[derive(Debug)]
pub struct CallPlan {
    pub tool: String,
    /// Index of the rule in the policy, and how the call is paged (paged tools only).
    rule: Option<(usize, Option<Paging>)>,
}

/// How one call's result is paged.
#[derive(Debug)]
enum Paging {
    Items(CallArgs),
    Text(args::TextArgs),
}

impl CallPlan {
    /// Whether the call's result goes through the paging pipeline.
    pub fn is_paged(&self) -> bool {
        matches!(self.rule, Some((_, Some(_))))
    }
}

/// Where the item list of a result was found.
enum Source {
    Structured,
    /// The index of the text content block holding the JSON.
    Text(usize),
    /// Several text blocks, one JSON object each: the items themselves.
    Blocks(Vec<usize>),
}

impl Budget {
    pub fn new(policy: Policy) -> Budget {
        let key = match policy.cursor_key_env.as_deref().map(std::env::var) {
            Some(Ok(secret)) if !secret.is_empty() => CursorKey::from_secret(secret.as_bytes()),
            Some(_) => {
                tracing::warn!(
                    variable = policy.cursor_key_env.as_deref().unwrap_or_default(),
                    "the cursor key variable is unset or empty; using a random key (cursors will not survive a restart)"
                );
                CursorKey::random()
            }
            None => CursorKey::random(),
        };
        Budget { policy, key }
    }

    /// With a fixed cursor key (tests, benchmarks, replay).
    pub fn with_key(policy: Policy, key: CursorKey) -> Budget {
        Budget { policy, key }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    fn rule_index(&self, tool: &str) -> Option<usize> {
        let rule = self.policy.rule_for(tool)?;
        self.policy.rules.iter().position(|r| std::ptr::eq(r, rule))
    }

    /// Whether the policy pages this tool's results.
    pub fn is_paged(&self, tool: &str) -> bool {
        self.policy
            .rule_for(tool)
            .is_some_and(|rule| rule.items.is_some() || rule.text.is_some())
    }

    /// The plan of a call whose result is only capped.
    pub fn plan_unpaged(&self, tool: String) -> CallPlan {
        CallPlan {
            rule: self.rule_index(&tool).map(|index| (index, None)),
            tool,
        }
    }

    /// How many items a budgeted page of `tool` holds (for reports).
    pub fn page_len(&self, tool: &str, document: &Value) -> Option<usize> {
        let items = self.policy.rule_for(tool)?.items.as_ref()?;
        let path = first_list_path(document, items)?;
        document
            .reference(path.as_str())
            .and_then(Value::as_array)
            .map(Vec::len)
    }

    /// Rewrites the tools of a `tools/list` result; returns whether anything changed.
    pub fn rewrite_tools_list(&self, result: &mut Value) -> bool {
        let Some(Value::Array(tools)) = result.get_mut("tools") else {
            return false;
        };
        let mut changed = false;
        for tool in tools {
            let Value::Object(tool) = tool else { continue };
            let Some(rule) = tool
                .get("name")
                .and_then(Value::as_str)
                .and_then(|name| self.policy.rule_for(name))
            else {
                continue;
            };
            descriptor::rewrite(tool, rule, &self.policy);
            changed = true;
        }
        changed
    }

    /// Reads a `tools/call`'s params: strips the budget arguments from `params.arguments`
    /// and plans the response. An argument error is the tool error to answer with.
    pub fn prepare_call(&self, params: &mut Value) -> Result<CallPlan, ArgError> {
        let tool = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let Some(index) = self.rule_index(&tool) else {
            return Ok(CallPlan { tool, rule: None });
        };
        let rule = &self.policy.rules[index];
        if rule.items.is_none() && rule.text.is_none() {
            return Ok(CallPlan {
                tool,
                rule: Some((index, None)),
            });
        }
        let mut empty = Map::new();
        let arguments = match params.get_mut("arguments") {
            Some(Value::Object(arguments)) => arguments,
            _ => &mut empty,
        };
        let paging = match &rule.items {
            Some(items) => Paging::Items(args::take(&tool, arguments, items, &self.key)?),
            None => Paging::Text(args::take_text(&tool, arguments, &self.key)?),
        };
        Ok(CallPlan {
            tool,
            rule: Some((index, Some(paging))),
        })
    }

    /// Whether a response to this call may pass unparsed when it is this small.
    pub fn passes_unread(&self, plan: &CallPlan, bytes: usize) -> bool {
        plan.rule.as_ref().is_none_or(|(_, args)| args.is_none())
            && !cap::exceeds(bytes, self.policy.max_bytes)
    }

    /// The result the client receives for this call: the budgeted page, or the cap's refusal.
    /// Returns the serialized result.
    pub fn finish_call(&self, plan: &CallPlan, mut result: Value) -> Result<Vec<u8>, RenderError> {
        let rule = plan
            .rule
            .as_ref()
            .map(|(i, args)| (&self.policy.rules[*i], args.as_ref()));
        let is_error = result.get("isError").and_then(Value::as_bool) == Some(true);
        match rule {
            Some((rule, Some(Paging::Items(args)))) if !is_error => {
                if let Some(items) = &rule.items {
                    self.run_pipeline(&plan.tool, items, args, &mut result)?;
                }
            }
            Some((rule, Some(Paging::Text(args)))) if !is_error => {
                if let Some(text) = &rule.text {
                    self.run_text(&plan.tool, text.page_bytes, args, &mut result);
                }
            }
            _ => {}
        }
        let bytes = serde_json::to_vec(&result)?;
        if !cap::exceeds(bytes.len(), self.policy.max_bytes) {
            return Ok(bytes);
        }
        let moves = self.moves(rule);
        let text = cap::refusal(&plan.tool, bytes.len(), self.policy.max_bytes, &moves);
        tracing::info!(tool = %plan.tool, bytes = bytes.len(), "result refused by the cap");
        Ok(serde_json::to_vec(&refusal_result(&text))?)
    }

    /// The refusal for a result of `bytes` bytes that passes unparsed (no paging rule).
    pub fn refuse_unread(&self, plan: &CallPlan, bytes: usize) -> Result<Vec<u8>, RenderError> {
        let rule = plan
            .rule
            .as_ref()
            .map(|(i, args)| (&self.policy.rules[*i], args.as_ref()));
        let text = cap::refusal(&plan.tool, bytes, self.policy.max_bytes, &self.moves(rule));
        Ok(serde_json::to_vec(&refusal_result(&text))?)
    }

    fn moves(&self, rule: Option<(&Rule, Option<&Paging>)>) -> cap::Moves {
        match rule {
            None => cap::Moves {
                no_rule: true,
                ..cap::Moves::default()
            },
            Some((_, Some(Paging::Text(_)))) => cap::Moves::default(),
            Some((Rule { items: None, .. }, _)) | Some((_, None)) => cap::Moves {
                not_paged: true,
                ..cap::Moves::default()
            },
            Some((
                Rule {
                    items: Some(items), ..
                },
                Some(Paging::Items(args)),
            )) => cap::Moves {
                filters: items.filters.iter().map(|(name, _)| name.clone()).collect(),
                limit: Some(args.limit),
                detail_full: args.detail == Some(Detail::Full),
                horizon_all: (args.horizon == Some(HorizonArg::All)).then(|| {
                    let terminal = items
                        .horizon
                        .as_ref()
                        .map(|h| h.terminal.clone())
                        .unwrap_or_default();
                    (terminal, items.noun.clone())
                }),
                ..cap::Moves::default()
            },
        }
    }

    /// Pages the first text block of a result by lines; the page replaces it (and the same
    /// text in `structuredContent`), and a notice block follows it.
    fn run_text(&self, tool: &str, page_bytes: usize, args: &args::TextArgs, result: &mut Value) {
        let Some((index, whole)) = text_blocks(result).next().map(|(i, t)| (i, t.to_string()))
        else {
            return;
        };
        let start = args.after.unwrap_or(0);
        if start == 0 && whole.len() <= page_bytes {
            return; // fits: untouched
        }
        let page = text::page(&whole, start, page_bytes);
        let next = (page.end < whole.len()).then(|| {
            self.key.mint(
                &page::Position {
                    offset: page.end,
                    key: None,
                },
                &args.digest,
            )
        });
        let notice = text::notice(&page, whole.len(), tool, next.as_deref(), page_bytes);
        let slice = whole[page.start..page.end].to_string();
        if let Some(Value::Object(structured)) = result.get_mut("structuredContent") {
            for value in structured.values_mut() {
                if value.as_str() == Some(whole.as_str()) {
                    *value = json!(slice);
                }
            }
        }
        if let Some(content) = content_mut(result) {
            content[index]["text"] = json!(slice);
            content.insert(index + 1, json!({"type": "text", "text": notice}));
        }
    }

    fn run_pipeline(
        &self,
        tool: &str,
        items: &Items,
        args: &CallArgs,
        result: &mut Value,
    ) -> Result<(), RenderError> {
        let Some((source, mut document)) = locate(result, items) else {
            tracing::debug!(tool, path = %items.path_text, "no item list in the result; passed unpaged");
            return Ok(());
        };
        // 1–2: the items, and how many upstream returned.
        let path = match first_list_path(&document, items) {
            Some(path) => path,
            None => {
                restore(result, source, document);
                return Ok(());
            }
        };
        let list = match document.reference_mut(path.as_str()) {
            Some(list) => std::mem::take(list),
            None => {
                restore(result, source, document);
                return Ok(());
            }
        };
        let Value::Array(mut list) = list else {
            restore(result, source, document);
            return Ok(());
        };
        let total_count = list.len();
        let mut notices = Vec::new();
        let filters: Vec<filter::Filter> = args.filters.iter().map(|(_, f)| f.clone()).collect();
        let summary = match (args.detail, &items.summary, args.format) {
            (Some(Detail::Summary), Some(summary), Format::Json) => Some(summary),
            _ => None,
        };
        // 3: horizon, then filters — on the items, or on each outer item's nested list.
        let mut dropped = 0;
        match &items.nested {
            None => {
                if let (Some(HorizonArg::Live), Some(h)) = (args.horizon, &items.horizon) {
                    dropped = horizon::apply(&mut list, h);
                }
                filter::apply(&mut list, &filters);
            }
            Some((_, field)) => {
                let selection = summary.map(|s| project::Selection::from_paths(s));
                for outer in &mut list {
                    let Some(Value::Array(inner)) = outer.get_mut(field.as_str()) else {
                        continue;
                    };
                    if let (Some(HorizonArg::Live), Some(h)) = (args.horizon, &items.horizon) {
                        dropped += horizon::apply(inner, h);
                    }
                    filter::apply(inner, &filters);
                    if let Some(selection) = &selection {
                        let taken = std::mem::take(inner);
                        *inner = taken
                            .into_iter()
                            .map(|item| project::apply(item, selection))
                            .collect();
                    }
                }
            }
        }
        if dropped > 0
            && args.horizon_defaulted
            && let Some(h) = &items.horizon
        {
            notices.push(notice::horizon(h, &items.noun));
        }
        let matching = list.len();
        // 4: page.
        let page::Page {
            items: mut page,
            start: skipped,
            next,
        } = page::apply(list, args.after.as_ref(), args.limit, items.key.as_ref());
        // 5: project (a table has its own fixed columns; nested items were projected above).
        if let Some(summary) = summary {
            if items.nested.is_none() {
                let selection = project::Selection::from_paths(summary);
                page = page
                    .into_iter()
                    .map(|item| project::apply(item, &selection))
                    .collect();
            }
            if args.detail_defaulted && !page.is_empty() {
                notices.push(notice::detail(summary, &items.noun));
            }
        }
        if next.is_some() && args.limit_defaulted {
            notices.push(notice::limit(
                page.len(),
                matching,
                args.limit,
                items.max_limit,
                &items.noun,
            ));
        }
        let continuation = Continuation {
            total_count,
            matching,
            skipped,
            next_after: next.map(|position| self.key.mint(&position, &args.digest)),
            notices,
        };
        // 6: render.
        if let Source::Blocks(indices) = &source {
            // The items were text blocks: the page is blocks too, then the continuation.
            let at = remove_blocks(result, indices);
            let mut blocks: Vec<Value> = match args.format {
                Format::Json => page
                    .iter()
                    .map(|item| json!({"type": "text", "text": item.to_string()}))
                    .collect(),
                Format::Csv | Format::Tsv => {
                    let delimiter = if args.format == Format::Csv {
                        b','
                    } else {
                        b'\t'
                    };
                    let columns = items.columns.as_deref().unwrap_or_default();
                    vec![json!({"type": "text", "text": render::table(&page, columns, delimiter)?})]
                }
            };
            let text = match args.format {
                Format::Json => {
                    let mut tail = Map::new();
                    render::decorate(&mut tail, &continuation);
                    Value::Object(tail).to_string()
                }
                _ => render::table_continuation(&continuation, page.len(), tool, &items.noun),
            };
            blocks.push(json!({"type": "text", "text": text}));
            if let Some(content) = content_mut(result) {
                let at = at.min(content.len());
                content.splice(at..at, blocks);
            }
            return Ok(());
        }
        match args.format {
            Format::Json => {
                let envelope = if path == "$" {
                    let mut map = Map::new();
                    map.insert(items.noun.clone(), Value::Array(page));
                    render::decorate(&mut map, &continuation);
                    Value::Object(map)
                } else {
                    if let Some(slot) = document.reference_mut(path.as_str()) {
                        *slot = Value::Array(page);
                    }
                    if let Value::Object(map) = &mut document {
                        render::decorate(map, &continuation);
                    }
                    document
                };
                put_json(result, source, envelope);
            }
            Format::Csv | Format::Tsv => {
                let (delimiter, name) = if args.format == Format::Csv {
                    (b',', "csv")
                } else {
                    (b'\t', "tsv")
                };
                let columns = items.columns.as_deref().unwrap_or_default();
                let table = render::table(&page, columns, delimiter)?;
                let text = render::table_continuation(&continuation, page.len(), tool, &items.noun);
                put_table(
                    result,
                    source,
                    table,
                    text,
                    render::table_structured(&continuation, page.len(), name),
                );
            }
        }
        Ok(())
    }
}

/// A budgeted result could not be written out (a bug, never the server's doing): the call gets a
/// JSON-RPC error that says so, never an empty or cut result.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("the budgeted result could not be serialized: {0}")]
    Json(#[from] serde_json::Error),
    #[error("the budgeted table could not be written: {0}")]
    Table(String),
}

fn refusal_result(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": true})
}

fn looks_like_json(text: &str) -> bool {
    matches!(text.trim_start().as_bytes().first(), Some(b'{' | b'['))
}

fn text_blocks(result: &Value) -> impl Iterator<Item = (usize, &str)> {
    result
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
        .filter(|(_, block)| block.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|(i, block)| block.get("text").and_then(Value::as_str).map(|t| (i, t)))
}

/// The JSONPath of the first list the rule pages in `document` (the outer list of a nested
/// rule).
fn first_list_path(document: &Value, items: &Items) -> Option<String> {
    let query = items
        .nested
        .as_ref()
        .map_or(&items.path, |(outer, _)| outer);
    let found = js_path_process(query, document).ok()?;
    found
        .into_iter()
        .find(|hit| hit.clone().val().is_array())
        .map(|hit| hit.path())
}

/// Takes the document holding the items out of the result: `structuredContent` when the
/// path finds a list there, else the first text block whose JSON has one.
fn locate(result: &mut Value, items: &Items) -> Option<(Source, Value)> {
    if let Some(structured) = result.get("structuredContent")
        && first_list_path(structured, items).is_some()
    {
        let document = result.get_mut("structuredContent").map(std::mem::take)?;
        return Some((Source::Structured, document));
    }
    let mut objects = Vec::new();
    for (index, text) in text_blocks(result) {
        if !looks_like_json(text) {
            continue;
        }
        let Ok(document) = serde_json::from_str::<Value>(text) else {
            continue;
        };
        if first_list_path(&document, items).is_some() {
            return Some((Source::Text(index), document));
        }
        if document.is_object() {
            objects.push((index, document));
        }
    }
    // A result spread over several text blocks, one object each: with `items = "$"` the
    // blocks are the items.
    if items.path_text == "$" && objects.len() >= 2 {
        let (indices, documents): (Vec<usize>, Vec<Value>) = objects.into_iter().unzip();
        return Some((Source::Blocks(indices), Value::Array(documents)));
    }
    None
}

fn restore(result: &mut Value, source: Source, document: Value) {
    if let Source::Structured = source {
        result["structuredContent"] = document;
    }
}

/// Removes the item blocks; returns where they began.
fn remove_blocks(result: &mut Value, indices: &[usize]) -> usize {
    let first = indices.first().copied().unwrap_or(0);
    if let Some(content) = content_mut(result) {
        for index in indices.iter().rev() {
            if *index < content.len() {
                content.remove(*index);
            }
        }
    }
    first
}

fn content_mut(result: &mut Value) -> Option<&mut Vec<Value>> {
    result.get_mut("content").and_then(Value::as_array_mut)
}

/// Puts the JSON envelope where the items came from, and in the JSON text block.
fn put_json(result: &mut Value, source: Source, envelope: Value) {
    let text = envelope.to_string();
    match source {
        Source::Structured => {
            result["structuredContent"] = envelope;
            let json_block = text_blocks(result)
                .find(|(_, t)| looks_like_json(t))
                .map(|(i, _)| i);
            match (json_block, content_mut(result)) {
                (Some(i), Some(content)) => content[i]["text"] = json!(text),
                (None, Some(content)) => content.insert(0, json!({"type": "text", "text": text})),
                (_, None) => result["content"] = json!([{"type": "text", "text": text}]),
            }
        }
        Source::Text(i) => {
            if let Some(content) = content_mut(result) {
                content[i]["text"] = json!(text);
            }
        }
        Source::Blocks(_) => {} // rendered by the caller
    }
}

/// Replaces the JSON with a table and its continuation text.
fn put_table(
    result: &mut Value,
    source: Source,
    table: String,
    continuation: String,
    structured: Value,
) {
    let index = match source {
        Source::Text(i) => Some(i),
        Source::Blocks(_) => None, // rendered by the caller
        Source::Structured => {
            result["structuredContent"] = structured;
            text_blocks(result)
                .find(|(_, t)| looks_like_json(t))
                .map(|(i, _)| i)
        }
    };
    let blocks = [
        json!({"type": "text", "text": table}),
        json!({"type": "text", "text": continuation}),
    ];
    match (index, content_mut(result)) {
        (Some(i), Some(content)) => {
            content.splice(i..=i, blocks);
        }
        (None, Some(content)) => {
            content.splice(0..0, blocks);
        }
        (_, None) => result["content"] = Value::Array(blocks.to_vec()),
    }
}
