//! The request fingerprint at its seams, as a client meets it through
//! `idem serve`: requests that differ only in one component (media type,
//! charset, a query byte, the order of a repeated parameter or header, a
//! number beyond double precision) must not replay each other, and JSON
//! numbers of any size are accepted and compared exactly.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use axum::body::Body;
use support::{Gateway, Reply, Site, Upstream, exchange};

/// One request as sent: query (after `/payouts`), content type, extra
/// headers (raw bytes, repeated names allowed) and body.
struct Sent<'a> {
    query: &'a str,
    content_type: &'a str,
    headers: &'a [(&'a str, &'a [u8])],
    body: &'a str,
}

const fn json(body: &str) -> Sent<'_> {
    Sent {
        query: "",
        content_type: "application/json",
        headers: &[],
        body,
    }
}

const fn query(query: &str) -> Sent<'_> {
    Sent {
        query,
        content_type: "application/json",
        headers: &[],
        body: "{}",
    }
}

const fn typed<'a>(content_type: &'a str, body: &'a str) -> Sent<'a> {
    Sent {
        query: "",
        content_type,
        headers: &[],
        body,
    }
}

const fn headed<'a>(headers: &'a [(&'a str, &'a [u8])]) -> Sent<'a> {
    Sent {
        query: "",
        content_type: "application/json",
        headers,
        body: "{}",
    }
}

/// POSTs `sent` to `/payouts` through the gateway under `key`.
async fn send(gw: &Gateway, key: &str, sent: &Sent<'_>) -> Reply {
    let mut req = axum::http::Request::post(gw.url(&format!("/payouts{}", sent.query)))
        .header("idempotency-key", key)
        .header("content-type", sent.content_type);
    for (name, value) in sent.headers {
        req = req.header(*name, axum::http::HeaderValue::from_bytes(value).unwrap());
    }
    exchange(req.body(Body::from(sent.body.to_owned())).unwrap()).await
}

const CONFIG: &str = r#"
[[route]]
path = "/payouts"
fingerprint_headers = ["x-account"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_differ_in_one_component_never_replay_each_other() {
    let (up, site) = (Upstream::start().await, Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), Some(&site.config(CONFIG)));
    let cases: &[(&str, Sent<'_>, Sent<'_>)] = &[
        (
            "same bytes as form data, then as text",
            typed("application/x-www-form-urlencoded", "amount=10"),
            typed("text/plain", "amount=10"),
        ),
        (
            "same text bytes in two charsets",
            typed("text/plain; charset=utf-8", "Gr\u{fc}\u{df}e"),
            typed("text/plain; charset=iso-8859-1", "Gr\u{fc}\u{df}e"),
        ),
        (
            "one JSON body under two JSON media types",
            typed("application/json", r#"{"a":1}"#),
            typed("application/merge-patch+json", r#"{"a":1}"#),
        ),
        ("%ff against %25ff", query("?ref=%ff"), query("?ref=%25ff")),
        ("%FE against %FF", query("?ref=%FE"), query("?ref=%FF")),
        (
            "repeated parameters reordered",
            query("?to=a&to=b"),
            query("?to=b&to=a"),
        ),
        ("a flag against an empty value", query("?x"), query("?x=")),
        (
            "names a form reader reads as one space, reordered",
            query("?+=&%20"),
            query("?%20&+="),
        ),
        (
            "names alike but for case, reordered",
            query("?Ref=1&ref=2"),
            query("?ref=2&Ref=1"),
        ),
        (
            "names alike but for a separator, reordered",
            query("?page_size=1&pageSize=2"),
            query("?pageSize=2&page_size=1"),
        ),
        ("a plus against %2B", query("?q=a+b"), query("?q=a%2Bb")),
        (
            "a decimal below double precision",
            json(r#"{"amount":10}"#),
            json(r#"{"amount":10.0000000000000001}"#),
        ),
        (
            "neighbouring 64-bit ids",
            json(r#"{"id":9007199254740993}"#),
            json(r#"{"id":9007199254740992}"#),
        ),
        (
            "a declared header that is not UTF-8",
            headed(&[("x-account", b"\xff")]),
            headed(&[("x-account", b"\xfe")]),
        ),
        (
            "a repeated declared header reordered",
            headed(&[("x-account", b"a"), ("x-account", b"b")]),
            headed(&[("x-account", b"b"), ("x-account", b"a")]),
        ),
    ];
    // Every case runs, so one run names every seam that leaks.
    let mut leaks = Vec::new();
    for (i, (name, first, second)) in cases.iter().enumerate() {
        let key = format!("seam-{i}");
        let before = up.effects().len();
        let reply = send(&gw, &key, first).await;
        if reply.status != 201 {
            leaks.push(format!(
                "{name}: first request {} {}",
                reply.status, reply.body
            ));
            continue;
        }
        let reused = send(&gw, &key, second).await;
        if (reused.status, reused.problem().as_deref())
            != (422, Some("urn:idem:problem:key-reused"))
        {
            leaks.push(format!("{name}: {} {}", reused.status, reused.body));
        }
        assert_eq!(up.effects().len(), before + 1, "{name}: one effect");
        // The first request itself still replays.
        send(&gw, &key, first).await.assert_replay_of(&reply);
    }
    assert!(leaks.is_empty(), "not rejected as key-reused: {leaks:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbers_of_any_size_are_accepted_and_respellings_replay() {
    let (up, site) = (Upstream::start().await, Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), Some(&site.config(CONFIG)));
    let cases: &[(&str, &str, &str)] = &[
        (
            "a 64-bit id",
            r#"{"id":9007199254740993}"#,
            r#"{ "id" : 9007199254740993.0 }"#,
        ),
        (
            "a 23-digit amount",
            r#"{"amount":12345678901234567890123}"#,
            r#"{"amount":1.2345678901234567890123e22}"#,
        ),
        ("a decimal", r#"{"amount":1.50}"#, r#"{"amount":15e-1}"#),
        ("beyond a double's range", r#"[1e400]"#, r#"[10E+399]"#),
        ("zero and minus zero", r#"[0]"#, r#"[-0.0e7]"#),
    ];
    let mut refused = Vec::new();
    for (i, (name, first, respelt)) in cases.iter().enumerate() {
        let key = format!("num-{i}");
        let reply = send(&gw, &key, &json(first)).await;
        let again = send(&gw, &key, &json(respelt)).await;
        if reply.status != 201 || again.header("idempotent-replayed") != Some("true") {
            refused.push(format!(
                "{name}: {} then {} {}",
                reply.status, again.status, again.body
            ));
        }
    }
    assert!(
        refused.is_empty(),
        "not accepted and replayed: {refused:#?}"
    );
    assert_eq!(up.effects().len(), cases.len());
    // An exponent beyond any body's reach is refused clearly, never a crash.
    let huge = send(&gw, "num-huge", &json("[1e99999999999999999999999]")).await;
    assert_eq!(huge.status, 400, "{huge:?}");
    assert_eq!(
        huge.problem().as_deref(),
        Some("urn:idem:problem:invalid-body")
    );
    assert!(huge.body.contains("exponent"), "{huge:?}");
    assert_eq!(up.effects().len(), cases.len());
}

/// Where the records of a gateway live, and how to rewrite the fingerprint
/// every record holds, as a release with the previous canonical form would
/// have written it.
enum Backend {
    Sqlite(Site),
    Postgres(support::PgSchema),
}

impl Backend {
    fn start(&self, upstream: &str, site: &Site) -> Gateway {
        let config = Some(site.config(CONFIG));
        match self {
            Backend::Sqlite(store) => Gateway::start(upstream, &store.store(), config.as_deref()),
            Backend::Postgres(schema) => {
                Gateway::start_url(upstream, &schema.store_url(), config.as_deref())
            }
        }
    }

    fn set_every_fingerprint(&self, fingerprint: &idem_core::Fingerprint) {
        match self {
            Backend::Sqlite(store) => {
                let db = rusqlite::Connection::open(store.store()).unwrap();
                let bytes = &fingerprint.as_bytes()[..];
                let changed = db
                    .execute("UPDATE records SET fingerprint = ?1", [bytes])
                    .unwrap();
                assert_eq!(changed, 1);
            }
            Backend::Postgres(schema) => schema
                .execute(&format!(
                    "UPDATE {}.records SET fingerprint = '\\x{}'",
                    schema.name,
                    fingerprint.to_hex()
                ))
                .unwrap(),
        }
    }
}

/// A record written before the upgrade holds the version 1 fingerprint: the
/// same request still replays it, on every store, and a request that
/// version 1 could not tell apart from it is refused, not replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_holding_a_version_1_fingerprint_replays_for_the_same_request() {
    let body = r#"{"seller":847,"amount":12.50}"#;
    let sent = Sent {
        query: "?to=a&note=caf%C3%A9+au+lait",
        content_type: "application/json",
        headers: &[("x-account", b"acme")],
        body,
    };
    let v1 = idem_core::Fingerprint::of_request_v1(&idem_core::RequestParts {
        method: "POST",
        route: "/payouts",
        path: "/payouts",
        query: &sent.query[1..],
        content_types: &[b"application/json"],
        headers: &[("x-account", b"acme")],
        body: body.as_bytes(),
        exclude: &[],
    })
    .expect("version 1 reads this request exactly");
    for backend in [
        Backend::Sqlite(Site::new()),
        Backend::Postgres(support::PgSchema::new("fp_legacy")),
    ] {
        let (up, site) = (Upstream::start().await, Site::new());
        let gw = backend.start(&up.url(), &site);
        let first = send(&gw, "legacy-1", &sent).await;
        assert_eq!(first.status, 201, "{first:?}");
        backend.set_every_fingerprint(&v1);

        let respelt = Sent {
            query: "?note=caf%c3%a9%20au%20lait&to=a",
            body: r#"{ "amount": 12.5, "seller": 847 }"#,
            ..sent
        };
        send(&gw, "legacy-1", &respelt)
            .await
            .assert_replay_of(&first);
        // Version 1 read numbers as doubles; version 2 refuses to confuse them.
        let other = Sent {
            body: r#"{"seller":847,"amount":12.500000000000000001}"#,
            ..sent
        };
        let reused = send(&gw, "legacy-1", &other).await;
        assert_eq!(reused.status, 422, "{reused:?}");
        assert_eq!(up.effects().len(), 1);
    }
}
