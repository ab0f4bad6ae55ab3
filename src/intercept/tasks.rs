//! The calls the server turned into tasks, and their results.

use super::*;

/// How many tasks a session remembers (the oldest are forgotten first).
const MAX_TASKS: usize = 256;
/// How many bytes of calls the remembered tasks may hold in all.
const MAX_TASK_BYTES: usize = 4 << 20;
/// How long a task is remembered when the server gave it no time to live.
const DEFAULT_TASK_TTL: Duration = Duration::from_secs(3600);
/// The longest a task is remembered, whatever its time to live.
const MAX_TASK_TTL: Duration = Duration::from_secs(24 * 3600);

/// The calls of a session that became tasks.
#[derive(Debug, Default)]
pub(super) struct TaskTable {
    calls: HashMap<String, TaskCall>,
    /// Task ids, oldest first.
    order: std::collections::VecDeque<String>,
    bytes: usize,
    /// The session was told (once, in the log) that it forgets tasks.
    warned: bool,
}

#[derive(Debug)]
struct TaskCall {
    /// The call that made the task (`None`: a modern task known only by its token, which did
    /// not carry its call).
    origin: Option<Unsettled>,
    /// What the modern client is shown for the task id (a [`crate::era::task_token`]).
    token: Option<String>,
    expires: Instant,
}

impl TaskCall {
    fn bytes(&self, task: &str) -> usize {
        self.origin.as_ref().map_or(0, |o| o.request.len())
            + self.token.as_ref().map_or(0, String::len)
            + task.len()
    }
}

impl TaskTable {
    pub(super) fn remember(
        &mut self,
        task: String,
        origin: Option<Unsettled>,
        ttl: Duration,
        token: Option<String>,
    ) {
        let now = Instant::now();
        self.forget(&task);
        let call = TaskCall {
            origin,
            token,
            expires: now + ttl.min(MAX_TASK_TTL),
        };
        self.bytes += call.bytes(&task);
        self.order.push_back(task.clone());
        self.calls.insert(task, call);
        // The expired, then the oldest, until the table is within its bounds.
        let expired: Vec<String> = self
            .calls
            .iter()
            .filter(|(_, call)| call.expires <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            self.forget(&id);
        }
        while self.calls.len() > MAX_TASKS || self.bytes > MAX_TASK_BYTES {
            let Some(oldest) = self.order.front().cloned() else {
                break;
            };
            if !self.warned {
                self.warned = true;
                tracing::warn!(task = %oldest, "too many tasks in this session: the oldest are forgotten, and their results are held to the cap only (refused when over it)");
            }
            self.forget(&oldest);
        }
    }

    fn forget(&mut self, task: &str) {
        if let Some(call) = self.calls.remove(task) {
            self.bytes = self.bytes.saturating_sub(call.bytes(task));
            self.order.retain(|id| id != task);
        }
    }

    fn live(&self, task: &str) -> Option<&TaskCall> {
        self.calls
            .get(task)
            .filter(|call| call.expires > Instant::now())
    }

    fn get(&self, task: &str) -> Option<Unsettled> {
        self.live(task).and_then(|call| call.origin.clone())
    }

    fn token(&self, task: &str) -> Option<String> {
        self.live(task).and_then(|call| call.token.clone())
    }
}

/// A modern request that named tasks by their tokens, with the server's ids in their place.
#[derive(Debug)]
pub struct TaskNamed {
    /// The request as it goes upstream.
    pub rewritten: Vec<u8>,
    /// The one task it names (`tasks/*`): the server's id and the token the client named it by.
    pub task: Option<(String, String)>,
}
impl Interceptor {
    /// The task id a `tasks/result` or `tasks/get` request names.
    pub fn task_of(&self, request: &[u8]) -> Option<String> {
        #[derive(Deserialize)]
        struct Request {
            params: Option<Params>,
        }
        #[derive(Deserialize)]
        struct Params {
            #[serde(rename = "taskId")]
            task_id: Option<String>,
        }
        serde_json::from_slice::<Request>(request)
            .ok()?
            .params?
            .task_id
    }

    /// A modern client's request that names tasks by the tokens the proxy showed it
    /// (`tasks/get`, `tasks/update`, `tasks/cancel`: `params.taskId`; `subscriptions/listen`:
    /// `params.notifications.taskIds`), with the server's ids in their place. `Ok(None)`: it
    /// names no token (passed as it is). A token that does not open refuses the request.
    pub fn task_request(
        &self,
        method: &str,
        request: &[u8],
    ) -> Result<Option<TaskNamed>, task_token::Refused> {
        let Some(params) = crate::wire::message::params_of(request) else {
            return Ok(None);
        };
        let key = self.cursor_key();
        let mut refused = None;
        let mut named = None;
        let mut open = |shown: &str| -> Option<String> {
            match task_token::unwrap(&key, &self.principal, shown) {
                Ok(Some((task, call))) => {
                    self.learn_task(&task, shown, call);
                    named = Some((task.clone(), shown.to_string()));
                    Some(task)
                }
                // Every task a modern client knows, it knows by a token: an id that is none
                // (another client's, guessed or seen elsewhere) reaches no task.
                Ok(None) => {
                    refused.get_or_insert(task_token::Refused::NotIssued);
                    None
                }
                Err(err) => {
                    refused.get_or_insert(err);
                    None
                }
            }
        };
        let rewritten = match method {
            "subscriptions/listen" => raw_member(params, "notifications")
                .and_then(|filter| task_token::respell_list(request, filter, "taskIds", &mut open)),
            _ => task_token::respell_member(request, params, "taskId", &mut open),
        };
        if let Some(err) = refused {
            return Err(err);
        }
        Ok(rewritten.map(|rewritten| TaskNamed {
            rewritten,
            task: named.filter(|_| method != "subscriptions/listen"),
        }))
    }

    /// A task this session learns of by the token a client presented: its call (when the token
    /// carries one) budgets the task's result here too.
    fn learn_task(&self, task: &str, shown: &str, call: Option<task_token::Call>) {
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        // Known already, and the token teaches nothing more (every poll presents it).
        if tasks
            .live(task)
            .is_some_and(|known| known.origin.is_some() || call.is_none())
        {
            return;
        }
        let origin = call.map(|call| Unsettled::of_call(&call));
        tasks.remember(
            task.to_string(),
            origin,
            DEFAULT_TASK_TTL,
            Some(shown.to_string()),
        );
    }

    /// What a modern client is shown for the server's task `task`: the token it was shown
    /// already, else one naming the task only.
    fn shown_task(&self, task: &str) -> String {
        let known = self
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .token(task);
        known.unwrap_or_else(|| task_token::wrap(&self.cursor_key(), &self.principal, task, None))
    }

    /// The answer to a `tasks/result` (2025-11-25: the result itself) or `tasks/get` (the
    /// tasks extension: a completed task's `result`), or to a modern `tasks/update` or
    /// `tasks/cancel`: a final result is budgeted as the call that made the task would have
    /// been. `shown`: the token the (modern) client named the task by, which the answer names
    /// it by too. `None`: unchanged.
    pub fn task_response(
        &self,
        task: Option<&str>,
        shown: Option<&str>,
        message: &Bytes,
        result: Option<std::ops::Range<usize>>,
    ) -> Option<Vec<u8>> {
        let raw = result_of(message, result)?;
        let Ok(state) = task_state(raw) else {
            tracing::warn!("a task's state names its result twice: withheld");
            return Some(self.withheld(message, "the server's task state names its result twice"));
        };
        let budgeted = state
            .last
            .and_then(|last| self.budget_task_result(task, message, last));
        let (Some(task), Some(shown)) = (task, shown) else {
            return budgeted;
        };
        // Named by the token after the budget: then it reads the page, not the whole result.
        let current = budgeted.as_deref().unwrap_or(message);
        let named = result_of(current, None)
            .and_then(|raw| self.name_tasks(current, raw, Some((task, shown))));
        named.or(budgeted)
    }

    /// A `notifications/tasks` (the tasks extension): the task is named by the token its
    /// client was shown, and a completed task's `result` is budgeted as the call that made the
    /// task would have been. `Ok(None)`: unchanged; `Err`: withheld (its task's result is
    /// there twice, so a client could read the one the proxy did not budget).
    pub fn task_notification(&self, message: &Bytes) -> Result<Option<Vec<u8>>, Withheld> {
        let Some(params) = crate::wire::message::params_of(message) else {
            return Ok(None);
        };
        let state = task_state(params).inspect_err(|_| {
            tracing::warn!("a notifications/tasks names its task's result twice: withheld");
        })?;
        let budgeted = state
            .last
            .and_then(|last| self.budget_task_result(state.task.as_deref(), message, last));
        let current = budgeted.as_deref().unwrap_or(message);
        let named = crate::wire::message::params_of(current)
            .and_then(|params| self.name_tasks(current, params, None));
        Ok(named.or(budgeted))
    }

    /// `message` with every `taskId` of `object` (a part of it) named as its modern client
    /// knows the task: `known` (the server's id and the token the client used), else the
    /// token it was shown, else one naming the task only. `None`: it names no task.
    fn name_tasks(
        &self,
        message: &[u8],
        object: &str,
        known: Option<(&str, &str)>,
    ) -> Option<Vec<u8>> {
        task_token::respell_member(message, object, "taskId", |id| match known {
            Some((task, shown)) if id == task => Some(shown.to_string()),
            _ => Some(self.shown_task(id)),
        })
    }

    /// A `notifications/subscriptions/acknowledged`: the tasks it names are named by the
    /// tokens their client was shown. `None`: unchanged (it names none).
    pub fn tasks_acknowledged(&self, message: &[u8]) -> Option<Vec<u8>> {
        let params = crate::wire::message::params_of(message)?;
        let filter = raw_member(params, "notifications")?;
        task_token::respell_list(message, filter, "taskIds", |id| Some(self.shown_task(id)))
    }

    /// `last` (a task's final result, a part of `message`), budgeted as its call's answer.
    fn budget_task_result(
        &self,
        task: Option<&str>,
        message: &Bytes,
        last: &str,
    ) -> Option<Vec<u8>> {
        let origin = task.and_then(|task| {
            self.tasks
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(task)
        });
        // `last` is a part of `message` (the budget splices its page there).
        let start = (last.as_ptr() as usize).checked_sub(message.as_ptr() as usize)?;
        if start + last.len() > message.len() {
            return None;
        }
        let Some(origin) = origin else {
            return self.unknown_task_result(task, message, last);
        };
        let budget = self.budget_for(origin.modern.as_ref());
        let mut context =
            match self.call_request(&origin.id, &origin.request, budget.clone(), false) {
                CallDecision::Forward { context, .. } => context,
                // Its arguments read otherwise now (a reload): held to the cap.
                _ => CallContext {
                    plan: budget.plan_unpaged(tool_of(&origin.request)),
                    budget,
                    auto: None,
                    modern: false,
                    unsettled: None,
                    task_origin: None,
                    search: None,
                },
            };
        // The final result is written as the server wrote it: a task carries its own
        // `resultType`, and a legacy result has none.
        context.modern = false;
        // A completed task's result is final whatever `resultType` it says it is.
        self.budget_result(context, message, last)
    }

    /// The final result of a task this session does not remember (it started elsewhere, or
    /// too many tasks came after it): it passes when it fits, else it is refused with a way
    /// out, never passed over the budget.
    fn unknown_task_result(
        &self,
        task: Option<&str>,
        message: &[u8],
        last: &str,
    ) -> Option<Vec<u8>> {
        let budget = self.budget_for(None);
        let (size, limit) = budget.over("", last.as_bytes())?;
        let task = task.unwrap_or("(unnamed)");
        tracing::warn!(%task, size, limit, "the final result of a task this session does not remember is over the budget: refused");
        let text = format!(
            "result-too-large: the result of this task is {size}, over the {limit}, and mcp-budget no longer holds the call that started the task (a session remembers its last {MAX_TASKS} tasks), so it cannot page it; call the tool again to get its result in pages."
        );
        let refusal =
            json!({"content": [{"type": "text", "text": text}], "isError": true}).to_string();
        Some(splice(message, last, refusal.as_bytes()))
    }

    pub(super) fn withheld(&self, message: &[u8], why: &str) -> Vec<u8> {
        let id = serde_json::from_slice::<IdOf<'_>>(message)
            .ok()
            .and_then(|m| m.id)
            .map(|raw| Id::from_json_text(raw.get()));
        crate::wire::jsonrpc::error_response(
            id.as_ref(),
            crate::wire::jsonrpc::UPSTREAM_ERROR,
            &format!("mcp-budget: {why}; the result was withheld rather than cut"),
            None,
        )
    }
}

/// A `CreateTaskResult`: the task's id and how long it lives. The 2025-11-25 form nests the task
/// (`{"task": {"taskId", "ttl"}}`); the tasks extension's is flat (`resultType: "task"`,
/// `taskId`, `ttlMs`). Read by shape, not by `resultType` alone: the extension's own examples
/// disagree with its text.
pub(super) fn task_created(raw: &str) -> Option<(String, Duration)> {
    if raw.len() > 64 * 1024 || memchr::memmem::find(raw.as_bytes(), b"taskId").is_none() {
        return None;
    }
    #[derive(Deserialize)]
    struct Created {
        #[serde(rename = "resultType")]
        result_type: Option<String>,
        #[serde(rename = "taskId")]
        task_id: Option<String>,
        #[serde(rename = "ttlMs")]
        ttl_ms: Option<Value>,
        task: Option<Inner>,
        content: Option<Value>,
    }
    #[derive(Deserialize)]
    struct Inner {
        #[serde(rename = "taskId")]
        task_id: String,
        ttl: Option<Value>,
    }
    let created: Created = serde_json::from_str(raw).ok()?;
    if created.content.is_some() {
        return None; // a tool's result, not a task
    }
    let ttl = |value: Option<Value>| {
        value
            .and_then(|v| v.as_u64())
            .map_or(DEFAULT_TASK_TTL, Duration::from_millis)
    };
    match (created.task, created.task_id) {
        (Some(inner), _) => Some((inner.task_id, ttl(inner.ttl))),
        (None, Some(id)) if created.result_type.as_deref() == Some("task") => {
            Some((id, ttl(created.ttl_ms)))
        }
        _ => None,
    }
}

/// What a task's state says (a `tasks/result` or `tasks/get` result, a `notifications/tasks`'s
/// params), read in one pass.
pub(super) struct TaskState<'a> {
    /// Its final result, to budget: the whole of a `tasks/result` answer (2025-11-25), or the
    /// `result` member of a completed task (the tasks extension); `None` for anything else
    /// (a status, an input request, a failure).
    pub(super) last: Option<&'a str>,
    /// The task it names (`taskId`).
    pub(super) task: Option<String>,
}

/// `raw`'s task state; `Err`: it names its `result` twice (keys read as a client reads them,
/// escapes decoded), so a client could read the one the proxy did not budget.
pub(super) fn task_state(raw: &str) -> Result<TaskState<'_>, Withheld> {
    let Some(members) = crate::budget::raw::members(raw) else {
        return Ok(TaskState {
            last: None,
            task: None,
        });
    };
    if members.iter().filter(|(k, _)| k == "result").count() > 1 {
        return Err(Withheld);
    }
    let member = |name: &str| {
        members
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .and_then(|(_, r)| raw.get(r.clone()))
    };
    let task = member("taskId").and_then(|text| serde_json::from_str::<String>(text).ok());
    let statuses: Vec<String> = members
        .iter()
        .filter(|(k, _)| k == "status")
        .filter_map(|(_, r)| serde_json::from_str::<String>(raw.get(r.clone())?).ok())
        .collect();
    let last = if member("content").is_some() || statuses.is_empty() {
        // A tool's result, whatever else it carries; or a result of no shape the proxy
        // knows: held to the budget all the same.
        Some(raw)
    } else if statuses.iter().any(|s| s == "completed") {
        // A task: a completed one holds its result (either of two `status` members), whatever
        // its shape.
        member("result")
    } else {
        None
    };
    Ok(TaskState { last, task })
}

/// A message withheld from the client (why is in the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Withheld;
