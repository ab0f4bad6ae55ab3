//! The JSON-RPC envelope: the few fields the relay reads from a message, leaving the rest as bytes.
//!
//! Why not parse whole messages: the relay must forward what it does not intercept as the exact
//! bytes it arrived as (key order, number forms, unknown fields, `_meta`). So it reads only the
//! envelope — `id`, `method`, and whether a `result`/`error` is present — borrowing from the line
//! it was handed, and never re-serializes a message it has no reason to touch.

use std::borrow::Cow;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

/// What a single JSON-RPC message is, judged from its envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Has `method` and a non-null `id`; `progress`: its `params._meta.progressToken` (JSON
    /// text), read with the envelope.
    Request {
        id: Id,
        method: String,
        progress: Option<Box<str>>,
    },
    /// Has `method` and no `id`.
    Notification { method: String },
    /// Has `result` or `error` and no `method`; `result`: where its `result` is in the line,
    /// so that no later reader has to look for it again.
    Response {
        id: Option<Id>,
        result: Option<std::ops::Range<usize>>,
    },
    /// A JSON object that is not a JSON-RPC message the relay can classify (forwarded as is).
    Other,
    /// JSON that is not an object (a scalar, or an array inside a batch): never JSON-RPC.
    Invalid,
}

/// A request id, as the peer wrote it and as a key that ignores number formatting.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Id {
    /// The id's JSON text exactly as it arrived (`7`, `"abc"`), used to echo it back.
    raw: Box<str>,
    /// The comparison key: strings keep their JSON text, integers are normalized (`7.0` → `7`).
    key: Box<str>,
}

impl Id {
    /// Builds an id from its JSON text (a string or a number).
    pub fn from_json_text(raw: &str) -> Id {
        let raw = raw.trim();
        let key: Box<str> = if raw.starts_with('"') {
            raw.into()
        } else {
            match raw.parse::<f64>() {
                Ok(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => format!("{}", f as i64).into(),
                _ => raw.into(),
            }
        };
        Id {
            raw: raw.into(),
            key,
        }
    }

    /// The id's JSON text as the peer wrote it.
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// The key used to match a response to its request.
    pub fn key(&self) -> &str {
        &self.key
    }
}

/// One line from a peer, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    Single(Kind),
    /// A JSON-RPC batch (an array); one `Kind` per element.
    Batch(Vec<Kind>),
}

impl Parsed {
    /// The envelope a message is routed by: the message's own, or a batch's first response.
    pub fn single(self) -> Option<Kind> {
        match self {
            Parsed::Single(kind) => Some(kind),
            Parsed::Batch(kinds) => kinds
                .into_iter()
                .find(|k| matches!(k, Kind::Response { id: Some(_), .. })),
        }
    }

    /// Whether this is something no JSON-RPC peer may send: a scalar, an empty batch, or a
    /// batch with a scalar in it.
    pub fn is_invalid(&self) -> bool {
        match self {
            Parsed::Single(kind) => *kind == Kind::Invalid,
            Parsed::Batch(kinds) => kinds.is_empty() || kinds.contains(&Kind::Invalid),
        }
    }

    /// Every message's envelope.
    pub fn kinds(&self) -> &[Kind] {
        match self {
            Parsed::Single(kind) => std::slice::from_ref(kind),
            Parsed::Batch(kinds) => kinds,
        }
    }
}

/// The line is not JSON.
#[derive(Debug, thiserror::Error)]
pub enum NotJson {
    #[error("not JSON: {0}")]
    Syntax(#[from] serde_json::Error),
    #[error("not UTF-8 text: {0}")]
    Utf8(#[from] std::str::Utf8Error),
}

#[derive(Deserialize)]
struct RawEnvelope<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    result: Slot<'a>,
    #[serde(default)]
    error: Present,
    #[serde(borrow, default)]
    params: Member<'a, MetaKey>,
}

/// Reads one member of an object (`K::NAME`), skipping anything else — other members, and any
/// value that is not an object.
struct Member<'a, K>(Option<&'a RawValue>, std::marker::PhantomData<K>);

impl<K> Default for Member<'_, K> {
    fn default() -> Self {
        Member(None, std::marker::PhantomData)
    }
}

trait Key {
    const NAME: &'static str;
    /// Reads the member's value.
    fn read<'de: 'a, 'a, A: serde::de::MapAccess<'de>>(
        map: &mut A,
    ) -> Result<Option<&'a RawValue>, A::Error>;
}

/// `_meta`, and in it `progressToken`.
struct MetaKey;
struct ProgressKey;

impl Key for MetaKey {
    const NAME: &'static str = "_meta";
    fn read<'de: 'a, 'a, A: serde::de::MapAccess<'de>>(
        map: &mut A,
    ) -> Result<Option<&'a RawValue>, A::Error> {
        Ok(map.next_value::<Member<'a, ProgressKey>>()?.0)
    }
}

impl Key for ProgressKey {
    const NAME: &'static str = "progressToken";
    fn read<'de: 'a, 'a, A: serde::de::MapAccess<'de>>(
        map: &mut A,
    ) -> Result<Option<&'a RawValue>, A::Error> {
        Ok(Some(map.next_value::<&'a RawValue>()?))
    }
}

impl<'de: 'a, 'a, K: Key> Deserialize<'de> for Member<'a, K> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a, K>(std::marker::PhantomData<(&'a (), K)>);
        impl<'de: 'a, 'a, K: Key> serde::de::Visitor<'de> for Visit<'a, K> {
            type Value = Member<'a, K>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut found = None;
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    if key == K::NAME && found.is_none() {
                        found = K::read(&mut map)?;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Member(found, std::marker::PhantomData))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Member::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Member::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Member::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Member::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Member::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Member::default())
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Member::default())
            }
            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(Member::default())
            }
        }
        deserializer.deserialize_any(Visit(std::marker::PhantomData))
    }
}

/// A member's raw text when it is there, `null` included (an `Option` would read `null` as
/// absent).
#[derive(Default)]
struct Slot<'a>(Option<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Slot<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        <&'a RawValue>::deserialize(deserializer).map(|raw| Slot(Some(raw)))
    }
}

/// Whether a member is there at all — `"result": null` is a result (an `Option` would read
/// it as absent).
#[derive(Default)]
struct Present(bool);

impl<'de> Deserialize<'de> for Present {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(deserializer)?;
        Ok(Present(true))
    }
}

impl RawEnvelope<'_> {
    fn kind(self, has_result_or_error: bool, result: Option<std::ops::Range<usize>>) -> Kind {
        let id = self
            .id
            .map(RawValue::get)
            .filter(|text| *text != "null")
            .map(Id::from_json_text);
        match (self.method, id) {
            (Some(method), Some(id)) => Kind::Request {
                id,
                method: method.into_owned(),
                progress: self.params.0.map(|token| token.get().into()),
            },
            (Some(method), None) => Kind::Notification {
                method: method.into_owned(),
            },
            (None, id) if has_result_or_error => Kind::Response { id, result },
            (None, _) => Kind::Other,
        }
    }
}

/// `line`: the text the envelope was read from, for the range of its `result`.
fn classify(envelope: RawEnvelope<'_>, line: &[u8]) -> Kind {
    let result = envelope.result.0.map(|raw| {
        let start = (raw.get().as_ptr() as usize).saturating_sub(line.as_ptr() as usize);
        start..start + raw.get().len()
    });
    let has = result.is_some() || envelope.error.0;
    envelope.kind(has, result)
}

/// Reads the envelope of one line. The line is not copied or modified.
pub fn parse(line: &[u8]) -> Result<Parsed, NotJson> {
    // Strings the envelope skips are not checked by serde; JSON text must be UTF-8 throughout.
    std::str::from_utf8(line)?;
    let first = line.iter().find(|b| !b.is_ascii_whitespace()).copied();
    if first == Some(b'[') {
        let elements: Vec<&RawValue> = serde_json::from_slice(line)?;
        let kinds = elements
            .into_iter()
            .map(|raw| {
                if !raw.get().trim_start().starts_with('{') {
                    return Kind::Invalid;
                }
                match serde_json::from_str::<RawEnvelope<'_>>(raw.get()) {
                    Ok(envelope) => classify(envelope, line),
                    Err(_) => Kind::Other,
                }
            })
            .collect();
        return Ok(Parsed::Batch(kinds));
    }
    if first == Some(b'{') {
        let envelope: RawEnvelope<'_> = serde_json::from_slice(line)?;
        return Ok(Parsed::Single(classify(envelope, line)));
    }
    // Scalars and garbage: let serde produce the precise error, or call a bare scalar invalid.
    let _: IgnoredAny = serde_json::from_slice(line)?;
    Ok(Parsed::Single(Kind::Invalid))
}

#[derive(Deserialize)]
struct ProgressParams<'a> {
    #[serde(borrow)]
    params: Option<TokenHolder<'a>>,
}

#[derive(Deserialize)]
struct TokenHolder<'a> {
    #[serde(borrow, rename = "progressToken")]
    progress_token: Option<&'a RawValue>,
}

/// The progress token (JSON text) of a `notifications/progress`: `params.progressToken`.
pub fn progress_token(line: &[u8]) -> Option<String> {
    let message: ProgressParams<'_> = serde_json::from_slice(line).ok()?;
    Some(message.params?.progress_token?.get().to_string())
}

#[derive(Deserialize)]
struct IdOnly<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
}

/// The part of a `notifications/cancelled` that names the request.
#[derive(Deserialize)]
struct Cancelled<'a> {
    #[serde(borrow)]
    params: Option<CancelledParams<'a>>,
}

#[derive(Deserialize)]
struct CancelledParams<'a> {
    #[serde(borrow, rename = "requestId")]
    request_id: Option<&'a RawValue>,
}

/// `line` with the bytes of `part` (a slice of it) replaced by `new`.
pub fn splice(line: &[u8], part: &str, new: &[u8]) -> Vec<u8> {
    let start = (part.as_ptr() as usize).saturating_sub(line.as_ptr() as usize);
    let start = start.min(line.len());
    let end = (start + part.len()).min(line.len());
    let mut out = Vec::with_capacity(line.len() - (end - start) + new.len());
    out.extend_from_slice(&line[..start]);
    out.extend_from_slice(new);
    out.extend_from_slice(&line[end..]);
    out
}

/// One message with its top-level `id` replaced by `id_text` (JSON text); the rest unchanged.
pub fn with_id(line: &[u8], id_text: &str) -> Option<Vec<u8>> {
    let message: IdOnly<'_> = serde_json::from_slice(line).ok()?;
    Some(splice(line, message.id?.get(), id_text.as_bytes()))
}

/// A `notifications/cancelled` with its `params.requestId` replaced by `id_text`.
pub fn with_cancelled_id(line: &[u8], id_text: &str) -> Option<Vec<u8>> {
    let message: Cancelled<'_> = serde_json::from_slice(line).ok()?;
    Some(splice(
        line,
        message.params?.request_id?.get(),
        id_text.as_bytes(),
    ))
}

/// The id keys of the responses in a line (one message or a batch).
pub fn response_keys(line: &[u8]) -> Vec<String> {
    parse(line)
        .map(|parsed| parsed.response_keys())
        .unwrap_or_default()
}

impl Parsed {
    /// The id keys of the responses among these messages.
    pub fn response_keys(&self) -> Vec<String> {
        self.kinds()
            .iter()
            .filter_map(|kind| match kind {
                Kind::Response { id: Some(id), .. } => Some(id.key().to_string()),
                _ => None,
            })
            .collect()
    }
}

/// The `result.protocolVersion` of an `initialize` response.
pub fn protocol_version(line: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Response {
        result: Option<Initialized>,
    }
    #[derive(Deserialize)]
    struct Initialized {
        #[serde(rename = "protocolVersion")]
        protocol_version: Option<String>,
    }
    serde_json::from_slice::<Response>(line)
        .ok()?
        .result?
        .protocol_version
}

/// The `params.requestId` of a `notifications/cancelled`, if the line carries one.
pub fn cancelled_request_id(line: &[u8]) -> Option<Id> {
    let parsed: Cancelled<'_> = serde_json::from_slice(line).ok()?;
    parsed
        .params?
        .request_id
        .map(|raw| Id::from_json_text(raw.get()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn single(line: &str) -> Kind {
        match parse(line.as_bytes()) {
            Ok(Parsed::Single(kind)) => kind,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn classifies_the_four_kinds() {
        assert_eq!(
            single(r#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#),
            Kind::Request {
                id: Id::from_json_text("7"),
                method: "tools/list".into(),
                progress: None,
            }
        );
        assert_eq!(
            single(r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#),
            Kind::Notification {
                method: "notifications/progress".into()
            }
        );
        assert_eq!(
            single(r#"{"jsonrpc":"2.0","id":"a","result":{}}"#),
            Kind::Response {
                id: Some(Id::from_json_text(r#""a""#)),
                // Where the result is: `{}` at bytes 35..37.
                result: Some(35..37),
            }
        );
        assert_eq!(
            single(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#),
            Kind::Response {
                id: None,
                result: None
            }
        );
        assert_eq!(single(r#"{"hello":1}"#), Kind::Other);
        assert_eq!(single("42"), Kind::Invalid);
    }

    #[test]
    fn a_null_result_is_a_response() {
        assert_eq!(
            single(r#"{"jsonrpc":"2.0","id":3,"result":null}"#),
            Kind::Response {
                id: Some(Id::from_json_text("3")),
                result: Some(33..37),
            }
        );
    }

    #[test]
    fn method_with_escapes_is_decoded() {
        assert_eq!(
            single(r#"{"id":1,"method":"tools\/call"}"#),
            Kind::Request {
                id: Id::from_json_text("1"),
                method: "tools/call".into(),
                progress: None,
            }
        );
    }

    #[test]
    fn id_keys_ignore_number_formatting_but_keep_raw_text() {
        let a = Id::from_json_text("7.0");
        let b = Id::from_json_text("7");
        assert_eq!(a.key(), b.key());
        assert_eq!(a.raw(), "7.0");
        assert_ne!(Id::from_json_text(r#""7""#).key(), b.key());
    }

    #[test]
    fn batches_are_classified_per_element() {
        let parsed = parse(br#"[{"id":1,"method":"ping"},{"method":"n"},3]"#).unwrap();
        assert_eq!(
            parsed,
            Parsed::Batch(vec![
                Kind::Request {
                    id: Id::from_json_text("1"),
                    method: "ping".into(),
                    progress: None,
                },
                Kind::Notification { method: "n".into() },
                Kind::Invalid,
            ])
        );
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse(b"not json").is_err());
        assert!(parse(br#"{"id":1,"#).is_err());
    }

    #[test]
    fn progress_tokens_are_read_as_written() {
        assert_eq!(
            progress_token(br#"{"method":"notifications/progress","params":{"progressToken":"t 1","progress":1}}"#).as_deref(),
            Some(r#""t 1""#)
        );
        // A request's token is read with its envelope, whatever shape its params have.
        let token = |line: &str| match single(line) {
            Kind::Request { progress, .. } => progress.map(String::from),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            token(r#"{"id":1,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":7}}}"#).as_deref(),
            Some("7")
        );
        assert_eq!(
            token(r#"{"id":1,"method":"x","params":{"_meta":{"a":[1,{"b":2}],"progressToken":"t\"1"},"z":1.5e3}}"#).as_deref(),
            Some(r#""t\"1""#)
        );
        assert_eq!(token(r#"{"id":1,"method":"ping"}"#), None);
        assert_eq!(
            token(r#"{"id":1,"method":"x","params":[1,2,{"_meta":{}}]}"#),
            None
        );
        assert_eq!(
            token(r#"{"id":1,"method":"x","params":{"_meta":"no"}}"#),
            None
        );
        assert_eq!(token(r#"{"id":1,"method":"x","params":null}"#), None);
        assert_eq!(token(r#"{"id":1,"method":"x","params":{"_meta":{"progressToken":12345678901234567890123}}}"#).as_deref(), Some("12345678901234567890123"));
    }

    #[test]
    fn ids_are_replaced_in_place() {
        assert_eq!(
            with_id(
                br#"{"jsonrpc":"2.0", "id" : 1.0,"result":{"id":1}}"#,
                r#""m-1""#
            )
            .unwrap(),
            br#"{"jsonrpc":"2.0", "id" : "m-1","result":{"id":1}}"#
        );
        assert_eq!(
            with_cancelled_id(
                br#"{"method":"notifications/cancelled","params":{"requestId":7,"reason":"x"}}"#,
                r#""m-2""#
            )
            .unwrap(),
            br#"{"method":"notifications/cancelled","params":{"requestId":"m-2","reason":"x"}}"#
        );
    }

    #[test]
    fn cancelled_id_is_read() {
        let id = cancelled_request_id(
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"r9"}}"#,
        );
        assert_eq!(id.map(|i| i.key().to_string()), Some(r#""r9""#.to_string()));
    }
}
