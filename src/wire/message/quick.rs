//! The hand reader of the common message's envelope: the same envelope serde's read gives
//! ([`super::Envelope`]), for an object whose keys have no escapes and whose `params` and
//! `_meta` are objects; anything else is left to serde, which decides.

use super::envelope::{Envelope, Params, client_name, meta_version};
use super::two_ways::number_reads_one_way;
use super::{META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_VERSION, Problem};

/// A cursor over a line's text that checks JSON as serde_json does, for [`quick_envelope`].
struct Scan<'a> {
    text: &'a str,
    at: usize,
    /// The first thing the common JSON readers read differently (as
    /// [`super::two_ways::read_two_ways`] finds it), noted on the way.
    two_ways: Option<Problem>,
}

/// Where in `bytes` a string's plain run stops: at a quote, a backslash or a control
/// character. Eight bytes at a time (a word's bytes compared at once).
pub(super) fn stop_at(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut at = 0;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let mut word = [0; 8];
        word.copy_from_slice(chunk);
        let word = u64::from_le_bytes(word);
        let quote = word ^ (ONES * u64::from(b'"'));
        let backslash = word ^ (ONES * u64::from(b'\\'));
        // A byte's high bit is set where it is zero (a quote or backslash found) or under 0x20;
        // bits above the first such byte may be wrong, the lowest one is not.
        let found = (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (word.wrapping_sub(ONES * 0x20) & !word);
        let found = found & HIGH;
        if found != 0 {
            return Some(at + (found.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    bytes[at..]
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .map(|stop| at + stop)
}

/// Values nested deeper than this are left to serde (which reads them without a limit).
const QUICK_DEPTH: usize = 64;

impl<'a> Scan<'a> {
    fn byte(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    /// Past JSON's whitespace (space, tab, line feed, carriage return).
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.byte() {
            self.at += 1;
        }
    }

    fn eat(&mut self, expected: u8) -> Option<()> {
        (self.byte()? == expected).then(|| self.at += 1)
    }

    /// The string at the cursor (at its opening quote): the text between its quotes, and
    /// whether it has escapes. Control characters and bad escapes are refused, as serde does.
    fn string(&mut self) -> Option<(&'a str, bool)> {
        let start = self.at + 1;
        let escaped = self.skip_string()?;
        Some((self.text.get(start..self.at - 1)?, escaped))
    }

    /// Past the string at the cursor: whether it has escapes.
    fn skip_string(&mut self) -> Option<bool> {
        self.eat(b'"')?;
        let bytes = self.text.as_bytes();
        let mut escaped = false;
        loop {
            self.at += stop_at(bytes.get(self.at..)?)?;
            match bytes[self.at] {
                b'"' => {
                    self.at += 1;
                    return Some(escaped);
                }
                b'\\' => {
                    escaped = true;
                    match bytes.get(self.at + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.at += 2,
                        b'u' => {
                            let unit = hex_unit(bytes.get(self.at + 2..self.at + 6)?)?;
                            self.at += 6;
                            match unit {
                                // A high surrogate is half of a pair only with a low one next.
                                0xD800..=0xDBFF => {
                                    let low = bytes
                                        .get(self.at..self.at + 6)
                                        .filter(|next| next.starts_with(b"\\u"))
                                        .and_then(|next| hex_unit(&next[2..]));
                                    match low {
                                        Some(0xDC00..=0xDFFF) => self.at += 6,
                                        _ => self.lone_surrogate(),
                                    }
                                }
                                0xDC00..=0xDFFF => self.lone_surrogate(),
                                _ => {}
                            }
                        }
                        _ => return None,
                    }
                }
                _ => return None,
            }
        }
    }

    fn lone_surrogate(&mut self) {
        self.two_ways.get_or_insert(Problem::LoneSurrogate);
    }

    /// Past a run of digits: how many (at least one).
    fn digits(&mut self) -> Option<usize> {
        let start = self.at;
        while let Some(b'0'..=b'9') = self.byte() {
            self.at += 1;
        }
        (self.at > start).then_some(self.at - start)
    }

    /// A number, as JSON writes one (no leading zeros, no bare point or exponent).
    fn number(&mut self) -> Option<()> {
        let start = self.at;
        if self.byte() == Some(b'-') {
            self.at += 1;
        }
        let whole = match self.byte()? {
            b'0' => {
                self.at += 1;
                1
            }
            b'1'..=b'9' => self.digits()?,
            _ => return None,
        };
        if self.byte() == Some(b'.') {
            self.at += 1;
            self.digits()?;
        }
        let mut exponent = false;
        if let Some(b'e' | b'E') = self.byte() {
            exponent = true;
            self.at += 1;
            if let Some(b'+' | b'-') = self.byte() {
                self.at += 1;
            }
            self.digits()?;
        }
        // Under 16 digits and no exponent, every reader reads the same value.
        if (whole >= 16 || exponent) && !number_reads_one_way(&self.text.as_bytes()[start..self.at])
        {
            self.two_ways.get_or_insert(Problem::UnsafeNumber);
        }
        Some(())
    }

    /// The value at the cursor, checked and skipped: its text.
    fn value(&mut self, depth: usize) -> Option<&'a str> {
        let start = self.at;
        self.skip(depth)?;
        self.text.get(start..self.at)
    }

    /// Past the value at the cursor, checked.
    fn skip(&mut self, depth: usize) -> Option<()> {
        match self.byte()? {
            b'"' => self.skip_string().map(drop),
            b'{' | b'[' if depth >= QUICK_DEPTH => None,
            b'{' => self.sequence(b'}', |scan| {
                scan.skip_string()?;
                scan.ws();
                scan.eat(b':')?;
                scan.ws();
                scan.skip(depth + 1)
            }),
            b'[' => self.sequence(b']', |scan| scan.skip(depth + 1)),
            b't' => self.literal("true"),
            b'f' => self.literal("false"),
            b'n' => self.literal("null"),
            _ => self.number(),
        }
    }

    /// The object or array at the cursor (at its opening bracket; `close`, its closing one):
    /// `element` reads each member or element, the commas between them are checked here.
    fn sequence(
        &mut self,
        close: u8,
        mut element: impl FnMut(&mut Scan<'a>) -> Option<()>,
    ) -> Option<()> {
        self.at += 1;
        self.ws();
        if self.eat(close).is_some() {
            return Some(());
        }
        loop {
            self.ws();
            element(self)?;
            self.ws();
            match self.byte()? {
                b',' => self.at += 1,
                next if next == close => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    fn literal(&mut self, word: &str) -> Option<()> {
        self.text
            .get(self.at..)?
            .starts_with(word)
            .then(|| self.at += word.len())
    }

    /// The object at the cursor: `each(key, scan)` for each member, with the scan at its value,
    /// which `each` reads. A key with escapes is left to serde (it decodes keys).
    fn members(
        &mut self,
        mut each: impl FnMut(&'a str, &mut Scan<'a>) -> Option<()>,
    ) -> Option<()> {
        if self.byte()? != b'{' {
            return None;
        }
        self.sequence(b'}', |scan| {
            let (key, escaped) = scan.string()?;
            if escaped {
                return None;
            }
            scan.ws();
            scan.eat(b':')?;
            scan.ws();
            each(key, scan)
        })
    }
}

/// The UTF-16 unit of a `\\u` escape's four hex digits.
fn hex_unit(hex: &[u8]) -> Option<u16> {
    if hex.len() != 4 || !hex.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u16::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
}

/// Notes `name` seen; `None` when it was seen before (a duplicate is left to serde, which
/// names it).
fn first(seen: &mut bool) -> Option<()> {
    (!std::mem::replace(seen, true)).then_some(())
}

/// The keys of one object the hand reader has seen (without escapes): `None` for a key seen
/// before, or past eight keys (both left to serde, which decides).
#[derive(Default)]
struct Few<'a> {
    keys: [&'a str; 8],
    len: usize,
}

impl<'a> Few<'a> {
    fn add(&mut self, key: &'a str) -> Option<()> {
        if self.keys[..self.len].contains(&key) {
            return None;
        }
        *self.keys.get_mut(self.len)? = key;
        self.len += 1;
        Some(())
    }
}

/// The envelope of `text` (an object) read by hand, as the serde read ([`Envelope`]'s
/// `Deserialize`) reads it, for the common message: keys without escapes, `params` and its
/// `_meta` objects when present, no key the relay reads given twice. `None` for anything else,
/// valid or not: the serde read then decides (and names the error). Everything this accepts
/// serde accepts alike: every string, number and literal is checked as serde checks it.
pub(super) fn quick_envelope(text: &str) -> Option<Envelope<'_>> {
    let mut scan = Scan {
        text,
        at: 0,
        two_ways: None,
    };
    scan.ws();
    let mut out = Envelope::default();
    let [
        mut jsonrpc,
        mut id,
        mut method,
        mut result,
        mut error,
        mut params,
    ] = [false; 6];
    let mut keys = Few::default();
    scan.members(|key, scan| {
        keys.add(key)?;
        match key {
            "jsonrpc" => {
                first(&mut jsonrpc)?;
                scan.value(1)?;
            }
            "id" => {
                first(&mut id)?;
                out.id = Some(scan.value(1)?);
            }
            "method" => {
                first(&mut method)?;
                out.method = Some(scan.value(1)?);
            }
            "result" => {
                first(&mut result)?;
                out.result = Some(scan.value(1)?);
            }
            "error" => {
                first(&mut error)?;
                scan.value(1)?;
                out.error = true;
            }
            "params" => {
                first(&mut params)?;
                out.params = quick_params(scan)?;
            }
            _ => {
                scan.value(1)?;
            }
        }
        Some(())
    })?;
    scan.ws();
    out.two_ways = Some(scan.two_ways);
    (scan.at == text.len()).then_some(out)
}

/// `params`, when an object (see [`quick_envelope`]).
fn quick_params<'a>(scan: &mut Scan<'a>) -> Option<Params<'a>> {
    let mut out = Params {
        object: true,
        ..Params::default()
    };
    let [mut name, mut arguments, mut meta, mut task] = [false; 4];
    let mut keys = Few::default();
    scan.members(|key, scan| {
        keys.add(key)?;
        match key {
            "name" => {
                first(&mut name)?;
                out.named[0] = Some(scan.value(2)?);
            }
            "uri" => out.named[1] = Some(scan.value(2)?),
            "taskId" => out.named[2] = Some(scan.value(2)?),
            "arguments" => {
                first(&mut arguments)?;
                out.arguments = Some(scan.value(2)?);
            }
            "task" => {
                first(&mut task)?;
                scan.value(2)?;
            }
            "_meta" => {
                first(&mut meta)?;
                quick_meta(scan, &mut out)?;
            }
            _ => {
                scan.value(2)?;
            }
        }
        Some(())
    })?;
    Some(out)
}

/// `params._meta`, when an object, into `out` (see [`quick_envelope`]).
fn quick_meta<'a>(scan: &mut Scan<'a>, out: &mut Params<'a>) -> Option<()> {
    let [mut progress, mut version, mut client, mut capabilities] = [false; 4];
    let mut keys = Few::default();
    scan.members(|key, scan| {
        keys.add(key)?;
        match key {
            "progressToken" => {
                first(&mut progress)?;
                out.progress = Some(scan.value(3)?.into());
            }
            META_VERSION => {
                first(&mut version)?;
                out.version = Some(meta_version(scan.value(3)?));
            }
            META_CLIENT_INFO => {
                first(&mut client)?;
                out.client = client_name(scan.value(3)?);
            }
            META_CLIENT_CAPABILITIES => {
                first(&mut capabilities)?;
                scan.value(3)?;
                out.capabilities = true;
            }
            _ => {
                scan.value(3)?;
            }
        }
        Some(())
    })
}
