//! The layer over lambda_http with an API Gateway REST API (payload 1.0)
//! event, read as the runtime reads it: a binary body (base64 on the
//! wire) reaches the function as the bytes sent, the function's binary
//! answer is replayed byte for byte, and a request without a key is
//! refused before the function runs.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_http::{LeaseDeadline, Route};
use idem_lambda::IdempotencyLayer;
use idem_sqlite::{SqliteOptions, SqliteStore};
use lambda_http::tower::Layer;
use lambda_http::tower::ServiceExt;
use lambda_http::{Body, Request, RequestExt, Response, Service, service_fn};
use serde_json::json;

/// Bytes that are not UTF-8: they travel base64-encoded.
const IMAGE: [u8; 6] = [0x89, b'P', b'N', b'G', 0xff, 0x00];

fn rest_event(key: Option<&str>) -> Request {
    let mut headers = json!({ "content-type": "image/png", "host": "api.example.com" });
    if let Some(key) = key {
        headers["Idempotency-Key"] = json!(key);
    }
    let event = json!({
        "resource": "/thumbnails",
        "path": "/thumbnails",
        "httpMethod": "POST",
        "headers": headers,
        "multiValueHeaders": {},
        "queryStringParameters": null,
        "multiValueQueryStringParameters": null,
        "pathParameters": null,
        "stageVariables": null,
        "requestContext": {
            "accountId": "123456789012",
            "resourceId": "abc123",
            "stage": "prod",
            "requestId": "c6af9ac6-7b61-11e6-9a41-93e8deadbeef",
            "identity": { "sourceIp": "203.0.113.7" },
            "resourcePath": "/thumbnails",
            "httpMethod": "POST",
            "apiId": "1234567890",
            "protocol": "HTTP/1.1"
        },
        "body": "iVBOR/8A",
        "isBase64Encoded": true
    });
    lambda_http::request::from_str(&event.to_string()).unwrap()
}

/// One invocation, as the runtime makes it: ready, then called.
async fn invoke<S: Service<Request>>(service: &mut S, request: Request) -> S::Response
where
    S::Error: std::fmt::Debug,
{
    service.ready().await.unwrap().call(request).await.unwrap()
}

/// The layer of a route `thumbnails` (POST) over a SQLite file in `dir`.
fn thumbnails(dir: &tempfile::TempDir) -> idem_http::IdempotencyLayer {
    let store = SqliteStore::open(dir.path().join("idem.db"), SqliteOptions::default()).unwrap();
    Route::builder()
        .name("thumbnails")
        .methods([http::Method::POST])
        .layer(Arc::new(store))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_request_and_answer_are_replayed_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let layer = thumbnails(&dir);
    let calls = Arc::new(AtomicUsize::new(0));
    let function = {
        let calls = calls.clone();
        service_fn(move |request: Request| {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                // The function sees the bytes sent, not their base64.
                assert_eq!(request.body().as_ref(), IMAGE);
                let mut thumbnail = request.body().to_vec();
                thumbnail.reverse();
                Ok::<_, lambda_http::Error>(Response::new(Body::Binary(thumbnail)))
            }
        })
    };
    let mut service = IdempotencyLayer::from(layer).layer(function);

    let first = invoke(&mut service, rest_event(Some("thumb-1"))).await;
    let again = invoke(&mut service, rest_event(Some("thumb-1"))).await;
    let mut reversed = IMAGE.to_vec();
    reversed.reverse();
    assert_eq!(first.status(), 200);
    assert_eq!(first.body(), &Body::Binary(reversed.clone()));
    assert_eq!(again.body(), &Body::Binary(reversed));
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let keyless = invoke(&mut service, rest_event(None)).await;
    assert_eq!(keyless.status(), 400);
    let Body::Text(problem) = keyless.body() else {
        panic!("a problem document is text: {:?}", keyless.body());
    };
    assert!(problem.contains("missing-key"), "{problem}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// `Prefer: respond-async` is not honoured on Lambda: the environment is
/// frozen once the answer is sent, so an attempt left running after a 202
/// would be frozen mid-effect. The function runs and its own answer comes
/// back, recorded and replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn respond_async_is_answered_when_the_function_ends() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let function = {
        let calls = calls.clone();
        service_fn(move |_: Request| {
            let calls = calls.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, lambda_http::Error>(Response::new(Body::Binary(IMAGE.to_vec())))
            }
        })
    };
    let mut service = IdempotencyLayer::from(thumbnails(&dir)).layer(function);
    let asking = || {
        let mut request = rest_event(Some("thumb-async"));
        let prefer = http::HeaderValue::from_static("respond-async");
        request.headers_mut().insert("prefer", prefer);
        // A caller with a credential, who would get a 202 elsewhere (an
        // anonymous one never does).
        let bearer = http::HeaderValue::from_static("Bearer caller-7");
        request.headers_mut().insert("authorization", bearer);
        request
    };
    let first = invoke(&mut service, asking()).await;
    assert_eq!(first.status(), 200, "{first:?}");
    assert!(
        !first.headers().contains_key("preference-applied"),
        "{first:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "ran before it answered");
    let again = invoke(&mut service, asking()).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// The invocation's remaining time bounds the lease, as it does an SQS
/// record's: with 3 s left (less the 500 ms margin) the function is given
/// at most 2.5 s by the layer ([`LeaseDeadline`], the lease's end), where
/// an invocation with minutes left, or none known, gets the route's 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_ends_before_the_invocation_does() {
    let dir = tempfile::tempdir().unwrap();
    let layer = thumbnails(&dir);
    let given = Arc::new(std::sync::Mutex::new(None));
    let function = {
        let given = given.clone();
        service_fn(move |request: Request| {
            let left = request
                .extensions()
                .get::<LeaseDeadline>()
                .map(|d| d.0.saturating_duration_since(Instant::now()));
            *given.lock().unwrap() = left;
            async { Ok::<_, lambda_http::Error>(Response::new(Body::from("done"))) }
        })
    };
    let mut service = IdempotencyLayer::from(layer).layer(function);
    // (key, time left in the invocation, what the function may be given)
    let cases = [
        ("near", Some(Duration::from_secs(3)), 1_500..=2_500),
        ("far", Some(Duration::from_secs(600)), 25_000..=30_000),
        ("unknown", None, 25_000..=30_000),
    ];
    for (key, left, bound_ms) in cases {
        let mut request = rest_event(Some(key));
        if let Some(left) = left {
            let mut context = lambda_runtime::Context::default();
            let deadline = SystemTime::now() + left;
            context.deadline = deadline.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
            request = request.with_lambda_context(context);
        }
        let answer = invoke(&mut service, request).await;
        assert_eq!(answer.status(), 200, "{key}");
        let given_ms = given.lock().unwrap().take().unwrap().as_millis() as u64;
        assert!(bound_ms.contains(&given_ms), "{key}: given {given_ms} ms");
    }
}
