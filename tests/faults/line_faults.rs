//! Faults around the line: a waiter's grant connection, its data connection or its runtime
//! failing while the lock is handed over.
//!
//! Each test drives the interleaving by hand and checks what `docs/protocol.md` promises.

use std::time::{Duration, Instant};

use distlock::{LockManager, LockOptions};
use test_support::{keys, FaultProxy, RedisServer};

fn line(server: &RedisServer, name: &str) -> Vec<String> {
    redis::cmd("LRANGE")
        .arg(keys::named(name).line())
        .arg(0)
        .arg(-1)
        .query(&mut server.conn())
        .unwrap()
}

fn numsub(server: &RedisServer, channel: &str) -> u64 {
    let (_, count): (String, u64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query(&mut server.conn())
        .unwrap();
    count
}

/// The grant channel named by a line entry (`"<token> <deadline> <ttl> <fencing> <channel>"`).
fn channel_of(entry: &str) -> String {
    entry.splitn(5, ' ').nth(4).unwrap_or("").to_owned()
}

/// A live waiter, first in line, whose pub/sub connection is killed (`CLIENT KILL TYPE pubsub`:
/// a server's `client-output-buffer-limit`, an admin, a proxy restart) while its process is
/// busy for a moment (its runtime's one thread runs a blocking call for 0.5 s — well within a
/// lease, 3 s), and the holder releases in that moment, before the process can notice.
///
/// Nobody hears the hand-off, so the release takes the waiter for dead (`docs/protocol.md`,
/// "Dead waiters"): it loses its place, and the lock goes on (here, with nobody else in line,
/// it is freed). What must hold: the waiter looks again as soon as its process notices the
/// drop, and gets the lock then — not at its timeout — and never while another holds it.
#[test]
fn a_live_waiter_whose_grant_connection_drops_unnoticed_loses_only_its_place() {
    let server = RedisServer::start();
    let main = test_support::runtime(2);
    // The waiter's process: a runtime with one worker thread, which made its manager (so the
    // manager's pub/sub connection is read there).
    let waiter_runtime = test_support::runtime(1);
    let url = server.url();
    let waiter_manager = waiter_runtime
        .block_on(async move { LockManager::connect(&url).await })
        .unwrap();
    let name = "line-faults:grant-connection";
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(20));
    main.block_on(async {
        let holder = test_support::connect(&server).await;
        let newcomer = test_support::connect(&server).await;
        let guard = holder.acquire(name, &options).await.unwrap();

        let waiting = {
            let (manager, options) = (waiter_manager.clone(), options.clone());
            waiter_runtime.spawn(async move {
                let guard = manager.acquire(name, &options).await;
                (guard.map(|guard| guard.token().to_owned()), Instant::now())
            })
        };
        test_support::eventually(Duration::from_secs(5), "the waiter's place", || {
            line(&server, name).len() == 1
        })
        .await;
        let entry = line(&server, name).remove(0);
        let channel = channel_of(&entry);
        assert!(
            !channel.is_empty(),
            "the place names the grant channel: {entry}"
        );
        assert_eq!(numsub(&server, &channel), 1);

        // The waiter's process is busy for 0.5 s (a blocking call on its runtime's thread).
        let (busy_tx, busy_rx) = std::sync::mpsc::channel();
        drop(waiter_runtime.spawn(async move {
            busy_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(500));
        }));
        busy_rx.recv().unwrap();

        // Its grant connection is dropped, and the holder releases.
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query(&mut server.conn())
            .unwrap();
        assert_eq!(killed, 1, "the waiter's pub/sub connection");
        guard.release().await.unwrap();
        let after_release = Instant::now();

        // A newcomer may take the freed lock meanwhile; the waiter gets it after that one.
        let newcomer_guard = newcomer.try_acquire(name, &options).await.unwrap();
        let newcomer_released = Instant::now();
        if let Some(newcomer_guard) = newcomer_guard {
            newcomer_guard.release().await.unwrap();
        }
        let (waiter_token, got_at) = waiting.await.unwrap();
        let waiter_token = waiter_token.expect("the waiter gets the lock");
        assert!(
            got_at > newcomer_released,
            "never while the newcomer held it"
        );
        // Busy 0.5 s, then it sees the connection gone and looks again at once.
        let took = got_at.duration_since(after_release);
        assert!(
            took < Duration::from_millis(1500),
            "the waiter {waiter_token} got the lock {took:?} after the release, not as soon as \
             it noticed its dropped connection"
        );
    });
    drop(waiter_manager);
    waiter_runtime.shutdown_timeout(Duration::from_secs(1));
}

/// A waiter that joins while its manager's grant channel is being unsubscribed after the
/// linger (0.3 s after its last waiter left), on a link with 100 ms of latency each way (the
/// slow network of `tests/faults/network.rs` has 50 ms): its place must not name a channel that
/// the `UNSUBSCRIBE` in flight leaves, or a release would count no receiver, take the live
/// waiter for dead, drop it from the line and free the lock under it (`docs/protocol.md`: "The
/// lock is never free while someone waits").
///
/// Interleaving: H holds k; W (behind the proxy) and then H2 wait in line; H releases, W is
/// handed k at tA (its hub idle from then); W releases k at once, handing it to H2 (so W's next
/// acquisition of k skips the first try); at tA + 0.3 s W's hub sends `UNSUBSCRIBE`; at tA +
/// 0.35 s W asks for k again; once it is in line, H2 releases.
#[test]
fn a_waiter_joining_during_the_linger_unsubscribe_is_not_skipped() {
    const DELAY: Duration = Duration::from_millis(100);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    proxy.set_delay(DELAY);
    let main = test_support::runtime(2);
    let name = "line-faults:linger";
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(20));
    main.block_on(async {
        let holder = test_support::connect(&server).await;
        let second = test_support::connect(&server).await;
        let newcomer = test_support::connect(&server).await;
        let waiter = LockManager::connect(&proxy.url()).await.unwrap();
        let guard = holder.acquire(name, &options).await.unwrap();
        let first_wait = {
            let (waiter, options) = (waiter.clone(), options.clone());
            tokio::spawn(async move { waiter.acquire(name, &options).await.unwrap() })
        };
        test_support::eventually(Duration::from_secs(5), "W in line", || {
            line(&server, name).len() == 1
        })
        .await;
        let second_wait = {
            let (second, options) = (second.clone(), options.clone());
            tokio::spawn(async move { second.acquire(name, &options).await.unwrap() })
        };
        test_support::eventually(Duration::from_secs(5), "H2 in line", || {
            line(&server, name).len() == 2
        })
        .await;
        guard.release().await.unwrap();
        let w_guard = first_wait.await.unwrap();
        let t_a = tokio::time::Instant::now();
        // W hands k on to H2.
        w_guard.release().await.unwrap();
        let h2_guard = second_wait.await.unwrap();
        // W asks again while its hub's UNSUBSCRIBE (sent at tA + 0.3 s) is on its way.
        tokio::time::sleep_until(t_a + Duration::from_millis(300) + DELAY / 2).await;
        let again = {
            let (waiter, options) = (waiter.clone(), options.clone());
            tokio::spawn(async move {
                let guard = waiter.acquire(name, &options).await.unwrap();
                let token = guard.token().to_owned();
                guard.release().await.unwrap();
                token
            })
        };
        let mut seen = None;
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Some(entry) = line(&server, name).first() {
                let channel = channel_of(entry);
                seen = Some((entry.clone(), numsub(&server, &channel)));
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let (entry, listeners) = seen.expect("W's place in line");
        h2_guard.release().await.unwrap();
        let holder_now = server.get(&format!("lock:{name}"));
        let line_now = line(&server, name);
        let stolen = newcomer.try_acquire(name, &options).await.unwrap();
        let stolen_by_newcomer = stolen.is_some();
        if let Some(stolen) = stolen {
            stolen.release().await.unwrap();
        }
        let w_token = again.await.unwrap();
        assert!(
            holder_now.as_deref() == Some(w_token.as_str()) && !stolen_by_newcomer,
            "H2's release skipped W, alive and first in line: W's place {entry:?} named a \
             channel with {listeners} subscribers when H2 released; right after the release \
             the lock key held {holder_now:?} (W: {w_token}), the line was {line_now:?}, a \
             newcomer's try_acquire got the lock: {stolen_by_newcomer}"
        );
    });
}

/// A holder whose connection to Redis was cut during its section (a network blip: the proxy
/// closes it; the path works again at once), then releases 1 s later, with a waiter in line (ttl 10 s).
///
/// `docs/reliability.md`: "Clients reconnect by themselves after Redis restarts or network
/// cuts"; "A lock is released on every exit path of a locked function"; "Nothing is left held
/// by nobody". So the release, sent well after the cut, must reach Redis and hand the lock to
/// the waiter.
#[test]
fn a_release_after_a_network_blip_hands_the_lock_on() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let main = test_support::runtime(2);
    let name = "line-faults:blip";
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .timeout(Duration::from_secs(20));
    main.block_on(async {
        let holder = LockManager::connect(&proxy.url()).await.unwrap();
        let waiter = test_support::connect(&server).await;
        let guard = holder.acquire(name, &options).await.unwrap();
        let waiting = {
            let (waiter, options) = (waiter.clone(), options.clone());
            tokio::spawn(async move {
                let guard = waiter.acquire(name, &options).await.unwrap();
                let at = Instant::now();
                guard.release().await.unwrap();
                at
            })
        };
        test_support::eventually(Duration::from_secs(5), "the waiter in line", || {
            line(&server, name).len() == 1
        })
        .await;
        proxy.cut();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let released_at = Instant::now();
        let released = guard.release().await;
        let left = server.pttl(&format!("lock:{name}"));
        let got_at = tokio::time::timeout(Duration::from_secs(15), waiting)
            .await
            .expect("the waiter got the lock")
            .unwrap();
        let waited = got_at.saturating_duration_since(released_at);
        assert!(
            released.is_ok() && waited < Duration::from_secs(2),
            "the release 1 s after a network blip answered {released:?}; the lock's ttl \
             left in Redis right after: {left} ms; the waiter got it {waited:?} after the \
             release"
        );
    });
}

/// A waiter first in line whose connections are cut by a network blip (the path works again
/// at once), a second waiter behind it, then the holder releases 0.5 s later.
///
/// `docs/protocol.md`: "waiters are served first come, first served across the whole fleet";
/// a waiter keeps its place for its 3 s lease, and one whose pub/sub connection drops
/// rewrites its place at once. The blip wakes the waiter to look again, and that look meets
/// the dead data connection first: it is asked once more on the connection made anew, as a
/// renewal, so the first waiter, alive and reconnected within milliseconds, is still served
/// first.
#[test]
fn a_network_blip_does_not_send_a_waiter_to_the_back_of_the_line() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let main = test_support::runtime(2);
    let name = "line-faults:blip-in-line";
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(20));
    main.block_on(async {
        let holder = test_support::connect(&server).await;
        let first = LockManager::connect(&proxy.url()).await.unwrap();
        let second = test_support::connect(&server).await;
        let guard = holder.acquire(name, &options).await.unwrap();
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let wait = |manager: LockManager, who: &'static str| {
            let (options, order) = (options.clone(), std::sync::Arc::clone(&order));
            tokio::spawn(async move {
                let guard = manager.acquire(name, &options).await.unwrap();
                order.lock().unwrap().push(who);
                tokio::time::sleep(Duration::from_millis(50)).await;
                guard.release().await.unwrap();
            })
        };
        let first_wait = wait(first, "first");
        test_support::eventually(Duration::from_secs(5), "the first waiter", || {
            line(&server, name).len() == 1
        })
        .await;
        let second_wait = wait(second, "second");
        test_support::eventually(Duration::from_secs(5), "the second waiter", || {
            line(&server, name).len() == 2
        })
        .await;
        let before = line(&server, name);
        proxy.cut();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after_blip = line(&server, name);
        guard.release().await.unwrap();
        first_wait.await.unwrap();
        second_wait.await.unwrap();
        let order = order.lock().unwrap().clone();
        assert_eq!(
            order,
            vec!["first", "second"],
            "a 0-second network blip sent the first waiter to the back of the line: line \
             before the blip {before:?}, 0.5 s after it {after_blip:?}"
        );
    });
}

/// The same without any network fault: a server with an idle-client `timeout` (here 1 s;
/// `timeout 300` is a common setting) closes the holder's connection while its section runs
/// (2.5 s, ttl 10 s, a waiter in line). The release, the first request to see the connection
/// gone, must still reach Redis, not leave the waiter to wait out the holder's ttl.
#[test]
fn a_release_after_the_server_closed_an_idle_connection_hands_the_lock_on() {
    let server = RedisServer::start_with(&["--timeout", "1"]);
    let main = test_support::runtime(2);
    let name = "line-faults:idle-timeout";
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .timeout(Duration::from_secs(20));
    main.block_on(async {
        let holder = test_support::connect(&server).await;
        let waiter = test_support::connect(&server).await;
        let guard = holder.acquire(name, &options).await.unwrap();
        let waiting = {
            let (waiter, options) = (waiter.clone(), options.clone());
            tokio::spawn(async move {
                let guard = waiter.acquire(name, &options).await.unwrap();
                let at = Instant::now();
                guard.release().await.unwrap();
                at
            })
        };
        // The section: 2.5 s with no Redis call of the holder's.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let released_at = Instant::now();
        let released = guard.release().await;
        let left = server.pttl(&format!("lock:{name}"));
        let got_at = tokio::time::timeout(Duration::from_secs(15), waiting)
            .await
            .expect("the waiter got the lock")
            .unwrap();
        let waited = got_at.saturating_duration_since(released_at);
        assert!(
            released.is_ok() && waited < Duration::from_secs(2),
            "the release after a 2.5 s section (server `timeout 1`) answered {released:?}; \
             the lock's ttl left in Redis right after: {left} ms; the waiter got it {waited:?} \
             after the release"
        );
    });
}

/// The same seen from `try_acquire`: after the server closed the manager's idle connection
/// (`timeout 1`), the next `try_acquire` of a free lock must take it, not fail with `broken
/// pipe` (`docs/reliability.md`: "Clients reconnect by themselves").
#[test]
fn a_try_acquire_after_the_server_closed_an_idle_connection_takes_the_free_lock() {
    let server = RedisServer::start_with(&["--timeout", "1"]);
    let main = test_support::runtime(2);
    main.block_on(async {
        let manager = test_support::connect(&server).await;
        let options = LockOptions::new().ttl(Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let attempt = manager.try_acquire("line-faults:idle-try", &options).await;
        assert!(
            matches!(attempt, Ok(Some(_))),
            "try_acquire of a free lock after 2.5 s idle (server `timeout 1`): {attempt:?}"
        );
    });
}

/// A hand-off message read late must not be taken for a fresh grant: two holders at once.
///
/// The waiter W uses a manager made on another runtime (`docs`: a manager is "usable from any
/// tokio runtime"; its pub/sub connection "is read on the multi-thread tokio runtime the
/// manager was made on"). Both runtimes are busy for a while (a blocking call on their one
/// thread): W's for 3.6 s, the manager's for 4.5 s. Meanwhile:
///
/// 1. H releases; the hand-off goes to W (its pub/sub connection is open, so the message counts
///    as received; it sits unread in the socket).
/// 2. W's claim (3 s) runs out unconfirmed; the next waiter N takes the lock at its look (as
///    documented: a handed-over lock that is not confirmed comes back after the claim).
/// 3. W's runtime runs again: its renewal finds the lock held by N, and W sleeps in line.
/// 4. The manager's runtime runs again: the delivery task reads the old message and puts it in
///    W's mailbox. Read after a look that found the lock held, it may predate that look: W
///    must ask Redis, not return a guard while N holds the lock.
///
/// `docs/reliability.md`: "at most one holder per key at a time — provided each holder finishes
/// ... within its ttl". Here neither holder overran anything: W was not a holder when it was
/// paused.
#[test]
fn a_hand_off_message_read_late_never_yields_a_second_holder() {
    let server = RedisServer::start();
    let main = test_support::runtime(2);
    let one_thread = || test_support::runtime(1);
    // The runtime that made W's manager (reads its hand-off messages), and W's own runtime.
    let (manager_runtime, waiter_runtime) = (one_thread(), one_thread());
    let url = server.url();
    let waiter_manager = manager_runtime
        .block_on(async move { LockManager::connect(&url).await })
        .unwrap();
    let name = "line-faults:late-message";
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(30));
    let busy = |runtime: &tokio::runtime::Runtime, how_long: Duration| {
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        drop(runtime.spawn(async move {
            started_tx.send(()).unwrap();
            std::thread::sleep(how_long);
        }));
        started_rx.recv().unwrap();
    };
    main.block_on(async {
        let holder = test_support::connect(&server).await;
        let next = test_support::connect(&server).await;
        let guard = holder.acquire(name, &options).await.unwrap();
        // When W's acquire returned a guard (it releases it at once).
        let (w_acquired, mut w_acquired_at) = tokio::sync::oneshot::channel();
        let w_wait = {
            let (manager, options) = (waiter_manager.clone(), options.clone());
            waiter_runtime.spawn(async move {
                let guard = manager.acquire(name, &options).await.unwrap();
                let _ = w_acquired.send(Instant::now());
                drop(guard);
            })
        };
        test_support::eventually(Duration::from_secs(5), "W in line", || {
            line(&server, name).len() == 1
        })
        .await;
        let n_wait = {
            let (next, options) = (next.clone(), options.clone());
            tokio::spawn(async move {
                let guard = next.acquire(name, &options).await.unwrap();
                (guard, Instant::now())
            })
        };
        test_support::eventually(Duration::from_secs(5), "N in line", || {
            line(&server, name).len() == 2
        })
        .await;

        busy(&manager_runtime, Duration::from_millis(4500));
        busy(&waiter_runtime, Duration::from_millis(3600));
        guard.release().await.unwrap();

        let released_at = Instant::now();
        let (n_guard, _) = n_wait.await.unwrap();
        // Both runtimes run again 4.5 s after the release at the latest: W's renewal has found
        // N holding the lock, and the old message has been read, well within another second.
        tokio::time::sleep_until((released_at + Duration::from_millis(5500)).into()).await;
        let key_now = server.get(&format!("lock:{name}"));
        let n_token = n_guard.token().to_owned();
        let w_early = w_acquired_at.try_recv().ok();
        assert!(
            w_early.is_none(),
            "two holders: while N holds the lock (lock key {key_now:?} = N {n_token}), W's \
             acquire returned a guard, {:?} after the release",
            w_early.map(|at| at - released_at)
        );
        let n_released_at = Instant::now();
        n_guard.release().await.unwrap();
        let w_at = tokio::time::timeout(Duration::from_secs(10), w_acquired_at)
            .await
            .expect("W gets the lock once N releases it")
            .unwrap();
        assert!(w_at > n_released_at, "W acquired after N's release");
        w_wait.await.unwrap();
    });
    drop(waiter_manager);
    waiter_runtime.shutdown_timeout(Duration::from_secs(1));
    manager_runtime.shutdown_timeout(Duration::from_secs(1));
}

const STOP_URL: &str = "DISTLOCK_LINE_FAULTS_URL";
const STOP_NAME: &str = "DISTLOCK_LINE_FAULTS_NAME";

/// Worker for the test below: a service's usual runtime (`#[tokio::main]`: multi-thread, the
/// manager made on it); acquires `lock:<name>` and records `"<its token>|<the lock key's value
/// right then>"` in `<name>:record`, then holds it 1 s and releases.
pub(crate) fn stopped_waiter_worker() {
    let url = std::env::var(STOP_URL).expect("set by the test that starts this worker");
    let name = std::env::var(STOP_NAME).unwrap();
    test_support::runtime(2).block_on(async {
        let manager = LockManager::connect(&url).await.unwrap();
        let options = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .timeout(Duration::from_secs(60));
        let guard = manager.acquire(&name, &options).await.unwrap();
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        let value: Option<String> = redis::cmd("GET")
            .arg(format!("lock:{name}"))
            .query_async(&mut connection)
            .await
            .unwrap();
        let _: i64 = redis::cmd("RPUSH")
            .arg(format!("{name}:record"))
            .arg(format!("{}|{}", guard.token(), value.unwrap_or_default()))
            .query_async(&mut connection)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let _ = guard.release().await;
    });
}

/// A `SIGSTOP`ped waiter: W (a process of its own) waits first in
/// line, is stopped, the holder releases (W is handed the lock: its connection is open, the
/// message counts as received), W's claim runs out and the next waiter N takes the lock (as
/// documented). W is continued 1 s later. W must not believe it holds the lock N holds: its
/// `acquire` must not return while N holds it. Tried up to 6 times (the order in which W's two
/// tasks run after `SIGCONT` — its renewal timer, and the reading of the old message — varies).
#[test]
fn a_stopped_waiter_continued_after_its_claim_never_holds_with_the_next() {
    let server = RedisServer::start();
    let runtime = test_support::runtime(2);
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(30));
    let mut doubles = Vec::new();
    for trial in 0..6 {
        let name = format!("line-faults:stopped-{trial}");
        let (holder, next) = runtime.block_on(async {
            (
                test_support::connect(&server).await,
                test_support::connect(&server).await,
            )
        });
        let guard = runtime.block_on(holder.acquire(&name, &options)).unwrap();
        let mut worker = test_support::spawn_worker(
            "line_faults::stopped_waiter_worker",
            &[(STOP_URL, server.url()), (STOP_NAME, name.clone())],
        );
        test_support::wait_until(Duration::from_secs(20), "W in line", || {
            line(&server, &name).len() == 1
        });
        let n_wait = {
            let (next, options, name) = (next.clone(), options.clone(), name.clone());
            runtime.spawn(async move { next.acquire(&name, &options).await.unwrap() })
        };
        test_support::wait_until(Duration::from_secs(5), "N in line", || {
            line(&server, &name).len() == 2
        });
        test_support::send_signal(worker.id(), "STOP");
        runtime.block_on(guard.release()).unwrap();
        let n_guard = runtime.block_on(n_wait).unwrap();
        std::thread::sleep(Duration::from_secs(1));
        test_support::send_signal(worker.id(), "CONT");
        // N holds the lock for 3 s more: W must not record a hold meanwhile.
        std::thread::sleep(Duration::from_secs(3));
        let records: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("{name}:record"))
            .arg(0)
            .arg(-1)
            .query(&mut server.conn())
            .unwrap();
        runtime.block_on(n_guard.release()).unwrap();
        for record in &records {
            let (token, value) = record.split_once('|').unwrap();
            if token != value {
                doubles.push(format!(
                    "trial {trial}: W {token} held while the key held {value}"
                ));
            }
        }
        let _ = worker.wait();
        if !doubles.is_empty() {
            break;
        }
    }
    assert!(doubles.is_empty(), "two holders: {doubles:#?}");
}

/// A waiter handed the lock that dies before it confirms its full ttl (its process is gone,
/// here one that never was: a place written by hand, with no channel, so the hand-off is
/// taken as heard): the lock expires at the end of the claim, and so must the record of when
/// that waiter got it. Nothing of a lock but its fencing counter outlives it.
#[test]
fn the_since_record_of_an_unconfirmed_hand_off_expires_with_the_lock() {
    let server = RedisServer::start();
    let runtime = test_support::runtime(2);
    let name = "line-faults:since-claim";
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let manager = runtime.block_on(test_support::connect(&server));
    let guard = runtime.block_on(manager.acquire(name, &options)).unwrap();
    let waiter = "00000000-0000-4000-8000-000000000000;h=gone;p=1;t=0";
    let _: i64 = redis::cmd("RPUSH")
        .arg(keys::named(name).line())
        .arg(format!("{waiter} 99999999999999 30000 0 "))
        .query(&mut server.conn())
        .unwrap();
    runtime.block_on(guard.release()).unwrap();
    let held: Option<String> = redis::cmd("GET")
        .arg(format!("lock:{name}"))
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(held.as_deref(), Some(waiter), "handed to the waiter");
    assert_since_expires_with_lock(&server, name);
}

/// The record of when `name`'s holder got it expires no later than the lock key itself.
fn assert_since_expires_with_lock(server: &RedisServer, name: &str) -> i64 {
    let mut conn = server.conn();
    let lock_left: i64 = redis::cmd("PTTL")
        .arg(format!("lock:{name}"))
        .query(&mut conn)
        .unwrap();
    let since_left: i64 = redis::cmd("PTTL")
        .arg(keys::named(name).since())
        .query(&mut conn)
        .unwrap();
    assert!(
        since_left <= lock_left,
        "the since record ({since_left} ms left) outlives the lock ({lock_left} ms left)"
    );
    lock_left
}

/// A holder that waited (so its grant is recorded) released within its `hold_at_least`: the
/// lock is left to expire when the hold ends, and the record of when it got the lock must not
/// outlive it (nothing of a lock but its fencing counter does).
#[test]
fn the_since_record_of_a_held_release_expires_with_the_lock() {
    let server = RedisServer::start();
    let runtime = test_support::runtime(2);
    let name = "line-faults:since-hold";
    let (first, second) = runtime.block_on(async {
        (
            test_support::connect(&server).await,
            test_support::connect(&server).await,
        )
    });
    let held = runtime
        .block_on(first.acquire(name, &LockOptions::new()))
        .unwrap();
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .hold_at_least(Duration::from_secs(4));
    let waiting = {
        let (second, options) = (second.clone(), options.clone());
        runtime.spawn(async move { second.acquire(name, &options).await.unwrap() })
    };
    test_support::wait_until(Duration::from_secs(5), "a waiter in line", || {
        line(&server, name).len() == 1
    });
    runtime.block_on(held.release()).unwrap();
    let guard = runtime.block_on(waiting).unwrap();
    // Its full ttl confirmed (a third into the claim), then released within the hold.
    runtime
        .block_on(guard.extend(Duration::from_secs(30)))
        .unwrap();
    runtime.block_on(guard.release()).unwrap();
    let lock_left = assert_since_expires_with_lock(&server, name);
    assert!(lock_left > 0, "kept until the hold ends");
}

/// An operator force-releases a holder that waited (its grant is recorded) with nobody in
/// line: the lock is deleted, and the record of when that holder got it with it.
#[test]
fn a_force_release_takes_the_since_record_with_the_lock() {
    let server = RedisServer::start();
    let runtime = test_support::runtime(2);
    let name = "line-faults:since-forced";
    let (first, second) = runtime.block_on(async {
        (
            test_support::connect(&server).await,
            test_support::connect(&server).await,
        )
    });
    let held = runtime
        .block_on(first.acquire(name, &LockOptions::new()))
        .unwrap();
    let waiting = {
        let second = second.clone();
        runtime.spawn(async move { second.acquire(name, &LockOptions::new()).await.unwrap() })
    };
    test_support::wait_until(Duration::from_secs(5), "a waiter in line", || {
        line(&server, name).len() == 1
    });
    runtime.block_on(held.release()).unwrap();
    let guard = runtime.block_on(waiting).unwrap();
    let since_key = keys::named(name).since();
    assert!(
        server.exists(&since_key),
        "the grant of a holder that waited is recorded"
    );
    let info = runtime
        .block_on(first.inspect(name))
        .unwrap()
        .expect("held");
    assert!(runtime.block_on(first.force_release(&info)).unwrap());
    assert!(!server.exists(&format!("lock:{name}")), "force-released");
    assert!(
        !server.exists(&since_key),
        "the since record outlives the force-released lock"
    );
    drop(guard);
}
