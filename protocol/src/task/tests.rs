use std::collections::BTreeSet;

use serde_json::{json, Value};

use super::*;
use crate::ids::{MessageId, TaskId, WorkerId};
use crate::wire_error::{WireError, WireErrorKind};

pub(super) fn tid(s: &str) -> TaskId {
    TaskId::new(s).unwrap()
}

pub(super) fn aid(s: &str) -> AttemptId {
    AttemptId::new(s).unwrap()
}

pub(super) fn wid(s: &str) -> WorkerId {
    WorkerId::new(s).unwrap()
}

fn mid(s: &str) -> MessageId {
    MessageId::new(s).unwrap()
}

fn task_body() -> Value {
    json!({"version": 1, "task_id": "review-42", "text": "Review the plan."})
}

fn with(field: &str, value: Value) -> Value {
    let mut body = task_body();
    body[field] = value;
    body
}

#[test]
fn decodes_a_minimal_and_a_full_task() {
    let task = decode_task(&task_body()).unwrap();
    assert_eq!(task.task_id, tid("review-42"));
    assert!(task.context.is_empty());
    assert_eq!((task.idempotency_key, task.expires_at), (None, None));
    let full = json!({"version": 1, "task_id": "t", "text": "x", "context": ["a", "b"],
        "idempotency_key": "k:1", "expires_at": 1_700_000_000_000u64});
    let task = decode_task(&full).unwrap();
    assert_eq!(task.context, ["a", "b"]);
    assert_eq!(task.idempotency_key.as_deref(), Some("k:1"));
    assert_eq!(task.expires_at, Some(1_700_000_000_000));
    assert_eq!(serde_json::to_value(&task).unwrap(), full);
    let nulls = json!({"version": 1, "task_id": "t", "text": "x", "context": null,
        "idempotency_key": null, "expires_at": null});
    assert!(decode_task(&nulls).is_ok());
}

#[test]
fn decoding_rejects_unknown_fields() {
    assert_eq!(
        decode_task(&with("reply_to", json!("x"))),
        Err(TaskError::UnknownField {
            field: "reply_to".into()
        })
    );
    assert!(serde_json::from_value::<TaskSpec>(with("reply_to", json!("x"))).is_err());
}

#[test]
fn decoding_rejects_wrong_versions() {
    for (version, found) in [(json!(0), 0), (json!(2), 2)] {
        assert_eq!(
            decode_task(&with("version", version)),
            Err(TaskError::WrongVersion { found })
        );
    }
    for version in [json!("1"), json!(-1), json!(1.5)] {
        assert!(matches!(
            decode_task(&with("version", version)),
            Err(TaskError::InvalidField {
                field: "version",
                ..
            })
        ));
    }
}

#[test]
fn decoding_rejects_blank_text_and_missing_fields() {
    for text in ["", "   ", "\n\t"] {
        assert_eq!(
            decode_task(&with("text", json!(text))),
            Err(TaskError::BlankText)
        );
    }
    for field in ["version", "task_id", "text"] {
        let mut body = task_body();
        body.as_object_mut().unwrap().remove(field);
        assert!(
            matches!(decode_task(&body), Err(TaskError::MissingField { field: f }) if f == field)
        );
    }
}

#[test]
fn decoding_rejects_invalid_ids_and_types() {
    let cases = [
        ("task_id", json!("a.b"), "task_id"),
        ("task_id", json!(""), "task_id"),
        ("task_id", json!(7), "task_id"),
        ("text", json!(["x"]), "text"),
        ("context", json!("x"), "context"),
        ("context", json!([1]), "context"),
        ("idempotency_key", json!("has space"), "idempotency_key"),
        ("expires_at", json!(-5), "expires_at"),
    ];
    for (field, value, expected) in cases {
        let err = decode_task(&with(field, value.clone())).unwrap_err();
        assert!(
            matches!(&err, TaskError::InvalidField { field, .. } if *field == expected),
            "{field}={value}: {err}"
        );
        assert_eq!(err.to_wire().kind, WireErrorKind::Malformed);
    }
    assert!(matches!(
        decode_task(&json!([1])),
        Err(TaskError::Malformed { .. })
    ));
}

#[test]
fn decode_task_json_refuses_trailing_values() {
    assert!(decode_task_json(br#"{"version":1,"task_id":"t","text":"x"}"#).is_ok());
    assert!(matches!(
        decode_task_json(br#"{"version":1,"task_id":"t","text":"x"} {}"#),
        Err(TaskError::Malformed { .. })
    ));
    let missing = TaskError::MissingField { field: "text" }.to_wire();
    assert_eq!(missing.kind, WireErrorKind::MissingField);
    assert_eq!(missing.detail, "missing task field `text`");
}

fn round_trip<T>(value: &T) -> Value
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let json = serde_json::to_value(value).unwrap();
    assert_eq!(&serde_json::from_value::<T>(json.clone()).unwrap(), value);
    json
}

fn suspend() -> Suspend {
    Suspend {
        question: "deploy?".into(),
        tool_call_id: "call-1".into(),
    }
}

#[test]
fn every_type_round_trips_through_json() {
    for state in TaskState::ALL {
        assert_eq!(round_trip(&state), json!(state.as_str()));
    }
    let result = TaskResult {
        task_id: tid("t"),
        attempt_id: aid("a"),
        worker_id: wid("w"),
        state: TaskState::Waiting,
        response: Some(json!({"text": "hi"})),
        error: Some(WireError::new(WireErrorKind::Internal, "boom")),
        suspend: Some(suspend()),
        answer_route: Some("hub.pub.alice.answer.w".into()),
    };
    assert_eq!(round_trip(&result)["suspend"]["tool_call_id"], "call-1");
    let event = StatusEvent::new(tid("t"), aid("a"), wid("w"), 0, TaskState::Queued, 5);
    assert_eq!(round_trip(&event)["type"], "task_accepted");
    let answer = Answer {
        message_id: mid("answer-1"),
        task_id: tid("t"),
        attempt_id: aid("a"),
        worker_id: wid("w"),
        tool_call_id: "call-1".into(),
        responses: vec![json!({"text": "yes", "approved": true})],
    };
    round_trip(&answer);
    let request = ControlRequest {
        task_id: tid("t"),
        attempt_id: aid("a"),
        worker_id: wid("w"),
    };
    round_trip(&request);
    for cancel in [
        None,
        Some(CancelStatus::Requested),
        Some(CancelStatus::NotActive),
        Some(CancelStatus::Stale),
    ] {
        let reply = QueryReply {
            state: TaskState::Running,
            active: false,
            suspend: Some(suspend()),
            cancel,
        };
        round_trip(&reply);
    }
    assert_eq!(round_trip(&CancelStatus::NotActive), json!("not_active"));
    round_trip(&JoinRequest {
        worker_id: wid("w"),
    });
    let bad = json!({"task_id": "t", "attempt_id": "a", "worker_id": "w", "x": 1});
    assert!(serde_json::from_value::<ControlRequest>(bad).is_err());
}

#[test]
fn final_states() {
    let finals: Vec<_> = TaskState::ALL
        .into_iter()
        .filter(|s| s.is_final())
        .collect();
    assert_eq!(
        finals,
        [
            TaskState::Completed,
            TaskState::Failed,
            TaskState::Cancelled
        ]
    );
}

fn waiting_attempt() -> AttemptView {
    AttemptView {
        task_id: tid("t"),
        attempt_id: aid("a"),
        worker_id: wid("w"),
        state: TaskState::Waiting,
        tool_call_id: Some("call-1".into()),
        answered: BTreeSet::from([mid("old")]),
    }
}

fn answer(message: &str, task: &str, attempt: &str, worker: &str, call: &str) -> Answer {
    Answer {
        message_id: mid(message),
        task_id: tid(task),
        attempt_id: aid(attempt),
        worker_id: wid(worker),
        tool_call_id: call.into(),
        responses: vec![json!({"text": "ok"})],
    }
}

#[test]
fn judge_answer_table() {
    let view = waiting_attempt();
    let table = [
        (
            Some(&view),
            answer("new", "t", "a", "w", "call-1"),
            AnswerVerdict::Resume,
        ),
        (
            Some(&view),
            answer("old", "t", "a", "w", "call-1"),
            AnswerVerdict::Duplicate,
        ),
        (
            Some(&view),
            answer("old", "t", "a", "w", "call-2"),
            AnswerVerdict::Duplicate,
        ),
        (
            Some(&view),
            answer("new", "t", "a", "w", "call-2"),
            AnswerVerdict::Stale,
        ),
        (
            Some(&view),
            answer("new", "x", "a", "w", "call-1"),
            AnswerVerdict::UnknownAttempt,
        ),
        (
            Some(&view),
            answer("new", "t", "x", "w", "call-1"),
            AnswerVerdict::UnknownAttempt,
        ),
        (
            Some(&view),
            answer("new", "t", "a", "x", "call-1"),
            AnswerVerdict::UnknownAttempt,
        ),
        (
            None,
            answer("new", "t", "a", "w", "call-1"),
            AnswerVerdict::UnknownAttempt,
        ),
    ];
    for (view, answer, verdict) in table {
        assert_eq!(judge_answer(view, &answer), verdict, "{answer:?}");
    }
    for state in TaskState::ALL
        .into_iter()
        .filter(|s| *s != TaskState::Waiting)
    {
        let view = AttemptView {
            state,
            ..waiting_attempt()
        };
        let fresh = answer("new", "t", "a", "w", "call-1");
        assert_eq!(judge_answer(Some(&view), &fresh), AnswerVerdict::Stale);
    }
    let no_question = AttemptView {
        tool_call_id: None,
        ..waiting_attempt()
    };
    let fresh = answer("new", "t", "a", "w", "call-1");
    assert_eq!(
        judge_answer(Some(&no_question), &fresh),
        AnswerVerdict::Stale
    );
    assert_eq!(AnswerVerdict::Stale.error().unwrap().detail, "stale answer");
    assert_eq!(
        AnswerVerdict::UnknownAttempt.error().unwrap().kind,
        WireErrorKind::UnknownTaskAttempt
    );
    assert_eq!(AnswerVerdict::Resume.error(), None);
    assert_eq!(AnswerVerdict::Duplicate.error(), None);
}

#[test]
fn on_delivery_table() {
    let cases = [
        (None, false, false, DeliveryPlan::FreshAttempt),
        (None, true, false, DeliveryPlan::RepublishSaved),
        (Some(aid("a")), true, false, DeliveryPlan::RepublishSaved),
        (
            Some(aid("a")),
            false,
            false,
            DeliveryPlan::RerunSameAttempt {
                attempt_id: aid("a"),
            },
        ),
        (None, false, true, DeliveryPlan::Expire),
        (Some(aid("a")), false, true, DeliveryPlan::Expire),
        (Some(aid("a")), true, true, DeliveryPlan::RepublishSaved),
    ];
    for (admitted, saved_result, expired, plan) in cases {
        assert_eq!(
            on_delivery(JournalView {
                admitted,
                saved_result,
                expired,
                channel: ChannelState::Untouched,
            }),
            plan
        );
    }
    // The task channel: a final result or another attempt's question settles the delivery,
    // unless this journal saved a result (republished: the stream dedupes it).
    for (channel, plan) in [
        (
            ChannelState::Finished,
            DeliveryPlan::Settled(Settled::Finished),
        ),
        (ChannelState::Parked, DeliveryPlan::Settled(Settled::Parked)),
        (ChannelState::StartedElsewhere, DeliveryPlan::FreshAttempt),
    ] {
        for expired in [false, true] {
            let view = JournalView {
                admitted: None,
                saved_result: false,
                expired,
                channel,
            };
            let expected = match (&plan, expired) {
                (DeliveryPlan::FreshAttempt, true) => DeliveryPlan::Expire,
                _ => plan.clone(),
            };
            assert_eq!(on_delivery(view.clone()), expected, "{view:?}");
            let saved = JournalView {
                saved_result: true,
                ..view
            };
            assert_eq!(on_delivery(saved), DeliveryPlan::RepublishSaved);
        }
    }
}

#[test]
fn cancel_status_table() {
    for state in TaskState::ALL {
        assert_eq!(cancel_status(state, false), CancelStatus::Stale);
        let expected = if state.is_final() {
            CancelStatus::NotActive
        } else {
            CancelStatus::Requested
        };
        assert_eq!(cancel_status(state, true), expected, "{state:?}");
    }
}

#[test]
fn too_large_results() {
    assert!(!result_too_large(10, 10));
    assert!(result_too_large(11, 10));
    let result = too_large_result(tid("t"), aid("a"), wid("w"));
    assert_eq!(result.state, TaskState::Failed);
    let error = result.error.clone().unwrap();
    assert_eq!(
        (error.kind, error.detail.as_str()),
        (WireErrorKind::ResultTooLarge, "result too large")
    );
    assert_eq!(
        (result.response, result.suspend, result.answer_route),
        (None, None, None)
    );
}

#[test]
fn stable_ids() {
    assert_eq!(
        status_event_id(&tid("t"), &aid("a"), 0, TaskState::Queued),
        "t:a:0:accepted"
    );
    assert_eq!(
        status_event_id(&tid("t"), &aid("a"), 0, TaskState::Running),
        "t:a:0:accepted"
    );
    assert_eq!(
        status_event_id(&tid("t"), &aid("a"), 2, TaskState::Waiting),
        "t:a:2:waiting"
    );
    let alice = crate::AgentId::new("alice").unwrap();
    assert_eq!(task_msg_id(&alice, &tid("t")), "hub-task:alice:t");
    assert_eq!(result_msg_id(&tid("t"), &aid("a"), 3), "hub-result:t:a:3");
    assert_eq!(status_msg_id("t:a:0:accepted"), "hub-status:t:a:0:accepted");
    let event = StatusEvent::new(tid("t"), aid("a"), wid("w"), 1, TaskState::Running, 9);
    assert_eq!(
        (event.kind, event.event_id.as_str()),
        (StatusKind::StateChanged, "t:a:1:running")
    );
    assert!(AttemptId::new("a.b").is_err());
}

#[test]
fn bundle_ids_name_their_contents() {
    let (t, a) = (tid("t1"), aid("a1"));
    assert_eq!(bundle_msg_id(&t, &a, 2, false), "hub-bundle:t1:a1:2");
    assert_eq!(bundle_msg_id(&t, &a, 2, true), "hub-bundle:t1:a1:2:a");
    assert!(MessageId::new(bundle_msg_id(&t, &a, u32::MAX, true)).is_ok());
}

mod who_may_act {
    use proptest::prelude::*;

    use crate::task::{may_control, AnswerVerdict, Requester};
    use crate::{AgentId, WireErrorKind};

    fn id(s: &str) -> AgentId {
        AgentId::new(s).unwrap()
    }

    #[test]
    fn the_delegator_and_admins_may_act_and_no_one_else() {
        let (alice, bob) = (id("alice"), id("bob"));
        assert!(may_control(Requester::Identity(&alice), Some(&alice)));
        assert!(!may_control(Requester::Identity(&bob), Some(&alice)));
        assert!(may_control(Requester::Admin, Some(&alice)));
        // A task whose delegator is unknown (an old journal record): admins only.
        assert!(!may_control(Requester::Identity(&alice), None));
        assert!(may_control(Requester::Admin, None));
        assert_eq!(Requester::of_control(None), Requester::Admin);
        assert_eq!(
            AnswerVerdict::NotDelegator.error().unwrap().kind,
            WireErrorKind::Unauthorized
        );
    }

    proptest! {
        #[test]
        fn an_identity_may_act_exactly_on_its_own_tasks(a in "[a-z]{1,3}", d in "[a-z]{1,3}") {
            let (a, d) = (id(&a), id(&d));
            prop_assert_eq!(may_control(Requester::Identity(&a), Some(&d)), a == d);
        }
    }
}
