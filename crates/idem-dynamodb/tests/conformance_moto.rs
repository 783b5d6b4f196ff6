//! The whole conformance suite on moto in server mode (PyPI), started by
//! `scripts/test.sh`.

mod common;

async fn make_store(
    clock: idem_core::ManualClock,
) -> (std::sync::Arc<idem_dynamodb::DynamoStore>, common::Dropped) {
    common::fresh_store(common::Emulator::Moto, clock).await
}

idem_conformance::conformance_suite!(make_store);
