//! What the common JSON readers (serde, JavaScript's `JSON.parse`, Python's `json`) read
//! differently: such a message is refused, never forwarded for a server to read its own way.

use super::Problem;

/// What in `text` (valid JSON) the common JSON readers read differently, if anything: a
/// `\u` escape of a lone UTF-16 surrogate (serde refuses it, JavaScript and Python keep it),
/// an integer JavaScript cannot hold exactly (|n| >= 2^53: Python and serde keep every
/// digit), or a number no double holds (1e400: Python and JavaScript read infinity, serde
/// refuses or keeps the text). One pass: strings are skipped a run at a time.
pub(super) fn read_two_ways(text: &[u8]) -> Option<Problem> {
    let mut at = 0;
    while at < text.len() {
        match text[at] {
            b'"' => {
                let end = string_end(text, at + 1);
                if has_lone_surrogate(&text[at + 1..end.min(text.len())]) {
                    return Some(Problem::LoneSurrogate);
                }
                at = end + 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = at;
                at += 1;
                while at < text.len()
                    && matches!(text[at], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')
                {
                    at += 1;
                }
                if !number_reads_one_way(&text[start..at]) {
                    return Some(Problem::UnsafeNumber);
                }
            }
            _ => at += 1,
        }
    }
    None
}

/// Where the string that starts at `from` (after its opening quote) ends: its closing quote.
fn string_end(text: &[u8], from: usize) -> usize {
    let mut at = from;
    while let Some(stop) = memchr::memchr2(b'"', b'\\', &text[at.min(text.len())..]) {
        at += stop;
        if text[at] == b'"' {
            return at;
        }
        at += 2; // an escape: the byte after the backslash is never the end
    }
    text.len()
}

/// Whether every common JSON reader reads the number `number` (JSON's grammar) as one value.
pub(super) fn number_reads_one_way(number: &[u8]) -> bool {
    let fraction_or_exponent = number.iter().any(|b| matches!(b, b'.' | b'e' | b'E'));
    let Ok(text) = std::str::from_utf8(number) else {
        return false;
    };
    if !fraction_or_exponent {
        let digits = text.strip_prefix('-').unwrap_or(text);
        // Under 2^53 = 9007199254740992: every reader holds it exactly.
        return digits.len() < 16 || (digits.len() == 16 && digits < "9007199254740992");
    }
    text.parse::<f64>().is_ok_and(f64::is_finite)
}

/// Whether `text` has a `\u` escape of a UTF-16 surrogate that is not half of a pair (a high
/// one followed by a low one). serde refuses such a string where it decodes it (a key, a
/// method, a name) and skips it elsewhere; JavaScript and Python keep it: two readings.
pub(super) fn has_lone_surrogate(text: &[u8]) -> bool {
    let hex = |at: usize| -> Option<u16> {
        let digits = std::str::from_utf8(text.get(at..at + 4)?).ok()?;
        u16::from_str_radix(digits, 16).ok()
    };
    let mut next = 0;
    for at in memchr::memchr_iter(b'\\', text) {
        if at < next {
            continue; // the escaped byte of a `\\` (or inside an escape already read)
        }
        match text.get(at + 1) {
            Some(b'u') => {
                next = at + 6;
                let Some(unit) = hex(at + 2) else { continue };
                match unit {
                    0xD800..=0xDBFF => {
                        let low = (text.get(at + 6..at + 8) == Some(&b"\\u"[..]))
                            .then(|| hex(at + 8))
                            .flatten();
                        if !matches!(low, Some(0xDC00..=0xDFFF)) {
                            return true;
                        }
                        next = at + 12;
                    }
                    0xDC00..=0xDFFF => return true,
                    _ => {}
                }
            }
            _ => next = at + 2,
        }
    }
    false
}
