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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_fail_and_hold_at_least_work_on_a_cluster() {
    if !test_support::in_own_process(
        module_path!(),
        "skip_fail_and_hold_at_least_work_on_a_cluster",
    ) {
        return;
    }
    let cluster = RedisCluster::start(3, 0);
    let urls = cluster.urls();
    distlock::init_with(LockManager::cluster_builder(&urls).connect().await.unwrap()).unwrap();
    let other = LockManager::cluster_builder(&urls).connect().await.unwrap();

    // hold_at_least: the body is done, the lock stays until the hold ends; a second run skips.
    assert_eq!(report(1).await.unwrap(), Some(1));
    assert!(cluster.exists("lock:report:{1}"));
    assert_eq!(report(1).await.unwrap(), None);
    test_support::eventually(Duration::from_secs(10), "the hold to end", || {
        !cluster.exists("lock:report:{1}")
    })
    .await;
    assert_eq!(report(1).await.unwrap(), Some(1));

    // skip while another client holds it.
    test_support::eventually(Duration::from_secs(10), "the hold to end", || {
        !cluster.exists("lock:report:{1}")
    })
    .await;
    let guard = other
        .acquire("report:{1}", &LockOptions::new())
        .await
        .unwrap();
    assert_eq!(report(1).await.unwrap(), None);
    guard.release().await.unwrap();

    // fail while held; runs once free.
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
