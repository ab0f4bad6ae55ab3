//! Result references on the interceptor's side: the reference each page cut from a cached
//! result names, and a call that passes one, its references replaced by the results they name
//! before it goes upstream (see [`crate::budget::reference`]).

use super::*;
use crate::budget::reference::{self, RefError};
use crate::wire::message::Kind;

/// What became of the result references in a client's call.
#[derive(Debug)]
pub enum Substituted {
    /// Replaced: the client's own line (what a recording keeps as the client's), and how many
    /// bytes the references kept out of the client's context.
    Replaced { original: Vec<u8>, kept_out: usize },
    /// Refused, with what the client is told (a tool error): nothing goes upstream.
    Refused(String),
}

/// The work of replacing the references of one client line, owned, to run on the heavy-work
/// pool ([`crate::heavy::run`]).
pub struct ReferenceJob {
    budget: Arc<Budget>,
    scope: u64,
    principal: String,
    tools: Arc<Mutex<HashMap<String, ToolInfo>>>,
    max_bytes: usize,
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
        Some(ReferenceJob {
            budget: self.budget(),
            scope: self.scope,
            principal: self.principal.clone(),
            tools: self.tools.clone(),
            max_bytes,
        })
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

impl ReferenceJob {
    /// The line with its references replaced, or the refusal; `None`: the line is not a
    /// `tools/call` on its own that passes one (it goes on as it came).
    pub fn run(self, line: &[u8]) -> Option<Result<Vec<u8>, String>> {
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
    ) -> Result<Vec<u8>, RefError> {
        let policy = self.budget.policy();
        if !policy.takes_references(tool) {
            return Err(RefError::Off(tool.into()));
        }
        let strings = {
            let tools = self.tools.lock().unwrap_or_else(PoisonError::into_inner);
            tools
                .get(tool)
                .map(|info| info.strings.clone())
                .unwrap_or_default()
        };
        let cache = self.budget.cache();
        let mut contents = Vec::with_capacity(found.len());
        let mut size = line.len();
        for f in found {
            let named = reference::open(self.budget.key(), &self.principal, &f.value)?;
            let gone = || RefError::Gone {
                shown: f.value.chars().take(24).collect::<String>() + "…",
                ttl: cache.ttl().as_secs(),
                limit: cache.limit(),
            };
            let cached = cache
                .get(self.scope, &named.digest)
                .filter(|c| c.fingerprint() == named.fingerprint)
                .ok_or_else(gone)?;
            if let Some(source) = cached.tool()
                && policy.hides(source)
            {
                return Err(RefError::SourceHidden(source.into()));
            }
            let text = f.argument.as_ref().is_some_and(|a| strings.contains(a));
            let content = reference::content(cached.raw(), &f.value, &named, text)?;
            size = size - f.range.len() + content.len();
            if size > self.max_bytes {
                return Err(RefError::TooLarge {
                    bytes: size,
                    max: self.max_bytes,
                });
            }
            contents.push(content);
        }
        Ok(reference::splice(line, base, found, &contents))
    }
}
