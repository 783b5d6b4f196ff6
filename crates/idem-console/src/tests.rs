//! The console in-process, over a memory store: sign-in, the checks on
//! every state change, escaping, and a resolution fenced like the API's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::Request;
use http_body_util::BodyExt;
use idem_core::{
    Claim, ClaimRequest, Fingerprint, IdempotencyKey, ManualClock, MemoryStore, Outcome, Policy,
    Scope, StoredResult,
};
use tower::ServiceExt;

use super::*;
use idem_gateway::AdminToken;
use idem_testkit::stores::{Backend, TestStore, open_with_clock};

const TOKEN: &str = "console-test-token-8d1f0c";
const HOST: &str = "127.0.0.1:9090";

struct Fixture {
    store: Arc<dyn Store>,
    app: axum::Router,
}

/// Request headers, as pairs.
type Headers<'a> = &'a [(&'a str, &'a str)];

/// An answer: status, headers, body.
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: String,
}

fn fixture() -> Fixture {
    fixture_logging_to(RefusalLog::default())
}

/// A console whose wrong sign-ins are logged within `refusals`.
fn fixture_logging_to(refusals: RefusalLog) -> Fixture {
    let clock = ManualClock::new(SystemClock.now());
    let store = Arc::new(MemoryStore::new(Arc::new(clock)));
    let state = ConsoleState::new(
        store.clone(),
        Arc::new(Metrics::new()),
        AdminToken::new(TOKEN).unwrap(),
        vec![Route::default_catch_all()],
    )
    .with_refusals(refusals);
    Fixture {
        store,
        app: router(state),
    }
}

/// A claim of `key` in `scope` by node `gw-1`, with the default policy.
pub(crate) fn claim_request(scope: &str, key: &str) -> ClaimRequest {
    ClaimRequest {
        id: RecordId {
            scope: Scope::new(scope).unwrap(),
            key: IdempotencyKey::new(key).unwrap(),
        },
        fingerprint: Fingerprint::from_bytes([7; 32]),
        legacy_fingerprint: None,
        owner: "gw-1".into(),
        region: None,
        policy: Policy::DEFAULT,
    }
}

/// Acquires `key` in `scope` and leaves its outcome unknown.
pub(super) async fn ambiguous(store: &dyn Store, scope: &str, key: &str) -> RecordId {
    let req = claim_request(scope, key);
    let Claim::Acquired { token, .. } = store.claim(&req).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    store.mark_ambiguous(&req.id, token).await.unwrap();
    req.id
}

impl Fixture {
    async fn send(&self, method: &str, uri: &str, headers: &[(&str, &str)], form: &str) -> Answer {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header("host", HOST);
        if method == "POST" {
            req = req.header("content-type", "application/x-www-form-urlencoded");
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let res = self
            .app
            .clone()
            .oneshot(req.body(Body::from(form.to_owned())).unwrap())
            .await
            .unwrap();
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    }

    /// Signs in; returns the `Cookie` header and the session's CSRF token.
    async fn sign_in(&self) -> (String, String) {
        let form = format!("token={TOKEN}");
        let signed = self.send("POST", "/ui/sign-in", &[], &form).await;
        assert_eq!(signed.status, 303, "{}", signed.body);
        let set = signed.headers["set-cookie"].to_str().unwrap();
        let cookie = set.split(';').next().unwrap().to_owned();
        let page = self.send("GET", "/ui", &[("cookie", &cookie)], "").await;
        assert_eq!(page.status, 200);
        let csrf = page
            .body
            .split("name=\"csrf\" value=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap()
            .to_owned();
        (cookie, csrf)
    }
}

/// A console with one ambiguous record `key`, signed in: the fixture, the
/// record, the `Cookie` header and the CSRF token.
async fn signed_in_with(key: &str) -> (Fixture, RecordId, String, String) {
    let f = fixture();
    let id = ambiguous(&*f.store, "POST /payouts|aa11", key).await;
    let (cookie, csrf) = f.sign_in().await;
    (f, id, cookie, csrf)
}

fn resolve_form(id: &RecordId, csrf: &str) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("csrf", csrf)
        .append_pair("scope", id.scope.as_str())
        .append_pair("key", id.key.as_str())
        .append_pair("token", "1")
        .append_pair("outcome", "completed")
        .append_pair("status", "201")
        .append_pair("content_type", "application/json")
        .append_pair("body", "{\"payout\":\"<b>m-1</b>\"}")
        .append_pair("reason", "ledger shows m-1")
        .append_pair("confirm", "yes")
        .finish()
}

#[tokio::test]
async fn pages_need_a_session_and_a_wrong_token_opens_none() {
    let f = fixture();
    for path in [
        "/ui",
        "/ui/records",
        "/ui/record?scope=a&key=b",
        "/ui/resolve?scope=a&key=b",
    ] {
        let page = f.send("GET", path, &[], "").await;
        assert_eq!(page.status, 303, "{path}");
        assert_eq!(page.headers["location"], "/ui/sign-in", "{path}");
    }
    let wrong = "token=console-test-token-8d1f0d";
    let refused = f.send("POST", "/ui/sign-in", &[], wrong).await;
    assert_eq!(refused.status, 401);
    assert!(refused.headers.get("set-cookie").is_none());
    assert!(
        refused.body.contains("no operator's token"),
        "{}",
        refused.body
    );
    assert!(
        !refused.body.contains("8d1f0d"),
        "the token is never echoed"
    );
    let (cookie, _) = f.sign_in().await;
    assert!(cookie.starts_with("idem_console="));
    let page = f.send("GET", "/ui", &[("cookie", &cookie)], "").await;
    assert!(page.body.contains("Ambiguous backlog"));
    assert!(!page.body.contains(TOKEN));
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'none'"), "{csp}");
}

#[tokio::test]
async fn a_state_change_needs_the_csrf_token_and_the_same_origin() {
    let f = fixture();
    let id = ambiguous(&*f.store, "POST /payouts|aa11", "k-1").await;
    let (cookie, csrf) = f.sign_in().await;
    let same = [
        ("cookie", cookie.as_str()),
        ("origin", "http://127.0.0.1:9090"),
    ];
    let refusals: [(Headers, &str, &str); 4] = [
        (&same, "0000", "CSRF token does not match"),
        (&same, "", "CSRF token does not match"),
        (
            &[("cookie", &cookie), ("origin", "http://127.0.0.1:9091")],
            &csrf,
            "another origin",
        ),
        (
            &[("cookie", &cookie), ("sec-fetch-site", "same-site")],
            &csrf,
            "another origin",
        ),
    ];
    for (headers, token, why) in refusals {
        let answer = f
            .send("POST", "/ui/resolve", headers, &resolve_form(&id, token))
            .await;
        assert_eq!(answer.status, 403, "{headers:?}");
        assert!(answer.body.contains(why), "{why}: {}", answer.body);
        let record = f.store.get(&id).await.unwrap().unwrap();
        assert_eq!(record.state, RecordState::Ambiguous, "nothing changed");
    }
    let done = f
        .send("POST", "/ui/resolve", &same, &resolve_form(&id, &csrf))
        .await;
    assert_eq!(done.status, 303, "{}", done.body);
    let record = f.store.get(&id).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
    let resolution = record.resolution.unwrap();
    assert_eq!(
        (resolution.by.as_str(), resolution.reason.as_str()),
        ("operator:admin", "ledger shows m-1")
    );
    let result = record.result.unwrap();
    assert_eq!(result.status(), 201);
    assert_eq!(
        result.headers(),
        [("content-type".to_owned(), "application/json".into())]
    );
    // The same form again: the record moved on, nothing is overwritten.
    let again = f
        .send("POST", "/ui/resolve", &same, &resolve_form(&id, &csrf))
        .await;
    assert_eq!(again.status, 409, "{}", again.body);
    assert!(again.body.contains("not ambiguous"), "{}", again.body);
    // Signed out, the cookie opens nothing.
    let out = f
        .send("POST", "/ui/sign-out", &same, &format!("csrf={csrf}"))
        .await;
    assert_eq!(out.status, 303);
    assert_eq!(f.send("GET", "/ui", &same, "").await.status, 303);
}

#[tokio::test]
async fn a_resolution_needs_a_reason_and_the_confirmation() {
    let f = fixture();
    let id = ambiguous(&*f.store, "POST /payouts|aa11", "k-2").await;
    let (cookie, csrf) = f.sign_in().await;
    let headers = [("cookie", cookie.as_str())];
    let form = resolve_form(&id, &csrf);
    let moved_on = "belongs to another attempt";
    let cases = [
        (
            form.replace("&confirm=yes", ""),
            "Tick the confirmation",
            422,
        ),
        (
            form.replace("reason=ledger+shows+m-1", "reason=+"),
            "field `reason` must not be empty",
            422,
        ),
        (
            form.replace("status=201", "status=abc"),
            "field `status` is \"abc\"",
            422,
        ),
        (form.replace("token=1", "token=2"), moved_on, 409),
        // A form about another attempt is never sent back re-rendered with
        // the record's token, whatever else is wrong with it.
        (
            form.replace("token=1", "token=2")
                .replace("&confirm=yes", ""),
            moved_on,
            409,
        ),
        (
            form.replace("token=1", "token=2")
                .replace("status=201", "status=abc"),
            moved_on,
            409,
        ),
    ];
    for (form, why, status) in cases {
        let answer = f.send("POST", "/ui/resolve", &headers, &form).await;
        assert_eq!(answer.status, status, "{why}: {}", answer.body);
        assert!(
            answer.body.contains(&why.replace('"', "&quot;")),
            "{why}: {}",
            answer.body
        );
        let record = f.store.get(&id).await.unwrap().unwrap();
        assert_eq!(
            record.state,
            RecordState::Ambiguous,
            "{why}: nothing changed"
        );
    }
}

#[tokio::test]
async fn stored_text_is_escaped_never_markup() {
    let f = fixture();
    let id = ambiguous(
        &*f.store,
        "POST /payouts|<i>p</i>",
        "<script>alert(1)</script>",
    )
    .await;
    let (cookie, _) = f.sign_in().await;
    let headers = [("cookie", cookie.as_str())];
    for path in [
        "/ui/records".to_owned(),
        pages::link("/ui/record", &id),
        pages::link("/ui/resolve", &id),
    ] {
        let page = f.send("GET", &path, &headers, "").await;
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        assert!(
            page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{path}: {}",
            page.body
        );
        assert!(
            !page.body.contains("<script>") && !page.body.contains("<i>p"),
            "{path}"
        );
    }
}

/// Every console answer, whatever produced it (a page, a redirect, a
/// refusal, axum's own 404, 405 or 413), carries the protecting headers:
/// no script, no framing of the resolve button, no caching of record data.
#[tokio::test]
async fn every_answer_carries_the_protecting_headers() {
    let (f, id, cookie, csrf) = signed_in_with("k-h").await;
    let session = [("cookie", cookie.as_str())];
    let big = format!("csrf={csrf}&body={}", "a".repeat(CONSOLE_FORM_BYTES_MAX));
    let cases: [(&str, String, Headers, String, u16); 11] = [
        ("GET", "/ui".into(), &[], String::new(), 303),
        ("GET", "/ui/sign-in".into(), &[], String::new(), 200),
        ("GET", "/ui/style.css".into(), &[], String::new(), 200),
        ("GET", "/ui/favicon.svg".into(), &[], String::new(), 200),
        ("GET", "/ui/nowhere".into(), &[], String::new(), 404),
        ("GET", "/ui/sign-out".into(), &[], String::new(), 405),
        (
            "GET",
            pages::link("/ui/record", &id),
            &session,
            String::new(),
            200,
        ),
        (
            "GET",
            pages::link("/ui/resolve", &id),
            &session,
            String::new(),
            200,
        ),
        (
            "GET",
            "/ui/records?older_than_min=-1".into(),
            &session,
            String::new(),
            400,
        ),
        ("POST", "/ui/resolve".into(), &session, "csrf=0".into(), 403),
        ("POST", "/ui/resolve".into(), &session, big, 413),
    ];
    let want = [
        (
            "content-security-policy",
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        ("x-frame-options", "DENY"),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "same-origin"),
        ("cache-control", "no-store"),
    ];
    for (method, path, headers, form, status) in cases {
        let answer = f.send(method, &path, headers, &form).await;
        assert_eq!(
            answer.status, status,
            "{method} {path}: {:.300}",
            answer.body
        );
        for (name, value) in want {
            assert_eq!(
                answer.headers.get(name).and_then(|v| v.to_str().ok()),
                Some(value),
                "{method} {path}: {name}"
            );
        }
    }
}

/// A sign-in form is small: the longest token, fully escaped, is read and
/// refused as a wrong token; anything longer is not read at all.
#[tokio::test]
async fn a_sign_in_form_is_bounded() {
    let f = fixture();
    let longest = "%21".repeat(idem_gateway::admin::ADMIN_TOKEN_BYTES_MAX);
    let fits = f
        .send("POST", "/ui/sign-in", &[], &format!("token={longest}"))
        .await;
    assert_eq!(fits.status, 401, "{}", fits.body);
    let over = format!("token={}", "a".repeat(SIGN_IN_FORM_BYTES_MAX));
    let started = std::time::Instant::now();
    let refused = f.send("POST", "/ui/sign-in", &[], &over).await;
    assert_eq!(refused.status, 413, "{}", refused.body);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "answered at once"
    );
    assert!(refused.headers.get("set-cookie").is_none());
}

/// A link can say `done=completed`; the page believes it only when the
/// journal shows the console resolved the record so.
#[tokio::test]
async fn a_resolved_notice_needs_the_resolution_in_the_journal() {
    let (f, id, cookie, csrf) = signed_in_with("k-n").await;
    let session = [("cookie", cookie.as_str())];
    let forged = format!("{}&done=completed", pages::link("/ui/record", &id));
    let page = f.send("GET", &forged, &session, "").await;
    assert_eq!(page.status, 200);
    assert!(!page.body.contains("Resolved as"), "{}", page.body);
    let done = f
        .send("POST", "/ui/resolve", &session, &resolve_form(&id, &csrf))
        .await;
    assert_eq!(done.status, 303, "{}", done.body);
    let location = done.headers["location"].to_str().unwrap().to_owned();
    let page = f.send("GET", &location, &session, "").await;
    assert!(page.body.contains("Resolved as completed"), "{}", page.body);
    let other = location.replace("done=completed", "done=not_executed");
    let page = f.send("GET", &other, &session, "").await;
    assert!(!page.body.contains("Resolved as"), "{}", page.body);
}

/// Signing in again from a browser that has a session ends that session:
/// its cookie opens nothing any more.
#[tokio::test]
async fn signing_in_again_ends_the_previous_session() {
    let f = fixture();
    let (first, _) = f.sign_in().await;
    let again = f
        .send(
            "POST",
            "/ui/sign-in",
            &[("cookie", &first)],
            &format!("token={TOKEN}"),
        )
        .await;
    assert_eq!(again.status, 303, "{}", again.body);
    let second = again.headers["set-cookie"].to_str().unwrap();
    let second = second.split(';').next().unwrap();
    assert_ne!(second, first);
    assert_eq!(
        f.send("GET", "/ui", &[("cookie", &first)], "").await.status,
        303
    );
    assert_eq!(
        f.send("GET", "/ui", &[("cookie", second)], "").await.status,
        200
    );
}

/// A state change without a session is refused before its body is read:
/// a body that never ends gets the answer at once.
#[tokio::test]
async fn a_change_without_a_session_is_refused_before_its_body() {
    let f = fixture();
    for path in ["/ui/resolve", "/ui/sign-out"] {
        let first = futures_util::stream::once(async { Ok::<_, std::io::Error>("csrf=") });
        let endless = futures_util::StreamExt::chain(first, futures_util::stream::pending());
        let req = Request::post(path)
            .header("host", HOST)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("cookie", "idem_console=0000")
            .body(Body::from_stream(endless))
            .unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(5), f.app.clone().oneshot(req))
            .await
            .expect("answered without reading the body")
            .unwrap();
        assert_eq!(answer.status(), 401, "{path}");
    }
}

/// A form that is not UTF-8 once decoded is refused, not stored with
/// replacement characters; the admin API refuses the same.
#[tokio::test]
async fn a_form_that_is_not_utf8_changes_nothing() {
    let (f, id, cookie, csrf) = signed_in_with("k-u").await;
    let session = [("cookie", cookie.as_str())];
    let form = resolve_form(&id, &csrf);
    for bad in [
        form.replace("ledger+shows", "ledger%FF%FEshows"),
        form.replace("ledger+shows", "ledger%Fshows"),
        form.replace("ledger+shows", "ledger%E2%9Cshows"),
    ] {
        let answer = f.send("POST", "/ui/resolve", &session, &bad).await;
        assert_eq!(answer.status, 400, "{bad}: {}", answer.body);
        assert!(answer.body.contains("could not be read"), "{}", answer.body);
        assert!(!answer.body.contains(&csrf), "the form is not echoed");
        let record = f.store.get(&id).await.unwrap().unwrap();
        assert_eq!(record.state, RecordState::Ambiguous, "{bad}");
    }
    let unicode = form.replace("ledger+shows", "ledger+%E2%9C%93+shows");
    let answer = f.send("POST", "/ui/resolve", &session, &unicode).await;
    assert_eq!(answer.status, 303, "{}", answer.body);
    let record = f.store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        record.resolution.unwrap().reason,
        "ledger \u{2713} shows m-1"
    );
}

/// Wrong tokens, however many arrive together, are each refused at once,
/// as the admin API refuses a wrong bearer token: nothing queues them, and
/// none locks the operator out; the right token signs in at once after them.
#[tokio::test]
async fn many_wrong_tokens_are_each_refused_at_once() {
    let f = Arc::new(fixture());
    let quick = Duration::from_millis(500);
    let wrong: Vec<_> = (0..64)
        .map(|_| {
            let f = f.clone();
            tokio::spawn(async move { f.send("POST", "/ui/sign-in", &[], "token=wrong").await })
        })
        .collect();
    let refusals = tokio::time::timeout(quick, futures_util::future::join_all(wrong))
        .await
        .expect("every wrong token answered at once");
    for refused in refusals {
        let refused = refused.unwrap();
        assert_eq!(refused.status, 401, "{}", refused.body);
        assert!(
            refused.body.contains("no operator's token"),
            "{}",
            refused.body
        );
        assert!(refused.headers.get("set-cookie").is_none());
    }
    let form = format!("token={TOKEN}");
    let right = f.send("POST", "/ui/sign-in", &[], &form);
    let right = tokio::time::timeout(quick, right)
        .await
        .expect("answered at once");
    assert_eq!(right.status, 303, "{}", right.body);
}

/// Wrong sign-ins are logged within the refusal log the console was given
/// (the admin API's, when mounted): past its lines they are counted, not
/// written, whichever of the two a flood goes through.
#[tokio::test]
async fn wrong_sign_ins_spend_the_refusal_log_they_are_given() {
    let refusals = RefusalLog::default();
    let f = fixture_logging_to(refusals.clone());
    let lines_max = idem_gateway::admin::ADMIN_REFUSAL_LOG_LINES_MAX;
    for _ in 0..lines_max {
        let refused = f.send("POST", "/ui/sign-in", &[], "token=wrong").await;
        assert_eq!(refused.status, 401, "{}", refused.body);
    }
    assert_eq!(refusals.admit(Instant::now()), Logged::Suppressed);
    let fresh = RefusalLog::default();
    assert_eq!(fresh.admit(Instant::now()), Logged::Write { suppressed: 0 });
}

#[tokio::test]
async fn header_bytes_that_are_not_utf8_show_escaped_never_dropped() {
    let f = fixture();
    let id = ambiguous(&*f.store, "POST /payouts|aa11", "bytes-1").await;
    let headers = vec![
        ("location".to_owned(), b"/payouts/caf\xe9".as_slice().into()),
        ("x-note".to_owned(), "<b>naïve</b>".into()),
    ];
    let result = StoredResult::new(201, headers, b"paid".to_vec()).unwrap();
    let resolution = Resolution::new(Outcome::Completed { result }, "operator", "ledger").unwrap();
    f.store.resolve(&id, Token(1), resolution).await.unwrap();
    let (cookie, _) = f.sign_in().await;
    let path = pages::link("/ui/record", &id);
    let page = f.send("GET", &path, &[("cookie", &cookie)], "").await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("/payouts/caf\\xe9"), "{}", page.body);
    assert!(
        page.body.contains("&lt;b&gt;naïve&lt;/b&gt;"),
        "{}",
        page.body
    );
    assert!(!page.body.contains("<b>naïve"), "{}", page.body);
}

#[tokio::test]
async fn the_overview_warns_while_a_suspect_window_is_open() {
    let f = fixture();
    let (cookie, _) = f.sign_in().await;
    let page = f.send("GET", "/ui", &[("cookie", &cookie)], "").await;
    assert!(!page.body.contains("suspect-window"), "no window yet");
    let opening = idem_core::WindowOpening {
        length_ms: 3_600_000,
        since: None,
        cause: "timeline 1 -> 2 <b>".into(),
    };
    f.store.open_suspect_window(&opening).await.unwrap();
    let page = f.send("GET", "/ui", &[("cookie", &cookie)], "").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("id=\"suspect-window\""), "{}", page.body);
    assert!(
        page.body.contains("timeline 1 -&gt; 2 &lt;b&gt;"),
        "escaped: {}",
        page.body
    );
    assert!(page.body.contains("unknown (a promotion)"), "{}", page.body);
}

/// A resolve form sent without a verdict is refused with a message that
/// says to choose, and nothing changes; the form never preselects one.
#[tokio::test]
async fn a_resolution_without_a_verdict_is_refused() {
    let (f, id, cookie, csrf) = signed_in_with("v-1").await;
    let same = [
        ("cookie", cookie.as_str()),
        ("origin", "http://127.0.0.1:9090"),
    ];
    let page = f
        .send("GET", &pages::link("/ui/resolve", &id), &same, "")
        .await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        !page.body.contains("\" checked"),
        "no verdict preselected: {}",
        page.body
    );
    let form = resolve_form(&id, &csrf).replace("outcome=completed&", "");
    let refused = f.send("POST", "/ui/resolve", &same, &form).await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert!(
        refused
            .body
            .contains("Choose what happened at the provider"),
        "{}",
        refused.body
    );
    let record = f.store.get(&id).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Ambiguous, "nothing changed");
    assert!(f.store.resolutions(&id).await.unwrap().is_empty());
}

/// Each named operator signs in with their own token and resolves under
/// their own name; the single token of old configs is operator `admin`.
#[tokio::test]
async fn each_operator_resolves_under_their_own_name() {
    use idem_gateway::{OperatorName, Operators};
    let clock = ManualClock::new(SystemClock.now());
    let store = Arc::new(MemoryStore::new(Arc::new(clock)));
    let named = vec![
        (
            OperatorName::new("admin").unwrap(),
            AdminToken::new(TOKEN).unwrap(),
        ),
        (
            OperatorName::new("ana").unwrap(),
            AdminToken::new("ana-console-token-0123").unwrap(),
        ),
    ];
    let state = ConsoleState::new(
        store.clone(),
        Arc::new(Metrics::new()),
        Operators::new(named, None).unwrap(),
        vec![Route::default_catch_all()],
    );
    let f = Fixture {
        store,
        app: router(state),
    };
    let id = ambiguous(&*f.store, "POST /payouts|aa11", "n-1").await;
    let signed = f
        .send("POST", "/ui/sign-in", &[], "token=ana-console-token-0123")
        .await;
    assert_eq!(signed.status, 303, "{}", signed.body);
    let set = signed.headers["set-cookie"].to_str().unwrap();
    let cookie = set.split(';').next().unwrap().to_owned();
    let page = f.send("GET", "/ui", &[("cookie", &cookie)], "").await;
    assert!(
        page.body.contains("Signed in as <strong>ana</strong>"),
        "{}",
        page.body
    );
    let csrf = page
        .body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    let same = [
        ("cookie", cookie.as_str()),
        ("origin", "http://127.0.0.1:9090"),
    ];
    let done = f
        .send("POST", "/ui/resolve", &same, &resolve_form(&id, &csrf))
        .await;
    assert_eq!(done.status, 303, "{}", done.body);
    let journal = f.store.resolutions(&id).await.unwrap();
    assert_eq!(journal.len(), 1);
    assert_eq!(journal[0].by, "operator:ana");
}

/// Where a trusted proxy names the operator, the sign-in page offers to
/// continue as that operator, and the session resolves in their name; a
/// sign-in without a token and without the header opens nothing.
#[tokio::test]
async fn a_trusted_proxys_header_names_the_operator() {
    use idem_gateway::Operators;
    let clock = ManualClock::new(SystemClock.now());
    let store = Arc::new(MemoryStore::new(Arc::new(clock)));
    let header = http::HeaderName::from_static("x-forwarded-user");
    let state = ConsoleState::new(
        store.clone(),
        Arc::new(Metrics::new()),
        Operators::new(Vec::new(), Some(header)).unwrap(),
        vec![Route::default_catch_all()],
    );
    let f = Fixture {
        store,
        app: router(state),
    };
    let id = ambiguous(&*f.store, "POST /payouts|aa11", "h-1").await;
    let proxied = [("x-forwarded-user", "carla@example.com")];
    let page = f.send("GET", "/ui/sign-in", &proxied, "").await;
    assert!(
        page.body.contains("Continue as carla@example.com"),
        "{}",
        page.body
    );
    let alone = f.send("POST", "/ui/sign-in", &[], "token=").await;
    assert_eq!(alone.status, 401, "no token, no header: {}", alone.body);
    assert!(alone.headers.get("set-cookie").is_none());
    let signed = f.send("POST", "/ui/sign-in", &proxied, "token=").await;
    assert_eq!(signed.status, 303, "{}", signed.body);
    let set = signed.headers["set-cookie"].to_str().unwrap();
    let cookie = set.split(';').next().unwrap().to_owned();
    let page = f.send("GET", "/ui", &[("cookie", &cookie)], "").await;
    let csrf = page
        .body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    let same = [
        ("cookie", cookie.as_str()),
        ("origin", "http://127.0.0.1:9090"),
    ];
    let done = f
        .send("POST", "/ui/resolve", &same, &resolve_form(&id, &csrf))
        .await;
    assert_eq!(done.status, 303, "{}", done.body);
    let journal = f.store.resolutions(&id).await.unwrap();
    assert_eq!(journal[0].by, "operator:carla@example.com");
}

/// A route scoped by raw credentials cannot be searched by tenant, and
/// the page says why; without a lookup, asking the provider is refused
/// and nothing changes.
#[tokio::test]
async fn what_cannot_be_searched_or_asked_says_why() {
    let (f, id, cookie, csrf) = signed_in_with("s-1").await;
    let signed = [("cookie", cookie.as_str())];
    let search = f.send("GET", "/ui/records?tenant=acme", &signed, "").await;
    assert_eq!(search.status, 400, "{}", search.body);
    assert!(search.body.contains("raw credentials"), "{}", search.body);
    let by_key = f.send("GET", "/ui/records?key=s-*", &signed, "").await;
    assert_eq!(by_key.status, 200, "{}", by_key.body);
    assert!(by_key.body.contains("<code>s-1</code>"), "{}", by_key.body);
    let record = f
        .send("GET", &pages::link("/ui/record", &id), &signed, "")
        .await;
    assert!(
        !record.body.contains("Ask the provider now"),
        "{}",
        record.body
    );
    for section in ["Why it is ambiguous", "Request summary", "Not recorded"] {
        assert!(record.body.contains(section), "{section}: {}", record.body);
    }
    let same = [
        ("cookie", cookie.as_str()),
        ("origin", "http://127.0.0.1:9090"),
    ];
    let form = form_urlencoded::Serializer::new(String::new())
        .append_pair("csrf", &csrf)
        .append_pair("scope", id.scope.as_str())
        .append_pair("key", id.key.as_str())
        .append_pair("token", "1")
        .finish();
    let asked = f.send("POST", "/ui/ask", &same, &form).await;
    assert_eq!(asked.status, 409, "{}", asked.body);
    assert!(asked.body.contains("no [[lookup]]"), "{}", asked.body);
    let record = f.store.get(&id).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Ambiguous);
}

/// A console over a real SQLite file whose clock the test moves, signed
/// in as `admin`: the fixture, the SQLite store (kept open while it
/// lives), the clock, the `Cookie` header and the CSRF token.
async fn over_sqlite() -> (Fixture, TestStore, ManualClock, String, String) {
    let clock = ManualClock::new(SystemClock.now());
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let opened = open_with_clock(Backend::Sqlite, "console-verbs", Some(shared)).await;
    let state = ConsoleState::new(
        opened.store.clone(),
        Arc::new(Metrics::new()),
        AdminToken::new(TOKEN).unwrap(),
        vec![Route::default_catch_all()],
    );
    let f = Fixture {
        store: opened.store.clone(),
        app: router(state),
    };
    let (cookie, csrf) = f.sign_in().await;
    (f, opened, clock, cookie, csrf)
}

/// A verb's form about `id`'s attempt `token`.
fn verb_form(id: &RecordId, csrf: &str, token: &str, reason: &str, confirm_key: &str) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("csrf", csrf)
        .append_pair("scope", id.scope.as_str())
        .append_pair("key", id.key.as_str())
        .append_pair("token", token)
        .append_pair("reason", reason)
        .append_pair("confirm_key", confirm_key)
        .finish()
}

/// Completes the ambiguous record `id` (token 1) with a 201.
async fn complete(store: &dyn Store, id: &RecordId) {
    let result = StoredResult::new(201, Vec::new(), b"paid".to_vec()).unwrap();
    let resolution = Resolution::new(Outcome::Completed { result }, "operator", "ledger").unwrap();
    store.resolve(id, Token(1), resolution).await.unwrap();
}

/// Expire and evict refuse, changing nothing and saying why, a form
/// without a reason, about another attempt (wrong token), an evict
/// without the key typed again, an expire of a record that is not
/// completed, and an evict while the attempt's lease runs; the record
/// page offers only what applies and says why evict is not offered.
#[tokio::test]
async fn the_verbs_refuse_what_they_must_and_change_nothing() {
    let (f, _sqlite, clock, cookie, csrf) = over_sqlite().await;
    let same = [
        ("cookie", cookie.as_str()),
        ("origin", "http://127.0.0.1:9090"),
    ];
    let id = ambiguous(&*f.store, "POST /payouts|aa11", "v-1").await;
    let page = f
        .send("GET", &pages::link("/ui/record", &id), &same[..1], "")
        .await;
    assert!(!page.body.contains("id=\"expire\""), "{}", page.body);
    assert!(!page.body.contains("id=\"evict\""), "{}", page.body);
    assert!(
        page.body.contains("an attempt may still commit until"),
        "{}",
        page.body
    );
    let key = id.key.as_str();
    let cases = [
        (
            "/ui/evict",
            verb_form(&id, &csrf, "1", "gone", key),
            409,
            "may still commit until",
        ),
        (
            "/ui/expire",
            verb_form(&id, &csrf, "1", "old", ""),
            409,
            "only a completed record",
        ),
        (
            "/ui/evict",
            verb_form(&id, &csrf, "1", "  ", key),
            422,
            "Say why you evict",
        ),
        (
            "/ui/evict",
            verb_form(&id, &csrf, "1", "gone", "v-2"),
            422,
            "Type the record's key",
        ),
    ];
    for (path, form, status, said) in &cases {
        let answer = f.send("POST", path, &same, form).await;
        assert_eq!(answer.status, *status, "{path}: {}", answer.body);
        assert!(answer.body.contains(said), "{said}: {}", answer.body);
        assert!(
            answer.body.contains("Nothing was changed"),
            "{}",
            answer.body
        );
    }
    let record = f.store.get(&id).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Ambiguous);
    assert!(f.store.resolutions(&id).await.unwrap().is_empty());

    complete(&*f.store, &id).await;
    let page = f
        .send("GET", &pages::link("/ui/record", &id), &same[..1], "")
        .await;
    assert!(page.body.contains("id=\"expire\""), "{}", page.body);
    assert!(page.body.contains("id=\"evict\""), "{}", page.body);
    let refusals = [
        (
            "/ui/expire",
            verb_form(&id, &csrf, "2", "old", ""),
            409,
            "another attempt",
        ),
        (
            "/ui/evict",
            verb_form(&id, &csrf, "2", "gone", key),
            409,
            "another attempt",
        ),
        (
            "/ui/expire",
            verb_form(&id, &csrf, "1", "", ""),
            422,
            "Say why you expire",
        ),
        (
            "/ui/expire",
            verb_form(&id, &csrf, "x", "old", ""),
            422,
            "lost the record's token",
        ),
    ];
    for (path, form, status, said) in &refusals {
        let answer = f.send("POST", path, &same, form).await;
        assert_eq!(answer.status, *status, "{path}: {}", answer.body);
        assert!(answer.body.contains(said), "{said}: {}", answer.body);
    }
    let record = f.store.get(&id).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
    assert!(record.result.is_some());
    assert_eq!(f.store.resolutions(&id).await.unwrap().len(), 1);

    // A fresh attempt whose lease has ended may be evicted.
    let late = ambiguous(&*f.store, "POST /payouts|aa11", "v-late").await;
    let token = f
        .store
        .get(&late)
        .await
        .unwrap()
        .unwrap()
        .token
        .0
        .to_string();
    clock.advance_millis(Policy::DEFAULT.lease_ms() + 1);
    let evicted = f
        .send(
            "POST",
            "/ui/evict",
            &same,
            &verb_form(&late, &csrf, &token, "provider has nothing", "v-late"),
        )
        .await;
    assert_eq!(evicted.status, 303, "{}", evicted.body);
    assert!(f.store.get(&late).await.unwrap().is_none());
}

/// Expire, then evict, each journaled by the signed-in operator; the
/// record page's timeline and journal name the verb, the operator and the
/// reason; a cross-site or CSRF-less verb is refused like every change.
#[tokio::test]
async fn expire_then_evict_journal_the_operator() {
    let (f, _sqlite, _clock, cookie, csrf) = over_sqlite().await;
    let same = [
        ("cookie", cookie.as_str()),
        ("origin", "http://127.0.0.1:9090"),
    ];
    let id = ambiguous(&*f.store, "POST /payouts|aa11", "v-2").await;
    complete(&*f.store, &id).await;
    let cross = [
        ("cookie", cookie.as_str()),
        ("origin", "https://evil.example"),
    ];
    let form = verb_form(&id, &csrf, "1", "customer asked", "");
    let refused = f.send("POST", "/ui/expire", &cross, &form).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    let no_csrf = verb_form(&id, "wrong", "1", "customer asked", "");
    let refused = f.send("POST", "/ui/expire", &same, &no_csrf).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(
        f.store.get(&id).await.unwrap().unwrap().state,
        RecordState::Completed
    );

    let expired = f.send("POST", "/ui/expire", &same, &form).await;
    assert_eq!(expired.status, 303, "{}", expired.body);
    let to = expired.headers["location"].to_str().unwrap().to_owned();
    let page = f.send("GET", &to, &same[..1], "").await;
    assert!(
        page.body.contains("Expired by operator:admin"),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains("expired by <code>operator:admin</code>: customer asked"),
        "{}",
        page.body
    );
    let record = f.store.get(&id).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Tombstone);
    assert!(!page.body.contains("id=\"expire\""), "{}", page.body);
    assert!(page.body.contains("id=\"evict\""), "{}", page.body);

    let form = verb_form(&id, &csrf, "1", "run it again", "v-2");
    let evicted = f.send("POST", "/ui/evict", &same, &form).await;
    assert_eq!(evicted.status, 303, "{}", evicted.body);
    let to = evicted.headers["location"].to_str().unwrap().to_owned();
    let page = f.send("GET", &to, &same[..1], "").await;
    assert!(
        page.body.contains("Evicted by operator:admin"),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains("evicted by <code>operator:admin</code>: run it again"),
        "{}",
        page.body
    );
    assert!(f.store.get(&id).await.unwrap().is_none());
    let journal = f.store.resolutions(&id).await.unwrap();
    let verbs: Vec<_> = journal.iter().map(|e| (e.verb, e.by.as_str())).collect();
    assert_eq!(
        verbs,
        [
            (None, "operator"),
            (Some(Verb::Expire), "operator:admin"),
            (Some(Verb::Evict), "operator:admin"),
        ]
    );
    // Evicting again: nothing is stored any more.
    let again = f.send("POST", "/ui/evict", &same, &form).await;
    assert_eq!(again.status, 409, "{}", again.body);
    assert!(again.body.contains("No record is stored"), "{}", again.body);
}

/// A completed record past its retention is a tombstone to every
/// decision, and the list shows it so, as the search judges it, not as
/// the `completed` row the store still holds. The console reads the
/// system clock; the store's clock starts 10 s before it, so that a
/// record kept 1 s is past its retention when the console looks.
#[tokio::test]
async fn the_list_shows_each_state_as_the_search_judged_it() {
    let then = SystemClock.now().as_millis() - 10_000;
    let clock = ManualClock::new(idem_core::Timestamp::from_millis(then));
    let store = Arc::new(MemoryStore::new(Arc::new(clock)));
    let state = ConsoleState::new(
        store.clone(),
        Arc::new(Metrics::new()),
        AdminToken::new(TOKEN).unwrap(),
        vec![Route::default_catch_all()],
    );
    let f = Fixture {
        store: store.clone(),
        app: router(state),
    };
    let mut req = claim_request("POST /payouts|aa11", "aged-1");
    req.policy = Policy::new(30_000, 1, 3_600, idem_core::LeaseExpiry::Reconcile).unwrap();
    let Claim::Acquired { token, .. } = store.claim(&req).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    let result = StoredResult::new(201, Vec::new(), b"paid".to_vec()).unwrap();
    store.complete(&req.id, token, result).await.unwrap();
    let (cookie, _) = f.sign_in().await;
    let listed = f
        .send(
            "GET",
            "/ui/records?state=any",
            &[("cookie", cookie.as_str())],
            "",
        )
        .await;
    assert!(listed.body.contains("aged-1"), "{}", listed.body);
    assert!(
        listed.body.contains("<dd>tombstone</dd>"),
        "{}",
        listed.body
    );
    assert!(
        !listed.body.contains("<dd>completed</dd>"),
        "{}",
        listed.body
    );
}
