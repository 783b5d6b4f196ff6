//! What `idem serve` (`idem-gateway`) and `idem consume` (`idem-consumer`)
//! both run beside their own work, in one crate below both so that
//! neither names the other: the store URL, parsed and opened in one place
//! (`store_url`), `/healthz` and `/readyz` (`probe`) and the bounded
//! accept loop they and the gateway's listeners serve with (`listen`),
//! the retention purge (`purge`), TLS files (`tls`), the store wrapper
//! that notices a store stopped for good (`watched`) and the budget that
//! rate-limits repeating log lines (`log_budget`). Each store is a cargo
//! feature (`sqlite`, `postgres`, `dynamodb`, all on by default).

pub mod gauges;
pub mod listen;
mod log_budget;
pub mod probe;
mod purge;
pub mod store_url;
pub mod tls;
mod watched;

pub use listen::{ACCEPT_ERROR_PAUSE_MS, ConnectionLimits, READ_BUFFER_BYTES_MAX};
pub use log_budget::{LogBudget, Logged};
pub use purge::{PURGE_BATCH, PURGE_BATCHES_MAX, run as run_purge};
pub use store_url::{Checked, OpenError, STORE_DEFAULT, StoreUrl, StoreUrlError};
pub use tls::{PEM_FILE_BYTES_MAX, ServerTls, TlsError, UpstreamTls};
pub use watched::{Watched, stopped};
