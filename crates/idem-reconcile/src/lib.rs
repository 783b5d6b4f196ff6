//! The reconciler for ambiguous records: an attempt whose outcome is unknown
//! is resolved by asking the provider by the exact reference the gateway
//! forwarded for it (so two tenants who chose the same key are never
//! confused), never by re-executing the request (I2 in docs/contract.md;
//! docs/operations.md, "The reconciler").
//!
//! - [`LookupSpec`] + [`ForwardedKey`] → [`Lookup`]: per route, how to ask
//!   the provider (`[[lookup]]` in the gateway config), and how the route
//!   renders the reference it forwarded (its `forward_key` template).
//! - [`ReconcileSpec`] → [`ReconcileSettings`]: tries, backoff, concurrency,
//!   rate, interval and batch, each bounded.
//! - [`Reconciler`]: [`Reconciler::run_once`] is one bounded scan and returns
//!   a [`ReconcileReport`]; [`Reconciler::run`] scans every `interval_s`
//!   until shutdown ([`Reconciler::spawn`] on a task of its own).
//! - Beside a service's own `IdempotencyLayer`, in-process:
//!   [`Reconciler::with_providers`] with a [`provider_fn`] that asks the
//!   service's ledger, passed to the layer's `with_settle_on_retry`, and
//!   spawned until shutdown (`examples/axum-tenants`).
//!
//! For each ambiguous record whose operation has a lookup:
//!
//! | the provider answers | the record |
//! | --- | --- |
//! | a `found` status | completed with the answer (status, content-type, location, content-location, body ≤ 1 MiB), resolved by `reconciler` |
//! | a `not_found` status | released (resolved as not executed), so a retry may run |
//! | anything else, no answer, a timeout, a body too large | stays ambiguous; the failure is counted in the store; tried again after a jittered exponential backoff; after `max_tries` failures left for an operator |
//!
//! Records whose operation has no lookup are left for an operator without
//! any request. Failed lookups are counted in the store per attempt
//! ([`idem_core::Store::note_failed_lookup`]), so restarts, other nodes and
//! cron runs share one count and one backoff; a resolution or a new
//! attempt of the key starts afresh.
//!
//! ```
//! use std::sync::Arc;
//! use idem_core::{Clock, MemoryStore, Store, SystemClock};
//! use idem_reconcile::*;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The gateway passes its route's renderer (`idem_http::Route::forwarded_key`).
//! let forwarded: ForwardedKey = Arc::new(|id: &idem_core::RecordId| id.key.as_str().to_owned());
//! let lookup = Lookup::new(
//!     &LookupSpec {
//!         url: Some("http://127.0.0.1:9000/payouts/by-ref/{forwarded_key}".into()),
//!         ..Default::default()
//!     },
//!     forwarded,
//! )?;
//! let settings = ReconcileSettings::new(&ReconcileSpec {
//!     max_tries: Some(3),
//!     ..Default::default()
//! })?;
//! let clock: Arc<dyn Clock> = Arc::new(SystemClock);
//! let store: Arc<dyn Store> = Arc::new(MemoryStore::new(Arc::clone(&clock)));
//! // The operation is the route's name, as in the records' scopes.
//! let reconciler = Reconciler::new(store, vec![("payouts".into(), lookup)], settings, clock)?;
//! let report = reconciler.run_once().await; // `idem reconcile --once`
//! assert_eq!(report.scanned, 0);
//! println!("{report}");
//! # Ok(())
//! # }
//! ```

mod backoff;
pub mod client;
mod lookup;
mod probe;
mod reconciler;
mod settings;
pub mod window;

pub use lookup::{
    CONNECT_TIMEOUT_MS_DEFAULT, ForwardedKey, HEADERS_MAX, Lookup, LookupSpec, LookupTarget,
    TIMEOUT_MS_DEFAULT, TIMEOUT_MS_MAX, Verdict, scope_parts, with_trust,
};
pub use probe::{Finding, Provider, ProviderFuture, provider_fn};
pub use reconciler::{
    RESOLVED_BY, ReconcileReport, Reconciler, ResolutionHook, ScanTimes, Settled, TRACKED_MAX,
    asked_by,
};
pub use settings::{
    BACKOFF_MS_LIMIT, BATCH_LIMIT, CONCURRENCY_LIMIT, ConfigError, INTERVAL_S_LIMIT,
    MAX_TRIES_LIMIT, RATE_PER_S_LIMIT, ReconcileSettings, ReconcileSpec,
};
