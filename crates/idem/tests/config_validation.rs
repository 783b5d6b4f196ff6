//! A config value that would reach a record, a scope or a header and cannot
//! live there stops `idem serve` at start, naming the file and the field,
//! instead of starting and then refusing every request.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use support::Site;

/// How `idem serve` ended: `Ok(stderr)` when it exited on its own (with its
/// status), `Err(stderr)` when it started listening.
fn serve_outcome(site: &Site, config: &str) -> Result<(std::process::ExitStatus, String), String> {
    let path = site.config(config);
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--upstream", "http://127.0.0.1:9"])
        .arg("--store")
        .arg(format!("sqlite://{}", site.store().display()))
        .arg("--config")
        .arg(&path)
        .env("IDEM_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = Vec::new();
    // Reading stops at EOF (the process exited) or at the line that says it
    // listens: no timer decides the outcome.
    for line in BufReader::new(child.stderr.take().unwrap())
        .lines()
        .map_while(Result::ok)
    {
        let started = line.contains("local_addr=");
        lines.push(line);
        if started {
            let _ = child.kill();
            let _ = child.wait();
            return Err(lines.join("\n"));
        }
    }
    Ok((child.wait().unwrap(), lines.join("\n")))
}

#[test]
fn a_value_that_cannot_reach_the_store_or_a_header_stops_the_start() {
    let long_name = "n".repeat(1000);
    let route =
        |field: &str| format!("[[route]]\nname = \"payouts\"\npath = \"/payouts\"\n{field}\n");
    let admin = "admin_listen = \"127.0.0.1:0\"\n[[admin.operator]]\nname = \"ana\"\n";
    let cases: Vec<(String, &str)> = vec![
        (
            format!(
                "{admin}token_env = \"A1\"\n[[admin.operator]]\nname = \"ana\"\ntoken_env = \"A2\""
            ),
            "idem.toml: admin.operator[1].name: \"ana\" is also the name of admin.operator[0]",
        ),
        (
            format!("{admin}token_env = \"IDEM_TEST_TOKEN_NEVER_SET\""),
            "idem.toml: admin.operator[0].token_env: the admin API is enabled but the environment variable IDEM_TEST_TOKEN_NEVER_SET is not set",
        ),
        ("owner = \"node\\u0007one\"".into(), "idem.toml: owner:"),
        (
            format!("owner = \"{}\"", "o".repeat(256)),
            "idem.toml: owner:",
        ),
        ("owner = \"\"".into(), "idem.toml: owner:"),
        ("region = \"eu west\"".into(), "idem.toml: region:"),
        (
            format!("region = \"{}\"", "r".repeat(65)),
            "idem.toml: region:",
        ),
        (
            "[[route]]\nname = \"pay\\u0000outs\"".into(),
            "idem.toml: route[0].name:",
        ),
        (
            "[[route]]\nname = \"pay\\nouts\"".into(),
            "idem.toml: route[0].name:",
        ),
        (
            format!("[[route]]\nname = \"{long_name}\""),
            "idem.toml: route[0].name:",
        ),
        (
            "[[route]]\nname = \"a|b\"".into(),
            "idem.toml: route[0].name:",
        ),
        (
            // No name: the operation is "METHODS path", and this one holds the separator.
            "[[route]]\nmethods = [\"A|B\"]\npath = \"/payouts\"".into(),
            "idem.toml: route[0].name:",
        ),
        (
            route("forward_key = { template = \"{key}\\u0001\" }"),
            "idem.toml: route[0].forward_key.template:",
        ),
        (
            route("forward_key = { template = \"{key}\\r\\nx-evil: 1\" }"),
            "idem.toml: route[0].forward_key.template:",
        ),
        (
            route("forward_key = { template = \"é-{key}\" }"),
            "idem.toml: route[0].forward_key.template:",
        ),
        (
            route("forward_key = { template = \" {key}\" }"),
            "idem.toml: route[0].forward_key.template:",
        ),
        (
            route("forward_key = { header = \"x key\" }"),
            "idem.toml: route[0].forward_key.header:",
        ),
        (
            route("key_header = \"idempotency-key:\""),
            "idem.toml: route[0].key_header:",
        ),
        (
            route("summary_fields = [\"seller_id\"]"),
            "idem.toml: route[0].summary_fields:",
        ),
        (
            route(&format!(
                "summary_fields = [{}]",
                (0..17)
                    .map(|i| format!("\"/f{i}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            "idem.toml: route[0].summary_fields:",
        ),
        (
            route("principal = { header = \"x tenant\" }"),
            "idem.toml: route[0].principal.header:",
        ),
        (
            route("principal = { header = \"Authorization\" }"),
            "idem.toml: route[0].principal.header:",
        ),
        (
            route("principal = { credential_headers = [] }"),
            "idem.toml: route[0].principal.credential_headers:",
        ),
        (
            route(
                "principal_headers = [\"authorization\"]\nprincipal = { header = \"x-tenant-id\" }",
            ),
            "idem.toml: route[0].principal_headers:",
        ),
        (
            route(
                "principal = { jwt = { keys = \"missing.json\", issuer = \"i\", audience = \"a\", algorithms = [\"EdDSA\"] } }",
            ),
            "idem.toml: route[0].principal.jwt.keys:",
        ),
        (
            route(
                "principal = { jwt = { keys = \"keys.json\", issuer = \"i\", audience = \"a\", algorithms = [\"none\"] } }",
            ),
            "idem.toml: route[0].principal.jwt.algorithms:",
        ),
        (
            route(
                "principal = { jwt = { keys = \"keys.json\", issuer = \"i\", audience = \"a\", algorithms = [\"HS256\"] } }",
            ),
            "idem.toml: route[0].principal.jwt.algorithms:",
        ),
        (
            route(
                "principal = { jwt = { keys = \"keys.json\", issuer = \"i\", audience = \"a\", algorithms = [] } }",
            ),
            "idem.toml: route[0].principal.jwt.algorithms:",
        ),
        (
            route(
                "principal = { jwt = { claim = \"\", keys = \"keys.json\", issuer = \"i\", audience = \"a\", algorithms = [\"EdDSA\"] } }",
            ),
            "idem.toml: route[0].principal.jwt.claim:",
        ),
        (
            route(
                "principal = { jwt = { keys = \"not-keys.json\", issuer = \"i\", audience = \"a\", algorithms = [\"EdDSA\"] } }",
            ),
            "idem.toml: route[0].principal.jwt.keys:",
        ),
    ];
    let mut wrong = Vec::new();
    for (config, expect) in cases {
        let site = Site::new();
        // A key set that is valid, and a file that is no key set at all.
        std::fs::write(
            site.dir.path().join("keys.json"),
            r#"{"keys":[{"kty":"OKP","crv":"Ed25519","x":"gszAgTtGafU_QmHJCCuCgBJ-BaF3O7QfzwQHqZCiFtI"}]}"#,
        )
        .unwrap();
        std::fs::write(site.dir.path().join("not-keys.json"), "{\"keys\": 7}").unwrap();
        match serve_outcome(&site, &config) {
            Err(_) => wrong.push(format!("{config:?} started")),
            Ok((status, stderr)) if status.success() || !stderr.contains(expect) => {
                wrong.push(format!("{config:?}: want {expect:?} in {stderr}"));
            }
            Ok(_) if site.store().exists() => wrong.push(format!("{config:?} opened the store")),
            Ok(_) => {}
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// `idem consume` refuses a lease, retention or tombstone out of range
/// naming the file and that setting, in words.
#[test]
fn a_consumer_policy_out_of_range_names_the_file_and_its_own_field() {
    let config = |setting: &str| {
        format!(
            "store = \"sqlite://idem.db\"\n\
             [[subscription]]\nname = \"payouts\"\nkey = \"payout:{{/seller_id}}\"\n\
             deliver = \"http://127.0.0.1:9/payouts\"\n{setting}\n\
             [subscription.rabbitmq]\nqueue = \"idem-config-never-declared\"\n"
        )
    };
    let cases = [
        (
            "retention_s = 0",
            "subscription[0].retention_s: retention_s = 0 is out of range",
        ),
        (
            "retention_s = 99999999999",
            "subscription[0].retention_s: retention_s = 99999999999 is out of range",
        ),
        (
            "lease_ms = 10",
            "subscription[0].lease_ms: lease_ms = 10 is out of range",
        ),
        (
            "retention_s = 600\ntombstone_s = 60",
            "subscription[0].tombstone_s: tombstone_s = 60 must be at least retention_s (600)",
        ),
    ];
    let mut wrong = Vec::new();
    for (setting, expect) in cases {
        let site = Site::new();
        let path = site.config(&config(setting));
        let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["consume", "--config"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A config loaded by mistake would consume forever: stop it.
        let started = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > std::time::Duration::from_secs(20) {
                child.kill().unwrap();
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let want = format!("{}: {expect}", path.display());
        if out.status.success() || !stderr.contains(&want) || stderr.contains("OutOfRange") {
            wrong.push(format!("{setting:?}: want {want:?} in {stderr}"));
        } else if site.store().exists() {
            wrong.push(format!("{setting:?} opened the store"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
