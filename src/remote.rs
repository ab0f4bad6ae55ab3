//! The result cache shared by replicas (`--cache redis://…`): the pages of a paged result, on
//! a Redis-protocol server (Redis ≥ 7, Valkey), so that any replica serves any page.
//!
//! What it holds: when a replica pages a result automatically, it cuts every page of the chain
//! at once and writes them all, each under its own key, before the first page is answered. A
//! later page then costs its own bytes on any replica: one `GET`, no re-read of the result. The
//! replica's own memory cache ([`crate::budget::cache`]) stays in front: a page it can cut
//! itself never asks the shared cache.
//!
//! The shared cache is outside the trust boundary:
//! - a key names the cursor key's id, a digest of the principal and the chain (the call's
//!   selection digest and the page's position in the result), never the arguments;
//! - a value is sealed with ChaCha20-Poly1305 under a key derived from the cursor key and the
//!   principal, with the Redis key as associated data: whoever reads Redis reads nothing, an
//!   entry copied under another principal's key (or another chain's) fails to open, and so
//!   does a tampered one;
//! - each principal may write at most `--cache-quota-bytes` within the time to live (a counter
//!   in Redis, expiring with the entries), and one chain at most the memory cache's limit.
//!
//! Failure is never lossy: every operation has a bounded timeout; a first page is answered
//! whether or not its chain was written; a page that cannot be read from the cache is the
//! memory cache's miss (a read-only tool is called again, any other gets "call again"). Each
//! failure is logged and counted (`mcp_budget_remote_cache_errors_total`).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::budget::cursor::CursorKey;

/// How the shared cache is reached and bounded.
#[derive(Clone)]
pub struct Settings {
    /// `redis://host:port/db`, `rediss://…` or `unix:///path` (the password, if any, is in
    /// [`Settings::password`], never logged).
    pub url: String,
    pub password: Option<String>,
    /// The bound of one read, and the base of a write's (a write adds a second per 8 MiB).
    pub timeout: Duration,
    /// How long an entry lives (the memory cache's TTL).
    pub ttl: Duration,
    /// The bytes one principal may write within the TTL.
    pub quota: u64,
    /// `/healthz` answers 503 while the cache cannot be reached.
    pub required: bool,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("url", &redacted(&self.url))
            .field("password", &self.password.as_ref().map(|_| "…"))
            .field("timeout", &self.timeout)
            .field("ttl", &self.ttl)
            .field("quota", &self.quota)
            .field("required", &self.required)
            .finish()
    }
}

/// The default bound of one cache operation.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(1000);
/// The default bytes one principal may hold in the shared cache.
pub const DEFAULT_QUOTA: u64 = 256 << 20;

/// What `--cache` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// This process's memory (the default).
    Memory,
    /// A Redis-protocol server, shared.
    Shared(String),
}

/// Why a `--cache` value cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SettingsError {
    #[error(
        "--cache {0}: not a cache; give memory, redis://host:port/db, rediss://host:port/db or unix:///path/to/redis.sock"
    )]
    Unknown(String),
    #[error(
        "--cache: the URL holds a password, and the command line is readable by every user of this machine (ps); put the whole URL in MCP_BUDGET_CACHE instead, or the password alone in a variable named by --cache-password-env"
    )]
    PasswordInArguments,
    #[error("--cache-password-env {0}: that variable is not set")]
    NoPassword(String),
    #[error(
        "--cache {0}: this mcp-budget was built without the shared cache (the cargo feature `redis`); use --cache memory, or a build with it"
    )]
    NotBuilt(String),
}

impl Choice {
    /// Reads a `--cache` value. `from_arguments`: it was given on the command line (not by
    /// `MCP_BUDGET_CACHE`), where a password would be in clear.
    pub fn read(value: &str, from_arguments: bool) -> Result<Choice, SettingsError> {
        if value == "memory" {
            return Ok(Choice::Memory);
        }
        let Ok(url) = url::Url::parse(value) else {
            return Err(SettingsError::Unknown(redacted(value)));
        };
        if !matches!(url.scheme(), "redis" | "rediss" | "unix" | "redis+unix") {
            return Err(SettingsError::Unknown(redacted(value)));
        }
        if from_arguments && has_secret(&url) {
            return Err(SettingsError::PasswordInArguments);
        }
        if cfg!(not(feature = "redis")) {
            return Err(SettingsError::NotBuilt(redacted(value)));
        }
        Ok(Choice::Shared(value.to_string()))
    }
}

/// `url` with its password replaced by `…` (for logs and errors).
pub fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if has_secret(&parsed) => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("…"));
            }
            // `unix:///s.sock?pass=…` carries it as a query parameter.
            if parsed.query().is_some() {
                let pairs: Vec<(String, String)> = parsed
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if secret_parameter(&k) {
                            "…".into()
                        } else {
                            v.into_owned()
                        };
                        (k.into_owned(), v)
                    })
                    .collect();
                parsed.query_pairs_mut().clear().extend_pairs(pairs);
            }
            parsed.to_string()
        }
        Ok(_) => url.to_string(),
        Err(_) => "(not a URL)".to_string(),
    }
}

fn secret_parameter(name: &str) -> bool {
    matches!(name, "pass" | "password")
}

/// Whether the URL holds a password (in its authority, or as a `pass` query parameter).
fn has_secret(url: &url::Url) -> bool {
    url.password().is_some() || url.query_pairs().any(|(k, _)| secret_parameter(&k))
}

/// The key of one page in the shared cache: the cursor key's id, the principal's digest, the
/// chain's selection digest and the page's position in the result.
pub fn page_key(key: &CursorKey, principal: &str, digest: &[u8; 16], at: &str) -> String {
    format!(
        "mcpb:{}:{}:{}:{at}",
        key.id(),
        CursorKey::owner_digest(principal),
        crate::wire::canonical::hex(digest)
    )
}

/// The key of a principal's byte counter (its quota).
pub fn quota_key(key: &CursorKey, principal: &str) -> String {
    format!(
        "mcpb:{}:{}:bytes",
        key.id(),
        CursorKey::owner_digest(principal)
    )
}

/// Why a value read from the cache was not used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refused {
    #[error(
        "the entry did not open: tampered with, moved from another key, or sealed for another principal or cursor key"
    )]
    Sealed,
}

const NONCE: usize = 12;

/// The largest value read from the shared cache: a page is at most a message, sealed (its nonce
/// before it, the AEAD tag after). A read holds at most this much per concurrent fetch, whatever
/// was planted in Redis.
const MAX_VALUE: usize = crate::wire::framing::DEFAULT_MAX_MESSAGE_BYTES + NONCE + TAG;

/// ChaCha20-Poly1305's authentication tag.
const TAG: usize = 16;

#[cfg(feature = "redis")]
fn cipher(key: &CursorKey, principal: &str) -> chacha20poly1305::ChaCha20Poly1305 {
    use chacha20poly1305::KeyInit;
    let derived = key.derive("shared cache", principal);
    chacha20poly1305::ChaCha20Poly1305::new(&derived.into())
}

/// `plain` sealed for `principal` under `redis_key`: a random nonce, then the ciphertext and
/// its tag.
#[cfg(feature = "redis")]
pub fn seal(key: &CursorKey, principal: &str, redis_key: &str, plain: &[u8]) -> Option<Vec<u8>> {
    use chacha20poly1305::aead::{Aead, Payload};
    let mut nonce = [0u8; NONCE];
    // No randomness, no entry: a nonce must never repeat under one key.
    getrandom::fill(&mut nonce).ok()?;
    let sealed = cipher(key, principal)
        .encrypt(
            (&nonce).into(),
            Payload {
                msg: plain,
                aad: redis_key.as_bytes(),
            },
        )
        .ok()?;
    let mut value = Vec::with_capacity(NONCE + sealed.len());
    value.extend_from_slice(&nonce);
    value.extend_from_slice(&sealed);
    Some(value)
}

/// What [`seal`] sealed, if `value` opens for `principal` under `redis_key`.
#[cfg(feature = "redis")]
pub fn open(
    key: &CursorKey,
    principal: &str,
    redis_key: &str,
    value: &[u8],
) -> Result<Vec<u8>, Refused> {
    use chacha20poly1305::aead::{Aead, Payload};
    if value.len() < NONCE {
        return Err(Refused::Sealed);
    }
    let (nonce, sealed) = value.split_at(NONCE);
    let nonce: [u8; NONCE] = nonce.try_into().map_err(|_| Refused::Sealed)?;
    cipher(key, principal)
        .decrypt(
            (&nonce).into(),
            Payload {
                msg: sealed,
                aad: redis_key.as_bytes(),
            },
        )
        .map_err(|_| Refused::Sealed)
}

/// The entries of one chain, sealed, waiting to be written (before its first page goes out).
#[derive(Debug)]
pub struct Write {
    /// The principal's byte counter.
    pub quota_key: String,
    pub entries: Vec<(String, Vec<u8>)>,
    pub bytes: u64,
    /// The tool, for logs.
    pub tool: String,
}

/// Why a cache operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("the shared cache did not answer within {0:?}")]
    Timeout(Duration),
    #[cfg(feature = "redis")]
    #[error("the shared cache failed: {0}")]
    Redis(#[from] redis::RedisError),
    #[error(
        "the principal's quota in the shared cache is used up ({quota} bytes within the time to live); the chain stays in this replica's memory only"
    )]
    OverQuota { quota: u64 },
}

impl RemoteError {
    /// The label of the failure in metrics.
    pub fn class(&self) -> &'static str {
        match self {
            RemoteError::Timeout(_) => "timeout",
            #[cfg(feature = "redis")]
            RemoteError::Redis(_) => "error",
            RemoteError::OverQuota { .. } => "quota",
        }
    }
}

/// The shared cache of this process, once [`start`] ran.
pub struct Remote {
    #[cfg(feature = "redis")]
    link: std::sync::Mutex<Link>,
    #[cfg(feature = "redis")]
    client: redis::Client,
    #[cfg(feature = "redis")]
    config: redis::aio::ConnectionManagerConfig,
    settings: Settings,
    healthy: AtomicBool,
}

/// The connection in use, and how many times it was replaced.
#[cfg(feature = "redis")]
struct Link {
    manager: redis::aio::ConnectionManager,
    generation: u64,
}

static REMOTE: OnceLock<Remote> = OnceLock::new();

/// The shared cache, when `--cache` names one.
pub fn get() -> Option<&'static Remote> {
    REMOTE.get()
}

/// Why the shared cache could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[cfg(feature = "redis")]
    #[error("--cache {url}: {source}")]
    Client {
        url: String,
        source: redis::RedisError,
    },
    #[error("the shared cache was set up twice")]
    Twice,
    #[error("this build has no shared cache (the cargo feature `redis`)")]
    NotBuilt,
}

/// Sets up the shared cache (on a tokio runtime). It connects lazily: a server that is down
/// now is retried at each use, and the proxy starts anyway.
#[cfg(feature = "redis")]
pub fn start(settings: Settings) -> Result<&'static Remote, StartError> {
    let client_error = |source| StartError::Client {
        url: redacted(&settings.url),
        source,
    };
    let mut info = redis::IntoConnectionInfo::into_connection_info(settings.url.as_str())
        .map_err(client_error)?;
    if let Some(password) = &settings.password {
        let settings = info.redis_settings().clone().set_password(password);
        info = info.set_redis_settings(settings);
    }
    let client = redis::Client::open(info).map_err(client_error)?;
    // Every operation is bounded here (reads by the timeout, writes by it and their size):
    // not by the crate's own 500 ms response timeout, which would cut a large write.
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(settings.timeout))
        .set_response_timeout(None)
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(500));
    let manager =
        redis::aio::ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            .map_err(client_error)?;
    tracing::info!(url = %redacted(&settings.url), ttl = ?settings.ttl, quota = settings.quota, "the result cache is shared");
    REMOTE
        .set(Remote {
            link: std::sync::Mutex::new(Link {
                manager,
                generation: 0,
            }),
            client,
            config,
            settings,
            healthy: AtomicBool::new(true),
        })
        .map_err(|_| StartError::Twice)?;
    REMOTE.get().ok_or(StartError::Twice)
}

#[cfg(not(feature = "redis"))]
pub fn start(_settings: Settings) -> Result<&'static Remote, StartError> {
    Err(StartError::NotBuilt)
}

impl Remote {
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Whether the last operation reached the cache.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// The connection to use, and its generation (for [`Remote::renew`]).
    #[cfg(feature = "redis")]
    fn connection(&self) -> (redis::aio::ConnectionManager, u64) {
        let link = self
            .link
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (link.manager.clone(), link.generation)
    }

    /// After a timeout on the connection of `generation`: a new one for the next operation. A
    /// connection whose peer went silent (a blackholed address, a failed-over server) is not
    /// dropped by the crate until the kernel gives up on it, many minutes later; every
    /// operation until then would time out on it.
    #[cfg(feature = "redis")]
    fn renew(&self, generation: u64) {
        let mut link = self
            .link
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if link.generation != generation {
            return; // renewed already, by another operation that timed out
        }
        match redis::aio::ConnectionManager::new_lazy_with_config(
            self.client.clone(),
            self.config.clone(),
        ) {
            Ok(manager) => {
                link.manager = manager;
                link.generation += 1;
                tracing::info!(
                    "the shared cache timed out: its connection is replaced by a new one"
                );
            }
            Err(err) => tracing::warn!(%err, "the shared cache's connection could not be replaced"),
        }
    }

    #[cfg(feature = "redis")]
    fn failed_on(&self, op: &'static str, err: &RemoteError, generation: u64) {
        self.failed(op, err);
        if matches!(err, RemoteError::Timeout(_)) {
            self.renew(generation);
        }
    }

    fn failed(&self, op: &'static str, err: &RemoteError) {
        self.healthy.store(false, Ordering::Relaxed);
        tracing::warn!(op, %err, "the shared result cache failed; the replica's memory serves what it holds");
        if let Some(metrics) = crate::metrics::get() {
            metrics.remote_errors(op, err.class());
        }
    }

    fn reached(&self) {
        self.healthy.store(true, Ordering::Relaxed);
    }

    /// The value under `key`, if there is one.
    #[cfg(feature = "redis")]
    pub async fn fetch(&self, key: &str) -> Result<Option<Vec<u8>>, RemoteError> {
        let (mut connection, generation) = self.connection();
        // A bounded read: a value planted under a key (the cache is outside the trust
        // boundary) is never read past what a page may be.
        let mut get = redis::cmd("GETRANGE");
        get.arg(key).arg(0).arg(MAX_VALUE);
        let read = get.query_async::<Vec<u8>>(&mut connection);
        let result = match tokio::time::timeout(self.settings.timeout, read).await {
            // A missing key reads as empty; one longer than any page is not one.
            Ok(Ok(value)) if value.is_empty() => Ok(None),
            Ok(Ok(value)) if value.len() > MAX_VALUE => {
                tracing::warn!("a value in the shared cache is larger than any page; not read");
                Ok(None)
            }
            Ok(Ok(value)) => Ok(Some(value)),
            Ok(Err(err)) => Err(RemoteError::Redis(err)),
            Err(_) => Err(RemoteError::Timeout(self.settings.timeout)),
        };
        match &result {
            Ok(_) => self.reached(),
            Err(err) => self.failed_on("get", err, generation),
        }
        result
    }

    #[cfg(not(feature = "redis"))]
    pub async fn fetch(&self, _key: &str) -> Result<Option<Vec<u8>>, RemoteError> {
        Ok(None)
    }

    /// Writes one chain's entries, within the principal's quota.
    #[cfg(feature = "redis")]
    pub async fn store(&self, write: Write) -> Result<(), RemoteError> {
        // A second more for each 8 MiB: a 10 MB chain is one pipelined write.
        let bound = self.settings.timeout + Duration::from_secs(write.bytes / (8 << 20));
        let ttl = self.settings.ttl.as_secs().max(1);
        let quota = self.settings.quota;
        let (mut connection, generation) = self.connection();
        let work = async {
            // A fixed window: the counter's expiry is set once (NX, Redis ≥ 7), so a
            // principal busy more often than once per TTL is not held over quota forever.
            let (total,): (i64,) = redis::pipe()
                .atomic()
                .cmd("INCRBY")
                .arg(&write.quota_key)
                .arg(write.bytes)
                .cmd("EXPIRE")
                .arg(&write.quota_key)
                .arg(ttl)
                .arg("NX")
                .ignore()
                .query_async(&mut connection)
                .await?;
            if total > 0 && total as u64 > quota {
                let _: () = redis::cmd("DECRBY")
                    .arg(&write.quota_key)
                    .arg(write.bytes)
                    .query_async(&mut connection)
                    .await?;
                return Ok(Err(RemoteError::OverQuota { quota }));
            }
            let mut pipe = redis::pipe();
            for (key, value) in &write.entries {
                pipe.cmd("SET")
                    .arg(key)
                    .arg(value.as_slice())
                    .arg("EX")
                    .arg(ttl)
                    .ignore();
            }
            let () = pipe.query_async(&mut connection).await?;
            Ok::<_, redis::RedisError>(Ok(()))
        };
        let result = match tokio::time::timeout(bound, work).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(over))) => Err(over),
            Ok(Err(err)) => Err(RemoteError::Redis(err)),
            Err(_) => Err(RemoteError::Timeout(bound)),
        };
        match &result {
            Ok(()) => {
                self.reached();
                if let Some(metrics) = crate::metrics::get() {
                    metrics.remote_written_bytes.inc_by(write.bytes);
                }
                tracing::debug!(tool = %write.tool, pages = write.entries.len(), bytes = write.bytes, "a chain written to the shared cache");
            }
            // Over quota is the principal's, not the cache's: the cache is healthy.
            Err(err @ RemoteError::OverQuota { .. }) => {
                tracing::warn!(tool = %write.tool, %err, "a chain not written to the shared cache");
                if let Some(metrics) = crate::metrics::get() {
                    metrics.remote_errors("put", err.class());
                }
            }
            Err(err) => self.failed_on("put", err, generation),
        }
        result
    }

    #[cfg(not(feature = "redis"))]
    pub async fn store(&self, _write: Write) -> Result<(), RemoteError> {
        Ok(())
    }

    /// Whether the cache answers a `PING` now (for `/healthz` under `--cache-required`).
    #[cfg(feature = "redis")]
    pub async fn ping(&self) -> bool {
        let (mut connection, generation) = self.connection();
        let command = redis::cmd("PING");
        let ping = command.query_async::<String>(&mut connection);
        let result = match tokio::time::timeout(self.settings.timeout, ping).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(err)) => Err(RemoteError::Redis(err)),
            Err(_) => Err(RemoteError::Timeout(self.settings.timeout)),
        };
        match &result {
            Ok(()) => self.reached(),
            Err(err) => self.failed_on("ping", err, generation),
        }
        result.is_ok()
    }

    #[cfg(not(feature = "redis"))]
    pub async fn ping(&self) -> bool {
        false
    }
}

#[cfg(all(test, feature = "redis"))]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_only_for_its_principal_and_key() {
        let key = CursorKey::from_secret(b"k");
        let sealed = seal(&key, "token:a", "mcpb:x:1", b"the page").expect("sealed");
        assert!(!sealed.windows(8).any(|w| w == b"the page"));
        assert_eq!(
            open(&key, "token:a", "mcpb:x:1", &sealed).as_deref(),
            Ok(b"the page".as_slice())
        );
        assert_eq!(
            open(&key, "token:b", "mcpb:x:1", &sealed),
            Err(Refused::Sealed)
        );
        assert_eq!(
            open(&key, "token:a", "mcpb:x:2", &sealed),
            Err(Refused::Sealed)
        );
        let other = CursorKey::from_secret(b"j");
        assert_eq!(
            open(&other, "token:a", "mcpb:x:1", &sealed),
            Err(Refused::Sealed)
        );
        let mut tampered = sealed.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert_eq!(
            open(&key, "token:a", "mcpb:x:1", &tampered),
            Err(Refused::Sealed)
        );
        assert_eq!(
            open(&key, "token:a", "mcpb:x:1", b"short"),
            Err(Refused::Sealed)
        );
    }

    #[test]
    fn a_password_on_the_command_line_is_refused_and_never_printed() {
        assert_eq!(
            Choice::read("redis://:hunter2@127.0.0.1:6379/0", true),
            Err(SettingsError::PasswordInArguments)
        );
        assert!(matches!(
            Choice::read("redis://:hunter2@127.0.0.1:6379/0", false),
            Ok(Choice::Shared(_))
        ));
        assert_eq!(Choice::read("memory", true), Ok(Choice::Memory));
        let err = Choice::read("memcached://:hunter2@h", false).unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(!redacted("redis://u:hunter2@h:1/0").contains("hunter2"));
        assert!(!redacted("unix:///run/redis.sock?db=1&pass=hunter2").contains("hunter2"));
        assert_eq!(
            Choice::read("unix:///run/redis.sock?pass=hunter2", true),
            Err(SettingsError::PasswordInArguments)
        );
    }
}
