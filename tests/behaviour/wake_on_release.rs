//! Wake-on-release: a waiter sleeps in the lock's line until the holder's release hands it the
//! lock (a pub/sub message on the waiter's grant channel, published only when someone waits),
//! falls back to looking again when no message ever comes, and tasks of one process are served
//! first come, first served.
//!
//! Two `LockManager`s stand for two processes: each has its own connections, its own grant
//! channel and its own in-process queue, so Redis cannot tell them from two processes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{LockManager, LockOptions};
use test_support::{eventually, RedisServer};
use tokio::time::Instant;

async fn connect(server: &RedisServer) -> LockManager {
    LockManager::connect(&server.url())
        .await
        .unwrap_or_else(|error| panic!("cannot connect a lock manager: {error}"))
}

/// The line of the lock `name` (default prefix): it exists while someone waits.
fn line_of(name: &str) -> String {
    format!("{{lock:{name}}}:distlock:line")
}

/// The grant channels subscribed now (one per lock manager with a waiter).
fn grant_channels(server: &RedisServer) -> Vec<String> {
    server
        .pubsub_channels()
        .into_iter()
        .filter(|channel| channel.starts_with("distlock:grants:"))
        .collect()
}

/// Whether someone waits for `name`, in its line and listening on a grant channel.
fn waiting(server: &RedisServer, name: &str) -> bool {
    server.exists(&line_of(name)) && !grant_channels(server).is_empty()
}

/// The ids of the clients in pub/sub mode (`CLIENT LIST TYPE pubsub`).
fn pubsub_client_ids(server: &RedisServer) -> Vec<String> {
    let mut conn = server.conn();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut conn)
        .expect("CLIENT LIST");
    list.lines()
        .filter_map(|line| line.split(' ').find_map(|field| field.strip_prefix("id=")))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_in_another_process_at_once() {
    let server = RedisServer::start();
    let a = connect(&server).await;
    let b = connect(&server).await;
    let long = LockOptions::new().ttl(Duration::from_secs(30));

    let held = a.acquire("w1", &long).await.expect("A takes the free lock");
    let waiter = {
        let options = long.clone().timeout(Duration::from_secs(20));
        let b = b.clone();
        tokio::spawn(async move {
            let guard = b.acquire("w1", &options).await;
            (guard, Instant::now())
        })
    };

    // B listens on its grant channel, and waits in the lock's line.
    eventually(
        Duration::from_secs(5),
        "B to take its place in line, listening",
        || waiting(&server, "w1"),
    )
    .await;

    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "B got the lock while A still held it"
    );
    let released_at = Instant::now();
    held.release().await.expect("A still holds its lock");

    // A's ttl had ~30 s left: B only gets the lock within 3 s if the release woke it.
    let (guard, acquired_at) = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("B was not woken by A's release within 3 s (a ttl fallback would take ~30 s)")
        .expect("the waiter task panicked");
    let guard = guard.expect("B acquires after A's release");
    let handoff = acquired_at - released_at;
    assert!(
        handoff < Duration::from_secs(3),
        "hand-off took {handoff:?}"
    );
    assert_eq!(server.get("lock:w1").as_deref(), Some(guard.token()));
    // Handed over with a short claim, which B confirms to its own 30 s ttl at once.
    eventually(
        Duration::from_secs(2),
        "B's lock to carry B's own 30 s ttl",
        || server.pttl("lock:w1") > 25_000,
    )
    .await;

    // Nobody waits any more: the subscription is dropped (after a short linger).
    eventually(
        Duration::from_secs(2),
        "B to unsubscribe after acquiring",
        || grant_channels(&server).is_empty(),
    )
    .await;
    assert!(
        !server.exists(&line_of("w1")),
        "A's release took B out of the line"
    );
    guard.release().await.expect("B still holds its lock");
    assert!(!server.exists("lock:w1"));
    for manager in [&a, &b] {
        let counts = manager.resource_counts();
        assert_eq!(
            (
                counts.queued_keys,
                counts.watched_channels,
                counts.registered_waiters
            ),
            (0, 0, 0),
            "{counts:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_release_the_waiter_retries_when_the_ttl_runs_out() {
    let server = RedisServer::start();
    let b = connect(&server).await;

    // A holder that never releases: the key is set directly, so no release script ever runs
    // and no wake-up is ever published.
    server.set_px("lock:w2", "holder-that-vanished", 1000);
    let set_at = Instant::now();
    let guard = b
        .acquire("w2", &LockOptions::new().timeout(Duration::from_secs(10)))
        .await
        .expect("B gets the lock once the holder's ttl runs out");
    let waited = set_at.elapsed();
    assert!(
        waited >= Duration::from_millis(800),
        "B got a lock that was still held ({waited:?} after it was set with a 1 s ttl)"
    );
    assert!(
        waited <= Duration::from_secs(5),
        "B waited {waited:?} for a lock whose ttl was 1 s"
    );
    assert_eq!(server.get("lock:w2").as_deref(), Some(guard.token()));
    assert_eq!(
        server.command_count("publish"),
        0,
        "nothing was released, nothing published"
    );
    guard.release().await.expect("B holds it");
}

/// `EVAL script 1 key token [arg]` on a helper connection: a hand-written client's call.
fn eval_by_hand(server: &RedisServer, script: &str, key: &str, args: &[&str]) -> i64 {
    redis::cmd("EVAL")
        .arg(script)
        .arg(1)
        .arg(key)
        .arg(args)
        .query(&mut server.conn())
        .unwrap_or_else(|error| panic!("EVAL on {key} failed: {error}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_written_lock_sharing_the_keys_is_never_disturbed_by_waiters() {
    // A hand-written lock on the same key, as applications wrote before distlock: `SET NX` with its own token, extend and release
    // by comparing `GET` with that token. distlock's waiter must never write into that key.
    let server = RedisServer::start();
    let distlock = connect(&server).await;
    server.set_px("lock:shared", "hand-written-token", 2_000);
    let waiter = {
        let options = LockOptions::new().timeout(Duration::from_secs(20));
        tokio::spawn(async move { distlock.acquire("shared", &options).await })
    };
    eventually(
        Duration::from_secs(5),
        "distlock to wait in line, listening",
        || waiting(&server, "shared"),
    )
    .await;
    assert_eq!(
        server.get("lock:shared").as_deref(),
        Some("hand-written-token"),
        "the waiter wrote into a key it does not hold"
    );
    let extend = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                  return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";
    let release = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                   return redis.call('DEL', KEYS[1]) end return 0";
    assert_eq!(
        eval_by_hand(
            &server,
            extend,
            "lock:shared",
            &["hand-written-token", "2000"]
        ),
        1,
        "the hand-written holder can still extend"
    );
    assert_eq!(
        eval_by_hand(&server, release, "lock:shared", &["hand-written-token"]),
        1,
        "the hand-written holder can still release"
    );
    // Its release hands nothing over: distlock gets the lock when it looks again (its place's
    // renewal every second), at the latest when the holder's 2 s ttl would have run out.
    let guard = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("distlock retried within the holder's ttl")
        .expect("waiter task")
        .expect("distlock acquires");
    assert_eq!(server.get("lock:shared").as_deref(), Some(guard.token()));
    guard.release().await.expect("still ours");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_publishes_only_when_someone_waits() {
    let server = RedisServer::start();
    let a = connect(&server).await;
    let b = connect(&server).await;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(20));

    // Uncontended: nobody waits, so the release publishes nothing.
    let before = server.command_count("publish");
    let guard = a.acquire("p1", &options).await.expect("free lock");
    assert!(!server.exists(&line_of("p1")), "nobody waits, so no line");
    guard.release().await.expect("still ours");
    assert_eq!(
        server.command_count("publish") - before,
        0,
        "an uncontended release published a wake-up"
    );

    // Contended hand-off between two processes: the release publishes.
    let held = a.acquire("p2", &options).await.expect("free lock");
    let waiter = {
        let (b, options) = (b.clone(), options.clone());
        tokio::spawn(async move { b.acquire("p2", &options).await })
    };
    eventually(Duration::from_secs(5), "B to wait in line", || {
        waiting(&server, "p2")
    })
    .await;
    let before = server.command_count("publish");
    held.release().await.expect("still ours");
    let guard = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("B was woken")
        .expect("waiter task")
        .expect("B acquires");
    let published = server.command_count("publish") - before;
    assert!(
        published >= 1,
        "a release with a waiter published {published} wake-ups"
    );

    // B's own release: nobody waits any more, so it publishes nothing.
    let before = server.command_count("publish");
    guard.release().await.expect("still ours");
    assert_eq!(server.command_count("publish") - before, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_one_process_are_served_first_come_first_served() {
    const TASKS: usize = 4;
    const SECTIONS: usize = 10;
    let server = RedisServer::start();
    let manager = connect(&server).await;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(30));

    // Hold the lock while the tasks line up, so that every one of them is waiting before the
    // first section starts (on a loaded machine a task may take a while to be scheduled).
    let gate = manager.acquire("fifo", &options).await.expect("free lock");
    let order = Arc::new(Mutex::new(Vec::new()));
    let ready = Arc::new(tokio::sync::Semaphore::new(0));
    let mut tasks = Vec::new();
    for id in 0..TASKS {
        let (manager, options, order, ready) = (
            manager.clone(),
            options.clone(),
            order.clone(),
            ready.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..SECTIONS {
                let acquire = manager.acquire("fifo", &options);
                ready.add_permits(1);
                let guard = acquire.await.expect("acquire");
                order.lock().unwrap().push(id);
                tokio::time::sleep(Duration::from_millis(2)).await;
                // Released, then at once asked for again: must queue behind the others.
                guard.release().await.expect("release");
            }
        }));
    }
    // Each task signals just before its first acquire; give the last one time to get in line.
    let _ = ready
        .acquire_many(u32::try_from(TASKS).expect("a few tasks"))
        .await
        .expect("open semaphore");
    tokio::time::sleep(Duration::from_millis(300)).await;
    gate.release().await.expect("gate release");
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("all sections finish within 30 s")
            .expect("task panicked");
    }

    let order = order.lock().unwrap().clone();
    assert_eq!(order.len(), TASKS * SECTIONS);
    for id in 0..TASKS {
        let got = order.iter().filter(|&&n| n == id).count();
        assert_eq!(got, SECTIONS, "task {id} got {got} sections: {order:?}");
    }
    for (i, pair) in order.windows(2).enumerate() {
        assert_ne!(
            pair[0],
            pair[1],
            "task {} took sections {i} and {} in a row while others waited: {order:?}",
            pair[0],
            i + 1
        );
    }
    // First come, first served: once everyone is in line, the lock goes round in a fixed order.
    for i in TASKS..order.len() {
        assert_eq!(
            order[i],
            order[i - TASKS],
            "not round-robin at section {i}: {order:?}"
        );
    }
    assert_eq!(manager.resource_counts().queued_keys, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_of_four_tasks_each_all_complete_with_an_exact_count() {
    const MANAGERS: usize = 2;
    const TASKS: usize = 4;
    const SECTIONS: usize = 10;
    let server = RedisServer::start();
    let client = server.client();
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(60));

    let mut managers = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..MANAGERS {
        let manager = connect(&server).await;
        for _ in 0..TASKS {
            let (manager, options) = (manager.clone(), options.clone());
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .expect("counter connection");
            tasks.push(tokio::spawn(async move {
                for _ in 0..SECTIONS {
                    let guard = manager.acquire("fair", &options).await.expect("acquire");
                    // Read, pause, write: without mutual exclusion updates get lost.
                    let value: Option<u64> = redis::cmd("GET")
                        .arg("fair:counter")
                        .query_async(&mut conn)
                        .await
                        .expect("GET");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    redis::cmd("SET")
                        .arg("fair:counter")
                        .arg(value.unwrap_or(0) + 1)
                        .query_async::<()>(&mut conn)
                        .await
                        .expect("SET");
                    guard.release().await.expect("release");
                }
            }));
        }
        managers.push(manager);
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("all 80 sections finish within 60 s")
            .expect("task panicked");
    }
    assert_eq!(
        server.get("fair:counter").as_deref(),
        Some((MANAGERS * TASKS * SECTIONS).to_string().as_str())
    );
    assert!(!server.exists("lock:fair"));
    for manager in &managers {
        assert_eq!(manager.resource_counts().queued_keys, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_still_woken_after_its_wake_up_connection_drops() {
    let server = RedisServer::start();
    let a = connect(&server).await;
    let b = connect(&server).await;
    let long = LockOptions::new().ttl(Duration::from_secs(30));

    let held = a.acquire("w3", &long).await.expect("A takes the free lock");
    let waiter = {
        let options = long.clone().timeout(Duration::from_secs(20));
        let b = b.clone();
        tokio::spawn(async move { b.acquire("w3", &options).await })
    };
    eventually(
        Duration::from_secs(5),
        "B to wait in line, listening",
        || waiting(&server, "w3"),
    )
    .await;
    let channel = grant_channels(&server).remove(0);

    // The wake-up connection dies (a network blip, a proxy, an admin's CLIENT KILL) while B
    // waits for a lock whose holder still has ~30 s of ttl.
    let before = pubsub_client_ids(&server);
    assert_eq!(before.len(), 1, "B's manager has one pub/sub connection");
    let mut conn = server.conn();
    let killed: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut conn)
        .expect("CLIENT KILL");
    assert_eq!(killed, 1);

    // The waiter must get its subscription back on a new connection, or no release can wake
    // it any more. (The reconnect may be quick enough that the channel never looks empty.)
    eventually(
        Duration::from_secs(5),
        "B to subscribe again on a new connection",
        || {
            let now = pubsub_client_ids(&server);
            now.len() == 1 && now != before && server.pubsub_channels().contains(&channel)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.release().await.expect("A still holds its lock");
    let guard = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("B was not woken by A's release after its wake-up connection was re-made")
        .expect("waiter task")
        .expect("B acquires");
    guard.release().await.expect("B holds it");
}
