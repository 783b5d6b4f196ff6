//! Findings about a queue consumer (`idem consume`) that no contract
//! field answers: where its key comes from.

use crate::report::Finding;

/// Where a consumer subscription's key comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeySource {
    /// Fields of the payload (the intent's business identifiers).
    Payload,
    /// Headers the producer sets.
    Header,
    /// The broker's message id, alone or with other parts.
    MessageId,
}

/// The `consumer.key_source` finding: a key must name the intent, and the
/// broker's message id names a message — a republish, an outbox relay or a
/// dead-letter redrive can mint a new one for the same intent.
pub fn key_source_finding(source: KeySource, template: &str) -> Finding {
    let t = "consumer.key_source";
    match source {
        KeySource::MessageId => Finding::fail(
            t,
            format!(
                "the key template {template:?} uses {{message_id}}: a republish, an outbox \
                 relay or a dead-letter redrive can mint a new message id for the same intent, \
                 which then runs again"
            ),
            "derive the key from the payload's business fields, e.g. \
             key = \"payout:{/seller_id}:{/settlement_id}\", or from a header the producer \
             sets once per intent",
        ),
        KeySource::Header => Finding::pass(
            t,
            "the key comes from a header the producer sets: safe if the producer sets it once \
             per intent and keeps it across republishes",
        ),
        KeySource::Payload => Finding::pass(
            t,
            "the key is derived from the payload's fields: a republish or a redrive of the \
             same intent has the same key",
        ),
    }
}
