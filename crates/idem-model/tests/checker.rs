//! The model check as part of `cargo test`: the real protocol holds every
//! property at the default bound, with one client and with every client on
//! the unlocked fast path, and every mutant is caught with the property it
//! breaks. `IDEM_MODEL_DEPTH` raises the bound.

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
    run_at(protocol, bound())
}

fn run_at(protocol: Protocol, bound: Bound) -> Report {
    match check(protocol, bound) {
        Ok(report) => report,
        Err(e) => panic!("the model of {} cannot be built: {e}", protocol.name()),
    }
}

#[test]
fn the_real_protocol_holds_every_property_and_reaches_its_examples() {
    holds(&run(Protocol::Real));
}

/// Every property holds and every example is reached.
fn holds(report: &Report) {
    println!("{report}");
    assert!(report.violations.is_empty(), "{report}");
    assert!(
        report.unreached.is_empty(),
        "the bound is too small: {report}"
    );
    assert!(
        !report.capped,
        "the bound was not explored in full: {report}"
    );
}

/// The default bound puts one client on the fast path; here both are, so
/// two unlocked reads, each stale in either order, interleave with every
/// other step.
#[test]
fn the_real_protocol_holds_with_every_client_on_the_fast_path() {
    let bound = Bound {
        fast_path_clients: Bound::DEFAULT.clients,
        ..bound()
    };
    holds(&run_at(Protocol::Real, bound));
}

/// Without the fast path no read is ever stale: the example is reached
/// only through the split of a claim into its read and its decision.
#[test]
fn a_stale_read_is_reached_only_through_the_fast_path() {
    let bound = Bound {
        fast_path_clients: 0,
        ..bound()
    };
    let report = run_at(Protocol::Real, bound);
    assert!(report.violations.is_empty(), "{report}");
    assert_eq!(
        report.unreached,
        [property::STALE_READ_ANSWERED],
        "{report}"
    );
}

/// Each mutant, the properties it breaks and the steps of each one's
/// shortest counterexample: breadth first, the trace reported is one of
/// the shortest, whatever the depth.
#[test]
fn every_mutant_is_caught_with_a_shortest_trace() {
    let cases: [(Protocol, &[(&str, usize)]); 18] = [
        (Protocol::LookupDuringLease, &[(property::ONE_EFFECT, 10)]),
        (Protocol::ResolveSkipsLease, &[(property::ONE_EFFECT, 9)]),
        (
            Protocol::ResolveIgnoresToken,
            &[(property::VERDICT_ON_ITS_ATTEMPT, 10)],
        ),
        (Protocol::AcquiresTwice, &[(property::ONE_EFFECT, 6)]),
        (Protocol::TakeoverWithoutDedup, &[(property::ONE_EFFECT, 7)]),
        (Protocol::ShortTombstone, &[(property::ONE_EFFECT, 9)]),
        (
            Protocol::FailureAsFound,
            &[(property::NO_SUCCESS_WITHOUT_EFFECT, 6)],
        ),
        (Protocol::FailureAsNotFound, &[(property::ONE_EFFECT, 10)]),
        // The fast path's contract is broken in the start world (a new
        // key answered `Acquired` without the write); two effects follow
        // when a second client claims the key the store never wrote.
        (
            Protocol::FastPathAnswersAcquire,
            &[
                (property::FAST_PATH_IS_THE_CLAIM, 0),
                (property::ONE_EFFECT, 7),
            ],
        ),
        // Caught only through a read that another claim overtakes between
        // its two halves.
        (
            Protocol::LockedClaimOnStaleRead,
            &[(property::ONE_EFFECT, 7)],
        ),
        // Caught only through the gap between the store's commit and its
        // answer's arrival, with the lease running out in between.
        (
            Protocol::ForwardOnStaleLease,
            &[(property::FORWARD_WITHIN_LEASE, 5)],
        ),
        // Caught only through a request that waited: its holder released
        // the key, the waiter forwarded without a claim, and another
        // client's claim acquired beside it.
        (
            Protocol::WaiterForwardsUnclaimed,
            &[(property::ONE_EFFECT, 9)],
        ),
        // Caught only through a request that waited while the attempt it
        // waited for turned ambiguous.
        (Protocol::WaiterRunsUnknown, &[(property::ONE_EFFECT, 8)]),
        // Caught only through a retry that met the unknown outcome and ran
        // the lookup itself; 11 steps, so checked one step deeper than the
        // default bound (see `depth_for`).
        (
            Protocol::InlineLookupDuringLease,
            &[(property::ONE_EFFECT, 11)],
        ),
        // Caught only where the store may lose the record (see `depth_for`).
        (Protocol::WindowSkipsCheck, &[(property::ONE_EFFECT, 7)]),
        // Caught only where the store may lose the record twice: an
        // attempt claimed after the first loss, forgotten by the second,
        // and a retry whose "not found" is trusted on the first loss's
        // guard.
        (
            Protocol::WindowKeepsFirstLoss,
            &[(property::ONE_EFFECT, 12)],
        ),
        (
            Protocol::CacheClockBehind,
            &[(property::CACHE_IS_THE_CLAIM, 6)],
        ),
        // A claim answered `Acquired` whose write never committed: the
        // next claim of the key acquires too.
        (
            Protocol::BatchAnswersBeforeCommit,
            &[(property::ONE_EFFECT, 6)],
        ),
    ];
    let checked: Vec<Protocol> = cases.iter().map(|(p, _)| *p).collect();
    for protocol in Protocol::ALL.into_iter().skip(1) {
        assert!(
            checked.contains(&protocol),
            "mutant {} has no case",
            protocol.name()
        );
    }
    for (protocol, broken) in cases {
        let report = run_at(protocol, depth_for(protocol));
        println!("{report}");
        for (property, steps) in broken {
            let caught = report.violations.iter().find(|v| v.property == *property);
            let Some(caught) = caught else {
                panic!(
                    "mutant {} escaped: {property} holds\n{report}",
                    protocol.name()
                );
            };
            assert_eq!(
                caught.steps,
                *steps,
                "the shortest trace of {} breaking {property}:\n{}",
                protocol.name(),
                caught.trace
            );
            assert!(
                caught.trace.lines().count() > 2,
                "a counterexample is a readable trace: {}",
                caught.trace
            );
        }
    }
}

/// The depth at which a second loss inside the window can forget an
/// attempt that a retry's lookup then misses: 12 steps.
const LOST_TWICE_DEPTH: usize = 14;

/// The bound a mutant is checked at: the default, but deeper for the ones
/// whose shortest traces (11 and 12 steps) are past it.
fn depth_for(protocol: Protocol) -> Bound {
    let b = bound();
    match protocol {
        Protocol::InlineLookupDuringLease => Bound {
            depth_max: b.depth_max.max(13),
            ..b
        },
        Protocol::WindowSkipsCheck => Bound {
            depth_max: b.depth_max,
            ..Bound::LOST_TAIL
        },
        Protocol::WindowKeepsFirstLoss => Bound {
            depth_max: b.depth_max.max(LOST_TWICE_DEPTH),
            ..Bound::LOST_TAIL
        },
        _ => b,
    }
}

/// A store that loses the key's record, once or twice (a hard failover
/// to a standby without the last writes, a restore, then a failback or a
/// second restore inside the open window): with the suspect window's
/// check, no key the provider can answer runs twice, and a forgotten key
/// is answered with the provider's answer. Deep enough for the second
/// loss to forget an attempt claimed after the first.
#[test]
fn the_real_protocol_holds_when_the_store_loses_its_record() {
    let bound = Bound {
        depth_max: bound().depth_max.max(LOST_TWICE_DEPTH),
        ..Bound::LOST_TAIL
    };
    let report = run_at(Protocol::Real, bound);
    println!("{report}");
    assert!(report.violations.is_empty(), "{report}");
    assert!(
        !report.unreached.contains(&property::VERIFIED_REPLAY),
        "{report}"
    );
}

#[test]
fn protocols_are_named_on_the_command_line_by_their_name() {
    for protocol in Protocol::ALL {
        assert_eq!(Protocol::from_name(protocol.name()), Some(protocol));
    }
    assert_eq!(Protocol::from_name("Real"), None);
    assert_eq!(Protocol::from_name(""), None);
}

/// A check that reaches its state cap says so: a clean report from it
/// proves nothing past the states it reached.
#[test]
fn a_check_stopped_at_the_state_cap_says_so() {
    let capped = run_at(
        Protocol::Real,
        Bound {
            states_max: 1_000,
            ..bound()
        },
    );
    assert!(capped.capped, "stopped at 1,000 states: {capped}");
    assert!(capped.states < 100_000, "the cap stops the check: {capped}");
    assert!(capped.to_string().contains("STOPPED at the state cap"));
    let full = run_at(Protocol::Real, bound());
    assert!(!full.capped, "the default bound fits under the cap: {full}");
}
