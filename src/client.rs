//! Client profiles: the budget each MCP client can show its model in full.
//!
//! MCP has no way for a client to declare its budget, yet every client has one, and they differ
//! by an order of magnitude. The proxy sees the client's name in `initialize.clientInfo.name`,
//! so it fits each page to the client that will read it: a built-in profile per known client
//! (each number with its source), overridable and extendable in the policy
//! (`[client."name"] max_bytes = …`), forced with `--client NAME`. An unknown client gets the
//! policy's budget (200000 bytes by default).

use std::fmt;
use std::sync::Arc;

use crate::policy::Override;

/// A client's budget, as a profile states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// The profile's name, as messages and `--client` use it (`codex`).
    pub name: String,
    /// The `clientInfo.name`s it applies to.
    pub clients: Vec<String>,
    /// A result at or above this many bytes is not shown in full.
    pub max_bytes: usize,
    /// The client counts tokens (o200k here): a page stays under this many.
    pub max_tokens: Option<usize>,
    /// The client cuts by lines: a page's text stays under this many.
    pub max_lines: Option<usize>,
    /// The size of a text page (text rules) and the ceiling of an automatic page.
    pub page_bytes: Option<usize>,
    /// The default item limit of items rules (never above a rule's own).
    pub default_limit: Option<usize>,
    /// The client honours `_meta["anthropic/maxResultSizeChars"]`: a tool the proxy declares it
    /// on may return up to that many (at most this).
    pub allowance_up_to: Option<usize>,
    /// What the client shows its model of a result that has both `content` and
    /// `structuredContent`: a page is measured by that.
    pub reads: Reads,
    /// Where the numbers come from.
    pub source: String,
}

/// What a client puts in front of its model when a tool result carries both `content` and
/// `structuredContent`. A page is measured by what the model reads: a client that shows one
/// half is not charged for the other (the proxy still sends both, consistent, each with the
/// continuation). Where nothing is published, both count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reads {
    /// Both halves (or unknown): the whole result counts.
    #[default]
    Both,
    /// The text of `content` only.
    Content,
    /// `structuredContent`, serialized, when the result has it; else `content`.
    Structured,
}

/// One built-in profile.
struct Builtin {
    name: &'static str,
    clients: &'static [&'static str],
    max_bytes: usize,
    max_tokens: Option<usize>,
    max_lines: Option<usize>,
    page_bytes: Option<usize>,
    default_limit: Option<usize>,
    allowance_up_to: Option<usize>,
    reads: Reads,
    source: &'static str,
}

/// Claude Code's token limit on one MCP tool result, unless `MAX_MCP_OUTPUT_TOKENS` says
/// otherwise (<https://code.claude.com/docs/en/mcp>, "MCP output limits and warnings":
/// default 25,000 tokens, a warning above 10,000).
pub const CLAUDE_CODE_TOKENS: usize = 25_000;

/// The built-in profiles. Each number is the client's own published or coded limit on one tool
/// result; a page that stays under it is shown to the model in full. Clients with no known
/// limit (Cursor, which sends "cursor-vscode") have no profile: they get the policy's budget.
const BUILTINS: &[Builtin] = &[
    // Claude Code sends "claude-code" (closed source; seen in its initialize). A result over
    // MAX_MCP_OUTPUT_TOKENS (default 25,000) is refused; a text result over 50,000 characters
    // is saved to a file and the model sees a short preview, unless the tool's
    // `_meta["anthropic/maxResultSizeChars"]` raises that threshold (up to 500,000). The proxy
    // declares that allowance on the tools its policy budgets.
    Builtin {
        name: "claude-code",
        clients: &["claude-code"],
        max_bytes: 50_000,
        max_tokens: Some(CLAUDE_CODE_TOKENS),
        max_lines: None,
        page_bytes: None,
        default_limit: None,
        allowance_up_to: Some(500_000),
        reads: Reads::Structured,
        source: "https://code.claude.com/docs/en/mcp (\"MCP output limits and warnings\": MAX_MCP_OUTPUT_TOKENS, default 25000 tokens; text over 50000 characters goes to a file unless _meta[\"anthropic/maxResultSizeChars\"] allows up to 500000); reads: anthropics/claude-code#79944: with structuredContent present, the model gets JSON.stringify(structuredContent), not the text",
    },
    // Codex sends "codex-mcp-client" (openai/codex codex-rs/codex-mcp/src/rmcp_client.rs,
    // `mcp_initialize_request_params`). Every tool output is cut to the model's truncation
    // policy (codex-rs/models-manager/models.json: 10,000 tokens, or 10,000 bytes for some
    // models; applied in codex-rs/core/src/context_manager/history.rs). 10,000 bytes hold at
    // most 10,000 o200k tokens, so the byte cap keeps both.
    // Older releases cut tool output at 256 lines (MODEL_FORMAT_MAX_LINES, with 10 KiB), so
    // pages keep under that too.
    Builtin {
        name: "codex",
        clients: &["codex-mcp-client"],
        max_bytes: 10_000,
        max_tokens: None,
        max_lines: Some(256),
        page_bytes: None,
        default_limit: Some(10),
        allowance_up_to: None,
        reads: Reads::Structured,
        source: "openai/codex codex-rs/models-manager/models.json (truncation_policy: 10000 tokens, or 10000 bytes), applied to every tool output in codex-rs/core/src/context_manager/history.rs; older releases: 10 KiB or 256 lines (MODEL_FORMAT_MAX_LINES); reads: openai/codex codex-rs/protocol/src/models.rs, From<&CallToolResult> for FunctionCallOutputPayload: structured_content, when not null, is the output",
    },
    // opencode sends "opencode" (packages/opencode/src/mcp/index.ts). Tool output over 2,000
    // lines or 50 KB is cut to its head, the rest saved to a file
    // (packages/opencode/src/tool/truncation.ts, Truncate.MAX_LINES / Truncate.MAX_BYTES).
    Builtin {
        name: "opencode",
        clients: &["opencode"],
        max_bytes: 50 * 1024,
        max_tokens: None,
        max_lines: Some(2_000),
        page_bytes: None,
        default_limit: None,
        allowance_up_to: None,
        reads: Reads::Content,
        source: "sst/opencode packages/opencode/src/tool/truncation.ts (Truncate.MAX_LINES = 2000, Truncate.MAX_BYTES = 50 * 1024); reads: anomalyco/opencode packages/opencode/src/mcp/catalog.ts, convertTool: content, and structuredContent only when content is empty",
    },
    // GitHub Copilot CLI sends "github-copilot-developer" (closed source; seen in its
    // initialize, github/copilot-cli#1268). MCP text was cut to 10 KiB (github/copilot-cli#1732).
    Builtin {
        name: "copilot-cli",
        clients: &["github-copilot-developer"],
        max_bytes: 10 * 1024,
        max_tokens: None,
        max_lines: None,
        page_bytes: None,
        default_limit: Some(10),
        allowance_up_to: None,
        reads: Reads::Both,
        source: "github/copilot-cli#1732 (MCP tool text cut to 10 KiB; closed source); reads: github/copilot-cli#4515: both fields reach the conversation",
    },
    // Gemini CLI sends "gemini-cli-mcp-client" (google-gemini/gemini-cli
    // packages/core/src/tools/mcp-client.ts). A text result over 40,000 characters is saved to
    // a file and the model sees its head and tail (packages/core/src/config/config.ts,
    // DEFAULT_TRUNCATE_TOOL_OUTPUT_THRESHOLD).
    Builtin {
        name: "gemini-cli",
        clients: &["gemini-cli-mcp-client"],
        max_bytes: 40_000,
        max_tokens: None,
        max_lines: None,
        page_bytes: None,
        default_limit: None,
        allowance_up_to: None,
        reads: Reads::Content,
        source: "google-gemini/gemini-cli packages/core/src/config/config.ts (DEFAULT_TRUNCATE_TOOL_OUTPUT_THRESHOLD = 40000 characters); reads: google-gemini/gemini-cli packages/core/src/tools/mcp-tool.ts, transformMcpContentToParts: content only",
    },
    // VS Code sends its product name, "Visual Studio Code" for stable builds (microsoft/vscode
    // src/vs/workbench/contrib/mcp/common/mcpServerRequestHandler.ts). Copilot Chat writes a
    // tool result over 8 KiB to disk and tells the model to read the file
    // (microsoft/vscode-copilot-chat, ConfigKey.Advanced.LargeToolResultsToDiskThreshold).
    Builtin {
        name: "vscode",
        clients: &["Visual Studio Code", "Visual Studio Code - Insiders"],
        max_bytes: 8 * 1024,
        max_tokens: None,
        max_lines: None,
        page_bytes: None,
        default_limit: Some(10),
        allowance_up_to: None,
        reads: Reads::Structured,
        source: "microsoft/vscode-copilot-chat src/platform/configuration/common/configurationService.ts (LargeToolResultsToDiskThreshold = 8 * 1024); reads: microsoft/vscode src/vs/workbench/contrib/mcp/common/mcpLanguageModelToolContribution.ts, McpToolImplementation.invoke: JSON.stringify(structuredContent) in place of the text blocks",
    },
    // Claude Desktop sends "claude-ai" (closed source; its log in
    // modelcontextprotocol/typescript-sdk#179). No published limit; users report results over
    // 1 MiB refused ("Tool result is too large. Maximum size is 1MB"), so the policy's cap,
    // smaller, applies.
    Builtin {
        name: "claude-desktop",
        clients: &["claude-ai"],
        max_bytes: 1 << 20,
        max_tokens: None,
        max_lines: None,
        page_bytes: None,
        default_limit: None,
        allowance_up_to: None,
        reads: Reads::Both,
        source: "no published limit; users report 1 MiB refused (strickvl/mcp-beeminder#2); reads: nothing published: both count",
    },
];

impl Builtin {
    fn profile(&self) -> Profile {
        let mut max_tokens = self.max_tokens;
        if self.name == "claude-code"
            && let Some(tokens) = std::env::var("MAX_MCP_OUTPUT_TOKENS")
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|v| *v > 0)
        {
            // The user raised (or lowered) Claude Code's limit, and the proxy inherited it.
            max_tokens = Some(tokens);
        }
        Profile {
            name: self.name.to_string(),
            clients: self.clients.iter().map(|c| c.to_string()).collect(),
            max_bytes: self.max_bytes,
            max_tokens,
            max_lines: self.max_lines,
            page_bytes: self.page_bytes,
            default_limit: self.default_limit,
            allowance_up_to: self.allowance_up_to,
            reads: self.reads,
            source: self.source.to_string(),
        }
    }
}

/// The built-in profiles.
pub fn builtins() -> Vec<Profile> {
    BUILTINS.iter().map(Builtin::profile).collect()
}

/// The profiles in force: the built-ins with the policy's sections applied.
pub fn profiles(overrides: &[Override]) -> Vec<Profile> {
    let mut profiles = builtins();
    for o in overrides {
        let found = profiles
            .iter_mut()
            .find(|p| p.name == o.name || p.clients.iter().any(|c| c == &o.name));
        let profile = match found {
            Some(profile) => {
                profile.source = format!("the policy's [client.\"{}\"] section", o.name);
                profile
            }
            None => {
                profiles.push(Profile {
                    name: o.name.clone(),
                    clients: vec![o.name.clone()],
                    max_bytes: crate::policy::DEFAULT_MAX_BYTES,
                    max_tokens: None,
                    max_lines: None,
                    page_bytes: None,
                    default_limit: None,
                    allowance_up_to: None,
                    reads: Reads::Both,
                    source: format!("the policy's [client.\"{}\"] section", o.name),
                });
                profiles.last_mut().expect("just pushed")
            }
        };
        if let Some(v) = o.max_bytes {
            profile.max_bytes = v;
        }
        if o.max_tokens.is_some() {
            profile.max_tokens = o.max_tokens;
        }
        if o.max_lines.is_some() {
            profile.max_lines = o.max_lines;
        }
        if o.page_bytes.is_some() {
            profile.page_bytes = o.page_bytes;
        }
        if o.default_limit.is_some() {
            profile.default_limit = o.default_limit;
        }
    }
    profiles
}

/// The profile for a `clientInfo.name` or a profile name (case-insensitive), if any.
pub fn find(profiles: &[Profile], name: &str) -> Option<Profile> {
    let name = name.trim();
    profiles
        .iter()
        .find(|p| {
            p.name.eq_ignore_ascii_case(name)
                || p.clients.iter().any(|c| c.eq_ignore_ascii_case(name))
        })
        .cloned()
}

/// The limits one session's results are held to.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The byte cap (tools without a declared allowance).
    pub bytes: usize,
    pub tokens: Option<usize>,
    pub lines: Option<usize>,
    /// The byte cap of the tools the proxy declares `maxResultSizeChars` on, for a client that
    /// honours it.
    pub allowance: Option<usize>,
    /// The largest page the proxy cuts (automatic pages), when the profile sets one.
    pub page_bytes: Option<usize>,
    /// The profile that set them, for messages (`None`: the policy's own budget).
    pub profile: Option<Arc<str>>,
    /// What the client's model reads of a result: bytes are measured on that.
    pub reads: Reads,
}

impl Limits {
    /// The policy's budget, for an unknown client.
    pub fn bytes_only(bytes: usize) -> Limits {
        Limits {
            bytes,
            tokens: None,
            lines: None,
            allowance: None,
            page_bytes: None,
            profile: None,
            reads: Reads::Both,
        }
    }

    /// The byte cap that applies to a tool; `declared`: the proxy declares the allowance on it.
    pub fn bytes_for(&self, declared: bool) -> usize {
        match (declared, self.allowance) {
            (true, Some(allowance)) => allowance,
            _ => self.bytes,
        }
    }

    /// The byte budget as a message names it: "10240-byte budget for codex", or
    /// "200000-byte budget" when no client profile applies.
    pub fn byte_budget(&self, bytes: usize) -> Budget<'_> {
        Budget {
            amount: bytes,
            unit: "byte",
            profile: self.profile.as_deref(),
        }
    }

    /// The token budget as a message names it.
    pub fn token_budget(&self) -> Option<Budget<'_>> {
        self.tokens.map(|amount| Budget {
            amount,
            unit: "token",
            profile: self.profile.as_deref(),
        })
    }

    /// The line budget as a message names it.
    pub fn line_budget(&self) -> Option<Budget<'_>> {
        self.lines.map(|amount| Budget {
            amount,
            unit: "line",
            profile: self.profile.as_deref(),
        })
    }
}

/// A budget as a message names it.
#[derive(Debug, Clone, Copy)]
pub struct Budget<'a> {
    pub amount: usize,
    unit: &'static str,
    profile: Option<&'a str>,
}

impl Budget<'_> {
    /// As the cap's refusal names it: "200000-byte cap" when no client profile applies.
    pub fn as_cap(&self) -> String {
        match self.profile {
            Some(_) => self.to_string(),
            None => format!("{}-{} cap", self.amount, self.unit),
        }
    }
}

/// "10240-byte budget for codex", "200000-byte budget".
impl fmt::Display for Budget<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{} budget", self.amount, self.unit)?;
        if let Some(profile) = self.profile {
            write!(f, " for {profile}")?;
        }
        Ok(())
    }
}

/// A `--client` name that matches no profile: the error names the known ones.
pub fn unknown(name: &str, profiles: &[Profile]) -> String {
    let known: Vec<String> = profiles.iter().map(|p| p.name.clone()).collect();
    format!(
        "--client {name:?} matches no client profile; known: {} (or add [client.\"{name}\"] to the policy)",
        known.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_section_overrides_or_adds() {
        let overrides = [
            Override {
                name: "codex-mcp-client".into(),
                max_bytes: Some(4096),
                ..Override::default()
            },
            Override {
                name: "my-ide".into(),
                max_tokens: Some(1000),
                ..Override::default()
            },
        ];
        let profiles = profiles(&overrides);
        let codex = find(&profiles, "codex").unwrap();
        assert_eq!(codex.max_bytes, 4096);
        assert_eq!(codex.default_limit, Some(10));
        let mine = find(&profiles, "My-IDE").unwrap();
        assert_eq!(mine.max_tokens, Some(1000));
        assert_eq!(mine.max_bytes, crate::policy::DEFAULT_MAX_BYTES);
        assert!(find(&profiles, "nobody").is_none());
    }

    #[test]
    fn budgets_are_named() {
        let limits = Limits {
            profile: Some("codex".into()),
            ..Limits::bytes_only(10240)
        };
        assert_eq!(
            limits.byte_budget(10240).to_string(),
            "10240-byte budget for codex"
        );
        assert_eq!(
            limits.byte_budget(10240).as_cap(),
            "10240-byte budget for codex"
        );
        let default = Limits::bytes_only(200000);
        assert_eq!(
            default.byte_budget(200000).to_string(),
            "200000-byte budget"
        );
        assert_eq!(default.byte_budget(200000).as_cap(), "200000-byte cap");
    }
}
