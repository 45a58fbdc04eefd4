//! Auto-extension: a watchdog keeps a short-ttl lock alive while its holder works, cancels the
//! holder's work when the lock is stolen, and stops the moment the holder is done.
//!
//! The attribute tests use the global client, installed once per binary on one shared server;
//! every test uses its own lock names.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use distlock::{distributed_lock, LockError, LockOptions, LostCause};
use test_support::{connect, eventually, global_server, RedisServer};
use tokio::time::Instant;

/// `SET key value PX millis`, as a thief that ignores the lock protocol would.
fn steal(server: &RedisServer, key: &str, value: &str, millis: u64) {
    server.set_px(key, value, millis);
}

/// What the body of [`hold_for`] saw: its lock's token and when it started.
type Seen = Mutex<Option<(String, Instant)>>;

/// Holds `lock:ae:<name>` (ttl 1 s) for `body`, recording its token and when it started.
#[distributed_lock(key = "ae:{name}", ttl = 1, timeout = 5, auto_extend = true, guard = lock)]
async fn hold_for(name: &str, body: Duration, seen: &Seen) -> Result<(), LockError> {
    *seen.lock().unwrap() = Some((lock.token().to_owned(), Instant::now()));
    tokio::time::sleep(body).await;
    Ok(())
}

/// Works forever, one tick every 50 ms: only the loss of the lock can end it.
#[distributed_lock(key = "ae:ticking", ttl = 3, timeout = 5, auto_extend = true)]
async fn tick_forever(ticks: &AtomicU64) -> Result<(), LockError> {
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        ticks.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_holds_a_one_second_lock_through_a_three_second_body() {
    let server = global_server().await;
    let other = connect(server).await;
    let seen: &'static Seen = Box::leak(Box::new(Mutex::new(None)));
    let work = tokio::spawn(hold_for("long", Duration::from_secs(3), seen));

    eventually(Duration::from_secs(5), "the body to start", || {
        seen.lock().unwrap().is_some()
    })
    .await;
    let started = seen.lock().unwrap().as_ref().unwrap().1;
    for at in [Duration::from_millis(1500), Duration::from_millis(2500)] {
        tokio::time::sleep_until(started + at).await;
        assert!(!work.is_finished(), "the body ended early");
        let stolen = other
            .try_acquire("ae:long", &LockOptions::new())
            .await
            .expect("try_acquire");
        assert!(
            stolen.is_none(),
            "another process took the 1 s lock {at:?} into the body: the watchdog did not extend it"
        );
        let pttl = server.pttl("lock:ae:long");
        assert!(
            pttl > 0 && pttl <= 1000,
            "the lock keeps a ttl of at most 1 s, got {pttl}"
        );
    }
    let result = tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .expect("the body ends")
        .expect("task panicked");
    assert!(result.is_ok(), "the function failed: {result:?}");
    assert!(!server.exists("lock:ae:long"), "released after the body");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_lock_cancels_the_body_and_returns_lost() {
    let server = global_server().await;
    let ticks: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
    let work = tokio::spawn(async move {
        let result = tick_forever(ticks).await;
        (result, Instant::now(), ticks.load(Ordering::SeqCst))
    });
    eventually(Duration::from_secs(5), "the body to tick", || {
        ticks.load(Ordering::SeqCst) > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    steal(server, "lock:ae:ticking", "thief", 60_000);
    let stolen_at = Instant::now();
    let (result, returned_at, ticks_at_return) =
        tokio::time::timeout(Duration::from_secs(10), work)
            .await
            .expect("a body that loops forever must be cancelled when its lock is stolen")
            .expect("task panicked");
    match result {
        Err(LockError::Lost { key, cause, .. }) => {
            assert_eq!(key, "lock:ae:ticking");
            assert_eq!(cause, LostCause::Taken, "the thief holds it");
        }
        other => panic!("expected Err(Lost), got {other:?}"),
    }
    // The watchdog checks every ttl/3 = 1 s; 3 s is a generous bound for noticing.
    let noticed = returned_at - stolen_at;
    assert!(
        noticed < Duration::from_secs(3),
        "the theft was noticed only after {noticed:?}"
    );

    // The body is gone: no more ticks. The thief's lock is left alone, also by the guard's
    // release in the background.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        ticks.load(Ordering::SeqCst),
        ticks_at_return,
        "the body kept running after the function returned"
    );
    assert_eq!(server.get("lock:ae:ticking").as_deref(), Some("thief"));
    assert!(
        server.pttl("lock:ae:ticking") > 55_000,
        "the thief's ttl was touched"
    );
    server.del("lock:ae:ticking");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manual_api_keeps_the_lock_and_reports_its_loss() {
    let server = global_server().await;
    let manager = connect(server).await;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .auto_extend(true);
    let guard = manager
        .acquire("ae:manual", &options)
        .await
        .expect("free lock");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        guard.is_held().await.expect("ask Redis"),
        "a 1 s lock was not kept alive for 2.5 s"
    );
    assert!(!guard.is_lost());

    steal(server, "lock:ae:manual", "thief", 60_000);
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("the watchdog did not notice the theft within 3 s");
    assert!(guard.is_lost());
    assert!(!guard.is_held().await.expect("ask Redis"));
    assert_eq!(guard.lost_cause(), Some(LostCause::Taken));
    match guard.release().await {
        Err(error @ LockError::Lost { .. }) => {
            assert!(
                matches!(&error, LockError::Lost { key, cause: LostCause::Taken, .. } if key == "lock:ae:manual"),
                "{error:?}"
            );
            assert!(
                error.to_string().contains("another worker took it"),
                "{error}"
            );
        }
        other => panic!("expected Err(Lost) from release, got {other:?}"),
    }
    assert_eq!(server.get("lock:ae:manual").as_deref(), Some("thief"));
    assert!(server.pttl("lock:ae:manual") > 55_000);
    server.del("lock:ae:manual");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_stops_when_the_body_ends() {
    let server = global_server().await;
    let other = connect(server).await;
    let seen: &'static Seen = Box::leak(Box::new(Mutex::new(None)));
    hold_for("short", Duration::from_millis(500), seen)
        .await
        .expect("the function succeeds");
    assert!(
        !server.exists("lock:ae:short"),
        "released when the body ended"
    );
    let (token, _) = seen.lock().unwrap().clone().expect("the body ran");

    // The sharp check, done at once: the watchdog ticks every 333 ms from the acquisition and
    // the body took 500 ms, so its next tick is ~166 ms away. Put the finished holder's own
    // token back with a 1 s ttl: a watchdog still running would find "its" lock there and keep
    // extending it, so it would outlive that second.
    steal(server, "lock:ae:short", &token, 1000);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert!(
        !server.exists("lock:ae:short"),
        "a watchdog kept extending a lock after its function returned (pttl {})",
        server.pttl("lock:ae:short")
    );

    // Another process takes it with a 1 s ttl and no auto-extension: it expires on time.
    let options = LockOptions::new().ttl(Duration::from_secs(1));
    let guard = other
        .try_acquire("ae:short", &options)
        .await
        .expect("try_acquire")
        .expect("the lock is free");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !server.exists("lock:ae:short"),
        "the 1 s lock did not expire"
    );
    assert!(guard.release().await.is_err(), "it had expired");
}

/// Holds `lock:ae:shortened` with `auto_extend` (ttl 3 s), then shortens it to 300 ms from the
/// body and works on for `body`; records when the shortening returned.
#[distributed_lock(key = "ae:shortened", ttl = 3, timeout = 5, auto_extend = true, guard = lock)]
async fn shorten_then_work(body: Duration, shortened: &Seen) -> Result<(), LockError> {
    lock.extend(Duration::from_millis(300)).await?;
    *shortened.lock().unwrap() = Some((lock.token().to_owned(), Instant::now()));
    tokio::time::sleep(body).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_extend_under_auto_extend_is_followed_by_the_watchdog() {
    let server = global_server().await;
    let other = connect(server).await;
    let shortened: &'static Seen = Box::leak(Box::new(Mutex::new(None)));
    let work = tokio::spawn(shorten_then_work(Duration::from_secs(2), shortened));
    eventually(
        Duration::from_secs(5),
        "the body to shorten its lock",
        || shortened.lock().unwrap().is_some(),
    )
    .await;
    // The watchdog last set 3 s and would next look 1 s after the acquisition: unless it follows
    // the body's 300 ms, the key expires ~0.3 s from now and another worker gets in while the
    // body still runs.
    let deadline = Instant::now() + Duration::from_millis(1800);
    while Instant::now() < deadline {
        let stolen = other
            .try_acquire("ae:shortened", &LockOptions::new())
            .await
            .expect("try_acquire");
        if let Some(guard) = stolen {
            let running = !work.is_finished();
            guard.release().await.ok();
            panic!(
                "another worker took the lock while the body (still running: {running}) believed \
                 it held it: the watchdog did not follow the manual extend"
            );
        }
        let pttl = server.pttl("lock:ae:shortened");
        assert!(
            pttl <= 300,
            "the watchdog restored its own ttl ({pttl} ms) over the body's 300 ms"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let result = tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .expect("the body ends")
        .expect("task panicked");
    assert!(result.is_ok(), "the function failed: {result:?}");
    assert!(
        !server.exists("lock:ae:shortened"),
        "released after the body"
    );
}

/// Without `auto_extend`: the body checks its lock with `extend`, handles the `Lost` itself and
/// goes on awaiting; only a watchdog's loss may cancel a body.
#[distributed_lock(key = "ae:handled", ttl = 5, timeout = 5, guard = lock)]
async fn handle_own_loss(server_url: &str) -> Result<&'static str, LockError> {
    let client = redis::Client::open(server_url).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("SET")
        .arg(lock.key())
        .arg("thief")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut connection)
        .await
        .unwrap();
    let outcome = match lock.extend(Duration::from_secs(5)).await {
        Err(LockError::Lost { .. }) => "noticed",
        other => panic!("extend of a stolen lock: {other:?}"),
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_handles_its_own_lost_extend_is_not_cancelled() {
    let server = global_server().await;
    let result = handle_own_loss(&server.url()).await;
    assert_eq!(
        result.expect("the body's own result, not a cancellation"),
        "noticed"
    );
    assert_eq!(
        server.get("lock:ae:handled").as_deref(),
        Some("thief"),
        "the release left the other holder's lock alone"
    );
    server.del("lock:ae:handled");
}

/// Holds `lock:ae:cancelled-extend` with `auto_extend` (ttl 3 s) and starts 20 `extend(3 s)`
/// calls that it abandons after 0–400 µs, then an `extend(600 ms)` abandoned right after it is
/// sent: it reaches Redis, unconfirmed. 600 ms: a watchdog that missed it would renew only about
/// a second after the last confirmed extend, after the lock expired; one that follows it renews
/// every 200 ms with 400 ms to spare, which a loaded machine keeps (200 ms left it 133 ms).
#[distributed_lock(key = "ae:cancelled-extend", ttl = 3, timeout = 5, auto_extend = true, guard = lock)]
async fn abandon_extends(
    body: Duration,
    started: &Seen,
    body_done: &AtomicBool,
) -> Result<(), LockError> {
    // One that completes, so that Redis knows the extend script before any is abandoned.
    lock.extend(Duration::from_secs(3)).await?;
    for n in 0..20u64 {
        let abandon_after = Duration::from_micros(n * 20);
        let _ = tokio::time::timeout(abandon_after, lock.extend(Duration::from_secs(3))).await;
    }
    // The last one surely reaches Redis and is never confirmed: polled once (which hands the
    // command to the connection), given time to be sent and answered, then dropped unread.
    {
        let mut last = std::pin::pin!(lock.extend(Duration::from_millis(600)));
        let polled =
            std::future::poll_fn(|cx| std::task::Poll::Ready(last.as_mut().poll(cx))).await;
        assert!(polled.is_pending(), "one poll cannot complete a round trip");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    *started.lock().unwrap() = Some((lock.token().to_owned(), Instant::now()));
    tokio::time::sleep(body).await;
    body_done.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_abandoned_in_flight_still_moves_the_watchdog() {
    let server = global_server().await;
    let other = connect(server).await;
    let started: &'static Seen = Box::leak(Box::new(Mutex::new(None)));
    let body_done: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let work = tokio::spawn(abandon_extends(
        Duration::from_millis(1500),
        started,
        body_done,
    ));
    eventually(
        Duration::from_secs(5),
        "the body to abandon its extends",
        || started.lock().unwrap().is_some(),
    )
    .await;
    while !work.is_finished() {
        let stolen = other
            .try_acquire("ae:cancelled-extend", &LockOptions::new())
            .await
            .expect("try_acquire");
        if let Some(guard) = stolen {
            // Looked at once the lock is taken: the attribute releases the lock after the body
            // and before the task finishes, and taking it then is no overlap.
            let overlapped = !body_done.load(Ordering::SeqCst);
            guard.release().await.ok();
            assert!(
                !overlapped,
                "another worker got in while the body ran: an extend abandoned in flight \
                 shortened the lock behind the watchdog's back"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let result = work.await.expect("task panicked");
    assert!(result.is_ok(), "the function failed: {result:?}");
}
