//! Which broker a subscription reads, as declared: exactly one of
//! `[subscription.nats]` and `[subscription.rabbitmq]`.

use std::sync::Arc;

use idem_broker::nats::{NatsConfig, NatsSubscription};
use idem_broker::rabbitmq::{RabbitConfig, RabbitSubscription};
use idem_broker::{BrokerError, Subscription};

/// A subscription's broker, validated.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Broker {
    /// A NATS JetStream stream, read by a durable pull consumer.
    Nats(NatsConfig),
    /// A RabbitMQ queue.
    RabbitMq(RabbitConfig),
}

impl Broker {
    /// The broker declared by a subscription's `nats` and `rabbitmq`
    /// sections; errors are `(field, reason)` with `at` naming the field.
    pub(crate) fn from_sections(
        nats: Option<&NatsConfig>,
        rabbitmq: Option<&RabbitConfig>,
        at: &dyn Fn(&str) -> String,
    ) -> Result<Broker, (String, String)> {
        match (nats, rabbitmq) {
            (Some(_), Some(_)) => Err((
                at("rabbitmq"),
                "a subscription reads one broker: keep [subscription.nats] or \
                 [subscription.rabbitmq], not both"
                    .into(),
            )),
            (Some(config), None) => {
                config
                    .validate()
                    .map_err(|e| (at(&format!("nats.{}", e.field)), e.reason.clone()))?;
                Ok(Broker::Nats(config.clone()))
            }
            (None, Some(config)) => {
                config
                    .validate()
                    .map_err(|e| (at(&format!("rabbitmq.{}", e.field)), e.reason.clone()))?;
                Ok(Broker::RabbitMq(config.clone()))
            }
            (None, None) => Err((
                at("nats"),
                "declare the broker: a [subscription.nats] or [subscription.rabbitmq] section"
                    .into(),
            )),
        }
    }

    /// What the subscription reads and where, credentials masked:
    /// `nats stream PAYOUTS (payouts.>) at nats://…` or `rabbitmq queue
    /// payouts at amqp://…`.
    pub fn describe(&self) -> String {
        match self {
            Broker::Nats(c) => format!(
                "nats stream {} ({}) durable {} at {}",
                c.stream,
                c.subjects.join(", "),
                c.durable,
                c.masked_url()
            ),
            Broker::RabbitMq(c) => format!("rabbitmq queue {} at {}", c.queue, c.masked_url()),
        }
    }

    /// The broker's own delivery limit, after which it stops delivering a
    /// message (JetStream's `max_deliver`); none for RabbitMQ.
    pub fn max_deliver(&self) -> Option<u64> {
        match self {
            Broker::Nats(config) => config.max_deliver,
            Broker::RabbitMq(_) => None,
        }
    }

    /// How long the broker waits for a settlement before it delivers the
    /// message again, in milliseconds, where it has such a timer.
    pub fn ack_wait_ms(&self) -> Option<u64> {
        match self {
            Broker::Nats(config) => Some(config.ack_wait_ms),
            Broker::RabbitMq(_) => None,
        }
    }

    /// The name of its section under `[[subscription]]`.
    pub(crate) fn section(&self) -> &'static str {
        match self {
            Broker::Nats(_) => "nats",
            Broker::RabbitMq(_) => "rabbitmq",
        }
    }

    /// Connects and declares what the subscription needs on the broker.
    pub(crate) async fn open(&self) -> Result<Arc<dyn Subscription>, BrokerError> {
        match self {
            Broker::Nats(config) => Ok(Arc::new(NatsSubscription::connect(config.clone()).await?)),
            Broker::RabbitMq(config) => Ok(Arc::new(RabbitSubscription::connect(config).await?)),
        }
    }
}
