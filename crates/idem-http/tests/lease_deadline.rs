//! A forward never outlives the lease the store granted, however late the
//! store's answer arrives (DESIGN I8): the layer over the real SQLite and
//! PostgreSQL stores (127.0.0.1:5432, or `IDEM_TEST_POSTGRES_URL`;
//! PostgreSQL leases by its own clock), with their claim answers held back
//! for any delay after the commit, in front of an upstream that takes any
//! time.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use idem_core::{FORWARD_MS_MIN, Store, lease::margin_ms};
use idem_http::{IdempotencyLayer, LeaseDeadline, Route, RouteSpec};
use idem_testkit::late_ack::LateAck;
use idem_testkit::stores::{Backend, open};
use proptest::prelude::*;
use tower::{Layer, ServiceExt, service_fn};

/// Short enough that a case takes well under a second and a half.
const LEASE_MS: u64 = 500;

/// What the upstream saw of the one forward, if there was one.
#[derive(Default)]
struct Seen {
    started: Option<Instant>,
    ended: Option<Instant>,
    deadline: Option<Instant>,
}

/// Notes the forward's end when it answers or is dropped at its deadline.
struct EndGuard(Arc<Mutex<Seen>>);

impl Drop for EndGuard {
    fn drop(&mut self) {
        self.0.lock().unwrap().ended = Some(Instant::now());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// For any delay between the commit and the answer, and any time the
    /// upstream takes: the forward's deadline and its end are within the
    /// lease as the store began it; an answer too late to leave
    /// [`FORWARD_MS_MIN`] forwards nothing, releases the record and
    /// answers 503 `lease-spent`; a forward cut at its deadline leaves the
    /// record ambiguous.
    #[test]
    fn the_forward_ends_within_the_granted_lease(
        ack_delay_ms in 0u64..700,
        upstream_ms in 0u64..700,
        postgres in proptest::bool::ANY,
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let backend = if postgres { Backend::Postgres } else { Backend::Sqlite };
        rt.block_on(check(backend, ack_delay_ms, upstream_ms));
    }
}

async fn check(backend: Backend, ack_delay_ms: u64, upstream_ms: u64) {
    let opened = open(backend, "http_late").await;
    let store = opened.store.clone();
    let late = Arc::new(LateAck::new(store));
    late.set_delay(Duration::from_millis(ack_delay_ms));
    let route = Route::new(&RouteSpec {
        lease_ms: Some(LEASE_MS),
        ..Default::default()
    })
    .unwrap();
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let upstream = {
        let seen = seen.clone();
        service_fn(move |req: Request<Full<Bytes>>| {
            let seen = seen.clone();
            async move {
                {
                    let mut s = seen.lock().unwrap();
                    s.started = Some(Instant::now());
                    s.deadline = req.extensions().get::<LeaseDeadline>().map(|d| d.0);
                }
                let _end = EndGuard(seen);
                tokio::time::sleep(Duration::from_millis(upstream_ms)).await;
                Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
            }
        })
    };
    let service = IdempotencyLayer::new(late.clone(), vec![route]).layer(upstream);
    let req = Request::post("/payouts")
        .header("idempotency-key", "late-1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = service.oneshot(req).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let problem = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|doc| Some(doc.get("type")?.as_str()?.to_owned()));
    let sent = late.claims_sent();
    assert_eq!(sent.len(), 1);
    let lease_end = sent[0] + Duration::from_millis(LEASE_MS);
    let listed = late.list(&Default::default()).await.unwrap();
    let state = listed.records.first().map(|r| r.state);
    let seen = Arc::into_inner(seen).unwrap().into_inner().unwrap();
    let case = format!(
        "{backend:?}, ack after {ack_delay_ms} ms, upstream {upstream_ms} ms: {status} {problem:?}"
    );
    let Some(started) = seen.started else {
        assert_eq!(status, 503, "{case}");
        assert_eq!(
            problem.as_deref(),
            Some("urn:idem:problem:lease-spent"),
            "{case}"
        );
        assert_eq!(state, None, "released: {case}");
        return;
    };
    assert!(
        ack_delay_ms + FORWARD_MS_MIN + margin_ms(LEASE_MS) <= LEASE_MS,
        "forwarded with too little of the lease left: {case}"
    );
    let deadline = seen.deadline.unwrap(); // the forward carries its deadline
    assert!(deadline <= lease_end, "deadline past the lease: {case}");
    assert!(started <= deadline, "{case}");
    let ended = seen.ended.unwrap();
    assert!(ended <= lease_end, "the forward outlived its lease: {case}");
    match status {
        200 => assert_eq!(state, Some(idem_core::State::Completed), "{case}"),
        504 => {
            assert_eq!(
                problem.as_deref(),
                Some("urn:idem:problem:upstream-timeout"),
                "{case}"
            );
            assert_eq!(
                state,
                Some(idem_core::State::Ambiguous),
                "cut at its deadline: {case}"
            );
        }
        _ => panic!("unexpected answer: {case}"),
    }
}
