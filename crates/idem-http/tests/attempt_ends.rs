//! Every way an attempt can end in-process, through the layer over the
//! real SQLite and PostgreSQL stores: an answer, a 5xx, a panic, an answer cut at the lease's
//! end, a caller that hangs up. Each ends with the key answered by the
//! route's declared rule — replayed, released for the retry, or an
//! unknown outcome whose 409 says truthfully who settles it — never a key
//! left in progress with no answer.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_http::{CompletionSpec, IdempotencyLayer, Route, RouteSpec, UnknownOutcomes};
use idem_testkit::stores::{Backend, open};
use tower::{Layer, ServiceExt, service_fn};

/// How the handler ends its first call (later calls answer 201).
#[derive(Clone, Copy, Debug)]
enum End {
    Answer,
    Status500,
    Panic,
    PastLease,
    CallerHangsUp,
}

/// What the retry must get.
#[derive(Debug, PartialEq)]
enum Retry {
    /// The first answer again, marked replayed.
    Replay(u16),
    /// 409 outcome-unknown whose detail holds this text.
    Unknown(&'static str),
    /// The key was released: the retry ran the handler again.
    RanAgain,
}

const OPERATOR: &str = "an operator must resolve it";
const RECONCILER: &str = "awaits reconciliation";

struct Case {
    end: End,
    completion: CompletionSpec,
    settled_by: Option<UnknownOutcomes>,
    retry: Retry,
}

fn spec(release: &[u16], final_statuses: &[u16]) -> CompletionSpec {
    CompletionSpec {
        release: (!release.is_empty()).then(|| release.to_vec()),
        final_statuses: (!final_statuses.is_empty()).then(|| final_statuses.to_vec()),
        unknown: None,
    }
}

fn cases() -> Vec<Case> {
    let case = |end, completion, settled_by, retry| Case {
        end,
        completion,
        settled_by,
        retry,
    };
    let default = || spec(&[], &[]);
    vec![
        case(End::Answer, default(), None, Retry::Replay(201)),
        case(End::Status500, default(), None, Retry::Unknown(OPERATOR)),
        case(
            End::Status500,
            default(),
            Some(UnknownOutcomes::Reconciler),
            Retry::Unknown(RECONCILER),
        ),
        case(End::Status500, spec(&[500], &[]), None, Retry::RanAgain),
        case(End::Status500, spec(&[], &[500]), None, Retry::Replay(500)),
        case(End::Panic, default(), None, Retry::Unknown(OPERATOR)),
        case(End::Panic, spec(&[500], &[]), None, Retry::RanAgain),
        case(End::Panic, spec(&[], &[500]), None, Retry::Replay(500)),
        case(End::PastLease, default(), None, Retry::Unknown(OPERATOR)),
        case(End::CallerHangsUp, default(), None, Retry::Replay(201)),
    ]
}

/// A handler whose first call ends as `end` (counted in `calls` when it
/// starts, so an effect that may have happened is counted).
fn handler(
    end: End,
    calls: Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future: Send,
> + Clone
+ Send
+ 'static {
    service_fn(move |_req: Request<Full<Bytes>>| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let status = match (n, end) {
                (1, End::Status500) => StatusCode::INTERNAL_SERVER_ERROR,
                (1, End::Panic) => panic!("the handler's own bug"),
                (1, End::PastLease) => {
                    tokio::time::sleep(Duration::from_millis(3_000)).await;
                    StatusCode::CREATED
                }
                (1, End::CallerHangsUp) => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    StatusCode::CREATED
                }
                _ => StatusCode::CREATED,
            };
            let mut response = Response::new(Full::new(Bytes::from(format!("{{\"call\":{n}}}"))));
            *response.status_mut() = status;
            Ok(response)
        }
    })
}

fn request(key: &str) -> Request<Full<Bytes>> {
    Request::post("/payouts")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

async fn check(backend: Backend, i: usize, case: Case) {
    let opened = open(backend, "http_attempt_ends").await;
    let route = Route::new(&RouteSpec {
        lease_ms: Some(1_500),
        completion: Some(case.completion),
        ..RouteSpec::default()
    })
    .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut layer = IdempotencyLayer::new(opened.store.clone(), vec![route]);
    if let Some(settled_by) = case.settled_by {
        layer = layer.with_unknown_outcomes(settled_by);
    }
    let service = layer.layer(handler(case.end, calls.clone()));
    let key = format!("end-{i}");
    let first = service.clone().oneshot(request(&key));
    let first_status = match case.end {
        End::CallerHangsUp => {
            let gave_up = tokio::time::timeout(Duration::from_millis(50), first).await;
            assert!(gave_up.is_err(), "case {i}: still running");
            tokio::time::sleep(Duration::from_millis(600)).await;
            None
        }
        _ => Some(first.await.unwrap().status().as_u16()),
    };
    let retry = service.oneshot(request(&key)).await.unwrap();
    let status = retry.status().as_u16();
    let replayed = retry.headers().contains_key("idempotent-replayed");
    let body = String::from_utf8(
        retry
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    let got = match (status, replayed) {
        (409, false) if body.contains("outcome-unknown") => {
            match [OPERATOR, RECONCILER]
                .into_iter()
                .find(|t| body.contains(t))
            {
                Some(text) => Retry::Unknown(text),
                None => panic!("case {i}: a 409 that names no one: {body}"),
            }
        }
        (s, true) => {
            assert_eq!(Some(s), first_status.or(Some(201)), "case {i}: {body}");
            Retry::Replay(s)
        }
        (201, false) if calls.load(Ordering::SeqCst) == 2 => Retry::RanAgain,
        _ => panic!(
            "{backend:?} case {i} {:?}: retry answered {status}: {body}",
            case.end
        ),
    };
    assert_eq!(
        got, case.retry,
        "{backend:?} case {i} {:?}: {body}",
        case.end
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_way_an_attempt_ends_leaves_its_key_an_answer_on_sqlite() {
    for (i, case) in cases().into_iter().enumerate() {
        check(Backend::Sqlite, i, case).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_way_an_attempt_ends_leaves_its_key_an_answer_on_postgres() {
    for (i, case) in cases().into_iter().enumerate() {
        check(Backend::Postgres, i, case).await;
    }
}
