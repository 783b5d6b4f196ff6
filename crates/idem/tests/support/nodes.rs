//! Many gateway nodes, one memory: the cases every store shared by several
//! `idem serve` processes must pass (PostgreSQL, DynamoDB), each over the
//! store URL its test file makes.

use std::time::Duration;

use super::{Gateway, Upstream, eventually, key, post};

const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;

/// Two gateways on `store`: a duplicate sent to either while the first
/// runs is told it is in progress; both replay it afterwards; one effect.
pub async fn two_nodes_make_one_effect(store: &str) {
    let up = Upstream::start().await;
    let nodes = [
        Gateway::start_url(&up.url(), store, None),
        Gateway::start_url(&up.url(), store, None),
    ];
    let first = tokio::spawn({
        let url = nodes[0].url("/slow?ms=2000");
        async move { post(&url, &[key("n-1")], PAYOUT).await }
    });
    assert!(eventually(Duration::from_secs(10), || up.effects().len() == 1).await);
    let duplicates: Vec<_> = (0..31)
        .map(|i| {
            let url = nodes[i % 2].url("/slow?ms=2000");
            tokio::spawn(async move { post(&url, &[key("n-1")], PAYOUT).await })
        })
        .collect();
    for handle in duplicates {
        let reply = handle.await.unwrap();
        assert_eq!(reply.status, 409, "{reply:?}");
        assert_eq!(
            reply.problem().as_deref(),
            Some("urn:idem:problem:request-in-progress")
        );
    }
    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    for node in &nodes {
        let replay = post(&node.url("/slow?ms=2000"), &[key("n-1")], PAYOUT).await;
        replay.assert_replay_of(&first);
    }
    assert_eq!(up.effects().len(), 1);
}

/// 32 requests for a key nobody holds, split across two gateways on
/// `store`: one acquires, 31 are told it is in progress; one effect.
pub async fn fresh_claims_split_across_nodes_make_one_effect(store: &str) {
    let up = Upstream::start().await;
    let nodes = [
        Gateway::start_url(&up.url(), store, None),
        Gateway::start_url(&up.url(), store, None),
    ];
    // All 32 race for a key nobody holds yet.
    let replies: Vec<_> = (0..32)
        .map(|i| {
            let url = nodes[i % 2].url("/slow?ms=500");
            tokio::spawn(async move { post(&url, &[key("race-1")], PAYOUT).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for handle in replies {
        statuses.push(handle.await.unwrap().status);
    }
    statuses.sort_unstable();
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 409).count(),
        31,
        "{statuses:?}"
    );
    assert_eq!(up.effects().len(), 1);
}

/// `idem records list --store` reads what a gateway on `store` wrote.
pub async fn records_commands_read_the_store(store: &str) {
    let up = Upstream::start().await;
    let gw = Gateway::start_url(&up.url(), store, None);
    assert_eq!(
        post(&gw.url("/payouts"), &[key("rec-1")], PAYOUT)
            .await
            .status,
        201
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["records", "list", "--format", "json", "--store", store])
        .envs(super::dynamo::AWS_ENV.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(records[0]["key"], "rec-1");
    assert_eq!(records[0]["state"], "completed");
    assert_eq!(records[0]["result"]["status"], 201);
}
