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
use mcp_budget::listen;
use mcp_budget::policy::Policy;
use mcp_budget::relay::Relay;
use mcp_budget::stdio::{self, Outcome};
use mcp_budget::upstream::{Upstream, UpstreamSpec, http};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    // A single thread: no cross-thread wake-ups on the message path (measured on 2 cores: a
    // multi-thread runtime added ~25 µs to each HTTP call of benches/http_latency.rs).
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
    let spec = match (&cli.upstream, cli.server.is_empty()) {
        (Some(url), _) => {
            let url = reqwest::Url::parse(url)
                .ok()
                .filter(|u| matches!(u.scheme(), "http" | "https"))
                .with_context(|| {
                    format!(
                        "--upstream {url:?} is not an http(s) URL; e.g. https://example.com/mcp"
                    )
                })?;
            let headers = cli
                .upstream_header
                .iter()
                .map(|h| http::parse_header(h))
                .collect::<Result<Vec<_>, _>>()?;
            UpstreamSpec::Http(http::HttpSpec { url, headers })
        }
        (None, false) => UpstreamSpec::Command(cli.server.clone()),
        (None, true) => anyhow::bail!(
            "no server given: put its command after `--` (e.g. `mcp-budget -- npx -y @modelcontextprotocol/server-everything`), or reach it with --upstream URL"
        ),
    };
    let budget = Arc::new(Budget::new(policy));
    if let Some(listen_url) = &cli.listen {
        let (url, addr) = listen::parse_listen_url(listen_url)?;
        let auth_token = match &cli.auth_token_env {
            Some(name) => Some(
                std::env::var(name)
                    .ok()
                    .filter(|t| !t.is_empty())
                    .with_context(|| format!("--auth-token-env {name}: the environment variable {name} is not set or empty"))?,
            ),
            None => None,
        };
        let listen_options = listen::ListenOptions {
            url,
            allow_hosts: cli.allow_host.clone(),
            allow_origins: cli.allow_origin.clone(),
            auth_token,
            max_sessions: cli.max_sessions,
            idle: Duration::from_secs(cli.session_idle_secs),
            session: options,
        };
        listen::serve(listen_options, addr, spec, budget, shutdown_signal()).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let upstream = Upstream::start(&spec, options.max_message_bytes).await?;
    let relay = Arc::new(Relay::new(Interceptor::shared(budget)));
    let (client_in, client_out) = stdio::client_stdio();
    let outcome = stdio::serve(
        client_in,
        client_out,
        upstream,
        relay,
        &options,
        shutdown_signal(),
    )
    .await;
    Ok(match outcome {
        Outcome::ClientClosed | Outcome::Shutdown => ExitCode::SUCCESS,
        Outcome::ServerExited => {
            tracing::error!("the upstream server ended while the client was connected");
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
