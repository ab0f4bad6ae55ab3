//! One client on a byte stream (our stdin/stdout) relayed to a child-process server.
//!
//! Four tasks move bytes: client → relay → child stdin, child stdout → relay → client, and one
//! writer per destination, so that each direction keeps its order and a slow peer on one side
//! never stalls the other. The function returns once the session is over, after every request
//! still in flight has been answered (by the server, or by an error naming why it could not).

use std::future::Future;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

use crate::child::{ChildServer, SpawnError};
use crate::framing::FrameReader;
use crate::relay::Relay;

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

/// Settings of a stdio session.
#[derive(Debug, Clone)]
pub struct Options {
    /// Messages above this size are refused with an error instead of being buffered.
    pub max_message_bytes: usize,
    /// How long the server may take to exit by itself once its stdin is closed.
    pub shutdown_grace: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_message_bytes: crate::framing::DEFAULT_MAX_MESSAGE_BYTES,
            shutdown_grace: Duration::from_secs(3),
        }
    }
}

/// How a session ended.
#[derive(Debug)]
pub enum Outcome {
    /// The client closed its input; the server was shut down.
    ClientClosed,
    /// SIGINT/SIGTERM; the server was shut down.
    Shutdown,
    /// The server exited (or closed its stdout) while the client was still connected.
    ServerExited(Option<ExitStatus>),
}

/// A session could not run.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Spawn(#[from] SpawnError),
}

const CHANNEL_CAPACITY: usize = 256;

/// Relays between a client (`client_in`/`client_out`) and the server started from `command`,
/// until the client closes its input, `shutdown` completes, or the server exits.
pub async fn serve_child<R, W>(
    client_in: R,
    client_out: W,
    command: &[String],
    relay: Arc<Relay>,
    options: &Options,
    shutdown: impl Future<Output = ()>,
) -> Result<Outcome, SessionError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (mut child, pipes) = ChildServer::spawn(command)?;

    let (client_tx, client_rx) = mpsc::channel::<Vec<u8>>(CHANNEL_CAPACITY);
    let client_writer = tokio::spawn(write_lines(client_out, client_rx, "client"));
    let (server_tx, server_rx) = mpsc::channel::<Vec<u8>>(CHANNEL_CAPACITY);
    let server_writer = tokio::spawn(write_lines(pipes.stdin, server_rx, "server"));

    let mut client_reader = tokio::spawn(client_to_server(
        FrameReader::new(client_in, options.max_message_bytes),
        relay.clone(),
        server_tx,
        client_tx.clone(),
    ));
    let mut server_reader = tokio::spawn(server_to_client(
        FrameReader::new(pipes.stdout, options.max_message_bytes),
        relay.clone(),
        client_tx.clone(),
    ));

    tokio::pin!(shutdown);
    let mut server_output_ended = false;
    let outcome = tokio::select! {
        biased;
        end = &mut client_reader => match end {
            Ok(ClientEnd::ServerGone) => Outcome::ServerExited(None),
            _ => Outcome::ClientClosed,
        },
        () = &mut shutdown => {
            client_reader.abort();
            Outcome::Shutdown
        }
        _ = &mut server_reader => {
            server_output_ended = true;
            Outcome::ServerExited(None)
        }
        status = child.wait() => Outcome::ServerExited(status.ok()),
    };
    // A server that exits because its input ended has not failed: the client closed first.
    let outcome = match outcome {
        Outcome::ServerExited(status) if client_reader.is_finished() => {
            match (&mut client_reader).await {
                Ok(ClientEnd::Eof) => Outcome::ClientClosed,
                _ => Outcome::ServerExited(status),
            }
        }
        other => other,
    };

    let reason = match outcome {
        Outcome::ClientClosed | Outcome::Shutdown => {
            // Dropping the reader's sender closed the server's stdin (once queued messages are
            // written); the server may still answer what is in flight during the grace period.
            tracing::info!(
                in_flight = relay.in_flight(),
                "client closed; stopping the server"
            );
            let status = child.terminate(options.shutdown_grace).await;
            tracing::info!(status = ?status.ok(), "server stopped");
            "the server was stopped because the client closed its input before this request was answered".to_string()
        }
        Outcome::ServerExited(_) => {
            let status = tokio::time::timeout(Duration::from_millis(500), child.wait()).await;
            let status = match status {
                Ok(Ok(status)) => Some(status),
                _ => {
                    child.terminate(Duration::ZERO).await.ok();
                    None
                }
            };
            child.drain_stderr(Duration::from_millis(500)).await;
            let reason = exit_reason(status, &child.stderr_tail());
            tracing::error!(%reason, "upstream server ended");
            client_reader.abort();
            reason
        }
    };
    // Everything the server wrote before it ended reaches the client before the errors.
    if !server_output_ended {
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut server_reader).await;
        server_reader.abort();
    }
    for error in relay.close(&reason) {
        if client_tx.send(error).await.is_err() {
            break;
        }
    }
    drop(client_tx);
    server_writer.abort();
    let _ = client_writer.await;
    Ok(match outcome {
        Outcome::ServerExited(_) => Outcome::ServerExited(child.wait().await.ok()),
        other => other,
    })
}

fn exit_reason(status: Option<ExitStatus>, tail: &[String]) -> String {
    let status = match status {
        Some(status) => status.to_string(),
        None => "closed its output".to_string(),
    };
    let mut reason = format!("the upstream server exited ({status}) before answering");
    if tail.is_empty() {
        reason.push_str("; it wrote nothing to stderr");
    } else {
        reason.push_str("; its last stderr lines: ");
        reason.push_str(&tail.join(" | "));
    }
    reason
}

/// Why the client reader stopped.
enum ClientEnd {
    /// The client's input ended (or could not be read).
    Eof,
    /// The server's stdin or the client's output is gone.
    ServerGone,
}

async fn client_to_server<R: AsyncRead + Unpin>(
    mut frames: FrameReader<R>,
    relay: Arc<Relay>,
    to_server: mpsc::Sender<Vec<u8>>,
    to_client: mpsc::Sender<Vec<u8>>,
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
        let routed = relay.from_client(frame);
        for reply in routed.to_client {
            if to_client.send(reply).await.is_err() {
                return ClientEnd::Eof;
            }
        }
        if let Some(bytes) = routed.to_server
            && to_server.send(bytes).await.is_err()
        {
            // The server's stdin is gone; the server-exit path answers what is pending.
            return ClientEnd::ServerGone;
        }
    }
    tracing::debug!("client input ended");
    ClientEnd::Eof
}

async fn server_to_client<R: AsyncRead + Unpin>(
    mut frames: FrameReader<R>,
    relay: Arc<Relay>,
    to_client: mpsc::Sender<Vec<u8>>,
) {
    loop {
        let frame = match frames.next_frame().await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(err) => {
                tracing::warn!(%err, "reading from the server failed");
                break;
            }
        };
        if let Some(bytes) = relay.from_server(frame)
            && to_client.send(bytes).await.is_err()
        {
            return;
        }
    }
    tracing::debug!("server output ended");
}

/// Writes each message as one line, flushing whenever the queue is empty.
async fn write_lines<W: AsyncWrite + Unpin>(
    out: W,
    mut queue: mpsc::Receiver<Vec<u8>>,
    peer: &'static str,
) {
    let mut out = BufWriter::with_capacity(64 * 1024, out);
    while let Some(message) = queue.recv().await {
        let written = async {
            out.write_all(&message).await?;
            out.write_all(b"\n").await?;
            if queue.is_empty() {
                out.flush().await?;
            }
            std::io::Result::Ok(())
        }
        .await;
        if let Err(err) = written {
            tracing::warn!(%err, peer, "writing failed; the peer is gone");
            return;
        }
    }
    let _ = out.flush().await;
    let _ = out.shutdown().await;
}
