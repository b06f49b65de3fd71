//! Property tests of the task decisions and stable ids.

use proptest::prelude::*;
use serde_json::json;

use super::tests::{aid, tid, wid};
use super::*;
use crate::ids::{MessageId, TaskId, WorkerId};

fn token() -> impl Strategy<Value = String> {
    crate::ids::strategies::token(16)
}

fn state() -> impl Strategy<Value = TaskState> {
    proptest::sample::select(TaskState::ALL.to_vec())
}

/// A small alphabet so that ids often collide.
fn small() -> impl Strategy<Value = String> {
    proptest::sample::select(vec!["a".to_owned(), "b".to_owned()])
}

fn view() -> impl Strategy<Value = AttemptView> {
    (
        small(),
        small(),
        small(),
        state(),
        proptest::option::of(small()),
        proptest::collection::btree_set(small(), 0..2),
    )
        .prop_map(|(t, a, w, state, call, answered)| AttemptView {
            task_id: tid(&t),
            attempt_id: aid(&a),
            worker_id: wid(&w),
            state,
            tool_call_id: call,
            answered: answered
                .into_iter()
                .map(|m| MessageId::new(m).unwrap())
                .collect(),
        })
}

fn answer() -> impl Strategy<Value = Answer> {
    (small(), small(), small(), small(), small()).prop_map(|(m, t, a, w, call)| Answer {
        message_id: MessageId::new(m).unwrap(),
        task_id: tid(&t),
        attempt_id: aid(&a),
        worker_id: wid(&w),
        tool_call_id: call,
        responses: vec![json!("ok")],
    })
}

proptest! {
    #[test]
    fn judge_answer_matches_its_specification(view in proptest::option::of(view()), answer in answer()) {
        let verdict = judge_answer(view.as_ref(), &answer);
        let owned = view.as_ref().filter(|v| {
            v.task_id == answer.task_id && v.attempt_id == answer.attempt_id && v.worker_id == answer.worker_id
        });
        let expected = match owned {
            None => AnswerVerdict::UnknownAttempt,
            Some(v) if v.answered.contains(&answer.message_id) => AnswerVerdict::Duplicate,
            Some(v) if v.state == TaskState::Waiting
                && v.tool_call_id.as_ref() == Some(&answer.tool_call_id) => AnswerVerdict::Resume,
            Some(_) => AnswerVerdict::Stale,
        };
        prop_assert_eq!(verdict, expected);
        // Only a waiting attempt resumes; an applied answer never resumes twice.
        if verdict == AnswerVerdict::Resume {
            let v = view.clone().unwrap();
            prop_assert_eq!(v.state, TaskState::Waiting);
            let mut applied = v;
            applied.answered.insert(answer.message_id.clone());
            prop_assert_eq!(judge_answer(Some(&applied), &answer), AnswerVerdict::Duplicate);
        }
    }

    #[test]
    fn on_delivery_never_runs_a_task_with_a_saved_or_final_result(
        admitted in proptest::option::of(token()),
        saved in any::<bool>(),
        expired in any::<bool>(),
        channel in proptest::sample::select(vec![
            ChannelState::Untouched,
            ChannelState::StartedElsewhere,
            ChannelState::Parked,
            ChannelState::Finished,
        ]),
    ) {
        let admitted = admitted.map(|a| aid(&a));
        let plan = on_delivery(JournalView { admitted: admitted.clone(), saved_result: saved, expired, channel });
        let runs = matches!(plan, DeliveryPlan::RerunSameAttempt { .. } | DeliveryPlan::FreshAttempt);
        prop_assert!(!(runs && (saved || channel == ChannelState::Finished || channel == ChannelState::Parked)));
        match plan {
            DeliveryPlan::RepublishSaved => prop_assert!(saved),
            DeliveryPlan::Settled(Settled::Finished) => prop_assert!(!saved && channel == ChannelState::Finished),
            DeliveryPlan::Settled(Settled::Parked) => prop_assert!(!saved && channel == ChannelState::Parked),
            DeliveryPlan::RerunSameAttempt { attempt_id } => {
                prop_assert!(!saved && !expired);
                prop_assert_eq!(Some(attempt_id), admitted);
            }
            DeliveryPlan::FreshAttempt => prop_assert!(!saved && !expired && admitted.is_none()),
            DeliveryPlan::Expire => prop_assert!(!saved && expired),
        }
    }

    #[test]
    fn a_first_delivery_nobody_started_is_the_only_fresh_run(
        admitted in any::<bool>(),
        delivered in 1u64..1000,
        elsewhere in any::<bool>(),
    ) {
        prop_assert_eq!(
            !is_rerun(admitted, delivered, elsewhere),
            !admitted && delivered == 1 && !elsewhere
        );
    }

    #[test]
    fn expiry_is_the_deadline_or_later(deadline in proptest::option::of(any::<u64>()), now in any::<u64>()) {
        let expired = is_expired(deadline, now);
        prop_assert_eq!(expired, deadline.is_some_and(|d| now >= d));
        if let Some(d) = deadline {
            prop_assert!(is_expired(Some(d), d), "the deadline itself is too late");
            prop_assert!(d == 0 || !is_expired(Some(d), d - 1));
        }
    }

    #[test]
    fn cancel_is_requested_only_for_live_matching_attempts(state in state(), ids_match in any::<bool>()) {
        let status = cancel_status(state, ids_match);
        prop_assert_eq!(status == CancelStatus::Requested, ids_match && !state.is_final());
        prop_assert_eq!(status == CancelStatus::Stale, !ids_match);
    }

    #[test]
    fn result_size_limit_is_inclusive(len in 0usize..4096, limit in 0usize..4096) {
        prop_assert_eq!(result_too_large(len, limit), len > limit);
    }

    #[test]
    fn stable_ids_are_deterministic_and_distinct(
        t in token(), a in token(), s1 in 0u32..50, s2 in 0u32..50, st in state(),
    ) {
        let (t, a) = (tid(&t), aid(&a));
        prop_assert_eq!(status_event_id(&t, &a, s1, st), status_event_id(&t, &a, s1, st));
        prop_assert_eq!(s1 == s2, result_msg_id(&t, &a, s1) == result_msg_id(&t, &a, s2));
        prop_assert_eq!(
            s1 == s2,
            status_event_id(&t, &a, s1, st) == status_event_id(&t, &a, s2, st)
        );
        prop_assert!(status_event_id(&t, &a, 0, st).ends_with(":0:accepted"));
        prop_assert!(MessageId::new(status_msg_id(&status_event_id(&t, &a, s1, st))).is_ok());
        let from = crate::AgentId::new(a.as_str()).unwrap();
        prop_assert!(MessageId::new(task_msg_id(&from, &t)).is_ok());
    }

    #[test]
    fn valid_tasks_decode_and_round_trip(
        t in token(), text in "[a-z]{0,3}[!-~][ a-z]{0,8}",
        context in proptest::collection::vec(".{0,8}", 0..3),
        key in proptest::option::of("[!-~]{1,32}"), expires in proptest::option::of(any::<u64>()),
    ) {
        let task = TaskSpec {
            version: TASK_VERSION, task_id: TaskId::new(t).unwrap(), text, context,
            idempotency_key: key, expires_at: expires,
        };
        let json = serde_json::to_value(&task).unwrap();
        prop_assert_eq!(decode_task(&json).unwrap(), task.clone());
        prop_assert_eq!(serde_json::from_value::<TaskSpec>(json).unwrap(), task);
    }

    #[test]
    fn decoding_refuses_any_unknown_field(field in "[a-z_]{1,12}") {
        prop_assume!(!["version", "task_id", "text", "context", "idempotency_key", "expires_at"]
            .contains(&field.as_str()));
        let mut body = json!({"version": 1, "task_id": "t", "text": "x"});
        body[&field] = json!(1);
        prop_assert_eq!(decode_task(&body), Err(TaskError::UnknownField { field }));
    }

    #[test]
    fn results_round_trip(t in token(), a in token(), w in token(), st in state()) {
        let result = too_large_result(tid(&t), aid(&a), WorkerId::new(w).unwrap());
        let result = TaskResult { state: st, ..result };
        let json = serde_json::to_string(&result).unwrap();
        prop_assert_eq!(serde_json::from_str::<TaskResult>(&json).unwrap(), result);
    }
}
