//! The reverse proxy behind the layer: forwards one request to the upstream,
//! never retries, buffers the answer within the response timeout, and marks
//! each failure with whether the request was ever sent.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use http::header::{self, HeaderMap, HeaderName};
use http::{Request, Response, Uri};
use http_body_util::{BodyExt, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_http::{AttemptOutcome, Problem, ProblemKind, RESPONSE_BYTES_MAX};

/// Forwards requests to one upstream base URL.
#[derive(Clone)]
pub struct Proxy {
    client: Client<HttpConnector, Body>,
    upstream: Uri,
    response_timeout: Duration,
}

impl Proxy {
    /// A proxy to `upstream` with the given timeouts.
    pub fn new(upstream: Uri, connect_timeout: Duration, response_timeout: Duration) -> Proxy {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            // A request that failed on a reused connection may have reached
            // the upstream: resending it is a retry, and retries are the
            // caller's decision, made through a new claim.
            .retry_canceled_requests(false)
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Proxy {
            client,
            upstream,
            response_timeout,
        }
    }

    async fn forward(&self, req: Request<Body>) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        let uri = match self.target(&parts.uri) {
            Ok(uri) => uri,
            Err(reason) => {
                return failure(
                    ProblemKind::UpstreamUnreachable,
                    reason,
                    AttemptOutcome::NotSent,
                );
            }
        };
        strip_hop_by_hop(&mut parts.headers);
        if let Some(authority) = self.upstream.authority() {
            if let Ok(host) = authority.as_str().parse() {
                parts.headers.insert(header::HOST, host);
            }
        }
        parts.uri = uri;
        let request = Request::from_parts(parts, body);
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| {
                if e.is_connect() {
                    (
                        ProblemKind::UpstreamUnreachable,
                        format!("cannot connect to the upstream: {}", chain(&e)),
                        AttemptOutcome::NotSent,
                    )
                } else {
                    (
                        ProblemKind::UpstreamFailed,
                        format!(
                            "the upstream connection failed after the request was sent: {}",
                            chain(&e)
                        ),
                        AttemptOutcome::Lost,
                    )
                }
            })?;
            let (mut parts, body) = response.into_parts();
            let bytes = Limited::new(body, RESPONSE_BYTES_MAX)
                .collect()
                .await
                .map_err(|e| {
                    (
                        ProblemKind::UpstreamFailed,
                        format!("the upstream response body failed: {e}"),
                        AttemptOutcome::Lost,
                    )
                })?;
            strip_hop_by_hop(&mut parts.headers);
            parts.headers.remove(header::CONTENT_LENGTH);
            Ok(Response::from_parts(parts, Body::from(bytes.to_bytes())))
        };
        match tokio::time::timeout(self.response_timeout, exchange).await {
            Ok(Ok(response)) => response,
            Ok(Err((kind, reason, outcome))) => failure(kind, reason, outcome),
            Err(_) => failure(
                ProblemKind::UpstreamTimeout,
                format!(
                    "no complete answer within {} ms; the request may have been processed",
                    self.response_timeout.as_millis()
                ),
                AttemptOutcome::Lost,
            ),
        }
    }

    fn target(&self, incoming: &Uri) -> Result<Uri, String> {
        let base = self.upstream.path().trim_end_matches('/');
        let path_and_query = incoming.path_and_query().map_or("/", |pq| pq.as_str());
        let mut builder = Uri::builder().path_and_query(format!("{base}{path_and_query}"));
        if let Some(scheme) = self.upstream.scheme() {
            builder = builder.scheme(scheme.clone());
        }
        if let Some(authority) = self.upstream.authority() {
            builder = builder.authority(authority.clone());
        }
        builder
            .build()
            .map_err(|e| format!("cannot build the upstream URL: {e}"))
    }
}

/// An error with its causes, `a: b: c`, so the detail says why, not only what.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn failure(kind: ProblemKind, reason: String, outcome: AttemptOutcome) -> Response<Body> {
    tracing::warn!(problem = kind.slug(), %reason, "upstream attempt failed");
    let mut response: Response<Body> = Problem::new(kind, reason).into_response();
    response.extensions_mut().insert(outcome);
    // The layer counts every problem response by this extension.
    response.extensions_mut().insert(kind);
    response
}

/// Removes the hop-by-hop headers of RFC 9110 §7.6.1, including those named
/// in `Connection`.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ] {
        headers.remove(name);
    }
}

impl tower::Service<Request<Body>> for Proxy {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let proxy = self.clone();
        Box::pin(async move { Ok(proxy.forward(req).await) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_hop_by_hop_headers() {
        let mut h = HeaderMap::new();
        h.insert("connection", "close, x-secret-hop".parse().unwrap());
        h.insert("x-secret-hop", "1".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        h.insert("idempotency-key", "k".parse().unwrap());
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["idempotency-key"]);
    }

    #[test]
    fn targets_join_base_path_and_query() {
        let cases = [
            (
                "http://127.0.0.1:9000",
                "/payouts?x=1",
                "http://127.0.0.1:9000/payouts?x=1",
            ),
            (
                "http://127.0.0.1:9000/api/",
                "/payouts",
                "http://127.0.0.1:9000/api/payouts",
            ),
            ("http://h:1/api", "/", "http://h:1/api/"),
        ];
        for (base, incoming, want) in cases {
            let p = Proxy::new(
                base.parse().unwrap(),
                Duration::from_secs(1),
                Duration::from_secs(1),
            );
            assert_eq!(
                p.target(&incoming.parse().unwrap()).unwrap().to_string(),
                want
            );
        }
    }
}
