//! What idem adds to a Lambda function, against the same handler without
//! it, in one run: the cold start (building the store client, then the
//! first invocation) and each later invocation, for an SQS batch and for
//! an HTTP request. Figures to read, not limits: docs/lambda.md has them.
//!
//! ```text
//! cargo run --release -p idem-lambda --example overhead
//! cargo run --release -p idem-lambda --example overhead -- http://127.0.0.1:4568
//! ```
//!
//! With an endpoint, the store is also a DynamoDB table on that emulator
//! (created before the clock starts: a table is made at deploy time).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a bench fails by panicking"
)]

use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use idem_core::{CompletionTable, Dedup, Policy, Scope, Store, SystemClock};
use idem_http::Route;
use idem_lambda::{IdempotencyLayer, SqsRunOnce};
use idem_message::{IntentSpec, KeyTemplate, PayloadFingerprint, Reply, RunOnce};
use lambda_http::{Body, Request, Response, Service, service_fn, tower::Layer};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::json;

const COLD_RUNS: usize = 15;
const INVOCATIONS: u32 = 300;
const BATCH: usize = 10;

type Opener = Box<dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = Arc<dyn Store>>>>>;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let endpoint = std::env::args().nth(1);
    let dir = tempfile::tempdir().unwrap();
    let mut stores: Vec<(&str, Opener)> = Vec::new();
    let sqlite_dir = dir.path().to_owned();
    let opened = Arc::new(AtomicU64::new(0));
    stores.push((
        "sqlite",
        Box::new(move || {
            let n = opened.fetch_add(1, Ordering::Relaxed);
            let path = sqlite_dir.join(format!("idem-{n}.db"));
            Box::pin(async move {
                let store = idem_sqlite::SqliteStore::open(path, Default::default()).unwrap();
                Arc::new(store) as Arc<dyn Store>
            })
        }),
    ));
    if let Some(endpoint) = endpoint {
        let url = table(&endpoint).await;
        stores.push((
            "dynamodb",
            Box::new(move || {
                let url = url.clone();
                Box::pin(async move {
                    let clock = Arc::new(SystemClock);
                    let store = idem_dynamodb::DynamoStore::open(&url, clock).await.unwrap();
                    Arc::new(store) as Arc<dyn Store>
                })
            }),
        ));
    }
    println!(
        "{:<9} {:<36} {:>10} {:>10} {:>10} {:>7}",
        "store", "measure", "plain", "idem", "added", "ratio"
    );
    for (name, open) in &stores {
        cold_start(name, open).await;
        let store = open().await;
        sqs_invocations(name, store.clone(), 1).await;
        sqs_invocations(name, store.clone(), BATCH).await;
        http_invocations(name, store).await;
    }
}

/// Opening the store and building the handler, then the first invocation,
/// against the first invocation of the plain handler: medians of
/// [`COLD_RUNS`] fresh builds.
async fn cold_start(name: &str, open: &Opener) {
    let (mut plain, mut idem, mut build) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..COLD_RUNS {
        let started = Instant::now();
        let _ = plain_handler(batch(&format!("cold-{run}"), 1)).await;
        plain.push(started.elapsed());
        let started = Instant::now();
        let function = handler(open().await);
        build.push(started.elapsed());
        let response = function.handle(batch(&format!("cold-{run}"), 1), pay).await;
        assert!(response.batch_item_failures.is_empty());
        idem.push(started.elapsed());
    }
    let (plain, idem, build) = (median(plain), median(idem), median(build));
    row(name, "cold: build store + 1st invocation", plain, idem);
    println!(
        "{name:<9} {:<36} {:>10} {:>10}",
        "  of which building the store",
        "",
        micros(build)
    );
}

/// [`INVOCATIONS`] warm invocations of `records` new records each.
async fn sqs_invocations(name: &str, store: Arc<dyn Store>, records: usize) {
    let function = handler(store);
    let started = Instant::now();
    for n in 0..INVOCATIONS {
        let _ = plain_handler(batch(&format!("plain-{records}-{n}"), records)).await;
    }
    let plain = started.elapsed() / INVOCATIONS;
    let started = Instant::now();
    for n in 0..INVOCATIONS {
        let response = function
            .handle(batch(&format!("warm-{records}-{n}"), records), pay)
            .await;
        assert!(response.batch_item_failures.is_empty());
    }
    let idem = started.elapsed() / INVOCATIONS;
    row(
        name,
        &format!("sqs: invocation of {records} new record(s)"),
        plain,
        idem,
    );
}

/// [`INVOCATIONS`] HTTP requests with new keys, then as many replays.
async fn http_invocations(name: &str, store: Arc<dyn Store>) {
    let bare = service_fn(|_: Request| async {
        Ok::<_, lambda_http::Error>(
            Response::builder()
                .status(201)
                .body(Body::from("paid"))
                .unwrap(),
        )
    });
    let layer = Route::builder().name("payouts").layer(store).unwrap();
    let mut protected = IdempotencyLayer::from(layer).layer(bare);
    let mut bare = bare;
    let plain = time_requests(&mut bare, "bare").await;
    let idem = time_requests(&mut protected, "new").await;
    row(name, "http: request, new key", plain, idem);
    let replayed = time_requests(&mut protected, "new").await;
    row(name, "http: request, replayed", plain, replayed);
}

async fn time_requests<S>(service: &mut S, tag: &str) -> Duration
where
    S: Service<Request, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    let started = Instant::now();
    for n in 0..INVOCATIONS {
        let request = http::Request::post("/payouts")
            .header("idempotency-key", format!("{tag}-{n}"))
            .header("content-type", "application/json")
            .body(Body::from(r#"{"amount": "1.00"}"#))
            .unwrap();
        poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
        let response = service.call(request).await.unwrap();
        assert_eq!(response.status(), 201);
    }
    started.elapsed() / INVOCATIONS
}

fn handler(store: Arc<dyn Store>) -> SqsRunOnce {
    let runner = RunOnce::new(
        store,
        Policy::DEFAULT,
        CompletionTable::new([], Dedup::Idem).unwrap(),
    );
    let spec = IntentSpec::new(
        Scope::from_parts("payouts", "bench", None).unwrap(),
        KeyTemplate::parse("pay:{/id}").unwrap(),
        PayloadFingerprint::json(Vec::new()),
    );
    SqsRunOnce::new(runner, spec)
}

/// The handler without idem: the same effect for every record.
async fn plain_handler(event: LambdaEvent<SqsEvent>) -> SqsBatchResponse {
    for record in event.payload.records {
        let body: serde_json::Value =
            serde_json::from_str(record.body.as_deref().unwrap_or("{}")).unwrap();
        std::hint::black_box(body);
    }
    SqsBatchResponse::default()
}

async fn pay(
    record: SqsMessage,
    _: idem_message::Attempt,
) -> Result<Reply, idem_core::AttemptOutcome> {
    std::hint::black_box(record);
    Ok(Reply::status(201))
}

fn batch(tag: &str, records: usize) -> LambdaEvent<SqsEvent> {
    let records: Vec<_> = (0..records)
        .map(|i| {
            json!({
                "messageId": format!("{tag}-{i}"),
                "receiptHandle": "AQEB",
                "body": json!({ "id": format!("{tag}-{i}"), "amount": "1.00" }).to_string(),
                "attributes": { "ApproximateReceiveCount": "1" },
                "messageAttributes": {},
                "eventSource": "aws:sqs"
            })
        })
        .collect();
    let payload = serde_json::from_value(json!({ "Records": records })).unwrap();
    let mut context = Context::default();
    let deadline = SystemTime::now() + Duration::from_secs(60);
    context.deadline = deadline.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    LambdaEvent::new(payload, context)
}

async fn table(endpoint: &str) -> idem_dynamodb::DynamoUrl {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let url = idem_dynamodb::DynamoUrl::parse(&format!(
        "dynamodb://idem-lambda-bench-{nanos}?region=us-east-1&endpoint={endpoint}"
    ))
    .unwrap();
    let client = idem_dynamodb::emulator_client(&url, endpoint);
    idem_dynamodb::create_table(&client, &url).await.unwrap();
    url
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn micros(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

fn row(store: &str, what: &str, plain: Duration, idem: Duration) {
    let ratio = idem.as_secs_f64() / plain.as_secs_f64().max(1e-9);
    let added = micros(idem.saturating_sub(plain));
    println!(
        "{store:<9} {what:<36} {:>10} {:>10} {added:>10} {ratio:>6.0}x",
        micros(plain),
        micros(idem)
    );
}
