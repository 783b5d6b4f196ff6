//! A waiter holds no in-flight slot while it waits, and takes one again
//! before it works: here the attempt it waited for is released (the
//! upstream answered 425), the waiter's own claim acquires the key, and
//! every slot is taken by then, so it is answered 503 `overloaded`, as a
//! fresh request would be, with nothing forwarded and the key released
//! for the next retry.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::{MemoryStore, SystemClock};
use idem_http::{IdempotencyLayer, InFlightSlot, Route, RouteSpec};
use tokio::sync::Semaphore;
use tower::{Layer, ServiceExt, service_fn};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_gives_its_slot_back_and_finds_none_to_work_with() {
    let store = Arc::new(MemoryStore::new(Arc::new(SystemClock)));
    let route = Route::new(&RouteSpec {
        wait_ms: Some(2_000),
        wait_ms_max: Some(2_000),
        ..Default::default()
    })
    .unwrap();
    // The first call takes 200 ms and answers 425 (the key is released);
    // every later one pays at once.
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let upstream = service_fn(move |_req: Request<Full<Bytes>>| {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut response = Response::new(Full::new(Bytes::from_static(b"{}")));
            if n == 0 {
                tokio::time::sleep(Duration::from_millis(200)).await;
                *response.status_mut() = StatusCode::from_u16(425).unwrap();
            } else {
                *response.status_mut() = StatusCode::CREATED;
            }
            Ok::<_, Infallible>(response)
        }
    });
    let service = IdempotencyLayer::new(store, vec![route]).layer(upstream);
    let slots = Arc::new(Semaphore::new(2));
    let request = |slot: Option<&InFlightSlot>| {
        let mut req = Request::post("/payouts")
            .header("idempotency-key", "slot-1")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        if let Some(slot) = slot {
            req.extensions_mut().insert(slot.clone());
        }
        req
    };
    let original_slot = InFlightSlot::try_take(&slots).unwrap();
    let original = tokio::spawn(service.clone().oneshot(request(Some(&original_slot))));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let waiter_slot = InFlightSlot::try_take(&slots).unwrap();
    let waiter = tokio::spawn(service.clone().oneshot(request(Some(&waiter_slot))));
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The waiter gave its slot back: another request takes it, and keeps
    // it (with the original's) until the waiter's wait has ended.
    let other = InFlightSlot::try_take(&slots).expect("the waiter's slot is free");

    let first = original.await.unwrap().unwrap();
    assert_eq!(first.status().as_u16(), 425);
    let shed = waiter.await.unwrap().unwrap();
    let status = shed.status();
    let body = shed.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("urn:idem:problem:overloaded"), "{body}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the waiter forwarded nothing"
    );
    assert_eq!(slots.available_permits(), 0, "the waiter holds no slot");

    // The key the waiter acquired was released: the next retry runs.
    original_slot.give_back();
    other.give_back();
    let retry = service.clone().oneshot(request(None)).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
