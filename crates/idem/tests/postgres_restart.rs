//! The database restarts under load: the gateway fails closed (503) while
//! PostgreSQL is down, recovers without a restart of its own, and loses no
//! record it had completed. Alone in its test binary, because it stops the
//! server every other PostgreSQL test depends on.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use support::{Gateway, PgSchema, Reply, Upstream, key, post};

const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;

fn cluster(action: &str) {
    let version = std::fs::read_dir("/etc/postgresql")
        .expect("this test restarts the local Debian PostgreSQL cluster (/etc/postgresql)")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .max()
        .expect("a cluster version");
    let status = Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, "main", action])
        .status()
        .expect("pg_ctlcluster");
    assert!(status.success(), "pg_ctlcluster {action}: {status:?}");
}

/// Sends fresh keys one after another until told to stop; returns each key
/// with the reply it got.
async fn stream(
    gw_url: String,
    prefix: &'static str,
    stop: Arc<AtomicBool>,
) -> Vec<(String, Reply)> {
    let mut sent = Vec::new();
    for n in 0..100_000 {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let k = format!("{prefix}-{n}");
        let reply = post(&gw_url, &[key(&k)], PAYOUT).await;
        sent.push((k, reply));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_fails_closed_and_loses_no_completed_record() {
    let up = Upstream::start().await;
    let schema = PgSchema::new("restart");
    let gw = Gateway::start_url(&up.url(), &schema.store_url(), None);
    let url = gw.url("/payouts");

    // Phase 1: traffic while the database is up; every answer is 201.
    let before = stream_for(&url, "before", Duration::from_millis(700)).await;
    assert!(
        before.len() > 10 && before.iter().all(|(_, r)| r.status == 201),
        "{before:?}"
    );

    // Phase 2: traffic across the stop and the start.
    let stop = Arc::new(AtomicBool::new(false));
    let during = tokio::spawn(stream(url.clone(), "during", stop.clone()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    tokio::task::spawn_blocking(|| cluster("stop"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    tokio::task::spawn_blocking(|| cluster("start"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::SeqCst);
    let during = during.await.unwrap();
    let unavailable: Vec<&Reply> = during
        .iter()
        .map(|(_, r)| r)
        .filter(|r| r.status == 503)
        .collect();
    assert!(
        !unavailable.is_empty(),
        "some requests met the stopped database"
    );
    for reply in &unavailable {
        assert_eq!(
            reply.problem().as_deref(),
            Some("urn:idem:problem:store-unavailable"),
            "{reply:?}"
        );
    }
    assert_eq!(
        during.last().map(|(_, r)| r.status),
        Some(201),
        "recovered without a gateway restart"
    );

    // Phase 3: nothing completed before the restart was lost, nothing ran twice.
    for (k, first) in &before {
        let replay = post(&url, &[key(k)], PAYOUT).await;
        replay.assert_replay_of(first);
    }
    for (k, _) in &during {
        let retry = post(&url, &[key(k)], PAYOUT).await;
        assert!(matches!(retry.status, 201 | 409), "{k}: {retry:?}");
    }
    let effects = up.effects();
    for (k, first) in before.iter().chain(&during) {
        let n = effects
            .iter()
            .filter(|e| e.key.as_deref() == Some(k.as_str()))
            .count();
        let expected = if first.status == 503 { 0..=1 } else { 1..=1 };
        assert!(expected.contains(&n), "{k}: {n} effects after {first:?}");
    }
    drop(gw);
}

async fn stream_for(url: &str, prefix: &'static str, how_long: Duration) -> Vec<(String, Reply)> {
    let stop = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn(stream(url.to_owned(), prefix, stop.clone()));
    tokio::time::sleep(how_long).await;
    stop.store(true, Ordering::SeqCst);
    task.await.unwrap()
}
