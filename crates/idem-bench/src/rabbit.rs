//! RabbitMQ for the consumer benchmark: a queue declared the way
//! `idem_broker::rabbitmq` declares it, filled by a plain lapin publisher
//! with publisher confirms, watched while a consumer drains it, and deleted
//! with everything the adapter declared beside it.

use std::sync::Arc;

use anyhow::{Context, bail};
use idem_broker::Subscription;
use idem_broker::rabbitmq::{RabbitConfig, RabbitSubscription, Topology};
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

/// The broker the benchmark uses: the local one, default login.
pub const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// [`URL`] without its login, for messages.
pub const URL_SHOWN: &str = "amqp://127.0.0.1:5672/%2f";
/// AMQP `delivery_mode` for a message written to disk, as a producer of
/// payouts would publish it.
const PERSISTENT: u8 = 2;

/// The adapter's configuration for `queue`: the local broker, `prefetch`
/// deliveries unsettled at once, every other field at its default.
pub fn config(queue: &str, prefetch: u16) -> anyhow::Result<RabbitConfig> {
    let mut config = RabbitConfig::new(queue);
    config.url = URL.to_owned();
    config.prefetch = prefetch;
    config
        .validate()
        .with_context(|| format!("queue {queue:?}"))?;
    Ok(config)
}

/// The `[subscription.rabbitmq]` section of `idem consume`'s file that
/// reads the same queue as [`config`].
pub fn config_section(queue: &str, prefetch: u16) -> String {
    format!(
        "[subscription.rabbitmq]\nurl = \"{URL}\"\nqueue = \"{queue}\"\nprefetch = {prefetch}\n"
    )
}

/// The bare consumer's subscription: the adapter itself.
pub async fn subscribe(queue: &str, prefetch: u16) -> anyhow::Result<Arc<dyn Subscription>> {
    let subscription = RabbitSubscription::connect(&config(queue, prefetch)?)
        .await
        .with_context(|| format!("subscribing to {queue:?} on {URL_SHOWN}"))?;
    Ok(Arc::new(subscription))
}

/// The benchmark's own connection: publishes, counts and deletes.
pub struct Rabbit {
    connection: Connection,
    channel: Channel,
}

impl Rabbit {
    /// Connects, with publisher confirms on its channel.
    pub async fn connect() -> anyhow::Result<Rabbit> {
        let properties =
            ConnectionProperties::default().with_connection_name("idem-bench consume".into());
        let connection = Connection::connect(URL, properties)
            .await
            .with_context(|| format!("RabbitMQ does not answer at {URL_SHOWN}"))?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Rabbit {
            connection,
            channel,
        })
    }

    /// Declares `queue` and its companions through the adapter (so that
    /// the consumers' declarations match), then publishes `payloads` to it,
    /// persistent, and waits until the broker has confirmed every one.
    pub async fn fill(
        &self,
        queue: &str,
        prefetch: u16,
        payloads: impl Iterator<Item = Vec<u8>>,
    ) -> anyhow::Result<u64> {
        let declared = RabbitSubscription::connect(&config(queue, prefetch)?)
            .await
            .with_context(|| format!("declaring {queue:?}"))?;
        // Closed before anything is published: it must take no delivery.
        declared.close().await?;
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let properties = BasicProperties::default()
            .with_delivery_mode(PERSISTENT)
            .with_content_type("application/json".into());
        let mut confirms = Vec::new();
        for payload in payloads {
            let confirm = self
                .channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    options,
                    &payload,
                    properties.clone(),
                )
                .await
                .with_context(|| format!("publishing to {queue:?}"))?;
            confirms.push(confirm);
        }
        let published = confirms.len() as u64;
        for confirm in confirms {
            match confirm.await? {
                Confirmation::Ack(None) => {}
                other => bail!("the broker did not take a message for {queue:?}: {other:?}"),
            }
        }
        Ok(published)
    }

    /// Messages ready in `queue` (delivered but unacknowledged ones are
    /// not counted).
    pub async fn ready(&self, queue: &str) -> anyhow::Result<u64> {
        let declared = self
            .channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::durable().passive(),
                FieldTable::default(),
            )
            .await
            .with_context(|| {
                format!("counting the messages in {queue:?} (was the broker restarted?)")
            })?;
        Ok(u64::from(declared.message_count()))
    }

    /// Messages left in `queue` and where the adapter moves messages it
    /// does not ack (retry, dead-letter and late queues), by queue.
    pub async fn left(&self, queue: &str) -> anyhow::Result<Vec<(String, u64)>> {
        let t = topology(queue)?;
        let mut left = Vec::new();
        for q in queues(&t) {
            left.push((q.to_owned(), self.ready(q).await?));
        }
        Ok(left)
    }

    /// Deletes `queue` and everything the adapter declared for it.
    pub async fn delete(&self, queue: &str) -> anyhow::Result<()> {
        let t = topology(queue)?;
        for q in queues(&t) {
            self.channel
                .queue_delete(q.into(), QueueDeleteOptions::default())
                .await
                .with_context(|| format!("deleting queue {q:?}"))?;
        }
        let x = t.dead_letter_exchange();
        self.channel
            .exchange_delete(x.into(), ExchangeDeleteOptions::default())
            .await
            .with_context(|| format!("deleting exchange {x:?}"))?;
        Ok(())
    }

    /// Closes the connection.
    pub async fn close(self) -> anyhow::Result<()> {
        self.connection.close(200, "done".into()).await?;
        Ok(())
    }
}

/// What the adapter declares for `queue` (names only; no connection).
fn topology(queue: &str) -> anyhow::Result<Topology> {
    Ok(RabbitConfig::new(queue).validate()?)
}

/// The queue and its retry, dead-letter and late queues.
fn queues(t: &Topology) -> [&str; 4] {
    [
        t.queue(),
        t.retry_queue(),
        t.dead_letter_queue(),
        t.late_queue(),
    ]
}
