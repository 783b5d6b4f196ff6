//! The brokers the consumer benchmark can drive, behind what it needs of
//! each: fill a fresh queue, the section of `idem consume`'s file that
//! reads it, the bare consumer's subscription through the same adapter,
//! how many messages are left, and deletion. A broker is one variant and
//! one module of functions (RabbitMQ: [`crate::rabbit`], NATS JetStream:
//! [`crate::nats`], SQS on moto: [`crate::sqs`]).

use std::sync::Arc;

use anyhow::bail;
use idem_broker::Subscription;

use crate::nats::{self, Nats};
use crate::rabbit::{self, Rabbit};
use crate::sqs::{self, Sqs};

/// A broker the benchmark knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broker {
    /// NATS JetStream at 127.0.0.1:4222, through `idem_broker::nats`.
    Nats,
    /// RabbitMQ at 127.0.0.1:5672 (guest/guest), through
    /// `idem_broker::rabbitmq`.
    RabbitMq,
    /// Amazon SQS on the moto emulator at 127.0.0.1:4568, through
    /// `idem_broker::sqs`.
    Sqs,
}

/// The benchmark's own connection to a broker.
pub enum Admin {
    /// See [`Nats`].
    Nats(Nats),
    /// See [`Rabbit`].
    RabbitMq(Rabbit),
    /// See [`Sqs`].
    Sqs(Sqs),
}

impl Broker {
    /// The broker named on the command line.
    pub fn parse(name: &str) -> anyhow::Result<Broker> {
        match name {
            "rabbitmq" => Ok(Broker::RabbitMq),
            "nats" => Ok(Broker::Nats),
            "sqs" => Ok(Broker::Sqs),
            other => bail!("--broker {other:?}: use rabbitmq, nats or sqs"),
        }
    }

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Broker::RabbitMq => "rabbitmq",
            Broker::Nats => "nats",
            Broker::Sqs => "sqs",
        }
    }

    /// Where it is, for the report.
    pub fn shown(self) -> &'static str {
        match self {
            Broker::RabbitMq => rabbit::URL_SHOWN,
            Broker::Nats => nats::URL,
            Broker::Sqs => sqs::ENDPOINT,
        }
    }

    /// Connects the benchmark's own client.
    pub async fn admin(self) -> anyhow::Result<Admin> {
        match self {
            Broker::RabbitMq => Ok(Admin::RabbitMq(Rabbit::connect().await?)),
            Broker::Nats => Ok(Admin::Nats(Nats::connect().await?)),
            Broker::Sqs => Ok(Admin::Sqs(Sqs::connect().await?)),
        }
    }

    /// The broker section of `idem consume`'s file for `queue`.
    pub fn config_section(self, queue: &str, prefetch: u16) -> String {
        match self {
            Broker::RabbitMq => rabbit::config_section(queue, prefetch),
            Broker::Nats => nats::config_section(queue, prefetch),
            Broker::Sqs => sqs::config_section(queue, prefetch),
        }
    }

    /// The bare consumer's subscription to `queue`, through the same
    /// adapter and settings as `idem consume`'s.
    pub async fn subscribe(
        self,
        queue: &str,
        prefetch: u16,
    ) -> anyhow::Result<Arc<dyn Subscription>> {
        match self {
            Broker::RabbitMq => rabbit::subscribe(queue, prefetch).await,
            Broker::Nats => nats::subscribe(queue, prefetch).await,
            Broker::Sqs => sqs::subscribe(queue, prefetch).await,
        }
    }

    /// What the consumers' processes need in their environment: the
    /// emulator's placeholder credentials for SQS, nothing otherwise.
    pub fn env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Broker::Sqs => &sqs::ENV,
            Broker::RabbitMq | Broker::Nats => &[],
        }
    }
}

impl Admin {
    /// Declares `queue` as the adapter does and fills it with `payloads`,
    /// each confirmed by the broker; returns how many were published.
    pub async fn fill(
        &self,
        queue: &str,
        prefetch: u16,
        payloads: impl Iterator<Item = Vec<u8>>,
    ) -> anyhow::Result<u64> {
        match self {
            Admin::RabbitMq(r) => r.fill(queue, prefetch, payloads).await,
            Admin::Nats(n) => n.fill(queue, prefetch, payloads).await,
            Admin::Sqs(s) => s.fill(queue, payloads).await,
        }
    }

    /// Messages waiting in `queue` for a consumer.
    pub async fn ready(&self, queue: &str) -> anyhow::Result<u64> {
        match self {
            Admin::RabbitMq(r) => r.ready(queue).await,
            Admin::Nats(n) => n.ready(queue).await,
            Admin::Sqs(s) => s.ready(queue).await,
        }
    }

    /// Messages left, by name, in `queue` and wherever the adapter moves
    /// the messages it does not acknowledge.
    pub async fn left(&self, queue: &str) -> anyhow::Result<Vec<(String, u64)>> {
        match self {
            Admin::RabbitMq(r) => r.left(queue).await,
            Admin::Nats(n) => n.left(queue).await,
            Admin::Sqs(s) => s.left(queue).await,
        }
    }

    /// Deletes `queue` and everything declared for it.
    pub async fn delete(&self, queue: &str) -> anyhow::Result<()> {
        match self {
            Admin::RabbitMq(r) => r.delete(queue).await,
            Admin::Nats(n) => n.delete(queue).await,
            Admin::Sqs(s) => s.delete(queue).await,
        }
    }

    /// Closes the connection.
    pub async fn close(self) -> anyhow::Result<()> {
        match self {
            Admin::RabbitMq(r) => r.close().await,
            Admin::Nats(_) | Admin::Sqs(_) => Ok(()),
        }
    }
}

/// The payload of message `i` of run `run`: a payout whose key fields
/// (`seller_id`, `settlement_id`) no other message of the benchmark shares.
pub fn payout(run: usize, i: usize) -> Vec<u8> {
    format!(
        r#"{{"seller_id":"sel_{i:06}","settlement_id":"2026-W36-r{run}-{i:06}","amount":12500,"currency":"EUR","rail":"sepa"}}"#
    )
    .into_bytes()
}
