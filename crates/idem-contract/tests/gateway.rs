//! Gateway cross-checks: a route's settings against the contract it names.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;

use idem_contract::{GatewayFacts, RouteRegionMode, Verdict, cross_check, load};

fn payouts() -> idem_contract::Contract {
    load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/contracts/payouts.toml"))
        .unwrap()
}

fn safe() -> GatewayFacts {
    GatewayFacts {
        retention_s: 604_800,
        tombstone_s: 7_776_000,
        lease_ms: 30_000,
        on_lease_expiry_takeover: false,
        upstream_dedups: true,
        has_lookup: true,
        region_mode: Some(RouteRegionMode::Single),
    }
}

#[test]
fn cross_checks() {
    let cases: Vec<(&str, GatewayFacts, Option<&str>)> = vec![
        ("matches the contract", safe(), None),
        (
            "retention below the contract",
            GatewayFacts {
                retention_s: 400_000,
                ..safe()
            },
            Some("gateway.retention"),
        ),
        (
            "retention below the horizon",
            GatewayFacts {
                retention_s: 3_600,
                ..safe()
            },
            Some("gateway.retention"),
        ),
        (
            "tombstone below the contract",
            GatewayFacts {
                tombstone_s: 604_800,
                ..safe()
            },
            Some("gateway.tombstone"),
        ),
        (
            "lease below the upstream timeout",
            GatewayFacts {
                lease_ms: 10_000,
                ..safe()
            },
            Some("gateway.lease"),
        ),
        (
            "takeover without upstream dedup",
            GatewayFacts {
                on_lease_expiry_takeover: true,
                upstream_dedups: false,
                ..safe()
            },
            Some("gateway.takeover"),
        ),
        (
            "takeover the contract does not allow",
            GatewayFacts {
                on_lease_expiry_takeover: true,
                ..safe()
            },
            Some("gateway.takeover"),
        ),
        (
            "provider lookup without a route lookup",
            GatewayFacts {
                has_lookup: false,
                ..safe()
            },
            Some("gateway.lookup"),
        ),
    ];
    let contract = payouts();
    for (name, facts, failing) in cases {
        let findings = cross_check(&contract, &facts);
        assert_eq!(findings.len(), 6, "{name}");
        for f in &findings {
            let want = if Some(f.topic.as_str()) == failing {
                Verdict::Fail
            } else {
                Verdict::Pass
            };
            assert_eq!(f.verdict, want, "{name}: {}: {}", f.topic, f.why);
            assert_eq!(
                f.change.is_some(),
                want != Verdict::Pass,
                "{name}: {}",
                f.topic
            );
        }
    }
}

#[test]
fn retention_failure_names_the_longer_requirement() {
    let short = GatewayFacts {
        retention_s: 3_600,
        ..safe()
    };
    let findings = cross_check(&payouts(), &short);
    assert!(
        findings[0].why.contains("the contract's retention 7 d"),
        "{}",
        findings[0].why
    );
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/contracts");
    let incident_two = load(&dir.join("incident-two-dlq-redrive.toml")).unwrap();
    let findings = cross_check(&incident_two, &short);
    assert!(
        findings[0]
            .why
            .contains("replay horizon 4 d 6 h 44 min 10 s"),
        "{}",
        findings[0].why
    );
}

/// `gateway.regions`: the route's mode against the contract's `[regions]`.
#[test]
fn a_route_region_mode_must_be_the_one_the_contract_rests_on() {
    use RouteRegionMode::{HomeRegion, Single, Synchronous};
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/contracts/payouts.toml"),
    )
    .unwrap();
    let with = |regions: &str| {
        let body = match text.find("[regions]") {
            Some(at) => {
                let rest = &text[at + 1..];
                let end = rest.find("\n[").map_or(text.len(), |e| at + 1 + e);
                format!("{}{regions}{}", &text[..at], &text[end..])
            }
            None => format!("{text}\n{regions}"),
        };
        idem_contract::parse(&body, Path::new("c.toml")).unwrap()
    };
    let one = "[regions]\nnames = [\"eu\"]\nreplication = \"none\"\n";
    let sync =
        "[regions]\nnames = [\"eu\", \"us\"]\nreplication = \"sync\"\nclaims = \"any_region\"\n";
    let home =
        "[regions]\nnames = [\"eu\", \"us\"]\nreplication = \"async\"\nclaims = \"home_region\"\n";
    let any =
        "[regions]\nnames = [\"eu\", \"us\"]\nreplication = \"async\"\nclaims = \"any_region\"\n";
    let cases = [
        (one, Single, Verdict::Pass),
        (one, HomeRegion, Verdict::Fail),
        (one, Synchronous, Verdict::Fail),
        (sync, Synchronous, Verdict::Pass),
        (sync, Single, Verdict::Fail),
        (sync, HomeRegion, Verdict::Fail),
        (home, HomeRegion, Verdict::Pass),
        (home, Single, Verdict::Fail),
        (home, Synchronous, Verdict::Fail),
        (any, HomeRegion, Verdict::Fail),
        (any, Synchronous, Verdict::Fail),
        (any, Single, Verdict::Pass),
    ];
    for (regions, mode, want) in cases {
        let contract = with(regions);
        let facts = GatewayFacts {
            region_mode: Some(mode),
            ..safe()
        };
        let findings = cross_check(&contract, &facts);
        let f = findings
            .iter()
            .find(|f| f.topic == "gateway.regions")
            .unwrap();
        assert_eq!(f.verdict, want, "{regions} {mode:?}: {}", f.why);
        assert_eq!(
            f.change.is_some(),
            want == Verdict::Fail,
            "{regions} {mode:?}"
        );
    }
    // A consumer has no region mode: the finding is left out.
    let facts = GatewayFacts {
        region_mode: None,
        ..safe()
    };
    let findings = cross_check(&with(home), &facts);
    assert!(findings.iter().all(|f| f.topic != "gateway.regions"));
}
