//! The config file as written (`FileConfig`), read and located, and the
//! first section: where the gateway listens, forwards and stores, and who
//! it is (owner, region).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use http::Uri;
use idem_http::RouteSpec;
use idem_process::{STORE_DEFAULT, StoreUrl};
use idem_reconcile::{LookupSpec, ReconcileSpec};
use serde::Deserialize;

use super::{ConfigError, LISTEN_DEFAULT, Overrides};

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
    /// Name of the environment variable holding the admin API's token
    /// (operator `admin`).
    pub admin_token_env: Option<String>,
    /// Named operators and the trusted proxy's operator header.
    pub admin: Option<super::AdminSection>,
    /// PEM certificate chain (leaf first) the admin API presents over TLS;
    /// with `admin_tls_key_file`, or neither. Relative to the config file.
    pub admin_tls_cert_file: Option<PathBuf>,
    /// PEM private key of `admin_tls_cert_file`'s leaf.
    pub admin_tls_key_file: Option<PathBuf>,
    /// Seconds between two runs of the retention purge.
    pub purge_interval_s: Option<u64>,
    /// The base of every problem `type` URI, followed by the problem's slug
    /// (e.g. `https://docs.example.com/idem/problems#`, where a published
    /// docs/problems.md has an anchor per slug); default
    /// `urn:idem:problem:`.
    pub problem_type_base: Option<String>,
    /// Seconds between two samples of the store for the gauges of
    /// `/metrics` (the ambiguous backlog, the suspect window).
    pub gauge_sample_interval_s: Option<u64>,
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

pub(super) fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new("(file)", format!("cannot read: {e}")).in_file(path))?;
    toml::from_str(&text).map_err(|e| {
        let (line, column) = e
            .span()
            .map(|span| line_column(&text, span.start))
            .unwrap_or((0, 0));
        ConfigError::new(format!("line {line}, column {column}"), e.message()).in_file(path)
    })
}

pub(super) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..offset.min(text.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
    (line, column)
}

/// Where a refused value came from: the config file (when one was read),
/// or the command line.
#[derive(Clone, Copy)]
pub(super) struct Place<'a> {
    pub(super) path: Option<&'a Path>,
}

impl Place<'_> {
    /// `field` refused for `reason`, in the file when `from_file`.
    pub(super) fn err(self, field: &str, reason: String, from_file: bool) -> ConfigError {
        let refused = ConfigError::new(field, reason);
        match self.path {
            Some(path) if from_file => refused.in_file(path),
            _ => refused,
        }
    }
}

/// What the gateway is and where it listens, forwards and stores.
pub(super) struct Basics {
    pub(super) listen: SocketAddr,
    pub(super) upstream: Uri,
    pub(super) base_dir: PathBuf,
    pub(super) store: StoreUrl,
    pub(super) owner: String,
}

impl Basics {
    pub(super) fn validate(
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

pub(super) fn pick<'a>(
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

pub(super) fn parse_upstream(raw: &str) -> Result<Uri, String> {
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
