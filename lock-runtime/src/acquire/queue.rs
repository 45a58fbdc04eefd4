//! In-process FIFO in front of Redis, one queue per lock key.
//!
//! Tasks of one process that want the same key line up here, and only the head of the line
//! talks to Redis. So a task that releases and at once asks again queues behind the tasks that
//! were already waiting (no starvation within a process), a release hands over to the next
//! local task without any wake-up message, and Redis sees one contender per process and key.
//!
//! The queue of a key exists only while someone holds or waits for it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

/// How often a waiter looks again at a head whose lock's expiry is not known yet (it is still
/// acquiring, or handing over).
const RECHECK: Duration = Duration::from_millis(500);

/// What the head's turn lasts for: the lock it took.
pub(crate) trait Lease: Send + Sync {
    /// Until when the lock surely lives; `None` while that is not known.
    fn lives_until(&self) -> Option<Instant>;
}

/// The queues of one lock manager.
#[derive(Default)]
pub(crate) struct LocalQueues {
    queues: Mutex<Queues>,
}

/// The queues by key (hashed with foldhash: this map is on every acquisition's path).
type Queues = HashMap<Arc<str>, Arc<KeyQueue>, foldhash::fast::RandomState>;

/// One key's line: one permit, and who has it.
struct KeyQueue {
    /// The turn: taken by the head, given back when its turn ends or is revoked.
    turn: Semaphore,
    head: Mutex<Option<Head>>,
}

/// What the line knows of the task whose turn it is.
struct Head {
    /// Tells this head's [`Turn`] from a later one: a turn revoked meanwhile (see
    /// [`KeyQueue::revoke_expired_head`]) no longer finds its number here, and gives back no
    /// permit when it ends.
    number: u64,
    lease: Option<Weak<dyn Lease>>,
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
    number: u64,
    ticket: Ticket,
}

impl Turn {
    /// The turn of the holder of `ticket`'s one permit, which it has taken and forgotten.
    fn new(ticket: Ticket) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let number = NEXT.fetch_add(1, Ordering::Relaxed);
        *ticket.queue.head() = Some(Head {
            number,
            lease: None,
        });
        Turn { number, ticket }
    }

    /// The turn lasts while `lease` says the lock lives. The ttl is what frees a lock whose
    /// holder hangs: once it has run out, the next task of the process gets the turn, as another
    /// process gets the lock, instead of waiting behind the stuck one for ever. (Redis still
    /// decides who holds the lock; the turn only orders the tasks of this process.)
    pub(crate) fn hold_while(&self, lease: Weak<dyn Lease>) {
        if let Some(head) = self
            .ticket
            .queue
            .head()
            .as_mut()
            .filter(|head| head.number == self.number)
        {
            head.lease = Some(lease);
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let queue = &self.ticket.queue;
        let mut head = queue.head();
        // A revoked turn's permit went to the next task when it was revoked.
        if head.as_ref().is_some_and(|head| head.number == self.number) {
            *head = None;
            drop(head);
            queue.turn.add_permits(1);
        }
    }
}

impl KeyQueue {
    fn head(&self) -> MutexGuard<'_, Option<Head>> {
        self.head.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// When to look at the head again: when its lock may expire.
    fn head_lease(&self) -> Option<Instant> {
        let lease = self.head().as_ref()?.lease.as_ref()?.upgrade()?;
        lease.lives_until()
    }

    /// Passes the turn on if the head's lock has expired.
    fn revoke_expired_head(&self) {
        let mut head = self.head();
        let expired = head
            .as_ref()
            .and_then(|head| head.lease.as_ref()?.upgrade())
            .and_then(|lease| lease.lives_until())
            .is_some_and(|until| until <= Instant::now());
        if expired {
            *head = None;
            drop(head);
            self.turn.add_permits(1);
        }
    }
}

impl LocalQueues {
    /// Waits for this task's turn on `key`. Cancel-safe: a dropped wait leaves the line.
    pub(crate) async fn wait_turn(self: &Arc<Self>, key: &Arc<str>) -> Turn {
        let ticket = self.ticket(key);
        {
            let mut acquire = std::pin::pin!(ticket.queue.turn.acquire());
            loop {
                let look_again = ticket
                    .queue
                    .head_lease()
                    .unwrap_or_else(|| Instant::now() + RECHECK);
                tokio::select! {
                    biased;
                    permit = &mut acquire => {
                        permit
                            .expect("distlock: a local queue's semaphore is never closed")
                            .forget();
                        break;
                    }
                    () = tokio::time::sleep_until(look_again) => ticket.queue.revoke_expired_head(),
                }
            }
        }
        Turn::new(ticket)
    }

    /// This task's turn on `key` if nobody in the process holds (a lock still alive) or waits
    /// for it.
    pub(crate) fn try_turn(self: &Arc<Self>, key: &Arc<str>) -> Option<Turn> {
        let ticket = self.ticket(key);
        let permit = match ticket.queue.turn.try_acquire() {
            Ok(permit) => permit,
            Err(_) => {
                ticket.queue.revoke_expired_head();
                ticket.queue.turn.try_acquire().ok()?
            }
        };
        permit.forget();
        Some(Turn::new(ticket))
    }

    /// How many keys have a queue now (for leak tests).
    #[cfg(any(test, feature = "resource-counts"))]
    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }

    fn ticket(self: &Arc<Self>, key: &Arc<str>) -> Ticket {
        let queue = Arc::clone(self.map().entry(Arc::clone(key)).or_insert_with(|| {
            Arc::new(KeyQueue {
                turn: Semaphore::new(1),
                head: Mutex::new(None),
            })
        }));
        Ticket {
            queues: Arc::clone(self),
            key: Arc::clone(key),
            queue,
        }
    }

    fn map(&self) -> MutexGuard<'_, Queues> {
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
