//! `LockOptions::hold_at_least` on a Redis Cluster and on Redlock: the lock is kept until the
//! hold ends, on the node of its slot or on a majority of the masters.

use std::time::Duration;

use distlock::{LockManager, LockOptions};
use test_support::{eventually, keys, RedisCluster, RedisServers};

fn options(ttl_ms: u64, hold_ms: u64) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_millis(ttl_ms))
        .hold_at_least(Duration::from_millis(hold_ms))
}

#[tokio::test]
async fn on_a_cluster_the_hold_keeps_the_lock_until_it_ends() {
    let cluster = RedisCluster::start(3, 0);
    let urls = cluster.urls();
    let manager = LockManager::cluster_builder(&urls).connect().await.unwrap();
    let other = LockManager::cluster_builder(&urls).connect().await.unwrap();
    for name in ["job:{a}", "job:b", "nightly"] {
        let key = format!("lock:{name}");
        let guard = manager
            .acquire(name, &options(30_000, 1_000))
            .await
            .unwrap();
        let token = guard.token().to_owned();
        guard.release().await.unwrap();
        assert_eq!(cluster.get(&key), Some(token), "{key}");
        let pttl = cluster.pttl(&key);
        assert!((1..=1_000).contains(&pttl), "{key}: pttl {pttl}");
        assert!(other
            .try_acquire(name, &LockOptions::new())
            .await
            .unwrap()
            .is_none());
        eventually(Duration::from_secs(10), "the hold to end", || {
            !cluster.exists(&key)
        })
        .await;
        let next = other.try_acquire(name, &LockOptions::new()).await.unwrap();
        next.expect("free after the hold").release().await.unwrap();
    }
}

/// On a cluster too, a release within the hold while someone waits keeps the lock for the line
/// (the hold's end is written into the lock's value), and the waiter goes before a newcomer at its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_waiter_in_line_gets_the_lock_at_the_holds_end() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let cluster = RedisCluster::start(3, 0);
    let urls = cluster.urls();
    let connect = || LockManager::cluster_builder(&urls).connect();
    let (holder, waiter, newcomer) = (
        connect().await.unwrap(),
        connect().await.unwrap(),
        connect().await.unwrap(),
    );
    let guard = holder.acquire("fifo", &options(30_000, 600)).await.unwrap();
    let waiter_got = Arc::new(AtomicBool::new(false));
    let waiting = tokio::spawn({
        let waiter_got = Arc::clone(&waiter_got);
        async move {
            let options = LockOptions::new().timeout(Duration::from_secs(20));
            let guard = waiter.acquire("fifo", &options).await.unwrap();
            waiter_got.store(true, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(300)).await;
            guard.release().await.unwrap();
        }
    });
    eventually(
        Duration::from_secs(10),
        "the waiter to take its place in line",
        || cluster.exists(&keys::named("fifo").line()),
    )
    .await;
    let token = guard.token().to_owned();
    guard.release().await.unwrap();
    let value = cluster.get("lock:fifo").expect("kept");
    assert!(
        value
            .strip_prefix(&format!("{token};hold="))
            .is_some_and(|end| end.parse::<u64>().is_ok()),
        "the hold's end is in the value for the line: {value}"
    );
    let pttl = cluster.pttl("lock:fifo");
    assert!(pttl > 600, "kept a claim past the hold: pttl {pttl}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !waiter_got.load(Ordering::SeqCst) && tokio::time::Instant::now() < deadline {
        if let Some(taken) = newcomer
            .try_acquire("fifo", &LockOptions::new())
            .await
            .unwrap()
        {
            taken.release().await.unwrap();
            panic!("a newcomer took the lock before the waiter in line");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(waiter_got.load(Ordering::SeqCst), "the waiter got the lock");
    waiting.await.unwrap();
}

#[tokio::test]
async fn on_redlock_the_hold_keeps_the_lock_on_a_majority_until_it_ends() {
    let servers = RedisServers::start(3);
    let urls = servers.urls();
    let manager = LockManager::redlock_builder(&urls).connect().await.unwrap();
    let guard = manager
        .acquire("report", &options(30_000, 1_000))
        .await
        .unwrap();
    guard.release().await.unwrap();
    assert_eq!(servers.holders("lock:report").len(), 3);
    assert!(manager
        .try_acquire("report", &LockOptions::new())
        .await
        .unwrap()
        .is_none());
    eventually(Duration::from_secs(10), "the hold to end", || {
        servers.holders("lock:report").is_empty()
    })
    .await;
}

/// On Redlock a waiter sits in each master's wake list and looks again every second. A release
/// within the hold must wake it to learn the new, shorter expiry — as the standalone release
/// does — or it sleeps on the 30 s ttl it saw until that look, well after the hold ended.
#[tokio::test]
async fn on_redlock_a_release_within_the_hold_wakes_the_waiter_in_time() {
    let servers = RedisServers::start(3);
    let urls = servers.urls();
    let holder = LockManager::redlock_builder(&urls).connect().await.unwrap();
    let waiter = LockManager::redlock_builder(&urls).connect().await.unwrap();
    let hold = Duration::from_millis(500);
    // The hold runs from when Redis answered, between these two instants.
    let asked = tokio::time::Instant::now();
    let guard = holder.acquire("soon", &options(30_000, 500)).await.unwrap();
    let acquired = tokio::time::Instant::now();
    let waiting = tokio::spawn(async move {
        let options = LockOptions::new().timeout(Duration::from_secs(20));
        let guard = waiter.acquire("soon", &options).await.unwrap();
        (guard, tokio::time::Instant::now())
    });
    eventually(
        Duration::from_secs(10),
        "the waiter to take its place in every wake list",
        || {
            servers
                .iter()
                .all(|server| !server.keys("*soon*wake").is_empty())
        },
    )
    .await;
    guard.release().await.unwrap();
    let (next, got_at) = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiter gets the lock")
        .unwrap();
    assert!(got_at - asked >= hold, "handed over before the hold ended");
    let late = (got_at - acquired).saturating_sub(hold);
    assert!(
        late < Duration::from_millis(300),
        "handed over {late:?} after the hold ended: the waiter was not told the new expiry"
    );
    next.release().await.unwrap();
}
