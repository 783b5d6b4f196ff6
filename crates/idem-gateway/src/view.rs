//! A record as an operator sees it: the state as of now, times in RFC 3339,
//! bodies as text. One shape for `idem records … --format json` and the
//! admin API, so a script written against one works against the other.

use idem_core::{Outcome, Record, State, Timestamp, to_hex};
use serde::Serialize;

/// The store's suspect window, as the admin API and the console show it
/// (docs/operations.md, "After a failover or a restore").
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WindowView {
    /// Whether fresh claims are verified now.
    pub open: bool,
    /// When it was last opened (RFC 3339): the latest loss, from which a
    /// "not found" waits out the lease of any attempt it forgot.
    pub opened_at: String,
    /// When it closes, or closed (RFC 3339).
    pub until: String,
    /// Seconds until it closes; 0 once closed.
    pub closes_in_s: u64,
    /// The restore point, when known (RFC 3339).
    pub since: Option<String>,
    /// Why it was opened.
    pub cause: String,
    /// How many times the store's window changed.
    pub version: u64,
}

impl WindowView {
    /// `window` as of `now`.
    pub fn new(window: &idem_core::SuspectWindow, now: Timestamp) -> WindowView {
        WindowView {
            open: window.is_open(now),
            opened_at: rfc3339(window.opened_at),
            until: rfc3339(window.until),
            closes_in_s: now.millis_until(window.until).div_ceil(1000),
            since: window.since.map(rfc3339),
            cause: window.cause.clone(),
            version: window.version,
        }
    }
}

/// One record, as shown.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RecordView {
    /// The scope, exactly as the store keeps it.
    pub scope: String,
    /// The idempotency key.
    pub key: String,
    /// The state at the time of the view (a completed record past
    /// retention shows as `tombstone` even before the purge ran).
    pub state: State,
    /// The fencing token of the latest acquisition.
    pub token: u64,
    /// Who acquired the record.
    pub owner: String,
    /// The region of the attempt that acquired it; `null` when its writer
    /// had none, or the record predates regions.
    pub region: Option<String>,
    /// The request fingerprint, hex.
    pub fingerprint: String,
    /// When it was acquired.
    pub created_at: String,
    /// When the lease of the acquisition ends (ended).
    pub lease_until: String,
    /// When the effect completed.
    pub completed_at: Option<String>,
    /// When the result stops being replayed.
    pub expires_at: Option<String>,
    /// When the tombstone is dropped.
    pub tombstone_until: Option<String>,
    /// The stored result, if it is still kept.
    pub result: Option<ResultView>,
    /// How the record was resolved, if it was ever ambiguous.
    pub resolution: Option<ResolutionView>,
    /// Why the record is ambiguous, when it is at the time of the view.
    pub ambiguity: Option<AmbiguityView>,
}

/// Why a record is ambiguous, as shown: what its attempt noted
/// ([`idem_core::AmbiguityNote`]), or, when it noted nothing (its holder
/// stopped before its lease ended, or its store keeps no note), that its
/// holder stopped before it could say why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AmbiguityView {
    /// Whether the attempt said why (`false`: its holder stopped first).
    pub noted: bool,
    /// The upstream's status, when it answered one.
    pub status: Option<u16>,
    /// What went wrong, as the gateway logged it.
    pub error: String,
    /// The start of the upstream's answer body (lossy UTF-8, bounded).
    pub excerpt: Option<String>,
    /// The node (owner label) whose attempt it was.
    pub node: String,
    /// When it was noted, or, not noted, when the holder's lease ended.
    pub at: String,
    /// The request fields the route names, values as JSON text.
    pub summary: Vec<SummaryField>,
}

/// One request field of [`AmbiguityView::summary`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SummaryField {
    /// The field's JSON pointer, as the route names it.
    pub pointer: String,
    /// The value's JSON text: a number exactly as the request spelled it,
    /// a string with its quotes.
    pub value: String,
}

impl AmbiguityView {
    /// Why `r` is ambiguous, or `None` when it is not at `now`.
    pub fn new(r: &Record, now: Timestamp) -> Option<AmbiguityView> {
        if r.state_at(now) != State::Ambiguous {
            return None;
        }
        Some(match &r.ambiguity {
            Some(note) => AmbiguityView {
                noted: true,
                status: note.status,
                error: note.error.clone(),
                excerpt: note.excerpt.clone(),
                node: note.node.clone(),
                at: rfc3339(note.at),
                summary: note
                    .summary
                    .iter()
                    .map(|(pointer, value)| SummaryField {
                        pointer: pointer.clone(),
                        value: value.clone(),
                    })
                    .collect(),
            },
            None => AmbiguityView {
                noted: false,
                status: None,
                error: format!(
                    "the holder stopped before it could say why: its lease ended at {}",
                    rfc3339(r.lease_until)
                ),
                excerpt: None,
                node: r.owner.clone(),
                at: rfc3339(r.lease_until),
                summary: Vec::new(),
            },
        })
    }
}

/// A stored result, as shown.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResultView {
    /// The HTTP status.
    pub status: u16,
    /// The replayed headers: a value that is UTF-8 as it is, any other
    /// byte of a value escaped as `\xNN` (never dropped).
    pub headers: Vec<(String, String)>,
    /// The body as UTF-8 text when it is text, otherwise absent.
    pub body: Option<String>,
    /// The body as lowercase hex when it is not UTF-8.
    pub body_hex: Option<String>,
    /// The body's size.
    pub body_bytes: usize,
}

/// A resolution, as shown.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResolutionView {
    /// `completed` or `not_executed`.
    pub outcome: &'static str,
    /// Who resolved it.
    pub by: String,
    /// Why.
    pub reason: String,
    /// When.
    pub at: Option<String>,
}

impl RecordView {
    /// The view of `r` at `now`.
    pub fn new(r: &Record, now: Timestamp) -> RecordView {
        RecordView {
            scope: r.id.scope.to_string(),
            key: r.id.key.to_string(),
            state: r.state_at(now),
            token: r.token.0,
            owner: r.owner.clone(),
            region: r.region.clone(),
            fingerprint: r.fingerprint.to_hex(),
            created_at: rfc3339(r.created_at),
            lease_until: rfc3339(r.lease_until),
            completed_at: r.completed_at.map(rfc3339),
            expires_at: r.expires_at.map(rfc3339),
            tombstone_until: r.tombstone_until.map(rfc3339),
            result: r.result.as_ref().map(|res| {
                let text = std::str::from_utf8(res.body()).ok().map(str::to_owned);
                ResultView {
                    status: res.status(),
                    headers: res
                        .headers()
                        .iter()
                        .map(|(name, value)| (name.clone(), value.escaped()))
                        .collect(),
                    body_hex: text.is_none().then(|| to_hex(res.body())),
                    body: text,
                    body_bytes: res.body().len(),
                }
            }),
            resolution: r.resolution.as_ref().map(|res| ResolutionView {
                outcome: outcome_name(&res.outcome),
                by: res.by.clone(),
                reason: res.reason.clone(),
                at: res.at.map(rfc3339),
            }),
            ambiguity: AmbiguityView::new(r, now),
        }
    }
}

/// `completed` or `not_executed`, as the CLI and the admin API spell it.
pub fn outcome_name(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Completed { .. } => "completed",
        Outcome::NotExecuted => "not_executed",
    }
}

/// `2026-11-29T09:00:00.123Z` from milliseconds since the epoch (UTC; the
/// civil-from-days algorithm of H. Hinnant, so no date crate is needed).
pub fn rfc3339(t: Timestamp) -> String {
    let ms = t.as_millis();
    let (days, ms_of_day) = ((ms / 86_400_000) as i64, ms % 86_400_000);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s, milli) = (
        ms_of_day / 3_600_000,
        ms_of_day / 60_000 % 60,
        ms_of_day / 1000 % 60,
        ms_of_day % 1000,
    );
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record acquired at 1 s by `gw-1` with a 1 s lease.
    fn acquired() -> Record {
        use idem_core::decision::{Write, acquire};
        use idem_core::{
            ClaimRequest, Fingerprint, IdempotencyKey, Policy, RecordId, Scope, Token,
        };
        let req = ClaimRequest {
            id: RecordId {
                scope: Scope::new("payouts|t").unwrap(),
                key: IdempotencyKey::new("k").unwrap(),
            },
            fingerprint: Fingerprint::from_bytes([1; 32]),
            legacy_fingerprint: None,
            owner: "gw-1".into(),
            region: None,
            policy: Policy::new(1_000, 60, 600, idem_core::LeaseExpiry::Reconcile).unwrap(),
        };
        match acquire(&req, Timestamp::from_millis(1_000), Token(1), None).1 {
            Write::Put(record) => record,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_ambiguous_record_says_why_or_that_its_holder_stopped_first() {
        let mut record = acquired();
        let running = Timestamp::from_millis(1_500);
        assert_eq!(AmbiguityView::new(&record, running), None, "in progress");
        // Marked by a later claim after its holder's lease ended: no note.
        record.state = State::Ambiguous;
        let lapsed = AmbiguityView::new(&record, Timestamp::from_millis(5_000)).unwrap();
        assert!(!lapsed.noted);
        assert_eq!(lapsed.node, "gw-1");
        assert_eq!(lapsed.at, "1970-01-01T00:00:02.000Z");
        assert!(
            lapsed.error.contains("stopped before it could say why"),
            "{lapsed:?}"
        );
        let mut marked = record;
        let summary = vec![("/amount".to_owned(), "1e400".to_owned())];
        let note = idem_core::AmbiguityNote::new(
            Some(503),
            "upstream answered 503",
            Some(b"busy"),
            "gw-2",
            Timestamp::from_millis(1_200),
            summary,
        );
        marked.ambiguity = Some(note);
        let noted = AmbiguityView::new(&marked, running).unwrap();
        assert_eq!(
            (
                noted.noted,
                noted.status,
                noted.excerpt.as_deref(),
                noted.node.as_str()
            ),
            (true, Some(503), Some("busy"), "gw-2")
        );
        let field = SummaryField {
            pointer: "/amount".into(),
            value: "1e400".into(),
        };
        assert_eq!(noted.summary, [field]);
    }

    #[test]
    fn formats_timestamps_as_rfc3339() {
        let cases = [
            (0, "1970-01-01T00:00:00.000Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
            (1_796_029_200_123, "2026-11-30T09:00:00.123Z"),
            (4_102_444_799_999, "2099-12-31T23:59:59.999Z"),
        ];
        for (ms, want) in cases {
            assert_eq!(rfc3339(Timestamp::from_millis(ms)), want);
        }
    }
}
