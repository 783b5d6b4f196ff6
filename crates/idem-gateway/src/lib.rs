//! `idem serve`: the gateway. A reverse proxy whose every protected request
//! goes through [`idem_http::IdempotencyLayer`] before it may reach the
//! upstream (http or https); the proxy itself never retries and tells the
//! layer whether a failed request was ever sent. Next to it: the admin API
//! (its own listener, behind a bearer token, optionally over TLS) and the
//! routes a caller mounts beside it (the binary mounts the operator's
//! console, `idem-console`), the retention purge, the reconciler (when
//! routes declare lookups), and the operator's view of a record shared
//! with `idem records`.

pub mod admin;
mod admission;
mod config;
pub mod contracts;
mod findings;
mod in_flight;
mod proxy;
pub mod regions;
mod server;
mod tls;
mod view;

pub use admin::{
    ADMIN_OPERATOR, ADMIN_TOKEN_BYTES_MIN, AdminToken, OPERATOR_NAME_BYTES_MAX, OPERATORS_MAX,
    OperatorName, Operators, RefusalLog, random_hex, result_header,
};
pub use config::{
    ADMIN_TOKEN_ENV_DEFAULT, AdminOperators, AdminSection, ConfigError, FileConfig, GatewayConfig,
    OperatorSpec, Overrides, PURGE_INTERVAL_S_DEFAULT, PURGE_INTERVAL_S_MAX,
    REQUESTS_IN_FLIGHT_MAX_DEFAULT, REQUESTS_IN_FLIGHT_MAX_LIMIT, SESSION_ABSOLUTE_S_DEFAULT,
    SESSION_IDLE_S_DEFAULT, SESSION_S_MAX, SessionLimits,
};
pub use proxy::{HopByHop, Proxy};
pub use server::{
    AdminListener, AdminMount, AdminParts, ServeOptions, reconciler, serve, serve_with,
    shutdown_signal,
};
pub use tls::AdminTransport;
pub use view::{
    AmbiguityView, RecordView, ResolutionView, ResultView, SummaryField, WindowView, outcome_name,
    rfc3339,
};

// The process plumbing `idem serve` shares with `idem consume`, named
// here too so that the gateway's users need not know where it lives.
pub use idem_process::{
    ACCEPT_ERROR_PAUSE_MS, ConnectionLimits, Logged, PEM_FILE_BYTES_MAX, PURGE_BATCH,
    PURGE_BATCHES_MAX, READ_BUFFER_BYTES_MAX, STORE_DEFAULT, ServerTls, StoreUrl, StoreUrlError,
    TlsError, UpstreamTls, probe, run_purge,
};
