//! Request fingerprints: a SHA-256 over a canonical, unambiguous encoding of
//! the parts of a request that decide its business meaning, so that a retry
//! with the same idempotency key can be told apart from a different request
//! that reuses the key.
//!
//! The canonical form (version 1) is, in order:
//!
//! 1. the domain tag `idem-fingerprint-v1\0`;
//! 2. the method, ASCII-uppercased;
//! 3. the route (the pattern the request matched, e.g. `/orders/{id}`);
//! 4. the path, with percent-encoded RFC 3986 unreserved characters decoded
//!    and the hex digits of other percent-encodings uppercased, nothing else
//!    changed (`/a/` and `/a` stay different);
//! 5. the query pairs, sorted by (name, value): a count, then each name and
//!    value;
//! 6. the declared headers, names ASCII-lowercased and values trimmed of
//!    surrounding ASCII whitespace, sorted by (name, value): a count, then
//!    each name and value;
//! 7. the body: a kind byte (0 empty, 1 JSON, 2 raw), then for JSON the
//!    RFC 8785 canonical bytes (see [`crate::jcs`]) and for raw the bytes as
//!    they are.
//!
//! Every string or byte field is written as a u64 big-endian length followed
//! by its bytes, and every count as a u64 big-endian, so two different
//! requests can never share a canonical form by shifting bytes between
//! neighbouring fields.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

use crate::jcs::{self, JcsError, JsonPointer};

/// Domain-separation and version tag at the start of every canonical form.
const DOMAIN_TAG: &[u8] = b"idem-fingerprint-v1\0";

/// Body kind bytes in the canonical form.
const BODY_EMPTY: u8 = 0;
const BODY_JSON: u8 = 1;
const BODY_RAW: u8 = 2;

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

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

    /// Fingerprints a request: SHA-256 over its canonical form (see the
    /// module documentation). Fails only if a JSON body cannot be
    /// canonicalised.
    pub fn of_request(req: &RequestParts<'_>) -> Result<Fingerprint, FingerprintError> {
        let mut hasher = Sha256::new();
        write_canonical(req, &mut hasher)?;
        Ok(Fingerprint(hasher.finalize().into()))
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

/// The parts of a request that take part in its fingerprint.
#[derive(Debug, Clone, Copy)]
pub struct RequestParts<'a> {
    /// The HTTP method; compared case-insensitively (ASCII).
    pub method: &'a str,
    /// The route the request matched, e.g. `/orders/{id}`.
    pub route: &'a str,
    /// The request path as received (still percent-encoded), without query.
    pub path: &'a str,
    /// Query parameters as already-decoded name/value pairs, in any order.
    pub query: &'a [(String, String)],
    /// Only the headers the route declares as part of the fingerprint, in any
    /// order; names are compared case-insensitively (ASCII).
    pub headers: &'a [(String, String)],
    /// The request body.
    pub body: Body<'a>,
}

/// A request body, as the route declares it should be fingerprinted.
#[derive(Debug, Clone, Copy)]
pub enum Body<'a> {
    /// No body. Fingerprints the same as a zero-byte [`Body::Raw`] or
    /// [`Body::Json`].
    Empty,
    /// A JSON body, fingerprinted by its RFC 8785 canonical form after
    /// removing the locations in `exclude`.
    Json {
        /// The body bytes (UTF-8 JSON).
        bytes: &'a [u8],
        /// Locations removed before canonicalisation (e.g. a client nonce).
        exclude: &'a [JsonPointer],
    },
    /// Any other body, fingerprinted byte for byte.
    Raw(&'a [u8]),
}

/// Why a fingerprint could not be computed or parsed.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FingerprintError {
    /// A JSON body could not be canonicalised.
    Json(JcsError),
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
            FingerprintError::BadHex { .. } => None,
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

/// Writes the canonical form of `req` (see the module documentation).
fn write_canonical(req: &RequestParts<'_>, sink: &mut impl Sink) -> Result<(), FingerprintError> {
    // The body is the only fallible part: canonicalise it first so nothing is
    // written for a request that cannot be fingerprinted.
    let body: Option<(u8, std::borrow::Cow<'_, [u8]>)> = match req.body {
        Body::Empty => None,
        Body::Json { bytes, .. } | Body::Raw(bytes) if bytes.is_empty() => None,
        Body::Json { bytes, exclude } => Some((
            BODY_JSON,
            std::borrow::Cow::Owned(jcs::canonicalize(bytes, exclude)?),
        )),
        Body::Raw(bytes) => Some((BODY_RAW, std::borrow::Cow::Borrowed(bytes))),
    };

    sink.put(DOMAIN_TAG);
    sink.put_field(req.method.to_ascii_uppercase().as_bytes());
    sink.put_field(req.route.as_bytes());
    sink.put_field(normalize_path(req.path).as_bytes());

    let mut query: Vec<(&str, &str)> = req
        .query
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    query.sort_unstable();
    sink.put_len(query.len());
    for (name, value) in query {
        sink.put_field(name.as_bytes());
        sink.put_field(value.as_bytes());
    }

    let mut headers: Vec<(String, &str)> = req
        .headers
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim_ascii()))
        .collect();
    headers.sort_unstable();
    sink.put_len(headers.len());
    for (name, value) in &headers {
        sink.put_field(name.as_bytes());
        sink.put_field(value.as_bytes());
    }

    match body {
        None => sink.put(&[BODY_EMPTY]),
        Some((kind, bytes)) => {
            sink.put(&[kind]);
            sink.put_field(&bytes);
        }
    }
    Ok(())
}

/// Normalises a request path: percent-encodings of RFC 3986 unreserved
/// characters (`A-Z a-z 0-9 - . _ ~`) are decoded, the hex digits of other
/// percent-encodings are uppercased, and nothing else changes (a `%` not
/// followed by two hex digits is kept as it is).
fn normalize_path(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    let mut run_start = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hi = bytes.get(i + 1).and_then(|&b| char::from(b).to_digit(16));
            let lo = bytes.get(i + 2).and_then(|&b| char::from(b).to_digit(16));
            if let (Some(hi), Some(lo)) = (hi, lo) {
                // Both < 16, so the value fits a byte.
                let decoded = (hi * 16 + lo) as u8;
                // `i` is at an ASCII '%', hence a character boundary.
                out.push_str(&path[run_start..i]);
                if decoded.is_ascii_alphanumeric() || matches!(decoded, b'-' | b'.' | b'_' | b'~') {
                    out.push(char::from(decoded));
                } else {
                    out.push('%');
                    out.push(char::from(bytes[i + 1].to_ascii_uppercase()));
                    out.push(char::from(bytes[i + 2].to_ascii_uppercase()));
                }
                i += 3;
                run_start = i;
                continue;
            }
        }
        i += 1;
    }
    out.push_str(&path[run_start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn base<'a>() -> RequestParts<'a> {
        RequestParts {
            method: "POST",
            route: "/orders",
            path: "/orders",
            query: &[],
            headers: &[],
            body: Body::Empty,
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

    #[test]
    fn canonical_form_layout() {
        let query = pairs(&[("b", "2"), ("a", "1")]);
        let headers = pairs(&[("X-Tenant", "  acme \t")]);
        let exclude = [JsonPointer::parse("/nonce").unwrap()];
        let req = RequestParts {
            method: "post",
            route: "/orders/{id}",
            path: "/orders/%7e%2f",
            query: &query,
            headers: &headers,
            body: Body::Json {
                bytes: br#"{ "b": 1, "a": 2.0, "nonce": "x" }"#,
                exclude: &exclude,
            },
        };
        let mut expected = b"idem-fingerprint-v1\0".to_vec();
        field(&mut expected, b"POST");
        field(&mut expected, b"/orders/{id}");
        field(&mut expected, b"/orders/~%2F");
        expected.extend_from_slice(&2u64.to_be_bytes());
        field(&mut expected, b"a");
        field(&mut expected, b"1");
        field(&mut expected, b"b");
        field(&mut expected, b"2");
        expected.extend_from_slice(&1u64.to_be_bytes());
        field(&mut expected, b"x-tenant");
        field(&mut expected, b"acme");
        expected.push(1);
        field(&mut expected, br#"{"a":2,"b":1}"#);
        assert_eq!(canonical(&req), expected);

        let raw = RequestParts {
            body: Body::Raw(b"\x00\x01"),
            ..base()
        };
        let mut expected = b"idem-fingerprint-v1\0".to_vec();
        field(&mut expected, b"POST");
        field(&mut expected, b"/orders");
        field(&mut expected, b"/orders");
        expected.extend_from_slice(&0u64.to_be_bytes());
        expected.extend_from_slice(&0u64.to_be_bytes());
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

    /// Pins version 1 of the canonical form: if this changes, stored
    /// fingerprints stop matching retries and the domain tag must be bumped.
    #[test]
    fn known_answer() {
        let query = pairs(&[("currency", "EUR")]);
        let headers = pairs(&[("Idempotency-Tenant", "acme")]);
        let req = RequestParts {
            method: "POST",
            route: "/payments",
            path: "/payments",
            query: &query,
            headers: &headers,
            body: Body::Json {
                bytes: br#"{"amount":100,"to":"bob"}"#,
                exclude: &[],
            },
        };
        assert_eq!(
            fp(&req).to_hex(),
            "d8a8e2525ff159209b1338bc7ece8fed3aa7d4865cf0a82d531f65b7d32c353b"
        );
    }

    #[test]
    fn equivalent_requests_fingerprint_the_same() {
        let q1 = pairs(&[("a", "1"), ("b", "2"), ("a", "0")]);
        let q2 = pairs(&[("b", "2"), ("a", "0"), ("a", "1")]);
        let h1 = pairs(&[("X-Tenant", " acme "), ("Accept-Language", "en")]);
        let h2 = pairs(&[("accept-language", "en\t"), ("x-tenant", "acme")]);
        let exclude = [JsonPointer::parse("/sent_at").unwrap()];
        let a = RequestParts {
            method: "post",
            path: "/orders/%41%62%2d%2e%5f%7e%2f%3a",
            query: &q1,
            headers: &h1,
            body: Body::Json {
                bytes: br#"{"amount": 1.50, "sent_at": "2024-01-01T00:00:00Z", "to": "bob"}"#,
                exclude: &exclude,
            },
            ..base()
        };
        let b = RequestParts {
            method: "POST",
            path: "/orders/Ab-._~%2f%3A",
            query: &q2,
            headers: &h2,
            body: Body::Json {
                bytes: br#"{"to":"bob","amount":15e-1,"sent_at":"2025-06-30T12:34:56Z"}"#,
                exclude: &exclude,
            },
            ..base()
        };
        assert_eq!(fp(&a), fp(&b));
    }

    #[test]
    fn empty_bodies_fingerprint_the_same() {
        let empty = fp(&base());
        for body in [
            Body::Raw(b""),
            Body::Json {
                bytes: b"",
                exclude: &[],
            },
        ] {
            assert_eq!(fp(&RequestParts { body, ..base() }), empty, "{body:?}");
        }
        assert_ne!(
            fp(&RequestParts {
                body: Body::Raw(b" "),
                ..base()
            }),
            empty
        );
    }

    #[test]
    fn different_requests_fingerprint_differently() {
        let q_abc = pairs(&[("a", "bc")]);
        let q_ab_c = pairs(&[("ab", "c")]);
        let q_two = pairs(&[("a", ""), ("b", "")]);
        let q_one = pairs(&[("a", "b")]);
        let q_empty_pair = pairs(&[("", "")]);
        let h_abc = pairs(&[("a", "bc")]);
        let h_ab_c = pairs(&[("ab", "c")]);
        let h_case = pairs(&[("a", "BC")]);
        let variants: Vec<RequestParts<'_>> = vec![
            base(),
            RequestParts {
                method: "PUT",
                ..base()
            },
            RequestParts {
                route: "/orders/{id}",
                ..base()
            },
            RequestParts {
                path: "/orders/",
                ..base()
            },
            RequestParts {
                path: "/Orders",
                ..base()
            },
            RequestParts {
                path: "/orders%2F",
                ..base()
            },
            RequestParts {
                query: &q_abc,
                ..base()
            },
            RequestParts {
                query: &q_ab_c,
                ..base()
            },
            RequestParts {
                query: &q_two,
                ..base()
            },
            RequestParts {
                query: &q_one,
                ..base()
            },
            RequestParts {
                query: &q_empty_pair,
                ..base()
            },
            RequestParts {
                headers: &h_abc,
                ..base()
            },
            RequestParts {
                headers: &h_ab_c,
                ..base()
            },
            RequestParts {
                headers: &h_case,
                ..base()
            },
            // The same bytes as JSON and as raw differ by the kind byte.
            RequestParts {
                body: Body::Json {
                    bytes: b"{}",
                    exclude: &[],
                },
                ..base()
            },
            RequestParts {
                body: Body::Raw(b"{}"),
                ..base()
            },
            RequestParts {
                body: Body::Raw(b"{ }"),
                ..base()
            },
            RequestParts {
                body: Body::Json {
                    bytes: br#"{"amount":1}"#,
                    exclude: &[],
                },
                ..base()
            },
            RequestParts {
                body: Body::Json {
                    bytes: br#"{"amount":2}"#,
                    exclude: &[],
                },
                ..base()
            },
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
        // The case from the module docs, spelled out: without length
        // prefixes both queries would concatenate to "abc".
        assert_ne!(canonical(&variants[6]), canonical(&variants[7]));
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
        let h = pairs(&[("x", "1")]);
        let q = pairs(&[("x", "1")]);
        let as_header = RequestParts {
            headers: &h,
            ..base()
        };
        let as_query = RequestParts {
            query: &q,
            ..base()
        };
        assert_ne!(fp(&as_header), fp(&as_query));
    }

    #[test]
    fn json_errors_propagate() {
        let req = RequestParts {
            body: Body::Json {
                bytes: br#"{"a":1,"a":2}"#,
                exclude: &[],
            },
            ..base()
        };
        let err = Fingerprint::of_request(&req).unwrap_err();
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
        let whitespace_only = RequestParts {
            body: Body::Json {
                bytes: b"  ",
                exclude: &[],
            },
            ..base()
        };
        assert!(matches!(
            Fingerprint::of_request(&whitespace_only),
            Err(FingerprintError::Json(JcsError::UnexpectedEnd { .. }))
        ));
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
