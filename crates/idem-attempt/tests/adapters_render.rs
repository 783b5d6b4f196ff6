//! The adapters render the one attempt; they never run a step of it
//! themselves. A store transition of an attempt (`claim`, `complete`,
//! `release`, `mark_ambiguous`, `resolve`) called from an adapter's code
//! is a second copy of the lifecycle in the making: the HTTP layer and the
//! consumer once each had their own, and they drifted (a retry delay in
//! seconds against milliseconds, a bare release against a settle step, a
//! settle on retry on one side only). This reads the adapters' sources and
//! fails on such a call, naming the file and line.
//!
//! Only code before a file's first `#[cfg(test)]` is read (tests sit last,
//! and may drive a store directly); comment lines are skipped.

use std::fs;
use std::path::{Path, PathBuf};

/// The adapters that must go through `idem_attempt::Driver`.
const ADAPTERS: [&str; 2] = ["idem-http", "idem-message"];

/// The store calls that are steps of an attempt.
const STEPS: [&str; 5] = ["claim", "complete", "release", "mark_ambiguous", "resolve"];

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

/// The `(line, text)` of each store step called in `source`'s non-test code:
/// `store.claim(`, `self.store.complete(`, `shared.store().release(` …
fn store_steps(source: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in source.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("#[cfg(test)]") {
            break;
        }
        if code.starts_with("//") {
            continue;
        }
        let compact: String = code.chars().filter(|c| !c.is_whitespace()).collect();
        let called = STEPS.iter().any(|step| {
            [".", "()."]
                .iter()
                .any(|between| compact.contains(&format!("store{between}{step}(")))
        });
        if called {
            found.push((n + 1, code.to_owned()));
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
        assert!(!files.is_empty(), "no sources found for {adapter}");
        for file in files {
            let source = fs::read_to_string(&file).unwrap();
            read += 1;
            for (line, code) in store_steps(&source) {
                offences.push(format!("{}:{line}: {code}", file.display()));
            }
        }
    }
    assert!(read >= 10, "read only {read} files");
    assert!(
        offences.is_empty(),
        "an adapter runs a step of the attempt itself instead of through \
         idem_attempt::Driver:\n{}",
        offences.join("\n")
    );
}

#[test]
fn the_reader_finds_what_the_old_copies_did() {
    // The calls the layer and the consumer made before they shared the
    // driver, and what is not a store step.
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
        ("#[cfg(test)]\nstore.claim(req)", 0),
    ];
    for (source, expected) in cases {
        assert_eq!(store_steps(source).len(), expected, "{source}");
    }
}
