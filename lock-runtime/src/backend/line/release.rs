//! Giving a lock back on one endpoint (handing it to the next in line), holding it to a
//! `hold_at_least`, extending it, breaking it for an operator.

use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::Cmd;

use super::{counts_receivers, flag, unexpected_reply, Node, Resend};
use crate::backend::failure::{self, Failure};
use crate::backend::keys::LockKeys;
use crate::backend::replicas::Replicas;
use crate::backend::scripts;
use crate::backend::{Ownership, Released, Unlock};
use crate::redis::connection::Connection;
use crate::support::retry::Backoff;
use crate::support::units::millis;

impl Node {
    /// Deletes the lock if it is still ours (handing it to the next waiter, or waking the
    /// waiters); `false` if it was not ours. [`Unlock::Leave`] also takes `token` out of the line: a
    /// waiter that gives up, and passes on a lock handed to it meanwhile.
    ///
    /// On a Redis Cluster in flux, or a Sentinel service failing over, the release is tried
    /// again for a while rather than left to the ttl. On a cluster: while the lock's slot is
    /// half-migrated the script (several keys, the helpers usually absent) is answered
    /// TRYAGAIN, and during a failover CLUSTERDOWN or a MOVED that redis-rs gave up following,
    /// or a refused connection to the master that just died. On Sentinel: the old master
    /// refuses connections or is a read-only replica now, or the sentinels know no master yet.
    /// Each of these means the script did not run, so trying again cannot release twice;
    /// acquires need no such loop, they retry until their deadline.
    ///
    /// `redis_clock`: Redis's time in ms as the caller knows it (never later than the server's),
    /// by which waiters' leases are judged without a `TIME` (see `scripts::RELEASE`).
    ///
    /// A release whose connection may have been closed for being idle (see
    /// [`Node::may_be_idle_closed`]) leaves its token in the lock's `released` marker, as every
    /// release does on a cluster (see `RELEASE`). Only such a release, or a waiter leaving, is
    /// sent once more when its connection turns out to have dropped: a second run of an unmarked
    /// release whose first run did reach Redis would find the lock gone and report it lost.
    pub(crate) async fn unlock(
        &self,
        keys: &LockKeys,
        token: &str,
        why: Unlock,
        redis_clock: Option<u64>,
    ) -> failure::Result<Released> {
        let leave = why == Unlock::Leave;
        let rule = if leave {
            Resend::Idempotent
        } else {
            self.release_rule()
        };
        let marked = rule == Resend::Marked;
        self.send(rule, || {
            self.unlock_through_failover(keys, token, leave, redis_clock, marked)
        })
        .await
    }

    /// The release of a lock held alone (see `scripts::RELEASE_ALONE`): `true` if it deleted
    /// the lock, `false` if it changed nothing (someone waits, the lock is not ours, or the
    /// user may not read the line, which stops this manager from sending it again).
    pub(crate) async fn release_alone(
        &self,
        keys: &LockKeys,
        token: &str,
    ) -> failure::Result<bool> {
        let mut connection = self.connection().await?;
        let line = keys.helper_arg("line");
        let mut cmd = scripts::evalsha_head(
            &scripts::RELEASE_ALONE,
            2,
            1,
            keys.lock.len() + line.len() + token.len(),
        );
        cmd.arg(&*keys.lock).arg(line).arg(token);
        let deleted: i64 = scripts::invoke(&scripts::RELEASE_ALONE, &cmd, &mut connection).await?;
        if deleted == -1 && !self.alone_refused.swap(true, Ordering::Relaxed) {
            tracing::warn!(target: "distlock", "EXISTS refused: every release now runs the full release script, which costs Redis more; add +exists to the ACL user (see docs/tls-acl.md)");
        }
        Ok(deleted == 1)
    }

    /// [`Node::unlock`], tried again while a cluster is in flux or a Sentinel service fails
    /// over.
    pub(super) async fn unlock_through_failover(
        &self,
        keys: &LockKeys,
        token: &str,
        leave: bool,
        redis_clock: Option<u64>,
        marked: bool,
    ) -> failure::Result<Released> {
        let give_up = tokio::time::Instant::now() + CLUSTER_IN_FLUX_GIVE_UP;
        let mut backoff = CLUSTER_IN_FLUX_BACKOFF;
        let sentinel = self.connections.is_sentinel();
        loop {
            let mut in_cluster = false;
            let result: failure::Result<Released> = match self.connection().await {
                Ok(mut connection) => {
                    in_cluster = matches!(connection, Connection::Cluster(_));
                    // A cluster connection may run the release twice, and a marked release
                    // may be sent twice: mark it, see `RELEASE`.
                    let re_sent_within =
                        (in_cluster || marked).then(|| self.connections.resend_window());
                    self.unlock_on(
                        &mut connection,
                        keys,
                        token,
                        leave,
                        re_sent_within,
                        redis_clock,
                    )
                    .await
                }
                Err(error) => Err(error.into()),
            };
            let not_run = |failure: &Failure| match failure {
                Failure::Redis(error) if in_cluster => {
                    crate::redis::classify::cluster_in_flux(error) || error.is_connection_refusal()
                }
                failure => sentinel && failure.wants_a_master(),
            };
            match result {
                Err(failure) if not_run(&failure) => {
                    let pause = backoff.next_pause();
                    if tokio::time::Instant::now() + pause >= give_up {
                        return Err(failure);
                    }
                    tokio::time::sleep(pause).await;
                }
                result => return result,
            }
        }
    }

    pub(super) async fn unlock_on(
        &self,
        connection: &mut Connection,
        keys: &LockKeys,
        token: &str,
        leave: bool,
        re_sent_within: Option<Duration>,
        redis_clock: Option<u64>,
    ) -> failure::Result<Released> {
        let released: i64 = {
            // Written straight into the command, in `RELEASE`'s order: this runs for every
            // lock (see `LockKeys::helper_arg`).
            let (line, fence, since, forced, leases) = (
                keys.helper_arg("line"),
                keys.helper_arg("fence"),
                keys.helper_arg("since"),
                keys.helper_arg("forced"),
                keys.helper_arg("leases"),
            );
            // The `released` marker only where a command may be re-sent (see `RELEASE`).
            let released = re_sent_within.map(|_| keys.helper_arg("released"));
            let helpers_bytes = line.len()
                + fence.len()
                + since.len()
                + forced.len()
                + leases.len()
                + released.map_or(0, |released| released.len());
            let mut cmd = scripts::evalsha_head(
                &scripts::RELEASE,
                6 + usize::from(released.is_some()),
                6,
                keys.lock.len() + helpers_bytes + token.len() + 20 + 1 + 20 + 1 + 20,
            );
            cmd.arg(&*keys.lock)
                .arg(line)
                .arg(fence)
                .arg(since)
                .arg(forced);
            if let Some(released) = released {
                cmd.arg(released);
            }
            cmd.arg(leases);
            cmd.arg(token)
                .arg(millis(crate::backend::CLAIM))
                .arg(flag(leave))
                .arg(
                    re_sent_within
                        .map(millis)
                        .map_or_else(String::new, |ms| ms.to_string()),
                )
                .arg(flag(counts_receivers(connection)))
                .arg(redis_clock.map_or_else(String::new, |now| now.to_string()));
            scripts::invoke(&scripts::RELEASE, &cmd, connection).await?
        };
        match (released, Ownership::from_reply(released)) {
            (2, _) => Ok(Released::HandedOver),
            (_, Some(Ownership::Ours)) => Ok(Released::Freed),
            (_, Some(Ownership::Lost(cause))) => Ok(Released::NotOurs(cause)),
            (other, None) => Err(unexpected_reply("the release script", &[other])),
        }
    }

    /// Keeps the lock `keep_millis` from now instead of deleting it, if it is still ours (for the
    /// line, when someone waits: see `HOLD`), and wakes the first waiter to learn when the hold
    /// ends; `false` if it was not ours.
    pub(crate) async fn hold(
        &self,
        keys: &LockKeys,
        token: &str,
        keep_millis: u64,
    ) -> failure::Result<Ownership> {
        // Marked, and sent once more, on the rule of a release (see `Node::unlock`).
        let rule = self.release_rule();
        let marked = rule == Resend::Marked;
        self.send(rule, || self.hold_once(keys, token, keep_millis, marked))
            .await
    }

    pub(super) async fn hold_once(
        &self,
        keys: &LockKeys,
        token: &str,
        keep_millis: u64,
        marked: bool,
    ) -> failure::Result<Ownership> {
        let mut connection = self.connection().await?;
        // It may run twice — a cluster connection sends it again after a lost reply, and a
        // marked hold is sent once more after a dropped connection (see `Node::unlock`) —,
        // and a second run after the hold ended would find the lock gone: mark it, see
        // `HOLD`.
        let (script, cmd) = if marked || matches!(connection, Connection::Cluster(_)) {
            let (line, forced, since, released, leases) = (
                keys.line(),
                keys.forced(),
                keys.since(),
                keys.released(),
                keys.leases(),
            );
            let mut cmd = scripts::evalsha(
                &scripts::HOLD,
                &[&keys.lock, &line, &forced, &since, &released, &leases],
                4,
                token.len() + 20 + 20 + 20,
            );
            cmd.arg(token)
                .arg(keep_millis)
                .arg(millis(crate::backend::CLAIM))
                .arg(millis(self.connections.resend_window()));
            (&*scripts::HOLD, cmd)
        } else {
            let (line, forced, since, leases) =
                (keys.line(), keys.forced(), keys.since(), keys.leases());
            let mut cmd = scripts::evalsha(
                &scripts::HOLD,
                &[&keys.lock, &line, &forced, &since, &leases],
                3,
                token.len() + 20 + 20,
            );
            cmd.arg(token)
                .arg(keep_millis)
                .arg(millis(crate::backend::CLAIM));
            (&*scripts::HOLD, cmd)
        };
        let held: i64 = scripts::invoke(script, &cmd, &mut connection).await?;
        Ownership::from_reply(held).ok_or_else(|| unexpected_reply("the hold script", &[held]))
    }

    /// Sets the lock's remaining ttl if it is still ours; why not, if it was not ours.
    pub(crate) async fn extend(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
    ) -> failure::Result<Ownership> {
        self.send(Resend::Idempotent, || {
            self.extend_once(keys, token, ttl_millis)
        })
        .await
    }

    pub(super) async fn extend_once(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
    ) -> failure::Result<Ownership> {
        let Some(replicas) = self.replicas else {
            let mut connection = self.connection().await?;
            let cmd = extend_command(keys, token, ttl_millis);
            let extended: i64 = scripts::invoke(&scripts::EXTEND, &cmd, &mut connection).await?;
            return Ownership::from_reply(extended)
                .ok_or_else(|| unexpected_reply("the extend script", &[extended]));
        };
        let (ours, acknowledged) = self.extend_acked(keys, token, ttl_millis, replicas).await?;
        // Not given back: the holder still holds it on the master, and says so by the error;
        // its watchdog tries again, and gives it up by its expiry.
        if ours.is_ours() && !replicas.enough(acknowledged) {
            return Err(Failure::NotReplicated {
                key: keys.lock.to_string(),
                acknowledged,
                wanted: replicas.count,
            });
        }
        Ok(ours)
    }

    /// See `Backend::confirm_replicated`.
    pub(crate) async fn confirm_replicated(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
    ) -> failure::Result<bool> {
        let Some(replicas) = self.replicas else {
            return Ok(true);
        };
        match self.extend_acked(keys, token, ttl_millis, replicas).await? {
            (Ownership::Ours, acknowledged) if !replicas.enough(acknowledged) => Err(self
                .not_acknowledged(keys, token, acknowledged, replicas)
                .await),
            (ours, _) => Ok(ours.is_ours()),
        }
    }

    /// Sets the lock's ttl if it is still ours, followed by `WAIT` in the same round trip:
    /// whether it was ours, and how many replicas acknowledged.
    pub(super) async fn extend_acked(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
        replicas: Replicas,
    ) -> failure::Result<(Ownership, u32)> {
        let cmd = extend_command(keys, token, ttl_millis);
        let (extended, acknowledged): (i64, u32) = replicas
            .run(Some(&scripts::EXTEND), &cmd, &self.connections)
            .await?;
        let ours = Ownership::from_reply(extended)
            .ok_or_else(|| unexpected_reply("the extend script", &[extended]))?;
        Ok((ours, acknowledged))
    }

    /// Breaks the lock for an operator if its key still holds `value` (see
    /// `scripts::FORCE_RELEASE`); `true` if it did. Sent once more after a dropped connection:
    /// the `forced` mark recognises a second run.
    pub(crate) async fn force_unlock(&self, keys: &LockKeys, value: &str) -> failure::Result<bool> {
        self.send(Resend::Idempotent, || self.force_unlock_once(keys, value))
            .await
    }

    pub(super) async fn force_unlock_once(
        &self,
        keys: &LockKeys,
        value: &str,
    ) -> failure::Result<bool> {
        let mut connection = self.connection().await?;
        let (line, fence, forced, leases) =
            (keys.line(), keys.fence(), keys.forced(), keys.leases());
        let since = keys.since();
        let mut cmd = scripts::evalsha(
            &scripts::FORCE_RELEASE,
            &[&keys.lock, &line, &fence, &since, &forced, &leases],
            4,
            value.len() + 20 + 1 + 20,
        );
        cmd.arg(value)
            .arg(millis(crate::backend::CLAIM))
            .arg(flag(counts_receivers(&connection)))
            .arg(millis(FORCED_KEPT));
        let broken: i64 = scripts::invoke(&scripts::FORCE_RELEASE, &cmd, &mut connection).await?;
        Ok(broken == 1)
    }
}

/// How long a force-released holder's token is kept in the lock's `forced` mark: a stuck holder
/// that comes back within it is told its lock was force-released. Past it, it is told the lock
/// expired (or was taken), which is also true by then.
pub(super) const FORCED_KEPT: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a release retries while a cluster is in flux. A slot migration or a failover
/// usually settles within a few seconds; past that the lock expires at the end of its ttl, as
/// after any failed release.
pub(super) const CLUSTER_IN_FLUX_GIVE_UP: Duration = Duration::from_secs(5);

/// The first and the longest pause between those retries.
pub(super) const CLUSTER_IN_FLUX_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(10), Duration::from_millis(200));

/// The extend script's call: the lock, its forced mark and its since record; the token and the
/// new ttl.
pub(super) fn extend_command(keys: &LockKeys, token: &str, ttl_millis: u64) -> Cmd {
    let (forced, since) = (keys.forced(), keys.since());
    let mut cmd = scripts::evalsha(
        &scripts::EXTEND,
        &[&keys.lock, &forced, &since],
        2,
        token.len() + 20,
    );
    cmd.arg(token).arg(ttl_millis);
    cmd
}
