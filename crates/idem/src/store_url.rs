//! Store URLs (`sqlite://PATH`, `postgres://…`) parsed once into a
//! validated type, and opened.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use idem_core::{Store, StoreError};
use idem_postgres::{PgOptions, PgStore, redact_url};
use idem_sqlite::{SqliteOptions, SqliteStore};

/// The default store: an SQLite file in the working directory.
pub const DEFAULT_STORE: &str = "sqlite://idem.db";

/// A parsed store URL.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `sqlite://PATH`: relative paths as given, `sqlite:///abs/path` absolute.
    Sqlite(PathBuf),
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?…]` (or `postgresql://`),
    /// as given. It may hold a password, so `Display` and `Debug` mask it.
    /// idem's own query parameters (`schema`, `operation_timeout_ms`, …,
    /// see [`idem_postgres::URL_PARAMETERS`]) are read by the store.
    Postgres(String),
}

impl StoreUrl {
    /// Parses `sqlite://PATH`, `postgres://…` or `postgresql://…`.
    pub fn parse(raw: &str) -> anyhow::Result<StoreUrl> {
        if let Some(path) = raw.strip_prefix("sqlite://") {
            if path.is_empty() {
                bail!("store URL {raw:?} names no file; write e.g. sqlite://idem.db");
            }
            return Ok(StoreUrl::Sqlite(PathBuf::from(path)));
        }
        if raw.starts_with("postgres://") || raw.starts_with("postgresql://") {
            return Ok(StoreUrl::Postgres(raw.to_owned()));
        }
        let shown = redact_url(raw);
        match raw.split_once("://") {
            Some((scheme, _)) => bail!(
                "store URL {shown:?} has scheme {scheme:?}; \
                 supported: sqlite://PATH, postgres://USER@HOST/DB"
            ),
            None => bail!("store URL {shown:?} has no scheme; write e.g. sqlite://{shown}"),
        }
    }

    /// Opens the store for routes in `synchronous` mode: refused on SQLite
    /// (one file on one machine is not replicated); on PostgreSQL the
    /// replication settings are checked now and on every new connection
    /// ([`idem_postgres::replication`]).
    pub fn open_synchronous(&self, routes: &[String]) -> anyhow::Result<Arc<dyn Store>> {
        let names = routes.join(", ");
        match self {
            StoreUrl::Sqlite(_) => bail!(
                "route {names} has regions = {{ mode = \"synchronous\" }}, but the store {self} \
                 is one SQLite file on one machine, not replicated: use a PostgreSQL primary \
                 with a synchronous standby, or another mode"
            ),
            StoreUrl::Postgres(url) => match connect_postgres(url, true, true) {
                Ok(Some(store)) => Ok(Arc::new(store)),
                Ok(None) => bail!("store {self} was not created"),
                Err(e) => Err(e.context(format!(
                    "route {names} has regions = {{ mode = \"synchronous\" }}, and the store \
                     {self} is refused"
                ))),
            },
        }
    }

    /// Opens the store, creating an empty one if there is none.
    pub fn open(&self) -> anyhow::Result<Arc<dyn Store>> {
        match self {
            StoreUrl::Sqlite(path) => {
                let store = SqliteStore::open(path, SqliteOptions::default())
                    .with_context(|| format!("cannot open store {self}"))?;
                Ok(Arc::new(store))
            }
            StoreUrl::Postgres(url) => match connect_postgres(url, true, false)? {
                Some(store) => Ok(Arc::new(store)),
                None => bail!("store {self} was not created"),
            },
        }
    }

    /// Opens an existing store for inspection, or `None` if there is none yet
    /// (inspecting must not create a database or a schema as a side effect).
    pub fn open_existing(&self) -> anyhow::Result<Option<Arc<dyn Store>>> {
        match self {
            StoreUrl::Sqlite(path) => {
                if !path.exists() {
                    return Ok(None);
                }
                let options = SqliteOptions {
                    create: false,
                    ..SqliteOptions::default()
                };
                let store = SqliteStore::open(path, options)
                    .with_context(|| format!("cannot open store {self}"))?;
                Ok(Some(Arc::new(store)))
            }
            StoreUrl::Postgres(url) => {
                let store = connect_postgres(url, false, false)?;
                Ok(store.map(|s| Arc::new(s) as Arc<dyn Store>))
            }
        }
    }
}

/// Connects (and creates or migrates the schema) on a thread and runtime of
/// its own, so that this synchronous call works inside or outside the
/// caller's runtime; the pool opens its connections later, on the runtime
/// of the operations that use them.
fn connect_postgres(url: &str, create: bool, synchronous: bool) -> anyhow::Result<Option<PgStore>> {
    let options = PgOptions::default();
    let connect = || -> anyhow::Result<Result<Option<PgStore>, StoreError>> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start a runtime to connect to PostgreSQL")?;
        runtime.block_on(async {
            let store = if create {
                PgStore::connect(url, options.clone()).await.map(Some)
            } else {
                PgStore::connect_existing(url, options.clone()).await
            };
            if synchronous && let Ok(Some(store)) = &store {
                let settings = store.require_synchronous_replication().await?;
                tracing::info!(
                    synchronous_commit = %settings.synchronous_commit,
                    synchronous_standby_names = %settings.synchronous_standby_names,
                    "the store is synchronously replicated"
                );
            }
            Ok::<_, anyhow::Error>(store)
        })
    };
    let connected = std::thread::scope(|s| s.spawn(connect).join())
        .map_err(|_| anyhow::anyhow!("connecting to {} panicked", redact_url(url)))??;
    Ok(connected?)
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            StoreUrl::Postgres(url) => f.write_str(&redact_url(url)),
        }
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            StoreUrl::Postgres(url) => f.debug_tuple("Postgres").field(&redact_url(url)).finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_store_urls() {
        let pg = |url: &str| Ok(StoreUrl::Postgres(url.to_owned()));
        let cases = [
            ("sqlite://idem.db", Ok(StoreUrl::Sqlite("idem.db".into()))),
            (
                "sqlite:///var/lib/idem.db",
                Ok(StoreUrl::Sqlite("/var/lib/idem.db".into())),
            ),
            ("sqlite://", Err("names no file")),
            ("postgres://h/db", pg("postgres://h/db")),
            (
                "postgresql://app:pw@h:5433/db?sslmode=disable",
                pg("postgresql://app:pw@h:5433/db?sslmode=disable"),
            ),
            ("mysql://app:pw@h/db", Err("has scheme \"mysql\"")),
            ("idem.db", Err("has no scheme")),
        ];
        for (raw, expect) in cases {
            match (StoreUrl::parse(raw), expect) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{raw}"),
                (Err(e), Err(part)) => {
                    assert!(e.to_string().contains(part), "{raw}: {e}");
                    assert!(!e.to_string().contains("pw"), "{raw} leaks: {e}");
                }
                (got, want) => panic!("{raw}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn never_shows_a_password() {
        let cases = [
            ("sqlite://idem.db", "sqlite://idem.db"),
            (
                "postgres://app:s3cret@db:5432/payments",
                "postgres://app:***@db:5432/payments",
            ),
            (
                "postgresql://app@db/payments?password=s3cret",
                "postgresql://app@db/payments?password=***",
            ),
        ];
        for (raw, shown) in cases {
            let Ok(url) = StoreUrl::parse(raw) else {
                panic!("{raw} parses");
            };
            assert_eq!(url.to_string(), shown, "{raw}");
            assert!(!format!("{url:?}").contains("s3cret"), "{url:?}");
        }
    }

    #[test]
    fn refuses_a_bad_postgres_url_when_opening() {
        let Ok(url) = StoreUrl::parse("postgres://app:s3cret@db:notaport/payments") else {
            panic!("the scheme is postgres");
        };
        let Err(e) = url.open() else {
            panic!("a bad URL must not open");
        };
        let text = format!("{e:#}");
        assert!(text.contains("invalid PostgreSQL URL"), "{text}");
        assert!(!text.contains("s3cret"), "{text}");
    }
}
