//! Reading what the contract needs out of a request: the key, the principal,
//! the scope, the fingerprint. Each returns a problem instead of guessing.

use bytes::Bytes;
use http::HeaderMap;
use http::request::Parts;
use idem_core::{Body, Fingerprint, IdempotencyKey, RequestParts, Scope, to_hex};
use sha2::{Digest, Sha256};

use crate::problem::{Problem, ProblemKind};
use crate::route::{Operation, Route};

/// Operations longer than this are replaced by their digest in the scope.
const OPERATION_BYTES_MAX: usize = 512;

/// The key of a request: `Ok(None)` when the header is absent.
pub(crate) fn key(headers: &HeaderMap, route: &Route) -> Result<Option<IdempotencyKey>, Problem> {
    let mut values = headers.get_all(&route.key_header).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let name = route.key_header.as_str();
    if values.next().is_some() {
        return Err(Problem::new(
            ProblemKind::InvalidKey,
            format!("{name} was sent more than once"),
        ));
    }
    let text = value.to_str().map_err(|_| {
        Problem::new(
            ProblemKind::InvalidKey,
            format!("{name} is not visible ASCII"),
        )
    })?;
    IdempotencyKey::parse(text)
        .map(Some)
        .map_err(|e| Problem::new(ProblemKind::InvalidKey, format!("{name}: {e}")))
}

/// The scope: operation plus the route's principal (always a digest, so
/// raw credentials and tenant names never reach the store).
pub(crate) fn scope(parts: &Parts, route: &Route) -> Result<Scope, Problem> {
    let operation = match &route.operation {
        Operation::Named(name) => name.clone(),
        Operation::MethodAndPath => {
            let op = format!("{} {}", parts.method, parts.uri.path().replace('|', "%7C"));
            if op.len() > OPERATION_BYTES_MAX {
                format!(
                    "{} sha256:{}",
                    parts.method,
                    to_hex(&Sha256::digest(parts.uri.path()))
                )
            } else {
                op
            }
        }
    };
    let principal = route.principal.of(&parts.headers)?;
    Scope::from_parts(&operation, &principal, None)
        .map_err(|e| Problem::new(ProblemKind::InvalidKey, format!("cannot form a scope: {e}")))
}

/// A short digest of the scope, for key templates that prefix it.
pub(crate) fn scope_digest(scope: &Scope) -> String {
    to_hex(&Sha256::digest(scope.as_str().as_bytes())[..8])
}

/// The fingerprint of the request, per the route's declarations.
pub(crate) fn fingerprint(
    parts: &Parts,
    route: &Route,
    body: &Bytes,
) -> Result<Fingerprint, Problem> {
    let query = parts.uri.query().map(query_pairs).unwrap_or_default();
    let headers: Vec<(String, String)> = route
        .fingerprint_headers
        .iter()
        .flat_map(|name| {
            parts.headers.get_all(name).iter().map(move |v| {
                (
                    name.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
        })
        .collect();
    let body = if body.is_empty() {
        Body::Empty
    } else if is_json(&parts.headers) {
        Body::Json {
            bytes: body,
            exclude: &route.fingerprint_exclude,
        }
    } else {
        Body::Raw(body)
    };
    let request = RequestParts {
        method: parts.method.as_str(),
        route: route.pattern.as_str(),
        path: parts.uri.path(),
        query: &query,
        headers: &headers,
        body,
    };
    Fingerprint::of_request(&request).map_err(|e| {
        Problem::new(
            ProblemKind::InvalidBody,
            format!("the JSON body cannot be fingerprinted: {e}"),
        )
    })
}

fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let media = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"))
}

/// `a=1&b=x%20y` → pairs, percent-decoded where the result is UTF-8 (kept
/// raw otherwise, so two different raw values never decode to one).
fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(name), decode(value))
        })
        .collect()
}

fn decode(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match bytes.get(i..i + 3) {
            Some([b'%', hi, lo]) => hex_value(*hi).zip(hex_value(*lo)).map(|(h, l)| h << 4 | l),
            _ => None,
        };
        match (escaped, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, b) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| raw.to_owned())
}

fn hex_value(digit: u8) -> Option<u8> {
    (digit as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_query_pairs() {
        let cases = [
            ("a=1&b=2", vec![("a", "1"), ("b", "2")]),
            ("x=a%20b+c", vec![("x", "a b c")]),
            ("flag&&y=", vec![("flag", ""), ("y", "")]),
            ("bad=%zz%4", vec![("bad", "%zz%4")]),
            ("raw=%ff", vec![("raw", "%ff")]),
            ("e=%C3%A9", vec![("e", "é")]),
        ];
        for (query, expect) in cases {
            let want: Vec<(String, String)> = expect
                .into_iter()
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .collect();
            assert_eq!(query_pairs(query), want, "{query}");
        }
    }

    #[test]
    fn detects_json_media_types() {
        let cases = [
            ("application/json", true),
            ("Application/JSON; charset=utf-8", true),
            ("application/merge-patch+json", true),
            ("text/plain", false),
            ("application/jsonx", false),
        ];
        for (ct, expect) in cases {
            let mut h = HeaderMap::new();
            h.insert(http::header::CONTENT_TYPE, ct.parse().unwrap());
            assert_eq!(is_json(&h), expect, "{ct}");
        }
    }
}
