//! The operator's console in a real browser: headless Chromium driven by
//! chromedriver through WebDriver, against a real `idem serve` on an
//! SQLite file in front of an upstream that answers 503, so every payout
//! is left ambiguous. Operator ana signs in with her own token (after a
//! wrong one), finds a record by key and by tenant, opens it, is refused
//! a resolution without a verdict, resolves it, the journal keeps her
//! name, and the client's retry through the gateway replays the answer;
//! she expires that record (a late retry is refused as key-expired), then
//! evicts it once the key is typed right (the retry runs once more), both
//! journaled under her name, as is the lookup she asked the provider for;
//! the session ends when idle; operator admin (the single token of older
//! configs) signs in and resolves another record with the keyboard
//! alone, every focused control outlined; a form auto-submitted
//! from another origin changes nothing; every page fits 390 px and
//! 1280 px without horizontal scrolling.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs
//! them). With `IDEM_CONSOLE_SCREENSHOTS=DIR` it saves a PNG of each page.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::StatusCode;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use idem_testkit::free_port;
use serde_json::{Value, json};
use support::{Gateway, Site, post, send};

const TOKEN: &str = "console-browser-token-3c9e1f7a";
/// Operator ana's own token.
const TOKEN_ANA: &str = "console-browser-token-ana-51d0";
const PAYOUT: &str = r#"{"seller":847,"amount":12345678901234567890.25,"currency":"EUR","iban":"DE89370400440532013000"}"#;
/// The console's idle limit in this test, in seconds.
const IDLE_S: u64 = 4;
const WIDTHS: [u32; 2] = [390, 1280];
/// The key resolved in the browser: long, without a break opportunity,
/// as real keys are, so a page that cannot wrap it scrolls sideways.
const PAY_1: &str = "pay-1:settlement_2026_W36:seller_000847:batch_0001:run_0001";

/// chromedriver, killed when dropped.
struct Driver {
    child: Child,
    port: u16,
}

/// An upstream that answers every request 503 and counts them: whatever
/// it did, the gateway cannot know, so each first attempt is ambiguous.
struct Unsure {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
}

/// A running console and a browser on it.
struct Scene {
    browser: Client,
    admin: SocketAddr,
    /// The principal digest of tenant acme.
    acme: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_resolves_an_ambiguous_payout_in_the_browser() {
    let driver = Driver::start();
    let upstream = Unsure::start().await;
    // The refunds provider: its lookup finds every refund.
    let provider = found_everything().await;
    let site = Site::new();
    let config = site.config(&format!(
        "console_session_idle_s = {IDLE_S}\n\
         admin_token_env = \"IDEM_ADMIN_TOKEN\"\n\
         [[admin.operator]]\nname = \"ana\"\ntoken_env = \"IDEM_ADMIN_TOKEN_ANA\"\n\
         [[route]]\nname = \"payouts\"\nmethods = [\"POST\"]\npath = \"/payouts\"\n\
         principal = {{ header = \"x-tenant\" }}\n\
         summary_fields = [\"/seller\", \"/amount\"]\n\
         [[route]]\nname = \"refunds\"\nmethods = [\"POST\"]\npath = \"/refunds\"\n\
         principal = {{ header = \"x-tenant\" }}\n\
         forward_key = {{ template = \"{{scope_digest}}:{{key}}\" }}\n\
         [reconcile]\ninterval_s = 3600\n\
         [[lookup]]\nroute = \"refunds\"\nurl = \"{provider}/by-key/{{forwarded_key}}\"\ntimeout_ms = 2000\n"
    ));
    let upstream_url = format!("http://{}", upstream.addr);
    let env = [("IDEM_ADMIN_TOKEN_ANA", TOKEN_ANA)];
    let (gw, admin) =
        Gateway::start_admin_env(&upstream_url, &site.store(), Some(&config), TOKEN, &env);
    for (path, tenant, key) in [
        ("/payouts", "acme", PAY_1),
        ("/payouts", "globex", "pay-2"),
        ("/refunds", "acme", "ref-1"),
        ("/payouts", "acme", "pay-3"),
    ] {
        let first = pay(&gw, path, tenant, key).await;
        assert_eq!(first.status, 503, "{first:?}");
    }
    assert_eq!(upstream.hits(), 4);
    let scene = Scene {
        browser: driver.browser().await,
        admin,
        acme: principal_of(admin, PAY_1).await,
    };

    scene.sign_in_after_a_wrong_token().await;
    scene.search_and_open_pay_1().await;
    scene.refuse_a_resolution_without_a_verdict().await;
    scene.resolve_as_completed().await;
    // The journal keeps the operator's name.
    let pay_1 = format!("/records/payouts%7C{}/{}", scene.acme, PAY_1);
    let record = admin_get(admin, &pay_1).await;
    assert_eq!(record["resolution"]["by"], "operator:ana", "{record}");
    scene.ask_the_provider_about_ref_1().await;
    // The client's retry, through the gateway, replays the resolution.
    let retry = pay(&gw, "/payouts", "acme", PAY_1).await;
    let replayed = (retry.status, retry.body.as_str());
    assert_eq!(replayed, (201, r#"{"payout":"manual-7"}"#), "{retry:?}");
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(upstream.hits(), 4, "the retry never reached the upstream");
    scene.expire_then_evict_pay_1(&gw, &upstream).await;
    let store = format!("sqlite://{}", site.store().display());
    let scope = format!("payouts|{}", scene.acme);
    let shown = support::idem(&[
        "records", "show", &scope, PAY_1, "--format", "json", "--store", &store,
    ]);
    assert!(shown.status.success(), "{}", support::text(&shown.stderr));
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let journal: Vec<(Value, Value)> = shown["resolutions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["verb"].clone(), e["by"].clone()))
        .collect();
    let want = [
        (Value::Null, json!("operator:ana")),
        (json!("expire"), json!("operator:ana")),
        (json!("evict"), json!("operator:ana")),
    ];
    assert_eq!(journal, want, "{shown}");
    // The refund ana asked the provider about is journaled as asked by her.
    let ref_1 = admin_get(admin, &format!("/records/refunds%7C{}/ref-1", scene.acme)).await;
    assert_eq!(
        ref_1["resolution"]["by"], "reconciler (asked by operator:ana)",
        "{ref_1}"
    );
    scene.every_page_fits_without_sideways_scrolling().await;
    scene.an_idle_session_ends().await;
    scene.a_keyboard_alone_resolves_a_record().await;
    scene.a_form_from_another_origin_changes_nothing().await;

    let logs = gw.logs();
    assert!(!logs.contains(TOKEN), "the token is never logged");
    assert!(!logs.contains(TOKEN_ANA), "no operator's token is logged");
    // Every page links its icon under /ui: the browser asked nothing of
    // the admin API without the token (no /favicon.ico), so a console
    // visit leaves no refusal line, the one line that signals guessing.
    assert!(
        !logs.contains("refused a request without a valid token"),
        "a console visit made the admin API refuse a request:\n{logs}"
    );
    scene.browser.close().await.unwrap();
}

impl Scene {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    /// A wrong token is refused and opens nothing; ana's own opens a
    /// session in her name.
    async fn sign_in_after_a_wrong_token(&self) {
        let browser = &self.browser;
        browser.goto(&self.url("/ui")).await.unwrap();
        assert_eq!(browser.current_url().await.unwrap().path(), "/ui/sign-in");
        sign_in(browser, "console-browser-token-3c9e1f7b").await;
        let refused = text_of(browser, "main").await;
        assert!(refused.contains("no operator's token"), "{refused}");
        snap(browser, "sign-in").await;
        sign_in(browser, TOKEN_ANA).await;
        assert_eq!(browser.current_url().await.unwrap().path(), "/ui");
        assert_eq!(text_of(browser, "#operator").await, "Signed in as ana");
        assert_eq!(text_of(browser, "#backlog-count").await, "4");
        snap(browser, "overview").await;
    }

    /// Finds pay-1 by its key alone, then acme's payouts by the tenant's
    /// header value (the page shows the value next to the digest), and
    /// opens pay-1.
    async fn search_and_open_pay_1(&self) {
        let browser = &self.browser;
        follow(browser, Locator::LinkText("Review the ambiguous records")).await;
        fill(browser, "#key", PAY_1).await;
        follow(browser, Locator::Css("form.filter button")).await;
        self.listed(&[PAY_1]).await;
        fill(browser, "#key", "").await;
        fill(browser, "#route", "payouts").await;
        fill(browser, "#tenant", "acme").await;
        follow(browser, Locator::Css("form.filter button")).await;
        self.listed(&[PAY_1, "pay-3"]).await;
        let tenant = text_of(browser, "ul.records .tenant").await;
        assert_eq!(tenant, "acme");
        snap(browser, "search").await;
        follow(browser, Locator::Css("a[href*='key=pay-1']")).await;
        assert_eq!(text_of(browser, "#state").await, "ambiguous");
        assert_eq!(text_of(browser, "#tenant-value").await, "acme");
        let record = text_of(browser, "main").await;
        let forwarded = format!("idempotency-key: {PAY_1}");
        assert!(record.contains(&forwarded), "the forwarded key: {record}");
        for section in ["Why it is ambiguous", "Request summary"] {
            assert!(record.contains(section), "{section}: {record}");
        }
        // Why: the upstream's status and the start of its body, kept by
        // the attempt that marked the record.
        let why = text_of(browser, "#why-cause").await;
        assert!(why.contains("503"), "the upstream's status: {why}");
        let excerpt = text_of(browser, "#why-excerpt").await;
        assert_eq!(excerpt, "the payout rail timed out");
        // What: only the fields the route declares, the amount exactly as
        // the client spelled it; never the IBAN it did not declare.
        let summary = text_of(browser, "#summary-fields").await;
        for shown in ["/seller", "847", "/amount", "12345678901234567890.25"] {
            assert!(summary.contains(shown), "{shown}: {summary}");
        }
        assert!(
            !record.contains("DE89"),
            "an undeclared field is shown: {record}"
        );
        snap(browser, "record").await;
        if std::env::var_os("IDEM_CONSOLE_SCREENSHOTS").is_some() {
            let scroll = "document.getElementById('why').scrollIntoView()";
            browser.execute(scroll, vec![]).await.unwrap();
            snap(browser, "record-why").await;
            browser
                .execute("window.scrollTo(0, 0)", vec![])
                .await
                .unwrap();
        }
    }

    /// The list shows exactly `keys` of the four records.
    async fn listed(&self, keys: &[&str]) {
        let listed = text_of(&self.browser, "ul.records").await;
        for key in [PAY_1, "pay-2", "ref-1", "pay-3"] {
            let shown = listed.contains(&format!("Key {key}"));
            assert_eq!(shown, keys.contains(&key), "{key}: {listed}");
        }
    }

    /// The form preselects no verdict; sent without one it is refused,
    /// says why, and the record stays ambiguous.
    async fn refuse_a_resolution_without_a_verdict(&self) {
        let browser = &self.browser;
        follow(browser, Locator::LinkText("Resolve this record")).await;
        for verdict in ["#completed", "#not_executed"] {
            let radio = browser.find(Locator::Css(verdict)).await.unwrap();
            assert!(!radio.is_selected().await.unwrap(), "{verdict} preselected");
        }
        fill(browser, "#status", "201").await;
        fill(browser, "#body", r#"{"payout":"manual-7"}"#).await;
        fill(browser, "#reason", "provider ledger shows payout manual-7").await;
        click(browser, Locator::Id("confirm")).await;
        follow(browser, Locator::Css("main form button[type=submit]")).await;
        let refused = text_of(browser, "p.error").await;
        assert!(refused.contains("Choose what happened"), "{refused}");
        let pay_1 = format!("/records/payouts%7C{}/{}", self.acme, PAY_1);
        let record = admin_get(self.admin, &pay_1).await;
        assert_eq!(record["state"], "ambiguous", "{record}");
    }

    /// On the form sent back, chooses Completed, confirms again and
    /// resolves; the notice names the operator.
    async fn resolve_as_completed(&self) {
        let browser = &self.browser;
        click(browser, Locator::Id("completed")).await;
        click(browser, Locator::Id("confirm")).await;
        snap(browser, "resolve").await;
        follow(browser, Locator::Css("main form button[type=submit]")).await;
        assert_eq!(text_of(browser, "#state").await, "completed");
        let resolved = text_of(browser, "main").await;
        for said in [
            "Resolved as completed by operator:ana",
            "provider ledger shows payout manual-7",
        ] {
            assert!(resolved.contains(said), "{said}: {resolved}");
        }
    }

    /// pay-1's route has no lookup, so its page offers none; ref-1's has:
    /// one press asks the provider, which finds the refund, and the
    /// record is completed with its answer.
    async fn ask_the_provider_about_ref_1(&self) {
        let browser = &self.browser;
        let pay_3 = format!("/ui/record?scope=payouts%7C{}&key=pay-3", self.acme);
        browser.goto(&self.url(&pay_3)).await.unwrap();
        let no_lookup = browser.find(Locator::Css("#ask")).await;
        assert!(
            no_lookup.is_err(),
            "a route without a lookup offers no lookup"
        );
        browser
            .goto(&self.url("/ui/records?route=refunds&tenant=acme"))
            .await
            .unwrap();
        follow(browser, Locator::Css("a[href*='key=ref-1']")).await;
        assert_eq!(text_of(browser, "#state").await, "ambiguous");
        follow(browser, Locator::Css("#ask button")).await;
        let said = text_of(browser, "p.notice").await;
        assert!(said.contains("it found the effect"), "{said}");
        assert_eq!(text_of(browser, "#state").await, "completed");
        assert_eq!(
            text_of(browser, "#stored-body").await,
            r#"{"refund":"r-1"}"#
        );
    }

    /// On pay-1's page (completed), ana expires it with a reason: a late
    /// retry is refused as key-expired, never run; then, the key typed to
    /// confirm, she evicts it: the retry runs once more (the upstream's
    /// fifth request, ambiguous again).
    async fn expire_then_evict_pay_1(&self, gw: &Gateway, upstream: &Unsure) {
        let browser = &self.browser;
        let pay_1 = format!(
            "/ui/record?scope=payouts%7C{}&key={}",
            self.acme,
            PAY_1.replace(':', "%3A")
        );
        browser.goto(&self.url(&pay_1)).await.unwrap();
        assert_eq!(text_of(browser, "#state").await, "completed");
        fill(browser, "#expire-reason", "seller withdrew the batch").await;
        fill(browser, "#evict-reason", "replaced by batch 0002").await;
        snap(browser, "verbs").await;
        follow(browser, Locator::Css("#expire button[type=submit]")).await;
        assert_eq!(text_of(browser, "#state").await, "tombstone");
        let said = text_of(browser, "main").await;
        for part in [
            "Expired by operator:ana",
            "expired by operator:ana: seller withdrew the batch",
        ] {
            assert!(said.contains(part), "{part}: {said}");
        }
        let late = pay(gw, "/payouts", "acme", PAY_1).await;
        assert_eq!(late.status, 422, "{late:?}");
        assert_eq!(
            late.problem().as_deref(),
            Some("urn:idem:problem:key-expired")
        );
        assert_eq!(upstream.hits(), 4, "an expired key never runs");

        fill(browser, "#evict-reason", "replaced by batch 0002").await;
        // The key typed wrong: refused, nothing changed.
        fill(browser, "#evict-key", "pay-1").await;
        follow(browser, Locator::Css("#evict button[type=submit]")).await;
        let refused = text_of(browser, "p.error").await;
        assert!(refused.contains("Type the record's key"), "{refused}");
        browser.goto(&self.url(&pay_1)).await.unwrap();
        assert_eq!(text_of(browser, "#state").await, "tombstone");
        fill(browser, "#evict-reason", "replaced by batch 0002").await;
        fill(browser, "#evict-key", PAY_1).await;
        follow(browser, Locator::Css("#evict button[type=submit]")).await;
        let said = text_of(browser, "main").await;
        for part in [
            "Evicted by operator:ana",
            "evicted by operator:ana: replaced by batch 0002",
        ] {
            assert!(said.contains(part), "{part}: {said}");
        }
        let again = pay(gw, "/payouts", "acme", PAY_1).await;
        assert_eq!(again.status, 503, "{again:?}");
        assert_eq!(upstream.hits(), 5, "after evict the intent runs once more");
    }

    /// Every page fits a phone and a desktop.
    async fn every_page_fits_without_sideways_scrolling(&self) {
        let browser = &self.browser;
        let acme = &self.acme;
        let pay_1 = format!(
            "/ui/record?scope=payouts%7C{acme}&key={}",
            PAY_1.replace(':', "%3A")
        );
        let pages = [
            "/ui/sign-in".to_owned(),
            "/ui".to_owned(),
            "/ui/records".to_owned(),
            pay_1.clone(),
            format!("/ui/resolve?scope=payouts%7C{acme}&key=pay-3"),
        ];
        for width in WIDTHS {
            browser.set_window_size(width, 900).await.unwrap();
            for page in &pages {
                browser.goto(&self.url(page)).await.unwrap();
                let (scroll, inner) = widths(browser).await;
                let resized = inner <= width && inner > width * 3 / 4;
                assert!(resized, "{page}: viewport {inner} at {width}");
                let fits = scroll <= inner;
                assert!(
                    fits,
                    "{page} at {width} px scrolls sideways: {scroll} > {inner}"
                );
                if width == 390 && *page == pay_1 {
                    snap(browser, "record-390").await;
                }
            }
        }
        browser.set_window_size(1280, 900).await.unwrap();
    }

    async fn an_idle_session_ends(&self) {
        tokio::time::sleep(Duration::from_secs(IDLE_S + 1)).await;
        self.browser.goto(&self.url("/ui")).await.unwrap();
        let landed = self.browser.current_url().await.unwrap();
        assert_eq!(landed.path(), "/ui/sign-in");
    }

    /// Without a mouse: from the sign-in page the idle session left, the
    /// token and Enter sign in; Tab and Enter reach the list, pay-2 and its
    /// resolve form; arrow keys move between the outcomes, typing fills the
    /// body and the reason, Space confirms, and Enter resolves. Every control Tab lands on is outlined.
    async fn a_keyboard_alone_resolves_a_record(&self) {
        let browser = &self.browser;
        assert_eq!(
            focused(browser).await.0,
            "token",
            "the token field has focus"
        );
        press_to_next_page(browser, &format!("{TOKEN}{ENTER}")).await;
        assert_eq!(browser.current_url().await.unwrap().path(), "/ui");
        tab_to(browser, |id, text| {
            id.is_empty() && text == "Review the ambiguous records"
        })
        .await;
        press_to_next_page(browser, ENTER).await;
        tab_to(browser, |_, text| text == "Key pay-2").await;
        press_to_next_page(browser, ENTER).await;
        tab_to(browser, |_, text| text == "Resolve this record").await;
        press_to_next_page(browser, ENTER).await;
        tab_to(browser, |id, _| id == "completed").await;
        press(browser, ARROW_DOWN).await;
        assert_eq!(focused(browser).await.0, "not_executed");
        press(browser, ARROW_UP).await;
        assert_eq!(focused(browser).await.0, "completed");
        tab_to(browser, |id, _| id == "status").await;
        press(browser, "200").await;
        tab_to(browser, |id, _| id == "body").await;
        press(browser, r#"{"payout":"manual-9"}"#).await;
        tab_to(browser, |id, _| id == "reason").await;
        press(browser, "provider ledger shows payout manual-9").await;
        tab_to(browser, |id, _| id == "confirm").await;
        press(browser, " ").await;
        tab_to(browser, |_, text| text == "Resolve").await;
        press_to_next_page(browser, ENTER).await;
        let said = text_of(browser, "main").await;
        assert!(
            said.contains("provider ledger shows payout manual-9"),
            "{said}"
        );
        let left = admin_get(self.admin, "/records?state=ambiguous").await;
        let keys: Vec<&str> = left["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["key"].as_str().unwrap())
            .collect();
        assert!(!keys.contains(&"pay-2"), "pay-2 is resolved: {keys:?}");
        let pay_2 = admin_get(self.admin, "/records?state=completed").await;
        let by = pay_2["records"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == "pay-2")
            .map(|r| r["resolution"]["by"].clone());
        assert_eq!(by, Some(json!("operator:admin")), "{pay_2}");
    }

    /// Signed in again, a page of another origin (same host, another port:
    /// same-site, so the strict cookie goes along) posts a resolution of
    /// pay-3 with its right token. It is refused and nothing changes.
    async fn a_form_from_another_origin_changes_nothing(&self) {
        sign_in(&self.browser, TOKEN).await;
        let pay_3 = format!("/records/payouts%7C{}/pay-3", self.acme);
        let token = admin_get(self.admin, &pay_3).await["token"].to_string();
        let attacker = attacker(self.admin, &self.acme, &token).await;
        self.browser
            .goto(&format!("http://{attacker}/"))
            .await
            .unwrap();
        let landed = wait_for_text(&self.browser, "Refused").await;
        assert!(landed.contains("another origin"), "{landed}");
        let record = admin_get(self.admin, &pay_3).await;
        assert_eq!(record["state"], "ambiguous", "{record}");
        assert_eq!(record["resolution"], Value::Null, "{record}");
    }
}

impl Driver {
    /// chromedriver on a free loopback port, once it answers.
    fn start() -> Driver {
        if chromium().is_none() {
            missing("chromium");
        }
        let port = free_port().unwrap();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let Ok(child) = child else {
            missing("chromedriver")
        };
        let driver = Driver { child, port };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return driver;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("chromedriver did not listen on 127.0.0.1:{port} within 10 s");
    }

    /// A headless Chromium session, 1280 px wide.
    async fn browser(&self) -> Client {
        let mut args = vec!["--headless=new", "--window-size=1280,900", "--disable-gpu"];
        if running_as_root() {
            args.push("--no-sandbox");
        }
        let options = json!({
            "binary": chromium().unwrap(),
            "args": args,
        });
        let mut caps = serde_json::Map::new();
        caps.insert("goog:chromeOptions".into(), options);
        ClientBuilder::new(HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .expect("a Chromium session through chromedriver")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Unsure {
    async fn start() -> Unsure {
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        let app = axum::Router::new().fallback(move || {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                (StatusCode::SERVICE_UNAVAILABLE, "the payout rail timed out")
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Unsure { addr, hits }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// A provider whose lookup answers 200 with the refund for any key.
async fn found_everything() -> String {
    let app = axum::Router::new().fallback(|| async {
        (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            r#"{"refund":"r-1"}"#,
        )
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

async fn pay(gw: &Gateway, path: &str, tenant: &str, key: &str) -> support::Reply {
    let headers = [("idempotency-key", key), ("x-tenant", tenant)];
    post(&gw.url(path), &headers, PAYOUT).await
}

/// The principal digest in the scope of `key`'s record, from the admin API.
async fn principal_of(admin: SocketAddr, key: &str) -> String {
    let listed = admin_get(admin, "/records?state=ambiguous").await;
    let record = listed["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == key)
        .unwrap();
    let scope = record["scope"].as_str().unwrap();
    scope.split('|').nth(1).unwrap().to_owned()
}

async fn admin_get(admin: SocketAddr, path: &str) -> Value {
    let auth = format!("Bearer {TOKEN}");
    let reply = send(
        "GET",
        &format!("http://{admin}{path}"),
        &[("authorization", &auth)],
        "",
    )
    .await;
    assert_eq!(reply.status, 200, "{path}: {reply:?}");
    serde_json::from_str(&reply.body).unwrap()
}

/// Serves, on another loopback port, a page whose form posts a resolution
/// of pay-3 to the console as soon as it loads.
async fn attacker(admin: SocketAddr, principal: &str, token: &str) -> SocketAddr {
    let fields = [
        ("csrf", "guessed"),
        ("scope", &format!("payouts|{principal}")),
        ("key", "pay-3"),
        ("token", token),
        ("outcome", "completed"),
        ("status", "200"),
        ("content_type", "application/json"),
        ("body", "{}"),
        ("reason", "forged"),
        ("confirm", "yes"),
    ];
    let inputs: String = fields
        .iter()
        .map(|(name, value)| format!("<input type=\"hidden\" name=\"{name}\" value=\"{value}\">"))
        .collect();
    let page = format!(
        "<!DOCTYPE html><html><body><form method=\"post\" action=\"http://{admin}/ui/resolve\">\
         {inputs}</form><script>document.forms[0].submit()</script></body></html>"
    );
    let app = axum::Router::new().fallback(move || {
        let page = page.clone();
        async move { axum::response::Html(page) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn sign_in(browser: &Client, token: &str) {
    browser.goto(&sign_in_url(browser).await).await.unwrap();
    fill(browser, "#token", token).await;
    follow(browser, Locator::Css("main form button[type=submit]")).await;
}

/// The sign-in page of the console the browser is on.
async fn sign_in_url(browser: &Client) -> String {
    let mut url = browser.current_url().await.unwrap();
    url.set_path("/ui/sign-in");
    url.set_query(None);
    url.to_string()
}

async fn fill(browser: &Client, css: &str, text: &str) {
    let field = browser.find(Locator::Css(css)).await.unwrap();
    field.clear().await.unwrap();
    field.send_keys(text).await.unwrap();
}

const TAB: &str = "\u{E004}";
const ENTER: &str = "\u{E007}";
const ARROW_UP: &str = "\u{E013}";
const ARROW_DOWN: &str = "\u{E015}";

/// Types `keys` (WebDriver key codes allowed) into the focused element.
async fn press(browser: &Client, keys: &str) {
    browser
        .active_element()
        .await
        .unwrap()
        .send_keys(keys)
        .await
        .unwrap();
}

/// [`press`], then waits (5 s at most) until the next page replaced this one.
async fn press_to_next_page(browser: &Client, keys: &str) {
    let old = browser.find(Locator::Css("html")).await.unwrap();
    press(browser, keys).await;
    for _ in 0..250 {
        if old.tag_name().await.is_err() && loaded(browser).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the key press led to no new page");
}

async fn loaded(browser: &Client) -> bool {
    let state = browser.execute("return document.readyState;", vec![]).await;
    state.is_ok_and(|s| s == "complete")
}

/// The focused element's id and text, and whether it is drawn with an
/// outline (the page itself, focused before the first Tab, counts as
/// outlined: it is no control).
async fn focused(browser: &Client) -> (String, String, bool) {
    let got = browser
        .execute(
            "const e = document.activeElement; \
             if (e === document.body) return ['', '', true]; \
             return [e.id || '', (e.innerText || e.value || '').trim(), \
                     getComputedStyle(e).outlineStyle !== 'none'];",
            vec![],
        )
        .await
        .unwrap();
    let text = |i: usize| got[i].as_str().unwrap().to_owned();
    (text(0), text(1), got[2].as_bool().unwrap())
}

/// Presses Tab until the focused element is the one `wanted` picks by id
/// and text (60 presses at most); each element on the way must be outlined.
async fn tab_to(browser: &Client, wanted: impl Fn(&str, &str) -> bool) {
    let mut visited = Vec::new();
    for _ in 0..60 {
        press(browser, TAB).await;
        let (id, text, outlined) = focused(browser).await;
        visited.push(format!("{id}:{text}"));
        assert!(
            outlined,
            "the focused element {id:?} {text:?} shows no outline"
        );
        if wanted(&id, &text) {
            return;
        }
    }
    panic!("Tab never reached the wanted control; it visited {visited:?}");
}

async fn click(browser: &Client, locator: Locator<'_>) {
    browser.find(locator).await.unwrap().click().await.unwrap();
}

/// Clicks a link or a submit button and waits (5 s at most) until the
/// next page replaced this one: its old root element is gone.
async fn follow(browser: &Client, locator: Locator<'_>) {
    let old = browser.find(Locator::Css("html")).await.unwrap();
    click(browser, locator).await;
    for _ in 0..250 {
        if old.tag_name().await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the click led to no new page");
}

async fn text_of(browser: &Client, css: &str) -> String {
    browser
        .find(Locator::Css(css))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The page's text once it contains `needle` (5 s at most).
async fn wait_for_text(browser: &Client, needle: &str) -> String {
    for _ in 0..100 {
        if let Ok(body) = browser.find(Locator::Css("body")).await
            && let Ok(text) = body.text().await
            && text.contains(needle)
        {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the page never said {needle:?}: {}",
        browser.source().await.unwrap()
    );
}

/// (document width, viewport width) in CSS pixels.
async fn widths(browser: &Client) -> (u32, u32) {
    let got = browser
        .execute(
            "return [document.documentElement.scrollWidth, window.innerWidth];",
            vec![],
        )
        .await
        .unwrap();
    let n = |i: usize| u32::try_from(got[i].as_u64().unwrap()).unwrap();
    (n(0), n(1))
}

/// Saves a screenshot as `console-NAME.png` in `IDEM_CONSOLE_SCREENSHOTS`.
async fn snap(browser: &Client, name: &str) {
    let Some(dir) = std::env::var_os("IDEM_CONSOLE_SCREENSHOTS") else {
        return;
    };
    let png = browser.screenshot().await.unwrap();
    std::fs::write(Path::new(&dir).join(format!("console-{name}.png")), png).unwrap();
}

/// Stops the test: the browser it needs is not installed.
fn missing(what: &str) -> ! {
    panic!(
        "{what} is not installed: the console test drives a real browser. \
         Install Debian's chromium and chromium-driver \
         (apt-get install -y chromium chromium-driver) or run bash scripts/test.sh"
    )
}

fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .flat_map(|dir| ["chromium", "chromium-browser"].map(|name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0")
}
