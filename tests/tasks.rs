//! Tool results delivered through tasks are budgeted as the call's own answer would be, through
//! the real binary in front of the quirky server (which runs `journal` and `rows` as tasks):
//! the 2025-11-25 `tasks/result`, the tasks extension's completed `tasks/get` and its
//! `notifications/tasks`. Following `after` on the tool continues the chain from the cache (the
//! tool ran once), and a Codex client gets Codex-sized pages.

mod common;

use common::{Peer, example};
use serde_json::{Value, json};

struct Client {
    peer: Peer,
    next_id: u64,
    modern: bool,
}

const MODERN: &str = "2026-07-28";

impl Client {
    /// The proxy (no policy) in front of quirky; a legacy client named `client` (initialized),
    /// or a modern one (no initialize: every request carries its `_meta`).
    async fn start(client: &str, modern: bool, env: &[(&str, &str)]) -> Client {
        let quirky = example("quirky_server");
        let mut command = tokio::process::Command::new(common::proxy_bin());
        command.args(["--policy", "none", "--"]).arg(&quirky);
        for (key, value) in env {
            command.env(key, value);
        }
        let peer = Peer::from_command(command);
        let mut me = Client {
            peer,
            next_id: 0,
            modern,
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
            "io.modelcontextprotocol/clientInfo": {"name": "tasks-test", "version": "1"},
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

#[tokio::test]
async fn a_completed_task_in_notifications_tasks_is_paged() {
    let mut client = Client::start("tasks-test", true, &[("QUIRKY_TASK_NOTIFY", "1")]).await;
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
        if message["method"] == "notifications/tasks" {
            notified = Some((message, line.len()));
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
