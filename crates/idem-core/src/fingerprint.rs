//! Request fingerprints: a SHA-256 over a canonical, unambiguous encoding of
//! the parts of a request that decide its business meaning, so that a retry
//! with the same idempotency key can be told apart from a different request
//! that reuses the key. Two requests share a fingerprint only if every part
//! below is the same.
//!
//! The canonical form (version 2) is, in order:
//!
//! 1. the domain tag `idem-fingerprint-v2\0`;
//! 2. the method, exactly as sent (methods are case-sensitive);
//! 3. the route (the pattern the request matched, e.g. `/orders/{id}`);
//! 4. the path, with percent-encoded RFC 3986 unreserved characters decoded
//!    and the hex digits of other percent-encodings uppercased, nothing else
//!    changed (`/a/` and `/a` stay different);
//! 5. the query: a count of pairs, then each pair. The query is split at `&`
//!    (empty pieces are skipped) and each pair at its first `=`. A name or
//!    value is split at every literal `+` and each piece is percent-decoded
//!    to bytes, written as a count of pieces and each piece: so `%ff` and
//!    `%25ff` differ, and `+` equals neither `%20` (as form decoding would
//!    say) nor `%2B` (as RFC 3986 would), since an upstream may read it
//!    either way. After the name, a byte 0 if the pair has no `=` (`?x`),
//!    else 1 and the value (`?x=`). Pairs are sorted by name with a stable
//!    sort, so repeated parameters keep their order, but only when every
//!    name is made of unreserved characters and no two different names are
//!    alike once lowercased with `-._~` dropped (`A` and `a`, `page_size`
//!    and `pageSize`, `+` and `%20`, `%FE` and `%FF`: some upstream reads
//!    each as one name); otherwise they stay in the order sent (see
//!    `names_sort_safely`). A query with a literal
//!    `;` is not split at all: older Rack and Python split pairs at `;` too
//!    and Go drops such pairs, so its pairs are not the same for every
//!    upstream; it is written as the marker `u64::MAX` in place of the
//!    count of pairs (no count reaches it) and its text, escapes in the
//!    normal form of the path below, in its order: `;` equals neither `%3B`
//!    nor `&`, and `?x=1;a=2` is not `?x=1;a%3D2`. A query
//!    with a `%` not followed by two hex digits (`%zz`, `%4`, a lone `%`)
//!    has no fingerprint ([`FingerprintError::MalformedQuery`]): upstreams
//!    read it three ways (Go drops the pair, Java and Ruby refuse the
//!    request, others keep the text), so no stored answer may stand for it;
//! 6. the media type: a count of `Content-Type` values, then each value.
//!    A value that parses as a media type is a byte 0, its `type/subtype`
//!    lowercased, then for a JSON body no parameters (JSON is UTF-8, its
//!    parameters do not change its meaning) and for any other body every
//!    parameter, sorted by name with a stable sort: a count, then each name
//!    (lowercased) and value (unquoted; a `charset` value lowercased). A value
//!    that does not parse is a byte 1 and its bytes, surrounding whitespace
//!    removed;
//! 7. the declared headers, names ASCII-lowercased and values as bytes
//!    trimmed of surrounding ASCII whitespace, sorted by name with a stable
//!    sort so that repeated headers keep their order: a count, then each name
//!    and value;
//! 8. the body: a kind byte (0 empty, 1 JSON, 2 raw), then for JSON the
//!    RFC 8785 canonical bytes with numbers as exact decimals of any size
//!    ([`crate::jcs::Numbers::Exact`]) and for raw the bytes as they are. The
//!    body is JSON when exactly one `Content-Type` is sent and it is
//!    `application/json` or `application/*+json`.
//!
//! Every string or byte field is written as a u64 big-endian length followed
//! by its bytes, and every count as a u64 big-endian, so two different
//! requests can never share a canonical form by shifting bytes between
//! neighbouring fields.
//!
//! Version 1 is still computed, as [`Fingerprint::of_request_v1`], so that
//! records written before version 2 keep matching their retries (see
//! [`crate::decision::ClaimRequest::legacy_fingerprint`]). It differs from
//! version 2 in that it ignores the media type, uppercases the method, reads
//! the query with form decoding (`+` is a space) into text, sorts query pairs
//! and headers by (name, value) and reads JSON numbers as doubles. Because
//! of this it cannot tell some requests apart, so it is computed only for
//! requests it reads exactly: the method has no lower-case letter, the
//! query has no literal `;` and no malformed escape, its names sort safely
//! as version 2 sorts them, every query name and
//! value is UTF-8 once decoded, no query name or declared header is repeated, at most one
//! `Content-Type` is sent, declared header values are UTF-8, and every JSON
//! number's ECMAScript spelling has the literal's value. What it still cannot
//! see is the media type: until the records written before version 2 expire,
//! a request that differs from one of them only in its `Content-Type` (or
//! only in `+` against `%20` in its query) replays it.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use percent_encoding::percent_decode_str;
use sha2::{Digest, Sha256};

use crate::jcs::{self, JcsError, JsonPointer, Numbers};

/// Domain-separation and version tag at the start of every canonical form.
const DOMAIN_TAG: &[u8] = b"idem-fingerprint-v2\0";

/// Body kind bytes in the canonical form (both versions).
const BODY_EMPTY: u8 = 0;
const BODY_JSON: u8 = 1;
const BODY_RAW: u8 = 2;

/// Media type kind bytes in the canonical form.
const MEDIA_PARSED: u8 = 0;
const MEDIA_UNPARSED: u8 = 1;

/// Whether a query pair has a `=`.
const QUERY_NO_VALUE: u8 = 0;
const QUERY_VALUE: u8 = 1;

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Whether `name` is a W3C trace context header (`traceparent`,
/// `tracestate`), in any case. Every attempt sends a new one (a new span
/// per try), so a fingerprint that covered it would call every retry a
/// different request: configs refuse it in the fingerprinted headers,
/// with [`TRACE_CONTEXT_REFUSED`] as the reason.
pub fn is_trace_context(name: &str) -> bool {
    ["traceparent", "tracestate"]
        .iter()
        .any(|t| name.eq_ignore_ascii_case(t))
}

/// Why a config may not fingerprint a trace context header.
pub const TRACE_CONTEXT_REFUSED: &str = "the trace context changes with every attempt (a new \
    span per try), so every retry would be refused as a different request; remove it";

/// Lowercase hexadecimal of any bytes (digests, binary bodies).
pub fn to_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(char::from(HEX_DIGITS[usize::from(b >> 4)]));
        s.push(char::from(HEX_DIGITS[usize::from(b & 0xf)]));
    }
    s
}

/// The SHA-256 fingerprint of a request's canonical form.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Wraps 32 raw digest bytes.
    pub fn from_bytes(b: [u8; 32]) -> Self {
        Fingerprint(b)
    }

    /// The 32 raw digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The fingerprint as 64 lowercase hexadecimal digits.
    pub fn to_hex(&self) -> String {
        to_hex(&self.0)
    }

    /// Parses exactly 64 hexadecimal digits (either case) as produced by
    /// [`Fingerprint::to_hex`].
    pub fn from_hex(s: &str) -> Result<Self, FingerprintError> {
        let bytes = s.as_bytes();
        if bytes.len() != 64 {
            return Err(FingerprintError::BadHex {
                offset: bytes.len().min(64),
                reason: "a fingerprint is exactly 64 hexadecimal digits",
            });
        }
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let mut byte = 0u8;
            for (j, &c) in pair.iter().enumerate() {
                let digit = char::from(c).to_digit(16).ok_or(FingerprintError::BadHex {
                    offset: 2 * i + j,
                    reason: "not a hexadecimal digit",
                })?;
                // `digit` < 16, so the cast is lossless.
                byte = (byte << 4) | digit as u8;
            }
            out[i] = byte;
        }
        Ok(Fingerprint(out))
    }

    /// Fingerprints a request: SHA-256 over its canonical form, version 2
    /// (see the module documentation). Fails only if a JSON body cannot be
    /// canonicalised.
    pub fn of_request(req: &RequestParts<'_>) -> Result<Fingerprint, FingerprintError> {
        let mut hasher = Sha256::new();
        write_canonical(req, &mut hasher)?;
        Ok(Fingerprint(hasher.finalize().into()))
    }

    /// The version 1 fingerprint of a request, to recognise records written
    /// before version 2; `None` where version 1 cannot tell this request
    /// apart from another (see the module documentation) or cannot read it.
    pub fn of_request_v1(req: &RequestParts<'_>) -> Option<Fingerprint> {
        let mut hasher = Sha256::new();
        v1::write_canonical(req, &mut hasher)?;
        Some(Fingerprint(hasher.finalize().into()))
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

impl FromStr for Fingerprint {
    type Err = FingerprintError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Fingerprint::from_hex(s)
    }
}

impl serde::Serialize for Fingerprint {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for Fingerprint {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct HexVisitor;

        impl serde::de::Visitor<'_> for HexVisitor {
            type Value = Fingerprint;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a fingerprint as 64 hexadecimal digits")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Fingerprint, E> {
                Fingerprint::from_hex(v).map_err(E::custom)
            }
        }

        deserializer.deserialize_str(HexVisitor)
    }
}

/// The parts of a request that take part in its fingerprint, as received.
#[derive(Debug, Clone, Copy)]
pub struct RequestParts<'a> {
    /// The HTTP method.
    pub method: &'a str,
    /// The route the request matched, e.g. `/orders/{id}`.
    pub route: &'a str,
    /// The request path as received (still percent-encoded), without query.
    pub path: &'a str,
    /// The query as received, after the `?` and still percent-encoded; empty
    /// when there is none.
    pub query: &'a str,
    /// Every `Content-Type` value, in the order received.
    pub content_types: &'a [&'a [u8]],
    /// Only the headers the route declares as part of the fingerprint, in the
    /// order received; names are compared case-insensitively (ASCII).
    pub headers: &'a [(&'a str, &'a [u8])],
    /// The request body.
    pub body: &'a [u8],
    /// Locations removed from a JSON body before canonicalisation (e.g. a
    /// client nonce).
    pub exclude: &'a [JsonPointer],
}

/// Why a fingerprint could not be computed or parsed.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FingerprintError {
    /// A JSON body could not be canonicalised.
    Json(JcsError),
    /// The query has a `%` that is not followed by two hex digits, which
    /// upstreams read in different ways: the request must be refused.
    MalformedQuery {
        /// Byte offset of the `%` in the query.
        offset: usize,
    },
    /// Text is not a fingerprint in hexadecimal.
    BadHex {
        /// Offset of the offending character, or the input length if the
        /// length is wrong.
        offset: usize,
        /// What is wrong.
        reason: &'static str,
    },
}

impl fmt::Display for FingerprintError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FingerprintError::Json(e) => write!(f, "JSON body cannot be canonicalised: {e}"),
            FingerprintError::MalformedQuery { offset } => write!(
                f,
                "the query has a '%' not followed by two hex digits at byte {offset} \
                 (write a literal '%' as %25)"
            ),
            FingerprintError::BadHex { offset, reason } => {
                write!(f, "invalid fingerprint hex at character {offset}: {reason}")
            }
        }
    }
}

impl std::error::Error for FingerprintError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FingerprintError::Json(e) => Some(e),
            FingerprintError::BadHex { .. } | FingerprintError::MalformedQuery { .. } => None,
        }
    }
}

impl From<JcsError> for FingerprintError {
    fn from(e: JcsError) -> Self {
        FingerprintError::Json(e)
    }
}

/// Where the canonical form is written: a hasher, or a buffer in tests.
trait Sink {
    fn put(&mut self, bytes: &[u8]);

    /// A u64 big-endian length or count.
    fn put_len(&mut self, len: usize) {
        // usize is at most 64 bits on every supported target.
        self.put(&(len as u64).to_be_bytes());
    }

    /// A length-prefixed field.
    fn put_field(&mut self, bytes: &[u8]) {
        self.put_len(bytes.len());
        self.put(bytes);
    }
}

impl Sink for Sha256 {
    fn put(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Writes the canonical form of `req`, version 2 (see the module
/// documentation).
fn write_canonical(req: &RequestParts<'_>, sink: &mut impl Sink) -> Result<(), FingerprintError> {
    let json = is_json(req.content_types);
    // The query and the body are the fallible parts: check them first so
    // nothing is written for a request that cannot be fingerprinted.
    check_escapes(req.query)?;
    let body = match req.body {
        [] => None,
        bytes if json => Some((
            BODY_JSON,
            Cow::Owned(jcs::canonicalize(bytes, req.exclude, Numbers::Exact)?),
        )),
        bytes => Some((BODY_RAW, Cow::Borrowed(bytes))),
    };

    sink.put(DOMAIN_TAG);
    sink.put_field(req.method.as_bytes());
    sink.put_field(req.route.as_bytes());
    sink.put_field(normalize_path(req.path).as_bytes());

    put_query(sink, req.query);

    sink.put_len(req.content_types.len());
    for value in req.content_types {
        put_media_type(sink, value, json);
    }

    let mut headers: Vec<(String, &[u8])> = req
        .headers
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim_ascii()))
        .collect();
    headers.sort_by(|a, b| a.0.cmp(&b.0));
    sink.put_len(headers.len());
    for (name, value) in &headers {
        sink.put_field(name.as_bytes());
        sink.put_field(value);
    }

    put_body(sink, body.as_ref().map(|(kind, bytes)| (*kind, &**bytes)));
    Ok(())
}

fn put_body(sink: &mut impl Sink, body: Option<(u8, &[u8])>) {
    match body {
        None => sink.put(&[BODY_EMPTY]),
        Some((kind, bytes)) => {
            sink.put(&[kind]);
            sink.put_field(bytes);
        }
    }
}

/// One query pair: name and value split at literal `+` into
/// percent-decoded pieces; `None` for a pair without `=`.
struct QueryPair<'a> {
    name: Vec<Cow<'a, [u8]>>,
    value: Option<Vec<Cow<'a, [u8]>>>,
}

/// The count of pairs that marks a query written whole (it has a literal
/// `;`): no count of pairs can reach it, so the form of a query without
/// `;` is what it always was.
const QUERY_WHOLE: usize = usize::MAX;

fn query_pairs(query: &str) -> impl Iterator<Item = QueryPair<'_>> {
    fn pieces(part: &str) -> Vec<Cow<'_, [u8]>> {
        part.split('+')
            .map(|piece| Cow::from(percent_decode_str(piece)))
            .collect()
    }
    query.split('&').filter(|p| !p.is_empty()).map(move |pair| {
        let (name, value) = match pair.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (pair, None),
        };
        QueryPair {
            name: pieces(name),
            value: value.map(pieces),
        }
    })
}

fn put_pieces(sink: &mut impl Sink, pieces: &[Cow<'_, [u8]>]) {
    sink.put_len(pieces.len());
    for piece in pieces {
        sink.put_field(piece);
    }
}

/// The query as pairs, or, when it has a literal `;`, whole: upstreams
/// that split pairs at `;` see pairs, names and values that a split at
/// `&` cannot (`?x=1;a=2` against `?x=1;a%3D2`, or a reordering across
/// the `;`), so such a query is written as its own bytes, escapes in the
/// normal form of the path (unreserved ones decoded, the others
/// uppercased), and in its order.
fn put_query(sink: &mut impl Sink, query: &str) {
    if query.contains(';') {
        sink.put_len(QUERY_WHOLE);
        sink.put_field(normalize_path(query).as_bytes());
        return;
    }
    let mut pairs: Vec<QueryPair<'_>> = query_pairs(query).collect();
    if names_sort_safely(&pairs) {
        pairs.sort_by(|a, b| a.name.cmp(&b.name));
    }
    sink.put_len(pairs.len());
    for pair in &pairs {
        put_pieces(sink, &pair.name);
        match &pair.value {
            None => sink.put(&[QUERY_NO_VALUE]),
            Some(value) => {
                sink.put(&[QUERY_VALUE]);
                put_pieces(sink, value);
            }
        }
    }
}

/// Whether sorting `pairs` by name can change no upstream's reading. A
/// sort moves pairs past each other, which is harmless only between names
/// that every upstream reads as different: a stable sort keeps the order
/// of pairs with equal names, but not of `A` and `a` (ASP.NET binds query
/// names without regard to case), `page_size` and `pageSize` (relaxed
/// binders), `a.b` and `a_b` (PHP), `+` and `%20` (form decoding reads
/// both as a space) or `%FE` and `%FF` (a lenient UTF-8 decoder reads both
/// as U+FFFD). So pairs are sorted only when every name, decoded, is made of
/// RFC 3986 unreserved characters (`A-Z a-z 0-9 - . _ ~`, no literal `+`)
/// and no two different names are alike once lowercased with `-._~`
/// dropped; otherwise they are written in the order sent. Whether a query
/// is sorted depends only on its names, which its form shows, so a sorted
/// form and one in the order sent can never be mistaken for each other.
fn names_sort_safely(pairs: &[QueryPair<'_>]) -> bool {
    let mut names: Vec<(Vec<u8>, &[u8])> = Vec::with_capacity(pairs.len());
    for pair in pairs {
        let [name] = pair.name.as_slice() else {
            return false;
        };
        if !name
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
        {
            return false;
        }
        let alike = name
            .iter()
            .filter(|b| b.is_ascii_alphanumeric())
            .map(u8::to_ascii_lowercase)
            .collect();
        names.push((alike, name));
    }
    names.sort_unstable();
    names
        .windows(2)
        .all(|w| w[0].0 != w[1].0 || w[0].1 == w[1].1)
}

/// Refuses a `%` that does not start an escape of two hex digits. The
/// percent-encoding crate decodes leniently (`%zz` stays `%zz`, the same
/// bytes as `%25zz`), so the check is made here, over the raw query.
fn check_escapes(query: &str) -> Result<(), FingerprintError> {
    let bytes = query.as_bytes();
    for (offset, _) in query.match_indices('%') {
        let hex = |i: usize| bytes.get(offset + i).is_some_and(u8::is_ascii_hexdigit);
        if !(hex(1) && hex(2)) {
            return Err(FingerprintError::MalformedQuery { offset });
        }
    }
    Ok(())
}

/// Whether the body is JSON: exactly one `Content-Type`, and it names JSON.
fn is_json(content_types: &[&[u8]]) -> bool {
    match content_types {
        [one] => media_type(one).is_some_and(|m| {
            m.type_() == mime::APPLICATION
                && (m.subtype() == mime::JSON || m.suffix() == Some(mime::JSON))
        }),
        _ => false,
    }
}

fn media_type(value: &[u8]) -> Option<mime::Mime> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

/// One `Content-Type` value in canonical form (see the module documentation).
fn put_media_type(sink: &mut impl Sink, value: &[u8], json: bool) {
    let Some(media) = media_type(value) else {
        sink.put(&[MEDIA_UNPARSED]);
        sink.put_field(value.trim_ascii());
        return;
    };
    sink.put(&[MEDIA_PARSED]);
    sink.put_field(media.essence_str().as_bytes());
    if json {
        sink.put_len(0);
        return;
    }
    // `mime` lowercases parameter names and the charset value and unquotes
    // values.
    let mut params: Vec<(&str, &str)> = media
        .params()
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect();
    params.sort_by(|a, b| a.0.cmp(b.0));
    sink.put_len(params.len());
    for (name, value) in params {
        sink.put_field(name.as_bytes());
        sink.put_field(value.as_bytes());
    }
}

/// Normalises a request path: percent-encodings of RFC 3986 unreserved
/// characters (`A-Z a-z 0-9 - . _ ~`) are decoded, the hex digits of other
/// percent-encodings are uppercased, and nothing else changes (a `%` not
/// followed by two hex digits is kept as it is).
fn normalize_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        // The crate decodes a valid escape to one byte and keeps an invalid
        // one as it is, three bytes; the policy (which bytes to decode, the
        // case of the rest) is the canonical form's, so it stays here.
        // Read without collecting: this runs for every escape of every
        // fingerprinted path.
        let escape = rest.get(at..at + 3);
        let mut decoded = escape.map(percent_decode_str);
        let byte = decoded.as_mut().map(|d| (d.next(), d.next()));
        match (escape, byte) {
            (Some(escape), Some((Some(byte), None))) => {
                if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
                    out.push(char::from(byte));
                } else {
                    // Two hex digits, so ASCII.
                    out.extend(escape.chars().map(|c| c.to_ascii_uppercase()));
                }
                rest = &rest[at + 3..];
            }
            _ => {
                out.push('%');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Version 1 of the canonical form, kept to recognise records written
/// before version 2. It refuses (returns `None` for) every request it cannot
/// tell apart from another by more than its media type.
mod v1 {
    use std::borrow::Cow;

    use percent_encoding::percent_decode_str;

    use super::{BODY_JSON, BODY_RAW, RequestParts, Sink, normalize_path, put_body};
    use crate::jcs::{self, Numbers};

    const DOMAIN_TAG: &[u8] = b"idem-fingerprint-v1\0";

    pub(super) fn write_canonical(req: &RequestParts<'_>, sink: &mut impl Sink) -> Option<()> {
        // Version 1 upper-cased the method and decoded `%3B` to the `;` it
        // left literal, so it cannot tell `patch` from `PATCH` or `a=1;b`
        // from `a=1%3Bb`, nor read a malformed escape as anything; it
        // sorted every query, which only names that sort safely allow.
        if req.method.bytes().any(|b| b.is_ascii_lowercase())
            || req.query.contains(';')
            || super::check_escapes(req.query).is_err()
            || !super::names_sort_safely(&super::query_pairs(req.query).collect::<Vec<_>>())
        {
            return None;
        }
        let body = match (req.body, req.content_types) {
            ([], _) => None,
            (_, [_, _, ..]) => return None,
            (bytes, [one]) if is_json(one) => Some((
                BODY_JSON,
                Cow::Owned(
                    jcs::canonicalize(bytes, req.exclude, Numbers::EcmascriptExactOnly).ok()?,
                ),
            )),
            (bytes, _) => Some((BODY_RAW, Cow::Borrowed(bytes))),
        };

        sink.put(DOMAIN_TAG);
        sink.put_field(req.method.to_ascii_uppercase().as_bytes());
        sink.put_field(req.route.as_bytes());
        sink.put_field(normalize_path(req.path).as_bytes());

        let mut query = req
            .query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|pair| {
                let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                Some((decode(name)?, decode(value)?))
            })
            .collect::<Option<Vec<(String, String)>>>()?;
        put_unique_pairs(sink, &mut query)?;

        let mut headers = req
            .headers
            .iter()
            .map(|(n, v)| {
                Some((
                    n.to_ascii_lowercase(),
                    std::str::from_utf8(v).ok()?.trim_ascii(),
                ))
            })
            .collect::<Option<Vec<(String, &str)>>>()?;
        put_unique_pairs(sink, &mut headers)?;

        put_body(sink, body.as_ref().map(|(kind, bytes)| (*kind, &**bytes)));
        Some(())
    }

    /// Pairs sorted by (name, value) as version 1 wrote them; `None` if a
    /// name repeats, since that sort lost the order of its values.
    fn put_unique_pairs<V: AsRef<str> + Ord>(
        sink: &mut impl Sink,
        pairs: &mut [(String, V)],
    ) -> Option<()> {
        pairs.sort_unstable();
        if pairs.windows(2).any(|w| w[0].0 == w[1].0) {
            return None;
        }
        sink.put_len(pairs.len());
        for (name, value) in pairs.iter() {
            sink.put_field(name.as_bytes());
            sink.put_field(value.as_ref().as_bytes());
        }
        Some(())
    }

    /// Form decoding (`+` is a space, then percent-decoding) to text; `None`
    /// when the bytes are not UTF-8, where version 1 kept the raw text and so
    /// could not tell `%ff` from `%25ff`.
    fn decode(raw: &str) -> Option<String> {
        let spaced = raw.replace('+', " ");
        String::from_utf8(percent_decode_str(&spaced).collect()).ok()
    }

    /// Version 1's test: the media type before any `;`, lowercased, is
    /// `application/json` or `application/…+json`.
    fn is_json(value: &[u8]) -> bool {
        let Ok(text) = std::str::from_utf8(value) else {
            return false;
        };
        // The header's text form is visible ASCII or tab; anything else was
        // not read as text by version 1.
        if !text
            .bytes()
            .all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
        {
            return false;
        }
        let media = text
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        media == "application/json"
            || (media.starts_with("application/") && media.ends_with("+json"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base<'a>() -> RequestParts<'a> {
        RequestParts {
            method: "POST",
            route: "/orders",
            path: "/orders",
            query: "",
            content_types: &[],
            headers: &[],
            body: b"",
            exclude: &[],
        }
    }

    fn fp(req: &RequestParts<'_>) -> Fingerprint {
        Fingerprint::of_request(req).unwrap()
    }

    fn canonical(req: &RequestParts<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        write_canonical(req, &mut out).unwrap();
        out
    }

    fn field(out: &mut Vec<u8>, bytes: &[u8]) {
        out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
        out.extend_from_slice(bytes);
    }

    fn count(out: &mut Vec<u8>, n: u64) {
        out.extend_from_slice(&n.to_be_bytes());
    }

    #[test]
    fn canonical_form_layout() {
        let exclude = [JsonPointer::parse("/nonce").unwrap()];
        let req = RequestParts {
            method: "post",
            route: "/orders/{id}",
            path: "/orders/%7e%2f",
            query: "b=2&a=x+%2B&a&b=1",
            content_types: &[b"Application/JSON; charset=utf-8"],
            headers: &[("X-Tenant", b"  acme \t")],
            body: br#"{ "b": 1, "a": 2.0, "nonce": "x" }"#,
            exclude: &exclude,
        };
        let mut expected = b"idem-fingerprint-v2\0".to_vec();
        field(&mut expected, b"post");
        field(&mut expected, b"/orders/{id}");
        field(&mut expected, b"/orders/~%2F");
        count(&mut expected, 4);
        for (name, value) in [
            (&[&b"a"[..]][..], Some(&[&b"x"[..], b"+"][..])),
            (&[b"a"], None),
            (&[b"b"], Some(&[b"2"])),
            (&[b"b"], Some(&[b"1"])),
        ] {
            count(&mut expected, name.len() as u64);
            name.iter().for_each(|p| field(&mut expected, p));
            match value {
                None => expected.push(0),
                Some(value) => {
                    expected.push(1);
                    count(&mut expected, value.len() as u64);
                    value.iter().for_each(|p| field(&mut expected, p));
                }
            }
        }
        count(&mut expected, 1);
        expected.push(0);
        field(&mut expected, b"application/json");
        count(&mut expected, 0);
        count(&mut expected, 1);
        field(&mut expected, b"x-tenant");
        field(&mut expected, b"acme");
        expected.push(1);
        field(&mut expected, br#"{"a":2,"b":1}"#);
        assert_eq!(canonical(&req), expected);

        let raw = RequestParts {
            content_types: &[b"Text/Plain; Charset=\"UTF-8\"; q=A", b"no media type "],
            body: b"\x00\x01",
            ..base()
        };
        let mut expected = b"idem-fingerprint-v2\0".to_vec();
        field(&mut expected, b"POST");
        field(&mut expected, b"/orders");
        field(&mut expected, b"/orders");
        count(&mut expected, 0);
        count(&mut expected, 2);
        expected.push(0);
        field(&mut expected, b"text/plain");
        count(&mut expected, 2);
        field(&mut expected, b"charset");
        field(&mut expected, b"utf-8");
        field(&mut expected, b"q");
        field(&mut expected, b"A");
        expected.push(1);
        field(&mut expected, b"no media type");
        count(&mut expected, 0);
        expected.push(2);
        field(&mut expected, b"\x00\x01");
        assert_eq!(canonical(&raw), expected);
    }

    #[test]
    fn fingerprint_is_sha256_of_canonical_form() {
        let req = base();
        let digest: [u8; 32] = Sha256::digest(canonical(&req)).into();
        assert_eq!(fp(&req), Fingerprint::from_bytes(digest));
    }

    /// Pins both versions of the canonical form. Version 1's answer is the
    /// one the previous release computed for this request, so records it
    /// wrote keep matching; if version 2's changes, stored fingerprints stop
    /// matching retries and the domain tag must be bumped.
    #[test]
    fn known_answers() {
        let req = RequestParts {
            method: "POST",
            route: "/payments",
            path: "/payments",
            query: "currency=EUR",
            content_types: &[b"application/json"],
            headers: &[("Idempotency-Tenant", b"acme")],
            body: br#"{"amount":100,"to":"bob"}"#,
            exclude: &[],
        };
        assert_eq!(
            Fingerprint::of_request_v1(&req)
                .map(|f| f.to_hex())
                .as_deref(),
            Some("d8a8e2525ff159209b1338bc7ece8fed3aa7d4865cf0a82d531f65b7d32c353b")
        );
        assert_eq!(
            fp(&req).to_hex(),
            "8611624115860305b3b13c8ae643be473c1d795786319e55ecdd04f79b6afc43"
        );
    }

    #[test]
    fn equivalent_requests_fingerprint_the_same() {
        let exclude = [JsonPointer::parse("/sent_at").unwrap()];
        let a = RequestParts {
            path: "/orders/%41%62%2d%2e%5f%7e%2f%3a",
            query: "a=1&b=%41&&a=0&c=%e9",
            content_types: &[b"application/json"],
            headers: &[("X-Tenant", b" acme "), ("Accept-Language", b"en")],
            body: br#"{"amount": 1.50, "sent_at": "2024-01-01T00:00:00Z", "to": "bob"}"#,
            exclude: &exclude,
            ..base()
        };
        let b = RequestParts {
            path: "/orders/Ab-._~%2f%3A",
            query: "b=A&a=1&c=%E9&a=0",
            content_types: &[b"APPLICATION/json; charset=UTF-8"],
            headers: &[("accept-language", b"en\t"), ("x-tenant", b"acme")],
            body: br#"{"to":"bob","amount":15e-1,"sent_at":"2025-06-30T12:34:56Z"}"#,
            exclude: &exclude,
            ..base()
        };
        assert_eq!(fp(&a), fp(&b));
    }

    #[test]
    fn empty_bodies_fingerprint_the_same_whatever_their_media_type_kind() {
        let empty = fp(&base());
        assert_ne!(
            fp(&RequestParts {
                body: b" ",
                ..base()
            }),
            empty
        );
        let json = RequestParts {
            content_types: &[b"application/json"],
            ..base()
        };
        let text = RequestParts {
            content_types: &[b"text/plain"],
            ..base()
        };
        assert_ne!(
            fp(&json),
            fp(&text),
            "the media type counts even without a body"
        );
    }

    /// Each variant differs from the others in one component; no two may
    /// share a fingerprint.
    #[test]
    fn different_requests_fingerprint_differently() {
        let with = |f: &dyn Fn(&mut RequestParts<'static>)| {
            let mut req = base();
            f(&mut req);
            req
        };
        let variants: Vec<RequestParts<'static>> = vec![
            base(),
            with(&|r| r.method = "PUT"),
            with(&|r| r.method = "post"),
            with(&|r| r.route = "/orders/{id}"),
            with(&|r| r.path = "/orders/"),
            with(&|r| r.path = "/Orders"),
            with(&|r| r.path = "/orders%2F"),
            with(&|r| r.query = "a=bc"),
            with(&|r| r.query = "ab=c"),
            with(&|r| r.query = "a&b"),
            with(&|r| r.query = "a=b"),
            with(&|r| r.query = "a"),
            with(&|r| r.query = "a="),
            with(&|r| r.query = "="),
            with(&|r| r.query = "a=%ff"),
            with(&|r| r.query = "a=%25ff"),
            with(&|r| r.query = "a=+"),
            with(&|r| r.query = "a=%20"),
            with(&|r| r.query = "a=%2B"),
            with(&|r| r.query = "a=1&a=2"),
            with(&|r| r.query = "a=2&a=1"),
            with(&|r| r.query = "a=1;b=2"),
            with(&|r| r.query = "a=1%3Bb=2"),
            with(&|r| r.query = "a=1&b=2"),
            with(&|r| r.query = "a=1+b=2"),
            with(&|r| r.query = "a;=1"),
            with(&|r| r.query = "a%3B=1"),
            with(&|r| r.query = "a=;"),
            with(&|r| r.query = "a=%3B"),
            with(&|r| r.query = "x=1;a=2"),
            with(&|r| r.query = "x=1;a%3D2"),
            with(&|r| r.query = "x=1;amount=200&amount=100"),
            with(&|r| r.query = "amount=100&x=1;amount=200"),
            // Names some upstream reads as one: their order counts.
            with(&|r| r.query = "+=&%20"),
            with(&|r| r.query = "%20&+="),
            with(&|r| r.query = "A=1&a=2"),
            with(&|r| r.query = "a=2&A=1"),
            with(&|r| r.query = "page_size=1&pageSize=2"),
            with(&|r| r.query = "pageSize=2&page_size=1"),
            with(&|r| r.query = "%FE=1&%FF=2"),
            with(&|r| r.query = "%FF=2&%FE=1"),
            with(&|r| r.headers = &[("a", b"bc")]),
            with(&|r| r.headers = &[("ab", b"c")]),
            with(&|r| r.headers = &[("a", b"BC")]),
            with(&|r| r.headers = &[("a", b"\xff")]),
            with(&|r| r.headers = &[("a", b"\xfe")]),
            with(&|r| r.headers = &[("a", b"1"), ("a", b"2")]),
            with(&|r| r.headers = &[("a", b"2"), ("a", b"1")]),
            with(&|r| r.content_types = &[b"text/plain"]),
            with(&|r| r.content_types = &[b"text/plain; charset=utf-8"]),
            with(&|r| r.content_types = &[b"text/plain", b"text/plain"]),
            with(&|r| r.content_types = &[b"text/plain; charset"]),
            with(&|r| r.body = b"{}"),
            with(&|r| r.body = b"{ }"),
            with(&|r| {
                r.content_types = &[b"application/json"];
                r.body = b"{}";
            }),
            with(&|r| {
                r.content_types = &[b"application/merge-patch+json"];
                r.body = b"{}";
            }),
            with(&|r| {
                r.content_types = &[b"application/json"];
                r.body = br#"{"amount":10}"#;
            }),
            with(&|r| {
                r.content_types = &[b"application/json"];
                r.body = br#"{"amount":10.0000000000000001}"#;
            }),
        ];
        let prints: Vec<Fingerprint> = variants.iter().map(fp).collect();
        for i in 0..prints.len() {
            for j in i + 1..prints.len() {
                assert_ne!(
                    prints[i], prints[j],
                    "{:?} and {:?} collide",
                    variants[i], variants[j]
                );
            }
        }
        // Without length prefixes both queries would concatenate to "abc".
        assert_ne!(canonical(&variants[7]), canonical(&variants[8]));
    }

    #[test]
    fn fields_cannot_borrow_bytes_from_each_other() {
        let a = RequestParts {
            route: "/ab",
            path: "/c",
            ..base()
        };
        let b = RequestParts {
            route: "/a",
            path: "b/c",
            ..base()
        };
        assert_ne!(fp(&a), fp(&b));
        let as_header = RequestParts {
            headers: &[("x", b"1")],
            ..base()
        };
        let as_query = RequestParts {
            query: "x=1",
            ..base()
        };
        assert_ne!(fp(&as_header), fp(&as_query));
    }

    #[test]
    fn json_errors_propagate() {
        let json = |body: &'static [u8]| RequestParts {
            content_types: &[b"application/json"],
            body,
            ..base()
        };
        let err = Fingerprint::of_request(&json(br#"{"a":1,"a":2}"#)).unwrap_err();
        assert_eq!(
            err,
            FingerprintError::Json(JcsError::DuplicateMember {
                name: "a".into(),
                offset: 7
            })
        );
        assert!(err.to_string().contains("duplicate object member name"));
        let source = std::error::Error::source(&err).unwrap();
        assert_eq!(
            source.to_string(),
            "duplicate object member name \"a\" at byte 7 (I-JSON forbids duplicate names)"
        );
        assert!(matches!(
            Fingerprint::of_request(&json(b"  ")),
            Err(FingerprintError::Json(JcsError::UnexpectedEnd { .. }))
        ));
        assert!(matches!(
            Fingerprint::of_request(&json(b"[1e9223372036854775808]")),
            Err(FingerprintError::Json(JcsError::ExponentOutOfRange { .. }))
        ));
    }

    /// A `%` that does not start two hex digits has no reading every
    /// upstream shares: no fingerprint, wherever it is in the query.
    #[test]
    fn malformed_query_escapes_are_refused() {
        for (query, refused_at) in [
            ("ref=%zz", Some(4)),
            ("ref=%4", Some(4)),
            ("ref=%", Some(4)),
            ("%", Some(0)),
            ("a=1&%g1=2", Some(4)),
            ("a=%%41", Some(2)),
            ("a=%4%41", Some(2)),
            ("ref=%25zz", None),
            ("ref=%254", None),
            ("ref=%25", None),
            ("a=%41%e9%FF", None),
            ("", None),
        ] {
            let req = RequestParts { query, ..base() };
            let refused = match Fingerprint::of_request(&req) {
                Err(FingerprintError::MalformedQuery { offset }) => Some(offset),
                Err(e) => panic!("{query}: {e}"),
                Ok(_) => None,
            };
            assert_eq!(refused, refused_at, "{query}");
            if refused.is_some() {
                assert_eq!(Fingerprint::of_request_v1(&req), None, "{query}");
            }
        }
    }

    /// Version 1 is computed only where it tells the request apart exactly.
    #[test]
    fn version_1_only_where_it_is_exact() {
        let json = |body: &'static [u8]| RequestParts {
            content_types: &[b"application/json"],
            body,
            ..base()
        };
        let with = |f: &dyn Fn(&mut RequestParts<'static>)| {
            let mut req = base();
            f(&mut req);
            req
        };
        for (name, req, computed) in [
            ("plain", base(), true),
            ("UTF-8 query", with(&|r| r.query = "a=%C3%A9+b&b=1"), true),
            ("not UTF-8 query", with(&|r| r.query = "a=%ff"), false),
            (
                "a literal ';' in the query",
                with(&|r| r.query = "a=1;b"),
                false,
            ),
            (
                "an escaped ';' in the query",
                with(&|r| r.query = "a=1%3Bb"),
                true,
            ),
            ("a lower-case method", with(&|r| r.method = "post"), false),
            ("a mixed-case method", with(&|r| r.method = "Post"), false),
            ("repeated query name", with(&|r| r.query = "a=1&a=2"), false),
            ("one header", with(&|r| r.headers = &[("a", b"1")]), true),
            (
                "repeated header",
                with(&|r| r.headers = &[("a", b"1"), ("A", b"2")]),
                false,
            ),
            (
                "header not UTF-8",
                with(&|r| r.headers = &[("a", b"\xff")]),
                false,
            ),
            (
                "exact numbers",
                json(br#"[1.5, 0.1, 1e21, 9007199254740992]"#),
                true,
            ),
            (
                "a rounded decimal",
                json(br#"[10.0000000000000001]"#),
                false,
            ),
            ("a rounded integer", json(br#"[9007199254740993]"#), false),
            ("beyond a double", json(br#"[1e400]"#), false),
            ("underflow", json(br#"[1e-400]"#), false),
            ("broken JSON", json(b"[1,"), false),
            (
                "two content types",
                with(&|r| {
                    r.content_types = &[b"text/plain", b"text/plain"];
                    r.body = b"x";
                }),
                false,
            ),
            (
                "two content types, no body",
                with(&|r| r.content_types = &[b"text/plain", b"text/plain"]),
                true,
            ),
        ] {
            let v1 = Fingerprint::of_request_v1(&req);
            assert_eq!(v1.is_some(), computed, "{name}");
            if let Some(v1) = v1 {
                assert_ne!(Some(v1), Fingerprint::of_request(&req).ok(), "{name}");
            }
        }
    }

    #[test]
    fn path_normalisation() {
        for (input, expected) in [
            ("/a", "/a"),
            ("/a/", "/a/"),
            ("", ""),
            ("/%41%5a%61%7A%30%39", "/AZaz09"),
            ("/%2d%2E%5f%7e", "/-._~"),
            ("/%2f%3a%3F%25%20", "/%2F%3A%3F%25%20"),
            ("/%c3%a9", "/%C3%A9"),
            ("/%", "/%"),
            ("/%4", "/%4"),
            ("/%g1", "/%g1"),
            ("/%%41", "/%A"),
            ("/%2541", "/%2541"),
            ("/é/~", "/é/~"),
            ("/a+b", "/a+b"),
            ("/A%42c", "/ABc"),
            ("/%é", "/%é"),
            ("/%4é%4", "/%4é%4"),
            ("/%%%2f%", "/%%%2F%"),
        ] {
            assert_eq!(normalize_path(input), expected, "{input:?}");
        }
    }

    #[test]
    fn hex_round_trip() {
        let mut bytes = [0u8; 32];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37) ^ 0xa5;
        }
        let f = Fingerprint::from_bytes(bytes);
        let hex = f.to_hex();
        assert_eq!(hex.len(), 64);
        assert!(
            hex.bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        );
        assert_eq!(Fingerprint::from_hex(&hex).unwrap(), f);
        assert_eq!(Fingerprint::from_hex(&hex.to_uppercase()).unwrap(), f);
        assert_eq!(hex.parse::<Fingerprint>().unwrap(), f);
        assert_eq!(f.to_string(), hex);
        assert_eq!(format!("{f:?}"), format!("Fingerprint({hex})"));
        assert_eq!(f.as_bytes(), &bytes);
        assert_eq!(
            Fingerprint::from_bytes([0xab; 32]).to_hex(),
            "ab".repeat(32)
        );
    }

    #[test]
    fn hex_errors() {
        let good = "0".repeat(64);
        for (input, offset, reason) in [
            ("", 0, "a fingerprint is exactly 64 hexadecimal digits"),
            ("abc", 3, "a fingerprint is exactly 64 hexadecimal digits"),
            (
                &good[..63],
                63,
                "a fingerprint is exactly 64 hexadecimal digits",
            ),
            (
                &"0".repeat(65),
                64,
                "a fingerprint is exactly 64 hexadecimal digits",
            ),
            (&format!("g{}", &good[1..]), 0, "not a hexadecimal digit"),
            (&format!("{}x", &good[1..]), 63, "not a hexadecimal digit"),
            (
                &format!("{} {}", &good[..10], &good[11..]),
                10,
                "not a hexadecimal digit",
            ),
            (&format!("+{}", &good[1..]), 0, "not a hexadecimal digit"),
        ] {
            let err = Fingerprint::from_hex(input).unwrap_err();
            assert_eq!(
                err,
                FingerprintError::BadHex { offset, reason },
                "{input:?}"
            );
            assert!(err.to_string().contains(reason));
            assert!(std::error::Error::source(&err).is_none());
        }
        // Multi-byte characters are not hex digits (and must not panic).
        let err = Fingerprint::from_hex(&format!("é{}", &good[2..])).unwrap_err();
        assert!(matches!(err, FingerprintError::BadHex { offset: 0, .. }));
    }

    #[test]
    fn serde_as_hex_string() {
        use serde::de::IntoDeserializer;
        use serde::de::value::{Error as DeError, StrDeserializer};
        use serde::{Deserialize, Serialize};

        let f = Fingerprint::from_bytes([7; 32]);
        assert_eq!(f.serialize(StrCapture).unwrap(), f.to_hex());

        let hex = f.to_hex();
        let de: StrDeserializer<'_, DeError> = hex.as_str().into_deserializer();
        assert_eq!(Fingerprint::deserialize(de).unwrap(), f);

        let bad: StrDeserializer<'_, DeError> = "nope".into_deserializer();
        let err = Fingerprint::deserialize(bad).unwrap_err();
        assert!(err.to_string().contains("64 hexadecimal digits"), "{err}");
    }

    /// A serializer that only accepts a string, enough to observe how
    /// `Fingerprint` serialises without a format crate.
    struct StrCapture;

    #[derive(Debug)]
    struct Unsupported;

    impl fmt::Display for Unsupported {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("only strings are supported")
        }
    }

    impl std::error::Error for Unsupported {}

    impl serde::ser::Error for Unsupported {
        fn custom<T: fmt::Display>(_msg: T) -> Self {
            Unsupported
        }
    }

    macro_rules! unsupported {
        ($($name:ident($($arg:ty),*)),* $(,)?) => {
            $(fn $name(self, $(_: $arg),*) -> Result<String, Unsupported> { Err(Unsupported) })*
        };
    }

    impl serde::Serializer for StrCapture {
        type Ok = String;
        type Error = Unsupported;
        type SerializeSeq = serde::ser::Impossible<String, Unsupported>;
        type SerializeTuple = serde::ser::Impossible<String, Unsupported>;
        type SerializeTupleStruct = serde::ser::Impossible<String, Unsupported>;
        type SerializeTupleVariant = serde::ser::Impossible<String, Unsupported>;
        type SerializeMap = serde::ser::Impossible<String, Unsupported>;
        type SerializeStruct = serde::ser::Impossible<String, Unsupported>;
        type SerializeStructVariant = serde::ser::Impossible<String, Unsupported>;

        fn serialize_str(self, v: &str) -> Result<String, Unsupported> {
            Ok(v.to_owned())
        }

        unsupported!(
            serialize_bool(bool),
            serialize_i8(i8),
            serialize_i16(i16),
            serialize_i32(i32),
            serialize_i64(i64),
            serialize_u8(u8),
            serialize_u16(u16),
            serialize_u32(u32),
            serialize_u64(u64),
            serialize_f32(f32),
            serialize_f64(f64),
            serialize_char(char),
            serialize_bytes(&[u8]),
            serialize_none(),
            serialize_unit(),
            serialize_unit_struct(&'static str),
            serialize_unit_variant(&'static str, u32, &'static str),
        );

        fn serialize_some<T: ?Sized + serde::Serialize>(
            self,
            _: &T,
        ) -> Result<String, Unsupported> {
            Err(Unsupported)
        }

        fn serialize_newtype_struct<T: ?Sized + serde::Serialize>(
            self,
            _: &'static str,
            _: &T,
        ) -> Result<String, Unsupported> {
            Err(Unsupported)
        }

        fn serialize_newtype_variant<T: ?Sized + serde::Serialize>(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: &T,
        ) -> Result<String, Unsupported> {
            Err(Unsupported)
        }

        fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Unsupported> {
            Err(Unsupported)
        }

        fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Unsupported> {
            Err(Unsupported)
        }

        fn serialize_tuple_struct(
            self,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeTupleStruct, Unsupported> {
            Err(Unsupported)
        }

        fn serialize_tuple_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeTupleVariant, Unsupported> {
            Err(Unsupported)
        }

        fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Unsupported> {
            Err(Unsupported)
        }

        fn serialize_struct(
            self,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeStruct, Unsupported> {
            Err(Unsupported)
        }

        fn serialize_struct_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeStructVariant, Unsupported> {
            Err(Unsupported)
        }
    }
}
