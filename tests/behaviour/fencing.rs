//! Fencing tokens: every acquisition of a key with `fencing(true)` gets a number greater than
//! that of every earlier acquisition of the key, by any client, so storage can reject the late
//! write of a holder whose lock expired.

use std::time::Duration;

use distlock::{LockError, LockManager, LockOptions};
use test_support::{keys, spawn_worker, wait_all, RedisServer};

const WORKER_ENV: &str = "DISTLOCK_FENCING_WORKER";
const WORKER_TASKS: usize = 8;
const WORKER_SECTIONS: usize = 10;
const WORKERS: usize = 2;

async fn connect(url: &str) -> LockManager {
    LockManager::connect(url)
        .await
        .unwrap_or_else(|error| panic!("cannot connect a lock manager: {error}"))
}

#[tokio::test]
async fn tokens_strictly_increase_and_exist_only_with_fencing() {
    let server = RedisServer::start();
    let manager = connect(&server.url()).await;
    let fenced = LockOptions::new().fencing(true);

    let mut previous = None;
    for _ in 0..20 {
        let guard = manager.acquire("fence:seq", &fenced).await.expect("free");
        let token = guard.fencing_token().expect("fencing(true) issues a token");
        if let Some(previous) = previous {
            assert!(token > previous, "token {token} after {previous}");
        }
        previous = Some(token);
        guard.release().await.expect("still ours");
    }
    // The counter outlives every holder: it is what makes the next token bigger.
    assert_eq!(
        server.get(&keys::named("fence:seq").fence()),
        previous.map(|token| token.to_string())
    );
    assert_eq!(server.pttl(&keys::named("fence:seq").fence()), -1);

    let guard = manager
        .acquire("fence:seq", &LockOptions::new())
        .await
        .expect("free");
    assert_eq!(guard.fencing_token(), None, "no token without fencing");
    guard.release().await.expect("still ours");
    let guard = manager.acquire("fence:seq", &fenced).await.expect("free");
    assert!(
        guard.fencing_token() > previous,
        "an acquisition without fencing does not reset the counter"
    );
    guard.release().await.expect("still ours");
}

/// One worker process: `WORKER_TASKS` tasks, each taking the lock `WORKER_SECTIONS` times and
/// appending its fencing token to a Redis list while it holds the lock. Started
/// by `tokens_increase_in_lock_order_across_processes`.
pub(crate) fn fencing_worker() {
    let url = std::env::var(WORKER_ENV).expect("set by the test that starts this worker");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let manager = connect(&url).await;
        let client = redis::Client::open(url.as_str()).expect("url");
        let options = LockOptions::new()
            .fencing(true)
            .ttl(Duration::from_secs(10))
            .timeout(Duration::from_secs(60));
        let mut tasks = Vec::new();
        for _ in 0..WORKER_TASKS {
            let (manager, options) = (manager.clone(), options.clone());
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .expect("list connection");
            tasks.push(tokio::spawn(async move {
                for _ in 0..WORKER_SECTIONS {
                    let guard = manager
                        .acquire("fence:mp", &options)
                        .await
                        .expect("acquire");
                    let token = guard.fencing_token().expect("fencing(true)");
                    redis::cmd("RPUSH")
                        .arg("fence:mp:log")
                        .arg(token)
                        .query_async::<()>(&mut conn)
                        .await
                        .expect("RPUSH");
                    guard.release().await.expect("release");
                }
            }));
        }
        for task in tasks {
            task.await.expect("worker task panicked");
        }
    });
}

#[test]
fn tokens_increase_in_lock_order_across_processes() {
    let server = RedisServer::start();
    let workers = (0..WORKERS)
        .map(|_| spawn_worker("fencing::fencing_worker", &[(WORKER_ENV, server.url())]))
        .collect();
    for status in wait_all(workers, Duration::from_secs(120)) {
        assert!(status.success(), "a worker failed: {status}");
    }

    let mut conn = server.conn();
    let log: Vec<u64> = redis::cmd("LRANGE")
        .arg("fence:mp:log")
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .expect("LRANGE");
    assert_eq!(log.len(), WORKERS * WORKER_TASKS * WORKER_SECTIONS);
    for (i, pair) in log.windows(2).enumerate() {
        assert!(
            pair[0] < pair[1],
            "entry {} ({}) is not below entry {} ({}): {log:?}",
            i,
            pair[0],
            i + 1,
            pair[1]
        );
    }
    assert!(!server.exists("lock:fence:mp"));
}

/// Storage that accepts a write only with a fencing token above every token it has seen (the
/// check the README asks of the protected resource), atomically, in one script.
async fn store_write(
    conn: &mut redis::aio::MultiplexedConnection,
    token: u64,
    value: &str,
) -> bool {
    let script = redis::Script::new(
        r"
local seen = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) <= seen then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
return 1
",
    );
    let accepted: i64 = script
        .key("storage:max-token")
        .key("storage:value")
        .arg(token)
        .arg(value)
        .invoke_async(conn)
        .await
        .expect("storage script");
    accepted == 1
}

#[tokio::test]
async fn a_stale_holder_write_is_rejected_by_its_smaller_token() {
    let server = RedisServer::start();
    let a = connect(&server.url()).await;
    let b = connect(&server.url()).await;
    let mut storage = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("storage connection");

    let stale = a
        .acquire(
            "fence:stale",
            &LockOptions::new()
                .fencing(true)
                .ttl(Duration::from_millis(300)),
        )
        .await
        .expect("free");
    let stale_token = stale.fencing_token().expect("fencing(true)");
    // A stalls (a GC pause, a swapped-out VM) past its ttl ...
    tokio::time::sleep(Duration::from_millis(600)).await;

    // ... and B, in another process, gets the lock and writes.
    let fresh = b
        .acquire(
            "fence:stale",
            &LockOptions::new()
                .fencing(true)
                .timeout(Duration::from_secs(5)),
        )
        .await
        .expect("A's lock expired, so B gets it");
    let fresh_token = fresh.fencing_token().expect("fencing(true)");
    assert!(fresh_token > stale_token);
    assert!(store_write(&mut storage, fresh_token, "written by B").await);

    // A wakes up and writes with its old token: the storage refuses.
    assert!(
        !store_write(&mut storage, stale_token, "written by A").await,
        "the stale holder's write was accepted"
    );
    assert_eq!(server.get("storage:value").as_deref(), Some("written by B"));
    assert!(matches!(stale.release().await, Err(LockError::Lost { .. })));
    fresh.release().await.expect("B still holds it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_counter_fails_the_acquire_with_advice_and_leaves_nothing_held() {
    let server = RedisServer::start();
    let manager = connect(&server.url()).await;
    let fenced = LockOptions::new()
        .fencing(true)
        .timeout(Duration::from_secs(5));
    // Something other than distlock wrote the counter: the next INCR would give a token that
    // is not greater than every earlier one (-4, or 0).
    for corrupt in ["-5", "-1"] {
        let counter = &keys::named("fence:negative").fence();
        server.set(counter, corrupt);
        let started = tokio::time::Instant::now();
        let tried = manager
            .try_acquire("fence:negative", &fenced)
            .await
            .map(drop);
        let waited = manager.acquire("fence:negative", &fenced).await.map(drop);
        let took = started.elapsed();
        for (what, result) in [("try_acquire", tried), ("acquire", waited)] {
            let error = result.expect_err(what);
            let message = error.to_string();
            eprintln!("counter {corrupt}, {what}: {message}");
            assert!(matches!(error, LockError::Redis(_)), "{what}: {error:?}");
            assert!(
                message.contains(counter),
                "{what} names the counter: {message}"
            );
            assert!(
                message.contains("delete") && message.contains(corrupt),
                "{what} says what is wrong and what to do: {message}"
            );
        }
        assert!(
            took < Duration::from_secs(3),
            "reported at once, not at the 5 s deadline: {took:?}"
        );
        assert!(
            !server.exists("lock:fence:negative"),
            "a failed acquisition left the lock held"
        );
        assert_eq!(
            server.get(counter).as_deref(),
            Some(corrupt),
            "the counter is left as it was found, for someone to look at"
        );
    }

    // Once the counter is deleted, tokens start again at 1.
    server.del(&keys::named("fence:negative").fence());
    let guard = manager
        .acquire("fence:negative", &fenced)
        .await
        .expect("a deleted counter starts over");
    assert_eq!(guard.fencing_token(), Some(1));
    guard.release().await.unwrap();
}
