//! `mcp-budget wrap` and `unwrap`: the proxy put in front of every server of a client's
//! configuration file, and taken out again.
//!
//! Why it edits files the way it does: a user's client configuration is theirs, often
//! hand-written, commented, and shared with other tools. So only the server entries change:
//! JSON and JSON with comments are edited on a concrete syntax tree ([`json`]), TOML with
//! toml_edit ([`toml`]), every other byte stays. A wrapped entry carries what `unwrap` needs to
//! give it back byte for byte ([`plan`]'s marker), so undoing needs no backup — though one is
//! written next to the file anyway (`FILE.mcp-budget.bak`), created with the file's own
//! permissions before a byte is written to it (it can hold tokens). `unwrap` removes it once
//! the file holds no wrapped entry any more (the file is then what it was, with the user's
//! later edits, and the backup only an older copy of their secrets); while entries stay
//! wrapped (`--only`, `--except`), it writes one as `wrap` does.
//!
//! A symbolic link is followed: the file it points to is edited and replaced (a temporary file
//! in that file's folder, renamed over it), and the link stays a link. The file is replaced
//! atomically with its permissions kept. Anything but a regular file (a FIFO, a folder, a
//! device) is refused before it is opened, and it is opened without blocking; a file that does
//! not parse, or has a key written twice on the way to its servers, is left untouched: its
//! `file:line:column`, the fix, and exit 2. `--dry-run` shows its diff with secrets masked
//! ([`mask`]).

pub mod client;
mod json;
mod line;
pub mod mask;
pub mod plan;
mod remote;
mod toml;
mod twice;

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
    /// `login`: the arguments of `mcp-budget login` (the URL, its client flags), for a remote
    /// entry that may have to sign in.
    Wrapped {
        was: String,
        now: String,
        login: Option<String>,
    },
    Unwrapped {
        now: String,
    },
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
    #[error("{}: {source}; {}", path.display(), io_fix(source))]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} is {kind}, not a regular file: wrap and unwrap edit a client's configuration file in place; give the path of that file (a symbolic link to one is fine)",
        path.display()
    )]
    NotAFile { path: PathBuf, kind: &'static str },
    #[error(
        "{} is a symbolic link to {}, which does not exist: point the link at the configuration file (or give that file's path)",
        path.display(),
        target.display()
    )]
    DanglingLink { path: PathBuf, target: PathBuf },
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

/// A file to edit: the path given (or found), and the regular file it is (a symbolic link
/// followed).
struct Target {
    path: PathBuf,
    file: PathBuf,
    client: Client,
}

/// What became of a file's backup.
enum Backup {
    None,
    Written(PathBuf),
    Removed(PathBuf),
    WouldRemove(PathBuf),
}

/// Runs `wrap`/`unwrap`: finds the file(s), edits them, prints what it did (or, with
/// `--dry-run`, a unified diff with secrets masked and what it would do) to `out`.
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
            // Whatever is there, link or not: one that is not a regular file is refused below.
            let found: Vec<_> = looked
                .iter()
                .filter(|p| p.symlink_metadata().is_ok())
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
    let mut edits: Vec<(Target, String, Edited)> = Vec::new();
    for (path, client) in files {
        let file = regular_file(&path)?;
        if edits.iter().any(|(t, _, _)| t.file == file) {
            continue;
        }
        let text = read_text(&path, &file)?;
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
        edits.push((Target { path, file, client }, text, edited));
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
    for (target, old, edited) in edits {
        let changed = edited.text != old;
        let backup = backup_path(&target.file);
        // Unwrap, once no entry is left wrapped: the backup has served (and may hold tokens).
        let spent = request.mode == Mode::Unwrap
            && !edited.text.contains(plan::MARKER)
            && backup.symlink_metadata().is_ok();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| WrapError::Io { path, source }
        };
        let note = if request.dry_run {
            let shown = masked(&old, target.client)
                .zip(masked(&edited.text, target.client))
                .map(|(old, new)| diff(&target.path, &old, &new))
                .unwrap_or_else(|| {
                    format!(
                        "{}: the diff is not shown (it could not be masked)\n",
                        target.path.display()
                    )
                });
            write!(out, "{shown}").map_err(io_out)?;
            match spent {
                true => Backup::WouldRemove(backup),
                false => Backup::None,
            }
        } else {
            let mut note = Backup::None;
            if changed && !spent {
                write_atomically(&backup, old.as_bytes(), &target.file).map_err(io(&backup))?;
                note = Backup::Written(backup.clone());
            }
            if changed {
                write_atomically(&target.file, edited.text.as_bytes(), &target.file)
                    .map_err(io(&target.path))?;
            }
            if spent {
                std::fs::remove_file(&backup).map_err(io(&backup))?;
                note = Backup::Removed(backup);
            }
            note
        };
        write!(out, "{}", table(&target, request, &old, &edited, &note)).map_err(io_out)?;
    }
    Ok(())
}

/// The text with what looks secret shown as `***` ([`mask`]); `None` if it does not parse.
pub fn masked(text: &str, client: Client) -> Option<String> {
    match client.syntax() {
        client::Syntax::Json => json::masked(text),
        client::Syntax::Toml => toml::masked(text),
    }
}

/// The regular file `path` is (a symbolic link followed), checked without opening it: a FIFO
/// would block the open, a device would be read from.
fn regular_file(path: &Path) -> Result<PathBuf, WrapError> {
    let io = |source| WrapError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            if let Ok(target) = std::fs::read_link(path) {
                return Err(WrapError::DanglingLink {
                    path: path.to_path_buf(),
                    target,
                });
            }
            return Err(io(err));
        }
        Err(err) => return Err(io(err)),
    };
    if !meta.is_file() {
        return Err(WrapError::NotAFile {
            path: path.to_path_buf(),
            kind: kind_of(&meta.file_type()),
        });
    }
    std::fs::canonicalize(path).map_err(io)
}

/// Reads `file` (what `path` names), opened without blocking and checked again once open.
fn read_text(path: &Path, file: &Path) -> Result<String, WrapError> {
    use std::io::Read;
    let io = |source| WrapError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    }
    let mut opened = options.open(file).map_err(io)?;
    let meta = opened.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(WrapError::NotAFile {
            path: path.to_path_buf(),
            kind: kind_of(&meta.file_type()),
        });
    }
    let mut text = String::new();
    opened.read_to_string(&mut text).map_err(io)?;
    Ok(text)
}

fn kind_of(kind: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if kind.is_socket() {
            return "a socket";
        }
        if kind.is_block_device() {
            return "a block device";
        }
        if kind.is_char_device() {
            return "a character device";
        }
    }
    if kind.is_dir() {
        "a directory"
    } else {
        "something else"
    }
}

/// The fix for a file that cannot be read or written.
fn io_fix(err: &std::io::Error) -> &'static str {
    use std::io::ErrorKind;
    match err.kind() {
        ErrorKind::NotFound => {
            "check the path (or give --client NAME to edit the client's files where they are)"
        }
        ErrorKind::PermissionDenied => {
            "run as a user who may read and write the file and its folder, or change their permissions"
        }
        ErrorKind::InvalidData => "the file is not UTF-8 text: save it as UTF-8, then run again",
        ErrorKind::StorageFull => "free some space on its disk, then run again",
        _ => "check the file and its folder, then run again",
    }
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .or_else(|| std::env::var_os("USERPROFILE"))
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// `FILE.mcp-budget.bak`, next to the file (the file a symbolic link points to).
pub fn backup_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".mcp-budget.bak");
    path.with_file_name(name)
}

/// Writes `bytes` to `path` through a temporary file in the same folder, renamed over it, with
/// the permissions of `like` (the file being edited), given before any byte is written: the
/// temporary file is made readable by its owner only, then given them.
fn write_atomically(path: &Path, bytes: &[u8], like: &Path) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut name = std::ffi::OsString::from(".");
    name.push(path.file_name().unwrap_or_default());
    name.push(format!(".mcp-budget.{}.tmp", std::process::id()));
    let tmp = dir.join(name);
    let permissions = std::fs::metadata(like)?.permissions();
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = match options.open(&tmp) {
        // Left by a process of the same id that did not finish.
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(&tmp)?;
            options.open(&tmp)?
        }
        other => other?,
    };
    let result = (|| {
        file.set_permissions(permissions)?;
        file.write_all(bytes)?;
        file.sync_all()?;
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
fn table(
    target: &Target,
    request: &Request,
    old: &str,
    edited: &Edited,
    backup: &Backup,
) -> String {
    let (mode, dry_run, path) = (request.mode, request.dry_run, &target.path);
    let mut text = String::new();
    let done = match (mode, dry_run) {
        (Mode::Wrap, false) => "wrapped",
        (Mode::Wrap, true) => "would wrap",
        (Mode::Unwrap, false) => "unwrapped",
        (Mode::Unwrap, true) => "would unwrap",
    };
    text.push_str(&format!("{}:\n", path.display()));
    if path
        .symlink_metadata()
        .is_ok_and(|m| m.file_type().is_symlink())
    {
        text.push_str(&format!("  a link to {}\n", target.file.display()));
    }
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
            Outcome::Wrapped { was, now, login } => {
                let mut what = format!(
                    "{done:<12}  {was}\n{:w$}  {:12}  → {now}",
                    "",
                    "",
                    w = width + 2
                );
                if let Some(args) = login {
                    what.push_str(&format!(
                        "\n{:w$}  {:12}  if it signs in, once: {} login {args}",
                        "",
                        "",
                        plan::shell_words(&request.launcher),
                        w = width + 2
                    ));
                }
                what
            }
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
    }
    match backup {
        Backup::None => {}
        Backup::Written(backup) => text.push_str(&format!("  backup: {}\n", backup.display())),
        Backup::Removed(backup) => text.push_str(&format!(
            "  backup removed: {} (no entry is wrapped any more)\n",
            backup.display()
        )),
        Backup::WouldRemove(backup) => text.push_str(&format!(
            "  would remove the backup {} (no entry would be wrapped any more)\n",
            backup.display()
        )),
    }
    if changed > 0 && !dry_run && old != edited.text {
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
