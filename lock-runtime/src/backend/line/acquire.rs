//! Taking a lock on one endpoint, or a place in its line.

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, Value};

use super::{after_resend, bad_fence, counts_receivers, flag, unexpected_reply, Node, Resend};
use crate::backend::failure::{self, Failure};
use crate::backend::keys::LockKeys;
use crate::backend::recent::{Entry, Written};
use crate::backend::replicas::Replicas;
use crate::backend::scripts;
use crate::backend::{Attempt, LockRequest, Ownership, RedisPlace, Unlock, Wait};
use crate::redis::connection::{Connection, Connections};
use crate::support::cold;
use crate::support::units::millis;

impl Node {
    /// One attempt past the plain `SET` of a first try (which `Node::attempt_within` sends):
    /// `SET NX PX` with a `WAIT` for a first try without fencing on a node that waits for
    /// replicas; otherwise the acquire script, which also takes or renews a place in line, as
    /// `wait` says. With the attempt, the place it took or renewed, if it did. `entry`: the
    /// renewing waiter's entry in line as this manager knows it, which lets the renewal skip
    /// looking for it (see `scripts::ACQUIRE`). `set_dropped`: the first try's `SET` was sent
    /// already, and met a dropped connection: the script is that first try, sent again.
    pub(crate) async fn try_lock(
        &self,
        request: LockRequest<'_>,
        entry: Option<&Entry>,
        set_dropped: bool,
    ) -> failure::Result<(Attempt, Option<RedisPlace>)> {
        let LockRequest {
            keys,
            token,
            ttl_millis,
            fencing,
            ref wait,
        } = request;
        let connection = self.connection().await?;
        let first_set = !fencing && *wait == Wait::FirstTry && !set_dropped;
        if let Some(replicas) = self.replicas.filter(|_| first_set) {
            let acked = set_nx_acked(&self.connections, keys, token, ttl_millis, replicas);
            let set = match acked.await {
                Ok((true, acknowledged)) if !replicas.enough(acknowledged) => {
                    let refused = || self.not_acknowledged(keys, token, acknowledged, replicas);
                    return Err(cold::boxed(refused).await);
                }
                set => set.map(|(taken, _)| taken),
            };
            match set {
                Ok(taken) => return Ok((set_answer(taken, ttl_millis), None)),
                // Sent once more on the connection made anew (see `Node::send`), as
                // the acquire script's first try below, which finds the lock ours if the `SET`
                // ran after all.
                Err(error) if self.sends_again(Resend::Idempotent, &error) => {
                    let again = cold::boxed(|| async {
                        let connection = self.connection().await?;
                        self.try_lock_by_script(request, entry, connection, true)
                            .await
                    });
                    return after_resend(error, again.await);
                }
                Err(error) => return Err(error),
            }
        }
        // Boxed: the script's future is many times the `SET`'s, and only a contended
        // acquisition (or one with fencing) runs it, while every acquisition carries this one.
        cold::boxed(|| self.try_lock_by_script(request, entry, connection, set_dropped)).await
    }

    /// The acquire script's part of [`Node::try_lock`]: every attempt but a first try without
    /// fencing, on `connection`; `sent_again` when it is the once a first try's `SET` is sent
    /// again.
    async fn try_lock_by_script(
        &self,
        request: LockRequest<'_>,
        entry: Option<&Entry>,
        mut connection: Connection,
        sent_again: bool,
    ) -> failure::Result<(Attempt, Option<RedisPlace>)> {
        let LockRequest {
            keys,
            token,
            ttl_millis,
            fencing,
            wait,
        } = request;
        // A first try is sent once more at most: after a `SET` that met a dropped connection,
        // the script below is that once.
        let rule = if wait == Wait::FirstTry && !sent_again {
            Resend::Idempotent
        } else {
            Resend::AtMostOnce
        };
        let channel = wait.channel_arg();

        let (line, fence, since, forced, leases) = (
            keys.line(),
            keys.fence(),
            keys.since(),
            keys.forced(),
            keys.leases(),
        );
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
            &[&keys.lock, &line, &fence, &since, &forced, &leases],
            10,
            token.len() + 20 + 1 + channel.len() + 20 + 20 + 5 + 1 + entry_text.len() + lease.len(),
        );
        cmd.arg(token)
            .arg(ttl_millis)
            .arg(flag(fencing))
            .arg(channel)
            .arg(millis(crate::backend::LEASE))
            .arg(millis(crate::backend::CLAIM))
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
                Err(first) if self.sends_again(rule, &first) => {
                    let again = async {
                        let mut connection = self.connection().await?;
                        acquire_script(None, &cmd, &mut connection, &self.connections).await
                    };
                    after_resend(first, again.await)?
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
                .map(|deadline| RedisPlace {
                    deadline,
                    first,
                    written,
                })
        };
        match reply.as_slice() {
            // The script refuses a counter below 1 itself; should a token below 1 come
            // back anyway, it is never handed out as if it were one.
            [1, fence, _] if fencing && *fence < 1 => {
                let _ = self.unlock(keys, token, Unlock::Leave, None).await;
                Err(bad_fence(keys.fence(), *fence))
            }
            [1, fence, pttl] => {
                let mut expires_in = Duration::from_millis(u64::try_from(*pttl).unwrap_or(0));
                if let Some(replicas) = self.replicas {
                    let acknowledged = match acknowledged {
                        Some(acknowledged) => acknowledged,
                        // Found handed over (or taken by a run on a connection that
                        // dropped): a write of this connection's own (the full ttl) and
                        // its `WAIT` carry that write too.
                        None => match self.extend_acked(keys, token, ttl_millis, replicas).await? {
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
                    remaining: Some(crate::backend::LEASE),
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

    /// Appends `entry` to the lock's line if the line exists (`RPUSHX`); `false` when it does
    /// not, and nothing was written.
    pub(crate) async fn push_place(&self, keys: &LockKeys, entry: &str) -> failure::Result<bool> {
        let mut connection = self.connection().await?;
        let length: i64 = redis::cmd("RPUSHX")
            .arg(keys.line())
            .arg(entry)
            .query_async(&mut connection)
            .await?;
        Ok(length > 0)
    }
}

/// What a first try's `SET NX PX` of `ttl_millis` says, by whether it set the key.
pub(super) fn set_answer(taken: bool, ttl_millis: u64) -> Attempt {
    if taken {
        Attempt::Acquired {
            fence: None,
            expires_in: Duration::from_millis(ttl_millis),
        }
    } else {
        Attempt::Held { remaining: None }
    }
}

/// `SET key token NX PX ttl`: `true` when set. The plain command, no script: what a first try
/// sends, since the lock is free most times.
pub(crate) async fn set_nx(
    connection: &mut Connection,
    keys: &LockKeys,
    token: &str,
    ttl_millis: u64,
) -> failure::Result<bool> {
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
        other => Err(Failure::UnexpectedReply {
            what: "SET NX PX",
            reply: format!("{other:?}"),
        }),
    }
}

/// `SET NX PX` and `WAIT` in one round trip: whether it was set, and how many replicas
/// acknowledged.
pub(super) async fn set_nx_acked(
    connections: &Arc<Connections>,
    keys: &LockKeys,
    token: &str,
    ttl_millis: u64,
    replicas: Replicas,
) -> failure::Result<(bool, u32)> {
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
pub(super) async fn acquire_script(
    replicas: Option<Replicas>,
    cmd: &Cmd,
    connection: &mut Connection,
    connections: &Arc<Connections>,
) -> failure::Result<(Vec<i64>, Option<u32>)> {
    Ok(match replicas {
        None => (
            scripts::invoke(&scripts::ACQUIRE, cmd, connection).await?,
            None,
        ),
        Some(replicas) => {
            let (reply, acknowledged) = replicas
                .run(Some(&scripts::ACQUIRE), cmd, connections)
                .await?;
            (reply, Some(acknowledged))
        }
    })
}
