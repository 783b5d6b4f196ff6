//! Through the real `idem serve`: a key is its own text in every store (a
//! key that is another key with quotes around it is another intent, and odd
//! keys never make a row unreadable), and a "not found" from the provider
//! never releases an attempt that may still commit.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use support::{Gateway, PgSchema, Site, Upstream, post, text};

const PAYOUT: &str = r#"{"seller":847,"amount":1200,"currency":"EUR"}"#;

/// Keys as a client sends them (header values) and the key text each names.
/// `"a"` sent as the draft's sf-string is the key whose text is `"a"`,
/// another intent than `a`.
const KEYS: [(&str, &str); 6] = [
    ("a", "a"),
    (r#""\"a\"""#, r#""a""#),
    (r#""\"x""#, r#""x"#),
    (r#"x""#, r#"x""#),
    (r#""a\\b""#, r#"a\b"#),
    ("'%27,;", "'%27,;"),
];

/// Every key is its own intent, replays only its own answer, and lists
/// back byte for byte, on one store.
async fn keys_round_trip(gw: &Gateway, up: &Upstream, store: &str) {
    let url = gw.url("/payouts");
    let mut firsts = Vec::new();
    for (i, (header, _)) in KEYS.iter().enumerate() {
        let body = format!(r#"{{"seller":{i},"amount":1200}}"#);
        let first = post(&url, &[("idempotency-key", header)], &body).await;
        assert_eq!(first.status, 201, "{header}: {first:?}");
        firsts.push((header, body, first));
    }
    assert_eq!(up.effects().len(), KEYS.len(), "one effect per key");
    for (header, body, first) in &firsts {
        let again = post(&url, &[("idempotency-key", header)], body).await;
        again.assert_replay_of(first);
    }
    assert_eq!(up.effects().len(), KEYS.len(), "no effect on a retry");
    let out = support::idem(&["records", "list", "--format", "json", "--store", store]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !text(&out.stderr).contains("cannot be read"),
        "{}",
        text(&out.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut keys: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    keys.sort_unstable();
    let mut want: Vec<&str> = KEYS.iter().map(|(_, k)| *k).collect();
    want.sort_unstable();
    assert_eq!(keys, want, "every key lists as its own text");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_quotes_are_their_own_intents_on_sqlite() {
    let (up, site) = (Upstream::start().await, Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let store = format!("sqlite://{}", site.store().display());
    keys_round_trip(&gw, &up, &store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_quotes_are_their_own_intents_on_postgres() {
    let up = Upstream::start().await;
    let schema = PgSchema::new("quoted_keys");
    let gw = Gateway::start_url(&up.url(), &schema.store_url(), None);
    keys_round_trip(&gw, &up, &schema.store_url()).await;
}

/// A provider that commits a payout `ms` after the request arrives whether
/// or not the caller is still waiting (the request is queued inside it), and
/// answers lookups by the key it was sent.
#[derive(Clone, Default)]
struct Provider {
    paid: Arc<Mutex<Vec<String>>>,
    /// Keys `/lost-once` has seen.
    seen: Arc<Mutex<Vec<String>>>,
    /// Lookups answered.
    lookups: Arc<Mutex<usize>>,
}

impl Provider {
    async fn start(self) -> String {
        let app = axum::Router::new()
            .route("/commit-late", axum::routing::post(commit_late))
            .route("/lost-once", axum::routing::post(lost_once))
            .route("/by-key/{key}", axum::routing::get(by_key))
            .with_state(self);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    fn payouts(&self) -> usize {
        self.paid.lock().unwrap().len()
    }
}

async fn commit_late(State(p): State<Provider>, headers: HeaderMap, _body: Bytes) -> Response {
    let key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let paid = Arc::clone(&p.paid);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        paid.lock().unwrap().push(key);
    });
    tokio::time::sleep(Duration::from_millis(2_600)).await;
    (StatusCode::CREATED, "{\"payout\":\"late\"}").into_response()
}

/// The first request with a key is lost (it answers too late and pays
/// nothing); a later one pays at once.
async fn lost_once(State(p): State<Provider>, headers: HeaderMap, _body: Bytes) -> Response {
    let key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let first = {
        let mut seen = p.seen.lock().unwrap();
        let first = !seen.contains(&key);
        seen.push(key.clone());
        first
    };
    if first {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        return (StatusCode::CREATED, "{\"payout\":\"lost\"}").into_response();
    }
    p.paid.lock().unwrap().push(key);
    (StatusCode::CREATED, "{\"payout\":\"paid\"}").into_response()
}

async fn by_key(State(p): State<Provider>, Path(key): Path<String>) -> Response {
    *p.lookups.lock().unwrap() += 1;
    if p.paid.lock().unwrap().contains(&key) {
        (StatusCode::OK, "{\"payout\":\"found\"}").into_response()
    } else {
        StatusCode::NOT_FOUND.into_response()
    }
}

/// The incident the lease rule closes: the gateway gives up after 1 s, the
/// provider commits at 2.5 s, the reconciler asks every second. Its early
/// "not found" must not release the key (a retry would pay again); the
/// attempt's lease (declared to cover the provider's processing) runs out
/// first, by then the provider has the payout, and the retry replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_not_found_never_releases_an_attempt_that_may_still_commit() {
    let provider = Provider::default();
    let base = provider.clone().start().await;
    let site = Site::new();
    let config = site.config(&format!(
        "response_timeout_ms = 1000\n\
         [reconcile]\ninterval_s = 1\nbackoff_ms = 50\nbackoff_max_ms = 200\n\
         [[route]]\nname = \"payouts\"\nmethods = [\"POST\"]\npath = \"/commit-late\"\n\
         lease_ms = 3500\nforward_key = {{ template = \"{{scope_digest}}:{{key}}\" }}\n\
         [[lookup]]\nroute = \"payouts\"\nurl = \"{base}/by-key/{{forwarded_key}}\"\ntimeout_ms = 500\n"
    ));
    let gw = Gateway::start(&base, &site.store(), Some(&config));
    let url = gw.url("/commit-late");
    let first = post(&url, &[("idempotency-key", "late-1")], PAYOUT).await;
    assert_eq!(first.status, 504, "{first:?}");
    let mut last = first;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        last = post(&url, &[("idempotency-key", "late-1")], PAYOUT).await;
        if last.status != 409 {
            break;
        }
    }
    assert_eq!(
        (last.status, last.header("idempotent-replayed")),
        (200, Some("true")),
        "{last:?}\n{}",
        gw.logs()
    );
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    assert_eq!(provider.payouts(), 1, "paid once\n{}", gw.logs());
}

/// A retry that meets an unknown outcome settles it itself, at once, with
/// the route's lookup, instead of 409 until the next scan (here an hour
/// away): found → a replay of the provider's answer, nothing forwarded;
/// not found before the lease ended → 409, nothing released; not found
/// after → released, and this retry runs, once.
async fn a_retry_settles_an_unknown_outcome_itself(store: &str) {
    let provider = Provider::default();
    let base = provider.clone().start().await;
    let site = Site::new();
    let lookup = format!("{base}/by-key/{{forwarded_key}}");
    let config = site.config(&format!(
        "response_timeout_ms = 1000\n\
         [reconcile]\ninterval_s = 3600\nbackoff_ms = 50\nbackoff_max_ms = 200\n\
         [[route]]\nname = \"payouts\"\nmethods = [\"POST\"]\npath = \"/commit-late\"\n\
         lease_ms = 3500\nforward_key = {{ template = \"{{scope_digest}}:{{key}}\" }}\n\
         [[route]]\nname = \"lost\"\nmethods = [\"POST\"]\npath = \"/lost-once\"\n\
         lease_ms = 3500\nforward_key = {{ template = \"{{scope_digest}}:{{key}}\" }}\n\
         [[lookup]]\nroute = \"payouts\"\nurl = \"{lookup}\"\ntimeout_ms = 500\n\
         [[lookup]]\nroute = \"lost\"\nurl = \"{lookup}\"\ntimeout_ms = 500\n"
    ));
    let gw = Gateway::start_url(&base, store, Some(&config));
    let (late, lost) = (gw.url("/commit-late"), gw.url("/lost-once"));
    let started = std::time::Instant::now();
    let (first_late, first_lost) = tokio::join!(
        post(&late, &[("idempotency-key", "settle-1")], PAYOUT),
        post(&lost, &[("idempotency-key", "settle-2")], PAYOUT),
    );
    assert_eq!(first_late.status, 504, "{first_late:?}");
    assert_eq!(first_lost.status, 504, "{first_lost:?}");
    // Not found while the lease runs proves nothing: 409, nothing released.
    let early = post(&lost, &[("idempotency-key", "settle-2")], PAYOUT).await;
    assert_eq!(early.status, 409, "{early:?}\n{}", gw.logs());
    assert_eq!(
        early.problem().as_deref(),
        Some("urn:idem:problem:outcome-unknown"),
        "{early:?}"
    );
    tokio::time::sleep(Duration::from_millis(3_900).saturating_sub(started.elapsed())).await;
    // Eight retries at once: one lookup, eight replays.
    let lookups_before = *provider.lookups.lock().unwrap();
    let retries = (0..8).map(|_| {
        let late = late.clone();
        tokio::spawn(async move { post(&late, &[("idempotency-key", "settle-1")], PAYOUT).await })
    });
    for retry in retries.collect::<Vec<_>>() {
        let found = retry.await.unwrap();
        assert_eq!(
            (found.status, found.header("idempotent-replayed")),
            (200, Some("true")),
            "found: a replay of the provider's answer\n{found:?}\n{}",
            gw.logs()
        );
    }
    let lookups = *provider.lookups.lock().unwrap() - lookups_before;
    assert_eq!(lookups, 1, "one lookup for eight retries of one key");
    let ran = post(&lost, &[("idempotency-key", "settle-2")], PAYOUT).await;
    assert_eq!(
        (
            ran.status,
            ran.body.as_str(),
            ran.header("idempotent-replayed")
        ),
        (201, "{\"payout\":\"paid\"}", None),
        "not found after the lease: released, and this retry ran\n{ran:?}\n{}",
        gw.logs()
    );
    let again = post(&lost, &[("idempotency-key", "settle-2")], PAYOUT).await;
    again.assert_replay_of(&ran);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let paid = provider.paid.lock().unwrap().clone();
    assert_eq!(paid.len(), 2, "one payment per key: {paid:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_settles_an_unknown_outcome_itself_on_sqlite() {
    let site = Site::new();
    a_retry_settles_an_unknown_outcome_itself(&format!("sqlite://{}", site.store().display()))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_settles_an_unknown_outcome_itself_on_postgres() {
    a_retry_settles_an_unknown_outcome_itself(&PgSchema::new("settle_retry").store_url()).await;
}

/// The lease must outlast the response timeout: a config where it does not
/// is refused at start, naming the file and the field.
#[test]
fn a_lease_shorter_than_the_response_timeout_is_refused() {
    let site = Site::new();
    let config = site.config("response_timeout_ms = 2000\n[[route]]\nlease_ms = 1000\n");
    let out = support::idem(&[
        "serve",
        "--upstream",
        "http://127.0.0.1:9",
        "--store",
        &format!("sqlite://{}", site.store().display()),
        "--config",
        config.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("route[0].lease_ms: lease_ms (1000 ms) must be longer than response_timeout_ms (2000 ms)"),
        "{err}"
    );
    assert!(!site.store().exists(), "nothing was opened");
}

/// A client that sends a protected request and hangs up before the answer
/// does not cancel the attempt: the forward runs to its end, the outcome
/// is recorded, and the client's retry is answered with it as a replay,
/// not with `409` until the lease ends and the record turns ambiguous.
/// The abandoned attempt keeps its in-flight slot until it ends, so hang-ups
/// cannot run more attempts at once than `requests_in_flight_max`.
async fn hang_up_then_retry(store: &str) {
    use tokio::io::AsyncWriteExt;
    let up = Upstream::start().await;
    let site = Site::new();
    let config = site.config("requests_in_flight_max = 1\n");
    let gw = Gateway::start_url(&up.url(), store, Some(&config));
    let body = PAYOUT;
    let mut conn = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let head = format!(
        "POST /slow-before?ms=800 HTTP/1.1\r\nhost: idem\r\nidempotency-key: hang-up-1\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(conn);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let other = post(&gw.url("/payouts"), &[("idempotency-key", "other-1")], body).await;
    assert_eq!(
        other.status, 503,
        "the abandoned attempt holds the one slot: {other:?}"
    );
    // The forward pays at 800 ms; its outcome is recorded right after.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let retry = post(
        &gw.url("/slow-before?ms=800"),
        &[("idempotency-key", "hang-up-1")],
        body,
    )
    .await;
    assert_eq!(retry.status, 201, "{retry:?}\n{}", gw.logs());
    assert_eq!(
        retry.header("idempotent-replayed"),
        Some("true"),
        "{retry:?}"
    );
    assert_eq!(up.effects().len(), 1, "one payment");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_gets_the_outcome_on_its_retry_on_sqlite() {
    let site = Site::new();
    hang_up_then_retry(&format!("sqlite://{}", site.store().display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_gets_the_outcome_on_its_retry_on_postgres() {
    hang_up_then_retry(&PgSchema::new("hang_up").store_url()).await;
}

/// Every answer that stored or replayed a result says until when the
/// record is kept (`Idempotency-Expires`, an HTTP date): completion plus
/// the route's retention, the same date on every replay; a refusal says
/// nothing. On both stores.
async fn answers_say_when_the_record_expires(store: &str) {
    let up = Upstream::start().await;
    let site = Site::new();
    let config = site.config("[[route]]\nname = \"payouts\"\nretention_s = 3600\n");
    let gw = Gateway::start_url(&up.url(), store, Some(&config));
    let url = gw.url("/payouts");
    let before = std::time::SystemTime::now();
    let first = post(&url, &[("idempotency-key", "expires-1")], PAYOUT).await;
    let after = std::time::SystemTime::now();
    assert_eq!(first.status, 201, "{first:?}");
    let stamp = first
        .header("idempotency-expires")
        .unwrap_or_else(|| panic!("{first:?}"));
    let expires = httpdate::parse_http_date(stamp).unwrap();
    let retention = Duration::from_secs(3600);
    // An HTTP date has whole seconds; the store's clock may be a little off.
    let slack = Duration::from_secs(5);
    assert!(
        expires + slack >= before + retention && expires <= after + retention + slack,
        "{stamp}"
    );
    let again = post(&url, &[("idempotency-key", "expires-1")], PAYOUT).await;
    again.assert_replay_of(&first);
    assert_eq!(
        again.header("idempotency-expires"),
        Some(stamp),
        "{again:?}"
    );
    let other = post(&url, &[("idempotency-key", "expires-1")], r#"{"amount":1}"#).await;
    assert_eq!(other.status, 422, "{other:?}");
    assert!(other.header("idempotency-expires").is_none(), "{other:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_say_when_the_record_expires_on_sqlite() {
    let site = Site::new();
    answers_say_when_the_record_expires(&format!("sqlite://{}", site.store().display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_say_when_the_record_expires_on_postgres() {
    answers_say_when_the_record_expires(&PgSchema::new("expires").store_url()).await;
}
