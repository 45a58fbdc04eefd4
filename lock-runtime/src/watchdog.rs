//! Auto-extension: keeps a held lock alive while its holder works.
//!
//! Every ttl/3 the watchdog resets the lock's ttl, if it is still ours. It declares the lock
//! lost — and so cancels the holder's work — when an extension finds the lock gone, or when
//! Redis cannot be reached before the lock's last known expiry. That expiry is counted from
//! when the last successful request was *sent*: Redis set it later than that, so the lock
//! really lives at least that long, and a holder that stops by then never overlaps the next.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::guard::Held;

/// Runs until the lock is lost; the guard aborts it on release or drop.
pub(crate) async fn run(held: Arc<Held>, ttl: Duration, acquired_at: Instant) {
    let ttl_millis = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    let period = ttl / 3;
    // Stop this much before the computed expiry: room for clock-rate differences between this
    // host and Redis, and for the holder to notice.
    let margin = (ttl / 20).max(Duration::from_millis(1));
    let mut valid_until = acquired_at + ttl;
    let mut next = acquired_at + period;
    loop {
        tokio::time::sleep_until(next).await;
        let sent = Instant::now();
        let budget = valid_until
            .checked_duration_since(sent + margin)
            .unwrap_or_default();
        if budget.is_zero() {
            held.mark_lost("Redis could not be reached before the lock expired");
            return;
        }
        let extension = held
            .manager
            .backend()
            .extend(&held.keys, &held.token, ttl_millis);
        match tokio::time::timeout(budget, extension).await {
            Ok(Ok(true)) => {
                tracing::trace!(target: "distlock", key = %held.keys.lock, "auto-extended");
                valid_until = sent + ttl;
                next = sent + period;
            }
            Ok(Ok(false)) => {
                held.mark_lost("an extension found it expired or taken");
                return;
            }
            Ok(Err(error)) => {
                tracing::debug!(target: "distlock", key = %held.keys.lock, %error, "extension failed; retrying");
                let retry = Instant::now() + (period / 4).max(Duration::from_millis(1));
                // Never sleep past the point where the lock must be given up.
                next = retry.min(valid_until.checked_sub(margin).unwrap_or(valid_until));
            }
            Err(_) => {
                // The budget ran out: the next turn of the loop declares the lock lost.
                next = Instant::now();
            }
        }
    }
}
