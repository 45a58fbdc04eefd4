//! Deadlock detection's I/O: a waiter that holds locks (inside their guards' scopes) records
//! its wait at each of them and walks the chain of waits from the lock it wants, as
//! `acquire::deadlock` decides; when that says this waiter is a cycle's victim, its
//! acquisition stops with [`LockError::Deadlock`].
//!
//! It runs beside the acquisition, not inside its driver: an acquisition that holds nothing,
//! or that does not wait long, never starts a walk, and the acquisition, cancel-safe, is
//! dropped when the victim gives up.

use std::future::Future;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::acquire::deadlock::{Detection, Edge, Verdict, Waiter, Walk};
use crate::backend::keys::{Kind, LockKeys};
use crate::backend::waits::{Meanwhile, Recording};
use crate::manager::reentry;
use crate::shared::Shared;
use crate::support::cold;
use crate::support::units::millis;
use crate::{LockError, LockGuard, LockManager, LockOptions};

impl LockManager {
    /// [`LockManager::acquire_waiting`], watched for a deadlock while the task holds locks of
    /// this manager on a store that detects them.
    pub(crate) async fn acquire_watching(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        let names = [name];
        match self.held_to_watch(&names, options) {
            // The usual case, nothing held: the acquisition itself, with no layer between it
            // and this one (each would be polled, and its code fetched, at every wake).
            None => {
                let (ttl_millis, keys) = self.prepare(name, options)?;
                self.acquire_keys(ttl_millis, keys, options).await
            }
            // Boxed: the watch's state does not enlarge every acquisition's future.
            Some(held) => {
                cold::boxed(|| {
                    self.watched(&names, held, options, || {
                        self.acquire_waiting(name, options)
                    })
                })
                .await
            }
        }
    }

    /// The acquisition `acquire` makes of the locks `names`, watched for a deadlock while the
    /// task holds locks of this manager on a store that detects them (else as it is). The
    /// future is made where it runs, so that it is held once, not once as an argument too.
    pub(crate) async fn watching<T, F: Future<Output = Result<T, LockError>>>(
        &self,
        names: &[&str],
        options: &LockOptions,
        acquire: impl FnOnce() -> F,
    ) -> Result<T, LockError> {
        match self.held_to_watch(names, options) {
            None => acquire().await,
            Some(held) => self.watched(names, held, options, acquire).await,
        }
    }

    /// The locks of this manager that the task holds, to be named in its wait records, when
    /// an acquisition of `names` with `options` is watched for a deadlock; `None` when it is
    /// not: nothing held (outside a guard's scope this is one task-local read), no waiting, or
    /// a store that does not detect deadlocks.
    fn held_to_watch(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Option<Vec<(LockKeys, Arc<str>)>> {
        let mut held = reentry::held_by_task(self);
        // A permit's holders are not followed (see `wait_look.lua`): its records would be
        // read by no walk.
        held.retain(|(keys, _)| !matches!(keys.kind, Kind::Permits(_)));
        // Several locks may be held meanwhile, as the acquisition takes them: then it is
        // watched from the start, though it walks only once it holds one.
        let unwatched = (held.is_empty() && names.len() < 2)
            || options.timeout_duration().is_zero()
            || !self.inner.backend.capabilities().detects_deadlocks;
        (!unwatched).then_some(held)
    }

    /// [`LockManager::watching`] of a task that holds `held`.
    async fn watched<T, F: Future<Output = Result<T, LockError>>>(
        &self,
        names: &[&str],
        held: Vec<(LockKeys, Arc<str>)>,
        options: &LockOptions,
        acquire: impl FnOnce() -> F,
    ) -> Result<T, LockError> {
        let mut wanted = Vec::with_capacity(names.len());
        for name in names {
            match self.prepare(name, options) {
                Ok((_, keys)) => wanted.push(keys.lock.to_string()),
                // The acquisition reports the error itself.
                Err(_) => return acquire().await,
            }
        }
        let meanwhile = Meanwhile::default();
        let acquisition = meanwhile.clone().scope(acquire());
        // Boxed: the watch's state does not enlarge every acquisition's future.
        cold::boxed(|| self.acquire_watched(wanted, held, meanwhile, acquisition)).await
    }

    /// `acquisition`, raced against the watch of a task holding `held` (and `meanwhile`,
    /// what the acquisition takes as it goes) that waits for `wanted` (full keys). An
    /// acquisition that fails ends its wait records before it returns, so that no walk sees
    /// them once the caller may act on the failure (release its locks); one that succeeds, or
    /// is cancelled, ends them in the background. A victim's acquisition is dropped, which
    /// gives back what it took meanwhile.
    async fn acquire_watched<T>(
        &self,
        wanted: Vec<String>,
        held: Vec<(LockKeys, Arc<str>)>,
        meanwhile: Meanwhile,
        acquisition: impl Future<Output = Result<T, LockError>>,
    ) -> Result<T, LockError> {
        let since_ms = millis(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default(),
        );
        let waiter = Waiter {
            wait_id: uuid::Uuid::new_v4().simple().to_string(),
            since_ms,
            tokens: held.iter().map(|(_, token)| Arc::clone(token)).collect(),
        };
        let mut records = Records {
            shared: Arc::clone(&self.inner),
            wait_id: waiter.wait_id.clone(),
            before: held.len(),
            held,
            meanwhile,
            waits_for: wanted.len(),
            written: false,
        };
        let result = tokio::select! {
            biased;
            acquired = acquisition => acquired,
            deadlock = self.watch(&wanted, waiter, &mut records) => Err(deadlock),
        };
        if result.is_err() {
            records.end().await;
        }
        result
    }

    /// Records this task's wait at each lock it holds and walks from `wanted`, until this
    /// waiter is a cycle's victim (then its error); dropped when the acquisition ends.
    async fn watch(&self, wanted: &[String], waiter: Waiter, records: &mut Records) -> LockError {
        let mut detection = Detection::new(waiter, Instant::now());
        loop {
            tokio::time::sleep_until(detection.walk_at()).await;
            let tokens = records.holding();
            if tokens.is_empty() {
                // Holding nothing yet, this waiter is in no cycle: nothing to send.
                detection.walked(Instant::now(), None);
                continue;
            }
            detection.holds(tokens);
            records.renew(wanted, detection.waiter()).await;
            let cycle = self.walk(wanted, detection.waiter()).await;
            if let Verdict::Report(edges) = detection.walked(Instant::now(), cycle) {
                // The lock of this waiter's wait that the cycle goes through.
                let key = edges
                    .first()
                    .map_or_else(|| wanted[0].clone(), |edge| edge.lock.clone());
                tracing::debug!(target: "distlock", %key, "deadlock: this waiter closes a wait-for cycle and gives up");
                return LockError::Deadlock {
                    key,
                    cycle: edges.iter().map(describe).collect(),
                };
            }
        }
    }

    /// One walk from `wanted`: the cycle through `waiter` it finds, if any. A failed look ends
    /// the walk without one.
    async fn walk(&self, wanted: &[String], waiter: &Waiter) -> Option<Vec<Edge>> {
        let mut walk = Walk::new(wanted);
        while let Some(lock) = walk.next_look() {
            let keys = LockKeys::new(lock.clone()).ok()?;
            let seen = match self.inner.backend.look_at(&keys).await {
                Ok(seen) => seen,
                Err(error) => {
                    tracing::debug!(target: "distlock", key = %keys.lock, %error, "deadlock check: a look failed; no cycle this time");
                    return None;
                }
            };
            if let Some(cycle) = walk.looked(waiter, &lock, &seen) {
                return Some(cycle);
            }
        }
        None
    }
}

/// The wait records of one wait: renewed before each walk, ended when the wait ends however
/// it ends (the acquisition's future dropped with them), on the background runtime.
struct Records {
    shared: Arc<Shared>,
    wait_id: String,
    /// The locks the wait is recorded at: those held before it began, then those its
    /// acquisition took meanwhile (kept once given back: an end there is refused, harmless).
    held: Vec<(LockKeys, Arc<str>)>,
    /// How many of `held` were held before the wait began.
    before: usize,
    /// What the acquisition holds meanwhile.
    meanwhile: Meanwhile,
    /// How many locks the wait waits for (one field each).
    waits_for: usize,
    written: bool,
}

impl Records {
    /// Adds the locks the acquisition holds meanwhile to those recorded at; the tokens of
    /// every lock the waiter holds now (none: it is in no cycle).
    fn holding(&mut self) -> Vec<Arc<str>> {
        let mut tokens: Vec<Arc<str>> = self.held[..self.before]
            .iter()
            .map(|(_, token)| Arc::clone(token))
            .collect();
        for (keys, token) in self.meanwhile.snapshot() {
            let known = self
                .held
                .iter()
                .any(|(held, held_token)| held.lock == keys.lock && *held_token == token);
            if !known {
                self.held.push((keys, Arc::clone(&token)));
            }
            tokens.push(token);
        }
        tokens.dedup();
        tokens
    }

    /// Writes (or renews) the records of this wait at each lock held; a failure is left to the
    /// next renewal (a lock whose record is not written stops the others' walks there).
    async fn renew(&mut self, wanted: &[String], waiter: &Waiter) {
        self.written = true;
        let record = Recording::Write {
            since_ms: waiter.since_ms,
            waits_for: wanted,
        };
        for (keys, token) in &self.held {
            let written = self
                .shared
                .backend
                .record_wait(keys, token, &self.wait_id, record)
                .await;
            if let Err(error) = written {
                tracing::debug!(target: "distlock", key = %keys.lock, %error, "deadlock check: could not record the wait");
            }
        }
    }

    /// Ends the wait at each lock held (best effort: a record not ended lapses after
    /// `RECORD_LIFE`); if this is cancelled, the drop ends it in the background.
    async fn end(&mut self) {
        if self.written {
            end_all(&self.shared, &self.held, &self.wait_id, self.waits_for).await;
            self.written = false;
        }
    }
}

/// Ends the wait `wait_id`, for `count` locks, at each of `held`.
async fn end_all(shared: &Shared, held: &[(LockKeys, Arc<str>)], wait_id: &str, count: usize) {
    let end = Recording::End { count };
    for (keys, token) in held {
        if let Err(error) = shared.backend.record_wait(keys, token, wait_id, end).await {
            tracing::debug!(target: "distlock", key = %keys.lock, %error, "deadlock check: could not end the wait record; it lapses");
        }
    }
}

impl Drop for Records {
    fn drop(&mut self) {
        if !self.written {
            return;
        }
        let shared = Arc::clone(&self.shared);
        let wait_id = std::mem::take(&mut self.wait_id);
        let held = std::mem::take(&mut self.held);
        let count = self.waits_for;
        crate::support::background::spawn(async move {
            end_all(&shared, &held, &wait_id, count).await;
        });
    }
}

/// An edge as the error shows it: the lock and who holds it.
fn describe(edge: &Edge) -> String {
    let who = crate::support::identity::parse(edge.holder.as_bytes()).map_or_else(
        || "an unknown holder".to_owned(),
        |identity| match identity.label {
            Some(label) => label,
            None => format!("process {} on {}", identity.pid, identity.host),
        },
    );
    format!("`{}` (held by {who})", edge.lock)
}
