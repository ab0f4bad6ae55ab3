//! Policy reload: on SIGHUP, and on a change to the policy file with `--watch`.
//!
//! Every session reads the proxy's budget through one [`Shared`]. A reload puts a new budget in
//! it (the cursor key and the result cache carry over, so chains go on); each session picks it
//! up at its next message, and requests already in flight finish under the budget they started
//! with. When the new policy changes what descriptors say, every initialized session gets
//! `notifications/tools/list_changed`. A policy that fails to load leaves the old one in force,
//! and the error is logged with its file:line:column.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use tokio::sync::watch;

use crate::budget::Budget;
use crate::policy::Policy;

/// The proxy's budget, replaceable while sessions run.
#[derive(Debug)]
pub struct Shared {
    current: RwLock<Arc<Budget>>,
    generation: AtomicU64,
    /// A reload can happen (a policy file is watched): sessions listen for descriptor changes.
    reloadable: std::sync::atomic::AtomicBool,
    /// Bumped when a reload changed what descriptors say.
    descriptors: watch::Sender<u64>,
}

impl Shared {
    pub fn new(budget: Arc<Budget>) -> Arc<Shared> {
        Arc::new(Shared {
            current: RwLock::new(budget),
            generation: AtomicU64::new(0),
            reloadable: std::sync::atomic::AtomicBool::new(false),
            descriptors: watch::Sender::new(0),
        })
    }

    /// The budget in force.
    pub fn get(&self) -> Arc<Budget> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many times the budget was replaced.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Puts `budget` in force; `descriptors`: what tools/list says changes with it.
    pub fn replace(&self, budget: Budget, descriptors: bool) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(budget);
        self.generation.fetch_add(1, Ordering::AcqRel);
        if descriptors {
            self.descriptors.send_modify(|n| *n += 1);
        }
    }

    /// Changes when a reload changed the descriptors; `None` when no reload can happen (then
    /// sessions need not listen).
    pub fn descriptor_changes(&self) -> Option<watch::Receiver<u64>> {
        self.reloadable
            .load(Ordering::Acquire)
            .then(|| self.descriptors.subscribe())
    }
}

/// What of a policy shows in descriptors (and which tools are shown).
fn descriptor_view(policy: &Policy) -> String {
    format!(
        "{:?}|{:?}|{:?}|{}|{}|{}|{:?}",
        policy.rules,
        policy.allow,
        policy.deny,
        policy.auto,
        policy.max_result_size_chars,
        policy.max_bytes,
        policy.clients
    )
}

/// Loads `path` again and puts it in force; an error leaves the old policy and is logged.
pub fn reload(shared: &Shared, path: &Path, overrides: &Overrides) {
    let mut policy = match Policy::load(path) {
        Ok(policy) => policy,
        Err(err) => {
            tracing::error!(%err, "policy reload failed; the policy in force stays");
            return;
        }
    };
    overrides.apply(&mut policy);
    let old = shared.get();
    let descriptors = descriptor_view(old.policy()) != descriptor_view(&policy);
    match old.reloaded(policy) {
        Ok(budget) => {
            shared.replace(budget, descriptors);
            tracing::info!(
                policy = %path.display(),
                descriptors_changed = descriptors,
                "policy reloaded"
            );
        }
        Err(err) => tracing::error!(%err, "policy reload failed; the policy in force stays"),
    }
}

/// What the command line sets over the policy file, applied again at each reload.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub cache_bytes: Option<usize>,
    pub cache_ttl: Option<Duration>,
}

impl Overrides {
    pub fn apply(&self, policy: &mut Policy) {
        if let Some(bytes) = self.cache_bytes {
            policy.cache_bytes = bytes;
        }
        if let Some(ttl) = self.cache_ttl {
            policy.cache_ttl = ttl;
        }
    }
}

/// How often `--watch` looks at the policy file.
pub const WATCH_EVERY: Duration = Duration::from_millis(250);

/// Reloads on SIGHUP, and (with `watch`) when the file changes, until the process
/// ends. Call before the sessions start: from here on they listen for reloads, and SIGHUP no
/// longer ends the process.
pub fn start(shared: Arc<Shared>, path: PathBuf, overrides: Overrides, watch: bool) {
    shared.reloadable.store(true, Ordering::Release);
    let hangups = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(signal) => Some(signal),
        Err(err) => {
            tracing::warn!(%err, "SIGHUP cannot be caught; the policy reloads only with --watch");
            None
        }
    };
    tokio::spawn(run(shared, path, overrides, watch, hangups));
}

async fn run(
    shared: Arc<Shared>,
    path: PathBuf,
    overrides: Overrides,
    watch: bool,
    mut hangups: Option<tokio::signal::unix::Signal>,
) {
    // What tells a change: size, modification time and inode, read every tick; the file itself
    // is read only by the reload that follows a change.
    let stamp = |path: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path)
            .ok()
            .map(|m| (m.len(), m.mtime(), m.mtime_nsec(), m.ino()))
    };
    let mut seen = stamp(&path);
    // A change is acted on once it has held for a tick: a file caught mid-write (truncated,
    // then written) is not read as the policy it is not yet.
    let mut changing = None;
    let mut every = tokio::time::interval(WATCH_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            Some(()) = async {
                match &mut hangups {
                    Some(signal) => signal.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                tracing::info!(policy = %path.display(), "SIGHUP: reloading the policy");
                seen = stamp(&path);
                changing = None;
                reload(&shared, &path, &overrides);
            }
            _ = every.tick(), if watch => {
                let now = stamp(&path);
                if now.is_none() || now == seen {
                    changing = None;
                } else if changing == now {
                    seen = now;
                    changing = None;
                    tracing::info!(policy = %path.display(), "the policy file changed: reloading it");
                    reload(&shared, &path, &overrides);
                } else {
                    changing = now;
                }
            }
        }
    }
}
