//! The global lock manager that `#[distributed_lock]` functions use.

use once_cell::sync::OnceCell;

use crate::{LockError, LockManager};

static GLOBAL: OnceCell<LockManager> = OnceCell::new();

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
    init_with(LockManager::connect(url).await?)
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
/// [`LockError::NotInitialized`] before [`init`] or [`init_with`] succeeded.
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
    GLOBAL.get().ok_or(LockError::NotInitialized)
}
