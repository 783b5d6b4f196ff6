//! The reconciler against real parts: an in-process provider over HTTP on
//! 127.0.0.1, a SQLite store on a temporary file, and a manual clock for
//! every backoff. Only the HTTP timeouts run in real time, and they are short.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State as AxumState};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use idem_core::{
    Claim, ClaimRequest, Fingerprint, IdempotencyKey, ManualClock, Outcome, Policy, RecordId,
    Resolution, Scope, State, Store, StoredResult, Timestamp,
};
use idem_reconcile::{
    ForwardedKey, Lookup, LookupSpec, RESOLVED_BY, ReconcileReport, ReconcileSettings,
    ReconcileSpec, Reconciler, Settled, asked_by,
};
use idem_sqlite::{SqliteOptions, SqliteStore};

/// What the provider does when asked about one key (default: 404).
#[derive(Clone)]
enum Behavior {
    Answer(u16, &'static str),
    /// 200 with a body over the stored-result limit.
    Huge,
    /// Never answers.
    Hang,
    /// An operator resolves the record as completed first, then 200.
    OperatorFirst(Arc<dyn Store>, RecordId),
    /// While the provider is being asked about the attempt, an operator
    /// releases it (its lease over), the client's retry claims the key and
    /// is lost too; then the provider answers 200 about the first attempt.
    ReleasedAndRetried(Arc<dyn Store>, ManualClock, RecordId),
    /// A slow "not found": asked while the attempt's lease runs, answered
    /// once it has ended (the clock is moved to `lease_until` first).
    SlowNotFound(ManualClock, idem_core::Timestamp),
}

#[derive(Default)]
struct Provider {
    behavior: Mutex<HashMap<String, Behavior>>,
    /// Time each answer takes, to make overlapping lookups visible.
    latency: Mutex<Duration>,
    hits: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    arrivals: Mutex<Vec<Instant>>,
    authorization: Mutex<Vec<String>>,
}

struct Harness {
    _dir: tempfile::TempDir,
    clock: ManualClock,
    store: Arc<SqliteStore>,
    provider: Arc<Provider>,
    /// `http://127.0.0.1:PORT`
    base: String,
}

const OPERATION: &str = "payouts";
/// The `Location` every provider answer carries: not UTF-8.
const LOCATION: &[u8] = b"/payouts/p-847-caf\xe9";
const FINGERPRINT: [u8; 32] = [1; 32];

impl Harness {
    async fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
        let store = SqliteStore::open_with_clock(
            dir.path().join("idem.db"),
            SqliteOptions::default(),
            Arc::new(clock.clone()),
        )
        .unwrap();
        let provider = Arc::new(Provider::default());
        let app = axum::Router::new()
            .route("/payouts/by-key/{key}", axum::routing::get(lookup))
            .with_state(Arc::clone(&provider));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Harness {
            _dir: dir,
            clock,
            store: Arc::new(store),
            provider,
            base,
        }
    }

    fn answer(&self, key: &str, behavior: Behavior) {
        self.provider
            .behavior
            .lock()
            .unwrap()
            .insert(key.to_owned(), behavior);
    }

    /// A record left ambiguous by an attempt on `operation`: claimed, then
    /// marked ambiguous as the gateway does after a 502 or a timeout.
    async fn ambiguous(&self, operation: &str, key: &str) -> RecordId {
        let request = claim_request(operation, key);
        let Claim::Acquired { token, .. } = self.store.claim(&request).await.unwrap() else {
            panic!("a fresh key is acquired");
        };
        self.store.mark_ambiguous(&request.id, token).await.unwrap();
        request.id
    }

    /// `n` ambiguous records `{prefix}{i}` that the provider has found.
    async fn found_records(&self, prefix: &str, n: usize) {
        for i in 0..n {
            let key = format!("{prefix}{i}");
            self.answer(&key, Behavior::Answer(200, "{}"));
            self.ambiguous(OPERATION, &key).await;
        }
    }

    fn lookup_url(&self) -> String {
        format!("{}/payouts/by-key/{{forwarded_key}}", self.base)
    }

    fn reconciler(&self, settings: ReconcileSpec, url: &str) -> Reconciler {
        let lookup = Lookup::new(
            &LookupSpec {
                url: Some(url.to_owned()),
                headers: Some(vec![("authorization".into(), "Bearer lookup".into())]),
                timeout_ms: Some(300),
                connect_timeout_ms: Some(200),
                ..Default::default()
            },
            forwarded_as_is(),
        )
        .unwrap();
        let settings = ReconcileSettings::new(&ReconcileSpec {
            seed: Some(7),
            rate_per_s: settings.rate_per_s.or(Some(1_000)),
            ..settings
        })
        .unwrap();
        let store: Arc<dyn Store> = self.store.clone();
        Reconciler::new(
            store,
            vec![(OPERATION.to_owned(), lookup)],
            settings,
            Arc::new(self.clock.clone()),
        )
        .unwrap()
    }

    fn hits(&self) -> usize {
        self.provider.hits.load(Ordering::SeqCst)
    }
}

/// The key forwarded as it came, as a route with the default template
/// does; the provider here knows each effect by that key.
fn forwarded_as_is() -> ForwardedKey {
    Arc::new(|id: &RecordId| id.key.as_str().to_owned())
}

fn claim_request(operation: &str, key: &str) -> ClaimRequest {
    ClaimRequest {
        id: RecordId {
            scope: Scope::from_parts(operation, "tenant-1", None).unwrap(),
            key: IdempotencyKey::parse(key).unwrap(),
        },
        fingerprint: Fingerprint::from_bytes(FINGERPRINT),
        legacy_fingerprint: None,
        owner: "gateway-1".into(),
        region: None,
        policy: Policy::DEFAULT,
    }
}

async fn lookup(
    AxumState(provider): AxumState<Arc<Provider>>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    provider.hits.fetch_add(1, Ordering::SeqCst);
    provider.arrivals.lock().unwrap().push(Instant::now());
    if let Some(auth) = headers.get("authorization") {
        let auth = auth.to_str().unwrap_or_default().to_owned();
        provider.authorization.lock().unwrap().push(auth);
    }
    let now = provider.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    provider.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let latency = *provider.latency.lock().unwrap();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    provider.in_flight.fetch_sub(1, Ordering::SeqCst);
    let behavior = provider.behavior.lock().unwrap().get(&key).cloned();
    match behavior {
        None => StatusCode::NOT_FOUND.into_response(),
        Some(Behavior::Answer(status, body)) => {
            let mut answer = (
                StatusCode::from_u16(status).unwrap(),
                [
                    ("content-type", "application/json"),
                    ("x-internal", "dropped"),
                ],
                body,
            )
                .into_response();
            // A value that is not UTF-8 (obs-text): kept as the bytes sent.
            let location = HeaderValue::from_bytes(LOCATION).unwrap();
            answer.headers_mut().insert("location", location);
            answer
        }
        Some(Behavior::Huge) => vec![b'x'; 2 * 1024 * 1024].into_response(),
        Some(Behavior::Hang) => std::future::pending().await,
        Some(Behavior::OperatorFirst(store, id)) => {
            let result = StoredResult::new(201, vec![], b"by hand".to_vec()).unwrap();
            let by_hand =
                Resolution::new(Outcome::Completed { result }, "operator", "checked").unwrap();
            let token = store.get(&id).await.unwrap().unwrap().token;
            store.resolve(&id, token, by_hand).await.unwrap();
            (StatusCode::OK, "{}").into_response()
        }
        Some(Behavior::SlowNotFound(clock, lease_until)) => {
            clock.set(lease_until);
            StatusCode::NOT_FOUND.into_response()
        }
        Some(Behavior::ReleasedAndRetried(store, clock, id)) => {
            let first = store.get(&id).await.unwrap().unwrap();
            clock.set(first.lease_until);
            let released = Resolution::new(Outcome::NotExecuted, "operator", "not in the ledger");
            let got = store.resolve(&id, first.token, released.unwrap()).await;
            assert_eq!(got, Ok(None), "the operator releases the first attempt");
            let retry = claim_request(OPERATION, id.key.as_str());
            let Claim::Acquired { token, .. } = store.claim(&retry).await.unwrap() else {
                panic!("the retry acquires");
            };
            store.mark_ambiguous(&id, token).await.unwrap();
            (StatusCode::OK, "{\"paid\":\"first attempt\"}").into_response()
        }
    }
}

fn report(scanned: u64, f: impl FnOnce(&mut ReconcileReport)) -> ReconcileReport {
    let mut r = ReconcileReport {
        scanned,
        ..Default::default()
    };
    f(&mut r);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn found_completes_with_the_providers_answer() {
    let h = Harness::new().await;
    // The key needs percent-encoding in the lookup URL.
    let key = "payout/847?x=1&y";
    h.answer(key, Behavior::Answer(200, r#"{"payout":"p-847"}"#));
    let id = h.ambiguous(OPERATION, key).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let hook_seen = Arc::clone(&seen);
    let reconciler = h
        .reconciler(ReconcileSpec::default(), &h.lookup_url())
        .with_on_resolution(Arc::new(move |by: &str, outcome: &str| {
            hook_seen
                .lock()
                .unwrap()
                .push((by.to_owned(), outcome.to_owned()));
        }));

    let got = reconciler.run_once().await;

    assert_eq!(got, report(1, |r| r.completed = 1), "{got}");
    let record = h.store.get(&id).await.unwrap().unwrap();
    assert_eq!(record.state, State::Completed);
    let result = record.result.unwrap();
    assert_eq!(result.status(), 200);
    assert_eq!(result.body(), br#"{"payout":"p-847"}"#);
    assert_eq!(
        result.headers(),
        &[
            ("content-type".to_owned(), "application/json".into()),
            ("location".to_owned(), LOCATION.into()),
        ]
    );
    let resolution = record.resolution.unwrap();
    assert_eq!(resolution.by, RESOLVED_BY);
    assert!(matches!(resolution.outcome, Outcome::Completed { .. }));
    assert!(
        resolution
            .reason
            .starts_with("lookup GET http://127.0.0.1:")
            && resolution.reason.ends_with("answered 200"),
        "{}",
        resolution.reason
    );
    assert_eq!(
        *seen.lock().unwrap(),
        vec![("reconciler".to_owned(), "completed".to_owned())]
    );
    assert_eq!(
        *h.provider.authorization.lock().unwrap(),
        vec!["Bearer lookup"]
    );
    // The retry the client was waiting to send now replays the provider's answer.
    let replay = h.store.claim(&claim_request(OPERATION, key)).await.unwrap();
    assert!(matches!(replay, Claim::Replay { .. }), "{replay:?}");
    // Nothing is left to do, and nothing is asked again.
    assert_eq!(reconciler.run_once().await, report(0, |_| {}));
    assert_eq!(h.hits(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_releases_the_key_for_a_retry() {
    let h = Harness::new().await;
    let id = h.ambiguous(OPERATION, "payout-1").await;
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let hook_outcomes = Arc::clone(&outcomes);
    let reconciler = h
        .reconciler(ReconcileSpec::default(), &h.lookup_url())
        .with_on_resolution(Arc::new(move |_: &str, outcome: &str| {
            hook_outcomes.lock().unwrap().push(outcome.to_owned());
        }));

    // The provider has not seen it, but the attempt's lease still runs: the
    // request may yet reach the provider, so "not found" proves nothing.
    let held = h.store.get(&id).await.unwrap().unwrap();
    assert_eq!(reconciler.run_once().await, report(1, |r| r.waiting = 1));
    assert_eq!(h.store.get(&id).await.unwrap().as_ref(), Some(&held));
    assert_eq!(h.hits(), 1);
    h.clock.set(held.lease_until);
    assert_eq!(reconciler.run_once().await, report(1, |r| r.released = 1));

    assert_eq!(h.store.get(&id).await.unwrap(), None);
    let retry = h
        .store
        .claim(&claim_request(OPERATION, "payout-1"))
        .await
        .unwrap();
    assert!(matches!(retry, Claim::Acquired { .. }), "{retry:?}");
    assert_eq!(*outcomes.lock().unwrap(), vec!["not_executed"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_down_backs_off_then_leaves_the_record_for_an_operator() {
    let h = Harness::new().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://{}/payouts/by-key/{{forwarded_key}}",
        closed.local_addr().unwrap()
    );
    drop(closed);
    let id = h.ambiguous(OPERATION, "payout-2").await;
    let settings = ReconcileSpec {
        max_tries: Some(3),
        backoff_ms: Some(1_000),
        backoff_max_ms: Some(1_000),
        ..Default::default()
    };
    let reconciler = h.reconciler(settings, &url);

    let steps: [(u64, ReconcileReport); 7] = [
        (0, report(1, |r| r.retried = 1)),
        (0, report(1, |r| r.waiting = 1)), // the backoff has not elapsed
        (1_000, report(1, |r| r.retried = 1)),
        (0, report(1, |r| r.waiting = 1)),
        (1_000, report(1, |r| r.gave_up = 1)), // third failure: max_tries
        (1_000, report(1, |r| r.gave_up = 1)), // and never tried again
        (3_600_000, report(1, |r| r.gave_up = 1)),
    ];
    for (n, (advance_ms, want)) in steps.into_iter().enumerate() {
        h.clock.advance_millis(advance_ms);
        let got = reconciler.run_once().await;
        assert_eq!(got, want, "step {n}: {got}");
    }
    let record = h.store.get(&id).await.unwrap().unwrap();
    assert_eq!(record.state, State::Ambiguous);
    assert_eq!(record.resolution, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_errors_are_retried_and_counted() {
    let h = Harness::new().await;
    h.answer("payout-500", Behavior::Answer(500, "oops"));
    h.answer("payout-slow", Behavior::Hang);
    h.answer("payout-huge", Behavior::Huge);
    for key in ["payout-500", "payout-slow", "payout-huge"] {
        h.ambiguous(OPERATION, key).await;
    }
    let settings = ReconcileSpec {
        max_tries: Some(2),
        backoff_ms: Some(10),
        backoff_max_ms: Some(10),
        ..Default::default()
    };
    let reconciler = h.reconciler(settings, &h.lookup_url());

    assert_eq!(reconciler.run_once().await, report(3, |r| r.retried = 3));
    assert_eq!(h.hits(), 3);
    h.clock.advance_millis(10);
    assert_eq!(reconciler.run_once().await, report(3, |r| r.gave_up = 3));
    assert_eq!(h.hits(), 6);
    h.clock.advance_millis(60_000);
    assert_eq!(reconciler.run_once().await, report(3, |r| r.gave_up = 3));
    assert_eq!(
        h.hits(),
        6,
        "a record left for an operator is not asked again"
    );
    let ambiguous = h
        .store
        .list(&idem_core::ListQuery {
            state: Some(State::Ambiguous),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(ambiguous.records.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_without_a_lookup_makes_no_request() {
    let h = Harness::new().await;
    let id = h.ambiguous("refunds", "refund-1").await;
    let reconciler = h.reconciler(ReconcileSpec::default(), &h.lookup_url());

    for _ in 0..2 {
        assert_eq!(reconciler.run_once().await, report(1, |r| r.no_lookup = 1));
    }
    assert_eq!(h.hits(), 0);
    assert_eq!(
        h.store.get(&id).await.unwrap().map(|r| r.state),
        Some(State::Ambiguous)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_is_bounded() {
    let h = Harness::new().await;
    *h.provider.latency.lock().unwrap() = Duration::from_millis(50);
    h.found_records("payout-c", 6).await;
    let settings = ReconcileSpec {
        concurrency: Some(2),
        ..Default::default()
    };
    let reconciler = h.reconciler(settings, &h.lookup_url());

    assert_eq!(reconciler.run_once().await, report(6, |r| r.completed = 6));
    assert_eq!(h.provider.max_in_flight.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_is_bounded() {
    let h = Harness::new().await;
    h.found_records("payout-r", 5).await;
    let settings = ReconcileSpec {
        rate_per_s: Some(20), // one start every 50 ms
        concurrency: Some(8),
        ..Default::default()
    };
    let reconciler = h.reconciler(settings, &h.lookup_url());

    assert_eq!(reconciler.run_once().await, report(5, |r| r.completed = 5));
    let arrivals = h.provider.arrivals.lock().unwrap().clone();
    assert_eq!(arrivals.len(), 5);
    let span = arrivals[4].duration_since(arrivals[0]);
    // Four gaps of 50 ms; without pacing the five arrive within a few ms.
    assert!(span >= Duration::from_millis(150), "{span:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_resolved_meanwhile_is_skipped_without_error() {
    let h = Harness::new().await;
    let id = h.ambiguous(OPERATION, "payout-3").await;
    let store: Arc<dyn Store> = h.store.clone();
    h.answer("payout-3", Behavior::OperatorFirst(store, id.clone()));
    let reconciler = h.reconciler(ReconcileSpec::default(), &h.lookup_url());

    let got = reconciler.run_once().await;

    assert_eq!(got, report(1, |r| r.resolved_elsewhere = 1), "{got}");
    let record = h.store.get(&id).await.unwrap().unwrap();
    assert_eq!(record.resolution.map(|r| r.by), Some("operator".to_owned()));
    assert_eq!(
        record.result.map(|r| r.body().to_vec()),
        Some(b"by hand".to_vec())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scans_page_through_every_record() {
    let h = Harness::new().await;
    h.found_records("payout-p", 5).await;
    h.ambiguous("refunds", "refund-p").await; // sorts after every payout
    let settings = ReconcileSpec {
        batch: Some(2),
        ..Default::default()
    };
    let reconciler = h.reconciler(settings, &h.lookup_url());

    let scans: Vec<ReconcileReport> = [
        report(2, |r| r.completed = 2),
        report(2, |r| r.completed = 2),
        report(2, |r| {
            r.completed = 1;
            r.no_lookup = 1;
        }),
        report(1, |r| r.no_lookup = 1), // a short page ends the pass
        report(1, |r| r.no_lookup = 1),
    ]
    .into();
    for (n, want) in scans.into_iter().enumerate() {
        assert_eq!(reconciler.run_once().await, want, "scan {n}");
    }
    assert_eq!(h.hits(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_ambiguity_of_the_same_key_starts_with_fresh_tries() {
    let h = Harness::new().await;
    h.answer("payout-4", Behavior::Answer(503, ""));
    h.ambiguous(OPERATION, "payout-4").await;
    let settings = ReconcileSpec {
        max_tries: Some(1),
        ..Default::default()
    };
    let reconciler = h.reconciler(settings, &h.lookup_url());
    assert_eq!(reconciler.run_once().await, report(1, |r| r.gave_up = 1));

    // An operator releases it; the client's retry runs and is lost again.
    let released = Resolution::new(Outcome::NotExecuted, "operator", "checked").unwrap();
    let id = claim_request(OPERATION, "payout-4").id;
    let first = h.store.get(&id).await.unwrap().unwrap();
    h.clock.set(first.lease_until);
    h.store.resolve(&id, first.token, released).await.unwrap();
    h.ambiguous(OPERATION, "payout-4").await;
    h.answer("payout-4", Behavior::Answer(404, ""));
    let second = h.store.get(&id).await.unwrap().unwrap();
    h.clock.set(second.lease_until);

    assert_eq!(reconciler.run_once().await, report(1, |r| r.released = 1));
    assert_eq!(h.hits(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_scans_until_shutdown() {
    let h = Harness::new().await;
    h.answer("payout-5", Behavior::Answer(200, "{}"));
    let id = h.ambiguous(OPERATION, "payout-5").await;
    let (resolved_tx, resolved_rx) = tokio::sync::oneshot::channel::<()>();
    let resolved_tx = Mutex::new(Some(resolved_tx));
    let reconciler = h
        .reconciler(ReconcileSpec::default(), &h.lookup_url())
        .with_on_resolution(Arc::new(move |_: &str, _: &str| {
            if let Some(tx) = resolved_tx.lock().unwrap().take() {
                let _ = tx.send(());
            }
        }));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        reconciler
            .run(async move {
                let _ = stop_rx.await;
            })
            .await
    });

    tokio::time::timeout(Duration::from_secs(10), resolved_rx)
        .await
        .unwrap()
        .unwrap();
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        h.store.get(&id).await.unwrap().map(|r| r.state),
        Some(State::Completed)
    );
}

#[test]
fn operations_are_checked() {
    let lookup = || {
        Lookup::new(
            &LookupSpec {
                url: Some("http://127.0.0.1:1/{forwarded_key}".into()),
                ..Default::default()
            },
            forwarded_as_is(),
        )
        .unwrap()
    };
    let store: Arc<dyn Store> = Arc::new(idem_core::MemoryStore::new(Arc::new(ManualClock::new(
        Timestamp::from_millis(0),
    ))));
    let cases: Vec<(Vec<&str>, bool)> = vec![
        (vec!["payouts", "refunds"], true),
        (vec!["payouts", "payouts"], false),
        (vec![""], false),
        (vec!["a|b"], false),
    ];
    for (operations, ok) in cases {
        let lookups = operations
            .iter()
            .map(|o| (o.to_string(), lookup()))
            .collect();
        let built = Reconciler::new(
            Arc::clone(&store),
            lookups,
            ReconcileSettings::default(),
            Arc::new(idem_core::SystemClock),
        );
        assert_eq!(built.is_ok(), ok, "{operations:?}");
        if let Err(e) = built {
            assert_eq!(e.field, "lookup");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_without_a_retry_is_still_reconciled() {
    let h = Harness::new().await;
    h.answer("orphan", Behavior::Answer(200, "{\"paid\":true}"));
    // A gateway claimed, forwarded, and died: no retry ever comes.
    let request = claim_request(OPERATION, "orphan");
    let Claim::Acquired { token, .. } = h.store.claim(&request).await.unwrap() else {
        panic!("fresh key");
    };
    let other = claim_request("refunds", "orphan-2");
    h.store.claim(&other).await.unwrap();
    let reconciler = h.reconciler(ReconcileSpec::default(), &h.lookup_url());

    // Within the lease nothing happens.
    assert_eq!(reconciler.run_once().await, report(0, |_| {}));
    assert_eq!(h.hits(), 0);

    h.clock.advance_millis(Policy::DEFAULT.lease_ms());
    let got = reconciler.run_once().await;
    assert_eq!(
        got,
        report(1, |r| {
            r.expired_leases = 1;
            r.completed = 1;
        })
    );
    let record = h.store.get(&request.id).await.unwrap().unwrap();
    assert_eq!(record.state, State::Completed);
    assert_eq!(
        record.result.map(|r| r.body().to_vec()),
        Some(b"{\"paid\":true}".to_vec())
    );
    // The zombie attempt is fenced; the route without a lookup is left alone.
    assert!(
        h.store
            .complete(
                &request.id,
                token,
                StoredResult::new(201, vec![], vec![]).unwrap()
            )
            .await
            .is_err()
    );
    assert_eq!(
        h.store.get(&other.id).await.unwrap().unwrap().state,
        State::InProgress
    );
}

/// Two reconcilers and an operator on one key: a verdict reached about one
/// attempt never lands on a later attempt of the same key. While the first
/// reconciler asks the provider about attempt 1, an operator releases
/// attempt 1 and the client's retry (attempt 2) is lost too. The provider's
/// late "found" about attempt 1 is refused; attempt 2 stays ambiguous until
/// a second reconciler settles it by its own lookup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_verdict_never_lands_on_a_later_attempt() {
    let h = Harness::new().await;
    let id = h.ambiguous(OPERATION, "payout-9").await;
    let first = h.store.get(&id).await.unwrap().unwrap();
    let store: Arc<dyn Store> = h.store.clone();
    let race = Behavior::ReleasedAndRetried(store, h.clock.clone(), id.clone());
    h.answer("payout-9", race);
    let one = h.reconciler(ReconcileSpec::default(), &h.lookup_url());

    let got = one.run_once().await;

    assert_eq!(got, report(1, |r| r.resolved_elsewhere = 1), "{got}");
    let second = h.store.get(&id).await.unwrap().unwrap();
    assert!(second.token > first.token);
    assert_eq!(second.state, State::Ambiguous, "attempt 2 is not settled");
    assert_eq!(second.result, None, "attempt 1's answer is not replayed");
    let journal = h.store.resolutions(&id).await.unwrap();
    let entries: Vec<_> = journal.iter().map(|e| (e.token, e.by.as_str())).collect();
    assert_eq!(entries, [(first.token, "operator")]);

    h.answer("payout-9", Behavior::Answer(404, ""));
    h.clock.set(second.lease_until);
    let two = h.reconciler(ReconcileSpec::default(), &h.lookup_url());
    assert_eq!(two.run_once().await, report(1, |r| r.released = 1));
    let journal = h.store.resolutions(&id).await.unwrap();
    let entries: Vec<_> = journal.iter().map(|e| (e.token, e.by.as_str())).collect();
    assert_eq!(
        entries,
        [(first.token, "operator"), (second.token, RESOLVED_BY)]
    );
}

/// A "not found" proves nothing when it was asked while the attempt could
/// still commit, even if it arrives after the lease: the request may have
/// reached the provider after the provider answered. Found by the model
/// checker (`lookup-during-lease` in crates/idem-model): the store's own
/// check, judged when the verdict lands, let such a slow answer release the
/// key. The record waits, and the lookup asked after the lease decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_not_found_asked_during_the_lease_never_releases() {
    let h = Harness::new().await;
    let id = h.ambiguous(OPERATION, "payout-slow").await;
    let held = h.store.get(&id).await.unwrap().unwrap();
    let slow = Behavior::SlowNotFound(h.clock.clone(), held.lease_until);
    h.answer("payout-slow", slow);
    let reconciler = h.reconciler(ReconcileSpec::default(), &h.lookup_url());

    let got = reconciler.run_once().await;

    assert_eq!(got, report(1, |r| r.waiting = 1), "{got}");
    assert_eq!(h.store.get(&id).await.unwrap().as_ref(), Some(&held));
    h.answer("payout-slow", Behavior::Answer(404, ""));
    assert_eq!(reconciler.run_once().await, report(1, |r| r.released = 1));
    assert_eq!(h.store.get(&id).await.unwrap(), None);
    assert_eq!(h.hits(), 2);
}

/// Settling a record now on someone's request journals the resolution by
/// who asked, `reconciler (asked by …)`; settling it now for a retry
/// journals it by the reconciler alone.
#[tokio::test]
async fn settling_now_journals_who_asked() {
    let h = Harness::new().await;
    let reconciler = h.reconciler(ReconcileSpec::default(), &h.lookup_url());
    let (asked, plain) = ("asked-1", "plain-1");
    for key in [asked, plain] {
        h.answer(key, Behavior::Answer(200, "{}"));
    }
    let asked = h.ambiguous(OPERATION, asked).await;
    let plain = h.ambiguous(OPERATION, plain).await;
    let by = asked_by("operator:ana");
    assert_eq!(by, "reconciler (asked by operator:ana)");
    let settled = reconciler.settle_now_asked_by(&asked, &by).await;
    assert_eq!(settled, Settled::Resolved { completed: true });
    let settled = reconciler.settle_now(&plain).await;
    assert_eq!(settled, Settled::Resolved { completed: true });
    for (id, want) in [(&asked, by.as_str()), (&plain, RESOLVED_BY)] {
        let journal = h.store.resolutions(id).await.unwrap();
        let by: Vec<&str> = journal.iter().map(|e| e.by.as_str()).collect();
        assert_eq!(by, [want], "{id}");
    }
}
