//! A `tools/call`, both ways: the request on its way up, the answer on its way down.

use super::*;

/// The longest tool name a call may give (MCP's own limit for names is 128 characters).
const MAX_TOOL_NAME: usize = 1024;
impl Interceptor {
    /// A client's `tools/call` request; `modern`: its `_meta` (2026-07-28), when it has one:
    /// it is budgeted for the client that names itself there, and every result the proxy
    /// writes for it is complete (`resultType`).
    /// `call`: where the envelope reader found the call's name and arguments in `message`.
    /// `references`: what became of the result references it passed, when a job looked (see
    /// [`Interceptor::references_job`]): `message` is the call with them replaced.
    pub fn tools_call_request(
        &self,
        id: &Id,
        message: &[u8],
        modern: Option<&Modern>,
        call: Option<&crate::wire::message::CallAt>,
        references: Option<&Substituted>,
    ) -> CallDecision {
        let budget = self.budget_for(modern);
        let decision = match references {
            Some(Substituted::Refused(text)) => {
                CallDecision::Answer(crate::wire::jsonrpc::tool_error(id, text))
            }
            Some(Substituted::Replaced { .. } | Substituted::Unmentioned) => {
                self.call_request_at(id, message, budget, true, call, true)
            }
            None => self.call_request_at(id, message, budget, true, call, false),
        };
        match decision {
            CallDecision::Answer(answer) if modern.is_some() => {
                CallDecision::Answer(crate::era::completed_response(answer))
            }
            CallDecision::Defer(job) if modern.is_some() => {
                CallDecision::Defer(Deferred::new(move || {
                    crate::era::completed_response(job.run())
                }))
            }
            CallDecision::Forward {
                rewritten,
                mut context,
            } => {
                context.modern = modern.is_some();
                // Cheap: only a call that may name a task (a `"task"` member: the 2025-11-25
                // param; or the tasks extension in its capabilities) keeps its bytes.
                if crate::holds!(message, b"\"task\"")
                    || crate::holds!(message, b"modelcontextprotocol/tasks")
                {
                    context.task_origin = Some(Box::new(Unsettled {
                        id: id.clone(),
                        request: Arc::from(message),
                        modern: modern.cloned(),
                    }));
                }
                if self.unsettled() {
                    context.unsettled = Some(Box::new(Unsettled {
                        id: id.clone(),
                        request: Arc::from(message),
                        modern: modern.cloned(),
                    }));
                }
                CallDecision::Forward { rewritten, context }
            }
            answer => answer,
        }
    }

    /// `counted`: the call is counted in the metrics (not when a call counted already is
    /// planned again: under the server's built-in policy, or for its task's result).
    pub(super) fn call_request(
        &self,
        id: &Id,
        message: &[u8],
        budget: Arc<Budget>,
        counted: bool,
    ) -> CallDecision {
        self.call_request_at(id, message, budget, counted, None, true)
    }

    /// [`Self::call_request`], with where the call's parts are when the envelope reader found
    /// them (then the call is not read again). `replaced`: its result references were replaced
    /// (else a call that holds one is refused: it never goes upstream with it).
    pub(super) fn call_request_at(
        &self,
        id: &Id,
        message: &[u8],
        budget: Arc<Budget>,
        counted: bool,
        at: Option<&crate::wire::message::CallAt>,
        replaced: bool,
    ) -> CallDecision {
        let forward = |plan: CallPlan, auto: Option<AutoCall>, rewritten: Option<Vec<u8>>| {
            CallDecision::Forward {
                rewritten,
                context: CallContext {
                    budget: budget.clone(),
                    plan,
                    auto,
                    modern: false,
                    unsettled: None,
                    task_origin: None,
                    search: None,
                },
            }
        };
        // Read as text (the line is UTF-8, checked once): serde's byte reader checks every
        // string again.
        let read = std::str::from_utf8(message)
            .map_err(|err| err.to_string())
            .and_then(|text| read_call(text, at));
        let parts = match read {
            Ok(parts) => parts,
            Err(err) => {
                // Never guess what the server will read: a call the proxy cannot read is
                // refused, not passed.
                return CallDecision::Answer(crate::wire::jsonrpc::error_response(
                    Some(id),
                    crate::wire::jsonrpc::INVALID_PARAMS,
                    &format!(
                        "Invalid params: the tools/call params could not be read ({err}); params.name must be a string and params.arguments an object"
                    ),
                    None,
                ));
            }
        };
        if let Some(key) = parts
            .as_ref()
            .and_then(|p| p.arguments)
            .filter(|a| may_repeat_a_key(a))
            .and_then(crate::budget::raw::duplicate_key)
        {
            return CallDecision::Answer(crate::wire::jsonrpc::error_response(
                Some(id),
                crate::wire::jsonrpc::INVALID_PARAMS,
                &format!(
                    "Invalid params: params.arguments has the key {key:?} twice; send each argument once (the proxy does not guess which one the server would read)"
                ),
                None,
            ));
        }
        let name = parts
            .as_ref()
            .and_then(|p| p.name.as_deref())
            .unwrap_or_default();
        if name.len() > MAX_TOOL_NAME {
            // No tool is named so: nothing is copied, matched or counted for it.
            return CallDecision::Answer(crate::wire::jsonrpc::error_response(
                Some(id),
                crate::wire::jsonrpc::INVALID_PARAMS,
                &format!(
                    "Invalid params: params.name is {} bytes, and no tool name is longer than {MAX_TOOL_NAME}; call one of the tools tools/list returns",
                    name.len()
                ),
                None,
            ));
        }
        let name = name.to_string();
        if counted {
            self.count(&name, |m, tool| {
                m.calls.get_or_create(tool).inc();
            });
        }
        if name == crate::search::TOOL && self.offers_search(&budget) {
            let arguments = parts.as_ref().and_then(|p| p.arguments);
            return self.search_call(id, message, arguments, budget);
        }
        if budget.policy().hides(&name) {
            tracing::info!(tool = %name, "call to a tool the policy hides refused");
            return CallDecision::Answer(crate::wire::jsonrpc::tool_error(
                id,
                &format!(
                    "{name} is not available through this proxy (its policy hides it); call one of the tools tools/list returns"
                ),
            ));
        }
        if !replaced
            && let Some(refused) = parts
                .as_ref()
                .and_then(|p| p.arguments)
                .and_then(|a| self.unreplaced_reference(&budget, &name, a))
        {
            return CallDecision::Answer(crate::wire::jsonrpc::tool_error(id, &refused));
        }
        if self.tool_info(&name).closed {
            // Its descriptor was left as the server wrote it: so is the call.
            return forward(budget.plan_unpaged(name), None, None);
        }
        // The tool's rule, resolved once: the plan of a call it does not page.
        let plan = budget.plan_unpaged(name);
        if budget.auto_in(&plan) {
            let arguments = parts.as_ref().and_then(|p| p.arguments);
            // A cheap look for the continuation argument's name; only a call that has it is
            // parsed.
            let argument: &[u8] = match self.continuation(&plan.tool) {
                "after" => b"\"after\"",
                _ => b"\"mcp_budget_after\"",
            };
            let mentions_after =
                arguments.is_some_and(|a| memchr::memmem::find(a.as_bytes(), argument).is_some());
            if !mentions_after {
                let auto = AutoCall {
                    arguments: arguments.map(Into::into),
                    digest: None,
                    at: None,
                    rerun: false,
                };
                return forward(plan, Some(auto), None);
            }
            return self.auto_continue(id, plan, message, budget.clone());
        }
        if !budget.paged_in(&plan) {
            return forward(plan, None, None);
        }
        let name = plan.tool;
        let mut request = match serde_json::from_slice::<Value>(message) {
            Ok(request) => request,
            Err(err) => {
                // The budget cannot read its arguments, so it cannot apply the policy: refuse
                // rather than pass an unbudgeted call through.
                let text = format!("Parse error: the tools/call request could not be read ({err})");
                return CallDecision::Answer(crate::wire::jsonrpc::error_response(
                    Some(id),
                    crate::wire::jsonrpc::PARSE_ERROR,
                    &text,
                    None,
                ));
            }
        };
        let Some(params) = request.get_mut("params") else {
            return forward(budget.plan_unpaged(name), None, None);
        };
        let before = params
            .get("arguments")
            .map(|a| a.as_object().map_or(0, |o| o.len()));
        match budget.prepare_call(params) {
            Err(error) => {
                tracing::debug!(tool = %name, %error, "budget argument refused");
                self.count(&name, |m, tool| {
                    m.refused(tool, crate::metrics::Class::bad_arguments)
                });
                CallDecision::Answer(crate::wire::jsonrpc::tool_error(id, &error.to_string()))
            }
            Ok(plan) => {
                if budget.continues(&plan)
                    && let Some(answer) = self.rule_continue(id, &plan, &budget)
                {
                    return answer;
                }
                let after = params
                    .get("arguments")
                    .map(|a| a.as_object().map_or(0, |o| o.len()));
                let rewritten = (before != after)
                    .then(|| serde_json::to_vec(&request).ok())
                    .flatten();
                forward(plan, None, rewritten)
            }
        }
    }

    /// A call to an automatically paged tool that carries `after`: the next page, from the
    /// cache, or from calling the tool again when that is safe, or a clear error.
    fn auto_continue(
        &self,
        id: &Id,
        plan: CallPlan,
        message: &[u8],
        budget: Arc<Budget>,
    ) -> CallDecision {
        let name = plan.tool.clone();
        let info = self.tool_info(&name);
        let plain = |arguments: Option<Box<str>>| CallDecision::Forward {
            rewritten: None,
            context: CallContext {
                budget: budget.clone(),
                plan: plan.clone(),
                auto: Some(AutoCall {
                    arguments,
                    digest: None,
                    at: None,
                    rerun: false,
                }),
                modern: false,
                unsettled: None,
                task_origin: None,
                search: None,
            },
        };
        let Ok(mut request) = serde_json::from_slice::<Value>(message) else {
            return plain(None);
        };
        let Some(Value::Object(arguments)) = request.pointer_mut("/params/arguments") else {
            return plain(None);
        };
        // `after`, or `mcp_budget_after` for a tool with an `after` of its own (which is then
        // the tool's business and passes through untouched).
        let argument = self.continuation(&name);
        let after = arguments.get(argument).cloned();
        let own =
            |arguments: &Map<String, Value>| serde_json::to_string(arguments).ok().map(Into::into);
        let cursor = match after {
            Some(Value::String(cursor)) => cursor,
            // The name was only mentioned in a value.
            None => return plain(own(arguments)),
            Some(Value::Null) => {
                // `null` means absent.
                arguments.remove(argument);
                let raw = own(arguments);
                let rewritten = serde_json::to_vec(&request).ok();
                return CallDecision::Forward {
                    rewritten,
                    context: CallContext {
                        budget: budget.clone(),
                        plan: plan.clone(),
                        auto: Some(AutoCall {
                            arguments: raw,
                            digest: None,
                            at: None,
                            rerun: false,
                        }),
                        modern: false,
                        unsettled: None,
                        task_origin: None,
                        search: None,
                    },
                };
            }
            Some(_) => {
                self.count(&name, |m, tool| {
                    m.refused(tool, crate::metrics::Class::bad_arguments)
                });
                return CallDecision::Answer(crate::wire::jsonrpc::tool_error(
                    id,
                    &format!(
                        "{argument} must be the next_after string of a previous page; call again without {argument} to start from the first page"
                    ),
                ));
            }
        };
        let mut rest = arguments.clone();
        rest.remove(argument);
        let digest = auto_digest(&name, &rest);
        let (at, rerun) = match budget.key().verify(&cursor, &digest) {
            Ok(position) => (
                auto::At::from_position(&position),
                auto::may_rerun(&position),
            ),
            Err(err) => {
                self.count(&name, |m, tool| {
                    m.refused(tool, crate::metrics::Class::invalid_cursor)
                });
                return CallDecision::Answer(crate::wire::jsonrpc::tool_error(
                    id,
                    &cursor_refusal(err, &name),
                ));
            }
        };
        let Some(at) = at else {
            self.count(&name, |m, tool| {
                m.refused(tool, crate::metrics::Class::invalid_cursor)
            });
            return CallDecision::Answer(crate::wire::jsonrpc::tool_error(
                id,
                &cursor_refusal(CursorError::Invalid, &name),
            ));
        };
        let cached = budget.cache().get(self.scope, &digest);
        if let Some(crate::budget::cache::Cached::Auto(prepared)) = cached.as_deref() {
            tracing::debug!(tool = %name, "page served from the result cache");
            let max = budget.page_max_in(&plan);
            let answer = match page_fitted(prepared, &budget, at, max, &name, &digest) {
                Ok(page) => {
                    self.count(&name, |m, tool| {
                        m.cache_hits.get_or_create(tool).inc();
                        m.result(tool, 0, page.result.len(), true);
                    });
                    crate::wire::jsonrpc::result_response(id, &page.result)
                }
                Err(why) => {
                    self.count(&name, |m, tool| {
                        m.cache_hits.get_or_create(tool).inc();
                        let class = match why {
                            Unpageable::TooLarge { .. } => crate::metrics::Class::result_too_large,
                            _ => crate::metrics::Class::invalid_cursor,
                        };
                        m.refused(tool, class);
                    });
                    crate::wire::jsonrpc::tool_error(
                        id,
                        &self.unpageable(&budget, &name, &why, prepared.result_len()),
                    )
                }
            };
            return CallDecision::Answer(answer);
        }
        if let Some(page) =
            self.take_fetched(&budget, &name, &self.remote_key(&budget, &digest, at))
        {
            tracing::debug!(tool = %name, "page served from the shared cache");
            self.count(&name, |m, tool| {
                m.cache_hits.get_or_create(tool).inc();
                m.result(tool, 0, page.len(), true);
                m.remote_hits.inc();
            });
            return CallDecision::Answer(crate::wire::jsonrpc::result_response(id, &page));
        }
        self.count(&name, |m, tool| {
            m.cache_misses.get_or_create(tool).inc();
        });
        if !(info.read_only || budget.idempotent_in(&plan) || rerun) {
            self.count(&name, |m, tool| {
                m.refused(tool, crate::metrics::Class::expired_cursor)
            });
            return CallDecision::Answer(crate::wire::jsonrpc::tool_error(
                id,
                &self.expired(&budget, &name, argument),
            ));
        }
        tracing::debug!(tool = %name, "the paged result left the cache; calling the read-only tool again");
        arguments.remove(argument);
        let rewritten = serde_json::to_vec(&request).ok();
        CallDecision::Forward {
            rewritten,
            context: CallContext {
                budget: budget.clone(),
                plan: plan.clone(),
                auto: Some(AutoCall {
                    arguments: None,
                    digest: Some(digest),
                    at: Some(at),
                    rerun: true,
                }),
                modern: false,
                unsettled: None,
                task_origin: None,
                search: None,
            },
        }
    }

    /// Whether this session offers the search tool: the policy has it on, something is paged,
    /// and the server has no tool of that name.
    pub(super) fn offers_search(&self, budget: &Budget) -> bool {
        let policy = budget.policy();
        policy.search
            && (policy.auto
                || policy
                    .rules
                    .iter()
                    .any(|r| r.items.is_some() || r.text.is_some()))
            && !self
                .tools
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains_key(crate::search::TOOL)
    }

    /// A call to the search tool: its arguments are read here, the search runs on the
    /// heavy-work pool.
    fn search_call(
        &self,
        id: &Id,
        message: &[u8],
        arguments: Option<&str>,
        budget: Arc<Budget>,
    ) -> CallDecision {
        let arguments = match arguments.map(serde_json::from_str::<Map<String, Value>>) {
            None => Map::new(),
            Some(Ok(arguments)) => arguments,
            Some(Err(_)) => {
                return CallDecision::Answer(crate::wire::jsonrpc::tool_error(
                    id,
                    "the arguments of mcp_budget_search must be an object with cursor and pattern or path",
                ));
            }
        };
        let request = match crate::search::Request::read(&arguments) {
            Ok(request) => request,
            Err(text) => return CallDecision::Answer(crate::wire::jsonrpc::tool_error(id, &text)),
        };
        if request.by_call().is_some() {
            return self.search_by_call(id, message, request, budget);
        }
        let scope = self.scope;
        let id = id.clone();
        CallDecision::Defer(Deferred::new(move || {
            let result = crate::search::answer(&budget, scope, &request);
            crate::wire::jsonrpc::result_response(&id, &result)
        }))
    }

    /// The response to a `tools/call`: the rewritten message, or `None` to forward it.
    /// `result`: where its result is in `message`, when the envelope reader found it (else it
    /// is looked for here).
    pub fn tools_call_response(
        &self,
        mut context: CallContext,
        message: &Bytes,
        result: Option<std::ops::Range<usize>>,
    ) -> Option<Vec<u8>> {
        let raw = result_of(message, result)?;
        if let Some(search) = context.search.take() {
            return self.search_response(&context, &search, message, raw);
        }
        // The server made the call a task: its result comes later (`tasks/result`, or a
        // completed `tasks/get`), and is budgeted then, as this call's answer.
        if let Some(origin) = context.task_origin.take()
            && let Some((task, ttl)) = task_created(raw)
        {
            tracing::debug!(tool = %context.plan.tool, %task, "the call became a task");
            // A modern client is shown a token for the task, which carries the call: any
            // session holding the key budgets its result (there is no session to remember it).
            let shown = origin.modern.as_ref().map(|modern| {
                let call = task_token::Call {
                    tool: context.plan.tool.clone(),
                    arguments: arguments_of(&origin.request),
                    client: modern.client.clone(),
                };
                task_token::wrap(&self.cursor_key(), &self.principal, &task, Some(&call))
            });
            let rewritten = shown.as_ref().and_then(|token| {
                let respell = |object: &str| {
                    task_token::respell_member(message, object, "taskId", |id| {
                        (id == task).then(|| token.clone())
                    })
                };
                // The extension's flat form, else the 2025-11-25 form nested in `task`.
                respell(raw).or_else(|| raw_member(raw, "task").and_then(respell))
            });
            self.tasks
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remember(task, Some(*origin), ttl, shown);
            return rewritten;
        }
        // Only a complete result is the budget's: `input_required`, a task, or any other kind
        // passes as the server wrote it.
        if !crate::era::is_complete(raw) {
            return None;
        }
        self.budget_result(context, message, raw)
    }

    /// A call's final result `raw` (a part of `message`), budgeted.
    pub(super) fn budget_result(
        &self,
        context: CallContext,
        message: &Bytes,
        raw: &str,
    ) -> Option<Vec<u8>> {
        let context = self.settled(context, message);
        let modern = context.modern;
        let complete = |rewritten: Option<Vec<u8>>| match modern {
            true => rewritten.map(|m| crate::era::completed_message(m, Some(raw))),
            false => rewritten,
        };
        if crate::metrics::get().is_none() {
            return complete(self.call_response(context, message, raw));
        }
        let tool = context.plan.tool.clone();
        let rewritten = complete(self.call_response(context, message, raw));
        let upstream = raw.len();
        self.count(&tool, |m, label| {
            let Some(bytes) = &rewritten else {
                m.result(label, upstream, upstream, false);
                return;
            };
            // The envelope around the result is kept as it was.
            let delivered = (bytes.len() + upstream).saturating_sub(message.len());
            let outcome = Outcome::of(bytes);
            if outcome == Outcome::Refused {
                m.refused(label, crate::metrics::Class::result_too_large);
            }
            m.result(label, upstream, delivered, outcome == Outcome::Paged);
        });
        rewritten
    }

    /// `raw`: the result, a part of `message`.
    fn call_response(&self, context: CallContext, message: &Bytes, raw: &str) -> Option<Vec<u8>> {
        let budget = context.budget.clone();
        let size = raw.len();
        if let Some(auto) = context.auto {
            return self.auto_response(&budget, &context.plan, auto, message, raw);
        }
        if budget.passes_unread(&context.plan, size) {
            return None;
        }
        let unpaged = |budget: &Budget| match budget.check_unpaged(&context.plan, raw) {
            Ok(None) => None,
            Ok(Some(refusal)) => Some(Ok(Finished::Bytes(refusal))),
            Err(err) => Some(Err(err)),
        };
        let finished = if context.plan.is_paged() {
            match self.rule_response(&budget, &context.plan, message, raw) {
                Err(crate::budget::render::RenderError::Json(_)) => unpaged(&budget)?,
                finished => finished,
            }
        } else {
            unpaged(&budget)?
        };
        let bytes = match finished {
            Ok(Finished::Bytes(bytes)) => bytes,
            Ok(Finished::Auto { at, digest }) => {
                let auto = AutoCall {
                    arguments: None,
                    digest: Some(digest),
                    at,
                    rerun: false,
                };
                return self.auto_response(&budget, &context.plan, auto, message, raw);
            }
            Err(err) => {
                tracing::error!(tool = %context.plan.tool, %err, "the budget failed on a result");
                return Some(self.withheld(message, &err.to_string()));
            }
        };
        Some(splice(message, raw, &bytes))
    }
}
