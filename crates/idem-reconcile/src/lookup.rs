//! The lookup request of one route: how to ask the provider, by the exact
//! reference the gateway forwarded (never the client's key alone, which two
//! tenants may share), whether an effect happened. Declared as plain data
//! ([`LookupSpec`], a `[[lookup]]` table) and validated once into [`Lookup`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, Uri};
use idem_core::RecordId;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Deserialize;

use crate::settings::{ConfigError, check_range};

/// Default time allowed for one whole lookup exchange, in milliseconds.
pub const TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// Default connect timeout, in milliseconds (capped at the lookup's timeout).
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 1_000;
/// The longest timeout a lookup may declare, in milliseconds (five minutes).
pub const TIMEOUT_MS_MAX: u64 = 300_000;
/// The most static headers a lookup may declare.
pub const HEADERS_MAX: usize = 32;

/// How the gateway renders the reference it forwarded for a record (its
/// route's `forward_key` template, `idem_http::Route::forwarded_key`): what
/// the provider knows the effect by. Given by whoever pairs a lookup with
/// its route, so this crate needs no HTTP route of its own.
pub type ForwardedKey = Arc<dyn Fn(&RecordId) -> String + Send + Sync>;

/// Every byte outside RFC 3986's unreserved set is percent-encoded in a value.
const VALUE_ENCODED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A lookup as declared: every field optional, defaults applied by [`Lookup::new`].
///
/// ```toml
/// [[lookup]]
/// route = "payouts"
/// method = "GET"
/// url = "http://127.0.0.1:9000/payouts/by-key/{forwarded_key}"
/// found = [200]
/// not_found = [404]
/// headers = [["authorization", "Bearer secret"]]
/// timeout_ms = 5000
/// ```
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LookupSpec {
    /// In `idem serve`'s config: the `name` of the route whose ambiguous
    /// records this looks up. Read by the config ([`LookupSpec::target`]),
    /// not by [`Lookup::new`].
    pub route: Option<String>,
    /// In `idem consume`'s config: the `name` of the subscription, as
    /// `route` is for the gateway.
    pub subscription: Option<String>,
    /// Request method; default `GET`. The request has no body.
    pub method: Option<String>,
    /// `http://host[:port]/path[?query]` or `https://…` with `{forwarded_key}` (required:
    /// the value the upstream received in the forwarded key header), and
    /// optionally `{key}`, `{operation}` and `{principal}`, in the path or
    /// query. Every value is percent-encoded.
    pub url: Option<String>,
    /// Statuses meaning "the effect happened": the answer is stored as the
    /// record's result; default `[200]`.
    pub found: Option<Vec<u16>>,
    /// Statuses meaning "definitely not executed": the record is released;
    /// default `[404]`.
    pub not_found: Option<Vec<u16>>,
    /// The status stored (and replayed) when the lookup finds the effect:
    /// the one the original request would have got (`201` for a create).
    /// Default: the lookup's own status. The body and headers stored are
    /// still the lookup's (docs/http.md, "What a found lookup stores").
    pub found_status: Option<u16>,
    /// Static request headers, as `[name, value]` pairs; default none.
    pub headers: Option<Vec<(String, String)>>,
    /// Time allowed for the whole exchange, in milliseconds; default 5000.
    pub timeout_ms: Option<u64>,
    /// Time allowed to connect, in milliseconds; default 1000, at most `timeout_ms`.
    pub connect_timeout_ms: Option<u64>,
}

/// What a `[[lookup]]` serves, by the field a config file names it with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LookupTarget {
    /// A route of `idem serve`'s config: `route = "name"`.
    Route,
    /// A subscription of `idem consume`'s config: `subscription = "name"`.
    Subscription,
}

impl LookupTarget {
    /// The field that names it.
    pub fn field(self) -> &'static str {
        match self {
            LookupTarget::Route => "route",
            LookupTarget::Subscription => "subscription",
        }
    }

    fn owner(self) -> &'static str {
        match self {
            LookupTarget::Route => "[[route]]",
            LookupTarget::Subscription => "[[subscription]]",
        }
    }
}

/// A validated lookup, paired with its route's forwarded key.
#[derive(Clone)]
pub struct Lookup {
    method: Method,
    url: UrlTemplate,
    forwarded_key: ForwardedKey,
    found: Vec<u16>,
    not_found: Vec<u16>,
    found_status: Option<u16>,
    headers: HeaderMap,
    timeout: Duration,
    connect_timeout: Duration,
    tls: Arc<rustls::ClientConfig>,
    /// What `tls` trusts, in words for an error.
    trust: Arc<str>,
}

/// A TLS client with no trusted root: an `https://` lookup whose caller
/// gave none fails every handshake rather than trusting anything.
fn trusting_nothing() -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot set up TLS: {e}"))?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// What a lookup's status says about the effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// One of the `found` statuses: the effect happened.
    Found,
    /// One of the `not_found` statuses: the effect definitely did not happen.
    NotFound,
    /// Anything else: no finding, try again later.
    Unknown,
}

/// A URL with placeholders, split once into literal text and values.
#[derive(Clone, Debug, PartialEq, Eq)]
struct UrlTemplate {
    text: String,
    parts: Vec<Part>,
}

/// What the placeholders of one render stand for.
struct Values<'a> {
    forwarded_key: &'a str,
    key: &'a str,
    operation: &'a str,
    principal: &'a str,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Text(String),
    ForwardedKey,
    Key,
    Operation,
    Principal,
}

impl Lookup {
    /// Validates a declared lookup, applying defaults; `forwarded_key`
    /// renders `{forwarded_key}` for a record. Errors name the field.
    pub fn new(spec: &LookupSpec, forwarded_key: ForwardedKey) -> Result<Lookup, ConfigError> {
        let method = parse_method(spec.method.as_deref().unwrap_or("GET"))?;
        let url = match &spec.url {
            Some(url) => {
                UrlTemplate::parse(url).map_err(|reason| ConfigError::new("url", reason))?
            }
            None => return Err(ConfigError::new("url", "is required")),
        };
        let found = statuses("found", spec.found.as_deref().unwrap_or(&[200]))?;
        let not_found = statuses("not_found", spec.not_found.as_deref().unwrap_or(&[404]))?;
        if let Some(both) = found.iter().find(|s| not_found.contains(s)) {
            return Err(ConfigError::new(
                "not_found",
                format!("status {both} is also listed in found"),
            ));
        }
        let found_status = spec
            .found_status
            .map(|status| check_range("found_status", status.into(), 200, 299).map(|_| status))
            .transpose()?;
        let timeout_ms = spec.timeout_ms.unwrap_or(TIMEOUT_MS_DEFAULT);
        check_range("timeout_ms", timeout_ms, 1, TIMEOUT_MS_MAX)?;
        let connect_timeout_ms = match spec.connect_timeout_ms {
            Some(ms) => check_range("connect_timeout_ms", ms, 1, timeout_ms)?,
            None => CONNECT_TIMEOUT_MS_DEFAULT.min(timeout_ms),
        };
        Ok(Lookup {
            method,
            url,
            forwarded_key,
            found,
            not_found,
            found_status,
            headers: headers(spec.headers.as_deref().unwrap_or(&[]))?,
            timeout: Duration::from_millis(timeout_ms),
            connect_timeout: Duration::from_millis(connect_timeout_ms),
            tls: trusting_nothing().map_err(|reason| ConfigError::new("url", reason))?,
            trust: "no root at all".into(),
        })
    }

    /// Whether the lookup asks over `https://`.
    pub fn is_https(&self) -> bool {
        self.url.text.starts_with("https://")
    }

    /// Speaks TLS with `config` to an `https://` provider (its roots: the
    /// caller's choice, e.g. the system's and the gateway's
    /// `upstream_ca_file`, which `trust` says in words for an error).
    /// Without it an https lookup trusts no certificate, and every
    /// handshake fails.
    pub fn with_tls(mut self, config: Arc<rustls::ClientConfig>, trust: Arc<str>) -> Lookup {
        self.tls = config;
        self.trust = trust;
        self
    }

    /// What the provider's certificate is checked against, in words.
    pub(crate) fn trust(&self) -> &str {
        &self.trust
    }

    /// The TLS configuration for an `https://` provider.
    pub(crate) fn tls(&self) -> &Arc<rustls::ClientConfig> {
        &self.tls
    }

    /// The URL asked for a record: the template with the reference
    /// forwarded for it, its operation, principal and key, each
    /// percent-encoded.
    pub fn url_for(&self, id: &RecordId) -> String {
        let (operation, principal) = scope_parts(id);
        let values = Values {
            forwarded_key: &(self.forwarded_key)(id),
            key: id.key.as_str(),
            operation,
            principal,
        };
        self.url.render(&values)
    }

    /// What `status` says about the effect.
    pub fn verdict(&self, status: u16) -> Verdict {
        if self.found.contains(&status) {
            Verdict::Found
        } else if self.not_found.contains(&status) {
            Verdict::NotFound
        } else {
            Verdict::Unknown
        }
    }

    /// The status a found answer with `status` is stored with: the
    /// route's `found_status`, else `status` itself.
    pub fn stored_status(&self, status: u16) -> u16 {
        self.found_status.unwrap_or(status)
    }

    /// The request method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The static request headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// Time allowed for the whole exchange.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Time allowed to connect.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }
}

/// The operation and principal of a record's scope, `operation|principal[|region]`
/// (no part contains `|`); a scope without a separator has an empty principal.
pub fn scope_parts(id: &RecordId) -> (&str, &str) {
    let mut parts = id.scope.as_str().split('|');
    let operation = parts.next().unwrap_or_default();
    (operation, parts.next().unwrap_or_default())
}

// Header values are credentials more often than not: never print them.
impl fmt::Debug for Lookup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lookup")
            .field("method", &self.method)
            .field("url", &self.url.text)
            .field("found", &self.found)
            .field("not_found", &self.not_found)
            .field("found_status", &self.found_status)
            .field(
                "headers",
                &redacted(self.headers.keys().map(|k| k.as_str())),
            )
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl LookupSpec {
    /// The name of what it serves in a config whose lookups serve
    /// `target`; otherwise the field at fault and why: the other config's
    /// field (a lookup copied from the other kind of config), or none.
    pub fn target(&self, target: LookupTarget) -> Result<&str, (&'static str, String)> {
        let other = match target {
            LookupTarget::Route => LookupTarget::Subscription,
            LookupTarget::Subscription => LookupTarget::Route,
        };
        let (own, others) = match target {
            LookupTarget::Route => (&self.route, &self.subscription),
            LookupTarget::Subscription => (&self.subscription, &self.route),
        };
        if others.is_some() {
            return Err((
                other.field(),
                format!(
                    "this config has no {}; its lookups name the {} they serve with `{} = \"…\"`",
                    other.owner(),
                    target.owner(),
                    target.field()
                ),
            ));
        }
        own.as_deref().ok_or_else(|| {
            (
                target.field(),
                format!("missing: name the {} this lookup serves", target.owner()),
            )
        })
    }
}

impl fmt::Debug for LookupSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.headers.iter().flatten().map(|(n, _)| n.as_str());
        f.debug_struct("LookupSpec")
            .field("route", &self.route)
            .field("subscription", &self.subscription)
            .field("method", &self.method)
            .field("url", &self.url)
            .field("found", &self.found)
            .field("not_found", &self.not_found)
            .field("found_status", &self.found_status)
            .field("headers", &redacted(names))
            .field("timeout_ms", &self.timeout_ms)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .finish()
    }
}

fn redacted<'a>(names: impl Iterator<Item = &'a str>) -> Vec<(&'a str, &'static str)> {
    names.map(|n| (n, "<redacted>")).collect()
}

impl UrlTemplate {
    fn parse(text: &str) -> Result<UrlTemplate, String> {
        let Some(rest) = text
            .strip_prefix("http://")
            .or_else(|| text.strip_prefix("https://"))
        else {
            return Err(format!("{text:?} must start with http:// or https://"));
        };
        let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
        if authority.is_empty() {
            return Err(format!("{text:?} has no host"));
        }
        if authority.contains(['{', '}', '@']) {
            return Err(format!(
                "{text:?}: the host may hold neither placeholders nor credentials"
            ));
        }
        if text.contains('#') {
            return Err(format!("{text:?} must not have a fragment"));
        }
        let parts = split_placeholders(text)?;
        if !parts.contains(&Part::ForwardedKey) {
            return Err(if parts.contains(&Part::Key) {
                format!(
                    "{text:?} asks by {{key}}, the client's key, which two tenants may share; \
                     the provider knows the effect by the reference the gateway forwarded: \
                     write {{forwarded_key}} instead"
                )
            } else {
                format!("{text:?} must contain {{forwarded_key}}")
            });
        }
        let template = UrlTemplate {
            text: text.to_owned(),
            parts,
        };
        // Values are percent-encoded, so one sample render proves every render parses.
        let sample = template.render(&Values {
            forwarded_key: "forwarded",
            key: "key",
            operation: "operation",
            principal: "principal",
        });
        match sample.parse::<Uri>() {
            Ok(uri) if uri.host().is_some_and(|h| !h.is_empty()) => Ok(template),
            Ok(_) => Err(format!("{text:?} has no host")),
            Err(e) => Err(format!("{text:?} is not a valid URL: {e}")),
        }
    }

    fn render(&self, values: &Values<'_>) -> String {
        let mut out = String::with_capacity(self.text.len() + values.forwarded_key.len() * 3);
        for part in &self.parts {
            let value = match part {
                Part::Text(t) => {
                    out.push_str(t);
                    continue;
                }
                Part::ForwardedKey => values.forwarded_key,
                Part::Key => values.key,
                Part::Operation => values.operation,
                Part::Principal => values.principal,
            };
            out.extend(utf8_percent_encode(value, VALUE_ENCODED));
        }
        out
    }
}

fn split_placeholders(text: &str) -> Result<Vec<Part>, String> {
    let mut pieces = text.split('{');
    let mut parts = Vec::new();
    let literal = |t: &str, parts: &mut Vec<Part>| {
        if t.contains('}') {
            return Err(format!("{text:?}: '}}' without '{{'"));
        }
        if !t.is_empty() {
            parts.push(Part::Text(t.to_owned()));
        }
        Ok(())
    };
    literal(pieces.next().unwrap_or_default(), &mut parts)?;
    for piece in pieces {
        let Some((name, tail)) = piece.split_once('}') else {
            return Err(format!("{text:?}: unclosed '{{'"));
        };
        parts.push(match name {
            "forwarded_key" => Part::ForwardedKey,
            "key" => Part::Key,
            "operation" => Part::Operation,
            "principal" => Part::Principal,
            other => {
                return Err(format!(
                    "{text:?}: unknown placeholder {{{other}}}; use {{forwarded_key}}, {{key}}, \
                     {{operation}} or {{principal}}"
                ));
            }
        });
        literal(tail, &mut parts)?;
    }
    Ok(parts)
}

fn parse_method(name: &str) -> Result<Method, ConfigError> {
    match Method::from_bytes(name.to_ascii_uppercase().as_bytes()) {
        Ok(Method::CONNECT) => Err(ConfigError::new(
            "method",
            "CONNECT opens a tunnel; a lookup is a plain request",
        )),
        Ok(method) => Ok(method),
        Err(_) => Err(ConfigError::new(
            "method",
            format!("{name:?} is not an HTTP method"),
        )),
    }
}

fn statuses(field: &'static str, declared: &[u16]) -> Result<Vec<u16>, ConfigError> {
    if declared.is_empty() {
        return Err(ConfigError::new(field, "must list at least one status"));
    }
    if let Some(bad) = declared.iter().find(|s| !(100..=599).contains(*s)) {
        return Err(ConfigError::new(
            field,
            format!("{bad} is not an HTTP status (100-599)"),
        ));
    }
    let mut list = declared.to_vec();
    list.sort_unstable();
    list.dedup();
    Ok(list)
}

fn headers(declared: &[(String, String)]) -> Result<HeaderMap, ConfigError> {
    if declared.len() > HEADERS_MAX {
        return Err(ConfigError::new(
            "headers",
            format!("{} headers; at most {HEADERS_MAX}", declared.len()),
        ));
    }
    let mut map = HeaderMap::new();
    for (name, value) in declared {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| ConfigError::new("headers", format!("{name:?} is not a header name")))?;
        if is_framing(&header) {
            return Err(ConfigError::new(
                "headers",
                format!("{name:?} is set by the HTTP client, not by configuration"),
            ));
        }
        // The value is never echoed: it is likely a credential.
        let value = HeaderValue::from_str(value).map_err(|_| {
            ConfigError::new("headers", format!("the value of {name:?} is not valid"))
        })?;
        map.append(header, value);
    }
    Ok(map)
}

fn is_framing(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "host"
            | "content-length"
            | "transfer-encoding"
            | "connection"
            | "keep-alive"
            | "te"
            | "trailer"
            | "upgrade"
    )
}

/// `reason` (a failed connection, with its error chain), followed by what
/// the server's certificate was checked against when this side refused it
/// (another CA, another name): the field and file that can fix it. The
/// gateway's upstream, its region peers and the lookups say it alike.
pub fn with_trust(mut reason: String, trust: &str) -> String {
    if reason.contains("invalid peer certificate") {
        reason.push_str(&format!(" (the certificate was checked against {trust})"));
    }
    reason
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lookup_names_what_it_serves_by_its_configs_field() {
        let route = LookupSpec {
            route: Some("payouts".to_owned()),
            ..LookupSpec::default()
        };
        let subscription = LookupSpec {
            subscription: Some("payouts".to_owned()),
            ..LookupSpec::default()
        };
        assert_eq!(route.target(LookupTarget::Route), Ok("payouts"));
        assert_eq!(
            subscription.target(LookupTarget::Subscription),
            Ok("payouts")
        );
        for (entry, target, field, says) in [
            (
                &route,
                LookupTarget::Subscription,
                "route",
                "this config has no [[route]]",
            ),
            (
                &subscription,
                LookupTarget::Route,
                "subscription",
                "has no [[subscription]]",
            ),
            (
                &LookupSpec::default(),
                LookupTarget::Route,
                "route",
                "missing",
            ),
        ] {
            match entry.target(target) {
                Err((at, why)) => {
                    assert_eq!(at, field);
                    assert!(why.contains(says), "{why}");
                }
                Ok(name) => panic!("{target:?}: accepted {name:?}"),
            }
        }
    }
    use crate::settings::check_field_errors;
    use idem_core::{IdempotencyKey, Scope};

    fn spec(url: &str) -> LookupSpec {
        LookupSpec {
            url: Some(url.into()),
            ..Default::default()
        }
    }

    /// A route whose template is `{scope_digest}:{forwarded_key}`, with the scope
    /// itself standing in for its digest.
    fn forwarded() -> ForwardedKey {
        Arc::new(|id: &RecordId| format!("{}:{}", id.scope.as_str(), id.key.as_str()))
    }

    #[test]
    fn an_https_url_is_a_lookup_over_tls_and_other_schemes_are_refused() {
        assert!(
            lookup(&spec("https://h:8443/p/{forwarded_key}"))
                .unwrap()
                .is_https()
        );
        assert!(
            !lookup(&spec("http://h/p/{forwarded_key}"))
                .unwrap()
                .is_https()
        );
        for url in [
            "ftp://h/{forwarded_key}",
            "HTTPS://h/{forwarded_key}",
            "h/{forwarded_key}",
        ] {
            let e = lookup(&spec(url)).unwrap_err();
            assert_eq!(e.field, "url", "{url}");
            assert!(
                e.reason.contains("http:// or https://"),
                "{url}: {}",
                e.reason
            );
        }
    }

    fn lookup(spec: &LookupSpec) -> Result<Lookup, ConfigError> {
        Lookup::new(spec, forwarded())
    }

    fn id(scope: &str, key: &str) -> RecordId {
        RecordId {
            scope: Scope::new(scope).unwrap(),
            key: IdempotencyKey::parse(key).unwrap(),
        }
    }

    #[test]
    fn every_field_is_named_in_its_error() {
        let headers = format!(
            "headers = [{}]",
            vec![r#"["x-a", "v"]"#; HEADERS_MAX + 1].join(",")
        );
        let url = r#"url = "http://127.0.0.1:9000/p/{forwarded_key}""#;
        let with_url = |rest: &str| format!("{url}\n{rest}");
        let cases: Vec<(String, &str)> = vec![
            (String::new(), "url"),
            (r#"url = "ftp://h/{forwarded_key}""#.into(), "url"),
            (r#"url = "http:///{forwarded_key}""#.into(), "url"),
            (r#"url = "http://{forwarded_key}/x""#.into(), "url"),
            (r#"url = "http://user:pw@h/{forwarded_key}""#.into(), "url"),
            (r#"url = "http://h/p""#.into(), "url"),
            (r#"url = "http://h/{nope}/{forwarded_key}""#.into(), "url"),
            (r#"url = "http://h/{key""#.into(), "url"),
            (r#"url = "http://h/}{forwarded_key}""#.into(), "url"),
            (r#"url = "http://h/{forwarded_key}#frag""#.into(), "url"),
            // The client's key alone, however spelt, is not what was forwarded.
            (r#"url = "http://h/{key}""#.into(), "url"),
            (r#"url = "http://h/{Forwarded_Key}""#.into(), "url"),
            (r#"url = "http://h/{ forwarded_key }""#.into(), "url"),
            (r#"url = "http://h/{forwarded-key}/{key}""#.into(), "url"),
            (
                r#"url = "http://h/%7Bforwarded_key%7D/{key}""#.into(),
                "url",
            ),
            (r#"url = "http://h/{{forwarded_key}}""#.into(), "url"),
            (r#"url = "http://{forwarded_key}/x""#.into(), "url"),
            (r#"url = "http://h/a b/{forwarded_key}""#.into(), "url"),
            (with_url(r#"method = "G ET""#), "method"),
            (with_url(r#"method = "connect""#), "method"),
            (with_url("found = []"), "found"),
            (with_url("found = [99]"), "found"),
            (with_url("not_found = [600]"), "not_found"),
            (with_url("not_found = []"), "not_found"),
            (with_url("found = [200, 404]"), "not_found"),
            (with_url("found_status = 404"), "found_status"),
            (with_url("found_status = 199"), "found_status"),
            (with_url("timeout_ms = 0"), "timeout_ms"),
            (with_url("timeout_ms = 300001"), "timeout_ms"),
            (
                with_url("timeout_ms = 100\nconnect_timeout_ms = 200"),
                "connect_timeout_ms",
            ),
            (with_url("connect_timeout_ms = 0"), "connect_timeout_ms"),
            (with_url(r#"headers = [["bad name", "v"]]"#), "headers"),
            (with_url(r#"headers = [["x-a", "bad\nvalue"]]"#), "headers"),
            (with_url(r#"headers = [["host", "h"]]"#), "headers"),
            (with_url(&headers), "headers"),
        ];
        let cases: Vec<(&str, &str)> = cases.iter().map(|(t, f)| (t.as_str(), *f)).collect();
        check_field_errors(&cases, lookup);
    }

    #[test]
    fn a_lookup_by_the_clients_key_says_what_to_write_instead() {
        let cases = [
            ("http://h/by-key/{key}", "write {forwarded_key} instead"),
            ("http://h/by-key/x", "must contain {forwarded_key}"),
        ];
        for (url, want) in cases {
            let Err(e) = lookup(&spec(url)) else {
                panic!("{url} was accepted");
            };
            assert_eq!(e.field, "url");
            assert!(e.reason.contains(want), "{e}");
        }
    }

    #[test]
    fn defaults_apply() {
        let declared = lookup(&spec("http://h:1/p/{forwarded_key}")).unwrap();
        assert_eq!(declared.method(), Method::GET);
        assert_eq!(declared.verdict(200), Verdict::Found);
        assert_eq!(declared.verdict(404), Verdict::NotFound);
        assert_eq!(declared.verdict(500), Verdict::Unknown);
        assert_eq!(
            declared.timeout(),
            Duration::from_millis(TIMEOUT_MS_DEFAULT)
        );
        assert_eq!(declared.connect_timeout(), Duration::from_millis(1_000));
        let short = lookup(&LookupSpec {
            timeout_ms: Some(300),
            ..spec("http://h/{forwarded_key}")
        })
        .unwrap();
        assert_eq!(short.connect_timeout(), Duration::from_millis(300));
    }

    #[test]
    fn renders_percent_encoded_values() {
        let cases = [
            (
                "http://h:9/by-ref/{forwarded_key}",
                "payouts|t1",
                "payout-847_2026.W36~",
                "http://h:9/by-ref/payouts%7Ct1%3Apayout-847_2026.W36~",
            ),
            (
                "http://h/by-ref/{forwarded_key}?key={key}",
                "op|t1",
                "a/b?c=d&e#f%g\"h+\\",
                "http://h/by-ref/op%7Ct1%3Aa%2Fb%3Fc%3Dd%26e%23f%25g%22h%2B%5C\
                 ?key=a%2Fb%3Fc%3Dd%26e%23f%25g%22h%2B%5C",
            ),
            (
                "http://h/{operation}/{principal}?ref={forwarded_key}",
                "POST /payouts|tenant 42|eu",
                "k1",
                "http://h/POST%20%2Fpayouts/tenant%2042?ref=POST%20%2Fpayouts%7Ctenant%2042%7Ceu%3Ak1",
            ),
            (
                "http://h/{principal}/{forwarded_key}",
                "bare-op",
                "k",
                "http://h//bare-op%3Ak",
            ),
        ];
        for (template, scope, key, want) in cases {
            let url = lookup(&spec(template)).unwrap().url_for(&id(scope, key));
            assert_eq!(url, want);
            assert!(url.parse::<Uri>().is_ok(), "{url}");
        }
    }

    proptest::proptest! {
        /// Whatever the key and the template's text around it, the URL
        /// parses, and the provider reads back exactly the forwarded
        /// reference: one path segment, or one query value.
        #[test]
        fn the_provider_reads_back_exactly_the_forwarded_reference(
            key in "[!-~]{1,64}",
            principal in "[a-z0-9]{1,32}",
            in_query in proptest::bool::ANY,
        ) {
            let template = if in_query {
                "http://h:9/by-ref?ref={forwarded_key}&x=1"
            } else {
                "http://h:9/by-ref/{forwarded_key}/x"
            };
            let record = RecordId {
                scope: Scope::new(format!("payouts|{principal}")).unwrap(),
                key: IdempotencyKey::new(key.clone()).unwrap(),
            };
            let url: Uri = lookup(&spec(template)).unwrap().url_for(&record).parse().unwrap();
            let encoded = if in_query {
                url.query().and_then(|q| q.strip_prefix("ref=")?.strip_suffix("&x=1"))
            } else {
                url.path().strip_prefix("/by-ref/").and_then(|p| p.strip_suffix("/x"))
            };
            let decoded = percent_encoding::percent_decode_str(encoded.unwrap_or_default())
                .decode_utf8()
                .unwrap();
            proptest::prop_assert_eq!(decoded, format!("payouts|{principal}:{key}"));
        }
    }

    #[test]
    fn debug_never_shows_header_values() {
        let declared = LookupSpec {
            headers: Some(vec![("authorization".into(), "Bearer s3cret".into())]),
            ..spec("http://h/{forwarded_key}")
        };
        let lookup = lookup(&declared).unwrap();
        for shown in [format!("{declared:?}"), format!("{lookup:?}")] {
            assert!(shown.contains("authorization"), "{shown}");
            assert!(!shown.contains("s3cret"), "{shown}");
        }
    }

    #[test]
    fn parses_the_documented_toml() {
        let declared: LookupSpec = toml::from_str(
            r#"
            method = "get"
            url = "http://127.0.0.1:9000/payouts/by-key/{forwarded_key}"
            found = [200, 201]
            not_found = [404, 410]
            headers = [["authorization", "Bearer x"]]
            timeout_ms = 2500
            "#,
        )
        .unwrap();
        let lookup = lookup(&declared).unwrap();
        assert_eq!(lookup.verdict(201), Verdict::Found);
        assert_eq!(lookup.verdict(410), Verdict::NotFound);
        assert_eq!(
            lookup.stored_status(200),
            200,
            "the lookup's own by default"
        );
        assert_eq!(lookup.headers().len(), 1);
        assert!(toml::from_str::<LookupSpec>("urll = \"x\"").is_err());
    }

    #[test]
    fn found_status_is_what_a_found_answer_is_stored_with() {
        let declared: LookupSpec = toml::from_str(
            r#"
            url = "http://h/{forwarded_key}"
            found = [200, 203]
            found_status = 201
            "#,
        )
        .unwrap();
        let lookup = lookup(&declared).unwrap();
        assert_eq!(lookup.stored_status(200), 201);
        assert_eq!(lookup.stored_status(203), 201);
    }
}
