//! Re-entry of `acquire_all`, against a real Redis: inside the scope of guards that hold every
//! name, `acquire_all` returns at once without a command and its release releases nothing;
//! holding some, it takes only the rest, and its release gives back only those; a name held to
//! read is refused at once; a kind several keys cannot be taken as is refused even when every
//! name is held.

use std::collections::BTreeMap;
use std::time::Duration;

use distlock::{distributed_lock, LockError, LockManager, LockMode, LockOptions};
use test_support::RedisServer;

/// A timeout long enough that a wait for the task's own lock would show.
fn options() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(8))
}

/// Every command that reached `server` through any connection since the reset through
/// `conn`, but for the reset and this `INFO`.
fn commands_since_reset(conn: &mut redis::Connection) -> BTreeMap<String, u64> {
    let mut stats = RedisServer::command_counts_on(conn);
    stats.remove("info");
    if stats.remove("config|resetstat").is_none() && stats.get("config") == Some(&1) {
        stats.remove("config");
    }
    stats
}

fn reset_stats(conn: &mut redis::Connection) {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(conn)
        .expect("CONFIG RESETSTAT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_name_held_is_re_entered_without_a_command_and_released_by_the_outer_guard() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let other = LockManager::connect(&server.url()).await.unwrap();
    let outer = manager
        .acquire_all(&["ra:{t}:a", "ra:{t}:b"], &options())
        .await
        .unwrap();
    let mut conn = server.conn();
    let (inner, commands) = outer
        .scope(async {
            reset_stats(&mut conn);
            // Another order, and a name repeated: the same locks.
            let inner = manager
                .acquire_all(&["ra:{t}:b", "ra:{t}:a", "ra:{t}:b"], &options())
                .await;
            let commands = commands_since_reset(&mut conn);
            let inner = inner.expect("re-entered");
            assert_eq!(inner.token(), outer.token(), "a view of the outer lock");
            inner
                .release()
                .await
                .expect("a re-entered guard releases nothing");
            let tried = manager
                .try_acquire_all(&["ra:{t}:a", "ra:{t}:b"], &options())
                .await
                .expect("re-entered again");
            (tried.map(|guard| guard.token().to_owned()), commands)
        })
        .await;
    assert_eq!(inner.as_deref(), Some(outer.token()));
    assert!(commands.is_empty(), "no command sent: {commands:?}");
    assert!(
        other
            .try_acquire("ra:{t}:a", &options())
            .await
            .unwrap()
            .is_none()
            && other
                .try_acquire("ra:{t}:b", &options())
                .await
                .unwrap()
                .is_none(),
        "the outer guard still holds both"
    );
    outer.release().await.unwrap();
    assert!(other
        .try_acquire("ra:{t}:b", &options())
        .await
        .unwrap()
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn some_names_held_take_only_the_rest_and_give_back_only_those() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let other = LockManager::connect(&server.url()).await.unwrap();
    let outer = manager.acquire("rs:a", &options()).await.unwrap();
    let started = std::time::Instant::now();
    let inner = outer
        .scope(manager.acquire_all(&["rs:a", "rs:c"], &options()))
        .await
        .expect("a re-entered, c taken");
    assert!(
        started.elapsed() < options().timeout_duration(),
        "no wait for the task's own lock"
    );
    assert!(inner.keys().contains(&"lock:rs:c"), "{:?}", inner.keys());
    assert!(inner.is_held().await.unwrap());
    assert!(other
        .try_acquire("rs:c", &options())
        .await
        .unwrap()
        .is_none());
    inner.release().await.unwrap();
    assert!(
        other
            .try_acquire("rs:c", &options())
            .await
            .unwrap()
            .is_some(),
        "the rest is given back"
    );
    assert!(
        other
            .try_acquire("rs:a", &options())
            .await
            .unwrap()
            .is_none(),
        "the lock re-entered stays with the outer guard"
    );
    assert!(outer.is_held().await.unwrap());
    // One attempt likewise: only the rest is taken.
    let tried = outer
        .scope(manager.try_acquire_all(&["rs:d", "rs:a"], &options()))
        .await
        .unwrap()
        .expect("d free, a re-entered");
    drop(tried);
    outer.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_held_to_read_is_refused_at_once() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let read = manager
        .acquire("rr:r", &options().mode(LockMode::Read))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let refused = read
        .scope(manager.acquire_all(&["rr:x", "rr:r"], &options()))
        .await;
    assert!(
        matches!(&refused, Err(LockError::Config(message)) if message.contains("rr:r")),
        "{refused:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(4), "no wait");
    // Nothing of the rest is left taken.
    assert!(manager
        .try_acquire("rr:x", &options())
        .await
        .unwrap()
        .is_some());
    read.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_several_keys_cannot_be_taken_as_is_refused_even_when_every_name_is_held() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let outer = manager.acquire("rk:a", &options()).await.unwrap();
    for asked in [options().mode(LockMode::Read), options().permits(2)] {
        let refused = outer.scope(manager.acquire_all(&["rk:a"], &asked)).await;
        assert!(
            matches!(refused, Err(LockError::Config(_))),
            "{asked:?}: {refused:?}"
        );
        let refused = outer
            .scope(manager.try_acquire_all(&["rk:a"], &asked))
            .await;
        assert!(
            matches!(refused, Err(LockError::Config(_))),
            "{asked:?}: {refused:?}"
        );
    }
    outer.release().await.unwrap();
}

/// A lone `acquire` (and `try_acquire`) of any name an `acquire_all` guard holds re-enters it
/// at once, not only its first: the task would otherwise wait for its own release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_acquire_of_any_name_of_an_acquire_all_guard_is_re_entered() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let other = LockManager::connect(&server.url()).await.unwrap();
    let outer = manager
        .acquire_all(&["rl:{t}:a", "rl:{t}:b", "rl:{t}:c"], &options())
        .await
        .unwrap();
    let mut conn = server.conn();
    let started = std::time::Instant::now();
    let (keys, commands) = outer
        .scope(async {
            reset_stats(&mut conn);
            let mut keys = Vec::new();
            for name in ["rl:{t}:b", "rl:{t}:c", "rl:{t}:a"] {
                let inner = manager.acquire(name, &options()).await.expect("re-entered");
                assert_eq!(inner.token(), outer.token(), "a view of the outer lock");
                keys.push(inner.key().to_owned());
                inner.release().await.expect("releases nothing");
                let tried = manager
                    .try_acquire(name, &options())
                    .await
                    .unwrap()
                    .expect("re-entered by one attempt too");
                assert_eq!(tried.key(), format!("lock:{name}"));
                // A read is covered by the write lock the guard holds.
                let read = manager
                    .acquire(name, &options().mode(LockMode::Read))
                    .await
                    .expect("a read re-enters a write lock");
                drop(read);
            }
            (keys, commands_since_reset(&mut conn))
        })
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "no wait for the task's own locks: {:?}",
        started.elapsed()
    );
    assert_eq!(keys, ["lock:rl:{t}:b", "lock:rl:{t}:c", "lock:rl:{t}:a"]);
    assert!(commands.is_empty(), "no command sent: {commands:?}");
    for name in ["rl:{t}:a", "rl:{t}:b", "rl:{t}:c"] {
        assert!(
            other.try_acquire(name, &options()).await.unwrap().is_none(),
            "{name}: the outer guard still holds it"
        );
    }
    // A semaphore of the name is another use of it: refused at once, not a wait.
    let refused = outer
        .scope(manager.acquire("rl:{t}:c", &options().permits(2)))
        .await;
    assert!(
        matches!(&refused, Err(LockError::Config(message)) if message.contains("rl:{t}:c")),
        "{refused:?}"
    );
    outer.release().await.unwrap();
    assert!(other
        .try_acquire("rl:{t}:c", &options())
        .await
        .unwrap()
        .is_some());
}

/// What `transfer` saw of the lone lock its body took.
#[distributed_lock(keys = ["rt:account:{from}", "rt:account:{to}"], ttl = 30, timeout = 8)]
async fn transfer(from: u32, to: u32) -> Result<String, LockError> {
    let _ = from;
    credit(to).await
}

#[distributed_lock(key = "rt:account:{id}", ttl = 30, timeout = 8, guard = lock)]
async fn credit(id: u32) -> Result<String, LockError> {
    let _ = id;
    Ok(lock.key().to_owned())
}

/// The attribute: a `keys = [..]` body calling a function locked on its second key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_body_of_several_keys_calls_a_function_locked_on_its_second() {
    let server = test_support::global_server().await;
    let started = std::time::Instant::now();
    let key = transfer(1, 2).await.expect("credit re-enters account 2");
    assert_eq!(key, "lock:rt:account:2");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "no wait for the task's own lock: {:?}",
        started.elapsed()
    );
    assert!(
        !server.exists("lock:rt:account:2"),
        "released after the body"
    );
}

/// A locked plain `fn` of several keys whose body takes one of them again through the blocking
/// API: refused at once, as for one key, whichever of its names it is.
#[distributed_lock(keys = ["rb:account:{from}", "rb:account:{to}"], ttl = 30, timeout = 8)]
fn transfer_blocking(from: u32, to: u32) -> Result<Result<(), LockError>, LockError> {
    let _ = from;
    let manager = distlock::blocking::global()?;
    Ok(manager
        .acquire(&format!("rb:account:{to}"), &options())
        .map(drop))
}

#[test]
fn a_blocking_body_of_several_keys_asking_for_its_second_again_is_refused_at_once() {
    let server = test_support::shared_server();
    match distlock::blocking::init(&server.url()) {
        Ok(()) | Err(LockError::AlreadyInitialized) => {}
        Err(error) => panic!("blocking::init failed: {error}"),
    }
    let started = std::time::Instant::now();
    let inner = transfer_blocking(1, 2).expect("the outer call takes both");
    assert!(
        matches!(&inner, Err(LockError::Config(message)) if message.contains("lock:rb:account:2")),
        "{inner:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "refused after {:?}",
        started.elapsed()
    );
    assert!(
        !server.exists("lock:rb:account:2"),
        "released after the body"
    );
}

/// `acquire_all` holding some names and waiting for the rest, cancelled mid-wait (its future
/// dropped): the names it re-entered stay with the outer guard, and the rest are not left
/// taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn some_names_held_and_the_wait_for_the_rest_cancelled_keeps_the_outer_locks() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let other = LockManager::connect(&server.url()).await.unwrap();
    let outer = manager
        .acquire_all(&["rc:{t}:a", "rc:{t}:b"], &options())
        .await
        .unwrap();
    let busy = other.acquire("rc:{t}:c", &options()).await.unwrap();
    for cut in [0, 1, 5, 50, 600] {
        let waited = outer
            .scope(tokio::time::timeout(
                Duration::from_millis(cut),
                manager.acquire_all(&["rc:{t}:b", "rc:{t}:c", "rc:{t}:a"], &options()),
            ))
            .await;
        assert!(waited.is_err(), "cut {cut}: c is busy, the wait is cut");
        // A release in the background would have run by now.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            outer.is_held().await.unwrap(),
            "cut {cut}: a and b still held"
        );
        for name in ["rc:{t}:a", "rc:{t}:b"] {
            assert!(
                other.try_acquire(name, &options()).await.unwrap().is_none(),
                "cut {cut}: {name} still the outer guard's"
            );
        }
    }
    busy.release().await.unwrap();
    // c was not left taken by a cancelled wait.
    let c = other
        .acquire("rc:{t}:c", &options().timeout(Duration::from_secs(4)))
        .await
        .expect("c free once its holder released");
    c.release().await.unwrap();
    outer.release().await.unwrap();
}
