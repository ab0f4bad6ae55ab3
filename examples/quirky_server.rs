//! A raw-JSON MCP test server that uses every corner of the protocol a relay could lose.
//!
//! It writes its messages as literal strings — key orders, number forms (`1.50`, `1e3`),
//! escapes, unknown fields, `_meta`, an unknown content type, `x-` fields — so that a test can
//! compare, byte for byte, what a client receives from it directly and through mcp-budget.
//! No SDK: an SDK would normalize exactly the details under test.
//!
//! Tools: `report` (progress, logging, a sampling request, then a rich result), `slow` (answers
//! only `notifications/cancelled`, by logging it), `ticking` (progress every 100 ms, then the
//! answer), `crash` (exits 3 mid-call), `noise` (writes a
//! non-JSON line first), `big` (a result of `arguments.bytes` bytes), `spawn` (starts a
//! `sleep` grandchild and reports its pid), `list_changed` (emits
//! `notifications/tools/list_changed`), `late` (sleeps `arguments.ms`, then answers with
//! `arguments.bytes` bytes: an answer after the proxy gave up), `flood` (`arguments.count`
//! log notifications of `arguments.bytes` bytes each, counting them into the file
//! `arguments.file` as it goes, then the answer).
//!
//! With `QUIRKY_RESOURCES=1` it also offers resources (`subscribe`, `listChanged`): it keeps
//! the URIs subscribed to (`resources/subscribe`, `resources/unsubscribe`), and two more tools
//! (not listed) use them: `touch` sends `notifications/resources/updated` for
//! `arguments.uri` if it is subscribed, and `notifications/resources/list_changed`; `subscribed`
//! answers with the URIs subscribed, as a JSON list in its text.

use std::io::{BufRead, Write};

use serde_json::{Value, json};

fn send(out: &mut impl Write, line: &str) {
    // The test server may die with its client; a failed write just ends it.
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        std::process::exit(0);
    }
}

/// An answer whose result is one text block.
fn text_result(id: &str, text: String) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":{}}}]}}}}"#,
        Value::String(text)
    )
}

/// The result of `rows` or `journal` (a tool that can run as a task), as JSON text.
fn simple_result(name: &str, arguments: &Value) -> Option<String> {
    match name {
        "rows" => {
            let n = arguments["rows"].as_u64().unwrap_or(10);
            let rows: Vec<Value> = (0..n)
                .map(|i| serde_json::json!({"n": i, "label": format!("row {i:06} {}", "r".repeat(40))}))
                .collect();
            let array = Value::Array(rows).to_string();
            let literal = Value::String(array.clone()).to_string();
            Some(format!(
                r#"{{"content":[{{"type":"text","text":{literal}}}],"structuredContent":{array}}}"#
            ))
        }
        "journal" => {
            let n = arguments["lines"].as_u64().unwrap_or(10);
            let text: String = (1..=n)
                .map(|i| format!("entry {i:06}: the journal line\n"))
                .collect();
            Some(format!(
                r#"{{"content":[{{"type":"text","text":{}}}]}}"#,
                Value::String(text)
            ))
        }
        _ => None,
    }
}

const TOOLS: &str = r##"{"tools":[{"name":"report","title":"Quarterly report","description":"Builds a report; asks the client's model for a summary.","inputSchema":{"type":"object","properties":{"quarter":{"type":"string","x-widget":"select"}},"required":["quarter"],"additionalProperties":false},"outputSchema":{"type":"object","properties":{"total":{"type":"number"},"rows":{"type":"array"}},"required":["total"]},"annotations":{"readOnlyHint":true,"x-cost":"high","openWorldHint":false},"execution":{"taskSupport":"optional"},"_meta":{"vendor/trace":true,"anthropic/maxResultSizeChars":50000},"x-owner":"team-q"},{"name":"slow","description":"Never finishes unless cancelled.","inputSchema":{"type":"object"}},{"name":"crash","description":"Exits mid-call.","inputSchema":{"type":"object"}},{"name":"noise","description":"Writes a non-JSON line before answering.","inputSchema":{"type":"object"}},{"name":"big","description":"Returns arguments.bytes bytes of text (lines of arguments.line bytes, when given).","inputSchema":{"type":"object","properties":{"bytes":{"type":"integer"},"line":{"type":"integer"}}},"annotations":{"readOnlyHint":true}},{"name":"journal","description":"Appends to a journal (a side effect) and returns arguments.lines numbered lines.","inputSchema":{"type":"object","properties":{"lines":{"type":"integer"}}}},{"name":"executions","description":"How many times each tool ran.","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}},{"name":"broken","description":"Answers with a line that is not JSON but begins like its answer.","inputSchema":{"type":"object"}},{"name":"drift","description":"Read-only, but its answer changes with every call (arguments.lines lines).","inputSchema":{"type":"object","properties":{"lines":{"type":"integer"}}},"annotations":{"readOnlyHint":true}},{"name":"history","description":"Has an after argument of its own (an entry number); returns arguments.lines lines from there.","inputSchema":{"type":"object","properties":{"after":{"type":"integer"},"lines":{"type":"integer"}}}},{"name":"tree","description":"A JSON listing of arguments.entries entries, as text and again as structuredContent.content (as server-filesystem does).","inputSchema":{"type":"object","properties":{"entries":{"type":"integer"}}},"outputSchema":{"type":"object","properties":{"content":{"type":"string"}},"required":["content"],"additionalProperties":false}},{"name":"rows","description":"arguments.rows rows: structuredContent is the array itself (2025-06-18 and later allow any JSON value), and the text block its JSON.","inputSchema":{"type":"object","properties":{"rows":{"type":"integer"}}},"outputSchema":{"type":"array","items":{"type":"object","properties":{"n":{"type":"integer"},"label":{"type":"string"}},"required":["n","label"],"additionalProperties":false}},"annotations":{"readOnlyHint":true}},{"name":"closed","description":"Like big, with an input schema closed to other arguments through a $ref.","inputSchema":{"$ref":"#/$defs/Args","$defs":{"Args":{"type":"object","properties":{"bytes":{"type":"integer"}},"additionalProperties":false}}}},{"name":"spawn","description":"Starts a grandchild process.","inputSchema":{"type":"object"}},{"name":"list_changed","description":"Emits tools/list_changed.","inputSchema":{"type":"object"}},{"name":"late","description":"Answers after arguments.ms.","inputSchema":{"type":"object"}},{"name":"flood","description":"Floods log notifications.","inputSchema":{"type":"object"}},{"name":"sink","description":"Takes anything: answers, for each argument, the length and SHA-256 of its JSON text as it arrived, and of its value when it is a string.","inputSchema":{"type":"object","properties":{"content":{"type":"string"},"item":{}}}}],"nextCursor":null,"x-list-extra":{"a":1.50}}"##;

fn main() {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut lines = stdin.lock().lines();
    // The `report` call waiting for the client's sampling answer: (call id, progress token).
    let mut awaiting_sampling: Option<(String, String)> = None;
    // `ask_two`: the call waiting for both answers, and the answers so far.
    let mut asking_two: Option<(String, Vec<String>)> = None;
    // How many times each tool ran (the side effect that tests count).
    let mut executions: std::collections::BTreeMap<String, u64> = Default::default();
    // Tasks: their results, by task id.
    let mut tasks: std::collections::BTreeMap<String, String> = Default::default();
    let resources = std::env::var("QUIRKY_RESOURCES").is_ok_and(|v| v == "1");
    let mut subscribed: std::collections::BTreeSet<String> = Default::default();
    let mut task_count = 0u64;
    // What the client declared in `initialize` (the `declared` tool tells it, and the pid).
    let mut declared = Value::Null;
    while let Some(Ok(line)) = lines.next() {
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            send(
                &mut out,
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"quirky: parse error"}}"#,
            );
            continue;
        };
        if let Value::Array(batch) = &message {
            let replies: Vec<String> = batch
                .iter()
                .filter(|m| m.get("method").is_some_and(|m| m == "ping"))
                .map(|m| format!(r#"{{"jsonrpc":"2.0","id":{},"result":{{}}}}"#, m["id"]))
                .collect();
            send(&mut out, &format!("[{}]", replies.join(",")));
            continue;
        }
        let id = message.get("id").map(Value::to_string);
        let method = message.get("method").and_then(Value::as_str);
        let params = message.get("params").cloned().unwrap_or(Value::Null);
        match (method, id) {
            (Some("initialize"), Some(id)) => {
                declared = params["capabilities"].clone();
                let version = params["protocolVersion"].as_str().unwrap_or("2025-06-18");
                let offered = match resources {
                    true => r#""resources":{"subscribe":true,"listChanged":true},"#,
                    false => "",
                };
                send(
                    &mut out,
                    &format!(
                        r#"{{"jsonrpc":"2.0","id":{id},"result":{{"protocolVersion":"{version}","capabilities":{{{offered}"tools":{{"listChanged":true}},"logging":{{}},"x-vendor":{{"flag":true}}}},"serverInfo":{{"name":"quirky","version":"1.0.0","x-build":"r\u00e9v 7"}},"_meta":{{"startup_ms":1.0e1}}}}}}"#
                    ),
                );
            }
            (Some("tools/list"), Some(id)) => {
                send(
                    &mut out,
                    r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"debug","logger":"quirky","data":{"listing":"tools","n":7}}}"#,
                );
                send(
                    &mut out,
                    &format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{TOOLS}}}"#),
                );
            }
            (Some("ping"), Some(id)) => send(
                &mut out,
                &format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#),
            ),
            (Some(method @ ("resources/subscribe" | "resources/unsubscribe")), Some(id))
                if resources =>
            {
                let uri = params["uri"].as_str().unwrap_or("").to_string();
                match method {
                    "resources/subscribe" => subscribed.insert(uri),
                    _ => subscribed.remove(&uri),
                };
                send(
                    &mut out,
                    &format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#),
                );
            }
            (Some("x/echo"), Some(id)) => {
                // Echo the params' exact text: unknown methods and fields must arrive intact.
                let raw = line
                    .find(r#""params":"#)
                    .map(|i| &line[i + 9..line.len() - 1])
                    .unwrap_or("null");
                send(
                    &mut out,
                    &format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"echo":{raw}}}}}"#),
                );
            }
            (Some("tools/call"), Some(id)) => {
                let token = params["_meta"]["progressToken"].to_string();
                let name = params["name"].as_str().unwrap_or("");
                *executions.entry(name.to_string()).or_default() += 1;
                // As a task: asked for one (2025-11-25 `params.task`), or, for a client that
                // declared the tasks extension (2026-07-28), at the server's discretion.
                let legacy_task = params.get("task").is_some_and(Value::is_object);
                let modern_task = params["_meta"]["io.modelcontextprotocol/clientCapabilities"]
                    ["extensions"]["io.modelcontextprotocol/tasks"]
                    .is_object();
                if (legacy_task || modern_task)
                    && let Some(result) = simple_result(name, &params["arguments"])
                {
                    task_count += 1;
                    let task = format!("task-{task_count:04}");
                    tasks.insert(task.clone(), result);
                    let created = if legacy_task {
                        format!(
                            r#"{{"task":{{"taskId":"{task}","status":"working","ttl":60000,"createdAt":"2026-11-20T12:00:00Z","lastUpdatedAt":"2026-11-20T12:00:00Z","pollInterval":100}}}}"#
                        )
                    } else {
                        format!(
                            r#"{{"resultType":"task","taskId":"{task}","status":"working","ttlMs":60000,"pollIntervalMs":100}}"#
                        )
                    };
                    send(
                        &mut out,
                        &format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{created}}}"#),
                    );
                    // On a listen stream a client learns of the completion too (the extension's
                    // notifications/tasks, with the result inline).
                    // QUIRKY_TASK_NOTIFY=batch: in a batch; =twice: its result named twice.
                    if modern_task && let Ok(how) = std::env::var("QUIRKY_TASK_NOTIFY") {
                        let result = &tasks[&task];
                        // =escaped: the first result's key spelled with an escape; =dupkey:
                        // a top-level key twice, the method spelled with an escape.
                        let results = match how.as_str() {
                            "twice" => format!(r#""result":{{"content":[]}},"result":{result}"#),
                            "escaped" => {
                                format!(r#""res\u0075lt":{result},"result":{{"content":[]}}"#)
                            }
                            _ => format!(r#""result":{result}"#),
                        };
                        let notification = match how.as_str() {
                            "dupkey" => format!(
                                r#"{{"jsonrpc":"2.0","jsonrpc":"2.0","method":"notifications\/tasks","params":{{"taskId":"{task}","status":"completed",{results}}}}}"#
                            ),
                            _ => format!(
                                r#"{{"jsonrpc":"2.0","method":"notifications/tasks","params":{{"taskId":"{task}","status":"completed",{results}}}}}"#
                            ),
                        };
                        let line = match how.as_str() {
                            "batch" => format!(
                                r#"[{notification},{{"jsonrpc":"2.0","method":"notifications/message","params":{{"level":"info","data":"batched"}}}}]"#
                            ),
                            _ => notification,
                        };
                        send(&mut out, &line);
                    }
                    continue;
                }
                match name {
                    "sink" => {
                        let result = sink(&line);
                        send(
                            &mut out,
                            &format!(
                                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":{}}}],"structuredContent":{result}}}}}"#,
                                Value::String(result.to_string())
                            ),
                        );
                    }
                    "declared" => {
                        let who = json!({"pid": std::process::id(), "capabilities": declared});
                        send(
                            &mut out,
                            &format!(
                                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":{}}}],"structuredContent":{who}}}}}"#,
                                Value::String(who.to_string())
                            ),
                        );
                    }
                    "executions" => {
                        let counts = serde_json::to_string(&executions).unwrap_or_default();
                        send(
                            &mut out,
                            &format!(
                                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":{}}}],"structuredContent":{counts}}}}}"#,
                                Value::String(counts.clone())
                            ),
                        );
                    }
                    "broken" => {
                        send(
                            &mut out,
                            &format!(
                                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"unterminated"#
                            ),
                        );
                    }
                    "drift" | "history" => {
                        let n = params["arguments"]["lines"].as_u64().unwrap_or(10);
                        let from = params["arguments"]["after"].as_u64().unwrap_or(0);
                        let run = executions.get(name).copied().unwrap_or(0);
                        let text: String = (from + 1..=from + n)
                            .map(|i| format!("{name} run {run} line {i:06}\n"))
                            .collect();
                        send(&mut out, &text_result(&id, text));
                    }
                    "tree" => {
                        let n = params["arguments"]["entries"].as_u64().unwrap_or(10);
                        let entries: Vec<Value> = (0..n)
                            .map(|i| serde_json::json!({"name": format!("file-{i:05}.txt"), "type": "file", "size": i * 7}))
                            .collect();
                        let text = serde_json::to_string_pretty(
                            &serde_json::json!({"root": "/data", "entries": entries}),
                        )
                        .unwrap_or_default();
                        let literal = Value::String(text).to_string();
                        send(
                            &mut out,
                            &format!(
                                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":{literal}}}],"structuredContent":{{"content":{literal}}}}}}}"#
                            ),
                        );
                    }
                    "rows" | "journal" => {
                        let result = simple_result(name, &params["arguments"]).unwrap_or_default();
                        send(
                            &mut out,
                            &format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#),
                        );
                    }
                    "report" => {
                        for (k, total) in [(1, "3"), (2, "3.0")] {
                            send(
                                &mut out,
                                &format!(
                                    r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":{token},"progress":{k},"total":{total},"message":"step {k}"}}}}"#
                                ),
                            );
                        }
                        send(
                            &mut out,
                            r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"asking the client to sample"}}"#,
                        );
                        send(
                            &mut out,
                            r#"{"jsonrpc":"2.0","id":"srv-1","method":"sampling/createMessage","params":{"messages":[{"role":"user","content":{"type":"text","text":"Summarize Q3"}}],"maxTokens":100,"_meta":{"x-origin":"report"}}}"#,
                        );
                        awaiting_sampling = Some((id, token));
                    }
                    // Two requests of its own at once: an elicitation and a sampling
                    // request; the call ends with both answers. Written together (one write),
                    // or, with `arguments.gap_ms`, in two writes that far apart (as a server
                    // whose writes reach the proxy in separate reads).
                    "ask_two" => {
                        let elicit = concat!(
                            r#"{"jsonrpc":"2.0","id":"srv-e","method":"elicitation/create","params":{"mode":"form","message":"Go on?","requestedSchema":{"type":"object","properties":{"ok":{"type":"boolean"}}}}}"#,
                            "\n"
                        );
                        let sample = concat!(
                            r#"{"jsonrpc":"2.0","id":"srv-s","method":"sampling/createMessage","params":{"messages":[{"role":"user","content":{"type":"text","text":"Say hi"}}],"maxTokens":10}}"#,
                            "\n"
                        );
                        // One write_all of both lines: stdout's line buffering writes what
                        // ends with a newline in one system call.
                        let written = match params["arguments"]["gap_ms"].as_u64() {
                            None => out
                                .write_all(format!("{elicit}{sample}").as_bytes())
                                .and_then(|()| out.flush()),
                            Some(gap) => out.write_all(elicit.as_bytes()).and_then(|()| {
                                out.flush()?;
                                std::thread::sleep(std::time::Duration::from_millis(gap));
                                out.write_all(sample.as_bytes())?;
                                out.flush()
                            }),
                        };
                        if written.is_err() {
                            std::process::exit(0);
                        }
                        asking_two = Some((id, Vec::new()));
                    }
                    // Asks the client for input and exits before any answer.
                    "ask_and_crash" => {
                        send(
                            &mut out,
                            r#"{"jsonrpc":"2.0","id":"srv-c","method":"elicitation/create","params":{"mode":"form","message":"Go on?","requestedSchema":{"type":"object","properties":{}}}}"#,
                        );
                        std::process::exit(3);
                    }
                    "slow" => {} // answered only by cancellation, below
                    "ticking" => {
                        // Progress every 100 ms, `arguments.ticks` times, then the answer.
                        let ticks = params["arguments"]["ticks"].as_u64().unwrap_or(3);
                        for k in 1..=ticks {
                            std::thread::sleep(std::time::Duration::from_millis(100));
                            send(
                                &mut out,
                                &format!(
                                    r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":{token},"progress":{k},"total":{ticks}}}}}"#
                                ),
                            );
                        }
                        send(
                            &mut out,
                            &format!(
                                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"ticked {ticks}"}}]}}}}"#
                            ),
                        );
                    }
                    "crash" => {
                        eprintln!("quirky: about to fail");
                        eprintln!("fatal: simulated crash in tool `crash`");
                        std::process::exit(3);
                    }
                    "noise" => {
                        send(
                            &mut out,
                            "this line is not JSON-RPC: debug output on stdout",
                        );
                        send(
                            &mut out,
                            &format!(
                                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"after noise"}}]}}}}"#
                            ),
                        );
                    }
                    "big" | "closed" => {
                        let n = params["arguments"]["bytes"].as_u64().unwrap_or(1000) as usize;
                        let text = match params["arguments"]["line"].as_u64() {
                            Some(line) if line > 1 => {
                                let line = "x".repeat(line as usize - 1) + "\\n";
                                line.repeat(n / (line.len() - 1))
                            }
                            _ => "x".repeat(n),
                        };
                        send(
                            &mut out,
                            &format!(
                                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{text}"}}]}}}}"#
                            ),
                        );
                    }
                    "late" => {
                        let ms = params["arguments"]["ms"].as_u64().unwrap_or(1000);
                        let n = params["arguments"]["bytes"].as_u64().unwrap_or(1000) as usize;
                        std::thread::sleep(std::time::Duration::from_millis(ms));
                        let text = "y".repeat(n);
                        send(
                            &mut out,
                            &format!(
                                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{text}"}}]}}}}"#
                            ),
                        );
                    }
                    "flood" => {
                        let count = params["arguments"]["count"].as_u64().unwrap_or(10);
                        let n = params["arguments"]["bytes"].as_u64().unwrap_or(1000) as usize;
                        let file = params["arguments"]["file"].as_str().map(String::from);
                        let pad = "z".repeat(n);
                        for k in 1..=count {
                            send(
                                &mut out,
                                &format!(
                                    r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"level":"info","data":{{"k":{k},"pad":"{pad}"}}}}}}"#
                                ),
                            );
                            if let Some(file) = &file {
                                let _ = std::fs::write(file, k.to_string());
                            }
                        }
                        send(
                            &mut out,
                            &format!(
                                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"flooded {count}"}}]}}}}"#
                            ),
                        );
                    }
                    "spawn" => {
                        let pid = std::process::Command::new("sleep")
                            .arg("600")
                            .spawn()
                            .map(|c| c.id())
                            .unwrap_or(0);
                        send(
                            &mut out,
                            &format!(
                                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{pid}"}}]}}}}"#
                            ),
                        );
                    }
                    "touch" if resources => {
                        let uri = params["arguments"]["uri"].as_str().unwrap_or("");
                        if subscribed.contains(uri) {
                            let updated = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": uri, "x-rev": 2}});
                            send(&mut out, &updated.to_string());
                        }
                        send(
                            &mut out,
                            r#"{"jsonrpc":"2.0","method":"notifications/resources/list_changed"}"#,
                        );
                        send(
                            &mut out,
                            &format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[]}}}}"#),
                        );
                    }
                    "subscribed" if resources => {
                        let list = serde_json::to_string(&subscribed).unwrap_or_default();
                        send(&mut out, &text_result(&id, list));
                    }
                    "list_changed" => {
                        send(
                            &mut out,
                            r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#,
                        );
                        send(
                            &mut out,
                            &format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[]}}}}"#),
                        );
                    }
                    other => send(
                        &mut out,
                        &format!(
                            r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32602,"message":"unknown tool {other}"}}}}"#
                        ),
                    ),
                }
            }
            // A task's status (2025-11-25: the task; the extension: the task with its result
            // inline once completed).
            (Some("tasks/get"), Some(id)) => {
                let task = params["taskId"].as_str().unwrap_or("");
                let modern = params["_meta"]["io.modelcontextprotocol/protocolVersion"].is_string();
                let answer = match (tasks.get(task), modern) {
                    (None, _) => format!(
                        r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32602,"message":"unknown task {task}"}}}}"#
                    ),
                    (Some(result), true) => {
                        // QUIRKY_TASK_RESULT_TYPE: the completed task's result says it is of
                        // another type (it is final all the same).
                        let result = match std::env::var("QUIRKY_TASK_RESULT_TYPE") {
                            Ok(kind) => format!(r#"{{"resultType":"{kind}",{}"#, &result[1..]),
                            Err(_) => result.clone(),
                        };
                        format!(
                            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"resultType":"complete","taskId":"{task}","status":"completed","ttlMs":60000,"result":{result}}}}}"#
                        )
                    }
                    (Some(_), false) => format!(
                        r#"{{"jsonrpc":"2.0","id":{id},"result":{{"taskId":"{task}","status":"completed","ttl":60000,"createdAt":"2026-11-20T12:00:00Z","lastUpdatedAt":"2026-11-20T12:00:01Z"}}}}"#
                    ),
                };
                send(&mut out, &answer);
            }
            // The extension's input and cancellation: acknowledged for a task it knows (it
            // names the task back, as a server may), refused for any other.
            (Some(method @ ("tasks/update" | "tasks/cancel")), Some(id)) => {
                let task = params["taskId"].as_str().unwrap_or("");
                let answer = match tasks.get(task) {
                    Some(_) if method == "tasks/cancel" => format!(
                        r#"{{"jsonrpc":"2.0","id":{id},"result":{{"resultType":"complete","taskId":"{task}","status":"cancelled"}}}}"#
                    ),
                    Some(_) => format!(
                        r#"{{"jsonrpc":"2.0","id":{id},"result":{{"resultType":"complete"}}}}"#
                    ),
                    None => format!(
                        r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32602,"message":"unknown task {task}"}}}}"#
                    ),
                };
                send(&mut out, &answer);
            }
            // A listen stream for tasks: acknowledged with the tasks it knows, then each one's
            // state (completed, its result inline); the stream stays open.
            (Some("subscriptions/listen"), Some(_)) if !resources => {
                let asked: Vec<String> = params["notifications"]["taskIds"]
                    .as_array()
                    .map(|ids| {
                        ids.iter()
                            .filter_map(|id| id.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                let known: Vec<&String> =
                    asked.iter().filter(|id| tasks.contains_key(*id)).collect();
                let ack = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged", "params": {"notifications": {"taskIds": known}}});
                send(&mut out, &ack.to_string());
                for task in known {
                    let result = &tasks[task];
                    send(
                        &mut out,
                        &format!(
                            r#"{{"jsonrpc":"2.0","method":"notifications/tasks","params":{{"taskId":"{task}","status":"completed","result":{result}}}}}"#
                        ),
                    );
                }
            }
            // A task's result (2025-11-25).
            (Some("tasks/result"), Some(id)) => {
                let task = params["taskId"].as_str().unwrap_or("");
                let answer = match tasks.get(task) {
                    Some(result) => {
                        let meta = format!(
                            r#","_meta":{{"io.modelcontextprotocol/related-task":{{"taskId":"{task}"}}}}}}"#
                        );
                        let result = result.strip_suffix('}').map(|r| format!("{r}{meta}"));
                        format!(
                            r#"{{"jsonrpc":"2.0","id":{id},"result":{}}}"#,
                            result.unwrap_or_default()
                        )
                    }
                    None => format!(
                        r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32602,"message":"unknown task {task}"}}}}"#
                    ),
                };
                send(&mut out, &answer);
            }
            (Some("notifications/cancelled"), None) => {
                let request = params["requestId"].to_string();
                send(
                    &mut out,
                    &format!(
                        r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"level":"info","data":"cancelled {}"}}}}"#,
                        request.replace('"', "'")
                    ),
                );
            }
            (Some(_), None) => {} // other notifications
            // How a legacy server may take a method it does not know (QUIRKY_UNKNOWN): it
            // answers with an error (the default), never answers, or exits.
            (Some(_), Some(_)) if std::env::var("QUIRKY_UNKNOWN").as_deref() == Ok("silent") => {}
            (Some(_), Some(_)) if std::env::var("QUIRKY_UNKNOWN").as_deref() == Ok("exit") => {
                std::process::exit(4)
            }
            (Some(other), Some(id)) => send(
                &mut out,
                &format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32601,"message":"Method not found: {other}"}}}}"#
                ),
            ),
            (None, Some(id)) if id == "\"srv-e\"" || id == "\"srv-s\"" => {
                if let Some((call, answers)) = asking_two.as_mut() {
                    answers.push(format!("{id}: {}", message["result"]));
                    if answers.len() == 2 {
                        answers.sort();
                        let text = answers.join("; ");
                        send(&mut out, &text_result(call, text));
                        asking_two = None;
                    }
                }
            }
            (None, Some(id)) if id == "\"srv-1\"" => {
                // The client's answer to our sampling request: finish the `report` call.
                if let Some((call, token)) = awaiting_sampling.take() {
                    let summary = message["result"]["content"]["text"]
                        .as_str()
                        .unwrap_or("?")
                        .to_string();
                    send(
                        &mut out,
                        &format!(
                            r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":{token},"progress":3,"total":3}}}}"#
                        ),
                    );
                    send(
                        &mut out,
                        &format!(
                            r#"{{"jsonrpc":"2.0","id":{call},"result":{{"content":[{{"type":"text","text":"Q3: {summary} caf\u00e9"}},{{"type":"hologram","data":"AAEC","x-depth":3,"annotations":{{"audience":["user"],"priority":0.50}}}},{{"type":"resource_link","uri":"file:///q3.csv","name":"q3.csv","_meta":{{"x":1}}}}],"structuredContent":{{"total":1e3,"rows":[{{"q":"Q3","v":12.50}}],"x-extra":null}},"isError":false,"_meta":{{"vendor/cost":0.001}}}}}}"#
                        ),
                    );
                }
            }
            _ => {}
        }
    }
}

/// What `sink` answers: for each argument of the call in `line`, the length and SHA-256 of its
/// JSON text as it arrived, and of its value when it is a string.
fn sink(line: &str) -> Value {
    use sha2::{Digest, Sha256};
    #[derive(serde::Deserialize)]
    struct Call<'a> {
        #[serde(borrow)]
        params: Params<'a>,
    }
    #[derive(serde::Deserialize)]
    struct Params<'a> {
        #[serde(borrow, default)]
        arguments: std::collections::BTreeMap<String, &'a serde_json::value::RawValue>,
    }
    let hex = |bytes: &[u8]| {
        Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let Ok(call) = serde_json::from_str::<Call>(line) else {
        return json!({"error": "unreadable"});
    };
    let mut out = serde_json::Map::new();
    for (name, raw) in call.params.arguments {
        let text = raw.get();
        let mut entry = json!({"raw_bytes": text.len(), "raw_sha256": hex(text.as_bytes())});
        if let Ok(value) = serde_json::from_str::<String>(text) {
            entry["string_bytes"] = json!(value.len());
            entry["string_sha256"] = json!(hex(value.as_bytes()));
        }
        out.insert(name, entry);
    }
    Value::Object(out)
}
