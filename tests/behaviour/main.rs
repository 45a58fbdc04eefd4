//! What distlock does, against a real Redis: the manual API, the attribute, auto-extension,
//! mutual exclusion, hand-offs, fencing, `on_busy` and `hold_at_least`, re-entry and lock order
//! (in one process and across processes),
//! TLS and ACL users,
//! inspection (who holds a lock), the synchronous API (`distlock::blocking`), and the behaviour
//! tests written once for every backend (`parity`, run on Redis and on the in-process backend);
//! and that the README's quick start and links hold.
//!
//! One binary, so the harness and the facade compile and link once for all of them. The
//! attribute, parity and blocking tests share one redis-server and the one global client of each
//! kind (`test_support::global_server`, `blocking::init`), each with keys of its own; a test that
//! needs another global manager (the in-process one) runs in a process of its own
//! (`test_support::in_own_process`); every other test starts its own servers and managers.
//!
//! Binaries of their own: the 100 000-cycle leak check (`no_leaks`), which loads both cores for
//! a minute while bounding what the managers hold, and beside the timing bounds of these tests
//! each would break the other's; the examples (`examples`), which build the example programs
//! with cargo and run them, several processes at once, a load that would break those bounds too; the round-trip count
//! (`round_trips`), which counts every command the global client's server receives, so no other
//! test may use that server meanwhile; and the binaries that install what a process has one of
//! (`global_client`, `not_initialized`, `metrics`, `span`).

mod attribute;
mod auto_extend;
mod blocking;
mod fencing;
mod hold_at_least;
mod inspect;
mod lock_order;
mod manual_api;
mod mutual_exclusion;
mod on_busy;
mod parity;
mod parity_family;
mod parity_in_process;
mod parity_redis;
mod read_write;
mod readme;
mod reentry;
mod reentry_all;
mod semaphores;
mod several_keys;
mod tls_acl;
mod traced;
mod wake_on_release;

/// The entry of the worker processes that this binary's tests start with
/// `test_support::spawn_worker`: a worker is a part of a test, not a test of its own.
#[test]
#[ignore = "the entry of worker processes, which tests start with test_support::spawn_worker"]
fn worker() {
    test_support::run_worker(&[
        ("fencing::fencing_worker", fencing::fencing_worker),
        (
            "mutual_exclusion::mutex_worker",
            mutual_exclusion::mutex_worker,
        ),
        ("blocking::blocking_worker", blocking::blocking_worker),
        (
            "several_keys::transfer_worker",
            several_keys::transfer_worker,
        ),
        ("lock_order::fleet_worker", lock_order::fleet_worker),
        (
            "lock_order::in_process_worker",
            lock_order::in_process_worker,
        ),
        ("lock_order::blocking_worker", lock_order::blocking_worker),
        ("lock_order::cap_worker", lock_order::cap_worker),
        ("semaphores::semaphore_worker", semaphores::semaphore_worker),
        (
            "semaphores::permit_holder_worker",
            semaphores::permit_holder_worker,
        ),
        (
            "semaphores::permit_waiter_worker",
            semaphores::permit_waiter_worker,
        ),
        ("blocking::fork_worker", blocking::fork_worker),
        (
            "blocking::fork_inherited_guard_worker",
            blocking::fork_inherited_guard_worker,
        ),
        (
            "blocking::fork_by_underscore_fork_worker",
            blocking::fork_by_underscore_fork_worker,
        ),
    ]);
}
