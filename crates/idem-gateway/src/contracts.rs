//! The contracts routes name: each is judged by `idem check`'s twelve
//! questions and cross-checked against what the route really enforces, so a
//! gateway never runs a route whose own contract says it is unsafe.

use std::path::PathBuf;

use idem_contract::{GatewayFacts, Judgement, RouteRegionMode};
use idem_http::Route;

use crate::GatewayConfig;
use crate::regions::RegionMode;

pub use crate::findings::{lookup_tenancy, principal};

/// One route's contract and its verdicts.
#[derive(Debug)]
pub struct RouteContract {
    /// The route's name (or its pattern when unnamed).
    pub route: String,
    /// The contract file, resolved against the config file's directory.
    pub path: PathBuf,
    /// The twelve questions and the cross-check, or why the file could not
    /// be read.
    pub outcome: Judgement,
}

impl RouteContract {
    /// True when the file was read, every question passed and every
    /// cross-check passed.
    pub fn passed(&self) -> bool {
        idem_contract::judgement_passed(&self.outcome)
    }

    /// One line per failure, for logs and refusals.
    pub fn failures(&self) -> Vec<String> {
        idem_contract::judgement_failures(&self.outcome)
    }
}

/// Judges the contract of every route that names one.
pub fn evaluate(config: &GatewayConfig) -> Vec<RouteContract> {
    config
        .routes
        .iter()
        .filter_map(|route| {
            let file = route.contract()?;
            let path = config.base_dir.join(file);
            let outcome = idem_contract::load(&path).map(|contract| {
                let report = idem_contract::check(&contract);
                let cross = idem_contract::cross_check(&contract, &facts(config, route));
                (report, cross)
            });
            Some(RouteContract {
                route: route_name(route).to_owned(),
                path,
                outcome,
            })
        })
        .collect()
}

/// The name a route is shown by: its operation name, or its pattern.
pub fn route_name(route: &Route) -> &str {
    route.operation_name().unwrap_or(route.pattern().as_str())
}

/// True when a `[[lookup]]` serves the route.
pub fn has_lookup(config: &GatewayConfig, route: &Route) -> bool {
    route
        .operation_name()
        .is_some_and(|name| config.lookups.iter().any(|(op, _)| op == name))
}

/// What the route enforces, in the contract crate's terms.
fn facts(config: &GatewayConfig, route: &Route) -> GatewayFacts {
    let policy = route.policy();
    GatewayFacts {
        retention_s: policy.retention_s(),
        tombstone_s: policy.tombstone_s(),
        lease_ms: policy.lease_ms(),
        on_lease_expiry_takeover: policy.on_lease_expiry() == idem_core::LeaseExpiry::Takeover,
        upstream_dedups: route.upstream_dedups(),
        has_lookup: has_lookup(config, route),
        region_mode: Some(region_mode(config, route)),
    }
}

/// The route's region mode, in the contract crate's terms.
fn region_mode(config: &GatewayConfig, route: &Route) -> RouteRegionMode {
    config
        .routes
        .iter()
        .position(|r| std::ptr::eq(r, route))
        .and_then(|i| config.route_regions.get(i))
        .map_or(RouteRegionMode::Single, |mode| match mode {
            RegionMode::HomeRegion(_) => RouteRegionMode::HomeRegion,
            RegionMode::Synchronous => RouteRegionMode::Synchronous,
            _ => RouteRegionMode::Single,
        })
}
