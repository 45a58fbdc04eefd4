//! One Redlock master: a [`Node`] that votes rather than takes a lock on its own.
//!
//! A master cannot hand a lock over (a lock is held only by a majority's grants), so its
//! waiters do not queue in a line: they take a place in the lock's wake list on each master
//! where they find it held, and a release on a master wakes the first live waiter there, which
//! then competes on every master (`scripts::QUORUM_ACQUIRE`, `scripts::QUORUM_RELEASE`,
//! `scripts::QUORUM_HOLD`). Extending, looking and scanning are a single endpoint's.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use crate::backend::failure::{self, Failure};
use crate::backend::keys::LockKeys;
use crate::backend::line::{after_resend, flag, set_nx, Look, Node, Resend, ScanTarget};
use crate::backend::scripts;
use crate::backend::Ownership;
use crate::redis::connection::{Connection, Connections};
use crate::support::units::millis;

/// One Redlock master.
pub(crate) struct Master {
    node: Node,
}

/// What one Redlock master answered an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Vote {
    /// Granted to the caller (or found already its own).
    Granted,
    /// Held by `holder` (`None`: not asked — a first try's plain `SET NX`), for at most
    /// `remaining` more (`None`: unknown, or no expiry).
    Held {
        remaining: Option<Duration>,
        holder: Option<String>,
    },
}

impl Master {
    pub(crate) fn new(connections: Arc<Connections>) -> Self {
        Master {
            node: Node::new(connections),
        }
    }

    /// The master as one endpoint, for what is not a vote (the lock-order record).
    pub(crate) fn node(&self) -> &Node {
        &self.node
    }

    #[cfg(feature = "resource-counts")]
    pub(crate) fn connections(&self) -> &Connections {
        self.node.connections()
    }

    /// Checks that the master answers and lets us run the quorum scripts: a `PING`, then the
    /// quorum release on a probe key with a token that matches nothing (it deletes nothing,
    /// and loads the script for the first real release). Sent again on the rule of a release
    /// (`Node::release_rule`): its token matches nothing, so a second run changes nothing.
    pub(crate) async fn ping(&self, probe: &LockKeys) -> failure::Result<()> {
        let mut connection = self.node.connection().await?;
        redis::cmd("PING")
            .query_async::<()>(&mut connection)
            .await?;
        self.node
            .send(self.node.release_rule(), || async {
                let mut connection = self.node.connection().await?;
                self.release_vote_on(&mut connection, probe, "no token matches this", None, true)
                    .await
            })
            .await
            .map(drop)
    }

    /// Keeps the lock `keep_millis` from now instead of deleting it, if it is still ours, and
    /// wakes the first waiter to learn when the hold ends. Sent once: the quorum hold has no
    /// marker that would tell a second run.
    pub(crate) async fn hold(
        &self,
        keys: &LockKeys,
        token: &str,
        keep_millis: u64,
    ) -> failure::Result<Ownership> {
        let mut connection = self.node.connection().await?;
        let (wake_list, since) = (keys.wake_list(), keys.since());
        let mut cmd = scripts::evalsha(
            &scripts::QUORUM_HOLD,
            &[&keys.lock, &wake_list, &since],
            2,
            token.len() + 20,
        );
        cmd.arg(token).arg(keep_millis);
        let held: i64 = scripts::invoke(&scripts::QUORUM_HOLD, &cmd, &mut connection).await?;
        Ownership::from_reply(held).ok_or(Failure::UnexpectedReply {
            what: "the quorum hold script",
            reply: held.to_string(),
        })
    }

    /// See `Node::extend`.
    pub(crate) async fn extend(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
    ) -> failure::Result<Ownership> {
        self.node.extend(keys, token, ttl_millis).await
    }

    /// See `Node::is_held`.
    pub(crate) async fn is_held(&self, keys: &LockKeys, token: &str) -> failure::Result<bool> {
        self.node.is_held(keys, token).await
    }

    /// See `Node::inspect`.
    pub(crate) async fn inspect(&self, keys: &LockKeys) -> failure::Result<Option<Look>> {
        self.node.inspect(keys).await
    }

    /// See `Node::scan`.
    pub(crate) async fn scan(
        &self,
        target: &ScanTarget,
        cursor: u64,
        pattern: &str,
    ) -> failure::Result<(u64, Vec<Vec<u8>>)> {
        self.node.scan(target, cursor, pattern, "string").await
    }

    /// One Redlock master's vote: `SET NX PX` for a first try; otherwise the quorum acquire
    /// script, which also takes (or renews) the place `member` in the lock's wake list here
    /// when someone else holds it (`None`: the caller is not subscribed, and takes none).
    pub(crate) async fn vote(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
        first_try: bool,
        member: Option<&str>,
    ) -> failure::Result<Vote> {
        let mut connection = self.node.connection().await?;
        if first_try {
            match set_nx(&mut connection, keys, token, ttl_millis).await {
                Ok(true) => return Ok(Vote::Granted),
                Ok(false) => {
                    return Ok(Vote::Held {
                        remaining: None,
                        holder: None,
                    })
                }
                // Sent once more, as the script below (taking no place in the wake list),
                // which finds the lock ours if the `SET` ran after all.
                Err(error) if self.node.sends_again(Resend::Idempotent, &error) => {
                    let again = self
                        .vote_by_script(keys, token, ttl_millis, None, false)
                        .await;
                    return after_resend(error, again);
                }
                Err(error) => return Err(error),
            }
        }
        self.node
            .send(Resend::Idempotent, || {
                self.vote_by_script(keys, token, ttl_millis, member, true)
            })
            .await
    }

    /// A vote by the quorum acquire script, which takes the place `member` in the wake list
    /// when the lock is held (`None`: none), and records the grant's time when the caller
    /// `waited` (see `QUORUM_ACQUIRE`). Runs the same twice.
    async fn vote_by_script(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
        member: Option<&str>,
        waited: bool,
    ) -> failure::Result<Vote> {
        let mut connection = self.node.connection().await?;
        let (wake_list, since) = (keys.wake_list(), keys.since());
        let member = member.unwrap_or("");
        let mut cmd = scripts::evalsha(
            &scripts::QUORUM_ACQUIRE,
            &[&keys.lock, &wake_list, &since],
            5,
            token.len() + 20 + member.len() + 20 + 1,
        );
        cmd.arg(token)
            .arg(ttl_millis)
            .arg(member)
            .arg(millis(crate::backend::LEASE))
            .arg(flag(waited));
        let reply: Vec<Value> =
            scripts::invoke(&scripts::QUORUM_ACQUIRE, &cmd, &mut connection).await?;
        match reply.as_slice() {
            [Value::Int(1)] => Ok(Vote::Granted),
            [Value::Int(0), Value::Int(pttl), holder] => Ok(Vote::Held {
                remaining: u64::try_from(*pttl).ok().map(Duration::from_millis),
                holder: redis::from_redis_value(holder.clone()).ok(),
            }),
            other => Err(Failure::UnexpectedReply {
                what: "the quorum acquire script",
                reply: format!("{other:?}"),
            }),
        }
    }

    /// One Redlock master's release: deletes the lock if it is still ours, waking the first live
    /// waiter there when `wake`; takes `member` (ours) out of the wake list either way.
    pub(crate) async fn release_vote(
        &self,
        keys: &LockKeys,
        token: &str,
        member: Option<&str>,
        wake: bool,
    ) -> failure::Result<bool> {
        // The quorum release has no marker, and a second run of one whose first reached the
        // master would find the lock gone, a false "not ours".
        self.node
            .send(Resend::AtMostOnce, || async {
                let mut connection = self.node.connection().await?;
                self.release_vote_on(&mut connection, keys, token, member, wake)
                    .await
            })
            .await
    }

    async fn release_vote_on(
        &self,
        connection: &mut Connection,
        keys: &LockKeys,
        token: &str,
        member: Option<&str>,
        wake: bool,
    ) -> failure::Result<bool> {
        let (wake_list, since, member) = (keys.wake_list(), keys.since(), member.unwrap_or(""));
        let mut cmd = scripts::evalsha(
            &scripts::QUORUM_RELEASE,
            &[&keys.lock, &wake_list, &since],
            3,
            token.len() + member.len() + 1,
        );
        cmd.arg(token).arg(member).arg(flag(wake));
        let deleted: i64 = scripts::invoke(&scripts::QUORUM_RELEASE, &cmd, connection).await?;
        Ok(deleted == 1)
    }
}
