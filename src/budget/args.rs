//! The budget arguments of one call: read from `arguments`, validated, and stripped.
//!
//! A bad value is refused with a message that names the fix — never clamped, never ignored.

use serde_json::{Map, Value, json};

use super::cursor::{self, CursorError, CursorKey, SelectionDigest};
use super::filter::Filter;
use super::page::Position;
use crate::policy::Items;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HorizonArg {
    Live,
    All,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    Summary,
    Full,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Csv,
    Tsv,
}

/// What one call asked for, with which values were defaults.
#[derive(Debug, Clone)]
pub struct CallArgs {
    /// `None` when the rule has no horizon.
    pub horizon: Option<HorizonArg>,
    pub horizon_defaulted: bool,
    /// `None` when the rule has no summary.
    pub detail: Option<Detail>,
    pub detail_defaulted: bool,
    pub limit: usize,
    pub limit_defaulted: bool,
    pub after: Option<Position>,
    pub format: Format,
    /// (argument name, filter) for each filter given.
    pub filters: Vec<(String, Filter)>,
    /// What the selection is, for cursors.
    pub digest: SelectionDigest,
    /// The reference to the whole result that a page cut from it names (set where the result
    /// is known: see [`super::reference`]).
    pub reference: Option<String>,
}

/// An argument the model must fix; the text is the tool error it reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ArgError(pub String);

fn one_of(name: &str, value: &Value, allowed: &[&str]) -> Result<usize, ArgError> {
    value
        .as_str()
        .and_then(|s| allowed.iter().position(|a| *a == s))
        .ok_or_else(|| {
            let quoted: Vec<String> = allowed.iter().map(|a| format!("\"{a}\"")).collect();
            let list = match quoted.split_last() {
                Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
                _ => quoted.join(""),
            };
            ArgError(format!("{name} must be {list}"))
        })
}

fn filter_values(name: &str, value: &Value) -> Result<Vec<String>, ArgError> {
    let scalar = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    };
    let values = match value {
        Value::Array(list) if !list.is_empty() => {
            list.iter().map(scalar).collect::<Option<Vec<_>>>()
        }
        other => scalar(other).map(|v| vec![v]),
    };
    values.ok_or_else(|| {
        ArgError(format!(
            "{name} must be a string or a non-empty list of strings"
        ))
    })
}

/// Reads the budget arguments out of `arguments` (removing those that do not go upstream)
/// and verifies the cursor, for a call to `tool` under `rule`.
pub fn take(
    tool: &str,
    arguments: &mut Map<String, Value>,
    rule: &Items,
    key: &CursorKey,
) -> Result<CallArgs, ArgError> {
    // `null` means absent: models often send null for an optional argument.
    let mut grab = |name: &str| {
        let value = if rule.passthrough.iter().any(|p| p == name) {
            arguments.get(name).cloned()
        } else {
            arguments.remove(name)
        };
        value.filter(|v| !v.is_null())
    };
    let horizon_value = grab("horizon");
    let detail_value = grab("detail");
    let limit_value = grab("limit");
    let after_value = grab("after");
    let format_value = grab("format");
    let filter_values_given: Vec<(String, Value, &crate::policy::FieldPath)> = rule
        .filters
        .iter()
        .filter_map(|(name, field)| grab(name).map(|v| (name.clone(), v, field)))
        .collect();

    let horizon = match (&rule.horizon, &horizon_value) {
        (None, _) => None,
        (Some(_), None) => Some(HorizonArg::Live),
        (Some(_), Some(v)) => {
            Some([HorizonArg::Live, HorizonArg::All][one_of("horizon", v, &["live", "all"])?])
        }
    };
    let detail = match (&rule.summary, &detail_value) {
        (None, _) => None,
        (Some(_), None) => Some(Detail::Summary),
        (Some(_), Some(v)) => {
            Some([Detail::Summary, Detail::Full][one_of("detail", v, &["summary", "full"])?])
        }
    };
    let limit = match &limit_value {
        None => rule.default_limit,
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| (1..=rule.max_limit).contains(n))
            .ok_or_else(|| {
                ArgError(format!(
                    "limit must be an integer between 1 and {}",
                    rule.max_limit
                ))
            })?,
    };
    let format = match (&rule.columns, &format_value) {
        (_, None) => Format::Json,
        (Some(_), Some(v)) => {
            [Format::Json, Format::Csv, Format::Tsv][one_of("format", v, &["json", "csv", "tsv"])?]
        }
        (None, Some(v)) => {
            one_of("format", v, &["json"])?;
            Format::Json
        }
    };
    let mut filters = Vec::new();
    for (name, value, field) in filter_values_given {
        let values = filter_values(&name, &value)?;
        filters.push((
            name,
            Filter {
                field: field.clone(),
                values,
            },
        ));
    }
    let digest = cursor::digest(&json!({
        "tool": tool,
        "arguments": Value::Object(arguments.clone()),
        "horizon": match horizon { Some(HorizonArg::All) => "all", Some(HorizonArg::Live) => "live", None => "" },
        "filters": filters.iter().map(|(name, f)| json!([name, f.values])).collect::<Vec<_>>(),
    }));
    let after = match &after_value {
        None => None,
        Some(Value::String(text)) => Some(
            key.verify(text, &digest)
                .map_err(|err| cursor_error(err, tool))?,
        ),
        Some(_) => {
            return Err(ArgError(
                "after must be the next_after string of a previous page; call again without after to start from the first page".into(),
            ));
        }
    };
    Ok(CallArgs {
        horizon,
        horizon_defaulted: horizon_value.is_none(),
        detail,
        detail_defaulted: detail_value.is_none(),
        limit,
        limit_defaulted: limit_value.is_none(),
        after,
        format,
        filters,
        digest,
        reference: None,
    })
}

/// The budget arguments of a text-paged call: only `after`.
#[derive(Debug, Clone)]
pub struct TextArgs {
    /// Byte offset where the page starts.
    pub after: Option<usize>,
    /// The fingerprint of the result the cursor was minted in (cursors from before it carried
    /// one have none).
    pub fingerprint: Option<u64>,
    /// Where the page starts when the chain is the automatic pager's (a JSON document in the
    /// text is paged as JSON).
    pub auto: Option<super::auto::At>,
    pub digest: SelectionDigest,
}

/// Reads (and strips) `after` for a text-paged tool and verifies it.
pub fn take_text(
    tool: &str,
    arguments: &mut Map<String, Value>,
    key: &CursorKey,
) -> Result<TextArgs, ArgError> {
    let after_value = arguments.remove("after").filter(|v| !v.is_null());
    let digest = cursor::digest(&json!({
        "tool": tool,
        "arguments": Value::Object(arguments.clone()),
        "text": true,
    }));
    let position = match &after_value {
        None => None,
        Some(Value::String(text)) => Some(
            key.verify(text, &digest)
                .map_err(|err| cursor_error(err, tool))?,
        ),
        Some(_) => {
            return Err(ArgError(
                "after must be the next_after string of a previous page; call again without after to start from the first page".into(),
            ));
        }
    };
    Ok(TextArgs {
        after: position.as_ref().map(|p| p.offset),
        fingerprint: position.as_ref().and_then(super::page::fingerprint_of),
        auto: position.as_ref().and_then(super::auto::At::from_position),
        digest,
    })
}

fn cursor_error(err: CursorError, tool: &str) -> ArgError {
    match err {
        CursorError::Invalid => ArgError(
            "after is not a cursor this proxy issued (it is malformed or was altered); \
             call again without after to start from the first page"
                .into(),
        ),
        CursorError::OtherQuery => ArgError(format!(
            "after belongs to a different query (another tool, other arguments, horizon or \
             filters); repeat the exact arguments of the {tool} call that returned it, or \
             call again without after to start from the first page"
        )),
        CursorError::OtherKey => ArgError(cursor::OTHER_KEY.into()),
    }
}
