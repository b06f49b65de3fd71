//! What a running hub says of itself over NATS (`runtime status`): the router's snapshot and
//! every worker's.

use std::time::Duration;

use actors::router::RouterSnapshot;
use protocol::subjects;

use super::SystemError;

/// Asks every running worker for its snapshot over NATS (`runtime status`): one request on
/// [`subjects::WORKER_STATUS_SUBJECT`], each worker's answer on a subject of its own under the
/// request's reply ([`subjects::worker_status_answer`]), collected for `window` (there is no
/// knowing how many workers run), sorted by worker id.
///
/// # Errors
/// [`SystemError::Request`] when the request cannot be sent.
pub async fn request_worker_status(
    client: &async_nats::Client,
    window: Duration,
) -> Result<Vec<actors::worker::WorkerSnapshot>, SystemError> {
    use futures::StreamExt;
    let subject = subjects::WORKER_STATUS_SUBJECT;
    // Each worker answers on `<reply>.<worker>` (`subjects::worker_status_answer`).
    let token = client.new_inbox();
    let token = token.rsplit('.').next().unwrap_or(&token);
    let reply = subjects::worker_status_reply(token);
    let mut replies = client
        .subscribe(format!("{reply}.*"))
        .await
        .map_err(|e| SystemError::request(subject, e))?;
    client
        .publish_with_reply(subject, reply, Vec::new().into())
        .await
        .map_err(|e| SystemError::request(subject, e))?;
    let mut workers = Vec::new();
    let deadline = tokio::time::Instant::now() + window;
    while let Ok(Some(msg)) = tokio::time::timeout_at(deadline, replies.next()).await {
        if let Ok(snapshot) = serde_json::from_slice(&msg.payload) {
            workers.push(snapshot);
        }
    }
    workers.sort_by(|a: &actors::worker::WorkerSnapshot, b| a.worker_id.cmp(&b.worker_id));
    Ok(workers)
}

/// Asks a running router for its snapshot over NATS (`runtime status`).
///
/// # Errors
/// [`SystemError::NoRouter`] when no router listens, [`SystemError::Timeout`] when none answers
/// in time, [`SystemError::Request`] for other failures.
pub async fn request_status(
    client: &async_nats::Client,
    timeout: Duration,
) -> Result<RouterSnapshot, SystemError> {
    use async_nats::RequestErrorKind;
    let request = client.request(subjects::STATUS_SUBJECT, Vec::new().into());
    let reply = match tokio::time::timeout(timeout, request).await {
        Err(_) => {
            return Err(SystemError::Timeout {
                what: "a router to answer the status request".into(),
            })
        }
        Ok(Err(e)) if e.kind() == RequestErrorKind::NoResponders => {
            return Err(SystemError::NoRouter {
                subject: subjects::STATUS_SUBJECT,
            })
        }
        Ok(Err(e)) => return Err(SystemError::request(subjects::STATUS_SUBJECT, e)),
        Ok(Ok(reply)) => reply,
    };
    serde_json::from_slice(&reply.payload)
        .map_err(|e| SystemError::request(subjects::STATUS_SUBJECT, e))
}
