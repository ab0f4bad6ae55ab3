//! The result cache: the upstream result of a paged call, kept so that the pages after the
//! first are served without running the tool again.
//!
//! Why: a tool may have side effects, and re-running a big query for each page costs the
//! server (and the proxy) the whole result again, so a chain of pages grows with the square
//! of its size. Entries are scoped: each session gets its own scope, and no lookup crosses
//! scopes. Memory is bounded in bytes: the least recently used entries are evicted to stay
//! under the limit, and an entry older than the TTL is never served. The limit is shared
//! fairly: when it is reached, a scope (a session, or one principal's modern requests) over
//! its fair share — the limit divided among the scopes that hold entries — loses its own
//! oldest entries first, so one client's large results never evict another's chain while
//! it holds no more than its share.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What defines one cached result within a scope (the selection digest of the call).
pub type EntryKey = [u8; 16];

/// A cached result: read into its pieces once, so that each later page costs only its bytes.
#[derive(Debug)]
pub enum Cached {
    /// A result paged automatically.
    Auto(crate::budget::auto::Prepared),
    /// A result a rule pages (items, text or a table).
    Rule(crate::budget::chain::RuleResult),
}

impl Cached {
    /// The bytes this holds.
    pub fn bytes(&self) -> usize {
        match self {
            Cached::Auto(prepared) => prepared.bytes(),
            Cached::Rule(result) => result.bytes(),
        }
    }

    /// The result's fingerprint (what its cursors and references carry).
    pub fn fingerprint(&self) -> u64 {
        match self {
            Cached::Auto(prepared) => prepared.fingerprint(),
            Cached::Rule(result) => result.fingerprint(),
        }
    }

    /// The tool whose result this is, when it is known.
    pub fn tool(&self) -> Option<&str> {
        match self {
            Cached::Auto(_) => None,
            Cached::Rule(result) => result.tool(),
        }
    }

    /// The result, as the server wrote it.
    pub fn raw(&self) -> &str {
        match self {
            Cached::Auto(prepared) => prepared.whole(),
            Cached::Rule(result) => result.raw(),
        }
    }
}

struct Entry {
    result: Arc<Cached>,
    bytes: usize,
    stored: Instant,
    tick: u64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<(u64, EntryKey), Entry>,
    /// Least recently used first: tick → entry.
    order: BTreeMap<u64, (u64, EntryKey)>,
    tick: u64,
    bytes: usize,
    /// Bytes held by each scope that holds any.
    held: HashMap<u64, usize>,
}

impl Inner {
    /// The entry to evict to make room for `bytes` more in `scope`: the oldest of a scope over
    /// its fair share (counting what `scope` is about to store), else the oldest of all.
    fn victim(&self, limit: usize, scope: u64, bytes: usize) -> Option<(u64, EntryKey)> {
        let scopes = self.held.len() + usize::from(!self.held.contains_key(&scope));
        let share = limit / scopes.max(1);
        let usage =
            |s: u64| self.held.get(&s).copied().unwrap_or(0) + if s == scope { bytes } else { 0 };
        self.order
            .values()
            .find(|(s, _)| usage(*s) > share)
            .or_else(|| self.order.values().next())
            .copied()
    }
}

/// Counters, for logs and metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub bytes: usize,
    pub entries: usize,
}

/// A byte-bounded, TTL-limited LRU of upstream results, shared by the sessions of one proxy.
pub struct ResultCache {
    limit: usize,
    ttl: Duration,
    inner: Mutex<Inner>,
    next_scope: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

impl std::fmt::Debug for ResultCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResultCache")
            .field("limit", &self.limit)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl ResultCache {
    pub fn new(limit: usize, ttl: Duration) -> ResultCache {
        ResultCache {
            limit,
            ttl,
            inner: Mutex::new(Inner::default()),
            next_scope: AtomicU64::new(1),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new scope (one per session).
    pub fn scope(&self) -> u64 {
        self.next_scope.fetch_add(1, Ordering::Relaxed)
    }

    /// The result stored under `key` in `scope`, if it is there and not too old.
    pub fn get(&self, scope: u64, key: &EntryKey) -> Option<Arc<Cached>> {
        let mut inner = self.inner();
        let inner = &mut *inner;
        let found = match inner.entries.get_mut(&(scope, *key)) {
            Some(entry) if entry.stored.elapsed() <= self.ttl => {
                inner.order.remove(&entry.tick);
                inner.tick += 1;
                entry.tick = inner.tick;
                inner.order.insert(entry.tick, (scope, *key));
                Some(entry.result.clone())
            }
            Some(_) => {
                remove(inner, &(scope, *key));
                None
            }
            None => None,
        };
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Whether `scope` holds a live entry under `key` (not counted as a hit or a miss).
    pub fn contains(&self, scope: u64, key: &EntryKey) -> bool {
        self.inner()
            .entries
            .get(&(scope, *key))
            .is_some_and(|entry| entry.stored.elapsed() <= self.ttl)
    }

    /// Stores `result`; older entries are evicted to make room. A result larger than the
    /// whole cache is not stored (returns false).
    pub fn put(&self, scope: u64, key: EntryKey, result: Arc<Cached>) -> bool {
        let bytes = result.bytes();
        if bytes > self.limit {
            return false;
        }
        let mut inner = self.inner();
        let inner = &mut *inner;
        remove(inner, &(scope, key));
        while inner.bytes + bytes > self.limit {
            let Some(victim) = inner.victim(self.limit, scope, bytes) else {
                break;
            };
            remove(inner, &victim);
            self.evictions.fetch_add(1, Ordering::Relaxed);
            if let Some(metrics) = crate::metrics::get() {
                metrics.cache_evictions.inc();
            }
        }
        inner.tick += 1;
        let tick = inner.tick;
        inner.bytes += bytes;
        *inner.held.entry(scope).or_insert(0) += bytes;
        inner.order.insert(tick, (scope, key));
        inner.entries.insert(
            (scope, key),
            Entry {
                result,
                bytes,
                stored: Instant::now(),
                tick,
            },
        );
        true
    }

    /// Drops every entry of `scope` (its session ended).
    pub fn forget(&self, scope: u64) {
        let mut inner = self.inner();
        let keys: Vec<(u64, EntryKey)> = inner
            .entries
            .keys()
            .filter(|(s, _)| *s == scope)
            .copied()
            .collect();
        for key in keys {
            remove(&mut inner, &key);
        }
    }

    pub fn stats(&self) -> CacheStats {
        let inner = self.inner();
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            bytes: inner.bytes,
            entries: inner.entries.len(),
        }
    }
}

fn remove(inner: &mut Inner, key: &(u64, EntryKey)) {
    if let Some(entry) = inner.entries.remove(key) {
        inner.order.remove(&entry.tick);
        inner.bytes -= entry.bytes;
        if let Some(held) = inner.held.get_mut(&key.0) {
            *held = held.saturating_sub(entry.bytes);
            if *held == 0 {
                inner.held.remove(&key.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cached result of about `n` bytes.
    fn result(n: usize) -> Arc<Cached> {
        let text = format!(
            r#"{{"content":[{{"type":"text","text":"{}"}}]}}"#,
            "x".repeat(n.saturating_sub(37))
        );
        Arc::new(Cached::Auto(
            crate::budget::auto::prepare(bytestring::ByteString::from(text), 200_000).unwrap(),
        ))
    }

    #[test]
    fn scopes_never_cross_and_bytes_stay_bounded() {
        let cache = ResultCache::new(100, Duration::from_secs(60));
        let (a, b) = (cache.scope(), cache.scope());
        assert!(cache.put(a, [1; 16], result(40)));
        assert!(cache.get(b, &[1; 16]).is_none(), "another session's entry");
        assert!(cache.get(a, &[1; 16]).is_some());
        assert!(cache.put(a, [2; 16], result(40)));
        // [1] was used last-but-one, [2] last: a third entry evicts [1].
        assert!(cache.put(b, [3; 16], result(40)));
        assert!(cache.get(a, &[1; 16]).is_none());
        assert!(cache.get(a, &[2; 16]).is_some());
        assert!(cache.stats().bytes <= 100);
        assert_eq!(cache.stats().evictions, 1);
        assert!(!cache.put(a, [4; 16], result(101)), "over the whole limit");
        cache.forget(a);
        assert!(cache.get(a, &[2; 16]).is_none());
        assert!(cache.get(b, &[3; 16]).is_some());
    }

    #[test]
    fn an_entry_past_its_ttl_is_not_served() {
        let cache = ResultCache::new(100, Duration::ZERO);
        let scope = cache.scope();
        cache.put(scope, [1; 16], result(40));
        std::thread::sleep(Duration::from_millis(2));
        assert!(cache.get(scope, &[1; 16]).is_none());
        assert_eq!(cache.stats().bytes, 0);
    }

    #[test]
    fn one_scope_over_its_share_evicts_its_own_entries_first() {
        let cache = ResultCache::new(1000, Duration::from_secs(60));
        let (a, b) = (cache.scope(), cache.scope());
        assert!(cache.put(b, [0; 16], result(100)));
        for n in 1..=40u8 {
            assert!(cache.put(a, [n; 16], result(100)));
            assert!(cache.stats().bytes <= 1000);
        }
        // b holds less than its share (half): its chain survives a's forty results.
        assert!(
            cache.get(b, &[0; 16]).is_some(),
            "another scope's entry was evicted"
        );
        assert!(cache.get(a, &[40; 16]).is_some());
        assert!(cache.get(a, &[1; 16]).is_none());
        // A scope over its share gives way to one under it, oldest first.
        let c = cache.scope();
        assert!(cache.put(c, [9; 16], result(300)));
        assert!(cache.get(b, &[0; 16]).is_some());
        assert!(cache.get(c, &[9; 16]).is_some());
    }
}
