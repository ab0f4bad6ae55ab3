//! Where a result's items live, and putting the rendered page back in their place:
//! `structuredContent`, the JSON in a text block, or one text block per item.

use jsonpath_rust::query::js_path_process;
use serde_json::{Value, json};

use crate::policy::Items;

/// Where the item list of a result was found.
pub enum Source {
    Structured,
    /// The index of the text content block holding the JSON.
    Text(usize),
    /// Several text blocks, one JSON object each: the items themselves.
    Blocks(Vec<usize>),
}

pub fn looks_like_json(text: &str) -> bool {
    matches!(text.trim_start().as_bytes().first(), Some(b'{' | b'['))
}

pub fn text_blocks(result: &Value) -> impl Iterator<Item = (usize, &str)> {
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
pub fn first_list_path(document: &Value, items: &Items) -> Option<String> {
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
pub fn locate(result: &mut Value, items: &Items) -> Option<(Source, Value)> {
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

/// The field of `structuredContent` that repeats text block `index` (server-filesystem sends
/// `{"content": <the text>}`), so that a page can update both copies together.
pub fn mirror_field(result: &Value, index: usize) -> Option<String> {
    let text = result.get("content")?.get(index)?.get("text")?.as_str()?;
    result
        .get("structuredContent")?
        .as_object()?
        .iter()
        .find(|(_, value)| value.as_str() == Some(text))
        .map(|(key, _)| key.clone())
}

pub fn restore(result: &mut Value, source: Source, document: Value) {
    if let Source::Structured = source {
        result["structuredContent"] = document;
    }
}

/// Removes the item blocks; returns where they began.
pub fn remove_blocks(result: &mut Value, indices: &[usize]) -> usize {
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

pub fn content_mut(result: &mut Value) -> Option<&mut Vec<Value>> {
    result.get_mut("content").and_then(Value::as_array_mut)
}

/// Puts the JSON envelope where the items came from, and in the JSON text block.
pub fn put_json(result: &mut Value, source: Source, envelope: Value) {
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
pub fn put_table(
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
