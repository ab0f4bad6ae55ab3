//! The notice an automatic page ends with: which part of the result it holds, and how to go
//! on.

use super::*;

impl Prepared {
    /// The notice a page ends with, and the count `total_count` reports.
    pub(super) fn notice(
        &self,
        at: At,
        taken: &[Taken],
        tool: &str,
        cursor: Option<&str>,
    ) -> (String, usize) {
        let mut parts = Vec::new();
        let mut total_count = 0;
        for (i, t) in taken.iter().enumerate() {
            let what = match self.piece_kind(t.piece) {
                PieceKind::Whole(_) => format!("content block {}", t.piece + 1),
                PieceKind::Lines(inner) => {
                    let index = self.blocks[t.piece]
                        .lines
                        .get_or_init(|| LineIndex::of(inner));
                    let lines = index.total;
                    if i == 0 {
                        total_count = lines;
                    }
                    let first = index.line(inner, t.from);
                    let last = if t.to > t.from {
                        index.line(inner, t.to.saturating_sub(1)).min(lines)
                    } else {
                        first
                    };
                    format!("lines {first}-{last} of {lines}")
                }
                PieceKind::Items { array, .. } => {
                    if i == 0 {
                        total_count = array.elements.len();
                    }
                    format!(
                        "{} {}-{} of {} in {}",
                        if array.object { "members" } else { "items" },
                        t.from + 1,
                        t.to,
                        array.elements.len(),
                        raw::path_text(&array.path)
                    )
                }
            };
            let whole = matches!(self.piece_kind(t.piece), PieceKind::Whole(_));
            let source = if t.piece < self.blocks.len() && self.blocks.len() > 1 && !whole {
                format!(" (content block {})", t.piece + 1)
            } else {
                String::new()
            };
            parts.push(format!("{what}{source}"));
        }
        let mut text = format!(
            "mcp-budget paged this result of {tool} ({} bytes, over the {}): this page holds {}.",
            self.result.len(),
            self.budget,
            parts.join("; ")
        );
        match cursor {
            Some(cursor) => text.push_str(&format!(
                " More remain: call {tool} again with the same arguments and {}:\"{cursor}\" for the next page; the pages together are the whole result.",
                self.argument
            )),
            None if !at.first() => text.push_str(" This is the last page."),
            None => {}
        }
        if let (Some(search), Some(_), true) = (&self.search, cursor, at.first()) {
            text.push(' ');
            text.push_str(search);
        }
        (text, total_count)
    }
}
