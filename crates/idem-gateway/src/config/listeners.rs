//! The listeners' section: timeouts, connection and body bounds, the
//! admin listener and its token, the console's sessions, and the TLS
//! files every listener and https:// client is built from.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Uri;
use idem_core::FieldError;
use idem_http::WaitLimits;
use idem_process::{ConnectionLimits, ServerTls, TlsError, UpstreamTls};
use idem_reconcile::Lookup;

use super::{
    ADMIN_CONNECTIONS_MAX_DEFAULT, ADMIN_TOKEN_ENV_DEFAULT, BODY_READ_TIMEOUT_MS_DEFAULT, Basics,
    CONNECT_TIMEOUT_MS_DEFAULT, CONNECTIONS_MAX_DEFAULT, CONNECTIONS_MAX_LIMIT, ConfigError,
    FileConfig, HEADER_READ_TIMEOUT_MS_DEFAULT, Overrides, PURGE_INTERVAL_S_DEFAULT,
    PURGE_INTERVAL_S_MAX, Place, REQUESTS_IN_FLIGHT_MAX_DEFAULT, REQUESTS_IN_FLIGHT_MAX_LIMIT,
    RESPONSE_TIMEOUT_MS_DEFAULT, ROUTES_MAX, SESSION_ABSOLUTE_S_DEFAULT, SESSION_IDLE_S_DEFAULT,
    SESSION_S_MAX, TIMEOUT_MS_MAX, TLS_HANDSHAKE_TIMEOUT_MS_DEFAULT, WAITERS_LIMIT, with_trust,
};
use crate::regions::Regions;

/// The TLS files named on the command line or in the file, resolved: a
/// command-line path against the working directory, a file's against the
/// config file's directory. Each comes with whether it is from the file.
pub(super) struct TlsFiles {
    pub(super) upstream_ca: Option<(PathBuf, bool)>,
    pub(super) listen_cert: Option<(PathBuf, bool)>,
    pub(super) listen_key: Option<(PathBuf, bool)>,
    pub(super) admin_cert: Option<(PathBuf, bool)>,
    pub(super) admin_key: Option<(PathBuf, bool)>,
}

/// How long a console session lives, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLimits {
    /// A session unused for this long ends.
    pub idle: Duration,
    /// A session ends this long after sign-in, however busy.
    pub absolute: Duration,
}

impl TlsFiles {
    pub(super) fn pick(file: &FileConfig, overrides: &Overrides, base_dir: &Path) -> TlsFiles {
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
    pub(super) fn upstream(
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
    pub(super) fn listen(&self) -> Result<Option<ServerTls>, (&'static str, String, bool)> {
        server_tls(
            (&self.listen_cert, "tls_cert_file"),
            (&self.listen_key, "tls_key_file"),
        )
    }

    /// The admin API's certificate and key: both files or neither.
    pub(super) fn admin(&self) -> Result<Option<ServerTls>, (&'static str, String, bool)> {
        server_tls(
            (&self.admin_cert, "admin_tls_cert_file"),
            (&self.admin_key, "admin_tls_key_file"),
        )
    }
}

/// A listener's certificate and key from the files of two fields, both or
/// neither; an error names the field at fault.
pub(super) fn server_tls(
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
    pub fn new(idle_s: Option<u64>, absolute_s: Option<u64>) -> Result<SessionLimits, FieldError> {
        let check = |field: &'static str, value: Option<u64>, default: u64| match value
            .unwrap_or(default)
        {
            s @ 1..=SESSION_S_MAX => Ok(Duration::from_secs(s)),
            s => Err(FieldError::new(
                field,
                format!("{s} is out of range (1..={SESSION_S_MAX})"),
            )),
        };
        let idle = check("console_session_idle_s", idle_s, SESSION_IDLE_S_DEFAULT)?;
        let absolute = check(
            "console_session_absolute_s",
            absolute_s,
            SESSION_ABSOLUTE_S_DEFAULT,
        )?;
        if idle > absolute {
            return Err(FieldError::new(
                "console_session_idle_s",
                format!(
                    "{} s is longer than console_session_absolute_s ({} s); a session \
                     ends at the absolute limit whatever its use",
                    idle.as_secs(),
                    absolute.as_secs()
                ),
            ));
        }
        Ok(SessionLimits { idle, absolute })
    }
}

pub(super) fn connection_bounds(
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

/// `waiters_max`, `waiters_per_key_max` and `waiters_per_principal_max`,
/// in range.
pub(super) fn wait_limits(file: &FileConfig) -> Result<WaitLimits, (&'static str, String)> {
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

pub(super) fn parse_admin_listen(raw: &str) -> Result<SocketAddr, String> {
    raw.parse::<SocketAddr>()
        .map_err(|e| format!("{raw:?} is not an address like 127.0.0.1:9090 ({e})"))
}

/// A portable environment variable name: letters, digits and `_`, not
/// starting with a digit.
pub(super) fn check_env_name(name: &str) -> Result<(), String> {
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

/// The timeouts and bounds of the listeners, the admin API's address and
/// token, and how often the purge runs.
pub(super) struct Limits {
    pub(super) connect_timeout: Duration,
    pub(super) response_timeout: Duration,
    pub(super) admin_listen: Option<SocketAddr>,
    pub(super) admin_token_env: String,
    pub(super) purge_interval: Duration,
    pub(super) gauge_sample_interval: Duration,
    pub(super) requests_in_flight_max: usize,
    pub(super) connections: ConnectionLimits,
    pub(super) admin_connections: ConnectionLimits,
    pub(super) body_read_timeout: Duration,
    pub(super) wait_limits: WaitLimits,
}

impl Limits {
    pub(super) fn validate(file: &FileConfig, at: Place) -> Result<Limits, ConfigError> {
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
        let gauge_sample_interval = gauge_sample_interval(file.gauge_sample_interval_s)
            .map_err(|reason| at.err("gauge_sample_interval_s", reason, true))?;
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
            gauge_sample_interval,
            requests_in_flight_max,
            connections,
            admin_connections,
            body_read_timeout,
            wait_limits,
        })
    }
}

/// The admin API's address and the variable that holds its token.
pub(super) fn admin(
    file: &FileConfig,
    at: Place,
) -> Result<(Option<SocketAddr>, String), ConfigError> {
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
pub(super) fn requests_in_flight_max(file: &FileConfig, at: Place) -> Result<usize, ConfigError> {
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

/// What each TLS file makes: the listeners' certificates, what an https
/// upstream, lookup or peer is trusted by, and the lookups given that trust.
pub(super) struct TlsSection {
    pub(super) upstream_tls: Option<UpstreamTls>,
    pub(super) peer_tls: Option<UpstreamTls>,
    pub(super) admin_tls: Option<ServerTls>,
    pub(super) listen_tls: Option<ServerTls>,
    pub(super) lookups: Vec<(String, Lookup)>,
}

impl TlsSection {
    pub(super) fn validate(
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

/// `gauge_sample_interval_s`: 1 to
/// [`idem_process::gauges::GAUGE_SAMPLE_INTERVAL_S_MAX`] seconds, default
/// [`idem_process::gauges::GAUGE_SAMPLE_INTERVAL_S_DEFAULT`].
pub(crate) fn gauge_sample_interval(value: Option<u64>) -> Result<Duration, String> {
    use idem_process::gauges::{GAUGE_SAMPLE_INTERVAL_S_DEFAULT, GAUGE_SAMPLE_INTERVAL_S_MAX};
    match value.unwrap_or(GAUGE_SAMPLE_INTERVAL_S_DEFAULT) {
        s @ 1..=GAUGE_SAMPLE_INTERVAL_S_MAX => Ok(Duration::from_secs(s)),
        s => Err(format!(
            "{s} is out of range (1..={GAUGE_SAMPLE_INTERVAL_S_MAX})"
        )),
    }
}
