//! Reading a field path (`last_gate.verdict`) out of an item, and comparing field values.

use serde_json::Value;

use crate::policy::FieldPath;

/// The value at `path` inside `item`, if every step exists.
pub fn get<'a>(item: &'a Value, path: &FieldPath) -> Option<&'a Value> {
    path.iter().try_fold(item, |node, step| node.get(step))
}

/// A field value as the text a person would compare it by: strings without quotes, other
/// values as compact JSON.
pub fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Whether `value` equals `wanted` as text (so a filter "7" matches the number 7).
pub fn matches(value: &Value, wanted: &str) -> bool {
    match value {
        Value::String(s) => s == wanted,
        other => {
            let text = other.to_string();
            text == wanted
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nested_get_and_text() {
        let item = json!({"a": {"b": 3}, "s": "x"});
        assert_eq!(get(&item, &vec!["a".into(), "b".into()]), Some(&json!(3)));
        assert_eq!(get(&item, &vec!["a".into(), "c".into()]), None);
        assert_eq!(text(&json!("x")), "x");
        assert_eq!(text(&json!(3)), "3");
        assert!(matches(&json!(7), "7"));
        assert!(!matches(&json!("7 "), "7"));
    }
}
