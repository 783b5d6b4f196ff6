//! After a restore, verify before executing, through the real binary: a
//! store restored from a backup (`idem store restore` on SQLite, `idem
//! store mark-restored` on PostgreSQL) has forgotten the intents written
//! after the backup; while its suspect window is open, each of their
//! redeliveries is looked up at the provider by its forwarded key and
//! answered with the provider's answer, never executed again. A provider
//! that cannot answer gets 503 and nothing forwarded, and nothing is lost
//! when it returns. Without a lookup the redeliveries run again and are
//! counted as unverified.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use support::{Gateway, PgSchema, Site, Upstream, idem, key, metric, post, send, text};

const TRANSFER: &str = r#"{"account":847,"amount":1200,"currency":"EUR"}"#;
const TOKEN: &str = "restore-test-admin-token-0123456789";
/// Intents run after the backup was taken: the restored store forgets them.
const INTENTS: usize = 200;
/// The route's lease: a "not found" counts only once every lease that
/// began before the window opened has ended.
const LEASE_MS: u64 = 1000;

fn config(site: &Site, up: &Upstream, lookup: bool) -> PathBuf {
    let lookup = if lookup {
        format!(
            "[[lookup]]\nroute = \"transfers\"\nurl = \"{}/transfers/by-key/{{forwarded_key}}\"\n\
             timeout_ms = 500\nconnect_timeout_ms = 200\n",
            up.url()
        )
    } else {
        String::new()
    };
    site.config(&format!(
        "response_timeout_ms = 800\n\
         [[route]]\nname = \"transfers\"\nmethods = [\"POST\"]\npath = \"/transfers\"\n\
         lease_ms = {LEASE_MS}\nforward_key = {{ template = \"{{scope_digest}}:{{key}}\" }}\n\
         {lookup}"
    ))
}

/// Sends intent `i` once.
async fn send_intent(gw: &Gateway, i: usize) -> support::Reply {
    post(
        &gw.url("/transfers"),
        &[key(&format!("intent-{i}"))],
        TRANSFER,
    )
    .await
}

/// Sends intents `range` once each; every one is answered 200 and runs.
async fn run_intents(gw: &Gateway, range: std::ops::Range<usize>) -> Vec<support::Reply> {
    let mut replies = Vec::new();
    for i in range {
        let reply = send_intent(gw, i).await;
        assert_eq!(reply.status, 200, "intent {i}: {reply:?}");
        replies.push(reply);
    }
    replies
}

/// Delivers intents `0..firsts.len()` once more: each is answered exactly
/// as the first time.
async fn redeliver_replays(gw: &Gateway, firsts: &[support::Reply]) {
    for (i, first) in firsts.iter().enumerate() {
        let key_i = format!("intent-{i}");
        let again = post(&gw.url("/transfers"), &[key(&key_i)], TRANSFER).await;
        assert_eq!(
            (again.status, &again.body),
            (first.status, &first.body),
            "{key_i}"
        );
    }
}

/// Backs up an empty store, runs intents 0 to 4, restores the backup and
/// starts a gateway with the admin API on it: the store has forgotten all
/// five. The first answers of the five.
async fn forget_five(
    up: &Upstream,
    site: &Site,
    cfg: &Path,
) -> (Gateway, std::net::SocketAddr, Vec<support::Reply>) {
    let gw = Gateway::start(&up.url(), &site.store(), Some(cfg));
    let copy = site.dir.path().join("backup.db");
    backup(&site.store(), &copy);
    let firsts = run_intents(&gw, 0..5).await;
    drop(gw);
    let restored = restore(&site.store(), &copy);
    assert!(restored.status.success(), "{}", text(&restored.stderr));
    let (gw, admin) = Gateway::start_admin(&up.url(), &site.store(), Some(cfg), TOKEN);
    (gw, admin, firsts)
}

/// Keys the upstream executed more than once.
fn executed_twice(up: &Upstream) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut twice = BTreeSet::new();
    for effect in up.effects() {
        let key = effect.key.unwrap_or_default();
        if !seen.insert(key.clone()) {
            twice.insert(key);
        }
    }
    twice.into_iter().collect()
}

async fn metrics(admin: std::net::SocketAddr) -> String {
    let auth = format!("Bearer {TOKEN}");
    let page = send(
        "GET",
        &format!("http://{admin}/metrics"),
        &[("authorization", &auth)],
        "",
    )
    .await;
    assert_eq!(page.status, 200, "{page:?}");
    page.body
}

fn window_claims(page: &str, outcome: &str) -> f64 {
    metric(
        page,
        &format!("idem_window_claims_total{{outcome=\"{outcome}\"}}"),
    )
    .unwrap_or(-1.0)
}

fn backup(store: &Path, to: &Path) {
    let out = idem(&[
        "store",
        "backup",
        "--store",
        &format!("sqlite://{}", store.display()),
        "--to",
        to.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

fn restore(store: &Path, from: &Path) -> std::process::Output {
    idem(&[
        "store",
        "restore",
        "--store",
        &format!("sqlite://{}", store.display()),
        "--from",
        from.to_str().unwrap(),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_sqlite_store_verifies_the_intents_it_forgot() {
    let (up, site) = (Upstream::start().await, Site::new());
    let cfg = config(&site, &up, true);
    let (gw, _) = Gateway::start_admin(&up.url(), &site.store(), Some(&cfg), TOKEN);
    let before = run_intents(&gw, 0..10).await;
    let copy = site.dir.path().join("backup.db");
    backup(&site.store(), &copy);
    let firsts = run_intents(&gw, 10..10 + INTENTS).await;

    // A restore while the gateway has the store open is refused, and
    // changes nothing.
    let refused = restore(&site.store(), &copy);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("another process has the store open"),
        "{}",
        text(&refused.stderr)
    );
    drop(gw);

    let restored = restore(&site.store(), &copy);
    assert!(restored.status.success(), "{}", text(&restored.stderr));
    let said = text(&restored.stdout);
    assert!(said.contains("10 records"), "{said}");
    assert!(said.contains("suspect window open until"), "{said}");
    let replaced: Vec<_> = std::fs::read_dir(site.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".replaced-"))
        .collect();
    assert_eq!(replaced.len(), 1, "the replaced store is kept: {said}");

    let (gw, admin) = Gateway::start_admin(&up.url(), &site.store(), Some(&cfg), TOKEN);
    // Every intent is delivered once more: the ten the backup holds replay
    // from the store; the rest are answered by the provider's lookup.
    let all: Vec<_> = before.into_iter().chain(firsts).collect();
    redeliver_replays(&gw, &all).await;
    assert_eq!(executed_twice(&up), Vec::<String>::new(), "executed twice");
    assert_eq!(up.effects().len(), 10 + INTENTS, "nothing ran again");
    let page = metrics(admin).await;
    assert_eq!(window_claims(&page, "executed"), INTENTS as f64, "{page}");

    // A new intent inside the window: the provider has no such key, but an
    // attempt the store forgot could still have been running until its
    // lease ended, so the first answer may be 503; then it runs, once.
    let url = gw.url("/transfers");
    let mut answer = post(&url, &[key("new-after-restore")], TRANSFER).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while answer.status == 503 {
        assert_eq!(
            answer.problem().as_deref(),
            Some("urn:idem:problem:unverified")
        );
        assert!(answer.header("retry-after").is_some(), "{answer:?}");
        assert!(!answer.body.contains("backup.db"), "{}", answer.body);
        assert!(std::time::Instant::now() < deadline, "{answer:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        answer = post(&url, &[key("new-after-restore")], TRANSFER).await;
    }
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(up.effects().len(), 11 + INTENTS, "the new intent ran once");

    // Every fresh key inside the window asks the provider, so many at once
    // must all be answered: the lookups are bounded by the requests the
    // gateway serves at once, not by the reconciler's background slots.
    let sends = (0..CONCURRENT).map(|i| {
        let url = url.clone();
        tokio::spawn(async move { post(&url, &[key(&format!("burst-{i}"))], TRANSFER).await })
    });
    for (i, sent) in sends.collect::<Vec<_>>().into_iter().enumerate() {
        let reply = sent.await.unwrap();
        assert_eq!(reply.status, 200, "burst {i}: {reply:?}");
    }
    assert_eq!(up.effects().len(), 11 + INTENTS + CONCURRENT);
    let page = metrics(admin).await;
    assert_eq!(
        window_claims(&page, "not_executed"),
        (1 + CONCURRENT) as f64,
        "{page}"
    );
}

/// Fresh keys sent at once inside the window.
const CONCURRENT: usize = 48;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inside_the_window_a_provider_that_cannot_answer_stops_nothing_and_loses_nothing() {
    let (up, site) = (Upstream::start().await, Site::new());
    let cfg = config(&site, &up, true);
    let (gw, admin, firsts) = forget_five(&up, &site, &cfg).await;
    up.set_lookup_down(true);
    for i in 0..5 {
        let reply = send_intent(&gw, i).await;
        assert_eq!(reply.status, 503, "intent {i}: {reply:?}");
        assert_eq!(
            reply.problem().as_deref(),
            Some("urn:idem:problem:unverified")
        );
        assert_eq!(reply.header("retry-after"), Some("1"));
        // Neither the backup's path nor the provider's lookup URL reaches
        // the client: they are the operator's, in the log.
        for private in ["backup.db", "/transfers/by-key/", "127.0.0.1"] {
            assert!(!reply.body.contains(private), "{private}: {}", reply.body);
        }
    }
    assert_eq!(up.effects().len(), 5, "nothing forwarded while unverified");
    let page = metrics(admin).await;
    assert_eq!(window_claims(&page, "lookup_failed"), 5.0, "{page}");

    up.set_lookup_down(false);
    redeliver_replays(&gw, &firsts).await;
    assert_eq!(up.effects().len(), 5, "nothing ran twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_lookup_the_forgotten_intents_run_again_and_are_counted() {
    let (up, site) = (Upstream::start().await, Site::new());
    let cfg = config(&site, &up, false);
    let (gw, admin, _) = forget_five(&up, &site, &cfg).await;
    run_intents(&gw, 0..5).await;
    assert_eq!(executed_twice(&up).len(), 5, "no lookup, no way to know");
    let page = metrics(admin).await;
    assert_eq!(window_claims(&page, "unverified"), 5.0, "{page}");
    assert!(gw.logs().contains("forwarded unverified"), "{}", gw.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_store_marked_restored_verifies_the_intents_it_forgot() {
    let (up, site) = (Upstream::start().await, Site::new());
    let schema = PgSchema::new("restore");
    let cfg = config(&site, &up, true);
    let url = schema.store_url();
    let gw = Gateway::start_url(&up.url(), &url, Some(&cfg));
    let firsts = run_intents(&gw, 0..INTENTS).await;
    drop(gw);
    // The operator's own restore to a point before the intents: their
    // records are gone.
    schema
        .execute(&format!("DELETE FROM {}.records", schema.name))
        .unwrap();
    let marked = idem(&[
        "store",
        "mark-restored",
        "--store",
        &url,
        "--since",
        "2026-01-01T00:00:00Z",
    ]);
    assert!(marked.status.success(), "{}", text(&marked.stderr));
    assert!(text(&marked.stdout).contains("suspect window open until"));

    let gw = Gateway::start_url(&up.url(), &url, Some(&cfg));
    redeliver_replays(&gw, &firsts).await;
    assert_eq!(executed_twice(&up), Vec::<String>::new(), "executed twice");
    assert_eq!(up.effects().len(), INTENTS);
}

#[test]
fn mark_restored_refuses_what_it_cannot_read() {
    let site = Site::new();
    let store = format!("sqlite://{}", site.store().display());
    for (since, expect) in [
        ("yesterday", "is not an RFC 3339 instant"),
        ("2999-01-01T00:00:00Z", "is in the future"),
    ] {
        let out = idem(&[
            "store",
            "mark-restored",
            "--store",
            &store,
            "--since",
            since,
        ]);
        assert!(!out.status.success());
        assert!(text(&out.stderr).contains(expect), "{}", text(&out.stderr));
    }
    let out = idem(&[
        "store",
        "mark-restored",
        "--store",
        &store,
        "--since",
        "2026-01-01T00:00:00Z",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("there is no store"),
        "{}",
        text(&out.stderr)
    );
    assert!(!site.store().exists(), "nothing created");
}
