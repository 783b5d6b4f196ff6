//! Gateways on DynamoDB: a table of idem's on an emulator (dynalite or
//! moto, started by `scripts/test.sh`), created with `idem store init` as
//! a user would, and the environment an `idem` process needs to reach it.

use std::process::Command;

use idem_testkit::services::Service;

/// What every `idem` process of the tests is given: placeholder
/// credentials, which the emulators accept (AWS would refuse them), and no
/// instance-metadata lookup, which would wait for a server that is not
/// there.
pub const AWS_ENV: &[(&str, &str)] = &[
    ("AWS_ACCESS_KEY_ID", "emulator"),
    ("AWS_SECRET_ACCESS_KEY", "emulator"),
    ("AWS_EC2_METADATA_DISABLED", "true"),
];

/// The emulator `IDEM_TEST_GATEWAY_STORE` names (`dynalite` or `moto`):
/// gateways that a test starts on an SQLite file run on a DynamoDB table of
/// that emulator instead, so that the gateway's black-box tests run
/// unchanged on DynamoDB. Unset or `sqlite`: SQLite, as written.
pub fn gateway_emulator() -> Option<Service> {
    match std::env::var("IDEM_TEST_GATEWAY_STORE").ok()?.as_str() {
        "dynalite" => Some(Service::Dynalite),
        "moto" => Some(Service::Moto),
        "" | "sqlite" => None,
        other => panic!("IDEM_TEST_GATEWAY_STORE={other:?}: use sqlite, dynalite or moto"),
    }
}

/// The store a gateway started on `store_url` uses: the same URL, or, when
/// [`gateway_emulator`] names an emulator and the URL is an SQLite file's,
/// a table named after that file (a gateway started again on the same
/// file meets the same records), created if it is not there.
pub fn gateway_store(store_url: &str) -> String {
    match (gateway_emulator(), store_url.strip_prefix("sqlite://")) {
        (Some(emulator), Some(path)) => table_url(emulator, &table_name(path)),
        _ => store_url.to_owned(),
    }
}

/// A new table of idem's on `emulator`, named after `tag`, and its URL.
pub fn fresh_table(emulator: Service, tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    table_url(
        emulator,
        &format!("idem-{tag}-{}-{nanos}", std::process::id()),
    )
}

fn table_name(path: &str) -> String {
    // FNV-1a of the path: a valid, stable table name per file.
    let hash = path.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("idem-site-{hash:016x}")
}

fn table_url(emulator: Service, table: &str) -> String {
    let url = format!(
        "dynamodb://{table}?region=us-east-1&endpoint={}&clock_skew_ms=50",
        emulator.endpoint()
    );
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["store", "init", "--store", &url])
        .envs(AWS_ENV.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "idem store init --store {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    url
}
