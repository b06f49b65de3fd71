//! Decoding a stored message's envelope with the one rule of every reader: the codec named by
//! its `Content-Type` header ([`protocol::decode_with_content_type`]).

use async_nats::HeaderMap;
use protocol::{Envelope, EnvelopeError};

/// The envelope of a message with `headers` and `payload`.
///
/// # Errors
/// [`EnvelopeError`] for an unknown content type or a body that does not decode.
pub(crate) fn envelope(
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<Envelope, EnvelopeError> {
    let content_type = headers
        .and_then(|h| h.get(crate::header_names::CONTENT_TYPE))
        .map(|v| v.as_str());
    protocol::decode_with_content_type(payload, content_type)
}
