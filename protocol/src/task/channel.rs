//! What a task channel says about its task: a fold over its stored bodies, in stream order.
//!
//! The task channel is the one record every attempt at a task writes to, whichever worker ran
//! it. Workers read it before they run a task (a task whose result is already stored is never
//! run again), and clients read it to find where a task is.

use std::collections::BTreeSet;

use super::{AttemptId, ChannelState, TaskChannelBody, TaskResult, TaskState};
use crate::ids::WorkerId;

/// Where a task is, as the latest result or status event on its channel says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Whereabouts {
    /// The attempt that published it.
    pub attempt_id: AttemptId,
    /// Its worker.
    pub worker_id: WorkerId,
    /// The state it reported.
    pub state: TaskState,
}

/// The fold of a task channel. Feed it every body in stream order with [`observe`](Self::observe).
/// Answer refusals say nothing about the task's state and are skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChannelView {
    /// The first final result (completed, failed or cancelled).
    pub final_result: Option<TaskResult>,
    /// The latest result, final or not.
    pub latest_result: Option<TaskResult>,
    /// The latest result or status event.
    pub latest: Option<Whereabouts>,
    /// Every attempt that published something.
    pub attempts: BTreeSet<AttemptId>,
}

impl ChannelView {
    /// The view of `bodies`, in order.
    pub fn of<'a>(bodies: impl IntoIterator<Item = &'a TaskChannelBody>) -> ChannelView {
        let mut view = ChannelView::default();
        for body in bodies {
            view.observe(body);
        }
        view
    }

    /// Takes the next body of the channel into account.
    pub fn observe(&mut self, body: &TaskChannelBody) {
        match body {
            TaskChannelBody::Result(result) => {
                self.attempts.insert(result.attempt_id.clone());
                if result.state.is_final() && self.final_result.is_none() {
                    self.final_result = Some(result.clone());
                }
                self.latest = Some(Whereabouts {
                    attempt_id: result.attempt_id.clone(),
                    worker_id: result.worker_id.clone(),
                    state: result.state,
                });
                self.latest_result = Some(result.clone());
            }
            TaskChannelBody::Status(event) => {
                self.attempts.insert(event.attempt_id.clone());
                // A status never moves a task back out of a final state.
                if self.final_result.is_none() {
                    self.latest = Some(Whereabouts {
                        attempt_id: event.attempt_id.clone(),
                        worker_id: event.worker_id.clone(),
                        state: event.state,
                    });
                }
            }
            TaskChannelBody::AnswerRefused(_) => {}
        }
    }

    /// The pending question: the latest result when it is `waiting`, no final result came, and
    /// nothing later (the `running` status of the resume an answer started) moved the task on.
    pub fn waiting(&self) -> Option<&TaskResult> {
        let still = self
            .latest
            .as_ref()
            .is_some_and(|at| at.state == TaskState::Waiting);
        self.latest_result
            .as_ref()
            .filter(|r| r.state == TaskState::Waiting && self.final_result.is_none() && still)
    }

    /// The channel's state for a delivery of the task to an attempt `mine` (the one the
    /// worker's journal admitted for it, if any): what `mine` published itself does not
    /// count as another attempt's.
    pub fn state_for(&self, mine: Option<&AttemptId>) -> ChannelState {
        if self.final_result.is_some() {
            return ChannelState::Finished;
        }
        if let Some(waiting) = self.waiting() {
            if Some(&waiting.attempt_id) != mine {
                return ChannelState::Parked;
            }
        }
        if self.attempts.iter().any(|a| Some(a) != mine) {
            ChannelState::StartedElsewhere
        } else {
            ChannelState::Untouched
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::{StatusEvent, TaskResult};
    use crate::{TaskId, WireError, WireErrorKind};
    use proptest::prelude::*;

    fn aid(s: &str) -> AttemptId {
        AttemptId::new(s).unwrap()
    }

    fn result(attempt: &str, state: TaskState) -> TaskChannelBody {
        TaskChannelBody::Result(TaskResult {
            task_id: TaskId::new("t").unwrap(),
            attempt_id: aid(attempt),
            worker_id: WorkerId::new("w").unwrap(),
            state,
            response: None,
            error: None,
            suspend: None,
            answer_route: None,
        })
    }

    fn status(attempt: &str, seq: u32, state: TaskState) -> TaskChannelBody {
        TaskChannelBody::Status(StatusEvent::new(
            TaskId::new("t").unwrap(),
            aid(attempt),
            WorkerId::new("w").unwrap(),
            seq,
            state,
            0,
        ))
    }

    fn refusal(attempt: &str) -> TaskChannelBody {
        TaskChannelBody::AnswerRefused(crate::task::AnswerRefusal {
            task_id: TaskId::new("t").unwrap(),
            attempt_id: aid(attempt),
            worker_id: WorkerId::new("w").unwrap(),
            answer_id: crate::MessageId::new("m").unwrap(),
            error: WireError::new(WireErrorKind::StaleAnswer, "stale answer"),
        })
    }

    #[test]
    fn states_of_a_channel() {
        use TaskState::*;
        let a = aid("a");
        let empty = ChannelView::default();
        assert_eq!(empty.state_for(None), ChannelState::Untouched);
        let accepted = ChannelView::of(&[status("a", 0, Running)]);
        assert_eq!(accepted.state_for(Some(&a)), ChannelState::Untouched);
        assert_eq!(accepted.state_for(None), ChannelState::StartedElsewhere);
        let waiting = ChannelView::of(&[
            status("a", 0, Running),
            status("a", 1, Waiting),
            result("a", Waiting),
        ]);
        assert_eq!(waiting.state_for(None), ChannelState::Parked);
        assert_eq!(waiting.state_for(Some(&a)), ChannelState::Untouched);
        assert!(waiting.waiting().is_some());
        // A refusal after the waiting result changes nothing.
        let refused = ChannelView::of(&[result("a", Waiting), refusal("a")]);
        assert_eq!(refused.state_for(None), ChannelState::Parked);
        // An answer resumed it: the question is not pending any more.
        let resumed = ChannelView::of(&[result("a", Waiting), status("a", 2, Running)]);
        assert!(resumed.waiting().is_none());
        assert_eq!(resumed.state_for(None), ChannelState::StartedElsewhere);
        let done = ChannelView::of(&[result("a", Waiting), result("a", Completed)]);
        assert_eq!(done.state_for(Some(&a)), ChannelState::Finished);
        assert!(done.waiting().is_none());
        // A later status (another attempt's acceptance) does not hide the final result.
        let late = ChannelView::of(&[result("a", Failed), status("b", 0, Running)]);
        assert_eq!(late.state_for(None), ChannelState::Finished);
        assert_eq!(late.latest.unwrap().state, Failed);
    }

    fn any_state() -> impl Strategy<Value = TaskState> {
        proptest::sample::select(TaskState::ALL.to_vec())
    }

    fn any_body() -> impl Strategy<Value = TaskChannelBody> {
        (0..3u8, any_state(), 0..3u32, prop_oneof!["a", "b"]).prop_map(
            |(kind, state, seq, attempt)| match kind {
                0 => result(&attempt, state),
                1 => status(&attempt, seq, state),
                _ => refusal(&attempt),
            },
        )
    }

    proptest! {
        #[test]
        fn a_channel_with_a_final_result_is_finished_whatever_follows(
            before in proptest::collection::vec(any_body(), 0..6),
            after in proptest::collection::vec(any_body(), 0..6),
            last in prop_oneof![Just(TaskState::Completed), Just(TaskState::Failed), Just(TaskState::Cancelled)],
        ) {
            let mut bodies = before;
            bodies.push(result("a", last));
            bodies.extend(after);
            let view = ChannelView::of(&bodies);
            prop_assert_eq!(view.state_for(None), ChannelState::Finished);
            prop_assert_eq!(view.state_for(Some(&aid("a"))), ChannelState::Finished);
            prop_assert!(view.waiting().is_none());
        }

        #[test]
        fn refusals_never_change_the_view(
            bodies in proptest::collection::vec(any_body(), 0..8),
        ) {
            let without: Vec<_> = bodies
                .iter()
                .filter(|b| !matches!(b, TaskChannelBody::AnswerRefused(_)))
                .cloned()
                .collect();
            prop_assert_eq!(ChannelView::of(&bodies), ChannelView::of(&without));
        }
    }
}
