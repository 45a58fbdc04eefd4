//! What every part uses and no part owns: pauses between tries (`retry`), the process-wide
//! runtime for clean-up (`background`), and the value a lock key holds (`identity`).

pub(crate) mod background;
pub(crate) mod identity;
pub(crate) mod retry;
