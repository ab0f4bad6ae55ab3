//! The era bridge: a client of one protocol era in front of a server of the other.
//!
//! The 2026-07-28 revision's own compatibility matrix says two pairings fail: a modern-only
//! client with a legacy server, and a legacy client with a modern-only server. The proxy sits
//! where the translation belongs, so it speaks each side's era to it:
//!
//! - **Modern client, legacy server.** The proxy opens the legacy session itself (`initialize`
//!   with the capabilities of the client's first request, then `notifications/initialized`),
//!   answers `server/discover` from the `InitializeResult`, and makes every result modern
//!   (`resultType`, the caching fields of lists; `-32002` becomes `-32602`).
//! - **Legacy client, modern server.** The proxy answers `initialize` from the server's
//!   `server/discover`, handles `notifications/initialized`, `ping` and `logging/setLevel`
//!   itself, and gives every forwarded request the `_meta` a modern request carries; results
//!   lose `resultType`.
//!
//! The server's era is learned the way the revision tells a dual-era client to learn it
//! (`basic/versioning`, "Backward Compatibility"): a `server/discover` answered with a result,
//! or with a recognized modern error, is a modern server; any other error, or no answer, is a
//! legacy one. A legacy `initialize` that a server refuses is the other way to learn it. The
//! verdict is kept per origin (the server's command line or URL), as the revision advises,
//! and forgotten when the server restarts.
//!
//! Here are the verdicts and the text of what the bridge writes; the state of one session's
//! bridge lives with its relay ([`crate::relay`]), which routes the messages.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, PoisonError};

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::era::{prepend, prepend_members};
use crate::wire::jsonrpc::quote;
use crate::wire::jsonrpc::{
    HEADER_MISMATCH, INVALID_PARAMS, MISSING_CAPABILITY, UNSUPPORTED_VERSION,
};
use crate::wire::message::{self, Id};

mod mrtr;
pub use mrtr::*;

/// A server's protocol era.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// It serves 2026-07-28 requests (statelessly).
    Modern,
    /// It expects `initialize` (2025-11-25 and earlier).
    Legacy,
}

impl Era {
    pub fn as_str(self) -> &'static str {
        match self {
            Era::Modern => "modern (2026-07-28)",
            Era::Legacy => "legacy (initialize, 2025-11-25 and earlier)",
        }
    }
}

/// What a side's era is taken to be: learned, or forced on the command line
/// (`--client-era`, `--server-era`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EraChoice {
    #[default]
    Auto,
    Modern,
    Legacy,
}

impl std::str::FromStr for EraChoice {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(EraChoice::Auto),
            "modern" | "2026-07-28" => Ok(EraChoice::Modern),
            "legacy" | "2025-11-25" => Ok(EraChoice::Legacy),
            other => Err(format!(
                "unknown era {other:?}: use auto, modern (2026-07-28) or legacy (2025-11-25)"
            )),
        }
    }
}

impl EraChoice {
    /// The era forced, if one is.
    pub fn forced(self) -> Option<Era> {
        match self {
            EraChoice::Auto => None,
            EraChoice::Modern => Some(Era::Modern),
            EraChoice::Legacy => Some(Era::Legacy),
        }
    }
}

/// Why a client's request is refused under a forced client era (`--client-era`): its code,
/// message and data; `None` when the request is of the era served. `modern`: whether it
/// carries the 2026-07-28 `_meta`.
pub fn refused_by_client_era(
    forced: Era,
    method: &str,
    modern: bool,
    request: &[u8],
) -> Option<(i64, String, Option<serde_json::Value>)> {
    match forced {
        Era::Legacy if modern && method == "server/discover" => Some((
            crate::wire::jsonrpc::METHOD_NOT_FOUND,
            "Method not found: server/discover (this mcp-budget serves 2025-11-25 and earlier only, --client-era legacy: send initialize)".into(),
            None,
        )),
        Era::Legacy if modern => Some((
            crate::wire::jsonrpc::INVALID_REQUEST,
            format!("Invalid Request: this mcp-budget serves 2025-11-25 and earlier only (--client-era legacy): send initialize first, then {method} in that session"),
            None,
        )),
        Era::Modern if method == "initialize" => {
            #[derive(Deserialize)]
            struct Params {
                #[serde(rename = "protocolVersion")]
                version: Option<serde_json::Value>,
            }
            #[derive(Deserialize)]
            struct Top {
                params: Option<Params>,
            }
            let requested = serde_json::from_slice::<Top>(request)
                .ok()
                .and_then(|t| t.params)
                .and_then(|p| p.version)
                .unwrap_or(serde_json::Value::Null);
            Some((
                UNSUPPORTED_VERSION,
                format!("Unsupported protocol version: this mcp-budget serves {} only (--client-era modern); send requests with the 2026-07-28 _meta, no initialize", crate::protocol::MODERN),
                Some(serde_json::json!({"supported": [crate::protocol::MODERN], "requested": requested})),
            ))
        }
        _ => None,
    }
}

/// The legacy revision the proxy opens sessions with, and offers a legacy client whose own
/// revision it does not know.
pub const LEGACY: &str = "2025-11-25";

/// At most this many origins' verdicts are kept (a gateway reaches a bounded set of servers).
const MAX_ORIGINS: usize = 1024;

static VERDICTS: LazyLock<Mutex<HashMap<String, Era>>> = LazyLock::new(Default::default);

/// What was learned of the server at `origin`, in this process.
pub fn verdict(origin: &str) -> Option<Era> {
    VERDICTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(origin)
        .copied()
}

/// Moves on each time any verdict is kept or forgotten (after the change, under the lock).
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// A reader's copy of one origin's verdict, good while no verdict changed since it was taken:
/// the verdict read without the lock or a lookup (once per request on the listener).
#[derive(Debug, Default)]
pub struct VerdictCopy(AtomicU64);

impl VerdictCopy {
    /// `origin`'s verdict, from the copy while it is current.
    pub fn get(&self, origin: &str) -> Option<Era> {
        let now = GENERATION.load(Ordering::Acquire);
        // The generation and the era in one word: never one without the other.
        let copy = self.0.load(Ordering::Acquire);
        if copy >> 8 == now {
            return match copy & 0xff {
                1 => Some(Era::Legacy),
                2 => Some(Era::Modern),
                _ => None,
            };
        }
        let era = verdict(origin);
        let code = match era {
            None => 0,
            Some(Era::Legacy) => 1,
            Some(Era::Modern) => 2,
        };
        self.0.store(now << 8 | code, Ordering::Release);
        era
    }
}

/// Keeps what was learned of the server at `origin`.
pub fn record(origin: &str, era: Era) {
    let mut verdicts = VERDICTS.lock().unwrap_or_else(PoisonError::into_inner);
    if verdicts.len() >= MAX_ORIGINS && !verdicts.contains_key(origin) {
        verdicts.clear();
    }
    verdicts.insert(origin.to_string(), era);
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// The server at `origin` restarted: it is asked again.
pub fn forget(origin: &str) {
    let mut verdicts = VERDICTS.lock().unwrap_or_else(PoisonError::into_inner);
    verdicts.remove(origin);
    MODERN_ONLY
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(origin);
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// The origins whose modern server refused a legacy `initialize`: it speaks 2026-07-28 only.
/// A modern server not in it may speak both eras: a legacy client's `initialize` is tried
/// first, and the client is bridged only if the server refuses it. So each client gets its
/// own era, whatever order clients arrive in.
static MODERN_ONLY: LazyLock<Mutex<std::collections::HashSet<String>>> =
    LazyLock::new(Default::default);

/// Whether the (modern) server at `origin` refused a legacy `initialize` in this process.
pub fn modern_only(origin: &str) -> bool {
    MODERN_ONLY
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(origin)
}

/// Keeps that the server at `origin` refused a legacy `initialize` and answered `server/discover`.
pub fn record_modern_only(origin: &str) {
    let mut set = MODERN_ONLY.lock().unwrap_or_else(PoisonError::into_inner);
    if set.len() >= MAX_ORIGINS && !set.contains(origin) {
        set.clear();
    }
    set.insert(origin.to_string());
}

#[derive(Deserialize)]
struct Answer<'a> {
    #[serde(borrow)]
    result: Option<&'a RawValue>,
    #[serde(borrow)]
    error: Option<ErrorMembers<'a>>,
}

#[derive(Deserialize)]
struct ErrorMembers<'a> {
    #[serde(borrow)]
    code: Option<&'a RawValue>,
}

/// An error answer's code, when it is an integer.
fn error_code(message: &[u8]) -> Option<i64> {
    let answer: Answer<'_> = serde_json::from_slice(message).ok()?;
    answer.error?.code?.get().parse().ok()
}

/// Whether an answer is an error (has `error` and no `result`).
pub fn is_error(message: &[u8]) -> bool {
    serde_json::from_slice::<Answer<'_>>(message)
        .is_ok_and(|answer| answer.result.is_none() && answer.error.is_some())
}

/// The era a server's answer to `server/discover` shows: a result, or an error only a modern
/// server writes (unsupported version, header mismatch, missing capability), is modern;
/// anything else (method not found, a session required, a parse error) is legacy.
pub fn era_of_discover_answer(message: &[u8]) -> Era {
    let Ok(answer) = serde_json::from_slice::<Answer<'_>>(message) else {
        return Era::Legacy;
    };
    if answer.result.is_some() {
        return Era::Modern;
    }
    match answer
        .error
        .and_then(|e| e.code)
        .and_then(|c| c.get().parse::<i64>().ok())
    {
        Some(UNSUPPORTED_VERSION | HEADER_MISMATCH | MISSING_CAPABILITY) => Era::Modern,
        _ => Era::Legacy,
    }
}

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    params: Option<Params<'a>>,
}

#[derive(Deserialize)]
struct Params<'a> {
    #[serde(borrow, rename = "_meta")]
    meta: Option<ModernMeta<'a>>,
    #[serde(borrow, rename = "protocolVersion")]
    protocol_version: Option<&'a RawValue>,
    #[serde(borrow)]
    capabilities: Option<&'a RawValue>,
    #[serde(borrow, rename = "clientInfo")]
    client_info: Option<&'a RawValue>,
    #[serde(borrow)]
    level: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ModernMeta<'a> {
    #[serde(borrow, rename = "io.modelcontextprotocol/clientCapabilities")]
    capabilities: Option<&'a RawValue>,
    #[serde(borrow, rename = "io.modelcontextprotocol/clientInfo")]
    client_info: Option<&'a RawValue>,
}

fn object_or<'a>(raw: Option<&'a RawValue>, fallback: &'a str) -> &'a str {
    match raw {
        Some(raw) if raw.get().trim_start().starts_with('{') => raw.get(),
        _ => fallback,
    }
}

/// The proxy's own `clientInfo`, when a client named none.
fn own_client_info() -> String {
    format!(
        r#"{{"name":"mcp-budget","version":"{}"}}"#,
        env!("CARGO_PKG_VERSION")
    )
}

/// The `initialize` the proxy sends a legacy server for modern clients, under `id`: the
/// capabilities and `clientInfo` the modern request (`request`) declared in its `_meta`.
pub fn initialize_for(id: &Id, request: &[u8]) -> Vec<u8> {
    let meta = serde_json::from_slice::<Request<'_>>(request)
        .ok()
        .and_then(|r| r.params?.meta);
    let own = own_client_info();
    let capabilities = object_or(meta.as_ref().and_then(|m| m.capabilities), "{}");
    let info = object_or(meta.as_ref().and_then(|m| m.client_info), &own);
    format!(
        r#"{{"jsonrpc":"2.0","id":{},"method":"initialize","params":{{"protocolVersion":"{LEGACY}","capabilities":{capabilities},"clientInfo":{info}}}}}"#,
        id.raw()
    )
    .into_bytes()
}

/// The proxy's own `server/discover` under `id` (for a legacy client's `initialize`): it
/// declares the legacy client's capabilities and `clientInfo`.
pub fn discover_for(id: &Id, client: &LegacyClient) -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","id":{},"method":"server/discover","params":{{"_meta":{{"{}":"{}","{}":{},"{}":{}}}}}}}"#,
        id.raw(),
        message::META_VERSION,
        crate::protocol::MODERN,
        message::META_CLIENT_CAPABILITIES,
        client.capabilities,
        message::META_CLIENT_INFO,
        client.client_info,
    )
    .into_bytes()
}

/// What a legacy client declared in its `initialize`: sent in the `_meta` of every request the
/// proxy forwards for it to a modern server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyClient {
    /// The revision it asked for.
    pub version: String,
    /// Its `capabilities` (JSON text).
    pub capabilities: String,
    /// Its `clientInfo` (JSON text).
    pub client_info: String,
    /// The level it set with `logging/setLevel` (JSON text), sent as `logLevel`.
    pub log_level: Option<String>,
}

impl LegacyClient {
    /// What a legacy client's `initialize` declares.
    pub fn of(initialize: &[u8]) -> LegacyClient {
        let params = serde_json::from_slice::<Request<'_>>(initialize)
            .ok()
            .and_then(|r| r.params);
        let version = params
            .as_ref()
            .and_then(|p| p.protocol_version)
            .and_then(|v| serde_json::from_str::<String>(v.get()).ok())
            .unwrap_or_else(|| LEGACY.to_string());
        LegacyClient {
            version,
            capabilities: object_or(params.as_ref().and_then(|p| p.capabilities), "{}").to_string(),
            client_info: object_or(
                params.as_ref().and_then(|p| p.client_info),
                &own_client_info(),
            )
            .to_string(),
            log_level: None,
        }
    }

    /// The members a forwarded request's `_meta` gains (JSON members, without braces).
    fn meta_members(&self) -> String {
        let mut members = format!(
            r#""{}":"{}","{}":{},"{}":{}"#,
            message::META_VERSION,
            crate::protocol::MODERN,
            message::META_CLIENT_CAPABILITIES,
            self.capabilities,
            message::META_CLIENT_INFO,
            self.client_info,
        );
        if let Some(level) = &self.log_level {
            members.push_str(&format!(r#","io.modelcontextprotocol/logLevel":{level}"#));
        }
        members
    }

    /// A legacy client's request made modern: its `params._meta` gains the version, the
    /// capabilities and `clientInfo` (and the log level set), the rest as written. `None`: its
    /// `params` is not an object, or its `_meta` is not one (it goes as it is, and the
    /// server says what is wrong).
    pub fn modern_request(&self, request: &[u8]) -> Option<Vec<u8>> {
        with_meta_members(request, &self.meta_members())
    }

    /// The `InitializeResult` for this client, from a modern server's `DiscoverResult`: the
    /// revision it asked for when the proxy knows it (else [`LEGACY`]), the server's
    /// capabilities, `serverInfo` (from the result's `_meta`) and `instructions`.
    pub fn initialize_result(&self, discover: &str) -> String {
        #[derive(Deserialize)]
        struct Discover<'a> {
            #[serde(borrow)]
            capabilities: Option<&'a RawValue>,
            #[serde(borrow)]
            instructions: Option<&'a RawValue>,
            #[serde(borrow, rename = "_meta")]
            meta: Option<ServerMeta<'a>>,
        }
        #[derive(Deserialize)]
        struct ServerMeta<'a> {
            #[serde(borrow, rename = "io.modelcontextprotocol/serverInfo")]
            server_info: Option<&'a RawValue>,
        }
        let discover: Option<Discover<'_>> = serde_json::from_str(discover).ok();
        let version = if crate::protocol::SUPPORTED.contains(&self.version.as_str())
            && !crate::era::is_modern(&self.version)
        {
            self.version.as_str()
        } else {
            LEGACY
        };
        let unnamed = r#"{"name":"unknown","version":"0"}"#;
        let capabilities = without_tasks(object_or(
            discover.as_ref().and_then(|d| d.capabilities),
            "{}",
        ));
        let info = object_or(
            discover
                .as_ref()
                .and_then(|d| d.meta.as_ref())
                .and_then(|m| m.server_info),
            unnamed,
        );
        let mut out = format!(
            r#"{{"protocolVersion":"{version}","capabilities":{capabilities},"serverInfo":{info}"#
        );
        if let Some(instructions) = discover.as_ref().and_then(|d| d.instructions) {
            out.push_str(",\"instructions\":");
            out.push_str(instructions.get());
        }
        out.push('}');
        out
    }
}

/// A message whose `params._meta` gains `members` (JSON members, without braces) first, the
/// rest as written; `params` and `_meta` are made when absent. `None`: its `params` is not an
/// object, or its `_meta` is not one.
pub fn with_meta_members(line: &[u8], members: &str) -> Option<Vec<u8>> {
    // A member written `null` is there (`Some("null")`): a second one is never added.
    fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
        <&RawValue>::deserialize(d).map(Some)
    }
    #[derive(Deserialize)]
    struct Top<'a> {
        #[serde(borrow, default, deserialize_with = "present")]
        params: Option<&'a RawValue>,
    }
    #[derive(Deserialize)]
    struct ParamsMeta<'a> {
        #[serde(borrow, default, rename = "_meta", deserialize_with = "present")]
        meta: Option<&'a RawValue>,
    }
    let top: Top<'_> = serde_json::from_slice(line).ok()?;
    match top.params {
        None => {
            let text = std::str::from_utf8(line).ok()?;
            let with = prepend(text, "params", &format!("{{\"_meta\":{{{members}}}}}"))?;
            Some(with.into_bytes())
        }
        Some(params) => {
            if !params.get().trim_start().starts_with('{') {
                return None;
            }
            let inner: ParamsMeta<'_> = serde_json::from_str(params.get()).ok()?;
            match inner.meta {
                None => {
                    let new = prepend(params.get(), "_meta", &format!("{{{members}}}"))?;
                    Some(message::splice(line, params.get(), new.as_bytes()))
                }
                Some(meta) => {
                    if !meta.get().trim_start().starts_with('{') {
                        return None;
                    }
                    let new = prepend_members(meta.get(), members)?;
                    Some(message::splice(line, meta.get(), new.as_bytes()))
                }
            }
        }
    }
}

/// The level a `logging/setLevel` request sets (JSON text).
pub fn log_level(request: &[u8]) -> Option<String> {
    let params = serde_json::from_slice::<Request<'_>>(request)
        .ok()?
        .params?;
    Some(params.level?.get().to_string())
}

/// A `DiscoverResult` from a legacy server's `InitializeResult` (`init`, its JSON text): the
/// modern revision the proxy serves, the server's capabilities and `instructions`, its
/// `serverInfo` in `_meta`, and caching fields that ask for no caching beyond this client.
pub fn discover_result(init: &str) -> String {
    #[derive(Deserialize)]
    struct Init<'a> {
        #[serde(borrow)]
        capabilities: Option<&'a RawValue>,
        #[serde(borrow)]
        instructions: Option<&'a RawValue>,
        #[serde(borrow, rename = "serverInfo")]
        server_info: Option<&'a RawValue>,
    }
    let init: Option<Init<'_>> = serde_json::from_str(init).ok();
    let capabilities = without_tasks(object_or(init.as_ref().and_then(|i| i.capabilities), "{}"));
    let mut out = format!(
        r#"{{"resultType":"complete","supportedVersions":["{}"],"capabilities":{capabilities}"#,
        crate::protocol::MODERN
    );
    if let Some(instructions) = init.as_ref().and_then(|i| i.instructions) {
        out.push_str(",\"instructions\":");
        out.push_str(instructions.get());
    }
    out.push_str(r#","ttlMs":0,"cacheScope":"private""#);
    if let Some(info) = init.as_ref().and_then(|i| i.server_info) {
        out.push_str(&format!(
            r#","_meta":{{"{}":{}}}"#,
            message::META_SERVER_INFO,
            info.get()
        ));
    }
    out.push('}');
    out
}

/// What `Mcp-Name` carries for a request of `method` (its `params.name`, `uri` or `taskId`,
/// when a string).
pub fn named(method: &str, request: &[u8]) -> Option<String> {
    let member = crate::protocol::name_member(method)?;
    #[derive(Deserialize)]
    struct Top<'a> {
        #[serde(borrow)]
        params: Option<std::collections::HashMap<std::borrow::Cow<'a, str>, &'a RawValue>>,
    }
    let top: Top<'_> = serde_json::from_slice(request).ok()?;
    let raw = *top.params?.get(member)?;
    serde_json::from_str::<String>(raw.get()).ok()
}

/// The rank of a log level (RFC 5424 order, `debug` lowest).
fn level_rank(level: &str) -> Option<u8> {
    const LEVELS: [&str; 8] = [
        "debug",
        "info",
        "notice",
        "warning",
        "error",
        "critical",
        "alert",
        "emergency",
    ];
    LEVELS.iter().position(|l| *l == level).map(|i| i as u8)
}

/// The log level a modern request asks for (`_meta["io.modelcontextprotocol/logLevel"]`),
/// as a rank: only requests that set one get `notifications/message`.
pub fn requested_log_level(request: &[u8]) -> Option<u8> {
    static KEY: LazyLock<memchr::memmem::Finder<'static>> =
        LazyLock::new(|| memchr::memmem::Finder::new(b"io.modelcontextprotocol/logLevel"));
    KEY.find(request)?;
    let level: String = meta_member(request, "io.modelcontextprotocol/logLevel")?;
    level_rank(&level)
}

/// A request's `params._meta`, as written.
fn meta_of(request: &[u8]) -> Option<&RawValue> {
    #[derive(Deserialize)]
    struct Top<'a> {
        #[serde(borrow)]
        params: Option<P<'a>>,
    }
    #[derive(Deserialize)]
    struct P<'a> {
        #[serde(borrow, rename = "_meta")]
        meta: Option<&'a RawValue>,
    }
    let top: Top<'_> = serde_json::from_slice(request).ok()?;
    top.params?.meta
}

/// One member of a request's `params._meta`, read as `T`.
fn meta_member<T: serde::de::DeserializeOwned>(request: &[u8], key: &str) -> Option<T> {
    let meta = meta_of(request)?;
    let members: HashMap<std::borrow::Cow<'_, str>, &RawValue> =
        serde_json::from_str(meta.get()).ok()?;
    serde_json::from_str(members.get(key)?.get()).ok()
}

/// The level of a `notifications/message`, as a rank (an unknown level ranks highest: it is
/// not withheld from a client that asked for logs).
pub fn message_level(notification: &[u8]) -> u8 {
    #[derive(Deserialize)]
    struct Top {
        params: Option<P>,
    }
    #[derive(Deserialize)]
    struct P {
        level: Option<String>,
    }
    serde_json::from_slice::<Top>(notification)
        .ok()
        .and_then(|t| t.params?.level)
        .and_then(|l| level_rank(&l))
        .unwrap_or(u8::MAX)
}

/// What a modern request's `clientCapabilities` declare that a legacy server may use
/// (sampling, elicitation and its modes, roots): requests that differ in it need legacy
/// sessions of their own. Canonical text, `""` when none.
pub fn capability_profile(request: &[u8]) -> String {
    let Some(capabilities) = meta_member::<serde_json::Map<String, serde_json::Value>>(
        request,
        message::META_CLIENT_CAPABILITIES,
    ) else {
        return String::new();
    };
    let mut out = Vec::new();
    for name in ["elicitation", "roots", "sampling"] {
        let Some(value) = capabilities.get(name) else {
            continue;
        };
        let mut modes: Vec<&str> = value
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default();
        modes.sort_unstable();
        out.push(format!("{name}({})", modes.join(",")));
    }
    out.join(";")
}

/// The result of a response message (JSON text), when it has one that is an object.
pub fn result_of(message: &[u8]) -> Option<&str> {
    let answer: Answer<'_> = serde_json::from_slice(message).ok()?;
    let result = answer.result?.get();
    result.trim_start().starts_with('{').then_some(result)
}

/// A legacy server's answer to a modern client's `method`, made modern: a result gains
/// `resultType: "complete"` (and, for the cacheable results, `ttlMs: 0` and
/// `cacheScope: "private"` where the server wrote none); a `resources/read` error `-32002`
/// (resource not found, which 2026-07-28 spells `-32602`) is re-coded, its message and data
/// kept. `None`:
/// nothing to change.
pub fn modern_answer(method: &str, message: &[u8]) -> Option<Vec<u8>> {
    if let Some(result) = result_of(message) {
        #[derive(Deserialize)]
        struct Members<'a> {
            #[serde(borrow, rename = "resultType")]
            result_type: Option<&'a RawValue>,
            #[serde(borrow, rename = "ttlMs")]
            ttl: Option<&'a RawValue>,
            #[serde(borrow, rename = "cacheScope")]
            scope: Option<&'a RawValue>,
        }
        let members: Members<'_> = serde_json::from_str(result).ok()?;
        let mut new = result.to_string();
        if crate::protocol::cacheable(method) {
            if members.scope.is_none() {
                new = prepend(&new, "cacheScope", "\"private\"")?;
            }
            if members.ttl.is_none() {
                new = prepend(&new, "ttlMs", "0")?;
            }
        }
        if members.result_type.is_none() {
            new = prepend(&new, "resultType", "\"complete\"")?;
        }
        return (new != result).then(|| message::splice(message, result, new.as_bytes()));
    }
    if method == "resources/read" && error_code(message) == Some(-32002) {
        #[derive(Deserialize)]
        struct Top<'a> {
            #[serde(borrow)]
            error: ErrorCode<'a>,
        }
        #[derive(Deserialize)]
        struct ErrorCode<'a> {
            #[serde(borrow)]
            code: &'a RawValue,
        }
        let top: Top<'_> = serde_json::from_slice(message).ok()?;
        return Some(message::splice(
            message,
            top.error.code.get(),
            INVALID_PARAMS.to_string().as_bytes(),
        ));
    }
    None
}

/// A modern server's answer made legacy for a legacy client: its result loses `resultType`.
/// `None`: it has none (or is not a result).
pub fn legacy_answer(message: &[u8]) -> Option<Vec<u8>> {
    let result = result_of(message)?;
    let new = without_member(result, "resultType")?;
    Some(message::splice(message, result, new.as_bytes()))
}

/// The kind of result a modern server answered with, when it is not complete
/// (`input_required`, `task`...).
pub fn incomplete_kind(message: &[u8]) -> Option<String> {
    let result = result_of(message)?;
    crate::era::result_type(result).filter(|kind| kind != "complete")
}

/// The extension's key for tasks (2026-07-28).
const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// A server's capabilities as the other era's client is shown them: without tasks, in either
/// form (the 2025-11-25 `tasks`, the extension). Tasks do not cross the eras, and a task's
/// result must not reach a client by a channel the proxy cannot budget: the client then calls
/// every tool plainly.
fn without_tasks(capabilities: &str) -> String {
    // Every `tasks` (a key twice is read either way by some client), and the extension from
    // every `extensions`, last first (so that the ranges before stay true).
    let mut out = capabilities.to_string();
    while let Some(fewer) = without_member(&out, "tasks") {
        out = fewer;
    }
    let mut extensions: Vec<std::ops::Range<usize>> = crate::budget::raw::members(&out)
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k == "extensions")
        .map(|(_, range)| range)
        .collect();
    extensions.reverse();
    for range in extensions {
        let Some(mut new) = out.get(range.clone()).map(str::to_string) else {
            continue;
        };
        while let Some(fewer) = without_member(&new, TASKS_EXTENSION) {
            new = fewer;
        }
        out.replace_range(range, &new);
    }
    out
}

/// A `tools/list` answer as the other era's client is shown it: a tool that runs only as a
/// task (`execution.taskSupport: "required"`) is shown as one that runs without (`forbidden`),
/// since no task crosses the eras; a call to it goes to the server as a plain call, which
/// the server runs or refuses in its own words. `None`: no tool needs a task.
pub fn without_required_tasks(message: &[u8]) -> Option<Vec<u8>> {
    memchr::memmem::find(message, b"taskSupport")?;
    let result = result_of(message)?;
    let mut list: serde_json::Value = serde_json::from_str(result).ok()?;
    let mut changed = false;
    for tool in list.get_mut("tools")?.as_array_mut()? {
        if let Some(support) = tool.pointer_mut("/execution/taskSupport")
            && support == "required"
        {
            *support = serde_json::Value::String("forbidden".into());
            changed = true;
        }
    }
    changed.then(|| message::splice(message, result, list.to_string().as_bytes()))
}

/// A modern client's request as it goes into a legacy session: without
/// `_meta["io.modelcontextprotocol/protocolVersion"]`, everything else as written. `None`: it
/// names none. In a legacy session the revision is the one `initialize` negotiated, and a
/// dual-era server refuses a request that says otherwise (-32020). The other modern members
/// (capabilities, `clientInfo`, `logLevel`) stay: a dual-era server reads them per request.
pub fn legacy_request(request: &[u8]) -> Option<Vec<u8>> {
    static KEY: LazyLock<memchr::memmem::Finder<'static>> =
        LazyLock::new(|| memchr::memmem::Finder::new(b"io.modelcontextprotocol/"));
    KEY.find(request)?;
    let meta = meta_of(request)?.get();
    let mut object = without_member(meta, message::META_VERSION)?;
    // Named twice: neither copy goes.
    while let Some(less) = without_member(&object, message::META_VERSION) {
        object = less;
    }
    Some(message::splice(request, meta, object.as_bytes()))
}

/// `object` without its top-level member `name` (and the comma that joined it). `None`: it
/// has no such member.
fn without_member(object: &str, name: &str) -> Option<String> {
    // The members of the object, in order, as (key text, value) pairs located in `object`.
    let members: Vec<(String, &RawValue)> = {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Vec<(String, &'de RawValue)>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((key, value)) = map.next_entry::<String, &'de RawValue>()? {
                    out.push((key, value));
                }
                Ok(out)
            }
        }
        let mut de = serde_json::Deserializer::from_str(object);
        serde::Deserializer::deserialize_map(&mut de, Visitor).ok()?
    };
    let at = members.iter().position(|(key, _)| key == name)?;
    let base = object.as_ptr() as usize;
    let value_end = |raw: &RawValue| raw.get().as_ptr() as usize - base + raw.get().len();
    // From the end of the previous member (or the opening brace) to the end of this one's
    // value; for the first member, from the brace to the start of the next member's key.
    let (cut_from, cut_to) = if at > 0 {
        (value_end(members[at - 1].1), value_end(members[at].1))
    } else {
        let open = object.find('{')? + 1;
        match members.get(1) {
            // The next key starts after the comma that follows this value.
            Some(_) => {
                let end = value_end(members[0].1);
                let comma = object[end..].find(',')? + end + 1;
                (open, comma)
            }
            None => (open, value_end(members[0].1)),
        }
    };
    let mut out = String::with_capacity(object.len());
    out.push_str(&object[..cut_from]);
    out.push_str(&object[cut_to..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_copy_follows_what_is_kept_and_forgotten() {
        let origin = "http://verdict-copy.test:1";
        let copy = VerdictCopy::default();
        assert_eq!(copy.get(origin), None);
        record(origin, Era::Modern);
        assert_eq!(copy.get(origin), Some(Era::Modern));
        assert_eq!(copy.get(origin), Some(Era::Modern));
        // Another origin's news makes the copy look again; it still reads its own.
        record("http://verdict-copy.test:2", Era::Legacy);
        assert_eq!(copy.get(origin), Some(Era::Modern));
        forget(origin);
        assert_eq!(copy.get(origin), None);
        record(origin, Era::Legacy);
        assert_eq!(copy.get(origin), Some(Era::Legacy));
        forget(origin);
        forget("http://verdict-copy.test:2");
    }

    #[test]
    fn meta_members_are_never_added_beside_a_null() {
        let added = with_meta_members(br#"{"jsonrpc":"2.0","method":"m"}"#, r#""k":1"#).unwrap();
        assert_eq!(
            added,
            br#"{"params":{"_meta":{"k":1}},"jsonrpc":"2.0","method":"m"}"#
        );
        let added = with_meta_members(
            br#"{"method":"m","params":{"a":1,"_meta":{"x":2}}}"#,
            r#""k":1"#,
        )
        .unwrap();
        assert_eq!(
            added,
            br#"{"method":"m","params":{"a":1,"_meta":{"k":1,"x":2}}}"#
        );
        assert_eq!(
            with_meta_members(br#"{"method":"m","params":null}"#, r#""k":1"#),
            None
        );
        assert_eq!(
            with_meta_members(br#"{"method":"m","params":{"_meta":null}}"#, r#""k":1"#),
            None
        );
    }

    #[test]
    fn a_modern_request_goes_into_a_legacy_session_without_its_meta_revision() {
        let request = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","progressToken":7,"io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"c","version":"1"},"io.modelcontextprotocol/logLevel":"info","io.modelcontextprotocol/related":"x"},"arguments":{"io.modelcontextprotocol/protocolVersion":"kept"}}}"#;
        let legacy = legacy_request(request).unwrap();
        assert_eq!(
            std::str::from_utf8(&legacy).unwrap(),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","_meta":{"progressToken":7,"io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"c","version":"1"},"io.modelcontextprotocol/logLevel":"info","io.modelcontextprotocol/related":"x"},"arguments":{"io.modelcontextprotocol/protocolVersion":"kept"}}}"#
        );
        let only = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        assert_eq!(
            legacy_request(only).unwrap(),
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{}}}"#
        );
        assert!(legacy_request(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).is_none());
    }

    #[test]
    fn tasks_do_not_cross_the_eras_in_either_form() {
        let init = r#"{"protocolVersion":"2025-11-25","capabilities":{"tools":{},"tasks":{"requests":{"tools":{"call":{}}}},"extensions":{"io.modelcontextprotocol/tasks":{},"a/b":{}}},"serverInfo":{"name":"s","version":"1"}}"#;
        let discover: serde_json::Value = serde_json::from_str(&discover_result(init)).unwrap();
        assert_eq!(
            discover["capabilities"],
            serde_json::json!({"tools": {}, "extensions": {"a/b": {}}})
        );
        assert_eq!(without_tasks(r#"{"tools":{}}"#), r#"{"tools":{}}"#);
        let twice = r#"{"tasks":{},"tools":{},"tasks":{"a":1},"extensions":{"io.modelcontextprotocol/tasks":{}},"extensions":{"io.modelcontextprotocol/tasks":{},"x":{}}}"#;
        assert_eq!(
            without_tasks(twice),
            r#"{"tools":{},"extensions":{},"extensions":{"x":{}}}"#
        );
        let list = br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a","execution":{"taskSupport":"required"}},{"name":"b","execution":{"taskSupport":"optional"}}]}}"#;
        let shown: serde_json::Value =
            serde_json::from_slice(&without_required_tasks(list).unwrap()).unwrap();
        assert_eq!(
            shown["result"]["tools"][0]["execution"]["taskSupport"],
            "forbidden"
        );
        assert_eq!(
            shown["result"]["tools"][1]["execution"]["taskSupport"],
            "optional"
        );
        assert!(without_required_tasks(br#"{"id":1,"result":{"tools":[]}}"#).is_none());
    }

    #[test]
    fn a_member_is_taken_out_wherever_it_stands() {
        assert_eq!(
            without_member(r#"{"resultType":"complete","a":1}"#, "resultType").as_deref(),
            Some(r#"{"a":1}"#)
        );
        assert_eq!(
            without_member(
                r#"{"a":1, "resultType" : "complete" ,"b":[2]}"#,
                "resultType"
            )
            .as_deref(),
            Some(r#"{"a":1 ,"b":[2]}"#)
        );
        assert_eq!(
            without_member(
                r#"{"a":{"resultType":1},"resultType":"complete"}"#,
                "resultType"
            )
            .as_deref(),
            Some(r#"{"a":{"resultType":1}}"#)
        );
        assert_eq!(
            without_member(r#"{ "resultType":"complete" }"#, "resultType").as_deref(),
            Some(r#"{ }"#)
        );
        assert_eq!(without_member(r#"{"a":1}"#, "resultType"), None);
    }

    #[test]
    fn the_era_of_a_discover_answer() {
        let result = br#"{"jsonrpc":"2.0","id":1,"result":{"supportedVersions":["2026-07-28"]}}"#;
        assert_eq!(era_of_discover_answer(result), Era::Modern);
        let unsupported =
            br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32022,"message":"x","data":{}}}"#;
        assert_eq!(era_of_discover_answer(unsupported), Era::Modern);
        let missing = br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"nope"}}"#;
        assert_eq!(era_of_discover_answer(missing), Era::Legacy);
        assert_eq!(era_of_discover_answer(b"not json"), Era::Legacy);
    }

    #[test]
    fn a_legacy_answer_is_made_modern_and_back() {
        let answer = br#"{"jsonrpc":"2.0","id":7,"result":{"tools":[]}}"#;
        let modern = modern_answer("tools/list", answer).unwrap();
        assert_eq!(
            String::from_utf8(modern.clone()).unwrap(),
            r#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"complete","ttlMs":0,"cacheScope":"private","tools":[]}}"#
        );
        let call = br#"{"jsonrpc":"2.0","id":7,"result":{"content":[]}}"#;
        let modern_call = modern_answer("tools/call", call).unwrap();
        assert_eq!(
            String::from_utf8(legacy_answer(&modern_call).unwrap()).unwrap(),
            String::from_utf8(call.to_vec()).unwrap()
        );
        let done = br#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"complete"}}"#;
        assert_eq!(modern_answer("tools/call", done), None);
        let missing = br#"{"jsonrpc":"2.0","id":7,"error":{"code":-32002,"message":"no such","data":{"uri":"x"}}}"#;
        // Only resources/read's -32002 is 2026-07-28's -32602; any other passes as written.
        assert_eq!(modern_answer("tools/call", missing), None);
        assert_eq!(
            String::from_utf8(modern_answer("resources/read", missing).unwrap()).unwrap(),
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"no such","data":{"uri":"x"}}}"#
        );
    }

    #[test]
    fn a_legacy_request_gains_the_modern_meta_without_a_value_respelled() {
        let client = LegacyClient::of(
            br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"roots":{}},"clientInfo":{"name":"codex","version":"1"}}}"#,
        );
        assert_eq!(client.version, "2025-06-18");
        let call = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"n":1.50}}}"#;
        let modern = String::from_utf8(client.modern_request(call).unwrap()).unwrap();
        assert_eq!(
            modern,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"roots":{}},"io.modelcontextprotocol/clientInfo":{"name":"codex","version":"1"}},"name":"x","arguments":{"n":1.50}}}"#
        );
        let with_meta = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"progressToken":3}}}"#;
        let modern = String::from_utf8(client.modern_request(with_meta).unwrap()).unwrap();
        assert!(modern.ends_with(r#""io.modelcontextprotocol/clientInfo":{"name":"codex","version":"1"},"progressToken":3}}}"#), "{modern}");
        let bare = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        let modern = String::from_utf8(client.modern_request(bare).unwrap()).unwrap();
        assert!(
            modern.starts_with(
                r#"{"params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28""#
            ),
            "{modern}"
        );
        assert!(matches!(
            message::parse(modern.as_bytes()),
            Ok(message::Parsed::Single(message::Kind::Request {
                modern: Some(_),
                ..
            }))
        ));
    }

    #[test]
    fn discover_and_initialize_are_answered_from_each_other() {
        let init = r#"{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"everything","version":"2"},"instructions":"hi"}"#;
        let discover = discover_result(init);
        let value: serde_json::Value = serde_json::from_str(&discover).unwrap();
        assert_eq!(value["supportedVersions"][0], "2026-07-28");
        assert_eq!(value["capabilities"]["tools"], serde_json::json!({}));
        assert_eq!(
            value["_meta"][message::META_SERVER_INFO]["name"],
            "everything"
        );
        assert_eq!(value["instructions"], "hi");
        let client = LegacyClient::of(
            br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#,
        );
        let back: serde_json::Value =
            serde_json::from_str(&client.initialize_result(&discover)).unwrap();
        assert_eq!(back["protocolVersion"], "2025-06-18");
        assert_eq!(back["serverInfo"]["name"], "everything");
        assert_eq!(back["instructions"], "hi");
    }
}
