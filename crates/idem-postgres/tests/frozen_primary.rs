//! A primary that stops answering (frozen, or behind a network black hole)
//! fails every store operation with `Unavailable` within
//! `operation_timeout_ms` instead of hanging it, acquires nothing, and the
//! store works again once the server answers, on fresh connections. The
//! server is frozen for this test only: its connections go through a
//! loopback relay that stops forwarding.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::{Duration, Instant};

use idem_core::{Claim, ListQuery, Store, StoreError, StoredResult, Token};
use idem_postgres::{PgOptions, PgStore};
use idem_testkit::relay::Relay;
use support::{SchemaGuard, id, request, url};

/// The operation deadline the stores under test are given, in the URL.
const OPERATION_TIMEOUT_MS: u64 = 800;
/// What a failing operation may take beyond its deadline (a loaded machine).
const SLACK_MS: u64 = 1_500;

/// The test server's address, from its URL.
fn server_addr() -> SocketAddr {
    let url = url();
    let config: tokio_postgres::Config = url.parse().unwrap();
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(host) => host.clone(),
        other => panic!("the test server must be reached over TCP, not {other:?}"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let host = if host == "localhost" {
        "127.0.0.1".to_owned()
    } else {
        host
    };
    format!("{host}:{port}").parse().unwrap()
}

/// The test URL through `relay`, with the deadline as idem's own parameter.
fn url_via(relay: &Relay, schema: &str) -> String {
    let url = url();
    let (user, rest) = url.split_once('@').unwrap();
    let (_, path) = rest.split_once('/').unwrap();
    let sep = if path.contains('?') { '&' } else { '?' };
    format!(
        "{user}@{}/{path}{sep}schema={schema}&operation_timeout_ms={OPERATION_TIMEOUT_MS}",
        relay.addr()
    )
}

/// A store of one connection through `relay`.
async fn store_via(relay: &Relay, schema: &SchemaGuard) -> PgStore {
    let options = PgOptions {
        pool_size: 1,
        ..PgOptions::default()
    };
    PgStore::connect(&url_via(relay, schema.name()), options)
        .await
        .unwrap()
}

type Op<'a> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;

/// Every operation of the store, each reduced to whether it succeeded.
fn operations(store: &PgStore, token: Token) -> Vec<(&'static str, Op<'_>)> {
    vec![
        (
            "claim",
            Box::pin(async move {
                store
                    .claim(&request("frozen-new", 1, 30_000))
                    .await
                    .map(drop)
            }),
        ),
        (
            "get",
            Box::pin(async move { store.get(&id("frozen-new")).await.map(drop) }),
        ),
        (
            "list",
            Box::pin(async move { store.list(&ListQuery::default()).await.map(drop) }),
        ),
        (
            "complete",
            Box::pin(async move {
                let result = StoredResult::new(201, vec![], b"paid".to_vec()).unwrap();
                store.complete(&id("before"), token, result).await.map(drop)
            }),
        ),
        (
            "release",
            Box::pin(async move { store.release(&id("before"), token).await }),
        ),
        (
            "purge",
            Box::pin(async move { store.purge(10).await.map(drop) }),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_primary_fails_every_operation_within_the_deadline() {
    let schema = SchemaGuard::new();
    let direct = schema.store(None).await;
    let relay = Relay::start(server_addr()).await.unwrap();
    let store = store_via(&relay, &schema).await;
    let before = store.claim(&request("before", 1, 30_000)).await.unwrap();
    let Claim::Acquired { token, .. } = before else {
        panic!("a fresh key is acquired, got {before:?}");
    };

    relay.freeze();
    for (name, op) in operations(&store, token) {
        let started = Instant::now();
        let out = tokio::time::timeout(Duration::from_secs(30), op)
            .await
            .unwrap_or_else(|_| panic!("{name} hung behind a frozen primary"));
        let took_ms = started.elapsed().as_millis() as u64;
        match out {
            Err(StoreError::Unavailable { reason, .. }) => {
                assert!(reason.contains("operation_timeout_ms"), "{name}: {reason}");
            }
            other => panic!("{name}: want Unavailable, got {other:?}"),
        }
        assert!(
            took_ms <= OPERATION_TIMEOUT_MS + SLACK_MS,
            "{name} took {took_ms} ms, the bound is {OPERATION_TIMEOUT_MS} ms"
        );
    }
    // The claim sent while frozen never reached the server: nothing was
    // acquired, and the record from before is untouched.
    assert_eq!(direct.get(&id("frozen-new")).await.unwrap(), None);
    let kept = direct.get(&id("before")).await.unwrap().unwrap();
    assert_eq!(
        (kept.token, kept.state),
        (token, idem_core::State::InProgress)
    );

    // Answering again: the frozen connection was closed, not reused.
    relay.thaw();
    let after = store.claim(&request("after", 1, 30_000)).await;
    assert!(matches!(after, Ok(Claim::Acquired { .. })), "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_a_frozen_primary_fails_within_the_deadline() {
    let schema = SchemaGuard::new();
    let relay = Relay::start(server_addr()).await.unwrap();
    relay.freeze();
    let started = Instant::now();
    let connected = tokio::time::timeout(
        Duration::from_secs(30),
        PgStore::connect(
            &format!(
                "{}&connect_timeout_ms={OPERATION_TIMEOUT_MS}",
                url_via(&relay, schema.name())
            ),
            PgOptions::default(),
        ),
    )
    .await
    .expect("connect hung behind a frozen primary");
    let took_ms = started.elapsed().as_millis() as u64;
    assert!(
        matches!(connected, Err(StoreError::Unavailable { .. })),
        "{:?}",
        connected.err()
    );
    assert!(
        took_ms <= OPERATION_TIMEOUT_MS + SLACK_MS,
        "connect took {took_ms} ms, the bound is {OPERATION_TIMEOUT_MS} ms"
    );
}
