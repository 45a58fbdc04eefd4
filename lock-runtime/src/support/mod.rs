//! What every part uses and no part owns: pauses between tries (`retry`), the process-wide
//! runtime for clean-up (`background`), the futures of rare paths kept out of the stack frames of
//! the usual ones (`cold`), the value a lock key holds (`identity`), and durations in whole
//! milliseconds or microseconds (`units`).

pub(crate) mod background;
pub(crate) mod cold;
pub(crate) mod identity;
pub(crate) mod retry;
pub(crate) mod units;
