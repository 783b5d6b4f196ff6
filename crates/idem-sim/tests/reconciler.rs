//! The simulated world runs the real reconciler: its lease sweep reaches
//! records no retry claims again, its failed lookups back off and end with
//! an operator after `max_tries`, and its settings are validated like the
//! gateway's.

use std::path::Path;

use idem_sim::{Design, SimError, Workload, run_seeds};

const SEEDS: u64 = 100;

fn design(file: &str, workload: Workload) -> Result<Design, SimError> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(file);
    let loaded = Design::load(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    Design::new(loaded.name, loaded.file, loaded.contract, workload)
}

#[test]
fn the_lease_sweep_settles_attempts_no_retry_claims_again() {
    // Every attempt sends a fresh key: a crashed attempt's record is never
    // claimed again, so only the reconciler's sweep can settle it.
    let d = design(
        "examples/contracts/incident-one-key-per-attempt.toml",
        Workload::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let s = run_seeds(&d, 0, SEEDS);
    assert_eq!(s.counts.stuck, 0, "{}", s.render_table());
    assert!(s.coverage.lease_swept > 0, "{}", s.render_table());
    assert!(s.counts.reconciliations > 0, "{}", s.render_table());
}

#[test]
fn failed_lookups_back_off_and_then_resolve() {
    let d = design("examples/contracts/payouts.toml", Workload::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let s = run_seeds(&d, 0, SEEDS);
    assert!(
        s.coverage.failed_lookup_then_resolved > 0,
        "{}",
        s.render_table()
    );
    assert_eq!(s.seeds_violating, 0, "{}", s.render_table());
}

#[test]
fn a_provider_that_never_answers_leaves_records_for_an_operator() {
    let mut workload = Workload {
        lookup_failure: 1.0,
        ..Workload::default()
    };
    workload.reconcile.max_tries = Some(2);
    let d = design("examples/contracts/payouts.toml", workload).unwrap_or_else(|e| panic!("{e}"));
    let s = run_seeds(&d, 0, SEEDS);
    // Nothing is resolved by a lookup, nothing is paid twice, and what
    // needs a person is reported as stuck (I2), not lost silently.
    assert_eq!(s.counts.reconciliations, 0, "{}", s.render_table());
    assert_eq!(s.counts.duplicates, 0, "{}", s.render_table());
    assert!(s.counts.stuck > 0, "{}", s.render_table());
    assert!(
        s.by_invariant.get("I2").is_some_and(|n| *n > 0),
        "{}",
        s.render_table()
    );
}

#[test]
fn reconciler_settings_out_of_range_are_refused_by_name() {
    let mut workload = Workload::default();
    workload.reconcile.interval_s = Some(0);
    let err = match design("examples/contracts/payouts.toml", workload) {
        Ok(_) => panic!("an interval of 0 s was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("interval_s"), "{err}");
    assert!(err.contains("payouts"), "{err}");
}
