//! Which requests are protected, and how: a [`Route`], validated once so
//! that the request path never meets an invalid setting. It is built in
//! code (`Route::builder`, in `builder`) or declared as plain data
//! ([`RouteSpec`], what a config file holds) and read into that builder.

use std::collections::BTreeMap;

use http::{HeaderName, Method};
use idem_core::{
    CompletionTable, JsonPointer, LeaseExpiry, Policy, RecordId, SCOPE_BYTES_MAX, Scope, to_hex,
};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::completion::CompletionSpec;
use crate::cors::CorsExpose;
use crate::pace::Latency;
use crate::path;
use crate::principal::{
    PRINCIPAL_DIGEST_BYTES, Principal, PrincipalKind, PrincipalSpec, TenantSearchError,
};
use crate::status::StatusUrl;

/// The default limit on a request body, in bytes (1 MiB).
pub const BODY_BYTES_MAX_DEFAULT: usize = 1024 * 1024;
/// The largest request body limit a route may declare, in bytes (64 MiB).
pub const BODY_BYTES_MAX_LIMIT: usize = 64 * 1024 * 1024;
/// The longest operation name, in bytes: what is left of a scope
/// (`operation|principal`) once the principal digest is in.
pub const OPERATION_NAME_BYTES_MAX: usize = SCOPE_BYTES_MAX - 1 - PRINCIPAL_DIGEST_BYTES;
/// The most literal text a forward-key template may add, in bytes.
pub const FORWARD_TEXT_BYTES_MAX: usize = 256;

/// A route as a config file declares it: every field optional, defaults
/// applied by [`Route::new`] (through [`crate::RouteBuilder::from_spec`]).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    /// The operation name used in the scope; defaults to `"METHODS path"`.
    pub name: Option<String>,
    /// Methods protected, e.g. `["POST"]`; default `["POST", "PATCH"]`.
    pub methods: Option<Vec<String>>,
    /// Path pattern: `/payouts`, `/payouts/{id}`, `/payouts/**`; default `/**`.
    pub path: Option<String>,
    /// Header carrying the key; default `Idempotency-Key`.
    pub key_header: Option<String>,
    /// Whether a request without a key is refused (400) or passed through
    /// unprotected; default true.
    pub key_required: Option<bool>,
    /// Where the principal (tenant) comes from: a trusted header, a claim of
    /// a verified JWT, or a digest of raw credential headers. Without it, a
    /// digest of `Authorization` — fragile: a refreshed token is a new scope.
    pub principal: Option<PrincipalSpec>,
    /// The older spelling of `principal = { credential_headers = [...] }`.
    pub principal_headers: Option<Vec<String>>,
    /// Request headers that are part of the fingerprint; default none.
    pub fingerprint_headers: Option<Vec<String>>,
    /// JSON pointers of body fields left out of the fingerprint.
    pub fingerprint_exclude: Option<Vec<String>>,
    /// JSON pointers of body fields kept in the note of why a record is
    /// ambiguous (`["/seller_id", "/amount"]`), at most
    /// [`idem_core::AMBIGUITY_SUMMARY_FIELDS_MAX`]; default none.
    pub summary_fields: Option<Vec<String>>,
    /// Request body limit in bytes; default 1 MiB.
    pub body_bytes_max: Option<usize>,
    /// Lease in milliseconds; default 30 000.
    pub lease_ms: Option<u64>,
    /// Retention of results in seconds; default 86 400.
    pub retention_s: Option<u64>,
    /// Tombstone horizon in seconds from completion; default 30 days.
    pub tombstone_s: Option<u64>,
    /// `reconcile` (default) or `takeover` (needs `upstream_dedups`).
    pub on_lease_expiry: Option<LeaseExpiry>,
    /// The upstream deduplicates by the forwarded key itself; default false.
    pub upstream_dedups: Option<bool>,
    /// Overrides of the completion table by status.
    pub completion: Option<CompletionSpec>,
    /// Response headers replayed besides content-type, location, content-location.
    pub replay_headers: Option<Vec<String>>,
    /// How the key is forwarded upstream.
    pub forward_key: Option<ForwardKeySpec>,
    /// The operation's contract file (`idem check` format), relative to the
    /// config file; `idem serve` refuses to start when it fails.
    pub contract: Option<String>,
    /// The route's region mode (`single`, `home-region`, `synchronous`);
    /// validated and enforced by the gateway, not by the layer.
    pub regions: Option<RegionsSpec>,
    /// How long a request whose key is held by another attempt waits for
    /// that attempt's outcome when it sends no `Prefer: wait`, in
    /// milliseconds; default 0 (answered 409 at once).
    pub wait_ms: Option<u64>,
    /// The most any request waits, `Prefer: wait=N` included, in
    /// milliseconds; at most the lease. Default: the lease less its margin
    /// in the layer, `response_timeout_ms` in `idem serve`.
    pub wait_ms_max: Option<u64>,
    /// Where a caller asks what became of its key: a template such as
    /// `"{path}/.idem/{key}"` (the default), or `"off"`.
    pub status_url: Option<String>,
    /// Whether responses name idem's headers in
    /// `Access-Control-Expose-Headers` for browser callers; default false.
    pub cors_expose: Option<bool>,
    /// The shape of idem's refusals on this route (`"rfc9457"`, the
    /// default, or `"stripe"`); see [`crate::ErrorDialect`].
    pub error_dialect: Option<String>,
}

/// A route's `regions = { … }`, as written; validated by the gateway, which
/// alone knows its own region and its peers. It is declared here, beside
/// [`RouteSpec`], because a `[[route]]` table is read in one piece with
/// unknown fields refused by name, line and column: a gateway-side type
/// would need serde's `flatten`, which cannot refuse unknown fields, or an
/// untyped value. The layer carries it and never reads it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RegionsSpec {
    /// `single` (default), `home-region` or `synchronous`.
    pub mode: Option<String>,
    /// Where a key's home region comes from (`home-region` only).
    pub home: Option<HomeSpec>,
    /// `forward` (default) or `problem`: what a key homed elsewhere gets.
    pub on_foreign: Option<String>,
}

/// `home = { from = "key_prefix", separator = ":" }`,
/// `home = { from = "header", header = "x-home-region" }` or
/// `home = { from = "principal", table = { acme = "eu" }, default = "eu" }`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HomeSpec {
    /// `key_prefix`, `header` or `principal`.
    pub from: Option<String>,
    /// `key_prefix`: the text ending the region name at the key's start.
    pub separator: Option<String>,
    /// `header`: the header a trusted layer sets to the key's home region.
    pub header: Option<String>,
    /// `principal`: principal value → region.
    pub table: Option<BTreeMap<String, String>>,
    /// `principal`: the region of a principal the table does not name.
    pub default: Option<String>,
}

/// How the key is passed on to the upstream, as declared.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ForwardKeySpec {
    /// Header name upstream; default: the route's key header.
    pub header: Option<String>,
    /// Value template with `{key}` and optionally `{scope_digest}`; default `{key}`.
    pub template: Option<String>,
}

/// The methods a route protects.
#[derive(Clone, Debug)]
pub(crate) enum Methods {
    /// Those named (by the config file, or the builder's `methods`).
    Listed(Vec<Method>),
    /// Every method but the safe ones: the default of a route attached to
    /// one handler (axum's `route_layer`). Its user put the layer on that
    /// handler to protect it, so a `PUT` or `DELETE` handler is protected
    /// without naming its method, where a default of POST and PATCH would
    /// let it through unprotected without a word.
    Unsafe,
}

/// The methods RFC 9110 defines as safe, which a route attached to one
/// handler leaves unprotected unless it names them.
const SAFE_METHODS: [&str; 4] = ["GET", "HEAD", "OPTIONS", "TRACE"];

/// A validated route.
#[derive(Clone, Debug)]
pub struct Route {
    pub(crate) operation: Operation,
    pub(crate) methods: Methods,
    pub(crate) pattern: PathPattern,
    pub(crate) key_header: HeaderName,
    pub(crate) key_required: bool,
    pub(crate) principal: Principal,
    pub(crate) fingerprint_headers: Vec<HeaderName>,
    pub(crate) fingerprint_exclude: Vec<JsonPointer>,
    pub(crate) summary_fields: Vec<JsonPointer>,
    pub(crate) body_bytes_max: usize,
    pub(crate) policy: Policy,
    pub(crate) upstream_dedups: bool,
    pub(crate) completion: CompletionTable,
    pub(crate) replay_headers: Vec<HeaderName>,
    pub(crate) forward_header: HeaderName,
    pub(crate) forward_template: KeyTemplate,
    pub(crate) contract: Option<std::path::PathBuf>,
    pub(crate) wait: RouteWait,
    pub(crate) status: StatusUrl,
    pub(crate) cors: CorsExpose,
    /// The running mean of this route's forward durations, for the
    /// `Retry-After` of an attempt in flight.
    pub(crate) latency: std::sync::Arc<Latency>,
    pub(crate) error_dialect: crate::ErrorDialect,
}

/// How long a request on the route may wait for the original attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteWait {
    /// The wait of a request that sends no `Prefer: wait`, in milliseconds.
    pub default_ms: u64,
    /// The most any request waits, in milliseconds.
    pub max_ms: u64,
}

impl RouteWait {
    /// The wait a request with `preferred` (from `Prefer: wait`) gets.
    pub fn applied_ms(&self, preferred: Option<u64>) -> u64 {
        preferred.unwrap_or(self.default_ms).min(self.max_ms)
    }
}

/// What names the operation in the scope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Operation {
    /// A fixed name for every request the route matches.
    Named(String),
    /// `METHOD path` of each request: the zero-config catch-all route, so
    /// that one key on two different endpoints is two intents.
    MethodAndPath,
    /// `METHOD pattern` of the route the router matched (axum's
    /// `MatchedPath`, with the `axum` feature), else `METHOD path`: a route
    /// built without a path, attached to one route of the router.
    MethodAndMatchedPath,
}

/// A path pattern: literal segments, `{name}` for one segment, a final `**`
/// for any rest (including nothing). It matches leniently, as the most
/// lenient upstream reads a path: literals compare with decoded segments,
/// ASCII case-insensitively, matrix parameters (`;…`) ignored, and a
/// trailing `/` is ignored; protecting a spelling too many costs a key,
/// protecting one too few costs a duplicate effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    segments: Vec<Segment>,
    rest: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param,
}

/// Whether the reference a route forwards tells its scopes apart: what a
/// lookup by that reference can rely on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForwardedScope {
    /// The template holds `{scope_digest}`: two principals' records with
    /// the same key are forwarded as two references.
    PerScope,
    /// The template holds no `{scope_digest}`: every principal's record with
    /// the same key is forwarded as the same reference.
    SharedAcrossScopes,
}

/// A key template: literal text around `{key}` and `{scope_digest}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyTemplate(Vec<TemplatePart>);

#[derive(Clone, Debug, PartialEq, Eq)]
enum TemplatePart {
    Text(String),
    Key,
    ScopeDigest,
}

impl Route {
    /// True when this route protects `method` on `path`. The method is
    /// compared ASCII case-insensitively: Django, Flask and other lenient
    /// upstreams upper-case it before routing, and `fetch()` sends
    /// `patch` as written, so `patch /payouts/1` reaches the same handler
    /// as `PATCH /payouts/1` and must be protected the same way.
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        self.protects_method(method) && self.pattern.matches(path)
    }

    /// True when `method`, in any ASCII case, is one this route protects.
    pub fn protects_method(&self, method: &Method) -> bool {
        match &self.methods {
            Methods::Listed(listed) => listed
                .iter()
                .any(|m| m.as_str().eq_ignore_ascii_case(method.as_str())),
            Methods::Unsafe => !SAFE_METHODS
                .iter()
                .any(|m| m.eq_ignore_ascii_case(method.as_str())),
        }
    }

    /// The operation name every record of this route carries in its scope,
    /// or `None` for the catch-all route, whose scopes name each request's
    /// method and path.
    pub fn operation_name(&self) -> Option<&str> {
        match &self.operation {
            Operation::Named(name) => Some(name),
            Operation::MethodAndPath | Operation::MethodAndMatchedPath => None,
        }
    }

    /// The contract file the route names, as written (relative paths are
    /// relative to the config file).
    pub fn contract(&self) -> Option<&std::path::Path> {
        self.contract.as_deref()
    }

    /// The route's policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The methods the route lists. Empty for a route attached to one
    /// handler without [`RouteBuilder::methods`](crate::RouteBuilder::methods),
    /// which protects every method but the safe ones (`GET`, `HEAD`,
    /// `OPTIONS`, `TRACE`): see [`Route::protects_method`].
    pub fn methods(&self) -> &[Method] {
        match &self.methods {
            Methods::Listed(listed) => listed,
            Methods::Unsafe => &[],
        }
    }

    /// The path pattern.
    pub fn pattern(&self) -> &PathPattern {
        &self.pattern
    }

    /// The header the route reads its key from.
    pub fn key_header(&self) -> &HeaderName {
        &self.key_header
    }

    /// How long a request may wait for the original attempt.
    pub fn wait(&self) -> RouteWait {
        self.wait
    }

    /// Where a caller asks what became of its key.
    pub fn status_url(&self) -> &StatusUrl {
        &self.status
    }

    /// Whether responses expose idem's headers to browser callers.
    pub fn cors_expose(&self) -> CorsExpose {
        self.cors
    }

    /// The largest body the route reads, in bytes (413 above it).
    pub fn body_bytes_max(&self) -> usize {
        self.body_bytes_max
    }

    /// True when the upstream deduplicates by the forwarded key.
    pub fn upstream_dedups(&self) -> bool {
        self.upstream_dedups
    }

    /// The request headers the contract reads or sets on this route: the
    /// key header, the forwarded key header, the principal's and the
    /// fingerprint headers. A proxy must never drop them as hop-by-hop.
    pub fn contract_headers(&self) -> impl Iterator<Item = &HeaderName> {
        [&self.key_header, &self.forward_header]
            .into_iter()
            .chain(self.principal.headers())
            .chain(&self.fingerprint_headers)
    }

    /// Where the route's principal comes from.
    pub fn principal_kind(&self) -> PrincipalKind {
        self.principal.kind()
    }

    /// The reference the upstream receives for `id` (the value of the
    /// forwarded key header): what the provider knows the effect by, and so
    /// what a lookup must ask for.
    pub fn forwarded_key(&self, id: &RecordId) -> String {
        self.forward_template
            .render(id.key.as_str(), &scope_digest(&id.scope))
    }

    /// Whether [`Route::forwarded_key`] differs between two scopes with the
    /// same key.
    pub fn forwarded_scope(&self) -> ForwardedScope {
        if self.forward_template.0.contains(&TemplatePart::ScopeDigest) {
            ForwardedScope::PerScope
        } else {
            ForwardedScope::SharedAcrossScopes
        }
    }
}

impl PathPattern {
    /// Parses a pattern; it must start with `/`.
    pub fn parse(text: &str) -> Result<PathPattern, String> {
        let Some(body) = text.strip_prefix('/') else {
            return Err(format!("{text:?} must start with '/'"));
        };
        let mut segments = Vec::new();
        let mut rest = false;
        let parts: Vec<&str> = if body.is_empty() {
            vec![]
        } else {
            body.split('/').collect()
        };
        for (i, part) in parts.iter().enumerate() {
            match *part {
                "**" if i + 1 == parts.len() => rest = true,
                "**" => return Err(format!("{text:?}: '**' may only be the last segment")),
                p if p.starts_with('{') && p.ends_with('}') && p.len() > 2 => {
                    segments.push(Segment::Param)
                }
                p if p.contains(['{', '}', '*']) => {
                    return Err(format!(
                        "{text:?}: segment {p:?} is neither literal, {{name}} nor **"
                    ));
                }
                p => segments.push(Segment::Literal(path::lenient(p))),
            }
        }
        Ok(PathPattern {
            text: text.to_owned(),
            segments,
            rest,
        })
    }

    /// True when `path` (without query, in the form of
    /// [`crate::normalize_path`]) matches.
    pub fn matches(&self, path: &str) -> bool {
        let Some(parts) = path::lenient_segments(path) else {
            return false;
        };
        if parts.len() < self.segments.len() || (!self.rest && parts.len() != self.segments.len()) {
            return false;
        }
        self.segments
            .iter()
            .zip(&parts)
            .all(|(seg, (raw, lenient))| match seg {
                Segment::Literal(lit) => lit == lenient,
                Segment::Param => !raw.is_empty(),
            })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub(crate) fn is_catch_all(&self) -> bool {
        self.segments.is_empty() && self.rest
    }
}

impl KeyTemplate {
    pub(crate) fn parse(text: &str) -> Result<KeyTemplate, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(TemplatePart::Text(rest[..open].to_owned()));
            }
            let Some(close) = rest[open..].find('}') else {
                return Err(format!("{text:?}: unclosed '{{'"));
            };
            match &rest[open + 1..open + close] {
                "key" => parts.push(TemplatePart::Key),
                "scope_digest" => parts.push(TemplatePart::ScopeDigest),
                other => {
                    return Err(format!(
                        "{text:?}: unknown placeholder {{{other}}}; use {{key}} or {{scope_digest}}"
                    ));
                }
            }
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            parts.push(TemplatePart::Text(rest.to_owned()));
        }
        if !parts.contains(&TemplatePart::Key) {
            return Err(format!("{text:?} must contain {{key}}"));
        }
        check_forward_text(text, &parts)?;
        Ok(KeyTemplate(parts))
    }

    fn render(&self, key: &str, scope_digest: &str) -> String {
        self.0
            .iter()
            .map(|p| match p {
                TemplatePart::Text(t) => t.as_str(),
                TemplatePart::Key => key,
                TemplatePart::ScopeDigest => scope_digest,
            })
            .collect()
    }
}

/// A short digest of the scope, for key templates that prefix it.
pub(crate) fn scope_digest(scope: &Scope) -> String {
    to_hex(&Sha256::digest(scope.as_str().as_bytes())[..8])
}

/// An operation name that forms a scope with any principal: checked by
/// forming one with the longest principal, so that what is accepted here
/// is what the store accepts.
pub(crate) fn operation_name(name: &str) -> Result<String, String> {
    if name.trim().is_empty() {
        return Err(format!("{name:?} is blank"));
    }
    if name.len() > OPERATION_NAME_BYTES_MAX {
        return Err(format!(
            "is {} bytes; at most {OPERATION_NAME_BYTES_MAX}",
            name.len()
        ));
    }
    Scope::from_parts(name, &"0".repeat(PRINCIPAL_DIGEST_BYTES), None)
        .map(|_| name.to_owned())
        .map_err(|e| match e {
            idem_core::ScopeError::SeparatorInPart { .. } => {
                format!("{name:?} must not contain '|'")
            }
            other => format!("{name:?} cannot name a scope: {other}"),
        })
}

/// The template's own text goes into a header value next to the key: it
/// must be visible ASCII (spaces only inside), so the rendered value is
/// always a header value the upstream reads as written.
fn check_forward_text(text: &str, parts: &[TemplatePart]) -> Result<(), String> {
    let literal: usize = parts
        .iter()
        .map(|p| match p {
            TemplatePart::Text(t) => t.len(),
            _ => 0,
        })
        .sum();
    if literal > FORWARD_TEXT_BYTES_MAX {
        return Err(format!(
            "{text:?} adds {literal} bytes of text; at most {FORWARD_TEXT_BYTES_MAX}"
        ));
    }
    if let Some(c) = text.chars().find(|c| !(c.is_ascii_graphic() || *c == ' ')) {
        return Err(format!(
            "{text:?} holds {c:?}: a forwarded key is visible ASCII"
        ));
    }
    if text.starts_with(' ') || text.ends_with(' ') {
        return Err(format!(
            "{text:?} starts or ends with a space, which a header value loses"
        ));
    }
    Ok(())
}

impl Route {
    /// The principal digests the records of the tenant an operator knows as
    /// `value` carry on this route: the digest of that header value, JWT
    /// claim (as a string, and as a number when it is an integer) or
    /// service-named principal, computed exactly as a request's is. A
    /// route scoped by raw credentials has no such value
    /// ([`TenantSearchError::CredentialDigest`]).
    pub fn tenant_digests(&self, value: &str) -> Result<Vec<String>, TenantSearchError> {
        self.principal.tenant_digests(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_patterns_match() {
        let cases = [
            ("/**", "/", true),
            ("/**", "/a/b", true),
            ("/payouts", "/payouts", true),
            ("/payouts", "/payouts/1", false),
            ("/payouts/{id}", "/payouts/1", true),
            ("/payouts/{id}", "/payouts/", false),
            ("/payouts/{id}", "/payouts", false),
            ("/payouts/**", "/payouts", true),
            ("/payouts/**", "/payouts/1/x", true),
            ("/payouts/**", "/refunds/1", false),
            ("/", "/", true),
            ("/", "/a", false),
            ("/payouts/{id}", "/payouts/1/", true),
            ("/payouts/{id}", "/payouts/;x", true),
            ("/payouts", "/payouts/", true),
            ("/payouts", "/Payouts", true),
            ("/payouts", "/PAYOUTS;jsessionid=1", true),
            ("/payouts", "/payouts%3Bx", true),
            ("/payouts/**", "/pay%6Futs/x", true),
            ("/Payouts/**", "/payouts/x", true),
            ("/payouts", "/payoutsx", false),
            ("/payouts", "//payouts", false),
        ];
        for (pattern, path, expect) in cases {
            let p = PathPattern::parse(pattern).unwrap();
            assert_eq!(p.matches(path), expect, "{pattern} ~ {path}");
        }
        for bad in ["payouts", "/a/**/b", "/a*", "/{}"] {
            assert!(PathPattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn route_fields_are_validated_by_name() {
        let cases: Vec<(RouteSpec, &str)> = vec![
            (
                RouteSpec {
                    methods: Some(vec!["P OST".into()]),
                    ..Default::default()
                },
                "methods",
            ),
            (
                RouteSpec {
                    methods: Some(vec![]),
                    ..Default::default()
                },
                "methods",
            ),
            (
                RouteSpec {
                    path: Some("x".into()),
                    ..Default::default()
                },
                "path",
            ),
            (
                RouteSpec {
                    key_header: Some("bad header".into()),
                    ..Default::default()
                },
                "key_header",
            ),
            (
                RouteSpec {
                    lease_ms: Some(5),
                    ..Default::default()
                },
                "lease_ms",
            ),
            (
                RouteSpec {
                    retention_s: Some(0),
                    ..Default::default()
                },
                "retention_s",
            ),
            (
                RouteSpec {
                    retention_s: Some(100),
                    tombstone_s: Some(10),
                    ..Default::default()
                },
                "tombstone_s",
            ),
            (
                RouteSpec {
                    body_bytes_max: Some(0),
                    ..Default::default()
                },
                "body_bytes_max",
            ),
            (
                RouteSpec {
                    fingerprint_exclude: Some(vec!["nope".into()]),
                    ..Default::default()
                },
                "fingerprint_exclude",
            ),
            (
                RouteSpec {
                    summary_fields: Some(vec!["seller_id".into()]),
                    ..Default::default()
                },
                "summary_fields",
            ),
            (
                RouteSpec {
                    summary_fields: Some(
                        (0..=idem_core::AMBIGUITY_SUMMARY_FIELDS_MAX)
                            .map(|i| format!("/f{i}"))
                            .collect(),
                    ),
                    ..Default::default()
                },
                "summary_fields",
            ),
            (
                RouteSpec {
                    on_lease_expiry: Some(LeaseExpiry::Takeover),
                    ..Default::default()
                },
                "on_lease_expiry",
            ),
            (
                RouteSpec {
                    forward_key: Some(ForwardKeySpec {
                        header: None,
                        template: Some("{scope_digest}".into()),
                    }),
                    ..Default::default()
                },
                "forward_key.template",
            ),
            (
                RouteSpec {
                    name: Some("a|b".into()),
                    ..Default::default()
                },
                "name",
            ),
            (
                RouteSpec {
                    name: Some("pay\u{7}outs".into()),
                    ..Default::default()
                },
                "name",
            ),
            (
                RouteSpec {
                    name: Some("n".repeat(OPERATION_NAME_BYTES_MAX + 1)),
                    ..Default::default()
                },
                "name",
            ),
            (
                RouteSpec {
                    methods: Some(vec!["A|B".into()]),
                    path: Some("/payouts".into()),
                    ..Default::default()
                },
                "name",
            ),
            (
                RouteSpec {
                    forward_key: Some(ForwardKeySpec {
                        header: None,
                        template: Some("{key}\r\nx: y".into()),
                    }),
                    ..Default::default()
                },
                "forward_key.template",
            ),
            (
                RouteSpec {
                    fingerprint_headers: Some(vec!["x-amount".into(), "TraceParent".into()]),
                    ..Default::default()
                },
                "fingerprint_headers",
            ),
            (
                RouteSpec {
                    fingerprint_headers: Some(vec!["tracestate".into()]),
                    ..Default::default()
                },
                "fingerprint_headers",
            ),
        ];
        for (spec, field) in cases {
            assert_eq!(
                Route::new(&spec).map(|_| ()).map_err(|e| e.field),
                Err(field),
                "{spec:?}"
            );
        }
    }

    proptest::proptest! {
        /// Any ASCII case of a protected method is protected (lenient
        /// upstreams upper-case it before routing); no spelling of another
        /// method is.
        #[test]
        fn every_case_of_a_protected_method_is_protected(
            name in proptest::sample::select(vec!["POST", "PATCH", "PUT", "DELETE", "GET", "PURGE"]),
            cases in proptest::collection::vec(proptest::bool::ANY, 6),
        ) {
            let spelled: String = name
                .chars()
                .zip(cases.iter().cycle())
                .map(|(c, &lower)| if lower { c.to_ascii_lowercase() } else { c })
                .collect();
            let method = Method::from_bytes(spelled.as_bytes()).unwrap();
            let spec = RouteSpec {
                methods: Some(vec!["post".into(), "Patch".into(), "PURGE".into()]),
                ..Default::default()
            };
            let route = Route::new(&spec).unwrap();
            let protected = matches!(name, "POST" | "PATCH" | "PURGE");
            proptest::prop_assert_eq!(route.matches(&method, "/payouts/1"), protected, "{}", spelled);
            proptest::prop_assert_eq!(
                Route::default_catch_all().matches(&method, "/x"),
                matches!(name, "POST" | "PATCH"),
                "{}", spelled
            );
        }
    }

    #[test]
    fn defaults_protect_post_and_patch_everywhere() {
        let route = Route::default_catch_all();
        assert!(route.matches(&Method::POST, "/payouts/1"));
        assert!(route.matches(&Method::PATCH, "/"));
        assert!(!route.matches(&Method::GET, "/payouts/1"));
        assert_eq!(route.operation, Operation::MethodAndPath);
        assert_eq!(route.policy, Policy::DEFAULT);
        let long_retention = RouteSpec {
            retention_s: Some(90 * 86_400),
            ..Default::default()
        };
        assert_eq!(
            Route::new(&long_retention).unwrap().policy.tombstone_s(),
            90 * 86_400
        );
    }

    #[test]
    fn key_templates_render() {
        let t = KeyTemplate::parse("{scope_digest}:{key}").unwrap();
        assert_eq!(t.render("k1", "abcd"), "abcd:k1");
        assert_eq!(KeyTemplate::parse("{key}").unwrap().render("k", "d"), "k");
        assert!(KeyTemplate::parse("{nope}").is_err());
        assert!(KeyTemplate::parse("{key").is_err());
    }

    #[test]
    fn the_forwarded_key_tells_scopes_apart_only_with_the_scope_digest() {
        let id = |principal: &str| RecordId {
            scope: Scope::from_parts("payouts", principal, None).unwrap(),
            key: idem_core::IdempotencyKey::parse("k").unwrap(),
        };
        let (a, b) = (id("tenant-a"), id("tenant-b"));
        let cases = [
            (None, ForwardedScope::SharedAcrossScopes),
            (Some("{key}"), ForwardedScope::SharedAcrossScopes),
            (Some("pay-{key}-x"), ForwardedScope::SharedAcrossScopes),
            (Some("{scope_digest}:{key}"), ForwardedScope::PerScope),
            (Some("{key}.{scope_digest}"), ForwardedScope::PerScope),
        ];
        for (template, want) in cases {
            let route = Route::new(&RouteSpec {
                forward_key: Some(ForwardKeySpec {
                    header: None,
                    template: template.map(str::to_owned),
                }),
                ..Default::default()
            })
            .unwrap();
            assert_eq!(route.forwarded_scope(), want, "{template:?}");
            let (fa, fb) = (route.forwarded_key(&a), route.forwarded_key(&b));
            assert_eq!(
                fa == fb,
                want == ForwardedScope::SharedAcrossScopes,
                "{template:?}"
            );
            assert!(fa.contains('k'), "{fa}");
            assert_eq!(
                fa,
                route.forwarded_key(&a),
                "the same record, the same reference"
            );
        }
    }
}
