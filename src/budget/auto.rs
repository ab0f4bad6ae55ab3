//! Automatic paging: a result over the budget from a tool that no rule pages is cut into pages
//! that each fit, without losing or re-spelling anything.
//!
//! The result is read as a sequence of pieces, paged in order:
//! - a text block is paged by lines, cut in its JSON string literal at a `\n` escape, so that
//!   the server's other escapes stay as they were written and the pages' texts concatenate to
//!   the whole text;
//! - a text block that holds JSON is paged by its largest array (the rest of the document is
//!   on every page), the kept elements being the server's own bytes;
//! - any other block (an image, a resource) is one piece, never split.
//!
//! `structuredContent` that repeats a text block (the same JSON, or the text as one of its
//! fields) is paged with that block; structuredContent of its own is paged by its largest array,
//! after the blocks. Every page carries the continuation twice: a text block at the end of
//! `content`, and `next_after`, `total_count` and `notice` in `structuredContent`, so a client
//! that reads only one of them still sees that more remains.
//!
//! Only a piece that cannot be split and is larger than the whole budget is refused.

use std::ops::Range;

use bytestring::ByteString;
use serde_json::value::RawValue;

pub use super::at::{At, may_rerun};
use super::continuation::*;
use super::cursor::{CursorKey, SelectionDigest};
use super::escaped::*;
use super::raw::{self, FoundArray, same_tokens};
use crate::client::Reads;

mod notice;

/// Bytes kept free on a page for the notice block and the structured continuation.
pub const CONTINUATION_ALLOWANCE: usize = 1200;

/// What cannot be paged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unpageable {
    /// The result is not a tool result this pager can read.
    Unreadable,
    /// One piece is larger than the whole budget: what it is, and its size.
    TooLarge { what: String, bytes: usize },
    /// The cursor points past the result (it changed since the cursor was minted).
    Gone,
    /// The result is not the one the cursor was minted in (the tool ran again and answered
    /// otherwise).
    Changed,
}

/// One page of a result.
#[derive(Debug)]
pub struct AutoPage {
    /// The page, as the `result` of the response.
    pub result: String,
    /// Where the next page starts.
    pub next: Option<At>,
}

enum Kind {
    /// Text, paged by lines: the range of its string literal in the block (quotes included).
    Lines { literal: Range<usize> },
    /// JSON in a text block, paged by an array of the decoded document.
    Items {
        literal: Range<usize>,
        doc: String,
        array: FoundArray,
        /// What the document around the list costs written as a JSON string (on every page).
        around: usize,
    },
    /// Never split.
    Whole,
}

struct Block {
    /// The block's range in the result.
    raw: Range<usize>,
    kind: Kind,
    /// Where its lines are, once a page's notice has counted them (text paged by lines).
    lines: std::sync::OnceLock<LineIndex>,
}

/// How `structuredContent` relates to the blocks.
enum Mirror {
    /// Nothing to page in it, or no structuredContent.
    None,
    /// The same JSON as block `block`: paged with it, by the array at the same path.
    Json { block: usize, array: FoundArray },
    /// The text of block `block` is the value of this member.
    Field { block: usize, member: Range<usize> },
    /// A document of its own, paged by this array after the blocks.
    Own { array: FoundArray },
}

/// A result read into its pieces, once: the pages of a chain are cut from it (the result cache
/// holds it, so a later page costs only its own bytes).
pub struct Prepared {
    result: ByteString,
    /// The members of the result object, as (key, range).
    members: Vec<(String, Range<usize>)>,
    blocks: Vec<Block>,
    structured: Option<Range<usize>>,
    mirror: Mirror,
    /// The room a page had when the pieces were chosen.
    room: usize,
    /// A hash of the result, carried by cursors.
    fingerprint: u64,
    /// The argument that continues a chain: `after`, or `mcp_budget_after` for a tool that has
    /// an `after` of its own.
    argument: &'static str,
    /// The budget as the notice names it ("10240-byte budget for codex").
    budget: Box<str>,
    /// The sentence a first page's notice ends with, naming the search tool (when it is on).
    search: Option<Box<str>>,
    /// The reference to the whole result that every page cut from it names (when references
    /// are on): see [`super::reference`].
    reference: Option<Box<str>>,
    /// The tool may be run again to serve a page: its cursors say so.
    rerun: bool,
    /// What the client's model reads of a page: a page is measured by that, and a mirrored
    /// text costs once when the model reads one of the two.
    reads: Reads,
    /// The most text of one piece a page takes (a text rule's page size), past its first line
    /// or item: a page never refuses what the whole budget can hold.
    text_limit: Option<usize>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("bytes", &self.result.len())
            .field("blocks", &self.blocks.len())
            .finish_non_exhaustive()
    }
}

/// What one page takes from each piece.
#[derive(Debug, Clone)]
struct Taken {
    piece: usize,
    /// Byte range of a literal's inside, or element range.
    from: usize,
    to: usize,
}

/// Pages `result` (the raw JSON of a tool result) from `at`, each page under `max_bytes`.
pub fn page(
    result: &str,
    at: At,
    max_bytes: usize,
    tool: &str,
    key: &CursorKey,
    digest: &SelectionDigest,
) -> Result<AutoPage, Unpageable> {
    prepare(ByteString::from(result), max_bytes)?.page(at, max_bytes, tool, key, digest)
}

/// Reads the pieces of a result, for pages under `max_bytes`.
pub fn prepare(result: ByteString, max_bytes: usize) -> Result<Prepared, Unpageable> {
    let room = max_bytes.saturating_sub(CONTINUATION_ALLOWANCE).max(64);
    let members = raw::members(&result).ok_or(Unpageable::Unreadable)?;
    let member = |name: &str| {
        members
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, r)| r.clone())
    };
    let mut blocks = Vec::new();
    if let Some(content) = member("content") {
        let elements = raw::elements(&result[content.clone()]).ok_or(Unpageable::Unreadable)?;
        for element in elements {
            let range = content.start + element.start..content.start + element.end;
            blocks.push(Block {
                kind: block_kind(&result[range.clone()], room),
                raw: range,
                lines: std::sync::OnceLock::new(),
            });
        }
    }
    // An object, or (since 2025-06-18 any JSON value may be) an array: the list itself.
    let structured = member("structuredContent").filter(|r| {
        let text = result[r.clone()].trim_start();
        text.starts_with('{') || text.starts_with('[')
    });
    let mirror = match &structured {
        Some(range) => mirror(&result, &result[range.clone()], &blocks, room),
        None => Mirror::None,
    };
    let fingerprint = {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::hash::DefaultHasher::new();
        result.hash(&mut hasher);
        hasher.finish().max(1)
    };
    Ok(Prepared {
        result,
        members,
        blocks,
        structured,
        mirror,
        room,
        fingerprint,
        argument: "after",
        budget: "budget".into(),
        search: None,
        reference: None,
        rerun: false,
        reads: Reads::Both,
        text_limit: None,
    })
}

impl Prepared {
    /// Names the argument that continues the chain (`after` unless the tool has its own).
    pub fn with_argument(mut self, argument: &'static str) -> Prepared {
        self.argument = argument;
        self
    }

    /// Names the budget in the notice ("10240-byte budget for codex").
    pub fn with_budget(mut self, budget: String) -> Prepared {
        self.budget = budget.into();
        self
    }

    /// Marks the cursors: the tool may be run again on a miss (it is read-only).
    pub fn with_rerun(mut self, rerun: bool) -> Prepared {
        self.rerun = rerun;
        self
    }

    /// Bounds the text of one piece a page takes (past its first line or item).
    pub fn with_text_limit(mut self, limit: Option<usize>) -> Prepared {
        self.text_limit = limit;
        self
    }

    /// Measures pages by what the client's model reads of them.
    pub fn with_reads(mut self, reads: Reads) -> Prepared {
        self.reads = reads;
        self
    }

    /// Ends a first page's notice with `sentence` (how to search the whole result).
    pub fn with_search(mut self, sentence: Option<&str>) -> Prepared {
        self.search = sentence.map(Into::into);
        self
    }

    /// Names `reference` on every page cut from this result.
    pub fn with_reference(mut self, reference: Option<String>) -> Prepared {
        self.reference = reference.map(Into::into);
        self
    }

    /// The reference every page cut from this result names.
    pub fn reference(&self) -> Option<&str> {
        self.reference.as_deref()
    }

    /// The result, as the server wrote it.
    pub fn whole(&self) -> &str {
        &self.result
    }

    /// The fingerprint cursors of this result carry.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The bytes this holds (the result, and the JSON documents read out of its texts).
    pub fn bytes(&self) -> usize {
        self.result.len()
            + self
                .blocks
                .iter()
                .map(|b| match &b.kind {
                    Kind::Items { doc, array, .. } => doc.len() + array.elements.len() * 16,
                    _ => 0,
                })
                .sum::<usize>()
    }

    /// The length of the result.
    pub fn result_len(&self) -> usize {
        self.result.len()
    }

    /// The page from `at`, under `max_bytes`.
    pub fn page(
        &self,
        at: At,
        max_bytes: usize,
        tool: &str,
        key: &CursorKey,
        digest: &SelectionDigest,
    ) -> Result<AutoPage, Unpageable> {
        self.page_fitting(at, max_bytes, &|_| None, tool, key, digest)
    }

    /// The page from `at`, under `max_bytes` and such that `over` (a token or line budget)
    /// finds nothing: `over` gives the share of a page that would fit.
    pub fn page_fitting(
        &self,
        at: At,
        max_bytes: usize,
        over: &dyn Fn(&str) -> Option<f64>,
        tool: &str,
        key: &CursorKey,
        digest: &SelectionDigest,
    ) -> Result<AutoPage, Unpageable> {
        if !at.first() && at.fingerprint != self.fingerprint {
            return Err(Unpageable::Changed);
        }
        // A reference costs three times (in the notice block, in the structured notice, beside
        // the structured continuation), its sentence twice.
        let sentence = super::reference::sentence("").len();
        let reference = self
            .reference
            .as_ref()
            .map_or(0, |r| 3 * r.len() + 2 * sentence + 40);
        let allowance = CONTINUATION_ALLOWANCE + reference;
        let mut room = self.room.min(max_bytes.saturating_sub(allowance).max(64));
        // What can never fit is refused on the first call, not after pages that promise more.
        if at.first()
            && let Some(refusal) = self.unsplittable(room)
        {
            return Err(refusal);
        }
        // A page's exact size is known once it is written; a page over the budget is made
        // again with less room (a few rounds at most: the estimates are close).
        for _ in 0..12 {
            let page = match self.page_in(at, room, tool, key, digest) {
                Ok(page) => page,
                // Made smaller for tokens or lines than the pieces were chosen for.
                Err(Unpageable::TooLarge { .. }) if room < self.room => break,
                Err(why) => return Err(why),
            };
            if super::cap::read_bytes(self.reads, &page.result) < max_bytes {
                match over(&page.result) {
                    None => return Ok(page),
                    Some(share) => {
                        room = ((room.min(page.result.len()) as f64) * share * 0.9) as usize;
                        if room < 64 {
                            break;
                        }
                        continue;
                    }
                }
            }
            room = room * 4 / 5;
        }
        Err(Unpageable::TooLarge {
            what: "the result".into(),
            bytes: self.result.len(),
        })
    }
}

/// `block` with its text literal (the range `literal`) replaced by `text`.
fn with_literal(block: &str, literal: &Range<usize>, text: &str) -> String {
    format!("{}{text}{}", &block[..literal.start], &block[literal.end..])
}

fn block_kind(block: &str, room: usize) -> Kind {
    let Some(members) = raw::members(block) else {
        return Kind::Whole;
    };
    let get = |name: &str| members.iter().rev().find(|(k, _)| k == name);
    let is_text = get("type").is_some_and(|(_, r)| &block[r.clone()] == "\"text\"");
    let Some((_, literal)) = get("text").filter(|_| is_text) else {
        return Kind::Whole;
    };
    let literal = literal.clone();
    // Only a text that begins like JSON is decoded (after white space, raw or escaped).
    let inner = block[literal.clone()].trim_start_matches('"');
    let mut start = inner.trim_start_matches([' ', '\t']);
    while let Some(rest) = ["\\n", "\\r", "\\t"]
        .iter()
        .find_map(|escape| start.strip_prefix(escape))
    {
        start = rest.trim_start_matches([' ', '\t']);
    }
    if !(start.starts_with('{') || start.starts_with('[')) {
        return Kind::Lines { literal };
    }
    let Ok(text) = serde_json::from_str::<String>(&block[literal.clone()]) else {
        return Kind::Whole;
    };
    let trimmed = text.trim_start();
    if (trimmed.starts_with('{') || trimmed.starts_with('['))
        && serde_json::from_str::<&RawValue>(&text).is_ok()
        && let Some(array) = raw::largest_array(&text, room / 2)
            .filter(|array| text.len() - array.span.len() < room / 2)
            // No list to page: an object is paged by its members.
            .or_else(|| raw::root_members(&text, room / 2))
    {
        let around = escaped_len(&text) - escaped_len(&text[array.span.clone()]);
        return Kind::Items {
            literal,
            doc: text,
            array,
            around,
        };
    }
    Kind::Lines { literal }
}

fn mirror(result: &str, structured: &str, blocks: &[Block], room: usize) -> Mirror {
    for (index, block) in blocks.iter().enumerate() {
        // The same JSON, token for token (whitespace aside): compared as text, never read
        // into two value trees (a 24 MB document is several times that as a tree).
        if let Kind::Items { doc, array, .. } = &block.kind
            && same_tokens(doc, structured)
            && let Some(array) = match array.object {
                true => raw::root_members(structured, usize::MAX),
                false => raw::array_at(structured, &array.path),
            }
        {
            return Mirror::Json {
                block: index,
                array,
            };
        }
        // The text itself as a field (server-filesystem: {"content": <the text>}).
        let literal = match &block.kind {
            Kind::Lines { literal } | Kind::Items { literal, .. } => literal,
            Kind::Whole => continue,
        };
        let block_raw = &result[block.raw.clone()];
        let literal_raw = &block_raw[literal.clone()];
        let Some(members) = raw::members(structured) else {
            continue;
        };
        let mut text: Option<String> = None;
        for (_, range) in members {
            let field = &structured[range.clone()];
            if !field.starts_with('"') {
                continue;
            }
            // The same spelling is the common case; else compare what they say (decoding
            // only literals of about the same length).
            let same = field == literal_raw
                || (field.len().abs_diff(literal_raw.len()) <= literal_raw.len() / 8 && {
                    let text = text.get_or_insert_with(|| {
                        serde_json::from_str::<String>(literal_raw).unwrap_or_default()
                    });
                    serde_json::from_str::<String>(field).ok().as_ref() == Some(&*text)
                });
            if same {
                return Mirror::Field {
                    block: index,
                    member: range,
                };
            }
        }
    }
    match raw::largest_array(structured, room / 2)
        .or_else(|| raw::root_members(structured, room / 2))
    {
        Some(array) if structured.len() > room / 4 => Mirror::Own { array },
        _ => Mirror::None,
    }
}

/// What a search reads in a prepared result: the first piece that is paged by lines or by
/// items.
pub enum Searchable<'a> {
    /// A text, as its JSON string literal's inside (still escaped).
    Lines(&'a str),
    /// A list: the document and its elements' ranges in it.
    Items {
        doc: &'a str,
        elements: &'a [Range<usize>],
    },
}

impl Prepared {
    /// The first piece a search can read, if any.
    pub fn searchable(&self) -> Option<Searchable<'_>> {
        (0..self.piece_count()).find_map(|piece| match self.piece_kind(piece) {
            PieceKind::Lines(inner) => Some(Searchable::Lines(inner)),
            PieceKind::Items { doc, array, .. } => Some(Searchable::Items {
                doc,
                elements: &array.elements,
            }),
            PieceKind::Whole(_) => None,
        })
    }

    fn raw(&self, block: &Block) -> &str {
        &self.result[block.raw.clone()]
    }

    fn structured(&self) -> Option<&str> {
        self.structured.as_ref().map(|r| &self.result[r.clone()])
    }

    fn piece_count(&self) -> usize {
        self.blocks.len() + usize::from(matches!(self.mirror, Mirror::Own { .. }))
    }

    /// The extra bytes that a piece's page costs in `structuredContent` when it is mirrored.
    fn mirror_factor(&self, piece: usize) -> usize {
        if self.reads != Reads::Both {
            return 1;
        }
        match &self.mirror {
            Mirror::Json { block, .. } | Mirror::Field { block, .. } if *block == piece => 2,
            _ => 1,
        }
    }

    fn page_in(
        &self,
        at: At,
        room: usize,
        tool: &str,
        key: &CursorKey,
        digest: &SelectionDigest,
    ) -> Result<AutoPage, Unpageable> {
        let count = self.piece_count();
        if at.piece >= count.max(1) && !(count == 0 && at.piece == 0) {
            return Err(Unpageable::Gone);
        }
        let mut used = self.fixed();
        if used > room {
            return Err(self.repeated_too_large(used));
        }
        let mut taken: Vec<Taken> = Vec::new();
        let mut next = None;
        let mut piece = at.piece;
        let mut offset = at.offset;
        while piece < count {
            let left = room.saturating_sub(used);
            let factor = self.mirror_factor(piece);
            let first = taken.is_empty();
            let (to, done, cost) = match self.piece_kind(piece) {
                PieceKind::Whole(raw) => {
                    if raw.len() + 1 > left {
                        if first {
                            return Err(Unpageable::TooLarge {
                                what: whole_what(raw),
                                bytes: raw.len(),
                            });
                        }
                        next = Some(At {
                            piece,
                            offset: 0,
                            fingerprint: self.fingerprint,
                        });
                        break;
                    }
                    (1, true, raw.len() + 1)
                }
                PieceKind::Lines(inner) => {
                    if offset > inner.len() {
                        return Err(Unpageable::Gone);
                    }
                    let budget = left / factor;
                    // A text rule's page size, unless not even one line fits in it.
                    let limited = self
                        .text_limit
                        .filter(|limit| *limit < budget)
                        .and_then(|limit| line_end_before(inner, offset, offset + limit))
                        .filter(|end| *end > offset);
                    match limited.or_else(|| line_end_before(inner, offset, offset + budget)) {
                        Some(end) if end > offset || inner.is_empty() => {
                            (end, end >= inner.len(), (end - offset) * factor + 2)
                        }
                        _ if first => {
                            let end = first_line_end(inner, offset);
                            return Err(Unpageable::TooLarge {
                                what: format!("line {} of its text", line_number(inner, offset)),
                                bytes: end - offset,
                            });
                        }
                        _ => {
                            next = Some(At {
                                piece,
                                offset,
                                fingerprint: self.fingerprint,
                            });
                            break;
                        }
                    }
                }
                PieceKind::Items {
                    doc,
                    array,
                    in_text,
                    around,
                } => {
                    if offset > array.elements.len() {
                        return Err(Unpageable::Gone);
                    }
                    let mut end = offset;
                    // The document around the list is on every page of it.
                    let mut cost = around;
                    let mut text = around;
                    while end < array.elements.len() {
                        let element = &doc[array.elements[end].clone()];
                        let size = if in_text {
                            escaped_len(element)
                        } else {
                            element.len()
                        } + 1;
                        // A text rule's page size bounds the text, past the first item.
                        if end > offset && self.text_limit.is_some_and(|limit| text + size > limit)
                        {
                            break;
                        }
                        text += size;
                        let size = size * factor;
                        if cost + size > left {
                            break;
                        }
                        cost += size;
                        end += 1;
                    }
                    if end == offset && offset < array.elements.len() {
                        if first {
                            return Err(Unpageable::TooLarge {
                                what: format!(
                                    "item {} of {}",
                                    offset + 1,
                                    raw::path_text(&array.path)
                                ),
                                bytes: array.elements[offset].len(),
                            });
                        }
                        next = Some(At {
                            piece,
                            offset,
                            fingerprint: self.fingerprint,
                        });
                        break;
                    }
                    (end, end >= array.elements.len(), cost)
                }
            };
            used += cost;
            taken.push(Taken {
                piece,
                from: offset,
                to,
            });
            if !done {
                next = Some(At {
                    piece,
                    offset: to,
                    fingerprint: self.fingerprint,
                });
                break;
            }
            piece += 1;
            offset = 0;
        }
        if next.is_none() && piece < count && taken.is_empty() {
            return Err(Unpageable::Gone);
        }
        Ok(self.write(at, &taken, next, tool, key, digest))
    }

    /// The bytes every page repeats: the result's other members, and the part of
    /// `structuredContent` that is not paged.
    fn fixed(&self) -> usize {
        let fixed: usize = self
            .members
            .iter()
            .filter(|(k, _)| k != "content" && k != "structuredContent")
            .map(|(k, r)| k.len() + r.len() + 4)
            .sum();
        fixed
            + match (&self.mirror, self.structured()) {
                (Mirror::None, Some(s)) => s.len(),
                (Mirror::Json { array, .. } | Mirror::Own { array }, Some(s)) => {
                    s.len() - array.span.len()
                }
                (Mirror::Field { member, .. }, Some(s)) => s.len() - member.len(),
                _ => 0,
            }
    }

    fn repeated_too_large(&self, bytes: usize) -> Unpageable {
        Unpageable::TooLarge {
            what: "the part that every page must repeat (structuredContent with no list to page, or the result's other fields)".into(),
            bytes,
        }
    }

    /// The first piece of the result that no page can hold, if any: an image, a line or an
    /// item larger than a page's room.
    fn unsplittable(&self, room: usize) -> Option<Unpageable> {
        let fixed = self.fixed();
        if fixed > room {
            return Some(self.repeated_too_large(fixed));
        }
        let left = room - fixed;
        for piece in 0..self.piece_count() {
            let factor = self.mirror_factor(piece);
            match self.piece_kind(piece) {
                PieceKind::Whole(raw) if raw.len() + 1 > left => {
                    return Some(Unpageable::TooLarge {
                        what: whole_what(raw),
                        bytes: raw.len(),
                    });
                }
                PieceKind::Whole(_) => {}
                PieceKind::Lines(inner) => {
                    let mut start = 0;
                    let mut line = 1;
                    while start < inner.len() {
                        let end = first_line_end(inner, start);
                        if (end - start) * factor + 2 > left {
                            return Some(Unpageable::TooLarge {
                                what: format!("line {line} of its text"),
                                bytes: end - start,
                            });
                        }
                        start = end;
                        line += 1;
                    }
                }
                PieceKind::Items {
                    doc,
                    array,
                    in_text,
                    around,
                } => {
                    for (index, element) in array.elements.iter().enumerate() {
                        let text = &doc[element.clone()];
                        let size = if in_text {
                            escaped_len(text)
                        } else {
                            text.len()
                        } + 1;
                        if around + size * factor > left {
                            return Some(Unpageable::TooLarge {
                                what: format!(
                                    "item {} of {}",
                                    index + 1,
                                    raw::path_text(&array.path)
                                ),
                                bytes: text.len(),
                            });
                        }
                    }
                }
            }
        }
        None
    }

    fn piece_kind(&self, piece: usize) -> PieceKind<'_> {
        if piece < self.blocks.len() {
            let block = &self.blocks[piece];
            match &block.kind {
                Kind::Whole => PieceKind::Whole(self.raw(block)),
                Kind::Lines { literal } => {
                    PieceKind::Lines(&self.raw(block)[literal.start + 1..literal.end - 1])
                }
                Kind::Items {
                    doc, array, around, ..
                } => PieceKind::Items {
                    doc,
                    array,
                    in_text: true,
                    around: *around,
                },
            }
        } else {
            match (&self.mirror, self.structured()) {
                (Mirror::Own { array }, Some(doc)) => PieceKind::Items {
                    doc,
                    array,
                    in_text: false,
                    around: 0,
                },
                _ => PieceKind::Whole(""),
            }
        }
    }

    /// Writes the page: the result's members in their order, `content` and
    /// `structuredContent` cut to what was taken, the continuation in both.
    fn write(
        &self,
        at: At,
        taken: &[Taken],
        next: Option<At>,
        tool: &str,
        key: &CursorKey,
        digest: &SelectionDigest,
    ) -> AutoPage {
        let cursor = next.map(|n| key.mint(&n.position(self.rerun), digest));
        let reference = self
            .reference
            .as_deref()
            .filter(|_| cursor.is_some() || !at.first());
        let (mut notice, total_count) = self.notice(at, taken, tool, cursor.as_deref());
        if let Some(reference) = reference {
            notice.push(' ');
            notice.push_str(&super::reference::sentence(reference));
        }
        let mut blocks: Vec<String> = Vec::new();
        // The text literal written for each taken text block, for a structured field mirror.
        let mut literals: Vec<(usize, String)> = Vec::new();
        for t in taken.iter().filter(|t| t.piece < self.blocks.len()) {
            let block = &self.blocks[t.piece];
            let raw_block = self.raw(block);
            match &block.kind {
                Kind::Whole => blocks.push(raw_block.to_string()),
                Kind::Lines { literal } => {
                    let inner = &raw_block[literal.start + 1..literal.end - 1];
                    let text = format!("\"{}\"", &inner[t.from..t.to]);
                    blocks.push(with_literal(raw_block, literal, &text));
                    literals.push((t.piece, text));
                }
                Kind::Items {
                    literal,
                    doc,
                    array,
                    ..
                } => {
                    let page = cut(doc, array, t.from, t.to);
                    let text = serde_json::Value::String(page).to_string();
                    blocks.push(with_literal(raw_block, literal, &text));
                    literals.push((t.piece, text));
                }
            }
        }
        blocks.push(serde_json::json!({"type": "text", "text": notice}).to_string());
        let structured = self.structured().map(|doc| {
            let body = match &self.mirror {
                Mirror::None => doc.to_string(),
                Mirror::Json { block, array } => match taken.iter().find(|t| t.piece == *block) {
                    Some(t) => cut(doc, array, t.from, t.to),
                    None => cut(doc, array, 0, 0),
                },
                Mirror::Own { array } => {
                    match taken.iter().find(|t| t.piece == self.blocks.len()) {
                        Some(t) => cut(doc, array, t.from, t.to),
                        None => cut(doc, array, 0, 0),
                    }
                }
                Mirror::Field { block, member } => {
                    let value = literals
                        .iter()
                        .find(|(piece, _)| piece == block)
                        .map_or("\"\"", |(_, text)| text.as_str());
                    format!("{}{}{}", &doc[..member.start], value, &doc[member.end..])
                }
            };
            decorate(&body, cursor.as_deref(), total_count, &notice, reference)
        });
        // An array has no room for the continuation: it goes in the result's `_meta`, under
        // the proxy's own key (and in the notice block, as always).
        let meta_continuation = structured
            .as_deref()
            .filter(|s| s.trim_start().starts_with('['))
            .map(|_| continuation(cursor.as_deref(), total_count, &notice, reference));
        let mut wrote_meta = false;
        let mut out = String::with_capacity(self.result.len().min(1 << 20));
        out.push('{');
        let mut first = true;
        let mut wrote_content = false;
        for (name, range) in &self.members {
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(&serde_json::Value::String(name.clone()).to_string());
            out.push(':');
            match name.as_str() {
                "content" => {
                    out.push('[');
                    out.push_str(&blocks.join(","));
                    out.push(']');
                    wrote_content = true;
                }
                "structuredContent" => match &structured {
                    Some(s) => out.push_str(s),
                    None => out.push_str(&self.result[range.clone()]),
                },
                "_meta" if meta_continuation.is_some() => {
                    let meta = &self.result[range.clone()];
                    let added = meta_continuation.as_deref().unwrap_or_default();
                    match meta.trim_start().strip_prefix('{') {
                        Some(rest) => {
                            let comma = if rest.trim_start().starts_with('}') {
                                ""
                            } else {
                                ","
                            };
                            out.push('{');
                            out.push_str(added);
                            out.push_str(comma);
                            out.push_str(rest);
                        }
                        None => out.push_str(meta),
                    }
                    wrote_meta = true;
                }
                _ => out.push_str(&self.result[range.clone()]),
            }
        }
        if let Some(added) = meta_continuation.as_deref()
            && !wrote_meta
        {
            out.push_str(",\"_meta\":{");
            out.push_str(added);
            out.push('}');
        }
        if !wrote_content {
            if !first {
                out.push(',');
            }
            out.push_str("\"content\":[");
            out.push_str(&blocks.join(","));
            out.push(']');
        }
        out.push('}');
        AutoPage { result: out, next }
    }
}

enum PieceKind<'a> {
    Whole(&'a str),
    /// The inside of a text literal.
    Lines(&'a str),
    Items {
        doc: &'a str,
        array: &'a FoundArray,
        in_text: bool,
        /// The document around the list, as it costs on every page.
        around: usize,
    },
}

fn whole_what(raw: &str) -> String {
    let kind = raw::members(raw)
        .and_then(|m| {
            m.into_iter()
                .find(|(k, _)| k == "type")
                .and_then(|(_, r)| serde_json::from_str::<String>(&raw[r]).ok())
        })
        .unwrap_or_else(|| "content".into());
    format!("one {kind} block")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> CursorKey {
        CursorKey::from_secret(b"test")
    }

    /// Follows a chain of pages to its end; returns the pages.
    fn chain(result: &str, max_bytes: usize) -> Vec<String> {
        let mut at = At::default();
        let mut pages = Vec::new();
        loop {
            let page = page(result, at, max_bytes, "t", &key(), &[0; 16]).unwrap();
            assert!(
                page.result.len() < max_bytes,
                "{} ≥ {max_bytes}",
                page.result.len()
            );
            serde_json::from_str::<serde_json::Value>(&page.result).unwrap();
            pages.push(page.result);
            match page.next {
                Some(next) => at = next,
                None => return pages,
            }
        }
    }

    fn texts(page: &str) -> Vec<String> {
        let value: serde_json::Value = serde_json::from_str(page).unwrap();
        value["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["text"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    #[test]
    fn same_tokens_is_json_equality_for_the_same_spelling() {
        assert!(same_tokens(r#"{"a": [1, "x y"]}"#, "{\"a\":[1,\"x y\"]}"));
        assert!(same_tokens("[\n  1,\n  2\n]", "[1,2]"));
        assert!(!same_tokens(r#"{"a":"x y"}"#, r#"{"a":"xy"}"#));
        assert!(!same_tokens(r#"{"a":"\""}"#, r#"{"a":"\\"}"#));
        assert!(!same_tokens("[1,2]", "[1,2,3]"));
        assert!(!same_tokens(r#""a\"b""#, r#""a\"c""#));
    }

    #[test]
    fn text_pages_concatenate_to_the_text_and_keep_its_escapes() {
        let text: String = (0..400)
            .map(|i| format!("line {i} caf\u{e9} \"quoted\" tab\t/\n"))
            .collect();
        let literal = serde_json::Value::String(text.clone()).to_string();
        let literal = literal.replace('é', "\\u00e9");
        let result = format!(
            r#"{{"content":[{{"type":"text","text":{literal}}}],"structuredContent":{{"content":{literal}}}}}"#
        );
        let pages = chain(&result, 3000);
        assert!(pages.len() > 3);
        let mut joined = String::new();
        let mut structured = String::new();
        for page in &pages {
            assert!(page.contains("\\u00e9"), "the escape stays as written");
            let t = texts(page);
            joined.push_str(&t[0]);
            let v: serde_json::Value = serde_json::from_str(page).unwrap();
            structured.push_str(v["structuredContent"]["content"].as_str().unwrap());
            assert!(v["structuredContent"]["notice"].is_string());
        }
        assert_eq!(joined, text);
        assert_eq!(structured, text);
    }

    #[test]
    fn what_no_page_can_hold_is_refused_on_the_first_call() {
        // Short lines, then one longer than the whole budget: no first page that promises more.
        let text = format!("{}{}\n", "a\n".repeat(10), "x".repeat(5000));
        let result = format!(
            r#"{{"content":[{{"type":"text","text":{}}}]}}"#,
            serde_json::Value::String(text)
        );
        assert_eq!(
            page(&result, At::default(), 3000, "t", &key(), &[0; 16]).unwrap_err(),
            Unpageable::TooLarge {
                what: "line 11 of its text".into(),
                bytes: 5002
            }
        );
        // A text followed by an image larger than the budget: the same.
        let image = format!(
            r#"{{"type":"image","data":"{}","mimeType":"image/png"}}"#,
            "A".repeat(5000)
        );
        let result = format!(r#"{{"content":[{{"type":"text","text":"hi"}},{image}]}}"#);
        assert!(matches!(
            page(&result, At::default(), 3000, "t", &key(), &[0; 16]),
            Err(Unpageable::TooLarge { .. })
        ));
    }

    #[test]
    fn json_pages_keep_the_document_and_the_servers_bytes() {
        let items: Vec<String> = (0..300)
            .map(|i| format!(r#"{{"n":{i}.50,"big":123456789012345678901234567890,"s":"\u00e9"}}"#))
            .collect();
        let doc = format!(
            r#"{{"total":300,"entries":[{}],"tail":true}}"#,
            items.join(", ")
        );
        let text = serde_json::Value::String(doc.clone()).to_string();
        let result =
            format!(r#"{{"content":[{{"type":"text","text":{text}}}],"structuredContent":{doc}}}"#);
        let pages = chain(&result, 6000);
        assert!(pages.len() > 3);
        let mut got = Vec::new();
        for page in &pages {
            let v: serde_json::Value = serde_json::from_str(page).unwrap();
            let inner = texts(page)[0].clone();
            let from_text: serde_json::Value = serde_json::from_str(&inner).unwrap();
            assert_eq!(from_text["total"], 300);
            assert_eq!(from_text["tail"], true);
            let n = from_text["entries"].as_array().unwrap().len();
            assert_eq!(
                v["structuredContent"]["entries"].as_array().unwrap().len(),
                n
            );
            assert_eq!(v["structuredContent"]["total_count"], 300);
            // The items are the server's bytes.
            let raw_entries = &page[page.find(r#""structuredContent""#).unwrap()..];
            assert!(raw_entries.contains("123456789012345678901234567890"));
            assert!(raw_entries.contains(r#""s":"\u00e9""#));
            got.extend(from_text["entries"].as_array().unwrap().iter().cloned());
        }
        assert_eq!(got.len(), 300);
    }

    #[test]
    fn an_image_larger_than_the_budget_is_refused_and_blocks_page_in_order() {
        let image = format!(
            r#"{{"type":"image","data":"{}","mimeType":"image/png"}}"#,
            "A".repeat(5000)
        );
        let result = format!(r#"{{"content":[{image}]}}"#);
        let err = page(&result, At::default(), 2000, "t", &key(), &[0; 16]).unwrap_err();
        assert_eq!(
            err,
            Unpageable::TooLarge {
                what: "one image block".into(),
                bytes: image.len()
            }
        );
        let blocks: Vec<String> = (0..20)
            .map(|i| {
                format!(
                    r#"{{"type":"text","text":"block {i} {}"}}"#,
                    "x".repeat(200)
                )
            })
            .collect();
        let result = format!(r#"{{"content":[{}],"isError":false}}"#, blocks.join(","));
        let pages = chain(&result, 2500);
        let all: Vec<String> = pages
            .iter()
            .flat_map(|p| {
                let t = texts(p);
                t[..t.len() - 1].to_vec()
            })
            .collect();
        assert_eq!(all.len(), 20);
        for (i, t) in all.iter().enumerate() {
            assert!(t.starts_with(&format!("block {i} ")));
        }
    }
}
