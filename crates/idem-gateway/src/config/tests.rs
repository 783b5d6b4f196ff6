//! The config's validation, table-driven: what each field refuses, and in
//! which words.

use idem_process::STORE_DEFAULT;

use super::*;

fn load(text: &str, overrides: &Overrides) -> Result<GatewayConfig, String> {
    let file: FileConfig = toml::from_str(text).map_err(|e| e.message().to_owned())?;
    GatewayConfig::from_parts(file, Some(Path::new("idem.toml")), overrides)
        .map_err(|e| e.to_string())
}

#[test]
fn a_lookups_header_values_never_show_in_the_files_debug_form() {
    let text = "[[lookup]]\nroute = \"payouts\"\n\
                url = \"http://h/{forwarded_key}\"\n\
                headers = [[\"authorization\", \"Bearer s3cret-lookup\"]]\n";
    let file: FileConfig = match toml::from_str(text) {
        Ok(file) => file,
        Err(e) => panic!("{text}: {e}"),
    };
    let shown = format!("{file:?}");
    assert!(shown.contains("authorization"), "{shown}");
    assert!(!shown.contains("s3cret"), "{shown}");
}

#[test]
fn lookups_name_a_route_and_every_field_is_checked() {
    let up = Overrides {
        upstream: Some("http://127.0.0.1:9000".into()),
        ..Default::default()
    };
    let route = "[[route]]\nname = \"payouts\"\npath = \"/payouts\"\n\
                 forward_key = { template = \"{scope_digest}:{key}\" }\n";
    let good = format!(
        "{route}[[lookup]]\nroute = \"payouts\"\nurl = \"http://127.0.0.1:9000/by-ref/{{forwarded_key}}\"\n[reconcile]\nmax_tries = 3\n"
    );
    let c = load(&good, &up).unwrap();
    assert_eq!(c.lookups.len(), 1);
    assert_eq!(c.reconcile.max_tries(), 3);
    let cases = [
        (
            format!("{route}[[lookup]]\nroute = \"refunds\"\nurl = \"http://h/{{forwarded_key}}\""),
            "idem.toml: lookup[0].route: no [[route]] has name = \"refunds\"",
        ),
        (
            format!("{route}[[lookup]]\nroute = \"payouts\"\nurl = \"http://h/x\""),
            "idem.toml: lookup[0].url",
        ),
        (
            format!("{route}[[lookup]]\nroute = \"payouts\"\nurl = \"http://h/{{key}}\""),
            "idem.toml: lookup[0].url: \"http://h/{key}\" asks by {key}",
        ),
        (
            format!("{route}[reconcile]\nmax_tries = 0"),
            "idem.toml: reconcile.max_tries",
        ),
        (
            format!(
                "{route}[[lookup]]\nroute = \"payouts\"\nurll = \"http://h/{{forwarded_key}}\""
            ),
            "unknown field `urll`",
        ),
        // A consumer's lookup pasted into a gateway's config.
        (
            format!(
                "{route}[[lookup]]\nsubscription = \"payouts\"\nurl = \"http://h/{{forwarded_key}}\""
            ),
            "idem.toml: lookup[0].subscription: this config has no [[subscription]]",
        ),
        (
            format!("{route}[[lookup]]\nurl = \"http://h/{{forwarded_key}}\""),
            "idem.toml: lookup[0].route: missing",
        ),
    ];
    for (text, expect) in cases {
        let got = load(&text, &up).map(|_| ()).unwrap_err();
        assert!(got.contains(expect), "{text:?}: {got}");
    }
}

#[test]
fn a_lookup_whose_route_cannot_tell_tenants_apart_is_refused() {
    let up = Overrides {
        upstream: Some("http://127.0.0.1:9000".into()),
        ..Default::default()
    };
    let lookup = "[[lookup]]\nroute = \"payouts\"\nurl = \"http://h/{forwarded_key}\"\n";
    let route = |principal: &str, template: &str| {
        format!(
            "[[route]]\nname = \"other\"\npath = \"/other\"\n\
             [[route]]\nname = \"payouts\"\npath = \"/payouts\"\n{principal}\n\
             forward_key = {{ template = {template:?} }}\n{lookup}"
        )
    };
    let principals = [
        "",
        "principal = { header = \"x-tenant-id\" }",
        "principal = { credential_headers = [\"x-api-key\"] }",
    ];
    let cases = [
        ("{key}", false),
        ("pay-{key}", false),
        ("{scope_digest}:{key}", true),
        ("{key}/{scope_digest}", true),
    ];
    for principal in principals {
        for (template, safe) in cases {
            let text = route(principal, template);
            match load(&text, &up) {
                Ok(_) => assert!(safe, "{text}: accepted"),
                Err(e) => {
                    assert!(!safe, "{text}: {e}");
                    assert!(
                        e.starts_with("idem.toml: route[1].forward_key.template: lookup[0]")
                            && e.contains("{scope_digest}:{key}"),
                        "{e}"
                    );
                }
            }
            // A review keeps the config, for the finding to say why.
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("idem.toml");
            std::fs::write(&path, &text).unwrap();
            let reviewed = GatewayConfig::load_for_review(&path).unwrap();
            let finding = crate::findings::lookup_tenancy(&reviewed.routes[1]);
            assert_eq!(finding.verdict.passed(), safe, "{text}: {}", finding.why);
            let offline = GatewayConfig::load_offline(&path, &Overrides::default());
            assert_eq!(offline.is_ok(), safe, "{text}");
        }
    }
}

#[test]
fn a_lookup_serves_one_route_whose_name_no_other_route_shares() {
    let up = Overrides {
        upstream: Some("http://127.0.0.1:9000".into()),
        ..Default::default()
    };
    // Routes of one name share their records' scopes, but a lookup
    // renders one forwarded reference per record: with two templates
    // it would ask by the wrong one, whichever route it was paired with.
    let route = |path: &str, template: &str| {
        format!(
            "[[route]]\nname = \"payouts\"\npath = \"{path}\"\n\
             forward_key = {{ template = {template:?} }}\n"
        )
    };
    let lookup = "[[lookup]]\nroute = \"payouts\"\nurl = \"http://h/{forwarded_key}\"\n";
    let cases = [
        (
            route("/a", "{scope_digest}:{key}") + &route("/b", "{key}"),
            "route[0]",
        ),
        (
            route("/a", "{key}") + &route("/b", "{scope_digest}:{key}"),
            "route[0]",
        ),
        (
            route("/a", "{scope_digest}:{key}") + &route("/b", "{scope_digest}:{key}"),
            "route[0]",
        ),
    ];
    for (routes, first) in cases {
        let text = format!("{routes}{lookup}");
        let e = load(&text, &up).map(|_| ()).unwrap_err();
        assert!(
            e.starts_with("idem.toml: lookup[0].route:")
                && e.contains(first)
                && e.contains("route[1]"),
            "{text}: {e}"
        );
    }
}

#[test]
fn errors_name_file_and_field() {
    let up = Overrides {
        upstream: Some("http://127.0.0.1:9000".into()),
        ..Default::default()
    };
    let cases = [
        (
            "listen = \"nope\"",
            "idem.toml: listen: \"nope\" is not an address",
        ),
        (
            "upstream = \"ftp://x\"",
            "idem.toml: upstream: \"ftp://x\" must be an http:// or https:// URL",
        ),
        (
            "connect_timeout_ms = 0",
            "idem.toml: connect_timeout_ms: 0 is out of range",
        ),
        (
            "purge_interval_s = 0",
            "idem.toml: purge_interval_s: 0 is out of range (1..=86400)",
        ),
        (
            "purge_interval_s = 86401",
            "idem.toml: purge_interval_s: 86401 is out of range",
        ),
        (
            "gauge_sample_interval_s = 0",
            "idem.toml: gauge_sample_interval_s: 0 is out of range (1..=3600)",
        ),
        (
            "gauge_sample_interval_s = 3601",
            "idem.toml: gauge_sample_interval_s: 3601 is out of range (1..=3600)",
        ),
        (
            "response_timeout_ms = 30000",
            "idem.toml: response_timeout_ms: the default lease (30000 ms) must be longer than \
             response_timeout_ms (30000 ms)",
        ),
        (
            "response_timeout_ms = 1000\n[[route]]\nlease_ms = 1000",
            "idem.toml: route[0].lease_ms: lease_ms (1000 ms) must be longer than \
             response_timeout_ms (1000 ms)",
        ),
        (
            "response_timeout_ms = 40000\n[[route]]\nlease_ms = 60000\n[[route]]\npath = \"/x\"",
            "idem.toml: route[1].lease_ms: the default lease_ms (30000 ms) must be longer",
        ),
        (
            "body_buffer_bytes_max = 0",
            "idem.toml: body_buffer_bytes_max: 0 is out of range",
        ),
        (
            "body_buffer_bytes_max = 1000\n[[route]]\nbody_bytes_max = 2000",
            "idem.toml: body_buffer_bytes_max: 1000 is below route[0].body_bytes_max (2000)",
        ),
        (
            "connections_max = 0",
            "idem.toml: connections_max: 0 is out of range (1..=65536)",
        ),
        (
            "waiters_max = 0",
            "idem.toml: waiters_max: 0 is out of range (1..=65536)",
        ),
        (
            "waiters_per_key_max = 70000",
            "idem.toml: waiters_per_key_max: 70000 is out of range (1..=65536)",
        ),
        (
            "waiters_per_principal_max = 0",
            "idem.toml: waiters_per_principal_max: 0 is out of range (1..=65536)",
        ),
        (
            "[[route]]\nwait_ms_max = 40000",
            "idem.toml: route[0].wait_ms_max: 40000 ms is longer than the lease (30000 ms)",
        ),
        (
            "[[route]]\nwait_ms = 2000\nwait_ms_max = 1000",
            "idem.toml: route[0].wait_ms: 2000 ms is longer than wait_ms_max (1000 ms)",
        ),
        (
            "[[route]]\nwait_ms = 26000",
            "idem.toml: route[0].wait_ms: 26000 ms is longer than wait_ms_max (25000 ms)",
        ),
        (
            "admin_connections_max = 65537",
            "idem.toml: admin_connections_max: 65537 is out of range (1..=65536)",
        ),
        (
            "header_read_timeout_ms = 0",
            "idem.toml: header_read_timeout_ms: 0 is out of range (1..=3600000)",
        ),
        (
            "body_read_timeout_ms = 3600001",
            "idem.toml: body_read_timeout_ms: 3600001 is out of range (1..=3600000)",
        ),
        (
            "tls_handshake_timeout_ms = 0",
            "idem.toml: tls_handshake_timeout_ms: 0 is out of range (1..=3600000)",
        ),
        (
            "requests_in_flight_max = 0",
            "idem.toml: requests_in_flight_max: 0 is out of range (1..=65536)",
        ),
        (
            "requests_in_flight_max = 65537",
            "idem.toml: requests_in_flight_max: 65537 is out of range (1..=65536)",
        ),
        (
            "requests_in_flight_max = 18446744073709551615",
            "idem.toml: requests_in_flight_max: 18446744073709551615 is out of range",
        ),
        (
            "admin_listen = \"localhost\"",
            "idem.toml: admin_listen: \"localhost\" is not an address",
        ),
        (
            "admin_token_env = \"IDEM-TOKEN\"",
            "idem.toml: admin_token_env: \"IDEM-TOKEN\" is not an environment variable name",
        ),
        (
            "[[route]]\nname = \"payouts\"\nlease_ms = 1",
            "idem.toml: route[0].lease_ms: lease_ms = 1 is out of range (100..=86400000) (\"payouts\")",
        ),
        (
            "[[route]]\n[[route]]\npath = \"x\"",
            "idem.toml: route[1].path: \"x\" must start with '/'",
        ),
    ];
    for (text, expect) in cases {
        let overrides = if text.starts_with("upstream") {
            Overrides::default()
        } else {
            up.clone()
        };
        let got = load(text, &overrides).map(|_| ()).unwrap_err();
        assert!(got.starts_with(expect), "{text:?}: {got}");
    }
    let missing = load("", &Overrides::default()).map(|_| ()).unwrap_err();
    assert!(missing.starts_with("upstream: is required"), "{missing}");
}

#[test]
fn a_bad_store_is_refused_naming_the_file_or_the_flag() {
    let up = |store: Option<&str>| Overrides {
        upstream: Some("http://127.0.0.1:9000".into()),
        store: store.map(str::to_owned),
        ..Default::default()
    };
    let cases = [
        (
            "store = \"sqlite:/x\"",
            None,
            "idem.toml: store: the URL lacks the // after \"sqlite:\"; write sqlite:///x",
        ),
        (
            "store = \"mysql://app:s3cret@h/db\"",
            None,
            "idem.toml: store: \"mysql://app:***@h/db\" has scheme \"mysql\"",
        ),
        (
            "store = \"postgres://app:s3cret@h/db?bogus=1\"",
            None,
            "idem.toml: store: invalid PostgreSQL URL postgres://app:***@h/db?bogus=1: ",
        ),
        (
            "store = \"postgres://h/db\"",
            None,
            "idem.toml: store: invalid PostgreSQL URL postgres://h/db: it names no user",
        ),
        ("", Some("idem.db"), "--store: \"idem.db\" has no scheme"),
        (
            "store = \"sqlite://ok.db\"",
            Some("postgres://app:s3cret@h/db?schema=1x"),
            "--store: invalid schema name \"1x\"",
        ),
    ];
    for (text, flag, expect) in cases {
        let got = load(text, &up(flag)).map(|_| ()).unwrap_err();
        assert!(got.starts_with(expect), "{text:?} {flag:?}: {got}");
        assert!(!got.contains("s3cret"), "{got}");
    }
    let good = load(
        "store = \"postgres://app:s3cret@h/db?schema=pay&operation_timeout_ms=900\"",
        &up(None),
    )
    .unwrap();
    assert_eq!(
        good.store.to_string(),
        "postgres://app:***@h/db?schema=pay&operation_timeout_ms=900"
    );
}

/// A relative SQLite store in the file is the file's neighbour, as its
/// contract and TLS files are; `--store` and the default stay the
/// working directory's.
#[test]
fn a_store_in_the_file_is_read_against_the_file() {
    let path = Path::new("/etc/idem/idem.toml");
    let overrides = |store: Option<&str>| Overrides {
        upstream: Some("http://127.0.0.1:9000".into()),
        store: store.map(str::to_owned),
        ..Default::default()
    };
    let cases = [
        (
            "store = \"sqlite://idem.db\"",
            None,
            "sqlite:///etc/idem/idem.db",
        ),
        (
            "store = \"sqlite://d/x.db\"",
            None,
            "sqlite:///etc/idem/d/x.db",
        ),
        (
            "store = \"sqlite:///var/idem.db\"",
            None,
            "sqlite:///var/idem.db",
        ),
        (
            "store = \"sqlite://idem.db\"",
            Some("sqlite://cli.db"),
            "sqlite://cli.db",
        ),
        ("", None, "sqlite://idem.db"),
    ];
    for (text, flag, want) in cases {
        let file: FileConfig = toml::from_str(text).unwrap();
        let config = GatewayConfig::from_parts(file, Some(path), &overrides(flag)).unwrap();
        assert_eq!(config.store.to_string(), want, "{text:?} {flag:?}");
    }
}

#[test]
fn unknown_fields_are_named_with_their_line() {
    let dir = std::env::temp_dir().join(format!("idem-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("idem.toml");
    std::fs::write(
        &path,
        "upstream = \"http://127.0.0.1:9\"\n\n[[route]]\nlease_msx = 5\n",
    )
    .unwrap();
    let e = GatewayConfig::load(Some(&path), &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("idem.toml: line 4, column 1: unknown field `lease_msx`"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn defaults_and_overrides() {
    let cli = Overrides {
        listen: Some("127.0.0.1:9999".into()),
        ..Default::default()
    };
    let c = load(
        "upstream = \"http://127.0.0.1:9000/base\"\nlisten = \"127.0.0.1:1\"",
        &cli,
    )
    .unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:9999");
    assert_eq!(c.store.to_string(), STORE_DEFAULT);
    assert_eq!(c.routes.len(), 1);
    assert_eq!(
        c.response_timeout,
        Duration::from_millis(RESPONSE_TIMEOUT_MS_DEFAULT)
    );
    assert_eq!(c.admin_listen, None, "the admin API is off by default");
    assert_eq!(c.admin_token_env, ADMIN_TOKEN_ENV_DEFAULT);
    assert_eq!(
        c.purge_interval,
        Duration::from_secs(PURGE_INTERVAL_S_DEFAULT)
    );
    assert_eq!(c.requests_in_flight_max, REQUESTS_IN_FLIGHT_MAX_DEFAULT);
}

#[test]
fn admin_listen_from_the_command_line_wins() {
    let up = Overrides {
        upstream: Some("http://127.0.0.1:9000".into()),
        ..Default::default()
    };
    let mut c = load(
        "admin_listen = \"127.0.0.1:9090\"\nadmin_token_env = \"PAYOUTS_ADMIN\"\npurge_interval_s = 5",
        &up,
    )
    .unwrap();
    assert_eq!(
        c.admin_listen.map(|a| a.to_string()).as_deref(),
        Some("127.0.0.1:9090")
    );
    assert_eq!(c.purge_interval, Duration::from_secs(5));
    c.set_admin_listen("127.0.0.1:9191").unwrap();
    assert_eq!(
        c.admin_listen.map(|a| a.to_string()).as_deref(),
        Some("127.0.0.1:9191")
    );
    let e = c.set_admin_listen("nope").unwrap_err().to_string();
    assert!(
        e.starts_with("--admin-listen: \"nope\" is not an address"),
        "{e}"
    );
}

#[test]
fn the_admin_token_must_be_set_and_long_enough() {
    let up = Overrides {
        upstream: Some("http://127.0.0.1:9000".into()),
        ..Default::default()
    };
    let c = load("admin_token_env = \"PAYOUTS_ADMIN\"", &up).unwrap();
    let token = |value: Option<&str>| {
        c.operators(|name| {
            assert_eq!(name, "PAYOUTS_ADMIN");
            value.map(str::to_owned)
        })
        .map(|_| ())
        .map_err(|e| e.to_string())
    };
    let cases = [
        (None, Err("environment variable PAYOUTS_ADMIN is not set")),
        (
            Some(""),
            Err("PAYOUTS_ADMIN: the token is 0 bytes; at least 16"),
        ),
        (
            Some("short-token"),
            Err("PAYOUTS_ADMIN: the token is 11 bytes; at least 16"),
        ),
        (
            Some("sixteen bytes ok"),
            Err("PAYOUTS_ADMIN: the token must be visible ASCII"),
        ),
        (Some("0123456789abcdef"), Ok(())),
    ];
    for (value, want) in cases {
        match (token(value), want) {
            (Ok(()), Ok(())) => {}
            (Err(got), Err(part)) => assert!(got.contains(part), "{value:?}: {got}"),
            (got, want) => panic!("{value:?}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn session_limits_are_validated_naming_the_field() {
    let cases = [
        (None, None, Ok((900, 28_800))),
        (Some(2), Some(60), Ok((2, 60))),
        (Some(0), None, Err("console_session_idle_s")),
        (
            None,
            Some(SESSION_S_MAX + 1),
            Err("console_session_absolute_s"),
        ),
        (Some(120), Some(60), Err("console_session_idle_s")),
    ];
    for (idle, absolute, want) in cases {
        let got = SessionLimits::new(idle, absolute)
            .map(|l| (l.idle.as_secs(), l.absolute.as_secs()))
            .map_err(|e| e.field);
        assert_eq!(got, want.map_err(str::to_owned), "{idle:?} {absolute:?}");
    }
}

#[test]
fn the_session_limits_come_from_the_config_file_named_in_errors() {
    let load = |idle: Option<u64>, absolute: Option<u64>| {
        let file = FileConfig {
            upstream: Some("http://127.0.0.1:9000".into()),
            console_session_idle_s: idle,
            console_session_absolute_s: absolute,
            ..FileConfig::default()
        };
        let path = Path::new("idem.toml");
        GatewayConfig::from_parts(file, Some(path), &Overrides::default())
    };
    let limits = load(Some(5), Some(60)).unwrap().console_sessions;
    assert_eq!((limits.idle.as_secs(), limits.absolute.as_secs()), (5, 60));
    assert_eq!(
        load(None, None).unwrap().console_sessions,
        SessionLimits::default()
    );
    let cases = [
        (
            Some(0),
            None,
            "idem.toml: console_session_idle_s: 0 is out of range",
        ),
        (
            None,
            Some(SESSION_S_MAX + 1),
            "idem.toml: console_session_absolute_s:",
        ),
        (
            Some(61),
            Some(60),
            "idem.toml: console_session_idle_s: 61 s is longer",
        ),
    ];
    for (idle, absolute, want) in cases {
        let e = load(idle, absolute).unwrap_err().to_string();
        assert!(e.starts_with(want), "{e}");
    }
}

/// Named operators: each with its own token; the single token of older
/// configs stays operator `admin`; every refusal names the field and
/// the file.
#[test]
fn admin_operators_are_named_and_refused_by_field() {
    let up = Overrides {
        upstream: Some("http://127.0.0.1:9000".into()),
        ..Default::default()
    };
    let env = |name: &str| -> Option<String> {
        match name {
            "IDEM_ADMIN_TOKEN" => Some("admin-token-0123456789".into()),
            "ANA" => Some("ana-token-0123456789ab".into()),
            "BO" => Some("bo-token-0123456789abc".into()),
            "SAME" => Some("ana-token-0123456789ab".into()),
            "SHORT" => Some("short".into()),
            _ => None,
        }
    };
    let names = |text: &str| -> Result<Vec<String>, String> {
        let c = load(text, &up)?;
        let ops = c.operators(env).map_err(|e| e.to_string())?;
        Ok(ops.names().map(|n| n.to_string()).collect())
    };
    let ana = "[[admin.operator]]\nname = \"ana\"\ntoken_env = \"ANA\"\n";
    let bo = "[[admin.operator]]\nname = \"bo\"\ntoken_env = \"BO\"\n";
    assert_eq!(names("").unwrap(), ["admin"], "old configs keep working");
    assert_eq!(names(&format!("{ana}{bo}")).unwrap(), ["ana", "bo"]);
    assert_eq!(
        names(&format!("admin_token_env = \"IDEM_ADMIN_TOKEN\"\n{ana}")).unwrap(),
        ["admin", "ana"]
    );
    let header = "[admin]\noperator_header = \"X-Forwarded-User\"\n";
    let only_header = load(header, &up).unwrap().operators(env).unwrap();
    assert_eq!(only_header.names().count(), 0);
    assert_eq!(
        only_header.header().map(|h| h.as_str()),
        Some("x-forwarded-user")
    );
    let cases = [
        (
            format!("{ana}[[admin.operator]]\nname = \"ana\"\ntoken_env = \"BO\"\n"),
            "idem.toml: admin.operator[1].name: \"ana\" is also the name of admin.operator[0]",
        ),
        (
            format!("{ana}[[admin.operator]]\nname = \"bo\"\ntoken_env = \"ANA\"\n"),
            "idem.toml: admin.operator[1].token_env: ANA is also the token_env",
        ),
        (
            format!("{ana}[[admin.operator]]\nname = \"bo\"\ntoken_env = \"SAME\"\n"),
            "idem.toml: admin.operator: operators \"ana\" and \"bo\" have the same token",
        ),
        (
            "[[admin.operator]]\nname = \"bo\"\ntoken_env = \"SHORT\"\n".into(),
            "idem.toml: admin.operator[0].token_env: environment variable SHORT: the token is 5 bytes",
        ),
        (
            "[[admin.operator]]\nname = \"bo\"\ntoken_env = \"UNSET\"\n".into(),
            "idem.toml: admin.operator[0].token_env: the admin API is enabled but the environment variable UNSET is not set",
        ),
        (
            "[[admin.operator]]\nname = \"bo smith\"\ntoken_env = \"BO\"\n".into(),
            "idem.toml: admin.operator[0].name: \"bo smith\" holds a character",
        ),
        (
            "[admin]\noperator_header = \"X Forwarded\"\n".into(),
            "idem.toml: admin.operator_header: \"X Forwarded\" is not a header name",
        ),
        (
            "admin_token_env = \"IDEM_ADMIN_TOKEN\"\n[[admin.operator]]\nname = \"admin\"\ntoken_env = \"BO\"\n".into(),
            "idem.toml: admin.operator.name: \"admin\" is the name of admin_token_env's operator",
        ),
    ];
    for (text, said) in cases {
        let err = names(&text).unwrap_err();
        assert!(err.starts_with(said), "{text}\nwant {said}\ngot  {err}");
    }
}
