//! NATS JetStream for the consumer benchmark: a stream declared the way
//! `idem_broker::nats` declares it (with its dead-letter and late streams
//! and the durable consumer), filled through JetStream with every publish
//! acknowledged, watched while a consumer drains it, and deleted with
//! everything the adapter declared beside it.

use std::sync::Arc;

use anyhow::Context as _;
use async_nats::jetstream::{self, Context};
use idem_broker::Subscription;
use idem_broker::nats::{NatsConfig, NatsSubscription};

/// The broker the benchmark uses: the local one.
pub const URL: &str = "nats://127.0.0.1:4222";

/// JetStream's names allow no dots: the queue name becomes the stream's.
fn stream(queue: &str) -> String {
    queue.replace(['.', ' ', '*', '>'], "_")
}

fn subject(queue: &str) -> String {
    format!("bench.{}", stream(queue))
}

/// The adapter's configuration for `queue`: the local server, `prefetch`
/// messages unsettled at once, every other field at its default.
pub fn config(queue: &str, prefetch: u16) -> anyhow::Result<NatsConfig> {
    let mut config = NatsConfig::new(stream(queue), vec![subject(queue)]);
    config.url = URL.to_owned();
    config.prefetch = u32::from(prefetch);
    config
        .validate()
        .with_context(|| format!("stream {:?}", stream(queue)))?;
    Ok(config)
}

/// The `[subscription.nats]` section of `idem consume`'s file that reads
/// the same stream as [`config`].
pub fn config_section(queue: &str, prefetch: u16) -> String {
    format!(
        "[subscription.nats]\nurl = \"{URL}\"\nstream = \"{}\"\nsubjects = [\"{}\"]\nprefetch = {prefetch}\n",
        stream(queue),
        subject(queue)
    )
}

/// The bare consumer's subscription: the adapter itself.
pub async fn subscribe(queue: &str, prefetch: u16) -> anyhow::Result<Arc<dyn Subscription>> {
    let subscription = NatsSubscription::connect(config(queue, prefetch)?)
        .await
        .with_context(|| format!("subscribing to {:?} on {URL}", stream(queue)))?;
    Ok(Arc::new(subscription))
}

/// Publishes awaited together; below the client's limit of
/// acknowledgements in flight.
const PUBLISH_BATCH: usize = 1_000;

/// Waits for JetStream to store every message of a batch.
async fn confirm(
    subject: &str,
    acks: Vec<async_nats::jetstream::context::PublishAckFuture>,
) -> anyhow::Result<u64> {
    let n = acks.len() as u64;
    for ack in acks {
        ack.await
            .with_context(|| format!("JetStream did not store a message for {subject:?}"))?;
    }
    Ok(n)
}

/// The benchmark's own connection: publishes, counts and deletes.
pub struct Nats {
    js: Context,
}

impl Nats {
    /// Connects.
    pub async fn connect() -> anyhow::Result<Nats> {
        let client = async_nats::connect(URL)
            .await
            .with_context(|| format!("NATS does not answer at {URL}"))?;
        Ok(Nats {
            js: jetstream::new(client),
        })
    }

    /// Declares the stream and its companions through the adapter (so that
    /// the consumers' declarations match), then publishes `payloads`,
    /// waiting until JetStream has acknowledged every one.
    pub async fn fill(
        &self,
        queue: &str,
        prefetch: u16,
        payloads: impl Iterator<Item = Vec<u8>>,
    ) -> anyhow::Result<u64> {
        drop(
            NatsSubscription::connect(config(queue, prefetch)?)
                .await
                .with_context(|| format!("declaring {:?}", stream(queue)))?,
        );
        let subject = subject(queue);
        let mut acks = Vec::new();
        let mut published = 0u64;
        for payload in payloads {
            let ack = self
                .js
                .publish(subject.clone(), payload.into())
                .await
                .with_context(|| format!("publishing to {subject:?}"))?;
            acks.push(ack);
            // The client bounds the acknowledgements in flight; waiting
            // for them in batches keeps the publisher from stalling on it.
            if acks.len() == PUBLISH_BATCH {
                published += confirm(&subject, std::mem::take(&mut acks)).await?;
            }
        }
        published += confirm(&subject, acks).await?;
        Ok(published)
    }

    /// Messages the durable consumer has not yet had acknowledged: waiting
    /// plus delivered but unsettled.
    pub async fn ready(&self, queue: &str) -> anyhow::Result<u64> {
        let config = config(queue, 1)?;
        let stream = self
            .js
            .get_stream(&config.stream)
            .await
            .with_context(|| format!("reading stream {:?}", config.stream))?;
        let mut consumer: jetstream::consumer::PullConsumer = stream
            .get_consumer(&config.durable)
            .await
            .map_err(|e| anyhow::anyhow!("reading consumer {:?}: {e}", config.durable))?;
        let info = consumer.info().await?;
        Ok(info.num_pending + info.num_ack_pending as u64)
    }

    /// Messages left, by name: the consumer's pending ones, and the
    /// dead-letter and late streams' messages.
    pub async fn left(&self, queue: &str) -> anyhow::Result<Vec<(String, u64)>> {
        let mut left = vec![(stream(queue), self.ready(queue).await?)];
        for suffix in ["DLQ", "LATE"] {
            let name = format!("{}_{suffix}", stream(queue));
            let mut s = self
                .js
                .get_stream(&name)
                .await
                .with_context(|| format!("reading stream {name:?}"))?;
            let messages = s.info().await?.state.messages;
            left.push((name, messages));
        }
        Ok(left)
    }

    /// Deletes the stream and the adapter's dead-letter and late streams.
    pub async fn delete(&self, queue: &str) -> anyhow::Result<()> {
        for name in [
            stream(queue),
            format!("{}_DLQ", stream(queue)),
            format!("{}_LATE", stream(queue)),
        ] {
            self.js
                .delete_stream(&name)
                .await
                .with_context(|| format!("deleting stream {name:?}"))?;
        }
        Ok(())
    }
}
