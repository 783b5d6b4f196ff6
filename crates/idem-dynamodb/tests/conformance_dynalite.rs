//! The whole conformance suite on dynalite (npm), started by
//! `scripts/test.sh`.

mod common;

async fn make_store(
    clock: idem_core::ManualClock,
) -> (std::sync::Arc<idem_dynamodb::DynamoStore>, common::Dropped) {
    common::fresh_store(common::Emulator::Dynalite, clock).await
}

idem_conformance::conformance_suite!(make_store);
