//! Connecting, creating and checking the table; the listing and the
//! purge's candidates, which read indexes; the suspect window's item.

use std::collections::HashMap;
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::Region;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TableStatus as AwsTableStatus, TimeToLiveSpecification,
};
use aws_smithy_http_client::tls;
use idem_core::{
    DamagedRow, ListCursor, ListQuery, Listing, Record, State, StoreError, SuspectWindow, Timestamp,
};

use crate::item::{
    self, AMBIGUOUS_INDEX, DUE_INDEX, DUE_SHARDS, LAYOUT_VERSION, META_PK, PK, TTL_ATTRIBUTE,
    WINDOW_PK, get_n, get_s, n, s,
};
use crate::table::{Attrs, IndexPage, Table};
use crate::url::DynamoUrl;

/// A client for the table `url` names: the standard AWS credential chain,
/// the URL's region and endpoint, HTTPS on rustls, the SDK's standard
/// retries, and timeouts so that a store that stops answering is an
/// error, not a hang.
pub async fn connect(url: &DynamoUrl) -> Client {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(3))
        .operation_attempt_timeout(Duration::from_secs(5))
        .operation_timeout(Duration::from_secs(15))
        .build();
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(http)
        .timeout_config(timeouts);
    if let Some(region) = &url.region {
        loader = loader.region(Region::new(region.clone()));
    }
    if let Some(endpoint) = &url.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    Client::new(&loader.load().await)
}

/// A client for a local emulator (dynalite, moto, DynamoDB Local) at
/// `endpoint`: static placeholder credentials, which emulators accept and
/// AWS refuses, and region `us-east-1` unless `url` names one.
pub fn emulator_client(url: &DynamoUrl, endpoint: &str) -> Client {
    let region = url.region.clone().unwrap_or_else(|| "us-east-1".into());
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region))
        .endpoint_url(endpoint)
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "emulator",
            "emulator",
            None,
            None,
            "idem-emulator",
        ))
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    Client::from_conf(config)
}

/// What [`describe`] found of a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableStatus {
    /// The table's name.
    pub table: String,
    /// DynamoDB's status (`ACTIVE`, `CREATING`, …).
    pub status: String,
    /// The global secondary indexes it has.
    pub indexes: Vec<String>,
    /// The layout version idem's meta item names (`None`: no meta item).
    pub layout: Option<i64>,
    /// The multi-Region consistency DynamoDB reports (`STRONG`,
    /// `EVENTUAL`), `None` when the table is not a global table or the
    /// endpoint does not say.
    pub multi_region_consistency: Option<String>,
    /// How far this process's clock was from DynamoDB's when it answered,
    /// in milliseconds (positive: ahead), from the answer's `Date`: `None`
    /// when it had none. The header counts whole seconds, so the figure is
    /// good to about half a second plus the round trip: enough to catch a
    /// clock off by more than a `clock_skew_ms` of a second or more, not to
    /// measure a smaller one.
    pub clock_offset_ms: Option<i64>,
}

/// Describes the table `table` names: exists, indexes, layout.
pub async fn describe(client: &Client, url: &DynamoUrl) -> Result<TableStatus, StoreError> {
    let table = table_of(client, url);
    let probe = DateProbe::default();
    let seen = probe.seen.clone();
    let described = client
        .describe_table()
        .table_name(&url.table)
        .customize()
        .interceptor(probe)
        .send()
        .await
        .map_err(|e| {
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_not_found_exception())
            {
                missing_table(url)
            } else {
                table.unavailable("describe the table", &e)
            }
        })?;
    let Some(desc) = described.table else {
        return Err(missing_table(url));
    };
    let layout = match table.get(META_PK).await? {
        None => None,
        Some(attrs) => Some(
            get_n(&attrs, "layout").map_err(|why| StoreError::Incompatible {
                store: table.label(),
                reason: format!("the table's meta item cannot be read: {why}"),
            })? as i64,
        ),
    };
    Ok(TableStatus {
        table: url.table.clone(),
        status: desc
            .table_status()
            .map_or("UNKNOWN".into(), |s| s.as_str().to_owned()),
        indexes: desc
            .global_secondary_indexes()
            .iter()
            .filter_map(|i| i.index_name().map(str::to_owned))
            .collect(),
        layout,
        multi_region_consistency: desc
            .multi_region_consistency()
            .map(|c| c.as_str().to_owned()),
        clock_offset_ms: seen.lock().ok().and_then(|seen| offset_ms(*seen)),
    })
}

fn table_of(client: &Client, url: &DynamoUrl) -> Table {
    Table {
        client: client.clone(),
        name: url.table.clone(),
        url: url.clone(),
        usage: Default::default(),
    }
}

fn missing_table(url: &DynamoUrl) -> StoreError {
    StoreError::Incompatible {
        store: format!("dynamodb://{}", url.table),
        reason: format!(
            "table {:?} does not exist here: create it with `idem store init --store {url}`",
            url.table
        ),
    }
}

/// Refuses a table that is not idem's, or is idem's in a newer layout.
/// Returns what it found (the clock's offset too).
pub(crate) async fn check_layout(table: &Table) -> Result<TableStatus, StoreError> {
    let found = describe(&table.client, &table.url).await?;
    let lacks: Vec<&str> = [AMBIGUOUS_INDEX, DUE_INDEX]
        .into_iter()
        .filter(|i| !found.indexes.iter().any(|f| f == i))
        .collect();
    match found.layout {
        None => Err(StoreError::Incompatible {
            store: table.label(),
            reason: format!(
                "table {:?} was not made by `idem store init` (it has no meta item); idem \
                 does not write into a table it did not create",
                table.name
            ),
        }),
        Some(v) if v > LAYOUT_VERSION => {
            Err(StoreError::newer_schema(&table.label(), v, LAYOUT_VERSION))
        }
        Some(_) if !lacks.is_empty() => Err(StoreError::Incompatible {
            store: table.label(),
            reason: format!("the table lacks the index(es) {}", lacks.join(", ")),
        }),
        Some(_) => Ok(found),
    }
}

/// Creates the table with its indexes (on-demand billing), turns on TTL
/// on [`TTL_ATTRIBUTE`] and writes the meta item; a table idem already
/// made is left as it is. Returns what it did, one line each.
pub async fn create_table(client: &Client, url: &DynamoUrl) -> Result<Vec<String>, StoreError> {
    let table = table_of(client, url);
    let mut done = Vec::new();
    match describe(client, url).await {
        Ok(_) => done.push(format!("table {} exists", url.table)),
        Err(StoreError::Incompatible { .. }) => {
            send_create(client, url, &table).await?;
            done.push(format!("created table {} (on-demand billing)", url.table));
        }
        Err(e) => return Err(e),
    }
    wait_active(client, url, &table).await?;
    let ttl = client
        .update_time_to_live()
        .table_name(&url.table)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .enabled(true)
                .attribute_name(TTL_ATTRIBUTE)
                .build()
                .map_err(|e| table.unavailable_text("TTL", &e.to_string()))?,
        )
        .send()
        .await;
    match ttl {
        Ok(_) => done.push(format!("TTL on {TTL_ATTRIBUTE} (reclaims storage only)")),
        Err(e) => done.push(format!(
            "TTL not turned on ({}); records are still expired by idem, only storage is not \
             reclaimed",
            crate::table::said(&e)
        )),
    }
    let meta = HashMap::from([
        (PK.to_owned(), s(META_PK)),
        ("layout".to_owned(), n(LAYOUT_VERSION as u64)),
    ]);
    match table.put_if(meta, 0).await {
        Ok(()) => done.push(format!("layout version {LAYOUT_VERSION}")),
        Err(crate::table::WriteRefused::Condition(_)) => {}
        Err(crate::table::WriteRefused::Store(e)) => return Err(e),
    }
    check_layout(&table).await?;
    Ok(done)
}

/// The table [`create_table`] makes, as a CloudFormation template (JSON)
/// with one `AWS::DynamoDB::Table` resource, for teams whose tables come
/// from infrastructure code: the same keys, indexes, billing and TTL.
pub fn cloudformation(url: &DynamoUrl) -> String {
    let index = |name: &str, hash: &str, range: &str| {
        serde_json::json!({
            "IndexName": name,
            "KeySchema": [
                { "AttributeName": hash, "KeyType": "HASH" },
                { "AttributeName": range, "KeyType": "RANGE" },
            ],
            "Projection": { "ProjectionType": "ALL" },
        })
    };
    let template = serde_json::json!({
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": format!("The idem store {url} (layout {LAYOUT_VERSION})"),
        "Resources": {
            "IdemStore": {
                "Type": "AWS::DynamoDB::Table",
                "DeletionPolicy": "Retain",
                "Properties": {
                    "TableName": url.table,
                    "BillingMode": "PAY_PER_REQUEST",
                    "AttributeDefinitions": [
                        { "AttributeName": PK, "AttributeType": "S" },
                        { "AttributeName": "amb", "AttributeType": "S" },
                        { "AttributeName": "amb_sk", "AttributeType": "S" },
                        { "AttributeName": "due_shard", "AttributeType": "S" },
                        { "AttributeName": "due", "AttributeType": "N" },
                    ],
                    "KeySchema": [{ "AttributeName": PK, "KeyType": "HASH" }],
                    "GlobalSecondaryIndexes": [
                        index(AMBIGUOUS_INDEX, "amb", "amb_sk"),
                        index(DUE_INDEX, "due_shard", "due"),
                    ],
                    "TimeToLiveSpecification": {
                        "AttributeName": TTL_ATTRIBUTE,
                        "Enabled": true,
                    },
                    "PointInTimeRecoverySpecification": {
                        "PointInTimeRecoveryEnabled": true,
                    },
                },
            },
        },
    });
    serde_json::to_string_pretty(&template).unwrap_or_default()
}

async fn send_create(client: &Client, url: &DynamoUrl, table: &Table) -> Result<(), StoreError> {
    let built =
        |e: aws_sdk_dynamodb::error::BuildError| table.unavailable_text("create", &e.to_string());
    let attr = |name: &str, kind: ScalarAttributeType| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(kind)
            .build()
            .map_err(built)
    };
    let key = |name: &str, kind: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
            .map_err(built)
    };
    let index = |name: &str, hash: &str, range: &str| {
        GlobalSecondaryIndex::builder()
            .index_name(name)
            .key_schema(key(hash, KeyType::Hash)?)
            .key_schema(key(range, KeyType::Range)?)
            .projection(
                Projection::builder()
                    .projection_type(ProjectionType::All)
                    .build(),
            )
            .build()
            .map_err(built)
    };
    client
        .create_table()
        .table_name(&url.table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attr(PK, ScalarAttributeType::S)?)
        .attribute_definitions(attr("amb", ScalarAttributeType::S)?)
        .attribute_definitions(attr("amb_sk", ScalarAttributeType::S)?)
        .attribute_definitions(attr("due_shard", ScalarAttributeType::S)?)
        .attribute_definitions(attr("due", ScalarAttributeType::N)?)
        .key_schema(key(PK, KeyType::Hash)?)
        .global_secondary_indexes(index(AMBIGUOUS_INDEX, "amb", "amb_sk")?)
        .global_secondary_indexes(index(DUE_INDEX, "due_shard", "due")?)
        .send()
        .await
        .map_err(|e| table.unavailable("create the table", &e))?;
    Ok(())
}

async fn wait_active(client: &Client, url: &DynamoUrl, table: &Table) -> Result<(), StoreError> {
    for _ in 0..600 {
        let desc = client
            .describe_table()
            .table_name(&url.table)
            .send()
            .await
            .map_err(|e| table.unavailable("describe the table", &e))?;
        let active = desc.table.as_ref().is_some_and(|t| {
            t.table_status() == Some(&AwsTableStatus::Active)
                && t.global_secondary_indexes()
                    .iter()
                    .all(|i| i.index_status().is_none_or(|s| s.as_str() == "ACTIVE"))
        });
        if active {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(table.unavailable_text("create", "the table did not become ACTIVE within 60 s"))
}

impl Table {
    fn unavailable_text(&self, what: &str, why: &str) -> StoreError {
        StoreError::Unavailable {
            store: self.label(),
            reason: format!("{what}: {why}"),
        }
    }
}

/// The offset of the local instant an answer arrived at from the server's
/// `Date`, taken at the middle of its second.
fn offset_ms(seen: Option<(std::time::SystemTime, std::time::SystemTime)>) -> Option<i64> {
    let (server, local) = seen?;
    let server = server + std::time::Duration::from_millis(500);
    match local.duration_since(server) {
        Ok(ahead) => i64::try_from(ahead.as_millis()).ok(),
        Err(behind) => i64::try_from(behind.duration().as_millis())
            .ok()
            .map(|ms| -ms),
    }
}

/// Reads the `Date` of an answer and the local time it arrived.
#[derive(Debug, Default)]
struct DateProbe {
    seen: std::sync::Arc<std::sync::Mutex<Option<(std::time::SystemTime, std::time::SystemTime)>>>,
}

impl aws_sdk_dynamodb::config::Intercept for DateProbe {
    fn name(&self) -> &'static str {
        "idem clock probe"
    }

    fn read_before_deserialization(
        &self,
        context: &aws_sdk_dynamodb::config::interceptors::BeforeDeserializationInterceptorContextRef<'_>,
        _components: &aws_sdk_dynamodb::config::RuntimeComponents,
        _cfg: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let local = std::time::SystemTime::now();
        let server = context
            .response()
            .headers()
            .get("date")
            .and_then(|d| httpdate::parse_http_date(d).ok());
        if let (Some(server), Ok(mut seen)) = (server, self.seen.lock()) {
            *seen = Some((server, local));
        }
        Ok(())
    }
}

/// A record item read for a listing: the record, or why it cannot be read.
type Row = (String, Result<Record, DamagedRow>);

/// [`Store::list`](idem_core::Store::list): ambiguous records from their
/// sparse index, every other listing from a scan sorted here.
pub(crate) async fn list(
    table: &Table,
    query: &ListQuery,
    now: Timestamp,
) -> Result<Listing, StoreError> {
    let limit = query.effective_limit();
    let mut rows = match query.state {
        Some(State::Ambiguous) => ambiguous_rows(table, query.after.as_ref(), limit).await?,
        _ => scanned_rows(table).await?,
    };
    rows.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut records = Vec::new();
    let mut damaged = Vec::new();
    let mut last = None;
    let mut taken = 0;
    for (pk, row) in rows {
        if taken >= limit {
            break;
        }
        let Some((scope, key)) = item::split_pk(&pk) else {
            continue;
        };
        let cursor = ListCursor {
            scope: scope.to_owned(),
            key: key.to_owned(),
        };
        if query.after.as_ref().is_some_and(|after| cursor <= *after) {
            continue;
        }
        match row {
            Ok(r) if query.state.is_some_and(|s| r.state_at(now) != s) => continue,
            Ok(r) => records.push(r),
            Err(d) => damaged.push(d),
        }
        taken += 1;
        last = Some(cursor);
    }
    Ok(Listing::page(records, damaged, last, taken, limit))
}

async fn ambiguous_rows(
    table: &Table,
    after: Option<&ListCursor>,
    limit: usize,
) -> Result<Vec<Row>, StoreError> {
    let mut rows = Vec::new();
    let mut start = None;
    loop {
        let page = IndexPage {
            index: AMBIGUOUS_INDEX,
            partition: "amb",
            value: "a",
            sort: "amb_sk",
            cmp: ">=",
            bound: after_bound(after),
            limit: i32::try_from(limit + 1).unwrap_or(i32::MAX),
        };
        let (items, next) = table.query_page(page, start).await?;
        for attrs in &items {
            rows.extend(row_of(table, attrs).await?);
        }
        if next.is_none() || rows.len() > limit {
            return Ok(rows);
        }
        start = next;
    }
}

async fn scanned_rows(table: &Table) -> Result<Vec<Row>, StoreError> {
    let mut rows = Vec::new();
    let mut start = None;
    loop {
        let (items, next) = table.scan_page(start).await?;
        for attrs in &items {
            rows.extend(row_of(table, attrs).await?);
        }
        match next {
            Some(n) => start = Some(n),
            None => return Ok(rows),
        }
    }
}

/// The row of a record item; `None` for the table's other items and for
/// items that hold no record.
async fn row_of(table: &Table, attrs: &Attrs) -> Result<Option<Row>, StoreError> {
    let Some(pk) = get_s(attrs, PK).ok() else {
        return Ok(None);
    };
    let Some(id) = item::id_of_pk(pk) else {
        return Ok(None);
    };
    let read = match id {
        Err(d) => Err(d),
        Ok(id) => match table.load(&id, attrs).await {
            Ok(item) => match item.record {
                Some(record) => Ok(record),
                None => return Ok(None),
            },
            Err(Err(e)) => return Err(e),
            Err(Ok(reason)) => Err(DamagedRow {
                scope: id.scope.as_str().to_owned(),
                key: id.key.as_str().to_owned(),
                reason,
            }),
        },
    };
    Ok(Some((pk.to_owned(), read)))
}

/// The records due for the purge at `now`, longest due first then
/// (scope, key), at most `limit`, from every shard of the due index; and
/// how many index entries could not be read.
pub(crate) async fn due_candidates(
    table: &Table,
    now: Timestamp,
    limit: usize,
) -> Result<(Vec<(u64, idem_core::RecordId)>, u64), StoreError> {
    let mut found = Vec::new();
    let mut damaged = 0;
    for shard in 0..DUE_SHARDS {
        let shard = shard.to_string();
        let page = IndexPage {
            index: DUE_INDEX,
            partition: "due_shard",
            value: &shard,
            sort: "due",
            cmp: "<=",
            bound: Some(n(now.as_millis())),
            limit: i32::try_from(limit).unwrap_or(i32::MAX),
        };
        let (items, _) = table.query_page(page, None).await?;
        for attrs in &items {
            let read = get_s(attrs, PK)
                .ok()
                .and_then(item::id_of_pk)
                .zip(get_n(attrs, "due").ok());
            match read {
                Some((Ok(id), due)) => found.push((due, id)),
                _ => damaged += 1,
            }
        }
    }
    found.sort_by(|a, b| {
        (
            a.0,
            a.1.scope.as_str().as_bytes(),
            a.1.key.as_str().as_bytes(),
        )
            .cmp(&(
                b.0,
                b.1.scope.as_str().as_bytes(),
                b.1.key.as_str().as_bytes(),
            ))
    });
    found.truncate(limit);
    Ok((found, damaged))
}

/// The suspect window's item, at item version `version`.
pub(crate) fn window_attrs(w: &SuspectWindow, version: u64) -> Attrs {
    let mut attrs = HashMap::from([
        (PK.to_owned(), s(WINDOW_PK)),
        ("v".to_owned(), n(version)),
        ("opened_at".to_owned(), n(w.opened_at.as_millis())),
        ("until".to_owned(), n(w.until.as_millis())),
        ("cause".to_owned(), s(&w.cause)),
        ("wv".to_owned(), n(w.version)),
    ]);
    if let Some(since) = w.since {
        attrs.insert("since".to_owned(), n(since.as_millis()));
    }
    attrs
}

/// The suspect window and its item version.
pub(crate) fn window_from(attrs: &Attrs) -> Result<(SuspectWindow, u64), String> {
    let since = match attrs.get("since") {
        None => None,
        Some(_) => Some(Timestamp::from_millis(get_n(attrs, "since")?)),
    };
    let window = SuspectWindow {
        opened_at: Timestamp::from_millis(get_n(attrs, "opened_at")?),
        until: Timestamp::from_millis(get_n(attrs, "until")?),
        since,
        cause: get_s(attrs, "cause")?.to_owned(),
        version: get_n(attrs, "wv")?,
    };
    Ok((window, get_n(attrs, "v")?))
}

/// Where a listing page starts in the ambiguous index.
fn after_bound(after: Option<&ListCursor>) -> Option<aws_sdk_dynamodb::types::AttributeValue> {
    after.map(|c| item::s(item::index_sort_key(&format!("{}\n{}", c.scope, c.key))))
}
