//! The lookups' section: each `[[lookup]]` bound to the one named route
//! it serves, and given the trust an https:// provider is checked with.

use std::sync::Arc;

use idem_http::Route;
use idem_process::UpstreamTls;
use idem_reconcile::{ForwardedKey, Lookup, LookupSpec, LookupTarget};

use super::{ConfigError, FileConfig, Place, UnsafeLookup};

/// `lookups`, the https ones trusting `trust`.
pub(super) fn with_trust(
    lookups: Vec<(String, Lookup)>,
    trust: &UpstreamTls,
) -> Vec<(String, Lookup)> {
    lookups
        .into_iter()
        .map(|(served, lookup)| match lookup.is_https() {
            true => (
                served,
                lookup.with_tls(trust.shared_config(), trust.trust()),
            ),
            false => (served, lookup),
        })
        .collect()
}

/// Each `[[lookup]]`, bound to the one named route it serves.
pub(super) fn lookups(
    file: &FileConfig,
    routes: &[Route],
    unsafe_lookup: UnsafeLookup,
    at: Place,
) -> Result<Vec<(String, Lookup)>, ConfigError> {
    file.lookups
        .iter()
        .enumerate()
        .map(|(i, entry)| lookup(i, entry, routes, unsafe_lookup, at))
        .collect()
}

/// `lookup[i]`, bound to its route.
pub(super) fn lookup(
    i: usize,
    entry: &LookupSpec,
    routes: &[Route],
    unsafe_lookup: UnsafeLookup,
    at: Place,
) -> Result<(String, Lookup), ConfigError> {
    let served = entry
        .target(LookupTarget::Route)
        .map_err(|(field, why)| at.err(&format!("lookup[{i}].{field}"), why, true))?;
    let mut named = routes
        .iter()
        .enumerate()
        .filter(|(_, r)| r.operation_name() == Some(served));
    let field = format!("lookup[{i}].route");
    let (r, route) = match (named.next(), named.next()) {
        (Some(only), None) => only,
        (None, _) => {
            let reason =
                format!("no [[route]] has name = {served:?}; a lookup serves a named route");
            return Err(at.err(&field, reason, true));
        }
        // One scope, two forward templates: a lookup renders one.
        (Some((a, _)), Some((b, _))) => {
            let reason = format!(
                "route[{a}] and route[{b}] are both named {:?}; they share their \
                 records, and a lookup asks by one forwarded reference per record, \
                 so it serves a route whose name no other route has",
                served
            );
            return Err(at.err(&field, reason, true));
        }
    };
    let tenancy = crate::findings::lookup_tenancy(route);
    if unsafe_lookup == UnsafeLookup::Refuse && !tenancy.verdict.passed() {
        return Err(at.err(
            &format!("route[{r}].forward_key.template"),
            format!(
                "lookup[{i}] serves route {served:?}, but {}; {}",
                tenancy.why,
                tenancy.change.unwrap_or_default()
            ),
            true,
        ));
    }
    let route = route.clone();
    let forwarded: ForwardedKey = Arc::new(move |id| route.forwarded_key(id));
    Lookup::new(entry, forwarded)
        .map(|lookup| (served.to_owned(), lookup))
        .map_err(|e| at.err(&format!("lookup[{i}].{}", e.field), e.reason, true))
}
