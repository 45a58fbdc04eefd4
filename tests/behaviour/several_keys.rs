//! Several keys at once (`acquire_all`, `try_acquire_all`, `keys = [..]`): all or none, repeated
//! names once, opposite orders without deadlock, one guard that releases, extends, checks and
//! loses them together — on a real redis-server (one atomic script) and on the in-process
//! backend (one by one in key order), and across processes: transfers between accounts, a
//! non-atomic read-modify-write of two balances under the guard, with exact balances.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{distributed_lock, LockError, LockManager, LockMode, LockOptions};
use redis::aio::MultiplexedConnection;
use test_support::{shared_server, spawn_worker, wait_all, RedisServer};

fn options(timeout: Duration) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(10))
        .timeout(timeout)
}

/// All or none, on `manager`'s store, `other` another client of it: a busy key makes the
/// acquisition take nothing, with one attempt and with a timeout; once it is free the guard
/// holds every key, and its release frees them all.
async fn all_or_none(manager: LockManager, other: LockManager, tag: &str) {
    let (a, b, c) = (
        format!("{tag}:all:a"),
        format!("{tag}:all:b"),
        format!("{tag}:all:c"),
    );
    let held_b = other
        .acquire(&b, &options(Duration::ZERO))
        .await
        .expect("b is free");
    let names = [&a, &b, &c];
    let tried = manager
        .try_acquire_all(&names, &options(Duration::ZERO))
        .await
        .expect("one attempt answers");
    assert!(tried.is_none(), "b is held: nothing is taken");
    for free in [&a, &c] {
        let probe = other
            .try_acquire(free, &options(Duration::ZERO))
            .await
            .unwrap();
        assert!(
            probe.is_some(),
            "{free} was left free by the failed attempt"
        );
        probe.unwrap().release().await.unwrap();
    }
    let started = Instant::now();
    let timed_out = manager
        .acquire_all(&names, &options(Duration::from_millis(300)))
        .await
        .expect_err("b stays held past the timeout");
    // Taken together, the keys time out together and each is named; taken one by one, the
    // one still held is.
    assert!(
        matches!(&timed_out, LockError::Timeout { key, .. } if key.contains(":all:b")),
        "the timeout names the busy key: {timed_out:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(250));
    for free in [&a, &c] {
        let probe = other
            .try_acquire(free, &options(Duration::ZERO))
            .await
            .unwrap();
        assert!(probe.is_some(), "{free} was given back after the timeout");
        probe.unwrap().release().await.unwrap();
    }

    // b's release lets a waiting acquisition take them all.
    let waiting = tokio::spawn({
        let manager = manager.clone();
        let names = names.map(String::clone);
        async move {
            manager
                .acquire_all(&names, &options(Duration::from_secs(10)))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    held_b.release().await.unwrap();
    let guard = waiting.await.unwrap().expect("every key came free");
    let prefix = manager.key_prefix().to_owned();
    assert_eq!(
        guard.keys(),
        [&a, &b, &c].map(|name| format!("{prefix}{name}"))
    );
    assert_eq!(guard.key(), format!("{prefix}{a}"));
    assert!(guard.is_held().await.unwrap());
    for name in names {
        assert!(
            other
                .try_acquire(name, &options(Duration::ZERO))
                .await
                .unwrap()
                .is_none(),
            "{name} is held by the guard"
        );
    }
    guard.extend(Duration::from_secs(20)).await.unwrap();
    guard.release().await.expect("every key was still ours");
    let again = other
        .try_acquire_all(&names, &options(Duration::ZERO))
        .await
        .unwrap()
        .expect("the release freed every key");
    again.release().await.unwrap();
}

/// Repeated names count once, an empty list is refused, and a single name is a plain lock.
async fn repeated_and_empty_names(manager: LockManager, tag: &str) {
    let (a, b) = (format!("{tag}:rep:a"), format!("{tag}:rep:b"));
    let guard = manager
        .acquire_all(&[&a, &b, &a, &a], &options(Duration::from_secs(2)))
        .await
        .expect("a name given twice is taken once, not waited for");
    let prefix = manager.key_prefix().to_owned();
    assert_eq!(
        guard.keys(),
        [format!("{prefix}{a}"), format!("{prefix}{b}")]
    );
    guard.release().await.expect("released once each");

    let single = manager
        .acquire_all(&[&a, &a], &options(Duration::from_secs(2)))
        .await
        .unwrap();
    assert_eq!(single.keys(), [format!("{prefix}{a}")]);
    single.release().await.unwrap();

    let none: [&str; 0] = [];
    let refused = manager
        .acquire_all(&none, &options(Duration::from_secs(2)))
        .await
        .expect_err("an empty list is refused");
    assert!(
        matches!(&refused, LockError::Config(message) if message.contains("at least one name")),
        "{refused:?}"
    );
    let refused = manager
        .try_acquire_all(&none, &options(Duration::ZERO))
        .await
        .expect_err("an empty list is refused");
    assert!(matches!(refused, LockError::Config(_)), "{refused:?}");
}

/// Two groups of tasks take the same two keys in opposite orders, each doing a non-atomic
/// read-modify-write of a shared pair under the guard: no deadlock, no lost update.
async fn opposite_orders(manager: LockManager, tag: &str) {
    let (x, y) = (format!("{tag}:opp:x"), format!("{tag}:opp:y"));
    let pair = Arc::new(std::sync::Mutex::new((0_u32, 0_u32)));
    let tasks: Vec<_> = (0..6)
        .map(|task| {
            let (manager, pair) = (manager.clone(), Arc::clone(&pair));
            let names = if task % 2 == 0 {
                [x.clone(), y.clone()]
            } else {
                [y.clone(), x.clone()]
            };
            tokio::spawn(async move {
                for _ in 0..15 {
                    let guard = manager
                        .acquire_all(&names, &options(Duration::from_secs(30)))
                        .await
                        .expect("no deadlock: every acquisition gets both keys");
                    let (first, second) = *pair.lock().unwrap();
                    tokio::task::yield_now().await;
                    *pair.lock().unwrap() = (first + 1, second + 1);
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("no deadlock")
            .unwrap();
    }
    assert_eq!(*pair.lock().unwrap(), (90, 90), "an update was lost");
}

/// With auto-extension, a key taken from under the guard makes `lost` fire, and the release
/// says the guard was lost.
async fn a_lost_key_makes_lost_fire(manager: LockManager, other: LockManager, tag: &str) {
    let (a, b) = (format!("{tag}:lost:a"), format!("{tag}:lost:b"));
    let guard = manager
        .acquire_all(
            &[&a, &b],
            &LockOptions::new()
                .ttl(Duration::from_millis(600))
                .auto_extend(true),
        )
        .await
        .unwrap();
    let inspected = other.inspect(&b).await.unwrap().expect("b is held");
    assert!(other.force_release(&inspected).await.unwrap());
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the watchdog finds b gone and `lost` fires");
    assert!(guard.is_lost());
    assert!(matches!(guard.lost_error(), Some(LockError::Lost { .. })));
    let released = guard.release().await;
    assert!(
        matches!(released, Err(LockError::Lost { .. })),
        "{released:?}"
    );
    // a was given back by the release all the same.
    let a_again = other
        .try_acquire(&a, &options(Duration::ZERO))
        .await
        .unwrap()
        .expect("a was released with the guard");
    a_again.release().await.unwrap();
}

async fn redis_manager() -> LockManager {
    test_support::connect(shared_server()).await
}

#[tokio::test]
async fn all_or_none_on_redis() {
    all_or_none(redis_manager().await, redis_manager().await, "sk:redis").await;
}

#[tokio::test]
async fn all_or_none_in_process() {
    all_or_none(
        LockManager::in_process(),
        LockManager::in_process(),
        "sk:mem",
    )
    .await;
}

#[tokio::test]
async fn repeated_and_empty_names_on_redis() {
    repeated_and_empty_names(redis_manager().await, "sk:redis").await;
}

#[tokio::test]
async fn repeated_and_empty_names_in_process() {
    repeated_and_empty_names(LockManager::in_process(), "sk:mem").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_never_deadlock_on_redis() {
    opposite_orders(redis_manager().await, "sk:redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_never_deadlock_in_process() {
    opposite_orders(LockManager::in_process(), "sk:mem").await;
}

#[tokio::test]
async fn a_lost_key_makes_lost_fire_on_redis() {
    a_lost_key_makes_lost_fire(redis_manager().await, redis_manager().await, "sk:redis").await;
}

#[tokio::test]
async fn a_lost_key_makes_lost_fire_in_process() {
    a_lost_key_makes_lost_fire(
        LockManager::in_process(),
        LockManager::in_process(),
        "sk:mem",
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Transfers between accounts, from several processes
// ---------------------------------------------------------------------------------------------

const ACCOUNTS: u32 = 4;
const PROCESSES: u32 = 3;
const PROCESS_TASKS: u32 = 4;
const TRANSFERS: u32 = 12;
const OPENING: i64 = 1000;

/// The transfer `round` of task `task` of process `process`: from, to, amount. Every other one
/// names the accounts the other way round, and some go from an account to itself.
fn transfer(process: u32, task: u32, round: u32) -> (u32, u32, i64) {
    let from = (process + task + round) % ACCOUNTS;
    let to = (from + 1 + (task + round) % ACCOUNTS) % ACCOUNTS;
    (
        from,
        to,
        i64::from(1 + (process * 7 + task * 3 + round) % 5),
    )
}

/// Moves `amount` from one account to another with a non-atomic read-modify-write of both
/// balances: exact only if nobody else touches either account meanwhile.
#[distributed_lock(keys = ["sk:account:{from}", "sk:account:{to}"], ttl = 30, timeout = 60)]
async fn move_money(
    conn: &mut MultiplexedConnection,
    from: u32,
    to: u32,
    amount: i64,
) -> Result<(), LockError> {
    let read = |account: u32| format!("sk:balance:{account}");
    let balance = |value: Option<i64>| value.unwrap_or(OPENING);
    let from_balance: Option<i64> = redis::cmd("GET").arg(read(from)).query_async(conn).await?;
    let to_balance: Option<i64> = redis::cmd("GET").arg(read(to)).query_async(conn).await?;
    tokio::time::sleep(Duration::from_millis(1)).await;
    if from != to {
        redis::cmd("SET")
            .arg(read(from))
            .arg(balance(from_balance) - amount)
            .query_async::<()>(conn)
            .await?;
        redis::cmd("SET")
            .arg(read(to))
            .arg(balance(to_balance) + amount)
            .query_async::<()>(conn)
            .await?;
    }
    Ok(())
}

/// The worker: started by `spawn_worker`, `DISTLOCK_WORKER_INDEX` its process number.
pub(crate) fn transfer_worker() {
    let url = std::env::var("DISTLOCK_WORKER_URL").expect("DISTLOCK_WORKER_URL is set");
    let process: u32 = std::env::var("DISTLOCK_WORKER_INDEX")
        .expect("DISTLOCK_WORKER_INDEX is set")
        .parse()
        .unwrap();
    let runtime = test_support::runtime(2);
    runtime.block_on(async {
        distlock::init(&url).await.expect("the worker's init");
        let conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        // Start together, so that the processes really contend.
        let mut ready = conn.clone();
        redis::cmd("INCR")
            .arg("sk:ready")
            .query_async::<()>(&mut ready)
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while redis::cmd("GET")
            .arg("sk:ready")
            .query_async::<u32>(&mut ready)
            .await
            .unwrap()
            < PROCESSES
        {
            assert!(Instant::now() < deadline, "the other workers did not start");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let tasks: Vec<_> = (0..PROCESS_TASKS)
            .map(|task| {
                let mut conn = conn.clone();
                tokio::spawn(async move {
                    for round in 0..TRANSFERS {
                        let (from, to, amount) = transfer(process, task, round);
                        move_money(&mut conn, from, to, amount).await?;
                    }
                    Ok::<(), LockError>(())
                })
            })
            .collect();
        for task in tasks {
            if let Err(error) = task.await.expect("no task panicked") {
                panic!("a transfer failed: {error:?}");
            }
        }
    });
}

#[test]
fn transfers_in_both_orders_from_several_processes_keep_exact_balances() {
    let server = RedisServer::start();
    let workers = (0..PROCESSES)
        .map(|process| {
            spawn_worker(
                "several_keys::transfer_worker",
                &[
                    ("DISTLOCK_WORKER_URL", server.url()),
                    ("DISTLOCK_WORKER_INDEX", process.to_string()),
                ],
            )
        })
        .collect();
    for status in wait_all(workers, Duration::from_secs(180)) {
        assert!(status.success(), "a worker failed: {status} (output above)");
    }
    let mut expected = vec![OPENING; ACCOUNTS as usize];
    for process in 0..PROCESSES {
        for task in 0..PROCESS_TASKS {
            for round in 0..TRANSFERS {
                let (from, to, amount) = transfer(process, task, round);
                if from != to {
                    expected[from as usize] -= amount;
                    expected[to as usize] += amount;
                }
            }
        }
    }
    for (account, balance) in expected.iter().enumerate() {
        assert_eq!(
            server.get(&format!("sk:balance:{account}")),
            Some(balance.to_string()),
            "account {account}: a transfer overlapped another on the same account"
        );
    }
    assert!(server.keys("lock:sk:account:*").is_empty(), "all released");
}

// ---------------------------------------------------------------------------------------------
// The attribute's `on_busy` and the blocking API with several keys
// ---------------------------------------------------------------------------------------------

#[distributed_lock(keys = ["sk:busy:{a}", "sk:busy:{b}"], on_busy = "skip")]
async fn skipped_when_busy(a: u32, b: u32) -> Result<Option<u32>, LockError> {
    Ok(Some(a + b))
}

#[distributed_lock(keys = ["sk:busy:{a}", "sk:busy:{b}"], on_busy = "fail", guard = lock)]
async fn failed_when_busy(a: u32, b: u32) -> Result<Vec<String>, LockError> {
    Ok(lock.keys().into_iter().map(str::to_owned).collect())
}

#[tokio::test]
async fn the_attribute_skips_or_fails_when_one_key_is_busy() {
    test_support::global_server().await;
    let manager = redis_manager().await;
    assert_eq!(skipped_when_busy(1, 2).await.unwrap(), Some(3));
    assert_eq!(
        failed_when_busy(1, 2).await.unwrap(),
        ["lock:sk:busy:1", "lock:sk:busy:2"]
    );
    let held = manager
        .acquire("sk:busy:2", &options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(skipped_when_busy(1, 2).await.unwrap(), None, "skipped");
    let busy = failed_when_busy(1, 2).await.expect_err("one key is busy");
    assert!(
        matches!(&busy, LockError::Busy { key } if key.contains("lock:sk:busy:2")),
        "{busy:?}"
    );
    assert!(
        manager
            .try_acquire("sk:busy:1", &options(Duration::ZERO))
            .await
            .unwrap()
            .is_some(),
        "the free key was not kept"
    );
    held.release().await.unwrap();
}

#[distributed_lock(keys = ["sk:blocking:{from}", "sk:blocking:{to}"], timeout = 60)]
fn move_blocking(redis: &mut redis::Connection, from: u32, to: u32) -> Result<(), LockError> {
    let read = |redis: &mut redis::Connection, account: u32| -> i64 {
        redis::cmd("GET")
            .arg(format!("sk:blocking:balance:{account}"))
            .query::<Option<i64>>(redis)
            .unwrap()
            .unwrap_or(0)
    };
    let (from_balance, to_balance) = (read(redis, from), read(redis, to));
    std::thread::sleep(Duration::from_millis(1));
    for (account, balance) in [(from, from_balance - 1), (to, to_balance + 1)] {
        redis::cmd("SET")
            .arg(format!("sk:blocking:balance:{account}"))
            .arg(balance)
            .query::<()>(redis)
            .unwrap();
    }
    Ok(())
}

#[test]
fn blocking_threads_transfer_in_both_orders_with_exact_balances() {
    let server = shared_server();
    match distlock::blocking::init(&server.url()) {
        Ok(()) | Err(LockError::AlreadyInitialized) => {}
        Err(error) => panic!("blocking::init failed: {error}"),
    }
    let threads: Vec<_> = (0..4)
        .map(|thread| {
            let url = server.url();
            std::thread::spawn(move || {
                let mut redis = redis::Client::open(url).unwrap().get_connection().unwrap();
                for _ in 0..10 {
                    let (from, to) = if thread % 2 == 0 { (1, 2) } else { (2, 1) };
                    move_blocking(&mut redis, from, to).unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("no thread panicked");
    }
    // Two threads moved 20 from 1 to 2, two moved 20 back.
    assert_eq!(server.get("sk:blocking:balance:1").as_deref(), Some("0"));
    assert_eq!(server.get("sk:blocking:balance:2").as_deref(), Some("0"));

    // The manual blocking API, all or none.
    let manager = distlock::blocking::LockManager::connect(&server.url()).unwrap();
    let held = manager
        .acquire("sk:blocking:manual:b", &options(Duration::ZERO))
        .unwrap();
    let names = ["sk:blocking:manual:a", "sk:blocking:manual:b"];
    assert!(manager
        .try_acquire_all(&names, &options(Duration::ZERO))
        .unwrap()
        .is_none());
    held.release().unwrap();
    let guard = manager
        .acquire_all(&names, &options(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(
        guard.keys(),
        ["lock:sk:blocking:manual:a", "lock:sk:blocking:manual:b"]
    );
    assert!(guard.is_held().unwrap());
    guard.release().unwrap();
    assert!(!server.exists("lock:sk:blocking:manual:a"));
}

/// A name held as a semaphore among several keys: `Config` naming both uses, whatever the
/// order of the names and with one attempt or a wait, and nothing taken.
async fn a_semaphore_among_several_keys(manager: LockManager, other: LockManager, tag: &str) {
    let (free, semaphore) = (format!("{tag}:uses:free"), format!("{tag}:uses:semaphore"));
    let permit = other
        .acquire(&semaphore, &LockOptions::new().permits(2))
        .await
        .unwrap();
    for names in [[&free, &semaphore], [&semaphore, &free]] {
        let tried = manager
            .try_acquire_all(&names, &options(Duration::ZERO))
            .await;
        let waited = manager
            .acquire_all(&names, &options(Duration::from_secs(5)))
            .await;
        for error in [tried.map(|_| ()), waited.map(|_| ())] {
            assert!(
                matches!(&error, Err(LockError::Config(message)) if message.contains("semaphore")),
                "{names:?}: {error:?}"
            );
        }
        let probe = other
            .try_acquire(&free, &options(Duration::ZERO))
            .await
            .unwrap()
            .expect("nothing was taken");
        probe.release().await.unwrap();
    }
    permit.release().await.unwrap();
}

#[tokio::test]
async fn a_semaphore_among_several_keys_is_a_config_error_on_redis() {
    a_semaphore_among_several_keys(redis_manager().await, redis_manager().await, "sk:redis").await;
}

#[tokio::test]
async fn a_semaphore_among_several_keys_is_a_config_error_in_process() {
    let manager = LockManager::in_process();
    a_semaphore_among_several_keys(manager.clone(), manager, "sk:mem").await;
}

/// A name held by readers among several keys: the keys are mutexes, that is write locks, so
/// the caller finds it busy and waits for the readers, as a plain `acquire` of the name does.
async fn several_keys_wait_for_readers(manager: LockManager, other: LockManager, tag: &str) {
    let (free, read) = (format!("{tag}:readers:free"), format!("{tag}:readers:read"));
    let reader = other
        .acquire(&read, &LockOptions::new().mode(LockMode::Read))
        .await
        .unwrap();
    let names = [&free, &read];
    let tried = manager
        .try_acquire_all(&names, &options(Duration::ZERO))
        .await;
    assert!(matches!(tried, Ok(None)), "busy while read: {tried:?}");
    let waited = manager
        .acquire_all(&names, &options(Duration::from_millis(300)))
        .await;
    assert!(
        matches!(&waited, Err(LockError::Timeout { key, .. }) if key.ends_with(":readers:read")),
        "waits for the readers: {:?}",
        waited.map(|guard| guard.keys().len())
    );
    let (manager2, names2) = (manager.clone(), [free.clone(), read.clone()]);
    let writer = tokio::spawn(async move {
        manager2
            .acquire_all(&names2, &options(Duration::from_secs(20)))
            .await
    });
    // Waiting in line, it is not overtaken by a reader that comes after it.
    let started = Instant::now();
    loop {
        assert!(!writer.is_finished(), "the reader still holds the name");
        let later = other
            .try_acquire(&read, &LockOptions::new().mode(LockMode::Read))
            .await
            .unwrap();
        match later {
            Some(later) => later.release().await.unwrap(),
            None => break,
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the waiter never took its place in line"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    reader.release().await.unwrap();
    let guard = writer.await.unwrap().expect("in once the reader is gone");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn several_keys_wait_for_readers_on_redis() {
    several_keys_wait_for_readers(redis_manager().await, redis_manager().await, "sk:redis").await;
}

#[tokio::test]
async fn several_keys_wait_for_readers_in_process() {
    let manager = LockManager::in_process();
    several_keys_wait_for_readers(manager.clone(), manager, "sk:mem").await;
}

/// Several keys are mutexes: asked as a semaphore or to read, `acquire_all` and
/// `try_acquire_all` refuse at once with `Config`, saying what to write, and take nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_keys_as_a_semaphore_or_to_read_are_refused_and_take_nothing() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let names = ["kinds:a", "kinds:b"];
    for options in [
        LockOptions::new().permits(2),
        LockOptions::new().mode(LockMode::Read),
    ] {
        for attempt in [
            manager.acquire_all(&names, &options).await.map(Some),
            manager.try_acquire_all(&names, &options).await,
        ] {
            let Err(LockError::Config(message)) = attempt else {
                panic!("{options:?}: {attempt:?}");
            };
            assert!(message.contains("mutexes only"), "{message}");
        }
    }
    for name in names {
        assert!(!server.exists(&format!("lock:{name}")), "{name} was taken");
    }
}

/// A key a multi-key waiter is handed while an earlier key of its own is free, and finds that
/// earlier key taken at its look, is given back: it goes straight to the next waiter in that
/// key's line, as a release would hand it, rather than lying free until that waiter's renewal
/// comes round (a lease later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_are_never_left_waiting_for_a_renewal() {
    let server = shared_server();
    let (a, b) = ("sk:renewal:a", "sk:renewal:b");
    let b_key = test_support::keys::default_key(b);
    let line_of_b = || -> usize {
        redis::cmd("LLEN")
            .arg(test_support::keys::named(b).line())
            .query(&mut server.conn())
            .unwrap()
    };
    let (holder, taker, transfer, waiter) = (
        redis_manager().await,
        redis_manager().await,
        redis_manager().await,
        redis_manager().await,
    );
    let long = options(Duration::from_secs(30));
    let held_b = holder.acquire(b, &long).await.unwrap();
    let both = {
        let long = long.clone();
        tokio::spawn(async move { transfer.acquire_all(&[a, b], &long).await })
    };
    test_support::eventually(Duration::from_secs(10), "the transfer waits for b", || {
        line_of_b() == 1
    })
    .await;
    let for_b = {
        let long = long.clone();
        tokio::spawn(async move { waiter.acquire(b, &long).await })
    };
    test_support::eventually(Duration::from_secs(10), "a mutex waits behind it", || {
        line_of_b() == 2
    })
    .await;
    let held_a = taker
        .try_acquire(a, &options(Duration::ZERO))
        .await
        .unwrap()
        .expect("a is free: the transfer waits in b's line only");
    // b goes to the transfer, which finds a taken and gives b back: to the mutex waiter.
    held_b.release().await.unwrap();
    let started = Instant::now();
    while !for_b.is_finished() {
        assert!(
            server.exists(&b_key),
            "b lay free while a waiter was in its line ({:?} after its release): the transfer \
             gave it back without handing it on",
            started.elapsed()
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the mutex waiter never got b"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let got_b = for_b.await.unwrap().expect("the mutex waiter gets b");
    held_a.release().await.unwrap();
    got_b.release().await.unwrap();
    let both = both
        .await
        .unwrap()
        .expect("the transfer gets both in the end");
    both.release().await.unwrap();
    assert!(!server.exists(&b_key));
    assert!(!server.exists(&test_support::keys::default_key(a)));
}
