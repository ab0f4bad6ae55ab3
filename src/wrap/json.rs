//! `wrap` and `unwrap` for JSON and JSON-with-comments files, edited on a concrete syntax tree
//! (jsonc-parser's `cst`): the entries change, and every other byte of the file — keys, their
//! order, indentation, comments, trailing commas — stays as it was.

use jsonc_parser::ParseOptions;
use jsonc_parser::cst::{CstInputValue, CstObject, CstObjectProp, CstRootNode};
use serde_json::Value;

use super::client::{Client, CommandStyle};
use super::plan::{self, Entry, MARKER, Marker, Plan, Undo};
use super::{Edited, Mode, Outcome, Row, Select, SyntaxError};

/// Edits `text` (a file of `client`'s) as `mode` says.
pub fn edit(
    text: &str,
    client: Client,
    mode: Mode,
    select: &Select,
    launcher: &[String],
) -> Result<Edited, SyntaxError> {
    let root = CstRootNode::parse(text, &options()).map_err(|e| SyntaxError {
        line: e.line_display(),
        column: e.column_display(),
        message: e.kind().to_string(),
    })?;
    let Some(top) = root.object_value() else {
        return Err(SyntaxError {
            line: 1,
            column: 1,
            message: "the file's top level is not a JSON object".into(),
        });
    };
    let mut rows = Vec::new();
    for (scope, servers) in containers(&top, client) {
        for prop in servers.properties() {
            let Some(name) = prop.decoded_name() else {
                continue;
            };
            let label = match &scope {
                Some(project) => format!("{name} (project {project})"),
                None => name.clone(),
            };
            if !select.takes(&name) {
                rows.push(Row {
                    server: label,
                    outcome: Outcome::Left("not selected".into()),
                });
                continue;
            }
            let Some(entry_obj) = prop.object_value() else {
                rows.push(Row {
                    server: label,
                    outcome: Outcome::Left("not an object".into()),
                });
                continue;
            };
            let value = entry_obj.to_serde_value().unwrap_or(Value::Null);
            let entry = read_entry(&value, client);
            let outcome = match mode {
                Mode::Wrap => wrap_entry(&prop, &entry_obj, &entry, client, launcher),
                Mode::Unwrap => unwrap_entry(&prop, &entry_obj, &entry, client),
            };
            rows.push(Row {
                server: label,
                outcome,
            });
        }
    }
    Ok(Edited {
        text: root.to_string(),
        rows,
    })
}

/// JSON with comments and trailing commas (VS Code's and opencode's files have them), and
/// nothing looser: a file its client could not read is not one to edit.
fn options() -> ParseOptions {
    ParseOptions {
        allow_comments: true,
        allow_trailing_commas: true,
        allow_loose_object_property_names: false,
        allow_missing_commas: false,
        allow_single_quoted_strings: false,
        allow_hexadecimal_numbers: false,
        allow_unary_plus_numbers: false,
        allow_bare_decimal_point_numbers: false,
        allow_non_finite_numbers: false,
        allow_extended_string_escapes: false,
    }
}

/// The objects that hold server entries: the top-level one and, for Claude Code's
/// `~/.claude.json`, each project's `mcpServers` (its local scope).
fn containers(top: &CstObject, client: Client) -> Vec<(Option<String>, CstObject)> {
    let mut found = Vec::new();
    if let Some(servers) = top.object_value(client.servers_key()) {
        found.push((None, servers));
    }
    if client == Client::ClaudeCode
        && let Some(projects) = top.object_value("projects")
    {
        for project in projects.properties() {
            if let (Some(path), Some(servers)) = (
                project.decoded_name(),
                project
                    .object_value()
                    .and_then(|p| p.object_value("mcpServers")),
            ) {
                found.push((Some(path), servers));
            }
        }
    }
    found
}

/// What an entry says, as [`plan::plan`] reads it.
fn read_entry(value: &Value, client: Client) -> Entry {
    let mut entry = Entry::default();
    let Some(obj) = value.as_object() else {
        entry.unsupported = Some("not an object".into());
        return entry;
    };
    if let Some(env) = obj.get(client.env_key()).and_then(Value::as_object) {
        entry.env_names = env.keys().cloned().collect();
        entry.marker = env.get(MARKER).and_then(Value::as_str).map(String::from);
    }
    entry.kind = obj.get("type").and_then(Value::as_str).map(String::from);
    let strings = |v: &Value| -> Option<Vec<String>> {
        v.as_array()?
            .iter()
            .map(|w| w.as_str().map(String::from))
            .collect()
    };
    match (client.command_style(), obj.get("command")) {
        (_, None) => {}
        (CommandStyle::StringAndArgs, Some(Value::String(program))) => {
            let mut argv = vec![program.clone()];
            match obj.get("args") {
                None => {}
                Some(args) => match strings(args) {
                    Some(args) => argv.extend(args),
                    None => entry.unsupported = Some("its args are not all strings".into()),
                },
            }
            entry.argv = Some(argv);
        }
        (CommandStyle::Array, Some(command)) => match strings(command) {
            Some(argv) => entry.argv = Some(argv),
            None => entry.unsupported = Some("its command is not an array of strings".into()),
        },
        (CommandStyle::StringAndArgs, Some(_)) => {
            entry.unsupported = Some("its command is not a string".into());
        }
    }
    entry.url = obj
        .get(client.url_key())
        .and_then(Value::as_str)
        .map(String::from);
    if let Some(headers) = obj.get("headers").and_then(Value::as_object) {
        for (name, value) in headers {
            match value.as_str() {
                Some(v) => entry.headers.push((name.clone(), v.to_string())),
                None => entry.unsupported = Some(format!("its header {name} is not a string")),
            }
        }
    }
    if entry.argv.is_none() && entry.unsupported.is_none() {
        entry.unsupported = unsupported_remote(obj, client, entry.url.is_some());
    }
    entry
}

/// Why a remote entry cannot be put behind the proxy, if it cannot.
fn unsupported_remote(
    obj: &serde_json::Map<String, Value>,
    client: Client,
    has_url: bool,
) -> Option<String> {
    let kind = obj.get("type").and_then(Value::as_str);
    if kind == Some("sse") || (client == Client::GeminiCli && !has_url && obj.contains_key("url")) {
        return Some(
            "it uses the legacy SSE transport; mcp-budget --upstream speaks Streamable HTTP".into(),
        );
    }
    if let Some(kind) = kind
        && !matches!(
            kind,
            "http" | "streamable-http" | "streamableHttp" | "remote" | "stdio" | "local"
        )
    {
        return Some(format!("its type {kind:?} is not one mcp-budget can reach"));
    }
    if has_url
        && (obj.contains_key("oauth")
            || obj.contains_key("authProviderType")
            || obj.get("auth").is_some_and(Value::is_object))
    {
        return Some(
            "it signs in with OAuth through the client, which the proxy cannot do for it".into(),
        );
    }
    None
}

fn strings(words: &[String]) -> CstInputValue {
    CstInputValue::Array(
        words
            .iter()
            .map(|w| CstInputValue::String(w.clone()))
            .collect(),
    )
}

fn raw(prop: &CstObjectProp) -> String {
    prop.value().map(|v| v.to_string()).unwrap_or_default()
}

/// Puts `raw` source text as `prop`'s value, byte for byte.
fn set_raw(prop: &CstObjectProp, raw: &str) {
    prop.set_value(CstInputValue::String(String::new()));
    if let Some(lit) = prop.value().and_then(|v| v.as_string_lit()) {
        lit.set_raw_value(raw.to_string());
    }
}

/// Sets an array value, keeping it on several lines when the value it replaces was.
fn set_words(prop: &CstObjectProp, words: &[String], multiline: bool) {
    prop.set_value(strings(words));
    if multiline && let Some(array) = prop.array_value() {
        array.ensure_multiline();
    }
}

fn wrap_entry(
    prop: &CstObjectProp,
    obj: &CstObject,
    entry: &Entry,
    client: Client,
    launcher: &[String],
) -> Outcome {
    let was = entry.argv.clone().map_or_else(
        || entry.url.clone().unwrap_or_default(),
        |argv| plan::shell_words(&argv),
    );
    let plan = plan::plan(entry, client, launcher);
    let (argv, secrets) = match &plan {
        Plan::Leave(reason) => return Outcome::Left(reason.clone()),
        Plan::Stdio { argv } => (argv.clone(), Vec::new()),
        Plan::Remote { argv, secrets, .. } => (argv.clone(), secrets.clone()),
    };
    // An entry on one line is kept whole: the tree would spread it over several.
    let whole = obj.to_string();
    let whole = (!whole.contains('\n')).then(|| Undo::Entry {
        raw: entry_template(&whole, &secrets),
        secrets: secrets.iter().map(|(var, _)| var.clone()).collect(),
    });
    let mut undo = Vec::new();
    let mut edit = || -> Option<()> {
        if let Plan::Remote { .. } = plan {
            if let Some(kind) = obj.get("type") {
                undo.push(Undo::Set {
                    key: "type".into(),
                    raw: raw(&kind),
                });
                kind.set_value(CstInputValue::String(client.stdio_type().into()));
            }
            let url = obj.get(client.url_key())?;
            undo.push(Undo::Rename {
                key: "command".into(),
                from: client.url_key().into(),
                raw: raw(&url),
            });
            let command = match client.command_style() {
                CommandStyle::Array => strings(&argv),
                CommandStyle::StringAndArgs => CstInputValue::String(argv[0].clone()),
            };
            url.replace_with("command", command);
            if let Some(headers) = obj.get("headers") {
                let at = headers.property_index();
                let template = header_template(&raw(&headers), &secrets);
                undo.push(Undo::Removed {
                    key: "headers".into(),
                    at,
                    raw: template,
                    secrets: secrets.iter().map(|(var, _)| var.clone()).collect(),
                    decor: Vec::new(),
                });
                headers.remove();
            }
        }
        let command = obj.get("command")?;
        match client.command_style() {
            CommandStyle::Array => {
                if matches!(plan, Plan::Stdio { .. }) {
                    let old = raw(&command);
                    undo.push(Undo::Set {
                        key: "command".into(),
                        raw: old.clone(),
                    });
                    set_words(&command, &argv, old.contains('\n'));
                }
            }
            CommandStyle::StringAndArgs => {
                if matches!(plan, Plan::Stdio { .. }) {
                    undo.push(Undo::Set {
                        key: "command".into(),
                        raw: raw(&command),
                    });
                    command.set_value(CstInputValue::String(argv[0].clone()));
                }
                match obj.get("args") {
                    Some(args) => {
                        let old = raw(&args);
                        undo.push(Undo::Set {
                            key: "args".into(),
                            raw: old.clone(),
                        });
                        set_words(&args, &argv[1..], old.contains('\n'));
                    }
                    None => {
                        undo.push(Undo::Added {
                            key: "args".into(),
                            if_empty: false,
                        });
                        obj.insert(command.property_index() + 1, "args", strings(&argv[1..]));
                    }
                }
            }
        }
        let mut names: Vec<String> = secrets.iter().map(|(var, _)| var.clone()).collect();
        names.push(MARKER.into());
        let env = obj.get(client.env_key());
        if env.as_ref().and_then(CstObjectProp::object_value).is_none() {
            undo.push(Undo::Added {
                key: client.env_key().into(),
                if_empty: true,
            });
        }
        match env.as_ref().and_then(|e| e.value()).map(|v| v.to_string()) {
            // An environment on one line is kept whole, as an entry is.
            Some(text) if !text.contains('\n') && text.starts_with('{') => {
                undo.push(Undo::Set {
                    key: client.env_key().into(),
                    raw: text,
                });
            }
            _ => undo.push(Undo::Env { names }),
        }
        let undo = match whole.clone() {
            Some(whole) => vec![whole],
            None => std::mem::take(&mut undo),
        };
        let marker = Marker::new(undo).to_text();
        let mut added: Vec<(String, CstInputValue)> = secrets
            .iter()
            .map(|(var, value)| (var.clone(), CstInputValue::String(value.clone())))
            .collect();
        added.push((MARKER.into(), CstInputValue::String(marker)));
        match env.and_then(|e| e.object_value()) {
            Some(env) => {
                for (name, value) in added {
                    env.append(&name, value);
                }
            }
            None => {
                obj.append(client.env_key(), CstInputValue::Object(added));
            }
        }
        Some(())
    };
    let edited = edit();
    // An entry written on one line stays on one line.
    if edited.is_some()
        && whole.is_some()
        && let Some(value) = obj.to_serde_value()
    {
        set_raw(prop, &one_line(&value));
    }
    match edited {
        Some(()) => Outcome::Wrapped {
            was,
            now: plan::shell_words(&argv),
        },
        None => Outcome::Left("its shape changed while it was edited".into()),
    }
}

/// A value on one line, spaced as people write one: `{"a": [1, 2], "b": "c"}`.
fn one_line(value: &Value) -> String {
    match value {
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(one_line).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!(
                    "{}: {}",
                    serde_json::to_string(k).unwrap_or_default(),
                    one_line(v)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

/// An entry's source text with each header value that moved into the environment replaced
/// by `${VAR}`.
fn entry_template(raw_entry: &str, secrets: &[(String, String)]) -> String {
    let Ok(root) = CstRootNode::parse(raw_entry, &options()) else {
        return raw_entry.to_string();
    };
    if let Some(headers) = root.object_value().and_then(|o| o.get("headers")) {
        let template = header_template(&raw(&headers), secrets);
        set_raw(&headers, &template);
    }
    root.to_string()
}

/// The source text of a `headers` object with each value that moved into the environment
/// replaced by `${VAR}`.
fn header_template(raw_headers: &str, secrets: &[(String, String)]) -> String {
    let Ok(root) = CstRootNode::parse(raw_headers, &options()) else {
        return raw_headers.to_string();
    };
    if let Some(obj) = root.object_value() {
        for (prop, (var, _)) in obj.properties().iter().zip(secrets) {
            prop.set_value(CstInputValue::String(format!("${{{var}}}")));
        }
    }
    root.to_string()
}

fn unwrap_entry(prop: &CstObjectProp, obj: &CstObject, entry: &Entry, client: Client) -> Outcome {
    let Some(text) = &entry.marker else {
        return Outcome::Left("not wrapped".into());
    };
    let marker = match Marker::parse(text) {
        Ok(marker) => marker,
        Err(err) => return Outcome::Left(format!("its {MARKER} cannot be read: {err}")),
    };
    // The header values, from the environment as it is now (before it is taken apart).
    let env = obj.get(client.env_key()).and_then(|e| e.object_value());
    let env_value = |name: &str| -> Option<String> {
        env.as_ref()?
            .get(name)?
            .to_serde_value()?
            .as_str()
            .map(String::from)
    };
    let mut filled = Vec::new();
    for undo in &marker.undo {
        if let Undo::Removed { raw, secrets, .. } | Undo::Entry { raw, secrets } = undo {
            let mut text = raw.clone();
            for var in secrets {
                let Some(value) = env_value(var) else {
                    return Outcome::Left(format!(
                        "{var}, which holds one of its header values, is gone from its {}",
                        client.env_key()
                    ));
                };
                let encoded = serde_json::to_string(&value).unwrap_or_default();
                text = text.replace(&format!("\"${{{var}}}\""), &encoded);
            }
            filled.push(text);
        }
    }
    for undo in marker.undo.iter().rev() {
        match undo {
            Undo::Env { names } => {
                if let Some(env) = obj.get(client.env_key()).and_then(|e| e.object_value()) {
                    for name in names {
                        if let Some(prop) = env.get(name) {
                            prop.remove();
                        }
                    }
                }
            }
            Undo::Added { key, if_empty } => {
                if let Some(prop) = obj.get(key) {
                    let kept = *if_empty
                        && prop
                            .object_value()
                            .is_some_and(|o| !o.properties().is_empty());
                    if !kept {
                        prop.remove();
                    }
                }
            }
            Undo::Removed { key, at, .. } => {
                let text = filled.pop().unwrap_or_default();
                let at = (*at).min(obj.properties().len());
                let prop = obj.insert(at, key, CstInputValue::Null);
                set_raw(&prop, &text);
            }
            Undo::Rename { key, from, raw } => {
                if let Some(prop) = obj.get(key)
                    && let Some(new) = prop
                        .replace_with(from, CstInputValue::Null)
                        .and_then(|n| n.as_object_prop())
                {
                    set_raw(&new, raw);
                }
            }
            Undo::Set { key, raw } => match obj.get(key) {
                Some(prop) => set_raw(&prop, raw),
                None => {
                    let prop = obj.append(key, CstInputValue::Null);
                    set_raw(&prop, raw);
                }
            },
            Undo::Entry { .. } => {
                set_raw(prop, &filled.pop().unwrap_or_default());
                break;
            }
            Undo::Order { .. } => {}
        }
    }
    Outcome::Unwrapped {
        now: restored(&marker),
    }
}

/// What the entry runs (or reaches) once unwrapped, read from its marker (the tree, with raw
/// text set into it, is not read again).
fn restored(marker: &Marker) -> String {
    let mut argv: Vec<String> = Vec::new();
    for undo in &marker.undo {
        let value = match undo {
            Undo::Set { key, raw }
            | Undo::Rename {
                key: _,
                from: key,
                raw,
            } => (key.as_str(), serde_json::from_str::<Value>(raw).ok()),
            Undo::Entry { raw, .. } => {
                let entry = serde_json::from_str::<Value>(raw).unwrap_or(Value::Null);
                let program = entry["command"].as_str().map(String::from);
                let url = entry["url"].as_str().or(entry["httpUrl"].as_str());
                match (program, &entry["command"]) {
                    (Some(program), _) => argv.push(program),
                    (None, Value::Array(words)) => {
                        argv.extend(words.iter().filter_map(|w| w.as_str().map(String::from)))
                    }
                    _ => return url.unwrap_or_default().to_string(),
                }
                if let Value::Array(words) = &entry["args"] {
                    argv.extend(words.iter().filter_map(|w| w.as_str().map(String::from)));
                }
                break;
            }
            _ => continue,
        };
        match value {
            ("command", Some(Value::String(program))) => argv.insert(0, program),
            ("command" | "args", Some(Value::Array(words))) => {
                argv.extend(words.iter().filter_map(|w| w.as_str().map(String::from)))
            }
            ("url" | "httpUrl", Some(Value::String(url))) => return url,
            _ => {}
        }
    }
    plan::shell_words(&argv)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wrap(text: &str, client: Client) -> Edited {
        edit(
            text,
            client,
            Mode::Wrap,
            &Select::default(),
            &["mcp-budget".to_string()],
        )
        .expect("parses")
    }

    fn unwrap(text: &str, client: Client) -> Edited {
        edit(text, client, Mode::Unwrap, &Select::default(), &[]).expect("parses")
    }

    #[test]
    fn a_stdio_entry_round_trips_to_the_same_bytes() {
        let text = r#"{
  // the project's servers
  "mcpServers": {
    "fs": {
      "command": "npx",
      "args": [
        "-y",
        "@modelcontextprotocol/server-filesystem",
        "/tmp"
      ],
      "env": { "DEBUG": "1" } // keep me
    },
    "bare": {"command": "my-server"}
  },
  "other": [1, 2, 3]
}
"#;
        let wrapped = wrap(text, Client::ClaudeCode);
        assert!(
            wrapped.text.contains(r#""command": "mcp-budget","#),
            "{}",
            wrapped.text
        );
        assert!(wrapped.text.contains("// keep me"), "{}", wrapped.text);
        let again = wrap(&wrapped.text, Client::ClaudeCode);
        assert_eq!(again.text, wrapped.text, "a second wrap changes nothing");
        let back = unwrap(&wrapped.text, Client::ClaudeCode);
        assert_eq!(back.text, text);
    }

    #[test]
    fn a_remote_entry_moves_its_header_into_env_and_back() {
        let text = r#"{
  "mcpServers": {
    "api": {
      "type": "http",
      "url": "https://mcp.example.com/mcp",
      "headers": {
        "Authorization": "Bearer sk-1"
      }
    }
  }
}"#;
        let wrapped = wrap(text, Client::ClaudeCode);
        let value: Value = serde_json::from_str(&wrapped.text).expect("JSON");
        let entry = &value["mcpServers"]["api"];
        assert_eq!(entry["type"], "stdio");
        assert_eq!(entry["command"], "mcp-budget");
        assert!(!entry["args"].to_string().contains("sk-1"));
        assert_eq!(
            entry["env"]["MCP_BUDGET_HEADER_AUTHORIZATION"],
            "Bearer sk-1"
        );
        assert!(entry.get("headers").is_none());
        let back = unwrap(&wrapped.text, Client::ClaudeCode);
        assert_eq!(back.text, text);
    }
}
