//! Drives the multi-tenant example's router in-process over a real SQLite
//! file: one payout per tenant and key, another tenant's same key is
//! another payout, and a payout whose answer was lost is settled from the
//! ledger by the reconciler running in the same process.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum_tenants::{Ledger, Service, service};
use http_body_util::BodyExt;
use idem_core::{ListQuery, Store};
use idem_sqlite::{SqliteOptions, SqliteStore};
use tower::ServiceExt;

struct Answer {
    status: StatusCode,
    replayed: bool,
    body: String,
}

async fn pay(service: &Service, tenant: Option<&str>, key: Option<&str>) -> Answer {
    post(service, "/payouts", tenant, key).await
}

async fn post(service: &Service, path: &str, tenant: Option<&str>, key: Option<&str>) -> Answer {
    let mut request = Request::post(path).header("content-type", "application/json");
    if let Some(tenant) = tenant {
        request = request.header("authorization", format!("Tenant {tenant}"));
    }
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let request = request.body(Body::from("{\"amount\":100}")).unwrap();
    let response = service.router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        replayed,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

struct Opened {
    _dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    ledger: Arc<Ledger>,
    service: Service,
}

fn open() -> Opened {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(dir.path().join("idem.db"), SqliteOptions::default()).unwrap());
    let ledger = Arc::new(Ledger::default());
    let service = service(store.clone(), ledger.clone()).unwrap();
    Opened {
        _dir: dir,
        store,
        ledger,
        service,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_payout_per_tenant_and_key() {
    // `_dir` bound, not `..`: the directory lives as long as the test.
    let Opened {
        _dir,
        ledger,
        service,
        ..
    } = open();
    let first = pay(&service, Some("acme"), Some("p-1")).await;
    assert_eq!((first.status, first.replayed), (StatusCode::CREATED, false));
    let retry = pay(&service, Some("acme"), Some("p-1")).await;
    assert_eq!((retry.status, retry.replayed), (StatusCode::CREATED, true));
    assert_eq!(retry.body, first.body, "the stored answer, byte for byte");
    assert_eq!(ledger.payouts(), 1);

    let other = pay(&service, Some("globex"), Some("p-1")).await;
    assert_eq!((other.status, other.replayed), (StatusCode::CREATED, false));
    assert!(other.body.contains("\"globex\""), "{}", other.body);
    assert_eq!(
        ledger.payouts(),
        2,
        "another tenant's key is another payout"
    );

    let cases = [
        (None, Some("p-9"), StatusCode::UNAUTHORIZED),
        (Some("acme"), None, StatusCode::BAD_REQUEST),
    ];
    for (tenant, key, want) in cases {
        assert_eq!(
            pay(&service, tenant, key).await.status,
            want,
            "{tenant:?} {key:?}"
        );
    }
    assert_eq!(ledger.payouts(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_is_settled_from_the_ledger_in_process() {
    // `_dir` bound, not `..`: the directory lives as long as the test.
    let Opened {
        _dir,
        ledger,
        service,
        ..
    } = open();
    // Settled when the client retries.
    ledger.lose_next_answer();
    let lost = pay(&service, Some("acme"), Some("p-2")).await;
    assert_eq!(lost.status, StatusCode::INTERNAL_SERVER_ERROR);
    let retry = pay(&service, Some("acme"), Some("p-2")).await;
    assert_eq!((retry.status, retry.replayed), (StatusCode::CREATED, true));
    assert_eq!(retry.body, lost.body, "the ledger's answer");
    assert_eq!(ledger.payouts(), 1);

    // Settled by a scan before anyone retries.
    ledger.lose_next_answer();
    let lost = pay(&service, Some("globex"), Some("p-2")).await;
    assert_eq!(lost.status, StatusCode::INTERNAL_SERVER_ERROR);
    let report = service.reconciler.run_once().await;
    assert_eq!(report.completed, 1, "{report}");
    let retry = pay(&service, Some("globex"), Some("p-2")).await;
    assert_eq!((retry.status, retry.replayed), (StatusCode::CREATED, true));
    assert_eq!(retry.body, lost.body);
    assert_eq!(ledger.payouts(), 2, "each tenant's payout made once");

    // The spawned scans stop when told.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let scans = service.reconciler.spawn(stopped);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), scans)
        .await
        .unwrap()
        .unwrap();
}

/// A layer attached to one axum route, with no name and no path of its
/// own, scopes its records by the route axum matched: one operation for
/// every payout id, and the same key on two ids is one intent's key reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unnamed_route_is_scoped_by_the_matched_route() {
    let Opened {
        _dir,
        store,
        service,
        ..
    } = open();
    let first = post(&service, "/payouts/7/cancel", Some("acme"), Some("c-1")).await;
    assert_eq!((first.status, first.replayed), (StatusCode::OK, false));
    let retry = post(&service, "/payouts/7/cancel", Some("acme"), Some("c-1")).await;
    assert_eq!((retry.status, retry.replayed), (StatusCode::OK, true));
    let elsewhere = post(&service, "/payouts/8/cancel", Some("acme"), Some("c-1")).await;
    assert_eq!(
        elsewhere.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        elsewhere.body
    );
    let listing = store.list(&ListQuery::default()).await.unwrap();
    let scopes: Vec<&str> = listing
        .records
        .iter()
        .map(|r| r.id.scope.as_str())
        .collect();
    assert_eq!(scopes.len(), 1, "{scopes:?}");
    assert!(
        scopes[0].starts_with("POST /payouts/{id}/cancel|"),
        "{scopes:?}"
    );
}
