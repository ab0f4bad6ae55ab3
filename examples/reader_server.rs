//! An MCP server that reads JSON with serde_json and logs what it read, for the differential
//! test (tests/differential/run.py): every message as one JSON line `{method, id, name,
//! arguments}` in the log file (the first argument), non-finite numbers written as strings. It
//! answers initialize, tools/list and tools/call, and `{}` to any other request; a batch with a
//! batch. Its Python and JavaScript twins are tests/differential/reader.py and reader.mjs.

use std::io::{BufRead, Write};

use serde_json::{Value, json};

fn plain(value: &Value) -> Value {
    match value {
        Value::Number(n)
            if !n.as_f64().is_some_and(f64::is_finite)
                && n.as_i64().is_none()
                && n.as_u64().is_none() =>
        {
            Value::String(
                if n.to_string().starts_with('-') {
                    "-inf"
                } else {
                    "inf"
                }
                .into(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(plain).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), plain(v))).collect())
        }
        other => other.clone(),
    }
}

fn answer(message: &Value, log: &mut impl Write) -> std::io::Result<Option<Value>> {
    let Value::Object(message) = message else {
        return Ok(None);
    };
    let empty = serde_json::Map::new();
    let params = message
        .get("params")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let read = json!({
        "method": message.get("method").cloned().unwrap_or(Value::Null),
        "id": message.get("id").cloned().unwrap_or_else(|| json!("(none)")),
        "name": params.get("name").cloned().unwrap_or(Value::Null),
        "arguments": params.get("arguments").cloned().unwrap_or(Value::Null),
    });
    writeln!(log, "{}", plain(&read))?;
    let (Some(method), Some(id)) = (message.get("method"), message.get("id")) else {
        return Ok(None);
    };
    let result = match method.as_str() {
        Some("initialize") => {
            json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
            "serverInfo": {"name": "reader-serde", "version": "1"}})
        }
        Some("tools/list") => json!({"tools": [{"name": "t", "inputSchema": {"type": "object"}}]}),
        Some("tools/call") => json!({"content": [{"type": "text", "text": "ok"}]}),
        _ => json!({}),
    };
    Ok(Some(json!({"jsonrpc": "2.0", "id": id, "result": result})))
}

fn main() -> std::io::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "reader-serde.log".into());
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let stdout = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            writeln!(log, "{}", json!({"unreadable": true}))?;
            continue;
        };
        let reply = match &message {
            Value::Array(items) => {
                let mut out = Vec::new();
                for item in items {
                    out.extend(answer(item, &mut log)?);
                }
                (!out.is_empty()).then_some(Value::Array(out))
            }
            _ => answer(&message, &mut log)?,
        };
        if let Some(reply) = reply {
            let mut out = stdout.lock();
            writeln!(out, "{reply}")?;
            out.flush()?;
        }
    }
    Ok(())
}
