//! The fleet: waiters in several OS processes queue in one line per lock, in Redis, and a
//! release hands the lock to the next in line.
//!
//! - processes that queued in a known order get the lock in that order;
//! - a waiter `SIGKILLed` in line, and one `SIGKILLed` right after being handed the lock, hold the
//!   others up for at most the documented bound (a lease, a claim: 3 s each), not the ttl;
//! - a waiter that gives up (cancelled, timed out) leaves the line at once;
//! - a release wakes only the next in line: Redis work per hand-off does not grow with the
//!   number of waiting processes.
//!
//! Each worker is this test binary run again (`spawn_worker`), told what to do by environment
//! variables.

use std::time::{Duration, Instant};

use distlock::{LockManager, LockOptions};
use test_support::{keys, send_signal, spawn_worker, wait_all, wait_until, RedisServer};

const URL: &str = "DISTLOCK_FLEET_URL";
const NAME: &str = "DISTLOCK_FLEET_NAME";
const INDEX: &str = "DISTLOCK_FLEET_INDEX";
/// What the worker does once it holds the lock: `record` (append its index to the
/// `<name>:order` list and release), `abort` (die on the spot, holding it).
const THEN: &str = "DISTLOCK_FLEET_THEN";

/// Worker: acquires `lock:<name>` (ttl 60 s, waiting up to 60 s), then does what `THEN` says.
pub(crate) fn fleet_worker() {
    let url = std::env::var(URL).expect("set by the test that starts this worker");
    let name = std::env::var(NAME).unwrap();
    let index = std::env::var(INDEX).unwrap();
    let then = std::env::var(THEN).unwrap();
    test_support::runtime(2).block_on(async {
        let manager = LockManager::connect(&url).await.unwrap();
        let options = LockOptions::new()
            .ttl(Duration::from_secs(60))
            .timeout(Duration::from_secs(60));
        let guard = manager.acquire(&name, &options).await.unwrap();
        match then.as_str() {
            "abort" => std::process::abort(),
            _ => {
                let client = redis::Client::open(url.as_str()).unwrap();
                let mut connection = client.get_multiplexed_async_connection().await.unwrap();
                let _: i64 = redis::cmd("RPUSH")
                    .arg(format!("{name}:order"))
                    .arg(&index)
                    .query_async(&mut connection)
                    .await
                    .unwrap();
                guard.release().await.unwrap();
            }
        }
    });
}

/// Starts worker `index` for lock `name` and waits until it has taken its place in line (the
/// line is `index + 1` long).
fn queue_worker(server: &RedisServer, name: &str, index: usize, then: &str) -> std::process::Child {
    let child = spawn_worker(
        "fleet::fleet_worker",
        &[
            (URL, server.url()),
            (NAME, name.to_owned()),
            (INDEX, index.to_string()),
            (THEN, then.to_owned()),
        ],
    );
    let line = keys::named(name).line();
    wait_until(
        Duration::from_secs(20),
        "the worker to join the line",
        || llen(server, &line) == index + 1,
    );
    child
}

/// The indexes of the workers that held `lock:<name>`, in the order they got it.
fn order_of(server: &RedisServer, name: &str) -> Vec<usize> {
    redis::cmd("LRANGE")
        .arg(format!("{name}:order"))
        .arg(0)
        .arg(-1)
        .query(&mut server.conn())
        .unwrap()
}

fn llen(server: &RedisServer, key: &str) -> usize {
    redis::cmd("LLEN")
        .arg(key)
        .query(&mut server.conn())
        .unwrap()
}

/// Holds `lock:<name>` from this process: the workers queue behind it.
fn hold(
    server: &RedisServer,
    runtime: &tokio::runtime::Runtime,
    name: &str,
) -> (LockManager, distlock::LockGuard) {
    runtime.block_on(async {
        let manager = LockManager::connect(&server.url()).await.unwrap();
        let guard = manager
            .acquire(name, &LockOptions::new().ttl(Duration::from_secs(60)))
            .await
            .unwrap();
        (manager, guard)
    })
}

#[test]
fn processes_get_the_lock_in_the_order_they_queued() {
    const WORKERS: usize = 6;
    let server = RedisServer::start();
    let runtime = test_support::runtime(2);
    let (_manager, guard) = hold(&server, &runtime, "fifo");
    let workers: Vec<_> = (0..WORKERS)
        .map(|index| queue_worker(&server, "fifo", index, "record"))
        .collect();
    runtime.block_on(guard.release()).unwrap();
    for status in wait_all(workers, Duration::from_secs(60)) {
        assert!(status.success(), "a worker failed: {status}");
    }
    let order = order_of(&server, "fifo");
    assert_eq!(
        order,
        (0..WORKERS).collect::<Vec<_>>(),
        "first come, first served across processes"
    );
    assert!(!server.exists("lock:fifo"), "released by the last worker");
    assert!(
        !server.exists(&keys::named("fifo").line()),
        "no line left behind"
    );
}

/// Releases `guard` and returns how long it took until the `next` waiter had the lock, used it
/// and exited (successfully: it is checked), at most [`DEAD_WAITER_BOUND`].
fn release_and_time_the_next(
    runtime: &tokio::runtime::Runtime,
    guard: distlock::LockGuard,
    next: std::process::Child,
) -> Duration {
    let released = Instant::now();
    runtime.block_on(guard.release()).unwrap();
    let statuses = wait_all(vec![next], DEAD_WAITER_BOUND);
    let took = released.elapsed();
    assert!(
        statuses[0].success(),
        "the next waiter failed: {}",
        statuses[0]
    );
    took
}

/// How long the others may be held up by one dead waiter: its claim (3 s) or lease (3 s), plus
/// the renewal period after which the next waiter notices (1 s), with room for a slow machine.
const DEAD_WAITER_BOUND: Duration = Duration::from_secs(8);

#[test]
fn a_waiter_killed_in_line_holds_the_line_up_for_a_bounded_time() {
    let server = RedisServer::start();
    let runtime = test_support::runtime(2);
    let (_manager, guard) = hold(&server, &runtime, "killed-in-line");
    let doomed = queue_worker(&server, "killed-in-line", 0, "record");
    let next = queue_worker(&server, "killed-in-line", 1, "record");
    send_signal(doomed.id(), "KILL");
    let took = release_and_time_the_next(&runtime, guard, next);
    let order = order_of(&server, "killed-in-line");
    assert_eq!(
        order,
        vec![1],
        "the next waiter got the lock, the dead one never did"
    );
    eprintln!("a waiter killed in line held the next one up for {took:?} after the release");
    assert!(took < DEAD_WAITER_BOUND, "held up {took:?}");
    let _ = wait_all(vec![doomed], Duration::from_secs(5));
}

/// A killed process's connection closes, and its subscription with it: the release that
/// reaches its place finds nobody to hear the hand-off (`PUBLISH` answers 0 receivers) and
/// gives the lock to the next waiter in the same script, instead of to the dead one for a claim.
#[test]
fn a_waiter_killed_in_line_is_skipped_by_the_very_next_release() {
    let server = RedisServer::start();
    let runtime = test_support::runtime(2);
    let (_manager, guard) = hold(&server, &runtime, "skipped");
    let doomed = queue_worker(&server, "skipped", 0, "record");
    let next = queue_worker(&server, "skipped", 1, "record");
    let entries = line_entries(&server, "skipped");
    let doomed_token = entries[0].split(' ').next().unwrap().to_owned();
    let doomed_channel = entries[0].rsplit(' ').next().unwrap().to_owned();
    send_signal(doomed.id(), "KILL");
    let _ = wait_all(vec![doomed], Duration::from_secs(5));
    wait_until(
        Duration::from_secs(5),
        "the killed waiter's subscription to close",
        || {
            let numsub: (String, u64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&doomed_channel)
                .query(&mut server.conn())
                .unwrap();
            numsub.1 == 0
        },
    );
    runtime.block_on(guard.release()).unwrap();
    assert_ne!(
        server.get("lock:skipped"),
        Some(doomed_token),
        "the release handed the lock to the killed waiter"
    );
    let statuses = wait_all(vec![next], Duration::from_secs(10));
    assert!(
        statuses[0].success(),
        "the next waiter failed: {}",
        statuses[0]
    );
    assert_eq!(order_of(&server, "skipped"), vec![1]);
}

/// A line whose waiters never wait a renewal and that never empties (a busy fleet) must not
/// expire under them: every join sets its expiry, not only the one that creates it.
#[tokio::test]
async fn a_join_keeps_the_line_from_expiring_under_its_waiters() {
    let server = RedisServer::start();
    let managers = [
        test_support::connect(&server).await,
        test_support::connect(&server).await,
        test_support::connect(&server).await,
    ];
    let options = LockOptions::new();
    let (held, first) =
        hold_with_a_waiter(&server, &managers[0], &managers[1], "kept", &options).await;
    // As if the line had been created two leases ago: its expiry is due.
    let _: i64 = redis::cmd("PEXPIRE")
        .arg(keys::named("kept").line())
        .arg(200)
        .query(&mut server.conn())
        .unwrap();
    let second = tokio::spawn({
        let manager = managers[2].clone();
        async move { manager.acquire("kept", &LockOptions::new()).await }
    });
    test_support::eventually(Duration::from_secs(5), "the second waiter to join", || {
        llen(&server, &keys::named("kept").line()) == 2
    })
    .await;
    let pttl = server.pttl(&keys::named("kept").line());
    assert!(pttl > 3000, "the join left the line to expire in {pttl} ms");
    held.release().await.unwrap();
    let first = first.await.unwrap().unwrap();
    first.release().await.unwrap();
    second.await.unwrap().unwrap().release().await.unwrap();
}

#[test]
fn a_waiter_killed_right_after_the_hand_off_holds_the_line_up_for_a_bounded_time() {
    let server = RedisServer::start();
    let runtime = test_support::runtime(2);
    let (_manager, guard) = hold(&server, &runtime, "killed-holding");
    let doomed = queue_worker(&server, "killed-holding", 0, "abort");
    let next = queue_worker(&server, "killed-holding", 1, "record");
    let took = release_and_time_the_next(&runtime, guard, next);
    let doomed = wait_all(vec![doomed], Duration::from_secs(5));
    assert!(
        !doomed[0].success(),
        "the first waiter died holding the lock"
    );
    eprintln!("a waiter killed right after the hand-off held the next one up for {took:?}");
    assert!(
        took < DEAD_WAITER_BOUND,
        "held up {took:?}: a lock handed to a dead waiter lasted longer than its claim"
    );
}

/// The holder and the first waiter both die: the waiter behind them, which is never told the
/// holder's ttl (only the first waiter is), still gets the lock within the holder's expiry plus
/// the bound of one dead waiter — its renewal finds the lock free, hands it to the dead first
/// waiter for a claim at most, and then to itself.
#[test]
fn a_dead_holder_and_a_dead_first_waiter_hold_the_next_waiter_up_for_a_bounded_time() {
    let server = RedisServer::start();
    let runtime = test_support::runtime(2);
    let (_manager, guard) = hold(&server, &runtime, "both-dead");
    let doomed = queue_worker(&server, "both-dead", 0, "record");
    let next = queue_worker(&server, "both-dead", 1, "record");
    send_signal(doomed.id(), "KILL");
    // The holder dies without releasing, a second before its ttl runs out.
    std::mem::forget(guard);
    let _: i64 = redis::cmd("PEXPIRE")
        .arg("lock:both-dead")
        .arg(1000)
        .query(&mut server.conn())
        .unwrap();
    let expired = Instant::now() + Duration::from_secs(1);
    let statuses = wait_all(vec![next], Duration::from_secs(1) + DEAD_WAITER_BOUND);
    assert!(
        statuses[0].success(),
        "the next waiter failed: {}",
        statuses[0]
    );
    let took = expired.elapsed();
    eprintln!(
        "a dead holder and a dead first waiter held the next one up for {took:?} after the expiry"
    );
    assert!(took < DEAD_WAITER_BOUND, "held up {took:?}");
    assert_eq!(order_of(&server, "both-dead"), vec![1]);
    let _ = wait_all(vec![doomed], Duration::from_secs(5));
}

#[test]
fn a_waiter_that_gives_up_leaves_the_line_at_once() {
    let server = RedisServer::start();
    let runtime = test_support::runtime(2);
    let (manager, guard) = hold(&server, &runtime, "gives-up");
    let line = keys::named("gives-up").line();
    runtime.block_on(async {
        let other = LockManager::connect(&server.url()).await.unwrap();
        // Cancelled: the future is dropped while in line.
        let patient = LockOptions::new().timeout(Duration::from_secs(30));
        let waiting = other.acquire("gives-up", &patient);
        let dropped = tokio::time::timeout(Duration::from_millis(300), waiting).await;
        assert!(dropped.is_err(), "the lock was held");
        test_support::eventually(
            Duration::from_secs(2),
            "the cancelled waiter to leave the line",
            || llen(&server, &line) == 0,
        )
        .await;
        // Timed out: the same, through the acquire's own timeout.
        let timed_out = other
            .acquire(
                "gives-up",
                &LockOptions::new().timeout(Duration::from_millis(300)),
            )
            .await;
        assert!(matches!(
            timed_out,
            Err(distlock::LockError::Timeout { .. })
        ));
        test_support::eventually(
            Duration::from_secs(2),
            "the timed-out waiter to leave the line",
            || llen(&server, &line) == 0,
        )
        .await;
        guard.release().await.unwrap();
        assert!(
            !server.exists("lock:gives-up"),
            "nobody was waiting: the release deleted it"
        );
        let again = manager
            .try_acquire("gives-up", &LockOptions::new())
            .await
            .unwrap()
            .expect("free at once");
        again.release().await.unwrap();
    });
}

/// How many sections each looping worker runs.
const LOOPS: usize = 20;

/// Worker: waits for the key `<name>:go`, then takes `lock:<name>` and releases it after 1 ms,
/// `LOOPS` times.
pub(crate) fn looping_worker() {
    let url = std::env::var(URL).expect("set by the test that starts this worker");
    let name = std::env::var(NAME).unwrap();
    test_support::runtime(2).block_on(async {
        let manager = LockManager::connect(&url).await.unwrap();
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        loop {
            let go: bool = redis::cmd("EXISTS")
                .arg(format!("{name}:go"))
                .query_async(&mut connection)
                .await
                .unwrap();
            if go {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let options = LockOptions::new().timeout(Duration::from_secs(60));
        for _ in 0..LOOPS {
            let guard = manager.acquire(&name, &options).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
            guard.release().await.unwrap();
        }
    });
}

/// Redis commands (INFO commandstats: scripts' inner commands included, the workers' polls for
/// the start not) per section, for `workers` processes taking turns on one lock.
fn commands_per_section(workers: usize) -> f64 {
    let server = RedisServer::start();
    let name = format!("herd{workers}");
    let children: Vec<_> = (0..workers)
        .map(|_| {
            spawn_worker(
                "fleet::looping_worker",
                &[(URL, server.url()), (NAME, name.clone())],
            )
        })
        .collect();
    // Let every worker connect and start polling for the go.
    wait_until(Duration::from_secs(20), "the workers to connect", || {
        server.client_count() > workers
    });
    std::thread::sleep(Duration::from_millis(200));
    server.reset_stats();
    server.set(&format!("{name}:go"), "1");
    for status in wait_all(children, Duration::from_secs(120)) {
        assert!(status.success(), "a worker failed: {status}");
    }
    let total: u64 = server
        .command_counts()
        .into_iter()
        .filter(|(name, _)| name != "exists" && name != "info" && !name.starts_with("config"))
        .map(|(_, calls)| calls)
        .sum::<u64>()
        - 1; // the go
    let sections = workers * LOOPS;
    eprintln!("{workers} processes: {total} commands for {sections} sections");
    total as f64 / sections as f64
}

#[test]
fn a_release_wakes_only_the_next_in_line() {
    let few = commands_per_section(2);
    let many = commands_per_section(8);
    eprintln!("commands per section: {few:.1} with 2 processes, {many:.1} with 8");
    // With every release waking every waiting process, each of them would send its script
    // again: the work per section would grow with the processes (8 processes: 7 scripts of
    // several commands per release). Handed to the next in line, it stays about the same.
    assert!(
        many < few * 1.5 + 2.0,
        "Redis work per section grew with the number of processes: {few:.1} → {many:.1}"
    );
}

/// `holder` takes `lock:<name>`, and `waiter` waits for it in a task of its own: returns the
/// held guard and the waiting task once the waiter has its place in line.
async fn hold_with_a_waiter(
    server: &RedisServer,
    holder: &LockManager,
    waiter: &LockManager,
    name: &str,
    options: &LockOptions,
) -> (
    distlock::LockGuard,
    tokio::task::JoinHandle<Result<distlock::LockGuard, distlock::LockError>>,
) {
    let held = holder.acquire(name, options).await.expect("free");
    let waiting = tokio::spawn({
        let (waiter, name, options) = (waiter.clone(), name.to_owned(), options.clone());
        async move { waiter.acquire(&name, &options).await }
    });
    test_support::eventually(
        Duration::from_secs(5),
        "the waiter to take its place in line",
        || llen(server, &keys::named(name).line()) >= 1,
    )
    .await;
    (held, waiting)
}

/// The entries of the line of `lock:<name>`.
pub(crate) fn line_entries(server: &RedisServer, name: &str) -> Vec<String> {
    redis::cmd("LRANGE")
        .arg(keys::named(name).line())
        .arg(0)
        .arg(-1)
        .query(&mut server.conn())
        .unwrap()
}

/// A fenced `try_acquire` that finds the lock held (a first try: the acquire script, because of
/// the fencing) takes no place in line: a place nobody waits in would be handed the lock by the
/// holder's release, and the lock would then be held by nobody for the claim.
#[tokio::test]
async fn fenced_try_acquire_that_fails_leaves_no_ghost_in_line() {
    let server = RedisServer::start();
    let a = LockManager::connect(&server.url()).await.unwrap();
    let x = LockManager::connect(&server.url()).await.unwrap();
    let c = LockManager::connect(&server.url()).await.unwrap();
    let fenced = LockOptions::new()
        .fencing(true)
        .ttl(Duration::from_secs(30));

    let held = a.acquire("ghost", &fenced).await.expect("free");
    assert!(x
        .try_acquire("ghost", &fenced)
        .await
        .expect("redis")
        .is_none());
    let entries = line_entries(&server, "ghost");
    held.release().await.expect("still ours");

    // Nobody waits: the lock is free right after the release.
    let got = c
        .try_acquire("ghost", &LockOptions::new())
        .await
        .expect("redis");
    assert!(
        got.is_some(),
        "the lock is held by {:?} (pttl {} ms) after its only holder released it; line before \
         the release: {entries:?}",
        server.get("lock:ghost"),
        server.pttl("lock:ghost"),
    );
}

/// A contended fenced `acquire` takes exactly one place in line, is told of its hand-off at
/// once, and its own release frees the lock (a second place would outlive the acquisition and
/// be handed the lock after it).
#[tokio::test]
async fn fenced_waiter_takes_one_place_and_its_release_frees_the_lock() {
    let server = RedisServer::start();
    let a = LockManager::connect(&server.url()).await.unwrap();
    let b = LockManager::connect(&server.url()).await.unwrap();
    let c = LockManager::connect(&server.url()).await.unwrap();
    let fenced = LockOptions::new()
        .fencing(true)
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(20));

    let (held, waiter) = hold_with_a_waiter(&server, &a, &b, "double", &fenced).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let entries = line_entries(&server, "double");
    let released = Instant::now();
    held.release().await.expect("still ours");
    let guard = waiter.await.unwrap().expect("handed over");
    let handed_after = released.elapsed();
    guard.release().await.expect("still ours");

    let got = c
        .try_acquire("double", &LockOptions::new())
        .await
        .expect("redis");
    assert!(
        entries.len() == 1 && got.is_some() && handed_after < Duration::from_millis(500),
        "line while b waited: {entries:?}; hand-off took {handed_after:?}; after b released, \
         the lock is held by {:?} (pttl {} ms)",
        server.get("lock:double"),
        server.pttl("lock:double"),
    );
}

/// A hand-off message read too late is not trusted. A waiter whose runtime does not run for
/// longer than the claim (3 s: a paused process, a blocked current-thread runtime) is handed
/// the lock; the claim runs out; another client takes the lock; then the waiter runs again. Its
/// `acquire` must not return a guard from the stale message — whether it reads the message
/// first, or first looks at Redis and finds the lock held.
#[test]
fn a_stale_hand_off_message_never_yields_a_guard_while_another_client_holds_the_lock() {
    let server = RedisServer::start();
    let url = server.url();
    let main = test_support::runtime(2);
    let (a, c) = main.block_on(async {
        (
            LockManager::connect(&url).await.unwrap(),
            LockManager::connect(&url).await.unwrap(),
        )
    });
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(30));
    let held = main.block_on(a.acquire("stale", &options)).expect("free");

    // B waits on a current-thread runtime of its own, which we then block for 6 s.
    let (freeze_tx, freeze_rx) = tokio::sync::oneshot::channel::<()>();
    let (result_tx, result_rx) = std::sync::mpsc::channel();
    let b_url = url.clone();
    let b_options = options.clone().timeout(Duration::from_secs(10));
    let b_thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let b = LockManager::connect(&b_url).await.unwrap();
            let waiter = tokio::spawn(async move {
                let result = b.acquire("stale", &b_options).await;
                let token = result.as_ref().ok().map(|g| g.token().to_owned());
                (result, token)
            });
            freeze_rx.await.unwrap();
            std::thread::sleep(Duration::from_secs(6)); // the runtime does not run
            let (result, token) = waiter.await.unwrap();
            let ok = result.is_ok();
            result_tx.send((ok, token)).unwrap();
            // keep the guard's release from racing the check below
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(result);
        });
    });
    test_support::wait_until(Duration::from_secs(5), "b in line", || {
        llen(&server, &keys::named("stale").line()) >= 1
    });
    freeze_tx.send(()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    main.block_on(held.release()).expect("still ours");
    // The lock went to frozen B for the 3 s claim; C takes it after that.
    let c_guard = main
        .block_on(c.acquire("stale", &options))
        .expect("c gets the lock once b's claim ran out");
    let c_token = c_guard.token().to_owned();
    let (b_ok, b_token) = result_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let holder = server.get("lock:stale");
    assert!(
        !b_ok,
        "b's acquire returned a guard (token {b_token:?}) while c (token {c_token}) holds the \
         lock: Redis says the holder is {holder:?}"
    );
    b_thread.join().unwrap();
    main.block_on(c_guard.release()).ok();
}

/// With `auto_extend` and a long ttl (60 s), a lock handed over through the line is kept: the
/// watchdog schedules by the claim it was handed with (3 s), not by the ttl, and the hand-off is
/// confirmed a third into the claim.
#[tokio::test]
async fn a_handed_over_auto_extended_lock_with_a_long_ttl_is_kept() {
    let server = RedisServer::start();
    let a = LockManager::connect(&server.url()).await.unwrap();
    let b = LockManager::connect(&server.url()).await.unwrap();
    let options = LockOptions::new()
        .ttl(Duration::from_secs(60))
        .auto_extend(true)
        .timeout(Duration::from_secs(20));

    let (held, waiter) = hold_with_a_waiter(&server, &a, &b, "long", &options).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.release().await.expect("still ours");
    let guard = waiter.await.unwrap().expect("handed over");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !guard.is_lost() && guard.is_held().await.unwrap(),
        "4 s after the hand-off: lost = {}, Redis holder {:?} (b's token {}), pttl {}",
        guard.is_lost(),
        server.get("lock:long"),
        guard.token(),
        server.pttl("lock:long"),
    );
    guard.release().await.expect("still ours");
}
