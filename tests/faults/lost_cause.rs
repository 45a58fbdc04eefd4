//! What a holder is told when it loses its lock, and what a broken helper key does to a release.
//!
//! - **Why it was lost.** `LockError::Lost` carries its cause, and its message the advice for
//!   that cause: Redis stopped (SIGSTOP) or killed (SIGKILL) under an `auto_extend` holder is
//!   "unreachable" — not advice to turn on the `auto_extend` that is on —, a lock another
//!   holder took is "taken", one nobody took is "expired".
//! - **A forced release is never the holder's own.** `force_release` (what `distlock release
//!   --force` runs) leaves the holder's token in the lock's `forced` mark, not in the `released`
//!   marker: the stuck holder's release, hold release, `extend` and watchdog all answer `Lost`
//!   with the cause "force-released", also after an idle second on either side (the operator's
//!   y/N prompt), when a release is marked and a marker holding the holder's token would make it
//!   answer `Ok`.
//! - **A helper key of another type** (something else wrote it) names itself in the error, and
//!   does not keep the lock held: a release with a string at the line key still frees the lock.

use std::time::Duration;

use distlock::{distributed_lock, LockError, LockManager, LockOptions, LostCause};
use test_support::keys;
use test_support::proxy::Unstall;
use test_support::{FaultProxy, RedisServer};
use tokio::time::Instant;

/// How long a connection must sit unused before distlock marks a release (and so before a
/// forced release marked with the holder's token would have fooled the holder).
const IDLE: Duration = Duration::from_millis(1200);

/// Works for a minute under a 1.5 s lock kept by the watchdog: only the loss of the lock ends it
/// early.
#[distributed_lock(key = "cut:{name}", ttl = "1500ms", timeout = 2, auto_extend = true)]
async fn work_until_cut_off(name: &'static str) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_secs(60)).await;
    Ok(())
}

/// Runs [`work_until_cut_off`] on a fresh server, stops the server with `stop` once the lock is
/// held and extended, and checks what the cancelled call returns.
async fn cut_off_by(how: &str, stop: fn(&RedisServer)) {
    let server = RedisServer::start();
    let manager = LockManager::builder(server.url())
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    distlock::init_with(manager).unwrap();
    let work = tokio::spawn(work_until_cut_off("incident"));
    // Held, and renewed once (every ttl/3 = 500 ms).
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        server.exists("lock:cut:incident"),
        "the body holds its lock"
    );
    stop(&server);
    let stopped = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .unwrap_or_else(|_| panic!("{how}: the body was not cancelled within 10 s"))
        .expect("no panic");
    eprintln!("{how}: {result:?} {:?} after", stopped.elapsed());
    let error = result.expect_err("the body cannot finish in time: the lock must be lost");
    assert!(
        matches!(
            &error,
            LockError::Lost { key, cause: LostCause::Unreachable, .. } if key == "lock:cut:incident"
        ),
        "{how}: {error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("Redis could not be reached"),
        "{how}: the message must say what happened: {message}"
    );
    assert!(
        message.contains("check that Redis is running and reachable"),
        "{how}: and what to do about it: {message}"
    );
    assert!(
        !message.contains("auto_extend = true"),
        "{how}: advice to turn on the auto_extend that is on: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_cut_off_by_a_paused_server_is_told_redis_was_unreachable() {
    if !test_support::in_own_process(
        module_path!(),
        "a_body_cut_off_by_a_paused_server_is_told_redis_was_unreachable",
    ) {
        return;
    }
    cut_off_by("SIGSTOP", RedisServer::pause).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_cut_off_by_a_killed_server_is_told_redis_was_unreachable() {
    if !test_support::in_own_process(
        module_path!(),
        "a_body_cut_off_by_a_killed_server_is_told_redis_was_unreachable",
    ) {
        return;
    }
    cut_off_by("SIGKILL", RedisServer::kill).await;
}

/// An operator breaks the lock of a `#[distributed_lock]` body kept by the watchdog: the body
/// is cancelled within a renewal, and the call returns `Lost` with the cause "force-released".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_whose_lock_an_operator_broke_is_cancelled_and_told_so() {
    if !test_support::in_own_process(
        module_path!(),
        "a_body_whose_lock_an_operator_broke_is_cancelled_and_told_so",
    ) {
        return;
    }
    let server = RedisServer::start();
    distlock::init_with(LockManager::connect(&server.url()).await.unwrap()).unwrap();
    let operator = LockManager::connect(&server.url()).await.unwrap();
    let work = tokio::spawn(work_until_cut_off("forced"));
    let info = loop {
        if let Some(info) = operator.inspect("cut:forced").await.unwrap() {
            break info;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(operator.force_release(&info).await.unwrap(), "broke it");
    let result = tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .expect("the body was not cancelled within 10 s")
        .expect("no panic");
    let error = result.expect_err("the body cannot finish in time: the lock was broken");
    assert!(
        matches!(
            &error,
            LockError::Lost { key, cause: LostCause::ForceReleased, .. } if key == "lock:cut:forced"
        ),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("distlock release --force"),
        "{error}"
    );
}

fn ttl_ms(millis: u64) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_millis(millis))
        .timeout(Duration::from_secs(5))
}

/// Waits until `key` is gone from `server`.
async fn until_gone(server: &RedisServer, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.exists(key) {
        assert!(Instant::now() < deadline, "{key} did not expire");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_another_holder_took_is_told_taken_and_one_nobody_took_expired() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let other = LockManager::connect(&server.url()).await.unwrap();

    let expired = manager.acquire("lapsed", &ttl_ms(200)).await.unwrap();
    until_gone(&server, "lock:lapsed").await;
    let error = expired.extend(Duration::from_secs(5)).await.unwrap_err();
    assert!(
        matches!(
            error,
            LockError::Lost {
                cause: LostCause::Expired,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("nobody holds it now"), "{error}");
    let error = expired.release().await.unwrap_err();
    assert!(
        matches!(
            error,
            LockError::Lost {
                cause: LostCause::Expired,
                ..
            }
        ),
        "{error:?}"
    );

    let taken = manager.acquire("taken", &ttl_ms(200)).await.unwrap();
    until_gone(&server, "lock:taken").await;
    let thief = other.acquire("taken", &ttl_ms(30_000)).await.unwrap();
    let error = taken.extend(Duration::from_secs(5)).await.unwrap_err();
    assert!(
        matches!(
            error,
            LockError::Lost {
                cause: LostCause::Taken,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("another worker took it"),
        "{error}"
    );
    let error = taken.release().await.unwrap_err();
    assert!(
        matches!(
            error,
            LockError::Lost {
                cause: LostCause::Taken,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(server.get("lock:taken").as_deref(), Some(thief.token()));
    thief.release().await.unwrap();
}

/// The operator's side of `distlock release --force`: inspect, think for a while (the y/N
/// prompt: the connection sits idle), break the lock.
async fn force_after_a_pause(operator: &LockManager, name: &str) {
    let info = operator.inspect(name).await.unwrap().expect("held");
    tokio::time::sleep(IDLE).await;
    assert!(operator.force_release(&info).await.unwrap(), "broke {name}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_released_holder_is_told_so_and_never_that_it_released_its_lock() {
    let server = RedisServer::start();
    let holders = LockManager::connect(&server.url()).await.unwrap();
    let operator = LockManager::connect(&server.url()).await.unwrap();
    let next = LockManager::connect(&server.url()).await.unwrap();
    let long = ttl_ms(30_000);
    let held = long.clone().hold_at_least(Duration::from_secs(20));

    for (name, options, how) in [
        ("stuck-release", &long, "release"),
        ("stuck-hold", &held, "release within hold_at_least"),
        ("stuck-extend", &long, "extend"),
    ] {
        let key = format!("lock:{name}");
        let stuck = holders.acquire(name, options).await.unwrap();
        force_after_a_pause(&operator, name).await;
        let successor = next.acquire(name, &long).await.unwrap();
        // The stuck holder comes back after an idle second of its own: a marked release.
        tokio::time::sleep(IDLE).await;
        let result = match how {
            "extend" => {
                let result = stuck.extend(Duration::from_secs(30)).await;
                drop(stuck);
                result
            }
            _ => stuck.release().await,
        };
        let error = result.expect_err(&format!(
            "{how}: the holder must not be told its force-released lock was its to {how}"
        ));
        assert!(
            matches!(&error, LockError::Lost { key: lost, cause: LostCause::ForceReleased, .. } if *lost == key),
            "{how}: {error:?}"
        );
        assert!(
            error.to_string().contains("distlock release --force"),
            "{how}: {error}"
        );
        assert_eq!(
            server.get(&key).as_deref(),
            Some(successor.token()),
            "{how}: the successor's lock is untouched"
        );
        assert!(server.pttl(&key) > 25_000, "{how}: nor its ttl");
        successor.release().await.unwrap();
    }

    // An auto_extend holder learns it from its watchdog, within a third of its ttl.
    let watched = holders
        .acquire("stuck-watched", &ttl_ms(1500).auto_extend(true))
        .await
        .unwrap();
    force_after_a_pause(&operator, "stuck-watched").await;
    tokio::time::timeout(Duration::from_secs(3), watched.lost())
        .await
        .expect("the watchdog notices the forced release");
    assert_eq!(watched.lost_cause(), Some(LostCause::ForceReleased));
    let error = watched.release().await.unwrap_err();
    assert!(
        matches!(
            error,
            LockError::Lost {
                cause: LostCause::ForceReleased,
                ..
            }
        ),
        "{error:?}"
    );
}

/// A release within `hold_at_least` leaves the lock key in place until the hold ends (its value
/// the holder's token, with nobody in line), and an operator may break that key: the holder has
/// released its lock all the same. When the reply to that release is lost with its connection
/// and the release is sent once more (a marked release, after an idle second), the second run
/// finds the holder's token in the `released` marker and the `forced` mark both: it must answer
/// `Ok`, as the first run did, not that an operator broke a lock the holder still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_sent_hold_release_is_ok_after_an_operator_broke_the_kept_lock() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let _unstall = Unstall(&proxy);
    let holders = LockManager::builder(proxy.url())
        .response_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let operator = LockManager::connect(&server.url()).await.unwrap();
    let name = "kept-then-forced";
    let key = format!("lock:{name}");
    assert!(operator.inspect(name).await.unwrap().is_none());

    let options = ttl_ms(30_000).hold_at_least(Duration::from_secs(20));
    // Redis knows the hold script already: the reply lost is the run's, not a `NOSCRIPT`.
    holders
        .acquire("kept-warm-up", &options)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let guard = holders.acquire(name, &options).await.unwrap();
    let token = guard.token().to_owned();
    // Idle long enough that the release is marked and sent once more when its connection drops.
    tokio::time::sleep(IDLE).await;
    // Every byte through the proxy is held a while: the second run cannot reach the server
    // before the proxy is stalled, once the first run's reply is seen lost.
    proxy.set_delay(Duration::from_millis(400));
    proxy.lose_next_reply_to(&key);
    let releasing = tokio::spawn(guard.release());
    let deadline = Instant::now() + Duration::from_secs(5);
    while proxy.replies_lost() == 0 {
        assert!(
            Instant::now() < deadline,
            "the hold release never reached Redis"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    proxy.stall();
    // The first run kept the key for the hold, so the operator sees the holder's token.
    let info = operator
        .inspect(name)
        .await
        .unwrap()
        .expect("kept for the hold");
    assert_eq!(server.get(&key).as_deref(), Some(token.as_str()));
    assert!(
        operator.force_release(&info).await.unwrap(),
        "broke the kept lock"
    );
    proxy.unstall();
    proxy.set_delay(Duration::ZERO);

    let released = releasing.await.unwrap();
    assert_eq!(proxy.replies_lost(), 1);
    assert!(
        released.is_ok(),
        "the holder released its lock itself before the operator broke the kept key: \
         {released:?}"
    );
    assert!(!server.exists(&key), "the forced release freed the key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_string_at_the_line_key_neither_keeps_the_lock_held_nor_blames_the_lock_key() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let line = &keys::named("broken").line();

    for (idle, options, how) in [
        (Duration::ZERO, ttl_ms(30_000), "release"),
        (
            IDLE,
            ttl_ms(30_000),
            "release after an idle second (marked)",
        ),
        (
            Duration::ZERO,
            ttl_ms(30_000).hold_at_least(Duration::from_secs(2)),
            "release within hold_at_least",
        ),
    ] {
        let guard = manager.acquire("broken", &options).await.unwrap();
        server.set(line, "written by something else");
        tokio::time::sleep(idle).await;
        let error = guard
            .release()
            .await
            .expect_err("the broken line is reported");
        let message = error.to_string();
        eprintln!("{how}: {message}");
        assert!(message.contains(line), "{how}: names the line: {message}");
        assert!(
            !message.contains("the lock's key holds"),
            "{how}: blames the lock key: {message}"
        );
        let pttl = server.pttl("lock:broken");
        assert!(
            pttl < 2_500,
            "{how}: the lock is still held for {pttl} ms after its release"
        );
        server.del(line);
        server.del("lock:broken");
    }

    // A waiter cannot join a line of another type: its error names the line.
    let holder = manager.acquire("broken", &ttl_ms(30_000)).await.unwrap();
    server.set(line, "written by something else");
    let waiter = LockManager::connect(&server.url()).await.unwrap();
    let error = waiter
        .acquire("broken", &ttl_ms(30_000).timeout(Duration::from_secs(1)))
        .await
        .map(drop)
        .expect_err("no line to wait in");
    assert!(error.to_string().contains(line), "{error}");
    server.del(line);
    holder.release().await.unwrap();
}

/// A held lock whose line or fencing counter something else wrote (another type) is still
/// held: `list` must not pass it over as it passes over a key that is no lock, but say which
/// helper key is broken, as `inspect` does. A lock key of another type is no lock, and skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_does_not_hide_a_held_lock_whose_helper_key_is_of_another_type() {
    use futures_util::StreamExt;

    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let rpush = |key: &str| {
        let () = redis::cmd("RPUSH")
            .arg(key)
            .arg("x")
            .query(&mut server.conn())
            .unwrap();
    };
    rpush("lock:not-a-lock");
    let listed = keys::named("listed");
    for broken in [&listed.line(), &listed.fence()] {
        let guard = manager.acquire("listed", &ttl_ms(30_000)).await.unwrap();
        if broken.ends_with(":line") {
            server.set(broken, "written by something else");
        } else {
            rpush(broken);
        }
        let error = manager
            .inspect("listed")
            .await
            .map(drop)
            .expect_err("inspect names the broken key");
        assert!(error.to_string().contains(broken), "{error}");
        let listed: Vec<Result<String, LockError>> = manager
            .list("*")
            .map(|info| info.map(|info| info.name))
            .collect()
            .await;
        assert!(
            listed.iter().any(|item| match item {
                Ok(name) => name == "listed",
                Err(error) => error.to_string().contains(broken),
            }),
            "{broken}: the held lock is neither listed nor its broken key named: {listed:?}"
        );
        server.del(broken);
        guard.release().await.unwrap();
    }
    let listed: Vec<Result<String, LockError>> = manager
        .list("*")
        .map(|info| info.map(|info| info.name))
        .collect()
        .await;
    assert!(listed.is_empty(), "a list is no lock: {listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_counter_or_release_marker_of_another_type_is_named() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let rpush = |key: &str| {
        let () = redis::cmd("RPUSH")
            .arg(key)
            .arg("x")
            .query(&mut server.conn())
            .unwrap();
    };

    let fence = &keys::named("fenced").fence();
    rpush(fence);
    let error = manager
        .try_acquire("fenced", &ttl_ms(30_000).fencing(true))
        .await
        .map(drop)
        .expect_err("no token from a list");
    assert!(error.to_string().contains(fence), "{error}");
    assert!(!server.exists("lock:fenced"), "nothing held");

    // A release that finds the lock not its own, after an idle second, reads the marker.
    let released = &keys::named("marked").released();
    let guard = manager.acquire("marked", &ttl_ms(200)).await.unwrap();
    until_gone(&server, "lock:marked").await;
    rpush(released);
    tokio::time::sleep(IDLE).await;
    let error = guard
        .release()
        .await
        .expect_err("the marker cannot be read");
    assert!(error.to_string().contains(released), "{error}");
}
