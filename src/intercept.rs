//! The two interception points of the relay: `tools/list` responses and `tools/call` calls.
//!
//! Everything else passes through the relay untouched. The relay hands these functions the
//! exact bytes of one message and forwards the bytes they return; `None` means "unchanged",
//! so a message the budget does not touch is never re-serialized.

use crate::message::Id;

/// Decides what happens to `tools/list` results and `tools/call` requests and results.
#[derive(Debug, Default)]
pub struct Interceptor {}

/// What the relay remembers about a `tools/call` until its response arrives.
#[derive(Debug, Default)]
pub struct CallContext {}

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

impl Interceptor {
    /// An interceptor that changes nothing.
    pub fn passthrough() -> Self {
        Interceptor {}
    }

    /// Whether any hook can change a message; when false the relay skips the hooks entirely.
    pub fn is_passthrough(&self) -> bool {
        true
    }

    /// A response to the client's `tools/list`: the rewritten message, or `None` to forward it.
    pub fn tools_list_response(&self, _message: &[u8]) -> Option<Vec<u8>> {
        None
    }

    /// A client's `tools/call` request.
    pub fn tools_call_request(&self, _id: &Id, _message: &[u8]) -> CallDecision {
        CallDecision::Forward {
            rewritten: None,
            context: CallContext::default(),
        }
    }

    /// The response to a `tools/call`: the rewritten message, or `None` to forward it.
    pub fn tools_call_response(&self, _context: CallContext, _message: &[u8]) -> Option<Vec<u8>> {
        None
    }
}
