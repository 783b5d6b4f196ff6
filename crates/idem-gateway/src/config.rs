//! The gateway's configuration: a TOML file and command-line overrides,
//! parsed once into a validated [`GatewayConfig`]. Every error names the file
//! and the field.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use idem_core::Policy;
use idem_http::{Route, RouteSpec, WAIT_MS_LIMIT, WaitLimits};
use idem_reconcile::{
    ForwardedKey, Lookup, LookupSpec, LookupTarget, ReconcileSettings, ReconcileSpec,
};
use serde::Deserialize;

use crate::admin::AdminToken;
use crate::regions::{RegionMode, Regions, check_region};
use crate::tls::AdminTransport;
use idem_process::ConnectionLimits;
use idem_process::{STORE_DEFAULT, StoreUrl};
use idem_process::{ServerTls, TlsError, UpstreamTls};

/// The default listen address.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:8080";
/// Default connect timeout, in milliseconds.
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 2_000;
/// Default response timeout, in milliseconds: shorter than the default
/// lease (30 s), which must outlast it (see [`check_lease_outlasts`]).
pub const RESPONSE_TIMEOUT_MS_DEFAULT: u64 = 25_000;
/// The longest timeout accepted, in milliseconds (one hour).
pub const TIMEOUT_MS_MAX: u64 = 3_600_000;
/// The most routes a config may declare.
pub const ROUTES_MAX: usize = 1_000;
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

/// The config file as written.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Address to listen on.
    pub listen: Option<String>,
    /// Base URL of the upstream API.
    pub upstream: Option<String>,
    /// PEM file of CA certificates an `https://` upstream's certificate may
    /// chain to, besides the system's; relative to the config file.
    pub upstream_ca_file: Option<PathBuf>,
    /// Store URL; a relative `sqlite://PATH` names a file next to the
    /// config file.
    pub store: Option<String>,
    /// Label written on records this node acquires.
    pub owner: Option<String>,
    /// Connect timeout towards the upstream, in milliseconds.
    pub connect_timeout_ms: Option<u64>,
    /// Time allowed for the upstream's whole response, in milliseconds.
    pub response_timeout_ms: Option<u64>,
    /// PEM certificate chain (leaf first) the proxy listener presents:
    /// clients then speak HTTPS to the gateway. With `tls_key_file`, or
    /// neither. Relative to the config file.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`'s leaf.
    pub tls_key_file: Option<PathBuf>,
    /// Whether the proxy listener answers `GET /healthz` and `GET
    /// /readyz` itself (for a load balancer that can probe only the
    /// traffic port); default false.
    pub probe_paths: Option<bool>,
    /// Address of the admin API; none means no admin listener.
    pub admin_listen: Option<String>,
    /// Name of the environment variable holding the admin API's token.
    pub admin_token_env: Option<String>,
    /// PEM certificate chain (leaf first) the admin API presents over TLS;
    /// with `admin_tls_key_file`, or neither. Relative to the config file.
    pub admin_tls_cert_file: Option<PathBuf>,
    /// PEM private key of `admin_tls_cert_file`'s leaf.
    pub admin_tls_key_file: Option<PathBuf>,
    /// Seconds between two runs of the retention purge.
    pub purge_interval_s: Option<u64>,
    /// Seconds a suspect window stays open once the store is found on a
    /// promoted server; 0 turns the check off.
    pub suspect_window_s: Option<u64>,
    /// Requests the proxy serves at once; more are refused with 503.
    pub requests_in_flight_max: Option<u64>,
    /// Connections the proxy listener serves at once; more are closed.
    pub connections_max: Option<u64>,
    /// Connections the admin listener serves at once; more are closed.
    pub admin_connections_max: Option<u64>,
    /// Time for a request head, including the keep-alive wait before it,
    /// in milliseconds.
    pub header_read_timeout_ms: Option<u64>,
    /// Time for a buffered request body to arrive in full, in milliseconds.
    pub body_read_timeout_ms: Option<u64>,
    /// Time for the admin listener's TLS handshake, in milliseconds.
    pub tls_handshake_timeout_ms: Option<u64>,
    /// Request body bytes buffered at once; a body that finds no room is
    /// refused with 503.
    pub body_buffer_bytes_max: Option<u64>,
    /// Requests that may wait for an original attempt at once, in all.
    pub waiters_max: Option<u64>,
    /// Requests that may wait for one key's original attempt at once.
    pub waiters_per_key_max: Option<u64>,
    /// Requests of one principal that may wait for original attempts at
    /// once, over all its keys.
    pub waiters_per_principal_max: Option<u64>,
    /// The region this node runs in, written on the records it acquires
    /// and used by `home-region` routes (see [`crate::regions::check_region`]).
    pub region: Option<String>,
    /// Other regions' gateways, by region name: where a `home-region` route
    /// forwards a key homed there.
    #[serde(default)]
    pub peers: BTreeMap<String, String>,
    /// Protected routes; none means POST and PATCH on every path.
    #[serde(default, rename = "route")]
    pub routes: Vec<RouteSpec>,
    /// How ambiguous records are looked up at the provider, per route name.
    #[serde(default, rename = "lookup")]
    pub lookups: Vec<LookupSpec>,
    /// Reconciler settings.
    pub reconcile: Option<ReconcileSpec>,
    /// Seconds a console session may sit unused before it ends.
    pub console_session_idle_s: Option<u64>,
    /// Seconds after sign-in a console session ends, however busy.
    pub console_session_absolute_s: Option<u64>,
}

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
    /// The admin API's certificate and key; `None`: it speaks plain HTTP.
    pub admin_tls: Option<ServerTls>,
    /// Time between two runs of the retention purge.
    pub purge_interval: Duration,
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

/// The TLS files named on the command line or in the file, resolved: a
/// command-line path against the working directory, a file's against the
/// config file's directory. Each comes with whether it is from the file.
struct TlsFiles {
    upstream_ca: Option<(PathBuf, bool)>,
    listen_cert: Option<(PathBuf, bool)>,
    listen_key: Option<(PathBuf, bool)>,
    admin_cert: Option<(PathBuf, bool)>,
    admin_key: Option<(PathBuf, bool)>,
}

/// A configuration error: where (file, field) and what.
#[derive(Debug)]
pub struct ConfigError {
    /// The file, or `None` for command-line values.
    pub file: Option<PathBuf>,
    /// The field, e.g. `route[1].lease_ms`.
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

/// How long a console session lives, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLimits {
    /// A session unused for this long ends.
    pub idle: Duration,
    /// A session ends this long after sign-in, however busy.
    pub absolute: Duration,
}

/// The refusal of a session limit: the config field and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitsError {
    /// `console_session_idle_s` or `console_session_absolute_s`.
    pub field: &'static str,
    /// What is wrong.
    pub reason: String,
}

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
        let routes = RouteSection::validate(&file, &basics.base_dir, limits.response_timeout, at)?;
        let lookups = lookups(&file, &routes.routes, unsafe_lookup, at)?;
        let console_sessions =
            SessionLimits::new(file.console_session_idle_s, file.console_session_absolute_s)
                .map_err(|e| at.err(e.field, e.reason, true))?;
        let reconcile = ReconcileSettings::new(&file.reconcile.clone().unwrap_or_default())
            .map_err(|e| at.err(&format!("reconcile.{}", e.field), e.reason, true))?;
        let probe_paths = probe_paths(&file, &routes.routes, at)?;
        let tls = TlsSection::validate(&file, overrides, &basics, &routes.regions, lookups, at)?;
        let suspect_window = suspect_window(&file, &routes.routes, at)?;
        Ok(GatewayConfig {
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
            purge_interval: limits.purge_interval,
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
        let addr = parse_admin_listen(raw).map_err(|reason| ConfigError {
            file: None,
            field: "--admin-listen".into(),
            reason,
        })?;
        self.admin_listen = Some(addr);
        Ok(())
    }

    /// The admin API's bearer token, read with `lookup` (the process
    /// environment in `idem serve`) from the variable `admin_token_env`
    /// names. Refused unless it is set and at least
    /// [`crate::ADMIN_TOKEN_BYTES_MIN`] bytes long.
    pub fn admin_token(
        &self,
        lookup: impl FnOnce(&str) -> Option<String>,
    ) -> Result<AdminToken, ConfigError> {
        let name = &self.admin_token_env;
        let err = |reason: String| ConfigError {
            file: None,
            field: "admin_token_env".into(),
            reason,
        };
        let Some(value) = lookup(name) else {
            return Err(err(format!(
                "the admin API is enabled but the environment variable {name} is not set \
                 (or not UTF-8); set it to a random token of at least {} bytes, e.g. \
                 {name}=$(openssl rand -hex 32)",
                crate::ADMIN_TOKEN_BYTES_MIN
            )));
        };
        AdminToken::new(&value).map_err(|why| err(format!("environment variable {name}: {why}")))
    }
}

impl TlsFiles {
    fn pick(file: &FileConfig, overrides: &Overrides, base_dir: &Path) -> TlsFiles {
        let pick = |cli: &Option<PathBuf>, in_file: &Option<PathBuf>| match (cli, in_file) {
            (Some(path), _) => Some((path.clone(), false)),
            (None, Some(path)) => Some((base_dir.join(path), true)),
            (None, None) => None,
        };
        TlsFiles {
            upstream_ca: pick(&overrides.upstream_ca_file, &file.upstream_ca_file),
            listen_cert: pick(&None, &file.tls_cert_file),
            listen_key: pick(&None, &file.tls_key_file),
            admin_cert: pick(&overrides.admin_tls_cert_file, &file.admin_tls_cert_file),
            admin_key: pick(&overrides.admin_tls_key_file, &file.admin_tls_key_file),
        }
    }

    /// The trust for an `https://` `upstream`: the system's roots and
    /// `upstream_ca_file`'s; a CA file with an `http://` upstream is refused,
    /// as it would silently do nothing.
    fn upstream(
        &self,
        upstream: &Uri,
        https_lookups: bool,
    ) -> Result<Option<UpstreamTls>, (&'static str, String, bool)> {
        let ca = self.upstream_ca.as_ref();
        if upstream.scheme_str() != Some("https") {
            return match ca {
                // An https lookup reads it (the caller loads it then).
                Some(_) if https_lookups => Ok(None),
                Some((path, from_file)) => Err((
                    "upstream_ca_file",
                    format!(
                        "{} is set but the upstream {upstream} is not https://, nor is any \
                         lookup; remove it or use https://",
                        path.display()
                    ),
                    *from_file,
                )),
                None => Ok(None),
            };
        }
        UpstreamTls::load(ca.map(|(path, _)| path.as_path()))
            .map(Some)
            .map_err(|e| match (&e, ca) {
                (TlsError::NoRoots { .. }, _) | (_, None) => ("upstream", e.to_string(), false),
                (_, Some((_, from_file))) => ("upstream_ca_file", e.to_string(), *from_file),
            })
    }

    /// The proxy listener's certificate and key: both files or neither.
    fn listen(&self) -> Result<Option<ServerTls>, (&'static str, String, bool)> {
        server_tls(
            (&self.listen_cert, "tls_cert_file"),
            (&self.listen_key, "tls_key_file"),
        )
    }

    /// The admin API's certificate and key: both files or neither.
    fn admin(&self) -> Result<Option<ServerTls>, (&'static str, String, bool)> {
        server_tls(
            (&self.admin_cert, "admin_tls_cert_file"),
            (&self.admin_key, "admin_tls_key_file"),
        )
    }
}

/// `lookups`, the https ones trusting `trust`.
fn with_trust(lookups: Vec<(String, Lookup)>, trust: &UpstreamTls) -> Vec<(String, Lookup)> {
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

/// A listener's certificate and key from the files of two fields, both or
/// neither; an error names the field at fault.
fn server_tls(
    (cert, cert_field): (&Option<(PathBuf, bool)>, &'static str),
    (key, key_field): (&Option<(PathBuf, bool)>, &'static str),
) -> Result<Option<ServerTls>, (&'static str, String, bool)> {
    let (cert, key) = match (cert, key) {
        (None, None) => return Ok(None),
        (Some(cert), Some(key)) => (cert, key),
        (Some((_, from_file)), None) => {
            return Err((
                key_field,
                format!("is required with {cert_field}: set both or neither"),
                *from_file,
            ));
        }
        (None, Some((_, from_file))) => {
            return Err((
                cert_field,
                format!("is required with {key_field}: set both or neither"),
                *from_file,
            ));
        }
    };
    ServerTls::load(&cert.0, &key.0).map(Some).map_err(|e| {
        let key_at_fault = matches!(e, TlsError::NoKey { .. } | TlsError::Refused { .. })
            || e.path() != Some(cert.0.as_path());
        if key_at_fault {
            (key_field, e.to_string(), key.1)
        } else {
            (cert_field, e.to_string(), cert.1)
        }
    })
}

/// The proxy listener's bounds, the admin listener's and the body
/// deadline, each checked against its range.
impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            idle: Duration::from_secs(SESSION_IDLE_S_DEFAULT),
            absolute: Duration::from_secs(SESSION_ABSOLUTE_S_DEFAULT),
        }
    }
}

impl SessionLimits {
    /// The limits of the config file's `console_session_idle_s` and
    /// `console_session_absolute_s` (defaults when absent): each
    /// 1..=[`SESSION_S_MAX`], the idle limit no longer than the absolute one.
    pub fn new(idle_s: Option<u64>, absolute_s: Option<u64>) -> Result<SessionLimits, LimitsError> {
        let check = |field: &'static str, value: Option<u64>, default: u64| match value
            .unwrap_or(default)
        {
            s @ 1..=SESSION_S_MAX => Ok(Duration::from_secs(s)),
            s => Err(LimitsError {
                field,
                reason: format!("{s} is out of range (1..={SESSION_S_MAX})"),
            }),
        };
        let idle = check("console_session_idle_s", idle_s, SESSION_IDLE_S_DEFAULT)?;
        let absolute = check(
            "console_session_absolute_s",
            absolute_s,
            SESSION_ABSOLUTE_S_DEFAULT,
        )?;
        if idle > absolute {
            return Err(LimitsError {
                field: "console_session_idle_s",
                reason: format!(
                    "{} s is longer than console_session_absolute_s ({} s); a session \
                     ends at the absolute limit whatever its use",
                    idle.as_secs(),
                    absolute.as_secs()
                ),
            });
        }
        Ok(SessionLimits { idle, absolute })
    }
}

fn connection_bounds(
    file: &FileConfig,
) -> Result<(ConnectionLimits, ConnectionLimits, Duration), (&'static str, String)> {
    let ms = |field, value: Option<u64>, default| match value.unwrap_or(default) {
        ms @ 1..=TIMEOUT_MS_MAX => Ok(Duration::from_millis(ms)),
        ms => Err((
            field,
            format!("{ms} is out of range (1..={TIMEOUT_MS_MAX})"),
        )),
    };
    let count = |field, value: Option<u64>, default| match value {
        None => Ok(default),
        Some(n) => usize::try_from(n)
            .ok()
            .filter(|n| (1..=CONNECTIONS_MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                (
                    field,
                    format!("{n} is out of range (1..={CONNECTIONS_MAX_LIMIT})"),
                )
            }),
    };
    let connections = ConnectionLimits {
        connections_max: count(
            "connections_max",
            file.connections_max,
            CONNECTIONS_MAX_DEFAULT,
        )?,
        header_read_timeout: ms(
            "header_read_timeout_ms",
            file.header_read_timeout_ms,
            HEADER_READ_TIMEOUT_MS_DEFAULT,
        )?,
        tls_handshake_timeout: ms(
            "tls_handshake_timeout_ms",
            file.tls_handshake_timeout_ms,
            TLS_HANDSHAKE_TIMEOUT_MS_DEFAULT,
        )?,
    };
    let admin_connections = ConnectionLimits {
        connections_max: count(
            "admin_connections_max",
            file.admin_connections_max,
            ADMIN_CONNECTIONS_MAX_DEFAULT,
        )?,
        ..connections
    };
    let body_read_timeout = ms(
        "body_read_timeout_ms",
        file.body_read_timeout_ms,
        BODY_READ_TIMEOUT_MS_DEFAULT,
    )?;
    Ok((connections, admin_connections, body_read_timeout))
}

/// `body_buffer_bytes_max`, in range and no smaller than any route's
/// `body_bytes_max`: such a route's largest bodies could never be read.
fn body_buffer_bytes_max(file: &FileConfig, routes: &[Route]) -> Result<usize, String> {
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
fn with_wait_default(spec: &RouteSpec, response_timeout: Duration) -> RouteSpec {
    let timeout_ms = u64::try_from(response_timeout.as_millis()).unwrap_or(u64::MAX);
    let lease_ms = spec.lease_ms.unwrap_or(Policy::DEFAULT.lease_ms());
    let mut spec = spec.clone();
    if spec.wait_ms_max.is_none() && timeout_ms <= lease_ms {
        spec.wait_ms_max = Some(timeout_ms.min(WAIT_MS_LIMIT));
    }
    spec
}

/// `waiters_max`, `waiters_per_key_max` and `waiters_per_principal_max`,
/// in range.
fn wait_limits(file: &FileConfig) -> Result<WaitLimits, (&'static str, String)> {
    let d = WaitLimits::default();
    let field = |name: &'static str, value: Option<u64>, default: usize| match value {
        None => Ok(default),
        Some(n) => usize::try_from(n)
            .ok()
            .filter(|n| (1..=WAITERS_LIMIT).contains(n))
            .ok_or_else(|| (name, format!("{n} is out of range (1..={WAITERS_LIMIT})"))),
    };
    let total = field("waiters_max", file.waiters_max, d.total)?;
    let per_key = field("waiters_per_key_max", file.waiters_per_key_max, d.per_key)?;
    let per_principal = field(
        "waiters_per_principal_max",
        file.waiters_per_principal_max,
        d.per_principal,
    )?;
    Ok(WaitLimits {
        per_key,
        per_principal,
        total,
    })
}

/// The route with the files it names resolved against the config file's
/// directory (the contract is resolved later, by [`crate::contracts`]).
fn relative_to(spec: &RouteSpec, dir: &Path) -> RouteSpec {
    RouteSpec {
        principal: spec.principal.as_ref().map(|p| p.relative_to(dir)),
        ..spec.clone()
    }
}

/// The file's `region` and `[peers]`, validated: names by
/// [`check_region`], URLs http:// with a host, no peer named after this
/// gateway's own region.
fn regions(file: &FileConfig) -> Result<Regions, (String, String)> {
    if let Some(region) = &file.region {
        check_region(region).map_err(|r| ("region".to_owned(), r))?;
    }
    if file.peers.len() > crate::regions::PEERS_MAX {
        let reason = format!(
            "{} peers; at most {}",
            file.peers.len(),
            crate::regions::PEERS_MAX
        );
        return Err(("peers".into(), reason));
    }
    let mut peers = BTreeMap::new();
    for (name, url) in &file.peers {
        let field = format!("peers.{name}");
        check_region(name).map_err(|r| (field.clone(), r))?;
        if file.region.as_deref() == Some(name.as_str()) {
            return Err((
                field,
                "is this gateway's own region; a peer is another region".into(),
            ));
        }
        if file.region.is_none() {
            return Err((
                field,
                "peers need this gateway's region: set region = \"...\"".into(),
            ));
        }
        let uri =
            parse_upstream(url).map_err(|r| (field.clone(), r.replace("upstream", "peer")))?;
        peers.insert(name.clone(), uri);
    }
    Ok(Regions {
        region: file.region.clone(),
        peers,
        tls: None,
    })
}

fn parse_admin_listen(raw: &str) -> Result<SocketAddr, String> {
    raw.parse::<SocketAddr>()
        .map_err(|e| format!("{raw:?} is not an address like 127.0.0.1:9090 ({e})"))
}

/// A portable environment variable name: letters, digits and `_`, not
/// starting with a digit.
fn check_env_name(name: &str) -> Result<(), String> {
    let portable = !name.is_empty()
        && name.len() <= 255
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if portable {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not an environment variable name (letters, digits and _, 1-255 bytes)"
        ))
    }
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: Some(path.to_path_buf()),
        field: "(file)".into(),
        reason: format!("cannot read: {e}"),
    })?;
    toml::from_str(&text).map_err(|e| {
        let (line, column) = e
            .span()
            .map(|span| line_column(&text, span.start))
            .unwrap_or((0, 0));
        ConfigError {
            file: Some(path.to_path_buf()),
            field: format!("line {line}, column {column}"),
            reason: e.message().to_owned(),
        }
    })
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..offset.min(text.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
    (line, column)
}

/// Where a refused value came from: the config file (when one was read),
/// or the command line.
#[derive(Clone, Copy)]
struct Place<'a> {
    path: Option<&'a Path>,
}

impl Place<'_> {
    /// `field` refused for `reason`, in the file when `from_file`.
    fn err(self, field: &str, reason: String, from_file: bool) -> ConfigError {
        ConfigError {
            file: if from_file {
                self.path.map(Path::to_path_buf)
            } else {
                None
            },
            field: field.to_owned(),
            reason,
        }
    }
}

/// What the gateway is and where it listens, forwards and stores.
struct Basics {
    listen: SocketAddr,
    upstream: Uri,
    base_dir: PathBuf,
    store: StoreUrl,
    owner: String,
}

impl Basics {
    fn validate(
        file: &FileConfig,
        overrides: &Overrides,
        at: Place,
    ) -> Result<Basics, ConfigError> {
        let (listen, from_file) = pick(&overrides.listen, &file.listen, LISTEN_DEFAULT);
        let listen = listen.parse::<SocketAddr>().map_err(|e| {
            at.err(
                "listen",
                format!("{listen:?} is not an address like 127.0.0.1:8080 ({e})"),
                from_file,
            )
        })?;
        let upstream = match (&overrides.upstream, &file.upstream) {
            (Some(u), _) => parse_upstream(u).map_err(|r| at.err("upstream", r, false))?,
            (None, Some(u)) => parse_upstream(u).map_err(|r| at.err("upstream", r, true))?,
            (None, None) => {
                return Err(at.err(
                    "upstream",
                    "is required: pass --upstream http://HOST:PORT or set upstream in the config file".into(),
                    false,
                ));
            }
        };
        let base_dir = at
            .path
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let (store, from_file) = pick(&overrides.store, &file.store, STORE_DEFAULT);
        let field = if from_file { "store" } else { "--store" };
        let store = StoreUrl::parse(store).map_err(|e| at.err(field, e.to_string(), from_file))?;
        // A store named in the file is the file's, like its contract and
        // TLS files; `--store` and the default are the working directory's.
        let store = if from_file {
            store.relative_to(&base_dir)
        } else {
            store
        };
        let owner = file
            .owner
            .clone()
            .unwrap_or_else(|| format!("idem-{}", std::process::id()));
        // The store refuses what check_owner refuses, on every claim: refuse
        // it here, once, instead.
        if owner.is_empty() || idem_core::check_owner(&owner).is_err() {
            return Err(at.err(
                "owner",
                format!(
                    "{owner:?} must be 1-{} bytes without control characters",
                    idem_core::OWNER_BYTES_MAX
                ),
                true,
            ));
        }
        // Refused here for the same reason as the owner: the store would
        // refuse it on every claim.
        if let Some(region) = &file.region {
            idem_core::check_region(region).map_err(|e| at.err("region", e.to_string(), true))?;
        }
        Ok(Basics {
            listen,
            upstream,
            base_dir,
            store,
            owner,
        })
    }
}

/// The timeouts and bounds of the listeners, the admin API's address and
/// token, and how often the purge runs.
struct Limits {
    connect_timeout: Duration,
    response_timeout: Duration,
    admin_listen: Option<SocketAddr>,
    admin_token_env: String,
    purge_interval: Duration,
    requests_in_flight_max: usize,
    connections: ConnectionLimits,
    admin_connections: ConnectionLimits,
    body_read_timeout: Duration,
    wait_limits: WaitLimits,
}

impl Limits {
    fn validate(file: &FileConfig, at: Place) -> Result<Limits, ConfigError> {
        let timeout = |field: &str, value: Option<u64>, default: u64| match value.unwrap_or(default)
        {
            ms @ 1..=TIMEOUT_MS_MAX => Ok(Duration::from_millis(ms)),
            ms => Err(at.err(
                field,
                format!("{ms} is out of range (1..={TIMEOUT_MS_MAX})"),
                true,
            )),
        };
        let connect_timeout = timeout(
            "connect_timeout_ms",
            file.connect_timeout_ms,
            CONNECT_TIMEOUT_MS_DEFAULT,
        )?;
        let response_timeout = timeout(
            "response_timeout_ms",
            file.response_timeout_ms,
            RESPONSE_TIMEOUT_MS_DEFAULT,
        )?;
        if file.routes.len() > ROUTES_MAX {
            return Err(at.err(
                "route",
                format!("{} routes; at most {ROUTES_MAX}", file.routes.len()),
                true,
            ));
        }
        let (admin_listen, admin_token_env) = admin(file, at)?;
        let purge_interval = match file.purge_interval_s.unwrap_or(PURGE_INTERVAL_S_DEFAULT) {
            s @ 1..=PURGE_INTERVAL_S_MAX => Duration::from_secs(s),
            s => {
                return Err(at.err(
                    "purge_interval_s",
                    format!("{s} is out of range (1..={PURGE_INTERVAL_S_MAX})"),
                    true,
                ));
            }
        };
        let requests_in_flight_max = requests_in_flight_max(file, at)?;
        let (connections, admin_connections, body_read_timeout) =
            connection_bounds(file).map_err(|(field, reason)| at.err(field, reason, true))?;
        let wait_limits =
            wait_limits(file).map_err(|(field, reason)| at.err(field, reason, true))?;
        Ok(Limits {
            connect_timeout,
            response_timeout,
            admin_listen,
            admin_token_env,
            purge_interval,
            requests_in_flight_max,
            connections,
            admin_connections,
            body_read_timeout,
            wait_limits,
        })
    }
}

/// The admin API's address and the variable that holds its token.
fn admin(file: &FileConfig, at: Place) -> Result<(Option<SocketAddr>, String), ConfigError> {
    let admin_listen = match &file.admin_listen {
        Some(raw) => Some(parse_admin_listen(raw).map_err(|r| at.err("admin_listen", r, true))?),
        None => None,
    };
    let admin_token_env = match &file.admin_token_env {
        Some(name) => {
            check_env_name(name).map_err(|r| at.err("admin_token_env", r, true))?;
            name.clone()
        }
        None => ADMIN_TOKEN_ENV_DEFAULT.to_owned(),
    };
    Ok((admin_listen, admin_token_env))
}

/// `requests_in_flight_max`, or its default.
fn requests_in_flight_max(file: &FileConfig, at: Place) -> Result<usize, ConfigError> {
    match file.requests_in_flight_max {
        None => Ok(REQUESTS_IN_FLIGHT_MAX_DEFAULT),
        Some(n) => usize::try_from(n)
            .ok()
            .filter(|n| (1..=REQUESTS_IN_FLIGHT_MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                at.err(
                    "requests_in_flight_max",
                    format!("{n} is out of range (1..={REQUESTS_IN_FLIGHT_MAX_LIMIT})"),
                    true,
                )
            }),
    }
}

/// The routes, what they buffer, and where their keys are homed.
struct RouteSection {
    routes: Vec<Route>,
    body_buffer_bytes_max: usize,
    regions: Regions,
    route_regions: Vec<RegionMode>,
}

impl RouteSection {
    fn validate(
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
        let regions = regions(file).map_err(|(field, reason)| at.err(&field, reason, true))?;
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

/// Each `[[lookup]]`, bound to the one named route it serves.
fn lookups(
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
fn lookup(
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

/// `probe_paths`, refused when a protected route would take the probes' GETs.
fn probe_paths(file: &FileConfig, routes: &[Route], at: Place) -> Result<bool, ConfigError> {
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

/// What each TLS file makes: the listeners' certificates, what an https
/// upstream, lookup or peer is trusted by, and the lookups given that trust.
struct TlsSection {
    upstream_tls: Option<UpstreamTls>,
    peer_tls: Option<UpstreamTls>,
    admin_tls: Option<ServerTls>,
    listen_tls: Option<ServerTls>,
    lookups: Vec<(String, Lookup)>,
}

impl TlsSection {
    fn validate(
        file: &FileConfig,
        overrides: &Overrides,
        basics: &Basics,
        regions: &Regions,
        lookups: Vec<(String, Lookup)>,
        at: Place,
    ) -> Result<TlsSection, ConfigError> {
        let tls = TlsFiles::pick(file, overrides, &basics.base_dir);
        let https_lookups = lookups.iter().any(|(_, l)| l.is_https());
        let https_peers = regions
            .peers
            .values()
            .any(|uri| uri.scheme_str() == Some("https"));
        let refused = |(field, reason, from_file)| at.err(field, reason, from_file);
        let upstream_tls = tls
            .upstream(&basics.upstream, https_lookups || https_peers)
            .map_err(refused)?;
        // An https:// lookup or peer trusts what an https upstream would:
        // the system's roots and upstream_ca_file's.
        let peer_trust = match (https_lookups || https_peers, &upstream_tls) {
            (false, _) => None,
            (true, Some(trust)) => Some(trust.clone()),
            (true, None) => {
                let ca = tls.upstream_ca.as_ref();
                let trust = UpstreamTls::load(ca.map(|(path, _)| path.as_path())).map_err(|e| {
                    let from_file = ca.is_none_or(|(_, from_file)| *from_file);
                    at.err("upstream_ca_file", e.to_string(), from_file)
                })?;
                Some(trust)
            }
        };
        let lookups = match &peer_trust {
            Some(trust) => with_trust(lookups, trust),
            None => lookups,
        };
        let admin_tls = tls.admin().map_err(refused)?;
        let listen_tls = tls.listen().map_err(refused)?;
        Ok(TlsSection {
            upstream_tls,
            peer_tls: peer_trust.filter(|_| https_peers),
            admin_tls,
            listen_tls,
            lookups,
        })
    }
}

/// `suspect_window_s`, by default the longest retention of the routes.
fn suspect_window(file: &FileConfig, routes: &[Route], at: Place) -> Result<Duration, ConfigError> {
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

fn pick<'a>(
    cli: &'a Option<String>,
    file: &'a Option<String>,
    default: &'a str,
) -> (&'a str, bool) {
    match (cli, file) {
        (Some(v), _) => (v, false),
        (None, Some(v)) => (v, true),
        (None, None) => (default, false),
    }
}

fn parse_upstream(raw: &str) -> Result<Uri, String> {
    let uri: Uri = raw
        .parse()
        .map_err(|e| format!("{raw:?} is not a URL ({e})"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(format!("{raw:?} must be an http:// or https:// URL"));
    }
    if uri.authority().is_none() {
        return Err(format!("{raw:?} names no host"));
    }
    if uri.query().is_some() {
        return Err(format!("{raw:?} must not have a query"));
    }
    Ok(uri)
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.file {
            Some(file) => write!(f, "{}: {}: {}", file.display(), self.field, self.reason),
            None => write!(f, "{}: {}", self.field, self.reason),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Every route's lease must be longer than the response timeout. While the
/// gateway still waits for the upstream, the attempt may commit; a lease that
/// ends first lets a retry mark it ambiguous and a reconciler release it on a
/// "not found" (a verdict trusted once the lease is over), and the retry then
/// runs the effect a second time. The lease must also cover however long the
/// upstream itself may keep processing; only the operator knows that, and
/// docs/http.md says so.
fn check_lease_outlasts(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str, overrides: &Overrides) -> Result<GatewayConfig, String> {
        let file: FileConfig = toml::from_str(text).map_err(|e| e.message().to_owned())?;
        GatewayConfig::from_parts(file, Some(Path::new("idem.toml")), overrides)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_lookups_header_values_never_show_in_the_files_debug_form() {
        let text = "[[lookup]]\nroute = \"payouts\"\n\
                    url = \"http://h/{forwarded_key}\"\n\
                    headers = [[\"authorization\", \"Bearer s3cret-lookup\"]]\n";
        let file: FileConfig = match toml::from_str(text) {
            Ok(file) => file,
            Err(e) => panic!("{text}: {e}"),
        };
        let shown = format!("{file:?}");
        assert!(shown.contains("authorization"), "{shown}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn lookups_name_a_route_and_every_field_is_checked() {
        let up = Overrides {
            upstream: Some("http://127.0.0.1:9000".into()),
            ..Default::default()
        };
        let route = "[[route]]\nname = \"payouts\"\npath = \"/payouts\"\n\
                     forward_key = { template = \"{scope_digest}:{key}\" }\n";
        let good = format!(
            "{route}[[lookup]]\nroute = \"payouts\"\nurl = \"http://127.0.0.1:9000/by-ref/{{forwarded_key}}\"\n[reconcile]\nmax_tries = 3\n"
        );
        let c = load(&good, &up).unwrap();
        assert_eq!(c.lookups.len(), 1);
        assert_eq!(c.reconcile.max_tries(), 3);
        let cases = [
            (
                format!(
                    "{route}[[lookup]]\nroute = \"refunds\"\nurl = \"http://h/{{forwarded_key}}\""
                ),
                "idem.toml: lookup[0].route: no [[route]] has name = \"refunds\"",
            ),
            (
                format!("{route}[[lookup]]\nroute = \"payouts\"\nurl = \"http://h/x\""),
                "idem.toml: lookup[0].url",
            ),
            (
                format!("{route}[[lookup]]\nroute = \"payouts\"\nurl = \"http://h/{{key}}\""),
                "idem.toml: lookup[0].url: \"http://h/{key}\" asks by {key}",
            ),
            (
                format!("{route}[reconcile]\nmax_tries = 0"),
                "idem.toml: reconcile.max_tries",
            ),
            (
                format!(
                    "{route}[[lookup]]\nroute = \"payouts\"\nurll = \"http://h/{{forwarded_key}}\""
                ),
                "unknown field `urll`",
            ),
            // A consumer's lookup pasted into a gateway's config.
            (
                format!(
                    "{route}[[lookup]]\nsubscription = \"payouts\"\nurl = \"http://h/{{forwarded_key}}\""
                ),
                "idem.toml: lookup[0].subscription: this config has no [[subscription]]",
            ),
            (
                format!("{route}[[lookup]]\nurl = \"http://h/{{forwarded_key}}\""),
                "idem.toml: lookup[0].route: missing",
            ),
        ];
        for (text, expect) in cases {
            let got = load(&text, &up).map(|_| ()).unwrap_err();
            assert!(got.contains(expect), "{text:?}: {got}");
        }
    }

    #[test]
    fn a_lookup_whose_route_cannot_tell_tenants_apart_is_refused() {
        let up = Overrides {
            upstream: Some("http://127.0.0.1:9000".into()),
            ..Default::default()
        };
        let lookup = "[[lookup]]\nroute = \"payouts\"\nurl = \"http://h/{forwarded_key}\"\n";
        let route = |principal: &str, template: &str| {
            format!(
                "[[route]]\nname = \"other\"\npath = \"/other\"\n\
                 [[route]]\nname = \"payouts\"\npath = \"/payouts\"\n{principal}\n\
                 forward_key = {{ template = {template:?} }}\n{lookup}"
            )
        };
        let principals = [
            "",
            "principal = { header = \"x-tenant-id\" }",
            "principal = { credential_headers = [\"x-api-key\"] }",
        ];
        let cases = [
            ("{key}", false),
            ("pay-{key}", false),
            ("{scope_digest}:{key}", true),
            ("{key}/{scope_digest}", true),
        ];
        for principal in principals {
            for (template, safe) in cases {
                let text = route(principal, template);
                match load(&text, &up) {
                    Ok(_) => assert!(safe, "{text}: accepted"),
                    Err(e) => {
                        assert!(!safe, "{text}: {e}");
                        assert!(
                            e.starts_with("idem.toml: route[1].forward_key.template: lookup[0]")
                                && e.contains("{scope_digest}:{key}"),
                            "{e}"
                        );
                    }
                }
                // A review keeps the config, for the finding to say why.
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("idem.toml");
                std::fs::write(&path, &text).unwrap();
                let reviewed = GatewayConfig::load_for_review(&path).unwrap();
                let finding = crate::findings::lookup_tenancy(&reviewed.routes[1]);
                assert_eq!(finding.verdict.passed(), safe, "{text}: {}", finding.why);
                let offline = GatewayConfig::load_offline(&path, &Overrides::default());
                assert_eq!(offline.is_ok(), safe, "{text}");
            }
        }
    }

    #[test]
    fn a_lookup_serves_one_route_whose_name_no_other_route_shares() {
        let up = Overrides {
            upstream: Some("http://127.0.0.1:9000".into()),
            ..Default::default()
        };
        // Routes of one name share their records' scopes, but a lookup
        // renders one forwarded reference per record: with two templates
        // it would ask by the wrong one, whichever route it was paired with.
        let route = |path: &str, template: &str| {
            format!(
                "[[route]]\nname = \"payouts\"\npath = \"{path}\"\n\
                 forward_key = {{ template = {template:?} }}\n"
            )
        };
        let lookup = "[[lookup]]\nroute = \"payouts\"\nurl = \"http://h/{forwarded_key}\"\n";
        let cases = [
            (
                route("/a", "{scope_digest}:{key}") + &route("/b", "{key}"),
                "route[0]",
            ),
            (
                route("/a", "{key}") + &route("/b", "{scope_digest}:{key}"),
                "route[0]",
            ),
            (
                route("/a", "{scope_digest}:{key}") + &route("/b", "{scope_digest}:{key}"),
                "route[0]",
            ),
        ];
        for (routes, first) in cases {
            let text = format!("{routes}{lookup}");
            let e = load(&text, &up).map(|_| ()).unwrap_err();
            assert!(
                e.starts_with("idem.toml: lookup[0].route:")
                    && e.contains(first)
                    && e.contains("route[1]"),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn errors_name_file_and_field() {
        let up = Overrides {
            upstream: Some("http://127.0.0.1:9000".into()),
            ..Default::default()
        };
        let cases = [
            (
                "listen = \"nope\"",
                "idem.toml: listen: \"nope\" is not an address",
            ),
            (
                "upstream = \"ftp://x\"",
                "idem.toml: upstream: \"ftp://x\" must be an http:// or https:// URL",
            ),
            (
                "connect_timeout_ms = 0",
                "idem.toml: connect_timeout_ms: 0 is out of range",
            ),
            (
                "purge_interval_s = 0",
                "idem.toml: purge_interval_s: 0 is out of range (1..=86400)",
            ),
            (
                "purge_interval_s = 86401",
                "idem.toml: purge_interval_s: 86401 is out of range",
            ),
            (
                "response_timeout_ms = 30000",
                "idem.toml: response_timeout_ms: the default lease (30000 ms) must be longer than \
                 response_timeout_ms (30000 ms)",
            ),
            (
                "response_timeout_ms = 1000\n[[route]]\nlease_ms = 1000",
                "idem.toml: route[0].lease_ms: lease_ms (1000 ms) must be longer than \
                 response_timeout_ms (1000 ms)",
            ),
            (
                "response_timeout_ms = 40000\n[[route]]\nlease_ms = 60000\n[[route]]\npath = \"/x\"",
                "idem.toml: route[1].lease_ms: the default lease_ms (30000 ms) must be longer",
            ),
            (
                "body_buffer_bytes_max = 0",
                "idem.toml: body_buffer_bytes_max: 0 is out of range",
            ),
            (
                "body_buffer_bytes_max = 1000\n[[route]]\nbody_bytes_max = 2000",
                "idem.toml: body_buffer_bytes_max: 1000 is below route[0].body_bytes_max (2000)",
            ),
            (
                "connections_max = 0",
                "idem.toml: connections_max: 0 is out of range (1..=65536)",
            ),
            (
                "waiters_max = 0",
                "idem.toml: waiters_max: 0 is out of range (1..=65536)",
            ),
            (
                "waiters_per_key_max = 70000",
                "idem.toml: waiters_per_key_max: 70000 is out of range (1..=65536)",
            ),
            (
                "waiters_per_principal_max = 0",
                "idem.toml: waiters_per_principal_max: 0 is out of range (1..=65536)",
            ),
            (
                "[[route]]\nwait_ms_max = 40000",
                "idem.toml: route[0].wait_ms_max: 40000 ms is longer than the lease (30000 ms)",
            ),
            (
                "[[route]]\nwait_ms = 2000\nwait_ms_max = 1000",
                "idem.toml: route[0].wait_ms: 2000 ms is longer than wait_ms_max (1000 ms)",
            ),
            (
                "[[route]]\nwait_ms = 26000",
                "idem.toml: route[0].wait_ms: 26000 ms is longer than wait_ms_max (25000 ms)",
            ),
            (
                "admin_connections_max = 65537",
                "idem.toml: admin_connections_max: 65537 is out of range (1..=65536)",
            ),
            (
                "header_read_timeout_ms = 0",
                "idem.toml: header_read_timeout_ms: 0 is out of range (1..=3600000)",
            ),
            (
                "body_read_timeout_ms = 3600001",
                "idem.toml: body_read_timeout_ms: 3600001 is out of range (1..=3600000)",
            ),
            (
                "tls_handshake_timeout_ms = 0",
                "idem.toml: tls_handshake_timeout_ms: 0 is out of range (1..=3600000)",
            ),
            (
                "requests_in_flight_max = 0",
                "idem.toml: requests_in_flight_max: 0 is out of range (1..=65536)",
            ),
            (
                "requests_in_flight_max = 65537",
                "idem.toml: requests_in_flight_max: 65537 is out of range (1..=65536)",
            ),
            (
                "requests_in_flight_max = 18446744073709551615",
                "idem.toml: requests_in_flight_max: 18446744073709551615 is out of range",
            ),
            (
                "admin_listen = \"localhost\"",
                "idem.toml: admin_listen: \"localhost\" is not an address",
            ),
            (
                "admin_token_env = \"IDEM-TOKEN\"",
                "idem.toml: admin_token_env: \"IDEM-TOKEN\" is not an environment variable name",
            ),
            (
                "[[route]]\nname = \"payouts\"\nlease_ms = 1",
                "idem.toml: route[0].lease_ms: lease_ms = 1 is out of range (100..=86400000) (\"payouts\")",
            ),
            (
                "[[route]]\n[[route]]\npath = \"x\"",
                "idem.toml: route[1].path: \"x\" must start with '/'",
            ),
        ];
        for (text, expect) in cases {
            let overrides = if text.starts_with("upstream") {
                Overrides::default()
            } else {
                up.clone()
            };
            let got = load(text, &overrides).map(|_| ()).unwrap_err();
            assert!(got.starts_with(expect), "{text:?}: {got}");
        }
        let missing = load("", &Overrides::default()).map(|_| ()).unwrap_err();
        assert!(missing.starts_with("upstream: is required"), "{missing}");
    }

    #[test]
    fn a_bad_store_is_refused_naming_the_file_or_the_flag() {
        let up = |store: Option<&str>| Overrides {
            upstream: Some("http://127.0.0.1:9000".into()),
            store: store.map(str::to_owned),
            ..Default::default()
        };
        let cases = [
            (
                "store = \"sqlite:/x\"",
                None,
                "idem.toml: store: the URL lacks the // after \"sqlite:\"; write sqlite:///x",
            ),
            (
                "store = \"mysql://app:s3cret@h/db\"",
                None,
                "idem.toml: store: \"mysql://app:***@h/db\" has scheme \"mysql\"",
            ),
            (
                "store = \"postgres://app:s3cret@h/db?bogus=1\"",
                None,
                "idem.toml: store: invalid PostgreSQL URL postgres://app:***@h/db?bogus=1: ",
            ),
            (
                "store = \"postgres://h/db\"",
                None,
                "idem.toml: store: invalid PostgreSQL URL postgres://h/db: it names no user",
            ),
            ("", Some("idem.db"), "--store: \"idem.db\" has no scheme"),
            (
                "store = \"sqlite://ok.db\"",
                Some("postgres://app:s3cret@h/db?schema=1x"),
                "--store: invalid schema name \"1x\"",
            ),
        ];
        for (text, flag, expect) in cases {
            let got = load(text, &up(flag)).map(|_| ()).unwrap_err();
            assert!(got.starts_with(expect), "{text:?} {flag:?}: {got}");
            assert!(!got.contains("s3cret"), "{got}");
        }
        let good = load(
            "store = \"postgres://app:s3cret@h/db?schema=pay&operation_timeout_ms=900\"",
            &up(None),
        )
        .unwrap();
        assert_eq!(
            good.store.to_string(),
            "postgres://app:***@h/db?schema=pay&operation_timeout_ms=900"
        );
    }

    /// A relative SQLite store in the file is the file's neighbour, as its
    /// contract and TLS files are; `--store` and the default stay the
    /// working directory's.
    #[test]
    fn a_store_in_the_file_is_read_against_the_file() {
        let path = Path::new("/etc/idem/idem.toml");
        let overrides = |store: Option<&str>| Overrides {
            upstream: Some("http://127.0.0.1:9000".into()),
            store: store.map(str::to_owned),
            ..Default::default()
        };
        let cases = [
            (
                "store = \"sqlite://idem.db\"",
                None,
                "sqlite:///etc/idem/idem.db",
            ),
            (
                "store = \"sqlite://d/x.db\"",
                None,
                "sqlite:///etc/idem/d/x.db",
            ),
            (
                "store = \"sqlite:///var/idem.db\"",
                None,
                "sqlite:///var/idem.db",
            ),
            (
                "store = \"sqlite://idem.db\"",
                Some("sqlite://cli.db"),
                "sqlite://cli.db",
            ),
            ("", None, "sqlite://idem.db"),
        ];
        for (text, flag, want) in cases {
            let file: FileConfig = toml::from_str(text).unwrap();
            let config = GatewayConfig::from_parts(file, Some(path), &overrides(flag)).unwrap();
            assert_eq!(config.store.to_string(), want, "{text:?} {flag:?}");
        }
    }

    #[test]
    fn unknown_fields_are_named_with_their_line() {
        let dir = std::env::temp_dir().join(format!("idem-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("idem.toml");
        std::fs::write(
            &path,
            "upstream = \"http://127.0.0.1:9\"\n\n[[route]]\nlease_msx = 5\n",
        )
        .unwrap();
        let e = GatewayConfig::load(Some(&path), &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("idem.toml: line 4, column 1: unknown field `lease_msx`"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn defaults_and_overrides() {
        let cli = Overrides {
            listen: Some("127.0.0.1:9999".into()),
            ..Default::default()
        };
        let c = load(
            "upstream = \"http://127.0.0.1:9000/base\"\nlisten = \"127.0.0.1:1\"",
            &cli,
        )
        .unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:9999");
        assert_eq!(c.store.to_string(), STORE_DEFAULT);
        assert_eq!(c.routes.len(), 1);
        assert_eq!(
            c.response_timeout,
            Duration::from_millis(RESPONSE_TIMEOUT_MS_DEFAULT)
        );
        assert_eq!(c.admin_listen, None, "the admin API is off by default");
        assert_eq!(c.admin_token_env, ADMIN_TOKEN_ENV_DEFAULT);
        assert_eq!(
            c.purge_interval,
            Duration::from_secs(PURGE_INTERVAL_S_DEFAULT)
        );
        assert_eq!(c.requests_in_flight_max, REQUESTS_IN_FLIGHT_MAX_DEFAULT);
    }

    #[test]
    fn admin_listen_from_the_command_line_wins() {
        let up = Overrides {
            upstream: Some("http://127.0.0.1:9000".into()),
            ..Default::default()
        };
        let mut c = load(
            "admin_listen = \"127.0.0.1:9090\"\nadmin_token_env = \"PAYOUTS_ADMIN\"\npurge_interval_s = 5",
            &up,
        )
        .unwrap();
        assert_eq!(
            c.admin_listen.map(|a| a.to_string()).as_deref(),
            Some("127.0.0.1:9090")
        );
        assert_eq!(c.purge_interval, Duration::from_secs(5));
        c.set_admin_listen("127.0.0.1:9191").unwrap();
        assert_eq!(
            c.admin_listen.map(|a| a.to_string()).as_deref(),
            Some("127.0.0.1:9191")
        );
        let e = c.set_admin_listen("nope").unwrap_err().to_string();
        assert!(
            e.starts_with("--admin-listen: \"nope\" is not an address"),
            "{e}"
        );
    }

    #[test]
    fn the_admin_token_must_be_set_and_long_enough() {
        let up = Overrides {
            upstream: Some("http://127.0.0.1:9000".into()),
            ..Default::default()
        };
        let c = load("admin_token_env = \"PAYOUTS_ADMIN\"", &up).unwrap();
        let token = |value: Option<&str>| {
            c.admin_token(|name| {
                assert_eq!(name, "PAYOUTS_ADMIN");
                value.map(str::to_owned)
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
        };
        let cases = [
            (None, Err("environment variable PAYOUTS_ADMIN is not set")),
            (
                Some(""),
                Err("PAYOUTS_ADMIN: the token is 0 bytes; at least 16"),
            ),
            (
                Some("short-token"),
                Err("PAYOUTS_ADMIN: the token is 11 bytes; at least 16"),
            ),
            (
                Some("sixteen bytes ok"),
                Err("PAYOUTS_ADMIN: the token must be visible ASCII"),
            ),
            (Some("0123456789abcdef"), Ok(())),
        ];
        for (value, want) in cases {
            match (token(value), want) {
                (Ok(()), Ok(())) => {}
                (Err(got), Err(part)) => assert!(got.contains(part), "{value:?}: {got}"),
                (got, want) => panic!("{value:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn session_limits_are_validated_naming_the_field() {
        let cases = [
            (None, None, Ok((900, 28_800))),
            (Some(2), Some(60), Ok((2, 60))),
            (Some(0), None, Err("console_session_idle_s")),
            (
                None,
                Some(SESSION_S_MAX + 1),
                Err("console_session_absolute_s"),
            ),
            (Some(120), Some(60), Err("console_session_idle_s")),
        ];
        for (idle, absolute, want) in cases {
            let got = SessionLimits::new(idle, absolute)
                .map(|l| (l.idle.as_secs(), l.absolute.as_secs()))
                .map_err(|e| e.field);
            assert_eq!(got, want, "{idle:?} {absolute:?}");
        }
    }

    #[test]
    fn the_session_limits_come_from_the_config_file_named_in_errors() {
        let load = |idle: Option<u64>, absolute: Option<u64>| {
            let file = FileConfig {
                upstream: Some("http://127.0.0.1:9000".into()),
                console_session_idle_s: idle,
                console_session_absolute_s: absolute,
                ..FileConfig::default()
            };
            let path = Path::new("idem.toml");
            GatewayConfig::from_parts(file, Some(path), &Overrides::default())
        };
        let limits = load(Some(5), Some(60)).unwrap().console_sessions;
        assert_eq!((limits.idle.as_secs(), limits.absolute.as_secs()), (5, 60));
        assert_eq!(
            load(None, None).unwrap().console_sessions,
            SessionLimits::default()
        );
        let cases = [
            (
                Some(0),
                None,
                "idem.toml: console_session_idle_s: 0 is out of range",
            ),
            (
                None,
                Some(SESSION_S_MAX + 1),
                "idem.toml: console_session_absolute_s:",
            ),
            (
                Some(61),
                Some(60),
                "idem.toml: console_session_idle_s: 61 s is longer",
            ),
        ];
        for (idle, absolute, want) in cases {
            let e = load(idle, absolute).unwrap_err().to_string();
            assert!(e.starts_with(want), "{e}");
        }
    }
}
