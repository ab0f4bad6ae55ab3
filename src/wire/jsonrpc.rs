//! JSON-RPC messages the proxy writes itself: every one comes from a builder here.
//!
//! Ids are echoed as the peer wrote them ([`Id::raw`]); strings are escaped by serde_json, so
//! no builder can write invalid JSON whatever text it is handed.

use serde::Serialize;
use serde_json::Value;

use crate::wire::message::Id;

/// Invalid JSON was received.
pub const PARSE_ERROR: i64 = -32700;
/// The message is not a valid request (here: it exceeds the size limit).
pub const INVALID_REQUEST: i64 = -32600;
/// The method is not known (here: by a recorded server).
pub const METHOD_NOT_FOUND: i64 = -32601;
/// The params are not what the method takes (here: a key twice, unreadable params, or a
/// modern request without its `_meta`).
pub const INVALID_PARAMS: i64 = -32602;
/// 2026-07-28: an HTTP header does not match the body it came with.
pub const HEADER_MISMATCH: i64 = -32020;
/// 2026-07-28: the request lacks a client capability the method needs.
pub const MISSING_CAPABILITY: i64 = -32021;
/// 2026-07-28: the request's protocol version is not one the proxy serves.
pub const UNSUPPORTED_VERSION: i64 = -32022;
/// The upstream server is gone, timed out, or answered with something unusable.
pub const UPSTREAM_ERROR: i64 = -32000;

#[derive(Serialize)]
struct ErrorObject<'a> {
    code: i64,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<&'a Value>,
}

/// An error response for `id` (or `id: null` when the id could not be read).
pub fn error_response(id: Option<&Id>, code: i64, message: &str, data: Option<&Value>) -> Vec<u8> {
    let error = serde_json::to_string(&ErrorObject {
        code,
        message,
        data,
    })
    .unwrap_or_else(|_| format!("{{\"code\":{code},\"message\":\"error\"}}"));
    let id = id.map_or("null", Id::raw);
    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"error\":{error}}}").into_bytes()
}

/// A JSON string literal for `text`.
pub(crate) fn quote(text: &str) -> String {
    // Serializing a `&str` cannot fail; the fallback keeps the output valid JSON regardless.
    serde_json::to_string(text).unwrap_or_else(|_| String::from("\"\""))
}

/// `notifications/cancelled` for request `id`, with a reason.
pub fn cancelled(id: &Id, reason: &str) -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{},"reason":{}}}}}"#,
        id.raw(),
        quote(reason)
    )
    .into_bytes()
}

/// `notifications/initialized`, as the proxy sends it when it re-initializes a server.
pub fn initialized() -> Vec<u8> {
    br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_vec()
}

/// `notifications/tools/list_changed`, sent when the tools a client sees may have changed.
pub fn tools_list_changed() -> Vec<u8> {
    br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#.to_vec()
}

/// `notifications/message` from the proxy itself (logger `mcp-budget`).
pub fn log_message(level: &str, text: &str) -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"level":{},"logger":"mcp-budget","data":{}}}}}"#,
        quote(level),
        quote(text)
    )
    .into_bytes()
}

/// A `tools/call` result that is a tool execution error (`isError: true`) with `text`, for
/// problems the model can fix itself (MCP 2025-11-25: those are results, not JSON-RPC errors).
pub fn tool_error(id: &Id, text: &str) -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","id":{},"result":{{"content":[{{"type":"text","text":{}}}],"isError":true}}}}"#,
        id.raw(),
        quote(text)
    )
    .into_bytes()
}

/// A result response for `id`; `result` is the raw JSON of the result, written as it is.
pub fn result_response(id: &Id, result: &str) -> Vec<u8> {
    format!(r#"{{"jsonrpc":"2.0","id":{},"result":{result}}}"#, id.raw()).into_bytes()
}

/// A short, printable excerpt of a line for logs and error messages.
pub fn excerpt(line: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(&line[..line.len().min(max)]);
    let mut out: String = text.chars().filter(|c| !c.is_control()).collect();
    if line.len() > max {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_response_echoes_the_raw_id() {
        let id = Id::from_json_text("7.0");
        let bytes = error_response(Some(&id), PARSE_ERROR, "bad \"thing\"", None);
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            r#"{"jsonrpc":"2.0","id":7.0,"error":{"code":-32700,"message":"bad \"thing\""}}"#
        );
        let bytes = error_response(None, PARSE_ERROR, "x", Some(&serde_json::json!({"a":1})));
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x","data":{"a":1}}}"#
        );
    }

    #[test]
    fn builders_write_valid_json_whatever_the_text() {
        let id = Id::from_json_text(r#""a\"b""#);
        for bytes in [
            cancelled(&id, "quote \" and \n newline"),
            tool_error(&id, "limit must be an integer between 1 and 100"),
            log_message("warning", "\u{0}"),
            initialized(),
            tools_list_changed(),
        ] {
            let value: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(value["jsonrpc"], "2.0");
        }
        assert_eq!(
            String::from_utf8(cancelled(&Id::from_json_text("5"), "gone")).unwrap(),
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5,"reason":"gone"}}"#
        );
    }

    #[test]
    fn excerpt_is_bounded_and_printable() {
        assert_eq!(excerpt(b"ab\ncd", 10), "abcd");
        assert_eq!(excerpt(b"abcdef", 3), "abc…");
    }
}
