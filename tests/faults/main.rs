//! distlock under faults: bad input, cancellation storms, a holder killed, a broken network, a
//! failing server, a stale holder, and a many-process torture run.
//!
//! The tests that install the global manager or the global `tracing` subscriber run in a process
//! of their own (`test_support::in_own_process`): a process has one of each.

mod bad_input;
mod cancellation;
mod dropped_connections;
mod eviction;
mod holder_killed;
mod line_faults;
mod lost_cause;
mod network;
mod server;
mod stale_holder;
mod torture;
