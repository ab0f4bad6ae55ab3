//! The upstream server as a child process: spawn, stderr pass-through, and termination.
//!
//! The child gets a process group of its own, so that terminating it also ends whatever it
//! spawned (no orphans), and so that a Ctrl-C in the terminal reaches the proxy, which then
//! shuts the child down in order instead of both dying at once.

use std::collections::VecDeque;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::task::JoinHandle;

/// How many of the child's last stderr lines are kept for error messages.
const STDERR_TAIL_LINES: usize = 10;
/// How much of one stderr line is kept.
const STDERR_LINE_MAX: usize = 300;

/// The child could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error(
        "no server command given: put it after `--`, e.g. `mcp-budget -- npx -y @modelcontextprotocol/server-everything`"
    )]
    NoCommand,
    #[error(
        "could not start the server `{program}`: {source} (check the command and that it is on PATH)"
    )]
    Io {
        program: String,
        #[source]
        source: std::io::Error,
    },
}

/// A running upstream server process.
pub struct ChildServer {
    child: Child,
    pgid: Option<Pid>,
    tail: Arc<Mutex<VecDeque<String>>>,
    stderr_task: Option<JoinHandle<()>>,
    status: Option<ExitStatus>,
}

/// The child's protocol pipes.
pub struct ChildPipes {
    pub stdin: ChildStdin,
    pub stdout: ChildStdout,
}

impl ChildServer {
    /// Starts `command[0]` with the rest as arguments.
    pub fn spawn(command: &[String]) -> Result<(ChildServer, ChildPipes), SpawnError> {
        let (program, args) = command.split_first().ok_or(SpawnError::NoCommand)?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|source| SpawnError::Io {
            program: program.clone(),
            source,
        })?;
        let pgid = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map(Pid::from_raw);
        let (Some(stdin), Some(stdout), stderr) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(SpawnError::Io {
                program: program.clone(),
                source: std::io::Error::other("the child's pipes were not created"),
            });
        };
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_task = stderr.map(|stderr| tokio::spawn(pass_stderr(stderr, tail.clone())));
        tracing::info!(program = %program, pid = child.id(), "started upstream server");
        Ok((
            ChildServer {
                child,
                pgid,
                tail,
                stderr_task,
                status: None,
            },
            ChildPipes { stdin, stdout },
        ))
    }

    /// Waits for the child to exit (cancel-safe; returns the same status once known).
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let status = self.child.wait().await?;
        self.status = Some(status);
        Ok(status)
    }

    /// Waits (bounded) until the child's stderr is fully passed through, so that the tail is
    /// complete when an error message quotes it.
    pub async fn drain_stderr(&mut self, limit: Duration) {
        if let Some(task) = self.stderr_task.take() {
            let _ = tokio::time::timeout(limit, task).await;
        }
    }

    /// The last lines the child wrote to stderr.
    pub fn stderr_tail(&self) -> Vec<String> {
        let tail = self
            .tail
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tail.iter().cloned().collect()
    }

    /// Ends the child: waits `grace` for it to exit by itself (its stdin should be closed
    /// already), then SIGTERM to its process group, then SIGKILL. Anything left in the group
    /// is terminated too.
    pub async fn terminate(&mut self, grace: Duration) -> std::io::Result<ExitStatus> {
        if let Ok(status) = tokio::time::timeout(grace, self.wait()).await {
            self.signal_group(Signal::SIGTERM);
            return status;
        }
        tracing::info!(
            grace_ms = grace.as_millis() as u64,
            "server still running after the grace period; sending SIGTERM"
        );
        self.signal_group(Signal::SIGTERM);
        if let Ok(status) = tokio::time::timeout(Duration::from_secs(2), self.wait()).await {
            return status;
        }
        tracing::warn!("server ignored SIGTERM; sending SIGKILL");
        self.signal_group(Signal::SIGKILL);
        let status = self.wait().await;
        self.signal_group(Signal::SIGKILL);
        status
    }

    /// Sends `signal` to the child's process group (remaining members included); a group
    /// that is already gone is not an error.
    pub fn signal_group(&self, signal: Signal) {
        if let Some(pgid) = self.pgid {
            match killpg(pgid, signal) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
                Err(err) => {
                    tracing::warn!(%err, ?signal, "could not signal the server's process group")
                }
            }
        }
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        if self.status.is_none() {
            self.signal_group(Signal::SIGKILL);
        }
    }
}

/// Why a child server ended, for the errors its waiting requests get.
pub fn exit_reason(status: Option<ExitStatus>, tail: &[String]) -> String {
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

/// Copies the child's stderr to ours, line by line, keeping the last lines.
async fn pass_stderr(stderr: ChildStderr, tail: Arc<Mutex<VecDeque<String>>>) {
    let mut reader = BufReader::new(stderr);
    let mut out = tokio::io::stderr();
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let _ = out.write_all(&line).await;
        let text = String::from_utf8_lossy(&line[..line.len().min(STDERR_LINE_MAX)]);
        let text = text.trim_end().to_string();
        if text.is_empty() {
            continue;
        }
        let mut tail = tail
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if tail.len() == STDERR_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(text);
    }
    let _ = out.flush().await;
}
