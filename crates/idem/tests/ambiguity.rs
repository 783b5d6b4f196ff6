//! Why a record is ambiguous, read back from the real binary on SQLite and
//! PostgreSQL: the upstream answers 503 with a body on a route that counts
//! 503 as an unknown outcome, and `idem records show` (JSON and table) and
//! the admin API's `GET /records/{scope}/{key}` show the status, the
//! excerpt of the body, the node and the route's summary of the payout,
//! its amount beyond a double's precision kept exactly. A route without
//! `summary_fields` shows no summary. The caller still gets the upstream's
//! whole answer.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use support::bed::{Bed, Kind};
use support::{key, post, segment};

/// An amount no double holds: 2^64 < it, with a fraction.
const AMOUNT: &str = "12345678901234567890.25";
const TOKEN: &str = "ambiguity-test-token-5f2e9a";
const CONFIG: &str = "[[route]]\npath = \"/busy-once\"\ncompletion = { unknown = [503] }\n\
    summary_fields = [\"/seller_id\", \"/amount\", \"/not_there\"]\n\n\
    [[route]]\npath = \"/fail\"\ncompletion = { unknown = [500] }\n";

/// What these tests ask of a bed, beside what every bed offers.
trait Why {
    async fn api_show(&self, scope: &str, key: &str) -> serde_json::Value;
}

impl Why for Bed {
    /// The record of `key` as `GET /records/{scope}/{key}` shows it.
    async fn api_show(&self, scope: &str, key: &str) -> serde_json::Value {
        let path = format!("/records/{}/{}", segment(scope), segment(key));
        let shown = self.admin("GET", &path, "").await;
        assert_eq!(shown.status, 200, "{shown:?}");
        serde_json::from_str(&shown.body).unwrap()
    }
}

/// The summary of a shown record: (pointer, value) pairs.
fn summary(why: &serde_json::Value) -> Vec<(String, String)> {
    why["summary"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let part = |name: &str| f[name].as_str().unwrap().to_owned();
            (part("pointer"), part("value"))
        })
        .collect()
}

async fn a_503_with_a_body_is_noted_with_the_payouts_summary(kind: Kind) {
    let bed = Bed::start(kind, "ambiguity", CONFIG, TOKEN).await;
    let payout = format!(r#"{{"seller_id":"s-847","amount":{AMOUNT},"currency":"EUR"}}"#);
    let answered = post(&bed.gw.url("/busy-once"), &[key("why-503")], &payout).await;
    assert_eq!(
        (answered.status, answered.body.as_str()),
        (503, "try later"),
        "the caller gets the upstream's whole answer: {answered:?}"
    );
    let (scope, _, _) = bed.record("why-503").await;
    let (doc, table) = bed.show(&scope, "why-503");
    let expect_summary = vec![
        ("/seller_id".to_owned(), "\"s-847\"".to_owned()),
        ("/amount".to_owned(), AMOUNT.to_owned()),
    ];
    let api = bed.api_show(&scope, "why-503").await;
    for (shown, by) in [(&doc, "records show"), (&api, "the admin API")] {
        assert_eq!(shown["state"], "ambiguous", "{by}: {shown}");
        let why = &shown["ambiguity"];
        assert_eq!(why["noted"], true, "{by}: {why}");
        assert_eq!(why["status"], 503, "{by}: {why}");
        assert_eq!(why["error"], "upstream answered 503", "{by}: {why}");
        assert_eq!(why["excerpt"], "try later", "{by}: {why}");
        assert_eq!(why["node"], shown["owner"], "{by}: {why}");
        assert!(!why["node"].as_str().unwrap().is_empty(), "{by}: {why}");
        assert_eq!(summary(why), expect_summary, "{by}: {why}");
    }
    for line in [
        "upstream answered 503 (status 503)",
        "excerpt          try later",
        &format!("summary          /amount = {AMOUNT}"),
        "summary          /seller_id = \"s-847\"",
    ] {
        assert!(table.contains(line), "{line:?} in:\n{table}");
    }

    // A route without summary_fields: the note, and no summary.
    let failed = post(&bed.gw.url("/fail"), &[key("why-500")], &payout).await;
    assert_eq!(failed.status, 500, "{failed:?}");
    let (scope, _, _) = bed.record("why-500").await;
    let (doc, table) = bed.show(&scope, "why-500");
    let api = bed.api_show(&scope, "why-500").await;
    for (shown, by) in [(&doc, "records show"), (&api, "the admin API")] {
        let why = &shown["ambiguity"];
        assert_eq!(why["status"], 500, "{by}: {why}");
        assert_eq!(why["excerpt"], "ledger write timed out", "{by}: {why}");
        assert_eq!(summary(why), vec![], "{by}: {why}");
    }
    assert!(!table.contains("summary"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_503_with_a_body_is_noted_with_the_payouts_summary() {
    a_503_with_a_body_is_noted_with_the_payouts_summary(Kind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_503_with_a_body_is_noted_with_the_payouts_summary() {
    a_503_with_a_body_is_noted_with_the_payouts_summary(Kind::Postgres).await;
}
