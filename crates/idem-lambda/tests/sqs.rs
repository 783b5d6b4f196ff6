//! SQS-triggered functions invoked with the runtime's own event types
//! (`SqsEvent` read from JSON shaped as Lambda delivers it) against real
//! stores: an SQLite file, and a DynamoDB table on moto.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use idem_core::{
    AttemptOutcome, Clock, CompletionTable, Dedup, LeaseExpiry, ManualClock, Policy, RecordId,
    Scope, State, Store, Timestamp,
};
use idem_lambda::{RejectQueue, RejectedTo, SqsRunOnce, Verdict};
use idem_message::{
    Attempt, IntentSpec, KeyTemplate, PayloadFingerprint, RejectReason, Reply, RunOnce,
};
use idem_sqlite::{SqliteOptions, SqliteStore};
use idem_testkit::services::Service;
use idem_testkit::trap_clock::TrapClock;
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};
use tokio::sync::Notify;

const RETENTION_S: u64 = 60;
const START_MS: u64 = 1_700_000_000_000;

/// Effects run per key, in order.
#[derive(Default)]
struct Ledger(Mutex<Vec<String>>);

impl Ledger {
    fn ran(&self, key: &str) -> usize {
        self.0.lock().unwrap().iter().filter(|k| *k == key).count()
    }
}

/// The function's one handler: key `pay:{/id}`, the send time excluded.
fn handler(store: Arc<dyn Store>) -> SqsRunOnce {
    let policy = Policy::new(30_000, RETENTION_S, 3_600, LeaseExpiry::Reconcile).unwrap();
    let runner = RunOnce::new(
        store,
        policy,
        CompletionTable::new([], Dedup::Idem).unwrap(),
    );
    let spec = IntentSpec::new(
        scope(),
        KeyTemplate::parse("pay:{/id}").unwrap(),
        PayloadFingerprint::json(vec!["/sent_at".parse().unwrap()]),
    );
    SqsRunOnce::new(runner, spec)
}

fn scope() -> Scope {
    Scope::from_parts("payouts", "ledger", None).unwrap()
}

/// One record as Lambda delivers it from a standard queue, or from a FIFO
/// queue when `group` is given.
fn record(message_id: &str, body: &Value, group: Option<&str>) -> Value {
    let mut attributes = json!({
        "ApproximateReceiveCount": "1",
        "SentTimestamp": "1700000000000",
        "SenderId": "AIDAIENQZJOLO23YVJ4VO",
        "ApproximateFirstReceiveTimestamp": "1700000000001"
    });
    if let Some(group) = group {
        attributes["MessageGroupId"] = json!(group);
        attributes["MessageDeduplicationId"] = json!(message_id);
    }
    json!({
        "messageId": message_id,
        "receiptHandle": format!("AQEB{message_id}"),
        "body": body.to_string(),
        "attributes": attributes,
        "messageAttributes": {},
        "md5OfBody": "e4e68fb7bd0e697a0ae8f1bb342846b3",
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:payouts",
        "awsRegion": "us-east-1"
    })
}

fn event(records: Vec<Value>, deadline_in: Duration) -> LambdaEvent<SqsEvent> {
    let payload: SqsEvent = serde_json::from_value(json!({ "Records": records })).unwrap();
    let mut context = Context::default();
    context.request_id = "8f5c3a1e-0d6b-4d39-9d43-1c2b7f0e9a11".to_owned();
    let deadline = SystemTime::now() + deadline_in;
    context.deadline = deadline.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    LambdaEvent::new(payload, context)
}

fn pay(id: &str, amount: &str, sent_at: u64) -> Value {
    json!({ "id": id, "amount": amount, "sent_at": sent_at })
}

fn failed(response: &SqsBatchResponse) -> BTreeSet<String> {
    response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect()
}

fn ids(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| (*s).to_owned()).collect()
}

/// The effect: notes the key; a body with `"flaky": true` was never sent
/// (the key is released).
fn effect<'a>(
    ledger: &'a Ledger,
) -> impl Fn(
    SqsMessage,
    Attempt,
) -> Pin<Box<dyn Future<Output = Result<Reply, AttemptOutcome>> + Send + 'a>>
+ 'a {
    move |record, attempt| {
        let flaky = record
            .body
            .as_deref()
            .unwrap_or_default()
            .contains("\"flaky\"");
        Box::pin(async move {
            ledger
                .0
                .lock()
                .unwrap()
                .push(attempt.id.key.as_str().to_owned());
            if flaky {
                return Err(AttemptOutcome::NotSent);
            }
            Ok(Reply::status(201))
        })
    }
}

/// The scenario, on `store` read at `clock`; `stopped` is a store of the
/// same kind that no longer answers.
async fn mixed_batch(store: Arc<dyn Store>, clock: ManualClock, stopped: Arc<dyn Store>) {
    let function = handler(store.clone());
    let ledger = Ledger::default();
    let deadline = Duration::from_secs(60);

    // Done long ago (completed, then past its retention), and done just now.
    let once = |id: &'static str, body: Value| {
        let batch = event(vec![record(id, &body, None)], deadline);
        function.handle(batch, effect(&ledger))
    };
    assert!(failed(&once("m-old", pay("old", "5.00", 1)).await).is_empty());
    clock.advance_millis((RETENTION_S + 1) * 1_000);
    assert!(failed(&once("m-done", pay("done", "10.00", 1)).await).is_empty());

    // In flight: another invocation runs `busy` with a long effect.
    let started = Arc::new(Notify::new());
    let finish = Arc::new(Notify::new());
    let other = {
        let (function, started, finish) = (handler(store.clone()), started.clone(), finish.clone());
        tokio::spawn(async move {
            let batch = event(
                vec![record("m-busy-1", &pay("busy", "7.00", 1), None)],
                deadline,
            );
            function
                .handle(batch, |_, _| {
                    let (started, finish) = (started.clone(), finish.clone());
                    async move {
                        started.notify_one();
                        finish.notified().await;
                        Ok(Reply::status(201))
                    }
                })
                .await
        })
    };
    started.notified().await;

    let records = vec![
        record("m-new", &pay("new", "1.00", 2), None),
        record("m-done-again", &pay("done", "10.00", 2), None),
        record("m-busy-2", &pay("busy", "7.00", 2), None),
        record("m-reused", &pay("done", "999.00", 2), None),
        record("m-nokey", &json!({ "amount": "3.00" }), None),
        record("m-old-again", &pay("old", "5.00", 2), None),
        record("m-flaky", &json!({ "id": "flaky", "flaky": true }), None),
    ];
    let batch = event(records.clone(), deadline);
    let reports = function
        .run_batch(&batch.payload, &batch.context, effect(&ledger))
        .await;
    let response = idem_lambda::batch_response(&reports);
    assert_eq!(
        failed(&response),
        ids(&["m-busy-2", "m-reused", "m-nokey", "m-flaky"]),
        "{reports:#?}"
    );
    let verdict = |id: &str| &reports.iter().find(|r| r.message_id == id).unwrap().verdict;
    assert!(matches!(
        verdict("m-reused"),
        Verdict::Rejected {
            reason: RejectReason::KeyReused { .. },
            to: RejectedTo::Redrive
        }
    ));
    assert!(matches!(
        verdict("m-old-again"),
        Verdict::Rejected {
            reason: RejectReason::Late { .. },
            to: RejectedTo::Dropped
        }
    ));
    assert_eq!(function.late_dropped(), 1);
    // Each intent ran once; the in-flight one not here, the flaky one was
    // tried and released.
    for (key, runs) in [
        ("pay:new", 1),
        ("pay:done", 1),
        ("pay:old", 1),
        ("pay:busy", 0),
        ("pay:flaky", 1),
    ] {
        assert_eq!(ledger.ran(key), runs, "{key}");
    }

    // The other invocation finishes: the failed records come back and
    // settle; nothing runs twice.
    finish.notify_one();
    assert!(failed(&other.await.unwrap()).is_empty());
    let again = function
        .handle(event(records.clone(), deadline), effect(&ledger))
        .await;
    assert_eq!(failed(&again), ids(&["m-reused", "m-nokey", "m-flaky"]));
    assert_eq!(ledger.ran("pay:busy"), 0);
    assert_eq!(ledger.ran("pay:new"), 1);
    assert_eq!(ledger.ran("pay:flaky"), 2);

    // A function whose store stopped answering runs nothing and fails
    // every record: each comes back.
    let before = ledger.0.lock().unwrap().len();
    let down = handler(stopped)
        .handle(event(records, deadline), effect(&ledger))
        .await;
    let all = ids(&[
        "m-new",
        "m-done-again",
        "m-busy-2",
        "m-reused",
        "m-nokey",
        "m-old-again",
        "m-flaky",
    ]);
    assert_eq!(failed(&down), all);
    assert_eq!(
        ledger.0.lock().unwrap().len(),
        before,
        "nothing ran on a stopped store"
    );
}

fn sqlite(dir: &tempfile::TempDir, name: &str, clock: Arc<dyn Clock>) -> Arc<SqliteStore> {
    let path = dir.path().join(name);
    Arc::new(SqliteStore::open_with_clock(path, SqliteOptions::default(), clock).unwrap())
}

/// A SQLite store that answers nothing any more.
fn stopped_sqlite(dir: &tempfile::TempDir) -> Arc<dyn Store> {
    let trap = TrapClock::new(Timestamp::from_millis(START_MS));
    let store = sqlite(dir, "stopped.db", Arc::new(trap.clone()));
    trap.arm();
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_batch_fails_exactly_the_records_that_must_come_back_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_millis(START_MS));
    let store = sqlite(&dir, "idem.db", Arc::new(clock.clone()));
    mixed_batch(store, clock, stopped_sqlite(&dir)).await;
}

/// A DynamoDB table on moto, and a second table deleted under its store:
/// every request of that store fails as a table gone or unreachable does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_batch_fails_exactly_the_records_that_must_come_back_dynamodb() {
    let clock = ManualClock::new(Timestamp::from_millis(START_MS));
    let (store, _) = dynamo_table("mixed", Arc::new(clock.clone())).await;
    let (stopped, client) = dynamo_table("stopped", Arc::new(clock.clone())).await;
    client
        .delete_table()
        .table_name(stopped.table_name())
        .send()
        .await
        .unwrap();
    mixed_batch(store, clock, stopped).await;
}

async fn dynamo_table(
    tag: &str,
    clock: Arc<dyn Clock>,
) -> (Arc<idem_dynamodb::DynamoStore>, aws_sdk_dynamodb::Client) {
    let endpoint = Service::Moto.endpoint();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let url = idem_dynamodb::DynamoUrl::parse(&format!(
        "dynamodb://idem-lambda-{tag}-{}-{nanos}?region=us-east-1&endpoint={endpoint}&clock_skew_ms=0",
        std::process::id()
    ))
    .unwrap();
    let client = idem_dynamodb::emulator_client(&url, &endpoint);
    idem_dynamodb::create_table(&client, &url).await.unwrap();
    let store = idem_dynamodb::DynamoStore::with_client(client.clone(), &url, clock)
        .await
        .unwrap();
    (Arc::new(store), client)
}

/// FIFO: a group's records run in order, and once one fails the rest of
/// that group are failed without running; other groups go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fifo_record_fails_the_rest_of_its_group_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(
        &dir,
        "idem.db",
        Arc::new(ManualClock::new(Timestamp::from_millis(START_MS))),
    );
    let function = handler(store);
    let ledger = Ledger::default();
    let records = vec![
        record("a1", &pay("a1", "1.00", 1), Some("a")),
        record("b1", &pay("b1", "1.00", 1), Some("b")),
        record("a2", &json!({ "id": "a2", "flaky": true }), Some("a")),
        record("b2", &pay("b2", "1.00", 1), Some("b")),
        record("a3", &pay("a3", "1.00", 1), Some("a")),
        record("s1", &pay("s1", "1.00", 1), None),
    ];
    let batch = event(records, Duration::from_secs(60));
    let reports = function
        .run_batch(&batch.payload, &batch.context, effect(&ledger))
        .await;
    assert_eq!(
        failed(&idem_lambda::batch_response(&reports)),
        ids(&["a2", "a3"])
    );
    assert!(matches!(&reports[4].verdict, Verdict::GroupBlocked { group } if group == "a"));
    for (key, runs) in [
        ("pay:a1", 1),
        ("pay:a2", 1),
        ("pay:a3", 0),
        ("pay:b1", 1),
        ("pay:b2", 1),
        ("pay:s1", 1),
    ] {
        assert_eq!(ledger.ran(key), runs, "{key}");
    }
    let ran = ledger.0.lock().unwrap().clone();
    let at = |key: &str| ran.iter().position(|k| k == key).unwrap();
    assert!(
        at("pay:a1") < at("pay:a2") && at("pay:b1") < at("pay:b2"),
        "{ran:?}"
    );
}

/// Remaining time bounds the lease: an invocation with 3 s left (less the
/// 500 ms margin) leaves a record leased for at most 2.5 s, not the
/// policy's 30 s; one with minutes left gets the policy's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_ends_before_the_invocation_does() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_millis(START_MS));
    let store = sqlite(&dir, "idem.db", Arc::new(clock.clone()));
    let function = handler(store.clone());
    for (id, left, lease_ms) in [
        ("near", Duration::from_secs(3), 2_000..=2_500),
        ("far", Duration::from_secs(600), 30_000..=30_000),
    ] {
        let seen = Mutex::new(None);
        let batch = event(vec![record(id, &pay(id, "1.00", 1), None)], left);
        let response = function
            .handle(batch, |_, attempt| {
                let (store, seen) = (store.clone(), &seen);
                async move {
                    let record = store.get(&attempt.id).await.unwrap().unwrap();
                    assert_eq!(record.state, State::InProgress);
                    *seen.lock().unwrap() = Some(record.lease_until);
                    Ok(Reply::status(201))
                }
            })
            .await;
        assert!(failed(&response).is_empty());
        let lease_until = seen.lock().unwrap().unwrap();
        let leased = lease_until.as_millis() - clock.now().as_millis();
        assert!(lease_ms.contains(&leased), "{id}: leased {leased} ms");
        let done = store
            .get(&RecordId {
                scope: scope(),
                key: idem_core::IdempotencyKey::new(format!("pay:{id}")).unwrap(),
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(done.state, State::Completed);
    }
}

/// A dead-letter queue of the function's own: a reused key is sent there
/// with its reason and reported success; a send that fails leaves it
/// failed, so it is never dropped unrecorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_record_goes_to_the_dead_letter_queue_when_one_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(
        &dir,
        "idem.db",
        Arc::new(ManualClock::new(Timestamp::from_millis(START_MS))),
    );
    let ledger = Ledger::default();
    let deadline = Duration::from_secs(60);
    let first = handler(store.clone())
        .handle(
            event(vec![record("m-1", &pay("x", "1.00", 1), None)], deadline),
            effect(&ledger),
        )
        .await;
    assert!(failed(&first).is_empty());
    for (up, failures) in [(true, ids(&[])), (false, ids(&["m-2", "m-3"]))] {
        let queue = Arc::new(Queue {
            up,
            sent: Mutex::default(),
        });
        let function = handler(store.clone()).with_dead_letter_queue(queue.clone());
        let batch = vec![
            record("m-2", &pay("x", "2.00", 1), None),
            record("m-3", &json!({}), None),
        ];
        let response = function
            .handle(event(batch, deadline), effect(&ledger))
            .await;
        assert_eq!(failed(&response), failures);
        // Records run concurrently: in the order they were sent.
        let mut sent = queue.sent.lock().unwrap().clone();
        sent.sort();
        let expected: Vec<&str> = if up { vec!["m-2", "m-3"] } else { vec![] };
        assert_eq!(
            sent.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
            expected
        );
        if up {
            assert!(
                sent[0].1.contains("already used by a different payload"),
                "{sent:?}"
            );
        }
    }
    assert_eq!(ledger.ran("pay:x"), 1);
}

/// A dead-letter queue in memory, standing for the SQS client's
/// `SendMessage`: up, or refusing every send.
struct Queue {
    up: bool,
    sent: Mutex<Vec<(String, String)>>,
}

impl RejectQueue for Queue {
    fn send<'a>(
        &'a self,
        record: &'a SqsMessage,
        reason: &'a RejectReason,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>> {
        Box::pin(async move {
            if !self.up {
                return Err("the queue refused the message".to_owned());
            }
            let id = record.message_id.clone().unwrap_or_default();
            self.sent.lock().unwrap().push((id, reason.to_string()));
            Ok(())
        })
    }
}

/// Records of a standard queue run concurrently, never more at once than
/// the bound: with a bound of 2, each effect waits for a second one to
/// start (so two do run together), and no third ever starts beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_run_concurrently_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_millis(START_MS));
    let function = handler(sqlite(&dir, "idem.db", Arc::new(clock))).with_concurrency(2);
    let running = std::sync::atomic::AtomicUsize::new(0);
    let most = std::sync::atomic::AtomicUsize::new(0);
    let pairs = tokio::sync::Barrier::new(2);
    let records = (0..6)
        .map(|i| record(&format!("m-{i}"), &pay(&format!("c{i}"), "1.00", 1), None))
        .collect();
    let response = function
        .handle(event(records, Duration::from_secs(60)), |_, _| {
            let (running, most, pairs) = (&running, &most, &pairs);
            async move {
                use std::sync::atomic::Ordering::SeqCst;
                most.fetch_max(running.fetch_add(1, SeqCst) + 1, SeqCst);
                let met = tokio::time::timeout(Duration::from_secs(10), pairs.wait()).await;
                running.fetch_sub(1, SeqCst);
                match met {
                    Ok(_) => Ok(Reply::status(201)),
                    Err(_) => Err(AttemptOutcome::NotSent),
                }
            }
        })
        .await;
    assert!(
        failed(&response).is_empty(),
        "an effect ran alone: {response:?}"
    );
    assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// The ready-made dead-letter queue over aws-sdk-sqs, against a real SQS
/// queue on moto (a FIFO one, so the group and deduplication id are sent
/// too): a reused key is sent there with its body, its own attributes and
/// the reason as `Idem-Reason` / `Idem-Reason-Detail`, and reported
/// success; with the queue gone the send fails and the record is reported
/// failed, so it is not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_record_is_sent_to_a_real_sqs_queue_with_its_reason() {
    use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(
        &dir,
        "idem.db",
        Arc::new(ManualClock::new(Timestamp::from_millis(START_MS))),
    );
    let client = idem_testkit::sqs::client();
    let name = format!("idem-lambda-dead-{}.fifo", std::process::id());
    let url = client
        .create_queue()
        .queue_name(&name)
        .attributes(QueueAttributeName::FifoQueue, "true")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let queue = Arc::new(idem_lambda::SqsQueue::new(client.clone(), url.clone()));
    let ledger = Ledger::default();
    let deadline = Duration::from_secs(60);
    let function = handler(store).with_dead_letter_queue(queue);
    let first = event(
        vec![record("m-1", &pay("x", "1.00", 1), Some("g"))],
        deadline,
    );
    assert!(failed(&function.handle(first, effect(&ledger)).await).is_empty());
    let mut reused = record("m-2", &pay("x", "2.00", 1), Some("g"));
    reused["messageAttributes"] = json!({
        "tenant": { "stringValue": "acme", "dataType": "String" }
    });
    let response = function
        .handle(event(vec![reused.clone()], deadline), effect(&ledger))
        .await;
    assert!(failed(&response).is_empty(), "sent, so not failed");
    assert_eq!(ledger.ran("pay:x"), 1);

    let got = client
        .receive_message()
        .queue_url(&url)
        .message_attribute_names("All")
        .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
        .wait_time_seconds(1)
        .send()
        .await
        .unwrap();
    let messages = got.messages.unwrap_or_default();
    assert_eq!(messages.len(), 1, "{messages:?}");
    let copy = &messages[0];
    assert_eq!(copy.body(), reused["body"].as_str());
    let attribute = |name: &str| {
        copy.message_attributes()
            .and_then(|a| a.get(name))
            .and_then(|v| v.string_value())
            .map(str::to_owned)
    };
    assert_eq!(attribute("Idem-Reason").as_deref(), Some("key-reused"));
    assert!(
        attribute("Idem-Reason-Detail")
            .unwrap()
            .contains("different payload")
    );
    assert_eq!(attribute("tenant").as_deref(), Some("acme"));
    let group = copy
        .attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
        .cloned();
    assert_eq!(group.as_deref(), Some("g"));

    client.delete_queue().queue_url(&url).send().await.unwrap();
    let response = function
        .handle(event(vec![reused], deadline), effect(&ledger))
        .await;
    assert_eq!(failed(&response), ids(&["m-2"]), "a failed send is retried");
    assert_eq!(ledger.ran("pay:x"), 1);
}
