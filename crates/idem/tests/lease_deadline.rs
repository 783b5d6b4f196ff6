//! A claim acknowledged late never forwards past its lease (DESIGN I8),
//! through `idem serve` on PostgreSQL behind a relay that holds the
//! server's answers back: the claim commits at once, its answer arrives
//! after the lease ended, and a retry meanwhile finds the lease expired,
//! asks the provider (404: nothing paid yet) and runs. The late attempt
//! must then forward nothing, or the upstream pays twice.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::time::{Duration, Instant};

use idem_testkit::relay::Relay;
use support::{Gateway, PgSchema, Site, Upstream, key, post};

const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;
/// The route's lease, in milliseconds; the response timeout is under it,
/// as the config requires.
const LEASE_MS: u64 = 2_500;
/// How long the relay holds PostgreSQL's answer to the late claim.
const STALL_MS: u64 = 2_600;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_answered_after_its_lease_is_not_forwarded_and_pays_once() {
    let up = Upstream::start().await;
    let site = Site::new();
    let lookup = format!("{}/payouts/by-key/{{forwarded_key}}", up.url());
    let config = site.config(&format!(
        "response_timeout_ms = 2000\n\
         [reconcile]\ninterval_s = 1\nbackoff_ms = 50\nbackoff_max_ms = 200\nmax_tries = 100\n\
         [[route]]\nname = \"payouts\"\nmethods = [\"POST\"]\npath = \"/slow-before\"\n\
         lease_ms = {LEASE_MS}\nforward_key = {{ template = \"{{scope_digest}}:{{key}}\" }}\n\
         [[lookup]]\nroute = \"payouts\"\nurl = \"{lookup}\"\ntimeout_ms = 500\nconnect_timeout_ms = 200\n"
    ));
    let schema = PgSchema::new("late_ack");
    let server: tokio_postgres::Config = schema.url.parse().unwrap();
    let port = server.get_ports().first().copied().unwrap_or(5432);
    let relay = Relay::start(format!("127.0.0.1:{port}").parse().unwrap())
        .await
        .unwrap();
    let (user, rest) = schema
        .store_url()
        .split_once('@')
        .map(|(u, r)| (u.to_owned(), r.to_owned()))
        .unwrap();
    let (_, path) = rest.split_once('/').unwrap();
    let store_url = format!("{user}@{}/{path}", relay.addr());
    let gw = Gateway::start_url(&up.url(), &store_url, Some(&config));
    let url = gw.url("/slow-before?ms=1500");
    let warm = post(&url, &[key("warm-up")], PAYOUT).await;
    assert_eq!(warm.status, 201, "{warm:?}\n{}", gw.logs());

    // The claim reaches PostgreSQL and commits; its answer is held.
    relay.delay_replies(Duration::from_millis(STALL_MS));
    let sent = Instant::now();
    let late = {
        let url = url.clone();
        tokio::spawn(async move { post(&url, &[key("late-1")], PAYOUT).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    relay.delay_replies(Duration::ZERO);

    // After the lease, before the late attempt could have paid: the retry
    // finds the lease expired, the provider answers 404, and it runs.
    tokio::time::sleep(Duration::from_millis(LEASE_MS + 300).saturating_sub(sent.elapsed())).await;
    let retry = post(&url, &[key("late-1")], PAYOUT).await;
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
