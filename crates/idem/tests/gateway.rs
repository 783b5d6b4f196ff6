//! The gateway as a user meets it: `idem serve` as a separate process in
//! front of a payout API on loopback, driven over HTTP. Every test counts the
//! effects the upstream really performed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::time::Duration;

use support::{Gateway, Site, Upstream, eventually, key, post};

const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_duplicate_is_one_effect_and_an_identical_replay() {
    let (up, site) = (Upstream::start().await, Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let first = post(&gw.url("/payouts"), &[key("p-1")], PAYOUT).await;
    let second = post(&gw.url("/payouts"), &[key("\"p-1\"")], PAYOUT).await;
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(first.header("idempotent-replayed"), None);
    second.assert_replay_of(&first);
    assert_eq!(second.header("content-type"), first.header("content-type"));
    assert_eq!(second.header("location"), Some("/payouts/1"));
    assert_eq!(
        second.header("x-not-replayed"),
        None,
        "only allow-listed headers are replayed"
    );
    let effects = up.effects();
    assert_eq!(effects.len(), 1);
    assert_eq!(
        effects[0].key.as_deref(),
        Some("p-1"),
        "the key is forwarded upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_against_a_slow_upstream_are_one_effect() {
    let (up, site) = (Upstream::start().await, Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let url = gw.url("/slow?ms=1500");
    let first = tokio::spawn({
        let url = url.clone();
        async move { post(&url, &[key("c-1")], PAYOUT).await }
    });
    assert!(eventually(Duration::from_secs(10), || up.effects().len() == 1).await);
    let duplicates: Vec<_> = (0..15)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { post(&url, &[key("c-1")], PAYOUT).await })
        })
        .collect();
    for handle in duplicates {
        let reply = handle.await.unwrap();
        assert_eq!(reply.status, 409, "{reply:?}");
        assert_eq!(
            reply.problem().as_deref(),
            Some("urn:idem:problem:request-in-progress")
        );
        let retry_after: u64 = reply
            .header("retry-after")
            .expect("Retry-After")
            .parse()
            .unwrap();
        assert!((1..=30).contains(&retry_after), "{retry_after}");
    }
    assert_eq!(first.await.unwrap().status, 201);
    assert_eq!(up.effects().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_different_payload_under_the_same_key_is_rejected() {
    let (up, site) = (Upstream::start().await, Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), None);
    assert_eq!(
        post(&gw.url("/payouts"), &[key("d-1")], PAYOUT)
            .await
            .status,
        201
    );
    let reused = post(
        &gw.url("/payouts"),
        &[key("d-1")],
        r#"{"seller":847,"amount":99999}"#,
    )
    .await;
    assert_eq!(reused.status, 422);
    assert_eq!(
        reused.problem().as_deref(),
        Some("urn:idem:problem:key-reused")
    );
    assert!(reused.body.contains("Idempotency-Key is already used"));
    // Reordered members and whitespace are the same request (RFC 8785).
    let reordered = post(
        &gw.url("/payouts"),
        &[key("d-1")],
        r#"{ "currency":"EUR","amount":1200, "seller":847 }"#,
    )
    .await;
    assert_eq!(reordered.status, 201);
    assert_eq!(reordered.header("idempotent-replayed"), Some("true"));
    assert_eq!(up.effects().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_malformed_and_oversized_requests_are_refused_before_any_claim() {
    let (up, site) = (Upstream::start().await, Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let url = gw.url("/payouts");
    let long = "k".repeat(256);
    type Case<'a> = (Vec<(&'a str, &'a str)>, String, u16, &'a str);
    let cases: Vec<Case> = vec![
        (vec![], PAYOUT.into(), 400, "missing-key"),
        (vec![key("")], PAYOUT.into(), 400, "invalid-key"),
        (vec![key(&long)], PAYOUT.into(), 400, "invalid-key"),
        (
            vec![key("\"unterminated")],
            PAYOUT.into(),
            400,
            "invalid-key",
        ),
        (vec![key("has space")], PAYOUT.into(), 400, "invalid-key"),
        (vec![key("m-1")], "{\"seller\":".into(), 400, "invalid-body"),
        (
            vec![key("m-1")],
            "{\"a\":1,\"a\":2}".into(),
            400,
            "invalid-body",
        ),
        (
            vec![key("m-1")],
            format!("{{\"pad\":\"{}\"}}", "x".repeat(1024 * 1024)),
            413,
            "body-too-large",
        ),
    ];
    for (headers, body, status, problem) in cases {
        let reply = post(&url, &headers, &body).await;
        assert_eq!(reply.status, status, "{headers:?}: {reply:?}");
        assert_eq!(
            reply.problem(),
            Some(format!("urn:idem:problem:{problem}")),
            "{headers:?}"
        );
        assert_eq!(
            reply.header("content-type"),
            Some("application/problem+json")
        );
    }
    assert_eq!(up.hits(), 0, "nothing was forwarded");
    // Nothing was claimed either: the same key with a good body executes once.
    assert_eq!(post(&url, &[key("m-1")], PAYOUT).await.status, 201);
    assert_eq!(up.effects().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_principals_with_one_key_are_two_intents() {
    let (up, site) = (Upstream::start().await, Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let url = gw.url("/payouts");
    let alice = post(
        &url,
        &[key("same"), ("authorization", "Bearer alice")],
        PAYOUT,
    )
    .await;
    let bob = post(
        &url,
        &[key("same"), ("authorization", "Bearer bob")],
        PAYOUT,
    )
    .await;
    assert_eq!((alice.status, bob.status), (201, 201));
    assert_eq!(bob.header("idempotent-replayed"), None, "no cross-replay");
    assert_ne!(alice.body, bob.body);
    let alice_again = post(
        &url,
        &[key("same"), ("authorization", "Bearer alice")],
        PAYOUT,
    )
    .await;
    assert_eq!(alice_again.body, alice.body);
    assert_eq!(up.effects().len(), 2);
    let db = std::fs::read(site.store()).unwrap_or_default();
    let wal = std::fs::read(site.store().with_extension("db-wal")).unwrap_or_default();
    for bytes in [db, wal] {
        assert!(
            !String::from_utf8_lossy(&bytes).contains("Bearer"),
            "raw credentials must never be stored"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_4xx_is_replayed_not_retried() {
    let (up, site) = (Upstream::start().await, Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let first = post(&gw.url("/reject"), &[key("r-1")], PAYOUT).await;
    let again = post(&gw.url("/reject"), &[key("r-1")], PAYOUT).await;
    assert_eq!(first.status, 400);
    again.assert_replay_of(&first);
    assert_eq!(up.hits(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_500_is_never_re_executed_blindly() {
    let (up, site) = (Upstream::start().await, Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let first = post(&gw.url("/fail"), &[key("f-1")], PAYOUT).await;
    assert_eq!(first.status, 500, "the client sees the upstream's answer");
    for _ in 0..3 {
        let retry = post(&gw.url("/fail"), &[key("f-1")], PAYOUT).await;
        assert_eq!(retry.status, 409, "{retry:?}");
        assert_eq!(
            retry.problem().as_deref(),
            Some("urn:idem:problem:outcome-unknown")
        );
        assert!(retry.header("retry-after").is_some());
    }
    assert_eq!(up.effects().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_releases_the_key_only_where_the_route_opts_in() {
    let (up, site) = (Upstream::start().await, Site::new());
    // This upstream answers 503 only before any effect; by default a 503 is
    // an unknown outcome, so the route says so knowingly.
    let config = site.config(
        "[[route]]\npath = \"/busy-once\"\ncompletion = { release = [503] }\n\n[[route]]\n",
    );
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let first = post(&gw.url("/busy-once"), &[key("b-1")], PAYOUT).await;
    assert_eq!((first.status, up.effects().len()), (503, 0));
    let retry = post(&gw.url("/busy-once"), &[key("b-1")], PAYOUT).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert_eq!(retry.header("idempotent-replayed"), None);
    let replay = post(&gw.url("/busy-once"), &[key("b-1")], PAYOUT).await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(up.effects().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_after_the_effect_never_repeats_it() {
    let (up, site) = (Upstream::start().await, Site::new());
    let config = site
        .config("response_timeout_ms = 900\n[[route]]\nmethods = [\"POST\"]\nlease_ms = 1000\n");
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let url = gw.url("/slow?ms=3000");
    let lost = tokio::spawn(async move { post(&url, &[key("k-1")], PAYOUT).await });
    assert!(eventually(Duration::from_secs(10), || up.effects().len() == 1).await);
    gw.kill();
    let _ = lost.await; // the client saw the connection drop
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let url = gw.url("/slow?ms=3000");
    let during_lease = post(&url, &[key("k-1")], PAYOUT).await;
    assert!(matches!(during_lease.status, 409), "{during_lease:?}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let after_lease = post(&url, &[key("k-1")], PAYOUT).await;
    assert_eq!(after_lease.status, 409, "{after_lease:?}");
    assert_eq!(
        after_lease.problem().as_deref(),
        Some("urn:idem:problem:outcome-unknown")
    );
    assert_eq!(up.effects().len(), 1, "the retry did not pay again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_records_survive_a_restart() {
    let (up, site) = (Upstream::start().await, Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let first = post(&gw.url("/payouts"), &[key("s-1")], PAYOUT).await;
    assert_eq!(first.status, 201);
    gw.kill();
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let replay = post(&gw.url("/payouts"), &[key("s-1")], PAYOUT).await;
    replay.assert_replay_of(&first);
    assert_eq!(up.effects().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_requests_finish_and_be_recorded() {
    let (up, site) = (Upstream::start().await, Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let url = gw.url("/slow?ms=1500");
    let in_flight = tokio::spawn(async move { post(&url, &[key("t-1")], PAYOUT).await });
    assert!(eventually(Duration::from_secs(10), || up.effects().len() == 1).await);
    let status = tokio::task::spawn_blocking(move || gw.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    let reply = in_flight.await.unwrap();
    assert_eq!(
        reply.status, 201,
        "the in-flight request finished: {reply:?}"
    );
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let replay = post(&gw.url("/slow?ms=1500"), &[key("t-1")], PAYOUT).await;
    assert_eq!(
        (replay.status, replay.body.as_str()),
        (201, reply.body.as_str())
    );
    assert_eq!(
        replay.header("idempotent-replayed"),
        Some("true"),
        "and was recorded"
    );
    assert_eq!(up.effects().len(), 1);
}

/// An attempt whose client stopped waiting (answered 202 under
/// `Prefer: respond-async`, or a client that hung up) still runs when
/// SIGTERM comes: the gateway waits for it, so its key is completed, not
/// left in progress to turn into an unknown outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_attempts_whose_client_stopped_waiting() {
    let (up, site) = (Upstream::start().await, Site::new());
    // A tenant of its own: an anonymous caller is never answered 202.
    let config =
        site.config("[[route]]\nmethods = [\"POST\"]\nprincipal = { header = \"x-tenant-id\" }\n");
    let tenant = ("x-tenant-id", "acme");
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let url = gw.url("/slow?ms=1500");
    let prefer = ("prefer", "respond-async");
    let accepted = post(&url, &[tenant, key("t-async"), prefer], PAYOUT).await;
    assert_eq!(accepted.status, 202, "{accepted:?}");
    let headers = [tenant, key("t-gone")];
    let gone = tokio::time::timeout(Duration::from_millis(200), post(&url, &headers, PAYOUT));
    assert!(gone.await.is_err(), "the client hung up before the answer");
    assert!(eventually(Duration::from_secs(10), || up.effects().len() == 2).await);
    let status = tokio::task::spawn_blocking(move || gw.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    for k in ["t-async", "t-gone"] {
        let replay = post(&gw.url("/slow?ms=1500"), &[tenant, key(k)], PAYOUT).await;
        assert_eq!(replay.status, 201, "{k} was completed: {replay:?}");
        assert_eq!(replay.header("idempotent-replayed"), Some("true"), "{k}");
    }
    assert_eq!(up.effects().len(), 2, "each ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_store_fails_closed() {
    let (up, site) = (Upstream::start().await, Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), None);
    assert_eq!(
        post(&gw.url("/payouts"), &[key("u-0")], PAYOUT)
            .await
            .status,
        201
    );
    // Another process holds the write lock: the store cannot be written.
    let blocker = rusqlite::Connection::open(site.store()).unwrap();
    blocker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let reply = post(&gw.url("/payouts"), &[key("u-1")], PAYOUT).await;
    assert_eq!(reply.status, 503, "{reply:?}");
    assert_eq!(
        reply.problem().as_deref(),
        Some("urn:idem:problem:store-unavailable")
    );
    assert_eq!(up.effects().len(), 1, "nothing was forwarded");
    blocker.execute_batch("ROLLBACK").unwrap();
    let recovered = post(&gw.url("/payouts"), &[key("u-1")], PAYOUT).await;
    assert_eq!(recovered.status, 201, "{recovered:?}");
    assert_eq!(up.effects().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_timeout_after_sending_is_an_unknown_outcome() {
    let (up, site) = (Upstream::start().await, Site::new());
    let config = site.config("response_timeout_ms = 300\n");
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let first = post(&gw.url("/slow?ms=2000"), &[key("to-1")], PAYOUT).await;
    assert_eq!(first.status, 504, "{first:?}");
    assert_eq!(
        first.problem().as_deref(),
        Some("urn:idem:problem:upstream-timeout")
    );
    let retry = post(&gw.url("/slow?ms=2000"), &[key("to-1")], PAYOUT).await;
    assert_eq!(
        retry.problem().as_deref(),
        Some("urn:idem:problem:outcome-unknown")
    );
    assert_eq!(up.effects().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_releases_the_key() {
    let site = Site::new();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let gw = Gateway::start(&dead, &site.store(), None);
    let reply = post(&gw.url("/payouts"), &[key("x-1")], PAYOUT).await;
    assert_eq!(reply.status, 502);
    assert_eq!(
        reply.problem().as_deref(),
        Some("urn:idem:problem:upstream-unreachable")
    );
    let again = post(&gw.url("/payouts"), &[key("x-1")], PAYOUT).await;
    assert_eq!(
        again.problem().as_deref(),
        Some("urn:idem:problem:upstream-unreachable"),
        "released, so tried again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_config_controls_forwarding_and_optional_keys() {
    let (up, site) = (Upstream::start().await, Site::new());
    let config = site.config(
        r#"
[[route]]
name = "payouts"
methods = ["POST"]
path = "/payouts"
forward_key = { header = "X-Upstream-Key", template = "{scope_digest}:{key}" }

[[route]]
path = "/reject"
key_required = false
"#,
    );
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    assert_eq!(
        post(&gw.url("/payouts"), &[key("fw-1")], PAYOUT)
            .await
            .status,
        201
    );
    let effect = up.effects().pop().unwrap();
    assert_eq!(effect.key, None, "the key header was renamed");
    let forwarded = effect.upstream_key.unwrap();
    let (digest, key) = forwarded.split_once(':').unwrap();
    assert_eq!((digest.len(), key), (16, "fw-1"));
    // An unlisted path is not protected; an optional key passes through.
    assert_eq!(post(&gw.url("/slow?ms=1"), &[], PAYOUT).await.status, 201);
    assert_eq!(post(&gw.url("/reject"), &[], PAYOUT).await.status, 400);
    assert_eq!(
        post(&gw.url("/reject"), &[], PAYOUT)
            .await
            .header("idempotent-replayed"),
        None
    );
    assert_eq!(up.hits(), 4);
}
