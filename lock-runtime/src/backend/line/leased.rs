//! Leases in a leased set on one endpoint: a semaphore's permits and a read-write lock's
//! readers (docs/family.md). The mutex never comes here: its operations branch off to these
//! only when the lock's keys say another kind (`LockKeys::kind`).
//!
//! Every operation is one script on the lock's slot, as the mutex's are. An acquisition's
//! script finds a lease it already took (a call sent twice, a hand-off not heard yet) and
//! answers the same, and a place in line is looked for before one is written: each may be sent
//! again. A release that may be sent twice (on a cluster, or after an idle connection) leaves
//! its token in the lock's `releases` marks, by which its second run answers as its first;
//! any other is sent at most once, as the mutex's are (`Node::release_rule`).

use std::time::Duration;

use redis::Script;

use super::{counts_receivers, flag, unexpected_reply, Node, Resend};
use crate::backend::failure::{self, Failure};
use crate::backend::keys::{Kind, LockKeys};
use crate::backend::scripts;
use crate::backend::{Attempt, LockRequest, Ownership, Released, Wait, CLAIM, LEASE};
use crate::support::units::millis;
use crate::LostCause;

impl Node {
    /// One attempt to take a permit (`Kind::Permits`) or a read lock (`Kind::Read`), or the
    /// write lock of a name that readers hold (`Kind::Mutex`: the mutex's own script cannot
    /// wait for readers). Takes or renews a place in line as `wait` says.
    pub(crate) async fn leased_attempt(
        &self,
        request: LockRequest<'_>,
    ) -> failure::Result<Attempt> {
        let LockRequest {
            keys,
            token,
            ttl_millis,
            fencing,
            wait,
        } = request;
        let channel = wait.channel_arg();
        let place = match wait {
            Wait::FirstTry => "first",
            // The script looks for the caller's entry before it writes one either way; a
            // cluster's connection may send the join twice, and a renewal says what it is.
            Wait::InLine {
                renewing: false, ..
            } if !self.resends_commands() => "join",
            Wait::InLine { .. } => "renew",
        };
        let (script, line): (&Script, String) = match keys.kind {
            Kind::Permits(_) => (&scripts::SEMAPHORE_ACQUIRE, keys.permit_line()),
            Kind::Read | Kind::Mutex => (&scripts::RW_ACQUIRE, keys.line()),
        };
        let (fence, fences) = (keys.fence(), keys.permit_fences());
        let reply: Vec<i64> = self
            .send(Resend::Idempotent, || async {
                let mut connection = self.connection().await?;
                let mut cmd = scripts::evalsha(script, &[&keys.lock, &line, &fence, &fences], 9, 0);
                cmd.arg(token)
                    .arg(ttl_millis)
                    .arg(flag(fencing))
                    .arg(channel)
                    .arg(millis(LEASE))
                    .arg(millis(CLAIM));
                if let Kind::Permits(permits) = keys.kind {
                    cmd.arg(permits);
                }
                cmd.arg(place).arg(flag(counts_receivers(&connection)));
                scripts::invoke(script, &cmd, &mut connection)
                    .await
                    .map_err(Failure::from_family)
            })
            .await?;
        match reply.as_slice() {
            [1, fence, pttl] => {
                if fencing && *fence < 1 {
                    let _ = self.leased_unlock(keys, token, true).await;
                    return Err(super::bad_fence(keys.fence(), *fence));
                }
                Ok(Attempt::Acquired {
                    fence: fencing.then(|| u64::try_from(*fence).unwrap_or(0)),
                    expires_in: Duration::from_millis(u64::try_from(*pttl).unwrap_or(0)),
                })
            }
            // Behind another waiter: the first waiter watches the holders' expiry; this one
            // looks again at its renewal, or when its grant comes.
            [0, _, _, index] if *index > 0 => Ok(Attempt::Held {
                remaining: Some(LEASE),
            }),
            [0, pttl, _, _] => Ok(Attempt::Held {
                remaining: u64::try_from(*pttl).ok().map(Duration::from_millis),
            }),
            other => Err(unexpected_reply("a leased acquire script", other)),
        }
    }

    /// Gives back a permit or a read lock (or a write lock of a name readers use), letting in
    /// the next in line; with `leave`, also takes `token` out of the line (a waiter that gives
    /// up, passing on what was handed to it meanwhile).
    pub(crate) async fn leased_unlock(
        &self,
        keys: &LockKeys,
        token: &str,
        leave: bool,
    ) -> failure::Result<Released> {
        let (script, line): (&Script, String) = match keys.kind {
            Kind::Permits(_) => (&scripts::SEMAPHORE_RELEASE, keys.permit_line()),
            Kind::Read | Kind::Mutex => (&scripts::RW_RELEASE, keys.line()),
        };
        let (fence, fences, releases) = (keys.fence(), keys.permit_fences(), keys.releases());
        let forced = keys.forced_leases();
        let rule = if leave {
            Resend::Idempotent
        } else {
            self.release_rule()
        };
        let released: i64 = self
            .send(rule, || async {
                let mut connection = self.connection().await?;
                let window = self.resend_window_of(&connection, rule);
                let mut all = vec![&*keys.lock, &line, &fence, &fences, &forced];
                if window.is_some() {
                    all.push(&releases);
                }
                let mut cmd = scripts::evalsha(script, &all, 5, 0);
                cmd.arg(token)
                    .arg(millis(CLAIM))
                    .arg(flag(leave))
                    .arg(flag(counts_receivers(&connection)))
                    .arg(window.map_or_else(String::new, |window| millis(window).to_string()));
                scripts::invoke(script, &cmd, &mut connection)
                    .await
                    .map_err(Failure::from_family)
            })
            .await?;
        match released {
            1 => Ok(Released::Freed),
            2 => Ok(Released::HandedOver),
            0 => Ok(Released::NotOurs(LostCause::Expired)),
            -1 => Ok(Released::NotOurs(LostCause::Taken)),
            -2 => Ok(Released::NotOurs(LostCause::ForceReleased)),
            other => Err(unexpected_reply("a leased release script", &[other])),
        }
    }

    /// Gives back a permit or a read lock: why not, if it was not `token`'s.
    pub(crate) async fn leased_release(
        &self,
        keys: &LockKeys,
        token: &str,
    ) -> failure::Result<Ownership> {
        Ok(match self.leased_unlock(keys, token, false).await? {
            Released::Freed | Released::HandedOver => Ownership::Ours,
            Released::NotOurs(cause) => Ownership::Lost(cause),
        })
    }

    /// Takes `token` out of the line, giving back a permit or read lock handed to it
    /// meanwhile (`true` then).
    pub(crate) async fn leased_leave(&self, keys: &LockKeys, token: &str) -> failure::Result<bool> {
        Ok(!matches!(
            self.leased_unlock(keys, token, true).await?,
            Released::NotOurs(_)
        ))
    }

    /// Sets the remaining lease of a permit or a read lock to `ttl_millis`, if it is still
    /// `token`'s.
    pub(crate) async fn leased_extend(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
    ) -> failure::Result<Ownership> {
        let (fences, forced) = (keys.permit_fences(), keys.forced_leases());
        let extended: i64 = self
            .send(Resend::Idempotent, || async {
                let mut connection = self.connection().await?;
                let mut cmd = scripts::evalsha(
                    &scripts::SEMAPHORE_EXTEND,
                    &[&keys.lock, &fences, &forced],
                    2,
                    0,
                );
                cmd.arg(token).arg(ttl_millis);
                scripts::invoke(&scripts::SEMAPHORE_EXTEND, &cmd, &mut connection)
                    .await
                    .map_err(Failure::from_family)
            })
            .await?;
        match extended {
            1 => Ok(Ownership::Ours),
            0 => Ok(Ownership::Lost(LostCause::Expired)),
            -2 => Ok(Ownership::Lost(LostCause::ForceReleased)),
            other => Err(unexpected_reply("the leased extend script", &[other])),
        }
    }

    /// Breaks, for an operator, the permits or readers of `keys` (by `keys.kind`) whose values
    /// are in `seen` and still hold a lease, and lets in the head of the line (see
    /// `scripts::LEASED_FORCE_RELEASE`); `true` if any was broken (or by this same call, sent
    /// again: the `forced-leases` marks recognise it).
    pub(crate) async fn force_release_leases(
        &self,
        keys: &LockKeys,
        seen: &[String],
    ) -> failure::Result<bool> {
        let script = &*scripts::LEASED_FORCE_RELEASE;
        let (line, kind) = match keys.kind {
            Kind::Permits(_) => (keys.permit_line(), "permits"),
            Kind::Read | Kind::Mutex => (keys.line(), "read"),
        };
        let (fence, fences, forced) = (keys.fence(), keys.permit_fences(), keys.forced_leases());
        let broken: i64 = self
            .send(Resend::Idempotent, || async {
                let mut connection = self.connection().await?;
                let mut cmd = scripts::evalsha(
                    script,
                    &[&keys.lock, &line, &fence, &fences, &forced],
                    4 + seen.len(),
                    0,
                );
                cmd.arg(kind)
                    .arg(millis(CLAIM))
                    .arg(flag(counts_receivers(&connection)))
                    .arg(millis(super::release::FORCED_KEPT));
                for value in seen {
                    cmd.arg(value);
                }
                scripts::invoke(script, &cmd, &mut connection)
                    .await
                    .map_err(Failure::from_family)
            })
            .await?;
        Ok(broken > 0)
    }

    /// Whether a permit or a read lock is still `token`'s.
    pub(crate) async fn leased_is_held(
        &self,
        keys: &LockKeys,
        token: &str,
    ) -> failure::Result<bool> {
        let mut connection = self.connection().await?;
        let mut cmd = scripts::evalsha(&scripts::LEASED_HELD, &[&keys.lock], 1, 0);
        cmd.arg(token);
        let held: i64 = scripts::invoke(&scripts::LEASED_HELD, &cmd, &mut connection)
            .await
            .map_err(Failure::from_family)?;
        Ok(held == 1)
    }

    /// What the marker of a leased set at the lock key says it is (`#permits=<n>`, `#read`),
    /// for a mutex's script that met it (`WRONGTYPE`); `None` when the key is no leased set.
    pub(crate) async fn leased_marker(&self, keys: &LockKeys) -> Option<Kind> {
        let mut connection = self.connection().await.ok()?;
        let marker: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg(&*keys.lock)
            .arg("+inf")
            .arg("+inf")
            .arg("LIMIT")
            .arg(0)
            .arg(1)
            .query_async(&mut connection)
            .await
            .ok()?;
        let marker = marker.first()?;
        if marker == "#read" {
            return Some(Kind::Read);
        }
        marker
            .strip_prefix("#permits=")?
            .parse()
            .ok()
            .map(Kind::Permits)
    }
}
