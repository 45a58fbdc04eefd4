//! Interleavings of the line protocol that break a documented promise (attack-1).

use std::time::{Duration, Instant};

use distlock::{LockError, LockManager, LockOptions};
use test_support::ProxiedCluster;

fn line(node: &test_support::RedisServer, key: &str) -> Vec<String> {
    redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query(&mut node.conn())
        .unwrap()
}

/// A join whose reply was lost on a cluster connection (which sends the command again) puts
/// two entries for one waiter in line; the waiter's leaving takes out one. The other is handed
/// the lock at the next release, though its waiter is gone.
///
/// 1. A holds the lock (one-node cluster behind a proxy).
/// 2. B's first try finds it held; B joins with the acquire script (`join`): the script runs,
///    the proxy drops its reply and the connection, redis-rs sends it again: it runs again,
///    and `RPUSH`es a second entry for B's token.
/// 3. B times out (2 s) and leaves the line: `find` + `LREM 1` take out one entry.
/// 4. The line still holds B's other entry (its lease runs 3 s from the join); A releases and
///    the lock goes to B's token, which nobody holds, for the 3 s claim.
///
/// docs/protocol.md: "A waiter that times out or whose future is dropped leaves the line at
/// once"; docs/reliability.md: a command re-sent after its reply was lost "is answered as if it
/// ran once".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_sent_join_leaves_a_second_entry_that_outlives_the_waiters_leaving() {
    let cluster = ProxiedCluster::start();
    let node = cluster.node();
    let connect = || async {
        LockManager::cluster_builder(&cluster.urls())
            .connect()
            .await
            .unwrap()
    };
    let (a, b) = (connect().await, connect().await);
    let options = LockOptions::new()
        .ttl(Duration::from_secs(20))
        .timeout(Duration::from_secs(2));

    // Load the acquire script (a join), so that the armed request is the script's run and not
    // an EVALSHA answered NOSCRIPT.
    let warm = a.acquire("warm", &options).await.unwrap();
    let Err(LockError::Timeout { .. }) = b.acquire("warm", &options).await else {
        panic!("warm-up: b must time out");
    };
    warm.release().await.unwrap();

    let held = a.acquire("resend:line", &options).await.unwrap();
    node.reset_stats();
    cluster.proxy().lose_next_reply_to("join");
    let waited = b.acquire("resend:line", &options).await;
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "b times out: {waited:?}"
    );
    assert_eq!(cluster.proxy().replies_lost(), 1, "the join's reply was lost");
    // Its leaving runs in the background: give it time to land.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let line_key = "{lock:resend:line}:distlock:line";
    let left_behind = line(node, line_key);
    let released_at = Instant::now();
    held.release().await.unwrap();
    let holder = node.get("lock:resend:line");
    let pttl = node.pttl("lock:resend:line");
    assert!(
        left_behind.is_empty() && holder.is_none(),
        "b timed out and left the line, yet the line still holds {left_behind:?}; {:?} after \
         a's release the lock is held by {holder:?} (b's token?) for {pttl} ms more, and nobody \
         holds that token",
        released_at.elapsed()
    );
}
