//! What a lock is taken as — the mutex, a semaphore's permit, a reader — and where a
//! deployment can give it.

use std::sync::Arc;

use crate::acquire::finish::FinishOnDrop;
use crate::backend::keys::{Kind, LockKeys};
use crate::backend::Attempt;
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
    ///
    /// The lock is the reader's already, and no guard has it yet: if the caller stops waiting
    /// during the look, the look is finished in the background and the reader's lock then
    /// released (see `acquire::finish`), after the look, which would otherwise take a lease
    /// again for a token nobody holds.
    pub(super) async fn let_readers_in(&self, keys: &LockKeys, token: &Arc<str>, ttl_millis: u64) {
        let (manager, look_keys, look_token) = (self.clone(), keys.clone(), Arc::clone(token));
        let look = move || async move {
            let request = crate::backend::LockRequest {
                keys: &look_keys,
                token: &look_token,
                ttl_millis,
                fencing: false,
                wait: crate::backend::Wait::FirstTry,
            };
            manager.inner.backend.try_lock(request).await
        };
        let (manager, held_keys, held_token) = (self.clone(), keys.clone(), Arc::clone(token));
        let release = move |look: Option<crate::backend::failure::Result<Attempt>>| async move {
            tracing::debug!(target: "distlock", key = %held_keys.lock, "releasing a read lock handed to a cancelled acquire");
            let (keys, token) = (&held_keys, &held_token);
            manager.release_unanswered(keys, token, ttl_millis).await;
            // A look that got no answer (or none that will come: its runtime shut down) may
            // still be on its way, and would take a lease again after this release, on another
            // connection: look once more after it has surely landed.
            let landed = match &look {
                Some(Ok(_)) => true,
                Some(Err(error)) => !error.may_have_run(),
                None => false,
            };
            if !landed {
                manager.release_unanswered(keys, token, ttl_millis).await;
            }
        };
        if let Err(error) = FinishOnDrop::new(look, release).await {
            tracing::debug!(target: "distlock", key = %keys.lock, %error, "could not let in the readers behind a reader handed the lock; they come in at its release");
        }
    }
}
