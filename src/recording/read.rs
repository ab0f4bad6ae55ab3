//! Reading a recording back: its lines, and the exchanges (request, what came between,
//! response) they make up.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

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
