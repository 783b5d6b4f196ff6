//! Delivering one message to the user's service: `POST` the payload to the
//! subscription's endpoint with the key header, once, never retried here
//! (a retry is the next delivery of the message, through a new claim), and
//! the service's answer, or how the attempt failed.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use idem_core::{AttemptOutcome, HeaderBytes, RESULT_BODY_BYTES_MAX, error_chain};
use idem_reconcile::client;

/// The service's answer to one delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// `Content-Type`, if the service set one, as the bytes it sent.
    pub content_type: Option<HeaderBytes>,
    /// The body, at most [`RESULT_BODY_BYTES_MAX`] bytes; empty when
    /// `not_stored` says why it is not kept.
    pub body: Bytes,
    /// Why the body is not kept, when it is not: it was over
    /// [`RESULT_BODY_BYTES_MAX`], or failed after the status arrived. The
    /// status is the service's answer all the same.
    pub not_stored: Option<String>,
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
        // A retry goes through a new claim, never through the client.
        let client = client::never_retrying().build(client::tcp(connect_timeout));
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
    /// lease end ([`idem_message::Attempt::deadline`]), whichever is first.
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
                let reason = error_chain(&e);
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
                .map(|v| HeaderBytes::from(v.as_bytes()));
            // The status is the answer: whether it is final is the
            // completion table's to say, as in the gateway. A body that
            // cannot be kept only means the record keeps no copy of it.
            let (body, not_stored) = match Limited::new(response.into_body(), RESULT_BODY_BYTES_MAX)
                .collect()
                .await
            {
                Ok(collected) => (collected.to_bytes(), None),
                Err(e) if e.is::<LengthLimitError>() => (
                    Bytes::new(),
                    Some(format!(
                        "its body is over the {RESULT_BODY_BYTES_MAX} bytes a record keeps"
                    )),
                ),
                Err(e) => (
                    Bytes::new(),
                    Some(format!("its body failed: {}", error_chain(e.as_ref()))),
                ),
            };
            Ok(Answer {
                status,
                content_type,
                body,
                not_stored,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::io::{Read, Write};

    use super::*;

    /// A service on loopback that answers one request with `head` (raw
    /// bytes, so a header value need not be UTF-8) and `paid`.
    fn answer_once(head: &'static [u8]) -> Uri {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 1024];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).unwrap();
                assert!(n > 0, "the request ended before its head");
                seen.extend_from_slice(&buf[..n]);
            }
            conn.write_all(head).unwrap();
            conn.write_all(b"content-length: 4\r\nconnection: close\r\n\r\npaid")
                .unwrap();
        });
        format!("http://{addr}/pay").parse().unwrap()
    }

    #[tokio::test]
    async fn a_content_type_that_is_not_utf8_is_kept_as_sent() {
        let url =
            answer_once(b"HTTP/1.1 201 Created\r\ncontent-type: text/plain; name=caf\xe9\r\n");
        let endpoint = Endpoint::new(url, Duration::from_secs(2), Duration::from_secs(5));
        let answer = endpoint
            .post(
                Bytes::from_static(b"{}"),
                Vec::new(),
                std::time::Instant::now() + Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert_eq!(answer.status, 201);
        let kept = answer.content_type.as_ref().map(HeaderBytes::as_bytes);
        assert_eq!(kept, Some(b"text/plain; name=caf\xe9".as_slice()));
        assert_eq!(answer.body, Bytes::from_static(b"paid"));
    }
}
