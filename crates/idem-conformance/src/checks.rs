//! Checks a store crate runs from its own tests, on states the suite cannot
//! reach through the `Store` trait: a schema migrated from before the
//! journal, a journal the database refuses to append to.

#![allow(clippy::unwrap_used, reason = "a check fails by panicking")]

use idem_core::{
    Claim, ClaimRequest, ListCursor, ListQuery, Outcome, RecordId, Resolution, Resolved, State,
    Store, StoredResult,
};

/// Claims `req`, which must acquire, and marks the record ambiguous.
pub async fn ambiguous<S: Store>(store: &S, req: &ClaimRequest) {
    let claim = store.claim(req).await.unwrap();
    let Claim::Acquired { token, .. } = claim else {
        panic!("{} should be acquired, got {claim:?}", req.id);
    };
    store.mark_ambiguous(&req.id, token).await.unwrap();
}

/// A verdict these checks can give at any time: "completed" needs no wait
/// for the attempt's lease (a "not executed" one would).
fn found() -> Resolution {
    let result = StoredResult::new(200, Vec::new(), b"found".to_vec()).unwrap();
    Resolution::new(Outcome::Completed { result }, "operator", "checked").unwrap()
}

/// `id` is ambiguous with an empty journal (e.g. it was marked before the
/// journal existed); resolving it as completed journals exactly one entry,
/// with its token.
pub async fn resolve_is_journaled<S: Store>(store: &S, id: &RecordId) {
    let record = store.get(id).await.unwrap().unwrap();
    assert_eq!(record.state, State::Ambiguous, "{id} is kept ambiguous");
    assert_eq!(store.resolutions(id).await.unwrap(), [], "{id}: no entries");
    assert_eq!(
        store
            .resolve(id, record.token, found())
            .await
            .map(|r| r.map(|r| r.state)),
        Ok(Some(State::Completed))
    );
    let journal = store.resolutions(id).await.unwrap();
    let entries: Vec<_> = journal.iter().map(|e| (e.outcome, e.token)).collect();
    assert_eq!(entries, [(Resolved::Completed, record.token)], "{id}");
}

/// Resolving `id` fails (the store's journal refuses appends) and changes
/// neither the record nor the journal: the two are written together.
pub async fn failed_append_undoes_resolve<S: Store>(store: &S, id: &RecordId) {
    let before = store.get(id).await.unwrap();
    let token = before.as_ref().map_or(idem_core::Token(1), |r| r.token);
    let got = store.resolve(id, token, found()).await;
    assert!(got.as_ref().is_err_and(|e| e.is_transient()), "{got:?}");
    assert_eq!(store.get(id).await.unwrap(), before, "{id} changed");
    assert_eq!(store.resolutions(id).await.unwrap(), [], "{id} journaled");
}

/// The store holds the `good` records and rows it cannot read at `damaged`
/// ((scope, key) as stored). Listing, page by page and whatever the page
/// size, returns every good record and names every damaged row, each once,
/// in (scope, key) order: one bad row never stops a scan. Pages that hold
/// only damaged rows still move the cursor on.
pub async fn damaged_rows_do_not_stop_scans<S: Store>(
    store: &S,
    good: &[RecordId],
    damaged: &[(&str, &str)],
) {
    let mut expect_good = good.to_vec();
    expect_good.sort();
    let mut expect_damaged: Vec<(String, String)> = damaged
        .iter()
        .map(|(s, k)| ((*s).to_owned(), (*k).to_owned()))
        .collect();
    expect_damaged.sort();
    for limit in [0, 1, 2, 3] {
        let (mut records, mut rows) = (Vec::new(), Vec::new());
        let mut after: Option<ListCursor> = None;
        for _ in 0..=(good.len() + damaged.len() + 1) {
            let query = ListQuery {
                state: None,
                after: after.clone(),
                limit,
            };
            let page = store.list(&query).await.unwrap();
            records.extend(page.records.into_iter().map(|r| r.id));
            for row in page.damaged {
                assert!(!row.reason.is_empty(), "{row:?} says why");
                rows.push((row.scope, row.key));
            }
            after = page.next;
            if after.is_none() {
                break;
            }
        }
        assert_eq!(after, None, "limit {limit}: the scan ends");
        assert_eq!(
            records, expect_good,
            "limit {limit}: every good record once"
        );
        assert_eq!(
            rows, expect_damaged,
            "limit {limit}: every damaged row named"
        );
    }
    let purged = store.purge(100).await;
    assert!(
        purged.is_ok(),
        "a purge goes on past damaged rows: {purged:?}"
    );
}
