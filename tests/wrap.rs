//! `mcp-budget wrap` and `unwrap` (#29) against fixtures of every client's format, written from
//! each client's documented examples (comments, trailing commas and unusual keys included):
//! golden wrapped files, wrap→unwrap back to the same bytes, wrap→wrap changing nothing, a file
//! that does not parse refused and untouched; then the binary's own behaviour (dry run,
//! backups, permissions, --only/--except, finding a client's files).
//!
//! `MCP_BUDGET_UPDATE_GOLDEN=1 cargo test --test wrap` rewrites the golden files.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use mcp_budget::wrap::{self, Client, Mode, Outcome, Select};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wrap")
}

/// Every fixture, with its client.
const FIXTURES: &[(&str, Client)] = &[
    ("claude-code/.mcp.json", Client::ClaudeCode),
    ("claude-code/.claude.json", Client::ClaudeCode),
    (
        "claude-desktop/claude_desktop_config.json",
        Client::ClaudeDesktop,
    ),
    ("cursor/.cursor/mcp.json", Client::Cursor),
    ("vscode/.vscode/mcp.json", Client::VsCode),
    ("codex/config.toml", Client::Codex),
    ("gemini-cli/.gemini/settings.json", Client::GeminiCli),
    ("opencode/opencode.json", Client::Opencode),
];

fn launcher() -> Vec<String> {
    vec!["mcp-budget".to_string()]
}

fn edit(text: &str, client: Client, mode: Mode) -> wrap::Edited {
    wrap::edit(text, client, mode, &Select::default(), &launcher())
        .unwrap_or_else(|e| panic!("{}:{}: {}", e.line, e.column, e.message))
}

fn golden_path(fixture: &Path) -> PathBuf {
    let mut name = fixture.file_name().expect("name").to_os_string();
    name.push(".wrapped");
    fixture.with_file_name(name)
}

#[test]
fn every_format_wraps_to_its_golden_file() {
    let update = std::env::var_os("MCP_BUDGET_UPDATE_GOLDEN").is_some();
    for (fixture, client) in FIXTURES {
        let path = fixtures().join(fixture);
        assert_eq!(Client::of_file(&path), Some(*client), "{fixture}");
        let text = std::fs::read_to_string(&path).expect("fixture");
        let wrapped = edit(&text, *client, Mode::Wrap).text;
        let golden = golden_path(&path);
        if update {
            std::fs::write(&golden, &wrapped).expect("write golden");
            continue;
        }
        let expected = std::fs::read_to_string(&golden).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (MCP_BUDGET_UPDATE_GOLDEN=1 writes it)",
                golden.display()
            )
        });
        assert!(
            wrapped == expected,
            "{fixture} wrapped differs from {}:\n{}",
            golden.display(),
            wrap::diff(&golden, &expected, &wrapped)
        );
    }
}

#[test]
fn wrap_then_unwrap_gives_back_the_same_bytes() {
    for (fixture, client) in FIXTURES {
        let text = std::fs::read_to_string(fixtures().join(fixture)).expect("fixture");
        let wrapped = edit(&text, *client, Mode::Wrap);
        assert!(
            wrapped
                .rows
                .iter()
                .any(|r| matches!(r.outcome, Outcome::Wrapped { .. })),
            "{fixture}: nothing wrapped: {:?}",
            wrapped.rows
        );
        let back = edit(&wrapped.text, *client, Mode::Unwrap);
        assert!(
            back.text == text,
            "{fixture}: unwrap differs from the original:\n{}",
            wrap::diff(Path::new(fixture), &text, &back.text)
        );
    }
}

#[test]
fn wrap_twice_wraps_nothing_twice() {
    for (fixture, client) in FIXTURES {
        let text = std::fs::read_to_string(fixtures().join(fixture)).expect("fixture");
        let once = edit(&text, *client, Mode::Wrap).text;
        let twice = edit(&once, *client, Mode::Wrap);
        assert_eq!(twice.text, once, "{fixture}");
        assert!(
            twice
                .rows
                .iter()
                .all(|r| matches!(r.outcome, Outcome::Left(_))),
            "{fixture}: {:?}",
            twice.rows
        );
    }
}

#[test]
fn a_wrapped_file_still_parses_as_its_client_reads_it() {
    for (fixture, client) in FIXTURES {
        let text = std::fs::read_to_string(fixtures().join(fixture)).expect("fixture");
        let wrapped = edit(&text, *client, Mode::Wrap).text;
        match client {
            Client::Codex => {
                toml::from_str::<toml::Table>(&wrapped)
                    .unwrap_or_else(|e| panic!("{fixture}: {e}"));
            }
            // VS Code's and this opencode file are JSON with comments; the rest strict JSON.
            Client::VsCode => {}
            _ => {
                serde_json::from_str::<serde_json::Value>(&wrapped)
                    .unwrap_or_else(|e| panic!("{fixture}: {e}"));
            }
        }
    }
}

/// What each fixture's entries became.
#[test]
fn entries_are_wrapped_or_left_with_a_reason() {
    let outcome = |fixture: &str, client: Client, server: &str| -> Outcome {
        let text = std::fs::read_to_string(fixtures().join(fixture)).expect("fixture");
        edit(&text, client, Mode::Wrap)
            .rows
            .into_iter()
            .find(|r| r.server == server)
            .unwrap_or_else(|| panic!("{fixture}: no row for {server}"))
            .outcome
    };
    let left = |o: Outcome| match o {
        Outcome::Left(reason) => reason,
        other => panic!("not left: {other:?}"),
    };
    assert!(
        left(outcome(
            "claude-code/.mcp.json",
            Client::ClaudeCode,
            "sentry"
        ))
        .contains("SSE")
    );
    assert!(
        left(outcome(
            "gemini-cli/.gemini/settings.json",
            Client::GeminiCli,
            "sseServer"
        ))
        .contains("SSE")
    );
    assert!(
        left(outcome(
            "cursor/.cursor/mcp.json",
            Client::Cursor,
            "already"
        ))
        .contains("already runs mcp-budget")
    );
    assert!(matches!(
        outcome(
            "claude-code/.claude.json",
            Client::ClaudeCode,
            "everything (project /home/me/app)"
        ),
        Outcome::Wrapped { .. }
    ));
}

#[test]
fn a_secret_header_goes_to_env_never_to_args() {
    let text = std::fs::read_to_string(fixtures().join("gemini-cli/.gemini/settings.json"))
        .expect("fixture");
    let wrapped = edit(&text, Client::GeminiCli, Mode::Wrap).text;
    let value: serde_json::Value = serde_json::from_str(&wrapped).expect("JSON");
    let entry = &value["mcpServers"]["httpServerWithAuth"];
    let args = entry["args"].to_string();
    assert!(!args.contains("your-api-token"), "{args}");
    assert!(
        args.contains("Authorization: ${MCP_BUDGET_HEADER_AUTHORIZATION}"),
        "{args}"
    );
    assert_eq!(
        entry["env"]["MCP_BUDGET_HEADER_AUTHORIZATION"],
        "Bearer your-api-token"
    );
    assert!(entry.get("headers").is_none() && entry.get("httpUrl").is_none());
    assert_eq!(entry["timeout"], 5000, "other keys stay");
}

#[test]
fn a_rotated_token_survives_unwrap() {
    let text = std::fs::read_to_string(fixtures().join("claude-code/.mcp.json")).expect("fixture");
    let wrapped = edit(&text, Client::ClaudeCode, Mode::Wrap).text;
    let rotated = wrapped.replace("\"blue\"", "\"green\"");
    assert_ne!(rotated, wrapped);
    let back = edit(&rotated, Client::ClaudeCode, Mode::Unwrap).text;
    assert_eq!(back, text.replace("\"blue\"", "\"green\""));
}

#[test]
fn a_file_that_does_not_parse_is_refused_with_its_position() {
    for (fixture, client, line) in [
        ("broken/.mcp.json", Client::ClaudeCode, 5),
        ("broken/config.toml", Client::Codex, 3),
    ] {
        let text = std::fs::read_to_string(fixtures().join(fixture)).expect("fixture");
        let err = wrap::edit(&text, client, Mode::Wrap, &Select::default(), &launcher())
            .expect_err("a broken file");
        assert_eq!(err.line, line, "{fixture}: {}", err.message);
    }
}

// The binary.

/// A fresh folder with one fixture copied in under its own relative path.
fn scratch(fixture: &str) -> (tempdir::Dir, PathBuf) {
    let dir = tempdir::Dir::new();
    let path = dir.path().join(fixture);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::copy(fixtures().join(fixture), &path).expect("copy");
    (dir, path)
}

mod tempdir {
    use std::path::{Path, PathBuf};

    /// A folder removed when dropped.
    pub struct Dir(PathBuf);

    impl Dir {
        pub fn new() -> Dir {
            static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path =
                std::env::temp_dir().join(format!("mcp-budget-wrap-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).expect("temp dir");
            Dir(path)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn bin(args: &[&str], cwd: &Path, home: &Path) -> std::process::Output {
    std::process::Command::new(common::proxy_bin())
        .args(args)
        .current_dir(cwd)
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("CODEX_HOME")
        .output()
        .expect("run mcp-budget")
}

#[test]
fn dry_run_prints_a_diff_and_a_table_and_writes_nothing() {
    let (dir, path) = scratch("claude-code/.mcp.json");
    let before = std::fs::read(&path).expect("read");
    let out = bin(
        &[
            "wrap",
            "--dry-run",
            "--launcher",
            "mcp-budget",
            path.to_str().expect("path"),
        ],
        dir.path(),
        dir.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("-      \"command\": \"npx\","), "{stdout}");
    assert!(
        stdout.contains("+      \"command\": \"mcp-budget\","),
        "{stdout}"
    );
    assert!(stdout.contains("would wrap"), "{stdout}");
    assert!(stdout.contains("sentry"), "{stdout}");
    assert_eq!(std::fs::read(&path).expect("read"), before);
    assert!(!wrap::backup_path(&path).exists());
}

#[test]
fn wrap_writes_a_backup_keeps_the_mode_and_unwrap_restores_the_bytes() {
    let (dir, path) = scratch("codex/config.toml");
    let before = std::fs::read(&path).expect("read");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let p = path.to_str().expect("path");
    let out = bin(
        &["wrap", "--launcher", "mcp-budget", p],
        dir.path(),
        dir.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("backup:"), "{stdout}");
    assert_eq!(
        std::fs::read(wrap::backup_path(&path)).expect("backup"),
        before
    );
    let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_ne!(std::fs::read(&path).expect("read"), before);
    // No temporary file is left behind.
    let left: Vec<_> = std::fs::read_dir(path.parent().expect("dir"))
        .expect("ls")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // The backup goes; unwrap needs only the file.
    std::fs::remove_file(wrap::backup_path(&path)).expect("rm backup");
    let out = bin(&["unwrap", p], dir.path(), dir.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&path).expect("read"), before);
}

#[test]
fn only_and_except_choose_the_entries() {
    let (dir, path) = scratch("claude-desktop/claude_desktop_config.json");
    let p = path.to_str().expect("path");
    let out = bin(
        &["wrap", "--launcher", "mcp-budget", "--only", "weather", p],
        dir.path(),
        dir.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let value: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("JSON");
    assert_eq!(value["mcpServers"]["weather"]["command"], "mcp-budget");
    assert_eq!(value["mcpServers"]["filesystem"]["command"], "npx");
    let out = bin(
        &[
            "wrap",
            "--launcher",
            "mcp-budget",
            "--except",
            "filesystem",
            p,
        ],
        dir.path(),
        dir.path(),
    );
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to change"));
    let out = bin(&["wrap", "--only", "nope", p], dir.path(), dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--only \"nope\" names no server"));
}

#[test]
fn a_broken_file_is_left_untouched_with_exit_2() {
    let (dir, path) = scratch("broken/.mcp.json");
    let before = std::fs::read(&path).expect("read");
    let out = bin(
        &["wrap", path.to_str().expect("path")],
        dir.path(),
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{}:5:", path.display())),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&path).expect("read"), before);
    assert!(!wrap::backup_path(&path).exists());
}

#[test]
fn client_finds_the_project_and_user_files() {
    let dir = tempdir::Dir::new();
    let project = dir.path().join("app");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&project).expect("mkdir");
    std::fs::create_dir_all(&home).expect("mkdir");
    std::fs::copy(
        fixtures().join("claude-code/.mcp.json"),
        project.join(".mcp.json"),
    )
    .expect("copy");
    std::fs::copy(
        fixtures().join("claude-code/.claude.json"),
        home.join(".claude.json"),
    )
    .expect("copy");
    let out = bin(
        &[
            "wrap",
            "--client",
            "claude-code",
            "--launcher",
            "mcp-budget",
        ],
        &project,
        &home,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for file in [project.join(".mcp.json"), home.join(".claude.json")] {
        let text = std::fs::read_to_string(&file).expect("read");
        assert!(text.contains("MCP_BUDGET_WRAPPED"), "{}", file.display());
    }
    // A client with no file anywhere: the places looked at, exit 2.
    let out = bin(&["wrap", "--client", "cursor"], &project, &home);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(".cursor/mcp.json"), "{stderr}");
    let out = bin(&["unwrap", "--client", "claude-code"], &project, &home);
    assert!(out.status.success());
    assert_eq!(
        std::fs::read(project.join(".mcp.json")).expect("read"),
        std::fs::read(fixtures().join("claude-code/.mcp.json")).expect("read")
    );
}
