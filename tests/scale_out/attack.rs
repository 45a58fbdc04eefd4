//! Interleavings of the line protocol that break a documented promise (attack-1).

use std::time::{Duration, Instant};

use distlock::{LockManager, LockOptions};
use test_support::{wait_until, RedisServer};

use crate::fleet::line_key;

fn llen(server: &RedisServer, key: &str) -> usize {
    redis::cmd("LLEN")
        .arg(key)
        .query(&mut server.conn())
        .unwrap()
}

/// A stale hand-off message read *after* an attempt that found the lock held by someone else.
///
/// B's manager is made on a multi-thread runtime R1 (its pub/sub connection is read there); B
/// waits on a current-thread runtime R2 of its own. Both stall (a paused process, or bodies
/// blocking their threads), R1 a little longer than R2:
///
/// 1. A holds the lock; B waits in line (subscribed).
/// 2. R1 and R2 stop running. A releases: the lock is handed to B (its connection is open, so
///    the message counts as heard), for the 3 s claim.
/// 3. The claim runs out; C takes the lock.
/// 4. R2 runs again: B's renewal finds C holding the lock (`last_held_at` = now).
/// 5. R1 runs again: its pub/sub task reads the old hand-off message and puts it in B's mailbox
///    (after B cleared it for the attempt of step 4).
/// 6. B takes the message for a fresh hand-off (`now + 300 ms < last_held_at + claim`) and
///    returns a guard, while C holds the lock.
#[test]
fn a_hand_off_message_read_after_an_attempt_that_found_another_holder_yields_a_second_holder() {
    let server = RedisServer::start();
    let url = server.url();
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // R1: where B's manager is made, so where its grant channel is read.
    let r1 = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (a, c) = main.block_on(async {
        (
            LockManager::connect(&url).await.unwrap(),
            LockManager::connect(&url).await.unwrap(),
        )
    });
    let b = r1.block_on(async { LockManager::connect(&url).await.unwrap() });
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(30));
    let held = main.block_on(a.acquire("stale2", &options)).expect("free");

    let (freeze_tx, freeze_rx) = tokio::sync::oneshot::channel::<()>();
    let (result_tx, result_rx) = std::sync::mpsc::channel();
    let b_options = options.clone().timeout(Duration::from_secs(20));
    let b_waiter = b.clone();
    let b_thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let waiter = tokio::spawn(async move {
                let result = b_waiter.acquire("stale2", &b_options).await;
                let at = Instant::now();
                (result, at)
            });
            freeze_rx.await.unwrap();
            std::thread::sleep(Duration::from_millis(4500)); // R2 does not run
            let (result, at) = waiter.await.unwrap();
            let token = result.as_ref().ok().map(|g| g.token().to_owned());
            result_tx.send((result.is_ok(), token, at)).unwrap();
            tokio::time::sleep(Duration::from_secs(2)).await;
            drop(result);
        });
    });
    wait_until(Duration::from_secs(5), "b in line", || {
        llen(&server, &line_key("stale2")) >= 1
    });
    // R1 stops running for 5.5 s (its one worker blocked), R2 for 4.5 s.
    r1.spawn(async {
        std::thread::sleep(Duration::from_millis(5500));
    });
    freeze_tx.send(()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    main.block_on(held.release()).expect("still ours");
    assert_eq!(
        server.get("lock:stale2").as_deref().map(|v| v.len() > 0),
        Some(true),
        "handed to b"
    );
    let b_token_in_redis = server.get("lock:stale2").unwrap();
    // B's claim runs out (3 s); C takes the lock.
    let c_guard = main
        .block_on(c.acquire("stale2", &options))
        .expect("c gets the lock once b's claim ran out");
    let c_token = c_guard.token().to_owned();
    let c_at = Instant::now();
    let (b_ok, b_token, b_at) = result_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let holder = server.get("lock:stale2");
    assert!(
        !b_ok,
        "b's acquire returned a guard (token {b_token:?}, the token b was handed: \
         {b_token_in_redis}) {:?} after c (token {c_token}) took the lock; Redis says the \
         holder is {holder:?}",
        b_at.saturating_duration_since(c_at),
    );
    b_thread.join().unwrap();
    main.block_on(c_guard.release()).ok();
    drop(r1);
}

/// A live waiter whose grant channel's connection dropped is taken for dead and skipped.
///
/// B's manager is made on a multi-thread runtime R1 (its grant channel is read there); B waits
/// on a runtime R2 of its own. R1's one thread is busy (a body blocking it) when B's pub/sub
/// connection is dropped (`CLIENT KILL TYPE pubsub`: a proxy, a server-side timeout). Nothing
/// on R1 notices, so the manager still counts its channel as subscribed:
///
/// 1. A holds the lock; B waits in line, its place naming its channel.
/// 2. R1 blocks; B's pub/sub connection is killed. B's renewals (on R2) keep naming the channel,
///    which nobody is subscribed to any more.
/// 3. A releases: the hand-off to B is heard by nobody, so B is taken for a dead process and
///    dropped from the line, and the lock is freed with B still waiting; C's first try takes it.
///
/// docs/protocol.md: "A live process whose pub/sub connection is down ... would look the same,
/// so while it is down its waiters' places name no channel"; scripts.rs: "A waiter's place names
/// a channel only while its process is subscribed to it, so a live process is never unheard."
#[test]
fn a_live_waiter_whose_pub_sub_connection_dropped_is_skipped_as_dead() {
    let server = RedisServer::start();
    let url = server.url();
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let r1 = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (a, c) = main.block_on(async {
        (
            LockManager::connect(&url).await.unwrap(),
            LockManager::connect(&url).await.unwrap(),
        )
    });
    let b = r1.block_on(async { LockManager::connect(&url).await.unwrap() });
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let held = main.block_on(a.acquire("skipped", &options)).expect("free");

    let b_options = options.clone().timeout(Duration::from_secs(8));
    let b_thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let result = rt.block_on(b.acquire("skipped", &b_options));
        let ok = result.is_ok();
        drop(result);
        ok
    });
    let line = line_key("skipped");
    wait_until(Duration::from_secs(5), "b in line", || llen(&server, &line) >= 1);
    r1.spawn(async {
        std::thread::sleep(Duration::from_millis(4000));
    });
    std::thread::sleep(Duration::from_millis(100));
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(killed, 1, "b's pub/sub connection");
    // B renews (every second) after the kill.
    std::thread::sleep(Duration::from_millis(1300));
    let entries: Vec<String> = redis::cmd("LRANGE")
        .arg(&line)
        .arg(0)
        .arg(-1)
        .query(&mut server.conn())
        .unwrap();
    let channel = entries
        .first()
        .and_then(|entry| entry.split(' ').nth(4))
        .unwrap_or("")
        .to_owned();
    let subscribers: (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(&channel)
        .query(&mut server.conn())
        .unwrap();
    main.block_on(held.release()).expect("still ours");
    let holder = server.get("lock:skipped");
    let newcomer = main
        .block_on(c.try_acquire("skipped", &options))
        .unwrap();
    assert!(
        holder.is_some() && newcomer.is_none(),
        "b, alive and waiting, was skipped: its place {entries:?} names channel {channel:?} \
         ({} subscribers) after its pub/sub connection was killed; a's release left the lock \
         {holder:?}, and a newcomer's first try got it: {}",
        subscribers.1,
        newcomer.is_some(),
    );
    drop(newcomer);
    b_thread.join().unwrap();
    drop(r1);
}

/// A waiter that registers while its manager's idle grant channel is being unsubscribed (the
/// 0.3 s linger just ran out) is told the channel is subscribed, names it in its place, and is
/// skipped as dead by the next release.
///
/// B reaches Redis through a proxy that adds 400 ms each way (a slow link); A is direct.
///
/// 1. B's only waiter (on `k1`) is handed its lock and stops waiting: the channel lingers 0.3 s,
///    then B's pub/sub task sends `UNSUBSCRIBE` and waits for its reply (0.8 s), its state
///    still saying "subscribed".
/// 2. Meanwhile a new waiter of B on `k2` finds `k2` held, registers, asks `subscribed()`, is
///    answered at once, and joins naming the channel; its join lands after the `UNSUBSCRIBE`
///    and before the `SUBSCRIBE` that follows it.
/// 3. A releases `k2` in that window: nobody hears the hand-off, the live waiter is dropped
///    from the line and the lock is freed under it.
#[test]
fn a_waiter_that_registers_while_the_idle_channel_is_unsubscribed_is_skipped_as_dead() {
    let server = RedisServer::start();
    let proxy = test_support::FaultProxy::start(server.port());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (a, b) = rt.block_on(async {
        (
            LockManager::connect(&server.url()).await.unwrap(),
            LockManager::builder(proxy.url())
                .response_timeout(Duration::from_secs(3))
                .connect()
                .await
                .unwrap(),
        )
    });
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(20));
    let (k1, k2) = rt.block_on(async {
        (
            a.acquire("k1", &options).await.unwrap(),
            a.acquire("k2", &options).await.unwrap(),
        )
    });
    proxy.set_delay(Duration::from_millis(400));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let (b1, b2, options2) = (b.clone(), b.clone(), options.clone());
    let first = rt.spawn(async move {
        let guard = b1.acquire("k1", &options2).await.unwrap();
        // B's only waiter stopped waiting: the linger starts now. The next waiter comes at once.
        let second = tokio::spawn(async move { b2.acquire("k2", &options2).await });
        done_tx.send(()).unwrap();
        (guard, second)
    });
    wait_until(Duration::from_secs(10), "b's first waiter in line", || {
        llen(&server, &line_key("k1")) >= 1
    });
    rt.block_on(k1.release()).unwrap();
    done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let line = line_key("k2");
    wait_until(Duration::from_secs(10), "b's second waiter in line", || {
        llen(&server, &line) >= 1
    });
    let entries: Vec<String> = redis::cmd("LRANGE")
        .arg(&line)
        .arg(0)
        .arg(-1)
        .query(&mut server.conn())
        .unwrap();
    let channel = entries[0].split(' ').nth(4).unwrap_or("").to_owned();
    let (_, subscribers): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(&channel)
        .query(&mut server.conn())
        .unwrap();
    rt.block_on(k2.release()).unwrap();
    let holder = server.get("lock:k2");
    assert!(
        !channel.is_empty() && subscribers == 0,
        "the interleaving did not happen: the place {entries:?} names {channel:?} with \
         {subscribers} subscribers"
    );
    assert!(
        holder.is_some(),
        "b's second waiter, alive and waiting, was skipped: its place {entries:?} names \
         {channel:?}, which nobody was subscribed to when a released; the lock is now {holder:?}"
    );
    proxy.set_delay(Duration::ZERO);
    let (guard, second) = rt.block_on(first).unwrap();
    drop(guard);
    drop(rt.block_on(second));
}
