//! The run-once scenarios, the contract's model and concurrent deliveries,
//! through the real SQLite store in a temp dir.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Clock, Completion, State, StoreError};
use idem_message::{Outcome, RetryReason};
use idem_sqlite::{SqliteOptions, SqliteStore};
use idem_testkit::stores::{Backend, TestStore};
use idem_testkit::trap_clock::TrapClock;
use support::{Answer, Effects, Harness, LEASE_MS, Seen, manual_clock};
use tempfile::TempDir;

/// A fresh store in a new temp dir, which the guard deletes.
async fn make() -> (Harness, TestStore) {
    support::real_store(Backend::Sqlite).await
}

run_once_suite!(make);
store_properties!(make, 24);

/// A store reading a [`TrapClock`]: armed, it stops for good.
fn trapped(dir: &TempDir) -> (Arc<SqliteStore>, TrapClock) {
    let clock = TrapClock::new(manual_clock().now());
    let path = dir.path().join("idem.db");
    let store =
        SqliteStore::open_with_clock(path, SqliteOptions::default(), Arc::new(clock.clone()));
    (Arc::new(store.unwrap()), clock)
}

/// A stopped store answers the claim with an error: nothing is run and
/// nothing acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_store_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = trapped(&dir);
    let harness = Harness {
        store,
        clock: clock.time.clone(),
    };
    let (runner, effects) = (harness.runner(), Effects::default());
    clock.arm();
    let outcome = support::deliver(&runner, &effects, "stopped", 1, Answer::Status(201)).await;
    let Outcome::Retry {
        reason: RetryReason::StoreUnavailable(error),
        ..
    } = &outcome
    else {
        panic!("{outcome}")
    };
    assert!(matches!(error, StoreError::Stopped { .. }), "{error}");
    assert_eq!(effects.runs(), 0);
}

/// The store stops after the effect ran and before its answer was
/// recorded: the message is not acked; reopened, the record is in
/// progress, and after its lease it is ambiguous, never run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_stopping_after_the_effect_leaves_it_for_reconciliation() {
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = trapped(&dir);
    let harness = Harness {
        store,
        clock: clock.time.clone(),
    };
    let (runner, effects) = (harness.runner(), Effects::default());
    let intent = support::intent("stopping", 1);
    let outcome = runner
        .run(&intent, |_| async {
            let answer = effects.run(Answer::Status(201), Duration::ZERO).await;
            clock.arm();
            answer
        })
        .await;
    let Outcome::Retry {
        reason: RetryReason::NotRecorded { completion, error },
        ..
    } = &outcome
    else {
        panic!("{outcome}")
    };
    assert_eq!(*completion, Completion::Final);
    assert!(matches!(error, StoreError::Stopped { .. }), "{error}");
    drop((runner, harness));

    let reopened = SqliteStore::open_with_clock(
        dir.path().join("idem.db"),
        SqliteOptions::default(),
        Arc::new(clock.time.clone()),
    );
    let harness = Harness {
        store: Arc::new(reopened.unwrap()),
        clock: clock.time.clone(),
    };
    let runner = harness.runner();
    assert_eq!(harness.state("stopping").await, Some(State::InProgress));
    harness.clock.advance_millis(LEASE_MS);
    let after = support::deliver(&runner, &effects, "stopping", 1, Answer::Status(201)).await;
    assert_eq!(support::seen(&after), Seen::Unknown);
    assert_eq!(effects.runs(), 1);
}
