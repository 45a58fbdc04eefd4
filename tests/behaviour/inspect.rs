//! Who holds a lock: `LockManager::inspect` and `LockManager::list` on a standalone server, a
//! cluster and a Redlock set — the holder that the lock's value names (host, pid, label, since),
//! time left, waiters in line and the fencing counter — and locks that distlock did not write.

use std::collections::BTreeSet;
use std::pin::pin;
use std::time::{Duration, SystemTime};

use distlock::{LockError, LockInfo, LockManager, LockOptions};
use futures_util::StreamExt;
use test_support::{eventually, keys, RedisCluster, RedisServer, RedisServers};

async fn names(manager: &LockManager, pattern: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut locks = pin!(manager.list(pattern));
    while let Some(info) = locks.next().await {
        let info = info.unwrap_or_else(|error| panic!("list({pattern:?}): {error}"));
        assert!(
            found.insert(info.name.clone()),
            "{} listed twice",
            info.name
        );
    }
    found
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|name| (*name).to_owned()).collect()
}

async fn inspect(manager: &LockManager, name: &str) -> LockInfo {
    manager
        .inspect(name)
        .await
        .unwrap_or_else(|error| panic!("inspect({name:?}): {error}"))
        .unwrap_or_else(|| panic!("{name:?} is held but inspect found it free"))
}

/// Holder, ttl, waiters and fence of one lock, checked through hand-offs to two waiters, each
/// with a manager of its own (tasks sharing a manager queue in the process, behind one waiter
/// in Redis).
async fn holder_waiters_and_fence(manager: &LockManager, others: [LockManager; 2], name: &str) {
    let before = SystemTime::now() - Duration::from_secs(1);
    let options = LockOptions::new()
        .ttl(Duration::from_secs(20))
        .fencing(true)
        .label("jobs::nightly report:{day}");
    let guard = manager.acquire(name, &options).await.unwrap();
    let info = inspect(manager, name).await;
    assert_eq!(info.name, name);
    assert_eq!(info.key, guard.key());
    let holder = info.holder.clone().expect("distlock wrote this lock");
    assert_eq!(holder.label, "jobs::nightly report:{day}");
    assert_eq!(holder.pid, std::process::id());
    assert!(!holder.host.is_empty());
    assert!(
        holder.since >= before && holder.since <= SystemTime::now(),
        "{holder:?}"
    );
    let left = info.ttl_left.expect("the lock has a ttl");
    assert!(
        left > Duration::from_secs(10) && left <= Duration::from_secs(20),
        "{left:?}"
    );
    assert_eq!(info.waiters, 0);
    assert_eq!(info.fence, guard.fencing_token());

    // Two waiters, one with a label that a line entry could choke on (spaces, `;`, a newline).
    let hostile = "a b;c\nd %20 é";
    let waiters: Vec<_> = [hostile, "second"]
        .into_iter()
        .zip(others)
        .map(|(label, manager)| {
            let name = name.to_owned();
            let options = options
                .clone()
                .label(label)
                .timeout(Duration::from_secs(30));
            tokio::spawn(async move {
                let guard = manager.acquire(&name, &options).await?;
                let info = manager.inspect(&name).await?;
                guard.release().await?;
                Ok::<_, LockError>(info)
            })
        })
        .collect();
    test_support::waiting_in_line(manager, name, 2).await;
    let first_fence = guard.fencing_token();
    guard.release().await.unwrap();
    let mut labels = BTreeSet::new();
    for waiter in waiters {
        let info = waiter
            .await
            .unwrap()
            .unwrap()
            .expect("held while inspected");
        labels.insert(info.holder.expect("written by distlock").label);
        assert!(
            info.fence > first_fence,
            "{:?} after {first_fence:?}",
            info.fence
        );
    }
    assert_eq!(
        labels,
        set(&[hostile, "second"]),
        "labels read back exactly"
    );
    assert!(
        manager.inspect(name).await.unwrap().is_none(),
        "free after the last release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_holder_ttl_waiters_and_fence_on_a_server() {
    let server = RedisServer::start();
    let url = server.url();
    let connect = || LockManager::connect(&url);
    let others = [connect().await.unwrap(), connect().await.unwrap()];
    holder_waiters_and_fence(&connect().await.unwrap(), others, "report:2026-12-01").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_without_a_label_shows_its_name_and_a_hand_written_lock_no_holder() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let guard = manager.acquire("plain", &LockOptions::new()).await.unwrap();
    assert_eq!(
        inspect(&manager, "plain").await.holder.unwrap().label,
        "plain"
    );
    guard.release().await.unwrap();

    server.set_px("lock:by-hand", "hand-written-token", 30_000);
    let info = inspect(&manager, "by-hand").await;
    assert_eq!(info.holder, None);
    assert_eq!(info.waiters, 0);
    assert!(info.ttl_left.unwrap() > Duration::from_secs(20));
    // Inspecting wrote nothing: the hand-written lock is as it was.
    assert_eq!(
        server.get("lock:by-hand").as_deref(),
        Some("hand-written-token")
    );
    server.set("lock:forever", "x");
    assert_eq!(inspect(&manager, "forever").await.ttl_left, None);
    assert!(manager.inspect("nobody").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_label_is_cut_and_costs_a_bounded_value() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let huge = "🔒".repeat(100_000);
    let guard = manager
        .acquire("huge", &LockOptions::new().label(huge.as_str()))
        .await
        .unwrap();
    let label = inspect(&manager, "huge").await.holder.unwrap().label;
    assert!(
        huge.starts_with(&label) && !label.is_empty() && label.len() <= 200,
        "{}",
        label.len()
    );
    assert!(server.get("lock:huge").unwrap().len() < 2_000);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_scans_for_matching_locks_and_skips_helper_keys() {
    let server = RedisServer::start();
    // An empty prefix: the helper keys (line, fence) lie in the same keyspace as the locks.
    let bare = LockManager::builder(server.url())
        .key_prefix("")
        .connect()
        .await
        .unwrap();
    let fenced = LockOptions::new().fencing(true);
    let held: Vec<_> = ["job:a", "job:b", "other:c"]
        .iter()
        .map(|name| bare.acquire(name, &fenced))
        .collect();
    let mut guards = Vec::new();
    for guard in held {
        guards.push(guard.await.unwrap());
    }
    // A waiter puts a line key beside job:a.
    let other = LockManager::builder(server.url())
        .key_prefix("")
        .connect()
        .await
        .unwrap();
    let waiter = tokio::spawn({
        async move {
            other
                .acquire(
                    "job:a",
                    &LockOptions::new().timeout(Duration::from_secs(20)),
                )
                .await
        }
    });
    eventually(Duration::from_secs(10), "a line key", || {
        server.exists(&keys::of("job:a").line())
    })
    .await;
    let _ = redis::cmd("LPUSH")
        .arg("job:list")
        .arg("x")
        .query::<i64>(&mut server.conn());
    assert_eq!(names(&bare, "job:*").await, set(&["job:a", "job:b"]));
    assert_eq!(names(&bare, "*").await, set(&["job:a", "job:b", "other:c"]));
    assert_eq!(names(&bare, "nothing*").await, set(&[]));

    // A prefix with glob characters is taken literally.
    let odd = LockManager::builder(server.url())
        .key_prefix("[x]*:")
        .connect()
        .await
        .unwrap();
    let odd_guard = odd.acquire("q", &LockOptions::new()).await.unwrap();
    server.set("x*:decoy", "not under the prefix");
    assert_eq!(names(&odd, "*").await, set(&["q"]));
    odd_guard.release().await.unwrap();

    for guard in guards {
        guard.release().await.unwrap();
    }
    waiter.await.unwrap().unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_walks_more_keys_than_one_scan_step() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let mut expected = BTreeSet::new();
    let mut guards = Vec::new();
    for i in 0..1500 {
        let name = format!("many:{i}");
        guards.push(manager.acquire(&name, &LockOptions::new()).await.unwrap());
        expected.insert(name);
    }
    assert_eq!(names(&manager, "many:*").await, expected);
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert_eq!(names(&manager, "many:*").await, set(&[]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_list_on_a_cluster_cover_every_master() {
    let cluster = RedisCluster::start(3, 0);
    let connect = || LockManager::cluster_builder(&cluster.urls()).connect();
    let others = [connect().await.unwrap(), connect().await.unwrap()];
    let manager = connect().await.unwrap();
    holder_waiters_and_fence(&manager, others, "report:{cluster}").await;

    let mut expected = BTreeSet::new();
    let mut masters = BTreeSet::new();
    let mut guards = Vec::new();
    for i in 0..30 {
        let name = format!("spread:{i}");
        guards.push(manager.acquire(&name, &LockOptions::new()).await.unwrap());
        masters.insert(cluster.node_for_key(&format!("lock:{name}")).port());
        expected.insert(name);
    }
    assert_eq!(masters.len(), 3, "the locks lie on every master");
    assert_eq!(names(&manager, "spread:*").await, expected);
    for guard in guards {
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_shows_a_lock_held_by_a_majority_once() {
    let servers = RedisServers::start(3);
    let manager = LockManager::redlock_builder(&servers.urls())
        .connect()
        .await
        .unwrap();
    let guard = manager
        .acquire("quorum:1", &LockOptions::new().label("q"))
        .await
        .unwrap();
    let info = inspect(&manager, "quorum:1").await;
    assert_eq!(info.holder.unwrap().label, "q");
    assert_eq!(info.waiters, 0);
    assert_eq!(names(&manager, "quorum:*").await, set(&["quorum:1"]));
    guard.release().await.unwrap();
    assert!(manager.inspect("quorum:1").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_process_backend_shows_its_holders_too() {
    let manager = LockManager::in_process();
    let other = LockManager::in_process();
    let guard = manager
        .acquire(
            "mem:[1]",
            &LockOptions::new().label("in process").fencing(true),
        )
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        other
            .acquire(
                "mem:[1]",
                &LockOptions::new().timeout(Duration::from_secs(20)),
            )
            .await
    });
    test_support::waiting_in_line(&manager, "mem:[1]", 1).await;
    let info = inspect(&manager, "mem:[1]").await;
    let holder = info.holder.unwrap();
    assert_eq!(
        (holder.label.as_str(), holder.pid),
        ("in process", std::process::id())
    );
    assert_eq!(info.fence, guard.fencing_token());
    assert!(info.ttl_left.unwrap() > Duration::from_secs(20));
    let second = manager.acquire("mem:2", &LockOptions::new()).await.unwrap();
    assert_eq!(names(&manager, "mem:*").await, set(&["mem:2", "mem:[1]"]));
    assert_eq!(names(&manager, "mem:\\[*").await, set(&["mem:[1]"]));
    assert_eq!(names(&manager, "mem:[0-9]").await, set(&["mem:2"]));
    guard.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
    second.release().await.unwrap();
    assert!(manager.inspect("mem:[1]").await.unwrap().is_none());
}

/// A key the scan found as a string and that holds another type by the time it is looked at
/// (with an empty prefix, an application's key is recreated as a hash) is no lock, as the
/// scan's `TYPE string` says: the walk skips it instead of ending on `WRONGTYPE`.
///
/// Clock-free: the first item is taken (the scan step has found all three keys, which sit
/// queued for a look), the other two change type, then the walk goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_skips_a_key_that_changed_type_after_the_scan_found_it() {
    let server = RedisServer::start();
    let bare = LockManager::builder(server.url())
        .key_prefix("")
        .connect()
        .await
        .unwrap();
    for key in ["churn:a", "churn:b", "churn:c"] {
        server.set(key, "plain string");
    }
    let mut found = pin!(bare.list("churn:*"));
    let first = found.next().await.unwrap().unwrap().name;
    for key in ["churn:a", "churn:b", "churn:c"] {
        if key != first {
            let () = redis::cmd("DEL")
                .arg(key)
                .query(&mut server.conn())
                .unwrap();
            let _: i64 = redis::cmd("HSET")
                .arg(key)
                .arg("field")
                .arg("value")
                .query(&mut server.conn())
                .unwrap();
        }
    }
    let rest: Vec<_> = found.collect().await;
    assert!(
        rest.iter().all(Result::is_ok),
        "the walk ended on a key that is no longer a string: {rest:?}"
    );
    assert!(rest.is_empty(), "{rest:?}");
    // Asked for by name, such a key is an error still: it is not a lock.
    let changed = if first == "churn:a" {
        "churn:b"
    } else {
        "churn:a"
    };
    assert!(bare.inspect(changed).await.is_err());
}

/// A lock whose slot moves to another master while `list` walks the cluster is shown once:
/// found on the master it left, then again on the master it reached, if that master is
/// scanned later. Clock-free: the lock is taken from the stream (its first master is
/// scanned), its slot moves, then the walk goes on. Which master is scanned last is not
/// known, so every move between two masters is tried, and none may show it twice — each on a
/// cluster of its own, so that no move follows many others: a quick series of slot moves is
/// more than every server version's cluster settles reliably, and not what this tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_a_lock_once_when_its_slot_moves_during_the_walk() {
    for from in 0..3 {
        for to in (0..3).filter(|&to| to != from) {
            list_shows_a_lock_once_when_its_slot_moves(from, to).await;
        }
    }
}

/// One move of the lock's slot from `masters()[from]` to `masters()[to]` during a walk.
async fn list_shows_a_lock_once_when_its_slot_moves(from: usize, to: usize) {
    let cluster = RedisCluster::start(3, 0);
    let manager = LockManager::cluster_builder(&cluster.urls())
        .connect()
        .await
        .unwrap();
    let guard = manager
        .acquire("moving", &LockOptions::new().ttl(Duration::from_secs(300)))
        .await
        .unwrap();
    // The harness numbers the masters it sees healthy; on a loaded machine a node can look
    // failing for a moment, which would shift the numbering, so each step waits for all three.
    let all_three = || {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            let masters = cluster.masters();
            if masters.len() == 3 {
                return masters.iter().map(|m| m.port()).collect::<Vec<_>>();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "a master stayed failing"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // Which of the three masters serves the slot, by its own account.
    let home = cluster.owner_of_key("lock:moving").port();
    if all_three().iter().position(|&port| port == home) != Some(from) {
        cluster.migrate_slot_of("lock:moving", from);
    }
    let mut found = pin!(manager.list("moving"));
    let first = found.next().await.unwrap().unwrap();
    assert_eq!(first.name, "moving");
    all_three();
    cluster.migrate_slot_of("lock:moving", to);
    let rest: Vec<_> = found.map(|info| info.unwrap().name).collect().await;
    assert!(
        rest.is_empty(),
        "moved from master {from} to {to} during the walk, shown again: {rest:?}"
    );
    guard.release().await.unwrap();
}

/// A lock whose value is not text was not written by distlock: breaking it is refused, with
/// a message that reads as one sentence (no stray run of blanks from a broken line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_refuses_a_value_that_is_not_text_in_plain_words() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let () = redis::cmd("SET")
        .arg("lock:binary")
        .arg(&b"\xff\xfe"[..])
        .query(&mut server.conn())
        .unwrap();
    let info = inspect(&manager, "binary").await;
    assert_eq!(info.holder, None);
    let error = manager.force_release(&info).await.unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, LockError::Config(_)), "{text}");
    assert!(text.contains("redis-cli DEL"), "{text}");
    assert!(!text.contains("  "), "a run of blanks in: {text:?}");
    assert_eq!(server.keys("lock:binary").len(), 1, "left as it was");
}

/// The same for a semaphore's permits and for readers: a lease whose value is not text was not
/// written by distlock, and breaking the lock is refused saying to delete it by hand, not
/// answered "changed hands since it was read" (which running the command again would repeat).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_refuses_a_lease_that_is_not_text_in_plain_words() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let read = LockOptions::new().mode(distlock::LockMode::Read);
    for (name, options) in [
        ("binary:permits", LockOptions::new().permits(2)),
        ("binary:read", read),
    ] {
        let guard = manager.acquire(name, &options).await.unwrap();
        let () = redis::cmd("ZADD")
            .arg(format!("lock:{name}"))
            .arg(in_ten_minutes_ms())
            .arg(&b"\xff\xfe"[..])
            .query(&mut server.conn())
            .map(|_: i64| ())
            .unwrap();
        guard.release().await.unwrap();
        let info = inspect(&manager, name).await;
        assert!(info.holders.is_empty(), "{name}: {info:?}");
        let error = manager.force_release(&info).await.unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, LockError::Config(_)), "{name}: {text}");
        assert!(text.contains("redis-cli DEL"), "{name}: {text}");
        assert!(!text.contains("  "), "a run of blanks in: {text:?}");
        assert_eq!(
            server.keys(&format!("lock:{name}")).len(),
            1,
            "{name}: left as it was"
        );
    }
}

/// Ten minutes from now, in Unix ms: a lease's score.
fn in_ten_minutes_ms() -> u128 {
    (SystemTime::now() + Duration::from_secs(600))
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// A holder that waited shows as held since the grant — the moment the release handed the lock
/// over (Redlock: woke it to take it) — not since it asked; and extensions that keep the lock
/// past the ttl it was granted with keep that record.
async fn since_after_a_wait_survives_extensions(manager: &LockManager, other: LockManager) {
    const NAME: &str = "since:waited";
    let holder = manager.acquire(NAME, &LockOptions::new()).await.unwrap();
    let waiter = tokio::spawn(async move {
        let options = LockOptions::new()
            .ttl(Duration::from_millis(1500))
            .timeout(Duration::from_secs(20));
        other.acquire(NAME, &options).await.unwrap()
    });
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let released = SystemTime::now();
    holder.release().await.unwrap();
    let got = waiter.await.unwrap();
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        got.extend(Duration::from_millis(1500)).await.unwrap();
    }
    let since = inspect(manager, NAME).await.holder.unwrap().since;
    assert!(
        since + Duration::from_millis(2) >= released,
        "held since {:?} before the release that granted it",
        released.duration_since(since).unwrap_or_default()
    );

    // Handed on by a holder that waited in this line itself: its release takes Redis's time as
    // its process knows it from that wait (no `TIME`), close to it but not to the millisecond.
    let next = {
        let manager = manager.clone();
        tokio::spawn(async move {
            let options = LockOptions::new().timeout(Duration::from_secs(20));
            manager.acquire(NAME, &options).await.unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let released = SystemTime::now();
    got.release().await.unwrap();
    let last = next.await.unwrap();
    let since = inspect(manager, NAME).await.holder.unwrap().since;
    assert!(
        since + Duration::from_millis(200) >= released,
        "held since {:?} before the release that granted it",
        released.duration_since(since).unwrap_or_default()
    );
    last.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn since_after_a_wait_is_the_grant_on_a_server_and_on_redlock() {
    let server = RedisServer::start();
    let url = server.url();
    since_after_a_wait_survives_extensions(
        &LockManager::connect(&url).await.unwrap(),
        LockManager::connect(&url).await.unwrap(),
    )
    .await;
    let servers = RedisServers::start(3);
    let redlock = || LockManager::redlock_builder(&servers.urls()).connect();
    since_after_a_wait_survives_extensions(&redlock().await.unwrap(), redlock().await.unwrap())
        .await;
}
