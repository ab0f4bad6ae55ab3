//! Token and line budgets: whether a page fits what a client shows its model.
//!
//! Tokens are counted with o200k on the text the model reads (the text blocks of a result),
//! as `report` counts them. Counting is the expensive part (about 15 MB/s, and 0.1 s to load
//! the tokenizer), so it is done only where a token budget applies, and exactly only near the
//! edge:
//! - an o200k token is at least one byte, so a text of no more bytes than the budget is never
//!   counted;
//! - a longer text is estimated from a sample (16 windows spread over it, counted exactly);
//!   one whose estimate is under four fifths of the budget is taken as fitting (the estimate
//!   is within a tenth on even text, and errs high: its windows cut words);
//! - anything nearer the edge is counted exactly.

use std::sync::OnceLock;

use serde_json::Value;

use crate::client::Limits;

/// The o200k tokenizer, loaded on first use (a token budget, or `report`).
pub fn o200k() -> Result<&'static tiktoken_rs::CoreBPE, String> {
    static BPE: OnceLock<Result<tiktoken_rs::CoreBPE, String>> = OnceLock::new();
    BPE.get_or_init(|| {
        tiktoken_rs::o200k_base().map_err(|e| format!("cannot load the o200k tokenizer: {e}"))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Tokens of `text` (o200k).
pub fn count(text: &str) -> Result<usize, String> {
    Ok(o200k()?.encode_ordinary(text).len())
}

/// Loads the tokenizer on a thread of its own, so that the first page that needs it does not
/// wait for it.
pub fn preload() {
    static STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if STARTED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let spawned = std::thread::Builder::new().name("o200k".into()).spawn(|| {
        if let Err(err) = o200k() {
            tracing::error!(%err, "token budgets cannot be counted");
        }
    });
    if let Err(err) = spawned {
        tracing::debug!(%err, "the tokenizer loads on first use instead");
    }
}

/// Texts up to this long are counted, not estimated.
const SAMPLED_ABOVE: usize = 8 * 1024;
const WINDOWS: usize = 16;
const WINDOW: usize = 256;

/// An estimate of the tokens of `text`, from windows spread over it (each cut mid-word at its
/// ends, which only adds tokens).
fn estimate(text: &str) -> Result<usize, String> {
    if text.len() <= SAMPLED_ABOVE {
        return count(text);
    }
    let bpe = o200k()?;
    let (mut sampled, mut tokens) = (0, 0);
    for k in 0..WINDOWS {
        let mut start = k * (text.len() - WINDOW) / (WINDOWS - 1);
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = (start + WINDOW).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        sampled += end - start;
        tokens += bpe.encode_ordinary(&text[start..end]).len();
    }
    Ok((tokens * text.len()).div_ceil(sampled.max(1)))
}

/// The text a model reads of a tool result (its text blocks, one per line).
pub fn result_text(result: &Value) -> String {
    let texts: Vec<&str> = result
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|block| block.get("text").and_then(Value::as_str))
        .collect();
    texts.join("\n")
}

/// Which budget a page is over, and by how much.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Over {
    Tokens { count: usize, limit: usize },
    Lines { count: usize, limit: usize },
}

impl Over {
    /// The share of the page that would fit (below 1).
    pub fn ratio(&self) -> f64 {
        let (count, limit) = match *self {
            Over::Tokens { count, limit } | Over::Lines { count, limit } => (count, limit),
        };
        limit as f64 / count.max(1) as f64
    }

    /// What the page measures: "31200 tokens (o200k)", "300 lines".
    pub fn size(&self) -> String {
        match *self {
            Over::Tokens { count, .. } => format!("{count} tokens (o200k)"),
            Over::Lines { count, .. } => format!("{count} lines"),
        }
    }

    /// The budget it is over: "25000-token budget for claude-code".
    pub fn budget(&self, limits: &Limits) -> String {
        let budget = match self {
            Over::Tokens { .. } => limits.token_budget(),
            Over::Lines { .. } => limits.line_budget(),
        };
        budget.map(|b| b.as_cap()).unwrap_or_default()
    }
}

/// Whether the serialized tool result `result` is over the session's token or line budget.
/// Bytes are the caller's business.
pub fn over(result: &str, limits: &Limits) -> Option<Over> {
    let lines_bound = limits.lines.filter(|limit| {
        // Every line break the model reads is a `\n` escape in the JSON text (or a block
        // boundary): few enough of them, and the text cannot be over.
        let escapes = memchr::memmem::find_iter(result.as_bytes(), b"\\n").count();
        let blocks = memchr::memmem::find_iter(result.as_bytes(), b"\"text\"").count();
        escapes + blocks > *limit
    });
    let tokens_bound = limits.tokens.filter(|limit| result.len() > *limit);
    if lines_bound.is_none() && tokens_bound.is_none() {
        return None;
    }
    let value: Value = serde_json::from_str(result).ok()?;
    let text = result_text(&value);
    if let Some(limit) = lines_bound {
        let count = text.lines().count();
        if count > limit {
            return Some(Over::Lines { count, limit });
        }
    }
    if let Some(limit) = tokens_bound {
        let exact = match estimate(&text) {
            Ok(estimate) if estimate * 5 <= limit * 4 => return None,
            Ok(_) => count(&text),
            Err(err) => Err(err),
        };
        match exact {
            Ok(count) if count > limit => return Some(Over::Tokens { count, limit }),
            Ok(_) => {}
            Err(err) => {
                // Without the tokenizer the byte budget still holds; say so once per check.
                tracing::error!(%err, "token budget not applied");
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(tokens: Option<usize>, lines: Option<usize>) -> Limits {
        Limits {
            tokens,
            lines,
            ..Limits::bytes_only(1 << 20)
        }
    }

    #[test]
    fn counts_only_near_the_edge() {
        let small = r#"{"content":[{"type":"text","text":"hello world"}]}"#;
        assert_eq!(over(small, &limits(Some(100), None)), None);
        // 3000 digits are about 1000 tokens.
        let digits = "123".repeat(1000);
        let big = format!(r#"{{"content":[{{"type":"text","text":"{digits}"}}]}}"#);
        match over(&big, &limits(Some(500), None)) {
            Some(Over::Tokens { count, limit: 500 }) => assert!(count > 500, "{count}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(over(&big, &limits(Some(5000), None)), None);
    }

    #[test]
    fn the_estimate_is_close_on_even_text_and_exact_counts_decide_near_the_edge() {
        let text: String = (0..2000)
            .map(|i| {
                format!(
                    "2026-11-20T12:00:{:02}Z worker-{} stream st-{i:04} ok\n",
                    i % 60,
                    i % 7
                )
            })
            .collect();
        let exact = count(&text).unwrap();
        let estimated = estimate(&text).unwrap();
        assert!(
            estimated >= exact * 9 / 10 && estimated <= exact * 13 / 10,
            "estimate {estimated}, exact {exact}"
        );
        let result = serde_json::json!({"content": [{"type": "text", "text": text}]}).to_string();
        // Just over the exact count: near the edge, so counted exactly, and it fits.
        assert_eq!(over(&result, &limits(Some(exact + 1), None)), None);
        assert!(matches!(
            over(&result, &limits(Some(exact - 1), None)),
            Some(Over::Tokens { count, .. }) if count == exact
        ));
    }

    #[test]
    fn lines_are_the_texts_lines() {
        let text = vec!["x"; 300].join("\\n");
        let result = format!(r#"{{"content":[{{"type":"text","text":"{text}"}}]}}"#);
        assert_eq!(
            over(&result, &limits(None, Some(256))),
            Some(Over::Lines {
                count: 300,
                limit: 256
            })
        );
        assert_eq!(over(&result, &limits(None, Some(300))), None);
    }
}
