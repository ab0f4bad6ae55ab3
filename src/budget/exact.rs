//! The server's own bytes for everything the budget kept.
//!
//! The items pipeline works on parsed values, and writing a value out again re-spells it:
//! `"\u00e9"` becomes `"é"`, `1e3` may gain a sign in its exponent. So a page is written, then
//! walked side by side with the server's original text, and every value that the budget did not
//! change is replaced by the original's bytes: objects member by member, lists as the
//! subsequence the page keeps (paging and filters keep the order), strings that hold JSON by the
//! JSON inside them. What the budget added (the continuation, a projection's missing fields) is
//! written by serde_json.

use serde_json::Value;

use super::raw;

/// `page` written out, with the spelling of `original` (the server's text of the value the
/// page was made from) wherever a value is unchanged.
pub fn respell(page: &Value, original: &str) -> String {
    let mut out = String::with_capacity(original.len().min(1 << 20));
    write(page, original.trim(), &mut out);
    out
}

/// [`respell`] for a whole tool result, with one shortcut: a text block that is the JSON of
/// `structuredContent` (on the page and in the original) is written as the respelled
/// structuredContent, instead of being decoded and walked a second time.
pub fn respell_result(page: &Value, original: &str) -> String {
    let (Value::Object(map), Some(members)) = (page, raw::members(original)) else {
        return respell(page, original);
    };
    let find = |name: &str| {
        members
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, r)| original[r.clone()].trim())
    };
    let structured = match (map.get("structuredContent"), find("structuredContent")) {
        (Some(value), Some(text)) => Some((value, text, respell(value, text))),
        _ => None,
    };
    let mut out = String::with_capacity(original.len().min(1 << 20));
    object(
        map,
        original,
        &members,
        &mut out,
        |key, value, text, out| match (key, text, &structured) {
            ("structuredContent", Some(_), Some((_, _, respelled))) => out.push_str(respelled),
            ("content", Some(blocks), Some((value_sc, text_sc, respelled))) => {
                content(value, blocks, value_sc, text_sc, respelled, out)
            }
            _ => plain(value, text, out),
        },
    );
    out
}

/// The content blocks, a text copy of structuredContent written from its respelled form.
fn content(
    page: &Value,
    original: &str,
    structured: &Value,
    structured_text: &str,
    respelled: &str,
    out: &mut String,
) {
    // One reading of the blocks gives each one's members: the text copy is skipped once.
    let (Value::Array(blocks), Some(elements)) = (page, raw::elements_with_members(original))
    else {
        return write(page, original, out);
    };
    let page_copy = structured.to_string();
    out.push('[');
    for (n, block) in blocks.iter().enumerate() {
        if n > 0 {
            out.push(',');
        }
        let (element, members) = match elements.get(n) {
            Some((range, members)) => (Some(&original[range.clone()]), members.as_deref()),
            None => (None, None),
        };
        let members = members.unwrap_or_default();
        let copies = block.get("text").and_then(Value::as_str) == Some(page_copy.as_str())
            && element.is_some_and(|element| {
                // The block's text is its last "text" member, as a parser reads it.
                members
                    .iter()
                    .rev()
                    .find(|(k, _)| k == "text")
                    .is_some_and(|(_, r)| encodes(&element[r.clone()], structured_text))
            });
        match (copies, element, block) {
            (true, Some(element), Value::Object(map)) => {
                object(map, element, members, out, |key, value, text, out| {
                    if key == "text" {
                        out.push_str(&Value::from(respelled).to_string());
                    } else {
                        plain(value, text, out);
                    }
                });
            }
            (_, Some(element), _) => write(block, element, out),
            (_, None, _) => own(block, out),
        }
    }
    out.push(']');
}

/// Whether `literal` is `text` written as a JSON string the way serde_json writes one
/// (compared as it goes, without writing it).
pub(super) fn encodes(literal: &str, text: &str) -> bool {
    let Some(inner) = literal.strip_prefix('"').and_then(|l| l.strip_suffix('"')) else {
        return false;
    };
    let mut rest = inner.as_bytes();
    let mut plain = 0;
    let bytes = text.as_bytes();
    let mut buffer: [u8; 6];
    for (i, &b) in bytes.iter().enumerate() {
        let escaped: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                buffer = [
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[(b >> 4) as usize],
                    HEX[(b & 15) as usize],
                ];
                &buffer
            }
            _ => continue,
        };
        // The plain run before this byte, then its escape.
        let run = &bytes[plain..i];
        if !rest.starts_with(run) {
            return false;
        }
        rest = &rest[run.len()..];
        if !rest.starts_with(escaped) {
            return false;
        }
        rest = &rest[escaped.len()..];
        plain = i + 1;
    }
    rest == &bytes[plain..]
}

/// Writes the object `map` against its original's `members` (ranges in `original`): each
/// member as `member` writes it, which gets the member's original text when there is one.
fn object(
    map: &serde_json::Map<String, Value>,
    original: &str,
    members: &[(String, std::ops::Range<usize>)],
    out: &mut String,
    mut member: impl FnMut(&str, &Value, Option<&str>, &mut String),
) {
    out.push('{');
    for (n, (key, value)) in map.iter().enumerate() {
        if n > 0 {
            out.push(',');
        }
        out.push_str(&Value::from(key.as_str()).to_string());
        out.push(':');
        let text = members
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, range)| original[range.clone()].trim());
        member(key, value, text, out);
    }
    out.push('}');
}

/// A member written against its original text, or by serde_json when it has none.
fn plain(value: &Value, text: Option<&str>, out: &mut String) {
    match text {
        Some(text) => write(value, text, out),
        None => own(value, out),
    }
}

fn own(value: &Value, out: &mut String) {
    out.push_str(&value.to_string());
}

/// A cheap necessary condition for the element `text` to be, or hold, `item`: when the item is
/// an object whose first member is a string or a number, the element has that member with that
/// value (only that member is parsed).
fn may_match(text: &str, item: &Value) -> bool {
    let Value::Object(map) = item else {
        return true;
    };
    let Some((key, value)) = map.iter().next() else {
        return true;
    };
    if !(value.is_string() || value.is_number()) || !text.starts_with('{') {
        return true;
    }
    let Some(members) = raw::members(text) else {
        return true;
    };
    members
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .is_some_and(|(_, range)| {
            serde_json::from_str::<Value>(text[range.clone()].trim()).is_ok_and(|v| &v == value)
        })
}

/// Whether `text` is the JSON of `value` (parsing it).
fn same(value: &Value, text: &str) -> bool {
    serde_json::from_str::<Value>(text).is_ok_and(|parsed| &parsed == value)
}

fn write(page: &Value, original: &str, out: &mut String) {
    match page {
        Value::Object(map) if original.starts_with('{') => {
            let Some(members) = raw::members(original) else {
                return own(page, out);
            };
            object(map, original, &members, out, |_, value, text, out| {
                plain(value, text, out)
            });
        }
        Value::Array(items) if original.starts_with('[') => {
            out.push('[');
            // The page's items are a subsequence of the original's, in order: each is matched
            // to the next original element equal to it (or, for a projected item, holding it).
            // The original is read only as far as the page needs.
            let mut elements: Vec<std::ops::Range<usize>> = Vec::new();
            let mut pending = 0;
            let mut placed: Vec<Option<(std::ops::Range<usize>, bool)>> = vec![None; items.len()];
            raw::elements_while(original, |element| {
                elements.push(element.clone());
                if pending >= items.len() {
                    return false;
                }
                let text = original[element.clone()].trim();
                // Most elements are not the next item (horizon and filters drop them): a look
                // at one member tells, before the whole element is parsed.
                let candidates = pending..items.len().min(pending + 8);
                if !items[candidates].iter().any(|item| may_match(text, item)) {
                    return pending < items.len();
                }
                if let Ok(parsed) = serde_json::from_str::<Value>(text) {
                    // The next item, or one a little further (the items between changed).
                    for n in pending..items.len().min(pending + 8) {
                        let exact = parsed == items[n];
                        if exact || holds(&parsed, &items[n]) {
                            placed[n] = Some((element, exact));
                            pending = n + 1;
                            break;
                        }
                    }
                }
                pending < items.len()
            });
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                match &placed[n] {
                    Some((range, true)) => out.push_str(original[range.clone()].trim()),
                    Some((range, false)) => write(item, original[range.clone()].trim(), out),
                    // A changed item (a content block whose text was paged): the element in
                    // its place, if any. Safe whatever it is: a leaf keeps the original's
                    // spelling only where its value is the page's.
                    None => match elements.get(n) {
                        Some(element) => write(item, original[element.clone()].trim(), out),
                        None => own(item, out),
                    },
                }
            }
            out.push(']');
        }
        Value::String(text) if original.starts_with('"') => {
            let Ok(decoded) = serde_json::from_str::<String>(original) else {
                return own(page, out);
            };
            if &decoded == text {
                out.push_str(original);
                return;
            }
            // A text that holds JSON (the text copy of a structured result): respell inside.
            let looks = |t: &str| matches!(t.trim_start().as_bytes().first(), Some(b'{' | b'['));
            if looks(text)
                && looks(&decoded)
                && let Ok(inner) = serde_json::from_str::<Value>(text)
            {
                out.push_str(&Value::String(respell(&inner, &decoded)).to_string());
                return;
            }
            own(page, out);
        }
        scalar => {
            if same(scalar, original) {
                out.push_str(original);
            } else {
                own(scalar, out);
            }
        }
    }
}

/// Whether `item` is `element` with some of its fields left out (a projection).
fn holds(element: &Value, item: &Value) -> bool {
    match (element, item) {
        (Value::Object(whole), Value::Object(part)) => {
            !part.is_empty()
                && part
                    .iter()
                    .all(|(k, v)| whole.get(k).is_some_and(|w| w == v || holds(w, v)))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unchanged_values_keep_their_bytes_and_additions_are_written() {
        let original = r#"{"total": 1e3, "items": [{"a": "\u00e9\/", "n": 1.50}, {"a": "x", "n": -0}, {"a": "y", "n": 2}], "x-extra": [1E+2]}"#;
        let mut page: Value = serde_json::from_str(original).unwrap();
        page["items"].as_array_mut().unwrap().remove(1);
        page["next_after"] = Value::from("CUR");
        let out = respell(&page, original);
        assert_eq!(
            out,
            r#"{"total":1e3,"items":[{"a": "\u00e9\/", "n": 1.50},{"a": "y", "n": 2}],"x-extra":[1E+2],"next_after":"CUR"}"#
        );
        // A projection keeps the kept fields' bytes.
        let projected: Value = serde_json::json!({"items": [{"a": "é/"}]});
        assert_eq!(
            respell(&projected, original),
            r#"{"items":[{"a":"\u00e9\/"}]}"#
        );
    }

    #[test]
    fn encodes_matches_serde_json_exactly() {
        for text in [
            "",
            "plain",
            "a\"b\\c\nd\te\u{1}f\u{1f}é/",
            "{\"k\":[1,2]}\n",
        ] {
            let literal = Value::from(text).to_string();
            assert!(encodes(&literal, text), "{literal}");
            assert!(!encodes(&literal, &format!("{text}x")));
        }
        assert!(
            !encodes(r#""\u00e9""#, "é"),
            "another spelling is not serde_json's"
        );
    }

    #[test]
    fn json_inside_a_string_is_respelled_too() {
        let doc = r#"{"v":[1e3,2.50]}"#;
        let original = Value::String(doc.to_string()).to_string();
        let page = Value::String(r#"{"v":[2.50]}"#.to_string());
        assert_eq!(
            respell(&page, &original),
            Value::String(r#"{"v":[2.50]}"#.to_string()).to_string()
        );
        let page: Value = serde_json::from_str(doc).unwrap();
        let text = Value::String(page.to_string());
        assert_eq!(respell(&text, &original), original);
    }
}
