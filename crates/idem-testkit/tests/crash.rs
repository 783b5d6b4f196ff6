//! Crash safety with a real process: `crash-writer` commits records as fast
//! as it can, is killed with SIGKILL mid-stream, and every record it
//! reported as committed must be in the reopened file, completed with the
//! reported token, in a file SQLite finds intact.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use idem_core::{
    Claim, ClaimRequest, Fingerprint, IdempotencyKey, Policy, RecordId, Scope, State, Store, Token,
};
use idem_sqlite::{SqliteOptions, SqliteStore};
use idem_testkit::{CRASH_SCOPE, Committed};

/// How long the writer may take to report the commits a case waits for.
const REPORT_TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn every_reported_commit_survives_sigkill() {
    // Different kill points land in different phases of the writer: mid
    // batch, mid fsync, mid checkpoint of the WAL.
    for kill_after in [2_000, 3_100, 4_700] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crash.db");
        let committed = run_and_kill(&path, kill_after);
        assert!(
            committed.len() >= kill_after,
            "kill after {kill_after}: only {} lines",
            committed.len()
        );
        check_store(&path, &committed, kill_after);
        check_integrity(&path, kill_after);
    }
}

/// Runs the writer until it reported `kill_after` commits, kills it, and
/// returns every commit it reported (including lines still in the pipe).
fn run_and_kill(path: &Path, kill_after: usize) -> Vec<Committed> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_crash-writer"))
        .arg(path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let lines = read_lines(&mut child);
    let mut committed = Vec::new();
    let deadline = Instant::now() + REPORT_TIMEOUT;
    while committed.len() < kill_after {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => committed.push(parse(&line)),
            Err(e) => {
                let _ = child.kill();
                let status = child.wait();
                panic!(
                    "kill after {kill_after}: writer reported {} commits, then {e:?} \
                     (exit status {status:?})",
                    committed.len()
                );
            }
        }
    }
    // SIGKILL on Unix: no destructor, no flush, no clean close of SQLite.
    child.kill().unwrap();
    child.wait().unwrap();
    // The pipe closed with the process; what it already held still counts.
    committed.extend(lines.iter().map(|line| parse(&line)));
    committed
}

/// Lines of the child's stdout on a channel; a final line without its
/// newline was cut by the kill and is dropped, as never promised.
fn read_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if !line.ends_with('\n') => return,
                Ok(_) => {
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

fn parse(line: &str) -> Committed {
    Committed::parse(line).unwrap_or_else(|| panic!("not a commit line: {line:?}"))
}

fn check_store(path: &Path, committed: &[Committed], kill_after: usize) {
    let tokens: HashSet<_> = committed.iter().map(|c| c.token).collect();
    assert_eq!(tokens.len(), committed.len(), "tokens are unique");
    let options = SqliteOptions {
        create: false,
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open(path, options).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        for c in committed {
            let id = RecordId {
                scope: Scope::new(c.scope.as_str()).unwrap(),
                key: IdempotencyKey::parse(&c.key).unwrap(),
            };
            let record = store.get(&id).await.unwrap();
            let Some(record) = record else {
                panic!("kill after {kill_after}: reported {} is missing", c.key);
            };
            assert_eq!(
                (record.state, record.token),
                (State::Completed, c.token),
                "kill after {kill_after}: {}",
                c.key
            );
        }
        // The fencing counter survived too: the next token is above every
        // token the killed process reported.
        let req = ClaimRequest {
            id: RecordId {
                scope: Scope::new(CRASH_SCOPE).unwrap(),
                key: IdempotencyKey::parse("after-the-crash").unwrap(),
            },
            fingerprint: Fingerprint::from_bytes([2; 32]),
            legacy_fingerprint: None,
            owner: "crash-test".to_owned(),
            region: None,
            policy: Policy::default(),
        };
        let max = tokens.iter().max().copied().unwrap_or(Token(0));
        match store.claim(&req).await.unwrap() {
            Claim::Acquired { token, .. } => {
                assert!(token > max, "kill after {kill_after}: {token} after {max}")
            }
            other => panic!("kill after {kill_after}: a fresh key gave {other:?}"),
        }
    });
}

fn check_integrity(path: &Path, kill_after: usize) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut stmt = conn.prepare("PRAGMA integrity_check").unwrap();
    let rows: Vec<String> = stmt
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rows, ["ok"], "kill after {kill_after}");
}
