//! The network between the client and Redis fails (through `FaultProxy`).
//!
//! - **Partition while holding with `auto_extend`** (ttl 2 s): the network is stalled
//!   (bytes held, connections open) or cut (connections closed, new ones refused) right after an
//!   extension. The `#[distributed_lock]` function's body is cancelled and the function returns
//!   `Err(Lost)` before the lock can have expired in Redis (checked against the lock's PTTL read
//!   directly from Redis after the partition), within ttl + 1 s of the partition, and the body
//!   stops running.
//! - **Slow network** (50 ms one way, so ≥ 100 ms per round trip): two clients × 4 tasks
//!   × 5 read-modify-write sections still count exactly, only slower.
//!
//! **A command re-sent after its reply was lost** (cluster): the connection drops
//! after a lock command ran and before its reply arrived, and the redis-rs cluster connection
//! sends it again (`FaultProxy::lose_next_reply` on a `ProxiedCluster`). The second run must
//! not turn our own grant into "held by someone else", nor a release into a false `Lost`
//! (commands are idempotent for the same token): `try_acquire`, `acquire`, a fenced `acquire`, `release` and `extend`, each
//! checked against the key in Redis, read directly from the server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{distributed_lock, LockError, LockManager, LockMode, LockOptions};
use redis::AsyncCommands;
use test_support::{keys, FaultProxy, ProxiedCluster, RedisServer, RedisServers};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(2);

/// Works until cancelled (at most a minute), counting its progress and recording its token.
#[distributed_lock(key = "partitioned:{phase}", ttl = 2, timeout = 5, auto_extend = true, guard = lock)]
async fn long_job(
    phase: &str,
    progress: Arc<AtomicU64>,
    token: Arc<Mutex<String>>,
) -> Result<(), LockError> {
    lock.token().clone_into(&mut token.lock().unwrap());
    for _ in 0..6000 {
        progress.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Runs `long_job(phase)`, partitions the network with `partition` right after an extension is
/// seen in Redis, and checks the function is cancelled with `Lost` in time.
async fn lost_in_time(server: &RedisServer, phase: &str, partition: impl FnOnce()) {
    let key = format!("lock:partitioned:{phase}");
    let progress = Arc::new(AtomicU64::new(0));
    let token = Arc::new(Mutex::new(String::new()));
    let job = tokio::spawn({
        let (phase, progress, token) = (phase.to_owned(), progress.clone(), token.clone());
        async move {
            let outcome = long_job(&phase, progress, token).await;
            (outcome, Instant::now())
        }
    });

    // Wait for the watchdog's first extension: the lock's PTTL jumps back up.
    let started = Instant::now();
    let mut previous = i64::MAX;
    loop {
        let pttl = server.pttl(&key);
        if pttl > 0 && previous != i64::MAX && pttl > previous + 100 {
            break;
        }
        if pttl > 0 {
            previous = pttl;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no extension seen"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let extended = Instant::now();

    partition();
    let partitioned = Instant::now();
    // No extension can reach Redis any more: the lock expires at `expires` at the earliest.
    let remaining = server.pttl(&key);
    assert!(remaining > 0, "the lock is held at the partition");
    let expires = partitioned + Duration::from_millis(remaining.unsigned_abs());
    let holder = token.lock().unwrap().clone();
    assert_eq!(server.get(&key), Some(holder));

    let (outcome, returned) = tokio::time::timeout(TTL + Duration::from_secs(3), job)
        .await
        .expect("the function returned")
        .expect("the job task panicked");
    let progress_at_return = progress.load(Ordering::SeqCst);
    eprintln!(
        "{phase}: Lost {:?} after the partition, {:?} after the last extension seen; the lock \
         had {:?} left in Redis when the function returned",
        returned - partitioned,
        returned - extended,
        expires.saturating_duration_since(returned)
    );
    match outcome {
        Err(LockError::Lost { key: lost, .. }) => assert_eq!(lost, key),
        other => panic!("{phase}: expected Err(Lost), got {other:?}"),
    }
    assert!(
        returned < expires,
        "{phase}: the body was cancelled {:?} after the lock could have expired in Redis",
        returned - expires
    );
    assert!(
        returned - extended < TTL,
        "{phase}: cancelled within the ttl counted from the last extension"
    );
    assert!(
        returned - partitioned <= TTL + Duration::from_secs(1),
        "{phase}: cancelled within ttl + 1 s of the partition"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        progress.load(Ordering::SeqCst),
        progress_at_return,
        "{phase}: the body stopped when the function returned"
    );
    assert!(progress_at_return > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_cancels_an_auto_extended_body_with_lost_before_its_ttl_runs_out() {
    if !test_support::in_own_process(
        module_path!(),
        "a_partition_cancels_an_auto_extended_body_with_lost_before_its_ttl_runs_out",
    ) {
        return;
    }
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    distlock::init_with(LockManager::connect(&proxy.url()).await.unwrap()).unwrap();

    // A stalled network: connections stay open, nothing gets through.
    lost_in_time(&server, "stalled", || proxy.stall()).await;
    proxy.cut();
    proxy.unstall();

    // A cut network: every connection closed, new ones refused.
    lost_in_time(&server, "cut", || {
        proxy.set_refuse(true);
        proxy.cut();
    })
    .await;
    proxy.set_refuse(false);

    // The network heals: the same global client works again by itself.
    let progress = Arc::new(AtomicU64::new(0));
    let healed = Instant::now();
    let job = tokio::spawn(long_job("healed", progress.clone(), Arc::default()));
    while progress.load(Ordering::SeqCst) == 0 {
        assert!(
            healed.elapsed() < Duration::from_secs(5),
            "the client recovered within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!(
        "healed: lock taken {:?} after the network came back",
        healed.elapsed()
    );
    job.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_network_is_only_slower() {
    const CLIENTS: usize = 2;
    const TASKS: usize = 4;
    const SECTIONS: usize = 5;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    proxy.set_delay(Duration::from_millis(50));
    let data = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .timeout(Duration::from_secs(60));

    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        // Each client has its own connections through the slow proxy.
        let manager = LockManager::connect(&proxy.url()).await.unwrap();
        for _ in 0..TASKS {
            let (manager, mut data, options) = (manager.clone(), data.clone(), options.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..SECTIONS {
                    let guard = manager.acquire("slow", &options).await.unwrap();
                    let value: Option<u64> = data.get("count").await.unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let () = data.set("count", value.unwrap_or(0) + 1).await.unwrap();
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("a section failed");
    }
    let took = started.elapsed();
    let sections = CLIENTS * TASKS * SECTIONS;
    eprintln!(
        "slow network: {sections} sections in {took:?} ({:?} per section)",
        took / u32::try_from(sections).expect("a few sections")
    );
    assert_eq!(server.get("count"), Some(sections.to_string()));
    // Each section waits at least one 100 ms round trip to acquire: the delay was in effect.
    assert!(
        took >= Duration::from_millis(100) * u32::try_from(sections).expect("a few sections"),
        "took only {took:?}"
    );
    assert_eq!(server.keys("lock:*"), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_master_gets_one_connection_attempt_at_a_time_not_one_per_operation() {
    const OPERATIONS: usize = 200;
    let connect_timeout = Duration::from_secs(5);
    let servers = RedisServers::start(5);
    // The fifth master is behind a proxy that accepts connections and then forwards nothing:
    // a connection to it never completes its handshake.
    let proxy = FaultProxy::start(servers[4].port());
    proxy.stall();
    let _unstall = test_support::proxy::Unstall(&proxy);
    let mut urls = servers.urls();
    urls[4] = proxy.url();
    // A generous per-node timeout: 200 operations at once on a loaded 2-core machine must not
    // miss a majority for being slow; what is counted here is connections, not speed.
    let manager = LockManager::redlock_builder(&urls)
        .connect_timeout(connect_timeout)
        .node_timeout(Duration::from_secs(1))
        .connect()
        .await
        .expect("4 of 5 masters answer");

    let started = Instant::now();
    let operations: Vec<_> = (0..OPERATIONS)
        .map(|i| {
            let manager = manager.clone();
            tokio::spawn(async move {
                let guard = manager
                    .acquire(&format!("storm:{i}"), &LockOptions::new())
                    .await
                    .expect("a majority grants it");
                guard.release().await.expect("still held on a majority");
            })
        })
        .collect();
    for operation in operations {
        operation.await.expect("an operation failed");
    }
    let took = started.elapsed();
    let accepted = proxy.accepted_count();
    eprintln!(
        "{OPERATIONS} concurrent acquire+release with a stalled master in {took:?}: the proxy \
         accepted {accepted} connections"
    );
    // One connect in flight at a time, each given up after the connect timeout; one more for
    // a connect that starts as the previous one gives up.
    let bound = 2 + took.as_secs() / connect_timeout.as_secs();
    assert!(
        accepted <= bound,
        "{accepted} sockets opened to one stalled master by {OPERATIONS} operations in \
         {took:?} (at most {bound} expected)"
    );
}

// ---------------------------------------------------------------------------------------------
// A command re-sent after its reply was lost (cluster)
// ---------------------------------------------------------------------------------------------

/// A cluster manager whose every connection goes through `cluster`'s proxy.
async fn proxied_cluster_manager(cluster: &ProxiedCluster) -> LockManager {
    LockManager::cluster_builder(&cluster.urls())
        .connect()
        .await
        .unwrap_or_else(|error| panic!("cannot connect a cluster lock manager: {error}"))
}

/// Asserts that the proxy lost one reply and that the server ran `command` twice since its
/// stats were reset: the fault under test happened, the first run and the re-sent one.
fn assert_ran_twice(cluster: &ProxiedCluster, command: &str) {
    assert_eq!(
        cluster.proxy().replies_lost(),
        1,
        "the proxy lost the reply it was armed for"
    );
    assert_eq!(
        cluster.node().command_count(command),
        2,
        "{command} ran, its reply was lost, and the connection sent it again"
    );
}

/// Long enough that a lock left to expire would outlast every bound below by far.
const RESEND_TTL: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_acquire_whose_set_reply_was_lost_gets_the_lock_it_took() {
    let cluster = ProxiedCluster::start();
    let node = cluster.node();
    let manager = proxied_cluster_manager(&cluster).await;
    let key = "lock:resend:try";
    let options = LockOptions::new().ttl(RESEND_TTL);

    node.reset_stats();
    cluster.proxy().lose_next_reply_to(key);
    let guard = manager
        .try_acquire("resend:try", &options)
        .await
        .expect("try_acquire answers")
        .unwrap_or_else(|| {
            panic!(
                "try_acquire reported the lock held, by the SET it sent itself: the key holds \
                 {:?} for {} ms more, which nobody will release",
                node.get(key),
                node.pttl(key)
            )
        });
    assert_ran_twice(&cluster, "set");
    assert_eq!(
        node.get(key).as_deref(),
        Some(guard.token()),
        "the key holds our token"
    );
    assert!(guard.is_held().await.unwrap());

    guard
        .release()
        .await
        .expect("the release of the lock we took");
    assert!(!node.exists(key), "the release deleted the key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_set_reply_was_lost_acquires_promptly_not_at_its_orphans_expiry() {
    let cluster = ProxiedCluster::start();
    let node = cluster.node();
    let manager = proxied_cluster_manager(&cluster).await;
    let key = "lock:resend:acquire";
    let options = LockOptions::new()
        .ttl(RESEND_TTL)
        .timeout(RESEND_TTL + Duration::from_secs(10));

    node.reset_stats();
    cluster.proxy().lose_next_reply_to(key);
    let started = Instant::now();
    let guard = manager
        .acquire("resend:acquire", &options)
        .await
        .expect("acquire");
    let took = started.elapsed();
    eprintln!("acquired {took:?} after a lost SET reply");
    assert_eq!(
        cluster.proxy().replies_lost(),
        1,
        "the SET's reply was lost"
    );
    // Generous, and still half the ttl: waiting out our own orphaned SET takes the whole ttl.
    assert!(
        took < RESEND_TTL / 2,
        "acquire took {took:?}: it waited for the lock its own first SET had taken (ttl {RESEND_TTL:?})"
    );
    assert_eq!(node.get(key).as_deref(), Some(guard.token()));
    assert!(
        node.pttl(key) > i64::try_from(RESEND_TTL.as_millis()).unwrap() / 2,
        "the lock is the one just taken, with most of its ttl left"
    );
    guard.release().await.expect("release");
    assert!(!node.exists(key));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_acquire_whose_script_reply_was_lost_gets_the_counters_value_as_its_token() {
    let cluster = ProxiedCluster::start();
    let node = cluster.node();
    let manager = proxied_cluster_manager(&cluster).await;
    let key = "lock:resend:fenced";
    let counter = &keys::named("resend:fenced").fence();
    let options = LockOptions::new()
        .ttl(RESEND_TTL)
        .timeout(RESEND_TTL + Duration::from_secs(10))
        .fencing(true);

    // A first holder: the counter starts at 1, and the acquire script is loaded, so the armed
    // request below is the script itself and not a first EVALSHA answered NOSCRIPT.
    let first = manager.acquire("resend:fenced", &options).await.unwrap();
    assert_eq!(first.fencing_token(), Some(1));
    first.release().await.unwrap();

    node.reset_stats();
    cluster.proxy().lose_next_reply_to(key);
    let started = Instant::now();
    let guard = manager
        .acquire("resend:fenced", &options)
        .await
        .expect("fenced acquire");
    let took = started.elapsed();
    assert_eq!(
        guard.fencing_token(),
        Some(2),
        "the token the first run issued: not 0, not a second increment"
    );
    assert_eq!(
        node.get(counter).as_deref(),
        Some("2"),
        "the counter was incremented once"
    );
    assert!(
        took < RESEND_TTL / 2,
        "acquire took {took:?}: it waited for the lock its own first run had taken"
    );
    assert_ran_twice(&cluster, "evalsha");
    assert_eq!(node.get(key).as_deref(), Some(guard.token()));
    guard.release().await.expect("release");
    assert!(!node.exists(key));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_reply_was_lost_is_not_reported_lost() {
    let cluster = ProxiedCluster::start();
    let node = cluster.node();
    let manager = proxied_cluster_manager(&cluster).await;
    let key = "lock:resend:release";
    let guard = manager
        .acquire("resend:release", &LockOptions::new().ttl(RESEND_TTL))
        .await
        .unwrap();
    assert_eq!(node.get(key).as_deref(), Some(guard.token()));

    // The release script was loaded by `connect`'s probe: the armed request is the release.
    node.reset_stats();
    cluster.proxy().lose_next_reply_to(key);
    let released = guard.release().await;
    assert!(
        released.is_ok(),
        "a release that ran, then was sent again, answered {released:?}"
    );
    assert!(!node.exists(key), "the lock is gone");
    assert_ran_twice(&cluster, "evalsha");

    // What recognises the second run vouches for that release only: a holder whose lock
    // expired is still told it lost it.
    let stale = manager
        .acquire(
            "resend:release",
            &LockOptions::new().ttl(Duration::from_millis(200)),
        )
        .await
        .unwrap();
    test_support::eventually(Duration::from_secs(10), "the lock to expire", || {
        !node.exists(key)
    })
    .await;
    match stale.release().await {
        Err(LockError::Lost { key: lost, .. }) => assert_eq!(lost, key),
        other => panic!("the release of an expired lock answered {other:?}, not Lost"),
    }
}

/// A permit's, a reader's and a multi-key release whose reply was lost ran twice, as the
/// mutex's does above: the second run finds the token in the lock's `releases` marks and
/// answers as the first, not `Lost`; and the marks vouch for that release only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_or_multi_key_release_whose_reply_was_lost_is_not_reported_lost() {
    let cluster = ProxiedCluster::start();
    let node = cluster.node();
    let manager = proxied_cluster_manager(&cluster).await;
    let ttl = LockOptions::new().ttl(RESEND_TTL);
    let cases: [(&str, &[&str], LockOptions); 3] = [
        ("permit", &["resend:{permit}"], ttl.clone().permits(2)),
        (
            "reader",
            &["resend:{reader}"],
            ttl.clone().mode(LockMode::Read),
        ),
        ("keys", &["resend:{keys}:a", "resend:{keys}:b"], ttl.clone()),
    ];
    for (what, names, options) in cases {
        let take = || async {
            if names.len() == 1 {
                manager.acquire(names[0], &options).await
            } else {
                manager.acquire_all(names, &options).await
            }
        };
        // A first cycle loads the scripts: the armed request below is the release itself.
        take().await.unwrap().release().await.unwrap();
        let guard = take().await.unwrap();
        node.reset_stats();
        let lost_before = cluster.proxy().replies_lost();
        cluster
            .proxy()
            .lose_next_reply_to(&format!("lock:{}", names[0]));
        let released = guard.release().await;
        assert!(
            released.is_ok(),
            "{what}: a release that ran, then was sent again, answered {released:?}"
        );
        assert_eq!(cluster.proxy().replies_lost(), lost_before + 1, "{what}");
        assert_eq!(
            node.command_count("evalsha"),
            2,
            "{what}: the release ran, its reply was lost, and the connection sent it again"
        );
        for name in names {
            assert!(
                !node.exists(&format!("lock:{name}")),
                "{what}: {name} is free"
            );
        }

        // A holder whose lease ran out is still told it lost it.
        let short = options.clone().ttl(Duration::from_millis(200));
        let stale = if names.len() == 1 {
            manager.acquire(names[0], &short).await.unwrap()
        } else {
            manager.acquire_all(names, &short).await.unwrap()
        };
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(
            matches!(stale.release().await, Err(LockError::Lost { .. })),
            "{what}: the release of an expired lease must say Lost"
        );
    }
}

/// A permit's and a reader's release whose reply was lost after its first run let the waiter
/// in line in: the second run answers as the first (`Ok`), and touches neither the lease it
/// handed over nor the other holders' — the marks vouch for the caller's own release only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_release_leaves_the_lease_it_handed_over_alone() {
    let cluster = ProxiedCluster::start();
    let (holder, other) = (
        proxied_cluster_manager(&cluster).await,
        proxied_cluster_manager(&cluster).await,
    );
    let ttl = LockOptions::new()
        .ttl(RESEND_TTL)
        .timeout(RESEND_TTL + Duration::from_secs(10));
    let permits = ttl.clone().permits(2);
    let reader = ttl.clone().mode(LockMode::Read);
    // What is held (the first is released, the rest kept), and what waits.
    let cases = [
        (
            "permit",
            "resend:{handed-permit}",
            permits.clone(),
            2,
            permits,
        ),
        ("reader", "resend:{handed-read}", reader.clone(), 1, ttl),
    ];
    for (what, name, held, count, waiting) in cases {
        let mut guards = Vec::new();
        for _ in 0..count {
            guards.push(holder.acquire(name, &held).await.unwrap());
        }
        let other = other.clone();
        let waiter = tokio::spawn(async move { other.acquire(name, &waiting).await });
        test_support::waiting_in_line(&holder, name, 1).await;
        let first = guards.remove(0);
        let lost_before = cluster.proxy().replies_lost();
        // Only the release carries its holder's token: the waiter's own calls pass.
        cluster.proxy().lose_next_reply_to(first.token());
        let released = first.release().await;
        assert!(
            released.is_ok(),
            "{what}: a release that ran, then was sent again, answered {released:?}"
        );
        assert_eq!(cluster.proxy().replies_lost(), lost_before + 1, "{what}");
        let admitted = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap_or_else(|_| panic!("{what}: the waiter was not let in"))
            .unwrap()
            .unwrap_or_else(|error| panic!("{what}: the waiter's acquire: {error}"));
        assert!(
            admitted.is_held().await.unwrap(),
            "{what}: the waiter's lease"
        );
        for kept in &guards {
            assert!(
                kept.is_held().await.unwrap(),
                "{what}: another holder's lease"
            );
        }
        assert!(
            holder.try_acquire(name, &held).await.unwrap().is_none(),
            "{what}: full, as the resend left every lease in place"
        );
        admitted.release().await.unwrap();
        for kept in guards {
            kept.release().await.unwrap();
        }
    }
}

/// A join whose reply was lost: the acquire script ran twice. Its second run finds the
/// waiter's place and leaves one, so the waiter's leaving empties the line, and the release
/// after it hands the lock to nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_whose_reply_was_lost_leaves_one_place_and_its_waiter_leaves_it() {
    let cluster = ProxiedCluster::start();
    let node = cluster.node();
    let (holder, waiter) = (
        proxied_cluster_manager(&cluster).await,
        proxied_cluster_manager(&cluster).await,
    );
    let key = "lock:resend:join";
    let line = &keys::of(key).line();
    let options = LockOptions::new()
        .ttl(RESEND_TTL)
        .timeout(Duration::from_secs(2));
    // The acquire script is loaded by a first join, so that the armed request is a run of it.
    let warm = holder.acquire("resend:warm", &options).await.unwrap();
    assert!(matches!(
        waiter.acquire("resend:warm", &options).await,
        Err(LockError::Timeout { .. })
    ));
    warm.release().await.unwrap();

    let guard = holder.acquire("resend:join", &options).await.unwrap();
    node.reset_stats();
    // Only the join names the line (the first try is a plain `SET` of the lock key).
    cluster.proxy().lose_next_reply_to(line);
    let waited = waiter.acquire("resend:join", &options).await;
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "the waiter times out: {waited:?}"
    );
    assert_eq!(
        cluster.proxy().replies_lost(),
        1,
        "the join's reply was lost"
    );
    test_support::eventually(
        Duration::from_secs(5),
        "the waiter to leave the line",
        || !node.exists(line),
    )
    .await;
    guard.release().await.expect("still ours");
    assert!(
        !node.exists(key),
        "the release handed the lock to {:?} for {} ms, a waiter that left",
        node.get(key),
        node.pttl(key)
    );
}

/// A release within `hold_at_least` whose reply was lost, near the hold's end: its first run
/// left the lock to expire in a few milliseconds, so the re-sent run finds it gone. That is the
/// release having worked, not a lost lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_release_whose_reply_was_lost_is_not_reported_lost() {
    let cluster = ProxiedCluster::start();
    let node = cluster.node();
    let manager = proxied_cluster_manager(&cluster).await;
    let key = "lock:resend:hold";
    let hold = Duration::from_millis(400);
    let options = LockOptions::new().ttl(RESEND_TTL).hold_at_least(hold);
    // One hold release first, so that the armed request is the script itself, not its load.
    let warm = manager.acquire("resend:hold", &options).await.unwrap();
    warm.release().await.unwrap();
    test_support::eventually(Duration::from_secs(10), "the first hold to end", || {
        !node.exists(key)
    })
    .await;
    let guard = manager.acquire("resend:hold", &options).await.unwrap();
    // Released with a few milliseconds of the hold left, on a link slow enough that the
    // re-send (a new connection, then the command) arrives after the hold ended.
    cluster.proxy().set_delay(Duration::from_millis(30));
    tokio::time::sleep(hold.saturating_sub(Duration::from_millis(5))).await;
    node.reset_stats();
    cluster.proxy().lose_next_reply_to(key);
    let released = guard.release().await;
    assert!(
        released.is_ok(),
        "a hold release that ran, then was sent again, answered {released:?}"
    );
    assert_ran_twice(&cluster, "evalsha");
    test_support::eventually(Duration::from_secs(10), "the hold to end", || {
        !node.exists(key)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_whose_reply_was_lost_is_not_reported_lost() {
    let cluster = ProxiedCluster::start();
    let node = cluster.node();
    let manager = proxied_cluster_manager(&cluster).await;
    let key = "lock:resend:extend";
    let guard = manager
        .acquire("resend:extend", &LockOptions::new().ttl(RESEND_TTL))
        .await
        .unwrap();
    // A first extension loads the script, so the armed request is the extension itself.
    guard.extend(RESEND_TTL).await.unwrap();

    node.reset_stats();
    cluster.proxy().lose_next_reply_to(key);
    let extended = guard.extend(RESEND_TTL * 3).await;
    assert!(
        extended.is_ok(),
        "an extension that ran, then was sent again, answered {extended:?}"
    );
    assert_ran_twice(&cluster, "evalsha");
    assert!(!guard.is_lost(), "the guard does not count the lock lost");
    assert!(
        node.pttl(key) > i64::try_from((RESEND_TTL * 2).as_millis()).unwrap(),
        "the new ttl is in Redis: {} ms left",
        node.pttl(key)
    );
    assert_eq!(node.get(key).as_deref(), Some(guard.token()));
    guard.release().await.expect("release");
    assert!(!node.exists(key));
}

/// A lock handed over on its 3 s claim is confirmed to its full ttl on a connection its holder
/// has. A process that can open no new connection (Redis at `maxclients`, a proxy that refuses
/// clients) while the connection it acquired on still works keeps the lock for its ttl: the
/// confirmation must not depend on a second connection that cannot be opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_handed_over_while_no_new_connection_opens_is_still_confirmed() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let holder = LockManager::connect(&server.url()).await.unwrap();
    let waiter = LockManager::connect(&proxy.url()).await.unwrap();
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(20));
    let held = holder.acquire("refused", &options).await.unwrap();
    let waiting = tokio::spawn({
        let (waiter, options) = (waiter.clone(), options.clone());
        async move { waiter.acquire("refused", &options).await }
    });
    test_support::eventually(Duration::from_secs(5), "the waiter in line", || {
        server.exists(&keys::named("refused").line())
    })
    .await;
    // The waiter's connections (commands, pub/sub) are open; no other one will be.
    proxy.set_refuse(true);
    held.release().await.expect("still ours");
    let guard = waiting.await.unwrap().expect("handed over");
    // Past the claim.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        server.get("lock:refused").as_deref(),
        Some(guard.token()),
        "the handed-over lock expired at the end of its claim"
    );
    let pttl = server.pttl("lock:refused");
    assert!(pttl > 20_000, "{pttl} ms left, not the 30 s ttl");
    assert!(!guard.is_lost(), "the guard gave the lock up");
    guard.release().await.expect("still ours");
    proxy.set_refuse(false);
}

/// `acquire` with a zero timeout (one attempt) on a cluster whose `SET NX` reply was lost: the
/// connection sends it again, which finds the key held — by the first send, under the
/// acquisition's own token. The attempt asks whose the lock is, and the caller gets the lock
/// it took; it is not left held by nobody for the ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_timeout_acquire_whose_set_reply_was_lost_gets_the_lock_it_took() {
    let cluster = ProxiedCluster::start();
    let node = cluster.node();
    let manager = proxied_cluster_manager(&cluster).await;
    let key = "lock:resend:zero";
    let options = LockOptions::new().ttl(RESEND_TTL).timeout(Duration::ZERO);
    node.reset_stats();
    cluster.proxy().lose_next_reply_to(key);
    let result = manager.acquire("resend:zero", &options).await;
    assert_ran_twice(&cluster, "set");
    let guard = result.expect("the lock its first send took");
    assert_eq!(node.get(key).as_deref(), Some(guard.token()));
    guard.release().await.expect("still ours");
    assert!(!node.exists(key), "released");
}
