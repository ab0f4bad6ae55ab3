//! What `wrap --dry-run` hides in the diff it prints: the values of headers, of variables and
//! keys whose name looks secret, and of `--upstream-header` words, each shown as `***` with its
//! name kept. The diff is of the old and new text, each masked the same way, so its lines are
//! those of the real edit. The file written is never masked.

/// What a hidden value is shown as.
pub const MASK: &str = "***";

/// Whether a key or variable's name looks like it holds a secret (case-insensitive).
pub fn looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    [
        "TOKEN",
        "SECRET",
        "KEY",
        "PASSWORD",
        "PASSWD",
        "AUTH",
        "CREDENTIAL",
    ]
    .iter()
    .any(|word| upper.contains(word))
        || upper.starts_with(super::plan::HEADER_PREFIX)
}

/// Whether a key holds headers (every value of which is hidden).
pub fn is_headers(name: &str) -> bool {
    matches!(name, "headers" | "http_headers")
}

/// `Name: value` with its value hidden.
pub fn header_word(word: &str) -> String {
    match word.split_once(':') {
        Some((name, _)) => format!("{name}: {MASK}"),
        None => MASK.to_string(),
    }
}

/// Whether a string value under `key` is hidden (`in_headers`: the key is a header's).
pub fn hides(key: &str, in_headers: bool) -> bool {
    in_headers || looks_secret(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_look_secret() {
        for name in [
            "API_KEY",
            "github_token",
            "Authorization",
            "DB_PASSWORD",
            "clientSecret",
            "AWS_CREDENTIALS",
            "MCP_BUDGET_HEADER_X_TEAM",
        ] {
            assert!(looks_secret(name), "{name}");
        }
        for name in ["DEBUG", "PATH", "command", "MCP_BUDGET_WRAPPED"] {
            assert!(!looks_secret(name), "{name}");
        }
        assert_eq!(
            header_word("Authorization: Bearer sk-1"),
            "Authorization: ***"
        );
    }
}
