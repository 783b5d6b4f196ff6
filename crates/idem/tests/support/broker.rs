//! The test bed the black-box `idem consume` suite runs on, whatever the
//! broker: what the suite asks of a broker ([`Broker`]: publish, count,
//! read the copies the consumer stored), the consumer's config file, and
//! the end-of-test check that nothing was left unsettled. `nats.rs`,
//! `rabbit.rs` and `sqs.rs` hold each broker's side of it;
//! `consume_suite.rs` the scenarios.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::{Consumer, Site, Stopped, Upstream};

/// How long a test waits for records to become final and for the
/// broker's counts to come to rest.
pub const SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// Where one stream's or queue's messages stand, as the broker counts
/// them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Not yet delivered (JetStream: pending; RabbitMQ: ready).
    pub waiting: u64,
    /// Handed back to come again and not yet redelivered, or, where the
    /// broker counts it, delivered and not yet settled (JetStream: ack
    /// pending; RabbitMQ: in the retry queue).
    pub held: u64,
    /// Copies in the dead-letter stream or queue.
    pub dead: u64,
    /// Copies in the late stream or queue.
    pub late: u64,
}

impl Counts {
    /// Nothing waiting or held, and `dead` and `late` copies.
    pub fn copies(dead: u64, late: u64) -> Counts {
        Counts {
            dead,
            late,
            ..Counts::default()
        }
    }
}

/// Which store of copies to read.
#[derive(Clone, Copy, Debug)]
pub enum Sink {
    DeadLetter,
    Late,
}

/// A copy the consumer stored in a dead-letter or late sink.
#[derive(Clone, Debug)]
pub struct Copy {
    pub payload: String,
    /// The id of the message it is a copy of.
    pub message_id: Option<String>,
    pub headers: BTreeMap<String, String>,
}

impl Copy {
    /// Header `name`'s value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// A message as a producer publishes it.
#[derive(Clone, Copy, Debug)]
pub struct Publish<'a> {
    pub id: &'a str,
    /// Its media type, in the broker's own place for it.
    pub content_type: Option<&'a str>,
    pub headers: &'a [(&'a str, &'a str)],
}

impl<'a> Publish<'a> {
    /// A JSON message with `id` and no other header.
    pub fn json(id: &'a str) -> Publish<'a> {
        Publish {
            id,
            content_type: Some("application/json"),
            headers: &[],
        }
    }
}

/// What the consumer suite asks of a broker: a client beside the consumer
/// under test.
#[allow(async_fn_in_trait)] // test code, never a `dyn Broker`
pub trait Broker: Sized {
    /// The name of the subscription's broker section (`nats`, `rabbitmq`).
    const SECTION: &'static str;
    /// The consumer's `retry_after_max_ms`, when the suite sets it.
    const RETRY_AFTER_MAX_MS: Option<u64>;

    /// A client of the shared local broker.
    async fn connect() -> Self;

    /// A stream or queue name of the test's own.
    fn unique(prefix: &str) -> String;

    /// The `[subscription.SECTION]` table of `sub`, with its header line.
    fn section(sub: &Sub) -> String;

    /// Publishes `payload` to `dest` and waits until the broker has it.
    async fn publish(&self, dest: &str, payload: &[u8], message: Publish<'_>);

    /// Publishes a JSON `payload` to `dest` under `id`.
    async fn publish_json(&self, dest: &str, payload: &str, id: &str) {
        self.publish(dest, payload.as_bytes(), Publish::json(id))
            .await;
    }

    /// `dest`'s counts.
    async fn counts(&self, dest: &str) -> Counts;

    /// Waits until the broker has taken back whatever the stopped
    /// consumers of `dest` held.
    async fn after_stop(&self, dest: &str);

    /// Every copy `sink` stored for `dest`, oldest first.
    async fn copies(&self, dest: &str, sink: Sink) -> Vec<Copy>;

    /// Whether a message of `dest` was handed back and delivered again.
    async fn handed_back(&self, dest: &str) -> bool;

    /// Checks that `dest`'s `n` messages are held back and none is
    /// acknowledged, dropped or copied, as far as the broker can tell.
    async fn assert_held(&self, dest: &str, n: u64);

    /// Checks, once the consumers stopped, that exactly `n` messages wait
    /// to be delivered again and nothing was copied.
    async fn assert_left(&self, dest: &str, n: u64);

    /// Deletes what the consumer declared for `dests`.
    async fn delete(self, dests: &[&str]);

    /// A URL of the broker's scheme on `port` of 127.0.0.1 with user
    /// `payer` and password `s3cret`, and how errors must show it.
    fn url_with_password(port: u16) -> (String, String);

    /// The field of the broker's section that says where the broker is.
    const ADDRESS_FIELD: &'static str = "url";

    /// The broker section of the config the config-error cases edit.
    const VALID_SECTION: &'static str;
    /// Broker-specific config errors: (what is wrong, replace this, with
    /// this, the field named).
    fn config_errors() -> Vec<(&'static str, &'static str, &'static str, &'static str)>;
    /// Broker-specific typos and where they must be located.
    fn typo_locations() -> Vec<(&'static str, &'static str, &'static str)>;

    /// Waits (up to `limit`) until `dest`'s counts read `expect` three
    /// times in a row, 150 ms apart: a retried copy moving from one place
    /// to the next is in neither for an instant. Returns the last counts.
    async fn settle_at(&self, dest: &str, expect: Counts, limit: Duration) -> Counts {
        let deadline = tokio::time::Instant::now() + limit;
        let mut in_a_row = 0;
        loop {
            let seen = self.counts(dest).await;
            in_a_row = if seen == expect { in_a_row + 1 } else { 0 };
            if in_a_row == 3 || tokio::time::Instant::now() >= deadline {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }
}

/// One `[[subscription]]` of the consumer's config, with its broker
/// section and, when `lookup` is set, its `[[lookup]]`. Timings are short
/// so that leases, retries, redeliveries and the reconciler act within
/// seconds.
#[derive(Clone, Debug)]
pub struct Sub {
    pub name: String,
    /// The stream (JetStream) or queue (RabbitMQ).
    pub dest: String,
    /// The broker's URL; the shared local broker's if `None`.
    pub url: Option<String>,
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
    /// JetStream only: it redelivers a message not settled within this.
    pub ack_wait_ms: u64,
    /// JetStream only: its own delivery limit, if any.
    pub max_deliver: Option<u64>,
    /// JetStream only: messages delivered and not yet settled, across
    /// every consumer of the durable.
    pub prefetch: u32,
}

impl Sub {
    /// Subscription `payouts` on `dest` of the shared broker: keyed by
    /// seller and settlement, delivered to `/payouts`, looked up by key.
    pub fn new(dest: &str) -> Sub {
        Sub {
            name: "payouts".into(),
            dest: dest.into(),
            url: None,
            key: "payout:{/seller_id}:{/settlement_id}".into(),
            deliver: "/payouts".into(),
            lease_ms: 2_000,
            response_timeout_ms: 1_500,
            retention_s: 3_600,
            tombstone_s: 86_400,
            concurrency: 4,
            message_bytes_max: 65_536,
            lookup: true,
            ack_wait_ms: 2_000,
            max_deliver: None,
            prefetch: 16,
        }
    }
}

/// The `idem consume` config file for `subs` over `store_url`, delivering
/// to `upstream`, with a reconciler that scans every second.
pub fn consume_toml<B: Broker>(store_url: &str, upstream: &Upstream, subs: &[Sub]) -> String {
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
        );
        if let Some(ms) = B::RETRY_AFTER_MAX_MS {
            text += &format!("retry_after_max_ms = {ms}\n");
        }
        text += &format!("\n{}", B::section(s));
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

/// One test's world: the payout API, a temp dir with the SQLite store and
/// the config file, and a client of the broker.
pub struct Bed<B> {
    pub up: Upstream,
    pub site: Site,
    pub broker: B,
}

impl<B: Broker> Bed<B> {
    pub async fn new() -> Bed<B> {
        Bed {
            up: Upstream::start().await,
            site: Site::new(),
            broker: B::connect().await,
        }
    }

    /// The bed's store: its SQLite file, or the table that stands for it
    /// when `IDEM_TEST_GATEWAY_STORE` names a DynamoDB emulator.
    pub fn store_url(&self) -> String {
        super::dynamo::gateway_store(&format!("sqlite://{}", self.site.store().display()))
    }

    /// The config file for `subs` on the bed's store.
    pub fn config(&self, subs: &[Sub]) -> PathBuf {
        self.site
            .config(&consume_toml::<B>(&self.store_url(), &self.up, subs))
    }

    /// Publishes a JSON `payload` to `dest` under `id`.
    pub async fn publish(&self, dest: &str, payload: &str, id: &str) {
        self.broker.publish_json(dest, payload, id).await;
    }

    /// Effects per key, checked against `expect`.
    #[track_caller]
    pub fn assert_effects(&self, expect: &[(&str, usize)]) {
        let want = expect.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect();
        assert_eq!(effects_per_key(&self.up), want, "effects per key");
    }

    /// Stops the consumers once the records and `dest`'s counts are at
    /// rest: see [`stop_settled`].
    pub async fn stop_settled(
        &self,
        store_url: &str,
        records: usize,
        expect: &[(&str, Counts)],
        consumers: Vec<Consumer>,
    ) -> Vec<Stopped> {
        stop_settled(&self.broker, store_url, records, expect, consumers).await
    }

    /// Deletes what the consumer declared for `dests`.
    pub async fn delete(self, dests: &[&str]) {
        self.broker.delete(dests).await;
    }
}

/// `dest` with nothing waiting, nothing held and no copies.
pub fn drained(dest: &str) -> [(&str, Counts); 1] {
    [(dest, Counts::default())]
}

/// What a test against a broker server of its own starts with: the
/// payout API, the site (config, store, certificates) and the server's
/// data directory.
pub async fn own_server_bed() -> (Upstream, Site, tempfile::TempDir) {
    (
        Upstream::start().await,
        Site::new(),
        tempfile::tempdir().unwrap(),
    )
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

/// Waits until `store_url` holds `records` records, all final (completed
/// or a tombstone), and each destination's counts read what `expect` says,
/// stops the `consumers` with SIGTERM (each must exit 0), and checks, once
/// the broker has taken back whatever they held, that the counts still
/// read the same: nothing was left unsettled. Returns how each consumer
/// ended.
///
/// The record count matters: a message published but not yet delivered,
/// or prefetched and not yet taken, leaves the counts at rest too.
pub async fn stop_settled<B: Broker>(
    broker: &B,
    store_url: &str,
    records: usize,
    expect: &[(&str, Counts)],
    consumers: Vec<Consumer>,
) -> Vec<Stopped> {
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
    for (dest, want) in expect {
        let seen = broker.settle_at(dest, *want, SETTLE_LIMIT).await;
        assert_eq!(seen, *want, "{dest} before SIGTERM\n{}", logs());
    }
    let stopped = stop_all(consumers).await;
    for (dest, want) in expect {
        broker.after_stop(dest).await;
        assert_eq!(
            broker.counts(dest).await,
            *want,
            "{dest} after SIGTERM: a message was left unsettled"
        );
    }
    stopped
}

/// SIGTERM to each of `consumers`; each must exit 0.
pub async fn stop_all(consumers: Vec<Consumer>) -> Vec<Stopped> {
    let mut stopped = Vec::new();
    for consumer in consumers {
        let end = tokio::task::spawn_blocking(move || consumer.stop())
            .await
            .unwrap();
        assert!(end.status.success(), "exit {:?}:\n{}", end.status, end.log);
        stopped.push(end);
    }
    stopped
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

/// What `subscription` settled, summed over the consumers' logs.
pub fn settled(stopped: &[Stopped], subscription: &str) -> Settled {
    stopped
        .iter()
        .map(|s| Settled::from_log(&s.log, subscription))
        .fold(Settled::default(), |a, b| a + b)
}
