//! The README stays true to the program it documents:
//!
//! - its demo output (between `<!-- demo-output:start -->` and `<!-- demo-output:end -->`) is
//!   what `cargo run --example demo -- --streams 68` prints, byte for byte, and its opening
//!   before/after table is the demo's own;
//! - it holds at most 700 lines (the reference lives in docs/);
//! - every mcp-budget option it and docs/ name is one the binary's `--help` knows;
//! - docs/cli.md is the binary's own `--help` output (`MCP_BUDGET_WRITE_DOCS=1 cargo test --test
//!   readme` writes it again after a change to the command line).
//!
//! A page that carries a cursor (`next_after`) carries a MAC under the cursor key: its bytes do
//! not change with the key, its o200k token count moves by a few tokens. The demo runs its
//! proxy with a fixed key of its own (examples/demo.rs, `--cursor-key-file`), so its output is
//! the same on every machine; the test also gives it a state folder of its own, so that no
//! user's key is read.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const DEMO_ARGS: &[&str] = &["--streams", "68"];
const START: &str = "<!-- demo-output:start -->";
const END: &str = "<!-- demo-output:end -->";
const MAX_LINES: usize = 700;
/// The cursor key the demo's proxy runs with in this test (any 32 bytes or more; not a secret).
const DEMO_CURSOR_KEY: &str = "mcp-budget README demo cursor key: not a secret, 0123456789";

/// The variables `cargo test` sets for the crate under test. Passed on to a nested cargo, they
/// change its environment, and it rebuilds what depends on them (the demo strips them too).
fn set_by_cargo(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_EXE_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "CARGO_RUSTC_CURRENT_DIR"
                | "OUT_DIR"
        )
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `target/<profile>`: the folder above the test binary's `deps`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("target dir")
        .to_path_buf()
}

/// A command with the environment a user's shell would give it (no variables of `cargo test`).
fn clean(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new(program);
    for (name, _) in std::env::vars_os() {
        if set_by_cargo(&name.to_string_lossy()) {
            command.env_remove(&name);
        }
    }
    command.current_dir(root());
    command
}

/// What `cargo run --example demo -- --streams 68` prints on stdout, with the fixed cursor key.
fn demo_output() -> String {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = clean(&cargo);
    build.args(["build", "--quiet", "--example", "demo"]);
    if !cfg!(debug_assertions) {
        build.arg("--release");
    }
    let status = build.status().expect("running cargo build --example demo");
    assert!(status.success(), "cargo build --example demo failed");
    let demo = target_dir().join("examples").join("demo");
    assert!(demo.exists(), "{} is not built", demo.display());

    let state = std::env::temp_dir().join(format!("mcp-budget-readme-{}", std::process::id()));
    let key_dir = state.join("mcp-budget");
    std::fs::create_dir_all(&key_dir).expect("state dir");
    let key = key_dir.join("cursor.key");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::remove_file(&key);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&key)
            .expect("cursor key file");
        file.write_all(DEMO_CURSOR_KEY.as_bytes())
            .expect("write key");
    }
    let out = clean(&demo)
        .args(DEMO_ARGS)
        .env("XDG_STATE_HOME", &state)
        .env("CARGO", &cargo)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("running the demo");
    let _ = std::fs::remove_dir_all(&state);
    assert!(out.status.success(), "the demo failed: {}", out.status);
    String::from_utf8(out.stdout).expect("the demo prints UTF-8")
}

/// Lines without trailing whitespace, and no trailing empty lines.
fn normalized(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text.lines().map(|l| l.trim_end().to_string()).collect();
    while lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
}

/// The README's demo block: the lines inside the ```text fence between the markers.
fn readme_demo_block(readme: &str) -> Vec<String> {
    let start = readme
        .find(START)
        .unwrap_or_else(|| panic!("README.md has no {START}"));
    let end = readme
        .find(END)
        .unwrap_or_else(|| panic!("README.md has no {END}"));
    assert!(start < end, "{START} comes after {END}");
    let inside = &readme[start + START.len()..end];
    let inside = inside.trim_matches('\n');
    let body = inside
        .strip_prefix("```text\n")
        .unwrap_or_else(|| panic!("the demo block opens with ```text right after {START}"));
    let body = body
        .trim_end()
        .strip_suffix("```")
        .unwrap_or_else(|| panic!("the demo block closes with ``` right before {END}"));
    normalized(body)
}

#[test]
fn the_readme_holds_at_most_700_lines() {
    let lines = read("README.md").lines().count();
    assert!(
        lines <= MAX_LINES,
        "README.md has {lines} lines, more than {MAX_LINES}: move reference detail to docs/"
    );
}

#[test]
fn the_readme_demo_output_is_what_the_demo_prints() {
    let readme = read("README.md");
    let printed = demo_output();
    let expected = normalized(&printed);
    let shown = readme_demo_block(&readme);
    if shown != expected {
        let mut diff = String::new();
        for i in 0..shown.len().max(expected.len()) {
            let (a, b) = (shown.get(i), expected.get(i));
            if a != b {
                diff.push_str(&format!(
                    "line {}:\n  README: {}\n  demo:   {}\n",
                    i + 1,
                    a.map_or("(none)", String::as_str),
                    b.map_or("(none)", String::as_str)
                ));
            }
        }
        panic!(
            "README.md's demo output is not what `cargo run --example demo -- --streams 68` prints \
             (with this test's cursor key). Differences:\n{diff}\nThe demo printed:\n{printed}"
        );
    }

    // The opening before/after table is the demo's table, row for row.
    let table: Vec<&String> = expected.iter().filter(|l| l.starts_with('|')).collect();
    assert!(!table.is_empty(), "the demo printed no table");
    let before_block: Vec<String> = normalized(&readme[..readme.find(START).unwrap()]);
    let found = before_block
        .windows(table.len())
        .any(|w| w.iter().zip(&table).all(|(a, b)| a == *b));
    assert!(
        found,
        "README.md's before/after table (above the demo block) is not the demo's:\n{}",
        table
            .iter()
            .map(|l| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// `mcp-budget [SUBCOMMAND] --help`, for the binary and each subcommand it lists.
fn help_texts() -> Vec<(String, String)> {
    let bin = env!("CARGO_BIN_EXE_mcp-budget");
    let help = |args: &[&str]| {
        let out = Command::new(bin)
            .args(args)
            .output()
            .expect("running mcp-budget --help");
        assert!(out.status.success(), "mcp-budget {args:?} failed");
        String::from_utf8(out.stdout).expect("UTF-8 help")
    };
    let main = help(&["--help"]);
    let mut texts = vec![(String::new(), main.clone())];
    let commands = main
        .split("\nCommands:\n")
        .nth(1)
        .expect("--help lists the commands")
        .split("\n\n")
        .next()
        .unwrap_or_default();
    for line in commands.lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        if !name.is_empty() && name != "help" {
            texts.push((name.to_string(), help(&[name, "--help"])));
        }
    }
    texts
}

/// docs/cli.md as the binary's help makes it.
fn cli_doc() -> String {
    let mut doc = String::from(
        "# mcp-budget: the command line\n\n\
         Every option of every command, as the binary's own `--help` prints it. Generated by\n\
         `tests/readme.rs`, which fails when this file and the binary differ; after a change to\n\
         the command line, `MCP_BUDGET_WRITE_DOCS=1 cargo test --test readme` writes it again.\n\n\
         Exit status: `0` the client closed its input or the proxy was signalled; `1` the server\n\
         exited while the client was connected; `2` a usage or configuration error (the message\n\
         names the fix). `wrap` and `unwrap`: `0` done (or nothing to do); `2` a file that does not\n\
         parse (`FILE:LINE:COLUMN`, the file untouched), cannot be read or written, or no file for\n\
         `--client`.\n\n",
    );
    let texts = help_texts();
    doc.push_str("Commands: ");
    let names: Vec<String> = texts
        .iter()
        .map(|(name, _)| {
            if name.is_empty() {
                "[the proxy](#mcp-budget)".to_string()
            } else {
                format!("[`{name}`](#mcp-budget-{name})")
            }
        })
        .collect();
    doc.push_str(&names.join(", "));
    doc.push_str(".\n");
    for (name, text) in &texts {
        let command = if name.is_empty() {
            "mcp-budget".to_string()
        } else {
            format!("mcp-budget {name}")
        };
        doc.push_str(&format!("\n## {command}\n\n```text\n$ {command} --help\n"));
        for line in text.lines() {
            doc.push_str(line.trim_end());
            doc.push('\n');
        }
        doc.push_str("```\n");
    }
    doc
}

#[test]
fn docs_cli_is_the_binarys_help() {
    let generated = cli_doc();
    let path = root().join("docs/cli.md");
    if std::env::var("MCP_BUDGET_WRITE_DOCS").as_deref() == Ok("1") {
        std::fs::write(&path, &generated).expect("writing docs/cli.md");
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == generated,
        "docs/cli.md is not the binary's --help output: after a change to the command line, \
         run `MCP_BUDGET_WRITE_DOCS=1 cargo test --test readme` to write it again"
    );
}

/// Options the README and docs/ name that belong to other programs (cargo, the demo and the
/// example servers, npm, curl, the test scripts and their peers).
const OTHER_PROGRAMS: &[&str] = &[
    "--access",
    "--all-targets",
    "--bench",
    "--call-graph",
    "--check",
    "--churn",
    "--count",
    "--example",
    "--examples",
    "--force",
    "--from",
    "--install",
    "--legacy-only",
    "--modern-only",
    "--no-default-features",
    "--offline",
    "--path",
    "--profile",
    "--proxy",
    "--release",
    "--requirements",
    "--sdk",
    "--seed",
    "--serde",
    "--spec",
    "--streams",
    "--test",
];

/// `--name` words of `text` (a letter after the dashes, then letters, digits and dashes).
fn options_in(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i + 2 < bytes.len() {
        let starts = bytes[i] == b'-'
            && bytes[i + 1] == b'-'
            && bytes[i + 2].is_ascii_lowercase()
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'-'));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i + 2;
        while j < bytes.len()
            && (bytes[j].is_ascii_lowercase() || bytes[j].is_ascii_digit() || bytes[j] == b'-')
        {
            j += 1;
        }
        found.push(text[i..j].trim_end_matches('-').to_string());
        i = j;
    }
    found
}

#[test]
fn every_option_the_docs_name_is_one_the_binary_knows() {
    let help: String = help_texts()
        .into_iter()
        .map(|(_, text)| text)
        .collect::<Vec<_>>()
        .join("\n");
    let known = options_in(&help);
    let mut files = vec![
        "README.md".to_string(),
        "npm/mcp-budget/README.md".to_string(),
    ];
    if let Ok(entries) = std::fs::read_dir(root().join("docs")) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".md") {
                files.push(format!("docs/{name}"));
            }
        }
    }
    let mut unknown = Vec::new();
    for file in &files {
        for option in options_in(&read(file)) {
            if !known.contains(&option) && !OTHER_PROGRAMS.contains(&option.as_str()) {
                unknown.push(format!("{file}: {option}"));
            }
        }
    }
    unknown.sort();
    unknown.dedup();
    assert!(
        unknown.is_empty(),
        "options no `mcp-budget … --help` lists (or add another program's option to OTHER_PROGRAMS):\n{}",
        unknown.join("\n")
    );
}
