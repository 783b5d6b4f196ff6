//! The note of why a record is ambiguous, written by the layer over the
//! real SQLite and PostgreSQL stores: a 503 whose length is known is read
//! for its excerpt and still reaches the caller whole; a streamed 503 of
//! unknown length is passed on untouched and noted without an excerpt;
//! the route's summary keeps a number no double holds exactly as sent.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use idem_core::{ListQuery, Record, State};
use idem_http::{CompletionSpec, IdempotencyLayer, Route, RouteSpec};
use idem_testkit::stores::{Backend, open};
use tower::{Layer, ServiceExt, service_fn};

const ANSWER: &str = "the ledger is busy; try later";
const AMOUNT: &str = "12345678901234567890.25";

/// A body sent in one frame, whose length is announced or not.
struct Sent {
    data: Option<Bytes>,
    announced: bool,
}

impl From<Bytes> for Sent {
    fn from(data: Bytes) -> Sent {
        Sent {
            data: Some(data),
            announced: true,
        }
    }
}

impl Body for Sent {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.data.take().map(|d| Ok(Frame::data(d))))
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.data, self.announced) {
            (Some(d), true) => SizeHint::with_exact(d.len() as u64),
            (None, true) => SizeHint::with_exact(0),
            (_, false) => SizeHint::default(),
        }
    }
}

/// The record the layer left, the only one in the store.
async fn the_record(store: &dyn idem_core::Store) -> Record {
    let listed = store.list(&ListQuery::default()).await.unwrap();
    assert_eq!(listed.records.len(), 1, "{listed:?}");
    listed.records.into_iter().next().unwrap()
}

async fn check(backend: Backend, announced: bool) {
    let opened = open(backend, "http_ambiguity_note").await;
    let route = Route::new(&RouteSpec {
        completion: Some(CompletionSpec {
            unknown: Some(vec![503]),
            ..CompletionSpec::default()
        }),
        summary_fields: Some(vec!["/amount".into(), "/absent".into()]),
        ..RouteSpec::default()
    })
    .unwrap();
    let layer = IdempotencyLayer::new(opened.store.clone(), vec![route]);
    let service = layer.layer(service_fn(move |_req: Request<Full<Bytes>>| async move {
        let body = Sent {
            data: Some(Bytes::from_static(ANSWER.as_bytes())),
            announced,
        };
        let mut response = Response::new(body);
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        Ok::<_, Infallible>(response)
    }));
    let payout = format!(r#"{{"seller_id":"s-1","amount":{AMOUNT}}}"#);
    let request = Request::post("/payouts")
        .header("idempotency-key", "note-1")
        .body(Full::new(Bytes::from(payout)))
        .unwrap();
    let answered = service.oneshot(request).await.unwrap();
    assert_eq!(answered.status(), 503);
    let body = answered.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        body,
        ANSWER.as_bytes(),
        "{backend:?}: the caller gets it whole"
    );

    let record = the_record(&*opened.store).await;
    assert_eq!(record.state, State::Ambiguous);
    let note = record.ambiguity.unwrap();
    assert_eq!(note.status, Some(503));
    assert_eq!(note.error, "upstream answered 503");
    assert_eq!(note.node, record.owner);
    let excerpt = announced.then(|| ANSWER.to_owned());
    assert_eq!(note.excerpt, excerpt, "{backend:?}, announced: {announced}");
    assert_eq!(note.summary, [("/amount".to_owned(), AMOUNT.to_owned())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_is_noted_with_its_excerpt_and_summary_on_sqlite() {
    check(Backend::Sqlite, true).await;
    check(Backend::Sqlite, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_is_noted_with_its_excerpt_and_summary_on_postgres() {
    check(Backend::Postgres, true).await;
    check(Backend::Postgres, false).await;
}
