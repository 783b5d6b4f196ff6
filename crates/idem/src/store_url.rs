//! Opening a store named by a checked [`StoreUrl`] (parsed with the rest
//! of a configuration, or from `--store`), creating it or only if it
//! exists, and what a start checks of it first, which `--check` runs too.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use idem_core::{Store, StoreError};
use idem_gateway::{GatewayConfig, Overrides};
pub use idem_gateway::{STORE_DEFAULT, StoreUrl};
use idem_postgres::{PgOptions, PgStore, redact_url};
use idem_sqlite::{Found, SCHEMA_VERSION, SqliteOptions, SqliteStore};

/// Which store a command that reads or changes records opens: `--store
/// URL`, or the `store` of the gateway's config file (`--config FILE`), as
/// `idem serve --config FILE` reads it, never both.
#[derive(Debug, clap::Args)]
pub struct StoreArgs {
    /// The store, as a URL [default: sqlite://idem.db]: sqlite://PATH,
    /// postgres://USER@HOST/DB or dynamodb://TABLE?region=REGION. A relative
    /// sqlite://PATH here, and the default, are read against the working
    /// directory.
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// The gateway's config file: open the store it names (a relative
    /// sqlite://PATH there is read against the file's directory), the one
    /// `idem serve --config FILE` serves from.
    #[arg(long, value_name = "FILE", conflicts_with = "store")]
    config: Option<PathBuf>,
}

impl StoreArgs {
    /// The store's URL, checked: `--store`'s, the config file's, or the
    /// default.
    pub fn url(&self) -> anyhow::Result<StoreUrl> {
        match (&self.store, &self.config) {
            (Some(raw), _) => from_flag(raw),
            (None, Some(file)) => {
                // Loaded as `idem reconcile` loads it: the store's URL is
                // the one `idem serve` would open.
                let config = GatewayConfig::load_offline(file, &Overrides::default())?;
                Ok(config.store)
            }
            (None, None) => from_flag(STORE_DEFAULT),
        }
    }

    /// Opens the store for reading and changing records; one that is not
    /// there is an error ([`StoreArgs::no_store`]), and is never created.
    pub fn open_existing(&self) -> anyhow::Result<(StoreUrl, Arc<dyn Store>)> {
        let url = self.url()?;
        match url.open_existing()? {
            Some(store) => Ok((url, store)),
            None => Err(self.no_store(&url)),
        }
    }

    /// The field the URL came from, for errors: `--store`, or the config
    /// file's `store`.
    pub fn field(&self) -> String {
        field(self.store.as_deref(), self.config.as_deref())
    }

    /// The error for a store that is not at `url` ([`no_store`]).
    pub fn no_store(&self, url: &StoreUrl) -> anyhow::Error {
        no_store(url, self.store.as_deref(), self.config.as_deref())
    }
}

/// The error for a store that is not at `url`, which `--store` (`flag`),
/// a config file or the default named: the path it looked at, absolute,
/// where that came from, and the arguments that name another. A store in
/// the wrong directory must not read as a store with nothing in it.
pub fn no_store(url: &StoreUrl, flag: Option<&str>, config: Option<&Path>) -> anyhow::Error {
    let default = StoreUrl::parse(STORE_DEFAULT).is_ok_and(|default| default == *url);
    let named = match (flag, config) {
        (Some(_), _) => "which --store names".to_owned(),
        (None, Some(file)) if default => format!(
            "the default, in the working directory ({} names no other)",
            file.display()
        ),
        (None, Some(file)) => format!("which {} names", file.display()),
        (None, None) => "the default, in the working directory".to_owned(),
    };
    let place = match url {
        StoreUrl::Sqlite(path) if path.is_relative() => std::path::absolute(path)
            .map(|absolute| format!("{url} ({})", absolute.display()))
            .unwrap_or_else(|_| url.to_string()),
        _ => url.to_string(),
    };
    anyhow::anyhow!(
        "there is no store at {place}, {named}; nothing was ever claimed there: \
         name the gateway's store with --config FILE (its config file) or --store URL"
    )
}

/// `--store URL`, checked; the error names the flag.
pub fn from_flag(raw: &str) -> anyhow::Result<StoreUrl> {
    StoreUrl::parse(raw).map_err(|e| anyhow::anyhow!("--store: {e}"))
}

/// The field a store URL came from, as a config error names it: `--store`
/// when the flag gave it, else the config file's `store` (or the default
/// the file leaves in place).
pub fn field(flag: Option<&str>, config: Option<&Path>) -> String {
    match (flag, config) {
        (None, Some(file)) => format!("{}: store", file.display()),
        _ => "--store".to_owned(),
    }
}

/// The line `--check` prints for what it left unchecked of the store: a
/// PostgreSQL server is not reached.
pub fn print_unchecked(checked: Checked) {
    match checked {
        Checked::Postgres => println!(
            "  connect    the PostgreSQL server (a start connects, creates or upgrades the \
             schema, and checks the server: its replication for synchronous routes, a promotion; \
             a server refusing the promotion check's functions or LISTEN is served without them, \
             said in the log and /readyz)"
        ),
        Checked::Dynamodb => println!(
            "  connect    the DynamoDB table (a start checks that it exists with idem's layout, \
             and for synchronous routes that it is a multi-Region strongly consistent global \
             table)"
        ),
        Checked::Sqlite(_) => {}
    }
}

/// Logs which store is open: for SQLite the file's absolute path, so that
/// a process started in another directory than expected says which file
/// it uses before it uses it.
pub fn log_opened(url: &StoreUrl) {
    match url {
        StoreUrl::Sqlite(path) => {
            let file = std::path::absolute(path).unwrap_or_else(|_| path.clone());
            tracing::info!(file = %file.display(), "store open: SQLite");
        }
        StoreUrl::Postgres(_) => tracing::info!(url = %url, "store open: PostgreSQL"),
        StoreUrl::Dynamodb(_) => tracing::info!(url = %url, "store open: DynamoDB"),
    }
}

/// What a start found of a store before opening it, for `--check` to say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checked {
    /// An SQLite file, as [`SqliteStore::check`] found it.
    Sqlite(Found),
    /// A PostgreSQL server: only connecting tells more.
    Postgres,
    /// A DynamoDB table: only asking AWS tells more.
    Dynamodb,
}

/// Opening what a [`StoreUrl`] names.
pub trait OpenStore {
    /// Refuses routes in `synchronous` mode (`synchronous` names them) on
    /// SQLite: one file on one machine is not replicated. A PostgreSQL
    /// server's replication is checked when [`OpenStore::open_serving`]
    /// connects.
    fn check_replicated(&self, synchronous: &[String]) -> anyhow::Result<()>;
    /// What a start checks of the store before it opens it, short of
    /// reaching a server: an SQLite file as [`SqliteStore::check`] judges
    /// it, creating and writing nothing. `idem serve` and `idem consume`
    /// run it before they open the store, with `--check` or without.
    fn check_local(&self) -> anyhow::Result<Checked>;
    /// Opens the store for `idem serve`, creating an empty one if there is
    /// none. With routes in `synchronous` mode: refused on SQLite
    /// ([`OpenStore::check_replicated`]); on PostgreSQL the replication
    /// settings are checked now and on every new connection
    /// ([`idem_postgres::replication`]). On PostgreSQL, every new
    /// connection also checks that the server is the one last written on,
    /// and opens the suspect window for `suspect_window_ms` when it is not
    /// (`0`: not checked).
    fn open_serving(
        &self,
        synchronous: &[String],
        suspect_window_ms: u64,
    ) -> anyhow::Result<Arc<dyn Store>>;
    /// Opens the store, creating an empty one if there is none.
    fn open(&self) -> anyhow::Result<Arc<dyn Store>>;
    /// Opens an existing store for inspection, or `None` if there is none
    /// yet (inspecting must not create a database or a schema as a side
    /// effect).
    fn open_existing(&self) -> anyhow::Result<Option<Arc<dyn Store>>>;
}

impl OpenStore for StoreUrl {
    fn check_replicated(&self, synchronous: &[String]) -> anyhow::Result<()> {
        match self {
            StoreUrl::Sqlite(_) if !synchronous.is_empty() => bail!(
                "route {} has regions = {{ mode = \"synchronous\" }}, but the store {self} \
                 is one SQLite file on one machine, not replicated: use a PostgreSQL primary \
                 with a synchronous standby, or another mode",
                synchronous.join(", ")
            ),
            StoreUrl::Sqlite(_) | StoreUrl::Postgres(_) | StoreUrl::Dynamodb(_) => Ok(()),
        }
    }

    fn check_local(&self) -> anyhow::Result<Checked> {
        match self {
            StoreUrl::Sqlite(path) => Ok(Checked::Sqlite(SqliteStore::check(path)?)),
            StoreUrl::Postgres(_) => Ok(Checked::Postgres),
            StoreUrl::Dynamodb(_) => Ok(Checked::Dynamodb),
        }
    }

    fn open_serving(
        &self,
        synchronous: &[String],
        suspect_window_ms: u64,
    ) -> anyhow::Result<Arc<dyn Store>> {
        self.check_replicated(synchronous)?;
        let names = synchronous.join(", ");
        let serving = Serving {
            synchronous: !synchronous.is_empty(),
            suspect_window_ms,
        };
        match self {
            StoreUrl::Sqlite(_) => self.open(),
            StoreUrl::Postgres(url) => match connect_postgres(url, true, serving) {
                Ok(Some(store)) => Ok(Arc::new(store)),
                Ok(None) => bail!("store {self} was not created"),
                Err(e) if serving.synchronous => Err(e.context(format!(
                    "route {names} has regions = {{ mode = \"synchronous\" }}, and the store \
                     {self} is refused"
                ))),
                Err(e) => Err(e),
            },
            StoreUrl::Dynamodb(url) => {
                let store = on_runtime(open_dynamodb(url, serving))?;
                Ok(Arc::new(store))
            }
        }
    }

    fn open(&self) -> anyhow::Result<Arc<dyn Store>> {
        match self {
            StoreUrl::Sqlite(path) => {
                let store = SqliteStore::open(path, SqliteOptions::default())
                    .with_context(|| format!("cannot open store {self}"))?;
                Ok(Arc::new(store))
            }
            StoreUrl::Postgres(url) => match connect_postgres(url, true, Serving::default())? {
                Some(store) => Ok(Arc::new(store)),
                None => bail!("store {self} was not created"),
            },
            StoreUrl::Dynamodb(url) => {
                let store = on_runtime(open_dynamodb(url, Serving::default()))?;
                Ok(Arc::new(store))
            }
        }
    }

    fn open_existing(&self) -> anyhow::Result<Option<Arc<dyn Store>>> {
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
                let store = connect_postgres(url, false, Serving::default())?;
                Ok(store.map(|s| Arc::new(s) as Arc<dyn Store>))
            }
            StoreUrl::Dynamodb(url) => match on_runtime(open_dynamodb(url, Serving::default())) {
                Ok(store) => Ok(Some(Arc::new(store))),
                Err(e) if is_missing_table(&e) => Ok(None),
                Err(e) => Err(e),
            },
        }
    }
}

/// Runs `future` to its end from synchronous code: on the caller's
/// multi-threaded runtime when there is one (so the store's client lives
/// on the runtime that will use it), else on a runtime of its own.
fn on_runtime<T>(
    future: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| handle.block_on(future))
        }
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start a runtime to reach DynamoDB")?
            .block_on(future),
    }
}

/// Opens the DynamoDB store `url` names, on the table `idem store init`
/// made; with routes in `synchronous` mode, only on a multi-Region
/// strongly consistent global table.
async fn open_dynamodb(
    url: &idem_dynamodb::DynamoUrl,
    serving: Serving,
) -> anyhow::Result<idem_dynamodb::DynamoStore> {
    let client = idem_dynamodb::connect(url).await;
    if serving.synchronous {
        let table = idem_dynamodb::describe(&client, url).await?;
        if table.multi_region_consistency.as_deref() != Some("STRONG") {
            bail!(
                "table {} is {}: a route in synchronous mode needs a global table whose \
                 MultiRegionConsistency is STRONG (MRSC), where a write is acknowledged only \
                 once another Region has it",
                url.table,
                match &table.multi_region_consistency {
                    Some(c) => format!("a global table with MultiRegionConsistency {c}"),
                    None => "not a multi-Region strongly consistent global table".to_owned(),
                }
            );
        }
    }
    let store =
        idem_dynamodb::DynamoStore::with_client(client, url, Arc::new(idem_core::SystemClock))
            .await
            .with_context(|| format!("cannot open store {url}"))?;
    Ok(store)
}

/// Whether opening failed because the table does not exist.
fn is_missing_table(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<StoreError>()
            .is_some_and(|e| matches!(e, StoreError::Incompatible { reason, .. } if reason.contains("does not exist")))
    })
}

impl fmt::Display for Checked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Checked::Sqlite(Found::Nothing) => f.write_str("no file yet: a start creates it"),
            Checked::Sqlite(Found::Empty) => {
                f.write_str("an empty database: a start makes it an idem store")
            }
            Checked::Sqlite(Found::Store(version)) if *version < SCHEMA_VERSION => write!(
                f,
                "an idem store, schema version {version}: a start upgrades it to {SCHEMA_VERSION}"
            ),
            Checked::Sqlite(Found::Store(version)) => {
                write!(f, "an idem store, schema version {version}")
            }
            Checked::Sqlite(_) => f.write_str("an SQLite file"),
            Checked::Postgres => f.write_str("PostgreSQL: not connected to"),
            Checked::Dynamodb => f.write_str("DynamoDB: not reached"),
        }
    }
}

/// What a serving gateway asks of a PostgreSQL store beyond opening it.
#[derive(Clone, Copy, Debug, Default)]
struct Serving {
    /// Check on every connection that commits wait for a synchronous standby.
    synchronous: bool,
    /// Open the suspect window this long on a changed server; 0: do not check.
    suspect_window_ms: u64,
}

/// Connects (and creates or migrates the schema) on a thread and runtime of
/// its own, so that this synchronous call works inside or outside the
/// caller's runtime; the pool opens its connections later, on the runtime
/// of the operations that use them.
fn connect_postgres(url: &str, create: bool, serving: Serving) -> anyhow::Result<Option<PgStore>> {
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
            if serving.synchronous
                && let Ok(Some(store)) = &store
            {
                let settings = store.require_synchronous_replication().await?;
                tracing::info!(
                    synchronous_commit = %settings.synchronous_commit,
                    synchronous_standby_names = %settings.synchronous_standby_names,
                    "the store is synchronously replicated"
                );
            }
            if serving.suspect_window_ms > 0
                && let Ok(Some(store)) = &store
            {
                // A window this finds is logged by the gateway, which reads
                // the store's window when it starts.
                store
                    .open_window_on_promotion(serving.suspect_window_ms)
                    .await
                    .context(
                        "cannot read which server the store is on (its timeline and system \
                         identifier), which every new connection checks to notice a promotion \
                         (a server that refuses the functions it takes is served without the \
                         check, said in the log and /readyz; this failed otherwise)",
                    )?;
            }
            Ok::<_, anyhow::Error>(store)
        })
    };
    let connected = std::thread::scope(|s| s.spawn(connect).join())
        .map_err(|_| anyhow::anyhow!("connecting to {} panicked", redact_url(url)))??;
    Ok(connected?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_is_named_and_no_password_shown() {
        let cases = [
            (
                "mysql://app:s3cret@h/db",
                "--store: \"mysql://app:***@h/db\" has scheme",
            ),
            (
                "postgres://app:s3cret@h/db?bogus=1",
                "--store: invalid PostgreSQL URL postgres://app:***@h/db?bogus=1",
            ),
            (
                "sqlite:idem.db",
                "--store: the URL lacks the // after \"sqlite:\"; write sqlite://idem.db",
            ),
        ];
        for (raw, expect) in cases {
            let Err(e) = from_flag(raw) else {
                panic!("{raw} is refused");
            };
            let text = e.to_string();
            assert!(text.starts_with(expect), "{raw}: {text}");
            assert!(!text.contains("s3cret"), "{text}");
        }
        assert!(from_flag(STORE_DEFAULT).is_ok());
    }
}
