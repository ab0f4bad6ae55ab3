//! Stage 0, for a result whose items are in `structuredContent` or in the JSON of a text block:
//! the list is narrowed and paged where it lies in the server's text, and the pipeline then runs
//! on a result that holds only the page.
//!
//! Why: a large result (a fleet of 1,000 streams is 11 MB, half of it a JSON copy of the other
//! half in a text block) would otherwise be parsed whole into `Value`s and its text read again
//! to write the page with the server's bytes. Here each item is read only for the fields the
//! horizon, the filters and the key need; the items of the page are cut out of the server's
//! text as they are, the copy of `structuredContent` in the text block is written again for the
//! smaller list (or, for a list in a text block, the text and the field of `structuredContent`
//! that repeats it), and the rest of the result is kept byte for byte. The pipeline then
//! renders that small result exactly as it would have rendered the whole one, with the counts
//! and the position the whole list gave (`pipeline::Narrowed`).
//!
//! Whatever this stage is not sure to do exactly as the whole pipeline would — a nested rule, a
//! path other than plain keys, an item that is not an object, a text copy that is not the first
//! JSON text block, a content block naming its type or text twice — it leaves to the whole
//! pipeline (`None`).
//!
//! Where the two differ, on purpose:
//! - two items of equal value spelled differently (`"a"` and `"\u0061"`), or a list that repeats
//!   an item: each item of the page keeps its own spelling, where the whole pipeline, matching
//!   the page to the list by value, may write an item with the spelling of an equal one before
//!   it (or, having matched a repeated item early, write the next against an unrelated element,
//!   keeping only the leaves they share);
//! - an item outside the page that serde_json cannot read into a value (a lone surrogate
//!   escape, nesting deeper than 128): the page is made, where the whole pipeline cannot parse
//!   the result (or the text block) and passes it on unpaged, refuses it over the cap, leaves
//!   it to automatic paging, or pages a later text block that parses. Items of the page are parsed, and such an item there sends
//!   the result the old way.

use std::ops::Range;

use serde_json::{Map, Value};

use super::args::CallArgs;
use super::page;
use super::pipeline::{self, Narrowed};
use super::{exact, raw};
use crate::policy::{FieldPath, Items};

/// A result cut down to its page, and what the whole list gave.
#[derive(Debug)]
pub struct Reduced {
    /// The result's text with only the page's items in its list (and in the copy of
    /// `structuredContent` in its text block).
    pub text: String,
    pub narrowed: Narrowed,
}

/// Where an item's position in the list is kept while it is narrowed (no field name a policy
/// can write starts with a control character).
const INDEX: &str = "\u{1}mcp-budget-item";

/// A text block longer than this that is not the copy of `structuredContent` leaves the result
/// to the whole pipeline (deciding whether it looks like JSON would mean decoding it).
const MAX_OTHER_TEXT: usize = 64 * 1024;

/// The last member named `name` (as a parser that keeps the last of duplicate keys reads it).
fn last(members: &[(String, Range<usize>)], name: &str) -> Option<Range<usize>> {
    members
        .iter()
        .rev()
        .find(|(key, _)| key == name)
        .map(|(_, range)| range.clone())
}

fn offset(range: Range<usize>, by: usize) -> Range<usize> {
    range.start + by..range.end + by
}

/// The keys of a JSONPath made only of `$` and `.key` steps (`$.streams`, `$.data.rows`).
fn plain_path(path: &str) -> Option<Vec<&str>> {
    let rest = path.strip_prefix('$')?;
    if rest.is_empty() {
        return Some(Vec::new());
    }
    let steps: Vec<&str> = rest.strip_prefix('.')?.split('.').collect();
    let plain = |step: &&str| {
        !step.is_empty()
            && step
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    steps.iter().all(plain).then_some(steps)
}

/// The first field of every path the narrowing reads.
fn wanted(items: &Items, args: &CallArgs) -> Vec<String> {
    let mut paths: Vec<&FieldPath> = Vec::new();
    if let (Some(super::args::HorizonArg::Live), Some(horizon)) = (args.horizon, &items.horizon) {
        paths.push(&horizon.field);
    }
    paths.extend(args.filters.iter().map(|(_, filter)| &filter.field));
    paths.extend(items.key.as_ref());
    let mut fields: Vec<String> = paths.iter().filter_map(|p| p.first().cloned()).collect();
    fields.sort();
    fields.dedup();
    fields
}

/// Narrows and pages the list of `items` in `result` (the server's text of a `tools/call`
/// result), or `None` when the whole pipeline must do it.
pub fn reduce(items: &Items, args: &CallArgs, result: &str) -> Option<Reduced> {
    reduce_scanned(items, args, result, &scan(items, result)?)
}

/// [`reduce`], from the walk of this `result` ([`walk`]).
pub fn reduce_scanned(
    items: &Items,
    args: &CallArgs,
    result: &str,
    scanned: &Scanned,
) -> Option<Reduced> {
    match scanned {
        Scanned::Structured(walked) => reduce_walked(items, args, result, walked),
        Scanned::Text { structured, blocks } => {
            let steps = plain_path(&items.path_text)?;
            in_text(
                items,
                args,
                result,
                structured.clone(),
                blocks.clone(),
                &steps,
            )
        }
    }
}

/// The walk of a result whose list is in `structuredContent`: where the list and its items are
/// (each with its members), and the text block that copies `structuredContent`.
#[derive(Debug)]
pub struct Walked {
    structured: Range<usize>,
    list: List,
    copy: Option<Range<usize>>,
}

impl Walked {
    /// The bytes it holds (for the cache's bound).
    pub fn bytes(&self) -> usize {
        self.list
            .1
            .iter()
            .map(|(_, members)| {
                members
                    .as_ref()
                    .map_or(0, |m| m.iter().map(|(k, _)| k.len() + 40).sum::<usize>())
                    + 48
            })
            .sum()
    }
}

/// What one walk of a result found.
#[derive(Debug)]
pub enum Scanned {
    Structured(Walked),
    /// The list is not in structuredContent: the text blocks are looked at.
    Text {
        structured: Option<Range<usize>>,
        blocks: Vec<raw::ElementMembers>,
    },
}

impl Scanned {
    /// The bytes it holds (for the cache's bound).
    pub fn bytes(&self) -> usize {
        match self {
            Scanned::Structured(walked) => walked.bytes(),
            Scanned::Text { blocks, .. } => blocks.len() * 128,
        }
    }
}

/// The walk of a result for an items rule's list: `None` for a result the whole pipeline must
/// read. It does not depend on the call's arguments: a cached result keeps it, and its later
/// pages skip it ([`reduce_scanned`]).
pub fn walk(items: &Items, result: &str) -> Option<Scanned> {
    scan(items, result)
}

fn scan(items: &Items, result: &str) -> Option<Scanned> {
    if items.nested.is_some() {
        return None;
    }
    let steps = plain_path(&items.path_text)?;
    // One walk over the result: down structuredContent to the list (its items read with their
    // members on the way), the content blocks with their members, isError; the rest skipped.
    // A member named twice counts as the last one, as a parser reads it.
    let mut structured = None;
    let mut list: Option<List> = None;
    let mut blocks: Option<Option<Vec<raw::ElementMembers>>> = None;
    let mut is_error = None;
    let start = raw::skip_ws(result, 0);
    let end = raw::walk_object(result, start, |key, at| match key.as_str() {
        "structuredContent" => {
            let (end, found) = find_list(result, at, &steps)?;
            structured = Some(at..end);
            list = found;
            Some(end)
        }
        "content" if result.as_bytes().get(at) == Some(&b'[') => {
            let (elements, end) = raw::elements_with_members_at(result, at)?;
            blocks = Some(Some(elements));
            Some(end)
        }
        "content" => {
            blocks = Some(None);
            raw::value_end(result, at)
        }
        "isError" => {
            let end = raw::value_end(result, at)?;
            is_error = Some(at..end);
            Some(end)
        }
        _ => raw::value_end(result, at),
    })?;
    if !raw::trim_json(&result[end..]).is_empty() {
        return None;
    }
    if is_error.is_some_and(|range| &result[range] != "false") {
        return None;
    }
    let blocks = match blocks {
        Some(Some(blocks)) => blocks,
        // A content that is not a list of blocks: the whole pipeline.
        Some(None) => return None,
        None => Vec::new(),
    };
    match (structured, list) {
        (Some(structured), Some(list)) => {
            let copy = the_copy(result, blocks, &result[structured.clone()])?;
            Some(Scanned::Structured(Walked {
                structured,
                list,
                copy,
            }))
        }
        (structured, None) => Some(Scanned::Text { structured, blocks }),
        (None, Some(_)) => None,
    }
}

/// The list is in structuredContent: it is cut down there, and in the text block that copied
/// structuredContent exactly, the copy is written again for the smaller one. `walked` is the
/// walk of this `result`.
pub fn reduce_walked(
    items: &Items,
    args: &CallArgs,
    result: &str,
    walked: &Walked,
) -> Option<Reduced> {
    let Walked {
        structured,
        list: (list, elements),
        copy,
    } = walked;
    let (kept, narrowed) = narrow_and_page(items, args, result, elements)?;
    let structured_text = format!(
        "{}{kept}{}",
        &result[structured.start..list.start],
        &result[list.end..structured.end]
    );
    let mut cuts = Vec::new();
    if let Some(literal) = copy {
        cuts.push((
            literal.clone(),
            serde_json::to_string(&structured_text).ok()?,
        ));
    }
    cuts.push((structured.clone(), structured_text));
    Some(Reduced {
        text: splice(result, cuts)?,
        narrowed,
    })
}

/// The list is in the JSON of a text block (the first one that looks like JSON): it is cut
/// down there, and in the field of structuredContent that repeats that text, if one does.
fn in_text(
    items: &Items,
    args: &CallArgs,
    result: &str,
    structured: Option<Range<usize>>,
    blocks: Vec<raw::ElementMembers>,
    steps: &[&str],
) -> Option<Reduced> {
    // The first text block that looks like JSON; the list must be in it (the whole pipeline
    // would try the next ones).
    let mut found = None;
    for literal in text_literals(result, blocks)? {
        let text: String = serde_json::from_str(&result[literal.clone()]).ok()?;
        if super::place::looks_like_json(&text) {
            found = Some((literal, text));
            break;
        }
    }
    let (literal, text) = found?;
    let start = raw::skip_ws(&text, 0);
    let (end, list) = find_list(&text, start, steps)?;
    if !raw::trim_json(&text[end..]).is_empty() {
        return None;
    }
    let (list, elements) = list?;
    let (kept, narrowed) = narrow_and_page(items, args, &text, &elements)?;
    let smaller = format!("{}{kept}{}", &text[..list.start], &text[list.end..]);
    // The pipeline must find the list in this block again: the smaller text must parse (a text
    // the walk read but a parser refuses would send it to another block).
    serde_json::from_str::<serde::de::IgnoredAny>(&smaller).ok()?;
    let encoded = serde_json::to_string(&smaller).ok()?;
    let mut cuts = Vec::new();
    // The field of structuredContent that repeats the text (the first, as the pipeline finds
    // it) is cut down with it, so that the pipeline finds it again: a JSON page updates it, a
    // table replaces structuredContent.
    if let Some(structured) = structured
        && result.as_bytes().get(structured.start) == Some(&b'{')
    {
        let members = raw::members(&result[structured.clone()])?;
        let names: std::collections::HashSet<&str> =
            members.iter().map(|(key, _)| key.as_str()).collect();
        if names.len() != members.len() {
            return None;
        }
        // Each string field that could equal the text or the smaller one is read: the first
        // equal to the text is the mirror; another equal to the smaller text would be taken
        // for it by the pipeline.
        let mut mirror = None;
        for (_, at) in &members {
            let value = &result[offset(at.clone(), structured.start)];
            if !value.starts_with('"') || value.len() < smaller.len().min(text.len()) {
                continue;
            }
            let Ok(value) = serde_json::from_str::<String>(value) else {
                continue;
            };
            if value == text && mirror.is_none() {
                mirror = Some(offset(at.clone(), structured.start));
            } else if value == smaller {
                return None;
            }
        }
        if let Some(at) = mirror {
            cuts.push((at, encoded.clone()));
        }
    }
    cuts.push((literal, encoded));
    Some(Reduced {
        text: splice(result, cuts)?,
        narrowed,
    })
}

/// Each item read for the fields the narrowing needs; the horizon, the filters and the page
/// run on those; the page's items as the server wrote them (a JSON array), and what the whole
/// list gave. `text` holds the elements.
fn narrow_and_page(
    items: &Items,
    args: &CallArgs,
    text: &str,
    elements: &[raw::ElementMembers],
) -> Option<(String, Narrowed)> {
    let fields = wanted(items, args);
    let mut ranges = Vec::with_capacity(elements.len());
    let mut partial = Vec::with_capacity(elements.len());
    for (n, (range, members)) in elements.iter().enumerate() {
        let element = &text[range.clone()];
        let mut map = Map::new();
        for (key, at) in members.as_ref()? {
            if fields.contains(key) {
                map.insert(
                    key.clone(),
                    serde_json::from_str(&element[at.clone()]).ok()?,
                );
            }
        }
        map.insert(INDEX.into(), Value::from(n));
        partial.push(Value::Object(map));
        ranges.push(range.clone());
    }
    let total_count = partial.len();
    let horizon_dropped = pipeline::narrow(&mut partial, items, args, None);
    let matching = partial.len();
    let page = page::apply(partial, args.after.as_ref(), args.limit, items.key.as_ref());
    let mut kept = String::from("[");
    for (n, item) in page.items.iter().enumerate() {
        let index = item.get(INDEX).and_then(Value::as_u64)? as usize;
        if n > 0 {
            kept.push(',');
        }
        kept.push_str(&text[ranges.get(index)?.clone()]);
    }
    kept.push(']');
    let narrowed = Narrowed {
        total_count,
        horizon_dropped,
        matching,
        skipped: page.start,
        next: page.next,
    };
    Some((kept, narrowed))
}

/// `text` with each range replaced (ranges that do not overlap).
fn splice(text: &str, mut cuts: Vec<(Range<usize>, String)>) -> Option<String> {
    cuts.sort_by_key(|(range, _)| range.start);
    let mut out =
        String::with_capacity(cuts.iter().map(|(_, with)| with.len()).sum::<usize>() + 4096);
    let mut at = 0;
    for (range, with) in cuts {
        out.push_str(text.get(at..range.start)?);
        out.push_str(&with);
        at = range.end;
    }
    out.push_str(text.get(at..)?);
    Some(out)
}

/// The range (in `result`) of the text literal that copies `structured` exactly, when there
/// is one; `Some(None)` when no text block does; `None` when the result must go to the whole
/// pipeline: a text block before the copy looks like JSON (the page would go there, and the
/// copy would stay whole), there are two copies, a long text block is not the copy, or a
/// block names its type or text twice.
fn the_copy(
    result: &str,
    blocks: Vec<raw::ElementMembers>,
    structured: &str,
) -> Option<Option<Range<usize>>> {
    let mut copy = None;
    for at in text_literals(result, blocks)? {
        let literal = &result[at.clone()];
        if exact::encodes(literal, structured) {
            if copy.is_some() {
                return None;
            }
            copy = Some(at);
            continue;
        }
        if literal.len() > MAX_OTHER_TEXT {
            return None;
        }
        let text: String = serde_json::from_str(literal).ok()?;
        if copy.is_none() && super::place::looks_like_json(&text) {
            return None;
        }
    }
    Some(copy)
}

/// The text of each content block whose type is "text" and whose text is a string, as the
/// pipeline's `place::text_blocks` sees them: the ranges of the string literals in `result`, in
/// order; `None` when a block names its type or text twice.
fn text_literals(result: &str, blocks: Vec<raw::ElementMembers>) -> Option<Vec<Range<usize>>> {
    let mut out = Vec::new();
    for (range, members) in blocks {
        let Some(members) = members else { continue };
        let twice = |name: &str| members.iter().filter(|(key, _)| key == name).count() > 1;
        if twice("type") || twice("text") {
            return None;
        }
        let block = &result[range.clone()];
        let is_text = last(&members, "type")
            .and_then(|at| serde_json::from_str::<String>(&block[at]).ok())
            .is_some_and(|kind| kind == "text");
        let Some(at) = last(&members, "text").filter(|_| is_text) else {
            continue;
        };
        if block[at.clone()].starts_with('"') {
            out.push(offset(at, range.start));
        }
    }
    Some(out)
}

/// A list found in a result: its range, and its elements with their members.
type List = (Range<usize>, Vec<raw::ElementMembers>);

/// Follows `steps` (keys) from the value at `at`: where that value ends, and the list at the
/// end of the path when the path leads to one (the last of a key named twice, as a parser
/// reads it).
fn find_list(text: &str, at: usize, steps: &[&str]) -> Option<(usize, Option<List>)> {
    let first = text.as_bytes().get(at);
    match steps.split_first() {
        None if first == Some(&b'[') => {
            let (elements, end) = raw::elements_with_members_at(text, at)?;
            Some((end, Some((at..end, elements))))
        }
        Some((step, rest)) if first == Some(&b'{') => {
            let mut found = None;
            let end = raw::walk_object(text, at, |key, at| {
                if key == *step {
                    let (end, inner) = find_list(text, at, rest)?;
                    found = inner;
                    Some(end)
                } else {
                    raw::value_end(text, at)
                }
            })?;
            Some((end, found))
        }
        _ => Some((raw::value_end(text, at)?, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_paths_are_followed() {
        assert_eq!(plain_path("$"), Some(vec![]));
        assert_eq!(plain_path("$.streams"), Some(vec!["streams"]));
        assert_eq!(plain_path("$.data.rows_2"), Some(vec!["data", "rows_2"]));
        for other in ["$..x", "$.a[*]", "$['a']", "$.a.", "x", "$.a b"] {
            assert_eq!(plain_path(other), None, "{other}");
        }
    }
}
