//! Stage: the projection. `summary` keeps the fields the policy lists (nested selections
//! allowed: `last_gate.verdict` keeps only that field of `last_gate`); `full` keeps everything.

use serde_json::{Map, Value};

use crate::policy::FieldPath;

/// A selection of fields, as a tree: a leaf keeps the whole field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    All,
    Fields(Vec<(String, Selection)>),
}

impl Selection {
    /// Builds the tree from field paths. A path that selects a whole field wins over paths
    /// into it.
    pub fn from_paths(paths: &[FieldPath]) -> Selection {
        let mut fields: Vec<(String, Selection)> = Vec::new();
        for path in paths {
            let Some((first, rest)) = path.split_first() else {
                return Selection::All;
            };
            let child = Selection::from_paths(&[rest.to_vec()]);
            match fields.iter_mut().find(|(name, _)| name == first) {
                Some((_, existing)) => existing.merge(child),
                None => fields.push((first.clone(), child)),
            }
        }
        Selection::Fields(fields)
    }

    fn merge(&mut self, other: Selection) {
        match (&mut *self, other) {
            (Selection::All, _) => {}
            (_, Selection::All) => *self = Selection::All,
            (Selection::Fields(mine), Selection::Fields(theirs)) => {
                for (name, child) in theirs {
                    match mine.iter_mut().find(|(n, _)| *n == name) {
                        Some((_, existing)) => existing.merge(child),
                        None => mine.push((name, child)),
                    }
                }
            }
        }
    }

    /// The top-level field names (for descriptions).
    pub fn describe(paths: &[FieldPath]) -> String {
        paths
            .iter()
            .map(|p| p.join("."))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Applies a selection to one value. Objects keep the selected fields in their own order;
/// arrays apply the selection to each element; scalars pass.
pub fn apply(value: Value, selection: &Selection) -> Value {
    let Selection::Fields(fields) = selection else {
        return value;
    };
    match value {
        Value::Object(map) => {
            let mut out = Map::with_capacity(fields.len());
            for (name, field) in map {
                if let Some((_, sub)) = fields.iter().find(|(n, _)| *n == name) {
                    out.insert(name, apply(field, sub));
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => {
            Value::Array(items.into_iter().map(|v| apply(v, selection)).collect())
        }
        scalar => scalar,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn paths(list: &[&str]) -> Vec<FieldPath> {
        list.iter()
            .map(|p| p.split('.').map(String::from).collect())
            .collect()
    }

    #[test]
    fn keeps_selected_fields_in_item_order_with_nested_selections() {
        let selection =
            Selection::from_paths(&paths(&["state", "id", "gate.verdict", "gate.at", "live"]));
        let item = json!({
            "id": 1, "prose": "long", "state": "running",
            "gate": {"at": "t", "verdict": "pass", "why": "long"},
            "live": {"a": 1, "b": [1, 2]},
        });
        assert_eq!(
            apply(item, &selection).to_string(),
            r#"{"id":1,"state":"running","gate":{"at":"t","verdict":"pass"},"live":{"a":1,"b":[1,2]}}"#
        );
    }

    #[test]
    fn a_whole_field_wins_over_paths_into_it_and_arrays_are_mapped() {
        let selection = Selection::from_paths(&paths(&["g.a", "g", "h.x"]));
        let item = json!({"g": {"a": 1, "b": 2}, "h": [{"x": 1, "y": 2}, {"y": 3}]});
        assert_eq!(
            apply(item, &selection).to_string(),
            r#"{"g":{"a":1,"b":2},"h":[{"x":1},{}]}"#
        );
    }
}
