//! Deadlock detection's decisions, without I/O or clock: when a waiter that holds locks looks
//! for a wait-for cycle, how a walk follows the holders' wait records (`backend::waits`) from
//! the locks it wants, and when a cycle is reported and by whom. The looks themselves (one
//! command each) are `manager::deadlock`'s.
//!
//! - **When.** Not before [`FIRST_WALK`] of waiting (short waits cost nothing), then every
//!   [`WALK_EVERY`]. Each walk renews the waiter's own records first.
//! - **A walk** ([`Walk`]) is a depth-first search from the locks wanted over every edge: a
//!   look at a lock gives its holders (a mutex's one, or a read lock's readers) and each
//!   holder's waits; each wait leads to the lock it waits for. It ends with a cycle when a
//!   holder is this waiter (one of its tokens) at the end of a path — a lock wanted that the
//!   waiter holds already (a multi-key acquisition's, handed to it meanwhile) is no path, nor
//!   ends one that began at a wanted lock sorting before it; and a multi-key acquisition's
//!   hold of one of its names waits only for the names after it (`multi_key_hold`) —
//!   and without one when every path ended — at a
//!   free lock, a holder that does not wait (or whose wait is not recorded), a lock already
//!   looked at in this walk (a cycle that does not pass through this waiter: its own members
//!   report it), a path of [`MAX_HOPS`] locks — or after [`MAX_LOOKS`] looks.
//! - **A report** ([`Detection::walked`]) needs two walks in a row to find the same cycle —
//!   the same locks, holder tokens and wait ids. Tokens are unique per acquisition and wait
//!   ids per wait, so each edge existed throughout the time between the walks, and all of
//!   them at once: the cycle is real, not a chain that was moving (docs/deadlocks.md). The
//!   search visits holders and waits in a fixed order, so two walks over the same records
//!   find the same cycle first.
//! - **The victim** is the member whose wait began last (ties: the greatest wait id). Every
//!   member reads the same records, so all pick the same one; only it reports.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::waits::{Holder, Seen, WaitRecord};

/// How long a waiter that holds locks waits before its first walk.
pub(crate) const FIRST_WALK: Duration = Duration::from_millis(400);
/// How often it walks after that.
pub(crate) const WALK_EVERY: Duration = Duration::from_millis(700);
/// The longest chain followed: a longer cycle is not reported (its waiters time out).
pub(crate) const MAX_HOPS: usize = 16;
/// The most looks of one walk (one command each): a wider wait graph is searched only this far.
pub(crate) const MAX_LOOKS: usize = 32;

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

/// One walk in progress: the paths still to follow, deepest last.
#[derive(Debug)]
pub(crate) struct Walk {
    /// The locks wanted (full keys).
    wanted: Vec<String>,
    /// Locks to look at, each with the edges that led to it (empty for a lock wanted).
    pending: Vec<(String, Vec<Edge>)>,
    /// The locks looked at so far.
    looked: HashSet<String>,
    /// The path of the look in progress.
    current: Vec<Edge>,
}

impl Walk {
    /// A walk from the locks wanted, first of `wanted` first.
    pub(crate) fn new(wanted: &[String]) -> Self {
        Walk {
            wanted: wanted.to_vec(),
            pending: wanted
                .iter()
                .rev()
                .map(|lock| (lock.clone(), Vec::new()))
                .collect(),
            looked: HashSet::new(),
            current: Vec::new(),
        }
    }

    /// The next lock to look at; `None` when the walk is over without a cycle.
    pub(crate) fn next_look(&mut self) -> Option<String> {
        if self.looked.len() >= MAX_LOOKS {
            return None;
        }
        while let Some((lock, path)) = self.pending.pop() {
            if !self.looked.contains(&lock) {
                self.current = path;
                return Some(lock);
            }
        }
        None
    }

    /// The look at `lock` (the one [`next_look`](Self::next_look) gave) found `seen`: the
    /// cycle through `waiter`, if that closes one; else the paths it opens are queued.
    pub(crate) fn looked(&mut self, waiter: &Waiter, lock: &str, seen: &Seen) -> Option<Vec<Edge>> {
        let path = std::mem::take(&mut self.current);
        let mine = seen
            .holders
            .iter()
            .find(|holder| waiter.tokens.iter().any(|token| **token == *holder.token));
        if let Some(mine) = mine {
            // A lock wanted that this waiter holds already (handed to a multi-key acquisition
            // while it waits for the rest, or taken one by one): no wait to follow, and no
            // cycle of its own. Nor is a path from a wanted lock that sorts before it: the
            // acquisition holds such a lock only while every name before it is its own or
            // free, and gives it back at its next look once one is taken (see
            // `multi_key_hold`). Not marked looked at: another path may still end at it.
            let held_meanwhile = self.wanted.iter().any(|wanted| wanted == lock);
            let before = path.first().is_some_and(|first| first.lock.as_str() < lock);
            if path.is_empty() || (held_meanwhile && before) {
                return None;
            }
            self.looked.insert(lock.to_owned());
            let mut cycle = path;
            cycle.push(Edge {
                lock: lock.to_owned(),
                holder: mine.token.clone(),
                wait: None,
            });
            return Some(cycle);
        }
        self.looked.insert(lock.to_owned());
        if path.len() + 1 >= MAX_HOPS {
            return None;
        }
        // Queued in reverse, so that the first holder's first wait is followed first.
        for holder in seen.holders.iter().rev() {
            for wait in holder.waits.iter().rev() {
                let next = &wait.waits_for;
                if next == lock || path.iter().any(|edge| edge.lock == *next) {
                    continue;
                }
                if next.as_str() < lock && multi_key_hold(holder, wait, lock) {
                    continue;
                }
                let mut longer = path.clone();
                longer.push(Edge {
                    lock: lock.to_owned(),
                    holder: holder.token.clone(),
                    wait: Some(wait.clone()),
                });
                self.pending.push((next.clone(), longer));
            }
        }
        None
    }
}

/// Whether `holder` holds `lock` as one of the names of the multi-key acquisition whose wait
/// `wait` is (that wait also waits for `lock`: a key it holds while it waits for the rest).
/// Such a hold waits for the names after `lock` only. The names are taken in byte order of
/// their full keys: one by one, every name before `lock` was taken before it; by one script,
/// a key is kept only while every name before it is the waiter's or free, and once one of
/// those is taken by another, the waiter's next look gives `lock` back (to the first waiter
/// of its line) and waits for that name instead. Either way it never waits for an earlier
/// name while holding `lock`: a record saying so would close a cycle that its next look
/// breaks.
fn multi_key_hold(holder: &Holder, wait: &WaitRecord, lock: &str) -> bool {
    holder
        .waits
        .iter()
        .any(|other| other.wait_id == wait.wait_id && other.waits_for == lock)
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

    /// The waiter holds the locks of `tokens` now (a multi-key acquisition takes more as it
    /// goes).
    pub(crate) fn holds(&mut self, tokens: Vec<Arc<str>>) {
        self.waiter.tokens = tokens;
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
