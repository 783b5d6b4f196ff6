//! Failed lookups are counted in the store, not in a reconciler's memory:
//! separate reconcilers over the same SQLite file (cron runs of `idem
//! reconcile --once`, or a gateway restarted between scans) together give
//! up after `max_tries`, and never ask the provider again afterwards.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::State as AxumState;
use axum::http::StatusCode;
use idem_core::{
    Claim, ClaimRequest, Fingerprint, IdempotencyKey, ManualClock, Outcome, Policy, RecordId,
    Resolution, Scope, State, Store, StoredResult, Timestamp,
};
use idem_reconcile::{
    ForwardedKey, Lookup, LookupSpec, ReconcileReport, ReconcileSettings, ReconcileSpec, Reconciler,
};
use idem_sqlite::{SqliteOptions, SqliteStore};

const OPERATION: &str = "payouts";

/// A provider whose lookup answers `status` and counts the questions.
struct Provider {
    hits: Arc<AtomicUsize>,
    status: Arc<AtomicUsize>,
    url: String,
}

impl Provider {
    async fn start(status: u16) -> Provider {
        let hits = Arc::new(AtomicUsize::new(0));
        let answer = Arc::new(AtomicUsize::new(usize::from(status)));
        let shared = (Arc::clone(&hits), Arc::clone(&answer));
        let app =
            axum::Router::new()
                .route(
                    "/payouts/by-key/{key}",
                    axum::routing::get(
                        |AxumState((hits, status)): AxumState<(
                            Arc<AtomicUsize>,
                            Arc<AtomicUsize>,
                        )>| async move {
                            hits.fetch_add(1, Ordering::SeqCst);
                            let status = u16::try_from(status.load(Ordering::SeqCst)).unwrap();
                            (StatusCode::from_u16(status).unwrap(), "{}")
                        },
                    ),
                )
                .with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/payouts/by-key/{{forwarded_key}}",
            listener.local_addr().unwrap()
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        Provider {
            hits,
            status: answer,
            url,
        }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    fn answer(&self, status: u16) {
        self.status.store(usize::from(status), Ordering::SeqCst);
    }
}

fn claim_request(key: &str) -> ClaimRequest {
    ClaimRequest {
        id: RecordId {
            scope: Scope::from_parts(OPERATION, "tenant-1", None).unwrap(),
            key: IdempotencyKey::parse(key).unwrap(),
        },
        fingerprint: Fingerprint::from_bytes([1; 32]),
        legacy_fingerprint: None,
        owner: "gateway-1".into(),
        region: None,
        policy: Policy::DEFAULT,
    }
}

/// Claims `key` and marks the attempt ambiguous, as a gateway does after a
/// 502; returns its id.
async fn ambiguous(store: &dyn Store, key: &str) -> RecordId {
    let request = claim_request(key);
    let Claim::Acquired { token, .. } = store.claim(&request).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    store.mark_ambiguous(&request.id, token).await.unwrap();
    request.id
}

/// A reconciler as a fresh process builds one: nothing remembered.
fn reconciler(store: Arc<dyn Store>, clock: &ManualClock, url: &str, max_tries: u32) -> Reconciler {
    // The gateway forwards the key as it is in these tests.
    let forwarded: ForwardedKey = Arc::new(|id: &RecordId| id.key.as_str().to_owned());
    let spec = LookupSpec {
        url: Some(url.to_owned()),
        timeout_ms: Some(500),
        connect_timeout_ms: Some(200),
        ..Default::default()
    };
    let lookup = Lookup::new(&spec, forwarded).unwrap();
    let settings = ReconcileSettings::new(&ReconcileSpec {
        max_tries: Some(max_tries),
        backoff_ms: Some(1_000),
        backoff_max_ms: Some(1_000),
        rate_per_s: Some(1_000),
        seed: Some(7),
        ..Default::default()
    })
    .unwrap();
    let lookups = vec![(OPERATION.to_owned(), lookup)];
    Reconciler::new(store, lookups, settings, Arc::new(clock.clone())).unwrap()
}

fn open(path: &std::path::Path, clock: &ManualClock) -> Arc<dyn Store> {
    let store =
        SqliteStore::open_with_clock(path, SqliteOptions::default(), Arc::new(clock.clone()));
    Arc::new(store.unwrap())
}

fn report(f: impl FnOnce(&mut ReconcileReport)) -> ReconcileReport {
    let mut r = ReconcileReport {
        scanned: 1,
        ..Default::default()
    };
    f(&mut r);
    r
}

/// Each run is a new reconciler over a reopened store, the backoff over
/// between runs: the first two runs count a failure each, the third gives
/// up, and every later run reports the record as left for an operator
/// without asking the provider, however much later it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cron_runs_share_one_count_and_give_up_after_max_tries() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let provider = Provider::start(503).await;
    let id = ambiguous(&*open(&path, &clock), "payout-cron").await;
    let runs: [(u64, ReconcileReport, usize); 5] = [
        (0, report(|r| r.retried = 1), 1),
        (1_000, report(|r| r.retried = 1), 2),
        (1_000, report(|r| r.gave_up = 1), 3),
        (1_000, report(|r| r.gave_up = 1), 3),
        (86_400_000, report(|r| r.gave_up = 1), 3),
    ];
    for (run, (advance_ms, want, hits)) in runs.into_iter().enumerate() {
        clock.advance_millis(advance_ms);
        let store = open(&path, &clock);
        let got = reconciler(store, &clock, &provider.url, 3).run_once().await;
        assert_eq!(got, want, "run {run}: {got}");
        assert_eq!(provider.hits(), hits, "run {run}: questions asked");
    }
    let record = open(&path, &clock).get(&id).await.unwrap().unwrap();
    assert_eq!(record.state, State::Ambiguous, "left for an operator");
}

/// A run within the backoff of the previous run's failure waits, even in a
/// new process: the next lookup's time is stored with the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backoff_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let provider = Provider::start(503).await;
    ambiguous(&*open(&path, &clock), "payout-wait").await;
    let first = reconciler(open(&path, &clock), &clock, &provider.url, 5);
    assert_eq!(first.run_once().await, report(|r| r.retried = 1));
    let second = reconciler(open(&path, &clock), &clock, &provider.url, 5);
    assert_eq!(second.run_once().await, report(|r| r.waiting = 1));
    assert_eq!(provider.hits(), 1, "no question within the backoff");
}

/// A count belongs to one attempt: after an operator settles the attempt
/// that used up its tries, a new ambiguous attempt of the same key is
/// looked up again with a full set of tries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_attempt_of_the_key_starts_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let provider = Provider::start(503).await;
    let store = open(&path, &clock);
    let id = ambiguous(&*store, "payout-again").await;
    let once = || reconciler(open(&path, &clock), &clock, &provider.url, 1);
    assert_eq!(once().run_once().await, report(|r| r.gave_up = 1));
    assert_eq!(once().run_once().await, report(|r| r.gave_up = 1));
    assert_eq!(provider.hits(), 1);

    let first = store.get(&id).await.unwrap().unwrap();
    clock.set(first.lease_until);
    let released = Resolution::new(Outcome::NotExecuted, "operator", "not in the ledger");
    store
        .resolve(&id, first.token, released.unwrap())
        .await
        .unwrap();
    ambiguous(&*store, "payout-again").await;
    provider.answer(200);
    assert_eq!(once().run_once().await, report(|r| r.completed = 1));
    assert_eq!(provider.hits(), 2, "the new attempt was asked about");
    let done = store.get(&id).await.unwrap().unwrap();
    let body = done.result.as_ref().map(StoredResult::body);
    assert_eq!((done.state, body), (State::Completed, Some(&b"{}"[..])));
}
