//! `idem demo` through the real binary: it exits 0, prints every step with
//! the statuses, headers and problem types the contract promises and the
//! payouts really executed, leaves no temporary directory behind, and, on
//! a store named with `--store`, leaves the records the walk made.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The lines the walk prints, in order: each entry is the parts one line
/// must contain, found after the line of the entry before.
const STEPS: &[&[&str]] = &[
    &["1. A payout with an Idempotency-Key"],
    &["← 201 Created", r#"{"payout":1}"#],
    &["payouts the API executed so far: 1"],
    &["2. The same request again"],
    &[
        "← 201 Created",
        "Idempotent-Replayed: true",
        r#"{"payout":1}"#,
    ],
    &["payouts the API executed so far: 1"],
    &["3. A retry while the first attempt is still in flight"],
    &[
        "← 409 Conflict",
        "Retry-After: ",
        "type urn:idem:problem:request-in-progress",
    ],
    &["← 201 Created", r#"{"payout":2}"#],
    &["payouts the API executed so far: 2"],
    &["4. The same key with a different body"],
    &[
        "← 422 Unprocessable Entity",
        "type urn:idem:problem:key-reused",
    ],
    &["payouts the API executed so far: 2"],
    &["5. The API answers 503 after paying"],
    &["← 503 Service Unavailable"],
    &["payouts the API executed so far: 3"],
    &[
        "← 409 Conflict",
        "Retry-After: ",
        "type urn:idem:problem:outcome-unknown",
    ],
    &["payouts the API executed so far: 3"],
    &["operator: GET /records?state=ambiguous", "token "],
    &[
        "operator: POST /records/…/resolve → 200 OK",
        "\"completed\"",
        "by \"operator:admin\"",
    ],
    &[
        "← 201 Created",
        "Idempotent-Replayed: true",
        r#"{"payout":3}"#,
    ],
    &["payouts the API executed so far: 3"],
    &[
        "Done: 8 requests sent through the gateway, 3 payouts executed by the API, each effect once.",
    ],
    &["idem serve"],
    &["docs/operations.md"],
];

/// The most a demo may take, even in a debug build on a busy machine.
const DEMO_TIME_MAX: Duration = Duration::from_secs(30);

fn demo(tmp: &Path, args: &[&str]) -> (Output, String) {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("demo")
        .args(args)
        .env("TMPDIR", tmp)
        .env_remove("IDEM_LOG")
        .output()
        .unwrap();
    assert!(
        started.elapsed() < DEMO_TIME_MAX,
        "idem demo took {:?}",
        started.elapsed()
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "idem demo failed ({:?}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    (out, stdout)
}

/// Every entry of [`STEPS`], in order.
fn check_steps(stdout: &str) {
    let mut lines = stdout.lines();
    for parts in STEPS {
        let found = lines
            .by_ref()
            .any(|line| parts.iter().all(|part| line.contains(part)));
        assert!(found, "no line with {parts:?} where expected in:\n{stdout}");
    }
}

#[test]
fn the_demo_walks_through_every_step_and_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, stdout) = demo(tmp.path(), &[]);
    check_steps(&stdout);
    assert!(
        !stdout.contains('\x1b'),
        "no colour when stdout is not a terminal:\n{stdout}"
    );
    assert!(
        out.stderr.is_empty(),
        "no log unless IDEM_LOG is set: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "the demo left {left:?} behind");
}

#[test]
fn a_store_named_with_store_keeps_the_records_of_the_walk() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("kept.db");
    let url = format!("sqlite://{}", db.display());
    let (_, stdout) = demo(tmp.path(), &["--store", &url]);
    check_steps(&stdout);
    let listed = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["records", "list", "--format", "json", "--store", &url])
        .output()
        .unwrap();
    assert!(listed.status.success(), "{listed:?}");
    let records: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let records = records.as_array().unwrap();
    let states: Vec<_> = records.iter().map(|r| r["state"].as_str()).collect();
    assert_eq!(states, [Some("completed"); 3], "{records:#?}");
    let resolved: Vec<_> = records
        .iter()
        .filter(|r| !r["resolution"].is_null())
        .map(|r| r["resolution"]["by"].as_str())
        .collect();
    assert_eq!(resolved, [Some("operator:admin")], "{records:#?}");
}
