//! Settling an unknown outcome on the retry (docs/http.md, "Settling an
//! unknown outcome on the retry"): when a claim finds the record
//! ambiguous, the layer may ask a [`SettleOnRetry`] (the gateway's
//! reconciler, with the route's lookup) to settle it at once, then asks the
//! claim again: a record completed meanwhile is replayed, one released as
//! not executed is acquired by this retry and runs, once.

use std::future::Future;
use std::pin::Pin;

use idem_core::RecordId;

/// Settles an ambiguous record now, when a retry meets it.
pub trait SettleOnRetry: Send + Sync {
    /// Tries to settle `id` (asking the provider, deciding by the one
    /// verdict, counting a failed lookup as a scan would); resolves to true
    /// when the record was resolved or is no longer the ambiguous attempt
    /// it was (settled meanwhile by another retry, a scan or an operator),
    /// so that the claim is worth asking again. Bounded in time by the
    /// lookup's own timeout.
    fn settle<'a>(&'a self, id: &'a RecordId) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>>;
}
