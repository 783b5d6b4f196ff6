//! A claim acknowledged late never forwards past its lease (I8, docs/contract.md),
//! through `idem serve` on both stores: on PostgreSQL behind a relay that
//! holds the server's answers back, on SQLite with the commit's `fsync`
//! stalled by a slow disk. Either way the claim is decided at once, its
//! answer arrives after the lease ended, and a retry meanwhile finds the
//! lease expired, asks the provider (404: nothing paid yet) and runs. The
//! late attempt must then forward nothing, or the upstream pays twice.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use idem_testkit::disk_stall::DiskStall;
use support::{Gateway, PgSchema, Site, Upstream, key, post};

const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;
/// The route's lease, in milliseconds; the response timeout is under it,
/// as the config requires.
const LEASE_MS: u64 = 2_500;
/// How long the late claim's answer is held back.
const STALL_MS: u64 = 2_600;

/// The gateway's config: a lease of [`LEASE_MS`], a lookup at the test
/// upstream, and a reconciler that retries fast.
fn config(site: &Site, up: &Upstream) -> PathBuf {
    let lookup = format!("{}/payouts/by-key/{{forwarded_key}}", up.url());
    site.config(&format!(
        "response_timeout_ms = 2000\n\
         [reconcile]\ninterval_s = 1\nbackoff_ms = 50\nbackoff_max_ms = 200\nmax_tries = 100\n\
         [[route]]\nname = \"payouts\"\nmethods = [\"POST\"]\npath = \"/slow-before\"\n\
         lease_ms = {LEASE_MS}\nforward_key = {{ template = \"{{scope_digest}}:{{key}}\" }}\n\
         [[lookup]]\nroute = \"payouts\"\nurl = \"{lookup}\"\ntimeout_ms = 500\nconnect_timeout_ms = 200\n"
    ))
}

/// Sends one payout whose claim answer `hold` delays by [`STALL_MS`] (and
/// `release` stops delaying later answers), retries it after the lease,
/// and checks that the upstream paid once and the late attempt was refused.
async fn late_claim_pays_once(
    up: &Upstream,
    gw: &Gateway,
    hold: impl FnOnce(Duration),
    release: impl FnOnce(),
) {
    let url = gw.url("/slow-before?ms=1500");
    let warm = post(&url, &[key("warm-up")], PAYOUT).await;
    assert_eq!(warm.status, 201, "{warm:?}\n{}", gw.logs());

    // The claim reaches the store and is decided; its answer is held.
    hold(Duration::from_millis(STALL_MS));
    let sent = Instant::now();
    let late = {
        let url = url.clone();
        tokio::spawn(async move { post(&url, &[key("late-1")], PAYOUT).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    release();

    // After the lease, before the late attempt could have paid: the retry
    // finds the lease expired, the provider answers 404, and it runs. A
    // client told 409 (in progress, or unknown while the reconciler asks
    // the provider) retries until it has a definite answer.
    tokio::time::sleep(Duration::from_millis(LEASE_MS + 300).saturating_sub(sent.elapsed())).await;
    let mut retry = post(&url, &[key("late-1")], PAYOUT).await;
    for _ in 0..20 {
        if retry.status != 409 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        retry = post(&url, &[key("late-1")], PAYOUT).await;
    }
    let late = late.await.unwrap();
    // Whatever the late attempt forwarded would have paid by now.
    tokio::time::sleep(Duration::from_millis(2_000)).await;

    let paid: Vec<_> = up
        .effects()
        .into_iter()
        .filter(|e| e.key.as_deref().is_some_and(|k| k.ends_with(":late-1")))
        .collect();
    assert_eq!(
        paid.len(),
        1,
        "one payment for the key; late attempt {late:?}, retry {retry:?}\n{}",
        gw.logs()
    );
    assert_eq!(
        retry.status,
        201,
        "the retry ran once: {retry:?}\n{}",
        gw.logs()
    );
    assert_eq!(late.status, 503, "{late:?}\n{}", gw.logs());
    assert_eq!(
        late.problem().as_deref(),
        Some("urn:idem:problem:lease-spent"),
        "{late:?}"
    );
    assert!(late.header("retry-after").is_some(), "{late:?}");
    assert_eq!(
        up.hits(),
        2,
        "the warm-up and the retry reached the upstream, nothing else"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_claim_answered_after_its_lease_is_not_forwarded_and_pays_once() {
    let up = Upstream::start().await;
    let site = Site::new();
    let config = config(&site, &up);
    let schema = PgSchema::new("late_ack");
    let (relay, store_url) = schema.through_relay().await;
    let gw = Gateway::start_url(&up.url(), &store_url, Some(&config));
    late_claim_pays_once(
        &up,
        &gw,
        |stall| relay.delay_replies(stall),
        || relay.delay_replies(Duration::ZERO),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_claim_whose_commit_stalls_past_its_lease_is_not_forwarded_and_pays_once() {
    let up = Upstream::start().await;
    let site = Site::new();
    let config = config(&site, &up);
    let disk = DiskStall::build(site.dir.path()).unwrap();
    let env = disk.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let gw = Gateway::start_env(&up.url(), &site.store(), Some(&config), &env);
    late_claim_pays_once(
        &up,
        &gw,
        |stall| disk.set(stall).unwrap(),
        || disk.set(Duration::ZERO).unwrap(),
    )
    .await;
}
