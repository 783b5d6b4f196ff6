//! Amazon SQS for the consumer benchmark, on the moto emulator
//! (127.0.0.1:4568, `bash scripts/test.sh` starts it): a queue and its two
//! sinks created as an operator would create them (the adapter creates
//! none), filled ten messages per `SendMessageBatch`, watched while a
//! consumer drains it, and deleted with its sinks. moto answers one
//! request at a time, so both consumers share its limit: the ratio says
//! what idem adds, the absolute figures say nothing of AWS.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{QueueAttributeName, SendMessageBatchRequestEntry};
use idem_broker::Subscription;
use idem_broker::sqs::{SqsConfig, SqsSubscription};

/// The emulator the benchmark uses.
pub const ENDPOINT: &str = "http://127.0.0.1:4568";
/// The placeholder credentials and region the emulator accepts, given to
/// both consumers' processes (the adapter reads the standard chain).
pub const ENV: [(&str, &str); 4] = [
    ("AWS_ACCESS_KEY_ID", "emulator"),
    ("AWS_SECRET_ACCESS_KEY", "emulator"),
    ("AWS_REGION", "us-east-1"),
    ("AWS_EC2_METADATA_DISABLED", "true"),
];
/// How long either consumer keeps a message's visibility extended: far
/// longer than one POST to the local service takes.
const HOLD_MAX: Duration = Duration::from_secs(60);
/// SQS's limit on entries per `SendMessageBatch`.
const SEND_BATCH: usize = 10;

/// The URL moto gives queue `name` (its account is always the same).
fn url(name: &str) -> String {
    format!("{ENDPOINT}/123456789012/{name}")
}

/// `queue` and its dead-letter and late sinks.
fn queues(queue: &str) -> [String; 3] {
    [
        queue.to_owned(),
        format!("{queue}-dead"),
        format!("{queue}-late"),
    ]
}

/// The adapter's configuration for `queue`: the emulator, `batch` messages
/// per receive (at most ten), every other field at its default but a
/// one-second long poll, so a drained queue is seen at once.
pub fn config(queue: &str, batch: u16) -> anyhow::Result<SqsConfig> {
    let [queue_url, dead, late] = queues(queue).map(|q| url(&q));
    let mut config = SqsConfig::new(queue_url, dead, late);
    config.endpoint_url = Some(ENDPOINT.to_owned());
    config.region = Some("us-east-1".to_owned());
    config.batch_size = u32::from(batch.clamp(1, 10));
    config.wait_time_s = 1;
    config
        .validate()
        .with_context(|| format!("queue {queue:?}"))?;
    Ok(config)
}

/// The `[subscription.sqs]` section of `idem consume`'s file that reads
/// the same queue as [`config`].
pub fn config_section(queue: &str, batch: u16) -> String {
    let [q, dead, late] = queues(queue).map(|q| url(&q));
    format!(
        "[subscription.sqs]\nqueue_url = \"{q}\"\ndead_letter_queue_url = \"{dead}\"\n\
         late_queue_url = \"{late}\"\nendpoint_url = \"{ENDPOINT}\"\nregion = \"us-east-1\"\n\
         batch_size = {}\nwait_time_s = 1\n",
        batch.clamp(1, 10)
    )
}

/// The bare consumer's subscription: the adapter itself.
pub async fn subscribe(queue: &str, batch: u16) -> anyhow::Result<Arc<dyn Subscription>> {
    let subscription = SqsSubscription::connect(config(queue, batch)?, HOLD_MAX)
        .await
        .with_context(|| format!("subscribing to {queue:?} on {ENDPOINT}"))?;
    Ok(Arc::new(subscription))
}

/// The benchmark's own client of the emulator: creates, fills, counts and
/// deletes queues.
pub struct Sqs {
    client: Client,
}

impl Sqs {
    /// A client of the emulator with its placeholder credentials; fails
    /// when it does not answer.
    pub async fn connect() -> anyhow::Result<Sqs> {
        let client = idem_testkit::sqs::client_at(ENDPOINT);
        client.list_queues().send().await.with_context(|| {
            format!("SQS does not answer at {ENDPOINT} (bash scripts/test.sh starts moto)")
        })?;
        Ok(Sqs { client })
    }

    /// Creates `queue` and its sinks, then sends `payloads` to it, ten per
    /// batch, each batch checked for failed entries.
    pub async fn fill(
        &self,
        queue: &str,
        payloads: impl Iterator<Item = Vec<u8>>,
    ) -> anyhow::Result<u64> {
        for name in queues(queue) {
            self.client
                .create_queue()
                .queue_name(&name)
                .send()
                .await
                .with_context(|| format!("creating queue {name:?}"))?;
        }
        let payloads: Vec<Vec<u8>> = payloads.collect();
        let mut sent = 0u64;
        for (batch, chunk) in payloads.chunks(SEND_BATCH).enumerate() {
            let mut send = self.client.send_message_batch().queue_url(url(queue));
            for (i, payload) in chunk.iter().enumerate() {
                let entry = SendMessageBatchRequestEntry::builder()
                    .id(format!("m{batch}-{i}"))
                    .message_body(String::from_utf8_lossy(payload))
                    .build()
                    .context("a batch entry")?;
                send = send.entries(entry);
            }
            let out = send
                .send()
                .await
                .with_context(|| format!("sending to {queue:?}"))?;
            if !out.failed().is_empty() {
                bail!("SQS refused messages for {queue:?}: {:?}", out.failed());
            }
            sent += out.successful().len() as u64;
        }
        Ok(sent)
    }

    /// Messages waiting in `queue` for a consumer (in flight ones are not
    /// counted).
    pub async fn ready(&self, queue: &str) -> anyhow::Result<u64> {
        Ok(self.counts(queue).await?.0)
    }

    /// Messages left in `queue` and its sinks, waiting or in flight.
    pub async fn left(&self, queue: &str) -> anyhow::Result<Vec<(String, u64)>> {
        let mut left = Vec::new();
        for name in queues(queue) {
            let (waiting, in_flight) = self.counts(&name).await?;
            left.push((name, waiting + in_flight));
        }
        Ok(left)
    }

    /// Deletes `queue` and its sinks.
    pub async fn delete(&self, queue: &str) -> anyhow::Result<()> {
        for name in queues(queue) {
            self.client
                .delete_queue()
                .queue_url(url(&name))
                .send()
                .await
                .with_context(|| format!("deleting queue {name:?}"))?;
        }
        Ok(())
    }

    /// (waiting, in flight) of queue `name`.
    async fn counts(&self, name: &str) -> anyhow::Result<(u64, u64)> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(url(name))
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .with_context(|| format!("counting the messages in {name:?}"))?;
        let attributes = out.attributes.unwrap_or_default();
        let count = |attribute: &QueueAttributeName| {
            attributes
                .get(attribute)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Ok((
            count(&QueueAttributeName::ApproximateNumberOfMessages),
            count(&QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        ))
    }
}
