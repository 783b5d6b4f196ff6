//! Every config a reader may copy loads: each ```` ```toml ```` block of
//! `README.md` and `docs/*.md`, and each `*.toml` under `examples/` but the Rust examples'
//! `Cargo.toml`, goes
//! through the loader that would read it (the gateway's, the consumer's, the
//! contract's, the simulator's), with every file it names made beside it, so
//! a doc config that no longer loads fails here, naming the doc and line.
//!
//! The rule: a ```` ```toml ```` block is a complete config and must load,
//! unless its fence says ```` ```toml snippet ```` (a part of a config, shown
//! for one setting). A block with `[operation]` is a contract, one with
//! `[[subscription]]` a consumer config, one with `[[route]]` or `upstream`
//! a gateway config; an unmarked block that is none of these fails, so a
//! snippet cannot pass by being left unmarked. Example files are loaded
//! where they are, next to the files they name.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

use std::path::{Path, PathBuf};

use idem_gateway::{GatewayConfig, Overrides};
use idem_testkit::tls::Pki;

/// What a config is, judged from its text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Gateway,
    Consumer,
    Contract,
}

/// A config found in the repository: where, what, and its text.
struct Found {
    /// `docs/http.md:550` or `examples/consume/payouts.toml`.
    place: String,
    /// The line of the doc the block's first line is on (0 for a file).
    first_line: usize,
    text: String,
    /// A fenced block in a doc, or a file loaded in place.
    file: Option<PathBuf>,
}

/// What a file named in a config must hold for the loader to accept it.
#[derive(Clone, Copy, Debug)]
enum Content {
    Ca,
    Cert,
    Key,
    Secret,
    Contract,
}

/// Config fields that name a file, and what the test writes there.
const FILE_FIELDS: &[(&str, Content)] = &[
    ("upstream_ca_file", Content::Ca),
    ("ca_file", Content::Ca),
    ("tls_cert_file", Content::Cert),
    ("admin_tls_cert_file", Content::Cert),
    ("cert_file", Content::Cert),
    ("tls_key_file", Content::Key),
    ("admin_tls_key_file", Content::Key),
    ("key_file", Content::Key),
    ("token_file", Content::Secret),
    ("password_file", Content::Secret),
    ("contract", Content::Contract),
];

#[test]
fn every_config_in_the_docs_and_examples_loads() {
    let root = repo_root();
    let found = configs(&root);
    assert!(
        found.iter().filter(|f| f.file.is_none()).count() >= 3,
        "too few configs in the docs: the walk is broken"
    );
    assert!(
        found.iter().filter(|f| f.file.is_some()).count() >= 10,
        "too few files under examples/: the walk is broken"
    );
    let failures: Vec<String> = found.iter().filter_map(|f| load(&root, f).err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} configs do not load:\n{}",
        failures.len(),
        found.len(),
        failures.join("\n")
    );
}

#[test]
fn a_broken_or_unmarked_block_fails_naming_its_doc_and_line() {
    let root = repo_root();
    let cases: &[(&str, &str)] = &[
        (
            "```toml\nupstream = \"http://127.0.0.1:9000\"\nregion = \"eu\"\nregion = \"us\"\n```\n",
            "x.md:1 (gateway config): doc line 4",
        ),
        (
            "intro\n```toml\n[[subscription]]\nname = \"p\"\nkey = \"k:{/id}\"\ndeliver = \"http://127.0.0.1:9/\"\n[subscription.nats]\nsubjects = [\"p\"]\n```\n",
            "x.md:2 (consumer config)",
        ),
        (
            "```toml\n[reconcile]\ninterval_s = 5\n```\n",
            "x.md:1: a toml block that is no complete config",
        ),
        ("```toml snippet\n[reconcile]\ninterval_s = 5\n```\n", ""),
        (
            "```toml\n[operation]\nname = \"\"\n```\n",
            "x.md:1 (contract)",
        ),
    ];
    for (doc, expect) in cases {
        let blocks = blocks_of("x.md", doc);
        let failures: Vec<String> = blocks.iter().filter_map(|f| load(&root, f).err()).collect();
        match *expect {
            "" => assert!(failures.is_empty(), "{doc}: {failures:?}"),
            expect => assert!(
                failures.len() == 1 && failures[0].starts_with(expect),
                "{doc}: expected a failure starting {expect:?}, got {failures:?}"
            ),
        }
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every TOML block of the docs and every TOML file of `examples/`.
fn configs(root: &Path) -> Vec<Found> {
    let mut docs = vec![root.join("README.md")];
    let mut examples = Vec::new();
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            docs.push(path);
        }
    }
    walk(&root.join("examples"), &mut examples);
    docs.sort();
    examples.sort();
    let mut found = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        found.extend(blocks_of(&relative(root, doc), &text));
    }
    for file in examples {
        found.push(Found {
            place: relative(root, &file),
            first_line: 0,
            text: std::fs::read_to_string(&file).unwrap(),
            file: Some(file),
        });
    }
    found
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "toml")
            && path.file_name().is_none_or(|n| n != "Cargo.toml")
        {
            // A Rust example's package manifest is cargo's, built and
            // tested as a workspace member; every other file is idem's.
            out.push(path);
        }
    }
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The ```` ```toml ```` blocks of one doc that are not marked `snippet`.
fn blocks_of(doc: &str, text: &str) -> Vec<Found> {
    let mut found = Vec::new();
    let mut open: Option<(usize, bool, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let Some(info) = line.trim_start().strip_prefix("```") else {
            if let Some((_, _, body)) = open.as_mut() {
                body.push_str(line);
                body.push('\n');
            }
            continue;
        };
        match open.take() {
            None => {
                let mut words = info.split_whitespace();
                let toml = words.next() == Some("toml");
                let snippet = words.any(|w| w == "snippet");
                open = Some((i + 1, toml && !snippet, String::new()));
            }
            Some((fence, true, body)) => found.push(Found {
                place: format!("{doc}:{fence}"),
                first_line: fence + 1,
                text: body,
                file: None,
            }),
            Some(_) => {}
        }
    }
    found
}

fn kind(text: &str) -> Option<Kind> {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let has = |head: &str| lines.iter().any(|l| l.starts_with(head));
    if has("[operation]") {
        Some(Kind::Contract)
    } else if has("[[subscription]]") {
        Some(Kind::Consumer)
    } else if has("[[route]]") || has("upstream =") || has("upstream=") {
        Some(Kind::Gateway)
    } else {
        None
    }
}

/// Loads one config through its loader; the error names the place.
fn load(root: &Path, found: &Found) -> Result<(), String> {
    let Some(kind) = kind(&found.text) else {
        return Err(format!(
            "{}: a toml block that is no complete config (no [operation], [[subscription]], \
             [[route]] or upstream): complete it, or mark its fence ```toml snippet",
            found.place
        ));
    };
    let what = match kind {
        Kind::Gateway => "gateway config",
        Kind::Consumer => "consumer config",
        Kind::Contract => "contract",
    };
    let dir = tempfile::tempdir().unwrap();
    let path = match &found.file {
        Some(file) => file.clone(),
        None => {
            let path = dir.path().join("config.toml");
            std::fs::write(&path, &found.text).unwrap();
            make_named_files(root, dir.path(), &found.text)
                .map_err(|e| format!("{} ({what}): {e}", found.place))?;
            path
        }
    };
    let result = match kind {
        Kind::Gateway => GatewayConfig::load(Some(&path), &Overrides::default())
            .map(drop)
            .map_err(|e| e.to_string()),
        Kind::Consumer => idem_consumer::config::ConsumeConfig::load(&path)
            .map(drop)
            .map_err(|e| e.to_string()),
        Kind::Contract if found.place.starts_with("examples/sim/") => idem_sim::Design::load(&path)
            .map(drop)
            .map_err(|e| e.to_string()),
        Kind::Contract => idem_contract::load(&path)
            .map(drop)
            .map_err(|e| e.to_string()),
    };
    result.map_err(|e| {
        let e = e
            .replace(&path.display().to_string(), "(block)")
            .replace(&format!("{}/", dir.path().display()), "");
        match doc_line(found, &e) {
            Some(line) => format!("{} ({what}): doc line {line}: {e}", found.place),
            None => format!("{} ({what}): {e}", found.place),
        }
    })
}

/// The doc's line for an error that names a line of the block.
fn doc_line(found: &Found, error: &str) -> Option<usize> {
    if found.file.is_some() {
        return None;
    }
    let line = error.split("line ").skip(1).find_map(|after| {
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<usize>().ok()
    })?;
    Some(found.first_line + line.max(1) - 1)
}

/// Writes every file `text` names (`field = "relative/path"`) under `dir`:
/// certificates and keys from a throwaway PKI, secrets, and a contract.
fn make_named_files(root: &Path, dir: &Path, text: &str) -> Result<(), String> {
    let pki_dir = dir.join(".pki");
    std::fs::create_dir_all(&pki_dir).unwrap();
    let pki = Pki::write(&pki_dir).unwrap();
    for line in text.lines() {
        let Some((field, value)) = line.split_once('=') else {
            continue;
        };
        let field = field.trim();
        let Some(name) = value
            .trim()
            .strip_prefix('"')
            .and_then(|v| v.split('"').next())
        else {
            continue;
        };
        let Some((_, content)) = FILE_FIELDS.iter().find(|(f, _)| *f == field) else {
            if field.ends_with("_file") {
                return Err(format!(
                    "{field} names a file this test cannot make: add it to FILE_FIELDS"
                ));
            }
            continue;
        };
        let target = dir.join(name);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        match content {
            Content::Ca => std::fs::copy(&pki.ca, &target).map(drop),
            Content::Cert => std::fs::copy(&pki.cert, &target).map(drop),
            Content::Key => std::fs::copy(&pki.key, &target).map(drop),
            Content::Secret => std::fs::write(&target, "a-secret-of-the-test\n"),
            Content::Contract => {
                std::fs::copy(root.join("examples/contracts/payouts.toml"), &target).map(drop)
            }
        }
        .unwrap();
    }
    Ok(())
}
