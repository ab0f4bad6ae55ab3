//! Reading JSON without re-spelling it: the members of an object and the elements of an array
//! as byte ranges of the text they came from, so that a page is cut out of the server's own
//! bytes (numbers, escapes, key order and spacing intact) instead of being re-serialized.

use std::ops::Range;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// The byte range of `inner` inside `outer` (`inner` must be a slice of `outer`).
pub fn span(outer: &str, inner: &str) -> Range<usize> {
    let start = (inner.as_ptr() as usize).saturating_sub(outer.as_ptr() as usize);
    start..start + inner.len()
}

/// The members of the JSON object `text`, in order: (key, value range in `text`).
pub fn members(text: &str) -> Option<Vec<(String, Range<usize>)>> {
    struct Members<'a>(&'a str);
    impl<'de> Visitor<'de> for Members<'de> {
        type Value = Vec<(String, Range<usize>)>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some((key, value)) = map.next_entry::<String, &'de RawValue>()? {
                out.push((key, span(self.0, value.get())));
            }
            Ok(out)
        }
    }
    let trimmed = text.trim_start();
    if !trimmed.starts_with('{') {
        return None;
    }
    let mut de = serde_json::Deserializer::from_str(text);
    de.deserialize_map(Members(text)).ok()
}

/// The first key the JSON object `text` has twice (keys compared as decoded strings), if any.
pub fn duplicate_key(text: &str) -> Option<String> {
    struct Keys;
    impl<'de> Visitor<'de> for Keys {
        type Value = Vec<std::borrow::Cow<'de, str>>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut keys = Vec::new();
            while let Some(crate::wire::message::Key(key)) =
                map.next_key::<crate::wire::message::Key<'de>>()?
            {
                map.next_value::<serde::de::IgnoredAny>()?;
                keys.push(key);
            }
            Ok(keys)
        }
    }
    if !text.trim_start().starts_with('{') {
        return None;
    }
    // Keys borrowed from the text (decoded only where escaped); a few compared pairwise.
    let keys = serde_json::Deserializer::from_str(text)
        .deserialize_map(Keys)
        .ok()?;
    if keys.len() <= 16 {
        return keys
            .iter()
            .enumerate()
            .find(|(n, key)| keys[..*n].contains(key))
            .map(|(_, key)| key.to_string());
    }
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    keys.iter()
        .find(|key| !seen.insert(*key))
        .map(|key| key.to_string())
}

/// The elements of the JSON array `text`: their ranges in `text`.
pub fn elements(text: &str) -> Option<Vec<Range<usize>>> {
    if !text.trim_start().starts_with('[') {
        return None;
    }
    let items: Vec<&RawValue> = serde_json::from_str(text).ok()?;
    Some(items.iter().map(|item| span(text, item.get())).collect())
}

/// One element of an array: its range, and its members (ranges in the element) when it is an
/// object.
pub type ElementMembers = (Range<usize>, Option<Vec<(String, Range<usize>)>>);

/// The elements of the JSON array `text` with, for each object among them, its members: what
/// [`elements`] and then [`members`] of each element give, in one reading of `text` (a long
/// text member is skipped once, not twice).
pub fn elements_with_members(text: &str) -> Option<Vec<ElementMembers>> {
    let (elements, end) = elements_with_members_at(text, skip_ws(text, 0))?;
    (skip_ws(text, end) == text.len()).then_some(elements)
}

/// Whether `byte` is JSON whitespace (space, tab, line feed, carriage return — not the other
/// characters Rust calls whitespace, which a JSON parser refuses).
fn is_json_ws(byte: &u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// Where the first byte at or after `at` that is not JSON whitespace is.
pub fn skip_ws(text: &str, mut at: usize) -> usize {
    let bytes = text.as_bytes();
    while bytes.get(at).is_some_and(is_json_ws) {
        at += 1;
    }
    at
}

/// `text` without the JSON whitespace around it.
pub fn trim_json(text: &str) -> &str {
    text.trim_matches([' ', '\t', '\n', '\r'])
}

/// One value read from where it starts (`text[at..]`, no whitespace first): what it is read
/// as, and where it ends.
fn read_at<'a, T: serde::Deserialize<'a>>(text: &'a str, at: usize) -> Option<(T, usize)> {
    let mut stream = serde_json::Deserializer::from_str(text.get(at..)?).into_iter::<T>();
    let value = stream.next()?.ok()?;
    Some((value, at + stream.byte_offset()))
}

/// Where the JSON value that starts at `at` ends (it is skipped, not kept).
pub fn value_end(text: &str, at: usize) -> Option<usize> {
    read_at::<serde::de::IgnoredAny>(text, at).map(|(_, end)| end)
}

/// The array that starts at `at` in `text`: its elements (ranges in `text`) with their members
/// (ranges in the element) when they are objects, and where the array ends.
pub fn elements_with_members_at(text: &str, at: usize) -> Option<(Vec<ElementMembers>, usize)> {
    /// An object's members as raw values of the text it is read from.
    struct Object<'a>(Vec<(String, &'a RawValue)>);
    impl<'de> serde::Deserialize<'de> for Object<'de> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct Raw;
            impl<'de> Visitor<'de> for Raw {
                type Value = Object<'de>;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Object<'de>, A::Error> {
                    let mut out = Vec::new();
                    while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
                        out.push(entry);
                    }
                    Ok(Object(out))
                }
            }
            deserializer.deserialize_map(Raw)
        }
    }
    let bytes = text.as_bytes();
    if bytes.get(at) != Some(&b'[') {
        return None;
    }
    let mut at = skip_ws(text, at + 1);
    let mut out = Vec::new();
    if bytes.get(at) == Some(&b']') {
        return Some((out, at + 1));
    }
    loop {
        // Each element is read where it starts; the reader says where it ended.
        let (end, members) = if bytes.get(at) == Some(&b'{') {
            let (object, end) = read_at::<Object<'_>>(text, at)?;
            let element = &text[at..end];
            let members = object
                .0
                .into_iter()
                .map(|(key, value)| (key, span(element, value.get())))
                .collect();
            (end, Some(members))
        } else {
            (value_end(text, at)?, None)
        };
        out.push((at..end, members));
        at = skip_ws(text, end);
        match bytes.get(at) {
            Some(b',') => at = skip_ws(text, at + 1),
            Some(b']') => return Some((out, at + 1)),
            _ => return None,
        }
    }
}

/// Walks the members of the object that starts at `at` in `text`, in order: `visit` gets each
/// key and where its value starts, and returns where the value ends (reading it as it likes,
/// or skipping it with [`value_end`]); `None` from it ends the walk. Returns where the object
/// ends. Nothing of the object is read twice.
pub fn walk_object(
    text: &str,
    at: usize,
    mut visit: impl FnMut(String, usize) -> Option<usize>,
) -> Option<usize> {
    let bytes = text.as_bytes();
    if bytes.get(at) != Some(&b'{') {
        return None;
    }
    let mut at = skip_ws(text, at + 1);
    if bytes.get(at) == Some(&b'}') {
        return Some(at + 1);
    }
    loop {
        if bytes.get(at) != Some(&b'"') {
            return None;
        }
        let (key, end) = read_at::<String>(text, at)?;
        at = skip_ws(text, end);
        if bytes.get(at) != Some(&b':') {
            return None;
        }
        at = skip_ws(text, at + 1);
        let end = visit(key, at)?;
        at = skip_ws(text, end);
        match bytes.get(at) {
            Some(b',') => at = skip_ws(text, at + 1),
            Some(b'}') => return Some(at + 1),
            _ => return None,
        }
    }
}

/// The elements of the JSON array `text`, read only as far as `wanted` asks: it sees each
/// element's range and says whether to read on. A long list whose first elements are all that
/// is needed is not read to its end.
pub fn elements_while(text: &str, mut wanted: impl FnMut(Range<usize>) -> bool) {
    use serde::de::{SeqAccess, Visitor};
    struct Elements<'a, F>(&'a str, &'a mut F);
    impl<'de, F: FnMut(Range<usize>) -> bool> Visitor<'de> for Elements<'de, F> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON array")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while let Some(element) = seq.next_element::<&'de RawValue>()? {
                if !(self.1)(span(self.0, element.get())) {
                    // Stopping early leaves the rest unread; the caller ignores the error that
                    // the unfinished array makes.
                    return Err(serde::de::Error::custom("enough"));
                }
            }
            Ok(())
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let _ = de.deserialize_seq(Elements(text, &mut wanted));
}

/// One step of a path into a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Key(String),
    Index(usize),
}

/// An array found in a document: where it is, and its elements' ranges (all in the document).
#[derive(Debug, Clone)]
pub struct FoundArray {
    pub path: Vec<Step>,
    pub span: Range<usize>,
    pub elements: Vec<Range<usize>>,
    /// The "list" is an object's members (`"key": value` each): a JSON document with no list
    /// to page is paged by its members, every page an object.
    pub object: bool,
}

/// How deep the search for the largest array goes.
const MAX_DEPTH: usize = 8;

/// The largest array (in bytes) of `doc`, at its root or nested in objects and arrays, among
/// those with at least two elements, none of them over `max_element` bytes (an array with a
/// larger element could not be paged: a list nested in that element may be); the shallowest
/// wins a tie.
pub fn largest_array(doc: &str, max_element: usize) -> Option<FoundArray> {
    let mut best: Option<FoundArray> = None;
    search(
        doc,
        0..doc.len(),
        &mut Vec::new(),
        0,
        max_element,
        &mut best,
    );
    best
}

fn search(
    doc: &str,
    range: Range<usize>,
    path: &mut Vec<Step>,
    depth: usize,
    max_element: usize,
    best: &mut Option<FoundArray>,
) {
    if depth > MAX_DEPTH {
        return;
    }
    let text = &doc[range.clone()];
    let offset = range.start;
    let first = text.trim_start().as_bytes().first().copied();
    match first {
        Some(b'[') => {
            let Some(elements) = elements(text) else {
                return;
            };
            let shift = |r: &Range<usize>| r.start + offset..r.end + offset;
            let elements: Vec<Range<usize>> = elements.iter().map(shift).collect();
            let size = text.trim().len();
            if elements.len() >= 2
                && elements.iter().all(|e| e.len() <= max_element)
                && best.as_ref().is_none_or(|b| size > b.span.len())
            {
                let start = offset + (text.len() - text.trim_start().len());
                *best = Some(FoundArray {
                    path: path.clone(),
                    span: start..start + size,
                    elements: elements.clone(),
                    object: false,
                });
            }
            for (index, element) in elements.into_iter().enumerate() {
                // Only an element larger than the best so far can hold a larger array.
                if best.as_ref().is_some_and(|b| element.len() <= b.span.len()) {
                    continue;
                }
                path.push(Step::Index(index));
                search(doc, element, path, depth + 1, max_element, best);
                path.pop();
            }
        }
        Some(b'{') => {
            let Some(members) = members(text) else { return };
            for (key, value) in members {
                let value = value.start + offset..value.end + offset;
                if best.as_ref().is_some_and(|b| value.len() <= b.span.len()) {
                    continue;
                }
                path.push(Step::Key(key));
                search(doc, value, path, depth + 1, max_element, best);
                path.pop();
            }
        }
        _ => {}
    }
}

/// The array at `path` in `doc`, when there is one.
pub fn array_at(doc: &str, path: &[Step]) -> Option<FoundArray> {
    let mut range = 0..doc.len();
    for step in path {
        let text = &doc[range.clone()];
        let inner = match step {
            Step::Key(key) => {
                members(text)?
                    .into_iter()
                    .rev() // the last of duplicate keys is the one a parser keeps
                    .find(|(k, _)| k == key)?
                    .1
            }
            Step::Index(index) => elements(text)?.get(*index)?.clone(),
        };
        range = inner.start + range.start..inner.end + range.start;
    }
    let text = &doc[range.clone()];
    let elements = elements(text)?
        .into_iter()
        .map(|r| r.start + range.start..r.end + range.start)
        .collect();
    let start = range.start + (text.len() - text.trim_start().len());
    Some(FoundArray {
        path: path.to_vec(),
        span: start..start + text.trim().len(),
        elements,
        object: false,
    })
}

/// A document's root object as a list of its members (`"key": value` each), when it has at
/// least two and none is over `max_element` bytes: what pages a JSON document that has no list.
pub fn root_members(doc: &str, max_element: usize) -> Option<FoundArray> {
    let bytes = doc.as_bytes();
    let start = skip_ws(doc, 0);
    if bytes.get(start) != Some(&b'{') {
        return None;
    }
    let mut elements = Vec::new();
    let mut at = skip_ws(doc, start + 1);
    let end = if bytes.get(at) == Some(&b'}') {
        at + 1
    } else {
        loop {
            if bytes.get(at) != Some(&b'"') {
                return None;
            }
            let key_start = at;
            let (_, key_end) = read_at::<&RawValue>(doc, at)?;
            at = skip_ws(doc, key_end);
            if bytes.get(at) != Some(&b':') {
                return None;
            }
            let value_end = value_end(doc, skip_ws(doc, at + 1))?;
            elements.push(key_start..value_end);
            at = skip_ws(doc, value_end);
            match bytes.get(at) {
                Some(b',') => at = skip_ws(doc, at + 1),
                Some(b'}') => break at + 1,
                _ => return None,
            }
        }
    };
    (elements.len() >= 2 && elements.iter().all(|e| e.len() <= max_element)).then(|| FoundArray {
        path: Vec::new(),
        span: start..end,
        elements,
        object: true,
    })
}

/// The path as JSONPath text, for notices (`$.entries`, `$[0].children`).
pub fn path_text(path: &[Step]) -> String {
    let mut out = String::from("$");
    for step in path {
        match step {
            Step::Key(key) if key.chars().all(|c| c.is_alphanumeric() || c == '_') => {
                out.push('.');
                out.push_str(key);
            }
            Step::Key(key) => out.push_str(&format!("[{}]", serde_json::Value::from(key.as_str()))),
            Step::Index(index) => out.push_str(&format!("[{index}]")),
        }
    }
    out
}

/// Whether two JSON texts are the same tokens, whitespace between them aside (strings and
/// numbers byte for byte): one pass over both, nothing allocated.
pub fn same_tokens(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    let ws = |c: u8| matches!(c, b' ' | b'\t' | b'\n' | b'\r');
    loop {
        while i < a.len() && ws(a[i]) {
            i += 1;
        }
        while j < b.len() && ws(b[j]) {
            j += 1;
        }
        match (a.get(i), b.get(j)) {
            (None, None) => return true,
            (Some(&x), Some(&y)) if x == y => {
                i += 1;
                j += 1;
                if x == b'"' {
                    // Inside a string every byte counts, up to its closing quote.
                    loop {
                        match (a.get(i), b.get(j)) {
                            (Some(&x), Some(&y)) if x == y => {
                                i += 1;
                                j += 1;
                                if x == b'\\' {
                                    if a.get(i) != b.get(j) || a.get(i).is_none() {
                                        return false;
                                    }
                                    i += 1;
                                    j += 1;
                                } else if x == b'"' {
                                    break;
                                }
                            }
                            _ => return false,
                        }
                    }
                }
            }
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_and_elements_are_ranges_of_the_original_bytes() {
        let doc = r#"{"a": 1.50, "b" : [1e3, -0, "\u00e9"], "c":{"d":[1,2]}}"#;
        let m = members(doc).unwrap();
        assert_eq!(m[0].0, "a");
        assert_eq!(&doc[m[0].1.clone()], "1.50");
        let b = &doc[m[1].1.clone()];
        let e = elements(b).unwrap();
        let texts: Vec<&str> = e.iter().map(|r| &b[r.clone()]).collect();
        assert_eq!(texts, vec!["1e3", "-0", r#""\u00e9""#]);
    }

    #[test]
    fn elements_with_members_read_once_agree_with_elements_then_members() {
        let doc = r#" [ {"type":"text", "text":"a\"b,]}"} ,1.50,"x]",[1,{"k":2}],{},
            {"n":-0 ,"o":{"p":[]}} ] "#;
        let once = elements_with_members(doc).unwrap();
        let twice = elements(doc).unwrap();
        assert_eq!(once.len(), twice.len());
        for ((range, read), expected) in once.iter().zip(&twice) {
            assert_eq!(&doc[range.clone()], doc[expected.clone()].trim());
            let element = &doc[range.clone()];
            assert_eq!(read, &members(element).filter(|_| element.starts_with('{')));
        }
        assert_eq!(once[0].1.as_ref().unwrap()[1].0, "text");
        assert_eq!(elements_with_members("[]").unwrap().len(), 0);
        // Not an array, or not one array: nothing.
        for bad in ["{}", "[1,]", "[1 2]", "[1] x", "[{\"a\":}]", "[1"] {
            assert!(elements_with_members(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn an_object_is_walked_once_and_agrees_with_its_members() {
        let doc = r#" {"a" : 1.50 , "b":[{"c":"]}"}, 2],"a":{"d":"\u00e9"} ,"e":{}} "#;
        let start = doc.find('{').unwrap();
        let mut seen = Vec::new();
        let end = walk_object(doc, start, |key, at| {
            let end = value_end(doc, at)?;
            seen.push((key, at..end));
            Some(end)
        })
        .unwrap();
        assert_eq!(doc[end..].trim(), "");
        assert_eq!(Some(seen), members(doc));
        // An array read where it is, inside the walk, ends where skipping it ends.
        let b = doc.find('[').unwrap();
        let (elements, after) = elements_with_members_at(doc, b).unwrap();
        assert_eq!(after, value_end(doc, b).unwrap());
        assert_eq!(elements.len(), 2);
        assert_eq!(&doc[elements[0].0.clone()], r#"{"c":"]}"}"#);
        for bad in [
            "{",
            "{\"a\"}",
            "{\"a\":1,}",
            "{1:2}",
            "[1]",
            "{\"a\":1 \"b\":2}",
        ] {
            assert!(
                walk_object(bad, 0, |_, at| value_end(bad, at)).is_none(),
                "{bad}"
            );
        }
        assert!(elements_with_members_at("[1,", 0).is_none());
    }

    #[test]
    fn the_largest_array_is_found_where_it_is() {
        let doc = r#"{"meta":{"n":3},"x":[1,2],"data":{"rows":[{"v":"aaaa"},{"v":"bbbb"},{"v":"cccc"}]}}"#;
        let found = largest_array(doc, 1000).unwrap();
        assert_eq!(
            found.path,
            vec![Step::Key("data".into()), Step::Key("rows".into())]
        );
        assert_eq!(found.elements.len(), 3);
        assert_eq!(&doc[found.elements[1].clone()], r#"{"v":"bbbb"}"#);
        assert_eq!(path_text(&found.path), "$.data.rows");
        let again = array_at(doc, &found.path).unwrap();
        assert_eq!(again.span, found.span);
        // The root holds everything; with an element over the limit, the list inside it.
        let root = "[ [1,2,3,4,5,6,7,8,9], [1] ]";
        assert_eq!(largest_array(root, 1000).unwrap().path, vec![]);
        assert_eq!(largest_array(root, 10).unwrap().path, vec![Step::Index(0)]);
    }
}
