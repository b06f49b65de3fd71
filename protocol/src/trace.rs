//! W3C trace context (`traceparent` / `tracestate` headers) without an
//! OpenTelemetry dependency.
//!
//! ```
//! use std::collections::HashMap;
//!
//! use protocol::trace::{extract, inject, TraceParent};
//!
//! let tp = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
//! assert!(tp.sampled());
//!
//! let mut headers = HashMap::new();
//! inject(&tp, Some("vendor=x"), &mut headers);
//! assert_eq!(extract(&headers), Some((tp, Some("vendor=x".to_owned()))));
//! ```

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::hash::BuildHasher;
use std::str::FromStr;

use thiserror::Error;

use crate::headers::{TRACEPARENT, TRACESTATE};

/// Length of a version `00` traceparent.
const LEN: usize = 55;

/// Why a `traceparent` value was rejected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TraceError {
    /// Too short, or longer than 55 bytes with version `00`.
    #[error("traceparent is {len} bytes long, expected {LEN}")]
    Length {
        /// The length of the value.
        len: usize,
    },
    /// A `-` is missing between the fields.
    #[error("traceparent fields are not separated by `-`")]
    Delimiter,
    /// The version is not two lowercase hex digits, or is `ff`.
    #[error("traceparent version `{version}` is not supported")]
    Version {
        /// The version field.
        version: String,
    },
    /// A field is not lowercase hex.
    #[error("traceparent {field} is not lowercase hex")]
    Hex {
        /// `trace id`, `parent id` or `flags`.
        field: &'static str,
    },
    /// The trace id is all zeros.
    #[error("traceparent trace id is all zeros")]
    ZeroTraceId,
    /// The parent id is all zeros.
    #[error("traceparent parent id is all zeros")]
    ZeroParentId,
}

/// A parsed `traceparent` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// The trace the span belongs to.
    pub trace_id: [u8; 16],
    /// The span that sent the message.
    pub parent_id: [u8; 8],
    /// Trace flags; bit 0 is "sampled".
    pub flags: u8,
}

impl TraceParent {
    /// The "sampled" trace flag.
    pub const SAMPLED: u8 = 0x01;

    /// Parses a `traceparent` header value.
    ///
    /// Version `00` must be exactly 55 bytes. A higher version (not `ff`) is
    /// parsed by its first 55 bytes, as the spec requires, if anything after
    /// them starts with `-`.
    ///
    /// # Errors
    ///
    /// Returns a [`TraceError`] naming the first problem.
    pub fn parse(value: &str) -> Result<TraceParent, TraceError> {
        let value = value.trim().as_bytes();
        if value.len() < LEN {
            return Err(TraceError::Length { len: value.len() });
        }
        let version = &value[..2];
        if !is_lower_hex(version) || version == b"ff" {
            return Err(TraceError::Version {
                version: String::from_utf8_lossy(version).into_owned(),
            });
        }
        if version == b"00" && value.len() != LEN {
            return Err(TraceError::Length { len: value.len() });
        }
        if [2, 35, 52].iter().any(|&i| value[i] != b'-')
            || value.get(LEN).is_some_and(|&b| b != b'-')
        {
            return Err(TraceError::Delimiter);
        }
        let trace_id: [u8; 16] = decode_hex(&value[3..35], "trace id")?;
        let parent_id: [u8; 8] = decode_hex(&value[36..52], "parent id")?;
        let [flags] = decode_hex(&value[53..55], "flags")?;
        if trace_id == [0; 16] {
            return Err(TraceError::ZeroTraceId);
        }
        if parent_id == [0; 8] {
            return Err(TraceError::ZeroParentId);
        }
        Ok(TraceParent {
            trace_id,
            parent_id,
            flags,
        })
    }

    /// The header value, always version `00`.
    pub fn to_header_value(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            self.trace_id_hex(),
            self.parent_id_hex(),
            self.flags
        )
    }

    /// Whether the sender sampled this trace.
    pub fn sampled(&self) -> bool {
        self.flags & Self::SAMPLED != 0
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        encode_hex(&self.trace_id)
    }

    /// The parent id as 16 lowercase hex digits.
    pub fn parent_id_hex(&self) -> String {
        encode_hex(&self.parent_id)
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_header_value())
    }
}

impl FromStr for TraceParent {
    type Err = TraceError;

    fn from_str(value: &str) -> Result<TraceParent, TraceError> {
        TraceParent::parse(value)
    }
}

/// Message headers that trace context can be read from and written to.
pub trait HeaderCarrier {
    /// The value of header `name`, if present.
    fn get_header(&self, name: &str) -> Option<String>;
    /// Sets header `name`, replacing any previous value.
    fn set_header(&mut self, name: &str, value: String);
}

/// Exact-name headers, handy in tests.
impl<S: BuildHasher> HeaderCarrier for HashMap<String, String, S> {
    fn get_header(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }

    fn set_header(&mut self, name: &str, value: String) {
        self.insert(name.to_owned(), value);
    }
}

/// Writes `traceparent` and, if given and non-empty, `tracestate`.
pub fn inject(tp: &TraceParent, tracestate: Option<&str>, carrier: &mut impl HeaderCarrier) {
    carrier.set_header(TRACEPARENT, tp.to_header_value());
    if let Some(tracestate) = tracestate.filter(|s| !s.trim().is_empty()) {
        carrier.set_header(TRACESTATE, tracestate.to_owned());
    }
}

/// Reads the trace context. `None` if `traceparent` is absent or invalid;
/// `tracestate` is only returned alongside a valid `traceparent`.
pub fn extract(carrier: &impl HeaderCarrier) -> Option<(TraceParent, Option<String>)> {
    let tp = TraceParent::parse(&carrier.get_header(TRACEPARENT)?).ok()?;
    let tracestate = carrier
        .get_header(TRACESTATE)
        .filter(|s| !s.trim().is_empty());
    Some((tp, tracestate))
}

fn is_lower_hex(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| nibble(b).is_some())
}

fn nibble(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

/// Decodes `2 * N` lowercase hex digits.
fn decode_hex<const N: usize>(hex: &[u8], field: &'static str) -> Result<[u8; N], TraceError> {
    let mut out = [0; N];
    for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        match (nibble(pair[0]), nibble(pair[1])) {
            (Some(high), Some(low)) => *byte = high << 4 | low,
            _ => return Err(TraceError::Hex { field }),
        }
    }
    Ok(out)
}

fn encode_hex(bytes: &[u8]) -> String {
    let mut hex = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_spec_example() {
        let tp = TraceParent::parse(EXAMPLE).unwrap();
        assert_eq!(tp.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(tp.parent_id_hex(), "00f067aa0ba902b7");
        assert_eq!(tp.trace_id[0], 0x4b);
        assert_eq!(tp.flags, 1);
        assert!(tp.sampled());
        assert_eq!(tp.to_header_value(), EXAMPLE);
        assert_eq!(tp.to_string(), EXAMPLE);
        assert_eq!(EXAMPLE.parse::<TraceParent>().unwrap(), tp);
        assert_eq!(TraceParent::parse(&format!(" {EXAMPLE} ")).unwrap(), tp);
        let unsampled = TraceParent::parse(&EXAMPLE.replace("-01", "-00")).unwrap();
        assert!(!unsampled.sampled());
    }

    #[test]
    fn rejects_invalid_values() {
        let cases = [
            ("", TraceError::Length { len: 0 }),
            (&EXAMPLE[..54], TraceError::Length { len: 54 }),
            (&format!("{EXAMPLE}-x"), TraceError::Length { len: 57 }),
            (
                &EXAMPLE.replacen("00", "ff", 1),
                TraceError::Version {
                    version: "ff".into(),
                },
            ),
            (
                &EXAMPLE.replacen("00", "0G", 1),
                TraceError::Version {
                    version: "0G".into(),
                },
            ),
            (
                &EXAMPLE.replace("4bf9", "4BF9"),
                TraceError::Hex { field: "trace id" },
            ),
            (
                &EXAMPLE.replace("00f0", "z0f0"),
                TraceError::Hex { field: "parent id" },
            ),
            (
                &EXAMPLE.replace("-01", "-0x"),
                TraceError::Hex { field: "flags" },
            ),
            (&EXAMPLE.replacen('-', "_", 1), TraceError::Delimiter),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                TraceError::ZeroTraceId,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                TraceError::ZeroParentId,
            ),
        ];
        for (value, expected) in cases {
            assert_eq!(TraceParent::parse(value), Err(expected), "{value:?}");
        }
        // Non-ASCII never panics on a byte boundary.
        assert!(TraceParent::parse(&"é".repeat(40)).is_err());
    }

    #[test]
    fn accepts_compatible_future_versions() {
        let future = EXAMPLE.replacen("00", "01", 1);
        let tp = TraceParent::parse(&format!("{future}-more-fields")).unwrap();
        assert_eq!(tp, TraceParent::parse(EXAMPLE).unwrap());
        assert_eq!(tp.to_header_value(), EXAMPLE);
        assert!(TraceParent::parse(&future).is_ok());
        assert_eq!(
            TraceParent::parse(&format!("{future}x")),
            Err(TraceError::Delimiter)
        );
    }

    #[test]
    fn inject_and_extract() {
        let tp = TraceParent::parse(EXAMPLE).unwrap();
        let mut headers = HashMap::new();
        inject(&tp, None, &mut headers);
        assert_eq!(headers.get(TRACEPARENT).map(String::as_str), Some(EXAMPLE));
        assert!(!headers.contains_key(TRACESTATE));
        assert_eq!(extract(&headers), Some((tp, None)));

        inject(&tp, Some("congo=t61rcWkgMzE"), &mut headers);
        assert_eq!(
            extract(&headers),
            Some((tp, Some("congo=t61rcWkgMzE".to_owned())))
        );

        headers.insert(TRACEPARENT.to_owned(), "garbage".to_owned());
        assert_eq!(extract(&headers), None);
        assert_eq!(extract(&HashMap::new()), None);
    }

    fn trace_parent() -> impl Strategy<Value = TraceParent> {
        (any::<[u8; 16]>(), any::<[u8; 8]>(), any::<u8>())
            .prop_filter("ids are non-zero", |(t, p, _)| {
                *t != [0; 16] && *p != [0; 8]
            })
            .prop_map(|(trace_id, parent_id, flags)| TraceParent {
                trace_id,
                parent_id,
                flags,
            })
    }

    proptest! {
        #[test]
        fn header_value_round_trips(tp in trace_parent(), state in proptest::option::of("[a-z]{1,8}=[a-z0-9]{1,8}")) {
            let value = tp.to_header_value();
            prop_assert_eq!(value.len(), LEN);
            prop_assert_eq!(TraceParent::parse(&value).unwrap(), tp);
            let mut headers = HashMap::new();
            inject(&tp, state.as_deref(), &mut headers);
            prop_assert_eq!(extract(&headers), Some((tp, state)));
        }

        #[test]
        fn parse_never_panics(value in ".{0,80}") {
            let _ = TraceParent::parse(&value);
        }
    }
}
