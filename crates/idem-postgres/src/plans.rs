//! How PostgreSQL plans the store's statements on a new deployment. Each
//! statement is prepared once per connection and run from one generic plan
//! (`config::PLANNER_SETTINGS`: `plan_cache_mode = force_generic_plan`),
//! made the first time it runs, perhaps while `records` is still empty or
//! after `ANALYZE` saw it empty. A generic plan that reads `records` in
//! full would then be kept while the table grows, and every call would
//! read every record: the batch of completions, joined against `records`
//! as a hash join over a sequential scan, did so before the settings
//! turned sequential scans off for the store's sessions. So every
//! statement's generic plan, made in a session the store opens, on a new,
//! empty table, must reach `records` through an index.

use tokio_postgres::NoTls;

use crate::config::{self, PgOptions};
use crate::schema::Schema;
use crate::test_support::{self as support, SchemaGuard};

/// How many parameters `sql` names (`$1` … `$n`).
fn parameters(sql: &str) -> usize {
    let mut highest = 0;
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(n) = digits.parse::<usize>() {
            highest = highest.max(n);
        }
    }
    highest
}

/// The generic plan of `sql` on `client`'s connection, as text.
async fn generic_plan(client: &tokio_postgres::Client, name: &str, sql: &str) -> String {
    client
        .batch_execute(&format!("DEALLOCATE ALL; PREPARE {name} AS {sql}"))
        .await
        .unwrap_or_else(|e| panic!("{name}: cannot prepare: {e}\n{sql}"));
    let nulls = vec!["NULL"; parameters(sql)].join(", ");
    let args = if nulls.is_empty() {
        String::new()
    } else {
        format!("({nulls})")
    };
    let rows = client
        .simple_query(&format!("EXPLAIN EXECUTE {name}{args}"))
        .await
        .unwrap_or_else(|e| panic!("{name}: cannot explain: {e}"));
    rows.iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `plan` (EXPLAIN's text) scans `records` without a condition an
/// index applies: a sequential scan, or an index scan that reads the whole
/// index.
fn reads_records_in_full(plan: &str) -> bool {
    let lines: Vec<&str> = plan.lines().collect();
    lines.iter().enumerate().any(|(at, line)| {
        let scans_records = line.contains("Scan") && line.contains(" on records");
        // The node's own properties: the lines after it up to the next node.
        let mut properties = lines[at + 1..]
            .iter()
            .take_while(|l| !l.trim_start().starts_with("->"));
        scans_records && !properties.any(|l| l.contains("Index Cond") || l.contains("Recheck Cond"))
    })
}

#[test]
fn a_scan_without_an_index_condition_reads_in_full() {
    let full = [
        "Seq Scan on records r  (cost=0.00..1.00 rows=1 width=8)\n  Filter: (key = $2)",
        "Hash Join\n  ->  Seq Scan on records r\n  ->  Hash\n        ->  Function Scan on unnest",
        "Index Scan using records_pkey on records r\n  Filter: (token = $4)",
    ];
    let by_index = [
        "Index Scan using records_pkey on records  (cost=0.15..8.17 rows=1 width=8)\n  \
         Index Cond: ((scope = $2) AND (key = $3))",
        "Nested Loop\n  ->  CTE Scan on input\n  ->  Index Scan using records_pkey on records r\n        \
         Index Cond: ((scope = input.scope) AND (key = input.key))",
        "Bitmap Heap Scan on records r\n  Recheck Cond: (state = 'ambiguous')\n  ->  Bitmap Index Scan",
    ];
    for plan in full {
        assert!(reads_records_in_full(plan), "{plan}");
    }
    for plan in by_index {
        assert!(!reads_records_in_full(plan), "{plan}");
    }
}

/// A session as the store opens one, its startup settings included, with
/// `guard`'s schema first on the search path.
async fn store_session(
    guard: &SchemaGuard,
) -> (
    tokio_postgres::Client,
    tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
) {
    let target = match config::target(&support::url(), &PgOptions::default()) {
        Ok(target) => target,
        Err(e) => panic!("{}: {e}", support::url()),
    };
    let (client, connection) = match target.pg.connect(NoTls).await {
        Ok(connected) => connected,
        Err(e) => panic!("cannot connect to {}: {e}", support::url()),
    };
    let connection = tokio::spawn(connection);
    client
        .batch_execute(&format!("SET search_path = {}", guard.name()))
        .await
        .unwrap_or_else(|e| panic!("cannot set up the session: {e}"));
    (client, connection)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_statement_reads_every_record_in_its_generic_plan() {
    let guard = SchemaGuard::new();
    let store = guard.store(None).await;
    drop(store);
    let (client, connection) = store_session(&guard).await;
    let schema = Schema::new(guard.name());
    let mode = client
        .query_one("SHOW plan_cache_mode", &[])
        .await
        .unwrap_or_else(|e| panic!("SHOW plan_cache_mode: {e}"));
    assert_eq!(mode.get::<_, String>(0), "force_generic_plan");

    let mut full_reads = Vec::new();
    for (name, sql) in schema.statements() {
        let plan = generic_plan(&client, name, sql).await;
        if reads_records_in_full(&plan) {
            full_reads.push(format!("{name}:\n{plan}"));
        }
    }
    assert!(
        full_reads.is_empty(),
        "statements whose generic plan, made on an empty table, reads every record \
         (reach records by an index):\n{}",
        full_reads.join("\n\n")
    );
    drop(client);
    let _ = connection.await;
}

/// The purge's generic plan, made by its first call on a new, empty table,
/// once many records are due: each scan of `records` yields at most the
/// batch asked for, where a plan that collected every due record and then
/// kept the batch's would read them all on every call (a backlog of a
/// million expired records read a million times over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purge_reads_only_its_batch_of_many_due_records() {
    const BATCH: u64 = 100;
    const DUE: u64 = 2_000;
    let guard = SchemaGuard::new();
    let store = guard.store(None).await;
    drop(store);
    let (client, connection) = store_session(&guard).await;
    let schema = Schema::new(guard.name());
    let run = |sql: String| {
        let client = &client;
        async move {
            client
                .simple_query(&sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
        }
    };
    run(format!("PREPARE purge AS {}", schema.purge)).await;
    run(format!("EXECUTE purge(NULL, {BATCH})")).await;
    run(format!(
        "INSERT INTO records (scope, key, fingerprint, state, token, owner, lease_until_ms, \
         created_at_ms, completed_at_ms, expires_at_ms, retention_s, tombstone_s, \
         result_status, result_headers, result_body) \
         SELECT 'POST /payouts|t', 'k-' || g, '\\x00', 'completed', g, 'o', 0, 0, 0, g, 1, 1, \
         201, '[]', '\\x00' FROM generate_series(1, {DUE}) AS g"
    ))
    .await;
    let explained = run(format!(
        "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) EXECUTE purge(NULL, {BATCH})"
    ))
    .await;
    let plan: Vec<String> = explained
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .collect();
    let plan = plan.join("\n");
    let mut scans = 0;
    for line in plan
        .lines()
        .filter(|l| l.contains("Scan") && l.contains(" on records"))
    {
        scans += 1;
        let rows: u64 = line
            .split("actual rows=")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no actual rows in {line:?}:\n{plan}"));
        assert!(
            rows <= BATCH,
            "a scan of records yields {rows} rows for a batch of {BATCH} out of {DUE} due:\n{plan}"
        );
    }
    assert!(scans > 0, "no scan of records in:\n{plan}");
    assert!(
        plan.contains(&format!("rows={BATCH} ")),
        "the batch was not read whole:\n{plan}"
    );
    drop(client);
    let _ = connection.await;
}
