//! Why a record is ambiguous, as the attempt that marked it knew it: the
//! upstream's status or the failure, an excerpt of what it answered, the
//! node that ran it, and a few fields of the request the route names. An
//! operator reads it before asking the provider what happened
//! (docs/operations.md); nothing decides on it.

use crate::Timestamp;

/// The longest body excerpt a note keeps, in bytes.
pub const AMBIGUITY_EXCERPT_BYTES_MAX: usize = 2048;
/// The longest failure text a note keeps, in bytes.
pub const AMBIGUITY_ERROR_BYTES_MAX: usize = 1024;
/// The most request fields a note's summary keeps (and a route may name).
pub const AMBIGUITY_SUMMARY_FIELDS_MAX: usize = 16;
/// The longest node label a note keeps, in bytes: an owner label's limit
/// (`OWNER_BYTES_MAX`), restated so that records and notes stay apart.
pub const AMBIGUITY_NODE_BYTES_MAX: usize = 255;
/// The longest summary value (its JSON text), in bytes; a longer value is
/// left out of the summary rather than cut into text that is not its value.
pub const AMBIGUITY_SUMMARY_VALUE_BYTES_MAX: usize = 256;

/// What the attempt that marked a record ambiguous knew about why.
/// Every part is bounded by [`AmbiguityNote::new`]; it never holds headers.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AmbiguityNote {
    /// The upstream's status, when it answered one.
    pub status: Option<u16>,
    /// What went wrong, as the gateway logs it (`upstream answered 503`,
    /// `upstream-timeout`, `the inner service failed: …`).
    pub error: String,
    /// The start of the upstream's answer body, at most
    /// [`AMBIGUITY_EXCERPT_BYTES_MAX`] bytes, decoded lossily as UTF-8.
    pub excerpt: Option<String>,
    /// The owner label of the node whose attempt it was.
    pub node: String,
    /// When the note was taken, by the note's writer's clock.
    pub at: Timestamp,
    /// Request fields the route names: (JSON pointer, the value's JSON
    /// text, numbers exactly as the request spelled them).
    #[serde(default)]
    pub summary: Vec<(String, String)>,
}

impl AmbiguityNote {
    /// A note with every part within its limit: the error and the excerpt
    /// are cut on a character boundary, the summary keeps its first
    /// [`AMBIGUITY_SUMMARY_FIELDS_MAX`] entries and leaves out a value over
    /// [`AMBIGUITY_SUMMARY_VALUE_BYTES_MAX`].
    pub fn new(
        status: Option<u16>,
        error: &str,
        excerpt: Option<&[u8]>,
        node: &str,
        at: Timestamp,
        summary: Vec<(String, String)>,
    ) -> AmbiguityNote {
        let excerpt = excerpt.map(|body| {
            let head = &body[..body.len().min(AMBIGUITY_EXCERPT_BYTES_MAX)];
            let text = String::from_utf8_lossy(head);
            // The lossy text may be longer than the bytes it came from.
            cut(&text, AMBIGUITY_EXCERPT_BYTES_MAX).to_owned()
        });
        let summary = summary
            .into_iter()
            .filter(|(_, value)| value.len() <= AMBIGUITY_SUMMARY_VALUE_BYTES_MAX)
            .take(AMBIGUITY_SUMMARY_FIELDS_MAX)
            .map(|(pointer, value)| {
                (
                    cut(&pointer, AMBIGUITY_SUMMARY_VALUE_BYTES_MAX).to_owned(),
                    value,
                )
            })
            .collect();
        AmbiguityNote {
            status,
            error: cut(error, AMBIGUITY_ERROR_BYTES_MAX).to_owned(),
            excerpt,
            node: cut(node, AMBIGUITY_NODE_BYTES_MAX).to_owned(),
            at,
            summary,
        }
    }
}

/// The longest prefix of `s` of at most `bytes_max` bytes that ends on a
/// character boundary.
fn cut(s: &str, bytes_max: usize) -> &str {
    if s.len() <= bytes_max {
        return s;
    }
    let mut end = bytes_max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_is_cut_within_its_limit_on_a_character_boundary() {
        let body = "é".repeat(AMBIGUITY_EXCERPT_BYTES_MAX);
        let error = "ü".repeat(AMBIGUITY_ERROR_BYTES_MAX);
        let long = "1".repeat(AMBIGUITY_SUMMARY_VALUE_BYTES_MAX + 1);
        let mut summary = vec![("/long".to_owned(), long)];
        summary.extend((0..40).map(|i| (format!("/f{i}"), i.to_string())));
        let note = AmbiguityNote::new(
            Some(503),
            &error,
            Some(body.as_bytes()),
            "node-a",
            Timestamp::from_millis(7),
            summary,
        );
        let excerpt = note.excerpt.unwrap_or_default();
        assert_eq!(excerpt.len(), AMBIGUITY_EXCERPT_BYTES_MAX);
        assert!(excerpt.chars().all(|c| c == 'é'));
        assert_eq!(note.error.len(), AMBIGUITY_ERROR_BYTES_MAX);
        assert_eq!(note.summary.len(), AMBIGUITY_SUMMARY_FIELDS_MAX);
        assert_eq!(note.summary[0], ("/f0".to_owned(), "0".to_owned()));
    }

    #[test]
    fn invalid_utf8_is_decoded_lossily_and_still_bounded() {
        let body = vec![0xff; AMBIGUITY_EXCERPT_BYTES_MAX * 2];
        let note = AmbiguityNote::new(
            None,
            "x",
            Some(&body),
            "n",
            Timestamp::from_millis(0),
            vec![],
        );
        let excerpt = note.excerpt.unwrap_or_default();
        assert!(excerpt.len() <= AMBIGUITY_EXCERPT_BYTES_MAX);
        assert!(excerpt.starts_with('\u{fffd}'));
    }
}
