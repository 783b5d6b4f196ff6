//! The status URL: where a caller whose connection dropped asks what became
//! of its own key without sending the request again (docs/http.md, "The
//! status URL"). `GET {path}/.idem/{key}` by default, beside the protected
//! path. The key is looked up in the scope a claim of the same request
//! would use (same operation, same principal), so another principal's key
//! is a key never seen; nothing is claimed, forwarded or written, except
//! that an unknown outcome is settled by the route's lookup as a retry's is.
//!
//! The key is the last path segment, percent-decoded, and is the key's own
//! text (not the header's quoted form): the header `"\"a\""` names the key
//! `"a"`, whose status URL ends in `/%22a%22`. Its path before the key is
//! normalised as any request path is; the key segment is decoded apart,
//! so that keys with `/`, `\` or `%` can be spelled (`%2F`, `%5C`, `%25`).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode};
use idem_core::IdempotencyKey;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

use crate::path::normalize_path;
use crate::problem::{Problem, ProblemKind};

/// The status URL template a route has unless it says otherwise.
pub const STATUS_URL_DEFAULT: &str = "{path}/.idem/{key}";

/// The config value that turns a route's status URL off.
pub const STATUS_URL_OFF: &str = "off";

/// The longest suffix a status URL template may put between `{path}` and
/// `{key}`, in bytes.
pub const STATUS_SUFFIX_BYTES_MAX: usize = 64;

/// Every byte but RFC 3986's unreserved characters: how a key is spelled
/// in its status URL's last segment.
const KEY_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The query parameter naming the method whose scope a status URL asks.
pub const METHOD_PARAMETER: &str = "method";

/// The method a status URL's `query` names (`method=PUT`, any case), if
/// any; `Err` when it names something that is no method.
pub(crate) fn asked_method(query: Option<&str>) -> Result<Option<http::Method>, Problem> {
    let Some(value) = query
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix(METHOD_PARAMETER)?.strip_prefix('='))
    else {
        return Ok(None);
    };
    http::Method::from_bytes(value.to_ascii_uppercase().as_bytes())
        .map(Some)
        .map_err(|_| {
            Problem::new(
                ProblemKind::InvalidPath,
                format!("the status URL's {METHOD_PARAMETER} is not a method: {value:?}"),
            )
        })
}

/// `key` as its status URL's last segment. The keys `.` and `..` are
/// spelled `%2E`, as a dot segment a client would resolve away (RFC 3986
/// §5.2.4) before it asks; [`StatusUrl::split`] decodes them back.
fn key_segment(key: &IdempotencyKey) -> String {
    match key.as_str() {
        "." => "%2E".to_owned(),
        ".." => "%2E%2E".to_owned(),
        key => utf8_percent_encode(key, KEY_SEGMENT).to_string(),
    }
}

/// Where a route answers "what became of my key?".
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatusUrl {
    /// No status URL: such a `GET` goes where any other does.
    Off,
    /// `{path}{suffix}/{key}`: under each protected path, for `GET`.
    Under {
        /// The literal segments between the path and the key, with their
        /// leading `/` (`/.idem`).
        suffix: String,
    },
}

impl Default for StatusUrl {
    fn default() -> StatusUrl {
        StatusUrl::Under {
            suffix: "/.idem".to_owned(),
        }
    }
}

impl StatusUrl {
    /// Reads a template: [`STATUS_URL_OFF`], or `{path}` then one or more
    /// literal segments of unreserved characters then `/{key}`, as
    /// [`STATUS_URL_DEFAULT`].
    pub fn parse(template: &str) -> Result<StatusUrl, String> {
        if template == STATUS_URL_OFF {
            return Ok(StatusUrl::Off);
        }
        let expected = || {
            format!(
                "{template:?} is neither {STATUS_URL_OFF:?} nor a template such as \
                 {STATUS_URL_DEFAULT:?}: {{path}}, literal segments, then /{{key}}"
            )
        };
        let suffix = template
            .strip_prefix("{path}")
            .and_then(|rest| rest.strip_suffix("/{key}"))
            .ok_or_else(expected)?;
        let unreserved = |b: u8| b.is_ascii_alphanumeric() || b"-._~".contains(&b);
        let segments_ok = suffix.strip_prefix('/').is_some_and(|body| {
            body.split('/').all(|seg| {
                !seg.is_empty() && seg != "." && seg != ".." && seg.bytes().all(unreserved)
            })
        });
        if !segments_ok || suffix.len() > STATUS_SUFFIX_BYTES_MAX {
            return Err(format!(
                "{}; the segments between {{path}} and {{key}} must be unreserved characters \
                 (letters, digits, - . _ ~), not . or .., at most {STATUS_SUFFIX_BYTES_MAX} bytes",
                expected()
            ));
        }
        Ok(StatusUrl::Under {
            suffix: suffix.to_owned(),
        })
    }

    /// The template, as [`StatusUrl::parse`] reads it.
    pub fn template(&self) -> String {
        match self {
            StatusUrl::Off => STATUS_URL_OFF.to_owned(),
            StatusUrl::Under { suffix } => format!("{{path}}{suffix}/{{key}}"),
        }
    }

    /// The status URL of `key` for a request to `path` (normal form), or
    /// `None` when the route has none. With `method`, the URL names it
    /// (`?method=PUT`), so that it is asked in that method's scope and
    /// route alone: one key under two methods is two intents.
    pub fn location(
        &self,
        path: &str,
        key: &IdempotencyKey,
        method: Option<&http::Method>,
    ) -> Option<String> {
        let StatusUrl::Under { suffix } = self else {
            return None;
        };
        let base = path.strip_suffix('/').unwrap_or(path);
        let key = key_segment(key);
        Some(match method {
            Some(method) => {
                let method = method.as_str().to_ascii_uppercase();
                format!("{base}{suffix}/{key}?{METHOD_PARAMETER}={method}")
            }
            None => format!("{base}{suffix}/{key}"),
        })
    }

    /// The status URL template with the protected path filled in
    /// (`/payouts/.idem/{key}`), `None` when the route has none.
    pub fn location_template(&self, path: &str) -> Option<String> {
        let StatusUrl::Under { suffix } = self else {
            return None;
        };
        let base = path.strip_suffix('/').unwrap_or(path);
        Some(format!("{base}{suffix}/{{key}}"))
    }

    /// Splits a request path into the protected path (normal form) and the
    /// key, when it is this route's status URL; the key's refusal when its
    /// segment is not a key.
    pub(crate) fn split(
        &self,
        raw_path: &str,
    ) -> Option<(String, Result<IdempotencyKey, Problem>)> {
        let StatusUrl::Under { suffix } = self else {
            return None;
        };
        let (prefix, segment) = raw_path.rsplit_once('/')?;
        let normal = normalize_path(prefix).ok()?;
        let base = normal.strip_suffix(suffix.as_str())?;
        let base = if base.is_empty() { "/" } else { base };
        Some((base.to_owned(), key_of(segment)))
    }
}

impl StatusUrl {
    /// The protected path whose policy document `raw_path` asks for
    /// (`{path}/.idem`), when it does.
    pub(crate) fn policy_base(&self, raw_path: &str) -> Option<String> {
        let StatusUrl::Under { suffix } = self else {
            return None;
        };
        let normal = normalize_path(raw_path).ok()?;
        let base = normal.strip_suffix(suffix.as_str())?;
        Some(if base.is_empty() { "/" } else { base }.to_owned())
    }
}

/// The key a status URL's last segment spells.
fn key_of(segment: &str) -> Result<IdempotencyKey, Problem> {
    let invalid = |why: String| {
        Problem::new(
            ProblemKind::InvalidKey,
            format!("the status URL's last segment is not a key: {why}"),
        )
    };
    let text = percent_decode_str(segment)
        .decode_utf8()
        .map_err(|e| invalid(e.to_string()))?;
    IdempotencyKey::new(text.as_ref()).map_err(|e| invalid(e.to_string()))
}

/// A request for a route's status URL or its policy document.
pub(crate) struct Located {
    /// The route's index.
    pub(crate) index: usize,
    /// The method whose scope is asked (`?method=`), or every method the
    /// route protects, in order.
    pub(crate) method: Option<http::Method>,
    /// The protected path (normal form).
    pub(crate) base: String,
    /// What is asked.
    pub(crate) asked: Asked,
}

/// What a `GET` under a route's status URL asks for.
pub(crate) enum Asked {
    /// A key's outcome, or why the last segment is no key.
    Key(Result<IdempotencyKey, Problem>),
    /// The route's policy document (`GET {path}/.idem`).
    Policy,
}

/// Whether a request asks `Prefer: respond-async` (RFC 7240 §4.1).
pub(crate) fn prefers_async(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(HeaderName::from_static("prefer"))
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.split(';').next().unwrap_or("").trim())
        .any(|name| name.eq_ignore_ascii_case("respond-async"))
}

/// 202 Accepted for a request that asked `Prefer: respond-async` once its
/// claim is made: where to ask for its answer.
pub(crate) fn accepted<B: From<Bytes>>(location: &str, retry_after: Duration) -> Response<B> {
    let body = serde_json::json!({
        "status": "accepted",
        "detail": "the request is being processed; its answer will be at the Location",
        "location": location,
    });
    let mut response = Response::new(B::from(Bytes::from(body.to_string())));
    *response.status_mut() = StatusCode::ACCEPTED;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(value) = HeaderValue::from_str(location) {
        headers.insert(http::header::LOCATION, value);
    }
    headers.insert(
        HeaderName::from_static("preference-applied"),
        HeaderValue::from_static("respond-async"),
    );
    headers.insert(http::header::RETRY_AFTER, retry_after_value(retry_after));
    response
}

/// `Retry-After` in whole seconds, rounded up.
pub(crate) fn retry_after_value(retry_after: Duration) -> HeaderValue {
    HeaderValue::from(u64::try_from(retry_after.as_millis().div_ceil(1000)).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_read_or_refused() {
        assert_eq!(
            StatusUrl::parse(STATUS_URL_DEFAULT),
            Ok(StatusUrl::default())
        );
        assert_eq!(StatusUrl::parse("off"), Ok(StatusUrl::Off));
        assert_eq!(
            StatusUrl::parse("{path}/_idem/status/{key}"),
            Ok(StatusUrl::Under {
                suffix: "/_idem/status".to_owned()
            })
        );
        for bad in [
            "{path}/{key}",
            "/.idem/{key}",
            "{path}/.idem/{key}/x",
            "{path}/../{key}",
            "{path}//x/{key}",
            "{path}/a b/{key}",
            "{path}/{id}/{key}",
            "true",
        ] {
            assert!(StatusUrl::parse(bad).is_err(), "{bad}");
        }
    }

    /// Every visible ASCII key survives its status URL: encoded by
    /// `location`, read back by `split`.
    #[test]
    fn every_key_round_trips_through_its_status_url() {
        let status = StatusUrl::default();
        let all: String = (0x21u8..=0x7e).map(char::from).collect();
        let keys = [
            all.as_str(),
            "\"a\"",
            "a\\b",
            "50%",
            "a/b",
            "..",
            ".",
            "%2F",
            "p-847",
        ];
        for text in keys {
            let key = IdempotencyKey::new(text).unwrap();
            let url = status.location("/payouts", &key, None).unwrap();
            // A client resolves dot segments before it asks (RFC 3986
            // §5.2.4); `http::Uri` does not, so look for them here.
            let dots = url.split('/').any(|seg| seg == "." || seg == "..");
            assert!(!dots, "{url} would be asked for as another path");
            let uri: http::Uri = url.parse().unwrap();
            let (base, back) = status.split(uri.path()).unwrap();
            let back = back.unwrap();
            assert_eq!((base.as_str(), back.as_str()), ("/payouts", text), "{url}");
        }
    }

    #[test]
    fn a_segment_that_is_no_key_is_refused_and_other_paths_are_not_status_urls() {
        let status = StatusUrl::default();
        for segment in ["", "%FF", "a%20b", "%C3%A9"] {
            let path = format!("/payouts/.idem/{segment}");
            let refused = status.split(&path).unwrap().1.unwrap_err();
            assert_eq!(refused.kind, ProblemKind::InvalidKey, "{path}");
        }
        for path in ["/payouts", "/payouts/idem/k", "/.idemx/k", "/payouts/.idem"] {
            assert!(status.split(path).is_none(), "{path}");
        }
        assert_eq!(
            status.split("/.idem/k").unwrap().0,
            "/",
            "the root's status URL"
        );
        assert!(StatusUrl::Off.split("/payouts/.idem/k").is_none());
    }

    #[test]
    fn respond_async_is_read_among_other_preferences() {
        let cases = [
            (vec!["respond-async"], true),
            (vec!["wait=5, Respond-Async"], true),
            (vec!["wait=5", "respond-async; x=1"], true),
            (vec!["wait=5"], false),
            (vec!["respond-asynchronously"], false),
        ];
        for (values, want) in cases {
            let mut headers = http::HeaderMap::new();
            for v in &values {
                headers.append("prefer", v.parse().unwrap());
            }
            assert_eq!(prefers_async(&headers), want, "{values:?}");
        }
    }
}
