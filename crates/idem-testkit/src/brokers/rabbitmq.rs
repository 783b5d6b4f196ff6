//! RabbitMQ: the local broker's address and a plain client that publishes
//! with confirms, takes messages off queues and counts and deletes them.

use std::process::Command;

use crate::services::Service;
use lapin::message::BasicGetMessage;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

/// The local broker.
pub const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// A plain client beside the code under test.
pub struct Client {
    connection: Connection,
    channel: Channel,
}

impl Client {
    /// Connects to [`URL`], with publisher confirms on.
    pub async fn connect() -> Client {
        let connection = Connection::connect(URL, ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| panic!("{}", Service::RabbitMq.missing("127.0.0.1:5672", &e)));
        let channel = connection.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        Client {
            connection,
            channel,
        }
    }

    /// Publishes to `queue` through the default exchange, persistent, and
    /// waits for the broker's confirm.
    pub async fn publish(&self, queue: &str, payload: &[u8], properties: BasicProperties) {
        self.publish_to("", queue, payload, properties).await;
    }

    /// Publishes through `exchange` with `routing_key`, persistent,
    /// mandatory, and waits for the broker's confirm.
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

    /// Every message waiting in `queue`, taken off it.
    pub async fn drain(&self, queue: &str) -> Vec<BasicGetMessage> {
        let mut taken = Vec::new();
        while let Some(m) = self.get(queue).await {
            taken.push(m);
        }
        taken
    }

    /// (ready messages, consumers) of `queue`, which must exist. Messages
    /// a consumer holds unacknowledged are not ready.
    pub async fn declared(&self, queue: &str) -> (u32, u32) {
        let q = self
            .channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::durable().passive(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        (q.message_count(), q.consumer_count())
    }

    /// Deletes one queue, as an operator would, whatever it holds.
    pub async fn delete_queue(&self, name: &str) {
        self.channel
            .queue_delete(name.into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }

    /// Deletes one exchange.
    pub async fn delete_exchange(&self, name: &str) {
        self.channel
            .exchange_delete(name.into(), ExchangeDeleteOptions::default())
            .await
            .unwrap();
    }

    /// Closes the connection.
    pub async fn close(self) {
        self.connection.close(200, "done".into()).await.unwrap();
    }
}

/// The text headers of a message taken off a queue, by name.
pub fn headers(message: &BasicGetMessage) -> std::collections::BTreeMap<String, String> {
    let Some(table) = message.delivery.properties.headers().as_ref() else {
        return std::collections::BTreeMap::new();
    };
    table
        .inner()
        .iter()
        .filter_map(|(name, value)| {
            let text = match value {
                AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                AMQPValue::ShortString(s) => s.to_string(),
                _ => return None,
            };
            Some((name.to_string(), text))
        })
        .collect()
}

/// The payload of a message taken off a queue, as text.
pub fn body(message: &BasicGetMessage) -> String {
    String::from_utf8_lossy(&message.delivery.data).into_owned()
}

/// The message id of a message taken off a queue.
pub fn message_id(message: &BasicGetMessage) -> Option<String> {
    message
        .delivery
        .properties
        .message_id()
        .as_ref()
        .map(|m| m.as_str().to_owned())
}

/// The local broker's application, stopped (`rabbitmqctl stop_app`) until
/// this is dropped, then started again and awaited, also when the test
/// fails: every later test needs the broker. Only for a test binary of its
/// own, since every test sharing the broker sees the outage.
pub struct Outage;

impl Outage {
    /// Stops the broker's application now.
    pub fn now() -> Outage {
        let status = Command::new("rabbitmqctl")
            .arg("stop_app")
            .status()
            .expect("this test restarts the local RabbitMQ with rabbitmqctl");
        assert!(status.success(), "rabbitmqctl stop_app: {status:?}");
        Outage
    }
}

impl Drop for Outage {
    fn drop(&mut self) {
        let started = Command::new("rabbitmqctl").arg("start_app").status();
        let awaited = Command::new("rabbitmqctl")
            .args(["await_startup", "--timeout", "60"])
            .status();
        if !std::thread::panicking() {
            assert!(started.is_ok_and(|s| s.success()), "rabbitmqctl start_app");
            assert!(
                awaited.is_ok_and(|s| s.success()),
                "rabbitmqctl await_startup"
            );
        }
    }
}
