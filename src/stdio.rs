//! One client on a byte stream (our stdin/stdout) relayed to an upstream server.
//!
//! Three tasks move bytes: client → relay → upstream, upstream → relay → client, and one
//! writer for the client, so that each direction keeps its order and a slow peer on one side
//! never stalls the other. The function returns once the session is over, after every request
//! still in flight has been answered (by the server, or by an error naming why it could not).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinHandle;

use crate::queue;
use crate::relay::Relay;
use crate::session;
use crate::upstream::{Outgoing, Stopper, Upstream, UpstreamSpec, write_lines};
use crate::wire::framing::{Frame, FrameReader};
use crate::wire::message::{Kind, Parsed};

/// Our stdin, as an async reader.
pub type ClientReader = Box<dyn AsyncRead + Unpin + Send>;
/// Our stdout, as an async writer.
pub type ClientWriter = Box<dyn AsyncWrite + Unpin + Send>;

/// The process's stdin and stdout as async streams.
///
/// Why not `tokio::io::stdin()`: it reads on a blocking thread and hands each chunk over,
/// which costs tens of microseconds per message. When stdin/stdout are pipes (how MCP clients
/// start servers), they are registered with the reactor directly instead; anything else (a
/// terminal, a file, a socket) falls back to tokio's blocking-thread streams.
pub fn client_stdio() -> (ClientReader, ClientWriter) {
    use std::os::fd::AsFd;
    use tokio::net::unix::pipe;
    let reader: ClientReader = match std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .and_then(pipe::Receiver::from_owned_fd)
    {
        Ok(pipe) => Box::new(pipe),
        Err(_) => Box::new(tokio::io::stdin()),
    };
    let writer: ClientWriter = match std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .and_then(pipe::Sender::from_owned_fd)
    {
        Ok(pipe) => Box::new(pipe),
        Err(_) => Box::new(tokio::io::stdout()),
    };
    (reader, writer)
}

pub use crate::session::Options;

/// How a session ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The client closed its input; the server was shut down.
    ClientClosed,
    /// SIGINT/SIGTERM; the server was shut down.
    Shutdown,
    /// The server ended while the client was still connected.
    ServerExited,
}

/// Why the client reader stopped.
enum ClientEnd {
    /// The client's input ended (or could not be read).
    Eof,
    /// The upstream no longer takes messages.
    ServerGone,
}

/// Relays between a client (`client_in`/`client_out`) and `upstream`, until the client closes
/// its input, `shutdown` completes, or the server ends.
/// `lanes`: how to start more servers, for the era bridge's modern requests that declare
/// other capabilities than the first (see [`Lanes`]); `None` serves every request on the one.
pub async fn serve<R, W>(
    client_in: R,
    client_out: W,
    mut upstream: Upstream,
    relay: Arc<Relay>,
    options: &Options,
    lanes: Option<LaneMaker>,
    shutdown: impl Future<Output = ()>,
) -> Outcome
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut stopper = upstream.stopper();
    let upstream_task = upstream.take_task();
    let (client_tx, client_rx) = queue::channel::<Vec<u8>>(queue::DEFAULT_QUEUE_BYTES);
    let client_writer = tokio::spawn(write_lines(client_out, client_rx, "client"));
    let lanes = lanes.map(|maker| Arc::new(Lanes::new(maker, client_tx.clone())));

    let mut client_reader = tokio::spawn(client_to_server(
        FrameReader::new(client_in, options.max_message_bytes),
        relay.clone(),
        upstream.to_server.clone(),
        client_tx.clone(),
        lanes.clone(),
    ));
    let sweeper = tokio::spawn({
        let (relay, to_server, client) =
            (relay.clone(), upstream.to_server.clone(), client_tx.clone());
        async move { session::sweep_timeouts(&relay, &to_server, &client).await }
    });
    // The era bridge sends on the server's behalf; a weak sender, so that the server's
    // input still ends with the client's.
    let to_server = upstream.to_server.downgrade();
    drop(upstream.to_server);
    let mut server_reader = tokio::spawn({
        let (relay, client, events) = (relay.clone(), client_tx.clone(), upstream.events);
        async move { session::server_to_client(events, &relay, &client, &to_server).await }
    });

    tokio::pin!(shutdown);
    let mut ended: Option<(String, bool)> = None;
    let outcome = tokio::select! {
        biased;
        end = &mut client_reader => match end {
            Ok(ClientEnd::ServerGone) => Outcome::ServerExited,
            _ => Outcome::ClientClosed,
        },
        () = &mut shutdown => {
            client_reader.abort();
            Outcome::Shutdown
        }
        end = &mut server_reader => {
            ended = end.ok().flatten();
            Outcome::ServerExited
        }
    };
    // A server that exits because its input ended has not failed: the client closed first.
    let outcome = match outcome {
        Outcome::ServerExited if client_reader.is_finished() => match (&mut client_reader).await {
            Ok(ClientEnd::Eof) => Outcome::ClientClosed,
            _ => Outcome::ServerExited,
        },
        other => other,
    };
    if outcome != Outcome::ServerExited {
        tracing::info!(
            in_flight = relay.in_flight(),
            "client closed; stopping the server"
        );
    }
    client_reader.abort();
    sweeper.abort();
    stopper.stop(options.shutdown_grace);
    let lanes_ended = lanes.map(|lanes| {
        let grace = options.shutdown_grace;
        let client_closed = outcome != Outcome::ServerExited;
        tokio::spawn(async move { lanes.close(grace, client_closed).await })
    });
    if ended.is_none() {
        // The server may still answer what is in flight during the grace period.
        let bound = options.shutdown_grace + Duration::from_secs(5);
        ended = tokio::time::timeout(bound, &mut server_reader)
            .await
            .ok()
            .and_then(Result::ok)
            .flatten();
        server_reader.abort();
    }
    let reason = match (&outcome, ended) {
        (Outcome::ServerExited, Some((reason, _))) => reason,
        (Outcome::ServerExited, None) => "the upstream server stopped taking messages".to_string(),
        _ => "the server was stopped because the client closed its input before this request was answered".to_string(),
    };
    let errors = relay.close(&reason);
    // A client that closed its input is done: like a server that exits on EOF, the proxy then
    // writes nothing of its own (clients such as the Python SDK fail on a message after
    // closing). A client still listening when the server died gets an answer to every request.
    if outcome == Outcome::ServerExited {
        for error in errors {
            if client_tx.send(error).await.is_err() {
                break;
            }
        }
    } else if !errors.is_empty() {
        tracing::info!(
            unanswered = errors.len(),
            "the client closed its input with requests unanswered"
        );
    }
    if let Some(ended) = lanes_ended {
        let _ = ended.await;
    }
    drop(client_tx);
    let _ = client_writer.await;
    if let Some(task) = upstream_task {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    outcome
}

async fn client_to_server<R: AsyncRead + Unpin>(
    mut frames: FrameReader<R>,
    relay: Arc<Relay>,
    to_server: queue::Sender<Outgoing>,
    to_client: queue::Sender<Vec<u8>>,
    lanes: Option<Arc<Lanes>>,
) -> ClientEnd {
    loop {
        let frame = match frames.next_frame().await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(err) => {
                tracing::warn!(%err, "reading from the client failed");
                break;
            }
        };
        let frame = match (&lanes, frame) {
            // Read here, when a lane may need it, and not again by the relay.
            (Some(lanes), Frame::Line(line)) if lanes.any() || relay.in_legacy_session() => {
                match crate::wire::message::parse_from_client(&line) {
                    Ok(parsed) => Frame::Read { line, parsed },
                    Err(_) => Frame::Line(line),
                }
            }
            (_, frame) => frame,
        };
        if let Some(lanes) = &lanes
            && let Some(lane) = lanes.route(&relay, &frame).await
        {
            // Another server's: its end is that lane's, not the session's.
            if let Err(ClientEnd::Eof) =
                relay_frame(&lane.relay, frame, &lane.to_server, &to_client).await
            {
                return ClientEnd::Eof;
            }
            continue;
        }
        if let Err(end) = relay_frame(&relay, frame, &to_server, &to_client).await {
            return end;
        }
    }
    tracing::debug!("client input ended");
    ClientEnd::Eof
}

/// One client frame through `relay` to its server and back.
async fn relay_frame(
    relay: &Relay,
    frame: Frame,
    to_server: &queue::Sender<Outgoing>,
    to_client: &queue::Sender<Vec<u8>>,
) -> Result<(), ClientEnd> {
    let routed = crate::session::client_frame(relay, frame).await;
    for reply in routed.to_client {
        if to_client.send(reply).await.is_err() {
            return Err(ClientEnd::Eof);
        }
    }
    for job in routed.deferred {
        if to_client.send(job.run_heavy().await).await.is_err() {
            return Err(ClientEnd::Eof);
        }
    }
    // The upstream is gone when a send fails; its `Ended` answers what is pending.
    let messages = routed
        .probe
        .into_iter()
        .chain(routed.to_server)
        .chain(routed.also_to_server);
    for message in messages {
        if to_server.send(message).await.is_err() {
            return Err(ClientEnd::ServerGone);
        }
    }
    Ok(())
}

/// How the proxy starts another server for [`Lanes`]: the upstream's spec, and a relay for it
/// (the session's settings, budget and recorder).
pub struct LaneMaker {
    pub spec: UpstreamSpec,
    pub max_message_bytes: usize,
    pub relay: Box<dyn Fn() -> Relay + Send + Sync>,
}

/// At most this many servers besides the first, one per capability set.
pub const MAX_LANES: usize = 4;

/// The era bridge over stdio: a modern client's requests declare their capabilities one by
/// one, but a legacy server learns the client's once, in `initialize`, for the whole session.
/// A request that may take input and declares other capabilities (sampling, elicitation,
/// roots) than the session the proxy opened for the first is served by another process of
/// the same server, whose session declares them: one per capability set, kept for the rest
/// of the session and reused, at most [`MAX_LANES`]. Beyond that, such a request goes to the
/// first server (a server request it did not declare the capability for still fails the
/// call with -32021). A lane whose server ends answers its requests in flight and is started
/// again by the next request that needs it.
pub struct Lanes {
    maker: LaneMaker,
    to_client: queue::Sender<Vec<u8>>,
    open: Mutex<Vec<Arc<Lane>>>,
    /// Serializes starting lanes (a start awaits its process).
    starting: tokio::sync::Mutex<()>,
    /// Set once the client closed: a lane whose server ends then writes nothing.
    closing: Arc<AtomicBool>,
    warned: AtomicBool,
}

struct Lane {
    profile: String,
    relay: Arc<Relay>,
    to_server: queue::Sender<Outgoing>,
    stopper: Mutex<Stopper>,
    ended: Arc<AtomicBool>,
    tasks: Mutex<Option<LaneTasks>>,
}

struct LaneTasks {
    /// Relays the server's messages; ends with the server.
    reader: JoinHandle<()>,
    sweeper: JoinHandle<()>,
    upstream: Option<JoinHandle<()>>,
}

impl Lanes {
    fn new(maker: LaneMaker, to_client: queue::Sender<Vec<u8>>) -> Lanes {
        Lanes {
            maker,
            to_client,
            open: Mutex::new(Vec::new()),
            starting: tokio::sync::Mutex::new(()),
            closing: Arc::new(AtomicBool::new(false)),
            warned: AtomicBool::new(false),
        }
    }

    fn open(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Lane>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lane `frame` goes to, when not the first server's: a request declaring another
    /// capability set, or a cancellation of a request a lane holds.
    async fn route(&self, first: &Relay, frame: &Frame) -> Option<Arc<Lane>> {
        if let Frame::Read {
            line,
            parsed: Parsed::Single(Kind::Notification { method }),
        } = frame
        {
            if method != "notifications/cancelled" {
                return None;
            }
            let id = crate::wire::message::cancelled_request_id(line)?;
            return self.open().iter().find(|l| l.relay.holds(&id)).cloned();
        }
        let (profile, same) = first.call_capabilities(frame)?;
        // A lane that serves these capabilities keeps them (its calls' retries find them),
        // even once the first session, opened again after a restart, declares the same.
        if let Some(lane) = self.live(&profile) {
            return Some(lane);
        }
        if same {
            return None;
        }
        let _one = self.starting.lock().await;
        if let Some(lane) = self.live(&profile) {
            return Some(lane);
        }
        let full = {
            let mut open = self.open();
            open.retain(|l| !l.ended.load(Ordering::SeqCst));
            open.len() >= MAX_LANES
        };
        if full {
            if !self.warned.swap(true, Ordering::SeqCst) {
                tracing::warn!(
                    lanes = MAX_LANES,
                    "modern requests declare more capability sets than mcp-budget starts servers for; the others share the first server's session"
                );
            }
            return None;
        }
        match self.start(profile, first).await {
            Ok(lane) => Some(lane),
            Err(err) => {
                tracing::warn!(%err, "could not start another server for a capability set; the request goes to the first");
                None
            }
        }
    }

    /// Whether any lane was started (and not found ended since).
    fn any(&self) -> bool {
        !self.open().is_empty()
    }

    fn live(&self, profile: &str) -> Option<Arc<Lane>> {
        self.open()
            .iter()
            .find(|l| l.profile == profile && !l.ended.load(Ordering::SeqCst))
            .cloned()
    }

    async fn start(
        &self,
        profile: String,
        first: &Relay,
    ) -> Result<Arc<Lane>, crate::upstream::StartError> {
        let mut upstream = Upstream::start(&self.maker.spec, self.maker.max_message_bytes).await?;
        tracing::info!(
            capabilities = %profile,
            "a modern request declares other capabilities than the legacy session: another server process serves them"
        );
        // The client listed the tools through the first: this one knows them as it does.
        let relay = Arc::new((self.maker.relay)().sharing_tools_of(first));
        let stopper = upstream.stopper();
        let upstream_task = upstream.take_task();
        let ended = Arc::new(AtomicBool::new(false));
        let to_server = upstream.to_server.clone();
        let weak = upstream.to_server.downgrade();
        drop(upstream.to_server);
        let sweeper = tokio::spawn({
            let (relay, to_server, client) =
                (relay.clone(), to_server.clone(), self.to_client.clone());
            async move { session::sweep_timeouts(&relay, &to_server, &client).await }
        });
        let reader = tokio::spawn({
            let (relay, client, events) = (relay.clone(), self.to_client.clone(), upstream.events);
            let (ended, closing) = (ended.clone(), self.closing.clone());
            // The lane's sweeper ends with it: dropped from `open`, nothing else would stop
            // it, and it holds the client's writer open (the proxy would never exit).
            let sweeping = sweeper.abort_handle();
            async move {
                let end = session::server_to_client(events, &relay, &client, &weak).await;
                sweeping.abort();
                ended.store(true, Ordering::SeqCst);
                let reason = match end {
                    Some((reason, _)) => reason,
                    None => "the upstream server stopped taking messages".to_string(),
                };
                let errors = relay.close(&reason);
                if !closing.load(Ordering::SeqCst) {
                    tracing::warn!(%reason, "a server serving a capability set ended; the next request that needs it starts another");
                    for error in errors {
                        if client.send(error).await.is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let lane = Arc::new(Lane {
            profile,
            relay,
            to_server,
            stopper: Mutex::new(stopper),
            ended,
            tasks: Mutex::new(Some(LaneTasks {
                reader,
                sweeper,
                upstream: upstream_task,
            })),
        });
        self.open().push(lane.clone());
        Ok(lane)
    }

    /// Stops every lane's server (the session is over) and waits for them, a bounded time.
    async fn close(&self, grace: Duration, client_closed: bool) {
        self.closing.store(client_closed, Ordering::SeqCst);
        let lanes: Vec<Arc<Lane>> = std::mem::take(&mut *self.open());
        for lane in &lanes {
            lane.stopper
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .stop(grace);
        }
        let bound = grace + Duration::from_secs(5);
        for lane in lanes {
            let tasks = lane
                .tasks
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            let Some(tasks) = tasks else { continue };
            let _ = tokio::time::timeout(bound, tasks.reader).await;
            tasks.sweeper.abort();
            if let Some(upstream) = tasks.upstream {
                let _ = tokio::time::timeout(Duration::from_secs(5), upstream).await;
            }
        }
    }
}
