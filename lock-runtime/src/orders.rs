//! The orders in which the fleet took locks of two key templates: [`LockOrder`], read by
//! [`LockManager::orders`] (what `distlock order` shows). `hold::order` records them and warns
//! about the inversions; `backend::orders` keeps them in Redis.

use std::time::SystemTime;

use crate::backend::keys::orders_key;
use crate::backend::orders::SeenOrder;
use crate::{LockError, LockManager};

/// One order in which a task took locks of two key templates: holding a lock of `first`, it
/// waited for one of `second`. Two orders of the same templates, one each way, are an
/// inversion: two tasks doing both at once wait for each other until one times out.
///
/// ```no_run
/// # async fn example(manager: distlock::LockManager) -> Result<(), distlock::LockError> {
/// for order in manager.orders().await? {
///     println!(
///         "{} → {}: `{}` held it, `{}` waited (first seen by {})",
///         order.first, order.second, order.holder, order.taker, order.process
///     );
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockOrder {
    /// The key template held (`invoice:{id}`).
    pub first: String,
    /// The key template then waited for.
    pub second: String,
    /// The function that held the lock of `first` (`app::charge`).
    pub holder: String,
    /// The function that then waited for the lock of `second`.
    pub taker: String,
    /// The process that saw the order first: `<host> <pid>`.
    pub process: String,
    /// When it was first seen (by the Redis server's clock; in-process, this process's).
    pub first_seen: SystemTime,
}

impl LockOrder {
    /// Whether `other` is this order the other way round: the two make an inversion.
    ///
    /// ```no_run
    /// # async fn example(manager: distlock::LockManager) -> Result<(), distlock::LockError> {
    /// let orders = manager.orders().await?;
    /// for order in &orders {
    ///     if order.first < order.second && orders.iter().any(|other| order.is_opposite(other)) {
    ///         println!("{} and {} are taken in both orders", order.first, order.second);
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn is_opposite(&self, other: &LockOrder) -> bool {
        self.first == other.second && self.second == other.first
    }
}

impl From<SeenOrder> for LockOrder {
    fn from(seen: SeenOrder) -> Self {
        LockOrder {
            first: seen.first,
            second: seen.second,
            holder: seen.holder,
            taker: seen.taker,
            process: seen.process,
            first_seen: seen.first_seen,
        }
    }
}

impl LockManager {
    /// The orders in which tasks of the fleet took locks of two `#[distributed_lock]` key
    /// templates (holding one, waiting for the other), sorted by template: each order once,
    /// with the functions and the process that saw it first.
    ///
    /// Read from the record in Redis of this manager's key prefix, which every process of the
    /// fleet writes the first time it sees an order (one hash, at most 10 000 orders, kept 7
    /// days after its last write; on Redlock, the masters' records together). With
    /// [`LockManager::in_process`], the orders this process has seen. An order and its
    /// opposite make an inversion ([`LockOrder::is_opposite`]), which distlock warns about.
    ///
    /// # Errors
    /// [`LockError::Redis`] if Redis could not be asked (on Redlock, no master answered).
    ///
    /// ```no_run
    /// # async fn example(manager: distlock::LockManager) -> Result<(), distlock::LockError> {
    /// let orders = manager.orders().await?;
    /// println!("{} orders seen", orders.len());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn orders(&self) -> Result<Vec<LockOrder>, LockError> {
        let backend = self.backend()?;
        let recorded = match orders_key(self.key_prefix()) {
            Some(key) => backend.orders(&key).await?,
            None => Some(Vec::new()),
        };
        let seen = recorded.unwrap_or_else(crate::hold::order::seen_here);
        Ok(seen.into_iter().map(LockOrder::from).collect())
    }
}
