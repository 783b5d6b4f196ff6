//! A real failover of a replicated PostgreSQL under load: `idem serve` on
//! a multi-host URL (`target_session_attrs=read-write`) in front of an
//! upstream that counts every effect and never dedups, clients that retry
//! until they have an answer, the standby's WAL held back by a frozen
//! relay, the primary stopped hard, the standby promoted, and every intent
//! delivered once more as a queue's redelivery would.
//!
//! With a synchronous standby (`remote_apply`) nothing may run twice and
//! nothing may be lost. With asynchronous replication the records in the
//! unreplicated tail are gone, but the gateway notices it reached another
//! server (a new timeline) and opens the suspect window: each redelivery
//! of a key the store forgot is looked up at the provider by its forwarded
//! key and answered with the provider's answer, so nothing runs twice.
//! Without a lookup the redeliveries execute again, and the test counts
//! those duplicates (docs/regions.md has the figures).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use http_body_util::BodyExt;
use idem_testkit::pg_cluster::{PgCluster, Replication, Role};
use idem_testkit::relay::Relay;
use support::{Gateway, Reply, Site, Upstream};

const TRANSFER: &str = r#"{"account":847,"amount":1200,"currency":"EUR"}"#;
const SCHEMA: &str = "idem_failover";
/// Clients sending intents at once, each one intent after another.
const CLIENTS: usize = 8;
/// The longest a client keeps retrying one intent.
const INTENT_DEADLINE: Duration = Duration::from_secs(60);
/// The longest one HTTP exchange may take before it counts as a
/// connection error (and is retried).
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// The gateway's configuration in both scenarios, in one place: a lease a
/// little longer than the upstream's response timeout, a lookup at the
/// upstream and a reconciler that scans every second, so the records a
/// failover leaves in progress are resolved within seconds.
fn gateway_config(site: &Site, up: &Upstream, (replication, lookup): Scenario) -> PathBuf {
    let lookup = if lookup {
        format!(
            "[[lookup]]\nroute = \"transfers\"\nurl = \"{}/transfers/by-key/{{forwarded_key}}\"\n\
             timeout_ms = 500\nconnect_timeout_ms = 200\n",
            up.url()
        )
    } else {
        String::new()
    };
    // The synchronous scenario's route asks for it: `idem serve` checks the
    // store at start and every new connection after the failover.
    let mode = match replication {
        Replication::Synchronous => "regions = { mode = \"synchronous\" }\n",
        _ => "",
    };
    site.config(&format!(
        "response_timeout_ms = 1500\n\
         [reconcile]\ninterval_s = 1\nbatch = 1000\nbackoff_ms = 50\nbackoff_max_ms = 200\n\
         max_tries = 100\nconcurrency = 8\nrate_per_s = 1000\n\
         [[route]]\nname = \"transfers\"\nmethods = [\"POST\"]\npath = \"/transfers\"\n\
         {mode}lease_ms = 2000\nforward_key = {{ template = \"{{scope_digest}}:{{key}}\" }}\n\
         {lookup}"
    ))
}

/// The store URL: both nodes, the one that accepts writes, short bounds.
fn store_url(cluster: &PgCluster) -> String {
    format!(
        "{}&schema={SCHEMA}&operation_timeout_ms=1000&connect_timeout_ms=1000",
        cluster.multi_host_url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_replication_fails_over_without_duplicates_or_losses() {
    let report = failover((Replication::Synchronous, WITH_LOOKUP)).await;
    report.print("synchronous (remote_apply)");
    report.assert_gateway_held();
    assert_eq!(report.duplicates, Vec::<String>::new(), "duplicates");
    assert_eq!(report.lost, Vec::<String>::new(), "lost intents");
    assert_eq!(report.executed_again, 0, "redeliveries that executed");
    let reply = report.unreplicated_primary.as_ref().unwrap();
    assert_eq!(
        (reply.status, reply.problem().as_deref()),
        (503, Some("urn:idem:problem:store-unavailable")),
        "a synchronous route with no synchronous standby: {reply:?}"
    );
}

/// The suspect window with a lookup: twice, since the tail differs from
/// run to run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_replication_fails_over_without_duplicates_when_the_provider_answers() {
    for run in 1..=2 {
        let report = failover((Replication::Asynchronous, WITH_LOOKUP)).await;
        report.print(&format!("asynchronous, with a lookup, run {run}"));
        report.assert_gateway_held();
        assert!(report.window_opened, "the promotion opened the window");
        assert!(
            report.tail_records > 0,
            "there was a tail to lose: {report:?}"
        );
        assert_eq!(
            report.duplicates,
            Vec::<String>::new(),
            "run {run}: duplicates"
        );
        assert_eq!(report.lost, Vec::<String>::new(), "run {run}: lost intents");
        assert_eq!(
            report.executed_again, 0,
            "run {run}: redeliveries that executed"
        );
        assert!(report.left_for_operator.is_empty(), "run {run}: {report:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_replication_without_a_lookup_counts_the_tail() {
    let report = failover((Replication::Asynchronous, !WITH_LOOKUP)).await;
    report.print("asynchronous, no lookup");
    report.assert_gateway_held();
    assert!(report.window_opened, "the promotion opened the window");
    assert_eq!(report.lost, Vec::<String>::new(), "lost intents");
    // Every second effect is a record lost with the tail, met again by
    // its redelivery; none comes from a retry the gateway let through.
    assert_eq!(report.duplicates.len(), report.executed_again, "{report:?}");
}

/// A scenario: how the store replicates, and whether the route has a
/// lookup at the upstream.
type Scenario = (Replication, bool);
const WITH_LOOKUP: bool = true;

/// What one scenario saw.
#[derive(Debug, Default)]
struct Report {
    intents: usize,
    /// Keys with more than one effect.
    duplicates: Vec<String>,
    /// Keys acknowledged without an effect, or never answered.
    lost: Vec<String>,
    /// Redeliveries the gateway executed instead of replaying.
    executed_again: usize,
    /// 503 answers the clients met and retried.
    unavailable_seen: usize,
    /// Records on the primary that the standby did not have when the
    /// primary was stopped (at least; commits continued until the stop).
    tail_records: usize,
    /// WAL the standby had not replayed, in bytes.
    tail_wal_bytes: i64,
    /// The answer to a fresh key while there was no primary.
    no_primary: Option<Reply>,
    /// Effects performed while there was no primary.
    effects_without_primary: usize,
    /// A fresh key executed through the same gateway after the promotion.
    reconnected: bool,
    /// Synchronous only: the answer to a fresh key while the promoted node
    /// had no synchronous standby.
    unreplicated_primary: Option<Reply>,
    /// The gateway said it opened the suspect window.
    window_opened: bool,
    /// Without a lookup: keys whose outcome stays unknown until an
    /// operator resolves them (409 `outcome-unknown`).
    left_for_operator: BTreeSet<String>,
}

impl Report {
    fn print(&self, mode: &str) {
        println!(
            "failover, {mode}: {} intents, {} duplicates, {} lost, {} redeliveries executed again, \
             {} records ({} bytes of WAL) in the unreplicated tail, {} 503s retried, {} left for \
             an operator",
            self.intents,
            self.duplicates.len(),
            self.lost.len(),
            self.executed_again,
            self.tail_records,
            self.tail_wal_bytes,
            self.unavailable_seen,
            self.left_for_operator.len(),
        );
    }

    #[track_caller]
    fn assert_gateway_held(&self) {
        let reply = self.no_primary.as_ref().expect("a fresh key was tried");
        assert_eq!(reply.status, 503, "{reply:?}");
        assert_eq!(
            reply.problem().as_deref(),
            Some("urn:idem:problem:store-unavailable"),
            "{reply:?}"
        );
        assert_eq!(self.effects_without_primary, 0, "forwarded with no primary");
        assert!(self.reconnected, "the gateway serves the new primary");
        assert!(self.unavailable_seen > 0, "clients met the failover");
    }
}

async fn failover(scenario: Scenario) -> Report {
    let (replication, lookup) = scenario;
    let mut cluster = PgCluster::start_primary(replication).unwrap();
    let relay = Relay::start(cluster.primary_addr()).await.unwrap();
    tokio::task::block_in_place(|| cluster.add_standby(relay.addr())).unwrap();
    let (up, site) = (Upstream::start().await, Site::new());
    let config = gateway_config(&site, &up, scenario);
    let gw = Gateway::start_url(&up.url(), &store_url(&cluster), Some(&config));
    let url = gw.url("/transfers");
    let mut report = Report::default();

    let load = Load::start(&url, scenario);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    relay.freeze();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    (report.tail_records, report.tail_wal_bytes) = tail(&cluster);
    tokio::task::block_in_place(|| cluster.stop_primary_immediate()).unwrap();

    // No primary: a fresh key is refused and nothing reaches the upstream.
    // An attempt acquired just before the stop may still be on its way.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let effects_before = up.effects().len();
    let probe = send(&support::client(), &url, "no-primary-probe").await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    report.effects_without_primary = up.effects().len() - effects_before;
    report.no_primary = probe.ok();

    tokio::task::block_in_place(|| cluster.promote_standby()).unwrap();
    if replication == Replication::Synchronous {
        // The promoted node has no synchronous standby yet: a synchronous
        // route refuses its connections (503) rather than commit unreplicated.
        report.unreplicated_primary = Some(
            send(&support::client(), &url, "unreplicated-primary-probe")
                .await
                .unwrap(),
        );
        tokio::task::block_in_place(|| {
            cluster.adopt_promoted_standby()?;
            cluster.add_standby(cluster.primary_addr())
        })
        .unwrap();
    }
    report.reconnected = settle(&support::client(), (&url, lookup), "after-promotion-probe")
        .await
        .is_some_and(|r| r.status == 200);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (answers, unavailable_seen) = load.stop().await;
    report.unavailable_seen = unavailable_seen;
    report.intents = answers.len();

    redeliver((&url, lookup), &answers, &mut report).await;
    count(&up, &answers, &mut report);
    report.window_opened = gw.logs().contains("suspect window open");
    if !report.lost.is_empty() || !report.reconnected {
        eprintln!("gateway log:\n{}", gw.logs());
        eprintln!("new primary log:\n{}", cluster.log(Role::Standby));
    }
    drop(gw);
    report
}

/// Each intent once more, as an at-least-once queue would redeliver it:
/// a replay of the first answer, or (a record lost with the tail) a new
/// execution.
async fn redeliver(
    url: (&str, bool),
    answers: &HashMap<String, Option<Reply>>,
    report: &mut Report,
) {
    let client = support::client();
    for (k, first) in answers {
        let Some(first) = first else { continue };
        let again = settle(&client, url, k)
            .await
            .unwrap_or_else(|| panic!("{k}: no answer to the redelivery"));
        if outcome_unknown(&again) {
            report.left_for_operator.insert(k.clone());
        } else if again.header("idempotent-replayed") == Some("true") {
            again.assert_replay_of(first);
        } else {
            assert_eq!(again.status, 200, "{k}: {again:?}");
            report.executed_again += 1;
        }
    }
}

/// Effects per intent: duplicates and lost intents.
fn count(up: &Upstream, answers: &HashMap<String, Option<Reply>>, report: &mut Report) {
    let mut effects: HashMap<String, usize> = HashMap::new();
    for effect in up.effects() {
        // The upstream receives `{scope_digest}:{key}`.
        let forwarded = effect.key.unwrap_or_default();
        let k = forwarded.rsplit(':').next().unwrap_or("").to_owned();
        *effects.entry(k).or_default() += 1;
    }
    let mut keys: Vec<&String> = answers.keys().collect();
    keys.sort();
    for k in keys {
        let n = effects.get(k.as_str()).copied().unwrap_or(0);
        match &answers[k] {
            Some(first) if outcome_unknown(first) => {
                report.left_for_operator.insert(k.clone());
            }
            Some(first) if first.status == 200 && n == 0 => report.lost.push(k.clone()),
            Some(first) => assert_eq!(first.status, 200, "{k}: {first:?}"),
            None => report.lost.push(k.clone()),
        }
        if n > 1 {
            report.duplicates.push(k.clone());
        }
    }
}

/// Records the primary has and the standby lacks, and the WAL between
/// them, read just before the primary is stopped.
fn tail(cluster: &PgCluster) -> (usize, i64) {
    let keys = |role| -> BTreeSet<String> {
        let sql = format!("SELECT key FROM {SCHEMA}.records");
        tokio::task::block_in_place(|| cluster.psql(role, &sql))
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let lsn = |role, function: &str| {
        tokio::task::block_in_place(|| cluster.psql(role, &format!("SELECT {function}()"))).unwrap()
    };
    let standby_lsn = lsn(Role::Standby, "pg_last_wal_replay_lsn");
    let primary_lsn = lsn(Role::Primary, "pg_current_wal_lsn");
    let standby_keys = keys(Role::Standby);
    let primary_keys = keys(Role::Primary);
    let bytes = tokio::task::block_in_place(|| {
        cluster.psql(
            Role::Primary,
            &format!("SELECT pg_wal_lsn_diff('{primary_lsn}', '{standby_lsn}')::bigint"),
        )
    })
    .unwrap();
    (
        primary_keys.difference(&standby_keys).count(),
        bytes.parse().unwrap(),
    )
}

/// An intent's key and its final answer, if it got one.
type Answer = (String, Option<Reply>);

/// The clients: each sends fresh keys one after another, each retried on
/// 409, 503 and connection errors until it has another answer.
struct Load {
    stop: Arc<AtomicBool>,
    unavailable: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Answer>>>,
}

impl Load {
    fn start(url: &str, (replication, lookup): Scenario) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let unavailable = Arc::new(AtomicUsize::new(0));
        let mode = match replication {
            Replication::Synchronous => "sync",
            _ => "async",
        };
        let tasks = (0..CLIENTS)
            .map(|c| {
                let (url, stop, unavailable) = (url.to_owned(), stop.clone(), unavailable.clone());
                tokio::spawn(async move {
                    let client = support::client();
                    let mut answers = Vec::new();
                    for n in 0.. {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let k = format!("{mode}-c{c}-{n}");
                        let answer = until_final(&client, (&url, lookup), &k, &unavailable).await;
                        answers.push((k, answer));
                    }
                    answers
                })
            })
            .collect();
        Load {
            stop,
            unavailable,
            tasks,
        }
    }

    /// Stops sending new intents and waits for the ones under way.
    async fn stop(self) -> (HashMap<String, Option<Reply>>, usize) {
        self.stop.store(true, Ordering::SeqCst);
        let mut answers = HashMap::new();
        for task in self.tasks {
            answers.extend(task.await.unwrap());
        }
        (answers, self.unavailable.load(Ordering::SeqCst))
    }
}

type HttpClient =
    hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Body>;

/// Sends `k` until an answer other than 409 or 503 (counting the 503s),
/// backing off, for at most [`INTENT_DEADLINE`]; `None` if there was none.
async fn until_final(
    client: &HttpClient,
    (url, lookup): (&str, bool),
    k: &str,
    unavailable: &AtomicUsize,
) -> Option<Reply> {
    let deadline = tokio::time::Instant::now() + INTENT_DEADLINE;
    let mut backoff_ms = 20;
    while tokio::time::Instant::now() < deadline {
        match send(client, url, k).await {
            Ok(reply) if reply.status == 503 => {
                unavailable.fetch_add(1, Ordering::SeqCst);
            }
            // With no lookup, an unknown outcome waits for an operator.
            Ok(reply) if reply.status == 409 && (lookup || !outcome_unknown(&reply)) => {}
            Ok(reply) => return Some(reply),
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
        backoff_ms = (backoff_ms * 2).min(400);
    }
    None
}

/// [`until_final`] for a single key outside the load.
async fn settle(client: &HttpClient, url: (&str, bool), k: &str) -> Option<Reply> {
    until_final(client, url, k, &AtomicUsize::new(0)).await
}

fn outcome_unknown(reply: &Reply) -> bool {
    reply.problem().as_deref() == Some("urn:idem:problem:outcome-unknown")
}

/// One POST of the transfer with key `k`; a connection error or an
/// exchange over [`EXCHANGE_TIMEOUT`] is an `Err`.
async fn send(client: &HttpClient, url: &str, k: &str) -> Result<Reply, String> {
    let req = axum::http::Request::post(url)
        .header("content-type", "application/json")
        .header("idempotency-key", k)
        .body(Body::from(TRANSFER))
        .map_err(|e| e.to_string())?;
    let exchange = async {
        let response = client.request(req).await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .filter(|(n, _)| n.as_str() != "date")
            .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(Reply {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
        .await
        .map_err(|_| "timed out".to_owned())?
}
