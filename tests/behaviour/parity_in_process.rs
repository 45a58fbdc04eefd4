//! The shared behaviour tests (`parity`) on the in-process backend: no server.

use distlock::{LockError, LockManager};

use crate::parity::{self, parity_tests};
use crate::parity_family::{self, family_parity_tests};

async fn connect() -> LockManager {
    LockManager::in_process()
}

/// The global manager, in-process. The binary's global managers are the shared server's, so a
/// test that needs this one runs in a process of its own (`test_support::in_own_process`):
/// `true` there, once installed; `false` in the binary's own run, once that process passed. A
/// future only because the Redis module's must connect.
fn install_global(module: &str, test: &str) -> std::future::Ready<bool> {
    if !test_support::in_own_process(module, test) {
        return std::future::ready(false);
    }
    match distlock::init_with(LockManager::in_process()) {
        Ok(()) | Err(LockError::AlreadyInitialized) => {}
        Err(error) => panic!("init_with(in_process()) failed: {error}"),
    }
    std::future::ready(true)
}

parity_tests!(connect, install_global);
family_parity_tests!(connect);

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
    if !install_global(
        module_path!(),
        "the_blocking_global_falls_back_to_the_async_global",
    )
    .await
    {
        return;
    }
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

/// A waiter of another in-process manager sits in the shared line, renewing its place every
/// second. A release within `hold_at_least` must tell it the new, shorter expiry — as the
/// Redis backend's release does — or it sleeps on the 30 s ttl it saw until that renewal and
/// gets the lock well after the hold ended.
#[tokio::test]
async fn a_release_within_the_hold_wakes_a_waiter_of_another_manager_in_time() {
    use std::time::Duration;
    use tokio::time::Instant;

    let (holder, waiter) = (LockManager::in_process(), LockManager::in_process());
    let hold = Duration::from_millis(400);
    let options = distlock::LockOptions::new()
        .ttl(Duration::from_secs(30))
        .hold_at_least(hold);
    // The hold runs from when the table answered, between these two instants.
    let asked = Instant::now();
    let guard = holder
        .acquire("in-process:hold-wakes", &options)
        .await
        .unwrap();
    let acquired = Instant::now();
    let waiting = tokio::spawn(async move {
        let options = distlock::LockOptions::new().timeout(Duration::from_secs(20));
        let guard = waiter
            .acquire("in-process:hold-wakes", &options)
            .await
            .unwrap();
        (guard, Instant::now())
    });
    test_support::waiting_in_line(&holder, "in-process:hold-wakes", 1).await;
    guard.release().await.unwrap();
    let (next, got_at) = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiter gets the lock")
        .unwrap();
    assert!(got_at - asked >= hold, "handed over before the hold ended");
    let late = (got_at - acquired).saturating_sub(hold);
    assert!(
        late < Duration::from_millis(300),
        "handed over {late:?} after the hold ended: the waiter was not told the new expiry"
    );
    next.release().await.unwrap();
}
