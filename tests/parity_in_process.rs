//! The shared behaviour tests (`tests/parity`) on the in-process backend: no server.

mod parity;

use distlock::{LockError, LockManager};
use parity::parity_tests;

async fn connect() -> LockManager {
    LockManager::in_process()
}

/// The global manager, in-process: once per test binary. A future only because the Redis
/// binary's must connect.
fn install_global() -> std::future::Ready<()> {
    match distlock::init_with(LockManager::in_process()) {
        Ok(()) | Err(LockError::AlreadyInitialized) => {}
        Err(error) => panic!("init_with(in_process()) failed: {error}"),
    }
    std::future::ready(())
}

parity_tests!(connect, install_global);

/// Separate in-process managers share the process's table, as clients of one Redis do.
#[tokio::test]
async fn in_process_managers_share_one_table() {
    let (first, second) = (LockManager::in_process(), LockManager::in_process());
    let options = distlock::LockOptions::new();
    let guard = first.acquire("in-process:shared", &options).await.unwrap();
    assert!(second
        .try_acquire("in-process:shared", &options)
        .await
        .unwrap()
        .is_none());
    guard.release().await.unwrap();
    assert!(format!("{first:?}").contains("in-process"));
}

/// With no blocking manager installed, `blocking::global()` drives the async global one: a
/// program with both kinds of function initializes once.
#[tokio::test]
async fn the_blocking_global_falls_back_to_the_async_global() {
    install_global().await;
    let options = distlock::LockOptions::new();
    let guard = distlock::global()
        .unwrap()
        .acquire("in-process:fallback", &options)
        .await
        .unwrap();
    let seen_by_blocking = std::thread::spawn(move || {
        distlock::blocking::global()
            .unwrap()
            .try_acquire("in-process:fallback", &options)
            .unwrap()
            .is_some()
    })
    .join()
    .unwrap();
    assert!(
        !seen_by_blocking,
        "the blocking global saw the lock as free"
    );
    guard.release().await.unwrap();
}
