//! A delivery that meets an ambiguous record asks the reconciler to settle
//! it first (`RunOnce::with_settle_on_retry`, as the HTTP layer's
//! `with_settle_on_retry`): the provider's answer is acked as a replay and
//! nothing runs twice. Without a settler, or while a "not found" cannot
//! yet prove the effect did not happen, the delivery is retried and
//! nothing runs either. A real SQLite store and the real reconciler.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::sync::{Arc, Mutex};

use idem_core::{CompletionTable, Dedup, SettleOnRetry, Store, StoredResult};
use idem_message::{Done, Outcome, RetryReason, RunOnce};
use idem_sqlite::{SqliteOptions, SqliteStore};
use support::ledger::{Ledger, reconciler};
use support::{intent, policy, reply};

/// Whether a runner settles on the retry.
#[derive(Clone, Copy, Debug)]
enum Settles {
    OnRetry,
    Never,
}

/// Whether the effect's first run reached the provider before its answer
/// was lost.
#[derive(Clone, Copy, Debug)]
enum Paid {
    Yes,
    No,
}

/// What the second delivery comes to.
#[derive(Debug, PartialEq)]
enum Expect {
    /// Acked, replaying what the provider holds.
    Replayed,
    /// Retried: the outcome is still unknown.
    StillUnknown,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_that_meets_an_unknown_outcome_settles_it_first() {
    let cases = [
        (
            "settled: the provider has it",
            Settles::OnRetry,
            Paid::Yes,
            Expect::Replayed,
        ),
        (
            "no settler",
            Settles::Never,
            Paid::Yes,
            Expect::StillUnknown,
        ),
        // "Not found" while the first attempt's lease runs proves nothing.
        (
            "not found too early",
            Settles::OnRetry,
            Paid::No,
            Expect::StillUnknown,
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(dir.path().join("idem.db"), SqliteOptions::default()).unwrap());
    for (i, (name, settles, paid, expect)) in cases.into_iter().enumerate() {
        let ledger = Arc::new(Ledger::default());
        let reconciler = reconciler(store.clone(), &ledger);
        let table = CompletionTable::new([], Dedup::Idem).unwrap();
        let mut run = RunOnce::new(store.clone(), policy(), table);
        if let Settles::OnRetry = settles {
            run = run.with_settle_on_retry(Arc::new(reconciler) as Arc<dyn SettleOnRetry>);
        }
        let intent = intent(&format!("k{i}"), 100);
        let runs = Mutex::new(0);
        let deliver = || {
            run.run(&intent, |attempt| {
                *runs.lock().unwrap() += 1;
                let answer = reply(201, 1);
                if let Paid::Yes = paid {
                    let result = StoredResult::new(201, answer.headers.clone(), answer.body);
                    ledger.pay(attempt.id, result.unwrap());
                }
                // Paid (or not), then the answer is lost.
                async { Err(idem_core::AttemptOutcome::Lost) }
            })
        };
        let first = deliver().await;
        assert!(
            matches!(
                first,
                Outcome::Retry {
                    reason: RetryReason::OutcomeUnknown,
                    ..
                }
            ),
            "{name}: the first delivery leaves the outcome unknown: {first:?}"
        );
        let seen = match deliver().await {
            Outcome::Ack {
                done: Done::Replayed {
                    result: Some(result),
                },
            } => {
                assert_eq!(
                    result.body(),
                    reply(201, 1).body,
                    "{name}: the provider's answer"
                );
                Expect::Replayed
            }
            Outcome::Retry {
                reason: RetryReason::OutcomeUnknown,
                ..
            } => Expect::StillUnknown,
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(seen, expect, "{name}");
        assert_eq!(*runs.lock().unwrap(), 1, "{name}: the effect ran once");
    }
}
