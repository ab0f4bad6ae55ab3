//! A lean HTTP/1.1 client for the upstream: hyper's connection API over kept-alive TCP (or TLS)
//! connections, taken from a small pool of idle ones.
//!
//! Why not a general HTTP client: this one talks to a single origin, with one method shape,
//! and the proxy sits on its hot path. A general client re-reads the URL, consults proxy and
//! redirect rules and walks a service stack on every request; measured, that cost the proxy
//! about 60 µs of CPU per call, three times what the relay itself spends. Here a request is
//! a pre-built head plus the body bytes, sent on a connection that is already open.
//!
//! A connection is lent to one exchange at a time (HTTP/1.1 has no multiplexing) and comes
//! back to the pool only when its response body was read to its end; a body cut short closes
//! its connection. The exchange drives its connection itself, in the task that waits for the
//! answer, so a call costs no hop to a connection task and back; an idle connection is driven
//! by no one, and one the server closed meanwhile is found out (and replaced) on its next use.
//!
//! A server closes a connection that stayed idle too long, and if a request is sent on it just
//! then, the request is lost with it (a reset, with no answer: nothing tells whether the tool
//! ran, so it cannot be sent again). A busy server widens that window: Node checks its timers
//! before it reads the request that arrived meanwhile. So an idle connection is reused only
//! well within the server's idle limit: a second short of the `Keep-Alive: timeout=N` it
//! announced (what Node's own agent does), or [`IDLE_WITHOUT_HINT`] when it announced none.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::Stream;
use http_body_util::Full;
use hyper::body::{Body as _, Incoming};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HOST, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use url::Url;

const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// Idle connections kept for reuse; more may be open while requests are in flight.
const MAX_IDLE: usize = 64;

/// How long an idle connection is reused when its server announced no `Keep-Alive` timeout:
/// within the 5 s that common servers allow (uvicorn's default, Node's).
const IDLE_WITHOUT_HINT: Duration = Duration::from_secs(4);

/// How long a connection may stay idle and still be reused, from a response's `Keep-Alive`
/// header (`timeout=N`, in seconds): a second less, for the server's clock and its busy loop.
fn reuse_within(headers: &HeaderMap) -> Duration {
    let hint = headers
        .get_all(KEEP_ALIVE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .find_map(|param| {
            let (name, value) = param.split_once('=')?;
            if !name.trim().eq_ignore_ascii_case("timeout") {
                return None;
            }
            value.trim().trim_matches('"').parse::<u64>().ok()
        });
    match hint {
        Some(secs) => Duration::from_secs(secs.saturating_sub(1)),
        None => IDLE_WITHOUT_HINT,
    }
}

/// Why an exchange failed before a response head arrived.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("connection timed out after {0} s")]
    ConnectTimeout(u64),
    #[error("cannot connect: {0}")]
    Connect(#[source] std::io::Error),
    #[error("TLS handshake failed: {0}")]
    Tls(#[source] std::io::Error),
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("invalid request: {0}")]
    Request(#[from] hyper::http::Error),
    /// The upstream asks to sign in and the request could not be (the reason names the fix).
    #[error("{0}")]
    SignIn(String),
}

/// The client could not be set up for this URL.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("the upstream URL {0} has no host")]
    NoHost(Url),
    #[error("the upstream URL must be http:// or https://, not {0}://")]
    Scheme(String),
    #[error("cannot set up TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("the upstream host {0:?} is not a valid TLS server name")]
    ServerName(String),
}

/// One open connection: the handle requests are sent on, and the future that does its I/O.
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    /// `None` once the connection closed. Dropping the finished driver matters: it is what
    /// tells a request waiting on this connection that it never went out, and hands it back.
    driver: Option<Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>>>,
    /// How long it may stay idle and still be reused, from its last response.
    reuse_within: Duration,
    /// When it was last given back to the pool.
    idle_since: Instant,
}

/// Does a connection's pending I/O; never waits.
fn drive(
    driver: &mut Option<Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>>>,
    cx: &mut Context<'_>,
) {
    if let Some(running) = driver.as_mut()
        && let Poll::Ready(result) = running.as_mut().poll(cx)
    {
        *driver = None;
        if let Err(err) = result {
            tracing::debug!(%err, "upstream connection ended");
        }
    }
}

impl Conn {
    fn closed(&self) -> bool {
        self.driver.is_none() || self.sender.is_closed()
    }

    fn drive(&mut self, cx: &mut Context<'_>) {
        drive(&mut self.driver, cx);
    }

    /// Waits until the connection can take a request, driving it meanwhile (after a response
    /// it needs a turn to get ready again); an error when it closed.
    async fn ready(&mut self) -> hyper::Result<()> {
        std::future::poll_fn(|cx| {
            self.drive(cx);
            self.sender.poll_ready(cx)
        })
        .await
    }

    /// Sends `request` and waits for the response head, driving the connection meanwhile.
    async fn exchange(
        &mut self,
        request: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<Full<Bytes>>>> {
        let mut sending = std::pin::pin!(self.sender.try_send_request(request));
        let driver = &mut self.driver;
        std::future::poll_fn(|cx| {
            drive(driver, cx);
            sending.as_mut().poll(cx)
        })
        .await
    }
}

struct Pool {
    idle: Mutex<Vec<Conn>>,
}

impl Pool {
    fn take(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        while let Some(conn) = idle.pop() {
            if now.duration_since(conn.idle_since) < conn.reuse_within && !conn.closed() {
                return Some(conn);
            }
        }
        None
    }

    fn give_back(&self, mut sender: Conn) {
        // (A server that allows no idle time at all: nothing to keep.)
        if sender.closed() || sender.reuse_within.is_zero() {
            return;
        }
        sender.idle_since = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push(sender);
        }
    }
}

/// One origin's client.
pub struct Client {
    host: String,
    port: u16,
    /// The request target (path and query) and the `Host` header, built once.
    target: hyper::Uri,
    authority: HeaderValue,
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    )>,
    connect_timeout: Duration,
    pool: Arc<Pool>,
}

impl Client {
    pub fn new(url: &Url, connect_timeout: Duration) -> Result<Client, SetupError> {
        let host = url
            .host_str()
            .ok_or_else(|| SetupError::NoHost(url.clone()))?
            .to_string();
        let tls = match url.scheme() {
            "http" => None,
            "https" => {
                use rustls_platform_verifier::ConfigVerifierExt;
                let config = rustls::ClientConfig::with_platform_verifier()?;
                let name = host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_string();
                let server_name = rustls::pki_types::ServerName::try_from(name.clone())
                    .map_err(|_| SetupError::ServerName(name))?;
                Some((
                    tokio_rustls::TlsConnector::from(Arc::new(config)),
                    server_name,
                ))
            }
            other => return Err(SetupError::Scheme(other.to_string())),
        };
        let port = url.port_or_known_default().unwrap_or(80);
        let mut target = url.path().to_string();
        if let Some(query) = url.query() {
            target.push('?');
            target.push_str(query);
        }
        let authority = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.clone(),
        };
        Ok(Client {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port,
            target: target
                .parse()
                .map_err(|_| SetupError::NoHost(url.clone()))?,
            authority: HeaderValue::try_from(authority)
                .map_err(|_| SetupError::NoHost(url.clone()))?,
            tls,
            connect_timeout,
            pool: Arc::new(Pool {
                idle: Mutex::new(Vec::new()),
            }),
        })
    }

    /// Sends one request: `headers` plus `body` to the URL's path, with `method`.
    pub async fn send(
        &self,
        method: Method,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<ClientResponse, ConnError> {
        let mut request = Request::builder()
            .method(method)
            .uri(self.target.clone())
            .body(Full::new(body))?;
        *request.headers_mut() = headers;
        request.headers_mut().insert(HOST, self.authority.clone());
        // A pooled connection may have been closed by the server while idle; the request is
        // then handed back unsent, and goes out on a new connection.
        let mut fresh = false;
        loop {
            let mut conn = match self.pool.take() {
                Some(mut conn) => {
                    if conn.ready().await.is_err() {
                        continue; // closed while idle
                    }
                    conn
                }
                None => {
                    fresh = true;
                    self.connect().await?
                }
            };
            match conn.exchange(request).await {
                Ok(response) => return Ok(self.lease(conn, response)),
                Err(mut err) => match err.take_message() {
                    Some(unsent) if !fresh => request = unsent,
                    _ => return Err(ConnError::Http(err.into_error())),
                },
            }
        }
    }

    fn lease(&self, mut conn: Conn, response: Response<Incoming>) -> ClientResponse {
        let (head, body) = response.into_parts();
        conn.reuse_within = reuse_within(&head.headers);
        ClientResponse {
            status: head.status,
            headers: head.headers,
            body: Body {
                body,
                lease: Some(conn),
                pool: self.pool.clone(),
                ended: false,
            },
        }
    }

    async fn connect(&self) -> Result<Conn, ConnError> {
        let connecting = TcpStream::connect((self.host.as_str(), self.port));
        let tcp = tokio::time::timeout(self.connect_timeout, connecting)
            .await
            .map_err(|_| ConnError::ConnectTimeout(self.connect_timeout.as_secs()))?
            .map_err(ConnError::Connect)?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => self.handshake(tcp).await,
            Some((connector, name)) => {
                let tls = tokio::time::timeout(
                    self.connect_timeout,
                    connector.connect(name.clone(), tcp),
                )
                .await
                .map_err(|_| ConnError::ConnectTimeout(self.connect_timeout.as_secs()))?
                .map_err(ConnError::Tls)?;
                self.handshake(tls).await
            }
        }
    }

    async fn handshake<I>(&self, io: I) -> Result<Conn, ConnError>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, connection) = http1::handshake(TokioIo::new(io)).await?;
        Ok(Conn {
            sender,
            driver: Some(Box::pin(connection)),
            reuse_within: IDLE_WITHOUT_HINT,
            idle_since: Instant::now(),
        })
    }
}

/// A response head and its body.
pub struct ClientResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Body,
}

/// A response body as a stream of chunks; its connection returns to the pool once the body
/// was read to its end.
pub struct Body {
    body: Incoming,
    lease: Option<Conn>,
    pool: Arc<Pool>,
    ended: bool,
}

impl Drop for Body {
    fn drop(&mut self) {
        // An empty body (a 202, say) is complete without being read.
        if !self.ended
            && self.body.is_end_stream()
            && let Some(sender) = self.lease.take()
        {
            self.pool.give_back(sender);
        }
    }
}

impl Stream for Body {
    type Item = Result<Bytes, hyper::Error>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Self::Item>> {
        loop {
            if self.ended {
                return Poll::Ready(None);
            }
            // The body arrives only while its connection is driven.
            if let Some(conn) = self.lease.as_mut() {
                conn.drive(cx);
            }
            match std::pin::Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    self.ended = true;
                    if let Some(sender) = self.lease.take() {
                        self.pool.give_back(sender);
                    }
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(err))) => {
                    self.ended = true;
                    self.lease = None;
                    return Poll::Ready(Some(Err(err)));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        return Poll::Ready(Some(Ok(data)));
                    }
                    // Trailers: nothing for the proxy; read on.
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    #[test]
    fn the_keep_alive_hint_is_read_with_a_second_to_spare() {
        let hint = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(KEEP_ALIVE, HeaderValue::from_str(value).unwrap());
            reuse_within(&headers)
        };
        assert_eq!(hint("timeout=5, max=1000"), Duration::from_secs(4));
        assert_eq!(hint("max=3,Timeout = 60"), Duration::from_secs(59));
        assert_eq!(hint("timeout=0"), Duration::ZERO);
        assert_eq!(hint("max=3"), IDLE_WITHOUT_HINT);
        assert_eq!(hint("timeout=soon"), IDLE_WITHOUT_HINT);
        assert_eq!(reuse_within(&HeaderMap::new()), IDLE_WITHOUT_HINT);
    }

    /// A server that announces `Keep-Alive: timeout=2` and, like a busy Node server whose
    /// timer fired before it read the request, drops a request that arrives on a connection
    /// idle for a second or more, unanswered. Returns its URL and its count of connections.
    async fn strict_server() -> (Url, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}/mcp", listener.local_addr().unwrap())).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut answered: Option<Instant> = None;
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let Ok(n) = socket.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if buf.len() < end + 4 + length {
                            continue;
                        }
                        buf.drain(..end + 4 + length);
                        if answered.is_some_and(|at| at.elapsed() >= Duration::from_secs(1)) {
                            return; // closed with the request unread: a reset
                        }
                        let answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\
                                      Keep-Alive: timeout=2\r\n\r\nok";
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                        answered = Some(Instant::now());
                    }
                });
            }
        });
        (url, accepted)
    }

    async fn call(client: &Client) -> Result<Vec<u8>, ConnError> {
        let mut response = client
            .send(Method::POST, HeaderMap::new(), Bytes::from_static(b"{}"))
            .await?;
        let mut body = Vec::new();
        while let Some(chunk) = response.body.next().await {
            body.extend_from_slice(&chunk?);
        }
        Ok(body)
    }

    #[tokio::test]
    async fn an_idle_connection_is_reused_within_the_servers_hint() {
        let (url, accepted) = strict_server().await;
        let client = Client::new(&url, Duration::from_secs(5)).unwrap();
        for _ in 0..3 {
            assert_eq!(call(&client).await.unwrap(), b"ok");
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one kept-alive connection"
        );
    }

    #[tokio::test]
    async fn a_connection_idle_past_the_servers_hint_is_not_reused() {
        let (url, accepted) = strict_server().await;
        let client = Client::new(&url, Duration::from_secs(5)).unwrap();
        assert_eq!(call(&client).await.unwrap(), b"ok");
        // Idle past the announced 2 s less the spare second: the server drops a request
        // sent on it now, so it must go out on a new connection.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert_eq!(call(&client).await.unwrap(), b"ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
