//! `distlock::blocking` against a real Redis: plain threads and processes, no tokio in the
//! caller. Tests share one server and use keys of their own.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::blocking::{self, LockManager};
use distlock::{LockError, LockOptions};
use support::{shared_server, spawn_self, wait_all};

fn connect() -> LockManager {
    let url = shared_server().url();
    LockManager::connect(&url).unwrap_or_else(|error| panic!("cannot connect to {url}: {error}"))
}

fn ttl(millis: u64) -> LockOptions {
    LockOptions::new().ttl(Duration::from_millis(millis))
}

#[test]
fn threads_exclude_each_other_with_an_exact_count() {
    let manager = connect();
    let counter = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (manager, counter) = (manager.clone(), Arc::clone(&counter));
            std::thread::spawn(move || {
                let options = LockOptions::new().timeout(Duration::from_secs(60));
                for _ in 0..10 {
                    let guard = manager.acquire("blocking:threads", &options).unwrap();
                    // Read, pause, write back: only the lock keeps this exact.
                    let seen = counter.load(Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(1));
                    counter.store(seen + 1, Ordering::SeqCst);
                    guard.release().unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(
        counter.load(Ordering::SeqCst),
        80,
        "two threads held the lock at once"
    );
}

/// The worker of the cross-process test: does nothing unless started by `spawn_self`.
#[test]
fn blocking_worker() {
    let Ok(url) = std::env::var("DISTLOCK_BLOCKING_WORKER_URL") else {
        return;
    };
    let manager = LockManager::connect(&url).unwrap();
    let mut redis = redis::Client::open(url).unwrap().get_connection().unwrap();
    let options = LockOptions::new().timeout(Duration::from_secs(60));
    for _ in 0..15 {
        let guard = manager.acquire("blocking:procs", &options).unwrap();
        let seen: u64 = redis::cmd("GET")
            .arg("blocking:procs:count")
            .query::<Option<u64>>(&mut redis)
            .unwrap()
            .unwrap_or(0);
        std::thread::sleep(Duration::from_millis(2));
        redis::cmd("SET")
            .arg("blocking:procs:count")
            .arg(seen + 1)
            .query::<()>(&mut redis)
            .unwrap();
        drop(guard);
    }
}

#[test]
fn processes_exclude_each_other_with_an_exact_count() {
    let server = shared_server();
    let workers = (0..3)
        .map(|_| {
            spawn_self(
                "blocking_worker",
                &[("DISTLOCK_BLOCKING_WORKER_URL", server.url())],
            )
        })
        .collect();
    for status in wait_all(workers, Duration::from_secs(120)) {
        assert!(status.success(), "a worker failed: {status}");
    }
    assert_eq!(
        server.get("blocking:procs:count").as_deref(),
        Some("45"),
        "two processes held the lock at once"
    );
}

#[test]
fn drop_and_panic_release_before_returning() {
    let server = shared_server();
    let manager = connect();
    let long = ttl(30_000);
    let guard = manager.acquire("blocking:drop", &long).unwrap();
    assert_eq!(
        server.get("lock:blocking:drop").as_deref(),
        Some(guard.token())
    );
    drop(guard);
    assert_eq!(
        server.get("lock:blocking:drop"),
        None,
        "released by the drop, not later"
    );

    let panicking = manager.clone();
    let outcome = std::thread::spawn(move || {
        let _guard = panicking.acquire("blocking:drop", &long).unwrap();
        panic!("the body fails while holding the lock");
    })
    .join();
    assert!(outcome.is_err(), "the thread panicked");
    assert_eq!(
        server.get("lock:blocking:drop"),
        None,
        "released while the panic unwound"
    );
    let again = manager
        .try_acquire("blocking:drop", &LockOptions::new())
        .unwrap()
        .expect("free at once");
    again.release().unwrap();
}

#[test]
fn timeout_lost_extend_and_is_held() {
    let (first, second) = (connect(), connect());
    let holder = first.acquire("blocking:timeout", &ttl(30_000)).unwrap();
    let started = Instant::now();
    let result = second.acquire(
        "blocking:timeout",
        &LockOptions::new().timeout(Duration::from_millis(300)),
    );
    assert!(
        matches!(result, Err(LockError::Timeout { ref key, .. }) if key == "lock:blocking:timeout"),
        "{result:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(second
        .try_acquire("blocking:timeout", &LockOptions::new())
        .unwrap()
        .is_none());
    holder.release().unwrap();

    let short = first
        .acquire("blocking:lost", &ttl(200).fencing(true))
        .unwrap();
    assert!(short.fencing_token().is_some());
    assert!(short.is_held().unwrap());
    std::thread::sleep(Duration::from_millis(500));
    assert!(!short.is_held().unwrap(), "expired");
    assert!(matches!(
        short.extend(Duration::from_secs(5)),
        Err(LockError::Lost { .. })
    ));
    assert!(matches!(short.release(), Err(LockError::Lost { .. })));
}

#[test]
fn auto_extend_runs_between_calls() {
    let manager = connect();
    let guard = manager
        .acquire("blocking:watchdog", &ttl(300).auto_extend(true))
        .unwrap();
    // The caller's thread does no async work: the watchdog runs on distlock's own thread.
    std::thread::sleep(Duration::from_millis(1200));
    assert!(guard.is_held().unwrap(), "kept alive past four ttls");
    assert!(!guard.is_lost());
    guard.release().unwrap();
}

#[tokio::test]
async fn inside_an_async_runtime_it_is_an_error_not_a_deadlock() {
    let url = shared_server().url();
    let started = Instant::now();
    let error = LockManager::connect(&url).expect_err("refused inside a runtime");
    assert!(matches!(error, LockError::Config(_)), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("async runtime") && message.contains("distlock::LockManager"),
        "{message}"
    );

    // A manager made outside, used inside: the same.
    let manager = std::thread::spawn(move || LockManager::connect(&url).unwrap())
        .join()
        .unwrap();
    let error = manager
        .acquire("blocking:inside", &LockOptions::new())
        .expect_err("refused inside a runtime");
    assert!(matches!(error, LockError::Config(_)), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn the_global_blocking_manager_is_installed_once() {
    let url = shared_server().url();
    blocking::init(&url).unwrap();
    assert!(matches!(
        blocking::init(&url),
        Err(LockError::AlreadyInitialized)
    ));
    let guard = blocking::global()
        .unwrap()
        .acquire("blocking:global", &LockOptions::new())
        .unwrap();
    assert_eq!(guard.key(), "lock:blocking:global");
    guard.release().unwrap();
}
