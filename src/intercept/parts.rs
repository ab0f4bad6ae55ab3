//! What a call carries, and the pure helpers the other parts share.

use super::*;

/// What the relay remembers about a `tools/call` until its response arrives.
#[derive(Debug)]
pub struct CallContext {
    /// The budget the request was read under: its answer is finished under the same one, even
    /// if a reload replaced it meanwhile.
    pub(super) budget: Arc<Budget>,
    pub(super) plan: CallPlan,
    pub(super) auto: Option<AutoCall>,
    /// The call was a modern request: what the proxy writes for it carries `resultType`.
    pub(super) modern: bool,
    /// The request itself, kept while the server has not named itself (its `initialize`
    /// answer, or a modern result's `serverInfo`, still to come): once it has, the call is
    /// planned again under the server's built-in policy before its answer is budgeted.
    pub(super) unsettled: Option<Box<Unsettled>>,
    /// The request itself, kept where the server may answer it with a task (the call asked
    /// for one, or the client declared the tasks extension): the task's result is budgeted as
    /// this call's answer.
    pub(super) task_origin: Option<Box<Unsettled>>,
    /// The call runs for `mcp_budget_search` (a search by call): its whole result is kept as
    /// a chain's, and the answer is the search's.
    pub(super) search: Option<Box<SearchByCall>>,
}

/// A search by call: the search, and the chain the tool's whole result is kept as.
#[derive(Debug)]
pub(super) struct SearchByCall {
    pub(super) request: crate::search::Request,
    pub(super) digest: SelectionDigest,
}

/// A `tools/call` as it arrived, while the server had not named itself (or while its answer may
/// be a task).
#[derive(Debug, Clone)]
pub(super) struct Unsettled {
    pub(super) id: Id,
    pub(super) request: Arc<[u8]>,
    pub(super) modern: Option<Modern>,
}

impl Unsettled {
    /// The call a task token carries, as its client sent it.
    pub(super) fn of_call(call: &task_token::Call) -> Unsettled {
        // The arguments as the client wrote them (JSON text the token's MAC vouches for).
        let arguments = call
            .arguments
            .as_ref()
            .map(|a| format!(r#","arguments":{}"#, a.get()))
            .unwrap_or_default();
        let request = format!(
            r#"{{"jsonrpc":"2.0","id":0,"method":"tools/call","params":{{"name":{}{arguments}}}}}"#,
            crate::wire::jsonrpc::quote(&call.tool)
        );
        Unsettled {
            id: Id::from_json_text("0"),
            request: Arc::from(request.into_bytes()),
            modern: Some(Modern {
                version: std::borrow::Cow::Borrowed(crate::protocol::MODERN),
                client: call.client.clone(),
                capabilities: true,
                named: Some(call.tool.clone()),
                id_at: 0..0,
            }),
        }
    }
}

impl CallContext {
    /// The tool called.
    pub fn tool(&self) -> &str {
        &self.plan.tool
    }

    /// Whether the call runs for a search (its body names another tool than the client's).
    pub fn searches(&self) -> bool {
        self.search.is_some()
    }
}

/// An automatically paged call: the upstream arguments (for the cursor's digest, computed
/// only when a result needs paging) or the digest itself, and where the page starts.
#[derive(Debug)]
pub(super) struct AutoCall {
    /// Their JSON text.
    pub(super) arguments: Option<Box<str>>,
    pub(super) digest: Option<SelectionDigest>,
    pub(super) at: Option<At>,
    /// The cursor said the tool may be run again on a miss (a replica that listed it knew it
    /// read-only): the pages of this run say so too.
    pub(super) rerun: bool,
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
pub(super) struct ResultOnly<'a> {
    #[serde(borrow)]
    pub(super) result: Option<&'a RawValue>,
}

#[derive(Deserialize)]
pub(super) struct IdOf<'a> {
    #[serde(borrow)]
    pub(super) id: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct CallParts<'a> {
    #[serde(borrow)]
    params: Option<ParamsParts<'a>>,
}

#[derive(Deserialize)]
pub(super) struct ParamsParts<'a> {
    #[serde(borrow)]
    pub(super) name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) arguments: Option<&'a RawValue>,
}

/// A `tools/call`'s parts in `text` (the call's line): where the envelope reader found them
/// (`at`), or by reading the call whole; `None` when it has no `params`.
pub(super) fn read_call<'a>(
    text: &'a str,
    at: Option<&crate::wire::message::CallAt>,
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
pub(super) fn found_parts<'a>(
    text: &'a str,
    at: &crate::wire::message::CallAt,
) -> Option<Parts<'a>> {
    if at.bad_params {
        // What reading the call whole says of it.
        return None;
    }
    let name = match &at.name {
        Some(range) => {
            let raw = text.get(range.clone())?;
            // Borrowed unless escaped (serde's own `Cow` always copies).
            // A name that is not a string: read whole, for the error the whole read gives.
            serde_json::from_str::<Option<crate::wire::message::Key<'a>>>(raw)
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
pub(super) struct Parts<'a> {
    pub(super) name: Option<Cow<'a, str>>,
    pub(super) arguments: Option<&'a str>,
}

/// Whether the JSON object `arguments` may have a key twice: not when it has fewer than two
/// `:` (every key is followed by one), which most calls are, and which needs no read.
pub(super) fn may_repeat_a_key(arguments: &str) -> bool {
    memchr::memchr_iter(b':', arguments.as_bytes())
        .nth(1)
        .is_some()
}

/// Argument names that usually narrow what a tool returns.
pub(super) const NARROWING: &[&str] = &[
    "head", "tail", "limit", "max", "count", "offset", "start", "end", "line", "path", "pattern",
    "query", "filter", "glob", "depth", "since", "until", "range", "exclude", "include", "page",
    "first", "last", "top", "search", "match", "select", "field", "columns", "where", "n", "bytes",
    "size", "length", "lines",
];

/// The digest that identifies an automatically paged call.
pub(super) fn auto_digest(tool: &str, arguments: &Map<String, Value>) -> SelectionDigest {
    cursor::digest(&json!({"tool": tool, "arguments": arguments, "auto": true}))
}

/// A `tools/list` result with the search tool's descriptor after the server's tools.
pub(super) fn with_search_tool(result: &str) -> Option<String> {
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

/// The result of a response: at `range` when the envelope reader found it, else looked for.
pub(super) fn result_of(message: &[u8], range: Option<std::ops::Range<usize>>) -> Option<&str> {
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
pub(super) fn raw_member<'t>(object: &'t str, name: &str) -> Option<&'t str> {
    let members = crate::budget::raw::members(object)?;
    let (_, range) = members.into_iter().rev().find(|(k, _)| k == name)?;
    object.get(range)
}
/// The arguments of a `tools/call` request, as JSON text.
pub(super) fn arguments_of(request: &[u8]) -> Option<Box<RawValue>> {
    serde_json::from_slice::<CallParts<'_>>(request)
        .ok()?
        .params?
        .arguments
        .map(ToOwned::to_owned)
}

/// The tool a `tools/call` request names.
pub(super) fn tool_of(request: &[u8]) -> String {
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
pub(super) fn page_fit(budget: &Budget, tool: &str) -> u64 {
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

pub(super) fn page_fitted(
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
pub(super) fn size_text(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} bytes")
    }
}

pub(super) fn cursor_refusal(err: CursorError, tool: &str) -> String {
    match err {
        CursorError::Invalid => "after is not a cursor this proxy issued (it is malformed or was altered); call again without after to start from the first page".to_string(),
        CursorError::OtherQuery => format!(
            "after belongs to a different query (another tool or other arguments); repeat the exact arguments of the {tool} call that returned it, or call again without after to start from the first page"
        ),
        CursorError::OtherKey => cursor::OTHER_KEY.to_string(),
    }
}
