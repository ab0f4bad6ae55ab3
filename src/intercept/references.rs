//! Result references on the interceptor's side: the reference each page cut from a cached
//! result names, and a call that passes one, its references replaced by the results they name
//! before it goes upstream (see [`crate::budget::reference`]).

use super::*;
use crate::budget::reference::{self, RefError};
use crate::wire::message::Kind;

/// What became of the result references in a client's call.
#[derive(Debug)]
pub enum Substituted {
    /// Replaced: the client's own line (what a recording keeps as the client's).
    Replaced { original: Vec<u8> },
    /// Refused, with what the client is told (a tool error): nothing goes upstream.
    Refused(String),
    /// Looked at: the line names no reference (its byte search found none), so no call of it
    /// is searched again.
    Unmentioned,
}

/// How many whole results read from the shared cache wait for their call at most.
pub(super) const MAX_WHOLES: usize = 4;

/// The work of replacing the references of one client line, owned, to run on the heavy-work
/// pool ([`crate::heavy::run`]).
pub struct ReferenceJob {
    budget: Arc<Budget>,
    scope: u64,
    principal: String,
    tools: Arc<Mutex<HashMap<String, ToolInfo>>>,
    max_bytes: usize,
    /// Whole results the shared cache held for this line's references (by their key).
    wholes: Vec<(String, Arc<str>)>,
}

impl Interceptor {
    /// The reference pages cut from the result cached under `digest` name, when references
    /// are on and the result fits in the cache.
    pub(super) fn reference_to(
        &self,
        budget: &Budget,
        digest: &SelectionDigest,
        fingerprint: u64,
        bytes: usize,
    ) -> Option<String> {
        let on = budget.policy().references && bytes <= budget.cache().limit();
        on.then(|| reference::mint(budget.key(), &self.principal, digest, fingerprint))
    }

    /// The job for a client line that may pass result references (a byte search says so),
    /// `None` for any other. `max_bytes`: the most the line may grow to
    /// (`--max-message-bytes`).
    pub fn references_job(&self, line: &[u8], max_bytes: usize) -> Option<ReferenceJob> {
        if !reference::mentioned(line) {
            return None;
        }
        // Taken: a whole read for this line serves this line's job alone.
        let wholes =
            std::mem::take(&mut *self.wholes.lock().unwrap_or_else(PoisonError::into_inner))
                .into_iter()
                .collect();
        Some(ReferenceJob {
            budget: self.budget(),
            scope: self.scope,
            principal: self.principal.clone(),
            tools: self.tools.clone(),
            max_bytes,
            wholes,
        })
    }

    /// The shared cache's keys of the whole results this line's references name that this
    /// replica's memory does not hold (so the session reads them before the call is
    /// replaced). Empty without a shared cache, cheaply.
    pub fn reference_lookups(&self, line: &[u8]) -> Vec<String> {
        if crate::remote::get().is_none() || !reference::mentioned(line) {
            return Vec::new();
        }
        // Only a tools/call's arguments are read, as the job reads them.
        let Ok(crate::wire::message::Parsed::Single(Kind::Request {
            method,
            call:
                Some(crate::wire::message::CallAt {
                    arguments: Some(arguments),
                    ..
                }),
            ..
        })) = crate::wire::message::parse_from_client(line)
        else {
            return Vec::new();
        };
        let Ok(text) = std::str::from_utf8(&line[arguments]) else {
            return Vec::new();
        };
        if method != "tools/call" {
            return Vec::new();
        }
        let budget = self.budget();
        let found = reference::find(text).unwrap_or_default();
        let wholes = self.wholes.lock().unwrap_or_else(PoisonError::into_inner);
        let named = found
            .iter()
            .filter_map(|f| reference::open(budget.key(), &self.principal, &f.value).ok());
        let missing = named.filter(|n| {
            let held = budget.cache().get(self.scope, &n.digest);
            held.is_none_or(|c| c.fingerprint() != n.fingerprint)
        });
        let keys = missing.map(|n| whole_key(&budget, &self.principal, &n.digest, n.fingerprint));
        let mut keys: Vec<String> = keys
            .filter(|k| !wholes.iter().any(|(w, _)| w == k))
            .collect();
        keys.dedup();
        keys
    }

    /// A whole result the shared cache held under `key`, for a reference on its way in
    /// (opened here: one that does not open for this principal is dropped, logged and counted).
    pub fn fetched_whole(&self, key: String, value: &[u8]) {
        #[cfg(feature = "redis")]
        match crate::remote::open(self.base.get().key(), &self.principal, &key, value) {
            Ok(plain) => {
                // The page fit comes first (8 bytes), as for every entry of a chain.
                let Some(raw) = plain.get(8..).and_then(|r| std::str::from_utf8(r).ok()) else {
                    return;
                };
                let mut wholes = self.wholes.lock().unwrap_or_else(PoisonError::into_inner);
                if wholes.len() == MAX_WHOLES {
                    wholes.pop_front();
                }
                wholes.push_back((key, Arc::from(raw)));
            }
            Err(err) => {
                if let Some(metrics) = crate::metrics::get() {
                    metrics.remote_errors("get", "sealed");
                }
                tracing::warn!(%err, "a whole result read from the shared cache was refused; the reference is a cache miss");
            }
        }
        #[cfg(not(feature = "redis"))]
        let _ = (key, value);
    }

    /// A call that still holds a reference when it is planned (one in a batch, or one no job
    /// looked at): the refusal to answer it with.
    pub(super) fn unreplaced_reference(
        &self,
        budget: &Budget,
        tool: &str,
        arguments: &str,
    ) -> Option<String> {
        if !reference::mentioned(arguments.as_bytes()) {
            return None;
        }
        let refused = match reference::find(arguments) {
            Ok(found) if found.is_empty() => return None,
            Ok(_) if !budget.policy().takes_references(tool) => RefError::Off(tool.into()),
            Ok(_) => RefError::InBatch,
            Err(err) => err,
        };
        tracing::warn!(tool, %refused, "a call with a result reference that was not replaced; refused");
        Some(refused.to_string())
    }
}

/// A result a call's references name: held by this replica's cache, or read from the shared
/// cache on the way in.
enum Held {
    Cached(Arc<crate::budget::cache::Cached>),
    Whole(Arc<str>),
}

impl Held {
    fn raw(&self) -> &str {
        match self {
            Held::Cached(cached) => cached.raw(),
            Held::Whole(raw) => raw,
        }
    }
}

/// A line with its references replaced, read once (as the relay reads a client's line), and
/// its room among the replaced lines in flight (held until it is written upstream).
pub struct Replaced {
    pub line: Vec<u8>,
    pub parsed: crate::wire::message::Parsed,
    pub room: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// The bytes of replaced lines the process holds at once (a small call grows to a large one:
/// what it grows by is held here until it is written upstream).
pub const REPLACED_IN_FLIGHT: usize = 64 * 1024 * 1024;

/// Room for replaced lines, in KiB.
static ROOM: std::sync::LazyLock<Arc<tokio::sync::Semaphore>> =
    std::sync::LazyLock::new(|| Arc::new(tokio::sync::Semaphore::new(REPLACED_IN_FLIGHT / 1024)));

impl ReferenceJob {
    /// The line with its references replaced, or the refusal; `None`: the line is not a
    /// `tools/call` on its own that passes one (it goes on as it came).
    pub fn run(self, line: &[u8]) -> Option<Result<Replaced, String>> {
        let parsed = crate::wire::message::parse_from_client(line).ok()?;
        let Some(Kind::Request {
            method,
            call: Some(call),
            ..
        }) = parsed.single()
        else {
            return None;
        };
        let (Some(name), Some(arguments)) = (call.name, call.arguments) else {
            return None;
        };
        if method != "tools/call" {
            return None;
        }
        let tool: String = serde_json::from_slice(&line[name]).ok()?;
        let policy = self.budget.policy();
        // A tool the policy hides is refused as such, and the search tool reads no argument
        // as a result.
        if policy.hides(&tool) || tool == crate::search::TOOL {
            return None;
        }
        let text = std::str::from_utf8(&line[arguments.clone()]).ok()?;
        let found = match reference::find(text) {
            Ok(found) if found.is_empty() => return None,
            Ok(found) => found,
            Err(err) => return Some(Err(err.to_string())),
        };
        Some(
            self.replaced(line, &tool, arguments.start, &found)
                .map_err(|e| e.to_string()),
        )
    }

    fn replaced(
        &self,
        line: &[u8],
        tool: &str,
        base: usize,
        found: &[reference::Found],
    ) -> Result<Replaced, RefError> {
        let policy = self.budget.policy();
        if !policy.takes_references(tool) {
            return Err(RefError::Off(tool.into()));
        }
        // A top-level argument takes the result's JSON only where the tool's schema declares
        // it, and not as a string: an argument of a tool this session never listed, or one
        // its schema does not name, takes the text (what most arguments that carry a result
        // are), and so does a reference nested in an argument. An argument that travels as a
        // header too takes none.
        let (strings, declared, headers) = {
            let tools = self.tools.lock().unwrap_or_else(PoisonError::into_inner);
            let info = tools.get(tool);
            let strings = info.map(|i| i.strings.clone()).unwrap_or_default();
            let headers: Vec<String> = info
                .map(|i| i.headers.iter().map(|(_, a)| a.clone()).collect())
                .unwrap_or_default();
            (strings, info.map(|i| i.declared.clone()), headers)
        };
        let cache = self.budget.cache();
        // Every reference opened first, each result it names held once.
        let mut held: Vec<((SelectionDigest, u64), Held)> = Vec::new();
        let mut opened = Vec::with_capacity(found.len());
        for f in found {
            if let Some(argument) = f.argument.as_ref().filter(|a| headers.contains(a)) {
                return Err(RefError::InHeader(argument.clone()));
            }
            let named = reference::open(self.budget.key(), &self.principal, &f.value)?;
            let at = (named.digest, named.fingerprint);
            let index = match held.iter().position(|(k, _)| *k == at) {
                Some(index) => index,
                None => {
                    let cached = cache
                        .get(self.scope, &named.digest)
                        .filter(|c| c.fingerprint() == named.fingerprint);
                    if let Some(source) = cached.as_ref().and_then(|c| c.tool())
                        && policy.hides(source)
                    {
                        return Err(RefError::SourceHidden(source.into()));
                    }
                    // Else the shared cache's copy, read on the way in.
                    let key = whole_key(
                        &self.budget,
                        &self.principal,
                        &named.digest,
                        named.fingerprint,
                    );
                    let whole = self.wholes.iter().find(|(k, _)| *k == key);
                    let result = match (cached, whole) {
                        (Some(cached), _) => Held::Cached(cached),
                        (None, Some((_, raw))) => Held::Whole(raw.clone()),
                        (None, None) => {
                            return Err(RefError::Gone {
                                shown: reference::shown(&f.value),
                                ttl: cache.ttl().as_secs(),
                                limit: cache.limit(),
                            });
                        }
                    };
                    held.push((at, result));
                    held.len() - 1
                }
            };
            opened.push((named, index));
        }
        let sources: Vec<reference::Source> = held
            .iter()
            .map(|(_, result)| reference::Source::read(result.raw()))
            .collect::<Result<_, _>>()
            .map_err(|why| RefError::Unusable {
                shown: "…".into(),
                why: why.into(),
            })?;
        let mut contents = Vec::with_capacity(found.len());
        let mut size = line.len();
        for (f, (named, index)) in found.iter().zip(&opened) {
            let text = match (&f.argument, &declared) {
                (Some(argument), Some(declared)) => {
                    strings.contains(argument) || !declared.contains(argument)
                }
                _ => true,
            };
            let text = text && named.pointer.is_none();
            let content = sources[*index].content(&f.value, named, text)?;
            // Measured before anything is copied.
            size = size - f.range.len() + content.bytes();
            if size > self.max_bytes {
                return Err(RefError::TooLarge {
                    bytes: size,
                    max: self.max_bytes,
                });
            }
            contents.push(content);
        }
        // Room for what the call grows by, before it is made: none now, none waited for.
        let grown = size.saturating_sub(line.len());
        let kib = u32::try_from(grown.div_ceil(1024)).unwrap_or(u32::MAX);
        let room = match ROOM.clone().try_acquire_many_owned(kib) {
            Ok(room) => Some(room),
            Err(_) => return Err(RefError::Busy(REPLACED_IN_FLIGHT)),
        };
        let line = reference::splice(line, base, found, &contents);
        drop(contents);
        // Read as the relay reads a client's line: what the result put in it must read one way.
        let parsed = crate::wire::message::parse_from_client(&line)
            .map_err(|err| RefError::Unreadable(err.to_string()))?;
        match &parsed {
            crate::wire::message::Parsed::Single(Kind::Request { .. }) => {}
            crate::wire::message::Parsed::Single(Kind::Malformed { problem, .. }) => {
                return Err(RefError::Unreadable(problem.message()));
            }
            _ => return Err(RefError::Unreadable("not one request".into())),
        }
        Ok(Replaced { line, parsed, room })
    }
}

/// The shared cache's key of a whole result (its fingerprint in the key: a result that changed
/// is another entry).
pub(super) fn whole_key(
    budget: &Budget,
    principal: &str,
    digest: &SelectionDigest,
    fingerprint: u64,
) -> String {
    crate::remote::page_key(
        budget.key(),
        principal,
        digest,
        &format!("ref{fingerprint:016x}"),
    )
}
