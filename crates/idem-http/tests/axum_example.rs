//! Drives the axum example in-process, over a real SQLite file: the layer
//! gives one effect per key and replays byte-identical answers.
#![allow(clippy::unwrap_used)] // test helpers: a failure here is a failed test

#[path = "../examples/axum_payouts.rs"]
#[allow(dead_code)]
mod example;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

async fn send(
    router: &axum::Router,
    key: Option<&str>,
    body: &str,
) -> (StatusCode, Option<String>, String) {
    let mut req = Request::post("/payouts").header("content-type", "application/json");
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    let response = router
        .clone()
        .oneshot(req.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.to_str().unwrap().to_owned());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, replayed, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn one_payout_per_key_and_identical_replays() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        idem_sqlite::SqliteStore::open(dir.path().join("idem.db"), Default::default()).unwrap(),
    );
    let ledger = Arc::new(example::Ledger::default());
    let router = example::app(store, ledger.clone()).unwrap();

    let first = send(
        &router,
        Some("p-1"),
        r#"{"seller":847,"amount":1200,"request_time":1}"#,
    )
    .await;
    assert_eq!((first.0, first.1.as_deref()), (StatusCode::CREATED, None));
    // Same intent, re-serialised with another request_time (excluded from the fingerprint).
    let retry = send(
        &router,
        Some("\"p-1\""),
        r#"{"amount":1200, "seller":847,"request_time":2}"#,
    )
    .await;
    assert_eq!(
        retry,
        (StatusCode::CREATED, Some("true".into()), first.2.clone())
    );
    let reused = send(&router, Some("p-1"), r#"{"seller":847,"amount":9999}"#).await;
    assert_eq!(reused.0, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        reused.2.contains("urn:idem:problem:key-reused"),
        "{}",
        reused.2
    );
    let missing = send(&router, None, "{}").await;
    assert_eq!(missing.0, StatusCode::BAD_REQUEST);
    assert!(missing.2.contains("urn:idem:problem:missing-key"));
    let broken = send(&router, Some("p-2"), "{\"seller\":").await;
    assert_eq!(broken.0, StatusCode::BAD_REQUEST);
    assert!(
        broken.2.contains("urn:idem:problem:invalid-body"),
        "{}",
        broken.2
    );
    assert_eq!(ledger.payouts.load(Ordering::SeqCst), 1);

    let health = router
        .clone()
        .oneshot(Request::get("/health").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);
}
