//! Recording sessions: every message in both directions, one JSON object a line.
//!
//! A line is `{"t":<µs since start>,"dir":"c2s"|"s2c"|"p2c","msg":<the message as it passed>}`,
//! plus `"forwarded"` (what went upstream) or `"delivered"` (what the client received) when the
//! proxy changed it, and `"session"` when several clients share the recording. `msg` is the
//! peer's exact bytes spliced into the line — recording costs no extra parse. A line that was
//! not JSON is kept as `"text"`. The first line is a header; `{"t":…,"missed":N}` says the writer
//! fell behind and N messages are not in the file. Headers of HTTP requests are never written.
//!
//! The writer is a task behind a bounded queue: the relay never waits for the disk. It writes to
//! `FILE.partial` and renames it to `FILE` when the recording ends, so a crash leaves a readable
//! (if cut) `.partial` file and never a half-written `FILE`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;

use crate::queue;

/// Which way a message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// From the client (towards the server).
    ClientToServer,
    /// From the server (towards the client).
    ServerToClient,
    /// The proxy's own answer to the client (an error, a refused argument).
    ProxyToClient,
}

impl Dir {
    pub fn as_str(self) -> &'static str {
        match self {
            Dir::ClientToServer => "c2s",
            Dir::ServerToClient => "s2c",
            Dir::ProxyToClient => "p2c",
        }
    }
}

/// The recording format version written in the header line.
pub const FORMAT: u32 = 1;
/// What the queue to the writer may hold; past it, messages are counted as missed.
const QUEUE_BYTES: usize = 32 * 1024 * 1024;

/// What the writer and every recorder share (not the queue: the writer must see it close).
struct Shared {
    missed: AtomicU64,
    start: Instant,
}

/// A handle that records one session's messages (cheap to clone).
#[derive(Clone)]
pub struct Recorder {
    queue: queue::Sender<Vec<u8>>,
    shared: Arc<Shared>,
    session: Option<Arc<str>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("session", &self.session)
            .finish()
    }
}

/// The file could not be opened for recording.
#[derive(Debug, thiserror::Error)]
#[error("cannot record to {path}: {source}")]
pub struct RecordError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}

impl Recorder {
    /// Starts recording to `path`; `transport` names the session's transports in the header.
    /// The returned task finishes the file (rename) once every `Recorder` clone is dropped.
    pub async fn start(
        path: &Path,
        transport: &str,
    ) -> Result<(Recorder, JoinHandle<()>), RecordError> {
        Recorder::start_with_queue(path, transport, QUEUE_BYTES).await
    }

    async fn start_with_queue(
        path: &Path,
        transport: &str,
        queue_bytes: usize,
    ) -> Result<(Recorder, JoinHandle<()>), RecordError> {
        let partial = partial_path(path);
        let file = tokio::fs::File::create(&partial)
            .await
            .map_err(|source| RecordError {
                path: partial.clone(),
                source,
            })?;
        let (queue, rx) = queue::channel(queue_bytes);
        let shared = Arc::new(Shared {
            missed: AtomicU64::new(0),
            start: Instant::now(),
        });
        let header = serde_json::json!({
            "mcp_budget_recording": FORMAT,
            "version": env!("CARGO_PKG_VERSION"),
            "transport": transport,
        });
        let task = tokio::spawn(write(
            file,
            rx,
            header.to_string(),
            partial,
            path.to_path_buf(),
            shared.clone(),
        ));
        Ok((
            Recorder {
                queue,
                shared,
                session: None,
            },
            task,
        ))
    }

    /// The same recording, for another session.
    pub fn for_session(&self, session: &str) -> Recorder {
        Recorder {
            queue: self.queue.clone(),
            shared: self.shared.clone(),
            session: Some(session.into()),
        }
    }

    fn head(&self, line: &mut Vec<u8>, dir: Dir) {
        let t = self.shared.start.elapsed().as_micros();
        line.extend_from_slice(format!("{{\"t\":{t},\"dir\":\"{}\"", dir.as_str()).as_bytes());
        if let Some(session) = &self.session {
            line.extend_from_slice(b",\"session\":");
            line.extend_from_slice(serde_json::Value::from(&**session).to_string().as_bytes());
        }
    }

    fn send(&self, line: Vec<u8>) {
        if self.queue.try_send(line).is_err() {
            self.shared.missed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records a JSON message, and what the proxy made of it when it changed it
    /// (`("forwarded" | "delivered", bytes)`).
    pub fn message(&self, dir: Dir, msg: &[u8], changed: Option<(&str, &[u8])>) {
        let extra = changed.map_or(0, |(_, b)| b.len() + 16);
        let mut line = Vec::with_capacity(msg.len() + extra + 64);
        self.head(&mut line, dir);
        line.extend_from_slice(b",\"msg\":");
        line.extend_from_slice(msg.trim_ascii());
        if let Some((name, bytes)) = changed {
            line.extend_from_slice(format!(",\"{name}\":").as_bytes());
            line.extend_from_slice(bytes.trim_ascii());
        }
        line.push(b'}');
        self.send(line);
    }

    /// Records a line that was not JSON (as text).
    pub fn text(&self, dir: Dir, raw: &[u8]) {
        let mut line = Vec::new();
        self.head(&mut line, dir);
        let text = serde_json::Value::from(String::from_utf8_lossy(raw)).to_string();
        line.extend_from_slice(format!(",\"text\":{text}}}").as_bytes());
        self.send(line);
    }

    /// Records a message that was over the size limit (it was never buffered).
    pub fn too_large(&self, dir: Dir, bytes: usize) {
        let mut line = Vec::new();
        self.head(&mut line, dir);
        line.extend_from_slice(format!(",\"too_large\":{bytes}}}").as_bytes());
        self.send(line);
    }
}

async fn write(
    file: tokio::fs::File,
    mut rx: queue::Receiver<Vec<u8>>,
    header: String,
    partial: PathBuf,
    path: PathBuf,
    shared: Arc<Shared>,
) {
    let mut out = tokio::io::BufWriter::with_capacity(256 * 1024, file);
    let mut failed = out.write_all(format!("{header}\n").as_bytes()).await.err();
    let mut reported = 0u64;
    while let Some(line) = rx.recv().await {
        if failed.is_some() {
            continue;
        }
        let missed = shared.missed.load(Ordering::Relaxed);
        let mut result = Ok(());
        if missed > reported {
            let t = shared.start.elapsed().as_micros();
            let note = format!("{{\"t\":{t},\"missed\":{}}}\n", missed - reported);
            tracing::warn!(
                missed = missed - reported,
                "the recorder fell behind; messages are missing from the recording"
            );
            reported = missed;
            result = out.write_all(note.as_bytes()).await;
        }
        if result.is_ok() {
            result = out.write_all(&line).await;
        }
        if result.is_ok() {
            result = out.write_all(b"\n").await;
        }
        if result.is_ok() && rx.is_empty() {
            result = out.flush().await;
        }
        if let Err(err) = result {
            tracing::error!(%err, path = %partial.display(), "writing the recording failed; recording stops");
            failed = Some(err);
        }
    }
    if failed.is_none() && out.flush().await.is_ok() {
        match tokio::fs::rename(&partial, &path).await {
            Ok(()) => tracing::info!(path = %path.display(), "recording written"),
            Err(err) => {
                tracing::error!(%err, "cannot rename {} to {}", partial.display(), path.display())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_queue_drops_nothing_silently_and_the_file_appears_whole() {
        let dir = std::env::temp_dir().join(format!("mcp-budget-rec-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.jsonl");
        let (recorder, writer) = Recorder::start_with_queue(&path, "test", 220)
            .await
            .unwrap();
        // On this single-threaded runtime the writer cannot run until we yield: the queue
        // fills after two messages (of about 100 bytes each, counted with their place in the queue) and the rest are counted as missed, never waited for.
        for k in 0..10 {
            recorder.message(
                Dir::ClientToServer,
                format!("{{\"id\":{k}}}").as_bytes(),
                None,
            );
        }
        assert!(
            !path.exists(),
            "the file appears only when the recording is complete"
        );
        recorder.message(
            Dir::ServerToClient,
            b"{\"id\":0,\"result\":{}}",
            Some(("delivered", b"{}")),
        );
        tokio::task::yield_now().await;
        drop(recorder);
        writer.await.unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with(r#"{"mcp_budget_recording":1,"#));
        let kept = lines.iter().filter(|l| l.contains(r#""dir":"#)).count();
        let missed: u64 = lines
            .iter()
            .filter_map(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .ok()?
                    .get("missed")?
                    .as_u64()
            })
            .sum();
        assert_eq!((kept, missed), (2, 9), "{text}");
        assert!(
            lines
                .iter()
                .any(|l| l.ends_with(r#","dir":"c2s","msg":{"id":0}}"#))
        );
        assert!(
            lines
                .iter()
                .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok())
        );
    }
}
