//! Several locks of one slot taken together, all or none (`LockManager::acquire_all`): each
//! operation is one script over every key (`scripts::MULTI_ACQUIRE`, `MULTI_RELEASE`,
//! `MULTI_EXTEND`), so an uncontended multi-key cycle costs two round trips, as the mutex's.
//!
//! The keys are the primary lock's and those in its `together` list, in the caller's order;
//! the scripts drop repeats and sort them in byte order themselves, the order every caller
//! shares. A waiter waits in the line of the first busy key, where a release hands it that key
//! alone: so a hand-off message is a wake-up here, and the next look takes the rest.

use std::time::Duration;

use redis::{Cmd, Value};

use super::{counts_receivers, flag, unexpected_reply, Node, Resend};
use crate::backend::failure::{self, Failure};
use crate::backend::keys::LockKeys;
use crate::backend::scripts;
use crate::backend::waits::Meanwhile;
use crate::backend::{Attempt, LockRequest, Ownership, Wait};
use crate::support::units::millis;
use crate::LostCause;

/// Every lock of `keys`: the primary one first, then those taken with it.
fn locks(keys: &LockKeys) -> Vec<&LockKeys> {
    keys.every().collect()
}

/// `EVALSHA` of `script` over the locks of `keys`, their lines and their fencing counters
/// (the layout of `multi_acquire.lua` and `multi_release.lua`), then `last` if any, with room
/// for `argv_count` values.
fn command_with_helpers(
    script: &redis::Script,
    keys: &LockKeys,
    last: Option<String>,
    argv_count: usize,
) -> Cmd {
    let locks = locks(keys);
    let key_count = 3 * locks.len() + usize::from(last.is_some());
    let mut cmd = scripts::evalsha_head(script, key_count, argv_count, 0);
    for lock in &locks {
        cmd.arg(&*lock.lock);
    }
    for lock in &locks {
        cmd.arg(lock.line());
    }
    for lock in &locks {
        cmd.arg(lock.fence());
    }
    if let Some(last) = last {
        cmd.arg(last);
    }
    cmd
}

impl Node {
    /// One attempt to take every lock of `request.keys` at once (see `Backend::try_lock`).
    pub(crate) async fn attempt_together(
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
        let how = match &wait {
            Wait::FirstTry => "first",
            // Joined as a renewal where a command may run twice: one entry, not two.
            Wait::InLine { renewing, .. } if *renewing || self.resends_commands() => "renew",
            Wait::InLine { .. } => "join",
        };
        // A first try runs the same twice (a second run finds every key its first took); a
        // place in line is kept by the waiter instead.
        let rule = if wait == Wait::FirstTry {
            Resend::Idempotent
        } else {
            Resend::AtMostOnce
        };
        let reply: Value = self
            .send(rule, || async {
                let mut connection = self.connection().await?;
                let mut cmd = command_with_helpers(&scripts::MULTI_ACQUIRE, keys, None, 8);
                cmd.arg(token)
                    .arg(ttl_millis)
                    .arg(flag(fencing))
                    .arg(channel)
                    .arg(millis(crate::backend::LEASE))
                    .arg(how)
                    .arg(millis(crate::backend::CLAIM))
                    .arg(flag(counts_receivers(&connection)));
                // A key held as a semaphore or by readers answers `MODE`: a use of the name
                // the caller must change, said in the script's words.
                scripts::invoke(&scripts::MULTI_ACQUIRE, &cmd, &mut connection)
                    .await
                    .map_err(Failure::from_family)
            })
            .await?;
        let Value::Array(items) = &reply else {
            return Err(unexpected_value("the multi-key acquire script", &reply));
        };
        match items.as_slice() {
            [Value::Int(1), Value::Array(fences), Value::Int(ttl)] => {
                // The fencing token of the primary lock, the first of the caller's keys.
                let fence = match fences.first() {
                    Some(Value::Int(fence)) if fencing => {
                        if *fence < 1 {
                            return Err(Failure::FencingBroken {
                                counter: keys.fence(),
                                value: Some(*fence),
                            });
                        }
                        u64::try_from(*fence).ok()
                    }
                    _ => None,
                };
                Ok(Attempt::Acquired {
                    fence,
                    expires_in: Duration::from_millis(u64::try_from(*ttl).unwrap_or(0)),
                })
            }
            [Value::Int(0), Value::Int(pttl), rest @ ..] => {
                // The keys handed to this waiter that it keeps while it waits for the rest:
                // held locks for deadlock detection.
                if let Some(Value::Array(kept)) = rest.get(3) {
                    let locks = locks(keys);
                    let held = kept
                        .iter()
                        .filter_map(|position| match position {
                            Value::Int(position) => usize::try_from(*position).ok(),
                            _ => None,
                        })
                        .filter_map(|position| locks.get(position.checked_sub(1)?))
                        .map(|held| {
                            // One lock of them, recorded at on its own.
                            let mut held = (*held).clone();
                            held.together = None;
                            held
                        })
                        .collect();
                    Meanwhile::holds_together(held, token);
                }
                Ok(Attempt::Held {
                    remaining: match *pttl {
                        // Free, but others wait for it first: look again at the renewal.
                        -3 => Some(crate::backend::LEASE),
                        pttl => u64::try_from(pttl).ok().map(Duration::from_millis),
                    },
                })
            }
            _ => Err(unexpected_value("the multi-key acquire script", &reply)),
        }
    }

    /// Releases every lock of `keys` still `token`'s, handing each to the first live waiter
    /// of its line; with `leave`, also takes `token` out of every line (a waiter that gives
    /// up, passing on the keys handed to it meanwhile). `Lost` when any key was not `token`'s.
    ///
    /// A release that may be sent twice (on a cluster, or after an idle connection) leaves its
    /// token in the first lock's `releases` marks, by which a second run answers as the first;
    /// any other is sent once at most (`Node::release_rule`). A waiter leaving runs the same
    /// twice.
    pub(crate) async fn release_together(
        &self,
        keys: &LockKeys,
        token: &str,
        leave: bool,
    ) -> failure::Result<Ownership> {
        let rule = if leave {
            Resend::Idempotent
        } else {
            self.release_rule()
        };
        let reply: Vec<i64> = self
            .send(rule, || async {
                let mut connection = self.connection().await?;
                let window = self.resend_window_of(&connection, rule);
                let marks = window.map(|_| keys.releases());
                let mut cmd = command_with_helpers(&scripts::MULTI_RELEASE, keys, marks, 5);
                cmd.arg(token)
                    .arg(millis(crate::backend::CLAIM))
                    .arg(flag(leave))
                    .arg(flag(counts_receivers(&connection)))
                    .arg(window.map_or_else(String::new, |window| millis(window).to_string()));
                Ok(scripts::invoke(&scripts::MULTI_RELEASE, &cmd, &mut connection).await?)
            })
            .await?;
        match reply.as_slice() {
            [_, _, 0] => Ok(Ownership::Ours),
            [_, _, _] => Ok(Ownership::Lost(LostCause::Expired)),
            other => Err(unexpected_reply("the multi-key release script", other)),
        }
    }

    /// Sets the remaining ttl of every lock of `keys` still `token`'s; `Lost` when any was not
    /// (the others are extended anyway, so that the release that follows hands them on).
    pub(crate) async fn extend_together(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
    ) -> failure::Result<Ownership> {
        let locks = locks(keys);
        let mut cmd = scripts::evalsha_head(&scripts::MULTI_EXTEND, locks.len(), 2, 0);
        for lock in &locks {
            cmd.arg(&*lock.lock);
        }
        cmd.arg(token).arg(ttl_millis);
        let reply: Vec<i64> = self
            .send(Resend::Idempotent, || async {
                let mut connection = self.connection().await?;
                Ok(scripts::invoke(&scripts::MULTI_EXTEND, &cmd, &mut connection).await?)
            })
            .await?;
        match reply.as_slice() {
            [_, 0] => Ok(Ownership::Ours),
            [_, _] => Ok(Ownership::Lost(LostCause::Expired)),
            other => Err(unexpected_reply("the multi-key extend script", other)),
        }
    }

    /// Whether every lock of `keys` holds `token` now: one `MGET` (the keys share a slot).
    pub(crate) async fn is_held_together(
        &self,
        keys: &LockKeys,
        token: &str,
    ) -> failure::Result<bool> {
        let mut connection = self.connection().await?;
        let mut cmd = redis::cmd("MGET");
        for lock in locks(keys) {
            cmd.arg(&*lock.lock);
        }
        let values: Vec<Option<String>> = cmd.query_async(&mut connection).await?;
        Ok(values.iter().all(|value| value.as_deref() == Some(token)))
    }
}

fn unexpected_value(what: &'static str, reply: &Value) -> Failure {
    Failure::UnexpectedReply {
        what,
        reply: format!("{reply:?}"),
    }
}
