//! A message as a consumer receives it. Everything else reads it: the key
//! template renders a key from it, the intent spec its scope, key and
//! fingerprint.

/// One message as the broker delivered it, borrowed. Brokers spell headers
/// differently (NATS: strings; AMQP: typed tables); the caller turns them
/// into text.
#[derive(Clone, Copy, Debug, Default)]
pub struct Message<'a> {
    /// The payload, as delivered.
    pub payload: &'a [u8],
    /// The headers, in the order delivered.
    pub headers: &'a [(&'a str, &'a str)],
    /// The broker's message id, if it has one.
    pub message_id: Option<&'a str>,
}
