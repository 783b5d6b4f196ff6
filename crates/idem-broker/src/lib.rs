//! The brokers `idem consume` reads from, behind one small seam: a
//! [`Subscription`] hands out [`Delivery`]s, and each delivery is settled
//! exactly once through its [`Settle`] — acknowledged, handed back for a
//! later retry, dead-lettered, or sent to the late sink.
//!
//! The bridge decides *which* settlement from the record's outcome (the
//! settle table in docs/consumers.md); a broker only carries it out, and
//! never acknowledges a message on its own. A settlement that fails (the
//! broker went away) may not have taken effect, so the broker may deliver
//! the message again: the record decides what the redelivery does.
//!
//! Adapters: [`nats`] (NATS JetStream, a durable pull consumer),
//! [`rabbitmq`] (RabbitMQ, manual acks and publisher confirms) and [`sqs`]
//! (Amazon SQS, long polling with visibility kept while a message runs).

pub mod nats;
pub mod rabbitmq;
pub mod sqs;
mod tls_files;

pub use idem_core::FieldError;
pub use nats::{NatsConfig, NatsSubscription};
pub use rabbitmq::{RabbitConfig, RabbitSubscription};
pub use sqs::{SqsConfig, SqsSubscription};
pub use tls_files::TlsFiles;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;

/// The header (SQS: the message attribute) that carries a dead-lettered or
/// late copy's reason code, on every broker.
pub const REASON_HEADER: &str = "Idem-Reason";
/// The header (SQS: the message attribute) that carries a dead-lettered or
/// late copy's reason, in words, on every broker.
pub const REASON_DETAIL_HEADER: &str = "Idem-Reason-Detail";

/// What a broker operation returns.
pub type BrokerFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, BrokerError>> + Send + 'a>>;

/// One message as the broker delivered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The payload, as published.
    pub payload: Bytes,
    /// The message's headers. Names keep the case the publisher used; a
    /// name may repeat where the broker allows it (NATS: sorted by name,
    /// each name's values in published order; AMQP: a table, sorted by
    /// name, no repeats; SQS: the String and Number message attributes,
    /// sorted by name).
    pub headers: Vec<(String, String)>,
    /// The broker's message id, if the publisher set one (NATS
    /// `Nats-Msg-Id`, AMQP `message_id`; SQS mints one, `MessageId`). A
    /// republish or a redrive may mint a new one, so it is not a key by
    /// default.
    pub message_id: Option<String>,
    /// The payload's media type, as the publisher declared it: AMQP's
    /// `content_type` property, else a `Content-Type` header (NATS has only
    /// the header; SQS a `content-type` message attribute). The bridge
    /// delivers the payload with it.
    pub content_type: Option<String>,
    /// Where it was published (NATS subject, AMQP routing key, SQS queue
    /// name).
    pub subject: String,
    /// How many times this message was delivered, this one included
    /// (1 for the first delivery), as far as the broker counts (SQS:
    /// `ApproximateReceiveCount`).
    pub delivery: u64,
}

impl Message {
    /// The first header named `name`, compared without regard to ASCII case.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One delivery: the message and the one way to settle it.
pub struct Delivery {
    /// The message.
    pub message: Message,
    /// How to settle it; consumed by the settlement.
    pub settle: Box<dyn Settle>,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("message", &self.message)
            .finish_non_exhaustive()
    }
}

/// Why a message goes to the dead-letter destination or the late sink,
/// carried with it as headers so a person can see why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reason {
    /// A short code, e.g. `key-reused`, `no-key`, `expired`.
    pub code: String,
    /// What happened, in words.
    pub detail: String,
}

/// How one delivery is settled; every method consumes it, so a delivery is
/// settled at most once. If the settlement fails it may not have taken
/// effect, and the broker may deliver the message again.
pub trait Settle: Send {
    /// The record is final: acknowledge, the broker forgets the message.
    fn ack(self: Box<Self>) -> BrokerFuture<'static, ()>;

    /// Not settled yet (in flight elsewhere, outcome unknown, store down):
    /// the broker delivers the message again, not before `after`.
    fn retry(self: Box<Self>, after: Duration) -> BrokerFuture<'static, ()>;

    /// Never executed and never will be (a key reused with another
    /// payload, no key): move the message to the dead-letter destination,
    /// with `reason`, and only then stop its delivery.
    fn dead_letter(self: Box<Self>, reason: Reason) -> BrokerFuture<'static, ()>;

    /// A late replay (the key is past retention): copy the message to the
    /// late sink, with `reason`, and only then stop its delivery.
    fn late(self: Box<Self>, reason: Reason) -> BrokerFuture<'static, ()>;
}

/// One subscription's stream of deliveries.
pub trait Subscription: Send + Sync {
    /// The next delivery; waits until one arrives. An error says the
    /// broker cannot deliver now (the bridge waits and asks again); the
    /// subscription reconnects on its own.
    fn next(&self) -> BrokerFuture<'_, Delivery>;

    /// A name for logs and metrics, e.g. `nats://127.0.0.1:4222 PAYOUTS/idem`.
    fn describe(&self) -> String;

    /// Whether the subscription holds a live connection to the broker now,
    /// for a readiness probe; without blocking.
    fn connected(&self) -> bool;

    /// Once no more deliveries will be taken: hands back to the broker
    /// what the subscription received and did not hand out (SQS holds
    /// such messages invisible). Nothing to do where the broker takes back
    /// what a closed connection held.
    fn release(&self) -> BrokerFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
}

/// A broker operation that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerError {
    /// The broker and the operation, e.g. `nats ack` or `rabbitmq connect`.
    pub operation: String,
    /// Why, with the client's error chain.
    pub reason: String,
    /// Whether asking again later may work (a lost connection) rather than
    /// never (a stream that does not exist, a refused login).
    pub transient: bool,
    /// The field of the broker's configuration section the failure is
    /// about (e.g. `url` for a server that cannot be reached), when one is.
    pub field: Option<&'static str>,
}

impl BrokerError {
    /// A failure that may pass.
    pub fn transient(operation: impl Into<String>, reason: impl fmt::Display) -> BrokerError {
        BrokerError {
            operation: operation.into(),
            reason: reason.to_string(),
            transient: true,
            field: None,
        }
    }

    /// A failure that will not pass by waiting (configuration, permissions).
    pub fn permanent(operation: impl Into<String>, reason: impl fmt::Display) -> BrokerError {
        BrokerError {
            operation: operation.into(),
            reason: reason.to_string(),
            transient: false,
            field: None,
        }
    }

    /// The same failure, about configuration field `field`.
    pub fn at_field(self, field: &'static str) -> BrokerError {
        BrokerError {
            field: Some(field),
            ..self
        }
    }
}

impl fmt::Display for BrokerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.operation, self.reason)
    }
}

impl std::error::Error for BrokerError {}

/// Which side refused a TLS handshake, and over what, read from the
/// client's error text: rustls' verdicts reach both broker clients as IO
/// errors, so their words are all there is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TlsRefusal {
    /// This client did not trust the server's certificate (another CA, an
    /// expired one): about `ca_file`, or the system's roots.
    ServerNotTrusted,
    /// The server's certificate does not name the url's host: about `url`.
    ServerName,
    /// The server refused this client's certificate, or its absence (an
    /// alert such as `CertificateRequired`, `BadCertificate`, `UnknownCA`
    /// or `CertificateExpired`): about `cert_file`.
    ClientCertificate,
}

impl TlsRefusal {
    fn of(said: &str) -> Option<TlsRefusal> {
        if said.contains("NotValidForName") || said.contains("not valid for name") {
            return Some(TlsRefusal::ServerName);
        }
        if said.contains("peer certificate") || said.contains("InvalidCertificate") {
            return Some(TlsRefusal::ServerNotTrusted);
        }
        let alerts = [
            "CertificateRequired",
            "BadCertificate",
            "UnknownCA",
            "CertificateExpired",
            "CertificateRevoked",
            "CertificateUnknown",
            "UnsupportedCertificate",
        ];
        if said.contains("received fatal alert") && alerts.iter().any(|a| said.contains(a)) {
            return Some(TlsRefusal::ClientCertificate);
        }
        None
    }
}

/// The largest certificate, key or credential file a broker section
/// reads, in bytes.
const FILE_BYTES_MAX: u64 = 4 * 1024 * 1024;

/// A file a broker section names, read whole: at most
/// [`FILE_BYTES_MAX`]; the error names the path.
fn read_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(FILE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() as u64 > FILE_BYTES_MAX {
        return Err(format!(
            "{}: larger than {FILE_BYTES_MAX} bytes",
            path.display()
        ));
    }
    Ok(bytes)
}

/// The first line of a credential file (a password, a token), as it is
/// but for the line's end and trailing blanks; an empty one is an error
/// naming the path.
fn first_line(path: &std::path::Path, what: &str) -> Result<String, String> {
    let bytes = read_file(path)?;
    let text = String::from_utf8_lossy(&bytes);
    let line = text.lines().next().unwrap_or_default().trim_end();
    if line.is_empty() {
        return Err(format!("{}: holds no {what}", path.display()));
    }
    Ok(line.to_owned())
}

/// Reads each relative path among `files` against `dir` (a config file's
/// directory), as both brokers' TLS and credential files are.
fn place_files<'a>(
    dir: &std::path::Path,
    files: impl IntoIterator<Item = &'a mut Option<std::path::PathBuf>>,
) {
    for file in files {
        if let Some(path) = file.take() {
            *file = Some(dir.join(path));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_found_whatever_their_case_and_the_first_wins() {
        let m = Message {
            payload: Bytes::from_static(b"{}"),
            headers: vec![
                ("Idempotency-Key".into(), "a".into()),
                ("idempotency-key".into(), "b".into()),
            ],
            message_id: None,
            content_type: None,
            subject: "payouts".into(),
            delivery: 1,
        };
        assert_eq!(m.header("IDEMPOTENCY-KEY"), Some("a"));
        assert_eq!(m.header("Idempotency-Key-2"), None);
    }

    #[test]
    fn a_refused_handshake_is_told_apart_by_the_side_that_refused() {
        // The texts the clients gave in the TLS tests of both brokers.
        let cases = [
            (
                "IO error: invalid peer certificate: UnknownIssuer",
                Some(TlsRefusal::ServerNotTrusted),
            ),
            (
                "invalid peer certificate: NotValidForName",
                Some(TlsRefusal::ServerName),
            ),
            (
                "invalid peer certificate: certificate not valid for name \"localhost\"",
                Some(TlsRefusal::ServerName),
            ),
            (
                "invalid peer certificate: Expired",
                Some(TlsRefusal::ServerNotTrusted),
            ),
            (
                "received fatal alert: CertificateExpired",
                Some(TlsRefusal::ClientCertificate),
            ),
            (
                "IO error: received fatal alert: CertificateRequired",
                Some(TlsRefusal::ClientCertificate),
            ),
            (
                "IO error: received fatal alert: BadCertificate",
                Some(TlsRefusal::ClientCertificate),
            ),
            (
                "received fatal alert: UnknownCA",
                Some(TlsRefusal::ClientCertificate),
            ),
            ("IO error: received fatal alert: HandshakeFailure", None),
            ("IO error: Connection reset by peer (os error 104)", None),
            ("ACCESS_REFUSED - Login was refused", None),
        ];
        for (said, refusal) in cases {
            assert_eq!(TlsRefusal::of(said), refusal, "{said}");
        }
    }
}
