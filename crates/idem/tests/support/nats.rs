//! NATS JetStream's side of the consumer suite's bed: a plain async-nats
//! client that publishes and inspects what the consumer declared (the
//! stream, its durable consumer, the `<s>_DLQ` and `<s>_LATE` streams).

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, Context};
use bytes::Bytes;
use idem_testkit::brokers::nats::URL;
use idem_testkit::services::Service;

use super::broker::{Broker, Copy, Counts, Publish, Sink, Sub};

/// The durable consumer every test's subscription reads through.
pub const DURABLE: &str = "idem";

/// The subject a stream captures and the tests publish to.
pub fn subject(stream: &str) -> String {
    format!("idemc.{}.payouts", stream.to_lowercase())
}

fn sink_stream(stream: &str, sink: Sink) -> String {
    match sink {
        Sink::DeadLetter => format!("{stream}_DLQ"),
        Sink::Late => format!("{stream}_LATE"),
    }
}

/// A plain client beside the consumer under test.
pub struct Nats {
    js: Context,
}

impl Nats {
    /// A client of the server at `url`.
    pub async fn connect_to(url: &str) -> Nats {
        let client = async_nats::connect(url)
            .await
            .unwrap_or_else(|e| panic!("{}", Service::Nats.missing(url, &e)));
        Nats {
            js: jetstream::new(client),
        }
    }

    /// A client of a server reached with `options` (TLS, credentials).
    pub async fn connect_with(url: &str, options: async_nats::ConnectOptions) -> Nats {
        let client = options
            .connect(url)
            .await
            .unwrap_or_else(|e| panic!("{}", Service::Nats.missing(url, &e)));
        Nats {
            js: jetstream::new(client),
        }
    }

    async fn durable(&self, stream: &str) -> jetstream::consumer::Info {
        self.js
            .get_stream(stream)
            .await
            .unwrap()
            .consumer_info(DURABLE)
            .await
            .unwrap()
    }

    async fn stored(&self, stream: &str) -> u64 {
        let mut s = self.js.get_stream(stream).await.unwrap();
        s.info().await.unwrap().state.messages
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
}

impl Broker for Nats {
    const SECTION: &'static str = "nats";
    // A message handed back comes again within a second, well inside
    // ack_wait.
    const RETRY_AFTER_MAX_MS: Option<u64> = Some(1_000);

    async fn connect() -> Nats {
        Nats::connect_to(URL).await
    }

    fn unique(prefix: &str) -> String {
        idem_testkit::brokers::unique(prefix)
    }

    fn section(s: &Sub) -> String {
        let mut text = format!(
            r#"[subscription.nats]
url = {url:?}
stream = {stream:?}
subjects = [{subject:?}]
durable = {DURABLE:?}
ack_wait_ms = {ack_wait}
prefetch = {prefetch}
request_timeout_ms = 2000
"#,
            url = s.url.as_deref().unwrap_or(URL),
            stream = s.dest,
            subject = subject(&s.dest),
            ack_wait = s.ack_wait_ms,
            prefetch = s.prefetch,
        );
        if let Some(n) = s.max_deliver {
            text += &format!("max_deliver = {n}\n");
        }
        text
    }

    /// Publishes under `Nats-Msg-Id`, and fails on a duplicate id, which
    /// the stream would drop.
    async fn publish(&self, stream: &str, payload: &[u8], message: Publish<'_>) {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", message.id);
        if let Some(media) = message.content_type {
            headers.insert("Content-Type", media);
        }
        for (name, value) in message.headers {
            headers.insert(*name, *value);
        }
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

    async fn counts(&self, stream: &str) -> Counts {
        let consumer = self.durable(stream).await;
        Counts {
            waiting: consumer.num_pending,
            held: consumer.num_ack_pending as u64,
            dead: self.stored(&sink_stream(stream, Sink::DeadLetter)).await,
            late: self.stored(&sink_stream(stream, Sink::Late)).await,
        }
    }

    /// Nothing to wait for: the durable's counts include what a consumer
    /// held.
    async fn after_stop(&self, _stream: &str) {}

    async fn copies(&self, stream: &str, sink: Sink) -> Vec<Copy> {
        let mut store = self.js.get_stream(sink_stream(stream, sink)).await.unwrap();
        let state = store.info().await.unwrap().state.clone();
        let mut copies = Vec::new();
        if state.messages == 0 {
            return copies;
        }
        for sequence in state.first_sequence..=state.last_sequence {
            let m = store.get_raw_message(sequence).await.unwrap();
            let headers = m
                .headers
                .iter()
                .filter_map(|(name, values)| {
                    Some((name.to_string(), values.first()?.as_str().to_owned()))
                })
                .collect::<std::collections::BTreeMap<_, _>>();
            copies.push(Copy {
                payload: String::from_utf8_lossy(&m.payload).into_owned(),
                message_id: headers.get("Idem-Original-Message-Id").cloned(),
                headers,
            });
        }
        copies
    }

    async fn handed_back(&self, stream: &str) -> bool {
        self.durable(stream).await.num_redelivered >= 1
    }

    /// The durable counts what a consumer holds: exactly `n` messages are
    /// delivered and not settled, and nothing else is anywhere.
    async fn assert_held(&self, stream: &str, n: u64) {
        let held = self.counts(stream).await;
        assert_eq!(
            held,
            Counts {
                held: n,
                ..Counts::default()
            },
            "acknowledged, dropped or copied while held back"
        );
    }

    /// What the stopped consumer never took is either still undelivered
    /// or delivered to its buffer and never taken, which JetStream
    /// delivers again after ack_wait.
    async fn assert_left(&self, stream: &str, n: u64) {
        let left = self.counts(stream).await;
        assert_eq!(
            (left.waiting + left.held, left.dead, left.late),
            (n, 0, 0),
            "{left:?}"
        );
    }

    /// Deletes each stream and its dead-letter and late streams.
    async fn delete(self, streams: &[&str]) {
        for stream in streams {
            for name in [
                (*stream).to_owned(),
                sink_stream(stream, Sink::DeadLetter),
                sink_stream(stream, Sink::Late),
            ] {
                self.js.delete_stream(&name).await.unwrap();
            }
        }
    }

    fn url_with_password(port: u16) -> (String, String) {
        (
            format!("nats://payer:s3cret@127.0.0.1:{port}"),
            format!("nats://payer:***@127.0.0.1:{port}"),
        )
    }

    const VALID_SECTION: &'static str = r#"[subscription.nats]
stream = "IDEMC_CONFIG_NEVER_DECLARED"
subjects = ["idemc.config.never-declared"]
ack_wait_ms = 5000
"#;

    fn config_errors() -> Vec<(&'static str, &'static str, &'static str, &'static str)> {
        vec![
            (
                "a typo in the broker's section",
                "ack_wait_ms =",
                "ack_wiat_ms =",
                "ack_wiat_ms",
            ),
            ("no broker", Self::VALID_SECTION, "", "subscription[0].nats"),
            (
                "an ack wait no longer than the response timeout",
                "ack_wait_ms = 5000",
                "ack_wait_ms = 1000",
                "subscription[0].nats.ack_wait_ms",
            ),
            (
                "a broker delivery limit that cannot retry",
                "ack_wait_ms = 5000",
                "ack_wait_ms = 5000\nmax_deliver = 1",
                "subscription[0].nats.max_deliver",
            ),
            (
                "a stream name with a dot",
                "stream = \"IDEMC_CONFIG_NEVER_DECLARED\"",
                "stream = \"IDEMC.CONFIG\"",
                "subscription[0].nats.stream",
            ),
        ]
    }

    fn typo_locations() -> Vec<(&'static str, &'static str, &'static str)> {
        vec![("ack_wait_ms =", "ack_wiat_ms =", "line 14, column 1")]
    }
}
