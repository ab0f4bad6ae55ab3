//! `mcp-budget wrap` and `unwrap` (#29) against fixtures of every client's format, written from
//! each client's documented examples (comments, trailing commas and unusual keys included):
//! golden wrapped files, wrap→unwrap back to the same bytes, wrap→wrap changing nothing, a file
//! that does not parse refused and untouched; then the binary's own behaviour (dry run,
//! backups, permissions, --only/--except, finding a client's files).
//!
//! `MCP_BUDGET_UPDATE_GOLDEN=1 cargo test --test wrap` rewrites the golden files.

mod common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
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
fn an_entry_that_signs_in_through_its_client_is_signed_in_by_the_proxy() {
    let text = std::fs::read_to_string(fixtures().join("gemini-cli/.gemini/settings.json"))
        .expect("fixture");
    let edited = edit(&text, Client::GeminiCli, Mode::Wrap);
    let value: serde_json::Value = serde_json::from_str(&edited.text).expect("JSON");
    let notion = &value["mcpServers"]["notion"];
    let args = notion["args"].to_string();
    assert!(!args.contains("notion-secret"), "{args}");
    assert!(
        args.contains(r#""--upstream-client-id","notion-client","--upstream-client-secret-env","MCP_BUDGET_CLIENT_SECRET""#),
        "{args}"
    );
    assert_eq!(notion["env"]["MCP_BUDGET_CLIENT_SECRET"], "notion-secret");
    assert!(
        notion.get("oauth").is_none(),
        "the client's own sign-in is taken out"
    );
    assert!(
        !edited.text.contains("notion-secret\\\""),
        "the secret is not in the marker"
    );
    let row = |server: &str| {
        edited
            .rows
            .iter()
            .find(|r| r.server == server)
            .unwrap_or_else(|| panic!("no row for {server}"))
            .outcome
            .clone()
    };
    match row("discovered") {
        Outcome::Wrapped { login, .. } => {
            assert_eq!(login.as_deref(), Some("https://mcp.example.org/mcp"))
        }
        other => panic!("{other:?}"),
    }
    match row("httpServerWithAuth") {
        Outcome::Wrapped { login, .. } => assert_eq!(login, None, "it sends its own token"),
        other => panic!("{other:?}"),
    }
    match row("gcloud") {
        Outcome::Left(reason) => assert!(reason.contains("google_credentials"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // A secret changed since comes back as it is then.
    let rotated = edited
        .text
        .replace("\"notion-secret\"", "\"notion-rotated\"");
    let back = edit(&rotated, Client::GeminiCli, Mode::Unwrap).text;
    assert_eq!(back, text.replace("notion-secret", "notion-rotated"));
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

/// Runs the binary with `args`, failing the test if it does not end within 10 s (a FIFO opened
/// for reading blocks until a writer comes).
fn bin_within(args: &[&str], cwd: &Path, home: &Path) -> std::process::Output {
    let mut child = std::process::Command::new(common::proxy_bin())
        .args(args)
        .current_dir(cwd)
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("CODEX_HOME")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run mcp-budget");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mcp-budget {args:?} did not end within 10 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
}

/// (1) The backup wrap writes holds the file as it was, tokens included: it is created with the
/// file's own mode, and unwrap removes it once no entry is wrapped any more (while some stay
/// wrapped, the backup unwrap writes has the file's mode too).
#[test]
fn unwrap_removes_the_backup_and_a_backup_kept_has_the_files_mode() {
    let (dir, path) = scratch("claude-desktop/claude_desktop_config.json");
    let before = std::fs::read(&path).expect("read");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let p = path.to_str().expect("path");
    let backup = wrap::backup_path(&path);
    ok(&bin(
        &["wrap", "--launcher", "mcp-budget", p],
        dir.path(),
        dir.path(),
    ));
    assert_eq!(std::fs::read(&backup).expect("backup"), before);
    assert_eq!(
        mode_of(&backup),
        0o600,
        "the backup is no wider than the file"
    );
    // Part of it unwrapped: a backup is kept, with the file's mode.
    let stdout = ok(&bin(
        &["unwrap", "--only", "weather", p],
        dir.path(),
        dir.path(),
    ));
    assert!(stdout.contains("backup:"), "{stdout}");
    assert_eq!(mode_of(&backup), 0o600);
    // The rest: the file is as it was, and the backup is gone.
    let stdout = ok(&bin(&["unwrap", p], dir.path(), dir.path()));
    assert_eq!(std::fs::read(&path).expect("read"), before);
    assert!(!backup.exists(), "unwrap left {}", backup.display());
    assert!(stdout.contains("backup removed:"), "{stdout}");
    assert_eq!(mode_of(&path), 0o600);
}

/// (2) `--dry-run` shows header values, secret-looking variables and `--upstream-header` values
/// as `***`; the real wrap writes them as they are.
#[test]
fn dry_run_masks_secrets_in_its_diff() {
    let dir = tempdir::Dir::new();
    let path = dir.path().join(".mcp.json");
    std::fs::write(
        &path,
        r#"{
  "mcpServers": {
    "api": {
      "type": "http",
      "url": "https://mcp.example.com/mcp",
      "headers": {
        "Authorization": "Bearer sk-live-123",
        "X-Team": "team-blue-77"
      }
    },
    "db": {
      "command": "node",
      "args": ["db.js"],
      "env": {
        "DB_PASSWORD": "hunter2-pw",
        "github_token": "ghp-tok-456",
        "DEBUG": "verbose-1"
      }
    },
    "one": {"command": "node", "args": ["o.js"], "env": {"OPENAI_API_KEY": "sk-one-789"}}
  }
}
"#,
    )
    .expect("write");
    let p = path.to_str().expect("path");
    let stdout = ok(&bin(
        &["wrap", "--dry-run", "--launcher", "mcp-budget", p],
        dir.path(),
        dir.path(),
    ));
    for secret in [
        "sk-live-123",
        "team-blue-77",
        "hunter2-pw",
        "ghp-tok-456",
        "sk-one-789",
    ] {
        assert!(!stdout.contains(secret), "{secret} shown:\n{stdout}");
    }
    for shown in [
        r#"-        "Authorization": "***","#,
        r#""MCP_BUDGET_HEADER_AUTHORIZATION": "***""#,
        r#""Authorization: ***""#,
        r#""X-Team: ***""#,
        r#""DB_PASSWORD": "***""#,
        r#""github_token": "***""#,
        r#""DEBUG": "verbose-1""#,
        r#""OPENAI_API_KEY": "***""#,
    ] {
        assert!(stdout.contains(shown), "no {shown}:\n{stdout}");
    }
    // The write itself is not masked.
    ok(&bin(
        &["wrap", "--launcher", "mcp-budget", p],
        dir.path(),
        dir.path(),
    ));
    let value: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("JSON");
    let servers = &value["mcpServers"];
    assert_eq!(
        servers["api"]["env"]["MCP_BUDGET_HEADER_AUTHORIZATION"],
        "Bearer sk-live-123"
    );
    assert_eq!(servers["db"]["env"]["DB_PASSWORD"], "hunter2-pw");
    assert_eq!(servers["one"]["env"]["OPENAI_API_KEY"], "sk-one-789");
    // Unwrap's dry run masks them too.
    let stdout = ok(&bin(&["unwrap", "--dry-run", p], dir.path(), dir.path()));
    assert!(!stdout.contains("sk-live-123"), "{stdout}");
    assert!(!stdout.contains("hunter2-pw"), "{stdout}");
}

#[test]
fn dry_run_masks_secrets_in_a_toml_diff() {
    let dir = tempdir::Dir::new();
    let path = dir.path().join("config.toml");
    std::fs::write(
        &path,
        r#"[mcp_servers.api]
url = "https://mcp.example.com/mcp"
http_headers = { "X-Api-Key" = "xk-secret-1" }

[mcp_servers.db]
command = "node"
args = ["db.js"]

[mcp_servers.db.env]
SERVICE_TOKEN = "st-secret-2"
LOG = "info-3"
"#,
    )
    .expect("write");
    let p = path.to_str().expect("path");
    let stdout = ok(&bin(
        &["wrap", "--dry-run", "--launcher", "mcp-budget", p],
        dir.path(),
        dir.path(),
    ));
    assert!(!stdout.contains("xk-secret-1"), "{stdout}");
    assert!(!stdout.contains("st-secret-2"), "{stdout}");
    assert!(
        stdout.contains(r#"-http_headers = { "X-Api-Key" = "***" }"#),
        "{stdout}"
    );
    assert!(stdout.contains(r#""X-Api-Key: ***""#), "{stdout}");
    assert!(stdout.contains(r#"LOG = "info-3""#), "{stdout}");
    ok(&bin(
        &["wrap", "--launcher", "mcp-budget", p],
        dir.path(),
        dir.path(),
    ));
    let text = std::fs::read_to_string(&path).expect("read");
    assert!(text.contains("xk-secret-1") && text.contains("st-secret-2"));
}

/// (3) A configuration that is a symbolic link (to a dotfiles folder): the file it points to is
/// edited, replaced in its own folder, and the link stays a link, through wrap and unwrap.
#[test]
fn a_symlinked_config_is_edited_through_the_link() {
    let dir = tempdir::Dir::new();
    let dotfiles = dir.path().join("dotfiles");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&dotfiles).expect("mkdir");
    std::fs::create_dir_all(&home).expect("mkdir");
    let target = dotfiles.join("claude.json");
    std::fs::copy(fixtures().join("claude-code/.claude.json"), &target).expect("copy");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    let before = std::fs::read(&target).expect("read");
    let link = home.join(".claude.json");
    std::os::unix::fs::symlink("../dotfiles/claude.json", &link).expect("symlink");
    let is_link = |p: &Path| {
        std::fs::symlink_metadata(p)
            .expect("lstat")
            .file_type()
            .is_symlink()
    };
    let stdout = ok(&bin(
        &[
            "wrap",
            "--launcher",
            "mcp-budget",
            link.to_str().expect("path"),
        ],
        &home,
        &home,
    ));
    assert!(is_link(&link), "the link was replaced by a file");
    let text = std::fs::read_to_string(&target).expect("read");
    assert!(text.contains("MCP_BUDGET_WRAPPED"), "{text}");
    assert_eq!(mode_of(&target), 0o640);
    assert!(wrap::backup_path(&target).exists(), "{stdout}");
    for folder in [&dotfiles, &home] {
        let left: Vec<_> = std::fs::read_dir(folder)
            .expect("ls")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
    // --client finds it through the link too.
    ok(&bin(&["unwrap", "--client", "claude-code"], &home, &home));
    assert!(is_link(&link));
    assert_eq!(std::fs::read(&target).expect("read"), before);
    assert!(!wrap::backup_path(&target).exists());
}

/// (4) A key written twice on the way to the servers: the client reads the last one, an edit of
/// the first would do nothing. Refused with the second one's place and the fix, exit 2.
#[test]
fn a_key_written_twice_is_refused_with_its_place() {
    let dir = tempdir::Dir::new();
    let cases = [
        (
            ".mcp.json",
            "{\n  \"mcpServers\": {\"a\": {\"command\": \"x\"}},\n  \"mcpServers\": {\"b\": {\"command\": \"y\"}}\n}\n",
            ":3:3:",
        ),
        (
            ".mcp.json",
            "{\n  \"mcpServers\": {\n    \"a\": {\"command\": \"x\"},\n    \"b\": {\"command\": \"y\"},\n    \"a\": {\"command\": \"z\"}\n  }\n}\n",
            ":5:5:",
        ),
        (
            "config.toml",
            "[mcp_servers.a]\ncommand = \"x\"\n\n[mcp_servers.a]\ncommand = \"y\"\n",
            ":4:14:",
        ),
    ];
    for (name, text, place) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        for mode in ["wrap", "unwrap"] {
            let out = bin(
                &[mode, path.to_str().expect("path")],
                dir.path(),
                dir.path(),
            );
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{name} {mode}: {stderr}");
            assert!(
                stderr.contains(&format!("{}{place}", path.display())),
                "{name} {mode}: {stderr}"
            );
            assert!(stderr.contains("keep one of the two"), "{stderr}");
            assert_eq!(std::fs::read_to_string(&path).expect("read"), text);
            assert!(!wrap::backup_path(&path).exists());
        }
    }
}

/// (5) A FIFO, a directory or a device where the file should be: refused at once (never a
/// blocked open), exit 2, the message naming what it is and the fix.
#[test]
fn what_is_not_a_regular_file_is_refused_at_once() {
    let dir = tempdir::Dir::new();
    let fifo = dir.path().join(".mcp.json");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let folder = dir.path().join("app/.cursor/mcp.json");
    std::fs::create_dir_all(&folder).expect("mkdir");
    for (args, what, shown) in [
        (
            vec!["wrap", fifo.to_str().expect("path")],
            "a FIFO",
            fifo.clone(),
        ),
        (
            vec!["wrap", "--client", "claude-code"],
            "a FIFO",
            fifo.clone(),
        ),
        (
            vec!["unwrap", fifo.to_str().expect("path")],
            "a FIFO",
            fifo.clone(),
        ),
        (
            vec!["wrap", folder.to_str().expect("path")],
            "a directory",
            folder.clone(),
        ),
        (
            vec!["wrap", "--client", "claude-code", "/dev/null"],
            "a character device",
            PathBuf::from("/dev/null"),
        ),
    ] {
        let out = bin_within(&args, dir.path(), dir.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!("{} is {what}", shown.display())),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains("give the path of that file"), "{stderr}");
    }
    assert!(
        std::fs::symlink_metadata(&fifo)
            .expect("lstat")
            .file_type()
            .is_fifo()
    );
}

/// (6) A one-line entry changed by its user after wrap (a rotated key, a variable added, the
/// server's own arguments): unwrap takes out only what wrap put in.
#[test]
fn unwrap_keeps_what_the_user_changed_in_a_one_line_entry_since_wrap() {
    let dir = tempdir::Dir::new();
    let path = dir.path().join(".mcp.json");
    let text = r#"{
  "mcpServers": {
    "one": {"command": "node", "args": ["s.js"], "env": {"API_KEY": "old-key"}},
    "bare": {"command": "my-server"},
    "remote": {"type": "http", "url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer old-token"}, "timeout": 5},
    "multi": {
      "command": "npx",
      "args": ["-y", "server"],
      "env": {"TOKEN": "old-env"}
    }
  }
}
"#;
    std::fs::write(&path, text).expect("write");
    let p = path.to_str().expect("path");
    ok(&bin(
        &["wrap", "--launcher", "mcp-budget", p],
        dir.path(),
        dir.path(),
    ));
    let wrapped = std::fs::read_to_string(&path).expect("read");
    // Each one-line entry is still on one line.
    for name in ["\"one\"", "\"bare\"", "\"remote\""] {
        let line = wrapped
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("{name} not on one line:\n{wrapped}"));
        assert!(line.contains("MCP_BUDGET_WRAPPED"), "{line}");
    }
    // The user's edits after wrap.
    let edited = wrapped
        .replace(
            r#""API_KEY": "old-key""#,
            r#""API_KEY": "new-key", "EXTRA": "1""#,
        )
        .replace(r#""s.js""#, r#""t.js""#)
        .replace(r#""Bearer old-token""#, r#""Bearer new-token""#)
        .replace(r#""timeout": 5"#, r#""timeout": 9"#)
        .replace(
            r#""TOKEN": "old-env""#,
            r#""TOKEN": "new-env", "MORE": "2""#,
        )
        .replace(r#""my-server"]"#, r#""my-server", "--fast"]"#)
        .replace(r#""server"]"#, r#""server2"]"#);
    assert_ne!(edited, wrapped);
    std::fs::write(&path, &edited).expect("write");
    ok(&bin(&["unwrap", p], dir.path(), dir.path()));
    let back = std::fs::read_to_string(&path).expect("read");
    let expected = text
        .replace(
            r#""API_KEY": "old-key""#,
            r#""API_KEY": "new-key", "EXTRA": "1""#,
        )
        .replace(r#""s.js""#, r#""t.js""#)
        .replace(r#""Bearer old-token""#, r#""Bearer new-token""#)
        .replace(r#""timeout": 5"#, r#""timeout": 9"#)
        .replace(
            r#""TOKEN": "old-env""#,
            r#""TOKEN": "new-env", "MORE": "2""#,
        )
        .replace(
            r#"{"command": "my-server"}"#,
            r#"{"command": "my-server", "args": ["--fast"]}"#,
        )
        .replace(r#""server"]"#, r#""server2"]"#);
    assert!(
        back == expected,
        "{}",
        wrap::diff(Path::new(".mcp.json"), &expected, &back)
    );
}

#[test]
fn unwrap_keeps_what_the_user_changed_in_an_inline_toml_entry_since_wrap() {
    let dir = tempdir::Dir::new();
    let path = dir.path().join("config.toml");
    let text = "[mcp_servers]\nfs = { command = \"npx\", args = [\"-y\", \"fs-server\"], env = { API_KEY = \"old\" } }\n\n[mcp_servers.api]\nurl = \"https://mcp.example.com/mcp\"\nbearer_token_env_var = \"API_TOKEN\"\nenv_vars = [\"HOME\"]\n";
    std::fs::write(&path, text).expect("write");
    let p = path.to_str().expect("path");
    ok(&bin(
        &["wrap", "--launcher", "mcp-budget", p],
        dir.path(),
        dir.path(),
    ));
    let wrapped = std::fs::read_to_string(&path).expect("read");
    let edited = wrapped
        .replace("API_KEY = \"old\"", "API_KEY = \"new\", EXTRA = \"1\"")
        .replace("\"fs-server\"", "\"fs-server\", \"/data\"")
        .replace("\"API_TOKEN\"]", "\"API_TOKEN\", \"LANG\"]");
    assert_ne!(edited, wrapped);
    assert!(edited.contains("\"LANG\""), "{wrapped}");
    std::fs::write(&path, &edited).expect("write");
    ok(&bin(&["unwrap", p], dir.path(), dir.path()));
    let back = std::fs::read_to_string(&path).expect("read");
    assert_eq!(
        back,
        text.replace("\"fs-server\"", "\"fs-server\", \"/data\"")
            .replace("API_KEY = \"old\"", "API_KEY = \"new\", EXTRA = \"1\"")
            .replace("[\"HOME\"]", "[\"HOME\", \"LANG\"]")
    );
}

/// (7) JSON with comments: a one-line entry with a trailing comma before `}` keeps its bytes:
/// wrap touches only the launcher's words and the marker, and wrap then unwrap gives the file
/// back byte for byte (with a value the user changed in between kept).
#[test]
fn a_one_line_jsonc_entry_with_a_trailing_comma_comes_back_byte_for_byte() {
    let dir = tempdir::Dir::new();
    let path = dir.path().join(".vscode/mcp.json");
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    let text = r#"{
  "servers": {
    "a": {"command": "node", "args": ["s.js"],},
    "b": { "command":"node" ,"args":["s.js"] , "env": {"K": "v",}, },
    "c": {"type": "stdio", "command": "node", /* no args */ }, // c
    "d": {"type": "http", "url": "https://x.example/mcp", "headers": {"Authorization": "Bearer t",},},
  },
}
"#;
    std::fs::write(&path, text).expect("write");
    let p = path.to_str().expect("path");
    ok(&bin(
        &["wrap", "--launcher", "mcp-budget", p],
        dir.path(),
        dir.path(),
    ));
    let wrapped = std::fs::read_to_string(&path).expect("read");
    assert!(
        wrapped.contains(
            r#""a": {"command": "mcp-budget", "args": ["--client", "vscode", "--", "node", "s.js"], "env": {"MCP_BUDGET_WRAPPED": "#
        ),
        "{wrapped}"
    );
    assert!(
        wrapped.contains(r#""b": { "command":"mcp-budget" ,"args":["#),
        "{wrapped}"
    );
    // Each entry is on one line still, ending as it did.
    for (name, end) in [
        ("\"a\"", "\"},},"),
        ("\"b\"", "\",}, },"),
        ("\"c\"", "\"}, /* no args */ }, // c"),
        ("\"d\"", "\"},},"),
    ] {
        let line = wrapped
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("{name} not on one line:\n{wrapped}"));
        assert!(line.ends_with(end), "{line}");
    }
    ok(&bin(&["unwrap", p], dir.path(), dir.path()));
    assert_eq!(std::fs::read_to_string(&path).expect("read"), text);
    // Again, with a value changed while wrapped.
    ok(&bin(
        &["wrap", "--launcher", "mcp-budget", p],
        dir.path(),
        dir.path(),
    ));
    let wrapped = std::fs::read_to_string(&path).expect("read");
    std::fs::write(&path, wrapped.replace(r#""K": "v""#, r#""K": "w""#)).expect("write");
    ok(&bin(&["unwrap", p], dir.path(), dir.path()));
    assert_eq!(
        std::fs::read_to_string(&path).expect("read"),
        text.replace(r#""K": "v""#, r#""K": "w""#)
    );
}
