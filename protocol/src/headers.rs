//! Names of the NATS message headers the hub reads and writes.

/// JetStream publish dedupe id.
pub const NATS_MSG_ID: &str = "Nats-Msg-Id";
/// `text` as one header-safe line: control characters (newlines among them) replaced by
/// spaces, trimmed, cut to at most `max` bytes (on a character boundary).
pub fn one_line(text: &str, max: usize) -> String {
    let mut line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_owned();
    if line.len() > max {
        let mut end = max;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        line.truncate(end);
    }
    line
}

/// A dead letter's original subject (`channel.inbox.<to>`).
pub const DLQ_ORIGINAL_SUBJECT: &str = "Hub-Original-Subject";
/// A dead letter's sequence in the inbox stream.
pub const DLQ_ORIGINAL_SEQ: &str = "Hub-Original-Seq";
/// Why a DM was dead-lettered: `max_deliver`, or `rejected: <the handler's reason>`.
pub const DLQ_REASON: &str = "Hub-Reason";
/// How many times the DM was delivered before it was dead-lettered.
pub const DLQ_DELIVERIES: &str = "Hub-Deliveries";
/// Per-message TTL of a stored message, in seconds (nats-server 2.11+, on streams that allow
/// it): the broker removes the message when it runs out.
pub const NATS_TTL: &str = "Nats-TTL";
/// What a KV message did to its key (`DEL`, `PURGE`; absent: a put).
pub const KV_OPERATION: &str = "KV-Operation";
/// Why the broker wrote a marker (a key removed or aged out).
pub const NATS_MARKER_REASON: &str = "Nats-Marker-Reason";
/// W3C trace context: the parent span.
pub const TRACEPARENT: &str = "traceparent";
/// W3C trace context: vendor state.
pub const TRACESTATE: &str = "tracestate";
/// Codec of the payload; absent means JSON.
pub const CONTENT_TYPE: &str = "Content-Type";
/// [`CONTENT_TYPE`] value of a JSON envelope.
pub const CONTENT_TYPE_JSON: &str = "application/json";
/// [`CONTENT_TYPE`] value of a MessagePack envelope.
pub const CONTENT_TYPE_MSGPACK: &str = "application/msgpack";

/// Set by JetStream on a message read back by a direct or message get.
pub const NATS_STREAM: &str = "Nats-Stream";
/// Set by JetStream on a message read back by a direct or message get.
pub const NATS_SEQUENCE: &str = "Nats-Sequence";
/// Set by JetStream on a message read back by a direct or message get.
pub const NATS_SUBJECT: &str = "Nats-Subject";
/// Set by JetStream on a message read back by a direct or message get.
pub const NATS_TIME_STAMP: &str = "Nats-Time-Stamp";
/// Set by JetStream on a message read back by a direct get.
pub const NATS_LAST_SEQUENCE: &str = "Nats-Last-Sequence";

/// Headers that mark a replayed stored message. The router's replay guard
/// drops any ingress message carrying one of them.
pub const REPLAY_HEADERS: [&str; 5] = [
    NATS_STREAM,
    NATS_SEQUENCE,
    NATS_SUBJECT,
    NATS_TIME_STAMP,
    NATS_LAST_SEQUENCE,
];

/// Headers nats-server sets on the status messages that end a JetStream pull (`408 Request
/// Timeout`, `409`): no client sends them, so an ingress message carrying one is a pull's
/// status aimed at an ingress subject (its reply subject is not permission-checked).
pub const PULL_STATUS_HEADERS: [&str; 2] = ["Nats-Pending-Messages", "Nats-Pending-Bytes"];

/// Whether `name` is one of the [`PULL_STATUS_HEADERS`] (case-insensitive).
pub fn is_pull_status_header(name: &str) -> bool {
    PULL_STATUS_HEADERS
        .iter()
        .any(|h| h.eq_ignore_ascii_case(name))
}

/// On a task input: read the task channel before running it, it may have run before. Set by
/// the router on the work stream copy (`protocol::task::router_flags`), and by a sender on a
/// retry of a publish whose outcome it never learned (the router carries it over). Its value
/// is ignored; it can only make a worker more careful.
pub const HUB_CHECK: &str = "Hub-Check";

/// Makes a JetStream publish fail unless it lands in the named stream.
pub const NATS_EXPECTED_STREAM: &str = "Nats-Expected-Stream";

/// Whether `name` is one of the [`REPLAY_HEADERS`], compared
/// case-insensitively like HTTP-style header names.
pub fn is_replay_header(name: &str) -> bool {
    REPLAY_HEADERS
        .iter()
        .any(|replay| replay.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_headers_are_the_five_get_headers() {
        assert_eq!(
            REPLAY_HEADERS,
            [
                "Nats-Stream",
                "Nats-Sequence",
                "Nats-Subject",
                "Nats-Time-Stamp",
                "Nats-Last-Sequence"
            ]
        );
        assert!(is_replay_header("nats-sequence"));
        assert!(is_replay_header(NATS_LAST_SEQUENCE));
        assert!(!is_replay_header(NATS_MSG_ID));
        assert!(!is_replay_header(NATS_EXPECTED_STREAM));
    }
}
