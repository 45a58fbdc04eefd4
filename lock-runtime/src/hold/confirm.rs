//! Lazy confirmation of locks handed over on a claim.
//!
//! A hand-off gives the new holder the lock for its claim (`backend::CLAIM`, 3 s) rather than
//! its full ttl, so that a waiter that died just before it was handed the lock keeps it from no
//! one for long. The holder confirms its full ttl with one command — but not at once: most
//! sections are far shorter than the claim, and one released before the confirmation is due
//! needs none. It is due a third into the claim (when the watchdog would renew a lock of that
//! ttl), counted from before the attempt that last found the lock held, so it always leaves
//! two thirds of the claim for retries.
//!
//! They are scheduled on the `background` runtime, not the caller's: a body that blocks its
//! runtime's threads (CPU-bound work, a blocking call) must not keep the confirmation from
//! being sent, or the lock would be lost at the end of the claim while the body runs. One task
//! keeps them all, sleeping until the earliest due one: a process that takes thousands of
//! short sections a second schedules them without waking that task for each, and a released
//! lock is simply dropped from the list at the next wake-up.
//!
//! When the background runtime's connection fails (it may have none, and a process that can
//! open no new connection — Redis at `maxclients`, a proxy refusing clients — cannot make one),
//! the confirmation is also sent on the runtime the lock was acquired on, whose connection is
//! open.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use once_cell::sync::Lazy;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::hold::held::{Finder, Held};
use crate::support::retry::Backoff;
use crate::{LockError, LostCause};

/// The locks waiting for their confirmation, and the one task that sends them.
struct Confirmations {
    state: Mutex<State>,
    /// Wakes the task: a confirmation is due earlier than it sleeps.
    wake: Notify,
}

struct State {
    /// Each lock with when its confirmation is due, and the runtime it was acquired on.
    pending: Vec<(Instant, Arc<Held>, Option<Handle>)>,
    /// Until when the task sleeps (`None`: until woken).
    sleeps_until: Option<Instant>,
    /// The process whose background runtime runs the task, once started: a process forked
    /// from it has no such task (nor that runtime's thread), and starts its own.
    started_in: Option<u32>,
}

static CONFIRMATIONS: Lazy<Confirmations> = Lazy::new(|| Confirmations {
    state: Mutex::new(State {
        pending: Vec::new(),
        sleeps_until: None,
        started_in: None,
    }),
    wake: Notify::new(),
});

/// Confirms the full ttl of `held`, a lock handed over on a shorter claim, a third into that
/// claim — unless its guard is released (or the lock lost, or its ttl set) before then.
pub(crate) fn schedule(held: Arc<Held>) {
    let expiry = held.expiry();
    let due = expiry
        .valid_until
        .checked_sub(expiry.span * 2 / 3)
        .unwrap_or(expiry.valid_until);
    let caller = Handle::try_current().ok();
    let confirmations = &*CONFIRMATIONS;
    let wake = {
        let mut state = confirmations.state();
        let pid = std::process::id();
        if state.started_in != Some(pid) {
            if state.started_in.is_some() {
                // Forked: the locks pending are the parent's, which confirms them.
                state.pending.clear();
                state.sleeps_until = None;
            }
            state.started_in = Some(pid);
            crate::support::background::spawn(run(confirmations));
        }
        state.pending.push((due, held, caller));
        let wake = state.sleeps_until.is_none_or(|until| due < until);
        if wake {
            state.sleeps_until = Some(due);
        }
        wake
    };
    if wake {
        confirmations.wake.notify_one();
    }
}

impl Confirmations {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The task: drops the locks released meanwhile, confirms those due, sleeps until the next.
async fn run(confirmations: &'static Confirmations) {
    loop {
        let woken = confirmations.wake.notified();
        let now = Instant::now();
        let (due, next) = {
            let mut state = confirmations.state();
            state
                .pending
                .retain(|(_, held, _)| !held.is_closed() && !held.is_lost());
            let mut due = Vec::new();
            let mut index = 0;
            while index < state.pending.len() {
                if state.pending[index].0 <= now {
                    let (_, held, caller) = state.pending.swap_remove(index);
                    due.push((held, caller));
                } else {
                    index += 1;
                }
            }
            let next = state.pending.iter().map(|(at, _, _)| *at).min();
            state.sleeps_until = next;
            (due, next)
        };
        for (held, caller) in due {
            crate::support::background::spawn(confirm(held, caller));
        }
        match next {
            Some(next) => {
                tokio::select! {
                    () = tokio::time::sleep_until(next) => {}
                    () = woken => {}
                }
            }
            None => woken.await,
        }
    }
}

/// Confirms the lock's full ttl, retrying while its claim runs; if it still cannot, marks the
/// lock lost before the claim runs out (`extend`, `is_held` and `release` then report it), as
/// when a ttl runs out.
///
/// Sent here first, on the background runtime's connection. When that fails, it is also sent
/// on the runtime the lock was acquired on (`caller`), whose connection is open: the background
/// runtime may have none, and be unable to open one. Not the other way round: a confirmation
/// started on a caller runtime whose threads a body then blocks would hold the lock's ttl
/// changes (and so this one) until they are free again.
async fn confirm(held: Arc<Held>, caller: Option<Handle>) {
    let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(200));
    let mut on_caller: Option<JoinHandle<Result<(), LockError>>> = None;
    loop {
        match held.confirm().await {
            Ok(()) | Err(LockError::Lost { .. }) => return,
            Err(error) => {
                let expiry = held.expiry();
                let pause = backoff.next_pause();
                let margin = expiry.span / 20;
                if Instant::now() + pause + margin >= expiry.valid_until {
                    held.mark_lost(
                        LostCause::Unreachable,
                        "its hand-off could not be confirmed before the claim ran out",
                        Finder::Holder,
                    );
                    tracing::warn!(target: "distlock", key = %held.keys.lock, %error, "could not confirm a lock handed over");
                    return;
                }
                let resume = Instant::now() + pause;
                if on_caller.is_none() {
                    on_caller = caller.as_ref().map(|caller| {
                        let held = Arc::clone(&held);
                        caller.spawn(async move { held.confirm().await })
                    });
                }
                if let Some(task) = on_caller.as_mut() {
                    match tokio::time::timeout_at(resume, task).await {
                        Ok(Ok(Ok(()) | Err(LockError::Lost { .. }))) => return,
                        // Failed there too, or that runtime is gone: both are tried again.
                        Ok(_) => on_caller = None,
                        // Still on its way there (a busy runtime): looked at after the next try.
                        Err(_) => {}
                    }
                }
                tokio::time::sleep_until(resume).await;
                if held.is_closed() {
                    return;
                }
            }
        }
    }
}
