//! A JSON object written on one line, edited as text: a value replaced in place, a key put in
//! with `, ` and `: ` beside what is there, a key taken out with the separator next to it (and
//! what was taken kept, to be put back byte for byte). The syntax tree would spread the object
//! over several lines; here every byte not edited stays.

use jsonc_parser::ast::Value;
use jsonc_parser::common::Ranged;
use jsonc_parser::{CollectOptions, ParseOptions, parse_to_ast};

/// JSON with comments and trailing commas (VS Code's and opencode's files have them), and
/// nothing looser: a file its client could not read is not one to edit.
pub(super) fn options() -> ParseOptions {
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

/// One key of the object, by byte offsets into its text.
#[derive(Debug, Clone)]
pub struct Prop {
    pub name: String,
    pub start: usize,
    pub name_end: usize,
    pub value_start: usize,
    pub value_end: usize,
}

/// Where the keys are: after `{` (`open`), before `}` (`close`), and each key.
struct Layout {
    open: usize,
    close: usize,
    props: Vec<Prop>,
}

/// A JSON object's source text (on one line).
#[derive(Debug, Clone)]
pub struct Line {
    pub text: String,
}

/// How a key was taken out, kept to put it back where it was: the text from the key to its
/// value, the separator taken with it, and on which side of the key that separator was
/// (`next`, `prev`, or `only` for the object's one key).
pub type Removal = Vec<String>;

fn quote(key: &str) -> String {
    serde_json::to_string(key).unwrap_or_else(|_| format!("\"{key}\""))
}

impl Line {
    /// The object in `text`; `None` when `text` is no JSON object.
    pub fn new(text: &str) -> Option<Line> {
        let line = Line {
            text: text.to_string(),
        };
        line.layout()?;
        Some(line)
    }

    fn layout(&self) -> Option<Layout> {
        let parsed = parse_to_ast(&self.text, &CollectOptions::default(), &options()).ok()?;
        let Some(Value::Object(object)) = parsed.value else {
            return None;
        };
        let range = object.range();
        let props = object
            .properties
            .iter()
            .map(|p| Prop {
                name: p.name.as_str().to_string(),
                start: p.range.start,
                name_end: p.name.end(),
                value_start: p.value.start(),
                value_end: p.value.end(),
            })
            .collect();
        Some(Layout {
            open: range.start + 1,
            close: range.end.saturating_sub(1),
            props,
        })
    }

    pub fn props(&self) -> Vec<Prop> {
        self.layout().map(|l| l.props).unwrap_or_default()
    }

    pub fn index(&self, key: &str) -> Option<usize> {
        self.props().iter().position(|p| p.name == key)
    }

    /// A key's value, as written.
    pub fn raw(&self, key: &str) -> Option<String> {
        let prop = self.props().into_iter().find(|p| p.name == key)?;
        self.text
            .get(prop.value_start..prop.value_end)
            .map(String::from)
    }

    fn splice(&mut self, from: usize, to: usize, with: &str) {
        if from <= to && to <= self.text.len() {
            self.text.replace_range(from..to, with);
        }
    }

    /// Sets `key`'s value to the source text `raw`; a key not there is put in at the end.
    pub fn set(&mut self, key: &str, raw: &str) {
        match self.props().into_iter().find(|p| p.name == key) {
            Some(prop) => self.splice(prop.value_start, prop.value_end, raw),
            None => {
                let at = self.props().len();
                self.insert(at, key, raw);
            }
        }
    }

    /// Renames `key` to `to`, with the value `raw`.
    pub fn rename(&mut self, key: &str, to: &str, raw: &str) -> bool {
        let Some(prop) = self.props().into_iter().find(|p| p.name == key) else {
            return false;
        };
        self.splice(prop.value_start, prop.value_end, raw);
        self.splice(prop.start, prop.name_end, &quote(to));
        true
    }

    /// Puts `key` with the value `raw` at position `at` (past the end: last).
    pub fn insert(&mut self, at: usize, key: &str, raw: &str) {
        let Some(layout) = self.layout() else { return };
        let piece = format!("{}: {raw}", quote(key));
        match (layout.props.get(at), layout.props.last()) {
            (Some(next), _) => self.splice(next.start, next.start, &format!("{piece}, ")),
            (None, Some(last)) => {
                self.splice(last.value_end, last.value_end, &format!(", {piece}"))
            }
            (None, None) => self.splice(layout.open, layout.open, &piece),
        }
    }

    /// Takes `key` out with one separator next to it; what is needed to put it back.
    pub fn remove(&mut self, key: &str) -> Option<Removal> {
        let layout = self.layout()?;
        let i = layout.props.iter().position(|p| p.name == key)?;
        let prop = &layout.props[i];
        let name = self.text.get(prop.start..prop.value_start)?.to_string();
        if let Some(next) = layout.props.get(i + 1) {
            let sep = self.text.get(prop.value_end..next.start)?.to_string();
            let (from, to) = (prop.start, next.start);
            self.splice(from, to, "");
            return Some(vec![name, sep, "next".into()]);
        }
        if let Some(prev) = i.checked_sub(1).and_then(|p| layout.props.get(p)) {
            let sep = self.text.get(prev.value_end..prop.start)?.to_string();
            let (from, to) = (prev.value_end, prop.value_end);
            self.splice(from, to, "");
            return Some(vec![name, sep, "prev".into()]);
        }
        // The only key: a trailing comma after it goes with it.
        let rest = self.text.get(prop.value_end..layout.close)?;
        let end = match rest.trim_start().starts_with(',') {
            true => prop.value_end + (rest.len() - rest.trim_start().len()) + 1,
            false => prop.value_end,
        };
        let sep = self.text.get(prop.value_end..end)?.to_string();
        let (from, to) = (prop.start, end);
        self.splice(from, to, "");
        Some(vec![name, sep, "only".into()])
    }

    /// Puts back a key [`Line::remove`] took out (`removal`; empty when it was not taken
    /// from one line), at position `at`, with the value `raw`.
    pub fn restore(&mut self, at: usize, key: &str, raw: &str, removal: &[String]) {
        let Some(layout) = self.layout() else { return };
        if let [name, sep, side] = removal {
            let len = layout.props.len();
            match side.as_str() {
                "next" if at < len => {
                    let start = layout.props[at].start;
                    self.splice(start, start, &format!("{name}{raw}{sep}"));
                    return;
                }
                "prev" if at >= 1 && at <= len => {
                    let end = layout.props[at - 1].value_end;
                    self.splice(end, end, &format!("{sep}{name}{raw}"));
                    return;
                }
                "only" if len == 0 => {
                    let rest = self.text.get(layout.open..layout.close).unwrap_or("");
                    let at = layout.open + (rest.len() - rest.trim_start().len());
                    self.splice(at, at, &format!("{name}{raw}{sep}"));
                    return;
                }
                _ => {}
            }
        }
        self.insert(at, key, raw);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_put_in_comes_out_to_the_same_bytes() {
        for text in [
            r#"{"command": "node", "args": ["s.js"],}"#,
            r#"{ "command":"node" }"#,
            r#"{}"#,
            r#"{ }"#,
            r#"{"a": 1 /* c */, "b": {"x": 2}}"#,
        ] {
            let mut line = Line::new(text).expect("object");
            let n = line.props().len();
            line.insert(n, "env", r#"{"K": "v"}"#);
            line.insert(0, "first", "1");
            assert!(Line::new(&line.text).is_some(), "{}", line.text);
            line.remove("first");
            line.remove("env");
            assert_eq!(line.text, text);
        }
    }

    #[test]
    fn what_is_taken_out_goes_back_where_it_was() {
        for (text, key) in [
            (r#"{"url": "u", "headers": {"A": "b"}, "x": 1}"#, "headers"),
            (r#"{"url": "u" ,"headers":{"A": "b"}}"#, "headers"),
            (r#"{ "headers": {"A": "b"},}"#, "headers"),
            (r#"{"headers": {}, "url": "u"}"#, "headers"),
        ] {
            let mut line = Line::new(text).expect("object");
            let at = line.index(key).expect("key");
            let raw = line.raw(key).expect("raw");
            let removal = line.remove(key).expect("removed");
            assert!(!line.text.contains(key), "{}", line.text);
            line.restore(at, key, &raw, &removal);
            assert_eq!(line.text, text);
        }
        let mut line = Line::new(r#"{"url": "u", "x": 1}"#).expect("object");
        assert!(line.rename("url", "command", r#""mcp-budget""#));
        assert_eq!(line.text, r#"{"command": "mcp-budget", "x": 1}"#);
        line.set("x", "2");
        assert_eq!(line.raw("x").as_deref(), Some("2"));
    }
}
