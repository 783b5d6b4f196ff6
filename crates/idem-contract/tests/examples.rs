//! The example contracts: golden text output and per-question verdicts.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};

use idem_contract::{Question, Verdict, check, load};

const P: Verdict = Verdict::Pass;
const F: Verdict = Verdict::Fail;

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/contracts")
        .join(name)
}

/// Verdicts in `Question::ALL` order: intent, generation, propagation,
/// fingerprint, concurrency, completion, ambiguity, retention, scope,
/// failover, recovery, testing.
const CASES: [(&str, [Verdict; 12]); 7] = [
    (
        "incident-one-key-per-attempt.toml",
        [P, F, P, P, P, P, P, P, P, P, P, P],
    ),
    (
        "incident-two-dlq-redrive.toml",
        [P, P, P, P, P, P, P, F, P, P, P, P],
    ),
    (
        "content-dedup-attributes.toml",
        [P, P, P, F, P, P, P, F, F, P, P, P],
    ),
    (
        "active-active-async.toml",
        [P, P, P, P, P, P, P, P, P, F, P, P],
    ),
    ("payouts.toml", [P, P, P, P, P, P, P, P, P, P, P, P]),
    (
        "dynamodb-global-mrec.toml",
        [P, P, P, P, P, P, P, P, P, F, P, P],
    ),
    (
        "dynamodb-global-mrsc.toml",
        [P, P, P, P, P, P, P, P, P, P, P, P],
    ),
];

#[test]
fn verdicts_per_question() {
    for (file, expected) in CASES {
        let report = check(&load(&example(file)).unwrap());
        for (q, want) in Question::ALL.iter().zip(expected) {
            let got = report.finding(*q).unwrap();
            assert_eq!(got.verdict, want, "{file}: {}: {}", q.as_str(), got.why);
            assert_eq!(
                got.change.is_some(),
                want != P,
                "{file}: {}: change line",
                q.as_str()
            );
        }
        assert_eq!(report.passed(), expected.iter().all(|v| *v == P), "{file}");
    }
}

#[test]
fn golden_text() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");
    for (file, _) in CASES {
        let text = check(&load(&example(file)).unwrap()).render_text(false);
        let golden = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(file.replace(".toml", ".txt"));
        if update {
            std::fs::write(&golden, &text).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&golden)
            .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", golden.display()));
        assert_eq!(text, want, "{file} differs from {}", golden.display());
    }
}

#[test]
fn incidents_are_named_in_their_why_lines() {
    let cases = [
        (
            "incident-one-key-per-attempt.toml",
            Question::Generation,
            "incident one",
        ),
        (
            "incident-two-dlq-redrive.toml",
            Question::Retention,
            "incident two",
        ),
        (
            "incident-two-dlq-redrive.toml",
            Question::Retention,
            "4 d 6 h 44 min 10 s",
        ),
        (
            "active-active-async.toml",
            Question::Failover,
            "two regions can both accept the first claim",
        ),
        (
            "content-dedup-attributes.toml",
            Question::Fingerprint,
            "attributes.tenant_id, attributes.currency",
        ),
    ];
    for (file, q, needle) in cases {
        let report = check(&load(&example(file)).unwrap());
        let why = &report.finding(q).unwrap().why;
        assert!(
            why.contains(needle),
            "{file}: {}: {why:?} lacks {needle:?}",
            q.as_str()
        );
    }
}

#[test]
fn colour_only_when_asked() {
    let report = check(&load(&example("payouts.toml")).unwrap());
    assert!(!report.render_text(false).contains('\x1b'));
    assert!(report.render_text(true).contains("\x1b[32mPASS"));
}

#[test]
fn json_carries_verdicts_and_horizon() {
    let report = check(&load(&example("incident-two-dlq-redrive.toml")).unwrap());
    let json = report.to_json();
    assert_eq!(json["passed"], false);
    assert_eq!(json["findings"][7]["topic"], "retention");
    assert_eq!(json["findings"][7]["verdict"], "FAIL");
    assert_eq!(
        json["horizon"]["total_s"],
        report.horizon.as_ref().unwrap().total_s
    );
    assert!(json["findings"][0]["change"].is_null());
}

/// Asynchronous home-region routing passes only while every provider that
/// performs the effect dedups by the forwarded key: a hard failover loses
/// the replication lag's records, and the provider is the last line.
#[test]
fn home_region_over_async_replication_leans_on_the_providers_dedup() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/sim/active-active-home-region.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("dedups = true"),
        "the example declares the dedup"
    );
    let cases = [
        (
            text.clone(),
            P,
            "the provider's dedup by the forwarded key is the last line",
        ),
        (
            text.replace("dedups = true", "dedups = false")
                .lines()
                .filter(|l| !l.starts_with("dedup_window_s"))
                .collect::<Vec<_>>()
                .join("\n"),
            F,
            "no provider is declared to dedup by the forwarded key",
        ),
    ];
    for (contract, verdict, needle) in cases {
        let report = check(&idem_contract::parse(&contract, &path).unwrap());
        let finding = report.finding(Question::Failover).unwrap();
        assert_eq!(finding.verdict, verdict, "{finding:?}");
        assert!(
            finding.why.contains(needle),
            "{:?} lacks {needle:?}",
            finding.why
        );
    }
}

/// Question 11 from `[recovery]`: records rolled back without the data
/// fail unless a restore opens the suspect window, and every finding that
/// loses something names the gap in hours.
#[test]
fn recovery_names_the_gap_and_credits_the_suspect_window() {
    let text = std::fs::read_to_string(example("payouts.toml")).unwrap();
    let (head, _) = text.split_once("[recovery]").unwrap();
    let rest = text.split_once("[recovery]").unwrap().1;
    let tail = rest.split_once("\n[").map_or("", |(_, t)| t);
    let cases = [
        (
            "restore = \"together\"\nbackup_interval_h = 24",
            P,
            "loses up to 24 h of both",
        ),
        (
            "restore = \"records_without_data\"\nbackup_interval_h = 6",
            F,
            "rolls records back by up to 6 h",
        ),
        (
            "restore = \"records_without_data\"\nbackup_interval_h = 6\nsuspect_window = true",
            P,
            "routes without a lookup stay exposed",
        ),
        (
            "restore = \"records_without_data\"",
            F,
            "an unknown span (declare backup_interval_h)",
        ),
        (
            "restore = \"data_without_records\"\nbackup_interval_h = 1\nsuspect_window = true",
            F,
            "by up to 1 h",
        ),
    ];
    for (recovery, verdict, says) in cases {
        let contract = format!("{head}[recovery]\n{recovery}\n\n[{tail}");
        let file = std::env::temp_dir().join(format!("idem-recovery-{}.toml", std::process::id()));
        std::fs::write(&file, &contract).unwrap();
        let report = check(&load(&file).unwrap());
        let finding = report.finding(Question::Recovery).unwrap();
        assert_eq!(finding.verdict, verdict, "{recovery}: {}", finding.why);
        assert!(finding.why.contains(says), "{recovery}: {}", finding.why);
    }
}
