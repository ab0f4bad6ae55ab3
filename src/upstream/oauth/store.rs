//! Where a sign-in is kept between runs: one file per upstream (the protected resource) in
//! `$XDG_STATE_HOME/mcp-budget/oauth/`, readable by its owner only, written whole under another
//! name and renamed into place. The file holds the client's identity (and the secret a dynamic
//! registration gave it), the tokens, and the issuer that minted them. Proxies that share the
//! file take turns to refresh (a lock file), so a rotated refresh token is not spent twice.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rmcp::transport::auth::{
    AuthError, CredentialRefreshGuard, CredentialStore, StoredCredentials,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The sign-in file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no state directory for sign-ins: set XDG_STATE_HOME or HOME")]
    NoHome,
    #[error(
        "the sign-in file {0} can be read by others (mode {1:o}); make it private: chmod 600 {0}"
    )]
    Mode(PathBuf, u32),
    #[error(
        "cannot read the sign-in file {0}: {1} (fix it, or forget it with `mcp-budget logout <URL>`)"
    )]
    Read(PathBuf, String),
    #[error("cannot write the sign-in file {0}: {1} (set XDG_STATE_HOME to a writable directory)")]
    Write(PathBuf, String),
}

/// Where sign-ins are kept: [`crate::keyfile::state_dir`].
pub fn state_dir() -> Result<PathBuf, StoreError> {
    crate::keyfile::state_dir().ok_or(StoreError::NoHome)
}

/// What the file holds.
#[derive(Serialize, Deserialize)]
struct Saved {
    /// The upstream the tokens are for (its URL, as given).
    resource: String,
    /// The secret of a client made by dynamic registration (a pre-registered client's secret
    /// stays in the environment variable it came from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    registered_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    credentials: Option<StoredCredentials>,
}

/// The sign-in file of one upstream.
#[derive(Debug, Clone)]
pub struct FileStore {
    path: PathBuf,
    resource: String,
}

impl FileStore {
    /// The file for `resource` under `dir` (`dir/oauth/<host>-<digest>.json`).
    pub fn new(dir: &Path, resource: &url::Url) -> FileStore {
        let digest = Sha256::digest(resource.as_str().as_bytes());
        let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        let host: String = resource
            .host_str()
            .unwrap_or("upstream")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        FileStore {
            path: dir.join("oauth").join(format!("{host}-{hex}.json")),
            resource: resource.to_string(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn read(&self) -> Result<Option<Saved>, StoreError> {
        let metadata = match std::fs::metadata(&self.path) {
            Ok(metadata) => metadata,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(StoreError::Read(self.path.clone(), err.to_string())),
        };
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(StoreError::Mode(self.path.clone(), mode));
        }
        if metadata.len() > 1 << 20 {
            return Err(StoreError::Read(
                self.path.clone(),
                "larger than 1 MiB".into(),
            ));
        }
        let text = std::fs::read(&self.path)
            .map_err(|e| StoreError::Read(self.path.clone(), e.to_string()))?;
        let saved: Saved = serde_json::from_slice(&text)
            .map_err(|e| StoreError::Read(self.path.clone(), e.to_string()))?;
        if saved.resource != self.resource {
            return Err(StoreError::Read(
                self.path.clone(),
                format!("it is for {}, not {}", saved.resource, self.resource),
            ));
        }
        Ok(Some(saved))
    }

    fn write(&self, saved: &Saved) -> Result<(), StoreError> {
        let failed = |e: std::io::Error| StoreError::Write(self.path.clone(), e.to_string());
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(failed)?;
        let text = serde_json::to_vec_pretty(saved)
            .map_err(|e| StoreError::Write(self.path.clone(), e.to_string()))?;
        // A name of this write's own: two writes of one process never share a partial file.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let write = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut partial = self.path.clone().into_os_string();
        partial.push(format!(".{}.{write}.partial", std::process::id()));
        let partial = PathBuf::from(partial);
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&partial)
            .and_then(|mut file| {
                file.write_all(&text)?;
                file.sync_all()
            })
            .and_then(|()| std::fs::rename(&partial, &self.path));
        if let Err(err) = written {
            let _ = std::fs::remove_file(&partial);
            return Err(failed(err));
        }
        Ok(())
    }

    /// The tokens and client kept for this upstream, if any.
    pub fn credentials(&self) -> Result<Option<StoredCredentials>, StoreError> {
        Ok(self.read()?.and_then(|saved| saved.credentials))
    }

    /// The secret a dynamic registration gave the client kept here.
    pub fn registered_secret(&self) -> Result<Option<String>, StoreError> {
        Ok(self.read()?.and_then(|saved| saved.registered_secret))
    }

    /// Keeps the secret of a client just registered (`None`: a public client).
    pub fn set_registered_secret(&self, secret: Option<String>) -> Result<(), StoreError> {
        let credentials = self.read()?.and_then(|saved| saved.credentials);
        self.write(&Saved {
            resource: self.resource.clone(),
            registered_secret: secret,
            credentials,
        })
    }

    /// Forgets the sign-in; whether there was one. (The lock file stays: another proxy may
    /// hold it.)
    pub fn remove(&self) -> Result<bool, StoreError> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(true),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(err) => Err(StoreError::Write(self.path.clone(), err.to_string())),
        }
    }

    fn lock_path(&self) -> PathBuf {
        self.path.with_extension("lock")
    }
}

fn store_error(err: StoreError) -> AuthError {
    AuthError::CredentialStoreError(err.to_string())
}

#[async_trait::async_trait]
impl CredentialStore for FileStore {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        self.credentials().map_err(store_error)
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        let registered_secret = self.registered_secret().map_err(store_error)?;
        self.write(&Saved {
            resource: self.resource.clone(),
            registered_secret,
            credentials: Some(credentials),
        })
        .map_err(store_error)
    }

    async fn clear(&self) -> Result<(), AuthError> {
        self.remove().map(|_| ()).map_err(store_error)
    }

    async fn acquire_refresh_guard(&self) -> Result<Option<CredentialRefreshGuard>, AuthError> {
        // Tried without blocking, every 50 ms, for at most LOCK_WAIT: a proxy stopped while it
        // holds the lock does not hang this one (nor a thread of the blocking pool).
        let path = self.lock_path();
        let deadline = tokio::time::Instant::now() + LOCK_WAIT;
        loop {
            if let Some(locked) = lock(&path).map_err(store_error)? {
                return Ok(Some(CredentialRefreshGuard::new(locked)));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(AuthError::CredentialStoreError(format!(
                    "another mcp-budget has held {} for {} s while refreshing the same sign-in",
                    path.display(),
                    LOCK_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// How long a refresh waits for another proxy's refresh of the same sign-in.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// An exclusive lock on `path` (made when missing), held until the value is dropped; `None`
/// when another holds it.
fn lock(path: &Path) -> Result<Option<nix::fcntl::Flock<std::fs::File>>, StoreError> {
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| StoreError::Write(path.to_path_buf(), e.to_string()))?;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|e| StoreError::Write(path.to_path_buf(), e.to_string()))?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(locked) => Ok(Some(locked)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, errno)) => Err(StoreError::Write(path.to_path_buf(), errno.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_private_read_back_and_refused_when_others_can_read() {
        let dir = std::env::temp_dir().join(format!("mcp-budget-oauth-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let url = url::Url::parse("https://mcp.example.com/mcp").unwrap();
        let store = FileStore::new(&dir, &url);
        assert!(store.credentials().unwrap().is_none());
        store.set_registered_secret(Some("s3cret".into())).unwrap();
        let mode = std::fs::metadata(store.path())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            store.registered_secret().unwrap().as_deref(),
            Some("s3cret")
        );
        std::fs::set_permissions(store.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
        let refused = store.registered_secret().unwrap_err().to_string();
        assert!(refused.contains("chmod 600"), "{refused}");
        let other = FileStore::new(&dir, &url::Url::parse("https://other.example/mcp").unwrap());
        assert_ne!(other.path(), store.path());
        assert!(store.remove().unwrap());
        assert!(!store.remove().unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
