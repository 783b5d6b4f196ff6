//! Malformed contract files: every error names the file, line, column and field.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;

use idem_contract::{ErrorKind, load, parse};

const BASE: &str = "[operation]\nname = \"op\"\n";

/// (extra text after BASE, kind, line, field, a phrase of the reason)
const CASES: &[(&str, ErrorKind, usize, &str, &str)] = &[
    (
        "[retention\nretention_s = 1\n",
        ErrorKind::Syntax,
        3,
        "",
        "",
    ),
    (
        "[retention]\nretention_s = 10\ntombstone_s = 10\nretention_sx = 5\n",
        ErrorKind::Schema,
        6,
        "retention.retention_sx",
        "unknown field",
    ),
    (
        "[retention]\nretention_s = \"1h\"\ntombstone_s = 10\n",
        ErrorKind::Schema,
        4,
        "retention.retention_s",
        "invalid type",
    ),
    (
        "[replay.queue]\nvisibility_timeout_s = 30\nmax_receives = -1\n",
        ErrorKind::Schema,
        5,
        "replay.queue.max_receives",
        "invalid value",
    ),
    (
        "[replay.queue]\nvisibility_timeout_s = 30\nmax_receives = 0\n",
        ErrorKind::Invalid,
        5,
        "replay.queue.max_receives",
        "at least 1",
    ),
    (
        "[scope]\nlevel = \"planet\"\n",
        ErrorKind::Schema,
        4,
        "scope.level",
        "unknown variant",
    ),
    (
        "[replay.dlq]\nenabled = false\nretention_s = 60\n",
        ErrorKind::Invalid,
        5,
        "replay.dlq.retention_s",
        "enabled = false",
    ),
    (
        "[replay.client]\nattempts = 3\ntimeout_ms = 100\n",
        ErrorKind::Invalid,
        3,
        "replay.client.backoff_max_ms",
        "enabled = false",
    ),
    (
        "[key]\nsource = \"business\"\n",
        ErrorKind::Invalid,
        3,
        "key.template",
        "required",
    ),
    (
        "[retention]\nretention_s = 100\ntombstone_s = 10\n",
        ErrorKind::Invalid,
        5,
        "retention.tombstone_s",
        "shorter",
    ),
    (
        "[propagation]\n[[propagation.dependency]]\nname = \"bank\"\nperforms_effect = true\nreceives_key = true\ndedups = true\n",
        ErrorKind::Invalid,
        4,
        "propagation.dependency[0].dedup_window_s",
        "required",
    ),
    (
        "[regions]\nnames = [\"a\", \"b\"]\nreplication = \"async\"\n",
        ErrorKind::Invalid,
        3,
        "regions.claims",
        "required",
    ),
];

#[test]
fn each_error_names_file_line_and_field() {
    for (extra, kind, line, field, phrase) in CASES {
        let text = format!("{BASE}{extra}");
        let err = parse(&text, Path::new("c.toml")).unwrap_err();
        assert_eq!(err.kind, *kind, "{extra:?}: {err}");
        assert_eq!(err.line, *line, "{extra:?}: {err}");
        assert_eq!(err.field, *field, "{extra:?}: {err}");
        assert!(err.column >= 1, "{extra:?}: {err}");
        assert!(err.reason.contains(phrase), "{extra:?}: {err}");
        let shown = err.to_string();
        assert!(shown.starts_with(&format!("c.toml:{line}:")), "{shown}");
        if !field.is_empty() {
            assert!(shown.contains(&format!(": {field}: ")), "{shown}");
        }
    }
}

#[test]
fn missing_operation_is_a_schema_error() {
    let err = parse("[scope]\nlevel = \"tenant\"\n", Path::new("c.toml")).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Schema);
    assert!(err.reason.contains("operation"), "{err}");
}

#[test]
fn unreadable_file_names_the_file() {
    let err = load(Path::new("/nonexistent/contract.toml")).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Io);
    assert!(
        err.to_string()
            .starts_with("/nonexistent/contract.toml: cannot read"),
        "{err}"
    );
}

#[test]
fn a_bare_operation_parses_and_every_question_is_unanswered() {
    let report = idem_contract::check(&parse(BASE, Path::new("c.toml")).unwrap());
    assert!(!report.passed());
    assert!(
        report
            .findings
            .iter()
            .all(|f| f.verdict == idem_contract::Verdict::Unanswered)
    );
    assert!(report.horizon.is_none());
}
