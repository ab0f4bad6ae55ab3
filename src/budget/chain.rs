//! Rule chains from the result cache: the upstream result of a call a rule pages, kept so that
//! its later pages (and searches) are cut from it instead of running the tool again.
//!
//! Why: a tool may have side effects, and a rule chain of 155 text pages that re-ran the tool for
//! each page cost 123× one direct read. The entry holds what the pipeline needs for a page: the
//! server's text of the result, and for a text rule its text decoded once with the offset of
//! every line end, so that a later page costs its own bytes (a few binary searches and one
//! splice), never a parse of the whole result.
//!
//! A text page is written into the server's own text: the block's string literal is replaced by
//! the page, a notice block follows it, a field of `structuredContent` that repeats the text
//! gets the page too, and `structuredContent` (an object) gains the continuation, as automatic
//! pages have it (`next_after`, `total_count` lines, `notice`). Everything else is the
//! server's bytes.

use std::ops::Range;

use super::args::TextArgs;
use super::cursor::CursorKey;
use super::page::{Position, fingerprint_key};
use super::raw;
use super::text::{self, TextPage};
use bytestring::ByteString;

/// An upstream result of a rule-paged call, read once.
pub struct RuleResult {
    raw: ByteString,
    /// The tool whose result it is (a search finds its rule by it).
    tool: Option<Box<str>>,
    /// The walk of an items rule's list in structuredContent, for later pages.
    walked: Option<super::reduce::Scanned>,
    /// Where structuredContent is, once a search asked (`None` inside: it has none).
    structured: std::sync::OnceLock<Option<Range<usize>>>,
    fingerprint: u64,
    text: Option<TextLayout>,
    /// The reference to the whole result that every page cut from it names (when references
    /// are on): see [`super::reference`].
    reference: Option<Box<str>>,
}

impl std::fmt::Debug for RuleResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleResult")
            .field("bytes", &self.raw.len())
            .field("text", &self.text.is_some())
            .finish_non_exhaustive()
    }
}

/// Where the paged text is in the result, and its lines.
struct TextLayout {
    /// The text, decoded.
    whole: String,
    /// The offset of every `\n` in `whole`.
    newlines: Vec<usize>,
    /// The text block's range in the result.
    block: Range<usize>,
    /// The block's string literal (quotes included), in the result.
    literal: Range<usize>,
    /// structuredContent's range, when it is an object.
    structured: Option<Range<usize>>,
    /// structuredContent members whose value is the same text (string literals, in the result).
    mirrors: Vec<Range<usize>>,
    /// The text is one JSON document (an object or an array).
    json: bool,
}

/// The fingerprint of a result (never 0: 0 is "none" in a cursor).
pub fn fingerprint(raw: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    raw.hash(&mut hasher);
    hasher.finish().max(1)
}

impl RuleResult {
    /// `raw`: the server's text of the result; `text`: the rule pages text (its line index is
    /// built now).
    pub fn new(raw: ByteString, text: bool) -> RuleResult {
        let fingerprint = fingerprint(&raw);
        RuleResult::with_fingerprint(raw, text, fingerprint)
    }

    /// [`RuleResult::new`], its fingerprint known already.
    pub fn with_fingerprint(raw: ByteString, text: bool, fingerprint: u64) -> RuleResult {
        let layout = if text { TextLayout::read(&raw) } else { None };
        RuleResult {
            fingerprint,
            raw,
            tool: None,
            walked: None,
            structured: std::sync::OnceLock::new(),
            text: layout,
            reference: None,
        }
    }

    /// Names `reference` on every page cut from this result.
    pub fn with_reference(mut self, reference: Option<String>) -> RuleResult {
        self.reference = reference.map(Into::into);
        self
    }

    /// The reference every page cut from this result names.
    pub fn reference(&self) -> Option<&str> {
        self.reference.as_deref()
    }

    /// Names the tool whose result this is.
    pub fn of_tool(mut self, tool: &str) -> RuleResult {
        self.tool = Some(tool.into());
        self
    }

    pub fn tool(&self) -> Option<&str> {
        self.tool.as_deref()
    }

    /// Keeps the walk of the result's list (made for its first page).
    pub fn with_walk(mut self, walked: Option<super::reduce::Scanned>) -> RuleResult {
        self.walked = walked;
        self
    }

    pub fn walked(&self) -> Option<&super::reduce::Scanned> {
        self.walked.as_ref()
    }

    /// structuredContent, when it is an object or a list (read once, then remembered).
    pub fn structured(&self) -> Option<&str> {
        let range = self.structured.get_or_init(|| {
            let members = raw::members(&self.raw)?;
            let (_, range) = members
                .iter()
                .rev()
                .find(|(k, _)| k == "structuredContent")?;
            let text = self.raw[range.clone()].trim_start();
            (text.starts_with('{') || text.starts_with('[')).then(|| range.clone())
        });
        range.as_ref().map(|r| &self.raw[r.clone()])
    }

    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// The server's text of the result, sharing this one's bytes.
    pub fn shared_raw(&self) -> ByteString {
        self.raw.clone()
    }

    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The bytes this holds.
    pub fn bytes(&self) -> usize {
        self.raw.len()
            + self.walked.as_ref().map_or(0, |w| w.bytes())
            + self
                .text
                .as_ref()
                .map_or(0, |t| t.whole.len() + t.newlines.len() * 8)
    }

    /// Whether the text a text rule pages is one JSON document: the automatic pager pages it,
    /// by its largest array, so that every page parses.
    pub fn text_is_json(&self) -> bool {
        self.text.as_ref().is_some_and(|t| t.json)
    }

    /// The decoded text a text rule pages, if the result has one.
    pub fn text(&self) -> Option<&str> {
        self.text.as_ref().map(|t| t.whole.as_str())
    }

    /// Whether a text rule can page this result from its layout (else the whole pipeline does).
    pub fn has_layout(&self) -> bool {
        self.text.is_some()
    }

    /// The text page at `args.after`, at most `page_bytes` of text, as the result's JSON; `None`
    /// when the whole text fits (the result passes as it is) or there is no layout. `search`:
    /// the sentence that tells a first page's reader how to search the whole result.
    pub fn text_page(
        &self,
        tool: &str,
        page_bytes: usize,
        args: &TextArgs,
        key: &CursorKey,
        search: Option<&str>,
    ) -> Option<TextOutcome> {
        let layout = self.text.as_ref()?;
        let whole = layout.whole.as_str();
        let start = args.after.unwrap_or(0);
        if start == 0 && whole.len() <= page_bytes {
            return Some(TextOutcome::Fits);
        }
        if let Some(minted) = args.fingerprint
            && minted != self.fingerprint
        {
            return Some(TextOutcome::Changed);
        }
        let page = layout.page(start, page_bytes);
        let next = (page.end < whole.len()).then(|| {
            key.mint(
                &Position {
                    offset: page.end,
                    key: Some(fingerprint_key(self.fingerprint)),
                },
                &args.digest,
            )
        });
        let mut notice = text::notice(&page, whole.len(), tool, next.as_deref(), page_bytes);
        if let (Some(search), true, Some(_)) = (search, page.start == 0, &next) {
            notice.push(' ');
            notice.push_str(search);
        }
        let reference = self.reference.as_deref();
        if let Some(reference) = reference {
            notice.push(' ');
            notice.push_str(&super::reference::sentence(reference));
        }
        Some(TextOutcome::Page {
            result: layout.write(&self.raw, &page, next.as_deref(), &notice, reference),
            more: next.is_some(),
        })
    }
}

/// What a text rule makes of a result.
#[derive(Debug)]
pub enum TextOutcome {
    /// The whole text fits: the result passes unchanged.
    Fits,
    /// The cursor was minted in another result (the tool answered otherwise since).
    Changed,
    /// A page (the result's JSON), and whether more remain.
    Page { result: String, more: bool },
}

impl TextLayout {
    /// The first text block of a tool result and its lines; `None` for a result this cannot read
    /// exactly as a parser would (no text block, a member named twice).
    fn read(raw: &str) -> Option<TextLayout> {
        let members = raw::members(raw)?;
        if has_duplicates(&members) {
            return None;
        }
        let member = |name: &str| {
            members
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, r)| r.clone())
        };
        if member("isError").is_some_and(|r| raw[r].trim() != "false") {
            return None; // an error result passes as the server wrote it
        }
        let content = member("content")?;
        let elements = raw::elements_with_members(&raw[content.clone()])?;
        // The first block of type "text" whose text is a string, as the pipeline finds it; a
        // block that names a member twice leaves the result to the pipeline.
        let mut found = None;
        for (range, block_members) in &elements {
            let Some(block_members) = block_members.as_deref() else {
                continue;
            };
            if has_duplicates(block_members) {
                return None;
            }
            let base = content.start + range.start;
            let field = |name: &str| {
                block_members
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, r)| base + r.start..base + r.end)
            };
            let is_text = field("type")
                .and_then(|kind| serde_json::from_str::<String>(&raw[kind]).ok())
                .is_some_and(|kind| kind == "text");
            let Some(literal) = field("text").filter(|_| is_text) else {
                continue;
            };
            if raw[literal.clone()].starts_with('"') {
                found = Some((base..content.start + range.end, literal));
                break;
            }
        }
        let (block, literal) = found?;
        let whole: String = serde_json::from_str(&raw[literal.clone()]).ok()?;
        let structured = member("structuredContent").filter(|r| raw[r.clone()].starts_with('{'));
        let mut mirrors = Vec::new();
        if let Some(range) = &structured {
            let inner = raw::members(&raw[range.clone()])?;
            if has_duplicates(&inner) {
                return None;
            }
            let same = &raw[literal.clone()];
            for (_, r) in inner {
                let at = range.start + r.start..range.start + r.end;
                let text = &raw[at.clone()];
                let equal = text == same
                    || (text.starts_with('"')
                        && serde_json::from_str::<String>(text).is_ok_and(|t| t == whole));
                if equal {
                    mirrors.push(at);
                }
            }
        }
        let newlines = memchr::memchr_iter(b'\n', whole.as_bytes()).collect();
        let json = matches!(whole.trim_start().as_bytes().first(), Some(b'{' | b'['))
            && serde_json::from_str::<&serde_json::value::RawValue>(&whole).is_ok();
        Some(TextLayout {
            json,
            whole,
            newlines,
            block,
            literal,
            structured,
            mirrors,
        })
    }

    /// The 1-based number of the line `offset` is on.
    fn line_number(&self, offset: usize) -> usize {
        self.newlines.partition_point(|&n| n < offset) + 1
    }

    /// [`text::page`], from the line index.
    fn page(&self, start: usize, budget: usize) -> TextPage {
        let text = self.whole.as_str();
        let budget = budget.max(4);
        let mut start = start.min(text.len());
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let limit = (start + budget).min(text.len());
        let (end, split_line) = if limit == text.len() {
            (limit, false)
        } else {
            let before = self.newlines.partition_point(|&n| n < limit);
            match before.checked_sub(1).map(|i| self.newlines[i]) {
                Some(newline) if newline >= start => (newline + 1, false),
                _ => {
                    let mut cut = limit;
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    (cut, true)
                }
            }
        };
        let ends_open = !text.is_empty() && !text.ends_with('\n');
        let total_lines = (self.newlines.len() + usize::from(ends_open)).max(1);
        let first_line = self.line_number(start);
        let last_line = if end > start && text.as_bytes()[end - 1] == b'\n' {
            self.line_number(end - 1)
        } else {
            self.line_number(end)
        };
        TextPage {
            start,
            end,
            first_line,
            last_line: last_line.min(total_lines),
            total_lines,
            split_line,
        }
    }

    /// The page written into the server's text of the result.
    fn write(
        &self,
        raw: &str,
        page: &TextPage,
        next: Option<&str>,
        notice: &str,
        reference: Option<&str>,
    ) -> String {
        let slice = json_string(&self.whole[page.start..page.end]);
        let block = format!(",{}", serde_json::json!({"type": "text", "text": notice}));
        let mut cuts: Vec<(Range<usize>, String)> = vec![
            (self.literal.clone(), slice.clone()),
            (self.block.end..self.block.end, block),
        ];
        for mirror in &self.mirrors {
            cuts.push((mirror.clone(), slice.clone()));
        }
        if let Some(structured) = &self.structured {
            // The continuation at the end of structuredContent, as automatic pages carry it.
            let close = raw[..structured.end].rfind('}').unwrap_or(structured.end);
            let inner = raw::members(&raw[structured.clone()]).unwrap_or_default();
            let addition = super::continuation::continuation_members(
                &inner,
                next,
                page.total_lines,
                notice,
                reference,
                !inner.is_empty(),
            );
            cuts.push((close..close, addition));
        }
        cuts.sort_by_key(|(range, _)| range.start);
        let mut out = String::with_capacity(
            raw.len().min(page.end - page.start + 4096)
                + cuts.iter().map(|c| c.1.len()).sum::<usize>(),
        );
        let mut from = 0;
        for (range, text) in &cuts {
            if range.start < from {
                continue; // overlapping cuts cannot happen: each range is a distinct value
            }
            out.push_str(&raw[from..range.start]);
            out.push_str(text);
            from = range.end;
        }
        out.push_str(&raw[from..]);
        out
    }
}

fn has_duplicates(members: &[(String, Range<usize>)]) -> bool {
    let mut seen = std::collections::HashSet::with_capacity(members.len());
    members.iter().any(|(k, _)| !seen.insert(k.as_str()))
}

fn json_string(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn key() -> CursorKey {
        CursorKey::from_secret(b"chain")
    }

    fn args(after: Option<usize>) -> TextArgs {
        TextArgs {
            auto: None,
            after,
            fingerprint: None,
            digest: [7; 16],
        }
    }

    /// Every page, following the cursors, and their texts.
    fn chain(raw: &str, budget: usize) -> Vec<Value> {
        let entry = RuleResult::new(ByteString::from(raw), true);
        let mut pages = Vec::new();
        let mut after = None;
        loop {
            let outcome = entry.text_page("t", budget, &args(after), &key(), None);
            let Some(TextOutcome::Page { result, more }) = outcome else {
                panic!("no page: {outcome:?}");
            };
            let page: Value = serde_json::from_str(&result).expect("a page is JSON");
            if more {
                let cursor = page["structuredContent"]["next_after"]
                    .as_str()
                    .expect("cursor");
                after = Some(key().verify(cursor, &[7; 16]).expect("valid").offset);
            }
            pages.push(page);
            if !more {
                return pages;
            }
        }
    }

    #[test]
    fn pages_concatenate_to_the_text_and_keep_the_rest() {
        let text: String = (0..200)
            .map(|i| format!("line {i} \u{e9} \"q\"\n"))
            .collect();
        let raw = format!(
            r#"{{"content":[{{"type":"text","text":{}}}],"structuredContent":{{"content":{},"n":1e3}},"isError":false}}"#,
            json_string(&text),
            json_string(&text)
        );
        let pages = chain(&raw, 500);
        assert!(pages.len() > 5);
        let joined: String = pages
            .iter()
            .map(|p| p["content"][0]["text"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(joined, text);
        for page in &pages {
            assert_eq!(
                page["content"][0]["text"],
                page["structuredContent"]["content"]
            );
            assert_eq!(page["content"][1]["type"], "text");
            assert_eq!(page["structuredContent"]["total_count"], 200);
            assert!(page["structuredContent"]["notice"].as_str().is_some());
        }
        assert!(
            pages.last().unwrap()["structuredContent"]
                .get("next_after")
                .is_none()
        );
    }

    #[test]
    fn the_index_pages_exactly_as_the_text_stage() {
        let texts = [
            "a\nbb\nccc\n".to_string(),
            "no newline at all but long enough to split".to_string(),
            "x\n".repeat(50),
            "é".repeat(40) + "\n" + &"ü\n".repeat(9),
            String::new() + "\n\n\n",
        ];
        for text in texts {
            let raw = format!(
                r#"{{"content":[{{"type":"text","text":{}}}]}}"#,
                json_string(&text)
            );
            let layout = TextLayout::read(&raw).expect("layout");
            for budget in [4, 5, 7, 13, 64] {
                for start in 0..=text.len() {
                    assert_eq!(
                        layout.page(start, budget),
                        text::page(&text, start, budget),
                        "{text:?} {start} {budget}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_changed_result_is_not_cut_at_an_old_position() {
        let raw = format!(
            r#"{{"content":[{{"type":"text","text":{}}}]}}"#,
            json_string(&"z\n".repeat(100))
        );
        let entry = RuleResult::new(ByteString::from(raw.as_str()), true);
        let mut stale = args(Some(10));
        stale.fingerprint = Some(entry.fingerprint() ^ 1);
        assert!(matches!(
            entry.text_page("t", 20, &stale, &key(), None),
            Some(TextOutcome::Changed)
        ));
    }
}
