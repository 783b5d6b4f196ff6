//! Inside every crate of the workspace, the modules import one another one
//! way: no module reaches, through `crate::` paths in its non-test code,
//! a module that reaches back to it. A circle makes each of its modules
//! impossible to read or change without the others; this finds one as
//! soon as it is written, in any crate.
//!
//! A module is a top-level `mod` of the crate's `lib.rs` or `main.rs` (its
//! submodules count as part of it). A name the crate root re-exports
//! (`pub use module::{Name, ...}`) counts as its module. Comments and
//! `#[cfg(test)]` items are left out: tests may import what they test.
//!
//! The same reading also holds the adapters to the one attempt lifecycle:
//! a store step of an attempt (`claim`, `complete`, `release`,
//! `mark_ambiguous`, `resolve`) called from `idem-http`'s,
//! `idem-message`'s or `idem-lambda`'s non-test code is a second copy of
//! `idem_attempt::Driver` in the making. The layer and the consumer once
//! each had their own, and they drifted (a retry delay in seconds against
//! milliseconds, a bare release against a settle step, a settle on retry
//! on one side only).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of `text` without comments and without the items marked
/// `#[cfg(test)]`: the attribute's item runs to its `;` or to the brace
/// that closes the first one it opens.
fn non_test_code(text: &str) -> String {
    let mut kept = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("//") {
            continue;
        }
        if trimmed.starts_with("#[cfg(test)]") {
            let mut depth = 0usize;
            let mut opened = false;
            for item in lines.by_ref() {
                let code = item.split("//").next().unwrap_or(item);
                if !opened && code.trim_start().starts_with("#[") {
                    continue;
                }
                for c in code.chars() {
                    match c {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth = depth.saturating_sub(1),
                        _ => {}
                    }
                }
                if (opened && depth == 0) || (!opened && code.trim_end().ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        let code = line.split(" //").next().unwrap_or(line);
        kept.push_str(code);
        kept.push('\n');
    }
    kept
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The first path segment of every `crate::` path in `code`, braces
/// opened: `crate::a::B`, `crate::{a::B, C}` give `a`, `a` and `C`.
fn crate_paths(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(is_ident) {
            continue;
        }
        if let Some(list) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item_start = true;
            let mut name = String::new();
            for c in list.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => item_start = true,
                    _ => {}
                }
                if depth == 0 {
                    if !name.is_empty() {
                        found.push(std::mem::take(&mut name));
                    }
                    break;
                }
                if item_start && is_ident(c) {
                    name.push(c);
                } else if !name.is_empty() {
                    found.push(std::mem::take(&mut name));
                    item_start = false;
                }
            }
        } else {
            let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
            if !name.is_empty() {
                found.push(name);
            }
        }
    }
    found
}

/// The crate root's modules not marked `#[cfg(test)]`, and the names it
/// re-exports from each.
fn root(root_code: &str) -> (BTreeSet<String>, BTreeMap<String, String>) {
    let mut modules = BTreeSet::new();
    let mut reexports = BTreeMap::new();
    let code = non_test_code(root_code);
    for statement in code.split(';') {
        let statement = statement.trim();
        let words: Vec<&str> = statement.split_whitespace().collect();
        let after_pub = match words.first() {
            Some(w) if w.starts_with("pub") => &words[1..],
            _ => &words[..],
        };
        if after_pub.first() == Some(&"mod") && after_pub.len() == 2 {
            modules.insert(after_pub[1].to_owned());
        }
        if let Some(path) = statement
            .strip_prefix("pub use ")
            .or_else(|| statement.strip_prefix("pub(crate) use "))
        {
            let (module, names) = path.split_once("::").unwrap_or((path, ""));
            let names = names.trim_start_matches('{').trim_end_matches('}');
            for name in names.split(',') {
                let name = name.trim().rsplit(" as ").next().unwrap_or("").trim();
                if !name.is_empty() && name.chars().all(is_ident) {
                    reexports.insert(name.to_owned(), module.trim().to_owned());
                }
            }
        }
    }
    (modules, reexports)
}

/// The files and folders of the submodules declared `#[cfg(test)] mod
/// name;` in `files`: `name.rs` and `name/` beside a `mod.rs`, `lib.rs` or
/// `main.rs`, under the declaring file's own folder otherwise.
fn test_module_files(files: &[PathBuf]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for file in files {
        let text = fs::read_to_string(file).unwrap_or_default();
        let mut lines = text.lines().map(str::trim);
        while let Some(line) = lines.next() {
            if line != "#[cfg(test)]" {
                continue;
            }
            let Some(name) = lines
                .next()
                .and_then(|l| l.strip_prefix("mod "))
                .and_then(|l| l.strip_suffix(';'))
            else {
                continue;
            };
            let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned());
            let dir = match (file.parent(), stem.as_deref()) {
                (Some(parent), Some("mod" | "lib" | "main")) => parent.to_path_buf(),
                (Some(parent), Some(stem)) => parent.join(stem),
                _ => continue,
            };
            found.push(dir.join(format!("{name}.rs")));
            found.push(dir.join(name));
        }
    }
    found
}

/// The module circles of the crate whose `src` is `src`, each as the list
/// of its modules.
fn circles(src: &Path) -> Vec<Vec<String>> {
    let root_file = [src.join("lib.rs"), src.join("main.rs")]
        .into_iter()
        .find(|p| p.exists());
    let Some(root_file) = root_file else {
        return Vec::new();
    };
    let root_code = fs::read_to_string(&root_file).unwrap_or_default();
    let (modules, reexports) = root(&root_code);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let test_files = test_module_files(&files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        if test_files.iter().any(|t| file.starts_with(t)) {
            continue;
        }
        let relative = file.strip_prefix(src).unwrap_or(&file);
        let first = relative
            .components()
            .next()
            .map(|c| {
                c.as_os_str()
                    .to_string_lossy()
                    .trim_end_matches(".rs")
                    .to_owned()
            })
            .unwrap_or_default();
        if !modules.contains(&first) {
            continue;
        }
        let code = non_test_code(&fs::read_to_string(&file).unwrap_or_default());
        for name in crate_paths(&code) {
            let target = reexports.get(&name).cloned().unwrap_or(name);
            if target != first && modules.contains(&target) {
                edges.entry(first.clone()).or_default().insert(target);
            }
        }
    }
    // A circle: modules that reach one another. Small graphs: for each pair
    // of modules, whether each reaches the other.
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_owned()];
        while let Some(m) = stack.pop() {
            for next in edges.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let mut found: Vec<Vec<String>> = Vec::new();
    for module in &modules {
        let reached = reach(module);
        if !reached.contains(module) {
            continue;
        }
        let circle: Vec<String> = reached
            .iter()
            .filter(|other| reach(other).contains(module))
            .cloned()
            .collect();
        if !found.contains(&circle) {
            found.push(circle);
        }
    }
    found
}

/// Circles found when this check was written and not broken yet: the
/// check fails on any other, and on one of these once it is gone, so that
/// the list only shrinks.
const OPEN_CIRCLES: [&str; 0] = [];
#[test]
fn every_crates_modules_import_one_another_one_way() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut report = Vec::new();
    let mut checked = 0;
    for entry in fs::read_dir(&crates)
        .expect("the workspace's crates folder")
        .flatten()
    {
        let src = entry.path().join("src");
        if !src.is_dir() {
            continue;
        }
        checked += 1;
        for circle in circles(&src) {
            report.push(format!(
                "{}: {}",
                entry.file_name().to_string_lossy(),
                circle.join(" <-> ")
            ));
        }
    }
    assert!(
        checked >= 10,
        "only {checked} crates found under {}",
        crates.display()
    );
    let new: Vec<&String> = report
        .iter()
        .filter(|c| !OPEN_CIRCLES.contains(&c.as_str()))
        .collect();
    assert!(
        new.is_empty(),
        "modules that import one another in a circle:\n{}",
        new.iter()
            .map(|c| c.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let broken: Vec<&str> = OPEN_CIRCLES
        .into_iter()
        .filter(|c| !report.iter().any(|r| r == c))
        .collect();
    assert!(
        broken.is_empty(),
        "circles no longer found; take them off OPEN_CIRCLES:\n{}",
        broken.join("\n")
    );
}

#[test]
fn a_circle_is_found_through_paths_lists_and_reexports() {
    let dir = std::env::temp_dir().join(format!("idem-module-graph-{}", std::process::id()));
    let src = dir.join("src");
    fs::create_dir_all(src.join("c")).expect("a temporary folder");
    fs::create_dir_all(src.join("b")).expect("a temporary folder");
    let write = |name: &str, text: &str| fs::write(src.join(name), text).expect("a test file");
    write(
        "lib.rs",
        "mod a;\nmod b;\nmod c;\n#[cfg(test)]\nmod helpers;\npub use b::{Bee, Other as Renamed};\n",
    );
    // a -> b by a re-exported name in a list; b -> c by a path; c's
    // submodule -> a; a comment, a test item and a test-only submodule
    // file name a module too.
    write("a.rs", "use crate::{Bee};\n// crate::c::x\n");
    write(
        "b.rs",
        "pub struct Bee;\npub struct Other;\nfn f() { crate::c::g(); }\n",
    );
    write(
        "c.rs",
        "#[cfg(test)]\nfn t() { crate::b::f(); }\nmod inner;\npub fn g() {}\n#[cfg(test)]\nmod tests {\n    use crate::b;\n}\n",
    );
    write("c/inner.rs", "use crate::a as _;\n");
    write("helpers.rs", "use crate::a;\n");
    write("b/checks.rs", "use crate::a;\n");
    write(
        "b.rs",
        "pub struct Bee;\npub struct Other;\nfn f() { crate::c::g(); }\n#[cfg(test)]\nmod checks;\n",
    );
    let found = circles(&src);
    assert_eq!(
        found,
        vec![vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]]
    );
    // Without the submodule's import there is no circle.
    write("c/inner.rs", "// use crate::a;\n");
    assert!(circles(&src).is_empty(), "{:?}", circles(&src));
    let _ = fs::remove_dir_all(&dir);
}

/// The adapters that must run an attempt through `idem_attempt::Driver`.
const ADAPTERS: [&str; 3] = ["idem-http", "idem-message", "idem-lambda"];

/// The store calls that are steps of an attempt.
const STEPS: [&str; 5] = ["claim", "complete", "release", "mark_ambiguous", "resolve"];

/// The `(line of the non-test code, text)` of each store step called in
/// `code`: `store.claim(`, `self.store.complete(`, `shared.store().release(`.
fn store_steps(code: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let compact: String = line.chars().filter(|c| !c.is_whitespace()).collect();
        let called = STEPS.iter().any(|step| {
            [".", "()."]
                .iter()
                .any(|between| compact.contains(&format!("store{between}{step}(")))
        });
        if called {
            found.push((n + 1, line.trim().to_owned()));
        }
    }
    found
}

#[test]
fn the_adapters_call_no_store_step_of_an_attempt() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut offences = Vec::new();
    let mut read = 0;
    for adapter in ADAPTERS {
        let mut files = Vec::new();
        rust_files(&crates.join(adapter).join("src"), &mut files);
        // A renamed or moved adapter must not drop out of the check unseen.
        assert!(!files.is_empty(), "no source of {adapter} was read");
        let tests = test_module_files(&files);
        for file in files
            .iter()
            .filter(|f| !tests.iter().any(|t| f.starts_with(t)))
        {
            read += 1;
            let code = non_test_code(&fs::read_to_string(file).unwrap());
            for (line, text) in store_steps(&code) {
                offences.push(format!("{} (code line {line}): {text}", file.display()));
            }
        }
    }
    assert!(
        read >= 10,
        "read only {read} adapter files: the walk is broken"
    );
    assert!(
        offences.is_empty(),
        "an adapter runs a step of the attempt itself instead of through \
         idem_attempt::Driver:\n{}",
        offences.join("\n")
    );
}

#[test]
fn the_step_reader_finds_what_the_old_copies_did() {
    // Lines the layer and the consumer had before they shared the driver;
    // what is not a store step; and one after a test item, which the
    // reader must still see.
    let cases = [
        ("        shared.store.claim(req),", 1),
        ("let released = shared.store.release(id, token);", 1),
        (
            "match self.store.complete(id, token, result.clone()).await {",
            1,
        ),
        ("self.store().mark_ambiguous(id, token)", 1),
        ("self.shared.metrics.claim(claim);", 0),
        ("// store.claim(request) is the driver's", 0),
        (
            "#[cfg(test)]\nmod tests {\n    fn t() { store.claim(req); }\n}",
            0,
        ),
        (
            "#[cfg(test)]\nfn t() {}\nfn f() { store.release(id, token); }",
            1,
        ),
    ];
    for (source, expected) in cases {
        assert_eq!(
            store_steps(&non_test_code(source)).len(),
            expected,
            "{source}"
        );
    }
}
