//! In-process FIFO in front of Redis, one queue per lock key.
//!
//! Tasks of one process that want the same key line up here, and only the head of the line
//! talks to Redis. So a task that releases and at once asks again queues behind the tasks that
//! were already waiting (no starvation within a process), a release hands over to the next
//! local task without any wake-up message, and Redis sees one contender per process and key.
//!
//! The queue of a key exists only while someone holds or waits for it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// How often a waiter looks again at a head whose lock's expiry is not known yet (it is still
/// acquiring, or handing over).
const RECHECK: Duration = Duration::from_millis(500);

/// Until when the head's lock surely lives; `None` while that is not known.
type Lease = Box<dyn Fn() -> Option<Instant> + Send + Sync>;

/// The queues of one lock manager.
#[derive(Default)]
pub(crate) struct LocalQueues {
    queues: Mutex<HashMap<Arc<str>, Arc<KeyQueue>>>,
}

/// One key's line: one permit, and who has it.
struct KeyQueue {
    semaphore: Arc<Semaphore>,
    head: Mutex<Option<Arc<HeadState>>>,
}

/// What the line knows of the task whose turn it is.
#[derive(Default)]
struct HeadState {
    lease: Mutex<Option<Lease>>,
    /// Its lock expired while it kept its turn (a stuck task): the turn went to the next task,
    /// and its permit is not given back when it is finally dropped.
    revoked: AtomicBool,
}

/// A place in a key's queue; removes the queue when the last place is given up.
struct Ticket {
    queues: Arc<LocalQueues>,
    key: Arc<str>,
    queue: Arc<KeyQueue>,
}

/// The head of a key's queue: while this lives, no other task of the process contends for the
/// key — until the lock it holds expires (see [`Turn::hold_while`]). Dropping it hands the turn
/// to the next task in line.
pub(crate) struct Turn {
    permit: Option<OwnedSemaphorePermit>,
    state: Arc<HeadState>,
    ticket: Ticket,
}

impl Turn {
    fn new(permit: OwnedSemaphorePermit, ticket: Ticket) -> Self {
        let state = Arc::new(HeadState::default());
        *ticket.queue.head() = Some(Arc::clone(&state));
        Turn {
            permit: Some(permit),
            state,
            ticket,
        }
    }

    /// The turn lasts while `lease` says the lock lives. The ttl is what frees a lock whose
    /// holder hangs: once it has run out, the next task of the process gets the turn, as another
    /// process gets the lock, instead of waiting behind the stuck one for ever. (Redis still
    /// decides who holds the lock; the turn only orders the tasks of this process.)
    pub(crate) fn hold_while(&self, lease: impl Fn() -> Option<Instant> + Send + Sync + 'static) {
        *self
            .state
            .lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Box::new(lease));
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut head = self.ticket.queue.head();
        if head
            .as_ref()
            .is_some_and(|state| Arc::ptr_eq(state, &self.state))
        {
            *head = None;
        }
        if let Some(permit) = self.permit.take() {
            if self.state.revoked.load(Ordering::SeqCst) {
                // Its permit was given to the next task when the turn was revoked.
                permit.forget();
            } else {
                drop(permit);
            }
        }
    }
}

impl KeyQueue {
    fn head(&self) -> std::sync::MutexGuard<'_, Option<Arc<HeadState>>> {
        self.head.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// When to look at the head again: when its lock may expire.
    fn head_lease(&self) -> Option<Instant> {
        let head = self.head().clone()?;
        let lease = head.lease.lock().unwrap_or_else(PoisonError::into_inner);
        lease.as_ref().and_then(|lease| lease())
    }

    /// Passes the turn on if the head's lock has expired.
    fn revoke_expired_head(&self) {
        let mut head = self.head();
        let Some(state) = head.as_ref() else {
            return;
        };
        let expired = state
            .lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .and_then(|lease| lease())
            .is_some_and(|until| until <= Instant::now());
        if expired && !state.revoked.swap(true, Ordering::SeqCst) {
            *head = None;
            self.semaphore.add_permits(1);
        }
    }
}

impl LocalQueues {
    /// Waits for this task's turn on `key`. Cancel-safe: a dropped wait leaves the line.
    pub(crate) async fn wait_turn(self: &Arc<Self>, key: &Arc<str>) -> Turn {
        let ticket = self.ticket(key);
        let acquire = Arc::clone(&ticket.queue.semaphore).acquire_owned();
        let mut acquire = std::pin::pin!(acquire);
        loop {
            let look_again = ticket
                .queue
                .head_lease()
                .unwrap_or_else(|| Instant::now() + RECHECK);
            tokio::select! {
                biased;
                permit = &mut acquire => {
                    let permit =
                        permit.expect("distlock: a local queue's semaphore is never closed");
                    return Turn::new(permit, ticket);
                }
                () = tokio::time::sleep_until(look_again) => ticket.queue.revoke_expired_head(),
            }
        }
    }

    /// This task's turn on `key` if nobody in the process holds (a lock still alive) or waits
    /// for it.
    pub(crate) fn try_turn(self: &Arc<Self>, key: &Arc<str>) -> Option<Turn> {
        let ticket = self.ticket(key);
        let semaphore = Arc::clone(&ticket.queue.semaphore);
        let permit = match Arc::clone(&semaphore).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                ticket.queue.revoke_expired_head();
                semaphore.try_acquire_owned().ok()?
            }
        };
        Some(Turn::new(permit, ticket))
    }

    /// How many keys have a queue now (for leak tests).
    #[cfg(any(test, feature = "resource-counts"))]
    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }

    fn ticket(self: &Arc<Self>, key: &Arc<str>) -> Ticket {
        let queue = Arc::clone(self.map().entry(Arc::clone(key)).or_insert_with(|| {
            Arc::new(KeyQueue {
                semaphore: Arc::new(Semaphore::new(1)),
                head: Mutex::new(None),
            })
        }));
        Ticket {
            queues: Arc::clone(self),
            key: Arc::clone(key),
            queue,
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Arc<KeyQueue>>> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut queues = self.queues.map();
        // The map and this ticket are the only owners left: nobody holds or waits for the key.
        // New tickets are only made under this same lock, so the count cannot grow meanwhile.
        if Arc::strong_count(&self.queue) == 2 {
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
