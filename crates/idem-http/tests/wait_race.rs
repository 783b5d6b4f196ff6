//! The attempt a request waits for may complete while the request is being
//! registered as a waiter: between the claim that answered "in flight" and
//! the registration, nobody is there to be woken. The waiter asks the claim
//! again at once after registering, so it still gets the replay. Here the
//! route's wait (200 ms) is shorter than the waiters' poll (250 ms): a
//! waiter that relied on a wake or its poll would answer 409.
//! Through the layer over the real SQLite store, with the waiter's first
//! claim answer held back until the original has completed.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::WAIT_POLL_MS;
use idem_http::{IdempotencyLayer, Route, RouteSpec};
use idem_testkit::late_ack::LateAck;
use idem_testkit::stores::{Backend, open};
use tower::{Layer, ServiceExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_completes_while_a_waiter_registers_is_still_replayed() {
    const WAIT_MS: u64 = 200;
    const { assert!(WAIT_MS < WAIT_POLL_MS, "the wait ends before any poll") };
    let opened = open(Backend::Sqlite, "wait_race").await;
    let late = Arc::new(LateAck::new(opened.store.clone()));
    let route = Route::new(&RouteSpec {
        wait_ms: Some(WAIT_MS),
        wait_ms_max: Some(WAIT_MS),
        ..Default::default()
    })
    .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let upstream = support::slow_payouts(calls.clone(), Duration::from_millis(100));
    let service = IdempotencyLayer::new(late.clone(), vec![route]).layer(upstream);
    let request = || {
        Request::post("/payouts")
            .header("idempotency-key", "race-1")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    };
    let original = tokio::spawn(service.clone().oneshot(request()));
    tokio::time::sleep(Duration::from_millis(20)).await;
    // The waiter's claim is decided now ("in flight"); its answer arrives
    // after the original completed (at about 100 ms) and woke nobody.
    late.set_delay(Duration::from_millis(300));
    let waiter = tokio::spawn(service.clone().oneshot(request()));
    tokio::time::sleep(Duration::from_millis(30)).await;
    late.set_delay(Duration::ZERO);

    let first = original.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let again = waiter.await.unwrap().unwrap();
    let replayed = again
        .headers()
        .get("idempotent-replayed")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let status = again.status();
    let body = again.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        (status, replayed.as_deref()),
        (StatusCode::CREATED, Some("true")),
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(&body[..], b"{\"payout\":1}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one effect");
    assert_eq!(
        late.claims_sent().len(),
        3,
        "the original, the waiter, its ask after registering"
    );
}
