//! Mutual exclusion through `#[distributed_lock]`: many tasks, and several OS processes, do a
//! non-atomic read-modify-write of a Redis counter (GET, yield, SET) under one lock. Without
//! exclusion updates are lost and the final count falls short; with it the count is exact and
//! no two bodies are ever inside at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{distributed_lock, LockError};
use redis::aio::MultiplexedConnection;
use test_support::{global_server, shared_server, spawn_worker, wait_all, RedisServer};

// The fields are read only through `Debug`, in failure messages.
#[allow(dead_code)]
#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Redis(redis::RedisError),
    Check(String),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

impl From<redis::RedisError> for AppError {
    fn from(error: redis::RedisError) -> Self {
        AppError::Redis(error)
    }
}

async fn connection(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|error| panic!("cannot connect to {url}: {error}"))
}

/// GET the counter, let other tasks run, SET it one higher: loses updates unless exclusive.
async fn read_modify_write(
    conn: &mut MultiplexedConnection,
    counter: &str,
    round: u32,
) -> Result<(), AppError> {
    let value: Option<u64> = redis::cmd("GET").arg(counter).query_async(conn).await?;
    if round.is_multiple_of(2) {
        tokio::task::yield_now().await;
    } else {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    redis::cmd("SET")
        .arg(counter)
        .arg(value.unwrap_or(0) + 1)
        .query_async::<()>(conn)
        .await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Many tasks in one process
// ---------------------------------------------------------------------------------------------

const TASKS: u32 = 24;
const ROUNDS: u32 = 20;

#[distributed_lock(key = "mutex:tasks", ttl = 30, timeout = 60)]
async fn increment_in_process(
    mut conn: MultiplexedConnection,
    round: u32,
    inside: Arc<AtomicUsize>,
    max_inside: Arc<AtomicUsize>,
) -> Result<(), AppError> {
    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
    max_inside.fetch_max(now, Ordering::SeqCst);
    let result = read_modify_write(&mut conn, "mutex:tasks:counter", round).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_tasks_count_exactly() {
    let server = global_server().await;
    let conn = connection(&server.url()).await;
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));

    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (conn, inside, max_inside) = (conn.clone(), inside.clone(), max_inside.clone());
            tokio::spawn(async move {
                for round in 0..ROUNDS {
                    increment_in_process(conn.clone(), round, inside.clone(), max_inside.clone())
                        .await?;
                }
                Ok::<(), AppError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await
            .expect("no task panicked")
            .expect("every increment succeeded");
    }
    eprintln!("{} increments in {:?}", TASKS * ROUNDS, started.elapsed());

    assert_eq!(
        server.get("mutex:tasks:counter").as_deref(),
        Some((TASKS * ROUNDS).to_string().as_str()),
        "an update was lost: two bodies overlapped"
    );
    assert_eq!(
        max_inside.load(Ordering::SeqCst),
        1,
        "at most one body may be inside at a time"
    );
    assert!(
        !server.exists("lock:mutex:tasks"),
        "the last holder released"
    );
}

// ---------------------------------------------------------------------------------------------
// Several OS processes
// ---------------------------------------------------------------------------------------------

const PROCESSES: u32 = 3;
const PROCESS_TASKS: u32 = 8;
const PROCESS_ROUNDS: u32 = 10;

/// Counts the bodies inside in Redis (shared by every process), and records a violation when
/// a body finds another one inside.
#[distributed_lock(key = "mutex:procs", ttl = 30, timeout = 60)]
async fn increment_across_processes(
    mut conn: MultiplexedConnection,
    round: u32,
) -> Result<(), AppError> {
    let inside: i64 = redis::cmd("INCR")
        .arg("mutex:procs:inside")
        .query_async(&mut conn)
        .await?;
    if inside > 1 {
        redis::cmd("SET")
            .arg("mutex:procs:violation")
            .arg(inside)
            .query_async::<()>(&mut conn)
            .await?;
    }
    let result = read_modify_write(&mut conn, "mutex:procs:counter", round).await;
    redis::cmd("DECR")
        .arg("mutex:procs:inside")
        .query_async::<()>(&mut conn)
        .await?;
    result
}

/// The worker: started by `spawn_worker`.
pub(crate) fn mutex_worker() {
    let url = std::env::var("DISTLOCK_WORKER_URL").expect("DISTLOCK_WORKER_URL is set");
    let runtime = test_support::runtime(2);
    runtime.block_on(async {
        distlock::init(&url)
            .await
            .expect("the worker's init succeeds");
        let mut conn = connection(&url).await;

        // Start together, so that the processes really contend.
        redis::cmd("INCR")
            .arg("mutex:procs:ready")
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready: u32 = redis::cmd("GET")
                .arg("mutex:procs:ready")
                .query_async(&mut conn)
                .await
                .unwrap();
            if ready >= PROCESSES {
                break;
            }
            assert!(Instant::now() < deadline, "the other workers did not start");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        let tasks: Vec<_> = (0..PROCESS_TASKS)
            .map(|_| {
                let conn = conn.clone();
                tokio::spawn(async move {
                    for round in 0..PROCESS_ROUNDS {
                        increment_across_processes(conn.clone(), round).await?;
                    }
                    Ok::<(), AppError>(())
                })
            })
            .collect();
        for task in tasks {
            if let Err(error) = task.await.expect("no task panicked") {
                panic!("an increment failed: {error:?}");
            }
        }
    });
}

#[test]
fn processes_count_exactly() {
    let server = RedisServer::start();
    let started = Instant::now();
    let workers = (0..PROCESSES)
        .map(|_| {
            spawn_worker(
                "mutual_exclusion::mutex_worker",
                &[("DISTLOCK_WORKER_URL", server.url())],
            )
        })
        .collect();
    let statuses = wait_all(workers, Duration::from_secs(120));
    eprintln!(
        "{} increments by {PROCESSES} processes in {:?}",
        PROCESSES * PROCESS_TASKS * PROCESS_ROUNDS,
        started.elapsed()
    );
    for status in &statuses {
        assert!(
            status.success(),
            "a worker failed: {status} (its output is above)"
        );
    }

    assert_eq!(
        server.get("mutex:procs:ready").as_deref(),
        Some(PROCESSES.to_string().as_str()),
        "every worker ran"
    );
    assert_eq!(
        server.get("mutex:procs:counter").as_deref(),
        Some(
            (PROCESSES * PROCESS_TASKS * PROCESS_ROUNDS)
                .to_string()
                .as_str()
        ),
        "an update was lost: two bodies overlapped"
    );
    assert_eq!(
        server.get("mutex:procs:violation"),
        None,
        "a body found another one inside"
    );
    assert_eq!(server.get("mutex:procs:inside").as_deref(), Some("0"));
    assert!(
        !server.exists("lock:mutex:procs"),
        "the last holder released"
    );
}

#[test]
fn the_counter_loses_updates_without_the_lock() {
    // Control: the same read-modify-write without the lock falls short, so the exact counts
    // above are evidence of exclusion and not of a read-modify-write that cannot race.
    let server = shared_server();
    let runtime = test_support::runtime(2);
    let total = runtime.block_on(async {
        let conn = connection(&server.url()).await;
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let mut conn = conn.clone();
                tokio::spawn(async move {
                    for round in 0..5 {
                        read_modify_write(&mut conn, "mutex:unlocked:counter", round)
                            .await
                            .map_err(|error| AppError::Check(format!("{error:?}")))?;
                    }
                    Ok::<(), AppError>(())
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        server
            .get("mutex:unlocked:counter")
            .and_then(|value| value.parse::<u32>().ok())
            .unwrap_or(0)
    });
    eprintln!("without the lock: {total} of {} increments kept", TASKS * 5);
    assert!(
        total < TASKS * 5,
        "without the lock, concurrent read-modify-writes should lose updates (got {total})"
    );
}
