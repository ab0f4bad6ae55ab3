//! Task tokens: what a 2026-07-28 client is shown for a task id.
//!
//! With the tasks extension there is no session to remember a task in, and any replica may be
//! asked for its result. So the proxy never shows a modern client the server's task id: it
//! shows a token that wraps it together with the call that made the task (the tool, the
//! arguments the client sent, budget arguments included, and the client's name), sealed under
//! the cursor key's MAC and bound to the principal. Whichever proxy holds the key can then
//! budget the task's final result as that call's answer, and send the server its own id.
//!
//! The token is readable (a MAC, not a cipher): it carries only what the client sent itself
//! and the id the server gave it. A token that was altered, sealed under another key, or for
//! another principal does not open.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::budget::cursor::{CursorKey, SealError};

/// What every task token starts with. A modern client names every task by a token: any other
/// id is refused (a server's own id reaches the client only through the proxy's wrapping).
pub const PREFIX: &str = "mcpb-task.";

/// What the MAC binds a task token to (a cursor or another sealed token is never one).
const PURPOSE: &str = "task";

/// The longest arguments a token carries. A call with more is not carried: the token names the
/// task only, and the session that saw the call holds it (another replica holds the result to
/// the cap, and refuses it when over).
pub const MAX_CARRIED: usize = 4096;

/// The call that made a task, as a token carries it.
#[derive(Debug, Clone)]
pub struct Call {
    pub tool: String,
    /// The arguments as the client sent them (budget arguments included), as JSON text.
    pub arguments: Option<Box<RawValue>>,
    /// The client's name in the call's `_meta` (its profile).
    pub client: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct Body<'a> {
    #[serde(borrow, rename = "t")]
    task: Cow<'a, str>,
    #[serde(borrow, rename = "n", default, skip_serializing_if = "Option::is_none")]
    tool: Option<Cow<'a, str>>,
    #[serde(borrow, rename = "a", default, skip_serializing_if = "Option::is_none")]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, rename = "c", default, skip_serializing_if = "Option::is_none")]
    client: Option<Cow<'a, str>>,
}

/// The token a modern client is shown for the server's task `task`, made by `call` (when it is
/// known and small enough to carry), for `owner` (the principal).
pub fn wrap(key: &CursorKey, owner: &str, task: &str, call: Option<&Call>) -> String {
    let call = call.filter(|call| {
        call.arguments.as_ref().map_or(0, |a| a.get().len())
            + call.tool.len()
            + call.client.as_ref().map_or(0, String::len)
            <= MAX_CARRIED
    });
    let body = Body {
        task: Cow::Borrowed(task),
        tool: call.map(|c| Cow::Borrowed(c.tool.as_str())),
        arguments: call.and_then(|c| c.arguments.as_deref()),
        client: call.and_then(|c| c.client.as_deref().map(Cow::Borrowed)),
    };
    // A body of strings and JSON text always serializes.
    let body = serde_json::to_vec(&body).unwrap_or_default();
    format!("{PREFIX}{}", key.seal(PURPOSE, owner, &body))
}

/// Why a task token was refused: each names the way out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "Invalid params: this taskId was not issued by mcp-budget as it stands (it was altered or cut); use the taskId the tools/call answer gave, or call the tool again"
    )]
    Altered,
    #[error(
        "Invalid params: this taskId was issued by another mcp-budget instance, or before its cursor key changed (give every instance one key: [budget] cursor_key_env or --cursor-key-file); call the tool again"
    )]
    OtherKey,
    #[error(
        "Invalid params: this taskId was not issued by mcp-budget: through mcp-budget a task is named by the taskId its tools/call answer gave (mcpb-task.…); use that one"
    )]
    NotIssued,
    #[error(
        "Invalid params: this taskId was issued to another principal (another credential or client address); only the client that started a task can reach it"
    )]
    OtherPrincipal,
}

/// The server's task id and the call a token carries; `Ok(None)`: `token` is no task token.
pub fn unwrap(
    key: &CursorKey,
    owner: &str,
    token: &str,
) -> Result<Option<(String, Option<Call>)>, Refused> {
    let Some(sealed) = token.strip_prefix(PREFIX) else {
        return Ok(None);
    };
    let body = key
        .unseal(PURPOSE, owner, sealed)
        .map_err(|err| match err {
            SealError::Invalid => Refused::Altered,
            SealError::OtherKey => Refused::OtherKey,
            SealError::OtherOwner => Refused::OtherPrincipal,
        })?;
    let body: Body<'_> = serde_json::from_slice(&body).map_err(|_| Refused::Altered)?;
    let call = body.tool.map(|tool| Call {
        tool: tool.into_owned(),
        arguments: body.arguments.map(|a| a.to_owned()),
        client: body.client.map(Cow::into_owned),
    });
    Ok(Some((body.task.into_owned(), call)))
}

/// `message` with every string member `name` of `object` (a part of `message`, a JSON
/// object) replaced by what `map` makes of it; `None` when `map` changed none. Only those
/// strings are written anew: every other byte stays as the peer wrote it.
pub fn respell_member(
    message: &[u8],
    object: &str,
    name: &str,
    mut map: impl FnMut(&str) -> Option<String>,
) -> Option<Vec<u8>> {
    edit_members(message, object, name, |text| {
        let value = serde_json::from_str::<String>(text).ok()?;
        map(&value).map(|new| quoted(&new))
    })
}

/// `message` with the array of strings `name` of `object` (a part of `message`) made anew by
/// `map` (a string it leaves is kept); `None` when it changed none.
pub fn respell_list(
    message: &[u8],
    object: &str,
    name: &str,
    mut map: impl FnMut(&str) -> Option<String>,
) -> Option<Vec<u8>> {
    edit_members(message, object, name, |text| {
        let list = serde_json::from_str::<Vec<String>>(text).ok()?;
        let mut changed = false;
        let list: Vec<String> = list
            .into_iter()
            .map(|item| match map(&item) {
                Some(new) => {
                    changed = true;
                    new
                }
                None => item,
            })
            .collect();
        changed.then(|| serde_json::to_string(&list).unwrap_or_default())
    })
}

/// `message` with the value of each member `name` of `object` (a part of `message`) replaced
/// by the text `edit` makes of it (`None`: kept); `None` when it replaced none.
fn edit_members(
    message: &[u8],
    object: &str,
    name: &str,
    mut edit: impl FnMut(&str) -> Option<String>,
) -> Option<Vec<u8>> {
    let base = (object.as_ptr() as usize).checked_sub(message.as_ptr() as usize)?;
    let members = crate::budget::raw::members(object)?;
    let edits: Vec<(std::ops::Range<usize>, String)> = members
        .into_iter()
        .filter(|(key, _)| key == name)
        .filter_map(|(_, range)| {
            let new = edit(object.get(range.clone())?)?;
            Some((base + range.start..base + range.end, new))
        })
        .collect();
    (!edits.is_empty()).then(|| splice_all(message, edits))
}

/// A string as JSON text.
fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}

/// `message` with each range (in order, not overlapping) replaced by its text.
fn splice_all(message: &[u8], mut edits: Vec<(std::ops::Range<usize>, String)>) -> Vec<u8> {
    edits.sort_by_key(|(range, _)| range.start);
    let mut out =
        Vec::with_capacity(message.len() + edits.iter().map(|(_, t)| t.len()).sum::<usize>());
    let mut at = 0;
    for (range, text) in edits {
        if range.start < at || range.end > message.len() {
            continue;
        }
        out.extend_from_slice(&message[at..range.start]);
        out.extend_from_slice(text.as_bytes());
        at = range.end;
    }
    out.extend_from_slice(&message[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(arguments: &str) -> Call {
        Call {
            tool: "journal".into(),
            arguments: Some(RawValue::from_string(arguments.into()).unwrap()),
            client: Some("codex-mcp-client".into()),
        }
    }

    #[test]
    fn a_token_opens_to_the_task_and_its_call() {
        let key = CursorKey::from_secret(b"k");
        let c = call(r#"{"lines":20000,"after":null}"#);
        let token = wrap(&key, "Token(0)", "task-7", Some(&c));
        assert!(token.starts_with(PREFIX));
        assert!(!token.contains("task-7"), "{token}");
        let (task, carried) = unwrap(&key, "Token(0)", &token).unwrap().unwrap();
        assert_eq!(task, "task-7");
        let carried = carried.unwrap();
        assert_eq!(carried.tool, c.tool);
        assert_eq!(carried.client, c.client);
        assert_eq!(
            carried.arguments.map(|a| a.get().to_string()),
            c.arguments.map(|a| a.get().to_string())
        );
        assert_eq!(
            unwrap(&key, "Token(1)", &token).err(),
            Some(Refused::OtherPrincipal)
        );
        assert_eq!(
            unwrap(&CursorKey::from_secret(b"j"), "Token(0)", &token).err(),
            Some(Refused::OtherKey)
        );
        assert!(matches!(unwrap(&key, "Token(0)", "task-7"), Ok(None)));
        assert_eq!(
            unwrap(&key, "Token(0)", &format!("{token}x")).err(),
            Some(Refused::Altered)
        );
    }

    #[test]
    fn members_and_lists_are_respelled_in_place() {
        let line = br#"{"id":1,"result":{"taskId":"a","status":"working","x":{"taskId":"a"}}}"#;
        let text = std::str::from_utf8(line).unwrap();
        let result = &text[17..text.len() - 1];
        let out = respell_member(line, result, "taskId", |v| Some(format!("<{v}>"))).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"id":1,"result":{"taskId":"<a>","status":"working","x":{"taskId":"a"}}}"#
        );
        assert!(respell_member(line, result, "taskId", |_| None).is_none());
        let line = br#"{"params":{"notifications":{"taskIds":["a", "b"],"tools":true}}}"#;
        let text = std::str::from_utf8(line).unwrap();
        let inner = &text[27..text.len() - 2];
        let out = respell_list(line, inner, "taskIds", |v| (v == "b").then(|| "B".into())).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"params":{"notifications":{"taskIds":["a","B"],"tools":true}}}"#
        );
    }

    #[test]
    fn a_call_too_big_to_carry_leaves_the_token_naming_the_task_only() {
        let key = CursorKey::from_secret(b"k");
        let big = format!(r#"{{"q":"{}"}}"#, "x".repeat(MAX_CARRIED));
        let token = wrap(&key, "stdio", "t", Some(&call(&big)));
        assert!(token.len() < 256, "{}", token.len());
        let (task, carried) = unwrap(&key, "stdio", &token).unwrap().unwrap();
        assert_eq!(task, "t");
        assert!(carried.is_none());
    }
}
