//! Delivering one message to the user's service: `POST` the payload to the
//! subscription's endpoint with the key header, once, never retried here
//! (a retry is the next delivery of the message, through a new claim), and
//! the service's answer, or how the attempt failed.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_core::{AttemptOutcome, RESULT_BODY_BYTES_MAX};

/// The service's answer to one delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// `Content-Type`, if the service set one.
    pub content_type: Option<String>,
    /// The body, at most [`RESULT_BODY_BYTES_MAX`] bytes.
    pub body: Bytes,
}

/// How a delivery failed, and whether the request may have reached the
/// service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// `NotSent`: provably never reached the service; `Lost`: it may have.
    pub outcome: AttemptOutcome,
    /// What happened, for the log.
    pub reason: String,
}

/// One endpoint of the user's service.
#[derive(Clone, Debug)]
pub struct Endpoint {
    client: Client<HttpConnector, Full<Bytes>>,
    url: Uri,
    timeout: Duration,
}

impl Endpoint {
    /// An endpoint at `url` (`http://host:port/path`), with a connect
    /// timeout and a timeout for the whole answer.
    pub fn new(url: Uri, connect_timeout: Duration, timeout: Duration) -> Endpoint {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            // A request that failed on a reused connection may have reached
            // the service: resending it is a retry, and a retry goes
            // through a new claim.
            .retry_canceled_requests(false)
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Endpoint {
            client,
            url,
            timeout,
        }
    }

    /// The endpoint's URL.
    pub fn url(&self) -> &Uri {
        &self.url
    }

    /// Posts `payload` once, with `headers` (the key header among them),
    /// giving up at the endpoint's timeout or at `deadline`, the attempt's
    /// lease end ([`idem_consume::Attempt::deadline`]), whichever is first.
    pub async fn post(
        &self,
        payload: Bytes,
        headers: Vec<(HeaderName, HeaderValue)>,
        deadline: Instant,
    ) -> Result<Answer, Failure> {
        let mut request = Request::new(Full::new(payload));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.url.clone();
        for (name, value) in headers {
            request.headers_mut().append(name, value);
        }
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| {
                let reason = chain(&e);
                if e.is_connect() {
                    failure(AttemptOutcome::NotSent, format!("cannot connect: {reason}"))
                } else {
                    failure(
                        AttemptOutcome::Lost,
                        format!("the connection failed after the request was sent: {reason}"),
                    )
                }
            })?;
            let status = response.status().as_u16();
            let content_type = response
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = Limited::new(response.into_body(), RESULT_BODY_BYTES_MAX)
                .collect()
                .await
                .map_err(|e| {
                    failure(
                        AttemptOutcome::Lost,
                        format!(
                            "answered {status}, but its body failed or exceeds \
                             {RESULT_BODY_BYTES_MAX} bytes: {e}"
                        ),
                    )
                })?
                .to_bytes();
            Ok(Answer {
                status,
                content_type,
                body,
            })
        };
        let started = Instant::now();
        let until = deadline.min(started + self.timeout);
        match tokio::time::timeout_at(until.into(), exchange).await {
            Ok(answered) => answered,
            Err(_) => Err(failure(
                AttemptOutcome::Lost,
                format!(
                    "no complete answer within {} ms (the endpoint's timeout is {} ms; the \
                     lease left {} ms); the message may have been processed",
                    until.saturating_duration_since(started).as_millis(),
                    self.timeout.as_millis(),
                    deadline.saturating_duration_since(started).as_millis()
                ),
            )),
        }
    }
}

fn failure(outcome: AttemptOutcome, reason: String) -> Failure {
    Failure { outcome, reason }
}

/// An error with its causes, `a: b: c`.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    std::iter::successors(Some(e), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}
