//! A pulled JetStream message's ack subject, which says where it comes from and how often it
//! was delivered: `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.
//! <stored ns>.<pending>` (9 tokens), or nats-server's v2 form, which puts
//! `<domain>.<account hash>` after `$JS.ACK` and may end with a random token (11 tokens or
//! more; ADR-15: tokens past the known ones are ignored).

/// What a pulled message's ack subject says of its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckInfo {
    /// How many times it was delivered, this delivery included.
    pub delivered: u64,
    /// Its sequence in the stream.
    pub stream_seq: u64,
    /// Its sequence in the consumer.
    pub consumer_seq: u64,
    /// When the stream stored it, unix nanoseconds.
    pub stored_ns: i64,
    /// How many messages of the consumer were pending after it.
    pub pending: u64,
}

/// The tokens of `ack` after `$JS.ACK.` from the stream on: (stream, consumer, the five
/// numbers), in either form; `None` for a subject of another shape.
fn tokens(ack: &str) -> Option<[&str; 7]> {
    let rest = ack.strip_prefix("$JS.ACK.")?;
    let mut split = rest.split('.');
    let mut first = [""; 9];
    let mut n = 0;
    for slot in &mut first {
        match split.next() {
            Some(token) => {
                *slot = token;
                n += 1;
            }
            None => break,
        }
    }
    let skip = match (n, split.next().is_some()) {
        (7, _) => 0,
        (9, _) => 2,
        _ => return None,
    };
    let mut out = [""; 7];
    out.copy_from_slice(&first[skip..skip + 7]);
    Some(out)
}

/// The consumer a JetStream message's ack subject names (either form). A pulled message comes
/// on its own subject, not on the pull's reply subject: this is how it is told apart.
pub fn parse_ack_consumer(ack: &str) -> Option<&str> {
    tokens(ack).map(|t| t[1]).filter(|c| !c.is_empty())
}

/// What the ack subject `ack` says of the delivery (either form); `None` for a subject of
/// another shape, or one whose numbers do not parse. Read once per pulled message, without
/// allocating.
pub fn parse_ack_info(ack: &str) -> Option<AckInfo> {
    let t = tokens(ack)?;
    Some(AckInfo {
        delivered: t[2].parse().ok()?,
        stream_seq: t[3].parse().ok()?,
        consumer_seq: t[4].parse().ok()?,
        stored_ns: t[5].parse().ok()?,
        pending: t[6].parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn either_form_of_an_ack_subject_reads_the_same() {
        let want = AckInfo {
            delivered: 2,
            stream_seq: 17,
            consumer_seq: 9,
            stored_ns: 1_700_000_000_000_000_000,
            pending: 4,
        };
        for ack in [
            "$JS.ACK.HUB_INBOX.inbox-bob.2.17.9.1700000000000000000.4",
            "$JS.ACK.hub.ABCDEF.HUB_INBOX.inbox-bob.2.17.9.1700000000000000000.4",
            "$JS.ACK.hub.ABCDEF.HUB_INBOX.inbox-bob.2.17.9.1700000000000000000.4.tok",
            "$JS.ACK.hub.ABCDEF.HUB_INBOX.inbox-bob.2.17.9.1700000000000000000.4.tok.more",
        ] {
            assert_eq!(parse_ack_info(ack), Some(want), "{ack}");
            assert_eq!(parse_ack_consumer(ack), Some("inbox-bob"), "{ack}");
        }
    }

    #[test]
    fn any_other_shape_reads_as_nothing() {
        for ack in [
            "$JS.ACK.HUB_INBOX.inbox-bob.1.2",
            "$JS.ACK.HUB_INBOX.inbox-bob.1.2.3.4",
            "$JS.ACK.x.HUB_INBOX.inbox-bob.1.2.3.4.5",
            "$JS.ACK.HUB_INBOX.inbox-bob.1.2.x.4.5",
            "$JS.ACK.HUB_INBOX.inbox-bob.-1.2.3.4.5",
            "_INBOX.x.inbox-bob.1",
            "$JS.ACK.",
        ] {
            assert_eq!(parse_ack_info(ack), None, "{ack}");
        }
        assert_eq!(parse_ack_consumer("$JS.ACK.HUB_INBOX..1.2.3.4.5"), None);
    }
}
