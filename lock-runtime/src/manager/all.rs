//! Several locks at once, all or none: [`LockManager::acquire_all`] and
//! [`LockManager::try_acquire_all`].
//!
//! Where the store takes them together (`Capabilities::together`: one server, or a cluster
//! slot shared by every key) the locks become one request whose keys carry the others
//! (`LockKeys::together`), and the usual driver takes them with one script per attempt.
//! Elsewhere (a cluster across slots, Redlock, the in-process table) they are taken one by one
//! in one canonical order — their full keys sorted byte-wise — each by the single lock's own
//! acquisition, within what is left of the one timeout; whatever was taken is given back when
//! the rest cannot be had. Every caller sorts the same way, so two callers never each hold a
//! key the other waits for.

use std::sync::Arc;

use tokio::time::Instant;

use crate::backend::keys::{slot, LockKeys};
use crate::backend::waits::Meanwhile;
use crate::backend::Together;
use crate::manager::reentry;
use crate::meters::{Meter, Stopwatch};
use crate::{LockError, LockGuard, LockManager, LockOptions};

impl LockManager {
    /// Takes every lock of `names` — all of them, or none — waiting up to `options.timeout`
    /// in all; one guard holds them, and releases, extends and checks them together.
    ///
    /// A name given twice (a transfer from an account to itself) is taken once. On one server
    /// (standalone, Sentinel), or on a cluster when the names share a hash tag
    /// (`account:{bank}:1`, `account:{bank}:2`), one atomic script per attempt takes them all:
    /// an uncontended acquisition is one round trip whatever the number of names. Otherwise
    /// (a cluster across slots, Redlock, [`in_process`](Self::in_process)) they are taken one
    /// at a time in the order of their full keys, and those taken are given back if the rest
    /// cannot be had in time. Either way every caller takes them in the same order, so two
    /// callers that pass the same names in opposite orders never deadlock, and waiting is
    /// first come, first served per key, as for [`acquire`](Self::acquire).
    ///
    /// Inside the scope of guards that hold some of the names ([`LockGuard::scope`], a locked
    /// body), those are re-entered, as [`acquire`](Self::acquire) re-enters one: the names
    /// held all → a re-entered guard at once, no command sent, whose release does nothing;
    /// some → only the rest are taken, and the guard releases only those. A name held as a
    /// read lock or a semaphore's permit is [`LockError::Config`] (no upgrade).
    ///
    /// # Errors
    /// [`LockError::Config`] for an empty `names`, for `permits(n > 1)` or
    /// [`LockMode::Read`](crate::LockMode::Read) (several keys are mutexes), for a name the
    /// task holds to read or as a permit, or as [`acquire`](Self::acquire) for any name;
    /// [`LockError::Timeout`] naming the key still held when the timeout ran out;
    /// [`LockError::Deadlock`] when this wait closes a wait-for cycle and is its victim, as for
    /// [`acquire`](Self::acquire): inside a guard's scope, or once it holds some of the names
    /// while it waits for the rest (those are held locks, in or out of a scope; it gives them
    /// back as it returns the error: their releases are sent in the background, so another
    /// waiter may get one a round trip after the error); [`LockError::Redis`] as for
    /// [`acquire`](Self::acquire).
    ///
    /// ```no_run
    /// # async fn example(manager: distlock::LockManager) -> Result<(), distlock::LockError> {
    /// let guard = manager
    ///     .acquire_all(&["account:{bank}:7", "account:{bank}:3"], &distlock::LockOptions::new())
    ///     .await?;
    /// assert_eq!(guard.keys(), ["lock:account:{bank}:7", "lock:account:{bank}:3"]);
    /// // ... move money between the two accounts ...
    /// guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_all<S: AsRef<str>>(
        &self,
        names: &[S],
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        let started = Stopwatch::start();
        let result = match self.here() {
            Ok(here) => here.all_waiting(&distinct(names), options).await,
            Err(error) => Err(error),
        };
        Meter::new(options).acquisition(result.as_ref().map(|_| true), started);
        result
    }

    /// [`acquire_all`](Self::acquire_all) of `names` (distinct), without its metrics.
    async fn all_waiting(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        check_all(names, options)?;
        let (reentered, rest) = reentry::reenter_all(self, names).await?;
        if rest.is_empty() {
            return joined(reentered).ok_or_else(no_names);
        }
        // A wait like `acquire`'s, watched for a deadlock inside a guard's scope, and also
        // once it holds some of the locks while it waits for the rest.
        let taken = self
            .watching(&rest, options, || self.take_all(&rest, options, false))
            .await?;
        // Waiting, the acquisition ends with the locks or an error: `None` means no names.
        let taken = taken.ok_or_else(no_names)?;
        Ok(taken.with_parts(reentered))
    }

    /// Takes every lock of `names` if all are free now — one attempt, no waiting — or none.
    ///
    /// Returns `Ok(None)` when any of them is held (in Redis, or by a task of this process
    /// that holds or waits for it); nothing is left held then. Inside the scope of guards
    /// that hold some of the names, those are re-entered, as for
    /// [`acquire_all`](Self::acquire_all).
    ///
    /// # Errors
    /// [`LockError::Config`] for an empty `names`, or as [`try_acquire`](Self::try_acquire).
    ///
    /// ```no_run
    /// # async fn example(manager: distlock::LockManager) -> Result<(), distlock::LockError> {
    /// let names = ["seat:12A", "seat:12B"];
    /// match manager.try_acquire_all(&names, &distlock::LockOptions::new()).await? {
    ///     Some(guard) => guard.release().await?,
    ///     None => println!("one of the seats is being booked"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn try_acquire_all<S: AsRef<str>>(
        &self,
        names: &[S],
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let started = Stopwatch::start();
        let result = match self.here() {
            Ok(here) => here.all_once(&distinct(names), options).await,
            Err(error) => Err(error),
        };
        Meter::new(options).acquisition(result.as_ref().map(Option::is_some), started);
        result
    }

    /// [`try_acquire_all`](Self::try_acquire_all) of `names` (distinct), without its metrics.
    async fn all_once(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        check_all(names, options)?;
        let (reentered, rest) = reentry::reenter_all(self, names).await?;
        if rest.is_empty() {
            return Ok(joined(reentered));
        }
        let taken = self.take_all(&rest, options, true).await?;
        Ok(taken.map(|taken| taken.with_parts(reentered)))
    }

    /// Takes the locks `names` (distinct, in the caller's order): waiting, or one attempt
    /// (`once`); `None` only for one attempt that found one held.
    async fn take_all(
        &self,
        names: &[&str],
        options: &LockOptions,
        once: bool,
    ) -> Result<Option<LockGuard>, LockError> {
        let mut prepared = Vec::with_capacity(names.len());
        for name in names {
            prepared.push(self.prepare(name, options)?);
        }
        let ttl_millis = prepared[0].0;
        let mut keys: Vec<LockKeys> = prepared.into_iter().map(|(_, keys)| keys).collect();
        let capabilities = self.inner.backend.capabilities();
        let together = keys.len() > 1
            // A lock handed over is confirmed with `WAIT` key by key: taken one by one there.
            && !capabilities.waits_for_replicas
            && match capabilities.together {
                Together::Always => true,
                Together::SameSlot => {
                    let first = slot(keys[0].lock.as_bytes());
                    keys.iter().all(|key| slot(key.lock.as_bytes()) == first)
                }
                Together::Never => false,
            };
        if together || keys.len() == 1 {
            let mut primary = keys.remove(0);
            if together {
                primary.together = Some(Arc::from(keys));
            }
            return if once {
                self.try_acquire_keys(ttl_millis, primary, options).await
            } else {
                self.acquire_keys(ttl_millis, primary, options)
                    .await
                    .map(Some)
            };
        }
        self.one_by_one(ttl_millis, keys, options, once).await
    }

    /// Takes `keys` (in the caller's order) one at a time in the order of their full keys,
    /// within one timeout; gives back those taken when one cannot be had.
    async fn one_by_one(
        &self,
        ttl_millis: u64,
        keys: Vec<LockKeys>,
        options: &LockOptions,
        once: bool,
    ) -> Result<Option<LockGuard>, LockError> {
        let deadline = Instant::now() + options.timeout_duration();
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_by(|&a, &b| keys[a].lock.as_bytes().cmp(keys[b].lock.as_bytes()));
        let mut taken: Vec<(usize, LockGuard)> = Vec::with_capacity(keys.len());
        for index in order {
            let key = keys[index].clone();
            let got = if once {
                self.try_acquire_keys(ttl_millis, key, options).await
            } else {
                // What is left of the one timeout; past it, one last attempt.
                let left = deadline.saturating_duration_since(Instant::now());
                let options = options.clone().timeout(left);
                self.acquire_keys(ttl_millis, key, &options).await.map(Some)
            };
            match got {
                Ok(Some(guard)) => {
                    // Held while the rest are waited for: deadlock detection follows it.
                    for held in guard.helds() {
                        Meanwhile::took(&held.keys, &held.token);
                    }
                    taken.push((index, guard));
                }
                other => {
                    give_back(taken).await;
                    return other.map(|_| None);
                }
            }
        }
        taken.sort_by_key(|(index, _)| *index);
        let mut guards = taken.into_iter().map(|(_, guard)| guard);
        let first = guards
            .next()
            .map(|first| first.with_parts(guards.collect()));
        Ok(first)
    }
}

/// Releases the locks of an acquisition that could not take them all, now rather than in the
/// background: the next waiter for each gets it at once.
async fn give_back(taken: Vec<(usize, LockGuard)>) {
    for (_, guard) in taken {
        let key = guard.shared_key();
        if let Err(error) = guard.release().await {
            tracing::debug!(target: "distlock", %key, %error, "could not give back a lock of an acquisition that could not take them all; it expires with its ttl");
        }
    }
}

/// Refuses an empty `names`, and a kind several keys cannot be taken as, before anything else
/// (re-entry included: a refused kind is refused even when the task holds every name).
fn check_all(names: &[&str], options: &LockOptions) -> Result<(), LockError> {
    if lock_limits::check_key_count(names.len()).is_err() {
        return Err(no_names());
    }
    lock_limits::check_kind_of_several(
        u64::from(options.permits_count()),
        options.lock_mode() == crate::LockMode::Read,
    )
    .map_err(|violation| LockError::config(crate::options::kind_message(violation)))
}

/// One guard of the re-entered guards `guards` (the first, the others its parts); `None` for
/// none.
fn joined(guards: Vec<LockGuard>) -> Option<LockGuard> {
    let mut guards = guards.into_iter();
    let first = guards.next()?;
    Some(first.with_parts(guards.collect()))
}

/// The error for an empty list of names.
fn no_names() -> LockError {
    LockError::config(
        "acquire_all was given no lock names: pass at least one name (a single name is the \
         same as `acquire`)",
    )
}

/// `names` without repeats, in the order each first appears.
fn distinct<S: AsRef<str>>(names: &[S]) -> Vec<&str> {
    let mut seen = Vec::with_capacity(names.len());
    for name in names {
        let name = name.as_ref();
        if !seen.contains(&name) {
            seen.push(name);
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::distinct;

    #[test]
    fn repeated_names_are_kept_once_in_their_first_place() {
        assert_eq!(distinct(&["b", "a", "b", "c", "a"]), ["b", "a", "c"]);
        assert_eq!(distinct(&[String::from("x"), String::from("x")]), ["x"]);
        assert!(distinct::<&str>(&[]).is_empty());
    }
}
