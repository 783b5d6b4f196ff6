//! What the `idem consume` tests over RabbitMQ share: the consumer's config
//! file, a plain lapin client that publishes and inspects the queues the
//! consumer declared (`<q>`, `<q>.retry`, `<q>.dead`, `<q>.late`), and the
//! counts the consumer logs when it stops.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lapin::message::BasicGetMessage;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

use super::Upstream;

/// The local broker, as the consumer and the tests reach it.
pub const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// A queue name no other test, run or process uses.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "idem-consume-{prefix}-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

/// One `[[subscription]]` of the consumer's config, with its
/// `[subscription.rabbitmq]` and, when `lookup` is set, its `[[lookup]]`.
/// Timings are short so that leases, retries and the reconciler act
/// within seconds.
#[derive(Clone, Debug)]
pub struct Sub {
    pub name: String,
    pub queue: String,
    pub key: String,
    /// The upstream path messages are delivered to.
    pub deliver: String,
    pub lease_ms: u64,
    pub response_timeout_ms: u64,
    pub retention_s: u64,
    pub tombstone_s: u64,
    pub concurrency: usize,
    pub message_bytes_max: usize,
    pub lookup: bool,
}

impl Sub {
    /// Subscription `payouts` on `queue`: keyed by seller and settlement,
    /// delivered to `/payouts`, looked up by key.
    pub fn new(queue: &str) -> Sub {
        Sub {
            name: "payouts".into(),
            queue: queue.into(),
            key: "payout:{/seller_id}:{/settlement_id}".into(),
            deliver: "/payouts".into(),
            lease_ms: 2_000,
            response_timeout_ms: 1_500,
            retention_s: 3_600,
            tombstone_s: 86_400,
            concurrency: 4,
            message_bytes_max: 65_536,
            lookup: true,
        }
    }
}

/// The `idem consume` config file for `subs` over `store_url`, delivering
/// to `upstream`, with a reconciler that scans every second.
pub fn consume_toml(store_url: &str, upstream: &Upstream, subs: &[Sub]) -> String {
    let mut text = format!("store = {store_url:?}\npurge_interval_s = 1\n");
    for s in subs {
        text += &format!(
            r#"
[[subscription]]
name = {name:?}
key = {key:?}
deliver = "{up}{deliver}"
lease_ms = {lease}
response_timeout_ms = {timeout}
retention_s = {retention}
tombstone_s = {tombstone}
concurrency = {concurrency}
message_bytes_max = {bytes}

[subscription.rabbitmq]
url = {URL:?}
queue = {queue:?}
connect_timeout_ms = 5000
settle_timeout_ms = 5000
"#,
            name = s.name,
            key = s.key,
            up = upstream.url(),
            deliver = s.deliver,
            lease = s.lease_ms,
            timeout = s.response_timeout_ms,
            retention = s.retention_s,
            tombstone = s.tombstone_s,
            concurrency = s.concurrency,
            bytes = s.message_bytes_max,
            queue = s.queue,
        );
    }
    for s in subs.iter().filter(|s| s.lookup) {
        text += &format!(
            "\n[[lookup]]\nsubscription = {:?}\nurl = \"{}/payouts/by-key/{{forwarded_key}}\"\n",
            s.name,
            upstream.url()
        );
    }
    text + "\n[reconcile]\ninterval_s = 1\nbackoff_ms = 200\nbackoff_max_ms = 1000\nmax_tries = 20\n"
}

/// A payout intent as a producer publishes it.
pub fn payout(seller: u64, settlement: &str, amount: u64) -> String {
    format!(r#"{{"seller_id":{seller},"settlement_id":"{settlement}","amount":{amount}}}"#)
}

/// The key the default template derives from [`payout`].
pub fn payout_key(seller: u64, settlement: &str) -> String {
    format!("payout:{seller}:{settlement}")
}

/// Effects per `Idempotency-Key`, as the upstream recorded them.
pub fn effects_per_key(upstream: &Upstream) -> BTreeMap<String, usize> {
    let mut per_key = BTreeMap::new();
    for effect in upstream.effects() {
        *per_key
            .entry(effect.key.unwrap_or_else(|| "(no key)".into()))
            .or_insert(0) += 1;
    }
    per_key
}

/// Ready messages in the queue and in each destination the consumer
/// declared for it. Messages a consumer holds unacknowledged are not
/// counted: they come back to `ready` when its connection closes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Queues {
    pub ready: u32,
    pub retry: u32,
    pub dead: u32,
    pub late: u32,
}

/// What one subscription of a consumer did, from the line it logs when
/// it stops.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    pub acked: u64,
    pub retried: u64,
    pub dead_lettered: u64,
    pub late: u64,
    pub settle_failed: u64,
}

impl Settled {
    /// The counts `subscription` logged on stopping; panics if it did not.
    pub fn from_log(log: &str, subscription: &str) -> Settled {
        let line = log
            .lines()
            .find(|l| {
                l.contains("every message in hand was settled")
                    && l.split_whitespace()
                        .any(|w| w == format!("subscription={subscription}"))
            })
            .unwrap_or_else(|| panic!("no stop line for {subscription:?} in:\n{log}"));
        let field = |name: &str| -> u64 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
        };
        Settled {
            acked: field("acked"),
            retried: field("retried"),
            dead_lettered: field("dead_lettered"),
            late: field("late"),
            settle_failed: field("settle_failed"),
        }
    }
}

/// A plain client beside the consumer under test.
pub struct Rabbit {
    connection: Connection,
    channel: Channel,
}

impl Rabbit {
    pub async fn connect() -> Rabbit {
        let connection = Connection::connect(URL, ConnectionProperties::default())
            .await
            .expect("RabbitMQ answers on 127.0.0.1:5672");
        let channel = connection.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        Rabbit {
            connection,
            channel,
        }
    }

    /// Publishes a JSON `payload` with `message_id` to `queue` through the
    /// default exchange, persistent, and waits for the broker's confirm.
    pub async fn publish(&self, queue: &str, payload: &str, message_id: &str) {
        let properties = BasicProperties::default()
            .with_message_id(message_id.into())
            .with_content_type("application/json".into());
        self.publish_with(queue, payload.as_bytes(), properties)
            .await;
    }

    /// Publishes `payload` with `properties`, persistent, confirmed.
    pub async fn publish_with(&self, queue: &str, payload: &[u8], properties: BasicProperties) {
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirm = self
            .channel
            .basic_publish(
                "".into(),
                queue.into(),
                options,
                payload,
                properties.with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert_eq!(confirm, Confirmation::Ack(None), "published to {queue}");
    }

    /// Takes one message off `queue`, if there is one.
    pub async fn get(&self, queue: &str) -> Option<BasicGetMessage> {
        self.channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
    }

    /// Every message waiting in `queue`, taken off it.
    pub async fn drain(&self, queue: &str) -> Vec<BasicGetMessage> {
        let mut taken = Vec::new();
        while let Some(m) = self.get(queue).await {
            taken.push(m);
        }
        taken
    }

    /// (ready messages, consumers) of `queue`, which must exist.
    async fn declared(&self, queue: &str) -> (u32, u32) {
        let q = self
            .channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::durable().passive(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        (q.message_count(), q.consumer_count())
    }

    /// The ready counts of `queue` and its retry, dead-letter and late
    /// queues.
    pub async fn queues(&self, queue: &str) -> Queues {
        Queues {
            ready: self.declared(queue).await.0,
            retry: self.declared(&format!("{queue}.retry")).await.0,
            dead: self.declared(&format!("{queue}.dead")).await.0,
            late: self.declared(&format!("{queue}.late")).await.0,
        }
    }

    /// Waits (up to `limit`) until the counts read `expect` three times in
    /// a row, 150 ms apart: a retried copy moving from the retry queue back
    /// to the queue is in neither for an instant. Returns the last counts.
    pub async fn settle_at(&self, queue: &str, expect: Queues, limit: Duration) -> Queues {
        let deadline = tokio::time::Instant::now() + limit;
        let mut in_a_row = 0;
        loop {
            let seen = self.queues(queue).await;
            in_a_row = if seen == expect { in_a_row + 1 } else { 0 };
            if in_a_row == 3 || tokio::time::Instant::now() >= deadline {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    /// Waits (up to 10 s) until `queue` has no consumer: the broker has
    /// closed the consumer's channel and requeued whatever it held
    /// unacknowledged.
    pub async fn wait_unconsumed(&self, queue: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.declared(queue).await.1 > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{queue} still has a consumer 10 s after it stopped"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Deletes `queue`, its retry, dead-letter and late queues and its
    /// dead-letter exchange.
    pub async fn delete(&self, queue: &str) {
        for q in [
            queue.to_owned(),
            format!("{queue}.retry"),
            format!("{queue}.dead"),
            format!("{queue}.late"),
        ] {
            self.channel
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await
                .unwrap();
        }
        self.channel
            .exchange_delete(
                format!("{queue}.dlx").as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await
            .unwrap();
    }

    /// Deletes one queue, as an operator would, whatever it holds.
    pub async fn delete_queue(&self, queue: &str) {
        self.channel
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }

    pub async fn close(self) {
        self.connection.close(200, "done".into()).await.unwrap();
    }
}

/// A text header of a message taken off a queue.
pub fn header(message: &BasicGetMessage, name: &str) -> Option<String> {
    let headers = message.delivery.properties.headers().as_ref()?;
    match headers.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}

/// The payload of a message taken off a queue, as text.
pub fn body(message: &BasicGetMessage) -> String {
    String::from_utf8_lossy(&message.delivery.data).into_owned()
}

/// The record states of the store at `store_url`, by key, as
/// `idem records list` prints them.
pub async fn record_states(store_url: &str) -> BTreeMap<String, String> {
    let url = store_url.to_owned();
    let out = tokio::task::spawn_blocking(move || {
        super::idem(&["records", "list", "--format", "json", "--store", &url])
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", super::text(&out.stderr));
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap().to_owned(),
                r["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

impl std::ops::Add for Settled {
    type Output = Settled;

    fn add(self, other: Settled) -> Settled {
        Settled {
            acked: self.acked + other.acked,
            retried: self.retried + other.retried,
            dead_lettered: self.dead_lettered + other.dead_lettered,
            late: self.late + other.late,
            settle_failed: self.settle_failed + other.settle_failed,
        }
    }
}

/// Polls the async `check` every 50 ms for up to `limit`.
pub async fn until<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long a test waits for records to become final and queues to drain.
pub const SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// Waits until `store_url` holds `records` records, all final (completed
/// or a tombstone), and each queue's counts read what `expect` says, stops
/// the `consumers` with SIGTERM (each must exit 0), and checks, once the
/// broker has taken back whatever they held, that the counts still read
/// the same: nothing was left unsettled. Returns how each consumer ended.
///
/// The record count matters: a message a consumer has prefetched but not
/// yet taken is in no queue's ready count, so empty queues alone do not
/// mean that the work is done.
pub async fn stop_settled(
    rabbit: &Rabbit,
    store_url: &str,
    records: usize,
    expect: &[(&str, Queues)],
    consumers: Vec<super::Consumer>,
) -> Vec<super::Stopped> {
    let logs = || {
        consumers
            .iter()
            .map(|c| c.logs())
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    let final_state = |s: &String| s == "completed" || s == "tombstone";
    let deadline = tokio::time::Instant::now() + SETTLE_LIMIT;
    loop {
        let states = record_states(store_url).await;
        if states.len() == records && states.values().all(final_state) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not {records} final records after {SETTLE_LIMIT:?}: {states:?}\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (queue, want) in expect {
        let seen = rabbit.settle_at(queue, *want, SETTLE_LIMIT).await;
        assert_eq!(seen, *want, "{queue} before SIGTERM\n{}", logs());
    }
    let mut stopped = Vec::new();
    for consumer in consumers {
        let end = tokio::task::spawn_blocking(move || consumer.stop())
            .await
            .unwrap();
        assert!(end.status.success(), "exit {:?}:\n{}", end.status, end.log);
        stopped.push(end);
    }
    for (queue, want) in expect {
        rabbit.wait_unconsumed(queue).await;
        assert_eq!(
            rabbit.queues(queue).await,
            *want,
            "{queue} after SIGTERM: a message was left unsettled"
        );
    }
    stopped
}

/// What `subscription` settled, summed over the consumers' logs.
pub fn settled(stopped: &[super::Stopped], subscription: &str) -> Settled {
    stopped
        .iter()
        .map(|s| Settled::from_log(&s.log, subscription))
        .fold(Settled::default(), |a, b| a + b)
}
