//! Traces (`--otlp-endpoint URL`): a span per client request, exported over OTLP/HTTP (JSON).
//!
//! Each span is named after the method and carries `mcp.method`, `mcp.tool`, `mcp.bytes_in`,
//! `mcp.bytes_out` and `mcp.budget` (what the budget did: `passed`, `paged`, `refused`,
//! `answered by the proxy`). A request whose `params._meta.traceparent` holds W3C trace
//! context is a child of that span; the request itself goes upstream unchanged, traceparent and
//! all. Off unless asked for (no span is made), and built only with the `otlp` feature (on by
//! default).

use std::sync::atomic::{AtomicBool, Ordering};

use tracing::Span;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// The tracing target of request spans (only the OTLP layer takes it).
pub const TARGET: &str = "mcp_budget::trace";

/// Whether request spans are made.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The span of one client request (`Span::none()` when traces are off).
pub fn request_span(method: &str, message: &[u8]) -> Span {
    if !enabled() {
        return Span::none();
    }
    // One read of the request for both: the tool's name and the caller's trace context (the
    // rest of the message is skipped unread).
    let parts = RequestParts::read(message);
    let tool = if method == "tools/call" {
        parts.tool.as_deref().unwrap_or_default()
    } else {
        ""
    };
    let span = tracing::info_span!(
        target: TARGET,
        "mcp.request",
        otel.name = %method,
        otel.kind = "server",
        mcp.method = %method,
        mcp.tool = %tool,
        mcp.bytes_in = message.len() as u64,
        mcp.bytes_out = tracing::field::Empty,
        mcp.budget = tracing::field::Empty,
    );
    #[cfg(feature = "otlp")]
    if let Some(parent) = &parts.traceparent {
        otlp::set_parent(&span, parent);
    }
    span
}

/// Ends a request's span with what reached the client.
pub fn finish(span: &Span, bytes_out: usize, budget: &str) {
    span.record("mcp.bytes_out", bytes_out as u64);
    span.record("mcp.budget", budget);
}

/// What a span takes from a request: `params.name` and `params._meta.traceparent`.
#[derive(Default)]
struct RequestParts {
    tool: Option<String>,
    traceparent: Option<String>,
}

impl RequestParts {
    fn read(message: &[u8]) -> RequestParts {
        #[derive(serde::Deserialize)]
        struct Call {
            params: Option<Params>,
        }
        #[derive(serde::Deserialize)]
        struct Params {
            name: Option<String>,
            #[serde(rename = "_meta")]
            meta: Option<Meta>,
        }
        #[derive(serde::Deserialize)]
        struct Meta {
            traceparent: Option<String>,
        }
        let Some(params) = serde_json::from_slice::<Call>(message)
            .ok()
            .and_then(|c| c.params)
        else {
            return RequestParts::default();
        };
        RequestParts {
            tool: params.name,
            traceparent: params.meta.and_then(|m| m.traceparent),
        }
    }
}

#[cfg(feature = "otlp")]
pub use otlp::{Exporter, init};

#[cfg(feature = "otlp")]
mod otlp {
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    /// The exporter; [`Exporter::shutdown`] sends what is left before the process ends.
    pub struct Exporter(SdkTracerProvider);

    impl Exporter {
        pub fn shutdown(self) {
            if let Err(err) = self.0.shutdown() {
                tracing::warn!(%err, "the last spans could not be exported");
            }
        }
    }

    /// Starts exporting to `endpoint` (the full OTLP/HTTP traces URL, e.g.
    /// `http://127.0.0.1:4318/v1/traces`); the layer to add to the subscriber.
    pub fn init<S>(
        endpoint: &str,
    ) -> Result<
        (
            Exporter,
            tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>,
        ),
        String,
    >
    where
        S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    {
        // The exporter's HTTP client (reqwest, rustls) needs the process's crypto provider; an
        // Err says one is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpJson)
            .with_endpoint(endpoint)
            .build()
            .map_err(|e| format!("--otlp-endpoint {endpoint}: {e}"))?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name("mcp-budget")
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("mcp-budget");
        super::ENABLED.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok((
            Exporter(provider),
            tracing_opentelemetry::layer().with_tracer(tracer),
        ))
    }

    /// Makes `span` a child of the W3C trace context `traceparent`.
    pub fn set_parent(span: &tracing::Span, traceparent: &str) {
        let carrier =
            std::collections::HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
        let context = TraceContextPropagator::new().extract(&carrier);
        if let Err(err) = span.set_parent(context) {
            tracing::debug!(?err, "the request's traceparent was not taken");
        }
    }
}
