//! distlock beyond one server and one process: Redis Cluster, Redlock over independent masters,
//! Redis Sentinel through failovers (also over TLS), and a fleet of worker processes waiting in one line.
//!
//! The tests that install the global manager run in a process of their own
//! (`test_support::in_own_process`): a process has one.

mod cluster;
mod fleet;
mod hold_at_least;
mod on_busy;
mod redlock;
mod renewals;
mod replicas;
mod sentinel;
mod sentinel_tls;
mod turns;
