//! `idem serve --check` and `idem consume --check`, black-box: the whole
//! configuration is loaded and judged, what would run is printed, and the
//! exit code says whether it would start; nothing with an effect is
//! opened (no store file, no bound port, no broker connection); an
//! `amqps://` broker on a system with no trusted roots is refused.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{Site, text};

const TOKEN: &str = "admin-token-0123456789abcdef";

fn idem_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_ADMIN_TOKEN")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn serve_check_prints_what_would_be_served_and_opens_nothing() {
    let site = Site::new();
    // The address is taken: a check that bound it would fail.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let config = site.config(&format!(
        r#"
listen = "{listen}"
upstream = "http://127.0.0.1:9"
store = "sqlite://never-opened.db"
admin_listen = "127.0.0.1:0"

[[route]]
name = "create-payout"
methods = ["POST"]
path = "/payouts"
principal = {{ header = "x-tenant" }}

[[route]]
name = "refund"
methods = ["POST", "PATCH"]
path = "/refunds/{{id}}"
lease_ms = 60000
"#
    ));
    let config = config.to_str().unwrap();
    let out = idem_env(
        &["serve", "--check", "--config", config],
        &[("IDEM_ADMIN_TOKEN", TOKEN)],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    for part in [
        format!("listen     http://{listen}"),
        "upstream   http://127.0.0.1:9/".to_owned(),
        "never-opened.db".to_owned(),
        "admin      http://127.0.0.1:0 (operators: admin from $IDEM_ADMIN_TOKEN".to_owned(),
        "routes     2".to_owned(),
        "\"create-payout\": POST /payouts, key from idempotency-key".to_owned(),
        "\"refund\": POST,PATCH /refunds/{id}".to_owned(),
        "lease 60000 ms".to_owned(),
        "never-opened.db (no file yet: a start creates it)".to_owned(),
        "not checked:".to_owned(),
        format!("bind       listen {listen} (a start binds it)"),
        "bind       admin_listen 127.0.0.1:0 (a start binds it)".to_owned(),
        "reach      upstream http://127.0.0.1:9/".to_owned(),
    ] {
        assert!(stdout.contains(&part), "{part:?} is not printed:\n{stdout}");
    }
    assert!(
        !stdout.contains(TOKEN) && !stderr.contains(TOKEN),
        "the token is shown"
    );
    assert!(
        !site.dir.path().join("never-opened.db").exists(),
        "the check opened the store"
    );

    // Without the admin token's variable it would not start: exit 1.
    let out = idem_env(&["serve", "--check", "--config", config], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("IDEM_ADMIN_TOKEN"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn serve_check_fails_on_a_typo_naming_the_file_and_the_field() {
    let site = Site::new();
    let config = site.config("upstream = \"http://127.0.0.1:9\"\nretention_sec = 60\n");
    let out = idem_env(
        &["serve", "--check", "--config", config.to_str().unwrap()],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&config.display().to_string()), "{stderr}");
    assert!(stderr.contains("retention_sec"), "{stderr}");
    assert!(
        text(&out.stdout).is_empty(),
        "a plan was printed for a config that fails"
    );
}

#[test]
fn consume_check_prints_what_would_be_consumed_with_no_broker_and_no_password() {
    let site = Site::new();
    // Nobody listens on the broker's port: a check that connected would fail.
    let port = idem_testkit::free_port().unwrap();
    let config = site.config(&format!(
        r#"
store = "sqlite://never-opened.db"

[[subscription]]
name = "payouts"
key = "payout:{{/seller_id}}:{{/settlement_id}}"
deliver = "http://127.0.0.1:9/payouts"

[subscription.nats]
url = "nats://payer:s3cret@127.0.0.1:{port}"
stream = "PAYOUTS"
subjects = ["payouts.>"]

[[subscription]]
name = "refunds"
key = "refund:{{header:refund-id}}"
deliver = "http://127.0.0.1:9/refunds"

[subscription.rabbitmq]
url = "amqp://payer:s3cret@127.0.0.1:{port}/%2f"
queue = "refunds"
"#
    ));
    let out = idem_env(
        &["consume", "--check", "--config", config.to_str().unwrap()],
        &[],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    for part in [
        "never-opened.db".to_owned(),
        "subscriptions  2".to_owned(),
        format!(
            "\"payouts\": nats stream PAYOUTS (payouts.>) durable idem at nats://payer:***@127.0.0.1:{port}"
        ),
        "key \"payout:{/seller_id}:{/settlement_id}\"".to_owned(),
        format!("\"refunds\": rabbitmq queue refunds at amqp://payer:***@127.0.0.1:{port}/%2f"),
        "delivered to http://127.0.0.1:9/refunds".to_owned(),
        "never-opened.db (no file yet: a start creates it)".to_owned(),
        "not checked:".to_owned(),
        "connect    subscription \"payouts\": nats stream PAYOUTS".to_owned(),
        "connect    subscription \"refunds\": rabbitmq queue refunds".to_owned(),
    ] {
        assert!(stdout.contains(&part), "{part:?} is not printed:\n{stdout}");
    }
    assert!(
        !stdout.contains("s3cret") && !stderr.contains("s3cret"),
        "a password is shown"
    );
    assert!(
        !site.dir.path().join("never-opened.db").exists(),
        "the check opened the store"
    );

    // A key built from the message id would be refused at start: exit 1.
    let text_of = std::fs::read_to_string(&config)
        .unwrap()
        .replace("refund:{header:refund-id}", "refund:{message_id}");
    let bad = site.config(&text_of);
    let out = idem_env(
        &["consume", "--check", "--config", bad.to_str().unwrap()],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("consumer.key_source"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn consume_check_refuses_amqps_on_a_system_without_trusted_roots() {
    let site = Site::new();
    let config = site.config(
        r#"
store = "sqlite://never-opened.db"

[[subscription]]
name = "refunds"
key = "refund:{header:refund-id}"
deliver = "http://127.0.0.1:9/refunds"

[subscription.rabbitmq]
url = "amqps://payer:s3cret@rabbit.internal/%2f"
queue = "refunds"
"#,
    );
    let args = ["consume", "--check", "--config", config.to_str().unwrap()];
    // The system's store as the two variables replace it: one CA, or an
    // empty bundle and an empty directory, as a system without any.
    let pki = idem_testkit::tls::Pki::write(site.dir.path()).unwrap();
    let (file, dir) = (
        site.dir.path().join("no-roots.pem"),
        site.dir.path().join("no-roots"),
    );
    std::fs::write(&file, "").unwrap();
    std::fs::create_dir(&dir).unwrap();
    let roots = |bundle: &std::path::Path| {
        idem_env(
            &args,
            &[
                ("SSL_CERT_FILE", bundle.to_str().unwrap()),
                ("SSL_CERT_DIR", dir.to_str().unwrap()),
            ],
        )
    };
    let out = roots(&pki.ca);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = roots(&file);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for part in [
        "subscription[0].rabbitmq.url",
        "ca-certificates",
        "SSL_CERT_FILE",
    ] {
        assert!(stderr.contains(part), "{part}: {stderr}");
    }
    assert!(!stderr.contains("s3cret"), "{stderr}");
}

/// Whatever a start refuses before it binds an address or reaches a
/// server, `--check` refuses too, in the same words, naming the file and
/// the field: a store path whose directory is missing, a directory, a file
/// that is not an idem store, a `synchronous` route on one SQLite file, an
/// owner the store would refuse. The checks create no store file.
#[test]
fn a_check_refuses_what_a_start_refuses_in_the_same_words() {
    let site = Site::new();
    let dir = site.dir.path();
    std::fs::create_dir(dir.join("a-directory.db")).unwrap();
    let list = b"not a database, a shopping list\n".repeat(100);
    std::fs::write(dir.join("list.db"), list).unwrap();
    let gateway = |store: &str, more: &str| {
        format!(
            "upstream = \"http://127.0.0.1:9\"\nlisten = \"127.0.0.1:0\"\n\
             store = \"{store}\"\n{more}"
        )
    };
    // Nobody listens on the broker's port: a start never gets that far.
    let port = idem_testkit::free_port().unwrap();
    let consumer = |store: &str, more: &str| {
        format!(
            "store = \"{store}\"\n{more}\n[[subscription]]\nname = \"payouts\"\n\
             key = \"payout:{{/id}}\"\ndeliver = \"http://127.0.0.1:9/payouts\"\n\
             [subscription.nats]\nurl = \"nats://127.0.0.1:{port}\"\n\
             stream = \"PAYOUTS\"\nsubjects = [\"payouts.>\"]\n"
        )
    };
    let synchronous = "[[route]]\nname = \"payouts\"\npath = \"/payouts\"\nregions = { mode = \"synchronous\" }\n";
    let cases: [(&str, String, &[&str]); 8] = [
        (
            "serve",
            gateway("sqlite://no-such-dir/idem.db", ""),
            &["store: ", "no-such-dir does not exist"],
        ),
        (
            "serve",
            gateway("sqlite://a-directory.db", ""),
            &["store: ", "a-directory.db", "is a directory"],
        ),
        (
            "serve",
            gateway("sqlite://list.db", ""),
            &["store: ", "list.db", "not an idem database"],
        ),
        (
            "serve",
            gateway("sqlite://idem.db", synchronous),
            &["route[0].regions.mode: ", "one SQLite file on one machine"],
        ),
        (
            "consume",
            consumer("sqlite://no-such-dir/idem.db", ""),
            &["store: ", "no-such-dir does not exist"],
        ),
        (
            "consume",
            consumer("sqlite://a-directory.db", ""),
            &["store: ", "a-directory.db", "is a directory"],
        ),
        (
            "consume",
            consumer("sqlite://list.db", ""),
            &["store: ", "list.db", "not an idem database"],
        ),
        (
            "consume",
            consumer("sqlite://idem.db", "owner = \"night\\u0007shift\""),
            &["owner: ", "control characters"],
        ),
    ];
    let mut refused = Vec::new();
    for (i, (command, toml, names)) in cases.iter().enumerate() {
        let file = dir.join(format!("case-{i}.toml"));
        std::fs::write(&file, toml).unwrap();
        let file = file.to_str().unwrap().to_owned();
        let out = idem_env(&[command, "--check", "--config", &file], &[]);
        assert_eq!(out.status.code(), Some(1), "{i}: {}", text(&out.stdout));
        let error = error_line(&out);
        assert!(
            error.starts_with(&format!("error: {file}: ")),
            "{i}: {error}"
        );
        for name in *names {
            assert!(error.contains(name), "{i}: {name:?} is not named: {error}");
        }
        refused.push((command, file, error));
    }
    assert!(!dir.join("idem.db").exists(), "a check created the store");
    for (i, (command, file, error)) in refused.into_iter().enumerate() {
        let out = start(&[command, "--config", &file]);
        assert_eq!(out.status.code(), Some(1), "{i}: {}", text(&out.stderr));
        assert_eq!(error_line(&out), error, "{i}: a start says otherwise");
    }
}

/// The line `idem` ends with when it refuses to run.
fn error_line(out: &Output) -> String {
    let stderr = text(&out.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(lines.len(), 1, "one error line: {stderr}");
    lines[0].to_owned()
}

/// Starts `idem` for real, and waits 30 s at most for it to stop: a start
/// that does not refuse fails the test.
fn start(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_ADMIN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("{args:?} started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}
