//! `LockOptions::hold_at_least` on a standalone server: a release before the hold ends leaves the
//! lock to expire then, only if it is still ours, and whoever waits gets it when it expires —
//! not earlier, and not much later. (On a cluster and on Redlock: `scale_out/hold_at_least.rs`.)

use std::time::Duration;

use distlock::{LockError, LockManager, LockOptions};
use test_support::{connect, eventually, keys, FaultProxy, RedisServer};
use tokio::time::Instant;

fn options(ttl_ms: u64, hold_ms: u64) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_millis(ttl_ms))
        .hold_at_least(Duration::from_millis(hold_ms))
}

#[tokio::test]
async fn a_release_before_the_hold_ends_leaves_the_lock_to_expire_then() {
    let server = RedisServer::start();
    let (first, second) = (connect(&server).await, connect(&server).await);
    let guard = first.acquire("job", &options(30_000, 1_500)).await.unwrap();
    let token = guard.token().to_owned();
    let released = Instant::now();
    guard.release().await.expect("a held lock releases");

    assert_eq!(
        server.get("lock:job").as_deref(),
        Some(token.as_str()),
        "the lock stays until the hold ends"
    );
    let pttl = server.pttl("lock:job");
    assert!(
        (1..=1_500).contains(&pttl),
        "the lock expires when the hold ends, not at its 30 s ttl: pttl {pttl}"
    );
    assert!(
        second
            .try_acquire("job", &LockOptions::new())
            .await
            .unwrap()
            .is_none(),
        "nobody gets it during the hold"
    );
    eventually(Duration::from_secs(10), "the held lock to expire", || {
        !server.exists("lock:job")
    })
    .await;
    assert!(
        released.elapsed() >= Duration::from_millis(1_300),
        "expired {:?} after the release, before the hold's end",
        released.elapsed()
    );
    let next = second
        .try_acquire("job", &LockOptions::new())
        .await
        .unwrap();
    assert!(next.is_some(), "free once the hold is over");
}

#[tokio::test]
async fn a_release_after_the_hold_deletes_the_lock_at_once() {
    let server = RedisServer::start();
    let manager = connect(&server).await;
    let guard = manager
        .acquire("late", &options(30_000, 100))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    guard.release().await.unwrap();
    assert!(!server.exists("lock:late"), "nothing left to hold for");
}

#[tokio::test]
async fn an_uncontended_cycle_with_a_hold_is_set_and_one_script() {
    let server = RedisServer::start();
    let manager = connect(&server).await;
    // Once, so that the scripts are cached and the connection is up.
    manager
        .acquire("warm", &options(1_000, 100))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    server.reset_stats();
    let guard = manager
        .acquire("cycle", &options(30_000, 5_000))
        .await
        .unwrap();
    guard.release().await.unwrap();
    assert_eq!(server.command_count("set"), 1);
    assert_eq!(server.command_count("evalsha"), 1);
    assert_eq!(server.command_count("eval"), 0);
}

#[tokio::test]
async fn a_hold_never_touches_a_lock_that_someone_else_holds_now() {
    let server = RedisServer::start();
    let manager = connect(&server).await;
    let guard = manager.acquire("stolen", &options(300, 300)).await.unwrap();
    eventually(Duration::from_secs(10), "the lock to expire", || {
        !server.exists("lock:stolen")
    })
    .await;
    server.set_px("lock:stolen", "someone-else", 60_000);
    let error = guard.release().await.unwrap_err();
    assert!(matches!(error, LockError::Lost { .. }), "{error}");
    assert_eq!(server.get("lock:stolen").as_deref(), Some("someone-else"));
    assert!(
        server.pttl("lock:stolen") > 50_000,
        "the other holder's expiry is left alone"
    );
}

#[tokio::test]
async fn a_waiter_in_line_gets_the_lock_when_the_hold_ends_not_earlier_nor_much_later() {
    let server = RedisServer::start();
    let (holder, waiter) = (connect(&server).await, connect(&server).await);
    let hold = Duration::from_secs(2);
    // The hold runs from when Redis answered, between these two instants.
    let asked = Instant::now();
    let guard = holder
        .acquire("line", &options(30_000, 2_000))
        .await
        .unwrap();
    let acquired = Instant::now();
    let waiting = tokio::spawn(async move {
        let options = LockOptions::new().timeout(Duration::from_secs(20));
        let guard = waiter.acquire("line", &options).await.unwrap();
        let at = Instant::now();
        (guard, at)
    });
    eventually(
        Duration::from_secs(10),
        "the waiter to take its place in line",
        || !server.keys("*line*").is_empty(),
    )
    .await;
    // The waiter saw a 30 s ttl; the release shortens what is left to the hold's end.
    guard.release().await.unwrap();
    let (next, got_at) = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiter gets the lock")
        .unwrap();
    let (since_asked, after) = (got_at - asked, got_at - acquired);
    eprintln!(
        "handed over {:?} after the hold ended",
        after.saturating_sub(hold)
    );
    assert!(
        since_asked >= hold,
        "handed over {since_asked:?} after the acquisition was sent, before the hold ended"
    );
    // Without the release's wake-up the waiter would look again only when the 30 s ttl it saw
    // runs out; the bound leaves room for a loaded machine's scheduling.
    assert!(
        after < hold + Duration::from_secs(3),
        "handed over {after:?} after acquisition, long after the hold ended"
    );
    assert_eq!(server.get("lock:line").as_deref(), Some(next.token()));
    next.release().await.unwrap();
}

#[tokio::test]
async fn auto_extend_keeps_the_lock_past_the_hold_and_the_release_then_deletes_it() {
    let server = RedisServer::start();
    let manager = connect(&server).await;
    let options = options(600, 600).auto_extend(true);
    let guard = manager.acquire("watched", &options).await.unwrap();
    // Past both the ttl and the hold: only the watchdog keeps it.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(server.get("lock:watched").as_deref(), Some(guard.token()));
    guard.release().await.unwrap();
    assert!(
        !server.exists("lock:watched"),
        "the hold is over: deleted at once"
    );
}

#[tokio::test]
async fn a_release_within_the_hold_overrides_the_expiry_that_auto_extend_and_extend_set() {
    let server = RedisServer::start();
    let manager = connect(&server).await;
    let options = options(5_000, 2_000).auto_extend(true);
    let guard = manager.acquire("extended", &options).await.unwrap();
    guard.extend(Duration::from_secs(60)).await.unwrap();
    assert!(server.pttl("lock:extended") > 50_000);
    guard.release().await.unwrap();
    let pttl = server.pttl("lock:extended");
    assert!(
        (1..=2_000).contains(&pttl),
        "expires when the hold ends, not after the extension: pttl {pttl}"
    );
}

#[tokio::test]
async fn a_dropped_guard_within_the_hold_also_leaves_the_lock_to_expire_then() {
    let server = RedisServer::start();
    let manager = connect(&server).await;
    let guard = manager
        .acquire("dropped", &options(30_000, 1_000))
        .await
        .unwrap();
    let token = guard.token().to_owned();
    drop(guard);
    eventually(
        Duration::from_secs(10),
        "the background release to set the expiry",
        || (1..=1_000).contains(&server.pttl("lock:dropped")),
    )
    .await;
    assert_eq!(server.get("lock:dropped"), Some(token));
}

/// A hold that ends before the waiter's next look (it renews its place every second): only the
/// release's wake-up tells it the new expiry in time. Without it the waiter would sleep on the
/// 30 s ttl it saw until its renewal, about half a second after the hold ended.
#[tokio::test]
async fn the_release_wakes_the_first_waiter_to_learn_a_hold_that_ends_before_its_next_look() {
    let server = RedisServer::start();
    let (holder, waiter) = (connect(&server).await, connect(&server).await);
    let hold = Duration::from_millis(500);
    // The hold runs from when Redis answered, between these two instants.
    let asked = Instant::now();
    let guard = holder.acquire("soon", &options(30_000, 500)).await.unwrap();
    let acquired = Instant::now();
    let waiting = tokio::spawn(async move {
        let options = LockOptions::new().timeout(Duration::from_secs(20));
        let guard = waiter.acquire("soon", &options).await.unwrap();
        (guard, Instant::now())
    });
    eventually(
        Duration::from_secs(10),
        "the waiter to take its place in line",
        || !server.keys("*line*").is_empty(),
    )
    .await;
    guard.release().await.unwrap();
    let (next, got_at) = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiter gets the lock")
        .unwrap();
    let late = (got_at - acquired).saturating_sub(hold);
    assert!(got_at - asked >= hold, "handed over before the hold ended");
    assert!(
        late < Duration::from_millis(300),
        "handed over {late:?} after the hold ended: the waiter was not told the new expiry"
    );
    next.release().await.unwrap();
}

/// At the hold's end a newcomer's `SET NX` that comes right then must not jump the line: the
/// waiter that queued behind the hold gets the lock first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_end_of_the_hold_the_waiter_in_line_goes_before_a_newcomer() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let server = RedisServer::start();
    let (holder, waiter, newcomer) = (
        connect(&server).await,
        connect(&server).await,
        connect(&server).await,
    );
    let guard = holder.acquire("fifo", &options(30_000, 600)).await.unwrap();
    let waiter_got = Arc::new(AtomicBool::new(false));
    let waiting = tokio::spawn({
        let waiter_got = Arc::clone(&waiter_got);
        async move {
            let options = LockOptions::new().timeout(Duration::from_secs(20));
            let guard = waiter.acquire("fifo", &options).await.unwrap();
            waiter_got.store(true, Ordering::SeqCst);
            // Held a while, so that a newcomer that overtook would be seen.
            tokio::time::sleep(Duration::from_millis(300)).await;
            guard.release().await.unwrap();
        }
    });
    eventually(
        Duration::from_secs(10),
        "the waiter to take its place in line",
        || !server.keys("*line*").is_empty(),
    )
    .await;
    guard.release().await.unwrap();
    // The newcomer tries all through the hold's end, without waiting in line.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !waiter_got.load(Ordering::SeqCst) && Instant::now() < deadline {
        if let Some(taken) = newcomer
            .try_acquire("fifo", &LockOptions::new())
            .await
            .unwrap()
        {
            let waited = waiter_got.load(Ordering::SeqCst);
            taken.release().await.unwrap();
            panic!("a newcomer took the lock before the waiter in line (waiter had it: {waited})");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(waiter_got.load(Ordering::SeqCst), "the waiter got the lock");
    waiting.await.unwrap();
}

/// With nobody in line the release writes nothing but the expiry: the lock's value is left as it
/// is (no `;hold=` end in it), and the lock is free for anyone right at the hold's end.
#[tokio::test]
async fn with_nobody_waiting_the_lock_expires_at_the_holds_end_and_a_newcomer_gets_it_then() {
    let server = RedisServer::start();
    let (holder, newcomer) = (connect(&server).await, connect(&server).await);
    let guard = holder
        .acquire("alone", &options(30_000, 800))
        .await
        .unwrap();
    let released = Instant::now();
    let token = guard.token().to_owned();
    guard.release().await.unwrap();
    let pttl = server.pttl("lock:alone");
    assert!((1..=800).contains(&pttl), "pttl {pttl}");
    assert_eq!(
        server.get("lock:alone"),
        Some(token),
        "the value is unchanged when nobody waits"
    );
    let got = loop {
        if let Some(guard) = newcomer
            .try_acquire("alone", &LockOptions::new())
            .await
            .unwrap()
        {
            break (guard, released.elapsed());
        }
        assert!(released.elapsed() < Duration::from_secs(10), "never free");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(
        got.1 >= Duration::from_millis(700),
        "free {:?} after the release, before the hold's end",
        got.1
    );
    assert!(
        got.1 < Duration::from_millis(1_100),
        "free only {:?} after the release: kept past the hold's end",
        got.1
    );
    got.0.release().await.unwrap();
}

/// The line's waiter gets the lock at the hold's end although newcomers keep trying all through
/// it: one with `try_acquire` (a plain `SET NX`), one with `acquire`, which joins the line behind
/// it. The waiter is far away (150 ms each way), so its look at the hold's end lands well after
/// the newcomers' tries: a lock that merely expired then would be theirs. While the hold runs
/// the lock key is kept a claim past it, and inspection shows the hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiter_in_line_goes_first_though_newcomers_keep_trying_and_joining() {
    use std::sync::{Arc, Mutex};

    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let waiter = LockManager::builder(proxy.url()).connect().await.unwrap();
    let (holder, trier, joiner) = (
        connect(&server).await,
        connect(&server).await,
        connect(&server).await,
    );
    let order = Arc::new(Mutex::new(Vec::new()));
    let guard = holder
        .acquire("queue", &options(30_000, 800))
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let order = Arc::clone(&order);
        async move {
            let options = LockOptions::new().timeout(Duration::from_secs(20));
            let guard = waiter.acquire("queue", &options).await.unwrap();
            order.lock().unwrap().push("waiter");
            tokio::time::sleep(Duration::from_millis(300)).await;
            guard.release().await.unwrap();
        }
    });
    eventually(
        Duration::from_secs(10),
        "the waiter to take its place in line",
        || !server.keys("*line*").is_empty(),
    )
    .await;
    proxy.set_delay(Duration::from_millis(150));
    let released = Instant::now();
    guard.release().await.unwrap();
    let pttl = server.pttl("lock:queue");
    assert!(
        (800..=3_800).contains(&pttl),
        "kept a claim past the hold while someone waits: pttl {pttl}"
    );
    let info = holder.inspect("queue").await.unwrap().expect("held");
    let left = info.ttl_left.expect("an expiry");
    assert!(
        left <= Duration::from_millis(800),
        "inspection shows the hold: {left:?}"
    );
    assert!(
        info.holder.is_some(),
        "inspection still shows the releaser as the holder"
    );
    let joining = tokio::spawn({
        let order = Arc::clone(&order);
        async move {
            let options = LockOptions::new().timeout(Duration::from_secs(20));
            let guard = joiner.acquire("queue", &options).await.unwrap();
            order.lock().unwrap().push("joiner");
            guard.release().await.unwrap();
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while order.lock().unwrap().is_empty() && Instant::now() < deadline {
        if let Some(taken) = trier
            .try_acquire("queue", &LockOptions::new())
            .await
            .unwrap()
        {
            order.lock().unwrap().push("trier");
            taken.release().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let waited = released.elapsed();
    waiting.await.unwrap();
    joining.await.unwrap();
    let order = order.lock().unwrap().clone();
    assert_eq!(order, ["waiter", "joiner"], "who got the lock, in order");
    assert!(
        waited >= Duration::from_millis(700),
        "handed over {waited:?} after the release, before the hold's end"
    );
    assert!(
        waited < Duration::from_secs(2),
        "handed over {waited:?} after the release, long after the hold's end"
    );
}

/// A waiter that dies in line during the hold never looks at its end: the lock key, kept a claim
/// past the hold for the line, expires then, and a newcomer gets it.
#[tokio::test]
async fn when_the_whole_line_dies_during_the_hold_a_newcomer_gets_the_lock_within_hold_and_claim() {
    let server = RedisServer::start();
    let (holder, newcomer) = (connect(&server).await, connect(&server).await);
    let guard = holder
        .acquire("orphan", &options(30_000, 500))
        .await
        .unwrap();
    // A waiter of a process that died right after joining: its place's lease still runs, and
    // nobody listens on its channel.
    let mut conn = server.conn();
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query(&mut conn).unwrap();
    let lease_deadline = seconds * 1_000 + micros / 1_000 + 3_000;
    let () = redis::cmd("RPUSH")
        .arg(keys::named("orphan").line())
        .arg(format!(
            "dead-waiter {lease_deadline} 30000 0 distlock:grants:nobody"
        ))
        .query(&mut conn)
        .map(|_: i64| ())
        .unwrap();
    let token = guard.token().to_owned();
    let released = Instant::now();
    guard.release().await.unwrap();
    let value = server.get("lock:orphan").expect("kept");
    assert!(
        value
            .strip_prefix(&format!("{token};hold="))
            .is_some_and(|end| end.parse::<u64>().is_ok()),
        "the release saw a live waiter and wrote the hold's end into the value: {value}"
    );
    let took = loop {
        if let Some(guard) = newcomer
            .try_acquire("orphan", &LockOptions::new())
            .await
            .unwrap()
        {
            break (guard, released.elapsed());
        }
        assert!(released.elapsed() < Duration::from_secs(20), "never free");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        took.1 >= Duration::from_millis(400),
        "free {:?} after the release, before the hold's end",
        took.1
    );
    assert!(
        took.1 < Duration::from_millis(500 + 3_000 + 700),
        "free {:?} after the release: later than the hold and the claim",
        took.1
    );
    took.0.release().await.unwrap();
}

/// The hold's end lives in the lock's value, which the join's `GET` of the lock key reads anyway:
/// a waiter joining behind a holder (no hold at all) runs the commands a join always ran — one
/// script, its `GET` of the lock key, `TIME`, `RPUSH`, the line's first `PEXPIRE` and the
/// holder's `PTTL` for the first waiter — and no `GET` of any other key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_behind_a_holder_reads_no_key_but_the_lock() {
    use std::collections::BTreeMap;

    let server = RedisServer::start();
    let (holder, waiter) = (connect(&server).await, connect(&server).await);
    let guard = holder
        .acquire("cost", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    server.reset_stats();
    let waiting = tokio::spawn(async move {
        let options = LockOptions::new().timeout(Duration::from_secs(20));
        waiter.acquire("cost", &options).await.unwrap()
    });
    eventually(
        Duration::from_secs(10),
        "the waiter to take its place in line",
        || server.exists(&keys::named("cost").line()),
    )
    .await;
    let counts = server.command_counts();
    let calls = |name: &str| counts.get(name).copied().unwrap_or(0);
    // On a fresh server the first `EVALSHA` finds no script, and runs again after loading it.
    assert_eq!(
        calls("evalsha") - calls("script|load") - calls("script"),
        1,
        "one join script: {counts:?}"
    );
    let run: BTreeMap<&str, u64> = ["get", "time", "rpush", "pexpire", "pttl"]
        .into_iter()
        .map(|name| (name, calls(name)))
        .collect();
    assert_eq!(
        run,
        BTreeMap::from([
            ("get", 1),
            ("pexpire", 1),
            ("pttl", 1),
            ("rpush", 1),
            ("time", 1)
        ]),
        "the join's commands (all that ran: {counts:?})"
    );
    guard.release().await.unwrap();
    waiting.await.unwrap().release().await.unwrap();
}

/// The only waiter gives up (its timeout runs out) during the hold: nobody is left in line to
/// take the lock at the hold's end, so the lock must not stay kept a claim past it — a
/// newcomer's plain `try_acquire` (a `SET NX`, which never reads the line) gets it right at
/// the hold's end, as it does when nobody waited at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_only_waiter_gives_up_during_the_hold_the_lock_is_free_at_the_holds_end() {
    let server = RedisServer::start();
    let (holder, waiter, newcomer) = (
        connect(&server).await,
        connect(&server).await,
        connect(&server).await,
    );
    let guard = holder.acquire("quit", &options(30_000, 900)).await.unwrap();
    let token = guard.token().to_owned();
    let waiting = tokio::spawn(async move {
        let options = LockOptions::new().timeout(Duration::from_millis(500));
        waiter.acquire("quit", &options).await.map(|_| ())
    });
    eventually(
        Duration::from_secs(10),
        "the waiter to take its place in line",
        || !server.keys("*line*").is_empty(),
    )
    .await;
    let released = Instant::now();
    guard.release().await.unwrap();
    let value = server.get("lock:quit").expect("kept");
    assert!(
        value.starts_with(&format!("{token};hold=")),
        "the release saw a live waiter: {value}"
    );
    assert!(
        waiting.await.unwrap().is_err(),
        "the waiter gave up within the hold"
    );
    let took = loop {
        if let Some(guard) = newcomer
            .try_acquire("quit", &LockOptions::new())
            .await
            .unwrap()
        {
            break (guard, released.elapsed());
        }
        assert!(released.elapsed() < Duration::from_secs(20), "never free");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        took.1 >= Duration::from_millis(800),
        "free {:?} after the release, before the hold's end",
        took.1
    );
    assert!(
        took.1 < Duration::from_millis(900 + 600),
        "free {:?} after the release: the lock was kept a claim past the hold for nobody",
        took.1
    );
    took.0.release().await.unwrap();
}

/// A waiter leaving the line (its acquisition failed) takes its place out even when the lock key
/// holds another type than a string: the release script's look at the lock key must not fail
/// before the place is taken out, or it stays for a whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_leaving_while_the_lock_key_is_of_another_type_takes_its_place_out() {
    let server = RedisServer::start();
    let (holder, waiter) = (connect(&server).await, connect(&server).await);
    let _guard = holder
        .acquire("typed", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        let options = LockOptions::new().timeout(Duration::from_secs(20));
        waiter.acquire("typed", &options).await.map(|_| ())
    });
    eventually(
        Duration::from_secs(10),
        "the waiter to take its place in line",
        || !server.keys("*line*").is_empty(),
    )
    .await;
    let mut conn = server.conn();
    let () = redis::pipe()
        .cmd("DEL")
        .arg("lock:typed")
        .ignore()
        .cmd("RPUSH")
        .arg("lock:typed")
        .arg("not a lock")
        .ignore()
        .query(&mut conn)
        .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter's next look finds the key of another type")
        .unwrap();
    assert!(outcome.is_err(), "no lock in a list");
    let left = Instant::now();
    eventually(Duration::from_secs(10), "the place to be taken out", || {
        let length: i64 = redis::cmd("LLEN")
            .arg(keys::named("typed").line())
            .query(&mut server.conn())
            .unwrap_or(0);
        length == 0
    })
    .await;
    assert!(
        left.elapsed() < Duration::from_secs(1),
        "the place stayed {:?}: until the line expired, not taken out",
        left.elapsed()
    );
}

/// Fencing through a hold: the waiter in line when the hold began gets the lock at its end with
/// a token above the releaser's, and the releaser acquiring again during the hold (a new token)
/// queues behind that waiter — it does not jump the line at the hold's end — and gets a token
/// above both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_hands_over_with_rising_fences_and_the_releaser_queues_behind_the_line() {
    let server = RedisServer::start();
    let (holder, waiter) = (connect(&server).await, connect(&server).await);
    let fenced = options(30_000, 700).fencing(true);
    let guard = holder.acquire("fenced", &fenced).await.unwrap();
    let first = guard.fencing_token().unwrap();
    let waiting = tokio::spawn(async move {
        let options = LockOptions::new()
            .fencing(true)
            .timeout(Duration::from_secs(20));
        let guard = waiter.acquire("fenced", &options).await.unwrap();
        let (fence, at) = (guard.fencing_token().unwrap(), Instant::now());
        tokio::time::sleep(Duration::from_millis(300)).await;
        guard.release().await.unwrap();
        (fence, at)
    });
    eventually(
        Duration::from_secs(10),
        "the waiter to take its place in line",
        || !server.keys("*line*").is_empty(),
    )
    .await;
    let released = Instant::now();
    guard.release().await.unwrap();
    let again = LockOptions::new()
        .fencing(true)
        .timeout(Duration::from_secs(20));
    let guard = holder.acquire("fenced", &again).await.unwrap();
    let (again_fence, again_at) = (guard.fencing_token().unwrap(), Instant::now());
    let (waiter_fence, waiter_at) = waiting.await.unwrap();
    assert!(
        waiter_at < again_at,
        "the releaser's new acquisition jumped the line"
    );
    assert!(
        waiter_at.duration_since(released) >= Duration::from_millis(600),
        "handed over {:?} after the release, before the hold's end",
        waiter_at.duration_since(released)
    );
    assert!(
        first < waiter_fence && waiter_fence < again_fence,
        "fences {first}, {waiter_fence}, {again_fence}"
    );
    guard.release().await.unwrap();
}

/// A forced release during a hold breaks the hold: it compares the value it read (with its
/// `;hold=` end) and hands the lock to the waiter in line at once, not at the hold's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_during_the_hold_hands_the_lock_to_the_waiter_at_once() {
    let server = RedisServer::start();
    let (holder, waiter, operator) = (
        connect(&server).await,
        connect(&server).await,
        connect(&server).await,
    );
    let guard = holder
        .acquire("forced", &options(30_000, 5_000))
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        let options = LockOptions::new().timeout(Duration::from_secs(20));
        let guard = waiter.acquire("forced", &options).await.unwrap();
        let at = Instant::now();
        guard.release().await.unwrap();
        at
    });
    eventually(
        Duration::from_secs(10),
        "the waiter to take its place in line",
        || !server.keys("*line*").is_empty(),
    )
    .await;
    guard.release().await.unwrap();
    let info = operator.inspect("forced").await.unwrap().expect("kept");
    let left = info.ttl_left.expect("the hold's end");
    assert!(
        left <= Duration::from_secs(5) && left > Duration::from_secs(3),
        "inspect shows what is left of the hold: {left:?}"
    );
    assert_eq!(info.waiters, 1);
    let forced = Instant::now();
    assert!(operator.force_release(&info).await.unwrap(), "broke it");
    let got = waiting.await.unwrap();
    assert!(
        got.duration_since(forced) < Duration::from_secs(1),
        "the waiter got the lock {:?} after the forced release",
        got.duration_since(forced)
    );
}
