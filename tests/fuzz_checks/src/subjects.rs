//! Subject, consumer-name and message-id parsers (`protocol::subjects`), against the builders
//! of the same module.

use protocol::ids::{AgentId, WorkerId};
use protocol::subjects::{self, Channel, ControlKind};

/// A string read by every parser of `protocol::subjects` (the ingress, stored, control, join,
/// attach and reply subjects, the consumer names, the router's message ids, the ack subjects
/// of pulled messages).
///
/// Asserts that whatever a parser takes, the builder of the same module builds back from what
/// it read, byte for byte; that the ingress parsers (plain, work, answer) never take the same
/// subject; that a broadcast subject is never an inbox's or a task's; that an ack subject reads
/// as its tokens say (7 after `$JS.ACK.`, or 9 and more with the domain and account hash
/// first), and that what it says rebuilds into an ack subject that reads the same; that a pull
/// reply rebuilds from its parts; and that an ingress message id keeps its logical id and seal.
pub fn check_subjects(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let s: &str = &text;
    ingress(s);
    stored(s);
    work(s);
    ack(s);
    replies(s, data);
}

fn ingress(s: &str) {
    let plain = subjects::parse_ingress(s);
    let work = subjects::parse_work_ingress(s);
    let answer = subjects::parse_answer_ingress(s);
    assert_eq!(subjects::is_ingress_subject(s), plain.is_ok());
    if let Ok((from, channel)) = &plain {
        assert_eq!(subjects::ingress(from, channel), s);
        if let Channel::Task(task) = channel {
            assert_eq!(subjects::parse_task(&task.subject()).as_ref(), Ok(task));
        }
        assert_eq!(
            channel.is_stored(),
            !matches!(channel, Channel::Broadcast(_))
        );
    }
    if let Ok(Some((from, queue, worker))) = &work {
        assert_eq!(subjects::work_ingress(from, queue, worker.as_ref()), s);
    }
    if let Ok(Some((from, worker))) = &answer {
        assert_eq!(subjects::answer_ingress(from, worker), s);
    }
    let taken = [
        plain.is_ok(),
        matches!(work, Ok(Some(_))),
        matches!(answer, Ok(Some(_))),
    ];
    assert!(
        taken.iter().filter(|t| **t).count() <= 1,
        "{s:?} is taken by several ingress parsers: {taken:?}"
    );
}

fn stored(s: &str) {
    if let Ok(id) = subjects::parse_inbox(s) {
        assert_eq!(subjects::inbox(&id), s);
        assert!(subjects::is_inbox(s));
    }
    if let Ok(task) = subjects::parse_task(s) {
        assert_eq!(subjects::task(&task), s);
        assert_eq!(task.subject(), s);
    }
    if let Ok(name) = subjects::parse_broadcast(s) {
        assert_eq!(subjects::broadcast(&name), s);
        assert!(
            subjects::parse_inbox(s).is_err() && subjects::parse_task(s).is_err(),
            "{s:?} is a broadcast and a stored channel"
        );
    }
    if let Ok(id) = subjects::parse_task_read_request(s) {
        assert_eq!(subjects::task_read_request(&id), s);
    }
    if let Ok(id) = subjects::parse_attach_request(s) {
        assert_eq!(subjects::attach_request(&id), s);
    }
    if let Ok(id) = subjects::parse_inbox_consumer(s) {
        assert_eq!(subjects::inbox_consumer(&id), s);
    }
    if let Ok((from, id)) = subjects::parse_router_msg_id(s) {
        assert_eq!(subjects::router_msg_id(&from, &id), s);
        assert!(subjects::is_router_msg_id(s));
    }
}

fn work(s: &str) {
    if let Ok((queue, worker)) = subjects::parse_work(s) {
        assert_eq!(subjects::work(&queue, worker.as_ref()), s);
        assert!(subjects::is_work(s));
    }
    if let Ok(worker) = subjects::parse_answer(s) {
        assert_eq!(subjects::answer(&worker), s);
        assert_eq!(subjects::answer_route(&worker), s);
        assert!(subjects::is_answer(s));
        let me = AgentId::new("me").expect("a valid agent id");
        assert_eq!(
            subjects::answer_ingress_from_route(&me, s, &worker),
            Ok(subjects::answer_ingress(&me, &worker))
        );
    }
    if let Ok(queue) = subjects::parse_queue_consumer(s) {
        assert_eq!(subjects::queue_consumer(&queue), s);
    }
    if let Ok(worker) = subjects::parse_targeted_consumer(s) {
        assert_eq!(subjects::targeted_consumer(&worker), s);
    }
    if let Ok(worker) = subjects::parse_answer_consumer(s) {
        assert_eq!(subjects::answer_consumer(&worker), s);
    }
    if let Ok((worker, kind, requester)) = subjects::parse_control(s) {
        let built = match &requester {
            None => subjects::control(&worker, kind),
            Some(requester) => subjects::control_as(&worker, kind, requester),
        };
        assert_eq!(built, s);
        assert!(ControlKind::ALL.contains(&kind));
    }
    if let Ok((queue, worker)) = subjects::parse_join_request(s) {
        assert_eq!(subjects::join_request(&queue, &worker), s);
    }
}

/// The tokens of an ack subject from its stream on, as the module's doc reads them.
fn ack_tokens(s: &str) -> Option<Vec<&str>> {
    let tokens: Vec<&str> = s.strip_prefix("$JS.ACK.")?.split('.').collect();
    match tokens.len() {
        7 => Some(tokens),
        n if n >= 9 => Some(tokens[2..9].to_vec()),
        _ => None,
    }
}

fn ack(s: &str) {
    let tokens = ack_tokens(s);
    let consumer = subjects::parse_ack_consumer(s);
    assert_eq!(
        consumer,
        tokens.as_ref().map(|t| t[1]).filter(|c| !c.is_empty()),
        "the consumer of {s:?}"
    );
    let info = subjects::parse_ack_info(s);
    let read = tokens.as_ref().and_then(|t| {
        Some(subjects::AckInfo {
            delivered: t[2].parse().ok()?,
            stream_seq: t[3].parse().ok()?,
            consumer_seq: t[4].parse().ok()?,
            stored_ns: t[5].parse().ok()?,
            pending: t[6].parse().ok()?,
        })
    });
    assert_eq!(info, read, "the delivery of {s:?}");
    if let (Some(info), Some(t)) = (info, tokens) {
        let rebuilt = format!(
            "$JS.ACK.{}.{}.{}.{}.{}.{}.{}",
            t[0],
            t[1],
            info.delivered,
            info.stream_seq,
            info.consumer_seq,
            info.stored_ns,
            info.pending
        );
        assert_eq!(subjects::parse_ack_info(&rebuilt), Some(info));
        assert_eq!(subjects::parse_ack_consumer(&rebuilt), consumer);
        let v2 = format!("$JS.ACK.dom.hash.{}.tok", &rebuilt["$JS.ACK.".len()..]);
        assert_eq!(subjects::parse_ack_info(&v2), Some(info));
    }
}

fn replies(s: &str, data: &[u8]) {
    // A pull reply under each prefix the subject could have.
    for (prefix_len, _) in s.match_indices('.').take(8) {
        if let Some((consumer, Some(id))) = subjects::parse_pull_reply(s, prefix_len) {
            let rebuilt = subjects::pull_reply(&s[..prefix_len], consumer, id.incarnation, id.pull);
            assert_eq!(
                subjects::parse_pull_reply(&rebuilt, prefix_len),
                Some((consumer, Some(id))),
                "{rebuilt:?}"
            );
        }
    }
    let worker = WorkerId::new("w1").expect("a valid worker id");
    if let Some(answer) = subjects::worker_status_answer(s, &worker) {
        assert_eq!(answer, format!("{s}.w1"));
        assert_eq!(answer.split('.').count(), 5, "{answer:?}");
        assert!(subjects::is_reply_subject_under(
            &answer,
            subjects::WORKER_STATUS_SUBJECT
        ));
    }
    if subjects::is_reply_subject_under(s, "_INBOX") {
        assert!(subjects::is_answerable_reply(s, "_INBOX.me"));
    }
    // An ingress message id: the logical id and the seal come back out of it.
    let seal = data
        .iter()
        .take(8)
        .fold(0u64, |seal, b| seal << 8 | u64::from(*b));
    let id = subjects::ingress_msg_id(s, seal);
    let (logical, hex) = id
        .rsplit_once(subjects::INGRESS_SEAL_SEPARATOR)
        .expect("a sealed id");
    assert_eq!((logical, u64::from_str_radix(hex, 16)), (s, Ok(seal)));
    assert_eq!(hex.len(), 16);
}
