//! A waiter's place in a lock's line, left if the acquisition stops while it may hold one.

use std::sync::Arc;

use crate::backend::keys::LockKeys;
use crate::LockManager;

/// A waiter's place in the lock's line. If the acquisition gives up, or is dropped, while it may
/// hold one, it leaves the line — passing on a lock handed to it meanwhile — in the background,
/// also when its runtime is shutting down.
pub(crate) struct PlaceInLine {
    manager: LockManager,
    keys: LockKeys,
    token: Option<Arc<str>>,
}

impl PlaceInLine {
    pub(crate) fn new(manager: &LockManager, keys: &LockKeys) -> Self {
        PlaceInLine {
            manager: manager.clone(),
            keys: keys.clone(),
            token: None,
        }
    }

    /// `token` may hold a place from now on.
    pub(crate) fn occupy(&mut self, token: &Arc<str>) {
        self.token = Some(Arc::clone(token));
    }

    /// The place became the lock: nothing to leave.
    pub(crate) fn vacate(&mut self) {
        self.token = None;
    }

    /// Leaves the line now, in the background.
    pub(crate) fn give_up(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        let (manager, keys) = (self.manager.clone(), self.keys.clone());
        crate::acquire::finish::spawn_clean_up(
            move |_: Option<()>| async move { manager.leave_line(&keys, &token).await },
            None,
        );
    }
}

impl Drop for PlaceInLine {
    fn drop(&mut self) {
        self.give_up();
    }
}
