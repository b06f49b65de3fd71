//! W3C trace context across NATS hops: glue between `tracing` spans (via
//! `tracing-opentelemetry`) and `traceparent`/`tracestate` headers on NATS messages.
//!
//! Parsing and formatting are [`protocol::trace`]'s; this module maps them to OpenTelemetry span
//! contexts. A sender calls [`inject_current`] before publishing; a receiver calls
//! [`set_parent_from`] on its handler span, which then belongs to the sender's trace.

use std::str::FromStr;

use async_nats::HeaderMap;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use protocol::trace::{self, HeaderCarrier, TraceParent};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Writable view of a NATS header map as a [`HeaderCarrier`].
pub struct NatsHeaders<'a>(pub &'a mut HeaderMap);

impl HeaderCarrier for NatsHeaders<'_> {
    fn get_header(&self, name: &str) -> Option<String> {
        self.0.get(name).map(|v| v.as_str().to_string())
    }

    fn set_header(&mut self, name: &str, value: String) {
        self.0.insert(name, value.as_str());
    }
}

/// Read-only view of a NATS header map; `set_header` is ignored.
pub struct NatsHeadersRef<'a>(pub &'a HeaderMap);

impl HeaderCarrier for NatsHeadersRef<'_> {
    fn get_header(&self, name: &str) -> Option<String> {
        self.0.get(name).map(|v| v.as_str().to_string())
    }

    fn set_header(&mut self, _name: &str, _value: String) {}
}

/// The `traceparent` of `span`, when it belongs to a valid OpenTelemetry trace.
pub fn traceparent_of(span: &tracing::Span) -> Option<(TraceParent, Option<String>)> {
    let cx = span.context();
    let otel_span = cx.span();
    let sc = otel_span.span_context();
    if !sc.is_valid() {
        return None;
    }
    let tp = TraceParent {
        trace_id: sc.trace_id().to_bytes(),
        parent_id: sc.span_id().to_bytes(),
        flags: sc.trace_flags().to_u8(),
    };
    let state = sc.trace_state().header();
    Some((tp, (!state.is_empty()).then_some(state)))
}

/// Injects the current span's trace context into `headers`. A no-op when there is no valid
/// trace (telemetry off).
pub fn inject_current(headers: &mut HeaderMap) {
    if let Some((tp, state)) = traceparent_of(&tracing::Span::current()) {
        trace::inject(&tp, state.as_deref(), &mut NatsHeaders(headers));
    }
}

/// The remote parent carried by `headers`, if any and valid.
pub fn remote_parent(headers: &HeaderMap) -> Option<opentelemetry::Context> {
    let (tp, state) = trace::extract(&NatsHeadersRef(headers))?;
    let state = state
        .and_then(|s| TraceState::from_str(&s).ok())
        .unwrap_or_default();
    let sc = SpanContext::new(
        TraceId::from_bytes(tp.trace_id),
        SpanId::from_bytes(tp.parent_id),
        TraceFlags::new(tp.flags),
        true,
        state,
    );
    Some(opentelemetry::Context::new().with_remote_span_context(sc))
}

/// Makes `span` a child of the trace carried by `headers` (when there is one). Returns whether
/// a parent was set.
pub fn set_parent_from(span: &tracing::Span, headers: Option<&HeaderMap>) -> bool {
    // A disabled span (no subscriber takes it) records nothing: the headers are not read.
    if span.is_disabled() {
        return false;
    }
    match headers.and_then(remote_parent) {
        Some(cx) => span.set_parent(cx).is_ok(),
        None => false,
    }
}

/// Whether `headers` carry a `traceparent` header (valid or not).
pub fn has_traceparent(headers: &HeaderMap) -> bool {
    headers.get(crate::header_names::TRACEPARENT).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    use protocol::headers;
    use tracing_subscriber::layer::SubscriberExt;

    /// A span on the sending side and a span on the receiving side of a real NATS hop belong to
    /// the same trace, the receiver's parent being the sender's span.
    #[tokio::test]
    async fn handler_span_joins_the_senders_trace_across_a_nats_hop() {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        let _guard = tracing::subscriber::set_default(subscriber);

        let server = harness::run_server().await.unwrap();
        let client = server.client().await.unwrap();
        let mut sub = client.subscribe("trace.hop").await.unwrap();

        {
            let send = tracing::info_span!("send");
            let _entered = send.enter();
            let mut headers = HeaderMap::new();
            inject_current(&mut headers);
            assert!(has_traceparent(&headers));
            client
                .publish_with_headers("trace.hop", headers, "x".into())
                .await
                .unwrap();
            client.flush().await.unwrap();
        }
        let msg = tokio::time::timeout(std::time::Duration::from_secs(10), sub.next())
            .await
            .unwrap()
            .unwrap();
        {
            let handle = tracing::info_span!("handle");
            assert!(set_parent_from(&handle, msg.headers.as_ref()));
            let _entered = handle.enter();
        }
        provider.force_flush().unwrap();
        let spans = exporter.get_finished_spans().unwrap();
        let send = spans.iter().find(|s| s.name == "send").expect("send span");
        let handle = spans
            .iter()
            .find(|s| s.name == "handle")
            .expect("handle span");
        assert_eq!(handle.span_context.trace_id(), send.span_context.trace_id());
        assert_eq!(handle.parent_span_id, send.span_context.span_id());
    }

    #[test]
    fn malformed_traceparent_is_ignored() {
        let mut headers = HeaderMap::new();
        headers.insert(headers::TRACEPARENT, "00-zz-zz-01");
        assert!(remote_parent(&headers).is_none());
        let span = tracing::info_span!("x");
        assert!(!set_parent_from(&span, Some(&headers)));
    }
}
