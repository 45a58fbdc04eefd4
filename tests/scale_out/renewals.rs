//! What a waiter's renewal costs Redis as the line grows: every waiter renews its place once a
//! second, so a renewal whose work grew with the line would make the line's work grow with the
//! square of its waiters. Managers stand for processes (each has its own connections and its
//! own hand-off channel, and only one task per manager and key waits in Redis's line).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{LockManager, LockOptions};
use test_support::{connect, eventually, keys, RedisServer};

/// How long the renewals are counted: about three renewals of every waiter.
const WINDOW: Duration = Duration::from_secs(3);

/// What Redis spent on scripts while `waiters` managers waited in the line of a held lock:
/// microseconds per `EVALSHA` over [`WINDOW`] (`INFO commandstats`, which times a script with
/// the commands it runs), and how many ran.
async fn script_time_per_renewal(server: &RedisServer, waiters: usize) -> (f64, u64) {
    let name = format!("renewals:{waiters}");
    let holder = connect(server).await;
    let held = holder
        .acquire(&name, &LockOptions::new().ttl(Duration::from_secs(120)))
        .await
        .expect("free");
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(120));
    let mut managers = Vec::with_capacity(waiters);
    for _ in 0..waiters {
        managers.push(LockManager::connect(&server.url()).await.expect("connect"));
    }
    let tasks: Vec<_> = managers
        .iter()
        .map(|manager| {
            let (manager, name, options) = (manager.clone(), name.clone(), options.clone());
            tokio::spawn(async move {
                let guard = manager.acquire(&name, &options).await?;
                guard.release().await.map(drop)
            })
        })
        .collect();
    let mut probe = server.conn();
    eventually(
        Duration::from_secs(30),
        &format!("{waiters} waiters in line"),
        || {
            let length: usize = redis::cmd("LLEN")
                .arg(keys::named(&name).line())
                .query(&mut probe)
                .unwrap();
            length == waiters
        },
    )
    .await;
    // Past every waiter's first renewal (a second after its join): the window sees renewals
    // of places already renewed, as a line that waits for long is made of.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.reset_stats();
    tokio::time::sleep(WINDOW).await;
    let (calls, usec) = evalsha_stats(&server.info("commandstats"));
    // Nobody's place moved during the window: no renewal had to read the line to find it.
    assert_eq!(
        server.command_count("lrange"),
        0,
        "renewals scanned the line of {waiters} waiters"
    );
    held.release().await.expect("still held");
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("every waiter is served")
            .expect("no panic")
            .expect("acquired and released");
    }
    // Every waiter renews about once a second (a second and a bit of jitter).
    let renewals = waiters as u64 * WINDOW.as_secs();
    assert!(
        calls * 2 >= renewals && calls <= renewals * 2,
        "{calls} scripts ran in {WINDOW:?} with {waiters} waiters renewing once a second"
    );
    (usec as f64 / calls as f64, calls)
}

/// `calls` and `usec` of `cmdstat_evalsha` in `INFO commandstats`.
fn evalsha_stats(info: &str) -> (u64, u64) {
    let stats = info
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:"))
        .unwrap_or_else(|| panic!("no EVALSHA ran: {info}"));
    let field = |name: &str| -> u64 {
        stats
            .split(',')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {stats}"))
    };
    (field("calls"), field("usec"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_costs_redis_the_same_however_long_the_line() {
    let server = RedisServer::start();
    let (few, few_calls) = script_time_per_renewal(&server, 50).await;
    let (many, many_calls) = script_time_per_renewal(&server, 300).await;
    eprintln!(
        "Redis time per renewal: {few:.1} us with 50 waiters ({few_calls} renewals), \
         {many:.1} us with 300 ({many_calls})"
    );
    // A renewal that scanned the line cost 3-5 x as much at 300 waiters as at 50 (and the
    // line's work per second 19-28 x); one that does not look for its place costs about the
    // same. Twice as much leaves room for a noisy machine, and for the log n of the lease
    // table.
    assert!(
        many <= few * 2.0,
        "a renewal's Redis time grew with the line: {few:.1} us at 50 waiters, {many:.1} us \
         at 300"
    );
}

/// Waiters whose places were renewed through the lease table, then a `FLUSHALL` that wipes the
/// line, the table and the held lock: a renewal that trusted its last lease without finding it
/// in the table would leave its waiter renewing a place that no longer exists, never served
/// while others keep the line from emptying (two managers here take the lock again and again).
/// Each waiter must find at its next renewal that its place is gone, take one again (or the free
/// lock), and be served in turn, one at a time, without the holder releasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_renewed_through_the_lease_table_survive_a_flushall() {
    const WAITERS: usize = 3;
    let server = RedisServer::start();
    let name = "renewals:flushall";
    let holder = connect(&server).await;
    let held = holder
        .acquire(name, &LockOptions::new().ttl(Duration::from_secs(120)))
        .await
        .expect("free");
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(30));
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..WAITERS {
        let manager = connect(&server).await;
        let (options, inside) = (options.clone(), Arc::clone(&inside));
        tasks.push(tokio::spawn(async move {
            let guard = manager.acquire(name, &options).await?;
            assert_eq!(
                inside.fetch_add(1, Ordering::SeqCst),
                0,
                "two holders at once"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            guard.release().await.map(drop)
        }));
    }
    let mut probe = server.conn();
    eventually(Duration::from_secs(10), "the waiters in line", || {
        let length: usize = redis::cmd("LLEN")
            .arg(keys::named(name).line())
            .query(&mut probe)
            .unwrap();
        length == WAITERS
    })
    .await;
    // Two renewals each: the first wrote the lease into the table, the second renewed it there.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let leases: usize = redis::cmd("ZCARD")
        .arg(keys::named(name).leases())
        .query(&mut probe)
        .unwrap();
    assert_eq!(leases, WAITERS, "every waiter's lease is in the table");
    assert_eq!(
        server.command_count("lrange"),
        0,
        "no renewal scanned the line"
    );
    server.flushall();
    let stop = Arc::new(AtomicBool::new(false));
    let mut churners = Vec::new();
    for _ in 0..2 {
        let manager = connect(&server).await;
        let (options, inside, stop) = (options.clone(), Arc::clone(&inside), Arc::clone(&stop));
        churners.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let guard = manager.acquire(name, &options).await.expect("churner");
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.expect("churner's release");
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(15), task)
            .await
            .expect("every waiter is served after the FLUSHALL, without a release")
            .expect("no panic")
            .expect("acquired and released");
    }
    stop.store(true, Ordering::SeqCst);
    for churner in churners {
        churner.await.expect("no panic");
    }
    drop(held);
}

/// A waiter W whose place was renewed through the lease table is handed the lock while its
/// runtime is blocked (its one thread runs a blocking call for 1.5 s): its ttl (300 ms) is
/// shorter than the claim, so the hand-off gives it 300 ms, which run out unseen, and the next
/// waiter takes the lock. W's lease in the table still runs, but its place is gone: the hand-off
/// took it off the line. When W runs again it reads the hand-off message (or clears it before
/// its next look), and its next renewal must look for its place, find none and take one at the
/// end; a renewal that trusted its lease would leave W renewing a place that no longer exists,
/// never served while others keep the line busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_handed_the_lock_while_stalled_takes_a_place_again() {
    let server = RedisServer::start();
    let name = "renewals:stalled";
    let holder = connect(&server).await;
    let held = holder
        .acquire(name, &LockOptions::new().ttl(Duration::from_secs(120)))
        .await
        .expect("free");
    let inside = Arc::new(AtomicUsize::new(0));
    // W: a manager on a runtime of its own, whose one thread the test blocks.
    let (block_tx, block_rx) = std::sync::mpsc::channel::<()>();
    let w = std::thread::spawn({
        let (url, inside) = (server.url(), Arc::clone(&inside));
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let manager = LockManager::connect(&url).await.unwrap();
                let options = LockOptions::new()
                    .ttl(Duration::from_millis(300))
                    .timeout(Duration::from_secs(12));
                let waiting = tokio::spawn(async move {
                    let guard = manager.acquire(name, &options).await?;
                    assert_eq!(
                        inside.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders at once"
                    );
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.map(drop)
                });
                // Until the test says so, the runtime runs W's waiter; then its thread blocks.
                while block_rx.try_recv().is_err() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                std::thread::sleep(Duration::from_millis(1500));
                waiting.await.unwrap()
            })
        }
    });
    let mut probe = server.conn();
    eventually(Duration::from_secs(10), "W in line", || {
        let length: usize = redis::cmd("LLEN")
            .arg(keys::named(name).line())
            .query(&mut probe)
            .unwrap();
        length == 1
    })
    .await;
    // Others who keep the line from emptying once the lock is handed on.
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(30));
    let stop = Arc::new(AtomicBool::new(false));
    let mut churners = Vec::new();
    for _ in 0..3 {
        let manager = connect(&server).await;
        let (options, inside, stop) = (options.clone(), Arc::clone(&inside), Arc::clone(&stop));
        churners.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let guard = manager.acquire(name, &options).await.expect("churner");
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.expect("churner's release");
            }
        }));
    }
    // Two renewals of W: the second went through the lease table.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let w_lease: Option<f64> = {
        let first: String = redis::cmd("LINDEX")
            .arg(keys::named(name).line())
            .arg(0)
            .query(&mut probe)
            .unwrap();
        redis::cmd("ZSCORE")
            .arg(keys::named(name).leases())
            .arg(first.split(' ').next().unwrap())
            .query(&mut probe)
            .unwrap()
    };
    assert!(
        w_lease.is_some(),
        "W, first in line, renewed through the lease table"
    );
    block_tx.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.release().await.expect("still held");
    let served = tokio::task::spawn_blocking(move || w.join())
        .await
        .unwrap()
        .expect("no panic in W's thread");
    stop.store(true, Ordering::SeqCst);
    served.expect("W is served after it took a place again");
    for churner in churners {
        churner.await.expect("no panic");
    }
}
