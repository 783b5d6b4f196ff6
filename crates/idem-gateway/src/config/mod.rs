//! The gateway's configuration: a TOML file and command-line overrides,
//! parsed once into a validated [`GatewayConfig`], section by section
//! (`file`: where it listens, forwards and stores; `listeners`; `admin`:
//! the named operators; `routes`; `lookups`; `regions`). Every error
//! names the file and the field.

mod admin;
mod file;
mod listeners;
mod lookups;
mod regions;
mod routes;

pub use admin::{AdminOperators, AdminSection, OperatorSpec};
pub use file::FileConfig;
use file::{Basics, Place, parse_upstream, read_file};
pub use listeners::SessionLimits;
use listeners::{Limits, TlsSection, parse_admin_listen};
use lookups::{lookups, with_trust};
use routes::{RouteSection, probe_paths, suspect_window};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Uri;
use idem_http::{Route, WaitLimits};
use idem_process::{ConnectionLimits, ServerTls, StoreUrl, UpstreamTls};
use idem_reconcile::{Lookup, ReconcileSettings};

use crate::admin::Operators;
use crate::regions::{RegionMode, Regions};
use crate::tls::AdminTransport;

/// The default listen address.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:8080";
/// Default connect timeout, in milliseconds.
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 2_000;
/// Default response timeout, in milliseconds: shorter than the default
/// lease (30 s), which must outlast it (see `routes::check_lease_outlasts`).
pub const RESPONSE_TIMEOUT_MS_DEFAULT: u64 = 25_000;
/// The longest timeout accepted, in milliseconds (one hour).
pub const TIMEOUT_MS_MAX: u64 = 3_600_000;
/// The most routes a config may declare.
pub const ROUTES_MAX: usize = 1_000;
/// The longest `problem_type_base`, in bytes.
pub const PROBLEM_TYPE_BASE_BYTES_MAX: usize = 512;
/// The environment variable holding the admin API's bearer token, by default.
pub const ADMIN_TOKEN_ENV_DEFAULT: &str = "IDEM_ADMIN_TOKEN";
/// Default time between two purges, in seconds.
pub const PURGE_INTERVAL_S_DEFAULT: u64 = 60;
/// The longest time between two purges, in seconds (one day).
pub const PURGE_INTERVAL_S_MAX: u64 = 86_400;
/// The longest `suspect_window_s`: the longest horizon a route may have.
pub const SUSPECT_WINDOW_S_MAX: u64 = idem_core::HORIZON_S_MAX;
/// Default bound on requests the proxy serves at once. With the default
/// limits (1 MiB request body, 1 MiB stored response) the requests in
/// flight buffer at most about 512 MiB.
pub const REQUESTS_IN_FLIGHT_MAX_DEFAULT: usize = 256;
/// The largest accepted `requests_in_flight_max`.
pub const REQUESTS_IN_FLIGHT_MAX_LIMIT: usize = 65_536;
/// Default bound on connections the proxy listener serves at once.
pub const CONNECTIONS_MAX_DEFAULT: usize = 1_024;
/// Default bound on connections the admin listener serves at once: its
/// own, so that clients of the proxy can never take the operator's.
pub const ADMIN_CONNECTIONS_MAX_DEFAULT: usize = 256;
/// The largest accepted `connections_max` and `admin_connections_max`.
pub const CONNECTIONS_MAX_LIMIT: usize = 65_536;
/// Default time for a request head to arrive, from a connection's start
/// or the end of its previous response, in milliseconds.
pub const HEADER_READ_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Default time for a protected (or small) request body to arrive in
/// full once its head has, in milliseconds.
pub const BODY_READ_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Default time for a TLS handshake with the admin listener, in
/// milliseconds.
pub const TLS_HANDSHAKE_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Default bound on the request body bytes the gateway buffers at once,
/// bodies still arriving and bodies of requests in flight together: what
/// the default in-flight limit buffered with 1 MiB bodies.
pub const BODY_BUFFER_BYTES_MAX_DEFAULT: usize = 256 * 1024 * 1024;
/// The largest accepted `waiters_max`, `waiters_per_key_max` and
/// `waiters_per_principal_max`.
pub const WAITERS_LIMIT: usize = 65_536;
/// The largest accepted `body_buffer_bytes_max` (64 GiB).
pub const BODY_BUFFER_BYTES_MAX_LIMIT: u64 = 64 * 1024 * 1024 * 1024;
/// Default idle limit of a console session, in seconds (15 minutes).
pub const SESSION_IDLE_S_DEFAULT: u64 = 15 * 60;
/// Default absolute limit of a console session, in seconds (8 hours).
pub const SESSION_ABSOLUTE_S_DEFAULT: u64 = 8 * 60 * 60;
/// The longest session limit accepted, in seconds (one week).
pub const SESSION_S_MAX: u64 = 7 * 24 * 60 * 60;

/// Values given on the command line; they win over the file.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `--listen`.
    pub listen: Option<String>,
    /// `--upstream`.
    pub upstream: Option<String>,
    /// `--store`.
    pub store: Option<String>,
    /// `--upstream-ca-file`.
    pub upstream_ca_file: Option<PathBuf>,
    /// `--admin-tls-cert-file`.
    pub admin_tls_cert_file: Option<PathBuf>,
    /// `--admin-tls-key-file`.
    pub admin_tls_key_file: Option<PathBuf>,
}

/// A validated gateway configuration.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// The certificate the proxy listener serves HTTPS with; `None`:
    /// plain HTTP.
    pub listen_tls: Option<ServerTls>,
    /// Whether the proxy listener answers the probes' paths itself.
    pub probe_paths: bool,
    /// Upstream base URL (`http[s]://host:port[/base]`).
    pub upstream: Uri,
    /// The roots an `https://` upstream's certificate is verified against;
    /// `None` for an `http://` upstream.
    pub upstream_tls: Option<UpstreamTls>,
    /// The store, checked; opened by the caller.
    pub store: StoreUrl,
    /// Record owner label.
    pub owner: String,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Response timeout.
    pub response_timeout: Duration,
    /// Routes, first match wins.
    pub routes: Vec<Route>,
    /// Each route's region mode, in the order of `routes`.
    pub route_regions: Vec<RegionMode>,
    /// This gateway's region, if declared: written on acquired records
    /// ([`idem_core::check_region`]) and used by `home-region` routes.
    pub region: Option<String>,
    /// Other regions' gateways, by region name.
    pub peers: BTreeMap<String, Uri>,
    /// What an `https://` peer is trusted through (the system's roots and
    /// `upstream_ca_file`'s); `None` when no peer is https.
    pub peer_tls: Option<UpstreamTls>,
    /// Where the admin API listens; `None`: it is off.
    pub admin_listen: Option<SocketAddr>,
    /// The environment variable the admin API's bearer token is read from.
    pub admin_token_env: String,
    /// The admin API's and the console's operators (`[admin]`).
    pub admin_operators: AdminOperators,
    /// The admin API's certificate and key; `None`: it speaks plain HTTP.
    pub admin_tls: Option<ServerTls>,
    /// Time between two runs of the retention purge.
    pub purge_interval: Duration,
    /// The base of every problem `type` URI (`problem_type_base`); `None`:
    /// `urn:idem:problem:`.
    pub problem_type_base: Option<String>,
    /// Time between two samples of the store for the gauges of `/metrics`
    /// (`gauge_sample_interval_s`).
    pub gauge_sample_interval: Duration,
    /// How long a suspect window stays open once a PostgreSQL store is
    /// found on another server than it was written on (a promotion, a
    /// point-in-time restore); zero: not checked. Defaults to the longest
    /// retention of any route, after which the records a failover lost
    /// would have been forgotten anyway.
    pub suspect_window: Duration,
    /// Requests the proxy serves at once (each buffers up to its route's
    /// body limit and its response); a request over it is refused at once
    /// with 503 `overloaded` and `Retry-After`, nothing claimed or
    /// forwarded. Between 1 and [`REQUESTS_IN_FLIGHT_MAX_LIMIT`].
    pub requests_in_flight_max: usize,
    /// The proxy listener's bounds: `connections_max`,
    /// `header_read_timeout_ms`, `tls_handshake_timeout_ms`.
    pub connections: ConnectionLimits,
    /// The admin listener's bounds: `admin_connections_max` and the same
    /// timeouts as the proxy's.
    pub admin_connections: ConnectionLimits,
    /// Time a request body the gateway buffers before it takes an
    /// in-flight slot (a protected route's, or any other body declared
    /// within [`idem_http::BODY_BYTES_MAX_DEFAULT`]) has to arrive in
    /// full after its head; over it: 408 `body-timeout`, nothing claimed
    /// or forwarded.
    pub body_read_timeout: Duration,
    /// Request body bytes the gateway buffers at once (bodies read before
    /// their slot and bodies of requests in flight), at least every
    /// route's `body_bytes_max`; a body that finds no room is answered 503
    /// `overloaded`, nothing claimed or forwarded.
    pub body_buffer_bytes_max: usize,
    /// How many requests may wait for an original attempt at once
    /// (`waiters_max`, `waiters_per_key_max`, `waiters_per_principal_max`);
    /// beyond, 409 at once.
    pub wait_limits: WaitLimits,
    /// Lookups by operation (route name), for the reconciler.
    pub lookups: Vec<(String, Lookup)>,
    /// The directory of the config file: routes' contract paths are
    /// relative to it.
    pub base_dir: PathBuf,
    /// Reconciler settings.
    pub reconcile: ReconcileSettings,
    /// How long console sessions live.
    pub console_sessions: SessionLimits,
}

/// What loading does with a `[[lookup]]` whose route forwards the same
/// reference for every tenant (`gateway.lookup_tenancy` fails).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum UnsafeLookup {
    /// Refuse the config, naming the route's template and the lookup: what
    /// runs (`serve`, `reconcile`) never asks the provider by such a lookup.
    Refuse,
    /// Load it, for `idem check --gateway` to report the finding.
    Keep,
}

/// The paths the probes answer on: liveness, readiness.
pub const PROBE_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// A configuration error: where (file, field) and what; the one field
/// refusal every config and broker section shares.
pub use idem_core::FieldError as ConfigError;

impl GatewayConfig {
    /// Reads and validates `path` (if any), then applies `overrides`.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<GatewayConfig, ConfigError> {
        let file = match path {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        GatewayConfig::from_parts(file, path, overrides)
    }

    /// Reads and validates `path` for a command that never contacts the
    /// upstream (`idem check --gateway`, `idem reconcile`): an upstream the
    /// file declares is still validated, but none is required.
    pub fn load_offline(path: &Path, overrides: &Overrides) -> Result<GatewayConfig, ConfigError> {
        GatewayConfig::offline(path, overrides, UnsafeLookup::Refuse)
    }

    /// [`GatewayConfig::load_offline`] for a review (`idem check
    /// --gateway`): a `[[lookup]]` whose route cannot tell tenants apart is
    /// kept, for [`crate::contracts::lookup_tenancy`] to report, instead of
    /// refused. Never serve or reconcile with the result.
    pub fn load_for_review(path: &Path) -> Result<GatewayConfig, ConfigError> {
        GatewayConfig::offline(path, &Overrides::default(), UnsafeLookup::Keep)
    }

    /// Validates a parsed file (named `path` in errors) with `overrides`.
    pub fn from_parts(
        file: FileConfig,
        path: Option<&Path>,
        overrides: &Overrides,
    ) -> Result<GatewayConfig, ConfigError> {
        GatewayConfig::validate(file, path, overrides, UnsafeLookup::Refuse)
    }

    fn offline(
        path: &Path,
        overrides: &Overrides,
        unsafe_lookup: UnsafeLookup,
    ) -> Result<GatewayConfig, ConfigError> {
        let file = read_file(path)?;
        let mut overrides = overrides.clone();
        if overrides.upstream.is_none() && file.upstream.is_none() {
            // Never dialled: it only satisfies the validation of `upstream`.
            overrides.upstream = Some("http://127.0.0.1:9".into());
        }
        GatewayConfig::validate(file, Some(path), &overrides, unsafe_lookup)
    }

    fn validate(
        file: FileConfig,
        path: Option<&Path>,
        overrides: &Overrides,
        unsafe_lookup: UnsafeLookup,
    ) -> Result<GatewayConfig, ConfigError> {
        let at = Place { path };
        let basics = Basics::validate(&file, overrides, at)?;
        let limits = Limits::validate(&file, at)?;
        let admin_operators = AdminOperators::validate(&file, at)?;
        let routes = RouteSection::validate(&file, &basics.base_dir, limits.response_timeout, at)?;
        let lookups = lookups(&file, &routes.routes, unsafe_lookup, at)?;
        let console_sessions =
            SessionLimits::new(file.console_session_idle_s, file.console_session_absolute_s)
                .map_err(|e| at.err(&e.field, e.reason, true))?;
        let reconcile = ReconcileSettings::new(&file.reconcile.clone().unwrap_or_default())
            .map_err(|e| at.err(&format!("reconcile.{}", e.field), e.reason, true))?;
        let probe_paths = probe_paths(&file, &routes.routes, at)?;
        let tls = TlsSection::validate(&file, overrides, &basics, &routes.regions, lookups, at)?;
        let suspect_window = suspect_window(&file, &routes.routes, at)?;
        let problem_type_base = problem_type_base(file.problem_type_base.as_deref())
            .map_err(|reason| at.err("problem_type_base", reason, true))?;
        Ok(GatewayConfig {
            problem_type_base,
            base_dir: basics.base_dir,
            lookups: tls.lookups,
            reconcile,
            listen: basics.listen,
            upstream: basics.upstream,
            upstream_tls: tls.upstream_tls,
            listen_tls: tls.listen_tls,
            probe_paths,
            admin_tls: tls.admin_tls,
            store: basics.store,
            owner: basics.owner,
            connect_timeout: limits.connect_timeout,
            response_timeout: limits.response_timeout,
            routes: routes.routes,
            route_regions: routes.route_regions,
            region: routes.regions.region,
            peers: routes.regions.peers,
            peer_tls: tls.peer_tls,
            admin_listen: limits.admin_listen,
            admin_token_env: limits.admin_token_env,
            admin_operators,
            purge_interval: limits.purge_interval,
            gauge_sample_interval: limits.gauge_sample_interval,
            suspect_window,
            requests_in_flight_max: limits.requests_in_flight_max,
            connections: limits.connections,
            admin_connections: limits.admin_connections,
            body_read_timeout: limits.body_read_timeout,
            body_buffer_bytes_max: routes.body_buffer_bytes_max,
            wait_limits: limits.wait_limits,
            console_sessions,
        })
    }

    /// The gateway's region and peers, as validated.
    pub fn regions(&self) -> Regions {
        Regions {
            region: self.region.clone(),
            peers: self.peers.clone(),
            tls: self.peer_tls.clone(),
        }
    }

    /// Whether the admin API speaks TLS (a browser console sets its
    /// cookies `Secure` only then).
    pub fn admin_transport(&self) -> AdminTransport {
        AdminTransport::of(self.admin_tls.as_ref())
    }

    /// `--admin-listen`: the command line wins over the file.
    pub fn set_admin_listen(&mut self, raw: &str) -> Result<(), ConfigError> {
        let addr =
            parse_admin_listen(raw).map_err(|reason| ConfigError::new("--admin-listen", reason))?;
        self.admin_listen = Some(addr);
        Ok(())
    }

    /// The admin API's operators with their tokens, read with `lookup` (the
    /// process environment in `idem serve`): `admin_token_env`'s token as
    /// operator `admin` and each `[[admin.operator]]`'s. Every error names
    /// the field and the file.
    pub fn operators(
        &self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Operators, ConfigError> {
        self.admin_operators
            .operators(&self.admin_token_env, lookup)
    }
}

#[cfg(test)]
mod tests;

/// `problem_type_base`: a URI prefix of visible ASCII, at most
/// [`PROBLEM_TYPE_BASE_BYTES_MAX`] bytes, with a scheme (`https:`, `urn:`).
fn problem_type_base(value: Option<&str>) -> Result<Option<String>, String> {
    let Some(base) = value else { return Ok(None) };
    if base.len() > PROBLEM_TYPE_BASE_BYTES_MAX {
        return Err(format!(
            "{} bytes; at most {PROBLEM_TYPE_BASE_BYTES_MAX}",
            base.len()
        ));
    }
    let scheme = base.split_once(':').map(|(s, _)| s).unwrap_or_default();
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    if !scheme_ok || !base.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{base:?} is not a URI prefix such as \"https://docs.example.com/idem/problems#\""
        ));
    }
    Ok(Some(base.to_owned()))
}
