//! What an attempt's answer means for its record (docs/http.md, "In-process:
//! how an attempt ends"): store it as final, release the key, or mark the outcome
//! unknown. One table for every caller (the tower layer, the gateway, the
//! simulator), on plain status numbers so the core needs no HTTP crate.

use std::fmt;

/// What to do with the record once the upstream answered (or failed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Completion {
    /// A final result: store it and replay it to every retry.
    Final,
    /// Not processed: remove the record so a retry may run.
    Release,
    /// Unknown outcome: mark the record ambiguous; never re-execute blindly.
    Unknown,
}

impl Completion {
    /// The name of the list that declares it in a route's `completion`.
    pub fn as_str(self) -> &'static str {
        match self {
            Completion::Final => "final",
            Completion::Release => "release",
            Completion::Unknown => "unknown",
        }
    }
}

/// How a failed attempt to reach the upstream ended: "never sent" and
/// "sent, then lost" mean different things for the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptOutcome {
    /// The request never left (connection refused, connect timeout).
    NotSent,
    /// The request was sent and the answer was lost (timeout, reset).
    Lost,
}

/// Who keeps a retry of an unknown outcome from repeating the effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dedup {
    /// Only idem: an unknown outcome stays unknown until reconciled.
    Idem,
    /// The upstream dedups by the forwarded key as well, so an unknown
    /// outcome releases: a retry cannot repeat the effect.
    Upstream,
}

/// A route's completion table that cannot be built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompletionError {
    /// A listed number is not an HTTP status (100–599).
    NotAStatus {
        /// The list it was in.
        list: Completion,
        /// The number.
        status: u16,
    },
    /// A status is listed twice.
    Twice {
        /// The status.
        status: u16,
        /// The list it was in first.
        first: Completion,
        /// The list it was in again.
        again: Completion,
    },
}

impl fmt::Display for CompletionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompletionError::NotAStatus { list, status } => {
                write!(f, "{}: {status} is not an HTTP status", list.as_str())
            }
            CompletionError::Twice {
                status,
                first,
                again,
            } => write!(f, "{status} is listed twice ({first:?} and {again:?})"),
        }
    }
}

impl std::error::Error for CompletionError {}

/// The validated completion table of one route: the defaults, a route's
/// overrides by status, and who dedups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletionTable {
    overrides: Vec<(u16, Completion)>,
    dedup: Dedup,
}

impl CompletionTable {
    /// The defaults plus `overrides`, each status at most once.
    pub fn new(
        overrides: impl IntoIterator<Item = (u16, Completion)>,
        dedup: Dedup,
    ) -> Result<CompletionTable, CompletionError> {
        let mut checked: Vec<(u16, Completion)> = Vec::new();
        for (status, completion) in overrides {
            if !(100..=599).contains(&status) {
                return Err(CompletionError::NotAStatus {
                    list: completion,
                    status,
                });
            }
            if let Some((_, first)) = checked.iter().find(|(s, _)| *s == status) {
                return Err(CompletionError::Twice {
                    status,
                    first: *first,
                    again: completion,
                });
            }
            checked.push((status, completion));
        }
        Ok(CompletionTable {
            overrides: checked,
            dedup,
        })
    }

    /// What an upstream status means.
    pub fn classify(&self, status: u16) -> Completion {
        let declared = self
            .overrides
            .iter()
            .find(|(s, _)| *s == status)
            .map(|(_, c)| *c);
        self.dedup_adjusted(declared.unwrap_or_else(|| default_for(status)))
    }

    /// What a failed attempt means.
    pub fn classify_failure(&self, outcome: AttemptOutcome) -> Completion {
        match outcome {
            AttemptOutcome::NotSent => Completion::Release,
            AttemptOutcome::Lost => self.dedup_adjusted(Completion::Unknown),
        }
    }

    fn dedup_adjusted(&self, completion: Completion) -> Completion {
        match (completion, self.dedup) {
            (Completion::Unknown, Dedup::Upstream) => Completion::Release,
            (other, _) => other,
        }
    }
}

/// The default meaning of a status. Only a status that by definition says
/// the request was not processed releases; a status that is usually but not
/// provably harmless is unknown, because releasing it lets a retry run the
/// effect a second time. Routes opt in to more with overrides.
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
        // application committed. A number past 599 never comes from a
        // parsed status; unknown is the side that never repeats an effect.
        _ => Completion::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Completion::{Final, Release, Unknown};

    /// Checks each `(status, without dedup, with dedup)` against the table
    /// with `overrides`, built both ways.
    fn check(overrides: &[(u16, Completion)], cases: &[(u16, Completion, Completion)]) {
        let safe = CompletionTable::new(overrides.iter().copied(), Dedup::Idem).unwrap();
        let dedups = CompletionTable::new(overrides.iter().copied(), Dedup::Upstream).unwrap();
        for &(status, expect_safe, expect_dedups) in cases {
            assert_eq!(safe.classify(status), expect_safe, "{status}");
            assert_eq!(dedups.classify(status), expect_dedups, "{status} deduped");
        }
    }

    #[test]
    fn default_table() {
        let cases = [
            (100, Final, Final),
            (200, Final, Final),
            (201, Final, Final),
            (302, Final, Final),
            (400, Final, Final),
            (401, Final, Final),
            (404, Final, Final),
            (422, Final, Final),
            (499, Final, Final),
            (421, Release, Release),
            (425, Release, Release),
            (408, Unknown, Release),
            (409, Unknown, Release),
            (429, Unknown, Release),
            (500, Unknown, Release),
            (502, Unknown, Release),
            (503, Unknown, Release),
            (504, Unknown, Release),
            (599, Unknown, Release),
            (0, Unknown, Release),
            (u16::MAX, Unknown, Release),
        ];
        check(&[], &cases);
        let safe = CompletionTable::new([], Dedup::Idem).unwrap();
        let dedups = CompletionTable::new([], Dedup::Upstream).unwrap();
        let failures = [
            (AttemptOutcome::NotSent, Release, Release),
            (AttemptOutcome::Lost, Unknown, Release),
        ];
        for (outcome, expect_safe, expect_dedups) in failures {
            assert_eq!(safe.classify_failure(outcome), expect_safe, "{outcome:?}");
            assert_eq!(
                dedups.classify_failure(outcome),
                expect_dedups,
                "{outcome:?} deduped"
            );
        }
    }

    #[test]
    fn overrides_apply_and_the_dedup_rule_applies_after_them() {
        let overrides = [(409, Final), (500, Release), (200, Unknown)];
        let cases = [
            (409, Final, Final),
            (500, Release, Release),
            (200, Unknown, Release),
            (502, Unknown, Release),
            (201, Final, Final),
        ];
        check(&overrides, &cases);
    }

    fn completion() -> impl proptest::strategy::Strategy<Value = Completion> {
        proptest::sample::select(vec![Final, Release, Unknown])
    }

    proptest::proptest! {
        /// For any status and any valid overrides: a declared status means
        /// what it was declared as, an undeclared one its default, and an
        /// upstream that dedups turns exactly the unknown answers into
        /// releases.
        #[test]
        fn overrides_win_and_dedup_only_releases_unknowns(
            status in proptest::prop_oneof![4 => 100u16..=599, 1 => proptest::num::u16::ANY],
            overrides in proptest::collection::btree_map(100u16..=599, completion(), 0..8),
        ) {
            let safe = CompletionTable::new(overrides.clone(), Dedup::Idem).unwrap();
            let dedups = CompletionTable::new(overrides.clone(), Dedup::Upstream).unwrap();
            let plain = CompletionTable::new([], Dedup::Idem).unwrap();
            let expect = overrides.get(&status).copied().unwrap_or_else(|| plain.classify(status));
            proptest::prop_assert_eq!(safe.classify(status), expect);
            let deduped = match expect {
                Unknown => Release,
                other => other,
            };
            proptest::prop_assert_eq!(dedups.classify(status), deduped);
        }
    }

    #[test]
    fn bad_overrides_are_refused_with_their_list() {
        let cases: [(&[(u16, Completion)], &str); 5] = [
            (
                &[(500, Final), (500, Release)],
                "500 is listed twice (Final and Release)",
            ),
            (
                &[(200, Unknown), (200, Unknown)],
                "200 is listed twice (Unknown and Unknown)",
            ),
            (&[(700, Unknown)], "unknown: 700 is not an HTTP status"),
            (&[(99, Final)], "final: 99 is not an HTTP status"),
            (&[(0, Release)], "release: 0 is not an HTTP status"),
        ];
        for (overrides, expect) in cases {
            let err = CompletionTable::new(overrides.iter().copied(), Dedup::Idem).unwrap_err();
            assert_eq!(err.to_string(), expect);
        }
    }
}
