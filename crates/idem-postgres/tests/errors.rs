//! Every refusal says what is wrong, names the host and database, never
//! the password, and is of the kind the caller must act on: a bad URL, bad
//! credentials or a missing permission need a person (`Incompatible`); a
//! server that cannot be reached may come back (`Unavailable`: the gateway
//! answers 503 and fails closed).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use idem_core::{Claim, Store, StoreError};
use idem_postgres::{PgOptions, PgStore};
use support::{RoleGuard, SchemaGuard, admin, request};

/// The kind of error expected, and words its message must contain.
#[derive(Debug)]
enum Expect {
    Incompatible(&'static [&'static str]),
    Unavailable(&'static [&'static str]),
}

fn check(case: &str, got: Result<PgStore, StoreError>, expect: &Expect) {
    let (kind, words) = match expect {
        Expect::Incompatible(words) => ("incompatible", words),
        Expect::Unavailable(words) => ("unavailable", words),
    };
    let e = match got {
        Ok(store) => panic!("{case}: connected to {}, want {kind}", store.name()),
        Err(e) => e,
    };
    let matches_kind = matches!(
        (&e, expect),
        (StoreError::Incompatible { .. }, Expect::Incompatible(_))
            | (StoreError::Unavailable { .. }, Expect::Unavailable(_))
    );
    let text = e.to_string();
    assert!(matches_kind, "{case}: want {kind}, got {e:?}");
    for word in *words {
        assert!(text.contains(word), "{case}: {text:?} should say {word:?}");
    }
    assert!(
        !text.contains("s3cret"),
        "{case}: leaks the password: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_unreachable_servers_are_told_apart() {
    let missing_db = format!("idem_no_such_db_{}", std::process::id());
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let cases: Vec<(String, u64, Expect)> = vec![
        (
            "postgres://app:s3cret@db:notaport/x".into(),
            5_000,
            Expect::Incompatible(&["invalid PostgreSQL URL", "app:***@db", "port"]),
        ),
        (
            "mysql://app:s3cret@db/x".into(),
            5_000,
            Expect::Incompatible(&["invalid PostgreSQL URL", "scheme is \"mysql\""]),
        ),
        (
            "postgres://db/x?password=s3cret".into(),
            5_000,
            Expect::Incompatible(&["names no user"]),
        ),
        (
            "postgres://app:s3cret@127.0.0.1:1/test".into(),
            5_000,
            Expect::Unavailable(&["postgres://app@127.0.0.1:1/test", "refused"]),
        ),
        (
            // Accepts connections (the kernel's backlog) and never answers.
            format!("postgres://app:s3cret@127.0.0.1:{silent_port}/test"),
            200,
            Expect::Unavailable(&["did not answer within 200 ms"]),
        ),
        (
            support::url_with_db(&missing_db),
            5_000,
            Expect::Incompatible(&["does not exist", "create the database or fix the URL"]),
        ),
    ];
    for (raw, connect_timeout_ms, expect) in cases {
        let options = PgOptions {
            connect_timeout_ms,
            ..PgOptions::default()
        };
        let started = std::time::Instant::now();
        check(&raw, PgStore::connect(&raw, options).await, &expect);
        assert!(
            started.elapsed().as_millis() < 3_000,
            "{raw}: took {:?}",
            started.elapsed()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_privileges_is_told_which_one_is_missing() {
    let role = RoleGuard::new().await;
    let schema = SchemaGuard::new();
    let (r, s) = (role.name(), schema.name());
    let admin = admin().await;

    let no_create_on_db = PgStore::connect(&role.url(), schema.options(None)).await;
    let words: &[&str] = &[
        "permission denied to create schema",
        "CREATE on the database",
    ];
    check(
        "no CREATE on the database",
        no_create_on_db,
        &Expect::Incompatible(words),
    );
    let text = PgStore::connect(&role.url(), schema.options(None))
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(text.contains("GRANT CREATE ON DATABASE"), "{text}");
    assert!(text.contains(&format!("TO {r}")), "{text}");
    assert!(
        text.contains(&format!("CREATE SCHEMA {s} AUTHORIZATION {r}")),
        "{text}"
    );

    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {s}; GRANT USAGE ON SCHEMA {s} TO {r}"
        ))
        .await
        .unwrap();
    let no_create_on_schema = PgStore::connect(&role.url(), schema.options(None)).await;
    let words: &[&str] = &["permission denied to create table", "CREATE on schema"];
    check(
        "no CREATE on the schema",
        no_create_on_schema,
        &Expect::Incompatible(words),
    );

    // Migrated by an administrator, the store needs no CREATE to run, and
    // a missing table privilege is named when an operation needs it.
    admin
        .batch_execute(&format!("DROP SCHEMA {s}"))
        .await
        .unwrap();
    schema.store(None).await;
    admin
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA {s} TO {r}; GRANT SELECT ON {s}.schema_version TO {r}; \
             GRANT SELECT ON {s}.records TO {r}"
        ))
        .await
        .unwrap();
    let store = PgStore::connect(&role.url(), schema.options(None))
        .await
        .unwrap();
    let denied = store.claim(&request("denied", 1, 30_000)).await;
    let Err(StoreError::Incompatible { reason, .. }) = denied else {
        panic!("a claim without INSERT must be refused, got {denied:?}");
    };
    assert!(reason.contains("permission denied"), "{reason}");
    assert!(reason.contains("INSERT"), "{reason}");
    admin
        .batch_execute(&format!(
            "GRANT INSERT, UPDATE, DELETE ON {s}.records TO {r}; \
             GRANT USAGE, UPDATE ON SEQUENCE {s}.tokens TO {r}"
        ))
        .await
        .unwrap();
    let granted = store.claim(&request("granted", 1, 30_000)).await.unwrap();
    assert!(matches!(granted, Claim::Acquired { .. }), "{granted:?}");
}
