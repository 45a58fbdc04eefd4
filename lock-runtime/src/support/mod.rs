//! What every part uses and no part owns: pauses between tries (`retry`), the process-wide
//! runtime for clean-up (`background`), the value a lock key holds (`identity`), metrics
//! (`meters`), and the lock orders seen in this process (`order`).

pub(crate) mod background;
pub(crate) mod identity;
pub(crate) mod meters;
pub(crate) mod order;
pub(crate) mod retry;
