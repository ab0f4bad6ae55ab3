//! A wrapped configuration works as its client launches it (#29): the test wraps a Claude Code
//! `.mcp.json` with the real binary, reads the wrapped entry as Claude Code does (command, args,
//! env; `${VAR}` expanded from the client's environment, an unset one left as written), starts
//! it with the built `mcp-budget` first on PATH, and pages a 3 MB result through it to the end:
//! once for a stdio entry, once for a remote entry in front of a local Streamable HTTP server
//! that refuses any request without its bearer token; and a Codex remote entry, started with
//! the environment Codex gives a stdio server.

#![allow(deprecated)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{Peer, handshake};
use rmcp::model::*;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};

const TOKEN: &str = "s3cret-wrap-token";

/// A scratch folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "mcp-budget-wrap-launch-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Runs `mcp-budget wrap` on `dir/.mcp.json` as a user would (`--client claude-code`, the
/// launcher being `mcp-budget` on PATH); returns the wrapped entry `server`.
fn wrap_in(dir: &Path, server: &str) -> Value {
    let out = std::process::Command::new(common::proxy_bin())
        .args([
            "wrap",
            "--client",
            "claude-code",
            "--launcher",
            "mcp-budget",
        ])
        .current_dir(dir)
        .env("HOME", dir)
        .output()
        .expect("run wrap");
    assert!(
        out.status.success(),
        "wrap failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(dir.join(".mcp.json")).expect("wrapped file");
    let config: Value = serde_json::from_str(&text).expect("the wrapped file is JSON");
    config["mcpServers"][server].clone()
}

/// Claude Code's expansion of `${VAR}` and `${VAR:-default}` (its docs: command, args, env,
/// url, headers); an unset variable without a default stays as written.
fn expand(text: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else {
            break;
        };
        let inner = &rest[start + 2..start + end];
        let (name, default) = match inner.split_once(":-") {
            Some((name, default)) => (name, Some(default)),
            None => (inner, None),
        };
        match (env.iter().find(|(k, _)| k == name), default) {
            (Some((_, value)), _) => out.push_str(value),
            (None, Some(default)) => out.push_str(default),
            (None, None) => out.push_str(&rest[start..start + end + 1]),
        }
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

/// Starts a stdio entry as Claude Code does: its command on PATH (the built mcp-budget's folder
/// first), its args, the client's environment plus the entry's `env`.
fn launch(entry: &Value) -> Peer {
    let bin_dir = common::proxy_bin().parent().expect("bin dir").to_path_buf();
    let path = std::env::join_paths(std::iter::once(bin_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("PATH");
    let client_env: Vec<(String, String)> = std::env::vars().collect();
    let command = expand(entry["command"].as_str().expect("command"), &client_env);
    let args: Vec<String> = entry["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| expand(a.as_str().expect("string arg"), &client_env))
        .collect();
    let mut cmd = tokio::process::Command::new(&command);
    // Resolved on the PATH the child gets, as a client's spawn does.
    cmd.env("PATH", &path);
    if let Some(found) = std::env::split_paths(&path)
        .map(|d| d.join(&command))
        .find(|p| p.is_file())
    {
        cmd = tokio::process::Command::new(found);
        cmd.env("PATH", &path);
    }
    cmd.args(&args).env("MCP_BUDGET_TEST_KEY", "k");
    for (name, value) in entry["env"].as_object().into_iter().flatten() {
        cmd.env(
            name,
            expand(value.as_str().expect("string env"), &client_env),
        );
    }
    Peer::from_command(cmd)
}

/// The cursor a page's notice gives, if any.
fn next_after(result: &Value) -> Option<String> {
    let blocks = result["content"].as_array()?;
    let notice = blocks.last()?["text"].as_str()?;
    let start = notice.find("after:\"")? + "after:\"".len();
    let end = notice[start..].find('"')? + start;
    Some(notice[start..end].to_string())
}

/// Calls `tool` and follows its pages to the end; the text of every page but the notices, and
/// how many pages there were.
async fn read_all_pages(peer: &mut Peer, tool: &str, arguments: Value) -> (String, usize) {
    let mut text = String::new();
    let mut after: Option<String> = None;
    for (id, pages) in (2..).zip(1..) {
        let mut args = arguments.clone();
        if let Some(cursor) = &after {
            args["after"] = json!(cursor);
        }
        let request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": args}});
        peer.send(&request.to_string()).await;
        let answer = peer.recv_json().await;
        let result = &answer["result"];
        assert_ne!(result["isError"], true, "{answer}");
        let blocks = result["content"].as_array().expect("content");
        after = next_after(result);
        let data = if after.is_some() || blocks.len() > 1 {
            &blocks[..blocks.len() - 1]
        } else {
            &blocks[..]
        };
        for block in data {
            text.push_str(block["text"].as_str().unwrap_or_default());
        }
        if after.is_none() {
            return (text, pages);
        }
        assert!(pages < 400, "the chain does not end");
    }
    unreachable!()
}

#[tokio::test]
async fn a_wrapped_stdio_entry_runs_as_claude_code_starts_it() {
    let dir = scratch("stdio");
    let server = common::example("quirky_server");
    std::fs::write(
        dir.join(".mcp.json"),
        serde_json::to_string_pretty(&json!({
            "mcpServers": {
                "quirky": {"command": server, "args": [], "env": {"QUIRKY": "1"}}
            }
        }))
        .expect("json"),
    )
    .expect("write config");
    let entry = wrap_in(&dir, "quirky");
    assert_eq!(entry["command"], "mcp-budget");
    assert_eq!(entry["env"]["QUIRKY"], "1");
    let mut peer = launch(&entry);
    handshake(&mut peer).await;
    // 3,000,000 bytes in lines of 100: more than a page; every byte arrives once.
    let (text, pages) =
        read_all_pages(&mut peer, "big", json!({"bytes": 3_000_000, "line": 100})).await;
    assert!(pages > 1, "a 3 MB result comes in pages");
    assert_eq!(text.len(), 3_000_000);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Streamable HTTP server with `read_file` (a 3 MB text of numbered lines) that refuses any
/// request without `Authorization: Bearer TOKEN`; its URL, and how many it refused.
async fn bearer_server() -> (String, Arc<AtomicUsize>) {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let service = StreamableHttpService::new(
        || Ok(FileServer),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_sse_keep_alive(None),
    );
    let refused = Arc::new(AtomicUsize::new(0));
    let counter = refused.clone();
    let router =
        axum::Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn(
                move |request: axum::extract::Request, next: axum::middleware::Next| {
                    let counter = counter.clone();
                    async move {
                        let ok = request
                            .headers()
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            == Some(&format!("Bearer {TOKEN}"));
                        if ok {
                            next.run(request).await
                        } else {
                            counter.fetch_add(1, Ordering::Relaxed);
                            axum::response::IntoResponse::into_response((
                                axum::http::StatusCode::UNAUTHORIZED,
                                "a bearer token is required",
                            ))
                        }
                    }
                },
            ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (format!("http://{addr}/mcp"), refused)
}

fn file_text() -> String {
    (0..30_000)
        .map(|i| format!("line {i:06} of the large file, padded to about a hundred bytes ........................\n"))
        .collect()
}

#[derive(Clone)]
struct FileServer;

impl ServerHandler for FileServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("bearer-file-server", "1.0.0"))
    }

    async fn list_tools(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema: JsonObject = serde_json::from_value(
            json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        )
        .expect("schema");
        Ok(ListToolsResult::with_all_items(vec![Tool::new(
            "read_file",
            "Reads a file.",
            schema,
        )]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        match request.name.as_ref() {
            "read_file" => {
                Ok(CallToolResult::success(vec![ContentBlock::text(file_text())]).into())
            }
            other => Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        }
    }
}

#[tokio::test]
async fn a_wrapped_remote_entry_reaches_its_server_with_the_header_from_env() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (url, refused) = bearer_server().await;
    let dir = scratch("remote");
    std::fs::write(
        dir.join(".mcp.json"),
        serde_json::to_string_pretty(&json!({
            "mcpServers": {
                "files": {
                    "type": "http",
                    "url": url,
                    "headers": {"Authorization": format!("Bearer {TOKEN}")}
                }
            }
        }))
        .expect("json"),
    )
    .expect("write config");
    let entry = wrap_in(&dir, "files");
    assert_eq!(entry["type"], "stdio");
    let args = entry["args"].to_string();
    assert!(
        !args.contains(TOKEN),
        "the token is in args, where ps shows it: {args}"
    );
    assert!(args.contains("--upstream"), "{args}");
    let mut peer = launch(&entry);
    handshake(&mut peer).await;
    let (text, pages) = read_all_pages(&mut peer, "read_file", json!({"path": "big.txt"})).await;
    assert!(pages > 1, "a 3 MB file comes in pages");
    assert_eq!(text, file_text(), "every line, once, in order");
    assert_eq!(
        refused.load(Ordering::Relaxed),
        0,
        "every request carried the token"
    );
    // Without the header's variable the proxy stops at once, naming it.
    let mut bare = entry.clone();
    bare["env"]
        .as_object_mut()
        .expect("env")
        .remove("MCP_BUDGET_HEADER_AUTHORIZATION");
    let mut peer = launch(&bare);
    let status = peer.wait().await;
    assert_eq!(status.code(), Some(2));
    let stderr = peer.stderr().await;
    assert!(
        stderr.contains("MCP_BUDGET_HEADER_AUTHORIZATION"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Codex passes a stdio server only a few variables of its own environment and those its entry
/// names in `env_vars` (docs/config.md): the wrapped remote entry's `bearer_token_env_var`
/// becomes `--upstream-header "Authorization: Bearer ${VAR}"` with VAR in `env_vars`.
#[tokio::test]
async fn a_wrapped_codex_remote_entry_gets_its_token_from_codexs_environment() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (url, refused) = bearer_server().await;
    let dir = scratch("codex");
    std::fs::write(
        dir.join("config.toml"),
        format!(
            "model = \"o3\"\n\n[mcp_servers.files]\nurl = \"{url}\"\nbearer_token_env_var = \"FILES_TOKEN\"\n"
        ),
    )
    .expect("write config");
    let out = std::process::Command::new(common::proxy_bin())
        .args(["wrap", "--client", "codex", "--launcher", "mcp-budget"])
        .current_dir(&dir)
        .env("HOME", &dir)
        .env("CODEX_HOME", &dir)
        .output()
        .expect("run wrap");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(dir.join("config.toml")).expect("wrapped");
    let config: toml::Table = toml::from_str(&text).expect("TOML");
    let entry = &config["mcp_servers"]["files"];
    let words = |key: &str| -> Vec<String> {
        entry
            .get(key)
            .and_then(|v| v.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(words("env_vars"), vec!["FILES_TOKEN".to_string()]);
    // As Codex starts it: a cleared environment with PATH and HOME, the variables env_vars
    // names (from Codex's environment, where the user keeps the token), and the entry's env.
    let bin_dir = common::proxy_bin().parent().expect("bin dir").to_path_buf();
    let command = entry["command"].as_str().expect("command");
    let mut cmd = tokio::process::Command::new(bin_dir.join(command));
    cmd.env_clear()
        .env("PATH", bin_dir)
        .env("HOME", &dir)
        .env("MCP_BUDGET_TEST_KEY", "k")
        .args(words("args"));
    let codex_env = [("FILES_TOKEN", TOKEN)];
    for var in words("env_vars") {
        if let Some((_, value)) = codex_env.iter().find(|(k, _)| *k == var) {
            cmd.env(&var, value);
        }
    }
    for (name, value) in entry
        .get("env")
        .and_then(|e| e.as_table())
        .into_iter()
        .flatten()
    {
        cmd.env(name, value.as_str().expect("string env"));
    }
    let mut peer = Peer::from_command(cmd);
    handshake(&mut peer).await;
    let (text, pages) = read_all_pages(&mut peer, "read_file", json!({"path": "big.txt"})).await;
    assert!(pages > 1);
    assert_eq!(text, file_text());
    assert_eq!(refused.load(Ordering::Relaxed), 0);
    let _ = std::fs::remove_dir_all(&dir);
}
