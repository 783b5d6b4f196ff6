//! The gauges an on-call alerts on, black-box: `idem serve`'s `/metrics`
//! on SQLite (or a DynamoDB emulator's table, as scripts/test.sh runs it)
//! and PostgreSQL and `idem consume`'s on NATS follow the store
//! — an ambiguous record counted and its age growing, its failing lookups,
//! the suspect window opened by `idem store mark-restored`, a waiter held
//! on an attempt, a store that stops answering the sampler — and every
//! metric the alert rules in docs/alerts/idem.rules.yml name is one a live
//! process exposes.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use support::broker::{Bed, Broker, Sub, consume_toml, payout};
use support::nats::Nats;
use support::{
    Consumer, Gateway, PgSchema, Site, Upstream, eventually, idem, key, logged_field, metric, post,
    send, text,
};

const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;
const TOKEN: &str = "gauges-test-token-8d1e5b3a72c4";
/// How long a gauge may take to follow the store: samples every second.
const WAIT: Duration = Duration::from_secs(15);

/// A gateway whose `/fail` route has a lookup (down in these tests, so its
/// ambiguous record stays, its lookups failing), whose `/slow-before` route
/// holds a key long enough to wait on, and whose gauges are sampled every
/// second.
fn gateway_config(site: &Site, up: &Upstream) -> std::path::PathBuf {
    let lookup = format!("{}/payouts/by-key/{{forwarded_key}}", up.url());
    site.config(&format!(
        "gauge_sample_interval_s = 1\nresponse_timeout_ms = 1900\n\
         [reconcile]\ninterval_s = 1\nbackoff_ms = 50\nbackoff_max_ms = 200\nmax_tries = 100\n\n\
         [[route]]\nname = \"failing\"\nmethods = [\"POST\"]\npath = \"/fail\"\n\
         forward_key = {{ template = \"{{scope_digest}}:{{key}}\" }}\n\n\
         [[lookup]]\nroute = \"failing\"\nurl = \"{lookup}\"\ntimeout_ms = 500\nconnect_timeout_ms = 200\n\n\
         [[route]]\nname = \"slow\"\nmethods = [\"POST\"]\npath = \"/slow-before\"\nlease_ms = 5000\n"
    ))
}

async fn scrape(addr: SocketAddr) -> String {
    let auth = format!("Bearer {TOKEN}");
    let url = format!("http://{addr}/metrics");
    let reply = send("GET", &url, &[("authorization", &auth)], "").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.body
}

/// Polls `series` on the page `page_of` returns until `check` holds; the
/// last page when it never did.
async fn until_metric(
    limit: Duration,
    page_of: impl AsyncFn() -> String,
    series: &str,
    check: impl Fn(f64) -> bool,
) -> Result<f64, String> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let page = page_of().await;
        if let Some(v) = metric(&page, series)
            && check(v)
        {
            return Ok(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(page);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn mark_restored(store_url: &str) {
    let args = [
        "store",
        "mark-restored",
        "--store",
        store_url,
        "--since",
        "2026-01-01T00:00:00Z",
    ];
    let out = idem(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// The gateway's gauges through one ambiguous record, the suspect window
/// and a waiter, on the store at `store_url` (reached directly by the CLI
/// at `cli_url`).
async fn gateway_gauges_follow_the_store(
    up: &Upstream,
    site: &Site,
    (store_url, cli_url): (&str, &str),
) -> (Gateway, SocketAddr) {
    let config = gateway_config(site, up);
    let (gw, admin) = Gateway::start_admin_url(&up.url(), store_url, Some(&config), TOKEN);
    let page = || scrape(admin);
    let sampled = until_metric(
        WAIT,
        page,
        "idem_gauge_last_sample_timestamp_seconds",
        |v| v > 0.0,
    );
    sampled.await.unwrap();
    let page = scrape(admin).await;
    let at_start = [
        ("idem_ambiguous_records", 0.0),
        ("idem_ambiguous_oldest_age_seconds", 0.0),
        ("idem_ambiguous_lookups_failing", 0.0),
        ("idem_suspect_window_open", 0.0),
        ("idem_gauge_sample_failed", 0.0),
        ("idem_waiters", 0.0),
        ("idem_waiters_max", 4096.0),
    ];
    for (series, want) in at_start {
        assert_eq!(metric(&page, series), Some(want), "{series}\n{page}");
    }

    // An ambiguous record: counted, its age growing, its lookups failing.
    up.set_lookup_down(true);
    assert_eq!(
        post(&gw.url("/fail"), &[key("g-1")], PAYOUT).await.status,
        500
    );
    let page = || scrape(admin);
    until_metric(WAIT, page, "idem_ambiguous_records", |v| v == 1.0)
        .await
        .unwrap();
    let first_age = metric(&scrape(admin).await, "idem_ambiguous_oldest_age_seconds").unwrap();
    let page = || scrape(admin);
    let grown = until_metric(WAIT, page, "idem_ambiguous_oldest_age_seconds", |v| {
        v >= first_age + 1.5
    });
    grown.await.unwrap();
    let page = || scrape(admin);
    until_metric(WAIT, page, "idem_ambiguous_lookups_failing", |v| v == 1.0)
        .await
        .unwrap();

    // The suspect window, opened by the operator.
    mark_restored(cli_url);
    let page = || scrape(admin);
    until_metric(WAIT, page, "idem_suspect_window_open", |v| v == 1.0)
        .await
        .unwrap();
    let remaining = metric(
        &scrape(admin).await,
        "idem_suspect_window_remaining_seconds",
    );
    assert!(remaining.is_some_and(|s| s > 0.0), "{remaining:?}");

    // A waiter held on a running attempt, then gone.
    let url = gw.url("/slow-before?ms=1500");
    let first = tokio::spawn(async move { post(&url, &[key("w-1")], PAYOUT).await });
    assert!(
        eventually(WAIT, || up.hits() >= 2).await,
        "the attempt runs"
    );
    let url = gw.url("/slow-before?ms=1500");
    let waiter =
        tokio::spawn(async move { post(&url, &[key("w-1"), ("prefer", "wait=10")], PAYOUT).await });
    let page = || scrape(admin);
    until_metric(WAIT, page, "idem_waiters", |v| v == 1.0)
        .await
        .unwrap();
    assert_eq!(first.await.unwrap().status, 201);
    let waited = waiter.await.unwrap();
    assert_eq!(
        waited.header("idempotent-replayed"),
        Some("true"),
        "{waited:?}"
    );
    assert_eq!(metric(&scrape(admin).await, "idem_waiters"), Some(0.0));
    (gw, admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_gauges_follow_the_store_on_its_own_store() {
    let (up, site) = (Upstream::start().await, Site::new());
    let url = format!("sqlite://{}", site.store().display());
    gateway_gauges_follow_the_store(&up, &site, (&url, &url)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_gauges_follow_the_store_on_postgres_and_a_silent_store_is_visible() {
    let (up, site) = (Upstream::start().await, Site::new());
    let schema = PgSchema::new("gauges");
    let (relay, through) = schema.through_relay().await;
    let url = format!("{through}&operation_timeout_ms=1000&connect_timeout_ms=1000");
    let (_gw, admin) =
        gateway_gauges_follow_the_store(&up, &site, (&url, &schema.store_url())).await;
    // The store stops answering: the sample fails, the last values stay,
    // and the failure is visible.
    relay.freeze();
    let page = || scrape(admin);
    until_metric(WAIT, page, "idem_gauge_sample_failed", |v| v == 1.0)
        .await
        .unwrap();
    let page = scrape(admin).await;
    assert_eq!(metric(&page, "idem_ambiguous_records"), Some(1.0), "{page}");
    assert!(metric(&page, "idem_gauge_sample_failures_total").is_some_and(|n| n >= 1.0));
}

/// Starts `idem consume` with `subs` and a probe listener of its own,
/// sampling every second; returns it and the probe listener's address.
fn start_consumer(bed: &Bed<Nats>, subs: &[Sub]) -> (Consumer, SocketAddr) {
    let text = format!(
        "probe_listen = \"127.0.0.1:0\"\ngauge_sample_interval_s = 1\n{}",
        consume_toml::<Nats>(&bed.store_url(), &bed.up, subs)
    );
    let consumer = Consumer::start(&bed.site.config(&text), subs.len());
    let addr = consumer
        .log
        .lock()
        .unwrap()
        .iter()
        .find_map(|line| logged_field(line, "probe_addr"))
        .expect("the probe address is logged");
    (consumer, addr.parse().unwrap())
}

async fn consumer_page(addr: SocketAddr) -> String {
    let reply = send("GET", &format!("http://{addr}/metrics"), &[], "").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(
        reply.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    reply.body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_serves_the_gauges_per_subscription() {
    let bed = Bed::<Nats>::new().await;
    let (pay, refund) = (Nats::unique("gauges-pay"), Nats::unique("gauges-refund"));
    let failing = Sub {
        deliver: "/fail".into(),
        ..Sub::new(&pay)
    };
    let quiet = Sub {
        name: "refunds".into(),
        ..Sub::new(&refund)
    };
    bed.up.set_lookup_down(true);
    let (consumer, addr) = start_consumer(&bed, &[failing, quiet]);
    bed.publish(&pay, &payout(847, "2026-W36", 1200), "m-1")
        .await;

    let payouts = |name: &str| format!("{name}{{subscription=\"payouts\"}}");
    let page = || consumer_page(addr);
    let series = payouts("idem_ambiguous_records");
    let ambiguous = until_metric(WAIT, page, &series, |v| v == 1.0);
    ambiguous
        .await
        .unwrap_or_else(|page| panic!("{page}\n{}", consumer.logs()));
    let page = consumer_page(addr).await;
    let refunds = "idem_ambiguous_records{subscription=\"refunds\"}";
    assert_eq!(metric(&page, refunds), Some(0.0), "{page}");
    let first_age = metric(&page, &payouts("idem_ambiguous_oldest_age_seconds")).unwrap();
    let page = || consumer_page(addr);
    let series = payouts("idem_ambiguous_oldest_age_seconds");
    until_metric(WAIT, page, &series, |v| v >= first_age + 1.5)
        .await
        .unwrap();
    let page = || consumer_page(addr);
    let series = payouts("idem_ambiguous_lookups_failing");
    until_metric(WAIT, page, &series, |v| v == 1.0)
        .await
        .unwrap();

    mark_restored(&bed.store_url());
    let page = || consumer_page(addr);
    until_metric(WAIT, page, "idem_suspect_window_open", |v| v == 1.0)
        .await
        .unwrap();
    let page = consumer_page(addr).await;
    assert!(
        !page.contains("idem_claims_total"),
        "no HTTP families: {page}"
    );
    assert!(
        page.contains("idem_purged_total{what=\"deleted\"}"),
        "{page}"
    );
    drop(consumer);
    bed.delete(&[&pay, &refund]).await;
}

/// One rule of docs/alerts/idem.rules.yml, as Prometheus reads it.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    alert: String,
    expr: String,
    #[serde(rename = "for")]
    for_: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Group {
    name: String,
    rules: Vec<Rule>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    groups: Vec<Group>,
}

/// The `idem_…` names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("idem_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// The families a `/metrics` page declares (`# TYPE name kind`).
fn families(page: &str) -> Vec<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_alert_rule_names_metrics_a_live_gateway_or_consumer_exposes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let rules = std::fs::read_to_string(root.join("docs/alerts/idem.rules.yml")).unwrap();
    let file: RuleFile = serde_yaml_ng::from_str(&rules).unwrap();
    let operations = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();

    let (up, site) = (Upstream::start().await, Site::new());
    let (_gw, admin) = Gateway::start_admin(&up.url(), &site.store(), None, TOKEN);
    let bed = Bed::<Nats>::new().await;
    let dest = Nats::unique("gauges-rules");
    let (_consumer, probes) = start_consumer(&bed, &[Sub::new(&dest)]);
    let gateway = families(&scrape(admin).await);
    let consumer = families(&consumer_page(probes).await);

    let expected = [
        "IdemAmbiguousBacklogGrowing",
        "IdemOldestAmbiguousTooOld",
        "IdemSuspectWindowOpen",
        "IdemWaitersNearBound",
        "IdemLookupsFailing",
        "IdemGaugeSamplerFailing",
    ];
    let rules: Vec<&Rule> = file.groups.iter().flat_map(|g| &g.rules).collect();
    let names: Vec<&str> = rules.iter().map(|r| r.alert.as_str()).collect();
    assert_eq!(names, expected);
    assert!(file.groups.iter().all(|g| !g.name.is_empty()));
    for rule in rules {
        let used = metric_names(&rule.expr);
        assert!(!used.is_empty(), "{}: no idem metric", rule.alert);
        for name in used {
            assert!(
                gateway.contains(&name) || consumer.contains(&name),
                "{}: {name} is exposed by neither /metrics",
                rule.alert
            );
        }
        assert!(!rule.for_.is_empty(), "{}", rule.alert);
        let severity = rule.labels.get("severity").map(String::as_str);
        assert!(
            matches!(severity, Some("page" | "warning")),
            "{}",
            rule.alert
        );
        // The runbook annotation names a heading of docs/operations.md.
        let runbook = &rule.annotations["runbook"];
        let anchor = runbook
            .strip_prefix("docs/operations.md#")
            .unwrap_or_else(|| panic!("{}: {runbook}", rule.alert));
        assert_eq!(anchor, rule.alert.to_lowercase(), "{}", rule.alert);
        let heading = format!("\n### {}\n", rule.alert);
        assert!(
            operations.contains(&heading),
            "{}: no runbook section",
            rule.alert
        );
    }
    bed.delete(&[&dest]).await;
}
