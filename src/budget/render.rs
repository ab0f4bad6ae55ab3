//! Stage: rendering. `json` is upstream's own object with the item list replaced by the page,
//! plus `total_count`, `next_after` (only when more items remain) and `notices`; `csv`/`tsv`
//! are a header and rows of the policy's columns, with the continuation in a separate short
//! text so that a table can never be mistaken for the complete set.

use serde_json::{Map, Value, json};

use super::field;
use crate::policy::FieldPath;

/// A budgeted result could not be written out (a bug, never the server's doing): the call gets a
/// JSON-RPC error that says so, never an empty or cut result.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("the budgeted result could not be serialized: {0}")]
    Json(#[from] serde_json::Error),
    #[error("the budgeted table could not be written: {0}")]
    Table(String),
}

/// What a page says about the list it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continuation {
    /// Items upstream returned, before any narrowing.
    pub total_count: usize,
    /// Items left after horizon and filters.
    pub matching: usize,
    /// Items before this page (of the matching ones).
    pub skipped: usize,
    pub next_after: Option<String>,
    pub notices: Vec<String>,
    /// The whole result's reference, on a page cut from it.
    pub result_ref: Option<String>,
}

/// Adds the continuation fields to an envelope object (the reference in a `mcp_budget`
/// object of the proxy's own, which the rule's output schema declares).
pub fn decorate(envelope: &mut Map<String, Value>, continuation: &Continuation) {
    envelope.insert("total_count".into(), json!(continuation.total_count));
    if let Some(next) = &continuation.next_after {
        envelope.insert("next_after".into(), json!(next));
    }
    if !continuation.notices.is_empty() {
        envelope.insert("notices".into(), json!(continuation.notices));
    }
    if let Some(reference) = &continuation.result_ref
        && !envelope.contains_key("mcp_budget")
    {
        envelope.insert("mcp_budget".into(), json!({"result_ref": reference}));
    }
}

/// A csv/tsv table of `columns` for `page`.
pub fn table(page: &[Value], columns: &[FieldPath], delimiter: u8) -> Result<String, RenderError> {
    let failed = |e: &dyn std::fmt::Display| RenderError::Table(e.to_string());
    let mut writer = csv::WriterBuilder::new()
        .delimiter(delimiter)
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new());
    let header: Vec<String> = columns.iter().map(|c| c.join(".")).collect();
    writer.write_record(&header).map_err(|e| failed(&e))?;
    for item in page {
        let row: Vec<String> = columns
            .iter()
            .map(|c| match field::get(item, c) {
                None | Some(Value::Null) => String::new(),
                Some(value) => field::text(value),
            })
            .collect();
        writer.write_record(&row).map_err(|e| failed(&e))?;
    }
    let bytes = writer.into_inner().map_err(|e| failed(&e))?;
    String::from_utf8(bytes).map_err(|e| failed(&e))
}

/// The short text that follows a table: what part of the list it is and how to go on.
pub fn table_continuation(c: &Continuation, returned: usize, tool: &str, noun: &str) -> String {
    let first = c.skipped + usize::from(returned > 0);
    let last = c.skipped + returned;
    let mut text = format!(
        "Rows {first}-{last} of {} matching {noun} (total_count {}: what the server returned before the horizon and filters).",
        c.matching, c.total_count
    );
    match &c.next_after {
        Some(next) => text.push_str(&format!(
            " More remain: call {tool} again with after:\"{next}\" and the same other arguments for the next page."
        )),
        None => text.push_str(" This is the last page."),
    }
    for notice in &c.notices {
        text.push('\n');
        text.push_str(notice);
    }
    text
}

/// The structured form of a table page: its columns and rows (each cell the item's value,
/// `null` where it has none), and the continuation — a client that reads only
/// `structuredContent` gets the same rows as the table.
pub fn table_structured(
    c: &Continuation,
    page: &[Value],
    columns: &[FieldPath],
    format: &str,
) -> Value {
    let mut map = Map::new();
    map.insert("format".into(), json!(format));
    map.insert("returned".into(), json!(page.len()));
    map.insert(
        "columns".into(),
        json!(columns.iter().map(|c| c.join(".")).collect::<Vec<_>>()),
    );
    let rows: Vec<Value> = page
        .iter()
        .map(|item| {
            Value::Array(
                columns
                    .iter()
                    .map(|c| field::get(item, c).cloned().unwrap_or(Value::Null))
                    .collect(),
            )
        })
        .collect();
    map.insert("rows".into(), Value::Array(rows));
    decorate(&mut map, c);
    Value::Object(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols(list: &[&str]) -> Vec<FieldPath> {
        list.iter()
            .map(|p| p.split('.').map(String::from).collect())
            .collect()
    }

    #[test]
    fn csv_and_tsv_tables_quote_what_needs_quoting() {
        let page = vec![
            json!({"id": "a", "gate": {"verdict": "pass"}, "n": 3, "t": "x, \"y\""}),
            json!({"id": "b", "t": null}),
        ];
        assert_eq!(
            table(&page, &cols(&["id", "gate.verdict", "n", "t"]), b',').unwrap(),
            "id,gate.verdict,n,t\na,pass,3,\"x, \"\"y\"\"\"\nb,,,\n"
        );
        assert_eq!(
            table(&page, &cols(&["id", "n"]), b'\t').unwrap(),
            "id\tn\na\t3\nb\t\n"
        );
    }

    #[test]
    fn continuation_texts() {
        let c = Continuation {
            total_count: 240,
            matching: 84,
            skipped: 25,
            next_after: Some("CUR".into()),
            notices: vec!["N1".into()],
            result_ref: None,
        };
        assert_eq!(
            table_continuation(&c, 25, "fleet_show", "streams"),
            "Rows 26-50 of 84 matching streams (total_count 240: what the server returned before the horizon and filters). More remain: call fleet_show again with after:\"CUR\" and the same other arguments for the next page.\nN1"
        );
        let last = Continuation {
            next_after: None,
            notices: vec![],
            ..c
        };
        assert_eq!(
            table_continuation(&last, 9, "t", "items"),
            "Rows 26-34 of 84 matching items (total_count 240: what the server returned before the horizon and filters). This is the last page."
        );
        let page = vec![json!({"id": "a", "n": 1}), json!({"id": "b"})];
        assert_eq!(
            table_structured(&last, &page, &cols(&["id", "n"]), "csv").to_string(),
            r#"{"format":"csv","returned":2,"columns":["id","n"],"rows":[["a",1],["b",null]],"total_count":240}"#
        );
    }
}
