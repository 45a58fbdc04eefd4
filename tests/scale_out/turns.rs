//! Processes taking turns on one lock: a process that asks again for a lock it has just handed
//! over joins the line with one `RPUSHX` instead of the acquire script (see the README's
//! "Waiting, wake-ups and fairness"), and still goes to the back of the line.
//!
//! Managers stand for processes: each has its own hand-off channel, and Redis cannot tell them
//! from processes of their own.

use std::collections::BTreeMap;
use std::time::Duration;

use distlock::{LockGuard, LockManager, LockOptions};
use test_support::{connect, eventually, keys, RedisServer};

use super::fleet::line_entries;
use tokio::task::JoinHandle;

type Waiting = JoinHandle<Result<LockGuard, distlock::LockError>>;

/// Appends to the line of `lock:<name>` the place of a waiter that is no distlock process:
/// `token`, its grant channel `channel`, its lease run out `lapsed_ms` ago by Redis's clock.
fn push_lapsed_place(server: &RedisServer, name: &str, token: &str, channel: &str, lapsed_ms: u64) {
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query(&mut server.conn()).unwrap();
    let deadline = seconds * 1000 + micros / 1000 - lapsed_ms;
    let _: i64 = redis::cmd("RPUSH")
        .arg(keys::named(name).line())
        .arg(format!("{token} {deadline} 30000 0 {channel}"))
        .query(&mut server.conn())
        .unwrap();
}

fn wait_in_line(manager: &LockManager, name: &str, options: &LockOptions) -> Waiting {
    let (manager, name, options) = (manager.clone(), name.to_owned(), options.clone());
    tokio::spawn(async move { manager.acquire(&name, &options).await })
}

/// Waits until the line of `lock:<name>` is `length` long.
async fn until_line_is(server: &RedisServer, name: &str, length: usize) {
    until_line_is_on(&mut server.conn(), name, length).await;
}

/// [`until_line_is`] on `connection`, asking with `LLEN`, a command distlock never sends (so
/// that [`commands`] can leave the test's own out; a connection opened before the counts are
/// reset adds nothing else, whereas opening one sends its handshake).
async fn until_line_is_on(connection: &mut redis::Connection, name: &str, length: usize) {
    eventually(
        Duration::from_secs(5),
        &format!("the line of {name} to be {length} long"),
        || {
            let found: usize = redis::cmd("LLEN")
                .arg(keys::named(name).line())
                .query(connection)
                .unwrap();
            found == length
        },
    )
    .await;
}

/// The token of the waiter whose entry is `entry` (`"<token> <deadline> ..."`).
fn token_of(entry: &str) -> &str {
    entry.split(' ').next().unwrap()
}

/// Every command Redis ran since the counts were reset, scripts' inner commands included, asked
/// on `probe` (opened before the reset, so its handshake is not counted), without the test's own:
/// `INFO` and `LLEN` on `probe`, and the reset.
fn commands(probe: &mut redis::Connection) -> BTreeMap<String, u64> {
    let mut counts = RedisServer::command_counts_on(probe);
    counts.retain(|name, _| name != "info" && name != "llen" && !name.starts_with("config"));
    counts
}

#[tokio::test]
async fn a_process_that_asks_again_joins_the_line_with_one_command() {
    let server = RedisServer::start();
    let [ann, bob, cat, dan, eve] = [
        connect(&server).await,
        connect(&server).await,
        connect(&server).await,
        connect(&server).await,
        connect(&server).await,
    ];
    let options = LockOptions::new();
    // `bob` holds; `cat`, `ann`, `dan` and `eve` queue behind it in that order (`ann` behind another
    // waiter, as in a line that stays long).
    let bob_holds = bob.acquire("turns", &options).await.expect("free");
    let mut waiting = Vec::new();
    for (length, manager) in [&cat, &ann, &dan, &eve].into_iter().enumerate() {
        waiting.push(wait_in_line(manager, "turns", &options));
        until_line_is(&server, "turns", length + 1).await;
    }
    let [cat_waiting, ann_waiting, dan_waiting, eve_waiting]: [Waiting; 4] =
        waiting.try_into().expect("four waiters");
    bob_holds.release().await.expect("ours");
    let cat_holds = cat_waiting.await.unwrap().expect("handed over");
    cat_holds.release().await.expect("ours");
    let ann_holds = ann_waiting.await.unwrap().expect("handed over");
    let dan_entry = line_entries(&server, "turns").remove(0);

    // `ann` releases (to `dan`) and asks again at once, as a process taking turns does.
    let mut probe = server.conn();
    server.reset_stats();
    ann_holds.release().await.expect("ours");
    let ann_waiting = wait_in_line(&ann, "turns", &options);
    until_line_is_on(&mut probe, "turns", 2).await;
    let counts = commands(&mut probe);
    let dan_holds = dan_waiting.await.unwrap().expect("handed over");
    assert_eq!(dan_holds.token(), token_of(&dan_entry));
    let expected: BTreeMap<String, u64> = [
        // The release with its hand-off: one script, which sets the lock to `dan`'s token and
        // records when `dan` got it (its `since` record: its value was made before it waited).
        ("evalsha", 1),
        ("get", 1),
        ("lpop", 1),
        ("set", 2),
        ("publish", 1),
        // `ann` asking again: behind `eve`, with the lease deadline its place got a moment ago.
        ("rpushx", 1),
    ]
    .into_iter()
    .map(|(name, calls)| (name.to_owned(), calls))
    .collect();
    assert_eq!(counts, expected, "one release and one join");
    let entries = line_entries(&server, "turns");
    dan_holds.release().await.expect("ours");
    let eve_holds = eve_waiting.await.unwrap().expect("handed over");
    assert_eq!(eve_holds.token(), token_of(&entries[0]));
    eve_holds.release().await.expect("ours");
    let ann_holds = ann_waiting
        .await
        .unwrap()
        .expect("handed over in its place");
    assert_eq!(
        ann_holds.token(),
        token_of(&entries[1]),
        "ann went to the back"
    );
    ann_holds.release().await.expect("ours");
    assert!(!server.exists("lock:turns"));
    assert!(line_entries(&server, "turns").is_empty());
}

/// Two processes taking turns: the one handed the lock was the whole line, so the line is
/// empty when the other asks again. Its last place was first in line, which tells it so: it
/// joins with the acquire script at once, without a one-command join that would find no line.
#[tokio::test]
async fn two_processes_taking_turns_join_with_the_script_and_no_wasted_command() {
    let server = RedisServer::start();
    let [a, b] = [connect(&server).await, connect(&server).await];
    let options = LockOptions::new();
    let b_holds = b.acquire("pair", &options).await.expect("free");
    let a_waiting = wait_in_line(&a, "pair", &options);
    until_line_is(&server, "pair", 1).await;
    b_holds.release().await.expect("ours");
    let a_holds = a_waiting.await.unwrap().expect("handed over");
    let b_waiting = wait_in_line(&b, "pair", &options);
    until_line_is(&server, "pair", 1).await;

    let mut probe = server.conn();
    server.reset_stats();
    a_holds.release().await.expect("ours");
    let b_holds = b_waiting.await.unwrap().expect("handed over");
    let a_waiting = wait_in_line(&a, "pair", &options);
    until_line_is_on(&mut probe, "pair", 1).await;
    let counts = commands(&mut probe);
    assert_eq!(counts.get("rpushx"), None, "{counts:?}");
    assert_eq!(
        counts.get("evalsha"),
        Some(&2),
        "release and join: {counts:?}"
    );
    b_holds.release().await.expect("ours");
    a_waiting
        .await
        .unwrap()
        .expect("handed over")
        .release()
        .await
        .expect("ours");
    assert!(line_entries(&server, "pair").is_empty());
}

/// A process whose last place was behind another waiter joins again when the line has emptied
/// meanwhile: its `RPUSHX` finds no line and writes nothing (an entry in no line would never be
/// served), and the acquire script takes the place instead — first in line, told the holder's
/// ttl — so the next release hands the lock over at once.
#[tokio::test]
async fn a_one_command_join_that_finds_no_line_falls_back_to_the_script() {
    let server = RedisServer::start();
    let [a, b, c, d] = [
        connect(&server).await,
        connect(&server).await,
        connect(&server).await,
        connect(&server).await,
    ];
    let options = LockOptions::new();
    // `a` waits behind `c`: its place is behind another waiter.
    let b_holds = b.acquire("emptied", &options).await.expect("free");
    let c_waiting = wait_in_line(&c, "emptied", &options);
    until_line_is(&server, "emptied", 1).await;
    let a_waiting = wait_in_line(&a, "emptied", &options);
    until_line_is(&server, "emptied", 2).await;
    b_holds.release().await.expect("ours");
    c_waiting
        .await
        .unwrap()
        .expect("handed over")
        .release()
        .await
        .expect("ours");
    let a_holds = a_waiting.await.unwrap().expect("handed over");
    a_holds.release().await.expect("ours: freed, nobody waits");
    let d_holds = d.acquire("emptied", &options).await.expect("free");

    let mut probe = server.conn();
    server.reset_stats();
    let a_waiting = wait_in_line(&a, "emptied", &options);
    until_line_is_on(&mut probe, "emptied", 1).await;
    let counts = commands(&mut probe);
    assert_eq!(counts.get("rpushx"), Some(&1), "{counts:?}");
    assert_eq!(
        counts.get("rpush"),
        Some(&1),
        "the script's join: {counts:?}"
    );
    let released = tokio::time::Instant::now();
    d_holds.release().await.expect("ours");
    let a_holds = a_waiting
        .await
        .unwrap()
        .expect("handed over at the release");
    // Handed over by the release (a place in no line would be found at the renewal, a second
    // after the join).
    assert!(
        released.elapsed() < Duration::from_millis(500),
        "a got the lock {:?} after the release",
        released.elapsed()
    );
    assert_eq!(server.get("lock:emptied").as_deref(), Some(a_holds.token()));
    a_holds.release().await.expect("ours");
    assert!(line_entries(&server, "emptied").is_empty());
}

/// Three processes taking turns, each asking again as soon as it has released: every one goes
/// to the back of the line, so they hold the lock in strict rotation.
#[tokio::test]
async fn processes_taking_turns_hold_the_lock_in_strict_rotation() {
    const ROUNDS: usize = 6;
    let server = RedisServer::start();
    let managers = [
        connect(&server).await,
        connect(&server).await,
        connect(&server).await,
    ];
    let order_key = "rotation:order";
    let mut tasks = Vec::new();
    for (index, manager) in managers.iter().enumerate() {
        let (manager, client) = (manager.clone(), server.client());
        tasks.push(tokio::spawn(async move {
            let mut data = client.get_multiplexed_async_connection().await.unwrap();
            for _ in 0..ROUNDS {
                let guard = manager
                    .acquire("rotation", &LockOptions::new())
                    .await
                    .unwrap();
                let _: i64 = redis::cmd("RPUSH")
                    .arg(order_key)
                    .arg(index)
                    .query_async(&mut data)
                    .await
                    .unwrap();
                // Long enough for the others to be in line before it releases, on a loaded
                // machine too: a process whose join lands a whole section late asks later.
                tokio::time::sleep(Duration::from_millis(100)).await;
                guard.release().await.unwrap();
            }
        }));
        // Queue in a known order: 0 holds, then 1, then 2 wait.
        eventually(
            Duration::from_secs(5),
            "the process to hold or queue",
            || server.exists("lock:rotation") && line_entries(&server, "rotation").len() == index,
        )
        .await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    let order: Vec<usize> = redis::cmd("LRANGE")
        .arg(order_key)
        .arg(0)
        .arg(-1)
        .query(&mut server.conn())
        .unwrap();
    let expected: Vec<usize> = (0..3 * ROUNDS).map(|turn| turn % 3).collect();
    assert_eq!(
        order, expected,
        "first come, first served, round after round"
    );
    assert!(!server.exists("lock:rotation"));
    assert!(line_entries(&server, "rotation").is_empty());
}

/// A process whose hand-off subscription is down (its pub/sub connection dropped and cannot be
/// made again: the server is at `maxclients`) while its command connection still works. Nobody
/// hears the grants published on its channel, yet the process is alive and renews its place:
/// a release must not take it for dead. It is handed the lock through the lock key and finds it
/// at its next look (a renewal, within a second), rather than being dropped from the line by
/// every release that reaches it while another process keeps taking the lock.
#[tokio::test]
async fn a_waiter_whose_subscription_is_down_is_still_served_in_its_turn() {
    let server = RedisServer::start();
    // Opened before the server refuses new connections, and kept.
    let mut admin = server.conn();
    let [a, b] = [connect(&server).await, connect(&server).await];
    let long = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .timeout(Duration::from_secs(10));
    let b_holds = b.acquire("starved", &long).await.expect("free");
    let a_waiting = wait_in_line(&a, "starved", &long);
    eventually(Duration::from_secs(5), "a to wait in line", || {
        redis::cmd("LLEN")
            .arg(keys::named("starved").line())
            .query::<usize>(&mut admin)
            .unwrap()
            == 1
    })
    .await;
    // `a`'s subscription goes, and cannot come back.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(1)
        .query(&mut admin)
        .unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut admin)
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cut = tokio::time::Instant::now();
    // `b` keeps taking the lock, section after section, as a busy worker does.
    let busy = tokio::spawn(async move {
        b_holds.release().await.expect("ours");
        let until = tokio::time::Instant::now() + Duration::from_secs(6);
        while tokio::time::Instant::now() < until {
            let Ok(guard) = b.acquire("starved", &long).await else {
                break;
            };
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = guard.release().await;
        }
    });
    let a_holds = a_waiting.await.unwrap().expect("a is served in the end");
    let waited = cut.elapsed();
    let _ = a_holds.release().await;
    busy.await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(10000)
        .query(&mut admin)
        .unwrap();
    assert!(
        waited < Duration::from_secs(3),
        "a waited {waited:?} for its turn while b took the lock again and again"
    );
}

/// A client subscribed to a pattern that matches every channel (`PSUBSCRIBE *`: an admin
/// tool watching the server) is counted by every `PUBLISH`, so a release cannot tell a dead
/// waiter by its receivers. A waiter that died long ago — its lease ran out, while the line was
/// kept alive by the others' joins — must still be skipped by the release, by its lease: not
/// handed the lock for a claim that holds up the live waiter behind. (This holder never waited
/// in this line, so it knows nothing of Redis's clock, and its release reads `TIME`.)
#[tokio::test]
async fn a_long_dead_waiter_is_skipped_even_when_a_pattern_subscriber_hears_every_channel() {
    let server = RedisServer::start();
    let [holder, live] = [connect(&server).await, connect(&server).await];
    let options = LockOptions::new();
    let held = holder.acquire("watched", &options).await.expect("free");
    // A waiter killed ten seconds ago, its place still in a line that others kept alive.
    push_lapsed_place(
        &server,
        "watched",
        "dead-token",
        "distlock:grants:gone",
        10_000,
    );
    let live_waiting = wait_in_line(&live, "watched", &options);
    until_line_is(&server, "watched", 2).await;
    let mut watcher = server.client().get_async_pubsub().await.unwrap();
    watcher.psubscribe("*").await.unwrap();
    let released = tokio::time::Instant::now();
    held.release().await.expect("ours");
    // Handed over by the release itself: a release that took the live waiter for lapsed too
    // would free the lock, and the waiter would still get it at its renewal, within the bound.
    let handed = server.get("lock:watched");
    let live_holds = live_waiting.await.unwrap().expect("served");
    let waited = released.elapsed();
    assert_eq!(
        handed.as_deref(),
        Some(live_holds.token()),
        "not handed over"
    );
    live_holds.release().await.expect("ours");
    assert!(
        waited < Duration::from_millis(1500),
        "the live waiter waited {waited:?}: the release handed the lock to the long-dead one"
    );
}

/// A waiter cut off from Redis without its process dying (a network cut): its connection, and
/// its subscription, linger on the server, so its hand-off counts as received. Once its lease has
/// run out, a release skips it by its lease — the releasing process's reading of Redis's clock
/// (from its own last place in the line) says it may have lapsed, and one `TIME` confirms it —
/// and no claim is lost on a waiter that cannot take it.
#[tokio::test]
async fn a_release_skips_a_lapsed_waiter_that_still_looks_subscribed() {
    let server = RedisServer::start();
    let [holder, first, live] = [
        connect(&server).await,
        connect(&server).await,
        connect(&server).await,
    ];
    let options = LockOptions::new();
    // `holder` gets the lock by waiting in this line, as a process of a busy fleet does: it
    // knows Redis's clock from its place.
    let first_holds = first.acquire("cut", &options).await.expect("free");
    let holder_waiting = wait_in_line(&holder, "cut", &options);
    until_line_is(&server, "cut", 1).await;
    first_holds.release().await.expect("ours");
    let held = holder_waiting.await.unwrap().expect("handed over");
    // Held for a while, so that the holder's reading of Redis's clock is older than the lapse
    // below: only a reading carried forward by the time since tells that the place may have
    // lapsed (a reading that stood still would take it for live, and hand it the lock).
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The cut-off waiter: a place whose lease ran out half a second ago, on a channel that a
    // connection still listens to.
    let mut lingering = server.client().get_async_pubsub().await.unwrap();
    lingering
        .subscribe("distlock:grants:cut-off")
        .await
        .unwrap();
    push_lapsed_place(
        &server,
        "cut",
        "cut-off-token",
        "distlock:grants:cut-off",
        500,
    );
    let live_waiting = wait_in_line(&live, "cut", &options);
    until_line_is(&server, "cut", 2).await;

    let mut probe = server.conn();
    server.reset_stats();
    held.release().await.expect("ours");
    let counts = commands(&mut probe);
    let handed = server.get("lock:cut");
    assert_eq!(
        counts.get("time"),
        Some(&1),
        "one TIME, for the waiter that looked lapsed: {counts:?}"
    );
    assert_ne!(
        handed.as_deref(),
        Some("cut-off-token"),
        "handed to the cut-off waiter"
    );
    let live_holds = tokio::time::timeout(Duration::from_secs(1), live_waiting)
        .await
        .expect("served at the release, not after a claim")
        .unwrap()
        .expect("handed over");
    // By the release itself, not found free at the waiter's renewal: a release that took the
    // live waiter for lapsed too would have freed the lock.
    assert_eq!(
        handed.as_deref(),
        Some(live_holds.token()),
        "not handed over"
    );
    live_holds.release().await.expect("ours");
    assert!(line_entries(&server, "cut").is_empty());
}

/// A process that has waited on more locks within a minute than it remembers places for (256)
/// still knows Redis's clock from its latest place: its release of that lock reads no `TIME`.
#[tokio::test]
async fn a_process_that_waited_on_many_locks_still_knows_the_clock_from_its_latest_place() {
    let server = RedisServer::start();
    let [busy, other, next] = [
        connect(&server).await,
        connect(&server).await,
        connect(&server).await,
    ];
    let options = LockOptions::new();
    let names: Vec<String> = (0..300).map(|i| format!("many-{i}")).collect();
    let mut held = Vec::new();
    for name in &names {
        held.push(other.acquire(name, &options).await.expect("free"));
    }
    // `busy` waits briefly in each of their lines, and gives up.
    let brief = LockOptions::new().timeout(Duration::from_millis(500));
    let tries: Vec<Waiting> = names
        .iter()
        .map(|name| wait_in_line(&busy, name, &brief))
        .collect();
    for attempt in tries {
        assert!(attempt.await.unwrap().is_err(), "held by another");
    }
    let other_holds = other.acquire("latest", &options).await.expect("free");
    let busy_waiting = wait_in_line(&busy, "latest", &options);
    until_line_is(&server, "latest", 1).await;
    other_holds.release().await.expect("ours");
    let busy_holds = busy_waiting.await.unwrap().expect("handed over");
    let next_waiting = wait_in_line(&next, "latest", &options);
    until_line_is(&server, "latest", 1).await;

    let mut probe = server.conn();
    server.reset_stats();
    busy_holds.release().await.expect("ours");
    let counts = commands(&mut probe);
    assert_eq!(
        counts.get("time"),
        None,
        "the release read the clock: {counts:?}"
    );
    next_waiting
        .await
        .unwrap()
        .expect("handed over")
        .release()
        .await
        .expect("ours");
    for guard in held {
        guard.release().await.expect("ours");
    }
}
