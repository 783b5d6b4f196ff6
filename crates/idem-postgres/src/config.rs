//! A PostgreSQL URL and [`PgOptions`] checked once into what `connect`
//! needs (idem's own URL parameters taken out, a time bound on every
//! operation, keepalives on every connection), and the one way the store is
//! named in messages: host, port, database and schema, never the password.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

pub use idem_core::redact_url;
use idem_core::{Clock, StoreError};
use percent_encoding::percent_decode_str;
use tokio_postgres::config::{Host, SslMode};

/// The default number of pooled connections.
pub const POOL_SIZE_DEFAULT: usize = 16;
/// The most pooled connections one store opens.
pub const POOL_SIZE_MAX: usize = 256;
/// The default schema holding the store's tables.
pub const SCHEMA_DEFAULT: &str = "idem";
/// The longest schema name PostgreSQL keeps (`NAMEDATALEN - 1`), in bytes.
pub const SCHEMA_BYTES_MAX: usize = 63;
/// The default bound on connecting and on waiting for a pooled connection.
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// The largest accepted `connect_timeout_ms`.
pub const CONNECT_TIMEOUT_MS_MAX: u64 = 600_000;
/// The default server-side bound on one statement (`statement_timeout`).
pub const STATEMENT_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// The largest accepted `statement_timeout_ms`.
pub const STATEMENT_TIMEOUT_MS_MAX: u64 = 600_000;
/// The default client-side bound on one whole store operation: waiting for
/// a pooled connection, connecting, and every round trip until COMMIT.
pub const OPERATION_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// The largest accepted `operation_timeout_ms`.
pub const OPERATION_TIMEOUT_MS_MAX: u64 = 600_000;
/// The default number of write batches of one kind in flight at once: two
/// keep the server busy while the next batch fills; more make smaller
/// batches and more commits for the same work.
pub const BATCH_LANES_DEFAULT: usize = 2;
/// The most write batches of one kind in flight at once.
pub const BATCH_LANES_MAX: usize = 16;
/// The default bytes of completed records kept to answer replays.
pub const REPLAY_CACHE_BYTES_DEFAULT: usize = 8 << 20;
/// The most bytes of completed records kept to answer replays.
pub const REPLAY_CACHE_BYTES_MAX: usize = 1 << 30;
/// idem's own query parameters of a store URL. Each sets the
/// [`PgOptions`] field of the same name and is taken out of the URL before
/// the driver reads it; every other parameter goes to the driver, which
/// refuses the ones it does not know.
pub const URL_PARAMETERS: [&str; 7] = [
    "schema",
    "pool_size",
    "batch_lanes",
    "replay_cache_bytes",
    "connect_timeout_ms",
    "statement_timeout_ms",
    "operation_timeout_ms",
];
/// TCP keepalive defaults for the store's connections, applied unless the
/// URL sets the driver's parameter of the same name: a peer that vanished
/// (a network black hole, a host that lost power) is noticed within about
/// idle + interval × retries instead of the kernel's two hours.
/// How the store's own sessions plan its statements, set at session start.
/// Every statement finds its records by a key or a due time, through an
/// index, whatever the table's statistics say: each is prepared once per
/// connection and run from its generic plan (no planning per call), and a
/// sequential scan is chosen only where nothing else can run the
/// statement. Joins between a statement's own inputs stay free to hash.
/// `src/plans.rs` shows every generic plan made under these settings on a
/// new, empty table reads `records` through an index.
pub(crate) const PLANNER_SETTINGS: [(&str, &str); 2] = [
    ("plan_cache_mode", "force_generic_plan"),
    ("enable_seqscan", "off"),
];
const KEEPALIVES_IDLE_S_DEFAULT: u64 = 10;
const KEEPALIVES_INTERVAL_S_DEFAULT: u64 = 5;
const KEEPALIVES_RETRIES_DEFAULT: u32 = 3;
/// `application_name` of the store's sessions when the URL sets none, so
/// operators can find them in `pg_stat_activity`.
pub const APPLICATION_NAME_DEFAULT: &str = "idem";

/// How to connect a [`crate::PgStore`].
#[derive(Clone)]
pub struct PgOptions {
    /// Pooled connections, between 1 and [`POOL_SIZE_MAX`] (values outside
    /// are clamped). Default [`POOL_SIZE_DEFAULT`].
    pub pool_size: usize,
    /// The schema holding `records`, the `tokens` sequence and
    /// `schema_version`: lower-case ASCII letters, digits and `_`, not
    /// starting with a digit, at most [`SCHEMA_BYTES_MAX`] bytes. Default
    /// [`SCHEMA_DEFAULT`].
    pub schema: String,
    /// The clock leases and expiry are judged by. `None` (the default) is
    /// the database's clock, read in the statement that decides, so that
    /// gateway nodes with skewed clocks agree; tests inject a
    /// [`idem_core::ManualClock`].
    pub clock: Option<Arc<dyn Clock>>,
    /// How long connecting may take, and how long an operation waits for a
    /// free pooled connection before it fails with
    /// [`StoreError::Unavailable`]; clamped to 1..=[`CONNECT_TIMEOUT_MS_MAX`].
    /// Default [`CONNECT_TIMEOUT_MS_DEFAULT`].
    pub connect_timeout_ms: u64,
    /// The server's `statement_timeout` for the store's sessions, set when
    /// each connection starts: a statement that runs longer (waiting for a
    /// lock included) is cancelled by the server and the operation fails
    /// with [`StoreError::Unavailable`]. Clamped to
    /// 1..=[`STATEMENT_TIMEOUT_MS_MAX`]. Default
    /// [`STATEMENT_TIMEOUT_MS_DEFAULT`].
    pub statement_timeout_ms: u64,
    /// The client's deadline for one whole operation (pool wait, connect,
    /// every round trip): past it the operation fails with
    /// [`StoreError::Unavailable`] and its connection is closed, whether or
    /// not the server still answers, so a server that stopped answering
    /// cannot hang a caller. A claim cut off this way may have committed;
    /// it is never reported as acquired. It bounds the operations of
    /// [`idem_core::Store`]; `claim_in` and `complete_in` run in the
    /// caller's transaction, bounded by the server's `statement_timeout`
    /// when it is on a connection of this store. Clamped to
    /// 1..=[`OPERATION_TIMEOUT_MS_MAX`]. Default
    /// [`OPERATION_TIMEOUT_MS_DEFAULT`].
    pub operation_timeout_ms: u64,
    /// Group commit: claims of new keys that arrive together go to the
    /// server as one statement and one commit, and so do completions. Up
    /// to this many batches of each kind are in flight at once (each on a
    /// pooled connection); a write that finds all of them busy joins the
    /// next, so nothing waits when the store is idle. `0` sends every
    /// write alone. Clamped to [`BATCH_LANES_MAX`]. Default
    /// [`BATCH_LANES_DEFAULT`].
    pub batch_lanes: usize,
    /// Bytes of completed records kept in memory to answer their replays
    /// without a round trip (`idem_core::ReplayCache`), oldest out first;
    /// `0` keeps none. A kept record answers only while it is completed by
    /// the latest the database's clock can read, known from the clock
    /// readings the statements return (within their round trip, from a
    /// reading at most a second old): near its expiry, or with no recent
    /// reading, the claim goes to the server. Clamped to
    /// [`REPLAY_CACHE_BYTES_MAX`]. Default [`REPLAY_CACHE_BYTES_DEFAULT`].
    pub replay_cache_bytes: usize,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            pool_size: POOL_SIZE_DEFAULT,
            schema: SCHEMA_DEFAULT.to_owned(),
            clock: None,
            connect_timeout_ms: CONNECT_TIMEOUT_MS_DEFAULT,
            statement_timeout_ms: STATEMENT_TIMEOUT_MS_DEFAULT,
            operation_timeout_ms: OPERATION_TIMEOUT_MS_DEFAULT,
            batch_lanes: BATCH_LANES_DEFAULT,
            replay_cache_bytes: REPLAY_CACHE_BYTES_DEFAULT,
        }
    }
}

impl fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgOptions")
            .field("pool_size", &self.pool_size)
            .field("schema", &self.schema)
            .field(
                "clock",
                &self.clock.as_ref().map_or("database", |_| "injected"),
            )
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("statement_timeout_ms", &self.statement_timeout_ms)
            .field("operation_timeout_ms", &self.operation_timeout_ms)
            .field("batch_lanes", &self.batch_lanes)
            .field("replay_cache_bytes", &self.replay_cache_bytes)
            .finish()
    }
}

/// A URL and options, checked.
pub(crate) struct Target {
    /// The driver's configuration, with the timeouts and defaults applied.
    pub(crate) pg: tokio_postgres::Config,
    /// The store as messages name it.
    pub(crate) store: String,
    pub(crate) pool_size: usize,
    /// Bounds connecting and waiting for a pooled connection.
    pub(crate) timeout: Duration,
    /// Bounds one whole operation.
    pub(crate) operation_timeout: Duration,
    /// The options with the URL's own parameters applied.
    pub(crate) options: PgOptions,
}

/// Parses `url` and checks `options`; idem's own parameters in the URL's
/// query ([`URL_PARAMETERS`]) override the fields of `options`. Every
/// refusal is [`StoreError::Incompatible`] (a configuration a person must
/// fix).
pub(crate) fn target(url: &str, options: &PgOptions) -> Result<Target, StoreError> {
    let invalid = |why: String| StoreError::Incompatible {
        store: redact_url(url),
        reason: format!("invalid PostgreSQL URL {}: {why}", redact_url(url)),
    };
    let own = own_parameters(url, options).map_err(invalid)?;
    let (url, options) = (own.url.as_str(), &own.options);
    if let Some((scheme, _)) = url.split_once("://")
        && scheme != "postgres"
        && scheme != "postgresql"
    {
        return Err(invalid(format!(
            "the scheme is {scheme:?}, not postgres or postgresql; \
                 write e.g. postgres://USER@HOST:5432/DBNAME"
        )));
    }
    let mut pg = tokio_postgres::Config::from_str(url).map_err(|e| {
        let text = crate::error::chain(&e);
        let hint = if text.contains("unknown option") {
            format!(
                "idem's own parameters are {}; the others are the driver's (libpq's names)",
                URL_PARAMETERS.join(", ")
            )
        } else {
            "write e.g. postgres://USER@HOST:5432/DBNAME".to_owned()
        };
        invalid(format!("{text}; {hint}"))
    })?;
    if pg.get_hosts().is_empty() {
        return Err(invalid(
            "it names no host; write e.g. postgres://USER@HOST:5432/DBNAME".to_owned(),
        ));
    }
    if pg.get_user().is_none() {
        return Err(invalid(
            "it names no user; write e.g. postgres://USER@HOST:5432/DBNAME".to_owned(),
        ));
    }
    if pg.get_ssl_mode() == SslMode::Require {
        return Err(invalid(
            "sslmode=require, but this build of idem connects without TLS; \
             use a local or tunnelled connection, or sslmode=prefer/disable"
                .to_owned(),
        ));
    }
    let store = describe(&pg, &options.schema);
    check_schema_name(&options.schema).map_err(|reason| StoreError::Incompatible {
        store: store.clone(),
        reason,
    })?;
    let timeout_ms = options.connect_timeout_ms.clamp(1, CONNECT_TIMEOUT_MS_MAX);
    let timeout = Duration::from_millis(timeout_ms);
    pg.connect_timeout(timeout);
    if pg.get_application_name().is_none() {
        pg.application_name(APPLICATION_NAME_DEFAULT);
    }
    bound_sessions(&mut pg, options, &own.driver_keys);
    let operation_ms = options
        .operation_timeout_ms
        .clamp(1, OPERATION_TIMEOUT_MS_MAX);
    Ok(Target {
        pg,
        store,
        pool_size: options.pool_size.clamp(1, POOL_SIZE_MAX),
        timeout,
        operation_timeout: Duration::from_millis(operation_ms),
        options: own.options.clone(),
    })
}

/// Checks `url` as [`crate::PgStore::connect`] would, without connecting:
/// the scheme, the driver's parameters, idem's own ([`URL_PARAMETERS`]),
/// a host, a user, the schema name. The error (a configuration a person
/// must fix, password masked) says what to write instead.
pub fn check_url(url: &str) -> Result<(), StoreError> {
    target(url, &PgOptions::default()).map(|_| ())
}

/// Sets the server's `statement_timeout` and [`PLANNER_SETTINGS`] in the
/// startup packet (no extra round trip, and no session can run without
/// them), and TCP keepalives unless the URL chose its own.
fn bound_sessions(pg: &mut tokio_postgres::Config, options: &PgOptions, driver_keys: &[String]) {
    let statement_ms = options
        .statement_timeout_ms
        .clamp(1, STATEMENT_TIMEOUT_MS_MAX);
    let mut settings = format!("-c statement_timeout={statement_ms}");
    for (name, value) in PLANNER_SETTINGS {
        settings.push_str(&format!(" -c {name}={value}"));
    }
    let startup = match pg.get_options() {
        Some(theirs) if !theirs.trim().is_empty() => format!("{theirs} {settings}"),
        _ => settings,
    };
    pg.options(startup);
    let unset = |key: &str| !driver_keys.iter().any(|k| k == key);
    if unset("keepalives_idle") {
        pg.keepalives_idle(Duration::from_secs(KEEPALIVES_IDLE_S_DEFAULT));
    }
    if unset("keepalives_interval") {
        pg.keepalives_interval(Duration::from_secs(KEEPALIVES_INTERVAL_S_DEFAULT));
    }
    if unset("keepalives_retries") {
        pg.keepalives_retries(KEEPALIVES_RETRIES_DEFAULT);
    }
}

/// A URL with idem's own parameters taken out.
struct OwnParameters {
    /// What the driver reads.
    url: String,
    /// `options` with the parameters applied.
    options: PgOptions,
    /// The (decoded) names of the parameters left for the driver.
    driver_keys: Vec<String>,
}

/// Takes idem's own parameters out of `url`'s query, decoded as the driver
/// decodes names and values (percent-encoding); a parameter given twice,
/// empty or out of range is refused, naming it. The `key=value` form has
/// no query and is returned as it is.
fn own_parameters(url: &str, options: &PgOptions) -> Result<OwnParameters, String> {
    let mut own = OwnParameters {
        url: url.to_owned(),
        options: options.clone(),
        driver_keys: Vec::new(),
    };
    let Some((base, query)) = url.split_once('?').filter(|_| url.contains("://")) else {
        return Ok(own);
    };
    let mut seen: Vec<&str> = Vec::new();
    let mut rest: Vec<&str> = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (raw_key, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = decode(raw_key)?;
        let Some(name) = URL_PARAMETERS.iter().copied().find(|name| *name == key) else {
            own.driver_keys.push(key.into_owned());
            rest.push(pair);
            continue;
        };
        if seen.contains(&name) {
            return Err(format!("parameter {name} is given more than once"));
        }
        seen.push(name);
        set_parameter(&mut own.options, name, &decode(raw_value)?)?;
    }
    own.url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok(own)
}

/// Sets the field `name` of `options` from its URL value.
fn set_parameter(options: &mut PgOptions, name: &str, value: &str) -> Result<(), String> {
    let number = |max: u64, unit: &str| -> Result<u64, String> {
        match value.parse::<u64>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(format!(
                "parameter {name}={value:?} is not a whole number {unit}from 1 to {max}"
            )),
        }
    };
    match name {
        "schema" => options.schema = value.to_owned(),
        "pool_size" => {
            options.pool_size =
                usize::try_from(number(POOL_SIZE_MAX as u64, "")?).unwrap_or(POOL_SIZE_MAX);
        }
        "batch_lanes" => {
            options.batch_lanes = match value.parse::<usize>() {
                Ok(n) if n <= BATCH_LANES_MAX => n,
                _ => {
                    return Err(format!(
                        "parameter {name}={value:?} is not a whole number from 0 to \
                         {BATCH_LANES_MAX}"
                    ));
                }
            };
        }
        "replay_cache_bytes" => {
            options.replay_cache_bytes = match value.parse::<usize>() {
                Ok(n) if n <= REPLAY_CACHE_BYTES_MAX => n,
                _ => {
                    return Err(format!(
                        "parameter {name}={value:?} is not a whole number from 0 to \
                         {REPLAY_CACHE_BYTES_MAX}"
                    ));
                }
            };
        }
        "connect_timeout_ms" => {
            options.connect_timeout_ms = number(CONNECT_TIMEOUT_MS_MAX, "of milliseconds ")?;
        }
        "statement_timeout_ms" => {
            options.statement_timeout_ms = number(STATEMENT_TIMEOUT_MS_MAX, "of milliseconds ")?;
        }
        "operation_timeout_ms" => {
            options.operation_timeout_ms = number(OPERATION_TIMEOUT_MS_MAX, "of milliseconds ")?;
        }
        other => return Err(format!("parameter {other} is not one of idem's")),
    }
    Ok(())
}

/// A URL component percent-decoded as the driver decodes it.
fn decode(raw: &str) -> Result<Cow<'_, str>, String> {
    percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| format!("{raw:?} is not UTF-8 once percent-decoded"))
}

/// `postgres://USER@HOST:PORT/DB (schema S)`, from the parsed config: a
/// password cannot appear because none is read.
fn describe(pg: &tokio_postgres::Config, schema: &str) -> String {
    let ports = pg.get_ports();
    let hosts: Vec<String> = pg
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match host {
                Host::Tcp(name) => format!("{name}:{port}"),
                Host::Unix(path) => format!("[{}]:{port}", path.display()),
            }
        })
        .collect();
    let user = pg.get_user().unwrap_or("");
    let db = pg.get_dbname().unwrap_or(user);
    format!(
        "postgres://{user}@{}/{db} (schema {schema})",
        hosts.join(",")
    )
}

/// A schema name that needs no quoting anywhere it is spliced into SQL.
fn check_schema_name(name: &str) -> Result<(), String> {
    let valid_start = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b == b'_');
    let valid_rest = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if valid_start && valid_rest && name.len() <= SCHEMA_BYTES_MAX {
        Ok(())
    } else {
        Err(format!(
            "invalid schema name {name:?}: use 1 to {SCHEMA_BYTES_MAX} lower-case ASCII \
             letters, digits and '_', not starting with a digit"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords_and_nothing_else() {
        let cases = [
            (
                "postgres://app:s3cret@db.internal:5432/idem",
                "postgres://app:***@db.internal:5432/idem",
            ),
            (
                "postgresql://app:p%40ss@h1,h2/db?sslmode=disable&password=x",
                "postgresql://app:***@h1,h2/db?sslmode=disable&password=***",
            ),
            ("postgres://app@h/db", "postgres://app@h/db"),
            ("postgres://h/db?PASSWORD=y", "postgres://h/db?PASSWORD=***"),
            (
                "host=h user=app password=z dbname=d",
                "host=h user=app password=*** dbname=d",
            ),
            ("postgres://a:b:c@h/db", "postgres://a:***@h/db"),
        ];
        for (raw, expect) in cases {
            assert_eq!(redact_url(raw), expect, "{raw}");
        }
    }

    #[test]
    fn checks_urls_and_options_before_connecting() {
        let cases: [(&str, &str, Result<&str, &str>); 11] = [
            (
                "postgres://app:pw@db:6543/payments",
                "idem",
                Ok("postgres://app@db:6543/payments (schema idem)"),
            ),
            // A primary and its standby: every host named with its own port.
            (
                "postgres://app:pw@10.0.0.1:5433,10.0.0.2:5434/payments?target_session_attrs=read-write",
                "idem",
                Ok("postgres://app@10.0.0.1:5433,10.0.0.2:5434/payments (schema idem)"),
            ),
            (
                "postgresql://app:pw@db-a,db-b:6000/payments?target_session_attrs=read-write&schema=gw",
                "idem",
                Ok("postgres://app@db-a:5432,db-b:6000/payments (schema gw)"),
            ),
            (
                "postgres://app:pw@db-a,db-b/x?target_session_attrs=primary",
                "idem",
                Err("target_session_attrs"),
            ),
            (
                "postgresql://app@db/payments",
                "idem_2",
                Ok("postgres://app@db:5432/payments (schema idem_2)"),
            ),
            ("postgres://app:pw@db:notaport/x", "idem", Err("port")),
            ("postgres://app@/x", "idem", Err("names no host")),
            ("postgres://db/x", "idem", Err("names no user")),
            (
                "postgres://app@db/x?sslmode=require",
                "idem",
                Err("without TLS"),
            ),
            ("postgres://app@db/x", "Idem", Err("invalid schema name")),
            ("postgres://app@db/x", "1dem", Err("invalid schema name")),
        ];
        for (url, schema, expect) in cases {
            let options = PgOptions {
                schema: schema.to_owned(),
                ..PgOptions::default()
            };
            match (target(url, &options), expect) {
                (Ok(t), Ok(store)) => {
                    assert_eq!(t.store, store, "{url}");
                    assert_eq!(t.pg.get_application_name(), Some("idem"), "{url}");
                }
                (Err(StoreError::Incompatible { reason, .. }), Err(part)) => {
                    assert!(reason.contains(part), "{url}: {reason}");
                    assert!(!reason.contains("pw"), "{url} leaks: {reason}");
                }
                (Ok(t), Err(part)) => panic!("{url}: accepted as {}, want {part}", t.store),
                (Err(e), _) => panic!("{url}: {e}"),
            }
        }
    }

    #[test]
    fn takes_idems_own_url_parameters_and_refuses_bad_ones() {
        // (URL, Ok((schema, operation ms, statement ms, pool size)) or Err(part)).
        type Want = Result<(&'static str, u64, u64, usize), &'static str>;
        let base = "postgres://app:pw@db/x";
        let cases: [(&str, Want); 16] = [
            ("", Ok(("idem", 5_000, 5_000, 16))),
            (
                "?schema=gw_a&operation_timeout_ms=2000&statement_timeout_ms=1500&pool_size=3",
                Ok(("gw_a", 2_000, 1_500, 3)),
            ),
            ("?sch%65ma=gw_b&&", Ok(("gw_b", 5_000, 5_000, 16))),
            (
                "?sslmode=disable&schema=gw_c",
                Ok(("gw_c", 5_000, 5_000, 16)),
            ),
            ("?schema=a&schema=b", Err("schema is given more than once")),
            ("?statement_timeout_ms=0", Err("statement_timeout_ms=\"0\"")),
            (
                "?operation_timeout_ms=99999999999999999999999",
                Err("operation_timeout_ms=\"99999999999999999999999\""),
            ),
            ("?operation_timeout_ms=600001", Err("from 1 to 600000")),
            ("?connect_timeout_ms=-1", Err("connect_timeout_ms")),
            ("?statement_timeout_ms=1e3", Err("statement_timeout_ms")),
            ("?operation_timeout_ms=", Err("operation_timeout_ms")),
            ("?pool_size=257", Err("pool_size")),
            ("?schema=", Err("invalid schema name")),
            ("?schema=a%22b", Err("invalid schema name")),
            (
                "?statement_timeout=5",
                Err("unknown option `statement_timeout`"),
            ),
            (
                "?Schema=x",
                Err("idem's own parameters are schema, pool_size"),
            ),
        ];
        for (query, expect) in cases {
            let url = format!("{base}{query}");
            match (target(&url, &PgOptions::default()), expect) {
                (Ok(t), Ok((schema, operation_ms, statement_ms, pool_size))) => {
                    assert_eq!(t.options.schema, schema, "{url}");
                    assert_eq!(t.operation_timeout.as_millis(), u128::from(operation_ms));
                    assert_eq!(
                        t.pg.get_options(),
                        Some(startup(&format!("-c statement_timeout={statement_ms}")).as_str()),
                        "{url}"
                    );
                    assert_eq!(t.pool_size, pool_size, "{url}");
                    assert_eq!(t.pg.get_keepalives_idle(), Duration::from_secs(10), "{url}");
                }
                (Err(StoreError::Incompatible { reason, .. }), Err(part)) => {
                    assert!(reason.contains(part), "{url}: {reason}");
                    assert!(!reason.contains("pw"), "{url} leaks: {reason}");
                }
                (Ok(_), Err(part)) => panic!("{url}: accepted, want {part}"),
                (Err(e), _) => panic!("{url}: {e}"),
            }
        }
    }

    /// Any value of a numeric parameter, however it is spelt: accepted
    /// exactly when it is a whole number in range, and then it is the value
    /// the store uses; percent-encoding any of its bytes changes nothing.
    #[test]
    fn numeric_parameters_take_exactly_the_values_in_range() {
        use proptest::prelude::*;
        let value = prop_oneof![
            any::<u64>().prop_map(|n| n.to_string()),
            (0u64..700_000).prop_map(|n| n.to_string()),
            "[ +\\-0-9a-z\"'%&=.]{0,12}",
        ];
        let runner = proptest::test_runner::Config::with_cases(512);
        proptest!(runner, |(which in 0usize..3, value in value, encode in any::<bool>())| {
            let (name, max) = [
                ("connect_timeout_ms", CONNECT_TIMEOUT_MS_MAX),
                ("statement_timeout_ms", STATEMENT_TIMEOUT_MS_MAX),
                ("operation_timeout_ms", OPERATION_TIMEOUT_MS_MAX),
            ][which];
            let spelt = if encode {
                value.bytes().map(|b| format!("%{b:02X}")).collect()
            } else {
                value.replace('%', "%25").replace('&', "%26")
            };
            let url = format!("postgres://app@db/x?{name}={spelt}");
            let want = value.parse::<u64>().ok().filter(|n| (1..=max).contains(n));
            match (target(&url, &PgOptions::default()), want) {
                (Ok(t), Some(n)) => {
                    let got = match name {
                        "connect_timeout_ms" => t.options.connect_timeout_ms,
                        "statement_timeout_ms" => t.options.statement_timeout_ms,
                        _ => t.options.operation_timeout_ms,
                    };
                    prop_assert_eq!(got, n, "{}", url);
                }
                (Err(StoreError::Incompatible { reason, .. }), None) => {
                    prop_assert!(reason.contains(name), "{}: {}", url, reason);
                }
                (Ok(_), None) => prop_assert!(false, "{} accepted", url),
                (Err(e), _) => prop_assert!(false, "{}: {}", url, e),
            }
        });
    }

    /// The startup options a session gets: `first`, then the planner's.
    fn startup(first: &str) -> String {
        let planner: Vec<String> = PLANNER_SETTINGS
            .iter()
            .map(|(name, value)| format!("-c {name}={value}"))
            .collect();
        format!("{first} {}", planner.join(" "))
    }

    #[test]
    fn keeps_the_drivers_own_session_settings() {
        let url = "postgres://app@db/x?options=-c%20search_path%3Dfoo&keepalives_idle=30";
        let Ok(t) = target(url, &PgOptions::default()) else {
            panic!("{url} is valid")
        };
        assert_eq!(
            t.pg.get_options(),
            Some(startup("-c search_path=foo -c statement_timeout=5000").as_str())
        );
        assert_eq!(t.pg.get_keepalives_idle(), Duration::from_secs(30));
        assert_eq!(t.pg.get_keepalives_interval(), Some(Duration::from_secs(5)));
    }

    #[test]
    fn bounds_pool_size_and_timeout() {
        let url = "postgres://app@db/x";
        for (asked, got) in [(0, 1), (1, 1), (16, 16), (10_000, POOL_SIZE_MAX)] {
            let options = PgOptions {
                pool_size: asked,
                connect_timeout_ms: 0,
                operation_timeout_ms: 0,
                statement_timeout_ms: u64::MAX,
                ..PgOptions::default()
            };
            let Ok(t) = target(url, &options) else {
                panic!("{url} is valid")
            };
            assert_eq!(t.pool_size, got, "pool_size {asked}");
            assert_eq!(t.timeout, Duration::from_millis(1));
            assert_eq!(t.operation_timeout, Duration::from_millis(1));
            assert_eq!(
                t.pg.get_options(),
                Some(startup("-c statement_timeout=600000").as_str())
            );
        }
    }
}
