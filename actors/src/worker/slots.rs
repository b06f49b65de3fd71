//! The worker's concurrency slots: one per attempt that runs a handler. A new task takes a
//! slot from the fetch loop (one fetched message per free slot); the resume of a waiting
//! attempt takes one too, and comes first: a slot freed while a resume waits goes to it, not
//! to the next task of the queue.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};

/// The slots of one worker.
#[derive(Debug)]
pub(crate) struct Slots {
    sem: Arc<Semaphore>,
    resumes_waiting: AtomicUsize,
}

impl Slots {
    /// `n` slots.
    pub fn new(n: usize) -> Arc<Slots> {
        Arc::new(Slots {
            sem: Arc::new(Semaphore::new(n)),
            resumes_waiting: AtomicUsize::new(0),
        })
    }

    /// A slot for a new task, once one is free and no resume waits for it.
    ///
    /// # Errors
    /// When the slots are closed.
    ///
    /// # Cancel safety
    /// Cancel safe: a permit not returned is released.
    pub async fn for_task(&self) -> Result<OwnedSemaphorePermit, AcquireError> {
        loop {
            let permit = self.sem.clone().acquire_owned().await?;
            if self.resumes_waiting.load(Ordering::Acquire) == 0 {
                return Ok(permit);
            }
            // Give it back: the semaphore is fair, so the resume queued before us gets it.
            drop(permit);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Another free slot for a new task, at once, if there is one and no resume waits.
    pub fn try_for_task(&self) -> Option<OwnedSemaphorePermit> {
        if self.resumes_waiting.load(Ordering::Acquire) > 0 {
            return None;
        }
        self.sem.clone().try_acquire_owned().ok()
    }

    /// A slot for a resume, before any new task.
    ///
    /// # Errors
    /// When the slots are closed.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped wait no longer counts as a waiting resume.
    pub async fn for_resume(&self) -> Result<OwnedSemaphorePermit, AcquireError> {
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.resumes_waiting.fetch_add(1, Ordering::AcqRel);
        let _waiting = Waiting(&self.resumes_waiting);
        self.sem.clone().acquire_owned().await
    }

    /// Slots free now.
    #[cfg(test)]
    pub fn free(&self) -> usize {
        self.sem.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_freed_slot_goes_to_a_waiting_resume_before_the_next_task() {
        let slots = Slots::new(1);
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let held = slots.for_task().await.unwrap();
        let (s1, o1) = (slots.clone(), order.clone());
        // The task waits first...
        let task = tokio::spawn(async move {
            let _permit = s1.for_task().await.unwrap();
            o1.lock().unwrap().push("task");
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        // ...then a resume.
        let (s2, o2) = (slots.clone(), order.clone());
        let resume = tokio::spawn(async move {
            let _permit = s2.for_resume().await.unwrap();
            o2.lock().unwrap().push("resume");
            tokio::time::sleep(Duration::from_millis(100)).await;
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            slots.resumes_waiting.load(Ordering::Acquire),
            1,
            "a resume waits"
        );
        drop(held);
        resume.await.unwrap();
        task.await.unwrap();
        assert_eq!(*order.lock().unwrap(), ["resume", "task"]);
        assert_eq!(slots.free(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_resume_that_stops_waiting_no_longer_holds_tasks_back() {
        let slots = Slots::new(1);
        let held = slots.for_task().await.unwrap();
        let s = slots.clone();
        let waiting = tokio::spawn(async move { s.for_resume().await.map(drop) });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            slots.resumes_waiting.load(Ordering::Acquire),
            1,
            "a resume waits"
        );
        waiting.abort();
        let _ = waiting.await;
        assert_eq!(slots.resumes_waiting.load(Ordering::Acquire), 0);
        drop(held);
        let task = tokio::time::timeout(Duration::from_secs(1), slots.for_task()).await;
        assert!(
            task.is_ok(),
            "the task gets the slot once the resume stopped waiting"
        );
    }
}
