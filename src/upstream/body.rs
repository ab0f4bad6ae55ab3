//! Reading an HTTP upstream's response bodies under a size limit and a time limit.
//!
//! Why: a body is the server's to size, and an HTTP client reads whatever comes. An error page of a
//! gigabyte, one SSE event that never ends, or a body that trickles at a byte a second would
//! otherwise hold the proxy's memory or a request forever. Here a JSON body stops at
//! `--max-message-bytes`, an SSE stream is cut when one event grows past it, and a message
//! that has begun must finish within the read timeout; the connection is then dropped, and
//! the requests it carried get a clear error.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use memchr::memchr2;
use sse_stream::SseStream;
use tokio::time::Instant;

use super::conn::Body;

/// Bytes an SSE event may hold beyond its data's limit, for its field names and id.
const FIELD_ALLOWANCE: usize = 4096;

/// How much of an error body is read (for the message that quotes it).
pub const ERROR_EXCERPT_BYTES: usize = 4096;

/// Why a body was not read to its end.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error(
        "the upstream server's message is over the proxy's message size limit of {0} bytes \
         (raise it with --max-message-bytes, or narrow the request)"
    )]
    TooLarge(usize),
    #[error(
        "the upstream server took more than {0} s to send one message (--upstream-read-timeout-secs)"
    )]
    Slow(u64),
    #[error("reading the upstream server's response failed: {0}")]
    Read(#[from] hyper::Error),
}

impl BodyError {
    /// The `BodyError` behind an SSE stream error, if that is what it is.
    pub fn in_sse(err: &sse_stream::Error) -> Option<&BodyError> {
        match err {
            sse_stream::Error::Body(inner) => inner.downcast_ref::<BodyError>(),
            _ => None,
        }
    }
}

/// At most `max` bytes of the body (the rest is never read: the connection is dropped).
pub async fn read_prefix(mut stream: Body, max: usize) -> Bytes {
    let mut out = Vec::new();
    let reading = async {
        while out.len() < max {
            match stream.next().await {
                Some(Ok(chunk)) => {
                    let room = max - out.len();
                    out.extend_from_slice(&chunk[..chunk.len().min(room)]);
                }
                _ => break,
            }
        }
    };
    // An excerpt is not worth waiting long for.
    let _ = tokio::time::timeout(Duration::from_secs(5), reading).await;
    Bytes::from(out)
}

/// The whole body, refused past `limit` bytes or when it takes longer than `timeout`.
pub async fn read_limited(
    stream: Body,
    limit: usize,
    timeout: Duration,
) -> Result<Vec<u8>, BodyError> {
    read_limited_placed(stream, limit, timeout, false)
        .await
        .map(|(body, _)| body)
}

/// Like [`read_limited`]; with `placed`, a body that grows large waits for its place among
/// the large messages held at once ([`crate::wire::framing::large_place`]), returned with it. The
/// time spent waiting for that place is the proxy's, not the server's: it does not count
/// against `timeout`.
pub async fn read_limited_placed(
    mut stream: Body,
    limit: usize,
    timeout: Duration,
    placed: bool,
) -> Result<(Vec<u8>, Option<crate::wire::framing::LargeHold>), BodyError> {
    let mut body = Vec::new();
    let mut hold = None;
    let mut asked = false;
    let mut deadline = Instant::now() + timeout;
    // Armed only when a chunk is not already here: a body that has arrived costs no timer.
    let mut clock: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        let next = match futures_util::FutureExt::now_or_never(stream.next()) {
            Some(next) => next,
            None => {
                let clock =
                    clock.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                tokio::select! {
                    next = stream.next() => next,
                    () = clock.as_mut() => return Err(BodyError::Slow(timeout.as_secs())),
                }
            }
        };
        let Some(chunk) = next else { break };
        let chunk = chunk?;
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge(limit));
        }
        body.extend_from_slice(&chunk);
        if placed && !asked && body.len() >= crate::wire::framing::LARGE_LINE {
            asked = true;
            let waiting = Instant::now();
            hold = crate::wire::framing::large_place(body.len()).await;
            deadline += waiting.elapsed();
            if let Some(clock) = clock.as_mut() {
                clock.as_mut().reset(deadline);
            }
        }
    }
    Ok((body, hold))
}

/// The SSE events of a response, with each event bounded in size and, once begun, in time.
/// Between events there is no time limit: a server may work long before it answers (the
/// session's request timeout governs that).
pub fn events(
    body: Body,
    limit: usize,
    timeout: Duration,
) -> impl Stream<Item = Result<sse_stream::Sse, sse_stream::Error>> + Send + Unpin {
    events_placed(body, limit, timeout, None)
}

/// The place of a large event (see [`events_placed`]), for the reader of the events to take
/// with the event it belongs to.
pub type EventPlace = std::sync::Arc<std::sync::Mutex<Option<crate::wire::framing::LargeHold>>>;

/// Like [`events`]; with `place`, an event that grows large waits, mid-read, for its place
/// among the large messages held at once, and leaves it in `place` for the event's reader.
pub fn events_placed(
    body: Body,
    limit: usize,
    timeout: Duration,
    place: Option<EventPlace>,
) -> impl Stream<Item = Result<sse_stream::Sse, sse_stream::Error>> + Send + Unpin {
    let chunks = body.boxed();
    // The bound counts field names and ids too (`data: `, `id: …`): they are allowed on top.
    let state = (chunks, EventBounds::new(limit), None::<Instant>, false);
    let bounded = futures_util::stream::unfold(
        state,
        move |(mut chunks, mut bounds, mut started, failed)| {
            let place = place.clone();
            async move {
                if failed {
                    return None;
                }
                if let Some(place) = &place
                    && bounds.event >= crate::wire::framing::LARGE_LINE
                    && !bounds.placed
                {
                    bounds.placed = true;
                    let waiting = Instant::now();
                    let hold = crate::wire::framing::large_place(bounds.event).await;
                    // The wait is the proxy's own, not the server's: the event's clock stops.
                    started = started.map(|at| at + waiting.elapsed());
                    *place
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = hold;
                }
                let next = match started {
                    Some(at) => match tokio::time::timeout_at(at + timeout, chunks.next()).await {
                        Ok(next) => next,
                        Err(_) => {
                            let err = BodyError::Slow(timeout.as_secs());
                            return Some((Err(err), (chunks, bounds, started, true)));
                        }
                    },
                    None => chunks.next().await,
                };
                match next? {
                    Ok(chunk) => match bounds.feed(&chunk) {
                        Ok(ended) => {
                            // The clock runs from the first byte of the event in progress.
                            let started = match (bounds.in_event(), ended, started) {
                                (false, _, _) => None,
                                (true, false, Some(at)) => Some(at),
                                (true, _, _) => Some(Instant::now()),
                            };
                            Some((Ok(chunk), (chunks, bounds, started, false)))
                        }
                        Err(err) => Some((Err(err), (chunks, bounds, started, true))),
                    },
                    Err(err) => Some((Err(BodyError::Read(err)), (chunks, bounds, started, true))),
                }
            }
        },
    );
    SseStream::from_bytes_stream(bounded.boxed())
}

/// Tracks the size of the SSE event being received (the bytes since the last blank line).
struct EventBounds {
    limit: usize,
    event: usize,
    line: usize,
    after_cr: bool,
    /// The event in progress asked for its place among the large messages.
    placed: bool,
}

impl EventBounds {
    fn new(limit: usize) -> Self {
        EventBounds {
            limit,
            event: 0,
            line: 0,
            after_cr: false,
            placed: false,
        }
    }

    fn in_event(&self) -> bool {
        self.event > 0
    }

    /// Counts a chunk; `Ok(true)` when an event ended inside it.
    fn feed(&mut self, mut chunk: &[u8]) -> Result<bool, BodyError> {
        let mut ended = false;
        while !chunk.is_empty() {
            let Some(at) = memchr2(b'\n', b'\r', chunk) else {
                self.add(chunk.len())?;
                self.after_cr = false;
                return Ok(ended);
            };
            self.add(at)?;
            let newline = chunk[at];
            // `\r\n` is one line end.
            let same_line_end = newline == b'\n' && self.after_cr && at == 0;
            if !same_line_end {
                if self.line == 0 {
                    ended |= self.event > 0;
                    self.event = 0; // a blank line ends the event
                    self.placed = false;
                }
                self.line = 0;
            }
            self.after_cr = newline == b'\r';
            chunk = &chunk[at + 1..];
        }
        Ok(ended)
    }

    fn add(&mut self, bytes: usize) -> Result<(), BodyError> {
        if bytes > 0 {
            self.after_cr = false;
        }
        self.line += bytes;
        self.event += bytes;
        if self.event > self.limit.saturating_add(FIELD_ALLOWANCE) {
            return Err(BodyError::TooLarge(self.limit));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_lines_end_events_in_every_line_ending() {
        for text in [
            "data: 12345\n\ndata: 12345\n\n",
            "data: 12345\r\n\r\ndata: 12345\r\n\r\n",
            "data: 12345\r\rdata: 12345\r\r",
        ] {
            let mut bounds = EventBounds::new(12);
            for byte in text.as_bytes() {
                bounds.feed(std::slice::from_ref(byte)).unwrap();
            }
            assert!(!bounds.in_event(), "{text:?}");
        }
    }

    #[test]
    fn an_event_over_the_limit_is_refused_whatever_its_lines() {
        let mut bounds = EventBounds::new(20);
        let line = format!("data: {}\n", "x".repeat(FIELD_ALLOWANCE / 2 + 20));
        assert!(!bounds.feed(line.as_bytes()).unwrap());
        assert!(matches!(
            bounds.feed(line.as_bytes()),
            Err(BodyError::TooLarge(20))
        ));
        let mut bounds = EventBounds::new(20);
        for _ in 0..100 {
            assert!(bounds.feed(b"data: 0123456789\n\n").unwrap());
        }
    }
}
