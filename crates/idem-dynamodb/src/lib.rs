//! The idem store on Amazon DynamoDB.
//!
//! One item per (scope, key) holds the record, its lookup tries and its
//! resolution journal ([`item`]). Every change reads the item (with
//! `ConsistentRead`, or from what this process last wrote), decides with
//! the shared pure functions of [`idem_core::decision`], and writes the
//! whole item back under a condition on the version it read; a lost
//! condition reads again and decides again, a bounded number of times. A
//! claim of a fresh key is one conditional put and no read.
//!
//! Time is this process's clock ([`Clock`]): DynamoDB conditions cannot
//! read a server clock. Every judgement that a lease is over is made
//! [`DynamoUrl::clock_skew_ms`] late, so that a process whose clock runs
//! ahead by up to that much never takes over or releases an attempt that
//! may still be running.

pub mod item;
mod ops;
pub mod setup;
mod table;
pub mod url;
pub mod usage;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use idem_core::{Clock, Record, RecordId, StoreError, Timestamp};

pub use setup::{TableStatus, connect, create_table, describe, emulator_client};
pub use url::{CLOCK_SKEW_MS_DEFAULT, CLOCK_SKEW_MS_MAX, DynamoUrl, URL_PARAMETERS};

use crate::item::Item;
use crate::table::Table;

/// The largest stored response body this store accepts, in bytes: a
/// DynamoDB item holds at most 400 KB, and the record's other fields and
/// its journal need the rest. A route or subscription whose stored
/// response could be larger is refused at start.
pub const RESULT_BODY_BYTES_MAX: usize = 300 * 1024;

/// How many times one change reads and decides again after losing its
/// condition to another writer before it answers "unavailable".
const MODIFY_TRIES: usize = 16;
/// The most in-progress records a process remembers as it wrote them, so
/// that finishing an attempt needs no read.
const RECENT_MAX: usize = 65_536;

/// A [`Store`](idem_core::Store) on one DynamoDB table.
pub struct DynamoStore {
    table: Table,
    clock: Arc<dyn Clock>,
    skew_ms: u64,
    /// Items whose record this process last saw in progress (it wrote
    /// them, or a claim found another attempt holding them): the first
    /// guess of the next change or claim of that key, so that finishing an
    /// attempt needs no read and a retry or waiter asking about a key in
    /// flight costs one read, never a failed write (the condition on the
    /// version catches a guess that is out of date).
    recent: Mutex<HashMap<RecordId, Item>>,
}

impl DynamoStore {
    /// The store on the table `url` names, reading time from `clock`: the
    /// table must exist with idem's layout ([`create_table`]).
    pub async fn open(url: &DynamoUrl, clock: Arc<dyn Clock>) -> Result<DynamoStore, StoreError> {
        let client = connect(url).await;
        DynamoStore::with_client(client, url, clock).await
    }

    /// The store over a client built by the caller (credentials, retries,
    /// timeouts of its own), on the table `url` names.
    pub async fn with_client(
        client: aws_sdk_dynamodb::Client,
        url: &DynamoUrl,
        clock: Arc<dyn Clock>,
    ) -> Result<DynamoStore, StoreError> {
        let table = Table {
            client,
            name: url.table.clone(),
            url: url.clone(),
            usage: Default::default(),
        };
        let found = setup::check_layout(&table).await?;
        check_clock(found.clock_offset_ms, url);
        Ok(DynamoStore {
            table,
            clock,
            skew_ms: url.clock_skew_ms,
            recent: Mutex::new(HashMap::new()),
        })
    }

    /// The table's name.
    pub fn table_name(&self) -> &str {
        &self.table.name
    }

    /// The requests this store made and the capacity DynamoDB reported.
    pub fn usage(&self) -> usage::UsageCounts {
        self.table.usage.counts()
    }

    /// The store's clock now, and the instant a lease is judged against:
    /// `now` less the tolerated skew.
    fn times(&self) -> (Timestamp, Timestamp) {
        let now = self.clock.now();
        let judged = Timestamp::from_millis(now.as_millis().saturating_sub(self.skew_ms));
        (now, judged)
    }

    fn recent(&self) -> MutexGuard<'_, HashMap<RecordId, Item>> {
        // Each use is one map operation: a panic cannot leave it half done.
        self.recent
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keeps `item` as the next guess for `id` while its record is in
    /// progress; forgets it otherwise.
    fn remember(&self, id: &RecordId, item: &Item) {
        let mut recent = self.recent();
        let in_progress = item
            .record
            .as_ref()
            .is_some_and(|r| r.state == idem_core::State::InProgress);
        if !in_progress {
            recent.remove(id);
            return;
        }
        // Guesses are only a shortcut: a full map starts again empty rather
        // than keeping, for good, guesses nothing will ever correct.
        if recent.len() >= RECENT_MAX && !recent.contains_key(id) {
            recent.clear();
        }
        recent.insert(id.clone(), item.clone());
    }

    fn guess(&self, id: &RecordId) -> Option<Item> {
        self.recent().get(id).cloned()
    }

    /// The item of `id`, read with `ConsistentRead`.
    async fn read(&self, id: &RecordId) -> Result<Item, StoreError> {
        match self.table.get(&item::pk_of(id)).await? {
            None => Ok(Item::missing()),
            Some(attrs) => self.load(id, &attrs).await,
        }
    }

    /// [`Table::load`], its failure said as a [`StoreError`].
    async fn load(&self, id: &RecordId, attrs: &table::Attrs) -> Result<Item, StoreError> {
        match self.table.load(id, attrs).await {
            Ok(item) => Ok(item),
            Err(Ok(why)) => Err(self.damaged(id, &why)),
            Err(Err(e)) => Err(e),
        }
    }

    /// A random number for a token's low bits.
    fn random_u32() -> Result<u32, StoreError> {
        let mut bytes = [0u8; 4];
        getrandom::fill(&mut bytes).map_err(|e| StoreError::Unavailable {
            store: "the operating system's random source".into(),
            reason: e.to_string(),
        })?;
        Ok(u32::from_be_bytes(bytes))
    }

    fn damaged(&self, id: &RecordId, why: &str) -> StoreError {
        StoreError::Incompatible {
            store: self.table.label(),
            reason: format!("the item of {id} cannot be read: {why}"),
        }
    }
}

/// Warns when this process's clock is further from DynamoDB's than the
/// skew the URL tolerates (the measure is good to about a second, so only
/// a clock off by more than that plus the skew is said).
fn check_clock(offset: Option<i64>, url: &DynamoUrl) {
    let Some(offset) = offset else {
        return;
    };
    let bound = i64::try_from(url.clock_skew_ms)
        .unwrap_or(i64::MAX)
        .saturating_add(1_000);
    if offset.abs() > bound {
        tracing::warn!(
            offset_ms = offset,
            clock_skew_ms = url.clock_skew_ms,
            "this machine's clock is further from DynamoDB's than the store tolerates: leases \
             may be judged over while their owner still runs; synchronise the clock (Amazon \
             Time Sync, chrony) or raise clock_skew_ms in the store URL"
        );
    } else {
        tracing::debug!(
            offset_ms = offset,
            "clock within the tolerated skew of DynamoDB's"
        );
    }
}

/// A fresh write id: 128 random bits, so that a write that meets itself
/// knows it.
fn write_id() -> Result<String, StoreError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| StoreError::Unavailable {
        store: "the operating system's random source".into(),
        reason: e.to_string(),
    })?;
    Ok(idem_core::to_hex(&bytes))
}

/// The record of an item, if any.
fn record_of(item: &Item) -> Option<&Record> {
    item.record.as_ref()
}
