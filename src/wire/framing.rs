//! Newline-delimited framing: bytes from a peer → one message per line, under a size limit.
//!
//! A line longer than the limit is not buffered: it is streamed through a small scanner that
//! keeps only the top-level `id` and `method`, so the relay can answer that one request with a
//! clear error (a client waiting on an id must never hang) instead of running out of memory.

use memchr::memchr;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

use crate::wire::message::{EnvelopeScanner, Id, Parsed};

/// The default message size limit (64 MiB): every message up to this size passes.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// One frame read from a peer.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A complete line, without its trailing newline.
    Line(Vec<u8>),
    /// A complete line whose envelope was already read where it came in (an HTTP body, an
    /// upstream HTTP message): the relay does not read it again.
    Read { line: Vec<u8>, parsed: Parsed },
    /// A line over the limit, already discarded; what could be read of its envelope.
    TooLarge {
        bytes: usize,
        id: Option<Id>,
        method: Option<String>,
    },
}

/// A reader lets other tasks run after this many bytes of one line (~0.2 ms of work).
const YIELD_BYTES: usize = 512 * 1024;

/// A server line this long or longer is large: only so many are read and budgeted at once,
/// process-wide (`--max-large-results`), so that many sessions' large results together stay
/// bounded in memory. A smaller message never waits for one.
pub const LARGE_LINE: usize = 4 * 1024 * 1024;
/// How long a large line waits for its place before it is read all the same.
const LARGE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);
/// The default of `--max-large-results`.
pub const DEFAULT_LARGE_LINES: usize = 1;

static LARGE_LINES: std::sync::OnceLock<std::sync::Arc<tokio::sync::Semaphore>> =
    std::sync::OnceLock::new();

/// How many large lines may be held at once (once, at start; the default otherwise).
pub fn limit_large_lines(n: usize) {
    let _ = LARGE_LINES.set(std::sync::Arc::new(tokio::sync::Semaphore::new(n.max(1))));
}

fn large_lines() -> std::sync::Arc<tokio::sync::Semaphore> {
    LARGE_LINES
        .get_or_init(|| std::sync::Arc::new(tokio::sync::Semaphore::new(DEFAULT_LARGE_LINES)))
        .clone()
}

/// A large line's place among those held at once: given up once the line is budgeted.
pub type LargeHold = tokio::sync::OwnedSemaphorePermit;

/// Waits for a large message's place (at most [`LARGE_WAIT`]: `None` then, with a warning,
/// and the message is read without one).
pub async fn large_place(bytes: usize) -> Option<LargeHold> {
    let places = large_lines();
    if places.available_permits() == 0 {
        tracing::debug!(
            bytes,
            "a large server message waits for the ones being budgeted (--max-large-results)"
        );
    }
    match tokio::time::timeout(LARGE_WAIT, places.acquire_owned()).await {
        Ok(hold) => hold.ok(),
        Err(_) => {
            tracing::warn!(
                bytes,
                waited_secs = LARGE_WAIT.as_secs(),
                "a large server message is read without its place: the ones held have not been budgeted for a while (a client that does not read?)"
            );
            None
        }
    }
}

/// Reads frames from an async byte stream.
pub struct FrameReader<R> {
    inner: BufReader<R>,
    max_bytes: usize,
    /// Whether a large line waits for a place among those held at once (a server's lines).
    bounded: bool,
    /// The place the last line took, for the caller to hold while it budgets the line.
    held: Option<LargeHold>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R, max_bytes: usize) -> Self {
        FrameReader {
            inner: BufReader::with_capacity(64 * 1024, inner),
            max_bytes,
            bounded: false,
            held: None,
        }
    }

    /// A reader of a server's lines: a large one waits, mid-line (the server then waits on its
    /// pipe), for a place among the large lines held at once.
    pub fn holding_large_lines(mut self) -> Self {
        self.bounded = true;
        self
    }

    /// The place the last line took among the large lines, if it was one.
    pub fn take_hold(&mut self) -> Option<LargeHold> {
        self.held.take()
    }

    /// The next non-blank line, or `None` at end of stream. A final line without a newline
    /// still counts as a line.
    pub async fn next_frame(&mut self) -> std::io::Result<Option<Frame>> {
        loop {
            match self.read_line().await? {
                None => return Ok(None),
                Some(Frame::Line(line)) if line.iter().all(u8::is_ascii_whitespace) => continue,
                Some(frame) => return Ok(Some(frame)),
            }
        }
    }

    async fn read_line(&mut self) -> std::io::Result<Option<Frame>> {
        let mut line = Vec::new();
        let mut oversized: Option<(usize, EnvelopeScanner)> = None;
        let mut saw_bytes = false;
        // A large line that waited for its place in vain is read without one.
        let mut unplaced = false;
        // Bytes read since this task last let others run: a long line arrives in many reads
        // that are all ready at once, and must not hold its thread for all of them.
        let mut since_yield = 0usize;
        loop {
            if since_yield >= YIELD_BYTES {
                since_yield = 0;
                tokio::task::yield_now().await;
            }
            let chunk = self.inner.fill_buf().await?;
            if chunk.is_empty() {
                if !saw_bytes {
                    return Ok(None);
                }
                break;
            }
            saw_bytes = true;
            let (part, consumed, done) = match memchr(b'\n', chunk) {
                Some(i) => (&chunk[..i], i + 1, true),
                None => (chunk, chunk.len(), false),
            };
            match &mut oversized {
                Some((bytes, scanner)) => {
                    *bytes += part.len();
                    scanner.feed(part);
                }
                None if line.len() + part.len() > self.max_bytes => {
                    let mut scanner = EnvelopeScanner::default();
                    scanner.feed(&line);
                    scanner.feed(part);
                    oversized = Some((line.len() + part.len(), scanner));
                    line = Vec::new();
                }
                None => line.extend_from_slice(part),
            }
            self.inner.consume(consumed);
            if self.bounded && self.held.is_none() && !unplaced && line.len() >= LARGE_LINE {
                // Briefly: a place kept by a session whose client does not read must not stop
                // every other session's large results for good.
                self.held = large_place(line.len()).await;
                unplaced = self.held.is_none();
            }
            if done {
                break;
            }
        }
        Ok(Some(match oversized {
            Some((bytes, scanner)) => {
                let (id, method) = scanner.finish();
                Frame::TooLarge { bytes, id, method }
            }
            None => Frame::Line(line),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn frames(input: &[u8], max: usize) -> Vec<Frame> {
        let mut reader = FrameReader::new(input, max);
        let mut out = Vec::new();
        while let Some(frame) = reader.next_frame().await.unwrap() {
            out.push(frame);
        }
        out
    }

    #[tokio::test]
    async fn splits_lines_skips_blanks_and_keeps_a_final_unterminated_line() {
        let got = frames(b"{\"a\":1}\n\n  \r\n{\"b\":2}\r\n{\"c\":3}", 1024).await;
        assert_eq!(
            got,
            vec![
                Frame::Line(b"{\"a\":1}".to_vec()),
                Frame::Line(b"{\"b\":2}\r".to_vec()),
                Frame::Line(b"{\"c\":3}".to_vec()),
            ]
        );
    }

    #[tokio::test]
    async fn oversized_line_is_discarded_with_its_envelope() {
        let big = "x".repeat(5000);
        let input = format!(
            "{{\"jsonrpc\":\"2.0\",\"params\":{{\"s\":\"{big}\",\"id\":99}},\"id\":\"req-1\",\"method\":\"tools/call\"}}\n{{\"ok\":1}}\n"
        );
        let got = frames(input.as_bytes(), 100).await;
        assert_eq!(got.len(), 2);
        match &got[0] {
            Frame::TooLarge { bytes, id, method } => {
                assert_eq!(*bytes, input.find('\n').unwrap());
                assert_eq!(id.as_ref().map(Id::raw), Some("\"req-1\""));
                assert_eq!(method.as_deref(), Some("tools/call"));
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert_eq!(got[1], Frame::Line(b"{\"ok\":1}".to_vec()));
    }
}
