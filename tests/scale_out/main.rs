//! distlock beyond one server and one process: Redis Cluster, Redlock over independent masters,
//! Redis Sentinel through failovers (also over TLS), a fleet of worker processes waiting in one line,
//! and the fleet's record of lock orders on a cluster and on Redlock.
//!
//! The tests that install the global manager run in a process of their own
//! (`test_support::in_own_process`): a process has one.

mod cluster;
mod deadlock;
mod family;
mod fleet;
mod hold_at_least;
mod lock_order;
mod on_busy;
mod redlock;
mod renewals;
mod replicas;
mod sentinel;
mod sentinel_tls;
mod several_keys;
mod turns;

/// The entry of the worker processes that this binary's tests start with
/// `test_support::spawn_worker`: a worker is a part of a test, not a test of its own.
#[test]
#[ignore = "the entry of worker processes, which tests start with test_support::spawn_worker"]
fn worker() {
    test_support::run_worker(&[
        (
            "redlock::redlock_looping_worker",
            redlock::redlock_looping_worker,
        ),
        ("redlock::redlock_once_worker", redlock::redlock_once_worker),
        ("fleet::fleet_worker", fleet::fleet_worker),
        ("deadlock::deadlock_worker", deadlock::deadlock_worker),
        ("fleet::looping_worker", fleet::looping_worker),
    ]);
}
