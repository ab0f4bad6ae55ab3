//! Replaying a recording: the recorded server, answering from the file.
//!
//! Each request is answered with the recorded response to the same method and params (ids
//! rewritten to the caller's; `_meta` and so progress tokens do not count in the match), after
//! the server messages that came between that request and its response in the recording
//! (progress re-addressed to the caller's progress token). Repeated identical requests get the
//! recorded responses in order, then the last again. An unrecorded request gets an error that
//! names the closest recorded one. It is an upstream like any other, so it works behind stdio,
//! behind `--listen`, and behind a policy.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::budget::cursor;
use crate::framing::Frame;
use crate::jsonrpc;
use crate::upstream::{Event, Link, Upstream};

/// A recording could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("cannot read the recording {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} is not an mcp-budget recording: its first line should be the header {{\"mcp_budget_recording\":1,…}} (make one with `mcp-budget record --out FILE`)"
    )]
    NotARecording { path: PathBuf },
    #[error("{path}:{line}: not a recording line ({detail})")]
    BadLine {
        path: PathBuf,
        line: usize,
        detail: String,
    },
}

/// One line of a recording, parsed.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Microseconds since the recording started.
    pub t: u64,
    pub dir: String,
    pub session: Option<String>,
    /// The message as the peer sent it (exact text).
    pub msg: Option<Box<RawValue>>,
    /// What went upstream (c2s) or to the client (s2c) when the proxy changed it.
    pub changed: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
struct Line {
    #[serde(default)]
    t: u64,
    dir: Option<String>,
    session: Option<String>,
    msg: Option<Box<RawValue>>,
    forwarded: Option<Box<RawValue>>,
    delivered: Option<Box<RawValue>>,
    missed: Option<u64>,
}

fn value(raw: &RawValue) -> Value {
    serde_json::from_str(raw.get()).unwrap_or(Value::Null)
}

/// A recording, read.
#[derive(Debug, Default)]
pub struct Recording {
    pub entries: Vec<Entry>,
    /// The 1-based line where the file was cut mid-line (a crash while recording).
    pub cut_at: Option<usize>,
    /// Messages the recorder reported missing.
    pub missed: u64,
}

impl Recording {
    /// Reads a recording. A last line cut mid-way is left out and reported in `cut_at`.
    pub fn load(path: &Path) -> Result<Recording, ReplayError> {
        let text = std::fs::read_to_string(path).map_err(|source| ReplayError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Recording::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Recording, ReplayError> {
        let mut lines = text
            .split('\n')
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .peekable();
        let header_ok = lines
            .next()
            .and_then(|(_, l)| serde_json::from_str::<Value>(l).ok())
            .is_some_and(|h| h.get("mcp_budget_recording").is_some());
        if !header_ok {
            return Err(ReplayError::NotARecording {
                path: path.to_path_buf(),
            });
        }
        let mut recording = Recording::default();
        let ends_with_newline = text.ends_with('\n');
        while let Some((index, line)) = lines.next() {
            let last = lines.peek().is_none();
            let value: Line = match serde_json::from_str(line) {
                Ok(value) => value,
                Err(_) if last && !ends_with_newline => {
                    recording.cut_at = Some(index + 1);
                    break;
                }
                Err(err) => {
                    return Err(ReplayError::BadLine {
                        path: path.to_path_buf(),
                        line: index + 1,
                        detail: err.to_string(),
                    });
                }
            };
            if let Some(missed) = value.missed {
                recording.missed += missed;
                continue;
            }
            let Some(dir) = value.dir else {
                return Err(ReplayError::BadLine {
                    path: path.to_path_buf(),
                    line: index + 1,
                    detail: "no \"dir\"".into(),
                });
            };
            recording.entries.push(Entry {
                t: value.t,
                dir,
                session: value.session,
                msg: value.msg,
                changed: value.forwarded.or(value.delivered),
            });
        }
        Ok(recording)
    }

    /// The request/response pairs, in order, with the server messages between them.
    pub fn exchanges(&self) -> Vec<Exchange> {
        let mut done: Vec<Exchange> = Vec::new();
        // (session, id key) → index into `open`
        let mut open: Vec<(Option<String>, String, Exchange)> = Vec::new();
        for entry in &self.entries {
            let Some(raw) = &entry.msg else { continue };
            let msg = value(raw);
            match entry.dir.as_str() {
                "c2s" => {
                    if let (Some(method), Some(id)) =
                        (msg.get("method").and_then(Value::as_str), msg.get("id"))
                    {
                        // What the server saw is what it answered.
                        let sent = entry.changed.as_deref().map_or_else(|| msg.clone(), value);
                        open.push((
                            entry.session.clone(),
                            id_key(id),
                            Exchange {
                                method: method.to_string(),
                                upstream_request: sent,
                                request: msg,
                                before: Vec::new(),
                                response: None,
                                response_bytes: 0,
                                delivered: None,
                                delivered_bytes: 0,
                            },
                        ));
                    }
                }
                "s2c" => {
                    if msg.get("method").is_none() {
                        if let Some(mut exchange) = take_open(&mut open, entry, &msg) {
                            exchange.response_bytes = raw.get().len();
                            exchange.response = Some(msg);
                            let delivered = entry.changed.as_deref().unwrap_or(raw);
                            exchange.delivered_bytes = delivered.get().len();
                            exchange.delivered = entry.changed.as_deref().map(value);
                            done.push(exchange);
                        }
                    } else {
                        // Progress belongs to the request that named its token; anything else
                        // to the oldest request still open in that session.
                        let token = msg.get("params").and_then(|p| p.get("progressToken"));
                        let owner = token
                            .and_then(|t| {
                                open.iter().position(|(s, _, e)| {
                                    *s == entry.session
                                        && e.upstream_request
                                            .get("params")
                                            .and_then(|p| p.get("_meta"))
                                            .and_then(|m| m.get("progressToken"))
                                            == Some(t)
                                })
                            })
                            .or_else(|| open.iter().position(|(s, _, _)| *s == entry.session));
                        if let Some(index) = owner {
                            open[index].2.before.push(msg);
                        }
                    }
                }
                "p2c" => {
                    // The proxy answered a request itself (a refused argument, an error).
                    if let Some(mut exchange) = take_open(&mut open, entry, &msg) {
                        exchange.delivered_bytes = raw.get().len();
                        exchange.delivered = Some(msg);
                        done.push(exchange);
                    }
                }
                _ => {}
            }
        }
        done
    }
}

/// The open exchange that `msg` (a response) answers, removed from `open`.
fn take_open(
    open: &mut Vec<(Option<String>, String, Exchange)>,
    entry: &Entry,
    msg: &Value,
) -> Option<Exchange> {
    let key = msg.get("id").map(id_key).unwrap_or_default();
    let pos = open
        .iter()
        .position(|(s, k, _)| *s == entry.session && *k == key)?;
    Some(open.remove(pos).2)
}

fn id_key(id: &Value) -> String {
    crate::message::Id::from_json_text(&id.to_string())
        .key()
        .to_string()
}

/// One request of the recording and what answered it.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub method: String,
    /// The request as the client sent it.
    pub request: Value,
    /// The request as the server received it (budget arguments stripped).
    pub upstream_request: Value,
    /// Server messages between the request and its response (progress, logging, …).
    pub before: Vec<Value>,
    /// The server's response (`None` when the proxy answered by itself).
    pub response: Option<Value>,
    /// Its exact size in the recording.
    pub response_bytes: usize,
    /// What the client received instead of `response`, when the proxy changed or gave it.
    pub delivered: Option<Value>,
    /// The exact size of what the client received.
    pub delivered_bytes: usize,
}

impl Exchange {
    /// What the client received.
    pub fn received(&self) -> Option<&Value> {
        self.delivered.as_ref().or(self.response.as_ref())
    }
}

/// The params a request is matched by: `_meta` removed, keys canonical.
fn match_key(method: &str, params: Option<&Value>) -> String {
    let mut params = params.cloned().unwrap_or(Value::Null);
    if let Value::Object(map) = &mut params {
        map.remove("_meta");
    }
    if method == "initialize" {
        params = Value::Null; // client name and version differ from run to run
    }
    let digest = cursor::digest(&json!([method, params]));
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A request's params without `_meta` (progress tokens and the like differ from run to run).
fn params_without_meta(request: &Value) -> Value {
    let mut params = request.get("params").cloned().unwrap_or(Value::Null);
    if let Value::Object(map) = &mut params {
        map.remove("_meta");
    }
    params
}

/// Key=value pairs of a value, for closeness.
fn flatten(prefix: &str, value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                flatten(&format!("{prefix}.{k}"), v, out);
            }
        }
        other => out.push(format!("{prefix}={other}")),
    }
}

/// Serves requests from a recording.
#[derive(Debug)]
pub struct Replayer {
    by_key: HashMap<String, Vec<Exchange>>,
    served: Mutex<HashMap<String, usize>>,
    all: Vec<Exchange>,
}

impl Replayer {
    pub fn new(recording: &Recording) -> Replayer {
        let all: Vec<Exchange> = recording
            .exchanges()
            .into_iter()
            .filter(|e| e.response.is_some())
            .collect();
        let mut by_key: HashMap<String, Vec<Exchange>> = HashMap::new();
        for exchange in &all {
            let key = match_key(&exchange.method, exchange.upstream_request.get("params"));
            by_key.entry(key).or_default().push(exchange.clone());
        }
        Replayer {
            by_key,
            served: Mutex::new(HashMap::new()),
            all,
        }
    }

    /// The messages answering one client message (none for notifications and responses).
    pub fn answer(&self, request: &Value) -> Vec<Value> {
        let (Some(method), Some(id)) = (
            request.get("method").and_then(Value::as_str),
            request.get("id"),
        ) else {
            return Vec::new();
        };
        let params = request.get("params");
        let key = match_key(method, params);
        let Some(candidates) = self.by_key.get(&key) else {
            let message = format!(
                "no recorded response for {method} {}; {}",
                compact(params),
                self.closest(method, params)
            );
            return vec![
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": jsonrpc::METHOD_NOT_FOUND, "message": message}}),
            ];
        };
        let index = {
            let mut served = self
                .served
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let n = served.entry(key).or_insert(0);
            let index = (*n).min(candidates.len() - 1);
            *n += 1;
            index
        };
        let exchange = &candidates[index];
        let token = params
            .and_then(|p| p.get("_meta"))
            .and_then(|m| m.get("progressToken"))
            .cloned();
        let mut out: Vec<Value> = exchange
            .before
            .iter()
            .filter(|m| m.get("id").is_none()) // server requests would wait for answers nobody recorded
            .map(|m| {
                let mut m = m.clone();
                if let (Some(token), Some(p)) =
                    (&token, m.get_mut("params").and_then(Value::as_object_mut))
                    && p.contains_key("progressToken")
                {
                    p.insert("progressToken".into(), token.clone());
                }
                m
            })
            .collect();
        if let Some(mut response) = exchange.response.clone() {
            response["id"] = id.clone();
            out.push(response);
        }
        out
    }

    fn closest(&self, method: &str, params: Option<&Value>) -> String {
        let mut wanted = Vec::new();
        flatten("", params.unwrap_or(&Value::Null), &mut wanted);
        let best = self
            .all
            .iter()
            .map(|e| {
                let mut have = Vec::new();
                flatten("", &params_without_meta(&e.upstream_request), &mut have);
                let common = have.iter().filter(|h| wanted.contains(h)).count();
                ((usize::from(e.method == method), common), e)
            })
            .max_by_key(|(score, _)| *score);
        match best {
            Some((_, e)) => format!(
                "the closest recorded request is {} {}",
                e.method,
                compact(Some(&params_without_meta(&e.upstream_request)))
            ),
            None => "the recording has no requests".to_string(),
        }
    }
}

fn compact(params: Option<&Value>) -> String {
    let mut params = params.cloned().unwrap_or_else(|| Value::Object(Map::new()));
    if let Value::Object(map) = &mut params {
        map.remove("_meta");
    }
    let text = params.to_string();
    if text.len() > 300 {
        format!("{}…", text.chars().take(300).collect::<String>())
    } else {
        text
    }
}

/// An upstream that answers from a recording.
pub fn upstream(replayer: Arc<Replayer>) -> Upstream {
    Upstream::spawn(move |link: Link| async move {
        let Link {
            messages: mut rx,
            events,
            stop: stop_rx,
        } = link;
        tokio::pin!(stop_rx);
        loop {
            tokio::select! {
                message = rx.recv() => {
                    let Some(bytes) = message else { break };
                    let replies = match serde_json::from_slice::<Value>(&bytes) {
                        Ok(Value::Array(batch)) => {
                            let replies: Vec<Value> = batch.iter().flat_map(|m| replayer.answer(m)).collect();
                            if replies.is_empty() { Vec::new() } else { vec![Value::Array(replies)] }
                        }
                        Ok(message) => replayer.answer(&message),
                        Err(_) => vec![serde_json::from_slice::<Value>(&jsonrpc::error_response(None, jsonrpc::PARSE_ERROR, "Parse error", None)).unwrap_or(Value::Null)],
                    };
                    for reply in replies {
                        let frame = Frame::Line(reply.to_string().into_bytes());
                        if events.send(Event::Frame(frame)).await.is_err() {
                            return;
                        }
                    }
                }
                _ = &mut stop_rx => break,
            }
        }
        let _ = events
            .send(Event::Ended {
                reason: "stopped".into(),
                stopped: true,
            })
            .await;
    })
}
