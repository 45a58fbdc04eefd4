//! Several locks at once from synchronous code: [`LockManager::acquire_all`] and
//! [`LockManager::try_acquire_all`], over the async manager's.

use std::panic::Location;

use super::{block_on, LockGuard, LockManager};
use crate::{LockError, LockOptions};

impl LockManager {
    /// Takes every lock of `names`, all or none, waiting up to `options.timeout` in all (see
    /// [`crate::LockManager::acquire_all`]).
    ///
    /// # Errors
    /// As [`crate::LockManager::acquire_all`]; [`LockError::InsideAsyncRuntime`] on a thread
    /// of an async runtime; [`LockError::Config`] at once when a locked `fn` running on this
    /// thread holds one of them already.
    ///
    /// ```no_run
    /// # fn example(manager: distlock::blocking::LockManager) -> Result<(), distlock::LockError> {
    /// let guard = manager.acquire_all(&["account:7", "account:3"], &distlock::LockOptions::new())?;
    /// assert_eq!(guard.keys(), ["lock:account:7", "lock:account:3"]);
    /// guard.release()?;
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn acquire_all<S: AsRef<str>>(
        &self,
        names: &[S],
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        for name in names {
            crate::manager::reentry::refuse_if_thread_holds(
                &self.inner,
                name.as_ref(),
                "LockManager::acquire_all",
            )?;
        }
        let guard = block_on(
            "LockManager::acquire_all",
            Location::caller(),
            self.inner.acquire_all(names, options),
        )??;
        Ok(LockGuard::new(guard))
    }

    /// One attempt at every lock of `names`: the guard if all were free, `None` (and nothing
    /// held) if any is held (see [`crate::LockManager::try_acquire_all`]).
    ///
    /// # Errors
    /// As [`crate::LockManager::try_acquire_all`]; [`LockError::InsideAsyncRuntime`] on a
    /// thread of an async runtime.
    ///
    /// ```no_run
    /// # fn example(manager: distlock::blocking::LockManager) -> Result<(), distlock::LockError> {
    /// if let Some(guard) = manager.try_acquire_all(&["seat:1", "seat:2"], &distlock::LockOptions::new())? {
    ///     guard.release()?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn try_acquire_all<S: AsRef<str>>(
        &self,
        names: &[S],
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let guard = block_on(
            "LockManager::try_acquire_all",
            Location::caller(),
            self.inner.try_acquire_all(names, options),
        )??;
        Ok(guard.map(LockGuard::new))
    }
}
