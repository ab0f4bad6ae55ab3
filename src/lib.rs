//! mcp-budget: a proxy that puts a response budget in front of any MCP server.
//!
//! # Layout
//!
//! Folders, from the wire up (each file's own doc says more; `tests/layers.rs` keeps the floors):
//!
//! - [`wire`]: JSON-RPC on the wire: [`wire::framing`] (bytes ⇄ newline-delimited frames under a
//!   size limit), [`wire::message`] (the envelope read once, ids compared as values, in-place id
//!   edits), [`wire::jsonrpc`] (every message the proxy writes itself), [`wire::canonical`].
//! - [`protocol`]: what the proxy knows of MCP: the revisions it serves and, per method, its era,
//!   input, cacheability, capability and name member.
//! - [`era`]: the 2026-07-28 era at its edge: results and headers ([`era`]), the era bridge
//!   ([`era::bridge`]), `subscriptions/listen` in front of a legacy server
//!   ([`era::subscriptions`]), sealed task ids ([`era::task_token`]).
//! - [`policy`], [`builtin`], [`client`], [`tokens`]: the TOML policy, the shipped policies, the
//!   client profiles, token and line budgets.
//! - [`budget`]: the budget itself: argument checks, cursors, the pipeline stages, automatic
//!   paging, the result cache ([`budget::cache`]) and the descriptor rewrite.
//! - [`intercept`]: `tools/list` and `tools/call` (list, call, paging, tasks), where the budget is
//!   applied to one message; [`search`]: the proxy's own search tool.
//! - [`relay`]: the transport-free core of one session: a routing core that names no era (ids
//!   in flight, batches, ends), and the era's hooks it calls (bridge, MRTR rounds, listens) in
//!   files of their own.
//! - [`session`], [`remote`]: the session driver every transport runs.
//! - [`upstream`]: the server side (child process, supervision, Streamable HTTP, a recording).
//! - [`stdio`], [`listen`]: the client side, on stdin/stdout and over Streamable HTTP (sessions,
//!   checks, streams, the Host guard and `/metrics`).
//! - [`recording`], [`replay`]: the JSONL recording, and a recording answering like the server.
//! - [`commands`]: `report`, `suggest`, `check` and `explain`; [`wrap`]: `wrap`/`unwrap` of a
//!   client's configuration file; [`cli`]: the command line.
//! - Services: [`heavy`] (the heavy-work pool), [`queue`] (queues bounded in bytes), [`reload`],
//!   [`metrics`], [`traces`], [`keyfile`], [`regular`], [`quiet`].
//!
//! # One message through the proxy
//!
//! A client writes `{"jsonrpc":"2.0","id":4,"method":"tools/call",...}` and a newline.
//! [`stdio`]'s client task reads it with a [`wire::framing::FrameReader`] and hands the frame to
//! [`relay::Relay::from_client`], which reads its envelope with [`wire::message::parse`], gives a
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

pub mod budget;
pub mod builtin;
pub mod cli;
pub mod client;
pub mod commands;
pub mod era;
pub mod heavy;
pub mod intercept;
pub mod keyfile;
pub mod listen;
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
pub mod search;
pub mod session;
pub mod stdio;
pub mod tokens;
pub mod traces;
pub mod upstream;
pub mod wire;
pub mod wrap;
