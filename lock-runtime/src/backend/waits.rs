//! Wait records: what a holder that waits for another lock tells those who wait for it, so
//! that a waiter can follow the chain of waits from the lock it wants and find whether it
//! comes back to itself (`acquire::deadlock` decides; `manager::deadlock` walks).
//!
//! A holder of lock `L` (inside its guard's scope) that waits for lock `M` writes, in `L`'s
//! `waits` helper key (so in `L`'s cluster slot), `"<its token in L> <wait id> <wait start,
//! Unix ms> <M>"`, for [`RECORD_LIFE`], renewed while it waits, and ends it when the wait ends
//! (an end mark that a renewal still in flight cannot overwrite). The write checks that `L`
//! still holds the token (`scripts::WAIT_RECORD`); a reader keeps a record only when `L`'s
//! holder is the token it names ([`Hop`]). One hop is one command on one node: `MGET L
//! <waits of L>`, two keys of one slot.

use std::time::Duration;

use super::keys::LockKeys;
use super::{failure, Backend, Locks};

/// How long a wait record lives unless renewed: a waiter that dies (or whose end of the wait
/// could not reach Redis) leaves a record this long at most.
pub(crate) const RECORD_LIFE: Duration = Duration::from_secs(3);

/// One wait of a holder, as its record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WaitRecord {
    /// The holder's token (the value of the lock the record belongs to).
    pub(crate) holder: String,
    /// Unique per wait: a new wait of the same holder has another.
    pub(crate) wait_id: String,
    /// When the wait began, Unix ms (the waiter's clock).
    pub(crate) since_ms: u64,
    /// The full key of the lock waited for.
    pub(crate) waits_for: String,
}

impl WaitRecord {
    /// The record's text: the token has no whitespace, nor has the id; the key comes last, as
    /// it is (it may hold spaces).
    pub(crate) fn encode(&self) -> String {
        format!(
            "{} {} {} {}",
            self.holder, self.wait_id, self.since_ms, self.waits_for
        )
    }

    /// Reads a record back; `None` for an end mark or anything else.
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

/// What one look at a lock found: its holder's token, and that holder's wait when it waits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Hop {
    /// The lock key's value; `None` when the lock is free.
    pub(crate) holder: Option<String>,
    /// The holder's wait, from a record that names the holder (a record left by an earlier
    /// holder names another token, and is dropped).
    pub(crate) wait: Option<WaitRecord>,
}

impl Hop {
    /// The hop from the lock key's value and its wait record's text.
    pub(crate) fn from_values(holder: Option<String>, record: Option<&str>) -> Hop {
        let wait = record
            .and_then(WaitRecord::decode)
            .filter(|wait| holder.as_deref() == Some(wait.holder.as_str()));
        Hop { holder, wait }
    }
}

impl Backend {
    /// Writes (or renews) `record` as the wait of `token`, the holder of `keys`, or with
    /// `None` ends the wait `wait_id`; only while `token` holds the lock. `false` when nothing
    /// was written.
    pub(crate) async fn record_wait(
        &self,
        keys: &LockKeys,
        token: &str,
        wait_id: &str,
        record: Option<&WaitRecord>,
    ) -> failure::Result<bool> {
        match &self.locks {
            Locks::Single(node) => node.record_wait(keys, token, wait_id, record).await,
            Locks::Memory(memory) => Ok(memory.record_wait(keys, token, wait_id, record)),
            // Redlock detects no deadlocks (see `Capabilities::detects_deadlocks`).
            Locks::Quorum(_) => Ok(false),
        }
    }

    /// One look at `keys`: its holder and that holder's wait.
    pub(crate) async fn hop(&self, keys: &LockKeys) -> failure::Result<Hop> {
        match &self.locks {
            Locks::Single(node) => node.hop(keys).await,
            Locks::Memory(memory) => Ok(memory.hop(keys)),
            Locks::Quorum(_) => Ok(Hop::default()),
        }
    }
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
            waits_for: "lock:a b c".into(),
        };
        assert_eq!(WaitRecord::decode(&record.encode()), Some(record));
        assert_eq!(WaitRecord::decode("t w1 ended"), None);
    }

    #[test]
    fn a_record_of_another_holder_is_dropped() {
        let text = "old w1 42 lock:b";
        let hop = Hop::from_values(Some("new".into()), Some(text));
        assert_eq!(hop.wait, None);
        let hop = Hop::from_values(Some("old".into()), Some(text));
        assert_eq!(hop.wait.map(|wait| wait.waits_for), Some("lock:b".into()));
    }
}
