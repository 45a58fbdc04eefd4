//! One attempt to take a lock, safe to cancel: the try of [`LockManager::try_acquire`], and
//! each attempt of an acquisition that waits (see `driver`), with what cleans up after an
//! attempt whose caller stopped waiting or that got no answer.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::acquire::finish::FinishOnDrop;
use crate::backend::keys::{Kind, LockKeys};
use crate::backend::waits::Meanwhile;
use crate::backend::{Attempt, Taken, Wait};
use crate::guard::Acquired;
use crate::support::cold;
use crate::support::retry::Backoff;
use crate::{LockError, LockGuard, LockManager, LockOptions};

/// After releasing the token of an unanswered attempt found nothing, how long until it looks
/// once more: long enough for a command still in the network to have reached Redis.
const UNANSWERED_RECHECK: Duration = Duration::from_secs(1);

impl LockManager {
    /// [`LockManager::try_acquire`], without its metrics.
    pub(crate) async fn try_acquire_once(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let (ttl_millis, keys) = self.prepare(name, options)?;
        self.try_acquire_keys(ttl_millis, keys, options).await
    }

    /// [`LockManager::try_acquire_once`] of the lock (or locks taken together) `keys`, checked
    /// by `prepare`.
    pub(crate) async fn try_acquire_keys(
        &self,
        ttl_millis: u64,
        keys: LockKeys,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let Some(turn) = self.inner.queues.try_turn(&local_line(&keys)) else {
            return Ok(None);
        };
        let token = new_token(options, self.inner.pid);
        let sent = Instant::now();
        match self
            .attempt(
                &keys,
                &token,
                ttl_millis,
                options.fencing_enabled(),
                Wait::FirstTry,
            )
            .await?
        {
            Attempt::Acquired { fence, expires_in } => {
                tracing::debug!(target: "distlock", key = %keys.lock, fence, "acquired");
                let acquired = Acquired {
                    keys,
                    token,
                    fence,
                    turn,
                    since: sent,
                    expires_in,
                    taken: Taken::FirstTry,
                };
                Ok(Some(LockGuard::acquired(&self.inner, acquired, options)))
            }
            // A mutex's `SET NX` fails on a semaphore as on any held lock: told apart only
            // now, so an uncontended try stays one command. (With fencing, the acquire
            // script has already refused it.)
            Attempt::Held { .. } => {
                if !options.fencing_enabled() {
                    self.inner.backend.refuse_a_semaphore(&keys).await?;
                }
                Ok(None)
            }
        }
    }

    /// One attempt to take the lock. If the caller stops waiting while the command is in
    /// flight, the attempt still completes, and a lock it turns out to have won is released.
    ///
    /// An attempt that fails without an answer (response timeout, dropped connection) may
    /// still have reached Redis: a stopped or overloaded server runs it later and grants the
    /// lock to a caller that has given up, for the whole ttl. So its token is then released too,
    /// in the background, once Redis answers again (on the same connection, so after the
    /// attempt) — unless a waiter keeps its place through the error: it goes on under this
    /// token, its next look finds what this attempt did, and its place is left if it gives up.
    ///
    /// Not an `async fn`: the future it returns is the cancel-safe attempt itself, with no
    /// layer around it to poll and drop on every acquisition.
    pub(crate) fn attempt(
        &self,
        keys: &LockKeys,
        token: &Arc<str>,
        ttl_millis: u64,
        fencing: bool,
        wait: Wait,
    ) -> impl Future<Output = crate::backend::failure::Result<Attempt>> + Send + 'static {
        let in_line = matches!(wait, Wait::InLine { .. });
        let (manager, request_keys, request_token) =
            (self.clone(), keys.clone(), Arc::clone(token));
        // The request may finish on another task: it takes the acquisition's record of the
        // locks it holds meanwhile with it.
        let meanwhile = Meanwhile::current();
        // Only a mutex's plain `SET` answers its own re-sent grant "held": every script (a
        // fenced or contended attempt, a permit, a reader, locks taken together) finds the
        // caller's own token and answers as the first run did.
        let plain_set = matches!(wait, Wait::FirstTry)
            && !fencing
            && keys.kind == Kind::Mutex
            && keys.together.is_none();
        let request = move || async move {
            let request = crate::backend::LockRequest {
                keys: &request_keys,
                token: &request_token,
                ttl_millis,
                fencing,
                wait,
            };
            // Boxed when scoped (a task that holds locks already): the scope's future beside
            // the plain one would double the future that every acquisition boxes and moves.
            let backend = &manager.inner.backend;
            let attempt = match meanwhile {
                Some(meanwhile) => cold::boxed(|| meanwhile.scope(backend.try_lock(request))).await,
                None => backend.try_lock(request).await,
            };
            let attempt = match attempt {
                // A connection that sends a command again after a dropped reply may have been
                // answered "held" by the lock its first send took: ask whose it is. Inside the
                // request, so that a caller gone meanwhile still has that lock released.
                Ok(Attempt::Held { remaining })
                    if plain_set && backend.capabilities().resends_commands =>
                {
                    let (keys, token) = (&request_keys, &request_token);
                    cold::boxed(|| manager.own_after_a_resend(keys, token, ttl_millis, remaining))
                        .await
                }
                attempt => attempt,
            };
            if let Err(error) = &attempt {
                if error.may_have_run() && !manager.keeps_place(in_line, error) {
                    manager.release_unanswered_in_background(
                        request_keys,
                        request_token,
                        ttl_millis,
                    );
                }
            }
            attempt
        };
        let (manager, cleanup_keys, cleanup_token) =
            (self.clone(), keys.clone(), Arc::clone(token));
        let clean_up = move |outcome: Option<crate::backend::failure::Result<Attempt>>| async move {
            match outcome {
                // Granted to a caller that is gone; or it took (or renewed) a place in line,
                // maybe after the waiter's own leaving ran (a call finished in the background
                // is sent late): leave, passing on the lock if it is ours.
                Some(Ok(attempt)) => {
                    let granted = matches!(attempt, Attempt::Acquired { .. });
                    if granted {
                        tracing::debug!(target: "distlock", key = %cleanup_keys.lock, "releasing a lock granted to a cancelled acquire");
                    }
                    if granted || in_line {
                        manager.leave_line(&cleanup_keys, &cleanup_token).await;
                    }
                }
                // An error that may have run: the request released its token already, unless
                // it left that to a waiter keeping its place, which is gone now.
                Some(Err(error))
                    if !error.may_have_run() || !manager.keeps_place(in_line, &error) => {}
                // No answer, or none that will ever come (the runtime that drove the attempt
                // shut down): it may have been granted.
                Some(Err(_)) | None => {
                    manager
                        .release_unanswered(&cleanup_keys, &cleanup_token, ttl_millis)
                        .await;
                }
            }
        };
        FinishOnDrop::new(request, clean_up)
    }

    /// Whether a waiter (`in_line`) goes on under its token after `error`, keeping its place:
    /// then what the failed attempt may have done is found by its next look, not released.
    fn keeps_place(&self, in_line: bool, error: &crate::backend::Failure) -> bool {
        in_line && self.inner.backend.capabilities().keeps_place_through(error)
    }

    /// What a first try answered "held" on a connection that re-sends commands (a cluster's)
    /// really found: the lock its own first send took (then `Acquired`, for the ttl asked), or
    /// another holder's. If that cannot be asked, the lock may be `token`'s: the error is
    /// returned, and the lock released in the background — here when the error says the check
    /// did not run, for which `attempt` cleans up nothing; `attempt` releases after any other.
    async fn own_after_a_resend(
        &self,
        keys: &LockKeys,
        token: &Arc<str>,
        ttl_millis: u64,
        remaining: Option<Duration>,
    ) -> crate::backend::failure::Result<Attempt> {
        match self.inner.backend.is_held(keys, token).await {
            Ok(true) => {
                tracing::debug!(target: "distlock", key = %keys.lock, "acquired (a re-sent SET found its own grant)");
                Ok(Attempt::Acquired {
                    fence: None,
                    expires_in: Duration::from_millis(ttl_millis),
                })
            }
            Ok(false) => Ok(Attempt::Held { remaining }),
            Err(error) if error.may_have_run() => Err(error),
            Err(error) => {
                self.release_unanswered_in_background(keys.clone(), Arc::clone(token), ttl_millis);
                Err(error)
            }
        }
    }

    /// Takes `token` out of the lock's line, passing on the lock if it was handed to it.
    pub(crate) async fn leave_line(&self, keys: &LockKeys, token: &str) {
        if let Err(error) = self.inner.backend.leave(keys, token).await {
            tracing::debug!(target: "distlock", key = %keys.lock, %error, "could not leave the line; the place lapses with its lease");
        }
    }

    /// [`release_unanswered`](Self::release_unanswered) in a task of its own (on this runtime,
    /// after what its connection has sent; again on the background runtime should this one
    /// shut down first).
    fn release_unanswered_in_background(&self, keys: LockKeys, token: Arc<str>, ttl_millis: u64) {
        let manager = self.clone();
        crate::acquire::finish::spawn_clean_up(
            move |_: Option<()>| async move {
                manager.release_unanswered(&keys, &token, ttl_millis).await;
            },
            None,
        );
    }

    /// Releases whatever `token` holds or was granted by an attempt that got no answer (also
    /// the lock of a reader whose caller gave up, see `let_readers_in`): retries until
    /// Redis answers the release (it then runs after the attempt) or a grant would have expired
    /// anyway. An unanswered release is not enough: if the script is not cached yet, Redis
    /// answers it NOSCRIPT and only a caller still waiting loads the script and tries again.
    pub(super) async fn release_unanswered(&self, keys: &LockKeys, token: &str, ttl_millis: u64) {
        let give_up = Instant::now() + Duration::from_millis(ttl_millis);
        let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(500));
        let mut rechecked = false;
        loop {
            match self.inner.backend.leave(keys, token).await {
                Ok(true) => {
                    tracing::debug!(target: "distlock", key = %keys.lock, "released a lock granted to an attempt that had failed without an answer");
                    return;
                }
                // Not granted, as far as Redis has run the attempt. An attempt sent on another
                // connection (one whose runtime shut down) can still be in the network: look
                // once more after it has surely landed.
                Ok(false) if !rechecked && Instant::now() + UNANSWERED_RECHECK < give_up => {
                    rechecked = true;
                    tokio::time::sleep(UNANSWERED_RECHECK).await;
                }
                Err(_) if Instant::now() < give_up => {
                    tokio::time::sleep(backoff.next_pause()).await;
                }
                Ok(false) | Err(_) => return,
            }
        }
    }
}

/// A fresh lock value for one acquisition: a new UUID v4 and who takes the lock (process
/// `pid`, the one the manager's inside was made in: this one).
pub(crate) fn new_token(options: &LockOptions, pid: u32) -> Arc<str> {
    let value = crate::support::identity::new_value(options.encoded_label(), pid);
    if options.lock_mode() == crate::LockMode::Read {
        return crate::support::identity::as_reader(&value);
    }
    value
}

/// The in-process line an acquisition of `keys` waits in: the lock key's, shared by every
/// task of this process that wants it, for a mutex; a line of its own for a permit or a
/// reader. The process's line of a key lets one task at a time contend, which a semaphore of
/// n permits or readers that share must not; their order is kept by the line in Redis (in the
/// table, in process).
pub(crate) fn local_line(keys: &LockKeys) -> std::borrow::Cow<'_, Arc<str>> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    match keys.kind {
        Kind::Mutex => std::borrow::Cow::Borrowed(&keys.lock),
        _ => {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::borrow::Cow::Owned(Arc::from(format!("{}\u{0}{n}", keys.lock)))
        }
    }
}

pub(crate) fn timeout(keys: &LockKeys, started: Instant) -> LockError {
    // Locks taken together time out together: each is named, as one of them was busy.
    let key = match &keys.together {
        None => keys.lock.to_string(),
        Some(together) => std::iter::once(keys)
            .chain(together.iter())
            .map(|keys| &*keys.lock)
            .collect::<Vec<_>>()
            .join(", "),
    };
    LockError::Timeout {
        key,
        waited: started.elapsed(),
    }
}

/// The failure of a hand-off that could not issue the waiter's fencing token.
pub(crate) fn fence_failed(keys: &LockKeys) -> crate::backend::Failure {
    crate::backend::Failure::FencingBroken {
        counter: keys.fence(),
        value: None,
    }
}
