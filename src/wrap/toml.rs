//! `wrap` and `unwrap` for Codex's `config.toml`, edited with toml_edit: the `[mcp_servers.*]`
//! entries change, and every other byte — tables, comments, key order, quoting — stays.

use toml_edit::{Array, DocumentMut, InlineTable, Item, Table, TableLike, Value};

use super::client::Client;
use super::mask;
use super::plan::{self, Command, Entry, MARKER, Marker, Plan, Undo};
use super::twice::line_column;
use super::{Edited, Mode, Outcome, Row, Select, SyntaxError};

/// Edits `text` (Codex's `config.toml`) as `mode` says.
pub fn edit(
    text: &str,
    client: Client,
    mode: Mode,
    select: &Select,
    launcher: &[String],
) -> Result<Edited, SyntaxError> {
    let mut doc: DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| {
        let (line, column) = e
            .span()
            .map(|span| line_column(text, span.start))
            .unwrap_or((1, 1));
        let message = e.message().trim_end();
        let fix = if message.contains("duplicate key") {
            "Codex reads no file with a key (or table) written twice: keep one of the two \
             (merge them into one), then run again"
        } else {
            "correct it there, then run again"
        };
        SyntaxError {
            line,
            column,
            message: format!("{message}: {fix}"),
        }
    })?;
    let mut rows = Vec::new();
    let Some(servers) = doc
        .get_mut(client.servers_key())
        .and_then(Item::as_table_like_mut)
    else {
        return Ok(Edited {
            text: doc.to_string(),
            rows,
        });
    };
    let names: Vec<String> = servers.iter().map(|(k, _)| k.to_string()).collect();
    for name in names {
        if !select.takes(&name) {
            rows.push(Row {
                server: name,
                outcome: Outcome::Left("not selected".into()),
            });
            continue;
        }
        let outcome = match servers.get_mut(&name) {
            Some(Item::Table(table)) => apply(table, mode, client, launcher),
            Some(Item::Value(Value::InlineTable(table))) => apply(table, mode, client, launcher),
            _ => Outcome::Left("not a table".into()),
        };
        rows.push(Row {
            server: name,
            outcome,
        });
    }
    Ok(Edited {
        text: doc.to_string(),
        rows,
    })
}

/// A server entry: a `[mcp_servers.NAME]` table or an inline table.
trait EntryTable: TableLike {
    fn sort_by_order(&mut self, order: &[String]);
}

impl EntryTable for Table {
    fn sort_by_order(&mut self, order: &[String]) {
        let rank = |k: &str| order.iter().position(|o| o == k).unwrap_or(order.len());
        self.sort_values_by(|a, _, b, _| rank(a.get()).cmp(&rank(b.get())));
    }
}

impl EntryTable for InlineTable {
    fn sort_by_order(&mut self, order: &[String]) {
        let rank = |k: &str| order.iter().position(|o| o == k).unwrap_or(order.len());
        self.sort_values_by(|a, _, b, _| rank(a.get()).cmp(&rank(b.get())));
    }
}

fn apply(
    table: &mut dyn EntryTableDyn,
    mode: Mode,
    client: Client,
    launcher: &[String],
) -> Outcome {
    let entry = read_entry(table.like());
    match mode {
        Mode::Wrap => wrap_entry(table, &entry, client, launcher),
        Mode::Unwrap => unwrap_entry(table, &entry),
    }
}

/// [`EntryTable`] as a trait object.
trait EntryTableDyn {
    fn like(&self) -> &dyn TableLike;
    fn like_mut(&mut self) -> &mut dyn TableLike;
    fn sort(&mut self, order: &[String]);
}

impl<T: EntryTable> EntryTableDyn for T {
    fn like(&self) -> &dyn TableLike {
        self
    }
    fn like_mut(&mut self) -> &mut dyn TableLike {
        self
    }
    fn sort(&mut self, order: &[String]) {
        self.sort_by_order(order);
    }
}

fn str_of(table: &dyn TableLike, key: &str) -> Option<String> {
    table.get(key).and_then(Item::as_str).map(String::from)
}

fn strings(item: &Item) -> Option<Vec<String>> {
    item.as_array()?
        .iter()
        .map(|v| v.as_str().map(String::from))
        .collect()
}

fn string_pairs(item: &Item) -> Option<Vec<(String, String)>> {
    item.as_table_like()?
        .iter()
        .map(|(k, v)| v.as_str().map(|v| (k.to_string(), v.to_string())))
        .collect()
}

fn read_entry(table: &dyn TableLike) -> Entry {
    let mut entry = Entry::default();
    if let Some(env) = table.get("env").and_then(Item::as_table_like) {
        entry.env_names = env.iter().map(|(k, _)| k.to_string()).collect();
        entry.marker = env.get(MARKER).and_then(Item::as_str).map(String::from);
    }
    if let Some(program) = str_of(table, "command") {
        let mut argv = vec![program];
        if let Some(args) = table.get("args") {
            match strings(args) {
                Some(args) => argv.extend(args),
                None => entry.unsupported = Some("its args are not all strings".into()),
            }
        }
        entry.argv = Some(argv);
        return entry;
    }
    entry.url = str_of(table, "url");
    if let Some(headers) = table.get("http_headers") {
        match string_pairs(headers) {
            Some(pairs) => entry.headers = pairs,
            None => entry.unsupported = Some("its http_headers are not all strings".into()),
        }
    }
    if let Some(var) = str_of(table, "bearer_token_env_var") {
        entry.env_headers.push((
            "Authorization".into(),
            format!("Bearer ${{{var}}}"),
            var.clone(),
        ));
    }
    if let Some(headers) = table.get("env_http_headers") {
        match string_pairs(headers) {
            Some(pairs) => {
                for (name, var) in pairs {
                    entry.env_headers.push((name, format!("${{{var}}}"), var));
                }
            }
            None => entry.unsupported = Some("its env_http_headers are not all strings".into()),
        }
    }
    entry
}

/// A value's source text, without the whitespace and comments around it.
fn raw(item: &Item) -> String {
    match item {
        Item::Value(value) => {
            let mut value = value.clone();
            value.decor_mut().clear();
            value.to_string()
        }
        Item::Table(table) => {
            let mut inline = table.clone().into_inline_table();
            inline.decor_mut().clear();
            inline.to_string()
        }
        _ => String::new(),
    }
}

fn decor_text(d: &toml_edit::Decor) -> [String; 2] {
    let text = |r: Option<&toml_edit::RawString>| {
        r.and_then(|r| r.as_str()).unwrap_or_default().to_string()
    };
    [text(d.prefix()), text(d.suffix())]
}

/// Replaces `key`'s value, keeping the whitespace and comments around it.
fn replace(table: &mut dyn TableLike, key: &str, mut new: Value) {
    if let Some(Item::Value(old)) = table.get(key) {
        *new.decor_mut() = old.decor().clone();
    }
    match table.get_mut(key) {
        Some(item) => *item = Item::Value(new),
        None => {
            table.insert(key, Item::Value(new));
        }
    }
}

fn words(words: &[String]) -> Value {
    Value::Array(words.iter().map(|w| w.as_str()).collect::<Array>())
}

fn wrap_entry(
    table: &mut dyn EntryTableDyn,
    entry: &Entry,
    client: Client,
    launcher: &[String],
) -> Outcome {
    let was = entry.argv.clone().map_or_else(
        || entry.url.clone().unwrap_or_default(),
        |argv| plan::shell_words(&argv),
    );
    let plan = plan::plan(entry, client, launcher);
    let (argv, secrets, pass) = match &plan {
        Plan::Leave(reason) => return Outcome::Left(reason.clone()),
        Plan::Stdio { argv } => (argv.clone(), Vec::new(), Vec::new()),
        Plan::Remote {
            argv,
            secrets,
            pass,
            ..
        } => (argv.clone(), secrets.clone(), pass.clone()),
    };
    let order: Vec<String> = table.like().iter().map(|(k, _)| k.to_string()).collect();
    let mut undo = vec![Undo::Order {
        keys: order.clone(),
    }];
    let t = table.like_mut();
    // Where the entry's keys go once wrapped: command and args where url was.
    let mut wanted = order.clone();
    if matches!(plan, Plan::Remote { .. }) {
        let at = order.iter().position(|k| k == "url").unwrap_or(order.len());
        let mut url_prefix = None;
        for key in [
            "url",
            "http_headers",
            "bearer_token_env_var",
            "env_http_headers",
        ] {
            let Some(item) = t.get(key) else { continue };
            let at = order.iter().position(|k| k == key).unwrap_or(0);
            let value_decor = item
                .as_value()
                .map(|v| decor_text(v.decor()))
                .unwrap_or_default();
            let key_decor = t
                .key(key)
                .map(|k| decor_text(k.leaf_decor()))
                .unwrap_or_default();
            if key == "url" {
                url_prefix = Some(key_decor[0].clone());
            }
            let mut text = raw(item);
            let mut vars = Vec::new();
            if key == "http_headers" {
                text = header_template(&text, &secrets);
                vars = secrets.iter().map(|(var, _)| var.clone()).collect();
            }
            undo.push(Undo::Removed {
                key: key.into(),
                at,
                raw: text,
                secrets: vars,
                decor: [key_decor, value_decor].concat(),
            });
            t.remove(key);
        }
        undo.push(Undo::Added {
            key: "command".into(),
            if_empty: false,
        });
        t.insert("command", Item::Value(Value::from(argv[0].as_str())));
        if let (Some(prefix), Some(mut key)) = (url_prefix, t.key_mut("command")) {
            key.leaf_decor_mut().set_prefix(prefix);
        }
        wanted.splice(at..at, ["command".to_string(), "args".to_string()]);
    } else {
        if let Some(item) = t.get("command") {
            undo.push(Undo::Set {
                key: "command".into(),
                raw: raw(item),
            });
        }
        replace(t, "command", Value::from(argv[0].as_str()));
        let at = order
            .iter()
            .position(|k| k == "command")
            .map_or(order.len(), |i| i + 1);
        if !order.iter().any(|k| k == "args") {
            wanted.insert(at, "args".into());
        }
    }
    match t.get("args") {
        Some(item) => {
            undo.push(Undo::Set {
                key: "args".into(),
                raw: raw(item),
            });
        }
        None => undo.push(Undo::Added {
            key: "args".into(),
            if_empty: false,
        }),
    }
    replace(t, "args", words(&argv[1..]));
    if !pass.is_empty() {
        let mut vars: Vec<String> = match t.get("env_vars") {
            Some(item) => {
                undo.push(Undo::Set {
                    key: "env_vars".into(),
                    raw: raw(item),
                });
                strings(item).unwrap_or_default()
            }
            None => {
                undo.push(Undo::Added {
                    key: "env_vars".into(),
                    if_empty: false,
                });
                Vec::new()
            }
        };
        for var in pass {
            if !vars.contains(&var) {
                vars.push(var);
            }
        }
        replace(t, "env_vars", words(&vars));
    }
    let mut names: Vec<String> = secrets.iter().map(|(var, _)| var.clone()).collect();
    names.push(MARKER.into());
    let has_env = t.get("env").and_then(Item::as_table_like).is_some();
    if !has_env {
        undo.push(Undo::Added {
            key: "env".into(),
            if_empty: true,
        });
    }
    undo.push(Undo::Env { names });
    let mut marker = Marker::new(undo);
    if let (Plan::Stdio { .. }, Some(server)) = (&plan, &entry.argv) {
        marker = marker.with_lead(argv.len().saturating_sub(server.len()));
    }
    let marker = marker.to_text();
    let mut added: Vec<(String, String)> = secrets.clone();
    added.push((MARKER.into(), marker));
    if !has_env {
        t.insert("env", Item::Value(Value::InlineTable(InlineTable::new())));
    }
    if let Some(env) = t.get_mut("env").and_then(Item::as_table_like_mut) {
        for (name, value) in added {
            env.insert(&name, toml_edit::value(value));
        }
    }
    table.sort(&wanted);
    Outcome::Wrapped {
        was,
        now: plan::shell_words(&argv),
        login: plan::login_url(entry, &plan),
    }
}

/// The variables a remote entry's proxy takes from Codex's environment: those its
/// `bearer_token_env_var` and `env_http_headers` named (wrap added them to `env_vars`).
fn passed_vars(marker: &Marker) -> Vec<String> {
    let mut vars = Vec::new();
    for undo in &marker.undo {
        let Undo::Removed { key, raw, .. } = undo else {
            continue;
        };
        let Ok(value) = raw.parse::<Value>() else {
            continue;
        };
        match (key.as_str(), &value) {
            ("bearer_token_env_var", Value::String(var)) => vars.push(var.value().clone()),
            ("env_http_headers", Value::InlineTable(headers)) => vars.extend(
                headers
                    .iter()
                    .filter_map(|(_, v)| v.as_str().map(String::from)),
            ),
            _ => {}
        }
    }
    vars
}

/// A command line's words: `command` and `args` as TOML values.
fn argv_of(command: Option<&Value>, args: Option<&Value>) -> Option<Vec<String>> {
    let mut argv = vec![command?.as_str()?.to_string()];
    if let Some(args) = args {
        for word in args.as_array()? {
            argv.push(word.as_str()?.to_string());
        }
    }
    Some(argv)
}

/// The text with what looks secret shown as `***` ([`mask`]); `None` if it does not parse.
pub fn masked(text: &str) -> Option<String> {
    let mut doc: DocumentMut = text.parse().ok()?;
    mask_table(doc.as_table_mut(), false);
    Some(doc.to_string())
}

fn mask_table(table: &mut Table, headers: bool) {
    for (key, item) in table.iter_mut() {
        let name = key.get().to_string();
        match item {
            Item::Table(inner) => mask_table(inner, mask::is_headers(&name)),
            Item::ArrayOfTables(tables) => {
                for inner in tables.iter_mut() {
                    mask_table(inner, false);
                }
            }
            Item::Value(value) => mask_value(value, &name, headers),
            Item::None => {}
        }
    }
}

fn mask_value(value: &mut Value, name: &str, headers: bool) {
    match value {
        Value::InlineTable(inner) => {
            let headers = mask::is_headers(name);
            for (key, value) in inner.iter_mut() {
                let key = key.get().to_string();
                mask_value(value, &key, headers);
            }
        }
        Value::Array(array) => mask_array(array),
        Value::String(text) => {
            let text = text.value().clone();
            let hidden = if name == MARKER {
                masked_marker(&text)
            } else if mask::hides(name, headers) {
                Some(mask::MASK.to_string())
            } else {
                None
            };
            if let Some(hidden) = hidden {
                set_string(value, hidden);
            }
        }
        _ => {}
    }
}

/// Replaces a value by a string, keeping the whitespace and comments around it.
fn set_string(value: &mut Value, text: String) {
    let decor = value.decor().clone();
    *value = Value::from(text);
    *value.decor_mut() = decor;
}

fn mask_array(array: &mut Array) {
    let mut header_next = false;
    for value in array.iter_mut() {
        let Some(word) = value.as_str().map(String::from) else {
            mask_value(value, "", false);
            header_next = false;
            continue;
        };
        let hidden = if header_next {
            Some(mask::header_word(&word))
        } else {
            word.strip_prefix("--upstream-header=")
                .map(|h| format!("--upstream-header={}", mask::header_word(h)))
        };
        if let Some(hidden) = hidden {
            set_string(value, hidden);
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
            _ => continue,
        };
        let Ok(mut value) = raw.parse::<Value>() else {
            continue;
        };
        mask_value(&mut value, &key, false);
        let new = value.to_string();
        if new != *raw {
            *raw = new;
            changed = true;
        }
    }
    changed.then(|| marker.to_text())
}

/// An inline table's source text with each header value that moved into the environment
/// replaced by `${VAR}`.
fn header_template(raw_headers: &str, secrets: &[(String, String)]) -> String {
    let Ok(mut value) = raw_headers.parse::<Value>() else {
        return raw_headers.to_string();
    };
    if let Some(headers) = value.as_inline_table_mut() {
        let keys: Vec<String> = headers.iter().map(|(k, _)| k.to_string()).collect();
        for (key, (var, _)) in keys.iter().zip(secrets) {
            if let Some(old) = headers.get_mut(key) {
                let mut new = Value::from(format!("${{{var}}}"));
                *new.decor_mut() = old.decor().clone();
                *old = new;
            }
        }
    }
    value.to_string()
}

fn unwrap_entry(table: &mut dyn EntryTableDyn, entry: &Entry) -> Outcome {
    let Some(text) = &entry.marker else {
        return Outcome::Left("not wrapped".into());
    };
    let marker = match Marker::parse(text) {
        Ok(marker) => marker,
        Err(err) => return Outcome::Left(format!("its {MARKER} cannot be read: {err}")),
    };
    // Everything is read and checked before anything changes: an entry is undone whole or
    // not at all. The header values come from the environment as it is now.
    let env_value = |name: &str| -> Option<String> {
        table
            .like()
            .get("env")?
            .as_table_like()?
            .get(name)?
            .as_str()
            .map(String::from)
    };
    let mut values = Vec::new();
    for undo in &marker.undo {
        let (key, raw, secrets): (&str, &str, &[String]) = match undo {
            Undo::Removed {
                key, raw, secrets, ..
            } => (key, raw, secrets),
            Undo::Set { key, raw } | Undo::Rename { key, raw, .. } => (key, raw, &[]),
            _ => continue,
        };
        let mut text = raw.to_string();
        for var in secrets {
            let Some(value) = env_value(var) else {
                return Outcome::Left(format!(
                    "{var}, which holds one of its header values, is gone from its env"
                ));
            };
            text = text.replace(&format!("\"${{{var}}}\""), &Value::from(value).to_string());
        }
        match text.parse::<Value>() {
            Ok(value) => values.push(value),
            Err(_) => return Outcome::Left(format!("its marker's {key} is not a TOML value")),
        }
    }
    // A stdio entry: the server's own command as it is now, the launcher's words taken out.
    let old = |key: &str| {
        marker.undo.iter().find_map(|u| match u {
            Undo::Set { key: k, raw } if k == key => raw.parse::<Value>().ok(),
            _ => None,
        })
    };
    let command = match old("command") {
        Some(command) => {
            let was = argv_of(Some(&command), old("args").as_ref());
            let now = argv_of(
                table.like().get("command").and_then(Item::as_value),
                table.like().get("args").and_then(Item::as_value),
            );
            plan::decide(was, now, marker.lead)
        }
        None => Command::Raw,
    };
    // A remote entry: the variables wrap passed to the proxy through `env_vars`; those the user
    // put there since stay.
    let passed = passed_vars(&marker);
    let t = table.like_mut();
    let mut order = None;
    for undo in marker.undo.iter().rev() {
        match undo {
            Undo::Env { names } => {
                if let Some(env) = t.get_mut("env").and_then(Item::as_table_like_mut) {
                    for name in names {
                        env.remove(name);
                    }
                }
            }
            Undo::Added { key, .. } if key == "args" && command != Command::Raw => {
                if let Command::New(argv) = &command {
                    match argv.get(1..).filter(|rest| !rest.is_empty()) {
                        Some(rest) => replace(t, "args", words(rest)),
                        None => {
                            t.remove("args");
                        }
                    }
                }
            }
            Undo::Added { key, .. } if key == "env_vars" => {
                let now = t.get(key).and_then(strings).unwrap_or_default();
                let rest: Vec<String> = now.into_iter().filter(|v| !passed.contains(v)).collect();
                if rest.is_empty() {
                    t.remove(key);
                } else {
                    replace(t, key, words(&rest));
                }
            }
            Undo::Added { key, if_empty } => {
                let kept = *if_empty
                    && t.get(key)
                        .and_then(Item::as_table_like)
                        .is_some_and(|e| !e.is_empty());
                if !kept {
                    t.remove(key);
                }
            }
            Undo::Removed { key, decor, .. } => {
                let Some(mut value) = values.pop() else { break };
                if let [key_prefix, key_suffix, value_prefix, value_suffix] = &decor[..] {
                    value.decor_mut().set_prefix(value_prefix.as_str());
                    value.decor_mut().set_suffix(value_suffix.as_str());
                    t.insert(key, Item::Value(value));
                    if let Some(mut k) = t.key_mut(key) {
                        k.leaf_decor_mut().set_prefix(key_prefix.as_str());
                        k.leaf_decor_mut().set_suffix(key_suffix.as_str());
                    }
                } else {
                    t.insert(key, Item::Value(value));
                }
            }
            Undo::Set { key, .. } | Undo::Rename { key, .. } => {
                let Some(value) = values.pop() else { break };
                match (key.as_str(), &command) {
                    ("command" | "args", Command::Keep) => {}
                    ("command", Command::New(argv)) => {
                        let program = argv.first().cloned().unwrap_or_default();
                        replace(t, "command", Value::from(program));
                    }
                    ("args", Command::New(argv)) => {
                        replace(t, "args", words(argv.get(1..).unwrap_or_default()));
                    }
                    ("env_vars", _) => {
                        let was = strings(&Item::Value(value.clone())).unwrap_or_default();
                        let now = t.get(key).and_then(strings).unwrap_or_default();
                        let rest: Vec<String> = now
                            .into_iter()
                            .filter(|v| was.contains(v) || !passed.contains(v))
                            .collect();
                        match rest == was {
                            true => replace(t, key, value),
                            false => replace(t, key, words(&rest)),
                        }
                    }
                    _ => replace(t, key, value),
                }
            }
            Undo::Order { keys } => order = Some(keys.clone()),
            // Written by the JSON editor only.
            Undo::Entry { .. } => {}
        }
    }
    if let Some(keys) = order {
        table.sort(&keys);
    }
    let entry = read_entry(table.like());
    let now = entry
        .argv
        .map(|a| plan::shell_words(&a))
        .or(entry.url)
        .unwrap_or_default();
    Outcome::Unwrapped { now }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str, mode: Mode) -> String {
        edit(
            text,
            Client::Codex,
            mode,
            &Select::default(),
            &["mcp-budget".to_string()],
        )
        .expect("parses")
        .text
    }

    #[test]
    fn a_stdio_table_round_trips_to_the_same_bytes() {
        let text = r#"model = "o3"

# the filesystem
[mcp_servers.fs]
command = "npx" # from npm
args = ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]
startup_timeout_sec = 20

[mcp_servers.fs.env]
DEBUG = "1"

[mcp_servers.plain]
command = "my-server"
"#;
        let wrapped = run(text, Mode::Wrap);
        assert!(
            wrapped.contains("command = \"mcp-budget\" # from npm"),
            "{wrapped}"
        );
        assert_eq!(run(&wrapped, Mode::Wrap), wrapped);
        assert_eq!(run(&wrapped, Mode::Unwrap), text);
    }

    #[test]
    fn a_remote_table_becomes_stdio_with_its_token_passed_by_name() {
        let text = r#"[mcp_servers.api]
# the hosted one
url = "https://mcp.example.com/mcp"
bearer_token_env_var = "API_TOKEN"
http_headers = { "X-Team" = "blue" }
"#;
        let wrapped = run(text, Mode::Wrap);
        let doc: toml::Table = toml::from_str(&wrapped).expect("TOML");
        let api = &doc["mcp_servers"]["api"];
        assert_eq!(api["command"].as_str(), Some("mcp-budget"));
        let args: Vec<&str> = api["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert!(
            args.contains(&"Authorization: Bearer ${API_TOKEN}"),
            "{args:?}"
        );
        assert!(
            args.contains(&"X-Team: ${MCP_BUDGET_HEADER_X_TEAM}"),
            "{args:?}"
        );
        assert_eq!(
            api["env"]["MCP_BUDGET_HEADER_X_TEAM"].as_str(),
            Some("blue")
        );
        assert_eq!(api["env_vars"].as_array().map(Vec::len), Some(1));
        assert_eq!(run(&wrapped, Mode::Unwrap), text);
    }
}
