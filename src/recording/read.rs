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
    #[error(
        "{path}: not a regular file (it is {kind}); a recording is read only from a regular file"
    )]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path}:{line}: {bound}")]
    Bound {
        path: PathBuf,
        line: usize,
        bound: String,
    },
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

/// A recording line is at most this many bytes (64 MiB, the default `--max-message-bytes`
/// plus room for the line's own fields): a longer one is refused, not read.
pub const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;
/// A recording is at most this many bytes (512 MiB).
pub const MAX_RECORDING_BYTES: u64 = 512 * 1024 * 1024;
/// A recording has at most this many lines.
pub const MAX_RECORDING_LINES: usize = 4_000_000;

impl Recording {
    /// Reads a recording, a regular file within [`MAX_RECORDING_BYTES`],
    /// [`MAX_RECORDING_LINES`] and [`MAX_LINE_BYTES`] a line (line by line: a line over the
    /// bound is refused when the bound is reached). A last line cut mid-way is left out and
    /// reported in `cut_at`.
    pub fn load(path: &Path) -> Result<Recording, ReplayError> {
        use std::io::{BufRead, Read};
        let read_error = |source: std::io::Error| ReplayError::Read {
            path: path.to_path_buf(),
            source,
        };
        let (file, size) = crate::regular::open(path).map_err(|err| match err {
            crate::regular::OpenError::NotRegular(kind) => ReplayError::NotRegular {
                path: path.to_path_buf(),
                kind,
            },
            crate::regular::OpenError::Io(source) => read_error(source),
        })?;
        if size > MAX_RECORDING_BYTES {
            return Err(ReplayError::Bound {
                path: path.to_path_buf(),
                line: 1,
                bound: format!(
                    "the recording is {size} bytes, over the bound of 512 MiB on a recording"
                ),
            });
        }
        let mut reader = std::io::BufReader::new(file.take(MAX_RECORDING_BYTES + 1));
        let mut lines = Lines::new(path);
        let mut buffer = Vec::new();
        let mut total: u64 = 0;
        loop {
            buffer.clear();
            let read = (&mut reader)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut buffer)
                .map_err(read_error)?;
            if read == 0 {
                break;
            }
            total += read as u64;
            let ended = buffer.last() == Some(&b'\n');
            let number = lines.number + 1;
            if !ended && buffer.len() > MAX_LINE_BYTES {
                return Err(lines.bound(
                    number,
                    "a line over 64 MiB, the bound on one recording line".into(),
                ));
            }
            if total > MAX_RECORDING_BYTES {
                return Err(lines.bound(
                    number,
                    "the recording grew over 512 MiB, the bound on a recording".into(),
                ));
            }
            let text = std::str::from_utf8(&buffer).map_err(|err| ReplayError::BadLine {
                path: path.to_path_buf(),
                line: number,
                detail: format!("not UTF-8: {err}"),
            })?;
            if !lines.push(text.strip_suffix('\n').unwrap_or(text), !ended)? {
                break;
            }
        }
        lines.finish()
    }

    /// Reads a recording held in memory (the bounds of [`Recording::load`] a line).
    pub fn parse(text: &str, path: &Path) -> Result<Recording, ReplayError> {
        let mut lines = Lines::new(path);
        let mut rest = text;
        while !rest.is_empty() {
            let (line, after, ended) = match rest.split_once('\n') {
                Some((line, after)) => (line, after, true),
                None => (rest, "", false),
            };
            rest = after;
            if line.len() > MAX_LINE_BYTES {
                return Err(lines.bound(
                    lines.number + 1,
                    "a line over 64 MiB, the bound on one recording line".into(),
                ));
            }
            if !lines.push(line, !ended)? {
                break;
            }
        }
        lines.finish()
    }

    /// The request/response pairs, in order, with the server messages between them. Linear in
    /// the recording: open requests are found by (session, id), by (session, progress token)
    /// and as the oldest of their session through maps, never by a scan.
    pub fn exchanges(&self) -> Vec<Exchange> {
        use std::collections::{HashMap, VecDeque};
        type Key = (Option<String>, String);
        /// A request not answered yet: where it is in `entries`, and the entries of the server
        /// messages that came for it (values are built only for answered requests).
        struct Open {
            entry: usize,
            method: String,
            before: Vec<usize>,
        }
        /// The first index of `queue` still open (taken ones are dropped on the way).
        fn first_open(queue: &mut VecDeque<usize>, open: &[Option<Open>]) -> Option<usize> {
            while let Some(&index) = queue.front() {
                if open[index].is_some() {
                    return Some(index);
                }
                queue.pop_front();
            }
            None
        }
        let message = |index: usize| -> Value {
            self.entries[index]
                .msg
                .as_deref()
                .map_or(Value::Null, value)
        };
        // The exchange of an answered request, its values built now.
        let exchange = |open: Open| -> Exchange {
            let entry = &self.entries[open.entry];
            let request = message(open.entry);
            // What the server saw is what it answered.
            let upstream_request = entry
                .changed
                .as_deref()
                .map_or_else(|| request.clone(), value);
            Exchange {
                method: open.method,
                upstream_request,
                request,
                before: open.before.into_iter().map(message).collect(),
                response: None,
                response_bytes: 0,
                delivered: None,
                delivered_bytes: 0,
            }
        };
        let mut done: Vec<Exchange> = Vec::new();
        // Every request seen, by index; `None` once answered.
        let mut open: Vec<Option<Open>> = Vec::new();
        let mut by_id: HashMap<Key, VecDeque<usize>> = HashMap::new();
        let mut by_token: HashMap<Key, VecDeque<usize>> = HashMap::new();
        let mut by_session: HashMap<Option<String>, VecDeque<usize>> = HashMap::new();
        let take = |open: &mut Vec<Option<Open>>,
                    by_id: &mut HashMap<Key, VecDeque<usize>>,
                    entry: &Entry,
                    msg: &Value| {
            let key = (
                entry.session.clone(),
                msg.get("id").map(id_key).unwrap_or_default(),
            );
            let queue = by_id.get_mut(&key)?;
            let index = first_open(queue, open)?;
            queue.pop_front();
            open[index].take()
        };
        for (position, entry) in self.entries.iter().enumerate() {
            let Some(raw) = &entry.msg else { continue };
            let msg = value(raw);
            match entry.dir.as_str() {
                "c2s" => {
                    if let (Some(method), Some(id)) =
                        (msg.get("method").and_then(Value::as_str), msg.get("id"))
                    {
                        let index = open.len();
                        by_id
                            .entry((entry.session.clone(), id_key(id)))
                            .or_default()
                            .push_back(index);
                        let sent = entry.changed.as_deref().map(value);
                        if let Some(token) = sent
                            .as_ref()
                            .unwrap_or(&msg)
                            .get("params")
                            .and_then(|p| p.get("_meta"))
                            .and_then(|m| m.get("progressToken"))
                        {
                            by_token
                                .entry((entry.session.clone(), token.to_string()))
                                .or_default()
                                .push_back(index);
                        }
                        by_session
                            .entry(entry.session.clone())
                            .or_default()
                            .push_back(index);
                        open.push(Some(Open {
                            entry: position,
                            method: method.to_string(),
                            before: Vec::new(),
                        }));
                    }
                }
                "s2c" => {
                    if msg.get("method").is_none() {
                        if let Some(request) = take(&mut open, &mut by_id, entry, &msg) {
                            let mut exchange = exchange(request);
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
                                let queue =
                                    by_token.get_mut(&(entry.session.clone(), t.to_string()))?;
                                first_open(queue, &open)
                            })
                            .or_else(|| first_open(by_session.get_mut(&entry.session)?, &open));
                        if let Some(request) = owner.and_then(|index| open[index].as_mut()) {
                            request.before.push(position);
                        }
                    }
                }
                "p2c" => {
                    // The proxy answered a request itself (a refused argument, an error).
                    if let Some(request) = take(&mut open, &mut by_id, entry, &msg) {
                        let mut exchange = exchange(request);
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

/// Reads a recording line by line: the header first, then entries.
struct Lines<'a> {
    path: &'a Path,
    /// Lines read so far (blank ones included).
    number: usize,
    header_seen: bool,
    recording: Recording,
}

impl<'a> Lines<'a> {
    fn new(path: &'a Path) -> Lines<'a> {
        Lines {
            path,
            number: 0,
            header_seen: false,
            recording: Recording::default(),
        }
    }

    fn bound(&self, line: usize, bound: String) -> ReplayError {
        ReplayError::Bound {
            path: self.path.to_path_buf(),
            line,
            bound,
        }
    }

    /// One line (without its newline); `unterminated`: the file ended without a newline after
    /// it. `Ok(false)`: a cut last line, reading stops.
    fn push(&mut self, line: &str, unterminated: bool) -> Result<bool, ReplayError> {
        self.number += 1;
        let index = self.number;
        if line.trim().is_empty() {
            return Ok(true);
        }
        if !self.header_seen {
            let header_ok = serde_json::from_str::<Value>(line)
                .ok()
                .is_some_and(|h| h.get("mcp_budget_recording").is_some());
            if !header_ok {
                return Err(ReplayError::NotARecording {
                    path: self.path.to_path_buf(),
                });
            }
            self.header_seen = true;
            return Ok(true);
        }
        if self.recording.entries.len() >= MAX_RECORDING_LINES {
            return Err(self.bound(
                index,
                format!("more than {MAX_RECORDING_LINES} lines, the bound on a recording"),
            ));
        }
        let value: Line = match serde_json::from_str(line) {
            Ok(value) => value,
            Err(_) if unterminated => {
                self.recording.cut_at = Some(index);
                return Ok(false);
            }
            Err(err) => {
                return Err(ReplayError::BadLine {
                    path: self.path.to_path_buf(),
                    line: index,
                    detail: err.to_string(),
                });
            }
        };
        if let Some(missed) = value.missed {
            self.recording.missed += missed;
            return Ok(true);
        }
        let Some(dir) = value.dir else {
            return Err(ReplayError::BadLine {
                path: self.path.to_path_buf(),
                line: index,
                detail: "no \"dir\"".into(),
            });
        };
        self.recording.entries.push(Entry {
            t: value.t,
            dir,
            session: value.session,
            msg: value.msg,
            changed: value.forwarded.or(value.delivered),
        });
        Ok(true)
    }

    fn finish(self) -> Result<Recording, ReplayError> {
        if !self.header_seen {
            return Err(ReplayError::NotARecording {
                path: self.path.to_path_buf(),
            });
        }
        Ok(self.recording)
    }
}

fn id_key(id: &Value) -> String {
    crate::wire::message::Id::from_json_text(&id.to_string())
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
