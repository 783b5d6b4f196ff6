//! Amazon SQS behind the broker seam, through the official `aws-sdk-sqs`:
//! one queue read by long polling, every received message held invisible
//! while it is handled, and every settlement that moves a message carried
//! out as a `SendMessage` to a sink queue before the original is deleted.
//!
//! # Queues
//!
//! SQS queues are created by the operator (with their own IAM policies,
//! encryption and redrive policy), not by idem: [`SqsSubscription::connect`]
//! reads the queue's attributes and those of both sinks, and refuses to
//! start when one cannot be read. Both sinks are therefore required: a
//! default name derived from the queue's could only name a queue that
//! does not exist, found out at the first message that needs it.
//!
//! # Settlements
//!
//! - `ack` → `DeleteMessage`.
//! - `retry(after)` → `ChangeMessageVisibility` to `after`, rounded up to
//!   whole seconds (at most 43 200); the message is never deleted, so SQS
//!   counts the next receive (`ApproximateReceiveCount`).
//! - `dead_letter(reason)` / `late(reason)` → `SendMessage` to the sink
//!   (the payload, the original's message attributes, and
//!   [`REASON_HEADER`] / [`REASON_DETAIL_HEADER`]), then
//!   `DeleteMessage`. A FIFO sink is given the original's message group
//!   (the queue's name when it has none) and a deduplication id derived
//!   from the original's message id and the sink, so that a send retried
//!   after a failed delete is dropped by SQS within its five-minute window.
//!
//! A settlement that fails leaves the message where SQS has it: it is
//! received again once its visibility timeout passes.
//!
//! # Visibility
//!
//! A received message is invisible for `visibility_timeout_s`. Until it is
//! settled (or its [`Delivery`] dropped), a keeper task extends it by the
//! same amount every half of it (one `ChangeMessageVisibilityBatch` per
//! ten messages): a message received and still waiting for a worker as
//! long as it waits, and one handed out for at most `hold_max` from then
//! (the consumer passes its lease plus its response timeout): past that the
//! record's lease is over anyway, and the record's fencing token protects
//! the store from the attempt still running. (Counted from the receipt,
//! a batch waiting behind slow workers would lose its visibility and be
//! delivered to another consumer while still held here.)
//!
//! # FIFO queues
//!
//! A queue whose URL ends in `.fifo` is read one message per message group
//! at a time inside this subscription: a later message of a group whose
//! earlier message is unsettled is held back until that one is settled. If
//! the earlier one is retried (or its settlement fails), the held-back ones
//! received with it are handed back to SQS at once (visibility 0): SQS
//! hands out no message of a group while one of it is invisible, so they
//! come again after the retried one, in order. (Handed back with the same
//! delay instead, they would become visible together with it, and an
//! emulator that frees a group by its messages' expiries, as moto 5 does,
//! hands out the last first.)
//!
//! # Messages
//!
//! The body is the payload; String message attributes are the headers
//! (Number attributes shown as text, Binary ones not shown but carried to
//! the sinks); a `content-type` attribute (any case) is the content type;
//! the `MessageId` is the message id; `ApproximateReceiveCount` is the
//! delivery count; the subject is the queue's name. A FIFO message's
//! group is shown as the header [`GROUP_HEADER`].
//!
//! # Errors
//!
//! A queue that does not exist or may not be read (`QueueDoesNotExist`,
//! `AccessDenied`) is a permanent error about `queue_url` (or the sink's
//! field); anything else, a network failure included, is transient, and
//! [`Subscription::connected`] reads false until a receive succeeds again.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use aws_config::{BehaviorVersion, Region, timeout::TimeoutConfig};
use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, MessageAttributeValue, MessageSystemAttributeName,
    QueueAttributeName,
};
use aws_smithy_http_client::tls;
use bytes::Bytes;
use idem_core::FieldError;
use serde::Deserialize;
use tokio::task::JoinHandle;

use crate::{
    BrokerError, BrokerFuture, Delivery, Message, REASON_DETAIL_HEADER, REASON_HEADER, Reason,
    Settle, Subscription,
};

/// The header a FIFO message's `MessageGroupId` is shown as.
pub const GROUP_HEADER: &str = "sqs-message-group-id";

/// The longest visibility SQS allows, in seconds (12 hours).
const VISIBILITY_MAX_S: u32 = 43_200;
/// SQS's limit on message attributes per message.
const ATTRIBUTES_MAX: usize = 10;

/// Where and how to consume, as read from a configuration file.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqsConfig {
    /// The queue, `https://sqs.REGION.amazonaws.com/ACCOUNT/NAME`. Required.
    pub queue_url: String,
    /// The AWS region; default: the standard chain's (`AWS_REGION`, the
    /// profile).
    #[serde(default)]
    pub region: Option<String>,
    /// Another endpoint than AWS's (a VPC endpoint, an emulator).
    #[serde(default)]
    pub endpoint_url: Option<String>,
    /// Long polling: how long one receive waits for a message, 1..=20 s.
    /// Default 20.
    #[serde(default = "default_wait_time_s")]
    pub wait_time_s: u32,
    /// Messages asked for per receive, 1..=10. Default 10.
    #[serde(default = "default_batch_size")]
    pub batch_size: u32,
    /// What a received message is held invisible for, and extended by
    /// while it is handled, 1..=43200 s. Default 30.
    #[serde(default = "default_visibility_timeout_s")]
    pub visibility_timeout_s: u32,
    /// Where key-reused, keyless and poison messages go. Required.
    pub dead_letter_queue_url: String,
    /// Where late replays (past retention) go. Required.
    pub late_queue_url: String,
}

fn default_wait_time_s() -> u32 {
    20
}

fn default_batch_size() -> u32 {
    10
}

fn default_visibility_timeout_s() -> u32 {
    30
}

fn invalid(field: &'static str, reason: impl Into<String>) -> FieldError {
    FieldError::new(field, reason)
}

impl SqsConfig {
    /// A configuration of `queue_url` with its two sinks, every other field
    /// at its default.
    pub fn new(
        queue_url: impl Into<String>,
        dead_letter_queue_url: impl Into<String>,
        late_queue_url: impl Into<String>,
    ) -> SqsConfig {
        SqsConfig {
            queue_url: queue_url.into(),
            region: None,
            endpoint_url: None,
            wait_time_s: default_wait_time_s(),
            batch_size: default_batch_size(),
            visibility_timeout_s: default_visibility_timeout_s(),
            dead_letter_queue_url: dead_letter_queue_url.into(),
            late_queue_url: late_queue_url.into(),
        }
    }

    /// Checks every field; returns the queue's name.
    pub fn validate(&self) -> Result<String, FieldError> {
        let name = queue_name("queue_url", &self.queue_url)?;
        queue_name("dead_letter_queue_url", &self.dead_letter_queue_url)?;
        queue_name("late_queue_url", &self.late_queue_url)?;
        for (field, url) in [
            ("dead_letter_queue_url", &self.dead_letter_queue_url),
            ("late_queue_url", &self.late_queue_url),
        ] {
            if url == &self.queue_url {
                return Err(invalid(field, "must differ from queue_url"));
            }
        }
        if self.late_queue_url == self.dead_letter_queue_url {
            return Err(invalid(
                "late_queue_url",
                "must differ from dead_letter_queue_url",
            ));
        }
        if let Some(endpoint) = &self.endpoint_url
            && !(endpoint.starts_with("https://") || endpoint.starts_with("http://"))
        {
            return Err(invalid(
                "endpoint_url",
                format!(
                    "{} is not an http(s):// URL",
                    idem_core::redact_url(endpoint)
                ),
            ));
        }
        if matches!(&self.region, Some(r) if r.is_empty()) {
            return Err(invalid("region", "must not be empty"));
        }
        let ranges: [(&'static str, u32, u32, u32); 3] = [
            ("wait_time_s", self.wait_time_s, 1, 20),
            ("batch_size", self.batch_size, 1, 10),
            (
                "visibility_timeout_s",
                self.visibility_timeout_s,
                1,
                VISIBILITY_MAX_S,
            ),
        ];
        for (field, value, low, high) in ranges {
            if !(low..=high).contains(&value) {
                return Err(invalid(field, format!("{value} is outside {low}–{high}")));
            }
        }
        Ok(name)
    }

    /// The queue's name: the last segment of its URL.
    pub fn queue_name(&self) -> String {
        self.queue_url
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned()
    }

    /// Whether the queue is a FIFO queue (its name ends in `.fifo`).
    pub fn fifo(&self) -> bool {
        self.queue_url.ends_with(".fifo")
    }

    /// The queue as logs show it: its URL, with the endpoint's password
    /// masked when one is set.
    pub fn masked_url(&self) -> String {
        match &self.endpoint_url {
            Some(endpoint) => format!("{} via {}", self.queue_url, idem_core::redact_url(endpoint)),
            None => self.queue_url.clone(),
        }
    }

    /// The field a network failure is about: the endpoint when one is
    /// named, else the queue's URL.
    fn address_field(&self) -> &'static str {
        if self.endpoint_url.is_some() {
            "endpoint_url"
        } else {
            "queue_url"
        }
    }
}

/// A queue URL's last segment, checked: `http(s)://host/…/NAME`, a name
/// of 1–80 letters, digits, `-` and `_`, with `.fifo` at the end allowed.
fn queue_name(field: &'static str, url: &str) -> Result<String, FieldError> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| invalid(field, format!("{url:?} is not an http(s):// queue URL")))?;
    let name = match rest.split_once('/') {
        Some((host, path)) if !host.is_empty() => path.rsplit('/').next().unwrap_or_default(),
        _ => "",
    };
    let stem = name.strip_suffix(".fifo").unwrap_or(name);
    let fits = (1..=80).contains(&name.len())
        && !stem.is_empty()
        && stem
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !fits {
        return Err(invalid(
            field,
            format!(
                "{url:?} does not end in a queue name (1–80 letters, digits, '-', '_', \
                 optionally '.fifo'), as in https://sqs.REGION.amazonaws.com/ACCOUNT/NAME"
            ),
        ));
    }
    Ok(name.to_owned())
}

/// A queue's attributes that bear on how long a message may be handled:
/// what [`SqsSubscription::inspect`] reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueAttributes {
    /// The queue's own visibility timeout, in seconds (each receive here
    /// sets its own).
    pub visibility_timeout_s: Option<u64>,
    /// How long SQS keeps a message, in seconds.
    pub retention_s: Option<u64>,
    /// The redrive policy's `maxReceiveCount`: after that many receives
    /// SQS moves the message to the policy's dead-letter queue on its own.
    pub max_receive_count: Option<u64>,
    /// The redrive policy's dead-letter queue, an ARN.
    pub redrive_target: Option<String>,
}

impl QueueAttributes {
    fn from_map(map: &HashMap<QueueAttributeName, String>) -> QueueAttributes {
        let number = |name: &QueueAttributeName| map.get(name).and_then(|v| v.parse().ok());
        let redrive = map
            .get(&QueueAttributeName::RedrivePolicy)
            .and_then(|text| redrive_policy(text));
        QueueAttributes {
            visibility_timeout_s: number(&QueueAttributeName::VisibilityTimeout),
            retention_s: number(&QueueAttributeName::MessageRetentionPeriod),
            max_receive_count: redrive.as_ref().and_then(|r| r.0),
            redrive_target: redrive.and_then(|r| r.1),
        }
    }
}

/// `maxReceiveCount` and `deadLetterTargetArn` of a redrive policy (a
/// JSON object); SQS writes the count as a number or as text.
fn redrive_policy(text: &str) -> Option<(Option<u64>, Option<String>)> {
    let policy: serde_json::Value = serde_json::from_str(text).ok()?;
    let count = match &policy["maxReceiveCount"] {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.parse().ok(),
        _ => None,
    };
    let target = policy["deadLetterTargetArn"].as_str().map(str::to_owned);
    Some((count, target))
}

/// One SQS queue consumed; see the module docs.
pub struct SqsSubscription {
    shared: Arc<Shared>,
    keeper: JoinHandle<()>,
}

/// What the subscription, its keeper and its settlements share.
struct Shared {
    client: Client,
    config: SqsConfig,
    queue: String,
    hold_max: Duration,
    attributes: QueueAttributes,
    connected: AtomicBool,
    state: Mutex<State>,
    /// Receives under way, awaited by [`Subscription::release`].
    receiving: Mutex<Vec<JoinHandle<()>>>,
}

/// Messages received and not yet settled.
#[derive(Default)]
struct State {
    /// Received and not handed out yet, oldest first.
    waiting: VecDeque<Received>,
    /// FIFO groups with a message handed out and unsettled.
    busy_groups: HashSet<String>,
    /// Every unsettled message's receipt handle and, once it was handed
    /// out, when: the keeper extends a waiting message as long as it
    /// waits, and a handed-out one for at most `hold_max`.
    held: HashMap<String, Option<Instant>>,
}

/// One message as SQS returned it.
#[derive(Clone, Debug)]
struct Received {
    receipt: String,
    message_id: String,
    body: String,
    attributes: HashMap<String, MessageAttributeValue>,
    group: Option<String>,
    receive_count: u64,
}

impl SqsSubscription {
    /// Validates `config`, connects with the standard credential chain, and
    /// reads the attributes of the queue and of both sinks: a queue that
    /// does not exist or may not be read is a permanent error about its
    /// field. `hold_max` bounds how long a received message's visibility is
    /// extended while it is handled.
    pub async fn connect(config: SqsConfig, hold_max: Duration) -> Result<Self, BrokerError> {
        let queue = config
            .validate()
            .map_err(|e| BrokerError::permanent("sqs config", e))?;
        let client = client(&config).await;
        let attributes = read_attributes(&client, &config, "queue_url", &config.queue_url).await?;
        for (field, url) in [
            ("dead_letter_queue_url", &config.dead_letter_queue_url),
            ("late_queue_url", &config.late_queue_url),
        ] {
            read_attributes(&client, &config, field, url).await?;
        }
        let shared = Arc::new(Shared {
            client,
            config,
            queue,
            hold_max,
            attributes,
            connected: AtomicBool::new(true),
            state: Mutex::new(State::default()),
            receiving: Mutex::new(Vec::new()),
        });
        let keeper = tokio::spawn(keep(Arc::downgrade(&shared)));
        Ok(SqsSubscription { shared, keeper })
    }

    /// The queue's attributes, as read when it connected.
    pub fn attributes(&self) -> &QueueAttributes {
        &self.shared.attributes
    }

    /// Reads the queue's attributes without consuming: for `idem check`.
    pub async fn inspect(config: &SqsConfig) -> Result<QueueAttributes, BrokerError> {
        config
            .validate()
            .map_err(|e| BrokerError::permanent("sqs config", e))?;
        let client = client(config).await;
        read_attributes(&client, config, "queue_url", &config.queue_url).await
    }
}

impl Drop for SqsSubscription {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// The SDK's client for `config`: HTTPS on rustls with ring, as the
/// DynamoDB store's; the standard credential chain.
async fn client(config: &SqsConfig) -> Client {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    // A long poll answers after up to 20 s: the attempt may take longer.
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(3))
        .operation_attempt_timeout(Duration::from_secs(u64::from(config.wait_time_s) + 10))
        .operation_timeout(Duration::from_secs(u64::from(config.wait_time_s) + 30))
        .build();
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(http)
        .timeout_config(timeouts);
    if let Some(region) = &config.region {
        loader = loader.region(Region::new(region.clone()));
    }
    if let Some(endpoint) = &config.endpoint_url {
        loader = loader.endpoint_url(endpoint);
    }
    Client::new(&loader.load().await)
}

/// The attributes of the queue at `url` (the one of `field`): a queue
/// that does not exist or may not be read is a permanent error about it.
async fn read_attributes(
    client: &Client,
    config: &SqsConfig,
    field: &'static str,
    url: &str,
) -> Result<QueueAttributes, BrokerError> {
    let answer = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .map_err(|e| sdk_error("sqs get-queue-attributes", url, config, field, &e))?;
    Ok(QueueAttributes::from_map(
        answer.attributes().unwrap_or(&HashMap::new()),
    ))
}

/// An SDK error as a [`BrokerError`]: a queue that does not exist or may
/// not be used is permanent and about `field`; the rest transient, a
/// network failure about the endpoint (or the queue's URL).
fn sdk_error<E: ProvideErrorMetadata + std::error::Error + 'static>(
    operation: &str,
    url: &str,
    config: &SqsConfig,
    field: &'static str,
    error: &SdkError<E>,
) -> BrokerError {
    let code = error.code().unwrap_or_default();
    let said = idem_core::error_chain(error);
    let missing = code.contains("NonExistentQueue") || code.contains("QueueDoesNotExist");
    let denied = code.contains("AccessDenied") || code.contains("InvalidClientTokenId");
    let operation = match &config.endpoint_url {
        Some(endpoint) => format!("{operation} {url} via {}", idem_core::redact_url(endpoint)),
        None => format!("{operation} {url}"),
    };
    if missing {
        return BrokerError::permanent(operation, format!("the queue does not exist: {said}"))
            .at_field(field);
    }
    if denied {
        return BrokerError::permanent(operation, format!("access denied: {said}")).at_field(field);
    }
    let transient = BrokerError::transient(operation, said);
    match error {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) => {
            transient.at_field(config.address_field())
        }
        _ => transient,
    }
}

impl Shared {
    /// The next message that may be handed out: the oldest waiting one
    /// whose group (on a FIFO queue) has no message unsettled.
    fn take_ready(&self) -> Option<Received> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let fifo = self.config.fifo();
        let at = state.waiting.iter().position(|r| match (&r.group, fifo) {
            (Some(group), true) => !state.busy_groups.contains(group),
            _ => true,
        })?;
        let received = state.waiting.remove(at)?;
        state
            .held
            .insert(received.receipt.clone(), Some(Instant::now()));
        if let (Some(group), true) = (&received.group, fifo) {
            state.busy_groups.insert(group.clone());
        }
        Some(received)
    }

    /// One receive; the messages join the waiting ones.
    async fn receive(&self) -> Result<(), BrokerError> {
        let c = &self.config;
        let answer = self
            .client
            .receive_message()
            .queue_url(&c.queue_url)
            .max_number_of_messages(to_i32(c.batch_size))
            .wait_time_seconds(to_i32(c.wait_time_s))
            .visibility_timeout(to_i32(c.visibility_timeout_s))
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                self.connected.store(false, Ordering::Relaxed);
                return Err(sdk_error("sqs receive", &c.queue_url, c, "queue_url", &e));
            }
        };
        self.connected.store(true, Ordering::Relaxed);
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        for m in answer.messages.unwrap_or_default() {
            let system = m.attributes.unwrap_or_default();
            let (Some(receipt), Some(message_id)) = (m.receipt_handle, m.message_id) else {
                continue;
            };
            state.held.insert(receipt.clone(), None);
            state.waiting.push_back(Received {
                receipt,
                message_id,
                body: m.body.unwrap_or_default(),
                attributes: m.message_attributes.unwrap_or_default(),
                group: system
                    .get(&MessageSystemAttributeName::MessageGroupId)
                    .cloned(),
                receive_count: system
                    .get(&MessageSystemAttributeName::ApproximateReceiveCount)
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(1),
            });
        }
        Ok(())
    }

    /// Forgets a settled (or dropped) message, frees its group, and takes
    /// out the waiting messages of its group when `hand_back` says so.
    fn forget(&self, received: &Received, hand_back: bool) -> Vec<String> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.held.remove(&received.receipt);
        let mut taken = Vec::new();
        if let (Some(group), true) = (&received.group, self.config.fifo()) {
            if hand_back {
                let (same, others): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut state.waiting)
                    .into_iter()
                    .partition(|r| r.group.as_ref() == Some(group));
                state.waiting = others;
                for r in same {
                    state.held.remove(&r.receipt);
                    taken.push(r.receipt);
                }
            }
            state.busy_groups.remove(group);
        }
        taken
    }

    /// Sets the visibility of each of `receipts` to `seconds`; the last
    /// failure is returned (that message comes back when its visibility
    /// ends).
    async fn set_visibility(&self, receipts: &[String], seconds: u32) -> Result<(), BrokerError> {
        let c = &self.config;
        let mut result = Ok(());
        // One call per ten messages, SQS's batch limit.
        for chunk in receipts.chunks(10) {
            let entries = chunk.iter().enumerate().filter_map(|(i, receipt)| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(receipt)
                    .visibility_timeout(to_i32(seconds))
                    .build()
                    .ok()
            });
            let sent = self
                .client
                .change_message_visibility_batch()
                .queue_url(&c.queue_url)
                .set_entries(Some(entries.collect()))
                .send()
                .await;
            match sent {
                Err(e) => {
                    let op = "sqs change-visibility";
                    result = Err(sdk_error(op, &c.queue_url, c, "queue_url", &e));
                }
                Ok(answer) => {
                    if let Some(failed) = answer.failed.first() {
                        let reason = format!("{}: {}", failed.code, failed.message().unwrap_or(""));
                        let op = format!("sqs change-visibility {}", c.queue_url);
                        result = Err(BrokerError::transient(op, reason));
                    }
                }
            }
        }
        result
    }

    async fn delete(&self, receipt: &str) -> Result<(), BrokerError> {
        let c = &self.config;
        self.client
            .delete_message()
            .queue_url(&c.queue_url)
            .receipt_handle(receipt)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| sdk_error("sqs delete", &c.queue_url, c, "queue_url", &e))
    }

    /// Sends a copy of `received` with `reason` to the sink at `url`.
    async fn send_copy(
        &self,
        received: &Received,
        field: &'static str,
        url: &str,
        reason: &Reason,
    ) -> Result<(), BrokerError> {
        let attributes = copy_attributes(&received.attributes, reason);
        let mut send = self
            .client
            .send_message()
            .queue_url(url)
            .message_body(&received.body)
            .set_message_attributes(Some(attributes));
        if url.ends_with(".fifo") {
            let group = received.group.clone().unwrap_or_else(|| self.queue.clone());
            send = send
                .message_group_id(group)
                .message_deduplication_id(dedup_id(&received.message_id, field));
        }
        send.send()
            .await
            .map(|_| ())
            .map_err(|e| sdk_error("sqs send", url, &self.config, field, &e))
    }

    /// Hands every waiting message back at once; waits first for the
    /// receives under way, whose messages would otherwise stay invisible.
    async fn release(&self) {
        let receiving = std::mem::take(
            &mut *self
                .receiving
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for receive in receiving {
            let _ = receive.await;
        }
        let receipts: Vec<String> = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let waiting = std::mem::take(&mut state.waiting);
            waiting
                .into_iter()
                .map(|r| {
                    state.held.remove(&r.receipt);
                    r.receipt
                })
                .collect()
        };
        if let Err(e) = self.set_visibility(&receipts, 0).await {
            tracing::warn!(error = %e, "cannot hand back the messages received and not handled; \
                SQS delivers them again when their visibility ends");
        }
    }
}

/// The message attributes a copy carries: the original's (at most SQS's
/// ten, the reason's two first) and the reason.
fn copy_attributes(
    original: &HashMap<String, MessageAttributeValue>,
    reason: &Reason,
) -> HashMap<String, MessageAttributeValue> {
    let text = |value: &str| {
        MessageAttributeValue::builder()
            .data_type("String")
            .string_value(value)
            .build()
            .ok()
    };
    let mut copy = HashMap::new();
    for (name, value) in [
        (REASON_HEADER, reason.code.as_str()),
        (REASON_DETAIL_HEADER, reason.detail.as_str()),
    ] {
        // SQS refuses an empty String attribute.
        let value = if value.is_empty() { "-" } else { value };
        if let Some(v) = text(value) {
            copy.insert(name.to_owned(), v);
        }
    }
    let mut names: Vec<&String> = original
        .keys()
        .filter(|n| {
            !n.eq_ignore_ascii_case(REASON_HEADER) && !n.eq_ignore_ascii_case(REASON_DETAIL_HEADER)
        })
        .collect();
    names.sort();
    for name in names.into_iter().take(ATTRIBUTES_MAX - copy.len()) {
        copy.insert(name.clone(), original[name].clone());
    }
    copy
}

/// A FIFO sink's deduplication id for a copy of `message_id` sent to the
/// sink of `field`: the same for a send retried, at most 128 characters.
fn dedup_id(message_id: &str, field: &str) -> String {
    let sink = field.trim_end_matches("_queue_url");
    let mut id = format!("{message_id}-{sink}");
    id.retain(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
    id.truncate(128);
    id
}

fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Extends the visibility of every unsettled message every third of the
/// visibility timeout, on a fixed cadence (a slow answer from SQS does not
/// push the next extension back): a waiting one as long as it waits, a
/// handed-out one for at most `hold_max` from when it was handed out; ends
/// when the subscription is gone. A message received just after a tick is
/// extended at the next, so an extension may arrive up to two thirds of
/// the timeout late before SQS hands the message to another worker.
async fn keep(shared: Weak<Shared>) {
    let period = match shared.upgrade() {
        Some(s) => Duration::from_millis(u64::from(s.config.visibility_timeout_s) * 1000 / 3),
        None => return,
    };
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let receipts: Vec<String> = {
            let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            let hold_max = shared.hold_max;
            state
                .held
                .retain(|_, handed| handed.is_none_or(|at| at.elapsed() < hold_max));
            state.held.keys().cloned().collect()
        };
        let visibility = shared.config.visibility_timeout_s;
        if let Err(e) = shared.set_visibility(&receipts, visibility).await {
            // A message settled meanwhile has no valid receipt any more.
            tracing::debug!(error = %e, "cannot extend a message's visibility");
        }
    }
}

/// A received message as the broker seam shows it.
fn message(queue: &str, r: &Received) -> Message {
    let mut headers: Vec<(String, String)> = r
        .attributes
        .iter()
        .filter_map(|(name, v)| {
            let kind = v.data_type();
            let shown = kind.starts_with("String") || kind.starts_with("Number");
            shown
                .then(|| v.string_value().map(|s| (name.clone(), s.to_owned())))
                .flatten()
        })
        .collect();
    if let Some(group) = &r.group {
        headers.push((GROUP_HEADER.to_owned(), group.clone()));
    }
    headers.sort();
    let content_type = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.clone());
    Message {
        payload: Bytes::from(r.body.clone().into_bytes()),
        headers,
        message_id: Some(r.message_id.clone()),
        content_type,
        subject: queue.to_owned(),
        delivery: r.receive_count.max(1),
    }
}

impl Subscription for SqsSubscription {
    fn next(&self) -> BrokerFuture<'_, Delivery> {
        Box::pin(async move {
            loop {
                if let Some(received) = self.shared.take_ready() {
                    return Ok(Delivery {
                        message: message(&self.shared.queue, &received),
                        settle: Box::new(SqsSettle {
                            shared: Arc::clone(&self.shared),
                            received,
                            settled: false,
                        }),
                    });
                }
                // The receive runs on a task of its own: a `next()` dropped
                // while it waits loses no message, which then waits here.
                let shared = Arc::clone(&self.shared);
                let (tx, rx) = tokio::sync::oneshot::channel();
                let task = tokio::spawn(async move {
                    let _ = tx.send(shared.receive().await);
                });
                {
                    let mut receiving = self
                        .shared
                        .receiving
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    receiving.retain(|t| !t.is_finished());
                    receiving.push(task);
                }
                match rx.await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(e),
                    Err(_) => return Err(BrokerError::transient("sqs receive", "cancelled")),
                }
            }
        })
    }

    fn describe(&self) -> String {
        format!("sqs queue {}", self.shared.config.masked_url())
    }

    fn connected(&self) -> bool {
        self.shared.connected.load(Ordering::Relaxed)
    }

    fn release(&self) -> BrokerFuture<'_, ()> {
        Box::pin(async move {
            self.shared.release().await;
            Ok(())
        })
    }
}

impl fmt::Debug for SqsSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsSubscription")
            .field("describe", &self.describe())
            .finish_non_exhaustive()
    }
}

/// How one delivery is settled.
struct SqsSettle {
    shared: Arc<Shared>,
    received: Received,
    settled: bool,
}

impl SqsSettle {
    /// Copies the message to the sink of `field`, then deletes it.
    async fn move_to(
        mut self: Box<Self>,
        field: &'static str,
        reason: Reason,
    ) -> Result<(), BrokerError> {
        let url = match field {
            "late_queue_url" => self.shared.config.late_queue_url.clone(),
            _ => self.shared.config.dead_letter_queue_url.clone(),
        };
        let sent = self
            .shared
            .send_copy(&self.received, field, &url, &reason)
            .await;
        let done = match sent {
            Ok(()) => self.shared.delete(&self.received.receipt).await,
            Err(e) => Err(e),
        };
        self.finish(done.is_err()).await;
        done
    }

    /// Forgets the message; on a failed settlement, hands back the waiting
    /// messages of its group, to come again after it.
    async fn finish(&mut self, failed: bool) {
        self.settled = true;
        let held_back = self.shared.forget(&self.received, failed);
        let _ = self.shared.set_visibility(&held_back, 0).await;
    }
}

impl Settle for SqsSettle {
    fn ack(mut self: Box<Self>) -> BrokerFuture<'static, ()> {
        Box::pin(async move {
            let done = self.shared.delete(&self.received.receipt).await;
            self.finish(done.is_err()).await;
            done
        })
    }

    fn retry(mut self: Box<Self>, after: Duration) -> BrokerFuture<'static, ()> {
        Box::pin(async move {
            let seconds = retry_seconds(after);
            self.settled = true;
            let receipt = [self.received.receipt.clone()];
            let done = self.shared.set_visibility(&receipt, seconds).await;
            // The group's later messages received with it go back to SQS,
            // which hands out none of a group while one of it is
            // invisible: they come again after it, in order.
            let held_back = self.shared.forget(&self.received, true);
            let _ = self.shared.set_visibility(&held_back, 0).await;
            done
        })
    }

    fn dead_letter(self: Box<Self>, reason: Reason) -> BrokerFuture<'static, ()> {
        Box::pin(self.move_to("dead_letter_queue_url", reason))
    }

    fn late(self: Box<Self>, reason: Reason) -> BrokerFuture<'static, ()> {
        Box::pin(self.move_to("late_queue_url", reason))
    }
}

impl Drop for SqsSettle {
    fn drop(&mut self) {
        if !self.settled {
            // Dropped unsettled: SQS delivers it again once its visibility
            // ends, and the group's waiting messages after it.
            let held_back = self.shared.forget(&self.received, true);
            if !held_back.is_empty() {
                let shared = Arc::clone(&self.shared);
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move {
                        let _ = shared.set_visibility(&held_back, 0).await;
                    });
                }
            }
        }
    }
}

/// A retry's delay as a visibility timeout: whole seconds, rounded up, at
/// most SQS's 12 hours.
fn retry_seconds(after: Duration) -> u32 {
    let whole = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    u32::try_from(whole.min(u64::from(VISIBILITY_MAX_S))).unwrap_or(VISIBILITY_MAX_S)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        queue_url = "https://sqs.eu-west-1.amazonaws.com/123456789012/payouts"
        dead_letter_queue_url = "https://sqs.eu-west-1.amazonaws.com/123456789012/payouts-dead"
        late_queue_url = "https://sqs.eu-west-1.amazonaws.com/123456789012/payouts-late"
    "#;

    fn parse(text: &str) -> Result<SqsConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn a_minimal_section_takes_the_defaults() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.validate().unwrap(), "payouts");
        assert_eq!(
            (c.wait_time_s, c.batch_size, c.visibility_timeout_s),
            (20, 10, 30)
        );
        assert!(!c.fifo());
    }

    #[test]
    fn every_refused_value_names_its_field() {
        let cases = [
            ("wait_time_s = 0", "wait_time_s"),
            ("wait_time_s = 21", "wait_time_s"),
            ("batch_size = 0", "batch_size"),
            ("batch_size = 11", "batch_size"),
            ("visibility_timeout_s = 0", "visibility_timeout_s"),
            ("visibility_timeout_s = 43201", "visibility_timeout_s"),
            ("endpoint_url = \"127.0.0.1:4568\"", "endpoint_url"),
            ("region = \"\"", "region"),
        ];
        for (line, field) in cases {
            let c = parse(&format!("{GOOD}\n{line}")).unwrap();
            assert_eq!(c.validate().unwrap_err().field, field, "{line}");
        }
        let swaps = [
            ("/payouts\"", "/\"", "queue_url"),
            ("/payouts\"", "/pay outs\"", "queue_url"),
            (
                "https://sqs.eu-west-1.amazonaws.com/123456789012/payouts\"",
                "payouts\"",
                "queue_url",
            ),
            ("payouts-dead", "payouts", "dead_letter_queue_url"),
            ("payouts-late", "payouts-dead", "late_queue_url"),
        ];
        for (from, to, field) in swaps {
            let c = parse(&GOOD.replacen(from, to, 1)).unwrap();
            assert_eq!(c.validate().unwrap_err().field, field, "{to}");
        }
    }

    #[test]
    fn unknown_and_missing_fields_are_refused_when_parsed() {
        assert!(
            parse(&format!("{GOOD}\nurl = \"x\""))
                .unwrap_err()
                .contains("url")
        );
        let no_sink = GOOD.replace(
            "late_queue_url = \"https://sqs.eu-west-1.amazonaws.com/123456789012/payouts-late\"",
            "",
        );
        assert!(parse(&no_sink).unwrap_err().contains("late_queue_url"));
    }

    #[test]
    fn a_fifo_queue_is_known_by_its_name() {
        let c = SqsConfig::new(
            "http://127.0.0.1:4568/000000000000/orders.fifo",
            "http://127.0.0.1:4568/000000000000/orders-dead.fifo",
            "http://127.0.0.1:4568/000000000000/orders-late",
        );
        assert_eq!(c.validate().unwrap(), "orders.fifo");
        assert!(c.fifo());
    }

    fn text(value: &str) -> MessageAttributeValue {
        MessageAttributeValue::builder()
            .data_type("String")
            .string_value(value)
            .build()
            .unwrap()
    }

    #[test]
    fn a_received_message_maps_onto_the_seam() {
        let binary = MessageAttributeValue::builder()
            .data_type("Binary")
            .binary_value(aws_sdk_sqs::primitives::Blob::new(vec![1, 2]))
            .build()
            .unwrap();
        let number = MessageAttributeValue::builder()
            .data_type("Number.int")
            .string_value("7")
            .build()
            .unwrap();
        let r = Received {
            receipt: "r".into(),
            message_id: "m-1".into(),
            body: "{\"a\":1}".into(),
            attributes: HashMap::from([
                ("Content-Type".to_owned(), text("text/csv")),
                ("intent-id".to_owned(), text("847")),
                ("blob".to_owned(), binary),
                ("tries".to_owned(), number),
            ]),
            group: Some("seller-847".into()),
            receive_count: 3,
        };
        let m = message("orders.fifo", &r);
        assert_eq!(&m.payload[..], b"{\"a\":1}");
        assert_eq!(m.message_id.as_deref(), Some("m-1"));
        assert_eq!(m.content_type.as_deref(), Some("text/csv"));
        assert_eq!(m.subject, "orders.fifo");
        assert_eq!(m.delivery, 3);
        assert_eq!(m.header("intent-id"), Some("847"));
        assert_eq!(m.header("tries"), Some("7"));
        assert_eq!(m.header(GROUP_HEADER), Some("seller-847"));
        assert_eq!(m.header("blob"), None);
    }

    #[test]
    fn a_copy_carries_the_reason_and_the_original_attributes_within_sqs_limit() {
        let mut original: HashMap<String, MessageAttributeValue> =
            (0..12).map(|i| (format!("h{i:02}"), text("v"))).collect();
        original.insert(REASON_HEADER.into(), text("stale"));
        let reason = Reason {
            code: "key-reused".into(),
            detail: String::new(),
        };
        let copy = copy_attributes(&original, &reason);
        assert_eq!(copy.len(), ATTRIBUTES_MAX);
        assert_eq!(copy[REASON_HEADER].string_value(), Some("key-reused"));
        assert_eq!(copy[REASON_DETAIL_HEADER].string_value(), Some("-"));
        assert!(copy.contains_key("h00"));
    }

    #[test]
    fn retry_delays_round_up_to_whole_seconds_within_sqs_limit() {
        assert_eq!(retry_seconds(Duration::ZERO), 0);
        assert_eq!(retry_seconds(Duration::from_millis(1)), 1);
        assert_eq!(retry_seconds(Duration::from_millis(2_000)), 2);
        assert_eq!(retry_seconds(Duration::from_millis(2_001)), 3);
        assert_eq!(retry_seconds(Duration::from_secs(100_000)), 43_200);
    }

    #[test]
    fn a_dedup_id_is_stable_per_message_and_sink() {
        let dead = dedup_id("3f2a-…-9c", "dead_letter_queue_url");
        assert_eq!(dead, "3f2a--9c-dead_letter");
        assert_ne!(dead, dedup_id("3f2a-…-9c", "late_queue_url"));
        assert!(dedup_id(&"x".repeat(300), "late_queue_url").len() <= 128);
    }

    #[test]
    fn a_redrive_policy_is_read_whether_its_count_is_a_number_or_text() {
        let arn = "arn:aws:sqs:us-east-1:000000000000:payouts-dlq";
        for text in [
            format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":5}}"#),
            format!(r#"{{"maxReceiveCount": "5", "deadLetterTargetArn": "{arn}"}}"#),
        ] {
            assert_eq!(
                redrive_policy(&text),
                Some((Some(5), Some(arn.to_owned()))),
                "{text}"
            );
        }
    }
}
