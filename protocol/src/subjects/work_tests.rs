//! Tests of the worker-channel subjects ([`super::work`]).

use proptest::prelude::*;

use super::tests::{agent, is_well_formed};
use super::*;
use crate::ids::{AgentId, QueueName, WorkerId};

fn queue(s: &str) -> QueueName {
    QueueName::new(s).unwrap()
}

fn worker(s: &str) -> WorkerId {
    WorkerId::new(s).unwrap()
}

#[test]
fn builders_produce_the_documented_subjects() {
    let (me, q, w) = (agent("alice"), queue("review"), worker("w-1"));
    assert_eq!(work_ingress(&me, &q, None), "hub.pub.alice.work.review");
    assert_eq!(
        work_ingress(&me, &q, Some(&w)),
        "hub.pub.alice.work.review.w-1"
    );
    assert_eq!(answer_ingress(&me, &w), "hub.pub.alice.answer.w-1");
    assert_eq!(work(&q, None), "work.review");
    assert_eq!(work(&q, Some(&w)), "work.review.w-1");
    assert_eq!(targeted_filter(&w), "work.*.w-1");
    assert_eq!(answer(&w), "answer.w-1");
    assert_eq!(queue_consumer(&q), "queue-review");
    assert_eq!(targeted_consumer(&w), "worker-w-1");
    assert_eq!(answer_consumer(&w), "answers-w-1");
    assert_eq!(control(&w, ControlKind::Query), "hub.ctl.w-1.query");
    assert_eq!(control(&w, ControlKind::Cancel), "hub.ctl.w-1.cancel");
    let w1 = WorkerId::new("w1").unwrap();
    assert_eq!(join_request(&q, &w1), "hub.work.review.join.w1");
    assert_eq!(
        JOIN_FILTER
            .replacen('*', "review", 1)
            .replacen('*', "w1", 1),
        join_request(&q, &w1)
    );
}

#[test]
fn streams_and_filters_are_valid_and_disjoint() {
    validate_stream_name(WORK_STREAM).unwrap();
    validate_stream_name(ANSWERS_STREAM).unwrap();
    let (q, w) = (queue("answers"), worker("w"));
    // A queue named `answers` does not collide with the answer subjects.
    assert!(work(&q, Some(&w)).starts_with(WORK_FILTER.trim_end_matches('>')));
    assert!(!work(&q, Some(&w)).starts_with(ANSWERS_FILTER.trim_end_matches('>')));
    assert!(answer(&w).starts_with(ANSWERS_FILTER.trim_end_matches('>')));
    assert!(!answer(&w).starts_with(WORK_FILTER.trim_end_matches('>')));
    for filter in [WORK_FILTER, ANSWERS_FILTER] {
        for other in [INGRESS_FILTER, INBOX_FILTER, TASKS_FILTER] {
            assert!(!other.starts_with(filter.trim_end_matches('>')));
        }
    }
    assert!(work_ingress(&agent("a"), &q, None).starts_with(INGRESS_FILTER.trim_end_matches('>')));
}

#[test]
fn parse_work_ingress_cases() {
    assert_eq!(
        parse_work_ingress("hub.pub.alice.work.review").unwrap(),
        Some((agent("alice"), queue("review"), None))
    );
    assert_eq!(
        parse_work_ingress("hub.pub.alice.work.review.w").unwrap(),
        Some((agent("alice"), queue("review"), Some(worker("w"))))
    );
    for other in [
        "hub.pub.alice.inbox",
        "hub.pub.alice.work",
        "hub.pub.alice.task.t",
        "hub.pub.alice",
    ] {
        assert_eq!(parse_work_ingress(other).unwrap(), None, "{other}");
    }
    for bad in [
        "channel.work.q",
        "hub.pub.alice.work.",
        "hub.pub.alice.work.q.w.x",
        "hub.pub.alice.work.q.*",
        "hub.pub.al ice.work.q",
        "hub.pub.alice.work..w",
    ] {
        assert!(parse_work_ingress(bad).is_err(), "{bad}");
    }
    // The existing parser refuses work subjects, so routers try this one first.
    assert!(parse_ingress("hub.pub.alice.work.review").is_err());
}

#[test]
fn parse_answer_ingress_cases() {
    assert_eq!(
        parse_answer_ingress("hub.pub.alice.answer.w").unwrap(),
        Some((agent("alice"), worker("w")))
    );
    assert_eq!(parse_answer_ingress("hub.pub.alice.answer").unwrap(), None);
    assert_eq!(parse_answer_ingress("hub.pub.alice.work.q").unwrap(), None);
    for bad in [
        "hub.pub.alice.answer.w.x",
        "hub.pub.alice.answer.>",
        "answer.w",
    ] {
        assert!(parse_answer_ingress(bad).is_err(), "{bad}");
    }
}

#[test]
fn parse_stored_names_and_control() {
    assert_eq!(parse_work("work.q").unwrap(), (queue("q"), None));
    assert_eq!(
        parse_work("work.q.w").unwrap(),
        (queue("q"), Some(worker("w")))
    );
    assert_eq!(parse_answer("answer.w").unwrap(), worker("w"));
    assert_eq!(parse_queue_consumer("queue-q").unwrap(), queue("q"));
    assert_eq!(parse_targeted_consumer("worker-w").unwrap(), worker("w"));
    assert_eq!(parse_answer_consumer("answers-w").unwrap(), worker("w"));
    assert_eq!(
        parse_control("hub.ctl.w.query").unwrap(),
        (worker("w"), ControlKind::Query, None)
    );
    assert_eq!(
        parse_control("hub.ctl.w.cancel").unwrap(),
        (worker("w"), ControlKind::Cancel, None)
    );
    assert_eq!(
        parse_control("hub.ctl.w.cancel.alice").unwrap(),
        (
            worker("w"),
            ControlKind::Cancel,
            Some(AgentId::new("alice").unwrap())
        )
    );
    assert!(parse_control("hub.ctl.w.cancel.*").is_err());
    assert!(parse_control("hub.ctl.w.cancel.alice.x").is_err());
    assert_eq!(
        parse_join_request("hub.work.q.join.w1").unwrap(),
        (queue("q"), WorkerId::new("w1").unwrap())
    );
    assert!(parse_join_request("hub.work.q.join").is_err());
    for bad in ["work.", "work.q.w.x", "work", "answer.w.x", "work.*"] {
        assert!(
            parse_work(bad).is_err() && parse_answer(bad).is_err(),
            "{bad}"
        );
    }
    assert!(matches!(
        parse_control("hub.ctl.w.stop"),
        Err(SubjectError::UnexpectedToken { .. })
    ));
    assert!(parse_control("hub.ctl.w").is_err());
    assert!(parse_join_request("hub.work.q.leave.w1").is_err());
    assert!(parse_join_request("hub.work.q").is_err());
    assert!(parse_queue_consumer("worker-w").is_err());
    assert!(parse_answer_consumer("answers-").is_err());
}

fn token_string() -> impl Strategy<Value = String> {
    crate::ids::strategies::token(32)
}

fn messy() -> impl Strategy<Value = String> {
    prop_oneof!["[a-c_.*> -]{0,8}", "work", "answer", token_string()]
}

proptest! {
    #[test]
    fn work_subjects_round_trip(
        me in token_string(), q in token_string(), w in token_string(), targeted in any::<bool>(),
    ) {
        let (me, q, w) = (agent(&me), queue(&q), worker(&w));
        let target = targeted.then_some(&w);
        let ingress = work_ingress(&me, &q, target);
        let stored = work(&q, target);
        let answer_route = answer_ingress(&me, &w);
        for subject in [&ingress, &stored, &answer_route, &answer(&w), &join_request(&q, &w)] {
            prop_assert!(is_well_formed(subject), "{}", subject);
        }
        for kind in ControlKind::ALL {
            let subject = control(&w, kind);
            prop_assert!(is_well_formed(&subject));
            prop_assert_eq!(parse_control(&subject).unwrap(), (w.clone(), kind, None));
            let subject = control_as(&w, kind, &me);
            prop_assert!(is_well_formed(&subject));
            prop_assert_eq!(parse_control(&subject).unwrap(), (w.clone(), kind, Some(me.clone())));
        }
        let expected = (me.clone(), q.clone(), target.cloned());
        prop_assert_eq!(parse_work_ingress(&ingress).unwrap(), Some(expected));
        prop_assert_eq!(parse_work(&stored).unwrap(), (q.clone(), target.cloned()));
        prop_assert_eq!(parse_answer_ingress(&answer_route).unwrap(), Some((me.clone(), w.clone())));
        prop_assert_eq!(parse_answer_ingress(&ingress).unwrap(), None);
        prop_assert_eq!(parse_work_ingress(&answer_route).unwrap(), None);
        prop_assert_eq!(parse_answer(&answer(&w)).unwrap(), w.clone());
        prop_assert_eq!(parse_join_request(&join_request(&q, &w)).unwrap(), (q.clone(), w.clone()));
        prop_assert!(parse_answer(&stored).is_err());
    }

    #[test]
    fn consumer_names_are_dotless_durable_names(q in token_string(), w in token_string()) {
        let (q, w) = (queue(&q), worker(&w));
        for name in [queue_consumer(&q), targeted_consumer(&w), answer_consumer(&w)] {
            prop_assert!(!name.contains('.'));
            prop_assert!(validate_durable_name(&name).is_ok());
        }
        prop_assert_eq!(parse_queue_consumer(&queue_consumer(&q)).unwrap(), q);
        prop_assert_eq!(parse_targeted_consumer(&targeted_consumer(&w)).unwrap(), w.clone());
        prop_assert_eq!(parse_answer_consumer(&answer_consumer(&w)).unwrap(), w);
    }

    #[test]
    fn parsers_accept_only_well_formed_subjects(
        parts in proptest::collection::vec(messy(), 0..5),
        prefix in proptest::sample::select(vec!["hub.pub.", "work.", "answer.", "hub.ctl.", "hub.work."]),
    ) {
        let subject = format!("{prefix}{}", parts.join("."));
        if let Ok(Some((me, q, w))) = parse_work_ingress(&subject) {
            prop_assert_eq!(work_ingress(&me, &q, w.as_ref()), subject.clone());
        }
        if let Ok(Some((me, w))) = parse_answer_ingress(&subject) {
            prop_assert_eq!(answer_ingress(&me, &w), subject.clone());
        }
        if let Ok((q, w)) = parse_work(&subject) {
            prop_assert_eq!(work(&q, w.as_ref()), subject.clone());
        }
        if let Ok(w) = parse_answer(&subject) {
            prop_assert_eq!(answer(&w), subject.clone());
        }
        if let Ok((w, kind, requester)) = parse_control(&subject) {
            let built = match &requester {
                Some(r) => control_as(&w, kind, r),
                None => control(&w, kind),
            };
            prop_assert_eq!(built, subject.clone());
        }
        if let Ok((q, w)) = parse_join_request(&subject) {
            prop_assert_eq!(join_request(&q, &w), subject.clone());
        }
    }
}

#[test]
fn an_answer_route_names_no_sender_and_is_checked_against_the_worker() {
    let w1 = WorkerId::new("w1").unwrap();
    let boss = AgentId::new("boss").unwrap();
    let route = answer_route(&w1);
    assert_eq!(route, "answer.w1");
    assert_eq!(
        answer_ingress_from_route(&boss, &route, &w1).unwrap(),
        "hub.pub.boss.answer.w1"
    );
    let w2 = WorkerId::new("w2").unwrap();
    assert!(answer_ingress_from_route(&boss, &route, &w2).is_err());
    for bad in [
        "hub.pub.w1.answer.w1",
        "answer.w1.x",
        "answer.",
        "answer.*",
        "work.q",
    ] {
        assert!(answer_ingress_from_route(&boss, bad, &w1).is_err(), "{bad}");
    }
}

#[test]
fn only_literal_inbox_replies_are_reply_subjects() {
    for good in ["_INBOX.abc", "_INBOX.alice.x1", "_INBOX.a.b.c"] {
        assert!(
            crate::subjects::is_reply_subject_under(good, crate::subjects::DEFAULT_REPLY_PREFIX),
            "{good}"
        );
    }
    for bad in [
        "hub.pub.bob.inbox",
        "_INBOX",
        "_INBOX.",
        "_INBOX.>",
        "_INBOX.a.*",
        "_INBOX.a..b",
        "_INBOX.a b",
        "x._INBOX.a",
        "",
    ] {
        assert!(
            !crate::subjects::is_reply_subject_under(bad, crate::subjects::DEFAULT_REPLY_PREFIX),
            "{bad}"
        );
    }
    // A deployment's own root.
    assert!(crate::subjects::is_reply_subject_under(
        "_HUB.alice.x",
        "_HUB"
    ));
    assert!(!crate::subjects::is_reply_subject_under("_INBOX.x", "_HUB"));
    assert!(!crate::subjects::is_reply_subject_under("_HUBX.x", "_HUB"));
    for good in ["_INBOX", "_INBOX.alice", "_HUB"] {
        assert!(crate::subjects::is_valid_reply_prefix(good), "{good}");
    }
    // Per-identity prefixes share their root.
    for (prefix, root) in [
        ("_INBOX", "_INBOX"),
        ("_INBOX.router-1", "_INBOX"),
        ("_HUB", "_HUB"),
    ] {
        assert_eq!(crate::subjects::reply_root(prefix), root);
    }
    for bad in ["", "_INBOX.", ".x", "_INBOX.*", "a.>", "a b"] {
        assert!(!crate::subjects::is_valid_reply_prefix(bad), "{bad}");
    }
}

#[test]
fn is_work_is_the_prefix_parse_work_requires() {
    for subject in [
        "work.review",
        "work.review.w",
        "work.",
        "channel.inbox.bob",
        "workx.a",
    ] {
        if parse_work(subject).is_ok() {
            assert!(is_work(subject), "{subject}");
        }
    }
    assert!(is_work("work.review"));
    assert!(!is_work("channel.inbox.bob"));
    assert!(!is_work("workx.a"));
}
