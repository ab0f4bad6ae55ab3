//! `mcp-budget report`: a forecast of a recorded session through the proxy.
//!
//! The recording is played again in this process: its client's messages, in order, through the
//! proxy's own relay ([`Relay`] and its [`Interceptor`]) in front of the recorded server (the
//! [`Replayer`] that `mcp-budget replay` serves). The budget is set up as `mcp-budget` sets it
//! up from the same `--policy` and `--client` ([`Setup`]), and the relay makes the session's
//! choices with the proxy's own code: the client's profile from the recorded `initialize`
//! (`clientInfo.name`, unless `--client` forces one) and, without `--policy`, the built-in
//! policy for the server's `serverInfo.name` (the interceptor's `server_named`, which looks it
//! up with [`crate::builtin::for_server`]; sized by `Budget::for_session`). Each call's pages
//! are followed to the last with the continuation each page names, as a client does. So the
//! pages of a call, the bytes the client's model reads of each, and the refusals are what that
//! client gets through the proxy.
//!
//! For every call that reached the server, also: the bytes and tokens (tiktoken o200k, of the
//! text the model reads) the server sent, and what the client received through the proxy that
//! recorded.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::budget::Budget;
use crate::budget::cap::read_bytes;
use crate::budget::continuation::META_CONTINUATION;
use crate::budget::cursor::CursorKey;
use crate::budget::reference;
use crate::client::{Profile, Reads};
use crate::intercept::Interceptor;
use crate::policy::Policy;
use crate::recording::{Exchange, Recording};
use crate::relay::Relay;
use crate::replay::Replayer;
use crate::upstream::Outgoing;
use crate::wire::framing::Frame;

/// The forecast's cursor key: the same recording and policy give the same figures.
const KEY: &[u8] = b"mcp-budget report";

/// At most this many pages of one call are followed.
pub const MAX_PAGES: usize = 1000;

/// One `tools/call` of the recording.
#[derive(Debug, Clone, Serialize)]
pub struct Call {
    pub index: usize,
    pub tool: String,
    pub arguments: Value,
    /// What the server sent.
    pub server_bytes: usize,
    pub server_tokens: usize,
    /// What the client received from the proxy that recorded.
    pub received_bytes: usize,
    pub received_tokens: usize,
    /// The first answer through the proxy (the whole message).
    pub budget_bytes: usize,
    pub budget_tokens: usize,
    /// The pages the client gets, following each page's continuation (0: refused, or an error).
    pub pages: usize,
    /// The bytes the client's model reads of each page (by its profile's `reads`).
    pub page_read_bytes: Vec<usize>,
    /// The proxy refuses the call, or one of its pages (`result-too-large`).
    pub refused: bool,
    /// What the proxy does to it: "unchanged", "page of 25 (total 68, more pages)", "refused: …"
    pub outcome: String,
    pub has_rule: bool,
    /// The bytes result references put into the call in place of themselves: what the
    /// client did not have to send (or read) to pass those results on.
    pub reference_bytes: usize,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The policy the session runs under: the `--policy` value, `builtin:NAME`, or `none`.
    pub policy: String,
    /// Why that one.
    pub policy_reason: String,
    /// The client profile the pages are fitted to, if any.
    pub client: Option<String>,
    /// Why that one (or none), and what it holds a result to.
    pub client_reason: String,
    /// The server's `serverInfo.name`, as recorded.
    pub server: Option<String>,
    pub calls: Vec<Call>,
    pub server_bytes: usize,
    pub server_tokens: usize,
    pub received_bytes: usize,
    pub received_tokens: usize,
    pub budget_bytes: usize,
    pub budget_tokens: usize,
    /// Pages of every call together.
    pub pages: usize,
    pub refused_calls: usize,
    /// Tools with a call the proxy refuses.
    pub capped_tools: Vec<String>,
    pub tools_without_rule: Vec<String>,
    /// Where the recording was cut mid-line, if it was.
    pub cut_at_line: Option<usize>,
    pub missed_messages: u64,
    /// Bytes result references kept out of the client's context, and in how many calls.
    pub reference_bytes: usize,
    pub reference_calls: usize,
}

/// Which policy a session runs under, and why.
#[derive(Debug, Clone)]
pub struct PolicyChoice {
    /// The policy that replaces the proxy's own for the session (the server's built-in one);
    /// `None`: the proxy's own (`--policy`, or with none given, automatic paging only).
    pub policy: Option<Policy>,
    /// Its name: the `--policy` value, `builtin:NAME`, or `none`.
    pub name: String,
    /// Why, in words.
    pub why: String,
}

/// The policy the proxy runs a session under in front of the server that calls itself `server`
/// (`serverInfo.name`): `given` (`--policy`) when there is one; else the built-in policy written
/// for that server, found by [`crate::builtin::for_server`], the lookup the proxy's interceptor
/// makes when the server names itself; else none: automatic paging only.
pub fn policy_for(given: Option<&Path>, server: Option<&str>) -> Result<PolicyChoice, String> {
    if let Some(path) = given {
        let name = path.display().to_string();
        let why = match name.as_str() {
            "none" => "--policy none: automatic paging only",
            _ => "--policy",
        };
        return Ok(PolicyChoice {
            policy: None,
            name,
            why: why.into(),
        });
    }
    let Some(server) = server else {
        return Ok(PolicyChoice {
            policy: None,
            name: "none".into(),
            why: "the server's serverInfo.name is not known, so no built-in policy: automatic paging only, as in the proxy; name one with --policy FILE or builtin:NAME".into(),
        });
    };
    let Some(builtin) = crate::builtin::for_server(server) else {
        return Ok(PolicyChoice {
            policy: None,
            name: "none".into(),
            why: format!(
                "no built-in policy for serverInfo.name {server:?}: automatic paging only, as in the proxy; name one with --policy FILE or builtin:NAME"
            ),
        });
    };
    let path = PathBuf::from(format!("builtin:{}", builtin.name));
    let policy = Policy::load(&path).map_err(|e| e.to_string())?;
    Ok(PolicyChoice {
        policy: Some(policy),
        name: path.display().to_string(),
        why: format!(
            "the built-in policy for serverInfo.name {server:?}, as the proxy picks it (--policy none: automatic paging only)"
        ),
    })
}

/// The profile a session's results are fitted to, and why: `--client` (forced in `base`, as
/// `Budget::choosing` looks it up), else the client's `clientInfo.name`, looked up in the same
/// profiles.
pub fn profile_for(base: &Budget, client: Option<&str>) -> (Option<Profile>, String) {
    let choice = base.choice();
    if let Some(forced) = &choice.forced {
        return (Some(forced.clone()), format!("--client {}", forced.name));
    }
    let Some(name) = client else {
        return (
            None,
            "no clientInfo.name recorded (--client NAME picks a profile)".into(),
        );
    };
    match crate::client::find(&choice.profiles, name) {
        Some(profile) => (
            Some(profile),
            format!("the recorded clientInfo.name {name:?}"),
        ),
        None => (
            None,
            format!(
                "the recorded clientInfo.name {name:?} has no profile (--client NAME picks one)"
            ),
        ),
    }
}

/// What a session's budget holds one result to, in words.
pub fn limits_text(budget: &Budget) -> String {
    let limits = budget.limits();
    let mut held = vec![format!("{} bytes", limits.bytes)];
    if let Some(tokens) = limits.tokens {
        held.push(format!("{tokens} tokens (o200k)"));
    }
    if let Some(lines) = limits.lines {
        held.push(format!("{lines} lines"));
    }
    format!(
        "a result under {}; its model reads {}",
        held.join(", "),
        match limits.reads {
            Reads::Both => "the whole result",
            Reads::Content => "content",
            Reads::Structured => "structuredContent",
        }
    )
}

/// How the forecast's proxy is set up, and what it chooses for the recorded session.
pub struct Setup {
    /// The budget `mcp-budget` starts with for the same `--policy` and `--client`.
    base: Arc<Budget>,
    /// The recorded session's budget as the proxy fits it (`Budget::for_session`): for the
    /// report's words (rules, limits); the relay fits its own.
    session: Budget,
    policy: PolicyChoice,
    client: Option<String>,
    client_why: String,
    server: Option<String>,
}

impl Setup {
    /// As `mcp-budget [--policy P] [--client NAME] -- SERVER` sets up its budget (the binary's
    /// `proxy`): the policy given, else none (the server's built-in policy is picked once the
    /// server names itself); the profile `--client` names (an unknown name is the proxy's
    /// error), else the client's own.
    pub fn new(
        recording: &Recording,
        policy: Option<&Path>,
        client: Option<&str>,
    ) -> Result<Setup, String> {
        let given = policy
            .map(Policy::load)
            .transpose()
            .map_err(|e| e.to_string())?;
        let base = Budget::with_key(given.unwrap_or_default(), CursorKey::from_secret(KEY))
            .choosing(client, policy.is_none(), true)?;
        let exchanges = recording.exchanges();
        let server = recorded_server(&exchanges);
        let choice = policy_for(policy, server.as_deref())?;
        let (profile, why) = profile_for(&base, recorded_client(&exchanges).as_deref());
        let session = base.for_session(choice.policy.as_ref(), profile.as_ref());
        let client_why = format!("{why}: {}", limits_text(&session));
        Ok(Setup {
            base: Arc::new(base),
            session,
            policy: choice,
            client: profile.map(|p| p.name),
            client_why,
            server,
        })
    }
}

/// The server's name as the recording has it: its answer to `initialize` (`serverInfo`), or a
/// modern answer's `_meta`.
fn recorded_server(exchanges: &[Exchange]) -> Option<String> {
    exchanges.iter().find_map(|e| {
        let result = e.response.as_ref()?.get("result")?;
        let named = match e.method.as_str() {
            "initialize" => result.pointer("/serverInfo/name"),
            _ => None,
        }
        .or_else(|| {
            result
                .get("_meta")?
                .get(crate::wire::message::META_SERVER_INFO)?
                .get("name")
        });
        named?.as_str().map(String::from)
    })
}

/// The client's name as the recording has it: its `initialize` (`clientInfo`), or a modern
/// request's `_meta`.
fn recorded_client(exchanges: &[Exchange]) -> Option<String> {
    exchanges.iter().find_map(|e| {
        let params = e.request.get("params")?;
        let named = match e.method.as_str() {
            "initialize" => params.pointer("/clientInfo/name"),
            _ => None,
        }
        .or_else(|| {
            params
                .get("_meta")?
                .get(crate::wire::message::META_CLIENT_INFO)?
                .get("name")
        });
        named?.as_str().map(String::from)
    })
}

/// Counts tokens of the text a model reads.
pub struct Tokenizer(tiktoken_rs::CoreBPE);

impl Tokenizer {
    pub fn o200k() -> Result<Tokenizer, String> {
        tiktoken_rs::o200k_base()
            .map(Tokenizer)
            .map_err(|e| format!("cannot load the o200k tokenizer: {e}"))
    }

    pub fn count(&self, text: &str) -> usize {
        self.0.encode_ordinary(text).len()
    }

    /// Tokens of a JSON-RPC response as a model sees it: the text blocks of a result, or the
    /// message of an error.
    pub fn response(&self, message: &Value) -> usize {
        if let Some(error) = message.get("error") {
            return self.count(
                error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
            );
        }
        let texts: Vec<&str> = message["result"]["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|block| block.get("text").and_then(Value::as_str))
            .collect();
        self.count(&texts.join("\n"))
    }
}

/// What one call came to through the proxy.
#[derive(Debug, Default)]
struct Walk {
    /// The first answer the client got (`Null`: none), and its size.
    first: Value,
    first_bytes: usize,
    /// The bytes the client's model reads of each page.
    read_bytes: Vec<usize>,
    /// The page the proxy refused (1-based), if one was.
    refused: Option<usize>,
    /// The error that answered a page (1-based), if one did.
    error: Option<(usize, String)>,
    /// More pages remained after [`MAX_PAGES`].
    cut: bool,
}

/// The recorded sessions through the proxy's relay, one relay per session (as `--listen`
/// makes), in front of the recorded server.
struct Player {
    base: Arc<Budget>,
    replayer: Replayer,
    relays: HashMap<Option<String>, Relay>,
    reads: Reads,
    fresh: u64,
}

impl Player {
    /// Everything the client receives for `message`, once the proxy and the server are done.
    fn send(&mut self, session: &Option<String>, message: &[u8]) -> Vec<Vec<u8>> {
        let relay = self
            .relays
            .entry(session.clone())
            .or_insert_with(|| Relay::new(Interceptor::shared(self.base.clone())));
        pump(relay, &self.replayer, message)
    }

    /// The call `request` (`bytes`, as the client wrote it), and each next page its answers
    /// name, as a client follows them.
    fn follow(&mut self, session: &Option<String>, bytes: &[u8], request: &Value) -> Walk {
        let mut walk = Walk::default();
        let mut id = request.get("id").cloned().unwrap_or(Value::Null);
        let mut delivered = self.send(session, bytes);
        loop {
            let page = walk.read_bytes.len() + 1;
            let Some((bytes, answer)) = answer_to(delivered, &id) else {
                walk.error = Some((page, "no answer".into()));
                break;
            };
            if page == 1 {
                walk.first_bytes = bytes.len();
                walk.first = answer.clone();
            }
            if let Some(error) = answer.get("error") {
                let message = error.get("message").and_then(Value::as_str);
                walk.error = Some((page, message.unwrap_or("an error").to_string()));
                break;
            }
            if is_refusal(&answer["result"]) {
                walk.refused = Some(page);
                break;
            }
            walk.read_bytes.push(read_bytes(
                self.reads,
                raw_result(&bytes).unwrap_or_default(),
            ));
            let Some((argument, cursor)) = continuation(&answer["result"]) else {
                break;
            };
            if walk.read_bytes.len() >= MAX_PAGES {
                walk.cut = true;
                break;
            }
            self.fresh += 1;
            let Some(next) = next_page(request, &argument, &cursor, self.fresh) else {
                break;
            };
            id = next["id"].clone();
            delivered = self.send(session, next.to_string().as_bytes());
        }
        walk
    }
}

/// One client message through `relay`, the server's answers back through it (as the proxy's
/// session driver passes them): what reaches the client.
fn pump(relay: &Relay, replayer: &Replayer, message: &[u8]) -> Vec<Vec<u8>> {
    let routed = relay.from_client(Frame::Line(message.to_vec()));
    let mut delivered = routed.to_client;
    delivered.extend(routed.deferred.into_iter().map(|job| job.run()));
    let mut upstream: VecDeque<Outgoing> = routed
        .probe
        .into_iter()
        .chain(routed.to_server)
        .chain(routed.also_to_server)
        .collect();
    // Bounded: each round answers what the last one sent.
    for _ in 0..64 {
        while let Some(out) = upstream.pop_front() {
            for reply in server_answers(replayer, &out.bytes) {
                delivered.extend(relay.from_server(Frame::Line(reply)));
                let later = relay.take_later();
                upstream.extend(later.to_server);
                delivered.extend(later.to_client.into_iter().map(|(bytes, ..)| bytes));
            }
        }
        let later = relay.take_later();
        if later.is_empty() {
            break;
        }
        upstream.extend(later.to_server);
        delivered.extend(later.to_client.into_iter().map(|(bytes, ..)| bytes));
    }
    delivered
}

/// The recorded server's messages for one it receives, as `mcp-budget replay` writes them.
fn server_answers(replayer: &Replayer, bytes: &[u8]) -> Vec<Vec<u8>> {
    let replies = match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Array(batch)) => {
            let replies: Vec<Value> = batch.iter().flat_map(|m| replayer.answer(m)).collect();
            match replies.is_empty() {
                true => Vec::new(),
                false => vec![Value::Array(replies)],
            }
        }
        Ok(message) => replayer.answer(&message),
        Err(_) => Vec::new(),
    };
    replies
        .into_iter()
        .map(|reply| reply.to_string().into_bytes())
        .collect()
}

/// The answer to the request `id` among what reached the client.
fn answer_to(delivered: Vec<Vec<u8>>, id: &Value) -> Option<(Vec<u8>, Value)> {
    delivered.into_iter().find_map(|bytes| {
        let message: Value = serde_json::from_slice(&bytes).ok()?;
        let answers = message.get("method").is_none() && message.get("id") == Some(id);
        answers.then_some((bytes, message))
    })
}

/// The text of a message's `result`, as sent.
fn raw_result(message: &[u8]) -> Option<&str> {
    #[derive(Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        result: Option<&'a RawValue>,
    }
    serde_json::from_slice::<Envelope<'_>>(message)
        .ok()?
        .result
        .map(RawValue::get)
}

/// The proxy's refusal: an error result that says `result-too-large`.
fn is_refusal(result: &Value) -> bool {
    result["isError"] == json!(true)
        && result["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("result-too-large"))
}

/// The argument and cursor that continue a page, where the page names them: its notice
/// (`after:"…"`, or the argument an automatic page names), else `next_after` (an items page's
/// `structuredContent`, its `mcp_budget` object, the `_meta` continuation, or an items page
/// written as JSON text).
fn continuation(result: &Value) -> Option<(String, String)> {
    let meta = &result["_meta"][META_CONTINUATION];
    let blocks: Vec<&str> = result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|block| block.get("text").and_then(Value::as_str))
        .collect();
    // Notices come last.
    let notices = blocks
        .iter()
        .rev()
        .copied()
        .chain(meta.get("notice").and_then(Value::as_str));
    for notice in notices {
        if let Some(found) = named_cursor(notice) {
            return Some(found);
        }
    }
    let structured = &result["structuredContent"];
    let next = structured
        .get("next_after")
        .or_else(|| structured.get("mcp_budget")?.get("next_after"))
        .or_else(|| meta.get("next_after"))
        .and_then(Value::as_str)
        .map(String::from)
        .or_else(|| {
            blocks.iter().find_map(|text| {
                if !text.trim_start().starts_with('{') || !text.contains("\"next_after\"") {
                    return None;
                }
                let document: Value = serde_json::from_str(text).ok()?;
                document.get("next_after")?.as_str().map(String::from)
            })
        })?;
    Some(("after".into(), next))
}

/// `More remain: call T again with … NAME:"CURSOR" …` → (NAME, CURSOR).
fn named_cursor(notice: &str) -> Option<(String, String)> {
    let rest = &notice[notice.find("More remain: call ")?..];
    let quote = rest.find(":\"")?;
    let name_start = rest[..quote]
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    let argument = &rest[name_start..quote];
    let value = &rest[quote + 2..];
    let cursor = &value[..value.find('"')?];
    (!argument.is_empty() && !cursor.is_empty()).then(|| (argument.to_string(), cursor.to_string()))
}

/// `request` again, asking for the page `cursor` continues to (a fresh id).
fn next_page(request: &Value, argument: &str, cursor: &str, n: u64) -> Option<Value> {
    let mut next = request.clone();
    let object = next.as_object_mut()?;
    object.insert("id".into(), json!(format!("mcp-budget-report-{n}")));
    let params = object.get_mut("params")?.as_object_mut()?;
    let arguments = params
        .entry("arguments")
        .or_insert_with(|| json!({}))
        .as_object_mut()?;
    arguments.insert(argument.into(), json!(cursor));
    Some(next)
}

/// A recorded call that continues a page the recording's proxy served (it took the cursor off
/// on the way to the server): the forecast follows pages itself.
fn continues_a_page(exchange: &Exchange) -> bool {
    let arguments = |m: &Value| {
        m.pointer("/params/arguments")
            .and_then(Value::as_object)
            .cloned()
    };
    let (Some(sent), upstream) = (
        arguments(&exchange.request),
        arguments(&exchange.upstream_request),
    ) else {
        return false;
    };
    ["after", crate::budget::descriptor::OWN_AFTER_ARGUMENT]
        .iter()
        .any(|a| sent.contains_key(*a) && !upstream.as_ref().is_some_and(|u| u.contains_key(*a)))
}

fn outcome(original: &Value, walk: &Walk, page_len: Option<usize>) -> String {
    let budgeted = &walk.first;
    let result = &budgeted["result"];
    let mut text = match (walk.refused, &walk.error) {
        (Some(1), _) => {
            let refusal = result["content"][0]["text"].as_str().unwrap_or_default();
            return match over_what(refusal) {
                Some(over) => format!("refused: over the {over}"),
                None => "refused: result-too-large".into(),
            };
        }
        (_, Some((1, message))) => return format!("error: {message}"),
        _ => first_page(original, result, page_len),
    };
    if let Some(page) = walk.refused {
        text.push_str(&format!("; page {page} refused"));
    }
    if let Some((page, message)) = &walk.error {
        text.push_str(&format!("; page {page}: {message}"));
    }
    if walk.cut {
        text.push_str(&format!("; stopped after {MAX_PAGES} pages"));
    }
    text
}

/// The budget a refusal names: "10000-byte budget for codex", "200000-byte cap".
fn over_what(refusal: &str) -> Option<&str> {
    ["-byte ", "-token ", "-line "].iter().find_map(|unit| {
        let at = refusal.find(unit)?;
        let digits = refusal[..at]
            .rfind(|c: char| !c.is_ascii_digit())
            .map_or(0, |i| i + 1);
        let rest = &refusal[digits..];
        let end = rest.find([',', ';', '\u{2014}']).unwrap_or(rest.len());
        (digits < at).then(|| rest[..end].trim_end())
    })
}

/// What the first page is, in words.
fn first_page(original: &Value, result: &Value, page_len: Option<usize>) -> String {
    if original["result"] == *result {
        return "unchanged".into();
    }
    if let Some(notice) = result["content"]
        .as_array()
        .and_then(|blocks| blocks.last())
        .and_then(|block| block["text"].as_str())
        && notice.starts_with("mcp-budget paged this result")
    {
        let holds = notice
            .split("this page holds ")
            .nth(1)
            .map(|rest| {
                rest.split(". ")
                    .next()
                    .unwrap_or(rest)
                    .trim_end_matches('.')
            })
            .unwrap_or_default();
        let more = if notice.contains("More remain") {
            ", more pages"
        } else {
            ""
        };
        return format!("paged automatically: {holds}{more}");
    }
    if let Some(notice) = result["content"][1]["text"].as_str()
        && notice.starts_with("Lines ")
    {
        let lines = notice
            .split(" (")
            .next()
            .unwrap_or(notice)
            .trim_start_matches("Lines ");
        let more = if notice.contains("More remain") {
            ", more pages"
        } else {
            ""
        };
        return format!("text page: lines {lines}{more}");
    }
    let structured = &result["structuredContent"];
    if let Some(total) = structured.get("total_count").and_then(Value::as_u64) {
        let shown = structured
            .get("returned")
            .and_then(Value::as_u64)
            .or(page_len.map(|n| n as u64))
            .unwrap_or(0);
        let more = if structured.get("next_after").is_some() {
            ", more pages"
        } else {
            ""
        };
        return format!("page of {shown} (total {total}{more})");
    }
    "trimmed".into()
}

/// Builds the report; `progress(done, total)` is called as calls are measured.
pub fn build(
    recording: &Recording,
    setup: &Setup,
    tokenizer: &Tokenizer,
    mut progress: impl FnMut(usize, usize),
) -> Report {
    let exchanges: Vec<Exchange> = recording
        .exchanges()
        .into_iter()
        .filter(|e| e.method == "tools/call" && e.response.is_some() && !continues_a_page(e))
        .collect();
    let total = exchanges.len();
    // The calls to forecast, by the request the client wrote.
    let mut waiting: HashMap<String, VecDeque<usize>> = HashMap::new();
    for (index, exchange) in exchanges.iter().enumerate() {
        waiting
            .entry(exchange.request.to_string())
            .or_default()
            .push_back(index);
    }
    let mut player = Player {
        base: setup.base.clone(),
        replayer: Replayer::new(recording),
        relays: HashMap::new(),
        reads: setup.session.limits().reads,
        fresh: 0,
    };
    let mut walks: Vec<Option<Walk>> = (0..total).map(|_| None).collect();
    // The calls in the order the client sent them (the recording's exchanges are in the order
    // of their answers).
    let mut played = Vec::with_capacity(total);
    let mut done = 0;
    // The client's messages in order: its initialize and tools/list reach the relay before
    // its calls, as they reached the proxy.
    for entry in recording.entries.iter().filter(|e| e.dir == "c2s") {
        let Some(raw) = &entry.msg else { continue };
        let Ok(message) = serde_json::from_str::<Value>(raw.get()) else {
            continue;
        };
        match message.get("method").and_then(Value::as_str) {
            Some("tools/call") => {
                // Calls the recording's proxy answered itself, or that were never answered,
                // are not forecast.
                let Some(index) = waiting
                    .get_mut(&message.to_string())
                    .and_then(VecDeque::pop_front)
                else {
                    continue;
                };
                progress(done, total);
                // A call that passed result references is played as it went upstream (the
                // references open only for the proxy that recorded).
                let played_as = match &entry.changed {
                    Some(sent) if reference::mentioned(raw.get().as_bytes()) => sent,
                    _ => raw,
                };
                let bytes = played_as.get().as_bytes();
                walks[index] = Some(player.follow(&entry.session, bytes, &message));
                played.push(index);
                done += 1;
            }
            Some(_) => {
                player.send(&entry.session, raw.get().as_bytes());
            }
            // A batch goes as it went; an answer to a server request has nothing to answer (the
            // recorded server asks nothing).
            None if message.is_array() => {
                player.send(&entry.session, raw.get().as_bytes());
            }
            None => {}
        }
    }
    let mut calls = Vec::with_capacity(total);
    let mut capped = BTreeSet::new();
    let mut without_rule = BTreeSet::new();
    // Calls sent in a batch come last, each on its own.
    played.extend((0..total).filter(|index| walks[*index].is_none()));
    for (position, index) in played.into_iter().enumerate() {
        let exchange = &exchanges[index];
        let Some(response) = &exchange.response else {
            continue;
        };
        let walk = match walks[index].take() {
            Some(walk) => walk,
            None => {
                progress(done, total);
                done += 1;
                let bytes = exchange.request.to_string().into_bytes();
                player.follow(&None, &bytes, &exchange.request)
            }
        };
        let received = exchange.received().unwrap_or(response);
        let params = exchange
            .upstream_request
            .get("params")
            .cloned()
            .unwrap_or(Value::Null);
        let tool = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let arguments = exchange
            .request
            .pointer("/params/arguments")
            .cloned()
            .unwrap_or(json!({}));
        let has_rule = setup.session.policy().rule_for(&tool).is_some();
        if !has_rule {
            without_rule.insert(tool.clone());
        }
        let page_len = setup
            .session
            .page_len(&tool, &walk.first["result"]["structuredContent"]);
        let outcome = outcome(response, &walk, page_len);
        let sent = exchange.request.to_string();
        let reference_bytes = match reference::mentioned(sent.as_bytes()) {
            true => (exchange.upstream_request.to_string().len()).saturating_sub(sent.len()),
            false => 0,
        };
        if walk.refused.is_some() {
            capped.insert(tool.clone());
        }
        calls.push(Call {
            index: position + 1,
            tool,
            arguments,
            server_bytes: exchange.response_bytes,
            server_tokens: tokenizer.response(response),
            received_bytes: exchange.delivered_bytes,
            received_tokens: tokenizer.response(received),
            budget_bytes: walk.first_bytes,
            budget_tokens: tokenizer.response(&walk.first),
            pages: walk.read_bytes.len(),
            page_read_bytes: walk.read_bytes,
            refused: walk.refused.is_some(),
            outcome,
            has_rule,
            reference_bytes,
        });
    }
    progress(total, total);
    let reference_bytes = calls.iter().map(|c| c.reference_bytes).sum();
    let reference_calls = calls.iter().filter(|c| c.reference_bytes > 0).count();
    Report {
        policy: setup.policy.name.clone(),
        policy_reason: setup.policy.why.clone(),
        client: setup.client.clone(),
        client_reason: setup.client_why.clone(),
        server: setup.server.clone(),
        server_bytes: calls.iter().map(|c| c.server_bytes).sum(),
        server_tokens: calls.iter().map(|c| c.server_tokens).sum(),
        received_bytes: calls.iter().map(|c| c.received_bytes).sum(),
        received_tokens: calls.iter().map(|c| c.received_tokens).sum(),
        budget_bytes: calls.iter().map(|c| c.budget_bytes).sum(),
        budget_tokens: calls.iter().map(|c| c.budget_tokens).sum(),
        pages: calls.iter().map(|c| c.pages).sum(),
        refused_calls: calls.iter().filter(|c| c.refused).count(),
        calls,
        capped_tools: capped.into_iter().collect(),
        tools_without_rule: without_rule.into_iter().collect(),
        cut_at_line: recording.cut_at,
        missed_messages: recording.missed,
        reference_bytes,
        reference_calls,
    }
}

/// The human-readable table.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "policy: {} — {}\n",
        report.policy, report.policy_reason
    ));
    out.push_str(&format!(
        "client: {} — {}\n\n",
        report.client.as_deref().unwrap_or("none"),
        report.client_reason
    ));
    let w = report
        .calls
        .iter()
        .map(|c| c.tool.chars().count())
        .max()
        .unwrap_or(4)
        .max(5);
    out.push_str(&format!(
        "{:>4}  {:<w$} {:<28} {:>10} {:>9}   {:>10} {:>9}   {:>10} {:>9}  {:>5} {:>9}   {}\n",
        "#",
        "tool",
        "arguments",
        "bytes",
        "tokens",
        "bytes",
        "tokens",
        "bytes",
        "tokens",
        "pages",
        "max read",
        "through the proxy"
    ));
    out.push_str(&format!(
        "{:>4}  {:<w$} {:<28} {:>20}   {:>20}   {:>20}\n",
        "", "", "", "sent by the server", "received by the client", "first page"
    ));
    for call in &report.calls {
        let mut arguments = call.arguments.to_string();
        if arguments.chars().count() > 28 {
            arguments = format!("{}…", arguments.chars().take(27).collect::<String>());
        }
        let largest = call
            .page_read_bytes
            .iter()
            .max()
            .map_or("-".to_string(), usize::to_string);
        out.push_str(&format!(
            "{:>4}  {:<w$} {:<28} {:>10} {:>9}   {:>10} {:>9}   {:>10} {:>9}  {:>5} {:>9}   {}{}\n",
            call.index,
            call.tool,
            arguments,
            call.server_bytes,
            call.server_tokens,
            call.received_bytes,
            call.received_tokens,
            call.budget_bytes,
            call.budget_tokens,
            call.pages,
            largest,
            call.outcome,
            if call.has_rule { "" } else { " (no rule)" }
        ));
    }
    out.push_str(&format!(
        "{:>4}  {:<w$} {:<28} {:>10} {:>9}   {:>10} {:>9}   {:>10} {:>9}  {:>5}\n",
        "",
        "total",
        format!("{} calls", report.calls.len()),
        report.server_bytes,
        report.server_tokens,
        report.received_bytes,
        report.received_tokens,
        report.budget_bytes,
        report.budget_tokens,
        report.pages
    ));
    let list = |names: &[String]| {
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    };
    out.push_str(&format!(
        "\ntools the cap would refuse with default arguments: {}\n",
        list(&report.capped_tools)
    ));
    out.push_str(&format!(
        "tools with no budget rule: {}\n",
        list(&report.tools_without_rule)
    ));
    out.push_str(
        "pages: how many the client gets, following each page's continuation; max read: the bytes its model reads of the largest\n",
    );
    if report.reference_calls > 0 {
        out.push_str(&format!(
            "result references kept {} bytes out of the client's context ({} calls passed a result on without reading it)\n",
            report.reference_bytes, report.reference_calls
        ));
    }
    if let Some(line) = report.cut_at_line {
        out.push_str(&format!(
            "note: the recording was cut off at line {line}; the report covers what came before\n"
        ));
    }
    if report.missed_messages > 0 {
        out.push_str(&format!(
            "note: the recorder missed {} messages\n",
            report.missed_messages
        ));
    }
    out
}
