//! Log lines and traces: logs go to stderr, as text or, with
//! `IDEM_LOG_FORMAT=json`, as one JSON object per line for a log shipper;
//! the spans of the idem crates are exported over OTLP/HTTP (protobuf) only
//! when the standard `OTEL_*` variables ask for it, and flushed when the
//! command ends.

use anyhow::bail;
use opentelemetry::InstrumentationScope;
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Subscriber;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::filter::{FilterExt, Targets, filter_fn};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// How log lines are written, read once from `IDEM_LOG_FORMAT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event (the default).
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message`
    /// and every field of the event (`scope`, `key`, `cause`, …) at the top
    /// level, for Loki, Elasticsearch or CloudWatch to index.
    Json,
}

impl LogFormat {
    /// `IDEM_LOG_FORMAT` through `var`: `text` (or unset) or `json`; any
    /// other value is an error naming the variable.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> anyhow::Result<LogFormat> {
        let value = var("IDEM_LOG_FORMAT").map(|v| v.trim().to_ascii_lowercase());
        match value.as_deref() {
            None | Some("" | "text") => Ok(LogFormat::Text),
            Some("json") => Ok(LogFormat::Json),
            Some(other) => bail!(
                "IDEM_LOG_FORMAT={other:?}: idem writes its log as \"text\" (the default) or \"json\""
            ),
        }
    }

    /// The log layer writing to stderr in this format; with `traces` on, a
    /// JSON line written inside a span carries its `trace_id` and
    /// `span_id`, to join the line to its trace.
    fn layer<S>(self, ansi: bool, traces: Traces) -> Box<dyn Layer<S> + Send + Sync>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
        let json = || {
            tracing_subscriber::fmt::format()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
        };
        match (self, traces) {
            (LogFormat::Text, _) => layer.with_ansi(ansi).boxed(),
            (LogFormat::Json, Traces::Off) => layer
                .event_format(json())
                .fmt_fields(JsonFields::new())
                .boxed(),
            (LogFormat::Json, Traces::Otlp) => layer
                .event_format(WithTraceId(json()))
                .fmt_fields(JsonFields::new())
                .boxed(),
        }
    }
}

/// A JSON event format that adds the current span's `trace_id` and
/// `span_id` (W3C hex, as a trace backend shows them) when there is one.
struct WithTraceId<F>(F);

impl<S, N, F> FormatEvent<S, N> for WithTraceId<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        let context = tracing::Span::current().context();
        let span = context.span();
        let ids = span.span_context();
        match line.strip_prefix('{') {
            Some(rest) if ids.is_valid() => write!(
                writer,
                "{{\"trace_id\":\"{}\",\"span_id\":\"{}\",{rest}",
                ids.trace_id(),
                ids.span_id()
            ),
            _ => writer.write_str(&line),
        }
    }
}

/// Whether traces leave the process, read once from the environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Traces {
    /// No exporter, no tracer: spans cost a disabled-callsite check.
    Off,
    /// OTLP over HTTP with protobuf, to the endpoint the exporter reads
    /// from `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`.
    Otlp,
}

/// What must outlive the command: the tracer provider, whose queued spans
/// are flushed by [`Telemetry::shutdown`].
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Traces {
    /// Reads the standard variables through `var`: `OTEL_SDK_DISABLED`,
    /// `OTEL_TRACES_EXPORTER` (`otlp` or `none`), the OTLP endpoints and
    /// protocols. Without an exporter or an endpoint named, traces are off.
    /// What idem cannot honour is an error naming the variable.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> anyhow::Result<Traces> {
        let set = |name: &str| {
            var(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(Traces::Off);
        }
        let endpoint = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .map(|v| ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", v))
            .or_else(|| {
                set("OTEL_EXPORTER_OTLP_ENDPOINT").map(|v| ("OTEL_EXPORTER_OTLP_ENDPOINT", v))
            });
        let wanted = match set("OTEL_TRACES_EXPORTER").map(|v| v.to_ascii_lowercase()) {
            Some(exporter) if exporter == "none" => return Ok(Traces::Off),
            Some(exporter) if exporter == "otlp" => true,
            Some(other) => bail!(
                "OTEL_TRACES_EXPORTER={other:?}: idem exports traces over OTLP only; set it to \"otlp\" or \"none\""
            ),
            None => endpoint.is_some(),
        };
        if !wanted {
            return Ok(Traces::Off);
        }
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(protocol) = set(name) {
                if protocol != "http/protobuf" {
                    bail!("{name}={protocol:?}: idem exports traces as \"http/protobuf\" only");
                }
                break;
            }
        }
        if let Some((name, url)) = endpoint
            && !url.to_ascii_lowercase().starts_with("http://")
        {
            bail!(
                "{name}={url:?}: idem exports traces over plain http:// only; \
                 point it at a collector on this host or a private network"
            );
        }
        Ok(Traces::Otlp)
    }
}

impl Telemetry {
    /// Installs the log output (stderr in `format`, filtered by `IDEM_LOG`,
    /// e.g. `debug` or `idem_http=debug`, without spans so that its lines
    /// keep their shape) and, when `traces` asks, the OTLP exporter for
    /// spans and their events at `info` and above.
    pub fn init(traces: Traces, format: LogFormat) -> anyhow::Result<Telemetry> {
        let filter = EnvFilter::try_from_env("IDEM_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let provider = match traces {
            Traces::Off => None,
            Traces::Otlp => Some(provider()?),
        };
        let Some(tracer) = provider.as_ref() else {
            // No exporter: spans are turned off for the whole process, per
            // call site, so that a request's spans cost nothing. Filtering
            // them out of the log layer alone still had the registry make
            // and drop every span: 10-15 % of hot-replay throughput.
            // filter_fn keeps its answer per call site: never, for a span.
            let no_spans = filter_fn(|meta| !meta.is_span());
            let logs = format.layer(ansi, traces);
            tracing_subscriber::registry()
                .with(no_spans)
                .with(filter)
                .with(logs)
                .init();
            return Ok(Telemetry { provider: None });
        };
        let scope = InstrumentationScope::builder("idem")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let spans = tracing_opentelemetry::layer()
            .with_tracer(tracer.tracer_with_scope(scope))
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_filter(Targets::new().with_target("idem", tracing::Level::INFO));
        let logs = format
            .layer(ansi, traces)
            .with_filter(filter.and(filter_fn(|meta| !meta.is_span())));
        tracing_subscriber::registry().with(logs).with(spans).init();
        Ok(Telemetry { provider })
    }

    /// Exports the spans still queued (bounded by the exporter's timeout).
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(e) = provider.shutdown()
        {
            eprintln!("warning: traces not all exported at exit: {e}");
        }
    }
}

/// The tracer provider: a batch of spans to the OTLP endpoint; service
/// name `idem` unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES`
/// name one.
fn provider() -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot set up the OTLP trace exporter: {e}"))?;
    let detected = Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    let resource = if named {
        detected
    } else {
        Resource::builder().with_service_name("idem").build()
    };
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The only test in this binary that installs the global subscriber.
    /// Without an exporter a span is never made (the registry would
    /// otherwise make and drop each of a request's spans), while events
    /// still reach the log.
    #[test]
    fn without_an_exporter_spans_are_off_and_events_still_log() {
        let _telemetry = Telemetry::init(Traces::Off, LogFormat::Text).unwrap();
        let span = tracing::info_span!("idem.request", idem.key = "k");
        assert!(span.is_disabled(), "a span was made without an exporter");
        assert!(
            tracing::enabled!(tracing::Level::INFO),
            "info events are logged"
        );
    }

    #[test]
    fn the_log_format_is_text_or_json_and_anything_else_is_named() {
        let cases = [
            (None, Ok(LogFormat::Text)),
            (Some(""), Ok(LogFormat::Text)),
            (Some("text"), Ok(LogFormat::Text)),
            (Some("json"), Ok(LogFormat::Json)),
            (Some(" JSON "), Ok(LogFormat::Json)),
            (Some("logfmt"), Err("IDEM_LOG_FORMAT=\"logfmt\"")),
        ];
        for (value, want) in cases {
            let got = LogFormat::from_env(|name| {
                assert_eq!(name, "IDEM_LOG_FORMAT");
                value.map(str::to_owned)
            });
            match (got, want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{value:?}"),
                (Err(e), Err(words)) => assert!(e.to_string().contains(words), "{value:?}: {e}"),
                (got, want) => panic!("{value:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// Each case: the variables set, and the answer (`Err` holds a word of
    /// the message).
    #[test]
    fn traces_follow_the_standard_variables() {
        type Vars = &'static [(&'static str, &'static str)];
        let cases: [(Vars, Result<Traces, &str>); 14] = [
            (&[], Ok(Traces::Off)),
            (&[("OTEL_SERVICE_NAME", "payouts-gw")], Ok(Traces::Off)),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")],
                Ok(Traces::Otlp),
            ),
            (
                &[(
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://c:4318/v1/traces",
                )],
                Ok(Traces::Otlp),
            ),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")], Ok(Traces::Off)),
            (&[("OTEL_TRACES_EXPORTER", "otlp")], Ok(Traces::Otlp)),
            (
                &[
                    ("OTEL_TRACES_EXPORTER", "none"),
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
                ],
                Ok(Traces::Off),
            ),
            (
                &[
                    ("OTEL_SDK_DISABLED", "TRUE"),
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
                ],
                Ok(Traces::Off),
            ),
            (
                &[("OTEL_TRACES_EXPORTER", "zipkin")],
                Err("OTEL_TRACES_EXPORTER"),
            ),
            (
                &[
                    ("OTEL_TRACES_EXPORTER", "none"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ],
                Ok(Traces::Off),
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ],
                Err("OTEL_EXPORTER_OTLP_PROTOCOL"),
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
                    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ],
                Ok(Traces::Otlp),
            ),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c")],
                Err("OTEL_EXPORTER_OTLP_ENDPOINT"),
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "HTTPS://c/v1/traces"),
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
                ],
                Err("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            ),
        ];
        for (vars, expect) in cases {
            let var = |name: &str| {
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_owned())
            };
            match (Traces::from_env(var), expect) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{vars:?}"),
                (Err(e), Err(word)) => assert!(e.to_string().contains(word), "{vars:?}: {e}"),
                (got, want) => panic!("{vars:?}: got {got:?}, want {want:?}"),
            }
        }
    }
}
