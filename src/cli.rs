//! The command line: `mcp-budget [OPTIONS] [--] <server command>...` and its subcommands.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// When a stdio server is restarted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Restart {
    /// A crash ends the session.
    #[default]
    Never,
    /// A crash restarts the server (at most five times a minute).
    OnFailure,
}

/// Put a response budget in front of any MCP server.
///
/// mcp-budget relays MCP between a client (stdio, or Streamable HTTP with --listen) and a server
/// (a command, or Streamable HTTP with --upstream), passing every message unchanged
/// except `tools/list` descriptors and `tools/call` results, which a policy can page, trim and cap.
#[derive(Debug, Parser)]
#[command(
    name = "mcp-budget",
    version,
    args_conflicts_with_subcommands = true,
    after_help = "Examples:\n  mcp-budget --policy policies/fleet.toml -- ./target/release/examples/fleet_server\n  mcp-budget --listen http://127.0.0.1:8080/mcp --upstream https://mcp.example.com/mcp\n  mcp-budget record --out session.jsonl -- npx -y @modelcontextprotocol/server-everything\n  mcp-budget report --policy policies/fleet.toml session.jsonl"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub run: RunArgs,

    /// More logging on stderr (-v info, -vv debug, -vvv trace). RUST_LOG overrides it.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    /// Export a span per client request over OTLP/HTTP (JSON) to this URL, e.g.
    /// http://127.0.0.1:4318/v1/traces: method, tool, bytes in and out, and what the budget did;
    /// a request's params._meta.traceparent makes it a child span (and goes upstream unchanged).
    #[arg(long, value_name = "URL", global = true)]
    pub otlp_endpoint: Option<String>,
}

/// How the proxy runs: policy, transports, limits.
#[derive(Debug, Args, Clone, Default)]
pub struct RunArgs {
    /// Budget policy: a TOML file, or `builtin:NAME` (`mcp-budget policies` lists them), or
    /// `none`. Without it: the built-in policy written for the server (by the serverInfo.name
    /// it answers initialize with), else no rules; every tool result over the budget is paged
    /// automatically.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,

    /// Reload the policy file when it changes (it always reloads on SIGHUP). A policy that fails
    /// to load leaves the one in force; sessions whose descriptors change get
    /// notifications/tools/list_changed.
    #[arg(long)]
    pub watch: bool,

    /// Serve Prometheus metrics at http://ADDR/metrics (its own address, no token: bind it to
    /// loopback or a private network; the Host header is checked as for --listen, with
    /// --allow-host, and connections are capped by --metrics-max-connections and closed after
    /// --header-timeout-secs idle), or with `listen`, at /metrics on the --listen address
    /// behind its token. Per tool: calls, upstream and delivered bytes, tokens saved (estimated
    /// as bytes / 4), pages, refusals by class, cache hits and misses; per proxy: sessions,
    /// upstream latency, restarts, cache evictions, bad input.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,

    /// With --metrics ADDR: at most this many open connections to it; more are refused at once
    /// (503). Its connections also close after --header-timeout-secs without a request.
    #[arg(long, value_name = "N", default_value_t = crate::listen::metrics::DEFAULT_MAX_CONNECTIONS)]
    pub metrics_max_connections: usize,

    /// Fit results to this client's profile (claude-code, codex, opencode, copilot-cli,
    /// gemini-cli, vscode, claude-desktop, or a policy's [client."NAME"]) whatever
    /// clientInfo.name the client sends. Default: the profile of the client that initializes.
    #[arg(long, value_name = "NAME")]
    pub client: Option<String>,

    /// The result cache's limit in bytes, for all sessions together: later pages of a paged
    /// result are served from it (least recently used evicted first). Overrides the policy's
    /// budget.cache_bytes; default 64 MiB.
    #[arg(long, value_name = "BYTES")]
    pub cache_bytes: Option<usize>,

    /// The file holding the cursor key, so that cursors survive a restart (made, mode 0600, when
    /// missing). Default: $XDG_STATE_HOME/mcp-budget/cursor.key (~/.local/state/…); a policy's
    /// cursor_key_env takes precedence.
    #[arg(long, value_name = "FILE")]
    pub cursor_key_file: Option<PathBuf>,

    /// How long a paged result stays in the cache, in seconds. Overrides the policy's
    /// budget.cache_ttl_secs; default 600.
    #[arg(long, value_name = "SECS")]
    pub cache_ttl_secs: Option<u64>,

    /// Where later pages are kept: `memory` (this process; the default), or a Redis-protocol
    /// server shared by replicas: redis://host:port/db, rediss://host:port/db (TLS) or
    /// unix:///path/to/redis.sock. A URL with a password goes in MCP_BUDGET_CACHE, not here.
    #[arg(
        long,
        value_name = "URL",
        env = "MCP_BUDGET_CACHE",
        hide_env_values = true
    )]
    pub cache: Option<String>,

    /// The environment variable that holds the shared cache's password (instead of a URL
    /// with one).
    #[arg(long, value_name = "VAR")]
    pub cache_password_env: Option<String>,

    /// The bound of one shared-cache read, in milliseconds (a write adds a second per 8 MiB);
    /// past it, the call goes on as a cache miss.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub cache_timeout_ms: u64,

    /// The bytes one principal (a token, an address) may write to the shared cache within
    /// the cache's TTL; past it, its chains stay in the memory of the replica that cut them.
    #[arg(long, value_name = "BYTES", default_value_t = crate::remote::DEFAULT_QUOTA)]
    pub cache_quota_bytes: u64,

    /// /healthz answers 503 while the shared cache does not answer (by default a replica stays
    /// in service without it, serving what its memory holds).
    #[arg(long)]
    pub cache_required: bool,

    /// Refuse messages larger than this many bytes with a clear error (default 64 MiB).
    #[arg(long, value_name = "BYTES", default_value_t = crate::wire::framing::DEFAULT_MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,

    /// How long the server may take to exit once its stdin is closed, before it is terminated.
    #[arg(long, value_name = "MS", default_value_t = 3000)]
    pub shutdown_grace_ms: u64,

    /// Answer a request the server has not answered within this many seconds with an error,
    /// and send the server `notifications/cancelled` for it. Default: no timeout.
    #[arg(long, value_name = "SECS")]
    pub request_timeout_secs: Option<f64>,

    /// Restart a stdio server that crashes (`on-failure`): requests in flight get errors, the
    /// new server is initialized with the client's original `initialize`, and the client gets
    /// `notifications/tools/list_changed`. Default: `never` (a crash ends the session).
    #[arg(long, value_name = "WHEN", value_enum, default_value_t = Restart::Never)]
    pub restart: Restart,

    /// Answer `initialize` with an error when the server has not answered it within this many
    /// seconds (a server that never comes up must not hang its client).
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub initialize_timeout_secs: f64,

    /// The server's protocol era: `auto` learns it (a `server/discover` probe, as a dual-era
    /// client does, or a refused `initialize`), `modern` (2026-07-28) or `legacy` (2025-11-25
    /// and earlier) take it as given. When a client speaks the other era, mcp-budget bridges
    /// the two (see the README, "Which client works with which server").
    #[arg(long, value_name = "ERA", default_value = "auto", value_parser = clap::value_parser!(crate::era::bridge::EraChoice))]
    pub server_era: crate::era::bridge::EraChoice,

    /// The clients' protocol era: `auto` serves both, each request in its own era (a request
    /// with the 2026-07-28 `_meta` statelessly, an `initialize` as a session); `modern` refuses
    /// `initialize` (-32022, naming 2026-07-28); `legacy` answers 2026-07-28 requests as a
    /// legacy server does (`server/discover` unknown, other requests told to send
    /// `initialize`), so that a dual-era client falls back to a session.
    #[arg(long, value_name = "ERA", default_value = "auto", value_parser = clap::value_parser!(crate::era::bridge::EraChoice))]
    pub client_era: crate::era::bridge::EraChoice,

    /// A legacy server's request for input (elicitation, sampling, roots) reaches a modern
    /// client as an `input_required` result; the call waits upstream this many seconds for
    /// the client's retry, then is cancelled.
    #[arg(long, value_name = "SECS", default_value_t = 300.0)]
    pub input_timeout_secs: f64,

    /// At most this many requests in flight per session; more get an error until answers come.
    #[arg(long, value_name = "N", default_value_t = crate::relay::DEFAULT_MAX_IN_FLIGHT)]
    pub max_in_flight: usize,

    /// With --upstream: once the server begins sending a message (a JSON body or one SSE
    /// event), it must finish within this many seconds; else the connection is dropped and the
    /// requests it carried get an error.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub upstream_read_timeout_secs: f64,

    /// Listen for clients over Streamable HTTP at this URL instead of stdio,
    /// e.g. http://127.0.0.1:8080/mcp (port 0 picks a free port; the address is printed).
    #[arg(long, value_name = "URL")]
    pub listen: Option<String>,

    /// Reach the server over Streamable HTTP at this URL instead of starting a command.
    #[arg(long, value_name = "URL", conflicts_with = "server")]
    pub upstream: Option<String>,

    /// A header sent with every upstream HTTP request, "Name: value"; `${VAR}` in the value is
    /// taken from the environment. Repeatable.
    #[arg(long, value_name = "HEADER", requires = "upstream")]
    pub upstream_header: Vec<String>,

    #[command(flatten)]
    pub sign_in: SignInArgs,

    /// With --listen: require `Authorization: Bearer <token>`, the token read from this
    /// environment variable. Repeatable: each variable holds one accepted token, and a session
    /// stays bound to the token that opened it.
    #[arg(long, value_name = "NAME")]
    pub auth_token_env: Vec<String>,

    /// With --listen or --metrics ADDR: another Host header value to accept (besides localhost,
    /// 127.0.0.1, `[::1]` and the bound address). Repeatable.
    #[arg(long, value_name = "HOST")]
    pub allow_host: Vec<String>,

    /// With --listen: another Origin to accept (besides http(s)://localhost, 127.0.0.1, `[::1]`
    /// on any port). Repeatable.
    #[arg(long, value_name = "ORIGIN")]
    pub allow_origin: Vec<String>,

    /// With --listen: at most this many client sessions at once (503 beyond).
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_sessions: usize,

    /// With --listen: at most this many sessions for one client (one token, or one address
    /// when no token is required), so that no client can hold every slot (429 beyond).
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub max_sessions_per_client: usize,

    /// With --listen: at most this many upstream server processes at once (one per session in
    /// front of a command); a new session beyond gets 503.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_children: usize,

    /// With --listen: requests per second per client (one token, or one address when no token
    /// is required), in bursts of up to twice that; beyond, 429 with Retry-After. 0: no limit.
    #[arg(long, value_name = "N", default_value_t = 1000.0)]
    pub rate_limit: f64,

    /// With --listen: at most this many open connections; more are refused at once (503).
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub max_connections: usize,

    /// With --listen (and --metrics ADDR): a connection must send a request's headers within
    /// this many seconds, and an idle connection is closed after it.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub header_timeout_secs: f64,

    /// Server messages of 4 MiB or more read and budgeted at once, by every session together;
    /// another waits, mid-read, until one is budgeted (its server waits on its pipe). Smaller
    /// messages never wait.
    #[arg(long, value_name = "N", default_value_t = crate::wire::framing::DEFAULT_LARGE_LINES)]
    pub max_large_results: usize,

    /// With --listen: request bodies of every client together may hold at most this many bytes
    /// while they are read and passed on (bodies under 64 KiB do not count, so small calls are
    /// never held up); past it, a body waits up to 2 s for room, then gets 503 with Retry-After.
    #[arg(long, value_name = "BYTES", default_value_t = crate::listen::DEFAULT_BODY_BYTES_IN_FLIGHT)]
    pub max_body_bytes_in_flight: usize,

    /// With --listen: a request body must arrive within this many seconds (408 beyond).
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub body_timeout_secs: f64,

    /// With --listen: end a session (and its upstream) after this long without a request.
    #[arg(long, value_name = "SECS", default_value_t = 1800)]
    pub session_idle_secs: u64,

    /// With --listen: serve sessions on this many threads (default: one per core). 1 runs
    /// everything on one thread, as the stdio mode always does.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,

    /// With --listen: each session keeps the event-stream messages it sent, up to this many
    /// bytes, so that a client whose stream broke can resume it (GET with Last-Event-ID).
    #[arg(long, value_name = "BYTES", default_value_t = 2 * 1024 * 1024)]
    pub replay_bytes: usize,

    /// With --listen: a POST's event stream cut before its answers waits this long for the
    /// client to resume it (clients on protocol 2025-11-25 or later); then its requests are
    /// cancelled upstream. Older clients cannot resume: theirs are cancelled at once.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub resume_secs: f64,

    /// With --listen: end a POST's event stream after this many seconds and let the client
    /// resume it with GET (SSE polling, for clients that can resume; the stream's first event
    /// tells them to wait 1 s). 0: never.
    #[arg(long, value_name = "SECS", default_value_t = 0.0)]
    pub stream_secs: f64,

    /// The server command and its arguments. `--` before it is needed only when its first word
    /// is one of mcp-budget's subcommands (`mcp-budget -- report …`); launchers that eat one `--`
    /// (npx, the MCP Inspector) still pass `mcp-budget node server.js` through. Everything after
    /// its first word belongs to the server, options included.
    #[arg(trailing_var_arg = true, value_name = "SERVER COMMAND")]
    pub server: Vec<String>,
}

/// How the proxy signs in to an upstream that requires OAuth (with --upstream, and `login`).
#[derive(Debug, Args, Clone, Default)]
pub struct SignInArgs {
    /// The client id registered for mcp-budget with the upstream's authorization server (else
    /// a client metadata document URL where the server takes one, else dynamic registration).
    #[arg(long, value_name = "ID")]
    pub upstream_client_id: Option<String>,

    /// The environment variable that holds the secret of --upstream-client-id (the secret
    /// itself never goes on the command line).
    #[arg(long, value_name = "VAR", requires = "upstream_client_id")]
    pub upstream_client_secret_env: Option<String>,

    /// A Client ID Metadata Document URL (https) to sign in with, as the client id, where the
    /// authorization server supports those.
    #[arg(long, value_name = "URL")]
    pub upstream_client_metadata_url: Option<String>,

    /// The port the browser is sent back to, http://127.0.0.1:PORT/callback (default: one the
    /// system picks), for an authorization server that takes only the redirect registered for
    /// a pre-registered client.
    #[arg(long, value_name = "PORT")]
    pub upstream_redirect_port: Option<u16>,

    /// How long a request waits while the sign-in is completed in the browser; after that it
    /// gets an error naming `mcp-budget login <URL>` (the sign-in itself waits on).
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub upstream_sign_in_wait_secs: f64,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the built-in policies and the servers each one is written for.
    Policies,
    /// Validate a policy file without starting anything (exit 2 with the error's position).
    Check {
        /// The policy (TOML).
        file: PathBuf,
        /// Also check the rules against the tools/call results of this recording: each
        /// rule's items path that matches nothing there is reported.
        #[arg(long, value_name = "FILE.jsonl")]
        recording: Option<PathBuf>,
    },
    /// Print the descriptor a client sees for one tool under a policy.
    ///
    /// The upstream descriptor comes from a JSON file (`--descriptor`: one tool, a tools/list
    /// result or response) or from a live server given after `--`. The policy it runs under
    /// goes to stderr.
    Explain {
        /// The policy: a TOML file, builtin:NAME or none (the same as --policy).
        #[arg(value_name = "POLICY")]
        file: Option<PathBuf>,
        /// The policy: a TOML file, builtin:NAME or none. Without it, as the proxy: the
        /// built-in policy for the server's serverInfo.name (a live server after `--`), else
        /// automatic paging only.
        #[arg(long, value_name = "FILE", conflicts_with = "file")]
        policy: Option<PathBuf>,
        /// The tool to explain.
        #[arg(long)]
        tool: String,
        /// As this client sees it (a profile such as codex, or a clientInfo.name), with the
        /// page sizes it gets.
        #[arg(long, value_name = "NAME")]
        client: Option<String>,
        /// A JSON file with the upstream descriptor(s).
        #[arg(long, value_name = "FILE", conflicts_with = "server")]
        descriptor: Option<PathBuf>,
        /// The server command, after `--`.
        #[arg(last = true, value_name = "SERVER COMMAND")]
        server: Vec<String>,
    },
    /// Run the proxy (any transports, any policy) and record every message to a JSONL file.
    Record {
        /// The recording to write (JSONL; written as FILE.partial, renamed when the session ends).
        #[arg(long, value_name = "FILE.jsonl")]
        out: PathBuf,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Serve a recording as an MCP server (stdio, or --listen), answering from the file.
    #[command(
        mut_arg("upstream", |a| a.hide(true)),
        mut_arg("upstream_header", |a| a.hide(true)),
        mut_arg("upstream_read_timeout_secs", |a| a.hide(true)),
        mut_arg("upstream_client_id", |a| a.hide(true)),
        mut_arg("upstream_client_secret_env", |a| a.hide(true)),
        mut_arg("upstream_client_metadata_url", |a| a.hide(true)),
        mut_arg("upstream_sign_in_wait_secs", |a| a.hide(true)),
        mut_arg("upstream_redirect_port", |a| a.hide(true)),
        mut_arg("restart", |a| a.hide(true)),
        mut_arg("server", |a| a.hide(true)),
        mut_arg("policy", |a| a.help(
            "Budget policy: a TOML file, `builtin:NAME` or `none`. Without it, replay applies no \
             budget: each result is returned exactly as the server returned it, however large"
        )),
        mut_arg("client", |a| a.help(
            "Fit results to this client's profile (as the proxy does live); without it and \
             without --policy, results pass as recorded"
        )),
    )]
    Replay {
        /// The recording (from `mcp-budget record`).
        file: PathBuf,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Put mcp-budget in front of every MCP server of a client's configuration.
    ///
    /// A stdio entry becomes `mcp-budget [--client NAME] -- <its command>`; a remote one
    /// (Streamable HTTP) a stdio entry running `mcp-budget --upstream URL`, its header values
    /// moved into the entry's environment. Nothing else in the file changes; a backup is written
    /// next to it (FILE.mcp-budget.bak); `mcp-budget unwrap` undoes it from the entries alone.
    Wrap(WrapArgs),
    /// Take mcp-budget out of a client's configuration: every entry `wrap` changed is put back
    /// exactly as it was.
    Unwrap(WrapArgs),
    /// Sign in to an upstream that requires OAuth, now (a browser opens; the URL is printed
    /// too). The proxy then uses the kept sign-in for `--upstream URL` without asking.
    Login {
        /// The upstream's URL, as given to --upstream.
        url: String,
        #[command(flatten)]
        sign_in: SignInArgs,
    },
    /// Forget the sign-in kept for an upstream (its tokens and client).
    Logout {
        /// The upstream's URL, as given to --upstream.
        url: String,
    },
    /// Propose a starting policy (commented TOML) from a recording.
    Suggest {
        /// The recording (from `mcp-budget record`).
        file: PathBuf,
        /// Tools whose largest result is smaller than this get no rule.
        #[arg(long, value_name = "BYTES", default_value_t = 10_000)]
        min_bytes: usize,
    },
    /// Forecast a recorded session through the proxy: for every tools/call, the pages the
    /// client gets, the bytes its model reads of each, and refusals (with bytes and tokens sent
    /// by the server and received by the client).
    Report {
        /// The recording (from `mcp-budget record`).
        file: PathBuf,
        /// The policy: a TOML file, builtin:NAME or none (automatic paging only). Without it,
        /// as the proxy: the built-in policy for the recorded serverInfo.name, else none.
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// As this client gets it (a profile such as codex, or a clientInfo.name). Without it:
        /// the clientInfo.name the recording's initialize sent.
        #[arg(long, value_name = "NAME")]
        client: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// The arguments of `wrap` and `unwrap`.
#[derive(Debug, Args, Clone)]
pub struct WrapArgs {
    /// The configuration file (its client is known by its name: .mcp.json, ~/.claude.json,
    /// claude_desktop_config.json, .cursor/mcp.json, .vscode/mcp.json, config.toml,
    /// .gemini/settings.json, opencode.json).
    pub file: Option<PathBuf>,
    /// The client: claude-code, claude-desktop, cursor, vscode, codex, gemini-cli, opencode.
    /// Without FILE, every file where that client keeps servers (the project's, in the current
    /// folder, and the user's).
    #[arg(long, value_name = "NAME")]
    pub client: Option<String>,
    /// Print a unified diff and what would change; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Only these servers (by their name in the file): `--only a,b` or `--only a --only b`.
    #[arg(long, value_name = "NAME,…", value_delimiter = ',')]
    pub only: Vec<String>,
    /// Every server but these: `--except a,b` or `--except a --except b`.
    #[arg(long, value_name = "NAME,…", value_delimiter = ',')]
    pub except: Vec<String>,
    /// With wrap: the command that starts mcp-budget in the wrapped entries, e.g.
    /// "uvx --from mcp-budget-proxy==0.1.0 mcp-budget". Default: the launcher that ran this mcp-budget (uvx, npx, pipx
    /// run), else `mcp-budget` when it is on PATH, else this executable's path.
    #[arg(long, value_name = "COMMAND")]
    pub launcher: Option<String>,
}
