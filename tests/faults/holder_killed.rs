//! Holder killed: a worker process takes the lock (ttl 2 s) and is killed with
//! SIGKILL in the middle of its section, so it never releases. Two other worker processes wait
//! for the same lock.
//!
//! Asserted: nobody entered while the killed holder held the lock (an in-flight counter in Redis
//! is exactly the holder's 1 when it dies); the first waiter gets the lock no earlier than the
//! moment the killed holder's ttl ran out, and within ttl + 3 s of the kill (generous on a shared
//! 2-core machine; it is typically the holder's remaining ttl plus a few ms); afterwards the
//! survivors keep taking turns, and no two sections ever overlapped.

use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use distlock::{distributed_lock, LockError};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use test_support::{keys, spawn_worker, wait_all, wait_until, RedisServer};

const TTL: Duration = Duration::from_secs(2);
const URL_VAR: &str = "DISTLOCK_KILLED_URL";
const LOCK_KEY: &str = "lock:victim";

fn unix_millis() -> u64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    u64::try_from(since_epoch.as_millis()).expect("milliseconds fit u64")
}

/// The holder's section: announce that it holds the lock, then "work" until it is killed.
#[distributed_lock(key = "victim", ttl = 2, timeout = 10)]
async fn hold_until_killed(mut data: MultiplexedConnection) -> Result<(), LockError> {
    let in_flight: i64 = data.incr("in_flight", 1).await?;
    if in_flight != 1 {
        let _: i64 = data.incr("violations", 1).await?;
    }
    let () = data.set("holder_ready", std::process::id()).await?;
    tokio::time::sleep(Duration::from_secs(60)).await;
    unreachable!("the holder is killed long before this");
}

/// A survivor's section: check nobody else is inside, record when it entered, work a little.
#[distributed_lock(key = "victim", ttl = 2, timeout = 10)]
async fn contend(mut data: MultiplexedConnection) -> Result<(), LockError> {
    let in_flight: i64 = data.incr("in_flight", 1).await?;
    let _: i64 = data.rpush("acquired_at", unix_millis()).await?;
    if in_flight != 1 {
        let _: i64 = data.incr("violations", 1).await?;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let _: i64 = data.decr("in_flight", 1).await?;
    let _: i64 = data.incr("sections", 1).await?;
    Ok(())
}

async fn connect_worker(url: &str) -> MultiplexedConnection {
    distlock::init(url).await.expect("connect to Redis");
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("data connection")
}

pub(crate) fn holder_worker() {
    let url = std::env::var(URL_VAR).expect("set by the test that starts this worker");
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(async {
        let data = connect_worker(&url).await;
        hold_until_killed(data).await.expect("hold the lock");
    });
}

pub(crate) fn contender_worker() {
    let url = std::env::var(URL_VAR).expect("set by the test that starts this worker");
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(async {
        let mut data = connect_worker(&url).await;
        loop {
            contend(data.clone()).await.expect("a section");
            let stop: bool = data.exists("stop").await.expect("EXISTS");
            if stop {
                return;
            }
        }
    });
}

/// How many waiters have a place in the lock's line.
fn in_line(server: &RedisServer) -> i64 {
    redis::cmd("LLEN")
        .arg(keys::of(LOCK_KEY).line())
        .query(&mut server.conn())
        .expect("LLEN")
}

fn kill(mut child: Child) {
    child.kill().expect("SIGKILL the holder");
    child.wait().expect("reap the holder");
}

#[test]
fn a_killed_holders_lock_passes_on_when_its_ttl_runs_out_and_never_earlier() {
    let server = RedisServer::start();
    let env = [(URL_VAR, server.url())];

    let holder = spawn_worker("holder_killed::holder_worker", &env);
    wait_until(
        Duration::from_secs(15),
        "the holder to take the lock",
        || server.exists("holder_ready"),
    );
    let contenders: Vec<Child> = (0..2)
        .map(|_| spawn_worker("holder_killed::contender_worker", &env))
        .collect();
    // Both contenders are waiting (each has its place in the lock's line) before the kill.
    wait_until(Duration::from_secs(15), "both contenders to wait", || {
        in_line(&server) == 2
    });

    let read_at = unix_millis();
    let remaining = server.pttl(LOCK_KEY);
    assert!(
        remaining > 0,
        "the holder still holds the lock (pttl {remaining})"
    );
    let expires_no_earlier_than = read_at + remaining.unsigned_abs();
    kill(holder);
    let killed = Instant::now();
    let killed_at = unix_millis();
    assert_eq!(
        server.get("in_flight").as_deref(),
        Some("1"),
        "only the killed holder was inside while it held the lock"
    );
    assert!(
        server.exists(LOCK_KEY),
        "SIGKILL releases nothing: the lock stays until its ttl runs out"
    );
    // The killed holder's section ended with its process.
    let _: i64 = redis::cmd("DECR")
        .arg("in_flight")
        .query(&mut server.conn())
        .unwrap();

    wait_until(
        TTL + Duration::from_secs(3),
        "a survivor to take the lock",
        || server.exists("acquired_at"),
    );
    let first: u64 = redis::cmd("LINDEX")
        .arg("acquired_at")
        .arg(0)
        .query(&mut server.conn())
        .unwrap();
    let takeover = Duration::from_millis(first.saturating_sub(killed_at));
    eprintln!(
        "holder killed with {remaining} ms of ttl left; a survivor took over {takeover:?} after the kill \
         ({} ms after the ttl ran out)",
        first.saturating_sub(expires_no_earlier_than)
    );
    assert!(
        first + 2 >= expires_no_earlier_than, // 2 ms: both clocks are read in whole milliseconds
        "a survivor took the lock {} ms before the killed holder's ttl ran out",
        expires_no_earlier_than - first
    );
    assert!(
        takeover <= TTL + Duration::from_secs(3),
        "took {takeover:?} after the kill"
    );

    // The survivors go on taking turns for a while, then stop.
    std::thread::sleep(Duration::from_millis(500));
    server.set("stop", "1");
    for status in wait_all(contenders, Duration::from_secs(30)) {
        assert!(status.success(), "a contender failed: {status}");
    }
    let sections: u64 = server.get("sections").unwrap().parse().unwrap();
    eprintln!(
        "survivors ran {sections} sections; whole test {:?} after the kill",
        killed.elapsed()
    );
    assert!(
        sections >= 2,
        "both survivors finished at least their first section"
    );
    assert_eq!(server.get("violations"), None, "two holders overlapped");
    assert_eq!(server.get("in_flight").as_deref(), Some("0"));
    assert!(!server.exists(LOCK_KEY), "the survivors released the lock");
}
