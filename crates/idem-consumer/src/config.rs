//! The `idem consume` config file: the store, one `[[subscription]]` per
//! queue (its broker, the intent's key, the endpoint each message is
//! delivered to, the policy), the `[[lookup]]`s the reconciler asks, and
//! `[reconcile]`. Every error names the file and the field.
//!
//! ```toml
//! store = "sqlite://idem.db"
//!
//! [[subscription]]
//! name = "payouts"
//! key = "payout:{/seller_id}:{/settlement_id}"
//! deliver = "http://127.0.0.1:9000/payouts"
//! fingerprint_exclude = ["/requested_at"]
//! retention_s = 345600
//! tombstone_s = 7776000
//!
//! [subscription.nats]
//! url = "nats://127.0.0.1:4222"
//! stream = "PAYOUTS"
//! subjects = ["payouts.requested"]
//! durable = "idem-payouts"
//! dead_letter_subject = "payouts.dead"
//! late_subject = "payouts.late"
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Uri;
use http::header::HeaderName;
use idem_core::{CompletionTable, Dedup, JsonPointer, LeaseExpiry, Policy, Scope};
use idem_http::CompletionSpec;
use idem_message::{IntentSpec, KeyTemplate, PayloadFingerprint};
use idem_process::StoreUrl;
use idem_reconcile::{
    ForwardedKey, Lookup, LookupSpec, LookupTarget, ReconcileSettings, ReconcileSpec,
};
use serde::Deserialize;

use idem_broker::nats::NatsConfig;
use idem_broker::rabbitmq::RabbitConfig;
use idem_broker::sqs::SqsConfig;

use crate::broker::Broker;

/// The default store, the gateway's.
pub use idem_process::STORE_DEFAULT;
/// The default header the key is delivered in.
pub const KEY_HEADER_DEFAULT: &str = "Idempotency-Key";
/// The default connect timeout towards the endpoint, in milliseconds.
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 2_000;
/// The default time allowed for the endpoint's whole answer, in milliseconds.
pub const RESPONSE_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// The default number of messages a subscription handles at once.
pub const CONCURRENCY_DEFAULT: usize = 8;
/// The most messages a subscription handles at once.
pub const CONCURRENCY_LIMIT: usize = 256;
/// The default largest message, in bytes (1 MiB).
pub const MESSAGE_BYTES_MAX_DEFAULT: usize = 1 << 20;
/// The largest `message_bytes_max` accepted (16 MiB).
pub const MESSAGE_BYTES_MAX_LIMIT: usize = 16 << 20;
/// The default longest wait before a message that is not final comes back,
/// in milliseconds.
pub const RETRY_AFTER_MAX_MS_DEFAULT: u64 = 5_000;
/// The default principal part of a subscription's scope.
pub const TENANT_DEFAULT: &str = "-";

/// The file as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Store URL; a relative `sqlite://PATH` names a file next to the
    /// config file. Default `sqlite://idem.db` in the working directory.
    pub store: Option<String>,
    /// Label written on the records this process acquires.
    pub owner: Option<String>,
    /// The region this process runs in, written on the records it
    /// acquires; none by default.
    pub region: Option<String>,
    /// Seconds between two runs of the retention purge; default 60.
    pub purge_interval_s: Option<u64>,
    /// Seconds between two samples of the store for the gauges of
    /// `/metrics`; default 15.
    pub gauge_sample_interval_s: Option<u64>,
    /// Address of a listener of its own answering `GET /healthz`, `GET
    /// /readyz` (the store, each subscription's broker connection, the
    /// reconciler) and `GET /metrics`, e.g. `127.0.0.1:9091`; default off.
    pub probe_listen: Option<String>,
    /// The queues read.
    #[serde(default, rename = "subscription")]
    pub subscriptions: Vec<SubscriptionSpec>,
    /// How ambiguous records are looked up, per subscription name.
    #[serde(default, rename = "lookup")]
    pub lookups: Vec<LookupSpec>,
    /// Reconciler settings.
    pub reconcile: Option<ReconcileSpec>,
}

/// One `[[subscription]]` as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionSpec {
    /// The operation name in the records' scope (required, unique).
    pub name: String,
    /// The principal part of the scope; default `-`.
    pub tenant: Option<String>,
    /// The key template (required): `{/pointer}`, `{header:NAME}`,
    /// `{message_id}` and literal text (see `idem_message::KeyTemplate`).
    pub key: String,
    /// `json` (default: canonical JSON, exclusions apply) or `bytes`.
    pub fingerprint: Option<String>,
    /// JSON pointers of payload fields left out of the fingerprint.
    pub fingerprint_exclude: Option<Vec<String>>,
    /// Message headers that take part in the fingerprint.
    pub fingerprint_headers: Option<Vec<String>>,
    /// The endpoint each message is POSTed to (required), `http://…`.
    pub deliver: String,
    /// The header the key is delivered in; default `Idempotency-Key`.
    pub key_header: Option<String>,
    /// Connect timeout towards the endpoint, in milliseconds; default 2 000.
    pub connect_timeout_ms: Option<u64>,
    /// Time allowed for the endpoint's whole answer, in milliseconds;
    /// default 10 000. Must be shorter than the lease.
    pub response_timeout_ms: Option<u64>,
    /// Lease in milliseconds; default 30 000.
    pub lease_ms: Option<u64>,
    /// Retention of results in seconds; default 86 400.
    pub retention_s: Option<u64>,
    /// Tombstone horizon in seconds from completion; default 30 days.
    pub tombstone_s: Option<u64>,
    /// Overrides of the completion table by status.
    pub completion: Option<CompletionSpec>,
    /// Messages handled at once; default 8 (1–256).
    pub concurrency: Option<usize>,
    /// The largest payload accepted, in bytes; default 1 MiB.
    pub message_bytes_max: Option<usize>,
    /// The longest a message that is not final (in flight elsewhere,
    /// outcome unknown) is held back before it comes again, in
    /// milliseconds; default 5 000 (1–3 600 000).
    pub retry_after_max_ms: Option<u64>,
    /// How long a delivery that finds its intent in flight (another
    /// delivery runs it) waits for that attempt's outcome before it is held
    /// back, in milliseconds; it asks again every 250 ms and acks the
    /// replay once the attempt completed. Default: `response_timeout_ms`
    /// (less, to stay within a NATS `ack_wait_ms`); 0 waits not at all; at
    /// most the lease.
    pub wait_ms: Option<u64>,
    /// After this many deliveries, a message that is still not final goes
    /// to the dead-letter destination (`undecided`) instead of being handed
    /// back again; default: never. Set it at or below a broker's own limit
    /// (JetStream's `max_deliver`), which would otherwise drop it silently.
    pub max_deliveries: Option<u64>,
    /// The operation's contract file, relative to the config file;
    /// `idem consume` refuses to start when it fails `idem check`.
    pub contract: Option<String>,
    /// A NATS JetStream stream (`[subscription.nats]`).
    pub nats: Option<NatsConfig>,
    /// A RabbitMQ queue (`[subscription.rabbitmq]`).
    pub rabbitmq: Option<RabbitConfig>,
    /// An Amazon SQS queue (`[subscription.sqs]`).
    pub sqs: Option<SqsConfig>,
}

/// A validated subscription.
#[derive(Clone, Debug)]
pub struct Subscription {
    /// Its name (the scope's operation).
    pub name: String,
    /// How a message's intent is read.
    pub intent: IntentSpec,
    /// The endpoint.
    pub deliver: Uri,
    /// The header the key is delivered in.
    pub key_header: HeaderName,
    /// Connect timeout towards the endpoint.
    pub connect_timeout: Duration,
    /// Time allowed for the endpoint's whole answer.
    pub response_timeout: Duration,
    /// Lease, retention, tombstone.
    pub policy: Policy,
    /// What the endpoint's answers mean.
    pub completion: CompletionTable,
    /// Messages handled at once.
    pub concurrency: usize,
    /// The largest payload accepted.
    pub message_bytes_max: usize,
    /// The longest a message that is not final is held back.
    pub retry_after_max: Duration,
    /// Deliveries after which a message still not final is dead-lettered.
    pub max_deliveries: Option<u64>,
    /// How long a delivery whose intent is in flight waits for its outcome.
    pub wait: Duration,
    /// The contract file, resolved against the config file's directory.
    pub contract: Option<PathBuf>,
    /// The broker.
    pub broker: Broker,
}

/// A validated `idem consume` configuration.
#[derive(Clone, Debug)]
pub struct ConsumeConfig {
    /// The store, checked; opened by the caller.
    pub store: StoreUrl,
    /// Record owner label.
    pub owner: String,
    /// Region written on acquired records, checked by
    /// [`idem_core::check_region`].
    pub region: Option<String>,
    /// Time between two runs of the retention purge.
    pub purge_interval: Duration,
    /// Time between two samples of the store for the gauges of `/metrics`.
    pub gauge_sample_interval: Duration,
    /// Where the probes and `/metrics` are served, if anywhere.
    pub probe_listen: Option<std::net::SocketAddr>,
    /// The subscriptions.
    pub subscriptions: Vec<Subscription>,
    /// Lookups by operation (subscription name), for the reconciler.
    pub lookups: Vec<(String, Lookup)>,
    /// Reconciler settings.
    pub reconcile: ReconcileSettings,
}

/// A configuration error: where (file, field) and what; the one field
/// refusal every config and broker section shares.
pub use idem_core::FieldError as ConfigError;

impl ConsumeConfig {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<ConsumeConfig, ConfigError> {
        let error = |field: &str, reason: String| ConfigError::new(field, reason).in_file(path);
        let text = std::fs::read_to_string(path)
            .map_err(|e| error("(file)", format!("cannot read: {e}")))?;
        let file: FileConfig = toml::from_str(&text).map_err(|e| {
            let (line, column) = e
                .span()
                .map(|span| line_column(&text, span.start))
                .unwrap_or((0, 0));
            error(
                &format!("line {line}, column {column}"),
                e.message().to_owned(),
            )
        })?;
        let base_dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        ConsumeConfig::from_file(file, &base_dir).map_err(|(field, reason)| error(&field, reason))
    }

    /// Validates a parsed file; errors are `(field, reason)`.
    pub fn from_file(file: FileConfig, base_dir: &Path) -> Result<ConsumeConfig, (String, String)> {
        // A store named in the file is the file's, like its contracts; the
        // default, named nowhere, is the working directory's.
        let store = match file.store.as_deref() {
            Some(raw) => StoreUrl::parse(raw)
                .map(|url| url.relative_to(base_dir))
                .map_err(|e| ("store".to_owned(), e.to_string()))?,
            None => {
                StoreUrl::parse(STORE_DEFAULT).map_err(|e| ("store".to_owned(), e.to_string()))?
            }
        };
        if file.subscriptions.is_empty() {
            return Err((
                "subscription".into(),
                "declare at least one [[subscription]]".into(),
            ));
        }
        let subscriptions = subscriptions(&file.subscriptions, base_dir)?;
        let lookups = lookups(&file.lookups, &subscriptions)?;
        let reconcile = ReconcileSettings::new(&file.reconcile.clone().unwrap_or_default())
            .map_err(|e| (format!("reconcile.{}", e.field), e.reason.clone()))?;
        if let Some(region) = &file.region {
            idem_core::check_region(region).map_err(|e| ("region".to_owned(), e.to_string()))?;
        }
        let probe_listen = match &file.probe_listen {
            None => None,
            Some(text) => Some(text.parse().map_err(|e| {
                (
                    "probe_listen".to_owned(),
                    format!("{text:?} is not an address like 127.0.0.1:9091 ({e})"),
                )
            })?),
        };
        let purge_interval_s = file.purge_interval_s.unwrap_or(60);
        if !(1..=86_400).contains(&purge_interval_s) {
            return Err((
                "purge_interval_s".into(),
                format!("{purge_interval_s} is outside 1–86400"),
            ));
        }
        let gauge_sample_interval_s = file
            .gauge_sample_interval_s
            .unwrap_or(idem_process::gauges::GAUGE_SAMPLE_INTERVAL_S_DEFAULT);
        let gauges_max = idem_process::gauges::GAUGE_SAMPLE_INTERVAL_S_MAX;
        if !(1..=gauges_max).contains(&gauge_sample_interval_s) {
            return Err((
                "gauge_sample_interval_s".into(),
                format!("{gauge_sample_interval_s} is outside 1–{gauges_max}"),
            ));
        }
        Ok(ConsumeConfig {
            store,
            owner: owner(file.owner)?,
            region: file.region,
            purge_interval: Duration::from_secs(purge_interval_s),
            gauge_sample_interval: Duration::from_secs(gauge_sample_interval_s),
            probe_listen,
            subscriptions,
            lookups,
            reconcile,
        })
    }
}

/// One `[[subscription]]`, validated section by section.
fn subscription(
    spec: &SubscriptionSpec,
    base_dir: &Path,
    at: &dyn Fn(&str) -> String,
) -> Result<Subscription, (String, String)> {
    let intent = intent(spec, at)?;
    let endpoint = Endpoint::validate(spec, at)?;
    let response_timeout_ms = endpoint.response_timeout_ms;
    let (policy, completion) = policy(spec, response_timeout_ms, at)?;
    let bounds = Bounds::validate(spec, at)?;
    let nats = spec.nats.clone().map(|c| c.relative_to(base_dir));
    let rabbitmq = spec.rabbitmq.clone().map(|c| c.relative_to(base_dir));
    let broker = Broker::from_sections(nats.as_ref(), rabbitmq.as_ref(), spec.sqs.as_ref(), at)?;
    // A message still being delivered when the broker's wait for its
    // settlement ends is delivered again to another worker meanwhile.
    if let Some(ack_wait_ms) = broker.fixed_ack_wait_ms()
        && ack_wait_ms <= response_timeout_ms
    {
        return Err((
            at("nats.ack_wait_ms"),
            format!(
                "{ack_wait_ms} ms must be longer than response_timeout_ms \
                 ({response_timeout_ms} ms)"
            ),
        ));
    }
    let wait_ms = wait_ms(
        spec,
        &policy,
        response_timeout_ms,
        broker.fixed_ack_wait_ms(),
    )
    .map_err(|reason| (at("wait_ms"), reason))?;
    // The broker would stop delivering a message after its own limit:
    // the bridge dead-letters it at that delivery instead.
    let max_deliveries = match (spec.max_deliveries, broker.max_deliver()) {
        (Some(ours), Some(theirs)) => Some(ours.min(theirs)),
        (ours, theirs) => ours.or(theirs),
    };
    Ok(Subscription {
        name: spec.name.clone(),
        intent,
        deliver: endpoint.deliver,
        key_header: endpoint.key_header,
        connect_timeout: Duration::from_millis(endpoint.connect_timeout_ms),
        response_timeout: Duration::from_millis(response_timeout_ms),
        policy,
        completion,
        concurrency: usize::try_from(bounds.concurrency).unwrap_or(CONCURRENCY_DEFAULT),
        message_bytes_max: usize::try_from(bounds.message_bytes_max)
            .unwrap_or(MESSAGE_BYTES_MAX_DEFAULT),
        retry_after_max: Duration::from_millis(bounds.retry_after_max_ms),
        max_deliveries,
        wait: Duration::from_millis(wait_ms),
        contract: spec.contract.as_ref().map(|c| base_dir.join(c)),
        broker,
    })
}

/// The intent a message carries: its scope (name, tenant), key template
/// and fingerprint.
fn intent(
    spec: &SubscriptionSpec,
    at: &dyn Fn(&str) -> String,
) -> Result<IntentSpec, (String, String)> {
    if spec.name.is_empty() || spec.name.contains('|') {
        return Err((
            at("name"),
            format!("{:?} must be non-empty without '|'", spec.name),
        ));
    }
    let tenant = spec.tenant.as_deref().unwrap_or(TENANT_DEFAULT);
    let scope =
        Scope::from_parts(&spec.name, tenant, None).map_err(|e| (at("tenant"), e.to_string()))?;
    let key = KeyTemplate::parse(&spec.key).map_err(|e| (at("key"), e.to_string()))?;
    Ok(IntentSpec::new(scope, key, fingerprint(spec, at)?))
}

/// What a message's fingerprint covers: its JSON less the excluded
/// pointers, or its bytes, and the headers named.
fn fingerprint(
    spec: &SubscriptionSpec,
    at: &dyn Fn(&str) -> String,
) -> Result<PayloadFingerprint, (String, String)> {
    let mut fingerprint = match spec.fingerprint.as_deref().unwrap_or("json") {
        "json" => {
            let mut exclude = Vec::new();
            for (j, text) in spec.fingerprint_exclude.iter().flatten().enumerate() {
                let pointer = JsonPointer::parse(text)
                    .map_err(|e| (at(&format!("fingerprint_exclude[{j}]")), e.to_string()))?;
                exclude.push(pointer);
            }
            PayloadFingerprint::json(exclude)
        }
        "bytes"
            if spec
                .fingerprint_exclude
                .as_ref()
                .is_some_and(|v| !v.is_empty()) =>
        {
            return Err((
                at("fingerprint_exclude"),
                "exclusions need fingerprint = \"json\"".into(),
            ));
        }
        "bytes" => PayloadFingerprint::bytes(),
        other => {
            return Err((
                at("fingerprint"),
                format!("{other:?}: use \"json\" or \"bytes\""),
            ));
        }
    };
    if let Some(names) = &spec.fingerprint_headers {
        if let Some(name) = names
            .iter()
            .find(|n| idem_core::fingerprint::is_trace_context(n))
        {
            return Err((
                at("fingerprint_headers"),
                format!(
                    "{name:?}: {}",
                    idem_core::fingerprint::TRACE_CONTEXT_REFUSED
                ),
            ));
        }
        fingerprint = fingerprint.with_headers(names.clone());
    }
    Ok(fingerprint)
}

/// Where and how a message is delivered.
struct Endpoint {
    deliver: Uri,
    key_header: HeaderName,
    connect_timeout_ms: u64,
    response_timeout_ms: u64,
}

impl Endpoint {
    fn validate(
        spec: &SubscriptionSpec,
        at: &dyn Fn(&str) -> String,
    ) -> Result<Endpoint, (String, String)> {
        let deliver: Uri = spec.deliver.parse().map_err(|e| {
            (
                at("deliver"),
                format!("{:?} is not a URL: {e}", spec.deliver),
            )
        })?;
        if deliver.scheme_str() != Some("http") || deliver.authority().is_none() {
            return Err((
                at("deliver"),
                format!("{:?}: an http://host:port/path URL", spec.deliver),
            ));
        }
        let key_header_text = spec.key_header.as_deref().unwrap_or(KEY_HEADER_DEFAULT);
        let key_header = HeaderName::from_bytes(key_header_text.as_bytes()).map_err(|_| {
            (
                at("key_header"),
                format!("{key_header_text:?} is not a header name"),
            )
        })?;
        let connect_timeout_ms = ranged(
            at("connect_timeout_ms"),
            spec.connect_timeout_ms,
            CONNECT_TIMEOUT_MS_DEFAULT,
            1,
            60_000,
        )?;
        let response_timeout_ms = ranged(
            at("response_timeout_ms"),
            spec.response_timeout_ms,
            RESPONSE_TIMEOUT_MS_DEFAULT,
            1,
            600_000,
        )?;
        Ok(Endpoint {
            deliver,
            key_header,
            connect_timeout_ms,
            response_timeout_ms,
        })
    }
}

/// The records' policy, whose lease must outlast the endpoint's answer,
/// and what each answer means.
fn policy(
    spec: &SubscriptionSpec,
    response_timeout_ms: u64,
    at: &dyn Fn(&str) -> String,
) -> Result<(Policy, CompletionTable), (String, String)> {
    let d = Policy::DEFAULT;
    // As on a gateway route, the default tombstone covers a longer
    // retention rather than refusing it.
    let policy = Policy::new(
        spec.lease_ms.unwrap_or(d.lease_ms()),
        spec.retention_s.unwrap_or(d.retention_s()),
        spec.tombstone_s
            .unwrap_or(d.tombstone_s().max(spec.retention_s.unwrap_or(0))),
        LeaseExpiry::Reconcile,
    )
    .map_err(|e| (at(e.field()), e.to_string()))?;
    // While the endpoint may still answer, the attempt may commit: a lease
    // that ends first lets a redelivery mark it ambiguous and a "not found"
    // release it, and the next delivery would run it a second time.
    if policy.lease_ms() <= response_timeout_ms {
        return Err((
            at("lease_ms"),
            format!(
                "{} ms must be longer than response_timeout_ms ({response_timeout_ms} ms)",
                policy.lease_ms()
            ),
        ));
    }
    let completion = spec
        .completion
        .clone()
        .unwrap_or_default()
        .table(Dedup::Idem)
        .map_err(|e| (at("completion"), e.to_string()))?;
    Ok((policy, completion))
}

/// How much a subscription takes on at once and waits at most.
struct Bounds {
    concurrency: u64,
    message_bytes_max: u64,
    retry_after_max_ms: u64,
}

impl Bounds {
    fn validate(
        spec: &SubscriptionSpec,
        at: &dyn Fn(&str) -> String,
    ) -> Result<Bounds, (String, String)> {
        // Each bound: its field, its value, its default and its ceiling
        // (every floor is 1); refused in this order.
        let [concurrency, message_bytes_max, retry_after_max_ms] = [
            (
                "concurrency",
                spec.concurrency.map(|n| n as u64),
                CONCURRENCY_DEFAULT as u64,
                CONCURRENCY_LIMIT as u64,
            ),
            (
                "message_bytes_max",
                spec.message_bytes_max.map(|n| n as u64),
                MESSAGE_BYTES_MAX_DEFAULT as u64,
                MESSAGE_BYTES_MAX_LIMIT as u64,
            ),
            (
                "retry_after_max_ms",
                spec.retry_after_max_ms,
                RETRY_AFTER_MAX_MS_DEFAULT,
                3_600_000,
            ),
        ]
        .map(|(field, value, default, hi)| ranged(at(field), value, default, 1, hi));
        let (concurrency, message_bytes_max, retry_after_max_ms) =
            (concurrency?, message_bytes_max?, retry_after_max_ms?);
        if spec.max_deliveries == Some(0) {
            return Err((at("max_deliveries"), "0: at least 1".into()));
        }
        Ok(Bounds {
            concurrency,
            message_bytes_max,
            retry_after_max_ms,
        })
    }
}

/// Each `[[subscription]]`, validated; no two share a name or an endpoint.
fn subscriptions(
    specs: &[SubscriptionSpec],
    base_dir: &Path,
) -> Result<Vec<Subscription>, (String, String)> {
    let mut subscriptions: Vec<Subscription> = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let at = |field: &str| format!("subscription[{i}].{field}");
        let sub = subscription(spec, base_dir, &at)?;
        if subscriptions.iter().any(|s| s.name == sub.name) {
            return Err((
                at("name"),
                format!("{:?} names two subscriptions", sub.name),
            ));
        }
        // Records are scoped by subscription: an intent that arrives on
        // two queues delivered to one endpoint would be claimed in two
        // scopes and run twice, and their lookups would ask the
        // provider by the same keys for two scopes' records.
        let endpoint = endpoint_of(&sub.deliver);
        if let Some(other) = subscriptions
            .iter()
            .find(|s| endpoint_of(&s.deliver) == endpoint)
        {
            return Err((
                at("deliver"),
                format!(
                    "{} is also the endpoint of subscription {:?}: records are kept per \
                     subscription, so an intent arriving on both would run twice; give each \
                     endpoint one subscription",
                    sub.deliver, other.name
                ),
            ));
        }
        subscriptions.push(sub);
    }
    Ok(subscriptions)
}

/// Each `[[lookup]]`, bound to the subscription it serves.
fn lookups(
    entries: &[LookupSpec],
    subscriptions: &[Subscription],
) -> Result<Vec<(String, Lookup)>, (String, String)> {
    let mut lookups = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let at = |field: &str| format!("lookup[{i}].{field}");
        let served = entry
            .target(LookupTarget::Subscription)
            .map_err(|(field, why)| (at(field), why))?;
        if !subscriptions.iter().any(|s| s.name == served) {
            return Err((
                at("subscription"),
                format!("no [[subscription]] is named {served:?}"),
            ));
        }
        // The reference delivered for a record is its key.
        let forwarded: ForwardedKey =
            std::sync::Arc::new(|id: &idem_core::RecordId| id.key.as_str().to_owned());
        let mut lookup =
            Lookup::new(entry, forwarded).map_err(|e| (at(&e.field), e.reason.clone()))?;
        // An https:// provider is trusted through the system's roots.
        if lookup.is_https() {
            let trust =
                idem_process::UpstreamTls::load(None).map_err(|e| (at("url"), e.to_string()))?;
            lookup = lookup.with_tls(trust.shared_config(), "the system's roots".into());
        }
        lookups.push((served.to_owned(), lookup));
    }
    Ok(lookups)
}

/// An endpoint as two subscriptions are compared by: the host and port in
/// lower case and the path as the gateway normalises it (dot segments,
/// escapes of unreserved characters, repeated and trailing slashes), so
/// that one endpoint spelled two ways is still one. Two host names for one
/// server are not recognised.
fn endpoint_of(uri: &Uri) -> (String, String) {
    let authority = uri
        .authority()
        .map_or_else(String::new, |a| a.as_str().to_ascii_lowercase());
    let path = idem_http::normalize_path(uri.path()).unwrap_or_else(|_| uri.path().to_owned());
    (authority, path.trim_end_matches('/').to_owned())
}

/// `value` (or `default`) within `lo..=hi`, or an error naming `field`.
fn ranged(
    field: String,
    value: Option<u64>,
    default: u64,
    lo: u64,
    hi: u64,
) -> Result<u64, (String, String)> {
    let v = value.unwrap_or(default);
    if (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err((field, format!("{v} is outside {lo}–{hi}")))
    }
}

/// The file's `owner`, or one naming this process. The store refuses what
/// `check_owner` refuses, on every claim: it is refused here, once, as the
/// gateway's config refuses it.
fn owner(written: Option<String>) -> Result<String, (String, String)> {
    let owner = written.unwrap_or_else(|| format!("idem-consume-{}", std::process::id()));
    if owner.is_empty() || idem_core::check_owner(&owner).is_err() {
        return Err((
            "owner".into(),
            format!(
                "{owner:?} must be 1-{} bytes without control characters",
                idem_core::OWNER_BYTES_MAX
            ),
        ));
    }
    Ok(owner)
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..offset.min(text.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
    (line, column)
}

/// A subscription's `wait_ms`: by default the response timeout, less
/// where a NATS `ack_wait_ms` must still cover the wait and the delivery
/// after it (or JetStream hands the message to another worker meanwhile);
/// one that is set must fit the lease and that window.
fn wait_ms(
    spec: &SubscriptionSpec,
    policy: &Policy,
    response_timeout_ms: u64,
    ack_wait_ms: Option<u64>,
) -> Result<u64, String> {
    let window = ack_wait_ms.map(|ack| ack.saturating_sub(response_timeout_ms).saturating_sub(1));
    let Some(wait_ms) = spec.wait_ms else {
        return Ok(window.map_or(response_timeout_ms, |w| w.min(response_timeout_ms)));
    };
    if wait_ms > policy.lease_ms() {
        return Err(format!(
            "{wait_ms} ms is longer than the lease ({} ms): the attempt waited for is over by then",
            policy.lease_ms()
        ));
    }
    if let (Some(ack), Some(window)) = (ack_wait_ms, window)
        && wait_ms > window
    {
        return Err(format!(
            "{wait_ms} ms plus response_timeout_ms ({response_timeout_ms} ms) must be shorter \
             than nats.ack_wait_ms ({ack} ms), or JetStream delivers the message again meanwhile"
        ));
    }
    Ok(wait_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
store = "sqlite://idem.db"
[[subscription]]
name = "payouts"
key = "payout:{/seller_id}:{/settlement_id}"
deliver = "http://127.0.0.1:9000/payouts"
[subscription.rabbitmq]
queue = "payouts"
[[lookup]]
subscription = "payouts"
url = "http://127.0.0.1:9000/payouts/by-key/{forwarded_key}"
"#;

    fn load(text: &str) -> Result<ConsumeConfig, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("consume.toml");
        std::fs::write(&path, text).unwrap();
        ConsumeConfig::load(&path)
    }

    /// `GOOD` reading an SQS queue instead, with `extra` in its section.
    fn on_sqs(extra: &str) -> String {
        let base = "https://sqs.eu-west-1.amazonaws.com/123456789012";
        GOOD.replace(
            "[subscription.rabbitmq]\nqueue = \"payouts\"",
            &format!(
                "[subscription.sqs]\nqueue_url = \"{base}/payouts\"\n\
                 dead_letter_queue_url = \"{base}/payouts-dead\"\n\
                 late_queue_url = \"{base}/payouts-late\"\n{extra}"
            ),
        )
    }

    #[test]
    fn an_sqs_subscription_loads_and_its_mistakes_name_their_field() {
        // The visibility is extended while a message runs: unlike a NATS
        // ack_wait_ms, it may be shorter than the response timeout.
        let config = load(&on_sqs("visibility_timeout_s = 2")).unwrap();
        let broker = &config.subscriptions[0].broker;
        assert_eq!(broker.ack_wait_ms(), Some(2_000));
        assert_eq!(broker.fixed_ack_wait_ms(), None);
        assert_eq!(
            broker.describe(),
            "sqs queue payouts at https://sqs.eu-west-1.amazonaws.com/123456789012/payouts"
        );
        let cases = [
            (on_sqs("batch_size = 0"), "subscription[0].sqs.batch_size"),
            (
                on_sqs("").replace(
                    "[subscription.sqs]",
                    "[subscription.rabbitmq]\nqueue = \"q\"\n[subscription.sqs]",
                ),
                "subscription[0].sqs",
            ),
            (on_sqs("queue = \"x\""), "queue"),
        ];
        for (text, field) in cases {
            let e = load(&text).unwrap_err();
            assert!(e.to_string().contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn the_gauge_sample_interval_defaults_to_15_s_and_is_bounded() {
        assert_eq!(
            load(GOOD).unwrap().gauge_sample_interval,
            Duration::from_secs(15)
        );
        let set = |s: u64| GOOD.replacen("\n", &format!("\ngauge_sample_interval_s = {s}\n"), 1);
        assert_eq!(
            load(&set(2)).unwrap().gauge_sample_interval,
            Duration::from_secs(2)
        );
        for s in [0, 3601] {
            let e = load(&set(s)).unwrap_err().to_string();
            let expect = format!("consume.toml: gauge_sample_interval_s: {s} is outside 1–3600");
            assert!(e.contains(&expect), "{e}");
        }
    }

    #[test]
    fn a_bad_store_is_refused_naming_the_field() {
        let cases = [
            (
                "sqlite:/x",
                "store: the URL lacks the // after \"sqlite:\"; write sqlite:///x",
            ),
            (
                "mysql://app:s3cret@h/db",
                "store: \"mysql://app:***@h/db\" has scheme \"mysql\"",
            ),
            (
                "postgres://app:s3cret@h/db?bogus=1",
                "store: invalid PostgreSQL URL postgres://app:***@h/db?bogus=1",
            ),
        ];
        for (url, expect) in cases {
            let text = GOOD.replace("sqlite://idem.db", url);
            let Err(e) = load(&text) else {
                panic!("{url} is refused");
            };
            let e = e.to_string();
            assert!(e.contains(&format!("consume.toml: {expect}")), "{url}: {e}");
            assert!(!e.contains("s3cret"), "{e}");
        }
    }

    /// The trace context changes with every attempt: fingerprinting it
    /// would refuse every redelivery, so the config refuses it, any case.
    #[test]
    fn a_trace_context_header_is_refused_in_the_fingerprint() {
        for name in ["TraceState", "traceparent"] {
            let text = GOOD.replace(
                "deliver = ",
                &format!("fingerprint_headers = [\"x-amount\", \"{name}\"]\ndeliver = "),
            );
            let Err(e) = load(&text) else {
                panic!("{name} is refused");
            };
            let e = e.to_string();
            assert!(e.contains("fingerprint_headers") && e.contains(name), "{e}");
        }
        let text = GOOD.replace(
            "deliver = ",
            "fingerprint_headers = [\"x-amount\"]\ndeliver = ",
        );
        assert!(load(&text).is_ok(), "other headers stay allowed");
    }

    #[test]
    fn a_nats_limit_becomes_the_bridge_s_delivery_limit() {
        let text = GOOD.replace(
            "[subscription.rabbitmq]\nqueue = \"payouts\"",
            "max_deliveries = 9\n[subscription.nats]\nstream = \"P\"\nsubjects = [\"p\"]\nmax_deliver = 5",
        );
        let config = load(&text).unwrap();
        assert_eq!(config.subscriptions[0].max_deliveries, Some(5));
        let text = GOOD.replace(
            "[subscription.rabbitmq]\nqueue = \"payouts\"",
            "[subscription.nats]\nstream = \"P\"\nsubjects = [\"p\"]\nmax_deliver = 5",
        );
        assert_eq!(
            load(&text).unwrap().subscriptions[0].max_deliveries,
            Some(5)
        );
        assert_eq!(load(GOOD).unwrap().subscriptions[0].max_deliveries, None);
    }

    #[test]
    fn the_documented_shape_loads_with_its_defaults() {
        let config = load(GOOD).unwrap();
        let sub = &config.subscriptions[0];
        assert_eq!(sub.name, "payouts");
        assert_eq!(sub.concurrency, CONCURRENCY_DEFAULT);
        assert_eq!(sub.key_header.as_str(), "idempotency-key");
        assert_eq!(sub.intent.scope().as_str(), "payouts|-");
        assert_eq!(config.lookups.len(), 1);
        assert_eq!(config.region, None, "no region unless one is set");
        let config = load(&format!("region = \"eu-west\"\n{GOOD}")).unwrap();
        assert_eq!(config.region.as_deref(), Some("eu-west"));
    }

    /// A lease, retention or tombstone out of range is refused naming that
    /// setting, in words, whichever of the three it is.
    #[test]
    fn an_out_of_range_policy_names_its_own_field_in_words() {
        let cases = [
            (
                "retention_s = 0",
                "retention_s",
                "retention_s = 0 is out of range (1..=",
            ),
            (
                "retention_s = 999999999999",
                "retention_s",
                "retention_s = 999999999999 is out of range",
            ),
            (
                "lease_ms = 50",
                "lease_ms",
                "lease_ms = 50 is out of range (100..=",
            ),
            (
                "lease_ms = 99999999999",
                "lease_ms",
                "lease_ms = 99999999999 is out of range",
            ),
            (
                "retention_s = 7200\ntombstone_s = 3600",
                "tombstone_s",
                "tombstone_s = 3600 must be at least retention_s (7200)",
            ),
            (
                "tombstone_s = 999999999999",
                "tombstone_s",
                "tombstone_s = 999999999999 must be at least",
            ),
        ];
        for (setting, field, words) in cases {
            let text = GOOD.replace(
                "[subscription.rabbitmq]",
                &format!("{setting}\n[subscription.rabbitmq]"),
            );
            let Err(err) = load(&text) else {
                panic!("{setting} is refused");
            };
            assert_eq!(
                err.field,
                format!("subscription[0].{field}"),
                "{setting}: {err}"
            );
            let shown = err.to_string();
            assert!(shown.contains("consume.toml: subscription[0]."), "{shown}");
            assert!(shown.contains(words), "{setting}: {shown}");
            assert!(!shown.contains("OutOfRange"), "{setting}: {shown}");
        }
        // A retention past the default tombstone moves the default along.
        let long = GOOD.replace(
            "[subscription.rabbitmq]",
            "retention_s = 5184000\n[subscription.rabbitmq]",
        );
        let policy = load(&long).unwrap().subscriptions[0].policy;
        assert_eq!(policy.tombstone_s(), 5_184_000);
    }

    /// A relative SQLite store in the file is the file's neighbour; an
    /// absolute one and the default are left as they are.
    #[test]
    fn a_store_in_the_file_is_read_against_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("consume.toml");
        let cases = [
            (
                "store = \"sqlite://idem.db\"\n",
                StoreUrl::Sqlite(dir.path().join("idem.db")),
            ),
            (
                "store = \"sqlite://data/x.db\"\n",
                StoreUrl::Sqlite(dir.path().join("data/x.db")),
            ),
            (
                "store = \"sqlite:///var/lib/idem.db\"\n",
                StoreUrl::Sqlite("/var/lib/idem.db".into()),
            ),
            ("", StoreUrl::Sqlite("idem.db".into())),
        ];
        for (store, want) in cases {
            let text = GOOD.replace("store = \"sqlite://idem.db\"\n", store);
            std::fs::write(&path, text).unwrap();
            assert_eq!(ConsumeConfig::load(&path).unwrap().store, want, "{store}");
        }
    }

    /// Each mistake is refused naming the field it is in.
    #[test]
    fn the_default_wait_is_the_response_timeout_and_fits_a_nats_ack_wait() {
        let config = load(GOOD).unwrap();
        assert_eq!(
            config.subscriptions[0].wait,
            Duration::from_millis(RESPONSE_TIMEOUT_MS_DEFAULT)
        );
        let nats = GOOD.replace(
            "[subscription.rabbitmq]\nqueue = \"payouts\"",
            "[subscription.nats]\nstream = \"P\"\nsubjects = [\"p\"]\nack_wait_ms = 15000",
        );
        let config = load(&nats).unwrap();
        assert_eq!(config.subscriptions[0].wait, Duration::from_millis(4_999));
        let none = GOOD.replace(
            "[subscription.rabbitmq]",
            "wait_ms = 0\n[subscription.rabbitmq]",
        );
        assert_eq!(load(&none).unwrap().subscriptions[0].wait, Duration::ZERO);
    }

    #[test]
    fn every_mistake_names_its_field() {
        let cases = [
            (
                GOOD.replace("name = \"payouts\"", "nmae = \"payouts\""),
                "line 4",
            ),
            (format!("region = \"eu west\"\n{GOOD}"), "region"),
            (format!("owner = \"night\\u0007shift\"\n{GOOD}"), "owner"),
            (format!("owner = \"\"\n{GOOD}"), "owner"),
            (
                GOOD.replace("{/settlement_id}", "{/settlement_id"),
                "subscription[0].key",
            ),
            (
                GOOD.replace("payout:{/seller_id}:{/settlement_id}", "fixed"),
                "subscription[0].key",
            ),
            (
                GOOD.replace(
                    "http://127.0.0.1:9000/payouts\"\n[sub",
                    "ftp://x/payouts\"\n[sub",
                ),
                "subscription[0].deliver",
            ),
            (
                GOOD.replace("[subscription.rabbitmq]\nqueue = \"payouts\"\n", ""),
                "subscription[0].nats",
            ),
            (
                GOOD.replace(
                    "[subscription.rabbitmq]",
                    "[subscription.nats]\nstream = \"P\"\nsubjects = [\"p\"]\n[subscription.rabbitmq]",
                ),
                "subscription[0].rabbitmq",
            ),
            (
                GOOD.replace(
                    "[subscription.rabbitmq]\nqueue = \"payouts\"",
                    "[subscription.nats]\nstream = \"P\"\nsubjects = [\"p\"]\nack_wait_ms = 1000",
                ),
                "subscription[0].nats.ack_wait_ms",
            ),
            (
                GOOD.replace(
                    "[subscription.rabbitmq]\nqueue = \"payouts\"",
                    "[subscription.nats]\nstream = \"P\"\nsubjects = [\"p\"]\nprefetch = 0",
                ),
                "subscription[0].nats.prefetch",
            ),
            (
                GOOD.replace("queue = \"payouts\"", "queue = \"payouts\"\nprefetch = 0"),
                "subscription[0].rabbitmq.prefetch",
            ),
            (
                GOOD.replace(
                    "[subscription.rabbitmq]",
                    "lease_ms = 5000\n[subscription.rabbitmq]",
                ),
                "subscription[0].lease_ms",
            ),
            (
                GOOD.replace(
                    "[subscription.rabbitmq]",
                    "concurrency = 0\n[subscription.rabbitmq]",
                ),
                "subscription[0].concurrency",
            ),
            (
                GOOD.replace(
                    "[subscription.rabbitmq]",
                    "message_bytes_max = 0\n[subscription.rabbitmq]",
                ),
                "subscription[0].message_bytes_max",
            ),
            (
                GOOD.replace(
                    "[subscription.rabbitmq]",
                    "retry_after_max_ms = 3600001\n[subscription.rabbitmq]",
                ),
                "subscription[0].retry_after_max_ms",
            ),
            (
                // Two bounds out of range: the first in the file's order is named.
                GOOD.replace(
                    "[subscription.rabbitmq]",
                    "retry_after_max_ms = 0\nconcurrency = 0\n[subscription.rabbitmq]",
                ),
                "subscription[0].concurrency",
            ),
            (
                GOOD.replace(
                    "[subscription.rabbitmq]",
                    "wait_ms = 40000\n[subscription.rabbitmq]",
                ),
                "subscription[0].wait_ms",
            ),
            (
                GOOD.replace(
                    "[subscription.rabbitmq]\nqueue = \"payouts\"",
                    "wait_ms = 20000\n[subscription.nats]\nstream = \"P\"\nsubjects = [\"p\"]\nack_wait_ms = 25000",
                ),
                "subscription[0].wait_ms",
            ),
            (
                GOOD.replace(
                    "[subscription.rabbitmq]",
                    "fingerprint_exclude = [\"no-slash\"]\n[subscription.rabbitmq]",
                ),
                "subscription[0].fingerprint_exclude[0]",
            ),
            (
                GOOD.replace(
                    "[subscription.rabbitmq]",
                    "completion = { release = [500], unknown = [500] }\n[subscription.rabbitmq]",
                ),
                "subscription[0].completion",
            ),
            (
                GOOD.replace("subscription = \"payouts\"", "subscription = \"payoust\""),
                "lookup[0].subscription",
            ),
            // A gateway's lookup pasted into a consumer's config.
            (
                GOOD.replace("subscription = \"payouts\"", "route = \"payouts\""),
                "lookup[0].route",
            ),
            (GOOD.replace("{forwarded_key}", "{key}"), "lookup[0].url"),
            (
                GOOD.to_owned() + "[reconcile]\ninterval_s = 0\n",
                "reconcile.interval_s",
            ),
            (
                GOOD.to_owned()
                    + "[[subscription]]\nname = \"payouts\"\nkey = \"k:{/a}\"\ndeliver = \"http://h:1/\"\n[subscription.rabbitmq]\nqueue = \"q\"\n",
                "subscription[1].name",
            ),
            (
                GOOD.to_owned() + "[[subscription]]\nname = \"refunds\"\nkey = \"k:{/a}\"\ndeliver = \"http://127.0.0.1:9000/payouts\"\n[subscription.rabbitmq]\nqueue = \"q\"\n",
                "subscription[1].deliver",
            ),
            (
                GOOD.to_owned() + "[[subscription]]\nname = \"refunds\"\nkey = \"k:{/a}\"\ndeliver = \"http://127.0.0.1:9000/./x/../payouts/\"\n[subscription.rabbitmq]\nqueue = \"q\"\n",
                "subscription[1].deliver",
            ),
        ];
        for (text, field) in cases {
            let err = match load(&text) {
                Ok(_) => panic!("accepted, expected an error in {field}:\n{text}"),
                Err(e) => e,
            };
            assert!(
                err.field.starts_with(field),
                "expected {field}, got {err}\n{text}"
            );
            assert!(err.to_string().contains("consume.toml"), "{err}");
        }
    }
}
