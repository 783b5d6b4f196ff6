//! The admin API's problems: its own catalog of `type` URIs, titles and
//! statuses (the table in docs/operations.md), written by the one problem
//! writer, [`idem_http::Problem`].

use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use idem_http::{Problem, ProblemType};

/// A refusal of the admin API, ready to be answered.
#[derive(Debug)]
pub(super) struct Refusal(pub(super) Problem<AdminProblem>);

/// Every problem the admin API answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AdminProblem {
    Unauthorized,
    NotFound,
    /// The methods the path allows, for `Allow`.
    MethodNotAllowed(&'static str),
    InvalidRequest,
    BodyTooLarge,
    RecordNotFound,
    NotAmbiguous,
    NotCompleted,
    OtherAttempt,
    MayStillCommit,
    StoreUnavailable,
    StoreFailed,
}

impl Refusal {
    pub(super) fn new(kind: AdminProblem, detail: impl Into<String>) -> Refusal {
        let problem = Problem::new(kind, detail);
        Refusal(match kind {
            AdminProblem::StoreUnavailable => problem.retry_after(1),
            _ => problem,
        })
    }

    /// A 400 `invalid-request` saying `detail`.
    pub(super) fn invalid(detail: impl Into<String>) -> Refusal {
        Refusal::new(AdminProblem::InvalidRequest, detail)
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        self.0.into_response()
    }
}

impl ProblemType for AdminProblem {
    fn slug(self) -> &'static str {
        self.describe().1
    }

    fn title(self) -> &'static str {
        self.describe().2
    }

    fn status(self) -> StatusCode {
        self.describe().0
    }

    fn headers(self, headers: &mut HeaderMap) {
        match self {
            AdminProblem::Unauthorized => {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"idem-admin\""),
                );
            }
            AdminProblem::MethodNotAllowed(allow) => {
                headers.insert(header::ALLOW, HeaderValue::from_static(allow));
            }
            _ => {}
        }
    }
}

impl AdminProblem {
    /// Status, `type` slug and title.
    fn describe(self) -> (StatusCode, &'static str, &'static str) {
        use AdminProblem::*;
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
            NotCompleted => (
                StatusCode::CONFLICT,
                "not-completed",
                "The record is not completed",
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
mod tests {
    use super::*;

    /// Every admin problem has a section in docs/problems.md: under its
    /// own anchor, or, for a slug the contract's catalog shares, under
    /// `admin: SLUG` pointing at the contract's anchor.
    #[test]
    fn every_admin_problem_has_its_section_in_the_problems_page() {
        use AdminProblem::*;
        let all = [
            Unauthorized,
            NotFound,
            MethodNotAllowed("GET"),
            InvalidRequest,
            BodyTooLarge,
            RecordNotFound,
            NotAmbiguous,
            NotCompleted,
            OtherAttempt,
            MayStillCommit,
            StoreUnavailable,
            StoreFailed,
        ];
        // A variant added to the enum and not to `all` fails to compile here.
        for kind in all {
            match kind {
                Unauthorized | NotFound | MethodNotAllowed(_) | InvalidRequest | BodyTooLarge
                | RecordNotFound | NotAmbiguous | NotCompleted | OtherAttempt | MayStillCommit
                | StoreUnavailable | StoreFailed => {}
            }
        }
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/problems.md");
        let page = std::fs::read_to_string(path).unwrap_or_default();
        assert!(!page.is_empty(), "{path} cannot be read");
        for kind in all {
            let (status, slug, title) = kind.describe();
            let status = status.as_u16();
            let own = format!("<a id=\"{slug}\"></a>\n### {slug}\n\n{status} — \"{title}\".");
            let shared = format!("### admin: {slug}\n\n{status} — \"{title}\".");
            assert!(
                page.contains(&own) || page.contains(&shared),
                "{slug}: no section in docs/problems.md"
            );
        }
    }
}
