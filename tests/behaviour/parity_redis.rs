//! The shared behaviour tests (`parity`) on a real redis-server: the binary's shared one (each
//! test uses its own keys).

use distlock::LockManager;

use crate::parity::{self, parity_tests};
use crate::parity_family::{self, family_parity_tests};

async fn connect() -> LockManager {
    test_support::connect(test_support::shared_server()).await
}

/// The global manager, on the shared server as for the attribute tests: once per process, and
/// every test runs here.
async fn install_global(_module: &str, _test: &str) -> bool {
    test_support::global_server().await;
    true
}

parity_tests!(connect, install_global);
family_parity_tests!(connect);
