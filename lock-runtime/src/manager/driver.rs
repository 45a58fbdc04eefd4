//! The driver of an acquisition that waits: it performs the I/O the state machine
//! (`machine`) asks for — attempts, the subscription, sleeps, a confirmation — and feeds back
//! what happened, with the time. It decides nothing of the protocol.

use std::sync::Arc;

use tokio::time::Instant;

use crate::acquire::machine::{
    Acquisition, Confirmation, Messages, Outcome, Step, Subscribed, Terms, Via, Won,
};
use crate::acquire::queue::Turn;
use crate::backend::grants::{Grant, GrantWaiter};
use crate::backend::keys::{Kind, LockKeys};
use crate::backend::{Attempt, Taken, Wait};
use crate::guard::Acquired;
use crate::manager::attempt::{fence_failed, local_line, new_token, timeout};
use crate::manager::place::PlaceInLine;
use crate::support::cold;
use crate::support::retry::jitter;
use crate::support::units::micros;
use crate::{LockError, LockGuard, LockManager, LockOptions};

impl LockManager {
    /// [`LockManager::acquire`], without its metrics.
    pub(crate) async fn acquire_waiting(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        let (ttl_millis, keys) = self.prepare(name, options)?;
        self.acquire_keys(ttl_millis, keys, options).await
    }

    /// [`LockManager::acquire_waiting`] of the lock (or locks taken together) `keys`, checked
    /// by `prepare`.
    pub(crate) async fn acquire_keys(
        &self,
        ttl_millis: u64,
        keys: LockKeys,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        let started = Instant::now();
        let deadline = started + options.timeout_duration();
        // The usual case, nobody else here wants this key, needs no timer.
        let (turn, turn_came) = match self.inner.queues.try_turn(&local_line(&keys)) {
            Some(turn) => (turn, started),
            None => (
                // Boxed, as the other steps of a contended acquisition: the future every
                // acquisition carries stays the size of its first attempt's.
                cold::boxed(|| self.wait_turn(&keys, deadline, started)).await?,
                Instant::now(),
            ),
        };
        let backend = &self.inner.backend;
        let mut machine = Acquisition::new(self.terms(&keys, deadline, options));
        let token = new_token(options, self.inner.pid);
        // Contended: handed over a moment ago, and subscribing works (a join waits for it).
        let step = machine.start(turn_came, || {
            backend.recently_contended(&keys.lock) && !backend.grants().subscription_failing()
        });
        // The usual case again: a first try, which takes a free lock. Its attempt is made here,
        // and the rest of the acquisition (`wait_in_line`, with what a waiter keeps) boxed, so
        // that an uncontended acquisition carries and runs no more than its one attempt.
        let next = match step {
            Step::Attempt => {
                let sent = Instant::now();
                let wait = machine.request(sent, || backend.grants().is_subscribed());
                let first_try = matches!(wait, Wait::FirstTry);
                let fencing = options.fencing_enabled();
                match self.attempt(&keys, &token, ttl_millis, fencing, wait).await {
                    Ok(Attempt::Acquired { fence, expires_in }) => {
                        let outcome = Outcome::Acquired { fence, expires_in };
                        Next::Step(machine.attempted(Instant::now(), outcome))
                    }
                    attempt => Next::Attempted { first_try, attempt },
                }
            }
            step => Next::Step(step),
        };
        let holding = Holding {
            keys,
            token,
            turn,
            started,
        };
        match next {
            // A first try's lock has nothing to tidy: no place, no hand-off.
            Next::Step(Step::Acquired(won)) if won.via == Via::FirstTry => {
                Ok(self.won(holding, &won, options))
            }
            next => {
                cold::boxed(|| self.wait_in_line(ttl_millis, holding, machine, next, options)).await
            }
        }
    }

    /// The rest of an acquisition whose first step did not take the lock: the loop that performs
    /// each step `machine` asks for, from `next`, until the lock is won or the acquisition ends.
    async fn wait_in_line(
        &self,
        ttl_millis: u64,
        holding: Holding,
        mut machine: Acquisition,
        next: Next,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        let Holding {
            keys,
            mut token,
            turn,
            started,
        } = holding;
        let backend = &self.inner.backend;
        let fencing = options.fencing_enabled();
        // Where this waiter listens, once it does; and its place in line, left if it gives up.
        let mut listener: Option<GrantWaiter> = None;
        let mut place = PlaceInLine::new(self, &keys);
        let mut last_error = None;
        let mut step = match next {
            Next::Step(step) => step,
            Next::Attempted { first_try, attempt } => {
                let outcome = self.outcome(&keys, first_try, attempt, &mut last_error);
                machine.attempted(Instant::now(), outcome)
            }
        };
        loop {
            step = match step {
                Step::Attempt => {
                    // Listen before asking: a message published while the attempt is in flight
                    // must still wake us; one from before is superseded by the attempt's answer.
                    // A message cleared here may have been a hand-off to this place, whose claim
                    // ran out unseen: the place is off the line, and its renewal looks for it.
                    if listener.as_ref().is_some_and(GrantWaiter::clear) {
                        backend.place_may_be_gone(&keys.lock, &token);
                    }
                    let sent = Instant::now();
                    let wait = machine.request(sent, || backend.grants().is_subscribed());
                    if machine.holds_place() {
                        place.occupy(&token);
                    }
                    let first_try = matches!(wait, Wait::FirstTry);
                    let attempt = self.attempt(&keys, &token, ttl_millis, fencing, wait).await;
                    let outcome = self.outcome(&keys, first_try, attempt, &mut last_error);
                    machine.attempted(Instant::now(), outcome)
                }
                Step::NewToken => {
                    // The failed attempt may still run (see `attempt`) and is cleaned up by its
                    // token: go on under a new one, listening for that one.
                    place.give_up();
                    listener = None;
                    token = new_token(options, self.inner.pid);
                    machine.rotated(Instant::now())
                }
                Step::Subscribe { until } => {
                    let (registered, subscribed) = self.subscribe(&keys, &token, until).await;
                    let next = machine.subscribed(subscribed, registered.channel());
                    listener = machine.listening().then_some(registered);
                    next
                }
                Step::Sleep { until, spread } => {
                    let until = (until + jitter(spread)).min(machine.deadline());
                    let message = self.sleep(&keys, &token, listener.as_ref(), until).await;
                    machine.woke(Instant::now(), message)
                }
                Step::Confirm => {
                    let sent = Instant::now();
                    let confirmed = backend.confirm_replicated(&keys, &token, ttl_millis).await;
                    let confirmation = match confirmed {
                        Ok(true) => Confirmation::Ours,
                        Ok(false) => Confirmation::Doubtful,
                        Err(error) => {
                            // Given back, place and all, or maybe not ours: the next look takes
                            // a new place at the end of the line.
                            backend.place_may_be_gone(&keys.lock, &token);
                            let given_back = error.gave_the_lock_back();
                            last_error = Some(error);
                            if given_back {
                                Confirmation::GivenBack
                            } else {
                                Confirmation::Doubtful
                            }
                        }
                    };
                    machine.confirmed(sent, Instant::now(), confirmation)
                }
                Step::Acquired(won) => {
                    place.vacate();
                    if won.via != Via::FirstTry {
                        backend.handed_over(&keys.lock);
                        if keys.kind == Kind::Read {
                            self.let_readers_in(&keys, &token, ttl_millis).await;
                        }
                    }
                    let holding = Holding {
                        keys,
                        token,
                        turn,
                        started,
                    };
                    return Ok(self.won(holding, &won, options));
                }
                Step::FenceFailed => {
                    place.give_up();
                    return Err(fence_failed(&keys).into());
                }
                Step::TimedOut => {
                    place.give_up();
                    return Err(timeout(&keys, started));
                }
                Step::Failed => {
                    place.give_up();
                    return Err(last_error.map_or_else(|| timeout(&keys, started), LockError::from));
                }
            };
        }
    }

    /// The guard of the lock `won` by the acquisition `holding`.
    fn won(&self, holding: Holding, won: &Won, options: &LockOptions) -> LockGuard {
        let Holding {
            keys,
            token,
            turn,
            started,
        } = holding;
        log_acquired(&keys, won, started);
        let acquired = Acquired {
            keys,
            token,
            fence: won.fence,
            turn,
            since: won.since,
            expires_in: won.expires_in,
            taken: taken_by(won.via),
        };
        LockGuard::acquired(&self.inner, acquired, options)
    }

    /// Waits for this acquisition's turn among the tasks of this process that want the key.
    async fn wait_turn(
        &self,
        keys: &LockKeys,
        deadline: Instant,
        started: Instant,
    ) -> Result<Turn, LockError> {
        let waiting = self.inner.queues.wait_turn(&keys.lock);
        tokio::time::timeout_at(deadline, waiting)
            .await
            .map_err(|_| timeout(keys, started))
    }

    /// What an acquisition with `options` until `deadline` is asked to do on this store.
    fn terms(&self, keys: &LockKeys, deadline: Instant, options: &LockOptions) -> Terms {
        let backend = &self.inner.backend;
        // Locks taken together are handed over one key at a time: a message only says to look.
        let hands_over = backend.capabilities().hands_over && keys.together.is_none();
        Terms {
            deadline,
            one_attempt: options.timeout_duration().is_zero(),
            renew: Some(crate::backend::RENEW),
            ttl: options.ttl_duration(),
            fencing: options.fencing_enabled(),
            messages: if !hands_over {
                Messages::WakeUp
            } else if backend.capabilities().waits_for_replicas {
                Messages::ReplicatedHandOff
            } else {
                Messages::HandOff
            },
        }
    }

    /// What `attempt` (a `first_try` or not) tells the machine; an error is kept in `last_error`.
    fn outcome(
        &self,
        keys: &LockKeys,
        first_try: bool,
        attempt: crate::backend::failure::Result<Attempt>,
        last_error: &mut Option<crate::backend::Failure>,
    ) -> Outcome {
        let error = match attempt {
            Ok(Attempt::Acquired { fence, expires_in }) => {
                return Outcome::Acquired { fence, expires_in };
            }
            Ok(Attempt::Held { remaining }) => {
                if first_try {
                    tracing::debug!(target: "distlock", key = %keys.lock, remaining_ms = remaining.map(micros).map(|us| us / 1000), "contended; waiting");
                }
                return Outcome::Held { remaining };
            }
            Err(error) => error,
        };
        let permanent = error.is_permanent();
        if !permanent {
            tracing::debug!(target: "distlock", key = %keys.lock, %error, "Redis error while acquiring; retrying");
        }
        let kept = self
            .inner
            .backend
            .capabilities()
            .keeps_place_through(&error);
        *last_error = Some(error);
        if kept {
            Outcome::Interrupted
        } else {
            Outcome::Failed { permanent }
        }
    }

    /// Registers `token` for its messages — before its place is taken: a message published
    /// right after it must reach the waiter — and waits for the subscription until `until`.
    async fn subscribe(
        &self,
        keys: &LockKeys,
        token: &Arc<str>,
        until: Instant,
    ) -> (GrantWaiter, Subscribed) {
        let grants = self.inner.backend.grants();
        let registered = grants.register(token);
        let subscribed = match tokio::time::timeout_at(until, grants.subscribed()).await {
            Ok(Ok(())) => Subscribed::Confirmed,
            Ok(Err(error)) => {
                tracing::debug!(target: "distlock", key = %keys.lock, %error, "no wake-up subscription; polling");
                Subscribed::Failed
            }
            Err(_) => {
                tracing::debug!(target: "distlock", key = %keys.lock, "wake-up subscription not confirmed yet");
                Subscribed::Unconfirmed
            }
        };
        (registered, subscribed)
    }

    /// Sleeps until `until`, or until a message to the waiter while it listens.
    async fn sleep(
        &self,
        keys: &LockKeys,
        token: &str,
        listener: Option<&GrantWaiter>,
        until: Instant,
    ) -> Option<Grant> {
        let Some(listener) = listener else {
            tokio::time::sleep_until(until).await;
            return None;
        };
        tokio::select! {
            () = tokio::time::sleep_until(until) => None,
            message = listener.next() => {
                // A hand-off takes the place off the line, and a lost connection may have lost
                // one: unless the lock turns out ours, the next renewal looks for the place.
                if !matches!(message, Some(Grant::FenceFailed)) {
                    self.inner.backend.place_may_be_gone(&keys.lock, token);
                }
                message
            }
        }
    }
}

/// What an acquisition carries from its first step to the guard: the keys it takes, the token
/// it asks under, its turn in this process, and when it was called.
struct Holding {
    keys: LockKeys,
    token: Arc<str>,
    turn: Turn,
    started: Instant,
}

/// Where an acquisition's loop starts: the step the machine asked for, or what the first try
/// (sent as one when `first_try`) came back with.
enum Next {
    Step(Step),
    Attempted {
        first_try: bool,
        attempt: crate::backend::failure::Result<Attempt>,
    },
}

/// How a lock won `via` was taken, for its release: only a first try's writes nothing else.
fn taken_by(via: Via) -> Taken {
    if via == Via::FirstTry {
        Taken::FirstTry
    } else {
        Taken::Otherwise
    }
}

fn log_acquired(keys: &LockKeys, won: &Won, started: Instant) {
    let (waited_us, fence) = (micros(started.elapsed()), won.fence);
    match won.via {
        Via::FirstTry | Via::Line => {
            tracing::debug!(target: "distlock", key = %keys.lock, waited_us, fence, "acquired");
        }
        Via::HandOff => {
            tracing::debug!(target: "distlock", key = %keys.lock, waited_us, fence, "acquired (handed over)");
        }
        Via::Confirmed => {
            tracing::debug!(target: "distlock", key = %keys.lock, waited_us, fence, "acquired (handed over, replicated)");
        }
    }
}
