//! A caller that stops waiting (its connection dropped, and with it the
//! future that awaits the layer) cancels nothing: the attempt runs on, its
//! outcome is recorded, and the retry is answered with it as a replay.
//! Through the layer over the real SQLite and PostgreSQL stores.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_http::{IdempotencyLayer, Route, RouteSpec};
use idem_testkit::stores::{Backend, open};
use tower::{Layer, ServiceExt};

async fn abandoned_attempt_is_replayed(backend: Backend) {
    let opened = open(backend, "http_hang_up").await;
    let route = Route::new(&RouteSpec::default()).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let upstream = support::slow_payouts(calls.clone(), Duration::from_millis(300));
    let service = IdempotencyLayer::new(opened.store.clone(), vec![route]).layer(upstream);
    let request = || {
        Request::post("/payouts")
            .header("idempotency-key", "hang-up-1")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    };
    // The caller gives up after 50 ms: its future is dropped mid-forward.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        service.clone().oneshot(request()),
    )
    .await;
    assert!(gave_up.is_err(), "the first call was still running");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let retry = service.oneshot(request()).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED, "{backend:?}");
    assert_eq!(
        retry
            .headers()
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true"),
        "{backend:?}"
    );
    let body = retry.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"{\"payout\":1}", "{backend:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "{backend:?}: one effect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_attempt_runs_on_and_is_replayed_on_sqlite() {
    abandoned_attempt_is_replayed(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_attempt_runs_on_and_is_replayed_on_postgres() {
    abandoned_attempt_is_replayed(Backend::Postgres).await;
}
