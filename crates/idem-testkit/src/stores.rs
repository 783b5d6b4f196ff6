//! The real stores a property case runs through, each opened fresh and
//! removed after the case: SQLite in a temporary directory, PostgreSQL
//! (127.0.0.1:5432, or `IDEM_TEST_POSTGRES_URL`) in a schema of its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_core::{Clock, Store, SystemClock};
use idem_postgres::{PgOptions, PgStore};
use idem_sqlite::{SqliteOptions, SqliteStore};

/// Which real store a case runs through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// A new SQLite file.
    Sqlite,
    /// A new schema on the local PostgreSQL server.
    Postgres,
}

/// A store opened for one case; dropping it removes its file or schema.
pub struct TestStore {
    /// The store.
    pub store: Arc<dyn Store>,
    _cleanup: Cleanup,
}

/// Opens a fresh store of `backend`; `tag` names its PostgreSQL schema.
/// Panics when the store cannot be opened: it is test set-up.
pub async fn open(backend: Backend, tag: &str) -> TestStore {
    open_with_clock(backend, tag, None).await
}

/// [`open`], the store judging time by `clock`; by its own if `None` (the
/// system's for SQLite, the database server's for PostgreSQL).
#[allow(clippy::unwrap_used, reason = "test set-up fails by panicking")]
pub async fn open_with_clock(
    backend: Backend,
    tag: &str,
    clock: Option<Arc<dyn Clock>>,
) -> TestStore {
    let (store, cleanup): (Arc<dyn Store>, Cleanup) = match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            let store = SqliteStore::open_with_clock(
                dir.path().join("idem.db"),
                SqliteOptions::default(),
                clock.unwrap_or_else(|| Arc::new(SystemClock)),
            )
            .unwrap();
            (Arc::new(store), Cleanup::Dir(dir))
        }
        Backend::Postgres => {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let schema = format!("idem_{tag}_{}_{n}", std::process::id());
            let options = PgOptions {
                schema: schema.clone(),
                clock,
                ..PgOptions::default()
            };
            let store = match PgStore::connect(&pg_url(), options).await {
                Ok(store) => store,
                Err(e) => panic!("cannot connect to {}: {e}", pg_url()),
            };
            (Arc::new(store), Cleanup::Schema(schema))
        }
    };
    TestStore {
        store,
        _cleanup: cleanup,
    }
}

/// The PostgreSQL server the tests use ([`crate::services::postgres_url`]).
/// Fails the test with one line when the server does not answer.
pub fn pg_url() -> String {
    crate::services::postgres_url()
}

/// What to remove after a case: a temp dir, or a schema of its own.
enum Cleanup {
    Dir(#[allow(dead_code, reason = "held to delete it on drop")] tempfile::TempDir),
    Schema(String),
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Cleanup::Schema(schema) = self else {
            return;
        };
        let sql = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
        // A runtime of its own on a thread of its own: the guard drops
        // inside the test's runtime. A schema left behind is only litter.
        let dropped = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                let Ok((client, connection)) =
                    tokio_postgres::connect(&pg_url(), tokio_postgres::NoTls).await
                else {
                    return;
                };
                tokio::spawn(connection);
                let _ = client.batch_execute(&sql).await;
            });
        });
        let _ = dropped.join();
    }
}
