//! What a lock is taken as — the mutex, a semaphore's permit, a reader — and where a
//! deployment can give it.

use crate::backend::keys::{Kind, LockKeys};
use crate::{LockError, LockManager, LockOptions};

/// What a lock taken with `options` is: the mutex unless permits or a read mode say otherwise.
pub(crate) fn of(options: &LockOptions) -> Kind {
    match (options.permits_count(), options.lock_mode()) {
        (1, crate::LockMode::Write) => Kind::Mutex,
        (_, crate::LockMode::Read) => Kind::Read,
        (permits, _) => Kind::Permits(permits),
    }
}

impl LockManager {
    /// `keys` taken as a semaphore or a reader, where this deployment gives them their
    /// guarantees (see `Capabilities::leases`).
    pub(super) fn leased(&self, keys: LockKeys, kind: Kind) -> Result<LockKeys, LockError> {
        let capabilities = self.inner.backend.capabilities();
        let what = match kind {
            Kind::Permits(_) => "semaphores (permits(n > 1))",
            Kind::Read | Kind::Mutex => "read locks (mode(LockMode::Read))",
        };
        if !capabilities.leases {
            return Err(LockError::config(format!(
                "{what} are not available on Redlock: each master would count holders on its \
                 own and a holder needs only a majority, so more than n holders (or a reader \
                 beside a writer's starving line) could get in; use a standalone, Sentinel or \
                 cluster manager for them"
            )));
        }
        if capabilities.waits_for_replicas {
            return Err(LockError::config(format!(
                "{what} do not wait for replicas yet; use them on a manager without \
                 wait_for_replicas, or a mutex"
            )));
        }
        Ok(keys.with_kind(kind))
    }
}
