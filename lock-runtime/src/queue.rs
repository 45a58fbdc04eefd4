//! In-process FIFO in front of Redis, one queue per lock key.
//!
//! Tasks of one process that want the same key line up here, and only the head of the line
//! talks to Redis. So a task that releases and at once asks again queues behind the tasks that
//! were already waiting (no starvation within a process), a release hands over to the next
//! local task without any wake-up message, and Redis sees one contender per process and key.
//!
//! The queue of a key exists only while someone holds or waits for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The queues of one lock manager.
#[derive(Default)]
pub(crate) struct LocalQueues {
    queues: Mutex<HashMap<Arc<str>, Arc<Semaphore>>>,
}

/// A place in a key's queue; removes the queue when the last place is given up.
struct Ticket {
    queues: Arc<LocalQueues>,
    key: Arc<str>,
    semaphore: Arc<Semaphore>,
}

/// The head of a key's queue: while this lives, no other task of the process contends for the
/// key. Dropping it hands the turn to the next task in line.
pub(crate) struct Turn {
    // Field order matters: the permit goes first, so the ticket sees the queue's true users.
    _permit: OwnedSemaphorePermit,
    _ticket: Ticket,
}

impl LocalQueues {
    /// Waits for this task's turn on `key`. Cancel-safe: a dropped wait leaves the line.
    pub(crate) async fn wait_turn(self: &Arc<Self>, key: &Arc<str>) -> Turn {
        let ticket = self.ticket(key);
        let permit = Arc::clone(&ticket.semaphore)
            .acquire_owned()
            .await
            .expect("distlock: a local queue's semaphore is never closed");
        Turn {
            _permit: permit,
            _ticket: ticket,
        }
    }

    /// This task's turn on `key` if nobody in the process holds or waits for it.
    pub(crate) fn try_turn(self: &Arc<Self>, key: &Arc<str>) -> Option<Turn> {
        let ticket = self.ticket(key);
        let permit = Arc::clone(&ticket.semaphore).try_acquire_owned().ok()?;
        Some(Turn {
            _permit: permit,
            _ticket: ticket,
        })
    }

    /// How many keys have a queue now (for leak tests).
    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }

    fn ticket(self: &Arc<Self>, key: &Arc<str>) -> Ticket {
        let semaphore = Arc::clone(
            self.map()
                .entry(Arc::clone(key))
                .or_insert_with(|| Arc::new(Semaphore::new(1))),
        );
        Ticket {
            queues: Arc::clone(self),
            key: Arc::clone(key),
            semaphore,
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Arc<Semaphore>>> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut queues = self.queues.map();
        // The map and this ticket are the only owners left: nobody holds or waits for the key.
        // New tickets are only made under this same lock, so the count cannot grow meanwhile.
        if Arc::strong_count(&self.semaphore) == 2 {
            queues.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn turns_are_granted_in_arrival_order_and_queues_are_removed() {
        let queues = Arc::new(LocalQueues::default());
        let key: Arc<str> = Arc::from("lock:a");
        let first = queues.wait_turn(&key).await;
        assert!(queues.try_turn(&key).is_none(), "the key is taken");

        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for n in 0..3 {
            let (queues, key, order) = (queues.clone(), key.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let _turn = queues.wait_turn(&key).await;
                order.lock().unwrap().push(n);
            }));
            // Let each waiter take its place before the next one arrives.
            tokio::task::yield_now().await;
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        drop(first);
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
        assert_eq!(
            queues.len(),
            0,
            "no queue is left once nobody holds or waits"
        );
    }

    #[tokio::test]
    async fn a_cancelled_wait_leaves_no_queue_behind() {
        let queues = Arc::new(LocalQueues::default());
        let key: Arc<str> = Arc::from("lock:b");
        let held = queues.wait_turn(&key).await;
        let wait =
            tokio::time::timeout(std::time::Duration::from_millis(10), queues.wait_turn(&key))
                .await;
        assert!(wait.is_err(), "the key was held, so the wait timed out");
        drop(held);
        assert_eq!(queues.len(), 0);
    }
}
