//! The example fleet server: an rmcp stdio MCP server that returns a verbose fleet record.
//!
//! Tools: `fleet_show` (every stream), `wave_show` (the streams of one wave) and
//! `stream_detail` (one stream with its event log). It knows nothing of budgets: it returns
//! everything, every time — which is what mcp-budget is for.
//!
//! ```text
//! cargo run --example fleet_server -- --streams 68 --seed 7 [--churn N]
//! ```
//!
//! With `--churn N`, every `fleet_show` call first advances N live streams by one state
//! (running → gated → blocked → merged), as a real fleet moves between two pages.

#[path = "fleet/record.rs"]
mod record;

use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};

struct FleetServer {
    streams: Mutex<Vec<Value>>,
    header: Value,
    /// Live streams advanced per `fleet_show` call.
    churn: usize,
    /// `fleet_show` calls so far (picks which streams advance).
    calls: Mutex<usize>,
}

impl FleetServer {
    fn streams(&self) -> std::sync::MutexGuard<'_, Vec<Value>> {
        self.streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Advances `churn` live streams by one state, deterministically.
    fn advance(&self) {
        if self.churn == 0 {
            return;
        }
        let call = {
            let mut calls = self
                .calls
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *calls += 1;
            *calls
        };
        let mut streams = self.streams();
        let n = streams.len();
        let mut moved = 0;
        for k in 0..n {
            if moved == self.churn {
                break;
            }
            let stream = &mut streams[(call * 7919 + k * 31) % n];
            let next = match stream["state"].as_str() {
                Some("running") => "gated",
                Some("gated") => "blocked",
                Some("blocked") => "merged",
                _ => continue,
            };
            stream["state"] = json!(next);
            moved += 1;
        }
    }
}

fn object(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}

fn stream_schema() -> Value {
    let gate = json!({
        "type": "object",
        "properties": {
            "gate": {"type": "string"},
            "verdict": {"type": "string", "enum": ["pass", "hold", "fail"]},
            "at": {"type": "string"},
            "by": {"type": "string"},
            "justification": {"type": "string"},
            "evidence": {"type": "array", "items": {"type": "string"}},
            "checks": {"type": "array", "items": {"type": "object"}}
        },
        "required": ["gate", "verdict", "at", "by", "justification", "evidence", "checks"]
    });
    json!({
        "type": "object",
        "properties": {
            "stream_id": {"type": "string"},
            "title": {"type": "string"},
            "state": {"type": "string", "enum": ["running", "gated", "blocked", "merged", "closed-without-merge"]},
            "owner": {"type": "string"},
            "wave": {"type": "string"},
            "branch": {"type": "string"},
            "base_commit": {"type": "string"},
            "head_commit": {"type": "string"},
            "created_at": {"type": "string"},
            "updated_at": {"type": "string"},
            "labels": {"type": "array", "items": {"type": "string"}},
            "depends_on": {"type": "array", "items": {"type": "string"}},
            "last_gate": gate,
            "gate_history": {"type": "array", "items": gate},
            "liveness": {
                "type": "object",
                "properties": {
                    "status": {"type": "string"},
                    "heartbeat_at": {"type": "string"},
                    "lease_expires_at": {"type": "string"},
                    "lease_id": {"type": "string"},
                    "host": {"type": "string"},
                    "pid": {"type": "integer"},
                    "heartbeats": {"type": "array", "items": {"type": "object"}}
                },
                "required": ["status", "heartbeat_at", "lease_expires_at", "lease_id", "host", "pid", "heartbeats"]
            }
        },
        "required": ["stream_id", "title", "state", "owner", "wave", "branch", "created_at",
                     "updated_at", "last_gate", "gate_history", "liveness"]
    })
}

fn tools() -> Vec<Tool> {
    let fleet_output = json!({
        "type": "object",
        "properties": {
            "fleet": {"type": "string"},
            "generated_at": {"type": "string"},
            "record_version": {"type": "integer"},
            "stream_count": {"type": "integer"},
            "waves": {"type": "array", "items": {"type": "object"}},
            "streams": {"type": "array", "items": stream_schema()}
        },
        "required": ["fleet", "generated_at", "stream_count", "waves", "streams"]
    });
    vec![
        Tool::new(
            "fleet_show",
            "Show the fleet: every stream with its state, owner, wave, branch, last gate \
             (with the reviewer's justification), gate history and liveness block.",
            object(json!({"type": "object", "properties": {}})),
        )
        .with_raw_output_schema(object(fleet_output)),
        Tool::new(
            "wave_show",
            "Show one wave: every stream of that wave, in full.",
            object(json!({
                "type": "object",
                "properties": {"wave": {"type": "string", "description": "Wave name, e.g. \"w2\""}},
                "required": ["wave"]
            })),
        ),
        Tool::new(
            "stream_detail",
            "Show one stream in full, with its event log.",
            object(json!({
                "type": "object",
                "properties": {"stream_id": {"type": "string", "description": "e.g. \"st-0007\""}},
                "required": ["stream_id"]
            })),
        ),
    ]
}

fn argument<'a>(request: &'a CallToolRequestParams, name: &str) -> Option<&'a str> {
    request.arguments.as_ref()?.get(name)?.as_str()
}

fn error(text: String) -> CallToolResponse {
    CallToolResult::error(vec![ContentBlock::text(text)]).into()
}

impl FleetServer {
    fn fleet_show(&self) -> CallToolResponse {
        self.advance();
        let mut record = self.header.clone();
        if let Value::Object(map) = &mut record {
            map.insert("streams".into(), Value::Array(self.streams().to_vec()));
        }
        CallToolResult::structured(record).into()
    }

    fn wave_show(&self, wave: Option<&str>) -> CallToolResponse {
        let Some(wave) = wave else {
            return error("wave_show needs a \"wave\" argument, e.g. {\"wave\":\"w1\"}".into());
        };
        let streams: Vec<Value> = self
            .streams()
            .iter()
            .filter(|s| s["wave"] == wave)
            .cloned()
            .collect();
        if streams.is_empty() {
            return error(format!("no wave named {wave:?}"));
        }
        CallToolResult::structured(
            json!({"wave": wave, "stream_count": streams.len(), "streams": streams}),
        )
        .into()
    }

    fn stream_detail(&self, id: Option<&str>) -> CallToolResponse {
        let Some(id) = id else {
            return error("stream_detail needs a \"stream_id\" argument".into());
        };
        let Some(stream) = self
            .streams()
            .iter()
            .find(|s| s["stream_id"] == id)
            .cloned()
        else {
            return error(format!("no stream named {id:?}"));
        };
        let mut rng = record::Rng::new(id.bytes().map(u64::from).sum());
        let events: Vec<Value> = (0..rng.range(20, 40))
            .map(|k| {
                json!({
                    "at": record::timestamp(k as i64 * 47),
                    "kind": rng.pick(&["heartbeat", "gate", "push", "rebase", "comment"]),
                    "by": stream["owner"],
                    "detail": format!("event {k} on {id}: {}", rng.pick(&["ok", "retried", "held for review", "rebased onto main"])),
                })
            })
            .collect();
        CallToolResult::structured(json!({"stream": stream, "events": events})).into()
    }
}

impl ServerHandler for FleetServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "fleet-server",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions("A fleet of work streams. fleet_show lists every stream.")
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        Ok(match request.name.as_ref() {
            "fleet_show" => self.fleet_show(),
            "wave_show" => self.wave_show(argument(&request, "wave")),
            "stream_detail" => self.stream_detail(argument(&request, "stream_id")),
            other => error(format!(
                "unknown tool {other:?}; try fleet_show, wave_show or stream_detail"
            )),
        })
    }
}

fn parse_args() -> Result<(usize, u64, usize), String> {
    let mut streams = 68;
    let mut seed = 7;
    let mut churn = 0;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--streams" => {
                streams = value("--streams")?
                    .parse()
                    .map_err(|e| format!("--streams: {e}"))?
            }
            "--seed" => {
                seed = value("--seed")?
                    .parse()
                    .map_err(|e| format!("--seed: {e}"))?
            }
            "--churn" => {
                churn = value("--churn")?
                    .parse()
                    .map_err(|e| format!("--churn: {e}"))?
            }
            "--help" | "-h" => {
                return Err(
                    "usage: fleet_server [--streams N (default 68)] [--seed S (default 7)] [--churn N (default 0)]".into(),
                );
            }
            other => return Err(format!("unknown argument {other:?}; try --help")),
        }
    }
    Ok((streams, seed, churn))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let (count, seed, churn) = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("fleet_server: {message}");
            std::process::exit(2);
        }
    };
    let mut header = record::fleet_show(0, seed);
    let streams = record::streams(count, seed);
    if let Value::Object(map) = &mut header {
        map.insert("stream_count".into(), json!(streams.len()));
        map.insert("waves".into(), Value::Array(record::waves(&streams)));
    }
    let server = FleetServer {
        streams: Mutex::new(streams),
        header,
        churn,
        calls: Mutex::new(0),
    };
    let running = server.serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}
