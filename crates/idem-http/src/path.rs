//! One spelling per request path, so that a route cannot be bypassed by
//! how the path is written: the layer matches, scopes, fingerprints and
//! forwards the path an upstream will act on, and refuses the spellings
//! upstreams disagree on. RFC 3986 §6.2.2 normalisation (decode escaped
//! unreserved characters, uppercase the other escapes, §5.2.4 dot-segment
//! removal) plus merged empty segments; the decoding itself is the
//! `percent-encoding` crate's. No crate applies this policy, so it is here.

use std::fmt;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, percent_encode};

/// Every byte but RFC 3986's unreserved characters: what stays escaped.
const ESCAPED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Why a path is refused (400 `invalid-path`): its meaning depends on the
/// upstream that reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PathRefusal {
    /// `%2F`: one segment to some upstreams, two to others.
    EncodedSlash,
    /// A raw `\` or `%5C`: a separator to some upstreams.
    Backslash,
    /// `%00`: ends the path for some upstreams.
    EncodedNul,
    /// A `%` not followed by two hex digits.
    InvalidEscape,
    /// Escapes that do not decode to UTF-8 (`%C0%AE` is `.` to some).
    InvalidUtf8,
    /// A segment some upstreams read as `.` or `..` and RFC 3986 does not:
    /// escaped dots (`%2E%2E`), or dots with parameters (`..;x`).
    DisguisedDotSegment,
    /// More `..` segments than there are segments to remove.
    AboveRoot,
}

/// The normal form of `path` (without the query): escapes of unreserved
/// characters decoded, other escapes uppercased, `.` and `..` segments
/// removed, empty segments merged, a trailing `/` kept. A path that does
/// not start with `/` (`*`, an authority) is returned as it is.
pub fn normalize_path(path: &str) -> Result<String, PathRefusal> {
    let Some(body) = path.strip_prefix('/') else {
        return Ok(path.to_owned());
    };
    if path.contains('\\') {
        return Err(PathRefusal::Backslash);
    }
    if already_normal(body) {
        return Ok(path.to_owned());
    }
    normalize_segments(body)
}

/// Whether `body` (a path after its leading `/`) is its own normal form,
/// as most request paths are: no escape, no empty segment but a trailing
/// one, no segment that is or is read as `.` or `..`. The walk over the
/// segments below would give back exactly `body`; this only reads it.
fn already_normal(body: &str) -> bool {
    if body.contains('%') {
        return false;
    }
    let mut segments = body.split('/').peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        let head = segment.split(';').next().unwrap_or("");
        if (segment.is_empty() && !last) || head == "." || head == ".." {
            return false;
        }
    }
    true
}

/// The normal form of the path whose part after the leading `/` is `body`,
/// segment by segment.
fn normalize_segments(body: &str) -> Result<String, PathRefusal> {
    let mut kept: Vec<String> = Vec::new();
    let mut trailing_slash = false;
    for raw in body.split('/') {
        let segment = canonical_segment(raw)?;
        trailing_slash = matches!(segment.as_str(), "" | "." | "..");
        match segment.as_str() {
            "" | "." => {}
            ".." => {
                kept.pop().ok_or(PathRefusal::AboveRoot)?;
            }
            _ => kept.push(segment),
        }
    }
    let mut normal = format!("/{}", kept.join("/"));
    if trailing_slash && !kept.is_empty() {
        normal.push('/');
    }
    Ok(normal)
}

/// The segments of a normalised path as the most lenient upstream reads
/// them: fully decoded, matrix parameters (`;…`) cut, ASCII lowercased, a
/// trailing empty segment dropped. Paired with the segment as written, for
/// patterns that only need it to be non-empty. Matching on this form
/// protects every spelling that a case-insensitive or matrix-stripping
/// upstream serves as the protected path.
pub(crate) fn lenient_segments(path: &str) -> Option<Vec<(&str, String)>> {
    let body = path.strip_prefix('/')?;
    let body = body.strip_suffix('/').unwrap_or(body);
    if body.is_empty() {
        return Some(Vec::new());
    }
    Some(body.split('/').map(|raw| (raw, lenient(raw))).collect())
}

/// One segment (or pattern literal) as the most lenient upstream reads it.
pub(crate) fn lenient(segment: &str) -> String {
    let decoded = percent_decode_str(segment).decode_utf8_lossy();
    let head = decoded.split(';').next().unwrap_or("");
    head.to_ascii_lowercase()
}

/// The path of the catch-all route's operation: the lenient segments, so
/// that spellings one upstream may serve as one endpoint share a scope
/// (where their fingerprints differ, the key is refused as reused).
pub(crate) fn operation_path(path: &str) -> String {
    match lenient_segments(path) {
        Some(segments) => {
            let lenient: Vec<String> = segments.into_iter().map(|(_, l)| l).collect();
            format!("/{}", lenient.join("/"))
        }
        None => path.to_owned(),
    }
}

/// One segment with its escapes in normal form, or why it is refused.
fn canonical_segment(raw: &str) -> Result<String, PathRefusal> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let escape = rest.get(at..at + 3).ok_or(PathRefusal::InvalidEscape)?;
        // An invalid escape decodes to itself, three bytes.
        let &[byte] = percent_decode_str(escape).collect::<Vec<u8>>().as_slice() else {
            return Err(PathRefusal::InvalidEscape);
        };
        match byte {
            b'/' => return Err(PathRefusal::EncodedSlash),
            b'\\' => return Err(PathRefusal::Backslash),
            0 => return Err(PathRefusal::EncodedNul),
            _ => out.extend(percent_encode(&[byte], ESCAPED)),
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    if percent_decode_str(&out).decode_utf8().is_err() {
        return Err(PathRefusal::InvalidUtf8);
    }
    let is_dot_segment = matches!(raw, "." | "..");
    if !is_dot_segment && matches!(lenient(&out).as_str(), "." | "..") {
        return Err(PathRefusal::DisguisedDotSegment);
    }
    Ok(out)
}

impl fmt::Display for PathRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PathRefusal::EncodedSlash => "an encoded '/' (%2F) in the path",
            PathRefusal::Backslash => "a '\\' or an encoded one (%5C) in the path",
            PathRefusal::EncodedNul => "an encoded NUL (%00) in the path",
            PathRefusal::InvalidEscape => "a '%' not followed by two hex digits in the path",
            PathRefusal::InvalidUtf8 => "escapes that do not decode to UTF-8 in the path",
            PathRefusal::DisguisedDotSegment => {
                "a segment that some servers read as '.' or '..' (escaped dots, or dots with ';' parameters)"
            }
            PathRefusal::AboveRoot => "'..' segments that climb above the root",
        })
    }
}

impl std::error::Error for PathRefusal {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_normalise_or_are_refused() {
        use PathRefusal::*;
        let cases: [(&str, Result<&str, PathRefusal>); 30] = [
            ("/", Ok("/")),
            ("/payouts", Ok("/payouts")),
            ("//payouts//x", Ok("/payouts/x")),
            ("/payouts/x/", Ok("/payouts/x/")),
            ("/payouts/x//", Ok("/payouts/x/")),
            ("/%70ayouts/%7e%2d", Ok("/payouts/~-")),
            ("/a%3bb/%c3%a9", Ok("/a%3Bb/%C3%A9")),
            ("/a%20b", Ok("/a%20b")),
            ("/a;b=1/c", Ok("/a;b=1/c")),
            ("/payouts/./x", Ok("/payouts/x")),
            ("/payouts/.", Ok("/payouts/")),
            ("/payouts/..", Ok("/")),
            ("/x/../payouts/y", Ok("/payouts/y")),
            ("/./payouts", Ok("/payouts")),
            ("/a/b/../../c", Ok("/c")),
            ("/a..b/.x/x.", Ok("/a..b/.x/x.")),
            ("*", Ok("*")),
            ("/a%2Fb", Err(EncodedSlash)),
            ("/a%2fb", Err(EncodedSlash)),
            ("/a\\b", Err(Backslash)),
            ("/a%5cb", Err(Backslash)),
            ("/a%00", Err(EncodedNul)),
            ("/a%zz", Err(InvalidEscape)),
            ("/a%4", Err(InvalidEscape)),
            ("/%C0%AE%C0%AE", Err(InvalidUtf8)),
            ("/a/%2E%2E/b", Err(DisguisedDotSegment)),
            ("/a/.%2e", Err(DisguisedDotSegment)),
            ("/a/..;x/b", Err(DisguisedDotSegment)),
            ("/..", Err(AboveRoot)),
            ("/a/../../b", Err(AboveRoot)),
        ];
        for (path, expect) in cases {
            assert_eq!(
                normalize_path(path).as_deref().map_err(|e| *e),
                expect,
                "{path}"
            );
        }
    }

    proptest::proptest! {
        /// A path taken as already normal is exactly what the walk over
        /// its segments makes of it: the shortcut changes no answer.
        #[test]
        fn the_shortcut_for_normal_paths_agrees_with_the_walk(
            segments in proptest::collection::vec(
                proptest::sample::select(vec![
                    "a", "Pay", "", ".", "..", ".;x", "..;x", "a;b", "...", "%2e", "%41",
                    "~-_", "a.b", "\\", "x%2F",
                ]),
                0..6,
            ),
        ) {
            let path = format!("/{}", segments.join("/"));
            let body = &path[1..];
            if !path.contains('\\') && already_normal(body) {
                proptest::prop_assert_eq!(normalize_segments(body), Ok(path.clone()));
            }
        }
    }

    #[test]
    fn operations_read_paths_leniently() {
        let cases = [
            ("/payouts/x", "/payouts/x"),
            ("/Payouts/X/", "/payouts/x"),
            ("/payouts;v=1/x;y", "/payouts/x"),
            ("/a%3Bb/%C3%A9", "/a/é"),
            ("/", "/"),
            ("*", "*"),
        ];
        for (path, expect) in cases {
            assert_eq!(operation_path(path), expect, "{path}");
        }
    }
}
