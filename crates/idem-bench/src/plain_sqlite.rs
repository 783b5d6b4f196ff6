//! The baseline for `idem-bench sqlite`: the same durable work without
//! idem. One writer thread on a plain rusqlite connection (the same
//! bundled SQLite, WAL, `synchronous=FULL`, SQLite's own autocheckpoint
//! inside the commit that crosses it) takes what the callers queued, up to
//! 256 operations, and runs them in one transaction; each caller is
//! answered after COMMIT returned. A caller inserts a claim-shaped row for
//! a fresh key, waits for its commit, updates it to a completed row with
//! the same result the idem run stores, and waits again: two durable
//! writes per key, as a fresh key costs idem.
//!
//! What it leaves out is what idem adds: savepoints per operation, the
//! fencing counter, reading the record back to decide, the state checks.
//! So its rate is what SQLite and this disk give the batching design, and
//! its tail is the tail of SQLite's commits and checkpoints on this disk.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use rusqlite::{Connection, params};
use tokio::sync::{mpsc, oneshot};

use crate::measured::Measured;

/// Operations one transaction takes at most, as `SqliteOptions::default()`.
const BATCH_MAX: usize = 256;

/// The rows' columns, as idem's `records` table has them for a claim and a
/// completion (a subset: the columns a fresh key writes).
const SCHEMA: &str = "
    CREATE TABLE records (
        scope TEXT NOT NULL,
        key TEXT NOT NULL,
        fingerprint BLOB NOT NULL,
        state TEXT NOT NULL,
        token INTEGER NOT NULL,
        owner TEXT NOT NULL,
        lease_until_ms INTEGER NOT NULL,
        created_at_ms INTEGER NOT NULL,
        completed_at_ms INTEGER,
        expires_at_ms INTEGER,
        result_status INTEGER,
        result_headers TEXT,
        result_body BLOB,
        PRIMARY KEY (scope, key)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX records_expiring ON records (expires_at_ms, scope, key)
        WHERE state = 'completed';";

/// One write a caller queued, and where its answer goes.
enum Op {
    Claim {
        key: String,
        token: i64,
        done: oneshot::Sender<Result<(), String>>,
    },
    Complete {
        key: String,
        done: oneshot::Sender<Result<(), String>>,
    },
}

/// What the baseline measured: each pair's claim-to-completed latency, and
/// the transactions it committed.
pub struct Plain {
    pub pairs: Measured,
    pub batches: u64,
    pub ops: u64,
}

/// `callers` tasks claim and complete fresh keys in `path` until `seconds`
/// pass.
pub async fn run(path: &Path, callers: usize, seconds: u64) -> anyhow::Result<Plain> {
    let conn = open(path)?;
    let (queue, inbox) = mpsc::channel::<Op>(callers.max(1) * 2);
    let writer = std::thread::Builder::new()
        .name("plain-sqlite-writer".to_owned())
        .spawn(move || write_batches(conn, inbox))
        .context("starting the baseline's writer thread")?;
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..callers {
        tasks.spawn(caller_loop(queue.clone(), caller, deadline));
    }
    drop(queue);
    let mut pairs = Measured::default();
    while let Some(joined) = tasks.join_next().await {
        pairs.merge(joined??);
    }
    pairs.finish(start.elapsed());
    let (batches, ops) = writer
        .join()
        .map_err(|_| anyhow::anyhow!("the baseline's writer thread panicked"))??;
    Ok(Plain {
        pairs,
        batches,
        ops,
    })
}

fn open(path: &Path) -> anyhow::Result<Connection> {
    let conn = Connection::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    anyhow::ensure!(
        mode == "wal",
        "{} is not in WAL mode ({mode})",
        path.display()
    );
    conn.pragma_update(None, "synchronous", "FULL")?;
    // idem's threshold for waking its checkpointer; here SQLite runs the
    // checkpoint itself, in the commit that crosses it.
    conn.pragma_update(None, "wal_autocheckpoint", 4096)?;
    conn.execute_batch(SCHEMA)?;
    Ok(conn)
}

async fn caller_loop(
    queue: mpsc::Sender<Op>,
    caller: usize,
    deadline: Instant,
) -> anyhow::Result<Measured> {
    let mut pairs = Measured::default();
    let mut n: i64 = 0;
    while Instant::now() < deadline {
        let key = format!("c{caller}-{n}");
        n += 1;
        let started = Instant::now();
        let (done, answer) = oneshot::channel();
        queue
            .send(Op::Claim {
                key: key.clone(),
                token: n,
                done,
            })
            .await?;
        answer.await?.map_err(anyhow::Error::msg)?;
        let (done, answer) = oneshot::channel();
        queue.send(Op::Complete { key, done }).await?;
        answer.await?.map_err(anyhow::Error::msg)?;
        pairs.ok_since(started);
    }
    Ok(pairs)
}

/// The writer: one transaction per batch, every caller answered after its
/// COMMIT. Operations that arrive while the batch is applied join it, up to
/// [`BATCH_MAX`], as idem's writer does. Returns the batches and operations
/// it ran.
fn write_batches(conn: Connection, mut inbox: mpsc::Receiver<Op>) -> anyhow::Result<(u64, u64)> {
    let (mut batches, mut ops) = (0u64, 0u64);
    let mut batch = Vec::with_capacity(BATCH_MAX);
    while let Some(first) = inbox.blocking_recv() {
        batch.push(first);
        let committed = transaction(&conn, &mut inbox, &mut batch).map_err(|e| e.to_string());
        batches += 1;
        ops += batch.len() as u64;
        for op in batch.drain(..) {
            let (Op::Claim { done, .. } | Op::Complete { done, .. }) = op;
            let _ = done.send(committed.clone());
        }
    }
    Ok((batches, ops))
}

/// Applies `batch` and what joins it, then commits; rolls back on error.
fn transaction(
    conn: &Connection,
    inbox: &mut mpsc::Receiver<Op>,
    batch: &mut Vec<Op>,
) -> rusqlite::Result<()> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let mut applied = 0;
    let outcome = loop {
        if let Err(e) = batch[applied..].iter().try_for_each(|op| apply(conn, op)) {
            break Err(e);
        }
        applied = batch.len();
        while batch.len() < BATCH_MAX {
            match inbox.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        if batch.len() == applied {
            break conn.execute_batch("COMMIT");
        }
    };
    if outcome.is_err() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    outcome
}

fn apply(conn: &Connection, op: &Op) -> rusqlite::Result<()> {
    let scope = crate::fixtures::SCOPE;
    let now = 1_767_225_600_000i64;
    let body = br#"{"payout":"po_8f3a9c","amount":12500,"currency":"EUR","status":"paid"}"#;
    match op {
        Op::Claim { key, token, .. } => conn
            .prepare_cached(
                "INSERT INTO records (scope, key, fingerprint, state, token, owner, \
                 lease_until_ms, created_at_ms) \
                 VALUES (?1, ?2, ?3, 'in_progress', ?4, 'bench', ?5, ?6)",
            )?
            .execute(params![scope, key, [7u8; 32], token, now + 30_000, now])
            .map(drop),
        Op::Complete { key, .. } => conn
            .prepare_cached(
                "UPDATE records SET state = 'completed', completed_at_ms = ?3, \
                 expires_at_ms = ?4, result_status = 201, \
                 result_headers = '[[\"content-type\",\"application/json\"]]', \
                 result_body = ?5 WHERE scope = ?1 AND key = ?2",
            )?
            .execute(params![scope, key, now, now + 86_400_000, &body[..]])
            .map(drop),
    }
}
