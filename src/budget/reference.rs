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
        "result_ref {0} names a result with no text and no JSON (images or other content only), which cannot be passed as an argument. The call was not sent."
    )]
    Empty(String),
    #[error(
        "With its result references replaced, this call would be {bytes} bytes, over the proxy's message limit of {max} bytes (--max-message-bytes): pass a part (add #/json/pointer) or raise --max-message-bytes. The call was not sent."
    )]
    TooLarge { bytes: usize, max: usize },
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
        "Result references are replaced only in a tools/call sent on its own, not inside a JSON-RPC batch: send this call by itself. It was not sent."
    )]
    InBatch,
}

/// `reference` as an error shows it (its start: a reference is long).
fn shown(reference: &str) -> String {
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

/// Whether `text` may hold a reference (cheap: a byte search).
pub fn mentioned(text: &[u8]) -> bool {
    crate::holds!(text, b"mcpb-ref.")
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

/// The JSON text a reference to the result `raw` (a tool result's JSON, as the server wrote
/// it) is replaced by: with a pointer, that part of the result's JSON document, its own bytes;
/// without one, the JSON document when the result is JSON and the argument takes more than a
/// string (`text`: it takes a string), else its text (every text block, joined as its pages
/// join them) as one JSON string, the server's own escapes kept.
pub fn content(raw: &str, reference: &str, named: &Named, text: bool) -> Result<String, RefError> {
    let members = raw::members(raw).unwrap_or_default();
    let member = |name: &str| {
        members
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, r)| &raw[r.clone()])
    };
    let mut inners: Vec<&str> = Vec::new();
    if let Some(content) = member("content") {
        for block in raw::elements(content).unwrap_or_default() {
            let block = &content[block];
            let fields = raw::members(block).unwrap_or_default();
            let field = |name: &str| {
                fields
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, r)| raw::trim_json(&block[r.clone()]))
            };
            if field("type") == Some("\"text\"")
                && let Some(literal) = field("text").filter(|l| l.starts_with('"'))
            {
                inners.push(&literal[1..literal.len() - 1]);
            }
        }
    }
    let structured = member("structuredContent")
        .map(raw::trim_json)
        .filter(|s| s.starts_with('{') || s.starts_with('['));
    // The text's JSON document, when the text is one (decoded once: the server's document).
    let decoded = || -> Option<String> {
        let literal = format!("\"{}\"", inners.concat());
        let text: String = serde_json::from_str(&literal).ok()?;
        let doc = raw::trim_json(&text);
        let json = (doc.starts_with('{') || doc.starts_with('['))
            && serde_json::from_str::<serde::de::IgnoredAny>(doc).is_ok();
        json.then(|| doc.to_string())
    };
    match &named.pointer {
        Some(pointer) => {
            let doc = match decoded() {
                Some(doc) => doc,
                None => structured
                    .map(str::to_string)
                    .ok_or_else(|| RefError::NotJson(shown(reference)))?,
            };
            let part = pointed(&doc, pointer).map_err(|why| RefError::Pointer {
                shown: shown(reference),
                why,
            })?;
            Ok(doc[part].to_string())
        }
        None if inners.is_empty() => match structured {
            Some(doc) if !text => Ok(doc.to_string()),
            _ => Err(RefError::Empty(shown(reference))),
        },
        None => {
            if !text && let Some(doc) = decoded() {
                return Ok(doc);
            }
            let mut out = String::with_capacity(inners.iter().map(|i| i.len()).sum::<usize>() + 2);
            out.push('"');
            for inner in inners {
                out.push_str(inner);
            }
            out.push('"');
            Ok(out)
        }
    }
}

/// Where `pointer` (RFC 6901) points in `doc`, or what it misses.
pub fn pointed(doc: &str, pointer: &str) -> Result<Range<usize>, String> {
    let mut place = {
        let start = raw::skip_ws(doc, 0);
        start..raw::value_end(doc, start).unwrap_or(doc.len())
    };
    if pointer.is_empty() {
        return Ok(place);
    }
    let Some(path) = pointer.strip_prefix('/') else {
        return Err(format!("{pointer:?} does not start with /"));
    };
    let mut walked = String::new();
    for token in path.split('/') {
        let token = token.replace("~1", "/").replace("~0", "~");
        let here = &doc[place.clone()];
        let shift = place.start;
        let what = if walked.is_empty() {
            "the document"
        } else {
            walked.as_str()
        };
        place = match here.as_bytes().first() {
            Some(b'{') => {
                let members = raw::members(here).unwrap_or_default();
                let mut named = members.iter().filter(|(k, _)| *k == token);
                match (named.next(), named.next()) {
                    (Some((_, r)), None) => {
                        let r = raw::span(here, raw::trim_json(&here[r.clone()]));
                        r.start + shift..r.end + shift
                    }
                    (Some(_), Some(_)) => {
                        return Err(format!("{what} names {token:?} twice (it reads two ways)"));
                    }
                    _ => return Err(format!("{what} is an object without {token:?}")),
                }
            }
            Some(b'[') => {
                let elements = raw::elements(here).unwrap_or_default();
                let index = (token == "0" || !token.starts_with('0'))
                    .then(|| token.parse::<usize>().ok())
                    .flatten();
                match index.and_then(|i| elements.get(i)) {
                    Some(r) => r.start + shift..r.end + shift,
                    None => {
                        return Err(format!(
                            "{what} is an array of {} items, without item {token:?}",
                            elements.len()
                        ));
                    }
                }
            }
            _ => return Err(format!("{what} is not an object or an array")),
        };
        walked.push('/');
        walked.push_str(&token);
    }
    Ok(place)
}

/// `line` with each found reference (`found`, in order, their ranges in the arguments that
/// start at `base` in `line`) replaced by its content.
pub fn splice(line: &[u8], base: usize, found: &[Found], contents: &[String]) -> Vec<u8> {
    let grown: usize = contents.iter().map(String::len).sum();
    let mut out = Vec::with_capacity(line.len() + grown);
    let mut from = 0;
    for (f, content) in found.iter().zip(contents) {
        out.extend_from_slice(&line[from..base + f.range.start]);
        out.extend_from_slice(content.as_bytes());
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

    #[test]
    fn text_is_passed_with_the_servers_own_escapes_and_json_by_its_bytes() {
        let named = |pointer: Option<&str>| Named {
            digest: [0; 16],
            fingerprint: 1,
            pointer: pointer.map(String::from),
        };
        let raw = r#"{"content":[{"type":"text","text":"caf\u00e9\t\"q\" \\ "},{"type":"text","text":"two"}]}"#;
        let text = content(raw, "r", &named(None), true).unwrap();
        assert_eq!(text, r#""caf\u00e9\t\"q\" \\ two""#);
        let value: String = serde_json::from_str(&text).unwrap();
        assert_eq!(value, "café\t\"q\" \\ two");
        assert!(matches!(
            content(raw, "r", &named(Some("/0")), true),
            Err(RefError::NotJson(_))
        ));
        let json = r#"{"content":[{"type":"text","text":"{\"items\":[1, {\"n\": 2.50}, 3]}"}]}"#;
        assert_eq!(
            content(json, "r", &named(Some("/items/1")), false).unwrap(),
            r#"{"n": 2.50}"#
        );
        assert_eq!(
            content(json, "r", &named(None), false).unwrap(),
            r#"{"items":[1, {"n": 2.50}, 3]}"#
        );
        let miss = content(json, "r", &named(Some("/items/9")), false).unwrap_err();
        assert!(miss.to_string().contains("array of 3 items"), "{miss}");
        let structured = r#"{"content":[],"structuredContent":{"a":{"b":[true]}}}"#;
        assert_eq!(
            content(structured, "r", &named(Some("/a/b/0")), false).unwrap(),
            "true"
        );
        assert!(content(structured, "r", &named(Some("/a/c")), false).is_err());
        assert_eq!(pointed(r#"{"a/b":{"~":7}}"#, "/a~1b/~0").unwrap(), 12..13);
        assert!(pointed("[1,2]", "/01").is_err());
        assert!(pointed(r#"{"a":1,"a":2}"#, "/a").is_err());
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
        let out = splice(line, base, &found, &["\"one\"".into(), "{\"x\":2}".into()]);
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"params":{"arguments":{"a":"one","b":[{"x":2}]}}}"#
        );
    }
}
