//! `distlock::blocking` against a real Redis: plain threads and processes, no tokio in the
//! caller. Tests share one server and use keys of their own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::blocking::{self, LockManager};
use distlock::{distributed_lock, LockError, LockOptions};
use test_support::{shared_server, spawn_worker, wait_all};

/// The global blocking manager on the shared server: once per process.
pub(crate) fn install_global() {
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

/// The worker of the cross-process test, started by `spawn_worker`.
pub(crate) fn blocking_worker() {
    let url = std::env::var("DISTLOCK_BLOCKING_WORKER_URL")
        .expect("set by the test that starts this worker");
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
            spawn_worker(
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

/// Asserts that `error` refuses `call` made on the line `line` of this file, and says what to
/// use instead.
fn assert_refused_inside_runtime(error: &LockError, call: &str, line: u32) {
    match error {
        LockError::InsideAsyncRuntime {
            call: refused,
            location,
        } => {
            assert_eq!(*refused, call, "{error}");
            assert!(location.file().ends_with("blocking.rs"), "{location}");
            assert_eq!(location.line(), line, "the caller's line: {error}");
        }
        other => panic!("expected InsideAsyncRuntime, got {other:?}"),
    }
    let message = error.to_string();
    assert!(
        message.contains(&format!("distlock::blocking::{call} was called at "))
            && message.contains("distlock::LockManager")
            && message.contains("spawn_blocking")
            && !message.contains("configuration"),
        "{message}"
    );
    let io = std::io::Error::from(LockError::InsideAsyncRuntime {
        call: "LockManager::acquire",
        location: std::panic::Location::caller(),
    });
    assert_eq!(io.kind(), std::io::ErrorKind::Unsupported);
}

#[tokio::test]
async fn inside_an_async_runtime_it_is_an_error_not_a_deadlock() {
    let url = shared_server().url();
    let started = Instant::now();
    let line = line!() + 1;
    let error = LockManager::connect(&url).expect_err("refused");
    assert_refused_inside_runtime(&error, "LockManagerBuilder::connect", line);

    // A manager made outside, used inside: the same.
    let manager = std::thread::spawn(move || LockManager::connect(&url).unwrap())
        .join()
        .unwrap();
    let options = LockOptions::new();
    let line = line!() + 2;
    let error = manager
        .acquire("blocking:inside", &options)
        .expect_err("refused");
    assert_refused_inside_runtime(&error, "LockManager::acquire", line);
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// `spawn_blocking` runs on a thread where the runtime is still current, and tokio offers no
/// way to tell it from a worker thread: refused with the same error, which names the caller's
/// line and says how to run the lock there instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inside_spawn_blocking_it_is_an_error_that_says_what_to_do() {
    let url = shared_server().url();
    let manager = std::thread::spawn(move || LockManager::connect(&url).unwrap())
        .join()
        .unwrap();
    let in_task = manager.clone();
    let (result, line) = tokio::task::spawn_blocking(move || {
        let (options, line) = (LockOptions::new(), line!() + 1);
        let result = in_task.try_acquire("blocking:spawn-blocking", &options);
        (result, line)
    })
    .await
    .unwrap();
    assert_refused_inside_runtime(
        &result.expect_err("refused in spawn_blocking"),
        "LockManager::try_acquire",
        line,
    );
    // What the message says works there: the async API through the current runtime.
    let guard = tokio::task::spawn_blocking(move || {
        tokio::runtime::Handle::current().block_on(
            manager
                .as_async()
                .acquire("blocking:spawn-blocking", &LockOptions::new()),
        )
    })
    .await
    .unwrap()
    .unwrap();
    assert!(shared_server().exists("lock:blocking:spawn-blocking"));
    guard.release().await.unwrap();
}

/// A failed `blocking::init` that the program only logged: later calls say why there is no
/// global manager, not just that there is none; an `init` that then succeeds is used.
#[test]
fn after_a_failed_init_calls_say_its_cause() {
    if !test_support::in_own_process(module_path!(), "after_a_failed_init_calls_say_its_cause") {
        return;
    }
    // Nothing listens on port 1: refused at once.
    let failed = blocking::init("redis://127.0.0.1:1").expect_err("nothing listens there");
    for error in [
        blocking::global().expect_err("no global manager"),
        gives_up_quickly().expect_err("no global manager"),
    ] {
        match &error {
            LockError::InitFailed { call, cause } => {
                assert_eq!(*call, "distlock::blocking::init");
                assert_eq!(*cause, failed.to_string());
            }
            other => panic!("expected InitFailed, got {other:?}"),
        }
        let message = error.to_string();
        assert!(
            message.starts_with("distlock::blocking::init failed earlier")
                && message.contains(&failed.to_string()),
            "{message}"
        );
    }
    blocking::init(&shared_server().url()).unwrap();
    gives_up_quickly().unwrap();
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
    let LockError::InsideAsyncRuntime { call, location } = &error else {
        panic!("expected InsideAsyncRuntime, got {error:?}");
    };
    assert_eq!(*call, "LockManager::acquire");
    // The locked function's own code, not distlock's.
    assert!(location.file().ends_with("blocking.rs"), "{location}");
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

/// Forks this process without exec, and waits up to `limit` for the child, which runs `child`
/// and exits with 0 when it returns `Ok`, 1 (after printing why) when it returns an error.
/// Panics when the child is still running at `limit` (it is killed first).
///
/// `fork` has no safe wrapper: only the calling thread goes on in the child, and that is the
/// very situation under test. It runs in a worker process of its own (`spawn_worker`), so the
/// test harness's other threads are not forked with it, and the child leaves by `_exit`,
/// running nothing the parent's other threads may have left half done.
#[allow(unsafe_code)]
fn fork_and_wait(limit: Duration, child: impl FnOnce() -> Result<(), String>) -> ExitCode {
    // SAFETY: see `fork_by_and_wait`.
    fork_by_and_wait(|| unsafe { libc::fork() }, limit, child)
}

/// [`fork_and_wait`], the process forked by `fork` (a `fork(2)` of some flavour: returns the
/// child's pid in the parent, 0 in the child).
#[allow(unsafe_code)]
fn fork_by_and_wait(
    fork: impl FnOnce() -> libc::pid_t,
    limit: Duration,
    child: impl FnOnce() -> Result<(), String>,
) -> ExitCode {
    // SAFETY: see above; the child touches no lock another thread may hold but distlock's own,
    // which is what the test checks.
    let pid = fork();
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = match child() {
            Ok(()) => 0,
            Err(error) => {
                eprintln!("the forked child failed: {error}");
                1
            }
        };
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    let deadline = Instant::now() + limit;
    loop {
        let mut status = 0;
        // SAFETY: `pid` is our own child; `status` is a valid place to write to.
        let done = unsafe { libc::waitpid(pid, &raw mut status, libc::WNOHANG) };
        if done == pid {
            return ExitCode(libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)));
        }
        if Instant::now() >= deadline {
            // SAFETY: as above; SIGKILL ends it even while it hangs.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &raw mut status, 0);
            }
            panic!("the forked child was still blocked after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How a forked child ended: its exit code, `None` when a signal ended it.
#[derive(Debug, PartialEq, Eq)]
struct ExitCode(Option<i32>);

/// The worker of the fork test, started by `spawn_worker`.
pub(crate) fn fork_worker() {
    let url =
        std::env::var("DISTLOCK_FORK_WORKER_URL").expect("set by the test that starts this worker");
    let manager = LockManager::connect(&url).unwrap();
    blocking::init_with(manager.clone()).unwrap();
    let options = LockOptions::new().timeout(Duration::from_secs(10));
    // The parent uses the blocking API before it forks: the background runtime, its
    // connection and the wake-up subscription (a wait, then a hand-off) exist from now on.
    let holder = manager.acquire("blocking:fork:warm", &options).unwrap();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        holder.release().unwrap();
    });
    manager
        .acquire("blocking:fork:warm", &options)
        .unwrap()
        .release()
        .unwrap();
    releaser.join().unwrap();
    // Held by the parent across the fork: the child waits for it.
    let held = manager.acquire("blocking:fork:held", &ttl(30_000)).unwrap();
    let release_later = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        held.release().unwrap();
    });

    // Lock values are built from a per-thread cache of `;h=<host>;p=<pid>;t=`: make one on
    // this thread, the one the child goes on with, so that the child inherits a cache made
    // for the parent's pid (and must not write it into its own locks).
    let this_thread = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    this_thread.block_on(async {
        let guard = manager
            .as_async()
            .acquire("blocking:fork:this-thread", &options)
            .await
            .unwrap();
        let holder = manager
            .as_async()
            .inspect("blocking:fork:this-thread")
            .await
            .unwrap()
            .and_then(|info| info.holder)
            .expect("the lock shows its holder");
        assert_eq!(holder.pid, std::process::id());
        guard.release().await.unwrap();
    });
    drop(this_thread);

    let child = || -> Result<(), String> {
        let quick = LockOptions::new().timeout(Duration::from_secs(2));
        let error = |what: &'static str| move |error: LockError| format!("{what}: {error}");
        let guard = manager
            .acquire("blocking:fork:free", &quick)
            .map_err(error("a free lock"))?;
        guard.release().map_err(error("its release"))?;
        let guard = blocking::global()
            .and_then(|global| global.acquire("blocking:fork:global", &quick))
            .map_err(error("a lock through the global manager"))?;
        // Released by the drop.
        drop(guard);
        // Handed over by the parent's release.
        let guard = manager
            .acquire("blocking:fork:held", &options)
            .map_err(error("the lock the parent held"))?;
        guard.release().map_err(error("its release"))?;
        // An async guard dropped on a runtime of the child's own is released on the
        // background runtime.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| error.to_string())?;
        runtime.block_on(async {
            let guard = manager
                .as_async()
                .acquire("blocking:fork:dropped", &ttl(30_000))
                .await
                .map_err(error("an async lock"))?;
            // The lock names the child as its holder, not the parent.
            let holder = manager
                .as_async()
                .inspect("blocking:fork:dropped")
                .await
                .map_err(error("its inspection"))?
                .and_then(|info| info.holder)
                .ok_or("the lock shows no holder")?;
            if holder.pid != std::process::id() {
                return Err(format!("the lock names pid {} as its holder", holder.pid));
            }
            drop(guard);
            Ok::<(), String>(())
        })?;
        drop(runtime);
        let again = manager
            .acquire("blocking:fork:dropped", &quick)
            .map_err(error("the lock the dropped async guard held"))?;
        again.release().map_err(error("its release"))
    };
    let ended = fork_and_wait(Duration::from_secs(30), child);
    release_later.join().unwrap();
    assert_eq!(ended, ExitCode(Some(0)), "the forked child failed");
    assert!(
        manager
            .try_acquire("blocking:fork:held", &LockOptions::new())
            .unwrap()
            .is_some(),
        "the parent still works after the fork"
    );
}

/// A process forked without exec (a pre-fork server, a job runner) uses the blocking API that
/// its parent used before: every call works in the child, on a runtime and connections of its
/// own, rather than waiting for ever on the parent's, whose thread the child does not have.
#[test]
fn a_forked_child_uses_the_blocking_api_of_its_parent() {
    let server = shared_server();
    let worker = spawn_worker(
        "blocking::fork_worker",
        &[("DISTLOCK_FORK_WORKER_URL", server.url())],
    );
    for status in wait_all(vec![worker], Duration::from_secs(90)) {
        assert!(status.success(), "the fork worker failed: {status}");
    }
    assert!(
        !server.exists("lock:blocking:fork:dropped"),
        "released in the child"
    );
}

/// The worker of the test below, started by `spawn_worker`.
pub(crate) fn fork_inherited_guard_worker() {
    let url = std::env::var("DISTLOCK_FORK_INHERITED_URL")
        .expect("set by the test that starts this worker");
    let manager = LockManager::connect(&url).unwrap();
    let guard = manager
        .acquire("blocking:fork:inherited", &ttl(30_000))
        .unwrap();
    let token = guard.token().to_owned();
    // The child takes the guard out; the parent's stays here.
    let slot = std::cell::RefCell::new(Some(guard));
    let child = || -> Result<(), String> {
        let guard = slot.borrow_mut().take().ok_or("no guard")?;
        let mut redis = redis::Client::open(url.as_str())
            .and_then(|client| client.get_connection())
            .map_err(|error| error.to_string())?;
        let mut value = || -> Result<Option<String>, String> {
            redis::cmd("GET")
                .arg("lock:blocking:fork:inherited")
                .query(&mut redis)
                .map_err(|error| error.to_string())
        };
        if guard.extend(Duration::from_secs(1)).is_ok() {
            return Err("the child extended its parent's lock".into());
        }
        if guard.release().is_ok() {
            return Err("the child released its parent's lock".into());
        }
        match value()? {
            Some(held) if held == token => {}
            other => return Err(format!("the parent's lock now holds {other:?}")),
        }
        // The child waits for the lock like anyone else: the parent holds it.
        match manager.acquire(
            "blocking:fork:inherited",
            &LockOptions::new().timeout(Duration::from_millis(500)),
        ) {
            Err(LockError::Timeout { .. }) => Ok(()),
            Ok(_) => Err("the child acquired the lock its parent holds".into()),
            Err(error) => Err(format!("the child's acquire failed: {error}")),
        }
    };
    let ended = fork_and_wait(Duration::from_secs(30), child);
    assert_eq!(ended, ExitCode(Some(0)), "the forked child failed");
    let remaining: i64 = redis::cmd("PTTL")
        .arg("lock:blocking:fork:inherited")
        .query(
            &mut redis::Client::open(url.as_str())
                .unwrap()
                .get_connection()
                .unwrap(),
        )
        .unwrap();
    assert!(
        remaining > 5_000,
        "the child shortened its parent's lock: {remaining} ms left"
    );
    let guard = slot.into_inner().expect("the parent's guard");
    assert!(guard.is_held().unwrap(), "the parent still holds it");
    guard.release().unwrap();
}

/// A guard copied into a process forked without exec is its parent's lock: the child cannot
/// release, shorten or lengthen it (each is an error that says so), and waits for the lock as
/// any other process does; the parent keeps it, untouched.
#[test]
fn a_forked_child_cannot_release_or_extend_its_parents_guard() {
    let server = shared_server();
    let worker = spawn_worker(
        "blocking::fork_inherited_guard_worker",
        &[("DISTLOCK_FORK_INHERITED_URL", server.url())],
    );
    for status in wait_all(vec![worker], Duration::from_secs(90)) {
        assert!(status.success(), "the fork worker failed: {status}");
    }
}

// `_Fork` (glibc 2.34, POSIX.1-2024): the async-signal-safe fork, which runs no
// `pthread_atfork` handler.
#[allow(unsafe_code)]
extern "C" {
    fn _Fork() -> libc::pid_t;
}

/// The worker of the test below, started by `spawn_worker`.
pub(crate) fn fork_by_underscore_fork_worker() {
    let url = std::env::var("DISTLOCK_UNDERSCORE_FORK_URL")
        .expect("set by the test that starts this worker");
    let manager = LockManager::connect(&url).unwrap();
    let guard = manager
        .acquire("blocking:fork:underscore", &ttl(30_000))
        .unwrap();
    let token = guard.token().to_owned();
    let slot = std::cell::RefCell::new(Some(guard));
    let child = || -> Result<(), String> {
        let guard = slot.borrow_mut().take().ok_or("no guard")?;
        // The release, on a thread of its own, so that a child that hangs in it still reports.
        let (sent, answer) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = sent.send(guard.release().is_ok());
        });
        match answer.recv_timeout(Duration::from_secs(5)) {
            Ok(true) => return Err("the child released its parent's lock".into()),
            Ok(false) => {}
            Err(_) => return Err("the child's release of its parent's guard hangs".into()),
        }
        let mut redis = redis::Client::open(url.as_str())
            .and_then(|client| client.get_connection())
            .map_err(|error| error.to_string())?;
        let value: Option<String> = redis::cmd("GET")
            .arg("lock:blocking:fork:underscore")
            .query(&mut redis)
            .map_err(|error| error.to_string())?;
        match value {
            Some(held) if held == token => Ok(()),
            other => Err(format!("the parent's lock now holds {other:?}")),
        }
    };
    // SAFETY: as `libc::fork` in `fork_and_wait`.
    #[allow(unsafe_code)]
    let ended = fork_by_and_wait(|| unsafe { _Fork() }, Duration::from_secs(30), child);
    assert_eq!(ended, ExitCode(Some(0)), "the forked child failed");
    let guard = slot.into_inner().expect("the parent's guard");
    assert!(guard.is_held().unwrap(), "the parent still holds it");
    guard.release().unwrap();
}

/// A child forked by `_Fork` (the async-signal-safe fork of glibc 2.34 and POSIX.1-2024, which
/// runs no `pthread_atfork` handler; so does a raw `fork`/`clone` system call) is a forked child
/// all the same, and cannot release its parent's guard. A check by a counter that fork handlers
/// keep would never count such a fork: the child would take its parent's guard for its own and
/// release the parent's lock. The process id tells it.
///
/// Interleaving guarded against: parent acquires `L` (token T) → parent `_Fork`s → child:
/// `guard.release()` → the fork check → a release as the holder's would delete `L`.
#[test]
fn a_child_forked_without_fork_handlers_cannot_release_its_parents_guard() {
    let server = shared_server();
    let worker = spawn_worker(
        "blocking::fork_by_underscore_fork_worker",
        &[("DISTLOCK_UNDERSCORE_FORK_URL", server.url())],
    );
    for status in wait_all(vec![worker], Duration::from_secs(90)) {
        assert!(status.success(), "the fork worker failed: {status}");
    }
}
