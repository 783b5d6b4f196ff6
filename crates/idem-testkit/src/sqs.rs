//! An SQS client of the moto emulator (its endpoint from
//! [`Service::Moto`]): plain HTTP, the placeholder credentials moto
//! accepts and AWS refuses, region `us-east-1`.

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};

use crate::services::Service;

/// A client of moto at `endpoint`.
pub fn client_at(endpoint: &str) -> Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new(
            "emulator",
            "emulator",
            None,
            None,
            "idem-tests",
        ))
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    Client::from_conf(config)
}

/// A client of the moto the tests use; fails the test when it does not
/// answer (see [`Service::endpoint`]).
pub fn client() -> Client {
    client_at(&Service::Moto.endpoint())
}
