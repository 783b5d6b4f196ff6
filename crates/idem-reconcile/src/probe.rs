//! One lookup exchange with the provider: build the request from the
//! reference the gateway forwarded for the record, send it once (the client
//! never retries on its own), and turn the answer into a finding or a
//! failure.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Uri, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use idem_core::{RESULT_BODY_BYTES_MAX, RecordId, StoredResult, error_chain};

use crate::lookup::{Lookup, Verdict};

/// Response headers kept with a found result: the ones the gateway replays
/// by default.
const KEPT_HEADERS: [header::HeaderName; 3] = [
    header::CONTENT_TYPE,
    header::LOCATION,
    header::CONTENT_LOCATION,
];

/// The longest URL quoted in a resolution reason or a log line, in bytes.
const SHOWN_URL_BYTES_MAX: usize = 512;

/// Whom the reconciler asks whether an attempt's effect happened: a
/// route's [`Lookup`] asks the provider's HTTP API; the simulator answers
/// from its own ledger.
pub trait Provider: Send + Sync {
    /// Asks about the attempt recorded under `id`. Asking never fails: what
    /// cannot be found out is a [`Finding::Failed`], counted in the store and
    /// asked again after a backoff.
    fn ask<'a>(&'a self, id: &'a RecordId) -> ProviderFuture<'a>;
}

/// What [`Provider::ask`] returns.
pub type ProviderFuture<'a> = Pin<Box<dyn Future<Output = Finding> + Send + 'a>>;

/// A provider that is a closure: a service asks its own ledger in-process,
/// beside its `IdempotencyLayer`, with no HTTP lookup.
///
/// ```
/// use idem_reconcile::{Finding, provider_fn};
///
/// let ledger = provider_fn(|id| async move {
///     Finding::NotFound { reason: format!("{} is not in the ledger", id.key) }
/// });
/// # let _ = ledger;
/// ```
pub fn provider_fn<F, Fut>(ask: F) -> Arc<dyn Provider>
where
    F: Fn(RecordId) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Finding> + Send + 'static,
{
    Arc::new(ProviderFn(ask))
}

struct ProviderFn<F>(F);

impl<F, Fut> Provider for ProviderFn<F>
where
    F: Fn(RecordId) -> Fut + Send + Sync,
    Fut: Future<Output = Finding> + Send + 'static,
{
    fn ask<'a>(&'a self, id: &'a RecordId) -> ProviderFuture<'a> {
        Box::pin((self.0)(id.clone()))
    }
}

/// A lookup with its own HTTP client (the connect timeout is per client).
pub(crate) struct Prober {
    lookup: Lookup,
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
}

/// What the provider said about one attempt, with the reason recorded in
/// the resolution or the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// The effect happened; this is what the provider answered.
    Found {
        /// The answer, stored as the attempt's result.
        result: StoredResult,
        /// How it was found out (e.g. the lookup's URL and status).
        reason: String,
    },
    /// The effect definitely did not happen.
    NotFound {
        /// How it was found out.
        reason: String,
    },
    /// No finding: another status, a connect error, a timeout, a body too large.
    Failed {
        /// What went wrong.
        reason: String,
    },
}

impl Prober {
    /// A prober keeping at most `idle_max` idle connections to the provider.
    pub(crate) fn new(lookup: Lookup, idle_max: usize) -> Prober {
        let mut http = crate::client::tcp(lookup.connect_timeout());
        http.enforce_http(false);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config((**lookup.tls()).clone())
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        // A lookup is a read, but a resend is still a second request the
        // rate limit did not count: the next scan decides when to ask again.
        let client = crate::client::never_retrying()
            .pool_max_idle_per_host(idle_max)
            .build(connector);
        Prober { lookup, client }
    }

    /// Asks the provider about `id`, within the lookup's total timeout.
    async fn lookup(&self, id: &RecordId) -> Finding {
        let url = self.lookup.url_for(id);
        let uri = match url.parse::<Uri>() {
            Ok(uri) => uri,
            Err(e) => {
                return Finding::Failed {
                    reason: format!("cannot build the lookup URL: {e}"),
                };
            }
        };
        let shown = format!("lookup {} {}", self.lookup.method(), without_query(&uri));
        let mut request = Request::new(Empty::new());
        *request.method_mut() = self.lookup.method().clone();
        *request.uri_mut() = uri;
        *request.headers_mut() = self.lookup.headers().clone();
        let timeout = self.lookup.timeout();
        match tokio::time::timeout(timeout, self.exchange(request, &shown)).await {
            Ok(answer) => answer,
            Err(_) => Finding::Failed {
                reason: format!(
                    "{shown}: no complete answer within {} ms",
                    timeout.as_millis()
                ),
            },
        }
    }

    async fn exchange(&self, request: Request<Empty<Bytes>>, shown: &str) -> Finding {
        let failed = |reason: String| Finding::Failed { reason };
        let response = match self.client.request(request).await {
            Ok(response) => response,
            Err(e) => {
                let reason = format!("{shown} failed: {}", error_chain(&e));
                return failed(crate::with_trust(reason, self.lookup.trust()));
            }
        };
        let status = response.status().as_u16();
        let reason = format!("{shown} answered {status}");
        match self.lookup.verdict(status) {
            Verdict::Unknown => failed(reason),
            Verdict::NotFound => Finding::NotFound { reason },
            Verdict::Found => {
                let (parts, body) = response.into_parts();
                let body = match Limited::new(body, RESULT_BODY_BYTES_MAX).collect().await {
                    Ok(collected) => collected.to_bytes(),
                    Err(e) => {
                        return failed(format!(
                            "{reason}, but its body could not be kept (at most \
                             {RESULT_BODY_BYTES_MAX} bytes): {e}"
                        ));
                    }
                };
                let headers = KEPT_HEADERS
                    .iter()
                    .filter_map(|name| {
                        let value = parts.headers.get(name)?.as_bytes();
                        Some((name.as_str().to_owned(), value.into()))
                    })
                    .collect();
                let stored = self.lookup.stored_status(status);
                match StoredResult::new(stored, headers, body.to_vec()) {
                    Ok(result) => Finding::Found { result, reason },
                    Err(e) => failed(format!("{reason}, but it cannot be stored: {e}")),
                }
            }
        }
    }
}

impl Provider for Prober {
    fn ask<'a>(&'a self, id: &'a RecordId) -> ProviderFuture<'a> {
        Box::pin(self.lookup(id))
    }
}

/// The URL without its query (which may carry a credential), clipped for logs.
fn without_query(uri: &Uri) -> String {
    let mut shown = format!(
        "{}://{}{}",
        uri.scheme_str().unwrap_or("http"),
        uri.authority().map_or("", |a| a.as_str()),
        uri.path()
    );
    if shown.len() > SHOWN_URL_BYTES_MAX {
        let mut end = SHOWN_URL_BYTES_MAX;
        while !shown.is_char_boundary(end) {
            end -= 1;
        }
        shown.truncate(end);
        shown.push('…');
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_urls_drop_the_query_and_stay_short() {
        let cases = [
            ("http://h:9/a/b?token=s3cret", "http://h:9/a/b".to_owned()),
            ("http://h/", "http://h/".to_owned()),
        ];
        for (uri, want) in cases {
            assert_eq!(without_query(&uri.parse().unwrap()), want);
        }
        let long: Uri = format!("http://h/{}", "a".repeat(2_000)).parse().unwrap();
        let shown = without_query(&long);
        assert!(
            shown.len() <= SHOWN_URL_BYTES_MAX + '…'.len_utf8(),
            "{}",
            shown.len()
        );
    }
}
