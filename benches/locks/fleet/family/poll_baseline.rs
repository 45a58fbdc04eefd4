//! The family's poll baseline: for each section, the locks a user without distlock's
//! semaphore, read-write lock or `acquire_all` takes by hand with `SET NX` + poll (see
//! `fleet::hand_written`).

use super::Family;

/// What the poll baseline takes for one section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ByHand {
    /// One of these locks, tried in order from `first` on: a semaphore's slots.
    AnyOf { names: Vec<String>, first: usize },
    /// Every one of these locks, in this order.
    AllOf(Vec<String>),
}

impl Family {
    /// What the poll baseline takes by hand for section `n` of the fleet-wide task `task`, on
    /// the run whose name is `name`:
    /// - a semaphore of `n` permits: one of `n` slot keys, the task's first try at a slot of
    ///   its own (task modulo `n`), so that waiters do not all ask for slot 0 first;
    /// - a read-write lock: the one key, readers and writers alike, since a hand-written
    ///   `SET NX` lock has no shared mode;
    /// - a transfer: both accounts' keys, in account order, so that two transfers sharing two
    ///   accounts ask for them in the same order.
    pub(crate) fn by_hand(self, name: &str, task: usize, n: usize) -> ByHand {
        match self {
            Family::Semaphore { permits } => ByHand::AnyOf {
                names: (0..permits).map(|slot| Self::slot(name, slot)).collect(),
                first: task % usize::try_from(permits.max(1)).expect("permits fit a usize"),
            },
            Family::ReadWrite { .. } => ByHand::AllOf(vec![name.to_owned()]),
            Family::Transfers { .. } => {
                let (from, to) = self
                    .section(task, n)
                    .accounts
                    .expect("every transfer names two accounts");
                ByHand::AllOf(vec![
                    Self::account(name, from.min(to)),
                    Self::account(name, from.max(to)),
                ])
            }
        }
    }

    /// The lock name of the hand-written semaphore's slot `index` on the run's name `name`.
    fn slot(name: &str, index: u32) -> String {
        format!("{name}:slot:{index}")
    }
}
