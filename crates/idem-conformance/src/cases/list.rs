//! Listing for operators: (scope, key) order by bytes, a state filter that
//! reads the state at the store's clock, and a cursor that pages through
//! every record exactly once.

use std::sync::Arc;

use idem_core::{ListCursor, ListQuery, ManualClock, RecordId, State, Store};

use super::support::{RETENTION_MS, ambiguous, completed, fp, id, in_progress, key};

/// `list` returns records in (scope, key) order, comparing bytes (upper case
/// before lower case, `-` before digits), whatever the insertion order; an
/// `after` cursor need not name an existing record.
pub async fn list_orders_by_scope_then_key<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let scopes = ["B|t", "a|t", "b|t"];
    let keys = ["K1", "k1", "k1-", "k10", "k2"];
    // Insert in an order unrelated to the expected one.
    for k in keys.iter().rev() {
        for s in [scopes[1], scopes[2], scopes[0]] {
            in_progress(&*store, &clock, &id(s, k), fp(1)).await;
        }
    }
    let sorted: Vec<RecordId> = scopes
        .iter()
        .flat_map(|s| keys.iter().map(move |k| id(s, k)))
        .collect();
    let rows: [(&str, ListQuery, &[RecordId]); 4] = [
        ("everything", ListQuery::default(), &sorted),
        (
            "after an existing record",
            query(None, Some(id("a|t", "k10").into()), 0),
            &sorted[9..],
        ),
        (
            "after a gap between two records",
            query(None, Some(id("a|t", "k1+").into()), 0),
            &sorted[7..],
        ),
        (
            "after the last record",
            query(None, Some(id("b|t", "k2").into()), 0),
            &[],
        ),
    ];
    for (row, q, expect) in rows {
        assert_eq!(ids(&*store, &q).await, expect, "{row}");
    }
}

/// The state filter uses the state at the store's clock: a completed record
/// past retention lists as a tombstone (purged or not), an `in_progress`
/// record with an expired lease stays `in_progress`; limit and cursor apply
/// after the filter.
pub async fn list_filters_by_state_at_store_clock<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    completed(&*store, &clock, &key("tombstone"), fp(1), 1).await;
    clock.advance_millis(RETENTION_MS);
    assert_eq!(store.purge(100).await.unwrap().tombstoned, 1);
    completed(&*store, &clock, &key("expired"), fp(1), 1).await;
    in_progress(&*store, &clock, &key("in-progress-stale"), fp(1)).await;
    clock.advance_millis(RETENTION_MS);
    completed(&*store, &clock, &key("completed"), fp(1), 1).await;
    in_progress(&*store, &clock, &key("in-progress"), fp(1)).await;
    ambiguous(&*store, &clock, &key("ambiguous"), fp(1)).await;
    let all = [
        "ambiguous",
        "completed",
        "expired",
        "in-progress",
        "in-progress-stale",
        "tombstone",
    ];
    let rows: [(ListQuery, &[&str]); 8] = [
        (query(None, None, 0), &all),
        (
            query(Some(State::InProgress), None, 0),
            &["in-progress", "in-progress-stale"],
        ),
        (query(Some(State::Completed), None, 0), &["completed"]),
        (query(Some(State::Ambiguous), None, 0), &["ambiguous"]),
        (
            query(Some(State::Tombstone), None, 0),
            &["expired", "tombstone"],
        ),
        (query(Some(State::Tombstone), None, 1), &["expired"]),
        (
            query(Some(State::Tombstone), Some(key("expired").into()), 0),
            &["tombstone"],
        ),
        (
            query(Some(State::InProgress), Some(key("b").into()), 1),
            &["in-progress"],
        ),
    ];
    for (q, expect) in rows {
        let expect: Vec<RecordId> = expect.iter().map(|k| key(k)).collect();
        assert_eq!(ids(&*store, &q).await, expect, "{q:?}");
    }
}

/// Paging with `after` = the last id of the previous page returns every
/// record exactly once, in order, `limit` at a time; `limit` is honoured.
pub async fn list_pages_with_after_cursor<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let mut expect = Vec::new();
    for s in ["page|1", "page|2", "page|3"] {
        for k in 0..8 {
            let id = id(s, &format!("k{k:02}"));
            in_progress(&*store, &clock, &id, fp(1)).await;
            expect.push(id);
        }
    }
    for (limit, expect_len) in [(1, 1), (3, 3), (24, 24), (25, 24), (0, 24)] {
        let got = ids(&*store, &query(None, None, limit)).await;
        assert_eq!(got, expect[..expect_len], "limit {limit}");
    }
    let mut seen = Vec::new();
    let mut page_lens = Vec::new();
    let mut cursor = None;
    // Bounded, so that a store ignoring the cursor fails instead of looping.
    for _ in 0..=expect.len() {
        let page = store.list(&query(None, cursor.clone(), 5)).await.unwrap();
        page_lens.push(page.records.len());
        let full = page.records.len() == 5;
        assert_eq!(
            page.next,
            page.records
                .last()
                .filter(|_| full)
                .map(|r| ListCursor::from(&r.id)),
            "a full page points past its last row; a short one ends the scan"
        );
        seen.extend(page.records.into_iter().map(|r| r.id));
        cursor = page.next;
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(page_lens, [5, 5, 5, 5, 4], "page sizes");
    assert_eq!(seen, expect, "every record once, in order");
}

fn query(state: Option<State>, after: Option<ListCursor>, limit: usize) -> ListQuery {
    ListQuery {
        state,
        after,
        limit,
    }
}

async fn ids<S: Store>(store: &S, q: &ListQuery) -> Vec<RecordId> {
    let listing = store.list(q).await.unwrap();
    assert_eq!(listing.damaged, Vec::new(), "no row is damaged");
    listing.records.into_iter().map(|r| r.id).collect()
}
