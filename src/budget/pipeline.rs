//! The items pipeline: the stages, wired in the order of the contract (§3), and nothing else.
//!
//! locate the items ([`place`]) → `total_count` → [`horizon`] → [`filter`] → [`page`] →
//! [`project`] → render ([`render`], put back in place). Each stage is a function of its own
//! module; this file only passes the list from one to the next and collects the notices.

use jsonpath_rust::query::queryable::Queryable;
use serde_json::{Map, Value, json};

use super::args::{CallArgs, Detail, Format, HorizonArg};
use super::cursor::CursorKey;
use super::page::Position;
use super::place::{self, Source};
use super::render::{self, Continuation, RenderError};
use super::{filter, horizon, notice, page, project};
use crate::policy::Items;

/// What narrowing and paging the whole list gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Narrowed {
    /// Items the server returned.
    pub total_count: usize,
    /// Items the horizon dropped.
    pub horizon_dropped: usize,
    /// Items left after the horizon and the filters.
    pub matching: usize,
    /// Matching items before the page.
    pub skipped: usize,
    /// Where the next page starts, when more items remain.
    pub next: Option<Position>,
}

/// Pages the items of `result` for one call; the result is rewritten in place. A result with
/// no item list where the rule says is left as it is, and `Ok(false)` says so.
pub fn run(
    tool: &str,
    items: &Items,
    args: &CallArgs,
    key: &CursorKey,
    result: &mut Value,
) -> Result<bool, RenderError> {
    run_fitted(tool, items, args, None, None, key, result)
}

/// [`run`] on a result [`reduce`](super::reduce) cut down to its page: the list holds only the
/// page's items, and `narrowed` says what the whole list gave.
pub fn run_reduced(
    tool: &str,
    items: &Items,
    args: &CallArgs,
    narrowed: &Narrowed,
    key: &CursorKey,
    result: &mut Value,
) -> Result<bool, RenderError> {
    run_fitted(tool, items, args, None, Some(narrowed), key, result)
}

/// [`run`], where `fitted` names the budget a lowered default limit was fitted to.
pub fn run_fitted(
    tool: &str,
    items: &Items,
    args: &CallArgs,
    fitted: Option<&str>,
    narrowed: Option<&Narrowed>,
    key: &CursorKey,
    result: &mut Value,
) -> Result<bool, RenderError> {
    let Some((source, mut document)) = place::locate(result, items) else {
        tracing::debug!(tool, path = %items.path_text, "no item list in the result");
        return Ok(false);
    };
    // A structured field that repeats the text the items came from is paged with it.
    let mirror = match &source {
        Source::Text(index) => place::mirror_field(result, *index).map(|field| (*index, field)),
        _ => None,
    };
    // 1–2: the items, and how many upstream returned.
    let Some(path) = place::first_list_path(&document, items) else {
        place::restore(result, source, document);
        return Ok(false);
    };
    let Some(Value::Array(mut list)) = document.reference_mut(path.as_str()).map(std::mem::take)
    else {
        place::restore(result, source, document);
        return Ok(false);
    };
    let total_count = narrowed.map_or(list.len(), |n| n.total_count);
    let summary = match (args.detail, &items.summary, args.format) {
        (Some(Detail::Summary), Some(summary), Format::Json) => Some(summary),
        _ => None,
    };
    // 3: horizon, then filters.
    let mut notices = Vec::new();
    let dropped = match narrowed {
        Some(n) => n.horizon_dropped,
        None => narrow(&mut list, items, args, summary),
    };
    if dropped > 0
        && args.horizon_defaulted
        && let Some(h) = &items.horizon
    {
        notices.push(notice::horizon(h, &items.noun));
    }
    let matching = narrowed.map_or(list.len(), |n| n.matching);
    // 4: page (a reduced list is the page already).
    let page::Page {
        items: mut page,
        start: skipped,
        next,
    } = match narrowed {
        Some(n) => {
            // The reduced list is the page; a default page made again with fewer items for the
            // client (the budget's `fit_default_limit`) is its first items, the position after
            // them counted from where the page starts in the whole list.
            let first = page::apply(list, None, args.limit, items.key.as_ref());
            page::Page {
                items: first.items,
                start: n.skipped,
                next: match first.next {
                    Some(position) => Some(page::Position {
                        offset: n.skipped + position.offset,
                        ..position
                    }),
                    None => n.next.clone(),
                },
            }
        }
        None => page::apply(list, args.after.as_ref(), args.limit, items.key.as_ref()),
    };
    // 5: project (a table has its own fixed columns; nested items were projected in step 3).
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
        notices.push(match fitted {
            None => notice::limit(
                page.len(),
                matching,
                args.limit,
                items.max_limit,
                &items.noun,
            ),
            Some(budget) => notice::limit_fitted(
                page.len(),
                matching,
                items.default_limit,
                budget,
                &items.noun,
            ),
        });
    }
    // A page cut from the result names it, for a call that passes it on.
    let result_ref = args
        .reference
        .clone()
        .filter(|_| next.is_some() || skipped > 0);
    if let Some(reference) = &result_ref {
        notices.push(super::reference::sentence(reference));
    }
    let continuation = Continuation {
        total_count,
        matching,
        skipped,
        next_after: next.map(|position| key.mint(&position, &args.digest)),
        notices,
        result_ref,
    };
    // 6: render, in the place the items came from.
    let rendered = match source {
        Source::Blocks(indices) => {
            render_blocks(tool, items, args, &page, &continuation, &indices, result)
        }
        source => render_in_place(
            tool,
            items,
            args,
            page,
            &continuation,
            (source, document, &path),
            result,
        ),
    };
    rendered?;
    if let Some((index, field)) = mirror
        && args.format == Format::Json
    {
        let text = result["content"][index]["text"].clone();
        if let Some(Value::Object(structured)) = result.get_mut("structuredContent") {
            structured.insert(field, text);
        }
    }
    Ok(true)
}

/// Step 3: the horizon, then the filters — on the items, or on each outer item's nested list
/// (where the summary projection is applied too). Returns how many items the horizon dropped.
pub(super) fn narrow(
    list: &mut Vec<Value>,
    items: &Items,
    args: &CallArgs,
    summary: Option<&Vec<crate::policy::FieldPath>>,
) -> usize {
    let filters: Vec<filter::Filter> = args.filters.iter().map(|(_, f)| f.clone()).collect();
    let live = |list: &mut Vec<Value>| match (args.horizon, &items.horizon) {
        (Some(HorizonArg::Live), Some(h)) => horizon::apply(list, h),
        _ => 0,
    };
    let Some((_, field)) = &items.nested else {
        let dropped = live(list);
        filter::apply(list, &filters);
        return dropped;
    };
    let selection = summary.map(|s| project::Selection::from_paths(s));
    let mut dropped = 0;
    for outer in list.iter_mut() {
        let Some(Value::Array(inner)) = outer.get_mut(field.as_str()) else {
            continue;
        };
        dropped += live(inner);
        filter::apply(inner, &filters);
        if let Some(selection) = &selection {
            let taken = std::mem::take(inner);
            *inner = taken
                .into_iter()
                .map(|item| project::apply(item, selection))
                .collect();
        }
    }
    dropped
}

/// The items were text blocks: the page is blocks too (or one table), then the continuation.
fn render_blocks(
    tool: &str,
    items: &Items,
    args: &CallArgs,
    page: &[Value],
    continuation: &Continuation,
    indices: &[usize],
    result: &mut Value,
) -> Result<(), RenderError> {
    let at = place::remove_blocks(result, indices);
    let (mut blocks, text) = match args.format {
        Format::Json => {
            let blocks: Vec<Value> = page
                .iter()
                .map(|item| json!({"type": "text", "text": item.to_string()}))
                .collect();
            let mut tail = Map::new();
            render::decorate(&mut tail, continuation);
            (blocks, Value::Object(tail).to_string())
        }
        Format::Csv | Format::Tsv => {
            let columns = items.columns.as_deref().unwrap_or_default();
            let table = render::table(page, columns, delimiter(args.format))?;
            (
                vec![json!({"type": "text", "text": table})],
                render::table_continuation(continuation, page.len(), tool, &items.noun),
            )
        }
    };
    blocks.push(json!({"type": "text", "text": text}));
    if let Some(content) = place::content_mut(result) {
        let at = at.min(content.len());
        content.splice(at..at, blocks);
    }
    Ok(())
}

/// The items were one list in a document: the page replaces the list there (JSON), or a table
/// replaces the document (csv/tsv).
fn render_in_place(
    tool: &str,
    items: &Items,
    args: &CallArgs,
    page: Vec<Value>,
    continuation: &Continuation,
    (source, mut document, path): (Source, Value, &str),
    result: &mut Value,
) -> Result<(), RenderError> {
    match args.format {
        Format::Json => {
            let envelope = if path == "$" {
                let mut map = Map::new();
                map.insert(items.noun.clone(), Value::Array(page));
                render::decorate(&mut map, continuation);
                Value::Object(map)
            } else {
                if let Some(slot) = document.reference_mut(path) {
                    *slot = Value::Array(page);
                }
                if let Value::Object(map) = &mut document {
                    render::decorate(map, continuation);
                }
                document
            };
            place::put_json(result, source, envelope);
        }
        Format::Csv | Format::Tsv => {
            let name = if args.format == Format::Csv {
                "csv"
            } else {
                "tsv"
            };
            let columns = items.columns.as_deref().unwrap_or_default();
            let table = render::table(&page, columns, delimiter(args.format))?;
            let text = render::table_continuation(continuation, page.len(), tool, &items.noun);
            // The table's rows and the continuation replace structuredContent (when the items
            // came from a text, the copy of that text it held too).
            let structured = render::table_structured(continuation, &page, columns, name);
            let mirrored = match &source {
                Source::Text(index) => place::mirror_field(result, *index).is_some(),
                _ => false,
            };
            place::put_table(result, source, table, text, structured.clone());
            if mirrored {
                result["structuredContent"] = structured;
            }
        }
    }
    Ok(())
}

fn delimiter(format: Format) -> u8 {
    if format == Format::Tsv { b'\t' } else { b',' }
}
