//! Traces of the protocol steps: the caller's W3C `traceparent` read
//! strictly at the layer's edge, one span per step on a record (claim,
//! forward, complete, release, mark ambiguous), and the `traceparent` the
//! inner service receives, whose parent is the forward span.
//!
//! Spans are `tracing` spans; with the `otel` feature they reach
//! OpenTelemetry through a `tracing_opentelemetry` layer when the process
//! installs one. Without either, a valid incoming context is passed on in its canonical version-00
//! form and nothing is generated. Attributes name the scope (its principal is a digest, never
//! a credential) and the key, never a header value or a body.

use http::{HeaderMap, HeaderName, HeaderValue, Method, Response};
use idem_core::{AttemptOutcome, RecordId, StoreError};
use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
#[cfg(feature = "otel")]
use opentelemetry::{Context, trace::TraceContextExt};
use tracing::Span;
use tracing::field::Empty;
#[cfg(feature = "otel")]
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::metrics::StoreOp;
use crate::problem::ProblemKind;
use crate::route;

/// The longest `tracestate` (all fields joined) passed on, in bytes; a
/// longer one is dropped, the `traceparent` kept.
pub const TRACESTATE_BYTES_MAX: usize = 4096;

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
/// `00-` + 32 + `-` + 16 + `-` + 2: every version starts with this shape.
const TRACEPARENT_BYTES: usize = 55;

/// A span for one step on one record: the scope and the key, plus the
/// step's own fields (a macro because a span's name and fields are static).
macro_rules! step_span {
    ($name:literal, $id:expr, $($field:tt)*) => {
        tracing::info_span!(
            $name,
            idem.scope = %$id.scope,
            idem.key = %$id.key,
            idem.scope_digest = Empty,
            otel.status_code = Empty,
            $($field)*
        )
    };
}

/// Reads the caller's trace context and leaves in `headers` only its
/// canonical form: a malformed or repeated `traceparent` is removed with
/// its `tracestate`, never passed on as it came.
pub(crate) fn take_incoming(headers: &mut HeaderMap) -> Option<SpanContext> {
    let incoming = incoming(headers);
    headers.remove(TRACEPARENT);
    headers.remove(TRACESTATE);
    if let Some(context) = &incoming {
        write(headers, context);
    }
    incoming
}

/// The span of one request through the layer. It continues `incoming`
/// unless the service already runs inside a traced span (which then stays
/// the parent); without either it starts a new trace.
pub(crate) fn request_span(method: &Method, incoming: Option<SpanContext>) -> Span {
    let span = tracing::info_span!(
        "idem.request",
        otel.kind = "server",
        http.request.method = %method,
        http.route = Empty,
        http.response.status_code = Empty,
        idem.problem = Empty,
        otel.status_code = Empty,
    );
    #[cfg(feature = "otel")]
    if let Some(parent) = incoming
        && !span.is_disabled()
        && !Span::current().context().span().span_context().is_valid()
    {
        // Fails only without an OpenTelemetry layer, where there is no trace to continue.
        let _ = span.set_parent(Context::new().with_remote_span_context(parent));
    }
    #[cfg(not(feature = "otel"))]
    let _ = incoming;
    span
}

/// Without the `otel` feature no span is exported: `headers` keep the
/// context they hold.
#[cfg(not(feature = "otel"))]
pub(crate) fn propagate(_span: &Span, _headers: &mut HeaderMap) {}

/// Makes `span` the parent of what the inner service does next, when it
/// is exported; otherwise `headers` keep the context they hold.
#[cfg(feature = "otel")]
pub(crate) fn propagate(span: &Span, headers: &mut HeaderMap) {
    let context = span.context();
    let own = context.span();
    if own.span_context().is_valid() {
        write(headers, own.span_context());
    }
}

/// Records the answer on the request span.
pub(crate) fn record_response<B>(span: &Span, response: &Response<B>) {
    if span.is_disabled() {
        return;
    }
    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
    if let Some(kind) = response.extensions().get::<ProblemKind>() {
        span.record("idem.problem", kind.slug());
    }
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
}

/// The span of one store operation on `id`.
pub(crate) fn store_span(op: StoreOp, id: &RecordId) -> Span {
    let span = match op {
        StoreOp::Claim => step_span!("idem.claim", id, idem.decision = Empty),
        StoreOp::Complete => step_span!("idem.complete", id, idem.outcome = Empty),
        StoreOp::Release => step_span!("idem.release", id, idem.outcome = Empty),
        StoreOp::MarkAmbiguous => step_span!("idem.mark_ambiguous", id, idem.outcome = Empty),
    };
    with_scope_digest(span, id)
}

/// Records what a store operation came to: `label` names a success (the
/// claim's decision); a fenced write and a store failure name themselves.
pub(crate) fn record_store<T>(
    span: &Span,
    op: StoreOp,
    outcome: &Result<T, StoreError>,
    label: impl FnOnce(&T) -> &'static str,
) {
    if span.is_disabled() {
        return;
    }
    let field = match op {
        StoreOp::Claim => "idem.decision",
        _ => "idem.outcome",
    };
    match outcome {
        Ok(value) => span.record(field, label(value)),
        Err(StoreError::Fenced { .. }) => span.record(field, "fenced"),
        Err(_) => {
            span.record(field, "store_failed");
            span.record("otel.status_code", "ERROR")
        }
    };
}

/// The span of the one call of the inner service (the upstream).
pub(crate) fn forward_span(id: &RecordId) -> Span {
    let span = step_span!(
        "idem.forward",
        id,
        otel.kind = "client",
        http.response.status_code = Empty,
        idem.attempt = Empty,
    );
    with_scope_digest(span, id)
}

/// Records the inner service's answer on the forward span: its status, or
/// how the attempt failed (`not_sent`, `lost`, `failed`).
pub(crate) fn record_forward<B, E>(span: &Span, outcome: &Result<Response<B>, E>) {
    if span.is_disabled() {
        return;
    }
    let failure = match outcome {
        Ok(response) => match response.extensions().get::<AttemptOutcome>() {
            None => {
                span.record("http.response.status_code", response.status().as_u16());
                return;
            }
            Some(AttemptOutcome::NotSent) => "not_sent",
            Some(AttemptOutcome::Lost) => "lost",
        },
        Err(_) => "failed",
    };
    span.record("idem.attempt", failure);
    span.record("otel.status_code", "ERROR");
}

/// Adds the scope digest (what `{scope_digest}` renders for the upstream),
/// hashed only when some subscriber wants the span.
fn with_scope_digest(span: Span, id: &RecordId) -> Span {
    if !span.is_disabled() {
        span.record("idem.scope_digest", route::scope_digest(&id.scope));
    }
    span
}

/// The caller's trace context: exactly one valid `traceparent`, and its
/// `tracestate` when that is valid and short enough.
fn incoming(headers: &HeaderMap) -> Option<SpanContext> {
    let mut values = headers.get_all(TRACEPARENT).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return None;
    };
    let (trace_id, span_id, flags) = parse_traceparent(value.as_bytes())?;
    Some(SpanContext::new(
        trace_id,
        span_id,
        flags,
        true,
        tracestate(headers),
    ))
}

/// W3C Trace Context, "traceparent Header": lowercase hex fields of fixed
/// length, version `ff` forbidden, version `00` exactly 55 characters, a
/// later version at least that followed by `-`, neither id all zeros.
/// Only the sampled flag is kept.
fn parse_traceparent(value: &[u8]) -> Option<(TraceId, SpanId, TraceFlags)> {
    let text = std::str::from_utf8(value).ok()?.trim_matches([' ', '\t']);
    let (head, rest) = (text.get(..TRACEPARENT_BYTES)?, &text[TRACEPARENT_BYTES..]);
    let mut fields = head.split('-');
    let (Some(version), Some(trace_id), Some(span_id), Some(flags), None) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    ) else {
        return None;
    };
    let shaped = lower_hex(version, 2)
        && lower_hex(trace_id, 32)
        && lower_hex(span_id, 16)
        && lower_hex(flags, 2);
    let versioned = match version {
        "ff" => false,
        "00" => rest.is_empty(),
        _ => rest.is_empty() || rest.starts_with('-'),
    };
    if !shaped || !versioned {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?) & TraceFlags::SAMPLED;
    (trace_id != TraceId::INVALID && span_id != SpanId::INVALID)
        .then_some((trace_id, span_id, flags))
}

/// Every `tracestate` field as one list; empty when it is not valid text,
/// not a valid list, or over [`TRACESTATE_BYTES_MAX`].
fn tracestate(headers: &HeaderMap) -> TraceState {
    let mut joined = String::new();
    for value in headers.get_all(TRACESTATE) {
        let Ok(text) = value.to_str() else {
            return TraceState::NONE;
        };
        if joined.len() + text.len() + 1 > TRACESTATE_BYTES_MAX {
            return TraceState::NONE;
        }
        if !joined.is_empty() {
            joined.push(',');
        }
        joined.push_str(text);
    }
    joined.parse().unwrap_or(TraceState::NONE)
}

fn lower_hex(text: &str, len: usize) -> bool {
    text.len() == len && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Writes `context` as version `00` (the only one this side speaks).
fn write(headers: &mut HeaderMap, context: &SpanContext) {
    let flags = (context.trace_flags() & TraceFlags::SAMPLED).to_u8();
    let parent = format!(
        "00-{}-{}-{flags:02x}",
        context.trace_id(),
        context.span_id()
    );
    if let Ok(value) = HeaderValue::from_str(&parent) {
        headers.insert(TRACEPARENT, value);
    }
    let state = context.trace_state().header();
    match HeaderValue::from_str(&state) {
        Ok(value) if !state.is_empty() => {
            headers.insert(TRACESTATE, value);
        }
        _ => {
            headers.remove(TRACESTATE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const PARENT: &str = "00f067aa0ba902b7";

    /// Each case: the `traceparent` fields sent, and the canonical
    /// `traceparent` passed on (`None`: ignored, a new trace starts).
    #[test]
    fn traceparent_is_read_strictly() {
        let ok = |flags: &str| Some(format!("00-{TRACE}-{PARENT}-{flags}"));
        let cases: Vec<(&str, Vec<String>, Option<String>)> = vec![
            ("sampled", vec![format!("00-{TRACE}-{PARENT}-01")], ok("01")),
            (
                "not sampled",
                vec![format!("00-{TRACE}-{PARENT}-00")],
                ok("00"),
            ),
            (
                "unknown flags dropped",
                vec![format!("00-{TRACE}-{PARENT}-09")],
                ok("01"),
            ),
            (
                "spaces and tabs around",
                vec![format!(" \t00-{TRACE}-{PARENT}-01\t ")],
                ok("01"),
            ),
            (
                "later version, longer",
                vec![format!("cc-{TRACE}-{PARENT}-01-what-not")],
                ok("01"),
            ),
            (
                "later version, exact",
                vec![format!("01-{TRACE}-{PARENT}-00")],
                ok("00"),
            ),
            (
                "later version, no dash after flags",
                vec![format!("cc-{TRACE}-{PARENT}-01x")],
                None,
            ),
            (
                "version 00 with more",
                vec![format!("00-{TRACE}-{PARENT}-01-")],
                None,
            ),
            ("version ff", vec![format!("ff-{TRACE}-{PARENT}-01")], None),
            (
                "version one digit",
                vec![format!("0-{TRACE}-{PARENT}-01")],
                None,
            ),
            (
                "version uppercase",
                vec![format!("0A-{TRACE}-{PARENT}-01")],
                None,
            ),
            (
                "trace id uppercase",
                vec![format!("00-{}-{PARENT}-01", TRACE.to_uppercase())],
                None,
            ),
            (
                "parent id uppercase",
                vec![format!("00-{TRACE}-00F067AA0BA902B7-01")],
                None,
            ),
            (
                "flags uppercase",
                vec![format!("00-{TRACE}-{PARENT}-0A")],
                None,
            ),
            (
                "trace id short",
                vec![format!("00-{}-{PARENT}-01", &TRACE[1..])],
                None,
            ),
            (
                "trace id long",
                vec![format!("00-{TRACE}0-{PARENT}-01")],
                None,
            ),
            (
                "parent id short",
                vec![format!("00-{TRACE}-{}-01", &PARENT[1..])],
                None,
            ),
            ("flags short", vec![format!("00-{TRACE}-{PARENT}-1")], None),
            (
                "sign in trace id",
                vec![format!("00-+{}-{PARENT}-01", &TRACE[1..])],
                None,
            ),
            (
                "not hex",
                vec![format!("00-{}-{PARENT}-01", "g".repeat(32))],
                None,
            ),
            (
                "trace id zero",
                vec![format!("00-{}-{PARENT}-01", "0".repeat(32))],
                None,
            ),
            (
                "parent id zero",
                vec![format!("00-{TRACE}-{}-01", "0".repeat(16))],
                None,
            ),
            (
                "other separator",
                vec![format!("00_{TRACE}_{PARENT}_01")],
                None,
            ),
            ("empty", vec![String::new()], None),
            (
                "a list of two",
                vec![format!("00-{TRACE}-{PARENT}-01,00-{TRACE}-{PARENT}-01")],
                None,
            ),
            (
                "a header naming others",
                vec!["tracestate, baggage".into()],
                None,
            ),
            (
                "two fields",
                vec![
                    format!("00-{TRACE}-{PARENT}-01"),
                    format!("00-{TRACE}-{PARENT}-01"),
                ],
                None,
            ),
            (
                "not text",
                vec![format!("00-{TRACE}-{PARENT}-\u{e9}1")],
                None,
            ),
        ];
        for (name, sent, expect) in cases {
            let mut headers = HeaderMap::new();
            for value in &sent {
                headers.append(
                    TRACEPARENT,
                    HeaderValue::from_bytes(value.as_bytes()).unwrap(),
                );
            }
            headers.append(TRACESTATE, HeaderValue::from_static("vendor=value"));
            let context = take_incoming(&mut headers);
            let passed: Vec<_> = headers.get_all(TRACEPARENT).iter().collect();
            let passed = passed.first().map(|v| v.to_str().unwrap().to_owned());
            assert_eq!(passed, expect, "{name}");
            assert_eq!(context.is_some(), expect.is_some(), "{name}");
            let state = headers.get(TRACESTATE).map(|v| v.to_str().unwrap());
            let expect_state = expect.as_ref().map(|_| "vendor=value");
            assert_eq!(
                state, expect_state,
                "{name}: tracestate goes with its traceparent"
            );
        }
    }

    /// Each case: the `tracestate` fields sent with a valid `traceparent`,
    /// and the `tracestate` passed on.
    #[test]
    fn tracestate_is_passed_on_when_valid() {
        let long = format!("k={}", "v".repeat(200));
        let too_long: Vec<String> = (0..20)
            .map(|i| format!("k{i}={}", "v".repeat(250)))
            .collect();
        let cases: Vec<(&str, Vec<String>, Option<String>)> = vec![
            ("none", vec![], None),
            ("one", vec!["a=1".into()], Some("a=1".into())),
            (
                "two fields joined",
                vec!["a=1".into(), "b=2".into()],
                Some("a=1,b=2".into()),
            ),
            ("a list", vec!["a=1, b=2".into()], Some("a=1,b=2".into())),
            ("a long value", vec![long.clone()], Some(long)),
            ("not a list", vec!["a".into()], None),
            ("invalid key", vec!["A=1".into()], None),
            ("over the limit", too_long, None),
        ];
        for (name, sent, expect) in cases {
            let mut headers = HeaderMap::new();
            headers.insert(
                TRACEPARENT,
                HeaderValue::from_str(&format!("00-{TRACE}-{PARENT}-01")).unwrap(),
            );
            for value in &sent {
                headers.append(TRACESTATE, HeaderValue::from_str(value).unwrap());
            }
            assert!(take_incoming(&mut headers).is_some(), "{name}");
            let passed = headers
                .get(TRACESTATE)
                .map(|v| v.to_str().unwrap().to_owned());
            assert_eq!(passed, expect, "{name}");
            assert!(headers.get_all(TRACESTATE).iter().count() <= 1, "{name}");
        }
    }

    #[test]
    fn without_a_traceparent_nothing_is_passed_on() {
        let mut headers = HeaderMap::new();
        headers.insert(TRACESTATE, HeaderValue::from_static("a=1"));
        assert!(take_incoming(&mut headers).is_none());
        assert!(headers.is_empty(), "{headers:?}");
    }
}
