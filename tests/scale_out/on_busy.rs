//! `on_busy = "skip" | "fail"` and `hold_at_least` on the attribute with the global client on a
//! Redis Cluster (in a process of its own: a process has one global client).

use std::time::Duration;

use distlock::{distributed_lock, LockError, LockManager, LockOptions};
use test_support::RedisCluster;

#[distributed_lock(
    key = "report:{{{day}}}",
    on_busy = "skip",
    ttl = 10,
    hold_at_least = "1s"
)]
async fn report(day: u32) -> Result<Option<u32>, LockError> {
    Ok(Some(day))
}

#[distributed_lock(key = "charge:{id}", on_busy = "fail")]
async fn charge(id: &str) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

/// A cluster, the global client on it, and another client of the same cluster.
async fn cluster_with_global_client() -> (RedisCluster, LockManager) {
    let cluster = RedisCluster::start(3, 0);
    let urls = cluster.urls();
    distlock::init_with(LockManager::cluster_builder(&urls).connect().await.unwrap()).unwrap();
    let other = LockManager::cluster_builder(&urls).connect().await.unwrap();
    (cluster, other)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_at_least_keeps_the_lock_on_a_cluster_until_the_hold_ends() {
    if !test_support::in_own_process(
        module_path!(),
        "hold_at_least_keeps_the_lock_on_a_cluster_until_the_hold_ends",
    ) {
        return;
    }
    let (cluster, _other) = cluster_with_global_client().await;

    // The body is done, the lock stays until the hold ends; a second run skips.
    assert_eq!(report(1).await.unwrap(), Some(1));
    assert!(cluster.exists("lock:report:{1}"));
    assert_eq!(report(1).await.unwrap(), None);
    test_support::eventually(Duration::from_secs(10), "the hold to end", || {
        !cluster.exists("lock:report:{1}")
    })
    .await;
    assert_eq!(report(1).await.unwrap(), Some(1));
    test_support::eventually(Duration::from_secs(10), "the hold to end", || {
        !cluster.exists("lock:report:{1}")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_busy_skip_skips_while_another_client_holds_the_lock_on_a_cluster() {
    if !test_support::in_own_process(
        module_path!(),
        "on_busy_skip_skips_while_another_client_holds_the_lock_on_a_cluster",
    ) {
        return;
    }
    let (_cluster, other) = cluster_with_global_client().await;
    let guard = other
        .acquire("report:{1}", &LockOptions::new())
        .await
        .unwrap();
    assert_eq!(report(1).await.unwrap(), None);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_busy_fail_is_busy_while_held_on_a_cluster_and_runs_once_free() {
    if !test_support::in_own_process(
        module_path!(),
        "on_busy_fail_is_busy_while_held_on_a_cluster_and_runs_once_free",
    ) {
        return;
    }
    let (cluster, other) = cluster_with_global_client().await;
    let guard = other
        .acquire("charge:9", &LockOptions::new())
        .await
        .unwrap();
    let error = charge("9").await.unwrap_err();
    assert!(
        matches!(&error, LockError::Busy { key } if key == "lock:charge:9"),
        "{error:?}"
    );
    guard.release().await.unwrap();
    charge("9").await.unwrap();
    assert!(!cluster.exists("lock:charge:9"));
}
