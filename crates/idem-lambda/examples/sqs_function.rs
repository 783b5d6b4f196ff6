//! An SQS-triggered function, as docs/lambda.md shows it: the store is
//! built once per execution environment, and every invocation runs its
//! batch's records at most once per intent, answering with the records
//! that must come back. `IDEM_STORE` names the table
//! (`dynamodb://TABLE?region=…`), made once with `idem store init`.

use std::sync::Arc;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use idem_core::{AttemptOutcome, CompletionTable, Dedup, Policy, Scope, SystemClock};
use idem_dynamodb::{DynamoStore, DynamoUrl};
use idem_lambda::SqsRunOnce;
use idem_message::{Attempt, IntentSpec, KeyTemplate, PayloadFingerprint, Reply, RunOnce};
use lambda_runtime::{Error, LambdaEvent, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    // Once per execution environment.
    let url = DynamoUrl::parse(&std::env::var("IDEM_STORE")?)?;
    let store = Arc::new(DynamoStore::open(&url, Arc::new(SystemClock)).await?);
    let runner = RunOnce::new(
        store,
        Policy::DEFAULT,
        CompletionTable::new([], Dedup::Idem)?,
    );
    let spec = IntentSpec::new(
        Scope::from_parts("payouts", "settlement-service", None)?,
        KeyTemplate::parse("payout:{/seller_id}:{/settlement_id}")?,
        PayloadFingerprint::json(vec!["/sent_at".parse()?]),
    );
    let payouts = Arc::new(SqsRunOnce::new(runner, spec));

    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| {
        let payouts = payouts.clone();
        async move { Ok::<SqsBatchResponse, Error>(payouts.handle(event, pay).await) }
    }))
    .await
}

/// The effect: call the provider with `attempt.id.key` as its idempotency
/// key, and give any timeout of its own at most `attempt.deadline`.
async fn pay(record: SqsMessage, attempt: Attempt) -> Result<Reply, AttemptOutcome> {
    tracing::info!(key = %attempt.id.key, message_id = ?record.message_id, "paying");
    Ok(Reply::status(201))
}
