//! Deadlock detection's decisions, without I/O or clock: when a waiter that holds locks looks
//! for a wait-for cycle, how a walk follows the holders' wait records (`backend::waits`) from
//! the lock it wants, and when a cycle is reported and by whom. The walking itself (one look
//! per hop) is `manager::deadlock`'s.
//!
//! - **When.** Not before [`FIRST_WALK`] of waiting (short waits cost nothing), then every
//!   [`WALK_EVERY`]. Each walk renews the waiter's own records first.
//! - **A walk** ([`Walk`]) starts at the lock wanted: a look gives its holder and that holder's
//!   wait; the next lock is the one that holder waits for. It ends with a cycle when a holder
//!   is this waiter (one of its tokens), and without one at a free lock, a holder that does
//!   not wait (or whose wait is not recorded), a lock seen before in this walk (a cycle that
//!   does not pass through this waiter: its own members report it), or after [`MAX_HOPS`].
//! - **A report** ([`Detection::walked`]) needs two walks in a row to find the same cycle —
//!   the same locks, holder tokens and wait ids. Tokens are unique per acquisition and wait
//!   ids per wait, so each edge existed throughout the time between the walks, and all of
//!   them at once: the cycle is real, not a chain that was moving (docs/deadlocks.md).
//! - **The victim** is the member whose wait began last (ties: the greatest wait id). Every
//!   member reads the same records, so all pick the same one; only it reports.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::waits::{Hop, WaitRecord};

/// How long a waiter that holds locks waits before its first walk.
pub(crate) const FIRST_WALK: Duration = Duration::from_millis(400);
/// How often it walks after that.
pub(crate) const WALK_EVERY: Duration = Duration::from_millis(700);
/// The longest chain followed: a longer cycle is not reported (its waiters time out).
pub(crate) const MAX_HOPS: usize = 16;

/// One edge of a wait-for cycle: a lock and its holder, with the holder's wait (`None` for
/// the last edge, a lock of this waiter, whose wait is the one walking).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Edge {
    pub(crate) lock: String,
    pub(crate) holder: String,
    pub(crate) wait: Option<WaitRecord>,
}

/// This waiter, as the victim's choice sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Waiter {
    pub(crate) wait_id: String,
    pub(crate) since_ms: u64,
    /// Its tokens: one per lock it holds.
    pub(crate) tokens: Vec<Arc<str>>,
}

/// What to do after a look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Look at this lock.
    Look(String),
    /// The chain came back to this waiter.
    Cycle(Vec<Edge>),
    /// No cycle through this waiter now.
    End,
}

/// One walk in progress.
#[derive(Debug)]
pub(crate) struct Walk {
    edges: Vec<Edge>,
}

impl Walk {
    /// A walk from the lock wanted; the driver looks at it first.
    pub(crate) fn new() -> Self {
        Walk { edges: Vec::new() }
    }

    /// The look at `lock` found `hop`.
    pub(crate) fn looked(&mut self, waiter: &Waiter, lock: &str, hop: Hop) -> Next {
        let Some(holder) = hop.holder else {
            return Next::End;
        };
        if waiter.tokens.iter().any(|token| **token == *holder) {
            self.edges.push(Edge {
                lock: lock.to_owned(),
                holder,
                wait: None,
            });
            return Next::Cycle(std::mem::take(&mut self.edges));
        }
        let Some(wait) = hop.wait else {
            return Next::End;
        };
        let next = wait.waits_for.clone();
        self.edges.push(Edge {
            lock: lock.to_owned(),
            holder,
            wait: Some(wait),
        });
        if self.edges.len() >= MAX_HOPS || self.edges.iter().any(|edge| edge.lock == next) {
            return Next::End;
        }
        Next::Look(next)
    }
}

/// What a walk's result means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Go on waiting; walk again at [`Detection::walk_at`].
    Wait,
    /// This waiter is the cycle's victim: fail with `LockError::Deadlock` naming these edges.
    Report(Vec<Edge>),
}

/// One waiter's detection.
#[derive(Debug)]
pub(crate) struct Detection {
    waiter: Waiter,
    walk_at: Instant,
    /// The cycle the last walk found.
    last: Option<Vec<Edge>>,
}

impl Detection {
    /// A waiter whose wait began at `started`.
    pub(crate) fn new(waiter: Waiter, started: Instant) -> Self {
        Detection {
            waiter,
            walk_at: started + FIRST_WALK,
            last: None,
        }
    }

    pub(crate) fn waiter(&self) -> &Waiter {
        &self.waiter
    }

    /// When to renew the records and walk next.
    pub(crate) fn walk_at(&self) -> Instant {
        self.walk_at
    }

    /// A walk ended at `now`, with `cycle` (`None`: none found, or the walk failed).
    pub(crate) fn walked(&mut self, now: Instant, cycle: Option<Vec<Edge>>) -> Verdict {
        self.walk_at = now + WALK_EVERY;
        let confirmed = cycle.is_some() && cycle == self.last;
        self.last = cycle;
        match &self.last {
            Some(edges) if confirmed && self.is_victim(edges) => Verdict::Report(edges.clone()),
            _ => Verdict::Wait,
        }
    }

    /// Whether this waiter's wait began last of the cycle's (ties: the greatest wait id).
    fn is_victim(&self, edges: &[Edge]) -> bool {
        let mine = (self.waiter.since_ms, self.waiter.wait_id.as_str());
        edges
            .iter()
            .filter_map(|edge| edge.wait.as_ref())
            .all(|wait| (wait.since_ms, wait.wait_id.as_str()) < mine)
    }
}

#[cfg(test)]
mod tests;
