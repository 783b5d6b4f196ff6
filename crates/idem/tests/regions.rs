//! Home-region routing between two real gateways ("eu", "us") on two
//! SQLite files in front of one counting payout API: a key is claimed only
//! in its home region, forwarded there once from the other, refused when
//! it cannot be placed, and never claimed when its home cannot be reached.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::path::Path;

use idem_testkit::free_port;
use support::{Gateway, Site, Upstream, idem, key, post, text};

fn config(region: &str, peers: &[(&str, u16)], regions: &str, extra: &str) -> String {
    let peers: String = peers
        .iter()
        .map(|(name, port)| format!("{name} = \"http://127.0.0.1:{port}\"\n"))
        .collect();
    format!(
        "region = \"{region}\"\n[peers]\n{peers}\n[[route]]\nname = \"payouts\"\n\
         path = \"/payouts\"\n{extra}regions = {regions}\n"
    )
}

fn start(up: &Upstream, site: &Site, port: u16, text: &str) -> Gateway {
    let config = site.config(text);
    let listen = format!("127.0.0.1:{port}");
    Gateway::start_args(
        &up.url(),
        &site.store(),
        Some(&config),
        &["--listen", &listen],
    )
}

/// The keys of the records in `store`.
fn stored_keys(store: &Path) -> Vec<String> {
    let url = format!("sqlite://{}", store.display());
    let out = idem(&["records", "list", "--format", "json", "--store", &url]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut keys: Vec<String> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap().to_owned())
        .collect();
    keys.sort();
    keys
}

/// A gateway, the request's headers, and what the refusal must say.
type Refused<'a> = (&'a Gateway, &'a [(&'a str, &'a str)], &'a str);

fn problem_json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap()
}

const PREFIX: &str =
    "{ mode = \"home-region\", home = { from = \"key_prefix\", separator = \":\" } }";

#[tokio::test(flavor = "multi_thread")]
async fn each_key_is_claimed_once_and_only_in_its_home_region() {
    let up = Upstream::start().await;
    let (eu_site, us_site) = (Site::new(), Site::new());
    let (eu_port, us_port) = (free_port().unwrap(), free_port().unwrap());
    let eu = start(
        &up,
        &eu_site,
        eu_port,
        &config("eu", &[("us", us_port)], PREFIX, ""),
    );
    let us = start(
        &up,
        &us_site,
        us_port,
        &config("us", &[("eu", eu_port)], PREFIX, ""),
    );
    let body = "{\"amount\":100}";
    // Each key is sent to the gateway of the other region first, retried
    // there, then retried on its home gateway.
    // The third key is first sent in the draft's quoted sf-string form: the
    // same key, so the same home and the same record, whichever spelling a
    // retry uses.
    let plan = [
        ("eu:pay-1", "eu:pay-1", &us, &eu),
        ("us:pay-2", "us:pay-2", &eu, &us),
        ("\"eu:pay-3\"", "eu:pay-3", &us, &eu),
    ];
    for (first_spelling, k, foreign, home) in plan {
        let first = post(&foreign.url("/payouts"), &[key(first_spelling)], body).await;
        assert_eq!(first.status, 201, "{k}: {}", first.body);
        let again = post(&foreign.url("/payouts"), &[key(k)], body).await;
        again.assert_replay_of(&first);
        let at_home = post(&home.url("/payouts"), &[key(first_spelling)], body).await;
        at_home.assert_replay_of(&first);
    }
    let effects = up.effects();
    assert_eq!(effects.len(), 3, "{effects:?}");
    assert_eq!(stored_keys(&eu_site.store()), vec!["eu:pay-1", "eu:pay-3"]);
    assert_eq!(stored_keys(&us_site.store()), vec!["us:pay-2"]);
    // The marker never reaches the upstream: it was taken off at the edge.
    assert!(
        effects
            .iter()
            .all(|e| e.key.is_some() && e.forwarded_from.is_none()),
        "{effects:?}"
    );
}

/// A forwarded request waits for the home gateway's whole answer: the home
/// claims, waits up to its upstream's response timeout, and records the
/// outcome, so a forward cut at that same timeout would answer 503
/// `peer-unavailable` for a request the home did run.
#[tokio::test(flavor = "multi_thread")]
async fn a_forward_outlasts_the_home_gateways_own_upstream_timeout() {
    let up = Upstream::start().await;
    let (eu_site, us_site) = (Site::new(), Site::new());
    let (eu_port, us_port) = (free_port().unwrap(), free_port().unwrap());
    let text = |region: &str, peer: &str, port: u16| {
        format!(
            "response_timeout_ms = 500\nregion = \"{region}\"\n[peers]\n\
             {peer} = \"http://127.0.0.1:{port}\"\n[[route]]\nname = \"slow\"\n\
             path = \"/slow-before\"\nregions = {PREFIX}\n"
        )
    };
    let _eu = start(&up, &eu_site, eu_port, &text("eu", "us", us_port));
    let _us = start(&up, &us_site, us_port, &text("us", "eu", eu_port));
    let url = format!("http://127.0.0.1:{eu_port}/slow-before?ms=1500");
    let reply = post(&url, &[key("us:slow-1")], "{}").await;
    assert_ne!(
        reply.problem().as_deref(),
        Some("urn:idem:problem:peer-unavailable"),
        "{reply:?}"
    );
    assert_eq!(stored_keys(&us_site.store()), vec!["us:slow-1"]);
    assert_eq!(stored_keys(&eu_site.store()), Vec::<String>::new());
}

/// Many copies of one intent at once, half to each region's gateway: the
/// foreign copies are forwarded, every copy is decided by the home store,
/// and the effect happens once; every answer is that effect's or a 409.
#[tokio::test(flavor = "multi_thread")]
async fn copies_racing_through_both_gateways_run_once() {
    let up = Upstream::start().await;
    let (eu_site, us_site) = (Site::new(), Site::new());
    let (eu_port, us_port) = (free_port().unwrap(), free_port().unwrap());
    let eu = start(
        &up,
        &eu_site,
        eu_port,
        &config("eu", &[("us", us_port)], PREFIX, ""),
    );
    let us = start(
        &up,
        &us_site,
        us_port,
        &config("us", &[("eu", eu_port)], PREFIX, ""),
    );
    let (eu_url, us_url) = (eu.url("/payouts"), us.url("/payouts"));
    let copies = (0..16).map(|i| {
        let url = if i % 2 == 0 {
            eu_url.clone()
        } else {
            us_url.clone()
        };
        tokio::spawn(async move { post(&url, &[key("us:race-1")], "{\"amount\":7}").await })
    });
    let mut answered = Vec::new();
    for copy in copies.collect::<Vec<_>>() {
        answered.push(copy.await.unwrap());
    }
    let effects = up.effects();
    assert_eq!(effects.len(), 1, "{effects:?}");
    assert!(
        answered.iter().all(|r| r.status == 201 || r.status == 409),
        "{answered:?}"
    );
    assert_eq!(stored_keys(&us_site.store()), vec!["us:race-1"]);
    assert_eq!(stored_keys(&eu_site.store()), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn on_foreign_problem_answers_421_and_claims_nothing() {
    let up = Upstream::start().await;
    let site = Site::new();
    let regions =
        "{ mode = \"home-region\", home = { from = \"key_prefix\" }, on_foreign = \"problem\" }";
    let us_port = free_port().unwrap();
    let eu = start(
        &up,
        &site,
        free_port().unwrap(),
        &config("eu", &[("us", us_port)], regions, ""),
    );
    let reply = post(&eu.url("/payouts"), &[key("us:pay-9")], "{}").await;
    assert_eq!(reply.status, 421, "{}", reply.body);
    let doc = problem_json(&reply.body);
    assert_eq!(doc["type"], "urn:idem:problem:wrong-region");
    assert_eq!(doc["home_region"], "us");
    assert_eq!(doc["region"], "eu");
    assert_eq!(doc["home_gateway"], format!("http://127.0.0.1:{us_port}/"));
    assert_eq!(up.hits(), 0);
    assert!(stored_keys(&site.store()).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn two_gateways_that_each_think_the_other_is_home_end_in_a_problem() {
    let up = Upstream::start().await;
    let (eu_site, us_site) = (Site::new(), Site::new());
    let (eu_port, us_port) = (free_port().unwrap(), free_port().unwrap());
    let principal = "principal = { header = \"x-tenant\" }\n";
    let home = |other: &str| {
        format!(
            "{{ mode = \"home-region\", home = {{ from = \"principal\", table = {{ acme = \"{other}\" }} }} }}"
        )
    };
    let eu_text = config("eu", &[("us", us_port)], &home("us"), principal);
    let us_text = config("us", &[("eu", eu_port)], &home("eu"), principal);
    let eu = start(&up, &eu_site, eu_port, &eu_text);
    let _us = start(&up, &us_site, us_port, &us_text);
    let reply = post(
        &eu.url("/payouts"),
        &[key("loop-1"), ("x-tenant", "acme")],
        "{}",
    )
    .await;
    assert_eq!(reply.status, 421, "{}", reply.body);
    let doc = problem_json(&reply.body);
    assert_eq!(doc["type"], "urn:idem:problem:wrong-region");
    assert!(
        doc["detail"]
            .as_str()
            .unwrap()
            .contains("already forwarded"),
        "{doc}"
    );
    assert_eq!(up.hits(), 0);
    assert!(stored_keys(&eu_site.store()).is_empty());
    assert!(stored_keys(&us_site.store()).is_empty());
    // A principal in no table and no default: refused before any claim.
    let reply = post(
        &eu.url("/payouts"),
        &[key("k-2"), ("x-tenant", "zeta")],
        "{}",
    )
    .await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(
        problem_json(&reply.body)["type"],
        "urn:idem:problem:unknown-home-region"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_home_region_that_does_not_answer_gets_503_and_nothing_is_claimed() {
    let up = Upstream::start().await;
    let site = Site::new();
    // Nothing listens on the peer's port.
    let eu = start(
        &up,
        &site,
        free_port().unwrap(),
        &config("eu", &[("us", free_port().unwrap())], PREFIX, ""),
    );
    let reply = post(&eu.url("/payouts"), &[key("us:pay-3")], "{}").await;
    assert_eq!(reply.status, 503, "{}", reply.body);
    let doc = problem_json(&reply.body);
    assert_eq!(doc["type"], "urn:idem:problem:peer-unavailable");
    assert_eq!(doc["home_region"], "us");
    assert!(reply.header("retry-after").is_some());
    assert_eq!(up.hits(), 0);
    assert!(stored_keys(&site.store()).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_whose_home_cannot_be_derived_is_refused_with_why() {
    let up = Upstream::start().await;
    let (site, header_site) = (Site::new(), Site::new());
    let us = free_port().unwrap();
    let eu = start(
        &up,
        &site,
        free_port().unwrap(),
        &config("eu", &[("us", us)], PREFIX, ""),
    );
    let by_header =
        "{ mode = \"home-region\", home = { from = \"header\", header = \"x-home-region\" } }";
    let eu_header = start(
        &up,
        &header_site,
        free_port().unwrap(),
        &config("eu", &[("us", us)], by_header, ""),
    );
    let cases: [Refused<'_>; 7] = [
        (
            &eu,
            &[key("zz:1")],
            "\"zz\" is not a region this gateway knows (eu, us)",
        ),
        (&eu, &[key("EU:1")], "did you mean \"eu\"?"),
        (&eu, &[key(":1")], "region prefix is empty"),
        (&eu, &[key("no-prefix")], "has no region prefix"),
        (&eu_header, &[key("k1")], "x-home-region header is missing"),
        (
            &eu_header,
            &[key("k2"), ("x-home-region", "x-tenant")],
            "\"x-tenant\" is not a region",
        ),
        (
            &eu_header,
            &[key("k3"), ("x-home-region", "eu"), ("x-home-region", "us")],
            "sent twice",
        ),
    ];
    for (gateway, headers, why) in cases {
        let reply = post(&gateway.url("/payouts"), headers, "{}").await;
        assert_eq!(reply.status, 400, "{headers:?}: {}", reply.body);
        let doc = problem_json(&reply.body);
        assert_eq!(doc["type"], "urn:idem:problem:unknown-home-region", "{doc}");
        let detail = doc["detail"].as_str().unwrap();
        assert!(detail.contains(why), "{headers:?}: {detail}");
    }
    // Homed here by the header: the normal path.
    let reply = post(
        &eu_header.url("/payouts"),
        &[key("k4"), ("x-home-region", "eu")],
        "{}",
    )
    .await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    assert_eq!(up.effects().len(), 1);
    assert!(stored_keys(&site.store()).is_empty());
    assert_eq!(stored_keys(&header_site.store()), vec!["k4"]);
}

#[test]
fn synchronous_routes_refuse_a_store_that_is_not_replicated() {
    let site = Site::new();
    let config = site.config(
        "[[route]]\nname = \"payouts\"\npath = \"/payouts\"\nregions = { mode = \"synchronous\" }\n",
    );
    let sqlite = format!("sqlite://{}", site.store().display());
    let pg = support::PgSchema::new("regions_sync");
    for (store, why) in [
        (
            sqlite.as_str(),
            "one SQLite file on one machine, not replicated",
        ),
        (
            &pg.store_url(),
            "synchronous_standby_names = \"\"): synchronous_standby_names is empty",
        ),
    ] {
        let out = idem(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:9",
            "--store",
            store,
            "--config",
            config.to_str().unwrap(),
        ]);
        assert!(!out.status.success(), "{store}");
        let err = text(&out.stderr);
        assert!(
            err.contains("route \"payouts\" has regions = { mode = \"synchronous\" }")
                && err.contains(why),
            "{store}: {err}"
        );
    }
}
