//! The worker's counters, shared by the worker actor, its fetch loops and its attempts.

crate::counters! {
    /// Counters shared by the worker and its attempts (one set per worker incarnation).
    pub struct WorkerCounters => WorkerCountersSnapshot {
        /// Attempts started (including re-runs, republishes and resumes).
        admitted,
        /// Attempts finished completed.
        completed,
        /// Attempts finished failed.
        failed,
        /// Attempts finished cancelled.
        cancelled,
        /// Inputs refused as undecodable (acked once their refusal was published).
        bad_input,
        /// Inputs admitted that the journal already knew (redeliveries).
        redelivered,
        /// Progress acks sent.
        heartbeats,
        /// Inputs acked as aliases of a running attempt's task id.
        aliased,
        /// Attempt actors that failed (their input is redelivered).
        attempt_failures,
        /// Answers that resumed an attempt (or were duplicates of one that did).
        answers,
        /// Answers refused (stale, unknown, undecodable), with an error result where the
        /// task is known.
        answers_refused,
        /// Journal compactions done while running.
        compactions,
        /// Tasks not run because their `expires_at` had passed (failed, kind `expired`).
        expired,
        /// Inputs the broker delivered again while their attempt was running here (its
        /// heartbeat did not keep the ack wait from expiring); the copy is left to the running
        /// attempt.
        redelivered_while_running,
        /// Inputs acked without running anything: the task channel showed the task finished,
        /// or parked on another attempt's question.
        settled,
        /// Task inputs run without reading their task channel first: delivered once, not
        /// flagged, stored after the worker's baseline (`protocol::task::must_read_channel`).
        unread,
        /// Times a task consumer was found deleted and made again (its creation time
        /// changed): the baseline was taken anew, so inputs stored before are checked.
        consumers_remade,
        /// Waiting attempts resumed from the journal by an answer.
        resumed,
        /// Pulls that failed (each backed off before the next).
        fetch_errors,
        /// Pulls abandoned without their end: no reply by their expiry plus `PULL_MARGIN`, or
        /// sent on a connection since replaced.
        pulls_abandoned,
        /// Re-joins of the queue after a consumer was found gone.
        rejoins,
        /// Inputs handed back (nak'd without delay) by a graceful shutdown.
        handed_back,
        /// Publishes sent again after an uncertain outcome (no stream ack in time).
        publish_retries,
        /// Task channel publishes whose stream ack said `duplicate`: an earlier try (or an
        /// earlier attempt) of the same id was stored, so this one was not stored again.
        publish_duplicates,
        /// Control and status requests ignored because their reply subject is not under the
        /// worker's reply prefix.
        replies_refused,
        /// Queries, cancels and answers refused because their requester is neither the
        /// task's delegator nor an admin.
        unauthorized,
        /// Task claims taken (or renewed after a restart) before a handler ran.
        claims_taken,
        /// Claim renewals (with the heartbeats).
        claim_renewals,
        /// Claims released when a graceful shutdown handed their input back.
        claims_released,
        /// Inputs whose task another attempt had claimed: nak'd until the claim lapses
        /// (after one read of the task channel, when it had been skipped).
        stood_down,
        /// Claims found taken by another attempt at a renewal (this one had lapsed).
        claims_lost,
        /// Claims that could not be read or written (the input was nak'd).
        claim_errors,
        /// Journalled attempts the start-up sweep forgot: their task was finished, or owned by
        /// another attempt, already.
        swept,
    }
}
