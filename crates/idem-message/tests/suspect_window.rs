//! A consumer after a restore: an SQLite store backed up empty, 20 intents
//! run, the backup restored (`idem_sqlite::restore`, which opens the
//! suspect window), every intent delivered again. With the real
//! reconciler verifying fresh claims through the provider's ledger, none
//! runs twice; without a verifier, each runs again.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Clock, CompletionTable, Dedup, Store, StoredResult, SystemClock};
use idem_message::{Done, Outcome, RetryReason, RunOnce};
use idem_sqlite::{SqliteOptions, SqliteStore};
use support::ledger::{Ledger, reconciler};
use support::{intent, policy, reply};

fn runner(store: Arc<dyn Store>) -> RunOnce {
    RunOnce::new(
        store,
        policy(),
        CompletionTable::new([], Dedup::Idem).unwrap(),
    )
}

/// Delivers intent `key`; its effect, when it runs, pays into the ledger.
async fn deliver(run: &RunOnce, ledger: &Ledger, key: &str) -> Outcome {
    let intent = intent(key, 100);
    run.run(&intent, |attempt| async move {
        let mut paid = ledger.0.lock().unwrap();
        let n = paid.values().map(Vec::len).sum::<usize>() + 1;
        let answer = reply(201, n);
        let result = StoredResult::new(answer.status, answer.headers.clone(), answer.body.clone());
        paid.entry(attempt.id).or_default().push(result.unwrap());
        Ok(answer)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_store_replays_what_the_provider_has_and_runs_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (path, copy) = (dir.path().join("idem.db"), dir.path().join("backup.db"));
    let ledger = Arc::new(Ledger::default());
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&path, SqliteOptions::default()).unwrap());
    idem_sqlite::backup(&path, &copy).unwrap();
    let run = runner(store.clone());
    let mut firsts = Vec::new();
    for i in 0..20 {
        let Outcome::Ack {
            done: Done::Executed { result },
        } = deliver(&run, &ledger, &format!("k{i}")).await
        else {
            panic!("intent {i} runs");
        };
        firsts.push(result);
    }
    drop((run, store));
    let report = idem_sqlite::restore(&copy, &path, (86_400_000, SystemClock.now())).unwrap();
    assert_eq!(report.records, 0);

    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&path, SqliteOptions::default()).unwrap());
    let window = idem_reconcile::window::watch(&*store).await;
    assert!(
        window.open_at(SystemClock.now()).is_some(),
        "the restore opened it"
    );
    let reconciler = reconciler(store.clone(), &ledger);
    let verified =
        runner(store.clone()).with_suspect_window(window.clone(), Some(Arc::new(reconciler)));
    for (i, first) in firsts.iter().enumerate() {
        match deliver(&verified, &ledger, &format!("k{i}")).await {
            Outcome::Ack {
                done: Done::Replayed { result: Some(r) },
            } => assert_eq!(&r, first, "intent {i}: the provider's answer"),
            other => panic!("intent {i}: {other:?}"),
        }
    }
    assert_eq!(ledger.effects(), 20, "nothing ran twice");

    // A new intent: not found, but only trusted once a lease that began
    // before the window could have ended; then it runs, once.
    let mut outcome = deliver(&verified, &ledger, "new").await;
    for _ in 0..50 {
        let Outcome::Retry {
            reason: RetryReason::Unverified { .. },
            ..
        } = outcome
        else {
            break;
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        outcome = deliver(&verified, &ledger, "new").await;
    }
    assert!(
        matches!(
            outcome,
            Outcome::Ack {
                done: Done::Executed { .. }
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(ledger.effects(), 21);

    // Without a verifier, a key the store forgot runs again.
    drop((verified, store));
    idem_sqlite::restore(&copy, &path, (86_400_000, SystemClock.now())).unwrap();
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&path, SqliteOptions::default()).unwrap());
    let window = idem_reconcile::window::watch(&*store).await;
    let unverified = runner(store).with_suspect_window(window, None);
    assert!(matches!(
        deliver(&unverified, &ledger, "k0").await,
        Outcome::Ack {
            done: Done::Executed { .. }
        }
    ));
    assert_eq!(ledger.effects(), 22, "no lookup, no way to know");
}
