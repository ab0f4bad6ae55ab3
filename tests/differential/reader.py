#!/usr/bin/env python3
"""An MCP server that reads JSON with Python's json module and logs what it read.

For the differential test (run.py): every message it receives is written to the log file
(argv[1]) as one JSON line: {"method", "id", "name", "arguments"} as Python's json read them
(non-finite numbers written as strings). It answers initialize, tools/list and tools/call, and
{} to any other request; a batch with a batch."""
import json, math, sys

log = open(sys.argv[1], "a", buffering=1)


def plain(value):
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def answer(message):
    if not isinstance(message, dict):
        return None
    params = message.get("params") if isinstance(message.get("params"), dict) else {}
    log.write(json.dumps(plain({
        "method": message.get("method"),
        "id": message.get("id", "(none)"),
        "name": params.get("name"),
        "arguments": params.get("arguments"),
    }), ensure_ascii=False) + "\n")
    if "method" not in message or "id" not in message:
        return None
    method = message["method"]
    if method == "initialize":
        result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                  "serverInfo": {"name": "reader-python", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "t", "inputSchema": {"type": "object"}}]}
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": "ok"}]}
    else:
        result = {}
    return {"jsonrpc": "2.0", "id": message["id"], "result": result}


for raw in sys.stdin.buffer:
    try:
        message = json.loads(raw.decode("utf-8", "surrogatepass"))
    except ValueError:
        log.write(json.dumps({"unreadable": True}) + "\n")
        continue
    if isinstance(message, list):
        out = [a for a in (answer(m) for m in message) if a is not None]
        reply = out or None
    else:
        reply = answer(message)
    if reply is not None:
        sys.stdout.write(json.dumps(reply, ensure_ascii=False) + "\n")
        sys.stdout.flush()
