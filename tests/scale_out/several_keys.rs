//! Several keys at once on a Redis Cluster: names that share a slot are taken by one script
//! (one token in every key); names across slots are taken one by one in the order of their
//! keys, so opposite orders never deadlock, and what was taken is given back when the rest
//! cannot be had within the timeout.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{LockError, LockOptions};
use test_support::RedisCluster;

use crate::cluster::{cluster_manager, shared_cluster};

/// Three names whose lock keys live on three different masters, sorted by full key.
fn names_across_slots(cluster: &RedisCluster, prefix: &str) -> Vec<String> {
    let mut found: Vec<(u16, String)> = Vec::new();
    for i in 0..500 {
        let name = format!("{prefix}{i}");
        let port = cluster.node_for_key(&format!("lock:{name}")).port();
        if !found.iter().any(|(other, _)| *other == port) {
            found.push((port, name));
        }
        if found.len() == 3 {
            break;
        }
    }
    assert_eq!(found.len(), 3, "no name found on some master");
    let mut names: Vec<String> = found.into_iter().map(|(_, name)| name).collect();
    names.sort_by(|a, b| format!("lock:{a}").cmp(&format!("lock:{b}")));
    names
}

fn options(timeout: Duration) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(10))
        .timeout(timeout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_slots_what_was_taken_is_given_back_when_the_rest_times_out() {
    let cluster = shared_cluster();
    let names = names_across_slots(cluster, "sk:giveback:");
    let manager = cluster_manager(&cluster.urls()).await;
    let other = cluster_manager(&cluster.urls()).await;
    // The last key in canonical order is held: the first two are taken before it.
    let last = other
        .acquire(&names[2], &options(Duration::ZERO))
        .await
        .expect("free");
    // The caller's order is not the canonical one: the order taken does not depend on it.
    let callers_order = [&names[2], &names[0], &names[1]];
    let waiting = tokio::spawn({
        let manager = manager.clone();
        let callers_order = callers_order.map(String::clone);
        async move {
            manager
                .acquire_all(&callers_order, &options(Duration::from_millis(1500)))
                .await
        }
    });
    test_support::eventually(
        Duration::from_secs(5),
        "the first keys in canonical order are taken while the last is waited for",
        || {
            cluster.exists(&format!("lock:{}", names[0]))
                && cluster.exists(&format!("lock:{}", names[1]))
        },
    )
    .await;
    let timed_out = waiting.await.unwrap().expect_err("the last key stays held");
    assert!(
        matches!(&timed_out, LockError::Timeout { key, .. } if *key == format!("lock:{}", names[2])),
        "{timed_out:?}"
    );
    for name in &names[..2] {
        assert!(
            !cluster.exists(&format!("lock:{name}")),
            "{name} was given back when the rest timed out"
        );
    }
    // One attempt that finds the last held takes nothing either.
    assert!(manager
        .try_acquire_all(&callers_order, &options(Duration::ZERO))
        .await
        .unwrap()
        .is_none());
    for name in &names[..2] {
        assert!(!cluster.exists(&format!("lock:{name}")));
    }
    last.release().await.unwrap();
    let guard = manager
        .acquire_all(&callers_order, &options(Duration::from_secs(5)))
        .await
        .expect("every key free now");
    assert_eq!(
        guard.keys(),
        callers_order.map(|name| format!("lock:{name}")),
        "the keys in the caller's order"
    );
    assert!(guard.is_held().await.unwrap());
    guard.extend(Duration::from_secs(20)).await.unwrap();
    guard.release().await.unwrap();
    for name in &names {
        assert!(!cluster.exists(&format!("lock:{name}")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_slots_opposite_orders_never_deadlock() {
    let cluster = shared_cluster();
    let names = names_across_slots(cluster, "sk:opposite:");
    let pair = Arc::new(Mutex::new((0_u32, 0_u32)));
    let mut tasks = Vec::new();
    for client in 0..2 {
        let manager = cluster_manager(&cluster.urls()).await;
        for task in 0..3 {
            let (manager, pair) = (manager.clone(), Arc::clone(&pair));
            let mut order = names.clone();
            if (client + task) % 2 == 1 {
                order.reverse();
            }
            tasks.push(tokio::spawn(async move {
                for _ in 0..8 {
                    let guard = manager
                        .acquire_all(&order, &options(Duration::from_secs(60)))
                        .await
                        .expect("no deadlock");
                    let (first, second) = *pair.lock().unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    *pair.lock().unwrap() = (first + 1, second + 1);
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("no deadlock")
            .unwrap();
    }
    assert_eq!(*pair.lock().unwrap(), (48, 48), "an update was lost");
}

#[tokio::test]
async fn names_sharing_a_slot_are_taken_by_one_script() {
    let cluster = shared_cluster();
    let manager = cluster_manager(&cluster.urls()).await;
    let names = ["sk:{bank}:1", "sk:{bank}:2", "sk:{bank}:3"];
    let guard = manager
        .acquire_all(&names, &options(Duration::from_secs(5)))
        .await
        .unwrap();
    // One script wrote one value into every key; taken one by one each would have its own.
    for name in names {
        assert_eq!(
            cluster.get(&format!("lock:{name}")).as_deref(),
            Some(guard.token()),
            "{name} holds the one token"
        );
    }
    let other = cluster_manager(&cluster.urls()).await;
    assert!(other
        .try_acquire_all(&["sk:{bank}:3", "sk:{bank}:9"], &options(Duration::ZERO))
        .await
        .unwrap()
        .is_none());
    assert!(!cluster.exists("lock:sk:{bank}:9"), "nothing taken");
    guard.release().await.unwrap();
    for name in names {
        assert!(!cluster.exists(&format!("lock:{name}")));
    }
}

/// On Redlock the keys are taken one by one in key order, each a Redlock lock: all or none,
/// and opposite orders without deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redlock_each_key_is_a_majority_lock_taken_in_key_order() {
    let servers = test_support::RedisServers::start(3);
    let connect = || async {
        distlock::LockManager::redlock_builder(&servers.urls())
            .connect()
            .await
            .expect("a Redlock manager")
    };
    let (manager, other) = (connect().await, connect().await);
    let names = ["sk:redlock:a", "sk:redlock:b"];
    let held = other
        .acquire("sk:redlock:b", &options(Duration::ZERO))
        .await
        .unwrap();
    assert!(manager
        .try_acquire_all(&names, &options(Duration::ZERO))
        .await
        .unwrap()
        .is_none());
    let timed_out = manager
        .acquire_all(&names, &options(Duration::from_millis(300)))
        .await
        .expect_err("b stays held");
    assert!(
        matches!(timed_out, LockError::Timeout { .. }),
        "{timed_out:?}"
    );
    assert!(
        servers.holders("lock:sk:redlock:a").is_empty(),
        "a was given back on every master"
    );
    held.release().await.unwrap();

    let pair = Arc::new(Mutex::new(0_u32));
    let tasks: Vec<_> = [manager, other]
        .into_iter()
        .enumerate()
        .map(|(index, manager)| {
            let pair = Arc::clone(&pair);
            let mut order = names;
            if index == 1 {
                order.reverse();
            }
            tokio::spawn(async move {
                for _ in 0..10 {
                    let guard = manager
                        .acquire_all(&order, &options(Duration::from_secs(30)))
                        .await
                        .expect("no deadlock");
                    assert_eq!(guard.keys().len(), 2);
                    let seen = *pair.lock().unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    *pair.lock().unwrap() = seen + 1;
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(90), task)
            .await
            .expect("no deadlock")
            .unwrap();
    }
    assert_eq!(*pair.lock().unwrap(), 20, "an update was lost");
}

/// A name held as a semaphore among several keys is `Config` with nothing left taken, and a
/// name held by readers is busy (the keys are write locks): in one slot and across slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_use_among_several_keys_in_one_slot_and_across_slots() {
    let cluster = shared_cluster();
    let manager = cluster_manager(&cluster.urls()).await;
    let other = cluster_manager(&cluster.urls()).await;
    let across = names_across_slots(cluster, "sk:uses:");
    let one_slot: Vec<String> = (0..3).map(|i| format!("sk:uses:{{tag}}:{i}")).collect();
    for names in [across, one_slot] {
        let (free, used) = (&names[..2], &names[2]);
        let all = [&free[0], &free[1], used];
        let permit = other
            .acquire(used, &LockOptions::new().permits(2))
            .await
            .unwrap();
        let waited = manager
            .acquire_all(&all, &options(Duration::from_secs(5)))
            .await;
        assert!(
            matches!(&waited, Err(LockError::Config(message)) if message.contains("semaphore")),
            "{all:?}: {:?}",
            waited.map(|guard| guard.keys().len())
        );
        permit.release().await.unwrap();

        let reader = other
            .acquire(used, &LockOptions::new().mode(distlock::LockMode::Read))
            .await
            .unwrap();
        let waited = manager
            .acquire_all(&all, &options(Duration::from_millis(500)))
            .await;
        assert!(
            matches!(&waited, Err(LockError::Timeout { .. })),
            "{all:?}: {:?}",
            waited.map(|guard| guard.keys().len())
        );
        reader.release().await.unwrap();
        for name in free {
            let probe = other
                .try_acquire(name, &options(Duration::ZERO))
                .await
                .unwrap()
                .expect("nothing was left taken");
            probe.release().await.unwrap();
        }
    }
}

/// Across slots each name is a lock of its own (a part of the guard): a lone `acquire` of any
/// of them inside the guard's scope re-enters that lock at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_slots_a_lone_acquire_of_any_name_held_is_re_entered() {
    let cluster = shared_cluster();
    let names = names_across_slots(cluster, "sk:reenter:");
    let manager = cluster_manager(&cluster.urls()).await;
    let other = cluster_manager(&cluster.urls()).await;
    let outer = manager
        .acquire_all(&names, &options(Duration::from_secs(8)))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let seen = outer
        .scope(async {
            let mut seen = Vec::new();
            for name in names.iter().rev() {
                let inner = manager
                    .acquire(name, &options(Duration::from_secs(8)))
                    .await
                    .expect("re-entered");
                seen.push(inner.key().to_owned());
                inner.release().await.expect("releases nothing");
            }
            seen
        })
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "no wait for the task's own locks: {:?}",
        started.elapsed()
    );
    let expected: Vec<String> = names
        .iter()
        .rev()
        .map(|name| format!("lock:{name}"))
        .collect();
    assert_eq!(seen, expected);
    for name in &names {
        assert!(
            other
                .try_acquire(name, &options(Duration::ZERO))
                .await
                .unwrap()
                .is_none(),
            "{name}: still held by the outer guard"
        );
    }
    outer.release().await.unwrap();
}

/// An acquisition across slots dropped at any point of its wait (before its first key, between
/// keys, while it waits for the last) leaves nothing taken: once the last key's holder lets
/// go, another manager takes all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_slots_a_cancelled_acquisition_leaves_nothing_taken() {
    let cluster = shared_cluster();
    let manager = cluster_manager(&cluster.urls()).await;
    let other = cluster_manager(&cluster.urls()).await;
    for cut in [0u64, 1, 5, 20, 100, 400] {
        let names = names_across_slots(cluster, &format!("sk:cancel{cut}:"));
        let last = other
            .acquire(&names[2], &options(Duration::ZERO))
            .await
            .unwrap();
        let cancelled = tokio::time::timeout(
            Duration::from_millis(cut),
            manager.acquire_all(&names, &options(Duration::from_secs(20))),
        )
        .await;
        assert!(
            cancelled.is_err(),
            "cut {cut}: the acquisition cannot finish while the last key is held"
        );
        last.release().await.unwrap();
        let started = std::time::Instant::now();
        loop {
            if let Some(guard) = other
                .try_acquire_all(&names, &options(Duration::ZERO))
                .await
                .unwrap()
            {
                guard.release().await.unwrap();
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "cut {cut}: never free; {:?}",
                names
                    .iter()
                    .map(|n| cluster
                        .node_for_key(&format!("lock:{n}"))
                        .get(&format!("lock:{n}")))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
