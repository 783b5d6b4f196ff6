//! What a store asked of DynamoDB: requests by kind and the capacity
//! DynamoDB reported consuming (`ReturnConsumedCapacity=TOTAL`), so that a
//! benchmark, or an operator, sees what a claim costs on AWS.

use std::sync::atomic::{AtomicU64, Ordering};

use aws_sdk_dynamodb::types::ConsumedCapacity;

/// Counters of one store's requests since it was opened.
#[derive(Debug, Default)]
pub struct Usage {
    reads: AtomicU64,
    writes: AtomicU64,
    failed_conditions: AtomicU64,
    queries: AtomicU64,
    scans: AtomicU64,
    /// Thousandths of a read capacity unit.
    read_milli_units: AtomicU64,
    /// Thousandths of a write capacity unit.
    write_milli_units: AtomicU64,
}

/// A snapshot of [`Usage`].
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct UsageCounts {
    /// `GetItem` requests (all with `ConsistentRead`).
    pub reads: u64,
    /// `PutItem` and `DeleteItem` requests, whether they applied or not.
    pub writes: u64,
    /// Of those, the writes whose condition failed. DynamoDB charges them
    /// (at least one write unit; the existing item's size) but does not
    /// report their capacity: it is not in `write_units`.
    pub failed_conditions: u64,
    /// `Query` requests (indexes: ambiguous records, purge candidates).
    pub queries: u64,
    /// `Scan` requests (listings other than of ambiguous records).
    pub scans: u64,
    /// Read capacity units DynamoDB reported.
    pub read_units: f64,
    /// Write capacity units DynamoDB reported (applied writes only).
    pub write_units: f64,
}

/// Which request a count is for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Request {
    Read,
    Write,
    Query,
    Scan,
}

impl Usage {
    /// Counts one request and the capacity it reported, if any.
    pub(crate) fn count(&self, request: Request, consumed: Option<&ConsumedCapacity>) {
        let counter = match request {
            Request::Read => &self.reads,
            Request::Write => &self.writes,
            Request::Query => &self.queries,
            Request::Scan => &self.scans,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = consumed {
            let milli = |units: Option<f64>| (units.unwrap_or(0.0) * 1000.0).round() as u64;
            let (read, write) = match (c.read_capacity_units, c.write_capacity_units) {
                (None, None) => match request {
                    Request::Write => (0, milli(c.capacity_units)),
                    _ => (milli(c.capacity_units), 0),
                },
                (read, write) => (milli(read), milli(write)),
            };
            self.read_milli_units.fetch_add(read, Ordering::Relaxed);
            self.write_milli_units.fetch_add(write, Ordering::Relaxed);
        }
    }

    /// Counts a write whose condition failed.
    pub(crate) fn failed_condition(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.failed_conditions.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn counts(&self) -> UsageCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        UsageCounts {
            reads: get(&self.reads),
            writes: get(&self.writes),
            failed_conditions: get(&self.failed_conditions),
            queries: get(&self.queries),
            scans: get(&self.scans),
            read_units: get(&self.read_milli_units) as f64 / 1000.0,
            write_units: get(&self.write_milli_units) as f64 / 1000.0,
        }
    }
}

impl UsageCounts {
    /// What was counted between `earlier` and this snapshot.
    pub fn since(&self, earlier: &UsageCounts) -> UsageCounts {
        UsageCounts {
            reads: self.reads - earlier.reads,
            writes: self.writes - earlier.writes,
            failed_conditions: self.failed_conditions - earlier.failed_conditions,
            queries: self.queries - earlier.queries,
            scans: self.scans - earlier.scans,
            read_units: self.read_units - earlier.read_units,
            write_units: self.write_units - earlier.write_units,
        }
    }
}
