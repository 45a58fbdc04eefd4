//! `wait_for_replicas`: a lock, an extension, a hand-off and a fencing token count only once the
//! replicas acknowledged them — against a master with a replica of its own (replicating through
//! a proxy that can slow it down or hold it back) and a Sentinel deployment.

use std::time::Duration;

use distlock::{LockError, LockManager, LockOptions};
use test_support::sentinel::SERVICE;
use test_support::{hold_back_replication, Replicated, SentinelSet};

/// Long enough for a replica on this machine, short against the 1 s response timeout.
const ACK: Duration = Duration::from_millis(300);

async fn replicated(url: &str) -> LockManager {
    LockManager::builder(url)
        .wait_for_replicas(1, ACK)
        .connect()
        .await
        .unwrap_or_else(|error| panic!("cannot connect with wait_for_replicas: {error}"))
}

async fn through_sentinels(set: &SentinelSet, wait: bool) -> LockManager {
    let builder = LockManager::sentinel_builder(&set.sentinel_urls(), SERVICE);
    let builder = if wait {
        builder.wait_for_replicas(1, ACK)
    } else {
        builder
    };
    builder
        .connect()
        .await
        .unwrap_or_else(|error| panic!("cannot connect through the sentinels: {error}"))
}

fn assert_not_replicated(error: &LockError, key: &str) {
    match error {
        LockError::NotReplicated {
            key: named,
            acknowledged: 0,
            wanted: 1,
        } if named == key => {}
        other => panic!("expected NotReplicated for {key} with 0 of 1, got {other:?}"),
    }
    let message = error.to_string();
    assert!(message.contains("wait_for_replicas"), "{message}");
    assert!(message.contains("INFO replication"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lock_is_taken_while_the_only_replica_is_stopped() {
    let pair = Replicated::start();
    let manager = replicated(&pair.master().url()).await;
    let quick = LockOptions::new().timeout(Duration::from_millis(1500));

    pair.replica().pause();
    // A plain first try, a fenced one (the acquire script), and a single attempt.
    let error = manager.acquire("plain", &quick).await.unwrap_err();
    assert_not_replicated(&error, "lock:plain");
    let error = manager
        .acquire("fenced", &quick.clone().fencing(true))
        .await
        .unwrap_err();
    assert_not_replicated(&error, "lock:fenced");
    let error = manager.try_acquire("once", &quick).await.unwrap_err();
    assert_not_replicated(&error, "lock:once");
    // Each was given back: nothing is held on the master.
    for key in ["lock:plain", "lock:fenced", "lock:once"] {
        assert!(!pair.master().exists(key), "{key} was left behind");
    }
    pair.replica().resume();

    let guard = manager.acquire("plain", &quick).await.unwrap();
    assert_eq!(
        pair.replica().get("lock:plain").as_deref(),
        Some(guard.token())
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_the_stopped_replica_did_not_acknowledge_is_an_error() {
    let pair = Replicated::start();
    let manager = replicated(&pair.master().url()).await;
    let guard = manager.acquire("job", &LockOptions::new()).await.unwrap();

    pair.replica().pause();
    let error = guard.extend(Duration::from_secs(60)).await.unwrap_err();
    assert_not_replicated(&error, "lock:job");
    pair.replica().resume();

    guard.extend(Duration::from_secs(60)).await.unwrap();
    assert!(pair.replica().pttl("lock:job") > 30_000);
    guard.release().await.unwrap();
}

/// With replication slowed down, the replica has the lock's token (and its fencing counter)
/// the moment `acquire` returns, for a first try and for a hand-off; without
/// `wait_for_replicas` it does not yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_holds_the_token_the_moment_acquire_returns() {
    let pair = Replicated::start();
    pair.link().set_delay(Duration::from_millis(40));
    let manager = replicated(&pair.master().url()).await;
    let fenced = LockOptions::new().fencing(true);

    for i in 0..5 {
        let name = format!("job:{i}");
        let guard = manager.acquire(&name, &fenced).await.unwrap();
        let key = format!("lock:{name}");
        assert_eq!(pair.replica().get(&key).as_deref(), Some(guard.token()));
        let fence: u64 = pair
            .replica()
            .get(&format!("{{{key}}}:distlock:fence"))
            .expect("no fencing counter on the replica")
            .parse()
            .unwrap();
        assert_eq!(Some(fence), guard.fencing_token());
        guard.release().await.unwrap();
    }

    // A hand-off: the release (another connection's write) hands the lock to the waiter.
    let holder = manager.acquire("shared", &fenced).await.unwrap();
    let waiter = {
        let manager = replicated(&pair.master().url()).await;
        let fenced = fenced.clone();
        tokio::spawn(async move { manager.acquire("shared", &fenced).await })
    };
    test_support::eventually(
        Duration::from_secs(10),
        "the waiter to join the line",
        || !pair.master().keys("*line*").is_empty(),
    )
    .await;
    holder.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    assert_eq!(
        pair.replica().get("lock:shared").as_deref(),
        Some(next.token())
    );
    next.release().await.unwrap();

    // The contrast: the same delay, no `wait_for_replicas`.
    let plain = LockManager::connect(&pair.master().url()).await.unwrap();
    let mut missing = 0;
    for i in 0..5 {
        let guard = plain.acquire(&format!("plain:{i}"), &fenced).await.unwrap();
        missing += usize::from(pair.replica().get(&format!("lock:plain:{i}")).is_none());
        guard.release().await.unwrap();
    }
    eprintln!("without wait_for_replicas, {missing} of 5 tokens were not on the replica yet");
}

/// The replica is promoted by hand after its replication was held back: every fencing token
/// handed out before is below the first the promoted replica gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_keep_increasing_when_a_replica_is_promoted_by_hand() {
    // A short ttl: the acquisition refused for want of an acknowledgement gives its lock back on
    // the master, but its write may have reached the replica before the stall while the
    // acknowledgement did not; the promoted replica then holds that orphan until its ttl, so
    // the acquisition there waits past it.
    let fenced = LockOptions::new()
        .fencing(true)
        .ttl(Duration::from_secs(2))
        .timeout(Duration::from_secs(1));
    let on_the_promoted = fenced.clone().timeout(Duration::from_secs(6));
    let mut contrast = None;
    for wait in [true, false] {
        let pair = Replicated::start();
        let url = pair.master().url();
        let manager = if wait {
            replicated(&url).await
        } else {
            LockManager::connect(&url).await.unwrap()
        };
        let mut highest = 0;
        for _ in 0..3 {
            let guard = manager.acquire("job", &fenced).await.unwrap();
            highest = highest.max(guard.fencing_token().unwrap());
            guard.release().await.unwrap();
        }
        pair.link().stall();
        match manager.acquire("job", &fenced).await {
            Ok(guard) => {
                assert!(!wait, "acquired while replication was held back");
                highest = highest.max(guard.fencing_token().unwrap());
                std::mem::forget(guard);
            }
            Err(error) => assert_not_replicated(&error, "lock:job"),
        }
        pair.master().kill();
        pair.promote_replica();
        let promoted = LockManager::connect(&pair.replica().url()).await.unwrap();
        let guard = promoted.acquire("job", &on_the_promoted).await.unwrap();
        let next = guard.fencing_token().unwrap();
        if wait {
            assert!(
                next > highest,
                "the promoted replica gave fencing token {next}, not above {highest}"
            );
        } else {
            contrast = Some((next, highest));
        }
        guard.release().await.unwrap();
    }
    let (next, highest) = contrast.unwrap();
    eprintln!(
        "without wait_for_replicas the promoted replica gave {next} after {highest} was handed out"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_keep_increasing_through_a_sentinel_failover() {
    let set = SentinelSet::start();
    let manager = through_sentinels(&set, true).await;
    let fenced = LockOptions::new()
        .fencing(true)
        .timeout(Duration::from_secs(20));
    let guard = manager.acquire("job", &fenced).await.unwrap();
    let before = guard.fencing_token().unwrap();
    guard.release().await.unwrap();
    let new = set.failover();
    // The old master, a replica now, replicates from the new one: `WAIT` can be answered.
    set.wait_demoted(set.replica());
    let guard = manager.acquire("job", &fenced).await.unwrap();
    assert!(guard.fencing_token().unwrap() > before);
    assert_eq!(new.get("lock:job").as_deref(), Some(guard.token()));
    guard.release().await.unwrap();
}

/// The failure `wait_for_replicas` is for: replication held back, the master killed, a
/// replica that never received the lock promoted. With it, the first client never holds a
/// lock the replica lacks, so the second client's lock is the only one. Without it (the
/// contrast, printed, not asserted: timing decides), the first client holds a lock that the
/// promoted replica gives to the second client as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_with_replication_held_back_gives_no_held_lock_to_a_second_client() {
    let set = SentinelSet::start();
    let (first, plain_first) = (
        through_sentinels(&set, true).await,
        through_sentinels(&set, false).await,
    );
    let quick = LockOptions::new().timeout(Duration::from_secs(1));
    let guard = first.acquire("warm", &quick).await.unwrap();
    guard.release().await.unwrap();

    hold_back_replication(set.master());
    let error = first.acquire("job", &quick).await.unwrap_err();
    assert_not_replicated(&error, "lock:job");
    let unsafe_guard = plain_first.acquire("contrast", &quick).await.unwrap();

    set.kill_master();
    let second = through_sentinels(&set, false).await;
    let patient = LockOptions::new().timeout(Duration::from_secs(20));
    // The promoted replica has no replica left to acknowledge, so the second client goes
    // without `WAIT`: what matters is whom the lock it takes can overlap.
    let guard = second.acquire("job", &patient).await.unwrap();
    assert_eq!(set.master().get("lock:job").as_deref(), Some(guard.token()));
    guard.release().await.unwrap();
    let taken_again = second.acquire("contrast", &patient).await;
    eprintln!(
        "without wait_for_replicas: the first client's guard says held = {:?}, and a second \
         client {} the same lock",
        unsafe_guard.is_held().await,
        if taken_again.is_ok() {
            "took"
        } else {
            "did not take"
        }
    );
    std::mem::forget(unsafe_guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_wait_is_a_config_error_at_connect() {
    let server = test_support::RedisServer::start();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locker")
        .arg("on")
        .arg(">s3cret")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-wait")
        .query(&mut server.conn())
        .unwrap();
    let url = format!("redis://locker:s3cret@127.0.0.1:{}/", server.port());
    let error = LockManager::builder(&url)
        .wait_for_replicas(1, ACK)
        .connect()
        .await
        .unwrap_err();
    let LockError::Config(message) = &error else {
        panic!("expected a Config error, got {error:?}");
    };
    assert!(
        message.contains("WAIT") && message.contains("+wait"),
        "{message}"
    );
    assert!(!message.contains("s3cret"), "{message}");
    // The same user locks without it.
    LockManager::builder(&url).connect().await.unwrap();
}

/// What `wait_for_replicas` adds to an uncontended cycle: one `WAIT`, pipelined with the
/// acquisition's `SET`; the release sends none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_cycle_adds_one_wait_to_the_acquisition_and_none_to_the_release() {
    let pair = Replicated::start();
    let manager = replicated(&pair.master().url()).await;
    // Loads the release script, as any first release does.
    let guard = manager.acquire("warm", &LockOptions::new()).await.unwrap();
    guard.release().await.unwrap();

    pair.master().reset_stats();
    let guard = manager.acquire("job", &LockOptions::new()).await.unwrap();
    let after_acquire = pair.master().command_counts();
    guard.release().await.unwrap();
    let after_release = pair.master().command_counts();
    let count = |counts: &std::collections::BTreeMap<String, u64>, name: &str| {
        counts.get(name).copied().unwrap_or(0)
    };
    assert_eq!(count(&after_acquire, "set"), 1, "{after_acquire:?}");
    assert_eq!(count(&after_acquire, "wait"), 1, "{after_acquire:?}");
    assert_eq!(count(&after_acquire, "evalsha"), 0, "{after_acquire:?}");
    assert_eq!(count(&after_release, "wait"), 1, "{after_release:?}");
    assert_eq!(count(&after_release, "evalsha"), 1, "{after_release:?}");
}

/// On a cluster, `WAIT` goes with the lock's command to the master that owns its slot and counts
/// that master's replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_replica_of_the_locks_master_acknowledges() {
    let cluster = test_support::RedisCluster::start(3, 1);
    let manager = LockManager::cluster_builder(&cluster.urls())
        .wait_for_replicas(1, ACK)
        .connect()
        .await
        .unwrap();
    let fenced = LockOptions::new()
        .fencing(true)
        .timeout(Duration::from_millis(1500));
    let replica = cluster.replicas_of(cluster.node_for_key("lock:job"))[0];
    let read_on_replica = |key: &str| -> Option<String> {
        let mut conn = replica.conn();
        let _: () = redis::cmd("READONLY").query(&mut conn).unwrap();
        redis::cmd("GET").arg(key).query(&mut conn).unwrap()
    };

    let guard = manager.acquire("job", &fenced).await.unwrap();
    assert_eq!(read_on_replica("lock:job").as_deref(), Some(guard.token()));
    guard.release().await.unwrap();

    replica.pause();
    let error = manager.acquire("job", &fenced).await.unwrap_err();
    replica.resume();
    assert_not_replicated(&error, "lock:job");
    assert!(!cluster.exists("lock:job"));
}

/// `auto_extend` takes a renewal the replica did not acknowledge for a failed one: the lock is
/// given up (and the holder told) before it would expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_extend_gives_up_a_lock_whose_renewals_the_replica_does_not_acknowledge() {
    let pair = Replicated::start();
    let manager = replicated(&pair.master().url()).await;
    let options = LockOptions::new()
        .ttl(Duration::from_millis(1500))
        .auto_extend(true);
    let guard = manager.acquire("job", &options).await.unwrap();
    pair.replica().pause();
    let lost = tokio::time::timeout(Duration::from_secs(5), guard.lost()).await;
    pair.replica().resume();
    assert!(
        lost.is_ok(),
        "the watchdog kept a lock no renewal of which was acknowledged"
    );
    assert_eq!(guard.lost_cause(), Some(distlock::LostCause::Unreachable));
}

/// Acquisitions that run at once while the only replica is stopped each wait up to the
/// `wait_for_replicas` timeout, never one after another: each says `NotReplicated`, none runs
/// into the response timeout (which would leave its outcome unknown, and the caller a Redis
/// error instead of the cause).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquisitions_without_the_replica_each_say_not_replicated() {
    let pair = Replicated::start();
    let manager = replicated(&pair.master().url()).await;
    let once = LockOptions::new();

    pair.replica().pause();
    let attempts: Vec<_> = (0..5)
        .map(|i| {
            let manager = manager.clone();
            let once = once.clone();
            tokio::spawn(async move { manager.try_acquire(&format!("many:{i}"), &once).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for attempt in attempts {
        outcomes.push(attempt.await.unwrap());
    }
    pair.replica().resume();
    for (i, outcome) in outcomes.iter().enumerate() {
        match outcome {
            Err(error) => assert_not_replicated(error, &format!("lock:many:{i}")),
            Ok(guard) => panic!("many:{i} was acquired without its replica: {guard:?}"),
        }
    }
}

/// A release does not queue behind other locks' `WAIT`s: while two extensions wait for the
/// stopped replica, the release of a third lock returns, and the extensions are still waiting.
/// On one shared connection, Redis would answer the release only after both `WAIT`s, past the
/// response timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_does_not_wait_behind_other_locks_waits() {
    const LONG_ACK: Duration = Duration::from_secs(2);
    let pair = Replicated::start();
    let manager = LockManager::builder(pair.master().url())
        .response_timeout(Duration::from_secs(3))
        .wait_for_replicas(1, LONG_ACK)
        .connect()
        .await
        .unwrap();
    let once = LockOptions::new();
    let held = manager.acquire("held", &once).await.unwrap();
    let extended = [
        manager.acquire("extended:0", &once).await.unwrap(),
        manager.acquire("extended:1", &once).await.unwrap(),
    ];

    pair.replica().pause();
    let extending: Vec<_> = extended
        .into_iter()
        .map(|guard| tokio::spawn(async move { guard.extend(Duration::from_secs(30)).await }))
        .collect();
    // Lets the extensions send their `WAIT`s first (should they not have yet on a busy machine,
    // the release goes first anyway and the test proves less, never fails wrongly).
    tokio::time::sleep(LONG_ACK / 20).await;
    let released = held.release().await;
    let extensions_still_waiting = extending.iter().all(|task| !task.is_finished());
    let mut outcomes = Vec::new();
    for task in extending {
        outcomes.push(task.await.unwrap());
    }
    pair.replica().resume();
    released.expect("the release queued behind the other locks' WAITs");
    assert!(
        extensions_still_waiting,
        "the release was answered only after the other locks' WAITs"
    );
    for (i, outcome) in outcomes.iter().enumerate() {
        match outcome {
            Err(error) => assert_not_replicated(error, &format!("lock:extended:{i}")),
            Ok(()) => panic!("extended:{i} was extended without its replica"),
        }
    }
}

/// How many connections `server` accepted since it started (`INFO stats`), the one asking
/// included.
fn connections_received(server: &test_support::RedisServer) -> u64 {
    server
        .info("stats")
        .lines()
        .find_map(|line| line.strip_prefix("total_connections_received:"))
        .and_then(|count| count.trim().parse().ok())
        .expect("INFO stats names total_connections_received")
}

/// The connection a `WAIT` runs on is kept for the next one: acquisitions and extensions one
/// after another open no new connection to the master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_of_a_wait_is_kept_for_the_next() {
    let pair = Replicated::start();
    let manager = replicated(&pair.master().url()).await;
    let once = LockOptions::new();
    manager
        .acquire("warm", &once)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let before = connections_received(pair.master());
    for i in 0..10 {
        let guard = manager.acquire(&format!("cycle:{i}"), &once).await.unwrap();
        guard.extend(Duration::from_secs(5)).await.unwrap();
        guard.release().await.unwrap();
    }
    // The one `connections_received` opens to ask is the only new one.
    assert_eq!(
        connections_received(pair.master()),
        before + 1,
        "a WAIT opened a connection anew"
    );
}

/// An acquisition dropped while it confirms a hand-off with the replicas (the replica is
/// stopped, so its `WAIT` is still out) leaves no lock behind: the lock handed to it, whose
/// full ttl that confirmation set on the master, is passed on at once, not held by nobody
/// until it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_dropped_while_confirming_its_hand_off_leaves_no_lock() {
    let pair = Replicated::start();
    let manager = replicated(&pair.master().url()).await;
    let long = LockOptions::new()
        .ttl(Duration::from_secs(60))
        .timeout(Duration::from_secs(20));
    let holder = manager.acquire("confirming", &long).await.unwrap();
    let waiter = {
        let manager = replicated(&pair.master().url()).await;
        let long = long.clone();
        tokio::spawn(async move { manager.acquire("confirming", &long).await })
    };
    test_support::eventually(
        Duration::from_secs(10),
        "the waiter to join the line",
        || !pair.master().keys("*line*").is_empty(),
    )
    .await;

    pair.replica().pause();
    let released_token = holder.token().to_owned();
    holder.release().await.unwrap();
    // The hand-off message reaches the waiter at once; its confirmation waits up to `ACK` for
    // the stopped replica: drop it within that wait.
    tokio::time::sleep(ACK / 3).await;
    let handed_to = pair.master().get("lock:confirming");
    assert!(
        handed_to
            .as_deref()
            .is_some_and(|token| token != released_token),
        "the lock was not handed to the waiter: {handed_to:?}"
    );
    assert!(
        !waiter.is_finished(),
        "the waiter did not wait for its replica"
    );
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    pair.replica().resume();

    test_support::eventually(
        Duration::from_secs(5),
        "the dropped waiter's lock to be passed on",
        || !pair.master().exists("lock:confirming"),
    )
    .await;
    let next = manager
        .try_acquire("confirming", &LockOptions::new())
        .await
        .unwrap()
        .expect("the lock handed to a dropped waiter is free again");
    next.release().await.unwrap();
}

/// On a cluster, where every release leaves its token in the lock's `released` marker (a
/// second run of it must know the first), a waiter handed the lock whose confirmation the
/// replica did not acknowledge gives the lock back — and goes on under a new token. Its lock
/// taken later is its new token's: when that lock has expired, its release is told `Lost`, not
/// `Ok` on the word of the marker its give-back left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gave_back_an_unacknowledged_hand_off_goes_on_under_a_new_token() {
    let cluster = test_support::RedisCluster::start(3, 1);
    let name = "given-back";
    let helpers = test_support::keys::named(name);
    let (key, line, marker) = (
        helpers.lock().to_owned(),
        helpers.line(),
        helpers.released(),
    );
    let line_len = |cluster: &test_support::RedisCluster| -> i64 {
        let mut conn = cluster.node_for_key(&line).conn();
        redis::cmd("LLEN").arg(&line).query(&mut conn).unwrap()
    };
    let connect = |replicated: bool| {
        let builder = LockManager::cluster_builder(&cluster.urls());
        let builder = if replicated {
            builder.wait_for_replicas(1, ACK)
        } else {
            builder
        };
        async move { builder.connect().await.unwrap() }
    };
    let (replicated, plain, other) = (
        connect(true).await,
        connect(false).await,
        connect(false).await,
    );
    let replica = cluster.replicas_of(cluster.node_for_key(&key))[0];
    let waiting = |ttl_ms: u64| {
        LockOptions::new()
            .ttl(Duration::from_millis(ttl_ms))
            .timeout(Duration::from_secs(15))
    };

    let holder = plain.acquire(name, &waiting(20_000)).await.unwrap();
    // The replicated waiter first in line, another behind it.
    let first = tokio::spawn({
        let (manager, options) = (replicated.clone(), waiting(1500));
        async move { manager.acquire(name, &options).await }
    });
    test_support::eventually(Duration::from_secs(10), "the first waiter in line", || {
        line_len(&cluster) == 1
    })
    .await;
    let second = tokio::spawn({
        let (manager, options) = (other.clone(), waiting(1000));
        async move { manager.acquire(name, &options).await }
    });
    test_support::eventually(Duration::from_secs(10), "the second waiter in line", || {
        line_len(&cluster) == 2
    })
    .await;

    // The first waiter is handed the lock; its confirmation is not acknowledged, so it gives
    // the lock back (to the second waiter, which holds it only then), leaving its token in the
    // marker, and looks again.
    replica.pause();
    holder.release().await.unwrap();
    let second = second.await.unwrap().unwrap();
    replica.resume();
    let given_back = cluster.get(&marker).expect("the give-back's marker");

    // The second holder's lock runs out unreleased: the first waiter takes it (from the line,
    // or by a first try once it has expired).
    std::mem::forget(second);
    let first = first.await.unwrap().unwrap();
    assert_ne!(
        first.token(),
        given_back,
        "the lock the waiter took after giving one back is under the token it gave back"
    );

    test_support::eventually(Duration::from_secs(10), "the lock to expire", || {
        !cluster.exists(&key)
    })
    .await;
    assert_eq!(cluster.get(&marker).as_deref(), Some(given_back.as_str()));
    let released = first.release().await;
    assert!(
        matches!(released, Err(LockError::Lost { .. })),
        "a lock that expired was released: {released:?}"
    );
}

/// A waiter handed the lock whose confirmation the stopped replica does not acknowledge gives
/// the lock back (to the waiter behind it); when that happens past its deadline (here its
/// `WAIT` of 2 s outlasts its 1.2 s timeout), it fails with what happened, `NotReplicated`, as
/// an attempt that fails so at the deadline does — not a `Timeout` after one more try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_given_back_past_the_deadline_says_not_replicated() {
    let pair = Replicated::start();
    let manager = LockManager::builder(pair.master().url())
        .response_timeout(Duration::from_secs(5))
        .wait_for_replicas(1, Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let (plain, other) = (
        test_support::connect(pair.master()).await,
        test_support::connect(pair.master()).await,
    );
    let line = test_support::keys::named("past").line();
    let line_len = || -> i64 {
        let mut conn = pair.master().conn();
        redis::cmd("LLEN").arg(&line).query(&mut conn).unwrap()
    };
    let held = LockOptions::new().ttl(Duration::from_secs(20));
    let holder = plain.acquire("past", &held).await.unwrap();
    let waiter = tokio::spawn({
        let options = held.clone().timeout(Duration::from_millis(1200));
        async move { manager.acquire("past", &options).await }
    });
    test_support::eventually(Duration::from_secs(1), "the waiter in line", || {
        line_len() == 1
    })
    .await;
    let behind = tokio::spawn({
        let options = held.clone().timeout(Duration::from_secs(15));
        async move { other.acquire("past", &options).await }
    });
    test_support::eventually(Duration::from_secs(1), "the second waiter in line", || {
        line_len() == 2
    })
    .await;

    pair.replica().pause();
    holder.release().await.unwrap();
    let result = waiter.await.unwrap();
    pair.replica().resume();
    let behind = behind
        .await
        .unwrap()
        .expect("the lock given back went to the next");
    behind.release().await.unwrap();
    assert_not_replicated(
        &result.expect_err("no lock without the replica"),
        "lock:past",
    );
}
