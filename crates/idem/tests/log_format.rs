//! `IDEM_LOG_FORMAT=json`, black-box: a real `idem serve` whose every log
//! line must be one JSON object a log shipper can index, with the event's
//! fields at the top level and no secret anywhere; and a value it does not
//! know stops it, naming the variable.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::{Gateway, Site, Upstream, eventually, key, post, send, text};

const TOKEN: &str = "admin-token-never-logged-0123456789";
const PAYOUT: &str = r#"{"seller":847,"amount":1200}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_json_line_parses_with_its_fields_and_no_secret() {
    let (up, site) = (Upstream::start().await, Site::new());
    let env = [("IDEM_LOG_FORMAT", "json")];
    let (gw, admin) = Gateway::start_admin_env(&up.url(), &site.store(), None, TOKEN, &env);
    let first = post(&gw.url("/payouts"), &[key("k-json-1")], PAYOUT).await;
    assert_eq!(first.status, 201, "{first:?}");
    post(&gw.url("/payouts"), &[key("k-json-1")], PAYOUT)
        .await
        .assert_replay_of(&first);
    // An unknown outcome: a warning with its cause.
    let failed = post(&gw.url("/fail"), &[key("k-json-2")], PAYOUT).await;
    assert!(failed.status >= 500, "{failed:?}");
    // A refused admin request, with a token that must not be logged
    // either, and an accepted one.
    let admin_url = format!("http://{admin}/records");
    let wrong = "Bearer wrong-token-never-logged-987654321";
    let refused = send("GET", &admin_url, &[("authorization", wrong)], "").await;
    assert_eq!(refused.status, 401);
    let bearer = format!("Bearer {TOKEN}");
    let listed = send("GET", &admin_url, &[("authorization", &bearer)], "").await;
    assert_eq!(listed.status, 200);

    let log = gw.log.clone();
    assert!(gw.terminate().success());
    let lines = || log.lock().unwrap().clone();
    // The reader thread takes the last lines after the exit.
    assert!(
        eventually(Duration::from_secs(5), || lines()
            .iter()
            .any(|l| l.contains("stopped")))
        .await
    );

    let mut objects = Vec::new();
    for line in lines() {
        let object: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("not one JSON object ({e}): {line}"));
        for field in ["timestamp", "level", "message"] {
            assert!(object[field].is_string(), "no {field}: {line}");
        }
        assert!(!line.contains(TOKEN), "the admin token is logged: {line}");
        assert!(
            !line.contains("wrong-token-never-logged"),
            "a presented token is logged: {line}"
        );
        objects.push(object);
    }
    let with = |key: &str, field: &str| {
        objects
            .iter()
            .find(|o| o["key"] == key && o[field].is_string())
            .unwrap_or_else(|| panic!("no line for {key} with {field}: {objects:#?}"))
    };
    let completed = with("k-json-1", "scope");
    assert_eq!(completed["status"], 201, "{completed}");
    let unknown = with("k-json-2", "cause");
    assert_eq!(unknown["level"], "WARN", "{unknown}");
    assert!(
        objects.iter().any(|o| o["message"]
            .as_str()
            .is_some_and(|m| m.contains("refused a request without a valid token"))),
        "{objects:#?}"
    );
}

#[test]
fn an_unknown_log_format_stops_idem_naming_the_variable() {
    let site = Site::new();
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:9",
        ])
        .arg("--store")
        .arg(format!("sqlite://{}", site.store().display()))
        .env("IDEM_LOG_FORMAT", "logfmt")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("IDEM_LOG_FORMAT=\"logfmt\""), "{stderr}");
    assert!(stderr.contains("\"json\""), "{stderr}");
}
