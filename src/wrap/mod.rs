//! `mcp-budget wrap` and `unwrap`: the proxy put in front of every server of a client's
//! configuration file, and taken out again.
//!
//! Why it edits files the way it does: a user's client configuration is theirs, often
//! hand-written, commented, and shared with other tools. So only the server entries change:
//! JSON and JSON with comments are edited on a concrete syntax tree ([`json`]), TOML with
//! toml_edit ([`toml`]), every other byte stays. A wrapped entry carries what `unwrap` needs to
//! give it back byte for byte ([`plan`]'s marker), so undoing needs no backup — though one is
//! written next to the file anyway (`FILE.mcp-budget.bak`). The file is replaced atomically
//! (a temporary file in the same folder, renamed over it) with its permissions kept, and a
//! file that does not parse is left untouched: its `file:line:column` and exit 2.

pub mod client;
mod json;
pub mod plan;
mod toml;

use std::io::Write;
use std::path::{Path, PathBuf};

pub use client::Client;

/// Wrap, or unwrap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Wrap,
    Unwrap,
}

/// Which servers are edited: `--only` (none given: all) less `--except`.
#[derive(Debug, Clone, Default)]
pub struct Select {
    pub only: Vec<String>,
    pub except: Vec<String>,
}

impl Select {
    pub fn takes(&self, name: &str) -> bool {
        (self.only.is_empty() || self.only.iter().any(|o| o == name))
            && !self.except.iter().any(|e| e == name)
    }
}

/// What happened to one server entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Wrapped { was: String, now: String },
    Unwrapped { now: String },
    Left(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub server: String,
    pub outcome: Outcome,
}

/// A file's new text and what happened to each entry.
#[derive(Debug)]
pub struct Edited {
    pub text: String,
    pub rows: Vec<Row>,
}

/// Where a file does not parse (1-based).
#[derive(Debug)]
pub struct SyntaxError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
pub enum WrapError {
    #[error("{}:{line}:{column}: {message}; the file is left as it was", path.display())]
    Syntax {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{}: which client's file is it? Give --client NAME ({})",
        path.display(),
        client::names()
    )]
    UnknownFile { path: PathBuf },
    #[error("--client {0:?} is not a client wrap knows; known: {known}", known = client::names())]
    UnknownClient(String),
    #[error(
        "{client} keeps its servers in none of these files: {looked}; give the file: mcp-budget wrap FILE"
    )]
    NoFile {
        client: &'static str,
        looked: String,
    },
    #[error(
        "give a file (mcp-budget wrap FILE) or a client (--client NAME: {})",
        client::names()
    )]
    NothingToEdit,
    #[error("--only {0:?} names no server of the file(s)")]
    NoSuchServer(String),
}

/// What `wrap`/`unwrap` were asked.
#[derive(Debug, Clone)]
pub struct Request {
    pub mode: Mode,
    pub file: Option<PathBuf>,
    pub client: Option<String>,
    pub dry_run: bool,
    pub select: Select,
    /// The words that start the proxy in a wrapped entry.
    pub launcher: Vec<String>,
}

/// Edits one file's text (no I/O): for tests and for [`run`].
pub fn edit(
    text: &str,
    client: Client,
    mode: Mode,
    select: &Select,
    launcher: &[String],
) -> Result<Edited, SyntaxError> {
    match client.syntax() {
        client::Syntax::Json => json::edit(text, client, mode, select, launcher),
        client::Syntax::Toml => toml::edit(text, client, mode, select, launcher),
    }
}

/// Runs `wrap`/`unwrap`: finds the file(s), edits them, prints what it did (or, with
/// `--dry-run`, a unified diff and what it would do) to `out`.
pub fn run(request: &Request, out: &mut dyn Write) -> Result<(), WrapError> {
    let named = match &request.client {
        Some(name) => {
            Some(Client::from_name(name).ok_or_else(|| WrapError::UnknownClient(name.clone()))?)
        }
        None => None,
    };
    let files: Vec<(PathBuf, Client)> = match (&request.file, named) {
        (Some(path), Some(client)) => vec![(path.clone(), client)],
        (Some(path), None) => {
            let client = Client::of_file(path)
                .ok_or_else(|| WrapError::UnknownFile { path: path.clone() })?;
            vec![(path.clone(), client)]
        }
        (None, Some(client)) => {
            let cwd = std::env::current_dir().unwrap_or_default();
            let home = home();
            let looked = client.locations(&cwd, &home);
            let found: Vec<_> = looked
                .iter()
                .filter(|p| p.is_file())
                .map(|p| (p.clone(), client))
                .collect();
            if found.is_empty() {
                return Err(WrapError::NoFile {
                    client: client.name(),
                    looked: looked
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
            found
        }
        (None, None) => return Err(WrapError::NothingToEdit),
    };
    // Read and edit every file before writing any: one that does not parse stops them all.
    let mut edits = Vec::new();
    for (path, client) in files {
        let io = |source| WrapError::Io {
            path: path.clone(),
            source,
        };
        let text = std::fs::read_to_string(&path).map_err(io)?;
        let edited = edit(
            &text,
            client,
            request.mode,
            &request.select,
            &request.launcher,
        )
        .map_err(|e| WrapError::Syntax {
            path: path.clone(),
            line: e.line,
            column: e.column,
            message: e.message,
        })?;
        edits.push((path, text, edited));
    }
    for name in &request.select.only {
        let named = edits.iter().any(|(_, _, e)| {
            e.rows
                .iter()
                .any(|r| r.server == *name || r.server.starts_with(&format!("{name} (project ")))
        });
        if !named {
            return Err(WrapError::NoSuchServer(name.clone()));
        }
    }
    let io_out = |source| WrapError::Io {
        path: PathBuf::from("<stdout>"),
        source,
    };
    for (path, old, edited) in edits {
        if request.dry_run {
            write!(out, "{}", diff(&path, &old, &edited.text)).map_err(io_out)?;
        } else if edited.text != old {
            let backup = backup_path(&path);
            write_atomically(&backup, old.as_bytes(), &path).map_err(|source| WrapError::Io {
                path: backup.clone(),
                source,
            })?;
            write_atomically(&path, edited.text.as_bytes(), &path).map_err(|source| {
                WrapError::Io {
                    path: path.clone(),
                    source,
                }
            })?;
        }
        write!(out, "{}", table(&path, request, &old, &edited)).map_err(io_out)?;
    }
    Ok(())
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .or_else(|| std::env::var_os("USERPROFILE"))
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// `FILE.mcp-budget.bak`, next to the file.
pub fn backup_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".mcp-budget.bak");
    path.with_file_name(name)
}

/// Writes `bytes` to `path` through a temporary file in the same folder, renamed over it, with
/// the permissions of `like` (the file being edited).
fn write_atomically(path: &Path, bytes: &[u8], like: &Path) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut name = std::ffi::OsString::from(".");
    name.push(path.file_name().unwrap_or_default());
    name.push(format!(".mcp-budget.{}.tmp", std::process::id()));
    let tmp = dir.join(name);
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        if let Ok(meta) = std::fs::metadata(like) {
            std::fs::set_permissions(&tmp, meta.permissions())?;
        }
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A unified diff of a file's old and new text.
pub fn diff(path: &Path, old: &str, new: &str) -> String {
    if old == new {
        return String::new();
    }
    let name = path.display().to_string();
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(&name, &name)
        .to_string()
}

/// What was done (or would be) to each entry of one file.
fn table(path: &Path, request: &Request, old: &str, edited: &Edited) -> String {
    let (mode, dry_run) = (request.mode, request.dry_run);
    let mut text = String::new();
    let done = match (mode, dry_run) {
        (Mode::Wrap, false) => "wrapped",
        (Mode::Wrap, true) => "would wrap",
        (Mode::Unwrap, false) => "unwrapped",
        (Mode::Unwrap, true) => "would unwrap",
    };
    text.push_str(&format!("{}:\n", path.display()));
    if edited.rows.is_empty() {
        text.push_str("  no MCP servers in this file\n");
    }
    let width = edited
        .rows
        .iter()
        .map(|r| r.server.chars().count())
        .max()
        .unwrap_or(0);
    for row in &edited.rows {
        let what = match &row.outcome {
            Outcome::Wrapped { was, now } => format!(
                "{done:<12}  {was}\n{:w$}  {:12}  → {now}",
                "",
                "",
                w = width + 2
            ),
            Outcome::Unwrapped { now } => format!("{done:<12}  → {now}"),
            Outcome::Left(reason) => format!("{:<12}  {reason}", "left"),
        };
        text.push_str(&format!("  {:<width$}  {what}\n", row.server));
    }
    let changed = edited
        .rows
        .iter()
        .filter(|r| !matches!(r.outcome, Outcome::Left(_)))
        .count();
    if changed == 0 {
        text.push_str("  nothing to change\n");
    } else if !dry_run && old != edited.text {
        text.push_str(&format!("  backup: {}\n", backup_path(path).display()));
        match mode {
            Mode::Wrap => text.push_str(&format!(
                "  undo: {} unwrap {}  (restart the client to apply)\n",
                plan::shell_words(&request.launcher),
                path.display()
            )),
            Mode::Unwrap => text.push_str("  (restart the client to apply)\n"),
        }
    }
    text
}

/// This project's distribution on PyPI (`mcp-budget` there is an unrelated project).
pub const PYPI_NAME: &str = "mcp-budget-proxy";

/// The words that start the proxy in a wrapped entry: the launcher that ran this process when
/// it was one (uvx, npx, pipx run: their installs are temporary), else `mcp-budget` when it is
/// on PATH, else this executable's path.
pub fn default_launcher() -> Vec<String> {
    let version = env!("CARGO_PKG_VERSION");
    let exe = std::env::current_exe().ok();
    let text = exe
        .as_ref()
        .map(|p| p.to_string_lossy().replace('\\', "/"))
        .unwrap_or_default();
    if text.contains("/_npx/") {
        return vec!["npx".into(), "-y".into(), format!("mcp-budget@{version}")];
    }
    // On PyPI the distribution is `mcp-budget-proxy` (`mcp-budget` there is another project);
    // its command is `mcp-budget`.
    if text.contains("/uv/archive-v") || text.contains("/uv/cache/archive-v") {
        return vec![
            "uvx".into(),
            "--from".into(),
            format!("{PYPI_NAME}=={version}"),
            "mcp-budget".into(),
        ];
    }
    if text.contains("/pipx/.cache/") {
        return vec![
            "pipx".into(),
            "run".into(),
            "--spec".into(),
            format!("{PYPI_NAME}=={version}"),
            "mcp-budget".into(),
        ];
    }
    if on_path("mcp-budget") {
        return vec!["mcp-budget".into()];
    }
    match exe {
        Some(exe) => vec![exe.to_string_lossy().into_owned()],
        None => vec!["mcp-budget".into()],
    }
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}
