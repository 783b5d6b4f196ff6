//! `idem serve` on a DynamoDB table, on both emulators `scripts/test.sh`
//! starts (dynalite and moto): several gateways sharing one table behave as
//! one (the cases of support/nodes.rs), and the table's commands say what
//! they do.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use idem_testkit::services::Service;
use support::dynamo::fresh_table;
use support::idem;
use support::{Site, nodes};

const EMULATORS: [Service; 2] = [Service::Dynalite, Service::Moto];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_sharing_one_table_make_one_effect() {
    for emulator in EMULATORS {
        nodes::two_nodes_make_one_effect(&fresh_table(emulator, "two-nodes")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_claims_split_across_gateways_make_one_effect() {
    for emulator in EMULATORS {
        let store = fresh_table(emulator, "race");
        nodes::fresh_claims_split_across_nodes_make_one_effect(&store).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_commands_read_the_table() {
    for emulator in EMULATORS {
        nodes::records_commands_read_the_store(&fresh_table(emulator, "records")).await;
    }
}

#[test]
fn a_missing_table_is_named_with_the_command_that_makes_it() {
    let url = format!(
        "dynamodb://idem-never-made?region=us-east-1&endpoint={}",
        Service::Dynalite.endpoint()
    );
    let site = Site::new();
    let config = site.config(&format!("store = \"{url}\"\n"));
    let out = idem(&[
        "serve",
        "--config",
        config.to_str().unwrap(),
        "--upstream",
        "http://127.0.0.1:9",
    ]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("table \"idem-never-made\" does not exist")
            && said.contains(&format!("idem store init --store {url}")),
        "{said}"
    );
    let listed = idem(&["records", "list", "--store", &url]);
    let said = String::from_utf8_lossy(&listed.stderr);
    assert!(!listed.status.success(), "{said}");
    assert!(said.contains("there is no store at"), "{said}");
}

#[test]
fn init_is_idempotent_and_prints_cloudformation() {
    let url = fresh_table(Service::Moto, "init");
    let again = idem(&["store", "init", "--store", &url]);
    let said = String::from_utf8_lossy(&again.stdout);
    assert!(again.status.success(), "{said}");
    assert!(said.contains("exists"), "{said}");
    // The clock is compared with the emulator's Date, on this same machine.
    let clock = said
        .lines()
        .find_map(|l| l.strip_prefix("clock: "))
        .unwrap_or_else(|| panic!("no clock line: {said}"));
    let offset: i64 = clock.split(' ').next().unwrap().parse().unwrap();
    assert!(offset.abs() < 1_500, "{clock}");
    let printed = idem(&[
        "store",
        "init",
        "--store",
        &url,
        "--print",
        "cloudformation",
    ]);
    let template: serde_json::Value = serde_json::from_slice(&printed.stdout).unwrap();
    let table = &template["Resources"]["IdemStore"]["Properties"];
    assert_eq!(table["BillingMode"], "PAY_PER_REQUEST");
    assert_eq!(table["GlobalSecondaryIndexes"].as_array().unwrap().len(), 2);
    assert_eq!(
        table["TimeToLiveSpecification"]["AttributeName"],
        "reclaim_after"
    );
    let sqlite = idem(&[
        "store",
        "init",
        "--store",
        "sqlite://x.db",
        "--print",
        "cloudformation",
    ]);
    assert!(!sqlite.status.success());
    assert!(String::from_utf8_lossy(&sqlite.stderr).contains("is not a DynamoDB store"));
}

#[test]
fn a_synchronous_route_is_refused_on_a_table_that_is_not_mrsc() {
    for emulator in EMULATORS {
        let url = fresh_table(emulator, "sync");
        let site = Site::new();
        let config = site.config(&format!(
            "store = \"{url}\"\nregion = \"eu-west\"\n[[route]]\npath = \"/payouts\"\nregions = {{ mode = \"synchronous\" }}\n"
        ));
        let out = idem(&[
            "serve",
            "--config",
            config.to_str().unwrap(),
            "--upstream",
            "http://127.0.0.1:9",
        ]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{said}");
        assert!(
            said.contains("needs a global table whose MultiRegionConsistency is STRONG")
                && said.contains(
                    &url.split('?')
                        .next()
                        .unwrap()
                        .trim_start_matches("dynamodb://")
                        .to_owned()
                ),
            "{said}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mark_restored_opens_the_window_a_gateway_then_reports() {
    let up = support::Upstream::start().await;
    for emulator in EMULATORS {
        let url = fresh_table(emulator, "restored");
        let out = idem(&[
            "store",
            "mark-restored",
            "--store",
            &url,
            "--since",
            "2026-01-01T00:00:00Z",
            "--window-s",
            "3600",
        ]);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(said.contains("suspect window open until"), "{said}");
        assert!(
            said.contains("marked restored to 2026-01-01T00:00:00Z"),
            "{said}"
        );
        let gateway = support::Gateway::start_url(&up.url(), &url, None);
        let opened = support::eventually(std::time::Duration::from_secs(10), || {
            gateway.logs().contains("suspect window open")
        })
        .await;
        assert!(opened, "{emulator:?}: {}", gateway.logs());
    }
}
