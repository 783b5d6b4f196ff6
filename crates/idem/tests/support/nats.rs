//! What the `idem consume` tests over NATS JetStream share: the consumer's
//! config file, a plain async-nats client that publishes and inspects what
//! the consumer declared (the stream, its durable consumer, the `<s>_DLQ`
//! and `<s>_LATE` streams), and the end-of-test check that nothing was left
//! unsettled. The broker-neutral helpers are the RabbitMQ suite's.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, Context};
use bytes::Bytes;

// Broker-neutral; each test binary uses some of them.
#[allow(unused_imports)]
pub use super::rabbit::{
    SETTLE_LIMIT, effects_per_key, payout, payout_key, record_states, settled, until,
};
use super::{Consumer, Stopped, Upstream};

/// The shared local server, as the consumer and the tests reach it.
pub const URL: &str = "nats://127.0.0.1:4222";

/// The durable consumer every test's subscription reads through.
pub const DURABLE: &str = "idem";

/// A stream name no other test, run or process uses (JetStream names:
/// letters, digits, `_` and `-`).
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "IDEMC_{prefix}_{}_{}_{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

/// The subject a stream captures and the tests publish to.
pub fn subject(stream: &str) -> String {
    format!("idemc.{}.payouts", stream.to_lowercase())
}

/// One `[[subscription]]` of the consumer's config, with its
/// `[subscription.nats]` and, when `lookup` is set, its `[[lookup]]`.
/// Timings are short so that leases, retries, redeliveries and the
/// reconciler act within seconds.
#[derive(Clone, Debug)]
pub struct Sub {
    pub name: String,
    pub url: String,
    pub stream: String,
    pub key: String,
    /// The upstream path messages are delivered to.
    pub deliver: String,
    pub lease_ms: u64,
    pub response_timeout_ms: u64,
    pub retention_s: u64,
    pub tombstone_s: u64,
    pub concurrency: usize,
    pub message_bytes_max: usize,
    pub retry_after_max_ms: u64,
    /// JetStream redelivers a message not settled within this.
    pub ack_wait_ms: u64,
    /// JetStream's own delivery limit, if any.
    pub max_deliver: Option<u64>,
    /// Messages delivered and not yet settled, across every consumer of
    /// the durable.
    pub prefetch: u32,
    pub lookup: bool,
}

impl Sub {
    /// Subscription `payouts` on `stream` of the shared server: keyed by
    /// seller and settlement, delivered to `/payouts`, looked up by key.
    pub fn new(stream: &str) -> Sub {
        Sub {
            name: "payouts".into(),
            url: URL.into(),
            stream: stream.into(),
            key: "payout:{/seller_id}:{/settlement_id}".into(),
            deliver: "/payouts".into(),
            lease_ms: 2_000,
            response_timeout_ms: 1_500,
            retention_s: 3_600,
            tombstone_s: 86_400,
            concurrency: 4,
            message_bytes_max: 65_536,
            retry_after_max_ms: 1_000,
            ack_wait_ms: 2_000,
            max_deliver: None,
            prefetch: 16,
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
retry_after_max_ms = {retry}

[subscription.nats]
url = {url:?}
stream = {stream:?}
subjects = [{subject:?}]
durable = {DURABLE:?}
ack_wait_ms = {ack_wait}
prefetch = {prefetch}
request_timeout_ms = 2000
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
            retry = s.retry_after_max_ms,
            url = s.url,
            stream = s.stream,
            subject = subject(&s.stream),
            ack_wait = s.ack_wait_ms,
            prefetch = s.prefetch,
        );
        if let Some(n) = s.max_deliver {
            text += &format!("max_deliver = {n}\n");
        }
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

/// Where a stream's messages stand, as the server counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Not yet delivered to the durable consumer.
    pub pending: u64,
    /// Delivered and neither acknowledged nor terminated: held by a
    /// consumer, prefetched, or handed back with a delay.
    pub ack_pending: u64,
    /// Copies stored in `<stream>_DLQ`.
    pub dead: u64,
    /// Copies stored in `<stream>_LATE`.
    pub late: u64,
}

/// A copy stored in a dead-letter or late stream.
pub struct Copy {
    pub payload: String,
    pub headers: HeaderMap,
}

impl Copy {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).map(|v| v.as_str().to_owned())
    }
}

/// Which store of copies to read.
#[derive(Clone, Copy, Debug)]
pub enum Sink {
    DeadLetter,
    Late,
}

impl Sink {
    fn stream(self, stream: &str) -> String {
        match self {
            Sink::DeadLetter => format!("{stream}_DLQ"),
            Sink::Late => format!("{stream}_LATE"),
        }
    }
}

/// A plain client beside the consumer under test.
pub struct Nats {
    js: Context,
}

impl Nats {
    pub async fn connect(url: &str) -> Nats {
        let client = async_nats::connect(url)
            .await
            .unwrap_or_else(|e| panic!("NATS answers on {url}: {e}"));
        Nats {
            js: jetstream::new(client),
        }
    }

    /// Publishes a JSON `payload` to `stream`'s subject under `message_id`
    /// (its `Nats-Msg-Id`) and waits for the stream to store it.
    pub async fn publish(&self, stream: &str, payload: &str, message_id: &str) {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", message_id);
        headers.insert("Content-Type", "application/json");
        self.publish_with(stream, payload.as_bytes(), headers).await;
    }

    /// Publishes `payload` with `headers` and waits for the publish ack;
    /// a duplicate message id would be dropped by the stream, so it fails.
    pub async fn publish_with(&self, stream: &str, payload: &[u8], headers: HeaderMap) {
        let ack = self
            .js
            .publish_with_headers(subject(stream), headers, Bytes::copy_from_slice(payload))
            .await
            .unwrap()
            .await
            .unwrap();
        assert_eq!(ack.stream, stream);
        assert!(!ack.duplicate, "the stream dropped a duplicate message id");
    }

    /// The counts of `stream`'s durable consumer and of its copies.
    pub async fn counts(&self, stream: &str) -> Counts {
        let consumer = self
            .js
            .get_stream(stream)
            .await
            .unwrap()
            .consumer_info(DURABLE)
            .await
            .unwrap();
        Counts {
            pending: consumer.num_pending,
            ack_pending: consumer.num_ack_pending as u64,
            dead: self.stored(&Sink::DeadLetter.stream(stream)).await,
            late: self.stored(&Sink::Late.stream(stream)).await,
        }
    }

    /// How many of `stream`'s messages the durable delivered more than
    /// once.
    pub async fn redelivered(&self, stream: &str) -> u64 {
        let consumer = self
            .js
            .get_stream(stream)
            .await
            .unwrap()
            .consumer_info(DURABLE)
            .await
            .unwrap();
        consumer.num_redelivered as u64
    }

    async fn stored(&self, stream: &str) -> u64 {
        let mut s = self.js.get_stream(stream).await.unwrap();
        s.info().await.unwrap().state.messages
    }

    /// Waits (up to `limit`) until the counts read `expect` three times in
    /// a row, 150 ms apart. Returns the last counts.
    pub async fn settle_at(&self, stream: &str, expect: Counts, limit: Duration) -> Counts {
        let deadline = tokio::time::Instant::now() + limit;
        let mut in_a_row = 0;
        loop {
            let seen = self.counts(stream).await;
            in_a_row = if seen == expect { in_a_row + 1 } else { 0 };
            if in_a_row == 3 || tokio::time::Instant::now() >= deadline {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    /// Every copy `sink` stored for `stream`, oldest first.
    pub async fn copies(&self, stream: &str, sink: Sink) -> Vec<Copy> {
        let mut store = self.js.get_stream(sink.stream(stream)).await.unwrap();
        let state = store.info().await.unwrap().state.clone();
        let mut copies = Vec::new();
        if state.messages == 0 {
            return copies;
        }
        for sequence in state.first_sequence..=state.last_sequence {
            let m = store.get_raw_message(sequence).await.unwrap();
            copies.push(Copy {
                payload: String::from_utf8_lossy(&m.payload).into_owned(),
                headers: m.headers,
            });
        }
        copies
    }

    /// Deletes `stream`'s durable consumer, as an operator would. The
    /// server may answer 500 while it is writing the consumer's state
    /// (`directory not empty`); then it is asked again.
    pub async fn delete_consumer(&self, stream: &str) {
        let stream = self.js.get_stream(stream).await.unwrap();
        for _ in 0..10 {
            match stream.delete_consumer(DURABLE).await {
                Ok(_) => return,
                Err(e) if stream.consumer_info(DURABLE).await.is_err() => {
                    eprintln!("deleted, though the server said: {e}");
                    return;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        panic!(
            "the durable consumer of {} cannot be deleted",
            stream.cached_info().config.name
        );
    }

    /// Deletes `stream` alone (its messages with it), leaving its
    /// dead-letter and late streams.
    pub async fn delete_stream(&self, stream: &str) {
        self.js.delete_stream(stream).await.unwrap();
    }

    /// Deletes `stream` and its dead-letter and late streams.
    pub async fn delete(&self, stream: &str) {
        for name in [
            stream.to_owned(),
            Sink::DeadLetter.stream(stream),
            Sink::Late.stream(stream),
        ] {
            self.js.delete_stream(&name).await.unwrap();
        }
    }
}

/// Waits until `store_url` holds `records` records, all final (completed
/// or a tombstone), and each stream's counts read what `expect` says, stops
/// the `consumers` with SIGTERM (each must exit 0), and checks that the
/// counts still read the same once they are gone: nothing delivered was
/// left unacknowledged, nothing undelivered. Returns how each consumer
/// ended.
///
/// The record count matters: a message published but not yet delivered
/// leaves the counts at rest too.
pub async fn stop_settled(
    nats: &Nats,
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
    for (stream, want) in expect {
        let seen = nats.settle_at(stream, *want, SETTLE_LIMIT).await;
        assert_eq!(seen, *want, "{stream} before SIGTERM\n{}", logs());
    }
    let stopped = stop_all(consumers).await;
    for (stream, want) in expect {
        assert_eq!(
            nats.counts(stream).await,
            *want,
            "{stream} after SIGTERM: a message was left unsettled"
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

/// A nats-server of the test's own (`-js`, its store in a directory the
/// test keeps), killed on drop even if the test fails: a test that
/// restarts its server disturbs no other test.
pub struct OwnServer {
    child: Option<Child>,
    pub port: u16,
    store: PathBuf,
}

impl OwnServer {
    /// Starts a server on a free port of 127.0.0.1, storing in `store`, and
    /// waits (20 s at most) until it accepts connections.
    pub fn start(store: &Path) -> OwnServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        OwnServer::start_on(port, store)
    }

    fn start_on(port: u16, store: &Path) -> OwnServer {
        let child = Command::new(nats_server_binary())
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server runs (set NATS_SERVER to its path)");
        let server = OwnServer {
            child: Some(child),
            port,
            store: store.to_owned(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "own nats-server did not answer");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// A clean shutdown (SIGTERM), as a service manager's restart does;
    /// killed if it has not exited within 20 s.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and store, once stopped.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "stop the server first");
        *self = OwnServer::start_on(self.port, &self.store.clone());
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `NATS_SERVER`, or `nats-server` where packages put it, or on `PATH`.
fn nats_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("NATS_SERVER") {
        return path.into();
    }
    for dir in ["/usr/sbin", "/usr/bin", "/usr/local/bin"] {
        let path = Path::new(dir).join("nats-server");
        if path.exists() {
            return path;
        }
    }
    "nats-server".into()
}
