//! RabbitMQ (AMQP 0.9.1) behind the broker seam, through `lapin`: one
//! durable queue consumed with manual acknowledgements and a bounded
//! prefetch, and every settlement that moves a message carried out as a
//! publish the broker confirms before the original is acknowledged.
//!
//! # Topology
//!
//! [`RabbitSubscription::connect`] declares, idempotently, what it needs
//! (all durable; names default from the queue's):
//!
//! | what | default name | why |
//! | --- | --- | --- |
//! | the queue | `queue` | where the messages wait; its `x-dead-letter-exchange` / `x-dead-letter-routing-key` point at the dead-letter queue, so a message the broker itself rejects (a policy's delivery limit, a `basic.reject` by another client) lands there too |
//! | optional binding | `exchange` + `routing_key` | the queue receives what is published to the exchange |
//! | dead-letter exchange | `<queue>.dlx` (direct) | where [`Settle::dead_letter`] publishes; bound to the dead-letter queue by that queue's name |
//! | dead-letter queue | `<queue>.dead` | |
//! | late queue | `<queue>.late` | where [`Settle::late`] copies a late replay |
//! | retry queue | `<queue>.retry` | holds retried copies until their TTL; no consumer |
//!
//! Re-declaring an existing queue with other arguments is refused by the
//! broker (`PRECONDITION_FAILED`); the error names the queue and the
//! argument, and is permanent: delete the queue or give this configuration
//! a queue of its own.
//!
//! # Settlements
//!
//! - `ack` → `basic.ack`.
//! - `retry(after)` → RabbitMQ has no per-message delay without a plugin, so
//!   a copy is published to the retry queue with a per-message `expiration`
//!   of `after` (ms); the retry queue dead-letters expired messages back to
//!   the queue through the default exchange. Once the copy is confirmed the
//!   original is acknowledged. A retry is therefore a *republish*: the
//!   broker's own `redelivered` flag starts again on the copy, the delivery
//!   count travels in the `x-idem-delivery` header and the original routing
//!   key in `x-idem-routing-key`; headers, message id and the other
//!   properties are kept. The broker expires messages only at the head of a
//!   queue, so a copy with a short delay waits behind a longer one queued
//!   before it: `after` is a lower bound, and the upper bound is the longest
//!   delay already waiting.
//! - `dead_letter(reason)` → a copy with `Idem-Reason` and
//!   `Idem-Reason-Detail` headers is published to the dead-letter exchange,
//!   confirmed, then the original is acknowledged. A plain `basic.reject`
//!   would reach the same queue through `x-dead-letter-exchange`, but could
//!   not carry the reason.
//! - `late(reason)` → the same, to the late queue.
//!
//! Every copy is persistent, published `mandatory` (a copy no queue takes
//! is an error, not a silent drop), drops `user_id` (the broker checks it
//! against the publishing login) and the original `expiration`.
//!
//! A copy the broker returns unrouted (someone deleted the dead-letter,
//! late or retry queue, or a binding; the channel stays open) makes the
//! settlement declare the topology again and send the copy again, up to
//! three more times, pausing 0.2 s and then 0.4 s before the last two: a
//! deleted queue is back before the original is acknowledged, and a copy
//! that still finds no queue holds its worker over half a second before
//! the message is handed back, instead of spinning through the queue.
//!
//! A settlement that fails (no confirm, a copy still returned unrouted, the
//! connection gone, `settle_timeout_ms` passed) returns `Err` and hands the
//! original back with `basic.nack` + requeue while its channel still works,
//! so the broker redelivers it at once (flagged redelivered, so counted)
//! rather than only when the connection closes. If the copy was confirmed
//! but the acknowledgement then failed, the original comes back and a
//! second copy may follow: copies are at-least-once, which the bridge's
//! records absorb. If the broker closed the publishing channel (a copy sent
//! to an exchange someone deleted), the next `next()` opens a fresh
//! connection and declares the topology again.
//!
//! # Delivery count
//!
//! [`Message::delivery`] is the `x-idem-delivery` header if present (else 1),
//! plus 1 when the broker sets `redelivered`. Retries are counted exactly.
//! Crash redeliveries (a connection lost with the message unacknowledged)
//! are counted at most once per copy: AMQP's `redelivered` is a flag, not a
//! count, so a message redelivered three times after crashes reads 2.
//!
//! # Headers
//!
//! AMQP headers are a table: [`Message::headers`] lists them sorted by name
//! (case kept, no name twice). Text, numbers and booleans are shown as text;
//! arrays (`x-death`), tables, byte arrays and non-UTF-8 text are not shown
//! but travel with every copy. This module's own headers are hidden, and so
//! are the `x-first-death-*` / `x-last-death-*` headers the broker adds when
//! a retried copy leaves the retry queue (those naming another queue stay).
//!
//! # Reconnection
//!
//! [`Subscription::next`] connects on first use and after any loss; while
//! the broker cannot be reached it returns a transient [`BrokerError`] at
//! once and tries again on the next call. Deliveries taken before the loss
//! can no longer be settled (their channel is gone); settling them fails
//! and the broker redelivers them. lapin can recover a connection and replay
//! the topology by itself; a fresh connection per loss is used instead so
//! that a delivery from before the loss can only fail to settle (lapin fixed
//! acknowledging on a recovered channel as late as 4.12.3), and so that a
//! declaration the broker refuses surfaces as this module's error.
//!
//! A broker that cannot be reached is named in the error
//! (`amqp://user:***@host:port/vhost`, the password masked), about field
//! `url`.
//!
//! # Content type
//!
//! [`Message::content_type`] is the AMQP `content_type` property, else a
//! `content-type` header (any case).
//!
//! # TLS and credentials
//!
//! An `amqps://` url speaks TLS (port 5671 unless given). The broker's
//! certificate must chain to the system's roots or to `ca_file`, and name
//! the url's host. `cert_file` and `key_file` present a client
//! certificate to a broker that verifies its clients. The user and
//! password are the url's, or the password is the first line of
//! `password_file` (the url then names the user only). A refused
//! handshake is an error about `ca_file` (or `url` when none is named),
//! naming the file; a refused login one about `password_file` or `url`;
//! no error, log line or `describe()` shows a password.
//!
//! The queue is a classic queue.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use idem_broker::{Subscription, rabbitmq::{RabbitConfig, RabbitSubscription}};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config: RabbitConfig = toml::from_str(r#"
//!     url = "amqp://guest:guest@127.0.0.1:5672/%2f"
//!     queue = "payouts"
//!     prefetch = 8
//! "#)?;
//! let subscription = RabbitSubscription::connect(&config).await?;
//! loop {
//!     match subscription.next().await {
//!         Ok(delivery) => {
//!             println!("{:?} (delivery {})", delivery.message.payload, delivery.message.delivery);
//!             delivery.settle.retry(Duration::from_secs(5)).await?;
//!         }
//!         Err(e) if e.transient => tokio::time::sleep(Duration::from_secs(1)).await,
//!         Err(e) => return Err(e.into()),
//!     }
//! }
//! # }
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use idem_core::FieldError;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{
    Acker, BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, Consumer,
    DefaultConnectionBuilder,
};
use serde::Deserialize;
use tokio::sync::Mutex;

use crate::{
    BrokerError, BrokerFuture, Delivery, Message, Reason, Settle, Subscription, TlsRefusal,
};

/// The header that carries the delivery count across retries.
pub const DELIVERY_HEADER: &str = "x-idem-delivery";
/// The header that carries the original routing key across retries.
pub const ROUTING_KEY_HEADER: &str = "x-idem-routing-key";
pub use crate::{REASON_DETAIL_HEADER, REASON_HEADER};

/// Where and how to consume, as read from a configuration file. Every name
/// left out is derived from `queue`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RabbitConfig {
    /// The broker, `amqp://user:password@host:port/vhost` (the vhost
    /// percent-encoded: `/` is `%2f`). Default
    /// `amqp://guest:guest@127.0.0.1:5672/%2f`.
    #[serde(default = "default_url")]
    pub url: String,
    /// The queue to consume; declared durable if missing. Required.
    pub queue: String,
    /// An exchange to bind the queue to, declared durable of
    /// `exchange_kind` if missing (names starting with `amq.` are the
    /// broker's own and only bound). None: publishers address the queue
    /// directly through the default exchange.
    #[serde(default)]
    pub exchange: Option<String>,
    /// The kind `exchange` is declared with. Default `direct`.
    #[serde(default)]
    pub exchange_kind: ExchangeKind,
    /// The binding key between `exchange` and the queue. Default: the queue's
    /// name. Only with `exchange`.
    #[serde(default)]
    pub routing_key: Option<String>,
    /// How many deliveries may be unsettled at once on one subscription
    /// (`basic.qos`), 1..=65535. Default 16.
    #[serde(default = "default_prefetch")]
    pub prefetch: u16,
    /// The exchange [`Settle::dead_letter`] publishes to and the queue's
    /// `x-dead-letter-exchange`; declared durable, direct. Default
    /// `<queue>.dlx`.
    #[serde(default)]
    pub dead_letter_exchange: Option<String>,
    /// Where dead-lettered messages wait for a person; declared durable and
    /// bound to `dead_letter_exchange` by its own name. Default `<queue>.dead`.
    #[serde(default)]
    pub dead_letter_queue: Option<String>,
    /// Where late replays are copied; declared durable. Default `<queue>.late`.
    #[serde(default)]
    pub late_queue: Option<String>,
    /// How a retry waits. Default `ttl_queue`.
    #[serde(default)]
    pub retry: RetryMechanism,
    /// How long connecting and declaring may take before `next()` gives up
    /// with a transient error. Default 10 000.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// How long one settlement (publish, confirm, ack) may take before it
    /// fails, leaving the message unacknowledged. Default 30 000.
    #[serde(default = "default_settle_timeout_ms")]
    pub settle_timeout_ms: u64,
    /// PEM CA certificates the broker's certificate may chain to, besides
    /// the system's roots. Only with an `amqps://` url. Relative to the
    /// config file.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate for a broker that verifies its clients; with
    /// `key_file`, or neither. Only with an `amqps://` url.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file` (`PRIVATE KEY`, `RSA PRIVATE KEY` or
    /// `EC PRIVATE KEY`).
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// A file whose first line is the password of the url's user, as it
    /// is: no percent-encoding, only the line's end (and any trailing
    /// blanks) removed. The url then holds no password.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
}

/// The kind of exchange the queue is bound to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExchangeKind {
    /// Routes on the exact routing key.
    #[default]
    Direct,
    /// Routes on routing-key patterns (`payouts.*`).
    Topic,
    /// Routes every message to every bound queue.
    Fanout,
    /// Routes on header values.
    Headers,
}

/// How [`Settle::retry`] makes the broker wait.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryMechanism {
    /// A copy waits in `<queue>.retry` for its per-message TTL, then the
    /// broker dead-letters it back to the queue. Needs no plugin.
    #[default]
    TtlQueue,
}

/// The names a validated configuration declares and publishes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    queue: ShortString,
    binding: Option<Binding>,
    retry_queue: ShortString,
    dead_letter_exchange: ShortString,
    dead_letter_queue: ShortString,
    late_queue: ShortString,
}

/// One queue consumed from RabbitMQ; see the module docs.
pub struct RabbitSubscription {
    settings: Arc<Settings>,
    link: Mutex<Option<Link>>,
    /// The current link's connection status, readable while `next` holds
    /// the link; `None` while there is no link.
    status: std::sync::Mutex<Option<lapin::ConnectionStatus>>,
}

impl RabbitConfig {
    /// The broker as logs and `idem consume --check` show it, the
    /// password masked (`amqp://user:***@host:5672/%2f`).
    pub fn masked_url(&self) -> String {
        match self.url.parse::<AMQPUri>() {
            Ok(uri) => masked(&uri),
            Err(e) => format!("(invalid: {e})"),
        }
    }

    /// A configuration for `queue` with every other field at its default.
    pub fn new(queue: impl Into<String>) -> RabbitConfig {
        RabbitConfig {
            url: default_url(),
            queue: queue.into(),
            exchange: None,
            exchange_kind: ExchangeKind::default(),
            routing_key: None,
            prefetch: default_prefetch(),
            dead_letter_exchange: None,
            dead_letter_queue: None,
            late_queue: None,
            retry: RetryMechanism::default(),
            connect_timeout_ms: default_connect_timeout_ms(),
            settle_timeout_ms: default_settle_timeout_ms(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            password_file: None,
        }
    }

    /// The files it names, relative ones read against `dir` (the config
    /// file's directory).
    pub fn relative_to(mut self, dir: &Path) -> RabbitConfig {
        crate::place_files(
            dir,
            [
                &mut self.ca_file,
                &mut self.cert_file,
                &mut self.key_file,
                &mut self.password_file,
            ],
        );
        self
    }

    /// Checks every field and derives the names left out.
    pub fn validate(&self) -> Result<Topology, FieldError> {
        self.settings().map(|s| s.topology)
    }

    /// Reads the files it names: a missing or unusable one is an error
    /// naming its field and path.
    fn settings(&self) -> Result<Settings, FieldError> {
        let mut uri = parse_url(&self.url)?;
        let tls = self.tls(uri.scheme.clone())?;
        if let Some(path) = &self.password_file {
            match url_userinfo(&self.url) {
                Some((_, Some(_))) => {
                    return Err(invalid(
                        "password_file",
                        "the url holds a password too: keep one of them",
                    ));
                }
                Some((user, None)) if !user.is_empty() => {}
                _ => {
                    return Err(invalid(
                        "password_file",
                        "needs the url to name its user (amqps://user@host/vhost); \
                         without one the client would log in as guest",
                    ));
                }
            }
            uri.authority.userinfo.password = crate::first_line(path, "password")
                .map_err(|reason| invalid("password_file", reason))?;
        }
        let topology = self.topology()?;
        if self.prefetch == 0 {
            return Err(invalid(
                "prefetch",
                "must be at least 1 (0 would be unbounded)",
            ));
        }
        if self.connect_timeout_ms == 0 {
            return Err(invalid("connect_timeout_ms", "must be at least 1"));
        }
        if self.settle_timeout_ms == 0 {
            return Err(invalid("settle_timeout_ms", "must be at least 1"));
        }
        Ok(Settings {
            uri,
            tls,
            uses_password_file: self.password_file.is_some(),
            ca_file: self.ca_file.clone(),
            topology,
            prefetch: self.prefetch,
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            settle_timeout: Duration::from_millis(self.settle_timeout_ms),
        })
    }

    /// The TLS files, read; refused with an `amqp://` url, which would
    /// never use them.
    fn tls(&self, scheme: AMQPScheme) -> Result<OwnedTLSConfig, FieldError> {
        let files = crate::TlsFiles::new(&self.ca_file, &self.cert_file, &self.key_file);
        if scheme == AMQPScheme::AMQP
            && let Some(field) = files.first_named()
        {
            return Err(invalid(
                field,
                "needs an amqps:// url: an amqp:// connection is not encrypted",
            ));
        }
        // The TLS client starts from the system's roots even when ca_file
        // adds one, and cannot connect at all without them.
        if scheme == AMQPScheme::AMQPS && rustls_native_certs::load_native_certs().certs.is_empty()
        {
            return Err(invalid(
                "url",
                "amqps:// needs the system's trusted root certificates, and this system has \
                 none: install ca-certificates, or point SSL_CERT_FILE at a bundle",
            ));
        }
        let identity = match files.identity()? {
            None => None,
            Some((cert, key)) => Some(OwnedIdentity::PKCS8 {
                pem: pem(cert, "cert_file", "CERTIFICATE")?,
                key: pem(key, "key_file", "PRIVATE KEY")?,
            }),
        };
        let cert_chain = match files.ca_file {
            Some(ca) => {
                Some(String::from_utf8_lossy(&pem(ca, "ca_file", "CERTIFICATE")?).into_owned())
            }
            None => None,
        };
        Ok(OwnedTLSConfig {
            identity,
            cert_chain,
        })
    }

    fn topology(&self) -> Result<Topology, FieldError> {
        let queue = name("queue", &self.queue)?;
        let derived = |field, given: &Option<String>, suffix: &str| match given {
            Some(n) => name(field, n),
            None => name(field, &format!("{}{suffix}", self.queue)),
        };
        let retry_queue = name("queue", &format!("{}.retry", self.queue))?;
        let dead_letter_exchange =
            derived("dead_letter_exchange", &self.dead_letter_exchange, ".dlx")?;
        let dead_letter_queue = derived("dead_letter_queue", &self.dead_letter_queue, ".dead")?;
        let late_queue = derived("late_queue", &self.late_queue, ".late")?;
        for (field, q) in [
            ("dead_letter_queue", &dead_letter_queue),
            ("late_queue", &late_queue),
        ] {
            if q == &queue || q == &retry_queue {
                return Err(invalid(
                    field,
                    format!("`{q}` is the queue or its retry queue"),
                ));
            }
        }
        if dead_letter_queue == late_queue {
            return Err(invalid("late_queue", "must differ from dead_letter_queue"));
        }
        let binding = match (&self.exchange, &self.routing_key) {
            (None, Some(_)) => return Err(invalid("routing_key", "needs `exchange`")),
            (None, None) => None,
            (Some(exchange), key) => Some(Binding {
                exchange: name("exchange", exchange)?,
                kind: self.exchange_kind,
                routing_key: match key {
                    Some(k) => short("routing_key", k)?,
                    None => queue.clone(),
                },
            }),
        };
        Ok(Topology {
            queue,
            binding,
            retry_queue,
            dead_letter_exchange,
            dead_letter_queue,
            late_queue,
        })
    }
}

impl Topology {
    /// The queue consumed.
    pub fn queue(&self) -> &str {
        self.queue.as_str()
    }

    /// Where retried copies wait: `<queue>.retry`.
    pub fn retry_queue(&self) -> &str {
        self.retry_queue.as_str()
    }

    /// Where dead-lettered copies are published.
    pub fn dead_letter_exchange(&self) -> &str {
        self.dead_letter_exchange.as_str()
    }

    /// Where dead-lettered copies wait.
    pub fn dead_letter_queue(&self) -> &str {
        self.dead_letter_queue.as_str()
    }

    /// Where late replays are copied.
    pub fn late_queue(&self) -> &str {
        self.late_queue.as_str()
    }

    /// The exchange the queue is bound to and the binding key, if any.
    pub fn binding(&self) -> Option<(&str, &str)> {
        self.binding
            .as_ref()
            .map(|b| (b.exchange.as_str(), b.routing_key.as_str()))
    }
}

impl RabbitSubscription {
    /// Validates `config`, connects, and declares the topology. A config
    /// error or a declaration the broker refuses is permanent; a broker that
    /// does not answer is transient.
    pub async fn connect(config: &RabbitConfig) -> Result<RabbitSubscription, BrokerError> {
        let settings = config
            .settings()
            .map_err(|e| BrokerError::permanent("rabbitmq config", e))?;
        let settings = Arc::new(settings);
        let link = Link::open(&settings).await?;
        let status = std::sync::Mutex::new(Some(link.connection.status().clone()));
        Ok(RabbitSubscription {
            settings,
            link: Mutex::new(Some(link)),
            status,
        })
    }

    fn note_status(&self, status: Option<lapin::ConnectionStatus>) {
        *self.status.lock().unwrap_or_else(|e| e.into_inner()) = status;
    }

    /// The names this subscription declared.
    pub fn topology(&self) -> &Topology {
        &self.settings.topology
    }

    /// Closes the connection; the broker requeues every delivery not yet
    /// settled. Waits for a `next()` in progress to return. A later `next()`
    /// connects again.
    pub async fn close(&self) -> Result<(), BrokerError> {
        let link = self.link.lock().await.take();
        match link {
            Some(s) => s
                .connection
                .close(200, "idem consume closes".into())
                .await
                .map_err(|e| amqp_error("rabbitmq close", &e)),
            None => Ok(()),
        }
    }
}

impl Subscription for RabbitSubscription {
    fn next(&self) -> BrokerFuture<'_, Delivery> {
        Box::pin(async move {
            let mut slot = self.link.lock().await;
            loop {
                if slot.is_none() {
                    self.note_status(None);
                    let link = Link::open(&self.settings).await?;
                    self.note_status(Some(link.connection.status().clone()));
                    *slot = Some(link);
                }
                let Some(link) = slot.as_mut() else {
                    return Err(BrokerError::transient("rabbitmq receive", "no connection"));
                };
                match link.consumer.next().await {
                    Some(Ok(delivery)) if link.usable() => {
                        return Ok(self.delivery(delivery, link.publisher.clone()));
                    }
                    Some(Ok(delivery)) => {
                        // The broker closed the publishing channel (a copy
                        // sent to an exchange someone deleted): no settlement
                        // but ack could work. Hand the delivery back and
                        // start afresh, declaring the topology again.
                        let _ = delivery.acker.nack(hand_back()).await;
                        *slot = None;
                    }
                    Some(Err(e)) => {
                        *slot = None;
                        return Err(BrokerError::transient("rabbitmq receive", e));
                    }
                    None => {
                        *slot = None;
                        return Err(BrokerError::transient(
                            "rabbitmq receive",
                            "the broker cancelled the consumer (queue deleted or connection closed)",
                        ));
                    }
                }
            }
        })
    }

    fn connected(&self) -> bool {
        let held = self.status.lock().unwrap_or_else(|e| e.into_inner());
        held.as_ref().is_some_and(|status| status.connected())
    }

    fn describe(&self) -> String {
        let a = &self.settings.uri.authority;
        format!(
            "{}://{}:{} vhost {} queue {}",
            scheme(&self.settings.uri),
            a.host,
            a.port,
            self.settings.uri.vhost,
            self.settings.topology.queue
        )
    }
}

impl fmt::Debug for RabbitSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitSubscription")
            .field("describe", &self.describe())
            .finish_non_exhaustive()
    }
}

/// A validated configuration.
struct Settings {
    uri: AMQPUri,
    /// The CA file's and client certificate's contents (empty for amqp://).
    tls: OwnedTLSConfig,
    /// Whether the password came from `password_file`.
    uses_password_file: bool,
    ca_file: Option<PathBuf>,
    topology: Topology,
    prefetch: u16,
    connect_timeout: Duration,
    settle_timeout: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Binding {
    exchange: ShortString,
    kind: ExchangeKind,
    routing_key: ShortString,
}

/// One connection: the consumer, and the confirm-mode channel settlements
/// publish on.
struct Link {
    connection: Connection,
    consumer: Consumer,
    publisher: Channel,
    // Kept so the consumer's channel lives as long as the link.
    _consuming: Channel,
}

/// How one delivery is settled: everything needed to ack it or republish it.
struct RabbitSettle {
    acker: Acker,
    publisher: Channel,
    settings: Arc<Settings>,
    properties: BasicProperties,
    payload: Bytes,
    subject: String,
    delivery: u64,
}

/// Whether a confirmed copy reached a queue; if not, why.
enum Routed {
    Yes,
    No(BrokerError),
}

/// What a settlement does before it acknowledges the original.
enum Settlement {
    Ack,
    Retry(Duration),
    DeadLetter(Reason),
    Late(Reason),
}

impl Settlement {
    fn operation(&self) -> &'static str {
        match self {
            Settlement::Ack => "rabbitmq ack",
            Settlement::Retry(_) => "rabbitmq retry",
            Settlement::DeadLetter(_) => "rabbitmq dead-letter",
            Settlement::Late(_) => "rabbitmq late",
        }
    }
}

impl Link {
    fn usable(&self) -> bool {
        self.connection.status().connected() && self.publisher.status().connected()
    }

    async fn open(settings: &Settings) -> Result<Link, BrokerError> {
        match tokio::time::timeout(settings.connect_timeout, Link::open_now(settings)).await {
            Ok(link) => link,
            Err(_) => Err(BrokerError::transient(
                format!("rabbitmq connect to {}", masked(&settings.uri)),
                format!(
                    "no answer within {} ms (connect_timeout_ms)",
                    settings.connect_timeout.as_millis()
                ),
            )
            .at_field("url")),
        }
    }

    async fn open_now(settings: &Settings) -> Result<Link, BrokerError> {
        let properties =
            ConnectionProperties::default().with_connection_name("idem consume".into());
        let connection = DefaultConnectionBuilder::new()
            .map_err(|e| amqp_error("rabbitmq runtime", &e))?
            .with_uri(settings.uri.clone())
            .with_properties(properties)
            .with_tls_config(settings.tls.clone())
            .connect()
            .await
            .map_err(|e| connect_error(settings, &e))?;
        let publisher = channel(&connection).await?;
        declare(&publisher, &settings.topology).await?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| amqp_error("rabbitmq confirm.select", &e))?;
        let consuming = channel(&connection).await?;
        consuming
            .basic_qos(settings.prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| amqp_error("rabbitmq basic.qos", &e))?;
        let consumer = consuming
            .basic_consume(
                settings.topology.queue.clone(),
                ShortString::default(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| amqp_error("rabbitmq basic.consume", &e))?;
        Ok(Link {
            connection,
            consumer,
            publisher,
            _consuming: consuming,
        })
    }
}

impl RabbitSubscription {
    fn delivery(&self, d: lapin::message::Delivery, publisher: Channel) -> Delivery {
        let headers = d.properties.headers().as_ref();
        let subject = headers
            .and_then(|h| h.inner().get(ROUTING_KEY_HEADER))
            .and_then(text)
            .unwrap_or_else(|| d.routing_key.to_string());
        let delivery = delivery_count(headers, d.redelivered);
        let payload = Bytes::from(d.data);
        let mut message = Message {
            payload: payload.clone(),
            headers: headers
                .map(|h| visible_headers(h, self.settings.topology.retry_queue.as_str()))
                .unwrap_or_default(),
            message_id: d.properties.message_id().as_ref().map(|m| m.to_string()),
            content_type: None,
            subject: subject.clone(),
            delivery,
        };
        message.content_type = d
            .properties
            .content_type()
            .as_ref()
            .map(ToString::to_string)
            .or_else(|| message.header("content-type").map(str::to_owned));
        let settle = RabbitSettle {
            acker: d.acker,
            publisher,
            settings: self.settings.clone(),
            properties: d.properties,
            payload,
            subject,
            delivery,
        };
        Delivery {
            message,
            settle: Box::new(settle),
        }
    }
}

impl Settle for RabbitSettle {
    fn ack(self: Box<Self>) -> BrokerFuture<'static, ()> {
        self.carry_out(Settlement::Ack)
    }

    fn retry(self: Box<Self>, after: Duration) -> BrokerFuture<'static, ()> {
        self.carry_out(Settlement::Retry(after))
    }

    fn dead_letter(self: Box<Self>, reason: Reason) -> BrokerFuture<'static, ()> {
        self.carry_out(Settlement::DeadLetter(reason))
    }

    fn late(self: Box<Self>, reason: Reason) -> BrokerFuture<'static, ()> {
        self.carry_out(Settlement::Late(reason))
    }
}

impl RabbitSettle {
    /// Settles within the time limit; on failure hands the message back.
    fn carry_out(self: Box<Self>, settlement: Settlement) -> BrokerFuture<'static, ()> {
        Box::pin(async move {
            let operation = settlement.operation();
            let limit = self.settings.settle_timeout;
            let result = match tokio::time::timeout(limit, self.settle(settlement)).await {
                Ok(done) => done,
                Err(_) => Err(BrokerError::transient(
                    operation,
                    format!("not done within {} ms", limit.as_millis()),
                )),
            };
            if result.is_err() {
                self.hand_back().await;
            }
            result
        })
    }

    /// Publishes the copy the settlement needs, waits for the broker to
    /// take it, then acknowledges the original.
    async fn settle(&self, settlement: Settlement) -> Result<(), BrokerError> {
        let topology = &self.settings.topology;
        match settlement {
            Settlement::Ack => {}
            Settlement::Retry(after) => {
                let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
                let next = i64::try_from(self.delivery.saturating_add(1)).unwrap_or(i64::MAX);
                let mut headers = self.copied_headers();
                headers.insert(DELIVERY_HEADER.into(), AMQPValue::LongLongInt(next));
                let properties = self
                    .copied_properties(headers)
                    .with_expiration(ms.to_string().into());
                let to = topology.retry_queue.clone();
                self.publish_routed(ShortString::default(), to, properties)
                    .await?;
            }
            Settlement::DeadLetter(reason) => {
                let properties = self.copied_properties(self.reason_headers(&reason));
                let exchange = topology.dead_letter_exchange.clone();
                let key = topology.dead_letter_queue.clone();
                self.publish_routed(exchange, key, properties).await?;
            }
            Settlement::Late(reason) => {
                let properties = self.copied_properties(self.reason_headers(&reason));
                let to = topology.late_queue.clone();
                self.publish_routed(ShortString::default(), to, properties)
                    .await?;
            }
        }
        self.ack_now().await
    }

    /// After a failed settlement, `basic.nack` with requeue, so the broker
    /// redelivers the message now rather than when the connection closes.
    /// Best effort: on a dead channel the broker requeues it anyway.
    async fn hand_back(&self) {
        let _ = tokio::time::timeout(HAND_BACK_LIMIT, self.acker.nack(hand_back())).await;
    }

    async fn ack_now(&self) -> Result<(), BrokerError> {
        match self.acker.ack(BasicAckOptions::default()).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(BrokerError::transient(
                "rabbitmq ack",
                "the delivery's channel is closed; the broker will redeliver the message",
            )),
            Err(e) => Err(BrokerError::transient("rabbitmq ack", e)),
        }
    }

    /// Publishes a copy and waits until a queue has taken it. A copy that
    /// comes back unroutable (someone deleted the dead-letter, late or
    /// retry queue, or its binding) makes the topology be declared again
    /// and the copy be published again, with backoff, a bounded number of
    /// times; the original is acknowledged only once a copy was routed.
    async fn publish_routed(
        &self,
        exchange: ShortString,
        routing_key: ShortString,
        properties: BasicProperties,
    ) -> Result<(), BrokerError> {
        let mut backoff = REDECLARE_BACKOFF;
        let mut attempt = 1;
        loop {
            let unroutable = match self
                .publish(exchange.clone(), routing_key.clone(), properties.clone())
                .await?
            {
                Routed::Yes => return Ok(()),
                Routed::No(unroutable) => unroutable,
            };
            if attempt >= REDECLARE_ATTEMPTS {
                return Err(unroutable);
            }
            if attempt == 1 {
                // Once per settlement: the attempts after it say nothing new.
                tracing::warn!(queue = %self.settings.topology.queue, reason = %unroutable.reason,
                    "a copy came back unroutable; declaring the topology again");
            } else {
                tokio::time::sleep(backoff).await;
                backoff = backoff.saturating_mul(2);
            }
            declare(&self.publisher, &self.settings.topology).await?;
            attempt += 1;
        }
    }

    /// Publishes a copy of the payload and waits until the broker has taken
    /// it: confirmed, and routed to at least one queue (else `Routed::No`).
    async fn publish(
        &self,
        exchange: ShortString,
        routing_key: ShortString,
        properties: BasicProperties,
    ) -> Result<Routed, BrokerError> {
        let to = format!("`{routing_key}` through exchange `{exchange}`");
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirmation = self
            .publisher
            .basic_publish(exchange, routing_key, options, &self.payload, properties)
            .await
            .map_err(|e| BrokerError::transient("rabbitmq publish", e))?
            .await
            .map_err(|e| BrokerError::transient("rabbitmq publish confirm", e))?;
        match confirmation {
            Confirmation::Ack(None) => Ok(Routed::Yes),
            Confirmation::Ack(Some(returned)) => Ok(Routed::No(BrokerError::permanent(
                "rabbitmq publish",
                format!(
                    "no queue took the copy sent to {to} ({}), even after declaring the \
                     topology again",
                    returned.reply_text
                ),
            ))),
            Confirmation::Nack(_) => Err(BrokerError::transient(
                "rabbitmq publish",
                format!("the broker refused the copy sent to {to} (nack)"),
            )),
            Confirmation::NotRequested => Err(BrokerError::permanent(
                "rabbitmq publish",
                "the channel is not in confirm mode",
            )),
        }
    }

    fn copied_headers(&self) -> FieldTable {
        let mut headers = self.properties.headers().clone().unwrap_or_default();
        headers.insert(
            ROUTING_KEY_HEADER.into(),
            AMQPValue::LongString(LongString::from(self.subject.as_str())),
        );
        headers
    }

    fn reason_headers(&self, reason: &Reason) -> FieldTable {
        let mut headers = self.copied_headers();
        headers.insert(
            REASON_HEADER.into(),
            AMQPValue::LongString(reason.code.as_str().into()),
        );
        headers.insert(
            REASON_DETAIL_HEADER.into(),
            AMQPValue::LongString(reason.detail.as_str().into()),
        );
        headers
    }

    /// The original's properties for a copy: persistent, with `headers`,
    /// without `expiration` (a copy must not vanish) and `user_id` (the
    /// broker refuses one that is not the publishing login's).
    fn copied_properties(&self, headers: FieldTable) -> BasicProperties {
        let p = &self.properties;
        let mut copy = BasicProperties::default()
            .with_delivery_mode(PERSISTENT)
            .with_headers(headers);
        if let Some(v) = p.content_type() {
            copy = copy.with_content_type(v.clone());
        }
        if let Some(v) = p.content_encoding() {
            copy = copy.with_content_encoding(v.clone());
        }
        if let Some(v) = p.priority() {
            copy = copy.with_priority(*v);
        }
        if let Some(v) = p.correlation_id() {
            copy = copy.with_correlation_id(v.clone());
        }
        if let Some(v) = p.reply_to() {
            copy = copy.with_reply_to(v.clone());
        }
        if let Some(v) = p.message_id() {
            copy = copy.with_message_id(v.clone());
        }
        if let Some(v) = p.timestamp() {
            copy = copy.with_timestamp(*v);
        }
        if let Some(v) = p.kind() {
            copy = copy.with_type(v.clone());
        }
        if let Some(v) = p.app_id() {
            copy = copy.with_app_id(v.clone());
        }
        copy
    }
}

/// AMQP `delivery_mode` for a message written to disk.
const PERSISTENT: u8 = 2;

/// How many times a copy is published when it comes back unroutable (the
/// topology declared again before each retry), and the pause before the
/// third try (doubled before the fourth): a copy that still cannot be
/// routed holds its worker over half a second before it is handed back,
/// rather than spinning through the queue.
const REDECLARE_ATTEMPTS: u32 = 4;
const REDECLARE_BACKOFF: Duration = Duration::from_millis(200);

/// How long handing a message back after a failed settlement may take.
const HAND_BACK_LIMIT: Duration = Duration::from_secs(1);

/// `basic.nack` that puts the message back at the head of its queue.
fn hand_back() -> BasicNackOptions {
    BasicNackOptions {
        requeue: true,
        multiple: false,
    }
}

fn default_url() -> String {
    "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned()
}

fn default_prefetch() -> u16 {
    16
}

fn default_connect_timeout_ms() -> u64 {
    10_000
}

fn default_settle_timeout_ms() -> u64 {
    30_000
}

fn invalid(field: &'static str, reason: impl Into<String>) -> FieldError {
    FieldError::new(field, reason)
}

fn parse_url(url: &str) -> Result<AMQPUri, FieldError> {
    // The client's parser takes the host from the url's domain name: an
    // IPv6 address has none, and it would connect to localhost instead.
    if url_authority(url).contains('[') {
        return Err(invalid(
            "url",
            "an IPv6 address is not supported by the AMQP client (it would reach localhost): \
             use a host name",
        ));
    }
    url.parse()
        .map_err(|e| invalid("url", format!("not an AMQP URL: {e}")))
}

/// `user@host:port` of `url`.
fn url_authority(url: &str) -> &str {
    url.split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split(['/', '?', '#'])
        .next()
        .unwrap_or_default()
}

/// The user and password `url` spells, if it spells any (`user@`,
/// `user:password@`); the parsed url cannot tell, as it fills in `guest`
/// for what is left out.
fn url_userinfo(url: &str) -> Option<(&str, Option<&str>)> {
    let (userinfo, _) = url_authority(url).rsplit_once('@')?;
    Some(match userinfo.split_once(':') {
        Some((user, password)) => (user, Some(password)),
        None => (userinfo, None),
    })
}

/// A PEM file of certificates (`label` "CERTIFICATE", each one parsed) or
/// of one private key (PKCS#8, RSA or EC; an encrypted key cannot be
/// read), returned whole for the TLS client.
fn pem(path: &Path, field: &'static str, label: &str) -> Result<Vec<u8>, FieldError> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bytes = crate::read_file(path).map_err(|reason| invalid(field, reason))?;
    let usable = if label == "CERTIFICATE" {
        CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<Vec<_>, _>>()
            .is_ok_and(|certs| !certs.is_empty())
    } else {
        PrivateKeyDer::from_pem_slice(&bytes).is_ok()
    };
    if !usable {
        return Err(invalid(
            field,
            format!(
                "{}: holds no usable PEM {label} (an encrypted key cannot be read)",
                path.display()
            ),
        ));
    }
    Ok(bytes)
}

/// A failed connection, about the field that can fix it: a refused
/// handshake is the trust's (`ca_file`, or the system's roots through
/// `url`), a broker asking for a client certificate `cert_file`'s, a
/// refused login the password's. rustls' verdict reaches lapin as an IO
/// error, so it is recognised by its words.
fn connect_error(settings: &Settings, e: &lapin::Error) -> BrokerError {
    let operation = format!("rabbitmq connect to {}", masked(&settings.uri));
    let said = e.to_string();
    let login_refused = matches!(
        e.kind(),
        lapin::ErrorKind::ProtocolError(amqp)
            if matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED))
    ) || said.contains("ACCESS_REFUSED");
    match TlsRefusal::of(&said) {
        Some(TlsRefusal::ClientCertificate) => {
            return BrokerError::permanent(operation, e).at_field("cert_file");
        }
        Some(TlsRefusal::ServerName) => {
            return BrokerError::permanent(operation, e).at_field("url");
        }
        Some(TlsRefusal::ServerNotTrusted) => {
            return match &settings.ca_file {
                Some(ca) => {
                    BrokerError::permanent(format!("{operation} (ca_file {})", ca.display()), e)
                        .at_field("ca_file")
                }
                None => BrokerError::permanent(operation, e).at_field("url"),
            };
        }
        None => {}
    }
    if login_refused && settings.uses_password_file {
        return BrokerError::permanent(operation, e).at_field("password_file");
    }
    // A broker that requires a client certificate and got none may end
    // the connection without a word (RabbitMQ resets it): said as a hint,
    // since a reset can also be the network's.
    let reset = matches!(
        e.kind(),
        lapin::ErrorKind::IOError(io) if matches!(
            io.kind(),
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::BrokenPipe
        )
    );
    if reset && settings.uri.scheme == AMQPScheme::AMQPS && settings.tls.identity.is_none() {
        let reason = format!(
            "{e} (if the broker requires a client certificate, set cert_file and key_file)"
        );
        return BrokerError::transient(operation, reason).at_field("url");
    }
    amqp_error(&operation, e).at_field("url")
}

/// An AMQP short string (at most 255 bytes).
fn short(field: &'static str, value: &str) -> Result<ShortString, FieldError> {
    ShortString::try_new(value).map_err(|e| invalid(field, e.to_string()))
}

/// A queue or exchange name this configuration declares.
fn name(field: &'static str, value: &str) -> Result<ShortString, FieldError> {
    if value.is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    if value.starts_with("amq.") && field != "exchange" {
        return Err(invalid(
            field,
            format!("`{value}`: names starting with `amq.` are the broker's own"),
        ));
    }
    short(field, value)
}

fn scheme(uri: &AMQPUri) -> &'static str {
    match uri.scheme {
        AMQPScheme::AMQP => "amqp",
        AMQPScheme::AMQPS => "amqps",
    }
}

/// The broker as an error names it: `amqp://user:***@host:port/vhost`,
/// the password masked.
fn masked(uri: &AMQPUri) -> String {
    let a = &uri.authority;
    let user = if a.userinfo.username.is_empty() {
        String::new()
    } else {
        format!("{}:***@", a.userinfo.username)
    };
    let vhost = uri.vhost.replace('%', "%25").replace('/', "%2f");
    format!("{}://{user}{}:{}/{vhost}", scheme(uri), a.host, a.port)
}

async fn channel(connection: &Connection) -> Result<Channel, BrokerError> {
    connection
        .create_channel()
        .await
        .map_err(|e| amqp_error("rabbitmq channel.open", &e))
}

/// Declares the topology, durable, in an order where every binding's ends
/// already exist.
async fn declare(channel: &Channel, t: &Topology) -> Result<(), BrokerError> {
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(
            t.dead_letter_exchange.clone(),
            lapin::ExchangeKind::Direct,
            durable,
            FieldTable::default(),
        )
        .await
        .map_err(|e| declare_error("exchange", &t.dead_letter_exchange, &e))?;
    declare_queue(channel, &t.dead_letter_queue, FieldTable::default()).await?;
    bind(
        channel,
        &t.dead_letter_queue,
        &t.dead_letter_exchange,
        &t.dead_letter_queue,
    )
    .await?;

    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-dead-letter-exchange".into(),
        string(t.dead_letter_exchange.as_str()),
    );
    arguments.insert(
        "x-dead-letter-routing-key".into(),
        string(t.dead_letter_queue.as_str()),
    );
    declare_queue(channel, &t.queue, arguments).await?;
    if let Some(b) = &t.binding {
        if !b.exchange.as_str().starts_with("amq.") {
            channel
                .exchange_declare(
                    b.exchange.clone(),
                    exchange_kind(b.kind),
                    durable,
                    FieldTable::default(),
                )
                .await
                .map_err(|e| declare_error("exchange", &b.exchange, &e))?;
        }
        bind(channel, &t.queue, &b.exchange, &b.routing_key).await?;
    }

    let mut arguments = FieldTable::default();
    arguments.insert("x-dead-letter-exchange".into(), string(""));
    arguments.insert("x-dead-letter-routing-key".into(), string(t.queue.as_str()));
    declare_queue(channel, &t.retry_queue, arguments).await?;
    declare_queue(channel, &t.late_queue, FieldTable::default()).await
}

async fn declare_queue(
    channel: &Channel,
    queue: &ShortString,
    arguments: FieldTable,
) -> Result<(), BrokerError> {
    channel
        .queue_declare(queue.clone(), QueueDeclareOptions::durable(), arguments)
        .await
        .map(drop)
        .map_err(|e| declare_error("queue", queue, &e))
}

async fn bind(
    channel: &Channel,
    queue: &ShortString,
    exchange: &ShortString,
    key: &ShortString,
) -> Result<(), BrokerError> {
    channel
        .queue_bind(
            queue.clone(),
            exchange.clone(),
            key.clone(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| {
            amqp_error(
                &format!("rabbitmq bind queue `{queue}` to exchange `{exchange}`"),
                &e,
            )
        })
}

/// A refused declaration, saying which argument differs when the broker
/// says so.
fn declare_error(what: &str, name: &ShortString, e: &lapin::Error) -> BrokerError {
    let operation = format!("rabbitmq declare {what} `{name}`");
    let lapin::ErrorKind::ProtocolError(amqp) = e.kind() else {
        return amqp_error(&operation, e);
    };
    if amqp.kind() != &AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED) {
        return amqp_error(&operation, e);
    }
    let said = amqp.get_message().as_str();
    let argument = said
        .split_once("inequivalent arg '")
        .and_then(|(_, rest)| rest.split_once('\''))
        .map_or("an argument", |(arg, _)| arg);
    BrokerError::permanent(
        operation,
        format!(
            "{what} `{name}` already exists with a different `{argument}` than this configuration \
             declares (the broker says: {said}); delete it, or configure a name only this \
             configuration declares"
        ),
    )
}

fn amqp_error(operation: &str, e: &lapin::Error) -> BrokerError {
    if is_permanent(e) {
        BrokerError::permanent(operation, e)
    } else {
        BrokerError::transient(operation, e)
    }
}

/// Whether waiting cannot help: a refused login, a missing vhost, a
/// declaration that contradicts what exists.
fn is_permanent(e: &lapin::Error) -> bool {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => matches!(
            amqp.kind(),
            AMQPErrorKind::Soft(
                AMQPSoftError::ACCESSREFUSED
                    | AMQPSoftError::NOTFOUND
                    | AMQPSoftError::PRECONDITIONFAILED
            ) | AMQPErrorKind::Hard(
                AMQPHardError::NOTALLOWED
                    | AMQPHardError::INVALIDPATH
                    | AMQPHardError::NOTIMPLEMENTED
            )
        ),
        lapin::ErrorKind::AuthProviderError(_)
        | lapin::ErrorKind::InvalidProtocolVersion(_)
        | lapin::ErrorKind::NoDefaultRuntime => true,
        _ => false,
    }
}

fn exchange_kind(kind: ExchangeKind) -> lapin::ExchangeKind {
    match kind {
        ExchangeKind::Direct => lapin::ExchangeKind::Direct,
        ExchangeKind::Topic => lapin::ExchangeKind::Topic,
        ExchangeKind::Fanout => lapin::ExchangeKind::Fanout,
        ExchangeKind::Headers => lapin::ExchangeKind::Headers,
    }
}

fn string(value: &str) -> AMQPValue {
    AMQPValue::LongString(value.into())
}

/// The delivery count: carried by retries in [`DELIVERY_HEADER`], plus one
/// if the broker redelivered this copy.
fn delivery_count(headers: Option<&FieldTable>, redelivered: bool) -> u64 {
    let carried = headers
        .and_then(|h| h.inner().get(DELIVERY_HEADER))
        .and_then(integer)
        .unwrap_or(1)
        .max(1);
    carried.saturating_add(u64::from(redelivered))
}

fn integer(value: &AMQPValue) -> Option<u64> {
    match value {
        AMQPValue::ShortShortUInt(n) => Some(u64::from(*n)),
        AMQPValue::ShortUInt(n) => Some(u64::from(*n)),
        AMQPValue::LongUInt(n) => Some(u64::from(*n)),
        AMQPValue::ShortShortInt(n) => u64::try_from(*n).ok(),
        AMQPValue::ShortInt(n) => u64::try_from(*n).ok(),
        AMQPValue::LongInt(n) => u64::try_from(*n).ok(),
        AMQPValue::LongLongInt(n) => u64::try_from(*n).ok(),
        AMQPValue::Timestamp(n) => Some(*n),
        other => text(other).and_then(|t| t.trim().parse().ok()),
    }
}

/// The headers a [`Message`] shows: every header with a text, number or
/// boolean value, in the broker's (name) order, without this module's own
/// bookkeeping: [`DELIVERY_HEADER`], [`ROUTING_KEY_HEADER`], and the
/// `x-first-death-*` / `x-last-death-*` headers the broker adds when it
/// dead-letters a retried copy out of `retry_queue` (those that name another
/// queue stay: they are the message's own history). Arrays (`x-death`),
/// tables, byte arrays and text that is not UTF-8 are left out of the view;
/// copies still carry them.
fn visible_headers(headers: &FieldTable, retry_queue: &str) -> Vec<(String, String)> {
    let ours = |prefix: &str| {
        headers
            .inner()
            .get(format!("{prefix}queue").as_str())
            .and_then(text)
            .is_some_and(|q| q == retry_queue)
    };
    let hidden: Vec<&str> = ["x-first-death-", "x-last-death-"]
        .into_iter()
        .filter(|p| ours(p))
        .collect();
    headers
        .inner()
        .iter()
        .filter(|(k, _)| k.as_str() != DELIVERY_HEADER && k.as_str() != ROUTING_KEY_HEADER)
        .filter(|(k, _)| !hidden.iter().any(|p| is_death_header(k.as_str(), p)))
        .filter_map(|(k, v)| Some((k.to_string(), scalar(v)?)))
        .collect()
}

fn is_death_header(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|rest| ["exchange", "queue", "reason"].contains(&rest))
}

fn text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).ok(),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}

fn scalar(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::Boolean(b) => Some(b.to_string()),
        AMQPValue::ShortShortInt(n) => Some(n.to_string()),
        AMQPValue::ShortShortUInt(n) => Some(n.to_string()),
        AMQPValue::ShortInt(n) => Some(n.to_string()),
        AMQPValue::ShortUInt(n) => Some(n.to_string()),
        AMQPValue::LongInt(n) => Some(n.to_string()),
        AMQPValue::LongUInt(n) => Some(n.to_string()),
        AMQPValue::LongLongInt(n) => Some(n.to_string()),
        AMQPValue::Float(n) => Some(n.to_string()),
        AMQPValue::Double(n) => Some(n.to_string()),
        AMQPValue::Timestamp(n) => Some(n.to_string()),
        other => text(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn an_address_in_an_error_never_shows_the_password(
            user in "[a-z]{1,8}",
            password in "[A-Z]{6,12}",
            port in 1u16..,
        ) {
            let uri = parse_url(&format!("amqp://{user}:{password}@127.0.0.1:{port}/%2f")).unwrap();
            let shown = masked(&uri);
            prop_assert_eq!(shown.clone(), format!("amqp://{user}:***@127.0.0.1:{port}/%2f"));
            prop_assert!(!shown.contains(&password));
        }
    }

    fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in entries {
            t.insert((*k).into(), v.clone());
        }
        t
    }

    #[test]
    fn the_delivery_count_comes_from_the_header_and_the_redelivered_flag() {
        let cases: &[(Option<AMQPValue>, bool, u64)] = &[
            (None, false, 1),
            (None, true, 2),
            (Some(AMQPValue::LongLongInt(3)), false, 3),
            (Some(AMQPValue::LongLongInt(3)), true, 4),
            (Some(AMQPValue::ShortShortUInt(5)), false, 5),
            (Some(string("7")), false, 7),
            (Some(string("seven")), false, 1),
            (Some(AMQPValue::LongLongInt(-4)), false, 1),
            (Some(AMQPValue::LongLongInt(0)), true, 2),
            (Some(AMQPValue::Timestamp(u64::MAX)), true, u64::MAX),
        ];
        for (header, redelivered, expect) in cases {
            let t = header.clone().map(|v| table(&[(DELIVERY_HEADER, v)]));
            assert_eq!(
                delivery_count(t.as_ref(), *redelivered),
                *expect,
                "{header:?} redelivered={redelivered}"
            );
        }
    }

    #[test]
    fn headers_show_scalars_and_hide_the_bookkeeping() {
        let t = table(&[
            ("Idempotency-Key", string("payout:847")),
            ("amount", AMQPValue::LongLongInt(1200)),
            ("urgent", AMQPValue::Boolean(true)),
            ("raw", AMQPValue::ByteArray(vec![1, 2].into())),
            ("not-utf8", AMQPValue::LongString(vec![0xff, 0xfe].into())),
            ("x-death", AMQPValue::FieldArray(vec![string("a")].into())),
            (DELIVERY_HEADER, AMQPValue::LongLongInt(2)),
            (ROUTING_KEY_HEADER, string("payouts.eu")),
            ("x-first-death-queue", string("payouts.retry")),
            ("x-first-death-reason", string("expired")),
            ("x-first-death-exchange", string("")),
            ("x-last-death-queue", string("elsewhere")),
        ]);
        assert_eq!(
            visible_headers(&t, "payouts.retry"),
            vec![
                ("Idempotency-Key".to_owned(), "payout:847".to_owned()),
                ("amount".to_owned(), "1200".to_owned()),
                ("urgent".to_owned(), "true".to_owned()),
                ("x-last-death-queue".to_owned(), "elsewhere".to_owned()),
            ]
        );
    }
}
