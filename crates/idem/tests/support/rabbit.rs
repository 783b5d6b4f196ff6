//! RabbitMQ's side of the consumer suite's bed: a plain lapin client that
//! publishes and inspects the queues the consumer declared (`<q>`,
//! `<q>.retry`, `<q>.dead`, `<q>.late`).

use std::time::Duration;

use idem_testkit::brokers::rabbitmq::{Client, URL, body, headers, message_id};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};

use super::broker::{Broker, Copy, Counts, Publish, Sink, Sub};

/// A plain client beside the consumer under test.
pub struct Rabbit {
    pub client: Client,
}

impl Rabbit {
    async fn ready(&self, queue: &str) -> u64 {
        u64::from(self.client.declared(queue).await.0)
    }
}

impl Broker for Rabbit {
    const SECTION: &'static str = "rabbitmq";
    // The bridge's default: a retry waits in the retry queue up to 5 s.
    const RETRY_AFTER_MAX_MS: Option<u64> = None;

    async fn connect() -> Rabbit {
        Rabbit {
            client: Client::connect().await,
        }
    }

    fn unique(prefix: &str) -> String {
        idem_testkit::brokers::unique(prefix)
    }

    fn section(s: &Sub) -> String {
        format!(
            r#"[subscription.rabbitmq]
url = {url:?}
queue = {queue:?}
connect_timeout_ms = 5000
settle_timeout_ms = 5000
"#,
            url = s.url.as_deref().unwrap_or(URL),
            queue = s.dest,
        )
    }

    /// Publishes through the default exchange, persistent, confirmed; the
    /// headers go into the message's header table, the media type into
    /// its `content_type` property.
    async fn publish(&self, queue: &str, payload: &[u8], message: Publish<'_>) {
        let mut properties = BasicProperties::default().with_message_id(message.id.into());
        if !message.headers.is_empty() {
            let mut headers = FieldTable::default();
            for (name, value) in message.headers {
                headers.insert((*name).into(), AMQPValue::LongString((*value).into()));
            }
            properties = properties.with_headers(headers);
        }
        if let Some(media) = message.content_type {
            properties = properties.with_content_type(media.into());
        }
        self.client.publish(queue, payload, properties).await;
    }

    /// Ready messages in the queue and each destination the consumer
    /// declared for it. Messages a consumer holds unacknowledged are not
    /// counted: they come back when its connection closes.
    async fn counts(&self, queue: &str) -> Counts {
        Counts {
            waiting: self.ready(queue).await,
            held: self.ready(&format!("{queue}.retry")).await,
            dead: self.ready(&format!("{queue}.dead")).await,
            late: self.ready(&format!("{queue}.late")).await,
        }
    }

    /// Waits (up to 10 s) until `queue` has no consumer: the broker has
    /// closed the consumer's channel and requeued whatever it held
    /// unacknowledged.
    async fn after_stop(&self, queue: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.client.declared(queue).await.1 > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{queue} still has a consumer 10 s after it stopped"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Takes the copies off the queue.
    async fn copies(&self, queue: &str, sink: Sink) -> Vec<Copy> {
        let from = match sink {
            Sink::DeadLetter => format!("{queue}.dead"),
            Sink::Late => format!("{queue}.late"),
        };
        let mut copies = Vec::new();
        for m in self.client.drain(&from).await {
            let headers = headers(&m);
            copies.push(Copy {
                payload: body(&m),
                message_id: message_id(&m),
                headers,
            });
        }
        copies
    }

    /// A message handed back waits in the retry queue for its delay.
    async fn handed_back(&self, queue: &str) -> bool {
        self.ready(&format!("{queue}.retry")).await >= 1
    }

    /// RabbitMQ does not count what a consumer holds: at most `n`
    /// messages are waiting or in the retry queue, and none was copied.
    async fn assert_held(&self, queue: &str, n: u64) {
        let seen = self.counts(queue).await;
        assert!(
            seen.waiting + seen.held <= n && seen.dead == 0 && seen.late == 0,
            "dropped or copied while held back: {seen:?}"
        );
    }

    /// What the stopped consumer did not take (waiting, or prefetched but
    /// not taken) is back in the queue.
    async fn assert_left(&self, queue: &str, n: u64) {
        self.after_stop(queue).await;
        assert_eq!(
            self.counts(queue).await,
            Counts {
                waiting: n,
                ..Counts::default()
            }
        );
    }

    /// Deletes each queue, its retry, dead-letter and late queues and its
    /// dead-letter exchange.
    async fn delete(self, queues: &[&str]) {
        for queue in queues {
            for q in [
                (*queue).to_owned(),
                format!("{queue}.retry"),
                format!("{queue}.dead"),
                format!("{queue}.late"),
            ] {
                self.client.delete_queue(&q).await;
            }
            self.client.delete_exchange(&format!("{queue}.dlx")).await;
        }
        self.client.close().await;
    }

    fn url_with_password(port: u16) -> (String, String) {
        (
            format!("amqp://payer:s3cret@127.0.0.1:{port}/%2f"),
            format!("amqp://payer:***@127.0.0.1:{port}/%2f"),
        )
    }

    const VALID_SECTION: &'static str = r#"[subscription.rabbitmq]
queue = "idem-consume-config-never-declared"
"#;

    fn config_errors() -> Vec<(&'static str, &'static str, &'static str, &'static str)> {
        vec![(
            "no broker",
            Self::VALID_SECTION,
            "",
            // The error is the subscription's; its message names the
            // section.
            "[subscription.rabbitmq]",
        )]
    }

    fn typo_locations() -> Vec<(&'static str, &'static str, &'static str)> {
        Vec::new()
    }
}
