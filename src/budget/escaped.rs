//! Positions in the inside of a JSON string literal, still escaped: where its lines end, how
//! many lines lie between two offsets (with an index, so a later page need not count from the
//! start), and the length of a text once escaped.

/// Line counts at points of a text literal's inside, so that the line at any offset is found
/// without reading the text from its start: every page of a chain would otherwise read the
/// whole text again (a 10 MB text paged 51 times).
pub(super) struct LineIndex {
    /// (offset at an escape boundary, line ends before it), from (0, 0), about every
    /// `LINE_INDEX_STEP` bytes.
    pub(super) marks: Vec<(usize, usize)>,
    /// The text's line count, as a notice reports it.
    pub(super) total: usize,
}

pub(super) const LINE_INDEX_STEP: usize = 64 * 1024;

impl LineIndex {
    pub(super) fn of(inner: &str) -> LineIndex {
        let bytes = inner.as_bytes();
        let mut marks = vec![(0, 0)];
        let mut count = 0;
        let mut next = 0;
        for at in memchr::memchr_iter(b'\\', bytes) {
            if at < next {
                continue; // the second backslash of a `\\` escape
            }
            // `at` begins an escape: a boundary `newlines` may start from.
            if at >= marks[marks.len() - 1].0 + LINE_INDEX_STEP {
                marks.push((at, count));
            }
            next = at + 2;
            match bytes.get(at + 1) {
                Some(b'n') => count += usize::from(at + 2 <= bytes.len()),
                Some(b'u') => {
                    if at + 6 <= bytes.len()
                        && inner
                            .get(at + 2..at + 6)
                            .is_some_and(|hex| hex.eq_ignore_ascii_case("000a"))
                    {
                        count += 1;
                    }
                    next = at + 6;
                }
                _ => {}
            }
        }
        let lines = 1 + count;
        let total = if inner.ends_with("\\n") {
            lines - 1
        } else {
            lines
        }
        .max(1);
        LineIndex { marks, total }
    }

    /// The 1-based line at `offset` (as `line_number`).
    pub(super) fn line(&self, inner: &str, offset: usize) -> usize {
        let i = self.marks.partition_point(|(at, _)| *at <= offset).max(1) - 1;
        let (at, count) = self.marks[i];
        1 + count + newlines(inner, at, offset)
    }
}

/// The byte length of `text` once written inside a JSON string literal (an upper bound).
pub(super) fn escaped_len(text: &str) -> usize {
    text.len()
        + text
            .bytes()
            .map(|b| match b {
                b'"' | b'\\' => 1,
                0..=0x1f => 5,
                _ => 0,
            })
            .sum::<usize>()
}

/// Where lines end in a string literal's inside: just after each `\n` (or `\u000a`) escape.
pub(super) fn line_end_before(inner: &str, from: usize, limit: usize) -> Option<usize> {
    let bytes = inner.as_bytes();
    let mut i = from;
    let mut last = None;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            let step = match bytes.get(i + 1) {
                Some(b'u') => 6,
                _ => 2,
            };
            let newline = match bytes.get(i + 1) {
                Some(b'n') => true,
                Some(b'u') => inner
                    .get(i + 2..i + 6)
                    .is_some_and(|hex| hex.eq_ignore_ascii_case("000a")),
                _ => false,
            };
            i += step;
            if i > limit {
                return last;
            }
            if newline {
                last = Some(i);
            }
        } else {
            i += 1;
            if i > limit {
                return last;
            }
        }
    }
    // The text ends within the limit.
    Some(bytes.len())
}

/// The number of line ends (`\n` or `\u000a` escapes) in `inner[from..to]`; `from` is at an
/// escape boundary. Backslashes are found with memchr: text has about one per line.
pub(super) fn newlines(inner: &str, from: usize, to: usize) -> usize {
    let to = to.min(inner.len());
    let bytes = inner.as_bytes();
    let mut count = 0;
    let mut next = from;
    for at in memchr::memchr_iter(b'\\', &bytes[from.min(to)..to]) {
        let at = from + at;
        if at < next {
            continue; // the second backslash of a `\\` escape
        }
        match bytes.get(at + 1) {
            Some(b'n') => {
                if at + 2 <= to {
                    count += 1;
                }
                next = at + 2;
            }
            Some(b'u') => {
                if at + 6 <= to
                    && inner
                        .get(at + 2..at + 6)
                        .is_some_and(|hex| hex.eq_ignore_ascii_case("000a"))
                {
                    count += 1;
                }
                next = at + 6;
            }
            _ => next = at + 2,
        }
    }
    count
}

/// Where the line that begins at `from` ends (just after its line end, or at the end).
pub(super) fn first_line_end(inner: &str, from: usize) -> usize {
    let bytes = inner.as_bytes();
    let mut next = from;
    for at in memchr::memchr_iter(b'\\', &bytes[from.min(bytes.len())..]) {
        let at = from + at;
        if at < next {
            continue;
        }
        match bytes.get(at + 1) {
            Some(b'n') => return at + 2,
            Some(b'u') => {
                if inner
                    .get(at + 2..at + 6)
                    .is_some_and(|hex| hex.eq_ignore_ascii_case("000a"))
                {
                    return at + 6;
                }
                next = at + 6;
            }
            _ => next = at + 2,
        }
    }
    bytes.len()
}

/// The 1-based line at `offset` of the inside of a literal.
pub(super) fn line_number(inner: &str, offset: usize) -> usize {
    1 + newlines(inner, 0, offset)
}

#[cfg(test)]
mod line_index_tests {
    use super::*;

    /// The index gives every offset the line that reading from the start gives, across marks,
    /// with every escape a line end may be spelled with or confused with.
    #[test]
    fn the_index_counts_lines_as_reading_from_the_start_does() {
        let pieces = [
            "plain words ",
            "\\n",
            "\\u000a",
            "\\u000A",
            "\\\\n",
            "\\\"",
            "\\u0041",
            "\\\\",
            "\\t",
        ];
        let mut inner = String::new();
        let mut i = 0usize;
        while inner.len() < 3 * LINE_INDEX_STEP + 777 {
            inner.push_str(pieces[i % pieces.len()]);
            i = i.wrapping_mul(7).wrapping_add(3) % 1009;
        }
        let index = LineIndex::of(&inner);
        assert!(index.marks.len() >= 3, "marks: {}", index.marks.len());
        let whole = line_number(&inner, inner.len());
        let expected_total = if inner.ends_with("\\n") {
            whole - 1
        } else {
            whole
        }
        .max(1);
        assert_eq!(index.total, expected_total);
        let mut offsets: Vec<usize> = (0..=inner.len()).step_by(97).collect();
        for (at, _) in &index.marks {
            offsets.extend(at.saturating_sub(8)..(*at + 8).min(inner.len() + 1));
        }
        offsets.push(inner.len());
        for offset in offsets {
            assert_eq!(
                index.line(&inner, offset),
                line_number(&inner, offset),
                "offset {offset}"
            );
        }
    }

    #[test]
    fn a_text_without_line_ends_is_one_line() {
        for inner in ["", "one line", "ends with\\n"] {
            let index = LineIndex::of(inner);
            assert_eq!(index.total, 1, "{inner:?}");
            assert_eq!(
                index.line(inner, inner.len()),
                line_number(inner, inner.len())
            );
        }
    }
}
