//! One Redis endpoint — a standalone server or a whole cluster — and the lock operations on it.

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, RedisResult, Value};

use super::recent::{Entry, Written};
use super::replicas::{not_replicated, Replicas};
use super::{Attempt, Ownership, Place, Released, Wait};
use crate::backend::keys::LockKeys;
use crate::backend::scripts;
use crate::redis::connection::{Connection, Connections};
use crate::support::retry::Backoff;
use crate::LostCause;

/// One endpoint: its per-runtime connections and the lock scripts run on them.
pub(crate) struct Node {
    connections: Arc<Connections>,
    protocol: Protocol,
    /// How many replicas must acknowledge a lock or an extension (`wait_for_replicas`).
    replicas: Option<Replicas>,
}

/// How waiters wait on an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// In one line per lock, served first come, first served, each release handing the lock to
    /// the next waiter (`scripts::ACQUIRE`, `scripts::RELEASE`): a standalone server or a
    /// cluster, where one node owns all of a lock's keys.
    Line,
    /// In the lock's wake list on this master, each release waking the first live waiter
    /// there, which then competes on every master (`scripts::QUORUM_ACQUIRE`,
    /// `scripts::QUORUM_RELEASE`): a Redlock master, which cannot hand a lock over on its own.
    Wake,
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

impl Node {
    pub(crate) fn new(connections: Arc<Connections>, protocol: Protocol) -> Self {
        Node {
            connections,
            protocol,
            replicas: None,
        }
    }

    /// Counts a lock or an extension only once `replicas` acknowledged it.
    pub(crate) fn wait_for_replicas(&mut self, replicas: Replicas) {
        self.replicas = Some(replicas);
    }

    async fn connection(&self) -> RedisResult<Connection> {
        self.connections.get().await
    }

    #[cfg(feature = "resource-counts")]
    pub(crate) fn connections(&self) -> &Connections {
        &self.connections
    }

    /// Whether this endpoint's connection sends a command again after losing its reply.
    pub(crate) fn resends_commands(&self) -> bool {
        self.connections.is_cluster()
    }

    /// Runs `operation` — one that may run twice: a marked release or hold, a waiter leaving,
    /// an extension, a Redlock master's vote — and once
    /// more when its connection had dropped (see `classify::connection_dropped`), on the
    /// connection made anew: else a lock released after a long idle section would stay taken
    /// until its ttl, and every waiter with it. Should the first run have reached Redis after
    /// all, the second knows it by the lock's `released` marker, or does what the first did. A
    /// cluster connection sends commands again by itself.
    async fn once_more_if_dropped<T, F>(&self, operation: impl Fn() -> F) -> RedisResult<T>
    where
        F: std::future::Future<Output = RedisResult<T>>,
    {
        match operation().await {
            Err(error) if self.sends_once_more(&error) => operation().await,
            other => other,
        }
    }

    /// [`Node::once_more_if_dropped`] when `allowed`, else `operation` once: for an operation
    /// that may run twice only when it says so (a marked release, see [`Node::unlock`]).
    async fn once_more_if_dropped_when<T, F>(
        &self,
        allowed: bool,
        operation: impl Fn() -> F,
    ) -> RedisResult<T>
    where
        F: std::future::Future<Output = RedisResult<T>>,
    {
        if allowed {
            self.once_more_if_dropped(operation).await
        } else {
            operation().await
        }
    }

    /// Whether this runtime's connection has gone unused long enough that a server may have
    /// closed it for being idle: Redis counts its `timeout` in whole seconds. (Not on a
    /// cluster, whose connection sends a command again by itself.)
    fn may_be_idle_closed(&self) -> bool {
        !self.resends_commands() && self.connections.idle_for() >= IDLE_CLOSE_POSSIBLE
    }

    /// Whether a request that failed with `error` is sent once more: its connection dropped,
    /// on an endpoint whose connection does not send it again by itself.
    fn sends_once_more(&self, error: &redis::RedisError) -> bool {
        let once_more =
            !self.resends_commands() && crate::redis::classify::connection_dropped(error);
        if once_more {
            tracing::debug!(target: "distlock", %error, "connection dropped; sending once more on a new one");
        }
        once_more
    }

    /// `result`, with a `WRONGTYPE` error that names no key — Redis's own, from a command
    /// inside a lock script — made into one that names the key at fault: the lock's keys are
    /// read one by one (`GET`, `LRANGE` for the line: commands the lock scripts run anyway, so
    /// allowed by their ACL) until one answers `WRONGTYPE`. Only on that error: it costs
    /// nothing otherwise. The error is kept as it was when no key answers so by then.
    pub(crate) async fn naming_the_key<T>(
        &self,
        keys: &LockKeys,
        result: RedisResult<T>,
    ) -> RedisResult<T> {
        let error = match result {
            Err(error)
                if crate::redis::classify::classify(&error)
                    == crate::redis::classify::Meaning::WrongType
                    && !error
                        .detail()
                        .is_some_and(|detail| detail.contains("distlock:")) =>
            {
                error
            }
            other => return other,
        };
        let Ok(mut connection) = self.connection().await else {
            return Err(error);
        };
        let (line, fence, released, forced) =
            (keys.line(), keys.fence(), keys.released(), keys.forced());
        let candidates = [
            (&*keys.lock, None),
            (line.as_str(), Some("line of waiters")),
            (fence.as_str(), Some("fencing counter")),
            (released.as_str(), Some("`released` marker")),
            (forced.as_str(), Some("`forced` mark")),
        ];
        for (key, helper) in candidates {
            let read = if helper == Some("line of waiters") {
                let mut cmd = redis::cmd("LRANGE");
                cmd.arg(key).arg(0).arg(0);
                cmd
            } else {
                let mut cmd = redis::cmd("GET");
                cmd.arg(key);
                cmd
            };
            let answer: RedisResult<Value> = read.query_async(&mut connection).await;
            let Err(looked) = answer else { continue };
            if looked.code() != Some("WRONGTYPE") {
                continue;
            }
            let detail = match helper {
                None => format!(
                    "distlock: the lock key {key} holds a value of another type, not a lock"
                ),
                Some(role) => format!(
                    "distlock: the {role} {key} of the lock {lock} {HELPER_OF_ANOTHER_TYPE}; \
                     delete it",
                    lock = keys.lock
                ),
            };
            return Err(redis::make_extension_error(
                "WRONGTYPE".to_owned(),
                Some(detail),
            ));
        }
        Err(error)
    }

    /// Checks that the endpoint answers as Redis does and lets us run the lock scripts: a
    /// `PING`, then the release script on a probe key with a token that matches nothing (it
    /// deletes nothing, and loads the script for the first real release).
    pub(crate) async fn ping(&self, probe: &LockKeys) -> RedisResult<()> {
        let mut connection = self.connection().await?;
        redis::cmd("PING")
            .query_async::<()>(&mut connection)
            .await?;
        self.unlock(probe, "no token matches this", false, None)
            .await
            .map(drop)
    }

    /// With `wait_for_replicas`, checks that the server runs `WAIT` (see `Replicas::check`).
    pub(crate) async fn check_wait(&self) -> Result<(), crate::LockError> {
        match &self.replicas {
            Some(replicas) => replicas.check(&mut self.connection().await?).await,
            None => Ok(()),
        }
    }

    /// Gives back a lock that too few replicas acknowledged (and the place in line of its
    /// token, if any): the error that says so. Should the give-back fail, the lock expires at
    /// the end of its ttl.
    async fn not_acknowledged(
        &self,
        keys: &LockKeys,
        token: &str,
        acknowledged: u32,
        replicas: Replicas,
    ) -> redis::RedisError {
        if let Err(error) = self.unlock(keys, token, true, None).await {
            tracing::debug!(target: "distlock", key = %keys.lock, %error, "could not give back a lock too few replicas acknowledged; it expires with its ttl");
        }
        tracing::debug!(target: "distlock", key = %keys.lock, acknowledged, wanted = replicas.count, "too few replicas acknowledged the lock; given back");
        not_replicated(&keys.lock, acknowledged, replicas.count)
    }

    /// One attempt: `SET NX PX` for a first try without fencing; otherwise the acquire script,
    /// which also takes or renews a place in line, as `wait` says. With the attempt, the place
    /// it took or renewed, if it did. `entry`: the renewing waiter's entry in line as this
    /// manager knows it, which lets the renewal skip looking for it (see `scripts::ACQUIRE`).
    pub(crate) async fn try_lock(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
        fencing: bool,
        wait: Wait,
        entry: Option<&Entry>,
    ) -> RedisResult<(Attempt, Option<Place>)> {
        let mut connection = self.connection().await?;
        let mut sent_again = false;
        if !fencing && wait == Wait::FirstTry {
            let set = match self.replicas {
                None => set_nx(&mut connection, keys, token, ttl_millis).await,
                Some(replicas) => {
                    match set_nx_acked(&self.connections, keys, token, ttl_millis, replicas).await {
                        Ok((true, acknowledged)) if !replicas.enough(acknowledged) => {
                            return Err(self
                                .not_acknowledged(keys, token, acknowledged, replicas)
                                .await)
                        }
                        set => set.map(|(taken, _)| taken),
                    }
                }
            };
            match set {
                Ok(taken) => {
                    return Ok((
                        if taken {
                            Attempt::Acquired {
                                fence: None,
                                expires_in: Duration::from_millis(ttl_millis),
                            }
                        } else {
                            Attempt::Held { remaining: None }
                        },
                        None,
                    ))
                }
                // Sent once more on the connection made anew (see `once_more_if_dropped`), as
                // the acquire script's first try below, which finds the lock ours if the `SET`
                // ran after all.
                Err(error) if self.sends_once_more(&error) => {
                    connection = self.connection().await?;
                    sent_again = true;
                }
                Err(error) => return Err(error),
            }
        }
        // A first try is sent once more at most: after a `SET` that met a dropped connection,
        // the script below is that once.
        let may_send_again = wait == Wait::FirstTry && !sent_again;
        let channel = match &wait {
            Wait::FirstTry => "",
            Wait::InLine { channel, .. } => channel.as_deref().unwrap_or(""),
        };
        match self.protocol {
            Protocol::Line => {
                let (line, fence, since, leases) =
                    (keys.line(), keys.fence(), keys.since(), keys.leases());
                let renewing = matches!(wait, Wait::InLine { renewing: true, .. });
                let (entry_text, lease) = match entry.filter(|_| renewing) {
                    // The lease only when the entry names the channel this look names: else
                    // the entry is rewritten, and must be looked for. A place that names no
                    // channel is handed the lock with no message, and is looked for each time.
                    Some(entry) => (
                        entry.text.as_str(),
                        entry
                            .lease
                            .filter(|_| !channel.is_empty() && entry.channel() == channel)
                            .map_or_else(String::new, |lease| lease.to_string()),
                    ),
                    None => ("", String::new()),
                };
                let mut cmd = scripts::evalsha(
                    &scripts::ACQUIRE,
                    &[&keys.lock, &line, &fence, &since, &leases],
                    10,
                    token.len()
                        + 20
                        + 1
                        + channel.len()
                        + 20
                        + 20
                        + 5
                        + 1
                        + entry_text.len()
                        + lease.len(),
                );
                cmd.arg(token)
                    .arg(ttl_millis)
                    .arg(flag(fencing))
                    .arg(channel)
                    .arg(millis(super::LEASE))
                    .arg(millis(super::CLAIM))
                    .arg(match wait {
                        Wait::FirstTry => "first",
                        // A connection that sends a command again after losing its reply (a
                        // cluster's) may run a join twice: it joins as a renewal does, finding
                        // the token's entry before appending one, so that a second run leaves
                        // one place, not a second that outlives the waiter's leaving.
                        Wait::InLine {
                            renewing: false, ..
                        } if !self.resends_commands() => "join",
                        Wait::InLine { .. } => "renew",
                    })
                    .arg(flag(counts_receivers(&connection)))
                    .arg(entry_text)
                    .arg(lease);
                // A first try's own write is what `WAIT` counts: sent with it. A look in line
                // may find the lock handed over by another connection's write, which this
                // connection's `WAIT` would not count: confirmed below instead.
                let acked = self
                    .replicas
                    .filter(|_| wait == Wait::FirstTry && !sent_again);
                let (reply, acknowledged): (Vec<i64>, Option<u32>) =
                    match acquire_script(acked, &cmd, &mut connection, &self.connections).await {
                        // A first try runs the same twice (a second run finds the lock its first
                        // took, and the fencing token issued then): sent once more on the
                        // connection made anew. A place in line is kept by the waiter instead (see
                        // `Backend::keeps_place_through`).
                        // The second run may find the lock the first took on the connection
                        // that dropped, whose write this one's `WAIT` does not count: with no
                        // `WAIT` here, it is confirmed below as a lock found handed over is.
                        Err(error) if may_send_again && self.sends_once_more(&error) => {
                            let mut connection = self.connection().await?;
                            acquire_script(None, &cmd, &mut connection, &self.connections).await?
                        }
                        reply => reply?,
                    };
                let place = |deadline: i64, first: bool, written: i64| {
                    let written = match written {
                        0 => Written::Lease,
                        1 => Written::EntryAndLease,
                        _ => Written::Entry,
                    };
                    u64::try_from(deadline)
                        .ok()
                        .filter(|&at| at > 0)
                        .map(|deadline| Place {
                            deadline,
                            first,
                            written,
                        })
                };
                match reply.as_slice() {
                    // The script refuses a counter below 1 itself; should a token below 1 come
                    // back anyway, it is never handed out as if it were one.
                    [1, fence, _] if fencing && *fence < 1 => {
                        let _ = self.unlock(keys, token, true, None).await;
                        Err(bad_fence(&keys.fence(), *fence))
                    }
                    [1, fence, pttl] => {
                        let mut expires_in =
                            Duration::from_millis(u64::try_from(*pttl).unwrap_or(0));
                        if let Some(replicas) = self.replicas {
                            let acknowledged = match acknowledged {
                                Some(acknowledged) => acknowledged,
                                // Found handed over (or taken by a run on a connection that
                                // dropped): a write of this connection's own (the full ttl) and
                                // its `WAIT` carry that write too.
                                None => match self
                                    .extend_acked(keys, token, ttl_millis, replicas)
                                    .await?
                                {
                                    (Ownership::Ours, acknowledged) => {
                                        expires_in = Duration::from_millis(ttl_millis);
                                        acknowledged
                                    }
                                    (Ownership::Lost(_), _) => {
                                        return Ok((Attempt::Held { remaining: None }, None))
                                    }
                                },
                            };
                            if !replicas.enough(acknowledged) {
                                return Err(self
                                    .not_acknowledged(keys, token, acknowledged, replicas)
                                    .await);
                            }
                        }
                        Ok((
                            Attempt::Acquired {
                                fence: fencing.then(|| u64::try_from(*fence).unwrap_or(0)),
                                expires_in,
                            },
                            None,
                        ))
                    }
                    // Behind another waiter: the holder's expiry is the first waiter's to watch;
                    // this one looks again at its renewal, or when its hand-off comes.
                    [0, -3, deadline, written] => Ok((
                        Attempt::Held {
                            remaining: Some(super::LEASE),
                        },
                        place(*deadline, false, *written),
                    )),
                    [0, pttl, deadline, written] => Ok((
                        Attempt::Held {
                            remaining: u64::try_from(*pttl).ok().map(Duration::from_millis),
                        },
                        place(*deadline, true, *written),
                    )),
                    other => Err(unexpected_reply("the acquire script", other)),
                }
            }
            // A Redlock master is asked through `vote`, which names the caller's place in the
            // wake list and reports the holder: the quorum needs both, an `Attempt` has neither.
            Protocol::Wake => Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "a Redlock master takes votes, not attempts",
            ))),
        }
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
    ) -> RedisResult<Vote> {
        let mut connection = self.connection().await?;
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
                Err(error) if self.sends_once_more(&error) => {
                    return self
                        .vote_by_script(keys, token, ttl_millis, None, false)
                        .await;
                }
                Err(error) => return Err(error),
            }
        }
        self.once_more_if_dropped(|| self.vote_by_script(keys, token, ttl_millis, member, true))
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
    ) -> RedisResult<Vote> {
        let mut connection = self.connection().await?;
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
            .arg(millis(super::LEASE))
            .arg(flag(waited));
        let reply: Vec<Value> =
            scripts::invoke(&scripts::QUORUM_ACQUIRE, &cmd, &mut connection).await?;
        match reply.as_slice() {
            [Value::Int(1)] => Ok(Vote::Granted),
            [Value::Int(0), Value::Int(pttl), holder] => Ok(Vote::Held {
                remaining: u64::try_from(*pttl).ok().map(Duration::from_millis),
                holder: redis::from_redis_value(holder.clone()).ok(),
            }),
            other => Err(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "unexpected reply",
                format!("the quorum acquire script answered {other:?}"),
            ))),
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
    ) -> RedisResult<bool> {
        // Sent once only: the quorum release has no marker, and a second run of one whose
        // first reached the master would find the lock gone, a false "not ours".
        let mut connection = self.connection().await?;
        self.release_vote_on(&mut connection, keys, token, member, wake)
            .await
    }

    async fn release_vote_on(
        &self,
        connection: &mut Connection,
        keys: &LockKeys,
        token: &str,
        member: Option<&str>,
        wake: bool,
    ) -> RedisResult<bool> {
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

    /// Deletes the lock if it is still ours (handing it to the next waiter, or waking the
    /// waiters); `false` if it was not ours. With `leave`, also takes `token` out of the line: a
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
        leave: bool,
        redis_clock: Option<u64>,
    ) -> RedisResult<Released> {
        let marked = !leave && self.may_be_idle_closed();
        self.once_more_if_dropped_when(marked || leave, || {
            self.unlock_through_failover(keys, token, leave, redis_clock, marked)
        })
        .await
    }

    /// [`Node::unlock`], tried again while a cluster is in flux or a Sentinel service fails
    /// over.
    async fn unlock_through_failover(
        &self,
        keys: &LockKeys,
        token: &str,
        leave: bool,
        redis_clock: Option<u64>,
        marked: bool,
    ) -> RedisResult<Released> {
        let give_up = tokio::time::Instant::now() + CLUSTER_IN_FLUX_GIVE_UP;
        let mut pause = CLUSTER_IN_FLUX_BACKOFF.first;
        let sentinel = self.connections.is_sentinel();
        loop {
            let mut in_cluster = false;
            let result = match self.connection().await {
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
                Err(error) => Err(error),
            };
            match result {
                Err(error)
                    if ((in_cluster
                        && (cluster_in_flux(&error) || error.is_connection_refusal()))
                        || (sentinel
                            && crate::redis::sentinel::not_run_for_want_of_a_master(&error)))
                        && tokio::time::Instant::now() + pause < give_up =>
                {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(CLUSTER_IN_FLUX_BACKOFF.max);
                }
                result => return result,
            }
        }
    }

    async fn unlock_on(
        &self,
        connection: &mut Connection,
        keys: &LockKeys,
        token: &str,
        leave: bool,
        re_sent_within: Option<Duration>,
        redis_clock: Option<u64>,
    ) -> RedisResult<Released> {
        let released: i64 = match self.protocol {
            Protocol::Line => {
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
                    .arg(millis(super::CLAIM))
                    .arg(flag(leave))
                    .arg(
                        re_sent_within
                            .map(millis)
                            .map_or_else(String::new, |ms| ms.to_string()),
                    )
                    .arg(flag(counts_receivers(connection)))
                    .arg(redis_clock.map_or_else(String::new, |now| now.to_string()));
                scripts::invoke(&scripts::RELEASE, &cmd, connection).await?
            }
            Protocol::Wake => {
                let deleted = self
                    .release_vote_on(connection, keys, token, None, !leave)
                    .await?;
                return Ok(if deleted {
                    Released::Freed
                } else {
                    Released::NotOurs(LostCause::Expired)
                });
            }
        };
        match (released, Ownership::from_reply(released)) {
            (2, _) => Ok(Released::HandedOver),
            (_, Some(Ownership::Ours)) => Ok(Released::Freed),
            (_, Some(Ownership::Lost(cause))) => Ok(Released::NotOurs(cause)),
            (other, None) => Err(unexpected_reply("the release script", &[other])),
        }
    }

    /// Appends `entry` to the lock's line if the line exists (`RPUSHX`); `false` when it does
    /// not, and nothing was written.
    pub(crate) async fn push_place(&self, keys: &LockKeys, entry: &str) -> RedisResult<bool> {
        let mut connection = self.connection().await?;
        let length: i64 = redis::cmd("RPUSHX")
            .arg(keys.line())
            .arg(entry)
            .query_async(&mut connection)
            .await?;
        Ok(length > 0)
    }

    /// Keeps the lock `keep_millis` from now instead of deleting it, if it is still ours (for the
    /// line, when someone waits: see `HOLD`), and wakes the first waiter to learn when the hold
    /// ends; `false` if it was not ours.
    pub(crate) async fn hold(
        &self,
        keys: &LockKeys,
        token: &str,
        keep_millis: u64,
    ) -> RedisResult<Ownership> {
        // Marked, and sent once more, on the rule of a release (see `Node::unlock`); not on a
        // Redlock master, whose hold has no marker.
        let marked = self.protocol == Protocol::Line && self.may_be_idle_closed();
        self.once_more_if_dropped_when(marked, || self.hold_once(keys, token, keep_millis, marked))
            .await
    }

    async fn hold_once(
        &self,
        keys: &LockKeys,
        token: &str,
        keep_millis: u64,
        marked: bool,
    ) -> RedisResult<Ownership> {
        let mut connection = self.connection().await?;
        let (script, cmd) = match self.protocol {
            // It may run twice — a cluster connection sends it again after a lost reply, and a
            // marked hold is sent once more after a dropped connection (see `Node::unlock`) —,
            // and a second run after the hold ended would find the lock gone: mark it, see
            // `HOLD`.
            Protocol::Line if marked || matches!(connection, Connection::Cluster(_)) => {
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
                    .arg(millis(super::CLAIM))
                    .arg(millis(self.connections.resend_window()));
                (&*scripts::HOLD, cmd)
            }
            Protocol::Line => {
                let (line, forced, since, leases) =
                    (keys.line(), keys.forced(), keys.since(), keys.leases());
                let mut cmd = scripts::evalsha(
                    &scripts::HOLD,
                    &[&keys.lock, &line, &forced, &since, &leases],
                    3,
                    token.len() + 20 + 20,
                );
                cmd.arg(token).arg(keep_millis).arg(millis(super::CLAIM));
                (&*scripts::HOLD, cmd)
            }
            Protocol::Wake => {
                let (wake_list, since) = (keys.wake_list(), keys.since());
                let mut cmd = scripts::evalsha(
                    &scripts::QUORUM_HOLD,
                    &[&keys.lock, &wake_list, &since],
                    2,
                    token.len() + 20,
                );
                cmd.arg(token).arg(keep_millis);
                (&*scripts::QUORUM_HOLD, cmd)
            }
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
    ) -> RedisResult<Ownership> {
        self.once_more_if_dropped(|| self.extend_once(keys, token, ttl_millis))
            .await
    }

    async fn extend_once(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
    ) -> RedisResult<Ownership> {
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
            return Err(not_replicated(&keys.lock, acknowledged, replicas.count));
        }
        Ok(ours)
    }

    /// Whether locks count only once replicas acknowledged them.
    pub(crate) fn waits_for_replicas(&self) -> bool {
        self.replicas.is_some()
    }

    /// See `Backend::confirm_replicated`.
    pub(crate) async fn confirm_replicated(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
    ) -> RedisResult<bool> {
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
    async fn extend_acked(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
        replicas: Replicas,
    ) -> RedisResult<(Ownership, u32)> {
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
    pub(crate) async fn force_unlock(&self, keys: &LockKeys, value: &str) -> RedisResult<bool> {
        self.once_more_if_dropped(|| self.force_unlock_once(keys, value))
            .await
    }

    async fn force_unlock_once(&self, keys: &LockKeys, value: &str) -> RedisResult<bool> {
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
            .arg(millis(super::CLAIM))
            .arg(flag(counts_receivers(&connection)))
            .arg(millis(FORCED_KEPT));
        let broken: i64 = scripts::invoke(&scripts::FORCE_RELEASE, &cmd, &mut connection).await?;
        Ok(broken == 1)
    }

    /// One look at the lock, as inspection shows it; `None` when it is free.
    pub(crate) async fn inspect(&self, keys: &LockKeys) -> RedisResult<Option<Look>> {
        let mut connection = self.connection().await?;
        let (line, fence, since, leases) = (keys.line(), keys.fence(), keys.since(), keys.leases());
        let cmd = scripts::evalsha(
            &scripts::INSPECT,
            &[&keys.lock, &line, &fence, &since, &leases],
            0,
            0,
        );
        let reply: Option<InspectReply> =
            scripts::invoke(&scripts::INSPECT, &cmd, &mut connection).await?;
        Ok(reply.map(|(value, pttl, waiters, fence, since)| {
            let granted = since.and_then(|record| granted_at(&record, &value));
            Look {
                value,
                ttl_left: u64::try_from(pttl).ok().map(Duration::from_millis),
                waiters,
                fence: fence.and_then(|raw| std::str::from_utf8(&raw).ok()?.parse().ok()),
                granted,
            }
        }))
    }

    /// Where to scan for lock keys: this server, or each master of the cluster.
    pub(crate) async fn scan_targets(&self) -> RedisResult<Vec<ScanTarget>> {
        let mut connection = self.connection().await?;
        if !matches!(connection, Connection::Cluster(_)) {
            return Ok(vec![ScanTarget::Server]);
        }
        // Each entry: start slot, end slot, then the master `[host, port, id, ..]`, then its
        // replicas. `CLUSTER SLOTS` rather than `CLUSTER SHARDS`: Redis 6.2 has only this one.
        let slots: Vec<Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut connection)
            .await?;
        let mut masters = Vec::new();
        for range in slots {
            let Value::Array(fields) = range else {
                continue;
            };
            let Some(Value::Array(master)) = fields.get(2) else {
                continue;
            };
            let host: Option<String> = master
                .first()
                .and_then(|v| redis::from_redis_value_ref(v).ok());
            let port: Option<u16> = master
                .get(1)
                .and_then(|v| redis::from_redis_value_ref(v).ok());
            if let (Some(host), Some(port)) = (host, port) {
                let target = ScanTarget::Address(host, port);
                if !masters.contains(&target) {
                    masters.push(target);
                }
            }
        }
        Ok(masters)
    }

    /// One `SCAN` step on `target`: the next cursor (0 when done) and the string keys found
    /// that match `pattern`.
    pub(crate) async fn scan(
        &self,
        target: &ScanTarget,
        cursor: u64,
        pattern: &str,
    ) -> RedisResult<(u64, Vec<Vec<u8>>)> {
        let mut connection = self.connection().await?;
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .arg("TYPE")
            .arg("string");
        match (target, &mut connection) {
            (ScanTarget::Address(host, port), Connection::Cluster(cluster)) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                let reply = cluster.route_command(cmd, routing).await?;
                Ok(redis::from_redis_value(reply)?)
            }
            _ => cmd.query_async(&mut connection).await,
        }
    }

    /// Whether the lock key holds `token` now.
    pub(crate) async fn is_held(&self, keys: &LockKeys, token: &str) -> RedisResult<bool> {
        let mut connection = self.connection().await?;
        let holder: Option<String> = redis::cmd("GET")
            .arg(&*keys.lock)
            .query_async(&mut connection)
            .await?;
        Ok(holder.as_deref() == Some(token))
    }
}

/// How many keys one `SCAN` step asks a server to look at: large enough that listing a big
/// keyspace takes few round trips, small enough that no step blocks the server for long.
const SCAN_COUNT: u64 = 1000;

/// The inspect script's reply for a held lock: value, pttl, waiters, fencing counter, `since`
/// record.
type InspectReply = (Vec<u8>, i64, u64, Option<Vec<u8>>, Option<Vec<u8>>);

/// The grant time in a `since` record (`"<UUID> <Redis time in ms>"`, see `granted` in
/// `scripts.rs`), if it names the holder of `value` (whose value starts with its UUID): a record
/// left by an earlier holder names another UUID.
fn granted_at(record: &[u8], value: &[u8]) -> Option<std::time::SystemTime> {
    let (uuid, millis) = std::str::from_utf8(record).ok()?.split_once(' ')?;
    if uuid.len() != 36 || value.get(..36) != Some(uuid.as_bytes()) {
        return None;
    }
    std::time::UNIX_EPOCH.checked_add(Duration::from_millis(millis.parse().ok()?))
}

/// What one look at a lock found (see `scripts::INSPECT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Look {
    /// The lock key's value: distlock's token and holder, or whatever else wrote it.
    pub(crate) value: Vec<u8>,
    /// `None`: the key has no expiry.
    pub(crate) ttl_left: Option<Duration>,
    pub(crate) waiters: u64,
    pub(crate) fence: Option<u64>,
    /// When its holder got it, for a holder that waited first (whose value was made before
    /// its wait); `None` when the value's own time is right.
    pub(crate) granted: Option<std::time::SystemTime>,
}

/// One server to scan for lock keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ScanTarget {
    /// The one server of a standalone endpoint (or a Redlock master).
    Server,
    /// A cluster master, by the address the cluster gives for it.
    Address(String, u16),
}

/// `SET key token NX PX ttl`: `true` when set. The plain command, no script: what a first try
/// sends, since the lock is free most times.
async fn set_nx(
    connection: &mut Connection,
    keys: &LockKeys,
    token: &str,
    ttl_millis: u64,
) -> RedisResult<bool> {
    // Sized up front ("SET", key, token, "NX", "PX", up to 20 digits): no reallocation.
    let mut set = Cmd::with_capacity(6, 3 + keys.lock.len() + token.len() + 4 + 20);
    set.arg("SET")
        .arg(&*keys.lock)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(ttl_millis);
    // `+OK` or a nil reply: read as a `Value`, which needs no allocation for either.
    match set.query_async(connection).await? {
        Value::Okay => Ok(true),
        Value::Nil => Ok(false),
        other => Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "SET NX PX answered neither OK nor nil",
            format!("{other:?}"),
        ))),
    }
}

/// `SET NX PX` and `WAIT` in one round trip: whether it was set, and how many replicas
/// acknowledged.
async fn set_nx_acked(
    connections: &Arc<Connections>,
    keys: &LockKeys,
    token: &str,
    ttl_millis: u64,
    replicas: Replicas,
) -> RedisResult<(bool, u32)> {
    let mut set = redis::cmd("SET");
    set.arg(&*keys.lock)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(ttl_millis);
    let (set, acknowledged): (Value, u32) = replicas.run(None, &set, connections).await?;
    Ok((set == Value::Okay, acknowledged))
}

/// The acquire script on `connection`, or — when `replicas` is given — with `WAIT` in the same
/// round trip on a connection lent by `connections` (see `Replicas::run`), whose count comes
/// with the reply.
async fn acquire_script(
    replicas: Option<Replicas>,
    cmd: &Cmd,
    connection: &mut Connection,
    connections: &Arc<Connections>,
) -> RedisResult<(Vec<i64>, Option<u32>)> {
    match replicas {
        None => scripts::invoke(&scripts::ACQUIRE, cmd, connection)
            .await
            .map(|reply| (reply, None)),
        Some(replicas) => replicas
            .run(Some(&scripts::ACQUIRE), cmd, connections)
            .await
            .map(|(reply, acknowledged)| (reply, Some(acknowledged))),
    }
}

/// Whether `error` is one that [`Node::naming_the_key`] made to name a helper key of the
/// lock (its line, fencing counter or a marker) that holds another type: the lock itself may
/// be held all the same.
pub(crate) fn names_a_helper(error: &redis::RedisError) -> bool {
    error.code() == Some("WRONGTYPE")
        && error
            .detail()
            .is_some_and(|detail| detail.contains(HELPER_OF_ANOTHER_TYPE))
}

/// What [`Node::naming_the_key`] says of a helper key of another type (and what
/// [`Node::names_a_helper`] looks for).
const HELPER_OF_ANOTHER_TYPE: &str =
    "holds a value of another type: something other than distlock wrote that key";

/// How long a force-released holder's token is kept in the lock's `forced` mark: a stuck holder
/// that comes back within it is told its lock was force-released. Past it, it is told the lock
/// expired (or was taken), which is also true by then.
const FORCED_KEPT: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a connection must have gone unused before a server may have closed it for being
/// idle (see [`Node::may_be_idle_closed`]).
const IDLE_CLOSE_POSSIBLE: Duration = Duration::from_secs(1);
/// How long a release retries while a cluster is in flux. A slot migration or a failover
/// usually settles within a few seconds; past that the lock expires at the end of its ttl, as
/// after any failed release.
const CLUSTER_IN_FLUX_GIVE_UP: Duration = Duration::from_secs(5);
/// The first and the longest pause between those retries.
const CLUSTER_IN_FLUX_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(10), Duration::from_millis(200));

/// Whether a cluster refused to run the command for now (it did not run): the slot is being
/// migrated, or has moved, or the cluster is failing over.
fn cluster_in_flux(error: &redis::RedisError) -> bool {
    use redis::ServerErrorKind::{Ask, ClusterDown, MasterDown, Moved, TryAgain};
    matches!(
        error.kind(),
        redis::ErrorKind::Server(TryAgain | Moved | Ask | ClusterDown | MasterDown)
    )
}

fn unexpected_reply(what: &str, reply: &[i64]) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        format!("{what} answered {reply:?}"),
    ))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The error for a fencing token below 1, naming the counter and what to do about it.
fn bad_fence(counter: &str, value: i64) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "fencing counter below 1",
        format!(
            "the fencing counter {counter} gave {value}; set it above the largest token your \
             storage has accepted, or delete it if no storage has seen its tokens"
        ),
    ))
}

/// Whether `PUBLISH` on `connection` answers how many of the waiters' connections received the
/// message, which tells a dead waiter (see `scripts::LINE_PRELUDE`): everywhere but on a
/// cluster, which forwards a publish to every node and counts only the receivers on the one
/// the lock lives on.
fn counts_receivers(connection: &Connection) -> bool {
    !matches!(connection, Connection::Cluster(_))
}

fn flag(on: bool) -> &'static str {
    if on {
        "1"
    } else {
        "0"
    }
}

/// The extend script's call: the lock, its forced mark and its since record; the token and the
/// new ttl.
fn extend_command(keys: &LockKeys, token: &str, ttl_millis: u64) -> Cmd {
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
