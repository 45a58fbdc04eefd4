//! `distlock::blocking` against a real Redis: plain threads and processes, no tokio in the
//! caller. Tests share one server and use keys of their own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::blocking::{self, LockManager};
use distlock::{distributed_lock, LockError, LockOptions};
use test_support::{shared_server, spawn_self, wait_all};

/// The global blocking manager on the shared server: once per process.
fn install_global() {
    match blocking::init(&shared_server().url()) {
        Ok(()) | Err(LockError::AlreadyInitialized) => {}
        Err(error) => panic!("blocking::init failed: {error}"),
    }
}

/// Read, pause, write back `key` in Redis: only the lock keeps the count exact.
fn bump(redis: &mut redis::Connection, key: &str) {
    let seen: u64 = redis::cmd("GET")
        .arg(key)
        .query::<Option<u64>>(redis)
        .unwrap()
        .unwrap_or(0);
    std::thread::sleep(Duration::from_millis(2));
    redis::cmd("SET")
        .arg(key)
        .arg(seen + 1)
        .query::<()>(redis)
        .unwrap();
}

#[distributed_lock(key = "blocking:procs", timeout = 60)]
fn bump_through_the_attribute(redis: &mut redis::Connection) -> Result<(), LockError> {
    bump(redis, "blocking:procs:count");
    Ok(())
}

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
    blocking::init_with(manager.clone()).unwrap();
    // The manual API and the attribute, taking turns on the same lock.
    for round in 0..15 {
        if round % 2 == 0 {
            let guard = manager.acquire("blocking:procs", &options).unwrap();
            bump(&mut redis, "blocking:procs:count");
            drop(guard);
        } else {
            bump_through_the_attribute(&mut redis).unwrap();
        }
    }
}

#[test]
fn processes_exclude_each_other_with_an_exact_count() {
    let server = shared_server();
    let workers = (0..3)
        .map(|_| {
            spawn_self(
                "blocking::blocking_worker",
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
    install_global();
    let url = shared_server().url();
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

#[distributed_lock(key = "blocking:attr:{name}", ttl = 10, timeout = 60)]
fn bump_in_memory(name: &str, counter: &AtomicU64) -> Result<(), LockError> {
    let seen = counter.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(1));
    counter.store(seen + 1, Ordering::SeqCst);
    Ok(())
}

#[test]
fn the_attribute_on_a_plain_fn_excludes_threads() {
    install_global();
    let counter = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let counter = Arc::clone(&counter);
            std::thread::spawn(move || {
                for _ in 0..10 {
                    bump_in_memory("count", &counter).unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), 60, "two bodies overlapped");
    assert_eq!(
        shared_server().get("lock:blocking:attr:count"),
        None,
        "released"
    );
}

#[distributed_lock(key = "blocking:attr:panic", ttl = 30)]
fn panics_holding_the_lock() -> Result<(), LockError> {
    assert!(
        shared_server().exists("lock:blocking:attr:panic"),
        "held in the body"
    );
    panic!("the body fails");
}

#[distributed_lock(key = "blocking:attr:busy", timeout = "300ms")]
fn gives_up_quickly() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "blocking:attr:slow", ttl = "200ms")]
fn outlives_its_ttl(taken_meanwhile: &dyn Fn()) -> Result<&'static str, LockError> {
    std::thread::sleep(Duration::from_millis(400));
    taken_meanwhile();
    Ok("the body's result")
}

#[test]
fn the_attribute_on_a_plain_fn_releases_on_panic_times_out_and_survives_a_loss() {
    install_global();
    let server = shared_server();
    assert!(std::panic::catch_unwind(panics_holding_the_lock).is_err());
    assert_eq!(
        server.get("lock:blocking:attr:panic"),
        None,
        "released while unwinding"
    );

    let holder = connect()
        .acquire("blocking:attr:busy", &ttl(30_000))
        .unwrap();
    let started = Instant::now();
    assert!(matches!(gives_up_quickly(), Err(LockError::Timeout { .. })));
    assert!(started.elapsed() < Duration::from_secs(5));
    holder.release().unwrap();
    gives_up_quickly().unwrap();

    // The lock expires mid-body and someone else takes it: the body's result still comes back,
    // and the late release leaves the new holder's lock alone.
    let other = connect();
    let taker = std::cell::RefCell::new(None);
    let take = || {
        let guard = other.acquire("blocking:attr:slow", &ttl(30_000)).unwrap();
        *taker.borrow_mut() = Some(guard);
    };
    assert_eq!(outlives_its_ttl(&take).unwrap(), "the body's result");
    let guard = taker.borrow_mut().take().expect("taken after the expiry");
    assert_eq!(
        server.get("lock:blocking:attr:slow").as_deref(),
        Some(guard.token()),
        "the late release deleted someone else's lock"
    );
    guard.release().unwrap();
}

#[tokio::test]
async fn the_attribute_on_a_plain_fn_inside_a_runtime_is_an_error() {
    std::thread::spawn(install_global).join().unwrap();
    let error = gives_up_quickly().expect_err("refused inside a runtime");
    assert!(matches!(error, LockError::Config(_)), "{error:?}");
}

/// A guard kept in a `thread_local!` is dropped while its thread exits, after tokio's own
/// thread-locals may be gone (here they are: ours was set up first, so it is destroyed last).
/// Blocking on a runtime is impossible then: the drop must release in the background, not
/// abort the whole process.
#[test]
fn a_guard_in_a_thread_local_is_released_when_its_thread_exits() {
    use std::cell::RefCell;
    thread_local! {
        static HELD: RefCell<Option<blocking::LockGuard>> = const { RefCell::new(None) };
    }
    let manager = connect();
    let in_thread = manager.clone();
    std::thread::spawn(move || {
        HELD.with(|held| *held.borrow_mut() = None);
        let guard = in_thread
            .acquire("blocking:thread-local", &ttl(30_000))
            .unwrap();
        HELD.with(|held| *held.borrow_mut() = Some(guard));
    })
    .join()
    .unwrap();
    let started = Instant::now();
    let again = manager
        .acquire(
            "blocking:thread-local",
            &ttl(30_000).timeout(Duration::from_secs(10)),
        )
        .expect("released when its thread exited, well before its 30 s ttl");
    assert!(started.elapsed() < Duration::from_secs(10));
    again.release().unwrap();
}

/// Notes, when dropped, whether the lock `key` is still held in Redis.
struct NotesOnDrop<'a> {
    key: &'static str,
    held_when_dropped: &'a AtomicU64,
    value: u64,
}

impl NotesOnDrop<'_> {
    fn value(&self) -> u64 {
        self.value
    }
}

impl Drop for NotesOnDrop<'_> {
    fn drop(&mut self) {
        let held = shared_server().exists(self.key);
        self.held_when_dropped
            .store(u64::from(held) + 1, Ordering::SeqCst);
    }
}

#[distributed_lock(key = "blocking:attr:tail", ttl = 30)]
fn tail_temporary(held_when_dropped: &AtomicU64) -> Result<u64, LockError> {
    // A temporary of the body's last expression (a transaction that commits on drop, a
    // `MutexGuard`, a buffered writer) finishes its work when dropped: still under the lock.
    Ok(NotesOnDrop {
        key: "lock:blocking:attr:tail",
        held_when_dropped,
        value: 7,
    }
    .value())
}

/// As with the `async fn` form, everything the body does, down to the drop of the temporaries
/// of its last expression, happens before the release.
#[test]
fn the_attribute_on_a_plain_fn_releases_after_the_bodys_temporaries() {
    install_global();
    let held_when_dropped = AtomicU64::new(0);
    assert_eq!(tail_temporary(&held_when_dropped).unwrap(), 7);
    assert_eq!(
        held_when_dropped.load(Ordering::SeqCst),
        2,
        "the body's last temporary was dropped after the lock was released (1) or never (0)"
    );
    assert!(!shared_server().exists("lock:blocking:attr:tail"));
}
