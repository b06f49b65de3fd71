//! OTLP trace export leaves the process: a DM goes from `runtime send` (service `sender`)
//! through a durable router process (`router`) to `runtime inbox` (`inbox`), each a real
//! `runtime` child process exporting to a real OTLP receiver on loopback: a gRPC
//! `TraceService` (tonic, the default protocol) or HTTP `POST /v1/traces` with a protobuf body
//! (`http/protobuf`). Assertions are on the spans the receiver decoded, never on log lines;
//! the one stderr assertion is the CLI contract for a bad `OTEL_EXPORTER_OTLP_PROTOCOL`.

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use harness::RuntimeProcess;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message as _;
use support::{count_on, js, wait_router_answers, DEADLINE};
use tonic::codegen::Service as _;

/// How long a one-shot command may take.
const ONE_SHOT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// The loopback OTLP receivers
// ---------------------------------------------------------------------------------------------

/// One span as a receiver decoded it, with the `service.name` of the process that sent it.
#[derive(Clone)]
struct GotSpan {
    service: String,
    name: String,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent_span_id: Vec<u8>,
    attributes: HashMap<String, String>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One line per span (failure messages): service, name, trace id, span id <- parent id.
impl std::fmt::Debug for GotSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{} trace {} span {} <- {} {:?}",
            self.service,
            self.name,
            hex(&self.trace_id),
            hex(&self.span_id),
            hex(&self.parent_span_id),
            self.attributes
                .get("name")
                .or(self.attributes.get("subject")),
        )
    }
}

/// Every span the receiver got, in arrival order.
#[derive(Debug, Clone, Default)]
struct Received(Arc<Mutex<Vec<GotSpan>>>);

fn string_of(kv: &KeyValue) -> String {
    match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

impl Received {
    fn record(&self, request: ExportTraceServiceRequest) {
        let mut got = self.0.lock().unwrap();
        for resource_spans in request.resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .map(string_of)
                .unwrap_or_default();
            for scope_spans in resource_spans.scope_spans {
                for span in scope_spans.spans {
                    got.push(GotSpan {
                        service: service.clone(),
                        name: span.name,
                        trace_id: span.trace_id,
                        span_id: span.span_id,
                        parent_span_id: span.parent_span_id,
                        attributes: span
                            .attributes
                            .iter()
                            .map(|kv| (kv.key.clone(), string_of(kv)))
                            .collect(),
                    });
                }
            }
        }
    }

    fn spans(&self) -> Vec<GotSpan> {
        self.0.lock().unwrap().clone()
    }

    /// The spans named `name` that `service` exported.
    fn named(&self, service: &str, name: &str) -> Vec<GotSpan> {
        self.spans()
            .into_iter()
            .filter(|s| s.service == service && s.name == name)
            .collect()
    }
}

/// The gRPC side: the generated `TraceService` server, storing each request.
struct GrpcCollector(Received);

#[tonic::async_trait]
impl TraceService for GrpcCollector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.record(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A running receiver: its address (on 127.0.0.1, a free port) and what it got. The accept
/// loop is aborted on drop.
struct Receiver {
    addr: SocketAddr,
    received: Received,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Receiver {
    /// The value of `OTEL_EXPORTER_OTLP_ENDPOINT` that points at this receiver.
    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// An OTLP/gRPC receiver (HTTP/2 with prior knowledge, as tonic's client speaks it).
    async fn grpc() -> Receiver {
        let received = Received::default();
        let service = TraceServiceServer::new(GrpcCollector(received.clone()));
        Self::serve(received, move |io| {
            let service = service.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let mut service = service.clone();
                    async move { service.call(req).await }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(io, svc)
                    .await;
            });
        })
        .await
    }

    /// An OTLP/HTTP receiver: `POST /v1/traces` with an `application/x-protobuf` body.
    async fn http() -> Receiver {
        let received = Received::default();
        let sink = received.clone();
        Self::serve(received, move |io| {
            let sink = sink.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let sink = sink.clone();
                    async move { Ok::<_, hyper::Error>(http_export(&sink, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await;
            });
        })
        .await
    }

    async fn serve(
        received: Received,
        connection: impl Fn(TokioIo<tokio::net::TcpStream>) + Send + 'static,
    ) -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                connection(TokioIo::new(stream));
            }
        });
        Receiver {
            addr,
            received,
            accept,
        }
    }
}

/// One OTLP/HTTP request: decodes an `ExportTraceServiceRequest` from `POST /v1/traces`.
async fn http_export(sink: &Received, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: Vec<u8>| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/x-protobuf"),
        );
        response
    };
    if req.method() != hyper::Method::POST || req.uri().path() != "/v1/traces" {
        return reply(StatusCode::NOT_FOUND, Vec::new());
    }
    let Ok(body) = req.into_body().collect().await else {
        return reply(StatusCode::BAD_REQUEST, Vec::new());
    };
    match ExportTraceServiceRequest::decode(body.to_bytes()) {
        Ok(request) => {
            sink.record(request);
            reply(
                StatusCode::OK,
                ExportTraceServiceResponse::default().encode_to_vec(),
            )
        }
        Err(_) => reply(StatusCode::BAD_REQUEST, Vec::new()),
    }
}

// ---------------------------------------------------------------------------------------------
// The three processes
// ---------------------------------------------------------------------------------------------

/// The OTLP variables a test does not mean to inherit from its own environment, blanked (the
/// exporter and `runtime::telemetry` read a blank value as unset); `extra` sets them again.
const BLANKED: [(&str, &str); 3] = [
    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", ""),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", ""),
    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", ""),
];

/// The environment of one process: the receiver's endpoint, its service name, and `extra`
/// (the protocol variables), which win over [`BLANKED`].
fn otel_env<'a>(
    endpoint: &'a str,
    service: &'a str,
    extra: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut env = BLANKED.to_vec();
    env.extend([
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ("OTEL_SERVICE_NAME", service),
        // Quiet logs, as operators run one-shot commands: export must not depend on them.
        ("RUST_LOG", "warn"),
    ]);
    env.extend_from_slice(extra);
    env
}

/// Waits for a one-shot `runtime` process to exit 0.
async fn exits_cleanly(process: &mut RuntimeProcess, what: &str) {
    let code = process.wait_exit(ONE_SHOT).await;
    assert!(
        matches!(code, Ok(Some(0))),
        "{what} exited with {code:?}; output:\n{}",
        process.log()
    );
}

/// The span chain of one DM: alice's `send` (process `sender`) → the router's `route`
/// (process `router`) → bob's `inbox.handle` (process `inbox`).
struct Chain {
    send: GotSpan,
    route: GotSpan,
    handle: GotSpan,
}

/// Sends DM `id` from alice to bob through three `runtime` processes that export to
/// `receiver`, with the extra environment of each (`[sender, router, inbox]`), and returns the
/// chain of spans the receiver got.
async fn dm_through_three_processes(
    receiver: &Receiver,
    id: &str,
    extra: [&[(&str, &str)]; 3],
) -> Chain {
    let endpoint = receiver.endpoint();
    let got = &receiver.received;
    let server = harness::run_server().await.unwrap();
    let url = server.url();

    let mut router = RuntimeProcess::spawn(
        ["start", "--role", "router", "--durable", "--nats-url", &url],
        &otel_env(&endpoint, "router", extra[1]),
    )
    .unwrap();
    let watcher = server.client().await.unwrap();
    wait_router_answers(&watcher).await;

    let mut sender = RuntimeProcess::spawn(
        [
            "send",
            "--as",
            "alice",
            "--to",
            "bob",
            "--id",
            id,
            "--nats-url",
            &url,
            "hi",
        ],
        &otel_env(&endpoint, "sender", extra[0]),
    )
    .unwrap();
    exits_cleanly(&mut sender, "runtime send").await;
    // A one-shot command flushes its spans before it exits: they are already here.
    assert!(
        !got.named("sender", "send").is_empty(),
        "the sender's send span arrived before it exited; got {:#?}",
        got.spans()
    );

    // The router stores the DM in bob's inbox; then a one-shot inbox takes it.
    let js = js(&server).await;
    let bob_inbox = protocol::subjects::inbox(&protocol::AgentId::new("bob").unwrap());
    harness::wait_until_async("the DM stored in bob's inbox", DEADLINE, || async {
        count_on(&js, "HUB_INBOX", &bob_inbox).await == 1
    })
    .await
    .unwrap();
    let mut inbox = RuntimeProcess::spawn(
        [
            "inbox",
            "--as",
            "bob",
            "--idle-secs",
            "1",
            "--nats-url",
            &url,
        ],
        &otel_env(&endpoint, "inbox", extra[2]),
    )
    .unwrap();
    exits_cleanly(&mut inbox, "runtime inbox").await;
    assert!(
        !got.named("inbox", "inbox.handle").is_empty(),
        "the inbox's spans arrived before it exited; got {:#?}",
        got.spans()
    );

    // A router flushes on a graceful shutdown.
    let code = router.terminate(DEADLINE).await;
    assert!(
        matches!(code, Ok(Some(0))),
        "router exited with {code:?}; output:\n{}",
        router.log()
    );
    harness::wait_until("the router's route span", DEADLINE, || {
        !got.named("router", "route").is_empty()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; got {:#?}", got.spans()));

    let one = |service: &str, name: &str| {
        let spans = got.named(service, name);
        match &spans[..] {
            [span] => span.clone(),
            _ => panic!(
                "one {name} span from {service}, got {spans:#?}; all: {:#?}",
                got.spans()
            ),
        }
    };
    Chain {
        send: one("sender", "send"),
        route: one("router", "route"),
        handle: one("inbox", "inbox.handle"),
    }
}

/// The real chain: one trace, `send` its root, `route` its child, `inbox.handle` the
/// route's child, and every span of that trace from one of the three services.
fn assert_one_trace_across_three_services(receiver: &Receiver, chain: &Chain, id: &str) {
    let Chain {
        send,
        route,
        handle,
    } = chain;
    assert_eq!(send.trace_id.len(), 16, "a valid trace id: {send:?}");
    assert!(send.trace_id.iter().any(|b| *b != 0), "{send:?}");
    assert!(
        send.parent_span_id.is_empty(),
        "send is the trace's root: {send:?}"
    );
    assert_eq!(
        route.trace_id, send.trace_id,
        "route joins the sender's trace"
    );
    assert_eq!(
        route.parent_span_id, send.span_id,
        "the router's route span is a child of the sender's send span"
    );
    assert_eq!(handle.trace_id, send.trace_id, "the inbox joins the trace");
    assert_eq!(
        handle.parent_span_id, route.span_id,
        "the inbox's handler span is a child of the router's route span"
    );
    assert_eq!(
        route.attributes.get("subject").map(String::as_str),
        Some("hub.pub.alice.inbox")
    );
    assert_eq!(send.attributes.get("id").map(String::as_str), Some(id));
    assert_eq!(send.attributes.get("to").map(String::as_str), Some("bob"));
    assert_eq!(handle.attributes.get("id").map(String::as_str), Some(id));
    assert_eq!(
        handle.attributes.get("inbox").map(String::as_str),
        Some("bob")
    );

    let in_trace: Vec<GotSpan> = receiver
        .received
        .spans()
        .into_iter()
        .filter(|s| s.trace_id == send.trace_id)
        .collect();
    let mut services: Vec<&str> = in_trace.iter().map(|s| s.service.as_str()).collect();
    services.sort_unstable();
    services.dedup();
    assert_eq!(
        services,
        ["inbox", "router", "sender"],
        "the trace has spans of exactly the three processes: {in_trace:#?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// The default protocol (grpc): one trace across the sender, router and inbox processes.
#[tokio::test]
async fn a_dm_is_one_trace_across_three_processes_exported_over_otlp_grpc() {
    let receiver = Receiver::grpc().await;
    let id = "otlp-grpc-1";
    let chain = dm_through_three_processes(&receiver, id, [&[], &[], &[]]).await;
    assert_one_trace_across_three_services(&receiver, &chain, id);
}

/// `http/protobuf`, from the generic variable, the traces-specific one, and the
/// traces-specific one overriding a generic `grpc`: the HTTP receiver (which speaks no gRPC)
/// gets the whole trace.
#[tokio::test]
async fn a_dm_is_one_trace_across_three_processes_exported_over_otlp_http_protobuf() {
    let receiver = Receiver::http().await;
    let id = "otlp-http-1";
    let chain = dm_through_three_processes(
        &receiver,
        id,
        [
            &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")],
            &[("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")],
            &[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
            ],
        ],
    )
    .await;
    assert_one_trace_across_three_services(&receiver, &chain, id);
}

/// An unknown or unsupported protocol is a one-line configuration error at start (exit 64)
/// naming the variable and the value, not a panic.
#[tokio::test]
async fn an_unknown_otlp_protocol_is_a_one_line_usage_error() {
    for (var, value) in [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
    ] {
        let mut process = RuntimeProcess::spawn(
            [
                "send",
                "--as",
                "alice",
                "--to",
                "bob",
                "--nats-url",
                "nats://127.0.0.1:1",
                "hi",
            ],
            &otel_env("http://127.0.0.1:1", "sender", &[(var, value)]),
        )
        .unwrap();
        let code = process.wait_exit(ONE_SHOT).await.unwrap();
        let log = process.log();
        assert_eq!(code, Some(64), "{var}={value}: {log}");
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 1, "one line on stderr: {log}");
        assert!(
            lines[0].contains(var) && lines[0].contains(value),
            "the line names {var} and {value:?}: {log}"
        );
        assert!(!log.contains("panicked"), "{log}");
    }
}
