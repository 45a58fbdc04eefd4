//! Messages to one waiter: how a waiter learns that a release gave it the lock, or (Redlock)
//! that a release woke it to try again.
//!
//! Each lock manager has one channel of its own, `distlock:grants:<random id>` (`distlock:wake:`
//! on Redlock), and one pub/sub connection per source — one for a standalone server or a
//! cluster, one per master for Redlock — each driven by a task (on the multi-thread runtime that
//! made the manager, else on the background runtime: see [`spawn_delivery`]), subscribed to the channel while any of its acquisitions waits (and for a short while after,
//! so that a busy process does not subscribe and unsubscribe around every section). A waiter
//! names the channel when it takes its place in line (or in a Redlock master's wake list); the
//! release that hands it the lock publishes `"<token> <fencing token>"` there, and a Redlock
//! release that wakes it `"<token> ?"`, so only that process wakes, and in it only that waiter.
//!
//! Messages are an optimisation, never a requirement: a waiter also looks again at Redis when
//! its place in line is due for renewal and when the holder's ttl runs out, so a lost message
//! (a reconnect) costs at most that. When a connection drops, every waiter is told to look
//! again at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::Client;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use crate::options::Timeouts;
use crate::redis::sentinel::Sentinels;
use crate::support::retry::Backoff;

mod delivery;
use delivery::spawn_delivery;
pub(crate) use delivery::SubscribeError;

/// How long the channel stays subscribed after its last waiter left.
const LINGER: Duration = Duration::from_millis(300);
/// Delay before reconnecting after the connection dropped: first, then doubling up to the last.
const RECONNECT_BACKOFF: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));

/// Where one of a hub's connections subscribes.
#[derive(Clone)]
pub(crate) enum Servers {
    /// Any of these, tried in turn after a failure: one server, or the seed nodes of a cluster
    /// (which forwards every publish to all its nodes).
    Fixed(Vec<Client>),
    /// The master of a Sentinel service, asked of the sentinels at every connect, and left as
    /// soon as the sentinels announce a switch (an old master that is still up would never hear
    /// the new master's publishes).
    Sentinel(Arc<Sentinels>),
}

/// What a hand-off message told a waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grant {
    /// The lock is the waiter's now, with this fencing token (0 when it asked for none).
    Granted { fence: u64 },
    /// The lock was to be handed to the waiter, but its fencing token could not be issued (the
    /// counter is not a number, or below 0): it was passed on, and the waiter left the line.
    FenceFailed,
}

/// The message channel of one lock manager.
pub(crate) struct GrantHub {
    shared: Arc<HubCore>,
}

/// What a hub, its waiters and its connection tasks share: the channel, who waits, and which
/// connections are subscribed.
struct HubCore {
    channel: Arc<str>,
    state: Mutex<State>,
    /// Wakes the hub's tasks, one per connection: a subscription is wanted, or the last waiter
    /// left.
    tasks: Box<[Notify]>,
    /// How many connections must be subscribed before a waiter relies on its messages.
    confirmations: usize,
}

struct State {
    waiters: HashMap<Arc<str>, Arc<Mailbox>>,
    /// Which connections are subscribed now.
    subscribed: Vec<bool>,
    /// Callers waiting for enough subscriptions, each with how many subscriptions failed since
    /// it asked; answered all at once when enough are confirmed.
    pending: Vec<(oneshot::Sender<Result<(), SubscribeError>>, usize)>,
    /// When the last waiter left (for the linger).
    idle_since: Option<Instant>,
    /// The last subscription attempt failed: the next one waits out a backoff.
    failing: bool,
}

/// One waiter's mailbox: a message, or a bare wake-up that means "look again".
#[derive(Default)]
struct Mailbox {
    grant: Mutex<Option<Grant>>,
    wake: Notify,
}

/// A waiter registered for its token's hand-off message; unregistered on drop.
pub(crate) struct GrantWaiter {
    shared: Arc<HubCore>,
    token: Arc<str>,
    mailbox: Arc<Mailbox>,
}

impl GrantHub {
    /// A hub with a fresh channel name starting with `prefix`, and one pub/sub connection per
    /// entry of `sources`, each listing the servers that connection may use, tried in turn (the
    /// seed nodes of a cluster, or one server). A waiter relies on messages once `confirmations`
    /// connections are subscribed.
    pub(crate) fn new(
        prefix: &str,
        sources: Vec<Servers>,
        timeouts: Timeouts,
        confirmations: usize,
    ) -> Self {
        let shared = Arc::new(HubCore {
            channel: Arc::from(format!("{prefix}{}", uuid::Uuid::new_v4().simple())),
            state: Mutex::new(State {
                waiters: HashMap::new(),
                subscribed: vec![false; sources.len()],
                pending: Vec::new(),
                idle_since: None,
                failing: false,
            }),
            tasks: sources.iter().map(|_| Notify::new()).collect(),
            confirmations: confirmations.clamp(1, sources.len().max(1)),
        });
        for (index, servers) in sources.into_iter().enumerate() {
            spawn_delivery(Arc::downgrade(&shared), index, servers, timeouts);
        }
        GrantHub { shared }
    }

    /// The hub of the in-process backend: one for the whole process, as its lock table is, so
    /// a hand-off reaches the waiter whichever in-process manager it waits through. Nothing
    /// travels over a network: it counts as subscribed, and has no task.
    pub(crate) fn in_process() -> Self {
        static SHARED: once_cell::sync::Lazy<Arc<HubCore>> = once_cell::sync::Lazy::new(|| {
            Arc::new(HubCore {
                channel: Arc::from("distlock:grants:in-process"),
                state: Mutex::new(State {
                    waiters: HashMap::new(),
                    subscribed: vec![true],
                    pending: Vec::new(),
                    idle_since: None,
                    failing: false,
                }),
                tasks: Box::new([]),
                confirmations: 1,
            })
        });
        GrantHub {
            shared: Arc::clone(&SHARED),
        }
    }

    /// Delivers `grant` to the waiter registered for `token` in this process, if any: the
    /// in-process backend's hand-off, which needs no message.
    pub(crate) fn hand_over(&self, token: &str, grant: Grant) {
        self.shared.deliver_to(token, Some(grant));
    }

    /// Tells the waiter registered for `token` in this process, if any, to look again: the
    /// in-process backend's `"<token> ?"`.
    pub(crate) fn wake(&self, token: &str) {
        self.shared.deliver_to(token, None);
    }

    /// The channel that messages to this hub's waiters are published on.
    pub(crate) fn channel(&self) -> &Arc<str> {
        &self.shared.channel
    }

    /// Registers `token` for its hand-off message. Register before taking a place in line, so
    /// that a message published right after is not missed.
    pub(crate) fn register(&self, token: &Arc<str>) -> GrantWaiter {
        let mailbox = Arc::new(Mailbox::default());
        let mut state = self.shared.state();
        state
            .waiters
            .insert(Arc::clone(token), Arc::clone(&mailbox));
        state.idle_since = None;
        GrantWaiter {
            shared: Arc::clone(&self.shared),
            token: Arc::clone(token),
            mailbox,
        }
    }

    /// Returns once enough connections subscribed the channel, so that a message published
    /// from now on reaches this process.
    pub(crate) async fn subscribed(&self) -> Result<(), SubscribeError> {
        let confirmed = {
            let mut state = self.shared.state();
            if state.subscriptions() >= self.shared.confirmations {
                return Ok(());
            }
            let (done, confirmed) = oneshot::channel();
            state.pending.push((done, 0));
            confirmed
        };
        self.shared.notify_tasks();
        confirmed.await.unwrap_or(Err(SubscribeError::Stopped))
    }

    /// Whether the last attempt to subscribe failed: a subscription asked for now would wait out
    /// the backoff before the next attempt (up to 2 s), and most likely fail again.
    pub(crate) fn subscription_failing(&self) -> bool {
        self.shared.state().failing
    }

    /// How many waiters are registered now (for leak tests).
    #[cfg(any(test, feature = "resource-counts"))]
    pub(crate) fn waiters(&self) -> usize {
        self.shared.state().waiters.len()
    }

    /// Whether the channel is subscribed now on any connection: whether a message published
    /// now can reach this process at all.
    pub(crate) fn is_subscribed(&self) -> bool {
        self.shared.state().subscriptions() > 0
    }
}

impl Drop for GrantHub {
    fn drop(&mut self) {
        // Lets the tasks see that the hub is gone.
        self.shared.notify_tasks();
    }
}

impl GrantWaiter {
    /// The channel that hand-offs to this waiter are published on.
    pub(crate) fn channel(&self) -> Arc<str> {
        Arc::clone(&self.shared.channel)
    }

    /// Forgets what the mailbox holds: called before each attempt, whose answer supersedes any
    /// message that arrived earlier (a grant that arrived before an attempt that then found the
    /// lock held by someone else is stale: its claim ran out while the waiter did not look).
    /// Whether it held anything: a grant (its place was taken off the line to be handed the
    /// lock) or word that messages may have been lost.
    pub(crate) fn clear(&self) -> bool {
        use futures_util::FutureExt;
        let woken = self.mailbox.wake.notified().now_or_never().is_some();
        let granted = self
            .mailbox
            .grant
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .is_some();
        woken || granted
    }

    /// Completes at the next message for this waiter: `Some` with what it said, or `None` when
    /// the waiter should look at Redis again (the connection dropped, messages may be lost).
    pub(crate) async fn next(&self) -> Option<Grant> {
        self.mailbox.wake.notified().await;
        self.mailbox
            .grant
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

impl Drop for GrantWaiter {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        state.waiters.remove(&self.token);
        if state.waiters.is_empty() {
            state.idle_since = Some(Instant::now());
            drop(state);
            self.shared.notify_tasks();
        }
    }
}

impl State {
    fn subscriptions(&self) -> usize {
        self.subscribed.iter().filter(|&&on| on).count()
    }
}

impl HubCore {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn notify_tasks(&self) {
        for task in &self.tasks {
            task.notify_one();
        }
    }

    /// Delivers a message `"<token> <fence>"`, `"<token> !"` or `"<token> ?"` (look again) to
    /// its waiter, if it is ours. Split at the last space: what follows it never has one.
    fn deliver(&self, message: &str) {
        let Some((token, rest)) = message.rsplit_once(' ') else {
            return;
        };
        let grant = match rest {
            "!" => Some(Grant::FenceFailed),
            "?" => None,
            fence => match fence.parse() {
                Ok(fence) => Some(Grant::Granted { fence }),
                Err(_) => return,
            },
        };
        self.deliver_to(token, grant);
    }

    /// Puts `grant` (`None`: look again) in `token`'s mailbox, if it waits here.
    fn deliver_to(&self, token: &str, grant: Option<Grant>) {
        let mailbox = self.state().waiters.get(token).cloned();
        if let Some(mailbox) = mailbox {
            if grant.is_some() {
                *mailbox.grant.lock().unwrap_or_else(PoisonError::into_inner) = grant;
            }
            mailbox.wake.notify_one();
        }
    }

    /// Tells every waiter to look again (messages may have been lost).
    fn wake_all(&self) {
        for mailbox in self.state().waiters.values() {
            mailbox.wake.notify_one();
        }
    }

    /// Records the outcome of connection `index`'s subscription, and answers those waiting for
    /// enough subscriptions: all of them once enough are confirmed; with this error, those for
    /// which too many connections failed for enough to be confirmed.
    ///
    /// A connection subscribed anew tells every waiter to look again: one that took its place
    /// while it was not subscribed named no channel there, and names it at that look.
    fn confirm(&self, index: usize, result: &Result<(), SubscribeError>) {
        let (answered, subscribed_anew) = {
            let mut state = self.state();
            let subscribed_anew = result.is_ok() && !state.subscribed[index];
            state.subscribed[index] = result.is_ok();
            state.failing = result.is_err();
            let answered = if state.subscriptions() >= self.confirmations {
                std::mem::take(&mut state.pending)
            } else if result.is_err() {
                let spare = state.subscribed.len() - self.confirmations;
                let (failed, waiting) = std::mem::take(&mut state.pending)
                    .into_iter()
                    .map(|(done, failures)| (done, failures + 1))
                    .partition(|(_, failures)| *failures > spare);
                state.pending = waiting;
                failed
            } else {
                Vec::new()
            };
            (answered, subscribed_anew)
        };
        if subscribed_anew {
            self.wake_all();
        }
        for (done, _) in answered {
            let _ = done.send(match result {
                Ok(()) => Ok(()),
                Err(error) => Err(error.clone()),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    /// A hub over `connections` connections, with no task behind it.
    fn hub(connections: usize, confirmations: usize) -> GrantHub {
        GrantHub {
            shared: Arc::new(HubCore {
                channel: Arc::from("distlock:wake:test"),
                state: Mutex::new(State {
                    waiters: HashMap::new(),
                    subscribed: vec![false; connections],
                    pending: Vec::new(),
                    idle_since: None,
                    failing: false,
                }),
                tasks: (0..connections).map(|_| Notify::new()).collect(),
                confirmations,
            }),
        }
    }

    fn failed() -> Result<(), SubscribeError> {
        Err(SubscribeError::TimedOut {
            what: "the confirmation of SUBSCRIBE",
            limit: Duration::from_millis(1),
        })
    }

    #[test]
    fn a_subscription_is_relied_on_once_enough_connections_confirm_it() {
        let hub = hub(5, 3);
        let mut first = Box::pin(hub.subscribed());
        assert!(first.as_mut().now_or_never().is_none());
        let shared = &hub.shared;
        shared.confirm(0, &Ok(()));
        shared.confirm(1, &failed());
        shared.confirm(2, &failed());
        shared.confirm(3, &Ok(()));
        assert!(
            first.as_mut().now_or_never().is_none(),
            "2 of the 3 needed, and 2 failures are spare"
        );
        shared.confirm(4, &Ok(()));
        assert!(matches!(first.now_or_never(), Some(Ok(()))));
        // Enough are subscribed now: answered at once.
        assert!(matches!(hub.subscribed().now_or_never(), Some(Ok(()))));
    }

    #[test]
    fn a_subscription_fails_once_too_few_connections_can_confirm_it() {
        let hub = hub(5, 3);
        let mut waiting = Box::pin(hub.subscribed());
        assert!(waiting.as_mut().now_or_never().is_none());
        for index in 0..2 {
            hub.shared.confirm(index, &failed());
            assert!(waiting.as_mut().now_or_never().is_none());
        }
        hub.shared.confirm(2, &failed());
        assert!(matches!(waiting.now_or_never(), Some(Err(_))));
    }

    #[test]
    fn a_wake_up_tells_its_waiter_to_look_again_and_a_grant_hands_it_the_lock() {
        let hub = hub(1, 1);
        let token: Arc<str> = Arc::from("a token");
        let waiter = hub.register(&token);
        let other = hub.register(&Arc::from("other"));
        hub.shared.deliver("a token ?");
        assert_eq!(waiter.next().now_or_never(), Some(None));
        assert_eq!(
            other.next().now_or_never(),
            None,
            "only the named waiter wakes"
        );
        hub.shared.deliver("a token 7");
        assert_eq!(
            waiter.next().now_or_never(),
            Some(Some(Grant::Granted { fence: 7 }))
        );
        hub.shared.deliver("a token !");
        assert_eq!(waiter.next().now_or_never(), Some(Some(Grant::FenceFailed)));
        hub.shared.deliver("nobody ?");
        assert_eq!(waiter.next().now_or_never(), None);
        drop((waiter, other));
        assert_eq!(hub.waiters(), 0);
    }
}
