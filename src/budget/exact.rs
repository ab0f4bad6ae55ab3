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

fn own(value: &Value, out: &mut String) {
    out.push_str(&value.to_string());
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
            out.push('{');
            for (n, (key, value)) in map.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                out.push_str(&Value::from(key.as_str()).to_string());
                out.push(':');
                match members.iter().rev().find(|(k, _)| k == key) {
                    Some((_, range)) => write(value, original[range.clone()].trim(), out),
                    None => own(value, out),
                }
            }
            out.push('}');
        }
        Value::Array(items) if original.starts_with('[') => {
            let Some(elements) = raw::elements(original) else {
                return own(page, out);
            };
            out.push('[');
            // The page's items are a subsequence of the original's, in order: each is matched
            // to the next original element equal to it (or, for a projected item, holding it).
            let mut next = 0;
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                let mut matched = None;
                for (j, element) in elements.iter().enumerate().skip(next) {
                    let text = original[element.clone()].trim();
                    let Ok(parsed) = serde_json::from_str::<Value>(text) else {
                        continue;
                    };
                    if &parsed == item || holds(&parsed, item) {
                        matched = Some((j, text, &parsed == item));
                        break;
                    }
                }
                match matched {
                    Some((j, text, true)) => {
                        out.push_str(text);
                        next = j + 1;
                    }
                    Some((j, text, false)) => {
                        write(item, text, out);
                        next = j + 1;
                    }
                    // A changed item (a content block whose text was paged): the element in
                    // its place, if any. Safe whatever it is: a leaf keeps the original's
                    // spelling only where its value is the page's.
                    None => match elements.get(next) {
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
