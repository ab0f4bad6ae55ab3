//! What the proxy knows of MCP itself, in one place: the revisions it serves, and one table of
//! the methods whose handling depends on what they are (their era, whether they take input,
//! whether their results may be cached, the capability they need, the member their
//! `Mcp-Name` header carries).

/// The modern revision the proxy serves.
pub const MODERN: &str = "2026-07-28";

/// Every revision the proxy's clients may speak: the modern one, then the legacy ones, newest
/// first.
pub const SUPPORTED: &[&str] = &[
    MODERN,
    "2025-11-25",
    "2025-06-18",
    "2025-03-26",
    "2024-11-05",
];

/// Which revisions have a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eras {
    Both,
    /// Removed in 2026-07-28: a modern client is not served it.
    LegacyOnly,
    /// New in 2026-07-28.
    ModernOnly,
}

/// One method, as the proxy treats it.
#[derive(Debug)]
pub struct Method {
    pub name: &'static str,
    pub eras: Eras,
    /// A client request that a 2026-07-28 server may answer with `input_required` (multi
    /// round-trip), and that the bridge therefore rounds for a legacy server.
    pub takes_input: bool,
    /// A result a 2026-07-28 server marks with caching fields (`ttlMs`, `cacheScope`).
    pub cacheable: bool,
    /// A server's request for input: the client capability it needs.
    pub capability: Option<&'static str>,
    /// The member of `params` that the `Mcp-Name` header carries.
    pub name_member: Option<&'static str>,
}

const fn method(name: &'static str, eras: Eras) -> Method {
    Method {
        name,
        eras,
        takes_input: false,
        cacheable: false,
        capability: None,
        name_member: None,
    }
}

/// The methods whose handling depends on what they are; any other is forwarded as it is.
pub const METHODS: &[Method] = &[
    Method {
        takes_input: true,
        name_member: Some("name"),
        ..method("tools/call", Eras::Both)
    },
    Method {
        cacheable: true,
        ..method("tools/list", Eras::Both)
    },
    Method {
        takes_input: true,
        name_member: Some("name"),
        ..method("prompts/get", Eras::Both)
    },
    Method {
        cacheable: true,
        ..method("prompts/list", Eras::Both)
    },
    Method {
        takes_input: true,
        cacheable: true,
        name_member: Some("uri"),
        ..method("resources/read", Eras::Both)
    },
    Method {
        cacheable: true,
        ..method("resources/list", Eras::Both)
    },
    Method {
        cacheable: true,
        ..method("resources/templates/list", Eras::Both)
    },
    Method {
        cacheable: true,
        ..method("server/discover", Eras::ModernOnly)
    },
    method("subscriptions/listen", Eras::ModernOnly),
    Method {
        name_member: Some("taskId"),
        ..method("tasks/get", Eras::Both)
    },
    Method {
        name_member: Some("taskId"),
        ..method("tasks/update", Eras::ModernOnly)
    },
    Method {
        name_member: Some("taskId"),
        ..method("tasks/cancel", Eras::Both)
    },
    method("tasks/result", Eras::Both),
    method("ping", Eras::LegacyOnly),
    method("logging/setLevel", Eras::LegacyOnly),
    method("resources/subscribe", Eras::LegacyOnly),
    method("resources/unsubscribe", Eras::LegacyOnly),
    Method {
        capability: Some("elicitation"),
        ..method("elicitation/create", Eras::Both)
    },
    Method {
        capability: Some("sampling"),
        ..method("sampling/createMessage", Eras::Both)
    },
    Method {
        capability: Some("roots"),
        ..method("roots/list", Eras::Both)
    },
];

/// The table's entry for `name`.
pub fn method_of(name: &str) -> Option<&'static Method> {
    METHODS.iter().find(|m| m.name == name)
}

/// The member of `params` that `Mcp-Name` carries for `method`, if it carries one.
pub fn name_member(method: &str) -> Option<&'static str> {
    method_of(method)?.name_member
}

/// Whether a 2026-07-28 server may answer `method` with `input_required`.
pub fn takes_input(method: &str) -> bool {
    method_of(method).is_some_and(|m| m.takes_input)
}

/// Whether a 2026-07-28 result of `method` carries caching fields.
pub fn cacheable(method: &str) -> bool {
    method_of(method).is_some_and(|m| m.cacheable)
}

/// Whether `method` is a server's request for input from the client.
pub fn is_input_request(method: &str) -> bool {
    method_of(method).is_some_and(|m| m.capability.is_some())
}

/// The client capability a server's request for input needs (elicitation for any other).
pub fn capability_of(method: &str) -> &'static str {
    method_of(method)
        .and_then(|m| m.capability)
        .unwrap_or("elicitation")
}

/// Whether 2026-07-28 removed `method` (a modern client is not served it).
pub fn removed_in_modern(method: &str) -> bool {
    method_of(method).is_some_and(|m| m.eras == Eras::LegacyOnly)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_is_in_the_table_once() {
        for (i, m) in METHODS.iter().enumerate() {
            assert!(
                METHODS[..i].iter().all(|other| other.name != m.name),
                "{} twice",
                m.name
            );
        }
    }

    #[test]
    fn the_table_answers_what_each_method_is() {
        assert_eq!(name_member("resources/read"), Some("uri"));
        assert_eq!(name_member("tools/list"), None);
        assert!(takes_input("prompts/get") && !takes_input("tools/list"));
        assert!(cacheable("server/discover") && !cacheable("tools/call"));
        assert!(is_input_request("roots/list") && !is_input_request("tools/call"));
        assert_eq!(capability_of("sampling/createMessage"), "sampling");
        assert!(removed_in_modern("logging/setLevel") && !removed_in_modern("tools/call"));
        assert_eq!(SUPPORTED[0], MODERN);
    }
}
