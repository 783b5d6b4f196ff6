//! Checks a store crate runs from its own tests, on states the suite cannot
//! reach through the `Store` trait: a schema migrated from before the
//! journal, a journal the database refuses to append to.

#![allow(clippy::unwrap_used, reason = "a check fails by panicking")]

use idem_core::{Claim, ClaimRequest, Outcome, RecordId, Resolution, Resolved, State, Store};

/// Claims `req`, which must acquire, and marks the record ambiguous.
pub async fn ambiguous<S: Store>(store: &S, req: &ClaimRequest) {
    let claim = store.claim(req).await.unwrap();
    let Claim::Acquired { token, .. } = claim else {
        panic!("{} should be acquired, got {claim:?}", req.id);
    };
    store.mark_ambiguous(&req.id, token).await.unwrap();
}

fn not_executed() -> Resolution {
    Resolution::new(Outcome::NotExecuted, "operator", "checked").unwrap()
}

/// `id` is ambiguous with an empty journal (e.g. it was marked before the
/// journal existed); resolving it as not executed releases it and journals
/// exactly one entry, with its token.
pub async fn resolve_is_journaled<S: Store>(store: &S, id: &RecordId) {
    let record = store.get(id).await.unwrap().unwrap();
    assert_eq!(record.state, State::Ambiguous, "{id} is kept ambiguous");
    assert_eq!(store.resolutions(id).await.unwrap(), [], "{id}: no entries");
    assert_eq!(store.resolve(id, not_executed()).await, Ok(None));
    let journal = store.resolutions(id).await.unwrap();
    let found: Vec<_> = journal.iter().map(|e| (e.outcome, e.token)).collect();
    assert_eq!(found, [(Resolved::NotExecuted, record.token)], "{id}");
}

/// Resolving `id` fails (the store's journal refuses appends) and changes
/// neither the record nor the journal: the two are written together.
pub async fn failed_append_undoes_resolve<S: Store>(store: &S, id: &RecordId) {
    let before = store.get(id).await.unwrap();
    let got = store.resolve(id, not_executed()).await;
    assert!(got.as_ref().is_err_and(|e| e.is_transient()), "{got:?}");
    assert_eq!(store.get(id).await.unwrap(), before, "{id} changed");
    assert_eq!(store.resolutions(id).await.unwrap(), [], "{id} journaled");
}
