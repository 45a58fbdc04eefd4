//! What a single endpoint remembers of each lock as it goes — a key just handed over, its last
//! place in a line, Redis's clock (`recent::Contended`), whether Redis refused the one-command
//! join — and the lock operations that use it: the ones the backend's dispatch calls.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::time::Instant;

use super::acquire::{set_answer, set_nx};
use super::{after_resend, Node, Resend};
use crate::backend::failure::{self, Failure};
use crate::backend::keys::{Kind, LockKeys};
use crate::backend::recent::Written;
use crate::backend::{Attempt, LockRequest, Ownership, Released, Taken, Unlock, Wait, LEASE};
use crate::redis::classify::Meaning;
use crate::support::cold;
use crate::LostCause;

/// How many times an attempt is made again when its script met a leased set of readers that
/// was gone when looked at: each time, readers came and went within one round trip.
const READERS_GONE_RETRIES: usize = 8;

impl Node {
    /// One attempt to take the lock; `wait` says what else it must find out or mark (see
    /// `Backend::try_lock`).
    /// Not an `async fn` of its own: that would wrap the attempt's future in one more layer,
    /// polled and dropped on every acquisition.
    pub(crate) fn attempt<'a>(
        &'a self,
        request: LockRequest<'a>,
    ) -> impl Future<Output = failure::Result<Attempt>> + 'a {
        self.attempt_within(request, READERS_GONE_RETRIES)
    }

    /// [`attempt`](Self::attempt), trying again up to `retries` times when the mutex's script
    /// met a leased set that was gone when its marker was read.
    ///
    /// A first try without fencing or replicas is a `SET NX`, sent here and only here: an
    /// uncontended acquisition is that `SET` answered, so it runs in a future and code of its
    /// own size, which every acquisition pays for. Anything else goes the whole way, boxed.
    async fn attempt_within(
        &self,
        request: LockRequest<'_>,
        retries: usize,
    ) -> failure::Result<Attempt> {
        let mut set_dropped = None;
        if request.wait == Wait::FirstTry && !request.fencing && self.replicas.is_none() {
            let mut connection = self.connection().await?;
            let LockRequest {
                keys,
                token,
                ttl_millis,
                ..
            } = request;
            match set_nx(&mut connection, keys, token, ttl_millis).await {
                Ok(taken) => return Ok(set_answer(taken, ttl_millis)),
                // Sent once more, by the acquire script on a connection made anew (see
                // `Node::try_lock`).
                Err(error) if self.sends_again(Resend::Idempotent, &error) => {
                    set_dropped = Some(error);
                }
                // A `SET`'s error names no key of another type: nothing below would change it.
                Err(error) => return Err(error),
            }
        }
        let dropped = set_dropped.is_some();
        let attempt = cold::boxed(|| self.attempt_in_full(request, retries, dropped)).await;
        match set_dropped {
            Some(first) => after_resend(first, attempt),
            None => attempt,
        }
    }

    /// [`attempt_within`](Self::attempt_within) past a first try's `SET`: the acquire script,
    /// or a `SET` and `WAIT` for replicas, and what their answer says; `set_dropped` when a
    /// first try's `SET` was sent already and met a dropped connection.
    async fn attempt_in_full(
        &self,
        request: LockRequest<'_>,
        retries: usize,
        set_dropped: bool,
    ) -> failure::Result<Attempt> {
        let LockRequest {
            keys,
            token,
            ttl_millis,
            fencing,
            wait,
        } = request;
        // Boxed, as the other paths an uncontended acquisition does not take: only a waiter
        // that joins can push its place itself.
        if matches!(wait, Wait::InLine { .. }) {
            let join = || self.join_behind(keys, token, ttl_millis, fencing, &wait);
            if let Some(pushed) = cold::boxed(join).await? {
                return Ok(pushed);
            }
        }
        let sent = Instant::now();
        let entry = match &wait {
            Wait::InLine { renewing: true, .. } => self.contended.entry(&keys.lock, token),
            _ => None,
        };
        let channel = match &wait {
            Wait::InLine {
                channel: Some(channel),
                ..
            } => Some(Arc::clone(channel)),
            _ => None,
        };
        let renewing = match &wait {
            Wait::FirstTry => None,
            Wait::InLine { renewing, .. } => Some(*renewing),
        };
        let request = LockRequest {
            keys,
            token,
            ttl_millis,
            fencing,
            wait,
        };
        let tried = self.try_lock(request, entry.as_ref(), set_dropped).await;
        // The mutex's script cannot wait for readers: a writer that finds them (a leased set
        // marked `#read`) takes the read-write lock's line instead — one more round trip, only
        // where readers use the name.
        if matches!(&tried, Err(failure) if failure.is_lock_key_of_another_type()) {
            let marker = cold::boxed(|| self.leased_marker(keys)).await;
            let again = |wait| LockRequest {
                keys,
                token,
                ttl_millis,
                fencing,
                wait,
            };
            let wait = match renewing {
                None => Wait::FirstTry,
                Some(renewing) => Wait::InLine {
                    channel: channel.clone(),
                    renewing,
                },
            };
            match marker {
                Some(Kind::Read) => return cold::boxed(|| self.leased_attempt(again(wait))).await,
                // No leased set any more: the last reader left between the script and the
                // look (and readers may be back by now). The key is looked at afresh; one of
                // another type fails every time and is named below.
                None if retries > 0 => {
                    return cold::boxed(|| self.attempt_within(again(wait), retries - 1)).await;
                }
                _ => {}
            }
        }
        let (attempt, place) = self.naming_the_key(keys, tried).await?;
        if let Some(place) = place {
            self.contended
                .place_given(&keys.lock, place, sent, Instant::now());
            // What the look did with the waiter's entry: its next renewal passes the
            // entry's text and its lease, and needs not look for it (see `ACQUIRE`).
            let text = (place.written != Written::Lease).then(|| {
                crate::backend::scripts::line_entry(
                    token,
                    place.deadline,
                    ttl_millis,
                    fencing,
                    channel.as_deref().unwrap_or(""),
                )
            });
            let lease = (place.written != Written::Entry).then_some(place.deadline);
            let token: Arc<str> = Arc::from(token);
            self.contended
                .entry_written(&keys.lock, &token, text, lease);
        }
        Ok(attempt)
    }

    /// A join in one command: the waiter's entry appended with `RPUSHX`, which appends only
    /// to a line that exists, that is, behind waiters who are served before it (a line with
    /// waiters in it is not left with a free lock: each release hands it to the first of them,
    /// and a lock that expires is taken by the first waiter's next look). Its lease deadline is
    /// one Redis gave a place of this manager's in this line less than a renewal ago (see
    /// `Contended::recent_place`), when the line's expiry was also set, two leases ahead. So a
    /// process that goes on contending for a lock joins its line with one command rather than
    /// a script that reads the clock.
    ///
    /// `None` when it cannot be used, and the acquire script must be run: the line is empty
    /// (the lock may be free), no recent deadline is known, the waiter is not joining (a first
    /// try, a renewal) or not subscribed (its entry would name no channel, and be judged by its
    /// lease alone), or on a cluster, whose connection may send a command twice (a second entry
    /// of the same waiter would be handed the lock after it is gone).
    async fn join_behind(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_millis: u64,
        fencing: bool,
        wait: &Wait,
    ) -> failure::Result<Option<Attempt>> {
        let Wait::InLine {
            channel: Some(channel),
            renewing: false,
        } = wait
        else {
            return Ok(None);
        };
        if self.resends_commands() {
            return Ok(None);
        }
        let Some(deadline) = self.contended.recent_place(&keys.lock) else {
            return Ok(None);
        };
        if self.join_refused.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let entry =
            crate::backend::scripts::line_entry(token, deadline, ttl_millis, fencing, channel);
        match self.push_place(keys, &entry).await {
            Ok(pushed) => {
                if pushed {
                    self.contended
                        .entry_written(&keys.lock, &Arc::from(token), Some(entry), None);
                }
                Ok(pushed.then_some(Attempt::Held {
                    // Behind another waiter: as the acquire script's `{0, -3, deadline, 2}`.
                    remaining: Some(LEASE),
                }))
            }
            // An ACL written before distlock used `RPUSHX`: the acquire script joins as well,
            // at its cost, from now on.
            Err(Failure::Redis(error))
                if crate::redis::classify::classify(&error) == Meaning::PermissionDenied =>
            {
                if !self.join_refused.swap(true, Ordering::Relaxed) {
                    tracing::warn!(target: "distlock", %error, "RPUSHX refused: joining the line with the acquire script instead, which costs Redis more; add +rpushx to the ACL user (see docs/tls-acl.md)");
                }
                Ok(None)
            }
            // A line key of another type, say: the acquire script tells what is wrong.
            Err(error) if error.is_permanent() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Deletes the lock if it is still ours, handing it to the next waiter; why not, if it was
    /// not ours. A lock `taken` by a first try, whose release is sent at most once, is first
    /// released by the short script, which deletes it when nobody waits (most times) and
    /// changes nothing otherwise; then the full release runs, one round trip more.
    pub(crate) async fn release(
        &self,
        keys: &LockKeys,
        token: &str,
        taken: Taken,
    ) -> failure::Result<Ownership> {
        // The short release's error when its reply may have been lost.
        let mut unanswered = None;
        if taken == Taken::FirstTry
            && self.release_rule() == Resend::AtMostOnce
            && !self.resends_commands()
            && !self.alone_refused.load(Ordering::Relaxed)
        {
            match self.release_alone(keys, token).await {
                Ok(true) => {
                    self.contended.forget(&keys.lock);
                    return Ok(Ownership::Ours);
                }
                // It deleted the lock, or changed nothing (someone waits: the lock would stay
                // theirs to wait out). The full release follows: a lock it finds still ours it
                // releases, and that is the answer; one it does not find may be the short
                // release's doing, and the error stands, never a `Lost` that may be false.
                Err(error) if error.may_have_run() => unanswered = Some(error),
                // Someone waits, or the lock is not ours: the full release says which. Or it
                // did not run (a failover under way, say): the full release rides it out.
                Ok(false) | Err(_) => {}
            }
        }
        // Boxed: the usual release ends above, and its future should not carry this one's size.
        let released =
            cold::boxed(|| self.unlock_naming_the_key(keys, token, Unlock::Release)).await;
        if let Some(error) = unanswered {
            // A lock found ours was not removed by the short release. Neither was one an
            // operator broke: the `forced` mark is written only while the lock key still holds
            // the holder's token, and cleared when a first try sent again takes the lock anew
            // under that token, so a mark naming ours proves the lock was there to break.
            // Any other lock not found ours may be the short release's doing.
            if !matches!(
                released,
                Ok(Released::HandedOver
                    | Released::Freed
                    | Released::NotOurs(LostCause::ForceReleased))
            ) {
                return Err(error);
            }
        }
        Ok(match released? {
            Released::HandedOver => {
                self.contended.mark(&keys.lock);
                Ownership::Ours
            }
            Released::Freed => {
                self.contended.forget(&keys.lock);
                Ownership::Ours
            }
            Released::NotOurs(cause) => Ownership::Lost(cause),
        })
    }

    /// Takes `token` out of the lock's line, and releases the lock if it was handed to `token`
    /// meanwhile (`true` then).
    pub(crate) async fn leave(&self, keys: &LockKeys, token: &str) -> failure::Result<bool> {
        Ok(!matches!(
            self.unlock_naming_the_key(keys, token, Unlock::Leave)
                .await?,
            Released::NotOurs(_)
        ))
    }

    /// The release script run as `how` says, with the Redis clock this manager knows for the
    /// lock, and a `WRONGTYPE` made into one that names the key (see `naming_the_key`).
    async fn unlock_naming_the_key(
        &self,
        keys: &LockKeys,
        token: &str,
        how: Unlock,
    ) -> failure::Result<Released> {
        let released = self
            .unlock(keys, token, how, self.contended.redis_clock(&keys.lock))
            .await;
        self.naming_the_key(keys, released).await
    }

    /// Breaks the lock for an operator (see `Backend::force_unlock`); `true` if it did.
    pub(crate) async fn force_release(
        &self,
        keys: &LockKeys,
        value: &str,
    ) -> failure::Result<bool> {
        let broken = self.force_unlock(keys, value).await;
        let freed = self.naming_the_key(keys, broken).await?;
        self.contended.forget(&keys.lock);
        Ok(freed)
    }

    /// See `Backend::place_may_be_gone`.
    pub(crate) fn place_may_be_gone(&self, key: &str, token: &str) {
        self.contended.place_may_be_gone(key, token);
    }

    /// See `Backend::recently_contended`.
    pub(crate) fn recently_contended(&self, key: &str) -> bool {
        self.contended.recently(key)
    }

    /// See `Backend::handed_over`.
    pub(crate) fn handed_over(&self, key: &Arc<str>) {
        self.contended.mark(key);
    }
}
