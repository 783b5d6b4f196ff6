//! A write whose answer is lost after DynamoDB applied it, and that the
//! SDK sends again, meets itself: its condition fails on the item it wrote.
//! The store must recognise its own write (by the write id) and answer as
//! the first attempt would have: one acquisition, one effect, one
//! completion, a replay for the retried request. The answer is lost by a
//! loopback relay in front of the emulator, the store's client times out
//! an attempt and retries it the way the SDK's standard retry does; the
//! checks read the table directly.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use common::Emulator;
use idem_core::{
    Claim, ClaimRequest, Fingerprint, IdempotencyKey, LeaseExpiry, ManualClock, Policy, Record,
    RecordId, Scope, State, Store, StoredResult, Timestamp, Token,
};
use idem_dynamodb::DynamoStore;
use idem_testkit::relay::Relay;

/// How long the store's client waits for one attempt's answer: a lost
/// answer costs this much before the SDK sends the request again.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);
/// Attempts per request: the SDK's standard retry.
const ATTEMPTS_MAX: u32 = 3;
/// The bound on one store operation, far beyond its attempts and their
/// back-off: an operation that takes longer hung.
const OPERATION_BOUND: Duration = Duration::from_secs(30);
/// What the relay looks for in a request to lose its answer: the target
/// header of a PutItem, the one request a claim of a fresh key and a
/// completion of an attempt this process acquired each send.
const PUT_ITEM: &[u8] = b"DynamoDB_20120810.PutItem";

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_whose_answer_was_lost_acquires_once_on_dynalite() {
    check(Emulator::Dynalite, Lost::Claim).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_whose_answer_was_lost_acquires_once_on_moto() {
    check(Emulator::Moto, Lost::Claim).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_completion_whose_answer_was_lost_completes_once_on_dynalite() {
    check(Emulator::Dynalite, Lost::Completion).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_completion_whose_answer_was_lost_completes_once_on_moto() {
    check(Emulator::Moto, Lost::Completion).await;
}

/// Which write of the first request loses its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lost {
    /// The claim's conditional put of the fresh key.
    Claim,
    /// The completion's conditional put.
    Completion,
}

/// What one request came to.
#[derive(Debug)]
enum Handled {
    /// It acquired the key with `token`, ran the effect and completed.
    Executed { token: Token, record: Record },
    /// It found the key completed and replayed this record.
    Replayed(Record),
}

/// A request sent twice, the first time with `lost`'s answer lost: the
/// first runs the effect and completes, the second replays, the effect ran
/// once, and the table holds what the answers said.
async fn check(emulator: Emulator, lost: Lost) {
    let bed = Bed::new(emulator).await;
    let req = request("payout-1");

    let first = bed.handle(&req, Some(lost)).await;
    assert_eq!(
        bed.relay.answers_lost(),
        1,
        "{emulator:?}: the {lost:?}'s answer was not lost, nothing was tested"
    );
    let Handled::Executed { token, record } = first else {
        panic!("{emulator:?}, {lost:?} lost: the first request must execute, got {first:?}");
    };
    assert_eq!(
        (record.state, record.token, record.result.as_ref()),
        (State::Completed, token, Some(&result())),
        "{emulator:?}, {lost:?} lost: the completion's answer"
    );
    let stored = bed.direct.get(&req.id).await.unwrap();
    assert_eq!(
        stored.as_ref(),
        Some(&record),
        "{emulator:?}, {lost:?} lost: the table holds what the completion answered"
    );

    let second = bed.handle(&req, None).await;
    let Handled::Replayed(replayed) = second else {
        panic!("{emulator:?}, {lost:?} lost: the retried request must replay, got {second:?}");
    };
    assert_eq!(
        replayed, record,
        "{emulator:?}, {lost:?} lost: the replay is the completed record"
    );
    assert_eq!(
        bed.effects.load(Ordering::SeqCst),
        1,
        "{emulator:?}, {lost:?} lost: the effect ran more than once"
    );
}

/// A fresh table, a store whose client goes through a relay, and a store
/// whose client does not (for the checks).
struct Bed {
    relay: Relay,
    store: DynamoStore,
    direct: DynamoStore,
    /// How many times the effect ran.
    effects: AtomicUsize,
}

impl Bed {
    async fn new(emulator: Emulator) -> Bed {
        let (url, direct_client) = common::fresh_url(emulator, "lost").await;
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
        let relay = Relay::start(address_of(&emulator.endpoint()))
            .await
            .unwrap();
        let store = DynamoStore::with_client(client_via(&relay), &url, clock.clone())
            .await
            .unwrap();
        let direct = DynamoStore::with_client(direct_client, &url, clock)
            .await
            .unwrap();
        Bed {
            relay,
            store,
            direct,
            effects: AtomicUsize::new(0),
        }
    }

    /// `req` as a protected handler runs it, through the relay: claim, on
    /// acquisition run the effect and complete with the token, on a replay
    /// answer the stored record. The answer of `lose`'s write is lost.
    async fn handle(&self, req: &ClaimRequest, lose: Option<Lost>) -> Handled {
        if lose == Some(Lost::Claim) {
            self.relay.lose_answer_to(PUT_ITEM);
        }
        let claim = bounded("claim", self.store.claim(req)).await;
        let token = match claim {
            Ok(Claim::Acquired {
                token,
                took_over: None,
                ..
            }) => token,
            Ok(Claim::Replay { record }) => return Handled::Replayed(*record),
            other => panic!("the claim ({lose:?} lost): want Acquired or Replay, got {other:?}"),
        };
        let held = self.direct.get(&req.id).await.unwrap();
        assert_eq!(
            held.map(|r| (r.token, r.state)),
            Some((token, State::InProgress)),
            "the record holds the token the claim answered"
        );
        self.effects.fetch_add(1, Ordering::SeqCst);
        if lose == Some(Lost::Completion) {
            self.relay.lose_answer_to(PUT_ITEM);
        }
        let done = bounded("complete", self.store.complete(&req.id, token, result())).await;
        let record = done
            .unwrap_or_else(|e| panic!("the completion ({lose:?} lost) with token {token}: {e}"));
        Handled::Executed { token, record }
    }
}

/// `op`'s answer; panics if it takes longer than [`OPERATION_BOUND`].
async fn bounded<T>(what: &str, op: impl Future<Output = T>) -> T {
    tokio::time::timeout(OPERATION_BOUND, op)
        .await
        .unwrap_or_else(|_| panic!("the {what} hung for {OPERATION_BOUND:?}"))
}

/// A client through `relay`: the emulator client of `idem_dynamodb`, with
/// a short attempt timeout and the SDK's standard retry, so that a lost
/// answer is a timed-out attempt sent again.
fn client_via(relay: &Relay) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(format!("http://{}", relay.addr()))
        .credentials_provider(Credentials::new(
            "emulator",
            "emulator",
            None,
            None,
            "idem-emulator",
        ))
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .timeout_config(
            TimeoutConfig::builder()
                .operation_attempt_timeout(ATTEMPT_TIMEOUT)
                .build(),
        )
        .retry_config(RetryConfig::standard().with_max_attempts(ATTEMPTS_MAX))
        .build();
    Client::from_conf(config)
}

/// The socket address of an emulator's `http://HOST:PORT` endpoint.
fn address_of(endpoint: &str) -> SocketAddr {
    let authority = endpoint
        .strip_prefix("http://")
        .unwrap_or(endpoint)
        .trim_end_matches('/');
    authority
        .replace("localhost", "127.0.0.1")
        .parse()
        .unwrap_or_else(|e| panic!("emulator endpoint {endpoint:?}: {e}"))
}

fn request(key: &str) -> ClaimRequest {
    ClaimRequest {
        id: RecordId {
            scope: Scope::new("POST /payouts|tenant-a").unwrap(),
            key: IdempotencyKey::parse(key).unwrap(),
        },
        fingerprint: Fingerprint::from_bytes([7; 32]),
        legacy_fingerprint: None,
        owner: "lost-answer-node".to_owned(),
        region: None,
        policy: Policy::new(30_000, 60, 3_600, LeaseExpiry::Reconcile).unwrap(),
    }
}

fn result() -> StoredResult {
    StoredResult::new(
        201,
        vec![("content-type".to_owned(), "application/json".into())],
        b"{\"payout\":\"po_1\"}".to_vec(),
    )
    .unwrap()
}
