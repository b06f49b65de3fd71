//! Reads of a consumer's state that tests and the chaos program make: its info through a fresh,
//! bounded request, and whether consumers have settled.

use std::time::Duration;

use async_nats::jetstream;

/// How long one read may take.
const READ: Duration = Duration::from_secs(2);

/// Consumer `consumer` of `stream`'s info, read through a fresh request (none cached), bounded
/// in time; `None` when it cannot be read (no such stream or consumer, no leader, no answer).
pub async fn consumer_info(
    js: &jetstream::Context,
    stream: &str,
    consumer: &str,
) -> Option<jetstream::consumer::Info> {
    let read = async {
        js.get_stream(stream)
            .await
            .ok()?
            .consumer_info(consumer)
            .await
            .ok()
    };
    tokio::time::timeout(READ, read).await.ok().flatten()
}

/// Whether every one of `consumers` of `stream` has nothing pending and nothing unacknowledged
/// (so a copy redelivered later cannot come any more); false when one cannot be read.
pub async fn consumers_settled(
    js: &jetstream::Context,
    stream: &str,
    consumers: &[String],
) -> bool {
    for consumer in consumers {
        match consumer_info(js, stream, consumer).await {
            Some(i) if i.num_pending == 0 && i.num_ack_pending == 0 => {}
            _ => return false,
        }
    }
    true
}
