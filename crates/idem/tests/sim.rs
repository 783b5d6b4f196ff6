//! `idem sim` as a designer runs it: verdicts by exit code, the same bytes
//! for the same seed across processes, and a printed replay command that
//! reproduces the violation it reports.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

use std::path::PathBuf;
use std::process::{Command, Output};

fn file(dir: &str, name: &str) -> String {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "..",
        "..",
        "examples",
        dir,
        name,
    ]
    .iter()
    .collect();
    path.to_str().unwrap().to_owned()
}

fn idem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn verdicts_determinism_and_replay() {
    let corrected = idem(&[
        "sim",
        &file("contracts", "payouts.toml"),
        &file("sim", "active-active-sync.toml"),
        "--seeds",
        "50",
    ]);
    assert_eq!(
        corrected.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&corrected.stdout)
    );

    let incident = file("contracts", "incident-one-key-per-attempt.toml");
    let first = idem(&["sim", &incident, "--seeds", "20", "--format", "json"]);
    let again = idem(&["sim", &incident, "--seeds", "20", "--format", "json"]);
    assert_eq!(first.status.code(), Some(1), "duplicates are a failure");
    assert_eq!(first.stdout, again.stdout, "same seeds, same bytes");
    let doc: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    assert!(
        doc[0]["counts"]["duplicates"].as_u64().unwrap() > 0,
        "{doc}"
    );

    // The printed replay command reproduces exactly one violating seed.
    let table = String::from_utf8(idem(&["sim", &incident, "--seeds", "20"]).stdout).unwrap();
    let replay = table
        .lines()
        .find_map(|l| l.trim().strip_prefix("replay: idem "))
        .unwrap()
        .to_owned();
    let args: Vec<&str> = replay.split_whitespace().collect();
    let out = idem(&args);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("1 of 1 seeds violate"), "{text}");

    let missing = idem(&["sim", "no-such-design.toml"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no-such-design.toml"));
}

/// `--consumer` simulates what a consumer config enforces: the example
/// consumer is exactly once; the same consumer with a one-hour retention
/// and tombstone pays twice when the DLQ is redriven the next morning, and
/// its replay command names the config.
#[test]
fn a_consumer_config_is_simulated_with_its_own_retention() {
    let example = file("consume", "payouts.toml");
    let out = idem(&["sim", "--consumer", &example, "--seeds", "20"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("consume.toml");
    let text = std::fs::read_to_string(&example)
        .unwrap()
        .replace("retention_s = 604800", "retention_s = 3600")
        .replace("tombstone_s = 7776000", "tombstone_s = 3600")
        .replace(
            "../contracts/payouts.toml",
            &file("contracts", "payouts.toml"),
        );
    std::fs::write(&short, text).unwrap();
    let out = idem(&[
        "sim",
        "--consumer",
        short.to_str().unwrap(),
        "--seeds",
        "20",
    ]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{shown}");
    assert!(shown.contains("I1"), "{shown}");
    assert!(
        shown.contains(&format!("idem sim --consumer {} --seed", short.display())),
        "{shown}"
    );
}

/// Under asynchronous replication a hard failover loses the writes region
/// 0 had not shipped, and the report says how many; synchronous
/// replication loses none and pays nothing twice.
#[test]
fn a_hard_failover_reports_its_lost_tail() {
    let out = idem(&[
        "sim",
        &file("sim", "active-active-home-region.toml"),
        &file("sim", "active-active-sync.toml"),
        "--seeds",
        "100",
        "--format",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(1), "the tail pays twice");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (home, sync) = (&doc[0]["counts"], &doc[1]["counts"]);
    assert!(home["tail_writes_lost"].as_u64().unwrap() > 0, "{doc}");
    assert!(home["tail_keys_lost"].as_u64().unwrap() > 0, "{doc}");
    assert!(home["duplicates"].as_u64().unwrap() > 0, "{doc}");
    assert_eq!(sync["tail_writes_lost"].as_u64(), Some(0), "{doc}");
    assert_eq!(sync["duplicates"].as_u64(), Some(0), "{doc}");
}
