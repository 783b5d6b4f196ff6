//! One suite of run-once scenarios, written once and run against every
//! real store (memory, SQLite, PostgreSQL) by [`run_once_suite!`], plus
//! what they share: a harness with an injected clock, messages that carry
//! one intent, an effect that counts its runs, a store wrapper that fails
//! on demand, and a model of the contract for sequences of deliveries.

#![allow(
    dead_code,
    reason = "each test binary uses the helpers it needs and not the others"
)]
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

pub mod ledger;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{
    AttemptOutcome, Claim, ClaimRequest, Clock, CompletionTable, Dedup, IdempotencyKey,
    LeaseExpiry, ManualClock, Policy, RESULT_BODY_BYTES_MAX, Record, RecordId, Scope, State, Store,
    StoreError, StoreFuture, StoreWrapper, StoredResult, Timestamp, Token,
};
use idem_message::{
    Done, Intent, IntentSpec, KeyTemplate, Message, Outcome, PayloadFingerprint, RejectReason,
    Reply, RetryReason, RunOnce, Sink,
};

/// The lease of every test policy, in milliseconds.
pub const LEASE_MS: u64 = 1_000;
/// The retention of every test policy, in seconds.
pub const RETENTION_S: u64 = 60;
/// The tombstone horizon of every test policy, in seconds.
pub const TOMBSTONE_S: u64 = 3_600;
/// Where every test clock starts.
pub const START: Timestamp = Timestamp::from_millis(1_700_000_000_000);

/// Generates one test per scenario against the stores `$make` opens:
/// `async fn() -> (Harness, Guard)`, the guard cleaning up after the test.
#[macro_export]
macro_rules! run_once_suite {
    ($make:path) => {
        $crate::run_once_suite!(@each $make;
            replay_returns_the_first_answer,
            another_payload_is_rejected_and_not_run,
            unknown_answers_leave_the_record_ambiguous,
            release_answers_let_a_later_delivery_run,
            upstream_dedup_releases_unknown_answers,
            an_answer_too_large_is_recorded_without_its_body,
            a_panicking_effect_leaves_the_record_ambiguous,
            a_dropped_run_is_reconciled_not_rerun,
            an_effect_outliving_its_lease_is_fenced,
            a_failing_store_runs_nothing_and_acks_nothing,
            concurrent_deliveries_run_the_effect_once,
            a_key_past_retention_is_rejected_as_late,
            the_runner_s_region_is_on_the_records_it_acquires,
            waiting_deliveries_are_acked_with_the_replay,
        );
    };
    (@each $make:path; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let (harness, _guard) = $make().await;
                support::$name(&harness).await;
            }
        )*
    };
}

/// Generates the contract's model and concurrent deliveries as property
/// tests through the stores `$make` opens, `$cases` cases each.
#[macro_export]
macro_rules! store_properties {
    ($make:path, $cases:expr) => {
        proptest::proptest! {
            #![proptest_config(proptest::prelude::ProptestConfig {
                cases: $cases,
                ..proptest::prelude::ProptestConfig::default()
            })]

            /// Any sequence of deliveries of a few intents, each with one
            /// of two payloads and any answer, gets the outcome the
            /// contract's table gives, and runs the effect exactly when the
            /// table says.
            #[test]
            fn deliveries_follow_the_contract(
                steps in proptest::collection::vec(support::step(), 1..24),
            ) {
                support::runtime().block_on(async {
                    let (harness, _guard) = $make().await;
                    support::check_model(&harness, "model", &steps).await;
                });
            }

            /// Many concurrent deliveries of one intent: never two effects
            /// at once; one effect in all unless the effect released the
            /// key, and then one per release.
            #[test]
            fn concurrent_deliveries_run_once(
                deliveries in 2usize..16,
                answer in 0..support::ANSWERS.len(),
                hold_ms in 0u64..20,
            ) {
                support::runtime().block_on(async {
                    let (harness, _guard) = $make().await;
                    let (answer, class) = support::ANSWERS[answer];
                    let hold = std::time::Duration::from_millis(hold_ms);
                    let seen =
                        support::concurrently(&harness, "c", deliveries, answer, hold).await;
                    support::check_concurrent_class(&seen, answer, class);
                });
            }
        }
    };
}

/// A runtime for a property case, which proptest runs outside one.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

/// One delivery of the model: one of three intents, one of two payloads,
/// any answer.
pub fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::strategy::Strategy;
    (0u8..3, 0u8..2, 0..ANSWERS.len()).prop_map(|(key, amount, answer)| Step {
        key,
        amount,
        answer: ANSWERS[answer].0,
    })
}

/// A fresh store of `backend` judging time by a manual clock; the guard
/// removes it.
pub async fn real_store(
    backend: idem_testkit::stores::Backend,
) -> (Harness, idem_testkit::stores::TestStore) {
    let clock = manual_clock();
    let opened =
        idem_testkit::stores::open_with_clock(backend, "consume", Some(Arc::new(clock.clone())))
            .await;
    let harness = Harness {
        store: opened.store.clone(),
        clock,
    };
    (harness, opened)
}

/// A store under test and the clock it decides by.
pub struct Harness {
    pub store: Arc<dyn Store>,
    pub clock: ManualClock,
}

/// What a test effect answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Status(u16),
    Failed(AttemptOutcome),
}

/// A test effect: counts its runs, and how many run at once.
#[derive(Default)]
pub struct Effects {
    runs: AtomicUsize,
    running: AtomicUsize,
    max_running: AtomicUsize,
}

/// An outcome reduced to what the tests compare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    Executed(StoredResult),
    Replayed(StoredResult),
    InFlight,
    Unknown,
    Released,
    NotRecorded,
    StoreUnavailable,
    KeyReused,
    Late,
    Other(String),
}

pub fn policy() -> Policy {
    Policy::new(LEASE_MS, RETENTION_S, TOMBSTONE_S, LeaseExpiry::Reconcile).unwrap()
}

pub fn manual_clock() -> ManualClock {
    ManualClock::new(START)
}

pub fn scope() -> Scope {
    Scope::from_parts("payouts", "ledger", None).unwrap()
}

/// How the tests read intents: key `pay:<id>`, the send time excluded.
pub fn spec() -> IntentSpec {
    IntentSpec::new(
        scope(),
        KeyTemplate::parse("pay:{/id}").unwrap(),
        PayloadFingerprint::json(vec!["/sent_at".parse().unwrap()]),
    )
}

/// The record of the intent with id field `key`.
pub fn id(key: &str) -> RecordId {
    RecordId {
        scope: scope(),
        key: IdempotencyKey::new(format!("pay:{key}")).unwrap(),
    }
}

/// The intent `key` paying `amount`, from a message sent at a new time
/// (which the fingerprint excludes), as a producer republishes it.
pub fn intent(key: &str, amount: u32) -> Intent {
    static SENT: AtomicUsize = AtomicUsize::new(0);
    let sent_at = SENT.fetch_add(1, Ordering::Relaxed);
    let payload = format!(r#"{{"sent_at": {sent_at}, "amount": {amount}, "id": "{key}"}}"#);
    let message = Message {
        payload: payload.as_bytes(),
        message_id: Some("not-the-key"),
        ..Message::default()
    };
    spec().intent(&message).unwrap()
}

impl Harness {
    /// A runner with the test policy and the default completion table.
    pub fn runner(&self) -> RunOnce {
        self.runner_with(Dedup::Idem)
    }

    pub fn runner_with(&self, dedup: Dedup) -> RunOnce {
        let table = CompletionTable::new([], dedup).unwrap();
        RunOnce::new(Arc::clone(&self.store), policy(), table)
            .with_owner("consumer-test")
            .unwrap()
    }

    /// The state of `key`'s record now, or `None` if there is none.
    pub async fn state(&self, key: &str) -> Option<State> {
        let record = self.store.get(&id(key)).await.unwrap();
        record.map(|r| r.state_at(self.clock.now()))
    }
}

impl Effects {
    /// Runs once: answers `answer` after `hold`. A reply's body names the
    /// run, so a replay shows which run it replays.
    pub async fn run(&self, answer: Answer, hold: Duration) -> Result<Reply, AttemptOutcome> {
        let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_running.fetch_max(now, Ordering::SeqCst);
        if !hold.is_zero() {
            tokio::time::sleep(hold).await;
        }
        self.running.fetch_sub(1, Ordering::SeqCst);
        match answer {
            Answer::Status(status) => Ok(reply(status, n)),
            Answer::Failed(failure) => Err(failure),
        }
    }

    /// Runs, then panics, as an effect that crashed after its side effect.
    pub async fn crash(&self) -> Result<Reply, AttemptOutcome> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        panic!("the effect crashed after its side effect");
    }

    /// Runs, then panics before it even returns a future.
    pub fn crash_at_once(&self) -> std::future::Ready<Result<Reply, AttemptOutcome>> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        panic!("the effect crashed before returning its future");
    }

    /// Runs and never answers.
    pub async fn hang(&self, started: &tokio::sync::Notify) -> Result<Reply, AttemptOutcome> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        started.notify_one();
        std::future::pending().await
    }

    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    pub fn max_running(&self) -> usize {
        self.max_running.load(Ordering::SeqCst)
    }
}

/// The reply of run `n` answering `status`.
pub fn reply(status: u16, n: usize) -> Reply {
    Reply {
        status,
        headers: vec![("content-type".into(), "text/plain".into())],
        body: format!("answer {status} of run {n}").into_bytes(),
        not_stored: None,
    }
}

/// The stored form of [`reply`].
pub fn stored(status: u16, n: usize) -> StoredResult {
    let r = reply(status, n);
    StoredResult::new(r.status, r.headers, r.body).unwrap()
}

/// One delivery of intent `key` paying `amount`, the effect answering
/// `answer` at once.
pub async fn deliver(
    runner: &RunOnce,
    effects: &Effects,
    key: &str,
    amount: u32,
    answer: Answer,
) -> Outcome {
    let intent = intent(key, amount);
    runner
        .run(&intent, |_| effects.run(answer, Duration::ZERO))
        .await
}

/// What an outcome says, checking on the way that only an ack is an ack
/// and that every rejection names the right sink.
pub fn seen(outcome: &Outcome) -> Seen {
    match outcome {
        Outcome::Ack {
            done: Done::Executed { result },
        } => Seen::Executed(result.clone()),
        Outcome::Ack {
            done: Done::Replayed { result: Some(r) },
        } => Seen::Replayed(r.clone()),
        Outcome::Retry { reason, after } => {
            assert!(!outcome.is_ack());
            assert!(!after.is_zero(), "a retry waits: {outcome}");
            match reason {
                RetryReason::InFlight => Seen::InFlight,
                RetryReason::OutcomeUnknown => Seen::Unknown,
                RetryReason::Released => Seen::Released,
                RetryReason::NotRecorded { .. } => Seen::NotRecorded,
                RetryReason::StoreUnavailable(_) => Seen::StoreUnavailable,
                other => Seen::Other(other.to_string()),
            }
        }
        Outcome::Reject { reason } => match reason {
            RejectReason::KeyReused { .. } => {
                assert_eq!(reason.sink(), Sink::DeadLetter);
                Seen::KeyReused
            }
            RejectReason::Late { .. } => {
                assert_eq!(reason.sink(), Sink::Late);
                Seen::Late
            }
            other => Seen::Other(other.to_string()),
        },
        other => Seen::Other(other.to_string()),
    }
}

// ---------------------------------------------------------------------
// The scenarios.

pub async fn replay_returns_the_first_answer(h: &Harness) {
    let (runner, effects) = (h.runner(), Effects::default());
    for (key, status) in [
        ("r-201", 201),
        ("r-200", 200),
        ("r-422", 422),
        ("r-404", 404),
    ] {
        let first = deliver(&runner, &effects, key, 100, Answer::Status(status)).await;
        let runs = effects.runs();
        assert_eq!(seen(&first), Seen::Executed(stored(status, runs)), "{key}");
        for _ in 0..3 {
            let again = deliver(&runner, &effects, key, 100, Answer::Status(500)).await;
            assert_eq!(seen(&again), Seen::Replayed(stored(status, runs)), "{key}");
        }
        assert_eq!(h.state(key).await, Some(State::Completed));
    }
    assert_eq!(effects.runs(), 4);
}

pub async fn the_runner_s_region_is_on_the_records_it_acquires(h: &Harness) {
    let effects = Effects::default();
    let bad = h.runner().with_region("eu west").err();
    assert_eq!(
        bad,
        Some(idem_core::LimitError::BadRegion {
            region: "eu west".to_owned()
        }),
        "a bad region is refused when the runner is built"
    );
    let (regional, plain) = (h.runner().with_region("eu-west").unwrap(), h.runner());
    let done = deliver(&regional, &effects, "g-eu", 100, Answer::Status(201)).await;
    assert_eq!(seen(&done), Seen::Executed(stored(201, 1)));
    deliver(&plain, &effects, "g-none", 100, Answer::Status(201)).await;
    let region = |key: &'static str| async move {
        let record = h.store.get(&id(key)).await.unwrap().unwrap();
        record.region
    };
    assert_eq!(region("g-eu").await.as_deref(), Some("eu-west"));
    assert_eq!(
        region("g-none").await,
        None,
        "no region configured, none kept"
    );
}

pub async fn another_payload_is_rejected_and_not_run(h: &Harness) {
    let (runner, effects) = (h.runner(), Effects::default());
    let done = deliver(&runner, &effects, "m-done", 100, Answer::Status(201)).await;
    assert_eq!(seen(&done), Seen::Executed(stored(201, 1)));
    let unknown = deliver(&runner, &effects, "m-unknown", 100, Answer::Status(502)).await;
    assert_eq!(seen(&unknown), Seen::Unknown);
    for key in ["m-done", "m-unknown"] {
        let reused = deliver(&runner, &effects, key, 999, Answer::Status(201)).await;
        assert_eq!(seen(&reused), Seen::KeyReused, "{key}");
        let Outcome::Reject { reason } = &reused else {
            unreachable!()
        };
        assert_eq!(
            reason.to_string(),
            format!("key \"pay:{key}\" is already used by a different payload; nothing was run")
        );
    }
    assert_eq!(effects.runs(), 2);
    assert_eq!(h.state("m-done").await, Some(State::Completed));
}

pub async fn unknown_answers_leave_the_record_ambiguous(h: &Harness) {
    let (runner, effects) = (h.runner(), Effects::default());
    let answers = [
        Answer::Status(500),
        Answer::Status(503),
        Answer::Status(504),
        Answer::Status(408),
        Answer::Status(409),
        Answer::Status(429),
        Answer::Failed(AttemptOutcome::Lost),
    ];
    for (n, answer) in answers.into_iter().enumerate() {
        let key = format!("u-{n}");
        let first = deliver(&runner, &effects, &key, 100, answer).await;
        assert_eq!(seen(&first), Seen::Unknown, "{answer:?}");
        assert_eq!(h.state(&key).await, Some(State::Ambiguous), "{answer:?}");
        // Why, for the operator: the effect's status and the start of its
        // answer's body, or only the cause when no answer came.
        let record = h.store.get(&id(&key)).await.unwrap().unwrap();
        let Some(note) = record.ambiguity else {
            panic!("{answer:?}: the record says why it is ambiguous");
        };
        let expected = match answer {
            Answer::Status(status) => (
                Some(status),
                Some(format!("answer {status} of run {}", n + 1)),
            ),
            Answer::Failed(_) => (None, None),
        };
        assert_eq!(
            (note.status, note.excerpt),
            expected,
            "{answer:?}: {}",
            note.error
        );
        // A second delivery, now and after the lease, does not run it again.
        let again = deliver(&runner, &effects, &key, 100, Answer::Status(201)).await;
        assert_eq!(seen(&again), Seen::Unknown, "{answer:?}");
        h.clock.advance_millis(LEASE_MS);
        let later = deliver(&runner, &effects, &key, 100, Answer::Status(201)).await;
        assert_eq!(seen(&later), Seen::Unknown, "{answer:?}");
        assert_eq!(effects.runs(), n + 1, "{answer:?}");
    }
}

pub async fn release_answers_let_a_later_delivery_run(h: &Harness) {
    let (runner, effects) = (h.runner(), Effects::default());
    let answers = [
        Answer::Status(425),
        Answer::Status(421),
        Answer::Failed(AttemptOutcome::NotSent),
    ];
    for (n, answer) in answers.into_iter().enumerate() {
        let key = format!("rel-{n}");
        let first = deliver(&runner, &effects, &key, 100, answer).await;
        assert_eq!(seen(&first), Seen::Released, "{answer:?}");
        assert_eq!(h.state(&key).await, None, "{answer:?}");
        let later = deliver(&runner, &effects, &key, 100, Answer::Status(201)).await;
        let runs = effects.runs();
        assert_eq!(
            seen(&later),
            Seen::Executed(stored(201, runs)),
            "{answer:?}"
        );
        assert_eq!(runs, 2 * (n + 1), "{answer:?}");
    }
}

pub async fn upstream_dedup_releases_unknown_answers(h: &Harness) {
    let (runner, effects) = (h.runner_with(Dedup::Upstream), Effects::default());
    let first = deliver(&runner, &effects, "dd", 100, Answer::Status(500)).await;
    assert_eq!(seen(&first), Seen::Released);
    let lost = deliver(
        &runner,
        &effects,
        "dd",
        100,
        Answer::Failed(AttemptOutcome::Lost),
    )
    .await;
    assert_eq!(seen(&lost), Seen::Released);
    let done = deliver(&runner, &effects, "dd", 100, Answer::Status(201)).await;
    assert_eq!(seen(&done), Seen::Executed(stored(201, 3)));
}

pub async fn an_answer_too_large_is_recorded_without_its_body(h: &Harness) {
    let (runner, effects) = (h.runner(), Effects::default());
    let huge = Reply {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: vec![b'x'; RESULT_BODY_BYTES_MAX + 1],
        not_stored: None,
    };
    // Too large as given, and too large for the effect to read it at all.
    let cut = Reply::not_stored(201, "its body is over the limit");
    for (key, reply, why) in [("big", huge, "body"), ("cut", cut, "over the limit")] {
        let outcome = runner
            .run(&intent(key, 1), |_| async {
                effects.run(Answer::Status(201), Duration::ZERO).await?;
                Ok(reply)
            })
            .await;
        let Seen::Executed(result) = seen(&outcome) else {
            panic!("{outcome}")
        };
        assert_eq!(
            result.status(),
            idem_core::RESULT_NOT_STORED_STATUS,
            "{key}"
        );
        let body = String::from_utf8_lossy(result.body()).into_owned();
        assert!(
            body.contains(idem_core::RESULT_NOT_STORED_TYPE),
            "{key}: {body}"
        );
        assert!(
            body.contains("answered 201") && body.contains(why),
            "{key}: {body}"
        );
        let again = deliver(&runner, &effects, key, 1, Answer::Status(500)).await;
        assert_eq!(seen(&again), Seen::Replayed(result));
    }
    assert_eq!(effects.runs(), 2);
}

pub async fn a_panicking_effect_leaves_the_record_ambiguous(h: &Harness) {
    let (runner, effects) = (h.runner(), Arc::new(Effects::default()));
    for (n, key) in ["p-future", "p-closure"].into_iter().enumerate() {
        let task = {
            let (runner, effects) = (runner.clone(), Arc::clone(&effects));
            let intent = intent(key, 1);
            tokio::spawn(async move {
                match n {
                    0 => runner.run(&intent, |_| effects.crash()).await,
                    _ => runner.run(&intent, |_| effects.crash_at_once()).await,
                }
            })
        };
        let joined = task.await;
        assert!(
            joined.is_err_and(|e| e.is_panic()),
            "{key}: the panic goes on"
        );
        assert_eq!(h.state(key).await, Some(State::Ambiguous), "{key}");
        let again = deliver(&runner, &effects, key, 1, Answer::Status(201)).await;
        assert_eq!(seen(&again), Seen::Unknown, "{key}");
        assert_eq!(effects.runs(), n + 1, "{key}");
    }
}

pub async fn a_dropped_run_is_reconciled_not_rerun(h: &Harness) {
    let (runner, effects) = (h.runner(), Effects::default());
    let started = tokio::sync::Notify::new();
    let intent = intent("drop", 1);
    tokio::select! {
        outcome = runner.run(&intent, |_| effects.hang(&started)) => panic!("{outcome}"),
        () = started.notified() => {}
    }
    // The run was dropped mid-effect: nothing was written.
    assert_eq!(h.state("drop").await, Some(State::InProgress));
    let during = deliver(&runner, &effects, "drop", 1, Answer::Status(201)).await;
    assert_eq!(seen(&during), Seen::InFlight);
    h.clock.advance_millis(LEASE_MS);
    let after = deliver(&runner, &effects, "drop", 1, Answer::Status(201)).await;
    assert_eq!(seen(&after), Seen::Unknown);
    assert_eq!(h.state("drop").await, Some(State::Ambiguous));
    assert_eq!(effects.runs(), 1);
}

pub async fn an_effect_outliving_its_lease_is_fenced(h: &Harness) {
    let (runner, effects) = (h.runner(), Effects::default());
    let outcome = runner
        .run(&intent("slow", 1), |_| async {
            effects.run(Answer::Status(201), Duration::ZERO).await?;
            // The lease ends while the effect runs; a redelivery finds it.
            h.clock.advance_millis(LEASE_MS);
            let redelivery = deliver(&runner, &effects, "slow", 1, Answer::Status(201)).await;
            assert_eq!(seen(&redelivery), Seen::Unknown);
            Ok(reply(201, 1))
        })
        .await;
    let Outcome::Retry {
        reason: RetryReason::NotRecorded { error, .. },
        ..
    } = &outcome
    else {
        panic!("{outcome}")
    };
    assert!(matches!(error, StoreError::Fenced { .. }), "{error}");
    assert_eq!(h.state("slow").await, Some(State::Ambiguous));
    assert_eq!(effects.runs(), 1);
}

pub async fn a_failing_store_runs_nothing_and_acks_nothing(h: &Harness) {
    let faulty = Arc::new(Faulty::new(Arc::clone(&h.store)));
    let broken = Harness {
        store: faulty.clone(),
        clock: h.clock.clone(),
    };
    let (runner, effects) = (broken.runner(), Effects::default());

    faulty.fail_claims.store(true, Ordering::SeqCst);
    let refused = deliver(&runner, &effects, "f", 1, Answer::Status(201)).await;
    assert_eq!(seen(&refused), Seen::StoreUnavailable);
    assert_eq!(effects.runs(), 0);
    faulty.fail_claims.store(false, Ordering::SeqCst);
    assert_eq!(h.state("f").await, None);

    for (key, answer) in [
        ("f-final", Answer::Status(201)),
        ("f-release", Answer::Status(425)),
        ("f-unknown", Answer::Status(500)),
    ] {
        faulty.fail_writes.store(true, Ordering::SeqCst);
        let unrecorded = deliver(&runner, &effects, key, 1, answer).await;
        assert_eq!(seen(&unrecorded), Seen::NotRecorded, "{key}");
        faulty.fail_writes.store(false, Ordering::SeqCst);
        assert_eq!(h.state(key).await, Some(State::InProgress), "{key}");
        let during = deliver(&runner, &effects, key, 1, Answer::Status(201)).await;
        assert_eq!(seen(&during), Seen::InFlight, "{key}");
        h.clock.advance_millis(LEASE_MS);
        let after = deliver(&runner, &effects, key, 1, Answer::Status(201)).await;
        assert_eq!(seen(&after), Seen::Unknown, "{key}");
    }
    assert_eq!(effects.runs(), 3);
}

pub async fn concurrent_deliveries_run_the_effect_once(h: &Harness) {
    for (n, answer) in [Answer::Status(201), Answer::Status(500)]
        .into_iter()
        .enumerate()
    {
        let key = format!("c-{n}");
        let seen = concurrently(h, &key, 12, answer, Duration::from_millis(30)).await;
        let expect_first = match answer {
            Answer::Status(201) => Seen::Executed(stored(201, 1)),
            _ => Seen::Unknown,
        };
        check_concurrent(&seen, &expect_first);
    }
}

/// Deliveries that find their intent in flight and may wait for it get
/// its outcome: the first runs, every other one is acked with its replay,
/// none is handed back in flight. A release lets one waiter run after it;
/// a wait shorter than the effect still hands the message back.
pub async fn waiting_deliveries_are_acked_with_the_replay(h: &Harness) {
    let hold = Duration::from_millis(300);
    let runner = h.runner().with_wait(Duration::from_secs(3));
    let effects = Arc::new(Effects::default());
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (runner, effects, intent) =
                (runner.clone(), Arc::clone(&effects), intent("w-1", 7));
            tokio::spawn(async move {
                // The first is under way before the others arrive.
                tokio::time::sleep(Duration::from_millis(if i == 0 { 0 } else { 50 })).await;
                seen(
                    &runner
                        .run(&intent, |_| effects.run(Answer::Status(201), hold))
                        .await,
                )
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    assert_eq!(effects.runs(), 1, "{outcomes:?}");
    assert_eq!(outcomes[0], Seen::Executed(stored(201, 1)), "{outcomes:?}");
    for other in &outcomes[1..] {
        assert_eq!(*other, Seen::Replayed(stored(201, 1)), "{outcomes:?}");
    }
    // The first answers 425 (released): one waiter acquires and runs.
    let effects = Arc::new(Effects::default());
    let (first, second) = {
        let (r1, e1, i1) = (runner.clone(), Arc::clone(&effects), intent("w-2", 7));
        let (r2, e2, i2) = (runner.clone(), Arc::clone(&effects), intent("w-2", 7));
        let first =
            tokio::spawn(
                async move { seen(&r1.run(&i1, |_| e1.run(Answer::Status(425), hold)).await) },
            );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let second = tokio::spawn(async move {
            seen(
                &r2.run(&i2, |_| e2.run(Answer::Status(201), Duration::ZERO))
                    .await,
            )
        });
        (first.await.unwrap(), second.await.unwrap())
    };
    assert_eq!((first, effects.runs()), (Seen::Released, 2));
    assert_eq!(second, Seen::Executed(stored(201, 2)));
    // A wait shorter than the effect: handed back in flight, as without one.
    let short = h.runner().with_wait(Duration::from_millis(100));
    let effects = Arc::new(Effects::default());
    let (r1, e1, i1) = (short.clone(), Arc::clone(&effects), intent("w-3", 7));
    let first =
        tokio::spawn(
            async move { seen(&r1.run(&i1, |_| e1.run(Answer::Status(201), hold)).await) },
        );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let later = deliver(&short, &effects, "w-3", 7, Answer::Status(201)).await;
    assert_eq!(seen(&later), Seen::InFlight);
    assert_eq!(first.await.unwrap(), Seen::Executed(stored(201, 1)));
}

/// `deliveries` concurrent deliveries of one intent, the effect holding
/// for `hold`, then one more once they are all done; returns what each
/// saw, the effect's runs and the most effects that ran at once.
pub async fn concurrently(
    h: &Harness,
    key: &str,
    deliveries: usize,
    answer: Answer,
    hold: Duration,
) -> (Vec<Seen>, usize, usize) {
    let (runner, effects) = (h.runner(), Arc::new(Effects::default()));
    let tasks: Vec<_> = (0..deliveries)
        .map(|_| {
            let (runner, effects, intent) = (runner.clone(), Arc::clone(&effects), intent(key, 7));
            tokio::spawn(async move {
                let outcome = runner.run(&intent, |_| effects.run(answer, hold)).await;
                seen(&outcome)
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    let last = deliver(&runner, &effects, key, 7, answer).await;
    outcomes.push(seen(&last));
    (outcomes, effects.runs(), effects.max_running())
}

/// One delivery saw `first`; every other one saw it in flight, its replay
/// or its unknown outcome; the effect ran once.
pub fn check_concurrent((seen, runs, max_running): &(Vec<Seen>, usize, usize), first: &Seen) {
    assert_eq!(*runs, 1, "{seen:?}");
    assert_eq!(*max_running, 1, "{seen:?}");
    let firsts = seen.iter().filter(|s| *s == first).count();
    let others_ok = seen
        .iter()
        .filter(|s| *s != first)
        .all(|s| match (first, s) {
            (Seen::Executed(r), Seen::Replayed(again)) => r == again,
            (_, Seen::InFlight) => true,
            _ => false,
        });
    match first {
        // Every delivery after an unknown outcome sees it unknown too.
        Seen::Unknown => assert!(firsts >= 1 && others_ok, "{seen:?}"),
        _ => assert!(firsts == 1 && others_ok, "{seen:?}"),
    }
}

/// [`check_concurrent`] for an answer of `class`; a release lets each
/// later delivery run, one at a time, and every run is a release.
pub fn check_concurrent_class(seen: &(Vec<Seen>, usize, usize), answer: Answer, class: Class) {
    match (class, answer) {
        (Class::Final, Answer::Status(status)) => {
            check_concurrent(seen, &Seen::Executed(stored(status, 1)))
        }
        (Class::Unknown, _) => check_concurrent(seen, &Seen::Unknown),
        _ => {
            let (outcomes, runs, max_running) = seen;
            assert_eq!(*max_running, 1, "{outcomes:?}");
            let released = outcomes.iter().filter(|s| **s == Seen::Released).count();
            assert_eq!(*runs, released, "{outcomes:?}");
            assert!(
                outcomes
                    .iter()
                    .all(|s| matches!(s, Seen::Released | Seen::InFlight)),
                "{outcomes:?}"
            );
        }
    }
}

pub async fn a_key_past_retention_is_rejected_as_late(h: &Harness) {
    let (runner, effects) = (h.runner(), Effects::default());
    let done = deliver(&runner, &effects, "late", 1, Answer::Status(201)).await;
    assert_eq!(seen(&done), Seen::Executed(stored(201, 1)));
    h.clock.advance_millis(RETENTION_S * 1000);
    // The result is dropped, the tombstone kept: a redrive is caught,
    // whatever its payload.
    let purged = h.store.purge(1_000).await.unwrap();
    assert!(purged.tombstoned >= 1, "{purged:?}");
    assert_eq!(h.state("late").await, Some(State::Tombstone));
    for amount in [1, 2] {
        let redrive = deliver(&runner, &effects, "late", amount, Answer::Status(201)).await;
        assert_eq!(seen(&redrive), Seen::Late, "amount {amount}");
        let Outcome::Reject { reason } = &redrive else {
            unreachable!()
        };
        let done_at = START.as_millis();
        assert!(
            reason.to_string().starts_with(&format!(
                "key \"pay:late\" is past its retention (done at {done_at}"
            )),
            "{reason}"
        );
    }
    assert_eq!(effects.runs(), 1);
    // Past the tombstone's horizon the key is forgotten: a new intent.
    h.clock.advance_millis((TOMBSTONE_S - RETENTION_S) * 1000);
    let forgotten = deliver(&runner, &effects, "late", 1, Answer::Status(201)).await;
    assert_eq!(seen(&forgotten), Seen::Executed(stored(201, 2)));
}

// ---------------------------------------------------------------------
// A model of the contract for sequences of deliveries.

/// One delivery in a generated sequence: which intent (of a few), which
/// payload (of two), and what the effect answers if it runs.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    pub key: u8,
    pub amount: u8,
    pub answer: Answer,
}

/// The answers a model knows the class of, by the contract's table
/// (written out here, not asked of the code under test).
pub const ANSWERS: [(Answer, Class); 8] = [
    (Answer::Status(200), Class::Final),
    (Answer::Status(201), Class::Final),
    (Answer::Status(422), Class::Final),
    (Answer::Status(425), Class::Release),
    (Answer::Failed(AttemptOutcome::NotSent), Class::Release),
    (Answer::Status(500), Class::Unknown),
    (Answer::Status(503), Class::Unknown),
    (Answer::Failed(AttemptOutcome::Lost), Class::Unknown),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Final,
    Release,
    Unknown,
}

enum Kept {
    Done { amount: u8, result: StoredResult },
    Unknown { amount: u8 },
}

/// Delivers `steps` one after another and checks each outcome, and the
/// effect's runs, against the model.
pub async fn check_model(h: &Harness, prefix: &str, steps: &[Step]) {
    let (runner, effects) = (h.runner(), Effects::default());
    let mut kept: BTreeMap<u8, Kept> = BTreeMap::new();
    let mut runs = 0;
    for (i, step) in steps.iter().enumerate() {
        let key = format!("{prefix}-{}", step.key);
        let got = deliver(&runner, &effects, &key, step.amount.into(), step.answer).await;
        let expect = match kept.get(&step.key) {
            None => {
                runs += 1;
                let class = ANSWERS
                    .iter()
                    .find(|(a, _)| *a == step.answer)
                    .map(|(_, c)| *c)
                    .unwrap();
                match (class, step.answer) {
                    (Class::Final, Answer::Status(status)) => {
                        let result = stored(status, runs);
                        let amount = step.amount;
                        kept.insert(
                            step.key,
                            Kept::Done {
                                amount,
                                result: result.clone(),
                            },
                        );
                        Seen::Executed(result)
                    }
                    (Class::Unknown, _) => {
                        kept.insert(
                            step.key,
                            Kept::Unknown {
                                amount: step.amount,
                            },
                        );
                        Seen::Unknown
                    }
                    _ => Seen::Released,
                }
            }
            Some(Kept::Done { amount, result }) if *amount == step.amount => {
                Seen::Replayed(result.clone())
            }
            Some(Kept::Unknown { amount }) if *amount == step.amount => Seen::Unknown,
            Some(_) => Seen::KeyReused,
        };
        assert_eq!(seen(&got), expect, "step {i} of {steps:?}");
        assert_eq!(effects.runs(), runs, "step {i} of {steps:?}");
    }
}

// ---------------------------------------------------------------------
// A store that fails on demand.

/// Wraps a real store; while `fail_claims` is set every claim fails, while
/// `fail_writes` is set every complete, release and mark fails, as a store
/// that went away would.
pub struct Faulty {
    inner: Arc<dyn Store>,
    pub fail_claims: AtomicBool,
    pub fail_writes: AtomicBool,
}

impl Faulty {
    pub fn new(inner: Arc<dyn Store>) -> Faulty {
        Faulty {
            inner,
            fail_claims: AtomicBool::new(false),
            fail_writes: AtomicBool::new(false),
        }
    }

    fn down<'a, T: Send + 'a>(&self) -> StoreFuture<'a, T> {
        Box::pin(std::future::ready(Err(StoreError::Unavailable {
            store: "faulty".into(),
            reason: "switched off by the test".into(),
        })))
    }
}

impl StoreWrapper for Faulty {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, Claim> {
        match self.fail_claims.load(Ordering::SeqCst) {
            true => self.down(),
            false => self.inner.claim(req),
        }
    }

    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        result: StoredResult,
    ) -> StoreFuture<'a, Record> {
        match self.fail_writes.load(Ordering::SeqCst) {
            true => self.down(),
            false => self.inner.complete(id, token, result),
        }
    }

    fn release<'a>(&'a self, id: &'a RecordId, token: Token) -> StoreFuture<'a, ()> {
        match self.fail_writes.load(Ordering::SeqCst) {
            true => self.down(),
            false => self.inner.release(id, token),
        }
    }

    fn mark_ambiguous<'a>(&'a self, id: &'a RecordId, token: Token) -> StoreFuture<'a, Record> {
        match self.fail_writes.load(Ordering::SeqCst) {
            true => self.down(),
            false => self.inner.mark_ambiguous(id, token),
        }
    }
}
