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

mod envelope;
mod quick;
mod scanner;
mod two_ways;

use envelope::Envelope;
pub(crate) use envelope::Key;
#[cfg(test)]
use envelope::{client_name, string_value};
pub use envelope::{interned, static_header};

pub use scanner::EnvelopeScanner;
#[cfg(test)]
use two_ways::has_lone_surrogate;
use two_ways::read_two_ways;

use quick::quick_envelope;
#[cfg(test)]
use quick::stop_at;

/// What a single JSON-RPC message is, judged from its envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Has `method` and a non-null `id`; `progress`: its `params._meta.progressToken` (JSON
    /// text), and `modern`: what the 2026-07-28 era puts in its `_meta`, both read with the
    /// envelope; `call`: where a `tools/call`'s name and arguments are (read with the envelope,
    /// so that the call is not read again).
    Request {
        id: Id,
        method: String,
        progress: Option<Box<str>>,
        modern: Option<Box<Modern>>,
        call: Option<CallAt>,
    },
    /// Has `method` and no `id`.
    Notification { method: String },
    /// Has `result` or `error` and no `method`; `result`: where its `result` is in the line,
    /// so that no later reader has to look for it again.
    Response {
        id: Option<Id>,
        result: Option<std::ops::Range<usize>>,
    },
    /// A message the proxy must not act on as it stands (see [`Problem`]); `id`: its id, when
    /// that is a valid one, to answer it under.
    Malformed { id: Option<Id>, problem: Problem },
    /// A JSON object that is not a JSON-RPC message the relay can classify (forwarded as is).
    Other,
    /// JSON that is not an object (a scalar, or an array inside a batch): never JSON-RPC.
    Invalid,
}

/// Where a `tools/call` request's `params.name` and `params.arguments` are in its line (their
/// JSON text, as the envelope reader found them).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CallAt {
    /// `params` is there and is not an object: the call cannot be read.
    pub bad_params: bool,
    pub name: Option<std::ops::Range<usize>>,
    pub arguments: Option<std::ops::Range<usize>>,
}

impl CallAt {
    /// The line was changed at `at` (`removed` bytes there became `added`): what came after moves
    /// with it.
    pub fn shift_after(&mut self, at: usize, removed: usize, added: usize) {
        for range in [&mut self.name, &mut self.arguments].into_iter().flatten() {
            if range.start >= at {
                *range = range.start + added - removed..range.end + added - removed;
            }
        }
    }
}

/// What a request of the 2026-07-28 era ("modern") carries in its `_meta`: the era is decided
/// here, where the message comes in, and travels with it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Modern {
    /// `_meta["io.modelcontextprotocol/protocolVersion"]` (a revision the proxy knows, not
    /// copied).
    pub version: Cow<'static, str>,
    /// `_meta["io.modelcontextprotocol/clientInfo"].name`.
    pub client: Option<String>,
    /// Whether `_meta["io.modelcontextprotocol/clientCapabilities"]` is there.
    pub capabilities: bool,
    /// What the method's `Mcp-Name` carries (`params.name`, `uri` or `taskId`, decoded), when
    /// it is a string.
    pub named: Option<String>,
    /// Where the request's id is in the line (to give it another without reading it again).
    pub id_at: std::ops::Range<usize>,
}

/// The `_meta` key that makes a request modern.
pub const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// The `_meta` key of the client's identity in a modern request.
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
/// The `_meta` key of the client's capabilities in a modern request.
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// The `_meta` key of the server's identity on a modern result.
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// How deeply a client's message may nest (serde_json's own recursion limit): deeper ones are
/// refused before anything parses them, here or upstream.
pub const MAX_DEPTH: usize = 128;

/// Why a message is [`Kind::Malformed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// A key the proxy decides on appears twice: the proxy cannot know which one the server
    /// will read, so it reads neither.
    Duplicate(&'static str),
    /// Another key of the envelope (the message, `params` or `params._meta`: named here)
    /// appears twice.
    DuplicateIn(&'static str),
    /// The id is neither a string nor an integer a double holds exactly, written plainly.
    BadId,
    /// A request's id is `null` (MCP: ids MUST NOT be null); as a notification it would pass
    /// every check a request gets.
    NullId,
    /// A string escape that JSON readers decode differently (a lone UTF-16 surrogate):
    /// serde refuses it, JavaScript and Python keep it.
    LoneSurrogate,
    /// A number the common JSON readers read as different values (an integer past 2^53, a
    /// number past a double's range).
    UnsafeNumber,
    /// An element of a batch whose envelope cannot be read (a key that does not decode).
    Unreadable,
    /// A JSON object with no `method`, `id`, `result` or `error`: no JSON-RPC message.
    NotJsonRpc,
    /// An id, and no `method`, `result` or `error`.
    NoMethod,
    /// `method` is not a string.
    BadMethod,
    /// Nested deeper than [`MAX_DEPTH`].
    TooDeep,
}

impl Problem {
    /// The error message for the client, naming the fix.
    pub fn message(self) -> String {
        match self {
            Problem::Duplicate(key) => format!(
                "Invalid Request: the message has the key \"{key}\" twice; send each key once (the proxy does not guess which one the server would read)"
            ),
            Problem::DuplicateIn(place) => format!(
                "Invalid Request: a key of {place} appears twice; send each key once (JSON readers differ on which one counts, so the proxy reads neither)"
            ),
            Problem::BadId => "Invalid Request: the id must be a string, or an integer written plainly (no fraction, exponent, leading zero or -0) between -9007199254740991 and 9007199254740991, which every JSON reader reads as the same number".into(),
            Problem::NullId => "Invalid Request: a request's id must not be null (MCP); give it a string or an integer id, or leave the id out for a notification".into(),
            Problem::LoneSurrogate => "Invalid Request: the message has a \\u escape of a lone UTF-16 surrogate (\\ud800-\\udfff without its pair), which JSON readers decode differently; send the character itself or a valid surrogate pair".into(),
            Problem::UnsafeNumber => "Invalid Request: the message has a number JSON readers read differently (an integer of magnitude 2^53 = 9007199254740992 or more, or a number past a double's range); send it as a string".into(),
            Problem::Unreadable => "Invalid Request: this element's envelope cannot be read (a key or string that does not decode); send valid JSON text".into(),
            Problem::NotJsonRpc => "Invalid Request: the object has no \"method\" (a request or notification) and no \"result\" or \"error\" (a response)".into(),
            Problem::NoMethod => "Invalid Request: a request needs a \"method\" (a string)".into(),
            Problem::BadMethod => "Invalid Request: \"method\" must be a string".into(),
            Problem::TooDeep => format!(
                "Invalid Request: the message nests deeper than {MAX_DEPTH} levels; send a flatter value"
            ),
        }
    }
}

/// A request id, as the peer wrote it and as a key that compares ids as JSON values.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Id {
    /// The id's JSON text exactly as it arrived (`7`, `"abc"`), used to echo it back. Shared:
    /// an id is cloned for every table it is in, and a clone costs no allocation.
    raw: std::sync::Arc<str>,
    /// The comparison key: the value, written one way (`"\u0061"` and `"a"` are one id, and so
    /// are `1.50`, `1.5` and `15e-1`); `None` when it is the raw text itself (most ids).
    key: Option<std::sync::Arc<str>>,
}

/// The key of an id's JSON text: `None` when it is not a string or a finite number.
fn id_key(raw: &str) -> Option<Cow<'_, str>> {
    // The common ids, written the one way already: a string with nothing escaped, or an
    // integer of fewer than 16 digits (no leading zero, not -0). Their key is their text.
    if let Some(inner) = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"'))
        && !inner.bytes().any(|b| b == b'\\' || b == b'"' || b < 0x20)
    {
        return Some(Cow::Borrowed(raw));
    }
    let digits = raw.strip_prefix('-').unwrap_or(raw);
    if !digits.is_empty()
        && digits.len() < 16
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" && raw == "0" || !digits.starts_with('0'))
    {
        return Some(Cow::Borrowed(raw));
    }
    if raw.starts_with('"') {
        let value: Cow<'_, str> = serde_json::from_str(raw).ok()?;
        return serde_json::to_string(&value).ok().map(Cow::Owned);
    }
    // A number: only an integer written plainly that a double holds exactly. JavaScript reads
    // 9007199254740993 as ...992 and 1e16 as 10000000000000000: two ids to the proxy would be
    // one to such a server, and the answers would cross.
    (digits.len() == 16
        && digits.bytes().all(|b| b.is_ascii_digit())
        && !digits.starts_with('0')
        && digits < "9007199254740992")
        .then_some(Cow::Borrowed(raw))
}

impl Id {
    /// Builds an id from JSON text the proxy trusts (its own, or one read before).
    pub fn from_json_text(raw: &str) -> Id {
        let raw = raw.trim();
        let key = id_key(raw).unwrap_or(Cow::Borrowed(raw));
        Id::of(raw, key)
    }

    /// An id of the proxy's own, the string `"{prefix}{n}"` (`prefix` plain text: nothing to
    /// escape). Written in place: one allocation, no read of it again.
    pub fn numbered(prefix: &str, n: u64) -> Id {
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(n);
        let mut text = [0u8; 64];
        let len = prefix.len() + digits.len() + 2;
        let raw: std::sync::Arc<str> = match text.get_mut(..len) {
            Some(out) => {
                out[0] = b'"';
                out[1..=prefix.len()].copy_from_slice(prefix.as_bytes());
                out[prefix.len() + 1..len - 1].copy_from_slice(digits.as_bytes());
                out[len - 1] = b'"';
                match std::str::from_utf8(out) {
                    Ok(text) => std::sync::Arc::from(text),
                    Err(_) => std::sync::Arc::from(format!("\"{prefix}{digits}\"")),
                }
            }
            None => std::sync::Arc::from(format!("\"{prefix}{digits}\"")),
        };
        debug_assert!(id_key(&raw).is_some_and(|key| *key == *raw));
        Id { raw, key: None }
    }

    /// An id a peer sent: `None` unless it is a string or a finite number.
    pub fn parse(raw: &str) -> Option<Id> {
        let raw = raw.trim();
        let key = id_key(raw)?;
        Some(Id::of(raw, key))
    }

    fn of(raw: &str, key: Cow<'_, str>) -> Id {
        let key = match key {
            Cow::Owned(key) if key != raw => Some(std::sync::Arc::from(key)),
            _ => None,
        };
        Id {
            raw: std::sync::Arc::from(raw),
            key,
        }
    }

    /// The id's JSON text as the peer wrote it.
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// The key used to match a response to its request.
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or(&self.raw)
    }

    /// Whether the id is written the one way every parser writes it back: an integer, or a
    /// string without needless escapes.
    pub fn is_plain(&self) -> bool {
        self.key.is_none()
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

/// Whether `line` nests arrays and objects deeper than `max` (strings are skipped).
pub fn nests_deeper(line: &[u8], max: usize) -> bool {
    // A line with no more opening brackets than the bound cannot nest past it (strings
    // included, the count is an upper bound): most lines are done with one fast count.
    if memchr::memchr2_iter(b'[', b'{', line).nth(max).is_none() {
        return false;
    }
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in line {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Reads the envelope of one line. The line is not copied or modified.
pub fn parse(line: &[u8]) -> Result<Parsed, NotJson> {
    // JSON text must be UTF-8 throughout: checked once, for the whole line, and the text is
    // read as a `str` from then on (serde's byte reader would check every string again).
    let text = std::str::from_utf8(line)?;
    let first = line.iter().find(|b| !b.is_ascii_whitespace()).copied();
    if first == Some(b'[') {
        let elements: Vec<&RawValue> = serde_json::from_str(text)?;
        let kinds = elements
            .into_iter()
            .map(|raw| {
                if !raw.get().trim_start().starts_with('{') {
                    return Kind::Invalid;
                }
                let envelope = match quick_envelope(raw.get()) {
                    Some(envelope) => Ok(envelope),
                    None => serde_json::from_str::<Envelope<'_>>(raw.get()),
                };
                match envelope {
                    Ok(envelope) => {
                        let mut kind = envelope.kind(line);
                        // A call's parts are found in its element, as the relay reads it.
                        if let Kind::Request {
                            call: Some(call), ..
                        } = &mut kind
                        {
                            let offset = (raw.get().as_ptr() as usize)
                                .saturating_sub(line.as_ptr() as usize);
                            call.shift_after(0, offset, 0);
                        }
                        kind
                    }
                    // Never "something else" to forward: an element is refused as a message
                    // alone would be.
                    Err(_) => Kind::Malformed {
                        id: None,
                        problem: Problem::Unreadable,
                    },
                }
            })
            .collect();
        return Ok(Parsed::Batch(kinds));
    }
    if first == Some(b'{') {
        let envelope = match quick_envelope(text) {
            Some(envelope) => envelope,
            None => serde_json::from_str(text)?,
        };
        return Ok(Parsed::Single(envelope.kind(line)));
    }
    // Scalars and garbage: let serde produce the precise error, or call a bare scalar invalid.
    let _: IgnoredAny = serde_json::from_str(text)?;
    Ok(Parsed::Single(Kind::Invalid))
}

/// Reads the envelope of a client's line: like [`parse`], and a line nested deeper than
/// [`MAX_DEPTH`] is [`Problem::TooDeep`] before any parser recurses into it (its id read by a
/// scan, to answer it).
pub fn parse_from_client(line: &[u8]) -> Result<Parsed, NotJson> {
    if nests_deeper(line, MAX_DEPTH) {
        let mut scanner = EnvelopeScanner::default();
        scanner.feed(line);
        let (id, _) = scanner.finish();
        return Ok(Parsed::Single(Kind::Malformed {
            id,
            problem: Problem::TooDeep,
        }));
    }
    // The common message: the hand reader checks what JSON readers read two ways as it reads
    // the envelope, in the same pass.
    if let Ok(text) = std::str::from_utf8(line)
        && text.trim_start().starts_with('{')
        && let Some(envelope) = quick_envelope(text)
        && let Some(found) = envelope.two_ways
    {
        let kind = envelope.kind(line);
        return Ok(Parsed::Single(match found {
            None => kind,
            Some(problem) => refused_two_ways(kind, problem),
        }));
    }
    let parsed = parse(line)?;
    let Some(problem) = read_two_ways(line) else {
        return Ok(parsed);
    };
    // What JSON readers read differently is refused, message by message.
    let refuse = refused_two_ways;
    Ok(match parsed {
        Parsed::Single(kind) => Parsed::Single(refuse(kind, problem)),
        Parsed::Batch(kinds) => {
            let elements: Vec<&RawValue> = serde_json::from_slice(line)?;
            Parsed::Batch(
                kinds
                    .into_iter()
                    .zip(elements)
                    .map(
                        |(kind, element)| match read_two_ways(element.get().as_bytes()) {
                            Some(problem) => refuse(kind, problem),
                            None => kind,
                        },
                    )
                    .collect(),
            )
        }
    })
}

/// `kind`, refused for `problem` (something JSON readers read differently), unless it was
/// refused already for a reason of its own (an id that is no id, say).
fn refused_two_ways(kind: Kind, problem: Problem) -> Kind {
    match kind {
        Kind::Malformed { .. } => kind,
        kind => Kind::Malformed {
            id: kind_id(&kind),
            problem,
        },
    }
}

/// The id a message was read with, when it has a valid one.
fn kind_id(kind: &Kind) -> Option<Id> {
    match kind {
        Kind::Request { id, .. } => Some(id.clone()),
        Kind::Response { id, .. } | Kind::Malformed { id, .. } => id.clone(),
        _ => None,
    }
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

/// The `_meta` key that names the subscription a notification belongs to (2026-07-28).
pub const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

#[derive(Deserialize)]
struct Subscribed<'a> {
    #[serde(borrow)]
    params: Option<SubscribedParams<'a>>,
}

#[derive(Deserialize)]
struct SubscribedParams<'a> {
    #[serde(borrow, rename = "_meta")]
    meta: Option<SubscribedMeta<'a>>,
}

#[derive(Deserialize)]
struct SubscribedMeta<'a> {
    #[serde(borrow, rename = "io.modelcontextprotocol/subscriptionId")]
    id: Option<&'a RawValue>,
}

fn subscription_raw(line: &[u8]) -> Option<&RawValue> {
    static KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(META_SUBSCRIPTION_ID.as_bytes()));
    KEY.find(line)?;
    serde_json::from_slice::<Subscribed<'_>>(line)
        .ok()?
        .params?
        .meta?
        .id
}

/// The subscription a notification names: `params._meta["io.modelcontextprotocol/subscriptionId"]`.
pub fn subscription_id(line: &[u8]) -> Option<Id> {
    Id::parse(subscription_raw(line)?.get())
}

/// A notification with its subscription id replaced by `id_text` (JSON text).
pub fn with_subscription_id(line: &[u8], id_text: &str) -> Option<Vec<u8>> {
    let raw = subscription_raw(line)?;
    Some(splice(line, raw.get(), id_text.as_bytes()))
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

/// `part` (a slice of `line`'s bytes) as text that shares `line`'s buffer: a large result is
/// kept (by the result cache, for its later pages) without a second copy of it.
pub fn shared_part(line: &bytes::Bytes, part: &str) -> bytestring::ByteString {
    // A part of the line, and a `str`: its bytes are UTF-8.
    bytestring::ByteString::try_from(part_of(line, part.as_bytes()))
        .unwrap_or_else(|_| bytestring::ByteString::from(part))
}

/// `part` (a slice of `line`'s bytes) sharing `line`'s buffer when it is most of it; a smaller
/// part (one element of a large batch, say), or one from elsewhere, is copied, so that what is
/// kept of it holds no more than about its own size.
pub fn part_of(line: &bytes::Bytes, part: &[u8]) -> bytes::Bytes {
    let start = (part.as_ptr() as usize).wrapping_sub(line.as_ptr() as usize);
    match start.checked_add(part.len()) {
        Some(end) if start <= line.len() && end <= line.len() && part.len() >= line.len() / 2 => {
            line.slice(start..end)
        }
        _ => bytes::Bytes::copy_from_slice(part),
    }
}

/// A line read into a buffer as large as itself (a line read in chunks may have up to twice
/// its room), shared from then on: what keeps a part of it holds the line's bytes, no more.
pub fn shared_line(mut line: Vec<u8>) -> bytes::Bytes {
    if line.capacity() - line.len() > 64 * 1024 {
        line.shrink_to_fit();
    }
    bytes::Bytes::from(line)
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

/// A message's `params` (JSON text, as written), when it has them.
pub fn params_of(line: &[u8]) -> Option<&str> {
    #[derive(Deserialize)]
    struct Top<'a> {
        #[serde(borrow)]
        params: Option<&'a RawValue>,
    }
    let text = std::str::from_utf8(line).ok()?;
    serde_json::from_str::<Top<'_>>(text)
        .ok()?
        .params
        .map(RawValue::get)
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
                modern: None,
                call: None,
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

    /// A call's name and arguments, where the envelope reader found them.
    fn call_parts(line: &str) -> Vec<(bool, Option<String>, Option<String>)> {
        let kinds = match parse(line.as_bytes()).unwrap() {
            Parsed::Single(kind) => vec![kind],
            Parsed::Batch(kinds) => kinds,
        };
        let elements: Vec<&str> = match line.starts_with('[') {
            true => serde_json::from_str::<Vec<&RawValue>>(line)
                .unwrap()
                .into_iter()
                .map(RawValue::get)
                .collect(),
            false => vec![line],
        };
        kinds
            .into_iter()
            .zip(elements)
            .filter_map(|(kind, text)| match kind {
                Kind::Request {
                    call: Some(call), ..
                } => Some((
                    call.bad_params,
                    call.name.map(|r| text[r].to_string()),
                    call.arguments.map(|r| text[r].to_string()),
                )),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_calls_name_and_arguments_are_found_with_the_envelope() {
        let line = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"arguments":{"a":[1,{"b":2}]},"name":"t\u0031"}}"#;
        assert_eq!(
            call_parts(line),
            vec![(
                false,
                Some(r#""t\u0031""#.to_string()),
                Some(r#"{"a":[1,{"b":2}]}"#.to_string())
            )]
        );
        // In a batch, each element's places are its own.
        let batch = r#"[{"id":1,"method":"ping"}, {"id":2,"method":"tools/call","params":{"name":"x","arguments":{}}}]"#;
        assert_eq!(
            call_parts(batch),
            vec![(false, Some(r#""x""#.to_string()), Some("{}".to_string()))]
        );
        // `params` that is not an object: the call is read whole (and refused there).
        assert_eq!(
            call_parts(r#"{"id":1,"method":"tools/call","params":[1]}"#),
            vec![(true, None, None)]
        );
        // Other methods carry nothing.
        assert!(call_parts(r#"{"id":1,"method":"prompts/get","params":{"name":"x"}}"#).is_empty());
    }

    #[test]
    fn a_calls_places_move_with_a_spliced_id() {
        let line = r#"{"id":7,"method":"tools/call","params":{"name":"t","arguments":{"k":1}}}"#;
        let Parsed::Single(Kind::Request {
            call: Some(mut call),
            ..
        }) = parse(line.as_bytes()).unwrap()
        else {
            panic!("not a call");
        };
        let at = line.find('7').unwrap();
        let spliced = format!("{}\"mcp-budget-s1\"{}", &line[..at], &line[at + 1..]);
        call.shift_after(at + 1, 1, "\"mcp-budget-s1\"".len());
        assert_eq!(&spliced[call.name.unwrap()], r#""t""#);
        assert_eq!(&spliced[call.arguments.unwrap()], r#"{"k":1}"#);
    }

    #[test]
    fn method_with_escapes_is_decoded() {
        assert_eq!(
            single(r#"{"id":1,"method":"tools\/call"}"#),
            Kind::Request {
                id: Id::from_json_text("1"),
                method: "tools/call".into(),
                progress: None,
                modern: None,
                call: Some(CallAt::default()),
            }
        );
    }

    #[test]
    fn id_keys_taken_as_written_are_the_keys_the_long_way_gives() {
        // The short way (the text is the key) and the long way (read the value, write it back)
        // agree on ids written the one way, and the long way is taken for every other.
        for raw in [
            r#""abc""#,
            r#""mcp-budget-s7""#,
            r#""é""#,
            "0",
            "7",
            "-3",
            "123456789012345",
            "1234567890123456",
            "9007199254740991",
            "-9007199254740991",
            r#""a\u0062""#,
            r#""\"""#,
        ] {
            let slow = {
                let value: serde_json::Value = serde_json::from_str(raw).unwrap();
                match value {
                    serde_json::Value::String(s) => serde_json::to_string(&s).unwrap(),
                    serde_json::Value::Number(n) => {
                        let f = n.as_f64().unwrap();
                        if !raw.contains(['.', 'e', 'E']) && f.abs() >= 9.0e15 {
                            raw.to_string()
                        } else if f.fract() == 0.0 {
                            format!("{}", f as i64)
                        } else {
                            format!("{f:e}")
                        }
                    }
                    _ => unreachable!(),
                }
            };
            assert_eq!(Id::from_json_text(raw).key(), slow, "{raw}");
        }
        assert!(Id::parse("01").is_none());
        // Numbers two readers could read as one another are no ids: a fraction, an exponent,
        // -0, 2^53 and past it.
        for bad in [
            "-0",
            "7.0",
            "1e2",
            "9007199254740992",
            "9007199254740993",
            "10000000000000000",
            "12345678901234567890",
        ] {
            assert!(Id::parse(bad).is_none(), "{bad}");
        }
        assert!(Id::parse(r#""a\u0001""#).is_some());
        assert!(
            Id::parse("\"a\u{1}\"").is_none(),
            "a raw control character is no JSON"
        );
    }

    #[test]
    fn string_values_are_read_as_serde_reads_them() {
        for text in [
            r#""a b""#,
            r#""""#,
            r#""\u0061\n""#,
            r#""é""#,
            "7",
            "null",
            r#"{"a":1}"#,
        ] {
            let raw: &RawValue = serde_json::from_str(text).unwrap();
            assert_eq!(
                string_value(raw.get()),
                serde_json::from_str::<String>(text).ok(),
                "{text}"
            );
        }
    }

    /// Lines the hand reader takes, and variants of them (every byte dropped, or changed to one
    /// that matters to JSON): what it accepts, serde accepts alike, with the same envelope.
    #[test]
    fn the_quick_envelope_reads_what_serde_reads() {
        let lines = [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"stream_detail","arguments":{"stream_id":"st-0042"},"_meta":{"progressToken":1}}}"#,
            r#"{"jsonrpc":"2.0","id":"a\"b","method":"tools/call","params":{"name":"x\u0041","arguments":{"a":[1,-2.5e+3,0,true,false,null,{}],"b":"\n"},"_meta":{"progressToken":"t","io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"codex-mcp-client","version":"1"}}}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"{\"a\":1}"}],"structuredContent":{"a":1},"isError":false}}"#,
            r#" { "jsonrpc" : "2.0" , "id" : null , "error" : { "code" : -32600 , "message" : "x" } } "#,
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":0.5}}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"file:///x","task":{"ttl":1}}}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"tasks/get","params":{"taskId":"t1","_meta":{"io.modelcontextprotocol/protocolVersion":7}}}"#,
            r#"{"id":1.0,"method":"m"}"#,
            r#"{"id":[1],"method":"m"}"#,
            r#"{"method":"me\u0074hod","x":[[[]]],"y":{"z":{"w":"\/"}}}"#,
            r#"{}"#,
            r#"{"id":1,"method":"m","params":{"a":"\ud800\udc00","b":"\udfff","c":12345678901234567,"d":-9007199254740991,"e":1e400,"f":0.5e3}}"#,
        ];
        let bytes: &[u8] = b"\"\\{}[],:0-e.u n\x01";
        let mut taken = 0;
        let mut tried = 0;
        for line in lines {
            assert!(
                quick_envelope(line).is_some(),
                "the hand reader takes {line}"
            );
            let mut variants = vec![line.as_bytes().to_vec()];
            for at in 0..line.len() {
                let mut dropped = line.as_bytes().to_vec();
                dropped.remove(at);
                variants.push(dropped);
                for &b in bytes {
                    let mut changed = line.as_bytes().to_vec();
                    changed[at] = b;
                    variants.push(changed);
                }
            }
            for variant in variants {
                let Ok(text) = std::str::from_utf8(&variant) else {
                    continue;
                };
                tried += 1;
                let Some(quick) = quick_envelope(text) else {
                    continue;
                };
                taken += 1;
                let serde = serde_json::from_str::<Envelope<'_>>(text).unwrap_or_else(|err| {
                    panic!("serde refuses what the hand reader took ({err}): {text}")
                });
                assert!(
                    serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok(),
                    "{text}"
                );
                assert_eq!(quick.error, serde.error, "{text}");
                assert_eq!(quick.bad_params, serde.bad_params, "{text}");
                assert_eq!(
                    quick.two_ways,
                    Some(read_two_ways(text.as_bytes())),
                    "{text}"
                );
                assert_eq!(
                    quick.kind(text.as_bytes()),
                    serde.kind(text.as_bytes()),
                    "{text}"
                );
            }
        }
        assert!(taken > 100 && taken < tried, "{taken} of {tried}");
    }

    proptest::proptest! {
        /// Random JSON-ish text in each place the hand reader looks: whatever it takes, serde
        /// takes alike, with the same envelope.
        #[test]
        fn the_quick_envelope_takes_nothing_serde_does_not(
            fragment in "[{}\\[\\]\",:0-9a-zA-Z\\\\ ./eE+-]{0,24}",
            place in 0usize..6,
        ) {
            let lines = [
                format!(r#"{{"id":{fragment},"method":"m"}}"#),
                format!(r#"{{"id":1,"method":{fragment}}}"#),
                format!(r#"{{"id":1,"result":{fragment}}}"#),
                format!(r#"{{"id":1,"method":"tools/call","params":{{"name":{fragment},"arguments":{{}}}}}}"#),
                format!(r#"{{"id":1,"method":"m","params":{{"_meta":{{"progressToken":{fragment},"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}}}}"#),
                format!(r#"{{"id":1,"method":"m","params":{{"_meta":{{"io.modelcontextprotocol/clientInfo":{fragment}}}}}}}"#),
            ];
            let text = &lines[place];
            if let Some(quick) = quick_envelope(text) {
                let serde = serde_json::from_str::<Envelope<'_>>(text);
                proptest::prop_assert!(serde.is_ok(), "serde refuses {text}");
                proptest::prop_assert_eq!(quick.two_ways, Some(read_two_ways(text.as_bytes())));
                if let Ok(serde) = serde {
                    proptest::prop_assert_eq!(quick.kind(text.as_bytes()), serde.kind(text.as_bytes()));
                }
            }
        }
    }

    #[test]
    fn a_strings_plain_run_stops_where_a_byte_by_byte_look_stops() {
        let mut bytes: Vec<u8> = (0..=255u8).collect();
        bytes.extend(b"plain text then a quote\" and more");
        for start in 0..bytes.len() {
            for end in start..bytes.len().min(start + 40) {
                let slice = &bytes[start..end];
                let expected = slice
                    .iter()
                    .position(|&b| b == b'"' || b == b'\\' || b < 0x20);
                assert_eq!(stop_at(slice), expected, "{slice:?}");
            }
        }
    }

    #[test]
    fn client_names_are_read_as_serde_reads_them() {
        for info in [
            r#"{"name":"claude-code","version":"2.1"}"#,
            r#"{"name":"codex-mcp-client"}"#,
            r#"{"name":"é x"}"#,
            r#"{"name":""}"#,
            r#"{"name":"a\u0062","version":"1"}"#,
            r#"{"name":"a","name":"b"}"#,
            r#"{"name":"a","x":{"name":"b"}}"#,
            r#"{"version":"1","name":"late"}"#,
            r#"{ "name" : "spaced" }"#,
            r#"{"name":7}"#,
            r#"{"name":null}"#,
            r#"{}"#,
            r#""not an object""#,
        ] {
            let value: serde_json::Value = serde_json::from_str(info).unwrap();
            // The last of a repeated key, as serde_json's own map keeps it.
            let expected = value
                .get("name")
                .and_then(serde_json::Value::as_str)
                .map(str::to_string);
            assert_eq!(client_name(info), expected, "{info}");
        }
    }

    #[test]
    fn numbered_ids_are_the_ids_their_text_reads_as() {
        for (prefix, n) in [("mcp-budget-s", 7), ("p", u64::MAX), (&*"x".repeat(70), 3)] {
            let id = Id::numbered(prefix, n);
            assert_eq!(id, Id::from_json_text(&format!("\"{prefix}{n}\"")));
            assert!(id.is_plain());
        }
    }

    #[test]
    fn a_number_id_is_a_plain_integer_and_never_the_string_of_it() {
        assert!(Id::parse("7.0").is_none());
        let b = Id::from_json_text("7");
        assert_eq!(b.key(), "7");
        assert_ne!(Id::from_json_text(r#""7""#).key(), b.key());
    }

    #[test]
    fn lone_surrogates_are_found_and_refused_per_element() {
        for (text, lone) in [
            (r#""\ud800""#, true),
            (r#""\uDC00x""#, true),
            (r#""\ud83d\ude00""#, false),
            (r#""\ud83d\u0041""#, true),
            (r#""\\ud800""#, false),
            (r#""\\\ud800""#, true),
            (r#""\u00e9 plain""#, false),
            (r#""\ud800"#, true),
        ] {
            assert_eq!(has_lone_surrogate(text.as_bytes()), lone, "{text}");
        }
        let batch = parse_from_client(
            br#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x","arguments":{"\ud800":1}}}]"#,
        )
        .unwrap();
        let kinds = batch.kinds();
        assert!(matches!(kinds[0], Kind::Request { .. }));
        assert_eq!(
            kinds[1],
            Kind::Malformed {
                id: Some(Id::from_json_text("2")),
                problem: Problem::LoneSurrogate
            }
        );
        // An element whose key does not decode is refused, never "something else".
        let batch = parse(br#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"\ud800":1,"id":2,"method":"tools/call"}]"#).unwrap();
        assert!(
            matches!(batch.kinds()[1], Kind::Malformed { .. }),
            "{batch:?}"
        );
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
                    modern: None,
                    call: None,
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

    #[test]
    fn ids_compare_as_values_and_keep_their_spelling() {
        let a = Id::parse(r#""\u0061""#).unwrap();
        assert_eq!(a.key(), Id::parse(r#""a""#).unwrap().key());
        assert_eq!(a.raw(), r#""\u0061""#);
        assert_eq!(
            Id::parse(r#""\/x""#).unwrap().key(),
            Id::parse(r#""/x""#).unwrap().key()
        );
        for number in ["1.50", "1.5", "15e-1", "1E2"] {
            assert!(Id::parse(number).is_none(), "{number}");
        }
        assert_ne!(
            Id::parse("1").unwrap().key(),
            Id::parse(r#""1""#).unwrap().key()
        );
        for bad in [
            "1e999999",
            "1E400",
            "-1e999",
            "{}",
            "[1]",
            "true",
            r#""\ud800""#,
        ] {
            assert!(Id::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn keys_the_proxy_decides_on_are_read_once() {
        let problem = |line: &str| match single(line) {
            Kind::Malformed { problem, .. } => Some(problem),
            _ => None,
        };
        assert_eq!(
            problem(
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","name":"big"}}"#
            ),
            Some(Problem::Duplicate("params.name"))
        );
        assert_eq!(
            problem(
                r#"{"id":1,"method":"tools/call","params":{"name":"a","arguments":{},"arguments":{"x":1}}}"#
            ),
            Some(Problem::Duplicate("params.arguments"))
        );
        // A key spelled with an escape is the same key.
        assert_eq!(
            problem(r#"{"id":1,"method":"tools/call","params":{"name":"a","n\u0061me":"b"}}"#),
            Some(Problem::Duplicate("params.name"))
        );
        assert_eq!(
            problem(r#"{"id":1,"id":2,"method":"ping"}"#),
            Some(Problem::Duplicate("id"))
        );
        assert_eq!(
            problem(r#"{"id":1,"method":"ping","method":"x"}"#),
            Some(Problem::Duplicate("method"))
        );
        assert_eq!(
            problem(r#"{"id":1,"method":"x","params":{"_meta":{},"_meta":{}}}"#),
            Some(Problem::Duplicate("params._meta"))
        );
        assert_eq!(
            problem(r#"{"id":1,"method":"x","params":{"task":{},"task":{}}}"#),
            Some(Problem::Duplicate("params.task"))
        );
        assert_eq!(
            problem(r#"{"id":{"a":1},"method":"ping"}"#),
            Some(Problem::BadId)
        );
        assert_eq!(
            problem(r#"{"id":1e999999,"method":"ping"}"#),
            Some(Problem::BadId)
        );
        assert_eq!(
            problem(r#"{"jsonrpc":"2.0","id":5,"params":{}}"#),
            Some(Problem::NoMethod)
        );
        assert_eq!(problem(r#"{"id":5,"method":7}"#), Some(Problem::BadMethod));
        // Any other key of the envelope twice: refused too (readers differ on which counts).
        assert_eq!(
            problem(r#"{"id":1,"method":"x","params":{"other":1,"other":2}}"#),
            Some(Problem::DuplicateIn("params"))
        );
        assert_eq!(
            problem(r#"{"id":1,"method":"x","x":1,"x":2}"#),
            Some(Problem::DuplicateIn("the message"))
        );
        assert_eq!(
            problem(r#"{"id":1,"method":"x","params":{"_meta":{"a":1,"a":2}}}"#),
            Some(Problem::DuplicateIn("params._meta"))
        );
        assert_eq!(
            problem(r#"{"id":1,"method":"x","params":{"requestState":"a","requestState":"b"}}"#),
            Some(Problem::DuplicateIn("params"))
        );
        // A request's id is never null.
        assert_eq!(
            problem(r#"{"id":null,"method":"tools/list"}"#),
            Some(Problem::NullId)
        );
        // The id of a malformed message is kept when it is valid, to answer it.
        assert_eq!(
            single(r#"{"id":"r","method":"m","method":"n"}"#),
            Kind::Malformed {
                id: Some(Id::from_json_text(r#""r""#)),
                problem: Problem::Duplicate("method")
            }
        );
    }

    #[test]
    fn modern_meta_is_read_with_the_envelope() {
        let line = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"codex-mcp-client","version":"1"},"progressToken":3}}}"#;
        match single(line) {
            Kind::Request {
                progress, modern, ..
            } => {
                assert_eq!(progress.as_deref(), Some("3"));
                let modern = modern.unwrap();
                assert_eq!(modern.version, "2026-07-28");
                assert_eq!(modern.client.as_deref(), Some("codex-mcp-client"));
                assert!(modern.capabilities);
            }
            other => panic!("{other:?}"),
        }
        match single(r#"{"id":1,"method":"tools/list"}"#) {
            Kind::Request { modern, .. } => assert!(modern.is_none()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn deep_nesting_is_refused_before_parsing() {
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"x","arguments":{{"a":{}1{}}}}}}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        match parse_from_client(deep.as_bytes()).unwrap() {
            Parsed::Single(Kind::Malformed { id, problem }) => {
                assert_eq!(id.map(|i| i.raw().to_string()).as_deref(), Some("9"));
                assert_eq!(problem, Problem::TooDeep);
            }
            other => panic!("{other:?}"),
        }
        // Brackets inside strings do not count.
        let strings = format!(
            r#"{{"id":1,"method":"x","params":{{"s":"{}"}}}}"#,
            "[".repeat(500)
        );
        assert!(!nests_deeper(strings.as_bytes(), MAX_DEPTH));
        assert!(matches!(
            parse_from_client(strings.as_bytes()).unwrap(),
            Parsed::Single(Kind::Request { .. })
        ));
    }

    #[test]
    fn scanner_reads_id_across_chunks_and_ignores_nested_ids() {
        let text = br#"{"result":{"id":5,"list":[{"id":6}]},"id" : 12 ,"x":"\"id\""}"#;
        let mut scanner = EnvelopeScanner::default();
        for chunk in text.chunks(3) {
            scanner.feed(chunk);
        }
        let (id, method) = scanner.finish();
        assert_eq!(id.map(|i| i.raw().to_string()), Some("12".to_string()));
        assert_eq!(method, None);
    }

    #[test]
    fn scanner_rejects_non_scalar_ids() {
        let mut scanner = EnvelopeScanner::default();
        scanner.feed(br#"{"id":{"a":1},"method":"m\u0041"}"#);
        let (id, method) = scanner.finish();
        assert!(id.is_none());
        assert_eq!(method.as_deref(), Some("mA"));
    }
}
