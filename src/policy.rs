//! The budget policy: a TOML file, read strictly and resolved into rules the pipeline can use.
//!
//! `PolicyFile` mirrors the TOML exactly (`deny_unknown_fields`, so a misspelt key is an error,
//! not a silently ignored setting); `Policy` is what the rest of the proxy uses: JSONPaths
//! parsed, field paths split, limits checked. Every problem is reported with the file, line and
//! column it comes from, and says what would be accepted instead.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use jsonpath_rust::parser::model::JpQuery;
use serde::Deserialize;
use toml::Spanned;

/// The cap when a policy names none: results at or above this many bytes are refused.
pub const DEFAULT_MAX_BYTES: usize = 200_000;
/// The default limit of the result cache, in bytes of results held.
pub const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;
/// The default time the result cache keeps a result.
pub const DEFAULT_CACHE_TTL: std::time::Duration = std::time::Duration::from_secs(600);

/// The default page size and its maximum.
pub const DEFAULT_LIMIT: usize = 25;
pub const DEFAULT_MAX_LIMIT: usize = 100;

/// A policy file is read only up to this many bytes (1 MiB): a larger one is refused.
pub const MAX_POLICY_BYTES: usize = 1024 * 1024;

/// A policy file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("{path}: cannot read the policy: {cause}")]
    Read {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path}: not a regular file (it is {kind}); a policy is read only from a regular file")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path}: the policy file is {bytes} bytes, over the bound of 1 MiB on a policy file")]
    TooLarge { path: PathBuf, bytes: u64 },
    #[error("{path}: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error(
        "there is no built-in policy {name:?}; the built-in policies are {known} (`mcp-budget policies` lists them)"
    )]
    Builtin { name: String, known: String },
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
}

// ---- The file, as written -------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    budget: BudgetFile,
    #[serde(default)]
    tool: Vec<ToolFile>,
    /// Which tools clients see: `[tools] allow = [...]`, `deny = [...]`, with globs.
    #[serde(default)]
    tools: ToolsFile,
    /// Client profiles: `[client."codex"] max_bytes = 8192` overrides a built-in profile (by
    /// its name or a `clientInfo.name`), any other name adds one.
    #[serde(default)]
    client: std::collections::BTreeMap<String, ClientFile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolsFile {
    allow: Option<Spanned<Vec<String>>>,
    deny: Option<Spanned<Vec<String>>>,
    /// Tools that never receive a result reference in place of an argument.
    no_references: Option<Spanned<Vec<String>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientFile {
    max_bytes: Option<Spanned<i64>>,
    max_tokens: Option<Spanned<i64>>,
    max_lines: Option<Spanned<i64>>,
    page_bytes: Option<Spanned<i64>>,
    default_limit: Option<Spanned<i64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BudgetFile {
    /// Results at or above this many bytes (serialized) are refused. Default 200000.
    max_bytes: Option<Spanned<i64>>,
    /// `_meta["anthropic/maxResultSizeChars"]` on budgeted tools. Default: max_bytes.
    max_result_size_chars: Option<Spanned<i64>>,
    /// An environment variable holding the cursor key, so that several proxies accept each
    /// other's cursors. Default: a random key per process.
    cursor_key_env: Option<String>,
    /// Page automatically the results of tools that no rule pages. Default true.
    auto: Option<bool>,
    /// The result cache's limit in bytes (all sessions together). Default 64 MiB.
    cache_bytes: Option<Spanned<i64>>,
    /// How long a result is kept for its next pages, in seconds. Default 600.
    cache_ttl_secs: Option<Spanned<i64>>,
    /// Offer `mcp_budget_search`, which searches a paged result the cache holds. Default true.
    search: Option<bool>,
    /// Name each paged result by a reference a client may pass to another tool in place of an
    /// argument (the proxy puts the result there). Default true.
    references: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolFile {
    /// Tool names: exact, or globs with `*` and `?`. One name or a list.
    name: Spanned<OneOrMany>,
    /// JSONPath to the item list, in `structuredContent` or the JSON of the text content.
    items: Option<Spanned<String>>,
    /// The field that identifies an item (cursors use it).
    key: Option<String>,
    /// What an item is called in notices ("streams"). Default "items".
    noun: Option<String>,
    horizon: Option<HorizonFile>,
    detail: Option<DetailFile>,
    limit: Option<LimitFile>,
    format: Option<FormatFile>,
    /// Filter arguments: argument name → item field.
    #[serde(default)]
    filters: BTreeMap<String, Spanned<String>>,
    /// Added arguments that the upstream tool also takes (forwarded instead of stripped).
    #[serde(default)]
    passthrough: Vec<Spanned<String>>,
    /// Page a long plain-text result by lines (instead of `items`).
    text: Option<TextFile>,
    /// Page automatically when no `items` or `text` applies. Default: the budget's `auto`.
    auto: Option<bool>,
    /// The tool may be called again to serve a page whose result left the cache (as for a tool
    /// annotated `readOnlyHint`). Default false.
    idempotent: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TextFile {
    /// At most this many bytes of text per page. Default 20000.
    page_bytes: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HorizonFile {
    field: Spanned<String>,
    terminal: Spanned<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DetailFile {
    summary: Spanned<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitFile {
    default: Option<Spanned<i64>>,
    max: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FormatFile {
    columns: Spanned<Vec<String>>,
}

// ---- The policy, resolved -------------------------------------------------------------------

/// A field path inside an item, e.g. `last_gate.verdict` → `["last_gate", "verdict"]`.
pub type FieldPath = Vec<String>;

/// A validated policy.
#[derive(Debug, Clone)]
pub struct Policy {
    pub max_bytes: usize,
    pub max_result_size_chars: usize,
    pub cursor_key_env: Option<String>,
    /// Automatic paging for tools no rule pages.
    pub auto: bool,
    pub cache_bytes: usize,
    pub cache_ttl: std::time::Duration,
    /// The proxy's search tool is offered (where anything is paged).
    pub search: bool,
    pub rules: Vec<Rule>,
    /// The policy's `[client."name"]` sections.
    pub clients: Vec<Override>,
    /// `[tools] allow`: when not empty, only the tools it matches are shown.
    pub allow: Vec<String>,
    /// `[tools] deny`: the tools it matches are hidden (whatever `allow` says).
    pub deny: Vec<String>,
    /// `[budget] references`: pages name result references, and calls may pass them.
    pub references: bool,
    /// `[tools] no_references`: the tools that never receive a reference.
    pub no_references: Vec<String>,
}

impl Default for Policy {
    /// The built-in policy: no rules, and the default cap on every tool result.
    fn default() -> Self {
        Policy {
            max_bytes: DEFAULT_MAX_BYTES,
            max_result_size_chars: DEFAULT_MAX_BYTES,
            cursor_key_env: None,
            auto: true,
            cache_bytes: DEFAULT_CACHE_BYTES,
            cache_ttl: DEFAULT_CACHE_TTL,
            search: true,
            rules: Vec::new(),
            clients: Vec::new(),
            allow: Vec::new(),
            deny: Vec::new(),
            references: true,
            no_references: Vec::new(),
        }
    }
}

/// What a policy's `[client."name"]` section sets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Override {
    /// The section's name: a profile name or a `clientInfo.name`.
    pub name: String,
    pub max_bytes: Option<usize>,
    pub max_tokens: Option<usize>,
    pub max_lines: Option<usize>,
    pub page_bytes: Option<usize>,
    pub default_limit: Option<usize>,
}

/// What the policy says about the tools it names.
#[derive(Debug, Clone)]
pub struct Rule {
    pub names: Vec<String>,
    /// How its item list is paged; `None` (and no `text`): the tool is capped, not paged.
    pub items: Option<Items>,
    /// How its long text result is paged.
    pub text: Option<TextPaging>,
    /// Automatic paging applies where `items` and `text` do not.
    pub auto: bool,
    /// The tool may be re-called to serve a page (see [`ToolFile`]).
    pub idempotent: bool,
}

/// Paging a long plain-text result by lines.
#[derive(Debug, Clone)]
pub struct TextPaging {
    pub page_bytes: usize,
}

/// The default text page size.
pub const DEFAULT_PAGE_BYTES: usize = 20_000;

/// How to find, narrow and page a tool's item list.
#[derive(Debug, Clone)]
pub struct Items {
    pub path_text: String,
    pub path: JpQuery,
    /// For `$.outer[*].field`: the outer list is paged (this path), while horizon, filters and
    /// detail apply to the `field` list of each outer item.
    pub nested: Option<(JpQuery, String)>,
    pub key: Option<FieldPath>,
    pub noun: String,
    /// `noun` was left out (the notices say "items").
    pub noun_defaulted: bool,
    pub horizon: Option<Horizon>,
    pub summary: Option<Vec<FieldPath>>,
    pub default_limit: usize,
    pub max_limit: usize,
    pub columns: Option<Vec<FieldPath>>,
    /// (argument name, item field), in name order.
    pub filters: Vec<(String, FieldPath)>,
    pub passthrough: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Horizon {
    pub field: FieldPath,
    pub terminal: Vec<String>,
}

impl Policy {
    /// No rules and no cap: what a replayed server needs to answer exactly as recorded.
    pub fn uncapped() -> Policy {
        Policy {
            max_bytes: usize::MAX,
            max_result_size_chars: usize::MAX,
            auto: false,
            ..Policy::default()
        }
    }

    /// Reads and validates a policy file; `builtin:NAME` is a built-in policy
    /// ([`crate::builtin`]), and `none` is no rules.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        if let Some(text) = path.to_str() {
            if text == "none" {
                return Ok(Policy::default());
            }
            if let Some(name) = text.strip_prefix("builtin:") {
                let builtin =
                    crate::builtin::by_name(name).ok_or_else(|| PolicyError::Builtin {
                        name: name.to_string(),
                        known: crate::builtin::names(),
                    })?;
                return Policy::parse(builtin.text, path);
            }
        }
        let text = crate::regular::read_bounded(path, MAX_POLICY_BYTES as u64)
            .map_err(|err| match err {
                crate::regular::OpenError::NotRegular(kind) => PolicyError::NotRegular {
                    path: path.to_path_buf(),
                    kind,
                },
                crate::regular::OpenError::Io(cause) => PolicyError::Read {
                    path: path.to_path_buf(),
                    cause,
                },
            })?
            .map_err(|bytes| PolicyError::TooLarge {
                path: path.to_path_buf(),
                bytes,
            })?;
        Policy::parse(&text, path)
    }

    /// Validates policy text; `path` only names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Policy, PolicyError> {
        let resolver = Resolver { text, path };
        let file: PolicyFile = toml::from_str(text).map_err(|err| {
            // One style for every error: file:line:column: message, in the policy's words.
            let message = err
                .message()
                .trim_end()
                .replace("i64", "integer")
                .replace("usize", "integer");
            match err.span() {
                Some(span) => resolver.error(span, message),
                None => PolicyError::Syntax {
                    path: path.to_path_buf(),
                    message,
                },
            }
        })?;
        resolver.policy(file)
    }

    /// Whether `[tools] allow`/`deny` hides `tool` from clients.
    pub fn hides(&self, tool: &str) -> bool {
        let matches = |list: &[String]| list.iter().any(|p| p == tool || glob_match(p, tool));
        (!self.allow.is_empty() && !matches(&self.allow)) || matches(&self.deny)
    }

    /// Whether `tool` may receive a result reference in place of an argument.
    pub fn takes_references(&self, tool: &str) -> bool {
        let matches = |p: &String| p == tool || glob_match(p, tool);
        self.references && !self.no_references.iter().any(matches)
    }

    /// Whether the policy hides any tool.
    pub fn hides_any(&self) -> bool {
        !self.allow.is_empty() || !self.deny.is_empty()
    }

    /// The rule for a tool: the first rule that names it exactly, else the first whose glob
    /// matches.
    pub fn rule_for(&self, tool: &str) -> Option<&Rule> {
        self.rule_index_for(tool).map(|index| &self.rules[index])
    }

    /// [`Policy::rule_for`], as the rule's index in `rules`.
    pub fn rule_index_for(&self, tool: &str) -> Option<usize> {
        self.rules
            .iter()
            .position(|rule| rule.names.iter().any(|n| n == tool))
            .or_else(|| {
                self.rules
                    .iter()
                    .position(|rule| rule.names.iter().any(|n| glob_match(n, tool)))
            })
    }
}

struct Resolver<'a> {
    text: &'a str,
    path: &'a Path,
}

impl Resolver<'_> {
    fn error(&self, span: Range<usize>, message: impl Into<String>) -> PolicyError {
        let before = &self.text[..span.start.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        PolicyError::Invalid {
            path: self.path.to_path_buf(),
            line,
            column,
            message: message.into(),
        }
    }

    fn positive(&self, value: &Spanned<i64>, what: &str) -> Result<usize, PolicyError> {
        usize::try_from(*value.get_ref())
            .ok()
            .filter(|v| *v > 0)
            .ok_or_else(|| self.error(value.span(), format!("{what} must be a positive integer")))
    }

    fn field(&self, text: &str, span: Range<usize>, what: &str) -> Result<FieldPath, PolicyError> {
        let parts: FieldPath = text.split('.').map(str::to_string).collect();
        if parts.iter().any(String::is_empty) {
            return Err(self.error(
                span,
                format!("{what} {text:?} is not a field path: use names separated by dots, e.g. \"last_gate.verdict\""),
            ));
        }
        Ok(parts)
    }

    fn fields(
        &self,
        list: &Spanned<Vec<String>>,
        what: &str,
    ) -> Result<Vec<FieldPath>, PolicyError> {
        if list.get_ref().is_empty() {
            return Err(self.error(list.span(), format!("{what} must name at least one field")));
        }
        list.get_ref()
            .iter()
            .map(|f| self.field(f, list.span(), what))
            .collect()
    }

    fn policy(&self, file: PolicyFile) -> Result<Policy, PolicyError> {
        let max_bytes = match &file.budget.max_bytes {
            Some(v) => self.positive(v, "budget.max_bytes")?,
            None => DEFAULT_MAX_BYTES,
        };
        let max_result_size_chars = match &file.budget.max_result_size_chars {
            Some(v) => self.positive(v, "budget.max_result_size_chars")?,
            None => max_bytes,
        };
        let auto = file.budget.auto.unwrap_or(true);
        let rules = file
            .tool
            .into_iter()
            .map(|tool| self.rule(tool, auto))
            .collect::<Result<_, _>>()?;
        let cache_bytes = match &file.budget.cache_bytes {
            Some(v) => self.positive(v, "budget.cache_bytes")?,
            None => DEFAULT_CACHE_BYTES,
        };
        let cache_ttl = match &file.budget.cache_ttl_secs {
            Some(v) => {
                std::time::Duration::from_secs(self.positive(v, "budget.cache_ttl_secs")? as u64)
            }
            None => DEFAULT_CACHE_TTL,
        };
        let mut clients = Vec::new();
        for (name, section) in &file.client {
            let what = |key: &str| format!("client.\"{name}\".{key}");
            let get = |value: &Option<Spanned<i64>>, key: &str| {
                value
                    .as_ref()
                    .map(|v| self.positive(v, &what(key)))
                    .transpose()
            };
            clients.push(Override {
                name: name.clone(),
                max_bytes: get(&section.max_bytes, "max_bytes")?,
                max_tokens: get(&section.max_tokens, "max_tokens")?,
                max_lines: get(&section.max_lines, "max_lines")?,
                page_bytes: get(&section.page_bytes, "page_bytes")?,
                default_limit: get(&section.default_limit, "default_limit")?,
            });
        }
        let names = |list: &Option<Spanned<Vec<String>>>, what: &str| {
            let Some(list) = list else {
                return Ok(Vec::new());
            };
            if list.get_ref().iter().any(String::is_empty) {
                return Err(self.error(
                    list.span(),
                    format!("tools.{what} holds an empty name: give tool names or globs such as \"git_*\""),
                ));
            }
            Ok(list.get_ref().clone())
        };
        let allow = names(&file.tools.allow, "allow")?;
        let deny = names(&file.tools.deny, "deny")?;
        let no_references = names(&file.tools.no_references, "no_references")?;
        if let Some(list) = &file.tools.allow
            && list.get_ref().is_empty()
        {
            return Err(self.error(
                list.span(),
                "tools.allow is empty, which would hide every tool: list the tools to show, or leave allow out to show all",
            ));
        }
        Ok(Policy {
            max_bytes,
            max_result_size_chars,
            cursor_key_env: file.budget.cursor_key_env,
            auto: file.budget.auto.unwrap_or(true),
            cache_bytes,
            cache_ttl,
            search: file.budget.search.unwrap_or(true),
            rules,
            clients,
            allow,
            deny,
            references: file.budget.references.unwrap_or(true),
            no_references,
        })
    }

    fn rule(&self, tool: ToolFile, auto: bool) -> Result<Rule, PolicyError> {
        let auto = tool.auto.unwrap_or(auto);
        let idempotent = tool.idempotent.unwrap_or(false);
        let names = match tool.name.get_ref() {
            OneOrMany::One(name) => vec![name.clone()],
            OneOrMany::Many(names) => names.clone(),
        };
        if names.is_empty() || names.iter().any(String::is_empty) {
            return Err(self.error(
                tool.name.span(),
                "tool.name must be a tool name, a glob such as \"fleet_*\", or a list of them",
            ));
        }
        if let (Some(items), Some(_)) = (&tool.items, &tool.text) {
            return Err(self.error(
                items.span(),
                "a rule pages either `items` (a JSON list) or `text` (lines of text), not both",
            ));
        }
        let text = match &tool.text {
            Some(text) => Some(TextPaging {
                page_bytes: match &text.page_bytes {
                    Some(v) => self.positive(v, "text.page_bytes")?,
                    None => DEFAULT_PAGE_BYTES,
                },
            }),
            None => None,
        };
        let Some(items) = tool.items else {
            let paged_only = [
                tool.horizon.as_ref().map(|h| ("horizon", h.field.span())),
                tool.detail.as_ref().map(|d| ("detail", d.summary.span())),
                tool.format.as_ref().map(|f| ("format", f.columns.span())),
                tool.filters.values().next().map(|f| ("filters", f.span())),
            ];
            if let Some((what, span)) = paged_only.into_iter().flatten().next() {
                return Err(self.error(span, format!("{what} needs `items`: say where the item list is, e.g. items = \"$.streams\"")));
            }
            return Ok(Rule {
                names,
                items: None,
                text,
                auto,
                idempotent,
            });
        };
        let path_text = items.get_ref().clone();
        let path = jsonpath_rust::parser::parse_json_path(&path_text).map_err(|err| {
            self.error(
                items.span(),
                format!("items: {path_text:?} is not a valid JSONPath ({err}); e.g. \"$.streams\""),
            )
        })?;
        let key = tool
            .key
            .as_deref()
            .map(|k| self.field(k, items.span(), "key"))
            .transpose()?;
        let horizon = match tool.horizon {
            Some(h) => {
                if h.terminal.get_ref().is_empty() {
                    return Err(self.error(
                        h.terminal.span(),
                        "horizon.terminal must list at least one terminal value, e.g. [\"merged\"]",
                    ));
                }
                Some(Horizon {
                    field: self.field(h.field.get_ref(), h.field.span(), "horizon.field")?,
                    terminal: h.terminal.into_inner(),
                })
            }
            None => None,
        };
        let summary = tool
            .detail
            .map(|d| self.fields(&d.summary, "detail.summary"))
            .transpose()?;
        let columns = tool
            .format
            .map(|f| self.fields(&f.columns, "format.columns"))
            .transpose()?;
        let (default_limit, max_limit) = match &tool.limit {
            None => (DEFAULT_LIMIT, DEFAULT_MAX_LIMIT),
            Some(limit) => {
                let max = match &limit.max {
                    Some(v) => self.positive(v, "limit.max")?,
                    None => DEFAULT_MAX_LIMIT,
                };
                let default = match &limit.default {
                    Some(v) => {
                        let d = self.positive(v, "limit.default")?;
                        if d > max {
                            return Err(self.error(
                                v.span(),
                                format!("limit.default ({d}) is above limit.max ({max})"),
                            ));
                        }
                        d
                    }
                    None => DEFAULT_LIMIT.min(max),
                };
                (default, max)
            }
        };
        let mut filters = Vec::new();
        for (name, field) in &tool.filters {
            if RESERVED.contains(&name.as_str()) {
                return Err(self.error(field.span(), format!("filter argument {name:?} clashes with a budget argument; choose another name")));
            }
            filters.push((
                name.clone(),
                self.field(field.get_ref(), field.span(), "filter field")?,
            ));
        }
        let mut passthrough = Vec::new();
        for arg in &tool.passthrough {
            let known = RESERVED.contains(&arg.get_ref().as_str())
                || tool.filters.contains_key(arg.get_ref());
            if !known {
                return Err(self.error(arg.span(), format!("passthrough: {:?} is not an argument the proxy adds (one of horizon, detail, limit, after, format, or a filter name)", arg.get_ref())));
            }
            passthrough.push(arg.get_ref().clone());
        }
        let nested = nested_split(&path_text)
            .map(|(outer, field)| {
                jsonpath_rust::parser::parse_json_path(&outer)
                    .map(|q| (q, field))
                    .map_err(|err| {
                        self.error(
                            items.span(),
                            format!("items: {outer:?} is not a valid JSONPath ({err})"),
                        )
                    })
            })
            .transpose()?;
        Ok(Rule {
            names,
            text: None,
            auto,
            idempotent,
            items: Some(Items {
                path_text,
                path,
                nested,
                key,
                noun_defaulted: tool.noun.is_none(),
                noun: tool.noun.unwrap_or_else(|| "items".into()),
                horizon,
                summary,
                default_limit,
                max_limit,
                columns,
                filters,
                passthrough,
            }),
        })
    }
}

/// `$.a[*].b` → (`$.a`, `b`): an item list nested one level inside an outer list.
fn nested_split(path: &str) -> Option<(String, String)> {
    let (outer, field) = path.rsplit_once("[*].").or_else(|| {
        let (outer, rest) = path.rsplit_once("[*]['")?;
        Some((outer, rest.strip_suffix("']")?))
    })?;
    let simple = !field.is_empty()
        && field
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    (simple && outer.starts_with('$') && !outer.contains("[*]") && !outer.contains(".."))
        .then(|| (outer.to_string(), field.to_string()))
}

/// The arguments the proxy itself adds to a paged tool.
pub const RESERVED: [&str; 5] = ["horizon", "detail", "limit", "after", "format"];

/// `*` matches any run of characters, `?` any one character; everything else matches itself.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Policy, String> {
        Policy::parse(text, Path::new("p.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn globs() {
        assert!(glob_match("fleet_*", "fleet_show"));
        assert!(glob_match("*_show", "wave_show"));
        assert!(glob_match("w?ve_show", "wave_show"));
        assert!(!glob_match("fleet_*", "wave_show"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("a*b", "ac"));
    }

    #[test]
    fn exact_names_win_over_globs() {
        let policy = parse(
            "[[tool]]\nname = \"*\"\n\n[[tool]]\nname = [\"fleet_show\"]\nitems = \"$.streams\"\n",
        )
        .unwrap();
        assert!(policy.rule_for("fleet_show").unwrap().items.is_some());
        assert!(policy.rule_for("other").unwrap().items.is_none());
    }

    #[test]
    fn defaults() {
        let policy = parse("").unwrap();
        assert_eq!(policy.max_bytes, 200_000);
        assert_eq!(policy.max_result_size_chars, 200_000);
        assert!(policy.rules.is_empty());
    }

    #[test]
    fn unknown_keys_are_errors_with_a_position() {
        let err = parse("[budget]\nmax_byte = 5\n").unwrap_err();
        assert!(
            err.starts_with("p.toml:2:1: unknown field `max_byte`"),
            "{err}"
        );
        // One style for syntax and meaning alike, in the policy's words.
        let err = parse("[budget]\nmax_bytes = \"x\"\n").unwrap_err();
        assert_eq!(
            err,
            "p.toml:2:13: invalid type: string \"x\", expected integer"
        );
        let err = Policy::load(Path::new("/nonexistent/p.toml"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err.matches("No such file").count(),
            1,
            "the OS error once: {err}"
        );
    }

    #[test]
    fn bad_jsonpath_names_line_and_column() {
        let err = parse("[[tool]]\nname = \"t\"\nitems = \"$.[streams\"\n").unwrap_err();
        assert!(
            err.starts_with("p.toml:3:9: items: \"$.[streams\" is not a valid JSONPath"),
            "{err}"
        );
    }

    #[test]
    fn impossible_values_are_refused() {
        let err =
            parse("[[tool]]\nname = \"t\"\nitems = \"$.x\"\nlimit = { default = 50, max = 10 }\n")
                .unwrap_err();
        assert_eq!(
            err,
            "p.toml:4:21: limit.default (50) is above limit.max (10)"
        );
        let err = parse("[budget]\nmax_bytes = 0\n").unwrap_err();
        assert_eq!(
            err,
            "p.toml:2:13: budget.max_bytes must be a positive integer"
        );
        let err = parse(
            "[[tool]]\nname = \"t\"\n[tool.horizon]\nfield = \"state\"\nterminal = [\"m\"]\n",
        )
        .unwrap_err();
        assert!(err.contains("horizon needs `items`"), "{err}");
        let err = parse("[[tool]]\nname = \"t\"\nitems = \"$.x\"\nfilters = { limit = \"n\" }\n")
            .unwrap_err();
        assert!(err.contains("clashes with a budget argument"), "{err}");
        let err =
            parse("[[tool]]\nname = \"t\"\nitems = \"$.x\"\n[tool.detail]\nsummary = [\"a..b\"]\n")
                .unwrap_err();
        assert!(err.contains("is not a field path"), "{err}");
    }
}
