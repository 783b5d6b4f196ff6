//! The admin API: what an operator needs from a running gateway, on a
//! listener of its own and behind each operator's bearer token (or a
//! trusted proxy's header naming the operator, where configured). List and
//! inspect records, resolve an ambiguous one, expire or evict one
//! deliberately, scrape the metrics. Every error is an RFC 9457
//! problem document that says what to fix.

mod extract;
mod operators;
mod problem;
pub(crate) mod resolve;
mod verb;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Extension, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use idem_core::{Clock, RecordId, Store, StoreError, SystemClock, Verb};
use idem_http::{METRICS_CONTENT_TYPE, Metrics, Resolver};

use crate::view::{RecordView, WindowView, outcome_name};
use extract::{ListParams, RecordPath, ResolveBody};
use problem::{AdminProblem, Refusal};

pub use extract::strict_escapes;
pub use operators::{
    ADMIN_OPERATOR, OPERATOR_NAME_BYTES_MAX, OPERATORS_MAX, OperatorName, Operators,
};
pub use resolve::{parse_resolution, result_header};
pub use verb::parse_verb;

use idem_process::{LogBudget, Logged};

/// The most lines a minute that say a request without the admin token was
/// refused, by the admin API or by a router mounted beside it.
pub const ADMIN_REFUSAL_LOG_LINES_MAX: u32 = 10;
/// The window of [`ADMIN_REFUSAL_LOG_LINES_MAX`], in seconds.
pub const ADMIN_REFUSAL_LOG_WINDOW_S: u64 = 60;

/// The shortest admin token accepted, in bytes.
pub const ADMIN_TOKEN_BYTES_MIN: usize = 16;
/// The longest admin token accepted, in bytes.
pub const ADMIN_TOKEN_BYTES_MAX: usize = 4096;
/// The largest resolve body read, in bytes: a stored body of 1 MiB, escaped
/// as JSON text, fits.
pub const ADMIN_BODY_BYTES_MAX: usize = 8 * 1024 * 1024;
/// How many records `GET /records` returns without `limit`.
pub const ADMIN_LIST_LIMIT_DEFAULT: usize = 1000;
/// The most bytes of a refused request's path written to the log: a caller
/// without the token must not choose the size of the gateway's log lines.
pub const ADMIN_LOGGED_PATH_BYTES_MAX: usize = 256;
/// Random bytes in a secret made by [`random_hex`].
pub const SECRET_BYTES: usize = 32;

/// The bearer token the admin API requires. Its `Debug` never shows it.
#[derive(Clone)]
pub struct AdminToken(pub(crate) Vec<u8>);

impl AdminToken {
    /// A token of [`ADMIN_TOKEN_BYTES_MIN`]..=[`ADMIN_TOKEN_BYTES_MAX`]
    /// bytes of visible ASCII (what a bearer credential can carry).
    pub fn new(value: &str) -> Result<AdminToken, String> {
        let len = value.len();
        if len < ADMIN_TOKEN_BYTES_MIN {
            return Err(format!(
                "the token is {len} bytes; at least {ADMIN_TOKEN_BYTES_MIN} are required"
            ));
        }
        if len > ADMIN_TOKEN_BYTES_MAX {
            return Err(format!(
                "the token is {len} bytes; at most {ADMIN_TOKEN_BYTES_MAX} are allowed"
            ));
        }
        if !value.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the token must be visible ASCII (no spaces or control characters)".into());
        }
        Ok(AdminToken(value.as_bytes().to_vec()))
    }

    /// Whether `presented` is the token, in time that depends only on the
    /// token's length, never on where the first difference is.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let mut diff = u8::from(presented.len() != self.0.len());
        for (i, expected) in self.0.iter().enumerate() {
            diff |= expected ^ presented.get(i).copied().unwrap_or(0);
        }
        std::hint::black_box(diff) == 0
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(***)")
    }
}

/// The log lines that say a request without the admin token was refused:
/// the admin API's and those of a router mounted beside it (the console's
/// wrong sign-ins) spend one budget of [`ADMIN_REFUSAL_LOG_LINES_MAX`]
/// lines per [`ADMIN_REFUSAL_LOG_WINDOW_S`], so a flood through either
/// cannot fill the log. Clones share the budget.
#[derive(Clone, Debug)]
pub struct RefusalLog(Arc<LogBudget>);

impl Default for RefusalLog {
    fn default() -> RefusalLog {
        RefusalLog(Arc::new(LogBudget::new(
            ADMIN_REFUSAL_LOG_LINES_MAX,
            std::time::Duration::from_secs(ADMIN_REFUSAL_LOG_WINDOW_S),
        )))
    }
}

impl RefusalLog {
    /// Whether the line of one refusal seen at `now` is written.
    pub fn admit(&self, now: std::time::Instant) -> Logged {
        self.0.admit(now)
    }
}

/// [`SECRET_BYTES`] from the operating system's generator, as hex: the
/// console's session ids and CSRF tokens, and any other secret a process
/// makes for itself (the demo's admin token). `None` if the generator
/// fails.
pub fn random_hex() -> Option<String> {
    let mut bytes = [0u8; SECRET_BYTES];
    getrandom::fill(&mut bytes).ok()?;
    Some(idem_core::to_hex(&bytes))
}

/// The admin API as an axum router: mount it on a listener of its own.
///
/// A request is let in as the operator whose bearer token it carries, or
/// whom the trusted proxy's header names (when `operators` has one); every
/// resolution is journaled under that name. Its routes and its fallback (404 `not-found` for any other path) sit
/// behind the bearer-token middleware, which answers 401 before routing
/// tells anything. Routes added to the returned router afterwards, with
/// `Router::merge` or `Router::nest("/ui", …)`, are outside that layer and
/// authenticate by themselves; a merged router must not bring a fallback of
/// its own (axum refuses to merge two), a nested one may. Its refusals
/// are logged within `refusals`.
pub fn router(
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    operators: Operators,
    refusals: RefusalLog,
) -> axum::Router {
    let admin = Arc::new(Admin {
        store,
        metrics,
        operators,
        refusals,
    });
    let posted = |endpoint: MethodRouter<Arc<Admin>>| {
        only(Allowed::Post, endpoint).layer(DefaultBodyLimit::max(ADMIN_BODY_BYTES_MAX))
    };
    let routed = axum::Router::new()
        .route("/metrics", only(Allowed::Get, get(scrape)))
        .route("/records", only(Allowed::Get, get(list)))
        .route("/records/{scope}/{key}", only(Allowed::Get, get(show)))
        .route("/records/{scope}/{key}/resolve", posted(post(resolve)))
        .route("/records/{scope}/{key}/expire", posted(post(expire)))
        .route("/records/{scope}/{key}/evict", posted(post(evict)))
        .route("/window", only(Allowed::Get, get(window)))
        .fallback(not_found)
        .with_state(admin.clone());
    // The token is checked around the whole routed router, not as a layer
    // of each route: a route's layer runs after its method is matched, and
    // axum then adds `Allow` to the 401 of a method it does not serve,
    // telling which paths exist.
    axum::Router::new()
        .fallback_service(routed)
        .layer(middleware::from_fn_with_state(admin, authenticate))
}

struct Admin {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    operators: Operators,
    refusals: RefusalLog,
}

/// The one method an endpoint answers (`GET` also answers `HEAD`, without
/// a body, as axum does for every `GET` route).
#[derive(Clone, Copy, Debug)]
enum Allowed {
    Get,
    Post,
}

/// Authentication comes before routing, so that nothing, not even which
/// paths exist, is told to a caller without the token.
async fn authenticate(State(admin): State<Arc<Admin>>, mut req: Request, next: Next) -> Response {
    match admin.authorized(req.headers()) {
        Some(Admitted::Token(operator)) => {
            req.extensions_mut().insert(operator);
            return next.run(req).await;
        }
        Some(Admitted::Header(operator)) => {
            if let Some(why) = forgeable(req.method(), req.headers()) {
                return Refusal::new(AdminProblem::Unauthorized, why).into_response();
            }
            req.extensions_mut().insert(operator);
            return next.run(req).await;
        }
        None => {}
    }
    if let Logged::Write { suppressed } = admin.refusals.admit(std::time::Instant::now()) {
        let path = logged_path(req.uri().path());
        tracing::warn!(
            method = %req.method(),
            path,
            suppressed,
            "admin API: refused a request without a valid token"
        );
    }
    Refusal::new(
        AdminProblem::Unauthorized,
        "send Authorization: Bearer TOKEN with your operator token (admin_token_env, or the \
         token_env of your [[admin.operator]])",
    )
    .into_response()
}

/// `endpoint`, answering 405 with `Allow` to every other method.
fn only(allowed: Allowed, endpoint: MethodRouter<Arc<Admin>>) -> MethodRouter<Arc<Admin>> {
    let (name, allow) = match allowed {
        Allowed::Get => ("GET", "GET, HEAD"),
        Allowed::Post => ("POST", "POST"),
    };
    endpoint.fallback(move |method: Method, uri: Uri| async move {
        Refusal::new(
            AdminProblem::MethodNotAllowed(allow),
            format!("{method} {} is not supported; use {name}", uri.path()),
        )
    })
}

async fn not_found(uri: Uri) -> Refusal {
    Refusal::new(
        AdminProblem::NotFound,
        format!(
            "no admin endpoint at {}; there are GET /metrics, GET /records, \
             GET /records/{{scope}}/{{key}}, and POST /records/{{scope}}/{{key}}/resolve, \
             /expire and /evict",
            uri.path()
        ),
    )
}

/// `GET /metrics`.
async fn scrape(State(admin): State<Arc<Admin>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(METRICS_CONTENT_TYPE),
        )],
        admin.metrics.render(),
    )
        .into_response()
}

/// `GET /records?state=…&limit=…&after_scope=…&after_key=…`.
async fn list(
    State(admin): State<Arc<Admin>>,
    ListParams(query): ListParams,
) -> Result<Response, Refusal> {
    let page = admin
        .store
        .list(&query)
        .await
        .map_err(|e| admin.store_problem(e))?;
    let now = SystemClock.now();
    let views: Vec<RecordView> = page
        .records
        .iter()
        .map(|r| RecordView::new(r, now))
        .collect();
    let next = page
        .next
        .map(|at| serde_json::json!({ "after_scope": at.scope, "after_key": at.key }));
    let answer = serde_json::json!({
        "records": views,
        "damaged": page.damaged,
        "next": next,
    });
    Ok(json(&answer))
}

/// `GET /window`: the store's suspect window, or `null` when none was
/// ever opened.
async fn window(State(admin): State<Arc<Admin>>) -> Result<Response, Refusal> {
    let window = admin
        .store
        .suspect_window()
        .await
        .map_err(|e| admin.store_problem(e))?;
    let view = window.map(|w| WindowView::new(&w, SystemClock.now()));
    Ok(json(&serde_json::json!({ "window": view })))
}

/// `GET /records/{scope}/{key}`.
async fn show(
    State(admin): State<Arc<Admin>>,
    RecordPath(id): RecordPath,
) -> Result<Response, Refusal> {
    match admin.store.get(&id).await {
        Ok(Some(record)) => Ok(json(&RecordView::new(&record, SystemClock.now()))),
        Ok(None) => Err(admin.store_problem(StoreError::NotFound { id })),
        Err(e) => Err(admin.store_problem(e)),
    }
}

/// `POST /records/{scope}/{key}/resolve`.
#[tracing::instrument(name = "idem.resolve", skip_all, fields(idem.scope = %id.scope, idem.key = %id.key, idem.resolver = "operator"))]
async fn resolve(
    State(admin): State<Arc<Admin>>,
    Extension(operator): Extension<OperatorName>,
    RecordPath(id): RecordPath,
    ResolveBody(body): ResolveBody,
) -> Result<Response, Refusal> {
    let (token, resolution) =
        resolve::parse_resolution(&body, &operator.by()).map_err(Refusal::invalid)?;
    let outcome = resolution.outcome.clone();
    let (by, reason) = (resolution.by.clone(), resolution.reason.clone());
    let record = admin
        .store
        .resolve(&id, token, resolution)
        .await
        .map_err(|e| admin.store_problem(e))?;
    admin.metrics.resolution(Resolver::Operator, &outcome);
    let outcome = outcome_name(&outcome);
    tracing::info!(scope = %id.scope, key = %id.key, outcome, by, reason, "ambiguous record resolved through the admin API");
    let now = SystemClock.now();
    let answer = serde_json::json!({
        "outcome": outcome,
        "by": by,
        "reason": reason,
        "record": record.as_ref().map(|r| RecordView::new(r, now)),
    });
    Ok(json(&answer))
}

/// `POST /records/{scope}/{key}/expire`: `{"token":N,"reason":"…"}`.
#[tracing::instrument(name = "idem.expire", skip_all, fields(idem.scope = %id.scope, idem.key = %id.key))]
async fn expire(
    State(admin): State<Arc<Admin>>,
    Extension(operator): Extension<OperatorName>,
    RecordPath(id): RecordPath,
    ResolveBody(body): ResolveBody,
) -> Result<Response, Refusal> {
    apply_verb(&admin, &operator, id, Verb::Expire, &body).await
}

/// `POST /records/{scope}/{key}/evict`: `{"token":N,"reason":"…"}`.
#[tracing::instrument(name = "idem.evict", skip_all, fields(idem.scope = %id.scope, idem.key = %id.key))]
async fn evict(
    State(admin): State<Arc<Admin>>,
    Extension(operator): Extension<OperatorName>,
    RecordPath(id): RecordPath,
    ResolveBody(body): ResolveBody,
) -> Result<Response, Refusal> {
    apply_verb(&admin, &operator, id, Verb::Evict, &body).await
}

/// One verb applied: the verb, who, why, and the record left (the
/// tombstone of an `expire`, `null` after an `evict`).
async fn apply_verb(
    admin: &Admin,
    operator: &OperatorName,
    id: RecordId,
    verb: Verb,
    body: &[u8],
) -> Result<Response, Refusal> {
    let (token, request) =
        verb::parse_verb(verb, body, &operator.by()).map_err(Refusal::invalid)?;
    let (by, reason) = (request.by.clone(), request.reason.clone());
    let record = match admin.store.apply_verb(&id, token, request).await {
        Ok(record) => record,
        Err(e @ StoreError::WrongState { .. }) => {
            let detail = format!("{e}; only a completed record can be expired");
            return Err(Refusal::new(AdminProblem::NotCompleted, detail));
        }
        Err(e) => return Err(admin.store_problem(e)),
    };
    let verb = verb.as_str();
    tracing::info!(scope = %id.scope, key = %id.key, verb, by, reason, "operator's verb applied through the admin API");
    let now = SystemClock.now();
    let answer = serde_json::json!({
        "verb": verb,
        "by": by,
        "reason": reason,
        "record": record.as_ref().map(|r| RecordView::new(r, now)),
    });
    Ok(json(&answer))
}

/// How a request's operator was established.
enum Admitted {
    /// By the bearer token it carries, which a browser never adds by itself.
    Token(OperatorName),
    /// By the trusted proxy's header, which the proxy adds to every request
    /// the operator's browser sends, a forged one included.
    Header(OperatorName),
}

/// Why a request admitted by the proxy's header alone could have been
/// sent by another site's page in the operator's browser: a change whose
/// body is not `application/json` (a form or a `no-cors` fetch, which no
/// preflight stops), or one the browser says came from elsewhere.
fn forgeable(method: &Method, headers: &HeaderMap) -> Option<String> {
    if matches!(*method, Method::GET | Method::HEAD) {
        return None;
    }
    let site = headers
        .get("sec-fetch-site")
        .map(|v| v.to_str().unwrap_or(""));
    if let Some(site) = site.filter(|s| !matches!(*s, "same-origin" | "none")) {
        return Some(format!(
            "a change admitted by the proxy's operator header came from another site \
             (Sec-Fetch-Site: {site}); nothing was changed"
        ));
    }
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
    (!json).then(|| {
        "a change admitted by the proxy's operator header must send Content-Type: \
         application/json (a browser then asks before sending it across sites); nothing was \
         changed"
            .to_owned()
    })
}

impl Admin {
    /// The operator of a request: the one whose bearer token it carries,
    /// else the one the trusted proxy's header names. A request with an
    /// `Authorization` header is judged by it alone: a wrong token is
    /// refused, never passed on to the header.
    fn authorized(&self, headers: &HeaderMap) -> Option<Admitted> {
        if let Some(value) = headers.get(header::AUTHORIZATION) {
            let value = value.as_bytes();
            let scheme = value
                .get(..7)
                .is_some_and(|s| s.eq_ignore_ascii_case(b"bearer "));
            // Check the token even when the scheme is wrong, so that both
            // refusals take the same time.
            let token = value.get(7..).unwrap_or_default();
            let found = self.operators.by_token(token).filter(|_| scheme);
            return found.map(|name| Admitted::Token(name.clone()));
        }
        self.operators.by_header(headers).map(Admitted::Header)
    }

    /// The problem for a store error; failures of the store itself are
    /// counted like the layer's.
    fn store_problem(&self, e: StoreError) -> Refusal {
        use AdminProblem::*;
        let kind = match &e {
            StoreError::NotFound { .. } => RecordNotFound,
            StoreError::WrongState { .. } => NotAmbiguous,
            StoreError::Fenced { .. } => OtherAttempt,
            StoreError::MayStillCommit { .. } => MayStillCommit,
            StoreError::Limit(_) => InvalidRequest,
            StoreError::Unavailable { .. } => StoreUnavailable,
            _ => StoreFailed,
        };
        if matches!(kind, StoreUnavailable | StoreFailed) {
            self.metrics.store_error();
            tracing::error!(error = %e, "admin API: store operation failed");
        }
        let detail = match &e {
            StoreError::WrongState { state, .. } => {
                format!("{e}; only an ambiguous record can be resolved (this one is {state})")
            }
            _ => e.to_string(),
        };
        Refusal::new(kind, detail)
    }
}

/// A 200 answer with a JSON body.
fn json(value: &impl serde::Serialize) -> Response {
    // Serializing our own view types cannot fail; an empty body would be
    // the visible symptom if it ever did.
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut response = (StatusCode::OK, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// `path` as logged: at most [`ADMIN_LOGGED_PATH_BYTES_MAX`] bytes of it,
/// cut at a character boundary, and how long it was when cut.
fn logged_path(path: &str) -> String {
    if path.len() <= ADMIN_LOGGED_PATH_BYTES_MAX {
        return path.to_owned();
    }
    let mut end = ADMIN_LOGGED_PATH_BYTES_MAX;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &path[..end], path.len())
}

#[cfg(test)]
mod tests;
