//! The payout API the gateway benchmark drives: a minimal axum server on
//! loopback in this process, on its own one-thread runtime, that reads the
//! JSON body, answers 201 with a small JSON body and counts its hits.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use crate::load::PATH;
use crate::server::Server;

/// The running upstream.
pub struct Upstream {
    server: Server,
    hits: Arc<AtomicU64>,
}

impl Upstream {
    /// Starts the upstream on `127.0.0.1:0` with its own one-thread runtime.
    pub fn start() -> anyhow::Result<Upstream> {
        let hits = Arc::new(AtomicU64::new(0));
        let app = axum::Router::new()
            .route(PATH, axum::routing::post(pay))
            .with_state(Arc::clone(&hits));
        let addr = ([127, 0, 0, 1], 0).into();
        let server = Server::start("upstream", 1, addr, |listener, shutdown| async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        })?;
        Ok(Upstream { server, hits })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// Requests it has answered (or refused) so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Stops it and waits (boundedly) for it to finish.
    pub fn stop(self) -> anyhow::Result<()> {
        self.server.stop()
    }
}

/// `POST /payouts`: every hit counts; a body that is not JSON is a 400.
async fn pay(State(hits): State<Arc<AtomicU64>>, body: Bytes) -> Response {
    let n = hits.fetch_add(1, Ordering::Relaxed) + 1;
    if serde_json::from_slice::<serde_json::Value>(&body).is_err() {
        return (StatusCode::BAD_REQUEST, "the body is not JSON").into_response();
    }
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        format!(r#"{{"payout":"po_{n:08}","status":"paid"}}"#),
    )
        .into_response()
}
