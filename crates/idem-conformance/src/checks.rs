//! Checks a store crate runs from its own tests, on states the suite cannot
//! reach through the `Store` trait: a schema migrated from before the
//! journal, a journal the database refuses to append to, a store written
//! by an earlier schema version and upgraded in place ([`Written`]).

#![allow(clippy::unwrap_used, reason = "a check fails by panicking")]

use idem_core::{
    Claim, ClaimRequest, ListCursor, ListQuery, Outcome, Record, RecordId, Resolution, Resolved,
    State, Store, StoredResult, Timestamp, Verb, VerbRequest,
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
    Resolution::new(
        Outcome::Completed {
            result: bytes_result(),
        },
        "operator",
        "checked",
    )
    .unwrap()
}

/// A result whose header values are not UTF-8, the form records written
/// before values were bytes could not hold: an upgraded store keeps it too.
fn bytes_result() -> StoredResult {
    let headers = vec![
        (
            "content-type".to_owned(),
            b"text/plain; name=caf\xe9".as_slice().into(),
        ),
        ("location".to_owned(), b"/found/\xff".as_slice().into()),
    ];
    StoredResult::new(200, headers, b"found".to_vec()).unwrap()
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

/// The completed record of `id` takes `verb` (by an operator, with a
/// reason): the journal gains exactly one entry naming it and the record's
/// token, and the record becomes a tombstone (`expire`) or is gone
/// (`evict`).
pub async fn verb_is_journaled<S: Store>(store: &S, id: &RecordId, verb: Verb) {
    let record = store.get(id).await.unwrap().unwrap();
    assert_eq!(record.state, State::Completed, "{id} is completed");
    let before = store.resolutions(id).await.unwrap();
    let request = VerbRequest::new(verb, "operator", "checked").unwrap();
    let got = store.apply_verb(id, record.token, request).await.unwrap();
    let after = store.get(id).await.unwrap();
    assert_eq!(got, after, "{id}: the verb returns what it stored");
    let state = after.map(|r| r.state);
    match verb {
        Verb::Expire => assert_eq!(state, Some(State::Tombstone), "{id}"),
        Verb::Evict => assert_eq!(state, None, "{id}"),
    }
    let journal = store.resolutions(id).await.unwrap();
    assert_eq!(
        journal[..before.len()],
        before[..],
        "{id}: earlier entries kept"
    );
    let added: Vec<_> = journal[before.len()..]
        .iter()
        .map(|e| (e.verb, e.token, e.by.as_str()))
        .collect();
    assert_eq!(added, [(Some(verb), record.token, "operator")], "{id}");
}

/// Evicting `id` fails (the store's journal refuses appends) and changes
/// neither the record nor the journal: the two are written together.
pub async fn failed_append_undoes_verb<S: Store>(store: &S, id: &RecordId) {
    let before = store.get(id).await.unwrap();
    let journal = store.resolutions(id).await.unwrap();
    let token = before.as_ref().map_or(idem_core::Token(1), |r| r.token);
    let request = VerbRequest::new(Verb::Evict, "operator", "checked").unwrap();
    let got = store.apply_verb(id, token, request).await;
    assert!(got.as_ref().is_err_and(|e| e.is_transient()), "{got:?}");
    assert_eq!(store.get(id).await.unwrap(), before, "{id} changed");
    assert_eq!(
        store.resolutions(id).await.unwrap(),
        journal,
        "{id} journaled"
    );
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

/// What a store written by an earlier schema version held, as the program
/// that wrote it read it back through the `Store` trait (the JSON beside a
/// store's upgrade fixture): the records, the journals, the kept tries, and
/// the store clock's time at the end.
#[derive(Debug)]
pub struct Written {
    /// The store clock when the fixture was written: open the upgraded
    /// store on a clock standing here, so that nothing expired since.
    pub now: Timestamp,
    records: Vec<Record>,
    journal: serde_json::Map<String, serde_json::Value>,
    tries: serde_json::Map<String, serde_json::Value>,
}

impl Written {
    /// Reads the JSON beside a fixture; `name` names it in a failure.
    pub fn parse(name: &str, json: &str) -> Written {
        let value: serde_json::Value =
            serde_json::from_str(json).unwrap_or_else(|e| panic!("{name}: {e}"));
        let field = |f: &str| {
            value
                .get(f)
                .cloned()
                .unwrap_or_else(|| panic!("{name}: no field {f}"))
        };
        let object = |f: &str| match field(f) {
            serde_json::Value::Object(map) => map,
            other => panic!("{name}: {f} is {other}, not an object"),
        };
        let now = field("now_ms")
            .as_u64()
            .unwrap_or_else(|| panic!("{name}: now_ms is not a number"));
        Written {
            now: Timestamp::from_millis(now),
            records: serde_json::from_value(field("records"))
                .unwrap_or_else(|e| panic!("{name}: records: {e}")),
            journal: object("journal"),
            tries: object("tries"),
        }
    }

    /// `store` (opened on a clock at [`Written::now`], upgraded from the
    /// fixture) holds every record field by field as written, with no
    /// region, and nothing else; the journals and kept tries are intact.
    pub async fn check_kept<S: Store>(&self, store: &S) {
        let listing = store.list(&ListQuery::default()).await.unwrap();
        assert_eq!(listing.damaged, [], "every upgraded row reads");
        assert_eq!(listing.next, None);
        assert!(!self.records.is_empty(), "the fixture holds records");
        assert_eq!(
            listing.records, self.records,
            "list: every record as written"
        );
        for record in &self.records {
            assert_eq!(record.region, None, "{}: written before regions", record.id);
            let got = store.get(&record.id).await.unwrap();
            assert_eq!(got.as_ref(), Some(record), "get {}", record.id);
        }
        for (key, expect) in &self.journal {
            let id = self.id_of_journal(key, expect);
            let got = serde_json::to_value(store.resolutions(&id).await.unwrap()).unwrap();
            assert_eq!(&got, expect, "the journal of {id}");
        }
        for (key, expect) in &self.tries {
            let record = self.record(key);
            let got = store.lookup_tries(&record.id, record.token).await.unwrap();
            let got = serde_json::to_value(got).unwrap();
            assert_eq!(&got, expect, "the kept tries of {}", record.id);
        }
    }

    /// The written record whose key is `key`.
    pub fn record(&self, key: &str) -> &Record {
        self.records
            .iter()
            .find(|r| r.id.key.as_str() == key)
            .unwrap_or_else(|| panic!("the fixture has no record {key:?}"))
    }

    /// Every written record.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    fn id_of_journal(&self, key: &str, entries: &serde_json::Value) -> RecordId {
        let id = entries
            .get(0)
            .and_then(|e| e.get("id"))
            .cloned()
            .unwrap_or_else(|| panic!("the journal of {key:?} names no record"));
        serde_json::from_value(id).unwrap_or_else(|e| panic!("the journal of {key:?}: {e}"))
    }

    /// The upgraded records keep working: the completed ones replay, the
    /// ambiguous one resolves (journaled, its tries dropped), and a fresh
    /// claim from `region` acquires with the next token and records it.
    pub async fn check_working<S: Store>(&self, store: &S, region: &str) {
        for done in self.records.iter().filter(|r| r.state == State::Completed) {
            let claim = store.claim(&self.again(done)).await.unwrap();
            let replay = Claim::Replay {
                record: Box::new(done.clone()),
            };
            assert_eq!(claim, replay, "{} replays as written", done.id);
        }
        let unsure = self
            .records
            .iter()
            .find(|r| r.state == State::Ambiguous)
            .unwrap_or_else(|| panic!("the fixture holds no ambiguous record"));
        let resolved = store.resolve(&unsure.id, unsure.token, found()).await;
        let Some(resolved) = resolved.unwrap() else {
            panic!("{} is resolved as completed, not released", unsure.id);
        };
        assert_eq!(
            (resolved.state, resolved.region.as_deref()),
            (State::Completed, None)
        );
        assert_eq!(resolved.result, Some(bytes_result()), "resolved with bytes");
        let reread = store.get(&unsure.id).await.unwrap();
        assert_eq!(
            reread.as_ref(),
            Some(&resolved),
            "bytes read back as resolved"
        );
        let journal = store.resolutions(&unsure.id).await.unwrap();
        assert_eq!(
            journal
                .iter()
                .map(|e| (e.token, e.outcome))
                .collect::<Vec<_>>(),
            [(unsure.token, Resolved::Completed)]
        );
        let tries = store.lookup_tries(&unsure.id, unsure.token).await;
        assert_eq!(tries, Ok(None), "resolving drops the kept tries");

        let last = self.records.iter().map(|r| r.token).max().unwrap();
        let template = &self.records[0];
        let fresh = ClaimRequest {
            id: RecordId {
                scope: template.id.scope.clone(),
                key: idem_core::IdempotencyKey::new("after-the-upgrade").unwrap(),
            },
            region: Some(region.to_owned()),
            ..self.again(template)
        };
        let claim = store.claim(&fresh).await.unwrap();
        let Claim::Acquired { token, .. } = claim else {
            panic!("a fresh key is acquired, got {claim:?}");
        };
        assert!(
            token > last,
            "token {token} after the fixture's last, {last}"
        );
        let record = store.get(&fresh.id).await.unwrap().unwrap();
        assert_eq!(record.region.as_deref(), Some(region), "the region is kept");
        let done = store
            .complete(&fresh.id, token, bytes_result())
            .await
            .unwrap();
        let claim = store.claim(&fresh).await.unwrap();
        let replay = Claim::Replay {
            record: Box::new(done),
        };
        assert_eq!(
            claim, replay,
            "a result with bytes replays after the upgrade"
        );
    }

    /// A claim that is the same request as the one that wrote `record`.
    fn again(&self, record: &Record) -> ClaimRequest {
        let policy = idem_core::Policy::new(
            record.lease_until.as_millis() - record.created_at.as_millis(),
            record.retention_s,
            record.tombstone_s,
            idem_core::LeaseExpiry::Reconcile,
        )
        .unwrap();
        ClaimRequest {
            id: record.id.clone(),
            fingerprint: record.fingerprint,
            legacy_fingerprint: None,
            owner: "upgraded-node".to_owned(),
            region: None,
            policy,
        }
    }
}
