//! The model check as part of `cargo test`: the real protocol holds every
//! property at the default bound, and every mutant is caught with the
//! property it breaks. `IDEM_MODEL_DEPTH` raises the bound.

use idem_model::{Bound, Protocol, Report, check, property};

fn bound() -> Bound {
    let depth_max = std::env::var("IDEM_MODEL_DEPTH")
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(Bound::DEFAULT.depth_max);
    Bound {
        depth_max,
        ..Bound::DEFAULT
    }
}

fn run(protocol: Protocol) -> Report {
    match check(protocol, bound()) {
        Ok(report) => report,
        Err(e) => panic!("the model of {} cannot be built: {e}", protocol.name()),
    }
}

#[test]
fn the_real_protocol_holds_every_property_and_reaches_its_examples() {
    let report = run(Protocol::Real);
    println!("{report}");
    assert!(report.violations.is_empty(), "{report}");
    assert!(
        report.unreached.is_empty(),
        "the bound is too small: {report}"
    );
}

/// Each mutant and the property its shortest counterexample breaks.
#[test]
fn every_mutant_is_caught_with_a_trace() {
    let cases = [
        (Protocol::LookupDuringLease, property::ONE_EFFECT),
        (Protocol::ResolveSkipsLease, property::ONE_EFFECT),
        (
            Protocol::ResolveIgnoresToken,
            property::VERDICT_ON_ITS_ATTEMPT,
        ),
        (Protocol::AcquiresTwice, property::ONE_EFFECT),
        (Protocol::TakeoverWithoutDedup, property::ONE_EFFECT),
        (Protocol::ShortTombstone, property::ONE_EFFECT),
        (
            Protocol::FailureAsFound,
            property::NO_SUCCESS_WITHOUT_EFFECT,
        ),
        (Protocol::FailureAsNotFound, property::ONE_EFFECT),
    ];
    for (protocol, broken) in cases {
        let report = run(protocol);
        println!("{report}");
        let caught = report.violations.iter().find(|v| v.property == broken);
        let Some(caught) = caught else {
            panic!(
                "mutant {} escaped: {broken} holds\n{report}",
                protocol.name()
            );
        };
        assert!(
            caught.trace.lines().count() > 2,
            "a counterexample is a readable trace: {}",
            caught.trace
        );
    }
}

#[test]
fn protocols_are_named_on_the_command_line_by_their_name() {
    for protocol in Protocol::ALL {
        assert_eq!(Protocol::from_name(protocol.name()), Some(protocol));
    }
    assert_eq!(Protocol::from_name("Real"), None);
    assert_eq!(Protocol::from_name(""), None);
}
