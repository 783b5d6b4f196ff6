//! `idem store backup` through the real binary: a consistent copy of an
//! SQLite store written while `idem serve` keeps writing to it, checked,
//! that a gateway opened on it replays what it holds; and the refusals
//! that lose nothing (an existing file, a PostgreSQL store, no store).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use support::{Gateway, Site, Upstream, idem, key, post, text};

const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_while_serving_is_a_whole_store_that_replays() {
    let up = Upstream::start().await;
    let site = Site::new();
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let url = gw.url("/payouts");
    let mut firsts = Vec::new();
    for i in 0..30 {
        let reply = post(&url, &[key(&format!("before-{i}"))], PAYOUT).await;
        assert_eq!(reply.status, 201, "{reply:?}");
        firsts.push(reply);
    }
    // The gateway keeps writing while the copy is taken.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (url, stop) = (url.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let reply = post(&url, &[key(&format!("during-{i}"))], PAYOUT).await;
                assert_eq!(reply.status, 201, "{reply:?}");
                i += 1;
            }
            i
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let copy = site.dir.path().join("backup.db");
    let store = format!("sqlite://{}", site.store().display());
    let out = {
        let (store, copy) = (store.clone(), copy.clone());
        tokio::task::spawn_blocking(move || {
            idem(&[
                "store",
                "backup",
                "--store",
                &store,
                "--to",
                copy.to_str().unwrap(),
            ])
        })
        .await
        .unwrap()
    };
    stop.store(true, Ordering::SeqCst);
    let during = writer.await.unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("checked"), "{said}");
    assert!(during > 0, "the gateway wrote while the copy was taken");

    let listed = idem(&[
        "records",
        "list",
        "--format",
        "json",
        "--store",
        &format!("sqlite://{}", copy.display()),
    ]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let keys: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    for i in 0..30 {
        assert!(
            keys.contains(&format!("before-{i}").as_str()),
            "before-{i} in {keys:?}"
        );
    }
    assert!(said.contains(&format!("{} records", keys.len())), "{said}");

    // A gateway opened on the copy replays what it holds.
    drop(gw);
    let restored = Gateway::start(&up.url(), &copy, None);
    let again = post(&restored.url("/payouts"), &[key("before-7")], PAYOUT).await;
    again.assert_replay_of(&firsts[7]);
}

/// Runs `idem store backup --store STORE --to TO`, which must exit 1;
/// returns its stderr.
fn refused(store: &str, to: &std::path::Path) -> String {
    let out = idem(&[
        "store",
        "backup",
        "--store",
        store,
        "--to",
        to.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    text(&out.stderr)
}

#[test]
fn a_backup_never_overwrites_and_names_what_it_refuses() {
    let site = Site::new();
    let store = format!("sqlite://{}", site.store().display());
    // No store at the path: nothing is created.
    let copy = site.dir.path().join("copy.db");
    let said = refused(&store, &copy);
    assert!(said.contains("no store"), "{said}");
    assert!(!copy.exists() && !site.store().exists(), "nothing created");
    // An existing file is never overwritten.
    std::fs::write(&copy, b"an earlier backup").unwrap();
    // A database at the store's path, but an empty one, not idem's.
    rusqlite::Connection::open(site.store()).unwrap();
    let said = refused(&store, &copy);
    assert!(said.contains("exists"), "{said}");
    assert_eq!(std::fs::read(&copy).unwrap(), b"an earlier backup");
    // A file that is not an idem store: refused, and no copy left behind.
    let other = site.dir.path().join("other.db");
    let said = refused(&store, &other);
    assert!(said.contains("not usable"), "{said}");
    assert!(!other.exists(), "a failed copy is not left behind");
    // A PostgreSQL store is backed up with its database.
    let said = refused("postgres://postgres@127.0.0.1:5432/test", &other);
    assert!(said.contains("docs/stores.md"), "{said}");
}
