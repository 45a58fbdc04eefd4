//! Getting a lock: the state machine that decides every step of an acquisition without I/O
//! (`machine`), the driver that performs the I/O it asks for (`driver`), one attempt safe to
//! cancel and the clean-up after it (`attempt`, with `finish`, which completes an attempt whose
//! caller stopped waiting), a waiter's place in line, left if it gives up (`place`), and the
//! in-process first-come-first-served line in front of Redis (`queue`).

pub(crate) mod attempt;
pub(crate) mod driver;
pub(crate) mod finish;
pub(crate) mod machine;
pub(crate) mod place;
pub(crate) mod queue;
