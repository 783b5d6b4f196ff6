//! `idem reconcile --once` from cron: its exit code says whether anything
//! needs a person (0 nothing, 1 something, 2 it could not run at all), and
//! its failed lookups add up across runs until the record is left for an
//! operator, after which the provider is not asked again.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;

use support::{Gateway, PgSchema, Site, Upstream, key, post};

const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;

/// The gateway's config: route `failing` (`/fail`, the upstream pays and
/// answers 500, so the outcome is unknown), without a lookup, so that only
/// the cron runs reconcile.
fn gateway_config(site: &Site) -> PathBuf {
    site.config(&format!("{ROUTE}\n"))
}

/// The route both the gateway and the cron job declare: a looked-up route
/// forwards a reference that names the scope.
const ROUTE: &str = "[[route]]\nname = \"failing\"\nmethods = [\"POST\"]\npath = \"/fail\"\n\
                     forward_key = { template = \"{scope_digest}:{key}\" }";

/// The cron job's config: the same route with a lookup at the provider,
/// two tries, and a backoff of 1 ms so that each run may ask again.
fn cron_config(site: &Site, up: &Upstream) -> PathBuf {
    let path = site.dir.path().join("reconcile.toml");
    let text = format!(
        "[reconcile]\nmax_tries = 2\nbackoff_ms = 1\nbackoff_max_ms = 1\n\
         {ROUTE}\n\
         [[lookup]]\nroute = \"failing\"\nurl = \"{}/payouts/by-key/{{forwarded_key}}\"\n\
         timeout_ms = 500\nconnect_timeout_ms = 200\n",
        up.url()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `idem reconcile --once --format json` with `config` on `store`.
fn reconcile(config: &Path, store: &str) -> Output {
    support::idem(&[
        "reconcile",
        "--once",
        "--config",
        config.to_str().unwrap(),
        "--store",
        store,
        "--format",
        "json",
    ])
}

/// The report's counts that matter here, and the exit code.
fn counts(out: &Output) -> (Option<i32>, [u64; 4]) {
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let n = |field: &str| report[field].as_u64().unwrap();
    let counted = [n("completed"), n("retried"), n("gave_up"), n("waiting")];
    (out.status.code(), counted)
}

/// A record whose outcome is unknown, made by a real gateway on `store`.
async fn ambiguous(site: &Site, up: &Upstream, store: &str, k: &str) {
    let gw = Gateway::start_url(&up.url(), store, Some(&gateway_config(site)));
    let lost = post(&gw.url("/fail"), &[key(k)], PAYOUT).await;
    assert_eq!(lost.status, 500, "{}", gw.logs());
}

/// Lookups answering 503: every run exits 1; the second failure leaves
/// the record for an operator, and later runs say so without asking the
/// provider. Once an operator resolved it and the provider answers, a run
/// that completes another record exits 0, and so does one with nothing
/// to do.
async fn cron_runs(site: &Site, up: &Upstream, store: &str) {
    ambiguous(site, up, store, "cron-503").await;
    up.set_lookup_down(true);
    let config = cron_config(site, up);
    // (exit code, [completed, retried, gave_up, waiting], lookups so far)
    let runs: [(Option<i32>, [u64; 4], usize); 3] = [
        (Some(1), [0, 1, 0, 0], 1),
        (Some(1), [0, 0, 1, 0], 2),
        (Some(1), [0, 0, 1, 0], 2),
    ];
    for (run, (code, counted, lookups)) in runs.into_iter().enumerate() {
        std::thread::sleep(std::time::Duration::from_millis(2)); // the 1 ms backoff
        let out = reconcile(&config, store);
        let log = String::from_utf8_lossy(&out.stderr);
        assert_eq!(counts(&out), (code, counted), "run {run}: {log}");
        assert_eq!(up.lookups(), lookups, "run {run}: lookups asked");
    }
    let last = reconcile(&config, store);
    let log = String::from_utf8_lossy(&last.stderr);
    assert!(log.contains("needs an operator"), "a run warns: {log}");

    ambiguous(site, up, store, "cron-found").await;
    up.set_lookup_down(false);
    let (scope, token) = listed(store, "cron-503");
    let out = support::idem(&[
        "records",
        "resolve",
        "--store",
        store,
        &scope,
        "cron-503",
        "--token",
        &token,
        "--completed",
        "--reason",
        "paid, per the provider's ledger",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = reconcile(&config, store);
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(counts(&out), (Some(0), [1, 0, 0, 0]), "{log}");
    let out = reconcile(&config, store);
    assert_eq!(counts(&out), (Some(0), [0, 0, 0, 0]), "nothing left to do");
    assert_eq!(up.effects().len(), 2, "one effect per key, none added");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cron_runs_on_sqlite_exit_1_while_a_lookup_fails_and_give_up_after_max_tries() {
    let (up, site) = (Upstream::start().await, Site::new());
    let store = format!("sqlite://{}", site.store().display());
    cron_runs(&site, &up, &store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cron_runs_on_postgres_exit_1_while_a_lookup_fails_and_give_up_after_max_tries() {
    let (up, site, schema) = (Upstream::start().await, Site::new(), PgSchema::new("cron"));
    cron_runs(&site, &up, &schema.store_url()).await;
}

/// The scope and token of the record with key `k`, as `idem records list`
/// shows them.
fn listed(store: &str, k: &str) -> (String, String) {
    let out = support::idem(&["records", "list", "--store", store, "--format", "json"]);
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let record = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == k)
        .unwrap();
    (
        record["scope"].as_str().unwrap().to_owned(),
        record["token"].to_string(),
    )
}

/// A run that cannot start exits 2, whatever the reason, and asks nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_cannot_start_exits_2() {
    let (up, site) = (Upstream::start().await, Site::new());
    let config = cron_config(&site, &up);
    let store = format!("sqlite://{}", site.store().display());
    let missing_dir = format!("sqlite://{}/no/such/dir/idem.db", site.dir.path().display());
    let garbage = site.dir.path().join("garbage.toml");
    std::fs::write(&garbage, "[[route]\nname = \"\"\"\n").unwrap();
    let without_lookup = gateway_config(&site);
    let nowhere = site.dir.path().join("typo.db");
    let typo = format!("sqlite://{}", nowhere.display());
    let cases: [(&str, &Path, &str); 6] = [
        ("a store file that does not exist", &config, &typo),
        (
            "a missing config file",
            Path::new("/nonexistent/idem.toml"),
            &store,
        ),
        ("a config that does not parse", &garbage, &store),
        ("a config without any [[lookup]]", &without_lookup, &store),
        ("a store that cannot be opened", &config, &missing_dir),
        (
            "a store URL of no known kind",
            &config,
            "redis://127.0.0.1/0",
        ),
    ];
    for (name, config, store) in cases {
        let out = reconcile(config, store);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "{name}: no report");
    }
    assert_eq!(up.lookups(), 0);
    assert!(!nowhere.exists(), "a mistyped store is not created");
}
