//! What the pumps share: reading an incoming NATS message into a routing view and building the
//! headers of what the router publishes.

use async_nats::HeaderMap;
use protocol::headers;
use protocol::routing::IngressView;
use protocol::Codec;

/// The headers of `msg` as (name, value) pairs, for [`IngressView`].
pub fn header_pairs(headers: Option<&HeaderMap>) -> Vec<(&str, &str)> {
    let Some(headers) = headers else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(4);
    for (name, values) in headers.iter() {
        for value in values {
            out.push((name.as_ref(), value.as_str()));
        }
    }
    out
}

/// Builds the routing view of one incoming message, at the router's clock now.
pub fn view<'a>(
    subject: &'a str,
    pairs: &'a [(&'a str, &'a str)],
    payload: &'a [u8],
    ingress_seq: u64,
    status: Option<async_nats::StatusCode>,
) -> IngressView<'a> {
    IngressView {
        subject,
        headers: pairs,
        payload,
        ingress_seq,
        status: status.map(|s| s.as_u16()),
        now_ms: protocol::expiry::now_ms(),
    }
}

/// Headers of a routed envelope: the dedupe id (stored destinations), the content type when it
/// is not JSON, and the current span's trace context (so the recipient's handler joins the
/// sender's trace through the router's span).
pub fn routed_headers(msg_id: Option<&str>, codec: Codec) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Some(id) = msg_id {
        h.insert(headers::NATS_MSG_ID, id);
    }
    if codec != Codec::Json {
        h.insert(headers::CONTENT_TYPE, codec.content_type());
    }
    crate::trace_context::inject_current(&mut h);
    h
}
