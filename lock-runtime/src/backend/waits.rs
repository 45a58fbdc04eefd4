//! Wait records: what a holder that waits for other locks tells those who wait for it, so
//! that a waiter can follow the waits from the locks it wants and find whether they come back
//! to itself (`acquire::deadlock` decides; `manager::deadlock` walks).
//!
//! A holder of lock `L` (inside its guard's scope: the mutex's or writer's holder, or a
//! reader) that waits for locks `M₁..Mₙ` (one for `acquire`, several for `acquire_all`)
//! writes, in `L`'s `waits` helper key (a hash, so in `L`'s cluster slot), one field per lock
//! waited for, `"<wait id> <i>"`, holding `"<expiry> <its token in L> <wait id> <wait start,
//! Unix ms> <Mᵢ>"`. Several waits of one holder (`join!`) and the waits of several readers
//! each have their own fields. A record lives [`RECORD_LIFE`], renewed while it waits, and is
//! ended when the wait ends (an end mark that a renewal still in flight cannot overwrite). The
//! write checks that `L` still holds the token (`scripts::WAIT_RECORD`). One look
//! (`scripts::WAIT_LOOK`) is one command on one node: `L`'s holders (up to [`MAX_HOLDERS`])
//! and the live records that name one of them ([`Seen`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::keys::LockKeys;
use super::{failure, Backend, Locks};

/// How long a wait record lives unless renewed: a waiter that dies (or whose end of the wait
/// could not reach Redis) leaves a record this long at most.
pub(crate) const RECORD_LIFE: Duration = Duration::from_secs(3);

/// The most holders one look returns: of a read lock's readers, those that wait (that have a
/// live record) in byte order; readers that wait for nothing lead nowhere and are left out.
pub(crate) const MAX_HOLDERS: usize = 8;

/// One wait of a holder for one lock, as its record says.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct WaitRecord {
    /// The holder's token (its value in the lock the record belongs to).
    pub(crate) holder: String,
    /// Unique per wait: a new wait of the same holder has another.
    pub(crate) wait_id: String,
    /// When the wait began, Unix ms (the waiter's clock).
    pub(crate) since_ms: u64,
    /// The full key of the lock waited for.
    pub(crate) waits_for: String,
}

impl WaitRecord {
    /// The record's text as a look returns it: the token has no whitespace, nor has the id;
    /// the key comes last, as it is (it may hold spaces).
    #[cfg(test)]
    pub(crate) fn encode(&self) -> String {
        format!(
            "{} {} {} {}",
            self.holder, self.wait_id, self.since_ms, self.waits_for
        )
    }

    /// Reads a record back; `None` for anything else.
    pub(crate) fn decode(text: &str) -> Option<WaitRecord> {
        let mut parts = text.splitn(4, ' ');
        let holder = parts.next()?.to_owned();
        let wait_id = parts.next()?.to_owned();
        let since_ms = parts.next()?.parse().ok()?;
        let waits_for = parts.next()?.to_owned();
        Some(WaitRecord {
            holder,
            wait_id,
            since_ms,
            waits_for,
        })
    }
}

/// One holder of a lock and its waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    /// Its value in the lock.
    pub(crate) token: String,
    /// Its live waits, one per lock waited for, in a fixed order.
    pub(crate) waits: Vec<WaitRecord>,
}

/// What one look at a lock found: its holders, each with its waits, in a fixed order, so
/// that two walks over the same records follow the same edges first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    /// None when the lock is free (or is a semaphore: no single holder is waited for).
    pub(crate) holders: Vec<Holder>,
}

impl Seen {
    /// The look from the holders' values and the records' texts; a record that names no
    /// holder (an earlier holder's) is dropped.
    pub(crate) fn from_values(mut holders: Vec<String>, records: &[String]) -> Seen {
        holders.sort();
        holders.dedup();
        let holders = holders
            .into_iter()
            .map(|token| {
                let mut waits: Vec<WaitRecord> = records
                    .iter()
                    .filter_map(|text| WaitRecord::decode(text))
                    .filter(|wait| wait.holder == token)
                    .collect();
                waits.sort();
                waits.dedup();
                Holder { token, waits }
            })
            .collect();
        Seen { holders }
    }
}

impl Backend {
    /// Writes (or renews) the records of the wait `wait_id` of `token`, the holder of `keys`,
    /// for each lock of `waits_for`, or with `None` ends the wait (`count` locks); only while
    /// `token` holds the lock. `false` when nothing was written.
    pub(crate) async fn record_wait(
        &self,
        keys: &LockKeys,
        token: &str,
        wait_id: &str,
        record: Recording<'_>,
    ) -> failure::Result<bool> {
        match &self.locks {
            Locks::Single(node) => node.record_wait(keys, token, wait_id, record).await,
            Locks::Memory(memory) => Ok(memory.record_wait(keys, token, wait_id, record)),
            // Redlock detects no deadlocks (see `Capabilities::detects_deadlocks`).
            Locks::Quorum(_) => Ok(false),
        }
    }

    /// One look at `keys`: its holders and their waits.
    pub(crate) async fn look_at(&self, keys: &LockKeys) -> failure::Result<Seen> {
        match &self.locks {
            Locks::Single(node) => node.look_at(keys).await,
            Locks::Memory(memory) => Ok(memory.look_at(keys)),
            Locks::Quorum(_) => Ok(Seen::default()),
        }
    }
}

/// The locks a multi-key acquisition holds while it waits for the rest (taken one by one, or
/// handed to it in a line): held locks for deadlock detection, since the acquisition waits
/// holding them. The acquisition publishes them here (a task-local set around it by the
/// watch, `manager::deadlock`); the watch reads them before each walk.
#[derive(Debug, Clone, Default)]
pub(crate) struct Meanwhile(Arc<Mutex<Vec<HeldLock>>>);

/// A lock held, with the token that holds it.
type HeldLock = (LockKeys, Arc<str>);

tokio::task_local! {
    /// The current task's multi-key acquisition under watch, if any.
    static MEANWHILE: Meanwhile;
}

impl Meanwhile {
    /// Runs `acquisition` with this set as the task's: what it takes meanwhile lands here.
    pub(crate) async fn scope<T>(self, acquisition: impl std::future::Future<Output = T>) -> T {
        MEANWHILE.scope(self, acquisition).await
    }

    /// The current task's set, if it runs a watched multi-key acquisition.
    pub(crate) fn current() -> Option<Meanwhile> {
        MEANWHILE.try_with(Meanwhile::clone).ok()
    }

    /// The locks held meanwhile, with the tokens that hold them.
    pub(crate) fn snapshot(&self) -> Vec<(LockKeys, Arc<str>)> {
        self.0.lock().map(|held| held.clone()).unwrap_or_default()
    }

    /// The current task's acquisition took `keys` with `token` (one by one).
    pub(crate) fn took(keys: &LockKeys, token: &Arc<str>) {
        let _ = MEANWHILE.try_with(|set| {
            if let Ok(mut held) = set.0.lock() {
                held.push((keys.clone(), Arc::clone(token)));
            }
        });
    }

    /// The current task's acquisition (of locks taken together) holds exactly `keys`, with
    /// `token`, after its last look.
    pub(crate) fn holds_together(keys: Vec<LockKeys>, token: &str) {
        let _ = MEANWHILE.try_with(|set| {
            if let Ok(mut held) = set.0.lock() {
                let token: Arc<str> = Arc::from(token);
                *held = keys
                    .into_iter()
                    .map(|keys| (keys, Arc::clone(&token)))
                    .collect();
            }
        });
    }
}

/// What a write of wait records does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Recording<'a> {
    /// Write or renew the wait, begun at `since_ms`, for each of these full lock keys.
    Write {
        since_ms: u64,
        waits_for: &'a [String],
    },
    /// End the wait, which waits for this many locks.
    End { count: usize },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_with_a_key_that_holds_spaces() {
        let record = WaitRecord {
            holder: "t;h=x;p=1;t=2".into(),
            wait_id: "w1".into(),
            since_ms: 42,
            waits_for: "lock:a b\nc".into(),
        };
        assert_eq!(WaitRecord::decode(&record.encode()), Some(record));
        assert_eq!(WaitRecord::decode("t w1 ended"), None);
    }

    #[test]
    fn records_go_to_the_holders_they_name_and_others_are_dropped() {
        let records = [
            "old w1 42 lock:b".to_owned(),
            "r2 w3 7 lock:d".to_owned(),
            "r1 w2 9 lock:c".to_owned(),
            "r1 w2 9 lock:a".to_owned(),
        ];
        let look = Seen::from_values(vec!["r2".into(), "r1".into()], &records);
        let seen: Vec<(&str, Vec<&str>)> = look
            .holders
            .iter()
            .map(|holder| {
                let waits = holder.waits.iter().map(|w| w.waits_for.as_str()).collect();
                (holder.token.as_str(), waits)
            })
            .collect();
        assert_eq!(
            seen,
            [("r1", vec!["lock:a", "lock:c"]), ("r2", vec!["lock:d"])]
        );
    }
}
