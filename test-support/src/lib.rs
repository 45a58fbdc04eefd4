//! Integration-test harness: real `redis-server` processes, a fault-injecting TCP proxy, and
//! helpers for tests that run several OS processes.
//!
//! Every integration test binary of the workspace depends on this crate and uses what it needs:
//!
//! ```ignore
//! use test_support::{FaultProxy, RedisServer};
//!
//! let server = RedisServer::start();
//! let proxy = FaultProxy::start(server.port());
//! proxy.set_delay(std::time::Duration::from_millis(20));
//! // ... point the code under test at proxy.url(), assert on server.get(..) ...
//! ```
//!
//! Rules the harness keeps so that tests stay trustworthy on a slow shared machine:
//! - nothing waits without a bound; a wait that runs out panics and says what did not happen;
//! - every process and thread the harness starts is stopped when its owner is dropped;
//! - servers never persist anything, so a restart always comes back empty.

// Nothing in this crate needs `unsafe`, so no change may bring it in unnoticed.
#![forbid(unsafe_code)]
// A harness function panics, saying what did not happen, whenever a server or process does not
// do what the test needs: that is how a test fails, so it is not repeated in a `# Panics` section
// on each. Its results are values tests assert on; marking each `#[must_use]` adds nothing.
#![allow(clippy::missing_panics_doc, clippy::must_use_candidate)]

pub mod binary;
pub mod cluster;
pub mod keys;
pub mod names;
pub mod process;
pub mod proxy;
pub mod replication;
pub mod sentinel;
pub mod server;
pub mod tls;

// Short paths for what tests use most (`test_support::RedisServer`).
pub use binary::{skip_without, Feature};
pub use cluster::{ProxiedCluster, RedisCluster, RedisServers};
pub use process::{free_port, in_own_process, run_worker, send_signal, spawn_worker, wait_all};
pub use proxy::FaultProxy;
pub use replication::{hold_back_replication, Replicated};
pub use sentinel::SentinelSet;
pub use server::RedisServer;
pub use tls::TlsFiles;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A multi-thread tokio runtime with `workers` worker threads and every driver on, for tests
/// that drive async code from plain `#[test]` functions (or play a process of their own).
///
/// ```
/// let runtime = test_support::runtime(2);
/// assert_eq!(runtime.block_on(async { 1 + 1 }), 2);
/// ```
pub fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Polls `condition` every 10 ms until it returns `true`, panicking after `timeout` with
/// "timed out after {timeout:?} waiting for {what}".
///
/// Use it instead of a fixed `sleep` whenever a test waits for something that happens
/// asynchronously (a key expiring, a worker connecting): it returns as soon as the condition
/// holds, and the bound can be generous without slowing the common case.
pub fn wait_until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The async form of [`wait_until`]: polls `condition` every 10 ms without blocking the runtime
/// until it returns `true`, panicking after `timeout` with
/// "timed out after {timeout:?} waiting for {what}".
pub async fn eventually(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `count` waiters hold a place in `name`'s line, as `manager.inspect` shows it
/// (polling every 10 ms), and returns what it showed then; panics after 20 s, or when the lock
/// is not held. A waiter started in a task has joined the line once this returns, however
/// slowly a loaded machine let it get there.
pub async fn waiting_in_line(
    manager: &distlock::LockManager,
    name: &str,
    count: u64,
) -> distlock::LockInfo {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = manager
            .inspect(name)
            .await
            .unwrap_or_else(|error| panic!("cannot inspect {name}: {error}"))
            .unwrap_or_else(|| panic!("{name} is not held"));
        if info.waiters == count {
            return info;
        }
        assert!(
            Instant::now() < deadline,
            "{} waiters in {name}'s line after 20 s, not {count}",
            info.waiters
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A lock manager of its own on `server` (`LockManager::connect`), as another client of it;
/// panics, naming the server, if it cannot connect.
pub async fn connect(server: &RedisServer) -> distlock::LockManager {
    distlock::LockManager::connect(&server.url())
        .await
        .unwrap_or_else(|error| panic!("cannot connect to {}: {error}", server.url()))
}

/// The one redis-server this test binary shares between its tests, started on first use
/// (killed when the process ends). Tests that share it use their own keys.
pub fn shared_server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

/// [`shared_server`], with the global client (`distlock::init`) installed on it: once per
/// process, later calls find it installed (`AlreadyInitialized` is fine); any other error panics.
pub async fn global_server() -> &'static RedisServer {
    let server = shared_server();
    match distlock::init(&server.url()).await {
        Ok(()) | Err(distlock::LockError::AlreadyInitialized) => server,
        Err(error) => panic!("distlock::init({}) failed: {error}", server.url()),
    }
}

/// Creates a new, empty directory under the system temp dir, unique to this process and call
/// (`distlock-<label>-<pid>-<n>-<nanos>`); the caller removes it.
///
/// `create_dir` (not `create_dir_all`) fails if the name already exists, so two tests can never
/// share a directory even when they run in parallel in several processes.
pub fn unique_temp_dir(label: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    for _ in 0..100 {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "distlock-{label}-{}-{n}-{nanos}",
            std::process::id()
        ));
        match std::fs::create_dir(&dir) {
            Ok(()) => return dir,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => panic!("cannot create temp dir {}: {e}", dir.display()),
        }
    }
    panic!("could not create a unique temp dir for {label} after 100 attempts");
}
