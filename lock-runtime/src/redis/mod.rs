//! The only place that names redis-rs connection types: connections to one endpoint per tokio
//! runtime (`connection`), which server is a Sentinel service's master (`sentinel`), what a
//! Redis error means (`classify`), and the eviction check after a connect (`eviction`).

pub(crate) mod classify;
pub(crate) mod connection;
pub(crate) mod eviction;
pub(crate) mod sentinel;
