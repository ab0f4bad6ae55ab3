//! The listener's sessions: one relay and one upstream each, the client streams their server
//! messages go to, and the bookkeeping around them (ids, limits, idle expiry, shutdown).
//!
//! A server message goes to the POST stream waiting for it (a response), to the stream of the
//! request whose progress it reports, else to the GET stream, else to the newest POST stream.
//! With no stream open it waits in a backlog bounded in bytes; when that is full, the session
//! stops reading its server until the client opens a stream (backpressure, never a drop).
//!
//! Streams can be resumed (Streamable HTTP resumability): every SSE event carries an id
//! `"{stream}-{seq}"`, and the session keeps the events it sent in a log bounded in bytes. A GET
//! with `Last-Event-ID` gets the events of that stream after it again, then the rest of the
//! stream. A POST stream cut before its answers (the connection dropped, or the proxy ended it
//! for polling) is parked, not cancelled, when the session's protocol can resume
//! (2025-11-25 and later): what is meant for it waits in its queue until the client resumes,
//! or, after the resume window, is cancelled upstream as for a client that went away.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::queue;
use crate::relay::Relay;
use crate::upstream::Stopper;
use crate::wire::framing::Frame;
use crate::wire::jsonrpc;
use crate::wire::message::{self, Id, Kind};

use super::replay::{Replay, Replayed};

/// What the backlog of a session with no open stream may hold.
const BACKLOG_BYTES: usize = queue::DEFAULT_QUEUE_BYTES;

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Who opened a session: the token they presented (its index among the accepted tokens), or,
/// without tokens, their address. Sessions are bound to it and counted per client.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Client {
    /// A digest of the token (the same on every replica that accepts it, wherever it stands
    /// in their lists).
    Token([u8; 16]),
    Address(std::net::IpAddr),
}

impl Client {
    /// A client known by the bearer token it presented.
    pub fn by_token(token: &str) -> Client {
        use sha2::Digest;
        let full =
            sha2::Sha256::digest([b"mcp-budget principal:".as_slice(), token.as_bytes()].concat());
        let mut digest = [0u8; 16];
        digest.copy_from_slice(&full[..16]);
        Client::Token(digest)
    }

    /// The principal, as the session's task tokens are bound to it (the same on every replica
    /// that accepts the same tokens).
    pub fn principal(&self) -> String {
        match self {
            Client::Token(digest) => format!("token:{}", crate::wire::canonical::hex(digest)),
            Client::Address(address) => format!("address:{address}"),
        }
    }
}

/// A queue to one client stream (a POST's SSE stream or body, or the GET stream).
type StreamTx = queue::Sender<Outbound>;
pub(super) type StreamRx = queue::Receiver<Outbound>;

/// A server message on its way to a client stream, with its envelope (as the relay read it),
/// so that the stream need not read it again.
pub(super) struct Outbound {
    pub bytes: Vec<u8>,
    pub kind: Option<Kind>,
    /// Meant for its stream's own requests (their answer, progress, related messages), rather
    /// than put there for want of another stream.
    pub directed: bool,
}

impl queue::Weigh for Outbound {
    fn weight(&self) -> usize {
        self.bytes.len()
    }
}

impl Outbound {
    /// Calls `each` with the id key of every response it carries (a single one without a copy).
    pub fn response_keys(&self, mut each: impl FnMut(&str)) {
        let batch = self.bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
        match &self.kind {
            Some(Kind::Response { id: Some(id), .. }) if !batch => each(id.key()),
            _ if batch => message::response_keys(&self.bytes)
                .iter()
                .for_each(|key| each(key)),
            _ => {}
        }
    }
}

/// The id of one SSE event: its stream and its number there (0: the priming event).
pub(super) fn event_id(stream: u64, seq: u64) -> String {
    format!("{stream}-{seq}")
}

fn parse_event_id(text: &str) -> Option<(u64, u64)> {
    let (stream, seq) = text.trim().split_once('-')?;
    Some((stream.parse().ok()?, seq.parse().ok()?))
}

/// The protocol version from which clients resume cut POST streams (they get a priming event).
const RESUMABLE_SINCE: &str = "2025-11-25";

/// A POST's stream as it stands: what it still awaits and what is queued for it. It moves
/// from the handler that writes it to the session (parked) and back (resumed).
pub(super) struct PostState {
    pub number: u64,
    /// The number of the last event sent on it.
    pub seq: u64,
    /// The id keys of its requests not yet answered on it.
    pub awaiting: HashSet<String>,
    /// Its requests the relay put in flight.
    pub accepted: Vec<Id>,
    /// The proxy's own answers, sent before anything from the queue.
    pub own: VecDeque<Outbound>,
    pub rx: StreamRx,
}

/// A cut POST stream waiting for the client to resume it.
pub(super) struct Parked {
    state: PostState,
    tx: StreamTx,
    /// When it was parked, in the session's order (the longest parked is given up first).
    order: u64,
    /// Cancels it when the resume window has passed.
    expiry: tokio::task::JoinHandle<()>,
}

/// What follows the replayed events of a resumed stream.
pub(super) enum Resume {
    /// A POST stream that was cut before its answers: it goes on here.
    Post(PostState),
    /// A GET stream: this request becomes the session's GET stream (its number and queue).
    Get(u64, StreamRx),
    /// A POST stream that had finished: nothing.
    Done,
}

/// Why a `Last-Event-ID` cannot be resumed.
#[derive(Debug)]
pub(super) enum ResumeError {
    /// Not an id this session sent.
    Unknown,
    /// Events after it are no longer held.
    Lost,
    /// That stream is still being written to another connection.
    Busy,
    /// It was cut and not resumed within the window: its requests were cancelled.
    Expired,
}

/// A new stream's queue.
fn stream_channel() -> (StreamTx, StreamRx) {
    queue::channel(queue::DEFAULT_QUEUE_BYTES)
}

pub(super) struct Routes {
    /// Requests waiting for their response: id key → (the POST's stream number, its queue).
    pub(super) waiting: HashMap<String, (u64, StreamTx)>,
    /// Progress tokens (JSON text) → the POST stream of the request that named them.
    pub(super) progress: HashMap<String, u64>,
    /// Open POST SSE streams, by number (the newest has the highest).
    pub(super) streams: BTreeMap<u64, StreamTx>,
    pub(super) get: Option<StreamTx>,
    pub(super) backlog: VecDeque<Outbound>,
    pub(super) backlog_bytes: usize,
    pub(super) next_stream: u64,
    /// The numbers of the latest GET streams (a resumed one becomes the GET stream again).
    pub(super) gets: VecDeque<u64>,
    /// Cut POST streams waiting to be resumed, by number.
    pub(super) parked: HashMap<u64, Parked>,
    /// How many streams were ever parked (orders them).
    pub(super) parked_count: u64,
    /// Parked streams whose window passed (their requests cancelled), newest last.
    pub(super) expired: VecDeque<u64>,
    /// For each live POST SSE stream: tells its writer to stop (a resume takes the stream over).
    pub(super) stops: HashMap<u64, Arc<Notify>>,
    pub(super) replay: Replay,
}

/// At most this many cut streams wait to be resumed in one session; past it, the oldest is
/// given up at once (its requests cancelled upstream).
const MAX_PARKED: usize = 32;
/// At most this many expired stream numbers are remembered (for a clear refusal).
const MAX_EXPIRED: usize = 1024;

/// At most this many GET stream numbers are remembered.
const MAX_GETS: usize = 64;

impl Routes {
    /// Opens a new GET stream, which replaces the current one.
    fn open_get(&mut self) -> (u64, StreamRx) {
        let (tx, rx) = stream_channel();
        self.next_stream += 1;
        let number = self.next_stream;
        self.gets.push_back(number);
        if self.gets.len() > MAX_GETS {
            self.gets.pop_front();
        }
        self.drain_backlog_into(&tx);
        // The stream it replaces takes nothing more: a message waiting for room there (its
        // client may have stopped reading) comes back to be routed again, to this one.
        if let Some(old) = self.get.replace(tx) {
            old.close();
        }
        (number, rx)
    }

    /// Keeps an event for a resume.
    fn log(&mut self, stream: u64, seq: u64, event: bytes::Bytes) {
        let parked = &self.parked;
        self.replay
            .push(stream, seq, event, |s| parked.contains_key(&s));
    }

    /// Moves what waited for a stream onto `tx`, as far as it takes it now. (The backlog counts
    /// bytes as the queues do, so a new stream takes all of it.)
    fn drain_backlog_into(&mut self, tx: &StreamTx) {
        while let Some(waiting) = self.backlog.pop_front() {
            let weight = waiting.bytes.len() + queue::OVERHEAD;
            match tx.try_send(waiting) {
                Ok(()) => self.backlog_bytes -= weight,
                Err(queue::TrySendError::Full(back) | queue::TrySendError::Closed(back)) => {
                    self.backlog.push_front(back);
                    break;
                }
            }
        }
    }
}

/// One client session.
pub(super) struct Session {
    pub id: String,
    pub client: Client,
    pub relay: Arc<Relay>,
    pub to_server: queue::Sender<crate::upstream::Outgoing>,
    pub(super) routes: Mutex<Routes>,
    /// Signalled when the backlog has room or a stream opened.
    pub(super) room: Notify,
    /// Signalled when the session ends.
    pub(super) closed: Notify,
    pub(super) stopper: Mutex<Stopper>,
    pub(super) last_active: Mutex<Instant>,
    /// The negotiated protocol version, once the initialize response passed.
    pub(super) protocol: Mutex<Option<String>>,
    pub(super) initialize_key: Mutex<Option<String>>,
    pub(super) ended: AtomicBool,
    /// How long a cut POST stream waits to be resumed.
    pub(super) resume_window: Duration,
    /// Serves one principal's modern (2026-07-28) requests: no client knows its id, and none
    /// can name it in `Mcp-Session-Id`.
    pub stateless: AtomicBool,
    /// The ids modern requests go upstream under (each POST's own, whatever the client chose).
    pub(super) fresh: AtomicU64,
}

/// A modern request's id held for its POST until the request is accepted (then its stream
/// guard answers for it); dropped before that, it lets the id go.
pub(super) struct Claim {
    session: Arc<Session>,
    number: u64,
    post: Option<PostStream>,
    settled: bool,
}

impl Claim {
    /// The claimed POST's stream (taken once).
    pub fn take_post(&mut self) -> Option<PostStream> {
        self.post.take()
    }

    /// The request was accepted: its stream now answers for the id.
    pub fn settle(mut self) {
        self.settled = true;
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        // (Found by its stream: rare, and no copy of the id kept for it.)
        let number = self.number;
        lock(&self.session.routes)
            .waiting
            .retain(|_, (n, _)| *n != number);
    }
}

/// A POST registered with its session: its stream number and queue.
pub(super) struct PostStream {
    pub number: u64,
    pub tx: StreamTx,
    pub rx: StreamRx,
}

impl Session {
    pub fn touch(&self) {
        *lock(&self.last_active) = Instant::now();
    }

    pub fn is_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// Completes once the session has ended.
    pub async fn until_ended(&self) {
        loop {
            let notified = self.closed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_ended() {
                return;
            }
            notified.await;
        }
    }

    /// An id no other request of this session has: a modern request goes upstream under it, so
    /// that two clients' (or one client's concurrent) requests never share one.
    pub fn fresh_id(&self) -> Id {
        let n = self.fresh.fetch_add(1, Ordering::Relaxed) + 1;
        Id::numbered("mcp-budget-s", n)
    }

    pub fn is_stateless(&self) -> bool {
        self.stateless.load(Ordering::SeqCst)
    }

    pub fn protocol(&self) -> Option<String> {
        lock(&self.protocol).clone()
    }

    pub fn set_initialize_key(&self, key: &str) {
        *lock(&self.initialize_key) = Some(key.to_string());
    }

    /// A new POST stream (not yet receiving anything).
    pub fn open_post(&self) -> PostStream {
        let (tx, rx) = stream_channel();
        let mut routes = lock(&self.routes);
        routes.next_stream += 1;
        PostStream {
            number: routes.next_stream,
            tx,
            rx,
        }
    }

    /// A new POST stream that holds `id` for a modern request's own: its answer will come to
    /// this stream under the client's id, which then goes upstream as it is. `None` when
    /// another request of this session has that id in flight (or could have: one written
    /// like the proxy's own ids): that request goes upstream under a fresh id instead.
    pub fn claim(self: &Arc<Self>, id: &Id) -> Option<Claim> {
        if id.raw().starts_with("\"mcp-budget-") {
            return None;
        }
        let post = {
            let mut routes = lock(&self.routes);
            if routes.waiting.contains_key(id.key()) {
                return None;
            }
            routes.next_stream += 1;
            let (tx, rx) = stream_channel();
            let number = routes.next_stream;
            routes
                .waiting
                .insert(id.key().to_string(), (number, tx.clone()));
            PostStream { number, tx, rx }
        };
        let claim = Claim {
            session: self.clone(),
            number: post.number,
            post: Some(post),
            settled: false,
        };
        // One left by a request the client gave up (cancelled upstream, not yet answered), or
        // one used before (the relay would send it under an id of its own, which the answer's
        // notifications, a listen's say, would name): the proxy's id, and the client's put back.
        match self.relay.takes_as_written(id) {
            true => Some(claim),
            false => None,
        }
    }

    /// The POST's accepted requests wait on its stream; with SSE, server messages related to
    /// them (their progress; others while it is the newest stream) go there too.
    pub fn register_post(
        &self,
        post: &PostStream,
        accepted: &[Id],
        tokens: Vec<String>,
        sse: bool,
        claimed: bool,
    ) {
        let mut routes = lock(&self.routes);
        // A claimed POST's one request waits there already.
        for id in accepted.iter().filter(|_| !claimed) {
            routes
                .waiting
                .insert(id.key().to_string(), (post.number, post.tx.clone()));
        }
        if sse && !accepted.is_empty() {
            for token in tokens {
                routes.progress.insert(token, post.number);
            }
            routes.streams.insert(post.number, post.tx.clone());
            routes.stops.insert(post.number, Arc::new(Notify::new()));
            routes.drain_backlog_into(&post.tx);
            drop(routes);
            self.room.notify_waiters();
        }
    }

    /// What tells the writer of live POST stream `number` to stop (a resume takes it over).
    pub fn stop_signal(&self, number: u64) -> Arc<Notify> {
        lock(&self.routes)
            .stops
            .entry(number)
            .or_insert_with(|| Arc::new(Notify::new()))
            .clone()
    }

    /// Forgets a POST stream; returns the ids of `accepted` that were still waiting on it.
    pub fn close_post(&self, number: u64, accepted: &[Id]) -> Vec<Id> {
        let mut routes = lock(&self.routes);
        routes.streams.remove(&number);
        routes.stops.remove(&number);
        routes.progress.retain(|_, n| *n != number);
        let mut left = Vec::new();
        for id in accepted {
            if routes
                .waiting
                .get(id.key())
                .is_some_and(|(n, _)| *n == number)
            {
                routes.waiting.remove(id.key());
                left.push(id.clone());
            }
        }
        left
    }

    /// Opens the GET stream (replacing an older one); its number and queue.
    pub fn open_get(&self) -> (u64, StreamRx) {
        let opened = lock(&self.routes).open_get();
        self.room.notify_waiters();
        opened
    }

    /// Logs an event of GET stream `number` if it is still the session's GET stream; `false`
    /// when a newer one replaced it (the event then goes to the newer one).
    pub fn log_get(&self, number: u64, seq: u64, event: &bytes::Bytes) -> bool {
        let mut routes = lock(&self.routes);
        // The newest GET stream is the session's GET stream.
        if routes.gets.back() != Some(&number) {
            return false;
        }
        routes.log(number, seq, event.clone());
        true
    }

    /// Whether the client can resume a cut POST stream (it negotiated 2025-11-25 or later),
    /// so that it gets a priming event and a cut stream is parked rather than cancelled.
    pub fn resumable(&self) -> bool {
        lock(&self.protocol)
            .as_deref()
            .is_some_and(|p| p >= RESUMABLE_SINCE)
    }

    /// Moves what waits in the backlog to a stream that has room now (a writer calls this as
    /// it takes messages: the backlog may have filled while every stream was full).
    pub fn pull_backlog(&self) {
        let mut routes = lock(&self.routes);
        if routes.backlog.is_empty() {
            return;
        }
        if let Some(tx) = fallback(&routes) {
            routes.drain_backlog_into(&tx);
        }
    }

    /// Keeps an event sent on `stream`, for a client that resumes.
    pub fn log(&self, stream: u64, seq: u64, event: bytes::Bytes) {
        lock(&self.routes).log(stream, seq, event);
    }

    /// Parks a cut POST stream until the client resumes it or the resume window passes.
    pub fn park(self: &Arc<Self>, state: PostState) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.abandon_post(state);
            return;
        };
        let number = state.number;
        let weak = Arc::downgrade(self);
        let window = self.resume_window;
        let mut routes = lock(&self.routes);
        let Some(tx) = routes.streams.remove(&number) else {
            // Not a live stream (the session ended meanwhile).
            drop(routes);
            self.abandon_post(state);
            return;
        };
        routes.stops.remove(&number);
        tracing::debug!(session = %self.id, stream = number, "stream cut before its answers; parked for the client to resume");
        let expiry = runtime.spawn(async move {
            tokio::time::sleep(window).await;
            if let Some(session) = weak.upgrade() {
                session.expire_parked(number);
            }
        });
        routes.parked_count += 1;
        let order = routes.parked_count;
        routes.parked.insert(
            number,
            Parked {
                state,
                tx,
                order,
                expiry,
            },
        );
        // Too many waiting: the one parked longest is given up now.
        let oldest = (routes.parked.len() > MAX_PARKED)
            .then(|| {
                routes
                    .parked
                    .iter()
                    .min_by_key(|(_, p)| p.order)
                    .map(|(n, _)| *n)
            })
            .flatten();
        drop(routes);
        if let Some(oldest) = oldest {
            tracing::warn!(session = %self.id, stream = oldest, max = MAX_PARKED, "too many cut streams wait to be resumed; giving up the oldest");
            self.expire_parked(oldest);
        }
    }

    fn expire_parked(&self, number: u64) {
        let parked = {
            let mut routes = lock(&self.routes);
            let parked = routes.parked.remove(&number);
            if parked.is_some() {
                routes.expired.push_back(number);
                if routes.expired.len() > MAX_EXPIRED {
                    routes.expired.pop_front();
                }
            }
            parked
        };
        if let Some(parked) = parked {
            parked.expiry.abort();
            tracing::info!(session = %self.id, stream = number, "a cut stream was not resumed in time; its requests are cancelled");
            self.abandon_post(parked.state);
        }
    }

    /// Resumes the stream of `last_event_id`: the events after it, and what follows them.
    pub fn resume(&self, last_event_id: &str) -> Result<(Replayed, Resume), ResumeError> {
        let resumable = self.resumable();
        let mut routes = lock(&self.routes);
        let (stream, seq) = parse_event_id(last_event_id)
            .filter(|&(stream, _)| stream >= 1 && stream <= routes.next_stream)
            .ok_or(ResumeError::Unknown)?;
        if routes.streams.contains_key(&stream) {
            // Its writer is told to stop (it parks the stream); the caller may try again. A
            // stream that cannot be parked (an older protocol) is not taken over.
            if resumable && let Some(stop) = routes.stops.get(&stream) {
                stop.notify_one();
            }
            return Err(ResumeError::Busy);
        }
        if routes.expired.contains(&stream) {
            return Err(ResumeError::Expired);
        }
        let parked = routes.parked.contains_key(&stream);
        if routes.replay.lost_after(stream, seq, parked) {
            return Err(ResumeError::Lost);
        }
        let events = routes.replay.after(stream, seq);
        let then = if let Some(parked) = routes.parked.remove(&stream) {
            parked.expiry.abort();
            routes.drain_backlog_into(&parked.tx);
            routes.streams.insert(stream, parked.tx);
            routes.stops.insert(stream, Arc::new(Notify::new()));
            Resume::Post(parked.state)
        } else if routes.gets.contains(&stream) {
            // The replay and the switch to the new GET stream are one step: the old stream's
            // writer logs nothing after the events read here.
            let (number, rx) = routes.open_get();
            Resume::Get(number, rx)
        } else {
            Resume::Done
        };
        drop(routes);
        self.room.notify_waiters();
        Ok((events, then))
    }

    /// Gives up a POST stream: forgets it, passes on what was queued for it but not sent (to
    /// another stream of the session), and cancels upstream what it left unanswered.
    pub fn abandon_post(&self, mut state: PostState) {
        let accepted: Vec<Id> = state
            .accepted
            .iter()
            .filter(|id| state.awaiting.contains(id.key()))
            .cloned()
            .collect();
        let unanswered = self.close_post(state.number, &accepted);
        state.rx.close();
        // What was queued for this stream's own requests (their answers, progress, related
        // notifications) has nowhere else to go: an answer goes only on its request's stream. A
        // request of the server's (sampling, say) still needs an answer from the client, and
        // what was here only for want of another stream goes to another: those go on.
        let mut dropped = 0;
        while let Some(message) = state.own.pop_front().or_else(|| state.rx.try_recv()) {
            if !message.directed || matches!(message.kind, Some(Kind::Request { .. })) {
                self.route_now(message.bytes, message.kind);
            } else {
                dropped += 1;
            }
        }
        if dropped > 0 {
            tracing::info!(session = %self.id, stream = state.number, dropped, "messages for a stream the client gave up were not delivered");
        }
        for id in unanswered {
            if self.is_ended() {
                break;
            }
            tracing::info!(session = %self.id, id = id.raw(), "client went away before the answer; cancelling upstream");
            let cancel = jsonrpc::cancelled(&id, "the client disconnected");
            let routed = self.relay.from_client(Frame::Line(cancel));
            // The cancellation, or for a listen the proxy served, its unsubscriptions.
            for message in routed.to_server.into_iter().chain(routed.also_to_server) {
                if self.to_server.try_send(message).is_err() {
                    tracing::warn!(session = %self.id, id = id.raw(), "the upstream queue is full: the cancellation could not be sent");
                }
            }
        }
    }

    /// Sends a server message to the client stream it belongs to, waiting while that stream
    /// (or, with none open, the backlog) is full: a slow client slows its own session only.
    pub async fn route(&self, bytes: Vec<u8>, kind: Option<Kind>, related: Option<Id>) {
        self.note_initialize_response(&bytes, kind.as_ref());
        let mut message = Outbound {
            bytes,
            kind,
            directed: true,
        };
        // A message for one stream (an answer, its request's progress, a related request)
        // goes there, never behind the backlog of others.
        let directed = directed(
            &mut lock(&self.routes),
            &message.bytes,
            message.kind.as_ref(),
            related.as_ref(),
        );
        if let Some(tx) = directed {
            match tx.send(message).await {
                Ok(()) => return,
                Err(queue::Closed(back)) => message = back,
            }
        }
        message.directed = false;
        if self.is_stateless() {
            // No GET stream, and no stream of another request takes what is not its own. A
            // notification that names no request (a stdio server's log line for the request
            // that asked for logs, say) is that request's when it is the only one open.
            let only = match &message.kind {
                Some(Kind::Notification { .. }) => {
                    let routes = lock(&self.routes);
                    let mut numbers = routes.waiting.values().map(|(n, _)| *n);
                    let first = numbers.next();
                    first
                        .filter(|first| numbers.all(|n| n == *first))
                        .and_then(|n| routes.waiting.values().find(|(m, _)| *m == n))
                        .map(|(_, tx)| tx.clone())
                }
                _ => None,
            };
            let request = match &message.kind {
                Some(Kind::Request { method, .. }) => Some(method.clone()),
                _ => None,
            };
            if let Some(tx) = only {
                message.directed = true;
                if tx.send(message).await.is_ok() {
                    return;
                }
            }
            match request {
                // A 2026-07-28 client takes no request from the server (that is the era bridge's
                // to translate): say so, not only in debug.
                Some(method) => tracing::warn!(
                    session = %self.id,
                    %method,
                    "a server request in a stateless session has no client stream to go to; it was not delivered"
                ),
                None => tracing::debug!(
                    session = %self.id,
                    "a server message for no open request of this principal was not delivered"
                ),
            }
            return;
        }
        if let Some(Kind::Response { id, .. }) = &message.kind {
            // Its request's stream is gone (given up, and the request cancelled): an answer
            // goes on no other stream.
            tracing::info!(session = %self.id, id = id.as_ref().map(Id::raw), "an answer for a stream the client gave up was not delivered");
            return;
        }
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let target = {
                let mut routes = lock(&self.routes);
                let target = fallback(&routes);
                // What waited for a stream goes first, in order.
                if let Some(tx) = &target
                    && !routes.backlog.is_empty()
                {
                    routes.drain_backlog_into(tx);
                }
                match target {
                    Some(tx) if routes.backlog.is_empty() => Some(tx),
                    _ => {
                        let weight = message.bytes.len() + queue::OVERHEAD;
                        if routes.backlog.is_empty()
                            || routes.backlog_bytes + weight <= BACKLOG_BYTES
                            || self.is_ended()
                        {
                            routes.backlog_bytes += weight;
                            routes.backlog.push_back(message);
                            return;
                        }
                        None
                    }
                }
            };
            match target {
                Some(tx) => match tx.send(message).await {
                    Ok(()) => return,
                    // That stream closed meanwhile: route again.
                    Err(queue::Closed(back)) => message = back,
                },
                None => {
                    tracing::debug!(session = %self.id, "the client's streams are full or closed: waiting for the client");
                    // A new stream wakes this at once; a stream that is read frees room without
                    // a signal, so look again now and then.
                    let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
                }
            }
        }
    }

    /// Like `route`, without waiting (for the proxy's own errors as a session ends, and for
    /// what a closed stream did not send).
    pub fn route_now(&self, bytes: Vec<u8>, kind: Option<Kind>) {
        let mut routes = lock(&self.routes);
        let mut message = Outbound {
            bytes,
            kind,
            directed: true,
        };
        let target = match directed(&mut routes, &message.bytes, message.kind.as_ref(), None) {
            Some(tx) => Some(tx),
            None if matches!(message.kind, Some(Kind::Response { .. })) => {
                tracing::info!(session = %self.id, "an answer for a stream the client gave up was not delivered");
                return;
            }
            None if self.is_stateless() => return,
            None => {
                message.directed = false;
                fallback(&routes)
            }
        };
        let message = match target {
            Some(tx) => match tx.try_send(message) {
                Ok(()) => return,
                Err(queue::TrySendError::Full(back) | queue::TrySendError::Closed(back)) => back,
            },
            None => message,
        };
        routes.backlog_bytes += message.bytes.len() + queue::OVERHEAD;
        routes.backlog.push_back(message);
    }

    fn note_initialize_response(&self, bytes: &[u8], kind: Option<&Kind>) {
        if let Some(Kind::Response { id: Some(id), .. }) = kind
            && lock(&self.initialize_key).as_deref() == Some(id.key())
            && let Some(version) = message::protocol_version(bytes)
        {
            *lock(&self.protocol) = Some(version);
        }
    }

    /// Ends the session: answers what is in flight, stops the upstream, closes the streams.
    pub fn end(&self, reason: &str, grace: Duration) {
        if self.ended.swap(true, Ordering::SeqCst) {
            return;
        }
        for error in self.relay.close(reason) {
            let kind = message::parse(&error)
                .ok()
                .and_then(message::Parsed::single);
            self.route_now(error, kind);
        }
        lock(&self.stopper).stop(grace);
        let mut routes = lock(&self.routes);
        routes.waiting.clear();
        routes.streams.clear();
        routes.get = None;
        for (_, parked) in routes.parked.drain() {
            parked.expiry.abort();
        }
        routes.stops.clear();
        drop(routes);
        self.room.notify_waiters();
        self.closed.notify_waiters();
    }
}

/// The one stream a server message is meant for, if any: an answer's request stream, the
/// stream of the request whose progress it reports, or of the request it relates to.
fn directed(
    routes: &mut Routes,
    bytes: &[u8],
    kind: Option<&Kind>,
    related: Option<&Id>,
) -> Option<StreamTx> {
    // The SSE stream (live or parked) of POST number `n`.
    let stream = |routes: &Routes, n: u64| {
        routes
            .streams
            .get(&n)
            .or_else(|| routes.parked.get(&n).map(|p| &p.tx))
            .cloned()
    };
    let target = match kind {
        Some(Kind::Response { id: Some(id), .. }) => {
            let target = routes.waiting.remove(id.key()).map(|(_, tx)| tx);
            // A batch answers several requests: none of them waits any more.
            if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
                for key in message::response_keys(bytes) {
                    routes.waiting.remove(&key);
                }
            }
            target
        }
        Some(Kind::Request { .. } | Kind::Notification { .. })
            if let Some(n) = related.and_then(|r| routes.waiting.get(r.key()).map(|w| w.0))
                && let Some(tx) = stream(routes, n) =>
        {
            Some(tx)
        }
        // A subscription's notification goes to the stream of the `subscriptions/listen` it
        // names (2026-07-28: `_meta["io.modelcontextprotocol/subscriptionId"]`, the request's id).
        Some(Kind::Notification { .. })
            if let Some(n) = message::subscription_id(bytes)
                .and_then(|id| routes.waiting.get(id.key()).map(|w| w.0))
                && let Some(tx) = stream(routes, n) =>
        {
            Some(tx)
        }
        Some(Kind::Notification { method }) if method == "notifications/progress" => {
            message::progress_token(bytes)
                .and_then(|token| routes.progress.get(&token).copied())
                .and_then(|n| stream(routes, n))
        }
        _ => None,
    };
    target.filter(|tx| !tx.is_closed())
}

/// Where a message for no stream in particular goes: the GET stream, else the newest POST
/// stream.
fn fallback(routes: &Routes) -> Option<StreamTx> {
    routes.get.clone().filter(|tx| !tx.is_closed()).or_else(|| {
        routes
            .streams
            .values()
            .rev()
            .find(|tx| !tx.is_closed())
            .cloned()
    })
}

/// The HTTP client side of a session: each message goes to the stream it belongs to.
impl crate::session::ClientSide for Arc<Session> {
    async fn deliver(&self, bytes: Vec<u8>, kind: Option<Kind>) -> bool {
        self.route(bytes, kind, None).await;
        !self.is_ended()
    }

    async fn deliver_related(&self, bytes: Vec<u8>, kind: Option<Kind>, request: Id) -> bool {
        self.route(bytes, kind, Some(request)).await;
        !self.is_ended()
    }
}
