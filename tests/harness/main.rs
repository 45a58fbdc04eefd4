//! Self-tests of the integration-test harness (`test-support`): servers, proxies, worker
//! processes, clusters, Redlock sets, TLS and ACL users.

mod harness;
mod harness_cluster;
mod helper_keys;
