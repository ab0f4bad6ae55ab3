//! The continuation an automatic page carries: the document cut to a page's elements, and the
//! notice and cursor written into it or beside it.

use std::ops::Range;

use super::raw::{self, FoundArray};

/// `doc` with its array cut to elements `from..to` (the server's own bytes, and its own
/// separators between them).
pub(super) fn cut(doc: &str, array: &FoundArray, from: usize, to: usize) -> String {
    let mut out = String::with_capacity(doc.len().min(1 << 20));
    out.push_str(&doc[..array.span.start]);
    out.push(if array.object { '{' } else { '[' });
    if from < to && to <= array.elements.len() {
        out.push_str(&doc[array.elements[from].start..array.elements[to - 1].end]);
    }
    out.push(if array.object { '}' } else { ']' });
    out.push_str(&doc[array.span.end..]);
    out
}

/// The `_meta` key under which a page whose structuredContent is an array carries its
/// continuation.
pub const META_CONTINUATION: &str = "mcp-budget/continuation";

/// `"mcp-budget/continuation":{next_after, total_count, notice}`, a member to put in `_meta`.
pub(super) fn continuation(cursor: Option<&str>, total_count: usize, notice: &str) -> String {
    let mut fields = serde_json::Map::new();
    if let Some(cursor) = cursor {
        fields.insert("next_after".into(), cursor.into());
    }
    fields.insert("total_count".into(), total_count.into());
    fields.insert("notice".into(), notice.into());
    format!(
        "{}:{}",
        serde_json::Value::from(META_CONTINUATION),
        serde_json::Value::Object(fields)
    )
}

/// The structured document with the continuation added at its end.
pub(super) fn decorate(
    doc: &str,
    cursor: Option<&str>,
    total_count: usize,
    notice: &str,
) -> String {
    let trimmed = doc.trim_end();
    let Some(body) = trimmed.strip_suffix('}') else {
        return doc.to_string();
    };
    let existing = raw::members(doc).unwrap_or_default();
    let addition =
        continuation_members(&existing, cursor, total_count, notice, !existing.is_empty());
    format!("{body}{addition}}}")
}

/// The continuation as members to add at the end of an object whose members are `existing`
/// (`separated`: a comma goes first): `next_after`, `total_count` and `notice`, or, where the
/// object already has one of those names, the same inside a `mcp_budget` object of the proxy's
/// own (never a duplicate key).
pub fn continuation_members(
    existing: &[(String, Range<usize>)],
    cursor: Option<&str>,
    total_count: usize,
    notice: &str,
    separated: bool,
) -> String {
    let taken = |name: &str| existing.iter().any(|(k, _)| k == name);
    let mut fields = serde_json::Map::new();
    if let Some(cursor) = cursor {
        fields.insert("next_after".into(), cursor.into());
    }
    fields.insert("total_count".into(), total_count.into());
    fields.insert("notice".into(), notice.into());
    let addition = if fields.keys().any(|k| taken(k)) {
        format!("\"mcp_budget\":{}", serde_json::Value::Object(fields))
    } else {
        let text = serde_json::Value::Object(fields).to_string();
        text[1..text.len() - 1].to_string()
    };
    let separator = if separated { "," } else { "" };
    format!("{separator}{addition}")
}
