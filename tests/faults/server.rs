//! The Redis server itself fails.
//!
//! - **Restart** (no persistence, same port, `RedisServer::restart`): clients reconnect by
//!   themselves and go on; and the hazard, asserted as it is: a restart forgets every held lock
//!   (and every fencing counter), so a second holder can get in while the first still works.
//!   `auto_extend` turns that into a `Lost` for the first holder within its ttl; fencing does not
//!   help across such a restart, because its counter starts again at 1.
//! - **Pause** (SIGSTOP past the response timeout): `try_acquire`, `acquire`, `extend`,
//!   `is_held`, `release` and `connect` all return `LockError::Redis` within their bounds, no hang,
//!   no panic; an `auto_extend` holder is told `Lost`; after SIGCONT everything works again.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{LockError, LockGuard, LockManager, LockOptions};
use redis::aio::ConnectionManager;
use redis::AsyncCommands;
use test_support::RedisServer;
use tokio::time::Instant;

/// A data connection that reconnects by itself, like the lock manager's.
async fn data_connection(server: &RedisServer) -> ConnectionManager {
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(1)))
        .set_number_of_retries(1);
    ConnectionManager::new_with_config(server.client(), config)
        .await
        .expect("data connection")
}

/// A non-atomic read-modify-write of `counter` under the lock `name`.
async fn section(
    manager: &LockManager,
    data: &mut ConnectionManager,
    name: &str,
    counter: &str,
) -> Result<(), LockError> {
    let options = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .timeout(Duration::from_secs(2));
    let guard = manager.acquire(name, &options).await?;
    let value: Option<i64> = data.get(counter).await?;
    tokio::task::yield_now().await;
    let () = data.set(counter, value.unwrap_or(0) + 1).await?;
    guard.release().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_clients_reconnect_by_themselves_and_continue() {
    let server = Arc::new(RedisServer::start());
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let data = data_connection(&server).await;

    // Four tasks run sections back to back while the server is restarted under them.
    let stop = Arc::new(AtomicBool::new(false));
    let successes: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let errors = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (manager, mut data) = (manager.clone(), data.clone());
            let (stop, successes, errors) = (stop.clone(), successes.clone(), errors.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match section(&manager, &mut data, "during", "during").await {
                        Ok(()) => successes.lock().unwrap().push(Instant::now()),
                        // Redis is down, or the lock was forgotten by the restart while held.
                        Err(
                            LockError::Redis(_)
                            | LockError::Timeout { .. }
                            | LockError::Lost { .. },
                        ) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        Err(other) => panic!("unexpected error while Redis restarts: {other:?}"),
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !successes.lock().unwrap().is_empty(),
        "sections ran before the restart"
    );

    let restart_server = server.clone();
    let restart_began = Instant::now();
    tokio::task::spawn_blocking(move || restart_server.restart())
        .await
        .unwrap();
    let restarted = Instant::now();
    let deadline = restarted + Duration::from_secs(5);
    let first_after = loop {
        let first = successes
            .lock()
            .unwrap()
            .iter()
            .copied()
            .find(|at| *at > restarted);
        if let Some(first) = first {
            break first;
        }
        assert!(
            Instant::now() < deadline,
            "no section succeeded within 5 s of the restart"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("a section task panicked");
    }
    eprintln!(
        "restart took {:?}; first section after it succeeded {:?} later; {} sections, {} failed attempts around it",
        restarted - restart_began,
        first_after - restarted,
        successes.lock().unwrap().len(),
        errors.load(Ordering::Relaxed)
    );

    // A run of sections on the restarted server: exact count.
    let started = Instant::now();
    let run: Vec<_> = (0..8)
        .map(|_| {
            let (manager, mut data) = (manager.clone(), data.clone());
            tokio::spawn(async move {
                for _ in 0..10 {
                    section(&manager, &mut data, "after", "after")
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in run {
        task.await.expect("a section after the restart failed");
    }
    eprintln!("80 sections after the restart in {:?}", started.elapsed());
    assert_eq!(server.get("after").as_deref(), Some("80"));
    assert_eq!(server.keys("lock:*"), Vec::<String>::new());
}

/// A server restarted while a client held `lock:job` (fencing token 3, ttl 30 s) and
/// `lock:watched` (auto-extended, ttl 1.5 s).
struct Restarted {
    server: Arc<RedisServer>,
    holder: LockGuard,
    watched: LockGuard,
    /// When the restart finished.
    at: Instant,
}

/// Takes the locks of [`Restarted`], then restarts the server.
async fn restart_while_holding() -> Restarted {
    let server = Arc::new(RedisServer::start());
    let first_client = LockManager::connect(&server.url()).await.unwrap();
    for _ in 0..2 {
        first_client
            .acquire("job", &fenced())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let holder = first_client.acquire("job", &fenced()).await.unwrap();
    assert_eq!(holder.fencing_token(), Some(3));
    let watched_options = LockOptions::new()
        .ttl(Duration::from_millis(1500))
        .auto_extend(true);
    let watched = first_client
        .acquire("watched", &watched_options)
        .await
        .unwrap();

    let restart_server = server.clone();
    tokio::task::spawn_blocking(move || restart_server.restart())
        .await
        .unwrap();
    Restarted {
        server,
        holder,
        watched,
        at: Instant::now(),
    }
}

/// The options `lock:job` is taken with: fencing, ttl 30 s.
fn fenced() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(30))
        .fencing(true)
}

/// A second client's `try_acquire` of `lock:job`, free once the restart forgot it.
async fn take_job_after_restart(server: &RedisServer) -> LockGuard {
    let second_client = LockManager::connect(&server.url()).await.unwrap();
    second_client
        .try_acquire("job", &fenced())
        .await
        .unwrap()
        .expect("the restart forgot the held lock, so it is free")
}

/// The hazard: the restarted server has forgotten the holder's lock, so another client takes
/// it at once while the holder still believes it holds it; and the fencing counter is gone too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_forgets_held_locks_and_fencing_starts_over() {
    let restarted = restart_while_holding().await;
    let second = take_job_after_restart(&restarted.server).await;
    assert_eq!(
        second.fencing_token(),
        Some(1),
        "the fencing counter was forgotten too: tokens start over, below the old holder's 3"
    );
    second.release().await.unwrap();
    drop(restarted);
}

/// `auto_extend`: the watchdog's next extension finds the lock gone and cancels the holder,
/// within the ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_extend_notices_a_lock_a_restart_forgot() {
    let Restarted { watched, at, .. } = restart_while_holding().await;
    tokio::time::timeout(Duration::from_millis(1500 + 1000), watched.lost())
        .await
        .expect("auto_extend noticed the forgotten lock within ttl + 1 s");
    eprintln!(
        "auto_extend holder told Lost {:?} after the restart",
        at.elapsed()
    );
}

/// Without `auto_extend` the old holder learns of the restart only when it asks: `is_held`,
/// `extend`, `release`; and its release leaves the new holder's lock alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_without_auto_extend_learns_of_a_restart_when_it_asks() {
    let Restarted {
        server,
        holder,
        watched,
        ..
    } = restart_while_holding().await;
    let second = take_job_after_restart(&server).await;
    // The first request on the old client's connection after the restart meets the broken
    // connection (and the connection then reconnects): let the watchdog of its other lock make
    // that request, as it does in a running program, so that what the holder's questions show
    // is the forgotten lock.
    tokio::time::timeout(Duration::from_millis(1500 + 1000), watched.lost())
        .await
        .expect("auto_extend noticed the forgotten lock within ttl + 1 s");
    assert!(!holder.is_held().await.unwrap());
    assert!(matches!(
        holder.extend(Duration::from_secs(30)).await,
        Err(LockError::Lost { .. })
    ));
    assert!(matches!(
        holder.release().await,
        Err(LockError::Lost { .. })
    ));
    assert_eq!(
        server.get("lock:job").as_deref(),
        Some(second.token()),
        "the old holder's release left the new holder's lock alone"
    );
    second.release().await.unwrap();
    drop(watched);
}

/// Asserts `result` is a `LockError::Redis` that came within `bound`, and returns its message.
fn redis_error_within<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, LockError>,
    elapsed: Duration,
    bound: Duration,
) -> String {
    eprintln!("paused server: {what} -> {result:?} after {elapsed:?}");
    let error = match result {
        Err(error @ LockError::Redis(_)) => error,
        other => panic!("{what} on a paused server: expected LockError::Redis, got {other:?}"),
    };
    assert!(
        elapsed < bound,
        "{what} took {elapsed:?} on a paused server (bound {bound:?})"
    );
    error.to_string()
}

async fn timed<T>(future: impl std::future::Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let output = future.await;
    (output, started.elapsed())
}

/// What the calls made on a server paused past the response timeout returned, and how long each
/// took. The server is still paused: a test resumes it when its promise needs that.
struct PausedCalls {
    server: RedisServer,
    manager: LockManager,
    held_token: String,
    try_acquire: (Result<Option<LockGuard>, LockError>, Duration),
    acquire: (Result<LockGuard, LockError>, Duration),
    extend: (Result<(), LockError>, Duration),
    is_held: (Result<bool, LockError>, Duration),
    connect: (Result<LockManager, LockError>, Duration),
    lost: (Result<(), tokio::time::error::Elapsed>, Duration),
    release: (Result<(), LockError>, Duration),
    /// The `auto_extend` holder whose loss `lost` waited for.
    watched: LockGuard,
}

/// Takes `held` (ttl 30 s) and `watched` (ttl 1.5 s, `auto_extend`), pauses the server, then
/// calls everything at once while it stays paused, and releases `held`.
async fn calls_on_a_paused_server() -> PausedCalls {
    let server = RedisServer::start();
    let builder = LockManager::builder(server.url()).response_timeout(Duration::from_millis(300));
    let manager = builder.clone().connect().await.unwrap();
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let held = manager.acquire("held", &long).await.unwrap();
    let held_token = held.token().to_owned();
    let watched = manager
        .acquire(
            "watched",
            &LockOptions::new()
                .ttl(Duration::from_millis(1500))
                .auto_extend(true),
        )
        .await
        .unwrap();

    server.pause();
    let paused = Instant::now();
    let one_second = long.clone().timeout(Duration::from_secs(1));
    // Boxed: the six calls side by side would make one large future.
    let (try_acquire, acquire, extend, is_held, connect, lost) = tokio::join!(
        timed(Box::pin(manager.try_acquire("other", &long))),
        timed(Box::pin(manager.acquire("other", &one_second))),
        timed(held.extend(Duration::from_secs(30))),
        timed(held.is_held()),
        timed(builder.clone().connect()),
        timed(tokio::time::timeout(
            Duration::from_millis(2500),
            watched.lost()
        )),
    );
    let release = timed(held.release()).await;
    eprintln!("paused for {:?} in all", paused.elapsed());
    PausedCalls {
        server,
        manager,
        held_token,
        try_acquire,
        acquire,
        extend,
        is_held,
        connect,
        lost,
        release,
        watched,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_on_a_paused_server_gives_a_redis_error_within_its_bound() {
    let calls = calls_on_a_paused_server().await;
    let bound = Duration::from_secs(5);
    let (try_acquire, try_acquire_took) = calls.try_acquire;
    let message = redis_error_within("try_acquire", try_acquire, try_acquire_took, bound);
    assert!(message.contains("Redis error"), "{message}");
    let (acquire, acquire_took) = calls.acquire;
    redis_error_within("acquire (timeout 1 s)", acquire, acquire_took, bound);
    let (extend, extend_took) = calls.extend;
    redis_error_within("extend", extend, extend_took, bound);
    let (is_held, is_held_took) = calls.is_held;
    redis_error_within("is_held", is_held, is_held_took, bound);
    let (connect, connect_took) = calls.connect;
    redis_error_within("connect", connect, connect_took, Duration::from_secs(10));
    let (release, release_took) = calls.release;
    redis_error_within("release", release, release_took, bound);
    calls.server.resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_on_a_paused_server_retries_until_its_timeout() {
    let calls = calls_on_a_paused_server().await;
    let (_, acquire_took) = calls.acquire;
    assert!(
        acquire_took >= Duration::from_millis(900),
        "acquire retried until its 1 s deadline, took {acquire_took:?}"
    );
    calls.server.resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_extend_holder_is_told_lost_when_its_server_pauses() {
    let calls = calls_on_a_paused_server().await;
    let (lost, lost_took) = calls.lost;
    assert!(
        lost.is_ok(),
        "the auto_extend holder was told Lost within ttl + 1 s of the pause"
    );
    eprintln!("paused server: auto_extend holder told Lost {lost_took:?} after the pause");
    calls.server.resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_pause_locks_work_again_within_5_s_and_no_late_grant_stays() {
    let PausedCalls {
        server,
        manager,
        watched,
        ..
    } = calls_on_a_paused_server().await;
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    server.resume();
    let resumed = Instant::now();
    // The attempts that timed out were still delivered: Redis runs them when it resumes, and
    // may grant `other` to a caller that has long given up. That grant must not outlive the
    // resume (it would block `other` for its whole ttl, here 30 s).
    wait_ghost_released(&server, "lock:other").await;
    let retry = long.clone().timeout(Duration::from_secs(5));
    let guard = manager.acquire("other", &retry).await.unwrap();
    eprintln!("first acquire after SIGCONT took {:?}", resumed.elapsed());
    guard.extend(Duration::from_secs(30)).await.unwrap();
    assert!(guard.is_held().await.unwrap());
    guard.release().await.unwrap();
    drop(watched);
    assert!(
        resumed.elapsed() < Duration::from_secs(5),
        "recovered within 5 s of SIGCONT"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_failed_on_a_paused_server_never_frees_anyone_elses_lock() {
    let calls = calls_on_a_paused_server().await;
    calls.server.resume();
    // The release that failed while Redis was paused may still have run late (if Redis had its
    // script cached) or not: either the lock is gone, or it is still the old holder's until its
    // ttl runs out. Never anyone else's.
    let left = calls.server.get("lock:held");
    assert!(
        left.is_none() || left.as_deref() == Some(calls.held_token.as_str()),
        "lock:held is {left:?}"
    );
}

/// Waits (up to 3 s) until nobody holds `key`: a grant that Redis made to a request whose caller
/// had already given up is released by the caller's clean-up.
async fn wait_ghost_released(server: &RedisServer, key: &str) {
    let started = Instant::now();
    while server.exists(key) {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "`{key}` is still held {:?} after SIGCONT by a grant nobody asked for any more \
             (holder token {:?}, pttl {} ms)",
            started.elapsed(),
            server.get(key),
            server.pttl(key)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("`{key}` free {:?} after SIGCONT", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_shorter_than_the_acquire_timeout_only_delays_the_acquire() {
    let server = Arc::new(RedisServer::start());
    let manager = LockManager::builder(server.url())
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(5));
    // Warm up: with the scripts loaded, every attempt sent while Redis is stopped will run when
    // it resumes (a cold EVALSHA would just fail with NOSCRIPT).
    manager
        .acquire("warm-up", &options)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    server.pause();
    let started = Instant::now();
    let acquire = tokio::spawn({
        let manager = manager.clone();
        async move { manager.acquire("brief", &options).await }
    });
    // Several attempts time out (300 ms each) and are retried while Redis is stopped.
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.resume();
    let guard = acquire
        .await
        .unwrap()
        .expect("Redis answers again long before the 5 s timeout");
    let took = started.elapsed();
    eprintln!("acquire across a 1 s pause took {took:?}");
    assert!(took < Duration::from_secs(4), "took {took:?}");
    assert_eq!(
        server.get("lock:brief").as_deref(),
        Some(guard.token()),
        "the lock is held by the guard the caller got, not by an earlier attempt's token"
    );
    guard.release().await.unwrap();
    assert!(
        !server.exists("lock:brief"),
        "nothing left held after the release"
    );
}
