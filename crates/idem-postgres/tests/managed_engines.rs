//! The store where a managed or PG-compatible engine differs from the
//! PostgreSQL it was built on, each difference made on the real server:
//!
//! - **The promotion check's functions refused.** Aurora revokes
//!   `pg_control_system()`; CockroachDB and YugabyteDB lack it. Here EXECUTE
//!   is really revoked, in a database of the test's own (function
//!   privileges are per database, so nothing else on the shared server
//!   loses it), from a role that is not a superuser; the other refusals
//!   come from a function of the same name that the role's `search_path`
//!   finds before `pg_catalog` (placed last, as PostgreSQL allows), raising
//!   the code those engines raise. The store starts, serves, says the check
//!   is off (once in the log), and a window opened by hand still opens.
//! - **Conflicts.** A serialization failure (40001) or a deadlock (40P01) is
//!   staged by a trigger on the store's `records` that raises it the first
//!   N times (a sequence counts the tries: it is not rolled back with
//!   them): with N up to `CONFLICT_RETRIES_MAX` the claim or completion
//!   passes, with one more it is `Unavailable` after exactly
//!   `CONFLICT_RETRIES_MAX + 1` tries.
//!
//! The fallback from `LISTEN` is tested inside the crate (`src/listen.rs`),
//! where a test build can make the server refuse it.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use std::sync::{Arc, Mutex};

use idem_core::{
    Claim, LeaseExpiry, ManualClock, Policy, Store, StoreError, StoredResult, Timestamp, Token,
    Watch, Watching, WindowOpening,
};
use idem_postgres::{CONFLICT_RETRIES_MAX, PgOptions, PgStore};
use support::{DatabaseGuard, RoleGuard, SchemaGuard, admin, on_db, request, unique};

/// How the promotion check's functions answer a role.
#[derive(Clone, Copy, Debug)]
enum Server {
    /// EXECUTE on `pg_control_system()` revoked (Aurora's refusal).
    Revoked,
    /// A function of the same name first on the role's path, raising
    /// this SQLSTATE.
    Raising(&'static str),
    /// As PostgreSQL answers a superuser, whom no revocation binds.
    Superuser,
}

/// What opening the store with the promotion check asked for leads to.
#[derive(Debug)]
enum Expect {
    /// It starts with the check off, the reason containing this.
    Off(&'static str),
    /// It starts with the check on.
    Active,
    /// The start fails, as for any server that fails to answer.
    Refused,
}

#[tokio::test]
async fn a_server_refusing_the_promotion_check_serves_without_it() {
    let role = RoleGuard::new().await;
    let db = DatabaseGuard::new().await;
    let r = role.name();
    let admin_db = db.admin().await;
    admin_db
        .batch_execute("REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC")
        .await
        .unwrap();
    let cases = [
        (
            Server::Revoked,
            Expect::Off("permission denied for function pg_control_system"),
        ),
        // CockroachDB: the function does not exist.
        (Server::Raising("42883"), Expect::Off("unknown function")),
        // An engine that parses it and does not implement it.
        (Server::Raising("0A000"), Expect::Off("not supported")),
        // Anything else is a server failing, which stops a start as ever.
        (Server::Raising("XX000"), Expect::Refused),
        (Server::Superuser, Expect::Active),
    ];
    for (n, (server, expect)) in cases.into_iter().enumerate() {
        let schema = format!("managed_{n}");
        let url = match server {
            Server::Superuser => support::url_with_db(db.name()),
            Server::Revoked => on_db(&role.url(), db.name()),
            Server::Raising(code) => {
                let shadow = format!("shadow_{n}");
                admin_db
                    .batch_execute(&shadowing(&shadow, code, r))
                    .await
                    .unwrap();
                with_search_path(&on_db(&role.url(), db.name()), &shadow)
            }
        };
        admin_db
            .batch_execute(&format!("CREATE SCHEMA {schema} AUTHORIZATION {r}"))
            .await
            .unwrap();
        let options = PgOptions {
            schema: schema.clone(),
            pool_size: 2,
            ..PgOptions::default()
        };
        let case = format!("{server:?}");
        let store = match PgStore::connect(&url, options).await {
            Ok(store) => store,
            Err(e) => panic!("{case}: cannot connect to {url}: {e}"),
        };
        check_opened(&case, &store, &expect).await;
        if let Expect::Active = expect {
            // The check that runs still tells servers apart.
            admin_db
                .batch_execute(&format!(
                    "UPDATE {schema}.server_epoch SET system_identifier = 'another'"
                ))
                .await
                .unwrap();
            // The pool's hook opens it, on the connection this asks for.
            store.open_window_on_promotion(60_000).await.unwrap();
            let window = store.suspect_window().await.unwrap();
            let cause = window.map(|window| window.cause).unwrap_or_default();
            assert!(cause.contains("system identifier"), "{case}: {cause:?}");
        }
    }
}

/// Opens `store` as a gateway does, holds the outcome to `expect`, and,
/// where it serves, serves with it.
async fn check_opened(case: &str, store: &PgStore, expect: &Expect) {
    let (said, opened) = logged(store.open_window_on_promotion(60_000)).await;
    let reason = match (opened, expect) {
        (Err(StoreError::Unavailable { .. }), Expect::Refused) => return,
        (Ok(None), Expect::Active) => {
            assert_eq!(store.promotion_check(), Some(Watching::Active), "{case}");
            assert!(said.is_empty(), "{case}: {said:?}");
            return;
        }
        (Ok(None), Expect::Off(part)) => match store.promotion_check() {
            Some(Watching::Off { reason }) if reason.contains(part) => reason,
            other => panic!("{case}: the check is {other:?}, want off for {part:?}"),
        },
        (got, want) => panic!("{case}: opened {got:?}, want {want:?}"),
    };
    assert!(reason.contains("mark-restored"), "{case}: {reason}");
    assert_eq!(
        said,
        ["the promotion check is off".to_owned()],
        "{case}: said once, however many connections were opened"
    );
    assert_eq!(
        store.watches(),
        [(Watch::Promotion, Watching::Off { reason })],
        "{case}"
    );
    let (said, ()) = logged(serves(case, store)).await;
    assert!(said.is_empty(), "{case}: said again: {said:?}");
    let opening = WindowOpening {
        length_ms: 60_000,
        since: None,
        cause: "restored by hand".to_owned(),
    };
    let window = store.open_suspect_window(&opening).await.unwrap();
    assert_eq!(window.cause, opening.cause, "{case}");
    let read = store.suspect_window().await.unwrap();
    assert_eq!(read, Some(window), "{case}");
}

/// A claim, its completion and the replay, on new connections (each
/// passes the hook).
async fn serves(case: &str, store: &PgStore) {
    for i in 0..4 {
        let req = request(&format!("managed-{i}"), 1, 30_000);
        let Claim::Acquired { token, .. } = store.claim(&req).await.unwrap() else {
            panic!("{case}: a new key is acquired");
        };
        let result = StoredResult::new(201, vec![], b"paid".to_vec()).unwrap();
        store.complete(&req.id, token, result).await.unwrap();
        let again = store.claim(&req).await.unwrap();
        assert!(matches!(again, Claim::Replay { .. }), "{case}: {again:?}");
    }
}

/// A function named `pg_control_system` in schema `shadow`, of the shape
/// the check reads, that raises `code`; `role` may use it.
fn shadowing(shadow: &str, code: &str, role: &str) -> String {
    let message = match code {
        "42883" => "unknown function: pg_control_system()",
        "0A000" => "pg_control_system() is not supported",
        _ => "internal error",
    };
    format!(
        "CREATE SCHEMA {shadow}; GRANT USAGE ON SCHEMA {shadow} TO {role}; \
         CREATE FUNCTION {shadow}.pg_control_system() \
         RETURNS TABLE (system_identifier bigint) LANGUAGE plpgsql AS $$ BEGIN \
         RAISE EXCEPTION USING ERRCODE = '{code}', MESSAGE = '{message}'; END $$"
    )
}

/// `url` with sessions that search `shadow` before `pg_catalog`.
fn with_search_path(url: &str, shadow: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-c%20search_path%3D{shadow}%2Cpg_catalog")
}

/// The messages of the events logged on this thread while `f` ran.
async fn logged<T>(f: impl Future<Output = T>) -> (Vec<String>, T) {
    let said = Arc::new(Mutex::new(Vec::new()));
    let subscriber = Messages(Arc::clone(&said));
    let out = {
        let _on = tracing::subscriber::set_default(subscriber);
        f.await
    };
    let said = said.lock().unwrap().clone();
    (said, out)
}

/// Keeps the message of every event.
struct Messages(Arc<Mutex<Vec<String>>>);

impl tracing::Subscriber for Messages {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        self.0.lock().unwrap().push(message.0);
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

/// Which write meets the staged conflicts.
#[derive(Clone, Copy, Debug)]
enum Write {
    /// The claim of a new key: the fast path's insert, in autocommit.
    NewKey,
    /// A completion: one statement in autocommit.
    Completion,
    /// The claim of a key whose lease ran out (`Takeover`): the locked
    /// read-decide-write, a transaction of its own.
    Takeover,
}

#[tokio::test]
async fn a_conflict_is_tried_again_a_bounded_number_of_times() {
    let guard = SchemaGuard::new();
    let s = guard.name();
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    // Unbatched, and batched (a single write is a batch of one).
    let stores = [
        PgStore::connect(&support::url(), options(&guard, &clock, 0))
            .await
            .unwrap(),
        PgStore::connect(&support::url(), options(&guard, &clock, 2))
            .await
            .unwrap(),
    ];
    let admin = admin().await;
    admin
        .batch_execute(&format!(
            "CREATE SEQUENCE {s}.conflicts_met; \
             CREATE FUNCTION {s}.conflict() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             IF nextval('{s}.conflicts_met') <= TG_ARGV[1]::bigint THEN \
             RAISE EXCEPTION USING ERRCODE = TG_ARGV[0], \
             MESSAGE = 'a conflict staged by the test'; END IF; RETURN NEW; END $$"
        ))
        .await
        .unwrap();
    let bound = u64::from(CONFLICT_RETRIES_MAX);
    let mut n = 0;
    for store in &stores {
        for write in [Write::NewKey, Write::Completion, Write::Takeover] {
            for code in ["40001", "40P01"] {
                for (conflicts, passes) in [(bound, true), (bound + 1, false)] {
                    n += 1;
                    let case = format!("{write:?} meeting {conflicts} x {code}, case {n}");
                    let key = unique("conflict");
                    let stage = Stage {
                        admin: &admin,
                        s,
                        code,
                        conflicts,
                    };
                    let got = write_after(store, &clock, &key, write, stage).await;
                    match (got, passes) {
                        (Ok(()), true) => {}
                        (Err(StoreError::Unavailable { reason, .. }), false) => {
                            assert!(reason.contains("staged by the test"), "{case}: {reason}");
                            // Each try refused at its first row: tried
                            // exactly once and `CONFLICT_RETRIES_MAX` times
                            // again, no more.
                            assert_eq!(tries(&admin, s).await, bound + 1, "{case}: tries");
                        }
                        (got, _) => panic!("{case}: {got:?}, want it to pass: {passes}"),
                    }
                }
            }
        }
    }
}

fn options(guard: &SchemaGuard, clock: &ManualClock, batch_lanes: usize) -> PgOptions {
    PgOptions {
        batch_lanes,
        ..guard.options(Some(clock.clone()))
    }
}

/// The first `conflicts` rows written to `records` from now are refused
/// with `code`.
struct Stage<'a> {
    admin: &'a tokio_postgres::Client,
    s: &'a str,
    code: &'a str,
    conflicts: u64,
}

impl Stage<'_> {
    async fn set(&self) {
        let Stage {
            s, code, conflicts, ..
        } = self;
        self.admin
            .batch_execute(&format!(
                "DROP TRIGGER IF EXISTS conflicts ON {s}.records; \
                 ALTER SEQUENCE {s}.conflicts_met RESTART; \
                 CREATE TRIGGER conflicts BEFORE INSERT OR UPDATE ON {s}.records \
                 FOR EACH ROW EXECUTE FUNCTION {s}.conflict('{code}', '{conflicts}')"
            ))
            .await
            .unwrap();
    }

    async fn clear(&self) {
        let s = self.s;
        self.admin
            .batch_execute(&format!("DROP TRIGGER IF EXISTS conflicts ON {s}.records"))
            .await
            .unwrap();
    }
}

/// Prepares `write` on `key` with nothing staged, then stages the
/// conflicts and makes it.
async fn write_after(
    store: &PgStore,
    clock: &ManualClock,
    key: &str,
    write: Write,
    stage: Stage<'_>,
) -> Result<(), StoreError> {
    stage.clear().await;
    let mut req = request(key, 1, 1_000);
    let got = match write {
        Write::NewKey => {
            stage.set().await;
            store.claim(&req).await.map(|claim| acquired(&claim))
        }
        Write::Completion => {
            let token = acquired(&store.claim(&req).await.unwrap());
            stage.set().await;
            let result = StoredResult::new(201, vec![], b"paid".to_vec()).unwrap();
            store.complete(&req.id, token, result).await.map(|_| token)
        }
        Write::Takeover => {
            req.policy = Policy::new(1_000, 60, 3_600, LeaseExpiry::Takeover).unwrap();
            acquired(&store.claim(&req).await.unwrap());
            clock.advance_millis(2_000);
            stage.set().await;
            store.claim(&req).await.map(|claim| acquired(&claim))
        }
    };
    stage.clear().await;
    got.map(|_| ())
}

fn acquired(claim: &Claim) -> Token {
    match claim {
        Claim::Acquired { token, .. } => *token,
        other => panic!("want acquired, got {other:?}"),
    }
}

/// How many times the staged trigger fired since it was set.
async fn tries(admin: &tokio_postgres::Client, s: &str) -> u64 {
    let row = admin
        .query_one(
            &format!(
                "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {s}.conflicts_met"
            ),
            &[],
        )
        .await
        .unwrap();
    u64::try_from(row.get::<_, i64>(0)).unwrap()
}
