//! Opening the store a checked [`StoreUrl`] names, creating it or only if
//! it exists, and what a start checks of it first (which `--check` runs
//! too), for `idem serve`, `idem consume` and the commands that read
//! records alike.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use idem_core::{Store, StoreError};

use super::{STORE_DEFAULT, StoreUrl};

/// What a start found of a store before opening it, for `--check` to say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checked {
    /// An SQLite file, as `SqliteStore::check` found it.
    #[cfg(feature = "sqlite")]
    Sqlite(idem_sqlite::Found),
    /// A PostgreSQL server: only connecting tells more.
    Postgres,
    /// A DynamoDB table: only asking AWS tells more.
    Dynamodb,
}

/// Why a store cannot be opened. Each variant's text is its own line of
/// the error; the cause it wraps follows it (`source`), as `a: b`.
#[derive(Debug)]
#[non_exhaustive]
pub enum OpenError {
    /// The store answered with an error, said as it is.
    Store(StoreError),
    /// Opening the store at `store` failed.
    Open {
        /// The store's URL, password masked.
        store: String,
        /// Why.
        source: StoreError,
    },
    /// An existing store was asked for where none may be created, and
    /// none was there to serve from.
    NotCreated {
        /// The store's URL, password masked.
        store: String,
    },
    /// Routes in `synchronous` mode on a store that is not replicated.
    NotReplicated {
        /// The routes, comma-separated.
        routes: String,
        /// The store's URL.
        store: String,
    },
    /// Routes in `synchronous` mode, and the store refused by what they
    /// need of it.
    SynchronousRefused {
        /// The routes, comma-separated.
        routes: String,
        /// The store's URL, password masked.
        store: String,
        /// Why.
        source: Box<OpenError>,
    },
    /// A PostgreSQL server whose commits do not wait for a synchronous
    /// standby.
    #[cfg(feature = "postgres")]
    Replication(idem_postgres::replication::ReplicationError),
    /// Which server a PostgreSQL store is on could not be read.
    Promotion(StoreError),
    /// A DynamoDB table that is not a multi-Region strongly consistent
    /// global table, for a route in synchronous mode.
    NotStrong {
        /// The table.
        table: String,
        /// Its `MultiRegionConsistency`, if it is a global table.
        consistency: Option<String>,
    },
    /// No runtime could be started to reach the store.
    Runtime {
        /// What for: `reach DynamoDB`, `connect to PostgreSQL`.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The thread that connected panicked.
    Panicked {
        /// The store's URL, password masked.
        store: String,
    },
    /// No store where one was to be read: a store in the wrong directory
    /// must not read as a store with nothing in it.
    NoStore {
        /// The store's URL, and for a relative SQLite path its absolute one.
        place: String,
        /// Where the URL came from, in words.
        named: String,
    },
    /// A store this build was made without.
    NotBuilt {
        /// The store's URL, password masked.
        store: String,
    },
}

/// Opening what a [`StoreUrl`] names.
pub trait OpenStore {
    /// Refuses routes in `synchronous` mode (`synchronous` names them) on
    /// SQLite: one file on one machine is not replicated. A PostgreSQL
    /// server's replication is checked when [`OpenStore::open_serving`]
    /// connects.
    fn check_replicated(&self, synchronous: &[String]) -> Result<(), OpenError>;
    /// What a start checks of the store before it opens it, short of
    /// reaching a server: an SQLite file as `SqliteStore::check` judges
    /// it, creating and writing nothing. `idem serve` and `idem consume`
    /// run it before they open the store, with `--check` or without.
    fn check_local(&self) -> Result<Checked, OpenError>;
    /// Opens the store for `idem serve` or `idem consume`, creating an
    /// empty one if there is none. With routes in `synchronous` mode:
    /// refused on SQLite ([`OpenStore::check_replicated`]); on PostgreSQL
    /// the replication settings are checked now and on every new
    /// connection (`idem_postgres::replication`). On PostgreSQL, every new
    /// connection also checks that the server is the one last written on,
    /// and opens the suspect window for `suspect_window_ms` when it is not
    /// (`0`: not checked).
    fn open_serving(
        &self,
        synchronous: &[String],
        suspect_window_ms: u64,
    ) -> Result<Arc<dyn Store>, OpenError>;
    /// Opens the store, creating an empty one if there is none.
    fn open(&self) -> Result<Arc<dyn Store>, OpenError>;
    /// Opens an existing store for inspection, or `None` if there is none
    /// yet (inspecting must not create a database or a schema as a side
    /// effect).
    fn open_existing(&self) -> Result<Option<Arc<dyn Store>>, OpenError>;
}

impl OpenStore for StoreUrl {
    fn check_replicated(&self, synchronous: &[String]) -> Result<(), OpenError> {
        match self {
            StoreUrl::Sqlite(_) if !synchronous.is_empty() => Err(OpenError::NotReplicated {
                routes: synchronous.join(", "),
                store: self.to_string(),
            }),
            _ => Ok(()),
        }
    }

    fn check_local(&self) -> Result<Checked, OpenError> {
        match self {
            #[cfg(feature = "sqlite")]
            StoreUrl::Sqlite(path) => Ok(Checked::Sqlite(
                idem_sqlite::SqliteStore::check(path).map_err(OpenError::Store)?,
            )),
            StoreUrl::Postgres(_) => Ok(Checked::Postgres),
            #[cfg(feature = "dynamodb")]
            StoreUrl::Dynamodb(_) => Ok(Checked::Dynamodb),
            #[allow(unreachable_patterns)]
            _ => Err(self.not_built()),
        }
    }

    fn open_serving(
        &self,
        synchronous: &[String],
        suspect_window_ms: u64,
    ) -> Result<Arc<dyn Store>, OpenError> {
        self.check_replicated(synchronous)?;
        #[cfg_attr(
            not(any(feature = "postgres", feature = "dynamodb")),
            allow(unused_variables)
        )]
        let serving = Serving {
            synchronous: !synchronous.is_empty(),
            suspect_window_ms,
        };
        match self {
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(url) => match postgres::connect(url, true, serving) {
                Ok(Some(store)) => Ok(Arc::new(store)),
                Ok(None) => Err(OpenError::NotCreated {
                    store: self.to_string(),
                }),
                Err(e) if serving.synchronous => Err(OpenError::SynchronousRefused {
                    routes: synchronous.join(", "),
                    store: self.to_string(),
                    source: Box::new(e),
                }),
                Err(e) => Err(e),
            },
            #[cfg(feature = "dynamodb")]
            StoreUrl::Dynamodb(url) => {
                let store = dynamodb::on_runtime(dynamodb::open(url, serving))?;
                Ok(Arc::new(store))
            }
            _ => self.open(),
        }
    }

    fn open(&self) -> Result<Arc<dyn Store>, OpenError> {
        match self {
            #[cfg(feature = "sqlite")]
            StoreUrl::Sqlite(path) => {
                let store =
                    idem_sqlite::SqliteStore::open(path, idem_sqlite::SqliteOptions::default())
                        .map_err(|source| self.open_failed(source))?;
                Ok(Arc::new(store))
            }
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(url) => match postgres::connect(url, true, Serving::default())? {
                Some(store) => Ok(Arc::new(store)),
                None => Err(OpenError::NotCreated {
                    store: self.to_string(),
                }),
            },
            #[cfg(feature = "dynamodb")]
            StoreUrl::Dynamodb(url) => {
                let store = dynamodb::on_runtime(dynamodb::open(url, Serving::default()))?;
                Ok(Arc::new(store))
            }
            #[allow(unreachable_patterns)]
            _ => Err(self.not_built()),
        }
    }

    fn open_existing(&self) -> Result<Option<Arc<dyn Store>>, OpenError> {
        match self {
            #[cfg(feature = "sqlite")]
            StoreUrl::Sqlite(path) => {
                if !path.exists() {
                    return Ok(None);
                }
                let options = idem_sqlite::SqliteOptions {
                    create: false,
                    ..idem_sqlite::SqliteOptions::default()
                };
                let store = idem_sqlite::SqliteStore::open(path, options)
                    .map_err(|source| self.open_failed(source))?;
                Ok(Some(Arc::new(store)))
            }
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(url) => {
                let store = postgres::connect(url, false, Serving::default())?;
                Ok(store.map(|s| Arc::new(s) as Arc<dyn Store>))
            }
            #[cfg(feature = "dynamodb")]
            StoreUrl::Dynamodb(url) => {
                match dynamodb::on_runtime(dynamodb::open(url, Serving::default())) {
                    Ok(store) => Ok(Some(Arc::new(store))),
                    Err(e) if e.is_missing_table() => Ok(None),
                    Err(e) => Err(e),
                }
            }
            #[allow(unreachable_patterns)]
            _ => Err(self.not_built()),
        }
    }
}

impl StoreUrl {
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    fn open_failed(&self, source: StoreError) -> OpenError {
        OpenError::Open {
            store: self.to_string(),
            source,
        }
    }

    #[allow(dead_code)]
    fn not_built(&self) -> OpenError {
        OpenError::NotBuilt {
            store: self.to_string(),
        }
    }
}

impl StoreUrl {
    /// The error for a store that is not at this URL, which `--store`
    /// (`flag`), a config file or the default named: the path it looked
    /// at, absolute, where that came from, and the arguments that name
    /// another.
    pub fn no_store(&self, flag: Option<&str>, config: Option<&Path>) -> OpenError {
        let default = StoreUrl::parse(STORE_DEFAULT).is_ok_and(|default| default == *self);
        let named = match (flag, config) {
            (Some(_), _) => "which --store names".to_owned(),
            (None, Some(file)) if default => format!(
                "the default, in the working directory ({} names no other)",
                file.display()
            ),
            (None, Some(file)) => format!("which {} names", file.display()),
            (None, None) => "the default, in the working directory".to_owned(),
        };
        let place = match self {
            StoreUrl::Sqlite(path) if path.is_relative() => std::path::absolute(path)
                .map(|absolute| format!("{self} ({})", absolute.display()))
                .unwrap_or_else(|_| self.to_string()),
            _ => self.to_string(),
        };
        OpenError::NoStore { place, named }
    }

    /// Logs which store is open: for SQLite the file's absolute path, so
    /// that a process started in another directory than expected says
    /// which file it uses before it uses it.
    pub fn log_opened(&self) {
        match self {
            StoreUrl::Sqlite(path) => {
                let file = std::path::absolute(path).unwrap_or_else(|_| path.clone());
                tracing::info!(file = %file.display(), "store open: SQLite");
            }
            StoreUrl::Postgres(_) => tracing::info!(url = %self, "store open: PostgreSQL"),
            #[cfg(feature = "dynamodb")]
            StoreUrl::Dynamodb(_) => tracing::info!(url = %self, "store open: DynamoDB"),
        }
    }
}

impl Checked {
    /// What `--check` leaves unchecked of the store, in one line, if
    /// anything: a server is not reached.
    pub fn unchecked(self) -> Option<&'static str> {
        match self {
            Checked::Postgres => Some(
                "the PostgreSQL server (a start connects, creates or upgrades the \
                 schema, and checks the server: its replication for synchronous routes, a \
                 promotion; a server refusing the promotion check's functions or LISTEN is \
                 served without them, said in the log and /readyz)",
            ),
            Checked::Dynamodb => Some(
                "the DynamoDB table (a start checks that it exists with idem's layout, \
                 and for synchronous routes that it is a multi-Region strongly consistent global \
                 table)",
            ),
            #[cfg(feature = "sqlite")]
            Checked::Sqlite(_) => None,
        }
    }
}

impl OpenError {
    /// The store's own error, where the failure is one.
    pub fn store_error(&self) -> Option<&StoreError> {
        match self {
            OpenError::Store(e) | OpenError::Open { source: e, .. } | OpenError::Promotion(e) => {
                Some(e)
            }
            OpenError::SynchronousRefused { source, .. } => source.store_error(),
            _ => None,
        }
    }

    /// Whether opening failed because the table does not exist.
    #[cfg(feature = "dynamodb")]
    fn is_missing_table(&self) -> bool {
        matches!(self.store_error(), Some(StoreError::Incompatible { reason, .. }) if reason.contains("does not exist"))
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Store(e) => e.fmt(f),
            OpenError::Open { store, .. } => write!(f, "cannot open store {store}"),
            OpenError::NotCreated { store } => write!(f, "store {store} was not created"),
            OpenError::NotReplicated { routes, store } => write!(
                f,
                "route {routes} has regions = {{ mode = \"synchronous\" }}, but the store {store} \
                 is one SQLite file on one machine, not replicated: use a PostgreSQL primary \
                 with a synchronous standby, or another mode"
            ),
            OpenError::SynchronousRefused { routes, store, .. } => write!(
                f,
                "route {routes} has regions = {{ mode = \"synchronous\" }}, and the store \
                 {store} is refused"
            ),
            #[cfg(feature = "postgres")]
            OpenError::Replication(e) => e.fmt(f),
            OpenError::Promotion(_) => f.write_str(
                "cannot read which server the store is on (its timeline and system \
                 identifier), which every new connection checks to notice a promotion \
                 (a server that refuses the functions it takes is served without the \
                 check, said in the log and /readyz; this failed otherwise)",
            ),
            OpenError::NotStrong { table, consistency } => write!(
                f,
                "table {table} is {}: a route in synchronous mode needs a global table whose \
                 MultiRegionConsistency is STRONG (MRSC), where a write is acknowledged only \
                 once another Region has it",
                match consistency {
                    Some(c) => format!("a global table with MultiRegionConsistency {c}"),
                    None => "not a multi-Region strongly consistent global table".to_owned(),
                }
            ),
            OpenError::Runtime { what, .. } => write!(f, "cannot start a runtime to {what}"),
            OpenError::Panicked { store } => write!(f, "connecting to {store} panicked"),
            OpenError::NoStore { place, named } => write!(
                f,
                "there is no store at {place}, {named}; nothing was ever claimed there: \
                 name the gateway's store with --config FILE (its config file) or --store URL"
            ),
            OpenError::NotBuilt { store } => {
                write!(
                    f,
                    "this build of idem cannot open {store}: its store is not built in"
                )
            }
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Said as it is: its causes are its own.
            OpenError::Store(e) => e.source(),
            #[cfg(feature = "postgres")]
            OpenError::Replication(e) => e.source(),
            OpenError::Open { source, .. } | OpenError::Promotion(source) => Some(source),
            OpenError::SynchronousRefused { source, .. } => Some(source.as_ref()),
            OpenError::Runtime { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl fmt::Display for Checked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        #[cfg(feature = "sqlite")]
        use idem_sqlite::{Found, SCHEMA_VERSION};
        match self {
            #[cfg(feature = "sqlite")]
            Checked::Sqlite(Found::Nothing) => f.write_str("no file yet: a start creates it"),
            #[cfg(feature = "sqlite")]
            Checked::Sqlite(Found::Empty) => {
                f.write_str("an empty database: a start makes it an idem store")
            }
            #[cfg(feature = "sqlite")]
            Checked::Sqlite(Found::Store(version)) if *version < SCHEMA_VERSION => write!(
                f,
                "an idem store, schema version {version}: a start upgrades it to {SCHEMA_VERSION}"
            ),
            #[cfg(feature = "sqlite")]
            Checked::Sqlite(Found::Store(version)) => {
                write!(f, "an idem store, schema version {version}")
            }
            #[cfg(feature = "sqlite")]
            Checked::Sqlite(_) => f.write_str("an SQLite file"),
            Checked::Postgres => f.write_str("PostgreSQL: not connected to"),
            Checked::Dynamodb => f.write_str("DynamoDB: not reached"),
        }
    }
}

/// What a serving process asks of a store beyond opening it.
#[derive(Clone, Copy, Debug, Default)]
#[cfg_attr(not(any(feature = "postgres", feature = "dynamodb")), allow(dead_code))]
struct Serving {
    /// Check that commits wait for another copy: on PostgreSQL a
    /// synchronous standby (on every connection), on DynamoDB a
    /// multi-Region strongly consistent table.
    synchronous: bool,
    /// Open the suspect window this long on a changed server; 0: do not check.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    suspect_window_ms: u64,
}

#[cfg(feature = "postgres")]
mod postgres {
    //! Connecting to PostgreSQL from synchronous code.

    use idem_core::redact_url;
    use idem_postgres::{PgOptions, PgStore};

    use super::{OpenError, Serving};

    /// Connects (and creates or migrates the schema) on a thread and
    /// runtime of its own, so that this synchronous call works inside or
    /// outside the caller's runtime; the pool opens its connections later,
    /// on the runtime of the operations that use them.
    pub(super) fn connect(
        url: &str,
        create: bool,
        serving: Serving,
    ) -> Result<Option<PgStore>, OpenError> {
        let connect = || -> Result<Option<PgStore>, OpenError> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|source| OpenError::Runtime {
                    what: "connect to PostgreSQL",
                    source,
                })?;
            runtime.block_on(connect_on(url, create, serving))
        };
        std::thread::scope(|s| s.spawn(connect).join()).map_err(|_| OpenError::Panicked {
            store: redact_url(url),
        })?
    }

    async fn connect_on(
        url: &str,
        create: bool,
        serving: Serving,
    ) -> Result<Option<PgStore>, OpenError> {
        let options = PgOptions::default();
        let store = if create {
            PgStore::connect(url, options).await.map(Some)
        } else {
            PgStore::connect_existing(url, options).await
        }
        .map_err(OpenError::Store)?;
        let Some(store) = store else {
            return Ok(None);
        };
        if serving.synchronous {
            let settings = store
                .require_synchronous_replication()
                .await
                .map_err(OpenError::Replication)?;
            tracing::info!(
                synchronous_commit = %settings.synchronous_commit,
                synchronous_standby_names = %settings.synchronous_standby_names,
                "the store is synchronously replicated"
            );
        }
        if serving.suspect_window_ms > 0 {
            // A window this finds is logged by the process, which reads
            // the store's window when it starts.
            store
                .open_window_on_promotion(serving.suspect_window_ms)
                .await
                .map_err(OpenError::Promotion)?;
        }
        Ok(Some(store))
    }
}

#[cfg(feature = "dynamodb")]
mod dynamodb {
    //! Opening a DynamoDB table from synchronous code.

    use std::sync::Arc;

    use super::{OpenError, Serving};

    /// Runs `future` to its end from synchronous code: on the caller's
    /// multi-threaded runtime when there is one (so the store's client
    /// lives on the runtime that will use it), else on a runtime of its own.
    pub(super) fn on_runtime<T>(
        future: impl std::future::Future<Output = Result<T, OpenError>>,
    ) -> Result<T, OpenError> {
        match tokio::runtime::Handle::try_current() {
            Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| handle.block_on(future))
            }
            _ => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|source| OpenError::Runtime {
                    what: "reach DynamoDB",
                    source,
                })?
                .block_on(future),
        }
    }

    /// Opens the DynamoDB store `url` names, on the table `idem store init`
    /// made; with routes in `synchronous` mode, only on a multi-Region
    /// strongly consistent global table.
    pub(super) async fn open(
        url: &idem_dynamodb::DynamoUrl,
        serving: Serving,
    ) -> Result<idem_dynamodb::DynamoStore, OpenError> {
        let client = idem_dynamodb::connect(url).await;
        if serving.synchronous {
            let table = idem_dynamodb::describe(&client, url)
                .await
                .map_err(OpenError::Store)?;
            if table.multi_region_consistency.as_deref() != Some("STRONG") {
                return Err(OpenError::NotStrong {
                    table: url.table.clone(),
                    consistency: table.multi_region_consistency,
                });
            }
        }
        idem_dynamodb::DynamoStore::with_client(client, url, Arc::new(idem_core::SystemClock))
            .await
            .map_err(|source| OpenError::Open {
                store: url.to_string(),
                source,
            })
    }
}
