//! A lookup asks the provider by the exact reference the gateway forwarded,
//! so two tenants who chose the same key are never confused: through a real
//! `idem serve` and `idem reconcile --once` in front of the payout API, one
//! tenant's payout is never replayed to another, and a config whose lookup
//! cannot tell tenants apart is refused (`serve`, `reconcile`) or failed
//! (`check --gateway`), naming the file and the field.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::{Gateway, Reply, Site, Upstream, eventually, idem, key, post, text};

const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;

/// One route `payouts` on every path, its tenant from `x-tenant-id`, a
/// lease of 500 ms (a response timeout of 400 ms within it), and a lookup at the provider: `route_extra` and `url`
/// (relative to the upstream) are what each case varies.
fn config(site: &Site, up: &Upstream, route_extra: &str, url: &str) -> PathBuf {
    site.config(&format!(
        "response_timeout_ms = 400\n\
         [reconcile]\ninterval_s = 3600\n\
         [[route]]\nname = \"payouts\"\nmethods = [\"POST\"]\npath = \"/**\"\nlease_ms = 500\n\
         principal = {{ header = \"x-tenant-id\" }}\n{route_extra}\n\
         [[lookup]]\nroute = \"payouts\"\nurl = \"{}{url}\"\ntimeout_ms = 500\n",
        up.url()
    ))
}

/// The safe config: the forwarded reference holds the scope digest, and the
/// lookup asks by it.
fn safe_config(site: &Site, up: &Upstream) -> PathBuf {
    config(
        site,
        up,
        "forward_key = { template = \"{scope_digest}:{key}\" }",
        "/payouts/by-key/{forwarded_key}",
    )
}

async fn as_tenant(url: &str, tenant: &str, k: &str) -> Reply {
    post(url, &[("x-tenant-id", tenant), key(k)], PAYOUT).await
}

fn reconcile_once(config: &Path, store: &Path) -> serde_json::Value {
    let store = format!("sqlite://{}", store.display());
    let out = idem(&[
        "reconcile",
        "--once",
        "--config",
        config.to_str().unwrap(),
        "--store",
        &store,
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_with_one_key_each_get_their_own_outcome() {
    let (up, site) = (Upstream::start().await, Site::new());
    let config = safe_config(&site, &up);
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));

    // Tenant A is paid, then the answer is lost (500 after paying).
    let a = as_tenant(&gw.url("/fail"), "tenant-a", "k").await;
    assert_eq!(a.status, 500, "{a:?}");
    // Tenant B's attempt with the same key never reaches the ledger (503
    // before paying): an unknown outcome too.
    let b = as_tenant(&gw.url("/busy-once"), "tenant-b", "k").await;
    assert_eq!(b.status, 503, "{b:?}");
    assert_eq!(up.effects().len(), 1, "only A was paid");
    let forwarded_a = up.effects()[0].key.clone().unwrap();
    assert!(
        forwarded_a.ends_with(":k") && forwarded_a.len() > 2,
        "{forwarded_a}"
    );

    let report = reconcile_once(&config, &site.store());
    assert_eq!(report["scanned"], 2, "{report}");
    assert_eq!(
        report["completed"], 1,
        "only A's reference is known: {report}"
    );

    // A's retry replays A's own payout, found by the lookup.
    let a_retry = as_tenant(&gw.url("/fail"), "tenant-a", "k").await;
    assert_eq!(
        (a_retry.status, a_retry.body.as_str()),
        (200, "{\"payout\":1,\"found_by\":\"lookup\"}"),
        "{a_retry:?}"
    );
    assert_eq!(a_retry.header("idempotent-replayed"), Some("true"));

    // B's record was not completed with A's payout: B still waits for its
    // own outcome, which the provider does not know.
    let b_retry = as_tenant(&gw.url("/busy-once"), "tenant-b", "k").await;
    assert_eq!(
        b_retry.problem().as_deref(),
        Some("urn:idem:problem:outcome-unknown"),
        "{b_retry:?}"
    );
    // Once B's lease is over, "not found" proves B was never paid: the
    // record is released and B's retry pays B, once.
    let store = site.store();
    assert!(
        eventually(Duration::from_secs(10), || {
            reconcile_once(&config, &store)["released"] == 1
        })
        .await,
        "B's record is released once its lease is over"
    );
    let b_paid = as_tenant(&gw.url("/busy-once"), "tenant-b", "k").await;
    assert_eq!(
        (b_paid.status, b_paid.body.as_str()),
        (201, "{\"payout\":2}"),
        "{b_paid:?}"
    );
    let effects = up.effects();
    assert_eq!(effects.len(), 2, "{effects:?}");
    assert_ne!(effects[0].key, effects[1].key, "two references upstream");
}

/// The finding `idem check --gateway` reports for the route, and its exit code.
fn check_lookup_tenancy(config: &Path) -> (Option<i32>, serde_json::Value) {
    let path = config.to_str().unwrap();
    let out = idem(&["check", "--gateway", path, "--format", "json"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stderr)));
    let finding = doc[0]["gateway"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["topic"] == "gateway.lookup_tenancy")
        .cloned()
        .unwrap_or_else(|| panic!("no gateway.lookup_tenancy in {doc}"));
    (out.status.code(), finding)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_that_cannot_tell_tenants_apart_is_refused_and_reported() {
    let up = Upstream::start().await;
    // (route lines, lookup path, what serve and reconcile say; None: they run)
    let cases: [(&str, &str, Option<&str>); 5] = [
        (
            "",
            "/payouts/by-key/{forwarded_key}",
            Some("idem.toml: route[0].forward_key.template: lookup[0] serves route \"payouts\""),
        ),
        (
            "forward_key = { header = \"x-upstream-key\", template = \"pay-{key}\" }",
            "/payouts/by-key/{forwarded_key}",
            Some("idem.toml: route[0].forward_key.template: lookup[0]"),
        ),
        (
            "forward_key = { template = \"{scope_digest}:{key}\" }",
            "/payouts/by-key/{key}",
            Some("idem.toml: lookup[0].url: "),
        ),
        (
            "forward_key = { template = \"{scope_digest}:{key}\" }",
            "/payouts/by-key/{Forwarded_Key}",
            Some("idem.toml: lookup[0].url: "),
        ),
        (
            "forward_key = { template = \"{key}.{scope_digest}\" }",
            "/payouts/by-key/{forwarded_key}?x={key}",
            None,
        ),
    ];
    for (route_extra, url, refusal) in cases {
        let site = Site::new();
        let config = config(&site, &up, route_extra, url);
        let store = format!("sqlite://{}", site.store().display());
        let (config_arg, store_arg) = (config.to_str().unwrap(), store.as_str());
        let reconcile = idem(&[
            "reconcile",
            "--once",
            "--config",
            config_arg,
            "--store",
            store_arg,
        ]);
        let Some(want) = refusal else {
            // The config is accepted; the pass stops only at the store,
            // which a reconciler never creates.
            let err = text(&reconcile.stderr);
            assert_eq!(reconcile.status.code(), Some(2), "{err}");
            assert!(err.contains("there is no store"), "{err}");
            let (code, finding) = check_lookup_tenancy(&config);
            assert_eq!((code, &finding["verdict"]), (Some(0), &"PASS".into()));
            continue;
        };
        let serve = idem(&[
            "serve",
            "--upstream",
            &up.url(),
            "--config",
            config_arg,
            "--store",
            store_arg,
        ]);
        // `idem serve` fails with 1; `idem reconcile --once` with 2, its code
        // for a pass that cannot run at all.
        for (what, out, code) in [("serve", &serve, 1), ("reconcile", &reconcile, 2)] {
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(code), "{what} {url}: {err}");
            assert!(err.contains(want), "{what} {url}: {err}");
            assert!(err.contains("{forwarded_key}"), "says what to write: {err}");
        }
        assert!(!site.store().exists(), "nothing was opened");
        if want.contains("lookup[0].url") {
            // Not a lookup at all: the config is invalid wherever it is read.
            let out = idem(&["check", "--gateway", config_arg]);
            assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
            assert!(text(&out.stderr).contains(want), "{}", text(&out.stderr));
        } else {
            // Judged offline, it is a failing finding that says what to write.
            let (code, finding) = check_lookup_tenancy(&config);
            assert_eq!((code, &finding["verdict"]), (Some(1), &"FAIL".into()));
            let change = finding["change"].as_str().unwrap_or_default();
            assert!(change.contains("{scope_digest}:{key}"), "{finding}");
        }
    }
}
