//! The two interception points of the relay: `tools/list` responses and `tools/call` calls.
//!
//! Everything else passes through the relay untouched. The relay hands these functions the
//! exact bytes of one message and forwards the bytes they return; `None` means "unchanged",
//! so a message the budget does not touch is never re-serialized. A rewritten result is
//! spliced into the original bytes in place of the old one, so the rest of the response
//! (id form, key order, extra fields) stays as the server wrote it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::budget::auto::{self, At, Unpageable};
use crate::budget::cursor::{self, CursorError, SelectionDigest};
use crate::budget::{Budget, CallPlan, Finished, descriptor};
use crate::message::{Id, Modern, splice};
use crate::policy::Policy;
use crate::task_token;

/// Applies the budget at the relay's two interception points, for one session.
#[derive(Debug)]
pub struct Interceptor {
    /// The proxy's budget, for every session (replaced by a policy reload).
    base: Arc<crate::reload::Shared>,
    /// This session's: the base fitted to its client and server (see
    /// [`Interceptor::initialize_request`]), and the base's generation it was made from.
    current: Mutex<(u64, Arc<Budget>)>,
    /// What this session's `initialize` chose.
    chosen: Mutex<Chosen>,
    /// This session's scope in the result cache.
    scope: u64,
    /// What this session's `tools/list` said about each tool (shared with the sessions that
    /// serve other capability sets of one client over stdio: [`Interceptor::sharing_tools_of`]).
    tools: Arc<Mutex<HashMap<String, ToolInfo>>>,
    /// The server's origin (its command line or URL), under which who it said it is is kept
    /// for every session of this process (see [`Interceptor::for_origin`]).
    origin: Option<String>,
    /// Budgets fitted to the clients that named themselves in a modern request's `_meta`, and
    /// the generation of the base they were made from (bounded: [`MAX_FITTED`]).
    fitted: Mutex<(u64, HashMap<String, Arc<Budget>>)>,
    /// The calls the server turned into tasks, by task id: their results are budgeted as the
    /// calls' own answers would be.
    tasks: Mutex<TaskTable>,
    /// Who this session serves (a digest of its bearer token or its address over HTTP,
    /// `stdio` over stdio): the task tokens it issues open for it only.
    principal: String,
    /// Pages read from the shared cache for calls on their way in, by their key (opened;
    /// bounded: [`MAX_FETCHED`]).
    fetched: Mutex<std::collections::VecDeque<(String, Vec<u8>)>>,
    /// Chains cut for the shared cache, to write before their first page goes out.
    outbox: Mutex<Vec<crate::remote::Write>>,
    /// Held while chains are written: an answer whose chain another answer took to write
    /// waits for it.
    flushing: tokio::sync::Mutex<()>,
}

/// How many pages read from the shared cache wait for their call at most.
const MAX_FETCHED: usize = 16;

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
struct TaskTable {
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
    /// What the modern client is shown for the task id (a [`crate::task_token`]).
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
    fn remember(
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

/// How many clients' budgets one session keeps made (more are made again when asked).
const MAX_FITTED: usize = 32;

/// What a session's `initialize` chose: the client's profile, the server's built-in policy.
#[derive(Debug, Default)]
struct Chosen {
    profile: Option<crate::client::Profile>,
    policy: Option<Policy>,
    /// The client's `clientInfo.name`, to find its profile again after a reload.
    client: Option<String>,
    /// The server's name, once it named itself (`serverInfo`).
    server: Option<String>,
}

/// The name in `initialize`'s `clientInfo` (request) or `serverInfo` (response).
#[derive(Deserialize)]
struct InitializeRequest<'a> {
    #[serde(borrow)]
    params: Option<InitializeParams<'a>>,
}

#[derive(Deserialize)]
struct InitializeParams<'a> {
    #[serde(borrow, rename = "clientInfo")]
    client_info: Option<Named<'a>>,
}

#[derive(Deserialize)]
struct InitializeResponse<'a> {
    #[serde(borrow)]
    result: Option<InitializeResult<'a>>,
}

#[derive(Deserialize)]
struct InitializeResult<'a> {
    #[serde(borrow, rename = "serverInfo")]
    server_info: Option<Named<'a>>,
}

#[derive(Deserialize)]
struct Named<'a> {
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
}

/// What a tool's descriptor says that automatic paging needs.
#[derive(Debug, Default, Clone)]
struct ToolInfo {
    /// `annotations.readOnlyHint`: the tool may be called again to serve a page.
    read_only: bool,
    /// The tool takes an `after` argument of its own.
    own_after: bool,
    /// Its arguments that can narrow a result, for a refusal.
    narrowing: Vec<String>,
    /// Its input schema cannot take the budget's arguments (see
    /// [`descriptor::not_extensible`]): the tool is left unbudgeted.
    closed: bool,
    /// Its arguments that travel as HTTP headers too (2026-07-28, `x-mcp-header`): (the
    /// header's name after `Mcp-Param-`, the argument).
    headers: Vec<(String, String)>,
}

/// What the relay remembers about a `tools/call` until its response arrives.
#[derive(Debug)]
pub struct CallContext {
    /// The budget the request was read under: its answer is finished under the same one, even
    /// if a reload replaced it meanwhile.
    budget: Arc<Budget>,
    plan: CallPlan,
    auto: Option<AutoCall>,
    /// The call was a modern request: what the proxy writes for it carries `resultType`.
    modern: bool,
    /// The request itself, kept while the server has not named itself (its `initialize`
    /// answer, or a modern result's `serverInfo`, still to come): once it has, the call is
    /// planned again under the server's built-in policy before its answer is budgeted.
    unsettled: Option<Box<Unsettled>>,
    /// The request itself, kept where the server may answer it with a task (the call asked
    /// for one, or the client declared the tasks extension): the task's result is budgeted as
    /// this call's answer.
    task_origin: Option<Box<Unsettled>>,
}

/// A `tools/call` as it arrived, while the server had not named itself (or while its answer may
/// be a task).
#[derive(Debug, Clone)]
struct Unsettled {
    id: Id,
    request: Arc<[u8]>,
    modern: Option<Modern>,
}

impl Unsettled {
    /// The call a task token carries, as its client sent it.
    fn of_call(call: &task_token::Call) -> Unsettled {
        // The arguments as the client wrote them (JSON text the token's MAC vouches for).
        let arguments = call
            .arguments
            .as_ref()
            .map(|a| format!(r#","arguments":{}"#, a.get()))
            .unwrap_or_default();
        let request = format!(
            r#"{{"jsonrpc":"2.0","id":0,"method":"tools/call","params":{{"name":{}{arguments}}}}}"#,
            crate::jsonrpc::quote(&call.tool)
        );
        Unsettled {
            id: Id::from_json_text("0"),
            request: Arc::from(request.into_bytes()),
            modern: Some(Modern {
                version: std::borrow::Cow::Borrowed(crate::message::MODERN),
                client: call.client.clone(),
                capabilities: true,
                named: Some(call.tool.clone()),
                id_at: 0..0,
            }),
        }
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

impl CallContext {
    /// The tool called.
    pub fn tool(&self) -> &str {
        &self.plan.tool
    }
}

/// An automatically paged call: the upstream arguments (for the cursor's digest, computed
/// only when a result needs paging) or the digest itself, and where the page starts.
#[derive(Debug)]
struct AutoCall {
    /// Their JSON text.
    arguments: Option<Box<str>>,
    digest: Option<SelectionDigest>,
    at: Option<At>,
    /// The cursor said the tool may be run again on a miss (a replica that listed it knew it
    /// read-only): the pages of this run say so too.
    rerun: bool,
}

/// What to do with a client's `tools/call` request.
// Made once per call and taken apart at once: boxing the context would cost an allocation
// per call for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum CallDecision {
    /// Forward it upstream (rewritten when `Some`), and pass the context to the response hook.
    Forward {
        rewritten: Option<Vec<u8>>,
        context: CallContext,
    },
    /// Answer the client directly with this message; nothing goes upstream.
    Answer(Vec<u8>),
    /// Answer the client with what this job writes, run on the heavy-work pool (a search);
    /// nothing goes upstream.
    Defer(Deferred),
}

/// Work that answers a client request off the I/O threads.
pub struct Deferred(Box<dyn FnOnce() -> Vec<u8> + Send>);

impl Deferred {
    pub fn new(job: impl FnOnce() -> Vec<u8> + Send + 'static) -> Deferred {
        Deferred(Box::new(job))
    }

    /// Does the work: the answer to send.
    pub fn run(self) -> Vec<u8> {
        (self.0)()
    }

    /// Runs it on the heavy-work pool, or, where there is none (stdio), on tokio's blocking
    /// threads: never on the thread that relays the session's messages.
    pub async fn run_heavy(self) -> Vec<u8> {
        if crate::heavy::started() {
            return crate::heavy::run(move || self.run()).await;
        }
        match tokio::task::spawn_blocking(move || self.run()).await {
            Ok(answer) => answer,
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(err) => panic!("the search's thread ended before its answer: {err}"),
        }
    }
}

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deferred(..)")
    }
}

/// Two jobs are equal when they are the same job.
impl PartialEq for Deferred {
    fn eq(&self, other: &Deferred) -> bool {
        std::ptr::addr_eq(&*self.0, &*other.0)
    }
}

impl Eq for Deferred {}

#[derive(Deserialize)]
struct ResultOnly<'a> {
    #[serde(borrow)]
    result: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct IdOf<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct CallParts<'a> {
    #[serde(borrow)]
    params: Option<ParamsParts<'a>>,
}

#[derive(Deserialize)]
struct ParamsParts<'a> {
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
}

/// A `tools/call`'s parts in `text` (the call's line): where the envelope reader found them
/// (`at`), or by reading the call whole; `None` when it has no `params`.
fn read_call<'a>(
    text: &'a str,
    at: Option<&crate::message::CallAt>,
) -> Result<Option<Parts<'a>>, String> {
    if let Some(found) = at.and_then(|at| found_parts(text, at)) {
        return Ok(Some(found));
    }
    serde_json::from_str::<CallParts<'_>>(text)
        .map(|parts| {
            parts.params.map(|p| Parts {
                name: p.name,
                arguments: p.arguments.map(RawValue::get),
            })
        })
        .map_err(|err| err.to_string())
}

/// The call's parts where the envelope reader found them in `text`, read as [`CallParts`]
/// reads them; `None` when a place is not in `text` (then the call is read whole).
fn found_parts<'a>(text: &'a str, at: &crate::message::CallAt) -> Option<Parts<'a>> {
    if at.bad_params {
        // What reading the call whole says of it.
        return None;
    }
    let name = match &at.name {
        Some(range) => {
            let raw = text.get(range.clone())?;
            // Borrowed unless escaped (serde's own `Cow` always copies).
            // A name that is not a string: read whole, for the error the whole read gives.
            serde_json::from_str::<Option<crate::message::Key<'a>>>(raw)
                .ok()?
                .map(|key| key.0)
        }
        None => None,
    };
    let arguments = match &at.arguments {
        // JSON text the envelope reader read through: not read again (`null` is no arguments,
        // as the whole read takes it).
        Some(range) => Some(text.get(range.clone())?).filter(|raw| *raw != "null"),
        None => None,
    };
    Some(Parts { name, arguments })
}

/// A `tools/call`'s name and its arguments' JSON text.
struct Parts<'a> {
    name: Option<Cow<'a, str>>,
    arguments: Option<&'a str>,
}

/// Whether the JSON object `arguments` may have a key twice: not when it has fewer than two
/// `:` (every key is followed by one), which most calls are, and which needs no read.
fn may_repeat_a_key(arguments: &str) -> bool {
    memchr::memchr_iter(b':', arguments.as_bytes())
        .nth(1)
        .is_some()
}

/// What the servers of this process said of themselves, by origin (bounded: a gateway reaches
/// one server; a listener starts one command).
struct Identities(Mutex<HashMap<String, String>>);

/// At most this many origins are remembered.
const MAX_ORIGINS: usize = 64;

impl Identities {
    fn get(&self, origin: &str) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(origin)
            .cloned()
    }

    fn put(&self, origin: &str, name: &str) {
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if known.len() >= MAX_ORIGINS && !known.contains_key(origin) {
            known.clear();
        }
        known.insert(origin.to_string(), name.to_string());
    }

    fn forget(&self, origin: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(origin);
    }
}

fn identities() -> &'static Identities {
    static KNOWN: std::sync::OnceLock<Identities> = std::sync::OnceLock::new();
    KNOWN.get_or_init(|| Identities(Mutex::new(HashMap::new())))
}

/// The name a modern result gives the server: `result._meta["io.modelcontextprotocol/serverInfo"].name`.
fn server_info_in_meta(message: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Response<'a> {
        #[serde(borrow)]
        result: Option<WithMeta<'a>>,
    }
    #[derive(Deserialize)]
    struct WithMeta<'a> {
        #[serde(borrow, rename = "_meta")]
        meta: Option<ServerMeta<'a>>,
    }
    #[derive(Deserialize)]
    struct ServerMeta<'a> {
        #[serde(borrow, rename = "io.modelcontextprotocol/serverInfo")]
        server: Option<Named<'a>>,
    }
    static KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| {
            memchr::memmem::Finder::new(crate::message::META_SERVER_INFO.as_bytes())
        });
    KEY.find(message)?;
    let response: Response<'_> = serde_json::from_slice(message).ok()?;
    response.result?.meta?.server?.name.map(Cow::into_owned)
}

/// The longest tool name a call may give (MCP's own limit for names is 128 characters).
const MAX_TOOL_NAME: usize = 1024;

/// Argument names that usually narrow what a tool returns.
const NARROWING: &[&str] = &[
    "head", "tail", "limit", "max", "count", "offset", "start", "end", "line", "path", "pattern",
    "query", "filter", "glob", "depth", "since", "until", "range", "exclude", "include", "page",
    "first", "last", "top", "search", "match", "select", "field", "columns", "where", "n", "bytes",
    "size", "length", "lines",
];

/// The digest that identifies an automatically paged call.
fn auto_digest(tool: &str, arguments: &Map<String, Value>) -> SelectionDigest {
    cursor::digest(&json!({"tool": tool, "arguments": arguments, "auto": true}))
}

impl Drop for Interceptor {
    fn drop(&mut self) {
        self.base.get().cache().forget(self.scope);
        if let Some(metrics) = crate::metrics::get() {
            metrics.sessions.dec();
        }
    }
}

impl Interceptor {
    pub fn new(budget: Budget) -> Self {
        Interceptor::shared(Arc::new(budget))
    }

    /// An interceptor for one of several sessions under the same budget (and cursor key).
    pub fn shared(budget: Arc<Budget>) -> Self {
        Interceptor::reloadable(crate::reload::Shared::new(budget))
    }

    /// An interceptor for one session under a budget a reload may replace.
    pub fn reloadable(shared: Arc<crate::reload::Shared>) -> Self {
        let budget = shared.get();
        let scope = budget.cache().scope();
        if let Some(metrics) = crate::metrics::get() {
            metrics.sessions.inc();
        }
        let interceptor = Interceptor {
            current: Mutex::new((shared.generation(), budget.clone())),
            base: shared,
            chosen: Mutex::new(Chosen::default()),
            scope,
            tools: Arc::new(Mutex::new(HashMap::new())),
            fitted: Mutex::new((0, HashMap::new())),
            origin: None,
            tasks: Mutex::new(TaskTable::default()),
            principal: "stdio".to_string(),
            fetched: Mutex::new(std::collections::VecDeque::new()),
            outbox: Mutex::new(Vec::new()),
            flushing: tokio::sync::Mutex::new(()),
        };
        if let Some(forced) = budget.choice().forced.clone() {
            interceptor.choose(|chosen| chosen.profile = Some(forced));
        }
        interceptor
    }

    /// Changes when a policy reload changed what descriptors say.
    pub fn descriptor_changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.base.descriptor_changes()
    }

    /// This session serves `principal` (over HTTP: the credential or the client address): the
    /// task tokens it issues open for that principal only.
    pub fn for_principal(mut self, principal: impl Into<String>) -> Self {
        self.principal = principal.into();
        self
    }

    /// This session's server is the one at `origin`: what it said of itself in an earlier
    /// session of this process (its name, or none) holds at once, so that a new session
    /// neither asks it again nor budgets its first call without its built-in policy.
    pub fn for_origin(mut self, origin: Option<String>) -> Self {
        self.origin = origin;
        let known = self
            .origin
            .as_ref()
            .and_then(|origin| identities().get(origin));
        match known.as_deref() {
            Some("") => self.server_unnamed(),
            Some(name) => self.server_named(name),
            None => {}
        }
        self
    }

    /// The server was restarted: it is asked again who it is (it may be another now).
    pub fn server_restarted(&self) {
        self.chosen().server = None;
        if let Some(origin) = &self.origin {
            identities().forget(origin);
        }
    }

    /// The key cursors are minted under (the era bridge mints its `requestState` with it).
    pub fn cursor_key(&self) -> crate::budget::cursor::CursorKey {
        self.budget().key().clone()
    }

    /// The server's origin (its command line or URL), when known.
    pub fn origin(&self) -> Option<&str> {
        self.origin.as_deref()
    }

    /// Keeps what the server said of itself for the other sessions of its origin.
    fn remember_identity(&self, name: &str) {
        if let Some(origin) = &self.origin {
            identities().put(origin, name);
        }
    }

    /// Records on `tool`'s metrics, when metrics are on (a tool label is a listed name).
    fn count(
        &self,
        tool: &str,
        record: impl FnOnce(&crate::metrics::Metrics, &crate::metrics::ToolLabel),
    ) {
        if let Some(metrics) = crate::metrics::get() {
            let listed = self
                .tools
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains_key(tool);
            record(metrics, &metrics.tool(tool, listed));
        }
    }

    /// This session's budget (made again after a policy reload).
    fn budget(&self) -> Arc<Budget> {
        let generation = self.base.generation();
        {
            let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
            if current.0 == generation {
                return current.1.clone();
            }
        }
        let base = self.base.get();
        let choice = base.choice();
        self.choose(|chosen| {
            // The client's profile as the new policy has it.
            chosen.profile = match (&choice.forced, &chosen.client) {
                (Some(forced), _) => Some(forced.clone()),
                (None, Some(client)) if choice.fit_clients => {
                    crate::client::find(&choice.profiles, client)
                }
                _ => None,
            };
        });
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .clone()
    }

    /// Changes what this session chose, and fits its budget to it.
    fn choose(&self, change: impl FnOnce(&mut Chosen)) {
        let mut chosen = self.chosen.lock().unwrap_or_else(PoisonError::into_inner);
        change(&mut chosen);
        if chosen
            .profile
            .as_ref()
            .is_some_and(|p| p.max_tokens.is_some())
        {
            crate::tokens::preload();
        }
        let generation = self.base.generation();
        let base = self.base.get();
        let budget = if chosen.profile.is_none() && chosen.policy.is_none() {
            base
        } else {
            Arc::new(base.for_session(chosen.policy.as_ref(), chosen.profile.as_ref()))
        };
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = (generation, budget);
        self.fitted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .clear();
    }

    /// The budget of one request: fitted to the client a modern request names in its `_meta`
    /// (`clientInfo.name`), else this session's (its `initialize`, `--client`, the policy).
    fn budget_for(&self, modern: Option<&Modern>) -> Arc<Budget> {
        let session = self.budget();
        let Some(name) = modern.and_then(|m| m.client.as_deref()) else {
            return session;
        };
        let base = self.base.get();
        let choice = base.choice();
        if !choice.fit_clients || choice.forced.is_some() {
            return session;
        }
        let generation = self.base.generation();
        let mut fitted = self.fitted.lock().unwrap_or_else(PoisonError::into_inner);
        if fitted.0 != generation {
            *fitted = (generation, HashMap::new());
        }
        if let Some(budget) = fitted.1.get(name) {
            return budget.clone();
        }
        let budget = match crate::client::find(&choice.profiles, name) {
            Some(profile) => {
                if profile.max_tokens.is_some() {
                    crate::tokens::preload();
                }
                let policy = self.chosen().policy.clone();
                tracing::debug!(client = %name, profile = %profile.name, "a modern request's client profile");
                Arc::new(base.for_session(policy.as_ref(), Some(&profile)))
            }
            None => session,
        };
        if fitted.1.len() >= MAX_FITTED {
            fitted.1.clear();
        }
        fitted.1.insert(name.to_string(), budget.clone());
        budget
    }

    /// The client's `initialize`: its budget comes from its profile (`clientInfo.name`).
    pub fn initialize_request(&self, message: &[u8]) {
        let base = self.base.get();
        let choice = base.choice();
        if !choice.fit_clients || choice.forced.is_some() {
            return;
        }
        let name = serde_json::from_slice::<InitializeRequest<'_>>(message)
            .ok()
            .and_then(|m| m.params?.client_info?.name.map(Cow::into_owned));
        let Some(name) = name else { return };
        self.chosen().client = Some(name.clone());
        match crate::client::find(&choice.profiles, &name) {
            Some(profile) => {
                let budget = base.for_session(None, Some(&profile));
                let limits = budget.limits();
                tracing::info!(
                    client = %name,
                    profile = %profile.name,
                    max_bytes = limits.bytes,
                    max_tokens = ?limits.tokens,
                    max_lines = ?limits.lines,
                    "client profile: results are fitted to this client"
                );
                self.choose(|chosen| chosen.profile = Some(profile));
            }
            None => tracing::info!(
                client = %name,
                max_bytes = base.limits().bytes,
                "no client profile for this client: the policy's budget applies"
            ),
        }
    }

    /// The server's answer to `initialize`: with no `--policy`, the built-in policy written for
    /// the server (`serverInfo.name`), if there is one.
    pub fn initialize_response(&self, message: &[u8]) {
        let name = serde_json::from_slice::<InitializeResponse<'_>>(message)
            .ok()
            .and_then(|m| m.result?.server_info?.name.map(Cow::into_owned));
        match name {
            Some(name) => self.server_named(&name),
            None => self.server_unnamed(),
        }
    }

    /// The server's answer to `server/discover` (2026-07-28): it names the server in its
    /// `_meta`, as any modern result may.
    pub fn discover_response(&self, message: &[u8]) {
        match server_info_in_meta(message) {
            Some(name) => self.server_named(&name),
            None => self.server_unnamed(),
        }
    }

    /// The server answered the question of who it is without a name: no built-in policy will
    /// come, and no call waits for one.
    fn server_unnamed(&self) {
        let first = {
            let mut chosen = self.chosen.lock().unwrap_or_else(PoisonError::into_inner);
            let first = chosen.server.is_none();
            chosen.server.get_or_insert_with(String::new);
            first
        };
        if first {
            self.remember_identity("");
        }
    }

    /// What this session chose so far (its server's name, its client's, their policy).
    fn chosen(&self) -> std::sync::MutexGuard<'_, Chosen> {
        self.chosen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this session's budget may still change when the server names itself (no
    /// `--policy`, and no name yet).
    pub fn unsettled(&self) -> bool {
        // The server's name first: once it is known (every call after `initialize`), the
        // budget is not looked up.
        let named = self.chosen().server.is_some();
        !named && self.base.get().choice().pick_policy
    }

    /// A call planned before the server named itself, planned again if it has since (by its
    /// `initialize` answer, or by this very answer's `serverInfo`): a call sent before the
    /// server was known is budgeted under the server's built-in policy all the same.
    fn settled(&self, context: CallContext, message: &[u8]) -> CallContext {
        let Some(Unsettled {
            id,
            request,
            modern,
        }) = context.unsettled.as_deref()
        else {
            return context;
        };
        if self.unsettled()
            && let Some(name) = server_info_in_meta(message)
        {
            self.server_named(&name);
        }
        if self.unsettled() {
            return context;
        }
        let budget = self.budget_for(modern.as_ref());
        if Arc::ptr_eq(&budget, &context.budget) {
            return context;
        }
        match self.call_request(id, request, budget, false) {
            CallDecision::Forward {
                context: mut again, ..
            } => {
                tracing::debug!(tool = %again.plan.tool, "a call sent before the server named itself is budgeted under its built-in policy");
                again.modern = context.modern;
                again
            }
            // Its arguments do not suit the new policy: the answer is budgeted as planned.
            CallDecision::Answer(_) | CallDecision::Defer(_) => context,
        }
    }

    /// The server is `name`: with no `--policy`, its built-in policy, once per session.
    fn server_named(&self, name: &str) {
        if !self.base.get().choice().pick_policy {
            return;
        }
        {
            let chosen = self.chosen.lock().unwrap_or_else(PoisonError::into_inner);
            if chosen.server.as_deref() == Some(name) {
                return;
            }
        }
        self.chosen().server = Some(name.to_string());
        self.remember_identity(name);
        let Some(builtin) = crate::builtin::for_server(name) else {
            tracing::info!(server = %name, "no built-in policy for this server: every tool is paged automatically");
            return;
        };
        let path = std::path::PathBuf::from(format!("builtin:{}", builtin.name));
        match Policy::parse(builtin.text, &path) {
            Ok(policy) => {
                tracing::info!(
                    server = %name,
                    policy = %path.display(),
                    "built-in policy selected for this server (--policy none turns this off)"
                );
                self.choose(|chosen| chosen.policy = Some(policy));
            }
            Err(err) => {
                tracing::error!(policy = %path.display(), %err, "a built-in policy does not parse")
            }
        }
    }

    /// No rules: every tool result over the default budget is paged automatically.
    pub fn passthrough() -> Self {
        Interceptor::new(Budget::new(Policy::default()))
    }

    /// The argument that continues an automatically paged result of `tool`.
    fn continuation(&self, tool: &str) -> &'static str {
        let own_after = self
            .tools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(tool)
            .is_some_and(|info| info.own_after);
        if own_after {
            descriptor::OWN_AFTER_ARGUMENT
        } else {
            "after"
        }
    }

    /// The arguments of `tool` that travel as `Mcp-Param-*` headers: (header name, argument),
    /// as its listed descriptor says (nothing for a tool not listed in this session).
    pub fn param_headers(&self, tool: &str) -> Vec<(String, String)> {
        self.tools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(tool)
            .map(|info| info.headers.clone())
            .unwrap_or_default()
    }

    fn tool_info(&self, tool: &str) -> ToolInfo {
        self.tools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(tool)
            .cloned()
            .unwrap_or_default()
    }

    /// This session knows the tools as `other`'s `tools/list` said, now and after: another
    /// process of the same server, serving the same client's calls that declare other
    /// capabilities (the client lists the tools once).
    pub fn sharing_tools_of(mut self, other: &Interceptor) -> Self {
        self.tools = other.tools.clone();
        self
    }

    /// A response to the client's `tools/list`: the rewritten message, or `None` to forward it.
    /// `modern`: the request's `_meta` (2026-07-28): the list is fitted to the client it names,
    /// and marked `cacheScope: "private"` whenever its bytes depend on who asked: a rule's
    /// descriptor names the page sizes of the asking client's profile (an unknown client's
    /// list differs from codex's too), unless `--client` gives every client the same.
    pub fn tools_list_response(&self, message: &[u8], modern: Option<&Modern>) -> Option<Vec<u8>> {
        if let Some(name) = server_info_in_meta(message) {
            self.server_named(&name);
        }
        let budget = self.budget_for(modern);
        let text = self.list_result(message, &budget)?;
        let profiled = modern.is_some() && {
            let base = self.base.get();
            let choice = base.choice();
            choice.fit_clients && choice.forced.is_none() && !budget.policy().rules.is_empty()
        };
        let (raw, text) = text;
        let text = match profiled {
            true => crate::era::private(&text).unwrap_or(text),
            false => text,
        };
        Some(splice(message, raw, text.as_bytes()))
    }

    /// The rewritten result of a `tools/list` response (and where the server's is in
    /// `message`), or `None` when the budget leaves it as it is.
    fn list_result<'m>(&self, message: &'m [u8], budget: &Budget) -> Option<(&'m str, String)> {
        let policy = budget.policy();
        if policy.rules.is_empty() && !policy.auto && !policy.hides_any() {
            return None;
        }
        let raw = serde_json::from_slice::<ResultOnly<'_>>(message)
            .ok()?
            .result?;
        // Hidden tools first: the client never learns of them.
        let mut text: Option<String> = None;
        if policy.hides_any() {
            text = descriptor::without_hidden(raw.get(), |name| policy.hides(name));
        }
        let mut result: Value = serde_json::from_str(text.as_deref().unwrap_or(raw.get())).ok()?;
        self.remember_tools(&result);
        if policy.auto
            && let Some(spliced) =
                descriptor::add_auto_after(text.as_deref().unwrap_or(raw.get()), |name| {
                    budget.auto_for(name)
                })
        {
            text = Some(spliced);
        }
        if !policy.rules.is_empty() {
            if let Some(spliced) = &text {
                result = serde_json::from_str(spliced).ok()?;
            }
            if budget.rewrite_tools_list(&mut result) {
                // Written with the server's own bytes wherever the descriptors are unchanged.
                let original = text.as_deref().unwrap_or(raw.get());
                text = Some(crate::budget::exact::respell(&result, original));
            }
        }
        // Offered where a listed tool's results may be paged.
        let pageable = result
            .get("tools")
            .and_then(Value::as_array)
            .is_some_and(|tools| {
                tools.iter().any(|tool| {
                    tool.get("name")
                        .and_then(Value::as_str)
                        .is_some_and(|name| budget.auto_for(name) || budget.is_paged(name))
                })
            });
        // Listed once: after the server's last page of tools.
        let last_page = crate::budget::raw::members(raw.get()).is_some_and(|members| {
            members
                .iter()
                .rev()
                .find(|(k, _)| k == "nextCursor")
                .is_none_or(|(_, r)| raw.get()[r.clone()].trim() == "null")
        });
        if pageable
            && last_page
            && self.offers_search(budget)
            && let Some(spliced) = with_search_tool(text.as_deref().unwrap_or(raw.get()))
        {
            text = Some(spliced);
        }
        Some((raw.get(), text?))
    }

    fn remember_tools(&self, result: &Value) {
        let Some(tools) = result.get("tools").and_then(Value::as_array) else {
            return;
        };
        let mut known = self.tools.lock().unwrap_or_else(PoisonError::into_inner);
        for tool in tools {
            let Some(name) = tool.get("name").and_then(Value::as_str) else {
                continue;
            };
            let properties = tool
                .pointer("/inputSchema/properties")
                .and_then(Value::as_object);
            let names: Vec<String> = properties
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            let narrowing = names
                .iter()
                .filter(|n| {
                    let lower = n.to_ascii_lowercase();
                    NARROWING
                        .iter()
                        .any(|w| lower == *w || (w.len() > 2 && lower.contains(w)))
                })
                .cloned()
                .collect();
            let closed = tool.get("inputSchema").and_then(descriptor::not_extensible);
            let was_closed = known.get(name).is_some_and(|info| info.closed);
            if let Some(why) = &closed
                && !was_closed
            {
                tracing::warn!(tool = %name, why = %why, "this tool's input schema cannot take the budget's arguments safely: it is left as the server wrote it and its results are not paged (the byte cap still holds)");
            }
            known.insert(
                name.to_string(),
                ToolInfo {
                    closed: closed.is_some(),
                    read_only: tool.pointer("/annotations/readOnlyHint")
                        == Some(&Value::Bool(true)),
                    own_after: names.iter().any(|n| n == "after"),
                    narrowing,
                    headers: properties
                        .map(|p| {
                            p.iter()
                                .filter_map(|(argument, schema)| {
                                    let header = schema.get("x-mcp-header")?.as_str()?;
                                    Some((header.to_string(), argument.clone()))
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                },
            );
        }
    }

    /// A client's `tools/call` request; `modern`: its `_meta` (2026-07-28), when it has one:
    /// it is budgeted for the client that names itself there, and every result the proxy
    /// writes for it is complete (`resultType`).
    /// `call`: where the envelope reader found the call's name and arguments in `message`.
    pub fn tools_call_request(
        &self,
        id: &Id,
        message: &[u8],
        modern: Option<&Modern>,
        call: Option<&crate::message::CallAt>,
    ) -> CallDecision {
        let budget = self.budget_for(modern);
        match self.call_request_at(id, message, budget, true, call) {
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
    fn call_request(
        &self,
        id: &Id,
        message: &[u8],
        budget: Arc<Budget>,
        counted: bool,
    ) -> CallDecision {
        self.call_request_at(id, message, budget, counted, None)
    }

    /// [`Self::call_request`], with where the call's parts are when the envelope reader found
    /// them (then the call is not read again).
    fn call_request_at(
        &self,
        id: &Id,
        message: &[u8],
        budget: Arc<Budget>,
        counted: bool,
        at: Option<&crate::message::CallAt>,
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
                return CallDecision::Answer(crate::jsonrpc::error_response(
                    Some(id),
                    crate::jsonrpc::INVALID_PARAMS,
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
            return CallDecision::Answer(crate::jsonrpc::error_response(
                Some(id),
                crate::jsonrpc::INVALID_PARAMS,
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
            return CallDecision::Answer(crate::jsonrpc::error_response(
                Some(id),
                crate::jsonrpc::INVALID_PARAMS,
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
            return self.search_call(id, parts.as_ref().and_then(|p| p.arguments), budget);
        }
        if budget.policy().hides(&name) {
            tracing::info!(tool = %name, "call to a tool the policy hides refused");
            return CallDecision::Answer(crate::jsonrpc::tool_error(
                id,
                &format!(
                    "{name} is not available through this proxy (its policy hides it); call one of the tools tools/list returns"
                ),
            ));
        }
        if self.tool_info(&name).closed {
            // Its descriptor was left as the server wrote it: so is the call.
            return forward(budget.plan_unpaged(name), None, None);
        }
        if budget.auto_for(&name) {
            let arguments = parts.as_ref().and_then(|p| p.arguments);
            // A cheap look for the continuation argument's name; only a call that has it is
            // parsed.
            let argument: &[u8] = match self.continuation(&name) {
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
                return forward(budget.plan_unpaged(name), Some(auto), None);
            }
            return self.auto_continue(id, name, message, budget.clone());
        }
        if !budget.is_paged(&name) {
            return forward(budget.plan_unpaged(name), None, None);
        }
        let mut request = match serde_json::from_slice::<Value>(message) {
            Ok(request) => request,
            Err(err) => {
                // The budget cannot read its arguments, so it cannot apply the policy: refuse
                // rather than pass an unbudgeted call through.
                let text = format!("Parse error: the tools/call request could not be read ({err})");
                return CallDecision::Answer(crate::jsonrpc::error_response(
                    Some(id),
                    crate::jsonrpc::PARSE_ERROR,
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
                CallDecision::Answer(crate::jsonrpc::tool_error(id, &error.to_string()))
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
        name: String,
        message: &[u8],
        budget: Arc<Budget>,
    ) -> CallDecision {
        let info = self.tool_info(&name);
        let plain = |arguments: Option<Box<str>>| CallDecision::Forward {
            rewritten: None,
            context: CallContext {
                budget: budget.clone(),
                plan: budget.plan_unpaged(name.clone()),
                auto: Some(AutoCall {
                    arguments,
                    digest: None,
                    at: None,
                    rerun: false,
                }),
                modern: false,
                unsettled: None,
                task_origin: None,
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
                        plan: budget.plan_unpaged(name),
                        auto: Some(AutoCall {
                            arguments: raw,
                            digest: None,
                            at: None,
                            rerun: false,
                        }),
                        modern: false,
                        unsettled: None,
                        task_origin: None,
                    },
                };
            }
            Some(_) => {
                self.count(&name, |m, tool| {
                    m.refused(tool, crate::metrics::Class::bad_arguments)
                });
                return CallDecision::Answer(crate::jsonrpc::tool_error(
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
                return CallDecision::Answer(crate::jsonrpc::tool_error(
                    id,
                    &cursor_refusal(err, &name),
                ));
            }
        };
        let Some(at) = at else {
            self.count(&name, |m, tool| {
                m.refused(tool, crate::metrics::Class::invalid_cursor)
            });
            return CallDecision::Answer(crate::jsonrpc::tool_error(
                id,
                &cursor_refusal(CursorError::Invalid, &name),
            ));
        };
        let cached = budget.cache().get(self.scope, &digest);
        if let Some(crate::budget::cache::Cached::Auto(prepared)) = cached.as_deref() {
            tracing::debug!(tool = %name, "page served from the result cache");
            let max = budget.page_max(&name);
            let answer = match page_fitted(prepared, &budget, at, max, &name, &digest) {
                Ok(page) => {
                    self.count(&name, |m, tool| {
                        m.cache_hits.get_or_create(tool).inc();
                        m.result(tool, 0, page.result.len(), true);
                    });
                    crate::jsonrpc::result_response(id, &page.result)
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
                    crate::jsonrpc::tool_error(
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
            return CallDecision::Answer(crate::jsonrpc::result_response(id, &page));
        }
        self.count(&name, |m, tool| {
            m.cache_misses.get_or_create(tool).inc();
        });
        if !(info.read_only || budget.idempotent(&name) || rerun) {
            self.count(&name, |m, tool| {
                m.refused(tool, crate::metrics::Class::expired_cursor)
            });
            return CallDecision::Answer(crate::jsonrpc::tool_error(
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
                plan: budget.plan_unpaged(name),
                auto: Some(AutoCall {
                    arguments: None,
                    digest: Some(digest),
                    at: Some(at),
                    rerun: true,
                }),
                modern: false,
                unsettled: None,
                task_origin: None,
            },
        }
    }

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

    fn remote_key(&self, budget: &Budget, digest: &SelectionDigest, at: At) -> String {
        let position = format!("{}.{}.{:016x}", at.piece, at.offset, at.fingerprint);
        crate::remote::page_key(budget.key(), &self.principal, digest, &position)
    }

    /// The page at `at` that the shared cache gave for this call, if it was cut for pages of
    /// this size (another client profile's pages are not this client's).
    fn take_fetched(&self, budget: &Budget, tool: &str, key: &str) -> Option<String> {
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
        self.sealed_chain(budget, tool, pages)
    }

    /// Whether this session offers the search tool: the policy has it on, something is paged,
    /// and the server has no tool of that name.
    fn offers_search(&self, budget: &Budget) -> bool {
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
    fn search_call(&self, id: &Id, arguments: Option<&str>, budget: Arc<Budget>) -> CallDecision {
        let arguments = match arguments.map(serde_json::from_str::<Map<String, Value>>) {
            None => Map::new(),
            Some(Ok(arguments)) => arguments,
            Some(Err(_)) => {
                return CallDecision::Answer(crate::jsonrpc::tool_error(
                    id,
                    "the arguments of mcp_budget_search must be an object with cursor and pattern or path",
                ));
            }
        };
        let request = match crate::search::Request::read(&arguments) {
            Ok(request) => request,
            Err(text) => return CallDecision::Answer(crate::jsonrpc::tool_error(id, &text)),
        };
        let scope = self.scope;
        let id = id.clone();
        CallDecision::Defer(Deferred::new(move || {
            let result = crate::search::answer(&budget, scope, &request);
            crate::jsonrpc::result_response(&id, &result)
        }))
    }

    /// The next page of a rule chain, from the result cache; `None` when the entry is gone and
    /// the tool may run again (read-only or declared idempotent), else the expired-cache error.
    fn rule_continue(
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
                return Some(CallDecision::Answer(crate::jsonrpc::result_response(
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
            return Some(CallDecision::Answer(crate::jsonrpc::tool_error(
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
                    self.auto_result(budget, name, call, entry.raw())
                        .unwrap_or_else(|| entry.raw().as_bytes().to_vec())
                }
                Err(err) => {
                    tracing::error!(tool = %name, %err, "the budget failed on a cached result");
                    return Some(CallDecision::Answer(crate::jsonrpc::error_response(
                        Some(id),
                        crate::jsonrpc::UPSTREAM_ERROR,
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
        Some(CallDecision::Answer(crate::jsonrpc::result_response(
            id, &result,
        )))
    }

    /// The error for a cursor whose result left the cache, of a tool the proxy will not run again.
    fn expired(&self, budget: &Budget, name: &str, argument: &str) -> String {
        let ttl = budget.cache().ttl().as_secs();
        let minutes = ttl.div_ceil(60);
        format!(
            "The result this cursor pages is no longer in mcp-budget's cache (results are kept {minutes} minute{}, within {}), and {name} is not marked read-only, so the proxy will not run it again on its own. Call {name} again without {argument} to start over.",
            if minutes == 1 { "" } else { "s" },
            size_text(budget.cache().limit())
        )
    }

    /// The refusal of a result that cannot be paged, written for the model.
    fn unpageable(&self, budget: &Budget, tool: &str, why: &Unpageable, bytes: usize) -> String {
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

    /// The response to a `tools/call`: the rewritten message, or `None` to forward it.
    /// `result`: where its result is in `message`, when the envelope reader found it (else it
    /// is looked for here).
    pub fn tools_call_response(
        &self,
        mut context: CallContext,
        message: &[u8],
        result: Option<std::ops::Range<usize>>,
    ) -> Option<Vec<u8>> {
        let raw = result_of(message, result)?;
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
    fn budget_result(&self, context: CallContext, message: &[u8], raw: &str) -> Option<Vec<u8>> {
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
    fn call_response(&self, context: CallContext, message: &[u8], raw: &str) -> Option<Vec<u8>> {
        let budget = context.budget.clone();
        let size = raw.len();
        if let Some(auto) = context.auto {
            return self.auto_response(&budget, &context.plan.tool, auto, message, raw);
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
            match self.rule_response(&budget, &context.plan, raw) {
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
                return self.auto_response(&budget, &context.plan.tool, auto, message, raw);
            }
            Err(err) => {
                tracing::error!(tool = %context.plan.tool, %err, "the budget failed on a result");
                return Some(self.withheld(message, &err.to_string()));
            }
        };
        Some(splice(message, raw, &bytes))
    }

    /// A rule page of a fresh upstream result; the result is kept in the cache for the chain's
    /// later pages when more remain.
    fn rule_response(
        &self,
        budget: &Budget,
        plan: &CallPlan,
        raw: &str,
    ) -> Result<Finished, crate::budget::render::RenderError> {
        let text = budget.pages_text(plan);
        let (finished, entry) = if text {
            let entry =
                crate::budget::chain::RuleResult::new(Arc::from(raw), true).of_tool(&plan.tool);
            let (finished, more) = budget.finish_rule(plan, &entry)?;
            (finished, more.then_some(entry))
        } else {
            // The walk of the list, made once: this page, and the chain's later ones, use it.
            let walked = budget.walk(plan, raw);
            let finished = budget.finish_walked(plan, raw, walked.as_ref())?;
            // (`next_after` may be inside a text block's JSON, its quotes escaped.)
            let more =
                matches!(&finished, Finished::Bytes(bytes) if crate::holds!(bytes, b"next_after"));
            let entry = more.then(|| {
                crate::budget::chain::RuleResult::new(Arc::from(raw), false)
                    .of_tool(&plan.tool)
                    .with_walk(walked)
            });
            (finished, entry)
        };
        if let (Finished::Bytes(first), Some(entry), Some(digest)) =
            (&finished, entry, budget.chain_digest(plan))
        {
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
        let Some(params) = crate::message::params_of(request) else {
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
        message: &[u8],
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
    pub fn task_notification(&self, message: &[u8]) -> Result<Option<Vec<u8>>, Withheld> {
        let Some(params) = crate::message::params_of(message) else {
            return Ok(None);
        };
        let state = task_state(params).inspect_err(|_| {
            tracing::warn!("a notifications/tasks names its task's result twice: withheld");
        })?;
        let budgeted = state
            .last
            .and_then(|last| self.budget_task_result(state.task.as_deref(), message, last));
        let current = budgeted.as_deref().unwrap_or(message);
        let named = crate::message::params_of(current)
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
        let params = crate::message::params_of(message)?;
        let filter = raw_member(params, "notifications")?;
        task_token::respell_list(message, filter, "taskIds", |id| Some(self.shown_task(id)))
    }

    /// `last` (a task's final result, a part of `message`), budgeted as its call's answer.
    fn budget_task_result(
        &self,
        task: Option<&str>,
        message: &[u8],
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

    fn withheld(&self, message: &[u8], why: &str) -> Vec<u8> {
        let id = serde_json::from_slice::<IdOf<'_>>(message)
            .ok()
            .and_then(|m| m.id)
            .map(|raw| Id::from_json_text(raw.get()));
        crate::jsonrpc::error_response(
            id.as_ref(),
            crate::jsonrpc::UPSTREAM_ERROR,
            &format!("mcp-budget: {why}; the result was withheld rather than cut"),
            None,
        )
    }

    /// An automatically paged call's response: unchanged when it fits, else its page.
    fn auto_response(
        &self,
        budget: &Budget,
        tool: &str,
        call: AutoCall,
        message: &[u8],
        raw: &str,
    ) -> Option<Vec<u8>> {
        let bytes = self.auto_result(budget, tool, call, raw)?;
        Some(splice(message, raw, &bytes))
    }

    /// An automatically paged result: `None` when it fits unchanged, else its page (or the
    /// refusal of what cannot be paged).
    fn auto_result(
        &self,
        budget: &Budget,
        tool: &str,
        call: AutoCall,
        raw: &str,
    ) -> Option<Vec<u8>> {
        let result = raw;
        if call.at.is_none() && budget.fits_whole(tool, result) {
            return None;
        }
        let max = budget.page_max(tool);
        let digest = call.digest.unwrap_or_else(|| {
            let arguments = call
                .arguments
                .as_deref()
                .and_then(|a| serde_json::from_str::<Map<String, Value>>(a).ok())
                .unwrap_or_default();
            auto_digest(tool, &arguments)
        });
        let at = call.at.unwrap_or_default();
        let argument = self.continuation(tool);
        let named = budget.limits().byte_budget(max).to_string();
        let rerun = call.rerun || self.tool_info(tool).read_only || budget.idempotent(tool);
        let prepared = auto::prepare(Arc::from(result), max).map(|p| {
            p.with_argument(argument)
                .with_budget(named)
                .with_reads(budget.limits().reads)
                .with_text_limit(budget.text_page(tool))
                .with_search(budget.search_hint())
                .with_rerun(rerun)
        });
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
                            bytes = result.len(),
                            "a paged result is larger than the whole result cache; its next pages will call the tool again if it is read-only"
                        );
                    }
                }
                tracing::debug!(
                    tool,
                    bytes = result.len(),
                    page = page.result.len(),
                    "result paged automatically"
                );
                page.result.into_bytes()
            }
            (Err(why), _) | (_, Err(why)) => {
                let text = self.unpageable(budget, tool, &why, result.len());
                json!({"content": [{"type": "text", "text": text}], "isError": true})
                    .to_string()
                    .into_bytes()
            }
        };
        Some(bytes)
    }
}

/// A `tools/list` result with the search tool's descriptor after the server's tools.
fn with_search_tool(result: &str) -> Option<String> {
    let members = crate::budget::raw::members(result)?;
    let (_, tools) = members.iter().rev().find(|(k, _)| k == "tools")?;
    let list = &result[tools.clone()];
    let close = tools.start + list.rfind(']')?;
    let empty = crate::budget::raw::elements(list)?.is_empty();
    let descriptor = crate::search::descriptor().to_string();
    Some(format!(
        "{}{}{descriptor}{}",
        &result[..close],
        if empty { "" } else { "," },
        &result[close..]
    ))
}

/// A `CreateTaskResult`: the task's id and how long it lives. The 2025-11-25 form nests the task
/// (`{"task": {"taskId", "ttl"}}`); the tasks extension's is flat (`resultType: "task"`,
/// `taskId`, `ttlMs`). Read by shape, not by `resultType` alone: the extension's own examples
/// disagree with its text.
fn task_created(raw: &str) -> Option<(String, Duration)> {
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

/// The result of a response: at `range` when the envelope reader found it, else looked for.
fn result_of(message: &[u8], range: Option<std::ops::Range<usize>>) -> Option<&str> {
    match range {
        Some(range) => message
            .get(range)
            .and_then(|bytes| std::str::from_utf8(bytes).ok()),
        None => Some(
            serde_json::from_slice::<ResultOnly<'_>>(message)
                .ok()?
                .result?
                .get(),
        ),
    }
}

/// The text of the last member `name` of a JSON object's text.
fn raw_member<'t>(object: &'t str, name: &str) -> Option<&'t str> {
    let members = crate::budget::raw::members(object)?;
    let (_, range) = members.into_iter().rev().find(|(k, _)| k == name)?;
    object.get(range)
}

/// What a task's state says (a `tasks/result` or `tasks/get` result, a `notifications/tasks`'s
/// params), read in one pass.
struct TaskState<'a> {
    /// Its final result, to budget: the whole of a `tasks/result` answer (2025-11-25), or the
    /// `result` member of a completed task (the tasks extension); `None` for anything else
    /// (a status, an input request, a failure).
    last: Option<&'a str>,
    /// The task it names (`taskId`).
    task: Option<String>,
}

/// `raw`'s task state; `Err`: it names its `result` twice (keys read as a client reads them,
/// escapes decoded), so a client could read the one the proxy did not budget.
fn task_state(raw: &str) -> Result<TaskState<'_>, Withheld> {
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

/// The arguments of a `tools/call` request, as JSON text.
fn arguments_of(request: &[u8]) -> Option<Box<RawValue>> {
    serde_json::from_slice::<CallParts<'_>>(request)
        .ok()?
        .params?
        .arguments
        .map(ToOwned::to_owned)
}

/// The tool a `tools/call` request names.
fn tool_of(request: &[u8]) -> String {
    serde_json::from_slice::<CallParts<'_>>(request)
        .ok()
        .and_then(|parts| parts.params)
        .and_then(|p| p.name.map(|n| n.to_string()))
        .unwrap_or_default()
}

/// The page of `prepared` from `at`, under `max` bytes and the session's token and line
/// budgets.
/// What a page's cut depends on besides the result and the position: the page size and the
/// client's token and line limits (a digest, carried by pages in the shared cache).
fn page_fit(budget: &Budget, tool: &str) -> u64 {
    use sha2::Digest;
    let limits = budget.limits();
    let named = format!(
        "{}:{:?}:{:?}:{:?}",
        budget.page_max(tool),
        limits.tokens,
        limits.lines,
        limits.reads
    );
    let digest = sha2::Sha256::digest(named.as_bytes());
    let mut fit = [0u8; 8];
    fit.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(fit)
}

fn page_fitted(
    prepared: &auto::Prepared,
    budget: &Budget,
    at: At,
    max: usize,
    tool: &str,
    digest: &SelectionDigest,
) -> Result<auto::AutoPage, Unpageable> {
    let limits = budget.limits();
    if limits.tokens.is_none() && limits.lines.is_none() {
        return prepared.page(at, max, tool, budget.key(), digest);
    }
    let over = |page: &str| crate::tokens::over(page, limits).map(|o| o.ratio());
    prepared.page_fitting(at, max, &over, tool, budget.key(), digest)
}

/// What the budget made of a `tools/call` answer it rewrote (for metrics and traces).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A page, or a trimmed result.
    Paged,
    /// `result-too-large`.
    Refused,
    /// The result was withheld with an error (the budget failed on it).
    Withheld,
}

impl Outcome {
    /// Read from the rewritten answer: a refusal names itself, a withheld result is an error.
    pub fn of(rewritten: &[u8]) -> Outcome {
        if crate::holds!(rewritten, b"result-too-large:") {
            Outcome::Refused
        } else if crate::holds!(rewritten, b"\"error\"") && !crate::holds!(rewritten, b"\"result\"")
        {
            Outcome::Withheld
        } else {
            Outcome::Paged
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Paged => "paged",
            Outcome::Refused => "refused",
            Outcome::Withheld => "withheld",
        }
    }
}

/// A byte count as a person reads it: MiB, KiB or bytes.
fn size_text(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} bytes")
    }
}

fn cursor_refusal(err: CursorError, tool: &str) -> String {
    match err {
        CursorError::Invalid => "after is not a cursor this proxy issued (it is malformed or was altered); call again without after to start from the first page".to_string(),
        CursorError::OtherQuery => format!(
            "after belongs to a different query (another tool or other arguments); repeat the exact arguments of the {tool} call that returned it, or call again without after to start from the first page"
        ),
        CursorError::OtherKey => cursor::OTHER_KEY.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call's name and arguments, as text.
    type Read = (Option<String>, Option<String>);

    /// A call's parts as the interceptor reads them: from where the envelope reader found
    /// them, and by reading the call whole.
    fn both_ways(line: &str) -> (Option<Read>, Option<Read>) {
        let owned = |p: Parts<'_>| {
            (
                p.name.map(|n| n.to_string()),
                p.arguments.map(str::to_string),
            )
        };
        let Ok(crate::message::Parsed::Single(crate::message::Kind::Request {
            call: Some(at),
            ..
        })) = crate::message::parse(line.as_bytes())
        else {
            panic!("not a call: {line}");
        };
        let found = found_parts(line, &at).map(owned);
        let whole = read_call(line, None)
            .ok()
            .map(|parts| parts.map(owned).unwrap_or_default());
        (found, whole)
    }

    #[test]
    fn a_calls_parts_read_where_found_are_what_the_whole_read_gives() {
        for line in [
            r#"{"id":1,"method":"tools/call","params":{"name":"t","arguments":{"a":1}}}"#,
            r#"{"id":1,"method":"tools/call","params":{"arguments":{"a":[1,{"b":"}"}]},"name":"t\u0032"}}"#,
            r#"{"id":1,"method":"tools/call","params":{"name":null,"arguments":null}}"#,
            r#"{"id":1,"method":"tools/call","params":{"name":"t","arguments":"text"}}"#,
            r#"{"id":1,"method":"tools/call","params":{}}"#,
            r#"{"id":1,"method":"tools/call"}"#,
        ] {
            let (found, whole) = both_ways(line);
            assert_eq!(found, whole, "{line}");
        }
        // What cannot be read where it was found is read whole (and refused there, as before).
        for line in [
            r#"{"id":1,"method":"tools/call","params":{"name":5}}"#,
            r#"{"id":1,"method":"tools/call","params":[1]}"#,
        ] {
            assert_eq!(both_ways(line).0, None, "{line}");
        }
    }

    /// A task state's final result (see [`task_state`]).
    fn final_result(raw: &str) -> Option<&str> {
        task_state(raw).ok()?.last
    }

    #[test]
    fn a_task_state_is_read_in_one_pass_as_any_client_reads_it() {
        let state = task_state(r#"{"taskId":"t\u0031","status":"working"}"#).unwrap();
        assert_eq!(state.task.as_deref(), Some("t1"));
        // Its result twice, once spelled with an escape: withheld.
        for twice in [
            r#"{"status":"completed","result":{"content":[]},"result":{"content":[1]}}"#,
            r#"{"status":"completed","res\u0075lt":{"content":[]},"result":{"content":[]}}"#,
        ] {
            assert!(task_state(twice).is_err(), "{twice}");
        }
    }

    #[test]
    fn a_tasks_final_result_is_found_as_any_client_reads_it() {
        // The result of tasks/result: a tool's result, with or without other members.
        let legacy = r#"{"content":[{"type":"text","text":"x"}],"status":"odd"}"#;
        assert_eq!(final_result(legacy), Some(legacy));
        // A result of no known shape is held to the budget too.
        let bare = r#"{"structuredContent":{"rows":[1,2]}}"#;
        assert_eq!(final_result(bare), Some(bare));
        // A completed task, its status escaped, or named twice; its result of any shape.
        for task in [
            r#"{"taskId":"t","status":"complet\u0065d","result":{"content":[]}}"#,
            r#"{"taskId":"t","status":"completed","status":"working","result":{"content":[]}}"#,
        ] {
            assert_eq!(final_result(task), Some(r#"{"content":[]}"#), "{task}");
        }
        assert_eq!(
            final_result(r#"{"status":"completed","result":"a string"}"#),
            Some(r#""a string""#)
        );
        // A status, an input request, a failure: nothing to budget.
        for task in [
            r#"{"taskId":"t","status":"working"}"#,
            r#"{"taskId":"t","status":"failed","error":{"code":1,"message":"m"}}"#,
        ] {
            assert_eq!(final_result(task), None, "{task}");
        }
    }

    #[test]
    fn create_task_results_are_read_by_shape_in_either_era() {
        let legacy = r#"{"task":{"taskId":"a","status":"working","ttl":5000}}"#;
        assert_eq!(
            task_created(legacy),
            Some(("a".into(), Duration::from_millis(5000)))
        );
        let modern = r#"{"resultType":"task","taskId":"b","status":"working","ttlMs":7}"#;
        assert_eq!(
            task_created(modern),
            Some(("b".into(), Duration::from_millis(7)))
        );
        // A tool result that mentions a task id is not a task.
        let result = r#"{"content":[],"taskId":"c","resultType":"task"}"#;
        assert_eq!(task_created(result), None);
    }

    #[test]
    fn the_search_tool_is_listed_once_after_the_last_page_of_tools() {
        let interceptor = Interceptor::passthrough();
        let page = |cursor: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"result":{{"tools":[{{"name":"a","inputSchema":{{"type":"object"}}}}],"nextCursor":{cursor}}}}}"#
            )
        };
        let listed = |message: &str| {
            let rewritten = interceptor
                .tools_list_response(message.as_bytes(), None)
                .unwrap_or_else(|| message.as_bytes().to_vec());
            String::from_utf8(rewritten)
                .unwrap()
                .contains(crate::search::TOOL)
        };
        assert!(!listed(&page(r#""next""#)));
        assert!(listed(&page("null")));
        assert!(listed(
            r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a","inputSchema":{"type":"object"}}]}}"#
        ));
    }

    #[test]
    fn splice_keeps_everything_around_the_result() {
        let message = br#"{"id":7.0,"result":{"a":1},"x-extra":true}"#;
        let raw = serde_json::from_slice::<ResultOnly<'_>>(message)
            .unwrap()
            .result
            .unwrap();
        assert_eq!(
            String::from_utf8(splice(message, raw.get(), b"{\"b\":2}")).unwrap(),
            r#"{"id":7.0,"result":{"b":2},"x-extra":true}"#
        );
    }
}
