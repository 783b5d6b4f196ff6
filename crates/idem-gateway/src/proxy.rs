//! The reverse proxy behind the layer: forwards one request to the upstream
//! (over TLS for an `https://` upstream), never retries, buffers the answer
//! within the response timeout, and marks each failure with whether the
//! request was ever sent.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use http::header::{self, HeaderMap, HeaderName};
use http::{Request, Response, Uri, Version};
use http_body_util::{BodyExt, Limited};
use hyper_rustls::{HttpsConnectorBuilder, MaybeHttpsStream};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioIo;
use idem_core::error_chain;
use idem_http::{AttemptOutcome, Problem, ProblemKind, RESPONSE_BYTES_MAX, Route, normalize_path};
use idem_reconcile::client;
use tokio::net::TcpStream;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceExt};

use idem_process::UpstreamTls;

/// Forwards requests to one upstream base URL.
#[derive(Clone)]
pub struct Proxy {
    client: Client<Connector, Body>,
    upstream: Uri,
    response_timeout: Duration,
    /// What an https upstream's certificate is checked against, in words
    /// for a refused handshake's error.
    trust: Option<Arc<str>>,
}

/// TCP, then TLS for an `https://` URL, within the connect timeout: every
/// error it returns, a timeout included, comes before the request is
/// written, and the client reports it as a connect error.
type Connector = BoxCloneSyncService<Uri, MaybeHttpsStream<TokioIo<TcpStream>>, BoxError>;

impl Proxy {
    /// A proxy to the plain `http://` `upstream` with the given timeouts;
    /// it refuses to connect to an `https://` one.
    pub fn new(upstream: Uri, connect_timeout: Duration, response_timeout: Duration) -> Proxy {
        let http = client::tcp(connect_timeout).map_response(MaybeHttpsStream::Http);
        let connector = within(http, connect_timeout);
        Proxy::with_connector(upstream, connector, response_timeout)
    }

    /// A proxy to `upstream`, `http://` or `https://`; an https upstream's
    /// certificate is verified against `tls`'s roots and its host name (or
    /// IP address). `connect_timeout` bounds the TCP connect and the TLS
    /// handshake together.
    pub fn with_tls(
        upstream: Uri,
        connect_timeout: Duration,
        response_timeout: Duration,
        tls: &UpstreamTls,
    ) -> Proxy {
        let mut http = client::tcp(connect_timeout);
        // The TLS connector above it decides the scheme.
        http.enforce_http(false);
        let https = HttpsConnectorBuilder::new()
            .with_tls_config(tls.client_config())
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let mut proxy =
            Proxy::with_connector(upstream, within(https, connect_timeout), response_timeout);
        proxy.trust = Some(tls.trust());
        proxy
    }

    fn with_connector(upstream: Uri, connector: Connector, response_timeout: Duration) -> Proxy {
        // Retries are the caller's decision, made through a new claim.
        let client = client::never_retrying().build(connector);
        Proxy {
            client,
            upstream,
            response_timeout,
            trust: None,
        }
    }

    /// Forwards `req` once; a failure is a problem response carrying its
    /// [`AttemptOutcome`] and [`ProblemKind`] as extensions.
    pub(crate) async fn forward(&self, req: Request<Body>) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        let uri = match self.target(&parts.uri) {
            Ok(uri) => uri,
            Err((kind, reason)) => return failure(kind, reason, AttemptOutcome::NotSent),
        };
        // `Connection` and what it names were handled at the edge, before
        // the layer read the request (see `HopByHop`): removing named
        // headers here could drop the key the layer has just set.
        remove_fixed_hop_by_hop(&mut parts.headers);
        if let Some(authority) = self.upstream.authority()
            && let Ok(host) = authority.as_str().parse()
        {
            parts.headers.insert(header::HOST, host);
        }
        parts.uri = uri;
        // The gateway speaks HTTP/1.1 to its upstream, whatever its client
        // speaks to it.
        parts.version = Version::HTTP_11;
        let request = Request::from_parts(parts, body);
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| {
                // A connect error includes a failed TLS handshake: the
                // connector returns before the request is written, so it
                // proves the request never left, like a refused connection.
                if e.is_connect() {
                    let reason = format!("cannot connect to the upstream: {}", error_chain(&e));
                    let reason = match &self.trust {
                        Some(trust) => idem_reconcile::with_trust(reason, trust),
                        None => reason,
                    };
                    (
                        ProblemKind::UpstreamUnreachable,
                        reason,
                        AttemptOutcome::NotSent,
                    )
                } else {
                    (
                        ProblemKind::UpstreamFailed,
                        format!(
                            "the upstream connection failed after the request was sent: {}",
                            error_chain(&e)
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
            // The upstream's version is its own connection's, like its
            // hop-by-hop headers: the answer is the gateway's.
            parts.version = Version::HTTP_11;
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

    /// The upstream URL for `incoming`: the base path joined with the
    /// incoming path, normalised, and refused unless it stays under the
    /// base path (the layer has normalised the path already; this holds
    /// whatever reaches the proxy).
    fn target(&self, incoming: &Uri) -> Result<Uri, (ProblemKind, String)> {
        let invalid = |detail: String| (ProblemKind::InvalidPath, detail);
        let base = normalize_path(self.upstream.path())
            .map_err(|e| invalid(format!("the upstream's base path has {e}")))?;
        let base = base.trim_end_matches('/');
        let joined = format!("{base}{}", incoming.path());
        let path = normalize_path(&joined).map_err(|e| invalid(format!("not forwarded: {e}")))?;
        if !path
            .strip_prefix(base)
            .is_some_and(|under| under.starts_with('/'))
        {
            return Err(invalid(format!(
                "not forwarded: {:?} is not under the upstream's base path {base:?}",
                incoming.path()
            )));
        }
        let path_and_query = match incoming.query() {
            Some(query) => format!("{path}?{query}"),
            None => path,
        };
        let mut builder = Uri::builder().path_and_query(path_and_query);
        if let Some(scheme) = self.upstream.scheme() {
            builder = builder.scheme(scheme.clone());
        }
        if let Some(authority) = self.upstream.authority() {
            builder = builder.authority(authority.clone());
        }
        builder.build().map_err(|e| {
            let reason = format!("cannot build the upstream URL: {e}");
            (ProblemKind::UpstreamUnreachable, reason)
        })
    }
}

/// `connector` bounded, handshake included, by `connect_timeout`: a stalled
/// handshake is a connect error (the request never left), not a response
/// timeout (an unknown outcome).
fn within<C>(connector: C, connect_timeout: Duration) -> Connector
where
    C: tower::Service<Uri, Response = MaybeHttpsStream<TokioIo<TcpStream>>>
        + Clone
        + Send
        + Sync
        + 'static,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
{
    let timeout_ms = connect_timeout.as_millis();
    let bounded = tower::timeout::Timeout::new(connector, connect_timeout).map_err(
        move |e: BoxError| -> BoxError {
            if e.is::<tower::timeout::error::Elapsed>() {
                format!("no connection within {timeout_ms} ms (connect_timeout_ms)").into()
            } else {
                e
            }
        },
    );
    BoxCloneSyncService::new(bounded)
}

fn failure(kind: ProblemKind, reason: String, outcome: AttemptOutcome) -> Response<Body> {
    tracing::warn!(problem = kind.slug(), %reason, "upstream attempt failed");
    let mut response: Response<Body> = Problem::new(kind, reason).into_response();
    response.extensions_mut().insert(outcome);
    // The layer counts every problem response by this extension.
    response.extensions_mut().insert(kind);
    response
}

/// The client's hop-by-hop headers, removed at the gateway's edge before
/// the layer reads the request, so that the layer and the upstream see the
/// same headers. A `Connection` option naming a header meant for every
/// recipient (RFC 9110 §7.6.1: a sender MUST NOT list one) is ignored:
/// the key, principal and fingerprint headers of every route, and the
/// content and authority headers, keep their end-to-end meaning.
#[derive(Clone, Debug)]
pub struct HopByHop {
    end_to_end: Vec<HeaderName>,
}

/// Headers that are end-to-end whatever the routes say.
const END_TO_END: [HeaderName; 5] = [
    header::AUTHORIZATION,
    header::CONTENT_ENCODING,
    header::CONTENT_LENGTH,
    header::CONTENT_TYPE,
    header::HOST,
];

/// The hop-by-hop headers of RFC 9110 §7.6.1 and their common relatives.
static FIXED_HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

impl HopByHop {
    /// The edge for `routes`: their contract headers are never removed.
    pub fn for_routes(routes: &[Route]) -> HopByHop {
        HopByHop::keeping(routes, &[])
    }

    /// [`HopByHop::for_routes`], also keeping `more` (the gateway's
    /// home-region headers).
    pub fn keeping(routes: &[Route], more: &[HeaderName]) -> HopByHop {
        let mut end_to_end: Vec<HeaderName> = END_TO_END.to_vec();
        end_to_end.extend(routes.iter().flat_map(Route::contract_headers).cloned());
        end_to_end.extend(more.iter().cloned());
        end_to_end.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        end_to_end.dedup();
        HopByHop { end_to_end }
    }

    /// Removes the fixed hop-by-hop headers and those the client's
    /// `Connection` names, except the end-to-end ones.
    pub fn strip_request(&self, headers: &mut HeaderMap) {
        for name in connection_options(headers) {
            if !self.end_to_end.contains(&name) {
                headers.remove(name);
            }
        }
        remove_fixed_hop_by_hop(headers);
    }
}

/// Removes the hop-by-hop headers of RFC 9110 §7.6.1, including those named
/// in `Connection`: for an upstream's answer, which the layer does not read
/// for its contract.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in connection_options(headers) {
        headers.remove(name);
    }
    remove_fixed_hop_by_hop(headers);
}

/// The header names listed in every `Connection` field, case-folded.
fn connection_options(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect()
}

fn remove_fixed_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the few names a message carries, which mostly include
    // none of these, instead of a removal (a hash and a probe) per name.
    if !headers.keys().any(|name| FIXED_HOP_BY_HOP.contains(name)) {
        return;
    }
    for name in &FIXED_HOP_BY_HOP {
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
    fn each_fixed_hop_by_hop_header_goes_when_it_is_the_only_one() {
        for name in [
            "Connection",
            "keep-alive",
            "Proxy-Connection",
            "proxy-authenticate",
            "Proxy-Authorization",
            "TE",
            "trailer",
            "Transfer-Encoding",
            "upgrade",
        ] {
            let mut h = HeaderMap::new();
            h.insert("idempotency-key", "k".parse().unwrap());
            h.insert(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                "x".parse().unwrap(),
            );
            strip_hop_by_hop(&mut h);
            let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
            assert_eq!(left, vec!["idempotency-key"], "{name}");
        }
    }

    #[test]
    fn the_edge_keeps_what_the_contract_reads_whatever_connection_names() {
        let route = Route::new(&idem_http::RouteSpec {
            principal_headers: Some(vec!["X-Tenant".into()]),
            fingerprint_headers: Some(vec!["x-amount-currency".into()]),
            forward_key: Some(idem_http::ForwardKeySpec {
                header: Some("X-Upstream-Key".into()),
                template: None,
            }),
            ..Default::default()
        })
        .unwrap();
        let edge = HopByHop::for_routes(&[route]);
        let kept = [
            "idempotency-key",
            "x-upstream-key",
            "x-tenant",
            "x-amount-currency",
            "authorization",
            "content-type",
            "content-length",
            "host",
        ];
        let connections: [&[&str]; 4] = [
            &["IDEMPOTENCY-KEY, x-upstream-key,x-tenant , X-Amount-Currency"],
            &["authorization", "content-type,content-length", "host"],
            &["\"idempotency-key\", x-hop"],
            &["close", "x-hop, keep-alive"],
        ];
        for connection in connections {
            let mut h = HeaderMap::new();
            for name in kept.iter().chain(&["x-hop", "keep-alive", "te"]) {
                h.insert(*name, "v".parse().unwrap());
            }
            for value in connection {
                h.append(header::CONNECTION, value.parse().unwrap());
            }
            edge.strip_request(&mut h);
            let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
            left.sort_unstable();
            let mut want = kept.to_vec();
            want.sort_unstable();
            let x_hop_kept = !connection.iter().any(|v| v.contains("x-hop"));
            if x_hop_kept {
                want.push("x-hop");
                want.sort_unstable();
            }
            assert_eq!(left, want, "{connection:?}");
        }
    }

    #[test]
    fn a_target_never_leaves_the_upstream_base_path() {
        let cases = [
            ("http://h:1/api", "/../admin"),
            ("http://h:1/api", "/x/../../admin"),
            ("http://h:1/api", "/%2E%2E/admin"),
            ("http://h:1/api", "/..%2Fadmin"),
            ("http://h:1/api", "/..;/admin"),
            ("http://h:1/api/v1/", "/../v2/x"),
            ("http://h:1", "/../x"),
            ("http://h:1/api", "*"),
        ];
        for (base, incoming) in cases {
            let p = Proxy::new(
                base.parse().unwrap(),
                Duration::from_secs(1),
                Duration::from_secs(1),
            );
            let target = p.target(&incoming.parse().unwrap());
            assert!(target.is_err(), "{base} + {incoming}: {target:?}");
        }
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
            (
                "http://h:1/api",
                "/a//b/./c?q=/../x",
                "http://h:1/api/a/b/c?q=/../x",
            ),
            ("http://h:1/a%70i/", "/x", "http://h:1/api/x"),
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
