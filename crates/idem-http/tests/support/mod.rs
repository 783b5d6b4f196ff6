//! What the layer's tests put behind it.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::service_fn;

/// A payout API that takes `delay`, then pays (counted in `calls`) and
/// answers 201 `{"payout":N}`, N the payment's number.
pub fn slow_payouts(
    calls: Arc<AtomicUsize>,
    delay: Duration,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send,
> + Clone
+ Send
+ 'static {
    service_fn(move |_req: Request<Full<Bytes>>| {
        let calls = calls.clone();
        async move {
            tokio::time::sleep(delay).await;
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            let mut response = Response::new(Full::new(Bytes::from(format!("{{\"payout\":{n}}}"))));
            *response.status_mut() = StatusCode::CREATED;
            Ok(response)
        }
    })
}
