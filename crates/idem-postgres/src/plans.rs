//! How PostgreSQL plans the store's statements on a new deployment. A
//! statement prepared once per connection may be run from one generic
//! plan, made the first times it runs, while `records` is still empty; a
//! plan that reads `records` in full is then kept while the table grows
//! (until the next `ANALYZE` invalidates it), and every call reads every
//! record. So every statement the store prepares once must reach
//! `records` through an index in its generic plan made on a new, empty
//! table; a statement whose plan depends on its input (the batches, which
//! join arrays against `records`) is planned per call instead
//! (`ops::Planning::PerCall`), and this test shows why.
//!
//! Not covered: a table that `ANALYZE` saw empty (a purge emptied it and
//! autovacuum ran). Then the single-record statements' generic plans read
//! the table in full too, until the next analyze of the growing table
//! replaces them (docs/stores.md, "Plans").

use tokio_postgres::NoTls;

use crate::schema::{Planning, Schema};
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

fn reads_records_in_full(plan: &str) -> bool {
    plan.lines()
        .any(|line| line.contains("Seq Scan on records"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_statement_prepared_once_reads_every_record_in_its_generic_plan() {
    let guard = SchemaGuard::new();
    let store = guard.store(None).await;
    drop(store);
    let (client, connection) = match tokio_postgres::connect(&support::url(), NoTls).await {
        Ok(connected) => connected,
        Err(e) => panic!("cannot connect to {}: {e}", support::url()),
    };
    let connection = tokio::spawn(connection);
    let schema = Schema::new(guard.name());
    client
        .batch_execute(&format!(
            "SET search_path = {s}; \
             SET plan_cache_mode = force_generic_plan",
            s = guard.name()
        ))
        .await
        .unwrap_or_else(|e| panic!("cannot set up the session: {e}"));

    let mut full_reads = Vec::new();
    let mut per_call = Vec::new();
    for (name, sql) in schema.statements() {
        let plan = generic_plan(&client, name, sql).await;
        match schema.planning(sql) {
            Planning::Cached if reads_records_in_full(&plan) => {
                full_reads.push(format!("{name}:\n{plan}"));
            }
            Planning::Cached => {}
            // Why these are planned per call: their generic plans, made on
            // an empty table, read every record.
            Planning::PerCall => {
                assert!(
                    reads_records_in_full(&plan),
                    "{name} no longer reads every record in its generic plan; it could be \
                     prepared once again:\n{plan}"
                );
                per_call.push(name);
            }
        }
    }
    assert!(
        full_reads.is_empty(),
        "statements prepared once whose generic plan, made on an empty table, reads every \
         record (plan them per call, or reach records by an index):\n{}",
        full_reads.join("\n\n")
    );
    assert_eq!(per_call, ["complete_batch", "delete"]);
    drop(client);
    let _ = connection.await;
}
