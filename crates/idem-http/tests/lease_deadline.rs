//! A forward never outlives the lease the store granted, however late the
//! store's answer arrives (I8, docs/contract.md): the layer over the real SQLite and
//! PostgreSQL stores (127.0.0.1:5432, or `IDEM_TEST_POSTGRES_URL`;
//! PostgreSQL leases by its own clock), with their claim answers held back
//! for any delay after the commit, in front of an upstream that takes any
//! time to answer and any time more to send its body.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
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

/// Notes the forward's end when its body has been sent, or when it is
/// dropped at its deadline.
struct EndGuard(Arc<Mutex<Seen>>);

impl Drop for EndGuard {
    fn drop(&mut self) {
        self.0.lock().unwrap().ended = Some(Instant::now());
    }
}

/// An upstream's body that arrives a while after its head; the forward
/// ends when it has been read or dropped.
struct SlowBody {
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
    data: Option<Bytes>,
    end: Option<EndGuard>,
}

impl From<Bytes> for SlowBody {
    fn from(data: Bytes) -> SlowBody {
        SlowBody {
            wait: None,
            data: Some(data),
            end: None,
        }
    }
}

impl Body for SlowBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(wait) = self.wait.as_mut() {
            if wait.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.wait = None;
        }
        let data = self.data.take();
        self.end = None;
        Poll::Ready(data.map(|d| Ok(Frame::data(d))))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// For any delay between the commit and the answer, and any time the
    /// upstream takes to answer and to send its body: the forward's
    /// deadline and its end (body included) are within the lease as the
    /// store began it; an answer too late to leave [`FORWARD_MS_MIN`]
    /// forwards nothing, releases the record and answers 503
    /// `lease-spent`; a forward cut at its deadline before the head leaves
    /// the record ambiguous, after a final head completes it as not stored.
    #[test]
    fn the_forward_ends_within_the_granted_lease(
        ack_delay_ms in 0u64..700,
        upstream_ms in 0u64..700,
        body_ms in 0u64..400,
        postgres in proptest::bool::ANY,
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let backend = if postgres { Backend::Postgres } else { Backend::Sqlite };
        rt.block_on(check(backend, ack_delay_ms, (upstream_ms, body_ms)));
    }
}

async fn check(backend: Backend, ack_delay_ms: u64, (upstream_ms, body_ms): (u64, u64)) {
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
                let end = EndGuard(seen);
                tokio::time::sleep(Duration::from_millis(upstream_ms)).await;
                Ok::<_, Infallible>(Response::new(SlowBody {
                    wait: Some(Box::pin(tokio::time::sleep(Duration::from_millis(body_ms)))),
                    data: Some(Bytes::from_static(b"{\"payout\":1}")),
                    end: Some(end),
                }))
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
        "{backend:?}, ack after {ack_delay_ms} ms, upstream {upstream_ms} ms + body {body_ms} ms: \
         {status} {problem:?}"
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
        200 => {
            assert_eq!(&body[..], b"{\"payout\":1}", "{case}");
            assert_eq!(state, Some(idem_core::State::Completed), "{case}");
        }
        502 => {
            assert_eq!(
                problem.as_deref(),
                Some(idem_core::RESULT_NOT_STORED_TYPE),
                "{case}"
            );
            assert_eq!(
                state,
                Some(idem_core::State::Completed),
                "a final head, its body cut at the deadline: {case}"
            );
        }
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
