//! Fencing: only the current token of an `in_progress` record may complete,
//! release or mark it, and tokens only grow, so a paused or zombie worker can
//! never overwrite a newer attempt.

use std::sync::Arc;

use idem_core::{
    Claim, LeaseExpiry, ListQuery, ManualClock, Record, RecordId, State, Store, StoreError, Token,
};

use super::support::{
    OWNER, acquire, ambiguous, completed, fp, in_progress, key, request, request_with, result,
    stored,
};

/// Complete, release and mark_ambiguous with a token that does not own an
/// `in_progress` record → `Fenced` with the record's current (token, state),
/// or `None` when there is no record, and the record unchanged.
pub async fn stale_tokens_are_fenced<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let holders = [
        Holder::WrongToken,
        Holder::Released,
        Holder::NeverExisted,
        Holder::Completed,
        Holder::MarkedAmbiguous,
        Holder::ExpiredLeaseReconciled,
        Holder::TakenOver,
    ];
    for holder in holders {
        for op in [Op::Complete, Op::Release, Op::MarkAmbiguous] {
            let id = key(&format!("fence-{holder:?}-{op:?}"));
            let (presented, current) = holder.prepare(&*store, &clock, &id).await;
            let before = store.get(&id).await.unwrap();
            let got = op.run(&*store, &id, presented).await;
            let expect = Err(StoreError::Fenced {
                id: id.clone(),
                presented,
                current,
            });
            assert_eq!(got, expect, "{op:?} by {holder:?}");
            let after = store.get(&id).await.unwrap();
            assert_eq!(after, before, "{op:?} by {holder:?} changed the record");
        }
    }
}

/// Tokens strictly increase across acquisitions of one key, even when a
/// release or a not-executed resolution removed the record in between; no
/// earlier token can complete the latest attempt.
pub async fn tokens_increase_across_release<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let id = key("reacquired");
    let mut tokens: Vec<Token> = Vec::new();
    for round in 0..3 {
        let token = acquire(&*store, &clock, &request(&id, fp(1))).await;
        if let Some(last) = tokens.last() {
            assert!(token > *last, "round {round}: token {token} after {last}");
        }
        tokens.push(token);
        store.release(&id, token).await.unwrap();
        assert_eq!(
            store.get(&id).await.unwrap(),
            None,
            "round {round}: released"
        );
    }
    let marked = ambiguous(&*store, &clock, &id, fp(1)).await;
    assert!(marked.token > tokens[2], "after an ambiguous attempt");
    let resolution =
        idem_core::Resolution::new(idem_core::Outcome::NotExecuted, "reconciler", "not found")
            .unwrap();
    clock.set(marked.lease_until);
    store.resolve(&id, marked.token, resolution).await.unwrap();
    tokens.push(marked.token);
    let latest = acquire(&*store, &clock, &request(&id, fp(1))).await;
    assert!(latest > marked.token, "after a not-executed resolution");
    for old in tokens {
        let got = store.complete(&id, old, result(1)).await;
        let expect = Err(StoreError::Fenced {
            id: id.clone(),
            presented: old,
            current: Some((latest, State::InProgress)),
        });
        assert_eq!(
            got, expect,
            "old token {old} completes the attempt of {latest}"
        );
    }
    assert_eq!(stored(&*store, &id).await.token, latest);
}

/// Release removes the record: `get` says `None`, `list` omits it, and the
/// next claim acquires afresh, even with another fingerprint.
pub async fn release_removes_record<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let id = key("released");
    let before = in_progress(&*store, &clock, &id, fp(1)).await;
    assert_eq!(store.release(&id, before.token).await, Ok(()));
    assert_eq!(store.get(&id).await.unwrap(), None);
    assert_eq!(
        store.list(&ListQuery::default()).await.unwrap().records,
        Vec::new()
    );
    let again = acquire(&*store, &clock, &request(&id, fp(2))).await;
    assert!(again > before.token);
    assert_eq!(stored(&*store, &id).await.fingerprint, fp(2));
}

/// `mark_ambiguous` with the current token → the same record in state
/// `ambiguous`, returned and stored; claims then say outcome unknown.
pub async fn mark_ambiguous_sets_state<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let id = key("marked");
    let before = in_progress(&*store, &clock, &id, fp(1)).await;
    clock.advance_millis(10);
    let marked = store.mark_ambiguous(&id, before.token).await.unwrap();
    let expect = Record {
        state: State::Ambiguous,
        ..before
    };
    assert_eq!(marked, expect);
    assert_eq!(stored(&*store, &id).await, expect);
    let claim = store.claim(&request(&id, fp(1))).await;
    let unknown = Claim::OutcomeUnknown {
        newly_marked: false,
    };
    assert_eq!(claim, Ok(unknown));
}

/// Who holds the record when a token is presented.
#[derive(Clone, Copy, Debug)]
enum Holder {
    /// `in_progress` under another token than the one presented.
    WrongToken,
    /// The attempt released the record; its token is presented again.
    Released,
    /// There never was a record.
    NeverExisted,
    /// The attempt completed; its token is presented again.
    Completed,
    /// The attempt marked itself ambiguous; its token is presented again.
    MarkedAmbiguous,
    /// A later claim found the lease expired and marked the record ambiguous.
    ExpiredLeaseReconciled,
    /// A later claim took the record over; the old token is presented.
    TakenOver,
}

impl Holder {
    /// Builds the situation; returns the token to present and the
    /// `current` the store must report.
    async fn prepare<S: Store>(
        self,
        store: &S,
        clock: &ManualClock,
        id: &RecordId,
    ) -> (Token, Option<(Token, State)>) {
        match self {
            Holder::WrongToken => {
                let r = in_progress(store, clock, id, fp(1)).await;
                (Token(r.token.0 + 1_000), Some((r.token, State::InProgress)))
            }
            Holder::Released => {
                let r = in_progress(store, clock, id, fp(1)).await;
                store.release(id, r.token).await.unwrap();
                (r.token, None)
            }
            Holder::NeverExisted => (Token(1), None),
            Holder::Completed => {
                let r = completed(store, clock, id, fp(1), 1).await;
                (r.token, Some((r.token, State::Completed)))
            }
            Holder::MarkedAmbiguous => {
                let r = ambiguous(store, clock, id, fp(1)).await;
                (r.token, Some((r.token, State::Ambiguous)))
            }
            Holder::ExpiredLeaseReconciled => {
                let r = in_progress(store, clock, id, fp(1)).await;
                clock.set(r.lease_until);
                let claim = store.claim(&request(id, fp(1))).await;
                assert_eq!(claim, Ok(Claim::OutcomeUnknown { newly_marked: true }));
                (r.token, Some((r.token, State::Ambiguous)))
            }
            Holder::TakenOver => {
                let takeover = request_with(id, fp(1), LeaseExpiry::Takeover, OWNER);
                let old = acquire(store, clock, &takeover).await;
                clock.set(stored(store, id).await.lease_until);
                let claim = store.claim(&takeover).await.unwrap();
                let Claim::Acquired { token: new, .. } = claim else {
                    panic!("takeover of {id} should acquire, got {claim:?}");
                };
                (old, Some((new, State::InProgress)))
            }
        }
    }
}

/// A write that needs the current token.
#[derive(Clone, Copy, Debug)]
enum Op {
    Complete,
    Release,
    MarkAmbiguous,
}

impl Op {
    async fn run<S: Store>(self, store: &S, id: &RecordId, token: Token) -> Result<(), StoreError> {
        match self {
            Op::Complete => store.complete(id, token, result(1)).await.map(drop),
            Op::Release => store.release(id, token).await,
            Op::MarkAmbiguous => store.mark_ambiguous(id, token).await.map(drop),
        }
    }
}
