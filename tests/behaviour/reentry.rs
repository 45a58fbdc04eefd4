//! Re-entry and lock order, against a real Redis: a task that holds a lock and asks for it
//! again gets it at once, without a command, and the lock is released once, by the outermost
//! holder, while other tasks still wait for it; a thread that holds a lock through
//! `distlock::blocking` and asks for it again is refused at once; two key templates taken in
//! both orders are warned about once, and one order is not warned about.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use distlock::{distributed_lock, LockError, LockGuard, LockOptions};
use test_support::RedisServer;

use crate::traced::{self, Recorder};

// ---------------------------------------------------------------------------------------------
// What reached Redis
// ---------------------------------------------------------------------------------------------

/// Resets the command stats through `conn` (opened before, so its handshake is not counted).
fn reset_stats(conn: &mut redis::Connection) {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(conn)
        .expect("CONFIG RESETSTAT");
}

/// Every command that reached Redis since [`reset_stats`] through `conn`, but for the reset
/// itself and this `INFO`.
fn commands_since_reset(conn: &mut redis::Connection) -> BTreeMap<String, u64> {
    let mut stats = RedisServer::command_counts_on(conn);
    stats.remove("info");
    // As `config|resetstat` where subcommands are counted on their own (Redis 7), `config`
    // before.
    if stats.remove("config|resetstat").is_none() && stats.get("config") == Some(&1) {
        stats.remove("config");
    }
    stats
}

// ---------------------------------------------------------------------------------------------
// The attribute: a locked function calling another on the same key
// ---------------------------------------------------------------------------------------------

/// The inner function: the same key as [`outer`], a timeout long enough that a wait would show.
#[distributed_lock(key = "reentry:{id}", ttl = 30, timeout = 8, guard = lock)]
async fn inner(id: u32) -> Result<(String, String), LockError> {
    let _ = id;
    Ok((lock.key().to_owned(), lock.token().to_owned()))
}

/// What `outer` saw while it held the lock.
#[derive(Debug)]
struct OuterSaw {
    token: String,
    inner_token: String,
    inner_key: String,
    inner_took: Duration,
    /// The commands that reached Redis while the inner call ran.
    inner_commands: BTreeMap<String, u64>,
    /// The lock's value in Redis after the inner call returned.
    after_inner: Option<String>,
    /// Whether a task spawned inside the body got the lock before the body ended.
    spawned_got_it_early: bool,
    /// When the body ended, before the release.
    body_ended: Instant,
}

#[distributed_lock(key = "reentry:{id}", ttl = 30, timeout = 8, guard = lock)]
async fn outer(
    id: u32,
    server: &'static RedisServer,
) -> Result<(OuterSaw, tokio::task::JoinHandle<Instant>), LockError> {
    let token = lock.token().to_owned();
    let mut conn = server.conn();
    reset_stats(&mut conn);
    let started = Instant::now();
    let (inner_key, inner_token) = inner(id).await?;
    let inner_took = started.elapsed();
    let inner_commands = commands_since_reset(&mut conn);
    let after_inner = server.get(lock.key());
    // Another task (another owner) wants the same lock: it must wait for this body to end.
    let spawned = tokio::spawn(async move {
        inner(id)
            .await
            .expect("the spawned task gets the lock once it is free");
        Instant::now()
    });
    // Give the spawned task every chance to (wrongly) get in.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok((
        OuterSaw {
            token,
            inner_token,
            inner_key,
            inner_took,
            inner_commands,
            after_inner,
            spawned_got_it_early: spawned.is_finished(),
            body_ended: Instant::now(),
        },
        spawned,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_locked_function_on_the_same_key_reenters_at_once_and_releases_once() {
    // Its own process and server: it installs the global client, and counts every command.
    if !test_support::in_own_process(
        module_path!(),
        "a_nested_locked_function_on_the_same_key_reenters_at_once_and_releases_once",
    ) {
        return;
    }
    let server: &'static RedisServer = Box::leak(Box::new(RedisServer::start()));
    distlock::init(&server.url()).await.expect("init");
    // Warm-up: connects and loads the scripts, so the counts below are the calls' own.
    inner(0).await.expect("warm-up");

    let (saw, spawned) = outer(1, server).await.expect("outer runs");

    assert_eq!(saw.inner_key, "lock:reentry:1");
    assert_eq!(
        saw.inner_token, saw.token,
        "the re-entered guard shows the outer lock"
    );
    assert!(
        saw.inner_took < Duration::from_secs(2),
        "the nested call must not wait (its timeout is 8 s): it took {:?}",
        saw.inner_took
    );
    assert!(
        saw.inner_commands.is_empty(),
        "re-entry must send no command: {:?}",
        saw.inner_commands
    );
    assert_eq!(
        saw.after_inner.as_deref(),
        Some(saw.token.as_str()),
        "the inner call's end must not release the outer lock"
    );
    assert!(
        !saw.spawned_got_it_early,
        "a spawned task is another owner: it must wait for the outer body"
    );
    let spawned_got_it = tokio::time::timeout(Duration::from_secs(8), spawned)
        .await
        .expect("the spawned task gets the lock after the outer release")
        .expect("the spawned task ran");
    assert!(
        spawned_got_it > saw.body_ended,
        "the spawned task got the lock before the outer body ended"
    );
    test_support::eventually(Duration::from_secs(5), "the lock released", || {
        !server.exists("lock:reentry:1")
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// The manual API: a guard's scope
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_guards_scope_reenters_without_a_command_and_other_tasks_still_wait() {
    let server = RedisServer::start();
    let manager = test_support::connect(&server).await;
    let options = LockOptions::new().timeout(Duration::from_secs(8));
    // Warm-up: the connection and the release script.
    manager
        .acquire("scope:warm", &options)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let outer = manager.acquire("scope:1", &options).await.unwrap();
    let mut conn = server.conn();
    let (took, commands) = outer
        .scope(async {
            reset_stats(&mut conn);
            let started = Instant::now();
            let again: LockGuard = manager.acquire("scope:1", &options).await.unwrap();
            let once: LockGuard = manager
                .try_acquire("scope:1", &options)
                .await
                .unwrap()
                .expect("try_acquire re-enters too");
            let took = started.elapsed();
            assert_eq!(again.key(), outer.key());
            assert_eq!(again.token(), outer.token());
            assert_eq!(once.token(), outer.token());
            again.release().await.expect("a re-entered release is fine");
            drop(once);
            let commands = commands_since_reset(&mut conn);
            // A task spawned in the scope is another owner: it waits, and here times out.
            let spawned = {
                let (manager, options) = (manager.clone(), options.clone());
                tokio::spawn(async move {
                    manager
                        .acquire("scope:1", &options.timeout(Duration::from_millis(300)))
                        .await
                })
            };
            assert!(matches!(
                spawned.await.unwrap(),
                Err(LockError::Timeout { .. })
            ));
            (took, commands)
        })
        .await;
    assert!(took < Duration::from_secs(2), "re-entry took {took:?}");
    assert!(commands.is_empty(), "re-entry sent {commands:?}");
    assert_eq!(
        server.get("lock:scope:1").as_deref(),
        Some(outer.token()),
        "the re-entered guards' release and drop leave the lock held"
    );
    // Outside the scope, the same task waits like anyone else.
    assert!(manager
        .try_acquire("scope:1", &options)
        .await
        .unwrap()
        .is_none());
    outer.release().await.unwrap();
    assert!(
        !server.exists("lock:scope:1"),
        "released once, by the outer guard"
    );
}

#[tokio::test]
async fn a_scope_does_not_reenter_another_lock_or_another_manager() {
    let server = RedisServer::start();
    let manager = test_support::connect(&server).await;
    let other = test_support::connect(&server).await;
    let options = LockOptions::new().timeout(Duration::from_millis(300));
    let outer = manager.acquire("scope:2", &options).await.unwrap();
    outer
        .scope(async {
            // Another name is a lock of its own: taken with its own token.
            let second = manager.acquire("scope:3", &options).await.unwrap();
            assert_ne!(second.token(), outer.token());
            second.release().await.unwrap();
            // Another manager is another holder, even on the same server.
            assert!(other
                .try_acquire("scope:2", &options)
                .await
                .unwrap()
                .is_none());
        })
        .await;
    outer.release().await.unwrap();
}

#[tokio::test]
async fn a_scope_whose_lock_expired_does_not_reenter_a_lock_it_no_longer_has() {
    let server = RedisServer::start();
    let manager = test_support::connect(&server).await;
    let other = test_support::connect(&server).await;
    let short = LockOptions::new()
        .ttl(Duration::from_millis(300))
        .timeout(Duration::from_millis(300));
    let outer = manager.acquire("scope:expired", &short).await.unwrap();
    outer
        .scope(async {
            // The hold outlives its ttl (no auto-extension), and another client takes the lock.
            tokio::time::sleep(Duration::from_millis(600)).await;
            let theirs = other
                .try_acquire("scope:expired", &short)
                .await
                .unwrap()
                .expect("the expired lock is free for another client");
            let again = manager.acquire("scope:expired", &short).await;
            assert!(
                matches!(again, Err(LockError::Lost { .. })),
                "re-entry of an expired lock now held by another client: {again:?}"
            );
            let once = manager.try_acquire("scope:expired", &short).await;
            assert!(
                matches!(once, Err(LockError::Lost { .. })),
                "try_acquire re-entered an expired lock: {once:?}"
            );
            theirs.release().await.unwrap();
        })
        .await;
    assert!(matches!(outer.release().await, Err(LockError::Lost { .. })));
}

#[tokio::test]
async fn a_scope_whose_lock_expired_unclaimed_does_not_reenter_it_either() {
    let server = RedisServer::start();
    let manager = test_support::connect(&server).await;
    let short = LockOptions::new()
        .ttl(Duration::from_millis(300))
        .timeout(Duration::from_millis(300));
    let outer = manager.acquire("scope:lapsed", &short).await.unwrap();
    outer
        .scope(async {
            tokio::time::sleep(Duration::from_millis(600)).await;
            assert!(!server.exists("lock:scope:lapsed"));
            // Nobody holds it: a re-entered guard would show a lock that is in no one's hands.
            let again = manager.acquire("scope:lapsed", &short).await;
            assert!(
                matches!(again, Err(LockError::Lost { .. })),
                "re-entry of a lapsed lock: {again:?}"
            );
        })
        .await;
    assert!(outer.is_lost(), "the re-entry's finding is the guard's too");
}

#[tokio::test]
async fn a_reentered_guard_kept_past_its_outer_release_tells_the_truth() {
    let server = RedisServer::start();
    let manager = test_support::connect(&server).await;
    let other = test_support::connect(&server).await;
    let options = LockOptions::new().timeout(Duration::from_millis(300));
    let outer = manager.acquire("scope:kept", &options).await.unwrap();
    let kept: LockGuard = outer
        .scope(async { manager.acquire("scope:kept", &options).await.unwrap() })
        .await;
    assert!(kept.is_held().await.unwrap());
    outer.release().await.unwrap();
    // The outermost release released the lock: the view kept outside knows it is not held.
    assert!(!server.exists("lock:scope:kept"));
    assert!(!kept.is_held().await.unwrap());
    let theirs = other
        .try_acquire("scope:kept", &options)
        .await
        .unwrap()
        .expect("released by the outer guard, though a re-entered guard lives on");
    assert!(matches!(
        kept.extend(Duration::from_secs(30)).await,
        Err(LockError::Lost { .. })
    ));
    assert_eq!(
        server.get("lock:scope:kept").as_deref(),
        Some(theirs.token())
    );
    kept.release().await.unwrap();
    assert_eq!(
        server.get("lock:scope:kept").as_deref(),
        Some(theirs.token())
    );
    // Inside the scope of a guard whose lock expired, the lock is not re-entered: it is found
    // held by its new holder. (A guard cannot be released while its scope runs: the scope
    // borrows it; tests/ui/fail/scope_spawned.rs.)
    outer_scope_after_expiry(&manager, &options).await;
    theirs.release().await.unwrap();
}

/// A scope run by a guard whose lock expired and was taken by another holder: asking for the
/// lock again inside it is told the lock is lost, never re-entered.
async fn outer_scope_after_expiry(manager: &distlock::LockManager, options: &LockOptions) {
    let short = options.clone().ttl(Duration::from_millis(200));
    let outer = manager.acquire("scope:kept2", &short).await.unwrap();
    let (reentered, other) = outer
        .scope(async {
            tokio::time::sleep(Duration::from_millis(400)).await;
            let other = another_holder(manager, options).await;
            let again = manager.try_acquire("scope:kept2", options).await;
            (again, other)
        })
        .await;
    // Told the lock is lost, as the scope's holder, rather than handed a re-entered guard.
    assert!(
        matches!(reentered, Err(LockError::Lost { .. })),
        "an expired guard's scope re-entered its lock: {reentered:?}"
    );
    assert!(matches!(outer.release().await, Err(LockError::Lost { .. })));
    other.release().await.unwrap();
}

/// Another holder of `scope:kept2`, through a clone of `manager` in a spawned task (another
/// owner).
async fn another_holder(manager: &distlock::LockManager, options: &LockOptions) -> LockGuard {
    let (manager, options) = (manager.clone(), options.clone());
    tokio::spawn(async move { manager.acquire("scope:kept2", &options).await.unwrap() })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_reenters_an_odd_name_exactly_and_a_blocking_thread_inside_it_waits() {
    let server = RedisServer::start();
    let manager = test_support::connect(&server).await;
    let options = LockOptions::new().timeout(Duration::from_millis(300));
    let name = "odd:{tag}:\u{e9}\n x";
    let outer = manager.acquire(name, &options).await.unwrap();
    outer
        .scope(async {
            let again = manager.acquire(name, &options).await.unwrap();
            assert_eq!(again.token(), outer.token());
            // A name that differs only after the prefix, or by one character, is another lock.
            let near = manager
                .acquire("odd:{tag}:\u{e9}\n y", &options)
                .await
                .unwrap();
            assert_ne!(near.token(), outer.token());
            near.release().await.unwrap();
            // A thread of the blocking pool is not this task: it waits, and here times out.
            let (pool_manager, pool_options) = (manager.clone(), options.clone());
            let handle = tokio::runtime::Handle::current();
            let waited = tokio::task::spawn_blocking(move || {
                handle.block_on(pool_manager.acquire(name, &pool_options))
            })
            .await
            .unwrap();
            assert!(
                matches!(waited, Err(LockError::Timeout { .. })),
                "a blocking-pool thread re-entered the task's lock: {waited:?}"
            );
        })
        .await;
    assert_eq!(
        server.get(&format!("lock:{name}")).as_deref(),
        Some(outer.token())
    );
    outer.release().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// distlock::blocking: refused at once on the same thread
// ---------------------------------------------------------------------------------------------

/// What a locked body got asking for its own lock again (`acquire`; `try_acquire`: whether it
/// found it held), and how long the two took.
type AskedAgain = (Result<(), LockError>, Result<bool, LockError>, Duration);

/// A locked plain `fn` whose body asks for its own lock again, through the manual blocking API,
/// once with `acquire`, once with `try_acquire`; then for another lock, and from another thread.
#[distributed_lock(key = "blocking-again:{id}", ttl = 10, timeout = 8)]
fn asks_again(id: u32, manager: &distlock::blocking::LockManager) -> Result<AskedAgain, LockError> {
    let options = LockOptions::new().timeout(Duration::from_secs(8));
    let name = format!("blocking-again:{id}");
    let started = Instant::now();
    let again = manager.acquire(&name, &options).map(drop);
    let once = manager
        .try_acquire(&name, &options)
        .map(|guard| guard.is_none());
    let took = started.elapsed();
    // Another lock is fine on this thread.
    manager
        .acquire(&format!("{name}:other"), &options)?
        .release()?;
    // Another thread is another holder: it finds the lock taken.
    std::thread::scope(|scope| {
        scope.spawn(|| {
            assert!(manager.try_acquire(&name, &options).unwrap().is_none());
        });
    });
    Ok((again, once, took))
}

#[test]
fn a_blocking_thread_asking_again_for_a_lock_it_holds_is_refused_at_once() {
    let server = test_support::shared_server();
    match distlock::blocking::init(&server.url()) {
        Ok(()) | Err(LockError::AlreadyInitialized) => {}
        Err(error) => panic!("blocking::init failed: {error}"),
    }
    let manager = distlock::blocking::global().unwrap();
    let (again, once, took) = asks_again(1, manager).unwrap();
    match again {
        Err(LockError::Config(message)) => {
            assert!(message.contains("lock:blocking-again:1"), "{message}");
            assert!(message.contains("already held by this thread"), "{message}");
        }
        other => panic!("expected Config, got {other:?}"),
    }
    // One attempt never waits, so it is not refused: it finds the lock held.
    assert!(matches!(once, Ok(true)), "{once:?}");
    assert!(took < Duration::from_secs(2), "refused after {took:?}");
    assert!(!server.exists("lock:blocking-again:1"), "released");
    // Once the body returned, this thread may take it again.
    manager
        .acquire("blocking-again:1", &LockOptions::new())
        .unwrap()
        .release()
        .unwrap();
}

/// A guard of the manual blocking API may be handed to another thread, which releases it
/// while this thread waits for the lock again: a wait that ends, not a refusal.
#[test]
fn a_blocking_guard_handed_to_another_thread_is_waited_for() {
    let server = RedisServer::start();
    let manager = distlock::blocking::LockManager::connect(&server.url()).unwrap();
    let options = LockOptions::new().timeout(Duration::from_secs(8));
    let guard = manager.acquire("blocking-handed:1", &options).unwrap();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        guard.release().unwrap();
    });
    manager
        .acquire("blocking-handed:1", &options)
        .expect("the lock, once the other thread released it")
        .release()
        .unwrap();
    releaser.join().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Lock order
// ---------------------------------------------------------------------------------------------

/// The warnings that name `template`.
fn warnings_naming(template: &str) -> Vec<String> {
    traced::events()
        .into_iter()
        .filter(|event| event.starts_with("WARN distlock ") && event.contains(template))
        .collect()
}

#[distributed_lock(key = "order-invoice:{id}", ttl = 10)]
async fn charge(id: u32) -> Result<(), LockError> {
    charge_account(id).await
}

#[distributed_lock(key = "order-account:{id}", ttl = 10)]
async fn charge_account(id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "order-account:{id}", ttl = 10)]
async fn refund(id: u32) -> Result<(), LockError> {
    refund_invoice(id).await
}

#[distributed_lock(key = "order-invoice:{id}", ttl = 10)]
async fn refund_invoice(id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "order-ledger:{id}", ttl = 10)]
async fn post(id: u32) -> Result<(), LockError> {
    post_entry(id).await
}

#[distributed_lock(key = "order-entry:{id}", ttl = 10)]
async fn post_entry(id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

// One thread: the subscriber is this thread's, and so is every task of the test.
#[tokio::test(flavor = "current_thread")]
async fn an_inversion_that_never_deadlocked_is_warned_about_once_and_one_order_never() {
    let _tracing = tracing::subscriber::set_default(Recorder);
    test_support::global_server().await;

    for id in 0..3 {
        post(id).await.unwrap();
        charge(id).await.unwrap();
    }
    assert!(
        warnings_naming("order-invoice:{id}").is_empty(),
        "one order so far: {:?}",
        warnings_naming("order-invoice:{id}")
    );
    for id in 10..13 {
        refund(id).await.unwrap();
        charge(id).await.unwrap();
        post(id).await.unwrap();
    }

    let warned = warnings_naming("order-invoice:{id}");
    assert_eq!(warned.len(), 1, "once per pair: {warned:?}");
    let warning = &warned[0];
    for named in [
        "order-account:{id}",
        "reentry::charge",
        "reentry::charge_account",
        "reentry::refund",
        "reentry::refund_invoice",
        "lock order inversion",
    ] {
        assert!(warning.contains(named), "`{named}` missing from {warning}");
    }
    assert!(
        warnings_naming("order-ledger:{id}").is_empty(),
        "one consistent order is no inversion: {:?}",
        warnings_naming("order-ledger:{id}")
    );
}

/// A locked plain `fn` calling another on the same key: the inner call is refused at once.
#[distributed_lock(key = "blocking-nested:{id}", ttl = 10, timeout = 8)]
fn nightly(id: u32) -> Result<Result<(), LockError>, LockError> {
    Ok(nightly_part(id))
}

#[distributed_lock(key = "blocking-nested:{id}", ttl = 10, timeout = 8)]
fn nightly_part(id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[test]
fn a_locked_plain_fn_calling_another_on_the_same_key_is_refused_at_once() {
    match distlock::blocking::init(&test_support::shared_server().url()) {
        Ok(()) | Err(LockError::AlreadyInitialized) => {}
        Err(error) => panic!("blocking::init failed: {error}"),
    }
    let started = Instant::now();
    let inner = nightly(1).expect("the outer call takes the lock");
    assert!(
        matches!(inner, Err(LockError::Config(ref message)) if message.contains("lock:blocking-nested:1")),
        "{inner:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert!(
        !test_support::shared_server().exists("lock:blocking-nested:1"),
        "the outer call released"
    );
}
