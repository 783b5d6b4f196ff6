//! `idem serve`: the gateway. A reverse proxy whose every protected request
//! goes through [`idem_http::IdempotencyLayer`] before it may reach the
//! upstream; the proxy itself never retries and tells the layer whether a
//! failed request was ever sent.

mod config;
mod proxy;
mod server;

pub use config::{ConfigError, FileConfig, GatewayConfig, Overrides};
pub use proxy::Proxy;
pub use server::{serve, shutdown_signal};
