//! The manual API (`LockManager`, `LockGuard`, `LockOptions`) against a real Redis. Each test
//! starts its own redis-server and its own managers, so command counts and key listings see
//! only that test.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use distlock::{LockError, LockGuard, LockManager, LockOptions};
use test_support::{connect, eventually, FaultProxy, RedisServer};

fn ttl(millis: u64) -> LockOptions {
    LockOptions::new().ttl(Duration::from_millis(millis))
}

/// Calls to the lock scripts that reached the server (`EVALSHA`, or `EVAL` when not cached).
fn script_calls(server: &RedisServer) -> u64 {
    server.command_count("evalsha") + server.command_count("eval")
}

#[tokio::test]
async fn try_acquire_is_none_while_held_and_some_after_release() {
    let server = RedisServer::start();
    let first = connect(&server).await;
    let second = connect(&server).await;
    let options = LockOptions::new();

    let guard = first
        .try_acquire("busy", &options)
        .await
        .unwrap()
        .expect("a free lock is taken at once");
    assert_eq!(guard.key(), "lock:busy");
    assert_eq!(server.get("lock:busy").as_deref(), Some(guard.token()));

    assert!(
        second
            .try_acquire("busy", &options)
            .await
            .unwrap()
            .is_none(),
        "another manager must not get a held lock"
    );
    assert!(
        first.try_acquire("busy", &options).await.unwrap().is_none(),
        "the same manager must not get a lock it holds"
    );
    assert_eq!(
        server.get("lock:busy").as_deref(),
        Some(guard.token()),
        "failed attempts must leave the holder's lock alone"
    );

    guard.release().await.unwrap();
    assert!(!server.exists("lock:busy"));

    let again = second
        .try_acquire("busy", &options)
        .await
        .unwrap()
        .expect("free again after the release");
    again.release().await.unwrap();
    let same = first
        .try_acquire("busy", &options)
        .await
        .unwrap()
        .expect("the first manager can take it again too");
    same.release().await.unwrap();
}

#[tokio::test]
async fn release_is_lost_when_someone_else_took_the_lock() {
    let server = RedisServer::start();
    let old_manager = connect(&server).await;
    let new_manager = connect(&server).await;

    let old = old_manager.acquire("taken", &ttl(200)).await.unwrap();
    eventually(Duration::from_secs(5), "the 200 ms lock to expire", || {
        !server.exists("lock:taken")
    })
    .await;
    let new = new_manager.acquire("taken", &ttl(30_000)).await.unwrap();
    assert_ne!(old.token(), new.token());

    match old.release().await {
        Err(LockError::Lost { key, .. }) => assert_eq!(key, "lock:taken"),
        other => panic!("expected Err(Lost), got {other:?}"),
    }
    assert_eq!(
        server.get("lock:taken").as_deref(),
        Some(new.token()),
        "the stale release must not delete the new owner's lock"
    );
    assert!(server.pttl("lock:taken") > 20_000, "nor touch its ttl");
    new.release().await.unwrap();
    assert!(!server.exists("lock:taken"));
}

#[tokio::test]
async fn extend_is_lost_after_expiry_and_is_held_follows_redis() {
    let server = RedisServer::start();
    let manager = connect(&server).await;

    let guard = manager.acquire("expiring", &ttl(1_000)).await.unwrap();
    assert!(guard.is_held().await.unwrap(), "held right after acquire");
    guard.extend(Duration::from_secs(3)).await.unwrap();
    let pttl = server.pttl("lock:expiring");
    assert!(
        pttl > 1_000 && pttl <= 3_000,
        "pttl {pttl} after extend(3 s) of a 1 s lock"
    );

    eventually(Duration::from_secs(10), "the lock to expire", || {
        !server.exists("lock:expiring")
    })
    .await;
    assert!(!guard.is_held().await.unwrap(), "not held after expiry");
    match guard.extend(Duration::from_secs(30)).await {
        Err(LockError::Lost { key, .. }) => assert_eq!(key, "lock:expiring"),
        other => panic!("expected Err(Lost), got {other:?}"),
    }
    assert!(guard.is_lost());
    assert!(
        !server.exists("lock:expiring"),
        "a failed extend must not recreate the key"
    );

    // Someone else's lock on the same key is not ours either, and not extended.
    let other = connect(&server).await;
    let theirs = other.acquire("expiring", &ttl(5_000)).await.unwrap();
    assert!(!guard.is_held().await.unwrap());
    assert!(matches!(
        guard.extend(Duration::from_secs(60)).await,
        Err(LockError::Lost { .. })
    ));
    assert!(
        server.pttl("lock:expiring") <= 5_000,
        "their ttl is untouched"
    );
    assert!(theirs.is_held().await.unwrap());
    theirs.release().await.unwrap();
}

#[tokio::test]
async fn default_options_are_30s_ttl_and_10s_timeout() {
    let server = RedisServer::start();
    let manager = connect(&server).await;
    let other = connect(&server).await;

    let defaults = LockOptions::default();
    assert_eq!(defaults, LockOptions::new());
    assert_eq!(defaults.ttl_duration(), Duration::from_secs(30));
    assert_eq!(defaults.timeout_duration(), Duration::from_secs(10));
    assert!(!defaults.auto_extend_enabled());
    assert!(!defaults.fencing_enabled());

    let guard = manager.acquire("defaults", &defaults).await.unwrap();
    let pttl = server.pttl("lock:defaults");
    assert!(
        pttl > 25_000 && pttl <= 30_000,
        "pttl {pttl} of a default acquisition (≈30000 ms)"
    );
    assert_eq!(guard.fencing_token(), None, "no fencing by default");

    // The default timeout: another client waits ~10 s, then gives up.
    let started = Instant::now();
    let result = other.acquire("defaults", &defaults).await;
    let elapsed = started.elapsed();
    match result {
        Err(LockError::Timeout { key, waited }) => {
            assert_eq!(key, "lock:defaults");
            assert!(
                waited >= Duration::from_millis(9_900),
                "gave up after {waited:?}, before the 10 s default timeout"
            );
        }
        other => panic!("expected Err(Timeout), got {other:?}"),
    }
    assert!(
        elapsed < Duration::from_secs(20),
        "the 10 s default timeout took {elapsed:?}"
    );
    guard.release().await.unwrap();
}

#[tokio::test]
async fn awkward_names_are_stored_exactly() {
    let server = RedisServer::start();
    let manager = connect(&server).await;
    let long = "x".repeat(10 * 1024);
    let names: [&str; 8] = [
        "🔒-ключ-鍵",
        "line one\nline two",
        "\"double\" 'single' `back`",
        "  spaces  around and inside  ",
        "glob*chars?[x]",
        "\\back\\slash",
        &long,
        "",
    ];
    for name in names {
        let full = format!("lock:{name}");
        let guard = manager
            .acquire(name, &LockOptions::new())
            .await
            .unwrap_or_else(|error| panic!("acquire {name:?}: {error}"));
        assert_eq!(guard.key(), full);
        assert!(server.exists(&full), "{full:?} must exist byte for byte");
        assert_eq!(server.get(&full).as_deref(), Some(guard.token()));
        guard.release().await.unwrap();
        assert!(!server.exists(&full), "{full:?} must be gone after release");
    }
    assert!(
        server.keys("*").is_empty(),
        "nothing else is left: {:?}",
        server.keys("*")
    );
}

#[tokio::test]
async fn key_prefix_replaces_the_default() {
    let server = RedisServer::start();
    let manager = LockManager::builder(server.url())
        .key_prefix("app:")
        .connect()
        .await
        .unwrap();
    assert_eq!(manager.key_prefix(), "app:");
    let guard = manager.acquire("name", &LockOptions::new()).await.unwrap();
    assert_eq!(guard.key(), "app:name");
    assert_eq!(server.get("app:name").as_deref(), Some(guard.token()));
    assert!(!server.exists("lock:name"));

    // A default manager's lock of the same name is a different key.
    let default = connect(&server).await;
    let other = default
        .try_acquire("name", &LockOptions::new())
        .await
        .unwrap()
        .expect("lock:name is free");
    assert_eq!(other.key(), "lock:name");
    other.release().await.unwrap();
    guard.release().await.unwrap();
    assert!(!server.exists("app:name"));
}

#[tokio::test]
async fn out_of_range_options_are_config_errors_and_touch_nothing() {
    let server = RedisServer::start();
    let manager = connect(&server).await;
    server.reset_stats();

    let bad = [
        ("zero ttl", LockOptions::new().ttl(Duration::ZERO)),
        (
            "sub-ms ttl",
            LockOptions::new().ttl(Duration::from_micros(999)),
        ),
        ("Duration::MAX ttl", LockOptions::new().ttl(Duration::MAX)),
        (
            "Duration::MAX timeout",
            LockOptions::new().timeout(Duration::MAX),
        ),
    ];
    for (what, options) in &bad {
        match manager.acquire("config", options).await {
            Err(LockError::Config(message)) => assert!(!message.is_empty()),
            other => panic!("acquire with {what}: expected Err(Config), got {other:?}"),
        }
        // try_acquire does not wait, but a ttl out of range is still an error.
        if !what.contains("timeout") {
            match manager.try_acquire("config", options).await {
                Err(LockError::Config(_)) => {}
                other => panic!("try_acquire with {what}: expected Err(Config), got {other:?}"),
            }
        }
    }

    let guard = manager
        .acquire("config-extend", &LockOptions::new())
        .await
        .unwrap();
    let calls_before = script_calls(&server);
    for bad_ttl in [Duration::ZERO, Duration::from_micros(999), Duration::MAX] {
        match guard.extend(bad_ttl).await {
            Err(LockError::Config(_)) => {}
            other => panic!("extend({bad_ttl:?}): expected Err(Config), got {other:?}"),
        }
    }
    assert_eq!(
        script_calls(&server),
        calls_before,
        "a rejected extend must not reach Redis"
    );
    let pttl = server.pttl("lock:config-extend");
    assert!(pttl > 20_000, "the lock's ttl is untouched: {pttl}");
    guard.release().await.unwrap();

    assert!(!server.exists("lock:config"), "no key was created");
    assert_eq!(
        server.keys("*"),
        Vec::<String>::new(),
        "no key of any kind was created"
    );
}

#[tokio::test]
async fn out_of_range_options_send_no_command() {
    let server = RedisServer::start();
    let manager = connect(&server).await;
    server.reset_stats();
    for options in [
        LockOptions::new().ttl(Duration::ZERO),
        LockOptions::new().ttl(Duration::MAX),
        LockOptions::new().timeout(Duration::MAX),
    ] {
        assert!(matches!(
            manager.acquire("untouched", &options).await,
            Err(LockError::Config(_))
        ));
    }
    assert_eq!(script_calls(&server), 0, "no lock script ran");
    assert_eq!(server.command_count("set"), 0);
    assert!(!server.exists("lock:untouched"));
}

#[tokio::test]
async fn zero_timeout_is_a_single_attempt() {
    let server = RedisServer::start();
    let holder = connect(&server).await;
    let other = connect(&server).await;
    let once = LockOptions::new().timeout(Duration::ZERO);

    // Free: the single attempt succeeds.
    let guard = holder.acquire("once", &once).await.unwrap();

    // Held: another manager gives up at once.
    let started = Instant::now();
    match other.acquire("once", &once).await {
        Err(LockError::Timeout { key, .. }) => assert_eq!(key, "lock:once"),
        result => panic!("expected Err(Timeout), got {result:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "timeout 0 took {:?}",
        started.elapsed()
    );

    // Held by this very manager: same.
    let started = Instant::now();
    assert!(matches!(
        holder.acquire("once", &once).await,
        Err(LockError::Timeout { .. })
    ));
    assert!(started.elapsed() < Duration::from_secs(2));

    assert_eq!(server.get("lock:once").as_deref(), Some(guard.token()));
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_waiter_gets_the_lock_soon_after_release() {
    let server = RedisServer::start();
    let holder = connect(&server).await;
    let waiter_manager = connect(&server).await;
    let guard = holder.acquire("handoff", &ttl(30_000)).await.unwrap();

    let waiter = tokio::spawn(async move {
        let guard = waiter_manager
            .acquire(
                "handoff",
                &LockOptions::new()
                    .ttl(Duration::from_secs(30))
                    .timeout(Duration::from_secs(10)),
            )
            .await;
        (guard, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter must wait while the lock is held"
    );

    let released_at = Instant::now();
    guard.release().await.unwrap();
    let (acquired, acquired_at) = waiter.await.unwrap();
    let acquired: LockGuard = acquired.expect("the waiter gets the lock after the release");
    let handoff = acquired_at.saturating_duration_since(released_at);
    assert!(
        handoff < Duration::from_secs(2),
        "the waiter took {handoff:?} after the release (the holder's ttl was 30 s)"
    );
    assert_eq!(
        server.get("lock:handoff").as_deref(),
        Some(acquired.token())
    );
    acquired.release().await.unwrap();
}

#[tokio::test]
async fn a_local_waiter_gets_the_lock_soon_after_release() {
    // Same as above with both tasks on one manager (the in-process queue hands over).
    let server = RedisServer::start();
    let manager = connect(&server).await;
    let guard = manager
        .acquire("local-handoff", &ttl(30_000))
        .await
        .unwrap();
    let waiter_manager = manager.clone();
    let waiter = tokio::spawn(async move {
        let guard = waiter_manager
            .acquire(
                "local-handoff",
                &LockOptions::new().timeout(Duration::from_secs(10)),
            )
            .await;
        (guard, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter must wait while the lock is held"
    );
    let released_at = Instant::now();
    guard.release().await.unwrap();
    let (acquired, acquired_at) = waiter.await.unwrap();
    let acquired = acquired.expect("the waiter gets the lock after the release");
    assert!(acquired_at.saturating_duration_since(released_at) < Duration::from_secs(2));
    acquired.release().await.unwrap();
}

/// Polls `future` until it has returned `Pending` `polls` times, then drops it at that await
/// point (at its next wake-up): a cancellation at an exact point of its progress.
async fn poll_at_most<F: Future>(polls: usize, future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    let mut left = polls;
    poll_fn(|cx| {
        if left == 0 {
            return Poll::Ready(None);
        }
        left -= 1;
        future.as_mut().poll(cx).map(Some)
    })
    .await
}

#[tokio::test]
async fn cancelled_acquires_leave_no_lock_behind() {
    let server = RedisServer::start();
    let manager = connect(&server).await;
    // Warm up: this runtime's connection exists and the scripts are cached in Redis, so from
    // here on every script call is one acquire or one release.
    manager
        .acquire("warm-up", &LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    server.reset_stats();

    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let (mut acquired, mut cancelled) = (0u64, 0u64);
    let mut outcome = |name: &str, result: Option<Result<LockGuard, LockError>>| match result {
        Some(Ok(guard)) => {
            acquired += 1;
            Some(guard)
        }
        Some(Err(error)) => panic!("acquire {name}: {error}"),
        None => {
            cancelled += 1;
            None
        }
    };
    // Timeouts of 0..300 µs, as a caller's `tokio::time::timeout` would cancel.
    for i in 0..200u64 {
        let budget = Duration::from_micros((i * 37) % 300);
        let name = format!("cancel:{i}");
        let result = tokio::time::timeout(budget, manager.acquire(&name, &options)).await;
        if let Some(guard) = outcome(&name, result.ok()) {
            guard.release().await.unwrap();
        }
    }
    // Cancellation at each of the first await points in turn (a timer cannot hit them
    // reliably: a round trip to a local Redis is shorter than tokio's 1 ms timer tick).
    for i in 0..60usize {
        let name = format!("cancel:polls:{i}");
        let result = poll_at_most(1 + i % 6, manager.acquire(&name, &options)).await;
        if let Some(guard) = outcome(&name, result) {
            guard.release().await.unwrap();
        }
    }
    assert!(
        cancelled > 0,
        "no acquire was cancelled: the test tested nothing"
    );

    tokio::time::sleep(Duration::from_secs(1)).await;
    eventually(
        Duration::from_secs(5),
        "no lock:cancel* key left (their ttl is 30 s)",
        || server.keys("lock:cancel*").is_empty(),
    )
    .await;
    // Each acquisition that reached Redis ran one `SET NX PX` (the first try of a free lock)
    // and then one release script (explicit, or the clean-up of a cancelled acquire that Redis
    // granted anyway).
    let (sets, releases) = (server.command_count("set"), script_calls(&server));
    assert_eq!(
        sets, releases,
        "every granted lock was released once: {sets} SETs, {releases} release scripts"
    );
    let granted_after_cancel = releases.saturating_sub(acquired);
    eprintln!(
        "260 acquires: {acquired} completed, {cancelled} cancelled, of which \
         {granted_after_cancel} were granted by Redis after the caller gave up, then cleaned up"
    );
    assert!(
        granted_after_cancel > 0,
        "no acquire was cancelled while its command was in flight: the test tested nothing"
    );
}

#[tokio::test]
async fn acquires_cancelled_while_in_flight_are_cleaned_up() {
    // Through a proxy that adds 5 ms each way, a budget under the 10 ms round trip cancels the
    // acquire after its command was sent: Redis grants the lock to a caller that is gone.
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let manager = LockManager::connect(&proxy.url()).await.unwrap();
    manager
        .acquire("warm-up", &LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.set_delay(Duration::from_millis(5));
    server.reset_stats();

    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let mut acquired = 0u64;
    for i in 0..40u64 {
        let budget = Duration::from_millis(1 + i % 8);
        match tokio::time::timeout(budget, manager.acquire(&format!("inflight:{i}"), &options))
            .await
        {
            Ok(Ok(guard)) => {
                acquired += 1;
                guard.release().await.unwrap();
            }
            Ok(Err(error)) => panic!("acquire inflight:{i}: {error}"),
            Err(_) => {}
        }
    }
    eventually(
        Duration::from_secs(5),
        "every lock granted to a cancelled acquire to be released (ttl 30 s)",
        || server.keys("lock:inflight*").is_empty(),
    )
    .await;
    let calls = script_calls(&server);
    let granted_after_cancel = calls.saturating_sub(2 * acquired) / 2;
    assert!(
        granted_after_cancel > 0,
        "no acquire was cancelled in flight ({calls} script calls, {acquired} completed): \
         the test tested nothing"
    );
}

#[tokio::test]
async fn passwords_never_appear_in_errors_or_debug_output() {
    // A server without a password: the user `user` does not exist, so AUTH fails.
    let server = RedisServer::start();
    let url = format!("redis://user:secret@127.0.0.1:{}", server.port());

    let builder = LockManager::builder(url.as_str());
    let debug = format!("{builder:?}");
    assert!(
        !debug.contains("secret"),
        "builder Debug leaks the password: {debug}"
    );

    let error = builder
        .connect()
        .await
        .expect_err("AUTH as a user that does not exist must fail");
    assert!(matches!(error, LockError::Redis(_)), "{error:?}");
    for text in [error.to_string(), format!("{error:?}")] {
        assert!(
            !text.contains("secret"),
            "the error leaks the password: {text}"
        );
    }

    // A malformed URL with a password: the Config message quotes it, redacted.
    let error = LockManager::connect("redis://user:secret@127.0.0.1:notaport")
        .await
        .expect_err("a bad port is a config error");
    assert!(matches!(error, LockError::Config(_)), "{error:?}");
    for text in [error.to_string(), format!("{error:?}")] {
        assert!(
            !text.contains("secret"),
            "the error leaks the password: {text}"
        );
    }

    // A server that requires the password: the manager and its guards never show it.
    let protected = RedisServer::start_with(&["--requirepass", "hunter2-secret"]);
    let manager = LockManager::connect(&format!(
        "redis://:hunter2-secret@127.0.0.1:{}",
        protected.port()
    ))
    .await
    .expect("the right password connects");
    let guard = manager.acquire("pw", &LockOptions::new()).await.unwrap();
    for text in [
        format!("{manager:?}"),
        format!("{guard:?}"),
        format!("{guard:#?}"),
    ] {
        assert!(
            !text.contains("hunter2"),
            "Debug leaks the password: {text}"
        );
    }
    assert!(
        format!("{guard:?}").contains("lock:pw"),
        "Debug shows the key"
    );
    guard.release().await.unwrap();
}
