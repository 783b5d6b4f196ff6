//! The driver against a real SQLite file: each way an effect can end
//! leaves the record the core's tables say, reports it to the observer
//! once, and comes back as the end an adapter renders; a second attempt
//! replays, and one that meets the first in flight waits for it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_attempt::{
    Answer, AttemptEnd, Driver, Observe, Polling, Ran, StoreAnswer, StoreOp, WaitEnd,
};
use idem_core::{
    AttemptOutcome, ClaimRequest, Completion, CompletionTable, Dedup, EffectEnd, Fingerprint,
    IdempotencyKey, LeaseExpiry, Policy, RecordId, Scope, State, Store, StoredResult,
};
use idem_sqlite::{SqliteOptions, SqliteStore};

const LEASE_MS: u64 = 300;

/// What the test effect does.
#[derive(Clone, Copy, Debug)]
enum Effect {
    Answers(u16),
    Fails(AttemptOutcome),
    Hangs,
    Panics,
}

/// The test effect's answer: a status or a failure.
struct Said(Result<u16, AttemptOutcome>);

impl Answer for Said {
    type Kept = &'static str;

    fn end(&self) -> EffectEnd {
        match self.0 {
            Ok(status) => EffectEnd::Answered { status },
            Err(failure) => EffectEnd::Failed(failure),
        }
    }

    fn cause(&self) -> String {
        format!("{:?}", self.0)
    }

    async fn keep(self) -> Option<(StoredResult, &'static str)> {
        let status = self.0.ok()?;
        Some((
            StoredResult::new(status, vec![], b"done".to_vec()).ok()?,
            "kept",
        ))
    }
}

/// Counts what the observer is told.
#[derive(Default)]
struct Seen(Mutex<Vec<String>>);

impl Observe for Seen {
    fn store_answered(&self, op: StoreOp, _: &tracing::Span, _: Duration, a: StoreAnswer<'_>) {
        let said = match a {
            StoreAnswer::Claimed(_) => "claimed",
            StoreAnswer::Written => "written",
            _ => "failed",
        };
        self.0.lock().unwrap().push(format!("{op:?} {said}"));
    }

    fn written(&self, completion: Completion) {
        self.0.lock().unwrap().push(format!("wrote {completion:?}"));
    }

    fn waited(&self, end: WaitEnd) {
        self.0.lock().unwrap().push(format!("waited {end:?}"));
    }

    fn effect_ended(&self, end: EffectEnd, _: Duration) {
        self.0.lock().unwrap().push(format!("ended {end:?}"));
    }
}

fn request(key: &str) -> ClaimRequest {
    ClaimRequest {
        id: RecordId {
            scope: Scope::from_parts("payouts", "tenant", None).unwrap(),
            key: IdempotencyKey::parse(key).unwrap(),
        },
        fingerprint: Fingerprint::from_bytes([7; 32]),
        legacy_fingerprint: None,
        owner: "test".into(),
        region: None,
        policy: Policy::new(LEASE_MS, 3_600, 7_200, LeaseExpiry::Reconcile).unwrap(),
    }
}

async fn effect(effect: Effect) -> Said {
    match effect {
        Effect::Answers(status) => Said(Ok(status)),
        Effect::Fails(failure) => Said(Err(failure)),
        Effect::Hangs => std::future::pending().await,
        Effect::Panics => panic!("the effect panicked after its side effect"),
    }
}

/// The end's name, as the table below spells it.
fn named(end: &AttemptEnd<Said>) -> String {
    match end {
        AttemptEnd::Completed {
            kept: Some("kept"),
            written: Ok(_),
            ..
        } => "completed".into(),
        AttemptEnd::Settled {
            completion,
            ran,
            written: Ok(()),
        } => {
            let ran = match ran {
                Ran::Answered(_) => "answered",
                Ran::LeaseEnded { .. } => "lease ended",
                Ran::Panicked(_) => "panicked",
                _ => "other",
            };
            format!("{completion:?} after {ran}")
        }
        AttemptEnd::Replay(_) => "replay".into(),
        _ => "other".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_end_is_written_once_and_handed_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db"), SqliteOptions::default()).unwrap();
    let table = CompletionTable::new([(409, Completion::Final)], Dedup::Idem).unwrap();
    let cases = [
        (
            Effect::Answers(201),
            "completed",
            Some(State::Completed),
            "wrote Final",
        ),
        (
            Effect::Answers(409),
            "completed",
            Some(State::Completed),
            "wrote Final",
        ),
        (
            Effect::Answers(425),
            "Release after answered",
            None,
            "wrote Release",
        ),
        (
            Effect::Answers(503),
            "Unknown after answered",
            Some(State::Ambiguous),
            "wrote Unknown",
        ),
        (
            Effect::Fails(AttemptOutcome::NotSent),
            "Release after answered",
            None,
            "wrote Release",
        ),
        (
            Effect::Fails(AttemptOutcome::Lost),
            "Unknown after answered",
            Some(State::Ambiguous),
            "wrote Unknown",
        ),
        (
            Effect::Hangs,
            "Unknown after lease ended",
            Some(State::Ambiguous),
            "wrote Unknown",
        ),
        (
            Effect::Panics,
            "Unknown after panicked",
            Some(State::Ambiguous),
            "wrote Unknown",
        ),
    ];
    for (i, (behaves, expect, state, wrote)) in cases.into_iter().enumerate() {
        let seen = Seen::default();
        let driver = Driver::new(&store, &table).with_observer(&seen);
        let mut req = request(&format!("k{i}"));
        let end = driver.run(&mut req, |_| effect(behaves)).await;
        assert_eq!(named(&end), expect, "{behaves:?}");
        let record = store.get(&req.id).await.unwrap();
        assert_eq!(record.map(|r| r.state), state, "{behaves:?}: the record");
        let seen = seen.0.lock().unwrap().clone();
        assert_eq!(
            seen.first().map(String::as_str),
            Some("Claim claimed"),
            "{behaves:?}"
        );
        let writes: Vec<_> = seen.iter().filter(|s| s.starts_with("wrote")).collect();
        assert_eq!(writes, [wrote], "{behaves:?}: written once: {seen:?}");
        assert_eq!(
            seen.iter().filter(|s| s.starts_with("ended")).count(),
            1,
            "{seen:?}"
        );
    }
    // A completed key replays, and its effect does not run.
    let mut req = request("k0");
    let end = Driver::new(&store, &table)
        .run(&mut req, |_| async { panic!("a replay runs nothing") })
        .await;
    assert_eq!(named(&end), "replay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_meets_its_key_in_flight_waits_for_the_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(dir.path().join("idem.db"), SqliteOptions::default()).unwrap());
    let table = CompletionTable::new([], Dedup::Idem).unwrap();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let first = {
        let (store, table) = (store.clone(), table.clone());
        tokio::spawn(async move {
            let mut req = request("waited");
            let end = Driver::new(&*store, &table)
                .run(&mut req, |_| async move {
                    started_tx.send(()).unwrap();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Said(Ok(201))
                })
                .await;
            named(&end)
        })
    };
    started_rx.await.unwrap();
    let cases = [
        (Duration::ZERO, "in flight"),
        (Duration::from_secs(2), "replay"),
    ];
    for (wait, expect) in cases {
        let seen = Seen::default();
        let waits = Polling(wait);
        let driver = Driver::new(&*store, &table)
            .with_observer(&seen)
            .with_claimant(&waits);
        let end = driver
            .run(&mut request("waited"), |_| async { Said(Ok(500)) })
            .await;
        let end = match end {
            AttemptEnd::InFlight { .. } => "in flight".to_owned(),
            end => named(&end),
        };
        assert_eq!(end, expect, "waiting {wait:?}");
        let waited = seen
            .0
            .lock()
            .unwrap()
            .contains(&"waited Answered".to_owned());
        assert_eq!(waited, !wait.is_zero(), "waiting {wait:?}");
    }
    assert_eq!(first.await.unwrap(), "completed");
}
