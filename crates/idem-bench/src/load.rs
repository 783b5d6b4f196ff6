//! The load generator: workers, each on its own keep-alive HTTP/1.1
//! connection, send `POST /payouts` with a small JSON body until a deadline
//! (or until their keys run out), check every answer and record each
//! request's latency.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::measured::Measured;

/// The path every request goes to.
pub const PATH: &str = "/payouts";
/// The key header the gateway reads by default.
const KEY_HEADER: &str = "idempotency-key";
/// The header the gateway adds to a replayed answer.
const REPLAYED_HEADER: &str = "idempotent-replayed";
/// The longest one request (or one connect) may take before it counts as
/// an error; keeps a phase bounded even if a server stops answering.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of an unexpected answer's body an error message quotes.
const QUOTE_BYTES: usize = 200;

/// The keys one worker sends, in order; the worker stops when they run out.
pub type Keys = Box<dyn Iterator<Item = String> + Send>;

/// What every answer in a phase must be besides `201 Created`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// An answer from the upstream itself (no `idempotent-replayed`).
    Executed,
    /// A replay of a stored result (`idempotent-replayed: true`).
    Replayed,
}

/// The ~100-byte JSON body sent with `key`; the same key always gets the
/// same body, so a replay carries the fingerprint of the original.
pub fn payout_body(key: &str) -> String {
    format!(
        r#"{{"reference":"{key}","seller":"sel_8f3a9c21","amount":12500,"currency":"EUR","rail":"sepa"}}"#
    )
}

/// Runs one worker per entry of `keys` against `addr` until `deadline`,
/// then merges what they measured. Must run inside a tokio runtime.
pub async fn run(
    addr: SocketAddr,
    keys: Vec<Keys>,
    expect: Expect,
    deadline: Instant,
) -> anyhow::Result<Measured> {
    if !addr.ip().is_loopback() {
        bail!("{addr} is not a loopback address");
    }
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for keys in keys {
        workers.spawn(worker(addr, keys, expect, deadline));
    }
    let mut total = Measured::default();
    while let Some(joined) = workers.join_next().await {
        total.merge(joined.context("a load worker panicked")?);
    }
    total.finish(start.elapsed());
    Ok(total)
}

/// One connection's loop: a request, its answer, the next key.
async fn worker(addr: SocketAddr, mut keys: Keys, expect: Expect, deadline: Instant) -> Measured {
    let mut out = Measured::default();
    let mut connection = None;
    let host = addr.to_string();
    while Instant::now() < deadline {
        let sender = match &mut connection {
            Some(sender) => sender,
            None => match connect(addr).await {
                Ok(sender) => connection.insert(sender),
                Err(e) => {
                    out.error(e);
                    break;
                }
            },
        };
        let Some(key) = keys.next() else { break };
        let started = Instant::now();
        match tokio::time::timeout(REQUEST_TIMEOUT, exchange(sender, &host, &key, expect)).await {
            Ok(Ok(())) => out.ok_since(started),
            Ok(Err(e)) => {
                out.error(e.context(format!("key {key}")));
                // The connection's state is unknown after a failure.
                connection = None;
            }
            Err(_) => {
                out.error(anyhow::anyhow!(
                    "key {key}: no answer within {} s",
                    REQUEST_TIMEOUT.as_secs()
                ));
                connection = None;
            }
        }
    }
    out
}

/// A new keep-alive HTTP/1.1 connection to `addr`, Nagle off.
async fn connect(addr: SocketAddr) -> anyhow::Result<SendRequest<Full<Bytes>>> {
    let open = async {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP/1.1 handshake")?;
        // Its errors reach the caller through `send_request`.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        anyhow::Ok(sender)
    };
    tokio::time::timeout(REQUEST_TIMEOUT, open)
        .await
        .with_context(|| format!("connecting to {addr} timed out"))?
        .with_context(|| format!("connecting to {addr}"))
}

/// Sends one request and checks its whole answer.
async fn exchange(
    sender: &mut SendRequest<Full<Bytes>>,
    host: &str,
    key: &str,
    expect: Expect,
) -> anyhow::Result<()> {
    let request = Request::post(PATH)
        .header(header::HOST, host)
        .header(header::CONTENT_TYPE, "application/json")
        .header(KEY_HEADER, key)
        .body(Full::new(Bytes::from(payout_body(key))))?;
    sender.ready().await.context("connection not ready")?;
    let response = sender.send_request(request).await.context("sending")?;
    let status = response.status();
    let replayed = response
        .headers()
        .get(REPLAYED_HEADER)
        .is_some_and(|v| v == "true");
    let body = response
        .into_body()
        .collect()
        .await
        .context("reading the answer")?
        .to_bytes();
    if status != StatusCode::CREATED {
        let quote = String::from_utf8_lossy(&body[..body.len().min(QUOTE_BYTES)]);
        bail!("status {status} (expected 201 Created): {quote}");
    }
    match (expect, replayed) {
        (Expect::Executed, true) => bail!("answered as a replay, expected a fresh execution"),
        (Expect::Replayed, false) => bail!("answered without {REPLAYED_HEADER}: true"),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_about_100_bytes_and_json() {
        let body = payout_body("fresh-12-345678");
        assert!((90..=110).contains(&body.len()), "{}", body.len());
        assert!(serde_json::from_str::<serde_json::Value>(&body).is_ok());
    }
}
