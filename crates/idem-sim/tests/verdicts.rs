//! The built-in designs over 1,000 seeds: the incidents and both async
//! two-region designs show duplicates (the async ones for the writes a hard
//! failover loses), the corrected and synchronously replicated designs show
//! none, and the corrected design exercises every dangerous path.

use std::path::Path;

use idem_sim::{Design, Summary, run_seeds};

const SEEDS: u64 = 1_000;

fn summary(file: &str) -> Summary {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(file);
    let design = Design::load(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    run_seeds(&design, 0, SEEDS)
}

/// No duplicate, no lost intent, no violated invariant.
fn exactly_once(s: &Summary) {
    let got = (s.counts.duplicates, s.counts.lost, s.seeds_violating);
    assert_eq!(got, (0, 0, 0), "{}", s.render_table());
}

#[test]
fn key_per_attempt_pays_twice() {
    let s = summary("examples/contracts/incident-one-key-per-attempt.toml");
    assert!(s.counts.duplicates > 0, "{}", s.render_table());
    assert!(s.by_invariant.get("I1").is_some_and(|n| *n > 0));
    assert!(s.violations[0].replay.contains("--seed "));
}

#[test]
fn one_hour_retention_and_next_morning_redrive_pays_twice() {
    let s = summary("examples/contracts/incident-two-dlq-redrive.toml");
    assert!(s.counts.duplicates > 0, "{}", s.render_table());
    assert_eq!(s.counts.lost, 0, "{}", s.render_table());
}

#[test]
fn corrected_contract_is_exactly_once_and_not_vacuous() {
    let s = summary("examples/contracts/payouts.toml");
    exactly_once(&s);
    assert!(s.vacuous.is_empty(), "vacuous: {:?}", s.vacuous);
    assert!(s.counts.reconciliations > 0 && s.counts.intents == 30 * SEEDS);
}

#[test]
fn async_active_active_pays_twice_on_failover() {
    let s = summary("examples/contracts/active-active-async.toml");
    assert!(s.counts.tail_writes_lost > 0, "{}", s.render_table());
    assert!(s.counts.duplicates > 0, "{}", s.render_table());
    assert!(
        s.counts.cross_region_keys > 0,
        "the duplicates straddle regions"
    );
    assert_eq!(s.counts.lost, 0, "{}", s.render_table());
}

#[test]
fn home_region_routing_pays_twice_for_the_tail_a_failover_loses() {
    let s = summary("examples/sim/active-active-home-region.toml");
    assert!(s.counts.tail_writes_lost > 0, "{}", s.render_table());
    assert!(s.counts.duplicates > 0, "{}", s.render_table());
    // Home routing promised one region per key; the lost tail breaks it.
    assert!(s.by_invariant.get("I6").is_some_and(|n| *n > 0));
    assert_eq!(s.counts.lost, 0, "{}", s.render_table());
    assert!(
        s.coverage.replay_after_failover > 0,
        "failover not exercised"
    );
    assert!(s.vacuous.is_empty(), "vacuous: {:?}", s.vacuous);
}

#[test]
fn sync_replication_is_exactly_once_and_loses_no_tail() {
    let s = summary("examples/sim/active-active-sync.toml");
    exactly_once(&s);
    assert_eq!(s.counts.tail_writes_lost, 0, "{}", s.render_table());
    assert!(
        s.coverage.replay_after_failover > 0,
        "failover not exercised"
    );
    assert!(s.vacuous.is_empty(), "vacuous: {:?}", s.vacuous);
}
