//! Reading what the contract needs out of a request: the key, the principal,
//! the scope, the fingerprint. Each returns a problem instead of guessing.

use bytes::Bytes;
use http::HeaderMap;
use http::request::Parts;
use idem_core::{Fingerprint, FingerprintError, IdempotencyKey, RequestParts, Scope, to_hex};
use sha2::{Digest, Sha256};

use crate::problem::{Problem, ProblemKind};
use crate::route::{Operation, Route};

/// Operations longer than this are replaced by their digest in the scope.
const OPERATION_BYTES_MAX: usize = 512;

/// The key of a request: `Ok(None)` when the header is absent.
pub(crate) fn key(headers: &HeaderMap, route: &Route) -> Result<Option<IdempotencyKey>, Problem> {
    let mut values = headers.get_all(&route.key_header).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let name = route.key_header.as_str();
    if values.next().is_some() {
        return Err(Problem::new(
            ProblemKind::InvalidKey,
            format!("{name} was sent more than once"),
        ));
    }
    let text = value.to_str().map_err(|_| {
        Problem::new(
            ProblemKind::InvalidKey,
            format!("{name} is not visible ASCII"),
        )
    })?;
    IdempotencyKey::parse(text)
        .map(Some)
        .map_err(|e| Problem::new(ProblemKind::InvalidKey, format!("{name}: {e}")))
}

/// The scope: operation plus the route's principal (always a digest, so
/// raw credentials and tenant names never reach the store); and the
/// principal's own value when it is a trusted header or a verified claim.
pub(crate) fn scope(parts: &Parts, route: &Route) -> Result<(Scope, Option<String>), Problem> {
    let operation = match &route.operation {
        Operation::Named(name) => name.clone(),
        Operation::MethodAndPath | Operation::MethodAndMatchedPath => {
            let matched = match route.operation {
                Operation::MethodAndMatchedPath => matched_path(parts),
                _ => None,
            };
            let path = match matched {
                Some(pattern) => pattern.to_owned(),
                None => crate::path::operation_path(parts.uri.path()),
            };
            // Upper-cased, as the route matched it: `post` and `POST` reach
            // the same handler of a lenient upstream, so they share a scope
            // (and the fingerprint, which keeps the spelling, tells them apart).
            let method = parts.method.as_str().to_ascii_uppercase();
            let op = format!("{method} {}", path.replace('|', "%7C"));
            if op.len() > OPERATION_BYTES_MAX {
                format!("{method} sha256:{}", to_hex(&Sha256::digest(path)))
            } else {
                op
            }
        }
    };
    let (principal, value) = route.principal.identify(parts)?;
    let scope = Scope::from_parts(&operation, &principal, None)
        .map_err(|e| Problem::new(ProblemKind::InvalidKey, format!("cannot form a scope: {e}")))?;
    Ok((scope, value))
}

/// The path pattern the router matched, when the layer runs inside one
/// that says (axum's `MatchedPath`, with the `axum` feature): one
/// operation per route, `POST /payouts/{id}`, not one per resource.
#[cfg(feature = "axum")]
fn matched_path(parts: &Parts) -> Option<&str> {
    parts
        .extensions
        .get::<axum::extract::MatchedPath>()
        .map(|m| m.as_str())
}

#[cfg(not(feature = "axum"))]
fn matched_path(_parts: &Parts) -> Option<&str> {
    None
}

/// The request's fingerprint in the current canonical form (version 2),
/// per the route's declarations.
pub(crate) fn fingerprint(
    parts: &Parts,
    route: &Route,
    body: &Bytes,
) -> Result<Fingerprint, Problem> {
    with_request_parts(parts, route, body, |request| {
        Fingerprint::of_request(request).map_err(|e| match e {
            FingerprintError::MalformedQuery { .. } => Problem::new(
                ProblemKind::InvalidQuery,
                format!("{e}; nothing was claimed or forwarded"),
            ),
            e => Problem::new(
                ProblemKind::InvalidBody,
                format!("the JSON body cannot be fingerprinted: {e}"),
            ),
        })
    })
}

/// The request's version 1 fingerprint, where version 1 reads it exactly.
/// Computed only when a claim finds a record whose fingerprint is not the
/// version 2 one: records written before version 2 are the only ones that
/// can hold it, so ordinary requests never pay for a second canonical form.
pub(crate) fn legacy_fingerprint(
    parts: &Parts,
    route: &Route,
    body: &Bytes,
) -> Option<Fingerprint> {
    with_request_parts(parts, route, body, Fingerprint::of_request_v1)
}

/// The parts of the request a fingerprint reads, per the route's
/// declarations, lent to `f`.
fn with_request_parts<T>(
    parts: &Parts,
    route: &Route,
    body: &Bytes,
    f: impl FnOnce(&RequestParts<'_>) -> T,
) -> T {
    let content_types: Vec<&[u8]> = parts
        .headers
        .get_all(http::header::CONTENT_TYPE)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    let headers: Vec<(&str, &[u8])> = route
        .fingerprint_headers
        .iter()
        .flat_map(|name| {
            parts
                .headers
                .get_all(name)
                .iter()
                .map(move |v| (name.as_str(), v.as_bytes()))
        })
        .collect();
    f(&RequestParts {
        method: parts.method.as_str(),
        route: route.pattern.as_str(),
        path: parts.uri.path(),
        query: parts.uri.query().unwrap_or(""),
        content_types: &content_types,
        headers: &headers,
        body,
        exclude: &route.fingerprint_exclude,
    })
}
