//! The replicated PostgreSQL harness does what the failover tests rely on:
//! the standby streams through the relay, a frozen relay holds WAL back
//! (the unreplicated tail is lost with the primary), the promoted standby
//! accepts writes, and dropping the cluster leaves no postmaster and no
//! data dir behind.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::time::Duration;

use idem_testkit::pg_cluster::{PgCluster, Replication, Role};
use idem_testkit::relay::Relay;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tail_held_back_by_the_relay_is_lost_and_the_promoted_standby_writes() {
    let mut cluster = PgCluster::start_primary(Replication::Asynchronous).unwrap();
    let relay = Relay::start(cluster.primary_addr()).await.unwrap();
    tokio::task::block_in_place(|| cluster.add_standby(relay.addr())).unwrap();
    let dir = cluster.dir().to_owned();
    let pid_file = dir.join("standby/postmaster.pid");
    assert!(pid_file.exists());

    let sql = |cluster: &PgCluster, role, sql: &str| {
        tokio::task::block_in_place(|| cluster.psql(role, sql)).unwrap()
    };
    sql(
        &cluster,
        Role::Primary,
        "CREATE TABLE t (n int); INSERT INTO t VALUES (1)",
    );
    let replicated = "SELECT count(*) FROM t";
    let mut seen = String::new();
    for _ in 0..200 {
        seen = tokio::task::block_in_place(|| cluster.psql(Role::Standby, replicated))
            .unwrap_or_default();
        if seen == "1" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen, "1", "the standby replays through the relay");

    relay.freeze();
    sql(&cluster, Role::Primary, "INSERT INTO t VALUES (2)");
    assert_eq!(sql(&cluster, Role::Primary, replicated), "2");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sql(&cluster, Role::Standby, replicated), "1", "held back");

    tokio::task::block_in_place(|| cluster.stop_primary_immediate()).unwrap();
    tokio::task::block_in_place(|| cluster.promote_standby()).unwrap();
    sql(&cluster, Role::Standby, "INSERT INTO t VALUES (3)");
    assert_eq!(
        sql(
            &cluster,
            Role::Standby,
            "SELECT string_agg(n::text, ',' ORDER BY n) FROM t"
        ),
        "1,3",
        "the tail is gone, the new primary writes"
    );
    let url = cluster.multi_host_url();
    assert!(url.contains("target_session_attrs=read-write"), "{url}");

    drop(cluster);
    assert!(!dir.exists(), "data dirs removed");
    assert!(!pid_file.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_standby_is_named_and_its_copy_waits_for_no_one() {
    let mut cluster = PgCluster::start_primary(Replication::Synchronous).unwrap();
    let relay = Relay::start(cluster.primary_addr()).await.unwrap();
    tokio::task::block_in_place(|| cluster.add_standby(relay.addr())).unwrap();
    let show = |role, setting: &str| {
        tokio::task::block_in_place(|| cluster.psql(role, &format!("SHOW {setting}"))).unwrap()
    };
    assert_eq!(show(Role::Primary, "synchronous_commit"), "remote_apply");
    assert_eq!(show(Role::Primary, "synchronous_standby_names"), "standby");
    assert_eq!(
        show(Role::Standby, "synchronous_standby_names"),
        "",
        "the standby, once promoted, waits for no one"
    );
    let state = tokio::task::block_in_place(|| {
        cluster.psql(
            Role::Primary,
            "SELECT application_name || ' ' || sync_state FROM pg_stat_replication",
        )
    })
    .unwrap();
    assert_eq!(state, "standby sync");
}
