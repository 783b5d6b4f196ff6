//! The `idem` command as an operator runs it: exit codes, messages that name
//! the file and the field, records on real SQLite files, and the store a
//! command opens named by the gateway's config from any directory.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use support::{Gateway, Site, Upstream, idem, idem_in, key, post, text};

#[test]
fn records_list_on_missing_fresh_and_garbage_stores() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    let url = format!("sqlite://{}", missing.display());
    let out = idem(&["records", "list", "--store", &url, "--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("there is no store at {url}, which --store names")),
        "{err}"
    );
    assert!(text(&out.stdout).is_empty(), "an empty listing");
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

/// Every command that opens a store takes the gateway's config file and
/// opens the store the gateway serves from, whatever directory it runs
/// in. Without one, a store that is not there is an error saying where it
/// looked and how to name another, never an empty listing, and nothing is
/// created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_that_open_a_store_read_the_one_the_config_names() {
    let (up, site) = (Upstream::start().await, Site::new());
    // A 503 is an unknown outcome: each key's record becomes ambiguous.
    let config = site.config(
        "store = \"sqlite://idem.db\"\nresponse_timeout_ms = 500\n\n[[route]]\n\
         path = \"/busy-once\"\nlease_ms = 1000\ncompletion = { unknown = [503] }\n",
    );
    let gateway_dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start_in(gateway_dir.path(), &up.url(), &config);
    for k in ["b-1", "b-2"] {
        let reply = post(&gw.url("/busy-once"), &[key(k)], "{}").await;
        assert_eq!(reply.status, 503, "{reply:?}");
    }
    // The operator's shell is somewhere else again.
    let shell = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = idem_in(shell.path(), args);
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let config = config.to_str().unwrap();

    let (code, stdout, stderr) = run(&[
        "records",
        "list",
        "--state",
        "ambiguous",
        "--format",
        "json",
        "--config",
        config,
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let listed: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let keys: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["b-1", "b-2"], "{stdout}");
    let scope = listed[0]["scope"].as_str().unwrap();
    let token = listed[1]["token"].as_u64().unwrap().to_string();
    let backup = shell.path().join("backup.db");
    let backup = backup.to_str().unwrap();
    let commands: [(&[&str], &str); 4] = [
        (&["records", "show", scope, "b-1"], "ambiguous"),
        (
            &[
                "records",
                "resolve",
                scope,
                "b-2",
                "--token",
                &token,
                "--completed",
                "--reason",
                "paid by hand",
            ],
            "resolved scope",
        ),
        (&["store", "backup", "--to", backup], "backed up"),
        (
            &["store", "mark-restored", "--since", "2026-01-01T00:00:00Z"],
            "suspect window open",
        ),
    ];
    for (args, says) in commands {
        let (code, stdout, stderr) = run(&[args, &["--config", config]].concat());
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
        assert!(stdout.contains(says), "{args:?}: {stdout}");
    }
    assert!(gw.terminate().success());
    let restore = ["store", "restore", "--from", backup, "--config", config];
    let (code, stdout, stderr) = run(&restore);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains(&site.store().display().to_string()),
        "{stdout}"
    );

    refused_without_a_store(shell.path(), scope, config);
}

/// In `shell`, with no store there, every command that opens one without
/// `--config` names where it looked and the arguments that name another,
/// and creates nothing; `--config` and `--store` together are refused.
fn refused_without_a_store(shell: &std::path::Path, scope: &str, config: &str) {
    let run = |args: &[&str]| {
        let out = idem_in(shell, args);
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let here = shell.join("idem.db").display().to_string();
    let backup = shell.join("another-backup.db");
    let backup = backup.to_str().unwrap();
    let missing: [&[&str]; 5] = [
        &["records", "list"],
        &["records", "show", scope, "b-1"],
        &[
            "records",
            "resolve",
            scope,
            "b-1",
            "--token",
            "1",
            "--not-executed",
            "--reason",
            "not paid",
        ],
        &["store", "backup", "--to", backup],
        &["store", "mark-restored", "--since", "2026-01-01T00:00:00Z"],
    ];
    for args in missing {
        let (code, stdout, stderr) = run(args);
        assert_eq!(code, Some(1), "{args:?}: {stdout}");
        for part in [
            "there is no store at sqlite://idem.db",
            &here,
            "--config FILE",
        ] {
            assert!(
                stderr.contains(part),
                "{args:?}: {part:?} is not named: {stderr}"
            );
        }
    }
    assert!(!shell.join("idem.db").exists(), "a store was created");
    let (code, _, stderr) = run(&[
        "records",
        "list",
        "--config",
        config,
        "--store",
        "sqlite://x.db",
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}
