//! Stale holder: a holder that stops running (a GC pause, a stopped VM, here a
//! `SIGSTOPped` worker process) for longer than its ttl comes back believing it still holds the
//! lock. Redis cannot stop it from running its code; what distlock guarantees is that
//! - its release (compare-and-delete) does not delete the new owner's lock, and says `Lost`;
//! - with fencing, the storage that checks tokens rejects its late write, because the new owner's
//!   token is larger.
//!
//! The storage here is a Redis hash guarded by a small Lua script that accepts a write only with a
//! token larger than any it has seen: the "storage rejects the smaller token" half of fencing that
//! distlock leaves to the user (see `LockGuard::fencing_token`).

use std::time::{Duration, Instant};

use distlock::{distributed_lock, LockError, LockManager, LockOptions};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use test_support::{send_signal, spawn_worker, wait_all, wait_until, RedisServer};

const URL_VAR: &str = "DISTLOCK_STALE_URL";

/// Writes `value` to the fenced record `KEYS[1]` only if `token` (`ARGV[1]`) is larger than the
/// largest token the record has accepted; returns 1 when written, 0 when rejected.
const FENCED_WRITE: &str = r"
local seen = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) <= seen then return 0 end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return 1
";

async fn fenced_write(data: &mut MultiplexedConnection, token: u64, value: &str) -> bool {
    let written: i64 = redis::Script::new(FENCED_WRITE)
        .key("ledger:record")
        .arg(token)
        .arg(value)
        .invoke_async(data)
        .await
        .expect("fenced write");
    written == 1
}

async fn data_connection(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("data connection")
}

/// The worker that goes stale: takes the lock (ttl 1 s, fencing), writes, announces itself, and
/// is `SIGSTOPped` by the test while it "works"; once continued it writes late and releases.
pub(crate) fn stale_worker() {
    let url = std::env::var(URL_VAR).expect("set by the test that starts this worker");
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(async {
        let manager = LockManager::connect(&url).await.expect("connect");
        let mut data = data_connection(&url).await;
        let options = LockOptions::new().ttl(Duration::from_secs(1)).fencing(true);
        let guard = manager.acquire("ledger", &options).await.expect("acquire");
        let fence = guard.fencing_token().expect("fencing token");
        assert!(fenced_write(&mut data, fence, "stale holder, in time").await);
        let () = data
            .set("stale:ready", format!("{fence} {}", guard.token()))
            .await
            .unwrap();
        // "Work" until told to finish; the test stops this process in here.
        loop {
            // The test stops this process at any point of this loop, maybe with the request in
            // flight: once continued, its response timer can fire before the reply is read.
            // That is the stop, not an answer: ask again.
            let go: bool = match data.exists("go").await {
                Ok(go) => go,
                Err(error) if error.is_timeout() => false,
                Err(error) => panic!("EXISTS go: {error}"),
            };
            if go {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let late = fenced_write(&mut data, fence, "stale holder, late").await;
        let () = data
            .set("stale:write", if late { "accepted" } else { "rejected" })
            .await
            .unwrap();
        let release = match guard.release().await {
            Ok(()) => "ok".to_owned(),
            Err(LockError::Lost { key, .. }) => format!("lost {key}"),
            Err(other) => format!("error {other}"),
        };
        let () = data.set("stale:release", release).await.unwrap();
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_holders_release_spares_the_new_owner_and_fencing_rejects_its_late_write() {
    let server = RedisServer::start();
    let worker = spawn_worker("stale_holder::stale_worker", &[(URL_VAR, server.url())]);
    let pid = worker.id();
    wait_until(
        Duration::from_secs(15),
        "the worker to take the lock",
        || server.exists("stale:ready"),
    );
    let ready = server.get("stale:ready").unwrap();
    let (stale_fence, stale_token) = ready.split_once(' ').unwrap();
    let stale_fence: u64 = stale_fence.parse().unwrap();
    assert_eq!(server.get("lock:ledger").as_deref(), Some(stale_token));

    send_signal(pid, "STOP");
    let stopped = Instant::now();
    wait_until(
        Duration::from_secs(5),
        "the stopped holder's lock to expire",
        || !server.exists("lock:ledger"),
    );
    eprintln!(
        "stale holder's lock expired {:?} after SIGSTOP",
        stopped.elapsed()
    );

    let manager = LockManager::connect(&server.url()).await.unwrap();
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .fencing(true);
    let owner = manager.acquire("ledger", &options).await.unwrap();
    let owner_fence = owner.fencing_token().unwrap();
    assert!(
        owner_fence > stale_fence,
        "fencing tokens increase: {owner_fence} after {stale_fence}"
    );
    let mut data = data_connection(&server.url()).await;
    assert!(fenced_write(&mut data, owner_fence, "new owner").await);

    // The stale holder wakes up, still believing it holds the lock.
    server.set("go", "1");
    send_signal(pid, "CONT");
    for status in wait_all(vec![worker], Duration::from_secs(20)) {
        assert!(status.success(), "the stale worker failed: {status}");
    }

    assert_eq!(
        server.get("stale:write").as_deref(),
        Some("rejected"),
        "the storage must reject the late write of the smaller token"
    );
    assert_eq!(
        server.get("stale:release").as_deref(),
        Some("lost lock:ledger"),
        "the stale release reports that the lock was no longer its own"
    );
    assert_eq!(
        server.get("lock:ledger").as_deref(),
        Some(owner.token()),
        "the stale release must not delete the new owner's lock"
    );
    let record: Vec<String> = redis::cmd("HMGET")
        .arg("ledger:record")
        .arg("fence")
        .arg("value")
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(record, [owner_fence.to_string(), "new owner".to_owned()]);
    assert!(owner.is_held().await.unwrap());
    owner.release().await.unwrap();
    assert!(!server.exists("lock:ledger"));
}

/// The same through the attribute, in one process: the function's body outlives its ttl while
/// another client (another `LockManager`, as another process would) takes the lock over.
#[distributed_lock(key = "report", ttl = "300ms", timeout = 5)]
async fn slow_report(inside: tokio::sync::oneshot::Sender<()>) -> Result<&'static str, LockError> {
    let _ = inside.send(());
    tokio::time::sleep(Duration::from_millis(900)).await;
    Ok("the body's result")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attribute_body_that_outlives_its_ttl_leaves_the_new_owners_lock_alone() {
    if !test_support::in_own_process(
        module_path!(),
        "an_attribute_body_that_outlives_its_ttl_leaves_the_new_owners_lock_alone",
    ) {
        return;
    }
    let server = RedisServer::start();
    distlock::init_with(LockManager::connect(&server.url()).await.unwrap()).unwrap();
    let (inside, entered) = tokio::sync::oneshot::channel();
    let stale = tokio::spawn(slow_report(inside));
    entered.await.unwrap();
    let other_client = LockManager::connect(&server.url()).await.unwrap();
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(5));
    let started = Instant::now();
    let owner = other_client.acquire("report", &options).await.unwrap();
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(2),
        "taken over once the 300 ms ttl ran out ({waited:?})"
    );
    assert!(!stale.is_finished(), "the stale body is still running");

    // The stale function still returns its body's result (the lost lock is logged), and its
    // release leaves the new owner's lock in place.
    assert_eq!(stale.await.unwrap().unwrap(), "the body's result");
    assert_eq!(
        server.get("lock:report").as_deref(),
        Some(owner.token()),
        "the stale release must not delete the new owner's lock"
    );
    owner.release().await.unwrap();
}
