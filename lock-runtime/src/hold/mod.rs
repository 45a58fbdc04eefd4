//! Holding a lock and giving it back: what a guard and its watchdog share (`held`), the
//! auto-extension (`watchdog`), and the lazy confirmation of a lock handed over on a short
//! claim (`confirm`), and the orders in which this process's tasks took locks of two key
//! templates, with a warning when both orders were seen (`order`).

pub(crate) mod confirm;
pub(crate) mod held;
pub(crate) mod order;
pub(crate) mod watchdog;
