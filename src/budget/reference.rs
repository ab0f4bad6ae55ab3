//! Result references: a sealed name for a whole result the proxy holds in its cache, which a
//! client passes as an argument's whole value (`"mcpb-ref.…"`, or `"mcpb-ref.…#/json/pointer"`
//! for one part of a JSON result); the proxy puts the result in its place before the call goes
//! upstream, so a big result moves from one tool to another without passing through the model.
//!
//! A reference is sealed like a task token ([`CursorKey::seal`]): bound to the principal it was
//! shown to and to the result's fingerprint, under the cursor key. Only a string whose whole
//! value is a reference is replaced: a reference inside a longer string, or as a key, is text.

use std::ops::Range;

use super::cursor::{CursorKey, SealError, SelectionDigest};
use super::raw;

/// What every reference starts with.
pub const PREFIX: &str = "mcpb-ref.";

/// The purpose references are sealed for (a token of another purpose never opens as one).
const PURPOSE: &str = "result ref";

/// References are replaced at most this many levels deep in a call's arguments.
pub const MAX_DEPTH: usize = 32;

/// At most this many references in one call.
pub const MAX_REFERENCES: usize = 16;

/// The sentence a page cut from a cached result carries, to tell the model references exist.
pub fn sentence(reference: &str) -> String {
    format!(
        "To pass the whole result to another tool without reading it, give result_ref:\"{reference}\" as an argument's whole value (add #/json/pointer for one part of JSON)."
    )
}

/// The reference to the result cached under `digest` with `fingerprint`, for `owner`.
pub fn mint(key: &CursorKey, owner: &str, digest: &SelectionDigest, fingerprint: u64) -> String {
    let mut body = Vec::with_capacity(24);
    body.extend_from_slice(digest);
    body.extend_from_slice(&fingerprint.to_le_bytes());
    format!("{PREFIX}{}", key.seal(PURPOSE, owner, &body))
}

/// What a reference names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// The cache entry of the whole result (the chain's digest).
    pub digest: SelectionDigest,
    /// The result's fingerprint when the reference was made.
    pub fingerprint: u64,
    /// The RFC 6901 pointer after `#`, when one was given (`""`: the whole document).
    pub pointer: Option<String>,
}

/// Why a reference was not replaced. Each says what happened and what to do; the call is never
/// sent with the reference in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefError {
    #[error(
        "result_ref {0} was not issued by this proxy as it stands (it is malformed, altered or cut): copy the result_ref of a page exactly, or read the result again for a new one. The call was not sent."
    )]
    Invalid(String),
    #[error(
        "result_ref {0} was issued by another mcp-budget instance, or before this proxy's key changed (a restart without a persistent key): read the result again for a new reference. The call was not sent."
    )]
    OtherKey(String),
    #[error(
        "result_ref {0} belongs to another client of this proxy: read the result yourself to get a reference of your own. The call was not sent."
    )]
    OtherOwner(String),
    #[error(
        "The result result_ref {shown} names is no longer in mcp-budget's cache (results are kept {ttl} seconds, within {limit} bytes, for the client that read them), or the tool answered otherwise since: call the tool again and pass the result_ref of its new page. The call was not sent."
    )]
    Gone {
        shown: String,
        ttl: u64,
        limit: usize,
    },
    #[error(
        "result_ref {shown} names nothing in the result: {why} (pointers are RFC 6901, items counted from 0). The call was not sent."
    )]
    Pointer { shown: String, why: String },
    #[error(
        "result_ref {0} selects a part of a result that is not JSON: pass the reference without # to pass the whole text. The call was not sent."
    )]
    NotJson(String),
    #[error(
        "result_ref {shown} names a result that {why}, which an argument cannot hold whole: pass a part of its JSON (add #/json/pointer) or the content itself. The call was not sent."
    )]
    Unusable { shown: String, why: String },
    #[error(
        "A result_ref in argument {0}, which travels as an HTTP header too (x-mcp-header), is not replaced: pass the value itself. The call was not sent."
    )]
    InHeader(String),
    #[error(
        "With its result references replaced, this call holds JSON that readers read differently ({0}): pass a part of the result (add #/json/pointer) or the content itself. The call was not sent."
    )]
    Unreadable(String),
    #[error(
        "result_ref {0} names a result with no text and no JSON (images or other content only), which cannot be passed as an argument. The call was not sent."
    )]
    Empty(String),
    #[error(
        "With its result references replaced, this call would be {bytes} bytes, over the proxy's message limit of {max} bytes (--max-message-bytes): pass a part (add #/json/pointer) or raise --max-message-bytes. The call was not sent."
    )]
    TooLarge { bytes: usize, max: usize },
    #[error(
        "The proxy is putting as many results into calls as it holds at once ({0} bytes): retry in a moment. The call was not sent."
    )]
    Busy(usize),
    #[error(
        "A result_ref is nested deeper than {MAX_DEPTH} levels in the arguments, where references are not replaced: move it nearer the top. The call was not sent."
    )]
    TooDeep,
    #[error(
        "The arguments hold more than {MAX_REFERENCES} result references, more than one call may hold. The call was not sent."
    )]
    TooMany,
    #[error(
        "{0} does not take result references (this proxy's policy: references = false): pass the content itself. The call was not sent."
    )]
    Off(String),
    #[error(
        "A result_ref names a result of {0}, which this proxy's policy now hides: it cannot be passed on. The call was not sent."
    )]
    SourceHidden(String),
    #[error(
        "This call holds a result_ref the proxy did not replace: references are replaced only in a tools/call sent on its own (not inside a JSON-RPC batch), in the arguments of a tool the proxy forwards to. Send the call by itself. It was not sent."
    )]
    InBatch,
}

/// `reference` as an error shows it (its start: a reference is long).
pub fn shown(reference: &str) -> String {
    match reference.char_indices().nth(24) {
        Some((at, _)) => format!("{}…", &reference[..at]),
        None => reference.to_string(),
    }
}

/// Opens `value`, the whole value of a string that starts with [`PREFIX`], for `owner`.
pub fn open(key: &CursorKey, owner: &str, value: &str) -> Result<Named, RefError> {
    let token = value.strip_prefix(PREFIX).unwrap_or(value);
    let (token, pointer) = match token.split_once('#') {
        Some((token, pointer)) => (token, Some(pointer.to_string())),
        None => (token, None),
    };
    let body = key.unseal(PURPOSE, owner, token).map_err(|err| match err {
        SealError::Invalid => RefError::Invalid(shown(value)),
        SealError::OtherKey => RefError::OtherKey(shown(value)),
        SealError::OtherOwner => RefError::OtherOwner(shown(value)),
    })?;
    let (Ok(digest), Ok(fingerprint)) = (
        <[u8; 16]>::try_from(body.get(..16).unwrap_or_default()),
        <[u8; 8]>::try_from(body.get(16..).unwrap_or_default()),
    ) else {
        return Err(RefError::Invalid(shown(value)));
    };
    Ok(Named {
        digest,
        fingerprint: u64::from_le_bytes(fingerprint),
        pointer,
    })
}

/// A reference found in a call's arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The string literal's place in the arguments' text (quotes included).
    pub range: Range<usize>,
    /// Its value.
    pub value: String,
    /// The top-level argument it is the value of, when it is one (not nested).
    pub argument: Option<String>,
}

/// Whether `text` may hold a reference (cheap: byte searches). A reference spelled with an
/// escape (`\u006dcpb-ref.`) is one too: only the prefix's letters are looked for escaped.
pub fn mentioned(text: &[u8]) -> bool {
    if crate::holds!(text, b"mcpb-ref.") {
        return true;
    }
    if !crate::holds!(text, b"\\u00") {
        return false;
    }
    const ESCAPED: [&[u8]; 12] = [
        b"\\u006d", b"\\u006D", b"\\u0063", b"\\u0070", b"\\u0062", b"\\u002d", b"\\u002D",
        b"\\u0072", b"\\u0065", b"\\u0066", b"\\u002e", b"\\u002E",
    ];
    ESCAPED
        .iter()
        .any(|e| memchr::memmem::find(text, e).is_some())
}

/// The string values of `args` (a JSON object's text) whose whole value is a reference, in
/// order: one pass over the text. Keys, and references inside longer strings, are not
/// references.
pub fn find(args: &str) -> Result<Vec<Found>, RefError> {
    let bytes = args.as_bytes();
    // For each open container: an object (and whether a key comes next), or an array.
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let mut key: Option<String> = None;
    let mut found = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'{' => {
                stack.push((true, true));
                at += 1;
            }
            b'[' => {
                stack.push((false, false));
                at += 1;
            }
            b'}' | b']' => {
                stack.pop();
                at += 1;
            }
            b':' => {
                if let Some(top) = stack.last_mut() {
                    top.1 = false;
                }
                at += 1;
            }
            b',' => {
                if let Some(top) = stack.last_mut() {
                    top.1 = top.0;
                }
                at += 1;
            }
            b'"' => {
                let end = string_end(bytes, at).ok_or_else(|| RefError::Invalid(String::new()))?;
                let literal = &args[at..end];
                let is_key = stack.last().is_some_and(|top| top.0 && top.1);
                if is_key {
                    if stack.len() == 1 {
                        key = serde_json::from_str::<String>(literal).ok();
                    }
                } else if let Some(value) = reference_in(literal) {
                    if stack.len() > MAX_DEPTH {
                        return Err(RefError::TooDeep);
                    }
                    if found.len() == MAX_REFERENCES {
                        return Err(RefError::TooMany);
                    }
                    let argument = (stack.len() == 1).then(|| key.clone()).flatten();
                    found.push(Found {
                        range: at..end,
                        value,
                        argument,
                    });
                }
                at = end;
            }
            _ => at += 1,
        }
    }
    Ok(found)
}

/// The end (after its closing quote) of the string literal that starts at `start`.
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut at = start + 1;
    loop {
        let next = memchr::memchr2(b'"', b'\\', bytes.get(at..)?)?;
        at += next;
        match bytes[at] {
            b'\\' => at += 2,
            _ => return Some(at + 1),
        }
    }
}

/// The value of `literal` when it is a whole reference (an escape early in it is read too).
fn reference_in(literal: &str) -> Option<String> {
    let inner = &literal[1..literal.len() - 1];
    let plain = inner.starts_with(PREFIX);
    let escaped = !plain && inner.as_bytes().iter().take(64).any(|b| *b == b'\\');
    if !plain && !escaped {
        return None;
    }
    let value: String = match plain && !inner.contains('\\') {
        true => inner.to_string(),
        false => serde_json::from_str(literal).ok()?,
    };
    let token = value.strip_prefix(PREFIX)?;
    let token = token.split_once('#').map_or(token, |(t, _)| t);
    let sealed = !token.is_empty()
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    sealed.then_some(value)
}

/// A cached result as the references to it read it: its text blocks and its JSON document,
/// each read once however many references name it.
pub struct Source<'a> {
    /// The inside of each text block's string literal, in order; `Err`: what the result
    /// holds that an argument cannot (a block of another kind, an error).
    texts: Result<Vec<&'a str>, &'static str>,
    structured: Option<&'a str>,
    /// The text's JSON document, decoded (made when a reference first needs it).
    decoded: std::cell::OnceCell<Option<String>>,
}

impl<'a> Source<'a> {
    /// `raw`: a tool result's JSON, as the server wrote it. `Err`: it reads two ways (a key
    /// named twice, which the pager and a client would read otherwise).
    pub fn read(raw: &'a str) -> Result<Source<'a>, &'static str> {
        if reads_two_ways(raw) {
            return Err("names a key twice (a reader could take either), or nests past 128 levels");
        }
        let members = raw::members(raw).unwrap_or_default();
        let member = |name: &str| {
            let found = members.iter().find(|(k, _)| k == name);
            found.map(|(_, r)| raw::trim_json(&raw[r.clone()]))
        };
        let mut texts = Ok(Vec::new());
        if member("isError") == Some("true") {
            texts = Err("is an error");
        }
        for block in raw::elements(member("content").unwrap_or("[]")).unwrap_or_default() {
            let (Ok(list), Some(content)) = (&mut texts, member("content")) else {
                break;
            };
            let block = &content[block];
            let fields = raw::members(block).unwrap_or_default();
            let field = |name: &str| {
                let found = fields.iter().find(|(k, _)| k == name);
                found.map(|(_, r)| raw::trim_json(&block[r.clone()]))
            };
            match (field("type"), field("text")) {
                (Some("\"text\""), Some(literal)) if literal.starts_with('"') => {
                    list.push(&literal[1..literal.len() - 1]);
                }
                _ => texts = Err("holds a block that is not text (an image, a resource)"),
            }
        }
        let structured = member("structuredContent").filter(|s| s.starts_with(['{', '[']));
        Ok(Source {
            texts,
            structured,
            decoded: std::cell::OnceCell::new(),
        })
    }

    /// The JSON document: the text's, when the text is one JSON document (decoded: the
    /// server's document bytes), else `structuredContent`.
    fn document(&self) -> Option<&str> {
        self.text_document().or(self.structured)
    }

    /// The text's JSON document, when the text is one.
    fn text_document(&self) -> Option<&str> {
        let decoded = self.decoded.get_or_init(|| {
            let texts = self.texts.as_ref().ok()?;
            let literal = format!("\"{}\"", texts.concat());
            let text: String = serde_json::from_str(&literal).ok()?;
            let doc = raw::trim_json(&text);
            let json = doc.starts_with(['{', '['])
                && serde_json::from_str::<serde::de::IgnoredAny>(doc).is_ok()
                && !reads_two_ways(doc);
            json.then(|| doc.to_string())
        });
        decoded.as_deref()
    }

    /// What a reference to this result (`reference`, as the client wrote it, naming
    /// `named`) is replaced by: with a pointer, that part of the JSON document; without one,
    /// the JSON document when the result is JSON and the argument takes more than a string
    /// (`text`: it takes a string), else its text — every text block, joined as its pages join
    /// them — as one JSON string with the server's own escapes.
    pub fn content(
        &self,
        reference: &str,
        named: &Named,
        text: bool,
    ) -> Result<Content<'_>, RefError> {
        let refused = |why: &str| RefError::Unusable {
            shown: shown(reference),
            why: why.into(),
        };
        if let Some(pointer) = &named.pointer {
            let doc = self
                .document()
                .ok_or_else(|| RefError::NotJson(shown(reference)))?;
            let part = pointed(doc, pointer).map_err(|why| RefError::Pointer {
                shown: shown(reference),
                why,
            })?;
            return Ok(Content::Json(&doc[part]));
        }
        let texts = self.texts.as_ref().map_err(|why| refused(why))?;
        if texts.is_empty() {
            return match self.structured {
                Some(doc) if !text => Ok(Content::Json(doc)),
                _ => Err(RefError::Empty(shown(reference))),
            };
        }
        if !text && let Some(doc) = self.text_document() {
            return Ok(Content::Json(doc));
        }
        Ok(Content::Text(texts.clone()))
    }
}

/// What replaces a reference, as slices of the result (never copied until it is spliced).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content<'a> {
    /// JSON text, as it is.
    Json(&'a str),
    /// The insides of string literals, joined into one string.
    Text(Vec<&'a str>),
}

impl Content<'_> {
    /// Its length in the call.
    pub fn bytes(&self) -> usize {
        match self {
            Content::Json(json) => json.len(),
            Content::Text(inners) => inners.iter().map(|i| i.len()).sum::<usize>() + 2,
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Content::Json(json) => out.extend_from_slice(json.as_bytes()),
            Content::Text(inners) => {
                out.push(b'"');
                for inner in inners {
                    out.extend_from_slice(inner.as_bytes());
                }
                out.push(b'"');
            }
        }
    }
}

/// Whether `doc` names a key twice in any of its objects, or cannot be read whole (nested past
/// 128 levels): one pass.
fn reads_two_ways(doc: &str) -> bool {
    struct Twice;
    impl<'de> serde::de::Visitor<'de> for Twice {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
            let mut seen = std::collections::HashSet::new();
            let mut twice = false;
            while let Some(crate::wire::message::Key(key)) = map.next_key()? {
                twice |= !seen.insert(key);
                twice |= map.next_value::<Nested>()?.0;
            }
            Ok(twice)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
            let mut twice = false;
            while let Some(Nested(inner)) = seq.next_element()? {
                twice |= inner;
            }
            Ok(twice)
        }
        fn visit_bool<E>(self, _: bool) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_i64<E>(self, _: i64) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_u64<E>(self, _: u64) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_f64<E>(self, _: f64) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_str<E>(self, _: &str) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_unit<E>(self) -> Result<bool, E> {
            Ok(false)
        }
    }
    struct Nested(bool);
    impl<'de> serde::Deserialize<'de> for Nested {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Nested, D::Error> {
            d.deserialize_any(Twice).map(Nested)
        }
    }
    let mut reader = serde_json::Deserializer::from_str(doc);
    !matches!(
        serde::Deserializer::deserialize_any(&mut reader, Twice),
        Ok(false)
    )
}

/// Where `pointer` (RFC 6901) points in `doc`, or what it misses: one pass down the document
/// (siblings skipped, never read twice), at most [`MAX_DEPTH`] steps.
pub fn pointed(doc: &str, pointer: &str) -> Result<Range<usize>, String> {
    let start = raw::skip_ws(doc, 0);
    let whole = start..raw::value_end(doc, start).unwrap_or(doc.len());
    if pointer.is_empty() {
        return Ok(whole);
    }
    let Some(path) = pointer.strip_prefix('/') else {
        return Err(format!("{pointer:?} does not start with /"));
    };
    if path.split('/').count() > MAX_DEPTH {
        return Err(format!("the pointer has more than {MAX_DEPTH} steps"));
    }
    let bytes = doc.as_bytes();
    let mut at = start;
    let mut walked = String::new();
    for token in path.split('/') {
        let token = token.replace("~1", "/").replace("~0", "~");
        let what = if walked.is_empty() {
            "the document".to_string()
        } else {
            walked.clone()
        };
        let object = match bytes.get(at) {
            Some(b'{') => true,
            Some(b'[') => false,
            _ => return Err(format!("{what} is not an object or an array")),
        };
        let index = (!object)
            .then(|| (token == "0" || !token.starts_with('0')).then(|| token.parse::<usize>().ok()))
            .flatten()
            .flatten();
        if !object && index.is_none() {
            return Err(format!("{what} is an array, and {token:?} is no index"));
        }
        let mut n = 0;
        let mut next = raw::skip_ws(doc, at + 1);
        let found = loop {
            if matches!(bytes.get(next), Some(b'}' | b']') | None) {
                break None;
            }
            let value = if object {
                let key_end = raw::value_end(doc, next).ok_or("the document is not JSON")?;
                let key: String = serde_json::from_str(&doc[next..key_end])
                    .map_err(|_| "the document is not JSON")?;
                let colon = raw::skip_ws(doc, key_end);
                let value = raw::skip_ws(doc, colon + 1);
                if key == token {
                    break Some(value);
                }
                value
            } else {
                if Some(n) == index {
                    break Some(next);
                }
                next
            };
            let end = raw::value_end(doc, value).ok_or("the document is not JSON")?;
            n += 1;
            let after = raw::skip_ws(doc, end);
            next = match bytes.get(after) {
                Some(b',') => raw::skip_ws(doc, after + 1),
                _ => after,
            };
        };
        at = match found {
            Some(value) => value,
            None if object => return Err(format!("{what} is an object without {token:?}")),
            None => {
                return Err(format!(
                    "{what} is an array of {n} items, without item {token}"
                ));
            }
        };
        walked.push('/');
        walked.push_str(&token);
    }
    let end = raw::value_end(doc, at).ok_or("the document is not JSON")?;
    Ok(at..end)
}

/// `line` with each found reference (`found`, in order, their ranges in the arguments that
/// start at `base` in `line`) replaced by its content: one allocation, of the final size.
pub fn splice(line: &[u8], base: usize, found: &[Found], contents: &[Content<'_>]) -> Vec<u8> {
    let size = line.len() + contents.iter().map(Content::bytes).sum::<usize>()
        - found.iter().map(|f| f.range.len()).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    let mut from = 0;
    for (f, content) in found.iter().zip(contents) {
        out.extend_from_slice(&line[from..base + f.range.start]);
        content.write(&mut out);
        from = base + f.range.end;
    }
    out.extend_from_slice(&line[from..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> CursorKey {
        CursorKey::from_secret(b"a key of the tests")
    }

    #[test]
    fn a_reference_opens_for_its_owner_only_and_not_once_altered_or_cut() {
        let digest = [7u8; 16];
        let r = mint(&key(), "alice", &digest, 42);
        let named = open(&key(), "alice", &r).unwrap();
        assert_eq!(
            (named.digest, named.fingerprint, named.pointer),
            (digest, 42, None)
        );
        let pointed = open(&key(), "alice", &format!("{r}#/items/3")).unwrap();
        assert_eq!(pointed.pointer.as_deref(), Some("/items/3"));
        assert!(matches!(
            open(&key(), "bob", &r),
            Err(RefError::OtherOwner(_))
        ));
        for at in PREFIX.len()..r.len() {
            let mut altered = r.clone().into_bytes();
            altered[at] = if altered[at] == b'A' { b'B' } else { b'A' };
            let altered = String::from_utf8(altered).unwrap();
            assert!(open(&key(), "alice", &altered).is_err(), "{altered}");
            assert!(open(&key(), "alice", &r[..at]).is_err());
        }
        let other = CursorKey::from_secret(b"another key");
        assert!(open(&other, "alice", &r).is_err());
    }

    #[test]
    fn only_whole_string_values_are_references() {
        let r = mint(&key(), "a", &[1; 16], 1);
        let args = format!(
            r#"{{"a":"{r}","b":"see {r}","{r}":1,"c":{{"d":["x","{r}#/0"]}},"e":"\"{r}"}}"#
        );
        let found = find(&args).unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].value, r);
        assert_eq!(found[0].argument.as_deref(), Some("a"));
        assert_eq!(&args[found[0].range.clone()], format!("\"{r}\""));
        assert_eq!(found[1].value, format!("{r}#/0"));
        assert_eq!(found[1].argument, None);
        // Spelled with an escape, it is still one value to every reader.
        let escaped = format!(r#"{{"a":"\u006dcpb-ref.{}"}}"#, &r[PREFIX.len()..]);
        assert_eq!(find(&escaped).unwrap()[0].value, r);
    }

    #[test]
    fn deep_or_many_references_are_refused() {
        let r = mint(&key(), "a", &[1; 16], 1);
        let deep = format!(
            "{}\"{r}\"{}",
            "[".repeat(MAX_DEPTH + 1),
            "]".repeat(MAX_DEPTH + 1)
        );
        assert_eq!(find(&format!("{{\"a\":{deep}}}")), Err(RefError::TooDeep));
        let ok = format!("{}\"{r}\"{}", "[".repeat(5), "]".repeat(5));
        assert_eq!(find(&format!("{{\"a\":{ok}}}")).unwrap().len(), 1);
        let many: Vec<String> = (0..=MAX_REFERENCES)
            .map(|i| format!("\"k{i}\":\"{r}\""))
            .collect();
        assert_eq!(
            find(&format!("{{{}}}", many.join(","))),
            Err(RefError::TooMany)
        );
    }

    fn written(content: Content<'_>) -> String {
        let mut out = Vec::new();
        content.write(&mut out);
        assert_eq!(out.len(), content.bytes());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn text_is_passed_with_the_servers_own_escapes_and_json_by_its_bytes() {
        let named = |pointer: Option<&str>| Named {
            digest: [0; 16],
            fingerprint: 1,
            pointer: pointer.map(String::from),
        };
        let raw = r#"{"content":[{"type":"text","text":"caf\u00e9\t\"q\" \\ "},{"type":"text","text":"two"}]}"#;
        let source = Source::read(raw).unwrap();
        let text = written(source.content("r", &named(None), true).unwrap());
        assert_eq!(text, r#""caf\u00e9\t\"q\" \\ two""#);
        let value: String = serde_json::from_str(&text).unwrap();
        assert_eq!(value, "café\t\"q\" \\ two");
        assert!(matches!(
            source.content("r", &named(Some("/0")), true),
            Err(RefError::NotJson(_))
        ));
        let json = r#"{"content":[{"type":"text","text":"{\"items\":[1, {\"n\": 2.50}, 3]}"}]}"#;
        let source = Source::read(json).unwrap();
        let item = source
            .content("r", &named(Some("/items/1")), false)
            .unwrap();
        assert_eq!(written(item), r#"{"n": 2.50}"#);
        let whole = source.content("r", &named(None), false).unwrap();
        assert_eq!(written(whole), r#"{"items":[1, {"n": 2.50}, 3]}"#);
        let miss = source
            .content("r", &named(Some("/items/9")), false)
            .unwrap_err();
        assert!(miss.to_string().contains("array of 3 items"), "{miss}");
        let structured = r#"{"content":[],"structuredContent":{"a":{"b":[true]}}}"#;
        let source = Source::read(structured).unwrap();
        assert_eq!(
            written(source.content("r", &named(Some("/a/b/0")), false).unwrap()),
            "true"
        );
        assert!(source.content("r", &named(Some("/a/c")), false).is_err());
        assert_eq!(pointed(r#"{"a/b":{"~":7}}"#, "/a~1b/~0").unwrap(), 12..13);
        assert!(pointed("[1,2]", "/01").is_err());
        assert_eq!(
            pointed(r#" [ 1 , [2, {"x" : "y"} ] ]"#, "/1/1/x").unwrap(),
            18..21
        );
        let deep = format!("{}1{}", "[".repeat(40), "]".repeat(40));
        assert!(pointed(&deep, &"/0".repeat(40)).is_err());
    }

    #[test]
    fn what_an_argument_cannot_hold_or_what_reads_two_ways_is_refused() {
        let named = Named {
            digest: [0; 16],
            fingerprint: 1,
            pointer: None,
        };
        let twice =
            r#"{"content":[{"type":"text","text":"a"}],"content":[{"type":"text","text":"b"}]}"#;
        assert!(Source::read(twice).is_err());
        let inner = r#"{"content":[{"type":"text","text":"a","text":"b"}]}"#;
        assert!(Source::read(inner).is_err());
        let image = r#"{"content":[{"type":"text","text":"a"},{"type":"image","data":"AA=="}]}"#;
        let refused = Source::read(image)
            .unwrap()
            .content("r", &named, true)
            .unwrap_err();
        assert!(refused.to_string().contains("not text"), "{refused}");
        let error = r#"{"content":[{"type":"text","text":"boom"}],"isError":true}"#;
        let refused = Source::read(error)
            .unwrap()
            .content("r", &named, true)
            .unwrap_err();
        assert!(refused.to_string().contains("is an error"), "{refused}");
        // A JSON text that names a key twice is passed as text, never as its JSON.
        let json = r#"{"content":[{"type":"text","text":"{\"a\":1,\"a\":2}"}]}"#;
        let source = Source::read(json).unwrap();
        let content = source.content("r", &named, false).unwrap();
        assert!(matches!(content, Content::Text(_)));
    }

    #[test]
    fn an_escaped_spelling_is_mentioned_too() {
        assert!(mentioned(br#"{"a":"mcpb-ref.x"}"#));
        assert!(mentioned(br#"{"a":"\u006dcpb-ref.x"}"#));
        assert!(mentioned(br#"{"a":"mcpb\u002Dref.x"}"#));
        assert!(!mentioned(br#"{"a":"caf\u00e9"}"#));
    }

    #[test]
    fn splice_puts_each_content_in_its_place() {
        let line = br#"{"params":{"arguments":{"a":"R1","b":["R2"]}}}"#;
        let base = 23;
        let args = std::str::from_utf8(&line[base..line.len() - 2]).unwrap();
        assert!(args.starts_with("{\"a\""));
        let found = vec![
            Found {
                range: 5..9,
                value: String::new(),
                argument: None,
            },
            Found {
                range: 15..19,
                value: String::new(),
                argument: None,
            },
        ];
        let out = splice(
            line,
            base,
            &found,
            &[Content::Text(vec!["one"]), Content::Json("{\"x\":2}")],
        );
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"params":{"arguments":{"a":"one","b":[{"x":2}]}}}"#
        );
    }
}
