//! Shared by the tests against the real server: its URL, a schema of its
//! own per test that is dropped when the test ends (pass or fail), a role
//! dropped likewise, an administrator's connection, and claim fixtures.

#![allow(
    dead_code,
    reason = "each test binary uses the helpers it needs and not the others"
)]
#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_core::{
    ClaimRequest, Fingerprint, IdempotencyKey, LeaseExpiry, ManualClock, Policy, RecordId, Scope,
};
use idem_postgres::{PgOptions, PgStore};

/// The server every test runs against: `IDEM_TEST_POSTGRES_URL`, or
/// `idem_testkit::services::POSTGRES_URL_DEFAULT`. Fails the test with
/// one line when it does not answer.
pub fn url() -> String {
    idem_testkit::services::postgres_url()
}

/// The test URL naming database `db` instead.
pub fn url_with_db(db: &str) -> String {
    on_db(&url(), db)
}

/// `url` naming database `db` instead.
pub fn on_db(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base.to_owned(), format!("?{query}")),
        None => (url.to_owned(), String::new()),
    };
    match base.rsplit_once('/') {
        Some((server, _)) => format!("{server}/{db}{query}"),
        None => panic!("the test URL {url} names no database"),
    }
}

/// A name no other test (in this process or another) uses:
/// `<prefix>_<pid>_<n>`.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{}_{n}", std::process::id())
}

/// A schema name for one test; the schema (if anything created it) is
/// dropped with everything in it when the guard drops.
pub struct SchemaGuard {
    name: String,
}

impl SchemaGuard {
    pub fn new() -> SchemaGuard {
        SchemaGuard {
            name: unique("idem_t"),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Options for a store in this schema.
    pub fn options(&self, clock: Option<ManualClock>) -> PgOptions {
        PgOptions {
            pool_size: 4,
            schema: self.name.clone(),
            clock: clock.map(|c| Arc::new(c) as _),
            ..PgOptions::default()
        }
    }

    /// A store in this schema, created.
    pub async fn store(&self, clock: Option<ManualClock>) -> PgStore {
        match PgStore::connect(&url(), self.options(clock)).await {
            Ok(store) => store,
            Err(e) => panic!("cannot connect to {}: {e}", url()),
        }
    }
}

impl Drop for SchemaGuard {
    fn drop(&mut self) {
        let sql = format!(
            "SET lock_timeout = '10s'; DROP SCHEMA IF EXISTS {} CASCADE",
            self.name
        );
        if let Err(e) = admin_blocking(sql) {
            eprintln!("cannot drop test schema {}: {e}", self.name);
        }
    }
}

/// A database of one test's own, created from `template0` (which nobody
/// connects to, so that creating it never waits on another test), and
/// dropped with whatever sessions are still in it when the guard drops:
/// what a test revokes in it is revoked nowhere else on the server.
pub struct DatabaseGuard {
    name: String,
}

impl DatabaseGuard {
    pub async fn new() -> DatabaseGuard {
        let name = unique("idem_db");
        admin()
            .await
            .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE template0"))
            .await
            .unwrap();
        DatabaseGuard { name }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A connection to it as the test URL's user (a superuser).
    pub async fn admin(&self) -> tokio_postgres::Client {
        let url = url_with_db(&self.name);
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
        tokio::spawn(connection);
        client
    }
}

impl Drop for DatabaseGuard {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        if let Err(e) = admin_blocking(sql) {
            eprintln!("cannot drop test database {}: {e}", self.name);
        }
    }
}

/// A login role without any privilege beyond PostgreSQL's defaults (in
/// 15, no CREATE on the database or on `public`), dropped with the guard.
/// Its password is its name, so that it logs in where 127.0.0.1 needs a
/// password (Debian's default `pg_hba.conf`) as well as where it does not.
pub struct RoleGuard {
    name: String,
}

impl RoleGuard {
    pub async fn new() -> RoleGuard {
        let name = unique("idem_noperm");
        admin()
            .await
            .batch_execute(&format!("CREATE ROLE {name} LOGIN PASSWORD '{name}'"))
            .await
            .unwrap();
        RoleGuard { name }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The test URL with this role as the user.
    pub fn url(&self) -> String {
        let url = url();
        match url
            .split_once("://")
            .and_then(|(_, rest)| rest.split_once('@'))
        {
            Some((_, host)) => format!("postgres://{0}:{0}@{host}", self.name),
            None => panic!("the test URL {url} names no user"),
        }
    }
}

impl Drop for RoleGuard {
    fn drop(&mut self) {
        let sql = format!("DROP ROLE IF EXISTS {}", self.name);
        if let Err(e) = admin_blocking(sql) {
            eprintln!("cannot drop test role {}: {e}", self.name);
        }
    }
}

/// A connection as the test URL's user (a superuser), for setting up what
/// a test needs and looking behind the store's back.
pub async fn admin() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", url()));
    tokio::spawn(connection);
    client
}

/// Runs `sql` as the administrator on a thread and runtime of its own, so
/// that a guard can clean up from `Drop` inside or outside a runtime.
fn admin_blocking(sql: String) -> Result<(), String> {
    let work = move || -> Result<(), String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async {
            let (client, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(connection);
            client
                .batch_execute(&sql)
                .await
                .map_err(|e| match e.as_db_error() {
                    Some(db) => db.to_string(),
                    None => e.to_string(),
                })
        })
    };
    std::thread::spawn(work)
        .join()
        .unwrap_or_else(|_| Err("the cleanup thread panicked".to_owned()))
}

/// A record id in a fixed scope.
pub fn id(key: &str) -> RecordId {
    RecordId {
        scope: Scope::new("POST /payouts|tenant-a").unwrap(),
        key: IdempotencyKey::parse(key).unwrap(),
    }
}

/// A claim of `key` with fingerprint `[n; 32]` and the given lease.
pub fn request(key: &str, n: u8, lease_ms: u64) -> ClaimRequest {
    ClaimRequest {
        id: id(key),
        fingerprint: Fingerprint::from_bytes([n; 32]),
        legacy_fingerprint: None,
        owner: "node-1".to_owned(),
        region: None,
        policy: Policy::new(lease_ms, 60, 3_600, LeaseExpiry::Reconcile).unwrap(),
    }
}
