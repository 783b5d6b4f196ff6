//! The operator's console: server-rendered pages under `/ui` on the admin
//! listener, for the person who resolves an ambiguous payout at night.
//! Sign in with your operator token (a form, never a URL), or through the
//! trusted proxy's operator header, to get a session cookie; see the
//! backlog and the last hour's counters, search the records by key,
//! tenant, state and age, read one record's timeline, ask the provider
//! now where its route has a lookup, resolve it, expire or evict it with
//! the same fencing as the admin API, journaled under your name. Every state change carries
//! the session's CSRF token and is refused when the browser says it came
//! from another origin. The console keeps its own cookie authentication,
//! apart from the admin API's bearer tokens, so the two routers combine by a merge:
//! the `idem` binary hands [`mount`] to the gateway's admin listener, and
//! nothing else depends on this crate.

mod pages;
mod records;
mod samples;
mod search;
mod session;

use std::sync::Arc;
use std::time::Instant;

use axum::Form;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Query, Request, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{any, get, post};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use idem_core::{
    Clock, ListCursor, Record, RecordId, Resolution, Resolved, State as RecordState, Store,
    StoreError, SystemClock, Token, Verb, VerbRequest,
};
use idem_gateway::{
    AdminMount, AdminParts, AdminTransport, Logged, OperatorName, Operators, RefusalLog,
    SessionLimits, WindowView, outcome_name,
};
use idem_http::{Metrics, Resolver, Route};
use idem_reconcile::{Reconciler, Settled};
use maud::Markup;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use pages::{Chrome, ResolveForm, VerbForm};
use samples::{Samples, Totals};
use search::{Search, SearchParams};
use session::{Live, Sessions};

pub use records::{PAGE_ROWS, SCAN_ROWS_MAX};
pub use session::{SESSION_COOKIE, SESSIONS_MAX};

/// What a resolve form sent without a verdict is told.
const NO_VERDICT: &str = "Choose what happened at the provider: Completed or Not executed. \
                          Nothing was changed.";
/// What a verdict about an earlier attempt is told.
const MOVED_ON: &str =
    "The record belongs to another attempt than the one this form was about (its token changed).";

/// The largest form the console reads, in bytes: a stored body of 1 MiB,
/// percent-encoded, fits.
pub const CONSOLE_FORM_BYTES_MAX: usize = 4 * 1024 * 1024;
/// The largest sign-in form read, in bytes: the longest admin token,
/// every byte percent-encoded, fits.
pub const SIGN_IN_FORM_BYTES_MAX: usize = 16 * 1024;

/// What the console works with.
#[derive(Clone)]
pub struct ConsoleState {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    operators: Operators,
    routes: Vec<Route>,
    transport: AdminTransport,
    limits: SessionLimits,
    refusals: RefusalLog,
    reconciler: Option<Arc<Reconciler>>,
}

impl ConsoleState {
    /// A console over `store`, counting into and charting `metrics`,
    /// signed into by `operators` (an `AdminToken` is operator `admin`);
    /// `routes` render the key each record was forwarded with. Plain
    /// HTTP, the default session limits and a refusal log of its own.
    pub fn new(
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        operators: impl Into<Operators>,
        routes: Vec<Route>,
    ) -> ConsoleState {
        ConsoleState {
            store,
            metrics,
            operators: operators.into(),
            routes,
            transport: AdminTransport::Plain,
            limits: SessionLimits::default(),
            refusals: RefusalLog::default(),
            reconciler: None,
        }
    }

    /// "Ask the provider now" runs `reconciler`'s lookup for a record
    /// whose route has one; without a reconciler the button is not shown.
    pub fn with_reconciler(mut self, reconciler: Option<Arc<Reconciler>>) -> ConsoleState {
        self.reconciler = reconciler;
        self
    }

    /// Over `transport`, which decides the cookie's `Secure` attribute.
    pub fn with_transport(mut self, transport: AdminTransport) -> ConsoleState {
        self.transport = transport;
        self
    }

    /// Sessions end after `limits`.
    pub fn with_session_limits(mut self, limits: SessionLimits) -> ConsoleState {
        self.limits = limits;
        self
    }

    /// Wrong sign-ins are logged within `refusals` (the admin API's).
    pub fn with_refusals(mut self, refusals: RefusalLog) -> ConsoleState {
        self.refusals = refusals;
        self
    }
}

impl std::fmt::Debug for ConsoleState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleState")
            .field("operators", &self.operators)
            .field("routes", &self.routes.len())
            .field("transport", &self.transport)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// The console as the gateway mounts it beside the admin API: over the
/// admin listener's store, metrics, operators, routes and transport, its wrong
/// sign-ins logged within the admin API's refusal log, its sessions ending
/// after `limits`.
pub fn mount(limits: SessionLimits) -> AdminMount {
    Box::new(move |parts: AdminParts| {
        let state = ConsoleState::new(parts.store, parts.metrics, parts.operators, parts.routes)
            .with_transport(parts.transport)
            .with_session_limits(limits)
            .with_refusals(parts.refusals)
            .with_reconciler(parts.reconciler);
        router(state)
    })
}

/// The console's routes, all under `/ui`. Called inside a Tokio runtime,
/// it also samples the metrics once a minute for as long as the router
/// lives.
pub fn router(state: ConsoleState) -> axum::Router {
    let samples = Arc::new(Samples::default());
    samples.push(Totals::of(&state.metrics));
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(samples::run(
            Arc::downgrade(&samples),
            Arc::downgrade(&state.metrics),
        ));
    }
    let console = Arc::new(Console {
        sessions: Sessions::new(state.limits),
        samples,
        state,
    });
    axum::Router::new()
        .route("/ui", get(overview))
        .route("/ui/", get(overview))
        .route(
            "/ui/sign-in",
            get(sign_in_page)
                .post(sign_in)
                .layer(DefaultBodyLimit::max(SIGN_IN_FORM_BYTES_MAX)),
        )
        .route("/ui/sign-out", post(sign_out))
        .route("/ui/records", get(list))
        .route("/ui/record", get(show))
        .route("/ui/resolve", get(resolve_page).post(resolve))
        .route("/ui/ask", post(ask))
        .route("/ui/expire", post(expire))
        .route("/ui/evict", post(evict))
        .route("/ui/style.css", get(style))
        .route("/ui/favicon.svg", get(favicon))
        .route("/ui/{*rest}", any(not_found))
        .layer(DefaultBodyLimit::max(CONSOLE_FORM_BYTES_MAX))
        .layer(axum::middleware::map_response(protect))
        .with_state(console)
}

/// Why a state-changing request was refused; nothing was changed.
enum Refusal {
    /// `Origin` or `Sec-Fetch-Site` names another origin.
    CrossSite(String),
    /// No live session: never signed in, signed out or expired.
    NoSession,
    /// The form does not carry the session's CSRF token.
    Csrf,
    /// The form is not UTF-8 once decoded (a browser always sends UTF-8
    /// from these pages); read leniently, its text would change.
    Unreadable(&'static str),
}

struct Console {
    state: ConsoleState,
    sessions: Sessions,
    samples: Arc<Samples>,
}

type Shared = State<Arc<Console>>;

/// The live session of a page request; without one the browser is sent
/// to the sign-in page.
struct SignedIn(Live);

impl FromRequestParts<Arc<Console>> for SignedIn {
    type Rejection = Redirect;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        console: &Arc<Console>,
    ) -> Result<SignedIn, Redirect> {
        console
            .sessions
            .find(&parts.headers, Instant::now())
            .map(SignedIn)
            .ok_or_else(|| Redirect::to("/ui/sign-in"))
    }
}

/// A state-changing form of a live session. The origin and the session
/// are checked before the body is read, so that a request without a
/// session costs no upload; then the form must be UTF-8 with well-formed
/// escapes (as the admin API requires) and carry the session's CSRF token.
struct Change<T> {
    live: Live,
    form: T,
}

/// A form that carries the session's CSRF token.
trait CarriesCsrf {
    fn csrf(&self) -> &str;
}

impl<T> FromRequest<Arc<Console>> for Change<T>
where
    T: DeserializeOwned + CarriesCsrf + Send,
{
    type Rejection = Response;

    async fn from_request(req: Request, console: &Arc<Console>) -> Result<Change<T>, Response> {
        let (parts, body) = req.into_parts();
        if let Some(why) = session::cross_site(&parts.headers) {
            return Err(Refusal::CrossSite(why).into_response());
        }
        let Some(live) = console.sessions.find(&parts.headers, Instant::now()) else {
            return Err(Refusal::NoSession.into_response());
        };
        // The parts go along twice: the limit and the form's content type
        // are read from them by both extractors.
        let raw = Bytes::from_request(Request::from_parts(parts.clone(), body), console)
            .await
            .map_err(IntoResponse::into_response)?;
        if let Err(why) = form_text(&raw) {
            return Err(Refusal::Unreadable(why).into_response());
        }
        let req = Request::from_parts(parts, Body::from(raw));
        let Form(form) = Form::<T>::from_request(req, console)
            .await
            .map_err(IntoResponse::into_response)?;
        if !console.sessions.csrf_matches(&live.id, form.csrf()) {
            return Err(Refusal::Csrf.into_response());
        }
        Ok(Change { live, form })
    }
}

impl CarriesCsrf for CsrfForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

impl CarriesCsrf for AskForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

impl CarriesCsrf for VerbForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

impl CarriesCsrf for ResolveForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

#[derive(Deserialize)]
struct SignInForm {
    #[serde(default)]
    token: String,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct CsrfForm {
    csrf: String,
}

/// "Ask the provider now" about the attempt `token` of a record.
#[derive(Default, Deserialize)]
#[serde(default)]
struct AskForm {
    csrf: String,
    scope: String,
    key: String,
    token: String,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct RecordParams {
    scope: String,
    key: String,
    done: String,
    /// The tenant the search found the record by: shown next to the
    /// digest once the route confirms it digests to the record's.
    tenant: String,
}

async fn sign_in_page(State(c): Shared, headers: HeaderMap) -> Response {
    let proxied = c.state.operators.by_header(&headers);
    html(StatusCode::OK, pages::sign_in(None, proxied.as_ref()))
}

async fn sign_in(State(c): Shared, headers: HeaderMap, Form(form): Form<SignInForm>) -> Response {
    if let Some(why) = session::cross_site(&headers) {
        return Refusal::CrossSite(why).into_response();
    }
    let proxied = c.state.operators.by_header(&headers);
    let operator = match form.token.as_str() {
        "" => proxied.clone(),
        token => c.state.operators.by_token(token.as_bytes()).cloned(),
    };
    // A wrong token is answered at once, as the admin API answers a wrong
    // bearer token: a wait would not bound guessing (the token's randomness
    // does), and a throttle that did would let a guesser lock the operator
    // out.
    let Some(operator) = operator else {
        if let Logged::Write { suppressed } = c.state.refusals.admit(Instant::now()) {
            tracing::warn!(suppressed, "console: refused a sign-in with a wrong token");
        }
        let page = pages::sign_in(
            Some(
                "That is no operator's token. Use your own token (admin_token_env, or the \
                 token_env of your [[admin.operator]]) and try again.",
            ),
            proxied.as_ref(),
        );
        return html(StatusCode::UNAUTHORIZED, page);
    };
    // A session the browser already had ends: one sign-in, one live id.
    if let Some(old) = c.sessions.find(&headers, Instant::now()) {
        c.sessions.close(&old.id);
    }
    let Some(live) = c.sessions.open(Instant::now(), operator) else {
        tracing::error!("console: no randomness for a session id");
        let page = pages::refused(
            None,
            "Not signed in",
            "The system could not make a session id; try again.",
        );
        return html(StatusCode::SERVICE_UNAVAILABLE, page);
    };
    tracing::info!(operator = %live.operator, "console: signed in");
    let cookie = session::set_cookie(&live.id, c.state.transport, &c.state.limits);
    with_cookie(Redirect::to("/ui").into_response(), &cookie)
}

async fn sign_out(State(c): Shared, Change { live, .. }: Change<CsrfForm>) -> Response {
    c.sessions.close(&live.id);
    let cookie = session::clear_cookie(c.state.transport);
    with_cookie(Redirect::to("/ui/sign-in").into_response(), &cookie)
}

async fn overview(State(c): Shared, SignedIn(live): SignedIn) -> Response {
    let chrome = Chrome::of(&live);
    let backlog = match records::backlog(&*c.state.store).await {
        Ok(backlog) => backlog,
        Err(e) => return store_failed(chrome, &e),
    };
    let window = match c.state.store.suspect_window().await {
        Ok(window) => window,
        Err(e) => return store_failed(chrome, &e),
    };
    let now = SystemClock.now();
    let window = window.map(|w| WindowView::new(&w, now));
    let series = c.samples.series(Totals::of(&c.state.metrics));
    let page = pages::overview(chrome, (&backlog, window.as_ref()), &series, now);
    html(StatusCode::OK, page)
}

async fn list(
    State(c): Shared,
    SignedIn(live): SignedIn,
    Query(params): Query<SearchParams>,
) -> Response {
    let chrome = Chrome::of(&live);
    let search = match Search::new(&params, &c.state.routes) {
        Ok(search) => search,
        Err(why) => {
            let page = pages::records_refused(chrome, &params, &why);
            return html(StatusCode::BAD_REQUEST, page);
        }
    };
    let after = match (params.after_scope, params.after_key) {
        (Some(scope), Some(key)) => Some(ListCursor { scope, key }),
        _ => None,
    };
    let now = SystemClock.now();
    let page = match records::search_page(&*c.state.store, &search.filter, after, now).await {
        Ok(page) => page,
        Err(e) => return store_failed(chrome, &e),
    };
    let next = page.next.as_ref().map(|at| next_link(&search, at));
    html(StatusCode::OK, pages::records(chrome, &search, &page, next))
}

async fn show(
    State(c): Shared,
    SignedIn(live): SignedIn,
    Query(params): Query<RecordParams>,
) -> Response {
    let chrome = Chrome::of(&live);
    let id = match records::record_id(&params.scope, &params.key) {
        Ok(id) => id,
        Err(why) => return no_such_record(chrome, &why),
    };
    let detail = match c.detail(&id).await {
        Ok(detail) => detail,
        Err(e) => return store_failed(chrome, &e),
    };
    // `done` comes from the link the resolution redirected to, and anyone
    // can send such a link: the notice is shown only when the journal
    // agrees that the console made this resolution last.
    let by = live.operator.by();
    let latest = detail.journal.last();
    let done = latest.filter(|e| {
        let what = e.verb.map_or(e.outcome.as_str(), Verb::as_str);
        e.by == by && what == params.done
    });
    let notice = done.map(|e| match (e.verb, e.outcome) {
        (Some(Verb::Expire), _) => format!(
            "Expired by {by}: the answer is dropped; a late retry is refused as key-expired."
        ),
        (Some(Verb::Evict), _) => {
            format!("Evicted by {by}: the record is gone; the next request with this key runs.")
        }
        (None, Resolved::Completed) => {
            format!("Resolved as completed by {by}: retries replay the stored answer.")
        }
        (None, Resolved::NotExecuted) => {
            format!("Resolved as not executed by {by}: the key is released, a retry runs.")
        }
    });
    let principal = records::ScopeParts::of(&id.scope).principal;
    let tenant = detail
        .route
        .as_ref()
        .and_then(|r| r.tenant_digests(params.tenant.trim()).ok())
        .filter(|digests| digests.iter().any(|d| d == principal))
        .map(|_| params.tenant.trim());
    let page = pages::record(
        chrome,
        (&id, tenant),
        &detail,
        SystemClock.now(),
        notice.as_deref(),
    );
    html(StatusCode::OK, page)
}

async fn resolve_page(
    State(c): Shared,
    SignedIn(live): SignedIn,
    Query(params): Query<RecordParams>,
) -> Response {
    let chrome = Chrome::of(&live);
    let form = ResolveForm {
        content_type: "application/json".into(),
        ..ResolveForm::default()
    };
    let id = match records::record_id(&params.scope, &params.key) {
        Ok(id) => id,
        Err(why) => return no_such_record(chrome, &why),
    };
    c.form_again(chrome, &id, &form, None, StatusCode::OK).await
}

async fn resolve(State(c): Shared, Change { live, form }: Change<ResolveForm>) -> Response {
    let chrome = Chrome::of(&live);
    let id = match records::record_id(&form.scope, &form.key) {
        Ok(id) => id,
        Err(why) => return no_such_record(chrome, &why),
    };
    let invalid = StatusCode::UNPROCESSABLE_ENTITY;
    if form.outcome.is_empty() {
        return c
            .form_again(chrome, &id, &form, Some(NO_VERDICT), invalid)
            .await;
    }
    if form.confirm != "yes" {
        let why = "Tick the confirmation: a resolution cannot be undone.";
        return c.form_again(chrome, &id, &form, Some(why), invalid).await;
    }
    let (token, resolution) = match resolution_of(&form, &live.operator) {
        Ok(parsed) => parsed,
        Err(why) => return c.form_again(chrome, &id, &form, Some(&why), invalid).await,
    };
    let outcome = resolution.outcome.clone();
    let reason = resolution.reason.clone();
    match c.state.store.resolve(&id, token, resolution).await {
        Ok(_) => {
            c.state.metrics.resolution(Resolver::Operator, &outcome);
            let outcome = outcome_name(&outcome);
            let by = live.operator.by();
            tracing::info!(scope = %id.scope, key = %id.key, outcome, by, reason, "ambiguous record resolved in the console");
            let done = format!("{}&done={outcome}", pages::link("/ui/record", &id));
            Redirect::to(&done).into_response()
        }
        Err(e) => c.refused_verdict(chrome, &id, &e),
    }
}

/// Expires a completed record: it becomes a tombstone now, journaled by
/// the signed-in operator.
async fn expire(State(c): Shared, change: Change<VerbForm>) -> Response {
    c.apply_verb(Verb::Expire, change).await
}

/// Evicts a record whose attempt can no longer commit, once the operator
/// typed its key: the intent may run again, journaled by the signed-in
/// operator.
async fn evict(State(c): Shared, change: Change<VerbForm>) -> Response {
    c.apply_verb(Verb::Evict, change).await
}

/// Runs the record's lookup once, now, through the gateway's reconciler
/// (its verdict, token fencing, try count and backoff), and shows the
/// record with what came of it.
async fn ask(State(c): Shared, Change { live, form }: Change<AskForm>) -> Response {
    let chrome = Chrome::of(&live);
    let id = match records::record_id(&form.scope, &form.key) {
        Ok(id) => id,
        Err(why) => return no_such_record(chrome, &why),
    };
    let Some(reconciler) = c.state.reconciler.as_ref().filter(|r| r.has_lookup(&id)) else {
        let why = "This record's route has no [[lookup]]: ask the provider yourself, then resolve by hand.";
        return html(StatusCode::CONFLICT, pages::conflict(chrome, &id, why));
    };
    if let Err(response) = c.still_the_attempt(chrome, &id, &form.token).await {
        return response;
    }
    let asker = idem_reconcile::asked_by(&live.operator.by());
    let settled = reconciler.settle_now_asked_by(&id, &asker).await;
    let operator = live.operator.as_str();
    tracing::info!(scope = %id.scope, key = %id.key, operator, ?settled, "console: asked the provider now");
    let detail = match c.detail(&id).await {
        Ok(detail) => detail,
        Err(e) => return store_failed(chrome, &e),
    };
    let notice = asked(&settled, &detail);
    let page = pages::record(
        chrome,
        (&id, None),
        &detail,
        SystemClock.now(),
        Some(&notice),
    );
    html(StatusCode::OK, page)
}

/// What the operator is told once the provider was asked.
fn asked(settled: &Settled, detail: &records::Detail) -> String {
    match settled {
        Settled::Resolved { completed: true } => "The provider was asked: it found the effect. \
            The record is completed with the provider's answer (journaled by the reconciler, \
            asked by you)."
            .into(),
        Settled::Resolved { completed: false } => {
            "The provider was asked: the effect is not there \
            and the attempt can no longer commit. The key is released; a retry runs."
                .into()
        }
        Settled::Changed => "The record changed while the provider was asked (a scan, a retry or \
            an operator settled it, or a new attempt took it); look at it as it is now."
            .into(),
        _ => match &detail.tries {
            Some(t) => format!(
                "The provider was asked and gave no verdict: {} lookup(s) of this attempt failed; \
                 the next may run at {}. Resolve by hand if you know the outcome.",
                t.failures,
                idem_gateway::rfc3339(t.next_at)
            ),
            None => "No verdict now: the provider has no trace yet while the attempt may still \
                commit, a backoff runs, or every lookup slot is busy. Try again later, or \
                resolve by hand."
                .into(),
        },
    }
}

async fn style() -> Response {
    asset(include_str!("style.css"), "text/css; charset=utf-8")
}

/// The icon every page links, so that a browser never asks the admin
/// API's `/favicon.ico` (a 401 and a refusal line per page view).
async fn favicon() -> Response {
    asset(include_str!("favicon.svg"), "image/svg+xml")
}

/// A file compiled into the console, with its media type.
fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

async fn not_found() -> Response {
    let page = pages::refused(None, "Not found", "There is no console page here.");
    html(StatusCode::NOT_FOUND, page)
}

impl Console {
    /// Everything the record page shows about `id`, and whether it can
    /// ask the provider.
    async fn detail(&self, id: &RecordId) -> Result<records::Detail, StoreError> {
        let mut detail = records::detail(&*self.state.store, &self.state.routes, id).await?;
        detail.lookup = self
            .state
            .reconciler
            .as_ref()
            .is_some_and(|r| r.has_lookup(id));
        Ok(detail)
    }

    /// `Ok` when `id` is still the ambiguous attempt `token` names; else
    /// the page that says what it is now.
    async fn still_the_attempt(
        &self,
        chrome: Chrome<'_>,
        id: &RecordId,
        token: &str,
    ) -> Result<(), Response> {
        let record = match self.state.store.get(id).await {
            Ok(Some(record)) => record,
            Ok(None) => {
                let e = StoreError::NotFound { id: id.clone() };
                return Err(self.refused_verdict(chrome, id, &e));
            }
            Err(e) => return Err(store_failed(chrome, &e)),
        };
        if token.trim() != record.token.0.to_string() {
            return Err(html(
                StatusCode::CONFLICT,
                pages::conflict(chrome, id, MOVED_ON),
            ));
        }
        let state = record.state_at(SystemClock.now());
        if state != RecordState::Ambiguous {
            let e = StoreError::WrongState {
                id: id.clone(),
                state,
                operation: "ask the provider about",
            };
            return Err(self.refused_verdict(chrome, id, &e));
        }
        Ok(())
    }

    /// The resolve form for the record as it is now, or the conflict page
    /// when it is not ambiguous any more.
    async fn form_again(
        &self,
        chrome: Chrome<'_>,
        id: &RecordId,
        form: &ResolveForm,
        error: Option<&str>,
        status: StatusCode,
    ) -> Response {
        let record: Record = match self.state.store.get(id).await {
            Ok(Some(record)) => record,
            Ok(None) => {
                return self.refused_verdict(chrome, id, &StoreError::NotFound { id: id.clone() });
            }
            Err(e) => return store_failed(chrome, &e),
        };
        let state = record.state_at(SystemClock.now());
        if state != RecordState::Ambiguous {
            let e = StoreError::WrongState {
                id: id.clone(),
                state,
                operation: "resolve",
            };
            return self.refused_verdict(chrome, id, &e);
        }
        // A form sent back (an error to correct) stays about the attempt it
        // was opened for: re-rendered with the record's current token, a
        // verdict about an older attempt would land on the newer one.
        if !form.token.is_empty() && form.token != record.token.0.to_string() {
            return html(StatusCode::CONFLICT, pages::conflict(chrome, id, MOVED_ON));
        }
        html(status, pages::resolve(chrome, &record, form, error))
    }

    /// Applies `verb` as `form` asks, under the signed-in operator's name,
    /// fenced by the token the page showed; a refusal changes nothing and
    /// says why.
    async fn apply_verb(&self, verb: Verb, Change { live, form }: Change<VerbForm>) -> Response {
        let chrome = Chrome::of(&live);
        let id = match records::record_id(&form.scope, &form.key) {
            Ok(id) => id,
            Err(why) => return no_such_record(chrome, &why),
        };
        let refuse = |status: StatusCode, why: &str| {
            html(status, pages::verb_refused(chrome, &id, verb, why))
        };
        let invalid = StatusCode::UNPROCESSABLE_ENTITY;
        if form.reason.trim().is_empty() {
            let why = format!(
                "Say why you {} this record: the reason is journaled with your name.",
                verb.as_str()
            );
            return refuse(invalid, &why);
        }
        if verb == Verb::Evict && form.confirm_key != id.key.as_str() {
            let why = "Type the record's key exactly to confirm the eviction: it lets the \
                       intent run again, a second effect if the first one happened.";
            return refuse(invalid, why);
        }
        let Ok(token) = form.token.trim().parse::<u64>() else {
            return refuse(
                invalid,
                "The form lost the record's token; open the record again.",
            );
        };
        let by = live.operator.by();
        let request = match VerbRequest::new(verb, &by, &form.reason) {
            Ok(request) => request,
            Err(e) => return refuse(invalid, &format!("field `reason`: {e}")),
        };
        match self
            .state
            .store
            .apply_verb(&id, Token(token), request)
            .await
        {
            Ok(_) => {
                let (verb_name, reason) = (verb.as_str(), form.reason.as_str());
                tracing::info!(scope = %id.scope, key = %id.key, verb = verb_name, by, reason, "console: operator verb applied");
                let done = format!("{}&done={verb_name}", pages::link("/ui/record", &id));
                Redirect::to(&done).into_response()
            }
            Err(e) => {
                let why = match &e {
                    StoreError::NotFound { .. } => {
                        "No record is stored for this scope and key any more.".to_owned()
                    }
                    StoreError::Fenced { .. } => MOVED_ON.to_owned(),
                    StoreError::WrongState { state, .. } => format!(
                        "The record is {state} now: only a completed record can be expired."
                    ),
                    StoreError::MayStillCommit { until, .. } => format!(
                        "An attempt may still commit until {}: evict it once its lease has ended.",
                        idem_gateway::rfc3339(*until)
                    ),
                    StoreError::Limit(_) => e.to_string(),
                    _ => return store_failed(chrome, &e),
                };
                refuse(StatusCode::CONFLICT, &why)
            }
        }
    }

    /// The page for a verdict the store refused; nothing was written.
    fn refused_verdict(&self, chrome: Chrome, id: &RecordId, e: &StoreError) -> Response {
        let message = match e {
            StoreError::NotFound { .. } => {
                "No record is stored for this scope and key any more.".to_owned()
            }
            StoreError::WrongState { state, .. } => format!(
                "The record is {state} now, not ambiguous: someone or something resolved it, or a new attempt took it."
            ),
            StoreError::Fenced { .. } => MOVED_ON.to_owned(),
            StoreError::MayStillCommit { .. } => {
                format!("{e}. Not executed can be chosen only once the attempt's lease is over.")
            }
            StoreError::Limit(_) => format!("{e}"),
            _ => return store_failed(chrome, e),
        };
        html(StatusCode::CONFLICT, pages::conflict(chrome, id, &message))
    }
}

/// The token and resolution of a resolve form, through the admin API's own
/// parser (so both refuse the same input with the same words), made by
/// `operator`.
fn resolution_of(
    form: &ResolveForm,
    operator: &OperatorName,
) -> Result<(Token, Resolution), String> {
    let token: u64 = form
        .token
        .trim()
        .parse()
        .map_err(|_| "The form lost the record's token; open the record again.".to_owned())?;
    let mut doc = serde_json::json!({
        "token": token,
        "outcome": form.outcome,
        "reason": form.reason,
    });
    if form.outcome == "completed" {
        let status = form.status.trim();
        let status: u64 = status.parse().map_err(|_| {
            format!("field `status` is {status:?}; expected an HTTP status 100-599")
        })?;
        doc["status"] = status.into();
        doc["body"] = form.body.clone().into();
        if !form.content_type.trim().is_empty() {
            doc["headers"] = serde_json::json!([["content-type", form.content_type]]);
        }
    }
    let body = serde_json::to_vec(&doc).map_err(|e| e.to_string())?;
    idem_gateway::admin::parse_resolution(&body, &operator.by())
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::CrossSite(why) => {
                tracing::warn!(why, "console: refused a cross-site request");
                let message = format!("Refused: {why}. Nothing was changed.");
                html(
                    StatusCode::FORBIDDEN,
                    pages::refused(None, "Refused", &message),
                )
            }
            Refusal::NoSession => {
                let message = "Your session ended; sign in again. Nothing was changed.";
                html(
                    StatusCode::UNAUTHORIZED,
                    pages::sign_in(Some(message), None),
                )
            }
            Refusal::Unreadable(why) => {
                let message = format!("The form could not be read: {why}. Nothing was changed.");
                html(
                    StatusCode::BAD_REQUEST,
                    pages::refused(None, "Refused", &message),
                )
            }
            Refusal::Csrf => {
                tracing::warn!("console: refused a form without this session's CSRF token");
                let message = "This form is stale or did not come from this console (its CSRF \
                               token does not match). Nothing was changed; reload the page and \
                               try again.";
                html(
                    StatusCode::FORBIDDEN,
                    pages::refused(None, "Refused", message),
                )
            }
        }
    }
}

fn next_link(search: &Search, at: &ListCursor) -> String {
    let f = &search.filter;
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("key", &f.key)
        .append_pair("route", &f.route)
        .append_pair("tenant", &f.tenant)
        .append_pair("principal", &f.principal)
        .append_pair("state", &search.state)
        .append_pair("older_than_min", &search.older)
        .append_pair("after_scope", &at.scope)
        .append_pair("after_key", &at.key)
        .finish();
    format!("/ui/records?{query}")
}

/// Why a form's body is not text the console stores as sent: not UTF-8,
/// or a `%` escape that is malformed or decodes to bytes that are not.
fn form_text(raw: &[u8]) -> Result<(), &'static str> {
    let text = std::str::from_utf8(raw).map_err(|_| "its bytes are not UTF-8")?;
    idem_gateway::admin::strict_escapes(text)
        .map_err(|_| "a %-escape is malformed or does not decode to UTF-8")
}

/// The answer to a link or form whose scope or key is not valid.
fn no_such_record(chrome: Chrome, why: &str) -> Response {
    let page = pages::refused(Some(chrome), "No such record", why);
    html(StatusCode::BAD_REQUEST, page)
}

fn store_failed(chrome: Chrome, e: &StoreError) -> Response {
    tracing::error!(error = %e, "console: store operation failed");
    let page = pages::refused(
        Some(chrome),
        "Store unavailable",
        &format!("The store failed: {e}. Nothing was changed; try again."),
    );
    html(StatusCode::SERVICE_UNAVAILABLE, page)
}

fn with_cookie(mut response: Response, cookie: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

fn html(status: StatusCode, page: Markup) -> Response {
    (status, axum::response::Html(page.into_string())).into_response()
}

/// Headers on every console answer: no script, style only from the
/// console, no framing, no caching of pages that show records. The
/// referrer stays within the console (`same-origin`, not `no-referrer`:
/// under `no-referrer` Chromium sends `Origin: null` with the console's
/// own forms, which the origin check must refuse).
async fn protect(mut response: Response) -> Response {
    let headers = response.headers_mut();
    let set = [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ];
    for (name, value) in set {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests;
