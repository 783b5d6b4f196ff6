//! The idem contract inside AWS Lambda functions, on the official Rust
//! runtime (`lambda_runtime`, `lambda_http`, `aws_lambda_events`): what
//! Powertools' idempotency utility does for Python, Java and TypeScript,
//! with idem's guarantees (docs/lambda.md).
//!
//! - [`SqsRunOnce`]: an SQS-triggered function runs each record of its
//!   batch through [`idem_message::RunOnce`] and answers with the batch item
//!   failures naming exactly the records that must come back.
//! - [`IdempotencyLayer`]: idem-http's layer over lambda_http's requests,
//!   for functions behind API Gateway, a function URL or an ALB.
//! - [`SqsQueue`] (feature `sqs-queue`, on by default): a dead-letter or
//!   late queue of the function's own, over aws-sdk-sqs.
//! - [`lease_ms_max`]: a record's lease never outlasts the invocation that
//!   claimed it (its `Context` deadline, less a margin).
//!
//! The store is built once per execution environment, in `main` before
//! `lambda_runtime::run`, and shared by `Arc` with every invocation; the
//! attempt itself is `idem_attempt::Driver`'s, as everywhere else: this
//! crate calls no store step of its own.

mod http;
mod sqs;
#[cfg(feature = "sqs-queue")]
mod sqs_queue;

pub use http::{Buffered, Idempotency, IdempotencyLayer};
pub use sqs::{
    CONCURRENCY_DEFAULT, DEADLINE_MARGIN_MS_DEFAULT, MESSAGE_GROUP_ID, RecordReport, RejectQueue,
    RejectedTo, SqsRunOnce, Verdict, batch_response, lease_ms_max,
};
#[cfg(feature = "sqs-queue")]
pub use sqs_queue::{REASON_ATTRIBUTE, REASON_DETAIL_ATTRIBUTE, SqsQueue};
