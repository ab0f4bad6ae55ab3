//! A raw-JSON MCP server that speaks only 2026-07-28 (no `initialize`, no session), for the
//! era bridge's tests: every request must carry the revision's `_meta`, as the spec requires.
//!
//! - `initialize` (or any request without `_meta["io.modelcontextprotocol/protocolVersion"]`)
//!   is refused, naming the revision it serves, as a modern-only server SHOULD;
//! - another version gets `-32022` with `data.supported`;
//! - `server/discover` names the server in `_meta`;
//! - tools: `rows` (`arguments.rows` rows as `structuredContent`, counted in
//!   `arguments.file` when given), `meta` (the request's `_meta`, as text), `ask` (an
//!   `input_required` result asking `confirm` by elicitation, with `requestState`
//!   `opaque-1`; the retry that echoes it with the answer gets `confirmed: <answer>`);
//! - a request that sets `_meta["io.modelcontextprotocol/logLevel"]` gets one
//!   `notifications/message` at `info` before its answer;
//! - with `MODERN_RESOURCES=1`: resources (`subscribe`, `listChanged`) and `tools.listChanged`
//!   offered; `subscriptions/listen` acknowledged (its filter as asked) and kept open until
//!   `notifications/cancelled` names it; tools `touch` (`notifications/resources/updated` of
//!   `arguments.uri` to each listen subscribed to it, `notifications/resources/list_changed`
//!   to each that asked, every one tagged with its listen's id), `listens` (the open
//!   listens' `resourceSubscriptions`, as JSON text), `end_listens` (each open listen
//!   ended with its completion result, as a server shutting down ends them) and `crash` (the
//!   process exits, unanswered).

use std::io::{BufRead, Write};

use serde_json::{Value, json};

const MODERN: &str = "2026-07-28";

fn send(out: &mut impl Write, message: &Value) {
    if writeln!(out, "{message}")
        .and_then(|()| out.flush())
        .is_err()
    {
        std::process::exit(0);
    }
}

fn error(id: &Value, code: i64, message: &str, data: Option<Value>) -> Value {
    let mut error = json!({"code": code, "message": message});
    if let Some(data) = data {
        error["data"] = data;
    }
    json!({"jsonrpc": "2.0", "id": id, "error": error})
}

fn result(id: &Value, mut result: Value) -> Value {
    result["resultType"] = json!("complete");
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn tools() -> Value {
    json!({"tools": [
        {"name": "rows", "description": "Rows of a table.",
         "inputSchema": {"type": "object", "properties": {"rows": {"type": "integer"}, "file": {"type": "string"}}}},
        {"name": "meta", "description": "The request's _meta.",
         "inputSchema": {"type": "object", "properties": {}}},
        {"name": "ask", "description": "Needs the user's input.",
         "inputSchema": {"type": "object", "properties": {}}},
        {"name": "research", "description": "Runs only as a task, it says; called plainly, it answers all the same.",
         "inputSchema": {"type": "object", "properties": {}}, "execution": {"taskSupport": "required"}},
        {"name": "read_rows", "description": "Rows of a table, read-only (the same rows as rows).",
         "inputSchema": {"type": "object", "properties": {"rows": {"type": "integer"}, "file": {"type": "string"}}},
         "annotations": {"readOnlyHint": true}},
        {"name": "sink", "description": "The length and SHA-256 of arguments.content.",
         "inputSchema": {"type": "object", "properties": {"content": {"type": "string"}}}}
    ], "ttlMs": 60000, "cacheScope": "public"})
}

fn call(params: &Value) -> Result<Value, (i64, String)> {
    let arguments = &params["arguments"];
    match params["name"].as_str().unwrap_or("") {
        "rows" | "read_rows" => {
            if let Some(file) = arguments["file"].as_str() {
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(file)
                    .map_err(|e| (-32603, e.to_string()))?;
                let _ = writeln!(f, "ran");
            }
            let n = arguments["rows"].as_u64().unwrap_or(10);
            let rows: Vec<Value> = (0..n)
                .map(|i| json!({"n": i, "label": format!("row {i:06} {}", "m".repeat(40))}))
                .collect();
            let text = Value::Array(rows.clone()).to_string();
            Ok(json!({"content": [{"type": "text", "text": text}], "structuredContent": rows}))
        }
        "meta" => Ok(json!({"content": [{"type": "text", "text": params["_meta"].to_string()}]})),
        "sink" => {
            use sha2::Digest;
            let content = arguments["content"].as_str().unwrap_or_default();
            let sha: String = sha2::Sha256::digest(content.as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let got = json!({"bytes": content.len(), "sha256": sha});
            Ok(
                json!({"content": [{"type": "text", "text": got.to_string()}], "structuredContent": got}),
            )
        }
        "research" => {
            Ok(json!({"content": [{"type": "text", "text": "researched, without a task"}]}))
        }
        "ask"
            if params["requestState"] == "opaque-1"
                && params["inputResponses"]["confirm"].is_object() =>
        {
            let answer = &params["inputResponses"]["confirm"];
            Ok(json!({"content": [{"type": "text", "text": format!("confirmed: {answer}")}]}))
        }
        "ask" => Ok(json!({
            "resultType": "input_required",
            "inputRequests": {"confirm": {"method": "elicitation/create", "params": {
                "mode": "form", "message": "Go on?",
                "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}}}}},
            "requestState": "opaque-1"
        })),
        other => Err((-32602, format!("unknown tool {other}"))),
    }
}

/// The `DiscoverResult` (without `resultType`).
fn discover() -> Value {
    json!({
        "supportedVersions": [MODERN],
        "capabilities": {"tools": {}, "logging": {},
            "extensions": {"io.modelcontextprotocol/tasks": {}, "vendor/x": {}}},
        "instructions": "A server of rows.",
        "ttlMs": 60000, "cacheScope": "public",
        "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "modern-only", "version": "1.0.0"}}
    })
}

/// The open listens: (id, filter).
type Listens = Vec<(Value, Value)>;

/// A listen's notification, tagged with its id.
fn tagged(method: &str, listen: &Value, mut params: Value) -> Value {
    params["_meta"] = json!({"io.modelcontextprotocol/subscriptionId": listen});
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}

/// `touch` and `listens` (MODERN_RESOURCES=1).
fn resource_tool(out: &mut impl Write, params: &Value, listens: &Listens) -> Option<Value> {
    match params["name"].as_str()? {
        "touch" => {
            let uri = params["arguments"]["uri"].clone();
            for (listen, filter) in listens {
                let subscribed = filter["resourceSubscriptions"]
                    .as_array()
                    .is_some_and(|uris| uris.contains(&uri));
                if subscribed {
                    let updated = json!({"uri": uri});
                    send(
                        out,
                        &tagged("notifications/resources/updated", listen, updated),
                    );
                }
                if filter["resourcesListChanged"] == true {
                    let changed = tagged("notifications/resources/list_changed", listen, json!({}));
                    send(out, &changed);
                }
            }
            Some(json!({"content": []}))
        }
        "end_listens" => None,
        "crash" => std::process::exit(3),
        "listens" => {
            let open: Vec<Value> = listens
                .iter()
                .map(|(_, filter)| filter["resourceSubscriptions"].clone())
                .collect();
            Some(json!({"content": [{"type": "text", "text": Value::Array(open).to_string()}]}))
        }
        _ => None,
    }
}

fn main() {
    let resources = std::env::var("MODERN_RESOURCES").is_ok_and(|v| v == "1");
    let mut listens: Listens = Vec::new();
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            send(&mut out, &error(&Value::Null, -32700, "parse error", None));
            continue;
        };
        if message["method"] == "notifications/cancelled" {
            let cancelled = &message["params"]["requestId"];
            listens.retain(|(listen, _)| listen != cancelled);
        }
        let (Some(method), Some(id)) = (message["method"].as_str(), message.get("id")) else {
            continue; // notifications and responses
        };
        let params = &message["params"];
        let meta = &params["_meta"];
        let supported = json!({"supported": [MODERN]});
        let Some(version) = meta["io.modelcontextprotocol/protocolVersion"].as_str() else {
            let text = match method {
                "initialize" => format!(
                    "Method not found: initialize (this server speaks only MCP {MODERN}, without initialize)"
                ),
                _ => format!(
                    "Invalid params: a request carries params._meta[\"io.modelcontextprotocol/protocolVersion\"] ({MODERN})"
                ),
            };
            let code = if method == "initialize" {
                -32601
            } else {
                -32602
            };
            send(&mut out, &error(id, code, &text, Some(supported)));
            continue;
        };
        if version != MODERN {
            let data = json!({"supported": [MODERN], "requested": version});
            send(
                &mut out,
                &error(id, -32022, "Unsupported protocol version", Some(data)),
            );
            continue;
        }
        if meta.get("io.modelcontextprotocol/logLevel").is_some() {
            let log = json!({"jsonrpc": "2.0", "method": "notifications/message",
                "params": {"level": "info", "logger": "modern", "data": format!("handling {method}")}});
            send(&mut out, &log);
        }
        let answer = match method {
            "server/discover" if resources => {
                let mut discovered = discover();
                discovered["capabilities"]["tools"] = json!({"listChanged": true});
                discovered["capabilities"]["resources"] =
                    json!({"subscribe": true, "listChanged": true});
                result(id, discovered)
            }
            "server/discover" => result(id, discover()),
            "tools/list" => result(id, tools()),
            "subscriptions/listen" if resources => {
                let filter = params["notifications"].clone();
                let mut ack = json!({"notifications": filter});
                ack["_meta"] = json!({"io.modelcontextprotocol/subscriptionId": id});
                let ack = json!({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged", "params": ack});
                send(&mut out, &ack);
                listens.push((id.clone(), filter));
                continue;
            }
            // Ends every open listen gracefully (its completion result), as a server shutting
            // down does.
            "tools/call" if resources && params["name"] == "end_listens" => {
                for (listen, _) in listens.drain(..) {
                    let meta = json!({"io.modelcontextprotocol/subscriptionId": listen});
                    send(&mut out, &result(&listen, json!({"_meta": meta})));
                }
                result(id, json!({"content": []}))
            }
            "tools/call"
                if resources && let Some(value) = resource_tool(&mut out, params, &listens) =>
            {
                result(id, value)
            }
            "tools/call" => match call(params) {
                Ok(value) if value["resultType"].is_string() => {
                    json!({"jsonrpc": "2.0", "id": id, "result": value})
                }
                Ok(value) => result(id, value),
                Err((code, text)) => error(id, code, &text, None),
            },
            "ping" => result(id, json!({})),
            other => error(id, -32601, &format!("Method not found: {other}"), None),
        };
        send(&mut out, &answer);
    }
}
