//! The two interception points of the relay: `tools/list` responses and `tools/call` calls.
//!
//! Everything else passes through the relay untouched. The relay hands these functions the
//! exact bytes of one message and forwards the bytes they return; `None` means "unchanged",
//! so a message the budget does not touch is never re-serialized. A rewritten result is
//! spliced into the original bytes in place of the old one, so the rest of the response
//! (id form, key order, extra fields) stays as the server wrote it.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::budget::{Budget, CallPlan};
use crate::message::{Id, splice};
use crate::policy::Policy;

/// Applies the budget at the relay's two interception points.
#[derive(Debug)]
pub struct Interceptor {
    budget: Arc<Budget>,
}

/// What the relay remembers about a `tools/call` until its response arrives.
#[derive(Debug)]
pub struct CallContext {
    plan: CallPlan,
}

/// What to do with a client's `tools/call` request.
#[derive(Debug)]
pub enum CallDecision {
    /// Forward it upstream (rewritten when `Some`), and pass the context to the response hook.
    Forward {
        rewritten: Option<Vec<u8>>,
        context: CallContext,
    },
    /// Answer the client directly with this message; nothing goes upstream.
    Answer(Vec<u8>),
}

#[derive(Deserialize)]
struct ResultOnly<'a> {
    #[serde(borrow)]
    result: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct IdOf<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct CallName<'a> {
    #[serde(borrow)]
    params: Option<NameOnly<'a>>,
}

#[derive(Deserialize)]
struct NameOnly<'a> {
    #[serde(borrow)]
    name: Option<std::borrow::Cow<'a, str>>,
}

impl Interceptor {
    pub fn new(budget: Budget) -> Self {
        Interceptor {
            budget: Arc::new(budget),
        }
    }

    /// An interceptor for one of several sessions under the same budget (and cursor key).
    pub fn shared(budget: Arc<Budget>) -> Self {
        Interceptor { budget }
    }

    /// The built-in policy: no rules; every tool result is capped at the default size.
    pub fn passthrough() -> Self {
        Interceptor::new(Budget::new(Policy::default()))
    }

    /// A response to the client's `tools/list`: the rewritten message, or `None` to forward it.
    pub fn tools_list_response(&self, message: &[u8]) -> Option<Vec<u8>> {
        if self.budget.policy().rules.is_empty() {
            return None;
        }
        let raw = serde_json::from_slice::<ResultOnly<'_>>(message)
            .ok()?
            .result?;
        let mut result: Value = serde_json::from_str(raw.get()).ok()?;
        if !self.budget.rewrite_tools_list(&mut result) {
            return None;
        }
        let bytes = serde_json::to_vec(&result).ok()?;
        Some(splice(message, raw, &bytes))
    }

    /// A client's `tools/call` request.
    pub fn tools_call_request(&self, id: &Id, message: &[u8]) -> CallDecision {
        let forward = |plan: CallPlan, rewritten: Option<Vec<u8>>| CallDecision::Forward {
            rewritten,
            context: CallContext { plan },
        };
        let name = serde_json::from_slice::<CallName<'_>>(message)
            .ok()
            .and_then(|m| m.params)
            .and_then(|p| p.name)
            .map(|n| n.into_owned())
            .unwrap_or_default();
        if !self.budget.is_paged(&name) {
            return forward(self.budget.plan_unpaged(name), None);
        }
        let mut request = match serde_json::from_slice::<Value>(message) {
            Ok(request) => request,
            Err(err) => {
                // The budget cannot read its arguments, so it cannot apply the policy: refuse
                // rather than pass an unbudgeted call through.
                let text = format!("Parse error: the tools/call request could not be read ({err})");
                return CallDecision::Answer(crate::jsonrpc::error_response(
                    Some(id),
                    crate::jsonrpc::PARSE_ERROR,
                    &text,
                    None,
                ));
            }
        };
        let Some(params) = request.get_mut("params") else {
            return forward(self.budget.plan_unpaged(name), None);
        };
        let before = params
            .get("arguments")
            .map(|a| a.as_object().map_or(0, |o| o.len()));
        match self.budget.prepare_call(params) {
            Err(error) => {
                tracing::debug!(tool = %name, %error, "budget argument refused");
                CallDecision::Answer(crate::jsonrpc::tool_error(id, &error.to_string()))
            }
            Ok(plan) => {
                let after = params
                    .get("arguments")
                    .map(|a| a.as_object().map_or(0, |o| o.len()));
                let rewritten = (before != after)
                    .then(|| serde_json::to_vec(&request).ok())
                    .flatten();
                forward(plan, rewritten)
            }
        }
    }

    /// The response to a `tools/call`: the rewritten message, or `None` to forward it.
    pub fn tools_call_response(&self, context: CallContext, message: &[u8]) -> Option<Vec<u8>> {
        let raw = serde_json::from_slice::<ResultOnly<'_>>(message)
            .ok()?
            .result?;
        let size = raw.get().len();
        if self.budget.passes_unread(&context.plan, size) {
            return None;
        }
        let bytes = if context.plan.is_paged() {
            match serde_json::from_str::<Value>(raw.get()) {
                Ok(result) => self.budget.finish_call(&context.plan, result),
                Err(_) => self.budget.refuse_unread(&context.plan, size),
            }
        } else {
            self.budget.refuse_unread(&context.plan, size)
        };
        let bytes = match bytes {
            Ok(bytes) => bytes,
            Err(err) => {
                tracing::error!(tool = %context.plan.tool, %err, "the budget failed on a result");
                let id = serde_json::from_slice::<IdOf<'_>>(message)
                    .ok()
                    .and_then(|m| m.id)
                    .map(|raw| Id::from_json_text(raw.get()));
                return Some(crate::jsonrpc::error_response(
                    id.as_ref(),
                    crate::jsonrpc::UPSTREAM_ERROR,
                    &format!("mcp-budget: {err}; the result was withheld rather than cut"),
                    None,
                ));
            }
        };
        Some(splice(message, raw, &bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_keeps_everything_around_the_result() {
        let message = br#"{"id":7.0,"result":{"a":1},"x-extra":true}"#;
        let raw = serde_json::from_slice::<ResultOnly<'_>>(message)
            .unwrap()
            .result
            .unwrap();
        assert_eq!(
            String::from_utf8(splice(message, raw, b"{\"b\":2}")).unwrap(),
            r#"{"id":7.0,"result":{"b":2},"x-extra":true}"#
        );
    }
}
