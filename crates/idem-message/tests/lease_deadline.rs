//! An effect never outlives the lease the store granted, however late the
//! store's answer arrives: through the real SQLite and PostgreSQL stores
//! (127.0.0.1:5432, or `IDEM_TEST_POSTGRES_URL`; PostgreSQL leases by its
//! own clock), with their claim answers held back for any delay after the
//! commit.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::{
    CompletionTable, Dedup, FORWARD_MS_MIN, LeaseExpiry, Policy, State, Store, lease::margin_ms,
};
use idem_message::{Done, Outcome, RetryReason, RunOnce};
use idem_testkit::late_ack::LateAck;
use idem_testkit::stores::{Backend, open};
use proptest::prelude::*;
use support::{id, intent};

/// Short enough that a case takes well under a second and a half.
const LEASE_MS: u64 = 500;

/// When the effect started and when it ended (ran out or was dropped).
#[derive(Default)]
struct Span {
    started: Option<Instant>,
    ended: Option<Instant>,
}

/// Notes the effect's end when it finishes or is dropped at its deadline.
struct EndGuard<'a>(&'a Mutex<Span>);

impl Drop for EndGuard<'_> {
    fn drop(&mut self) {
        self.0.lock().unwrap().ended = Some(Instant::now());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// For any delay between the commit and the answer, and any time the
    /// effect takes: the effect's deadline and its end are within the
    /// lease as the store began it, and an answer too late to leave
    /// [`FORWARD_MS_MIN`] runs nothing and releases the record.
    #[test]
    fn the_effect_ends_within_the_granted_lease(
        ack_delay_ms in 0u64..700,
        effect_ms in 0u64..700,
        postgres in proptest::bool::ANY,
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let backend = if postgres { Backend::Postgres } else { Backend::Sqlite };
        rt.block_on(check(backend, ack_delay_ms, effect_ms));
    }
}

async fn check(backend: Backend, ack_delay_ms: u64, effect_ms: u64) {
    let opened = open(backend, "consume_late").await;
    let store = opened.store.clone();
    let late = Arc::new(LateAck::new(store));
    late.set_delay(Duration::from_millis(ack_delay_ms));
    let policy = Policy::new(LEASE_MS, 60, 3_600, LeaseExpiry::Reconcile).unwrap();
    let table = CompletionTable::new([], Dedup::Idem).unwrap();
    let runner = RunOnce::new(late.clone(), policy, table);
    let span = Mutex::new(Span::default());
    let deadline = Mutex::new(None);
    let outcome = runner
        .run(&intent("late", 1), |attempt| {
            *deadline.lock().unwrap() = Some(attempt.deadline);
            let span = &span;
            async move {
                span.lock().unwrap().started = Some(Instant::now());
                let _end = EndGuard(span);
                tokio::time::sleep(Duration::from_millis(effect_ms)).await;
                Ok(idem_message::Reply::status(201))
            }
        })
        .await;
    let sent = late.claims_sent();
    assert_eq!(sent.len(), 1);
    let lease_end = sent[0] + Duration::from_millis(LEASE_MS);
    let record = late.get(&id("late")).await.unwrap();
    let state = record.map(|r| r.state);
    let span = span.into_inner().unwrap();
    let case =
        format!("{backend:?}, ack after {ack_delay_ms} ms, effect {effect_ms} ms: {outcome}");
    let Some(started) = span.started else {
        assert!(
            matches!(
                outcome,
                Outcome::Retry {
                    reason: RetryReason::LeaseSpent { .. },
                    ..
                }
            ),
            "{case}"
        );
        assert_eq!(state, None, "released: {case}");
        return;
    };
    assert!(
        ack_delay_ms + FORWARD_MS_MIN + margin_ms(LEASE_MS) <= LEASE_MS,
        "started with too little of the lease left: {case}"
    );
    let deadline = deadline.into_inner().unwrap().unwrap();
    assert!(deadline <= lease_end, "deadline past the lease: {case}");
    assert!(started <= deadline, "{case}");
    let ended = span.ended.unwrap();
    assert!(ended <= lease_end, "the effect outlived its lease: {case}");
    match outcome {
        Outcome::Ack {
            done: Done::Executed { .. },
        } => assert_eq!(state, Some(State::Completed), "{case}"),
        Outcome::Retry {
            reason: RetryReason::OutcomeUnknown,
            ..
        } => assert_eq!(state, Some(State::Ambiguous), "cut at its deadline: {case}"),
        other => panic!("unexpected {other}: {case}"),
    }
}
