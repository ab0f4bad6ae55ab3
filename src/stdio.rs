//! One client on a byte stream (our stdin/stdout) relayed to an upstream server.
//!
//! Three tasks move bytes: client → relay → upstream, upstream → relay → client, and one
//! writer for the client, so that each direction keeps its order and a slow peer on one side
//! never stalls the other. The function returns once the session is over, after every request
//! still in flight has been answered (by the server, or by an error naming why it could not).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::framing::FrameReader;
use crate::queue;
use crate::relay::Relay;
use crate::session;
use crate::upstream::{Upstream, write_lines};

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
pub async fn serve<R, W>(
    client_in: R,
    client_out: W,
    mut upstream: Upstream,
    relay: Arc<Relay>,
    options: &Options,
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

    let mut client_reader = tokio::spawn(client_to_server(
        FrameReader::new(client_in, options.max_message_bytes),
        relay.clone(),
        upstream.to_server.clone(),
        client_tx.clone(),
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
    to_server: queue::Sender<crate::upstream::Outgoing>,
    to_client: queue::Sender<Vec<u8>>,
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
        if let crate::framing::Frame::Line(line) | crate::framing::Frame::Read { line, .. } = &frame
        {
            crate::remote::prefetch(&relay, line).await;
        }
        let routed = relay.from_client(frame);
        // (A rule chain automatic paging took over is cut on the way in.)
        crate::remote::flush(&relay).await;
        for reply in routed.to_client {
            if to_client.send(reply).await.is_err() {
                return ClientEnd::Eof;
            }
        }
        for job in routed.deferred {
            if to_client.send(job.run_heavy().await).await.is_err() {
                return ClientEnd::Eof;
            }
        }
        if let Some(probe) = routed.probe
            && to_server.send(probe).await.is_err()
        {
            return ClientEnd::ServerGone;
        }
        if let Some(message) = routed.to_server
            && to_server.send(message).await.is_err()
        {
            // The upstream is gone; its `Ended` answers what is pending.
            return ClientEnd::ServerGone;
        }
        for message in routed.also_to_server {
            if to_server.send(message).await.is_err() {
                return ClientEnd::ServerGone;
            }
        }
    }
    tracing::debug!("client input ended");
    ClientEnd::Eof
}
