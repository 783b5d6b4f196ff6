//! The contract findings a route's own settings decide, judged from the
//! route alone: `gateway.principal` and `gateway.lookup_tenancy`. Apart
//! from `contracts`, which reads the whole config, so that the config can
//! refuse a lookup that fails without the two modules reading each other.

use idem_contract::{Finding, ForwardedReference, PrincipalSource};
use idem_http::{ForwardedScope, PrincipalKind, Route};

/// The route's principal, judged: `gateway.principal`.
pub fn principal(route: &Route) -> Finding {
    idem_contract::principal_finding(principal_source(route))
}

/// The lookup of a route that a `[[lookup]]` serves, judged:
/// `gateway.lookup_tenancy`. `idem serve` and `idem reconcile` refuse a
/// config where it fails; `idem check --gateway` reports it.
pub fn lookup_tenancy(route: &Route) -> Finding {
    let forwarded = match route.forwarded_scope() {
        ForwardedScope::PerScope => ForwardedReference::PerScope,
        _ => ForwardedReference::SharedAcrossPrincipals,
    };
    idem_contract::lookup_tenancy_finding(principal_source(route), forwarded)
}

fn principal_source(route: &Route) -> PrincipalSource {
    match route.principal_kind() {
        PrincipalKind::TrustedHeader => PrincipalSource::TrustedHeader,
        PrincipalKind::VerifiedClaim => PrincipalSource::VerifiedClaim,
        PrincipalKind::CredentialDigest => PrincipalSource::CredentialDigest,
        _ => PrincipalSource::DefaultCredentialDigest,
    }
}
