//! Trace context across a task's round trip: delegator → router → worker attempt → router →
//! tracker, one trace.
//!
//! The only test of this binary: it installs a process-wide tracing subscriber exporting to
//! memory, so that the spans of the actors' tasks (on any runtime thread) are captured too.

mod support;

use std::sync::Arc;

use actors::worker::{AttemptContext, Outcome, TaskHandler};
use opentelemetry::trace::TraceId;
use protocol::task::{TaskSpec, TaskState};
use protocol::QueueName;
use runtime::system::tasks::new_task;
use support::*;
use tracing::Instrument;

struct Done;

#[async_trait::async_trait]
impl TaskHandler for Done {
    async fn run(&self, task: TaskSpec, _: AttemptContext) -> Outcome {
        Outcome::Completed(serde_json::json!(task.text))
    }
}

/// The delegator's span, the worker's `attempt` span and the tracker's `tracker.result` span
/// share one trace id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegators_trace_id_reaches_the_attempt_and_the_trackers_result_span() {
    let (provider, exporter) = memory_tracing();

    let server = harness::run_server().await.unwrap();
    let system = durable_system(server.url()).await;
    system.start_router().await.unwrap();
    let queue = QueueName::new("traced").unwrap();
    let journal = tempfile::tempdir().unwrap();
    start_worker(
        &system,
        "w-trace",
        &queue,
        1,
        Arc::new(Done),
        journal.path(),
    )
    .await;

    let spec = new_task("traced task", vec![]);
    let tracking = system
        .track(&protocol::AgentId::new("alice").unwrap(), &spec.task_id)
        .await
        .unwrap();
    let delegate_span = tracing::info_span!("delegate");
    system
        .delegate(&agent("alice"), &queue, None, &spec)
        .instrument(delegate_span.clone())
        .await
        .unwrap();
    drop(delegate_span);
    let result = tokio::time::timeout(DEADLINE, tracking.result)
        .await
        .expect("result in time")
        .unwrap();
    assert_eq!(result.state, TaskState::Completed);

    harness::wait_until("the tracker.result span exported", DEADLINE, || {
        let _ = provider.force_flush();
        let spans = exporter.get_finished_spans().unwrap();
        !spans_named(&spans, "tracker.result").is_empty()
            && !spans_named(&spans, "attempt").is_empty()
            && !spans_named(&spans, "delegate").is_empty()
    })
    .await
    .unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let [delegate] = spans_named(&spans, "delegate")[..] else {
        panic!("one delegate span: {spans:#?}")
    };
    let trace = delegate.span_context.trace_id();
    assert_ne!(trace, TraceId::INVALID);
    for name in ["attempt", "tracker.result"] {
        let found = spans_named(&spans, name);
        assert!(!found.is_empty(), "no {name} span");
        for span in found {
            assert_eq!(
                span.span_context.trace_id(),
                trace,
                "{name} joins the delegator's trace"
            );
            assert!(
                span.parent_span_is_remote,
                "{name} continues a remote parent"
            );
        }
    }
    system.shutdown(GRACE).await.unwrap();
    let _ = provider.shutdown();
}
