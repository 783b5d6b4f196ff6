//! RFC 9457 problem responses: every refusal the contract makes has a stable
//! `type` URI, a fixed title and an HTTP status, documented in docs/http.md.
//! [`Problem`] is the one writer of problem documents in idem: the layer and
//! the gateway write [`ProblemKind`]s, the admin API its own catalog through
//! [`ProblemType`].

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};

/// The prefix of every problem `type` URI.
pub const PROBLEM_TYPE_PREFIX: &str = "urn:idem:problem:";

/// The shape of idem's refusals on a route, for clients that read another
/// dialect than RFC 9457 (a route's `error_dialect`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorDialect {
    /// RFC 9457 problem documents (`application/problem+json`).
    #[default]
    Rfc9457,
    /// Stripe's error object, `{"error": {"type", "message", "code"}}`
    /// as `application/json`, so that a Stripe client (stripe-python)
    /// raises its own exception: `type` is `idempotency_error` for the
    /// refusals about the key and `api_error` for the rest, `code` the
    /// problem's slug. A key reused with another request or past
    /// retention is answered 400, as Stripe answers a reused key (Stripe's
    /// clients raise their idempotency exception for a 400 only); every
    /// other status is idem's, and a 409 in flight stays 409, which
    /// Stripe's clients retry.
    Stripe,
}

impl ErrorDialect {
    /// The dialect a config names: `rfc9457` or `stripe`.
    pub fn parse(text: &str) -> Option<ErrorDialect> {
        match text {
            "rfc9457" => Some(ErrorDialect::Rfc9457),
            "stripe" => Some(ErrorDialect::Stripe),
            _ => None,
        }
    }
}

/// How a layer renders the problems it answers: the base of their `type`
/// URIs ([`PROBLEM_TYPE_PREFIX`] unless set, e.g. the published
/// docs/problems.md, whose anchors are the slugs), and a route's dialect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ProblemStyle<'a> {
    pub(crate) type_base: Option<&'a str>,
    pub(crate) dialect: ErrorDialect,
}

impl ProblemStyle<'_> {
    /// Whether a document [`Problem::body`] wrote needs rewriting.
    pub(crate) fn changes_anything(&self) -> bool {
        self.type_base.is_some() || self.dialect != ErrorDialect::Rfc9457
    }

    /// The status, content type and body of `kind`'s document `doc` (as
    /// [`Problem::body`] wrote it) in this style; `None` when `doc` is not
    /// such a document.
    pub(crate) fn restyle(
        &self,
        kind: ProblemKind,
        doc: &[u8],
    ) -> Option<(StatusCode, &'static str, Bytes)> {
        let mut doc: serde_json::Value = serde_json::from_slice(doc).ok()?;
        let object = doc.as_object_mut()?;
        match self.dialect {
            ErrorDialect::Stripe => {
                let message = object.get("detail").cloned().unwrap_or_default();
                let (status, kind_name) = match kind {
                    ProblemKind::KeyReused | ProblemKind::KeyExpired => {
                        (StatusCode::BAD_REQUEST, "idempotency_error")
                    }
                    ProblemKind::MissingKey
                    | ProblemKind::InvalidKey
                    | ProblemKind::RequestInProgress
                    | ProblemKind::OutcomeUnknown => (kind.status(), "idempotency_error"),
                    _ => (kind.status(), "api_error"),
                };
                let error = serde_json::json!({
                    "error": {"type": kind_name, "message": message, "code": kind.slug()}
                });
                Some((status, "application/json", Bytes::from(error.to_string())))
            }
            _ => {
                if let Some(base) = self.type_base {
                    let uri = format!("{base}{}", kind.slug());
                    object.insert("type".to_owned(), serde_json::Value::from(uri));
                }
                let body = Bytes::from(doc.to_string());
                Some((kind.status(), "application/problem+json", body))
            }
        }
    }
}

/// A catalog of problems: each has a stable `type` slug, a fixed title and
/// an HTTP status, and may always carry some headers.
pub trait ProblemType: Copy {
    /// The slug after [`PROBLEM_TYPE_PREFIX`].
    fn slug(self) -> &'static str;
    /// The full `type` URI: [`PROBLEM_TYPE_PREFIX`] and the slug.
    fn type_uri(self) -> String {
        format!("{PROBLEM_TYPE_PREFIX}{}", self.slug())
    }
    /// The fixed title.
    fn title(self) -> &'static str;
    /// The HTTP status.
    fn status(self) -> StatusCode;
    /// Headers every response of this kind carries (a challenge, `Allow`),
    /// besides `Content-Type` and `Retry-After`, which [`Problem`] writes.
    fn headers(self, headers: &mut HeaderMap) {
        let _ = headers;
    }
}

/// A refusal, or a failure the gateway reports instead of an upstream answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemKind {
    /// 400: the route requires a key and none was sent.
    MissingKey,
    /// 400: the key is empty, too long, not visible ASCII, or sent twice.
    InvalidKey,
    /// 400: the body is declared JSON but is not valid JSON (or not exact).
    InvalidBody,
    /// 400: the path is spelled in a way upstreams disagree on; nothing
    /// was claimed or forwarded.
    InvalidPath,
    /// 400: the query of a protected request has a `%` that does not start
    /// an escape of two hex digits, which upstreams read in different
    /// ways; nothing was claimed or forwarded.
    InvalidQuery,
    /// 400: the trusted header naming the tenant is missing, repeated or
    /// malformed; nothing was claimed.
    InvalidPrincipal,
    /// 401: the bearer token is missing or cannot be verified; nothing was
    /// claimed.
    Unauthenticated,
    /// 413: the body is over the route's limit; nothing was claimed.
    BodyTooLarge,
    /// 408: the body did not arrive in full within the gateway's body
    /// deadline; nothing was claimed or forwarded.
    BodyTimeout,
    /// 422: the key was used with a different request.
    KeyReused,
    /// 409: a request with this key is in flight.
    RequestInProgress,
    /// 409: an earlier attempt's outcome is unknown and awaits reconciliation.
    OutcomeUnknown,
    /// 422: the key is past retention; the request is not executed.
    KeyExpired,
    /// 404: the status URL was asked about a key this caller never sent
    /// on the route (or whose tombstone is gone): another principal's key
    /// is answered the same way.
    KeyUnknown,
    /// 503: the idempotency store cannot be reached; nothing was forwarded.
    StoreUnavailable,
    /// 502: the upstream could not be reached; the request was never sent.
    UpstreamUnreachable,
    /// 504: the upstream did not answer in time after the request was sent.
    UpstreamTimeout,
    /// 502: the upstream failed after the request was sent.
    UpstreamFailed,
    /// 502 (replayed): the effect happened but its response was too large to store.
    ResultNotStored,
    /// 503: the gateway is at its limit of requests in flight; nothing was
    /// claimed or forwarded.
    Overloaded,
    /// 421: the key's home is another region and this gateway does not
    /// forward it there (the route says `on_foreign = "problem"`, or the
    /// request was already forwarded once); nothing was claimed here.
    WrongRegion,
    /// 400: the key's home region cannot be derived (no region prefix, an
    /// unknown region, no home header, a principal in no region); nothing
    /// was claimed.
    UnknownHomeRegion,
    /// 503: the key's home region's gateway could not be reached or did not
    /// answer in time; nothing was claimed here.
    PeerUnavailable,
    /// 503: the store granted the lease, but its answer came so late that
    /// too little of the lease was left to forward; the record was
    /// released and nothing was forwarded.
    LeaseSpent,
    /// The store may have lost this key's record (a suspect window after a
    /// failover or a restore) and the provider could not yet say whether
    /// its effect happened; the record was released and nothing was
    /// forwarded.
    Unverified,
}

impl ProblemKind {
    /// The slug after [`PROBLEM_TYPE_PREFIX`].
    pub fn slug(self) -> &'static str {
        match self {
            ProblemKind::MissingKey => "missing-key",
            ProblemKind::InvalidKey => "invalid-key",
            ProblemKind::InvalidBody => "invalid-body",
            ProblemKind::InvalidPath => "invalid-path",
            ProblemKind::InvalidQuery => "invalid-query",
            ProblemKind::InvalidPrincipal => "invalid-principal",
            ProblemKind::Unauthenticated => "unauthenticated",
            ProblemKind::BodyTooLarge => "body-too-large",
            ProblemKind::BodyTimeout => "body-timeout",
            ProblemKind::KeyReused => "key-reused",
            ProblemKind::RequestInProgress => "request-in-progress",
            ProblemKind::OutcomeUnknown => "outcome-unknown",
            ProblemKind::KeyExpired => "key-expired",
            ProblemKind::KeyUnknown => "key-unknown",
            ProblemKind::StoreUnavailable => "store-unavailable",
            ProblemKind::UpstreamUnreachable => "upstream-unreachable",
            ProblemKind::UpstreamTimeout => "upstream-timeout",
            ProblemKind::UpstreamFailed => "upstream-failed",
            ProblemKind::ResultNotStored => "result-not-stored",
            ProblemKind::Overloaded => "overloaded",
            ProblemKind::WrongRegion => "wrong-region",
            ProblemKind::UnknownHomeRegion => "unknown-home-region",
            ProblemKind::PeerUnavailable => "peer-unavailable",
            ProblemKind::LeaseSpent => "lease-spent",
            ProblemKind::Unverified => "unverified",
        }
    }

    /// The fixed title.
    pub fn title(self) -> &'static str {
        match self {
            ProblemKind::MissingKey => "Idempotency-Key is missing",
            ProblemKind::InvalidKey => "Idempotency-Key is malformed",
            ProblemKind::InvalidBody => "Request body cannot be fingerprinted",
            ProblemKind::InvalidPath => "Request path is ambiguous",
            ProblemKind::InvalidQuery => "Request query is ambiguous",
            ProblemKind::InvalidPrincipal => "The principal of the request cannot be read",
            ProblemKind::Unauthenticated => "The request's credential cannot be verified",
            ProblemKind::BodyTooLarge => "Request body is too large",
            ProblemKind::BodyTimeout => "Request body did not arrive in time",
            ProblemKind::KeyReused => "Idempotency-Key is already used",
            ProblemKind::RequestInProgress => "A request is outstanding for this Idempotency-Key",
            ProblemKind::OutcomeUnknown => {
                "The outcome of the request with this Idempotency-Key is unknown"
            }
            ProblemKind::KeyExpired => "Idempotency-Key has expired",
            ProblemKind::KeyUnknown => "No request is known for this Idempotency-Key",
            ProblemKind::StoreUnavailable => "Idempotency store is unavailable",
            ProblemKind::UpstreamUnreachable => "Upstream is unreachable",
            ProblemKind::UpstreamTimeout => "Upstream did not answer in time",
            ProblemKind::UpstreamFailed => "Upstream failed",
            ProblemKind::ResultNotStored => idem_core::RESULT_NOT_STORED_TITLE,
            ProblemKind::Overloaded => "The gateway is serving as many requests as it may",
            ProblemKind::WrongRegion => "The key's home is another region",
            ProblemKind::UnknownHomeRegion => "The key's home region cannot be derived",
            ProblemKind::PeerUnavailable => "The key's home region cannot be reached",
            ProblemKind::LeaseSpent => "The idempotency store answered too late to forward",
            ProblemKind::Unverified => {
                "The key could not be verified after the store may have lost records"
            }
        }
    }

    /// The HTTP status.
    pub fn status(self) -> StatusCode {
        match self {
            ProblemKind::MissingKey
            | ProblemKind::InvalidKey
            | ProblemKind::InvalidBody
            | ProblemKind::InvalidPath
            | ProblemKind::InvalidQuery
            | ProblemKind::InvalidPrincipal
            | ProblemKind::UnknownHomeRegion => StatusCode::BAD_REQUEST,
            ProblemKind::Unauthenticated => StatusCode::UNAUTHORIZED,
            ProblemKind::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProblemKind::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            ProblemKind::KeyReused | ProblemKind::KeyExpired => StatusCode::UNPROCESSABLE_ENTITY,
            ProblemKind::RequestInProgress | ProblemKind::OutcomeUnknown => StatusCode::CONFLICT,
            ProblemKind::StoreUnavailable
            | ProblemKind::Overloaded
            | ProblemKind::PeerUnavailable
            | ProblemKind::LeaseSpent
            | ProblemKind::Unverified => StatusCode::SERVICE_UNAVAILABLE,
            ProblemKind::WrongRegion => StatusCode::MISDIRECTED_REQUEST,
            ProblemKind::KeyUnknown => StatusCode::NOT_FOUND,
            ProblemKind::UpstreamUnreachable
            | ProblemKind::UpstreamFailed
            | ProblemKind::ResultNotStored => StatusCode::BAD_GATEWAY,
            ProblemKind::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// Every kind, for documentation and tests.
    pub const ALL: [ProblemKind; 25] = [
        ProblemKind::MissingKey,
        ProblemKind::InvalidKey,
        ProblemKind::InvalidBody,
        ProblemKind::InvalidPath,
        ProblemKind::InvalidQuery,
        ProblemKind::InvalidPrincipal,
        ProblemKind::Unauthenticated,
        ProblemKind::BodyTooLarge,
        ProblemKind::BodyTimeout,
        ProblemKind::KeyReused,
        ProblemKind::RequestInProgress,
        ProblemKind::OutcomeUnknown,
        ProblemKind::KeyExpired,
        ProblemKind::KeyUnknown,
        ProblemKind::StoreUnavailable,
        ProblemKind::UpstreamUnreachable,
        ProblemKind::UpstreamTimeout,
        ProblemKind::UpstreamFailed,
        ProblemKind::ResultNotStored,
        ProblemKind::Overloaded,
        ProblemKind::WrongRegion,
        ProblemKind::UnknownHomeRegion,
        ProblemKind::PeerUnavailable,
        ProblemKind::LeaseSpent,
        ProblemKind::Unverified,
    ];
}

impl ProblemType for ProblemKind {
    fn slug(self) -> &'static str {
        ProblemKind::slug(self)
    }

    fn title(self) -> &'static str {
        ProblemKind::title(self)
    }

    fn status(self) -> StatusCode {
        ProblemKind::status(self)
    }

    fn headers(self, headers: &mut HeaderMap) {
        if self == ProblemKind::Unauthenticated {
            // RFC 9110 §11.6.1: a 401 carries a challenge.
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
    }
}

/// A problem with its instance detail, ready to become a response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem<K = ProblemKind> {
    /// Which problem.
    pub kind: K,
    /// What happened in this instance, for a person.
    pub detail: String,
    /// Seconds for `Retry-After`, if the client should retry later.
    pub retry_after_s: Option<u64>,
    /// Extension members (RFC 9457 §3.2), e.g. `home_region`.
    pub members: Vec<(&'static str, String)>,
}

impl<K: ProblemType> Problem<K> {
    /// A problem without `Retry-After`.
    pub fn new(kind: K, detail: impl Into<String>) -> Problem<K> {
        Problem {
            kind,
            detail: detail.into(),
            retry_after_s: None,
            members: Vec::new(),
        }
    }

    /// Adds an extension member with a string value; the standard members
    /// (`type`, `title`, `status`, `detail`) cannot be replaced.
    pub fn member(mut self, name: &'static str, value: impl Into<String>) -> Problem<K> {
        if !["type", "title", "status", "detail"].contains(&name) {
            self.members.push((name, value.into()));
        }
        self
    }

    /// Adds `Retry-After`, in whole seconds (at least 1).
    pub fn retry_after(mut self, seconds: u64) -> Problem<K> {
        self.retry_after_s = Some(seconds.max(1));
        self
    }

    /// The JSON body.
    pub fn body(&self) -> Bytes {
        let mut doc = serde_json::json!({
            "type": self.kind.type_uri(),
            "title": self.kind.title(),
            "status": self.kind.status().as_u16(),
            "detail": self.detail,
        });
        if let Some(object) = doc.as_object_mut() {
            for (name, value) in &self.members {
                object.insert((*name).to_owned(), serde_json::Value::from(value.as_str()));
            }
        }
        Bytes::from(doc.to_string())
    }

    /// The response, with `Content-Type: application/problem+json`, the
    /// kind's own headers and `Retry-After` when set.
    pub fn into_response<B: From<Bytes>>(self) -> Response<B> {
        let mut response = Response::new(B::from(self.body()));
        *response.status_mut() = self.kind.status();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        self.kind.headers(headers);
        if let Some(seconds) = self.retry_after_s {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Stripe dialect: the error object, its type by kind, 400 only for
    /// a reused or expired key; the base replaces only the type's prefix.
    #[test]
    fn restyles_into_stripe_s_error_object_and_under_a_base() {
        let stripe = ProblemStyle {
            type_base: None,
            dialect: ErrorDialect::Stripe,
        };
        let cases = [
            (ProblemKind::KeyReused, 400, "idempotency_error"),
            (ProblemKind::KeyExpired, 400, "idempotency_error"),
            (ProblemKind::RequestInProgress, 409, "idempotency_error"),
            (ProblemKind::OutcomeUnknown, 409, "idempotency_error"),
            (ProblemKind::MissingKey, 400, "idempotency_error"),
            (ProblemKind::StoreUnavailable, 503, "api_error"),
            (ProblemKind::UpstreamTimeout, 504, "api_error"),
        ];
        for (kind, status, error_type) in cases {
            let doc = Problem::new(kind, "why").body();
            let (got, content_type, body) = stripe.restyle(kind, &doc).unwrap_or_default();
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            assert_eq!(got.as_u16(), status, "{kind:?}");
            assert_eq!(content_type, "application/json");
            let expect = serde_json::json!({"error": {
                "type": error_type, "message": "why", "code": kind.slug()
            }});
            assert_eq!(body, expect, "{kind:?}");
        }
        let based = ProblemStyle {
            type_base: Some("https://docs.example.com/p#"),
            dialect: ErrorDialect::Rfc9457,
        };
        let doc = Problem::new(ProblemKind::KeyReused, "why").body();
        let (status, content_type, body) = based
            .restyle(ProblemKind::KeyReused, &doc)
            .unwrap_or_default();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        assert_eq!(
            (status.as_u16(), content_type),
            (422, "application/problem+json")
        );
        assert_eq!(body["type"], "https://docs.example.com/p#key-reused");
        assert_eq!(body["detail"], "why");
        let plain = ProblemStyle {
            type_base: None,
            dialect: ErrorDialect::Rfc9457,
        };
        assert!(!plain.changes_anything() && based.changes_anything());
    }

    /// Every kind this layer and the gateway can answer has its section in
    /// docs/problems.md, under an anchor named by its slug, with the
    /// status and title the code answers: the page a `type` dereferences to.
    #[test]
    fn every_problem_kind_has_its_anchor_in_the_problems_page() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/problems.md");
        let page = std::fs::read_to_string(path).unwrap_or_default();
        assert!(!page.is_empty(), "{path} cannot be read");
        let missing: Vec<String> = ProblemKind::ALL
            .iter()
            .map(|kind| {
                let (slug, status) = (kind.slug(), kind.status().as_u16());
                format!(
                    "<a id=\"{slug}\"></a>\n### {slug}\n\n{status} — \"{}\".",
                    kind.title()
                )
            })
            .filter(|section| !page.contains(section.as_str()))
            .collect();
        assert!(missing.is_empty(), "not in docs/problems.md: {missing:#?}");
    }

    /// The result a record keeps when an answer cannot be stored is written
    /// by the core (the consumer stores it too), as this catalog's problem.
    #[test]
    fn the_core_s_result_not_stored_is_the_catalog_s_problem() {
        let stored = idem_core::StoredResult::not_stored("why");
        let kind = ProblemKind::ResultNotStored;
        let doc: serde_json::Value =
            serde_json::from_slice(stored.body()).unwrap_or(serde_json::Value::Null);
        assert_eq!(doc["type"], kind.type_uri().as_str());
        assert_eq!(doc["title"], kind.title());
        assert_eq!(doc["status"], kind.status().as_u16());
        assert_eq!(stored.status(), kind.status().as_u16());
        assert!(
            doc["detail"].as_str().is_some_and(|d| d.ends_with(": why")),
            "{doc}"
        );
        assert_eq!(
            stored.headers(),
            [(
                "content-type".to_owned(),
                idem_core::HeaderBytes::from("application/problem+json")
            )]
        );
    }
}
