//! The shipped policies, compiled into the binary: a `cargo install` user has them without a
//! checkout. `--policy builtin:NAME` selects one (and `check`, `explain`, `report` take the
//! same name); `mcp-budget policies` lists them with the servers each one is written for.

/// One built-in policy.
#[derive(Debug)]
pub struct Builtin {
    pub name: &'static str,
    /// The `serverInfo.name`s of the servers it is written for.
    pub servers: &'static [&'static str],
    /// What it is for, in a line.
    pub about: &'static str,
    pub text: &'static str,
}

pub const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "fleet",
        servers: &["fleet-server"],
        about: "the example fleet server (examples/fleet_server.rs)",
        text: include_str!("../policies/fleet.toml"),
    },
    Builtin {
        name: "filesystem",
        servers: &["secure-filesystem-server"],
        about: "@modelcontextprotocol/server-filesystem",
        text: include_str!("../policies/filesystem.toml"),
    },
    Builtin {
        name: "git",
        servers: &["mcp-git"],
        about: "mcp-server-git (PyPI)",
        text: include_str!("../policies/git.toml"),
    },
    Builtin {
        name: "everything",
        servers: &["mcp-servers/everything", "example-servers/everything"],
        about: "@modelcontextprotocol/server-everything",
        text: include_str!("../policies/everything.toml"),
    },
];

/// The built-in policy called `name`.
pub fn by_name(name: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.name == name)
}

/// The built-in policy written for the server that calls itself `server` in `serverInfo.name`.
pub fn for_server(server: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.servers.contains(&server))
}

/// The names, for an error message.
pub fn names() -> String {
    BUILTINS
        .iter()
        .map(|b| format!("builtin:{}", b.name))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_policy_is_valid() {
        for builtin in BUILTINS {
            let path = std::path::PathBuf::from(format!("builtin:{}", builtin.name));
            crate::policy::Policy::parse(builtin.text, &path)
                .unwrap_or_else(|e| panic!("{}: {e}", builtin.name));
        }
        assert_eq!(for_server("mcp-git").map(|b| b.name), Some("git"));
        assert!(by_name("nope").is_none());
    }
}
