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

use bytes::Bytes;
use bytestring::ByteString;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::budget::auto::{self, At, Unpageable};
use crate::budget::cursor::{self, CursorError, SelectionDigest};
use crate::budget::{Budget, CallPlan, Finished, descriptor};
use crate::era::task_token;
use crate::policy::Policy;
use crate::wire::message::{Id, Modern, shared_part, splice};

mod call;
mod list;
mod paging;
mod parts;
mod references;
mod searching;
mod tasks;

use self::parts::*;
pub use self::parts::{CallContext, CallDecision, Deferred, Outcome};
pub use self::references::{ReferenceJob, Replaced, Substituted};
use self::tasks::*;
pub use self::tasks::{TaskNamed, Withheld};

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
    /// Whole results read from the shared cache for the references of a call on its way in,
    /// by their key (opened; bounded: [`references::MAX_WHOLES`]).
    wholes: Mutex<std::collections::VecDeque<(String, Arc<str>)>>,
    /// Chains cut for the shared cache, to write before their first page goes out.
    outbox: Mutex<Vec<crate::remote::Write>>,
    /// Held while chains are written: an answer whose chain another answer took to write
    /// waits for it.
    flushing: tokio::sync::Mutex<()>,
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
    /// Its top-level arguments the input schema declares strings: a result reference passed
    /// as one is replaced by the result's text, never its JSON.
    strings: Vec<String>,
    /// Its top-level arguments the input schema declares at all.
    declared: Vec<String>,
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
            memchr::memmem::Finder::new(crate::wire::message::META_SERVER_INFO.as_bytes())
        });
    KEY.find(message)?;
    let response: Response<'_> = serde_json::from_slice(message).ok()?;
    response.result?.meta?.server?.name.map(Cow::into_owned)
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
            wholes: Mutex::new(std::collections::VecDeque::new()),
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
        let Ok(crate::wire::message::Parsed::Single(crate::wire::message::Kind::Request {
            call: Some(at),
            ..
        })) = crate::wire::message::parse(line.as_bytes())
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
