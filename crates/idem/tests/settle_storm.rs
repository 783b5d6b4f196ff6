//! A retry storm on one unknown outcome, through the real binary: fifty
//! retries at once of a key whose attempt failed after it was sent, on a
//! route whose provider answers "not found" slowly while the attempt's
//! lease still runs. One lookup answers them all, and its "not yet" keeps
//! the next retries from asking again before the lease is over; no retry
//! holds the others up behind lookups of its own.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::time::Instant;

use support::{Gateway, PgSchema, Site, Upstream, key, post};

const PAYOUT: &str = r#"{"seller":847,"amount":1200}"#;
/// Retries sent at once.
const STORM: usize = 50;
/// How long the provider takes to say "not found".
const LOOKUP_MS: u64 = 400;

async fn one_lookup_answers_a_storm(store: &str) {
    let (up, site) = (Upstream::start().await, Site::new());
    let config = site.config(&format!(
        "response_timeout_ms = 2000\nrequests_in_flight_max = 256\n\
         [reconcile]\ninterval_s = 3600\n\
         [[route]]\nname = \"failing\"\nmethods = [\"POST\"]\npath = \"/fail\"\nlease_ms = 20000\n\
         forward_key = {{ template = \"{{scope_digest}}:{{key}}\" }}\n\
         [[lookup]]\nroute = \"failing\"\nurl = \"{}/missing/by-key/{{forwarded_key}}?ms={LOOKUP_MS}\"\n\
         timeout_ms = 2000\nconnect_timeout_ms = 200\n",
        up.url()
    ));
    let gw = Gateway::start_url(&up.url(), store, Some(&config));
    let url = gw.url("/fail");
    let first = post(&url, &[key("storm-1")], PAYOUT).await;
    assert_eq!(first.status, 500, "{first:?}");
    let looked_before = up.lookups();

    let started = Instant::now();
    let storm: Vec<_> = (0..STORM)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { post(&url, &[key("storm-1")], PAYOUT).await })
        })
        .collect();
    for retry in storm {
        let reply = retry.await.unwrap();
        assert_eq!(reply.status, 409, "{reply:?}");
        assert_eq!(
            reply.problem().as_deref(),
            Some("urn:idem:problem:outcome-unknown")
        );
    }
    let storm_ms = started.elapsed().as_millis();
    println!(
        "{STORM} retries answered in {storm_ms} ms with {} lookups of {LOOKUP_MS} ms",
        up.lookups() - looked_before
    );
    assert_eq!(
        up.lookups() - looked_before,
        1,
        "one lookup for the storm:\n{}",
        gw.logs()
    );

    // The "not yet" holds until the lease is over: the next retry asks nothing.
    let next = post(&url, &[key("storm-1")], PAYOUT).await;
    assert_eq!(next.status, 409, "{next:?}");
    assert_eq!(
        up.lookups() - looked_before,
        1,
        "not asked again before the lease ends"
    );
    assert_eq!(up.effects().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lookup_answers_a_retry_storm_on_sqlite() {
    let site = Site::new();
    one_lookup_answers_a_storm(&format!("sqlite://{}", site.store().display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lookup_answers_a_retry_storm_on_postgres() {
    let schema = PgSchema::new("settle_storm");
    one_lookup_answers_a_storm(&schema.store_url()).await;
}
