//! The clients whose configuration `wrap` edits: where each keeps its MCP servers, and how it
//! spells an entry — each from the client's own documentation, cited below.

use std::path::{Path, PathBuf};

/// A client whose configuration file `wrap` can edit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// Claude Code, https://code.claude.com/docs/en/mcp: `.mcp.json` (project scope) and
    /// `~/.claude.json` (user scope at the top, local scope under `projects.<path>`), each with
    /// `mcpServers: {NAME: {type?: "stdio", command, args, env} | {type: "http"|"sse", url,
    /// headers}}`. `${VAR}` and `${VAR:-default}` are expanded in command, args, env, url and
    /// headers.
    ClaudeCode,
    /// Claude Desktop, https://modelcontextprotocol.io/quickstart/user:
    /// `claude_desktop_config.json`, `mcpServers: {NAME: {command, args, env}}` (remote servers
    /// are connectors added in the app, not in this file).
    ClaudeDesktop,
    /// Cursor, https://cursor.com/docs/context/mcp: `.cursor/mcp.json` and `~/.cursor/mcp.json`,
    /// `mcpServers: {NAME: {command, args, env, envFile} | {url, headers}}`.
    Cursor,
    /// VS Code, https://code.visualstudio.com/docs/copilot/reference/mcp-configuration:
    /// `.vscode/mcp.json` (JSON with comments), `servers: {NAME: {type: "stdio", command, args,
    /// env, envFile} | {type: "http"|"sse", url, headers}}` beside `inputs`.
    VsCode,
    /// Codex, https://developers.openai.com/codex/mcp (docs/config.md, `mcp_servers`):
    /// `~/.codex/config.toml` (`$CODEX_HOME`), `[mcp_servers.NAME]` with `command`, `args`,
    /// `env`, `env_vars`, `cwd`, or `url` with `bearer_token_env_var`, `http_headers`,
    /// `env_http_headers`.
    Codex,
    /// Gemini CLI, https://github.com/google-gemini/gemini-cli/blob/main/docs/tools/mcp-server.md:
    /// `settings.json` (`~/.gemini/` or `.gemini/`), `mcpServers: {NAME: {command, args, env,
    /// cwd} | {httpUrl, headers} | {url, headers}}` (`url` is the SSE transport).
    GeminiCli,
    /// opencode, https://opencode.ai/docs/mcp-servers/: `opencode.json` (or `.jsonc`; in the
    /// project or `~/.config/opencode/`), `mcp: {NAME: {type: "local", command: [..],
    /// environment} | {type: "remote", url, headers}}`.
    Opencode,
}

/// How an entry names its program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandStyle {
    /// `command` a string, `args` an array.
    StringAndArgs,
    /// `command` an array: the program and its arguments (opencode).
    Array,
}

/// The file syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    /// JSON, or JSON with comments: edited on a concrete syntax tree.
    Json,
    /// TOML: edited with toml_edit.
    Toml,
}

pub const ALL: [Client; 7] = [
    Client::ClaudeCode,
    Client::ClaudeDesktop,
    Client::Cursor,
    Client::VsCode,
    Client::Codex,
    Client::GeminiCli,
    Client::Opencode,
];

impl Client {
    /// The name given to `--client`.
    pub fn name(self) -> &'static str {
        match self {
            Client::ClaudeCode => "claude-code",
            Client::ClaudeDesktop => "claude-desktop",
            Client::Cursor => "cursor",
            Client::VsCode => "vscode",
            Client::Codex => "codex",
            Client::GeminiCli => "gemini-cli",
            Client::Opencode => "opencode",
        }
    }

    pub fn from_name(name: &str) -> Option<Client> {
        ALL.into_iter().find(|c| c.name() == name)
    }

    /// The proxy's client profile for it (`mcp-budget --client`), where there is one.
    pub fn profile(self) -> Option<&'static str> {
        match self {
            // Cursor has no profile of its own (its clientInfo.name gets the policy's budget).
            Client::Cursor => None,
            other => Some(other.name()),
        }
    }

    pub fn syntax(self) -> Syntax {
        match self {
            Client::Codex => Syntax::Toml,
            _ => Syntax::Json,
        }
    }

    /// The key of the servers' table at the top of the file.
    pub fn servers_key(self) -> &'static str {
        match self {
            Client::VsCode => "servers",
            Client::Codex => "mcp_servers",
            Client::Opencode => "mcp",
            _ => "mcpServers",
        }
    }

    /// The entry's environment key.
    pub fn env_key(self) -> &'static str {
        match self {
            Client::Opencode => "environment",
            _ => "env",
        }
    }

    pub fn command_style(self) -> CommandStyle {
        match self {
            Client::Opencode => CommandStyle::Array,
            _ => CommandStyle::StringAndArgs,
        }
    }

    /// The key of a Streamable HTTP server's URL.
    pub fn url_key(self) -> &'static str {
        match self {
            Client::GeminiCli => "httpUrl",
            _ => "url",
        }
    }

    /// The `type` a stdio entry has, when the entry has a `type` at all.
    pub fn stdio_type(self) -> &'static str {
        match self {
            Client::Opencode => "local",
            _ => "stdio",
        }
    }

    /// Where the client keeps its servers, in the order they are looked at: those of the
    /// project (`cwd`) first, then the user's. `--client NAME` edits every one that exists.
    pub fn locations(self, cwd: &Path, home: &Path) -> Vec<PathBuf> {
        let config = std::env::var_os("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .unwrap_or_else(|| home.join(".config"));
        match self {
            Client::ClaudeCode => vec![cwd.join(".mcp.json"), home.join(".claude.json")],
            Client::ClaudeDesktop => {
                if cfg!(target_os = "macos") {
                    vec![home.join("Library/Application Support/Claude/claude_desktop_config.json")]
                } else if cfg!(windows) {
                    let appdata = std::env::var_os("APPDATA")
                        .map(PathBuf::from)
                        .unwrap_or_else(|| home.join("AppData/Roaming"));
                    vec![appdata.join("Claude/claude_desktop_config.json")]
                } else {
                    // No Linux build is published; its community builds use the XDG folder.
                    vec![config.join("Claude/claude_desktop_config.json")]
                }
            }
            Client::Cursor => vec![cwd.join(".cursor/mcp.json"), home.join(".cursor/mcp.json")],
            Client::VsCode => {
                let user = if cfg!(target_os = "macos") {
                    home.join("Library/Application Support/Code/User/mcp.json")
                } else {
                    config.join("Code/User/mcp.json")
                };
                vec![cwd.join(".vscode/mcp.json"), user]
            }
            Client::Codex => {
                let codex = std::env::var_os("CODEX_HOME")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| home.join(".codex"));
                vec![codex.join("config.toml")]
            }
            Client::GeminiCli => vec![
                cwd.join(".gemini/settings.json"),
                home.join(".gemini/settings.json"),
            ],
            Client::Opencode => vec![
                cwd.join("opencode.json"),
                cwd.join("opencode.jsonc"),
                config.join("opencode/opencode.json"),
                config.join("opencode/opencode.jsonc"),
            ],
        }
    }

    /// The client a file belongs to, from its name (and its folder's).
    pub fn of_file(path: &Path) -> Option<Client> {
        let name = path.file_name()?.to_str()?;
        let parent = path
            .parent()
            .and_then(Path::file_name)
            .and_then(|p| p.to_str())
            .unwrap_or("");
        match (parent, name) {
            (_, ".mcp.json" | ".claude.json") => Some(Client::ClaudeCode),
            (_, "claude_desktop_config.json") => Some(Client::ClaudeDesktop),
            (".cursor", "mcp.json") => Some(Client::Cursor),
            (".vscode" | "User", "mcp.json") => Some(Client::VsCode),
            (_, "config.toml") => Some(Client::Codex),
            (".gemini", "settings.json") => Some(Client::GeminiCli),
            (_, "opencode.json" | "opencode.jsonc") => Some(Client::Opencode),
            _ => None,
        }
    }
}

pub fn names() -> String {
    ALL.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
}
