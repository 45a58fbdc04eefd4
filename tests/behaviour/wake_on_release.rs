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
use test_support::{eventually, keys, RedisServer};
use tokio::time::Instant;

async fn connect(server: &RedisServer) -> LockManager {
    LockManager::connect(&server.url())
        .await
        .unwrap_or_else(|error| panic!("cannot connect a lock manager: {error}"))
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
    server.exists(&keys::named(name).line()) && !grant_channels(server).is_empty()
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
    // Handed over with a short claim, which B confirms to its own 30 s ttl a third into it.
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
        !server.exists(&keys::named("w1").line()),
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
    assert!(
        !server.exists(&keys::named("p1").line()),
        "nobody waits, so no line"
    );
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

/// `holder` takes `name` (ttl 30 s) and `waiter` waits for it in a task of its own: returns the
/// held guard and the waiting task once the waiter listens in line.
async fn held_with_a_waiter(
    server: &RedisServer,
    holder: &LockManager,
    waiter: &LockManager,
    name: &str,
) -> (
    distlock::LockGuard,
    tokio::task::JoinHandle<Result<distlock::LockGuard, distlock::LockError>>,
) {
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(20));
    let held = holder.acquire(name, &options).await.expect("free");
    let waiter = tokio::spawn({
        let (waiter, name) = (waiter.clone(), name.to_owned());
        async move { waiter.acquire(&name, &options).await }
    });
    eventually(
        Duration::from_secs(5),
        "the waiter to take its place in line, listening",
        || waiting(server, name),
    )
    .await;
    (held, waiter)
}

/// A lock handed over lives on its 3 s claim until its new holder confirms its ttl, a third
/// into the claim: a section that ends before then sends no confirmation at all — per hand-off,
/// the release scripts and nothing else. (The first holder took the lock by a first try, so its
/// release first sends the release of a lock held alone, which finds the waiter and changes
/// nothing, then the full release; the handed-over lock's release is the full one at once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_section_shorter_than_the_claim_sends_no_confirmation() {
    let server = RedisServer::start();
    let a = connect(&server).await;
    let b = connect(&server).await;
    let (held, waiter) = held_with_a_waiter(&server, &a, &b, "lazy").await;
    server.reset_stats();
    held.release().await.expect("still ours");
    let guard = waiter.await.unwrap().expect("handed over");
    let pttl = server.pttl("lock:lazy");
    tokio::time::sleep(Duration::from_millis(200)).await;
    guard.release().await.expect("still ours");
    // Past when the confirmation would have been due.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (evalsha, pexpire) = (
        server.command_count("evalsha"),
        server.command_count("pexpire"),
    );
    assert!(
        pttl <= 3_000,
        "the handed-over lock was on its ttl ({pttl} ms left) rather than its 3 s claim"
    );
    assert_eq!(
        (evalsha, pexpire),
        (3, 0),
        "two releases (the first in two scripts), and no confirmation of a 200 ms section"
    );
}

/// The confirmation runs on distlock's own runtime: a holder whose runtime is blocked (a
/// CPU-bound body on a current-thread runtime) for longer than the claim still keeps the lock
/// for its full ttl.
#[test]
fn a_lazily_confirmed_lock_lives_its_full_ttl_while_its_runtime_is_blocked() {
    let server = RedisServer::start();
    let url = server.url();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (a, b) = runtime.block_on(async {
        (
            LockManager::connect(&url).await.unwrap(),
            LockManager::connect(&url).await.unwrap(),
        )
    });
    let (held, waiter) = runtime.block_on(held_with_a_waiter(&server, &a, &b, "blocked"));
    let guard = runtime.block_on(async {
        held.release().await.expect("still ours");
        waiter.await.unwrap().expect("handed over")
    });
    // The body: 4 s without yielding, past the 3 s claim.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(server.get("lock:blocked").as_deref(), Some(guard.token()));
    let pttl = server.pttl("lock:blocked");
    assert!(
        pttl > 20_000,
        "the lock has {pttl} ms left, not its 30 s ttl"
    );
    runtime.block_on(async {
        assert!(guard.is_held().await.unwrap());
        guard.release().await.expect("still ours");
    });
}

/// The runtime a handed-over lock was acquired on may be gone before its confirmation is due
/// (the guard lives on elsewhere): the confirmation, which may fall back on that runtime's
/// connection, is still sent, and the lock lives its full ttl.
#[test]
fn a_handed_over_lock_is_confirmed_after_the_runtime_it_was_acquired_on_shut_down() {
    let server = RedisServer::start();
    let url = server.url();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let (a, b) = first.block_on(async {
        (
            LockManager::connect(&url).await.unwrap(),
            LockManager::connect(&url).await.unwrap(),
        )
    });
    let (held, waiter) = first.block_on(held_with_a_waiter(&server, &a, &b, "moved"));
    let guard = first.block_on(async {
        held.release().await.expect("still ours");
        waiter.await.unwrap().expect("handed over")
    });
    drop(first);
    // Past the claim.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(server.get("lock:moved").as_deref(), Some(guard.token()));
    let pttl = server.pttl("lock:moved");
    assert!(
        pttl > 20_000,
        "the lock has {pttl} ms left, not its 30 s ttl"
    );
    runtime().block_on(async { guard.release().await.expect("still ours") });
}

/// A waiter whose ttl is within the claim is handed its full ttl and needs no confirmation —
/// also when it finds the lock handed to it by looking rather than by a message (here: its user
/// may not subscribe, so it polls), when what is left of that ttl is all it can know.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_within_the_claim_found_by_looking_sends_no_confirmation() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                "poller",
                "on",
                ">secret",
                "~*",
                "resetchannels",
                "+@all",
            ][..],
        )
        .query(&mut conn)
        .unwrap();
    let a = connect(&server).await;
    let b = LockManager::connect(&format!(
        "redis://poller:secret@127.0.0.1:{}",
        server.port()
    ))
    .await
    .unwrap();
    let held = a
        .acquire("within", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            let options = LockOptions::new()
                .ttl(Duration::from_secs(2))
                .timeout(Duration::from_secs(20));
            b.acquire("within", &options).await
        }
    });
    eventually(Duration::from_secs(5), "b to wait in line", || {
        server.exists(&keys::named("within").line())
    })
    .await;
    server.reset_stats();
    held.release().await.expect("still ours");
    let guard = waiter.await.unwrap().expect("handed over");
    // Past when a confirmation would have been due (a third of the 2 s ttl), within the ttl.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        server.command_count("pexpire"),
        0,
        "a lock handed over with its full ttl was confirmed"
    );
    guard.release().await.expect("still ours");
}

/// A manager whose release just handed a key over knows it is contended: its next acquisition
/// of that key joins the line at once, without a plain `SET NX` that would find it held. Once a
/// release finds nobody waiting, the next acquisition is the plain `SET` again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_acquire_after_a_hand_off_skips_the_plain_set() {
    let server = RedisServer::start();
    let a = connect(&server).await;
    let b = connect(&server).await;
    let (held, waiter) = held_with_a_waiter(&server, &a, &b, "hint").await;
    held.release().await.expect("still ours");
    let b_guard = waiter.await.unwrap().expect("handed over");

    server.reset_stats();
    let again = tokio::spawn({
        let a = a.clone();
        async move {
            a.acquire("hint", &LockOptions::new().timeout(Duration::from_secs(20)))
                .await
        }
    });
    eventually(Duration::from_secs(5), "a to wait in line", || {
        server.exists(&keys::named("hint").line())
    })
    .await;
    let (set, evalsha) = (server.command_count("set"), server.command_count("evalsha"));
    assert_eq!(
        (set, evalsha),
        (0, 1),
        "a's acquisition joined the line without a plain SET first"
    );
    b_guard.release().await.expect("still ours");
    let a_guard = again.await.unwrap().expect("handed over");
    a_guard.release().await.expect("still ours");

    // Nobody waited at that release: the key is not contended any more.
    server.reset_stats();
    let guard = a.acquire("hint", &LockOptions::new()).await.expect("free");
    guard.release().await.expect("still ours");
    assert_eq!(
        (server.command_count("set"), server.command_count("evalsha")),
        (1, 1),
        "an uncontended cycle is a plain SET and the release script"
    );
}

/// The contended-key hint never makes a free lock wait on a subscription that fails: a client
/// whose pub/sub connection is down and cannot be made again (here: new connections refused)
/// has its subscription attempts backed off (up to 2 s apart), and an acquisition that joins
/// the line only once subscribed would wait for the next attempt before taking a free lock.
/// Such a client takes a free lock it just handed over with the plain `SET` first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_subscription_fails_takes_a_free_contended_lock_with_a_plain_set() {
    let server = RedisServer::start();
    let proxy = test_support::FaultProxy::start(server.port());
    let a = connect(&server).await;
    let b = LockManager::connect(&proxy.url()).await.unwrap();
    let c = connect(&server).await;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(20));
    let held = a.acquire("nosub", &options).await.unwrap();
    let busy = a.acquire("nosub-busy", &options).await.unwrap();
    let b_waits = tokio::spawn({
        let (b, options) = (b.clone(), options.clone());
        async move { b.acquire("nosub", &options).await }
    });
    eventually(Duration::from_secs(5), "b to wait in line", || {
        waiting(&server, "nosub")
    })
    .await;
    let c_waits = tokio::spawn({
        let (c, options) = (c.clone(), options.clone());
        async move { c.acquire("nosub", &options).await?.release().await }
    });
    eventually(Duration::from_secs(5), "c to wait behind b", || {
        let length: usize = redis::cmd("LLEN")
            .arg(keys::named("nosub").line())
            .query(&mut server.conn())
            .unwrap();
        length == 2
    })
    .await;
    held.release().await.expect("still ours");
    let b_guard = b_waits.await.unwrap().expect("handed to b");

    // b's connections drop; its command connection comes back at once, and then no new
    // connection gets through to Redis: its pub/sub connection cannot be made again.
    proxy.cut();
    let mut reconnected = false;
    for _ in 0..20 {
        if let Ok(held) = b_guard.is_held().await {
            assert!(held, "b's lock");
            reconnected = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(reconnected, "b's command connection came back");
    proxy.set_refuse(true);
    for _ in 0..4 {
        let short = LockOptions::new().timeout(Duration::from_millis(300));
        assert!(b.acquire("nosub-busy", &short).await.is_err(), "held by a");
    }
    // b hands "nosub" to c, and so knows the key is contended; c is done with it at once.
    b_guard.release().await.expect("still ours");
    c_waits.await.unwrap().expect("handed to c, and released");

    server.reset_stats();
    let started = Instant::now();
    let guard = b
        .acquire("nosub", &LockOptions::new().timeout(Duration::from_secs(5)))
        .await
        .expect("free");
    eprintln!("b took the free lock in {:?}", started.elapsed());
    assert_eq!(
        (server.command_count("set"), server.command_count("evalsha")),
        (1, 0),
        "the free lock was taken by a join that first waited for a subscription"
    );
    guard.release().await.expect("still ours");
    busy.release().await.expect("still ours");
    proxy.set_refuse(false);
}

/// Only the first waiter in line is told the holder's remaining ttl (it is the one to look
/// when the holder dies); a waiter that joins behind it costs no `PTTL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_first_waiter_in_line_asks_for_the_holders_ttl() {
    let server = RedisServer::start();
    let a = connect(&server).await;
    let b = connect(&server).await;
    let c = connect(&server).await;
    let (held, first) = held_with_a_waiter(&server, &a, &b, "behind").await;
    server.reset_stats();
    let second = tokio::spawn({
        let c = c.clone();
        async move {
            c.acquire(
                "behind",
                &LockOptions::new().timeout(Duration::from_secs(20)),
            )
            .await
        }
    });
    eventually(Duration::from_secs(5), "c to wait behind b", || {
        let mut conn = server.conn();
        let length: usize = redis::cmd("LLEN")
            .arg(keys::named("behind").line())
            .query(&mut conn)
            .unwrap();
        length == 2
    })
    .await;
    assert_eq!(server.command_count("pttl"), 0, "c's join asked for a ttl");
    held.release().await.expect("still ours");
    first
        .await
        .unwrap()
        .expect("b is handed the lock")
        .release()
        .await
        .expect("still ours");
    second
        .await
        .unwrap()
        .expect("then c")
        .release()
        .await
        .expect("still ours");
}

/// A manager made on a multi-thread runtime reads its hand-off messages there (see
/// `grants.rs`); when that runtime shuts down, the reading moves to distlock's background
/// thread, so a waiter on another runtime is still woken by the release's message, its grant
/// channel subscribed, rather than left to find the lock at its renewal.
#[test]
fn hand_off_messages_still_arrive_after_the_runtime_that_made_the_manager_shut_down() {
    let server = RedisServer::start();
    let first = multi_thread(2);
    let waiter = first.block_on(connect(&server));
    // Waits once there, so that its messages are read on that runtime.
    let holder_runtime = multi_thread(2);
    let holder = holder_runtime.block_on(connect(&server));
    let options = LockOptions::new();
    let held = holder_runtime
        .block_on(holder.acquire("moved", &options))
        .unwrap();
    let waiting = first.spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire("moved", &LockOptions::new()).await }
    });
    wait_until_waiting(&server, "moved");
    holder_runtime.block_on(held.release()).unwrap();
    let guard = first.block_on(waiting).unwrap().unwrap();
    first.block_on(guard.release()).unwrap();
    drop(first);

    let second = multi_thread(2);
    let held = holder_runtime
        .block_on(holder.acquire("moved", &options))
        .unwrap();
    let waiting = second.spawn({
        let waiter = waiter.clone();
        async move {
            let started = Instant::now();
            let guard = waiter.acquire("moved", &LockOptions::new()).await;
            (guard, started.elapsed())
        }
    });
    wait_until_waiting(&server, "moved");
    assert_eq!(
        waiter.resource_counts().watched_channels,
        1,
        "the waiter's grant channel is subscribed again"
    );
    std::thread::sleep(Duration::from_millis(100));
    let released = Instant::now();
    holder_runtime.block_on(held.release()).unwrap();
    let (guard, _) = second.block_on(waiting).unwrap();
    let after_release = released.elapsed();
    second.block_on(guard.unwrap().release()).unwrap();
    // A renewal comes a second after the join; the message, at once.
    assert!(
        after_release < Duration::from_millis(500),
        "the waiter found the lock {after_release:?} after the release: no message reached it"
    );
}

/// Blocks until someone waits for `name` (in line, listening): for tests that drive runtimes
/// by hand.
fn wait_until_waiting(server: &RedisServer, name: &str) {
    test_support::wait_until(Duration::from_secs(5), "a waiter in line", || {
        waiting(server, name)
    });
}

/// The hand-off messages of a manager made on a multi-thread runtime are read there (see
/// `grants.rs`), but its waiters may run on any runtime. While every worker of the runtime that
/// made it is blocked (CPU-bound work, a blocking call), a waiter on another runtime cannot have
/// its subscription confirmed: it must still take its place in line, and find the lock released
/// meanwhile at its next look, rather than wait, outside the line and looking at nothing, for
/// that runtime (or its own deadline).
#[test]
fn a_waiter_on_another_runtime_is_not_held_up_by_the_blocked_runtime_that_made_its_manager() {
    let server = RedisServer::start();
    let maker = multi_thread(1);
    let waiter = maker.block_on(connect(&server));
    let other = multi_thread(2);
    let holder = other.block_on(connect(&server));
    let held = other
        .block_on(holder.acquire("blocked-maker", &LockOptions::new()))
        .unwrap();
    // The maker's only worker thread runs a body that blocks for 6 s.
    let (started, blocked) = std::sync::mpsc::channel();
    drop(maker.spawn(async move {
        started.send(()).unwrap();
        std::thread::sleep(Duration::from_secs(6));
    }));
    blocked.recv().unwrap();
    let waiting = other.spawn({
        let waiter = waiter.clone();
        async move {
            waiter
                .acquire(
                    "blocked-maker",
                    &LockOptions::new().timeout(Duration::from_secs(20)),
                )
                .await
        }
    });
    // The waiter found the lock held, and asked for its subscription.
    std::thread::sleep(Duration::from_millis(300));
    let released = Instant::now();
    other.block_on(held.release()).unwrap();
    let guard = other.block_on(waiting).unwrap().unwrap();
    let after_release = released.elapsed();
    other.block_on(guard.release()).unwrap();
    // Without a message: its join, or the renewal of its place, finds the lock.
    assert!(
        after_release < Duration::from_millis(2500),
        "the waiter found the lock {after_release:?} after the release: it waited for the \
         blocked runtime that made its manager"
    );
    maker.shutdown_background();
}

/// A multi-thread runtime of `workers` worker threads, for tests that drive runtimes by hand.
fn multi_thread(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}
