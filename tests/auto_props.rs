//! Property tests of automatic paging: random results (several blocks of text, JSON with a
//! list, images; structuredContent that repeats the JSON or not) under random budgets. Every
//! page fits, the chain ends, and the pieces reassemble to the original exactly, with the
//! server's own bytes for every number and string kept.

use mcp_budget::budget::auto::{self, At, Unpageable};
use mcp_budget::budget::cursor::CursorKey;
use proptest::prelude::*;
use serde_json::Value;

#[derive(Debug, Clone)]
enum Block {
    Text(String),
    /// (the document's raw text, its items' raw texts)
    Json(String, Vec<String>),
    Image(usize),
}

/// A number or string in one of its many JSON spellings.
fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("1.50".to_string()),
        Just("1e3".to_string()),
        Just("1E+2".to_string()),
        Just("-0".to_string()),
        Just("123456789012345678901234567890".to_string()),
        Just("3.14159265358979323846264338327950288".to_string()),
        Just(r#""\u00e9\/""#.to_string()),
        Just(r#""tab\there""#.to_string()),
        Just(r#""quote \" and \\ backslash""#.to_string()),
        Just("null".to_string()),
        (0u32..100000).prop_map(|n| n.to_string()),
        "[a-z é]{0,12}".prop_map(|s| Value::String(s).to_string()),
    ]
}

fn item() -> impl Strategy<Value = String> {
    (
        scalar(),
        prop::collection::vec(scalar(), 0..4),
        "[a-z]{1,8}",
    )
        .prop_map(|(a, list, k)| {
            format!(r#"{{"k": "{k}", "v":{a}, "nested":[{}]}}"#, list.join(","))
        })
}

fn block() -> impl Strategy<Value = Block> {
    prop_oneof![
        prop::collection::vec("[ -~é\t\"\\\\]{0,120}", 1..200)
            .prop_map(|lines| Block::Text(lines.join("\n") + "\n")),
        prop::collection::vec(item(), 2..300).prop_map(|items| {
            let doc = format!(
                r#"{{"meta":{{"n":{},"x":1e3}}, "items": [{}]}}"#,
                items.len(),
                items.join(", ")
            );
            Block::Json(doc, items)
        }),
        (10usize..3000).prop_map(Block::Image),
    ]
}

fn raw_block(block: &Block) -> String {
    match block {
        Block::Text(text) => format!(
            r#"{{"type":"text","text":{}}}"#,
            Value::String(text.clone())
        ),
        Block::Json(doc, _) => {
            format!(r#"{{"type":"text","text":{}}}"#, Value::String(doc.clone()))
        }
        Block::Image(n) => format!(
            r#"{{"type":"image","data":"{}","mimeType":"image/png"}}"#,
            "A".repeat(*n)
        ),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn pages_fit_and_reassemble_exactly(
        blocks in prop::collection::vec(block(), 1..4),
        mirror in any::<bool>(),
        budget in 4000usize..40000,
    ) {
        let content: Vec<String> = blocks.iter().map(raw_block).collect();
        let json_block = blocks.iter().position(|b| matches!(b, Block::Json(..)));
        let structured = match (mirror, json_block) {
            (true, Some(i)) => match &blocks[i] {
                Block::Json(doc, _) => format!(r#","structuredContent":{doc}"#),
                _ => String::new(),
            },
            _ => String::new(),
        };
        let result = format!(r#"{{"content":[{}]{structured},"isError":false}}"#, content.join(","));
        let key = CursorKey::from_secret(b"prop");
        let mut at = At::default();
        let mut pages = Vec::new();
        loop {
            match auto::page(&result, at, budget, "t", &key, &[7; 16]) {
                Ok(page) => {
                    prop_assert!(page.result.len() < budget, "{} bytes ≥ {budget}", page.result.len());
                    let value: Value = serde_json::from_str(&page.result).unwrap();
                    pages.push((at, page.next, page.result.clone(), value));
                    match page.next {
                        Some(next) => {
                            prop_assert!((next.piece, next.offset) > (at.piece, at.offset), "no progress");
                            at = next;
                        }
                        None => break,
                    }
                    prop_assert!(pages.len() < 5000);
                }
                Err(Unpageable::TooLarge { bytes, .. }) => {
                    // Only a piece that is large for this budget may be refused.
                    prop_assert!(bytes * 4 >= budget.saturating_sub(1200), "{bytes} refused under {budget}");
                    return Ok(());
                }
                Err(other) => prop_assert!(false, "{other:?}"),
            }
        }
        // Reassemble each block from the pages: a page holds pieces at.piece ..= the piece
        // where the next page starts (when it starts inside it).
        let mut texts = vec![String::new(); blocks.len()];
        let mut items: Vec<Vec<Value>> = vec![Vec::new(); blocks.len()];
        let mut images = vec![0usize; blocks.len()];
        let mut structured_items: Vec<Value> = Vec::new();
        let mut structured_pages: Vec<usize> = Vec::new();
        for (start, next, raw, value) in &pages {
            let page_blocks = value["content"].as_array().unwrap();
            let taken = &page_blocks[..page_blocks.len() - 1];
            for (j, block) in taken.iter().enumerate() {
                let piece = start.piece + j;
                match &blocks[piece] {
                    Block::Text(_) => texts[piece].push_str(block["text"].as_str().unwrap()),
                    Block::Json(_, originals) => {
                        let text = block["text"].as_str().unwrap();
                        let doc: Value = serde_json::from_str(text).unwrap();
                        prop_assert_eq!(&doc["meta"]["n"], &Value::from(originals.len()));
                        // The kept items are the server's bytes.
                        let got = doc["items"].as_array().unwrap();
                        let base = items[piece].len();
                        for (n, _) in got.iter().enumerate() {
                            prop_assert!(text.contains(originals[base + n].as_str()), "item {} respelled", base + n);
                        }
                        items[piece].extend(got.iter().cloned());
                    }
                    Block::Image(_) => {
                        prop_assert_eq!(block.to_string().len(), content[piece].len());
                        images[piece] += 1;
                    }
                }
            }
            if !structured.is_empty() {
                let s = &value["structuredContent"];
                prop_assert!(s["notice"].is_string());
                prop_assert_eq!(s.get("next_after").is_some(), next.is_some());
                if let (Some(Block::Json(_, originals)), Some(got)) = (json_block.map(|i| &blocks[i]), s["items"].as_array()) {
                    for (n, item) in got.iter().enumerate() {
                        let original = originals.iter().position(|o| serde_json::from_str::<Value>(o).ok().as_ref() == Some(item)).unwrap_or(usize::MAX);
                        prop_assert!(original != usize::MAX && raw.contains(originals[original].as_str()), "structured item {n} respelled");
                    }
                    structured_pages.push(got.len());
                    structured_items.extend(got.iter().cloned());
                }
            }
        }
        for (i, block) in blocks.iter().enumerate() {
            match block {
                Block::Text(text) => prop_assert_eq!(&texts[i], text),
                Block::Json(_, originals) => {
                    let expected: Vec<Value> = originals.iter().map(|o| serde_json::from_str(o).unwrap()).collect();
                    prop_assert_eq!(&items[i], &expected);
                    if !structured.is_empty() && json_block == Some(i) {
                        // Paged along (each item once), or small enough to ride whole on every page.
                        let whole_each_time = structured_pages.iter().all(|n| *n == expected.len());
                        prop_assert!(structured_items == expected || whole_each_time, "structured items differ");
                    }
                }
                Block::Image(_) => prop_assert_eq!(images[i], 1),
            }
        }
    }
}
