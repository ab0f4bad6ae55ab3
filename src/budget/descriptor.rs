//! `tools/list`: the descriptors of budgeted tools, rewritten to show the budget arguments.
//!
//! The model learns the budget only from the descriptor (MCP has no other channel), so each
//! added argument is described with its values, default and effect, and the tool description
//! says what the defaults leave out and how to get it. `outputSchema` is rewritten so that
//! every `structuredContent` the proxy emits still validates.

use serde_json::{Map, Value, json};

use super::project::Selection;
use crate::policy::{Items, Policy, Rule};

const META_KEY: &str = "anthropic/maxResultSizeChars";

/// Rewrites one tool descriptor in place under `rule`.
pub fn rewrite(tool: &mut Map<String, Value>, rule: &Rule, policy: &Policy) {
    if let Some(schema) = tool.get("inputSchema")
        && not_extensible(schema).is_some()
    {
        // Left unbudgeted (the interceptor said why, once).
        return;
    }
    let meta = tool.entry("_meta").or_insert_with(|| json!({}));
    if let Value::Object(meta) = meta {
        meta.insert(META_KEY.into(), json!(policy.max_result_size_chars));
    }
    if let Some(text) = &rule.text {
        rewrite_text(tool, text.page_bytes);
        return;
    }
    let Some(items) = &rule.items else { return };
    append_description(tool, &budget_description(items));
    add_properties(tool, added_properties(items), &items.passthrough);
    if let Some(output) = tool.get_mut("outputSchema") {
        rewrite_output_schema(output, items);
    }
}

/// A text-paged tool: `after`, and a description of the pages.
fn rewrite_text(tool: &mut Map<String, Value>, page_bytes: usize) {
    let addition = format!(
        "Budgeted by mcp-budget: a long text result comes in pages of whole lines, at most {page_bytes} bytes each. \
         A later text block says which lines of how many were returned and, when more remain, gives next_after: \
         pass it as after (with the same other arguments) for the next page. The pages concatenate to the whole text."
    );
    append_description(tool, &addition);
    let after = json!({"type": "string", "description": "The next_after value of the previous page of this text, to get the page after it. Keep the other arguments unchanged."});
    add_properties(tool, vec![("after".to_string(), after)], &[]);
    // A page's structuredContent (an object) carries the continuation: its schema says so (a
    // schema may forbid other properties, and a client validates against it).
    if let Some(Value::Object(schema)) = tool.get_mut("outputSchema")
        && schema.get("type").is_none_or(|t| {
            t == "object" || t.as_array().is_some_and(|a| a.contains(&json!("object")))
        })
    {
        let properties = schema.entry("properties").or_insert_with(|| json!({}));
        if let Value::Object(properties) = properties {
            for (name, value) in continuation_properties() {
                properties.entry(name).or_insert(value);
            }
        }
    }
}

/// Appends a paragraph to a tool's description.
fn append_description(tool: &mut Map<String, Value>, addition: &str) {
    let description = tool
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("")
        .trim_end();
    let joined = if description.is_empty() {
        addition.to_string()
    } else {
        format!("{description}\n\n{addition}")
    };
    tool.insert("description".into(), json!(joined));
}

/// Why an input schema cannot take the budget's arguments without a client rejecting them,
/// or `None` when it can (JSON Schema 2020-12): added arguments go into the root's
/// `properties`, which its own `additionalProperties: false` and `unevaluatedProperties: false`
/// respect; but a root that refers elsewhere (`$ref`, `allOf`, …) to a schema closed to other
/// properties, one that bounds or names its properties (`maxProperties`, `propertyNames`),
/// or one that is not an object schema, would refuse them.
pub fn not_extensible(schema: &Value) -> Option<String> {
    let Value::Object(root) = schema else {
        return Some("the input schema is not an object".into());
    };
    match root.get("type") {
        None => {}
        Some(Value::String(kind)) if kind == "object" => {}
        Some(Value::Array(kinds)) if kinds.iter().any(|k| k == "object") => {}
        Some(other) => return Some(format!("the input schema's type is {other}, not object")),
    }
    for key in ["maxProperties", "propertyNames", "$dynamicRef"] {
        if root.contains_key(key) {
            return Some(format!("the input schema has {key}"));
        }
    }
    // Every schema the root combines with must leave other properties open.
    let mut pending: Vec<&Value> = Vec::new();
    let mut seen = 0usize;
    fn composed<'a>(node: &'a serde_json::Map<String, Value>, out: &mut Vec<&'a Value>) {
        for key in ["allOf", "anyOf", "oneOf"] {
            if let Some(Value::Array(parts)) = node.get(key) {
                out.extend(parts.iter());
            }
        }
        for key in ["if", "then", "else", "not"] {
            if let Some(part) = node.get(key) {
                out.push(part);
            }
        }
    }
    let reference = |node: &serde_json::Map<String, Value>| -> Result<Option<&Value>, String> {
        let Some(target) = node.get("$ref") else {
            return Ok(None);
        };
        let Some(pointer) = target.as_str().and_then(|t| t.strip_prefix('#')) else {
            return Err(format!(
                "the input schema refers to {target}, outside itself"
            ));
        };
        schema
            .pointer(pointer)
            .map(Some)
            .ok_or_else(|| format!("the input schema's $ref {target} does not resolve"))
    };
    match reference(root) {
        Ok(Some(target)) => pending.push(target),
        Ok(None) => {}
        Err(why) => return Some(why),
    }
    composed(root, &mut pending);
    while let Some(node) = pending.pop() {
        seen += 1;
        if seen > 256 {
            return Some("the input schema's references go too deep to check".into());
        }
        let Value::Object(node) = node else { continue };
        for key in ["additionalProperties", "unevaluatedProperties"] {
            if node
                .get(key)
                .is_some_and(|v| v != &Value::Bool(true) && !v.is_object())
            {
                return Some(format!(
                    "a schema the input schema combines with has {key}: {}",
                    node[key]
                ));
            }
        }
        for key in ["maxProperties", "propertyNames"] {
            if node.contains_key(key) {
                return Some(format!("a schema the input schema combines with has {key}"));
            }
        }
        match reference(node) {
            Ok(Some(target)) => pending.push(target),
            Ok(None) => {}
            Err(why) => return Some(why),
        }
        composed(node, &mut pending);
    }
    None
}

/// Adds properties to a tool's input schema (creating the schema if it has none).
fn add_properties(
    tool: &mut Map<String, Value>,
    added: Vec<(String, Value)>,
    passthrough: &[String],
) {
    let schema = tool
        .entry("inputSchema")
        .or_insert_with(|| json!({"type": "object"}));
    let Value::Object(schema) = schema else {
        return;
    };
    let properties = schema.entry("properties").or_insert_with(|| json!({}));
    let Value::Object(properties) = properties else {
        return;
    };
    for (name, property) in added {
        if properties.contains_key(&name) && !passthrough.contains(&name) {
            tracing::warn!(argument = %name, "the upstream tool already has this argument; the budget's meaning replaces it (list it in `passthrough` to forward it)");
        }
        properties.insert(name, property);
    }
}

/// The paragraph appended to a budgeted tool's description.
pub fn budget_description(items: &Items) -> String {
    let noun = &items.noun;
    let mut parts = Vec::new();
    if let Some(h) = &items.horizon {
        parts.push(format!(
            "by default only live {noun} (horizon:\"all\" adds the {} ones)",
            h.terminal.join("/")
        ));
    }
    if items.summary.is_some() {
        parts.push("in summary detail (detail:\"full\" gives every field)".to_string());
    }
    parts.push(format!(
        "{} per page (limit up to {}; a response with more carries next_after: pass it as after for the next page)",
        items.default_limit, items.max_limit
    ));
    format!(
        "Budgeted by mcp-budget so that results fit the client's context: {}. total_count always says how many {noun} the server returned before any narrowing.",
        parts.join(", ")
    )
}

/// The arguments the budget adds, in the order they are listed.
pub fn added_properties(items: &Items) -> Vec<(String, Value)> {
    let noun = &items.noun;
    let mut out = Vec::new();
    if let Some(h) = &items.horizon {
        out.push((
            "horizon".to_string(),
            json!({
                "type": "string",
                "enum": ["live", "all"],
                "default": "live",
                "description": format!(
                    "\"live\" (default): leave out {noun} whose {} is {}. \"all\": include them (history); with detail:\"full\" the {noun} are exactly the server's.",
                    h.field.join("."), h.terminal.join(" or ")
                ),
            }),
        ));
    }
    if let Some(summary) = &items.summary {
        out.push((
            "detail".to_string(),
            json!({
                "type": "string",
                "enum": ["summary", "full"],
                "default": "summary",
                "description": format!(
                    "\"summary\" (default): each of the {noun} carries only {}. \"full\": every field the server returns.",
                    Selection::describe(summary)
                ),
            }),
        ));
    }
    out.push((
        "limit".to_string(),
        json!({
            "type": "integer",
            "minimum": 1,
            "maximum": items.max_limit,
            "default": items.default_limit,
            "description": format!(
                "How many {noun} per page, 1 to {} (default {}). When more remain, the response carries next_after.",
                items.max_limit, items.default_limit
            ),
        }),
    ));
    out.push((
        "after".to_string(),
        json!({
            "type": "string",
            "description": "The next_after value of the previous page, to get the page after it. Keep the other arguments unchanged.",
        }),
    ));
    if let Some(columns) = &items.columns {
        out.push((
            "format".to_string(),
            json!({
                "type": "string",
                "enum": ["json", "csv", "tsv"],
                "default": "json",
                "description": format!(
                    "\"json\" (default): the server's object with this page of {noun}. \"csv\"/\"tsv\": a table of {} only, then a line saying which rows these are and how to get the next page.",
                    Selection::describe(columns)
                ),
            }),
        ));
    }
    for (name, field) in &items.filters {
        out.push((
            name.clone(),
            json!({
                "anyOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "string"}, "minItems": 1}
                ],
                "description": format!(
                    "Keep only {noun} whose {} equals this value (or one of these values).",
                    field.join(".")
                ),
            }),
        ));
    }
    out
}

/// One step of a JSONPath that names a place in the document's schema.
enum Step {
    Field(String),
    Each,
}

/// The steps of a simple JSONPath (`$.a.b`, `$['a'][*].b`), or `None` for anything fancier.
fn simple_steps(path: &str) -> Option<Vec<Step>> {
    let mut rest = path.strip_prefix('$')?;
    let mut steps = Vec::new();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("[*]").or_else(|| rest.strip_prefix(".*")) {
            steps.push(Step::Each);
            rest = r;
        } else if let Some(r) = rest.strip_prefix("['").or_else(|| rest.strip_prefix("[\"")) {
            let end = r.find(['\'', '"'])?;
            steps.push(Step::Field(r[..end].to_string()));
            rest = r.get(end + 2..)?;
        } else if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            if end == 0 {
                return None;
            }
            steps.push(Step::Field(r[..end].to_string()));
            rest = &r[end..];
        } else {
            return None;
        }
    }
    Some(steps)
}

fn schema_at<'a>(mut node: &'a mut Value, steps: &[Step]) -> Option<&'a mut Value> {
    for step in steps {
        node = match step {
            Step::Field(name) => node.get_mut("properties")?.get_mut(name)?,
            Step::Each => node.get_mut("items")?,
        };
    }
    Some(node)
}

/// Loosens `required` wherever the summary leaves fields out.
fn relax(node: &mut Value, selection: &Selection) {
    let Selection::Fields(fields) = selection else {
        return;
    };
    if let Some(items) = node.get_mut("items") {
        relax(items, selection);
    }
    if let Some(Value::Array(required)) = node.get_mut("required") {
        required.retain(|name| {
            name.as_str()
                .is_some_and(|n| fields.iter().any(|(f, _)| f == n))
        });
    }
    if let Some(Value::Object(properties)) = node.get_mut("properties") {
        for (name, sub) in fields {
            if let Some(property) = properties.get_mut(name) {
                relax(property, sub);
            }
        }
    }
}

/// Rewrites `outputSchema` to describe what the pipeline emits.
pub fn rewrite_output_schema(schema: &mut Value, items: &Items) {
    let steps = simple_steps(&items.path_text);
    if matches!(steps.as_deref(), Some([])) {
        // The result itself is the list: the proxy wraps it in an object.
        let list = std::mem::take(schema);
        *schema = json!({"type": "object", "properties": {items.noun.clone(): list}});
    }
    let located = match &steps {
        Some(steps) if !steps.is_empty() => {
            schema_at(schema, steps).and_then(|list| list.get_mut("items"))
        }
        Some(_) => schema
            .get_mut("properties")
            .and_then(|p| p.get_mut(&items.noun))
            .and_then(|list| list.get_mut("items")),
        None => None,
    };
    match (located, &items.summary) {
        (Some(item_schema), Some(summary)) => relax(item_schema, &Selection::from_paths(summary)),
        (Some(_), None) => {}
        (None, _) => {
            // A path the schema cannot follow: promise only an object.
            *schema = json!({"type": "object"});
        }
    }
    let Value::Object(root) = schema else { return };
    let properties = root.entry("properties").or_insert_with(|| json!({}));
    if let Value::Object(properties) = properties {
        properties.insert("total_count".into(), json!({"type": "integer", "description": "How many items the server returned before any narrowing."}));
        properties.insert("next_after".into(), json!({"type": "string", "description": "Pass as after to get the next page; absent on the last page."}));
        properties.insert("notices".into(), json!({"type": "array", "items": {"type": "string"}, "description": "Which defaults narrowed this result, and how to undo them."}));
        properties.insert("mcp_budget".into(), json!({"type": "object"}));
        if items.columns.is_some() {
            properties.insert(
                "format".into(),
                json!({"type": "string", "enum": ["csv", "tsv"]}),
            );
            properties.insert("returned".into(), json!({"type": "integer"}));
            properties.insert(
                "columns".into(),
                json!({"type": "array", "items": {"type": "string"}, "description": "A csv/tsv page: the table's columns."}),
            );
            properties.insert(
                "rows".into(),
                json!({"type": "array", "items": {"type": "array"}, "description": "A csv/tsv page: the table's rows, one value per column (null where the item has none)."}),
            );
        }
    }
    if items.columns.is_some() {
        // A csv/tsv page's structured form is the table (columns, rows) and the continuation,
        // not the document.
        root.remove("required");
    }
}

/// The name automatic paging continues under for a tool that has an `after` of its own.
pub const OWN_AFTER_ARGUMENT: &str = "mcp_budget_after";

/// How the `after` that automatic paging adds is described to the model.
pub const AUTO_AFTER: &str = "Continue a result that mcp-budget paged: pass the next_after value of the previous page, with the other arguments unchanged. Leave it out for the first page.";

/// The fields a paged `structuredContent` gains, as they are declared in an `outputSchema`.
pub fn continuation_properties() -> Vec<(&'static str, Value)> {
    vec![
        (
            "next_after",
            json!({"type": "string", "description": "Set by mcp-budget when more pages remain: pass it as after for the next page."}),
        ),
        (
            "total_count",
            json!({"type": "integer", "description": "Set by mcp-budget on a paged result: how many items (or lines) the whole result holds."}),
        ),
        (
            "notice",
            json!({"type": "string", "description": "Set by mcp-budget on a paged result: what this page holds."}),
        ),
        (
            "mcp_budget",
            json!({"type": "object", "description": "Set by mcp-budget when the result already uses the names above: the page's continuation."}),
        ),
    ]
}

/// Adds the optional `after` argument to the input schema of each tool that `wants` names,
/// and declares the continuation fields in its output schema (a client validates
/// `structuredContent` against it, and a schema may forbid other properties), splicing both
/// into the server's own text of the `tools/list` result, so that nothing else in it changes.
/// A tool that has an `after` argument of its own keeps it. `None` when nothing was added.
/// A `tools/list` result without the tools `hides` names, the others kept as the server's bytes;
/// `None` when nothing is hidden.
pub fn without_hidden(result: &str, hides: impl Fn(&str) -> bool) -> Option<String> {
    use super::raw;
    let members = raw::members(result)?;
    let tools_at = members
        .iter()
        .rev()
        .find(|(k, _)| k == "tools")
        .map(|(_, r)| r.clone())?;
    let tools = &result[tools_at.clone()];
    let elements = raw::elements(tools)?;
    let kept: Vec<&str> = elements
        .iter()
        .map(|e| &tools[e.clone()])
        .filter(|tool| {
            let name = raw::members(tool).and_then(|m| {
                m.into_iter()
                    .rev()
                    .find(|(k, _)| k == "name")
                    .and_then(|(_, r)| serde_json::from_str::<String>(&tool[r]).ok())
            });
            !name.is_some_and(|name| hides(&name))
        })
        .collect();
    if kept.len() == elements.len() {
        return None;
    }
    let mut out = String::with_capacity(result.len());
    out.push_str(&result[..tools_at.start]);
    out.push('[');
    out.push_str(&kept.join(","));
    out.push(']');
    out.push_str(&result[tools_at.end..]);
    Some(out)
}

pub fn add_auto_after(result: &str, wants: impl Fn(&str) -> bool) -> Option<String> {
    use super::raw;
    let find = |members: &[(String, std::ops::Range<usize>)], name: &str| {
        members
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, r)| r.clone())
    };
    let members = raw::members(result)?;
    let tools_at = find(&members, "tools")?;
    let tools = &result[tools_at.clone()];
    let after = vec![(
        "after",
        json!({"type": "string", "description": AUTO_AFTER}),
    )];
    // A tool with an `after` of its own continues under another name.
    let own = vec![(
        OWN_AFTER_ARGUMENT,
        json!({"type": "string", "description": AUTO_AFTER}),
    )];
    let continuation = continuation_properties();
    let mut inserts: Vec<(usize, String)> = Vec::new();
    for element in raw::elements(tools)? {
        let tool = &tools[element.clone()];
        let at = tools_at.start + element.start;
        let Some(members) = raw::members(tool) else {
            continue;
        };
        let Some(name) =
            find(&members, "name").and_then(|r| serde_json::from_str::<String>(&tool[r]).ok())
        else {
            continue;
        };
        if !wants(&name) {
            continue;
        }
        let closed = find(&members, "inputSchema")
            .and_then(|at| serde_json::from_str::<Value>(&tool[at]).ok())
            .is_some_and(|schema| not_extensible(&schema).is_some());
        if closed {
            continue;
        }
        for (schema, properties) in [("inputSchema", &after), ("outputSchema", &continuation)] {
            if let Some(schema_at) = find(&members, schema) {
                let text = &tool[schema_at.clone()];
                // An output that is not an object (a list, say) carries the continuation in
                // `_meta`: its schema is left as the server wrote it.
                if schema == "outputSchema" && !object_schema(text) {
                    continue;
                }
                let insert = insert_properties(text, properties).or_else(|| {
                    (schema == "inputSchema")
                        .then(|| insert_properties(text, &own))
                        .flatten()
                });
                if let Some(insert) = insert {
                    inserts.push((at + schema_at.start + insert.0, insert.1));
                }
            }
        }
    }
    if inserts.is_empty() {
        return None;
    }
    inserts.sort_by_key(|(at, _)| *at);
    let mut out =
        String::with_capacity(result.len() + inserts.iter().map(|i| i.1.len()).sum::<usize>());
    let mut from = 0;
    for (at, text) in inserts {
        out.push_str(&result[from..at]);
        out.push_str(&text);
        from = at;
    }
    out.push_str(&result[from..]);
    Some(out)
}

/// Whether a schema's text describes objects (its `type` is absent, `object`, or a list
/// naming `object`).
fn object_schema(schema: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Typed {
        #[serde(rename = "type")]
        kind: Option<Value>,
    }
    match serde_json::from_str::<Typed>(schema).map(|t| t.kind) {
        Ok(None) => true,
        Ok(Some(Value::String(kind))) => kind == "object",
        Ok(Some(Value::Array(kinds))) => kinds.iter().any(|k| k == "object"),
        _ => false,
    }
}

/// Where to splice `properties` into the object schema `schema` (its own text), and what:
/// into its `properties`, or a new `properties`. Names it already has are left alone; `None`
/// when there is nothing to add or `schema` is not an object schema.
fn insert_properties(schema: &str, properties: &[(&str, Value)]) -> Option<(usize, String)> {
    use super::raw;
    let members = raw::members(schema)?;
    let props_at = members
        .iter()
        .rev()
        .find(|(k, _)| k == "properties")
        .map(|(_, r)| r.clone());
    let existing = match &props_at {
        Some(at) => raw::members(&schema[at.clone()])?,
        None => Vec::new(),
    };
    let added: Vec<String> = properties
        .iter()
        .filter(|(name, _)| !existing.iter().any(|(k, _)| k == name))
        .map(|(name, value)| format!("{}:{value}", Value::from(*name)))
        .collect();
    if added.is_empty() {
        return None;
    }
    let added = added.join(",");
    match props_at {
        Some(at) => {
            let open = schema[at.clone()].find('{')?;
            let comma = if existing.is_empty() { "" } else { "," };
            Some((at.start + open + 1, format!("{added}{comma}")))
        }
        None => {
            let open = schema.find('{')?;
            let comma = if members.is_empty() { "" } else { "," };
            Some((open + 1, format!("\"properties\":{{{added}}}{comma}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_paths() {
        let names = |p: &str| {
            simple_steps(p).map(|steps| {
                steps
                    .iter()
                    .map(|s| match s {
                        Step::Field(f) => f.clone(),
                        Step::Each => "*".into(),
                    })
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(names("$.streams"), Some(vec!["streams".to_string()]));
        assert_eq!(
            names("$['a'][*].b"),
            Some(vec!["a".into(), "*".into(), "b".into()])
        );
        assert_eq!(names("$"), Some(vec![]));
        assert_eq!(names("$..x"), None);
        assert_eq!(names("$.a[?@.b]"), None);
    }

    #[test]
    fn relax_drops_required_fields_the_summary_leaves_out() {
        let mut schema = json!({
            "type": "object",
            "properties": {"g": {"type": "object", "properties": {"a": {}, "why": {}}, "required": ["a", "why"]}, "id": {}, "x": {}},
            "required": ["id", "x", "g"]
        });
        let paths: Vec<Vec<String>> = vec![vec!["id".into()], vec!["g".into(), "a".into()]];
        relax(&mut schema, &Selection::from_paths(&paths));
        assert_eq!(schema["required"], json!(["id", "g"]));
        assert_eq!(schema["properties"]["g"]["required"], json!(["a"]));
    }

    #[test]
    fn schemas_closed_to_other_arguments_are_not_extended() {
        let open = [
            json!({"type": "object", "properties": {"a": {}}}),
            json!({"type": "object", "properties": {"a": {}}, "additionalProperties": false}),
            json!({"type": "object", "unevaluatedProperties": false}),
            json!({"$ref": "#/$defs/A", "$defs": {"A": {"type": "object", "properties": {"a": {}}}}}),
            json!({"allOf": [{"type": "object"}, {"required": ["a"]}]}),
            json!({}),
        ];
        for schema in open {
            assert_eq!(not_extensible(&schema), None, "{schema}");
        }
        let closed = [
            json!({"$ref": "#/$defs/A", "$defs": {"A": {"type": "object", "additionalProperties": false}}}),
            json!({"allOf": [{"$ref": "#/definitions/B"}], "definitions": {"B": {"unevaluatedProperties": false}}}),
            json!({"type": "object", "maxProperties": 2}),
            json!({"type": "object", "propertyNames": {"pattern": "^[a-z]$"}}),
            json!({"type": "array"}),
            json!({"$ref": "https://example.com/schema.json"}),
            json!({"$ref": "#/$defs/missing"}),
            json!("not a schema"),
        ];
        for schema in closed {
            assert!(not_extensible(&schema).is_some(), "{schema}");
        }
    }
}
