//! A store named in a config file is the file's, whatever directory the
//! process is started in: `idem serve` and `idem consume`, restarted from
//! another working directory with `store = "sqlite://idem.db"`, open the
//! same store next to the file, so a retry or a republished intent is a
//! replay and never a second effect. Each process says which file it opened.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::path::Path;

use support::broker::{
    Broker, Sub, consume_toml, drained, effects_per_key, payout, payout_key, settled, stop_settled,
};
use support::rabbit::Rabbit;
use support::{Consumer, Gateway, Site, Upstream, key, post};

const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;

/// The line a process logs once its store is open, naming `file`.
fn names_store(log: &str, file: &Path) -> bool {
    let want = format!("file={}", file.display());
    log.lines()
        .any(|l| l.contains("store open") && l.split_whitespace().any(|w| w == want))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idem_serve_restarted_elsewhere_replays_from_the_store_next_to_its_config() {
    let (up, site) = (Upstream::start().await, Site::new());
    let config = site.config("store = \"sqlite://idem.db\"\n");
    let (first_dir, second_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());

    let gw = Gateway::start_in(first_dir.path(), &up.url(), &config);
    let first = post(&gw.url("/payouts"), &[key("p-1")], PAYOUT).await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(gw.terminate().success());

    let gw = Gateway::start_in(second_dir.path(), &up.url(), &config);
    let again = post(&gw.url("/payouts"), &[key("p-1")], PAYOUT).await;
    again.assert_replay_of(&first);
    assert_eq!(up.hits(), 1, "the retry ran the payout a second time");
    assert!(site.store().exists(), "no store next to the config file");
    for dir in [&first_dir, &second_dir] {
        assert!(!dir.path().join("idem.db").exists(), "a store in {dir:?}");
    }
    assert!(names_store(&gw.logs(), &site.store()), "{}", gw.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idem_consume_restarted_elsewhere_runs_a_republished_intent_once() {
    let (up, site, rabbit) = (
        Upstream::start().await,
        Site::new(),
        Rabbit::connect().await,
    );
    let q = Rabbit::unique("paths");
    let config = site.config(&consume_toml::<Rabbit>(
        "sqlite://idem.db",
        &up,
        &[Sub::new(&q)],
    ));
    // How the tests read the records: by the store's absolute path.
    let store = format!("sqlite://{}", site.store().display());
    let drained = drained(&q);
    let (first_dir, second_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let intent = payout(847, "2026-W36", 1200);

    let consumer = Consumer::start_in(first_dir.path(), &config, 1);
    rabbit.publish_json(&q, &intent, "m-1").await;
    let first = stop_settled(&rabbit, &store, 1, &drained, vec![consumer]).await;
    assert!(
        names_store(&first[0].log, &site.store()),
        "{}",
        first[0].log
    );

    // The producer republishes the intent under a new message id; the
    // consumer now runs from another directory.
    let consumer = Consumer::start_in(second_dir.path(), &config, 1);
    rabbit.publish_json(&q, &intent, "m-2").await;
    let second = stop_settled(&rabbit, &store, 1, &drained, vec![consumer]).await;
    assert_eq!(
        effects_per_key(&up),
        [(payout_key(847, "2026-W36"), 1)].into(),
        "effects per key"
    );
    assert_eq!(settled(&second, "payouts").acked, 1);
    for dir in [&first_dir, &second_dir] {
        assert!(!dir.path().join("idem.db").exists(), "a store in {dir:?}");
    }
    rabbit.delete(&[&q]).await;
}
