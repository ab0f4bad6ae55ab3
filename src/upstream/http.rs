//! The upstream as a Streamable HTTP endpoint: each message is POSTed, answers come back as
//! JSON or as an SSE stream, and server-initiated messages on the GET stream.
//!
//! The session id and negotiated protocol version are kept and sent on every request; the
//! client's `initialize` is kept too, so that when the server forgets the session (404) the
//! proxy can open a new one and retry the request once — the client is told, and nothing is
//! lost. Every failure that leaves a request unanswered (unreachable server, an HTTP error, a
//! broken event stream) becomes a JSON-RPC error for that request, never a hang.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use hyper::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, StatusCode};
use std::collections::HashMap;

use tokio::sync::{Mutex, Notify, oneshot};
use url::Url;

use super::body::{self, BodyError};
use super::conn::{self, ClientResponse, ConnError};
use super::{Event, Link, Outgoing, Upstream};
use crate::queue;
use crate::wire::framing::Frame;
use crate::wire::jsonrpc::{self, UPSTREAM_ERROR};
use crate::wire::message::{self, EnvelopeScanner, Id, Kind};

pub use super::http_spec::{DEFAULT_READ_TIMEOUT, HttpError, HttpSpec, parse_header};

use crate::era::headers::{
    METHOD as MCP_METHOD, NAME as MCP_NAME, SESSION as SESSION_NAME, VERSION as VERSION_NAME,
};

#[derive(Default)]
struct SessionState {
    id: Option<String>,
    protocol: Option<String>,
    /// The client's `initialize` request, replayed when the session expires.
    initialize: Option<Vec<u8>>,
    get_stream: bool,
    /// The resources the session subscribed to, made again in a renewed session.
    subscribed: super::Subscribed,
}

struct Shared {
    client: conn::Client,
    /// The upstream's sign-in, when it requires one (`None`: no token is ever sent).
    #[cfg(feature = "oauth")]
    sign_in: Option<Arc<super::oauth::SignIn>>,
    url: Url,
    headers: HeaderMap,
    state: std::sync::Mutex<SessionState>,
    /// Serializes re-initialization after a 404.
    reinit: Mutex<()>,
    events: queue::Sender<Event>,
    max_message_bytes: usize,
    read_timeout: Duration,
    /// The requests whose POST stream is read or resumed now, by id key, each with the wake-up
    /// of its reader: removed (and the reader woken) when the request is over.
    streaming: std::sync::Mutex<HashMap<String, Arc<Notify>>>,
}

/// Takes a reader's requests out of [`Shared::streaming`] when it ends.
struct Streaming<'a> {
    shared: &'a Shared,
    keys: Vec<String>,
    over: Arc<Notify>,
}

impl Drop for Streaming<'_> {
    fn drop(&mut self) {
        let mut streaming = self.shared.streaming();
        for key in &self.keys {
            if streaming
                .get(key)
                .is_some_and(|over| Arc::ptr_eq(over, &self.over))
            {
                streaming.remove(key);
            }
        }
    }
}

impl Shared {
    fn streaming(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        self.streaming
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers `ids` as read by one stream reader, woken through `over`.
    fn stream_for(&self, ids: &[Id], over: &Arc<Notify>) -> Streaming<'_> {
        let keys: Vec<String> = ids.iter().map(|id| id.key().to_string()).collect();
        let mut streaming = self.streaming();
        for key in &keys {
            streaming.insert(key.clone(), over.clone());
        }
        Streaming {
            shared: self,
            keys,
            over: over.clone(),
        }
    }

    /// The request `key` is over (answered, cancelled, timed out): its stream is no longer
    /// read nor resumed for it.
    fn request_over(&self, key: &str) {
        if let Some(over) = self.streaming().remove(key) {
            over.notify_one();
        }
    }

    /// Whether the request `key` is still being waited for.
    fn still_streaming(&self, key: &str) -> bool {
        self.streaming().contains_key(key)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SessionState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn session(&self) -> Option<String> {
        self.state().id.clone()
    }

    async fn emit(&self, bytes: Vec<u8>) {
        self.emit_read(bytes, None).await;
    }

    /// Passes a message on, with its envelope when it was read already.
    async fn emit_read(&self, bytes: Vec<u8>, parsed: Option<message::Parsed>) {
        self.emit_related(bytes, parsed, None, None).await;
    }

    /// Passes a message on; `related`: the client request whose stream it came on; `hold`: its
    /// place among the large messages, given up once it is budgeted.
    async fn emit_related(
        &self,
        bytes: Vec<u8>,
        parsed: Option<message::Parsed>,
        related: Option<Id>,
        hold: Option<crate::wire::framing::LargeHold>,
    ) {
        let frame = if bytes.len() > self.max_message_bytes {
            let mut scanner = EnvelopeScanner::default();
            scanner.feed(&bytes);
            let (id, method) = scanner.finish();
            Frame::TooLarge {
                bytes: bytes.len(),
                id,
                method,
            }
        } else {
            match parsed {
                Some(parsed) => Frame::Read {
                    line: bytes,
                    parsed,
                },
                None => Frame::Line(bytes),
            }
        };
        let event = match (related, hold) {
            (Some(request), _) => Event::Related { frame, request },
            (None, Some(hold)) => Event::Large(frame, hold),
            (None, None) => Event::Frame(frame),
        };
        let _ = self.events.send(event).await;
    }

    /// Answers `ids` with the error of a server that could not be reached.
    async fn unreachable(&self, ids: &[Id], err: &ConnError) {
        let why = match err {
            ConnError::SignIn(why) => why.clone(),
            err => format!("could not reach the upstream server at {}: {err}", self.url),
        };
        tracing::warn!(%why);
        self.fail(ids, &why).await;
    }

    /// Answers `ids` with an error naming `why`.
    async fn fail(&self, ids: &[Id], why: &str) {
        for id in ids {
            self.emit(jsonrpc::error_response(Some(id), UPSTREAM_ERROR, why, None))
                .await;
        }
    }

    /// Sends one request to the upstream: with its token and signed in on demand when the
    /// upstream requires it ([`super::oauth`]).
    /// `headers` makes the request's headers: once, and again for a retry after a sign-in.
    async fn send(
        &self,
        method: Method,
        headers: impl Fn() -> HeaderMap + Sync,
        body: bytes::Bytes,
    ) -> Result<ClientResponse, ConnError> {
        // Boxed: the sign-in's future is large, and most upstreams never need it.
        #[cfg(feature = "oauth")]
        if let Some(sign_in) = &self.sign_in {
            return Box::pin(sign_in.send(&self.client, method, &headers, body)).await;
        }
        self.client.send(method, headers(), body).await
    }

    /// The headers of every request: the static ones, the session's id and version.
    fn headers(&self, session: Option<&str>) -> HeaderMap {
        let mut headers = self.request_headers(4);
        if let Some(value) = session.and_then(|s| HeaderValue::try_from(s).ok()) {
            headers.insert(SESSION_NAME, value);
        }
        if let Some(value) = self
            .state()
            .protocol
            .as_deref()
            .and_then(|v| HeaderValue::try_from(v).ok())
        {
            headers.insert(VERSION_NAME, value);
        }
        headers
    }

    /// The configured headers, with room for `more` and for the two hyper adds (`host`,
    /// `content-length`): a map that grows while a request is written costs a rehash.
    fn request_headers(&self, more: usize) -> HeaderMap {
        let mut headers = HeaderMap::with_capacity(self.headers.len() + more + 2);
        headers.extend(self.headers.iter().map(|(n, v)| (n.clone(), v.clone())));
        headers
    }

    /// POSTs a modern request: its version, method and name as headers, no session.
    async fn post_modern(
        &self,
        body: bytes::Bytes,
        modern: &crate::era::Headers,
    ) -> Result<ClientResponse, ConnError> {
        self.send(Method::POST, || self.modern_headers(modern), body)
            .await
    }

    /// A modern request's headers: its version, method and name, its parameters.
    fn modern_headers(&self, modern: &crate::era::Headers) -> HeaderMap {
        let mut headers = self.request_headers(5 + modern.params.len());
        // A value the proxy knows (`Cow::Borrowed`) is not copied.
        let known = |value: &Cow<'static, str>, encode: bool| match value {
            Cow::Borrowed(known) => Some(HeaderValue::from_static(known)),
            Cow::Owned(value) if encode => {
                HeaderValue::from_str(&crate::era::header_value(value)).ok()
            }
            Cow::Owned(value) => HeaderValue::from_str(value).ok(),
        };
        if let Some(value) = known(&modern.version, false) {
            headers.insert(VERSION_NAME, value);
        }
        if let Some(value) = known(&modern.method, true) {
            headers.insert(MCP_METHOD, value);
        }
        if let Some(value) = modern
            .name
            .as_deref()
            .and_then(|name| HeaderValue::from_str(&crate::era::header_value(name)).ok())
        {
            headers.insert(MCP_NAME, value);
        }
        for (header, value) in &modern.params {
            if let Ok(name) = axum::http::HeaderName::try_from(format!("mcp-param-{header}"))
                && let Ok(value) = HeaderValue::from_str(&crate::era::header_value(value))
            {
                headers.insert(name, value);
            }
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        headers
    }

    async fn post(
        &self,
        body: bytes::Bytes,
        session: Option<&str>,
    ) -> Result<ClientResponse, ConnError> {
        let headers = || {
            let mut headers = self.headers(session);
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            headers.insert(
                ACCEPT,
                HeaderValue::from_static("application/json, text/event-stream"),
            );
            headers
        };
        self.send(Method::POST, headers, body).await
    }
}

/// Starts the HTTP upstream (nothing is sent until the first message).
pub fn start(spec: HttpSpec, max_message_bytes: usize) -> Result<Upstream, HttpError> {
    let mut headers = HeaderMap::new();
    for (name, value) in &spec.headers {
        let name = HeaderName::try_from(name.as_str())
            .map_err(|_| HttpError::Header(format!("{name}: {value}")))?;
        let value = HeaderValue::try_from(value.as_str())
            .map_err(|_| HttpError::Header(format!("{name}: …")))?;
        headers.append(name, value);
    }
    // rustls needs a process-wide crypto provider; a second install is a harmless no-op.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = conn::Client::new(&spec.url, Duration::from_secs(10))?;
    Ok(Upstream::spawn(move |link: Link| {
        let shared = Arc::new(Shared {
            client,
            #[cfg(feature = "oauth")]
            sign_in: spec.sign_in,
            url: spec.url,
            headers,
            state: std::sync::Mutex::new(SessionState::default()),
            reinit: Mutex::new(()),
            events: link.events,
            max_message_bytes,
            read_timeout: spec.read_timeout,
            streaming: Default::default(),
        });
        run(shared, link.messages, link.stop)
    }))
}

async fn run(
    shared: Arc<Shared>,
    mut messages: queue::Receiver<Outgoing>,
    stop: oneshot::Receiver<Duration>,
) {
    tokio::pin!(stop);
    // The exchanges under way, polled by this task: a message costs no task of its own.
    let mut tasks: super::exchanges::Exchanges<
        std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    > = super::exchanges::Exchanges::new();
    loop {
        tokio::select! {
            message = messages.recv() => match message {
                Some(message) => {
                    // Boxed once here: moved by pointer from then on (the future was copied
                    // whole three times on its way into the set, ~30 KB a call).
                    tasks.push(Box::pin(send_message(shared.clone(), message)));
                }
                None => {
                    // No more messages; wait for the stop (the session ends it).
                    let _ = (&mut stop).await;
                    break;
                }
            },
            _ = &mut stop => break,
            Some(()) = tasks.next(), if !tasks.is_empty() => {}
        }
    }
    // Let answers already under way arrive briefly, then end the session upstream.
    let _ = tokio::time::timeout(Duration::from_millis(500), async {
        while tasks.next().await.is_some() {}
    })
    .await;
    drop(tasks);
    if let Some(session) = shared.session() {
        let delete = shared.send(
            Method::DELETE,
            || shared.headers(Some(&session)),
            bytes::Bytes::new(),
        );
        let delete = tokio::time::timeout(Duration::from_secs(2), delete).await;
        let status = match &delete {
            Ok(Ok(response)) => Some(response.status),
            _ => None,
        };
        tracing::debug!(?status, "upstream session deleted");
    }
    let _ = shared
        .events
        .send(Event::Ended {
            reason: "stopped".into(),
            stopped: true,
        })
        .await;
}

/// POSTs one message; its envelope was read by the relay (`Outgoing`), not again here.
async fn send_message(shared: Arc<Shared>, outgoing: Outgoing) {
    let Outgoing {
        bytes,
        requests,
        initialize,
        initialized,
        modern,
        // The client body's room, held until the POST is done.
        held: _held,
    } = outgoing;
    // A cancellation (the client's, or the proxy's at a timeout) ends its request: the
    // request's stream is no longer resumed.
    if requests.is_empty()
        && let Some(id) = message::cancelled_request_id(&bytes)
    {
        shared.request_over(id.key());
    }
    if let Some(modern) = modern {
        // 2026-07-28: no session; the headers say what the body is.
        let response = shared.post_modern(bytes.into(), &modern).await;
        match response {
            Ok(response) => deliver(&shared, response, &requests, false).await,
            Err(err) => shared.unreachable(&requests, &err).await,
        }
        return;
    }
    if initialize {
        let mut state = shared.state();
        state.initialize = Some(bytes.clone());
        state.id = None;
        state.protocol = None;
        state.subscribed.clear();
    } else if requests.len() == 1 {
        shared.state().subscribed.track(&bytes);
    }
    let session = shared.session();
    // Shared, not copied, between the first attempt and a retry.
    let body = bytes::Bytes::from(bytes);
    let mut response = shared.post(body.clone(), session.as_deref()).await;
    if let Ok(r) = &response
        && r.status == StatusCode::NOT_FOUND
        && session.is_some()
        && !initialize
    {
        tracing::warn!("the upstream session expired (404); starting a new one and retrying once");
        // Boxed: a rare path, kept out of every exchange's future.
        match Box::pin(reinitialize(&shared, session.as_deref())).await {
            Ok(()) => {
                let fresh = shared.session();
                response = shared.post(body, fresh.as_deref()).await;
                let note = jsonrpc::log_message(
                    "warning",
                    "the upstream server's session expired; mcp-budget opened a new one and retried the request, so nothing was lost (server-side state from before may be gone)",
                );
                shared.emit(note).await;
            }
            Err(why) => {
                shared.fail(&requests, &why).await;
                return;
            }
        }
    }
    let response = match response {
        Ok(response) => response,
        Err(err) => {
            shared.unreachable(&requests, &err).await;
            return;
        }
    };
    if initialize
        && let Some(session) = response
            .headers
            .get(SESSION_NAME)
            .and_then(|v| v.to_str().ok())
    {
        shared.state().id = Some(session.to_string());
    }
    let ok = response.status.is_success();
    deliver(&shared, response, &requests, initialize).await;
    if ok && initialized {
        open_get_stream(&shared);
    }
}

/// Passes the messages of a POST's response on, and fails the requests it left unanswered.
async fn deliver(shared: &Arc<Shared>, response: ClientResponse, ids: &[Id], initialize: bool) {
    let status = response.status;
    if status == StatusCode::ACCEPTED || status == StatusCode::NO_CONTENT {
        return;
    }
    if !status.is_success() {
        let body = body::read_prefix(response.body, body::ERROR_EXCERPT_BYTES).await;
        // A JSON-RPC error in the body is the server's answer: passed on as it wrote it (code,
        // message, data), under the request's id when it could not name one.
        if let [id] = ids
            && let Some(answer) = error_answer(&body, id)
        {
            tracing::debug!(%status, "the upstream server answered with a JSON-RPC error");
            shared.emit(answer).await;
            return;
        }
        let why = format!(
            "the upstream server answered HTTP {status}: {}",
            jsonrpc::excerpt(&body, 300)
        );
        tracing::warn!(%why);
        shared.fail(ids, &why).await;
        return;
    }
    let is_sse = response
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut unanswered: Vec<Id> = ids.to_vec();
    let request = match ids {
        [one] => Some(one),
        _ => None,
    };
    if is_sse {
        // Boxed: an event stream's reader is most of this future's size, and a JSON answer
        // (the usual one) does not need it.
        Box::pin(deliver_events(
            shared,
            response.body,
            unanswered,
            request,
            initialize,
        ))
        .await;
    } else {
        let read = body::read_limited_placed(
            response.body,
            shared.max_message_bytes,
            shared.read_timeout,
            true,
        )
        .await;
        match read {
            Ok((body, hold)) if !body.is_empty() => {
                pass_on(shared, initialize, &mut unanswered, request, body, hold).await
            }
            Ok(_) => {}
            Err(why) => {
                tracing::warn!(%why);
                shared.fail(&unanswered, &why.to_string()).await;
                return;
            }
        }
        if !unanswered.is_empty() {
            shared
                .fail(
                    &unanswered,
                    "the upstream server's HTTP response did not contain the answer",
                )
                .await;
        }
    }
}

/// The answers of a POST whose response is an event stream (see [`deliver`]): passed on as
/// they arrive, the stream resumed when the server ends it early; what stays unanswered fails.
async fn deliver_events(
    shared: &Arc<Shared>,
    body: conn::Body,
    mut unanswered: Vec<Id>,
    request: Option<&Id>,
    initialize: bool,
) {
    // Woken when a request of this stream is over elsewhere (cancelled, timed out,
    // answered on another stream): when all are, the stream is dropped, never resumed.
    let over = Arc::new(Notify::new());
    let _streaming = shared.stream_for(&unanswered, &over);
    // An event that grows large waits for its place, and travels with it to the relay.
    let place = body::EventPlace::default();
    let mut events = body::events_placed(
        body,
        shared.max_message_bytes,
        shared.read_timeout,
        Some(place.clone()),
    );
    // Where to resume the stream from if the server ends it before its answers (SSE
    // polling, or a dropped connection), and how long it asked to wait first.
    let mut last_event: Option<String> = None;
    let mut retry = DEFAULT_RETRY;
    // Resumes in a row that brought no event: a server that ends every stream at once
    // would otherwise be asked forever.
    let mut idle_resumes = 0;
    let why = loop {
        let mut broken = None;
        loop {
            let Some(event) = until_over(shared, &over, &mut unanswered, events.next()).await
            else {
                // Every request of the stream is over: nothing more is read for them.
                return;
            };
            let Some(event) = event else { break };
            match event {
                Ok(event) => {
                    if let Some(id) = event.id {
                        if last_event.as_ref() != Some(&id) {
                            idle_resumes = 0;
                        }
                        last_event = Some(id);
                    }
                    if let Some(ms) = event.retry {
                        retry = Duration::from_millis(ms).min(MAX_RETRY);
                    }
                    let hold = place
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .take();
                    if let Some(data) = event.data.filter(|d| !d.trim().is_empty()) {
                        pass_on(
                            shared,
                            initialize,
                            &mut unanswered,
                            request,
                            data.into_bytes(),
                            hold,
                        )
                        .await;
                    }
                }
                Err(err) => {
                    broken = Some(match BodyError::in_sse(&err) {
                        Some(cause) => cause.to_string(),
                        None => format!(
                            "the upstream server's event stream broke before it answered: {err}"
                        ),
                    });
                    break;
                }
            }
        }
        // A cut stream's connection is closed, not drained.
        drop(events);
        let why = broken.unwrap_or_else(|| {
            "the upstream server's event stream ended before it answered".to_string()
        });
        if unanswered.is_empty() {
            break why;
        }
        let Some(last) = last_event.clone() else {
            break why;
        };
        if idle_resumes == MAX_IDLE_RESUMES {
            break format!("{why} (resumed {MAX_IDLE_RESUMES} times in a row without a new event)");
        }
        idle_resumes += 1;
        if until_over(shared, &over, &mut unanswered, tokio::time::sleep(retry))
            .await
            .is_none()
        {
            return;
        }
        let Some(resumed) =
            until_over(shared, &over, &mut unanswered, resume_stream(shared, &last)).await
        else {
            return;
        };
        match resumed {
            Ok(resumed) => {
                events = body::events_placed(
                    resumed,
                    shared.max_message_bytes,
                    shared.read_timeout,
                    Some(place.clone()),
                );
            }
            Err(err) => break format!("{why}, and resuming it failed: {err}"),
        }
    };
    if !unanswered.is_empty() {
        tracing::warn!(%why, unanswered = unanswered.len());
        shared.fail(&unanswered, &why).await;
    }
}

/// Runs `work` until it completes (`Some`), or until every request of `unanswered` is over
/// (`None`); requests that end meanwhile leave `unanswered`.
async fn until_over<F: std::future::Future>(
    shared: &Shared,
    over: &Notify,
    unanswered: &mut Vec<Id>,
    work: F,
) -> Option<F::Output> {
    tokio::pin!(work);
    loop {
        tokio::select! {
            out = &mut work => return Some(out),
            () = over.notified() => {
                unanswered.retain(|id| shared.still_streaming(id.key()));
                if unanswered.is_empty() {
                    return None;
                }
            }
        }
    }
}

/// The JSON-RPC error response an HTTP error body holds for request `id`: as the server wrote
/// it, its id set to `id` when the server wrote `null` or none.
fn error_answer(body: &[u8], id: &Id) -> Option<Vec<u8>> {
    let Ok(message::Parsed::Single(message::Kind::Response {
        id: answered,
        result: None,
    })) = message::parse(body)
    else {
        return None;
    };
    match answered {
        Some(answered) if answered.key() == id.key() => Some(body.to_vec()),
        _ => {
            // `"id":null`, or none: the error is this request's.
            let value: serde_json::Value = serde_json::from_slice(body).ok()?;
            let error = value.get("error")?;
            Some(jsonrpc::error_response(
                Some(id),
                error.get("code")?.as_i64()?,
                error.get("message")?.as_str()?,
                error.get("data"),
            ))
        }
    }
}

/// Passes one message of a POST's response on; what it answers is no longer `unanswered`.
/// A request or notification on the stream of a POST that carried one request relates to it.
/// `hold`: the message's place among the large ones held at once, if it is one.
async fn pass_on(
    shared: &Shared,
    initialize: bool,
    unanswered: &mut Vec<Id>,
    request: Option<&Id>,
    data: Vec<u8>,
    hold: Option<crate::wire::framing::LargeHold>,
) {
    if initialize {
        remember_protocol(shared, &data);
    }
    // The envelope is read once here, and travels with the bytes to the relay.
    let parsed = message::parse(&data).ok();
    let mut related = None;
    if let Some(parsed) = &parsed {
        for key in parsed.response_keys() {
            unanswered.retain(|id| id.key() != key);
            shared.request_over(&key);
        }
        if matches!(
            parsed.kinds().first(),
            Some(Kind::Request { .. } | Kind::Notification { .. })
        ) {
            related = request.cloned();
        }
    }
    shared.emit_related(data, parsed, related, hold).await;
}

/// How long to wait before resuming a stream the server ended, unless it says (`retry`).
const DEFAULT_RETRY: Duration = Duration::from_secs(1);
/// A server's `retry` longer than this is cut to it.
const MAX_RETRY: Duration = Duration::from_secs(30);
/// A stream is resumed at most this many times in a row without a new event.
const MAX_IDLE_RESUMES: u32 = 16;

/// Asks for the events of a stream after `last_event` (GET with `Last-Event-ID`).
async fn resume_stream(shared: &Shared, last_event: &str) -> Result<conn::Body, String> {
    let session = shared.session();
    let last = HeaderValue::try_from(last_event)
        .map_err(|_| "the event id is not a valid header".to_string())?;
    let headers = || {
        let mut headers = shared.headers(session.as_deref());
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        headers.insert("last-event-id", last.clone());
        headers
    };
    let response = shared
        .send(Method::GET, headers, bytes::Bytes::new())
        .await
        .map_err(|err| err.to_string())?;
    if !response.status.is_success() {
        let body = body::read_prefix(response.body, body::ERROR_EXCERPT_BYTES).await;
        return Err(format!(
            "HTTP {}: {}",
            response.status,
            jsonrpc::excerpt(&body, 300)
        ));
    }
    tracing::debug!(last_event, "resumed the upstream event stream");
    Ok(response.body)
}

fn remember_protocol(shared: &Shared, data: &[u8]) {
    if let Some(version) = message::protocol_version(data) {
        shared.state().protocol = Some(version);
    }
}

/// Opens a new upstream session by replaying the client's `initialize`.
async fn reinitialize(shared: &Arc<Shared>, expired: Option<&str>) -> Result<(), String> {
    let _guard = shared.reinit.lock().await;
    if shared.session().as_deref() != expired {
        return Ok(()); // another request already re-initialized
    }
    let initialize = shared.state().initialize.clone().ok_or(
        "the upstream session expired and there is no initialize to replay; reconnect the client",
    )?;
    {
        let mut state = shared.state();
        state.id = None;
        state.protocol = None;
        state.get_stream = false;
    }
    let failed = |detail: String| {
        format!("the upstream session expired and a new one could not be opened: {detail}")
    };
    let response = shared
        .post(initialize.into(), None)
        .await
        .map_err(|e| failed(e.to_string()))?;
    if !response.status.is_success() {
        return Err(failed(format!("HTTP {}", response.status)));
    }
    let session = response
        .headers
        .get(SESSION_NAME)
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    // Read (and keep to ourselves) the initialize answer: the client already has one.
    let is_sse = response
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if is_sse {
        let mut events = body::events(response.body, shared.max_message_bytes, shared.read_timeout);
        while let Some(event) = events.next().await {
            let event = event.map_err(|e| failed(e.to_string()))?;
            if let Some(data) = event.data.filter(|d| !d.trim().is_empty()) {
                remember_protocol(shared, data.as_bytes());
                break;
            }
        }
    } else {
        let body = body::read_limited(response.body, shared.max_message_bytes, shared.read_timeout)
            .await
            .map_err(|e| failed(e.to_string()))?;
        remember_protocol(shared, &body);
    }
    shared.state().id = session.clone();
    let response = shared
        .post(jsonrpc::initialized().into(), session.as_deref())
        .await
        .map_err(|e| failed(e.to_string()))?;
    if !response.status.is_success() {
        return Err(failed(format!(
            "notifications/initialized got HTTP {}",
            response.status
        )));
    }
    tracing::info!(
        session = session.as_deref(),
        "upstream session re-initialized"
    );
    open_get_stream(shared);
    resubscribe(shared, session.as_deref()).await;
    Ok(())
}

/// Makes the old session's resource subscriptions again in the new one: the client made them
/// and was not told they are gone. Each answer is read and kept to the proxy; a refusal is
/// logged (the client's next subscribe gets the server's own answer).
async fn resubscribe(shared: &Arc<Shared>, session: Option<&str>) {
    let again = shared.state().subscribed.requests();
    for (uri, request) in &again {
        let sent = shared.post(request.clone().into(), session).await;
        let outcome = match sent {
            Ok(response) if response.status.is_success() => {
                body::read_limited(response.body, shared.max_message_bytes, shared.read_timeout)
                    .await
                    .map(|answer| crate::holds!(&answer, b"\"error\""))
                    .map_err(|e| e.to_string())
            }
            Ok(response) => Err(format!("HTTP {}", response.status)),
            Err(err) => Err(err.to_string()),
        };
        match outcome {
            Ok(false) => tracing::debug!(%uri, "resource subscription made again"),
            Ok(true) => {
                tracing::warn!(%uri, "the renewed session refused a resource subscription made again")
            }
            Err(why) => {
                tracing::warn!(%uri, %why, "a resource subscription could not be made again in the renewed session")
            }
        }
    }
    if !again.is_empty() {
        tracing::info!(
            subscriptions = again.len(),
            "resource subscriptions made again in the renewed upstream session"
        );
    }
}

/// Opens the GET stream for server-initiated messages (once per session).
fn open_get_stream(shared: &Arc<Shared>) {
    {
        let mut state = shared.state();
        if state.get_stream {
            return;
        }
        state.get_stream = true;
    }
    let shared = shared.clone();
    tokio::spawn(async move {
        let mut last_event: Option<String> = None;
        for attempt in 0..5u32 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 * 2u64.pow(attempt))).await;
            }
            let Some(session) = shared.session() else {
                return;
            };
            let last = last_event
                .as_deref()
                .and_then(|id| HeaderValue::try_from(id).ok());
            let headers = || {
                let mut headers = shared.headers(Some(&session));
                headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
                if let Some(id) = &last {
                    headers.insert("last-event-id", id.clone());
                }
                headers
            };
            let response = match shared.send(Method::GET, headers, bytes::Bytes::new()).await {
                Ok(response) => response,
                Err(err) => {
                    tracing::debug!(%err, "upstream GET stream failed");
                    continue;
                }
            };
            match response.status {
                StatusCode::METHOD_NOT_ALLOWED | StatusCode::NOT_FOUND => {
                    tracing::debug!(status = %response.status, "the upstream server offers no GET stream");
                    shared.state().get_stream = false;
                    return;
                }
                status if !status.is_success() => continue,
                _ => {}
            }
            let mut events =
                body::events(response.body, shared.max_message_bytes, shared.read_timeout);
            while let Some(Ok(event)) = events.next().await {
                if let Some(id) = event.id {
                    last_event = Some(id);
                }
                if let Some(data) = event.data.filter(|d| !d.trim().is_empty()) {
                    // An answer here ends its request's own stream too.
                    let parsed = message::parse(data.as_bytes()).ok();
                    if let Some(parsed) = &parsed {
                        for key in parsed.response_keys() {
                            shared.request_over(&key);
                        }
                    }
                    shared.emit_read(data.into_bytes(), parsed).await;
                }
            }
        }
        shared.state().get_stream = false;
    });
}

#[cfg(test)]
mod sizes {
    use super::*;

    /// The size of the future `f` returns, without calling it.
    fn future_size<A, B, Fut, F: FnOnce(A, B) -> Fut>(_: &F) -> usize {
        std::mem::size_of::<Fut>()
    }

    /// Every message's exchange is a future copied into the heap once: the event-stream reader
    /// and the session renewal are boxed apart (before, 10.7 KB copied three times a call).
    #[test]
    fn an_exchange_future_stays_small() {
        let exchange = future_size(&send_message);
        let deliver = |shared: Arc<Shared>, response: ClientResponse| async move {
            deliver(&shared, response, &[], false).await
        };
        let deliver = future_size(&deliver);
        assert!(
            exchange <= 6 * 1024,
            "send_message's future is {exchange} bytes"
        );
        assert!(deliver <= 3 * 1024, "deliver's future is {deliver} bytes");
    }
}
