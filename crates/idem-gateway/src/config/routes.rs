//! The routes' section: each `[[route]]` validated, with what it buffers,
//! a lease that outlasts its response timeout, the probe paths it must
//! leave free and the suspect window its retention sets.

use std::path::Path;
use std::time::Duration;

use idem_core::Policy;
use idem_http::{Route, RouteSpec, WAIT_MS_LIMIT};

use super::{
    BODY_BUFFER_BYTES_MAX_DEFAULT, BODY_BUFFER_BYTES_MAX_LIMIT, ConfigError, FileConfig,
    PROBE_PATHS, Place, SUSPECT_WINDOW_S_MAX, regions,
};
use crate::regions::{RegionMode, Regions};

/// `body_buffer_bytes_max`, in range and no smaller than any route's
/// `body_bytes_max`: such a route's largest bodies could never be read.
pub(super) fn body_buffer_bytes_max(file: &FileConfig, routes: &[Route]) -> Result<usize, String> {
    let Some(n) = file.body_buffer_bytes_max else {
        return Ok(BODY_BUFFER_BYTES_MAX_DEFAULT);
    };
    let bytes = usize::try_from(n)
        .ok()
        .filter(|_| (1..=BODY_BUFFER_BYTES_MAX_LIMIT).contains(&n))
        .ok_or_else(|| format!("{n} is out of range (1..={BODY_BUFFER_BYTES_MAX_LIMIT})"))?;
    match routes
        .iter()
        .enumerate()
        .find(|(_, r)| r.body_bytes_max() > bytes)
    {
        Some((i, route)) => Err(format!(
            "{n} is below route[{i}].body_bytes_max ({}): that route's largest bodies could \
             never be read; raise it or lower the route's limit",
            route.body_bytes_max()
        )),
        None => Ok(bytes),
    }
}

/// The route with `wait_ms_max` defaulted to the response timeout (the
/// longest the attempt waited for can take), when that is within the lease.
pub(super) fn with_wait_default(spec: &RouteSpec, response_timeout: Duration) -> RouteSpec {
    let timeout_ms = u64::try_from(response_timeout.as_millis()).unwrap_or(u64::MAX);
    let lease_ms = spec.lease_ms.unwrap_or(Policy::DEFAULT.lease_ms());
    let mut spec = spec.clone();
    if spec.wait_ms_max.is_none() && timeout_ms <= lease_ms {
        spec.wait_ms_max = Some(timeout_ms.min(WAIT_MS_LIMIT));
    }
    spec
}

/// The route with the files it names resolved against the config file's
/// directory (the contract is resolved later, by [`crate::contracts`]).
pub(super) fn relative_to(spec: &RouteSpec, dir: &Path) -> RouteSpec {
    RouteSpec {
        principal: spec.principal.as_ref().map(|p| p.relative_to(dir)),
        ..spec.clone()
    }
}

/// The routes, what they buffer, and where their keys are homed.
pub(super) struct RouteSection {
    pub(super) routes: Vec<Route>,
    pub(super) body_buffer_bytes_max: usize,
    pub(super) regions: Regions,
    pub(super) route_regions: Vec<RegionMode>,
}

impl RouteSection {
    pub(super) fn validate(
        file: &FileConfig,
        base_dir: &Path,
        response_timeout: Duration,
        at: Place,
    ) -> Result<RouteSection, ConfigError> {
        let routes = if file.routes.is_empty() {
            let spec = with_wait_default(&RouteSpec::default(), response_timeout);
            vec![Route::new(&spec).map_err(|e| at.err(e.field, e.reason, true))?]
        } else {
            file.routes
                .iter()
                .enumerate()
                .map(|(i, spec)| {
                    let spec = with_wait_default(&relative_to(spec, base_dir), response_timeout);
                    Route::new(&spec).map_err(|e| {
                        let name = spec
                            .name
                            .as_deref()
                            .map(|n| format!(" ({n:?})"))
                            .unwrap_or_default();
                        at.err(
                            &format!("route[{i}].{}", e.field),
                            format!("{}{name}", e.reason),
                            true,
                        )
                    })
                })
                .collect::<Result<_, _>>()?
        };
        let body_buffer_bytes_max = body_buffer_bytes_max(file, &routes)
            .map_err(|reason| at.err("body_buffer_bytes_max", reason, true))?;
        check_lease_outlasts(&routes, &file.routes, response_timeout)
            .map_err(|(field, reason)| at.err(&field, reason, true))?;
        let regions =
            regions::validate(file).map_err(|(field, reason)| at.err(&field, reason, true))?;
        let route_regions = if file.routes.is_empty() {
            vec![RegionMode::Single]
        } else {
            file.routes
                .iter()
                .zip(&routes)
                .enumerate()
                .map(|(i, (spec, route))| {
                    RegionMode::new(spec.regions.as_ref(), route, &regions).map_err(
                        |(field, reason)| at.err(&format!("route[{i}].{field}"), reason, true),
                    )
                })
                .collect::<Result<_, _>>()?
        };
        Ok(RouteSection {
            routes,
            body_buffer_bytes_max,
            regions,
            route_regions,
        })
    }
}

/// `probe_paths`, refused when a protected route would take the probes' GETs.
pub(super) fn probe_paths(
    file: &FileConfig,
    routes: &[Route],
    at: Place,
) -> Result<bool, ConfigError> {
    let probe_paths = file.probe_paths.unwrap_or(false);
    if probe_paths {
        // A protected route on a probe path would never see its GETs.
        let get = http::Method::GET;
        for (i, route) in routes.iter().enumerate() {
            if let Some(path) = PROBE_PATHS.iter().find(|p| route.matches(&get, p)) {
                return Err(at.err(
                    "probe_paths",
                    format!(
                        "route[{i}] protects GET {path}, which probe_paths answers on the \
                         proxy listener; leave probe_paths off (the admin listener answers \
                         the probes) or keep GET off that route"
                    ),
                    true,
                ));
            }
        }
    }
    Ok(probe_paths)
}

/// `suspect_window_s`, by default the longest retention of the routes.
pub(super) fn suspect_window(
    file: &FileConfig,
    routes: &[Route],
    at: Place,
) -> Result<Duration, ConfigError> {
    match file.suspect_window_s {
        None => Ok(Duration::from_secs(
            routes
                .iter()
                .map(|r| r.policy().retention_s())
                .max()
                .unwrap_or(idem_core::Policy::default().retention_s()),
        )),
        Some(s @ 0..=SUSPECT_WINDOW_S_MAX) => Ok(Duration::from_secs(s)),
        Some(s) => Err(at.err(
            "suspect_window_s",
            format!("{s} is out of range (0..={SUSPECT_WINDOW_S_MAX})"),
            true,
        )),
    }
}

/// Every route's lease must be longer than the response timeout. While the
/// gateway still waits for the upstream, the attempt may commit; a lease that
/// ends first lets a retry mark it ambiguous and a reconciler release it on a
/// "not found" (a verdict trusted once the lease is over), and the retry then
/// runs the effect a second time. The lease must also cover however long the
/// upstream itself may keep processing; only the operator knows that, and
/// docs/http.md says so.
pub(super) fn check_lease_outlasts(
    routes: &[Route],
    specs: &[RouteSpec],
    response_timeout: Duration,
) -> Result<(), (String, String)> {
    let timeout_ms = u64::try_from(response_timeout.as_millis()).unwrap_or(u64::MAX);
    for (i, route) in routes.iter().enumerate() {
        let lease_ms = route.policy().lease_ms();
        if lease_ms > timeout_ms {
            continue;
        }
        let (field, whose) = match specs.get(i).and_then(|s| s.lease_ms) {
            Some(_) => (format!("route[{i}].lease_ms"), "lease_ms"),
            None if specs.is_empty() => ("response_timeout_ms".to_owned(), "the default lease"),
            None => (format!("route[{i}].lease_ms"), "the default lease_ms"),
        };
        return Err((
            field,
            format!(
                "{whose} ({lease_ms} ms) must be longer than response_timeout_ms ({timeout_ms} ms): \
                 an attempt may still commit while the gateway waits for the upstream, and \
                 its lease must not end before that; raise lease_ms to cover the upstream's \
                 longest processing time, or lower response_timeout_ms"
            ),
        ));
    }
    Ok(())
}
