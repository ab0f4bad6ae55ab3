//! Stage: the page. `limit` items after the cursor's position.
//!
//! A position is the last item's key (when the policy names a key field) and its offset. The
//! key is looked up first, so that a page stays right when items before it came or went. When
//! that item itself is gone (it left the selection between two pages), a list ordered by its key
//! goes on at the first key after it — so every item that stayed in the selection still comes
//! exactly once; an unordered list falls back to the offset.

use std::cmp::Ordering;

use serde_json::Value;

use super::field;
use crate::policy::FieldPath;

/// Where the previous page ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// Number of items (of the matching list) already returned.
    pub offset: usize,
    /// The key of the last item returned, when the policy names a key field.
    pub key: Option<String>,
}

/// How a text cursor carries the fingerprint of the result it pages (in the position's key).
pub fn fingerprint_key(fingerprint: u64) -> String {
    format!("fp:{fingerprint:016x}")
}

/// The fingerprint a text cursor's position carries, if any.
pub fn fingerprint_of(position: &Position) -> Option<u64> {
    let hex = position.key.as_deref()?.strip_prefix("fp:")?;
    u64::from_str_radix(hex, 16).ok()
}

/// One page of a list.
#[derive(Debug, PartialEq)]
pub struct Page {
    pub items: Vec<Value>,
    /// How many items of the list come before this page.
    pub start: usize,
    /// The position after this page, when more items remain.
    pub next: Option<Position>,
}

/// The page of `limit` items after `after`.
pub fn apply(
    items: Vec<Value>,
    after: Option<&Position>,
    limit: usize,
    key: Option<&FieldPath>,
) -> Page {
    let start = match after {
        None => 0,
        Some(position) => {
            let by_key = match (&position.key, key) {
                (Some(wanted), Some(key)) => items.iter().position(|item| {
                    field::get(item, key).is_some_and(|k| field::matches(k, wanted))
                }),
                _ => None,
            };
            match (by_key, &position.key, key) {
                (Some(index), _, _) => index + 1,
                (None, Some(wanted), Some(key)) if ordered_by(&items, key) => items
                    .iter()
                    .position(|item| {
                        field::get(item, key)
                            .is_some_and(|k| compare(k, wanted) == Ordering::Greater)
                    })
                    .unwrap_or(items.len()),
                _ => position.offset,
            }
        }
    };
    let start = start.min(items.len());
    let end = start.saturating_add(limit).min(items.len());
    let next = (end < items.len()).then(|| Position {
        offset: end,
        key: key
            .and_then(|key| field::get(&items[end - 1], key))
            .map(field::text),
    });
    let items = items.into_iter().skip(start).take(end - start).collect();
    Page { items, start, next }
}

/// A key compared with a cursor's key text: as numbers when both are, else as text.
fn compare(key: &Value, wanted: &str) -> Ordering {
    if let (Some(a), Ok(b)) = (key.as_f64(), wanted.parse::<f64>()) {
        return a.total_cmp(&b);
    }
    field::text(key).as_str().cmp(wanted)
}

/// Whether every item has the key and the keys strictly increase.
fn ordered_by(items: &[Value], key: &FieldPath) -> bool {
    let keys: Option<Vec<&Value>> = items.iter().map(|item| field::get(item, key)).collect();
    let Some(keys) = keys else { return false };
    keys.windows(2)
        .all(|pair| compare(pair[1], &field::text(pair[0])) == Ordering::Greater)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn items(n: usize) -> Vec<Value> {
        (0..n).map(|i| json!({"k": format!("s{i}")})).collect()
    }

    #[test]
    fn pages_by_key_and_falls_back_to_offset() {
        let key = vec!["k".to_string()];
        let first = apply(items(5), None, 2, Some(&key));
        assert_eq!((first.items, first.start), (items(2), 0));
        let next = first.next.unwrap();
        assert_eq!(
            next,
            Position {
                offset: 2,
                key: Some("s1".into())
            }
        );
        let second = apply(items(5), Some(&next), 2, Some(&key));
        assert_eq!(second.items, vec![json!({"k": "s2"}), json!({"k": "s3"})]);
        assert_eq!(second.start, 2);
        // An item before the page vanished: the key still finds the right place.
        let mut fewer = items(5);
        fewer.remove(0);
        let third = apply(fewer, Some(&second.next.unwrap()), 2, Some(&key));
        assert_eq!((third.items, third.start), (vec![json!({"k": "s4"})], 3));
        // The key is gone from an unordered list: offset.
        let gone = Position {
            offset: 4,
            key: Some("zz".into()),
        };
        let mut unordered = items(5);
        unordered.swap(0, 1);
        let page = apply(unordered, Some(&gone), 2, Some(&key));
        assert_eq!((page.items, page.next), (vec![json!({"k": "s4"})], None));
    }

    #[test]
    fn in_an_ordered_list_a_vanished_key_continues_after_it() {
        let key = vec!["k".to_string()];
        // Page 1 ended at s3; then s3 and s1 left the selection.
        let after = Position {
            offset: 4,
            key: Some("s3".into()),
        };
        let left: Vec<Value> = items(8)
            .into_iter()
            .filter(|i| i["k"] != "s3" && i["k"] != "s1")
            .collect();
        let page = apply(left, Some(&after), 2, Some(&key));
        // The offset would have skipped s4; the order finds it.
        assert_eq!(page.items, vec![json!({"k": "s4"}), json!({"k": "s5"})]);
        // Numeric keys compare as numbers.
        let numbers: Vec<Value> = [2, 9, 10, 11].iter().map(|n| json!({"k": n})).collect();
        let after = Position {
            offset: 2,
            key: Some("8".into()),
        };
        let page = apply(numbers, Some(&after), 5, Some(&key));
        assert_eq!(
            page.items,
            vec![json!({"k": 9}), json!({"k": 10}), json!({"k": 11})]
        );
    }

    #[test]
    fn last_page_has_no_next_and_past_the_end_is_empty() {
        let page = apply(items(3), None, 3, None);
        assert_eq!((page.items.len(), page.next), (3, None));
        let far = Position {
            offset: 10,
            key: None,
        };
        let page = apply(items(3), Some(&far), 3, None);
        assert_eq!((page.items.len(), page.start, page.next), (0, 3, None));
    }
}
