//! mcp-budget: a proxy that puts a response budget in front of any MCP server.
//!
//! # Layout
//!
//! - [`framing`]: bytes ⇄ newline-delimited frames, with a size limit that never buffers an
//!   oversized message (it reads just its `id` to answer it); a server's large messages (4 MiB
//!   and more) are read and budgeted a few at a time, process-wide.
//! - [`message`]: the JSON-RPC envelope (`id`, `method`, request/notification/response, and a
//!   modern request's `_meta`), read once; a key the proxy decides on named twice, an id that is
//!   no id, nesting past 128 make a message malformed; ids compare as values. Read
//!   without copying or re-serializing the message; in-place edits of an id.
//! - [`jsonrpc`]: every message the proxy writes itself, from typed builders.
//! - [`era`]: the 2026-07-28 era where results are read and written: `resultType`, only
//!   complete results budgeted, `cacheScope` on lists fitted to one client.
//! - [`bridge`]: the era bridge: a client of one era in front of a server of the other (the
//!   server's era learned and kept per origin; `initialize` ⇄ `server/discover`, results made
//!   modern or legacy, MRTR ⇄ server requests); its state per session lives in [`relay`].
//! - [`subscriptions`]: `subscriptions/listen` served for modern clients in front of a legacy
//!   server (the filter granted by its capabilities, URIs subscribed upstream once, each
//!   notification tagged for every listen that asked for it).
//! - [`queue`]: the queues between tasks, bounded in bytes (backpressure, not memory).
//! - [`relay`]: the transport-free core of one session: routes each frame, remembers requests in
//!   flight (ids that cannot cross), and answers them with errors when the server goes away.
//! - [`intercept`]: the two interception points, `tools/list` responses and `tools/call` calls,
//!   where the budget is applied to the bytes of one message.
//! - [`session`]: the session driver every transport runs: server messages through the relay to
//!   a [`session::ClientSide`], timeouts, restarts.
//! - [`policy`]: the TOML policy, read strictly and resolved into rules.
//! - [`budget`]: the budget itself — argument checks, cursors, the pure pipeline stages
//!   (horizon, filter, page, project, render, cap), [`budget::reduce`] (a large list narrowed
//!   where it lies in the server's text, so the stages run on the page alone) and the
//!   descriptor rewrite.
//! - [`canonical`]: canonical JSON and its digest (cursor selections, replay matching).
//! - [`upstream`]: the server side behind one interface: [`upstream::child`], a child process
//!   in its own process group, [`upstream::supervise`] (restart on failure),
//!   [`upstream::http`], a Streamable HTTP endpoint read under limits ([`upstream::body`]), and
//!   [`upstream::replay`], a recording.
//! - [`stdio`]: a client on stdin/stdout: reads its frames, writes its lines, runs the driver.
//! - [`listen`]: clients over Streamable HTTP: a session manager (one relay and one upstream
//!   per session, and one stateless session per principal for 2026-07-28 requests; limits,
//!   idle expiry, resumable streams: event ids, a bounded replay log, parked streams) and the
//!   handlers with the security checks (and a modern request's header checks); the Host guard
//!   ([`listen::guard`]) and the standalone `/metrics` endpoint ([`listen::metrics`]).
//! - [`heavy`]: a pool for the budget's heavy work (large results) off the I/O threads.
//! - [`recording`]: the JSONL recording, written without blocking the relay and read back.
//! - [`regular`]: policies and recordings are read only from regular files, within bounds.
//! - [`replay`]: a recording answering requests like the server did.
//! - [`search`]: `mcp_budget_search`, the proxy's own tool that searches a cached paged result.
//! - [`task_token`]: what a 2026-07-28 client is shown for a task id: the server's id and the
//!   call that made the task, sealed under the cursor key and bound to the principal.
//! - [`report`]: what a policy would do to the `tools/call` results of a recording.
//! - [`suggest`]: a starting policy proposed from a recording.
//! - [`explain`]: `check` and `explain`: what a policy is, and what it does to a descriptor.
//! - [`client`]: client profiles: the budget each MCP client shows its model in full, from
//!   `clientInfo.name` (cited), overridable in the policy; [`tokens`]: token and line budgets
//!   (o200k, counted only near the edge).
//! - [`builtin`]: the shipped policies, compiled in and picked by the server's `serverInfo.name`.
//! - [`budget::cache`]: the per-session result cache of automatically paged results, bounded in
//!   bytes and shared fairly among sessions.
//! - [`reload`]: the budget every session reads, replaced on SIGHUP or `--watch`.
//! - [`metrics`]: the Prometheus metrics registry (`--metrics`); [`traces`]: a span per request
//!   over OTLP.
//! - [`wrap`]: `wrap`/`unwrap`, the proxy put in front of every server of a client's
//!   configuration file and taken out again: one file per syntax (JSON/JSONC on a concrete
//!   syntax tree, TOML with toml_edit), the clients' formats cited, the undo marker.
//! - [`cli`]: the command line.
//!
//! # One message through the proxy
//!
//! A client writes `{"jsonrpc":"2.0","id":4,"method":"tools/call",...}` and a newline.
//! [`stdio`]'s client task reads it with a [`framing::FrameReader`] and hands the frame to
//! [`relay::Relay::from_client`], which reads its envelope with [`message::parse`], gives a
//! `tools/call` to [`intercept::Interceptor::tools_call_request`], records id 4 as in flight and
//! returns the bytes to send upstream — the very bytes that arrived unless the hook rewrote them —
//! as an [`upstream::Outgoing`], with the request ids and methods read on the way, so that no
//! transport reads the message again. They go to the [`upstream::Upstream`]'s sender: a child's
//! stdin, or an HTTP POST.
//! The server's reply comes back as an [`upstream::Event`] through [`relay::Relay::from_server`],
//! which matches id 4, passes the result to [`intercept::Interceptor::tools_call_response`] —
//! which runs [`budget::Budget::finish_call_raw`]: the page of items the call asked for
//! (narrowed where it lies, [`budget::reduce`]), rendered with the server's own bytes and capped — and returns the bytes for the client's writer task (or, with [`listen`], for
//! the SSE stream of the POST that carried id 4). Any message that is not intercepted
//! (notifications, server requests such as sampling, unknown methods) is forwarded as the exact
//! bytes it arrived as. With a [`recording::Recorder`], each step is also written to the recording.

#![forbid(unsafe_code)]

/// Whether `haystack` holds `needle` (a byte-string literal), by a searcher built once per
/// call site (building one costs more than a short search: hundreds of instructions).
macro_rules! holds {
    ($haystack:expr, $needle:expr) => {{
        static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
            std::sync::LazyLock::new(|| memchr::memmem::Finder::new($needle));
        FINDER.find($haystack).is_some()
    }};
}
pub(crate) use holds;

pub mod bridge;
pub mod budget;
pub mod builtin;
pub mod canonical;
pub mod cli;
pub mod client;
pub mod era;
pub mod explain;
pub mod framing;
pub mod heavy;
pub mod intercept;
pub mod jsonrpc;
pub mod keyfile;
pub mod listen;
pub mod message;
pub mod metrics;
pub mod policy;
pub mod protocol;
pub mod queue;
pub mod quiet;
pub mod recording;
pub mod regular;
pub mod relay;
pub mod reload;
pub mod remote;
pub mod replay;
pub mod report;
pub mod search;
pub mod session;
pub mod stdio;
pub mod subscriptions;
pub mod suggest;
pub mod task_token;
pub mod tokens;
pub mod traces;
pub mod upstream;
pub mod wrap;
