//! Why a record is ambiguous: the note its attempt writes after marking it
//! is kept whole, only for that attempt while the record is ambiguous, and
//! dropped when the record completes.

use std::sync::Arc;

use idem_core::{
    AMBIGUITY_EXCERPT_BYTES_MAX, AmbiguityNote, ManualClock, Outcome, Resolution, State, Store,
    StoreError,
};

use super::support::{acquire, ambiguous, fp, in_progress, key, request, result, stored};

/// A note the size of the largest one, with what a store could mangle:
/// non-ASCII text, quotes, a number beyond 2^53 kept as its text.
fn note(clock: &ManualClock, status: u16) -> AmbiguityNote {
    let excerpt = "é\"\\\u{1F600}".repeat(AMBIGUITY_EXCERPT_BYTES_MAX);
    AmbiguityNote::new(
        Some(status),
        &format!("upstream answered {status}"),
        Some(excerpt.as_bytes()),
        "node-ü",
        idem_core::Clock::now(clock),
        vec![
            ("/amount".into(), "12345678901234567890.25".into()),
            ("/seller_id".into(), "\"s-1\"".into()),
        ],
    )
}

/// `note_ambiguity` with the marking attempt's token → the record keeps the
/// note byte for byte (a later note replaces it); with another token, on a
/// record not marked ambiguous, or on none → refused, nothing changed; a
/// completed resolution drops it, and a fresh acquisition has none.
pub async fn ambiguity_note_is_kept_for_its_attempt_only<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let id = key("noted");
    let marked = ambiguous(&*store, &clock, &id, fp(1)).await;
    assert_eq!(marked.ambiguity, None, "a mark alone says nothing");
    let first = note(&clock, 503);
    store
        .note_ambiguity(&id, marked.token, first.clone())
        .await
        .unwrap();
    assert_eq!(stored(&*store, &id).await.ambiguity, Some(first.clone()));
    let second = note(&clock, 502);
    store
        .note_ambiguity(&id, marked.token, second.clone())
        .await
        .unwrap();
    let noted = stored(&*store, &id).await;
    assert_eq!(
        noted.ambiguity,
        Some(second.clone()),
        "a later note replaces"
    );
    let listed = store.list(&Default::default()).await.unwrap();
    assert_eq!(
        listed.records,
        std::slice::from_ref(&noted),
        "a listing shows the note"
    );

    let stale = idem_core::Token(marked.token.0.wrapping_add(1));
    let refused = store.note_ambiguity(&id, stale, first.clone()).await;
    assert!(
        matches!(refused, Err(StoreError::Fenced { .. })),
        "{refused:?}"
    );
    assert_eq!(
        stored(&*store, &id).await,
        noted,
        "a stale note changes nothing"
    );

    let running = key("running");
    let held = in_progress(&*store, &clock, &running, fp(1)).await;
    let refused = store
        .note_ambiguity(&running, held.token, first.clone())
        .await;
    assert!(
        matches!(refused, Err(StoreError::WrongState { .. })),
        "{refused:?}"
    );
    assert_eq!(stored(&*store, &running).await, held);
    let refused = store.note_ambiguity(&key("none"), held.token, first).await;
    assert!(
        matches!(refused, Err(StoreError::NotFound { .. })),
        "{refused:?}"
    );

    let verdict = Resolution::new(Outcome::Completed { result: result(1) }, "op", "paid").unwrap();
    let done = store.resolve(&id, marked.token, verdict).await.unwrap();
    let done = done.unwrap();
    assert_eq!(done.state, State::Completed);
    assert_eq!(done.ambiguity, None, "a completed record needs no note");
    assert_eq!(stored(&*store, &id).await.ambiguity, None);
}

/// A note about an attempt whose record was resolved "not executed" and
/// claimed again is refused: the new attempt's record has no note.
pub async fn ambiguity_note_of_a_gone_attempt_is_dropped<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let id = key("moved-on");
    let marked = ambiguous(&*store, &clock, &id, fp(1)).await;
    clock.advance_millis(super::support::LEASE_MS + 1);
    let verdict = Resolution::new(Outcome::NotExecuted, "op", "not paid").unwrap();
    assert_eq!(store.resolve(&id, marked.token, verdict).await, Ok(None));
    let token = acquire(&*store, &clock, &request(&id, fp(1))).await;
    let late = store
        .note_ambiguity(&id, marked.token, note(&clock, 503))
        .await;
    assert!(matches!(late, Err(StoreError::Fenced { .. })), "{late:?}");
    let now = stored(&*store, &id).await;
    assert_eq!((now.token, now.ambiguity), (token, None));
}
