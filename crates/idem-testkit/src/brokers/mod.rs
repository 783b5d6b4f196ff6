//! Clients and servers of the real brokers, shared by the tests of the
//! broker adapters (`idem-broker`) and of `idem consume` (`idem`): a
//! JetStream server of a test's own, a plain RabbitMQ client, and names no
//! other test uses.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up fails by panicking"
)]

pub mod nats;
pub mod rabbitmq;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A stream or queue name no other test, run or process uses: letters,
/// digits, `_` and `-` only, as JetStream names must be.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "idem_{prefix}_{}_{}_{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}
