//! The one HTTP client idem sends effects and lookups with: it never sends
//! a request twice. The gateway's proxy, `idem consume`'s delivery and the
//! reconciler's lookups each build theirs here, so that a resend on a
//! reused connection cannot creep back into one of them alone.

use std::time::Duration;

use hyper_util::client::legacy::Builder;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// How long an idle pooled connection is kept.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A client builder that never retries: a request that failed on a reused
/// connection may have reached the server, so resending it is a retry, and
/// a retry is the caller's decision (a new claim, the next scan).
pub fn never_retrying() -> Builder {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .retry_canceled_requests(false)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT);
    builder
}

/// The TCP connector under every client: `connect_timeout` on the connect,
/// no Nagle delay.
pub fn tcp(connect_timeout: Duration) -> HttpConnector {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    http
}
