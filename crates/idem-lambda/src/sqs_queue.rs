//! [`SqsQueue`]: the [`RejectQueue`] a function gives
//! [`SqsRunOnce::with_dead_letter_queue`](crate::SqsRunOnce::with_dead_letter_queue)
//! or `with_late_queue`, over the official SDK's SQS client: one
//! `SendMessage` per rejected record, with the record's body and message
//! attributes and the reason as `Idem-Reason` / `Idem-Reason-Detail`, the
//! names `idem consume` gives its copies on every broker.

use std::future::Future;
use std::pin::Pin;

use aws_lambda_events::sqs::SqsMessage;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::MessageAttributeValue;
use idem_message::RejectReason;

use crate::sqs::{MESSAGE_GROUP_ID, RejectQueue};

/// The message attribute that carries a rejected record's reason code.
pub const REASON_ATTRIBUTE: &str = "Idem-Reason";
/// The message attribute that carries the reason, in words.
pub const REASON_DETAIL_ATTRIBUTE: &str = "Idem-Reason-Detail";
/// SQS's limit on message attributes per message: the reason takes two,
/// the record's own fill the rest, in name order.
const ATTRIBUTES_MAX: usize = 10;

/// An SQS queue rejected records are sent to; see the module docs. A FIFO
/// queue (its URL ends in `.fifo`) is sent the record's message group (or
/// `idem` when it has none) and a deduplication id made of the record's
/// message id, so that a send retried with the record within SQS's
/// five-minute window is dropped.
#[derive(Clone, Debug)]
pub struct SqsQueue {
    client: Client,
    queue_url: String,
}

impl SqsQueue {
    /// The queue at `queue_url`, sent to with `client` (built once per
    /// execution environment, like the store).
    pub fn new(client: Client, queue_url: impl Into<String>) -> SqsQueue {
        SqsQueue {
            client,
            queue_url: queue_url.into(),
        }
    }

    async fn send_one(&self, record: &SqsMessage, reason: &RejectReason) -> Result<(), String> {
        let text = |value: &str| {
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value(value)
                .build()
                .map_err(|e| e.to_string())
        };
        let mut send = self
            .client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(record.body.clone().unwrap_or_default())
            .message_attributes(REASON_ATTRIBUTE, text(reason.code())?)
            .message_attributes(REASON_DETAIL_ATTRIBUTE, text(&reason.to_string())?);
        let mut own: Vec<_> = record
            .message_attributes
            .iter()
            .filter(|(name, _)| {
                !name.eq_ignore_ascii_case(REASON_ATTRIBUTE)
                    && !name.eq_ignore_ascii_case(REASON_DETAIL_ATTRIBUTE)
            })
            .filter_map(|(name, value)| {
                let kind = value.data_type.as_deref()?;
                let shown = kind.starts_with("String") || kind.starts_with("Number");
                let value = value.string_value.as_deref().filter(|_| shown)?;
                let attribute = MessageAttributeValue::builder()
                    .data_type(kind)
                    .string_value(value)
                    .build()
                    .ok()?;
                Some((name.clone(), attribute))
            })
            .collect();
        own.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, value) in own.into_iter().take(ATTRIBUTES_MAX - 2) {
            send = send.message_attributes(name, value);
        }
        if self.queue_url.ends_with(".fifo") {
            let group = record
                .attributes
                .get(MESSAGE_GROUP_ID)
                .map_or("idem", String::as_str);
            let id = record.message_id.as_deref().unwrap_or("record");
            send = send
                .message_group_id(group)
                .message_deduplication_id(format!("{id}-{}", reason.code()));
        }
        send.send()
            .await
            .map(drop)
            .map_err(|e| idem_core::error_chain(&e))
    }
}

impl RejectQueue for SqsQueue {
    fn send<'a>(
        &'a self,
        record: &'a SqsMessage,
        reason: &'a RejectReason,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>> {
        Box::pin(self.send_one(record, reason))
    }
}
