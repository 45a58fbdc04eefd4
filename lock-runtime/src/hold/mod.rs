//! Holding a lock and giving it back: what a guard and its watchdog share (`held`), the
//! auto-extension (`watchdog`), and the lazy confirmation of a lock handed over on a short
//! claim (`confirm`), and which locks a task holds, for re-entry (`reentry`).

pub(crate) mod confirm;
pub(crate) mod held;
pub(crate) mod reentry;
pub(crate) mod watchdog;
