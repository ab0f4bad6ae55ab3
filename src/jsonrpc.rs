//! JSON-RPC messages the proxy writes itself: error responses and the codes it uses.

use serde::Serialize;
use serde_json::Value;

use crate::message::Id;

/// Invalid JSON was received.
pub const PARSE_ERROR: i64 = -32700;
/// The message is not a valid request (here: it exceeds the size limit).
pub const INVALID_REQUEST: i64 = -32600;
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
    fn excerpt_is_bounded_and_printable() {
        assert_eq!(excerpt(b"ab\ncd", 10), "abcd");
        assert_eq!(excerpt(b"abcdef", 3), "abc…");
    }
}
