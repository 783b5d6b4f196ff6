//! The function invoked as API Gateway invokes it: an HTTP API (payload
//! 2.0) event read from JSON, turned into lambda_http's request the way
//! the runtime turns it, twice with one key: one payout, and the second
//! answer is the first one replayed.
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::sync::Arc;

use lambda_http::aws_lambda_events::apigw::ApiGatewayV2httpRequest;
use lambda_http::request::LambdaRequest;
use lambda_http::{Body, Request, Service};
use lambda_http_payouts::{Ledger, function, open_store};
use serde_json::json;

/// An HTTP API event as API Gateway sends it to the function.
fn event(key: &str, body: &str) -> Request {
    let event: ApiGatewayV2httpRequest = serde_json::from_value(json!({
        "version": "2.0",
        "routeKey": "POST /payouts",
        "rawPath": "/payouts",
        "rawQueryString": "",
        "headers": {
            "content-type": "application/json",
            "idempotency-key": key,
            "host": "abc123.execute-api.us-east-1.amazonaws.com",
            "x-forwarded-proto": "https"
        },
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "abc123",
            "domainName": "abc123.execute-api.us-east-1.amazonaws.com",
            "domainPrefix": "abc123",
            "http": {
                "method": "POST",
                "path": "/payouts",
                "protocol": "HTTP/1.1",
                "sourceIp": "203.0.113.7",
                "userAgent": "curl/8.5.0"
            },
            "requestId": "JKJaXmPLvHcESHA=",
            "routeKey": "POST /payouts",
            "stage": "$default",
            "time": "05/Dec/2026:12:00:00 +0000",
            "timeEpoch": 1_796_472_000_000_u64
        },
        "body": body,
        "isBase64Encoded": false
    }))
    .unwrap();
    LambdaRequest::ApiGatewayV2(event).into()
}

async fn invoke<S: Service<Request>>(service: &mut S, request: Request) -> S::Response
where
    S::Error: std::fmt::Debug,
{
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    service.call(request).await.unwrap()
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
