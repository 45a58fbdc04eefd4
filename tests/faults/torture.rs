//! Torture: 4 OS processes × 16 tasks each run lock-protected sections over 8
//! keys; every section is a non-atomic read-modify-write (GET, yield, SET) that loses updates
//! the moment two holders overlap. Every acquisition asks for a fencing token, and the section
//! appends its token to the key's list, so the list is the key's commit order.
//!
//! Asserted exactly: each key's counter equals the number of sections run on it; no section ever
//! saw another one in flight on its key; each key's token list is strictly increasing in commit
//! order, and is exactly `1..=n` (no token issued to anyone but a section that committed); no lock
//! is left behind.
//!
//! Size: the full "4 processes × 16 tasks × at least 500 sections": every task runs
//! [`SECTIONS_PER_TASK`] = 504 sections (the first multiple of 8 keys above 500), 32 256 sections
//! in all. About 27 s on a shared 2-core machine (~1 200 sections/s over all processes).

use std::time::{Duration, Instant};

use distlock::{distributed_lock, LockError};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use test_support::{spawn_worker, wait_all, RedisServer};

const PROCESSES: usize = 4;
const TASKS: usize = 16;
/// At least 500 and a multiple of [`KEYS`], so every task runs the same number of sections on
/// every key.
const SECTIONS_PER_TASK: usize = 504;
const KEYS: usize = 8;

const URL_VAR: &str = "DISTLOCK_TORTURE_URL";
const WORKER_VAR: &str = "DISTLOCK_TORTURE_WORKER";

/// One section on `key`: a read-modify-write that only the lock makes safe, plus the fencing
/// token appended in commit order and an in-flight check that catches any overlap directly.
#[distributed_lock(key = "torture:{key}", ttl = 10, timeout = 60, fencing = true, guard = lock)]
async fn section(key: usize, mut data: MultiplexedConnection) -> Result<(), LockError> {
    let fence = lock
        .fencing_token()
        .expect("fencing = true issues a fencing token");
    let in_flight: i64 = data.incr(format!("in_flight:{key}"), 1).await?;
    let count: Option<i64> = data.get(format!("count:{key}")).await?;
    // Let every other task run between the read and the write: without the lock this loses
    // updates at once.
    tokio::task::yield_now().await;
    let () = data
        .set(format!("count:{key}"), count.unwrap_or(0) + 1)
        .await?;
    let _: i64 = data.rpush(format!("fences:{key}"), fence).await?;
    let _: i64 = data.decr(format!("in_flight:{key}"), 1).await?;
    if in_flight != 1 {
        let _: i64 = data.incr("violations", 1).await?;
    }
    Ok(())
}

/// The worker process: 16 tasks, each running its sections over all 8 keys.
pub(crate) fn torture_worker() {
    let url = std::env::var(URL_VAR).expect("set by the test that starts this worker");
    let worker: usize = std::env::var(WORKER_VAR)
        .expect("worker index")
        .parse()
        .expect("worker index is a number");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        distlock::init(&url).await.expect("connect to Redis");
        let data = redis::Client::open(url.as_str())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("data connection");
        let started = Instant::now();
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let data = data.clone();
                tokio::spawn(async move {
                    for i in 0..SECTIONS_PER_TASK {
                        let key = (worker + task + i) % KEYS;
                        section(key, data.clone()).await.unwrap_or_else(|e| {
                            panic!("task {task} section {i} on key {key}: {e}")
                        });
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("a section task panicked");
        }
        let elapsed = started.elapsed();
        println!(
            "worker {worker}: {} sections in {elapsed:.2?} ({:.0} sections/s)",
            TASKS * SECTIONS_PER_TASK,
            (TASKS * SECTIONS_PER_TASK) as f64 / elapsed.as_secs_f64()
        );
    });
}

#[test]
fn torture_counts_are_exact_and_fencing_tokens_increase_in_commit_order() {
    let server = RedisServer::start();
    let started = Instant::now();
    let workers = (0..PROCESSES)
        .map(|worker| {
            spawn_worker(
                "torture::torture_worker",
                &[(URL_VAR, server.url()), (WORKER_VAR, worker.to_string())],
            )
        })
        .collect();
    for status in wait_all(workers, Duration::from_secs(150)) {
        assert!(status.success(), "a torture worker failed: {status}");
    }
    let elapsed = started.elapsed();
    let total = PROCESSES * TASKS * SECTIONS_PER_TASK;
    eprintln!(
        "torture: {total} sections by {PROCESSES} processes × {TASKS} tasks in {elapsed:.2?} \
         ({:.0} sections/s, process start-up included)",
        total as f64 / elapsed.as_secs_f64()
    );

    assert_eq!(
        server.get("violations"),
        None,
        "a section saw another one in flight on its key"
    );
    let per_key = total / KEYS;
    let mut conn = server.conn();
    for key in 0..KEYS {
        assert_eq!(
            server.get(&format!("count:{key}")),
            Some(per_key.to_string()),
            "key {key}: lost or duplicated updates"
        );
        assert_eq!(
            server.get(&format!("in_flight:{key}")).as_deref(),
            Some("0")
        );
        let fences: Vec<u64> = redis::cmd("LRANGE")
            .arg(format!("fences:{key}"))
            .arg(0)
            .arg(-1)
            .query(&mut conn)
            .expect("LRANGE");
        assert_eq!(
            fences.len(),
            per_key,
            "key {key}: one token per committed section"
        );
        if let Some(&[earlier, later]) = fences.windows(2).find(|pair| pair[0] >= pair[1]) {
            panic!(
                "key {key}: fencing token {later} committed after {earlier}: tokens must \
                 strictly increase in commit order"
            );
        }
        // Strictly increasing from 1 with as many tokens as sections: exactly 1..=n, so every
        // token ever issued for the key went to a section that committed.
        assert_eq!(fences.first(), Some(&1), "key {key}");
        assert_eq!(fences.last(), Some(&(per_key as u64)), "key {key}");
    }
    assert_eq!(
        server.keys("lock:*"),
        Vec::<String>::new(),
        "every lock was released"
    );
}
