//! `mcp_budget_search`: the proxy's own tool, which searches a paged result the cache holds,
//! without running the tool again and without reading every page.
//!
//! Why: a 3 MB file is 155 pages; to find the three lines that mention an error a model would
//! read them all. The proxy holds the whole result, so it offers the grep itself: a regular
//! expression over each line of a text (or each item of a JSON list, by its JSON text), or a
//! JSONPath over the JSON document. The answer quotes the server's bytes for every matched
//! item and line, with its position in the whole result, and is paged under the client's
//! budget like any result.
//!
//! Bounds: the pattern and the path are limited in size, the compiled regex in memory (the
//! `regex` crate matches in linear time: no pattern can backtrack), a path in nesting (the
//! JSONPath parser recurses), and the matches kept in count. The search runs on the heavy-work
//! pool, never on the I/O threads.

use std::borrow::Cow;
use std::ops::Range;

use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::budget::Budget;
use crate::budget::auto::Searchable;
use crate::budget::cache::Cached;
use crate::budget::cursor::{self, CursorError, SelectionDigest};
use crate::budget::page::Position;
use crate::budget::raw;

/// The tool's name.
pub const TOOL: &str = "mcp_budget_search";
/// The longest pattern or path, in bytes.
pub const MAX_QUERY: usize = 1024;
/// The most memory a compiled pattern may take.
pub const MAX_REGEX_BYTES: usize = 1 << 20;
/// The deepest nesting of brackets and parentheses in a path.
pub const MAX_PATH_NESTING: usize = 16;
/// The most matches one search keeps (all are counted).
pub const MAX_MATCHES: usize = 10_000;
/// The most lines of context around a text match.
pub const MAX_CONTEXT: usize = 20;
/// Bytes of a page kept free for its notice and counts.
const ALLOWANCE: usize = 1200;

/// The tool's descriptor, as `tools/list` shows it.
pub fn descriptor() -> Value {
    json!({
        "name": TOOL,
        "description": "Search the whole of a result mcp-budget paged, without reading every page or running the tool again: pass the next_after of any page as cursor (or the call itself, as tool and arguments: it runs once), and a pattern (a regular expression, matched against each line of a text, or each item of a JSON list by its JSON text) or a path (a JSONPath over the JSON document). Answers the matching lines (with their numbers) or items (with their positions), exactly as the server wrote them.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "cursor": {"type": "string", "description": "The next_after of any page of the paged result to search."},
                "tool": {"type": "string", "description": "Instead of cursor: a tool to run and search."},
                "arguments": {"type": "object"},
                "pattern": {"type": "string", "description": "A regular expression (Rust regex syntax; (?i) for case-insensitive), matched against each line of a text, or each item of a JSON list by its JSON text."},
                "path": {"type": "string", "description": "A JSONPath over the JSON document, e.g. $.items[?(@.state == 'blocked')].id"},
                "context": {"type": "integer", "minimum": 0, "maximum": MAX_CONTEXT, "description": "Lines of context before and after each matching line of a text (default 0)."},
                "after": {"type": "string", "description": "The next_after of the previous page of this search's answer."}
            }
        },
        "annotations": {"readOnlyHint": true, "idempotentHint": true, "openWorldHint": false}
    })
}

/// What a search asks.
#[derive(Debug)]
pub struct Request {
    /// The chain to search: a page's cursor, or the call itself (its tool and arguments).
    cursor: Option<String>,
    call: Option<(String, Map<String, Value>)>,
    query: Query,
    context: usize,
    after: Option<String>,
}

#[derive(Debug)]
enum Query {
    Pattern(regex::Regex),
    Path(String),
}

impl Request {
    /// Reads the tool's arguments; an error is the text of a tool error that names the fix.
    pub fn read(arguments: &Map<String, Value>) -> Result<Request, String> {
        for key in arguments.keys() {
            if !matches!(
                key.as_str(),
                "cursor" | "tool" | "arguments" | "pattern" | "path" | "context" | "after"
            ) {
                return Err(format!(
                    "{TOOL} takes cursor (or tool and arguments), pattern, path, context and after; {key:?} is not one of them"
                ));
            }
        }
        let text = |name: &str| -> Result<Option<&str>, String> {
            match arguments.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.as_str())),
                Some(_) => Err(format!("{name} must be a string")),
            }
        };
        let cursor = text("cursor")?.map(String::from);
        let call = match (text("tool")?, arguments.get("arguments")) {
            (None, None) => None,
            (None, Some(_)) => return Err("arguments go with tool: pass the tool to run".into()),
            (Some(TOOL), _) => return Err(format!("tool may not be {TOOL} itself")),
            (Some(tool), None | Some(Value::Null)) => Some((tool.to_string(), Map::new())),
            (Some(tool), Some(Value::Object(arguments))) => {
                Some((tool.to_string(), arguments.clone()))
            }
            (Some(_), Some(_)) => return Err("arguments must be an object".into()),
        };
        match (&cursor, &call) {
            (Some(_), Some(_)) => {
                return Err("pass either cursor or tool and arguments, not both".into());
            }
            (None, None) => {
                return Err("pass cursor (the next_after of a page of the result to search), or the call itself as tool and arguments".into());
            }
            _ => {}
        }
        let query = match (text("pattern")?, text("path")?) {
            (Some(_), Some(_)) => {
                return Err("pass either pattern or path, not both".into());
            }
            (None, None) => {
                return Err("pass pattern (a regular expression) or path (a JSONPath)".into());
            }
            (Some(pattern), None) => Query::Pattern(compile(pattern)?),
            (None, Some(path)) => Query::Path(check_path(path)?.to_string()),
        };
        let context = match arguments.get("context") {
            None | Some(Value::Null) => 0,
            Some(value) => match value.as_u64() {
                Some(n) if n as usize <= MAX_CONTEXT => n as usize,
                _ => {
                    return Err(format!(
                        "context must be an integer between 0 and {MAX_CONTEXT}"
                    ));
                }
            },
        };
        let after = text("after")?.map(String::from);
        Ok(Request {
            cursor,
            call,
            query,
            context,
            after,
        })
    }

    /// The call to run and search (tool and arguments), when the search names no cursor.
    pub fn by_call(&self) -> Option<(&str, &Map<String, Value>)> {
        self.call
            .as_ref()
            .map(|(tool, arguments)| (tool.as_str(), arguments))
    }

    /// The digest this search's own cursors are minted for.
    fn digest(&self, chain: &SelectionDigest) -> SelectionDigest {
        let (kind, query) = match &self.query {
            Query::Pattern(regex) => ("pattern", regex.as_str()),
            Query::Path(path) => ("path", path.as_str()),
        };
        cursor::digest(&json!({
            "search": crate::wire::canonical::hex(chain),
            kind: query,
            "context": self.context,
        }))
    }
}

fn compile(pattern: &str) -> Result<regex::Regex, String> {
    if pattern.len() > MAX_QUERY {
        return Err(format!(
            "pattern is {} bytes, over the {MAX_QUERY}-byte limit: search for a shorter pattern",
            pattern.len()
        ));
    }
    regex::RegexBuilder::new(pattern)
        .size_limit(MAX_REGEX_BYTES)
        .dfa_size_limit(MAX_REGEX_BYTES * 2)
        .nest_limit(64)
        .build()
        .map_err(|err| match err {
            regex::Error::CompiledTooBig(_) => format!(
                "pattern compiles to more than {MAX_REGEX_BYTES} bytes (a large repetition such as {{1000}} does this): search for a simpler pattern"
            ),
            err => format!("pattern is not a valid regular expression: {err}"),
        })
}

fn check_path(path: &str) -> Result<&str, String> {
    if path.len() > MAX_QUERY {
        return Err(format!(
            "path is {} bytes, over the {MAX_QUERY}-byte limit: use a shorter JSONPath",
            path.len()
        ));
    }
    let mut depth = 0usize;
    let mut deepest = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in path.chars() {
        match (quote, c) {
            // An escape inside a string literal (`'\''`) never ends it.
            (Some(_), _) if escaped => escaped = false,
            (Some(_), '\\') => escaped = true,
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '[' | '{') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (None, ')' | ']' | '}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    if deepest > MAX_PATH_NESTING {
        return Err(format!(
            "path nests {deepest} levels of brackets, more than {MAX_PATH_NESTING}: use a simpler JSONPath"
        ));
    }
    // jsonpath-rust compiles a match()/search() regex for every node it tests, outside the
    // bounds a pattern has; `..*` lists every node of the document.
    let compact: String = path.chars().filter(|c| !c.is_whitespace()).collect();
    if compact.contains("match(") || compact.contains("search(") {
        return Err("path may not use match() or search(): search with pattern (a regular expression, bounded) instead, or a path with == comparisons".into());
    }
    if compact.contains("..*") || compact.contains("..[*]") {
        return Err("path may not select every node of the document (..*): name the field or list to look in, e.g. $..id or $.items[*]".into());
    }
    if !path.starts_with('$') {
        return Err("path must be a JSONPath starting with $, e.g. $.items[*].id".into());
    }
    Ok(path)
}

/// The chain a cursor belongs to (its digest), after checking its MAC.
pub fn chain_of(budget: &Budget, cursor: &str) -> Result<SelectionDigest, CursorError> {
    budget.key().open(cursor).map(|(_, digest)| digest)
}

/// One entry of an answer, written out.
struct Unit {
    json: String,
    /// A match (not a line of context).
    counts: bool,
}

/// What was searched, and what matched.
struct Found {
    searched: &'static str,
    /// Lines of the text, or items of the list (documents: 1).
    total: usize,
    total_matches: usize,
    units: Vec<Unit>,
}

/// Searches the cached result a request's cursor names, in `scope`, and writes the answer (the
/// `result` of the response): matches, or a tool error that says what to do.
pub fn answer(budget: &Budget, scope: u64, request: &Request) -> String {
    written(run(budget, scope, request))
}

/// What a search by call answers beside its matches: the chain's cursor (where the tool's
/// pages can follow it) and the whole result's reference.
#[derive(Debug, Default)]
pub struct Extras {
    pub cursor: Option<String>,
    pub reference: Option<String>,
}

/// Searches `cached`, the whole result of the chain `chain` (a search by call), and writes the
/// answer with `extras`.
pub fn answer_cached(
    budget: &Budget,
    cached: &Cached,
    chain: &SelectionDigest,
    request: &Request,
    extras: &Extras,
) -> String {
    written(searched(budget, cached, chain, request, extras))
}

fn written(answer: Result<String, String>) -> String {
    match answer {
        Ok(result) => result,
        Err(text) => {
            json!({"content": [{"type": "text", "text": text}], "isError": true}).to_string()
        }
    }
}

fn run(budget: &Budget, scope: u64, request: &Request) -> Result<String, String> {
    let cursor = request.cursor.as_deref().unwrap_or_default();
    let chain = chain_of(budget, cursor).map_err(|err| match err {
        CursorError::OtherKey => "cursor was issued by another mcp-budget instance, or before this proxy's cursor key changed; page the result again and search with a next_after of the new pages".to_string(),
        _ => "cursor is not a next_after this proxy issued (it is malformed or was altered): pass the next_after of a page of the result to search".to_string(),
    })?;
    let Some(cached) = budget.cache().get(scope, &chain) else {
        return Err(format!(
            "The result this cursor pages is no longer in mcp-budget's cache (results are kept {} seconds, within {} bytes, and only for the client that paged them): call the tool again to page its result, then search with a next_after of the new pages.",
            budget.cache().ttl().as_secs(),
            budget.cache().limit()
        ));
    };
    searched(budget, &cached, &chain, request, &Extras::default())
}

fn searched(
    budget: &Budget,
    cached: &Cached,
    chain: &SelectionDigest,
    request: &Request,
    extras: &Extras,
) -> Result<String, String> {
    let found = search(budget, cached, request)?;
    let digest = request.digest(chain);
    let start = match &request.after {
        None => 0,
        Some(after) => {
            let position = budget
                .key()
                .verify(after, &digest)
                .map_err(|_| "after is not the next_after of a previous page of this search (same cursor, pattern or path, and context): search again without after".to_string())?;
            if position.offset > found.units.len() {
                return Err("after points past this search's answer (the result changed): search again without after".into());
            }
            position.offset
        }
    };
    page(budget, &found, start, &digest, extras)
}

/// Writes the page of `found` from unit `start`, under the search tool's budget.
fn page(
    budget: &Budget,
    found: &Found,
    start: usize,
    digest: &SelectionDigest,
    extras: &Extras,
) -> Result<String, String> {
    let max = budget.page_max(TOOL);
    // The answer is in the text block and in structuredContent: each holds half.
    let mut room = (max.saturating_sub(ALLOWANCE) / 2).max(256);
    for _ in 0..12 {
        let mut used = 0;
        let mut end = start;
        while end < found.units.len() {
            let cost = found.units[end].json.len() + 1;
            if used + cost > room && end > start {
                break;
            }
            used += cost;
            end += 1;
        }
        if end == start + 1 && used > room {
            return Err(format!(
                "match {} alone is {} bytes, more than the whole {}: search with a path that selects a smaller part of it",
                start + 1,
                found.units[start].json.len(),
                budget.limits().byte_budget(max)
            ));
        }
        let result = write(budget, found, start, end, digest, extras);
        if budget.over(TOOL, result.as_bytes()).is_none() {
            return Ok(result);
        }
        room = room * 3 / 4;
        if room < 64 {
            break;
        }
    }
    Err(format!(
        "the answer cannot be made to fit the {}: search with a narrower pattern or path",
        budget.limits().byte_budget(max)
    ))
}

fn write(
    budget: &Budget,
    found: &Found,
    start: usize,
    end: usize,
    digest: &SelectionDigest,
    extras: &Extras,
) -> String {
    let next = (end < found.units.len()).then(|| {
        budget.key().mint(
            &Position {
                offset: end,
                key: None,
            },
            digest,
        )
    });
    let shown = found.units[start..end].iter().filter(|u| u.counts).count();
    let before = found.units[..start].iter().filter(|u| u.counts).count();
    let kept = found.units.iter().filter(|u| u.counts).count();
    let mut notice = if found.total_matches == 0 {
        format!("No match in the {} {}.", found.total, found.searched)
    } else if shown == 0 {
        "No match on this page.".to_string()
    } else {
        format!(
            "Matches {}-{} of {} in the {} {}.",
            before + 1,
            before + shown,
            found.total_matches,
            found.total,
            found.searched
        )
    };
    if kept < found.total_matches {
        notice.push_str(&format!(
            " Only the first {kept} matches are listed: search with a narrower pattern or path for the others."
        ));
    }
    if let Some(next) = &next {
        notice.push_str(&format!(
            " More matches remain: call {TOOL} again with the same arguments and after:\"{next}\"."
        ));
    }
    let mut body = String::new();
    body.push_str("{\"searched\":");
    body.push_str(&Value::from(found.searched).to_string());
    body.push_str(&format!(
        ",\"total\":{},\"total_matches\":{},\"matches\":[",
        found.total, found.total_matches
    ));
    for (n, unit) in found.units[start..end].iter().enumerate() {
        if n > 0 {
            body.push(',');
        }
        body.push_str(&unit.json);
    }
    body.push(']');
    if let Some(next) = &next {
        body.push_str(",\"next_after\":");
        body.push_str(&Value::from(next.as_str()).to_string());
    }
    if let Some(cursor) = &extras.cursor {
        notice.push_str(&format!(
            " The tool's whole result is kept: page it with after:\"{cursor}\", or search it again with this cursor."
        ));
        body.push_str(",\"cursor\":");
        body.push_str(&Value::from(cursor.as_str()).to_string());
    }
    if let Some(reference) = &extras.reference {
        notice.push(' ');
        notice.push_str(&crate::budget::reference::sentence(reference));
        body.push_str(",\"result_ref\":");
        body.push_str(&Value::from(reference.as_str()).to_string());
    }
    body.push_str(",\"notice\":");
    body.push_str(&Value::from(notice).to_string());
    body.push('}');
    format!(
        "{{\"content\":[{{\"type\":\"text\",\"text\":{}}}],\"structuredContent\":{body}}}",
        Value::from(body.as_str())
    )
}

/// The text or document a cached result offers a search.
enum Subject<'a> {
    Lines(Cow<'a, str>),
    Json {
        doc: Cow<'a, str>,
        /// The list paged in it (element ranges in `doc`), when there is one.
        elements: Option<Vec<Range<usize>>>,
    },
}

/// `elements`: the list's items are wanted (a pattern matches them); a path needs only the
/// document.
fn subject<'a>(budget: &Budget, cached: &'a Cached, elements: bool) -> Option<Subject<'a>> {
    match cached {
        Cached::Auto(prepared) => match prepared.searchable()? {
            Searchable::Lines(inner) => {
                let text: String = serde_json::from_str(&format!("\"{inner}\"")).ok()?;
                Some(Subject::Lines(Cow::Owned(text)))
            }
            Searchable::Items { doc, elements } => Some(Subject::Json {
                doc: Cow::Borrowed(doc),
                elements: Some(elements.to_vec()),
            }),
        },
        Cached::Rule(entry) => {
            if let Some(text) = entry.text() {
                return Some(Subject::Lines(Cow::Borrowed(text)));
            }
            let steps = entry
                .tool()
                .and_then(|tool| budget.policy().rule_for(tool))
                .and_then(|rule| rule.items.as_ref())
                .and_then(|items| plain_steps(&items.path_text));
            // The document the rule's list is in: structuredContent when the list is there, else
            // the JSON of the text (the pipeline looks in the same order).
            let structured = entry.structured();
            let listed =
                structured.and_then(|doc| raw::array_at(doc, steps.as_deref()?).map(|a| (doc, a)));
            let (doc, array) = match listed {
                Some((doc, array)) => (Cow::Borrowed(doc), Some(array)),
                None => {
                    let from_text = || text_document(entry.raw());
                    let from_structured = || structured.map(Cow::Borrowed);
                    // With a rule, its list was not in structuredContent: the text first.
                    let doc = match steps {
                        Some(_) => from_text().or_else(from_structured),
                        None => from_structured().or_else(from_text),
                    }?;
                    let array = steps
                        .as_deref()
                        .and_then(|steps| raw::array_at(&doc, steps));
                    (doc, array)
                }
            };
            if !elements {
                return Some(Subject::Json {
                    doc,
                    elements: None,
                });
            }
            let elements = array
                .or_else(|| raw::largest_array(&doc, usize::MAX))
                .map(|array| array.elements);
            Some(Subject::Json { doc, elements })
        }
    }
}

/// The JSON of the first text block that holds JSON.
fn text_document(result: &str) -> Option<Cow<'_, str>> {
    let members = raw::members(result)?;
    let (_, content) = members.iter().rev().find(|(k, _)| k == "content")?;
    let blocks: Vec<Value> = serde_json::from_str(&result[content.clone()]).ok()?;
    blocks.into_iter().find_map(|block| {
        let text = block.get("text")?.as_str()?;
        let trimmed = text.trim_start();
        (trimmed.starts_with('{') || trimmed.starts_with('['))
            .then(|| serde_json::from_str::<&RawValue>(text).is_ok())
            .filter(|ok| *ok)
            .map(|_| Cow::Owned(text.to_string()))
    })
}

fn plain_steps(path: &str) -> Option<Vec<raw::Step>> {
    let rest = path.strip_prefix('$')?;
    if rest.is_empty() {
        return Some(Vec::new());
    }
    rest.strip_prefix('.')?
        .split('.')
        .map(|step| (!step.is_empty()).then(|| raw::Step::Key(step.to_string())))
        .collect()
}

fn search(budget: &Budget, cached: &Cached, request: &Request) -> Result<Found, String> {
    let wants_items = matches!(request.query, Query::Pattern(_));
    let subject = subject(budget, cached, wants_items).ok_or_else(|| {
        "this result holds neither text nor a JSON document to search (an image or a resource, say)".to_string()
    })?;
    match (&request.query, subject) {
        (Query::Pattern(regex), Subject::Lines(text)) => {
            lines(regex, &text, request.context, Clock::start())
        }
        (Query::Pattern(regex), Subject::Json { doc, elements }) => match elements {
            Some(elements) => items(regex, &doc, &elements, Clock::start()),
            None => lines(regex, &doc, request.context, Clock::start()),
        },
        (Query::Path(_), Subject::Lines(_)) => Err(
            "this result is text, not JSON: search it with pattern (a regular expression) instead of path".into(),
        ),
        (Query::Path(path), Subject::Json { doc, .. }) => json_path(path, &doc),
    }
}

/// The most time a pattern may run over a result, on the heavy-work pool: a regular expression
/// runs in time linear in the text, but a large compiled pattern over a large text is still
/// long, and the pool's threads are shared by every session.
pub const MAX_SEARCH_TIME: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a search has run, checked every [`Clock::EVERY`] lines or items.
struct Clock {
    started: std::time::Instant,
    limit: std::time::Duration,
}

impl Clock {
    const EVERY: usize = 256;

    fn start() -> Clock {
        Clock::with_limit(MAX_SEARCH_TIME)
    }

    fn with_limit(limit: std::time::Duration) -> Clock {
        Clock {
            started: std::time::Instant::now(),
            limit,
        }
    }

    /// An error once the search has run past its limit (read at every [`Clock::EVERY`]th unit).
    fn check(&self, unit: usize, searched: usize, of: usize) -> Result<(), String> {
        if !unit.is_multiple_of(Clock::EVERY) || self.started.elapsed() <= self.limit {
            return Ok(());
        }
        Err(format!(
            "the pattern ran for more than {} s over this result and was stopped after {searched} of {of} lines or items: search with a simpler pattern (fewer alternatives and repetitions), or a path",
            self.limit.as_secs()
        ))
    }
}

fn lines(regex: &regex::Regex, text: &str, context: usize, clock: Clock) -> Result<Found, String> {
    let mut starts = vec![0];
    starts.extend(memchr::memchr_iter(b'\n', text.as_bytes()).map(|n| n + 1));
    if starts.last() == Some(&text.len()) && !text.is_empty() {
        starts.pop(); // a final newline ends the last line; it starts none
    }
    let last_end = text.strip_suffix('\n').map_or(text.len(), str::len);
    let line = |i: usize| {
        let end = starts.get(i + 1).map_or(last_end, |&s| s - 1);
        &text[starts[i]..end]
    };
    let mut matched = Vec::new();
    let mut total_matches = 0;
    for i in 0..starts.len() {
        clock.check(i, i, starts.len())?;
        if regex.is_match(line(i)) {
            total_matches += 1;
            if matched.len() < MAX_MATCHES {
                matched.push(i);
            }
        }
    }
    // Each line is written once: a match's context runs into the next match's.
    let mut units = Vec::new();
    let mut next_line = 0;
    for &i in &matched {
        let from = i.saturating_sub(context).max(next_line);
        let to = (i + context + 1).min(starts.len());
        for j in from..to {
            let is_match = j == i || regex.is_match(line(j));
            let mut entry = Map::new();
            entry.insert("line".into(), (j + 1).into());
            entry.insert("text".into(), line(j).into());
            if !is_match {
                entry.insert("context".into(), true.into());
            }
            units.push(Unit {
                json: Value::Object(entry).to_string(),
                counts: is_match,
            });
        }
        next_line = next_line.max(to);
    }
    Ok(Found {
        searched: "lines",
        total: starts.len(),
        total_matches,
        units,
    })
}

fn items(
    regex: &regex::Regex,
    doc: &str,
    elements: &[Range<usize>],
    clock: Clock,
) -> Result<Found, String> {
    let mut units = Vec::new();
    let mut total_matches = 0;
    for (i, element) in elements.iter().enumerate() {
        clock.check(i, i, elements.len())?;
        let item = &doc[element.clone()];
        if regex.is_match(item) {
            total_matches += 1;
            if units.len() < MAX_MATCHES {
                units.push(Unit {
                    json: format!("{{\"index\":{i},\"item\":{item}}}"),
                    counts: true,
                });
            }
        }
    }
    Ok(Found {
        searched: "items",
        total: elements.len(),
        total_matches,
        units,
    })
}

/// The most nodes a JSONPath may select along the way (every segment's node set added up,
/// filters' own reads included). A path is bounded by what it does, not by its text: 89 bytes
/// of nested wildcards, or a union of one index a thousand times, select millions.
pub const MAX_NODES: usize = 200_000;

/// Refuses a path that would select more than [`MAX_NODES`] nodes on `doc`, before it runs:
/// the node sets are counted (as references into the document, nothing copied), segment by
/// segment, stopping at the bound.
fn bound_path(path: &str, doc: &Value) -> Result<(), String> {
    use jsonpath_rust::parser::model::{Segment, Selector};
    let query = jsonpath_rust::parser::parse_json_path(path)
        .map_err(|err| format!("path is not a JSONPath this proxy can evaluate: {err}"))?;
    let over = || {
        format!(
            "path selects more than {MAX_NODES} nodes on the way to its matches (wildcards, unions or .. multiply them): name the list and fields to look in, e.g. $.items[*].id, or search with pattern"
        )
    };
    let mut visited = 0usize;
    let mut charge = |n: usize| -> Result<(), String> {
        visited = visited.saturating_add(n);
        if visited > MAX_NODES {
            Err(over())
        } else {
            Ok(())
        }
    };
    fn children(value: &Value) -> Box<dyn Iterator<Item = &Value> + '_> {
        match value {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => Box::new(std::iter::empty()),
        }
    }
    fn subtree(value: &Value) -> usize {
        1 + children(value).map(subtree).sum::<usize>()
    }
    // What one selector picks from one node (a filter: every child, its own reads charged).
    fn select<'v>(
        selector: &Selector,
        node: &'v Value,
        out: &mut Vec<&'v Value>,
        charge: &mut dyn FnMut(usize) -> Result<(), String>,
    ) -> Result<(), String> {
        let before = out.len();
        match selector {
            Selector::Name(name) => out.extend(node.get(name.as_str())),
            Selector::Index(i) => {
                if let Value::Array(items) = node {
                    let at = if *i < 0 { items.len() as i64 + i } else { *i };
                    out.extend(usize::try_from(at).ok().and_then(|at| items.get(at)));
                }
            }
            Selector::Wildcard | Selector::Slice(..) => out.extend(children(node)),
            Selector::Filter(filter) => {
                // Each query in the filter reads at most a child's subtree (a .. inside one
                // could read it again for every node: refused).
                let text = filter.to_string();
                if text.contains("..") {
                    return Err("path may not use .. inside a filter: name the field the filter compares, e.g. $.items[?@.state == 'open']".into());
                }
                let queries = text.matches(['@', '$']).count().max(1);
                // A query of names and indices reads one node a step; one with a wildcard, a
                // slice or a union may read the child's whole subtree.
                let fans_out = text.contains(['*', ':', ',']);
                let steps = text.matches(['.', '[']).count().max(1);
                for child in children(node) {
                    let reads = if fans_out { subtree(child) } else { steps };
                    charge(reads.saturating_mul(queries))?;
                    out.push(child);
                }
            }
        }
        charge(out.len() - before)
    }
    fn apply<'v>(
        segment: &Segment,
        nodes: &[&'v Value],
        charge: &mut dyn FnMut(usize) -> Result<(), String>,
    ) -> Result<Vec<&'v Value>, String> {
        let mut out = Vec::new();
        match segment {
            Segment::Selector(selector) => {
                for node in nodes {
                    select(selector, node, &mut out, charge)?;
                }
            }
            Segment::Selectors(selectors) => {
                for node in nodes {
                    for selector in selectors {
                        select(selector, node, &mut out, charge)?;
                    }
                }
            }
            Segment::Descendant(inner) => {
                // Every node under each (itself included), then the inner segment on each.
                let mut all = Vec::new();
                for node in nodes {
                    let mut stack = vec![*node];
                    while let Some(next) = stack.pop() {
                        charge(1)?;
                        all.push(next);
                        stack.extend(children(next));
                    }
                }
                out = apply(inner, &all, charge)?;
            }
        }
        Ok(out)
    }
    let mut nodes = vec![doc];
    for step in &query.segments {
        nodes = apply(step, &nodes, &mut charge)?;
    }
    Ok(())
}

/// The most values a JSON document may hold for a JSONPath to run over it: a path reads the
/// document as a tree, which takes memory by the value (some 100 bytes each, a few hundred
/// MiB for millions), whatever the path selects. A pattern reads the document's own text, item
/// by item, and has no such bound.
pub const MAX_PATH_VALUES: usize = 500_000;

/// How many values `doc` (valid JSON) holds, up to `limit`: one for each scalar, array and
/// object, counted by the commas and brackets outside its strings (a container's first value,
/// then one a comma), without reading it into a tree.
fn values_in(doc: &str, limit: usize) -> usize {
    let bytes = doc.as_bytes();
    let mut count = 1;
    let mut at = 0;
    while at < bytes.len() && count <= limit {
        match bytes[at] {
            b'"' => {
                // Past the string: its closing quote is the first one not escaped.
                at += 1;
                while let Some(stop) = memchr::memchr2(b'"', b'\\', &bytes[at.min(bytes.len())..]) {
                    at += stop;
                    if bytes[at] == b'"' {
                        break;
                    }
                    at += 2;
                }
            }
            b',' => count += 1,
            // A container's first value (an empty one has none).
            b'[' | b'{' => {
                let next = bytes[at + 1..].iter().find(|b| !b.is_ascii_whitespace());
                if !matches!(next, Some(b']' | b'}')) {
                    count += 1;
                }
            }
            _ => {}
        }
        at += 1;
    }
    count
}

fn json_path(path: &str, doc: &str) -> Result<Found, String> {
    if values_in(doc, MAX_PATH_VALUES) > MAX_PATH_VALUES {
        return Err(format!(
            "this result's JSON document holds more than {MAX_PATH_VALUES} values, more than a path may read as a tree: search it with pattern instead (a regular expression, matched against each item of its list), or call the tool again with arguments that select less"
        ));
    }
    let value: Value = serde_json::from_str(doc).map_err(|err| {
        format!(
            "the result's JSON document could not be read ({err}): search it with pattern instead"
        )
    })?;
    bound_path(path, &value)?;
    let found = jsonpath_rust::query::js_path(path, &value)
        .map_err(|err| format!("path is not a JSONPath this proxy can evaluate: {err}"))?;
    let total_matches = found.len();
    let mut resolver = Resolver::new(doc);
    let units = found
        .into_iter()
        .take(MAX_MATCHES)
        .map(|hit| {
            // The server's bytes for the value, where its path can be followed in the text.
            let exact = resolver
                .resolve(&hit.path)
                .filter(|text| serde_json::from_str::<Value>(text).ok().as_ref() == Some(hit.val));
            let value = exact.map_or_else(|| hit.val.to_string(), str::to_string);
            Unit {
                json: format!(
                    "{{\"path\":{},\"value\":{value}}}",
                    Value::from(hit.path.as_str())
                ),
                counts: true,
            }
        })
        .collect();
    Ok(Found {
        searched: "document",
        total: 1,
        total_matches,
        units,
    })
}

/// Follows normalized paths (`$['a'][3]['b']`) in the server's text of a document, reading each
/// object's members and each list's elements once for all the paths that pass through it.
struct Resolver<'d> {
    doc: &'d str,
    members: std::collections::HashMap<usize, Vec<(String, Range<usize>)>>,
    elements: std::collections::HashMap<usize, Vec<Range<usize>>>,
}

impl<'d> Resolver<'d> {
    fn new(doc: &'d str) -> Resolver<'d> {
        Resolver {
            doc,
            members: Default::default(),
            elements: Default::default(),
        }
    }

    /// The text of the value at `path`, if the path can be followed.
    fn resolve(&mut self, path: &str) -> Option<&'d str> {
        let doc = self.doc;
        let mut rest = path.strip_prefix('$')?;
        let start = raw::skip_ws(doc, 0);
        let mut at = start..doc.trim_end().len();
        while !rest.is_empty() {
            let inner = &doc[at.clone()];
            if let Some(key_part) = rest.strip_prefix("['") {
                let close = key_part.find("']")?;
                let key = &key_part[..close];
                rest = &key_part[close + 2..];
                let members = match self.members.entry(at.start) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => e.insert(raw::members(inner)?),
                };
                let (_, range) = members.iter().rev().find(|(k, _)| k == key)?;
                at = at.start + range.start..at.start + range.end;
            } else if let Some(index_part) = rest.strip_prefix('[') {
                let close = index_part.find(']')?;
                let index: usize = index_part[..close].parse().ok()?;
                rest = &index_part[close + 1..];
                let elements = match self.elements.entry(at.start) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => e.insert(raw::elements(inner)?),
                };
                let range = elements.get(index)?;
                at = at.start + range.start..at.start + range.end;
            } else {
                return None;
            }
        }
        Some(&doc[at])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regex(p: &str) -> regex::Regex {
        compile(p).expect("compiles")
    }

    #[test]
    fn lines_with_context_are_grep_dash_n_dash_c() {
        let text = "a\nerror one\nb\nc\nd\nerror two\nerror three\ne\n";
        let found = lines(&regex("error"), text, 1, Clock::start()).unwrap();
        let got: Vec<(u64, bool)> = found
            .units
            .iter()
            .map(|u| {
                let v: Value = serde_json::from_str(&u.json).unwrap();
                (v["line"].as_u64().unwrap(), u.counts)
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (1, false),
                (2, true),
                (3, false),
                (5, false),
                (6, true),
                (7, true),
                (8, false)
            ]
        );
        assert_eq!(found.total_matches, 3);
        assert_eq!(found.total, 8);
    }

    #[test]
    fn items_are_quoted_as_the_server_wrote_them() {
        let doc = r#"{"xs":[{"a":1e3,"s":"\u00e9"},{"a":2},{"a":"x1"}]}"#;
        let array = raw::array_at(doc, &[raw::Step::Key("xs".into())]).unwrap();
        let found = items(&regex("1"), doc, &array.elements, Clock::start()).unwrap();
        assert_eq!(found.total_matches, 2);
        assert_eq!(
            found.units[0].json,
            r#"{"index":0,"item":{"a":1e3,"s":"\u00e9"}}"#
        );
        let found = json_path("$.xs[?(@.a == 2)]", doc).unwrap();
        assert_eq!(
            found.units[0].json,
            r#"{"path":"$['xs'][1]","value":{"a":2}}"#
        );
        let found = json_path("$.xs[0].s", doc).unwrap();
        assert_eq!(
            found.units[0].json,
            r#"{"path":"$['xs'][0]['s']","value":"\u00e9"}"#
        );
    }

    #[test]
    fn costly_queries_are_refused() {
        assert!(compile(&"a".repeat(MAX_QUERY + 1)).is_err());
        let err = compile(r"(\w{100}){100}").unwrap_err();
        assert!(err.contains("simpler pattern"), "{err}");
        let deep = format!("$.{}a{}", "[?(".repeat(20), ")]".repeat(20));
        assert!(check_path(&deep).unwrap_err().contains("nests"));
        // An escaped quote does not hide the brackets after it.
        let hidden = format!(
            "$[?(@.a=='\\'' && {}@.b{})]",
            "(".repeat(30),
            ")".repeat(30)
        );
        assert!(
            check_path(&hidden).unwrap_err().contains("nests"),
            "{hidden}"
        );
        assert!(
            check_path("$..[?search(@.a, 'x+')]")
                .unwrap_err()
                .contains("pattern")
        );
        assert!(check_path("$..*").is_err());
        assert!(check_path("$.streams[?(@.state == 'blocked')].stream_id").is_ok());
        // Linear time: the classic catastrophic pattern is just a pattern.
        let long = "a".repeat(100_000) + "!";
        let found = lines(&regex("(a+)+$"), &long, 0, Clock::start()).unwrap();
        assert_eq!(found.total_matches, 0);
    }

    /// A path is bounded by the nodes it selects, not by its text: nested wildcards and a union
    /// of one index repeated are refused before they run, a plain path over a large list runs.
    #[test]
    fn paths_are_bounded_by_the_nodes_they_select() {
        let items: Vec<Value> = (0..20_000)
            .map(|n| serde_json::json!({"id": n, "tags": [[1, 2], [3, 4], [5, 6]], "name": format!("item {n}")}))
            .collect();
        let doc = serde_json::json!({"items": items});
        bound_path("$.items[*].id", &doc).unwrap();
        assert!(bound_path("$.items[?@.id == 7].name", &doc).is_ok());
        let nested = format!("$.items[*]{}", "[*]".repeat(20));
        assert!(bound_path(&nested, &doc).is_err());
        let union = format!("$.items[*].tags[{}]", vec!["0"; 400].join(","));
        let err = bound_path(&union, &doc).unwrap_err();
        assert!(
            err.contains(&format!("more than {MAX_NODES} nodes")),
            "{err}"
        );
        let wide = "$.items[*].tags[*][*,*,*,*,*,*]";
        assert!(bound_path(wide, &doc).is_err());
        let descendant = "$..tags..*";
        assert!(bound_path(descendant, &doc).is_err());
        let err = bound_path("$.items[?@..id]", &doc).unwrap_err();
        assert!(err.contains("inside a filter"), "{err}");
        // The whole search refuses it with the same words, and never builds the matches.
        let text = doc.to_string();
        let Err(err) = json_path(&union, &text) else {
            panic!("the union ran")
        };
        assert!(err.contains("name the list and fields"), "{err}");
    }

    /// A pattern that runs past its time is stopped with an error that names the limit and a
    /// way out; within it, the same search answers.
    #[test]
    fn a_search_past_its_time_is_stopped_with_a_way_out() {
        let text = "line\n".repeat(1000);
        let Err(err) = lines(
            &regex("l"),
            &text,
            0,
            Clock::with_limit(std::time::Duration::ZERO),
        ) else {
            panic!("a search past its time answered");
        };
        assert!(err.contains("more than 0 s"), "{err}");
        assert!(err.contains("simpler pattern"), "{err}");
        let found = lines(&regex("l"), &text, 0, Clock::start()).unwrap();
        assert_eq!(found.total_matches, 1000);
    }

    /// A document's values are counted by its text, strings skipped (their commas and
    /// brackets, escaped quotes included, are not values).
    #[test]
    fn values_are_counted_without_reading_a_tree() {
        assert_eq!(values_in("1", 10), 1);
        assert_eq!(values_in(r#"{"a":[1,2,{"b":"x,[{\"y"}]}"#, 100), 6);
        assert_eq!(values_in(r#"["a\\",",",3]"#, 100), 4);
        assert_eq!(values_in("[[],{ },[ ]]", 100), 4);
        let many = format!("[{}]", vec!["0"; 1000].join(","));
        assert!(values_in(&many, 100) > 100);
        assert_eq!(values_in(&many, 10_000), 1001);
    }
}
