//! Where the cursor key lives between runs: a file in the user's state directory.
//!
//! Why: MCP clients start a proxy per session, and a key that died with the process made every
//! cursor of the previous session "malformed". The key is made once, with OS randomness, and
//! kept in `$XDG_STATE_HOME/mcp-budget/cursor.key` (or `~/.local/state/…`), readable by its
//! owner only. A file that others can read, or that cannot be read, stops the proxy at start
//! with the fix named: a key that leaks lets anyone mint cursors that pass as the proxy's.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The key file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error(
        "no state directory for the cursor key: set XDG_STATE_HOME or HOME, or pass --cursor-key-file"
    )]
    NoHome,
    #[error(
        "cannot read the cursor key file {0}: {1} (fix its permissions, or pass another with --cursor-key-file)"
    )]
    Read(PathBuf, #[source] std::io::Error),
    #[error(
        "the cursor key file {0} can be read by others (mode {1:o}); make it private: chmod 600 {0}"
    )]
    Mode(PathBuf, u32),
    #[error(
        "the cursor key file {0} holds no key (fewer than 32 bytes); delete it, and a new key is made at the next start"
    )]
    Short(PathBuf),
    #[error(
        "cannot create the cursor key file {0}: {1} (set XDG_STATE_HOME to a writable directory, or pass --cursor-key-file)"
    )]
    Create(PathBuf, #[source] std::io::Error),
}

/// The project's state directory: `$XDG_STATE_HOME/mcp-budget`, else
/// `$HOME/.local/state/mcp-budget` (`None`: neither variable is set).
pub fn state_dir() -> Option<PathBuf> {
    let state = match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => {
            PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".local/state")
        }
    };
    Some(state.join("mcp-budget"))
}

/// `cursor.key` in [`state_dir`].
pub fn default_path() -> Result<PathBuf, KeyFileError> {
    Ok(state_dir().ok_or(KeyFileError::NoHome)?.join("cursor.key"))
}

/// The secret in `path`, made (mode 0600) when the file does not exist yet.
pub fn load_or_create(path: &Path) -> Result<Vec<u8>, KeyFileError> {
    match read(path) {
        Err(KeyFileError::Read(_, err)) if err.kind() == std::io::ErrorKind::NotFound => {}
        other => return other,
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| KeyFileError::Create(dir.to_path_buf(), e))?;
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| {
        KeyFileError::Create(path.to_path_buf(), std::io::Error::other(e.to_string()))
    })?;
    let text: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    // Written whole under another name, then linked into place: a proxy starting at the same
    // moment sees either no file or a complete one, and the first link wins.
    let partial = dir.join(format!(".cursor.key.{}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)
        .and_then(|mut file| {
            file.write_all(text.as_bytes())?;
            file.sync_all()
        });
    if let Err(err) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(KeyFileError::Create(path.to_path_buf(), err));
    }
    let linked = std::fs::hard_link(&partial, path);
    let _ = std::fs::remove_file(&partial);
    match linked {
        Ok(()) => {
            tracing::info!(path = %path.display(), "made a cursor key; cursors will survive restarts");
            Ok(text.into_bytes())
        }
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => read(path),
        Err(err) => Err(KeyFileError::Create(path.to_path_buf(), err)),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, KeyFileError> {
    let metadata =
        std::fs::metadata(path).map_err(|e| KeyFileError::Read(path.to_path_buf(), e))?;
    // A key is a few dozen bytes: a path to anything large is a mistake, not a key.
    if metadata.len() > 4096 {
        return Err(KeyFileError::Short(path.to_path_buf()));
    }
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::Mode(path.to_path_buf(), mode));
    }
    let secret = std::fs::read(path).map_err(|e| KeyFileError::Read(path.to_path_buf(), e))?;
    let secret = secret.trim_ascii().to_vec();
    if secret.len() < 32 {
        return Err(KeyFileError::Short(path.to_path_buf()));
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_once_private_and_read_back() {
        let dir = std::env::temp_dir().join(format!("mcp-budget-keyfile-{}", std::process::id()));
        let path = dir.join("sub/cursor.key");
        let _ = std::fs::remove_dir_all(&dir);
        let first = load_or_create(&path).unwrap();
        assert_eq!(first.len(), 64);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            load_or_create(&path).unwrap(),
            first,
            "the same key at the next start"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            load_or_create(&path),
            Err(KeyFileError::Mode(_, 0o644))
        ));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "short").unwrap();
        assert!(matches!(load_or_create(&path), Err(KeyFileError::Short(_))));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
