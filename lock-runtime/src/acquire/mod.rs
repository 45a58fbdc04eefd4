//! Getting a lock: the state machine that decides every step of an acquisition without I/O
//! (`machine`), the in-process first-come-first-served line in front of Redis (`queue`), and
//! the finishing of an attempt whose caller stopped waiting (`finish`), which makes every
//! attempt safe to cancel.

pub(crate) mod finish;
pub(crate) mod machine;
pub(crate) mod queue;
