//! The layers of `src/`: a module names (`crate::x`, `super::x`, `self::x`) only modules on
//! floors below its own, so no import circle can come back. A new module goes into the table,
//! on a floor above everything it names.

use std::path::{Path, PathBuf};

/// Module paths, from the top floor down (those on one line share a floor). Inside `budget/`
/// and `wrap/` each file has a floor of its own (`budget` and `wrap` are their `mod.rs`).
const FLOORS: &str = "cli
    commands::explain listen stdio
    commands::report session
    relay
    intercept era::subscriptions
    era::bridge reload remote search era::task_token
    budget
    budget::cache
    budget::chain
    budget::reduce
    budget::pipeline
    budget::args
    budget::auto
    budget::reference
    budget::at budget::continuation budget::cursor budget::escaped
    budget::cap budget::descriptor budget::exact budget::filter budget::horizon budget::notice \
        budget::page budget::render
    budget::field budget::place budget::project budget::raw budget::text
    tokens upstream
    client replay commands::suggest
    era policy recording wire::framing wire::jsonrpc
    builtin heavy keyfile metrics queue quiet regular traces wire::canonical wire::message
    commands protocol wire
    wrap::json wrap::toml
    wrap::twice wrap::remote
    wrap wrap::mask
    wrap::plan
    wrap::client wrap::line";

/// The floor (0: the ground) and room of `path`: the longest module of the table it starts with.
fn floor(path: &str) -> Option<(usize, &'static str)> {
    let rooms = FLOORS.lines().rev().enumerate();
    let rooms = rooms.flat_map(|(floor, line)| line.split_whitespace().map(move |r| (floor, r)));
    let within = |room: &str| path == room || path.starts_with(&format!("{room}::"));
    let rooms = rooms.filter(|(_, room)| within(room));
    rooms.max_by_key(|(_, room)| room.len())
}

/// Every file under `dir`, with its module path (`budget::args`; `""` for lib.rs and main.rs).
fn files(dir: &Path, module: &str, out: &mut Vec<(String, PathBuf)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let child = format!("{module}::{stem}");
        let child = child.trim_start_matches(':');
        if path.is_dir() {
            files(&path, child, out);
        } else {
            let face = ["mod", "lib", "main"].contains(&stem.as_str());
            out.push((if face { module } else { child }.to_string(), path));
        }
    }
}

/// The paths named at the start of `text` (`super::a::b`, `crate::{c, d::e}`), from the crate.
fn named(mut text: &str, module: &str) -> Vec<String> {
    let mut base: Vec<&str> = module.split("::").collect();
    while let Some((word @ ("crate" | "super" | "self"), rest)) = text.split_once("::") {
        match word {
            "crate" => base.clear(),
            "super" => base.truncate(base.len().saturating_sub(1)),
            _ => {}
        }
        text = rest;
    }
    let end = text.find(|c: char| !c.is_alphanumeric() && !"_:".contains(c));
    let items: Vec<&str> = match text.strip_prefix('{') {
        Some(group) => group[..group.find('}').unwrap()].split(',').collect(),
        None => vec![&text[..end.unwrap_or(text.len())]],
    };
    let base: String = base.iter().map(|word| format!("{word}::")).collect();
    let path = |item: &&str| format!("{base}{}", item.trim());
    items.iter().map(path).collect()
}

#[test]
fn no_module_names_one_on_its_floor_or_above() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, "", &mut all);
    let mut wrong = Vec::new();
    for (module, file) in all.iter().filter(|(module, _)| !module.is_empty()) {
        let Some((here, room)) = floor(module) else {
            wrong.push(format!("{}: {module} is on no floor", file.display()));
            continue;
        };
        // In-file tests (each file ends with them) are not read, nor comments.
        let code = std::fs::read_to_string(file).unwrap();
        let tests = ["\n#[cfg(test)]\nmod ", "\n#[cfg(all(test"].map(|t| code.find(t));
        let code = &code[..tests.into_iter().flatten().min().unwrap_or(code.len())];
        let starts = ["crate::", "super::", "self::"].map(|start| code.match_indices(start));
        for (at, _) in starts.into_iter().flatten() {
            let before = &code[code[..at].rfind('\n').map_or(0, |i| i + 1)..at];
            let path_goes_on = before.ends_with(|c: char| c.is_alphanumeric() || "_:".contains(c));
            if before.trim_start().starts_with("//") || path_goes_on {
                continue;
            }
            let line = code[..at].matches('\n').count() + 1;
            let placed = named(&code[at..], module).into_iter();
            for (path, (there, to)) in placed.filter_map(|p| floor(&p).map(|f| (p, f))) {
                if to != room && there >= here {
                    let file = file.display();
                    wrong.push(format!(
                        "{file}:{line}: {path} (floor {there}) from floor {here}"
                    ));
                }
            }
        }
    }
    let wrong = wrong.join("\n");
    assert!(
        wrong.is_empty(),
        "a module names one on its floor or above:\n{wrong}"
    );
}
