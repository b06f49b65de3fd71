//! Logging and tracing: a `tracing` subscriber on stderr (`RUST_LOG`, text or JSON) and, when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, OpenTelemetry
//! trace export over OTLP with the service name from `OTEL_SERVICE_NAME` (default `runtime`).
//! The transport is `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else `OTEL_EXPORTER_OTLP_PROTOCOL`:
//! `grpc` (the default) or `http/protobuf` (`POST <endpoint>/v1/traces`). The W3C trace-context
//! propagator is installed globally so that `traceparent` headers on NATS messages join spans
//! across processes.
//!
//! `RUST_LOG` filters what is logged, not what is exported: spans go to the exporter from
//! `info` up whatever the log level (one-shot commands log only warnings but still export their
//! spans), except those of the exporter's own HTTP/gRPC stack. Spans end into a batch
//! processor's bounded queue on its own thread: a slow or unreachable collector drops spans,
//! it never blocks the code that ends them.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Telemetry setup failures.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `RUST_LOG` does not parse.
    #[error("invalid RUST_LOG filter: {0}")]
    Filter(String),
    /// The OTLP exporter could not be built (bad endpoint...).
    #[error("cannot set up otlp trace export: {0}")]
    Exporter(String),
    /// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` or `OTEL_EXPORTER_OTLP_PROTOCOL` names a protocol
    /// this build does not speak.
    #[error("unsupported {var} {value:?}: expected grpc or http/protobuf")]
    Protocol {
        /// The variable that was read.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// A global subscriber was already installed.
    #[error("a tracing subscriber is already installed")]
    AlreadyInstalled,
}

/// The OTLP transport of trace export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/gRPC (`grpc`), the default.
    Grpc,
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`), `POST <endpoint>/v1/traces`.
    HttpProtobuf,
}

/// The traces-specific protocol variable; it wins over [`PROTOCOL_VAR`].
pub const TRACES_PROTOCOL_VAR: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
/// The protocol variable of every OTLP signal.
pub const PROTOCOL_VAR: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";

/// The protocol named by the values of [`TRACES_PROTOCOL_VAR`] (`traces`) and
/// [`PROTOCOL_VAR`] (`generic`): the first that is set and not blank, else
/// [`OtlpProtocol::Grpc`]. Case-insensitive.
///
/// # Errors
/// [`TelemetryError::Protocol`] for any other value (`http/json` included), naming the
/// variable it came from.
pub fn otlp_protocol(
    traces: Option<&str>,
    generic: Option<&str>,
) -> Result<OtlpProtocol, TelemetryError> {
    let chosen = [(TRACES_PROTOCOL_VAR, traces), (PROTOCOL_VAR, generic)]
        .into_iter()
        .find_map(|(var, value)| {
            value
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(|v| (var, v))
        });
    match chosen {
        None => Ok(OtlpProtocol::Grpc),
        Some((_, v)) if v.eq_ignore_ascii_case("grpc") => Ok(OtlpProtocol::Grpc),
        Some((_, v)) if v.eq_ignore_ascii_case("http/protobuf") => Ok(OtlpProtocol::HttpProtobuf),
        Some((var, v)) => Err(TelemetryError::Protocol {
            var,
            value: v.to_string(),
        }),
    }
}

/// [`otlp_protocol`] from the environment.
///
/// # Errors
/// As [`otlp_protocol`].
pub fn otlp_protocol_from_env() -> Result<OtlpProtocol, TelemetryError> {
    let traces = std::env::var(TRACES_PROTOCOL_VAR).ok();
    let generic = std::env::var(PROTOCOL_VAR).ok();
    otlp_protocol(traces.as_deref(), generic.as_deref())
}

/// What goes to the exporter: spans (and their events) from `info` up, except the exporter's
/// own transport stack, whose spans would otherwise be exported by the export itself, and
/// ractor's per-actor lifecycle spans (one trace per actor, unrelated to any message; the
/// runtime's own spans carry the traces of messages and tasks).
const EXPORT_FILTER: &str =
    "info,h2=off,hyper=off,tonic=off,tower=off,reqwest=off,opentelemetry=off,ractor=off";

fn span_exporter(
    protocol: OtlpProtocol,
) -> Result<opentelemetry_otlp::SpanExporter, TelemetryError> {
    let builder = opentelemetry_otlp::SpanExporter::builder();
    match protocol {
        OtlpProtocol::Grpc => builder.with_tonic().build(),
        OtlpProtocol::HttpProtobuf => builder
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .build(),
    }
    .map_err(|e| TelemetryError::Exporter(e.to_string()))
}

/// How long [`Telemetry::shutdown`] waits for the last spans to be exported.
pub const EXPORT_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Keeps the exporter alive; call [`Telemetry::shutdown`] before exiting to flush spans.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported over OTLP.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports the queued spans and stops the exporter, waiting at most [`EXPORT_GRACE`] (a
    /// collector that accepts connections but never answers must not hold a one-shot command
    /// for long). Blocking; call it outside hot paths.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider {
            // Shutting the batch processor down exports what it holds first.
            if let Err(e) = provider.shutdown_with_timeout(EXPORT_GRACE) {
                eprintln!("runtime: exporting the last traces failed: {e}");
            }
        }
    }
}

/// Whether OTLP export is switched on by the standard environment variables.
pub fn otlp_enabled() -> bool {
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|k| std::env::var(k).is_ok_and(|v| !v.trim().is_empty()))
}

/// Installs the global subscriber: logs filtered by `RUST_LOG`, or `default_level` when it is
/// unset, and (when OTLP export is on) spans filtered by `EXPORT_FILTER`. Must run inside a
/// tokio runtime when OTLP export is on.
///
/// # Errors
/// [`TelemetryError`] when `RUST_LOG` is invalid, the protocol is unknown, the exporter cannot
/// be built, or a subscriber is already installed.
pub fn init(json: bool, default_level: &str) -> Result<Telemetry, TelemetryError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => {
            EnvFilter::try_new(v).map_err(|e| TelemetryError::Filter(e.to_string()))?
        }
        _ => EnvFilter::new(default_level),
    };
    let fmt = if json {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed()
    };
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let provider = if otlp_enabled() {
        let exporter = span_exporter(otlp_protocol_from_env()?)?;
        let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "runtime".to_string());
        Some(
            SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(Resource::builder().with_service_name(service).build())
                .build(),
        )
    } else {
        None
    };
    let otel = provider.as_ref().map(|p| {
        opentelemetry::global::set_tracer_provider(p.clone());
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("runtime"))
            .with_filter(EnvFilter::new(EXPORT_FILTER))
    });
    tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init()
        .map_err(|_| TelemetryError::AlreadyInstalled)?;
    Ok(Telemetry { provider })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_protocol_defaults_to_grpc_and_the_traces_variable_wins() {
        use OtlpProtocol::{Grpc, HttpProtobuf};
        let cases: [(Option<&str>, Option<&str>, OtlpProtocol); 7] = [
            (None, None, Grpc),
            (Some(""), Some("  "), Grpc),
            (None, Some("http/protobuf"), HttpProtobuf),
            (Some("http/protobuf"), None, HttpProtobuf),
            (Some("HTTP/Protobuf"), Some("grpc"), HttpProtobuf),
            (Some("grpc"), Some("http/protobuf"), Grpc),
            (Some(" "), Some("GRPC"), Grpc),
        ];
        for (traces, generic, want) in cases {
            assert_eq!(
                otlp_protocol(traces, generic).unwrap(),
                want,
                "{traces:?} {generic:?}"
            );
        }
    }

    #[test]
    fn an_unknown_protocol_names_its_variable_and_value() {
        let e = otlp_protocol(None, Some("carrier-pigeon")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unsupported OTEL_EXPORTER_OTLP_PROTOCOL \"carrier-pigeon\": expected grpc or http/protobuf"
        );
        // The traces variable is read first, even when the generic one is valid.
        let e = otlp_protocol(Some("http/json"), Some("grpc")).unwrap_err();
        assert!(
            matches!(&e, TelemetryError::Protocol { var, value } if *var == TRACES_PROTOCOL_VAR && value == "http/json"),
            "{e}"
        );
    }
}
