//! The principal as a tenant, not a credential: through a real `idem serve`
//! in front of the payout API, a refreshed token is the same tenant retrying
//! the same intent, another tenant never sees a replay of someone else's
//! effect, and a request whose principal cannot be established is refused
//! with nothing claimed and nothing forwarded.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use http_body_util::BodyExt;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use support::{Gateway, Reply, Site, Upstream, client, idem, key, post, text};

const PAYOUT: &str = r#"{"seller":847,"amount":100}"#;

/// The issuer's signing key; its public half is the route's key set.
const ISSUER_KEY: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIPqFM6KorCwwsZguiOcrRiLoqYw+h0a3Ux4KlJHYRi5K
-----END PRIVATE KEY-----
";
const ISSUER_JWKS: &str = r#"{"keys":[{"kty":"OKP","crv":"Ed25519","use":"sig","kid":"k1","x":"gszAgTtGafU_QmHJCCuCgBJ-BaF3O7QfzwQHqZCiFtI"}]}"#;
/// Someone else's key: what a forger signs with.
const FORGER_KEY: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIHxfxlsYiVQLIJQRBLmobdhPr+5JQITdBP+vmroiiJxM
-----END PRIVATE KEY-----
";

fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A token over `claims`, signed with `pem` (EdDSA, kid `k1`).
fn token(pem: &str, claims: serde_json::Value) -> String {
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some("k1".into());
    let key = EncodingKey::from_ed_pem(pem.as_bytes()).unwrap();
    jsonwebtoken::encode(&header, &claims, &key).unwrap()
}

/// Claims for `sub`, issued `iat` seconds from now, valid ten minutes.
fn claims(sub: serde_json::Value, iat: i64) -> serde_json::Value {
    serde_json::json!({
        "iss": "https://auth.example", "aud": "payouts", "sub": sub,
        "iat": now_s() + iat, "exp": now_s() + iat + 600, "jti": format!("t{iat}"),
    })
}

fn bearer(token: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {token}"))
}

async fn send(url: &str, headers: &[(&str, String)]) -> Reply {
    let pairs: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    post(url, &pairs, PAYOUT).await
}

fn jwt_site() -> (Site, std::path::PathBuf) {
    let site = Site::new();
    std::fs::write(site.dir.path().join("jwks.json"), ISSUER_JWKS).unwrap();
    let config = site.config(
        "[[route]]\nname = \"payouts\"\nmethods = [\"POST\"]\npath = \"/payouts\"\n\
         principal = { jwt = { claim = \"sub\", keys = \"jwks.json\", issuer = \"https://auth.example\", \
         audience = \"payouts\", algorithms = [\"EdDSA\"] } }\n",
    );
    (site, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refreshed_token_replays_and_another_tenant_gets_its_own_scope() {
    let (up, (site, config)) = (Upstream::start().await, jwt_site());
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let url = gw.url("/payouts");
    let k = ("idempotency-key", "\"p-847\"".to_owned());
    let first_token = token(ISSUER_KEY, claims("tenant-a".into(), 0));
    let first = send(&url, &[k.clone(), bearer(&first_token)]).await;
    assert_eq!(first.status, 201, "{first:?}");

    // The token is refreshed (new iat, exp, jti), the scheme spelt in lower
    // case, and a tenant header added: the same tenant, the same intent.
    let refreshed = token(ISSUER_KEY, claims("tenant-a".into(), 5));
    assert_ne!(refreshed, first_token);
    let retry = send(
        &url,
        &[
            k.clone(),
            ("authorization", format!("bearer {refreshed}")),
            ("x-tenant-id", "tenant-b".into()),
        ],
    )
    .await;
    retry.assert_replay_of(&first);
    assert_eq!(up.effects().len(), 1, "the retry added no effect");

    // Tenant B sends A's key: its own effect, never A's replay.
    let other = send(
        &url,
        &[
            k.clone(),
            bearer(&token(ISSUER_KEY, claims("tenant-b".into(), 0))),
        ],
    )
    .await;
    assert_eq!(other.status, 201, "{other:?}");
    assert_eq!(other.header("idempotent-replayed"), None);
    assert_ne!(other.body, first.body);
    assert_eq!(up.effects().len(), 2);

    // A numeric claim is a tenant of its own, exact past 2^53: two ids that
    // one float would merge are two tenants.
    for (n, sub) in [9_007_199_254_740_993_u64, 9_007_199_254_740_992]
        .into_iter()
        .enumerate()
    {
        let reply = send(
            &url,
            &[k.clone(), bearer(&token(ISSUER_KEY, claims(sub.into(), 0)))],
        )
        .await;
        assert_eq!(reply.status, 201, "{sub}: {reply:?}");
        assert_eq!(reply.header("idempotent-replayed"), None, "{sub}");
        assert_eq!(up.effects().len(), 3 + n);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_cannot_be_verified_is_refused_and_nothing_is_forwarded() {
    let (up, (site, config)) = (Upstream::start().await, jwt_site());
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let url = gw.url("/payouts");
    let good = claims("tenant-a".into(), 0);
    let with = |field: &str, value: serde_json::Value| {
        let mut c = good.clone();
        c[field] = value;
        c
    };
    let unsigned = {
        let valid = token(ISSUER_KEY, good.clone());
        let payload = valid.split('.').nth(1).unwrap().to_owned();
        // {"alg":"none","typ":"JWT"}
        format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{payload}.")
    };
    let cases: Vec<(&str, Vec<(&str, String)>)> = vec![
        ("no token", vec![]),
        ("forged", vec![bearer(&token(FORGER_KEY, good.clone()))]),
        ("unsigned", vec![bearer(&unsigned)]),
        (
            "expired",
            vec![bearer(&token(
                ISSUER_KEY,
                with("exp", (now_s() - 3600).into()),
            ))],
        ),
        (
            "wrong issuer",
            vec![bearer(&token(
                ISSUER_KEY,
                with("iss", "https://evil.example".into()),
            ))],
        ),
        (
            "wrong audience",
            vec![bearer(&token(ISSUER_KEY, with("aud", "refunds".into())))],
        ),
        (
            "no sub",
            vec![bearer(&token(
                ISSUER_KEY,
                with("sub", serde_json::Value::Null),
            ))],
        ),
        (
            "object sub",
            vec![bearer(&token(
                ISSUER_KEY,
                with("sub", serde_json::json!({"id": "tenant-a"})),
            ))],
        ),
        (
            "float sub",
            vec![bearer(&token(ISSUER_KEY, with("sub", 1.5.into())))],
        ),
        (
            "empty sub",
            vec![bearer(&token(ISSUER_KEY, with("sub", "".into())))],
        ),
        (
            "basic scheme",
            vec![("authorization", "Basic dGVuYW50LWE6eA==".into())],
        ),
        (
            "tenant header only",
            vec![("x-tenant-id", "tenant-a".into())],
        ),
        (
            "two tokens",
            vec![
                bearer(&token(ISSUER_KEY, good.clone())),
                bearer(&token(ISSUER_KEY, good.clone())),
            ],
        ),
    ];
    for (what, headers) in cases {
        let mut all = headers;
        all.push(("idempotency-key", "\"k-refused\"".into()));
        let reply = send(&url, &all).await;
        assert_eq!(reply.status, 401, "{what}: {reply:?}");
        assert_eq!(
            reply.problem().as_deref(),
            Some("urn:idem:problem:unauthenticated"),
            "{what}"
        );
        assert_eq!(reply.header("www-authenticate"), Some("Bearer"), "{what}");
    }
    assert_eq!(up.hits(), 0, "nothing was forwarded");
    // Nothing was claimed: the same key with a valid token executes once.
    let ok = send(
        &url,
        &[
            ("idempotency-key", "\"k-refused\"".into()),
            bearer(&token(ISSUER_KEY, good)),
        ],
    )
    .await;
    assert_eq!(ok.status, 201, "{ok:?}");
    assert_eq!(up.effects().len(), 1);
}

/// A POST whose header values are raw bytes, for values no `&str` can hold.
async fn post_bytes(url: &str, headers: &[(&str, &[u8])]) -> u16 {
    let mut req = axum::http::Request::post(url).header("content-type", "application/json");
    for (name, value) in headers {
        req = req.header(*name, axum::http::HeaderValue::from_bytes(value).unwrap());
    }
    let response = client()
        .request(req.body(Body::from(PAYOUT)).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await.unwrap();
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_header_names_the_tenant_whatever_the_credential_says() {
    let (up, site) = (Upstream::start().await, Site::new());
    let config = site.config(
        "[[route]]\nname = \"payouts\"\nmethods = [\"POST\"]\npath = \"/payouts\"\n\
         principal = { header = \"x-tenant-id\" }\n",
    );
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    assert!(!gw.logs().contains("fragile"), "{}", gw.logs());
    let url = gw.url("/payouts");
    let tenant = ("x-tenant-id", "acme");
    let first = post(
        &url,
        &[key("t-1"), tenant, ("authorization", "Bearer abc")],
        PAYOUT,
    )
    .await;
    assert_eq!(first.status, 201, "{first:?}");
    for credential in [
        "bearer abc",
        "Bearer  abc",
        "Bearer refreshed-token",
        "Basic eDp5",
    ] {
        let again = post(
            &url,
            &[key("t-1"), tenant, ("authorization", credential)],
            PAYOUT,
        )
        .await;
        again.assert_replay_of(&first);
    }
    let no_credential = post(&url, &[key("t-1"), tenant], PAYOUT).await;
    no_credential.assert_replay_of(&first);
    assert_eq!(up.effects().len(), 1);

    // Another tenant with the same key: its own effect.
    let other = post(&url, &[key("t-1"), ("x-tenant-id", "globex")], PAYOUT).await;
    assert_eq!(
        (other.status, other.header("idempotent-replayed")),
        (201, None)
    );
    assert_eq!(up.effects().len(), 2);

    // A tenant that cannot be read is refused, never guessed or joined.
    type Headers<'a> = Vec<(&'a str, &'a [u8])>;
    let refused: Vec<(&str, Headers)> = vec![
        ("absent", vec![]),
        ("empty", vec![("x-tenant-id", b"")]),
        (
            "repeated",
            vec![("x-tenant-id", b"acme"), ("x-tenant-id", b"globex")],
        ),
        (
            "repeated, same",
            vec![("x-tenant-id", b"acme"), ("x-tenant-id", b"acme")],
        ),
        ("joined", vec![("x-tenant-id", b"acme,globex")]),
        ("not UTF-8", vec![("x-tenant-id", b"acme\xff")]),
        ("obs-text", vec![("x-tenant-id", "acmé".as_bytes())]),
        ("tab inside", vec![("x-tenant-id", b"ac\tme")]),
        ("too long", vec![("x-tenant-id", &[b'a'; 256])]),
    ];
    for (what, mut headers) in refused {
        headers.push(("idempotency-key", b"t-2"));
        assert_eq!(post_bytes(&url, &headers).await, 400, "{what}");
    }
    assert_eq!(up.effects().len(), 2, "nothing was forwarded");
    let ok = post(&url, &[key("t-2"), tenant], PAYOUT).await;
    assert_eq!(ok.status, 201, "nothing was claimed: {ok:?}");
}

#[test]
fn the_fragile_default_is_named_at_start_and_by_check() {
    let site = Site::new();
    let cases = [
        // (route principal, check exit code, finding verdict)
        ("", 1, "UNANSWERED"),
        ("principal_headers = [\"authorization\"]\n", 0, "PASS"),
        (
            "principal = { credential_headers = [\"authorization\", \"x-api-key\"] }\n",
            0,
            "PASS",
        ),
        ("principal = { header = \"x-tenant-id\" }\n", 0, "PASS"),
    ];
    for (principal, code, verdict) in cases {
        let config = site.config(&format!(
            "upstream = \"http://127.0.0.1:9\"\n[[route]]\nname = \"payouts\"\npath = \"/payouts\"\n{principal}"
        ));
        let out = idem(&[
            "check",
            "--gateway",
            config.to_str().unwrap(),
            "--format",
            "json",
        ]);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{principal:?}: {}",
            text(&out.stdout)
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let finding = doc
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["gateway"].as_array().cloned().unwrap_or_default())
            .find(|f| f["topic"] == "gateway.principal")
            .unwrap_or_else(|| panic!("{principal:?}: no gateway.principal in {doc}"));
        assert_eq!(finding["verdict"], verdict, "{principal:?}: {finding}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_warns_once_per_route_that_digests_a_credential() {
    let (up, site) = (Upstream::start().await, Site::new());
    let config = site.config(
        "[[route]]\nname = \"payouts\"\npath = \"/payouts\"\n\
         [[route]]\nname = \"refunds\"\npath = \"/refunds\"\nprincipal = { header = \"x-tenant-id\" }\n\
         [[route]]\nname = \"legacy\"\npath = \"/legacy\"\nprincipal_headers = [\"x-api-key\"]\n",
    );
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    // The layer names its undeclared principals once it is built.
    let said = || gw.logs().contains("no principal declared");
    assert!(support::eventually(Duration::from_secs(10), said).await);
    let logs = gw.logs();
    let warnings: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("principal"))
        .collect();
    assert_eq!(warnings.len(), 2, "{logs}");
    let undeclared = warnings.iter().find(|l| l.contains("payouts")).unwrap();
    assert!(
        undeclared.contains("no principal declared")
            && undeclared.contains("share one key space")
            && undeclared.contains("cookie"),
        "{logs}"
    );
    assert!(warnings.iter().any(|l| l.contains("legacy")), "{logs}");
    // No [[lookup]], so no reconciler: each route that can leave an
    // unknown outcome is named once, as one that only an operator settles.
    let unsettled = || {
        gw.logs()
            .matches("nothing in this process settles it")
            .count()
    };
    assert!(support::eventually(Duration::from_secs(10), || unsettled() >= 3).await);
    assert_eq!(unsettled(), 3, "{}", gw.logs());
}

/// With no principal declared, two callers authenticated differently —
/// whatever carries their credential — never share a key's answer: each
/// runs once and is replayed its own. Callers that send no credential at
/// all are one scope, as the start-up warning says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_authenticated_differently_never_share_answers_by_default() {
    let (up, site) = (Upstream::start().await, Site::new());
    let config = site.config("[[route]]\nname = \"payouts\"\npath = \"/payouts\"\n");
    let gw = Gateway::start(&up.url(), &site.store(), Some(&config));
    let url = gw.url("/payouts");
    // (how the caller is authenticated, the header, Alice's value, Bob's)
    let ways = [
        (
            "bearer token",
            "authorization",
            "Bearer alice-token",
            "Bearer bob-token",
        ),
        (
            "cookie",
            "cookie",
            "session=alice; theme=dark",
            "session=bob; theme=dark",
        ),
        ("api key", "x-api-key", "ak-alice", "ak-bob"),
        (
            "client certificate at a terminator",
            "x-forwarded-client-cert",
            "Hash=aa11;Subject=\"CN=alice\"",
            "Hash=bb22;Subject=\"CN=bob\"",
        ),
        (
            "client certificate at nginx",
            "x-ssl-client-cert",
            "alice-pem",
            "bob-pem",
        ),
    ];
    for (way, header, alice, bob) in ways {
        let k = format!("order-{}", header);
        let as_alice = [key(&k), (header, alice)];
        let as_bob = [key(&k), (header, bob)];
        let effects = up.effects().len();
        let first = post(&url, &as_alice, PAYOUT).await;
        assert_eq!(first.status, 201, "{way}: {first:?}");
        let other = post(&url, &as_bob, PAYOUT).await;
        assert_eq!(other.status, 201, "{way}: {other:?}");
        assert_eq!(
            other.header("idempotent-replayed"),
            None,
            "{way}: Bob got Alice's answer"
        );
        assert_ne!(other.body, first.body, "{way}");
        assert_eq!(up.effects().len(), effects + 2, "{way}: each order ran");
        post(&url, &as_alice, PAYOUT).await.assert_replay_of(&first);
        post(&url, &as_bob, PAYOUT).await.assert_replay_of(&other);
        assert_eq!(up.effects().len(), effects + 2, "{way}: and only once");
    }
    // No credential at all: one scope, the assumption the warning names.
    let first = post(&url, &[key("order-anonymous")], PAYOUT).await;
    post(&url, &[key("order-anonymous")], PAYOUT)
        .await
        .assert_replay_of(&first);
    assert!(gw.logs().contains("share one key space"), "{}", gw.logs());
}
