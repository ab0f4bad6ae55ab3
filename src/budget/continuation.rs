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

/// `"mcp-budget/continuation":{next_after, total_count, notice, result_ref}`, a member to put
/// in `_meta`.
pub(super) fn continuation(
    cursor: Option<&str>,
    total_count: usize,
    notice: &str,
    reference: Option<&str>,
) -> String {
    let mut fields = fields(cursor, total_count, notice);
    if let Some(reference) = reference {
        fields.insert("result_ref".into(), reference.into());
    }
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
    reference: Option<&str>,
) -> String {
    let trimmed = doc.trim_end();
    let Some(body) = trimmed.strip_suffix('}') else {
        return doc.to_string();
    };
    let existing = raw::members(doc).unwrap_or_default();
    let separated = !existing.is_empty();
    let addition =
        continuation_members(&existing, cursor, total_count, notice, reference, separated);
    format!("{body}{addition}}}")
}

/// The continuation's fields: `next_after`, `total_count` and `notice`.
fn fields(
    cursor: Option<&str>,
    total_count: usize,
    notice: &str,
) -> serde_json::Map<String, serde_json::Value> {
    let mut fields = serde_json::Map::new();
    if let Some(cursor) = cursor {
        fields.insert("next_after".into(), cursor.into());
    }
    fields.insert("total_count".into(), total_count.into());
    fields.insert("notice".into(), notice.into());
    fields
}

/// The continuation as members to add at the end of an object whose members are `existing`
/// (`separated`: a comma goes first): `next_after`, `total_count` and `notice`, or, where the
/// object already has one of those names, the same inside a `mcp_budget` object of the proxy's
/// own (never a duplicate key). A result reference goes in the `mcp_budget` object always: the
/// output schemas the proxy extends declare it (an object), so a schema closed to other
/// properties still holds, and no descriptor grows for references.
pub fn continuation_members(
    existing: &[(String, Range<usize>)],
    cursor: Option<&str>,
    total_count: usize,
    notice: &str,
    reference: Option<&str>,
    separated: bool,
) -> String {
    let taken = |name: &str| existing.iter().any(|(k, _)| k == name);
    let mut fields = fields(cursor, total_count, notice);
    let reference = reference.filter(|_| !taken("mcp_budget"));
    let addition = if fields.keys().any(|k| taken(k)) {
        if let Some(reference) = reference {
            fields.insert("result_ref".into(), reference.into());
        }
        format!("\"mcp_budget\":{}", serde_json::Value::Object(fields))
    } else {
        let text = serde_json::Value::Object(fields).to_string();
        let mut members = text[1..text.len() - 1].to_string();
        if let Some(reference) = reference {
            members.push_str(&format!(
                ",\"mcp_budget\":{}",
                serde_json::json!({"result_ref": reference})
            ));
        }
        members
    };
    let separator = if separated { "," } else { "" };
    format!("{separator}{addition}")
}
