//! The 2026-07-28 protocol era ("modern") where the proxy writes or reads its results.
//!
//! Why a module of its own: a modern request is decided once, where it comes in (its `_meta`
//! read with the envelope, [`crate::wire::message::Modern`]); what differs for it afterwards — its
//! results carry `resultType`, only complete results are budgeted, lists carry `cacheScope` —
//! is done here, on the text of one result, never by `if modern` spread through the budget.
//!
//! Beside it: [`bridge`], a client of one era in front of a server of the other;
//! [`subscriptions`], `subscriptions/listen` served in front of a legacy server; and
//! [`task_token`], the sealed task ids a 2026-07-28 client is shown.

pub mod bridge;
pub mod subscriptions;
pub mod task_token;

use serde::Deserialize;
use serde_json::value::RawValue;

/// The Streamable HTTP headers the proxy reads (as a server) and writes (as a client), named
/// once: a lookup by a built name skips reading and checking the name each time.
pub mod headers {
    use hyper::header::HeaderName;

    pub const SESSION: HeaderName = HeaderName::from_static("mcp-session-id");
    pub const VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
    pub const METHOD: HeaderName = HeaderName::from_static("mcp-method");
    pub const NAME: HeaderName = HeaderName::from_static("mcp-name");
}

/// Whether `version` is a modern revision this proxy serves statelessly.
pub fn is_modern(version: &str) -> bool {
    version == crate::protocol::MODERN
}

/// The members of a result the era rules read.
#[derive(Deserialize, Default)]
struct Top<'a> {
    #[serde(borrow, rename = "resultType")]
    result_type: Option<&'a RawValue>,
    #[serde(borrow, rename = "_meta")]
    meta: Option<&'a RawValue>,
    #[serde(borrow, rename = "cacheScope")]
    cache_scope: Option<&'a RawValue>,
}

fn top(result: &str) -> Option<Top<'_>> {
    serde_json::from_str(result).ok()
}

/// Whether `finder`'s needle occurs at most once in `text`.
fn at_most_once(text: &str, finder: &memchr::memmem::Finder<'_>) -> bool {
    match finder.find(text.as_bytes()) {
        None => true,
        Some(at) => finder
            .find(&text.as_bytes()[at + finder.needle().len()..])
            .is_none(),
    }
}

/// The `resultType` of a result (a string), when it has one.
pub fn result_type(result: &str) -> Option<String> {
    // Most results (every legacy one) do not name it: no parse for them (one searcher, built
    // once: building it costs more than a short search).
    static NAME: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"resultType"));
    static META: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"_meta\""));
    static SCOPE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"cacheScope\""));
    let first = NAME.find(result.as_bytes())?;
    // The usual spelling: the first member, compact, a plain string, said once (no parse).
    let start = result.len() - result.trim_start().len();
    if first == start + 2
        && let Some(rest) = result[start..].strip_prefix(r#"{"resultType":""#)
        && let Some(end) = rest.find('"')
        && !rest[..end].contains('\\')
        && NAME.find(&rest.as_bytes()[end..]).is_none()
        // What makes the parse fail (and the result read as having no kind): a member it
        // reads named twice, perhaps in another spelling. None of it here: the parse agrees.
        && !crate::holds!(result.as_bytes(), b"\\u")
        && at_most_once(result, &META)
        && at_most_once(result, &SCOPE)
    {
        return Some(rest[..end].to_string());
    }
    let raw = top(result)?.result_type?;
    Some(serde_json::from_str::<String>(raw.get()).unwrap_or_else(|_| raw.get().to_string()))
}

/// Whether a result is complete, and so the budget's to read: `resultType` is `"complete"`, or
/// absent (a legacy server). `input_required`, `task` and anything else pass as they are.
pub fn is_complete(result: &str) -> bool {
    // A modern server's usual spelling, its first member: complete, whatever follows (a
    // second `resultType`, in any spelling, is a duplicate the parse refuses, and a result
    // without a readable kind is complete too). No scan, no copy.
    if result
        .trim_start()
        .starts_with(r#"{"resultType":"complete""#)
    {
        return true;
    }
    result_type(result).is_none_or(|kind| kind == "complete")
}

/// `object` (an object's JSON text) with `"name":value` as its first member.
pub(crate) fn prepend(object: &str, name: &str, value: &str) -> Option<String> {
    prepend_members(object, &format!("\"{name}\":{value}"))
}

/// `object` with `members` (JSON members, without braces) as its first members.
pub(crate) fn prepend_members(object: &str, members: &str) -> Option<String> {
    let open = object.find('{')?;
    let empty = object[open + 1..].trim_start().starts_with('}');
    let mut out = String::with_capacity(object.len() + members.len() + 2);
    out.push_str(&object[..=open]);
    out.push_str(members);
    if !empty {
        out.push(',');
    }
    out.push_str(&object[open + 1..]);
    Some(out)
}

/// A result the proxy wrote for a modern request, made complete: `resultType: "complete"`
/// when it names none, and the server's `_meta` (from `server`, the result it answered) when
/// it has none of its own. `None`: it was complete already.
pub fn completed(result: &str, server: Option<&str>) -> Option<String> {
    let members = top(result)?;
    let mut out: Option<String> = None;
    if members.meta.is_none()
        && let Some(meta) = server.and_then(top).and_then(|t| t.meta)
    {
        out = prepend(result, "_meta", meta.get());
    }
    if members.result_type.is_none() {
        let current = out.as_deref().unwrap_or(result);
        out = prepend(current, "resultType", "\"complete\"");
    }
    out
}

/// A list result with `cacheScope: "private"` (it was fitted to one client): the member
/// replaced where the server wrote one, else added. `None`: already private.
pub fn private(result: &str) -> Option<String> {
    let members = top(result)?;
    match members.cache_scope {
        Some(scope) if scope.get() == "\"private\"" => None,
        Some(scope) => Some(
            String::from_utf8_lossy(&crate::wire::message::splice(
                result.as_bytes(),
                scope.get(),
                b"\"private\"",
            ))
            .into_owned(),
        ),
        None => prepend(result, "cacheScope", "\"private\""),
    }
}

/// A whole response message whose result is proxy-made, made complete for a modern request
/// (see [`completed`]); an error response, or one already complete, is returned as it is.
pub fn completed_response(message: Vec<u8>) -> Vec<u8> {
    completed_message(message, None)
}

/// Like [`completed_response`], with the server's result (`server`) whose `_meta` it keeps.
pub fn completed_message(message: Vec<u8>, server: Option<&str>) -> Vec<u8> {
    let Ok(crate::wire::message::Parsed::Single(crate::wire::message::Kind::Response {
        result: Some(range),
        ..
    })) = crate::wire::message::parse(&message)
    else {
        return message;
    };
    let Some(result) = message
        .get(range)
        .and_then(|bytes| std::str::from_utf8(bytes).ok())
    else {
        return message;
    };
    match completed(result, server) {
        Some(done) => crate::wire::message::splice(&message, result, done.as_bytes()),
        None => message,
    }
}

/// The HTTP headers a modern request travels with (2026-07-28, Streamable HTTP): read from
/// the body that is actually sent, so they always match it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Headers {
    /// `MCP-Protocol-Version`: the request's `_meta` version (a known one not copied).
    pub version: std::borrow::Cow<'static, str>,
    /// `Mcp-Method` (a known one not copied).
    pub method: std::borrow::Cow<'static, str>,
    /// `Mcp-Name`, for the methods that name something (see [`crate::protocol::name_member`]).
    pub name: Option<String>,
    /// `Mcp-Param-{name}`: the arguments a tool's descriptor marks with `x-mcp-header`.
    pub params: Vec<(String, String)>,
}

impl Headers {
    /// The headers of a modern request (`bytes`: as it goes upstream).
    /// `name`: what `Mcp-Name` carries, as the envelope read it ([`crate::wire::message::Modern`]);
    /// `annotated`: the tool's arguments that travel as headers (header, argument).
    pub fn of(
        version: &str,
        method: &str,
        name: Option<String>,
        bytes: &[u8],
        annotated: &[(String, String)],
    ) -> Headers {
        let params = match annotated.is_empty() {
            true => Vec::new(),
            false => param_values(bytes, annotated)
                .into_iter()
                .filter_map(|(header, value)| Some((header, value?)))
                .collect(),
        };
        Headers {
            version: crate::wire::message::interned(version),
            method: crate::wire::message::interned(method),
            name,
            params,
        }
    }
}

/// The text each annotated argument of a `tools/call` (`bytes`) carries in its header: a
/// string as it is, a number as written, a boolean as `true`/`false`; `None` where the call
/// does not give the argument (or gives a value no header carries).
pub fn param_values(bytes: &[u8], annotated: &[(String, String)]) -> Vec<(String, Option<String>)> {
    #[derive(Deserialize)]
    struct Call<'a> {
        #[serde(borrow)]
        params: Option<CallParams<'a>>,
    }
    #[derive(Deserialize)]
    struct CallParams<'a> {
        #[serde(borrow)]
        arguments: Option<std::collections::HashMap<std::borrow::Cow<'a, str>, &'a RawValue>>,
    }
    let arguments = serde_json::from_slice::<Call<'_>>(bytes)
        .ok()
        .and_then(|c| c.params?.arguments)
        .unwrap_or_default();
    annotated
        .iter()
        .map(|(header, argument)| {
            let value = arguments.get(argument.as_str()).and_then(|raw| {
                let text = raw.get();
                match text.as_bytes().first() {
                    Some(b'"') => serde_json::from_str::<String>(text).ok(),
                    Some(b't' | b'f' | b'-' | b'0'..=b'9') => Some(text.to_string()),
                    _ => None,
                }
            });
            (header.clone(), value)
        })
        .collect()
}

/// A header value for `text`: as it is when it is visible ASCII without leading or trailing
/// space, else the `=?base64?…?=` form the revision defines.
pub fn header_value(text: &str) -> std::borrow::Cow<'_, str> {
    use base64::Engine;
    let plain = !text.is_empty()
        && text.bytes().all(|b| (0x20..0x7f).contains(&b))
        && !text.starts_with(' ')
        && !text.ends_with(' ')
        && !text.starts_with("=?");
    if plain {
        std::borrow::Cow::Borrowed(text)
    } else {
        std::borrow::Cow::Owned(format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(text)
        ))
    }
}

/// Whether a header's value (plain, or `=?base64?…?=`) says `expected`; compared without
/// copying when plain.
pub fn header_says(value: &str, expected: &str) -> bool {
    if !value.starts_with("=?base64?") {
        return value == expected;
    }
    header_text(value).as_deref() == Some(expected)
}

/// The text a header value carries: its `=?base64?…?=` form decoded, else as it is; `None`
/// when the encoded form does not decode to UTF-8 text.
pub fn header_text(value: &str) -> Option<String> {
    use base64::Engine;
    match value
        .strip_prefix("=?base64?")
        .and_then(|rest| rest.strip_suffix("?="))
    {
        Some(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok()),
        None => Some(value.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usual_spelling_of_result_type_is_read_as_a_parse_reads_it() {
        for (result, kind) in [
            (
                r#"{"resultType":"complete","content":[]}"#,
                Some("complete"),
            ),
            (r#"  {"resultType":"task","taskId":"t"}"#, Some("task")),
            (r#"{"resultType":"complete","resultType":"task"}"#, None),
            (
                r#"{"resultType":"compl\u0065te","content":[]}"#,
                Some("complete"),
            ),
            (
                r#"{"content":[],"resultType":"input_required"}"#,
                Some("input_required"),
            ),
            (
                r#"{"resultType":"complete","content":[{"type":"text","text":"resultType"}]}"#,
                Some("complete"),
            ),
            (r#"{"content":[{"type":"text","text":"resultType"}]}"#, None),
            (r#"{"resultType":"task","_meta":{},"_meta":{}}"#, None),
            (
                r#"{"resultType":"task","result\u0054ype":"complete"}"#,
                None,
            ),
        ] {
            assert_eq!(result_type(result).as_deref(), kind, "{result}");
        }
    }

    #[test]
    fn complete_results_are_the_budgets() {
        assert!(is_complete(r#"{"content":[]}"#));
        assert!(is_complete(r#"{"resultType":"complete","content":[]}"#));
        assert!(!is_complete(
            r#"{"resultType":"input_required","inputRequests":{}}"#
        ));
        assert!(!is_complete(r#"{"resultType":"task","taskId":"t"}"#));
        // The word inside a value is not the member.
        assert!(is_complete(
            r#"{"content":[{"type":"text","text":"resultType"}]}"#
        ));
        // The first-member shortcut says what the whole read says, duplicates included.
        for result in [
            r#"{"resultType":"complete","resultType":"task"}"#,
            r#"{"resultType":"complete","result\u0054ype":"task"}"#,
            r#" {"resultType":"complete","_meta":{},"_meta":{}}"#,
            r#"{"resultType":"complete","content":[{"type":"text","text":"resultType"}]}"#,
            r#"{"resultType":"completed","content":[]}"#,
            r#"{"resultType":"complete\u0064"}"#,
        ] {
            assert_eq!(
                is_complete(result),
                result_type(result).is_none_or(|kind| kind == "complete"),
                "{result}"
            );
        }
    }

    #[test]
    fn proxy_results_are_completed_with_the_servers_meta() {
        let server =
            r#"{"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"s"}},"content":[]}"#;
        assert_eq!(
            completed(r#"{"content":[],"isError":true}"#, Some(server)).as_deref(),
            Some(
                r#"{"resultType":"complete","_meta":{"io.modelcontextprotocol/serverInfo":{"name":"s"}},"content":[],"isError":true}"#
            )
        );
        assert_eq!(
            completed(r#"{}"#, None).as_deref(),
            Some(r#"{"resultType":"complete"}"#)
        );
        assert_eq!(
            completed(r#"{"resultType":"complete","_meta":{}}"#, Some(server)),
            None
        );
        let response =
            completed_response(br#"{"jsonrpc":"2.0","id":"\u0061","result":{"a":1}}"#.to_vec());
        assert_eq!(
            String::from_utf8(response).unwrap(),
            r#"{"jsonrpc":"2.0","id":"\u0061","result":{"resultType":"complete","a":1}}"#
        );
        let error = br#"{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"x"}}"#.to_vec();
        assert_eq!(completed_response(error.clone()), error);
    }

    #[test]
    fn headers_come_from_the_body_sent() {
        // What Mcp-Name carries is read with the envelope, decoded.
        let named = |line: &[u8]| match crate::wire::message::parse(line) {
            Ok(crate::wire::message::Parsed::Single(crate::wire::message::Kind::Request {
                modern: Some(modern),
                ..
            })) => modern.named,
            other => panic!("{other:?}"),
        };
        let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}"#;
        let call = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"r\u00e9sum\u00e9","arguments":{{}},{meta}}}}}"#
        );
        assert_eq!(named(call.as_bytes()).as_deref(), Some("résumé"));
        let read = format!(
            r#"{{"id":1,"method":"resources/read","params":{{"uri":"file:///a b","name":"x",{meta}}}}}"#
        );
        assert_eq!(named(read.as_bytes()).as_deref(), Some("file:///a b"));
        let list = format!(r#"{{"id":1,"method":"tools/list","params":{{"name":"x",{meta}}}}}"#);
        assert_eq!(named(list.as_bytes()), None);
        assert_eq!(header_value("résumé"), "=?base64?csOpc3Vtw6k=?=");
        assert_eq!(
            header_text("=?base64?csOpc3Vtw6k=?=").as_deref(),
            Some("résumé")
        );
        assert_eq!(header_value("get-env"), "get-env");
        assert_eq!(header_text("get-env").as_deref(), Some("get-env"));
        assert_eq!(header_text("=?base64?////?="), None);
    }

    #[test]
    fn lists_are_made_private() {
        assert_eq!(
            private(r#"{"tools":[],"ttlMs":5,"cacheScope":"public"}"#).as_deref(),
            Some(r#"{"tools":[],"ttlMs":5,"cacheScope":"private"}"#)
        );
        assert_eq!(
            private(r#"{"tools":[]}"#).as_deref(),
            Some(r#"{"cacheScope":"private","tools":[]}"#)
        );
        assert_eq!(private(r#"{"cacheScope":"private"}"#), None);
    }
}
