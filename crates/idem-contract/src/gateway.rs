//! Cross-checks a gateway route's configuration against the contract it names,
//! so the running system enforces what the contract file promises.
//!
//! The binary extracts [`GatewayFacts`] from its own config; this crate does
//! not depend on the gateway, keeping the contract reusable by the simulator.

use crate::horizon::{format_duration, replay_horizon};
use crate::questions::upstream_dedups;
use crate::report::Finding;
use crate::schema::{Claims, Contract, LeaseExpiry, Reconcile, Replication};

/// What a gateway route actually enforces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayFacts {
    /// The route's record retention.
    pub retention_s: u64,
    /// The route's tombstone horizon, counted from the first claim.
    pub tombstone_s: u64,
    /// The route's lease.
    pub lease_ms: u64,
    /// True when the route's lease-expiry policy is `takeover`.
    pub on_lease_expiry_takeover: bool,
    /// True when the route declares that its upstream dedups by the propagated key.
    pub upstream_dedups: bool,
    /// True when a `[[lookup]]` serves the route.
    pub has_lookup: bool,
    /// The route's region mode; `None` where there is none to judge (a
    /// queue consumer), and then `gateway.regions` is left out.
    pub region_mode: Option<RouteRegionMode>,
}

/// A gateway route's region mode, in the contract crate's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RouteRegionMode {
    /// `single`: the route's store decides every claim, unchecked.
    Single,
    /// `home-region`: only a key's home region claims it.
    HomeRegion,
    /// `synchronous`: the gateway runs only on a synchronously replicated store.
    Synchronous,
}

/// Where a gateway route takes its principal (tenant) from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PrincipalSource {
    /// A header the auth layer in front sets.
    TrustedHeader,
    /// A claim of a JWT the gateway verifies.
    VerifiedClaim,
    /// A digest of raw credential headers, declared knowingly.
    CredentialDigest,
    /// A digest of every raw credential the request carries, because the route
    /// declares no principal.
    DefaultCredentialDigest,
}

/// The `gateway.principal` finding for one route, judged with or without a
/// contract: the scope must name a stable tenant, or the route must say
/// that it knowingly digests the credential.
pub fn principal_finding(source: PrincipalSource) -> Finding {
    let t = "gateway.principal";
    match source {
        PrincipalSource::TrustedHeader => Finding::pass(
            t,
            "the principal is a header the auth layer sets; safe only if that layer overwrites \
             a client's copy",
        ),
        PrincipalSource::VerifiedClaim => Finding::pass(
            t,
            "the principal is a claim of a verified token: a refreshed token is the same tenant",
        ),
        PrincipalSource::CredentialDigest => Finding::pass(
            t,
            "the principal is a digest of raw credential headers, declared knowingly: a \
             refreshed or re-signed credential is a new scope and executes again",
        ),
        PrincipalSource::DefaultCredentialDigest => Finding::unanswered(
            t,
            "the route declares no principal, so it is a digest of every raw credential the \
             request carries (Authorization, Cookie, X-Api-Key, client certificate \
             headers): a refreshed token or cookie, or bearer for Bearer, executes \
             the same intent again, and callers who send none share one key space",
            "declare principal = { header = \"...\" } or principal = { jwt = { ... } }; or keep \
             the digest knowingly with principal = { credential_headers = [\"authorization\"] }",
        ),
    }
}

/// What the reference a route forwards upstream holds, for
/// `gateway.lookup_tenancy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForwardedReference {
    /// The scope digest and the key (`forward_key.template` holds
    /// `{scope_digest}`): a reference of its own per principal.
    PerScope,
    /// The key and fixed text only: the same reference for every principal.
    SharedAcrossPrincipals,
}

/// The `gateway.lookup_tenancy` finding for a route a `[[lookup]]` serves,
/// judged with or without a contract: the lookup asks the provider by the
/// reference the route forwarded, so that reference must differ between
/// two principals who chose the same key, or one principal's record is
/// completed with another's effect.
///
/// Whether a route is exposed to a lost tail (a failover or a restore
/// that loses records): with a lookup and the suspect window on, a fresh
/// key inside the window is verified with the provider before it runs;
/// without either, a retry of a key the store forgot runs again. Named,
/// not failed: whether a tail can be lost is the contract's `failover`
/// and `recovery` answer.
pub fn lost_tail_finding(has_lookup: bool, suspect_window_s: u64) -> Finding {
    let t = "gateway.lost_tail";
    match (has_lookup, suspect_window_s) {
        (true, 0) => Finding::pass(
            t,
            "exposed: suspect_window_s = 0, so a promoted PostgreSQL server opens no suspect \
             window and a retry of a key the store lost runs again (idem store restore and \
             mark-restored still open one)",
        ),
        (true, s) => Finding::pass(
            t,
            format!(
                "after a failover or a restore that loses records, fresh keys are verified with \
                 the provider's lookup for {s} s before they run"
            ),
        ),
        (false, _) => Finding::pass(
            t,
            "exposed: no [[lookup]], so after a failover or a restore that loses records a retry \
             of a key the store forgot runs again (counted in \
             idem_window_claims_total{outcome=\"unverified\"})",
        ),
    }
}

/// Every principal source can yield several principals (a credential
/// digest gives each credential its own, and `anonymous`), so every route
/// with a lookup needs a forwarded reference per scope.
pub fn lookup_tenancy_finding(source: PrincipalSource, forwarded: ForwardedReference) -> Finding {
    let t = "gateway.lookup_tenancy";
    let principals = match source {
        PrincipalSource::TrustedHeader => "two values of the trusted header",
        PrincipalSource::VerifiedClaim => "two values of the verified claim",
        PrincipalSource::CredentialDigest | PrincipalSource::DefaultCredentialDigest => {
            "two credentials"
        }
    };
    match forwarded {
        ForwardedReference::PerScope => Finding::pass(
            t,
            "the lookup asks by the forwarded reference, which holds the scope digest: \
             two tenants' same key are two references",
        ),
        ForwardedReference::SharedAcrossPrincipals => Finding::fail(
            t,
            format!(
                "the route forwards the same reference for {principals} with the same key, so \
                 its lookup would complete one tenant's record with another tenant's effect"
            ),
            "set the route's forward_key = { template = \"{scope_digest}:{key}\" } and look up \
             by {forwarded_key}",
        ),
    }
}

/// Who enforces the settings a cross-check judges; it names the findings'
/// topics (`gateway.lease`, `consumer.lease`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Enforcer {
    /// A gateway route.
    Gateway,
    /// A queue consumer's subscription.
    Consumer,
}

impl Enforcer {
    /// The topic of `check` when this enforcer's settings are judged.
    pub fn topic(self, check: &str) -> String {
        let side = match self {
            Enforcer::Gateway => "gateway",
            Enforcer::Consumer => "consumer",
        };
        format!("{side}.{check}")
    }
}

/// One finding per cross-check, topics `gateway.retention`, `gateway.tombstone`,
/// `gateway.lease`, `gateway.takeover`, `gateway.lookup`, `gateway.regions`.
/// All must pass.
pub fn cross_check(contract: &Contract, facts: &GatewayFacts) -> Vec<Finding> {
    cross_check_for(Enforcer::Gateway, contract, facts)
}

/// [`cross_check`] of what `by` enforces, its topics named for it
/// (`consumer.retention`, …); `regions` only where there is a region mode.
pub fn cross_check_for(by: Enforcer, contract: &Contract, facts: &GatewayFacts) -> Vec<Finding> {
    let mut findings = vec![
        retention(contract, facts, &by.topic("retention")),
        tombstone(contract, facts, &by.topic("tombstone")),
        lease(contract, facts, &by.topic("lease")),
        takeover(contract, facts, &by.topic("takeover")),
        lookup(contract, facts, &by.topic("lookup")),
    ];
    if let Some(mode) = facts.region_mode {
        findings.push(regions(contract, mode, &by.topic("regions")));
    }
    findings
}

fn retention(c: &Contract, g: &GatewayFacts, t: &str) -> Finding {
    let need_contract = c.retention.as_ref().map_or(0, |r| r.retention_s);
    let need_horizon = replay_horizon(c.replay.as_ref()).map_or(0, |h| h.total_s);
    let need = need_contract.max(need_horizon);
    if g.retention_s < need {
        let what = if need_horizon > need_contract {
            "the replay horizon"
        } else {
            "the contract's retention"
        };
        return Finding::fail(
            t,
            format!(
                "route retention {} is shorter than {what} {}",
                format_duration(g.retention_s),
                format_duration(need)
            ),
            format!("set the route's retention_s to at least {need}"),
        );
    }
    Finding::pass(
        t,
        format!(
            "route retention {} covers {}",
            format_duration(g.retention_s),
            format_duration(need)
        ),
    )
}

fn tombstone(c: &Contract, g: &GatewayFacts, t: &str) -> Finding {
    let need = c.retention.as_ref().map_or(0, |r| r.tombstone_s);
    if g.tombstone_s < need {
        return Finding::fail(
            t,
            format!(
                "route tombstone {} is shorter than the contract's {}",
                format_duration(g.tombstone_s),
                format_duration(need)
            ),
            format!("set the route's tombstone_s to at least {need}"),
        );
    }
    Finding::pass(
        t,
        format!(
            "route tombstone {} covers the contract's",
            format_duration(g.tombstone_s)
        ),
    )
}

fn lease(c: &Contract, g: &GatewayFacts, t: &str) -> Finding {
    let Some(cc) = &c.concurrency else {
        return Finding::unanswered(
            t,
            "the contract has no [concurrency]: the upstream timeout is unknown",
            "add [concurrency] with upstream_timeout_ms",
        );
    };
    if g.lease_ms < cc.upstream_timeout_ms {
        return Finding::fail(
            t,
            format!(
                "route lease {} ms is shorter than the upstream timeout {} ms: the lease expires mid-attempt",
                g.lease_ms, cc.upstream_timeout_ms
            ),
            format!(
                "set the route's lease_ms to at least {}",
                cc.upstream_timeout_ms
            ),
        );
    }
    Finding::pass(
        t,
        format!(
            "route lease {} ms covers the upstream timeout {} ms",
            g.lease_ms, cc.upstream_timeout_ms
        ),
    )
}

fn takeover(c: &Contract, g: &GatewayFacts, t: &str) -> Finding {
    if !g.on_lease_expiry_takeover {
        return Finding::pass(t, "an expired lease is reconciled, never taken over");
    }
    if !g.upstream_dedups {
        return Finding::fail(
            t,
            "the route takes over expired leases but does not declare that the upstream dedups by key",
            "use on_lease_expiry = reconcile, or declare upstream dedup only if the provider really dedups",
        );
    }
    let contract_takeover = c
        .concurrency
        .as_ref()
        .is_some_and(|cc| cc.on_lease_expiry == LeaseExpiry::Takeover);
    if !contract_takeover || !upstream_dedups(c) {
        return Finding::fail(
            t,
            "the route takes over expired leases but the contract does not allow takeover with a deduplicating upstream",
            "align the route with the contract: reconcile, or state the provider's dedup in the contract",
        );
    }
    Finding::pass(
        t,
        "takeover is safe: the upstream dedups by the propagated key",
    )
}

fn lookup(c: &Contract, g: &GatewayFacts, t: &str) -> Finding {
    let wants = c
        .ambiguity
        .as_ref()
        .is_some_and(|a| a.reconcile == Reconcile::ProviderLookup);
    match (wants, g.has_lookup) {
        (true, false) => Finding::fail(
            t,
            "the contract reconciles by provider lookup but the route has no [[lookup]]",
            "add a [[lookup]] for the route, asking by {forwarded_key}",
        ),
        (true, true) => Finding::pass(t, "the route's [[lookup]] reconciles unknown outcomes"),
        (false, _) => Finding::pass(t, "the contract does not reconcile by provider lookup"),
    }
}

/// The route's region mode against the contract's `[regions]`: the mode
/// the contract's safety rests on must be the one the gateway enforces.
fn regions(c: &Contract, route_mode: RouteRegionMode, t: &str) -> Finding {
    let mode = match route_mode {
        RouteRegionMode::Single => "single",
        RouteRegionMode::HomeRegion => "home-region",
        RouteRegionMode::Synchronous => "synchronous",
    };
    let set = |want: &str| format!("set the route's regions = {{ mode = \"{want}\", ... }}");
    let (several, replication, claims) = match &c.regions {
        Some(r) if r.names.len() > 1 => (true, r.replication, r.claims),
        Some(r) => (false, r.replication, r.claims),
        None => (false, Replication::None, None),
    };
    match (several, replication, claims, route_mode) {
        (_, Replication::Sync, _, RouteRegionMode::Synchronous) => Finding::pass(
            t,
            "the contract replicates synchronously and the route runs only on a store whose \
             commits wait for a synchronous standby; trade-off: each claim pays the standby's \
             round trip and stalls while it is away",
        ),
        (true, Replication::Sync, _, _) => Finding::fail(
            t,
            format!(
                "the contract says replication = \"sync\" but the route's mode is {mode}: the \
                 gateway never checks that its store waits for a standby"
            ),
            set("synchronous"),
        ),
        (true, _, Some(Claims::HomeRegion), RouteRegionMode::HomeRegion) => Finding::pass(
            t,
            "the contract claims each key in its home region and the route claims only keys \
             homed here, forwarding or refusing the rest; trade-off: a foreign key pays a \
             cross-region hop, and a hard failover loses the replication lag's claims",
        ),
        (true, _, Some(Claims::HomeRegion), _) => Finding::fail(
            t,
            format!(
                "the contract says claims = \"home_region\" but the route's mode is {mode}: this \
                 gateway would claim keys homed in another region"
            ),
            set("home-region"),
        ),
        (_, _, _, RouteRegionMode::HomeRegion) => Finding::fail(
            t,
            if several {
                "the route routes keys to a home region but the contract accepts claims in any \
                 region: the contract and the gateway disagree on where a key is claimed"
            } else {
                "the route routes keys to a home region but the contract declares one region"
            },
            "declare [regions] with claims = \"home_region\" in the contract, or set the \
             route's mode to single",
        ),
        (_, _, _, RouteRegionMode::Synchronous) => Finding::fail(
            t,
            "the route demands a synchronously replicated store but the contract does not say \
             replication = \"sync\"",
            "declare replication = \"sync\" in the contract's [regions], or set the route's \
             mode to single",
        ),
        (false, _, _, RouteRegionMode::Single) => {
            Finding::pass(t, "one region: the route's store decides every claim")
        }
        (true, _, _, _) => Finding::pass(
            t,
            "the contract accepts claims in any region and the route claims every key here; \
             the failover question judges whether that is safe",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Verdict;

    #[test]
    fn a_lookup_passes_only_when_the_forwarded_reference_is_per_scope() {
        let sources = [
            PrincipalSource::TrustedHeader,
            PrincipalSource::VerifiedClaim,
            PrincipalSource::CredentialDigest,
            PrincipalSource::DefaultCredentialDigest,
        ];
        for source in sources {
            let cases = [
                (ForwardedReference::PerScope, Verdict::Pass),
                (ForwardedReference::SharedAcrossPrincipals, Verdict::Fail),
            ];
            for (forwarded, want) in cases {
                let f = lookup_tenancy_finding(source, forwarded);
                assert_eq!(f.topic, "gateway.lookup_tenancy");
                assert_eq!(f.verdict, want, "{source:?} {forwarded:?}: {}", f.why);
                if want == Verdict::Fail {
                    let change = f.change.unwrap_or_default();
                    assert!(change.contains("{scope_digest}:{key}"), "{change}");
                    assert!(change.contains("{forwarded_key}"), "{change}");
                }
            }
        }
    }
}
