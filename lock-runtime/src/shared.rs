//! [`Shared`]: what the clones of one manager and the locks it took share — where the locks
//! live, the key prefix and the in-process queues. The builder makes it, the manager wraps it,
//! and each held lock keeps it alive until its release.

use std::sync::Arc;

use crate::backend::Backend;
use crate::queue::LocalQueues;

/// The inside of one lock manager.
pub(crate) struct Shared {
    pub(crate) backend: Backend,
    pub(crate) key_prefix: String,
    pub(crate) queues: Arc<LocalQueues>,
    /// Where it connects, passwords hidden: for `Debug`.
    pub(crate) description: String,
}

impl Shared {
    /// A manager's inside over `backend`, before any Redis call.
    pub(crate) fn new(backend: Backend, key_prefix: String, description: String) -> Self {
        Shared {
            backend,
            key_prefix,
            queues: Arc::new(LocalQueues::default()),
            description,
        }
    }
}
