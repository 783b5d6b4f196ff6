//! The records page's search form, read into a [`Filter`]: the state and
//! age checked, and the tenant the operator knows (a header value or a
//! JWT claim) turned into the principal digests its records carry,
//! exactly as each route's principal extraction makes them. A route
//! whose principal is a digest of raw credentials cannot be searched by
//! tenant, and the page says so: the console never asks for a credential.

use idem_core::State;
use idem_http::{Route, TenantSearchError};
use serde::Deserialize;

use super::records::Filter;

/// The state the list shows when the form names none: the backlog.
pub(crate) const STATE_DEFAULT: &str = "ambiguous";
/// Every state the form offers, as written in links; `any` is no filter.
pub(crate) const STATES: [(&str, &str); 5] = [
    ("ambiguous", "Ambiguous"),
    ("in_progress", "In progress"),
    ("completed", "Completed"),
    ("tombstone", "Tombstone"),
    ("any", "Any state"),
];

/// The search form as the browser sends it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct SearchParams {
    pub key: String,
    pub route: String,
    pub tenant: String,
    pub principal: String,
    pub state: String,
    pub older_than_min: String,
    pub after_scope: Option<String>,
    pub after_key: Option<String>,
}

/// A search, validated.
pub(crate) struct Search {
    pub filter: Filter,
    /// The state as written in the form and links.
    pub state: String,
    /// The age as written.
    pub older: String,
    /// Routes the tenant could not be searched on, and why.
    pub unsearchable: Vec<String>,
}

impl Search {
    /// The search `params` ask for over `routes`, or why it cannot run.
    pub(crate) fn new(params: &SearchParams, routes: &[Route]) -> Result<Search, String> {
        let state_text = match params.state.trim() {
            "" => STATE_DEFAULT,
            text => text,
        };
        let state = state_of(state_text)?;
        let older = params.older_than_min.trim();
        let older_than_min = match older {
            "" => None,
            text => Some(text.parse::<u64>().map_err(|_| {
                format!("Older than must be a whole number of minutes, not {text:?}.")
            })?),
        };
        let route = params.route.trim();
        let tenant = params.tenant.trim();
        let (tenant_digests, unsearchable) = match tenant {
            "" => (Vec::new(), Vec::new()),
            value => tenant_digests(value, route, routes)?,
        };
        Ok(Search {
            filter: Filter {
                key: params.key.trim().to_owned(),
                route: route.to_owned(),
                principal: params.principal.trim().to_owned(),
                tenant: tenant.to_owned(),
                tenant_digests,
                state,
                older_than_min,
            },
            state: state_text.to_owned(),
            older: older.to_owned(),
            unsearchable,
        })
    }
}

fn state_of(text: &str) -> Result<Option<State>, String> {
    Ok(Some(match text {
        "any" => return Ok(None),
        "ambiguous" => State::Ambiguous,
        "in_progress" => State::InProgress,
        "completed" => State::Completed,
        "tombstone" => State::Tombstone,
        other => {
            return Err(format!(
                "State must be one of ambiguous, in_progress, completed, tombstone or any, not {other:?}."
            ));
        }
    }))
}

/// The digests `value` has on the route named `route` (every route when
/// empty), and the routes it cannot be searched on.
fn tenant_digests(
    value: &str,
    route: &str,
    routes: &[Route],
) -> Result<(Vec<String>, Vec<String>), String> {
    let chosen: Vec<&Route> = routes
        .iter()
        .filter(|r| route.is_empty() || r.operation_name() == Some(route))
        .collect();
    if chosen.is_empty() {
        return Err(format!(
            "No route of this gateway is named {route:?}, so its tenants' digests are unknown."
        ));
    }
    let mut digests = Vec::new();
    let mut unsearchable = Vec::new();
    for r in chosen {
        let name = idem_gateway::contracts::route_name(r);
        match r.tenant_digests(value) {
            Ok(found) => {
                for digest in found {
                    if !digests.contains(&digest) {
                        digests.push(digest);
                    }
                }
            }
            Err(e @ TenantSearchError::CredentialDigest) => {
                unsearchable.push(format!("route {name}: {e}"));
            }
            Err(e) => return Err(format!("Tenant: {e}.")),
        }
    }
    if digests.is_empty() {
        return Err(format!(
            "Tenant search cannot be done here. {}.",
            unsearchable.join("; ")
        ));
    }
    Ok((digests, unsearchable))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use http::HeaderName;

    use super::*;

    fn routes() -> Vec<Route> {
        let header = Route::builder()
            .name("payouts")
            .principal_header(HeaderName::from_static("x-tenant-id"))
            .build()
            .unwrap();
        let secret = Route::builder()
            .name("refunds")
            .principal_credential_headers([http::header::AUTHORIZATION])
            .build()
            .unwrap();
        vec![header, secret]
    }

    fn search(pairs: &[(&str, &str)]) -> Result<Search, String> {
        let mut params = SearchParams::default();
        for (name, value) in pairs {
            let value = (*value).to_owned();
            match *name {
                "key" => params.key = value,
                "route" => params.route = value,
                "tenant" => params.tenant = value,
                "state" => params.state = value,
                "older_than_min" => params.older_than_min = value,
                _ => panic!("{name}"),
            }
        }
        Search::new(&params, &routes())
    }

    #[test]
    fn a_tenant_becomes_the_digests_its_routes_make() {
        let all = search(&[("tenant", "acme")]).unwrap();
        assert_eq!(
            all.filter.tenant_digests,
            routes()[0].tenant_digests("acme").unwrap()
        );
        assert_eq!(all.unsearchable.len(), 1);
        assert!(
            all.unsearchable[0].contains("route refunds"),
            "{:?}",
            all.unsearchable
        );
        assert_eq!(
            all.filter.state,
            Some(State::Ambiguous),
            "the backlog by default"
        );
        let cases: [(&[(&str, &str)], &str); 4] = [
            (
                &[("tenant", "acme"), ("route", "refunds")],
                "raw credentials",
            ),
            (
                &[("tenant", "acme"), ("route", "nowhere")],
                "No route of this gateway",
            ),
            (&[("state", "lost")], "State must be one of"),
            (&[("older_than_min", "ten")], "whole number of minutes"),
        ];
        for (pairs, said) in cases {
            let err = search(pairs).err().unwrap();
            assert!(err.contains(said), "{pairs:?}: {err}");
        }
        assert_eq!(search(&[("state", "any")]).unwrap().filter.state, None);
    }
}
