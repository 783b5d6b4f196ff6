//! A schema written by the previous schema version (3, before records kept
//! their region), restored from a plain `pg_dump`, is upgraded in place on
//! connect without losing or changing a record, a journal entry or a kept
//! try, and its records keep working. A newer version is refused
//! (`schema.rs`).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use std::path::Path;
use std::sync::Arc;

use idem_conformance::checks::Written;
use idem_core::ManualClock;
use idem_postgres::{PgOptions, SCHEMA_VERSION};
use support::{SchemaGuard, admin, url};

const FIXTURE: &str = "tests/fixtures/schema-v3.sql";
const WRITTEN: &str = "tests/fixtures/schema-v3.expected.json";
/// What the dump says where the schema's name was.
const PLACEHOLDER: &str = "{{schema}}";

fn read(file: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap()
}

async fn version(admin: &tokio_postgres::Client, schema: &str) -> i32 {
    let sql = format!("SELECT version FROM {schema}.schema_version WHERE id = 1");
    admin.query_one(&sql, &[]).await.unwrap().get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_3_schema_is_upgraded_in_place_and_keeps_every_record() {
    let schema = SchemaGuard::new();
    let dump = read(FIXTURE);
    assert!(
        dump.contains(PLACEHOLDER),
        "{FIXTURE} names its schema {PLACEHOLDER}"
    );
    let admin = admin().await;
    admin
        .batch_execute(&dump.replace(PLACEHOLDER, schema.name()))
        .await
        .unwrap();
    assert_eq!(
        version(&admin, schema.name()).await,
        3,
        "restored at version 3"
    );

    let written = Written::parse(WRITTEN, &read(WRITTEN));
    let clock = ManualClock::new(written.now);
    let options = || PgOptions {
        clock: Some(Arc::new(clock.clone())),
        ..schema.options(None)
    };
    let store = idem_postgres::PgStore::connect(&url(), options())
        .await
        .unwrap();
    assert_eq!(
        version(&admin, schema.name()).await,
        SCHEMA_VERSION,
        "upgraded"
    );
    written.check_kept(&store).await;
    drop(store);

    let store = idem_postgres::PgStore::connect(&url(), options())
        .await
        .unwrap();
    written.check_kept(&store).await;
    written.check_working(&store, "eu-west").await;
}
