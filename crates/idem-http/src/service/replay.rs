//! Stored answers as responses: a replay of a completed record with its
//! headers (`Idempotent-Replayed`, `Idempotency-Expires`), the headers
//! worth storing from an upstream's answer, and the headers only this
//! layer may set.

use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, header};
use idem_core::{Record, StoredResult};

use super::REPLAYED_HEADER;
use super::refusal::problem;
use crate::problem::{Problem, ProblemKind};

/// The headers only this layer may set: what an upstream sends under
/// these names never reaches the client. An upstream's own
/// `Idempotency-Expires` on an answer that was not recorded (a 500 after
/// the effect) could make a client believe its key expired and mint a new
/// one; its `Idempotent-Replayed: true` on a first execution would hide
/// that the effect just ran.
pub const OWNED_HEADERS: [&str; 2] = [REPLAYED_HEADER, EXPIRES_HEADER];

pub(super) fn without_owned_headers<B>(mut response: Response<B>) -> Response<B> {
    for name in OWNED_HEADERS {
        response.headers_mut().remove(name);
    }
    response
}

/// The response headers worth replaying: the allow-list plus the route's
/// own (`extra`).
pub(super) fn replay_headers(
    headers: &http::HeaderMap,
    extra: &[HeaderName],
) -> Vec<(String, idem_core::HeaderBytes)> {
    let allowed = [
        header::CONTENT_TYPE,
        header::LOCATION,
        header::CONTENT_LOCATION,
    ];
    allowed
        .iter()
        .chain(extra)
        .filter(|name| !OWNED_HEADERS.contains(&name.as_str()))
        .flat_map(|name| {
            headers
                .get_all(name)
                .iter()
                .map(move |v| (name.as_str().to_owned(), v.as_bytes().into()))
        })
        .collect()
}

/// The header that says until when a stored result is replayed: an HTTP
/// date, from the record's `expires_at` (the store's clock).
pub const EXPIRES_HEADER: &str = "idempotency-expires";

/// Adds [`EXPIRES_HEADER`] for a record that expires at `expires_at`.
pub(super) fn with_expiry<B>(
    mut response: Response<B>,
    expires_at: Option<idem_core::Timestamp>,
) -> Response<B> {
    let Some(at) = expires_at else {
        return response;
    };
    let Some(when) = UNIX_EPOCH.checked_add(Duration::from_millis(at.as_millis())) else {
        return response;
    };
    if let Ok(value) = HeaderValue::from_str(&httpdate::fmt_http_date(when)) {
        response
            .headers_mut()
            .insert(HeaderName::from_static(EXPIRES_HEADER), value);
    }
    response
}

pub(super) fn replay<B: From<Bytes>>(record: &Record) -> Response<B> {
    match &record.result {
        Some(result) => with_expiry(stored_response(result, true), record.expires_at),
        // A completed record always carries its result; a missing one means
        // the store lost it, which must not be answered as a fresh success.
        None => problem(Problem::new(
            ProblemKind::ResultNotStored,
            "the stored result is missing",
        )),
    }
}

pub(super) fn stored_response<B: From<Bytes>>(
    result: &StoredResult,
    replayed: bool,
) -> Response<B> {
    let mut response = Response::new(B::from(Bytes::copy_from_slice(result.body())));
    *response.status_mut() =
        http::StatusCode::from_u16(result.status()).unwrap_or(http::StatusCode::BAD_GATEWAY);
    let headers = response.headers_mut();
    for (name, value) in result.headers() {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) {
            headers.append(name, value);
        }
    }
    if replayed {
        headers.insert(
            HeaderName::from_static(REPLAYED_HEADER),
            HeaderValue::from_static("true"),
        );
    }
    response
}
