//! What `wrap` does to one server entry, decided from what the entry says (no file syntax here),
//! and the marker a wrapped entry carries so that `unwrap` can undo it from the entry alone.
//!
//! # The marker
//!
//! A wrapped entry's environment holds `MCP_BUDGET_WRAPPED`, a compact JSON object
//! `{"v":1,"undo":[…]}`: the edits that take the entry back, last one first. Each names a key
//! of the entry and keeps the source text it had, byte for byte (`set`: the key's old value;
//! `rename`: the key's old name and value, e.g. `url` where `command` is now; `removed`: a key
//! taken out, with its place; `added`: a key put in; `env`: the variables put into the
//! environment; `order`: the keys' order, for TOML). A header value moved into the
//! environment is kept there only: the removed `headers` text holds `${VAR}` in its place, and
//! `unwrap` puts back the variable's value as it is then (a rotated token survives the trip).
//! An entry (or environment) written on one line is edited as text, key by key, so it stays on
//! one line and `unwrap` undoes the same edits, keeping what the user changed since (the
//! `entry` edit, the whole one-line entry, and `set` of a one-line environment are what an
//! earlier mcp-budget wrote; they are still read). `lead`: how many words of a stdio entry's
//! command line are the launcher's (through `--`); `unwrap` takes those out and keeps the
//! server's own command as it is then.

use serde::{Deserialize, Serialize};

use super::client::{Client, CommandStyle};

/// The environment variable that marks a wrapped entry and holds its undo list.
pub const MARKER: &str = "MCP_BUDGET_WRAPPED";

/// The prefix of the variables that carry an entry's header values.
pub const HEADER_PREFIX: &str = "MCP_BUDGET_HEADER_";

/// The marker's content.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Marker {
    pub v: u32,
    pub undo: Vec<Undo>,
    /// How many words of the wrapped command line (program included) wrap put before the
    /// server's own command, `--` the last of them (a stdio entry only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lead: Option<usize>,
}

/// One edit that takes a wrapped entry back (applied last recorded, first).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Undo {
    /// `key`'s value was replaced; `raw` is its old source text.
    Set { key: String, raw: String },
    /// The key `from` (with the value `raw`) became `key`.
    Rename {
        key: String,
        from: String,
        raw: String,
    },
    /// `key` was put in; with `if_empty`, it goes only when nothing else was put in it since.
    Added {
        key: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        if_empty: bool,
    },
    /// `key` was taken out from position `at`; `raw` is its source text, where each variable
    /// of `secrets` stands as the string `${VAR}` for the header value now in the environment.
    Removed {
        key: String,
        at: usize,
        raw: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        secrets: Vec<String>,
        /// TOML: the whitespace and comments around the key and its value (key prefix, key
        /// suffix, value prefix, value suffix).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        decor: Vec<String>,
    },
    /// The whole entry was written on one line, which an edit would spread over several: its
    /// source text, with `${VAR}` for the header values now in `secrets`' variables.
    Entry {
        raw: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        secrets: Vec<String>,
    },
    /// These variables were put into the entry's environment.
    Env { names: Vec<String> },
    /// The entry's keys, in the order they had (TOML tables have no insertion at a place).
    Order { keys: Vec<String> },
}

impl Marker {
    pub fn new(undo: Vec<Undo>) -> Marker {
        Marker {
            v: 1,
            undo,
            lead: None,
        }
    }

    /// The marker of a stdio entry whose wrapped command line starts with `lead` words of the
    /// launcher's (through `--`), then the server's command.
    pub fn with_lead(mut self, lead: usize) -> Marker {
        self.lead = Some(lead);
        self
    }

    pub fn to_text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn parse(text: &str) -> Result<Marker, String> {
        let marker: Marker = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if marker.v != 1 {
            return Err(format!(
                "version {} (this mcp-budget reads version 1)",
                marker.v
            ));
        }
        Ok(marker)
    }
}

/// What a format reads from an entry, for [`plan`].
#[derive(Debug, Default, Clone)]
pub struct Entry {
    /// The program and its arguments, when the entry has a command.
    pub argv: Option<Vec<String>>,
    /// The Streamable HTTP URL (the client's `url_key`).
    pub url: Option<String>,
    /// The entry's `type`, if any.
    pub kind: Option<String>,
    /// Headers with their values as written.
    pub headers: Vec<(String, String)>,
    /// Headers whose value the client takes from its own environment (Codex's
    /// `env_http_headers` and `bearer_token_env_var`): the header, the value with `${VAR}`,
    /// and the variable.
    pub env_headers: Vec<(String, String, String)>,
    /// The names already in the entry's environment.
    pub env_names: Vec<String>,
    /// The marker's text, when the entry is wrapped.
    pub marker: Option<String>,
    /// Why the entry is no server `wrap` can put the proxy in front of, if it is not.
    pub unsupported: Option<String>,
    /// How the entry signs in through its client (OAuth), which the proxy does instead.
    pub sign_in: Option<SignIn>,
}

/// A remote entry's sign-in through its client, as the proxy takes it over.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SignIn {
    /// The keys that configure it (taken out of the wrapped entry, put back by `unwrap`).
    pub keys: Vec<String>,
    /// A client registered ahead of time, and its secret (moved into the environment).
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    /// The loopback port its redirect was registered with (Claude Code's `callbackPort`).
    pub redirect_port: Option<u16>,
}

/// The variable that carries a wrapped entry's OAuth client secret.
pub const CLIENT_SECRET_VAR: &str = "MCP_BUDGET_CLIENT_SECRET";

/// What `wrap` does with one entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// A stdio entry: it runs `argv` (the proxy, then `--` and the server's command).
    Stdio { argv: Vec<String> },
    /// A remote entry becomes a stdio entry running `argv` (the proxy with `--upstream`);
    /// `secrets` go into its environment; `pass` are variables of the client's environment the
    /// proxy needs (Codex passes a stdio server only those it is told to). `sign_in`: the keys
    /// of the client's own sign-in, taken out, and the variable its client secret went to.
    Remote {
        argv: Vec<String>,
        secrets: Vec<(String, String)>,
        pass: Vec<String>,
        sign_in: Option<(Vec<String>, Option<String>)>,
    },
    /// Left as it is, with the reason.
    Leave(String),
}

/// How the wrapped entry starts the proxy: `mcp-budget`, or the launcher that ran this one.
pub fn plan(entry: &Entry, client: Client, launcher: &[String]) -> Plan {
    if entry.marker.is_some() {
        return Plan::Leave("already wrapped".into());
    }
    if let Some(reason) = &entry.unsupported {
        return Plan::Leave(reason.clone());
    }
    let mut argv: Vec<String> = launcher.to_vec();
    if let Some(profile) = client.profile() {
        argv.extend(["--client".to_string(), profile.to_string()]);
    }
    if let Some(command) = &entry.argv {
        let Some(program) = command.first() else {
            return Plan::Leave("its command is empty".into());
        };
        if runs_the_proxy(command) {
            return Plan::Leave(format!("it already runs mcp-budget ({program})"));
        }
        argv.push("--".into());
        argv.extend(command.iter().cloned());
        return Plan::Stdio { argv };
    }
    let Some(url) = &entry.url else {
        return Plan::Leave(match client.command_style() {
            CommandStyle::Array => "it has neither a command nor a url".into(),
            CommandStyle::StringAndArgs => format!(
                "it has neither a command nor a {} (a server of a kind mcp-budget does not reach)",
                client.url_key()
            ),
        });
    };
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Plan::Leave(format!(
            "its url {url:?} is not http(s) (or is made by the client, which the proxy cannot do)"
        ));
    }
    argv.extend(["--upstream".to_string(), url.clone()]);
    let mut secrets = Vec::new();
    let mut taken: Vec<String> = entry.env_names.clone();
    for (name, value) in &entry.headers {
        let var = free_name(&format!("{HEADER_PREFIX}{}", env_word(name)), &taken);
        taken.push(var.clone());
        argv.extend([
            "--upstream-header".to_string(),
            format!("{name}: ${{{var}}}"),
        ]);
        secrets.push((var, value.clone()));
    }
    let mut pass = Vec::new();
    for (name, value, var) in &entry.env_headers {
        argv.extend(["--upstream-header".to_string(), format!("{name}: {value}")]);
        pass.push(var.clone());
    }
    let sign_in = entry.sign_in.as_ref().map(|sign_in| {
        if let Some(id) = &sign_in.client_id {
            argv.extend(["--upstream-client-id".to_string(), id.clone()]);
        }
        if let Some(port) = sign_in.redirect_port {
            argv.extend(["--upstream-redirect-port".to_string(), port.to_string()]);
        }
        let var = sign_in.client_secret.as_ref().map(|secret| {
            let var = free_name(CLIENT_SECRET_VAR, &taken);
            taken.push(var.clone());
            argv.extend(["--upstream-client-secret-env".to_string(), var.clone()]);
            secrets.push((var.clone(), secret.clone()));
            var
        });
        (sign_in.keys.clone(), var)
    });
    Plan::Remote {
        argv,
        secrets,
        pass,
        sign_in,
    }
}

/// What to sign in to once (`mcp-budget login URL [its client flags]`), for a remote entry
/// that sends no `Authorization` header of its own.
pub fn login_url(entry: &Entry, plan: &Plan) -> Option<String> {
    let authorized = entry
        .headers
        .iter()
        .map(|(name, _)| name)
        .chain(entry.env_headers.iter().map(|(name, _, _)| name))
        .any(|name| name.eq_ignore_ascii_case("authorization"));
    let url = entry.url.as_ref().filter(|_| !authorized)?;
    let Plan::Remote { argv, .. } = plan else {
        return None;
    };
    // The sign-in flags the wrapped entry runs with go with it.
    let mut words = vec![url.clone()];
    let mut secret = None;
    let mut rest = argv.iter();
    while let Some(word) = rest.next() {
        if matches!(
            word.as_str(),
            "--upstream-client-id" | "--upstream-client-secret-env" | "--upstream-redirect-port"
        ) {
            words.push(word.clone());
            let value = rest.next().cloned();
            if word == "--upstream-client-secret-env" {
                secret.clone_from(&value);
            }
            words.extend(value);
        }
    }
    let mut text = shell_words(&words);
    if let Some(var) = secret {
        text.push_str(&format!("  (with {var} set to the client's secret)"));
    }
    Some(text)
}

/// The server's own command in a wrapped command line: the words after the launcher's (the
/// first `lead` when they still end with `--`, else those after the first `--`); `None` when
/// the line no longer runs the server through the proxy.
pub fn server_words(argv: &[String], lead: Option<usize>) -> Option<&[String]> {
    let after = match lead {
        Some(n) if n >= 1 && argv.get(n - 1).is_some_and(|w| w == "--") => n,
        _ => argv.iter().position(|w| w == "--")? + 1,
    };
    let words = argv.get(after..)?;
    (!words.is_empty()).then_some(words)
}

/// What `unwrap` does with a stdio entry's command line.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// The server's command is still the one wrap found: its old source text goes back.
    Raw,
    /// The server's command was changed since: these words (the launcher's taken out).
    New(Vec<String>),
    /// The command line no longer runs the server through the proxy: left as it is.
    Keep,
}

/// Decides [`Command`] from the server's command as wrap found it (`was`, from the marker) and
/// the wrapped command line as it is now (`now`).
pub fn decide(was: Option<Vec<String>>, now: Option<Vec<String>>, lead: Option<usize>) -> Command {
    let Some(was) = was else {
        return Command::Raw;
    };
    let Some(now) = now else {
        return Command::Keep;
    };
    match server_words(&now, lead) {
        Some(server) if server == was.as_slice() => Command::Raw,
        Some(server) => Command::New(server.to_vec()),
        None => Command::Keep,
    }
}

/// Whether a command line already starts mcp-budget (by path, or through uvx, npx or pipx).
fn runs_the_proxy(argv: &[String]) -> bool {
    let is_proxy = |word: &str| {
        let base = word.rsplit(['/', '\\']).next().unwrap_or(word);
        let base = base.strip_suffix(".exe").unwrap_or(base);
        // The command, or the package: `mcp-budget` on npm, `mcp-budget-proxy` on PyPI.
        ["mcp-budget", "mcp-budget-proxy"].iter().any(|name| {
            base.strip_prefix(name).is_some_and(|rest| {
                rest.is_empty() || rest.starts_with('@') || rest.starts_with("==")
            })
        })
    };
    let Some(first) = argv.first() else {
        return false;
    };
    if is_proxy(first) {
        return true;
    }
    let base = first.rsplit(['/', '\\']).next().unwrap_or(first);
    matches!(base, "uvx" | "npx" | "pipx" | "bunx")
        && argv
            .iter()
            .skip(1)
            .find(|w| !w.starts_with('-') && *w != "run")
            .is_some_and(|w| is_proxy(w))
}

/// A header name as an environment variable's word: upper case, `_` for anything else.
fn env_word(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// `base`, or `base_2`, `base_3`… when it is taken.
fn free_name(base: &str, taken: &[String]) -> String {
    if !taken.iter().any(|t| t == base) {
        return base.to_string();
    }
    (2..)
        .map(|n| format!("{base}_{n}"))
        .find(|name| !taken.iter().any(|t| t == name))
        .unwrap_or_else(|| base.to_string())
}

/// The text a wrapped entry's command line shows, for the table.
pub fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|w| {
            if !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=@+,%".contains(c))
            {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &[&str]) -> Vec<String> {
        s.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn a_stdio_entry_runs_the_proxy_then_dashes_then_its_command() {
        let entry = Entry {
            argv: Some(words(&[
                "npx",
                "-y",
                "@modelcontextprotocol/server-filesystem",
                "/tmp",
            ])),
            ..Entry::default()
        };
        let plan = plan(&entry, Client::ClaudeCode, &words(&["mcp-budget"]));
        assert_eq!(
            plan,
            Plan::Stdio {
                argv: words(&[
                    "mcp-budget",
                    "--client",
                    "claude-code",
                    "--",
                    "npx",
                    "-y",
                    "@modelcontextprotocol/server-filesystem",
                    "/tmp"
                ])
            }
        );
    }

    #[test]
    fn header_values_go_to_the_environment_never_to_the_arguments() {
        let entry = Entry {
            url: Some("https://mcp.example.com/mcp".into()),
            headers: vec![("Authorization".into(), "Bearer sk-secret".into())],
            env_names: vec!["MCP_BUDGET_HEADER_AUTHORIZATION".into()],
            ..Entry::default()
        };
        let Plan::Remote { argv, secrets, .. } =
            plan(&entry, Client::Cursor, &words(&["mcp-budget"]))
        else {
            panic!("not a remote plan");
        };
        assert!(!argv.iter().any(|w| w.contains("sk-secret")), "{argv:?}");
        assert_eq!(
            argv,
            words(&[
                "mcp-budget",
                "--upstream",
                "https://mcp.example.com/mcp",
                "--upstream-header",
                "Authorization: ${MCP_BUDGET_HEADER_AUTHORIZATION_2}"
            ])
        );
        assert_eq!(
            secrets,
            vec![(
                "MCP_BUDGET_HEADER_AUTHORIZATION_2".to_string(),
                "Bearer sk-secret".to_string()
            )]
        );
    }

    #[test]
    fn an_entry_that_already_runs_the_proxy_is_left() {
        for argv in [
            &["mcp-budget", "--", "node", "s.js"][..],
            &["/usr/local/bin/mcp-budget", "node"],
            &["uvx", "mcp-budget@0.1.0", "node"],
            &[
                "uvx",
                "--from",
                "mcp-budget-proxy==0.1.0",
                "mcp-budget",
                "node",
            ],
            &[
                "pipx",
                "run",
                "--spec",
                "mcp-budget-proxy==0.1.0",
                "mcp-budget",
            ],
            &["npx", "-y", "mcp-budget", "node"],
        ] {
            let entry = Entry {
                argv: Some(words(argv)),
                ..Entry::default()
            };
            assert!(
                matches!(
                    plan(&entry, Client::Cursor, &words(&["mcp-budget"])),
                    Plan::Leave(_)
                ),
                "{argv:?}"
            );
        }
        let entry = Entry {
            argv: Some(words(&["npx", "-y", "mcp-budget-other"])),
            ..Entry::default()
        };
        assert!(matches!(
            plan(&entry, Client::Cursor, &words(&["mcp-budget"])),
            Plan::Stdio { .. }
        ));
    }

    #[test]
    fn the_marker_reads_back_what_it_wrote() {
        let marker = Marker::new(vec![
            Undo::Set {
                key: "command".into(),
                raw: "\"npx\"".into(),
            },
            Undo::Added {
                key: "env".into(),
                if_empty: true,
            },
            Undo::Env {
                names: vec![MARKER.into()],
            },
        ]);
        assert_eq!(Marker::parse(&marker.to_text()), Ok(marker));
        assert!(Marker::parse(r#"{"v":2,"undo":[]}"#).is_err());
    }
}
