//! Logging and tracing: a `tracing` subscriber on stderr (`RUST_LOG`, text or JSON) and, when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, OpenTelemetry
//! trace export over OTLP/gRPC with the service name from `OTEL_SERVICE_NAME` (default
//! `runtime`). The W3C trace-context propagator is installed globally so that `traceparent`
//! headers on NATS messages join spans across processes.

use opentelemetry::trace::TracerProvider as _;
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
    /// A global subscriber was already installed.
    #[error("a tracing subscriber is already installed")]
    AlreadyInstalled,
}

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

    /// Flushes and stops the exporter. Blocking; call it outside hot paths.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider {
            if let Err(e) = provider.force_flush() {
                eprintln!("runtime: flushing traces failed: {e}");
            }
            if let Err(e) = provider.shutdown() {
                eprintln!("runtime: stopping the trace exporter failed: {e}");
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

/// Installs the global subscriber with `RUST_LOG`, or `default_level` when it is unset. Must
/// run inside a tokio runtime when OTLP export is on.
///
/// # Errors
/// [`TelemetryError`] when `RUST_LOG` is invalid, the exporter cannot be built, or a subscriber
/// is already installed.
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
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .boxed()
    };
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let provider = if otlp_enabled() {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
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
        tracing_opentelemetry::layer().with_tracer(p.tracer("runtime"))
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init()
        .map_err(|_| TelemetryError::AlreadyInstalled)?;
    Ok(Telemetry { provider })
}
