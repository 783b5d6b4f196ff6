//! Which broker a subscription reads, as declared: exactly one of
//! `[subscription.nats]`, `[subscription.rabbitmq]` and `[subscription.sqs]`.

use std::sync::Arc;
use std::time::Duration;

use idem_broker::nats::{NatsConfig, NatsSubscription};
use idem_broker::rabbitmq::{RabbitConfig, RabbitSubscription};
use idem_broker::sqs::{QueueAttributes, SqsConfig, SqsSubscription};
use idem_broker::{BrokerError, Subscription};

/// A subscription's broker, validated.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Broker {
    /// A NATS JetStream stream, read by a durable pull consumer.
    Nats(NatsConfig),
    /// A RabbitMQ queue.
    RabbitMq(RabbitConfig),
    /// An Amazon SQS queue.
    Sqs(SqsConfig),
}

/// What the broker says when a subscription opens it.
pub(crate) struct Opened {
    /// The subscription.
    pub subscription: Arc<dyn Subscription>,
    /// The broker's own delivery limit, read from the broker (an SQS
    /// queue's redrive policy), when it has one.
    pub max_deliver: Option<u64>,
}

impl Broker {
    /// The broker declared by a subscription's `nats`, `rabbitmq` and
    /// `sqs` sections; errors are `(field, reason)` with `at` naming the
    /// field.
    pub(crate) fn from_sections(
        nats: Option<&NatsConfig>,
        rabbitmq: Option<&RabbitConfig>,
        sqs: Option<&SqsConfig>,
        at: &dyn Fn(&str) -> String,
    ) -> Result<Broker, (String, String)> {
        let declared = [
            nats.is_some().then_some("nats"),
            rabbitmq.is_some().then_some("rabbitmq"),
            sqs.is_some().then_some("sqs"),
        ];
        let mut declared = declared.into_iter().flatten();
        let (Some(_), second) = (declared.next(), declared.next()) else {
            return Err((
                at("nats"),
                "declare the broker: a [subscription.nats], [subscription.rabbitmq] or \
                 [subscription.sqs] section"
                    .into(),
            ));
        };
        if let Some(second) = second {
            return Err((
                at(second),
                "a subscription reads one broker: keep one of [subscription.nats], \
                 [subscription.rabbitmq] and [subscription.sqs]"
                    .into(),
            ));
        }
        let refused = |section: &str, e: &idem_broker::FieldError| {
            (at(&format!("{section}.{}", e.field)), e.reason.clone())
        };
        if let Some(config) = nats {
            config.validate().map_err(|e| refused("nats", &e))?;
            return Ok(Broker::Nats(config.clone()));
        }
        if let Some(config) = rabbitmq {
            config.validate().map_err(|e| refused("rabbitmq", &e))?;
            return Ok(Broker::RabbitMq(config.clone()));
        }
        match sqs {
            Some(config) => {
                config.validate().map_err(|e| refused("sqs", &e))?;
                Ok(Broker::Sqs(config.clone()))
            }
            None => Err((at("sqs"), "no broker section".into())),
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
            Broker::Sqs(c) => format!("sqs queue {} at {}", c.queue_name(), c.masked_url()),
        }
    }

    /// The broker's own delivery limit, after which it stops delivering a
    /// message (JetStream's `max_deliver`), as far as the configuration
    /// says; none for RabbitMQ. An SQS queue's (its redrive policy's
    /// `maxReceiveCount`) is read when the subscription opens.
    pub fn max_deliver(&self) -> Option<u64> {
        match self {
            Broker::Nats(config) => config.max_deliver,
            Broker::RabbitMq(_) | Broker::Sqs(_) => None,
        }
    }

    /// How long the broker waits for a settlement before it delivers the
    /// message again, in milliseconds, where it has such a timer: NATS's
    /// `ack_wait_ms`, SQS's visibility timeout.
    pub fn ack_wait_ms(&self) -> Option<u64> {
        match self {
            Broker::Nats(config) => Some(config.ack_wait_ms),
            Broker::RabbitMq(_) => None,
            Broker::Sqs(config) => Some(u64::from(config.visibility_timeout_s) * 1000),
        }
    }

    /// The broker's wait for a settlement when nothing extends it while a
    /// message runs (NATS's `ack_wait_ms`): a delivery must settle within
    /// it. SQS's visibility is extended while a message runs, so none.
    pub fn fixed_ack_wait_ms(&self) -> Option<u64> {
        match self {
            Broker::Nats(config) => Some(config.ack_wait_ms),
            Broker::RabbitMq(_) | Broker::Sqs(_) => None,
        }
    }

    /// The name of its section under `[[subscription]]`.
    pub(crate) fn section(&self) -> &'static str {
        match self {
            Broker::Nats(_) => "nats",
            Broker::RabbitMq(_) => "rabbitmq",
            Broker::Sqs(_) => "sqs",
        }
    }

    /// Connects and declares (or, for SQS, reads) what the subscription
    /// needs on the broker. `hold_max` is the longest a delivery may run
    /// (the lease plus the response timeout): SQS keeps a message invisible
    /// no longer than that.
    pub(crate) async fn open(&self, hold_max: Duration) -> Result<Opened, BrokerError> {
        let (subscription, max_deliver): (Arc<dyn Subscription>, _) = match self {
            Broker::Nats(config) => (
                Arc::new(NatsSubscription::connect(config.clone()).await?),
                None,
            ),
            Broker::RabbitMq(config) => {
                (Arc::new(RabbitSubscription::connect(config).await?), None)
            }
            Broker::Sqs(config) => {
                let sqs = SqsSubscription::connect(config.clone(), hold_max).await?;
                log_attributes(config, sqs.attributes());
                let limit = sqs.attributes().max_receive_count;
                (Arc::new(sqs), limit)
            }
        };
        Ok(Opened {
            subscription,
            max_deliver,
        })
    }
}

/// Logs what an SQS queue's attributes say at start.
fn log_attributes(config: &SqsConfig, a: &QueueAttributes) {
    tracing::info!(queue = %config.queue_name(),
        queue_visibility_timeout_s = ?a.visibility_timeout_s,
        receive_visibility_timeout_s = config.visibility_timeout_s,
        retention_s = ?a.retention_s,
        max_receive_count = ?a.max_receive_count,
        redrive_target = ?a.redrive_target,
        "sqs queue attributes");
}
