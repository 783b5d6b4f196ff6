//! A database file written by the previous schema version (3, before
//! records kept their region) is upgraded in place when it is opened,
//! without losing or changing a record, a journal entry or a kept try,
//! and its records keep working. A file from a newer version is refused
//! (`durability.rs`).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use idem_conformance::checks::Written;
use idem_core::ManualClock;
use idem_sqlite::{SCHEMA_VERSION, SqliteOptions, SqliteStore};

const FIXTURE: &str = "tests/fixtures/schema-v3.db";
const WRITTEN: &str = "tests/fixtures/schema-v3.expected.json";

fn user_version(path: &Path) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap()
}

/// The fixture, copied where the test may change it.
fn copy(dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = dir.join("idem.db");
    std::fs::copy(root.join(FIXTURE), &path).unwrap();
    path
}

fn written() -> Written {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    Written::parse(
        WRITTEN,
        &std::fs::read_to_string(root.join(WRITTEN)).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_3_file_is_upgraded_in_place_and_keeps_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy(dir.path());
    assert_eq!(user_version(&path), 3, "the fixture is a version 3 file");
    let written = written();
    let clock = ManualClock::new(written.now);
    let open = || {
        SqliteStore::open_with_clock(&path, SqliteOptions::default(), Arc::new(clock.clone()))
            .unwrap()
    };

    let store = open();
    assert_eq!(user_version(&path), SCHEMA_VERSION, "upgraded on open");
    written.check_kept(&store).await;
    drop(store);

    // Opening the upgraded file again migrates nothing and loses nothing.
    let store = open();
    written.check_kept(&store).await;
    written.check_working(&store, "eu-west").await;
    drop(store);

    let store = open();
    let fresh = idem_core::RecordId {
        scope: written.records()[0].id.scope.clone(),
        key: idem_core::IdempotencyKey::new("after-the-upgrade").unwrap(),
    };
    let kept = idem_core::Store::get(&store, &fresh)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        kept.region.as_deref(),
        Some("eu-west"),
        "the region is durable"
    );
}
