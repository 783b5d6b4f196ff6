//! The admin API: what an operator needs from a running gateway, on a
//! listener of its own and behind a bearer token. List and inspect records,
//! resolve an ambiguous one, scrape the metrics. Every error is an RFC 9457
//! problem document that says what to fix.

mod resolve;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use idem_core::{
    Clock, IdempotencyKey, LIST_LIMIT_MAX, ListCursor, ListQuery, RecordId, Scope, Store,
    StoreError, SystemClock,
};
use idem_http::{METRICS_CONTENT_TYPE, Metrics, PROBLEM_TYPE_PREFIX, Resolver};

use crate::view::{RecordView, outcome_name};

pub use resolve::{ADMIN_API_ACTOR, result_header};

/// The shortest admin token accepted, in bytes.
pub const ADMIN_TOKEN_BYTES_MIN: usize = 16;
/// The longest admin token accepted, in bytes.
pub const ADMIN_TOKEN_BYTES_MAX: usize = 4096;
/// The largest resolve body read, in bytes: a stored body of 1 MiB, escaped
/// as JSON text, fits.
pub const ADMIN_BODY_BYTES_MAX: usize = 8 * 1024 * 1024;
/// How many records `GET /records` returns without `limit`.
pub const ADMIN_LIST_LIMIT_DEFAULT: usize = 1000;

/// The bearer token the admin API requires. Its `Debug` never shows it.
#[derive(Clone)]
pub struct AdminToken(Vec<u8>);

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
    fn matches(&self, presented: &[u8]) -> bool {
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

/// The admin API as an axum router: mount it on a listener of its own.
pub fn router(store: Arc<dyn Store>, metrics: Arc<Metrics>, token: AdminToken) -> axum::Router {
    let admin = Arc::new(Admin {
        store,
        metrics,
        token,
    });
    axum::Router::new().fallback(handle).with_state(admin)
}

struct Admin {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    token: AdminToken,
}

/// A refusal of the admin API.
#[derive(Debug)]
struct AdminProblem {
    kind: AdminProblemKind,
    detail: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AdminProblemKind {
    Unauthorized,
    NotFound,
    MethodNotAllowed(&'static str),
    InvalidRequest,
    BodyTooLarge,
    RecordNotFound,
    NotAmbiguous,
    OtherAttempt,
    MayStillCommit,
    StoreUnavailable,
    StoreFailed,
}

/// Routes one request. Authentication comes first, so that nothing, not
/// even which paths exist, is told to a caller without the token.
async fn handle(State(admin): State<Arc<Admin>>, req: Request) -> Response {
    if !admin.authorized(req.headers()) {
        tracing::warn!(method = %req.method(), path = %req.uri().path(), "admin API: refused a request without a valid token");
        return AdminProblem::new(
            AdminProblemKind::Unauthorized,
            "send Authorization: Bearer TOKEN with the token from the gateway's admin_token_env variable",
        )
        .into_response();
    }
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    let segments: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
    let answer = match (segments.as_slice(), parts.method.as_str()) {
        (["metrics"], "GET") => Ok(metrics(&admin)),
        (["records"], "GET") => admin.list(parts.uri.query()).await,
        (["records", scope, key], "GET") => admin.show(scope, key).await,
        (["records", scope, key, "resolve"], "POST") => admin.resolve(scope, key, body).await,
        (["metrics"] | ["records"] | ["records", _, _], _) => Err(AdminProblem::new(
            AdminProblemKind::MethodNotAllowed("GET"),
            format!("{} {path} is not supported; use GET", parts.method),
        )),
        (["records", _, _, "resolve"], _) => Err(AdminProblem::new(
            AdminProblemKind::MethodNotAllowed("POST"),
            format!("{} {path} is not supported; use POST", parts.method),
        )),
        _ => Err(AdminProblem::new(
            AdminProblemKind::NotFound,
            format!(
                "no admin endpoint at {path}; there are GET /metrics, GET /records, \
                 GET /records/{{scope}}/{{key}} and POST /records/{{scope}}/{{key}}/resolve"
            ),
        )),
    };
    answer.unwrap_or_else(AdminProblem::into_response)
}

impl Admin {
    fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return false;
        };
        let value = value.as_bytes();
        let scheme = value
            .get(..7)
            .is_some_and(|s| s.eq_ignore_ascii_case(b"bearer "));
        // Check the token even when the scheme is wrong, so that both
        // refusals take the same time.
        let token = value.get(7..).unwrap_or_default();
        self.token.matches(token) & scheme
    }

    /// `GET /records?state=…&limit=…&after_scope=…&after_key=…`.
    async fn list(&self, query: Option<&str>) -> Result<Response, AdminProblem> {
        let query = list_query(query)?;
        let page = self
            .store
            .list(&query)
            .await
            .map_err(|e| self.store_problem(e))?;
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
        Ok(json(StatusCode::OK, &answer))
    }

    /// `GET /records/{scope}/{key}`.
    async fn show(&self, scope: &str, key: &str) -> Result<Response, AdminProblem> {
        let id = record_id(scope, key)?;
        match self.store.get(&id).await {
            Ok(Some(record)) => Ok(json(
                StatusCode::OK,
                &RecordView::new(&record, SystemClock.now()),
            )),
            Ok(None) => Err(self.store_problem(StoreError::NotFound { id })),
            Err(e) => Err(self.store_problem(e)),
        }
    }

    /// `POST /records/{scope}/{key}/resolve`.
    #[tracing::instrument(name = "idem.resolve", skip_all, fields(idem.scope = scope, idem.key = key, idem.resolver = "operator"))]
    async fn resolve(&self, scope: &str, key: &str, body: Body) -> Result<Response, AdminProblem> {
        let id = record_id(scope, key)?;
        let body = read_body(body).await?;
        let (token, resolution) = resolve::parse_resolution(&body)
            .map_err(|e| AdminProblem::new(AdminProblemKind::InvalidRequest, e))?;
        let outcome = resolution.outcome.clone();
        let (by, reason) = (resolution.by.clone(), resolution.reason.clone());
        let record = self
            .store
            .resolve(&id, token, resolution)
            .await
            .map_err(|e| self.store_problem(e))?;
        self.metrics.resolution(Resolver::Operator, &outcome);
        let outcome = outcome_name(&outcome);
        tracing::info!(scope = %id.scope, key = %id.key, outcome, by, reason, "ambiguous record resolved through the admin API");
        let now = SystemClock.now();
        let answer = serde_json::json!({
            "outcome": outcome,
            "by": by,
            "reason": reason,
            "record": record.as_ref().map(|r| RecordView::new(r, now)),
        });
        Ok(json(StatusCode::OK, &answer))
    }

    /// The problem for a store error; failures of the store itself are
    /// counted like the layer's.
    fn store_problem(&self, e: StoreError) -> AdminProblem {
        use AdminProblemKind::*;
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
        AdminProblem::new(kind, detail)
    }
}

fn metrics(admin: &Admin) -> Response {
    let mut response = Response::new(Body::from(admin.metrics.render()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(METRICS_CONTENT_TYPE),
    );
    response
}

fn json(status: StatusCode, value: &impl serde::Serialize) -> Response {
    // Serializing our own view types cannot fail; an empty body would be
    // the visible symptom if it ever did.
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

async fn read_body(body: Body) -> Result<Bytes, AdminProblem> {
    match Limited::new(body, ADMIN_BODY_BYTES_MAX).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(AdminProblem::new(
            AdminProblemKind::BodyTooLarge,
            format!("the body is over {ADMIN_BODY_BYTES_MAX} bytes"),
        )),
        Err(e) => Err(AdminProblem::new(
            AdminProblemKind::InvalidRequest,
            format!("the body could not be read: {e}"),
        )),
    }
}

/// Scope and key from two percent-encoded path segments.
fn record_id(scope: &str, key: &str) -> Result<RecordId, AdminProblem> {
    let invalid = |detail: String| AdminProblem::new(AdminProblemKind::InvalidRequest, detail);
    let scope =
        percent_decode(scope, false).map_err(|e| invalid(format!("path segment scope {e}")))?;
    let key = percent_decode(key, false).map_err(|e| invalid(format!("path segment key {e}")))?;
    Ok(RecordId {
        scope: Scope::new(scope.clone())
            .map_err(|e| invalid(format!("path segment scope {scope:?}: {e}")))?,
        key: IdempotencyKey::new(key.clone())
            .map_err(|e| invalid(format!("path segment key {key:?}: {e}")))?,
    })
}

fn list_query(raw: Option<&str>) -> Result<ListQuery, AdminProblem> {
    let invalid = |detail: String| AdminProblem::new(AdminProblemKind::InvalidRequest, detail);
    let mut query = ListQuery {
        state: None,
        after: None,
        limit: ADMIN_LIST_LIMIT_DEFAULT,
    };
    let (mut after_scope, mut after_key) = (None, None);
    for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value, true)
            .map_err(|e| invalid(format!("query parameter `{name}` {e}")))?;
        match name {
            "state" => {
                let state = value
                    .parse()
                    .map_err(|e| invalid(format!("query parameter `state`: {e}")))?;
                query.state = Some(state);
            }
            "limit" => {
                query.limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=LIST_LIMIT_MAX).contains(n))
                    .ok_or_else(|| {
                        invalid(format!(
                            "query parameter `limit` is {value:?}; expected 1-{LIST_LIMIT_MAX}"
                        ))
                    })?;
            }
            "after_scope" => after_scope = Some(value),
            "after_key" => after_key = Some(value),
            other => {
                return Err(invalid(format!(
                    "query parameter `{other}` is unknown; expected state, limit, after_scope, after_key"
                )));
            }
        }
    }
    query.after = match (after_scope, after_key) {
        (None, None) => None,
        // A position, not a record: it may name a row that cannot be read.
        (Some(scope), Some(key)) => Some(ListCursor { scope, key }),
        _ => {
            return Err(invalid(
                "query parameters `after_scope` and `after_key` go together: the `next` of the previous page".into(),
            ));
        }
    };
    Ok(query)
}

/// Decodes `%XX` escapes (and `+` as a space in a query) with the
/// `percent-encoding` crate; unlike the crate, a `%` without two hex digits
/// is refused rather than kept, and the result must be UTF-8. The error
/// completes a sentence naming the input.
fn percent_decode(raw: &str, plus_is_space: bool) -> Result<String, String> {
    let bytes = raw.as_bytes();
    let malformed = bytes.iter().enumerate().any(|(i, &b)| {
        b == b'%'
            && !bytes
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if malformed {
        return Err(format!(
            "{raw:?} has a % that is not followed by two hex digits"
        ));
    }
    let spaced;
    let text = if plus_is_space {
        spaced = raw.replace('+', " ");
        spaced.as_str()
    } else {
        raw
    };
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(|decoded| decoded.into_owned())
        .map_err(|_| format!("{raw:?} is not UTF-8 once percent-decoded"))
}

impl AdminProblem {
    fn new(kind: AdminProblemKind, detail: impl Into<String>) -> AdminProblem {
        AdminProblem {
            kind,
            detail: detail.into(),
        }
    }

    fn into_response(self) -> Response {
        let (status, slug, title) = self.kind.describe();
        let doc = serde_json::json!({
            "type": format!("{PROBLEM_TYPE_PREFIX}{slug}"),
            "title": title,
            "status": status.as_u16(),
            "detail": self.detail,
        });
        let mut response = json(status, &doc);
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        match self.kind {
            AdminProblemKind::Unauthorized => {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"idem-admin\""),
                );
            }
            AdminProblemKind::MethodNotAllowed(allow) => {
                headers.insert(header::ALLOW, HeaderValue::from_static(allow));
            }
            AdminProblemKind::StoreUnavailable => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(1));
            }
            _ => {}
        }
        response
    }
}

impl AdminProblemKind {
    /// Status, `type` slug and title: the table in docs/operations.md.
    fn describe(self) -> (StatusCode, &'static str, &'static str) {
        use AdminProblemKind::*;
        match self {
            Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "The admin token is missing or wrong",
            ),
            NotFound => (StatusCode::NOT_FOUND, "not-found", "No such admin endpoint"),
            MethodNotAllowed(_) => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
            ),
            InvalidRequest => (
                StatusCode::BAD_REQUEST,
                "invalid-request",
                "The admin request is invalid",
            ),
            BodyTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body is too large",
            ),
            RecordNotFound => (
                StatusCode::NOT_FOUND,
                "record-not-found",
                "No record for this scope and key",
            ),
            NotAmbiguous => (
                StatusCode::CONFLICT,
                "not-ambiguous",
                "The record is not ambiguous",
            ),
            OtherAttempt => (
                StatusCode::CONFLICT,
                "other-attempt",
                "The record belongs to another attempt than the token names",
            ),
            MayStillCommit => (
                StatusCode::CONFLICT,
                "may-still-commit",
                "The attempt may still commit",
            ),
            StoreUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Idempotency store is unavailable",
            ),
            StoreFailed => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "store-failed",
                "The idempotency store failed",
            ),
        }
    }
}

#[cfg(test)]
mod tests;
