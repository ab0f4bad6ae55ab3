//! `wrap` and `unwrap` for JSON and JSON-with-comments files, edited on a concrete syntax tree
//! (jsonc-parser's `cst`): the entries change, and every other byte of the file — keys, their
//! order, indentation, comments, trailing commas — stays as it was. An entry written on one
//! line is edited as text instead ([`super::line`]), so that it stays on one line.

use jsonc_parser::cst::{CstArray, CstInputValue, CstObject, CstObjectProp, CstRootNode};
use serde_json::Value;

use super::client::{Client, CommandStyle};
use super::line::{Line, options};
use super::mask;
use super::plan::{self, Command, Entry, MARKER, Marker, Plan, Undo};
use super::remote;
use super::twice::duplicates;
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
        message: format!("{}: correct it there, then run again", e.kind()),
    })?;
    duplicates(text, client)?;
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
    match obj.get(client.env_key()) {
        Some(Value::Object(env)) => {
            entry.env_names = env.keys().cloned().collect();
            entry.marker = env.get(MARKER).and_then(Value::as_str).map(String::from);
        }
        Some(_) => entry.unsupported = Some(format!("its {} is not an object", client.env_key())),
        None => {}
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
        entry.unsupported = remote::unsupported(obj, client, entry.url.is_some());
    }
    if entry.argv.is_none() && entry.unsupported.is_none() && entry.url.is_some() {
        match remote::sign_in(obj) {
            Ok(sign_in) => entry.sign_in = sign_in,
            Err(why) => entry.unsupported = Some(why),
        }
    }
    entry
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

/// A JSON string's source text.
fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}

/// A value's source text, parsed.
fn parsed(raw: &str) -> Option<Value> {
    CstRootNode::parse(raw, &options())
        .ok()?
        .value()?
        .to_serde_value()
}

/// A value to write into an entry.
enum New {
    Str(String),
    Words(Vec<String>),
    /// Source text, byte for byte.
    Raw(String),
}

impl New {
    /// The value's source text on one line.
    fn text(&self) -> String {
        match self {
            New::Str(s) => quoted(s),
            New::Words(words) => one_line(&Value::Array(
                words.iter().map(|w| Value::String(w.clone())).collect(),
            )),
            New::Raw(raw) => raw.clone(),
        }
    }

    fn input(&self) -> CstInputValue {
        match self {
            New::Str(s) => CstInputValue::String(s.clone()),
            New::Words(words) => strings(words),
            New::Raw(_) => CstInputValue::Null,
        }
    }
}

/// The edits `wrap` and `unwrap` make to an entry: on the syntax tree ([`Tree`]), or on the
/// text of an entry written on one line ([`Flat`]).
trait Ops {
    /// A key's value, as written.
    fn raw(&self, key: &str) -> Option<String>;
    fn index(&self, key: &str) -> Option<usize>;
    /// Sets a key's value; a key not there is put in at the end.
    fn set(&mut self, key: &str, value: New);
    fn rename(&mut self, key: &str, to: &str, value: New) -> bool;
    fn insert(&mut self, at: usize, key: &str, value: New);
    /// Takes a key out; what [`Ops::restore`] needs to put it back where it was.
    fn remove(&mut self, key: &str) -> Vec<String>;
    fn restore(&mut self, at: usize, key: &str, raw: &str, removal: &[String]);
    /// Adds variables to the environment `key` (made when there is none).
    fn env_add(&mut self, key: &str, vars: &[(String, String)]);
    fn env_remove(&mut self, key: &str, names: &[String]);

    /// A key's value, parsed.
    fn value(&self, key: &str) -> Option<Value> {
        parsed(&self.raw(key)?)
    }
}

/// `vars` added at the end of a one-line object's text.
fn line_add(text: &str, vars: &[(String, String)]) -> Option<String> {
    let mut line = Line::new(text)?;
    for (name, value) in vars {
        let at = line.props().len();
        line.insert(at, name, &quoted(value));
    }
    Some(line.text)
}

/// `names` taken out of a one-line object's text.
fn line_remove(text: &str, names: &[String]) -> Option<String> {
    let mut line = Line::new(text)?;
    for name in names {
        line.remove(name);
    }
    Some(line.text)
}

/// An entry written over several lines: edited on the tree.
struct Tree<'a> {
    obj: &'a CstObject,
}

impl Tree<'_> {
    fn put(&self, prop: &CstObjectProp, value: &New, was_multiline: bool) {
        match value {
            New::Words(words) => set_words(prop, words, was_multiline),
            New::Raw(raw) => set_raw(prop, raw),
            other => prop.set_value(other.input()),
        }
    }
}

impl Ops for Tree<'_> {
    fn raw(&self, key: &str) -> Option<String> {
        self.obj.get(key).map(|p| raw(&p))
    }

    fn index(&self, key: &str) -> Option<usize> {
        self.obj.get(key).map(|p| p.property_index())
    }

    fn set(&mut self, key: &str, value: New) {
        match self.obj.get(key) {
            Some(prop) => {
                let multiline = raw(&prop).contains('\n');
                self.put(&prop, &value, multiline);
            }
            None => {
                let prop = self.obj.append(key, value.input());
                if let New::Raw(raw) = &value {
                    set_raw(&prop, raw);
                }
            }
        }
    }

    fn rename(&mut self, key: &str, to: &str, value: New) -> bool {
        let Some(prop) = self.obj.get(key) else {
            return false;
        };
        let Some(new) = prop
            .replace_with(to, value.input())
            .and_then(|n| n.as_object_prop())
        else {
            return false;
        };
        if let New::Raw(raw) = &value {
            set_raw(&new, raw);
        }
        true
    }

    fn insert(&mut self, at: usize, key: &str, value: New) {
        let at = at.min(self.obj.properties().len());
        let prop = self.obj.insert(at, key, value.input());
        if let New::Raw(raw) = &value {
            set_raw(&prop, raw);
        }
    }

    fn remove(&mut self, key: &str) -> Vec<String> {
        if let Some(prop) = self.obj.get(key) {
            prop.remove();
        }
        Vec::new()
    }

    fn restore(&mut self, at: usize, key: &str, raw: &str, _removal: &[String]) {
        self.insert(at, key, New::Raw(raw.to_string()));
    }

    fn env_add(&mut self, key: &str, vars: &[(String, String)]) {
        let Some(env) = self.obj.get(key) else {
            let added = vars
                .iter()
                .map(|(name, value)| (name.clone(), CstInputValue::String(value.clone())))
                .collect();
            self.obj.append(key, CstInputValue::Object(added));
            return;
        };
        // An environment on one line stays on one line.
        let text = raw(&env);
        if !text.contains('\n')
            && let Some(new) = line_add(&text, vars)
        {
            set_raw(&env, &new);
        } else if let Some(env) = env.object_value() {
            for (name, value) in vars {
                env.append(name, CstInputValue::String(value.clone()));
            }
        }
    }

    fn env_remove(&mut self, key: &str, names: &[String]) {
        let Some(env) = self.obj.get(key) else { return };
        let text = raw(&env);
        if !text.contains('\n')
            && let Some(new) = line_remove(&text, names)
        {
            set_raw(&env, &new);
        } else if let Some(env) = env.object_value() {
            for name in names {
                if let Some(prop) = env.get(name) {
                    prop.remove();
                }
            }
        }
    }
}

/// An entry written on one line: edited as text.
struct Flat {
    line: Line,
}

impl Ops for Flat {
    fn raw(&self, key: &str) -> Option<String> {
        self.line.raw(key)
    }

    fn index(&self, key: &str) -> Option<usize> {
        self.line.index(key)
    }

    fn set(&mut self, key: &str, value: New) {
        self.line.set(key, &value.text());
    }

    fn rename(&mut self, key: &str, to: &str, value: New) -> bool {
        self.line.rename(key, to, &value.text())
    }

    fn insert(&mut self, at: usize, key: &str, value: New) {
        self.line.insert(at, key, &value.text());
    }

    fn remove(&mut self, key: &str) -> Vec<String> {
        self.line.remove(key).unwrap_or_default()
    }

    fn restore(&mut self, at: usize, key: &str, raw: &str, removal: &[String]) {
        self.line.restore(at, key, raw, removal);
    }

    fn env_add(&mut self, key: &str, vars: &[(String, String)]) {
        match self.line.raw(key) {
            Some(text) => {
                if let Some(new) = line_add(&text, vars) {
                    self.line.set(key, &new);
                }
            }
            None => {
                let at = self.line.props().len();
                let env = line_add("{}", vars).unwrap_or_else(|| "{}".into());
                self.line.insert(at, key, &env);
            }
        }
    }

    fn env_remove(&mut self, key: &str, names: &[String]) {
        if let Some(new) = self.line.raw(key).and_then(|t| line_remove(&t, names)) {
            self.line.set(key, &new);
        }
    }
}

/// Runs `edit` on the entry `obj` (the value of `prop`): on the tree, or, for an entry written
/// on one line, on its text, put back as the entry's source text when `edit` succeeds.
fn on_entry<T>(
    prop: &CstObjectProp,
    obj: &CstObject,
    edit: impl FnOnce(&mut dyn Ops) -> Option<T>,
) -> Option<(T, String)> {
    let whole = obj.to_string();
    if whole.contains('\n') {
        let done = edit(&mut Tree { obj })?;
        return Some((done, obj.to_string()));
    }
    let mut flat = Flat {
        line: Line::new(&whole)?,
    };
    let done = edit(&mut flat)?;
    set_raw(prop, &flat.line.text);
    Some((done, flat.line.text))
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
    let argv = match &plan {
        Plan::Leave(reason) => return Outcome::Left(reason.clone()),
        Plan::Stdio { argv } | Plan::Remote { argv, .. } => argv.clone(),
    };
    match on_entry(prop, obj, |ops| wrap_with(ops, entry, &plan, client)) {
        Some(_) => Outcome::Wrapped {
            was,
            now: plan::shell_words(&argv),
            login: plan::login_url(entry, &plan),
        },
        None => Outcome::Left("its shape changed while it was edited".into()),
    }
}

/// Wrap's edits of one entry, each recorded in the marker it puts into the environment.
fn wrap_with(ops: &mut dyn Ops, entry: &Entry, plan: &Plan, client: Client) -> Option<()> {
    let (argv, secrets) = match plan {
        Plan::Leave(_) => return None,
        Plan::Stdio { argv } => (argv.clone(), Vec::new()),
        Plan::Remote { argv, secrets, .. } => (argv.clone(), secrets.clone()),
    };
    let program = argv.first()?.clone();
    // What the edits need is there before the first one is made: the tree is edited in place.
    let needs = match plan {
        Plan::Remote { .. } => client.url_key(),
        _ => "command",
    };
    ops.raw(needs)?;
    let mut undo = Vec::new();
    if let Plan::Remote { .. } = plan {
        if let Some(kind) = ops.raw("type") {
            undo.push(Undo::Set {
                key: "type".into(),
                raw: kind,
            });
            ops.set("type", New::Str(client.stdio_type().into()));
        }
        let url = ops.raw(client.url_key())?;
        undo.push(Undo::Rename {
            key: "command".into(),
            from: client.url_key().into(),
            raw: url,
        });
        let command = match client.command_style() {
            CommandStyle::Array => New::Words(argv.clone()),
            CommandStyle::StringAndArgs => New::Str(program.clone()),
        };
        if !ops.rename(client.url_key(), "command", command) {
            return None;
        }
        let (sign_in_keys, secret_var) = match plan {
            Plan::Remote {
                sign_in: Some((keys, var)),
                ..
            } => (keys.as_slice(), var.as_deref()),
            _ => (&[][..], None),
        };
        let header_secrets: Vec<(String, String)> = secrets
            .iter()
            .filter(|(var, _)| Some(var.as_str()) != secret_var)
            .cloned()
            .collect();
        if let Some(headers) = ops.raw("headers") {
            let at = ops.index("headers")?;
            let template = header_template(&headers, &header_secrets);
            let removal = ops.remove("headers");
            undo.push(Undo::Removed {
                key: "headers".into(),
                at,
                raw: template,
                secrets: header_secrets.iter().map(|(var, _)| var.clone()).collect(),
                decor: removal,
            });
        }
        // The client's own sign-in goes: the proxy signs in instead.
        for key in sign_in_keys {
            let Some(raw) = ops.raw(key) else { continue };
            let at = ops.index(key)?;
            let (raw, secrets) = match secret_var {
                Some(var) if key == "oauth" => (secret_template(&raw, var), vec![var.to_string()]),
                _ => (raw, Vec::new()),
            };
            let removal = ops.remove(key);
            undo.push(Undo::Removed {
                key: key.clone(),
                at,
                raw,
                secrets,
                decor: removal,
            });
        }
    }
    let command = ops.raw("command")?;
    let stdio = matches!(plan, Plan::Stdio { .. });
    match client.command_style() {
        CommandStyle::Array => {
            if stdio {
                undo.push(Undo::Set {
                    key: "command".into(),
                    raw: command,
                });
                ops.set("command", New::Words(argv.clone()));
            }
        }
        CommandStyle::StringAndArgs => {
            if stdio {
                undo.push(Undo::Set {
                    key: "command".into(),
                    raw: command,
                });
                ops.set("command", New::Str(program));
            }
            let words = New::Words(argv.get(1..).unwrap_or_default().to_vec());
            match ops.raw("args") {
                Some(old) => {
                    undo.push(Undo::Set {
                        key: "args".into(),
                        raw: old,
                    });
                    ops.set("args", words);
                }
                None => {
                    undo.push(Undo::Added {
                        key: "args".into(),
                        if_empty: false,
                    });
                    let at = ops.index("command")? + 1;
                    ops.insert(at, "args", words);
                }
            }
        }
    }
    let mut names: Vec<String> = secrets.iter().map(|(var, _)| var.clone()).collect();
    names.push(MARKER.into());
    if ops.raw(client.env_key()).is_none() {
        undo.push(Undo::Added {
            key: client.env_key().into(),
            if_empty: true,
        });
    }
    undo.push(Undo::Env { names });
    let mut marker = Marker::new(undo);
    if let (true, Some(server)) = (stdio, &entry.argv) {
        marker = marker.with_lead(argv.len().saturating_sub(server.len()));
    }
    let mut added = secrets;
    added.push((MARKER.into(), marker.to_text()));
    ops.env_add(client.env_key(), &added);
    Some(())
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
                .map(|(k, v)| format!("{}: {}", quoted(k), one_line(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
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

/// An `oauth` object's source text with its `clientSecret` as the string `${var}`.
fn secret_template(raw_oauth: &str, var: &str) -> String {
    let Ok(root) = CstRootNode::parse(raw_oauth, &options()) else {
        return raw_oauth.to_string();
    };
    if let Some(prop) = root.object_value().and_then(|obj| obj.get("clientSecret")) {
        prop.set_value(CstInputValue::String(format!("${{{var}}}")));
    }
    root.to_string()
}

/// `template` with the string `"${VAR}"` of each of `secrets` replaced by the variable's
/// value in `env`.
fn fill(
    template: &str,
    secrets: &[String],
    env: Option<&Value>,
    env_key: &str,
) -> Result<String, String> {
    let mut text = template.to_string();
    for var in secrets {
        let Some(value) = env.and_then(|e| e.get(var)).and_then(Value::as_str) else {
            return Err(format!(
                "{var}, which holds one of its header values, is gone from its {env_key}"
            ));
        };
        text = text.replace(&format!("\"${{{var}}}\""), &quoted(value));
    }
    Ok(text)
}

fn unwrap_entry(prop: &CstObjectProp, obj: &CstObject, entry: &Entry, client: Client) -> Outcome {
    let Some(text) = &entry.marker else {
        return Outcome::Left("not wrapped".into());
    };
    let marker = match Marker::parse(text) {
        Ok(marker) => marker,
        Err(err) => return Outcome::Left(format!("its {MARKER} cannot be read: {err}")),
    };
    // An earlier mcp-budget kept a one-line entry whole.
    if let Some(Undo::Entry {
        raw: whole,
        secrets,
    }) = marker.undo.iter().find(|u| matches!(u, Undo::Entry { .. }))
    {
        let env = obj.get(client.env_key()).and_then(|e| parsed(&raw(&e)));
        return match fill(whole, secrets, env.as_ref(), client.env_key()) {
            Ok(text) => {
                set_raw(prop, &text);
                Outcome::Unwrapped {
                    now: describe(&text, client),
                }
            }
            Err(reason) => Outcome::Left(reason),
        };
    }
    let mut refused = None;
    let done = on_entry(prop, obj, |ops| match unwrap_with(ops, &marker, client) {
        Ok(()) => Some(()),
        Err(reason) => {
            refused = Some(reason);
            None
        }
    });
    match (done, refused) {
        (Some(((), text)), _) => Outcome::Unwrapped {
            now: describe(&text, client),
        },
        (None, Some(reason)) => Outcome::Left(reason),
        (None, None) => Outcome::Left("its shape changed since it was wrapped".into()),
    }
}

/// A command line's words as an entry holds them: `command` (a string, or for opencode an
/// array) and `args`.
fn command_words(command: &str, args: Option<&str>) -> Option<Vec<String>> {
    let words = |v: &Value| -> Option<Vec<String>> {
        match v {
            Value::String(s) => Some(vec![s.clone()]),
            Value::Array(items) => items.iter().map(|w| w.as_str().map(String::from)).collect(),
            _ => None,
        }
    };
    let mut argv = words(&parsed(command)?)?;
    if let Some(args) = args {
        argv.extend(words(&parsed(args)?)?);
    }
    Some(argv)
}

/// Unwrap's edits of one entry: those its marker records, undone last first. Everything it
/// needs is read before anything changes; the reason, when it cannot.
fn unwrap_with(ops: &mut dyn Ops, marker: &Marker, client: Client) -> Result<(), String> {
    let env_key = client.env_key();
    // The header values, from the environment as it is now (before it is taken apart).
    let env = ops.value(env_key);
    let mut filled = Vec::new();
    for undo in &marker.undo {
        if let Undo::Removed { raw, secrets, .. } = undo {
            filled.push(fill(raw, secrets, env.as_ref(), env_key)?);
        }
    }
    // A stdio entry: the server's own command as it is now, the launcher's words taken out.
    let command = if marker.undo.iter().any(|u| matches!(u, Undo::Rename { .. })) {
        Command::Raw
    } else {
        let old = |key: &str| {
            marker.undo.iter().find_map(|u| match u {
                Undo::Set { key: k, raw } if k == key => Some(raw.clone()),
                _ => None,
            })
        };
        let was = old("command").and_then(|c| command_words(&c, old("args").as_deref()));
        let now = ops
            .raw("command")
            .and_then(|c| command_words(&c, ops.raw("args").as_deref()));
        plan::decide(was, now, marker.lead)
    };
    for undo in marker.undo.iter().rev() {
        match undo {
            Undo::Env { names } => ops.env_remove(env_key, names),
            Undo::Added { key, .. } if key == "args" && command != Command::Raw => {
                if let Command::New(words) = &command {
                    match words.get(1..).filter(|rest| !rest.is_empty()) {
                        Some(rest) => ops.set("args", New::Words(rest.to_vec())),
                        None => {
                            ops.remove("args");
                        }
                    }
                }
            }
            Undo::Added { key, if_empty } => {
                let kept = *if_empty
                    && ops
                        .value(key)
                        .as_ref()
                        .and_then(Value::as_object)
                        .is_some_and(|o| !o.is_empty());
                if !kept && ops.raw(key).is_some() {
                    ops.remove(key);
                }
            }
            Undo::Removed { key, at, decor, .. } => {
                let text = filled.pop().unwrap_or_default();
                ops.restore(*at, key, &text, decor);
            }
            Undo::Rename { key, from, raw } => {
                ops.rename(key, from, New::Raw(raw.clone()));
            }
            Undo::Set { key, raw } => match (key.as_str(), &command) {
                ("command" | "args", Command::Keep) => {}
                ("command", Command::New(words)) => match client.command_style() {
                    CommandStyle::Array => ops.set("command", New::Words(words.clone())),
                    CommandStyle::StringAndArgs => ops.set(
                        "command",
                        New::Str(words.first().cloned().unwrap_or_default()),
                    ),
                },
                ("args", Command::New(words)) => ops.set(
                    "args",
                    New::Words(words.get(1..).unwrap_or_default().to_vec()),
                ),
                _ => ops.set(key, New::Raw(raw.clone())),
            },
            Undo::Entry { .. } | Undo::Order { .. } => {}
        }
    }
    Ok(())
}

/// What an entry's source text runs (or reaches), for the table.
fn describe(text: &str, client: Client) -> String {
    let value = parsed(text).unwrap_or(Value::Null);
    let entry = read_entry(&value, client);
    entry
        .argv
        .map(|argv| plan::shell_words(&argv))
        .or(entry.url)
        .unwrap_or_default()
}

/// The text with what looks secret shown as `***` ([`mask`]); `None` if it does not parse.
pub fn masked(text: &str) -> Option<String> {
    let root = CstRootNode::parse(text, &options()).ok()?;
    if let Some(obj) = root.object_value() {
        mask_object(&obj, false);
    } else if let Some(array) = root.array_value() {
        mask_array(&array);
    }
    Some(root.to_string())
}

fn mask_object(obj: &CstObject, headers: bool) {
    for prop in obj.properties() {
        let Some(name) = prop.decoded_name() else {
            continue;
        };
        if let Some(inner) = prop.object_value() {
            mask_object(&inner, mask::is_headers(&name));
            continue;
        }
        if let Some(array) = prop.array_value() {
            mask_array(&array);
            continue;
        }
        let Some(Value::String(text)) = prop.value().and_then(|v| v.to_serde_value()) else {
            continue;
        };
        if name == MARKER {
            if let Some(marker) = masked_marker(&text) {
                prop.set_value(CstInputValue::String(marker));
            }
        } else if mask::hides(&name, headers) {
            prop.set_value(CstInputValue::String(mask::MASK.into()));
        }
    }
}

fn mask_array(array: &CstArray) {
    let mut header_next = false;
    for element in array.elements() {
        if let Some(obj) = element.as_object() {
            mask_object(&obj, false);
        } else if let Some(inner) = element.as_array() {
            mask_array(&inner);
        }
        let Some(lit) = element.as_string_lit() else {
            header_next = false;
            continue;
        };
        let word = lit.decoded_value().unwrap_or_default();
        let hidden = if header_next {
            Some(mask::header_word(&word))
        } else {
            word.strip_prefix("--upstream-header=")
                .map(|h| format!("--upstream-header={}", mask::header_word(h)))
        };
        if let Some(hidden) = hidden {
            lit.set_raw_value(quoted(&hidden));
        }
        header_next = word == "--upstream-header";
    }
}

/// A marker's text with the secrets in the source text it keeps masked; `None` when there are
/// none (or it cannot be read).
fn masked_marker(text: &str) -> Option<String> {
    let mut marker = Marker::parse(text).ok()?;
    let mut changed = false;
    for undo in &mut marker.undo {
        let (key, raw) = match undo {
            Undo::Set { key, raw } | Undo::Removed { key, raw, .. } => (key.clone(), raw),
            Undo::Entry { raw, .. } => (String::new(), raw),
            _ => continue,
        };
        let Ok(root) = CstRootNode::parse(raw, &options()) else {
            continue;
        };
        if let Some(obj) = root.object_value() {
            mask_object(&obj, mask::is_headers(&key));
        } else if let Some(array) = root.array_value() {
            mask_array(&array);
        }
        let new = root.to_string();
        if new != *raw {
            *raw = new;
            changed = true;
        }
    }
    changed.then(|| marker.to_text())
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
