//! One way to wrap a store: implement [`StoreWrapper`] with the store
//! underneath and override only what the wrapper changes; every other
//! operation goes to the inner store, through [`StoreWrapper::around`].
//! Every type that implements it is a [`Store`].

use crate::decision::{Claim, ClaimRequest};
use crate::record::{
    JournalEntry, LookupTries, Record, RecordId, Resolution, StoredResult, Token, VerbRequest,
};
use crate::store::{
    ListQuery, Listing, PurgeReport, Store, StoreFuture, WakeFn, Watch, Watching, WindowFn,
};
use crate::window::{SuspectWindow, WindowOpening};
use crate::{AmbiguityNote, Timestamp};

/// A write the inner store accepted, as [`StoreWrapper::accepted`] sees it:
/// the operation and its arguments (and a claim's answer).
#[derive(Clone, Copy, Debug)]
pub enum Accepted<'a> {
    /// [`Store::claim`] answered `Claim`.
    Claim(&'a ClaimRequest, &'a Claim),
    /// [`Store::complete`].
    Complete(&'a RecordId, Token),
    /// [`Store::release`].
    Release(&'a RecordId, Token),
    /// [`Store::mark_ambiguous`].
    MarkAmbiguous(&'a RecordId, Token),
    /// [`Store::resolve`].
    Resolve(&'a RecordId, Token, &'a Resolution),
    /// [`Store::note_failed_lookup`].
    NoteFailedLookup(&'a RecordId, Token),
    /// [`Store::note_ambiguity`].
    NoteAmbiguity(&'a RecordId, Token),
    /// [`Store::apply_verb`].
    Verb(&'a RecordId, Token, &'a VerbRequest),
}

/// Spells [`StoreWrapper`] and the [`Store`] it makes from two lists of the
/// operations that answer with a future, reads and writes, so that each
/// signature is written once here (and once in [`Store`]). A write's
/// default also tells [`StoreWrapper::accepted`] what the inner store
/// accepted; `$kept` is what of its arguments it keeps for that.
macro_rules! wrapper {
    (
        reads { $( $(#[$doc:meta])* fn $op:ident($($arg:ident: $ty:ty),*) -> $out:ty; )* }
        writes { $(
            $(#[$wdoc:meta])*
            fn $wop:ident($($warg:ident: $wty:ty),*) -> $wout:ty;
            |$answer:pat_param| $accepted:expr;
        )* }
    ) => {
        /// A store that passes what it does not override to
        /// [`StoreWrapper::inner`].
        ///
        /// The operations mirror [`Store`]'s, one for one. Each default
        /// passes the inner store's future through [`StoreWrapper::around`]
        /// (by default unchanged), so a wrapper that watches every answer
        /// overrides only that, and a write's default tells
        /// [`StoreWrapper::accepted`] once the inner store accepted it, so a
        /// wrapper that notes writes overrides only that (and sets
        /// [`StoreWrapper::WATCHES_WRITES`]). The two registrations
        /// (`on_completed`, `on_window_opened`) and `watches` go to the
        /// inner store as they are.
        pub trait StoreWrapper: Send + Sync {
            /// Whether the writes' defaults call [`StoreWrapper::accepted`];
            /// off by default, so that a wrapper that does not note writes
            /// adds nothing to them.
            const WATCHES_WRITES: bool = false;

            /// The store every operation not overridden goes to.
            fn inner(&self) -> &dyn Store;

            /// What every delegated operation's future passes through; the
            /// default hands it on unchanged.
            fn around<'a, T: 'a>(&'a self, op: StoreFuture<'a, T>) -> StoreFuture<'a, T> {
                op
            }

            /// Told of each write the inner store accepted through a
            /// default operation, when [`StoreWrapper::WATCHES_WRITES`].
            fn accepted(&self, _write: Accepted<'_>) {}

            $(
                $(#[$doc])*
                fn $op<'a>(&'a self, $($arg: $ty),*) -> StoreFuture<'a, $out> {
                    self.around(self.inner().$op($($arg),*))
                }
            )*

            $(
                $(#[$wdoc])*
                #[allow(clippy::clone_on_copy, reason = "the arguments kept for the hook")]
                fn $wop<'a>(&'a self, $($warg: $wty),*) -> StoreFuture<'a, $wout> {
                    if !Self::WATCHES_WRITES {
                        return self.around(self.inner().$wop($($warg),*));
                    }
                    Box::pin(async move {
                        let answer = self.around(self.inner().$wop($(Clone::clone(&$warg)),*)).await?;
                        let $answer = &answer;
                        self.accepted($accepted);
                        Ok(answer)
                    })
                }
            )*

            /// [`Store::on_completed`].
            fn on_completed(&self, wake: WakeFn) {
                self.inner().on_completed(wake);
            }

            /// [`Store::on_window_opened`].
            fn on_window_opened(&self, opened: WindowFn) {
                self.inner().on_window_opened(opened);
            }

            /// [`Store::watches`].
            fn watches(&self) -> Vec<(Watch, Watching)> {
                self.inner().watches()
            }
        }

        impl<W: StoreWrapper> Store for W {
            $(
                fn $op<'a>(&'a self, $($arg: $ty),*) -> StoreFuture<'a, $out> {
                    StoreWrapper::$op(self, $($arg),*)
                }
            )*
            $(
                fn $wop<'a>(&'a self, $($warg: $wty),*) -> StoreFuture<'a, $wout> {
                    StoreWrapper::$wop(self, $($warg),*)
                }
            )*

            fn on_completed(&self, wake: WakeFn) {
                StoreWrapper::on_completed(self, wake);
            }

            fn on_window_opened(&self, opened: WindowFn) {
                StoreWrapper::on_window_opened(self, opened);
            }

            fn watches(&self) -> Vec<(Watch, Watching)> {
                StoreWrapper::watches(self)
            }
        }
    };
}

wrapper! {
    reads {
        /// [`Store::lookup_tries`].
        fn lookup_tries(id: &'a RecordId, token: Token) -> Option<LookupTries>;
        /// [`Store::resolutions`].
        fn resolutions(id: &'a RecordId) -> Vec<JournalEntry>;
        /// [`Store::get`].
        fn get(id: &'a RecordId) -> Option<Record>;
        /// [`Store::list`].
        fn list(query: &'a ListQuery) -> Listing;
        /// [`Store::purge`].
        fn purge(limit: usize) -> PurgeReport;
        /// [`Store::note_waiting`].
        fn note_waiting(id: &'a RecordId) -> ();
        /// [`Store::suspect_window`].
        fn suspect_window() -> Option<SuspectWindow>;
        /// [`Store::open_suspect_window`].
        fn open_suspect_window(opening: &'a WindowOpening) -> SuspectWindow;
    }
    writes {
        /// [`Store::claim`].
        fn claim(req: &'a ClaimRequest) -> Claim;
        |claim| Accepted::Claim(req, claim);
        /// [`Store::complete`].
        fn complete(id: &'a RecordId, token: Token, result: StoredResult) -> Record;
        |_| Accepted::Complete(id, token);
        /// [`Store::release`].
        fn release(id: &'a RecordId, token: Token) -> ();
        |_| Accepted::Release(id, token);
        /// [`Store::mark_ambiguous`].
        fn mark_ambiguous(id: &'a RecordId, token: Token) -> Record;
        |_| Accepted::MarkAmbiguous(id, token);
        /// [`Store::resolve`].
        fn resolve(id: &'a RecordId, token: Token, resolution: Resolution) -> Option<Record>;
        |_| Accepted::Resolve(id, token, &resolution);
        /// [`Store::apply_verb`].
        fn apply_verb(id: &'a RecordId, token: Token, request: VerbRequest) -> Option<Record>;
        |_| Accepted::Verb(id, token, &request);
        /// [`Store::note_failed_lookup`].
        fn note_failed_lookup(id: &'a RecordId, token: Token, next_at: Timestamp) -> LookupTries;
        |_| Accepted::NoteFailedLookup(id, token);
        /// [`Store::note_ambiguity`].
        fn note_ambiguity(id: &'a RecordId, token: Token, note: AmbiguityNote) -> ();
        |_| Accepted::NoteAmbiguity(id, token);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::test_support::now;
    use crate::{Fingerprint, IdempotencyKey, ManualClock, MemoryStore, Policy, Scope};

    /// Counts every operation's answer, changes nothing else.
    struct Counting {
        inner: MemoryStore,
        answers: AtomicUsize,
    }

    impl StoreWrapper for Counting {
        fn inner(&self) -> &dyn Store {
            &self.inner
        }

        fn around<'a, T: 'a>(&'a self, op: StoreFuture<'a, T>) -> StoreFuture<'a, T> {
            Box::pin(async move {
                let out = op.await;
                self.answers.fetch_add(1, Ordering::Relaxed);
                out
            })
        }
    }

    /// Refuses every release, passes the rest.
    struct NoRelease(MemoryStore);

    impl StoreWrapper for NoRelease {
        fn inner(&self) -> &dyn Store {
            &self.0
        }

        fn release<'a>(&'a self, _: &'a RecordId, _: Token) -> StoreFuture<'a, ()> {
            Box::pin(std::future::ready(Err(crate::StoreError::Unavailable {
                store: "no-release".into(),
                reason: "refused".into(),
            })))
        }
    }

    /// Notes every accepted write by name, changes nothing.
    struct Noting {
        inner: MemoryStore,
        notes: std::sync::Mutex<Vec<String>>,
    }

    impl StoreWrapper for Noting {
        const WATCHES_WRITES: bool = true;

        fn inner(&self) -> &dyn Store {
            &self.inner
        }

        fn accepted(&self, write: Accepted<'_>) {
            let note = match write {
                Accepted::Claim(req, claim) => format!("claim {} {claim:?}", req.id.key),
                Accepted::Complete(id, token) => format!("complete {} {token:?}", id.key),
                Accepted::Release(id, token) => format!("release {} {token:?}", id.key),
                other => format!("{other:?}"),
            };
            self.notes.lock().unwrap().push(note);
        }
    }

    /// A wrapper that notes writes but leaves the hook off.
    struct Off(Noting);

    impl StoreWrapper for Off {
        fn inner(&self) -> &dyn Store {
            &self.0.inner
        }

        fn accepted(&self, write: Accepted<'_>) {
            self.0.accepted(write);
        }
    }

    fn request() -> ClaimRequest {
        ClaimRequest {
            id: RecordId {
                scope: Scope::new("POST /payouts|t").unwrap(),
                key: IdempotencyKey::new("k-1").unwrap(),
            },
            fingerprint: Fingerprint::from_bytes([1; 32]),
            legacy_fingerprint: None,
            owner: "a".into(),
            region: None,
            policy: Policy::default(),
        }
    }

    fn memory() -> MemoryStore {
        MemoryStore::new(Arc::new(ManualClock::new(Timestamp::from_millis(1_000))))
    }

    #[test]
    fn a_wrapper_reaches_the_inner_store_through_its_hook() {
        let store = Counting {
            inner: memory(),
            answers: AtomicUsize::new(0),
        };
        let req = request();
        let token = match now(Store::claim(&store, &req)).unwrap() {
            Claim::Acquired { token, .. } => token,
            other => panic!("expected a fresh claim, got {other:?}"),
        };
        assert!(now(Store::get(&store, &req.id)).unwrap().is_some());
        now(Store::release(&store, &req.id, token)).unwrap();
        assert!(now(store.inner.get(&req.id)).unwrap().is_none());
        assert_eq!(store.answers.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn each_accepted_write_is_told_once_and_a_refused_one_never() {
        let store = Noting {
            inner: memory(),
            notes: std::sync::Mutex::default(),
        };
        let req = request();
        let token = match now(Store::claim(&store, &req)).unwrap() {
            Claim::Acquired { token, .. } => token,
            other => panic!("expected a fresh claim, got {other:?}"),
        };
        let wrong = Token(token.0 + 1);
        assert!(now(Store::release(&store, &req.id, wrong)).is_err());
        now(Store::release(&store, &req.id, token)).unwrap();
        assert!(now(Store::get(&store, &req.id)).unwrap().is_none());
        let notes = store.notes.lock().unwrap().clone();
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].starts_with("claim k-1 Acquired"), "{notes:?}");
        assert_eq!(notes[1], format!("release k-1 {token:?}"));

        let off = Off(Noting {
            inner: memory(),
            notes: std::sync::Mutex::default(),
        });
        now(Store::claim(&off, &req)).unwrap();
        assert!(off.0.notes.lock().unwrap().is_empty(), "the hook is off");
    }

    #[test]
    fn an_override_replaces_only_its_own_operation() {
        let store = NoRelease(memory());
        let req = request();
        let dyn_store: &dyn Store = &store;
        let token = match now(dyn_store.claim(&req)).unwrap() {
            Claim::Acquired { token, .. } => token,
            other => panic!("expected a fresh claim, got {other:?}"),
        };
        assert!(now(dyn_store.release(&req.id, token)).is_err());
        assert!(
            now(store.0.get(&req.id)).unwrap().is_some(),
            "the record stays"
        );
    }
}
