//! Stage: filters. Each filter argument keeps the items whose field equals its value, or one
//! of its values when it is a list; several filters must all hold.

use serde_json::Value;

use super::field;
use crate::policy::FieldPath;

/// One filter of a call: the item field and the accepted values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub field: FieldPath,
    pub values: Vec<String>,
}

pub fn apply(items: &mut Vec<Value>, filters: &[Filter]) {
    if filters.is_empty() {
        return;
    }
    items.retain(|item| {
        filters.iter().all(|filter| {
            field::get(item, &filter.field)
                .is_some_and(|value| filter.values.iter().any(|v| field::matches(value, v)))
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn all_filters_must_hold_and_lists_mean_any_of() {
        let mut items = vec![
            json!({"id": "a", "state": "running", "owner": "x"}),
            json!({"id": "b", "state": "gated", "owner": "x"}),
            json!({"id": "c", "state": "blocked", "owner": "y"}),
        ];
        apply(
            &mut items,
            &[
                Filter {
                    field: vec!["state".into()],
                    values: vec!["running".into(), "blocked".into()],
                },
                Filter {
                    field: vec!["owner".into()],
                    values: vec!["x".into()],
                },
            ],
        );
        assert_eq!(
            items,
            vec![json!({"id": "a", "state": "running", "owner": "x"})]
        );
    }
}
