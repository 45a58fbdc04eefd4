//! Round trips: an uncontended acquire + release costs exactly two client round
//! trips — a plain `SET NX PX` (the first try needs no script), then one `EVALSHA` of the
//! release of a lock held alone — once the script is loaded: the same two commands a
//! hand-written lock sends. No `PING`, no `SCRIPT LOAD`, no `PUBLISH`, no `SUBSCRIBE`.
//!
//! `INFO commandstats` also counts the commands that a script runs inside Redis (`GET`,
//! `LINDEX` and `DEL` in that release); those are not round trips, and the tests pin them down
//! too, so that any extra command shows up. The one `EVALSHA` is the release, so the one `SET`
//! is the client's.

use std::collections::BTreeMap;

use distlock::{distributed_lock, LockError, LockManager, LockOptions};
use test_support::{global_server, RedisServer};

/// Resets the stats on `conn` (a connection opened before, so its own handshake is not
/// counted), runs `operation`, and returns what reached Redis meanwhile, without the reset
/// itself.
async fn stats_of<F: std::future::Future<Output = ()>>(
    conn: &mut redis::Connection,
    operation: F,
) -> BTreeMap<String, u64> {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(conn)
        .expect("CONFIG RESETSTAT");
    operation.await;
    let mut stats = RedisServer::command_counts_on(conn);
    // The reset counts itself once, after resetting: as `config|resetstat` where subcommands
    // are counted on their own (Redis 7, Valkey), as `config` where they are not (Redis 6.2).
    // Only that one call is removed, so a CONFIG sent by distlock would still show.
    if stats.remove("config|resetstat").is_none() {
        match stats.get_mut("config") {
            Some(1) => {
                stats.remove("config");
            }
            Some(calls) => *calls -= 1,
            None => {
                panic!("the reset was not counted, as `config|resetstat` or `config`: {stats:?}")
            }
        }
    }
    stats
}

/// Exactly what one uncontended acquire + release runs on Redis.
fn expected() -> BTreeMap<String, u64> {
    [
        // The two round trips: the acquire's plain SET NX PX, the release script.
        ("set", 1),
        ("evalsha", 1),
        // Inside the release of a lock held alone: EXISTS (the line: nobody to hand over
        // to), GET (compare) and DEL.
        ("exists", 1),
        ("get", 1),
        ("del", 1),
    ]
    .into_iter()
    .map(|(name, calls)| (name.to_owned(), calls))
    .collect()
}

fn assert_two_round_trips(stats: &BTreeMap<String, u64>) {
    eprintln!("INFO commandstats for one acquire + release: {stats:?}");
    assert_eq!(stats.get("evalsha"), Some(&1), "round trips: {stats:?}");
    assert_eq!(stats.get("set"), Some(&1), "round trips: {stats:?}");
    for absent in ["publish", "subscribe", "ping", "script|load", "eval"] {
        assert!(
            !stats.contains_key(absent),
            "`{absent}` was sent: {stats:?}"
        );
    }
    assert_eq!(stats, &expected());
}

#[tokio::test]
async fn an_uncontended_acquire_and_release_is_two_round_trips() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.expect("connect");
    let options = LockOptions::new();
    // Warm-up: connects, and loads both scripts through the NOSCRIPT fallback.
    let guard = manager.acquire("rt:manual", &options).await.expect("free");
    guard.release().await.expect("ours");

    let mut conn = server.conn();
    let stats = stats_of(&mut conn, async {
        let guard = manager.acquire("rt:manual", &options).await.expect("free");
        guard.release().await.expect("ours");
    })
    .await;
    assert_two_round_trips(&stats);
    assert!(server.pubsub_channels().is_empty());
    assert!(!server.exists("lock:rt:manual"));
}

#[distributed_lock(key = "rt:attr:{id}", ttl = 5)]
async fn locked(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[tokio::test]
async fn an_uncontended_locked_function_is_two_round_trips() {
    let server = global_server().await;
    assert_eq!(locked(1).await.expect("warm-up"), 1);

    let mut conn = server.conn();
    let stats = stats_of(&mut conn, async {
        assert_eq!(locked(1).await.expect("free"), 1);
    })
    .await;
    assert_two_round_trips(&stats);
    assert!(server.pubsub_channels().is_empty());
    assert!(!server.exists("lock:rt:attr:1"));
}

/// Several keys in one slot (one server here): one `EVALSHA` takes them all and one releases
/// them, whatever their number — two round trips, as the mutex.
#[tokio::test]
async fn several_keys_in_one_slot_are_two_round_trips() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.expect("connect");
    let options = LockOptions::new();
    let names = ["rt:all:a", "rt:all:b", "rt:all:c", "rt:all:a"];
    // Warm-up: connects, and loads both scripts through the NOSCRIPT fallback.
    let guard = manager.acquire_all(&names, &options).await.expect("free");
    guard.release().await.expect("ours");

    let mut conn = server.conn();
    let stats = stats_of(&mut conn, async {
        let guard = manager.acquire_all(&names, &options).await.expect("free");
        assert_eq!(guard.keys().len(), 3);
        guard.release().await.expect("ours");
    })
    .await;
    eprintln!("INFO commandstats for one acquire_all + release of 3 keys: {stats:?}");
    assert_eq!(stats.get("evalsha"), Some(&2), "two round trips: {stats:?}");
    for absent in [
        "publish",
        "subscribe",
        "ping",
        "script|load",
        "eval",
        "mget",
    ] {
        assert!(
            !stats.contains_key(absent),
            "`{absent}` was sent: {stats:?}"
        );
    }
    // Inside the scripts (counted there, not round trips): each key set once, deleted once.
    assert_eq!(stats.get("set"), Some(&3), "{stats:?}");
    assert_eq!(stats.get("del"), Some(&3), "{stats:?}");
    for name in ["a", "b", "c"] {
        assert!(!server.exists(&format!("lock:rt:all:{name}")));
    }
}

/// A lock taken by a first try that someone joined the line of while it was held: the release
/// of a lock held alone finds the waiter and changes nothing, and the full release hands the
/// lock over — one round trip more, only then. The waiter gets the lock from that hand-off,
/// and the lock is not deleted in between (the hand-off's `SET` overwrites it, no `DEL` of it).
#[tokio::test]
async fn a_release_that_finds_a_waiter_hands_over_with_one_round_trip_more() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.expect("connect");
    let waiting = LockManager::connect(&server.url()).await.expect("connect");
    let options = LockOptions::new().timeout(std::time::Duration::from_secs(10));
    // Warm-up: connects, and loads the scripts through the NOSCRIPT fallback.
    let guard = manager.acquire("rt:handed", &options).await.expect("free");
    guard.release().await.expect("ours");

    let guard = manager.acquire("rt:handed", &options).await.expect("free");
    // The waiter releases only once the stats are read: its release is not counted.
    let (counted, stats_read) = tokio::sync::oneshot::channel::<()>();
    let waiter = tokio::spawn(async move {
        let guard = waiting
            .acquire("rt:handed", &options)
            .await
            .expect("handed over");
        stats_read.await.expect("the stats were read");
        guard.release().await.expect("ours");
    });
    let line = test_support::keys::named("rt:handed").line();
    let mut waited = 0;
    while !server.exists(&line) {
        waited += 1;
        assert!(waited < 500, "the waiter never took its place in line");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let mut conn = server.conn();
    let stats = stats_of(&mut conn, async {
        guard.release().await.expect("ours");
    })
    .await;
    eprintln!("INFO commandstats for the release with a waiter in line: {stats:?}");
    assert_eq!(
        stats.get("evalsha"),
        Some(&2),
        "the release of a lock held alone, then the full release: {stats:?}"
    );
    assert_eq!(
        stats.get("exists"),
        Some(&1),
        "the release of a lock held alone read the line: {stats:?}"
    );
    assert_eq!(stats.get("publish"), Some(&1), "handed over: {stats:?}");
    assert_eq!(
        stats.get("del"),
        None,
        "the lock was never deleted: {stats:?}"
    );
    counted.send(()).expect("the waiter waits");
    waiter.await.expect("the waiter got the lock");
}
