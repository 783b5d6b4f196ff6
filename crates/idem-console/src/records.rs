//! What the console reads from the store: pages of records searched by
//! key (exact, or a prefix), route, tenant (the digests of the value the
//! operator knows), principal digest, state and age — a bounded scan,
//! since the store lists by state and position only, that starts and
//! stops at the route's (and the tenant's) range of scopes when they are
//! given, because a scope begins with `operation|principal` — the
//! backlog's size and oldest age, and everything known about one record.

use idem_core::{
    IdempotencyKey, JournalEntry, LIST_LIMIT_MAX, ListCursor, ListQuery, LookupTries, Record,
    RecordId, Scope, State, Store, StoreError, Timestamp,
};
use idem_http::Route;

/// Matching records shown per page of the ambiguous list.
pub const PAGE_ROWS: usize = 50;
/// Rows read from the store per list call while filtering.
pub const SCAN_BATCH_ROWS: usize = 500;
/// The most rows one page of the ambiguous list reads, whatever matches:
/// a filter that matches little never scans the whole store at once.
pub const SCAN_ROWS_MAX: usize = 5_000;
/// The most ambiguous rows the overview counts.
pub const BACKLOG_ROWS_MAX: usize = LIST_LIMIT_MAX;

/// What the record list is filtered by; empty fields match everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Filter {
    /// The key exactly, or the start of it when it ends with `*`.
    pub key: String,
    /// The scope's operation (the route name) exactly.
    pub route: String,
    /// The start of the scope's principal digest.
    pub principal: String,
    /// The tenant's value as the operator typed it (shown back, never
    /// matched itself).
    pub tenant: String,
    /// The digests `tenant` has on the searched routes; a record matches
    /// when its principal is one of them. Empty: no tenant searched.
    pub tenant_digests: Vec<String>,
    /// Only records in this state; `None`: any state.
    pub state: Option<State>,
    /// Only records acquired at least this many minutes ago.
    pub older_than_min: Option<u64>,
}

/// One page of the filtered ambiguous list.
#[derive(Debug)]
pub(crate) struct Page {
    pub records: Vec<Record>,
    /// Rows read from the store for this page.
    pub scanned: usize,
    /// Unreadable rows among them (`idem records list` names them).
    pub damaged: usize,
    /// Where the next page starts.
    pub next: Option<ListCursor>,
    /// True when the page stopped at [`SCAN_ROWS_MAX`] before filling.
    pub scan_bounded: bool,
    /// The store's clock the records were judged at: their states are
    /// shown as they are then (a completed record past its retention is a
    /// tombstone), as the filter matched them.
    pub now: Timestamp,
}

/// The ambiguous backlog.
#[derive(Debug, Default)]
pub(crate) struct Backlog {
    /// Ambiguous rows counted (readable or not).
    pub count: usize,
    /// True when there are more than [`BACKLOG_ROWS_MAX`].
    pub more: bool,
    /// When the oldest one was acquired.
    pub oldest: Option<Timestamp>,
}

/// Everything the record page shows.
pub(crate) struct Detail {
    /// `None` once released (resolved as not executed) or purged.
    pub record: Option<Record>,
    pub tries: Option<LookupTries>,
    pub journal: Vec<JournalEntry>,
    /// The route whose forward-key template made the forwarded key.
    pub route: Option<Route>,
    /// Whether the record's route has a lookup the console can run now.
    pub lookup: bool,
}

/// The parts of a scope: `operation|principal[|region]`.
pub(crate) struct ScopeParts<'a> {
    pub operation: &'a str,
    pub principal: &'a str,
}

impl Filter {
    /// Whether `r` passes the filter at `now`.
    pub(crate) fn matches(&self, r: &Record, now: Timestamp) -> bool {
        let parts = ScopeParts::of(&r.id.scope);
        let route = self.route.trim();
        let principal = self.principal.trim();
        let old_enough = self
            .older_than_min
            .is_none_or(|min| r.created_at.millis_until(now) >= min.saturating_mul(60_000));
        let key = self.key.trim();
        let key_matches = match key.strip_suffix('*') {
            _ if key.is_empty() => true,
            Some(prefix) => r.id.key.as_str().starts_with(prefix),
            None => r.id.key.as_str() == key,
        };
        let tenant_matches = self.tenant_digests.is_empty()
            || self.tenant_digests.iter().any(|d| d == parts.principal);
        (route.is_empty() || parts.operation == route)
            && (principal.is_empty() || parts.principal.starts_with(principal))
            && key_matches
            && tenant_matches
            && self.state.is_none_or(|s| r.state_at(now) == s)
            && old_enough
    }

    /// The start every matching scope has, when the route is given:
    /// `route|`, then the one tenant digest or the principal prefix.
    /// The store lists in (scope, key) byte order, so the matches are one
    /// contiguous range that begins at this prefix.
    pub(crate) fn scope_prefix(&self) -> Option<String> {
        let route = self.route.trim();
        if route.is_empty() {
            return None;
        }
        let principal = match self.tenant_digests.as_slice() {
            [one] => one.as_str(),
            [] => self.principal.trim(),
            _ => "",
        };
        Some(format!("{route}|{principal}"))
    }

    /// The tenant's value, when the operator searched by it and `r`'s
    /// principal is one of its digests: what the page may show next to the
    /// digest (it is the header value or claim, never a credential).
    pub(crate) fn tenant_of(&self, r: &Record) -> Option<&str> {
        let principal = ScopeParts::of(&r.id.scope).principal;
        self.tenant_digests
            .iter()
            .any(|d| d == principal)
            .then_some(self.tenant.as_str())
    }
}

impl<'a> ScopeParts<'a> {
    pub(crate) fn of(scope: &'a Scope) -> ScopeParts<'a> {
        let mut parts = scope.as_str().splitn(3, '|');
        ScopeParts {
            operation: parts.next().unwrap_or(""),
            principal: parts.next().unwrap_or(""),
        }
    }
}

/// The page of records matching `filter` after `after`: at most
/// [`PAGE_ROWS`] of them, reading at most [`SCAN_ROWS_MAX`] rows, from
/// the start of the filter's scope range to its end.
pub(crate) async fn search_page(
    store: &dyn Store,
    filter: &Filter,
    after: Option<ListCursor>,
    now: Timestamp,
) -> Result<Page, StoreError> {
    let mut page = Page {
        records: Vec::new(),
        scanned: 0,
        damaged: 0,
        next: None,
        scan_bounded: false,
        now,
    };
    let range = filter.scope_prefix();
    let start = range.as_ref().map(|prefix| ListCursor {
        scope: prefix.clone(),
        key: String::new(),
    });
    // A cursor before the range (a hand-edited link) starts at the range.
    let mut cursor = match (after, start) {
        (Some(after), Some(start)) => Some(std::cmp::max_by(after, start, |a, b| {
            (&a.scope, &a.key).cmp(&(&b.scope, &b.key))
        })),
        (after, start) => after.or(start),
    };
    loop {
        let query = ListQuery {
            state: filter.state,
            after: cursor.clone(),
            limit: SCAN_BATCH_ROWS,
        };
        let listing = store.list(&query).await?;
        page.scanned += listing.records.len() + listing.damaged.len();
        page.damaged += listing.damaged.len();
        let more_in_store = listing.next.is_some();
        let count = listing.records.len();
        for (i, record) in listing.records.into_iter().enumerate() {
            let past_range = range
                .as_ref()
                .is_some_and(|p| !record.id.scope.as_str().starts_with(p.as_str()));
            if past_range {
                page.next = None;
                return Ok(page);
            }
            if !filter.matches(&record, now) {
                continue;
            }
            let position = ListCursor::from(&record.id);
            page.records.push(record);
            if page.records.len() == PAGE_ROWS {
                let rest = i + 1 < count || more_in_store;
                page.next = rest.then_some(position);
                return Ok(page);
            }
        }
        cursor = listing.next;
        if cursor.is_none() {
            return Ok(page);
        }
        if page.scanned >= SCAN_ROWS_MAX {
            page.next = cursor;
            page.scan_bounded = true;
            return Ok(page);
        }
    }
}

/// How many records are ambiguous (up to [`BACKLOG_ROWS_MAX`]) and the
/// oldest acquisition among them.
pub(crate) async fn backlog(store: &dyn Store) -> Result<Backlog, StoreError> {
    let query = ListQuery {
        state: Some(State::Ambiguous),
        after: None,
        limit: BACKLOG_ROWS_MAX,
    };
    let listing = store.list(&query).await?;
    Ok(Backlog {
        count: listing.records.len() + listing.damaged.len(),
        more: listing.next.is_some(),
        oldest: listing.records.iter().map(|r| r.created_at).min(),
    })
}

/// The record, its kept lookup tries and its resolution journal; the
/// route is the first of `routes` whose records carry the scope's
/// operation (the catch-all route when none is named after it).
pub(crate) async fn detail(
    store: &dyn Store,
    routes: &[Route],
    id: &RecordId,
) -> Result<Detail, StoreError> {
    let record = store.get(id).await?;
    let tries = match &record {
        Some(r) => store.lookup_tries(id, r.token).await?,
        None => None,
    };
    let journal = store.resolutions(id).await?;
    let operation = ScopeParts::of(&id.scope).operation;
    let route = routes
        .iter()
        .find(|r| r.operation_name() == Some(operation))
        .or_else(|| routes.iter().find(|r| r.operation_name().is_none()))
        .cloned();
    Ok(Detail {
        record,
        tries,
        journal,
        route,
        lookup: false,
    })
}

/// A record id from the text of a link or form, with what is wrong.
pub(crate) fn record_id(scope: &str, key: &str) -> Result<RecordId, String> {
    Ok(RecordId {
        scope: Scope::new(scope).map_err(|e| format!("scope {scope:?}: {e}"))?,
        key: IdempotencyKey::new(key).map_err(|e| format!("key {key:?}: {e}"))?,
    })
}

/// The header and value the upstream received the key as: the route's
/// forward-key template rendered by the layer's own renderer.
pub(crate) fn forwarded(route: &Route, id: &RecordId) -> (String, String) {
    // `contract_headers` lists the key header, then the forwarded one.
    let header = route
        .contract_headers()
        .nth(1)
        .map(|h| h.as_str().to_owned())
        .unwrap_or_default();
    (header, route.forwarded_key(id))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use idem_core::{Clock, ManualClock, MemoryStore};
    use idem_testkit::stores::{Backend, open_with_clock};

    use super::*;

    const T0: u64 = 1_796_029_200_000;

    /// `n` ambiguous records: operations alternate between `payouts` and
    /// `refunds`, principals between `aa…` and `bb…`, one minute apart.
    async fn store_with(n: usize) -> (Arc<MemoryStore>, ManualClock) {
        let clock = ManualClock::new(Timestamp::from_millis(T0));
        let store = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
        for i in 0..n {
            let operation = if i % 2 == 0 { "payouts" } else { "refunds" };
            let principal = if i % 3 == 0 { "aa11" } else { "bb22" };
            let (scope, key) = (format!("{operation}|{principal}"), format!("k-{i:05}"));
            super::super::tests::ambiguous(&*store, &scope, &key).await;
            clock.advance_millis(60_000);
        }
        (store, clock)
    }

    #[tokio::test]
    async fn pages_hold_only_matches_and_chain_through_every_one() {
        let (store, clock) = store_with(400).await;
        let filter = Filter {
            route: "refunds".into(),
            principal: "aa".into(),
            older_than_min: Some(10),
            ..Filter::default()
        };
        let now = clock.now();
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let page = search_page(&*store, &filter, after, now).await.unwrap();
            assert!(page.records.len() <= PAGE_ROWS);
            assert!(page.records.iter().all(|r| filter.matches(r, now)));
            seen.extend(page.records.iter().map(|r| r.id.key.to_string()));
            after = page.next;
            if after.is_none() {
                break;
            }
        }
        // Odd i (refunds), i % 3 == 0 (aa11), acquired 10+ minutes before
        // the end: i in 3, 9, 15, … up to 389.
        let want: Vec<String> = (0..390)
            .filter(|i| i % 2 == 1 && i % 3 == 0)
            .map(|i| format!("k-{i:05}"))
            .collect();
        assert_eq!(seen, want);
    }

    #[tokio::test]
    async fn a_scan_that_finds_little_stops_at_its_bound() {
        let (store, clock) = store_with(SCAN_ROWS_MAX + 10).await;
        let filter = Filter {
            key: "nothing-matches".into(),
            ..Filter::default()
        };
        let page = search_page(&*store, &filter, None, clock.now())
            .await
            .unwrap();
        assert!(page.records.is_empty());
        assert!(page.scan_bounded);
        assert_eq!(page.scanned, SCAN_ROWS_MAX);
        assert!(page.next.is_some());
        let backlog = backlog(&*store).await.unwrap();
        assert_eq!(backlog.count, SCAN_ROWS_MAX + 10);
        assert_eq!(backlog.oldest, Some(Timestamp::from_millis(T0)));
    }

    /// A route and a tenant read only their own range of scopes; a key
    /// matches exactly, or by prefix with a trailing `*`; a state that
    /// no record is in finds nothing.
    #[tokio::test]
    async fn a_search_reads_only_the_range_it_can_match() {
        let (store, clock) = store_with(600).await;
        let now = clock.now();
        let run = |filter: Filter| {
            let store = store.clone();
            async move { search_page(&*store, &filter, None, now).await.unwrap() }
        };
        let keys = |page: &Page| -> Vec<String> {
            page.records.iter().map(|r| r.id.key.to_string()).collect()
        };
        // refunds|aa11: odd i with i % 3 == 0, 100 of the 600.
        let tenant = Filter {
            route: "refunds".into(),
            tenant: "acme".into(),
            tenant_digests: vec!["aa11".into()],
            ..Filter::default()
        };
        let page = run(tenant.clone()).await;
        assert_eq!(page.records.len(), PAGE_ROWS);
        // The range starts past the 300 payouts records.
        assert!(page.scanned <= 300, "read {}", page.scanned);
        assert!(
            page.records
                .iter()
                .all(|r| tenant.tenant_of(r) == Some("acme"))
        );
        let exact = run(Filter {
            key: "k-00009".into(),
            ..tenant.clone()
        })
        .await;
        assert_eq!(keys(&exact), ["k-00009"]);
        assert!(exact.next.is_none());
        // payouts|aa11 comes first: the search stops where its range ends,
        // within the first batch, never reading to the end of the store.
        let first = run(Filter {
            key: "k-00006".into(),
            route: "payouts".into(),
            ..tenant.clone()
        })
        .await;
        assert_eq!(keys(&first), ["k-00006"]);
        assert!(first.next.is_none());
        assert!(first.scanned <= SCAN_BATCH_ROWS, "read {}", first.scanned);
        let prefix = run(Filter {
            key: "k-0000*".into(),
            ..Filter::default()
        })
        .await;
        assert_eq!(keys(&prefix).len(), 10);
        let other_state = run(Filter {
            state: Some(State::Completed),
            ..tenant
        })
        .await;
        assert!(other_state.records.is_empty());
    }

    /// Every record of `store`, in listing order.
    async fn everything(store: &dyn Store) -> Vec<Record> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let query = ListQuery {
                state: None,
                after,
                limit: 0,
            };
            let listing = store.list(&query).await.unwrap();
            all.extend(listing.records);
            after = listing.next;
            if after.is_none() {
                return all;
            }
        }
    }

    /// Every page of a search, chained.
    async fn searched(store: &dyn Store, filter: &Filter, now: Timestamp) -> Vec<RecordId> {
        let mut found = Vec::new();
        let mut after = None;
        loop {
            let page = search_page(store, filter, after, now).await.unwrap();
            found.extend(page.records.into_iter().map(|r| r.id));
            after = page.next;
            if after.is_none() {
                return found;
            }
        }
    }

    const OPERATIONS: [&str; 4] = ["pay", "pay-eu", "payouts", "refunds"];
    const PRINCIPALS: [&str; 4] = ["aa11", "aa12", "ab", "anonymous"];

    fn filter_strategy() -> impl proptest::strategy::Strategy<Value = Filter> {
        use proptest::prelude::*;
        let route = prop_oneof![
            Just(String::new()),
            prop::sample::select(&OPERATIONS[..]).prop_map(String::from)
        ];
        let digests = prop::sample::subsequence(&PRINCIPALS[..], 0..=2)
            .prop_map(|d| d.into_iter().map(String::from).collect::<Vec<_>>());
        let principal = prop::sample::select(vec!["", "a", "aa1", "ab"]).prop_map(String::from);
        let key =
            prop::sample::select(vec!["", "k", "k*", "ka*", "kab", "*"]).prop_map(String::from);
        let state =
            prop::sample::select(vec![None, Some(State::Ambiguous), Some(State::InProgress)]);
        (route, digests, principal, key, state).prop_map(
            |(route, tenant_digests, principal, key, state)| Filter {
                key,
                route,
                principal,
                tenant: "t".into(),
                tenant_digests,
                state,
                older_than_min: None,
            },
        )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

        /// Chained pages of a search hold exactly the records a plain
        /// filter over the whole store keeps, in order, through the memory
        /// store, a real SQLite file and PostgreSQL: the range a route and a tenant
        /// start and stop at never skips one (operations that prefix one
        /// another, regional scopes, keys that hold `*`).
        #[test]
        fn a_search_finds_what_a_plain_filter_finds(
            records in proptest::collection::vec(
                (0..OPERATIONS.len(), 0..PRINCIPALS.len(), proptest::bool::ANY, "k[a-b*]{0,3}", proptest::bool::ANY),
                1..40,
            ),
            filters in proptest::collection::vec(filter_strategy(), 1..6),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let clock = ManualClock::new(Timestamp::from_millis(T0));
                let shared: Arc<dyn Clock> = Arc::new(clock.clone());
                let sqlite = open_with_clock(Backend::Sqlite, "console", Some(shared.clone())).await;
                let postgres = open_with_clock(Backend::Postgres, "console", Some(shared)).await;
                let stores: [Arc<dyn Store>; 3] = [
                    Arc::new(MemoryStore::new(Arc::new(clock.clone()))),
                    sqlite.store.clone(),
                    postgres.store.clone(),
                ];
                for store in &stores {
                    for (op, principal, regional, key, ambiguous) in &records {
                        let region = if *regional { "|eu" } else { "" };
                        let scope = format!("{}|{}{region}", OPERATIONS[*op], PRINCIPALS[*principal]);
                        put(&**store, &scope, key, *ambiguous).await;
                    }
                }
                let now = clock.now();
                for store in &stores {
                    let all = everything(&**store).await;
                    for filter in &filters {
                        let want: Vec<RecordId> = all
                            .iter()
                            .filter(|r| filter.matches(r, now))
                            .map(|r| r.id.clone())
                            .collect();
                        let got = searched(&**store, filter, now).await;
                        assert_eq!(got, want, "{filter:?}");
                    }
                }
            });
        }
    }

    /// Claims `key` in `scope` (once: a repeated one is left as it is) and,
    /// when `ambiguous`, marks it so.
    async fn put(store: &dyn Store, scope: &str, key: &str, ambiguous: bool) {
        let req = crate::tests::claim_request(scope, key);
        if let idem_core::Claim::Acquired { token, .. } = store.claim(&req).await.unwrap()
            && ambiguous
        {
            store.mark_ambiguous(&req.id, token).await.unwrap();
        }
    }
}
