//! No leaks: after more than 100 000 acquire/release cycles of every kind — uncontended on
//! distinct keys, contended on one key across two processes (two managers), with fencing, with
//! auto-extension, released by drop, and acquisitions of a key the other process holds,
//! abandoned by timeout or by dropping the future mid-flight — nothing is left behind: no local queue, no wake-up subscription, no
//! extra connection, no lock key, no waiters key, no tokio task; and while they run, the
//! manager's internal maps stay bounded by what is in use, never growing with the cycles.
//! Likewise with a Redlock master that accepts connections and never answers: the wake-up
//! requests waiting for it stay bounded by the keys in use, and waiters are still woken.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{LockError, LockManager, LockOptions};
use test_support::{eventually, keys, names, FaultProxy, RedisServer, RedisServers};
use tokio::time::Instant;

const UNCONTENDED_TASKS_PER_MANAGER: usize = 4;
const UNCONTENDED_CYCLES_PER_TASK: usize = 12_250;
const CONTENDED_TASKS_PER_MANAGER: usize = 4;
const CONTENDED_CYCLES_PER_TASK: usize = 250;
const HOLDER_CYCLES: usize = 300;
const ABANDONING_ATTEMPTS: usize = 400;

/// The critical section of the contended key: a read-modify-write that loses updates unless
/// the lock excludes every other holder, in this process or the other.
async fn critical_section(counter: &AtomicU64) {
    let value = counter.load(Ordering::SeqCst);
    tokio::task::yield_now().await;
    counter.store(value + 1, Ordering::SeqCst);
}

/// Distinct keys, one cycle each, in every flavour: plain, fencing, auto-extension, released
/// by dropping the guard, and `try_acquire`.
async fn uncontended(manager: LockManager, task: String, cycles: Arc<AtomicU64>) {
    for i in 0..UNCONTENDED_CYCLES_PER_TASK {
        let name = format!("nl:u:{task}:{i}");
        let options = match i % 10 {
            7 => LockOptions::new().fencing(true),
            8 => LockOptions::new().auto_extend(true),
            _ => LockOptions::new(),
        };
        let guard = if i % 10 == 6 {
            manager
                .try_acquire(&name, &options)
                .await
                .expect("try_acquire")
                .expect("a fresh key is free")
        } else {
            manager.acquire(&name, &options).await.expect("acquire")
        };
        if i % 10 == 9 {
            drop(guard); // released in the background
        } else {
            guard.release().await.expect("release");
        }
        cycles.fetch_add(1, Ordering::Relaxed);
    }
}

/// One key, contended by every task of both managers.
async fn contended(manager: LockManager, counter: Arc<AtomicU64>, cycles: Arc<AtomicU64>) {
    let plain = LockOptions::new().timeout(Duration::from_secs(60));
    let extended = plain.clone().auto_extend(true).fencing(true);
    for i in 0..CONTENDED_CYCLES_PER_TASK {
        let options = if i % 5 == 0 { &extended } else { &plain };
        let guard = manager.acquire("nl:hot", options).await.expect("acquire");
        critical_section(&counter).await;
        if i % 7 == 0 {
            drop(guard);
        } else {
            guard.release().await.expect("release");
        }
        cycles.fetch_add(1, Ordering::Relaxed);
    }
}

/// Holds `name` again and again, briefly, so that the other process's attempts on it wait.
async fn holding(
    manager: LockManager,
    name: String,
    counter: Arc<AtomicU64>,
    cycles: Arc<AtomicU64>,
) {
    // Each hold lasts ~1 ms; 20 s is only ever reached if an abandoned attempt of the other
    // process left a lock granted behind (it would live for its 60 s ttl).
    let options = LockOptions::new().timeout(Duration::from_secs(20));
    for _ in 0..HOLDER_CYCLES {
        let guard = manager
            .acquire(&name, &options)
            .await
            .unwrap_or_else(|error| {
                panic!("{name}: {error} (did an abandoned attempt keep the lock?)")
            });
        critical_section(&counter).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        guard.release().await.expect("release");
        cycles.fetch_add(1, Ordering::Relaxed);
    }
}

/// What the abandoning attempts came to.
#[derive(Debug, Default)]
struct Abandoning {
    acquired: u64,
    timed_out: u64,
    dropped: u64,
}

/// Attempts on a key the other process keeps taking, that give up: by a 1 ms `timeout`, or by
/// dropping the acquire future after 0.1 to 2 ms — in the local queue, while the script is in
/// flight (a lock Redis grants just then must still be released), while subscribing, or while
/// waiting for a wake-up.
async fn abandoning(
    manager: LockManager,
    name: String,
    counter: Arc<AtomicU64>,
    cycles: Arc<AtomicU64>,
) -> Abandoning {
    let short = LockOptions::new().timeout(Duration::from_millis(1));
    // A long ttl, so that a grant an abandoned attempt failed to release would block the
    // holder past its timeout instead of quietly expiring.
    let long = LockOptions::new()
        .ttl(Duration::from_secs(60))
        .timeout(Duration::from_secs(60));
    let mut outcome = Abandoning::default();
    for i in 0..ABANDONING_ATTEMPTS {
        let guard = if i % 2 == 0 {
            match manager.acquire(&name, &short).await {
                Ok(guard) => Some(guard),
                Err(LockError::Timeout { .. }) => {
                    outcome.timed_out += 1;
                    None
                }
                Err(error) => panic!("unexpected error: {error}"),
            }
        } else {
            let patience = Duration::from_micros(100 + (i as u64 * 37) % 2_000);
            match tokio::time::timeout(patience, manager.acquire(&name, &long)).await {
                Ok(acquired) => Some(acquired.expect("acquire")),
                Err(_) => {
                    outcome.dropped += 1;
                    None
                }
            }
        };
        if let Some(guard) = guard {
            critical_section(&counter).await;
            guard.release().await.expect("release");
            cycles.fetch_add(1, Ordering::Relaxed);
            outcome.acquired += 1;
        }
    }
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_cycles_leave_nothing_behind() {
    let started = std::time::Instant::now();
    let server = RedisServer::start();
    let mut managers = Vec::new();
    for _ in 0..2 {
        let manager = LockManager::connect(&server.url()).await.expect("connect");
        // Warm-up: this runtime's connection (and its driver task) exist before the baseline.
        let guard = manager
            .acquire("nl:warm-up", &LockOptions::new())
            .await
            .expect("free");
        guard.release().await.expect("ours");
        managers.push(manager);
    }
    // And each waits once behind the other, so that its hand-off channel's pub/sub connection
    // is open too: it stays open once opened, and its task runs on this runtime, where the
    // manager was made.
    for (holder, waiter) in [(0, 1), (1, 0)] {
        let held = managers[holder]
            .acquire("nl:warm-up", &LockOptions::new())
            .await
            .expect("free");
        let waiting = tokio::spawn({
            let waiter = managers[waiter].clone();
            async move { waiter.acquire("nl:warm-up", &LockOptions::new()).await }
        });
        eventually(Duration::from_secs(5), "the warm-up waiter in line", || {
            server.exists(&keys::named("nl:warm-up").line())
        })
        .await;
        held.release().await.expect("ours");
        let guard = waiting.await.expect("no panic").expect("handed over");
        guard.release().await.expect("ours");
    }
    let metrics = tokio::runtime::Handle::current().metrics();
    let tasks_before = metrics.num_alive_tasks();

    let hot_counter = Arc::new(AtomicU64::new(0));
    let hot_cycles = Arc::new(AtomicU64::new(0));
    let uncontended_cycles = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let mut contested = Vec::new();
    let mut abandoners = Vec::new();
    for (m, manager) in managers.iter().enumerate() {
        for t in 0..UNCONTENDED_TASKS_PER_MANAGER {
            tasks.push(tokio::spawn(uncontended(
                manager.clone(),
                format!("{m}.{t}"),
                uncontended_cycles.clone(),
            )));
        }
        for _ in 0..CONTENDED_TASKS_PER_MANAGER {
            tasks.push(tokio::spawn(contended(
                manager.clone(),
                hot_counter.clone(),
                hot_cycles.clone(),
            )));
        }
        // A key this manager keeps taking, and the other manager keeps giving up on.
        let name = format!("nl:contested:{m}");
        let (counter, cycles) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        tasks.push(tokio::spawn(holding(
            manager.clone(),
            name.clone(),
            counter.clone(),
            cycles.clone(),
        )));
        abandoners.push(tokio::spawn(abandoning(
            managers[1 - m].clone(),
            name,
            counter.clone(),
            cycles.clone(),
        )));
        contested.push((counter, cycles));
    }
    // While the cycles run, sample the managers' maps: a leak would grow them with the number
    // of cycles (thousands of keys), whereas in use there are at most a few per task.
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = tokio::spawn({
        let (managers, sampling) = (managers.clone(), sampling.clone());
        async move {
            let mut largest = (0, 0);
            while sampling.load(Ordering::SeqCst) {
                for manager in &managers {
                    let counts = manager.resource_counts();
                    largest.0 = largest.0.max(counts.queued_keys);
                    largest.1 = largest.1.max(counts.watched_channels);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            largest
        }
    });
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(90), task)
            .await
            .expect("every cycle finishes within 90 s")
            .expect("task panicked");
    }
    let mut abandoned = Vec::new();
    for task in abandoners {
        let outcome = tokio::time::timeout(Duration::from_secs(90), task)
            .await
            .expect("every attempt finishes within 90 s")
            .expect("task panicked");
        assert!(
            outcome.timed_out > 0 && outcome.dropped > 0,
            "the other process's holder should make some attempts give up: {outcome:?}"
        );
        abandoned.push(outcome);
    }

    sampling.store(false, Ordering::SeqCst);
    let (most_queued_keys, most_watched_channels) = sampler.await.expect("sampler");
    // Per manager at most: one key per uncontended task, the hot key, the two contested keys
    // (and a few releases by drop still finishing); channels: the hot and contested keys.
    assert!(
        most_queued_keys <= 4 * (UNCONTENDED_TASKS_PER_MANAGER + 3),
        "a manager's queue map grew to {most_queued_keys} keys during the run"
    );
    assert!(
        most_watched_channels <= 4,
        "a manager watched {most_watched_channels} channels at once during the run"
    );

    // Mutual exclusion held throughout: every read-modify-write of every key counted once.
    let hot = hot_cycles.load(Ordering::SeqCst);
    assert_eq!(
        hot,
        (2 * CONTENDED_TASKS_PER_MANAGER * CONTENDED_CYCLES_PER_TASK) as u64
    );
    assert_eq!(
        hot_counter.load(Ordering::SeqCst),
        hot,
        "lost updates on nl:hot"
    );
    let mut cycles = uncontended_cycles.load(Ordering::SeqCst) + hot;
    for (m, (counter, done)) in contested.iter().enumerate() {
        let done = done.load(Ordering::SeqCst);
        assert_eq!(
            counter.load(Ordering::SeqCst),
            done,
            "lost updates on nl:contested:{m}"
        );
        cycles += done;
    }
    assert!(
        cycles >= 100_000,
        "only {cycles} cycles completed (need at least 100 000)"
    );
    let elapsed_cycles = started.elapsed();

    // Releases by drop finish in the background: give them a moment, then nothing is left.
    for (m, manager) in managers.iter().enumerate() {
        eventually(
            Duration::from_secs(10),
            &format!("manager {m} to drop its queues, subscriptions and wake-up requests"),
            || {
                let counts = manager.resource_counts();
                counts.queued_keys == 0 && counts.watched_channels == 0 && counts.wake_requests == 0
            },
        )
        .await;
        let counts = manager.resource_counts();
        assert!(
            counts.connections <= 2,
            "manager {m} keeps {} connections: {counts:?}",
            counts.connections
        );
    }
    eventually(
        Duration::from_secs(10),
        "every wake-up channel to be unsubscribed",
        || server.pubsub_channels().is_empty(),
    )
    .await;
    eventually(Duration::from_secs(10), "every lock key to be gone", || {
        server.keys("lock:*").is_empty()
    })
    .await;
    // A line's lease table (its renewed places' leases) expires two leases (6 s) after the
    // last renewal, as a line left by dead waiters does: it never outlives its waiters by more.
    eventually(
        Duration::from_secs(10),
        "every lease table to expire",
        || server.keys(&keys::every("leases")).is_empty(),
    )
    .await;
    // Only fencing counters may stay (they must: they keep tokens increasing); no waiters key.
    // And a lock's `released` marker, written by a release sent on a connection idle for a
    // second (a release by drop on the background runtime's, or any on a stalled test
    // machine), as long as it expires by itself: it lives only for the window in which that
    // release may be sent again.
    let leftovers: Vec<String> = server
        .keys("*")
        .into_iter()
        .filter(|key| match names::helper_owner(key) {
            Some(("fence", _)) => false,
            // -1: no expiry; -2: expired since it was listed.
            Some(("released", _)) => server.pttl(key) == -1,
            _ => true,
        })
        .collect();
    assert!(leftovers.is_empty(), "keys left behind: {leftovers:?}");
    // Per manager: this runtime's connection, the background runtime's (releases by drop) and
    // the wake-up connection.
    let clients = server.client_count();
    assert!(clients <= 6, "{clients} client connections are open");
    // Watchdogs are aborted on release: one left running would live until its next tick, up
    // to 10 s away with the default 30 s ttl.
    eventually(
        Duration::from_secs(3),
        "the tokio tasks to return to their number before the cycles",
        || metrics.num_alive_tasks() <= tasks_before,
    )
    .await;
    eprintln!(
        "{cycles} cycles in {elapsed_cycles:?} (abandoning attempts: {abandoned:?}); \
         whole test {:?}; {} fencing counters; {} tasks before and {} after; at most \
         {most_queued_keys} queued keys and {most_watched_channels} watched channels per manager",
        started.elapsed(),
        server.keys("*").len(),
        tasks_before,
        metrics.num_alive_tasks()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_master_does_not_pile_up_wake_up_requests() {
    const KEYS: usize = 20;
    const ROUNDS: usize = 4;
    let servers = RedisServers::start(5);
    // The fifth master accepts connections and forwards nothing: each wake-up (re)connect to it
    // hangs for the connect timeout, while waiters keep asking to subscribe and unsubscribe.
    let proxy = FaultProxy::start(servers[4].port());
    proxy.stall();
    let _unstall = test_support::proxy::Unstall(&proxy);
    let mut urls = servers.urls();
    urls[4] = proxy.url();
    // A generous per-node timeout: every operation waits it out for the stalled master, and
    // on a loaded machine the live ones may need more than the default 100 ms.
    let manager = || async {
        LockManager::redlock_builder(&urls)
            .node_timeout(Duration::from_millis(300))
            .connect()
            .await
            .expect("4 of 5 masters answer")
    };
    let (holder, waiter) = (manager().await, manager().await);
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(20));

    let mut most_requests = 0;
    let mut slowest_hand_off = Duration::ZERO;
    for round in 0..ROUNDS {
        let held: Vec<_> = (0..KEYS)
            .map(|key| {
                let (holder, options) = (holder.clone(), options.clone());
                tokio::spawn(async move { holder.acquire(&format!("wq:{key}"), &options).await })
            })
            .collect();
        let mut guards = Vec::new();
        for task in held {
            guards.push(task.await.expect("holder task").expect("free"));
        }
        let waiters: Vec<_> = (0..KEYS)
            .map(|key| {
                let (waiter, options) = (waiter.clone(), options.clone());
                tokio::spawn(async move {
                    let guard = waiter.acquire(&format!("wq:{key}"), &options).await?;
                    let got_it = Instant::now();
                    guard.release().await?;
                    Ok::<_, LockError>(got_it)
                })
            })
            .collect();
        eventually(
            Duration::from_secs(10),
            "every waiter to listen for its wake-up",
            || waiter.resource_counts().registered_waiters == KEYS,
        )
        .await;
        // Let the waiters reach their wait.
        tokio::time::sleep(Duration::from_secs(1)).await;
        most_requests = most_requests.max(waiter.resource_counts().wake_requests);
        let released = Instant::now();
        let releases: Vec<_> = guards
            .into_iter()
            .map(|guard| tokio::spawn(guard.release()))
            .collect();
        for task in releases {
            task.await.expect("holder task").expect("still held");
        }
        for task in waiters {
            let got_it = task
                .await
                .expect("waiter task")
                .expect("the waiter gets its lock");
            slowest_hand_off = slowest_hand_off.max(got_it - released);
        }
        let requests = waiter.resource_counts().wake_requests;
        most_requests = most_requests.max(requests);
        eprintln!("round {round}: {requests} wake-up requests waiting");
    }
    eprintln!(
        "{ROUNDS} rounds of {KEYS} waiters with a stalled master: at most {most_requests} \
         wake-up requests waiting; slowest hand-off {slowest_hand_off:?}"
    );
    // With a 30 s ttl only a wake-up explains a hand-off within seconds.
    assert!(
        slowest_hand_off < Duration::from_secs(5),
        "a waiter was not woken by the release: {slowest_hand_off:?}"
    );
    assert!(
        most_requests <= 2 * KEYS,
        "wake-up requests piled up behind the stalled master: {most_requests} waiting for \
         {KEYS} keys in use"
    );
    // One wake-up connection per master and manager, reconnected with a backoff: the stalled
    // master sees a handful of connects over the whole run, not one per wait.
    let connects = proxy.accepted_count();
    eprintln!("connections opened to the stalled master: {connects}");
    assert!(
        connects <= 40,
        "{connects} connections opened to the stalled master for {} waits",
        ROUNDS * KEYS
    );
    eventually(
        Duration::from_secs(10),
        "the wake-up requests to drain",
        || waiter.resource_counts().wake_requests == 0,
    )
    .await;
}
