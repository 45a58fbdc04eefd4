//! Self-tests of the integration-test harness (`test-support`): servers, proxies, worker
//! processes, clusters, Redlock sets, TLS and ACL users.

mod harness;
mod harness_cluster;
mod helper_keys;

/// The entry of the worker processes that this binary's tests start with
/// `test_support::spawn_worker`: a worker is a part of a test, not a test of its own.
#[test]
#[ignore = "the entry of worker processes, which tests start with test_support::spawn_worker"]
fn worker() {
    test_support::run_worker(&[("harness::harness_worker", harness::harness_worker)]);
}
