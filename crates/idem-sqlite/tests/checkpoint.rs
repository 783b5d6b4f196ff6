//! The WAL is checkpointed off the commit path, by a thread of its own, and
//! stays bounded: a run that writes several times the checkpoint threshold
//! through the real store leaves the WAL file within its bound, with the
//! checkpoints counted on the checkpointer and none in a commit.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use idem_core::{Claim, Store, StoredResult};
use idem_sqlite::{SqliteOptions, SqliteStore};

/// SQLite's page size for a new file here.
const PAGE_BYTES: u64 = 4096;
/// `checkpoint::CHECKPOINT_PAGES`: the WAL restarts soon after it passes
/// it, long before the hard bound at four times it.
const CHECKPOINT_PAGES: u64 = 4096;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_is_checkpointed_off_the_commit_path_and_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let store = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
    let wal = dir.path().join("idem.db-wal");
    let mut wal_bytes_max = 0;
    // About 19 pages per claim and completion (a 64 KiB body overflows
    // into 16 pages): 480 of them write twice the threshold.
    for n in 0..480 {
        let req = support::request(&format!("k{n}"));
        let Claim::Acquired { token, .. } = store.claim(&req).await.unwrap() else {
            panic!("a new key acquires");
        };
        let result = StoredResult::new(200, vec![], vec![7; 64 * 1024]).unwrap();
        store.complete(&req.id, token, result).await.unwrap();
        wal_bytes_max = wal_bytes_max.max(std::fs::metadata(&wal).unwrap().len());
    }
    let stats = store.stats();
    assert!(
        stats.checkpoints >= 1,
        "the checkpointer ran: {stats:?}, WAL up to {wal_bytes_max} bytes"
    );
    assert_eq!(
        stats.inline_checkpoints, 0,
        "the WAL never reached its bound: {stats:?}"
    );
    assert!(stats.catch_ups >= 1, "the WAL restarted: {stats:?}");
    // A frame is a page and a 24-byte header; the WAL file has a 32-byte one.
    let bound = 32 + 2 * CHECKPOINT_PAGES * (PAGE_BYTES + 24);
    assert!(
        wal_bytes_max <= bound,
        "the WAL grew to {wal_bytes_max} bytes, past its bound of {bound}: {stats:?}"
    );
    // Everything written reads back after the checkpoints.
    drop(store);
    let store = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
    for n in [0, 239, 479] {
        let record = store.get(&support::id(&format!("k{n}"))).await.unwrap();
        assert!(record.is_some_and(|r| r.result.is_some()), "k{n}");
    }
}
