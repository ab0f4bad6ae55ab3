//! Tool results delivered through tasks are budgeted as the call's own answer would be, through
//! the real binary in front of the quirky server (which runs `journal` and `rows` as tasks):
//! the 2025-11-25 `tasks/result`, the tasks extension's completed `tasks/get` and its
//! `notifications/tasks`. Following `after` on the tool continues the chain from the cache (the
//! tool ran once), and a Codex client gets Codex-sized pages.

mod common;

use common::{Peer, example, last_message};
use serde_json::{Value, json};

struct Client {
    peer: Peer,
    next_id: u64,
    modern: bool,
    /// The name a modern client gives in each request's `_meta`.
    name: &'static str,
}

const MODERN: &str = "2026-07-28";

impl Client {
    /// The proxy (no policy) in front of quirky; a legacy client named `client` (initialized),
    /// or a modern one (no initialize: every request carries its `_meta`).
    async fn start(client: &'static str, modern: bool, env: &[(&str, &str)]) -> Client {
        let quirky = example("quirky_server");
        let mut command = tokio::process::Command::new(common::proxy_bin());
        command.args(["--policy", "none"]);
        if modern {
            // quirky answers a request whose `_meta` says 2026-07-28 as a modern server does
            // (tasks by the extension): it is taken as one, not bridged as the legacy server
            // it is to `server/discover` (a bridged request loses the modern `_meta`).
            command.args(["--server-era", "modern"]);
        }
        command.arg("--").arg(&quirky);
        for (key, value) in env {
            command.env(key, value);
        }
        let peer = Peer::from_command(command);
        let mut me = Client {
            peer,
            next_id: 0,
            modern,
            name: client,
        };
        if !modern {
            let init = json!({"protocolVersion": "2025-11-25", "capabilities": {"tasks": {"requests": {"tools": {"call": {}}}}}, "clientInfo": {"name": client, "version": "1"}});
            me.request("initialize", init).await;
            me.peer.send(common::INITIALIZED).await;
        }
        me.request("tools/list", json!({})).await;
        me
    }

    fn meta(&self) -> Value {
        json!({
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientInfo": {"name": self.name, "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
        })
    }

    /// One request; the whole response (messages for no id are skipped, and kept).
    async fn request(&mut self, method: &str, mut params: Value) -> Value {
        self.next_id += 1;
        if self.modern {
            params["_meta"] = self.meta();
        }
        let request =
            json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        self.peer.send(&request.to_string()).await;
        loop {
            let line = self.peer.recv().await;
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == self.next_id {
                return message;
            }
        }
    }

    async fn call(&mut self, tool: &str, arguments: Value, task: bool) -> Value {
        let mut params = json!({"name": tool, "arguments": arguments});
        if task && !self.modern {
            params["task"] = json!({"ttl": 60000});
        }
        self.request("tools/call", params).await
    }

    /// The task's final result, the way this client's era gets it.
    async fn task_result(&mut self, task: &str) -> (Value, String) {
        let method = if self.modern {
            "tasks/get"
        } else {
            "tasks/result"
        };
        let answer = self.request(method, json!({"taskId": task})).await;
        let result = if self.modern {
            assert_eq!(answer["result"]["status"], "completed", "{answer:.300}");
            assert_eq!(answer["result"]["resultType"], "complete");
            answer["result"]["result"].clone()
        } else {
            answer["result"].clone()
        };
        let size = serde_json::to_string(&result).unwrap();
        (result, size)
    }

    async fn executions(&mut self, tool: &str) -> u64 {
        let answer = self.call("executions", json!({}), false).await;
        answer["result"]["structuredContent"][tool]
            .as_u64()
            .unwrap_or(0)
    }
}

/// A task's id in a `CreateTaskResult` of either era.
fn task_id(answer: &Value) -> String {
    let result = &answer["result"];
    result["task"]["taskId"]
        .as_str()
        .or(result["taskId"].as_str())
        .unwrap_or_else(|| panic!("not a task: {answer:.300}"))
        .to_string()
}

/// The continuation of a page.
fn next_after(result: &Value) -> Option<String> {
    common::continuation(result)
}

/// The rest of the chain, by `after` on the tool (as a plain call): every page.
async fn rest(client: &mut Client, tool: &str, arguments: &Value, first: &Value) -> Vec<Value> {
    let mut pages = vec![first.clone()];
    let mut after = next_after(first);
    while let Some(cursor) = after {
        let mut args = arguments.clone();
        args["after"] = json!(cursor);
        let answer = client.call(tool, args, false).await;
        let page = answer["result"].clone();
        assert_ne!(page["isError"], true, "{page:.300}");
        after = next_after(&page);
        pages.push(page);
        assert!(pages.len() < 500);
    }
    pages
}

fn journal(lines: usize) -> String {
    (1..=lines)
        .map(|i| format!("entry {i:06}: the journal line\n"))
        .collect()
}

/// A page's text: its blocks but the notice.
fn page_text(page: &Value) -> String {
    let blocks = page["content"].as_array().unwrap();
    blocks[..blocks.len() - 1]
        .iter()
        .map(|b| b["text"].as_str().unwrap())
        .collect()
}

async fn a_1_mb_text_task_is_paged(client: &mut Client, budget: usize) {
    let arguments = json!({"lines": 33_000});
    let created = client.call("journal", arguments.clone(), true).await;
    // The CreateTaskResult passes as the server wrote it.
    assert!(created["result"].get("content").is_none(), "{created:.300}");
    let task = task_id(&created);
    let (first, size) = client.task_result(&task).await;
    assert!(size.len() < budget, "{} bytes over {budget}", size.len());
    assert!(next_after(&first).is_some(), "{first:.300}");
    let pages = rest(client, "journal", &arguments, &first).await;
    assert!(pages.len() > 4);
    for page in &pages {
        assert!(serde_json::to_string(page).unwrap().len() < budget);
    }
    let text: String = pages.iter().map(page_text).collect();
    assert_eq!(text, journal(33_000));
    assert!(journal(33_000).len() > 1_000_000);
    assert_eq!(client.executions("journal").await, 1, "the tool ran once");
}

async fn a_5000_item_list_task_is_paged(client: &mut Client, budget: usize) {
    let arguments = json!({"rows": 5000});
    let created = client.call("rows", arguments.clone(), true).await;
    let task = task_id(&created);
    let (first, size) = client.task_result(&task).await;
    assert!(size.len() < budget, "{} bytes", size.len());
    let pages = rest(client, "rows", &arguments, &first).await;
    let rows: Vec<Value> = pages
        .iter()
        .flat_map(|p| p["structuredContent"].as_array().unwrap().clone())
        .collect();
    assert_eq!(rows.len(), 5000);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row["n"], i);
    }
    assert_eq!(client.executions("rows").await, 1);
}

#[tokio::test]
async fn legacy_tasks_result_is_paged_and_the_chain_goes_on_from_the_cache() {
    let mut client = Client::start("tasks-test", false, &[]).await;
    a_1_mb_text_task_is_paged(&mut client, 200_000).await;
    a_5000_item_list_task_is_paged(&mut client, 200_000).await;
    // A status passes as it is.
    let created = client.call("journal", json!({"lines": 5}), true).await;
    let task = task_id(&created);
    let status = client.request("tasks/get", json!({"taskId": task})).await;
    assert_eq!(status["result"]["status"], "completed");
    assert!(status["result"].get("result").is_none());
}

#[tokio::test]
async fn a_codex_client_gets_codex_sized_pages_of_a_task() {
    let mut client = Client::start("codex-mcp-client", false, &[]).await;
    a_1_mb_text_task_is_paged(&mut client, 10_000).await;
}

#[tokio::test]
async fn modern_tasks_get_is_paged_and_the_chain_goes_on_from_the_cache() {
    let mut client = Client::start("tasks-test", true, &[]).await;
    a_1_mb_text_task_is_paged(&mut client, 200_000).await;
    a_5000_item_list_task_is_paged(&mut client, 200_000).await;
}

/// A completed task's result is final whatever `resultType` it claims: budgeted all the same.
#[tokio::test]
async fn a_completed_result_claiming_another_type_is_budgeted_all_the_same() {
    let mut client = Client::start(
        "tasks-test",
        true,
        &[("QUIRKY_TASK_RESULT_TYPE", "input_required")],
    )
    .await;
    a_1_mb_text_task_is_paged(&mut client, 200_000).await;
}

#[tokio::test]
async fn a_modern_codex_client_gets_codex_sized_pages_of_a_task() {
    let mut client = Client::start("codex-mcp-client", true, &[]).await;
    a_1_mb_text_task_is_paged(&mut client, 10_000).await;
}

/// A modern client is shown a token for the task, not the server's id; the server is asked by
/// its own id (it knows no other), and the answer names the task by the token again.
#[tokio::test]
async fn a_modern_client_names_a_task_by_a_token_the_server_never_sees() {
    let mut client = Client::start("tasks-test", true, &[]).await;
    let created = client.call("journal", json!({"lines": 5}), true).await;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let token = task_id(&created);
    assert!(token.starts_with("mcpb-task."), "{token}");
    assert!(!token.contains("task-0001"), "{token}");
    let status = client.request("tasks/get", json!({"taskId": token})).await;
    assert_eq!(status["result"]["taskId"], token, "{status:.300}");
    assert_eq!(page_text_all(&status["result"]["result"]), journal(5));
    // tasks/update and tasks/cancel reach the server by its id; what names the task back
    // names it by the token.
    let update = client
        .request(
            "tasks/update",
            json!({"taskId": token, "inputResponses": {}}),
        )
        .await;
    assert!(update.get("error").is_none(), "{update}");
    let cancel = client
        .request("tasks/cancel", json!({"taskId": token}))
        .await;
    assert_eq!(cancel["result"]["status"], "cancelled", "{cancel}");
    assert_eq!(cancel["result"]["taskId"], token);
    // The server's own id, which no client is shown, reaches no task (another principal's,
    // guessed or seen elsewhere): refused, on every method and in a listen filter.
    for method in ["tasks/get", "tasks/cancel", "tasks/update"] {
        let raw = client.request(method, json!({"taskId": "task-0001"})).await;
        assert_eq!(raw["error"]["code"], -32602, "{raw:.200}");
        assert!(raw.to_string().contains("mcpb-task"), "{raw:.300}");
    }
    let listen = client
        .request(
            "subscriptions/listen",
            json!({"notifications": {"taskIds": ["task-0001"]}}),
        )
        .await;
    assert_eq!(listen["error"]["code"], -32602, "{listen:.200}");
}

/// A modern client that does not declare the tasks extension is no way around the tokens: the
/// server's own id (another principal's task, behind a shared upstream) never reaches the
/// server; the client is told it has no tasks (-32021).
#[tokio::test]
async fn a_raw_task_id_is_refused_without_the_tasks_extension_too() {
    let mut client = Client::start("tasks-test", true, &[]).await;
    let created = client.call("journal", json!({"lines": 5}), true).await;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "no-extension", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    for (n, method) in ["tasks/get", "tasks/cancel", "tasks/update"]
        .into_iter()
        .enumerate()
    {
        let id = 900 + n;
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method,
            "params": {"taskId": "task-0001", "_meta": meta}});
        client.peer.send(&request.to_string()).await;
        let answer = loop {
            let message: Value = serde_json::from_str(&client.peer.recv().await).unwrap();
            if message["id"] == id {
                break message;
            }
        };
        // The extension's own answer (-32021), from the proxy: the server never sees it.
        assert_eq!(answer["error"]["code"], -32021, "{method}: {answer:.300}");
        assert!(answer.get("result").is_none(), "{method}: {answer:.300}");
    }
}

/// A token altered in any byte, cut, or made for another principal is refused with -32602,
/// and the server is never asked.
#[tokio::test]
async fn an_altered_task_token_is_refused_with_invalid_params() {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut client = Client::start("tasks-test", true, &[]).await;
    let created = client.call("journal", json!({"lines": 33_000}), true).await;
    let token = task_id(&created);
    let sealed = token.strip_prefix("mcpb-task.").unwrap();
    let (payload, tag) = sealed.split_once('.').unwrap();
    // The body re-pointed at another of the server's tasks, the MAC kept.
    let body = String::from_utf8(URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
    assert!(body.contains("task-0001"), "{body}");
    let other = body.replace("task-0001", "task-0002");
    let forged = format!(
        "mcpb-task.{}.{tag}",
        URL_SAFE_NO_PAD.encode(other.as_bytes())
    );
    let cut = &token[..token.len() - 2];
    for bad in [forged.as_str(), cut, "mcpb-task.x.y"] {
        for method in ["tasks/get", "tasks/cancel", "tasks/update"] {
            let answer = client.request(method, json!({"taskId": bad})).await;
            assert_eq!(answer["error"]["code"], -32602, "{method}: {answer}");
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(message.contains("not issued by mcp-budget"), "{message}");
        }
        let listen = client
            .request(
                "subscriptions/listen",
                json!({"notifications": {"taskIds": [token.clone(), bad]}}),
            )
            .await;
        assert_eq!(listen["error"]["code"], -32602, "{listen}");
    }
    // The server was never asked to cancel: the task's result is still there, and paged.
    let (first, size) = client.task_result(&token).await;
    assert!(size.len() < 200_000);
    assert!(next_after(&first).is_some());
}

/// The token carries the call: its result is paged even where the session no longer holds
/// the call (as another replica would not).
#[tokio::test]
async fn a_modern_task_is_budgeted_by_its_token_when_the_session_forgot_the_call() {
    let mut client = Client::start("tasks-test", true, &[]).await;
    let arguments = json!({"lines": 33_000});
    let created = client.call("journal", arguments.clone(), true).await;
    let token = task_id(&created);
    for _ in 0..260 {
        client.call("journal", json!({"lines": 2}), true).await;
    }
    let (first, size) = client.task_result(&token).await;
    assert!(size.len() < 200_000, "{} bytes", size.len());
    let pages = rest(&mut client, "journal", &arguments, &first).await;
    let text: String = pages.iter().map(page_text).collect();
    assert_eq!(text, journal(33_000));
}

/// A listen stream asks for tasks by their tokens; its acknowledgement and notifications name
/// them so, and a completed task's result on it is paged.
#[tokio::test]
async fn a_listen_stream_names_tasks_by_their_tokens() {
    let mut client = Client::start("tasks-test", true, &[]).await;
    let created = client.call("journal", json!({"lines": 33_000}), true).await;
    let token = task_id(&created);
    client.next_id += 1;
    let params = json!({"notifications": {"taskIds": [token]}, "_meta": client.meta()});
    let request = json!({"jsonrpc": "2.0", "id": client.next_id, "method": "subscriptions/listen", "params": params});
    client.peer.send(&request.to_string()).await;
    let (mut acked, mut notified) = (None, None);
    while acked.is_none() || notified.is_none() {
        let line = client.peer.recv().await;
        let message: Value = serde_json::from_str(&line).unwrap();
        match message["method"].as_str() {
            Some("notifications/subscriptions/acknowledged") => acked = Some(message),
            Some("notifications/tasks") => notified = Some((message, line.len())),
            _ => {}
        }
    }
    let acked = acked.unwrap();
    assert_eq!(
        acked["params"]["notifications"]["taskIds"],
        json!([token]),
        "{acked}"
    );
    let (notification, size) = notified.unwrap();
    assert_eq!(notification["params"]["taskId"], token);
    assert!(size < 200_000, "{size} bytes");
    let first = notification["params"]["result"].clone();
    let pages = rest(&mut client, "journal", &json!({"lines": 33_000}), &first).await;
    let text: String = pages.iter().map(page_text).collect();
    assert_eq!(text, journal(33_000));
}

#[tokio::test]
async fn a_completed_task_in_notifications_tasks_is_paged() {
    a_completed_task_notified_is_paged("1").await;
}

#[tokio::test]
async fn a_completed_task_in_a_batch_of_notifications_is_paged() {
    a_completed_task_notified_is_paged("batch").await;
}

/// A task's state that names its result twice (a client could read either), once with an
/// escaped key, or a notification with a top-level key twice, is withheld.
#[tokio::test]
async fn a_task_notification_naming_its_result_twice_is_withheld() {
    for how in ["twice", "escaped", "dupkey"] {
        a_task_notification_is_withheld(how).await;
    }
}

async fn a_task_notification_is_withheld(how: &str) {
    let mut client = Client::start("tasks-test", true, &[("QUIRKY_TASK_NOTIFY", how)]).await;
    let created = client.call("journal", json!({"lines": 33_000}), true).await;
    assert_eq!(created["result"]["resultType"], "task", "{created:.200}");
    // The next answer comes after where the notification was: it never came.
    client.next_id += 1;
    let mut params = json!({"name": "executions", "arguments": {}});
    params["_meta"] = client.meta();
    let request =
        json!({"jsonrpc": "2.0", "id": client.next_id, "method": "tools/call", "params": params});
    client.peer.send(&request.to_string()).await;
    loop {
        let line = client.peer.recv().await;
        let message: Value = serde_json::from_str(&line).unwrap();
        assert_ne!(
            message["method"], "notifications/tasks",
            "{how}: {line:.300}"
        );
        if message["id"] == client.next_id {
            break;
        }
    }
}

async fn a_completed_task_notified_is_paged(how: &str) {
    let mut client = Client::start("tasks-test", true, &[("QUIRKY_TASK_NOTIFY", how)]).await;
    client.next_id += 1;
    let mut params = json!({"name": "journal", "arguments": {"lines": 33_000}});
    params["_meta"] = client.meta();
    let request =
        json!({"jsonrpc": "2.0", "id": client.next_id, "method": "tools/call", "params": params});
    client.peer.send(&request.to_string()).await;
    let (mut created, mut notified) = (None, None);
    while created.is_none() || notified.is_none() {
        let line = client.peer.recv().await;
        let message: Value = serde_json::from_str(&line).unwrap();
        // A batch: its task notification.
        let (message, size) = match message.as_array() {
            Some(batch) => {
                let found = batch
                    .iter()
                    .find(|m| m["method"] == "notifications/tasks")
                    .cloned()
                    .unwrap();
                (found, line.len())
            }
            None => (message, line.len()),
        };
        if message["method"] == "notifications/tasks" {
            assert!(
                message["params"]["taskId"]
                    .as_str()
                    .unwrap()
                    .starts_with("mcpb-task."),
                "{message:.200}"
            );
            notified = Some((message, size));
        } else if message["id"] == client.next_id {
            created = Some(message);
        }
    }
    let (notification, size) = notified.unwrap();
    assert!(size < 200_000, "{size} bytes");
    let first = notification["params"]["result"].clone();
    assert_eq!(notification["params"]["status"], "completed");
    let pages = rest(&mut client, "journal", &json!({"lines": 33_000}), &first).await;
    let text: String = pages.iter().map(page_text).collect();
    assert_eq!(text, journal(33_000));
}

#[tokio::test]
async fn the_result_of_a_task_the_session_forgot_is_refused_not_passed() {
    let mut client = Client::start("tasks-test", false, &[]).await;
    let created = client.call("journal", json!({"lines": 33_000}), true).await;
    let forgotten = task_id(&created);
    // More tasks than a session remembers come after it.
    for _ in 0..260 {
        client.call("journal", json!({"lines": 2}), true).await;
    }
    let answer = client
        .request("tasks/result", json!({"taskId": forgotten}))
        .await;
    let result = &answer["result"];
    assert_eq!(result["isError"], true, "{answer:.300}");
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("no longer holds the call"), "{text}");
    // A small result of a forgotten task passes.
    let created = client.call("journal", json!({"lines": 3}), true).await;
    let small = task_id(&created);
    for _ in 0..260 {
        client.call("journal", json!({"lines": 2}), true).await;
    }
    let answer = client
        .request("tasks/result", json!({"taskId": small}))
        .await;
    assert_eq!(page_text_all(&answer["result"]), journal(3));
}

fn page_text_all(result: &Value) -> String {
    result["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["text"].as_str().unwrap())
        .collect()
}

/// Over HTTP, a task token is bound to the principal it was issued to: another credential's
/// `tasks/get` with it is refused with -32602 (the server is not asked), and its own is served
/// with `Mcp-Name` naming the token.
#[tokio::test]
async fn a_task_token_from_another_principal_is_refused_over_http() {
    // quirky taken as the modern server it plays for `_meta` 2026-07-28 (see `Client::start`).
    let (_proxy, url) = common::two_principals_with(&["--server-era", "modern"]).await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "tasks-test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    });
    let post = |token: &'static str, id: u64, method: &'static str, name: String, params: Value| {
        let mut params = params;
        params["_meta"] = meta.clone();
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let request = http
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", MODERN)
            .header("mcp-method", method)
            .header("mcp-name", name)
            .header("authorization", format!("Bearer {token}"))
            .body(body.to_string());
        async move {
            let text = request.send().await.unwrap().text().await.unwrap();
            last_message(&text)
        }
    };
    let created = post(
        "a-secret",
        1,
        "tools/call",
        "journal".into(),
        json!({"name": "journal", "arguments": {"lines": 33_000}}),
    )
    .await;
    let token = task_id(&created);
    assert!(token.starts_with("mcpb-task."), "{created}");
    let other = post(
        "b-secret",
        2,
        "tasks/get",
        token.clone(),
        json!({"taskId": token}),
    )
    .await;
    assert_eq!(other["error"]["code"], -32602, "{other}");
    let message = other["error"]["message"].as_str().unwrap();
    assert!(message.contains("another principal"), "{message}");
    let own = post(
        "a-secret",
        3,
        "tasks/get",
        token.clone(),
        json!({"taskId": token}),
    )
    .await;
    assert_eq!(own["result"]["status"], "completed", "{own:.300}");
    assert_eq!(own["result"]["taskId"], token);
    let size = own["result"]["result"].to_string().len();
    assert!(size < 200_000, "{size} bytes");
    assert!(next_after(&own["result"]["result"]).is_some());
}
