//! Wait records in the in-process table, as `scripts::WAIT_RECORD` and `scripts::WAIT_LOOK`
//! keep them on Redis (see `backend::waits`).

use std::collections::HashMap;
use std::time::Instant;

use super::{LockRow, Memory};
use crate::backend::keys::{Kind, LockKeys};
use crate::backend::waits::{Recording, Seen, MAX_HOLDERS, RECORD_LIFE};

/// The records of one lock, by field (`"<wait id> <i>"`): the record's text, or `None` for an
/// end mark, and until when it lives.
pub(super) type Fields = HashMap<String, (Option<String>, Instant)>;

/// The live holders of `row`: its mutex's holder, or its readers (a semaphore's permits are not
/// followed).
fn holders(row: &LockRow, now: Instant) -> Vec<String> {
    if let Some(holder) = &row.holder {
        return vec![holder.token.to_string()];
    }
    match &row.leases {
        Some(leases) if leases.kind == Kind::Read => leases
            .holders
            .iter()
            .filter(|lease| lease.expires > now)
            .map(|lease| lease.token.to_string())
            .collect(),
        _ => Vec::new(),
    }
}

impl Memory {
    /// Writes, renews or ends the records of the wait `wait_id` of `token`, a holder of `keys`,
    /// as `scripts::WAIT_RECORD` does: only while `token` holds the lock, and never over the
    /// wait's end mark.
    pub(crate) fn record_wait(
        &self,
        keys: &LockKeys,
        token: &str,
        wait_id: &str,
        record: Recording<'_>,
    ) -> bool {
        let now = Instant::now();
        let mut table = self.table();
        let holds = holders(table.row(&keys.lock, now), now)
            .iter()
            .any(|holder| holder == token);
        table.tidy(&keys.lock);
        if !holds {
            return false;
        }
        // Records that ran out go, with the locks left without any (as their keys expire).
        table.waits.retain(|_, fields| {
            fields.retain(|_, (_, until)| *until >= now);
            !fields.is_empty()
        });
        let fields = table.waits.entry(keys.lock.clone()).or_default();
        let until = now + RECORD_LIFE;
        match record {
            Recording::End { count } => {
                for i in 1..=count {
                    fields.insert(format!("{wait_id} {i}"), (None, until));
                }
            }
            Recording::Write {
                since_ms,
                waits_for,
            } => {
                let prefix = format!("{wait_id} ");
                if fields
                    .iter()
                    .any(|(field, (text, _))| field.starts_with(&prefix) && text.is_none())
                {
                    return false;
                }
                for (i, lock) in waits_for.iter().enumerate() {
                    let text = format!("{token} {wait_id} {since_ms} {lock}");
                    fields.insert(format!("{prefix}{}", i + 1), (Some(text), until));
                }
            }
        }
        true
    }

    /// The lock's holders and their live records, as `scripts::WAIT_LOOK` reads them on Redis.
    pub(crate) fn look_at(&self, keys: &LockKeys) -> Seen {
        let now = Instant::now();
        let mut table = self.table();
        let mut holders = holders(table.row(&keys.lock, now), now);
        table.tidy(&keys.lock);
        let records: Vec<String> = table
            .waits
            .get(&keys.lock)
            .into_iter()
            .flat_map(|fields| fields.values())
            .filter(|(_, until)| *until >= now)
            .filter_map(|(text, _)| text.clone())
            .collect();
        if holders.len() > 1 {
            // Readers: only those that wait lead anywhere, at most MAX_HOLDERS of them in byte
            // order, as on Redis.
            holders.retain(|token| {
                records
                    .iter()
                    .any(|text| text.split(' ').next() == Some(token.as_str()))
            });
            holders.sort();
            holders.truncate(MAX_HOLDERS);
        }
        Seen::from_values(holders, &records)
    }
}
