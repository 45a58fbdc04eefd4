//! Semaphores (`LockOptions::permits(n)`, attribute `permits = n`) against a real Redis: at
//! most n holders at once — across tasks and across OS processes —, a dead holder's permit
//! back at its ttl, first come first served among waiters, callers that disagree on n or use a
//! name two ways refused with `Config`, and each permit a lease of its own (extend, fencing).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{distributed_lock, LockError, LockManager, LockMode, LockOptions};
use redis::aio::MultiplexedConnection;
use test_support::{connect, global_server, shared_server, spawn_worker, wait_all, RedisServer};

const PERMITS: u32 = 3;

fn permits(n: u32) -> LockOptions {
    LockOptions::new()
        .permits(n)
        .ttl(Duration::from_secs(20))
        .timeout(Duration::from_secs(60))
}

/// A body that counts who is inside (a non-atomic count of its own, in this process) and
/// stays a while, so that holders overlap whenever the semaphore lets them.
async fn inside_for_a_while(inside: &AtomicUsize, most: &AtomicUsize) {
    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
    most.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(15)).await;
    inside.fetch_sub(1, Ordering::SeqCst);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn n_permits_let_in_exactly_n_tasks_at_once() {
    let server = shared_server();
    let manager = connect(server).await;
    let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let (manager, inside, most) = (manager.clone(), inside.clone(), most.clone());
            tokio::spawn(async move {
                for _ in 0..5 {
                    let guard = manager
                        .acquire("sem:tasks", &permits(PERMITS))
                        .await
                        .expect("a permit within the timeout");
                    inside_for_a_while(&inside, &most).await;
                    guard.release().await.expect("the permit was still ours");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("no task panicked");
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        PERMITS as usize,
        "at most n holders, and n of them when ten tasks want it"
    );
    assert!(!server.exists("lock:sem:tasks"), "every permit came back");
}

// ---------------------------------------------------------------------------------------------
// Several OS processes, through the attribute
// ---------------------------------------------------------------------------------------------

const PROCESSES: u32 = 3;
const PROCESS_TASKS: u32 = 4;
const PROCESS_ROUNDS: u32 = 5;

/// Counts the bodies inside in Redis (shared by every process): a body that finds more than
/// n inside records a violation, one that finds n records that the semaphore was full.
#[distributed_lock(key = "sem:procs", ttl = 30, timeout = 60, permits = 3)]
async fn inside_across_processes(mut conn: MultiplexedConnection) -> Result<(), LockError> {
    let count = |conn: &mut MultiplexedConnection, command: &'static str| {
        let mut conn = conn.clone();
        async move {
            redis::cmd(command)
                .arg("sem:procs:inside")
                .query_async::<i64>(&mut conn)
                .await
                .expect("the counter answers")
        }
    };
    let inside = count(&mut conn, "INCR").await;
    let mark = match inside {
        n if n > i64::from(PERMITS) => Some("sem:procs:violation"),
        n if n == i64::from(PERMITS) => Some("sem:procs:full"),
        _ => None,
    };
    if let Some(mark) = mark {
        redis::cmd("SET")
            .arg(mark)
            .arg(inside)
            .query_async::<()>(&mut conn)
            .await
            .expect("the mark is written");
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    count(&mut conn, "DECR").await;
    Ok(())
}

/// The worker of `permits_hold_across_processes`: started by `spawn_worker`.
pub(crate) fn semaphore_worker() {
    let url = std::env::var("DISTLOCK_WORKER_URL").expect("DISTLOCK_WORKER_URL is set");
    let runtime = test_support::runtime(2);
    runtime.block_on(async {
        distlock::init(&url)
            .await
            .expect("the worker's init succeeds");
        let conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let tasks: Vec<_> = (0..PROCESS_TASKS)
            .map(|_| {
                let conn = conn.clone();
                tokio::spawn(async move {
                    for _ in 0..PROCESS_ROUNDS {
                        inside_across_processes(conn.clone()).await?;
                    }
                    Ok::<(), LockError>(())
                })
            })
            .collect();
        for task in tasks {
            if let Err(error) = task.await.expect("no task panicked") {
                panic!("a permit was not had: {error}");
            }
        }
    });
}

#[test]
fn permits_hold_across_processes() {
    let server = RedisServer::start();
    let workers = (0..PROCESSES)
        .map(|_| {
            spawn_worker(
                "semaphores::semaphore_worker",
                &[("DISTLOCK_WORKER_URL", server.url())],
            )
        })
        .collect();
    for status in wait_all(workers, Duration::from_secs(120)) {
        assert!(
            status.success(),
            "a worker failed: {status} (its output is above)"
        );
    }
    assert_eq!(
        server.get("sem:procs:violation"),
        None,
        "a body found more than n holders inside"
    );
    assert!(
        server.exists("sem:procs:full"),
        "twelve tasks in three processes never filled the n permits"
    );
    assert_eq!(server.get("sem:procs:inside").as_deref(), Some("0"));
    assert!(!server.exists("lock:sem:procs"), "every permit came back");
}

// ---------------------------------------------------------------------------------------------
// A holder that dies
// ---------------------------------------------------------------------------------------------

/// Takes a permit of `sem:killed` with a 2 s ttl, says so, and sleeps until it is killed.
pub(crate) fn permit_holder_worker() {
    let url = std::env::var("DISTLOCK_WORKER_URL").expect("DISTLOCK_WORKER_URL is set");
    let runtime = test_support::runtime(1);
    runtime.block_on(async {
        let manager = LockManager::connect(&url).await.unwrap();
        let options = LockOptions::new().permits(2).ttl(Duration::from_secs(2));
        let guard = manager.acquire("sem:killed", &options).await.unwrap();
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        redis::cmd("SET")
            .arg("sem:killed:holding")
            .arg(guard.token())
            .query::<()>(&mut conn)
            .unwrap();
        tokio::time::sleep(Duration::from_secs(600)).await;
        drop(guard);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_permit_comes_back_at_its_ttl() {
    let server = RedisServer::start();
    let manager = connect(&server).await;
    let mut worker = spawn_worker(
        "semaphores::permit_holder_worker",
        &[("DISTLOCK_WORKER_URL", server.url())],
    );
    test_support::eventually(Duration::from_secs(30), "the worker holds a permit", || {
        server.exists("sem:killed:holding")
    })
    .await;
    let options = LockOptions::new().permits(2).ttl(Duration::from_secs(30));
    let mine = manager.acquire("sem:killed", &options).await.unwrap();
    let killed = Instant::now();
    test_support::send_signal(worker.id(), "KILL");
    let _ = worker.wait();
    // Both permits are taken: the dead holder's is not given back before its ttl.
    assert!(
        manager
            .try_acquire("sem:killed", &options)
            .await
            .unwrap()
            .is_none(),
        "the dead holder's permit is still leased"
    );
    let second = manager
        .acquire(
            "sem:killed",
            &options.clone().timeout(Duration::from_secs(20)),
        )
        .await
        .expect("the dead holder's permit comes back at its ttl");
    assert!(
        killed.elapsed() >= Duration::from_millis(500),
        "the permit came back only when its lease ran out"
    );
    second.release().await.unwrap();
    mine.release().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Waiting in line
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn permit_waiters_are_served_first_come_first_served() {
    let server = shared_server();
    // Managers of their own: each is a client of its own, as another process is.
    let holder = connect(server).await;
    let options = permits(2);
    let first = holder.acquire("sem:fifo", &options).await.unwrap();
    let second = holder.acquire("sem:fifo", &options).await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for waiter in 0..4 {
        let manager = connect(server).await;
        let (order, options) = (order.clone(), options.clone());
        waiters.push(tokio::spawn(async move {
            let guard = manager.acquire("sem:fifo", &options).await.unwrap();
            order.lock().unwrap().push(waiter);
            tokio::time::sleep(Duration::from_millis(50)).await;
            guard.release().await.unwrap();
        }));
        // In line before the next one comes.
        let line = test_support::keys::helper("lock:sem:fifo", "permit-line");
        test_support::eventually(Duration::from_secs(10), "the waiter is in line", || {
            redis::cmd("LLEN")
                .arg(&line)
                .query::<usize>(&mut server.conn())
                .unwrap()
                == waiter + 1
        })
        .await;
    }
    // One permit at a time comes back: each goes to the waiter at the head of the line.
    first.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    second.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        vec![0, 1, 2, 3],
        "served in the order they came"
    );
}

// ---------------------------------------------------------------------------------------------
// A name used in two ways, callers that disagree on n
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn callers_that_disagree_on_n_are_told_both_values() {
    let server = shared_server();
    let (one, other) = (connect(server).await, connect(server).await);
    let held = one.acquire("sem:disagree", &permits(5)).await.unwrap();
    let error = other
        .acquire("sem:disagree", &permits(3).timeout(Duration::from_secs(5)))
        .await
        .expect_err("another n is refused");
    match &error {
        LockError::Config(message) => assert!(
            message.contains('5') && message.contains('3') && message.contains("same number"),
            "names both values and what to do: {message}"
        ),
        other => panic!("expected Config, got {other:?}"),
    }
    held.release().await.unwrap();
}

#[tokio::test]
async fn a_name_used_as_mutex_and_semaphore_is_refused_both_ways() {
    let server = shared_server();
    let manager = connect(server).await;
    let quick = |options: LockOptions| options.timeout(Duration::from_secs(5));

    let mutex = manager
        .acquire("sem:two-ways:a", &LockOptions::new())
        .await
        .unwrap();
    let error = manager
        .acquire("sem:two-ways:a", &quick(permits(3)))
        .await
        .expect_err("a semaphore on a held mutex");
    assert!(
        matches!(&error, LockError::Config(message) if message.contains("mutex") && message.contains("semaphore")),
        "{error:?}"
    );
    mutex.release().await.unwrap();

    let permit = manager
        .acquire("sem:two-ways:b", &permits(3))
        .await
        .unwrap();
    let error = manager
        .acquire("sem:two-ways:b", &quick(LockOptions::new()))
        .await
        .expect_err("a mutex on a held semaphore");
    assert!(
        matches!(&error, LockError::Config(message) if message.contains("semaphore of 3 permits") && message.contains("mutex")),
        "{error:?}"
    );
    permit.release().await.unwrap();
    assert!(!server.exists("lock:sem:two-ways:a") && !server.exists("lock:sem:two-ways:b"));
}

#[tokio::test]
async fn zero_permits_are_a_config_error() {
    let manager = connect(shared_server()).await;
    let error = manager
        .acquire("sem:zero", &LockOptions::new().permits(0))
        .await
        .expect_err("no permits");
    assert!(
        matches!(&error, LockError::Config(message) if message.contains("permits(1)")),
        "{error:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Each permit a lease
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn each_permit_is_a_lease_of_its_own() {
    let server = shared_server();
    let manager = connect(server).await;
    let options = permits(2).ttl(Duration::from_millis(1500)).fencing(true);
    let a = manager.acquire("sem:lease", &options).await.unwrap();
    let b = manager.acquire("sem:lease", &options).await.unwrap();
    let (fa, fb) = (a.fencing_token().unwrap(), b.fencing_token().unwrap());
    assert!(
        fb > fa,
        "fencing tokens increase across permits: {fa} then {fb}"
    );
    // `a` is kept alive; `b` runs out.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        a.extend(Duration::from_millis(1500)).await.unwrap();
    }
    assert!(
        a.is_held().await.unwrap(),
        "an extended permit is still held"
    );
    assert!(
        !b.is_held().await.unwrap(),
        "a permit whose lease ran out is not"
    );
    assert!(matches!(b.release().await, Err(LockError::Lost { .. })));
    let c = manager.acquire("sem:lease", &options).await.unwrap();
    assert!(c.fencing_token().unwrap() > fb);
    a.release().await.unwrap();
    c.release().await.unwrap();
    assert!(!server.exists("lock:sem:lease"));
}

#[distributed_lock(
    key = "sem:auto:{n}",
    ttl = 1,
    timeout = 10,
    permits = 2,
    auto_extend = true
)]
async fn outlives_its_ttl(n: u32) -> Result<u32, LockError> {
    tokio::time::sleep(Duration::from_millis(2500)).await;
    Ok(n)
}

#[tokio::test]
async fn auto_extend_keeps_a_permit_past_its_ttl() {
    let server = global_server().await;
    assert_eq!(outlives_its_ttl(7).await.unwrap(), 7);
    assert!(!server.exists("lock:sem:auto:7"), "released after the body");
}

#[tokio::test]
async fn inspection_and_list_show_every_permit_and_n() {
    use futures_util::StreamExt;
    let server = shared_server();
    let manager = connect(server).await;
    let options = permits(3).label("payments::call");
    let a = manager.acquire("sem:shown", &options).await.unwrap();
    let b = manager.acquire("sem:shown", &options).await.unwrap();
    let info = manager.inspect("sem:shown").await.unwrap().expect("held");
    assert_eq!(info.mode, distlock::HeldMode::Semaphore { permits: 3 });
    assert_eq!(info.holders.len(), 2, "{info:?}");
    assert!(info
        .holders
        .iter()
        .all(|holder| holder.label == "payments::call" && holder.ttl_left.is_some()));
    assert_eq!(info.holder.as_ref(), info.holders.first());
    let listed: Vec<_> = manager
        .list("sem:shown*")
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].holders.len(), 2);
    a.release().await.unwrap();
    b.release().await.unwrap();
    assert!(manager.inspect("sem:shown").await.unwrap().is_none());
}

/// An operator's `force_release` of a semaphore takes every permit inspected, on the server:
/// the set and the holders' fencing tokens are gone, the broken tokens are kept for their
/// holders to learn why, and a permit holder that came in after the inspection keeps its own.
#[tokio::test]
async fn force_release_of_a_semaphore_breaks_the_permits_inspected_only() {
    let server = shared_server();
    let manager = connect(server).await;
    let options = permits(3).fencing(true);
    let a = manager.acquire("sem:forced", &options).await.unwrap();
    let b = manager.acquire("sem:forced", &options).await.unwrap();
    let info = manager.inspect("sem:forced").await.unwrap().expect("held");
    let later = manager.acquire("sem:forced", &options).await.unwrap();
    assert!(manager.force_release(&info).await.unwrap());
    let left = manager.inspect("sem:forced").await.unwrap().expect("held");
    assert_eq!(left.holders.len(), 1, "{left:?}");
    assert!(later.is_held().await.unwrap());
    let forced = test_support::keys::helper("lock:sem:forced", "forced-leases");
    let marks: Vec<String> = redis::cmd("ZRANGE")
        .arg(&forced)
        .arg(0)
        .arg(-1)
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(marks.len(), 2, "{marks:?}");
    assert!(
        marks.iter().any(|mark| mark == a.token()) && marks.iter().any(|mark| mark == b.token())
    );
    for broken in [a, b] {
        assert!(matches!(
            broken.release().await,
            Err(LockError::Lost {
                cause: distlock::LostCause::ForceReleased,
                ..
            })
        ));
    }
    later.release().await.unwrap();
    assert!(!server.exists("lock:sem:forced"));
    assert!(!server.exists(&test_support::keys::helper(
        "lock:sem:forced",
        "permit-fences"
    )));
}

// ---------------------------------------------------------------------------------------------
// The blocking API and a blocking `fn`
// ---------------------------------------------------------------------------------------------

static BLOCKING_INSIDE: AtomicUsize = AtomicUsize::new(0);
static BLOCKING_MOST: AtomicUsize = AtomicUsize::new(0);

#[distributed_lock(key = "sem:blocking:attr", ttl = 30, timeout = 60, permits = 2)]
fn blocking_section() -> Result<(), LockError> {
    let now = BLOCKING_INSIDE.fetch_add(1, Ordering::SeqCst) + 1;
    BLOCKING_MOST.fetch_max(now, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(20));
    BLOCKING_INSIDE.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[test]
fn permits_through_the_blocking_api_and_a_blocking_fn() {
    let server = shared_server();
    let manager = distlock::blocking::LockManager::connect(&server.url()).unwrap();
    let options = permits(2);
    let a = manager.acquire("sem:blocking", &options).unwrap();
    let b = manager.acquire("sem:blocking", &options).unwrap();
    assert!(
        manager
            .try_acquire("sem:blocking", &options)
            .unwrap()
            .is_none(),
        "both permits are taken"
    );
    a.release().unwrap();
    let c = manager
        .try_acquire("sem:blocking", &options)
        .unwrap()
        .expect("the permit given back");
    b.release().unwrap();
    c.release().unwrap();

    crate::blocking::install_global();
    let threads: Vec<_> = (0..5)
        .map(|_| {
            std::thread::spawn(|| {
                for _ in 0..3 {
                    blocking_section().expect("a permit within the timeout");
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("no thread panicked");
    }
    assert_eq!(
        BLOCKING_MOST.load(Ordering::SeqCst),
        2,
        "two at once, never three"
    );
    assert!(!server.exists("lock:sem:blocking:attr"));
}

/// Waits for a permit of `sem:fifo-procs`, then records its index (`SEMAPHORE_WAITER`) in line
/// order and holds the permit a while.
pub(crate) fn permit_waiter_worker() {
    let url = std::env::var("DISTLOCK_WORKER_URL").expect("DISTLOCK_WORKER_URL is set");
    let index = std::env::var("SEMAPHORE_WAITER").expect("SEMAPHORE_WAITER is set");
    let runtime = test_support::runtime(1);
    runtime.block_on(async {
        let manager = LockManager::connect(&url).await.unwrap();
        let guard = manager
            .acquire("sem:fifo-procs", &permits(2))
            .await
            .expect("a permit in turn");
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        redis::cmd("RPUSH")
            .arg("sem:fifo-procs:order")
            .arg(&index)
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        guard.release().await.unwrap();
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_waiters_in_other_processes_are_served_in_arrival_order() {
    let server = RedisServer::start();
    let manager = connect(&server).await;
    let first = manager
        .acquire("sem:fifo-procs", &permits(2))
        .await
        .unwrap();
    let second = manager
        .acquire("sem:fifo-procs", &permits(2))
        .await
        .unwrap();
    let line = test_support::keys::helper("lock:sem:fifo-procs", "permit-line");
    let mut workers = Vec::new();
    for index in 0..3_usize {
        workers.push(spawn_worker(
            "semaphores::permit_waiter_worker",
            &[
                ("DISTLOCK_WORKER_URL", server.url()),
                ("SEMAPHORE_WAITER", index.to_string()),
            ],
        ));
        test_support::eventually(Duration::from_secs(30), "the worker is in line", || {
            redis::cmd("LLEN")
                .arg(&line)
                .query::<usize>(&mut server.conn())
                .unwrap()
                == index + 1
        })
        .await;
    }
    first.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    second.release().await.unwrap();
    for status in wait_all(workers, Duration::from_secs(60)) {
        assert!(
            status.success(),
            "a worker failed: {status} (its output is above)"
        );
    }
    let order: Vec<String> = redis::cmd("LRANGE")
        .arg("sem:fifo-procs:order")
        .arg(0)
        .arg(-1)
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(
        order,
        ["0", "1", "2"],
        "served in the order they joined the line"
    );
}

/// One attempt of a mutex on a name held as a semaphore is refused as a wait for it is (and as
/// the in-process backend refuses it), not answered "busy", which would hide the misuse; on a
/// name held by readers it is busy, as a writer's wait for them is a wait.
#[tokio::test]
async fn a_mutex_try_on_a_held_semaphore_is_refused() {
    let manager = connect(shared_server()).await;
    let permit = manager
        .acquire("sem:two-ways:try", &permits(3))
        .await
        .unwrap();
    let tried = manager
        .try_acquire("sem:two-ways:try", &LockOptions::new())
        .await;
    assert!(
        matches!(&tried, Err(LockError::Config(message)) if message.contains("semaphore of 3 permits")),
        "{:?}",
        tried.map(|guard| guard.is_some())
    );
    permit.release().await.unwrap();
    let reader = manager
        .acquire(
            "sem:two-ways:try-read",
            &LockOptions::new().mode(LockMode::Read),
        )
        .await
        .unwrap();
    let writer = manager
        .try_acquire("sem:two-ways:try-read", &LockOptions::new())
        .await
        .unwrap();
    assert!(writer.is_none(), "busy while a reader holds it");
    reader.release().await.unwrap();
}

/// A task holding a permit that asks for the same name with another n is told both numbers,
/// as another caller with another n is, rather than re-entering a semaphore of the wrong size.
#[tokio::test]
async fn a_task_holding_a_permit_asking_another_n_is_told_both() {
    let manager = connect(shared_server()).await;
    let permit = manager.acquire("sem:reenter:n", &permits(2)).await.unwrap();
    let again = permit
        .scope(async { manager.acquire("sem:reenter:n", &permits(2)).await })
        .await
        .expect("the same n re-enters");
    assert_eq!(again.token(), permit.token());
    again.release().await.unwrap();
    let other = permit
        .scope(async { manager.acquire("sem:reenter:n", &permits(3)).await })
        .await;
    assert!(
        matches!(&other, Err(LockError::Config(message)) if message.contains('2') && message.contains('3')),
        "{:?}",
        other.map(|guard| guard.token().to_owned())
    );
    permit.release().await.unwrap();
}

/// Holders that stop together (a fleet shut down at once) leave their leases to run out side
/// by side, and the next call on the name takes them all out in one script: more of them than
/// Lua passes to one command (about 8000) must not make every call on the name an error until
/// the last live lease ends. The dead leases are written straight into the set, as the
/// holders left them, so that the test does not race their ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_leases_that_ran_out_together_are_taken_out_at_the_next_call() {
    let server = RedisServer::start();
    let manager = connect(&server).await;
    let reader = LockOptions::new()
        .mode(LockMode::Read)
        .ttl(Duration::from_secs(60));
    for (what, options) in [("permits", permits(20_000)), ("readers", reader)] {
        let name = format!("many-gone:{what}");
        let key = format!("lock:{name}");
        let live = manager.acquire(&name, &options).await.unwrap();
        let a_second_ago = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            - 1000;
        let mut dead = redis::cmd("ZADD");
        dead.arg(&key);
        for holder in 0..9000 {
            dead.arg(a_second_ago).arg(format!("dead-{holder}"));
        }
        let added: i64 = dead.query(&mut server.conn()).unwrap();
        assert_eq!(added, 9000);
        let next = manager
            .acquire(&name, &options)
            .await
            .unwrap_or_else(|error| panic!("{what}: the next holder: {error}"));
        live.extend(Duration::from_secs(60))
            .await
            .unwrap_or_else(|error| panic!("{what}: the live holder's extension: {error}"));
        let info = manager.inspect(&name).await.unwrap().expect("held");
        assert_eq!(
            info.holders.len(),
            2,
            "{what}: only the live holders are left"
        );
        next.release().await.unwrap();
        live.release().await.unwrap();
        assert!(!server.exists(&key), "{what}: every lease given back");
    }
}
