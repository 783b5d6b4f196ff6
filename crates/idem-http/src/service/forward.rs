//! The effect of a protected request: the one call of the inner service,
//! with the key forwarded, the lease's deadline in its extensions and the
//! trace context passed on, and its answer as the attempt driver judges it
//! ([`Forwarded`]): a status, or how the call failed, and for a final
//! answer the body read and kept for replay.

use std::time::Instant;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, header};
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, Limited};
use idem_attempt::{Answer, Granted};
use idem_core::{AMBIGUITY_EXCERPT_BYTES_MAX, AttemptOutcome, EffectEnd, RecordId, StoredResult};
use tower::Service;
use tracing::Instrument;

use super::hooks::Hooks;
use super::replay::{replay_headers, without_owned_headers};
use super::{BoxError, RESPONSE_BYTES_MAX};
use crate::problem::ProblemKind;
use crate::route::Route;
use crate::trace;

/// When a forward's lease ends, less its margin, in the gateway's own
/// monotonic time ([`idem_core::lease`]): the layer cuts the forward there
/// and puts this in the forwarded request's extensions, so that an inner
/// service with deadlines of its own can keep within it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseDeadline(pub Instant);

/// The inner service's answer, or its error's text.
pub(super) struct Forwarded<'r, B> {
    outcome: Result<Response<B>, String>,
    /// The headers worth replaying beyond the allow-list (the route's).
    extra: &'r [HeaderName],
}

/// Forwards the request the hooks hold within the lease `granted`.
pub(super) async fn forward<'r, S, ReqBody, ResBody>(
    mut inner: S,
    route: &'r Route,
    hooks: &Hooks<'_>,
    granted: Granted,
) -> Forwarded<'r, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: std::fmt::Display,
    ReqBody: From<Bytes>,
{
    let extra = route.replay_headers.as_slice();
    let Some((mut parts, body)) = hooks.take_request() else {
        let outcome = Err("internal: the request was forwarded already".to_owned());
        return Forwarded { outcome, extra };
    };
    parts.extensions.insert(LeaseDeadline(granted.deadline));
    forward_key(&mut parts.headers, route, &granted.id);
    let span = trace::forward_span(&granted.id);
    trace::propagate(&span, &mut parts.headers);
    hooks.forwarding(span.clone());
    let req = Request::from_parts(parts, ReqBody::from(body));
    let outcome = span
        .in_scope(|| inner.call(req))
        .instrument(span.clone())
        .await;
    hooks.forwarded(&outcome);
    let outcome = outcome
        .map(without_owned_headers)
        .map_err(|e| e.to_string());
    Forwarded { outcome, extra }
}

impl<B> Forwarded<'_, B> {
    /// The answer passed on when it is not stored: the upstream's response,
    /// or a problem for its error.
    pub(super) fn into_response(self) -> Result<Response<B>, String> {
        self.outcome
    }
}

impl<'r, B> Answer for Forwarded<'r, B>
where
    B: HttpBody + From<Bytes> + Send,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Kept = Option<Response<B>>;

    fn end(&self) -> EffectEnd {
        match &self.outcome {
            Err(_) => EffectEnd::Failed(AttemptOutcome::Lost),
            Ok(response) => match response.extensions().get::<AttemptOutcome>() {
                Some(failure) => EffectEnd::Failed(*failure),
                None => EffectEnd::Answered {
                    status: response.status().as_u16(),
                },
            },
        }
    }

    fn cause(&self) -> String {
        match &self.outcome {
            Err(e) => format!("the inner service failed: {e}"),
            Ok(response) => match response.extensions().get::<ProblemKind>() {
                Some(kind) => kind.slug().to_owned(),
                None => format!("upstream answered {}", response.status().as_u16()),
            },
        }
    }

    /// Reads the body (up to [`RESPONSE_BYTES_MAX`]) and keeps what is
    /// worth replaying; a body that cannot be read or kept is stored as
    /// not stored, since the effect happened either way.
    async fn keep(self) -> Option<(StoredResult, Self::Kept)> {
        let response = self.outcome.ok()?;
        let (parts, body) = response.into_parts();
        let read = Limited::new(body, RESPONSE_BYTES_MAX).collect().await;
        let stored_headers = replay_headers(&parts.headers, self.extra);
        Some(match read {
            Ok(collected) => {
                let bytes = collected.to_bytes();
                let status = parts.status.as_u16();
                let result = StoredResult::new(status, stored_headers, bytes.to_vec())
                    .unwrap_or_else(|e| StoredResult::not_stored(&e.to_string()));
                (result, Some(Response::from_parts(parts, B::from(bytes))))
            }
            Err(e) => {
                let why = format!("the body could not be read: {e}");
                (StoredResult::not_stored(&why), None)
            }
        })
    }

    /// Reads a non-final answer's body when its length is known and within
    /// [`RESPONSE_BYTES_MAX`] and puts it back whole, so the caller gets
    /// the answer unchanged; a body of unknown or larger length is not
    /// read (no excerpt). A body that fails while read (or is cut at the
    /// lease's deadline) is passed on empty: it could not have been passed
    /// on whole anyway.
    async fn excerpt(&mut self) -> Option<Vec<u8>> {
        let response = self.outcome.as_mut().ok()?;
        let known = response.body().size_hint().upper();
        if known.is_none_or(|bytes| bytes > RESPONSE_BYTES_MAX as u64) {
            return None;
        }
        // Until the body is back, the response says no length: cut at the
        // deadline or failed, it is passed on empty, and an empty body must
        // not announce the length of the one that was lost.
        let length = response.headers_mut().remove(header::CONTENT_LENGTH);
        let body = std::mem::replace(response.body_mut(), B::from(Bytes::new()));
        let bytes = Limited::new(body, RESPONSE_BYTES_MAX)
            .collect()
            .await
            .ok()?
            .to_bytes();
        let head = bytes[..bytes.len().min(AMBIGUITY_EXCERPT_BYTES_MAX)].to_vec();
        if let Some(length) = length {
            // The whole body is back: what the header said still holds.
            response
                .headers_mut()
                .insert(header::CONTENT_LENGTH, length);
        }
        *response.body_mut() = B::from(bytes);
        Some(head)
    }

    /// A panicking inner service answers a 500, judged by the route's
    /// completion rule for a 500 like any other.
    fn after_panic() -> Option<Self> {
        tracing::error!("the inner service panicked while handling a protected request");
        let mut response = Response::new(B::from(Bytes::from_static(
            b"the request handler failed; its effect may have happened",
        )));
        *response.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        Some(Forwarded {
            outcome: Ok(response),
            extra: &[],
        })
    }
}

fn forward_key(headers: &mut http::HeaderMap, route: &Route, id: &RecordId) {
    let value = route.forwarded_key(id);
    // The key is visible ASCII and so is the digest; a template's own text
    // was checked at load time, so this only fails on a template bug.
    let Ok(value) = HeaderValue::from_str(&value) else {
        tracing::error!(template_value = %value, "forwarded key is not a valid header value");
        return;
    };
    if route.forward_header != route.key_header {
        headers.remove(&route.key_header);
    }
    headers.insert(route.forward_header.clone(), value);
}
