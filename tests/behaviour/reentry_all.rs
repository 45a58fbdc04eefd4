//! Re-entry of `acquire_all`, against a real Redis: inside the scope of guards that hold every
//! name, `acquire_all` returns at once without a command and its release releases nothing;
//! holding some, it takes only the rest, and its release gives back only those; a name held to
//! read is refused at once; a kind several keys cannot be taken as is refused even when every
//! name is held.

use std::collections::BTreeMap;
use std::time::Duration;

use distlock::{LockError, LockManager, LockMode, LockOptions};
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
