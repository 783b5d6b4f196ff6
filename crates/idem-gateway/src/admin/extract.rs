//! The admin API's extractors: axum's `Path`, `Query` and `Bytes` decode the
//! request, and every way they can fail comes out as the API's problem
//! document, naming the segment, parameter or body to fix.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, MatchedPath, Path, Query, Request};
use http::request::Parts;
use idem_core::{IdempotencyKey, LIST_LIMIT_MAX, ListCursor, ListQuery, RecordId, Scope};
use serde::Deserialize;

use super::problem::{AdminProblem, Refusal};
use super::{ADMIN_BODY_BYTES_MAX, ADMIN_LIST_LIMIT_DEFAULT};

/// The record a `/records/{scope}/{key}…` path names.
pub(super) struct RecordPath(pub(super) RecordId);

/// The `GET /records` query: `state`, `limit`, `after_scope`, `after_key`.
pub(super) struct ListParams(pub(super) ListQuery);

/// A resolve body of at most [`ADMIN_BODY_BYTES_MAX`] bytes (the route's
/// `DefaultBodyLimit`).
pub(super) struct ResolveBody(pub(super) Bytes);

/// The path parameters, as `Path` percent-decodes them.
#[derive(Deserialize)]
struct Segments {
    scope: String,
    key: String,
}

/// The query parameters, as `Query` decodes them (`+` is a space); values
/// are checked afterwards so that each refusal names its parameter.
#[derive(Deserialize)]
struct RawListParams {
    state: Option<String>,
    limit: Option<String>,
    after_scope: Option<String>,
    after_key: Option<String>,
    /// Any other parameter: refused by name.
    #[serde(flatten)]
    unknown: BTreeMap<String, String>,
}

impl<S: Send + Sync> FromRequestParts<S> for RecordPath {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<RecordPath, Refusal> {
        for (name, raw) in raw_params(parts)? {
            strict_escapes(raw)
                .map_err(|e| Refusal::invalid(format!("path segment {name} {e}")))?;
        }
        let Path(Segments { scope, key }) = Path::<Segments>::from_request_parts(parts, state)
            .await
            .map_err(|e| Refusal::invalid(format!("the path cannot be read: {}", e.body_text())))?;
        let scope = Scope::new(scope.clone())
            .map_err(|e| Refusal::invalid(format!("path segment scope {scope:?}: {e}")))?;
        let key = IdempotencyKey::new(key.clone())
            .map_err(|e| Refusal::invalid(format!("path segment key {key:?}: {e}")))?;
        Ok(RecordPath(RecordId { scope, key }))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ListParams {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<ListParams, Refusal> {
        let query = parts.uri.query().unwrap_or_default();
        for pair in query.split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            strict_escapes(name).map_err(|e| Refusal::invalid(format!("query parameter {e}")))?;
            strict_escapes(value)
                .map_err(|e| Refusal::invalid(format!("query parameter `{name}` {e}")))?;
        }
        let Query(raw) = Query::<RawListParams>::from_request_parts(parts, state)
            .await
            .map_err(|e| {
                Refusal::invalid(format!("the query cannot be read: {}", e.body_text()))
            })?;
        list_query(raw).map(ListParams).map_err(Refusal::invalid)
    }
}

impl<S: Send + Sync> FromRequest<S> for ResolveBody {
    type Rejection = Refusal;

    async fn from_request(req: Request, state: &S) -> Result<ResolveBody, Refusal> {
        match Bytes::from_request(req, state).await {
            Ok(body) => Ok(ResolveBody(body)),
            Err(e) if e.status() == http::StatusCode::PAYLOAD_TOO_LARGE => Err(Refusal::new(
                AdminProblem::BodyTooLarge,
                format!("the body is over {ADMIN_BODY_BYTES_MAX} bytes"),
            )),
            Err(e) => Err(Refusal::invalid(format!(
                "the body could not be read: {}",
                e.body_text()
            ))),
        }
    }
}

/// Each `{name}` of the matched route with its segment as sent (still
/// percent-encoded). Paired from the end, so that a prefix the router was
/// nested under does not matter. Without the matched route (a mount that
/// drops it) nothing could be checked, so the request is refused rather
/// than decoded leniently.
fn raw_params(parts: &Parts) -> Result<Vec<(&str, &str)>, Refusal> {
    let Some(template) = parts.extensions.get::<MatchedPath>() else {
        return Err(Refusal::invalid(
            "the path cannot be checked: no matched route (a router mounted without it)",
        ));
    };
    Ok(template
        .as_str()
        .rsplit('/')
        .zip(parts.uri.path().rsplit('/'))
        .filter_map(|(t, raw)| Some((t.strip_prefix('{')?.strip_suffix('}')?, raw)))
        .collect())
}

/// Refuses what axum's extractors would let through: the
/// `percent-encoding` crate they decode with keeps a `%` without two hex
/// digits as it is (so `k%2` would silently address the key `k%2`), and
/// `Query` replaces bytes that are not UTF-8 (so a cursor would silently
/// point elsewhere). The error completes a sentence naming the input.
pub fn strict_escapes(raw: &str) -> Result<(), String> {
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
    match percent_encoding::percent_decode_str(raw).decode_utf8() {
        Ok(_) => Ok(()),
        Err(_) => Err(format!("{raw:?} is not UTF-8 once percent-decoded")),
    }
}

/// The store's query from the decoded parameters; the error names the
/// parameter.
fn list_query(raw: RawListParams) -> Result<ListQuery, String> {
    if let Some(other) = raw.unknown.keys().next() {
        return Err(format!(
            "query parameter `{other}` is unknown; expected state, limit, after_scope, after_key"
        ));
    }
    let state = match raw.state {
        Some(state) => Some(
            state
                .parse()
                .map_err(|e| format!("query parameter `state`: {e}"))?,
        ),
        None => None,
    };
    let limit = match raw.limit {
        Some(value) => value
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=LIST_LIMIT_MAX).contains(n))
            .ok_or_else(|| {
                format!("query parameter `limit` is {value:?}; expected 1-{LIST_LIMIT_MAX}")
            })?,
        None => ADMIN_LIST_LIMIT_DEFAULT,
    };
    let after = match (raw.after_scope, raw.after_key) {
        (None, None) => None,
        // A position, not a record: it may name a row that cannot be read.
        (Some(scope), Some(key)) => Some(ListCursor { scope, key }),
        _ => {
            return Err(
                "query parameters `after_scope` and `after_key` go together: the `next` of the previous page".into(),
            );
        }
    };
    Ok(ListQuery {
        state,
        after,
        limit,
    })
}
