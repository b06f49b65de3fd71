//! A JetStream store ack: the broker's reply to a publish on a stream's subject, read as the
//! router needs it.
//!
//! The broker answers `{"stream":"HUB_INBOX","seq":17}` (with `"duplicate":true` when the
//! `Nats-Msg-Id` was already stored within the window, and `"domain"` or other fields it may
//! add), or `{"error":{"code":503,"err_code":10077,"description":"..."}}`. async-nats reads
//! the same reply as an untagged enum, which first copies the whole of it into a buffer of
//! owned values: that was most of the CPU a store ack cost the router. This reads it in one
//! pass, borrowing its strings, and reads what async-nats reads of any reply the broker sends
//! (proved against it in `actors::router::store_acks`). Of a malformed reply, which the broker
//! does not send, it may read less: an `error` of the wrong shape beside a valid sequence, or a
//! valid `error` beside a `stream` of the wrong type, is unreadable here (the store is then
//! retried), and it does not check the types of fields it does not read (`domain`, `val`).

use std::borrow::Cow;

use serde::Deserialize;

/// What a store ack says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreAck {
    /// Stored at `seq`; `duplicate`: an earlier publish with the same `Nats-Msg-Id` was stored
    /// within the duplicate window, and `seq` is that one's.
    Stored {
        /// The stored message's stream sequence.
        seq: u64,
        /// Whether the broker found it a duplicate.
        duplicate: bool,
    },
    /// The broker refused the store.
    Refused {
        /// The status code (`503`, `400`, ...).
        code: u64,
        /// The JetStream error code (`10077`, ...; 0 when absent).
        err_code: u64,
        /// What the broker says is wrong (`None` when it says nothing).
        description: Option<String>,
    },
}

/// A reply that is no store ack.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unreadable store ack: {reason}")]
pub struct StoreAckError {
    /// What is wrong with it.
    pub reason: String,
}

#[derive(Deserialize)]
struct Reply<'a> {
    #[serde(borrow, default)]
    error: Option<ApiError<'a>>,
    #[serde(borrow, default)]
    stream: Option<Cow<'a, str>>,
    #[serde(default)]
    seq: Option<u64>,
    #[serde(default)]
    duplicate: bool,
}

#[derive(Deserialize)]
struct ApiError<'a> {
    code: u64,
    #[serde(default)]
    err_code: u64,
    #[serde(borrow, default)]
    description: Option<Cow<'a, str>>,
}

/// Reads the store ack `payload`.
///
/// # Errors
/// [`StoreAckError`] when it is not JSON, or names neither an error nor a stream and its
/// sequence.
pub fn parse_store_ack(payload: &[u8]) -> Result<StoreAck, StoreAckError> {
    let reply: Reply<'_> = serde_json::from_slice(payload).map_err(|e| StoreAckError {
        reason: e.to_string(),
    })?;
    if let Some(error) = reply.error {
        return Ok(StoreAck::Refused {
            code: error.code,
            err_code: error.err_code,
            description: error.description.map(Cow::into_owned),
        });
    }
    match (reply.stream, reply.seq) {
        (Some(_), Some(seq)) => Ok(StoreAck::Stored {
            seq,
            duplicate: reply.duplicate,
        }),
        _ => Err(StoreAckError {
            reason: "neither an error nor a stream and a sequence".to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_message_reads_its_sequence_and_duplicate_flag() {
        assert_eq!(
            parse_store_ack(br#"{"stream":"HUB_INBOX","seq":17}"#),
            Ok(StoreAck::Stored {
                seq: 17,
                duplicate: false
            })
        );
        assert_eq!(
            parse_store_ack(br#"{"stream":"HUB_INBOX","domain":"hub","seq":3,"duplicate":true}"#),
            Ok(StoreAck::Stored {
                seq: 3,
                duplicate: true
            })
        );
    }

    #[test]
    fn a_refusal_reads_its_codes_and_description() {
        let ack = br#"{"error":{"code":503,"err_code":10077,"description":"maximum messages per subject exceeded"}}"#;
        assert_eq!(
            parse_store_ack(ack),
            Ok(StoreAck::Refused {
                code: 503,
                err_code: 10077,
                description: Some("maximum messages per subject exceeded".to_owned())
            })
        );
        // An escaped description is read whole.
        assert_eq!(
            parse_store_ack(br#"{"error":{"code":400,"description":"a \"b\""}}"#),
            Ok(StoreAck::Refused {
                code: 400,
                err_code: 0,
                description: Some("a \"b\"".to_owned())
            })
        );
    }

    #[test]
    fn anything_else_is_an_error() {
        for bad in [
            &b""[..],
            b"not json",
            b"{}",
            br#"{"seq":1}"#,
            br#"{"stream":"S"}"#,
            br#"{"stream":"S","seq":-1}"#,
            br#"{"stream":"S","seq":1,"duplicate":"yes"}"#,
            br#"{"stream":"S","seq":1} trailing"#,
        ] {
            assert!(
                parse_store_ack(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
