//! The function invoked as API Gateway invokes it: an HTTP API (payload
//! 2.0) event read from JSON, turned into lambda_http's request the way
//! the runtime turns it, twice with one key: one payout, and the second
//! answer is the first one replayed.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::sync::Arc;

use lambda_http::aws_lambda_events::apigw::ApiGatewayV2httpRequest;
use lambda_http::request::LambdaRequest;
use lambda_http::tower::ServiceExt;
use lambda_http::{Body, Request, Service};
use lambda_http_payouts::{Ledger, function, open_store};
use serde_json::json;

/// The HTTP API event of `events/payout.json` (as API Gateway sends it,
/// and as `cargo lambda invoke --data-file` sends it) with `key` and
/// `body`, turned into lambda_http's request as the runtime turns it.
fn event(key: &str, body: &str) -> Request {
    let mut event: serde_json::Value =
        serde_json::from_str(include_str!("../events/payout.json")).unwrap();
    event["headers"]["idempotency-key"] = json!(key);
    event["body"] = json!(body);
    let event: ApiGatewayV2httpRequest = serde_json::from_value(event).unwrap();
    LambdaRequest::ApiGatewayV2(event).into()
}

/// One invocation, as the runtime makes it: ready, then called.
async fn invoke<S: Service<Request>>(service: &mut S, request: Request) -> S::Response
where
    S::Error: std::fmt::Debug,
{
    service.ready().await.unwrap().call(request).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_pays_once_and_is_marked_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path().join("idem.db").to_str().unwrap())
        .await
        .unwrap();
    let ledger = Arc::new(Ledger::default());
    let mut service = function(store, ledger.clone()).unwrap();
    let body = r#"{"seller": 847, "amount": "120.00"}"#;

    let first = invoke(&mut service, event("payout-847-w36", body)).await;
    let again = invoke(&mut service, event("payout-847-w36", body)).await;

    assert_eq!(ledger.paid(), 1);
    assert_eq!(first.status(), 201);
    assert_eq!(again.status(), 201);
    assert_eq!(first.headers().get("idempotent-replayed"), None);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(first.body(), &Body::Text(r#"{"payout": 1}"#.to_owned()));
    assert_eq!(again.body(), first.body());

    // Another body under the same key is refused, and pays nothing.
    let other = invoke(
        &mut service,
        event("payout-847-w36", r#"{"seller": 847, "amount": "999.00"}"#),
    )
    .await;
    assert_eq!(other.status(), 422, "{:?}", other.body());
    assert_eq!(ledger.paid(), 1);
}
