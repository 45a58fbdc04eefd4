//! Wait records on one endpoint (see `backend::waits`).

use super::Node;
use crate::backend::failure;
use crate::backend::keys::LockKeys;
use crate::backend::scripts;
use crate::backend::waits::{Hop, WaitRecord, RECORD_LIFE};
use crate::support::units::millis;

impl Node {
    /// Writes, renews or (with `None`) ends the wait record of `token`, the holder of `keys`.
    pub(crate) async fn record_wait(
        &self,
        keys: &LockKeys,
        token: &str,
        wait_id: &str,
        record: Option<&WaitRecord>,
    ) -> failure::Result<bool> {
        let mut connection = self.connection().await?;
        let waits = keys.waits();
        let text = record.map(WaitRecord::encode).unwrap_or_default();
        let mut cmd = scripts::evalsha(&scripts::WAIT_RECORD, &[&keys.lock, &waits], 4, 0);
        cmd.arg(token)
            .arg(wait_id)
            .arg(&text)
            .arg(millis(RECORD_LIFE));
        let written: i64 = scripts::invoke(&scripts::WAIT_RECORD, &cmd, &mut connection).await?;
        Ok(written == 1)
    }

    /// One look at `keys`: `MGET` of the lock key and its wait record (one slot, one node).
    pub(crate) async fn hop(&self, keys: &LockKeys) -> failure::Result<Hop> {
        let mut connection = self.connection().await?;
        let (holder, record): (Option<String>, Option<String>) = redis::cmd("MGET")
            .arg(&*keys.lock)
            .arg(keys.waits())
            .query_async(&mut connection)
            .await?;
        Ok(Hop::from_values(holder, record.as_deref()))
    }
}
