//! Group commit on the real server: concurrent claims of new keys and
//! concurrent completions share statements, each caller still hears its
//! own answer, an answer is visible to every other node the moment it is
//! given, and one row the server refuses fails only its own caller.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod support;

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use idem_core::{Claim, ClaimRequest, Record, Store, StoreError, StoredResult, Token};
use idem_postgres::{PgOptions, PgStore};
use support::{SchemaGuard, admin, request};
use tokio::sync::Barrier;

/// Claims (or completions) released together.
const RACERS: usize = 48;

async fn store(guard: &SchemaGuard, batch_lanes: usize) -> Arc<PgStore> {
    let options = PgOptions {
        pool_size: 8,
        batch_lanes,
        ..guard.options(None)
    };
    Arc::new(PgStore::connect(&support::url(), options).await.unwrap())
}

/// Runs `op` once per input, each on its own task, all released at once;
/// the answers in input order.
async fn race<T, O, F, Fut>(inputs: Vec<T>, op: F) -> Vec<O>
where
    T: Send + 'static,
    O: Send + 'static,
    F: Fn(T) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = O> + Send,
{
    let barrier = Arc::new(Barrier::new(inputs.len()));
    let tasks: Vec<_> = inputs
        .into_iter()
        .map(|input| {
            let (barrier, op) = (Arc::clone(&barrier), op.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                op(input).await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

/// What a raced operation returns.
type Answer<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>>;

/// A claim on `store`, for [`race`].
fn claim_on(store: &Arc<PgStore>) -> impl Fn(ClaimRequest) -> Answer<Claim> + Clone + use<> {
    let store = Arc::clone(store);
    move |req| {
        let store = Arc::clone(&store);
        Box::pin(async move { store.claim(&req).await })
    }
}

/// A completion with a body of `n + 1` bytes `n`, for [`race`].
fn complete_on(
    store: &Arc<PgStore>,
) -> impl Fn((ClaimRequest, Token, u8)) -> Answer<Record> + Clone + use<> {
    let store = Arc::clone(store);
    move |(req, token, n)| {
        let store = Arc::clone(&store);
        Box::pin(async move {
            let result = StoredResult::new(200, vec![], vec![n; 1 + usize::from(n)]).unwrap();
            store.complete(&req.id, token, result).await
        })
    }
}

fn requests(prefix: &str) -> Vec<ClaimRequest> {
    (0..RACERS)
        .map(|i| request(&format!("{prefix}-{i:02}"), 1, 60_000))
        .collect()
}

/// Each caller of a shared statement gets the token stored on its own
/// record, each completion stores its own result, and the statements
/// really carried more than one write each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_caller_of_a_batch_hears_its_own_answer() {
    let guard = SchemaGuard::new();
    let store = store(&guard, 1).await;
    let reqs = requests("own");
    let claims = race(reqs.clone(), claim_on(&store)).await;
    let mut tokens = Vec::with_capacity(RACERS);
    for (req, claim) in reqs.iter().zip(claims) {
        let Ok(Claim::Acquired { token, .. }) = claim else {
            panic!("{} should acquire, got {claim:?}", req.id);
        };
        let stored = store.get(&req.id).await.unwrap().unwrap();
        assert_eq!(
            stored.token, token,
            "{}: the answer is its own row's",
            req.id
        );
        tokens.push(token);
    }
    let distinct: HashSet<Token> = tokens.iter().copied().collect();
    assert_eq!(distinct.len(), RACERS, "distinct tokens: {tokens:?}");

    let completions: Vec<(ClaimRequest, Token, u8)> = reqs
        .iter()
        .cloned()
        .zip(tokens)
        .enumerate()
        .map(|(i, (req, token))| (req, token, i as u8))
        .collect();
    let done = race(completions.clone(), complete_on(&store)).await;
    for ((req, _, n), record) in completions.iter().zip(done) {
        let record = record.unwrap_or_else(|e| panic!("{}: {e}", req.id));
        assert_eq!(record.id, req.id);
        let body = record.result.as_ref().unwrap().body().to_vec();
        assert_eq!(
            body,
            vec![*n; 1 + usize::from(*n)],
            "{}: its own result",
            req.id
        );
        let stored = store.get(&req.id).await.unwrap().unwrap();
        assert_eq!(stored, record, "{}: as stored", req.id);
    }
    let stats = store.batch_stats();
    assert_eq!(stats.claims, RACERS as u64, "{stats:?}");
    assert_eq!(stats.completions, RACERS as u64, "{stats:?}");
    assert!(
        stats.claim_batches < stats.claims && stats.completion_batches < stats.completions,
        "the writes shared statements: {stats:?}"
    );
}

/// A claim answered `Acquired` by one node's batch is already committed:
/// another node claiming the same key right after hears `InFlight`, and a
/// completed key is replayed there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batched_answer_is_visible_to_every_node() {
    let guard = SchemaGuard::new();
    let (a, b) = (store(&guard, 1).await, store(&guard, 1).await);
    let reqs = requests("seen");
    let answers = race(reqs.clone(), move |req: ClaimRequest| {
        let (a, b) = (Arc::clone(&a), Arc::clone(&b));
        async move {
            let mine = a.claim(&req).await;
            let theirs = b.claim(&req).await;
            (mine, theirs)
        }
    })
    .await;
    for (req, (mine, theirs)) in reqs.iter().zip(answers) {
        assert!(
            matches!(mine, Ok(Claim::Acquired { .. })),
            "{}: {mine:?}",
            req.id
        );
        assert!(
            matches!(theirs, Ok(Claim::InFlight { .. })),
            "{}: the other node sees the claim: {theirs:?}",
            req.id
        );
    }
}

/// A row the server refuses (here a trigger refuses two keys, as a
/// constraint or a bad value would: one's insert, the other's completion)
/// fails its own caller only; the neighbours that shared its statement are
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_refused_row_fails_only_its_own_caller() {
    let guard = SchemaGuard::new();
    let store = store(&guard, 1).await;
    let s = guard.name();
    admin()
        .await
        .batch_execute(&format!(
            "CREATE FUNCTION {s}.refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN IF (TG_OP = 'INSERT' AND NEW.key LIKE 'poison-claim%') \
             OR (TG_OP = 'UPDATE' AND NEW.key LIKE 'poison-done%') THEN \
             RAISE EXCEPTION 'refused by the test' USING ERRCODE = '22023'; END IF; \
             RETURN NEW; END $$; \
             CREATE TRIGGER refuse_poison BEFORE INSERT OR UPDATE ON {s}.records \
             FOR EACH ROW EXECUTE FUNCTION {s}.refuse_poison();"
        ))
        .await
        .unwrap();
    let poisoned = |req: &ClaimRequest, what: &str| req.id.key.as_str().starts_with(what);
    let mut reqs = requests("good");
    reqs[0] = request("poison-done", 1, 60_000);
    reqs[RACERS / 2] = request("poison-claim", 1, 60_000);
    let claims = race(reqs.clone(), claim_on(&store)).await;
    let mut acquired = Vec::new();
    for (req, claim) in reqs.iter().zip(claims) {
        match claim {
            Err(StoreError::Unavailable { .. }) if poisoned(req, "poison-claim") => {
                assert_eq!(store.get(&req.id).await.unwrap(), None);
            }
            Ok(Claim::Acquired { token, .. }) if !poisoned(req, "poison-claim") => {
                acquired.push((req.clone(), token, 1));
            }
            other => panic!("{}: {other:?}", req.id),
        }
    }
    let done = race(acquired.clone(), complete_on(&store)).await;
    for ((req, _, _), record) in acquired.iter().zip(done) {
        let stored = store.get(&req.id).await.unwrap().unwrap();
        if poisoned(req, "poison-done") {
            assert!(record.is_err(), "{record:?}");
            assert!(stored.result.is_none(), "not completed: {stored:?}");
        } else {
            assert_eq!(record.unwrap(), stored, "{}", req.id);
        }
    }
    let stats = store.batch_stats();
    assert!(
        stats.claim_batches < stats.claims && stats.completion_batches < stats.completions,
        "the writes shared statements: {stats:?}"
    );
}
