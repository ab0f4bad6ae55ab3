//! Prometheus metrics (`--metrics ADDR`): what the budget saved, per tool, and how the proxy runs.
//!
//! Off unless asked for: every recording point is one check of a `OnceLock`. Labels stay bounded:
//! a tool label is a name the session's `tools/list` gave (`(unlisted)` for any other name a
//! client sends, `(other)` past [`MAX_TOOLS`] names), never a client's free text.
//!
//! This is the registry only: it is served by the HTTP edge, on an address of its own
//! ([`crate::listen::metrics`]) or on the `--listen` address.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// At most this many tool names become labels.
pub const MAX_TOOLS: usize = 512;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolLabel {
    pub tool: String,
}

/// Why a call was refused.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Class {
    /// `result-too-large`: over the budget and not pageable.
    result_too_large,
    /// A budget argument the model must fix.
    bad_arguments,
    /// A cursor whose result left the cache, for a tool that is not re-called.
    expired_cursor,
    /// A cursor that is malformed, altered, another query's or another key's.
    invalid_cursor,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabel {
    pub tool: String,
    pub class: Class,
}

/// A shared-cache failure: the operation (`get`, `put`, `ping`) and what went wrong
/// (`timeout`, `error`, `quota`, `sealed`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RemoteLabel {
    pub op: &'static str,
    pub class: &'static str,
}

/// Every metric the proxy keeps.
pub struct Metrics {
    registry: Registry,
    pub calls: Family<ToolLabel, Counter>,
    pub upstream_bytes: Family<ToolLabel, Counter>,
    pub delivered_bytes: Family<ToolLabel, Counter>,
    pub tokens_saved: Family<ToolLabel, Counter>,
    pub pages: Family<ToolLabel, Counter>,
    pub refusals: Family<RefusalLabel, Counter>,
    pub cache_hits: Family<ToolLabel, Counter>,
    pub cache_misses: Family<ToolLabel, Counter>,
    pub cache_evictions: Counter,
    pub sessions: Gauge,
    pub upstream_latency: Histogram,
    pub upstream_restarts: Counter,
    pub bad_input: Counter,
    /// Server messages dropped because the proxy could not classify them.
    pub server_dropped: Counter,
    pub remote_hits: Counter,
    pub remote_misses: Counter,
    pub remote_errors_by: Family<RemoteLabel, Counter>,
    pub remote_written_bytes: Counter,
    /// Bytes result references put into calls in place of the references.
    pub reference_bytes: Counter,
    /// The tool names already used as labels.
    tools: Mutex<HashSet<String>>,
}

static METRICS: OnceLock<Metrics> = OnceLock::new();

/// Turns metrics on (once; later calls return the same).
pub fn enable() -> &'static Metrics {
    METRICS.get_or_init(Metrics::new)
}

/// The metrics, when they are on.
pub fn get() -> Option<&'static Metrics> {
    METRICS.get()
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("mcp_budget");
        let metrics = Metrics {
            calls: Family::default(),
            upstream_bytes: Family::default(),
            delivered_bytes: Family::default(),
            tokens_saved: Family::default(),
            pages: Family::default(),
            refusals: Family::default(),
            cache_hits: Family::default(),
            cache_misses: Family::default(),
            cache_evictions: Counter::default(),
            sessions: Gauge::default(),
            upstream_latency: Histogram::new([
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
            upstream_restarts: Counter::default(),
            bad_input: Counter::default(),
            server_dropped: Counter::default(),
            remote_hits: Counter::default(),
            remote_misses: Counter::default(),
            remote_errors_by: Family::default(),
            remote_written_bytes: Counter::default(),
            reference_bytes: Counter::default(),
            tools: Mutex::new(HashSet::new()),
            registry: Registry::default(),
        };
        registry.register(
            "tool_calls",
            "tools/call requests, per tool",
            metrics.calls.clone(),
        );
        registry.register(
            "upstream_bytes",
            "Bytes of tool results the server sent, per tool",
            metrics.upstream_bytes.clone(),
        );
        registry.register(
            "delivered_bytes",
            "Bytes of tool results the client received, per tool (pages served from the cache included)",
            metrics.delivered_bytes.clone(),
        );
        registry.register(
            "tokens_saved",
            "Model tokens the budget kept out of the client's context, per tool: an estimate, (upstream bytes - delivered bytes) / 4, not an o200k count",
            metrics.tokens_saved.clone(),
        );
        registry.register(
            "pages",
            "Pages served (a result the proxy paged, or a later page), per tool",
            metrics.pages.clone(),
        );
        registry.register(
            "refusals",
            "Calls answered with a tool error by the proxy, per tool and class",
            metrics.refusals.clone(),
        );
        registry.register(
            "cache_hits",
            "Later pages served from the result cache, per tool",
            metrics.cache_hits.clone(),
        );
        registry.register(
            "cache_misses",
            "Later pages whose result had left the cache, per tool",
            metrics.cache_misses.clone(),
        );
        registry.register(
            "cache_evictions",
            "Results evicted from the cache to stay within its bytes",
            metrics.cache_evictions.clone(),
        );
        registry.register(
            "active_sessions",
            "Client sessions open now",
            metrics.sessions.clone(),
        );
        registry.register(
            "upstream_latency_seconds",
            "Time from a request going upstream to its answer",
            metrics.upstream_latency.clone(),
        );
        registry.register(
            "upstream_restarts",
            "Restarts of a crashed server (--restart on-failure)",
            metrics.upstream_restarts.clone(),
        );
        registry.register(
            "bad_input",
            "Client messages refused as bad input (not JSON, not JSON-RPC, over the size limit, a reused id)",
            metrics.bad_input.clone(),
        );
        registry.register(
            "server_messages_dropped",
            "Server messages dropped because the proxy could not classify them with certainty (a null or unreadable id, a duplicate key, no JSON-RPC kind)",
            metrics.server_dropped.clone(),
        );
        registry.register(
            "remote_cache_hits",
            "Later pages read from the shared cache (--cache redis://…) by a replica that did not hold their result",
            metrics.remote_hits.clone(),
        );
        registry.register(
            "remote_cache_misses",
            "Later pages the shared cache did not hold either",
            metrics.remote_misses.clone(),
        );
        registry.register(
            "remote_cache_errors",
            "Shared-cache operations that failed, by operation and class (timeout, error, quota, sealed: an entry that did not open)",
            metrics.remote_errors_by.clone(),
        );
        registry.register(
            "remote_cache_written_bytes",
            "Bytes of sealed pages written to the shared cache",
            metrics.remote_written_bytes.clone(),
        );
        registry.register(
            "reference_bytes",
            "Bytes of results put into calls in place of result references (kept out of the clients' context)",
            metrics.reference_bytes.clone(),
        );
        Metrics {
            registry,
            ..metrics
        }
    }

    /// The label for `tool`; `listed`: the session's `tools/list` named it.
    pub fn tool(&self, tool: &str, listed: bool) -> ToolLabel {
        if !listed {
            return ToolLabel {
                tool: "(unlisted)".into(),
            };
        }
        let mut tools = self.tools.lock().unwrap_or_else(PoisonError::into_inner);
        if tools.contains(tool) || tools.len() < MAX_TOOLS {
            tools.insert(tool.to_string());
            ToolLabel { tool: tool.into() }
        } else {
            ToolLabel {
                tool: "(other)".into(),
            }
        }
    }

    /// One tool result: what the server sent, what the client got, whether it was a page.
    pub fn result(&self, label: &ToolLabel, upstream: usize, delivered: usize, paged: bool) {
        self.upstream_bytes
            .get_or_create(label)
            .inc_by(upstream as u64);
        self.delivered_bytes
            .get_or_create(label)
            .inc_by(delivered as u64);
        if upstream > delivered {
            self.tokens_saved
                .get_or_create(label)
                .inc_by(((upstream - delivered) / 4) as u64);
        }
        if paged {
            self.pages.get_or_create(label).inc();
        }
    }

    pub fn refused(&self, label: &ToolLabel, class: Class) {
        self.refusals
            .get_or_create(&RefusalLabel {
                tool: label.tool.clone(),
                class,
            })
            .inc();
    }

    pub fn remote_errors(&self, op: &'static str, class: &'static str) {
        self.remote_errors_by
            .get_or_create(&RemoteLabel { op, class })
            .inc();
    }

    pub fn latency(&self, elapsed: Duration) {
        self.upstream_latency.observe(elapsed.as_secs_f64());
    }

    /// The exposition, in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(err) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(%err, "the metrics could not be written");
        }
        out
    }
}

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
