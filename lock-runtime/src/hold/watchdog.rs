//! Auto-extension: keeps a held lock alive while its holder works.
//!
//! Every ttl/3 the watchdog resets the lock's ttl, if it is still ours. It declares the lock
//! lost — and so cancels the holder's work — when an extension finds the lock gone (with the
//! cause the extension found), or when Redis cannot be reached before the lock's last known
//! expiry ([`LostCause::Unreachable`]; expired, when no renewal was even tried: the watchdog's
//! runtime was blocked past it). That expiry is counted from
//! when the last successful request was *sent*: Redis set it later than that, so the lock
//! really lives at least that long, and a holder that stops by then never overlaps the next.
//!
//! The schedule follows the lock's recorded expiry ([`Held::expiry`]), not a clock of its own:
//! when the holder calls `extend` itself — to a shorter ttl, say — the watchdog wakes, renews to
//! that ttl from then on, and gives up by that expiry.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::hold::held::{Finder, Held};
use crate::{LockError, LostCause};

/// Runs until the lock is lost; the guard aborts it on release or drop.
pub(crate) async fn keep_alive(held: Arc<Held>) {
    // After a failed renewal: not before this instant again.
    let mut retry_at: Option<Instant> = None;
    // Whether the last renewal failed or ran out of time: a lock given up then was lost for
    // want of Redis. Without one, the watchdog itself ran too late (a runtime whose threads
    // something blocked), and the lock simply expired.
    let mut failed = false;
    loop {
        let changed = held.changed();
        let expiry = held.expiry();
        // Stop this much before the computed expiry: room for clock-rate differences between
        // this host and Redis, and for the holder to notice.
        let margin = (expiry.span / 20).max(Duration::from_millis(1));
        let give_up = expiry
            .valid_until
            .checked_sub(margin)
            .unwrap_or(expiry.valid_until);
        let now = Instant::now();
        if now >= give_up {
            if failed {
                held.mark_lost(
                    LostCause::Unreachable,
                    "Redis could not be reached before the lock expired",
                    Finder::Watchdog,
                );
            } else {
                held.mark_lost(
                    LostCause::Expired,
                    "the watchdog ran too late to renew it: its runtime was blocked",
                    Finder::Watchdog,
                );
            }
            return;
        }
        // A third of the ttl after the last confirmed renewal; earlier when a change that may
        // have shortened the lock is unconfirmed.
        let mut due = expiry
            .valid_until
            .checked_sub(expiry.span * 2 / 3)
            .unwrap_or(now);
        if let Some(retry_at) = retry_at {
            due = due.max(retry_at);
        }
        let due = due.min(give_up);
        if now < due {
            tokio::select! {
                () = tokio::time::sleep_until(due) => {}
                () = changed => {}
            }
            // Look again: the expiry may have changed, or this may be a spurious wake-up.
            continue;
        }
        match tokio::time::timeout(give_up - now, held.set_ttl(None, Finder::Watchdog)).await {
            Ok(Ok(())) => {
                retry_at = None;
                failed = false;
                tracing::trace!(target: "distlock", key = %held.keys.lock, "auto-extended");
            }
            Ok(Err(LockError::Lost { .. })) => return,
            Ok(Err(error)) => {
                tracing::debug!(target: "distlock", key = %held.keys.lock, %error, "extension failed; retrying");
                retry_at = Some(Instant::now() + (expiry.span / 12).max(Duration::from_millis(1)));
                failed = true;
            }
            // The budget ran out: the next turn of the loop declares the lock lost.
            Err(_) => failed = true,
        }
    }
}
