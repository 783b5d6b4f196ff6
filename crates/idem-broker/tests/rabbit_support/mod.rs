//! What the RabbitMQ tests share: unique names, a plain lapin client that
//! publishes and inspects queues beside the subscription under test, and
//! cleanup.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_broker::rabbitmq::{RabbitConfig, RabbitSubscription, Topology};
use idem_broker::{BrokerError, Delivery, Subscription};
use lapin::message::BasicGetMessage;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

pub const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// A name no other test, run or process uses.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "idem-test-{prefix}-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

/// A configuration for a fresh queue, with short timeouts.
pub fn config(prefix: &str) -> RabbitConfig {
    let mut c = RabbitConfig::new(unique(prefix));
    c.connect_timeout_ms = 5_000;
    c.settle_timeout_ms = 5_000;
    c
}

/// The next delivery, or None if none comes within `wait`.
pub async fn next_within(
    subscription: &RabbitSubscription,
    wait: Duration,
) -> Option<Result<Delivery, BrokerError>> {
    tokio::time::timeout(wait, subscription.next()).await.ok()
}

/// The next delivery, which must come within 10 s.
pub async fn next(subscription: &RabbitSubscription) -> Delivery {
    next_within(subscription, Duration::from_secs(10))
        .await
        .expect("a delivery within 10 s")
        .expect("a delivery, not an error")
}

/// A plain client beside the subscription under test.
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

    /// Publishes through the default exchange, persistent, and waits for the
    /// broker's confirm.
    pub async fn publish(&self, queue: &str, payload: &[u8], properties: BasicProperties) {
        self.publish_to("", queue, payload, properties).await;
    }

    pub async fn publish_to(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
    ) {
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirm = self
            .channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                options,
                payload,
                properties.with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert_eq!(
            confirm,
            Confirmation::Ack(None),
            "published to {routing_key}"
        );
    }

    /// Takes one message off `queue`, if there is one.
    pub async fn get(&self, queue: &str) -> Option<BasicGetMessage> {
        self.channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
    }

    /// How many messages wait in `queue`, not counting unacknowledged ones.
    pub async fn count(&self, queue: &str) -> u32 {
        self.channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::durable().passive(),
                FieldTable::default(),
            )
            .await
            .unwrap()
            .message_count()
    }

    /// Waits until `queue` holds `n` ready messages (the broker requeues a
    /// closed connection's deliveries asynchronously).
    pub async fn wait_for_count(&self, queue: &str, n: u32) -> u32 {
        let mut seen = 0;
        for _ in 0..50 {
            seen = self.count(queue).await;
            if seen == n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        seen
    }

    /// Counts of the queue, the retry queue, the dead-letter queue and the
    /// late queue.
    pub async fn counts(&self, t: &Topology) -> [u32; 4] {
        [
            self.count(t.queue()).await,
            self.count(t.retry_queue()).await,
            self.count(t.dead_letter_queue()).await,
            self.count(t.late_queue()).await,
        ]
    }

    /// Deletes everything a subscription with topology `t` declared.
    pub async fn delete(&self, t: &Topology) {
        for q in [
            t.queue(),
            t.retry_queue(),
            t.dead_letter_queue(),
            t.late_queue(),
        ] {
            self.delete_queue(q).await;
        }
        let mut exchanges = vec![t.dead_letter_exchange()];
        if let Some((x, _)) = t.binding() {
            exchanges.push(x);
        }
        for x in exchanges {
            self.delete_exchange(x).await;
        }
    }

    pub async fn delete_queue(&self, name: &str) {
        self.channel
            .queue_delete(name.into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }

    pub async fn delete_exchange(&self, name: &str) {
        self.channel
            .exchange_delete(name.into(), ExchangeDeleteOptions::default())
            .await
            .unwrap();
    }

    pub async fn close(self) {
        self.connection.close(200, "done".into()).await.unwrap();
    }
}
