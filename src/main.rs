//! The `mcp-budget` binary: parses the command line and runs the library.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use mcp_budget::budget::Budget;
use mcp_budget::cli::{Cli, Command};
use mcp_budget::explain;
use mcp_budget::intercept::Interceptor;
use mcp_budget::policy::Policy;
use mcp_budget::relay::Relay;
use mcp_budget::stdio::{self, Outcome};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("mcp-budget: cannot start the async runtime: {err}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(run(cli));
    // A read of our stdin may still be parked on a blocking thread (the client never closed
    // it); it must not keep the process alive once the session is over.
    runtime.shutdown_background();
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("mcp-budget: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Some(Command::Check { file }) => {
            let policy = Policy::load(&file)?;
            println!("{}: OK\n{}", file.display(), explain::summary(&policy));
            return Ok(ExitCode::SUCCESS);
        }
        Some(Command::Explain {
            file,
            tool,
            descriptor,
            server,
        }) => {
            let policy = Policy::load(&file)?;
            let tools = match (descriptor, server.is_empty()) {
                (Some(path), _) => {
                    let text = std::fs::read_to_string(&path)
                        .with_context(|| format!("cannot read {}", path.display()))?;
                    let document: serde_json::Value = serde_json::from_str(&text)
                        .with_context(|| format!("{} is not JSON", path.display()))?;
                    explain::tools_in(&document)
                }
                (None, false) => explain::fetch_tools(&server).await?,
                (None, true) => anyhow::bail!(
                    "explain needs the upstream descriptor: --descriptor FILE.json, or the server command after `--`"
                ),
            };
            let rewritten = explain::rewrite(policy, tools, &tool)?;
            println!("{}", serde_json::to_string_pretty(&rewritten)?);
            return Ok(ExitCode::SUCCESS);
        }
        None => {}
    }
    let policy = match &cli.policy {
        Some(path) => Policy::load(path)?,
        None => Policy::default(),
    };
    let options = stdio::Options {
        max_message_bytes: cli.max_message_bytes,
        shutdown_grace: Duration::from_millis(cli.shutdown_grace_ms),
    };
    let relay = Arc::new(Relay::new(Interceptor::new(Budget::new(policy))));
    let (client_in, client_out) = stdio::client_stdio();
    let outcome = stdio::serve_child(
        client_in,
        client_out,
        &cli.server,
        relay,
        &options,
        shutdown_signal(),
    )
    .await?;
    Ok(match outcome {
        Outcome::ClientClosed | Outcome::Shutdown => ExitCode::SUCCESS,
        Outcome::ServerExited(status) => {
            tracing::error!(
                ?status,
                "the upstream server exited while the client was connected"
            );
            ExitCode::from(1)
        }
    })
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::warn!("cannot listen for signals; Ctrl-C will end the proxy abruptly");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => tracing::info!("SIGINT received"),
        _ = term.recv() => tracing::info!("SIGTERM received"),
    }
}
