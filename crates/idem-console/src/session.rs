//! Who may use the console: sessions opened by signing in with the admin
//! token, kept in memory (bounded, idle and absolute limits), carried by a
//! cookie the browser sends only to `/ui` on this origin, and the checks
//! every state change passes (a per-session CSRF token, and the request's
//! `Origin` / `Sec-Fetch-Site` when the browser sends them).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use cookie::{Cookie, SameSite};
use http::{HeaderMap, header};
use idem_gateway::{AdminToken, AdminTransport, OperatorName, SessionLimits, random_hex};

/// The name of the console's session cookie.
pub const SESSION_COOKIE: &str = "idem_console";
/// The most console sessions kept at once; signing in beyond it ends the
/// least recently used one.
pub const SESSIONS_MAX: usize = 32;

/// What a request's session is, when it has a live one.
#[derive(Clone, Debug)]
pub(crate) struct Live {
    /// The session id, as the cookie carries it.
    pub id: String,
    /// The CSRF token every form of this session carries.
    pub csrf: String,
    /// Who signed in: every resolution of this session is theirs.
    pub operator: OperatorName,
}

/// The sessions of one console, in memory.
pub(crate) struct Sessions {
    limits: SessionLimits,
    by_id: Mutex<HashMap<String, Session>>,
}

struct Session {
    /// Compared in constant time, like the admin token.
    csrf: AdminToken,
    csrf_text: String,
    operator: OperatorName,
    signed_in: Instant,
    seen: Instant,
}

impl Sessions {
    pub(crate) fn new(limits: SessionLimits) -> Sessions {
        Sessions {
            limits,
            by_id: Mutex::new(HashMap::new()),
        }
    }

    /// Opens a session of `operator` at `now`; when [`SESSIONS_MAX`] are open, the
    /// expired ones are dropped and then, if none was, the least recently
    /// used one. `None` when the system has no randomness to give.
    pub(crate) fn open(&self, now: Instant, operator: OperatorName) -> Option<Live> {
        let id = random_hex()?;
        let csrf_text = random_hex()?;
        let csrf = AdminToken::new(&csrf_text).ok()?;
        let mut by_id = self.lock();
        if by_id.len() >= SESSIONS_MAX {
            by_id.retain(|_, s| !s.expired(&self.limits, now));
        }
        if by_id.len() >= SESSIONS_MAX
            && let Some(oldest) = by_id
                .iter()
                .min_by_key(|(_, s)| s.seen)
                .map(|(id, _)| id.clone())
        {
            by_id.remove(&oldest);
        }
        by_id.insert(
            id.clone(),
            Session {
                csrf,
                csrf_text: csrf_text.clone(),
                operator: operator.clone(),
                signed_in: now,
                seen: now,
            },
        );
        Some(Live {
            id,
            csrf: csrf_text,
            operator,
        })
    }

    /// The live session the request's cookie names, its use counted at
    /// `now`; an expired one is dropped.
    pub(crate) fn find(&self, headers: &HeaderMap, now: Instant) -> Option<Live> {
        let id = session_cookie(headers)?;
        let mut by_id = self.lock();
        let session = by_id.get_mut(&id)?;
        if session.expired(&self.limits, now) {
            by_id.remove(&id);
            return None;
        }
        session.seen = now;
        Some(Live {
            csrf: session.csrf_text.clone(),
            operator: session.operator.clone(),
            id,
        })
    }

    /// Whether `presented` is the CSRF token of session `id`.
    pub(crate) fn csrf_matches(&self, id: &str, presented: &str) -> bool {
        self.lock()
            .get(id)
            .is_some_and(|s| s.csrf.matches(presented.as_bytes()))
    }

    /// Ends session `id` (sign-out).
    pub(crate) fn close(&self, id: &str) {
        self.lock().remove(id);
    }

    /// The map; a panic while it was held cannot leave it half-written
    /// (every change is one insert or remove), so a poisoned lock is used.
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.by_id
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Session {
    fn expired(&self, limits: &SessionLimits, now: Instant) -> bool {
        now.saturating_duration_since(self.seen) >= limits.idle
            || now.saturating_duration_since(self.signed_in) >= limits.absolute
    }
}

/// The `Set-Cookie` value that hands `id` to the browser: only over this
/// path, never to scripts, never on a cross-site request, `Secure` over TLS,
/// gone from the browser at the absolute limit at the latest.
pub(crate) fn set_cookie(id: &str, transport: AdminTransport, limits: &SessionLimits) -> String {
    let max_age = i64::try_from(limits.absolute.as_secs()).unwrap_or(i64::MAX);
    Cookie::build((SESSION_COOKIE, id))
        .path("/ui")
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(transport == AdminTransport::Tls)
        .max_age(cookie::time::Duration::seconds(max_age))
        .build()
        .to_string()
}

/// The `Set-Cookie` value that removes the session cookie.
pub(crate) fn clear_cookie(transport: AdminTransport) -> String {
    Cookie::build((SESSION_COOKIE, ""))
        .path("/ui")
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(transport == AdminTransport::Tls)
        .max_age(cookie::time::Duration::ZERO)
        .build()
        .to_string()
}

/// Why a state-changing request is refused as coming from another site,
/// or `None` when nothing says it does. `Sec-Fetch-Site` must be
/// `same-origin` (or `none`: typed by the user); `Origin` must name this
/// host and port. Another port of the same host is same-site for the
/// browser — a `SameSite=Strict` cookie goes along — but not same-origin.
/// A browser that sends neither header is still held to the CSRF token.
pub(crate) fn cross_site(headers: &HeaderMap) -> Option<String> {
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or("");
        if !matches!(site, "same-origin" | "none") {
            return Some(format!(
                "the browser says the form came from another origin (Sec-Fetch-Site: {site})"
            ));
        }
    }
    let origin = headers.get(header::ORIGIN)?;
    let origin = origin.to_str().unwrap_or("");
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    // The scheme is left out: behind a TLS terminator the browser's origin
    // is https:// while this listener speaks plain HTTP.
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    if host.is_empty() || authority != Some(host) {
        return Some(format!(
            "the form came from another origin (Origin: {origin}, this console: {host})"
        ));
    }
    None
}

/// The session id the request's cookie carries.
fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == SESSION_COOKIE)
        .map(|c| c.value().to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;

    fn ana() -> OperatorName {
        OperatorName::new("ana").unwrap()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    fn cookie_of(live: &Live) -> HeaderMap {
        headers(&[("cookie", &format!("a=b; {SESSION_COOKIE}={}", live.id))])
    }

    #[test]
    fn sessions_end_at_the_idle_and_the_absolute_limit() {
        let limits = SessionLimits::new(Some(10), Some(25)).unwrap();
        let sessions = Sessions::new(limits);
        let t0 = Instant::now();
        let live = sessions.open(t0, ana()).unwrap();
        let sent = cookie_of(&live);
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Used every 9 s it outlives the idle limit, not the absolute one.
        for s in [9, 18] {
            assert!(sessions.find(&sent, at(s)).is_some(), "at {s} s");
        }
        assert!(sessions.find(&sent, at(25)).is_none(), "absolute limit");
        assert!(sessions.find(&sent, at(18)).is_none(), "dropped for good");
        let idle = sessions.open(t0, ana()).unwrap();
        assert!(sessions.find(&cookie_of(&idle), at(10)).is_none(), "idle");
        assert!(sessions.find(&headers(&[]), t0).is_none());
        let forged = headers(&[("cookie", &format!("{SESSION_COOKIE}=0000"))]);
        assert!(sessions.find(&forged, t0).is_none());
    }

    #[test]
    fn sessions_are_bounded_and_the_least_recently_used_goes_first() {
        let sessions = Sessions::new(SessionLimits::default());
        let t0 = Instant::now();
        let first = sessions.open(t0, ana()).unwrap();
        let second = sessions.open(t0 + Duration::from_secs(1), ana()).unwrap();
        let later = t0 + Duration::from_secs(2);
        assert!(sessions.find(&cookie_of(&first), later).is_some());
        for i in 0..SESSIONS_MAX - 1 {
            sessions
                .open(later + Duration::from_secs(i as u64), ana())
                .unwrap();
        }
        assert_eq!(sessions.lock().len(), SESSIONS_MAX);
        assert!(sessions.find(&cookie_of(&second), later).is_none());
        assert!(sessions.find(&cookie_of(&first), later).is_some());
    }

    #[test]
    fn the_csrf_token_belongs_to_its_session() {
        let sessions = Sessions::new(SessionLimits::default());
        let (a, b) = (
            sessions.open(Instant::now(), ana()).unwrap(),
            sessions.open(Instant::now(), ana()).unwrap(),
        );
        assert_ne!(a.csrf, b.csrf);
        assert_eq!(a.csrf.len(), 2 * idem_gateway::admin::SECRET_BYTES);
        assert!(sessions.csrf_matches(&a.id, &a.csrf));
        assert!(!sessions.csrf_matches(&a.id, &b.csrf));
        assert!(!sessions.csrf_matches(&a.id, ""));
        sessions.close(&a.id);
        assert!(!sessions.csrf_matches(&a.id, &a.csrf));
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_scoped_to_the_console() {
        let limits = SessionLimits::default();
        let plain = set_cookie("abc", AdminTransport::Plain, &limits);
        for part in [
            "idem_console=abc",
            "HttpOnly",
            "SameSite=Strict",
            "Path=/ui",
        ] {
            assert!(plain.contains(part), "{plain}");
        }
        assert!(!plain.contains("Secure"), "{plain}");
        assert!(plain.contains("Max-Age=28800"), "{plain}");
        assert!(set_cookie("abc", AdminTransport::Tls, &limits).contains("Secure"));
        assert!(clear_cookie(AdminTransport::Plain).contains("Max-Age=0"));
    }

    #[test]
    fn requests_from_another_origin_are_refused() {
        let host = ("host", "127.0.0.1:9090");
        let cases: [(&[(&'static str, &str)], bool); 8] = [
            (&[host], true),
            (&[host, ("origin", "http://127.0.0.1:9090")], true),
            (&[host, ("origin", "https://127.0.0.1:9090")], true),
            (&[host, ("sec-fetch-site", "same-origin")], true),
            (&[host, ("origin", "http://127.0.0.1:9091")], false),
            (&[host, ("origin", "null")], false),
            (&[host, ("sec-fetch-site", "same-site")], false),
            (&[("origin", "http://127.0.0.1:9090")], false),
        ];
        for (pairs, allowed) in cases {
            assert_eq!(cross_site(&headers(pairs)).is_none(), allowed, "{pairs:?}");
        }
    }
}
