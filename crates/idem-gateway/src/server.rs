//! Runs the gateway: binds, serves the layered proxy, and on SIGTERM or
//! SIGINT stops accepting and lets in-flight requests finish and be recorded.

use std::future::Future;
use std::sync::Arc;

use idem_core::Store;
use idem_http::IdempotencyLayer;
use tokio::net::TcpListener;
use tower::Layer;

use crate::{GatewayConfig, Proxy};

/// Serves `config` on `listener` until `shutdown` resolves, then drains.
pub async fn serve(
    config: &GatewayConfig,
    store: Arc<dyn Store>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let proxy = Proxy::new(
        config.upstream.clone(),
        config.connect_timeout,
        config.response_timeout,
    );
    let layer =
        IdempotencyLayer::new(store, config.routes.clone()).with_owner(config.owner.clone());
    let service = layer.layer(proxy);
    let app = axum::Router::new().fallback_service(service);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Resolves on the first SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = terminate => tracing::info!("SIGTERM: finishing in-flight requests"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: finishing in-flight requests"),
    }
}
