//! Every retry gets an answer, through a bad night: `idem serve` is
//! SIGKILLed every ~1.5 s while clients send intents and retry each one
//! (with `Prefer: wait`) until it has a definite answer. The route has a
//! lookup, so an attempt the kill left unknown is settled by the next
//! retry itself. On SQLite and on PostgreSQL: no intent runs twice, none
//! is lost (a success always has its one effect), no replay answers
//! another intent's effect, and every intent has a definite answer within
//! 60 s of the last kill, without an operator. Run with `--nocapture` to
//! see the figures docs/http.md quotes.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use idem_testkit::services::Service;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use http_body_util::BodyExt;
use support::{Gateway, PgSchema, Site, Upstream, client};

/// Intents sent in all, and clients sending them at once.
const INTENTS: usize = 120;
const CLIENTS: usize = 12;
/// Kills, and the time between two.
const KILLS: usize = 10;
const KILL_EVERY: Duration = Duration::from_millis(1_500);
/// Every intent has its definite answer by then after the last kill.
const SETTLED_WITHIN: Duration = Duration::from_secs(60);

/// One intent's end: its definite answer, and how many requests it took.
struct Ended {
    key: String,
    status: u16,
    body: String,
    tries: usize,
    settled_at: Instant,
}

/// POSTs one payout; `None` when the gateway could not be reached or
/// the exchange broke (it was killed).
async fn try_post(url: &str, key: &str) -> Option<(u16, String)> {
    let req = axum::http::Request::post(url)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .header("prefer", "wait=3")
        .body(Body::from(format!(r#"{{"to":"{key}","amount":100}}"#)))
        .unwrap();
    let exchange = async {
        let response = client().request(req).await.ok()?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.ok()?.to_bytes();
        Some((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .ok()
        .flatten()
}

/// Sends the intent and retries it until a definite answer (a 2xx, or a
/// final 4xx other than 409), or `give_up`.
async fn until_definite(url: String, key: String, give_up: Instant) -> Ended {
    let mut tries = 0;
    loop {
        tries += 1;
        if let Some((status, body)) = try_post(&url, &key).await {
            let definite = (200..300).contains(&status)
                || ((400..500).contains(&status) && status != 409 && status != 408);
            if definite {
                return Ended {
                    key,
                    status,
                    body,
                    tries,
                    settled_at: Instant::now(),
                };
            }
        }
        if Instant::now() >= give_up {
            return Ended {
                key,
                status: 0,
                body: String::new(),
                tries,
                settled_at: Instant::now(),
            };
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn chaos(store: &str, tag: &str) {
    let up = Upstream::start().await;
    let site = Site::new();
    let lookup = format!("{}/payouts/by-key/{{forwarded_key}}", up.url());
    let config = site.config(&format!(
        "response_timeout_ms = 2000\n\
         [reconcile]\ninterval_s = 5\nbackoff_ms = 100\nbackoff_max_ms = 1000\nmax_tries = 100\n\
         [[route]]\nname = \"payouts\"\nmethods = [\"POST\"]\npath = \"/{{kind}}\"\n\
         lease_ms = 3000\nforward_key = {{ template = \"{{scope_digest}}:{{key}}\" }}\n\
         [[lookup]]\nroute = \"payouts\"\nurl = \"{lookup}\"\ntimeout_ms = 1000\n"
    ));
    let port = idem_testkit::free_port().unwrap();
    let listen = format!("127.0.0.1:{port}");
    let start = {
        let (up, store, config, listen) =
            (up.url(), store.to_owned(), config.clone(), listen.clone());
        move || Gateway::start_listen(&up, &store, &config, &listen)
    };
    // Half the intents pay before their answer (a kill leaves them paid,
    // found by the lookup), half after it (a kill leaves them unpaid).
    let base = format!("http://{listen}");

    // The killer: SIGKILL, start again on the same port, KILLS times.
    let killer = {
        let start = start.clone();
        tokio::task::spawn_blocking(move || {
            let mut gw = start();
            for _ in 0..KILLS {
                std::thread::sleep(KILL_EVERY);
                gw.kill();
                gw = start();
            }
            (gw, Instant::now())
        })
    };
    let chaos_started = Instant::now();
    // The clients: each takes the next intent until none is left.
    let next = Arc::new(AtomicUsize::new(0));
    let give_up = chaos_started + KILL_EVERY * (KILLS as u32 + 2) + SETTLED_WITHIN;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (next, base) = (next.clone(), base.clone());
            let tag = tag.to_owned();
            tokio::spawn(async move {
                let mut ended = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= INTENTS {
                        return ended;
                    }
                    // Spread the intents over the kills.
                    tokio::time::sleep(Duration::from_millis(1_200)).await;
                    let key = format!("{tag}-{i}");
                    let kind = if i % 2 == 0 { "slow" } else { "slow-before" };
                    let url = format!("{base}/{kind}?ms=300");
                    ended.push(until_definite(url, key, give_up).await);
                }
            })
        })
        .collect();
    let mut ended = Vec::new();
    for client in clients {
        ended.extend(client.await.unwrap());
    }
    let (gw, last_kill) = killer.await.unwrap();

    let effects = up.effects();
    let effects_of = |key: &str| -> Vec<usize> {
        effects
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                e.key
                    .as_deref()
                    .is_some_and(|k| k.split_once(':').map(|(_, k)| k) == Some(key))
            })
            .map(|(i, _)| i + 1)
            .collect()
    };
    let (mut duplicates, mut lost, mut wrong, mut undecided) = (0, 0, 0, 0);
    let mut late = Duration::ZERO;
    for e in &ended {
        let paid = effects_of(&e.key);
        if paid.len() > 1 {
            duplicates += 1;
        }
        if e.status == 0 {
            undecided += 1;
            continue;
        }
        late = late.max(e.settled_at.saturating_duration_since(last_kill));
        if (200..300).contains(&e.status) {
            let answered: Option<usize> = serde_json::from_str::<serde_json::Value>(&e.body)
                .ok()
                .and_then(|v| v.get("payout")?.as_u64())
                .and_then(|n| usize::try_from(n).ok());
            match (paid.first(), answered) {
                (None, _) => lost += 1,
                (Some(p), Some(a)) if *p == a => {}
                _ => wrong += 1,
            }
        }
    }
    let tries: usize = ended.iter().map(|e| e.tries).sum();
    let most = ended.iter().map(|e| e.tries).max().unwrap_or(0);
    eprintln!(
        "chaos on {tag}: {} intents, {KILLS} SIGKILLs {KILL_EVERY:?} apart; {} effects; \
         duplicates {duplicates}, lost {lost}, wrong replays {wrong}, without a definite \
         answer {undecided}; requests {tries} (at most {most} for one intent); the last \
         intent settled {late:?} after the last kill",
        ended.len(),
        effects.len(),
    );
    assert_eq!(ended.len(), INTENTS);
    assert_eq!(duplicates, 0, "no intent ran twice");
    assert_eq!(lost, 0, "every success has its effect");
    assert_eq!(wrong, 0, "every answer is its own intent's");
    assert_eq!(
        undecided,
        0,
        "every intent got a definite answer\n{}",
        gw.logs()
    );
    assert!(
        late <= SETTLED_WITHIN,
        "settled {late:?} after the last kill"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_intent_gets_a_definite_answer_through_sigkills_on_sqlite() {
    let site = Site::new();
    chaos(&format!("sqlite://{}", site.store().display()), "sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_intent_gets_a_definite_answer_through_sigkills_on_postgres() {
    let schema = PgSchema::new("chaos");
    chaos(&schema.store_url(), "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_intent_gets_a_definite_answer_through_sigkills_on_dynalite() {
    let store = support::dynamo::fresh_table(Service::Dynalite, "chaos");
    chaos(&store, "dynalite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_intent_gets_a_definite_answer_through_sigkills_on_moto() {
    let store = support::dynamo::fresh_table(Service::Moto, "chaos");
    chaos(&store, "moto").await;
}
