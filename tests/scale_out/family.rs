//! Semaphores and read-write locks beyond one server: on a 3-master Redis Cluster (every key of
//! a semaphore in its lock key's slot, so each permit is one script on one node), and refused
//! on Redlock, whose independent masters cannot keep one count of holders or one fair line.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{LockError, LockManager, LockMode, LockOptions, LostCause};
use test_support::RedisServers;

use crate::cluster::shared_cluster;

async fn cluster_manager() -> LockManager {
    LockManager::cluster_builder(&shared_cluster().urls())
        .connect()
        .await
        .unwrap_or_else(|error| panic!("cannot connect a cluster lock manager: {error}"))
}

fn permits(n: u32) -> LockOptions {
    LockOptions::new()
        .permits(n)
        .ttl(Duration::from_secs(20))
        .timeout(Duration::from_secs(60))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn permits_on_a_cluster_let_in_exactly_n_in_arrival_order() {
    // Names whose slots fall on different masters: each semaphore lives on its own node.
    for name in ["family:cluster:a", "family:cluster:{b}", "family:cluster:c"] {
        let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let manager = cluster_manager().await;
            let (inside, most) = (inside.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..4 {
                    let guard = manager.acquire(name, &permits(2)).await?;
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await?;
                }
                Ok::<(), LockError>(())
            }));
        }
        for task in tasks {
            task.await
                .unwrap()
                .expect("every permit was had and given back");
        }
        assert_eq!(
            most.load(Ordering::SeqCst),
            2,
            "{name}: two at once, never three"
        );
        assert_eq!(shared_cluster().get(&format!("lock:{name}")), None);
    }

    // First come, first served.
    let holder = cluster_manager().await;
    let name = "family:cluster:fifo";
    let held = holder.acquire(name, &permits(2)).await.unwrap();
    let other = holder.acquire(name, &permits(2)).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for waiter in 0..3 {
        let (manager, order) = (cluster_manager().await, order.clone());
        waiters.push(tokio::spawn(async move {
            let guard = manager.acquire(name, &permits(2)).await.unwrap();
            order.lock().unwrap().push(waiter);
            tokio::time::sleep(Duration::from_millis(100)).await;
            guard.release().await.unwrap();
        }));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    held.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    other.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_share_and_a_writer_waits_on_a_cluster() {
    let name = "family:cluster:rw";
    let read = LockOptions::new()
        .mode(LockMode::Read)
        .timeout(Duration::from_secs(30));
    let write = LockOptions::new().timeout(Duration::from_secs(30));
    let (a, b, w) = (
        cluster_manager().await,
        cluster_manager().await,
        cluster_manager().await,
    );
    let first = a.acquire(name, &read).await.unwrap();
    let second = b
        .try_acquire(name, &read)
        .await
        .unwrap()
        .expect("readers share");
    let writer = tokio::spawn(async move { w.acquire(name, &write).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        a.try_acquire(name, &read).await.unwrap().is_none(),
        "a later reader waits behind the writer"
    );
    first.release().await.unwrap();
    second.release().await.unwrap();
    let writer = writer
        .await
        .unwrap()
        .expect("the writer gets in after the readers");
    writer.release().await.unwrap();
}

/// On a cluster too, one attempt of a mutex on a name held as a semaphore is refused, not
/// answered "busy"; on a name held by readers it is busy.
#[tokio::test]
async fn a_mutex_try_on_a_semaphore_of_a_cluster_is_refused() {
    let manager = cluster_manager().await;
    let permit = manager
        .acquire("family:cluster:try", &permits(3))
        .await
        .unwrap();
    let tried = manager
        .try_acquire("family:cluster:try", &LockOptions::new())
        .await;
    assert!(
        matches!(&tried, Err(LockError::Config(message)) if message.contains("semaphore of 3 permits")),
        "{:?}",
        tried.map(|guard| guard.is_some())
    );
    permit.release().await.unwrap();
    let reader = manager
        .acquire(
            "family:cluster:try",
            &LockOptions::new().mode(LockMode::Read),
        )
        .await
        .unwrap();
    let writer = manager
        .try_acquire("family:cluster:try", &LockOptions::new())
        .await
        .unwrap();
    assert!(writer.is_none(), "busy while a reader holds it");
    reader.release().await.unwrap();
}

/// An operator's `force_release` of a semaphore's permits and of readers on a cluster, under
/// names whose braces make their helper keys hash by a tag of distlock's (a `}` with no tag
/// before it) or by the user's own: the broken holders are told `ForceReleased` through the
/// `forced-leases` marks, the head of the line is let in, its release is remembered in the
/// `releases` marks, every one of those keys in the lock's slot (else the script is refused
/// with CROSSSLOT), and none of the lock's keys is left without an expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_force_release_on_a_cluster_keeps_its_marks_in_the_slot_and_expiring() {
    let cluster = shared_cluster();
    let reader = LockOptions::new()
        .mode(LockMode::Read)
        .ttl(Duration::from_secs(60))
        .timeout(Duration::from_secs(30));
    let writer = LockOptions::new().timeout(Duration::from_secs(30));
    let cases = [
        // The waiter let in releases as a permit (`releases` marks) or as a writer (the
        // mutex's `released` marker).
        (
            "family:cluster:force}a{b",
            permits(2),
            permits(2),
            "releases",
        ),
        (
            "{family:7}:cluster:force",
            permits(2),
            permits(2),
            "releases",
        ),
        (
            "family:cluster:force}r{w",
            reader.clone(),
            writer.clone(),
            "released",
        ),
        ("{family:8}:cluster:force:rw", reader, writer, "released"),
    ];
    let (holders, operator, waiters) = (
        cluster_manager().await,
        cluster_manager().await,
        cluster_manager().await,
    );
    for (name, held, waiting, release_mark) in cases {
        let held = held.ttl(Duration::from_secs(60));
        let first = holders.acquire(name, &held).await.unwrap();
        let second = holders.acquire(name, &held).await.unwrap();
        let waiters = waiters.clone();
        let waiter = tokio::spawn(async move { waiters.acquire(name, &waiting).await });
        let info = test_support::waiting_in_line(&operator, name, 1).await;
        assert!(operator.force_release(&info).await.unwrap(), "{name}");
        let admitted = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap_or_else(|_| panic!("{name}: the waiter was not let in"))
            .unwrap()
            .unwrap_or_else(|error| panic!("{name}: the waiter's acquire: {error}"));
        for told in [
            first.extend(Duration::from_secs(60)).await,
            second.release().await,
        ] {
            assert!(
                matches!(
                    told,
                    Err(LockError::Lost {
                        cause: LostCause::ForceReleased,
                        ..
                    })
                ),
                "{name}: {told:?}"
            );
        }
        admitted.release().await.unwrap();
        let lock = format!("lock:{name}");
        let left: Vec<(String, i64)> = cluster
            .keys("*")
            .into_iter()
            .filter(|key| key.contains(&lock))
            .map(|key| {
                let pttl = cluster.pttl(&key);
                (key, pttl)
            })
            .collect();
        for word in ["forced-leases", release_mark] {
            assert!(
                left.iter()
                    .any(|(key, _)| key.contains(&format!(":distlock:{word}"))),
                "{name}: no `{word}` marks among {left:?}"
            );
        }
        assert!(
            left.iter().all(|(_, pttl)| *pttl > 0),
            "{name}: a key without expiry: {left:?}"
        );
        drop(first);
    }
}

#[tokio::test]
async fn redlock_refuses_semaphores_and_read_locks_saying_why() {
    let servers = RedisServers::start(3);
    let manager = LockManager::redlock_builder(&servers.urls())
        .connect()
        .await
        .unwrap();
    for options in [
        LockOptions::new().permits(3),
        LockOptions::new().mode(LockMode::Read),
    ] {
        for result in [
            manager.acquire("family:redlock", &options).await.map(Some),
            manager.try_acquire("family:redlock", &options).await,
        ] {
            let error = result.expect_err("refused on Redlock");
            assert!(
                matches!(&error, LockError::Config(message) if message.contains("not available on Redlock")),
                "{error:?}"
            );
        }
    }
    assert_eq!(servers.holders("lock:family:redlock"), Vec::<usize>::new());
    // The mutex is the same as ever, and so is `permits(1)`.
    let guard = manager
        .acquire("family:redlock", &LockOptions::new().permits(1))
        .await
        .unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_and_readers_through_the_sentinels() {
    let set = test_support::SentinelSet::start();
    let (one, other) = (
        crate::sentinel::connect(&set).await,
        crate::sentinel::connect(&set).await,
    );
    let a = one.acquire("family:sentinel", &permits(2)).await.unwrap();
    let b = other.acquire("family:sentinel", &permits(2)).await.unwrap();
    assert!(
        other
            .try_acquire("family:sentinel", &permits(2))
            .await
            .unwrap()
            .is_none(),
        "two permits, both taken"
    );
    // A waiter is handed the permit a release gives back.
    let waiter = tokio::spawn(async move { other.acquire("family:sentinel", &permits(2)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    a.release().await.unwrap();
    let c = waiter.await.unwrap().expect("handed the permit");
    b.release().await.unwrap();
    c.release().await.unwrap();

    let read = LockOptions::new().mode(LockMode::Read);
    let r1 = one.acquire("family:sentinel:rw", &read).await.unwrap();
    let r2 = one.acquire("family:sentinel:rw", &read).await.unwrap();
    assert!(one
        .try_acquire("family:sentinel:rw", &LockOptions::new())
        .await
        .unwrap()
        .is_none());
    r1.release().await.unwrap();
    r2.release().await.unwrap();
}
