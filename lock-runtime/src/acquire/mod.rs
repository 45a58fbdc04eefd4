//! Getting a lock, the parts that do no I/O of their own: the state machine that decides every
//! step of an acquisition (`machine`), the in-process first-come-first-served line in front of
//! the store (`queue`), when and by whom a wait-for cycle is reported (`deadlock`), and the finishing of a call whose caller stopped waiting (`finish`),
//! which makes every attempt safe to cancel. The driver that performs the machine's I/O is the
//! manager's (`manager::driver`): it works on the manager's inside and hands back its guard.

pub(crate) mod deadlock;
pub(crate) mod finish;
pub(crate) mod machine;
pub(crate) mod queue;
