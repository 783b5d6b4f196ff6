//! `Access-Control-Expose-Headers` for the headers idem adds, on routes
//! that declare browser callers (`cors_expose = true`): a script can read
//! only the CORS-safelisted response headers unless the response names
//! the others, and `Idempotent-Replayed`, `Idempotency-Expires`,
//! `Retry-After`, `Location` and `Preference-Applied` are not safelisted.
//! The upstream's own list is kept and merged, each name once.

use http::header::ACCESS_CONTROL_EXPOSE_HEADERS;
use http::{HeaderValue, Response};

/// The response headers idem adds that a browser caller needs to read.
pub const EXPOSED_HEADERS: [&str; 5] = [
    "Idempotent-Replayed",
    "Idempotency-Expires",
    "Retry-After",
    "Location",
    "Preference-Applied",
];

/// Whether a route's responses name idem's headers for browser callers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CorsExpose {
    /// Responses are passed as they are (the default).
    #[default]
    Off,
    /// Responses carry `Access-Control-Expose-Headers` with
    /// [`EXPOSED_HEADERS`], merged with the upstream's.
    IdempotencyHeaders,
}

/// Merges [`EXPOSED_HEADERS`] into `response`'s expose list when `expose`
/// says so: the upstream's names first, as it sent them, then idem's that
/// it did not name (compared ASCII case-insensitively), in one header.
pub(crate) fn expose<B>(expose: CorsExpose, mut response: Response<B>) -> Response<B> {
    if expose == CorsExpose::Off {
        return response;
    }
    let headers = response.headers_mut();
    let mut names: Vec<String> = Vec::new();
    let sent = headers.get_all(ACCESS_CONTROL_EXPOSE_HEADERS).iter();
    let upstream = sent
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|name| !name.is_empty());
    for name in upstream.chain(EXPOSED_HEADERS) {
        if !names.iter().any(|n| n.eq_ignore_ascii_case(name)) {
            names.push(name.to_owned());
        }
    }
    // Names are tokens, so the joined list is a valid value; one that is
    // not (an upstream's odd bytes were dropped above) leaves it alone.
    if let Ok(value) = HeaderValue::from_str(&names.join(", ")) {
        headers.insert(ACCESS_CONTROL_EXPOSE_HEADERS, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposed(sent: &[&str], expose_mode: CorsExpose) -> Vec<String> {
        let mut response = Response::new(());
        for v in sent {
            response
                .headers_mut()
                .append(ACCESS_CONTROL_EXPOSE_HEADERS, v.parse().unwrap());
        }
        let response = expose(expose_mode, response);
        response
            .headers()
            .get_all(ACCESS_CONTROL_EXPOSE_HEADERS)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn idem_s_headers_are_merged_with_the_upstream_s_once_each() {
        let all = EXPOSED_HEADERS.join(", ");
        let cases: [(&[&str], CorsExpose, Vec<String>); 5] = [
            (&[], CorsExpose::Off, vec![]),
            (
                &["X-Request-Id"],
                CorsExpose::Off,
                vec!["X-Request-Id".into()],
            ),
            (&[], CorsExpose::IdempotencyHeaders, vec![all.clone()]),
            (
                &["X-Request-Id, location", "retry-after"],
                CorsExpose::IdempotencyHeaders,
                vec![
                    "X-Request-Id, location, retry-after, Idempotent-Replayed, \
                     Idempotency-Expires, Preference-Applied"
                        .into(),
                ],
            ),
            (
                &[
                    "Idempotent-Replayed, Idempotency-Expires, Retry-After, Location, Preference-Applied",
                ],
                CorsExpose::IdempotencyHeaders,
                vec![all],
            ),
        ];
        for (sent, mode, want) in cases {
            assert_eq!(exposed(sent, mode), want, "{sent:?} {mode:?}");
        }
    }
}
