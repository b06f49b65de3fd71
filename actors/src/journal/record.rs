//! Log records and their line encoding.
//!
//! Each record is one line: `<crc32 of the JSON as 8 lowercase hex digits> <JSON>\n`. The
//! checksum detects a torn or damaged line; a line without its trailing newline is incomplete.
//!
//! A record names its attempt by input sequence and task id (`tid`): the work stream's
//! sequences start over when it is recreated, so a sequence alone may name two attempts. A
//! record of an earlier version has no `tid` and names the one open attempt of its sequence.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::CorruptLine;

/// One entry of the append-only log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub(crate) enum Record {
    /// The input message `seq` was admitted as attempt `attempt_id` of task `task_id`,
    /// delegated by `from` (the router's stamp on the input; absent in earlier versions).
    Admitted {
        seq: u64,
        task_id: String,
        attempt_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<String>,
    },
    /// The attempt produced `result` (latest boundary result; replaces an earlier one).
    Result {
        seq: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tid: Option<String>,
        result: Value,
    },
    /// An answer was accepted for the attempt (before resuming it).
    Answer {
        seq: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tid: Option<String>,
        message_id: String,
        payload: Value,
    },
    /// Written by earlier versions when the broker confirmed the current result; read and
    /// ignored (nothing decided on it).
    Published {
        seq: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tid: Option<String>,
    },
    /// The attempt waits for an answer with its input acked: the task it runs, kept so that
    /// an answer can resume it after the input is gone from the stream.
    Parked {
        seq: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tid: Option<String>,
        task: Value,
    },
    /// The input was acknowledged; the attempt is finished and can be compacted away.
    Done {
        seq: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tid: Option<String>,
    },
}

/// Encodes a record as one log line, including the trailing newline.
pub(crate) fn encode(record: &Record) -> Vec<u8> {
    // Serializing these plain types cannot fail (string keys, no non-finite floats in Values).
    let json = serde_json::to_vec(record).expect("journal record serializes");
    let mut line = format!("{:08x} ", crc32(&json)).into_bytes();
    line.extend_from_slice(&json);
    line.push(b'\n');
    line
}

/// Decodes one log line (without its newline).
pub(crate) fn decode(line: &[u8]) -> Result<Record, CorruptLine> {
    if line.len() < 10 || line[8] != b' ' {
        return Err(CorruptLine::MissingChecksum);
    }
    let crc_text = std::str::from_utf8(&line[..8]).map_err(|_| CorruptLine::BadChecksum)?;
    let expected = u32::from_str_radix(crc_text, 16).map_err(|_| CorruptLine::BadChecksum)?;
    let json = &line[9..];
    let actual = crc32(json);
    if actual != expected {
        return Err(CorruptLine::ChecksumMismatch { expected, actual });
    }
    serde_json::from_slice(json).map_err(CorruptLine::InvalidRecord)
}

const CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// CRC-32 (IEEE 802.3, as used by zlib and gzip).
pub(crate) fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c = CRC_TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_reference_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn records_round_trip_and_damage_is_detected() {
        let record = Record::Answer {
            seq: 7,
            tid: Some("t-7".into()),
            message_id: "m-1".into(),
            payload: serde_json::json!({"text": "yes"}),
        };
        let line = encode(&record);
        assert_eq!(*line.last().unwrap(), b'\n');
        let body = &line[..line.len() - 1];
        assert!(std::str::from_utf8(body)
            .unwrap()
            .contains(r#""kind":"answer""#));
        assert_eq!(decode(body).unwrap(), record);
        let mut damaged = body.to_vec();
        let last = damaged.len() - 2;
        damaged[last] ^= 0x01;
        assert!(decode(&damaged).is_err());
        assert!(decode(&body[..body.len() - 3]).is_err());
        assert!(decode(b"garbage").is_err());
    }
}
