//! The `idem` command as an operator runs it: exit codes, messages that name
//! the file and the field, and records on real SQLite files.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use support::{idem, text};

#[test]
fn records_list_on_missing_fresh_and_garbage_stores() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    let url = format!("sqlite://{}", missing.display());
    let out = idem(&["records", "list", "--store", &url, "--format", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "[]");
    assert!(!missing.exists(), "listing must not create a store");

    let fresh = dir.path().join("fresh.db");
    std::fs::write(&fresh, b"").unwrap();
    let out = idem(&[
        "records",
        "list",
        "--store",
        &format!("sqlite://{}", fresh.display()),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("no records"));

    let garbage = dir.path().join("garbage.db");
    std::fs::write(
        &garbage,
        b"this is not a database, it is a shopping list\n".repeat(100),
    )
    .unwrap();
    let out = idem(&[
        "records",
        "list",
        "--store",
        &format!("sqlite://{}", garbage.display()),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&garbage.display().to_string()) && err.contains("not an idem database"),
        "{err}"
    );
}

#[test]
fn bad_arguments_name_what_is_wrong() {
    let cases: [(&[&str], &str); 8] = [
        (
            &["records", "list", "--store", "mysql://x/y"],
            "has scheme \"mysql\"",
        ),
        (
            &["records", "list", "--store", "postgres://x/y"],
            "names no user",
        ),
        (
            &["records", "list", "--state", "done"],
            "unknown state \"done\"",
        ),
        (&["records", "show", "a|b", "bad key"], "invalid key"),
        (&["serve"], "upstream: is required"),
        (
            &["serve", "--upstream", "ftp://x"],
            "must be an http:// or https:// URL",
        ),
        (
            &[
                "serve",
                "--upstream",
                "https://127.0.0.1:9",
                "--upstream-ca-file",
                "missing-ca.pem",
            ],
            "upstream_ca_file: cannot read missing-ca.pem",
        ),
        (
            &[
                "serve",
                "--upstream",
                "http://127.0.0.1:9",
                "--admin-tls-cert-file",
                "cert.pem",
            ],
            "admin_tls_key_file: is required with admin_tls_cert_file",
        ),
    ];
    for (args, expect) in cases {
        let out = idem(args);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            text(&out.stderr).contains(expect),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn serve_refuses_a_config_with_a_typo_naming_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        "upstream = \"http://127.0.0.1:9\"\n[[route]]\nretention_sec = 60\n",
    )
    .unwrap();
    let out = idem(&["serve", "--config", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("gateway.toml: line 3, column 1: unknown field `retention_sec`"),
        "{err}"
    );
}

#[test]
fn serve_refuses_a_store_it_cannot_create() {
    let out = idem(&[
        "serve",
        "--upstream",
        "http://127.0.0.1:9",
        "--store",
        "sqlite:///nonexistent-dir/x/idem.db",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("/nonexistent-dir/x/idem.db"), "{err}");
}

/// Every command that takes a store refuses a bad URL before it opens,
/// binds or connects anything, naming the file and field, or the flag, and
/// saying what to write; a password never shows.
#[test]
fn a_bad_store_url_stops_every_command_naming_where_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let gateway = |store: &str| {
        format!(
            "upstream = \"http://127.0.0.1:9\"\nlisten = \"127.0.0.1:0\"\nstore = \"{store}\"\n"
        )
    };
    let consumer = |store: &str| {
        format!(
            "store = \"{store}\"\n[[subscription]]\nname = \"payouts\"\n\
             key = \"payout:{{/id}}\"\ndeliver = \"http://127.0.0.1:9/payouts\"\n\
             [subscription.rabbitmq]\nqueue = \"payouts\"\n"
        )
    };
    let good = format!("sqlite://{}", dir.path().join("good.db").display());
    let bad = [
        (
            "sqlite:/x",
            "the URL lacks the // after \"sqlite:\"; write sqlite:///x",
        ),
        (
            "mysql://app:s3cret@h/db",
            "\"mysql://app:***@h/db\" has scheme \"mysql\"",
        ),
        (
            "postgres://app:s3cret@h/db?bogus=1",
            "invalid PostgreSQL URL postgres://app:***@h/db?bogus=1: ",
        ),
    ];
    for (i, (url, says)) in bad.into_iter().enumerate() {
        let serve_toml = write(&format!("serve-{i}.toml"), gateway(url));
        let good_serve = write(&format!("good-serve-{i}.toml"), gateway(&good));
        let consume_toml = write(&format!("consume-{i}.toml"), consumer(url));
        let good_consume = write(&format!("good-consume-{i}.toml"), consumer(&good));
        let runs: [(Vec<&str>, String); 7] = [
            (
                vec!["serve", "--config", &serve_toml],
                format!("{serve_toml}: store: {says}"),
            ),
            (
                vec!["serve", "--config", &good_serve, "--store", url],
                format!("--store: {says}"),
            ),
            (
                vec!["consume", "--config", &consume_toml],
                format!("{consume_toml}: store: {says}"),
            ),
            (
                vec!["consume", "--config", &good_consume, "--store", url],
                format!("--store: {says}"),
            ),
            (
                vec!["records", "list", "--store", url],
                format!("--store: {says}"),
            ),
            (
                vec!["records", "show", "s", "k", "--store", url],
                format!("--store: {says}"),
            ),
            (
                vec![
                    "reconcile",
                    "--once",
                    "--config",
                    &good_serve,
                    "--store",
                    url,
                ],
                format!("--store: {says}"),
            ),
        ];
        for (args, expect) in runs {
            let out = idem(&args);
            let err = text(&out.stderr);
            assert!(!out.status.success(), "{args:?}");
            assert!(err.contains(&expect), "{args:?}: {err}");
            assert!(!err.contains("s3cret"), "{args:?} leaks: {err}");
            assert!(!err.contains("listening"), "{args:?} started: {err}");
        }
    }
    assert!(
        !dir.path().join("good.db").exists(),
        "no command opened a store"
    );
}
