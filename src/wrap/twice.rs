//! A key written twice on the way to a client's servers: refused with its place, since the
//! client reads the last one and an edit of the first would do nothing.

use jsonc_parser::common::Ranged;
use jsonc_parser::{CollectOptions, ast, parse_to_ast};

use super::SyntaxError;
use super::client::Client;
use super::line::options;

/// Refuses a key written twice on the way to the servers (the servers' key, a project, a
/// server's name) or inside an entry: its client reads the last one, and an edit of the first
/// would do nothing. The position is the second one's.
pub(super) fn duplicates(text: &str, client: Client) -> Result<(), SyntaxError> {
    let Ok(parsed) = parse_to_ast(text, &CollectOptions::default(), &options()) else {
        return Ok(());
    };
    let Some(ast::Value::Object(top)) = &parsed.value else {
        return Ok(());
    };
    let mut keys = vec![client.servers_key()];
    if client == Client::ClaudeCode {
        keys.push("projects");
    }
    twice(text, top, Some(&keys), "key")?;
    if let Some(servers) = ast_object(top, client.servers_key()) {
        servers_twice(text, servers, client)?;
    }
    if client == Client::ClaudeCode
        && let Some(projects) = ast_object(top, "projects")
    {
        twice(text, projects, None, "project")?;
        for project in &projects.properties {
            if let ast::Value::Object(project) = &project.value {
                twice(text, project, Some(&["mcpServers"]), "key")?;
                if let Some(servers) = ast_object(project, "mcpServers") {
                    servers_twice(text, servers, client)?;
                }
            }
        }
    }
    Ok(())
}

fn ast_object<'a, 'b>(obj: &'b ast::Object<'a>, key: &str) -> Option<&'b ast::Object<'a>> {
    obj.properties
        .iter()
        .find(|p| p.name.as_str() == key)
        .and_then(|p| match &p.value {
            ast::Value::Object(o) => Some(o),
            _ => None,
        })
}

fn servers_twice(text: &str, servers: &ast::Object, client: Client) -> Result<(), SyntaxError> {
    twice(text, servers, None, "server")?;
    for entry in &servers.properties {
        if let ast::Value::Object(entry) = &entry.value {
            twice(text, entry, None, "key")?;
            for key in [client.env_key(), "headers"] {
                if let Some(inner) = ast_object(entry, key) {
                    twice(text, inner, None, "key")?;
                }
            }
        }
    }
    Ok(())
}

/// The second of two keys of `obj` with the same name (among `only`, when given).
fn twice(
    text: &str,
    obj: &ast::Object,
    only: Option<&[&str]>,
    what: &str,
) -> Result<(), SyntaxError> {
    for (i, prop) in obj.properties.iter().enumerate() {
        let name = prop.name.as_str();
        if only.is_some_and(|only| !only.contains(&name)) {
            continue;
        }
        if let Some(first) = obj.properties[..i].iter().find(|p| p.name.as_str() == name) {
            let (line, column) = line_column(text, prop.name.start());
            let (first_line, first_column) = line_column(text, first.name.start());
            return Err(SyntaxError {
                line,
                column,
                message: format!(
                    "the {what} {name:?} is written twice (first at {first_line}:{first_column}); \
                     the client reads only the last one, so an edit of the first would do \
                     nothing: keep one of the two (merge them into one), then run again"
                ),
            });
        }
    }
    Ok(())
}

/// The 1-based line and column (in characters) of a byte offset.
pub(super) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}
