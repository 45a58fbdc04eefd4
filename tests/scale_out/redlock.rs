//! Redlock over 5 independent masters (`RedisServers::start(5)`): a lock is held when a
//! majority (3) granted it in time. It excludes with all masters up and with 2 of them dead,
//! fails with a clear error within the timeout when 3 are dead, stays fast when one is frozen
//! (the fan-out is concurrent, each master bounded by the per-node timeout), gives back partial
//! grants, refuses fencing, auto-extends, and wakes waiters on release.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{distributed_lock, LockError, LockGuard, LockManager, LockOptions};
use redis::aio::MultiplexedConnection;
use test_support::{
    keys, send_signal, spawn_worker, wait_all, wait_until, RedisServer, RedisServers,
};
use tokio::time::Instant;

const MAJORITY: usize = 3;

async fn redlock(servers: &RedisServers) -> LockManager {
    LockManager::redlock_builder(&servers.urls())
        .connect()
        .await
        .unwrap_or_else(|error| panic!("cannot connect a Redlock manager: {error}"))
}

async fn connection(server: &RedisServer) -> MultiplexedConnection {
    server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|error| panic!("cannot connect to {}: {error}", server.url()))
}

/// The indexes of the running masters on which `key` holds exactly `token`.
fn token_holders(servers: &RedisServers, key: &str, token: &str) -> Vec<usize> {
    servers
        .iter()
        .enumerate()
        .filter(|(_, server)| server.is_running() && server.get(key).as_deref() == Some(token))
        .map(|(i, _)| i)
        .collect()
}

/// GET the counter, let other tasks run, SET it one higher: loses updates unless exclusive.
async fn read_modify_write(data: &mut MultiplexedConnection, counter: &str) {
    let value: Option<u64> = redis::cmd("GET")
        .arg(counter)
        .query_async(data)
        .await
        .expect("GET counter");
    tokio::time::sleep(Duration::from_millis(1)).await;
    redis::cmd("SET")
        .arg(counter)
        .arg(value.unwrap_or(0) + 1)
        .query_async::<()>(data)
        .await
        .expect("SET counter");
}

/// `tasks` tasks on each manager, `sections` read-modify-writes each under the lock `name`,
/// with the counter on `data`. Returns the most bodies ever inside at once. The first section
/// of each task checks that a majority of the running masters hold its token.
async fn run_sections(
    servers: &Arc<RedisServers>,
    managers: &[LockManager],
    data: &MultiplexedConnection,
    name: &str,
    tasks: usize,
    sections: usize,
) -> usize {
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for manager in managers {
        for _ in 0..tasks {
            let (manager, mut data, name) = (manager.clone(), data.clone(), name.to_owned());
            let (servers, inside, max_inside) =
                (servers.clone(), inside.clone(), max_inside.clone());
            handles.push(tokio::spawn(async move {
                let options = LockOptions::new()
                    .ttl(Duration::from_secs(10))
                    .timeout(Duration::from_secs(30));
                for section in 0..sections {
                    let guard = manager.acquire(&name, &options).await.expect("acquire");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    max_inside.fetch_max(now, Ordering::SeqCst);
                    if section == 0 {
                        let holders = token_holders(&servers, guard.key(), guard.token());
                        assert!(
                            holders.len() >= MAJORITY,
                            "a granted Redlock lock is held on a majority: {holders:?}"
                        );
                    }
                    read_modify_write(&mut data, &format!("{name}:counter")).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
            }));
        }
    }
    for handle in handles {
        handle.await.expect("a section task failed");
    }
    max_inside.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redlock_excludes_with_exact_counts() {
    let servers = Arc::new(RedisServers::start(5));
    let managers = [redlock(&servers).await, redlock(&servers).await];
    let data = connection(&servers[0]).await;
    let started = Instant::now();
    let max_inside = run_sections(&servers, &managers, &data, "mutex", 8, 10).await;
    eprintln!("160 Redlock sections in {:?}", started.elapsed());
    assert_eq!(servers[0].get("mutex:counter").as_deref(), Some("160"));
    assert_eq!(max_inside, 1, "at most one body inside at a time");
    assert_eq!(
        servers.holders("lock:mutex"),
        Vec::<usize>::new(),
        "released on every master"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_two_of_five_masters_dead_it_still_grants_and_excludes() {
    let servers = Arc::new(RedisServers::start(5));
    // One manager connected before the crash (its connections to the dead masters break),
    // one connected after it (a majority answers its PING).
    let before = redlock(&servers).await;
    servers[3].kill();
    servers[4].kill();
    let after = redlock(&servers).await;
    let data = connection(&servers[0]).await;
    let started = Instant::now();
    let max_inside = run_sections(&servers, &[before, after], &data, "survivor", 8, 10).await;
    let took = started.elapsed();
    eprintln!("160 Redlock sections with 2 masters dead in {took:?}");
    // A dead master refuses connections at once, so it must cost next to nothing; all masters
    // up this takes about 1 s, and so does this on a loaded 2-core machine. Two contenders that
    // split the three live masters each see the other as a possible holder (with the two silent
    // masters): unless their give-backs wake each other, both sleep until their next renewal,
    // a second per split, and this takes 3–18 s.
    assert!(
        took < Duration::from_secs(6),
        "dead masters slowed every section: 160 took {took:?}"
    );
    assert_eq!(servers[0].get("survivor:counter").as_deref(), Some("160"));
    assert_eq!(max_inside, 1, "at most one body inside at a time");
    assert_eq!(servers.holders("lock:survivor"), Vec::<usize>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_three_of_five_masters_dead_it_fails_clearly_within_the_timeout() {
    let servers = RedisServers::start(5);
    let manager = redlock(&servers).await;
    for server in &servers[2..] {
        server.kill();
    }

    let timeout = Duration::from_secs(2);
    let options = LockOptions::new().timeout(timeout);
    let started = Instant::now();
    let error = manager
        .acquire("minority", &options)
        .await
        .expect_err("a minority of masters cannot grant a lock");
    let took = started.elapsed();
    eprintln!("acquire with 3 of 5 masters dead failed after {took:?}: {error}");
    assert!(
        matches!(
            error,
            LockError::NoQuorum {
                masters: 5,
                answered: 2,
                needed: 3,
                ..
            }
        ),
        "expected LockError::NoQuorum, got {error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("Redlock masters answered") && message.contains("majority"),
        "the message says a majority of the masters is missing: {message}"
    );
    assert!(
        took < timeout + Duration::from_secs(2),
        "it failed within the timeout (+2 s): {took:?}"
    );
    // The grants of the two live masters were given back.
    assert_eq!(servers.holders("lock:minority"), Vec::<usize>::new());

    let started = Instant::now();
    let error = manager
        .try_acquire("minority", &options)
        .await
        .expect_err("try_acquire fails too");
    assert!(matches!(error, LockError::NoQuorum { .. }), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(2));

    let started = Instant::now();
    let error = LockManager::redlock_builder(&servers.urls())
        .connect()
        .await
        .expect_err("connect needs a majority of the masters");
    eprintln!("connect failed after {:?}: {error}", started.elapsed());
    assert!(
        matches!(error, LockError::NoQuorum { needed: 3, .. }),
        "{error:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// Resumes a paused server when dropped, so a failing test does not leave it frozen.
struct Resume<'a>(&'a RedisServer);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_costs_at_most_the_per_node_timeout() {
    let servers = RedisServers::start(5);
    let manager = LockManager::redlock_builder(&servers.urls())
        .node_timeout(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    // Warm up: every master has a connection and the scripts loaded.
    manager
        .acquire("frozen", &options)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    servers[0].pause();
    let resume = Resume(&servers[0]);
    let mut cycles = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let guard = manager.acquire("frozen", &options).await.expect("acquire");
        guard.release().await.expect("release");
        cycles.push(started.elapsed());
    }

    // A manager made while the master is frozen: connect waits only for a majority, and its
    // locks cost no more (its connection to the frozen master never completes).
    let started = Instant::now();
    let late = LockManager::redlock_builder(&servers.urls())
        .node_timeout(Duration::from_millis(100))
        .connect()
        .await
        .expect("4 of 5 masters answer");
    let connect_took = started.elapsed();
    let mut late_cycles = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let guard = late
            .acquire("frozen-late", &options)
            .await
            .expect("acquire");
        guard.release().await.expect("release");
        late_cycles.push(started.elapsed());
    }
    drop(resume);
    eprintln!("manager made while frozen: connect {connect_took:?}, cycles {late_cycles:?}");
    assert!(connect_took < Duration::from_secs(1), "{connect_took:?}");
    assert!(
        late_cycles
            .iter()
            .all(|cycle| *cycle < Duration::from_secs(1)),
        "{late_cycles:?}"
    );
    cycles.sort();
    let p50 = cycles[cycles.len() / 2];
    let max = *cycles.last().unwrap();
    eprintln!("acquire+release with one master frozen: p50 {p50:?}, max {max:?}");
    assert!(
        max < Duration::from_secs(1),
        "each cycle is bounded by the per-node timeout, not the response timeout: {cycles:?}"
    );
    assert!(p50 < Duration::from_millis(500), "{cycles:?}");

    // Resumed, the frozen master runs the queued attempts and their releases in order:
    // nothing stays held there.
    let deadline = Instant::now() + Duration::from_secs(5);
    while servers[0].exists("lock:frozen") || servers[0].exists("lock:frozen-late") {
        assert!(
            Instant::now() < deadline,
            "a grant made while frozen was never released on the resumed master"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn fencing_is_refused_on_redlock_with_the_reason() {
    let servers = RedisServers::start(5);
    let manager = redlock(&servers).await;
    let fenced = LockOptions::new().fencing(true);
    for result in [
        manager.acquire("fenced", &fenced).await.map(Some),
        manager.try_acquire("fenced", &fenced).await,
    ] {
        let error = result.expect_err("fencing is refused on Redlock");
        let LockError::Config(message) = &error else {
            panic!("expected LockError::Config, got {error:?}");
        };
        assert!(
            message.contains("Redlock") && message.contains("independent masters"),
            "the message says why: {message}"
        );
    }
    assert_eq!(servers.holders("lock:fenced"), Vec::<usize>::new());

    let guard = manager
        .acquire("fenced", &LockOptions::new())
        .await
        .unwrap();
    assert_eq!(guard.fencing_token(), None);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_grant_is_given_back() {
    let servers = RedisServers::start(5);
    let manager = redlock(&servers).await;
    let key = "lock:partial";
    // Another holder has the lock on 3 masters: a contender can win only the other 2.
    for server in &servers[..3] {
        server.set_px(key, "someone-else", 30_000);
    }

    let got = manager
        .try_acquire("partial", &LockOptions::new())
        .await
        .expect("try_acquire answers");
    assert!(got.is_none(), "2 of 5 is no majority");
    assert_eq!(
        servers.holders(key),
        vec![0, 1, 2],
        "the contender's 2 grants were given back at once"
    );
    assert_eq!(token_holders(&servers, key, "someone-else"), vec![0, 1, 2]);

    // Waiting gives them back too, on every retry and at the timeout.
    let error = manager
        .acquire(
            "partial",
            &LockOptions::new().timeout(Duration::from_millis(500)),
        )
        .await
        .expect_err("still no majority");
    assert!(matches!(error, LockError::Timeout { .. }), "{error:?}");
    assert_eq!(servers.holders(key), vec![0, 1, 2]);
    assert_eq!(token_holders(&servers, key, "someone-else"), vec![0, 1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_extend_keeps_a_majority_and_a_lost_majority_is_reported() {
    let servers = RedisServers::start(5);
    let manager = redlock(&servers).await;

    // A 1 s lock through a 2.5 s body.
    let guard = manager
        .acquire(
            "extended",
            &LockOptions::new()
                .ttl(Duration::from_secs(1))
                .auto_extend(true),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let holders = token_holders(&servers, guard.key(), guard.token());
    assert!(
        holders.len() >= MAJORITY,
        "auto-extension kept the lock on a majority past its ttl: {holders:?}"
    );
    assert!(!guard.is_lost());
    assert!(guard.is_held().await.unwrap());
    guard.release().await.expect("released in time");
    assert_eq!(servers.holders("lock:extended"), Vec::<usize>::new());

    // Gone from a majority (expired there, say): extend and release report Lost, and the
    // release still clears the minority that held it.
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let guard = manager.acquire("majority-lost", &options).await.unwrap();
    for server in &servers[..3] {
        assert!(server.del("lock:majority-lost"));
    }
    assert!(!guard.is_held().await.unwrap());
    let error = guard.extend(Duration::from_secs(30)).await.unwrap_err();
    assert!(matches!(error, LockError::Lost { .. }), "{error:?}");
    let error = guard.release().await.unwrap_err();
    assert!(matches!(error, LockError::Lost { .. }), "{error:?}");
    assert_eq!(servers.holders("lock:majority-lost"), Vec::<usize>::new());

    // Expired everywhere.
    let guard = manager
        .acquire(
            "expired",
            &LockOptions::new().ttl(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let error = guard.release().await.unwrap_err();
    assert!(matches!(error, LockError::Lost { .. }), "{error:?}");

    // An auto-extended holder whose lock vanishes from a majority learns it is lost.
    let guard: LockGuard = manager
        .acquire(
            "vanishing",
            &LockOptions::new()
                .ttl(Duration::from_secs(1))
                .auto_extend(true),
        )
        .await
        .unwrap();
    for server in &servers[2..] {
        server.del("lock:vanishing");
    }
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("the watchdog notices the lost majority within the ttl");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_redlock_waiter() {
    let servers = RedisServers::start(5);
    let holder_manager = redlock(&servers).await;
    let waiter_manager = redlock(&servers).await;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(10));
    let holder = holder_manager.acquire("wake", &options).await.unwrap();
    let waiter = tokio::spawn({
        let options = options.clone();
        async move {
            let started = Instant::now();
            let guard = waiter_manager.acquire("wake", &options).await;
            (guard, started.elapsed())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    let released_at = Instant::now();
    holder.release().await.unwrap();
    let (guard, waited) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter finished")
        .unwrap();
    let guard = guard.expect("the waiter gets the lock");
    let after_release = released_at.elapsed();
    eprintln!("Redlock waiter waited {waited:?}; got it {after_release:?} after the release");
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    assert!(
        after_release < Duration::from_secs(3),
        "with a 30 s ttl only a wake-up explains a hand-off within 3 s: {after_release:?}"
    );
    assert!(token_holders(&servers, guard.key(), guard.token()).len() >= MAJORITY);
    guard.release().await.unwrap();
}

/// How many commands the masters ran since their stats were last reset, leaving out the test's
/// own `INFO` and `CONFIG` calls.
fn commands_run(servers: &RedisServers) -> u64 {
    servers
        .iter()
        .flat_map(test_support::RedisServer::command_counts)
        .filter(|(name, _)| name != "info" && !name.starts_with("config|"))
        // A server that counts no subcommands (Redis 6.2) counts the reset itself as one
        // `config` call: only that one is the test's.
        .map(|(name, calls)| {
            if name == "config" {
                calls.saturating_sub(1)
            } else {
                calls
            }
        })
        .sum()
}

/// The calls of each command over all masters, most called first.
fn commands_by_name(servers: &RedisServers) -> Vec<(String, u64)> {
    let mut calls = std::collections::BTreeMap::new();
    for (name, count) in servers
        .iter()
        .flat_map(test_support::RedisServer::command_counts)
    {
        *calls.entry(name).or_insert(0) += count;
    }
    let mut calls: Vec<(String, u64)> = calls.into_iter().collect();
    calls.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_holder_that_keeps_its_majority_waits_without_spinning() {
    let servers = RedisServers::start(5);
    let holder_manager = redlock(&servers).await;
    let waiter_manager = redlock(&servers).await;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(20));
    let holder = holder_manager.acquire("kept", &options).await.unwrap();
    // One master loses its data: the holder keeps 4 of 5, still a majority, and a waiter wins
    // the emptied master on every try.
    servers[0].flushall();
    let waiter = tokio::spawn({
        let options = options.clone();
        async move { waiter_manager.acquire("kept", &options).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter got a lock held on 4 of 5"
    );

    for server in servers.iter() {
        server.reset_stats();
    }
    let window = Duration::from_millis(1500);
    tokio::time::sleep(window).await;
    let sent = commands_run(&servers);
    eprintln!("commands sent to the 5 masters in {window:?} while waiting: {sent}");
    assert!(
        !waiter.is_finished(),
        "the waiter got a lock held on 4 of 5"
    );
    // The waiter renews its places in the masters' wake lists once a second (each renewal an
    // attempt on every master, giving back the flushed one: about 40 commands); retrying would
    // win the flushed master and give it back every few milliseconds, thousands of commands.
    assert!(
        sent <= 150,
        "a waiter behind a holder that keeps its majority must wait for the release, the \
         holder's expiry or its renewal, not retry: {sent} commands in {window:?}"
    );

    let released_at = Instant::now();
    holder.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter finished")
        .unwrap()
        .expect("the waiter gets the lock");
    let after_release = released_at.elapsed();
    eprintln!("got it {after_release:?} after the release");
    assert!(
        after_release < Duration::from_secs(3),
        "with a 30 s ttl only a wake-up explains a hand-off within 3 s: {after_release:?}"
    );
    assert!(token_holders(&servers, guard.key(), guard.token()).len() >= MAJORITY);
    guard.release().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// The attribute, unchanged, on a Redlock manager
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
enum JobError {
    Lock(#[allow(dead_code)] LockError),
}

impl From<LockError> for JobError {
    fn from(error: LockError) -> Self {
        JobError::Lock(error)
    }
}

#[distributed_lock(key = "job:{id}", ttl = 5)]
async fn job(
    id: u32,
    servers: Arc<RedisServers>,
    seen: Arc<Mutex<Vec<usize>>>,
) -> Result<u32, JobError> {
    let holders = servers.holders(&format!("lock:job:{id}"));
    seen.lock().unwrap().push(holders.len());
    Ok(id * 2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_runs_unchanged_on_redlock() {
    if !test_support::in_own_process(module_path!(), "the_attribute_runs_unchanged_on_redlock") {
        return;
    }
    let servers = Arc::new(RedisServers::start(5));
    distlock::init_with(redlock(&servers).await).expect("installed once");
    let seen = Arc::new(Mutex::new(Vec::new()));
    assert_eq!(job(1, servers.clone(), seen.clone()).await.unwrap(), 2);
    let held_on = seen.lock().unwrap()[0];
    assert!(
        held_on >= MAJORITY,
        "during the body a majority holds the lock: {held_on}"
    );
    assert_eq!(
        servers.holders("lock:job:1"),
        Vec::<usize>::new(),
        "released after"
    );
}

// ---------------------------------------------------------------------------------------------
// Waiters in several processes: a release wakes a bounded number of them
// ---------------------------------------------------------------------------------------------

const MASTERS_ENV: &str = "DISTLOCK_REDLOCK_MASTERS";
const DATA_ENV: &str = "DISTLOCK_REDLOCK_DATA";
const NAME_ENV: &str = "DISTLOCK_REDLOCK_NAME";
const INDEX_ENV: &str = "DISTLOCK_REDLOCK_INDEX";

/// How many sections each looping worker runs.
const LOOPS: usize = 20;

/// A wake-up lost to a dead waiter costs the others at most one renewal of their places (1 s);
/// a master restarted empty costs at most that too. Both far below the workers' 30 s ttl, with
/// room for a slow shared machine.
const WAKE_UP_BOUND: Duration = Duration::from_secs(5);

/// The environment of a worker on the masters `servers`, keeping its data on `data`.
fn worker_env(
    servers: &RedisServers,
    data: &RedisServer,
    name: &str,
) -> Vec<(&'static str, String)> {
    vec![
        (MASTERS_ENV, servers.urls().join(",")),
        (DATA_ENV, data.url()),
        (NAME_ENV, name.to_owned()),
    ]
}

/// The worker's masters, data connection and lock name, when this process is a worker.
async fn worker_setup() -> Option<(LockManager, MultiplexedConnection, String)> {
    let masters = std::env::var(MASTERS_ENV).ok()?;
    let urls: Vec<&str> = masters.split(',').collect();
    let manager = LockManager::redlock_builder(&urls).connect().await.unwrap();
    let data = redis::Client::open(std::env::var(DATA_ENV).unwrap())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    Some((manager, data, std::env::var(NAME_ENV).unwrap()))
}

/// Worker: once `<name>:go` exists on the data server, takes `lock:<name>` `LOOPS` times, each
/// time doing a read-modify-write of `<name>:counter` under it (and counting in `<name>:lost`
/// the releases that found the lock lost); then appends its longest wait for the lock (ms) to
/// `<name>:waits`.
pub(crate) fn redlock_looping_worker() {
    test_support::runtime(2).block_on(async {
        let Some((manager, mut data, name)) = worker_setup().await else {
            return;
        };
        loop {
            let go: bool = redis::cmd("EXISTS")
                .arg(format!("{name}:go"))
                .query_async(&mut data)
                .await
                .unwrap();
            if go {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let options = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .timeout(Duration::from_secs(60));
        let counter = format!("{name}:counter");
        let mut longest = Duration::ZERO;
        for _ in 0..LOOPS {
            let asked = Instant::now();
            let guard = manager.acquire(&name, &options).await.unwrap();
            longest = longest.max(asked.elapsed());
            read_modify_write(&mut data, &counter).await;
            match guard.release().await {
                Ok(()) => {}
                // A master restarted empty forgot the lock: counted, for the test to judge.
                Err(LockError::Lost { .. }) => {
                    let _: i64 = redis::cmd("INCR")
                        .arg(format!("{name}:lost"))
                        .query_async(&mut data)
                        .await
                        .unwrap();
                }
                // A release that meets the restart itself (its connection to that master
                // reset) cannot tell whether the master still held the lock: counted too.
                Err(LockError::QuorumUndecided { .. }) => {
                    let _: i64 = redis::cmd("INCR")
                        .arg(format!("{name}:undecided"))
                        .query_async(&mut data)
                        .await
                        .unwrap();
                }
                Err(error) => panic!("release failed: {error}"),
            }
        }
        let _: i64 = redis::cmd("RPUSH")
            .arg(format!("{name}:waits"))
            .arg(u64::try_from(longest.as_millis()).unwrap_or(u64::MAX))
            .query_async(&mut data)
            .await
            .unwrap();
    });
}

/// Worker: takes `lock:<name>` once (ttl 60 s), appends its index to `<name>:order`, releases.
pub(crate) fn redlock_once_worker() {
    test_support::runtime(2).block_on(async {
        let Some((manager, mut data, name)) = worker_setup().await else {
            return;
        };
        let index = std::env::var(INDEX_ENV).unwrap();
        let options = LockOptions::new()
            .ttl(Duration::from_secs(60))
            .timeout(Duration::from_secs(60));
        let guard = manager.acquire(&name, &options).await.unwrap();
        let _: i64 = redis::cmd("RPUSH")
            .arg(format!("{name}:order"))
            .arg(&index)
            .query_async(&mut data)
            .await
            .unwrap();
        guard.release().await.unwrap();
    });
}

/// The places in `lock:<name>`'s wake list on each master (0 for a master that is down).
fn places(servers: &[RedisServer], name: &str) -> Vec<usize> {
    servers
        .iter()
        .map(|server| {
            server
                .try_conn()
                .and_then(|mut c| {
                    redis::cmd("ZCARD")
                        .arg(keys::named(name).wake())
                        .query::<usize>(&mut c)
                })
                .unwrap_or(0)
        })
        .collect()
}

/// The numbers of a list of integers on the data server.
fn list_of(data: &RedisServer, key: &str) -> Vec<u64> {
    redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query(&mut data.conn())
        .unwrap()
}

/// Runs `workers` looping worker processes on lock `name` (calling `meanwhile` while they
/// run) and, when `exclusive`, checks that no update of the counter and no lock was lost.
/// Returns the Redis commands the
/// masters ran per section (`INFO commandstats`, the commands scripts run included) and the
/// longest wait for the lock of any worker.
fn run_looping_workers(
    servers: &RedisServers,
    workers: usize,
    name: &str,
    exclusive: bool,
    meanwhile: impl FnOnce(&RedisServer),
) -> (f64, Duration) {
    let data = RedisServer::start();
    let children: Vec<_> = (0..workers)
        .map(|_| {
            spawn_worker(
                "redlock::redlock_looping_worker",
                &worker_env(servers, &data, name),
            )
        })
        .collect();
    // Every worker connected (one connection to each master) before the count starts.
    wait_until(Duration::from_secs(30), "the workers to connect", || {
        servers
            .iter()
            .all(|server| server.client_count() >= workers)
    });
    std::thread::sleep(Duration::from_millis(200));
    for server in servers.iter() {
        server.reset_stats();
    }
    data.set(&format!("{name}:go"), "1");
    meanwhile(&data);
    for status in wait_all(children, Duration::from_secs(180)) {
        assert!(status.success(), "a worker failed: {status}");
    }
    let sent = commands_run(servers);
    eprintln!(
        "{workers} processes, commands by name: {:?}",
        commands_by_name(servers)
    );
    let sections = workers * LOOPS;
    if exclusive {
        assert_eq!(
            data.get(&format!("{name}:counter")),
            Some(sections.to_string()),
            "every read-modify-write counted once: no two holders at a time"
        );
        assert_eq!(data.get(&format!("{name}:lost")), None, "no lock was lost");
        assert_eq!(
            data.get(&format!("{name}:undecided")),
            None,
            "every release found out whether the lock was still held"
        );
    }
    let longest = list_of(&data, &format!("{name}:waits"))
        .into_iter()
        .max()
        .map(Duration::from_millis)
        .unwrap();
    eprintln!(
        "{workers} processes: {sent} commands to the masters for {sections} sections; longest \
         wait {longest:?}"
    );
    (sent as f64 / sections as f64, longest)
}

#[test]
fn a_redlock_release_wakes_a_bounded_number_of_waiters_however_many_processes_wait() {
    let servers = RedisServers::start(5);
    let (few, _) = run_looping_workers(&servers, 2, "herd2", true, |_| {});
    let (many, _) = run_looping_workers(&servers, 8, "herd8", true, |_| {});
    eprintln!("commands to the masters per section: {few:.1} with 2 processes, {many:.1} with 8");
    // Were every waiting process woken by each release, each would try all five masters again:
    // with 8 processes, 7 attempts of several commands on each master per release (measured
    // that way: 65 commands per section with 2 processes, 271 with 8). Woken one per master,
    // the work per section stays about the same; what may grow is the renewal of each
    // waiter's places once a second, a few commands per section while sections are short.
    assert!(
        many < few * 1.5 + 30.0,
        "Redis work per section grew with the number of processes: {few:.1} → {many:.1}"
    );
}

#[test]
fn a_redlock_waiter_killed_while_waiting_holds_the_others_up_for_a_bounded_time() {
    let servers = RedisServers::start(5);
    let data = RedisServer::start();
    let runtime = test_support::runtime(2);
    let holder = runtime.block_on(redlock(&servers));
    let guard = runtime
        .block_on(holder.acquire("killed", &LockOptions::new().ttl(Duration::from_secs(60))))
        .unwrap();
    let start = |index: usize| {
        let mut env = worker_env(&servers, &data, "killed");
        env.push((INDEX_ENV, index.to_string()));
        let child = spawn_worker("redlock::redlock_once_worker", &env);
        wait_until(
            Duration::from_secs(30),
            "the worker to take its place on every master",
            || places(&servers, "killed").iter().all(|&n| n == index + 1),
        );
        child
    };
    let doomed = start(0);
    let next = start(1);
    send_signal(doomed.id(), "KILL");
    // Once the live waiter has renewed its place, the dead one's lease ends first: the release
    // wakes the dead waiter, its lease still running, and nobody acts on the wake-up.
    let at_kill = lease_deadlines(&servers[0], "killed")[0];
    wait_until(Duration::from_secs(3), "the live waiter's renewal", || {
        lease_deadlines(&servers[0], "killed")[0] > at_kill
    });
    let released = Instant::now();
    runtime.block_on(guard.release()).unwrap();
    let statuses = wait_all(vec![next], Duration::from_secs(30));
    let took = released.elapsed();
    assert!(
        statuses[0].success(),
        "the next waiter failed: {}",
        statuses[0]
    );
    assert_eq!(list_of(&data, "killed:order"), vec![1]);
    eprintln!("a waiter killed while waiting held the next one up for {took:?}");
    assert!(
        took < WAKE_UP_BOUND,
        "held up {took:?}: the dead waiter's place swallowed the wake-up for longer than a \
         renewal"
    );
    let _ = wait_all(vec![doomed], Duration::from_secs(5));
    // Nothing is left behind: the dead waiter's places went to the wake-up it never acted on,
    // or lapse with their lease.
    wait_until(
        Duration::from_secs(8),
        "the dead waiter's places to go",
        || places(&servers, "killed") == vec![0; 5],
    );
}

#[test]
fn a_redlock_master_restarted_empty_mid_run_does_not_stall_the_waiters() {
    let servers = RedisServers::start(5);
    // A master that restarts empty forgets the locks it granted: a holder on exactly a majority
    // that includes it loses its majority (Redlock's documented limit), so mutual exclusion is
    // not what this test checks.
    let (_, longest) = run_looping_workers(&servers, 4, "restarted", false, |data| {
        wait_until(Duration::from_secs(60), "a few sections", || {
            data.get("restarted:counter")
                .is_some_and(|count| count.parse::<usize>().unwrap() >= 10)
        });
        servers[2].restart();
    });
    assert!(
        longest < WAKE_UP_BOUND,
        "a worker waited {longest:?} for the lock: the restart swallowed wake-ups"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_waiter_that_gives_up_takes_its_places_out_at_once() {
    let servers = RedisServers::start(5);
    let holder = redlock(&servers).await;
    let waiter = redlock(&servers).await;
    let guard = holder
        .acquire("gives-up", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    // Cancelled (the future dropped while it waits), then timed out: either way its places
    // go at once, not a lease (3 s) later.
    for cancel in [true, false] {
        let timeout = if cancel { 30_000 } else { 1_500 };
        let options = LockOptions::new().timeout(Duration::from_millis(timeout));
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            async move { waiter.acquire("gives-up", &options).await }
        });
        test_support::eventually(
            Duration::from_secs(5),
            "the waiter to take its places",
            || places(&servers, "gives-up") == vec![1; 5],
        )
        .await;
        if cancel {
            waiting.abort();
            assert!(waiting.await.unwrap_err().is_cancelled());
        } else {
            let outcome = waiting.await.unwrap();
            assert!(
                matches!(outcome, Err(LockError::Timeout { .. })),
                "{outcome:?}"
            );
        }
        test_support::eventually(
            Duration::from_secs(1),
            "the waiter's places to be taken out",
            || places(&servers, "gives-up") == vec![0; 5],
        )
        .await;
    }
    guard.release().await.unwrap();
    assert_eq!(servers.holders("lock:gives-up"), Vec::<usize>::new());
}

/// The commands docs/tls-acl.md says Redlock masters need besides the minimal ACL.
fn documented_redlock_acl_extras() -> Vec<String> {
    let doc = include_str!("../../docs/tls-acl.md");
    let start = doc
        .find("Redlock masters need, besides,")
        .expect("docs/tls-acl.md lists the commands Redlock masters need besides the minimal ACL");
    let rule = &doc[start..];
    let rule = &rule[rule.find('`').unwrap() + 1..];
    let rule = &rule[..rule.find('`').unwrap()];
    rule.split_whitespace()
        .filter_map(|word| word.strip_prefix('+'))
        .map(str::to_owned)
        .collect()
}

/// The `+command` entries of the minimal ACL in docs/tls-acl.md.
fn documented_acl() -> Vec<String> {
    let doc = include_str!("../../docs/tls-acl.md");
    let rule = &doc[doc.find("ACL SETUSER locker").unwrap()..];
    let rule = &rule[..rule.find('`').unwrap()];
    rule.split_whitespace()
        .filter_map(|word| word.strip_prefix('+'))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_waiters_work_with_the_documented_acl() {
    let servers = RedisServers::start(3);
    let commands: Vec<String> = documented_acl()
        .into_iter()
        .chain(documented_redlock_acl_extras())
        .collect();
    let allowed: Vec<&str> = commands.iter().map(String::as_str).collect();
    let urls: Vec<String> = servers
        .iter()
        .map(|server| server.add_acl_user("locker", "s3cret", &allowed))
        .collect();
    let connect = || async {
        LockManager::redlock_builder(&urls)
            .connect()
            .await
            .expect("the ACL user connects")
    };
    let (holder, waiter) = (connect().await, connect().await);
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(10));
    let held = holder.acquire("acl", &options).await.expect("free");
    let waiting = tokio::spawn({
        let options = options.clone();
        async move { waiter.acquire("acl", &options).await }
    });
    test_support::eventually(Duration::from_secs(5), "the waiter's places", || {
        places(&servers, "acl") == vec![1; 3]
    })
    .await;
    let released = Instant::now();
    held.release().await.expect("still ours");
    let guard = waiting.await.unwrap().expect("woken by the release");
    assert!(
        released.elapsed() < Duration::from_secs(3),
        "with a 30 s ttl only a wake-up explains {:?}",
        released.elapsed()
    );
    assert!(holder
        .try_acquire("acl", &options)
        .await
        .expect("try_acquire answers")
        .is_none());
    guard.release().await.expect("still ours");
    assert_eq!(places(&servers, "acl"), vec![0; 3]);
    assert_eq!(servers.holders("lock:acl"), Vec::<usize>::new());
}

/// The calls of each command over all masters since their stats were reset, leaving out the
/// test's own `INFO` and `CONFIG`.
fn calls_since_reset(servers: &RedisServers) -> Vec<(String, u64)> {
    let mut calls = commands_by_name(servers);
    // Not distlock's: the harness's own `CONFIG RESETSTAT` and `INFO`, and the `CLIENT SETINFO`
    // handshake of the connection that reads them (counted as `client` by Redis 6.2, which
    // does not know the subcommand; later servers reject it before counting or name it
    // `client|setinfo`).
    calls.retain(|(name, _)| {
        name != "info" && !name.starts_with("config") && !name.starts_with("client")
    });
    calls.sort();
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_on_redlock_costs_one_set_per_master_and_a_release_one_script() {
    let servers = RedisServers::start(5);
    let (holder, other) = (redlock(&servers).await, redlock(&servers).await);
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    // Warm up: connections made, release script loaded.
    other
        .try_acquire("cheap", &options)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    let reset = || {
        for server in servers.iter() {
            server.reset_stats();
        }
    };
    let five = |name: &str| (name.to_owned(), 5);

    reset();
    let guard = other.try_acquire("cheap", &options).await.unwrap().unwrap();
    guard.release().await.unwrap();
    assert_eq!(
        calls_since_reset(&servers),
        [
            five("del"),
            five("evalsha"),
            five("exists"),
            five("get"),
            five("set")
        ],
        "uncontended: SET NX on each master, then the release script (GET, DEL, and EXISTS of \
         the wake list)"
    );

    let held = holder.acquire("cheap", &options).await.unwrap();
    reset();
    assert!(other
        .try_acquire("cheap", &options)
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        calls_since_reset(&servers),
        [five("set")],
        "held: one SET NX per master, no script, no place in a wake list"
    );
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_does_not_keep_a_waiter_from_being_woken() {
    let servers = RedisServers::start(5);
    let connect = || async {
        LockManager::redlock_builder(&servers.urls())
            .node_timeout(Duration::from_millis(200))
            .connect()
            .await
            .unwrap()
    };
    let (holder, waiter) = (connect().await, connect().await);
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(20));
    let held = holder.acquire("frozen-wake", &options).await.unwrap();
    // Frozen before the waiter subscribes: its wake-up connection there never confirms, and
    // the waiter must rely on the other four.
    servers[0].pause();
    let _resume = Resume(&servers[0]);
    let waiting = tokio::spawn({
        let options = options.clone();
        async move { waiter.acquire("frozen-wake", &options).await }
    });
    test_support::eventually(
        Duration::from_secs(10),
        "the waiter's places on the four live masters",
        || places(&servers[1..], "frozen-wake") == [1; 4],
    )
    .await;
    let released = Instant::now();
    held.release().await.expect("still held on four masters");
    let guard = waiting.await.unwrap().expect("woken by the release");
    let took = released.elapsed();
    eprintln!("woken {took:?} after the release, one master frozen");
    assert!(
        took < Duration::from_secs(3),
        "with a 30 s ttl only a wake-up explains {took:?}"
    );
    guard.release().await.unwrap();
}

/// The scores (lease deadlines) in `lock:<name>`'s wake list on `server`, highest first.
fn lease_deadlines(server: &RedisServer, name: &str) -> Vec<u64> {
    let members: Vec<(String, u64)> = redis::cmd("ZRANGE")
        .arg(keys::named(name).wake())
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut server.conn())
        .unwrap();
    let mut scores: Vec<u64> = members.into_iter().map(|(_, score)| score).collect();
    scores.sort_unstable_by(|a, b| b.cmp(a));
    scores
}

#[test]
fn a_redlock_waiter_dead_for_longer_than_its_lease_is_skipped_by_the_release() {
    let servers = RedisServers::start(5);
    let data = RedisServer::start();
    let runtime = test_support::runtime(2);
    let holder = runtime.block_on(redlock(&servers));
    let guard = runtime
        .block_on(holder.acquire("lapsed", &LockOptions::new().ttl(Duration::from_secs(60))))
        .unwrap();
    let mut children = Vec::new();
    for index in 0..2 {
        let mut env = worker_env(&servers, &data, "lapsed");
        env.push((INDEX_ENV, index.to_string()));
        children.push(spawn_worker("redlock::redlock_once_worker", &env));
        wait_until(
            Duration::from_secs(30),
            "the worker to take its place on every master",
            || places(&servers, "lapsed").iter().all(|&n| n == index + 1),
        );
    }
    let next = children.pop().unwrap();
    let doomed = children.pop().unwrap();
    send_signal(doomed.id(), "KILL");
    // The dead waiter's lease (3 s) runs out; the live one renews its place every second.
    std::thread::sleep(Duration::from_millis(3600));
    assert_eq!(
        places(&servers, "lapsed"),
        vec![2; 5],
        "both places are still there"
    );
    // Release right after the live waiter's renewal, so that its next look at Redis is about a
    // second away: only the wake-up can give it the lock sooner.
    let before = lease_deadlines(&servers[0], "lapsed")[0];
    wait_until(Duration::from_secs(3), "the live waiter's renewal", || {
        lease_deadlines(&servers[0], "lapsed")[0] > before
    });
    let released = Instant::now();
    runtime.block_on(guard.release()).unwrap();
    wait_until(
        Duration::from_secs(10),
        "the live waiter to get the lock",
        || !list_of(&data, "lapsed:order").is_empty(),
    );
    let took = released.elapsed();
    eprintln!("the live waiter behind a lapsed dead one got the lock {took:?} after the release");
    assert_eq!(list_of(&data, "lapsed:order"), vec![1]);
    assert!(
        took < Duration::from_millis(700),
        "{took:?}: the release woke the dead waiter, whose lease had run out, not the live one"
    );
    let statuses = wait_all(vec![next], Duration::from_secs(30));
    assert!(
        statuses[0].success(),
        "the live waiter failed: {}",
        statuses[0]
    );
    let _ = wait_all(vec![doomed], Duration::from_secs(5));
    assert_eq!(
        places(&servers, "lapsed"),
        vec![0; 5],
        "the lapsed places were dropped"
    );
}

/// A Redlock master cannot hand a lock over, so a message on a waiter's wake-up channel can
/// only mean "look again": a waiter that took a hand-off-shaped message (`"<token> <fence>"`,
/// as a line's release sends) for the lock would hold it next to a holder with a majority. Any
/// client allowed to publish (the documented ACL lets every distlock client) can send one, and
/// the channel and token are readable from the wake lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_waiter_never_takes_a_message_for_the_lock() {
    let servers = RedisServers::start(5);
    let holder_manager = redlock(&servers).await;
    let waiter_manager = redlock(&servers).await;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(3));
    let holder = holder_manager.acquire("forged", &options).await.unwrap();
    let waiter = tokio::spawn({
        let options = options.clone();
        async move { waiter_manager.acquire("forged", &options).await }
    });
    let wake_list = &keys::named("forged").wake();
    let mut member = None;
    let looking_until = Instant::now() + Duration::from_secs(5);
    while member.is_none() && Instant::now() < looking_until {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let members: Vec<String> = servers[0]
            .try_conn()
            .and_then(|mut c| {
                redis::cmd("ZRANGE")
                    .arg(wake_list)
                    .arg(0)
                    .arg(-1)
                    .query(&mut c)
            })
            .unwrap_or_default();
        member = members.into_iter().next();
    }
    let member = member.expect("the waiter takes a place in the wake list");
    let (channel, token) = member.split_once(' ').unwrap();
    let mut publisher = connection(&servers[0]).await;
    for _ in 0..3 {
        let _: i64 = redis::cmd("PUBLISH")
            .arg(channel)
            .arg(format!("{token} 1"))
            .query_async(&mut publisher)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let outcome = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter gives up at its timeout")
        .unwrap();
    assert!(
        matches!(outcome, Err(LockError::Timeout { .. })),
        "the waiter got a lock a majority holds for someone else: {:?}",
        outcome.map(|guard| guard.token().to_string())
    );
    assert!(token_holders(&servers, holder.key(), holder.token()).len() >= MAJORITY);
    holder.release().await.unwrap();
}

/// A waiter whose runtime shuts down while it waits takes its places out at once, not a lease
/// (3 s) later: clean-up does not depend on the caller's runtime still running, and a place
/// left behind would swallow the next release's wake-up on every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_waiter_whose_runtime_shuts_down_takes_its_places_out_at_once() {
    let servers = RedisServers::start(5);
    let holder = redlock(&servers).await;
    let waiter = redlock(&servers).await;
    let guard = holder
        .acquire(
            "shut-down",
            &LockOptions::new().ttl(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn({
        let waiter = waiter.clone();
        move || {
            runtime.spawn(async move {
                let options = LockOptions::new().timeout(Duration::from_secs(30));
                let _ = waiter.acquire("shut-down", &options).await;
            });
            // Drive the runtime until the test says the places are taken, then drop it.
            runtime.block_on(async {
                loop {
                    if started_rx.try_recv().is_ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            });
            drop(runtime);
        }
    });
    test_support::eventually(
        Duration::from_secs(5),
        "the waiter to take its places",
        || places(&servers, "shut-down") == vec![1; 5],
    )
    .await;
    started_tx.send(()).unwrap();
    tokio::task::spawn_blocking(move || worker.join().unwrap())
        .await
        .unwrap();
    test_support::eventually(
        Duration::from_secs(1),
        "the places of a waiter whose runtime shut down to be taken out",
        || places(&servers, "shut-down") == vec![0; 5],
    )
    .await;
    guard.release().await.unwrap();
}

/// A hand-written lock (`SET NX PX` on every master, released by compare-and-delete, which
/// wakes nobody) sharing the keys: distlock never writes into it while waiting, and a waiter
/// takes the lock soon after the hand-written release, with or without an expiry on it — by
/// its own look at the renewal, not at the hand-written lock's 30 s ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_written_lock_on_the_masters_is_respected_and_its_release_seen_soon() {
    let servers = RedisServers::start(5);
    let manager = redlock(&servers).await;
    for expiry in [true, false] {
        let key = "lock:by-hand";
        for server in servers.iter() {
            let mut set = redis::cmd("SET");
            set.arg(key).arg("hand written").arg("NX");
            if expiry {
                set.arg("PX").arg(30_000);
            }
            let set: Option<String> = set.query(&mut server.conn()).unwrap();
            assert_eq!(set.as_deref(), Some("OK"));
        }
        let waiting = tokio::spawn({
            let manager = manager.clone();
            async move {
                let options = LockOptions::new()
                    .ttl(Duration::from_secs(30))
                    .timeout(Duration::from_secs(10));
                manager.acquire("by-hand", &options).await
            }
        });
        test_support::eventually(
            Duration::from_secs(5),
            "the waiter to take its places",
            || places(&servers, "by-hand") == vec![1; 5],
        )
        .await;
        assert_eq!(servers.holders(key).len(), 5);
        for server in servers.iter() {
            assert_eq!(server.get(key).as_deref(), Some("hand written"));
        }
        let released_at = Instant::now();
        for server in servers.iter() {
            let deleted: i64 = redis::Script::new(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
            )
            .key(key)
            .arg("hand written")
            .invoke(&mut server.conn())
            .unwrap();
            assert_eq!(deleted, 1);
        }
        let guard = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the waiter finishes")
            .unwrap()
            .expect("the waiter gets the lock once the hand-written one is gone");
        let after = released_at.elapsed();
        assert!(
            after < Duration::from_secs(3),
            "a waiter looks again at least every second: {after:?} (expiry: {expiry})"
        );
        assert_eq!(token_holders(&servers, key, guard.token()).len(), 5);
        guard.release().await.unwrap();
    }
}

/// A release wakes a waiter whose token has spaces (a token may carry its holder's identity
/// after a space) with the whole token: the wake list's member is split at its first space
/// only, the channel having none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_whose_token_has_spaces_with_its_whole_token() {
    let servers = RedisServers::start(5);
    let manager = redlock(&servers).await;
    let guard = manager
        .acquire("spaces", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let channel = "distlock:wake:by-hand";
    let token = "a-uuid host=web 1 pid=7";
    let mut subscriber = servers[0].conn();
    subscriber
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut pubsub = subscriber.as_pubsub();
    pubsub.subscribe(channel).unwrap();
    let _: i64 = redis::cmd("ZADD")
        .arg(keys::named("spaces").wake())
        .arg(u64::MAX >> 12)
        .arg(format!("{channel} {token}"))
        .query(&mut servers[0].conn())
        .unwrap();
    guard.release().await.unwrap();
    let message: String = pubsub
        .get_message()
        .expect("the release wakes the waiter")
        .get_payload()
        .unwrap();
    assert_eq!(message, format!("{token} ?"));
}

/// A holder whose masters are a bare majority, one of them frozen at its release: two masters
/// confirm, two others (never its) say no, and the frozen one still holds its token. Nobody else
/// could have held a majority meanwhile, so `Lost` would be false; with too few confirmations
/// to tell, the release is an error (and it did not wrongly report success either).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_cannot_tell_is_an_error_not_lost() {
    let servers = RedisServers::start(5);
    let manager = redlock(&servers).await;
    let key = "lock:undecided";
    for server in &servers[3..] {
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg("someone else")
            .arg("PX")
            .arg(60_000)
            .query(&mut server.conn())
            .unwrap();
        assert_eq!(set.as_deref(), Some("OK"));
    }
    let guard = manager
        .acquire(
            "undecided",
            &LockOptions::new().ttl(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    assert_eq!(token_holders(&servers, key, guard.token()), vec![0, 1, 2]);
    servers[2].pause();
    let outcome = guard.release().await;
    servers[2].resume();
    assert!(
        matches!(
            outcome,
            Err(LockError::QuorumUndecided {
                confirmed: 2,
                silent: 1,
                ..
            })
        ),
        "the lock was ours on a majority to the end, one of it frozen: {outcome:?}"
    );
}
