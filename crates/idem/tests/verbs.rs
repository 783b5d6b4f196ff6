//! The operator's verbs against the real binary, on SQLite and PostgreSQL:
//! `expire` makes a late retry a 422 `key-expired` that never reaches the
//! upstream, `evict` lets the intent run once more and then replays it,
//! `evict` is refused while an attempt's lease runs, and the journal
//! names the operator and the reason. Each through the CLI (another
//! process sharing the store) and through the admin API; a verb made in
//! another process reaches the replays a gateway keeps in memory. Every
//! test counts the effects the upstream really performed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::time::Duration;

use support::bed::{Bed, Kind};
use support::{Gateway, Reply, eventually, idem, key, post, segment, send, text};

const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;
const TOKEN: &str = "verbs-test-token-8d41c07a95e3";
/// The operator the CLI names with `--by`.
const OPERATOR: &str = "operator:alice";

/// What the verbs' tests ask of a bed, beside what every bed offers.
trait Verbs {
    fn cli_verb(&self, verb: &str, scope: &str, key: &str, token: u64) -> std::process::Output;
    async fn api_verb(&self, verb: &str, scope: &str, key: &str, token: u64) -> Reply;
    async fn pay(&self, key_: &str) -> Reply;
    fn effects(&self, key: &str) -> usize;
}

impl Verbs for Bed {
    /// `idem records VERB SCOPE KEY --token N --reason REASON --by alice`.
    fn cli_verb(&self, verb: &str, scope: &str, key: &str, token: u64) -> std::process::Output {
        let token = token.to_string();
        let reason = format!("{verb} {key}: ticket 4411");
        idem(&[
            "records",
            verb,
            scope,
            key,
            "--token",
            &token,
            "--reason",
            &reason,
            "--by",
            OPERATOR,
            "--store",
            &self.store,
        ])
    }

    /// `POST /records/{scope}/{key}/{verb}` with the token and a reason.
    async fn api_verb(&self, verb: &str, scope: &str, key: &str, token: u64) -> Reply {
        let path = format!("/records/{}/{}/{verb}", segment(scope), segment(key));
        let body = format!(r#"{{"token":{token},"reason":"{verb} {key}: ticket 4412"}}"#);
        self.admin("POST", &path, &body).await
    }

    /// Pays `key` through the gateway: one effect, answered 201.
    async fn pay(&self, key_: &str) -> Reply {
        let paid = post(&self.gw.url("/payouts"), &[key(key_)], PAYOUT).await;
        assert_eq!(paid.status, 201, "{paid:?}");
        paid
    }

    /// The upstream's effects for `key`.
    fn effects(&self, key: &str) -> usize {
        let effects = self.up.effects();
        effects
            .iter()
            .filter(|e| e.key.as_deref() == Some(key))
            .count()
    }
}

/// The journal entries of a `records show --format json` document:
/// (verb, by, reason).
fn journal(doc: &serde_json::Value) -> Vec<(String, String, String)> {
    doc["resolutions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let field = |name: &str| e[name].as_str().unwrap_or("-").to_owned();
            (field("verb"), field("by"), field("reason"))
        })
        .collect()
}

/// (a) and (d): expire a completed record, through the CLI and through
/// the admin API; a late retry is a 422 `key-expired` and never reaches
/// the upstream; the journal names who and why.
async fn expire_then_a_late_retry_is_caught(kind: Kind) {
    let bed = Bed::start(kind, "expire", "", TOKEN).await;
    for (key_, through_cli) in [("exp-cli", true), ("exp-api", false)] {
        bed.pay(key_).await;
        let (scope, token, state) = bed.record(key_).await;
        assert_eq!(state, "completed");
        let (by, reason) = if through_cli {
            let out = bed.cli_verb("expire", &scope, key_, token + 1);
            assert!(!out.status.success(), "another attempt's token expired it");
            assert!(
                text(&out.stderr).contains("nothing was expired"),
                "{}",
                text(&out.stderr)
            );
            let out = bed.cli_verb("expire", &scope, key_, token);
            assert!(out.status.success(), "{}", text(&out.stderr));
            assert!(
                text(&out.stdout).contains("expired"),
                "{}",
                text(&out.stdout)
            );
            (OPERATOR, format!("expire {key_}: ticket 4411"))
        } else {
            let stale = bed.api_verb("expire", &scope, key_, token + 1).await;
            assert_eq!(stale.status, 409, "{stale:?}");
            assert_eq!(
                stale.problem().as_deref(),
                Some("urn:idem:problem:other-attempt")
            );
            let done = bed.api_verb("expire", &scope, key_, token).await;
            assert_eq!(done.status, 200, "{done:?}");
            let answer: serde_json::Value = serde_json::from_str(&done.body).unwrap();
            assert_eq!(answer["record"]["state"], "tombstone", "{answer}");
            assert_eq!(
                answer["record"]["result"],
                serde_json::Value::Null,
                "{answer}"
            );
            ("operator:admin", format!("expire {key_}: ticket 4412"))
        };
        let late = post(&bed.gw.url("/payouts"), &[key(key_)], PAYOUT).await;
        assert_eq!(late.status, 422, "{late:?}");
        assert_eq!(
            late.problem().as_deref(),
            Some("urn:idem:problem:key-expired")
        );
        assert_eq!(bed.effects(key_), 1, "the late retry never ran");
        let (doc, table) = bed.show(&scope, key_);
        assert_eq!(doc["state"], "tombstone", "{doc}");
        let expect = vec![("expire".to_owned(), by.to_owned(), reason.clone())];
        assert_eq!(journal(&doc), expect, "{doc}");
        let line = table
            .lines()
            .find(|l| l.starts_with("expired"))
            .unwrap_or("");
        assert!(
            line.contains(&format!("by {by}")) && line.ends_with(&reason),
            "{table}"
        );
        // Expiring again is refused: it is no longer completed.
        let again = bed.api_verb("expire", &scope, key_, token).await;
        assert_eq!(again.status, 409, "{again:?}");
        assert_eq!(
            again.problem().as_deref(),
            Some("urn:idem:problem:not-completed")
        );
    }
}

/// (b) and (d): evict a completed record, through the CLI and through the
/// admin API; the retry runs once more (the upstream's count goes from 1
/// to 2) and is replayed after that; the journal names who and why.
async fn evict_then_a_retry_runs_once_more_then_replays(kind: Kind) {
    let bed = Bed::start(kind, "evict", "", TOKEN).await;
    for (key_, through_cli) in [("ev-cli", true), ("ev-api", false)] {
        let first = bed.pay(key_).await;
        let (scope, token, _) = bed.record(key_).await;
        let by = if through_cli {
            let out = bed.cli_verb("evict", &scope, key_, token);
            assert!(out.status.success(), "{}", text(&out.stderr));
            OPERATOR
        } else {
            let done = bed.api_verb("evict", &scope, key_, token).await;
            assert_eq!(done.status, 200, "{done:?}");
            let answer: serde_json::Value = serde_json::from_str(&done.body).unwrap();
            assert_eq!(answer["record"], serde_json::Value::Null, "{answer}");
            "operator:admin"
        };
        assert_eq!(bed.effects(key_), 1);
        let rerun = bed.pay(key_).await;
        assert_eq!(rerun.header("idempotent-replayed"), None, "{rerun:?}");
        assert_ne!(rerun.body, first.body, "a new effect, a new answer");
        assert_eq!(bed.effects(key_), 2, "the evicted intent ran once more");
        let replay = bed.pay(key_).await;
        replay.assert_replay_of(&rerun);
        assert_eq!(bed.effects(key_), 2, "and is replayed after that");
        let (doc, table) = bed.show(&scope, key_);
        assert_eq!(doc["state"], "completed", "{doc}");
        let entries = journal(&doc);
        assert_eq!(entries.len(), 1, "{doc}");
        assert_eq!(
            (entries[0].0.as_str(), entries[0].1.as_str()),
            ("evict", by)
        );
        let line = table
            .lines()
            .find(|l| l.starts_with("evicted"))
            .unwrap_or("");
        assert!(line.contains(&format!("by {by}")), "{table}");
    }
    // An unknown key is a 404 through the API and an error through the CLI.
    let (scope, _, _) = bed.record("ev-cli").await;
    let missing = bed.api_verb("evict", &scope, "never-seen", 1).await;
    assert_eq!(missing.status, 404, "{missing:?}");
    let out = bed.cli_verb("evict", &scope, "never-seen", 1);
    assert!(!out.status.success() && text(&out.stderr).contains("no record"));
}

/// (c): while the upstream holds an attempt, `evict` is refused through
/// the CLI and the admin API and changes nothing; the attempt completes
/// and is replayed, one effect in all.
async fn evict_is_refused_while_the_lease_runs(kind: Kind) {
    let bed = Bed::start(kind, "held", "", TOKEN).await;
    let url = bed.gw.url("/slow?ms=3000");
    let held = tokio::spawn(async move { post(&url, &[key("held-1")], PAYOUT).await });
    let started = eventually(Duration::from_secs(5), || bed.up.hits() == 1);
    assert!(started.await, "the upstream holds the attempt");
    let (scope, token, state) = bed.record("held-1").await;
    assert_eq!(state, "in_progress");
    let out = bed.cli_verb("evict", &scope, "held-1", token);
    assert!(!out.status.success(), "evicted while the lease runs");
    let said = text(&out.stderr);
    assert!(
        said.contains("may still commit") && said.contains("nothing was evicted"),
        "{said}"
    );
    let refused = bed.api_verb("evict", &scope, "held-1", token).await;
    assert_eq!(refused.status, 409, "{refused:?}");
    assert_eq!(
        refused.problem().as_deref(),
        Some("urn:idem:problem:may-still-commit")
    );
    let (doc, _) = bed.show(&scope, "held-1");
    assert_eq!(
        (doc["state"].as_str(), doc["token"].as_u64()),
        (Some("in_progress"), Some(token))
    );
    assert_eq!(journal(&doc), vec![], "a refusal journals nothing");
    let first = held.await.unwrap();
    assert_eq!(first.status, 201, "{first:?}");
    let retry = post(&bed.gw.url("/slow?ms=3000"), &[key("held-1")], PAYOUT).await;
    retry.assert_replay_of(&first);
    assert_eq!(bed.effects("held-1"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_expire_then_a_late_retry_is_caught() {
    expire_then_a_late_retry_is_caught(Kind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_expire_then_a_late_retry_is_caught() {
    expire_then_a_late_retry_is_caught(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_evict_then_a_retry_runs_once_more_then_replays() {
    evict_then_a_retry_runs_once_more_then_replays(Kind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_evict_then_a_retry_runs_once_more_then_replays() {
    evict_then_a_retry_runs_once_more_then_replays(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_evict_is_refused_while_the_lease_runs() {
    evict_is_refused_while_the_lease_runs(Kind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_evict_is_refused_while_the_lease_runs() {
    evict_is_refused_while_the_lease_runs(Kind::Postgres).await;
}

/// Retries `key_` through `gw` until an answer is not a replay of `first`
/// (the kept answer), for at most five seconds, and returns it; every
/// answer before it must be that replay.
async fn first_answer_not_replayed(gw: &Gateway, key_: &str, first: &Reply) -> Option<Reply> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        let retry = post(&gw.url("/payouts"), &[key(key_)], PAYOUT).await;
        if retry.header("idempotent-replayed").is_none() {
            return Some(retry);
        }
        retry.assert_replay_of(first);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// A verb made in another process (the CLI, or another gateway's admin
/// API on the same store) reaches the replays a gateway keeps in memory:
/// the gateway stops replaying an expired key and runs an evicted one once
/// more. Before the store counted verbs, the first gateway replayed both
/// from memory until it restarted.
async fn a_verb_made_elsewhere_reaches_the_replays_kept_in_memory(kind: Kind) {
    let bed = Bed::start(kind, "elsewhere", "", TOKEN).await;
    let (other, other_admin) = Gateway::start_admin_url(&bed.up.url(), &bed.store, None, TOKEN);
    let keys = [
        "far-exp-cli",
        "far-evict-cli",
        "far-exp-api",
        "far-evict-api",
    ];
    let mut firsts = Vec::new();
    for key_ in keys {
        let first = bed.pay(key_).await;
        // The first replay is read from the store and kept; the next ones
        // are answered from memory.
        for _ in 0..3 {
            bed.pay(key_).await.assert_replay_of(&first);
        }
        firsts.push(first);
    }
    for (key_, first) in keys.iter().zip(&firsts) {
        let (scope, token, _) = bed.record(key_).await;
        let verb = if key_.contains("exp") {
            "expire"
        } else {
            "evict"
        };
        if key_.ends_with("cli") {
            let out = bed.cli_verb(verb, &scope, key_, token);
            assert!(out.status.success(), "{}", text(&out.stderr));
        } else {
            let path = format!("/records/{}/{}/{verb}", segment(&scope), segment(key_));
            let body = format!(r#"{{"token":{token},"reason":"{verb} on the other node"}}"#);
            let auth = format!("Bearer {TOKEN}");
            let url = format!("http://{other_admin}{path}");
            let done = send("POST", &url, &[("authorization", &auth)], &body).await;
            assert_eq!(done.status, 200, "{done:?}");
        }
        let Some(answer) = first_answer_not_replayed(&bed.gw, key_, first).await else {
            panic!("{kind:?}: the first gateway still replays {key_} after {verb}");
        };
        let status = if verb == "expire" { 422 } else { 201 };
        assert_eq!(answer.status, status, "{key_}: {answer:?}");
        let effects = if verb == "expire" { 1 } else { 2 };
        assert_eq!(bed.effects(key_), effects, "{key_}");
    }
    drop(other);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_verb_made_elsewhere_reaches_the_replays_kept_in_memory() {
    a_verb_made_elsewhere_reaches_the_replays_kept_in_memory(Kind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_verb_made_elsewhere_reaches_the_replays_kept_in_memory() {
    a_verb_made_elsewhere_reaches_the_replays_kept_in_memory(Kind::Postgres).await;
}
