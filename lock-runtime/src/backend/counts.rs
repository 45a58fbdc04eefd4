//! [`ResourceCounts`]: what a manager holds, for tests that check nothing leaks.

/// Counts of a manager's internal resources (see `LockManager::resource_counts`), for leak tests.
#[cfg(feature = "resource-counts")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceCounts {
    /// Keys with an in-process queue (held or awaited by a task of this process).
    pub queued_keys: usize,
    /// Wake-up channels subscribed to.
    pub watched_channels: usize,
    /// Subscribe and unsubscribe requests waiting to be sent, over all wake-up connections.
    pub wake_requests: usize,
    /// Runtimes with a connection.
    pub connections: usize,
    /// Waiters registered for hand-off messages.
    pub registered_waiters: usize,
}
