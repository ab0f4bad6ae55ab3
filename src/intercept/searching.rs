//! A search by call: `mcp_budget_search` given the call itself (`tool` and `arguments`) instead
//! of a page's cursor. The tool runs once, under the same allow/deny, plan and principal as a
//! direct call of it; its whole result is kept as an automatic chain keeps it, and the client
//! gets only the matches, with the chain's cursor and the result's reference. The same search
//! again, while the result is kept, does not run the tool.

use super::*;

impl Interceptor {
    /// `mcp_budget_search` with `tool` and `arguments`: answered from the cache when the call's
    /// result is kept, else the call itself goes upstream in place of the search.
    pub(super) fn search_by_call(
        &self,
        id: &Id,
        message: &[u8],
        request: crate::search::Request,
        budget: Arc<Budget>,
    ) -> CallDecision {
        let Some((tool, arguments)) = request.by_call() else {
            return CallDecision::Answer(crate::wire::jsonrpc::tool_error(id, "no call to search"));
        };
        let (tool, arguments) = (tool.to_string(), arguments.clone());
        if budget.policy().hides(&tool) {
            return CallDecision::Answer(crate::wire::jsonrpc::tool_error(
                id,
                &format!(
                    "{tool} is not available through this proxy (its policy hides it); call one of the tools tools/list returns"
                ),
            ));
        }
        let digest = auto_digest(&tool, &arguments);
        if let Some(cached) = budget.cache().get(self.scope, &digest) {
            let extras = self.search_extras(&budget, &tool, &cached, &digest);
            let id = id.clone();
            return CallDecision::Defer(Deferred::new(move || {
                let result =
                    crate::search::answer_cached(&budget, &cached, &digest, &request, &extras);
                crate::wire::jsonrpc::result_response(&id, &result)
            }));
        }
        // The call as the client would have written it: its envelope and `_meta` kept.
        let Some(call) = call_line(message, &tool, &arguments) else {
            return CallDecision::Answer(crate::wire::jsonrpc::tool_error(
                id,
                "the search's call could not be written: send the call to search as tool and arguments of plain JSON",
            ));
        };
        match self.call_request_at(id, &call, budget, false, None, false) {
            CallDecision::Forward {
                rewritten,
                mut context,
            } => {
                context.search = Some(Box::new(SearchByCall { request, digest }));
                CallDecision::Forward {
                    rewritten: Some(rewritten.unwrap_or(call)),
                    context,
                }
            }
            other => other,
        }
    }

    /// The cursor and reference a search by call answers with, for the result kept under
    /// `digest`: a cursor only where the tool's pages are the automatic pager's.
    fn search_extras(
        &self,
        budget: &Budget,
        tool: &str,
        cached: &crate::budget::cache::Cached,
        digest: &SelectionDigest,
    ) -> crate::search::Extras {
        let reference = self.reference_to(budget, digest, cached.fingerprint(), 0);
        let crate::budget::cache::Cached::Auto(prepared) = cached else {
            return crate::search::Extras {
                cursor: None,
                reference,
            };
        };
        let plan = budget.plan_unpaged(tool.to_string());
        let cursor = budget
            .auto_in(&plan)
            .then(|| {
                let max = budget.page_max_in(&plan);
                let page = page_fitted(prepared, budget, At::default(), max, tool, digest).ok()?;
                let rerun = self.tool_info(tool).read_only || budget.idempotent_in(&plan);
                page.next
                    .map(|next| budget.key().mint(&next.position(rerun), digest))
            })
            .flatten();
        crate::search::Extras { cursor, reference }
    }

    /// The answer to a search by call: the tool's result kept whole, and only the search's
    /// matches written for the client. `None`: the result passes as the server wrote it (an
    /// error, a task, a result the pager cannot read).
    pub(super) fn search_response(
        &self,
        context: &CallContext,
        search: &SearchByCall,
        message: &Bytes,
        raw: &str,
    ) -> Option<Vec<u8>> {
        let members = crate::budget::raw::members(raw)?;
        let member = |name: &str| {
            let found = members.iter().find(|(k, _)| k == name);
            found.map(|(_, r)| crate::budget::raw::trim_json(&raw[r.clone()]))
        };
        if member("isError") == Some("true") || task_created(raw).is_some() {
            return None;
        }
        let budget = &context.budget;
        let tool = context.tool();
        let result = shared_part(message, raw);
        let prepared = self
            .prepared(budget, &context.plan, result, &search.digest, false)
            .ok()?;
        let cached = Arc::new(crate::budget::cache::Cached::Auto(prepared));
        let kept = budget
            .cache()
            .put(self.scope, search.digest, cached.clone());
        let extras = match kept {
            true => self.search_extras(budget, tool, &cached, &search.digest),
            false => {
                tracing::warn!(
                    tool,
                    bytes = raw.len(),
                    "a searched result is larger than the whole result cache: the search answers, with no cursor or reference"
                );
                crate::search::Extras::default()
            }
        };
        let mut answer =
            crate::search::answer_cached(budget, &cached, &search.digest, &search.request, &extras);
        // A modern result says what it is: so does its answer.
        if let Some(kind) = member("resultType")
            && answer.starts_with('{')
        {
            answer = format!("{{\"resultType\":{kind},{}", &answer[1..]);
        }
        Some(splice(message, raw, answer.as_bytes()))
    }
}

/// `message` (a `tools/call` of the search tool) as the call of `tool` with `arguments`: its
/// `jsonrpc`, `id` and `params._meta` kept as the client wrote them.
fn call_line(message: &[u8], tool: &str, arguments: &Map<String, Value>) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(message).ok()?;
    let members = crate::budget::raw::members(text)?;
    let params = members.iter().find(|(k, _)| k == "params")?;
    let params_text = &text[params.1.clone()];
    let meta = crate::budget::raw::members(params_text)?
        .into_iter()
        .find(|(k, _)| k == "_meta")
        .map(|(_, r)| params_text[r].to_string());
    let mut inner = format!(
        "{{\"name\":{},\"arguments\":{}",
        Value::from(tool),
        Value::Object(arguments.clone())
    );
    if let Some(meta) = meta {
        inner.push_str(",\"_meta\":");
        inner.push_str(&meta);
    }
    inner.push('}');
    let mut out = Vec::with_capacity(message.len() + inner.len());
    out.extend_from_slice(&message[..params.1.start]);
    out.extend_from_slice(inner.as_bytes());
    out.extend_from_slice(&message[params.1.end..]);
    Some(out)
}
