//! A PostgreSQL URL and [`PgOptions`] checked once into what `connect`
//! needs, and the one way the store is named in messages: host, port,
//! database and schema, never the password.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Clock, StoreError};
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
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            pool_size: POOL_SIZE_DEFAULT,
            schema: SCHEMA_DEFAULT.to_owned(),
            clock: None,
            connect_timeout_ms: CONNECT_TIMEOUT_MS_DEFAULT,
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
    pub(crate) timeout: Duration,
}

/// Parses `url` and checks `options`; every refusal is
/// [`StoreError::Incompatible`] (a configuration a person must fix).
pub(crate) fn target(url: &str, options: &PgOptions) -> Result<Target, StoreError> {
    let invalid = |why: String| StoreError::Incompatible {
        store: redact_url(url),
        reason: format!("invalid PostgreSQL URL {}: {why}", redact_url(url)),
    };
    if let Some((scheme, _)) = url.split_once("://") {
        if scheme != "postgres" && scheme != "postgresql" {
            return Err(invalid(format!(
                "the scheme is {scheme:?}, not postgres or postgresql; \
                 write e.g. postgres://USER@HOST:5432/DBNAME"
            )));
        }
    }
    let mut pg = tokio_postgres::Config::from_str(url).map_err(|e| {
        invalid(format!(
            "{}; write e.g. postgres://USER@HOST:5432/DBNAME",
            crate::error::chain(&e)
        ))
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
    Ok(Target {
        pg,
        store,
        pool_size: options.pool_size.clamp(1, POOL_SIZE_MAX),
        timeout,
    })
}

/// `url` with any password replaced by `***`, for messages and logs: the
/// user-info password of a URL and `password=` options, in a URL's query
/// or in the `key=value` form.
pub fn redact_url(url: &str) -> String {
    let (head, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => return redact_options(url, ' '),
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{hosts}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => format!("{path}?{}", redact_options(query, '&')),
        None => tail.to_owned(),
    };
    format!("{head}{authority}{tail}")
}

/// `password=…` options in a `sep`-separated list, redacted.
fn redact_options(options: &str, sep: char) -> String {
    let parts: Vec<String> = options
        .split(sep)
        .map(|part| match part.split_once('=') {
            Some((name, _)) if name.trim().eq_ignore_ascii_case("password") => {
                format!("{name}=***")
            }
            _ => part.to_owned(),
        })
        .collect();
    parts.join(&sep.to_string())
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
        let cases: [(&str, &str, Result<&str, &str>); 8] = [
            (
                "postgres://app:pw@db:6543/payments",
                "idem",
                Ok("postgres://app@db:6543/payments (schema idem)"),
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
    fn bounds_pool_size_and_timeout() {
        let url = "postgres://app@db/x";
        for (asked, got) in [(0, 1), (1, 1), (16, 16), (10_000, POOL_SIZE_MAX)] {
            let options = PgOptions {
                pool_size: asked,
                connect_timeout_ms: 0,
                ..PgOptions::default()
            };
            let Ok(t) = target(url, &options) else {
                panic!("{url} is valid")
            };
            assert_eq!(t.pool_size, got, "pool_size {asked}");
            assert_eq!(t.timeout, Duration::from_millis(1));
        }
    }
}
