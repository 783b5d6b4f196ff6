//! Failures that must not hang or degrade silently, through `idem serve`:
//! a burst over `requests_in_flight_max` is shed at once with 503
//! `overloaded` and nothing forwarded; a PostgreSQL primary that stops
//! answering turns into 503 `store-unavailable` within
//! `operation_timeout_ms`, nothing forwarded; an SQLite store whose writer
//! thread panicked stops the gateway with an error naming the panic,
//! instead of leaving it answering 503 forever.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use idem_core::{Clock, SystemClock, Timestamp};
use idem_gateway::{GatewayConfig, Overrides};
use idem_sqlite::{SqliteOptions, SqliteStore};
use support::{Gateway, PgSchema, Site, Upstream, key, post};

const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_in_flight_limit_are_shed_and_never_forwarded() {
    // (limit, requests sent at once): exactly the excess is shed.
    for (limit, sent) in [(1, 3), (4, 7)] {
        let up = Upstream::start().await;
        let site = Site::new();
        let config = site.config(&format!("requests_in_flight_max = {limit}\n"));
        let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
        let url = gw.url("/slow?ms=3000");
        let replies: Vec<_> = (0..sent)
            .map(|i| {
                let url = url.clone();
                tokio::spawn(async move { post(&url, &[key(&format!("shed-{i}"))], PAYOUT).await })
            })
            .collect();
        let mut shed = Vec::new();
        let mut served = 0;
        for (i, reply) in replies.into_iter().enumerate() {
            let reply = reply.await.unwrap();
            match reply.status {
                201 => served += 1,
                503 => {
                    assert_eq!(
                        reply.problem().as_deref(),
                        Some("urn:idem:problem:overloaded"),
                        "{reply:?}"
                    );
                    assert_eq!(reply.header("retry-after"), Some("1"), "{reply:?}");
                    shed.push(i);
                }
                _ => panic!("limit {limit}: unexpected {reply:?}"),
            }
        }
        assert_eq!((served, shed.len()), (limit, sent - limit), "limit {limit}");
        assert_eq!(
            up.effects().len(),
            limit,
            "limit {limit}: the upstream's effects"
        );
        assert_eq!(
            up.hits(),
            limit,
            "limit {limit}: shed requests were forwarded"
        );
        // Nothing was claimed for a shed request: its key runs now, once,
        // even for another request (a claim would make that 409 or 422).
        for i in shed {
            let again = post(&gw.url("/payouts"), &[key(&format!("shed-{i}"))], PAYOUT).await;
            assert_eq!(again.status, 201, "{again:?}");
            assert_eq!(again.header("idempotent-replayed"), None, "{again:?}");
        }
        assert_eq!(up.effects().len(), sent, "limit {limit}");
    }
}

/// The operation deadline the gateway's store is given, in its URL.
const OPERATION_TIMEOUT_MS: u64 = 1_000;
/// What a refusal may take beyond the deadline (a loaded machine).
const SLACK_MS: u64 = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_postgres_primary_answers_503_quickly_and_forwards_nothing() {
    let up = Upstream::start().await;
    let schema = PgSchema::new("frozen");
    let (relay, store_url) = schema.through_relay().await;
    let store_url = format!("{store_url}&operation_timeout_ms={OPERATION_TIMEOUT_MS}");
    let gw = Gateway::start_url(&up.url(), &store_url, None);
    let first = post(&gw.url("/payouts"), &[key("before-freeze")], PAYOUT).await;
    assert_eq!(first.status, 201, "{first:?}");

    relay.freeze();
    for attempt in ["frozen-1", "frozen-2", "before-freeze"] {
        let started = Instant::now();
        let reply = tokio::time::timeout(
            Duration::from_secs(30),
            post(&gw.url("/payouts"), &[key(attempt)], PAYOUT),
        )
        .await
        .unwrap_or_else(|_| panic!("{attempt}: the gateway hung behind a frozen primary"));
        let took_ms = started.elapsed().as_millis() as u64;
        assert_eq!(reply.status, 503, "{attempt}: {reply:?}");
        assert_eq!(
            reply.problem().as_deref(),
            Some("urn:idem:problem:store-unavailable"),
            "{attempt}"
        );
        assert!(
            took_ms <= OPERATION_TIMEOUT_MS + SLACK_MS,
            "{attempt}: answered after {took_ms} ms, the bound is {OPERATION_TIMEOUT_MS} ms"
        );
    }
    assert_eq!(up.hits(), 1, "a request was forwarded without a claim");

    // The primary answers again: the gateway recovers, and the frozen
    // attempts were never acquired.
    relay.thaw();
    let after = post(&gw.url("/payouts"), &[key("frozen-1")], PAYOUT).await;
    assert_eq!(after.status, 201, "{after:?}");
    assert_eq!(after.header("idempotent-replayed"), None, "{after:?}");
    post(&gw.url("/payouts"), &[key("before-freeze")], PAYOUT)
        .await
        .assert_replay_of(&first);
    assert_eq!(up.effects().len(), 2);
}

/// A clock that panics once armed: the SQLite writer reads it inside its
/// batch, so arming it kills the writer thread for real.
#[derive(Default)]
struct TrapClock {
    armed: AtomicBool,
}

impl Clock for TrapClock {
    fn now(&self) -> Timestamp {
        assert!(!self.armed.load(Ordering::SeqCst), "the clock trap fired");
        SystemClock.now()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_sqlite_writer_stops_the_gateway_with_an_error() {
    let up = Upstream::start().await;
    let site = Site::new();
    let clock = Arc::new(TrapClock::default());
    let store = SqliteStore::open_with_clock(site.store(), SqliteOptions::default(), clock.clone())
        .unwrap();
    let overrides = Overrides {
        upstream: Some(up.url()),
        ..Overrides::default()
    };
    let config = GatewayConfig::load(None, &overrides).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/payouts", listener.local_addr().unwrap());
    let gateway = tokio::spawn(async move {
        idem_gateway::serve(&config, Arc::new(store), listener, std::future::pending()).await
    });
    let first = post(&url, &[key("before-death")], PAYOUT).await;
    assert_eq!(first.status, 201, "{first:?}");

    clock.armed.store(true, Ordering::SeqCst);
    let refused = post(&url, &[key("at-death")], PAYOUT).await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(
        refused.problem().as_deref(),
        Some("urn:idem:problem:store-unavailable")
    );
    let stopped = tokio::time::timeout(Duration::from_secs(30), gateway)
        .await
        .expect("the gateway kept running on a dead store")
        .unwrap();
    let e = stopped.expect_err("the gateway must stop with an error");
    assert!(e.to_string().contains("the clock trap fired"), "{e}");
    assert!(e.to_string().contains("stopped for good"), "{e}");
    assert_eq!(up.hits(), 1, "a request was forwarded without a claim");
}
