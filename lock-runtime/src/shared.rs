//! [`Shared`]: what the clones of one manager and the locks it took share — where the locks
//! live, the key prefix and the in-process queues. The builder makes it, the manager wraps it,
//! and each held lock keeps it alive until its release.
//!
//! **One per process.** A process forked without exec (a pre-fork server, a job runner) keeps
//! its parent's memory but none of its other threads: the connections, wake-up subscription and
//! queues it inherits are driven by tasks that no longer run there, and its sockets are still
//! the parent's. So every `Shared` remembers the process that made it, and in any other process
//! the manager works on a fresh one made from the same settings ([`Shared::current`]): new
//! connections, a wake-up channel of its own, empty queues. The manager never uses the inherited
//! one in the child: its sockets are shared with the parent, and using them would mix the two
//! processes' replies; the guards that hold it are the parent's (see `LockGuard`'s drop).

use std::sync::Arc;

use once_cell::sync::OnceCell;

use crate::acquire::queue::LocalQueues;
use crate::backend::Backend;
use crate::LockError;

/// Makes a manager's inside anew from its settings, without a Redis call (the process that
/// connected first checked them).
pub(crate) type Remake = Arc<dyn Fn() -> Result<Shared, LockError> + Send + Sync>;

/// The inside of one lock manager.
pub(crate) struct Shared {
    pub(crate) backend: Backend,
    pub(crate) key_prefix: String,
    pub(crate) queues: Arc<LocalQueues>,
    /// Where it connects, passwords hidden: for `Debug`.
    pub(crate) description: String,
    /// The process it was made in (and, through [`Shared::current`], the one using it).
    pub(crate) pid: u32,
    remake: Remake,
    /// The inside made from the same settings in a process forked from this one (the first
    /// to ask, in each process: a grandchild finds its parent's here, and goes one further).
    forked: OnceCell<Arc<Shared>>,
}

impl Shared {
    /// A manager's inside over `backend`, before any Redis call; `remake` makes another one
    /// the same way, for a forked process.
    pub(crate) fn new(
        backend: Backend,
        key_prefix: String,
        description: String,
        remake: Remake,
    ) -> Self {
        Shared {
            backend,
            key_prefix,
            queues: Arc::new(LocalQueues::default()),
            description,
            pid: std::process::id(),
            remake,
            forked: OnceCell::new(),
        }
    }

    /// The inside to use in this process: `self`, unless it was made in another process (this
    /// one was forked from it), then the one made for this process.
    ///
    /// # Errors
    /// [`LockError::Config`] if the settings, accepted in the process that made `self`, cannot
    /// be set up again here (not expected: making the inside anew sends nothing).
    pub(crate) fn current(self: &Arc<Self>) -> Result<&Arc<Self>, LockError> {
        if self.pid == std::process::id() {
            return Ok(self);
        }
        let forked = self.forked.get_or_try_init(|| {
            (self.remake)().map(Arc::new).map_err(|error| {
                LockError::config(format!(
                    "the lock manager cannot be set up anew in this forked process: {error}"
                ))
            })
        })?;
        forked.current()
    }

    /// Whether this inside belongs to another process (this one was forked from it): what it
    /// holds is that process's to release.
    pub(crate) fn is_inherited(&self) -> bool {
        self.pid != std::process::id()
    }
}
