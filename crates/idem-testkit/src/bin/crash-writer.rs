//! A process to kill: claims and completes fresh keys in a SQLite store,
//! forever, and prints `committed <scope> <key> <token>` for each completion
//! only after the store confirmed it. A test kills it with SIGKILL at some
//! instant and checks that every printed record is in the file.
//!
//! Usage: `crash-writer DB_PATH [TASKS]` (TASKS concurrent writers, default 32).

use std::io::Write as _;
use std::sync::Arc;

use idem_core::{
    Claim, ClaimRequest, Fingerprint, IdempotencyKey, Policy, RecordId, Scope, Store, StoredResult,
};
use idem_sqlite::{SqliteOptions, SqliteStore};
use idem_testkit::{CRASH_SCOPE, Committed};

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let (Some(path), tasks) = (args.next(), args.next()) else {
        return Err("usage: crash-writer DB_PATH [TASKS]".into());
    };
    let tasks: usize = tasks.as_deref().unwrap_or("32").parse()?;
    let store = Arc::new(SqliteStore::open(&path, SqliteOptions::default())?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut workers = tokio::task::JoinSet::new();
        for worker in 0..tasks {
            workers.spawn(write_forever(Arc::clone(&store), worker));
        }
        // Workers only return on error; the first one ends the process.
        match workers.join_next().await {
            Some(Ok(Err(e))) => Err(e),
            Some(Err(e)) => Err(e.into()),
            Some(Ok(Ok(()))) | None => Ok(()),
        }
    })
}

/// Claims and completes `w<worker>-0`, `w<worker>-1`, … until an error.
async fn write_forever(store: Arc<SqliteStore>, worker: usize) -> Result<(), Error> {
    let scope = Scope::new(CRASH_SCOPE)?;
    let result = StoredResult::new(
        201,
        vec![("x-worker".into(), worker.to_string().into())],
        vec![7; 64],
    )?;
    for n in 0u64.. {
        let key = format!("w{worker}-{n}");
        let req = ClaimRequest {
            id: RecordId {
                scope: scope.clone(),
                key: IdempotencyKey::parse(&key)?,
            },
            fingerprint: Fingerprint::from_bytes([1; 32]),
            legacy_fingerprint: None,
            owner: format!("crash-writer-{worker}"),
            region: None,
            policy: Policy::default(),
        };
        let Claim::Acquired { token, .. } = store.claim(&req).await? else {
            return Err(format!("{key} is fresh but was not acquired").into());
        };
        store.complete(&req.id, token, result.clone()).await?;
        let line = Committed {
            scope: CRASH_SCOPE.to_owned(),
            key,
            token,
        }
        .line();
        // One write per line, after the store confirmed: a line on stdout
        // is a promise the file must keep.
        let mut out = std::io::stdout().lock();
        out.write_all(line.as_bytes())?;
        out.flush()?;
    }
    Ok(())
}
