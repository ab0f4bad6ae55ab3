//! Stage: the horizon. `live` drops items whose state field holds a terminal value.

use serde_json::Value;

use super::field;
use crate::policy::Horizon;

/// Keeps the live items; returns how many were dropped.
pub fn apply(items: &mut Vec<Value>, horizon: &Horizon) -> usize {
    let before = items.len();
    items.retain(|item| {
        !field::get(item, &horizon.field)
            .is_some_and(|state| horizon.terminal.iter().any(|t| field::matches(state, t)))
    });
    before - items.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn drops_terminal_items_and_counts_them() {
        let horizon = Horizon {
            field: vec!["state".into()],
            terminal: vec!["merged".into(), "closed".into()],
        };
        let mut items = vec![
            json!({"id": 1, "state": "running"}),
            json!({"id": 2, "state": "merged"}),
            json!({"id": 3}),
            json!({"id": 4, "state": "closed"}),
        ];
        assert_eq!(apply(&mut items, &horizon), 2);
        assert_eq!(
            items,
            vec![json!({"id": 1, "state": "running"}), json!({"id": 3})]
        );
    }
}
