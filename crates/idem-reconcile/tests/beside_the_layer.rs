//! The reconciler beside a service's own `IdempotencyLayer`, over a real
//! SQLite store: a handler that fails after its effect (500) leaves an
//! unknown outcome, and an in-process provider (the service's own ledger,
//! no HTTP) settles it — on the retry at once, or by a scan when nobody
//! retries. No key is left for an operator when the service can answer.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::{RecordId, State, Store, StoredResult, SystemClock};
use idem_http::{IdempotencyLayer, Route, RouteSpec};
use idem_reconcile::{
    Finding, Provider, ProviderFuture, ReconcileSettings, ReconcileSpec, Reconciler,
};
use idem_sqlite::{SqliteOptions, SqliteStore};
use tower::{Layer, ServiceExt, service_fn};

/// The service's own ledger of payouts, by the key it was sent.
#[derive(Default)]
struct Ledger(Mutex<HashMap<String, String>>);

/// The provider a service writes for itself: its ledger, asked in-process.
struct LedgerProvider(Arc<Ledger>);

impl Provider for LedgerProvider {
    fn ask<'a>(&'a self, id: &'a RecordId) -> ProviderFuture<'a> {
        Box::pin(async move {
            let paid = self.0.0.lock().unwrap().get(id.key.as_str()).cloned();
            match paid {
                Some(body) => Finding::Found {
                    result: StoredResult::new(201, vec![], body.into_bytes()).unwrap(),
                    reason: "in the ledger".into(),
                },
                None => Finding::NotFound {
                    reason: "not in the ledger".into(),
                },
            }
        })
    }
}

type Handler =
    tower::util::BoxCloneSyncService<Request<Full<Bytes>>, Response<Full<Bytes>>, Infallible>;

struct Service {
    _dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    reconciler: Arc<Reconciler>,
    calls: Arc<AtomicUsize>,
    service: idem_http::Idempotency<Handler>,
}

/// A payouts handler that pays into the ledger, then fails with a 500 on
/// its first call, behind the layer, with the reconciler beside it.
fn service() -> Service {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(dir.path().join("idem.db"), SqliteOptions::default()).unwrap());
    let ledger = Arc::new(Ledger::default());
    let provider: Arc<dyn Provider> = Arc::new(LedgerProvider(ledger.clone()));
    let settings = ReconcileSettings::new(&ReconcileSpec {
        interval_s: Some(1),
        backoff_ms: Some(50),
        backoff_max_ms: Some(100),
        ..ReconcileSpec::default()
    })
    .unwrap();
    let reconciler = Arc::new(
        Reconciler::with_providers(
            store.clone(),
            vec![("payouts".into(), provider)],
            settings,
            Arc::new(SystemClock),
        )
        .unwrap(),
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let handler = service_fn(move |req: Request<Full<Bytes>>| {
        let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
        let key = req.headers()["idempotency-key"]
            .to_str()
            .unwrap()
            .to_owned();
        let body = format!("{{\"payout\":{n}}}");
        ledger.0.lock().unwrap().insert(key, body.clone());
        let status = if n == 1 {
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            StatusCode::CREATED
        };
        async move {
            let mut response = Response::new(Full::new(Bytes::from(body)));
            *response.status_mut() = status;
            Ok::<_, Infallible>(response)
        }
    });
    let route = Route::new(&RouteSpec {
        name: Some("payouts".into()),
        path: Some("/payouts".into()),
        lease_ms: Some(500),
        ..RouteSpec::default()
    })
    .unwrap();
    let service = IdempotencyLayer::new(store.clone(), vec![route])
        .with_settle_on_retry(reconciler.clone())
        .layer(Handler::new(handler));
    Service {
        _dir: dir,
        store,
        reconciler,
        calls,
        service,
    }
}

fn payout(key: &str) -> Request<Full<Bytes>> {
    Request::post("/payouts")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"{\"amount\":100}")))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_answered_from_the_services_own_ledger() {
    let s = service();
    let first = s.service.clone().oneshot(payout("p-1")).await.unwrap();
    assert_eq!(first.status(), 500);
    let retry = s.service.clone().oneshot(payout("p-1")).await.unwrap();
    assert_eq!(retry.status(), 201, "settled from the ledger at once");
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let body = retry.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"{\"payout\":1}");
    assert_eq!(s.calls.load(Ordering::SeqCst), 1, "one payout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_nobody_retries_is_settled_by_the_reconcilers_scans() {
    let s = service();
    let first = s.service.clone().oneshot(payout("p-2")).await.unwrap();
    assert_eq!(first.status(), 500);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let reconciler = s.reconciler.clone();
    let scans = tokio::spawn(async move {
        reconciler
            .run(async move {
                let _ = stopped.await;
            })
            .await
    });
    let listing = s
        .store
        .list(&idem_core::ListQuery::default())
        .await
        .unwrap();
    let id = listing.records[0].id.clone();
    let mut state = None;
    for _ in 0..100 {
        state = s.store.get(&id).await.unwrap().map(|r| r.state);
        if state == Some(State::Completed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(state, Some(State::Completed), "settled without a retry");
    let _ = stop.send(());
    scans.await.unwrap();
    assert_eq!(s.calls.load(Ordering::SeqCst), 1, "one payout");
}
