//! A second loss inside an open suspect window, through the real binary:
//! the store loses its memory once (a restore, `mark-restored`), a fresh
//! key is verified and forwarded inside the window, and while its payment
//! is still on its way the store loses its memory again (a second restore
//! from a backup taken while the window was open, or a PostgreSQL
//! promotion). The retry's lookup says "not found" — the payment has not
//! landed — and that proves nothing until the lease of the forgotten
//! attempt is over: the retry is answered 503 `unverified`, then the
//! provider's answer, and the payment happens once.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use idem_testkit::pg_cluster::{PgCluster, Replication};
use idem_testkit::relay::Relay;
use support::{Gateway, Site, Upstream, idem, key, post, text};

const TRANSFER: &str = r#"{"account":847,"amount":1200,"currency":"EUR"}"#;
/// The route's lease: long enough for the second loss to come while the
/// forwarded payment is still on its way.
const LEASE_MS: u64 = 8_000;
/// How long the payment takes to land at the provider.
const PAYMENT_MS: u64 = 5_000;

fn config(site: &Site, up: &Upstream) -> PathBuf {
    site.config(&format!(
        "response_timeout_ms = 7000\n\
         [[route]]\nname = \"transfers\"\nmethods = [\"POST\"]\npath = \"/transfers/slow\"\n\
         lease_ms = {LEASE_MS}\nforward_key = {{ template = \"{{scope_digest}}:{{key}}\" }}\n\
         [[lookup]]\nroute = \"transfers\"\n\
         url = \"{}/transfers/by-key/{{forwarded_key}}\"\ntimeout_ms = 500\nconnect_timeout_ms = 200\n",
        up.url()
    ))
}

fn path() -> String {
    format!("/transfers/slow?ms={PAYMENT_MS}")
}

/// Sends the intent through `gw` in the background and waits until the
/// provider has it in hand (its payment not landed yet).
async fn forward_slow_payment(gw: &Gateway, up: &Upstream) -> tokio::task::JoinHandle<()> {
    let url = gw.url(&path());
    let hits = up.hits();
    let sent = tokio::spawn(async move {
        post(&url, &[key("payout-847")], TRANSFER).await;
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while up.hits() == hits {
        assert!(
            Instant::now() < deadline,
            "the payment never reached the provider"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(up.effects().is_empty(), "the payment has not landed yet");
    sent
}

/// Retries the intent until it gets a final answer: 503 `unverified` while
/// a forgotten attempt may still commit, then the provider's answer.
async fn retry_until_answered(gw: &Gateway) -> (support::Reply, usize) {
    let url = gw.url(&path());
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut unverified = 0;
    loop {
        let reply = post(&url, &[key("payout-847")], TRANSFER).await;
        if reply.status != 503 {
            return (reply, unverified);
        }
        assert_eq!(
            reply.problem().as_deref(),
            Some("urn:idem:problem:unverified"),
            "{reply:?}"
        );
        unverified += 1;
        assert!(Instant::now() < deadline, "never answered: {reply:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Once every answer is in: one payment, and the retry was told it.
async fn assert_paid_once(gw: &Gateway, up: &Upstream) {
    let (reply, unverified) = retry_until_answered(gw).await;
    assert!(
        unverified > 0,
        "the first retry's \"not found\" was trusted"
    );
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(
        reply.header("idempotent-replayed"),
        Some("true"),
        "{reply:?}"
    );
    // Long after the payment landed: still one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(up.effects().len(), 1, "paid twice: {:?}", up.effects());
}

fn store_cmd(verb: &str, store: &Path, flag: &str, file: &Path) {
    let out = idem(&[
        "store",
        verb,
        "--store",
        &format!("sqlite://{}", store.display()),
        flag,
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{verb}: {}", text(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_restored_twice_pays_once() {
    let (up, site) = (Upstream::start().await, Site::new());
    let cfg = config(&site, &up);
    drop(Gateway::start(&up.url(), &site.store(), Some(&cfg)));
    let empty = site.dir.path().join("empty.db");
    store_cmd("backup", &site.store(), "--to", &empty);

    // The first loss; its guard passes before the intent arrives.
    store_cmd("restore", &site.store(), "--from", &empty);
    let inside = site.dir.path().join("inside-window.db");
    store_cmd("backup", &site.store(), "--to", &inside);
    tokio::time::sleep(Duration::from_millis(LEASE_MS + 300)).await;

    let gw = Gateway::start(&up.url(), &site.store(), Some(&cfg));
    let first = forward_slow_payment(&gw, &up).await;
    gw.kill();
    // The second loss: a backup taken while the window was open, with
    // that window in it.
    store_cmd("restore", &site.store(), "--from", &inside);

    let gw = Gateway::start(&up.url(), &site.store(), Some(&cfg));
    assert_paid_once(&gw, &up).await;
    first.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_marked_restored_then_promoted_pays_once() {
    let mut cluster = PgCluster::start_primary(Replication::Asynchronous).unwrap();
    let relay = Relay::start(cluster.primary_addr()).await.unwrap();
    tokio::task::block_in_place(|| cluster.add_standby(relay.addr())).unwrap();
    let (up, site) = (Upstream::start().await, Site::new());
    let cfg = config(&site, &up);
    let url = format!(
        "{}&schema=second_loss&operation_timeout_ms=1000&connect_timeout_ms=1000",
        cluster.multi_host_url()
    );
    let gw = Gateway::start_url(&up.url(), &url, Some(&cfg));

    // The first loss, declared by the operator; the window reaches the
    // standby, and its guard passes before the intent arrives.
    let marked = idem(&[
        "store",
        "mark-restored",
        "--store",
        &url,
        "--since",
        "2026-01-01T00:00:00Z",
    ]);
    assert!(marked.status.success(), "{}", text(&marked.stderr));
    tokio::time::sleep(Duration::from_millis(LEASE_MS + 300)).await;

    // The standby stops hearing from the primary: the intent's record
    // never reaches it.
    relay.freeze();
    let first = forward_slow_payment(&gw, &up).await;
    // The second loss: the primary stops hard, the standby is promoted,
    // and the gateway's next connection finds a new server.
    tokio::task::block_in_place(|| {
        cluster.stop_primary_immediate()?;
        cluster.promote_standby()
    })
    .unwrap();

    assert_paid_once(&gw, &up).await;
    assert!(gw.logs().contains("suspect window open"), "{}", gw.logs());
    first.abort();
}
