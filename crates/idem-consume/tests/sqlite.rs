//! The run-once scenarios, the contract's model and concurrent deliveries,
//! through the real SQLite store in a temp dir.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idem_consume::{Outcome, RetryReason};
use idem_core::{Clock, Completion, ManualClock, State, StoreError, Timestamp};
use idem_sqlite::{SqliteOptions, SqliteStore};
use proptest::prelude::*;
use support::{ANSWERS, Answer, Class, Effects, Harness, LEASE_MS, Seen, Step, manual_clock};
use tempfile::TempDir;

/// A fresh store in a new temp dir, which the guard deletes.
async fn make() -> (Harness, TempDir) {
    open(manual_clock())
}

fn open(clock: ManualClock) -> (Harness, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let store =
        SqliteStore::open_with_clock(path, SqliteOptions::default(), Arc::new(clock.clone()));
    (
        Harness {
            store: Arc::new(store.unwrap()),
            clock,
        },
        dir,
    )
}

run_once_suite!(make);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

fn step() -> impl Strategy<Value = Step> {
    (0u8..3, 0u8..2, 0..ANSWERS.len()).prop_map(|(key, amount, answer)| Step {
        key,
        amount,
        answer: ANSWERS[answer].0,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Any sequence of deliveries of a few intents, each with one of two
    /// payloads and any answer, gets the outcome the contract's table
    /// gives, and runs the effect exactly when the table says.
    #[test]
    fn deliveries_follow_the_contract(steps in proptest::collection::vec(step(), 1..24)) {
        runtime().block_on(async {
            let (harness, _dir) = make().await;
            support::check_model(&harness, "model", &steps).await;
        });
    }

    /// Many concurrent deliveries of one intent: never two effects at once;
    /// one effect in all unless the effect released the key, and then one
    /// per release.
    #[test]
    fn concurrent_deliveries_run_once(
        deliveries in 2usize..16,
        answer in 0..ANSWERS.len(),
        hold_ms in 0u64..20,
    ) {
        runtime().block_on(async {
            let (harness, _dir) = make().await;
            let (answer, class) = ANSWERS[answer];
            let hold = Duration::from_millis(hold_ms);
            let seen = support::concurrently(&harness, "c", deliveries, answer, hold).await;
            check(&seen, answer, class);
        });
    }
}

fn check(seen: &(Vec<Seen>, usize, usize), answer: Answer, class: Class) {
    support::check_concurrent_class(seen, answer, class);
}

/// A manual clock that, once armed, panics when read: reading it kills the
/// SQLite store's writer thread, and the store stops for good, as a store
/// whose worker died does.
#[derive(Clone)]
struct TrapClock {
    armed: Arc<AtomicBool>,
    time: ManualClock,
}

impl Clock for TrapClock {
    fn now(&self) -> Timestamp {
        assert!(!self.armed.load(Ordering::SeqCst), "the clock trap fired");
        self.time.now()
    }
}

fn trapped(dir: &TempDir) -> (Arc<SqliteStore>, TrapClock) {
    let clock = TrapClock {
        armed: Arc::default(),
        time: manual_clock(),
    };
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
    clock.armed.store(true, Ordering::SeqCst);
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
            clock.armed.store(true, Ordering::SeqCst);
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
