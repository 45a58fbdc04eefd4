//! Deadlock detection across processes: workers that each hold one lock (inside its guard's
//! scope) and then wait, with a 60 s timeout, for the lock of the next one.
//!
//! - two processes taking two locks in opposite orders: one gets `LockError::Deadlock`
//!   naming both locks, the other gets its second lock — long before the timeout;
//! - a cycle of three processes over three locks, likewise;
//! - the same two-process cycle on a 3-master cluster, its locks in different slots; a
//!   two-task cycle through a Sentinel service's master;
//! - a chain that is not a cycle (a → b → c → d, d's holder releasing after a while) is never
//!   reported: every worker gets its second lock;
//! - the in-process store reports a two-task cycle; Redlock reports none (it detects none), and
//!   its cycle times out as before;
//! - a waiter that holds nothing, or is not in a cycle, costs a bounded number of commands per
//!   walk, counted with `INFO commandstats`;
//! - a cycle through a holder that waits for two locks at once, through `acquire_all`'s wait,
//!   or through a read lock (also through one of more than 8 readers) has one victim; a wait through a semaphore with another holder
//!   that will release is not reported (permits are not followed);
//! - the waits hash keeps only live records, and replaces a key of another type.
//!
//! Each worker is this test binary run again (`spawn_worker`). The workers meet on a separate
//! standalone server (the "meeting point"), so that each holds its first lock before any asks
//! for its second, and report there what their second acquisition returned.

use std::time::Duration;

use distlock::{LockError, LockManager, LockOptions};
use test_support::{spawn_worker, wait_all, RedisCluster, RedisServer};

/// Where the locks live: a standalone URL, or cluster seeds joined by `,`.
const URLS: &str = "DISTLOCK_DEADLOCK_URLS";
/// `cluster` for a cluster, else standalone.
const KIND: &str = "DISTLOCK_DEADLOCK_KIND";
/// The meeting point's URL.
const MEET: &str = "DISTLOCK_DEADLOCK_MEET";
/// The lock the worker takes first and holds.
const HOLD: &str = "DISTLOCK_DEADLOCK_HOLD";
/// The lock it then waits for (empty: none, it holds its lock for `KEEP_MS` and releases).
const WANT: &str = "DISTLOCK_DEADLOCK_WANT";
/// How many workers meet.
const COUNT: &str = "DISTLOCK_DEADLOCK_COUNT";
/// How long the worker keeps its locks once it has them all, in ms.
const KEEP_MS: &str = "DISTLOCK_DEADLOCK_KEEP_MS";
/// The worker's label (the holder the error names).
const LABEL: &str = "DISTLOCK_DEADLOCK_LABEL";

/// The options every worker takes its locks with: a timeout far past what detection needs.
fn options(label: &str) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(60))
        .timeout(Duration::from_secs(60))
        .label(label)
}

/// What an acquisition of the second lock returned, as a worker reports it.
fn outcome(
    result: Result<distlock::LockGuard, LockError>,
) -> (String, Option<distlock::LockGuard>) {
    match result {
        Ok(guard) => ("ok".to_owned(), Some(guard)),
        Err(LockError::Deadlock { key, cycle }) => {
            (format!("deadlock {key} | {}", cycle.join(" | ")), None)
        }
        Err(error) => (format!("error {error}"), None),
    }
}

/// Worker: holds `HOLD`, meets the others, then waits for `WANT` inside `HOLD`'s scope, and
/// reports the outcome (`<label> ok`, `<label> deadlock <key> | <cycle>...`, `<label> error
/// ...`) on the meeting point's `outcomes` list.
pub(crate) fn deadlock_worker() {
    let var = |name: &str| std::env::var(name).expect("set by the test that starts this worker");
    let (urls, meet, hold, want, label) = (var(URLS), var(MEET), var(HOLD), var(WANT), var(LABEL));
    let count: i64 = var(COUNT).parse().unwrap();
    let keep = Duration::from_millis(var(KEEP_MS).parse().unwrap());
    test_support::runtime(2).block_on(async {
        let manager = if var(KIND) == "cluster" {
            let seeds: Vec<&str> = urls.split(',').collect();
            LockManager::cluster_builder(&seeds)
                .connect()
                .await
                .unwrap()
        } else {
            LockManager::connect(&urls).await.unwrap()
        };
        let options = options(&label);
        let guard = manager.acquire(&hold, &options).await.unwrap();
        let meeting = redis::Client::open(meet.as_str()).unwrap();
        let mut meeting = meeting.get_multiplexed_async_connection().await.unwrap();
        let _: i64 = redis::cmd("INCR")
            .arg("ready")
            .query_async(&mut meeting)
            .await
            .unwrap();
        // Every worker holds its first lock before any asks for its second.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let ready: i64 = redis::cmd("GET")
                .arg("ready")
                .query_async(&mut meeting)
                .await
                .unwrap();
            if ready >= count {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the other workers never came"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let report = guard
            .scope(async {
                if want.is_empty() {
                    tokio::time::sleep(keep).await;
                    return "ok".to_owned();
                }
                let (report, second) = outcome(manager.acquire(&want, &options).await);
                if let Some(second) = second {
                    tokio::time::sleep(keep).await;
                    second.release().await.unwrap();
                }
                report
            })
            .await;
        let _: i64 = redis::cmd("RPUSH")
            .arg("outcomes")
            .arg(format!("{label} {report}"))
            .query_async(&mut meeting)
            .await
            .unwrap();
        guard.release().await.unwrap();
    });
}

/// Where the workers' locks live.
enum Store<'a> {
    Standalone(&'a RedisServer),
    Cluster(&'a RedisCluster),
}

/// Runs one worker per `(hold, want, keep_ms)` and returns their reports, by label
/// (`w0`, `w1`, ...). Every worker must end well within the locks' 60 s timeout.
fn run(store: &Store<'_>, workers: &[(&str, &str, u64)]) -> Vec<String> {
    let meet = RedisServer::start();
    let (kind, urls) = match store {
        Store::Standalone(server) => ("standalone", server.url()),
        Store::Cluster(cluster) => ("cluster", cluster.urls().join(",")),
    };
    let children = workers
        .iter()
        .enumerate()
        .map(|(index, (hold, want, keep))| {
            spawn_worker(
                "deadlock::deadlock_worker",
                &[
                    (URLS, urls.clone()),
                    (KIND, kind.to_owned()),
                    (MEET, meet.url()),
                    (HOLD, (*hold).to_owned()),
                    (WANT, (*want).to_owned()),
                    (COUNT, workers.len().to_string()),
                    (KEEP_MS, keep.to_string()),
                    (LABEL, format!("w{index}")),
                ],
            )
        })
        .collect();
    // Far less than the 60 s a worker would wait for a lock that never comes.
    for status in wait_all(children, Duration::from_secs(30)) {
        assert!(status.success(), "a worker failed: {status}");
    }
    let mut reports: Vec<String> = redis::cmd("LRANGE")
        .arg("outcomes")
        .arg(0)
        .arg(-1)
        .query(&mut meet.conn())
        .unwrap();
    reports.sort();
    reports
}

/// Checks that exactly one report is a deadlock, naming `locks` (full keys) with their holders,
/// and that every other is `ok`.
fn one_victim(reports: &[String], locks: &[&str]) {
    assert_eq!(
        reports.len(),
        locks.len(),
        "one report per worker: {reports:?}"
    );
    let victims: Vec<&String> = reports
        .iter()
        .filter(|report| report.contains(" deadlock "))
        .collect();
    assert_eq!(victims.len(), 1, "exactly one victim: {reports:?}");
    for lock in locks {
        assert!(
            victims[0].contains(&format!("`{lock}` (held by w")),
            "the cycle names {lock} and its holder: {}",
            victims[0]
        );
    }
    let others = reports
        .iter()
        .filter(|report| report.ends_with(" ok"))
        .count();
    assert_eq!(
        others,
        locks.len() - 1,
        "the others got their locks: {reports:?}"
    );
}

#[test]
fn two_processes_taking_two_locks_in_opposite_orders_one_gives_up() {
    let server = RedisServer::start();
    let reports = run(
        &Store::Standalone(&server),
        &[("dl2:a", "dl2:b", 0), ("dl2:b", "dl2:a", 0)],
    );
    one_victim(&reports, &["lock:dl2:a", "lock:dl2:b"]);
}

#[test]
fn a_cycle_of_three_processes_over_three_locks_one_gives_up() {
    let server = RedisServer::start();
    let reports = run(
        &Store::Standalone(&server),
        &[
            ("dl3:a", "dl3:b", 0),
            ("dl3:b", "dl3:c", 0),
            ("dl3:c", "dl3:a", 0),
        ],
    );
    one_victim(&reports, &["lock:dl3:a", "lock:dl3:b", "lock:dl3:c"]);
}

#[test]
fn a_cycle_across_cluster_slots_one_gives_up() {
    let cluster = RedisCluster::start(3, 0);
    let (a, b) = ("lock:dlc:a", "lock:dlc:b");
    assert_ne!(
        cluster.master_for_slot(cluster.slot_of(a)).port(),
        cluster.master_for_slot(cluster.slot_of(b)).port(),
        "the two locks live on different masters"
    );
    let reports = run(
        &Store::Cluster(&cluster),
        &[("dlc:a", "dlc:b", 0), ("dlc:b", "dlc:a", 0)],
    );
    one_victim(&reports, &[a, b]);
}

#[test]
fn a_long_chain_that_is_not_a_cycle_is_never_reported() {
    let server = RedisServer::start();
    // a → b → c → d; d's holder waits for nothing and releases after 3 s, over several walks.
    let reports = run(
        &Store::Standalone(&server),
        &[
            ("dlch:a", "dlch:b", 0),
            ("dlch:b", "dlch:c", 0),
            ("dlch:c", "dlch:d", 0),
            ("dlch:d", "", 3000),
        ],
    );
    assert_eq!(reports, ["w0 ok", "w1 ok", "w2 ok", "w3 ok"]);
}

/// Two tasks of this process on `manager`: one holds `<prefix>:a` and waits for `<prefix>:b`,
/// the other the reverse, each with `timeout`; their reports (`t0 ok`, `t1 deadlock ...`).
async fn two_task_cycle(manager: &LockManager, prefix: &str, timeout: Duration) -> Vec<String> {
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    let task = |hold: String, want: String, label: &'static str| {
        let (manager, barrier) = (manager.clone(), barrier.clone());
        tokio::spawn(async move {
            let options = options(label).timeout(timeout);
            let guard = manager.acquire(&hold, &options).await.unwrap();
            barrier.wait().await;
            let report = guard
                .scope(async {
                    let (report, second) = outcome(manager.acquire(&want, &options).await);
                    if let Some(second) = second {
                        second.release().await.unwrap();
                    }
                    report
                })
                .await;
            guard.release().await.unwrap();
            format!("{label} {report}")
        })
    };
    let (a, b) = (format!("{prefix}:a"), format!("{prefix}:b"));
    let first = task(a.clone(), b.clone(), "t0");
    let second = task(b, a, "t1");
    // Far less than the 60 s timeout of the in-process test.
    tokio::time::timeout(Duration::from_secs(30), async {
        vec![first.await.unwrap(), second.await.unwrap()]
    })
    .await
    .expect("both tasks ended well before their timeout")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_process_store_reports_a_two_task_cycle() {
    let manager = LockManager::in_process();
    let reports = two_task_cycle(&manager, "dlm", Duration::from_secs(60)).await;
    let victims: Vec<&String> = reports
        .iter()
        .filter(|report| report.contains(" deadlock "))
        .collect();
    assert_eq!(victims.len(), 1, "exactly one victim: {reports:?}");
    assert!(
        victims[0].contains("`lock:dlm:a` (held by t"),
        "{reports:?}"
    );
    assert!(
        victims[0].contains("`lock:dlm:b` (held by t"),
        "{reports:?}"
    );
    assert!(
        reports.iter().any(|report| report.ends_with(" ok")),
        "{reports:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_master_reports_a_two_task_cycle() {
    let set = test_support::SentinelSet::start();
    let manager = crate::sentinel::connect(&set).await;
    let reports = two_task_cycle(&manager, "dls", Duration::from_secs(60)).await;
    let victims = reports
        .iter()
        .filter(|report| report.contains(" deadlock lock:dls:"))
        .count();
    assert_eq!(victims, 1, "exactly one victim: {reports:?}");
}

/// Redlock detects no deadlocks (docs/deadlocks.md): a cycle there waits out its timeout, as
/// it always did, and no wait record is written on any master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_reports_no_deadlock_and_the_cycle_times_out() {
    let servers = test_support::RedisServers::start(3);
    let manager = LockManager::redlock_builder(&servers.urls())
        .connect()
        .await
        .unwrap();
    let mut reports = two_task_cycle(&manager, "dlr", Duration::from_secs(2)).await;
    reports.sort();
    assert_eq!(reports.len(), 2);
    // The first to time out releases its lock, which the other may still get in time.
    assert!(
        reports.iter().all(|report| !report.contains(" deadlock ")),
        "{reports:?}"
    );
    assert!(
        reports
            .iter()
            .any(|report| report.contains(" error timed out")),
        "{reports:?}"
    );
    for server in servers.iter() {
        assert!(server.keys("*distlock:waits*").is_empty());
    }
}

/// The commands that reached `server` while `manager` waited 3 s for `dlcount:b`, in the
/// scope of `held` or, with `None`, holding nothing.
async fn commands_of_a_wait(
    server: &RedisServer,
    manager: &LockManager,
    held: Option<&distlock::LockGuard>,
) -> std::collections::BTreeMap<String, u64> {
    let mut conn = server.conn();
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(&mut conn)
        .unwrap();
    let short = options("counted").timeout(Duration::from_secs(3));
    let waiting = manager.acquire("dlcount:b", &short);
    let waited = match held {
        Some(held) => held.scope(waiting).await,
        None => waiting.await,
    };
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    RedisServer::command_counts_on(&mut conn)
}

/// An `acquire_all` outside any scope that holds none of its keys while it waits (its first
/// key is busy) is in no cycle: it writes no wait record and walks not — no read or write of a
/// `waits` key reaches the server during a 3 s wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_key_waiter_holding_nothing_sends_no_deadlock_commands() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let other = LockManager::connect(&server.url()).await.unwrap();
    let blocker = other.acquire("dlnone:a", &options("v")).await.unwrap();
    let mut conn = server.conn();
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(&mut conn)
        .unwrap();
    let short = options("counted").timeout(Duration::from_secs(3));
    let waited = manager.acquire_all(&["dlnone:a", "dlnone:b"], &short).await;
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    let stats = RedisServer::command_counts_on(&mut conn);
    let count = |command: &str| stats.get(command).copied().unwrap_or(0);
    assert_eq!(
        (count("hgetall"), count("hset")),
        (0, 0),
        "a multi-key waiter holding nothing walks not: {stats:?}"
    );
    assert!(server.keys("*distlock:waits*").is_empty());
    blocker.release().await.unwrap();
}

/// A waiter that holds a lock and waits, in a chain that is no cycle, sends per walk one
/// record write per lock it holds and one look per lock looked at, and no more: counted on the
/// server over a wait of several walks, against the same wait of a waiter that holds nothing.
/// Both are scripts (`EVALSHA`); inside them, a record write reads the lock's waits once
/// (`HGETALL`) and writes its field (`HSET`), a look reads them once (`HGETALL`), and the end of
/// the wait writes its end mark (`HSET`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_holder_sends_a_bounded_number_of_commands_per_walk() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let other = LockManager::connect(&server.url()).await.unwrap();
    let options = options("counted");
    // b's holder waits for nothing: each walk is one look (b) after one record write (a).
    let blocker = other.acquire("dlcount:b", &options).await.unwrap();
    let held = manager.acquire("dlcount:a", &options).await.unwrap();
    let plain = commands_of_a_wait(&server, &manager, None).await;
    let count = |stats: &std::collections::BTreeMap<String, u64>, command: &str| {
        stats.get(command).copied().unwrap_or(0)
    };
    assert_eq!(
        (count(&plain, "hgetall"), count(&plain, "hset")),
        (0, 0),
        "a waiter holding nothing walks not: {plain:?}"
    );
    let watched = commands_of_a_wait(&server, &manager, Some(&held)).await;
    eprintln!("a 3 s wait holding nothing: {plain:?}");
    eprintln!("the same wait holding one lock: {watched:?}");
    // Walks at 0.4 s, then every 0.7 s of a 3 s wait: 4, give or take one at either end.
    // Each writes one record (one `HSET`); the end of the wait one more.
    let walks = count(&watched, "hset").saturating_sub(1);
    assert!(
        (3..=5).contains(&walks),
        "one record write per walk: {watched:?}"
    );
    // One read of the waits by each record write, and one by each walk's one look.
    assert_eq!(
        count(&watched, "hgetall"),
        2 * walks,
        "one look per walk: {watched:?}"
    );
    // Besides the wait's own scripts (its place in line): per walk the record write and the
    // look, the end of the wait, and the first run's `SCRIPT LOAD` of the two scripts (their
    // `NOSCRIPT` tries counted too); the line's renewals may differ by one between the waits.
    let extra = count(&watched, "evalsha").saturating_sub(count(&plain, "evalsha"));
    assert!(
        (2 * walks..=2 * walks + 4).contains(&extra),
        "two scripts per walk: {extra} more scripts for {walks} walks: {watched:?}"
    );
    // A failed acquisition ends its wait before it returns: no walk sees it waiting after.
    let records: Vec<String> = redis::cmd("HVALS")
        .arg("{lock:dlcount:a}:distlock:waits")
        .query(&mut server.conn())
        .unwrap();
    assert!(
        !records.is_empty() && records.iter().all(|text| text.ends_with(" ended")),
        "the wait record is ended: {records:?}"
    );
    held.release().await.unwrap();
    blocker.release().await.unwrap();
}

/// Whether `result` is a deadlock report, as `report` shows it.
fn report_of(
    result: Result<distlock::LockGuard, LockError>,
) -> (String, Option<distlock::LockGuard>) {
    outcome(result)
}

/// Spawns `label`'s `acquire_all` of `names` on `manager`, waiting up to `timeout`: the task
/// releases what it got and ends with `"<label> <report>"`.
fn spawn_acquire_all<S: AsRef<str> + Send + Sync + 'static>(
    manager: &LockManager,
    label: &'static str,
    names: Vec<S>,
    timeout: Duration,
) -> tokio::task::JoinHandle<String> {
    let manager = manager.clone();
    tokio::spawn(async move {
        let options = options(label).timeout(timeout);
        let (report, guard) = report_of(manager.acquire_all(&names, &options).await);
        if let Some(guard) = guard {
            guard.release().await.unwrap();
        }
        format!("{label} {report}")
    })
}

/// A task that holds `x` and waits for two locks at once (`join!` inside `x`'s scope) is in a
/// real cycle through one of them: it waits for `a`, whose holder waits for `x`. Its other
/// wait, for `b` (held by a task that waits for nothing), has its own record in `x`'s waits,
/// beside the first: the cycle's last waiter, walking from `x`, follows both and finds the
/// cycle, and exactly one member gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_waiting_for_two_locks_at_once_still_gets_its_cycle_reported() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let timeout = Duration::from_secs(8);
    let blocker = manager.acquire("dljoin:b", &options("v")).await.unwrap();
    let u_holds = manager.acquire("dljoin:a", &options("u")).await.unwrap();
    let t_holds = manager.acquire("dljoin:x", &options("t")).await.unwrap();
    let t = {
        let manager = manager.clone();
        tokio::spawn(async move {
            let options = options("t").timeout(timeout);
            let (a, b) = t_holds
                .scope(async {
                    tokio::join!(
                        async { report_of(manager.acquire("dljoin:a", &options).await).0 },
                        async {
                            tokio::time::sleep(Duration::from_millis(350)).await;
                            report_of(manager.acquire("dljoin:b", &options).await).0
                        }
                    )
                })
                .await;
            t_holds.release().await.unwrap();
            format!("t/a {a}; t/b {b}")
        })
    };
    let u = {
        let manager = manager.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let options = options("u").timeout(timeout);
            let report = u_holds
                .scope(async { report_of(manager.acquire("dljoin:x", &options).await).0 })
                .await;
            u_holds.release().await.unwrap();
            format!("u {report}")
        })
    };
    let reports = [t.await.unwrap(), u.await.unwrap()];
    blocker.release().await.unwrap();
    let victims = reports
        .iter()
        .map(|report| report.matches("deadlock ").count())
        .sum::<usize>();
    assert_eq!(
        victims, 1,
        "exactly one victim in a real cycle: {reports:?}"
    );
}

/// `acquire_all` waiting inside a lock's scope is a wait like any other: a task that holds `x`
/// and waits in `acquire_all` for `a` (and `c`), while `a`'s holder waits for `x`, is in a
/// real cycle, and exactly one of the two gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_through_acquire_all_has_one_victim() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let timeout = Duration::from_secs(8);
    let u_holds = manager.acquire("dlall:a", &options("u")).await.unwrap();
    let t_holds = manager.acquire("dlall:x", &options("t")).await.unwrap();
    let t = {
        let manager = manager.clone();
        tokio::spawn(async move {
            let options = options("t").timeout(timeout);
            let report = t_holds
                .scope(async {
                    report_of(manager.acquire_all(&["dlall:a", "dlall:c"], &options).await).0
                })
                .await;
            t_holds.release().await.unwrap();
            format!("t {report}")
        })
    };
    let u = {
        let manager = manager.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let options = options("u").timeout(timeout);
            let report = u_holds
                .scope(async { report_of(manager.acquire("dlall:x", &options).await).0 })
                .await;
            u_holds.release().await.unwrap();
            format!("u {report}")
        })
    };
    let reports = [t.await.unwrap(), u.await.unwrap()];
    let victims = reports
        .iter()
        .filter(|report| report.contains(" deadlock "))
        .count();
    assert_eq!(
        victims, 1,
        "exactly one victim in a real cycle: {reports:?}"
    );
}

/// A reader is a holder like a writer: a task that holds a read lock of `r` (in its scope) and
/// waits for `m`, while `m`'s holder waits to write `r`, is in a real cycle. The reader writes
/// its record in `r`'s waits, and a look at `r` gives every reader with its waits, so exactly
/// one of the two gives up, and no Redis error shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_through_a_read_lock_has_one_victim() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let timeout = Duration::from_secs(8);
    let read = options("t").mode(distlock::LockMode::Read);
    let t_holds = manager.acquire("dlread:r", &read).await.unwrap();
    let u_holds = manager.acquire("dlread:m", &options("u")).await.unwrap();
    let t = {
        let manager = manager.clone();
        tokio::spawn(async move {
            let options = options("t").timeout(timeout);
            let report = t_holds
                .scope(async { report_of(manager.acquire("dlread:m", &options).await).0 })
                .await;
            t_holds.release().await.unwrap();
            format!("t {report}")
        })
    };
    let u = {
        let manager = manager.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let options = options("u").timeout(timeout);
            let report = u_holds
                .scope(async { report_of(manager.acquire("dlread:r", &options).await).0 })
                .await;
            u_holds.release().await.unwrap();
            format!("u {report}")
        })
    };
    let reports = [t.await.unwrap(), u.await.unwrap()];
    assert!(
        reports.iter().all(|report| !report.contains("Redis")),
        "{reports:?}"
    );
    let victims = reports
        .iter()
        .filter(|report| report.contains(" deadlock "))
        .count();
    assert_eq!(
        victims, 1,
        "exactly one victim in a real cycle: {reports:?}"
    );
}

/// A cycle through a reader of a lock that more than `MAX_HOLDERS` (8) readers hold: the
/// readers that wait for nothing came first (their leases run out first), and the one in the
/// cycle is still followed, so the cycle has one victim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_through_one_of_many_readers_has_one_victim() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let timeout = Duration::from_secs(8);
    let read = options("idle").mode(distlock::LockMode::Read);
    let mut idle = Vec::new();
    for _ in 0..10 {
        idle.push(manager.acquire("dlmany:r", &read).await.unwrap());
    }
    let t_holds = manager
        .acquire("dlmany:r", &options("t").mode(distlock::LockMode::Read))
        .await
        .unwrap();
    let u_holds = manager.acquire("dlmany:m", &options("u")).await.unwrap();
    let t = {
        let manager = manager.clone();
        tokio::spawn(async move {
            let options = options("t").timeout(timeout);
            let report = t_holds
                .scope(async { report_of(manager.acquire("dlmany:m", &options).await).0 })
                .await;
            t_holds.release().await.unwrap();
            format!("t {report}")
        })
    };
    let u = {
        let manager = manager.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let options = options("u").timeout(timeout);
            let report = u_holds
                .scope(async { report_of(manager.acquire("dlmany:r", &options).await).0 })
                .await;
            u_holds.release().await.unwrap();
            format!("u {report}")
        })
    };
    let reports = [t.await.unwrap(), u.await.unwrap()];
    // u's wait began last: it is the victim, and t then gets `m`.
    assert!(reports[0] == "t ok", "{reports:?}");
    assert!(reports[1].starts_with("u deadlock "), "{reports:?}");
    for guard in idle {
        guard.release().await.unwrap();
    }
}

/// A process killed (SIGKILL) while it held `a` and waited for `b` leaves its wait record, which
/// no end mark follows; once that record has lapsed, the holder of `b` waiting for `a` (still
/// held by the dead process, until its ttl) is told nothing of a deadlock: it waits, and times
/// out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_of_a_killed_process_lapses_and_reports_no_deadlock() {
    let server = RedisServer::start();
    let meet = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let b = manager.acquire("dlkill:b", &options("t")).await.unwrap();
    let mut child = spawn_worker(
        "deadlock::deadlock_worker",
        &[
            (URLS, server.url()),
            (KIND, "standalone".to_owned()),
            (MEET, meet.url()),
            (HOLD, "dlkill:a".to_owned()),
            (WANT, "dlkill:b".to_owned()),
            (COUNT, "1".to_owned()),
            (KEEP_MS, "0".to_owned()),
            (LABEL, "w0".to_owned()),
        ],
    );
    let waits = "{lock:dlkill:a}:distlock:waits";
    let started = std::time::Instant::now();
    loop {
        let values: Vec<String> = redis::cmd("HVALS")
            .arg(waits)
            .query(&mut server.conn())
            .unwrap();
        if values.iter().any(|value| value.ends_with("lock:dlkill:b")) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the worker never recorded its wait"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // Its record lives 3 s from its last renewal, which came before the kill.
    tokio::time::sleep(Duration::from_millis(3200)).await;
    assert!(
        server.exists("lock:dlkill:a"),
        "the dead process still holds a"
    );
    let options = options("t").timeout(Duration::from_secs(4));
    let waited = b
        .scope(async { manager.acquire("dlkill:a", &options).await.map(drop) })
        .await;
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "no deadlock through a process that is gone: {waited:?}"
    );
    b.release().await.unwrap();
}

/// A multi-key waiter holds the keys before the one it waits for (handed over while it waits).
/// A single-key caller that holds that key and asks for one of them closes a cycle: the
/// single-key caller, whose wait began last, is told, not left to its timeout, and the
/// multi-key waiter gets both locks. The multi-key waiter is another process (its own
/// manager), so that it waits in a's line in Redis and a is handed to it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_through_a_key_a_multi_key_waiter_holds_meanwhile_has_one_victim() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let other = LockManager::connect(&server.url()).await.unwrap();
    let timeout = Duration::from_secs(8);
    let v_holds = manager.acquire("dlmid:a", &options("v")).await.unwrap();
    let u_holds = manager.acquire("dlmid:b", &options("u")).await.unwrap();
    let t = spawn_acquire_all(&other, "t", vec!["dlmid:a", "dlmid:b"], timeout);
    // t waits in a's line; a handed to it, it holds a and waits for b.
    tokio::time::sleep(Duration::from_millis(300)).await;
    v_holds.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let u = {
        let manager = manager.clone();
        tokio::spawn(async move {
            let options = options("u").timeout(timeout);
            let report = u_holds
                .scope(async { report_of(manager.acquire("dlmid:a", &options).await).0 })
                .await;
            u_holds.release().await.unwrap();
            format!("u {report}")
        })
    };
    let reports = [t.await.unwrap(), u.await.unwrap()];
    assert_eq!(reports[0], "t ok", "{reports:?}");
    assert!(reports[1].starts_with("u deadlock "), "{reports:?}");
}

/// `t` takes `a` and waits for `b` (held by `u`) in one `acquire_all`, outside any scope, on
/// `t_manager`; then `u`, inside the scope of `b`, asks for `a` on `u_manager`. The reports of
/// both, `t` first.
async fn a_cycle_through_a_key_taken_one_by_one(
    t_manager: &LockManager,
    u_manager: &LockManager,
    prefix: &str,
) -> [String; 2] {
    let timeout = Duration::from_secs(8);
    let (a, b) = (format!("{prefix}:a"), format!("{prefix}:b"));
    let u_holds = u_manager.acquire(&b, &options("u")).await.unwrap();
    let t = spawn_acquire_all(t_manager, "t", vec![a.clone(), b], timeout);
    // t takes a (free) at once, then waits for b.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let u = {
        let manager = u_manager.clone();
        tokio::spawn(async move {
            let options = options("u").timeout(timeout);
            let report = u_holds
                .scope(async { report_of(manager.acquire(&a, &options).await).0 })
                .await;
            u_holds.release().await.unwrap();
            format!("u {report}")
        })
    };
    [t.await.unwrap(), u.await.unwrap()]
}

/// Across cluster slots `acquire_all` takes its keys one by one: the key it took before the
/// one it waits for carries its wait, so the single-key caller that closes the cycle, whose
/// wait began last, is its victim and the multi-key caller gets both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_through_a_key_taken_one_by_one_across_cluster_slots_has_one_victim() {
    let cluster = crate::cluster::shared_cluster();
    let t_manager = crate::cluster::cluster_manager(&cluster.urls()).await;
    let u_manager = crate::cluster::cluster_manager(&cluster.urls()).await;
    // `lock:dlmc:a` and `lock:dlmc:b` hash to different slots (7053, 11246).
    let reports = a_cycle_through_a_key_taken_one_by_one(&t_manager, &u_manager, "dlmc").await;
    assert_eq!(reports[0], "t ok", "{reports:?}");
    assert!(reports[1].starts_with("u deadlock "), "{reports:?}");
    assert!(
        reports[1].contains("`lock:dlmc:a` (held by t"),
        "{reports:?}"
    );
}

/// The in-process table takes an `acquire_all`'s keys one by one too: the same cycle, inside
/// one process, has the same one victim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_through_a_key_taken_one_by_one_in_process_has_one_victim() {
    let manager = LockManager::in_process();
    let reports = a_cycle_through_a_key_taken_one_by_one(&manager, &manager, "dlmp").await;
    assert_eq!(reports[0], "t ok", "{reports:?}");
    assert!(reports[1].starts_with("u deadlock "), "{reports:?}");
}

/// Lock names with braces (a hash tag, an empty one, unbalanced ones), spaces and a line
/// break are names like others: the wait record names the lock waited for by its full key,
/// and the walk follows it back to the same key, so the two-task cycle still has one victim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_over_hostile_lock_names_has_one_victim() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    for prefix in ["dlh}{ {} x", "dlh {tag}", "dlh\n{", "dlh}:distlock:waits"] {
        let reports = two_task_cycle(&manager, prefix, Duration::from_secs(20)).await;
        let victims = reports
            .iter()
            .filter(|report| report.contains(" deadlock "))
            .count();
        assert_eq!(victims, 1, "exactly one victim for {prefix:?}: {reports:?}");
    }
}

/// Hostile names on a 3-master cluster: a `}` without a tag, an empty tag, a NUL and other
/// control bytes, a tag that puts the waits key beside the lock's, and a name of 64 KiB. Each
/// lock's waits key lives in its lock's slot, wherever that is, and the walk follows each
/// record back to its lock's node: one victim per cycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_over_hostile_lock_names_on_a_cluster_has_one_victim() {
    let cluster = crate::cluster::shared_cluster();
    let manager = crate::cluster::cluster_manager(&cluster.urls()).await;
    let huge = format!("dlch:{}", "x".repeat(64 * 1024));
    for prefix in [
        "dlch}x",
        "dlch{}y",
        "dlch\0\u{1}\u{7f}é",
        "dlch}:distlock:waits{",
        "{dlch}}{",
        huge.as_str(),
    ] {
        let reports = two_task_cycle(&manager, prefix, Duration::from_secs(20)).await;
        let victims = reports
            .iter()
            .filter(|report| report.contains(" deadlock "))
            .count();
        let shown: String = prefix.chars().take(40).collect();
        assert_eq!(victims, 1, "exactly one victim for {shown:?}: {reports:?}");
        assert!(
            reports.iter().any(|report| report.ends_with(" ok")),
            "the other member got its lock for {shown:?}: {reports:?}"
        );
    }
}

/// A watched wait cancelled after its record was written (its future dropped by a timeout
/// around it) ends its record with the end mark, not by letting it lapse: a walk after the
/// end mark is written sees no wait, and a renewal cannot bring it back. The lock held stays
/// held, and its holder can wait again at once, with a fresh record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_ends_its_record_and_a_new_wait_records_again() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let blocker = manager.acquire("dlcancel:b", &options("v")).await.unwrap();
    let held = manager.acquire("dlcancel:a", &options("t")).await.unwrap();
    // The newest record or end mark of the lock's waits (one wait at a time here: the
    // greatest expiry is the last written).
    let read = || -> Option<String> {
        let values: Vec<String> = redis::cmd("HVALS")
            .arg("{lock:dlcancel:a}:distlock:waits")
            .query(&mut server.conn())
            .unwrap();
        values
            .into_iter()
            .max_by_key(|text| text.split(' ').next().and_then(|ms| ms.parse::<u64>().ok()))
    };
    let waiting_options = options("t");
    for round in 0..3 {
        let waiting = held.scope(manager.acquire("dlcancel:b", &waiting_options));
        // Past the first walk (0.4 s): the record is written, then the wait is dropped.
        let cancelled = tokio::time::timeout(Duration::from_millis(650), waiting).await;
        assert!(
            cancelled.is_err(),
            "round {round}: still waiting when cancelled"
        );
        let mut record = read();
        for _ in 0..100 {
            if record
                .as_deref()
                .is_some_and(|text| text.ends_with(" ended"))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            record = read();
        }
        assert!(
            record
                .as_deref()
                .is_some_and(|text| text.ends_with(" ended")),
            "round {round}: the cancelled wait's record is ended: {record:?}"
        );
        // Nothing is written for the dropped wait after its end.
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(read(), record, "round {round}: no renewal after the end");
    }
    assert!(held.is_held().await.unwrap());
    held.release().await.unwrap();
    blocker.release().await.unwrap();
}

/// A task that holds several locks taken together (`acquire_all`: on one node by one script,
/// one token for all; on a cluster, in different slots, one by one) and waits, in their scope,
/// for `c`, whose holder waits for the second of them, is in a real cycle: one of the two must
/// give up. `names` are the two locks taken together, `c` the third; their reports.
async fn cycle_through_acquire_all(
    manager: &LockManager,
    names: [&'static str; 2],
    c: &'static str,
) -> Vec<String> {
    let timeout = Duration::from_secs(8);
    let t_holds = manager.acquire_all(&names, &options("t")).await.unwrap();
    let u_holds = manager.acquire(c, &options("u")).await.unwrap();
    let t = {
        let manager = manager.clone();
        tokio::spawn(async move {
            let options = options("t").timeout(timeout);
            let report = t_holds
                .scope(async { report_of(manager.acquire(c, &options).await).0 })
                .await;
            t_holds.release().await.unwrap();
            format!("t {report}")
        })
    };
    let u = {
        let manager = manager.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let options = options("u").timeout(timeout);
            let report = u_holds
                .scope(async { report_of(manager.acquire(names[1], &options).await).0 })
                .await;
            u_holds.release().await.unwrap();
            format!("u {report}")
        })
    };
    vec![t.await.unwrap(), u.await.unwrap()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_through_the_second_lock_of_acquire_all_has_one_victim() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let reports =
        cycle_through_acquire_all(&manager, ["dlmulti:{s}:a", "dlmulti:{s}:b"], "dlmulti:c").await;
    let victims = reports
        .iter()
        .filter(|report| report.contains(" deadlock "))
        .count();
    assert_eq!(
        victims, 1,
        "exactly one victim in a real cycle: {reports:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_through_a_part_of_acquire_all_across_cluster_slots_has_one_victim() {
    let cluster = RedisCluster::start(3, 0);
    let names = ["dlparts:a", "dlparts:b"];
    assert_ne!(
        cluster.slot_of(&format!("lock:{}", names[0])),
        cluster.slot_of(&format!("lock:{}", names[1])),
        "taken one by one"
    );
    let manager = LockManager::cluster_builder(&cluster.urls())
        .connect()
        .await
        .unwrap();
    let reports = cycle_through_acquire_all(&manager, names, "dlparts:c").await;
    let victims = reports
        .iter()
        .filter(|report| report.contains(" deadlock "))
        .count();
    assert_eq!(
        victims, 1,
        "exactly one victim in a real cycle: {reports:?}"
    );
}

/// A semaphore's permit waiter is let in when any holder releases: a task that holds a permit
/// of `s` (2 permits) and waits for `m`, while `m`'s holder waits for a permit of `s`, is no
/// cycle while the other permit's holder (`v`, which waits for nothing) will release. Permits
/// are not followed, so nobody is reported: `v` releases after 3 s (past two walks of the
/// others), `u` gets its permit, and then `t` gets `m`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_through_a_semaphore_with_another_holder_is_not_reported() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let timeout = Duration::from_secs(20);
    let permit = |label: &str| options(label).permits(2);
    let t_holds = manager.acquire("dlsem:s", &permit("t")).await.unwrap();
    let v_holds = manager.acquire("dlsem:s", &permit("v")).await.unwrap();
    let u_holds = manager.acquire("dlsem:m", &options("u")).await.unwrap();
    let t = {
        let manager = manager.clone();
        tokio::spawn(async move {
            let options = options("t").timeout(timeout);
            let report = t_holds
                .scope(async { report_of(manager.acquire("dlsem:m", &options).await).0 })
                .await;
            t_holds.release().await.unwrap();
            format!("t {report}")
        })
    };
    let u = {
        let manager = manager.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let options = permit("u").timeout(timeout);
            let (report, guard) = u_holds
                .scope(async { report_of(manager.acquire("dlsem:s", &options).await) })
                .await;
            if let Some(guard) = guard {
                guard.release().await.unwrap();
            }
            u_holds.release().await.unwrap();
            format!("u {report}")
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    v_holds.release().await.unwrap();
    let reports = [t.await.unwrap(), u.await.unwrap()];
    assert_eq!(reports, ["t ok", "u ok"], "no deadlock is reported");
}

/// The waits of a lock are a hash that keeps only live records: a record that ran out (left
/// by a holder that died) is dropped by the next write, and a key of another type (a record
/// of an older version, a string) is replaced rather than failing every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_write_drops_lapsed_records_and_replaces_a_key_of_another_type() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let waits = "{lock:dlprune:a}:distlock:waits";
    let blocker = manager.acquire("dlprune:b", &options("v")).await.unwrap();
    let held = manager.acquire("dlprune:a", &options("t")).await.unwrap();
    let fields = || -> std::collections::BTreeMap<String, String> {
        redis::cmd("HGETALL")
            .arg(waits)
            .query(&mut server.conn())
            .unwrap()
    };
    for stale in ["string", "lapsed"] {
        if stale == "string" {
            redis::cmd("SET")
                .arg(waits)
                .arg("old-token w0 1 lock:x")
                .query::<()>(&mut server.conn())
                .unwrap();
        } else {
            redis::cmd("HSET")
                .arg(waits)
                .arg("w0 1")
                .arg("1 dead-token w0 1 lock:x")
                .query::<()>(&mut server.conn())
                .unwrap();
        }
        // Past the first walk (0.4 s): its record is written.
        let waiting_options = options("t");
        let waiting = held.scope(manager.acquire("dlprune:b", &waiting_options));
        let cancelled = tokio::time::timeout(Duration::from_millis(650), waiting).await;
        assert!(cancelled.is_err(), "{stale}: still waiting when cancelled");
        let now = fields();
        assert!(
            !now.contains_key("w0 1") && !now.is_empty(),
            "{stale}: the stale record is gone, this wait's is there: {now:?}"
        );
        assert!(
            now.values()
                .all(|text| text.ends_with(" lock:dlprune:b") || text.ends_with(" ended")),
            "{stale}: {now:?}"
        );
    }
    held.release().await.unwrap();
    blocker.release().await.unwrap();
}

/// A multi-key acquisition taken by one script (`t`: names in one slot, on a cluster) holds a
/// key only while every name before it is its own or free: once one of those is taken, its
/// next look (every renewal, 1 s) gives the key back, handed to the first waiter of its line,
/// and waits for the name taken. So `t`, holding `k` (handed to it in k's line while `n` was
/// free) and waiting for `b`, does not wait for `n` holding `k`, though its record at `k` names
/// `n`. Here `z`, an `acquire_all` taken one by one (its names across slots) whose wait began
/// after `t`'s and is walked every 0.7 s, takes `z0` and then `n` (free) just after one of
/// `t`'s looks, and waits for `k`: `t`'s next look hands `k` to `z`. Nothing is a cycle; `z`
/// gets its locks, then `t` gets its own. `z`'s two walks before `t`'s next look must not
/// report `k → n` as a deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_a_multi_key_waiter_gives_back_at_its_next_look_closes_no_cycle() {
    let cluster = crate::cluster::shared_cluster();
    let (n, k, b, z0) = ("{dlgb}:1n", "{dlgb}:2k", "{dlgb}:3b", "dlgb:0");
    let k_key = format!("lock:{k}");
    // z0 sorts before n (byte-wise), in another slot: z takes z0, then n, then waits for k.
    assert!(format!("lock:{z0}") < format!("lock:{n}"));
    assert_ne!(
        cluster.slot_of(&format!("lock:{z0}")),
        cluster.slot_of(&format!("lock:{n}")),
        "z's names are taken one by one"
    );
    let holders = crate::cluster::cluster_manager(&cluster.urls()).await;
    let t_manager = crate::cluster::cluster_manager(&cluster.urls()).await;
    let z_manager = crate::cluster::cluster_manager(&cluster.urls()).await;
    let k_node = redis::Client::open(cluster.node_for_key(&k_key).url()).unwrap();
    let mut k_node = k_node.get_multiplexed_async_connection().await.unwrap();
    let timeout = Duration::from_secs(30);
    let hold_b = holders.acquire(b, &options("v")).await.unwrap();
    let hold_k = holders.acquire(k, &options("h")).await.unwrap();
    let hold_z0 = holders.acquire(z0, &options("h")).await.unwrap();
    // t: n free, k busy: t waits in k's line.
    let t_task = spawn_acquire_all(&t_manager, "t", vec![n, k, b], timeout);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // z waits for z0; its wait is watched from now on (walks at 0.4 s, then every 0.7 s).
    let z_started = tokio::time::Instant::now();
    let z_task = spawn_acquire_all(&z_manager, "z", vec![z0, n, k], timeout);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // k handed to t: t holds it, its ttl cut to the lease (3 s) at each of t's looks, and waits
    // in b's line.
    hold_k.release().await.unwrap();
    let pttl = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        let key = k_key.clone();
        async move {
            redis::cmd("PTTL")
                .arg(key)
                .query_async::<i64>(&mut conn)
                .await
                .unwrap()
        }
    };
    // Past a walk of t's, which writes its record at k.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let left = pttl(&mut k_node).await;
    assert!((0..=3000).contains(&left), "t holds k: {left}");
    // Just after one of t's looks (k's ttl goes back up), when z's next walk comes 60..180 ms
    // later, z0 is released: z takes z0 and n at once and waits for k. t's next look comes
    // 1 s after its last; z walks twice before it.
    let walk_every = Duration::from_millis(700);
    let first_walk = z_started + Duration::from_millis(400);
    let mut last = pttl(&mut k_node).await;
    let give_up = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        assert!(tokio::time::Instant::now() < give_up, "no look of t's came");
        tokio::time::sleep(Duration::from_millis(2)).await;
        let now_left = pttl(&mut k_node).await;
        let looked = now_left > last;
        last = now_left;
        if !looked {
            continue;
        }
        let now = tokio::time::Instant::now();
        let walks = (now - first_walk).as_millis() / walk_every.as_millis() + 1;
        let next_walk = first_walk + walk_every * u32::try_from(walks).unwrap();
        let ahead = next_walk - now;
        if ahead >= Duration::from_millis(60) && ahead <= Duration::from_millis(180) {
            break;
        }
    }
    hold_z0.release().await.unwrap();
    let z_report = tokio::time::timeout(Duration::from_secs(20), z_task)
        .await
        .expect("z ends")
        .unwrap();
    hold_b.release().await.unwrap();
    let t_report = tokio::time::timeout(Duration::from_secs(20), t_task)
        .await
        .expect("t ends")
        .unwrap();
    assert_eq!(
        [z_report.as_str(), t_report.as_str()],
        ["z ok", "t ok"],
        "no cycle: t gives k to z at its next look"
    );
}
