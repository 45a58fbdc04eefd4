//! `test_support::keys` names the helper keys that a real lock creates: the mirror of
//! lock-runtime's key format is checked against a real server, so that a change of the format
//! fails here, by name, rather than as a mystery in the tests that use the names.

use std::time::Duration;

use distlock::{LockManager, LockOptions};
use test_support::{keys, wait_until, RedisServer};

/// For a plain lock key (its own tag) and a hash-tagged one (a tag inside it): a fenced holder
/// makes the fencing counter, a waiter makes the line, the waiter once granted makes `since`,
/// and a force-release makes `forced` — each under the name `test_support::keys` gives. (Two
/// worker threads: `wait_until` blocks one while the waiter runs on the other.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helper_key_names_match_the_keys_a_real_lock_creates() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.expect("connect");
    // A waiter in the holder's own manager waits in process; only another manager's waits in
    // the Redis line.
    let other = LockManager::connect(&server.url()).await.expect("connect");
    let fenced = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(30))
        .fencing(true);
    for name in ["pinned", "{user:7}:cart"] {
        let lock = format!("{}{name}", manager.key_prefix());
        let helpers = keys::of(lock.clone());
        assert_eq!(
            keys::named(name).lock(),
            lock,
            "the default prefix is `lock:`"
        );
        let holder = manager.acquire(name, &fenced).await.expect("free");
        assert_eq!(holder.key(), lock);
        assert!(server.exists(&helpers.fence()), "{}", helpers.fence());

        let waiter = {
            let (other, fenced) = (other.clone(), fenced.clone());
            tokio::spawn(async move { other.acquire(name, &fenced).await })
        };
        let line = helpers.line();
        wait_until(Duration::from_secs(10), &format!("{line} to exist"), || {
            server.exists(&line)
        });
        holder.release().await.expect("release");
        let waiter = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter is granted the lock")
            .unwrap()
            .expect("acquire");
        assert!(server.exists(&helpers.since()), "{}", helpers.since());
        assert!(
            server.keys(&helpers.all()).contains(&helpers.fence()),
            "{} matches {}",
            helpers.all(),
            helpers.fence()
        );

        let info = manager.inspect(name).await.expect("inspect").expect("held");
        assert!(manager.force_release(&info).await.expect("force-release"));
        assert!(server.exists(&helpers.forced()), "{}", helpers.forced());
        assert!(
            server
                .keys(&keys::every("forced"))
                .contains(&helpers.forced()),
            "{} matches {}",
            keys::every("forced"),
            helpers.forced()
        );
        drop(waiter);
    }
}
