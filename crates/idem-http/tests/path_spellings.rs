//! Property: a spelling of a request path that an RFC 3986-normalising
//! upstream serves as a protected path is protected or refused by the
//! layer, never passed through; and whatever passes reaches the inner
//! service as a path that means the same to that upstream.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use idem_core::{MemoryStore, SystemClock};
use idem_http::{IdempotencyLayer, Route, RouteSpec};
use percent_encoding::percent_decode_str;
use proptest::prelude::*;
use tower::{Layer, ServiceExt, service_fn};

/// How the upstream reads a path: every escape decoded, empty and `.`
/// segments dropped, `..` removing the segment before it (never above
/// the root), as RFC 3986 §5.2.4 plus the common `//` merge.
fn upstream_view(path: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for raw in path.split('/') {
        let segment = percent_decode_str(raw).decode_utf8_lossy().into_owned();
        match segment.as_str() {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            _ => out.push(segment),
        }
    }
    out
}

fn protected(view: &[String]) -> bool {
    view.first().is_some_and(|s| s == "payouts")
}

/// Spells `segments` as a client might: escapes in either case, extra
/// empty segments, `.` and `x/..` detours, a trailing slash.
fn spell(segments: &[String], choices: &[u8]) -> String {
    let mut choice = choices.iter().copied().cycle();
    let mut next = move || choice.next().unwrap_or(0);
    let mut path = String::new();
    for segment in segments {
        match next() % 5 {
            1 => path.push('/'),
            2 => path.push_str("/."),
            3 => path.push_str("/zz/.."),
            _ => {}
        }
        path.push('/');
        for c in segment.chars() {
            match next() % 4 {
                0 => path.push_str(&format!("%{:02X}", c as u32)),
                1 => path.push_str(&format!("%{:02x}", c as u32)),
                _ => path.push(c),
            }
        }
    }
    if path.is_empty() || next() % 3 == 0 {
        path.push('/');
    }
    path
}

/// What the layer did with one request: the inner service's view of the
/// path if it was called, and the response's status and problem type.
struct Outcome {
    inner_saw: Option<String>,
    status: u16,
    problem: Option<String>,
}

fn send(path: &str, key: Option<&str>) -> Outcome {
    let route = Route::new(&RouteSpec {
        methods: Some(vec!["POST".into()]),
        path: Some("/payouts/**".into()),
        ..Default::default()
    })
    .unwrap();
    let store = Arc::new(MemoryStore::new(Arc::new(SystemClock)));
    let saw: Arc<Mutex<Option<String>>> = Arc::default();
    let inner = {
        let saw = saw.clone();
        service_fn(move |req: Request<Full<Bytes>>| {
            *saw.lock().unwrap() = Some(req.uri().path().to_owned());
            async { Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new()))) }
        })
    };
    let service = IdempotencyLayer::new(store, vec![route]).layer(inner);
    let mut req = Request::post(path);
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    let req = req.body(Full::new(Bytes::new())).unwrap();
    // The layer cuts a forward at its lease's end: it needs the timer.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let response = runtime.block_on(service.oneshot(req)).unwrap();
    let status = response.status().as_u16();
    let body = runtime
        .block_on(response.into_body().collect())
        .unwrap()
        .to_bytes();
    let problem = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|doc| Some(doc.get("type")?.as_str()?.to_owned()));
    let inner_saw = saw.lock().unwrap().take();
    Outcome {
        inner_saw,
        status,
        problem,
    }
}

fn segments() -> impl Strategy<Value = Vec<String>> {
    let first = prop::sample::select(vec!["payouts", "refunds", "payoutsx", "pay"]);
    let rest = prop::collection::vec("[a-zA-Z0-9_~-][a-zA-Z0-9._~-]{0,3}", 0..3);
    (first, rest).prop_map(|(first, rest)| std::iter::once(first.to_owned()).chain(rest).collect())
}

const REFUSED: &str = "urn:idem:problem:invalid-path";
const MISSING: &str = "urn:idem:problem:missing-key";

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn a_protected_spelling_is_protected_or_refused(
        segments in segments(),
        choices in prop::collection::vec(any::<u8>(), 1..24),
    ) {
        let spelled = spell(&segments, &choices);
        let view = upstream_view(&spelled);
        let bare = send(&spelled, None);
        if protected(&view) {
            prop_assert!(bare.inner_saw.is_none(), "{spelled} passed through as {:?}", bare.inner_saw);
            prop_assert!(
                bare.problem.as_deref() == Some(MISSING) || bare.problem.as_deref() == Some(REFUSED),
                "{spelled}: {} {:?}", bare.status, bare.problem
            );
        }
        match &bare.inner_saw {
            Some(forwarded) => prop_assert_eq!(&upstream_view(forwarded), &view, "{}", spelled),
            None => prop_assert_eq!(bare.status, 400),
        }
        let keyed = send(&spelled, Some("k-1"));
        match (&keyed.inner_saw, keyed.problem.as_deref()) {
            (Some(forwarded), _) => prop_assert_eq!(&upstream_view(forwarded), &view, "{}", spelled),
            (None, problem) => prop_assert_eq!(problem, Some(REFUSED), "{}", spelled),
        }
    }

    #[test]
    fn normalising_twice_changes_nothing(
        segments in segments(),
        choices in prop::collection::vec(any::<u8>(), 1..24),
    ) {
        let spelled = spell(&segments, &choices);
        if let Some(once) = send(&spelled, None).inner_saw {
            let twice = send(&once, None).inner_saw;
            prop_assert_eq!(twice.as_deref(), Some(once.as_str()), "{}", spelled);
        }
    }
}
