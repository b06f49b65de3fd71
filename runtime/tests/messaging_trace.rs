//! Trace context across the durable path: sender → ingress → router → inbox stream → handler.
//!
//! The only test of this binary: it installs a process-wide tracing subscriber exporting to
//! memory, so that the spans of the actors' tasks (on any runtime thread) are captured too.

mod support;

use opentelemetry::trace::TraceId;
use serde_json::json;
use support::*;
use tracing::Instrument;

/// The recipient's `inbox.handle` span belongs to the sender's trace, through the router's
/// `route` span: send → route → inbox.handle, each the parent of the next.
#[tokio::test]
async fn senders_trace_id_reaches_the_recipients_handler_span_through_the_router() {
    let (provider, exporter) = memory_tracing();

    let server = harness::run_server().await.unwrap();
    let system = durable_system(server.url()).await;
    system.start_router().await.unwrap();
    let (alice, bob) = (agent("alice"), agent("bob"));
    let seen = attach_collect(&system, &bob).await;

    let send_span = tracing::info_span!("send");
    system
        .send(&alice, &bob, json!("traced"))
        .instrument(send_span.clone())
        .await
        .unwrap();
    drop(send_span);
    wait_for(&seen, 1).await;
    assert_eq!(bodies(&seen), vec![json!("traced")]);

    // The handler span ends right after the handler returns; wait until it is exported.
    harness::wait_until("the inbox.handle span exported", DEADLINE, || {
        let _ = provider.force_flush();
        let spans = exporter.get_finished_spans().unwrap();
        !spans_named(&spans, "inbox.handle").is_empty() && !spans_named(&spans, "send").is_empty()
    })
    .await
    .unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let [send] = spans_named(&spans, "send")[..] else {
        panic!("one send span: {spans:#?}")
    };
    let [route] = spans_named(&spans, "route")[..] else {
        panic!("one route span: {spans:#?}")
    };
    let [handle] = spans_named(&spans, "inbox.handle")[..] else {
        panic!("one inbox.handle span: {spans:#?}")
    };
    let trace = send.span_context.trace_id();
    assert_ne!(trace, TraceId::INVALID);
    assert_eq!(
        route.span_context.trace_id(),
        trace,
        "route joins the sender's trace"
    );
    assert_eq!(
        handle.span_context.trace_id(),
        trace,
        "the handler joins the sender's trace"
    );
    assert_eq!(route.parent_span_id, send.span_context.span_id());
    assert!(route.parent_span_is_remote);
    assert_eq!(handle.parent_span_id, route.span_context.span_id());
    assert!(handle.parent_span_is_remote);

    system.shutdown(GRACE).await.unwrap();
    let _ = provider.shutdown();
}
