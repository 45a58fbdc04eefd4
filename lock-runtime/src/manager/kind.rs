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

    /// After a reader is handed the lock, one look of its own: a writer's release (the
    /// mutex's, which knows no readers) hands a reader the whole lock, and this look moves it
    /// into the readers' set and lets in the readers behind it (see `rw_acquire.lua`). A
    /// reader let in among readers finds its lease and nothing changes. Should it fail, the
    /// readers behind come in at this reader's release instead.
    pub(super) async fn let_readers_in(&self, keys: &LockKeys, token: &str, ttl_millis: u64) {
        let look = self
            .inner
            .backend
            .try_lock(crate::backend::LockRequest {
                keys,
                token,
                ttl_millis,
                fencing: false,
                wait: crate::backend::Wait::FirstTry,
            })
            .await;
        if let Err(error) = look {
            tracing::debug!(target: "distlock", key = %keys.lock, %error, "could not let in the readers behind a reader handed the lock; they come in at its release");
        }
    }
}
