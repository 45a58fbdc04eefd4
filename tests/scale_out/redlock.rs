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
use test_support::{RedisServer, RedisServers};
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
    // up this takes about 1 s. (It took 25 s while every operation on a dead master waited out
    // a reconnect backoff inside redis-rs.)
    assert!(
        took < Duration::from_secs(12),
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
        matches!(error, LockError::Redis(_)),
        "expected LockError::Redis, got {error:?}"
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
    assert!(matches!(error, LockError::Redis(_)), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(2));

    let started = Instant::now();
    let error = LockManager::redlock_builder(&servers.urls())
        .connect()
        .await
        .expect_err("connect needs a majority of the masters");
    eprintln!("connect failed after {:?}: {error}", started.elapsed());
    assert!(matches!(error, LockError::Redis(_)), "{error:?}");
    assert!(
        error.to_string().contains("Redlock masters answered"),
        "{error}"
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
        .map(|server| {
            server
                .info("commandstats")
                .lines()
                .filter_map(|line| line.strip_prefix("cmdstat_"))
                .filter(|line| !line.starts_with("info:") && !line.starts_with("config|"))
                .filter_map(|line| {
                    let calls = line.split("calls=").nth(1)?.split(',').next()?;
                    let calls = calls.parse::<u64>().ok()?;
                    // A server that counts no subcommands (Redis 6.2) counts the reset itself
                    // as one `config` call: only that one is the test's.
                    Some(if line.starts_with("config:") {
                        calls.saturating_sub(1)
                    } else {
                        calls
                    })
                })
                .sum::<u64>()
        })
        .sum()
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
    assert!(
        sent <= 12,
        "a waiter behind a holder that keeps its majority must wait for the release or the \
         holder's expiry, not retry: {sent} commands in {window:?}"
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
