//! Settling an unknown outcome on the retry (docs/http.md, "Settling an
//! unknown outcome on the retry"): when a claim finds the record
//! ambiguous, the layer may ask a [`SettleOnRetry`] (the gateway's
//! reconciler, with the route's lookup) to settle it at once, then asks the
//! claim again: a record completed meanwhile is replayed, one released as
//! not executed is acquired by this retry and runs, once.

use std::future::Future;
use std::pin::Pin;

use idem_core::{RecordId, SuspectWindow, Verification};

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

/// Verifies a fresh claim inside a suspect window (docs/contract.md,
/// "After a failover or a restore"): the store may have lost the record of
/// a key that executed, so before a request with such a key is forwarded,
/// the provider is asked by the forwarded key (the gateway's reconciler,
/// with the route's lookup).
pub trait VerifyFresh: Send + Sync {
    /// Whether the record's operation has a lookup to ask.
    fn covers(&self, id: &RecordId) -> bool;

    /// Asks the provider about `id`, claimed fresh inside `window` by a
    /// route leasing `lease_ms`, and gives the verdict. Bounded in time by
    /// the lookup's own timeout; writes nothing.
    fn verify<'a>(
        &'a self,
        id: &'a RecordId,
        window: &'a SuspectWindow,
        lease_ms: u64,
    ) -> Pin<Box<dyn Future<Output = Verification> + Send + 'a>>;
}
