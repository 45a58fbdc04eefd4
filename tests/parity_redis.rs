//! The shared behaviour tests (`tests/parity`) on a real redis-server, which this binary's tests
//! share (each uses its own keys).

mod parity;

use distlock::LockManager;
use parity::parity_tests;

async fn connect() -> LockManager {
    let server = test_support::shared_server();
    LockManager::connect(&server.url())
        .await
        .unwrap_or_else(|error| panic!("cannot connect to {}: {error}", server.url()))
}

/// The global manager, on the shared server: once per test binary.
async fn install_global() {
    test_support::global_server().await;
}

parity_tests!(connect, install_global);
