//! The streams of an HTTP response: a POST's, until its requests are answered, and a GET's,
//! with the SSE events each writes and the live source after the replayed ones.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use crate::wire::message::{self, Id, Kind};

use super::session::{PostState, Session, StreamRx, event_id};

/// One POST's stream: its queue and the proxy's own answers, until its requests are answered.
/// Dropped — answered, or the client went away — it gives the stream up (what was queued for
/// it goes to another stream, what it left unanswered is cancelled upstream); an SSE stream
/// cut before its answers is parked instead when the client can resume it.
pub(super) struct StreamGuard {
    pub(super) session: Arc<Session>,
    pub(super) sse: bool,
    /// A modern request's id upstream, and the client's: its answer is given the client's.
    pub(super) restore: Option<(Id, Id)>,
    /// `None` once given up or parked.
    pub(super) state: Option<PostState>,
    /// Something other than a result was taken from the stream (an error, say): what the
    /// HTTP status of a modern answer depends on.
    pub(super) not_results: bool,
}

impl StreamGuard {
    /// The next message for this POST; `None` once every request of it is answered.
    pub(super) async fn next(&mut self) -> Option<Vec<u8>> {
        let state = self.state.as_mut()?;
        if state.awaiting.is_empty() {
            return None;
        }
        let message = match state.own.pop_front() {
            Some(message) => message,
            None => {
                self.session.pull_backlog();
                state.rx.recv().await?
            }
        };
        message.response_keys(|key| {
            state.awaiting.remove(key);
        });
        self.not_results |= !matches!(
            message.kind,
            Some(Kind::Response {
                result: Some(_),
                ..
            })
        );
        if let Some((fresh, client)) = &self.restore {
            match &message.kind {
                Some(Kind::Response { id: Some(id), .. }) if id.key() == fresh.key() => {
                    return Some(match restore_id(message.bytes, fresh, client) {
                        Ok(restored) => restored,
                        Err(bytes) => message::with_id(&bytes, client.raw()).unwrap_or(bytes),
                    });
                }
                // A subscription's notifications name it by the client's id.
                Some(Kind::Notification { .. })
                    if message::subscription_id(&message.bytes)
                        .is_some_and(|id| id.key() == fresh.key()) =>
                {
                    return Some(
                        message::with_subscription_id(&message.bytes, client.raw())
                            .unwrap_or(message.bytes),
                    );
                }
                _ => {}
            }
        }
        Some(message.bytes)
    }

    /// The event that sends `bytes` on this stream, numbered and kept for a resume.
    pub(super) fn event(&mut self, bytes: &[u8]) -> Bytes {
        let Some(state) = self.state.as_mut() else {
            return sse_event(None, None, bytes);
        };
        state.seq += 1;
        let event = sse_event(Some(&event_id(state.number, state.seq)), None, bytes);
        self.session.log(state.number, state.seq, event.clone());
        event
    }

    pub(super) fn number(&self) -> u64 {
        self.state.as_ref().map_or(0, |s| s.number)
    }

    /// Whether every request of this POST is answered.
    pub(super) fn answered(&self) -> bool {
        self.state.as_ref().is_none_or(|s| s.awaiting.is_empty())
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let Some(state) = self.state.take() else {
            return;
        };
        if self.sse
            && !state.awaiting.is_empty()
            && !self.session.is_ended()
            && self.session.resumable()
        {
            self.session.park(state);
        } else {
            self.session.abandon_post(state);
        }
    }
}

/// Where an SSE response's live events come from, after its replayed ones.
pub(super) enum Source {
    /// A POST's stream, and what tells its writer to stop (a resume elsewhere takes it over).
    Post(StreamGuard, Arc<tokio::sync::Notify>),
    Get(GetStream),
    Done,
}

/// A GET stream's writer. Dropped — the client went away, or a newer GET stream replaced it —
/// it passes on what was queued for it but not sent (to the newer stream, or to wait).
pub(super) struct GetStream {
    pub(super) session: Arc<Session>,
    pub(super) number: u64,
    pub(super) seq: u64,
    pub(super) rx: Option<StreamRx>,
}

impl GetStream {
    pub(super) async fn next(&mut self) -> Option<Bytes> {
        self.session.pull_backlog();
        let message = self.rx.as_mut()?.recv().await?;
        let seq = self.seq + 1;
        let event = sse_event(Some(&event_id(self.number, seq)), None, &message.bytes);
        if !self.session.log_get(self.number, seq, &event) {
            // Replaced: this message, and the rest, go to the stream that replaced it.
            self.session.route_now(message.bytes, message.kind);
            return None;
        }
        self.seq = seq;
        Some(event)
    }
}

impl Drop for GetStream {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            while let Some(message) = rx.try_recv() {
                self.session.route_now(message.bytes, message.kind);
            }
        }
    }
}

/// One SSE response: the events to send first (a priming event, or those asked for again),
/// then the live ones.
pub(super) struct Writer {
    /// Events to send before the live ones, as they are written: a priming event, or those
    /// sent before and asked for again (`Last-Event-ID`).
    pub(super) replay: VecDeque<Bytes>,
    /// When a POST stream is ended for the client to resume it (SSE polling).
    pub(super) deadline: Option<tokio::time::Instant>,
    pub(super) source: Source,
    /// Sends a comment when the stream has been idle for [`KEEP_ALIVE`].
    pub(super) keep_alive: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// When the last event went out.
    pub(super) last_sent: tokio::time::Instant,
}

/// The first event of stream `number` for a client that can resume: an id to resume from, how
/// long to wait before it does, and empty data.
pub(super) fn priming(number: u64, retry: std::time::Duration) -> Bytes {
    sse_event(Some(&event_id(number, 0)), Some(retry), b"")
}

/// An idle event stream sends a comment this often, so that nothing between drops it.
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(15);

/// One SSE event: its id, its `retry`, and its data (`data:` lines, one per line of `bytes`;
/// empty data is one empty `data:` line, so the event is still dispatched).
fn sse_event(id: Option<&str>, retry: Option<std::time::Duration>, bytes: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(bytes.len() + 48);
    if let Some(id) = id {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(id.as_bytes());
        out.push(b'\n');
    }
    if let Some(retry) = retry {
        out.extend_from_slice(format!("retry: {}\n", retry.as_millis()).as_bytes());
    }
    // A line ends at CRLF, LF or CR (a message read from an HTTP upstream may be pretty-printed).
    let mut rest = bytes;
    loop {
        out.extend_from_slice(b"data: ");
        match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            Some(end) => {
                out.extend_from_slice(&rest[..end]);
                out.push(b'\n');
                let skip = if rest[end] == b'\r' && rest.get(end + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                rest = &rest[end + skip..];
            }
            None => {
                out.extend_from_slice(rest);
                out.push(b'\n');
                break;
            }
        }
    }
    out.push(b'\n');
    Bytes::from(out)
}

impl Writer {
    /// The next event; `None` once the stream ends.
    pub(super) async fn next(&mut self) -> Option<Bytes> {
        if let Some(event) = self.replay.pop_front() {
            return Some(event);
        }
        // One timer for the stream's keep-alive. An event only notes when it was sent; the
        // timer, when it fires, sends a comment if the stream has been idle that long, else
        // waits for the rest (no timer work per event).
        let keep_alive = self
            .keep_alive
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(KEEP_ALIVE)));
        loop {
            // What `live` waits on is cancel-safe: a keep-alive loses nothing.
            tokio::select! {
                event = live(&mut self.source, self.deadline) => {
                    self.last_sent = tokio::time::Instant::now();
                    return event;
                }
                () = keep_alive.as_mut() => {
                    let now = tokio::time::Instant::now();
                    let due = self.last_sent + KEEP_ALIVE;
                    if now >= due {
                        self.last_sent = now;
                        keep_alive.as_mut().reset(now + KEEP_ALIVE);
                        return Some(Bytes::from_static(b":\n\n"));
                    }
                    keep_alive.as_mut().reset(due);
                }
            }
        }
    }
}

impl Writer {
    /// The response: an event stream that ends with the writer.
    pub(super) fn into_body(self) -> Response {
        let events = futures_util::stream::unfold(self, |mut writer| async move {
            let event = writer.next().await?;
            Some((Ok::<_, Infallible>(event), writer))
        });
        (
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            Body::from_stream(events),
        )
            .into_response()
    }
}

/// The next live event of `source`.
async fn live(source: &mut Source, deadline: Option<tokio::time::Instant>) -> Option<Bytes> {
    match source {
        Source::Post(guard, stop) => {
            let until_deadline = async {
                match deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            let bytes = tokio::select! {
                bytes = guard.next() => bytes?,
                () = until_deadline => {
                    tracing::debug!(session = %guard.session.id, stream = guard.number(), "ending a long POST stream for the client to resume");
                    return None;
                }
                () = stop.notified() => {
                    tracing::debug!(session = %guard.session.id, stream = guard.number(), "the stream is resumed on another connection");
                    return None;
                }
            };
            Some(guard.event(&bytes))
        }
        Source::Get(get) => get.next().await,
        Source::Done => None,
    }
}

/// `answer` under the client's id, where its envelope (the members before any nested value)
/// says `"id":` and the proxy's `fresh` one: one search, no parse. The answer back when not
/// found so (the caller then reads the message for its id).
pub(super) fn restore_id(mut answer: Vec<u8>, fresh: &Id, client: &Id) -> Result<Vec<u8>, Vec<u8>> {
    match id_at(&answer, fresh) {
        Some(at) => {
            // In place: the bytes after the id move (no second buffer; a longer id may grow it).
            answer.splice(at..at + fresh.raw().len(), client.raw().bytes());
            Ok(answer)
        }
        None => Err(answer),
    }
}

/// Where `fresh` is in `answer` as its envelope's id.
fn id_at(answer: &[u8], fresh: &Id) -> Option<usize> {
    // The id comes first, or near it (`{"jsonrpc":"2.0","id":…`): looked for there by hand
    // (a searcher costs more to build than this short look), then anywhere.
    let needle = fresh.raw().as_bytes();
    if needle.is_empty() {
        return None;
    }
    let head = &answer[..answer.len().min(64 + needle.len())];
    let at = match memchr::memchr_iter(needle[0], head).find(|&at| head[at..].starts_with(needle)) {
        Some(at) => at,
        None => memchr::memmem::find(answer, needle)?,
    };
    let before = answer[..at]
        .trim_ascii_end()
        .strip_suffix(b":")?
        .trim_ascii_end();
    let envelope = before.strip_suffix(b"\"id\"")?;
    // Nothing nested comes first: only the object's own opening brace.
    if envelope.iter().filter(|b| matches!(b, b'{' | b'[')).count() != 1 {
        return None;
    }
    Some(at)
}
