//! A fresh table on an emulator for each test.

#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use idem_core::ManualClock;
use idem_dynamodb::{DynamoStore, DynamoUrl};
use idem_testkit::services::Service;

/// The two DynamoDB implementations the tests run on.
#[derive(Clone, Copy, Debug)]
pub enum Emulator {
    Dynalite,
    Moto,
}

impl Emulator {
    pub fn endpoint(self) -> String {
        let service = match self {
            Emulator::Dynalite => Service::Dynalite,
            Emulator::Moto => Service::Moto,
        };
        service.endpoint()
    }
}

/// Deletes nothing: every test's table has a name of its own, and the
/// emulators keep their tables in memory.
pub struct Dropped;

static TABLES: AtomicU32 = AtomicU32::new(0);

/// A table name no other test of this run uses.
pub fn fresh_table(tag: &str) -> String {
    let n = TABLES.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("idem-{tag}-{}-{n}-{nanos}", std::process::id())
}

/// The URL of a new table of idem's on `emulator`, created.
pub async fn fresh_url(emulator: Emulator, tag: &str) -> (DynamoUrl, aws_sdk_dynamodb::Client) {
    fresh_url_with_skew(emulator, tag, 0).await
}

/// [`fresh_url`] tolerating `skew_ms` of clock skew.
pub async fn fresh_url_with_skew(
    emulator: Emulator,
    tag: &str,
    skew_ms: u64,
) -> (DynamoUrl, aws_sdk_dynamodb::Client) {
    let endpoint = emulator.endpoint();
    let url = DynamoUrl::parse(&format!(
        "dynamodb://{}?region=us-east-1&endpoint={endpoint}&clock_skew_ms={skew_ms}",
        fresh_table(tag)
    ))
    .unwrap();
    let client = idem_dynamodb::emulator_client(&url, &endpoint);
    idem_dynamodb::create_table(&client, &url).await.unwrap();
    (url, client)
}

pub async fn fresh_store(emulator: Emulator, clock: ManualClock) -> (Arc<DynamoStore>, Dropped) {
    let (url, client) = fresh_url(emulator, "c").await;
    let store = DynamoStore::with_client(client, &url, Arc::new(clock))
        .await
        .unwrap();
    (Arc::new(store), Dropped)
}
