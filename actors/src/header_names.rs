//! The header names that every routed, delivered or fetched message is read for, made once.
//!
//! `HeaderMap::get` with a `&str` checks the name and copies it into a new `HeaderName` on
//! every call when it is not one of the NATS headers async-nats knows (`Content-Type` and
//! `traceparent` are not): an allocation per lookup, several per DM. A `HeaderName` made from
//! a static string copies nothing.

use async_nats::header::HeaderName;

/// [`protocol::headers::CONTENT_TYPE`].
pub(crate) const CONTENT_TYPE: HeaderName =
    HeaderName::from_static(protocol::headers::CONTENT_TYPE);
/// [`protocol::headers::TRACEPARENT`].
pub(crate) const TRACEPARENT: HeaderName = HeaderName::from_static(protocol::headers::TRACEPARENT);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_static_name_finds_what_its_string_finds() {
        let mut h = async_nats::HeaderMap::new();
        h.insert(protocol::headers::CONTENT_TYPE, "application/msgpack");
        h.insert(protocol::headers::TRACEPARENT, "00-x");
        assert_eq!(
            h.get(CONTENT_TYPE).map(|v| v.as_str()),
            Some("application/msgpack")
        );
        assert_eq!(h.get(TRACEPARENT).map(|v| v.as_str()), Some("00-x"));
    }
}
