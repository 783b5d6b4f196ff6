//! `idem check` as a reviewer and a deploy pipeline run it: exit codes, the
//! five example contracts, and a gateway that refuses to serve a route whose
//! contract fails.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::path::PathBuf;

use support::{Gateway, Site, Upstream, idem, text};

fn example(name: &str) -> String {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "..",
        "..",
        "examples",
        "contracts",
        name,
    ]
    .iter()
    .collect();
    path.to_str().unwrap().to_owned()
}

#[test]
fn the_examples_get_their_verdicts_and_exit_codes() {
    let cases = [
        ("payouts.toml", 0, None),
        ("incident-one-key-per-attempt.toml", 1, Some("generation")),
        ("incident-two-dlq-redrive.toml", 1, Some("retention")),
        ("content-dedup-attributes.toml", 1, Some("fingerprint")),
        ("active-active-async.toml", 1, Some("failover")),
    ];
    for (file, code, failing) in cases {
        let out = idem(&["check", &example(file), "--format", "json"]);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{file}: {}",
            text(&out.stderr)
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let findings = doc[0]["report"]["findings"].as_array().unwrap().clone();
        assert_eq!(findings.len(), 12, "{file}: twelve questions");
        if let Some(question) = failing {
            let f = findings.iter().find(|f| f["topic"] == question).unwrap();
            assert_eq!(f["verdict"], "FAIL", "{file}: {f}");
        }
    }
    // People get aligned text, without colour when not on a terminal.
    let out = idem(&["check", &example("incident-two-dlq-redrive.toml")]);
    let shown = text(&out.stdout);
    assert!(
        shown.contains("retention    FAIL") && shown.contains("replay horizon:"),
        "{shown}"
    );
    assert!(!shown.contains('\u{1b}'), "no colour codes on a pipe");
}

#[test]
fn unreadable_and_invalid_files_exit_2_naming_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[operation]\nname = \"x\"\nbogus = 1\n").unwrap();
    let out = idem(&["check", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("bad.toml:3:1: operation.bogus: unknown field `bogus`"),
        "{}",
        text(&out.stderr)
    );
    let missing = dir.path().join("missing.toml");
    let out = idem(&["check", missing.to_str().unwrap(), &example("payouts.toml")]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unreadable file wins over a pass"
    );
    assert!(text(&out.stderr).contains("missing.toml"));
    assert_eq!(idem(&["check"]).status.code(), Some(2));
    // A gateway config is validated whole, its upstream too, though the
    // check never dials it.
    let gateway = dir.path().join("gateway.toml");
    std::fs::write(&gateway, "upstream = \"ftp://x\"\n").unwrap();
    let out = idem(&["check", "--gateway", gateway.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("gateway.toml: upstream:"),
        "{}",
        text(&out.stderr)
    );
}

fn gateway_config(site: &Site, contract: &str, retention_s: u64) -> PathBuf {
    gateway_config_with(site, contract, retention_s, "", "")
}

/// [`gateway_config`] with `top` before the route and `route` in it.
fn gateway_config_with(
    site: &Site,
    contract: &str,
    retention_s: u64,
    top: &str,
    route: &str,
) -> PathBuf {
    let text = format!(
        "{top}[[route]]\n{route}name = \"payouts\"\nmethods = [\"POST\"]\npath = \"/payouts\"\nretention_s = {retention_s}\n\
         principal = {{ header = \"x-tenant-id\" }}\n\
         forward_key = {{ template = \"{{scope_digest}}:{{key}}\" }}\n\
         tombstone_s = 31536000\ncontract = {:?}\n\
         [[lookup]]\nroute = \"payouts\"\nurl = \"http://127.0.0.1:9/payouts/by-key/{{forwarded_key}}\"\n",
        example(contract)
    );
    site.config(&text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_refuses_a_route_whose_contract_fails() {
    let (up, site) = (Upstream::start().await, Site::new());
    // The contract passes on its own, but this route keeps records one hour.
    let short = gateway_config(&site, "payouts.toml", 3600);
    let out = idem(&["check", "--gateway", short.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("gateway.retention"),
        "{}",
        text(&out.stdout)
    );
    let store = format!("sqlite://{}", site.store().display());
    let out = idem(&[
        "serve",
        "--upstream",
        &up.url(),
        "--store",
        &store,
        "--config",
        short.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("refusing to start") && err.contains("gateway.retention"),
        "{err}"
    );
    assert!(!site.store().exists(), "nothing was opened");

    // --allow-unsafe-contract starts, and says so loudly.
    let gw = Gateway::start_args(
        &up.url(),
        &site.store(),
        Some(&short),
        &["--allow-unsafe-contract"],
    );
    assert!(gw.logs().contains("UNSAFE CONTRACT"), "{}", gw.logs());
    drop(gw);

    // A route that keeps records long enough passes and starts quietly.
    let long = gateway_config(&site, "payouts.toml", 31_536_000);
    let out = idem(&["check", "--gateway", long.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let gw = Gateway::start(&up.url(), &site.store(), Some(&long));
    assert!(!gw.logs().contains("UNSAFE CONTRACT"));
}

/// `idem check --gateway` holds each route's region mode to its contract's
/// `[regions]` (payouts: one region): a synchronous route or home-region
/// routing is a promise the contract does not make, and is named.
#[test]
fn a_route_region_mode_is_held_to_its_contract() {
    let site = Site::new();
    let peers = "region = \"eu\"\n[peers]\nus = \"http://127.0.0.1:9\"\n";
    let cases = [
        ("", "", Some(0), "PASS        one region"),
        (
            "",
            "regions = { mode = \"synchronous\" }\n",
            Some(1),
            "replication = \"sync\"",
        ),
        (
            peers,
            "regions = { mode = \"home-region\", home = { from = \"key_prefix\" } }\n",
            Some(1),
            "home_region",
        ),
    ];
    for (top, route, code, needle) in cases {
        let extra = format!("{top}{route}");
        let config = gateway_config_with(&site, "payouts.toml", 31_536_000, top, route);
        let out = idem(&["check", "--gateway", config.to_str().unwrap()]);
        let stdout = text(&out.stdout);
        assert_eq!(
            out.status.code(),
            code,
            "{extra}: {stdout}{}",
            text(&out.stderr)
        );
        // The finding's line and its "change:" line.
        let lines = stdout
            .lines()
            .skip_while(|l| !l.contains("gateway.regions"));
        let shown = lines.take(2).collect::<Vec<_>>().join("\n");
        assert!(
            shown.contains(needle),
            "{extra}: {needle:?} not in {shown:?}"
        );
    }
}

/// The corrected payout consumer passes against the corrected contract;
/// the same consumer keyed by the message id, or with a retention shorter
/// than the replay horizon, fails and names why.
#[test]
fn the_example_consumer_passes_and_its_unsafe_variants_fail() {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "..",
        "..",
        "examples",
        "consume",
        "payouts.toml",
    ]
    .iter()
    .collect();
    let out = idem(&[
        "check",
        "--consumer",
        path.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc[0]["subscription"], "create-payout");
    assert_eq!(doc[0]["passed"], true, "{doc}");

    let original = std::fs::read_to_string(&path).unwrap();
    let contract = example("payouts.toml");
    let cases = [
        (
            original.replace(
                "key = \"payout:{/seller_id}:{/settlement_id}\"",
                "key = \"msg:{message_id}\"",
            ),
            "consumer.key_source",
        ),
        (
            original.replace("retention_s = 604800", "retention_s = 3600"),
            "consumer.retention",
        ),
    ];
    for (text_of_config, topic) in cases {
        let site = Site::new();
        let config = site.config(&text_of_config.replace("../contracts/payouts.toml", &contract));
        let out = idem(&[
            "check",
            "--consumer",
            config.to_str().unwrap(),
            "--format",
            "json",
        ]);
        assert_eq!(out.status.code(), Some(1), "{topic}: {}", text(&out.stderr));
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let findings = doc[0]["consumer"].as_array().unwrap();
        let failed = findings
            .iter()
            .any(|f| f["topic"] == topic && f["verdict"] == "FAIL");
        assert!(failed, "{topic} should fail: {doc}");
        // A subscription's findings are named for the consumer, never for
        // a gateway route it is not.
        let topics = findings.iter().map(|f| f["topic"].as_str().unwrap());
        assert!(topics.clone().all(|t| t.starts_with("consumer.")), "{doc}");
    }
}

/// `idem check --gateway` names each route's exposure to a lost tail: a
/// route with a lookup is verified inside the suspect window, one without
/// is named exposed, and so is every route when the window is off.
#[test]
fn check_gateway_names_the_routes_a_lost_tail_exposes() {
    let site = Site::new();
    let config = site.config(
        "[[route]]\nname = \"payouts\"\nmethods = [\"POST\"]\npath = \"/payouts\"\n\
         forward_key = { template = \"{scope_digest}:{key}\" }\n\
         [[route]]\nname = \"emails\"\nmethods = [\"POST\"]\npath = \"/emails\"\n\
         [[lookup]]\nroute = \"payouts\"\nurl = \"http://127.0.0.1:9/payouts/by-key/{forwarded_key}\"\n",
    );
    let out = idem(&[
        "check",
        "--format",
        "json",
        "--gateway",
        config.to_str().unwrap(),
    ]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lost_tail = |route: &str| -> String {
        let entry = doc
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["route"] == route)
            .unwrap();
        let finding = entry["gateway"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["topic"] == "gateway.lost_tail")
            .unwrap();
        finding["why"].as_str().unwrap().to_owned()
    };
    assert!(lost_tail("payouts").contains("verified with the provider's lookup for 86400 s"));
    assert!(
        lost_tail("emails").starts_with("exposed: no [[lookup]]"),
        "{}",
        lost_tail("emails")
    );
}
