//! What the RabbitMQ tests share: unique names, a plain lapin client that
//! publishes and inspects queues beside the subscription under test, and
//! cleanup.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

use std::time::Duration;

use idem_broker::rabbitmq::{RabbitConfig, RabbitSubscription, Topology};
use idem_broker::{BrokerError, Delivery, Subscription};
pub use idem_testkit::brokers::rabbitmq::Client as Rabbit;
pub use idem_testkit::brokers::unique;

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

/// What these tests ask of the client about a subscription's topology.
#[allow(async_fn_in_trait)]
pub trait TopologyCounts {
    /// How many messages wait in `queue`, not counting unacknowledged ones.
    async fn count(&self, queue: &str) -> u32;

    /// Waits until `queue` holds `n` ready messages (the broker requeues a
    /// closed connection's deliveries asynchronously).
    async fn wait_for_count(&self, queue: &str, n: u32) -> u32;

    /// Counts of the queue, the retry queue, the dead-letter queue and the
    /// late queue.
    async fn counts(&self, t: &Topology) -> [u32; 4];

    /// Deletes everything a subscription with topology `t` declared.
    async fn delete(&self, t: &Topology);
}

impl TopologyCounts for Rabbit {
    async fn count(&self, queue: &str) -> u32 {
        self.declared(queue).await.0
    }

    async fn wait_for_count(&self, queue: &str, n: u32) -> u32 {
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

    async fn counts(&self, t: &Topology) -> [u32; 4] {
        [
            self.count(t.queue()).await,
            self.count(t.retry_queue()).await,
            self.count(t.dead_letter_queue()).await,
            self.count(t.late_queue()).await,
        ]
    }

    async fn delete(&self, t: &Topology) {
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
}
