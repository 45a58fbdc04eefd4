//! Behaviour tests that need no server of their own, written once and run against every
//! backend: `parity_in_process.rs` instantiates them on `LockManager::in_process()`,
//! `parity_redis.rs` on a real redis-server. A backend that behaves differently fails here.
//!
//! A module provides `connect()` (a fresh manager, as another client of the same store) and
//! `install_global(module, test)` (the global manager on that store, once per process; `false`
//! when the test is not to run its body in this process), then calls
//! `parity_tests!(connect, install_global)`.
//!
//! Every test uses names of its own: the in-process table and the shared server are shared by
//! the tests of the binary.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use distlock::{distributed_lock, LockError, LockManager, LockOptions, LostCause};

/// Tests of one backend, each calling the body of the same name below.
macro_rules! parity_tests {
    ($connect:path, $install_global:path) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn exclusion_with_exact_count() {
            parity::exclusion_with_exact_count($connect).await;
        }
        #[tokio::test]
        async fn try_acquire_sees_the_holder() {
            parity::try_acquire_sees_the_holder($connect).await;
        }
        #[tokio::test]
        async fn an_unreleased_lock_expires_and_its_release_is_lost() {
            parity::an_unreleased_lock_expires_and_its_release_is_lost($connect).await;
        }
        #[tokio::test]
        async fn a_force_released_holder_is_told_so() {
            parity::a_force_released_holder_is_told_so($connect).await;
        }
        #[tokio::test]
        async fn extend_keeps_the_lock_and_fails_once_lost() {
            parity::extend_keeps_the_lock_and_fails_once_lost($connect).await;
        }
        #[tokio::test]
        async fn fencing_tokens_strictly_increase() {
            parity::fencing_tokens_strictly_increase($connect).await;
        }
        #[tokio::test]
        async fn fencing_tokens_count_per_key_and_inspection_shows_the_keys_counter() {
            parity::fencing_tokens_count_per_key_and_inspection_shows_the_keys_counter($connect)
                .await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn since_is_when_the_holder_got_the_lock_not_when_it_asked() {
            parity::since_is_when_the_holder_got_the_lock_not_when_it_asked($connect).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn waiters_are_served_in_arrival_order_and_woken_by_the_release() {
            parity::waiters_are_served_in_arrival_order_and_woken_by_the_release($connect).await;
        }
        #[tokio::test]
        async fn acquire_times_out_while_held() {
            parity::acquire_times_out_while_held($connect).await;
        }
        #[tokio::test]
        async fn a_cancelled_waiter_and_a_cancelled_holder_leave_nothing_held() {
            parity::a_cancelled_waiter_and_a_cancelled_holder_leave_nothing_held($connect).await;
        }
        #[tokio::test]
        async fn auto_extend_keeps_a_lock_past_its_ttl() {
            parity::auto_extend_keeps_a_lock_past_its_ttl($connect).await;
        }
        #[tokio::test]
        async fn hostile_names_lock_alike() {
            parity::hostile_names_lock_alike($connect).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_stuck_holder_task_gives_the_lock_up_to_its_own_process_at_its_ttl() {
            parity::a_stuck_holder_task_gives_the_lock_up_to_its_own_process_at_its_ttl($connect)
                .await;
        }
        #[test]
        fn a_runtime_that_shuts_down_releases_its_locks() {
            parity::a_runtime_that_shuts_down_releases_its_locks($connect);
        }
        #[tokio::test(flavor = "current_thread")]
        async fn auto_extend_cancels_the_body_when_the_lock_is_lost() {
            if !$install_global(
                module_path!(),
                "auto_extend_cancels_the_body_when_the_lock_is_lost",
            )
            .await
            {
                return;
            }
            parity::auto_extend_cancels_the_body_when_the_lock_is_lost().await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_attribute_excludes_through_the_global_manager() {
            if !$install_global(
                module_path!(),
                "the_attribute_excludes_through_the_global_manager",
            )
            .await
            {
                return;
            }
            parity::the_attribute_excludes_through_the_global_manager($connect).await;
        }
    };
}
pub(crate) use parity_tests;

fn ttl(millis: u64) -> LockOptions {
    LockOptions::new().ttl(Duration::from_millis(millis))
}

/// A counter that only a lock keeps correct: read, yield, write back.
#[derive(Default)]
pub(crate) struct Racy(AtomicU64);

impl Racy {
    pub(crate) async fn bump(&self) {
        let seen = self.0.load(Ordering::SeqCst);
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.0.store(seen + 1, Ordering::SeqCst);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

pub(crate) async fn exclusion_with_exact_count<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let counter = Arc::new(Racy::default());
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let manager = connect().await;
        for _ in 0..4 {
            let (manager, counter) = (manager.clone(), Arc::clone(&counter));
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let options = LockOptions::new().timeout(Duration::from_secs(60));
                    let guard = manager.acquire("parity:exclusion", &options).await.unwrap();
                    counter.bump().await;
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(counter.get(), 3 * 4 * 5, "two holders overlapped");
}

pub(crate) async fn try_acquire_sees_the_holder<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let (first, second) = (connect().await, connect().await);
    let options = LockOptions::new();
    let guard = first
        .try_acquire("parity:try", &options)
        .await
        .unwrap()
        .expect("a free lock is taken");
    assert_eq!(guard.key(), "lock:parity:try");
    // The token opens with a fresh UUID (what makes it unguessable); who holds it follows.
    let uuid = guard.token().split(';').next().unwrap();
    assert_eq!(uuid.len(), 36, "a UUID token: {}", guard.token());
    assert_eq!(
        uuid.matches('-').count(),
        4,
        "a UUID token: {}",
        guard.token()
    );
    assert!(second
        .try_acquire("parity:try", &options)
        .await
        .unwrap()
        .is_none());
    assert!(first
        .try_acquire("parity:try", &options)
        .await
        .unwrap()
        .is_none());
    assert!(guard.is_held().await.unwrap());
    guard.release().await.unwrap();
    let again = second
        .try_acquire("parity:try", &options)
        .await
        .unwrap()
        .expect("free after the release");
    again.release().await.unwrap();
}

pub(crate) async fn an_unreleased_lock_expires_and_its_release_is_lost<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let (first, second) = (connect().await, connect().await);
    let started = Instant::now();
    let stale = first.acquire("parity:expiry", &ttl(300)).await.unwrap();
    let options = ttl(10_000).timeout(Duration::from_secs(10));
    let fresh = second.acquire("parity:expiry", &options).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "taken after {:?}, before the holder's ttl ran out",
        started.elapsed()
    );
    assert!(
        !stale.is_held().await.unwrap(),
        "an expired lock is not held"
    );
    assert!(matches!(
        stale.extend(Duration::from_secs(5)).await,
        Err(LockError::Lost {
            cause: LostCause::Taken,
            ..
        })
    ));
    let released = stale.release().await;
    assert!(
        matches!(released, Err(LockError::Lost { ref key, cause: LostCause::Taken, .. }) if key == "lock:parity:expiry"),
        "release after expiry: {released:?}"
    );
    assert!(
        fresh.is_held().await.unwrap(),
        "the stale release left the new holder alone"
    );
    fresh.release().await.unwrap();
}

pub(crate) async fn a_force_released_holder_is_told_so<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let (holder, operator, next) = (connect().await, connect().await, connect().await);
    let long = ttl(30_000);
    for name in ["parity:forced-extend", "parity:forced-release"] {
        let stuck = holder.acquire(name, &long).await.unwrap();
        let info = operator.inspect(name).await.unwrap().expect("held");
        assert!(operator.force_release(&info).await.unwrap(), "broke {name}");
        let successor = next.acquire(name, &long).await.unwrap();
        let told = if name.ends_with("extend") {
            stuck.extend(Duration::from_secs(30)).await
        } else {
            stuck.release().await
        };
        assert!(
            matches!(
                told,
                Err(LockError::Lost {
                    cause: LostCause::ForceReleased,
                    ..
                })
            ),
            "{name}: {told:?}"
        );
        assert!(successor.is_held().await.unwrap(), "{name}: left alone");
        successor.release().await.unwrap();
    }
}

pub(crate) async fn extend_keeps_the_lock_and_fails_once_lost<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let (first, second) = (connect().await, connect().await);
    let guard = first.acquire("parity:extend", &ttl(300)).await.unwrap();
    guard.extend(Duration::from_secs(20)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        guard.is_held().await.unwrap(),
        "extended past its first ttl"
    );
    assert!(second
        .try_acquire("parity:extend", &LockOptions::new())
        .await
        .unwrap()
        .is_none());
    // Shortened, it runs out and cannot be extended again.
    guard.extend(Duration::from_millis(100)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(
        guard.extend(Duration::from_secs(5)).await,
        Err(LockError::Lost { .. })
    ));
    assert!(guard.is_lost());
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}

pub(crate) async fn fencing_tokens_strictly_increase<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let (first, second) = (connect().await, connect().await);
    let options = LockOptions::new().fencing(true);
    let mut last = 0;
    for round in 0..4 {
        let manager = if round % 2 == 0 { &first } else { &second };
        let guard = manager.acquire("parity:fence", &options).await.unwrap();
        let fence = guard.fencing_token().expect("asked for one");
        assert!(fence > last, "token {fence} after {last}");
        last = fence;
        guard.release().await.unwrap();
    }
    // Handed over to a waiter: still above the holder's.
    let holder = first.acquire("parity:fence", &options).await.unwrap();
    let held_fence = holder.fencing_token().unwrap();
    let waiting = {
        let (second, options) = (second.clone(), options.clone());
        tokio::spawn(async move { second.acquire("parity:fence", &options).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.release().await.unwrap();
    let handed = waiting.await.unwrap().unwrap();
    assert!(handed.fencing_token().unwrap() > held_fence);
    handed.release().await.unwrap();
    let plain = first
        .acquire("parity:fence", &LockOptions::new())
        .await
        .unwrap();
    assert_eq!(plain.fencing_token(), None, "no token unless asked for");
    plain.release().await.unwrap();
}

/// Redis keeps one fencing counter per key, so a key's tokens count its own fenced
/// acquisitions, from 1, whatever other keys do; and inspection shows that counter, also while
/// a holder that asked for no token holds the lock.
pub(crate) async fn fencing_tokens_count_per_key_and_inspection_shows_the_keys_counter<F, Fut>(
    connect: F,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let manager = connect().await;
    let fenced = LockOptions::new().fencing(true);
    let (a, b) = ("parity:fence-per-key:a", "parity:fence-per-key:b");
    let mut tokens = Vec::new();
    for name in [a, b, b, a, b] {
        let guard = manager.acquire(name, &fenced).await.unwrap();
        tokens.push(guard.fencing_token().expect("asked for one"));
        guard.release().await.unwrap();
    }
    assert_eq!(tokens, [1, 1, 2, 2, 3], "each key counts its own tokens");

    let plain = manager.acquire(a, &LockOptions::new()).await.unwrap();
    let info = manager.inspect(a).await.unwrap().expect("held");
    assert_eq!(
        info.fence,
        Some(2),
        "the key's last token, under an unfenced holder"
    );
    plain.release().await.unwrap();
    let never = manager
        .acquire("parity:fence-per-key:never", &LockOptions::new())
        .await
        .unwrap();
    let info = manager
        .inspect("parity:fence-per-key:never")
        .await
        .unwrap()
        .expect("held");
    assert_eq!(info.fence, None, "no token was ever issued for this key");
    never.release().await.unwrap();
}

/// `Holder::since` (`distlock list`'s HELD FOR) is when the holder got the lock: a waiter's
/// value is made before it waits, and its wait must not show as time held — neither after a
/// hand-off nor when its own look finds the lock free after the holder's ttl ran out.
pub(crate) async fn since_is_when_the_holder_got_the_lock_not_when_it_asked<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    const NAME: &str = "parity:since";
    // Both clocks count whole milliseconds at least.
    let grain = Duration::from_millis(2);
    let (first, second) = (connect().await, Arc::new(connect().await));
    let waiting = || {
        let second = Arc::clone(&second);
        tokio::spawn(async move {
            let options = LockOptions::new().timeout(Duration::from_secs(20));
            second.acquire(NAME, &options).await.unwrap()
        })
    };
    let since_now = |first: LockManager| async move {
        let info = first.inspect(NAME).await.unwrap().expect("held");
        info.holder.expect("a holder distlock wrote").since
    };

    // Handed over by the release.
    let holder = first.acquire(NAME, &LockOptions::new()).await.unwrap();
    let asked = SystemTime::now();
    let waiter = waiting();
    // In line, then a wait long enough to tell apart from the grain of the clocks.
    test_support::waiting_in_line(&first, NAME, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = SystemTime::now();
    holder.release().await.unwrap();
    let handed = waiter.await.unwrap();
    let since = since_now(first.clone()).await;
    assert!(
        since + grain >= released,
        "the wait counts as held: since {:?} before the release",
        released.duration_since(since).unwrap_or_default()
    );
    assert!(since >= asked);
    handed.release().await.unwrap();

    // Found free by the waiter's look when the holder's ttl ran out (it never released).
    let taken = SystemTime::now();
    let stuck = first.acquire(NAME, &ttl(1500)).await.unwrap();
    let waiter = waiting();
    let got = waiter.await.unwrap();
    let since = since_now(first.clone()).await;
    assert!(
        since + grain >= taken + Duration::from_millis(1500),
        "the wait counts as held: since {:?} after the first holder took it",
        since.duration_since(taken).unwrap_or_default()
    );
    got.release().await.unwrap();
    drop(stuck);

    // A first try shows the time of its `SET`.
    let before = SystemTime::now();
    let plain = first.acquire(NAME, &LockOptions::new()).await.unwrap();
    let after = SystemTime::now();
    let since = since_now(first.clone()).await;
    assert!(
        since + grain >= before && since <= after + grain,
        "{since:?}"
    );
    plain.release().await.unwrap();
}

pub(crate) async fn waiters_are_served_in_arrival_order_and_woken_by_the_release<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let holder_manager = connect().await;
    // A long ttl: only the release can let a waiter in within the bounds below.
    let options = ttl(30_000).timeout(Duration::from_secs(30));
    let holder = holder_manager
        .acquire("parity:fifo", &options)
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    // A client each, as separate processes are: the order is the shared line's, not one
    // process's queue (whose FIFO the runtime's unit tests cover).
    for n in 0..4 {
        let manager = connect().await;
        let (manager, options, order) = (manager.clone(), options.clone(), Arc::clone(&order));
        waiters.push(tokio::spawn(async move {
            let guard = manager.acquire("parity:fifo", &options).await.unwrap();
            order.lock().unwrap().push(n);
            guard.release().await.unwrap();
        }));
        // The next one arrives once this one holds its place in the shared line, however
        // slowly a loaded machine lets it get there.
        test_support::waiting_in_line(&holder_manager, "parity:fifo", n + 1).await;
    }
    let released = Instant::now();
    holder.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        vec![0, 1, 2, 3],
        "first come, first served"
    );
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "four hand-offs took {:?}: waiters were not woken by the releases",
        released.elapsed()
    );
}

pub(crate) async fn acquire_times_out_while_held<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let (first, second) = (connect().await, connect().await);
    let holder = first.acquire("parity:timeout", &ttl(30_000)).await.unwrap();
    let options = LockOptions::new().timeout(Duration::from_millis(300));
    for manager in [&second, &first] {
        let started = Instant::now();
        match manager.acquire("parity:timeout", &options).await {
            Err(LockError::Timeout { key, waited }) => {
                assert_eq!(key, "lock:parity:timeout");
                assert!(
                    waited >= Duration::from_millis(250),
                    "gave up after {waited:?}"
                );
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    let zero = LockOptions::new().timeout(Duration::ZERO);
    assert!(matches!(
        second.acquire("parity:timeout", &zero).await,
        Err(LockError::Timeout { .. })
    ));
    assert!(
        holder.is_held().await.unwrap(),
        "waiters that gave up left the holder alone"
    );
    holder.release().await.unwrap();
}

pub(crate) async fn a_cancelled_waiter_and_a_cancelled_holder_leave_nothing_held<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let (first, second) = (connect().await, connect().await);
    let long = ttl(30_000).timeout(Duration::from_secs(30));
    let holder = first.acquire("parity:cancel", &long).await.unwrap();
    // A waiter dropped while in line.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(500),
        second.acquire("parity:cancel", &long),
    )
    .await;
    assert!(gave_up.is_err(), "still held: the waiter was cancelled");
    holder.release().await.unwrap();
    // The cancelled waiter must not have been handed the lock for good.
    let taken = second
        .acquire(
            "parity:cancel",
            &LockOptions::new().timeout(Duration::from_secs(10)),
        )
        .await
        .expect("the lock comes back well before its 30 s ttl");
    taken.release().await.unwrap();

    // A holder whose task is aborted mid-body: released in the background.
    let (task_manager, options) = (first.clone(), long.clone());
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let _guard = task_manager
            .acquire("parity:cancel", &options)
            .await
            .unwrap();
        held_tx.send(()).unwrap();
        std::future::pending::<()>().await;
    });
    held_rx.await.unwrap();
    task.abort();
    let started = Instant::now();
    let again = second
        .acquire(
            "parity:cancel",
            &LockOptions::new().timeout(Duration::from_secs(10)),
        )
        .await
        .expect("released on drop, well before its 30 s ttl");
    assert!(started.elapsed() < Duration::from_secs(10));
    again.release().await.unwrap();
}

pub(crate) async fn auto_extend_keeps_a_lock_past_its_ttl<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let (first, second) = (connect().await, connect().await);
    let guard = first
        .acquire("parity:watchdog", &ttl(300).auto_extend(true))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        guard.is_held().await.unwrap(),
        "four ttls later, still held"
    );
    assert!(!guard.is_lost());
    assert!(second
        .try_acquire("parity:watchdog", &LockOptions::new())
        .await
        .unwrap()
        .is_none());
    guard.release().await.unwrap();
}

pub(crate) async fn hostile_names_lock_alike<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let (first, second) = (connect().await, connect().await);
    let huge = "x{".repeat(50_000);
    let names = [
        "parity:{",
        "parity:}",
        "parity:{}",
        "{parity}:a",
        "parity:\0\r\n ",
        "parity:😀",
        huge.as_str(),
    ];
    let options = LockOptions::new();
    for name in names {
        let guard = first.acquire(name, &options).await.unwrap();
        assert_eq!(guard.key(), format!("lock:{name}"));
        assert!(
            second.try_acquire(name, &options).await.unwrap().is_none(),
            "{name:.40}"
        );
        guard.release().await.unwrap();
        let again = second
            .try_acquire(name, &options)
            .await
            .unwrap()
            .expect("free");
        again.release().await.unwrap();
    }
}

/// The ttl is what frees a lock whose holder hangs (a body stuck on a channel that never
/// fires): another task of the same process, on the same manager, must get it after the ttl as
/// another process does — by `acquire` and by `try_acquire` — not wait behind the stuck task.
pub(crate) async fn a_stuck_holder_task_gives_the_lock_up_to_its_own_process_at_its_ttl<F, Fut>(
    connect: F,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let manager = connect().await;
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let stuck_manager = manager.clone();
    let stuck = tokio::spawn(async move {
        let _guard = stuck_manager
            .acquire("parity:stuck", &ttl(500))
            .await
            .unwrap();
        held_tx.send(()).unwrap();
        std::future::pending::<()>().await;
    });
    held_rx.await.unwrap();
    let started = Instant::now();
    let next = manager
        .acquire("parity:stuck", &ttl(500).timeout(Duration::from_secs(10)))
        .await
        .expect("the stuck holder's lock expired after 500 ms: the next task gets it");
    assert!(started.elapsed() < Duration::from_secs(10));
    // Now this one hangs too (forgotten guard): `try_acquire` gets the lock after its ttl.
    std::mem::forget(next);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let taken = manager
        .try_acquire("parity:stuck", &LockOptions::new())
        .await
        .unwrap()
        .expect("both holders' ttls ran out: the lock is free");
    taken.release().await.unwrap();
    stuck.abort();
}

pub(crate) fn a_runtime_that_shuts_down_releases_its_locks<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let manager = runtime.block_on(connect());
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    runtime.spawn(async move {
        let options = ttl(30_000);
        let _guard = manager.acquire("parity:shutdown", &options).await.unwrap();
        held_tx.send(()).unwrap();
        std::future::pending::<()>().await;
    });
    // Drive the task until it holds the lock, then shut the runtime down under it.
    runtime.block_on(async {
        while held_rx.try_recv().is_err() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    drop(runtime);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let other = connect().await;
        let started = Instant::now();
        let guard = other
            .acquire(
                "parity:shutdown",
                &LockOptions::new().timeout(Duration::from_secs(10)),
            )
            .await
            .expect("released when its runtime shut down, not after its 30 s ttl");
        assert!(started.elapsed() < Duration::from_secs(10));
        guard.release().await.unwrap();
    });
}

#[distributed_lock(key = "parity:lost", ttl = "300ms", auto_extend = true)]
async fn blocks_past_its_ttl(finished: &AtomicU64) -> Result<(), LockError> {
    // Blocks the (current-thread) runtime, so the watchdog cannot renew in time.
    std::thread::sleep(Duration::from_millis(700));
    tokio::time::sleep(Duration::from_secs(2)).await;
    finished.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

pub(crate) async fn auto_extend_cancels_the_body_when_the_lock_is_lost() {
    let finished = AtomicU64::new(0);
    let started = Instant::now();
    let result = blocks_past_its_ttl(&finished).await;
    // Redis was never out of reach: the watchdog's runtime was blocked, and the lock expired.
    assert!(
        matches!(result, Err(LockError::Lost { ref key, cause: LostCause::Expired, .. }) if key == "lock:parity:lost"),
        "{result:?}"
    );
    assert_eq!(
        finished.load(Ordering::SeqCst),
        0,
        "the body was cancelled at its next await"
    );
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "cancelled, not run out"
    );
}

#[distributed_lock(key = "parity:attr:{id}", ttl = 10, timeout = 30)]
async fn bump_under_lock(id: u32, counter: &Racy) -> Result<u64, LockError> {
    counter.bump().await;
    Ok(counter.get())
}

#[distributed_lock(key = "parity:attr:{id}", timeout = "200ms")]
async fn give_up_quickly(id: u32) -> Result<(), LockError> {
    Ok(())
}

pub(crate) async fn the_attribute_excludes_through_the_global_manager<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = LockManager>,
{
    let counter = Arc::new(Racy::default());
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let counter = Arc::clone(&counter);
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                bump_under_lock(7, &counter).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(counter.get(), 40, "two bodies overlapped");

    // The global manager and a fresh client see the same locks.
    let other = connect().await;
    let guard = other
        .acquire("parity:attr:8", &LockOptions::new())
        .await
        .unwrap();
    assert!(matches!(
        give_up_quickly(8).await,
        Err(LockError::Timeout { .. })
    ));
    guard.release().await.unwrap();
    give_up_quickly(8).await.unwrap();
}
