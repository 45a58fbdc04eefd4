//! `LockManager::sentinel_builder` against a real Sentinel deployment (a master, a replica and
//! three `redis-server --sentinel`): locks, hand-offs and fencing on the master the sentinels
//! name, and mutual exclusion through a `SENTINEL FAILOVER` and through a killed master, with
//! exact counts and the time to recover.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{LockManager, LockOptions};
use test_support::sentinel::SERVICE;
use test_support::SentinelSet;
use tokio::time::Instant;

/// A manager on the set's master; trusting the set's CA when its sentinels speak TLS.
pub(crate) async fn connect(set: &SentinelSet) -> LockManager {
    let builder = LockManager::sentinel_builder(&set.sentinel_urls(), SERVICE);
    #[cfg(feature = "tls")]
    let builder = if set.is_tls() {
        builder.tls_root_certificate(set.ca_pem())
    } else {
        builder
    };
    builder
        .connect()
        .await
        .unwrap_or_else(|error| panic!("cannot connect through the sentinels: {error}"))
}

/// How a test reads the master: `get` a key's value, and whether `has_line` (a waiter joined).
/// Plain here; over TLS in `sentinel_tls`.
pub(crate) struct MasterReads {
    pub(crate) get: fn(&SentinelSet, &str) -> Option<String>,
    pub(crate) has_line: fn(&SentinelSet) -> bool,
}

const PLAIN: MasterReads = MasterReads {
    get: |set, key| set.master().get(key),
    has_line: |set| !set.master().keys("*line*").is_empty(),
};

/// What a hand-off of `job` through the sentinels showed.
pub(crate) struct HandOff {
    /// The first holder's token, and what the master held at `lock:job` then.
    pub(crate) first: (String, Option<String>),
    /// The waiter's token, and what the master held at `lock:job` once it was handed the lock.
    pub(crate) next: (String, Option<String>),
    /// What the master held at `lock:job` after the waiter released it.
    pub(crate) left: Option<String>,
    /// How long after the release the waiter got the lock.
    pub(crate) handed_after: Duration,
    /// The fencing tokens of the first holder and of the waiter.
    pub(crate) fences: (u64, u64),
}

/// One manager takes `job` with fencing, a second waits in line for it (its wake-up comes over
/// its subscription), the first releases, and the waiter releases in turn.
pub(crate) async fn hand_off_through_the_sentinels(
    set: &SentinelSet,
    reads: &MasterReads,
) -> HandOff {
    let (first, second) = (connect(set).await, connect(set).await);
    let options = LockOptions::new().fencing(true);
    let guard = first.acquire("job", &options).await.unwrap();
    let first_seen = (guard.token().to_owned(), (reads.get)(set, "lock:job"));
    let fence = guard.fencing_token().unwrap();
    let waiter = tokio::spawn(async move {
        let guard = second.acquire("job", &options).await.unwrap();
        (Instant::now(), guard)
    });
    test_support::eventually(
        Duration::from_secs(10),
        "the waiter to join the line",
        || (reads.has_line)(set),
    )
    .await;
    let released = Instant::now();
    guard.release().await.unwrap();
    let (got_at, next) = waiter.await.unwrap();
    let next_seen = (next.token().to_owned(), (reads.get)(set, "lock:job"));
    let next_fence = next.fencing_token().unwrap();
    next.release().await.unwrap();
    HandOff {
        first: first_seen,
        next: next_seen,
        left: (reads.get)(set, "lock:job"),
        handed_after: got_at - released,
        fences: (fence, next_fence),
    }
}

/// Asserts each holder's token was what the master held while it held the lock, and that
/// nothing is left once the last one released.
pub(crate) fn assert_lives_on_the_master(hand_off: &HandOff) {
    for (token, on_master) in [&hand_off.first, &hand_off.next] {
        assert_eq!(on_master.as_deref(), Some(token.as_str()));
    }
    assert_eq!(hand_off.left, None);
}

/// Asserts the waiter got the lock long before the 30 s ttl.
pub(crate) fn assert_handed_at_once(hand_off: &HandOff) {
    assert!(
        hand_off.handed_after < Duration::from_secs(2),
        "handed over {:?} after the release",
        hand_off.handed_after
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_live_on_the_master_the_sentinels_name() {
    let set = SentinelSet::start();
    assert_lives_on_the_master(&hand_off_through_the_sentinels(&set, &PLAIN).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_through_the_sentinels_hands_the_lock_to_a_waiter_at_once() {
    let set = SentinelSet::start();
    assert_handed_at_once(&hand_off_through_the_sentinels(&set, &PLAIN).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_rise_across_a_hand_off_through_the_sentinels() {
    let set = SentinelSet::start();
    let (fence, next_fence) = hand_off_through_the_sentinels(&set, &PLAIN).await.fences;
    assert!(next_fence > fence);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_service_name_is_an_error_that_names_the_fix() {
    let set = SentinelSet::start();
    let error = LockManager::sentinel_builder(&set.sentinel_urls(), "no-such-service")
        .connect()
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("check the service name"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_service_name_is_a_config_error() {
    let set = SentinelSet::start();
    let error = LockManager::sentinel_builder(&set.sentinel_urls(), "")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(error, distlock::LockError::Config(_)), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_holds_through_a_sentinel_failover() {
    let set = SentinelSet::start();
    run_through_failover(&set, "SENTINEL FAILOVER", |set| {
        let old = set.master();
        set.failover();
        old
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_holds_through_a_killed_master() {
    let set = SentinelSet::start();
    run_through_failover(&set, "killed master", |set| {
        let old = set.master();
        set.kill_master();
        old
    })
    .await;
}

/// What the workers of one run saw.
#[derive(Default)]
struct Tally {
    /// The counter the sections update, read and written in two steps.
    counter: AtomicU64,
    /// Sections that wrote: each adds exactly 1 to `counter`.
    committed: AtomicU64,
    /// Sections that found the lock no longer theirs before writing, and did not write.
    abandoned: AtomicU64,
    /// Acquisitions that failed (timeout, Redis unreachable during the failover).
    failed: AtomicU64,
    /// When each section committed.
    commits: Mutex<Vec<Instant>>,
}

/// Two managers (as two processes would have) of four tasks each take the lock in turn and do
/// a read-modify-write under it, before, during and after `fail_over` (which returns the old
/// master); a third manager joins as soon as the sentinels name the new master, while the old
/// one may still take writes. A section writes only if the lock is still its own just before
/// writing — what the documentation asks of users where a failover may forget a lock. Every
/// write must count: a section that overlapped another would lose an update. Prints the longest
/// time without a section around the failover.
pub(crate) async fn run_through_failover(
    set: &SentinelSet,
    what: &str,
    fail_over: impl for<'a> FnOnce(&'a SentinelSet) -> &'a test_support::RedisServer + Send,
) {
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    let spawn_workers = |manager: LockManager, tasks: &mut Vec<tokio::task::JoinHandle<()>>| {
        for _ in 0..4 {
            let (manager, tally, stop) = (manager.clone(), Arc::clone(&tally), Arc::clone(&stop));
            tasks.push(tokio::spawn(async move {
                let options = LockOptions::new()
                    .ttl(Duration::from_secs(3))
                    .timeout(Duration::from_secs(30))
                    .auto_extend(true);
                while !stop.load(Ordering::Acquire) {
                    let Ok(guard) = manager.acquire("counter", &options).await else {
                        tally.failed.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    };
                    let value = tally.counter.load(Ordering::Acquire);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    if matches!(guard.is_held().await, Ok(true)) {
                        tally.counter.store(value + 1, Ordering::Release);
                        tally.committed.fetch_add(1, Ordering::Relaxed);
                        tally.commits.lock().unwrap().push(Instant::now());
                    } else {
                        tally.abandoned.fetch_add(1, Ordering::Relaxed);
                    }
                    let _ = guard.release().await;
                }
            }));
        }
    };
    for _ in 0..2 {
        spawn_workers(connect(set).await, &mut tasks);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = tally.committed.load(Ordering::Relaxed);
    assert!(before > 0, "no section ran before the failover");
    let triggered = Instant::now();
    let old = tokio::task::block_in_place(|| fail_over(set));
    let failed_over = triggered.elapsed();
    // A process that connects now finds the new master; the others must not stay on the old.
    spawn_workers(connect(set).await, &mut tasks);
    if old.is_running() {
        tokio::task::block_in_place(|| set.wait_demoted(old));
    }
    let demoted = triggered.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Release);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("every worker stops within 60 s")
            .unwrap();
    }

    let committed = tally.committed.load(Ordering::Relaxed);
    let commits = tally.commits.lock().unwrap().clone();
    let after: Vec<Instant> = commits
        .iter()
        .copied()
        .filter(|at| *at > triggered)
        .collect();
    let mut longest_gap = Duration::ZERO;
    let mut previous = triggered;
    for at in &after {
        longest_gap = longest_gap.max(*at - previous);
        previous = *at;
    }
    eprintln!(
        "{what}: {committed} sections ({before} before), {} abandoned, {} failed acquisitions; \
         the sentinels switched masters {failed_over:?} after the trigger and the old one could \
         take no more writes after {demoted:?}; longest time without a section from the trigger \
         on: {longest_gap:?}",
        tally.abandoned.load(Ordering::Relaxed),
        tally.failed.load(Ordering::Relaxed),
    );
    assert_eq!(
        tally.counter.load(Ordering::Acquire),
        committed,
        "every committed section added exactly 1: no two overlapped"
    );
    let on_new_master = after.iter().filter(|at| **at > triggered + demoted).count();
    assert!(
        on_new_master > 0,
        "sections ran again once the new master was in place"
    );
    assert!(
        longest_gap < Duration::from_secs(30),
        "recovered within 30 s (took {longest_gap:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_with_a_password_is_reached_with_master_login_which_is_never_shown() {
    let password = "s3cret-master-pw";
    let set = SentinelSet::start_with_password(Some(password));
    let manager = LockManager::sentinel_builder(&set.sentinel_urls(), SERVICE)
        .master_login("", password)
        .connect()
        .await
        .unwrap_or_else(|error| panic!("cannot connect with the master's password: {error}"));
    let guard = manager.acquire("job", &LockOptions::new()).await.unwrap();
    guard.release().await.unwrap();
    assert!(!format!("{manager:?}").contains(password));

    for builder in [
        LockManager::sentinel_builder(&set.sentinel_urls(), SERVICE),
        LockManager::sentinel_builder(&set.sentinel_urls(), SERVICE).master_login("", "wrong"),
    ] {
        let shown = format!("{builder:?}");
        assert!(!shown.contains("wrong"), "{shown}");
        let error = builder.connect().await.unwrap_err();
        assert!(!error.to_string().contains(password), "{error}");
    }
}

/// Sentinels that are all down — one refusing connections, one accepting them and never
/// answering (a frozen host) — make `connect` fail with an error in bounded time, not hang.
#[tokio::test]
async fn sentinels_that_are_all_down_or_silent_fail_the_connect_in_bounded_time() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let refusing = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let refusing_port = refusing.local_addr().unwrap().port();
    drop(refusing);
    let urls = [
        format!("redis://127.0.0.1:{refusing_port}"),
        format!("redis://127.0.0.1:{}", silent.local_addr().unwrap().port()),
    ];
    let started = Instant::now();
    let connected = tokio::time::timeout(
        Duration::from_secs(60),
        LockManager::sentinel_builder(&urls, SERVICE).connect(),
    )
    .await
    .expect("connect gives up on sentinels that do not answer");
    assert!(connected.is_err(), "no sentinel answered, yet it connected");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?} to give up",
        started.elapsed()
    );
    drop(silent);
}

/// Sentinels that stop answering (frozen hosts) name no master within distlock's bound on the
/// lookup: `connect` fails with `LockError::NoAnswer`, which names the service and says what to
/// check and which timeouts to raise, as a `TimedOut` `io::Error`. The bound (twice the connect
/// plus twice the response timeout, 400 ms here) runs out before redis-rs' own 500 ms response
/// timeout on its connections to the sentinels, which would otherwise report the silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_that_do_not_answer_the_lookup_give_a_no_answer_error_that_says_what_to_do() {
    let set = SentinelSet::start();
    set.pause_sentinels();
    let connected = tokio::time::timeout(
        Duration::from_secs(60),
        LockManager::sentinel_builder(&set.sentinel_urls(), SERVICE)
            .connect_timeout(Duration::from_millis(100))
            .response_timeout(Duration::from_millis(100))
            .connect(),
    )
    .await
    .expect("the lookup is bounded");
    set.resume_sentinels();
    let error = connected.expect_err("no sentinel answers");
    let message = error.to_string();
    assert!(
        matches!(&error, distlock::LockError::NoAnswer { what, waited }
            if what.contains(SERVICE) && *waited == Duration::from_millis(400)),
        "{error:?}"
    );
    assert!(
        message.contains(&format!(
            "the sentinels of service `{SERVICE}` (or the master they named) did not answer \
             within 400ms: check that it runs and is reachable from this host"
        )) && message.contains("`connect_timeout`, `response_timeout`"),
        "{message}"
    );
    assert_eq!(
        std::io::Error::from(error).kind(),
        std::io::ErrorKind::TimedOut
    );
}

/// A sentinel URL's password is a secret: neither the error of a failed connect nor the
/// builder's `Debug` shows it.
#[tokio::test]
async fn a_sentinel_password_is_never_shown() {
    let refusing = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = refusing.local_addr().unwrap().port();
    drop(refusing);
    // Well-formed but refusing, and malformed: the connect's error and the URL check's.
    for urls in [
        vec![format!("redis://:hunter2-sentinel@127.0.0.1:{port}")],
        vec!["redis://:hunter2-sentinel@127.0.0.1:notaport".to_owned()],
    ] {
        let builder = LockManager::sentinel_builder(&urls, SERVICE);
        assert!(!format!("{builder:?}").contains("hunter2"), "{builder:?}");
        let error = tokio::time::timeout(Duration::from_secs(60), builder.connect())
            .await
            .expect("connect gives up")
            .expect_err("no sentinel answers");
        for shown in [format!("{error}"), format!("{error:?}")] {
            assert!(!shown.contains("hunter2"), "the password is shown: {shown}");
        }
    }
}

/// A release within `hold_at_least` right after a failover reaches the new master, as a plain
/// release does: the old one, now a read-only replica, refuses the write, and the release asks
/// the sentinels again rather than failing and leaving the lock to its full ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_release_after_a_failover_reaches_the_new_master() {
    let set = SentinelSet::start();
    let manager = connect(&set).await;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .hold_at_least(Duration::from_secs(3));
    let guard = manager.acquire("held-over", &options).await.unwrap();
    let new = tokio::task::block_in_place(|| {
        let old = set.master().port();
        let new = set.failover();
        assert_ne!(new.port(), old);
        new
    });
    assert_eq!(new.get("lock:held-over").as_deref(), Some(guard.token()));
    let released = tokio::time::timeout(Duration::from_secs(30), guard.release())
        .await
        .expect("the release ends");
    assert!(
        released.is_ok(),
        "released across the failover: {released:?}"
    );
    let left = new.pttl("lock:held-over");
    assert!(
        (0..=3_000).contains(&left),
        "the lock on the new master expires when the hold ends, not at its ttl: {left} ms left"
    );
}
