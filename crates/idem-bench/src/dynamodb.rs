//! What a key costs on DynamoDB: the requests the DynamoDB store makes and
//! the capacity DynamoDB reports (`ReturnConsumedCapacity=TOTAL`), per
//! fresh key (claim, then completion), per replay of a key this process
//! never saw, and per question about a key in flight (a retry, a waiter's
//! poll), beside the same for the pattern AWS Powertools documents
//! (a conditional put, an update on completion; a replay is a put that
//! fails its condition, then a consistent read). It counts; it does not
//! time, so the figures do not drift with the machine, but an emulator's
//! capacity arithmetic is its own: compare on AWS before pricing.
//!
//! Usage: `cargo run --release -p idem-bench -- dynamodb [--endpoint URL]
//! [--keys 200] [--body 1024]` (default endpoint: dynalite's, as
//! `scripts/test.sh` starts it).

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, ConsumedCapacity, KeySchemaElement, KeyType,
    ReturnConsumedCapacity, ReturnValuesOnConditionCheckFailure, ScalarAttributeType,
};
use idem_core::{
    Claim, ClaimRequest, Fingerprint, HeaderBytes, IdempotencyKey, Policy, RecordId, Scope, Store,
    StoredResult, SystemClock,
};
use idem_dynamodb::usage::UsageCounts;
use idem_dynamodb::{DynamoStore, DynamoUrl};

use crate::args::Flags;

const USAGE: &str = "usage: idem-bench dynamodb [--endpoint URL] [--keys N] [--body BYTES]";
/// Powertools' target: a fresh key costs at most this many writes and no read.
const TARGET_FRESH_WRITES: u64 = 2;

/// One line of the report: requests and units per key.
struct PerKey {
    what: &'static str,
    counts: UsageCounts,
    keys: u64,
}

pub fn main(args: impl Iterator<Item = String>) -> anyhow::Result<()> {
    let flags = Flags::parse(args, &["--endpoint", "--keys", "--body"], USAGE)?;
    let endpoint = flags.text("--endpoint", idem_testkit::services::DYNALITE_URL_DEFAULT);
    let keys: u64 = flags.number("--keys", 200, 1..=100_000)?;
    let body: usize = flags.number("--body", 1024, 0..=idem_core::RESULT_BODY_BYTES_MAX)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(&endpoint, keys, body))
}

async fn run(endpoint: &str, keys: u64, body: usize) -> anyhow::Result<()> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let url = DynamoUrl::parse(&format!(
        "dynamodb://idem-cost-{stamp}?region=us-east-1&endpoint={endpoint}"
    ))
    .map_err(anyhow::Error::msg)?;
    let client = idem_dynamodb::emulator_client(&url, endpoint);
    idem_dynamodb::create_table(&client, &url).await.context(
        "cannot create the table (is the emulator running? bash scripts/test.sh starts it)",
    )?;
    let result = StoredResult::new(
        201,
        vec![("content-type".into(), HeaderBytes::from("application/json"))],
        vec![b'x'; body],
    )?;
    let mut lines = idem_lines(&client, &url, keys, &result).await?;
    lines.extend(powertools_lines(&client, &format!("powertools-{stamp}"), keys, body).await?);
    println!("DynamoDB cost per key, {keys} keys, {body}-byte bodies, endpoint {endpoint}");
    println!(
        "{:<34} {:>7} {:>7} {:>13} {:>7} {:>9} {:>9}",
        "", "reads", "writes", "failed conds", "queries", "RCU", "WCU"
    );
    for line in &lines {
        let k = line.keys as f64;
        let c = &line.counts;
        println!(
            "{:<34} {:>7.2} {:>7.2} {:>13.2} {:>7.2} {:>9.2} {:>9.2}",
            line.what,
            c.reads as f64 / k,
            c.writes as f64 / k,
            c.failed_conditions as f64 / k,
            c.queries as f64 / k,
            c.read_units / k,
            c.write_units / k
        );
    }
    let fresh = &lines[0].counts;
    println!(
        "target: a fresh key at most {TARGET_FRESH_WRITES} writes and no read: {} writes, {} reads \
         per key: {}",
        fresh.writes as f64 / keys as f64,
        fresh.reads as f64 / keys as f64,
        if fresh.writes <= TARGET_FRESH_WRITES * keys && fresh.reads == 0 {
            "met"
        } else {
            "missed"
        }
    );
    println!(
        "note: a failed condition is charged (at least 1 WCU, the existing item's size) but \
         DynamoDB does not report it: it is not in the WCU column"
    );
    Ok(())
}

fn id(n: u64) -> anyhow::Result<RecordId> {
    Ok(RecordId {
        scope: Scope::new("POST /payouts|bench")?,
        key: IdempotencyKey::new(format!("cost-{n}"))?,
    })
}

fn request(id: RecordId) -> ClaimRequest {
    ClaimRequest {
        id,
        fingerprint: Fingerprint::from_bytes([7; 32]),
        legacy_fingerprint: None,
        owner: "bench".into(),
        region: None,
        policy: Policy::DEFAULT,
    }
}

/// idem's store: `keys` fresh keys claimed and completed; each replayed by
/// a second store (a process that never saw it); `keys` more claimed and
/// asked about again while in flight by the process that saw them so.
async fn idem_lines(
    client: &Client,
    url: &DynamoUrl,
    keys: u64,
    result: &StoredResult,
) -> anyhow::Result<Vec<PerKey>> {
    let open = || DynamoStore::with_client(client.clone(), url, Arc::new(SystemClock));
    let (writer, reader) = (open().await?, open().await?);
    let before = writer.usage();
    for n in 0..keys {
        let Claim::Acquired { token, .. } = writer.claim(&request(id(n)?)).await? else {
            anyhow::bail!("key {n} was not fresh");
        };
        writer.complete(&id(n)?, token, result.clone()).await?;
    }
    let fresh = writer.usage().since(&before);
    let before = reader.usage();
    for n in 0..keys {
        let claim = reader.claim(&request(id(n)?)).await?;
        anyhow::ensure!(matches!(claim, Claim::Replay { .. }), "key {n}: {claim:?}");
    }
    let replay = reader.usage().since(&before);
    let mut in_flight = UsageCounts::default();
    for n in keys..2 * keys {
        let Claim::Acquired { .. } = reader.claim(&request(id(n)?)).await? else {
            anyhow::bail!("key {n} was not fresh");
        };
        let other = open().await?;
        other.claim(&request(id(n)?)).await?;
        let before = other.usage();
        let claim = other.claim(&request(id(n)?)).await?;
        anyhow::ensure!(
            matches!(claim, Claim::InFlight { .. }),
            "key {n}: {claim:?}"
        );
        in_flight = add(&in_flight, &other.usage().since(&before));
    }
    Ok(vec![
        PerKey {
            what: "idem: fresh key (claim + complete)",
            counts: fresh,
            keys,
        },
        PerKey {
            what: "idem: replay, key never seen here",
            counts: replay,
            keys,
        },
        PerKey {
            what: "idem: retry/waiter poll, in flight",
            counts: in_flight,
            keys,
        },
    ])
}

fn add(a: &UsageCounts, b: &UsageCounts) -> UsageCounts {
    UsageCounts {
        reads: a.reads + b.reads,
        writes: a.writes + b.writes,
        failed_conditions: a.failed_conditions + b.failed_conditions,
        queries: a.queries + b.queries,
        scans: a.scans + b.scans,
        read_units: a.read_units + b.read_units,
        write_units: a.write_units + b.write_units,
    }
}

/// Powertools' documented pattern on a table of its shape (`id` key,
/// `status`, `expiration`, `data`), counted the same way.
async fn powertools_lines(
    client: &Client,
    table: &str,
    keys: u64,
    body: usize,
) -> anyhow::Result<Vec<PerKey>> {
    client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("id")
                .attribute_type(ScalarAttributeType::S)
                .build()?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("id")
                .key_type(KeyType::Hash)
                .build()?,
        )
        .send()
        .await?;
    let data = serde_json::json!({ "status": 201, "body": "x".repeat(body) }).to_string();
    let mut fresh = UsageCounts::default();
    for n in 0..keys {
        let (put, consumed) = powertools_put(client, table, n).await?;
        anyhow::ensure!(put, "key {n} was not fresh");
        count(&mut fresh, consumed.as_ref(), false);
        let out = client
            .update_item()
            .table_name(table)
            .key("id", AttributeValue::S(format!("cost-{n}")))
            .update_expression("SET #s = :done, #d = :data")
            .expression_attribute_names("#s", "status")
            .expression_attribute_names("#d", "data")
            .expression_attribute_values(":done", AttributeValue::S("COMPLETED".into()))
            .expression_attribute_values(":data", AttributeValue::S(data.clone()))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await?;
        count(&mut fresh, out.consumed_capacity(), false);
    }
    let mut replay = UsageCounts::default();
    for n in 0..keys {
        let (put, _) = powertools_put(client, table, n).await?;
        anyhow::ensure!(!put, "key {n} was fresh on replay");
        replay.writes += 1;
        replay.failed_conditions += 1;
        let out = client
            .get_item()
            .table_name(table)
            .key("id", AttributeValue::S(format!("cost-{n}")))
            .consistent_read(true)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await?;
        count(&mut replay, out.consumed_capacity(), true);
    }
    Ok(vec![
        PerKey {
            what: "Powertools: fresh key (put+update)",
            counts: fresh,
            keys,
        },
        PerKey {
            what: "Powertools: replay (put fails+get)",
            counts: replay,
            keys,
        },
    ])
}

/// Powertools' claim: a put conditioned on no live record; `true` when it
/// applied.
async fn powertools_put(
    client: &Client,
    table: &str,
    n: u64,
) -> anyhow::Result<(bool, Option<ConsumedCapacity>)> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let item = HashMap::from([
        ("id".to_owned(), AttributeValue::S(format!("cost-{n}"))),
        ("status".to_owned(), AttributeValue::S("INPROGRESS".into())),
        (
            "expiration".to_owned(),
            AttributeValue::N((now + 3600).to_string()),
        ),
    ]);
    let sent = client
        .put_item()
        .table_name(table)
        .set_item(Some(item))
        .condition_expression("attribute_not_exists(id) OR expiration < :now")
        .expression_attribute_values(":now", AttributeValue::N(now.to_string()))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::None)
        .send()
        .await;
    match sent {
        Ok(out) => Ok((true, out.consumed_capacity)),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
        {
            Ok((false, None))
        }
        Err(e) => Err(e.into()),
    }
}

fn count(into: &mut UsageCounts, consumed: Option<&ConsumedCapacity>, read: bool) {
    if read {
        into.reads += 1;
    } else {
        into.writes += 1;
    }
    let units = consumed.and_then(|c| c.capacity_units).unwrap_or(0.0);
    if read {
        into.read_units += units;
    } else {
        into.write_units += units;
    }
}
