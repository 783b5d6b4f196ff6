//! The origin region a record keeps: written by the claim that acquires it,
//! carried unchanged through every later transition and read back by `get`
//! and `list`, replaced only by a new acquisition, and refused before
//! anything is written when it is not a region name.

use std::sync::Arc;

use idem_core::{
    Claim, ClaimRequest, Clock, LeaseExpiry, LimitError, ListQuery, ManualClock, Outcome,
    REGION_BYTES_MAX, Resolution, State, Store, StoreError,
};

use super::support::{
    LEASE_MS, OWNER, acquire, after, fp, key, request, request_with, result, stored,
};

/// The region most claims here come from.
const REGION: &str = "eu-west.1_b";

/// A claim of `id` from `region`.
fn from(id: &idem_core::RecordId, n: u8, region: Option<&str>) -> ClaimRequest {
    ClaimRequest {
        region: region.map(str::to_owned),
        ..request(id, fp(n))
    }
}

/// A region on a claim is on the acquired record and stays there through
/// complete, mark_ambiguous and resolve (completed, and released then
/// acquired again); `get`, `list` and a replay read it back; a claim
/// without a region keeps none.
pub async fn region_is_kept_through_every_transition<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    let (done, unsure, plain) = (key("region-done"), key("region-unsure"), key("region-none"));
    let token = acquire(&*store, &clock, &from(&done, 1, Some(REGION))).await;
    let record = stored(&*store, &done).await;
    assert_eq!(record.region.as_deref(), Some(REGION), "claim writes it");
    let completed = store.complete(&done, token, result(1)).await.unwrap();
    assert_eq!(
        completed.region.as_deref(),
        Some(REGION),
        "complete keeps it"
    );
    assert_eq!(stored(&*store, &done).await, completed);
    let replay = store.claim(&from(&done, 1, Some("us-east"))).await.unwrap();
    let Claim::Replay { record } = replay else {
        panic!("a completed record replays, got {replay:?}");
    };
    assert_eq!(
        record.region.as_deref(),
        Some(REGION),
        "a replay names the origin"
    );

    let token = acquire(&*store, &clock, &from(&unsure, 2, Some(REGION))).await;
    let marked = store.mark_ambiguous(&unsure, token).await.unwrap();
    assert_eq!(
        marked.region.as_deref(),
        Some(REGION),
        "mark_ambiguous keeps it"
    );
    acquire(&*store, &clock, &from(&plain, 3, None)).await;

    let listing = store.list(&ListQuery::default()).await.unwrap();
    let regions: Vec<(&str, Option<&str>)> = listing
        .records
        .iter()
        .map(|r| (r.id.key.as_str(), r.region.as_deref()))
        .collect();
    let expect = [
        ("region-done", Some(REGION)),
        ("region-none", None),
        ("region-unsure", Some(REGION)),
    ];
    assert_eq!(regions, expect, "list reads every region back");

    let resolution = Resolution::new(Outcome::Completed { result: result(2) }, "op", "paid");
    let resolved = store.resolve(&unsure, token, resolution.unwrap()).await;
    let resolved = resolved.unwrap().unwrap();
    assert_eq!(resolved.region.as_deref(), Some(REGION), "resolve keeps it");
    assert_eq!(stored(&*store, &unsure).await, resolved);

    let other = key("region-released");
    let token = acquire(&*store, &clock, &from(&other, 4, Some(REGION))).await;
    store.mark_ambiguous(&other, token).await.unwrap();
    clock.set(after(clock.now(), LEASE_MS));
    let released = Resolution::new(Outcome::NotExecuted, "op", "never sent").unwrap();
    assert_eq!(store.resolve(&other, token, released).await, Ok(None));
    acquire(&*store, &clock, &from(&other, 4, Some("ap-south"))).await;
    let again = stored(&*store, &other).await;
    assert_eq!(
        again.region.as_deref(),
        Some("ap-south"),
        "a new attempt, its region"
    );
    assert_eq!(stored(&*store, &plain).await.region, None);
}

/// A takeover records the taker's region (and owner), not the region of
/// the attempt it replaced; an attempt with no region leaves none behind.
pub async fn takeover_records_the_new_region<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    for (n, taker) in [(1, Some("us-east")), (2, None)] {
        let id = key(&format!("region-taken-{n}"));
        let first = ClaimRequest {
            region: Some(REGION.to_owned()),
            ..request_with(&id, fp(1), LeaseExpiry::Takeover, OWNER)
        };
        acquire(&*store, &clock, &first).await;
        clock.advance_millis(LEASE_MS);
        let second = ClaimRequest {
            region: taker.map(str::to_owned),
            ..request_with(&id, fp(1), LeaseExpiry::Takeover, "node-2")
        };
        let claim = store.claim(&second).await.unwrap();
        assert!(
            matches!(
                claim,
                Claim::Acquired {
                    took_over: Some(_),
                    ..
                }
            ),
            "the expired lease is taken over, got {claim:?}"
        );
        let taken = stored(&*store, &id).await;
        assert_eq!(
            (taken.owner.as_str(), taken.region.as_deref(), taken.state),
            ("node-2", taker, State::InProgress),
            "the record names the taker"
        );
    }
}

/// A region that is not 1 to [`REGION_BYTES_MAX`] ASCII letters, digits,
/// `-`, `_` or `.` is refused before anything is written; the longest legal
/// one is kept whole.
pub async fn bad_region_is_refused<S: Store + 'static>(store: Arc<S>, clock: ManualClock) {
    let too_long = "r".repeat(REGION_BYTES_MAX + 1);
    let refused = ["", "eu west", "eu/west", "région", "eu\nwest", "eu|west"];
    for (n, region) in refused.iter().enumerate() {
        let id = key(&format!("bad-region-{n}"));
        let expect = StoreError::Limit(LimitError::BadRegion {
            region: (*region).to_owned(),
        });
        let got = store.claim(&from(&id, 1, Some(region))).await;
        assert_eq!(got, Err(expect), "region {region:?}");
        assert_eq!(
            store.get(&id).await.unwrap(),
            None,
            "nothing written for {region:?}"
        );
    }
    let id = key("bad-region-long");
    let expect = StoreError::Limit(LimitError::TextTooLong {
        field: "region",
        bytes: too_long.len(),
        max: REGION_BYTES_MAX,
    });
    assert_eq!(
        store.claim(&from(&id, 1, Some(&too_long))).await,
        Err(expect)
    );
    assert_eq!(store.get(&id).await.unwrap(), None, "nothing written");

    let id = key("region-max");
    let longest = "Az09-_.".repeat(REGION_BYTES_MAX)[..REGION_BYTES_MAX].to_owned();
    acquire(&*store, &clock, &from(&id, 1, Some(&longest))).await;
    assert_eq!(stored(&*store, &id).await.region, Some(longest));
}
