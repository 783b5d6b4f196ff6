//! The table: the client and the few requests the store makes (a
//! consistent read, a conditional put or delete, index queries, a scan),
//! each failure said as a [`StoreError`] naming the table.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, ReturnConsumedCapacity, ReturnValuesOnConditionCheckFailure,
};
use idem_core::{RecordId, StoreError, error_causes};

use crate::item::{self, Item, PK, Payload, n, s};
use crate::usage::{Request, Usage};

pub use crate::item::Attrs;

/// The table a store writes, and what to call it in messages.
#[derive(Clone)]
pub struct Table {
    pub(crate) client: Client,
    pub(crate) name: String,
    /// The URL the store was opened with, for the commands a message
    /// suggests.
    pub(crate) url: crate::DynamoUrl,
    /// The requests made and the capacity they consumed.
    pub(crate) usage: std::sync::Arc<Usage>,
}

/// Why a conditional write did not apply.
pub enum WriteRefused {
    /// The condition failed: here is the item as DynamoDB found it, when it
    /// said (`None`: it did not say, or there is no item).
    Condition(Option<Attrs>),
    /// The write failed or its answer was lost: it may or may not have
    /// applied.
    Store(StoreError),
}

impl Table {
    /// `dynamodb://TABLE`, as messages name the store.
    pub fn label(&self) -> String {
        format!("dynamodb://{}", self.name)
    }

    /// The item with partition key `pk`, read with `ConsistentRead`.
    pub async fn get(&self, pk: &str) -> Result<Option<Attrs>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.name)
            .key(PK, s(pk))
            .consistent_read(true)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| self.unavailable("read", &e))?;
        self.usage.count(Request::Read, out.consumed_capacity());
        Ok(out.item)
    }

    /// A record's item from its attributes, its payload read from its
    /// chunk items where it has them (with `ConsistentRead`: they were
    /// written before the item that names them). The error names what
    /// cannot be read, or is the failed read.
    pub async fn load(
        &self,
        id: &RecordId,
        attrs: &Attrs,
    ) -> Result<Item, Result<String, StoreError>> {
        let (mut item, payload) = item::from_attributes(id, attrs).map_err(Ok)?;
        let bytes = match payload {
            Payload::None => return Ok(item),
            Payload::Inline(bytes) => bytes,
            Payload::Chunks { write_id, count } => {
                let mut bytes = Vec::new();
                for i in 0..count {
                    let pk = item::chunk_pk(&write_id, usize::try_from(i).unwrap_or(usize::MAX));
                    let chunk = self.get(&pk).await.map_err(Err)?;
                    match chunk.as_ref().and_then(|c| c.get("b")) {
                        Some(AttributeValue::B(b)) => bytes.extend_from_slice(b.as_ref()),
                        _ => return Err(Ok(format!("payload chunk {pk:?} is missing"))),
                    }
                }
                bytes
            }
        };
        item::attach(&mut item, &bytes).map_err(Ok)?;
        Ok(item)
    }

    /// Writes an item no one else writes (a payload chunk), unconditionally.
    pub async fn put(&self, item: Attrs) -> Result<(), StoreError> {
        let out = self
            .client
            .put_item()
            .table_name(&self.name)
            .set_item(Some(item))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| self.unavailable("write a payload chunk", &e))?;
        self.usage.count(Request::Write, out.consumed_capacity());
        Ok(())
    }

    /// Writes `item` if the stored item is at version `version` (0: if
    /// there is none).
    pub async fn put_if(&self, item: Attrs, version: u64) -> Result<(), WriteRefused> {
        let mut put = self
            .client
            .put_item()
            .table_name(&self.name)
            .set_item(Some(item))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        put = if version == 0 {
            put.condition_expression("attribute_not_exists(pk)")
        } else {
            put.condition_expression("v = :v")
                .expression_attribute_values(":v", n(version))
        };
        match put.send().await {
            Ok(out) => {
                self.usage.count(Request::Write, out.consumed_capacity());
                Ok(())
            }
            Err(SdkError::ServiceError(e)) => match e.into_err() {
                PutItemError::ConditionalCheckFailedException(c) => {
                    self.usage.failed_condition();
                    Err(WriteRefused::Condition(c.item))
                }
                other => Err(WriteRefused::Store(self.refused("write", &other))),
            },
            Err(e) => Err(WriteRefused::Store(self.unavailable("write", &e))),
        }
    }

    /// Deletes the item with partition key `pk` if it is at `version`.
    pub async fn delete_if(&self, pk: &str, version: u64) -> Result<(), WriteRefused> {
        let sent = self
            .client
            .delete_item()
            .table_name(&self.name)
            .key(PK, s(pk))
            .condition_expression("v = :v")
            .expression_attribute_values(":v", n(version))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match sent {
            Ok(out) => {
                self.usage.count(Request::Write, out.consumed_capacity());
                Ok(())
            }
            Err(SdkError::ServiceError(e)) => match e.into_err() {
                DeleteItemError::ConditionalCheckFailedException(c) => {
                    self.usage.failed_condition();
                    Err(WriteRefused::Condition(c.item))
                }
                other => Err(WriteRefused::Store(self.refused("delete", &other))),
            },
            Err(e) => Err(WriteRefused::Store(self.unavailable("delete", &e))),
        }
    }

    /// One page of an index query: items whose partition attribute
    /// `partition` is `value` and whose sort attribute `sort` satisfies
    /// `cmp` against `bound` (`>=` or `<=`) when there is one, in the index's
    /// order.
    pub async fn query_page(
        &self,
        page: IndexPage<'_>,
        start: Option<Attrs>,
    ) -> Result<(Vec<Attrs>, Option<Attrs>), StoreError> {
        let mut query = self
            .client
            .query()
            .table_name(&self.name)
            .index_name(page.index)
            .expression_attribute_names("#p", page.partition)
            .expression_attribute_values(":p", s(page.value))
            .set_exclusive_start_key(start)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .limit(page.limit);
        // DynamoDB refuses an empty string as a key value, even in a
        // condition (dynalite lets it pass): no bound, no sort condition.
        query = match page.bound {
            Some(bound) => query
                .key_condition_expression(format!("#p = :p AND #s {} :b", page.cmp))
                .expression_attribute_names("#s", page.sort)
                .expression_attribute_values(":b", bound),
            None => query.key_condition_expression("#p = :p"),
        };
        let out = query
            .send()
            .await
            .map_err(|e| self.unavailable("query", &e))?;
        self.usage.count(Request::Query, out.consumed_capacity());
        Ok((out.items.unwrap_or_default(), out.last_evaluated_key))
    }

    /// One page of a scan of the whole table.
    pub async fn scan_page(
        &self,
        start: Option<Attrs>,
    ) -> Result<(Vec<Attrs>, Option<Attrs>), StoreError> {
        let out = self
            .client
            .scan()
            .table_name(&self.name)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| self.unavailable("scan", &e))?;
        self.usage.count(Request::Scan, out.consumed_capacity());
        Ok((out.items.unwrap_or_default(), out.last_evaluated_key))
    }

    /// A request that did not get a useful answer: the table is unavailable
    /// (the write may or may not have applied).
    pub fn unavailable<E, R>(&self, what: &str, e: &SdkError<E, R>) -> StoreError
    where
        E: std::error::Error + ProvideErrorMetadata + 'static,
        R: std::fmt::Debug,
    {
        StoreError::Unavailable {
            store: self.label(),
            reason: format!("{what}: {}", said(e)),
        }
    }

    fn refused<E: ProvideErrorMetadata>(&self, what: &str, e: &E) -> StoreError {
        StoreError::Unavailable {
            store: self.label(),
            reason: format!("{what}: {}", service_said(e)),
        }
    }
}

/// What a failed request said, in one line: DynamoDB's error code and
/// message, or why no answer came.
pub fn said<E, R>(e: &SdkError<E, R>) -> String
where
    E: std::error::Error + ProvideErrorMetadata + 'static,
    R: std::fmt::Debug,
{
    match e {
        SdkError::ServiceError(s) => service_said(s.err()),
        SdkError::TimeoutError(_) => "no answer in time (the request may have been applied)".into(),
        SdkError::DispatchFailure(d) => {
            let why = if d.is_io() {
                "the connection failed"
            } else if d.is_timeout() {
                "connecting timed out"
            } else {
                "the request could not be sent"
            };
            format!("{why}: {}", error_causes(e))
        }
        SdkError::ResponseError(_) => {
            format!(
                "the answer could not be read (the request may have been applied): {}",
                error_causes(e)
            )
        }
        other => error_causes(other),
    }
}

fn service_said<E: ProvideErrorMetadata>(e: &E) -> String {
    match (e.code(), e.message()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_owned(),
        (None, Some(message)) => message.to_owned(),
        (None, None) => "an error without a code".to_owned(),
    }
}

/// What [`Table::query_page`] asks an index for.
pub struct IndexPage<'a> {
    /// The index.
    pub index: &'a str,
    /// Its partition attribute and the value wanted.
    pub partition: &'a str,
    /// The partition's value.
    pub value: &'a str,
    /// Its sort attribute.
    pub sort: &'a str,
    /// `>=` or `<=`.
    pub cmp: &'a str,
    /// The sort attribute's bound, if any.
    pub bound: Option<AttributeValue>,
    /// At most this many items.
    pub limit: i32,
}
