//! Many gateway nodes, one memory: `idem serve` processes sharing one
//! PostgreSQL schema behave as one gateway (the cases in support/nodes.rs).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use support::{PgSchema, nodes};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_sharing_one_database_make_one_effect() {
    let schema = PgSchema::new("two_nodes");
    nodes::two_nodes_make_one_effect(&schema.store_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_fresh_claims_split_across_nodes_make_one_effect() {
    let schema = PgSchema::new("race");
    nodes::fresh_claims_split_across_nodes_make_one_effect(&schema.store_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_commands_read_the_shared_store() {
    let schema = PgSchema::new("records");
    nodes::records_commands_read_the_store(&schema.store_url()).await;
}
