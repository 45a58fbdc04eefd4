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
mod refused_resend;
mod server;
mod stale_holder;
mod torture;

/// The entry of the worker processes that this binary's tests start with
/// `test_support::spawn_worker`: a worker is a part of a test, not a test of its own.
#[test]
#[ignore = "the entry of worker processes, which tests start with test_support::spawn_worker"]
fn worker() {
    test_support::run_worker(&[
        ("stale_holder::stale_worker", stale_holder::stale_worker),
        ("holder_killed::holder_worker", holder_killed::holder_worker),
        (
            "holder_killed::contender_worker",
            holder_killed::contender_worker,
        ),
        (
            "line_faults::stopped_waiter_worker",
            line_faults::stopped_waiter_worker,
        ),
        ("torture::torture_worker", torture::torture_worker),
    ]);
}
