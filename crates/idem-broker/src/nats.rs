//! NATS JetStream behind the broker seam: a durable pull consumer with
//! explicit acks, whose dead-letter and late copies are published through
//! JetStream and stored by the server before the original is let go.
//!
//! # What it declares at start
//! [`NatsSubscription::connect`] makes sure, idempotently, that:
//! - the stream [`NatsConfig::stream`] exists, capturing exactly
//!   [`NatsConfig::subjects`]. A missing stream is created (file storage,
//!   limits retention, server defaults otherwise); an existing stream with
//!   other subjects is refused, naming `subjects`, rather than changed.
//!   The consumer reads every subject the stream captures.
//! - a stream captures the dead-letter subject and one captures the late
//!   subject, so that a copy is *stored*, not merely published. A subject
//!   no stream captures gets one: `<stream>_DLQ` and `<stream>_LATE` (file
//!   storage, limits retention; retention limits are the operator's to
//!   set). A subject some other stream already captures is left to that
//!   stream. A subject the consumed stream itself captures is refused,
//!   naming the field: its copies would be delivered again.
//! - the durable pull consumer [`NatsConfig::durable`] exists with explicit
//!   acks, `ack_wait`, `max_deliver` and `max_ack_pending` as configured; it
//!   is created, or updated where the server allows, on every start (an
//!   existing consumer keeps its deliver policy, which the server cannot
//!   change).
//!
//! # When something declared is deleted
//! A durable consumer deleted while the subscription runs is created again
//! by [`Subscription::next`], with this configuration, starting just after
//! the ack floor the old one had when last asked (at every new pull
//! stream, and every 5 s while pulling): nothing unsettled is
//! skipped, and what was settled since is delivered again for the bridge's
//! records to settle as replays. Another bridge sharing the durable may
//! create it first; then that one is used. Five attempts over about 4 s;
//! a server that refuses them all makes `next` fail with a permanent error
//! naming `durable`. A deleted stream took its messages with it and is not
//! made again: `next` fails with a permanent error naming `stream`.
//!
//! # Settlements
//! | settlement | what the server sees |
//! | --- | --- |
//! | `ack` | `+ACK`, and the server's confirmation is awaited (a double ack) |
//! | `retry(after)` | `-NAK` with a delay of `after`, confirmed |
//! | `dead_letter` / `late` | a copy published to the dead-letter / late subject and its publish ack awaited; then `+TERM`, confirmed |
//!
//! The original of a copied message is terminated, not acknowledged: both
//! stop its delivery, but a term also tells the server (and anyone
//! watching `$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED`) that the message
//! was not processed. A settlement whose confirmation does not arrive
//! within `request_timeout_ms` returns an error and the message is
//! delivered again, unless the server did act on it and only its answer was
//! lost; either outcome is one the bridge chose, and its records make a
//! second delivery harmless. While the client knows it is disconnected, a
//! settlement fails at once without sending anything: the client would
//! otherwise keep the ack and send it after reconnecting.
//!
//! A copy carries the payload and the original headers except the
//! server's own `Nats-*` ones (an `Nats-Expected-*` or `Nats-Rollup`
//! header would make the copy's publish fail or purge the sink), plus
//! `Idem-Reason`, `Idem-Reason-Detail`, `Idem-Original-Subject` and, when
//! the original had one, `Idem-Original-Message-Id`. Its own `Nats-Msg-Id`
//! is `idem-dead-letter:<stream>:<sequence>` (or `idem-late:…`), so a copy
//! published twice within the sink's duplicate window (a term that failed,
//! then the same message dead-lettered again) is stored once.
//!
//! # Timing: `ack_wait_ms` and `max_deliver`
//! JetStream delivers a message again when it is not settled within
//! `ack_wait_ms` of its delivery. The clock starts when the server sends
//! the message, which may be before the bridge takes it from the prefetch
//! buffer, so `ack_wait_ms` must exceed the bridge's delivery timeout plus
//! the time a message can wait behind `prefetch` others. Too short is not
//! unsafe (the bridge's record turns the duplicate into a retry) but it
//! wastes deliveries.
//!
//! With `max_deliver` set, JetStream stops delivering a message after that
//! many deliveries and leaves it in the stream, unacknowledged and silent.
//! The bridge should therefore dead-letter a message whose
//! [`Message::delivery`](crate::Message::delivery) has reached
//! [`NatsSubscription::max_deliver`] instead of retrying it. Unset (the
//! default) means no limit.
//!
//! # Headers
//! The client keeps headers in a hash map, so the order in which the
//! publisher wrote *different* names is lost. [`crate::Message::headers`]
//! lists them sorted by name (byte order), each name's values in the order
//! published; names keep their case. The client trims white space at
//! either end of a value, so `" a "` arrives as `"a"`.
//!
//! # Reconnecting
//! The client reconnects on its own, without limit. While the server is
//! away, [`Subscription::next`] returns a transient error: first after
//! two missed idle heartbeats (about 10 seconds), then each time it tries
//! to open a new pull stream (within `request_timeout_ms`, which also
//! finds out whether the consumer is still there); once the server is back
//! it delivers again. Messages delivered but not settled before the outage
//! are delivered again after `ack_wait_ms`. A server that cannot be reached
//! at start is named in the error (`nats://user:***@host:port`, password or
//! token masked), about field `url`.
//!
//! # Example
//! ```no_run
//! use idem_broker::Subscription;
//! use idem_broker::nats::{NatsConfig, NatsSubscription};
//!
//! # async fn run() -> Result<(), idem_broker::BrokerError> {
//! let config: NatsConfig = toml::from_str(
//!     r#"
//!     url = "nats://127.0.0.1:4222"
//!     stream = "PAYOUTS"
//!     subjects = ["payouts.>"]
//!     durable = "idem"
//!     ack_wait_ms = 60000
//!     "#,
//! )
//! .map_err(|e| idem_broker::BrokerError::permanent("nats config", e))?;
//! let subscription = NatsSubscription::connect(config).await?;
//! loop {
//!     let delivery = subscription.next().await?;
//!     println!("{} (delivery {})", delivery.message.subject, delivery.message.delivery);
//!     delivery.settle.ack().await?;
//! }
//! # }
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::connection::State;
use async_nats::header::{HeaderMap, HeaderName, HeaderValue, NATS_MESSAGE_ID};
use async_nats::jetstream::consumer::pull::{self, MessagesErrorKind};
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::context::{
    CreateStreamErrorKind, GetStreamByNameErrorKind, PublishErrorKind,
};
use async_nats::jetstream::message::AckKind;
use async_nats::jetstream::stream::{self, StorageType};
use async_nats::jetstream::{self, Context, ErrorCode};
use async_nats::{ConnectErrorKind, ServerAddr};
use futures_util::StreamExt;
use idem_core::FieldError;
use serde::Deserialize;
use tokio::sync::Mutex;

use crate::{
    BrokerError, BrokerFuture, Delivery, Message, REASON_DETAIL_HEADER, REASON_HEADER, Reason,
    Settle, Subscription, TlsRefusal,
};

/// Where to read from and where copies go; read from the bridge's
/// configuration file. Unknown fields are refused.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsConfig {
    /// The server, or several separated by commas, e.g.
    /// `nats://127.0.0.1:4222`. Default `nats://127.0.0.1:4222`.
    #[serde(default = "default_url")]
    pub url: String,
    /// The JetStream stream to consume, e.g. `PAYOUTS`. Required.
    pub stream: String,
    /// The subjects the stream captures, e.g. `["payouts.>"]`; used to create
    /// the stream, and checked against an existing one. Required.
    pub subjects: Vec<String>,
    /// The durable pull consumer's name; bridges sharing it share the
    /// messages. Default `idem`.
    #[serde(default = "default_durable")]
    pub durable: String,
    /// How long the server waits for a settlement before delivering the
    /// message again. Must exceed the bridge's delivery timeout (see the
    /// module docs). Default 60 000.
    #[serde(default = "default_ack_wait_ms")]
    pub ack_wait_ms: u64,
    /// After this many deliveries the server stops delivering a message; the
    /// bridge should dead-letter it at that count rather than retry it.
    /// At least 2. Default: no limit.
    #[serde(default)]
    pub max_deliver: Option<u64>,
    /// Where dead-lettered copies are published; a literal subject outside
    /// `subjects`. Default `idem.dead-letter.<stream>`.
    #[serde(default)]
    pub dead_letter_subject: Option<String>,
    /// Where late replays are copied; a literal subject outside `subjects`.
    /// Default `idem.late.<stream>`.
    #[serde(default)]
    pub late_subject: Option<String>,
    /// How many messages may be delivered and not yet settled, across every
    /// bridge sharing the durable consumer (its `max_ack_pending`), and how
    /// many one bridge asks for at a time. 1 to 65 536. Default 64.
    #[serde(default = "default_prefetch")]
    pub prefetch: u32,
    /// How long to wait for the server to answer a request: connect, a
    /// confirmation of a settlement, a publish ack. Default 5 000.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// PEM CA certificates the server's certificate must chain to. With it
    /// (or a `tls://` url) the connection requires TLS; without it a TLS
    /// server is trusted through the system's roots. Relative to the
    /// config file.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate for a server that verifies its clients; with
    /// `key_file`, or neither.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// A NATS `.creds` file (a user JWT and its NKey seed). A user and
    /// password go in the url (`nats://user:password@host:4222`).
    #[serde(default)]
    pub creds_file: Option<PathBuf>,
    /// A file whose first line is the server's token.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
}

/// A subscription to one durable JetStream pull consumer.
pub struct NatsSubscription {
    /// The consumed stream, to re-create the durable consumer on.
    stream: stream::Stream,
    config: NatsConfig,
    pulling: Mutex<Pulling>,
    sinks: Arc<Sinks>,
    prefetch: usize,
    max_deliver: Option<u64>,
    describe: String,
}

/// The durable consumer as last seen, and the pull stream open on it.
struct Pulling {
    consumer: PullConsumer,
    messages: Option<pull::Stream>,
    /// The consumer's ack floor (every stream sequence up to it settled)
    /// when last asked; a re-created consumer starts just after it.
    floor: Arc<AtomicU64>,
    /// When the floor was last asked for.
    floor_at: Instant,
}

impl NatsConfig {
    /// The servers as logs and `idem consume --check` show them, any
    /// password or token masked (`nats://user:***@host:4222`).
    pub fn masked_url(&self) -> String {
        server_addrs(&self.url).map_or_else(|e| format!("(invalid: {e})"), |a| masked(&a))
    }

    /// A configuration for `stream` capturing `subjects`, every other field
    /// at its default.
    pub fn new(
        stream: impl Into<String>,
        subjects: impl IntoIterator<Item = impl Into<String>>,
    ) -> NatsConfig {
        NatsConfig {
            url: default_url(),
            stream: stream.into(),
            subjects: subjects.into_iter().map(Into::into).collect(),
            durable: default_durable(),
            ack_wait_ms: default_ack_wait_ms(),
            max_deliver: None,
            dead_letter_subject: None,
            late_subject: None,
            prefetch: default_prefetch(),
            request_timeout_ms: default_request_timeout_ms(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            creds_file: None,
            token_file: None,
        }
    }

    /// The files it names, relative ones read against `dir` (the config
    /// file's directory).
    pub fn relative_to(mut self, dir: &Path) -> NatsConfig {
        crate::place_files(
            dir,
            [
                &mut self.ca_file,
                &mut self.cert_file,
                &mut self.key_file,
                &mut self.creds_file,
                &mut self.token_file,
            ],
        );
        self
    }

    /// The TLS files this section names.
    pub fn tls_files(&self) -> crate::TlsFiles<'_> {
        crate::TlsFiles::new(&self.ca_file, &self.cert_file, &self.key_file)
    }

    /// Whether the connection must speak TLS: a `tls://` url or a CA file.
    fn requires_tls(&self) -> bool {
        self.ca_file.is_some() || self.url.trim_start().starts_with("tls://")
    }

    /// Checks every field, and names the first that cannot work.
    pub fn validate(&self) -> Result<(), FieldError> {
        let bad = |field: &str, reason: String| Err(FieldError::new(field, reason));
        if let Err(reason) = server_addrs(&self.url) {
            return bad("url", reason);
        }
        check_name("stream", &self.stream)?;
        if self.subjects.is_empty() {
            return bad("subjects", "must list at least one subject".into());
        }
        for subject in &self.subjects {
            check_subject("subjects", subject, Wildcards::Allowed)?;
        }
        check_name("durable", &self.durable)?;
        if self.ack_wait_ms == 0 {
            return bad("ack_wait_ms", "must be at least 1".into());
        }
        if let Some(n @ 0..=1) = self.max_deliver {
            return bad(
                "max_deliver",
                format!(
                    "is {n}: a retried message would never be delivered again; use 2 or more, or leave it unset"
                ),
            );
        }
        check_subject(
            "dead_letter_subject",
            &self.dead_letter_subject(),
            Wildcards::Refused,
        )?;
        check_subject("late_subject", &self.late_subject(), Wildcards::Refused)?;
        if !(1..=65_536).contains(&self.prefetch) {
            return bad(
                "prefetch",
                format!("is {}: must be 1 to 65536", self.prefetch),
            );
        }
        if self.request_timeout_ms == 0 {
            return bad("request_timeout_ms", "must be at least 1".into());
        }
        self.tls_files().identity()?;
        if self.creds_file.is_some() && self.token_file.is_some() {
            return bad(
                "token_file",
                "a server takes one credential: keep creds_file or token_file".into(),
            );
        }
        let credentials = [
            ("creds_file", self.creds_file.as_deref()),
            ("token_file", self.token_file.as_deref()),
        ];
        for (field, file) in self.tls_files().fields().into_iter().chain(credentials) {
            if let Some(path) = file
                && let Err(e) = std::fs::metadata(path)
            {
                return bad(field, format!("cannot read {}: {e}", path.display()));
            }
        }
        Ok(())
    }

    /// The dead-letter subject, the default filled in.
    pub fn dead_letter_subject(&self) -> String {
        self.dead_letter_subject
            .clone()
            .unwrap_or_else(|| format!("idem.dead-letter.{}", self.stream))
    }

    /// The late subject, the default filled in.
    pub fn late_subject(&self) -> String {
        self.late_subject
            .clone()
            .unwrap_or_else(|| format!("idem.late.{}", self.stream))
    }
}

impl NatsSubscription {
    /// Validates `config`, connects, and declares the streams and the
    /// consumer (see the module docs). A refused configuration is a
    /// permanent error naming the field; a server that does not answer is
    /// a transient one.
    pub async fn connect(config: NatsConfig) -> Result<NatsSubscription, BrokerError> {
        config
            .validate()
            .map_err(|e| BrokerError::permanent("nats config", e))?;
        let timeout = Duration::from_millis(config.request_timeout_ms);
        let addrs =
            server_addrs(&config.url).map_err(|e| BrokerError::permanent("nats config", e))?;
        let client = connect_options(&config)
            .await?
            .name("idem consume")
            .connection_timeout(timeout)
            .request_timeout(Some(timeout))
            .connect(addrs.clone())
            .await
            .map_err(|e| {
                let transient = matches!(
                    e.kind(),
                    ConnectErrorKind::Io | ConnectErrorKind::TimedOut | ConnectErrorKind::Dns
                );
                let operation = format!("nats connect to {}", masked(&addrs));
                // A refused handshake is the trust's (the CA file's, or
                // the system's roots when none is named), the url's host's
                // when the certificate names another, or, when the server
                // refused this client, the client certificate's.
                let refusal = TlsRefusal::of(&e.to_string());
                match refusal {
                    Some(TlsRefusal::ClientCertificate) => {
                        return broker_error(&operation, e, false).at_field("cert_file");
                    }
                    Some(TlsRefusal::ServerName) => {
                        return broker_error(&operation, e, false).at_field("url");
                    }
                    _ => {}
                }
                let handshake = e.kind() == ConnectErrorKind::Tls
                    || refusal == Some(TlsRefusal::ServerNotTrusted);
                let field = match (e.kind(), &config.ca_file) {
                    (_, Some(ca)) if handshake => {
                        let operation = format!("{operation} (ca_file {})", ca.display());
                        return broker_error(&operation, e, transient).at_field("ca_file");
                    }
                    (
                        ConnectErrorKind::Authentication | ConnectErrorKind::AuthorizationViolation,
                        _,
                    ) => match credential_field(&config) {
                        (field, Some(path)) => {
                            let operation = format!("{operation} ({field} {})", path.display());
                            return broker_error(&operation, e, transient).at_field(field);
                        }
                        (field, None) => field,
                    },
                    _ => "url",
                };
                broker_error(&operation, e, transient).at_field(field)
            })?;
        let context = jetstream::ContextBuilder::new()
            .timeout(timeout)
            .build(client);
        let consumed = declare_stream(&context, &config).await?;
        let sinks = Sinks {
            context: context.clone(),
            stream: config.stream.clone(),
            dead_letter_subject: config.dead_letter_subject(),
            late_subject: config.late_subject(),
        };
        declare_sink(
            &context,
            &config,
            Sink::DeadLetter,
            &sinks.dead_letter_subject,
        )
        .await?;
        declare_sink(&context, &config, Sink::Late, &sinks.late_subject).await?;
        let consumer = declare_consumer(&consumed, &config).await?;
        let floor = consumer.cached_info().ack_floor.stream_sequence;
        Ok(NatsSubscription {
            stream: consumed,
            pulling: Mutex::new(Pulling {
                consumer,
                messages: None,
                floor: Arc::new(AtomicU64::new(floor)),
                floor_at: Instant::now(),
            }),
            sinks: Arc::new(sinks),
            prefetch: config.prefetch as usize,
            max_deliver: config.max_deliver,
            describe: describe(&addrs, &config),
            config,
        })
    }

    /// The delivery count at which the server stops delivering a message,
    /// if one is set: a message whose delivery count reaches it should be
    /// dead-lettered, not retried.
    pub fn max_deliver(&self) -> Option<u64> {
        self.max_deliver
    }

    /// A fresh pull stream, after checking the consumer is still there
    /// and re-creating it if it is not.
    async fn open(&self, pulling: &mut Pulling) -> Result<pull::Stream, BrokerError> {
        use async_nats::jetstream::context::ConsumerInfoErrorKind as K;
        match pulling.consumer.get_info().await {
            Ok(info) => pulling.note_floor(&info),
            Err(e) if e.kind() == K::NotFound => {
                let floor = pulling.floor.load(Ordering::Relaxed);
                pulling.consumer = self.recreate(floor).await?;
            }
            Err(e) if e.kind() == K::StreamNotFound => return Err(self.stream_gone(e)),
            Err(e) => return Err(BrokerError::transient("nats next", e)),
        }
        pulling
            .consumer
            .stream()
            .max_messages_per_batch(self.prefetch)
            .heartbeat(HEARTBEAT)
            .expires(PULL_EXPIRES)
            .messages()
            .await
            .map_err(|e| BrokerError::transient("nats next", e))
    }

    /// Re-creates the durable consumer someone deleted, with this
    /// configuration, starting just after the ack floor last seen (so what
    /// was settled is not delivered again, and nothing unsettled is
    /// skipped). Another bridge sharing the durable may re-create it first;
    /// then that one is used. Bounded attempts with backoff; a refusal that
    /// outlasts them is permanent.
    async fn recreate(&self, floor: u64) -> Result<PullConsumer, BrokerError> {
        let durable = &self.config.durable;
        tracing::warn!(consumer = %self.describe, floor,
            "the durable consumer was deleted while idem consume ran; re-creating it");
        let mut wanted = consumer_config(&self.config);
        if floor > 0 {
            wanted.deliver_policy = DeliverPolicy::ByStartSequence {
                start_sequence: floor.saturating_add(1),
            };
        }
        let mut backoff = RECREATE_BACKOFF;
        let mut last = None;
        for attempt in 1..=RECREATE_ATTEMPTS {
            match self
                .stream
                .get_or_create_consumer(durable, wanted.clone())
                .await
            {
                Ok(consumer) => {
                    tracing::warn!(consumer = %self.describe, attempt,
                        "the durable consumer is back; consuming again");
                    return Ok(consumer);
                }
                Err(e) => {
                    use async_nats::jetstream::stream::ConsumerErrorKind as C;
                    if let C::JetStream(api) = e.kind()
                        && api.error_code() == ErrorCode::STREAM_NOT_FOUND
                    {
                        return Err(self.stream_gone(e));
                    }
                    let refused = matches!(e.kind(), C::JetStream(api) if api.code() < 500);
                    last = Some((refused, e.to_string()));
                }
            }
            if attempt < RECREATE_ATTEMPTS {
                tokio::time::sleep(backoff).await;
                backoff = backoff.saturating_mul(2);
            }
        }
        let (refused, why) = last.unwrap_or((true, "no attempt made".into()));
        let reason = format!(
            "the durable consumer `{durable}` on stream `{}` was deleted and could not be \
             re-created in {RECREATE_ATTEMPTS} attempts: {why}",
            self.config.stream
        );
        Err(if refused {
            BrokerError::permanent("nats next", reason).at_field("durable")
        } else {
            BrokerError::transient("nats next", reason)
        })
    }

    /// The consumed stream was deleted: its messages went with it, so
    /// nothing is re-created behind the operator's back.
    fn stream_gone(&self, e: impl fmt::Display) -> BrokerError {
        BrokerError::permanent(
            "nats next",
            format!(
                "the stream `{}` is gone (deleted while idem consume ran?), and every message \
                 it held with it; restart idem consume to declare it again: {e}",
                self.config.stream
            ),
        )
        .at_field("stream")
    }

    /// Asks for the consumer's ack floor again, in the background, when it
    /// was last asked for long ago, so a re-created consumer does not start
    /// far behind; pulling does not wait for the answer.
    fn refresh_floor(&self, pulling: &mut Pulling) {
        if pulling.floor_at.elapsed() < FLOOR_REFRESH
            || connected(&self.sinks.context, "nats next").is_err()
        {
            return;
        }
        pulling.floor_at = Instant::now();
        let (consumer, floor) = (pulling.consumer.clone(), Arc::clone(&pulling.floor));
        tokio::spawn(async move {
            if let Ok(info) = consumer.get_info().await {
                floor.fetch_max(info.ack_floor.stream_sequence, Ordering::Relaxed);
            }
        });
    }
}

impl Pulling {
    fn note_floor(&mut self, info: &async_nats::jetstream::consumer::Info) {
        self.floor
            .fetch_max(info.ack_floor.stream_sequence, Ordering::Relaxed);
        self.floor_at = Instant::now();
    }
}

impl Subscription for NatsSubscription {
    fn next(&self) -> BrokerFuture<'_, Delivery> {
        Box::pin(async move {
            let mut pulling = self.pulling.lock().await;
            // A deleted consumer is re-created at once, once per call.
            for pass in 0..2 {
                self.refresh_floor(&mut pulling);
                let stream = match pulling.messages.take() {
                    Some(stream) => stream,
                    None => self.open(&mut pulling).await?,
                };
                let stream = pulling.messages.insert(stream);
                match stream.next().await {
                    Some(Ok(message)) => return delivery(message, &self.sinks),
                    Some(Err(e)) => {
                        // These end the client's stream, or say the
                        // consumer may be gone: the next pass opens a new
                        // one (and finds out whether the consumer is gone).
                        let kind = e.kind();
                        if matches!(
                            kind,
                            MessagesErrorKind::ConsumerDeleted
                                | MessagesErrorKind::PushBasedConsumer
                                | MessagesErrorKind::RequestLimitExceeded
                                | MessagesErrorKind::MissingHeartbeat
                        ) {
                            pulling.messages = None;
                        }
                        if kind != MessagesErrorKind::ConsumerDeleted || pass > 0 {
                            return Err(BrokerError::transient("nats next", e));
                        }
                    }
                    None => {
                        pulling.messages = None;
                        return Err(BrokerError::transient("nats next", "the pull stream ended"));
                    }
                }
            }
            Err(BrokerError::transient(
                "nats next",
                "the consumer was deleted again at once",
            ))
        })
    }

    fn connected(&self) -> bool {
        matches!(
            self.sinks.context.client().connection_state(),
            State::Connected
        )
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }
}

/// How many times a deleted durable consumer is re-created before
/// `next` gives up, and the pause after the first failed attempt
/// (doubled after each): about 4 s in all.
const RECREATE_ATTEMPTS: u32 = 5;
const RECREATE_BACKOFF: Duration = Duration::from_millis(250);

/// How stale the ack floor a re-created consumer starts from may get
/// while messages flow.
const FLOOR_REFRESH: Duration = Duration::from_secs(5);

/// How often the server proves a waiting pull request is alive; two missed
/// in a row make `next` report the outage.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// How long one pull request waits on the server before the client renews it.
const PULL_EXPIRES: Duration = Duration::from_secs(30);

/// The headers a copy carries to say where it came from and why.
const ORIGINAL_SUBJECT: &str = "Idem-Original-Subject";
const ORIGINAL_MESSAGE_ID: &str = "Idem-Original-Message-Id";

/// Where copies go, shared by every delivery of one subscription.
struct Sinks {
    context: Context,
    stream: String,
    dead_letter_subject: String,
    late_subject: String,
}

/// Which copy a settlement makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sink {
    DeadLetter,
    Late,
}

/// One delivery's settlement: the message (whose reply subject is its
/// ack handle) and where copies go.
struct NatsSettle {
    message: jetstream::Message,
    stream_sequence: u64,
    sinks: Arc<Sinks>,
}

impl Settle for NatsSettle {
    fn ack(self: Box<Self>) -> BrokerFuture<'static, ()> {
        Box::pin(async move { confirm(&self.message, AckKind::Ack, "nats ack").await })
    }

    fn retry(self: Box<Self>, after: Duration) -> BrokerFuture<'static, ()> {
        Box::pin(
            async move { confirm(&self.message, AckKind::Nak(Some(after)), "nats retry").await },
        )
    }

    fn dead_letter(self: Box<Self>, reason: Reason) -> BrokerFuture<'static, ()> {
        Box::pin(async move { self.copy_then_term(Sink::DeadLetter, reason).await })
    }

    fn late(self: Box<Self>, reason: Reason) -> BrokerFuture<'static, ()> {
        Box::pin(async move { self.copy_then_term(Sink::Late, reason).await })
    }
}

impl NatsSettle {
    /// Publishes the copy, waits until a stream has stored it, and only
    /// then terminates the original.
    async fn copy_then_term(&self, sink: Sink, reason: Reason) -> Result<(), BrokerError> {
        let operation = sink.operation();
        let subject = match sink {
            Sink::DeadLetter => &self.sinks.dead_letter_subject,
            Sink::Late => &self.sinks.late_subject,
        };
        let headers = copy_headers(
            &self.message,
            &reason,
            &self.sinks.stream,
            self.stream_sequence,
            sink,
        )
        .map_err(|e| BrokerError::permanent(operation, e))?;
        let publish_error = |e: jetstream::context::PublishError| {
            let transient = !matches!(
                e.kind(),
                PublishErrorKind::StreamNotFound | PublishErrorKind::MaxPayloadExceeded
            );
            broker_error(operation, e, transient)
        };
        connected(&self.sinks.context, operation)?;
        self.sinks
            .context
            .publish_with_headers(subject.clone(), headers, self.message.payload.clone())
            .await
            .map_err(publish_error)?
            .await
            .map_err(publish_error)?;
        confirm(&self.message, AckKind::Term, operation).await
    }
}

impl Sink {
    fn operation(self) -> &'static str {
        match self {
            Sink::DeadLetter => "nats dead-letter",
            Sink::Late => "nats late",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Sink::DeadLetter => "dead-letter",
            Sink::Late => "late",
        }
    }

    fn field(self) -> &'static str {
        match self {
            Sink::DeadLetter => "dead_letter_subject",
            Sink::Late => "late_subject",
        }
    }

    fn stream_suffix(self) -> &'static str {
        match self {
            Sink::DeadLetter => "DLQ",
            Sink::Late => "LATE",
        }
    }
}

/// Sends `kind` for `message` and waits for the server to confirm it.
async fn confirm(
    message: &jetstream::Message,
    kind: AckKind,
    operation: &'static str,
) -> Result<(), BrokerError> {
    connected(&message.context, operation)?;
    message
        .double_ack_with(kind)
        .await
        .map_err(|e| BrokerError::transient(operation, e))
}

/// Refuses to send while the client is disconnected: the client would keep
/// the ack or the copy and send it after reconnecting, long after this
/// settlement reported failure.
fn connected(context: &Context, operation: &'static str) -> Result<(), BrokerError> {
    match context.client().connection_state() {
        State::Connected => Ok(()),
        state => Err(BrokerError::transient(
            operation,
            format!("not connected to the server ({state})"),
        )),
    }
}

/// The seam's view of one JetStream message.
fn delivery(message: jetstream::Message, sinks: &Arc<Sinks>) -> Result<Delivery, BrokerError> {
    let (delivered, stream_sequence) = {
        let info = message.info().map_err(|e| {
            BrokerError::transient(
                "nats next",
                format!("a message without JetStream metadata: {e}"),
            )
        })?;
        (info.delivered, info.stream_sequence)
    };
    let headers = message.headers.as_ref();
    let sorted = sorted_headers(headers);
    let content_type = sorted
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
        .map(|(_, value)| value.clone());
    let seam = Message {
        payload: message.payload.clone(),
        headers: sorted,
        message_id: headers
            .and_then(|h| h.get(NATS_MESSAGE_ID))
            .map(|v| v.as_str().to_owned()),
        content_type,
        subject: message.subject.to_string(),
        delivery: u64::try_from(delivered).unwrap_or(1).max(1),
    };
    Ok(Delivery {
        message: seam,
        settle: Box::new(NatsSettle {
            message,
            stream_sequence,
            sinks: Arc::clone(sinks),
        }),
    })
}

/// Every header as (name, value), sorted by name; a name's values keep
/// their order (the sort is stable).
fn sorted_headers(headers: Option<&HeaderMap>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = headers
        .into_iter()
        .flat_map(|map| map.iter())
        .flat_map(|(name, values)| {
            values
                .iter()
                .map(move |value| (name.to_string(), value.as_str().to_owned()))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The copy's headers: the original's, less the server's `Nats-*` ones and
/// any stale `Idem-*` reason, plus why and whence.
fn copy_headers(
    original: &jetstream::Message,
    reason: &Reason,
    stream: &str,
    sequence: u64,
    sink: Sink,
) -> Result<HeaderMap, String> {
    let ours = [
        REASON_HEADER,
        REASON_DETAIL_HEADER,
        ORIGINAL_SUBJECT,
        ORIGINAL_MESSAGE_ID,
    ];
    let mut headers = HeaderMap::new();
    for (name, values) in original.headers.iter().flat_map(|map| map.iter()) {
        let text: &str = name.as_ref();
        let reserved = text.len() >= 5 && text[..5].eq_ignore_ascii_case("nats-");
        if reserved || ours.iter().any(|o| o.eq_ignore_ascii_case(text)) {
            continue;
        }
        for value in values {
            headers.append(name.clone(), value.clone());
        }
    }
    let mut set = |name: &'static str, value: &str| -> Result<(), String> {
        let value = HeaderValue::from_str(&one_line(value)).map_err(|e| e.to_string())?;
        headers.insert(HeaderName::from_static(name), value);
        Ok(())
    };
    set(REASON_HEADER, &reason.code)?;
    set(REASON_DETAIL_HEADER, &reason.detail)?;
    set(ORIGINAL_SUBJECT, original.subject.as_str())?;
    if let Some(id) = original
        .headers
        .as_ref()
        .and_then(|h| h.get(NATS_MESSAGE_ID))
    {
        set(ORIGINAL_MESSAGE_ID, id.as_str())?;
    }
    set(
        "Nats-Msg-Id",
        &format!("idem-{}:{stream}:{sequence}", sink.label()),
    )?;
    Ok(headers)
}

/// A header value cannot hold a line break.
fn one_line(value: &str) -> String {
    value.replace(['\r', '\n'], " ")
}

/// Creates the consumed stream if missing; refuses one with other subjects.
async fn declare_stream(
    context: &Context,
    config: &NatsConfig,
) -> Result<stream::Stream, BrokerError> {
    let wanted = stream::Config {
        name: config.stream.clone(),
        subjects: config.subjects.clone(),
        storage: StorageType::File,
        description: Some("messages for idem consume".into()),
        ..Default::default()
    };
    let stream = context
        .get_or_create_stream(wanted)
        .await
        .map_err(|e| create_stream_error("nats declare stream", "stream", e))?;
    let have: BTreeSet<&String> = stream.cached_info().config.subjects.iter().collect();
    let want: BTreeSet<&String> = config.subjects.iter().collect();
    if have != want {
        return Err(BrokerError::permanent(
            "nats declare stream",
            format!(
                "subjects: stream `{}` exists and captures {:?}, not {:?}; write its subjects, or change the stream",
                config.stream, have, want
            ),
        ));
    }
    Ok(stream)
}

/// Makes sure a stream other than the consumed one stores `subject`.
async fn declare_sink(
    context: &Context,
    config: &NatsConfig,
    sink: Sink,
    subject: &str,
) -> Result<(), BrokerError> {
    const OPERATION: &str = "nats declare sink";
    match context.stream_by_subject(subject).await {
        Ok(found) if found == config.stream => Err(BrokerError::permanent(
            OPERATION,
            format!(
                "{}: `{subject}` is captured by the consumed stream `{found}`, so its copies would be delivered again; choose a subject outside `subjects`",
                sink.field()
            ),
        )),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => {
            let name = format!("{}_{}", config.stream, sink.stream_suffix());
            let wanted = stream::Config {
                name,
                subjects: vec![subject.to_owned()],
                storage: StorageType::File,
                description: Some(format!(
                    "idem consume: {} copies from {}",
                    sink.label(),
                    config.stream
                )),
                ..Default::default()
            };
            context
                .create_stream(wanted)
                .await
                .map(|_| ())
                .map_err(|e| create_stream_error(OPERATION, sink.field(), e))
        }
        Err(e) => {
            let transient = matches!(e.kind(), GetStreamByNameErrorKind::Request);
            Err(broker_error(OPERATION, e, transient))
        }
    }
}

/// The durable pull consumer this configuration declares.
fn consumer_config(config: &NatsConfig) -> pull::Config {
    pull::Config {
        durable_name: Some(config.durable.clone()),
        description: Some("idem consume".into()),
        deliver_policy: DeliverPolicy::All,
        ack_policy: AckPolicy::Explicit,
        ack_wait: Duration::from_millis(config.ack_wait_ms),
        max_deliver: config
            .max_deliver
            .and_then(|n| i64::try_from(n).ok())
            .unwrap_or(-1),
        max_ack_pending: i64::from(config.prefetch),
        ..Default::default()
    }
}

/// Creates the durable pull consumer, or brings it to this configuration.
/// An existing consumer keeps its deliver policy (the server cannot change
/// it): one re-created after a deletion starts after its predecessor's
/// ack floor.
async fn declare_consumer(
    stream: &stream::Stream,
    config: &NatsConfig,
) -> Result<PullConsumer, BrokerError> {
    let mut wanted = consumer_config(config);
    if let Ok(existing) = stream.consumer_info(&config.durable).await {
        wanted.deliver_policy = existing.config.deliver_policy;
    }
    stream.create_consumer(wanted).await.map_err(|e| {
        use async_nats::jetstream::stream::ConsumerErrorKind as K;
        match e.kind() {
            K::JetStream(api) if api.code() < 500 => BrokerError::permanent(
                "nats declare consumer",
                format!(
                    "durable: the server refused consumer `{}`: {e}",
                    config.durable
                ),
            )
            .at_field("durable"),
            K::InvalidConsumerType | K::InvalidName => {
                BrokerError::permanent("nats declare consumer", format!("durable: {e}"))
                    .at_field("durable")
            }
            _ => BrokerError::transient("nats declare consumer", e),
        }
    })
}

fn create_stream_error(
    operation: &str,
    field: &str,
    e: jetstream::context::CreateStreamError,
) -> BrokerError {
    match e.kind() {
        CreateStreamErrorKind::JetStream(api) if api.code() >= 500 => {
            BrokerError::transient(operation, e)
        }
        CreateStreamErrorKind::TimedOut
        | CreateStreamErrorKind::JetStreamUnavailable
        | CreateStreamErrorKind::Response
        | CreateStreamErrorKind::ResponseParse => BrokerError::transient(operation, e),
        _ => BrokerError::permanent(operation, format!("{field}: the server refused: {e}")),
    }
}

fn broker_error(operation: &str, e: impl fmt::Display, transient: bool) -> BrokerError {
    if transient {
        BrokerError::transient(operation, e)
    } else {
        BrokerError::permanent(operation, e)
    }
}

/// The client's options for `config`'s TLS and credentials. A file that
/// cannot be used is a permanent error naming its field.
async fn connect_options(config: &NatsConfig) -> Result<async_nats::ConnectOptions, BrokerError> {
    let refused = |field: &'static str, path: &Path, e: &dyn fmt::Display| {
        BrokerError::permanent("nats config", format!("{}: {e}", path.display())).at_field(field)
    };
    let mut options = match &config.creds_file {
        Some(path) => async_nats::ConnectOptions::with_credentials_file(path.clone())
            .await
            .map_err(|e| refused("creds_file", path, &e))?,
        None => async_nats::ConnectOptions::new(),
    };
    if let Some(path) = &config.token_file {
        let token = crate::first_line(path, "token")
            .map_err(|e| BrokerError::permanent("nats config", e).at_field("token_file"))?;
        options = options.token(token.trim_start().to_owned());
    }
    // Credentials in the url, given to the client explicitly: it does not
    // send a url's user and password on every path (a TLS connection).
    let addrs = server_addrs(&config.url).map_err(|e| BrokerError::permanent("nats config", e))?;
    if let Some(addr) = addrs.first() {
        match (addr.username(), addr.password()) {
            (Some(user), Some(password)) => {
                options = options.user_and_password(user.to_owned(), password.to_owned());
            }
            (Some(token), None) => options = options.token(token.to_owned()),
            _ => {}
        }
    }
    if config.requires_tls() {
        options = options.require_tls(true);
    }
    if let Some(path) = &config.ca_file {
        options = options.add_root_certificates(path.clone());
    }
    if let (Some(cert), Some(key)) = (&config.cert_file, &config.key_file) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(options)
}

/// The field holding the credential a server refused, and its file.
fn credential_field(config: &NatsConfig) -> (&'static str, Option<&Path>) {
    match (&config.creds_file, &config.token_file) {
        (Some(path), _) => ("creds_file", Some(path)),
        (None, Some(path)) => ("token_file", Some(path)),
        (None, None) => ("url", None),
    }
}

/// `nats://host:port STREAM/durable`, without any credentials the URL holds.
fn describe(addrs: &[ServerAddr], config: &NatsConfig) -> String {
    let servers: Vec<String> = addrs
        .iter()
        .map(|a| format!("nats://{}:{}", a.host(), a.port()))
        .collect();
    format!("{} {}/{}", servers.join(","), config.stream, config.durable)
}

/// The servers as an error names them: `nats://host:port`, the password
/// or token masked (`user:***@`, `***@`).
fn masked(addrs: &[ServerAddr]) -> String {
    addrs
        .iter()
        .map(|a| {
            // A user alone is a token: masked whole.
            let credentials = match (a.username(), a.password()) {
                (Some(user), Some(_)) => format!("{user}:***@"),
                (Some(_), None) => "***@".to_owned(),
                (None, _) => String::new(),
            };
            format!("{}://{credentials}{}:{}", a.scheme(), a.host(), a.port())
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The servers in `url`, separated by commas.
fn server_addrs(url: &str) -> Result<Vec<ServerAddr>, String> {
    url.split(',')
        .map(str::trim)
        .map(|one| match ServerAddr::from_str(one) {
            Ok(addr) if !addr.host().is_empty() => Ok(addr),
            Ok(_) => Err(format!("`{one}` names no host")),
            Err(e) => Err(format!("`{one}` is not a server address: {e}")),
        })
        .collect()
}

/// A stream or consumer name as the server accepts it.
fn check_name(field: &'static str, name: &str) -> Result<(), FieldError> {
    let bad = name.is_empty()
        || name.len() > 200
        || name.chars().any(|c| {
            c.is_whitespace() || c.is_control() || matches!(c, '.' | '*' | '>' | '/' | '\\')
        });
    if bad {
        return Err(FieldError::new(
            field,
            format!(
                "`{name}` is not a valid name: 1 to 200 characters, none of `.`, `*`, `>`, `/`, `\\` or spaces"
            ),
        ));
    }
    Ok(())
}

/// Whether a subject may hold `*` and `>` tokens.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wildcards {
    Allowed,
    Refused,
}

/// A subject as the server accepts it: dot-separated non-empty tokens
/// without spaces; `*` and `>` only as whole tokens, `>` only last.
fn check_subject(
    field: &'static str,
    subject: &str,
    wildcards: Wildcards,
) -> Result<(), FieldError> {
    let tokens: Vec<&str> = subject.split('.').collect();
    let last = tokens.len() - 1;
    let bad_token = tokens.iter().enumerate().find_map(|(i, token)| {
        if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            Some("has an empty token or a space")
        } else if *token == "*" || *token == ">" {
            if wildcards == Wildcards::Refused {
                Some("must be a literal subject, without `*` or `>`")
            } else if *token == ">" && i != last {
                Some("may hold `>` only as its last token")
            } else {
                None
            }
        } else if token.contains(['*', '>']) {
            Some("may hold `*` and `>` only as whole tokens")
        } else {
            None
        }
    });
    match bad_token {
        Some(why) => Err(FieldError::new(field, format!("`{subject}` {why}"))),
        None => Ok(()),
    }
}

fn default_url() -> String {
    "nats://127.0.0.1:4222".into()
}

fn default_durable() -> String {
    "idem".into()
}

fn default_ack_wait_ms() -> u64 {
    60_000
}

fn default_prefetch() -> u32 {
    64
}

fn default_request_timeout_ms() -> u64 {
    5_000
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn an_address_in_an_error_never_shows_a_password_or_token(
            user in "[a-z]{1,8}",
            secret in "[A-Z]{6,12}",
            port in 1u16..,
        ) {
            let with_password = server_addrs(&format!("nats://{user}:{secret}@127.0.0.1:{port}")).unwrap();
            prop_assert_eq!(masked(&with_password), format!("nats://{user}:***@127.0.0.1:{port}"));
            let with_token = server_addrs(&format!("nats://{secret}@127.0.0.1:{port}")).unwrap();
            prop_assert_eq!(masked(&with_token), format!("nats://***@127.0.0.1:{port}"));
            let both = server_addrs(&format!(
                "nats://{user}:{secret}@127.0.0.1:{port},nats://127.0.0.1:4222"
            ))
            .unwrap();
            prop_assert_eq!(
                masked(&both),
                format!("nats://{user}:***@127.0.0.1:{port},nats://127.0.0.1:4222")
            );
        }
    }

    fn field_of(config: &NatsConfig) -> Option<String> {
        config.validate().err().map(|e| e.field)
    }

    #[test]
    fn each_bad_value_is_refused_naming_its_field() {
        type Case = (&'static str, fn(&mut NatsConfig), Option<&'static str>);
        let cases: Vec<Case> = vec![
            ("defaults", |_| {}, None),
            ("url", |c| c.url = "nats://".into(), Some("url")),
            ("url port", |c| c.url = "nats://a:port".into(), Some("url")),
            ("url empty", |c| c.url = String::new(), Some("url")),
            (
                "url list",
                |c| c.url = "nats://a:4222, nats://b:4222".into(),
                None,
            ),
            ("stream dot", |c| c.stream = "A.B".into(), Some("stream")),
            ("stream empty", |c| c.stream = String::new(), Some("stream")),
            ("no subjects", |c| c.subjects.clear(), Some("subjects")),
            (
                "subject >",
                |c| c.subjects = vec!["a.>.b".into()],
                Some("subjects"),
            ),
            (
                "subject *x",
                |c| c.subjects = vec!["a.b*".into()],
                Some("subjects"),
            ),
            (
                "subject space",
                |c| c.subjects = vec!["a b".into()],
                Some("subjects"),
            ),
            (
                "subject ..",
                |c| c.subjects = vec!["a..b".into()],
                Some("subjects"),
            ),
            ("subject *", |c| c.subjects = vec!["a.*.b".into()], None),
            ("durable", |c| c.durable = "a b".into(), Some("durable")),
            ("ack wait", |c| c.ack_wait_ms = 0, Some("ack_wait_ms")),
            (
                "max deliver 1",
                |c| c.max_deliver = Some(1),
                Some("max_deliver"),
            ),
            ("max deliver 2", |c| c.max_deliver = Some(2), None),
            (
                "dead wildcard",
                |c| c.dead_letter_subject = Some("dead.*".into()),
                Some("dead_letter_subject"),
            ),
            (
                "late empty",
                |c| c.late_subject = Some(String::new()),
                Some("late_subject"),
            ),
            ("prefetch 0", |c| c.prefetch = 0, Some("prefetch")),
            ("prefetch big", |c| c.prefetch = 65_537, Some("prefetch")),
            (
                "timeout",
                |c| c.request_timeout_ms = 0,
                Some("request_timeout_ms"),
            ),
        ];
        for (name, change, expect) in cases {
            let mut config = NatsConfig::new("PAYOUTS", ["payouts.>"]);
            change(&mut config);
            assert_eq!(field_of(&config).as_deref(), expect, "case {name}");
        }
    }

    #[test]
    fn sink_subjects_default_from_the_stream() {
        let config = NatsConfig::new("PAYOUTS", ["payouts.>"]);
        assert_eq!(config.dead_letter_subject(), "idem.dead-letter.PAYOUTS");
        assert_eq!(config.late_subject(), "idem.late.PAYOUTS");
    }

    #[test]
    fn headers_sort_by_name_and_keep_each_names_values_in_order() {
        let mut map = HeaderMap::new();
        map.append("b-Second", "1");
        map.append("A-first", "x");
        map.append("b-Second", "2");
        assert_eq!(
            sorted_headers(Some(&map)),
            vec![
                ("A-first".to_owned(), "x".to_owned()),
                ("b-Second".to_owned(), "1".to_owned()),
                ("b-Second".to_owned(), "2".to_owned()),
            ]
        );
        assert!(sorted_headers(None).is_empty());
    }

    #[test]
    fn line_breaks_in_a_reason_become_spaces() {
        assert_eq!(one_line("a\r\nb\nc"), "a  b c");
    }
}
