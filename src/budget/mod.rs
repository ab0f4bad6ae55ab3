//! The budget: a policy applied to `tools/list` descriptors and `tools/call` calls.
//!
//! The stages are pure, synchronous functions over `serde_json::Value` (no I/O), one module
//! each, run in this order on a result (contract §3):
//! items → total_count → [`horizon`] → [`filter`] → [`page`] → [`project`] → [`render`] →
//! [`cap`]. `pipeline` wires them together (and `place` finds the items in a result and puts
//! the page back); before it, [`reduce`] runs the horizon, the filters and the page on a list
//! in `structuredContent` or in a text block's JSON where it lies in the server's text, reading
//! each item only for the fields they need, so that the pipeline parses and renders the page
//! alone. [`text`] pages text by lines. [`args`] reads and strips the budget
//! arguments of a call, [`cursor`] mints and verifies `next_after`, [`notice`] words what a
//! default narrowed, and [`descriptor`] rewrites `tools/list`. This file is the [`Budget`]
//! that a relay calls: plan a call, finish its result, refuse it.
//!
//! Every chain is served from the per-session [`cache`]: the intercept keeps the
//! upstream result of a rule's first page ([`chain`], with a text rule's line index) and of an
//! automatic page ([`auto`]), so a tool runs once per chain; when the entry is gone, a read-only
//! or idempotent tool is called again with the same upstream arguments (any proxy instance that
//! shares the cursor key can serve the next page so). [`exact`] writes
//! every page with the server's own bytes where a value is unchanged.

pub mod args;
mod at;
pub mod auto;
pub mod cache;
pub mod cap;
pub mod chain;
pub mod continuation;
pub mod cursor;
pub mod descriptor;
mod escaped;
pub mod exact;
pub mod field;
pub mod filter;
mod finish;
pub mod horizon;
pub mod notice;
pub mod page;
mod pipeline;
mod place;
pub mod project;
pub mod raw;
pub mod reduce;
pub mod reference;
pub mod render;
pub mod text;

use jsonpath_rust::query::queryable::Queryable;
use serde_json::{Map, Value, json};

use std::sync::Arc;

use crate::client::{Limits, Profile};
use crate::policy::{Policy, Rule};
use args::{ArgError, CallArgs};
use cursor::CursorKey;
use render::RenderError;

/// A policy, ready to apply.
#[derive(Debug)]
pub struct Budget {
    policy: Policy,
    key: CursorKey,
    /// Upstream results of paged calls, for their next pages (all sessions, scoped).
    cache: Arc<cache::ResultCache>,
    /// Tools whose rule's `items` matched nothing, already warned about.
    unmatched: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    /// What a result is held to: the policy's cap, or the client's profile.
    limits: Limits,
    /// How each session's budget is chosen.
    choice: Arc<Choice>,
    /// Large item lists are narrowed where they lie ([`reduce`]); off: results are read whole.
    reduce: bool,
}

/// How a session's budget is chosen from what its `initialize` says (see
/// [`crate::intercept::Interceptor`]).
#[derive(Debug)]
pub struct Choice {
    /// The client profiles in force (built-in, and the policy's sections).
    pub profiles: Vec<Profile>,
    /// `--client`: this profile, whatever the client says.
    pub forced: Option<Profile>,
    /// No `--policy`: the built-in policy written for the server, by its `serverInfo.name`.
    pub pick_policy: bool,
    /// Fit the budget to the client (off where results must pass as recorded).
    pub fit_clients: bool,
}

/// What the response hook needs to know about one call.
#[derive(Debug, Clone)]
pub struct CallPlan {
    pub tool: String,
    /// What the policy does with the call.
    governed: Governed,
}

/// What the policy does with one call.
#[derive(Debug, Clone)]
enum Governed {
    /// No rule names the tool.
    Unruled,
    /// A rule names it (by its index in the policy) and caps its results.
    Capped { rule: usize },
    /// A rule pages its results, as the call's arguments say.
    Paged { rule: usize, paging: Paging },
}

/// How one call's result is paged.
#[derive(Debug, Clone)]
enum Paging {
    Items(CallArgs),
    Text(args::TextArgs),
}

impl CallPlan {
    /// Whether the call's result goes through the paging pipeline.
    pub fn is_paged(&self) -> bool {
        matches!(self.governed, Governed::Paged { .. })
    }

    /// The plan of an items rule whose pages name `reference` (the whole result's): `None` for
    /// any other plan, or no reference.
    pub fn naming(&self, reference: Option<&str>) -> Option<CallPlan> {
        let Governed::Paged {
            rule,
            paging: Paging::Items(args),
        } = &self.governed
        else {
            return None;
        };
        let args = CallArgs {
            reference: Some(reference?.to_string()),
            ..args.clone()
        };
        Some(CallPlan {
            tool: self.tool.clone(),
            governed: Governed::Paged {
                rule: *rule,
                paging: Paging::Items(args),
            },
        })
    }
}

impl Budget {
    /// With a random cursor key (where cursors need not outlive the process: `check`,
    /// `explain`, tests). The proxy itself takes its key from the policy's variable or the key
    /// file (the binary's `cursor_key`) and uses [`Budget::with_key`].
    pub fn new(policy: Policy) -> Budget {
        Budget::with_key(policy, CursorKey::random())
    }

    /// With a fixed cursor key (tests, benchmarks, replay).
    pub fn with_key(policy: Policy, key: CursorKey) -> Budget {
        let cache = cache::ResultCache::new(policy.cache_bytes, policy.cache_ttl);
        Budget {
            limits: Limits::bytes_only(policy.max_bytes),
            choice: Arc::new(Choice {
                profiles: crate::client::profiles(&policy.clients),
                forced: None,
                pick_policy: false,
                fit_clients: true,
            }),
            policy,
            key,
            cache: Arc::new(cache),
            unmatched: Default::default(),
            reduce: true,
        }
    }

    /// This budget reading every result whole (no [`reduce`]): the same pages, more slowly;
    /// for tests and benchmarks that compare the two.
    pub fn reading_whole(mut self) -> Budget {
        self.reduce = false;
        self
    }

    /// How sessions choose their budget: `client` forces a profile (`--client`; an error names
    /// the known ones), `pick_policy` picks the built-in policy written for the server when no
    /// policy was given, and `fit_clients` turns client profiles on.
    pub fn choosing(
        mut self,
        client: Option<&str>,
        pick_policy: bool,
        fit_clients: bool,
    ) -> Result<Budget, String> {
        let profiles = crate::client::profiles(&self.policy.clients);
        let forced = match client {
            Some(name) => Some(
                crate::client::find(&profiles, name)
                    .ok_or_else(|| crate::client::unknown(name, &profiles))?,
            ),
            None => None,
        };
        self.choice = Arc::new(Choice {
            profiles,
            forced,
            pick_policy,
            fit_clients,
        });
        Ok(self)
    }

    /// This budget under a reloaded `policy`: the cursor key, the result cache and how
    /// sessions choose their budget carry over (a forced client is looked up again, in the new
    /// policy's profiles).
    pub fn reloaded(&self, policy: Policy) -> Result<Budget, String> {
        let forced = self.choice.forced.as_ref().map(|p| p.name.clone());
        let budget = Budget {
            limits: Limits::bytes_only(policy.max_bytes),
            policy,
            key: self.key.clone(),
            cache: self.cache.clone(),
            unmatched: self.unmatched.clone(),
            choice: self.choice.clone(),
            reduce: self.reduce,
        };
        budget.choosing(
            forced.as_deref(),
            self.choice.pick_policy,
            self.choice.fit_clients,
        )
    }

    /// How sessions choose their budget.
    pub fn choice(&self) -> &Choice {
        &self.choice
    }

    /// This budget for one session: under `policy` instead of its own when one was chosen for
    /// the session's server, and fitted to the session's client `profile`. The cursor key and
    /// the result cache stay shared.
    ///
    /// A profile lowers the byte cap to what the client shows in full (the policy's cap stays
    /// the ceiling), adds its token and line budgets, and lowers text page sizes and default
    /// item limits to its own.
    pub fn for_session(&self, policy: Option<&Policy>, profile: Option<&Profile>) -> Budget {
        let mut policy = policy.unwrap_or(&self.policy).clone();
        let mut limits = Limits::bytes_only(policy.max_bytes);
        if let Some(profile) = profile {
            limits = Limits {
                bytes: profile.max_bytes.min(policy.max_bytes),
                tokens: profile.max_tokens,
                lines: profile.max_lines,
                allowance: profile
                    .allowance_up_to
                    .map(|most| policy.max_result_size_chars.min(most).min(policy.max_bytes)),
                page_bytes: profile.page_bytes,
                profile: Some(profile.name.as_str().into()),
                reads: profile.reads,
            };
            policy.max_bytes = limits.bytes;
            // A text page leaves room for its notice under the cap.
            let page = profile.page_bytes.unwrap_or(limits.bytes * 4 / 5);
            for rule in &mut policy.rules {
                if let Some(text) = &mut rule.text {
                    text.page_bytes = text.page_bytes.min(page);
                }
                if let (Some(items), Some(limit)) = (&mut rule.items, profile.default_limit) {
                    items.default_limit = items.default_limit.min(limit);
                }
            }
        }
        Budget {
            policy,
            key: self.key.clone(),
            cache: self.cache.clone(),
            unmatched: self.unmatched.clone(),
            limits,
            choice: self.choice.clone(),
            reduce: self.reduce,
        }
    }

    /// The largest automatic page of `tool`'s results.
    pub fn page_max(&self, tool: &str) -> usize {
        self.page_max_with(self.policy.rule_for(tool))
    }

    /// [`Budget::page_max`], for the tool of a planned call (its rule resolved in the plan).
    pub fn page_max_in(&self, plan: &CallPlan) -> usize {
        self.page_max_with(self.rule_in(plan))
    }

    fn page_max_with(&self, rule: Option<&Rule>) -> usize {
        let cap = self.limits.bytes_for(rule.is_some());
        self.limits.page_bytes.map_or(cap, |page| page.min(cap))
    }

    /// The most text of one page, where the automatic pager serves a text rule (a JSON
    /// document in its text): the rule's page size, which bounds each copy of the text (in
    /// `content`, and in `structuredContent` where the server repeats it there).
    pub fn text_page(&self, tool: &str) -> Option<usize> {
        text_page_with(self.policy.rule_for(tool))
    }

    /// [`Budget::text_page`], for the tool of a planned call.
    pub fn text_page_in(&self, plan: &CallPlan) -> Option<usize> {
        text_page_with(self.rule_in(plan))
    }

    /// Whether a result of `tool` passes whole: within the budget (and, for a text rule's
    /// tool, small enough to be one page of its text).
    pub fn fits_whole(&self, tool: &str, result: &str) -> bool {
        self.fits_whole_with(self.policy.rule_for(tool), result)
    }

    /// [`Budget::fits_whole`], for the result of a planned call.
    pub fn fits_whole_in(&self, plan: &CallPlan, result: &str) -> bool {
        self.fits_whole_with(self.rule_in(plan), result)
    }

    fn fits_whole_with(&self, rule: Option<&Rule>, result: &str) -> bool {
        let cap = self.limits.bytes_for(rule.is_some());
        self.over_cap(cap, result.as_bytes()).is_none()
            && cap::read_bytes(self.limits.reads, result) <= self.page_max_with(rule)
            && text_page_with(rule).is_none_or(|page| result.len() <= page)
    }

    /// The rule a planned call's tool has, as the plan resolved it.
    fn rule_in(&self, plan: &CallPlan) -> Option<&Rule> {
        match plan.governed {
            Governed::Unruled => None,
            Governed::Capped { rule } | Governed::Paged { rule, .. } => self.policy.rules.get(rule),
        }
    }

    /// What a result is held to.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The byte cap of `tool`'s results: the allowance the proxy declares on the tools a rule
    /// budgets (for a client that honours it), else the session's cap.
    pub fn cap_for(&self, tool: &str) -> usize {
        self.limits.bytes_for(self.policy.rule_for(tool).is_some())
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn key(&self) -> &CursorKey {
        &self.key
    }

    pub fn cache(&self) -> &cache::ResultCache {
        &self.cache
    }

    /// Whether automatic paging applies to `tool`: no rule pages it, and `auto` is on.
    pub fn auto_for(&self, tool: &str) -> bool {
        self.auto_with(self.policy.rule_for(tool))
    }

    /// [`Budget::auto_for`], for the tool of a planned call.
    pub fn auto_in(&self, plan: &CallPlan) -> bool {
        self.auto_with(self.rule_in(plan))
    }

    fn auto_with(&self, rule: Option<&Rule>) -> bool {
        match rule {
            None => self.policy.auto,
            Some(rule) => rule.auto && rule.items.is_none() && rule.text.is_none(),
        }
    }

    /// Whether the policy declares `tool` safe to call again for a page.
    pub fn idempotent(&self, tool: &str) -> bool {
        self.policy
            .rule_for(tool)
            .is_some_and(|rule| rule.idempotent)
    }

    /// [`Budget::idempotent`], for the tool of a planned call.
    pub fn idempotent_in(&self, plan: &CallPlan) -> bool {
        self.rule_in(plan).is_some_and(|rule| rule.idempotent)
    }

    /// Whether the items path of `tool`'s rule finds a list in `result` (`None`: no items rule).
    pub fn items_match(&self, tool: &str, result: &Value) -> Option<bool> {
        let items = self.policy.rule_for(tool)?.items.as_ref()?;
        let mut copy = result.clone();
        Some(place::locate(&mut copy, items).is_some())
    }

    /// Logs, once per tool, that its rule's `items` matched nothing in a result.
    fn warn_unmatched(&self, tool: &str, path: &str) {
        let mut warned = self
            .unmatched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if warned.insert(tool.to_string()) {
            tracing::warn!(
                tool,
                items = path,
                "the rule's items path matches nothing in this tool's result; paging it automatically instead (fix the path: `mcp-budget check POLICY --recording FILE` lists paths that match nothing)"
            );
        }
    }

    /// The rule a plan names, and how it pages the call.
    fn rule_of<'a>(&'a self, plan: &'a CallPlan) -> Option<(&'a Rule, Option<&'a Paging>)> {
        match &plan.governed {
            Governed::Unruled => None,
            Governed::Capped { rule } => Some((&self.policy.rules[*rule], None)),
            Governed::Paged { rule, paging } => Some((&self.policy.rules[*rule], Some(paging))),
        }
    }

    /// Whether the policy pages this tool's results.
    pub fn is_paged(&self, tool: &str) -> bool {
        paged_with(self.policy.rule_for(tool))
    }

    /// [`Budget::is_paged`], for the tool of a planned call.
    pub fn paged_in(&self, plan: &CallPlan) -> bool {
        paged_with(self.rule_in(plan))
    }

    /// The plan of a call whose result is only capped.
    pub fn plan_unpaged(&self, tool: String) -> CallPlan {
        CallPlan {
            governed: match self.policy.rule_index_for(&tool) {
                Some(rule) => Governed::Capped { rule },
                None => Governed::Unruled,
            },
            tool,
        }
    }

    /// How many items a budgeted page of `tool` holds (for reports).
    pub fn page_len(&self, tool: &str, document: &Value) -> Option<usize> {
        let items = self.policy.rule_for(tool)?.items.as_ref()?;
        let path = place::first_list_path(document, items)?;
        document
            .reference(path.as_str())
            .and_then(Value::as_array)
            .map(Vec::len)
    }

    /// How many items a page holds, wherever its list is (structuredContent, or the JSON of a
    /// text block).
    fn page_items(&self, tool: &str, page: &Value) -> Option<usize> {
        let items = self.policy.rule_for(tool)?.items.as_ref()?;
        if let Some(n) = self.page_len(tool, &page["structuredContent"]) {
            return Some(n);
        }
        let mut copy = page.clone();
        let (_, document) = place::locate(&mut copy, items)?;
        let path = place::first_list_path(&document, items)?;
        document
            .reference(path.as_str())
            .and_then(Value::as_array)
            .map(Vec::len)
    }

    /// Rewrites the tools of a `tools/list` result; returns whether anything changed.
    pub fn rewrite_tools_list(&self, result: &mut Value) -> bool {
        let Some(Value::Array(tools)) = result.get_mut("tools") else {
            return false;
        };
        let mut changed = false;
        for tool in tools {
            let Value::Object(tool) = tool else { continue };
            let Some(rule) = tool
                .get("name")
                .and_then(Value::as_str)
                .and_then(|name| self.policy.rule_for(name))
            else {
                continue;
            };
            descriptor::rewrite(tool, rule, &self.policy);
            changed = true;
        }
        changed
    }

    /// Reads a `tools/call`'s params: strips the budget arguments from `params.arguments`
    /// and plans the response. An argument error is the tool error to answer with.
    pub fn prepare_call(&self, params: &mut Value) -> Result<CallPlan, ArgError> {
        let tool = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let Some(index) = self.policy.rule_index_for(&tool) else {
            return Ok(CallPlan {
                tool,
                governed: Governed::Unruled,
            });
        };
        let rule = &self.policy.rules[index];
        if rule.items.is_none() && rule.text.is_none() {
            return Ok(CallPlan {
                tool,
                governed: Governed::Capped { rule: index },
            });
        }
        let mut empty = Map::new();
        let arguments = match params.get_mut("arguments") {
            Some(Value::Object(arguments)) => arguments,
            _ => &mut empty,
        };
        let paging = match &rule.items {
            Some(items) => Paging::Items(args::take(&tool, arguments, items, &self.key)?),
            None => Paging::Text(args::take_text(&tool, arguments, &self.key)?),
        };
        Ok(CallPlan {
            tool,
            governed: Governed::Paged {
                rule: index,
                paging,
            },
        })
    }

    /// Whether a response to this call may pass unparsed when it is this small.
    pub fn passes_unread(&self, plan: &CallPlan, bytes: usize) -> bool {
        !plan.is_paged()
            && !cap::exceeds(bytes, self.cap_for(&plan.tool))
            && self.limits.tokens.is_none_or(|tokens| bytes <= tokens)
            && self.limits.lines.is_none()
    }

    /// The result the client receives for this call: the budgeted page, or the cap's refusal
    /// (serialized); or word that automatic paging takes over (the rule's items matched
    /// nothing, or the cursor is an automatic page's).
    pub fn finish_call(&self, plan: &CallPlan, result: Value) -> Result<Finished, RenderError> {
        self.finish(plan, result, None, None)
    }

    /// The sentence a first page's notice ends with, naming the search tool; `None` when the
    /// policy turns search off.
    pub fn search_hint(&self) -> Option<&'static str> {
        self.policy.search.then_some(SEARCH_HINT)
    }

    /// Whether this call is a rule page that continues a chain (it has `after`).
    pub fn continues(&self, plan: &CallPlan) -> bool {
        match &plan.governed {
            Governed::Paged {
                paging: Paging::Items(args),
                ..
            } => args.after.is_some(),
            Governed::Paged {
                paging: Paging::Text(args),
                ..
            } => args.after.is_some(),
            _ => false,
        }
    }

    /// Where an automatic page starts, for a rule page whose cursor is an automatic page's.
    pub fn auto_position(&self, plan: &CallPlan) -> Option<auto::At> {
        match &plan.governed {
            Governed::Paged {
                paging: Paging::Items(args),
                ..
            } => args.after.as_ref().and_then(auto::At::from_position),
            Governed::Paged {
                paging: Paging::Text(args),
                ..
            } => args.auto,
            _ => None,
        }
    }

    /// The digest that names a paged call's chain (its cache entry).
    pub fn chain_digest(&self, plan: &CallPlan) -> Option<cursor::SelectionDigest> {
        match &plan.governed {
            Governed::Paged {
                paging: Paging::Items(args),
                ..
            } => Some(args.digest),
            Governed::Paged {
                paging: Paging::Text(args),
                ..
            } => Some(args.digest),
            _ => None,
        }
    }

    /// The plan of the page after `page` (a page `plan` rendered): the same call, continued
    /// by the cursor the page carries. `None` when it carries none this chain accepts.
    pub fn next_plan(&self, plan: &CallPlan, page: &[u8]) -> Option<CallPlan> {
        let Governed::Paged { rule, paging } = &plan.governed else {
            return None;
        };
        let digest = self.chain_digest(plan)?;
        // The page's own text may hold cursor-like words: the last one that opens is its.
        let position = cursors_in(page)
            .into_iter()
            .rev()
            .find_map(|cursor| self.key.verify(cursor, &digest).ok())?;
        let paging = match paging {
            Paging::Items(args) => Paging::Items(CallArgs {
                after: Some(position),
                ..args.clone()
            }),
            Paging::Text(args) => Paging::Text(args::TextArgs {
                after: Some(position.offset),
                fingerprint: page::fingerprint_of(&position),
                auto: auto::At::from_position(&position),
                digest: args.digest,
            }),
        };
        Some(CallPlan {
            tool: plan.tool.clone(),
            governed: Governed::Paged {
                rule: *rule,
                paging,
            },
        })
    }

    /// A digest of all that shapes a rule page (every budget argument, its position
    /// included): it names the page in the shared cache.
    pub fn page_shape(&self, plan: &CallPlan) -> String {
        use sha2::Digest;
        let shape = format!("{:?}", plan.governed);
        crate::wire::canonical::hex(&sha2::Sha256::digest(shape.as_bytes())[..12])
    }

    /// Whether the plan pages text.
    pub fn pages_text(&self, plan: &CallPlan) -> bool {
        matches!(
            &plan.governed,
            Governed::Paged {
                paging: Paging::Text(_),
                ..
            }
        )
    }
}

/// Whether a rule pages its tool's results.
fn paged_with(rule: Option<&Rule>) -> bool {
    rule.is_some_and(|rule| rule.items.is_some() || rule.text.is_some())
}

/// A text rule's page size.
fn text_page_with(rule: Option<&Rule>) -> Option<usize> {
    rule.and_then(|rule| rule.text.as_ref())
        .map(|text| text.page_bytes)
}

/// What [`Budget::finish_call`] made of a result.
#[derive(Debug)]
pub enum Finished {
    /// The result to send.
    Bytes(Vec<u8>),
    /// Automatic paging takes over, from `at` (the first page when `None`).
    Auto {
        at: Option<auto::At>,
        digest: cursor::SelectionDigest,
    },
}

impl Finished {
    /// The bytes to send, unless automatic paging takes over.
    pub fn bytes(self) -> Option<Vec<u8>> {
        match self {
            Finished::Bytes(bytes) => Some(bytes),
            Finished::Auto { .. } => None,
        }
    }
}

/// The sentence that ends a first page's notice when search is on.
pub const SEARCH_HINT: &str = "To find something in the whole result without reading every page, call mcp_budget_search with this next_after as cursor and a pattern (a regular expression) or a path (a JSONPath).";

fn refusal_result(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": true})
}

/// The cursors a page names: the word after each `next_after` (in structuredContent, or in a
/// text block's JSON, its quotes escaped) and after each notice's `after:`.
fn cursors_in(page: &[u8]) -> Vec<&str> {
    let mut found = Vec::new();
    for marker in [b"next_after".as_slice(), b"after:"] {
        for at in memchr::memmem::find_iter(page, marker) {
            let rest = &page[at + marker.len()..];
            let start = rest
                .iter()
                .position(|b| !matches!(b, b'"' | b'\\' | b':' | b' '))
                .unwrap_or(rest.len());
            let word = &rest[start..];
            let len = word
                .iter()
                .position(|b| {
                    !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'='))
                })
                .unwrap_or(word.len());
            if len > 0
                && let Ok(cursor) = std::str::from_utf8(&word[..len])
            {
                found.push((at, cursor));
            }
        }
    }
    found.sort_by_key(|(at, _)| *at);
    found.into_iter().map(|(_, cursor)| cursor).collect()
}
