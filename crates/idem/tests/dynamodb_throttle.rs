//! `idem serve` on a DynamoDB table that throttles: a claim that DynamoDB
//! refuses with a throttling error answers 503 `store-unavailable` and
//! forwards nothing, and the gateway serves again once the throttling stops.
//! No emulator throttles, so the table here is a fake endpoint in the test
//! process that speaks just enough of DynamoDB's JSON protocol: the table's
//! description and its meta item always, a throttling error for every other
//! request until it is told to stop. The gateway reads the suspect window's
//! item before it serves, and that read is throttled too: the first request
//! waits for it (the SDK's retries), then meets the throttled claim.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};
use support::{Gateway, Upstream, key, post};

const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;

/// The two errors DynamoDB throttles with, and what it says: a table or
/// index over its provisioned capacity, and a request rate over a limit.
const THROTTLING_ERRORS: [(&str, &str); 2] = [
    (
        "ProvisionedThroughputExceededException",
        "The level of configured provisioned throughput for the table was exceeded.",
    ),
    (
        "ThrottlingException",
        "Rate of requests exceeds the allowed throughput.",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_claim_answers_503_forwards_nothing_and_recovers() {
    for throttle in THROTTLING_ERRORS {
        let (error, _) = throttle;
        let fake = FakeDynamo::start(throttle).await;
        let up = Upstream::start().await;
        let store = format!(
            "dynamodb://throttled?region=us-east-1&endpoint=http://{}",
            fake.addr
        );
        let gw = Gateway::start_url(&up.url(), &store, None);

        let refused = post(&gw.url("/payouts"), &[key("throttled-1")], PAYOUT).await;
        assert_eq!(refused.status, 503, "{error}: {refused:?}");
        assert_eq!(
            refused.problem().as_deref(),
            Some("urn:idem:problem:store-unavailable"),
            "{error}: {refused:?}"
        );
        assert_eq!(refused.header("retry-after"), Some("1"), "{error}");
        // The refusal is DynamoDB's, read as such: not a request the fake
        // failed to understand, nor an answer the SDK failed to read.
        assert!(refused.body.contains(error), "{error}: {refused:?}");
        assert_eq!(up.hits(), 0, "{error}: forwarded without a claim");
        // The SDK's standard retries (3 attempts in all) retry a throttled
        // write; the gateway itself claims once.
        let puts = fake.requests("PutItem");
        assert!(
            puts > 1,
            "{error}: PutItem sent {puts} time(s), not retried"
        );

        fake.stop_throttling();
        let served = post(&gw.url("/payouts"), &[key("throttled-1")], PAYOUT).await;
        assert_eq!(served.status, 201, "{error}: {served:?}\n{}", gw.logs());
        assert_eq!(served.header("idempotent-replayed"), None, "{error}");
        assert_eq!(up.effects().len(), 1, "{error}: the upstream's effects");
    }
}

/// A DynamoDB endpoint on loopback that answers for one table of idem's
/// layout and throttles every request on its items (but the meta item's
/// read) until [`FakeDynamo::stop_throttling`]; then it accepts every write
/// and holds nothing, which is all one fresh claim and its completion need.
struct FakeDynamo {
    addr: SocketAddr,
    state: Arc<Mutex<Fake>>,
}

#[derive(Default)]
struct Fake {
    /// The error (code, message) every request on an item answers, `None`
    /// once stopped.
    throttle: Option<(&'static str, &'static str)>,
    /// Requests received, by operation (`PutItem`, `Query`, …).
    requests: HashMap<String, usize>,
}

impl FakeDynamo {
    async fn start(throttle: (&'static str, &'static str)) -> FakeDynamo {
        let state = Arc::new(Mutex::new(Fake {
            throttle: Some(throttle),
            requests: HashMap::new(),
        }));
        let app = axum::Router::new()
            .route("/", axum::routing::post(answer))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        FakeDynamo { addr, state }
    }

    fn requests(&self, operation: &str) -> usize {
        let state = self.state.lock().unwrap();
        state.requests.get(operation).copied().unwrap_or(0)
    }

    fn stop_throttling(&self) {
        self.state.lock().unwrap().throttle = None;
    }
}

/// One request of DynamoDB's JSON protocol: `X-Amz-Target` names the
/// operation, the body its input.
async fn answer(
    State(state): State<Arc<Mutex<Fake>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let operation = headers
        .get("x-amz-target")
        .and_then(|t| t.to_str().ok())
        .and_then(|t| t.strip_prefix("DynamoDB_20120810."))
        .unwrap_or("")
        .to_owned();
    let input: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let throttle = {
        let mut state = state.lock().unwrap();
        *state.requests.entry(operation.clone()).or_default() += 1;
        state.throttle
    };
    let meta = input["Key"]["pk"]["S"] == "meta";
    match (operation.as_str(), throttle) {
        ("DescribeTable", _) => reply(StatusCode::OK, described(&input["TableName"])),
        ("GetItem", _) if meta => reply(
            StatusCode::OK,
            json!({ "Item": { "pk": { "S": "meta" }, "layout": { "N": "1" } } }),
        ),
        ("GetItem" | "PutItem" | "DeleteItem" | "Query" | "Scan", Some((error, message))) => reply(
            StatusCode::BAD_REQUEST,
            json!({
                "__type": format!("com.amazonaws.dynamodb.v20120810#{error}"),
                "message": message,
            }),
        ),
        ("GetItem" | "PutItem" | "DeleteItem", None) => reply(StatusCode::OK, json!({})),
        ("Query" | "Scan", None) => reply(
            StatusCode::OK,
            json!({ "Items": [], "Count": 0, "ScannedCount": 0 }),
        ),
        (other, _) => reply(
            StatusCode::BAD_REQUEST,
            json!({
                "__type": "com.amazon.coral.service#UnknownOperationException",
                "message": format!("the fake does not answer {other:?}"),
            }),
        ),
    }
}

/// An ACTIVE table with idem's key and its two indexes, ACTIVE.
fn described(table: &Value) -> Value {
    let index = |name: &str, hash: &str, range: &str| {
        json!({
            "IndexName": name,
            "IndexStatus": "ACTIVE",
            "KeySchema": [
                { "AttributeName": hash, "KeyType": "HASH" },
                { "AttributeName": range, "KeyType": "RANGE" },
            ],
            "Projection": { "ProjectionType": "ALL" },
        })
    };
    json!({
        "Table": {
            "TableName": table,
            "TableStatus": "ACTIVE",
            "KeySchema": [{ "AttributeName": "pk", "KeyType": "HASH" }],
            "AttributeDefinitions": [
                { "AttributeName": "pk", "AttributeType": "S" },
                { "AttributeName": "amb", "AttributeType": "S" },
                { "AttributeName": "amb_sk", "AttributeType": "S" },
                { "AttributeName": "due_shard", "AttributeType": "S" },
                { "AttributeName": "due", "AttributeType": "N" },
            ],
            "GlobalSecondaryIndexes": [
                index("ambiguous", "amb", "amb_sk"),
                index("due", "due_shard", "due"),
            ],
        }
    })
}

fn reply(status: StatusCode, body: Value) -> Response {
    let content_type = [(header::CONTENT_TYPE, "application/x-amz-json-1.0")];
    (status, content_type, body.to_string()).into_response()
}
