//! Unknown outcomes end resolved, never re-executed blindly: the gateway's
//! reconciler asks the provider by the key, with real processes killed,
//! frozen and restarted around it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::path::PathBuf;
use std::time::Duration;

use support::{Gateway, Reply, Site, Upstream, eventually, key, post};

const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;
/// A reference per tenant upstream, so that a lookup by it tells tenants apart.
const FORWARD: &str = "forward_key = { template = \"{scope_digest}:{key}\" }";

/// Routes `payouts` (`/slow`), `payouts-before` (`/slow-before`) and
/// `failing` (`/fail`), each with a lookup at the provider; leases of 2 s (a
/// response timeout just under, so that `/slow-before?ms=1500` is answered)
/// and a reconciler scanning every second.
fn config(site: &Site, up: &Upstream) -> PathBuf {
    let lookup = format!("{}/payouts/by-key/{{forwarded_key}}", up.url());
    let mut text = String::from(
        "response_timeout_ms = 1900\n\
         [reconcile]\ninterval_s = 1\nbackoff_ms = 50\nbackoff_max_ms = 200\nmax_tries = 100\n",
    );
    for (name, path) in [
        ("payouts", "/slow"),
        ("payouts-before", "/slow-before"),
        ("failing", "/fail"),
    ] {
        text.push_str(&format!(
            "[[route]]\nname = \"{name}\"\nmethods = [\"POST\"]\npath = \"{path}\"\nlease_ms = 2000\n{FORWARD}\n\
             [[lookup]]\nroute = \"{name}\"\nurl = \"{lookup}\"\ntimeout_ms = 500\nconnect_timeout_ms = 200\n"
        ));
    }
    site.config(&text)
}

/// Retries until the answer is not a 409 (bounded), returning the last.
async fn retry_until_settled(url: &str, k: &str) -> Reply {
    let mut last = post(url, &[key(k)], PAYOUT).await;
    for _ in 0..100 {
        if last.status != 409 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        last = post(url, &[key(k)], PAYOUT).await;
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_the_effect_the_reconciler_finds_it_and_the_retry_replays() {
    let (up, site) = (Upstream::start().await, Site::new());
    let config = config(&site, &up);
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let url = gw.url("/slow?ms=3000");
    let lost = tokio::spawn(async move { post(&url, &[key("rk-1")], PAYOUT).await });
    assert!(eventually(Duration::from_secs(10), || up.effects().len() == 1).await);
    gw.kill();
    let _ = lost.await;

    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let reply = retry_until_settled(&gw.url("/slow?ms=3000"), "rk-1").await;
    assert_eq!(reply.status, 200, "{reply:?}\n{}", gw.logs());
    assert_eq!(reply.header("idempotent-replayed"), Some("true"));
    assert_eq!(
        reply.body, "{\"payout\":1,\"found_by\":\"lookup\"}",
        "the provider's answer is replayed"
    );
    assert!(up.lookups() >= 1);
    assert_eq!(up.effects().len(), 1, "one effect in total");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_before_the_effect_the_lookup_releases_and_the_retry_runs_once() {
    let (up, site) = (Upstream::start().await, Site::new());
    let config = config(&site, &up);
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let url = gw.url("/slow-before?ms=1500");
    let lost = tokio::spawn(async move { post(&url, &[key("rk-2")], PAYOUT).await });
    assert!(eventually(Duration::from_secs(10), || up.hits() == 1).await);
    gw.kill();
    let _ = lost.await;
    assert_eq!(up.effects().len(), 0, "the upstream never paid");

    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let reply = retry_until_settled(&gw.url("/slow-before?ms=1500"), "rk-2").await;
    assert_eq!(reply.status, 201, "{reply:?}\n{}", gw.logs());
    assert_eq!(
        reply.header("idempotent-replayed"),
        None,
        "executed, not replayed"
    );
    assert_eq!(up.effects().len(), 1, "executed exactly once");
    let again = post(&gw.url("/slow-before?ms=1500"), &[key("rk-2")], PAYOUT).await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(up.effects().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_lookup_down_the_record_stays_ambiguous_and_nothing_executes() {
    let (up, site) = (Upstream::start().await, Site::new());
    up.set_lookup_down(true);
    let config = config(&site, &up);
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    assert_eq!(
        post(&gw.url("/fail"), &[key("rk-3")], PAYOUT).await.status,
        500
    );
    assert!(
        eventually(Duration::from_secs(10), || up.lookups() >= 2).await,
        "the reconciler kept asking"
    );
    for _ in 0..3 {
        let retry = post(&gw.url("/fail"), &[key("rk-3")], PAYOUT).await;
        assert_eq!(
            retry.problem().as_deref(),
            Some("urn:idem:problem:outcome-unknown"),
            "{retry:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(
        up.effects().len(),
        1,
        "the one effect of the first attempt, nothing more"
    );
    // Once the provider answers again, the record resolves to its answer.
    up.set_lookup_down(false);
    let settled = retry_until_settled(&gw.url("/fail"), "rk-3").await;
    assert_eq!(
        (settled.status, settled.header("idempotent-replayed")),
        (200, Some("true"))
    );
    assert_eq!(up.effects().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_frozen_past_its_lease_cannot_complete_late() {
    let (up, site) = (Upstream::start().await, Site::new());
    // No lookups here: the record must stay ambiguous for an operator.
    let config = site.config(
        "response_timeout_ms = 900\n\
         [[route]]\nname = \"payouts\"\nmethods = [\"POST\"]\npath = \"/slow\"\nlease_ms = 1000\n",
    );
    let frozen = Gateway::start(&up.url(), &site.store(), Some(&config));
    let other = Gateway::start(&up.url(), &site.store(), Some(&config));
    let url = frozen.url("/slow?ms=300");
    let first = tokio::spawn(async move { post(&url, &[key("zombie")], PAYOUT).await });
    assert!(eventually(Duration::from_secs(10), || up.effects().len() == 1).await);
    frozen.signal("-STOP");
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let retry = post(&other.url("/slow?ms=300"), &[key("zombie")], PAYOUT).await;
    assert_eq!(
        retry.problem().as_deref(),
        Some("urn:idem:problem:outcome-unknown"),
        "{retry:?}"
    );
    frozen.signal("-CONT");
    // Its client gets the upstream's answer, or, when the response timeout
    // fired during the freeze, 504: either way the write that follows is the
    // frozen attempt's, and it is refused.
    let late = first.await.unwrap();
    assert!(matches!(late.status, 201 | 504), "{late:?}");
    assert!(
        eventually(Duration::from_secs(5), || frozen.logs().contains("fenced")).await,
        "the late completion was refused: {}",
        frozen.logs()
    );
    let store = format!("sqlite://{}", site.store().display());
    let scope = "payouts|anonymous";
    let out = support::idem(&[
        "records", "show", scope, "zombie", "--store", &store, "--format", "json",
    ]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["state"], "ambiguous", "{shown}");
    assert_eq!(up.effects().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_once_resolves_from_the_shell() {
    let (up, site) = (Upstream::start().await, Site::new());
    // The gateway runs without lookups; the operator's config has one.
    let plain = site.config(&format!(
        "[[route]]\nname = \"failing\"\nmethods = [\"POST\"]\npath = \"/fail\"\n{FORWARD}\n"
    ));
    let gw = Gateway::start(&up.url(), &site.store(), Some(&plain));
    assert_eq!(
        post(&gw.url("/fail"), &[key("cron-1")], PAYOUT)
            .await
            .status,
        500
    );
    let with_lookup = site.dir.path().join("reconcile.toml");
    std::fs::write(
        &with_lookup,
        format!(
            "[[route]]\nname = \"failing\"\nmethods = [\"POST\"]\npath = \"/fail\"\n{FORWARD}\n\
             [[lookup]]\nroute = \"failing\"\nurl = \"{}/payouts/by-key/{{forwarded_key}}\"\n",
            up.url()
        ),
    )
    .unwrap();
    let store = format!("sqlite://{}", site.store().display());
    let args = [
        "reconcile",
        "--once",
        "--config",
        with_lookup.to_str().unwrap(),
        "--store",
        &store,
        "--format",
        "json",
    ];
    let out = support::idem(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (report["scanned"].as_u64(), report["completed"].as_u64()),
        (Some(1), Some(1)),
        "{report}"
    );
    let replay = post(&gw.url("/fail"), &[key("cron-1")], PAYOUT).await;
    assert_eq!(
        (replay.status, replay.header("idempotent-replayed")),
        (200, Some("true"))
    );
    // Without any lookup there is nothing to do, and it says so.
    let out = support::idem(&[
        "reconcile",
        "--once",
        "--config",
        plain.to_str().unwrap(),
        "--store",
        &store,
    ]);
    assert_eq!(out.status.code(), Some(2), "the pass cannot run");
    assert!(String::from_utf8_lossy(&out.stderr).contains("declares no [[lookup]]"));
    assert_eq!(up.effects().len(), 1);
}
