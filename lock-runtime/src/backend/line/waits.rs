//! Wait records on one endpoint (see `backend::waits`).

use super::Node;
use crate::backend::failure;
use crate::backend::keys::LockKeys;
use crate::backend::scripts;
use crate::backend::waits::{Recording, Seen, MAX_HOLDERS, RECORD_LIFE};
use crate::support::units::millis;

impl Node {
    /// Writes, renews or ends the wait records of `token`, the holder of `keys`.
    pub(crate) async fn record_wait(
        &self,
        keys: &LockKeys,
        token: &str,
        wait_id: &str,
        record: Recording<'_>,
    ) -> failure::Result<bool> {
        let mut connection = self.connection().await?;
        let waits = keys.waits();
        let argv_count = match record {
            Recording::Write { waits_for, .. } => 5 + waits_for.len(),
            Recording::End { .. } => 5,
        };
        let mut cmd = scripts::evalsha(&scripts::WAIT_RECORD, &[&keys.lock, &waits], argv_count, 0);
        cmd.arg(token).arg(wait_id).arg(millis(RECORD_LIFE));
        match record {
            Recording::Write {
                since_ms,
                waits_for,
            } => {
                cmd.arg("write").arg(since_ms);
                for lock in waits_for {
                    cmd.arg(lock);
                }
            }
            Recording::End { count } => {
                cmd.arg("end").arg(count);
            }
        }
        let written: i64 = scripts::invoke(&scripts::WAIT_RECORD, &cmd, &mut connection).await?;
        Ok(written == 1)
    }

    /// One look at `keys`: its holders and their live records, by one script on the lock's
    /// node (the lock key and its `waits` share a slot).
    pub(crate) async fn look_at(&self, keys: &LockKeys) -> failure::Result<Seen> {
        let mut connection = self.connection().await?;
        let waits = keys.waits();
        let mut cmd = scripts::evalsha(&scripts::WAIT_LOOK, &[&keys.lock, &waits], 1, 0);
        cmd.arg(MAX_HOLDERS);
        let (holders, records): (Vec<String>, Vec<String>) =
            scripts::invoke(&scripts::WAIT_LOOK, &cmd, &mut connection).await?;
        Ok(Seen::from_values(holders, &records))
    }
}
