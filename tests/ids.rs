//! A fuzz-style property test of the relay's bookkeeping: random interleavings of requests
//! (with reused ids), server answers (late, duplicated, for ids never asked), client cancels,
//! timeouts and notifications. Whatever happens, a response reaches the client only for a
//! request it is waiting on — the very request the server answered — and a result over the
//! cap never reaches it raw.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use mcp_budget::budget::Budget;
use mcp_budget::budget::cursor::CursorKey;
use mcp_budget::intercept::Interceptor;
use mcp_budget::policy::Policy;
use mcp_budget::relay::Relay;
use mcp_budget::wire::framing::Frame;
use proptest::prelude::*;
use serde_json::{Value, json};

const CAP: usize = 2000;
const MARK: &str = "RAW-UNCAPPED-";

#[derive(Debug, Clone)]
enum Op {
    /// The client sends a request with this id (ids repeat on purpose).
    Request { id: u8, big: bool, float_form: bool },
    /// The server answers the n-th request it received and has not answered yet.
    Answer { n: usize },
    /// The server answers a request it already answered, again.
    AnswerAgain { n: usize },
    /// The server answers an id nobody asked for.
    Bogus { id: u8 },
    /// The client cancels this id.
    Cancel { id: u8 },
    /// Every request in flight times out.
    Timeout,
    /// The server sends a notification.
    Notify,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, any::<bool>(), any::<bool>()).prop_map(|(id, big, float_form)| Op::Request { id, big, float_form }),
        4 => (0usize..8).prop_map(|n| Op::Answer { n }),
        1 => (0usize..8).prop_map(|n| Op::AnswerAgain { n }),
        1 => (0u8..6).prop_map(|id| Op::Bogus { id }),
        1 => (0u8..6).prop_map(|id| Op::Cancel { id }),
        1 => Just(Op::Timeout),
        1 => Just(Op::Notify),
    ]
}

fn relay() -> Relay {
    let dir = std::env::temp_dir().join(format!("mcp-budget-ids-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = Policy::parse(
        &format!("[budget]\nmax_bytes = {CAP}\n"),
        &Path::new(&dir).join("cap.toml"),
    )
    .unwrap();
    Relay::new(Interceptor::new(Budget::with_key(
        policy,
        CursorKey::from_secret(b"ids"),
    )))
    .with_request_timeout(Some(Duration::from_secs(60)))
}

/// The id key the relay compares: `3` and `3.0` are one id.
fn key(id: u8) -> String {
    id.to_string()
}

/// A request the server received: its id as written, the serial the client gave it.
struct Received {
    id_text: String,
    serial: u64,
    big: bool,
}

fn server_answer(r: &Received) -> String {
    let text = if r.big {
        format!("{MARK}{}", "x".repeat(CAP * 2))
    } else {
        "small".to_string()
    };
    format!(
        r#"{{"jsonrpc":"2.0","id":{},"result":{{"serial":{},"content":[{{"type":"text","text":"{text}"}}]}}}}"#,
        r.id_text, r.serial
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_response_reaches_only_the_request_it_answers(ops in prop::collection::vec(op(), 1..60)) {
        let relay = relay();
        // The client's view: id key → serial of the request it waits on.
        let mut waiting: HashMap<String, u64> = HashMap::new();
        let mut received: Vec<Received> = Vec::new();
        let mut answered: Vec<Received> = Vec::new();
        let mut serial = 0u64;
        // Ids the server saw as the client wrote them: a reused one goes upstream under a fresh id.
        let mut used: std::collections::HashSet<String> = std::collections::HashSet::new();
        let check = |delivered: &[u8], waiting: &mut HashMap<String, u64>| -> Result<(), TestCaseError> {
            let text = String::from_utf8_lossy(delivered);
            prop_assert!(!text.contains(MARK), "an uncapped result reached the client");
            let message: Value = serde_json::from_slice(delivered).unwrap();
            if message.get("method").is_some() {
                return Ok(());
            }
            let id = message["id"].as_f64().map(|f| (f as u64).to_string()).unwrap_or_default();
            let Some(expected) = waiting.remove(&id) else {
                return Err(TestCaseError::fail(format!("a response for id {id}, which the client is not waiting on: {text:.200}")));
            };
            if let Some(got) = message["result"]["serial"].as_u64() {
                prop_assert_eq!(got, expected, "the answer to another request reached id {}", id);
            }
            Ok(())
        };
        for op in ops {
            match op {
                Op::Request { id, big, float_form } => {
                    serial += 1;
                    let id_text_sent = if float_form { format!("{id}.0") } else { id.to_string() };
                    let id_text = &id_text_sent;
                    let name = if big { "big" } else { "small" };
                    let line = format!(
                        r#"{{"jsonrpc":"2.0","id":{id_text},"method":"tools/call","params":{{"name":"{name}","arguments":{{"serial":{serial}}}}}}}"#
                    );
                    let duplicate = waiting.contains_key(&key(id));
                    let routed = relay.from_client(Frame::Line(line.into_bytes()));
                    match routed.to_server {
                        Some(forwarded) => {
                            prop_assert!(!duplicate, "a request reusing an id in flight went upstream");
                            // `7.0` is read as 7 by some servers and refused by others: no id.
                            prop_assert!(!float_form, "a float id went upstream");
                            // The server knows the request by the id it received.
                            let sent: Value = serde_json::from_slice(&forwarded).unwrap();
                            let id_text = sent["id"].to_string();
                            if used.contains(&key(id)) {
                                prop_assert!(id_text.starts_with("\"mcp-budget-"), "a reused id went upstream as is: {}", id_text);
                            } else {
                                used.insert(key(id));
                                prop_assert_eq!(&id_text, &id_text_sent);
                            }
                            waiting.insert(key(id), serial);
                            received.push(Received { id_text, serial, big });
                        }
                        None => {
                            // Refused: the refusal answers this request, not the pending one.
                            prop_assert_eq!(routed.to_client.len(), 1);
                            let refusal: Value = serde_json::from_slice(&routed.to_client[0]).unwrap();
                            let message = refusal["error"]["message"].as_str().unwrap();
                            if float_form {
                                prop_assert!(message.contains("an integer written plainly"), "{}", message);
                            } else {
                                prop_assert!(message.contains("Invalid Request: id"));
                            }
                        }
                    }
                }
                Op::Answer { n } => {
                    if received.is_empty() { continue; }
                    let r = received.remove(n % received.len());
                    if let Some(bytes) = relay.from_server(Frame::Line(server_answer(&r).into_bytes())) {
                        check(&bytes, &mut waiting)?;
                    }
                    answered.push(r);
                }
                Op::AnswerAgain { n } => {
                    if answered.is_empty() { continue; }
                    let r = &answered[n % answered.len()];
                    if let Some(bytes) = relay.from_server(Frame::Line(server_answer(r).into_bytes())) {
                        check(&bytes, &mut waiting)?;
                    }
                }
                Op::Bogus { id } => {
                    let r = Received { id_text: format!("{id}"), serial: 0, big: true };
                    let never_asked = !received.iter().any(|x| x.id_text.trim_end_matches(".0") == key(id))
                        && !waiting.contains_key(&key(id));
                    if never_asked
                        && let Some(bytes) = relay.from_server(Frame::Line(server_answer(&r).into_bytes()))
                    {
                        check(&bytes, &mut waiting)?;
                    }
                }
                Op::Cancel { id } => {
                    let line = format!(r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id}}}}}"#);
                    let routed = relay.from_client(Frame::Line(line.into_bytes()));
                    prop_assert!(routed.to_client.is_empty());
                    waiting.remove(&key(id));
                }
                Op::Timeout => {
                    let expired = relay.expire(Instant::now() + Duration::from_secs(3600));
                    for error in expired.to_client {
                        check(&error, &mut waiting)?;
                    }
                }
                Op::Notify => {
                    let note = br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"n"}}"#;
                    let delivered = relay.from_server(Frame::Line(note.to_vec()));
                    prop_assert_eq!(delivered.as_deref(), Some(&note[..]));
                }
            }
        }
    }
}

#[test]
fn the_property_test_can_fail() {
    // The check above is not vacuous: a response for an id nobody waits on is what it catches.
    let relay = relay();
    let bogus = json!({"jsonrpc":"2.0","id":4,"result":{"serial":1}}).to_string();
    assert_eq!(
        relay.from_server(Frame::Line(bogus.into_bytes())),
        None,
        "the relay dropped the unrequested answer"
    );
}
