//! The global lock manager that `#[distributed_lock]` functions use.

use std::sync::{Mutex, PoisonError};

use once_cell::sync::OnceCell;

use crate::{LockError, LockManager};

static GLOBAL: OnceCell<LockManager> = OnceCell::new();

/// The last `init` that failed (`distlock::init` or `distlock::blocking::init`) and its
/// error's message: a program that only logs the failure and runs on then gets that cause from
/// every locked call, not a bare "not initialized" that hides it.
static FAILED_INIT: Mutex<Option<(&'static str, String)>> = Mutex::new(None);

/// Records that `call` failed with `error`, unless it failed only because a manager is already
/// installed (which works).
pub(crate) fn remember_failure(call: &'static str, error: &LockError) {
    if !matches!(error, LockError::AlreadyInitialized) {
        *FAILED_INIT.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((call, error.to_string()));
    }
}

/// The error of a call that needs a global manager when there is none:
/// [`LockError::InitFailed`] with the cause when an `init` failed, else
/// [`LockError::NotInitialized`].
pub(crate) fn not_initialized() -> LockError {
    match FAILED_INIT
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
    {
        Some((call, cause)) => LockError::InitFailed { call, cause },
        None => LockError::NotInitialized,
    }
}

/// Connects to Redis at `url` (checking with a `PING`) and installs the connection as the
/// global lock manager used by every `#[distributed_lock]` function. Call it once, at startup.
///
/// The global manager works from any tokio runtime, including the one runtime per test that
/// `#[tokio::test]` makes.
///
/// # Errors
/// [`LockError::AlreadyInitialized`] if a global manager is already installed,
/// [`LockError::Config`] for a malformed URL, [`LockError::Redis`] when Redis cannot be reached.
///
/// ```no_run
/// #[tokio::main]
/// async fn main() -> Result<(), distlock::LockError> {
///     distlock::init("redis://127.0.0.1:6379").await?;
///     Ok(())
/// }
/// ```
pub async fn init(url: &str) -> Result<(), LockError> {
    if GLOBAL.get().is_some() {
        return Err(LockError::AlreadyInitialized);
    }
    let result = match LockManager::connect(url).await {
        Ok(manager) => init_with(manager),
        Err(error) => Err(error),
    };
    if let Err(error) = &result {
        remember_failure("distlock::init", error);
    }
    result
}

/// Installs a manager built by hand (key prefix, timeouts, ...) as the global lock manager.
///
/// # Errors
/// [`LockError::AlreadyInitialized`] if a global manager is already installed.
///
/// ```no_run
/// # async fn example() -> Result<(), distlock::LockError> {
/// let manager = distlock::LockManager::builder("redis://127.0.0.1:6379")
///     .key_prefix("billing:lock:")
///     .connect()
///     .await?;
/// distlock::init_with(manager)?;
/// # Ok(())
/// # }
/// ```
pub fn init_with(manager: LockManager) -> Result<(), LockError> {
    GLOBAL
        .set(manager)
        .map_err(|_| LockError::AlreadyInitialized)
}

/// The global lock manager.
///
/// # Errors
/// [`LockError::NotInitialized`] before [`init`] or [`init_with`] succeeded;
/// [`LockError::InitFailed`], with its cause, when an `init` failed and none succeeded since.
///
/// ```no_run
/// # async fn example() -> Result<(), distlock::LockError> {
/// let manager = distlock::global()?;
/// let guard = manager.acquire("job:7", &distlock::LockOptions::new()).await?;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
pub fn global() -> Result<&'static LockManager, LockError> {
    GLOBAL.get().ok_or_else(not_initialized)
}
