//! The serde read of a message's envelope: the members the relay reads (`id`, `method`,
//! `result`, `error`, `params` and its `_meta`), borrowed from the line, every key the envelope
//! holds checked for a second spelling; and what a message's kind is, from them.

use std::borrow::Cow;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use crate::protocol::{METHODS, SUPPORTED};

use super::{
    CallAt, Id, Kind, META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_VERSION, Modern, Problem,
};

/// The keys of one object seen so far (the serde read, which is the slow path): a key seen
/// twice is noted as a duplicate in `place`.
#[derive(Default)]
struct Keys(std::collections::HashSet<String>);

impl Keys {
    fn note(&mut self, key: &str, place: &'static str, duplicate: &mut Option<&'static str>) {
        if !self.0.insert(key.to_string()) && duplicate.is_none() {
            *duplicate = Some(place);
        }
    }
}

/// Notes the first key seen twice.
fn once(seen: &mut bool, duplicate: &mut Option<&'static str>, name: &'static str) {
    if std::mem::replace(seen, true) && duplicate.is_none() {
        *duplicate = Some(name);
    }
}

/// The members of a message the relay reads; a duplicate key keeps the last value (as the
/// parsers of JavaScript and Python do) and is noted.
#[derive(Default)]
pub(super) struct Envelope<'a> {
    /// (Values as their JSON text, borrowed from the line.)
    pub(super) id: Option<&'a str>,
    pub(super) method: Option<&'a str>,
    pub(super) result: Option<&'a str>,
    pub(super) error: bool,
    pub(super) params: Params<'a>,
    /// `params` is there and is not an object.
    pub(super) bad_params: bool,
    pub(super) duplicate: Option<&'static str>,
    /// Another key of the message appears twice.
    pub(super) duplicate_in: Option<&'static str>,
    /// Read by hand: the whole message was checked for what the common JSON readers read
    /// differently, and this is the first such thing found (`Some(None)`: nothing). `None`
    /// from the serde read, which does not check.
    pub(super) two_ways: Option<Option<super::Problem>>,
}

/// What the relay reads of `params`: `_meta`'s progress token and modern keys, where the
/// members a modern request's `Mcp-Name` carries are, and whether a key the proxy decides on
/// appears twice.
#[derive(Default)]
pub(super) struct Params<'a> {
    pub(super) progress: Option<Box<str>>,
    pub(super) version: Option<Cow<'static, str>>,
    pub(super) client: Option<String>,
    pub(super) capabilities: bool,
    pub(super) duplicate: Option<&'static str>,
    /// Another key of `params` or `_meta` appears twice (which of them).
    pub(super) duplicate_in: Option<&'static str>,
    /// `name`, `uri`, `taskId` (decoded only for a modern request, where a header names one).
    pub(super) named: [Option<&'a str>; 3],
    /// `arguments`, as it is.
    pub(super) arguments: Option<&'a str>,
    /// `params` is an object.
    pub(super) object: bool,
}

/// `Deserialize` for a type read from a JSON object by `$visit(map)`; any other JSON value
/// reads as the type's default (a `params` that is an array has no `_meta`).
/// An object's key, borrowed from the line unless it has escapes (serde's own `Cow<str>`
/// always copies: one allocation per key read).
pub(crate) struct Key<'a>(pub Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(key)))
            }
            fn visit_str<E>(self, key: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key.to_string())))
            }
            fn visit_string<E>(self, key: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key)))
            }
        }
        deserializer.deserialize_str(Visit)
    }
}

macro_rules! from_object {
    ($ty:ident, |$map:ident| $visit:block) => {
        impl<'de: 'a, 'a> Deserialize<'de> for $ty<'a> {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Visit<'a>(std::marker::PhantomData<&'a ()>);
                impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
                    type Value = $ty<'a>;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str("any JSON value")
                    }
                    fn visit_map<A: serde::de::MapAccess<'de>>(
                        self,
                        mut $map: A,
                    ) -> Result<Self::Value, A::Error> {
                        $visit
                    }
                    fn visit_seq<A: serde::de::SeqAccess<'de>>(
                        self,
                        mut seq: A,
                    ) -> Result<Self::Value, A::Error> {
                        while seq.next_element::<IgnoredAny>()?.is_some() {}
                        Ok(Default::default())
                    }
                    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                        Ok(Default::default())
                    }
                    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                        Ok(Default::default())
                    }
                    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                        Ok(Default::default())
                    }
                    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                        Ok(Default::default())
                    }
                    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                        Ok(Default::default())
                    }
                    fn visit_unit<E>(self) -> Result<Self::Value, E> {
                        Ok(Default::default())
                    }
                    fn visit_none<E>(self) -> Result<Self::Value, E> {
                        Ok(Default::default())
                    }
                }
                deserializer.deserialize_any(Visit(std::marker::PhantomData))
            }
        }
    };
}

from_object!(Envelope, |map| {
    let mut out = Envelope::default();
    let [
        mut jsonrpc,
        mut id,
        mut method,
        mut result,
        mut error,
        mut params,
    ] = [false; 6];
    let mut keys = Keys::default();
    while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
        keys.note(&key, "the message", &mut out.duplicate_in);
        let dup = &mut out.duplicate;
        match key.as_ref() {
            "jsonrpc" => {
                once(&mut jsonrpc, dup, "jsonrpc");
                map.next_value::<IgnoredAny>()?;
            }
            "id" => {
                once(&mut id, dup, "id");
                out.id = Some(map.next_value::<&'a RawValue>()?.get());
            }
            "method" => {
                once(&mut method, dup, "method");
                out.method = Some(map.next_value::<&'a RawValue>()?.get());
            }
            "result" => {
                once(&mut result, dup, "result");
                out.result = Some(map.next_value::<&'a RawValue>()?.get());
            }
            "error" => {
                once(&mut error, dup, "error");
                map.next_value::<IgnoredAny>()?;
                out.error = true;
            }
            "params" => {
                once(&mut params, dup, "params");
                let read: ParamsRead<'a> = map.next_value()?;
                out.bad_params = !read.0.object;
                out.params = read.0;
            }
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
    }
    Ok(out)
});

/// [`Params`] as read (the lifetime is the macro's).
#[derive(Default)]
struct ParamsRead<'a>(Params<'a>, std::marker::PhantomData<&'a ()>);

from_object!(ParamsRead, |map| {
    let mut out = Params {
        object: true,
        ..Params::default()
    };
    let [mut name, mut arguments, mut meta, mut task] = [false; 4];
    let mut keys = Keys::default();
    while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
        keys.note(&key, "params", &mut out.duplicate_in);
        let dup = &mut out.duplicate;
        let named = match key.as_ref() {
            "name" => Some(0),
            "uri" => Some(1),
            "taskId" => Some(2),
            _ => None,
        };
        if let Some(slot) = named {
            if slot == 0 {
                once(&mut name, dup, "params.name");
            }
            out.named[slot] = Some(map.next_value::<&'a RawValue>()?.get());
            continue;
        }
        match key.as_ref() {
            "arguments" => {
                once(&mut arguments, dup, "params.arguments");
                out.arguments = Some(map.next_value::<&'a RawValue>()?.get());
                continue;
            }
            "task" => once(&mut task, dup, "params.task"),
            "_meta" => {
                once(&mut meta, dup, "params._meta");
                let read: MetaRead<'a> = map.next_value()?;
                let read = read.0;
                out.progress = read.progress;
                out.version = read.version;
                out.client = read.client;
                out.capabilities = read.capabilities;
                if out.duplicate.is_none() {
                    out.duplicate = read.duplicate;
                }
                if out.duplicate_in.is_none() {
                    out.duplicate_in = read.duplicate_in;
                }
                continue;
            }
            _ => {}
        }
        map.next_value::<IgnoredAny>()?;
    }
    Ok(ParamsRead(out, std::marker::PhantomData))
});

/// `_meta`: the same fields as [`Params`].
#[derive(Default)]
struct MetaRead<'a>(Params<'a>, std::marker::PhantomData<&'a ()>);

from_object!(MetaRead, |map| {
    let mut out = Params::default();
    let [mut progress, mut version, mut client, mut capabilities] = [false; 4];
    let mut keys = Keys::default();
    while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
        keys.note(&key, "params._meta", &mut out.duplicate_in);
        let dup = &mut out.duplicate;
        match key.as_ref() {
            "progressToken" => {
                once(&mut progress, dup, "params._meta.progressToken");
                let token: &'a RawValue = map.next_value()?;
                out.progress = Some(token.get().into());
            }
            META_VERSION => {
                once(
                    &mut version,
                    dup,
                    "params._meta.io.modelcontextprotocol/protocolVersion",
                );
                // A version that is not a string is still a modern request (one the proxy
                // answers with the supported versions).
                let value: &'a RawValue = map.next_value()?;
                out.version = Some(meta_version(value.get()));
            }
            META_CLIENT_INFO => {
                once(
                    &mut client,
                    dup,
                    "params._meta.io.modelcontextprotocol/clientInfo",
                );
                let info: &'a RawValue = map.next_value()?;
                out.client = client_name(info.get());
            }
            META_CLIENT_CAPABILITIES => {
                once(
                    &mut capabilities,
                    dup,
                    "params._meta.io.modelcontextprotocol/clientCapabilities",
                );
                map.next_value::<IgnoredAny>()?;
                out.capabilities = true;
            }
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
    }
    Ok(MetaRead(out, std::marker::PhantomData))
});

/// `value`, not copied when it is a revision or a method the proxy knows.
pub fn interned(value: &str) -> Cow<'static, str> {
    match static_header(value) {
        Some(known) => Cow::Borrowed(known),
        None => Cow::Owned(value.to_string()),
    }
}

/// `value` as a static string, when it is a revision or a method the proxy knows (a header
/// made of it is not copied).
pub fn static_header(value: &str) -> Option<&'static str> {
    SUPPORTED
        .iter()
        .copied()
        .chain(METHODS.iter().map(|m| m.name))
        .find(|known| *known == value)
}

/// `_meta`'s protocol version: a known revision is not copied. A version that is not a string is
/// still a modern request's (one the proxy answers with the supported versions).
pub(super) fn meta_version(raw: &str) -> Cow<'static, str> {
    match plain(raw) {
        Some(version) => interned(version),
        None => Cow::Owned(string_value(raw).unwrap_or_else(|| raw.to_string())),
    }
}

/// The text between a JSON string's quotes when it has no escapes: its value as it stands.
/// `None` for a string with escapes, or any other value.
pub(super) fn plain(text: &str) -> Option<&str> {
    text.strip_prefix('"')?
        .strip_suffix('"')
        .filter(|inner| !inner.contains('\\'))
}

/// The value of a JSON string (`None` for any other value): one without escapes is its text
/// between the quotes, taken as it is (no second read).
pub(super) fn string_value(text: &str) -> Option<String> {
    match plain(text) {
        Some(inner) => Some(inner.to_string()),
        None => serde_json::from_str::<String>(text).ok(),
    }
}

/// The `name` of a `clientInfo` object, when it is a string: taken from the text when the
/// object opens with it, unescaped and not repeated (as the SDKs write it), else read.
pub(super) fn client_name(info: &str) -> Option<String> {
    if let Some(rest) = info.strip_prefix(r#"{"name":""#)
        && let Some(end) = memchr::memchr(b'"', rest.as_bytes())
        && !rest[..end].contains('\\')
        && !rest.as_bytes()[end..]
            .windows(6)
            .any(|window| window == b"\"name\"")
    {
        return Some(rest[..end].to_string());
    }
    serde_json::from_str::<NameRead<'_>>(info)
        .ok()
        .and_then(|read| read.0)
}

/// An object's `name`, when it is a string.
#[derive(Default)]
struct NameRead<'a>(Option<String>, std::marker::PhantomData<&'a ()>);

from_object!(NameRead, |map| {
    let mut name = None;
    while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
        if key == "name" {
            let value: &'a RawValue = map.next_value()?;
            name = string_value(value.get());
        } else {
            map.next_value::<IgnoredAny>()?;
        }
    }
    Ok(NameRead(name, std::marker::PhantomData))
});

impl Envelope<'_> {
    /// `line`: the text the envelope was read from, for the range of its `result`.
    pub(super) fn kind(self, line: &[u8]) -> Kind {
        let at = |raw: &str| {
            let start = (raw.as_ptr() as usize).saturating_sub(line.as_ptr() as usize);
            start..start + raw.len()
        };
        let result = self.result.map(at);
        let raw_id = self.id.filter(|text| *text != "null");
        let null_id = self.id == Some("null");
        let id = raw_id.and_then(Id::parse);
        // A method without escapes is its text between the quotes (no second read).
        let method = self.method.map(|raw| match plain(raw) {
            Some(method) => Ok(Cow::Borrowed(method)),
            None => serde_json::from_str::<Cow<'_, str>>(raw),
        });
        let problem = if let Some(key) = self.duplicate.or(self.params.duplicate) {
            Some(Problem::Duplicate(key))
        } else if let Some(place) = self.duplicate_in.or(self.params.duplicate_in) {
            Some(Problem::DuplicateIn(place))
        } else if raw_id.is_some() && id.is_none() {
            Some(Problem::BadId)
        } else if matches!(method, Some(Err(_))) {
            Some(Problem::BadMethod)
        } else if null_id && method.is_some() {
            Some(Problem::NullId)
        } else {
            None
        };
        if let Some(problem) = problem {
            return Kind::Malformed { id, problem };
        }
        let method = method.and_then(Result::ok);
        let params = self.params;
        match (method, id) {
            (Some(method), Some(id)) => Kind::Request {
                modern: params.version.map(|version| {
                    let slot = match crate::protocol::name_member(&method) {
                        Some("name") => Some(0),
                        Some("uri") => Some(1),
                        Some(_) => Some(2),
                        None => None,
                    };
                    let named = slot
                        .and_then(|slot| params.named[slot])
                        .and_then(string_value);
                    Box::new(Modern {
                        version,
                        client: params.client,
                        capabilities: params.capabilities,
                        named,
                        id_at: self.id.map(at).unwrap_or_default(),
                    })
                }),
                call: (method == "tools/call").then(|| CallAt {
                    bad_params: self.bad_params,
                    name: params.named[0].map(at),
                    arguments: params.arguments.map(at),
                }),
                id,
                method: method.into_owned(),
                progress: params.progress,
            },
            (Some(method), None) => Kind::Notification {
                method: method.into_owned(),
            },
            (None, id) if result.is_some() || self.error => Kind::Response { id, result },
            (None, id @ Some(_)) => Kind::Malformed {
                id,
                problem: Problem::NoMethod,
            },
            (None, None) => Kind::Other,
        }
    }
}
