//! Pages served from the local or the shared cache.

use super::*;

/// How many pages read from the shared cache wait for their call at most.
const MAX_FETCHED: usize = 16;
impl Interceptor {
    /// The shared cache's key of the page a call continues, when this replica's memory does
    /// not hold its chain (so the relay reads it before the call reaches
    /// [`Interceptor::tools_call_request`]). `None` for everything else, cheaply.
    pub fn remote_lookup(&self, line: &[u8]) -> Option<String> {
        #[derive(Deserialize)]
        struct Call<'a> {
            #[serde(borrow)]
            method: Cow<'a, str>,
            #[serde(borrow)]
            params: Option<ParamsParts<'a>>,
        }
        crate::remote::get()?;
        if !crate::holds!(line, b"tools/call") || !crate::holds!(line, b"after\"") {
            return None;
        }
        let call: Call<'_> = serde_json::from_str(std::str::from_utf8(line).ok()?).ok()?;
        let params = call.params.filter(|_| call.method == "tools/call")?;
        let name = params.name?;
        let arguments = params.arguments?;
        let budget = self.base.get();
        if !budget.auto_for(&name) && budget.is_paged(&name) {
            // A rule's chain: its page is named by the whole plan.
            let mut params = json!({"name": name, "arguments": serde_json::from_str::<Value>(arguments.get()).ok()?});
            let plan = budget.prepare_call(&mut params).ok()?;
            let digest = budget
                .chain_digest(&plan)
                .filter(|_| budget.continues(&plan))?;
            if budget.cache().contains(self.scope, &digest) {
                return None;
            }
            return Some(self.rule_key(&budget, &digest, &plan));
        }
        let mut arguments: Map<String, Value> = serde_json::from_str(arguments.get()).ok()?;
        let Some(Value::String(cursor)) = arguments.remove(self.continuation(&name)) else {
            return None;
        };
        let digest = auto_digest(&name, &arguments);
        let at = At::from_position(&budget.key().verify(&cursor, &digest).ok()?)?;
        if budget.cache().contains(self.scope, &digest) {
            return None;
        }
        Some(self.remote_key(&budget, &digest, at))
    }

    fn rule_key(&self, budget: &Budget, digest: &SelectionDigest, plan: &CallPlan) -> String {
        let shape = format!("r{}", budget.page_shape(plan));
        crate::remote::page_key(budget.key(), &self.principal, digest, &shape)
    }

    /// Every page of a rule chain after `first`, rendered now and sealed for the shared
    /// cache, each under the plan that asks for it.
    fn remote_rule_chain(
        &self,
        budget: &Budget,
        plan: &CallPlan,
        entry: &crate::budget::chain::RuleResult,
        first: &[u8],
        digest: &SelectionDigest,
    ) -> Option<crate::remote::Write> {
        let limit = budget.cache().limit();
        let mut pages = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut bytes = 0;
        let mut next = budget.next_plan(plan, first);
        while let Some(plan) = next {
            let Ok((Finished::Bytes(page), more)) = budget.finish_rule(&plan, entry) else {
                // A page automatic paging took over, or one the budget failed on: the chain
                // is served where it is held (the memory of this replica).
                return None;
            };
            let key = self.rule_key(budget, digest, &plan);
            bytes += page.len();
            // A page that leads back to one already cut (a cursor-like word in the data)
            // would loop; a chain over the limit is not written at all.
            if bytes > limit || !seen.insert(key.clone()) {
                tracing::warn!(tool = %plan.tool, "a rule chain not written to the shared cache (over the cache's limit, or its pages do not move on)");
                return None;
            }
            next = more.then(|| budget.next_plan(&plan, &page)).flatten();
            pages.push((key, page));
        }
        // The whole result, for its reference at any replica (where the chain and it fit the
        // cache's limit together: else the chain is written alone).
        if entry.reference().is_some() && bytes + entry.raw().len() <= limit {
            let key =
                super::references::whole_key(budget, &self.principal, digest, entry.fingerprint());
            pages.push((key, entry.raw().as_bytes().to_vec()));
        }
        self.sealed_chain(budget, &plan.tool, pages)
    }

    /// `pages` (key, result), sealed for the shared cache with the page fit of `tool`.
    fn sealed_chain(
        &self,
        budget: &Budget,
        tool: &str,
        pages: Vec<(String, Vec<u8>)>,
    ) -> Option<crate::remote::Write> {
        #[cfg(not(feature = "redis"))]
        {
            let _ = (budget, tool, pages);
            None
        }
        #[cfg(feature = "redis")]
        {
            let key = budget.key();
            let limit = budget.cache().limit() as u64;
            let fit = page_fit(budget, tool).to_le_bytes();
            let mut entries = Vec::with_capacity(pages.len());
            let mut bytes = 0u64;
            for (redis_key, page) in pages {
                let plain = [fit.as_slice(), &page].concat();
                let sealed = crate::remote::seal(key, &self.principal, &redis_key, &plain)?;
                bytes += sealed.len() as u64;
                if bytes > limit {
                    tracing::warn!(
                        tool,
                        limit,
                        "a chain larger than the cache's limit stays out of the shared cache"
                    );
                    return None;
                }
                entries.push((redis_key, sealed));
            }
            Some(crate::remote::Write {
                quota_key: crate::remote::quota_key(key, &self.principal),
                entries,
                bytes,
                tool: tool.to_string(),
            })
        }
    }

    /// A page the shared cache held under `key`, for the call on its way in (opened here:
    /// one that does not open for this principal is dropped, logged and counted).
    pub fn fetched(&self, key: String, value: &[u8]) {
        #[cfg(feature = "redis")]
        match crate::remote::open(self.base.get().key(), &self.principal, &key, value) {
            Ok(page) => {
                let mut fetched = self.fetched.lock().unwrap_or_else(PoisonError::into_inner);
                if fetched.len() >= MAX_FETCHED {
                    fetched.pop_front();
                }
                fetched.push_back((key, page));
            }
            Err(err) => {
                tracing::warn!(%err, "a page read from the shared cache was refused; the call goes on as a cache miss");
                if let Some(metrics) = crate::metrics::get() {
                    metrics.remote_errors("get", "sealed");
                }
            }
        }
        #[cfg(not(feature = "redis"))]
        let _ = (key, value);
    }

    /// The chains cut for the shared cache since the last call.
    pub fn take_writes(&self) -> Vec<crate::remote::Write> {
        std::mem::take(&mut *self.outbox.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Held while chains are written to the shared cache.
    pub async fn flushing(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.flushing.lock().await
    }

    pub(super) fn remote_key(&self, budget: &Budget, digest: &SelectionDigest, at: At) -> String {
        let position = format!("{}.{}.{:016x}", at.piece, at.offset, at.fingerprint);
        crate::remote::page_key(budget.key(), &self.principal, digest, &position)
    }

    /// The page at `at` that the shared cache gave for this call, if it was cut for pages of
    /// this size (another client profile's pages are not this client's).
    pub(super) fn take_fetched(&self, budget: &Budget, tool: &str, key: &str) -> Option<String> {
        let mut fetched = self.fetched.lock().unwrap_or_else(PoisonError::into_inner);
        let index = fetched.iter().position(|(k, _)| *k == key)?;
        let (_, plain) = fetched.remove(index)?;
        drop(fetched);
        let fit = plain.get(..8)?;
        if fit != page_fit(budget, tool).to_le_bytes() {
            tracing::debug!(
                tool,
                "the shared cache's page was cut for another page size"
            );
            return None;
        }
        String::from_utf8(plain.get(8..)?.to_vec()).ok()
    }

    /// Every page of a chain after its first, cut now and sealed for the shared cache (so a
    /// later page costs its own bytes on any replica). `None` when the chain is larger than
    /// the memory cache's limit, or no randomness is to be had for its nonces.
    fn remote_chain(
        &self,
        budget: &Budget,
        prepared: &auto::Prepared,
        tool: &str,
        digest: &SelectionDigest,
        mut next: Option<At>,
        max: usize,
    ) -> Option<crate::remote::Write> {
        let mut pages = Vec::new();
        let mut bytes = 0;
        while let Some(at) = next {
            let (result, following) = match page_fitted(prepared, budget, at, max, tool, digest) {
                Ok(page) => (page.result, page.next),
                Err(why) => {
                    let text = self.unpageable(budget, tool, &why, prepared.result_len());
                    let page =
                        json!({"content": [{"type": "text", "text": text}], "isError": true});
                    (page.to_string(), None)
                }
            };
            bytes += result.len();
            if bytes > budget.cache().limit() {
                tracing::warn!(
                    tool,
                    "a chain larger than the cache's limit stays out of the shared cache"
                );
                return None;
            }
            pages.push((self.remote_key(budget, digest, at), result.into_bytes()));
            // A pager that did not move on would loop: the chain ends there.
            next = following.filter(|n| *n != at);
        }
        // The whole result, for its reference at any replica (where the chain and it fit the
        // cache's limit together: else the chain is written alone).
        if prepared.reference().is_some() && bytes + prepared.result_len() <= budget.cache().limit()
        {
            let key = super::references::whole_key(
                budget,
                &self.principal,
                digest,
                prepared.fingerprint(),
            );
            pages.push((key, prepared.whole().as_bytes().to_vec()));
        }
        self.sealed_chain(budget, tool, pages)
    }

    /// The next page of a rule chain, from the result cache; `None` when the entry is gone and
    /// the tool may run again (read-only or declared idempotent), else the expired-cache error.
    pub(super) fn rule_continue(
        &self,
        id: &Id,
        plan: &CallPlan,
        budget: &Arc<Budget>,
    ) -> Option<CallDecision> {
        let name = plan.tool.as_str();
        let digest = budget.chain_digest(plan)?;
        let cached = budget.cache().get(self.scope, &digest).filter(|cached| {
            // An automatic chain took the digest over: only its own cursors continue it.
            !matches!(&**cached, crate::budget::cache::Cached::Auto(_))
                || budget.auto_position(plan).is_some()
        });
        let Some(cached) = cached else {
            if let Some(page) =
                self.take_fetched(budget, name, &self.rule_key(budget, &digest, plan))
            {
                tracing::debug!(tool = %name, "rule page served from the shared cache");
                self.count(name, |m, tool| {
                    m.cache_hits.get_or_create(tool).inc();
                    m.result(tool, 0, page.len(), true);
                    m.remote_hits.inc();
                });
                return Some(CallDecision::Answer(crate::wire::jsonrpc::result_response(
                    id, &page,
                )));
            }
            self.count(name, |m, tool| {
                m.cache_misses.get_or_create(tool).inc();
            });
            if self.tool_info(name).read_only || budget.idempotent(name) {
                tracing::debug!(tool = %name, "the chain's result left the cache; calling the read-only tool again");
                return None;
            }
            self.count(name, |m, tool| {
                m.refused(tool, crate::metrics::Class::expired_cursor)
            });
            return Some(CallDecision::Answer(crate::wire::jsonrpc::tool_error(
                id,
                &self.expired(budget, name, "after"),
            )));
        };
        tracing::debug!(tool = %name, "rule page served from the result cache");
        self.count(name, |m, tool| {
            m.cache_hits.get_or_create(tool).inc();
        });
        let result = match &*cached {
            crate::budget::cache::Cached::Rule(entry) => match budget.finish_rule(plan, entry) {
                Ok((Finished::Bytes(bytes), _)) => bytes,
                Ok((Finished::Auto { at, digest }, _)) => {
                    let call = AutoCall {
                        arguments: None,
                        digest: Some(digest),
                        at,
                        rerun: false,
                    };
                    self.auto_result(budget, plan, call, entry.raw(), || entry.shared_raw())
                        .unwrap_or_else(|| entry.raw().as_bytes().to_vec())
                }
                Err(err) => {
                    tracing::error!(tool = %name, %err, "the budget failed on a cached result");
                    return Some(CallDecision::Answer(crate::wire::jsonrpc::error_response(
                        Some(id),
                        crate::wire::jsonrpc::UPSTREAM_ERROR,
                        &format!("mcp-budget: {err}; the result was withheld rather than cut"),
                        None,
                    )));
                }
            },
            // A rule chain that automatic paging took over (its items path matched nothing).
            crate::budget::cache::Cached::Auto(prepared) => {
                let Some(at) = budget.auto_position(plan) else {
                    return None; // filtered out above
                };
                let max = budget.page_max(name);
                match page_fitted(prepared, budget, at, max, name, &digest) {
                    Ok(page) => page.result.into_bytes(),
                    Err(why) => {
                        let text = self.unpageable(budget, name, &why, prepared.result_len());
                        json!({"content": [{"type": "text", "text": text}], "isError": true})
                            .to_string()
                            .into_bytes()
                    }
                }
            }
        };
        let result = String::from_utf8(result).unwrap_or_default();
        self.count(name, |m, tool| {
            m.result(tool, 0, result.len(), true);
        });
        Some(CallDecision::Answer(crate::wire::jsonrpc::result_response(
            id, &result,
        )))
    }

    /// The error for a cursor whose result left the cache, of a tool the proxy will not run again.
    pub(super) fn expired(&self, budget: &Budget, name: &str, argument: &str) -> String {
        let ttl = budget.cache().ttl().as_secs();
        let minutes = ttl.div_ceil(60);
        format!(
            "The result this cursor pages is no longer in mcp-budget's cache (results are kept {minutes} minute{}, within {}), and {name} is not marked read-only, so the proxy will not run it again on its own. Call {name} again without {argument} to start over.",
            if minutes == 1 { "" } else { "s" },
            size_text(budget.cache().limit())
        )
    }

    /// The refusal of a result that cannot be paged, written for the model.
    pub(super) fn unpageable(
        &self,
        budget: &Budget,
        tool: &str,
        why: &Unpageable,
        bytes: usize,
    ) -> String {
        let max = budget.limits().byte_budget(budget.page_max(tool));
        match why {
            Unpageable::TooLarge { what, bytes: piece } => {
                let narrowing = self.tool_info(tool).narrowing;
                let moves = if narrowing.is_empty() {
                    format!("call {tool} again with arguments that select less")
                } else {
                    format!(
                        "call {tool} again with arguments that select less ({})",
                        narrowing.join(", ")
                    )
                };
                tracing::warn!(
                    tool,
                    bytes,
                    piece = what.as_str(),
                    "a result holds a piece larger than the whole budget; it was refused (a policy rule for this tool, or a larger budget.max_bytes, can help)"
                );
                format!(
                    "result-too-large: {tool}'s result is {bytes} bytes and {what} alone is {piece} bytes, more than the whole {max}, so it cannot be paged; {moves}."
                )
            }
            Unpageable::Changed => format!(
                "The result of {tool} changed since the page this cursor continues was served (the proxy's cache no longer held it, so {tool} ran again and answered otherwise). Call {tool} again without {} to start over.",
                self.continuation(tool)
            ),
            Unpageable::Gone => format!(
                "The result of {tool} no longer reaches the page this cursor points to (it changed since the cursor was issued). Call {tool} again without after to start over."
            ),
            Unpageable::Unreadable => format!(
                "result-too-large: {tool}'s result is {bytes} bytes, over the {max}, and is not a tool result the proxy can page; call {tool} again with arguments that select less."
            ),
        }
    }

    /// A rule page of a fresh upstream result; the result is kept in the cache for the chain's
    /// later pages when more remain.
    pub(super) fn rule_response(
        &self,
        budget: &Budget,
        plan: &CallPlan,
        message: &Bytes,
        raw: &str,
    ) -> Result<Finished, crate::budget::render::RenderError> {
        let text = budget.pages_text(plan);
        let digest = budget.chain_digest(plan);
        let (finished, entry) = if text {
            let entry = crate::budget::chain::RuleResult::new(shared_part(message, raw), true)
                .of_tool(&plan.tool);
            let reference = digest.as_ref().and_then(|digest| {
                self.reference_to(budget, digest, entry.fingerprint(), raw.len())
            });
            let entry = entry.with_reference(reference);
            let (finished, more) = budget.finish_rule(plan, &entry)?;
            (finished, more.then_some(entry))
        } else {
            // The walk of the list, made once: this page, and the chain's later ones, use it.
            let walked = budget.walk(plan, raw);
            let fingerprint = crate::budget::chain::fingerprint(raw);
            let reference = digest
                .as_ref()
                .and_then(|digest| self.reference_to(budget, digest, fingerprint, raw.len()));
            let named = plan.naming(reference.as_deref());
            let finished =
                budget.finish_walked(named.as_ref().unwrap_or(plan), raw, walked.as_ref())?;
            // (`next_after` may be inside a text block's JSON, its quotes escaped.)
            let more =
                matches!(&finished, Finished::Bytes(bytes) if crate::holds!(bytes, b"next_after"));
            let entry = more.then(|| {
                let raw = shared_part(message, raw);
                crate::budget::chain::RuleResult::with_fingerprint(raw, false, fingerprint)
                    .of_tool(&plan.tool)
                    .with_walk(walked)
                    .with_reference(reference)
            });
            (finished, entry)
        };
        if let (Finished::Bytes(first), Some(entry), Some(digest)) = (&finished, entry, digest) {
            if crate::remote::get().is_some()
                && let Some(write) = self.remote_rule_chain(budget, plan, &entry, first, &digest)
            {
                self.outbox
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(write);
            }
            let stored = budget.cache().put(
                self.scope,
                digest,
                Arc::new(crate::budget::cache::Cached::Rule(entry)),
            );
            if !stored {
                tracing::warn!(
                    tool = %plan.tool,
                    bytes = raw.len(),
                    "a paged result is larger than the whole result cache; its next pages will call the tool again if it is read-only"
                );
            }
        }
        Ok(finished)
    }

    /// An automatically paged call's response: unchanged when it fits, else its page.
    pub(super) fn auto_response(
        &self,
        budget: &Budget,
        plan: &CallPlan,
        call: AutoCall,
        message: &Bytes,
        raw: &str,
    ) -> Option<Vec<u8>> {
        let bytes = self.auto_result(budget, plan, call, raw, || shared_part(message, raw))?;
        Some(splice(message, raw, &bytes))
    }

    /// `result` read for the automatic pager under `plan`'s budget, its pages naming the
    /// whole result's reference (kept under `digest`). `rerun`: a cursor said the tool may run
    /// again (it may too when it is read-only or declared idempotent).
    pub(super) fn prepared(
        &self,
        budget: &Budget,
        plan: &CallPlan,
        result: ByteString,
        digest: &SelectionDigest,
        rerun: bool,
    ) -> Result<auto::Prepared, Unpageable> {
        let tool = plan.tool.as_str();
        let max = budget.page_max_in(plan);
        let bytes = result.len();
        let rerun = rerun || self.tool_info(tool).read_only || budget.idempotent_in(plan);
        let prepared = auto::prepare(result, max)?;
        let reference = self.reference_to(budget, digest, prepared.fingerprint(), bytes);
        Ok(prepared
            .with_argument(self.continuation(tool))
            .with_budget(budget.limits().byte_budget(max).to_string())
            .with_reads(budget.limits().reads)
            .with_text_limit(budget.text_page_in(plan))
            .with_search(budget.search_hint())
            .with_rerun(rerun)
            .with_reference(reference))
    }

    /// An automatically paged result: `None` when it fits unchanged, else its page (or the
    /// refusal of what cannot be paged). `owned`: the same result, to keep for the chain
    /// (made only when the result is paged).
    fn auto_result(
        &self,
        budget: &Budget,
        plan: &CallPlan,
        call: AutoCall,
        result: &str,
        owned: impl FnOnce() -> ByteString,
    ) -> Option<Vec<u8>> {
        // The tool's rule was resolved once, in the call's plan.
        let tool = plan.tool.as_str();
        if call.at.is_none() && budget.fits_whole_in(plan, result) {
            return None;
        }
        let result = owned();
        let max = budget.page_max_in(plan);
        let digest = call.digest.unwrap_or_else(|| {
            let arguments = call
                .arguments
                .as_deref()
                .and_then(|a| serde_json::from_str::<Map<String, Value>>(a).ok())
                .unwrap_or_default();
            auto_digest(tool, &arguments)
        });
        let at = call.at.unwrap_or_default();
        let bytes = result.len();
        let prepared = self.prepared(budget, plan, result, &digest, call.rerun);
        let page = match &prepared {
            Ok(prepared) => page_fitted(prepared, budget, at, max, tool, &digest),
            Err(why) => Err(why.clone()),
        };
        let bytes = match (page, prepared) {
            (Ok(page), Ok(prepared)) => {
                if page.next.is_some() {
                    if crate::remote::get().is_some()
                        && let Some(write) =
                            self.remote_chain(budget, &prepared, tool, &digest, page.next, max)
                    {
                        self.outbox
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(write);
                    }
                    let prepared = Arc::new(crate::budget::cache::Cached::Auto(prepared));
                    let stored = budget.cache().put(self.scope, digest, prepared);
                    if !stored {
                        tracing::warn!(
                            tool,
                            bytes,
                            "a paged result is larger than the whole result cache; its next pages will call the tool again if it is read-only"
                        );
                    }
                }
                tracing::debug!(
                    tool,
                    bytes,
                    page = page.result.len(),
                    "result paged automatically"
                );
                page.result.into_bytes()
            }
            (Err(why), _) | (_, Err(why)) => {
                let text = self.unpageable(budget, tool, &why, bytes);
                json!({"content": [{"type": "text", "text": text}], "isError": true})
                    .to_string()
                    .into_bytes()
            }
        };
        Some(bytes)
    }
}
