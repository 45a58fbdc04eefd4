//! What a lock manager recently learned of each lock key, kept for a while and for at most
//! [`CONTENDED_KEYS`] keys: a hint, never a table of every key.
//!
//! - Whether the key was just handed over (by this manager's release, or to one of its
//!   acquisitions): its next acquisition skips the first try, which would most likely find it
//!   held.
//! - The last place in the key's line that the acquire script gave one of this manager's
//!   waiters: a join within a renewal of it can take a place in one command
//!   (`Backend::join_behind`), and its deadline dates Redis's clock for a release
//!   ([`Contended::redis_clock`]).
//! - The entry in the key's line of this manager's waiter (one at most: the tasks of a process
//!   that want one key line up in the process, and only the first takes a place in Redis's
//!   line), and the lease its last renewal was given: its next renewal passes both, and costs
//!   Redis the same however long the line (see `scripts::ACQUIRE`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::{LEASE, RENEW};
use crate::support::units::millis;

/// How long a key stays known as contended after a hand-off: its next acquisition in this
/// manager joins the line at once instead of sending a plain `SET NX` first.
const CONTENDED_FOR: Duration = Duration::from_secs(1);
/// At most this many keys are remembered as contended (beyond it, none is added until the
/// expired ones are dropped), and places in line for at most this many keys (beyond it, the
/// oldest place gives way): a hint, never a table of every key.
const CONTENDED_KEYS: usize = 256;

/// A place in a lock's line on Redis (its deadline in Redis time) that the acquire script gave
/// one of this manager's waiters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RedisPlace {
    /// Its lease deadline, Redis time in ms.
    pub(crate) deadline: u64,
    /// Whether it was first in line, the line being empty before it.
    pub(crate) first: bool,
    /// What became of the waiter's entry.
    pub(crate) written: Written,
}

/// What a look in line did with the waiter's entry (see `scripts::ACQUIRE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    /// Left as it was: the place's lease was renewed in the lease table.
    Lease,
    /// Written anew with the place's deadline and the channel the look named, and the lease
    /// recorded in the lease table too.
    EntryAndLease,
    /// Written anew, no lease recorded: a join.
    Entry,
}

/// This manager's waiter's entry in a lock's line, as it knows it.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// The waiter's token.
    pub(crate) token: Arc<str>,
    /// The entry exactly as it was written.
    pub(crate) text: String,
    /// The lease deadline its last renewal was given (the score it left in the lease table);
    /// `None`: none since the entry was written, or the place may have been handed on.
    pub(crate) lease: Option<u64>,
}

impl Entry {
    /// The grant channel the entry names (empty: none).
    pub(crate) fn channel(&self) -> &str {
        self.text.splitn(5, ' ').nth(4).unwrap_or("")
    }
}

/// The latest place the acquire script gave one of this manager's waiters in a lock's line.
#[derive(Debug, Clone, Copy)]
struct Given {
    place: RedisPlace,
    /// When the command was sent: Redis read its clock for the deadline after this.
    asked: Instant,
    /// When its answer came: Redis had read its clock before this.
    answered: Instant,
}

/// How long a place's reading of Redis's clock stands for the clock: a monotonic clock and
/// Redis's agree to a few milliseconds over this long, unless Redis's is stepped.
const CLOCK_READING_FOR: Duration = Duration::from_secs(60);

/// The keys this manager recently saw handed over (by its release, or to its acquisition):
/// their next acquisition skips the first try, which would most likely find them held. And for
/// each key, the latest place in its line that the acquire script gave this manager: a join
/// within a renewal of it can take a place in one command (see `Backend::join_behind`), and its
/// deadline dates Redis's clock for a release (see `Backend::redis_clock`).
#[derive(Default)]
pub(crate) struct Contended {
    keys: Mutex<HashMap<Arc<str>, Instant>>,
    places: Mutex<HashMap<Arc<str>, Given>>,
    entries: Mutex<HashMap<Arc<str>, Entry>>,
}

impl Contended {
    fn keys(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Instant>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn mark(&self, key: &Arc<str>) {
        let now = Instant::now();
        let mut keys = self.keys();
        if keys.len() >= CONTENDED_KEYS && !keys.contains_key(key) {
            keys.retain(|_, until| *until > now);
            if keys.len() >= CONTENDED_KEYS {
                return;
            }
        }
        keys.insert(Arc::clone(key), now + CONTENDED_FOR);
    }

    pub(crate) fn forget(&self, key: &str) {
        let mut keys = self.keys();
        if !keys.is_empty() {
            keys.remove(key);
        }
    }

    fn places(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Given>> {
        self.places.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The acquire script gave a waiter of ours `place` in `key`'s line: in answer to a command
    /// sent at `asked`, answered at `answered`.
    pub(crate) fn place_given(
        &self,
        key: &Arc<str>,
        place: RedisPlace,
        asked: Instant,
        answered: Instant,
    ) {
        let mut places = self.places();
        if places.len() >= CONTENDED_KEYS && !places.contains_key(key) {
            places.retain(|_, given| given.answered.elapsed() < CLOCK_READING_FOR);
            // Still full: the oldest place gives way. The newest is the one a join in one
            // command can use, and its reading of the clock the one its release will want.
            if places.len() >= CONTENDED_KEYS {
                let oldest = places
                    .iter()
                    .min_by_key(|(_, given)| given.answered)
                    .map(|(key, _)| Arc::clone(key));
                if let Some(oldest) = oldest {
                    places.remove(&oldest);
                }
            }
        }
        let given = Given {
            place,
            asked,
            answered,
        };
        places.insert(Arc::clone(key), given);
    }

    /// The lease deadline of the place given for `key` less than a renewal ago, if any, and if
    /// that place was behind another waiter when given. A live waiter renews its place within a
    /// renewal, so a place given that deadline now lapses no sooner than one that Redis had just
    /// given the clock's time plus a lease, less a renewal. A place that was first in line says
    /// that the line was empty then, as it is again when the same few processes take turns
    /// (two: the one handed the lock was the whole line): a join in one command would most
    /// likely find no line, and cost a command for nothing.
    pub(crate) fn recent_place(&self, key: &str) -> Option<u64> {
        self.places()
            .get(key)
            .filter(|given| given.asked.elapsed() < RENEW && !given.place.first)
            .map(|given| given.place.deadline)
    }

    /// Redis's clock now on the server of `key`'s line, in ms, as the last place given there
    /// dates it: Redis read its clock for that place's deadline (a lease before it) before the
    /// answer came, and has counted about as long since as this process has. `None` without a
    /// place given in the last minute. A release takes a waiter whose lease runs past it for
    /// live without reading `TIME`, and reads `TIME` before it skips one (see
    /// `scripts::LINE_PRELUDE`): a reading that is off — from another server's clock, after a
    /// failover or a slot move — costs a `TIME`, never a live waiter's place.
    pub(crate) fn redis_clock(&self, key: &str) -> Option<u64> {
        let given = *self.places().get(key)?;
        let since = given.answered.elapsed();
        if since >= CLOCK_READING_FOR {
            return None;
        }
        let read = given.place.deadline.checked_sub(millis(LEASE))?;
        Some(read + millis(since))
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `token`'s entry in `key`'s line, as this manager last wrote or renewed it.
    pub(crate) fn entry(&self, key: &str, token: &str) -> Option<Entry> {
        self.entries()
            .get(key)
            .filter(|entry| &*entry.token == token)
            .cloned()
    }

    /// `token`'s entry in `key`'s line is now `text` (`None`: unchanged), its lease `lease`.
    /// At most [`CONTENDED_KEYS`] keys: beyond, another key's entry gives way, and that
    /// waiter's next renewal looks for its place by its token.
    pub(crate) fn entry_written(
        &self,
        key: &Arc<str>,
        token: &Arc<str>,
        text: Option<String>,
        lease: Option<u64>,
    ) {
        let mut entries = self.entries();
        match (entries.get_mut(&**key), text) {
            (Some(entry), text) if entry.token == *token => {
                if let Some(text) = text {
                    entry.text = text;
                }
                entry.lease = lease;
            }
            (_, None) => {}
            (_, Some(text)) => {
                if entries.len() >= CONTENDED_KEYS && !entries.contains_key(&**key) {
                    let other = entries.keys().next().map(Arc::clone);
                    if let Some(other) = other {
                        entries.remove(&other);
                    }
                }
                entries.insert(
                    Arc::clone(key),
                    Entry {
                        token: Arc::clone(token),
                        text,
                        lease,
                    },
                );
            }
        }
    }

    /// `token`'s place in `key`'s line may have been handed on or dropped (a hand-off message
    /// came, or may have been lost): its next renewal looks for it.
    pub(crate) fn place_may_be_gone(&self, key: &str, token: &str) {
        if let Some(entry) = self.entries().get_mut(key) {
            if &*entry.token == token {
                entry.lease = None;
            }
        }
    }

    pub(crate) fn recently(&self, key: &str) -> bool {
        let mut keys = self.keys();
        match keys.get(key) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                keys.remove(key);
                false
            }
            None => false,
        }
    }
}
