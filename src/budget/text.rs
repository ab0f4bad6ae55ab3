//! Stage: text pages. A long plain-text result (a file, a diff, a log) is cut into pages of
//! whole lines under a byte budget, so that the pages concatenate to the original exactly.
//! A single line longer than the budget is split, at a UTF-8 character boundary, and the
//! notice says so.

/// One page of a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextPage {
    /// Byte range of the page in the text.
    pub start: usize,
    pub end: usize,
    /// 1-based numbers of the first and last line the page touches.
    pub first_line: usize,
    pub last_line: usize,
    pub total_lines: usize,
    /// The page holds only part of a line (it was longer than the budget).
    pub split_line: bool,
}

fn line_number(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// The page of `text` starting at byte `start` (clamped to a character boundary), at most
/// `budget` bytes, ending after a newline unless a single line is longer than the budget.
pub fn page(text: &str, start: usize, budget: usize) -> TextPage {
    let budget = budget.max(4); // room for any one UTF-8 character
    let mut start = start.min(text.len());
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let limit = (start + budget).min(text.len());
    let (end, split_line) = if limit == text.len() {
        (limit, false)
    } else {
        match text.as_bytes()[start..limit]
            .iter()
            .rposition(|b| *b == b'\n')
        {
            Some(newline) => (start + newline + 1, false),
            None => {
                // One line longer than the budget: split it where a character ends.
                let mut cut = limit;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                (cut, true)
            }
        }
    };
    let total_lines = text.lines().count().max(1);
    let first_line = line_number(text, start);
    let last_line = if end > start && text.as_bytes()[end - 1] == b'\n' {
        line_number(text, end - 1)
    } else {
        line_number(text, end)
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

/// The notice that follows a page.
pub fn notice(
    page: &TextPage,
    total_bytes: usize,
    tool: &str,
    next_after: Option<&str>,
    budget: usize,
) -> String {
    let mut text = format!(
        "Lines {}-{} of {} (bytes {}-{} of {}).",
        page.first_line, page.last_line, page.total_lines, page.start, page.end, total_bytes
    );
    if page.split_line {
        text.push_str(&format!(
            " Line {} is longer than the page budget of {budget} bytes, so it is split across pages; this page ends inside it.",
            page.last_line
        ));
    }
    match next_after {
        Some(cursor) => text.push_str(&format!(
            " More remain: call {tool} again with after:\"{cursor}\" and the same other arguments for the next page (the pages concatenate to the whole text)."
        )),
        None if page.start > 0 => text.push_str(" This is the last page."),
        None => {}
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_pages(text: &str, budget: usize) -> Vec<TextPage> {
        let mut pages = Vec::new();
        let mut start = 0;
        loop {
            let p = page(text, start, budget);
            start = p.end;
            pages.push(p);
            if start >= text.len() {
                return pages;
            }
        }
    }

    #[test]
    fn pages_hold_whole_lines_and_concatenate_to_the_text() {
        let text = "alpha\nbeta\ngamma\ndelta\n";
        let pages = all_pages(text, 12);
        let joined: String = pages.iter().map(|p| &text[p.start..p.end]).collect();
        assert_eq!(joined, text);
        assert_eq!(&text[pages[0].start..pages[0].end], "alpha\nbeta\n");
        assert_eq!(
            (
                pages[0].first_line,
                pages[0].last_line,
                pages[0].total_lines
            ),
            (1, 2, 4)
        );
        assert_eq!(&text[pages[1].start..pages[1].end], "gamma\ndelta\n");
        assert_eq!((pages[1].first_line, pages[1].last_line), (3, 4));
    }

    #[test]
    fn a_line_over_the_budget_is_split_at_a_character_boundary() {
        let text = "short\nééééééééé\nend";
        let pages = all_pages(text, 7);
        let joined: String = pages.iter().map(|p| &text[p.start..p.end]).collect();
        assert_eq!(joined, text);
        assert!(pages.iter().any(|p| p.split_line));
        for p in &pages {
            assert!(text.is_char_boundary(p.start) && text.is_char_boundary(p.end));
            assert!(p.end - p.start <= 7);
        }
    }

    #[test]
    fn notices() {
        let p = TextPage {
            start: 0,
            end: 120,
            first_line: 1,
            last_line: 10,
            total_lines: 40,
            split_line: false,
        };
        assert_eq!(
            notice(&p, 500, "read_text_file", Some("CUR"), 120),
            "Lines 1-10 of 40 (bytes 0-120 of 500). More remain: call read_text_file again with after:\"CUR\" and the same other arguments for the next page (the pages concatenate to the whole text)."
        );
        let last = TextPage {
            start: 400,
            end: 500,
            first_line: 31,
            last_line: 40,
            total_lines: 40,
            split_line: false,
        };
        assert_eq!(
            notice(&last, 500, "t", None, 120),
            "Lines 31-40 of 40 (bytes 400-500 of 500). This is the last page."
        );
    }
}
