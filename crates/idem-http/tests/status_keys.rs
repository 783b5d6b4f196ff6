//! Every legal key can be asked about through its status URL: for any key
//! of visible ASCII, sent in the header's quoted form, the URL the layer
//! spells for it (`StatusUrl::location`, as `Prefer: respond-async`'s
//! `Location`) answers its caller the stored result and another principal
//! the same bytes as a key never sent. Through the layer over the real
//! SQLite and PostgreSQL stores, whose ids leave memory.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{HeaderName, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::IdempotencyKey;
use idem_http::{Idempotency, Route, StatusUrl};
use idem_testkit::stores::{Backend, open};
use proptest::test_runner::{Config, TestRunner};
use tower::{Layer, ServiceExt, service_fn};

/// Cases per store: each is three requests through a real store.
const CASES: u32 = 48;

type Answer = (StatusCode, Vec<(String, String)>, Bytes);

async fn call<S>(service: &Idempotency<S>, req: Request<Full<Bytes>>) -> Answer
where
    S: tower::Service<Request<Full<Bytes>>, Response = Response<Full<Bytes>>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    S::Error: std::fmt::Display + std::fmt::Debug + Send,
{
    let response = service.clone().oneshot(req).await.unwrap();
    let status = response.status();
    let headers = response
        .headers()
        .iter()
        .map(|(n, v)| (n.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
        .collect();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, body)
}

fn get(url: &str, tenant: &str) -> Request<Full<Bytes>> {
    Request::get(url)
        .header("x-tenant-id", tenant)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// The header's quoted form of a key's own text.
fn quoted(key: &str) -> String {
    format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""))
}

fn every_key_is_found_by_its_status_url(backend: Backend) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let opened = rt.block_on(open(backend, "http_status_keys"));
    let route = Route::builder()
        .name("payouts")
        .methods([Method::POST])
        .path("/payouts")
        .principal_header(HeaderName::from_static("x-tenant-id"))
        .build()
        .unwrap();
    let paid = Arc::new(AtomicUsize::new(0));
    let counter = paid.clone();
    let upstream = service_fn(move |_req: Request<Full<Bytes>>| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let mut response = Response::new(Full::new(Bytes::from(format!("{{\"payout\":{n}}}"))));
            *response.status_mut() = StatusCode::CREATED;
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let layer = idem_http::IdempotencyLayer::new(opened.store.clone(), vec![route]);
    let service = layer.layer(upstream);
    let mut runner = TestRunner::new(Config::with_cases(CASES));
    runner
        .run(&"[!-~]{1,64}", |text| {
            rt.block_on(async {
                let key = IdempotencyKey::new(text.as_str()).unwrap();
                let url = StatusUrl::default()
                    .location("/payouts", &key, None)
                    .unwrap();
                let before = paid.load(Ordering::SeqCst);
                let post = Request::post("/payouts")
                    .header("x-tenant-id", "acme")
                    .header("idempotency-key", quoted(&text))
                    .body(Full::new(Bytes::from_static(b"{}")))
                    .unwrap();
                let (status, _, body) = call(&service, post).await;
                // A key sent twice by the generator is a replay: the same.
                assert_eq!(status, StatusCode::CREATED, "{text:?}");
                let (asked, headers, asked_body) = call(&service, get(&url, "acme")).await;
                assert_eq!((asked, &asked_body), (StatusCode::CREATED, &body), "{url}");
                let replayed = headers
                    .iter()
                    .any(|(n, v)| n == "idempotent-replayed" && v == "true");
                assert!(replayed, "{url}: {headers:?}");
                let foreign = call(&service, get(&url, "globex")).await;
                let unseen = call(&service, get("/payouts/.idem/never-sent", "globex")).await;
                assert_eq!(foreign, unseen, "{url}");
                assert_eq!(foreign.0, StatusCode::NOT_FOUND);
                assert!(
                    paid.load(Ordering::SeqCst) <= before + 1,
                    "one payment at most"
                );
            });
            Ok(())
        })
        .unwrap();
}

#[test]
fn every_key_is_found_by_its_status_url_on_sqlite() {
    every_key_is_found_by_its_status_url(Backend::Sqlite);
}

#[test]
fn every_key_is_found_by_its_status_url_on_postgres() {
    every_key_is_found_by_its_status_url(Backend::Postgres);
}
