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
use idem_core::{
    AMBIGUITY_SUMMARY_FIELDS_MAX, Completion, CompletionTable, Dedup, JsonPointer, LeaseExpiry,
    Policy, Store,
};

use crate::cors::CorsExpose;
use crate::principal::{JwtSpec, Principal, PrincipalSource, PrincipalSpec};
use crate::problem::ErrorDialect;
use crate::route::{
    BODY_BYTES_MAX_DEFAULT, BODY_BYTES_MAX_LIMIT, KeyTemplate, Methods, Operation, PathPattern,
    Route, RouteSpec, RouteWait,
};
use crate::service::IdempotencyLayer;
use crate::setting::RouteError;
use crate::status::StatusUrl;
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
    summary_fields: Vec<String>,
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
    status: Option<StatusUrl>,
    cors: CorsExpose,
    error_dialect: ErrorDialect,
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
        Route::new(&RouteSpec::default()).unwrap_or_else(|e| unreachable!("default route: {e}"))
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
    /// with a path; for one without, each request's method and the path
    /// pattern axum matched (`POST /payouts/{id}`, with the `axum` feature),
    /// or else the request's path.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The methods protected. Default: POST and PATCH for a route with a
    /// [`path`](RouteBuilder::path) (as in the config file); every method
    /// but GET, HEAD, OPTIONS and TRACE for a route without one, attached
    /// to the handler it protects. Any other method passes through
    /// unprotected.
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
        T: Send + Sync + 'static,
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

    /// JSON pointers (RFC 6901) of body fields kept in the note of why a
    /// record is ambiguous, e.g. `/seller_id`, `/amount`: numbers as the
    /// request spelled them; a body that is not JSON, or a field it lacks,
    /// gives no entry. At most [`AMBIGUITY_SUMMARY_FIELDS_MAX`]; default
    /// none.
    pub fn summary_fields<P: Into<String>>(
        mut self,
        pointers: impl IntoIterator<Item = P>,
    ) -> Self {
        self.summary_fields = pointers.into_iter().map(Into::into).collect();
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

    /// Where a caller asks what became of its key (docs/http.md, "The
    /// status URL"); default `{path}/.idem/{key}` ([`StatusUrl::default`]).
    /// Answered only on a route with [`RouteBuilder::methods`] listed (the
    /// methods name the scopes to look in), and only for `GET`s that reach
    /// the layer: inside a router, route the status path to it too.
    pub fn status_url(mut self, status: StatusUrl) -> Self {
        self.status = Some(status);
        self
    }

    /// Whether responses name idem's headers in
    /// `Access-Control-Expose-Headers` for browser callers (default
    /// [`CorsExpose::Off`]).
    pub fn cors_expose(mut self, expose: CorsExpose) -> Self {
        self.cors = expose;
        self
    }

    /// The shape of idem's own refusals on this route, for clients that
    /// read another dialect than RFC 9457 ([`ErrorDialect`]); default
    /// [`ErrorDialect::Rfc9457`].
    pub fn error_dialect(mut self, dialect: ErrorDialect) -> Self {
        self.error_dialect = dialect;
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
        let methods = match (self.methods, &self.path) {
            (None, Some(_)) => Methods::Listed(vec![Method::POST, Method::PATCH]),
            (None, None) => Methods::Unsafe,
            (Some(m), _) if m.is_empty() => {
                return Err(err("methods", "must name at least one method".into()));
            }
            (Some(m), _) => Methods::Listed(m),
        };
        let pattern = PathPattern::parse(self.path.as_deref().unwrap_or("/**"))
            .map_err(|reason| err("path", reason))?;
        let operation = match (&self.name, &self.path) {
            (None, None) => Operation::MethodAndMatchedPath,
            (name, _) => operation(name.as_deref(), methods_named(&methods), &pattern)?,
        };
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
            fingerprint_exclude: pointers("fingerprint_exclude", &self.fingerprint_exclude)?,
            summary_fields: summary_fields(&self.summary_fields)?,
            body_bytes_max: body_limit(self.body_bytes_max)?,
            policy,
            upstream_dedups: dedup == Dedup::Upstream,
            completion: CompletionTable::new(self.completion, dedup)
                .map_err(|e| err("completion", e.to_string()))?,
            replay_headers: self.replay_headers,
            contract: contract(self.contract)?,
            status: self.status.unwrap_or_default(),
            cors: self.cors,
            latency: Arc::default(),
            error_dialect: self.error_dialect,
        })
    }

    /// The layer that protects this one route over `store`, for axum's
    /// `route_layer`: `post(pay).route_layer(Route::builder().name("payouts").layer(store)?)`.
    /// The layer's own settings (`with_settle_on_retry`, `with_metrics`, …)
    /// chain on the result.
    pub fn layer(self, store: Arc<dyn Store>) -> Result<IdempotencyLayer, RouteError> {
        Ok(IdempotencyLayer::new(store, vec![self.build()?]))
    }

    /// The builder a config file's route declares: the same settings,
    /// each parsed from its text and named by its field when refused.
    pub fn from_spec(spec: &RouteSpec) -> Result<RouteBuilder, RouteError> {
        let forward = spec.forward_key.clone().unwrap_or_default();
        Ok(RouteBuilder {
            name: spec.name.clone(),
            methods: spec.methods.as_deref().map(parse_methods).transpose()?,
            // A declared route always has a path: the catch-all keeps its
            // per-request operation whatever router it runs in.
            path: Some(spec.path.clone().unwrap_or_else(|| "/**".to_owned())),
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
            summary_fields: spec.summary_fields.clone().unwrap_or_default(),
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
            status: spec
                .status_url
                .as_deref()
                .map(StatusUrl::parse)
                .transpose()
                .map_err(|reason| err("status_url", reason))?,
            cors: match spec.cors_expose {
                Some(true) => CorsExpose::IdempotencyHeaders,
                Some(false) | None => CorsExpose::Off,
            },
            error_dialect: match spec.error_dialect.as_deref() {
                None => ErrorDialect::default(),
                Some(text) => ErrorDialect::parse(text).ok_or_else(|| {
                    err(
                        "error_dialect",
                        format!("{text:?} is not a dialect; use \"rfc9457\" or \"stripe\""),
                    )
                })?,
            },
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

/// The methods a derived operation name lists (none for a route that
/// protects every unsafe method: it has no path either, so its operation is
/// named by the request or by the name given).
fn methods_named(methods: &Methods) -> &[Method] {
    match methods {
        Methods::Listed(listed) => listed,
        Methods::Unsafe => &[],
    }
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

fn pointers(field: &'static str, texts: &[String]) -> Result<Vec<JsonPointer>, RouteError> {
    texts
        .iter()
        .map(|p| JsonPointer::parse(p).map_err(|e| err(field, e.to_string())))
        .collect()
}

fn summary_fields(texts: &[String]) -> Result<Vec<JsonPointer>, RouteError> {
    if texts.len() > AMBIGUITY_SUMMARY_FIELDS_MAX {
        return Err(err(
            "summary_fields",
            format!(
                "names {} fields; at most {AMBIGUITY_SUMMARY_FIELDS_MAX} are kept",
                texts.len()
            ),
        ));
    }
    pointers("summary_fields", texts)
}

fn contract(file: Option<PathBuf>) -> Result<Option<PathBuf>, RouteError> {
    match file {
        Some(file) if file.as_os_str().is_empty() => Err(err("contract", "names no file".into())),
        other => Ok(other),
    }
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

#[cfg(test)]
mod tests {
    use http::header::{AUTHORIZATION, LOCATION};

    use super::*;
    use crate::completion::CompletionSpec;
    use crate::principal::PrincipalKind;
    use crate::problem::ProblemKind;
    use crate::route::ForwardKeySpec;

    /// A config file's route and the same route in code are one route:
    /// every validated field (its `Debug`) agrees.
    #[test]
    fn a_spec_and_a_builder_build_the_same_route() {
        let full_spec = RouteSpec {
            name: Some("payouts".into()),
            methods: Some(vec!["post".into(), "PUT".into()]),
            path: Some("/payouts/{id}".into()),
            key_header: Some("x-key".into()),
            key_required: Some(false),
            principal: Some(PrincipalSpec::Header("x-tenant".into())),
            fingerprint_headers: Some(vec!["x-amount".into()]),
            fingerprint_exclude: Some(vec!["/request_time".into()]),
            summary_fields: Some(vec!["/seller_id".into(), "/amount".into()]),
            body_bytes_max: Some(4096),
            lease_ms: Some(2_500),
            retention_s: Some(3_600),
            tombstone_s: Some(7_200),
            on_lease_expiry: Some(LeaseExpiry::Takeover),
            upstream_dedups: Some(true),
            completion: Some(CompletionSpec {
                final_statuses: Some(vec![409]),
                release: Some(vec![503]),
                unknown: None,
            }),
            replay_headers: Some(vec!["x-payout-id".into()]),
            forward_key: Some(ForwardKeySpec {
                header: Some("x-upstream-key".into()),
                template: Some("{scope_digest}:{key}".into()),
            }),
            contract: Some("payouts.toml".into()),
            wait_ms: Some(100),
            wait_ms_max: Some(2_000),
            ..RouteSpec::default()
        };
        let full_builder = Route::builder()
            .name("payouts")
            .methods([Method::POST, Method::PUT])
            .path("/payouts/{id}")
            .key_header(HeaderName::from_static("x-key"))
            .missing_key(MissingKey::PassThrough)
            .principal_header(HeaderName::from_static("x-tenant"))
            .fingerprint_headers([HeaderName::from_static("x-amount")])
            .fingerprint_exclude(["/request_time"])
            .summary_fields(["/seller_id", "/amount"])
            .body_bytes_max(4096)
            .lease(Duration::from_millis(2_500))
            .retention(Duration::from_secs(3_600))
            .tombstone(Duration::from_secs(7_200))
            .on_lease_expiry(LeaseExpiry::Takeover)
            .dedup(Dedup::Upstream)
            .completion(StatusCode::CONFLICT, Completion::Final)
            .completion(StatusCode::SERVICE_UNAVAILABLE, Completion::Release)
            .replay_headers([HeaderName::from_static("x-payout-id")])
            .forward_key_header(HeaderName::from_static("x-upstream-key"))
            .forward_key_template("{scope_digest}:{key}")
            .contract("payouts.toml")
            .wait(Duration::from_millis(100))
            .wait_max(Duration::from_secs(2));
        let cases = [
            (RouteSpec::default(), Route::builder().path("/**")),
            (full_spec, full_builder),
            (
                RouteSpec {
                    path: Some("/refunds".into()),
                    ..RouteSpec::default()
                },
                Route::builder().path("/refunds"),
            ),
        ];
        for (spec, builder) in cases {
            let declared = format!("{:?}", Route::new(&spec).unwrap());
            let built = format!("{:?}", builder.build().unwrap());
            assert_eq!(declared, built, "{spec:?}");
        }
    }

    /// Durations are rounded up to the unit the store keeps: a lease or a
    /// retention is never shorter than asked.
    #[test]
    fn a_route_on_one_handler_protects_every_unsafe_method_unless_told() {
        let on_handler = Route::builder().build().unwrap();
        let with_path = Route::builder().path("/payouts").build().unwrap();
        let listed = Route::builder().methods([Method::PUT]).build().unwrap();
        let cases = [
            ("POST", true, true, false),
            ("patch", true, true, false),
            ("PUT", true, false, true),
            ("DELETE", true, false, false),
            ("PURGE", true, false, false),
            ("GET", false, false, false),
            ("head", false, false, false),
            ("OPTIONS", false, false, false),
            ("TRACE", false, false, false),
        ];
        for (name, handler, path, put) in cases {
            let method = Method::from_bytes(name.as_bytes()).unwrap();
            assert_eq!(
                on_handler.protects_method(&method),
                handler,
                "{name}, on a handler"
            );
            assert_eq!(
                with_path.protects_method(&method),
                path,
                "{name}, with a path"
            );
            assert_eq!(listed.protects_method(&method), put, "{name}, PUT listed");
        }
    }

    #[test]
    fn durations_round_up_to_the_stored_unit() {
        let route = Route::builder()
            .lease(Duration::from_micros(2_000_001))
            .retention(Duration::from_millis(1_500))
            .build()
            .unwrap();
        assert_eq!(route.policy().lease_ms(), 2_001);
        assert_eq!(route.policy().retention_s(), 2);
        let exact = Route::builder()
            .lease(Duration::from_secs(2))
            .build()
            .unwrap();
        assert_eq!(exact.policy().lease_ms(), 2_000);
    }

    #[test]
    fn builder_settings_are_refused_by_field() {
        let cases: Vec<(RouteBuilder, &str)> = vec![
            (Route::builder().methods([]), "methods"),
            (Route::builder().path("payouts"), "path"),
            (Route::builder().name("a|b"), "name"),
            (
                Route::builder().principal_header(AUTHORIZATION),
                "principal.header",
            ),
            (
                Route::builder().principal_credential_headers([]),
                "principal.credential_headers",
            ),
            (
                Route::builder().fingerprint_headers([HeaderName::from_static("traceparent")]),
                "fingerprint_headers",
            ),
            (
                Route::builder().fingerprint_exclude(["x"]),
                "fingerprint_exclude",
            ),
            (Route::builder().lease(Duration::from_millis(1)), "lease_ms"),
            (Route::builder().retention(Duration::ZERO), "retention_s"),
            (
                Route::builder()
                    .wait(Duration::from_secs(3))
                    .wait_max(Duration::from_secs(2)),
                "wait_ms",
            ),
            (
                Route::builder().wait_max(Duration::from_secs(31)),
                "wait_ms_max",
            ),
            (Route::builder().body_bytes_max(0), "body_bytes_max"),
            (
                Route::builder().body_bytes_max(BODY_BYTES_MAX_LIMIT + 1),
                "body_bytes_max",
            ),
            (
                Route::builder().on_lease_expiry(LeaseExpiry::Takeover),
                "on_lease_expiry",
            ),
            (
                Route::builder()
                    .completion(StatusCode::OK, Completion::Final)
                    .completion(StatusCode::OK, Completion::Release),
                "completion",
            ),
            (
                Route::builder().forward_key_template("{nope}"),
                "forward_key.template",
            ),
            (Route::builder().contract(""), "contract"),
        ];
        for (builder, field) in cases {
            let got = builder.build().map(|_| ()).map_err(|e| e.field);
            assert_eq!(got, Err(field));
        }
        let replayed = Route::builder().replay_headers([LOCATION]).build();
        assert!(replayed.is_ok());
    }

    #[derive(Clone)]
    struct User {
        tenant: String,
    }

    fn request(user: Option<&str>, tenant_header: Option<&str>) -> Parts {
        let mut builder = http::Request::post("/payouts");
        if let Some(tenant) = tenant_header {
            builder = builder.header("x-tenant", tenant);
        }
        let (mut parts, ()) = builder.body(()).unwrap().into_parts();
        if let Some(tenant) = user {
            parts.extensions.insert(User {
                tenant: tenant.to_owned(),
            });
        }
        parts
    }

    /// A principal the service names itself: each tenant its own scope,
    /// the same tenant one, and a request without one refused as a
    /// missing trusted header is.
    #[test]
    fn a_principal_from_an_extension_or_a_closure_is_the_tenant() {
        let by_extension = Route::builder()
            .principal_from_extension(|user: &User| user.tenant.clone())
            .build()
            .unwrap();
        let by_closure = Route::builder()
            .principal_fn(|parts: &Parts| {
                let tenant = parts.headers.get("x-tenant")?;
                tenant.to_str().ok().map(str::to_owned)
            })
            .build()
            .unwrap();
        for route in [&by_extension, &by_closure] {
            assert_eq!(route.principal_kind(), PrincipalKind::Application);
        }
        let of = |route: &Route, parts: Parts| route.principal.identify(&parts);
        let a = of(&by_extension, request(Some("acme"), None)).unwrap();
        assert_eq!(a.1.as_deref(), Some("acme"));
        assert_eq!(a, of(&by_extension, request(Some("acme"), None)).unwrap());
        assert_ne!(
            a.0,
            of(&by_extension, request(Some("globex"), None)).unwrap().0
        );
        assert_eq!(a.0, of(&by_closure, request(None, Some("acme"))).unwrap().0);
        let refused = [
            of(&by_extension, request(None, Some("acme"))),
            of(&by_extension, request(Some(""), None)),
            of(&by_extension, request(Some(&"t".repeat(256)), None)),
            of(&by_closure, request(Some("acme"), None)),
        ];
        for (i, answer) in refused.into_iter().enumerate() {
            let problem = answer.unwrap_err();
            assert_eq!(problem.kind, ProblemKind::InvalidPrincipal, "case {i}");
        }
    }
}
