//! The fleet's record of lock orders beyond one server: on a Redis Cluster it is one key in one
//! slot, on Redlock each master keeps one and `orders` reads them together. Each test installs
//! the global manager, so it runs in a process of its own.

use std::time::Duration;

use distlock::{distributed_lock, LockError, LockManager, LockOrder};
use test_support::{RedisCluster, RedisServers};

/// The record of the default key prefix.
const ORDERS_KEY: &str = "{lock:}:distlock:orders";

#[distributed_lock(key = "scaled-invoice:{id}", ttl = 10)]
async fn charge(id: u32) -> Result<(), LockError> {
    debit(id).await
}

#[distributed_lock(key = "scaled-account:{id}", ttl = 10)]
async fn debit(id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "scaled-account:{id}", ttl = 10)]
async fn refund(id: u32) -> Result<(), LockError> {
    credit(id).await
}

#[distributed_lock(key = "scaled-invoice:{id}", ttl = 10)]
async fn credit(id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

/// Takes the two templates both ways through the global manager, and waits until `manager`'s
/// record lists both orders (written in the background).
async fn both_ways_recorded(manager: &LockManager) -> Vec<LockOrder> {
    charge(1).await.unwrap();
    refund(1).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let orders = manager.orders().await.expect("the record of orders");
        if orders.len() == 2 {
            assert!(orders[0].is_opposite(&orders[1]), "{orders:?}");
            assert_eq!(orders[0].first, "scaled-account:{id}");
            assert_eq!(orders[0].holder, "scale_out::lock_order::refund");
            assert_eq!(orders[1].taker, "scale_out::lock_order::debit");
            return orders;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "both orders not recorded: {orders:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_record_is_one_key_in_its_slot() {
    if !test_support::in_own_process(
        module_path!(),
        "on_a_cluster_the_record_is_one_key_in_its_slot",
    ) {
        return;
    }
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
        .await
        .unwrap();
    let manager = LockManager::cluster_builder(&cluster.urls())
        .connect()
        .await
        .unwrap();
    distlock::init_with(manager.clone()).unwrap();
    both_ways_recorded(&manager).await;
    assert!(cluster.node_for_key(ORDERS_KEY).exists(ORDERS_KEY));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redlock_every_master_keeps_the_record() {
    if !test_support::in_own_process(module_path!(), "on_redlock_every_master_keeps_the_record") {
        return;
    }
    let servers = RedisServers::start(3);
    let manager = LockManager::redlock_builder(&servers.urls())
        .connect()
        .await
        .unwrap();
    distlock::init_with(manager.clone()).unwrap();
    both_ways_recorded(&manager).await;
    for server in servers.iter() {
        let len: usize = redis::cmd("HLEN")
            .arg(ORDERS_KEY)
            .query(&mut server.conn())
            .unwrap();
        assert_eq!(len, 2, "the record on {}", server.url());
    }
    // One master's record is enough to read them all.
    servers[0].del(ORDERS_KEY);
    servers[1].del(ORDERS_KEY);
    assert_eq!(manager.orders().await.unwrap().len(), 2);
}
