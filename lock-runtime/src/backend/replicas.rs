//! `wait_for_replicas`: a lock write counts only once enough replicas acknowledged it.
//!
//! Redis replicates asynchronously: a master that grants a lock and dies before its replicas
//! received the write leaves a promoted replica that never heard of the lock, and a second
//! client takes it while the first still works. `WAIT n timeout` answers how many replicas
//! acknowledged every write this connection made so far; sent in the same pipeline as the
//! lock's command, it costs the replicas' acknowledgement, not another round trip.
//!
//! `WAIT` counts the writes of the connection it is sent on. A replica stream is one ordered
//! log, so a write acknowledged by a replica carries every write the master made before it —
//! also another connection's, such as the release that handed this lock over. That is why a
//! lock found handed over is confirmed by a write of this connection's own (setting its ttl)
//! before `WAIT`: a `WAIT` after a command that wrote nothing would count an older write.

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, FromRedisValue, RedisResult, Script};

use super::failure;
use crate::redis::connection::{Connection, Connections};

/// How many replicas must acknowledge a lock write, and how long to wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replicas {
    pub(crate) count: u32,
    pub(crate) timeout: Duration,
}

impl Replicas {
    /// `WAIT count timeout_ms`.
    fn wait(&self) -> Cmd {
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.count)
            .arg(crate::support::units::millis(self.timeout));
        wait
    }

    /// Runs `cmd` — by `script`'s SHA when `script` is given, loaded and sent again if Redis
    /// does not know it — followed by `WAIT` in the same round trip: its reply, and how many
    /// replicas acknowledged the connection's writes up to it.
    ///
    /// On a connection lent for this pipeline alone (see `Connections::lend`): `WAIT` blocks
    /// the connection it is sent on until the replicas answer or its timeout runs out, which on
    /// the runtime's shared connection would hold up every command queued behind it. The write
    /// goes on the same lent connection, as `WAIT` counts that connection's writes.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        script: Option<&Script>,
        cmd: &Cmd,
        connections: &Arc<Connections>,
    ) -> failure::Result<(T, u32)> {
        let mut lent = connections.lend().await?;
        let connection = lent.connection();
        let mut pipeline = redis::pipe();
        pipeline.add_command(cmd.clone()).add_command(self.wait());
        let replied: RedisResult<(T, i64)> = match pipeline.query_async(connection).await {
            Err(error) if script.is_some() && crate::redis::classify::is_no_script(&error) => {
                if let Some(script) = script {
                    script.load_async(connection).await?;
                }
                pipeline.query_async(connection).await
            }
            other => other,
        };
        // Dropped, and so closed, on an error: it may be dead, or a Sentinel master no more.
        let (reply, acknowledged) = replied?;
        lent.give_back();
        Ok((reply, u32::try_from(acknowledged).unwrap_or(0)))
    }

    /// Whether `acknowledged` replicas are enough.
    pub(crate) fn enough(&self, acknowledged: u32) -> bool {
        acknowledged >= self.count
    }

    /// Checks at connect that the server runs `WAIT` (some managed services refuse it, an ACL
    /// may not allow it, a configuration may rename it away): a `Config` message naming the
    /// fix when it does not. `WAIT 0 1` returns at once, whatever the replicas do.
    pub(crate) async fn check(&self, connection: &mut Connection) -> Result<(), crate::LockError> {
        let mut probe = redis::cmd("WAIT");
        probe.arg(0).arg(1);
        match probe.query_async::<redis::Value>(connection).await {
            Ok(_) => Ok(()),
            // An answer of the server's (`ERR unknown command`, `NOPERM`), not a lost connection.
            Err(error) if crate::redis::classify::is_server_reply(&error) => {
                Err(crate::LockError::config(format!(
                    "`wait_for_replicas` needs the WAIT command, which the server refused \
                     ({error}); allow it (`+wait` for the ACL user, no `rename-command WAIT`), \
                     or leave `wait_for_replicas` out where the service does not offer WAIT \
                     (some managed services replicate on their own terms and refuse it)"
                )))
            }
            Err(error) => Err(error.into()),
        }
    }
}
