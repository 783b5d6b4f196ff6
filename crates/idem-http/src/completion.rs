//! What the upstream's answer means for the record (DESIGN.md "Completing an
//! attempt"): store it as final, release the key, or mark the outcome
//! unknown. Safe defaults, overridable per route by status.

use http::StatusCode;
use serde::Deserialize;

/// What to do with the record once the upstream answered (or failed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// A final result: store it and replay it to every retry.
    Final,
    /// Not processed: remove the record so a retry may run.
    Release,
    /// Unknown outcome: mark the record ambiguous; never re-execute blindly.
    Unknown,
}

/// How a failed attempt to reach the upstream ended, attached by the proxy
/// as a response extension so the layer can tell "never sent" from
/// "sent, then lost".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// The request never left (connection refused, connect timeout).
    NotSent,
    /// The request was sent and the answer was lost (timeout, reset).
    Lost,
}

/// Per-route overrides, by status code.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CompletionSpec {
    /// Statuses stored and replayed.
    #[serde(rename = "final")]
    pub final_statuses: Option<Vec<u16>>,
    /// Statuses that release the key.
    pub release: Option<Vec<u16>>,
    /// Statuses whose outcome is unknown.
    pub unknown: Option<Vec<u16>>,
}

/// The validated completion table of one route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletionPolicy {
    overrides: Vec<(u16, Completion)>,
    upstream_dedups: bool,
}

impl CompletionPolicy {
    /// The defaults plus `spec`'s overrides. With `upstream_dedups`, an
    /// unknown outcome releases: the upstream will not repeat the effect.
    pub fn new(spec: Option<&CompletionSpec>, upstream_dedups: bool) -> Result<Self, String> {
        let mut overrides: Vec<(u16, Completion)> = Vec::new();
        if let Some(spec) = spec {
            let lists = [
                ("final", &spec.final_statuses, Completion::Final),
                ("release", &spec.release, Completion::Release),
                ("unknown", &spec.unknown, Completion::Unknown),
            ];
            for (name, list, completion) in lists {
                for &status in list.iter().flatten() {
                    if !(100..=599).contains(&status) {
                        return Err(format!("{name}: {status} is not an HTTP status"));
                    }
                    if let Some((_, other)) = overrides.iter().find(|(s, _)| *s == status) {
                        return Err(format!(
                            "{status} is listed twice ({other:?} and {completion:?})"
                        ));
                    }
                    overrides.push((status, completion));
                }
            }
        }
        Ok(CompletionPolicy {
            overrides,
            upstream_dedups,
        })
    }

    /// What an upstream status means.
    pub fn classify(&self, status: StatusCode) -> Completion {
        let code = status.as_u16();
        let declared = self
            .overrides
            .iter()
            .find(|(s, _)| *s == code)
            .map(|(_, c)| *c);
        let completion = declared.unwrap_or_else(|| default_for(code));
        self.dedup_adjusted(completion)
    }

    /// What a failed attempt means.
    pub fn classify_failure(&self, outcome: AttemptOutcome) -> Completion {
        match outcome {
            AttemptOutcome::NotSent => Completion::Release,
            AttemptOutcome::Lost => self.dedup_adjusted(Completion::Unknown),
        }
    }

    fn dedup_adjusted(&self, completion: Completion) -> Completion {
        match completion {
            Completion::Unknown if self.upstream_dedups => Completion::Release,
            other => other,
        }
    }
}

/// The default meaning of a status. Only a status that by definition says
/// the request was not processed releases; a status that is usually but not
/// provably harmless is unknown, because releasing it lets a retry run the
/// effect a second time. Routes opt in to more with `completion`.
fn default_for(code: u16) -> Completion {
    match code {
        // 421 Misdirected Request (RFC 9110 §15.5.20) and 425 Too Early
        // (RFC 8470 §5.2): the server declined before processing, and both
        // RFCs let a client retry even a non-idempotent request.
        421 | 425 => Completion::Release,
        // 408 Request Timeout: by definition the request was incomplete, but
        // meshes, load balancers and frameworks also answer it when their
        // own deadline passes while the application is working.
        408 => Completion::Unknown,
        // 409 Conflict: an upstream that dedups answers it for "already
        // done" or "in progress" (the effect happened or may happen); a
        // stored 409 would hide the real result, a release would repeat it.
        409 => Completion::Unknown,
        // 429 Too Many Requests: a rate limiter usually refuses before any
        // work, but nothing in the status proves that it did.
        429 => Completion::Unknown,
        // Every other 1xx-4xx is the upstream's final word on this request.
        100..=499 => Completion::Final,
        // 5xx, 503 included: a mesh or proxy may answer it after the
        // application committed.
        _ => Completion::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_table() {
        let safe = CompletionPolicy::new(None, false).unwrap();
        let dedups = CompletionPolicy::new(None, true).unwrap();
        let cases = [
            (200, Completion::Final, Completion::Final),
            (201, Completion::Final, Completion::Final),
            (302, Completion::Final, Completion::Final),
            (400, Completion::Final, Completion::Final),
            (404, Completion::Final, Completion::Final),
            (422, Completion::Final, Completion::Final),
            (401, Completion::Final, Completion::Final),
            (421, Completion::Release, Completion::Release),
            (425, Completion::Release, Completion::Release),
            (408, Completion::Unknown, Completion::Release),
            (409, Completion::Unknown, Completion::Release),
            (429, Completion::Unknown, Completion::Release),
            (503, Completion::Unknown, Completion::Release),
            (500, Completion::Unknown, Completion::Release),
            (502, Completion::Unknown, Completion::Release),
            (504, Completion::Unknown, Completion::Release),
            (599, Completion::Unknown, Completion::Release),
        ];
        for (status, expect_safe, expect_dedups) in cases {
            let s = StatusCode::from_u16(status).unwrap();
            assert_eq!(safe.classify(s), expect_safe, "{status}");
            assert_eq!(
                dedups.classify(s),
                expect_dedups,
                "{status} with upstream_dedups"
            );
        }
        assert_eq!(
            safe.classify_failure(AttemptOutcome::NotSent),
            Completion::Release
        );
        assert_eq!(
            safe.classify_failure(AttemptOutcome::Lost),
            Completion::Unknown
        );
        assert_eq!(
            dedups.classify_failure(AttemptOutcome::Lost),
            Completion::Release
        );
    }

    #[test]
    fn overrides_apply_and_are_checked() {
        let spec = CompletionSpec {
            final_statuses: Some(vec![409]),
            release: Some(vec![500]),
            unknown: None,
        };
        let p = CompletionPolicy::new(Some(&spec), false).unwrap();
        assert_eq!(p.classify(StatusCode::CONFLICT), Completion::Final);
        assert_eq!(
            p.classify(StatusCode::INTERNAL_SERVER_ERROR),
            Completion::Release
        );
        let twice = CompletionSpec {
            final_statuses: Some(vec![500]),
            release: Some(vec![500]),
            unknown: None,
        };
        assert!(
            CompletionPolicy::new(Some(&twice), false)
                .unwrap_err()
                .contains("twice")
        );
        let bad = CompletionSpec {
            unknown: Some(vec![700]),
            ..Default::default()
        };
        assert!(
            CompletionPolicy::new(Some(&bad), false)
                .unwrap_err()
                .contains("700")
        );
    }
}
