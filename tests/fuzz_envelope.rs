//! The envelope reader under mutation (hardening, second round): real messages with keys
//! doubled, ids spelled every way JSON allows (and some it does not), nesting past the bound,
//! odd numbers, and random bytes. Driven through the relay in process, with a model server
//! that answers every request it is sent with a result far over the budget. It asserts that
//! every request is answered exactly once, and that no unbudgeted result reaches the client.
//! Bounded: a fixed number of cases (`PROPTEST_CASES` raises it for a longer run).

use std::path::Path;

use mcp_budget::budget::Budget;
use mcp_budget::budget::cursor::CursorKey;
use mcp_budget::intercept::Interceptor;
use mcp_budget::policy::Policy;
use mcp_budget::relay::Relay;
use mcp_budget::wire::framing::Frame;
use proptest::prelude::*;
use serde_json::Value;

/// The budget: automatic paging of anything over 4,000 bytes.
const MAX_BYTES: usize = 4000;
/// Marks every line of the model server's big result.
const MARK: &str = "UNBUDGETED-LINE";

fn relay() -> Relay {
    let policy = Policy::parse(
        &format!("[budget]\nmax_bytes = {MAX_BYTES}\n"),
        Path::new("fuzz.toml"),
    )
    .unwrap();
    Relay::new(Interceptor::new(Budget::with_key(
        policy,
        CursorKey::from_secret(b"fuzz"),
    )))
}

/// The model server's answer to one request it was sent (`id`: as it went upstream).
fn server_answer(id: &str, method: &str) -> String {
    let result = if method == "tools/call" {
        let text: String = (0..400).map(|i| format!("{MARK} {i:04}\n")).collect();
        format!(
            r#"{{"content":[{{"type":"text","text":{}}}]}}"#,
            Value::String(text)
        )
    } else {
        "{}".to_string()
    };
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#)
}

/// An id as a client may spell it: plain, escaped, in another number form, or no valid id.
fn arb_id() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u32..20).prop_map(|n| n.to_string()),
        (0u32..20).prop_map(|n| format!("{n}.0")),
        (0u32..20).prop_map(|n| format!("{n}0e-1")),
        (0u32..20).prop_map(|n| format!("\"r{n}\"")),
        (0u32..20).prop_map(|n| format!("\"\\u0072{n}\"")),
        (0u32..20).prop_map(|n| format!("\"\\/r{n}\"")),
        Just("1e999999".to_string()),
        Just("-0".to_string()),
        Just("123456789012345678901234567890".to_string()),
        Just("{\"a\":1}".to_string()),
        Just("[1]".to_string()),
        Just("true".to_string()),
    ]
}

/// What is done to a real message.
#[derive(Debug, Clone)]
enum Mutation {
    None,
    /// One of the keys the proxy decides on, a second time.
    Duplicate(&'static str),
    /// The arguments nested this deep.
    Deep(usize),
    /// A number form in a budget argument.
    OddNumber(&'static str),
    /// No method.
    NoMethod,
}

fn arb_mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => Just(Mutation::None),
        3 => prop::sample::select(vec!["id", "method", "params", "name", "arguments", "_meta", "task", "jsonrpc"])
            .prop_map(Mutation::Duplicate),
        1 => (100usize..400).prop_map(Mutation::Deep),
        1 => prop::sample::select(vec!["1e400", "-0", "1.0", "18446744073709551616", "0.5"])
            .prop_map(Mutation::OddNumber),
        1 => Just(Mutation::NoMethod),
    ]
}

/// One request line: a `tools/call` (automatically paged), `tools/list` or `ping`, mutated.
fn request_line(id: &str, method: &str, mutation: &Mutation) -> String {
    let arguments = match mutation {
        Mutation::Deep(depth) => {
            format!(r#"{{"x":{}1{}}}"#, "[".repeat(*depth), "]".repeat(*depth))
        }
        Mutation::OddNumber(number) => format!(r#"{{"after":{number}}}"#),
        _ => "{}".to_string(),
    };
    let params = match method {
        "tools/call" => {
            format!(r#"{{"name":"dump","arguments":{arguments},"_meta":{{"progressToken":1}}}}"#)
        }
        _ => r#"{"_meta":{}}"#.to_string(),
    };
    let params = match mutation {
        Mutation::Duplicate("name") => params.replacen(
            "{\"name\":\"dump\"",
            "{\"name\":\"hidden\",\"name\":\"dump\"",
            1,
        ),
        Mutation::Duplicate("arguments") => {
            params.replacen("\"arguments\":", "\"arguments\":{},\"arguments\":", 1)
        }
        Mutation::Duplicate("_meta") => params.replacen("\"_meta\":", "\"_meta\":{},\"_meta\":", 1),
        Mutation::Duplicate("task") => params.replacen('{', "{\"task\":{},\"task\":{},", 1),
        _ => params,
    };
    let head = match mutation {
        Mutation::Duplicate("id") => format!(r#""id":{id},"id":{id}"#),
        _ => format!(r#""id":{id}"#),
    };
    let method_part = match mutation {
        Mutation::NoMethod => String::new(),
        Mutation::Duplicate("method") => format!(r#","method":"x","method":"{method}""#),
        _ => format!(r#","method":"{method}""#),
    };
    let params_part = match mutation {
        Mutation::Duplicate("params") => format!(r#","params":{{}},"params":{params}"#),
        _ => format!(r#","params":{params}"#),
    };
    let jsonrpc = match mutation {
        Mutation::Duplicate("jsonrpc") => r#""jsonrpc":"2.0","jsonrpc":"1.0","#,
        _ => r#""jsonrpc":"2.0","#,
    };
    format!("{{{jsonrpc}{head}{method_part}{params_part}}}")
}

/// The method of a message that went upstream (read as a server would; one nested past
/// serde_json's limit is the server's to refuse).
fn method_of(line: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Method {
        method: Option<String>,
    }
    serde_json::from_slice::<Method>(line)
        .ok()
        .and_then(|m| m.method)
        .unwrap_or_default()
}

/// Whether a line the client got is a response (not a notification).
fn is_response(line: &[u8]) -> bool {
    serde_json::from_slice::<Value>(line).is_ok_and(|m| m.get("method").is_none())
}

/// No unbudgeted result: a line over the budget never carries the model's big result.
fn check_budgeted(line: &[u8]) -> Result<(), TestCaseError> {
    let text = String::from_utf8_lossy(line);
    let marks = text.matches(MARK).count();
    prop_assert!(
        marks < 400,
        "the whole big result reached the client ({} bytes)",
        line.len()
    );
    prop_assert!(
        line.len() < MAX_BYTES * 2,
        "a line of {} bytes reached the client",
        line.len()
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(400)
    ))]

    #[test]
    fn every_request_is_answered_once_and_none_unbudgeted(
        requests in prop::collection::vec(
            (arb_id(), prop::sample::select(vec!["tools/call", "tools/list", "ping"]), arb_mutation()),
            1..24,
        ),
        answer_after in prop::collection::vec(any::<bool>(), 24),
    ) {
        let relay = relay();
        let mut responses = 0usize;
        // What the model server was sent and has not answered: (id as sent, method).
        let mut upstream: Vec<(String, String)> = Vec::new();
        let answer = |relay: &Relay, upstream: &mut Vec<(String, String)>, responses: &mut usize| -> Result<(), TestCaseError> {
            for (id, method) in upstream.drain(..) {
                if let Some(line) = relay.from_server(Frame::Line(server_answer(&id, &method).into_bytes())) {
                    check_budgeted(&line)?;
                    prop_assert!(is_response(&line));
                    *responses += 1;
                }
            }
            Ok(())
        };
        for (n, (id, method, mutation)) in requests.iter().enumerate() {
            let line = request_line(id, method, mutation);
            let routed = relay.from_client(Frame::Line(line.into_bytes()));
            for reply in &routed.to_client {
                check_budgeted(reply)?;
                prop_assert!(is_response(reply), "not a response: {}", String::from_utf8_lossy(&reply[..reply.len().min(300)]));
                responses += 1;
            }
            if let Some(out) = &routed.to_server {
                let method = method_of(out);
                for id in &out.requests {
                    upstream.push((id.raw().to_string(), method.clone()));
                }
            }
            if answer_after[n] {
                answer(&relay, &mut upstream, &mut responses)?;
            }
        }
        answer(&relay, &mut upstream, &mut responses)?;
        prop_assert_eq!(responses, requests.len(), "every request answered exactly once");
        prop_assert_eq!(relay.in_flight(), 0);
    }

    #[test]
    fn random_bytes_and_flipped_messages_never_panic_nor_pass_unbudgeted(
        (id, method, mutation) in (arb_id(), prop::sample::select(vec!["tools/call", "ping"]), arb_mutation()),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
        noise in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let relay = relay();
        let mut line = request_line(&id, method, &mutation).into_bytes();
        for (at, byte) in flips {
            let at = at.index(line.len());
            line[at] = byte;
        }
        if truncate {
            line.truncate(cut.index(line.len() + 1));
        }
        for bytes in [line, noise] {
            let routed = relay.from_client(Frame::Line(bytes));
            // Whatever it was, at most one answer, and valid JSON.
            prop_assert!(routed.to_client.len() <= 1);
            for reply in &routed.to_client {
                prop_assert!(serde_json::from_slice::<Value>(reply).is_ok());
            }
            if let Some(out) = &routed.to_server {
                let method = method_of(out);
                for id in &out.requests {
                    if let Some(line) = relay.from_server(Frame::Line(server_answer(id.raw(), &method).into_bytes())) {
                        check_budgeted(&line)?;
                    }
                }
            }
        }
    }
}
