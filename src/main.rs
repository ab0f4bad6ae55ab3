//! The `mcp-budget` binary: parses the command line and runs the library.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use mcp_budget::budget::Budget;
use mcp_budget::budget::cursor::CursorKey;
use std::path::PathBuf;

use mcp_budget::cli::{Cli, Command, Restart, RunArgs};
use mcp_budget::commands::explain;
use mcp_budget::commands::report;
use mcp_budget::intercept::Interceptor;
use mcp_budget::listen;
use mcp_budget::policy::Policy;
use mcp_budget::recording::Recorder;
use mcp_budget::recording::Recording;
use mcp_budget::replay::Replayer;
use mcp_budget::stdio::{self, Outcome};
use mcp_budget::upstream::{Upstream, UpstreamSpec, http};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let traces = match init_logging(cli.verbose, cli.otlp_endpoint.as_deref()) {
        Ok(traces) => traces,
        Err(err) => {
            eprintln!("mcp-budget: {err}");
            return ExitCode::from(2);
        }
    };
    // One session (stdio) runs on a single thread: no cross-thread wake-ups on the message path
    // (measured on 2 cores: a multi-thread runtime added ~25 µs to each HTTP call of
    // benches/http_latency.rs). The listener serves many sessions: a work-stealing runtime on
    // every core (`--threads`), and their heavy budget work on a pool of its own (`heavy`).
    // (Measured against one single-thread runtime per core, sessions pinned: better latency for
    // one client, but sessions clustered on one runtime and 32 sessions gained 1.04× where
    // work stealing gains 1.33×.)
    let threads = match (&cli.command, &cli.run.listen) {
        (None, Some(_)) => listen_threads(&cli.run),
        _ => 1,
    };
    let mut builder = if threads > 1 {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(threads);
        builder
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    if threads > 1
        && let Err(err) = mcp_budget::heavy::start(threads, lower_priority)
    {
        eprintln!("mcp-budget: cannot start the budget's threads: {err}");
        return ExitCode::from(2);
    }
    let runtime = match builder.enable_all().build() {
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
    // The last spans go out before the process ends.
    #[cfg(feature = "otlp")]
    if let Some(traces) = traces {
        traces.shutdown();
    }
    #[cfg(not(feature = "otlp"))]
    let _: Option<()> = traces;
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("mcp-budget: {}", chain(&err));
            ExitCode::from(2)
        }
    }
}

/// An error and its causes, each cause once: many of our errors already name their source in
/// their own text, and anyhow's `{:#}` would print it a second time.
fn chain(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

/// How many threads `--listen` serves on: `--threads`, else one per core.
fn listen_threads(run: &mcp_budget::cli::RunArgs) -> usize {
    run.threads.map(usize::from).unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    })
}

/// Lowers the calling thread's scheduling priority (nice 10): the budget's heavy work yields a
/// core to the I/O of every session. (Best effort: a failure leaves the priority as it was.)
fn lower_priority() {
    // SAFETY: setpriority reads only its integer arguments; on Linux, PRIO_PROCESS with who 0
    // names the calling thread alone.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS as _, 0, 10) };
    if rc != 0 {
        tracing::debug!(err = %std::io::Error::last_os_error(), "cannot lower the budget threads' priority");
    }
}

#[cfg(feature = "otlp")]
type Traces = mcp_budget::traces::Exporter;
#[cfg(not(feature = "otlp"))]
type Traces = ();

/// Logs on stderr; with `otlp`, request spans exported there too.
fn init_logging(verbose: u8, otlp: Option<&str>) -> anyhow::Result<Option<Traces>> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{Layer, filter};
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let env = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colour only for a person at a terminal, never in a log file or a client's log pane.
    use std::io::IsTerminal;
    let log = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_filter(env);
    let registry = tracing_subscriber::registry().with(log);
    let Some(endpoint) = otlp else {
        registry.init();
        return Ok(None);
    };
    #[cfg(feature = "otlp")]
    {
        let (exporter, layer) = mcp_budget::traces::init(endpoint).map_err(anyhow::Error::msg)?;
        let spans =
            filter::Targets::new().with_target(mcp_budget::traces::TARGET, tracing::Level::INFO);
        registry.with(layer.with_filter(spans)).init();
        Ok(Some(exporter))
    }
    #[cfg(not(feature = "otlp"))]
    {
        let _ = filter::LevelFilter::OFF;
        registry.init();
        anyhow::bail!(
            "--otlp-endpoint {endpoint}: this build has no traces; build with the otlp feature (on by default)"
        )
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        None => proxy(cli.run, None, None).await,
        Some(Command::Policies) => {
            for builtin in mcp_budget::builtin::BUILTINS {
                let policy =
                    Policy::load(std::path::Path::new(&format!("builtin:{}", builtin.name)))?;
                println!(
                    "builtin:{}  for {} (serverInfo.name {})\n{}",
                    builtin.name,
                    builtin.about,
                    builtin.servers.join(", "),
                    explain::summary(&policy)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Check { file, recording }) => {
            let policy = Policy::load(&file)?;
            println!("{}: OK\n{}", file.display(), explain::summary(&policy));
            std::io::Write::flush(&mut std::io::stdout())?;
            for warning in explain::warnings(&policy) {
                eprintln!("warning: {}: {warning}", file.display());
            }
            if let Some(path) = recording {
                let recording = Recording::load(&path)?;
                let budget = Budget::new(policy);
                let findings = explain::paths_in_recording(&budget, &recording);
                println!("{}", findings.text);
                if findings.unmatched > 0 {
                    return Ok(ExitCode::from(1));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Explain {
            file,
            policy,
            tool,
            client,
            descriptor,
            server,
        }) => {
            let path = policy.or(file);
            let given = match &path {
                Some(path) => Some((path.as_path(), Policy::load(path)?)),
                None => None,
            };
            // An unknown client stops explain before a server is started.
            explain::check_client(given.as_ref().map(|(_, p)| p), client.as_deref())?;
            let (tools, server_name) = match (descriptor, server.is_empty()) {
                (Some(path), _) => {
                    let text = std::fs::read_to_string(&path)
                        .with_context(|| format!("cannot read {}", path.display()))?;
                    let document: serde_json::Value = serde_json::from_str(&text)
                        .with_context(|| format!("{} is not JSON", path.display()))?;
                    (explain::tools_in(&document), None)
                }
                (None, false) => {
                    let fetched = explain::fetch_tools(&server).await?;
                    // What was detected goes to stderr: stdout is the descriptor.
                    eprintln!("{}", fetched.detected);
                    (fetched.tools, fetched.server)
                }
                (None, true) => anyhow::bail!(
                    "explain needs the upstream descriptor: --descriptor FILE.json, or the server command after `--`"
                ),
            };
            let explained = explain::explain(
                given,
                server_name.as_deref(),
                tools,
                &tool,
                client.as_deref(),
            )?;
            eprintln!(
                "policy: {} — {}",
                explained.policy.name, explained.policy.why
            );
            let Some(rewritten) = explained.descriptor else {
                println!(
                    "{tool} is hidden by the policy's [tools] allow/deny: clients do not see it in tools/list, and a call to it is refused.\nhidden: {}",
                    explained.hidden.join(", ")
                );
                return Ok(ExitCode::SUCCESS);
            };
            println!("{}", serde_json::to_string_pretty(&rewritten)?);
            if let Some(pages) = explained.pages {
                println!("\n{pages}");
            }
            if !explained.hidden.is_empty() {
                println!(
                    "\nhidden by the policy's [tools] allow/deny: {}",
                    explained.hidden.join(", ")
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Record { out, run }) => proxy(run, None, Some(out)).await,
        Some(Command::Replay { file, run }) => {
            if run.upstream.is_some() || !run.server.is_empty() {
                anyhow::bail!(
                    "replay serves the recording itself: drop --upstream and the server command"
                );
            }
            let recording = Recording::load(&file)?;
            if let Some(line) = recording.cut_at {
                tracing::warn!(
                    line,
                    "the recording was cut off mid-line (the recorder did not finish); replaying what came before"
                );
                eprintln!(
                    "mcp-budget replay: {} was cut off at line {line}; replaying the {} complete messages before it",
                    file.display(),
                    recording.entries.len()
                );
            }
            let replayer = Arc::new(Replayer::new(&recording));
            proxy(run, Some(UpstreamSpec::Replay(replayer)), None).await
        }
        Some(Command::Login { url, sign_in }) => login(&url, &sign_in).await,
        Some(Command::Logout { url }) => logout(&url),
        Some(Command::Wrap(args)) => wrap(mcp_budget::wrap::Mode::Wrap, args),
        Some(Command::Unwrap(args)) => wrap(mcp_budget::wrap::Mode::Unwrap, args),
        Some(Command::Suggest { file, min_bytes }) => {
            let recording = Recording::load(&file)?;
            print!(
                "{}",
                mcp_budget::commands::suggest::suggest(&recording, min_bytes)
            );
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Report {
            file,
            policy,
            client,
            json,
        }) => {
            let recording = Recording::load(&file)?;
            // The proxy's set-up for the same --policy and --client; the relay picks the rest.
            let setup = report::Setup::new(&recording, policy.as_deref(), client.as_deref())
                .map_err(anyhow::Error::msg)?;
            let tokenizer = report::Tokenizer::o200k().map_err(anyhow::Error::msg)?;
            let mut last = std::time::Instant::now();
            let report = report::build(&recording, &setup, &tokenizer, |done, total| {
                if total >= 20 && (done == total || last.elapsed() >= Duration::from_millis(500)) {
                    last = std::time::Instant::now();
                    eprint!("\rreport: {done}/{total} tools/call measured");
                    if done == total {
                        eprintln!();
                    }
                }
            });
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report::table(&report));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `wrap` and `unwrap`: what they did goes to stdout (they speak no protocol there).
fn wrap(mode: mcp_budget::wrap::Mode, args: mcp_budget::cli::WrapArgs) -> anyhow::Result<ExitCode> {
    use mcp_budget::wrap;
    let launcher: Vec<String> = match &args.launcher {
        Some(words) => words.split_whitespace().map(String::from).collect(),
        None => wrap::default_launcher(),
    };
    if launcher.is_empty() {
        anyhow::bail!(
            "--launcher is empty: give the command that starts mcp-budget, e.g. --launcher \"uvx --from mcp-budget-proxy mcp-budget\""
        );
    }
    let request = wrap::Request {
        mode,
        file: args.file,
        client: args.client,
        dry_run: args.dry_run,
        select: wrap::Select {
            only: args.only,
            except: args.except,
        },
        launcher,
    };
    let mut out = std::io::stdout().lock();
    wrap::run(&request, &mut out)?;
    Ok(ExitCode::SUCCESS)
}

/// The shared result cache, when `--cache` names one.
fn shared_cache(run: &RunArgs, ttl: Duration) -> anyhow::Result<()> {
    use mcp_budget::remote::{Choice, Settings, SettingsError};
    let Some(value) = &run.cache else {
        if run.cache_required {
            anyhow::bail!(
                "--cache-required asks /healthz to report the shared cache: add --cache redis://host:port/db"
            );
        }
        return Ok(());
    };
    // Given by MCP_BUDGET_CACHE, a URL may hold its password; on the command line, not.
    let from_arguments = std::env::var("MCP_BUDGET_CACHE").ok().as_deref() != Some(value);
    let url = match Choice::read(value, from_arguments)? {
        Choice::Memory if run.cache_required => anyhow::bail!(
            "--cache-required asks /healthz to report the shared cache, and --cache is memory: give --cache redis://host:port/db"
        ),
        Choice::Memory => return Ok(()),
        Choice::Shared(url) => url,
    };
    let password = match &run.cache_password_env {
        Some(var) => Some(
            std::env::var(var)
                .ok()
                .filter(|p| !p.is_empty())
                .ok_or_else(|| SettingsError::NoPassword(var.clone()))?,
        ),
        None => None,
    };
    if run.cache_timeout_ms == 0 {
        anyhow::bail!("--cache-timeout-ms must be at least 1");
    }
    mcp_budget::remote::start(Settings {
        url,
        password,
        timeout: Duration::from_millis(run.cache_timeout_ms),
        ttl,
        quota: run.cache_quota_bytes,
        required: run.cache_required,
    })?;
    Ok(())
}

/// The cursor key: the policy's `cursor_key_env` when it is set, else the key file
/// (`--cursor-key-file`, or the one in the user's state directory, made at the first start),
/// so that cursors survive a restart. A key file that exists but cannot be used stops the
/// proxy with the fix; where no key file can be made at all, a random key is used and said so.
fn cursor_key(policy: &Policy, file: Option<&std::path::Path>) -> anyhow::Result<CursorKey> {
    use mcp_budget::keyfile::{self, KeyFileError};
    if let Some(var) = &policy.cursor_key_env {
        match std::env::var(var) {
            Ok(secret) if !secret.is_empty() => {
                return Ok(CursorKey::from_secret(secret.as_bytes()));
            }
            _ => tracing::warn!(
                variable = %var,
                "the policy's cursor key variable is unset or empty; using the cursor key file instead"
            ),
        }
    }
    let path = match file {
        Some(path) => path.to_path_buf(),
        None => match keyfile::default_path() {
            Ok(path) => path,
            Err(err) => {
                tracing::warn!(%err, "using a random cursor key: cursors will not survive a restart");
                return Ok(CursorKey::random());
            }
        },
    };
    match keyfile::load_or_create(&path) {
        Ok(secret) => Ok(CursorKey::from_secret(&secret)),
        Err(err @ (KeyFileError::Create(..) | KeyFileError::NoHome)) if file.is_none() => {
            tracing::warn!(%err, "using a random cursor key: cursors will not survive a restart");
            Ok(CursorKey::random())
        }
        Err(err) => Err(err.into()),
    }
}

/// The upstream's URL for `login` and `logout`: http(s), as given to --upstream.
fn upstream_url(url: &str) -> anyhow::Result<url::Url> {
    url::Url::parse(url)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https"))
        .with_context(|| format!("{url:?} is not an http(s) URL; e.g. https://example.com/mcp"))
}

/// The sign-in for an HTTP upstream, from its flags (nothing is sent until the upstream asks).
#[cfg(feature = "oauth")]
fn sign_in(
    url: &url::Url,
    args: &mcp_budget::cli::SignInArgs,
    interactive: bool,
) -> anyhow::Result<std::sync::Arc<mcp_budget::upstream::oauth::SignIn>> {
    use mcp_budget::upstream::oauth::{Options, Secret, SignIn, store};
    let client_secret = match &args.upstream_client_secret_env {
        Some(var) => match std::env::var(var) {
            Ok(secret) if !secret.is_empty() => Some(Secret(secret)),
            _ => anyhow::bail!(
                "--upstream-client-secret-env {var}: the environment variable {var} is not set (or is empty); export it with the client's secret"
            ),
        },
        None => None,
    };
    if let Some(document) = &args.upstream_client_metadata_url {
        let usable = url::Url::parse(document)
            .ok()
            .is_some_and(|u| u.scheme() == "https" && u.path() != "/" && !u.path().is_empty());
        anyhow::ensure!(
            usable,
            "--upstream-client-metadata-url {document:?} must be an https URL with a path (the client metadata document), e.g. https://example.com/mcp-budget/client.json"
        );
    }
    Ok(SignIn::new(
        url.clone(),
        Options {
            client_id: args.upstream_client_id.clone(),
            client_secret,
            client_metadata_url: args.upstream_client_metadata_url.clone(),
            redirect_port: args.upstream_redirect_port,
            state_dir: store::state_dir()?,
            wait: seconds(
                "--upstream-sign-in-wait-secs",
                args.upstream_sign_in_wait_secs,
            )?,
            interactive,
        },
    ))
}

#[cfg(not(feature = "oauth"))]
fn no_sign_in(args: &mcp_budget::cli::SignInArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.upstream_client_id.is_none() && args.upstream_client_metadata_url.is_none(),
        "this build cannot sign in to an upstream: build with the oauth feature (on by default)"
    );
    Ok(())
}

/// `mcp-budget login URL`: signs in now, in the browser, and keeps the sign-in.
async fn login(url: &str, args: &mcp_budget::cli::SignInArgs) -> anyhow::Result<ExitCode> {
    let url = upstream_url(url)?;
    #[cfg(feature = "oauth")]
    {
        let sign_in = sign_in(&url, args, true)?;
        eprintln!("mcp-budget: signing in to {url}");
        sign_in.login().await?;
        eprintln!(
            "mcp-budget: signed in to {url}; kept in {}",
            sign_in.store().path().display()
        );
        Ok(ExitCode::SUCCESS)
    }
    #[cfg(not(feature = "oauth"))]
    {
        let _ = args;
        anyhow::bail!(
            "this build cannot sign in to {url}: build with the oauth feature (on by default)"
        )
    }
}

/// `mcp-budget logout URL`: forgets the sign-in kept for an upstream.
fn logout(url: &str) -> anyhow::Result<ExitCode> {
    let url = upstream_url(url)?;
    #[cfg(feature = "oauth")]
    {
        use mcp_budget::upstream::oauth::store::{FileStore, state_dir};
        let store = FileStore::new(&state_dir()?, &url);
        if store.remove()? {
            eprintln!(
                "mcp-budget: forgot the sign-in to {url} ({})",
                store.path().display()
            );
        } else {
            eprintln!("mcp-budget: no sign-in to {url} was kept");
        }
        Ok(ExitCode::SUCCESS)
    }
    #[cfg(not(feature = "oauth"))]
    anyhow::bail!("this build keeps no sign-in for {url}: it has no oauth feature")
}

/// Runs the proxy: `upstream` overrides the server of `run` (replay); `record` writes a recording.
async fn proxy(
    run: RunArgs,
    upstream: Option<UpstreamSpec>,
    record: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let replaying = upstream.is_some();
    let mut policy = match (&run.policy, replaying) {
        (Some(path), _) => Policy::load(path)?,
        // A replayed server answers exactly what was recorded, however large.
        (None, true) => Policy::uncapped(),
        (None, false) => Policy::default(),
    };
    if let Some(bytes) = run.cache_bytes {
        policy.cache_bytes = bytes;
    }
    if let Some(secs) = run.cache_ttl_secs {
        policy.cache_ttl = Duration::from_secs(secs);
    }
    let request_timeout = run
        .request_timeout_secs
        .map(|secs| seconds("--request-timeout-secs", secs))
        .transpose()?;
    let options = stdio::Options {
        max_message_bytes: run.max_message_bytes,
        shutdown_grace: Duration::from_millis(run.shutdown_grace_ms),
        request_timeout,
        initialize_timeout: seconds("--initialize-timeout-secs", run.initialize_timeout_secs)?,
        max_in_flight: run.max_in_flight,
        server_era: run.server_era,
        client_era: run.client_era,
        input_timeout: seconds("--input-timeout-secs", run.input_timeout_secs)?,
        bridge: true,
    };
    anyhow::ensure!(
        run.upstream.is_some()
            || (run.sign_in.upstream_client_id.is_none()
                && run.sign_in.upstream_client_metadata_url.is_none()),
        "--upstream-client-id and --upstream-client-metadata-url sign in to an HTTP upstream: give it with --upstream URL"
    );
    let spec = match (upstream, &run.upstream, run.server.is_empty()) {
        (Some(spec), _, _) => spec,
        (None, Some(url), _) => {
            let url = url::Url::parse(url)
                .ok()
                .filter(|u| matches!(u.scheme(), "http" | "https"))
                .with_context(|| {
                    format!(
                        "--upstream {url:?} is not an http(s) URL; e.g. https://example.com/mcp"
                    )
                })?;
            let headers = run
                .upstream_header
                .iter()
                .map(|h| http::parse_header(h))
                .collect::<Result<Vec<_>, _>>()?;
            // An upstream the user gives its own Authorization header is not signed in to.
            let authorized = headers
                .iter()
                .any(|(name, _)| name.eq_ignore_ascii_case("authorization"));
            anyhow::ensure!(
                !authorized
                    || (run.sign_in.upstream_client_id.is_none()
                        && run.sign_in.upstream_client_metadata_url.is_none()),
                "--upstream-header Authorization and the sign-in flags (--upstream-client-id, --upstream-client-metadata-url) both authorize the upstream: keep one"
            );
            #[cfg(feature = "oauth")]
            let sign_in = if authorized {
                None
            } else {
                Some(sign_in(&url, &run.sign_in, run.listen.is_none())?)
            };
            #[cfg(not(feature = "oauth"))]
            no_sign_in(&run.sign_in)?;
            UpstreamSpec::Http(http::HttpSpec {
                url,
                headers,
                #[cfg(feature = "oauth")]
                sign_in,
                read_timeout: seconds(
                    "--upstream-read-timeout-secs",
                    run.upstream_read_timeout_secs,
                )?,
            })
        }
        (None, None, false) if run.restart == Restart::OnFailure => {
            UpstreamSpec::Supervised(run.server.clone())
        }
        (None, None, false) => UpstreamSpec::Command(run.server.clone()),
        (None, None, true) => anyhow::bail!(
            "no server given: put its command after the options (e.g. `mcp-budget npx -y @modelcontextprotocol/server-everything`; `--` before it when its first word is a subcommand), or reach it with --upstream URL"
        ),
    };
    // A recording answers as the server did: no era is learned of it, nothing bridged.
    let options = stdio::Options {
        bridge: !matches!(spec, UpstreamSpec::Replay(_)),
        ..options
    };
    let transport = format!(
        "{}→{}",
        if run.listen.is_some() {
            "http"
        } else {
            "stdio"
        },
        match &spec {
            UpstreamSpec::Command(_) | UpstreamSpec::Supervised(_) => "command",
            UpstreamSpec::Http(_) => "http",
            UpstreamSpec::Replay(_) => "replay",
        }
    );
    let (recorder, writer) = match &record {
        Some(path) => {
            let (recorder, writer) = Recorder::start(path, &transport).await?;
            (Some(recorder), Some(writer))
        }
        None => (None, None),
    };
    let key = cursor_key(&policy, run.cursor_key_file.as_deref())?;
    // A replayed server answers as recorded: no policy is picked for it, and without a policy
    // its results are not fitted to the client either (unless --client asks).
    let budget = Budget::with_key(policy, key)
        .choosing(
            run.client.as_deref(),
            run.policy.is_none() && !replaying,
            run.policy.is_some() || !replaying,
        )
        .map_err(anyhow::Error::msg)?;
    let budget = mcp_budget::reload::Shared::new(Arc::new(budget));
    shared_cache(&run, budget.get().cache().ttl())?;
    // A policy file reloads on SIGHUP (and, with --watch, when it changes).
    if let Some(path) = run.policy.as_ref().filter(|p| {
        p.to_str()
            .is_none_or(|t| t != "none" && !t.starts_with("builtin:"))
    }) {
        let overrides = mcp_budget::reload::Overrides {
            cache_bytes: run.cache_bytes,
            cache_ttl: run.cache_ttl_secs.map(Duration::from_secs),
        };
        mcp_budget::reload::start(budget.clone(), path.clone(), overrides, run.watch);
    } else if run.watch {
        anyhow::bail!("--watch reloads a policy file: give one with --policy FILE");
    }
    if run.max_large_results == 0 {
        anyhow::bail!(
            "--max-large-results must be at least 1 (one large server message at a time)"
        );
    }
    mcp_budget::wire::framing::limit_large_lines(run.max_large_results);
    let _metrics_server = match run.metrics.as_deref() {
        None => None,
        Some("listen") => {
            if run.listen.is_none() {
                anyhow::bail!(
                    "--metrics listen serves /metrics on the --listen address: add --listen URL, or give --metrics an address of its own (e.g. 127.0.0.1:9464)"
                );
            }
            mcp_budget::metrics::enable();
            None
        }
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
                format!(
                    "--metrics {addr}: cannot listen there (give host:port, e.g. 127.0.0.1:9464)"
                )
            })?;
            let local = listener.local_addr()?;
            mcp_budget::metrics::enable();
            tracing::info!(url = %format!("http://{local}/metrics"), "serving metrics");
            let options = mcp_budget::listen::metrics::ServeOptions {
                allow_hosts: run.allow_host.clone(),
                max_connections: run.metrics_max_connections,
                header_timeout: seconds("--header-timeout-secs", run.header_timeout_secs)?,
            };
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(async move {
                let shutdown = async {
                    let _ = stopped.await;
                };
                if let Err(err) =
                    mcp_budget::listen::metrics::serve(listener, options, shutdown).await
                {
                    tracing::error!(%err, "the metrics server stopped");
                }
            });
            Some((stop, task))
        }
    };
    let code = if let Some(listen_url) = &run.listen {
        let (url, addr) = listen::parse_listen_url(listen_url)?;
        let mut auth_tokens = Vec::new();
        for name in &run.auth_token_env {
            let token = std::env::var(name)
                .ok()
                .filter(|t| !t.is_empty())
                .with_context(|| format!("--auth-token-env {name}: the environment variable {name} is not set or empty"))?;
            auth_tokens.push(token);
        }
        if !run.rate_limit.is_finite() || run.rate_limit < 0.0 {
            anyhow::bail!(
                "--rate-limit {}: give requests per second per client, or 0 for no limit",
                run.rate_limit
            );
        }
        let (tcp, url) = listen::bind(&url, addr).await?;
        let listen_options = listen::ListenOptions {
            allow_hosts: run.allow_host.clone(),
            allow_origins: run.allow_origin.clone(),
            auth_tokens,
            max_sessions: run.max_sessions,
            max_sessions_per_client: run.max_sessions_per_client,
            max_connections: run.max_connections,
            max_body_bytes_in_flight: run.max_body_bytes_in_flight,
            max_children: run.max_children,
            rate_limit: run.rate_limit,
            header_timeout: seconds("--header-timeout-secs", run.header_timeout_secs)?,
            body_timeout: seconds("--body-timeout-secs", run.body_timeout_secs)?,
            idle: Duration::from_secs(run.session_idle_secs),
            replay_bytes: run.replay_bytes,
            resume_window: seconds("--resume-secs", run.resume_secs)?,
            stream_limit: if run.stream_secs == 0.0 {
                None
            } else {
                Some(seconds("--stream-secs", run.stream_secs)?)
            },
            session: options,
            recorder,
            ..listen::ListenOptions::new(url.clone())
        };
        // The address clients use (with the port picked for port 0): tests and scripts read it.
        println!("listening on {url}");
        use std::io::Write;
        std::io::stdout().flush()?;
        listen::serve(tcp, listen_options, spec, budget, shutdown_signal()).await?;
        ExitCode::SUCCESS
    } else {
        let upstream = Upstream::start(&spec, options.max_message_bytes).await?;
        let make_relay = {
            let (options, budget, recorder) = (options.clone(), budget.clone(), recorder.clone());
            move || {
                let relay = options.relay(Interceptor::reloadable(budget.clone()));
                match &recorder {
                    Some(recorder) => relay.with_recorder(recorder.clone()),
                    None => relay,
                }
            }
        };
        let relay = make_relay();
        // The era bridge may need more servers: one per capability set (see `stdio::Lanes`).
        let lanes = options.bridge.then(|| stdio::LaneMaker {
            spec: spec.clone(),
            max_message_bytes: options.max_message_bytes,
            relay: Box::new(make_relay),
        });
        drop(recorder);
        let (client_in, client_out) = stdio::client_stdio();
        let outcome = stdio::serve(
            client_in,
            client_out,
            upstream,
            Arc::new(relay),
            &options,
            lanes,
            shutdown_signal(),
        )
        .await;
        match outcome {
            Outcome::ClientClosed | Outcome::Shutdown => ExitCode::SUCCESS,
            Outcome::ServerExited => {
                tracing::error!("the upstream server ended while the client was connected");
                ExitCode::from(1)
            }
        }
    };
    if let Some(writer) = writer {
        // Every recorder is gone with its session: the writer finishes the file.
        if tokio::time::timeout(Duration::from_secs(10), writer)
            .await
            .is_err()
        {
            tracing::error!(
                "the recording could not be finished in time; it stays as a .partial file"
            );
        }
    }
    Ok(code)
}

/// A duration given in seconds on the command line: positive and finite.
fn seconds(flag: &str, secs: f64) -> anyhow::Result<Duration> {
    // A year at most: a longer one is a mistake, and a deadline that far overflows the clock.
    const MAX: f64 = 365.0 * 24.0 * 3600.0;
    if secs.is_finite() && secs > 0.0 && secs <= MAX {
        Ok(Duration::from_secs_f64(secs))
    } else {
        anyhow::bail!("{flag} {secs}: give a positive number of seconds, at most {MAX}")
    }
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
