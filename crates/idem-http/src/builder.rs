//! A route built in the service's own types — [`Method`], [`Duration`],
//! [`HeaderName`], byte sizes, closures — the way tower-http's layers are
//! configured: [`Route::builder`]. A config file's [`RouteSpec`] is read
//! into the same builder ([`RouteBuilder::from_spec`]), so every route is
//! validated by one `build`, whichever way it was declared.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderName, Method, StatusCode};
use idem_core::{Completion, CompletionTable, Dedup, JsonPointer, LeaseExpiry, Policy};

use crate::principal::{JwtSpec, Principal, PrincipalSource, PrincipalSpec};
use crate::route::{
    BODY_BYTES_MAX_DEFAULT, BODY_BYTES_MAX_LIMIT, KeyTemplate, Operation, PathPattern, Route,
    RouteSpec, RouteWait,
};
use crate::setting::RouteError;
use crate::wait::WAIT_MS_LIMIT;

/// What the layer does with a request on a protected route that carries no
/// key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answered 400 `missing-key`, nothing claimed or called (the default).
    #[default]
    Refuse,
    /// Passed to the inner service unprotected.
    PassThrough,
}

/// A route under construction; [`RouteBuilder::build`] validates it into a
/// [`Route`]. Every setting has the default the config file has.
///
/// ```
/// use std::time::Duration;
/// use http::{Method, StatusCode};
/// use idem_http::{Completion, Route};
///
/// #[derive(Clone)]
/// struct User { tenant: String }
///
/// let payouts = Route::builder()
///     .name("payouts")
///     .methods([Method::POST])
///     .lease(Duration::from_secs(10))
///     .retention(Duration::from_secs(24 * 3600))
///     .body_bytes_max(64 * 1024)
///     .fingerprint_exclude(["/request_time"])
///     .completion(StatusCode::CONFLICT, Completion::Final)
///     .principal_from_extension(|user: &User| user.tenant.clone())
///     .build()?;
/// assert_eq!(payouts.operation_name(), Some("payouts"));
/// # Ok::<(), idem_http::RouteError>(())
/// ```
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct RouteBuilder {
    name: Option<String>,
    methods: Option<Vec<Method>>,
    path: Option<String>,
    key_header: Option<HeaderName>,
    missing_key: MissingKey,
    principal: Option<Principal>,
    fingerprint_headers: Vec<HeaderName>,
    fingerprint_exclude: Vec<String>,
    body_bytes_max: Option<usize>,
    lease: Option<Duration>,
    retention: Option<Duration>,
    tombstone: Option<Duration>,
    on_lease_expiry: Option<LeaseExpiry>,
    dedup: Option<Dedup>,
    completion: Vec<(u16, Completion)>,
    replay_headers: Vec<HeaderName>,
    forward_header: Option<HeaderName>,
    forward_template: Option<String>,
    contract: Option<PathBuf>,
    wait: Option<Duration>,
    wait_max: Option<Duration>,
    /// The first setting refused, reported by `build`.
    error: Option<RouteError>,
}

impl Route {
    /// Validates a route a config file declares, applying defaults: the
    /// same route [`RouteBuilder`] builds from the same settings.
    pub fn new(spec: &RouteSpec) -> Result<Route, RouteError> {
        RouteBuilder::from_spec(spec)?.build()
    }

    /// The zero-config route: POST and PATCH on every path, key required.
    pub fn default_catch_all() -> Route {
        // The defaults are constants that validate; a failure here is a bug
        // caught by the unit tests.
        Route::builder()
            .build()
            .unwrap_or_else(|e| unreachable!("default route: {e}"))
    }

    /// A route built in code (see [`RouteBuilder`]). Without
    /// [`RouteBuilder::path`] it protects whatever it wraps: the shape for
    /// axum's `route_layer`, where the router has already matched the path.
    pub fn builder() -> RouteBuilder {
        RouteBuilder::default()
    }
}

impl RouteBuilder {
    /// The operation name in every record's scope, and what a reconciler's
    /// provider is registered under. Default: `"METHODS path"` for a route
    /// with a path; for one without, each request's method and path (with
    /// the `axum` feature, the path pattern axum matched).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The methods protected; default POST and PATCH. Any other method
    /// passes through unprotected.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = Some(methods.into_iter().collect());
        self
    }

    /// The path pattern protected: `/payouts`, `/payouts/{id}`,
    /// `/payouts/**`. Default: every path, for a layer attached to one
    /// route; a layer over several routes names each route's path.
    pub fn path(mut self, pattern: impl Into<String>) -> Self {
        self.path = Some(pattern.into());
        self
    }

    /// The header carrying the key; default `Idempotency-Key`.
    pub fn key_header(mut self, name: HeaderName) -> Self {
        self.key_header = Some(name);
        self
    }

    /// What a request without a key gets; default [`MissingKey::Refuse`].
    pub fn missing_key(mut self, missing: MissingKey) -> Self {
        self.missing_key = missing;
        self
    }

    /// The principal is the value of `name`, a header the authentication
    /// in front sets and overwrites; a request without it is refused.
    /// `Authorization` and `Cookie` are refused: a raw credential names no
    /// stable tenant.
    pub fn principal_header(self, name: HeaderName) -> Self {
        let principal =
            Principal::new(Some(&PrincipalSpec::Header(name.as_str().to_owned())), None);
        self.set_principal(principal)
    }

    /// The principal is a claim of a bearer JWT the layer verifies (the
    /// `jwt` feature; without it `build` refuses the route).
    pub fn principal_jwt(self, spec: JwtSpec) -> Self {
        let principal = Principal::new(Some(&PrincipalSpec::Jwt(spec)), None);
        self.set_principal(principal)
    }

    /// The principal is a digest of these headers' raw values: a refreshed
    /// credential is a new principal (the fragile, compatible choice).
    pub fn principal_credential_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        let names: Vec<String> = names.into_iter().map(|n| n.as_str().to_owned()).collect();
        let principal = Principal::new(Some(&PrincipalSpec::CredentialHeaders(names)), None);
        self.set_principal(principal)
    }

    /// The principal is read from the request extension `T` that the
    /// service's authentication middleware inserted (put the layer inside
    /// that middleware). A request without the extension is refused with
    /// `invalid-principal` before anything is claimed.
    pub fn principal_from_extension<T>(
        self,
        principal: impl Fn(&T) -> String + Send + Sync + 'static,
    ) -> Self
    where
        T: Clone + Send + Sync + 'static,
    {
        let from = format!("the request extension {}", std::any::type_name::<T>());
        let read = move |parts: &Parts| parts.extensions.get::<T>().map(&principal);
        self.principal_fn_from(from, read)
    }

    /// The principal is what `principal` reads from the request; `None` is
    /// refused with `invalid-principal` before anything is claimed.
    pub fn principal_fn(
        self,
        principal: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.principal_fn_from("the route's principal function".to_owned(), principal)
    }

    /// Request headers that are part of the fingerprint; default none.
    pub fn fingerprint_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.fingerprint_headers = names.into_iter().collect();
        self
    }

    /// JSON pointers (RFC 6901) of body fields left out of the
    /// fingerprint, e.g. `/request_time`.
    pub fn fingerprint_exclude<P: Into<String>>(
        mut self,
        pointers: impl IntoIterator<Item = P>,
    ) -> Self {
        self.fingerprint_exclude = pointers.into_iter().map(Into::into).collect();
        self
    }

    /// The largest request body read, in bytes (413 above it, before any
    /// claim); default 1 MiB, at most [`BODY_BYTES_MAX_LIMIT`].
    pub fn body_bytes_max(mut self, bytes: usize) -> Self {
        self.body_bytes_max = Some(bytes);
        self
    }

    /// How long an attempt holds its key (rounded up to a millisecond);
    /// default 30 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// How long a result is replayed (rounded up to a second); default 24 h.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// How long after completion a key stays refused once its result is
    /// purged (rounded up to a second); default 30 days, at least the
    /// retention.
    pub fn tombstone(mut self, tombstone: Duration) -> Self {
        self.tombstone = Some(tombstone);
        self
    }

    /// What a retry meeting an expired lease gets; default
    /// [`LeaseExpiry::Reconcile`]. `Takeover` needs [`Dedup::Upstream`].
    pub fn on_lease_expiry(mut self, on_expiry: LeaseExpiry) -> Self {
        self.on_lease_expiry = Some(on_expiry);
        self
    }

    /// Who deduplicates by the key: the layer alone ([`Dedup::Idem`], the
    /// default) or the upstream too ([`Dedup::Upstream`]).
    pub fn dedup(mut self, dedup: Dedup) -> Self {
        self.dedup = Some(dedup);
        self
    }

    /// Overrides the completion table for `status`: stored and replayed
    /// ([`Completion::Final`]), releasing the key, or an unknown outcome.
    pub fn completion(mut self, status: StatusCode, completion: Completion) -> Self {
        self.completion.push((status.as_u16(), completion));
        self
    }

    /// Response headers replayed besides content-type, location and
    /// content-location.
    pub fn replay_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.replay_headers = names.into_iter().collect();
        self
    }

    /// The header the key is forwarded in; default the key header.
    pub fn forward_key_header(mut self, name: HeaderName) -> Self {
        self.forward_header = Some(name);
        self
    }

    /// The forwarded key's template with `{key}` and optionally
    /// `{scope_digest}`; default `{key}`.
    pub fn forward_key_template(mut self, template: impl Into<String>) -> Self {
        self.forward_template = Some(template.into());
        self
    }

    /// How long a request whose key another attempt holds waits for its
    /// outcome when it sends no `Prefer: wait`; default 0 (409 at once).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// The most any request waits, `Prefer: wait` included; at most the
    /// lease. Default: the lease less its margin.
    pub fn wait_max(mut self, wait_max: Duration) -> Self {
        self.wait_max = Some(wait_max);
        self
    }

    /// The operation's contract file (`idem check` format).
    pub fn contract(mut self, file: impl Into<PathBuf>) -> Self {
        self.contract = Some(file.into());
        self
    }

    /// Validates the route, applying the defaults.
    pub fn build(self) -> Result<Route, RouteError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        let dedup = self.dedup.unwrap_or(Dedup::Idem);
        let methods = match self.methods {
            None => vec![Method::POST, Method::PATCH],
            Some(m) if m.is_empty() => {
                return Err(err("methods", "must name at least one method".into()));
            }
            Some(m) => m,
        };
        let pattern = PathPattern::parse(self.path.as_deref().unwrap_or("/**"))
            .map_err(|reason| err("path", reason))?;
        let operation = operation(self.name.as_deref(), &methods, &pattern)?;
        let key_header = self
            .key_header
            .unwrap_or(HeaderName::from_static("idempotency-key"));
        let policy = policy(
            self.lease,
            self.retention,
            self.tombstone,
            self.on_lease_expiry,
        )?;
        if policy.on_lease_expiry() == LeaseExpiry::Takeover && dedup != Dedup::Upstream {
            return Err(err(
                "on_lease_expiry",
                "\"takeover\" re-executes an attempt whose outcome is unknown; it is only \
                 allowed with upstream_dedups = true"
                    .into(),
            ));
        }
        let wait = route_wait(self.wait, self.wait_max, &policy)?;
        let forward_template =
            KeyTemplate::parse(self.forward_template.as_deref().unwrap_or("{key}"))
                .map_err(|reason| err("forward_key.template", reason))?;
        let principal = match self.principal {
            Some(p) => p,
            None => Principal::new(None, None)?,
        };
        Ok(Route {
            wait,
            operation,
            methods,
            pattern,
            forward_header: self.forward_header.unwrap_or_else(|| key_header.clone()),
            forward_template,
            key_header,
            key_required: self.missing_key == MissingKey::Refuse,
            principal,
            fingerprint_headers: fingerprint_headers(self.fingerprint_headers)?,
            fingerprint_exclude: self
                .fingerprint_exclude
                .iter()
                .map(|p| {
                    JsonPointer::parse(p).map_err(|e| err("fingerprint_exclude", e.to_string()))
                })
                .collect::<Result<_, _>>()?,
            body_bytes_max: body_limit(self.body_bytes_max)?,
            policy,
            upstream_dedups: dedup == Dedup::Upstream,
            completion: CompletionTable::new(self.completion, dedup)
                .map_err(|e| err("completion", e.to_string()))?,
            replay_headers: self.replay_headers,
            contract: match self.contract {
                Some(file) if file.as_os_str().is_empty() => {
                    return Err(err("contract", "names no file".into()));
                }
                other => other,
            },
        })
    }

    /// The builder a config file's route declares: the same settings,
    /// each parsed from its text and named by its field when refused.
    pub fn from_spec(spec: &RouteSpec) -> Result<RouteBuilder, RouteError> {
        let forward = spec.forward_key.clone().unwrap_or_default();
        Ok(RouteBuilder {
            name: spec.name.clone(),
            methods: spec.methods.as_deref().map(parse_methods).transpose()?,
            path: spec.path.clone(),
            key_header: spec
                .key_header
                .as_deref()
                .map(|h| header_name("key_header", h))
                .transpose()?,
            missing_key: match spec.key_required {
                Some(false) => MissingKey::PassThrough,
                Some(true) | None => MissingKey::Refuse,
            },
            principal: Some(Principal::new(
                spec.principal.as_ref(),
                spec.principal_headers.as_deref(),
            )?),
            fingerprint_headers: header_names(
                "fingerprint_headers",
                spec.fingerprint_headers.as_deref().unwrap_or(&[]),
            )?,
            fingerprint_exclude: spec.fingerprint_exclude.clone().unwrap_or_default(),
            body_bytes_max: spec.body_bytes_max,
            lease: spec.lease_ms.map(Duration::from_millis),
            retention: spec.retention_s.map(Duration::from_secs),
            tombstone: spec.tombstone_s.map(Duration::from_secs),
            on_lease_expiry: spec.on_lease_expiry,
            dedup: spec.upstream_dedups.map(|upstream| match upstream {
                true => Dedup::Upstream,
                false => Dedup::Idem,
            }),
            completion: spec
                .completion
                .as_ref()
                .map(|c| c.overrides())
                .unwrap_or_default(),
            replay_headers: header_names(
                "replay_headers",
                spec.replay_headers.as_deref().unwrap_or(&[]),
            )?,
            forward_header: forward
                .header
                .as_deref()
                .map(|h| header_name("forward_key.header", h))
                .transpose()?,
            forward_template: forward.template,
            contract: spec.contract.as_deref().map(PathBuf::from),
            wait: spec.wait_ms.map(Duration::from_millis),
            wait_max: spec.wait_ms_max.map(Duration::from_millis),
            error: None,
        })
    }

    fn principal_fn_from(
        self,
        from: String,
        read: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        let source = PrincipalSource {
            from: from.into(),
            read: Arc::new(read),
        };
        self.set_principal(Ok(Principal::Application(source)))
    }

    /// Keeps the principal, or the first refusal for `build` to report.
    fn set_principal(mut self, principal: Result<Principal, RouteError>) -> Self {
        match principal {
            Ok(p) => self.principal = Some(p),
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
        self
    }
}

fn err(field: &'static str, reason: String) -> RouteError {
    RouteError { field, reason }
}

/// A duration in whole milliseconds, rounded up (a lease is never shorter
/// than asked).
fn ceil_ms(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// A duration in whole seconds, rounded up.
fn ceil_s(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// The scope's operation: the name given, the catch-all's per-request
/// method and path, or `"METHODS path"` of a route with a path.
fn operation(
    name: Option<&str>,
    methods: &[Method],
    pattern: &PathPattern,
) -> Result<Operation, RouteError> {
    match name {
        Some(name) => Ok(Operation::Named(
            crate::route::operation_name(name).map_err(|r| err("name", r))?,
        )),
        None if pattern.is_catch_all() => Ok(Operation::MethodAndPath),
        None => {
            let list: Vec<&str> = methods.iter().map(Method::as_str).collect();
            let derived = format!("{} {}", list.join(","), pattern.as_str());
            let reason = |r| format!("{r} (derived from methods and path; set name)");
            Ok(Operation::Named(
                crate::route::operation_name(&derived).map_err(|r| err("name", reason(r)))?,
            ))
        }
    }
}

fn policy(
    lease: Option<Duration>,
    retention: Option<Duration>,
    tombstone: Option<Duration>,
    on_lease_expiry: Option<LeaseExpiry>,
) -> Result<Policy, RouteError> {
    let d = Policy::DEFAULT;
    let retention_s = retention.map(ceil_s);
    Policy::new(
        lease.map(ceil_ms).unwrap_or(d.lease_ms()),
        retention_s.unwrap_or(d.retention_s()),
        tombstone
            .map(ceil_s)
            .unwrap_or(d.tombstone_s().max(retention_s.unwrap_or(0))),
        on_lease_expiry.unwrap_or(d.on_lease_expiry()),
    )
    .map_err(|e| err(e.field(), e.to_string()))
}

fn route_wait(
    wait: Option<Duration>,
    wait_max: Option<Duration>,
    policy: &Policy,
) -> Result<RouteWait, RouteError> {
    let lease_ms = policy.lease_ms();
    let max_ms = match wait_max.map(ceil_ms) {
        None => lease_ms.saturating_sub(idem_core::lease::margin_ms(lease_ms)),
        Some(n) if n > lease_ms || n > WAIT_MS_LIMIT => {
            return Err(err(
                "wait_ms_max",
                format!(
                    "{n} ms is longer than the lease ({lease_ms} ms) or the limit \
                     ({WAIT_MS_LIMIT} ms): the attempt waited for is over by the lease's end"
                ),
            ));
        }
        Some(n) => n,
    };
    let default_ms = wait.map(ceil_ms).unwrap_or(0);
    if default_ms > max_ms {
        return Err(err(
            "wait_ms",
            format!("{default_ms} ms is longer than wait_ms_max ({max_ms} ms)"),
        ));
    }
    Ok(RouteWait { default_ms, max_ms })
}

fn body_limit(declared: Option<usize>) -> Result<usize, RouteError> {
    match declared {
        None => Ok(BODY_BYTES_MAX_DEFAULT),
        Some(0) => Err(err("body_bytes_max", "must be at least 1".into())),
        Some(n) if n > BODY_BYTES_MAX_LIMIT => Err(err(
            "body_bytes_max",
            format!("{n} is over the limit of {BODY_BYTES_MAX_LIMIT} bytes"),
        )),
        Some(n) => Ok(n),
    }
}

fn parse_methods(names: &[String]) -> Result<Vec<Method>, RouteError> {
    if names.is_empty() {
        return Err(err("methods", "must name at least one method".into()));
    }
    names
        .iter()
        .map(|m| {
            Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                .map_err(|_| err("methods", format!("{m:?} is not an HTTP method")))
        })
        .collect()
}

fn header_name(field: &'static str, name: &str) -> Result<HeaderName, RouteError> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| err(field, format!("{name:?} is not a valid header name")))
}

fn header_names(field: &'static str, names: &[String]) -> Result<Vec<HeaderName>, RouteError> {
    names.iter().map(|n| header_name(field, n)).collect()
}

/// The headers a route's fingerprint covers. The trace context is refused:
/// every attempt of a client sends a new `traceparent` (a new span), so
/// fingerprinting it would refuse every retry as another request.
fn fingerprint_headers(names: Vec<HeaderName>) -> Result<Vec<HeaderName>, RouteError> {
    match names
        .iter()
        .find(|n| idem_core::fingerprint::is_trace_context(n.as_str()))
    {
        Some(n) => Err(err(
            "fingerprint_headers",
            format!(
                "{:?}: {}",
                n.as_str(),
                idem_core::fingerprint::TRACE_CONTEXT_REFUSED
            ),
        )),
        None => Ok(names),
    }
}
