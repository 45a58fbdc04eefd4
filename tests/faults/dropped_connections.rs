//! A request that meets a connection dropped while idle, or whose reply was lost with its
//! connection, is sent once more on a new connection, and answered as if it ran once
//! (`docs/reliability.md`).

use std::time::{Duration, Instant};

use distlock::{LockError, LockManager, LockMode, LockOptions};
use test_support::{eventually, keys, FaultProxy, RedisServer};

/// An operator breaks `name`'s lock as `distlock release --force` does: looks at who holds it,
/// then force-releases what it saw. Whether it broke it.
async fn operator_breaks(operator: &LockManager, name: &str) -> bool {
    let info = operator
        .inspect(name)
        .await
        .unwrap()
        .expect("the lock is held");
    operator.force_release(&info).await.unwrap()
}

/// Redlock over three masters with an idle-client `timeout` of 1 s. The holder's section runs
/// 2.5 s with no Redis call, so every master has closed its connection; then it releases.
/// A Redlock master's release has no marker, so it is not sent again (`docs/reliability.md`):
/// the release reports that no majority answered (`NoQuorum`) — never `Lost`, never `Ok` — and
/// the lock is left to its ttl on the masters.
#[test]
fn a_redlock_release_after_the_masters_closed_idle_connections_is_an_error_not_lost() {
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with(&["--timeout", "1"]))
        .collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let main = test_support::runtime(2);
    let name = "dropped:redlock-idle";
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    main.block_on(async {
        let holder = LockManager::redlock_builder(&urls).connect().await.unwrap();
        let guard = holder.acquire(name, &options).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let released = guard.release().await;
        let left: Vec<i64> = servers
            .iter()
            .map(|server| server.pttl(&format!("lock:{name}")))
            .collect();
        assert!(
            matches!(released, Err(LockError::NoQuorum { answered: 0, .. })),
            "Redlock: the release after a 2.5 s section (masters' `timeout 1`) answered \
             {released:?}; the lock's ttl left on each master: {left:?} ms"
        );
        assert!(
            left.iter().all(|&ms| ms > 5_000),
            "left to its ttl: {left:?}"
        );
    });
}

/// `acquire` with a zero timeout — "a single attempt" (`LockOptions::timeout`; what
/// `#[distributed_lock(timeout = 0)]` makes) — after the server closed the manager's idle
/// connection (`timeout 1`). The lock is free: the single attempt must take it, as
/// `try_acquire` does, not fail with `broken pipe`.
#[test]
fn a_single_attempt_acquire_after_the_server_closed_an_idle_connection_takes_the_free_lock() {
    let server = RedisServer::start_with(&["--timeout", "1"]);
    let main = test_support::runtime(2);
    main.block_on(async {
        let manager = test_support::connect(&server).await;
        let options = LockOptions::new()
            .ttl(Duration::from_secs(10))
            .timeout(Duration::ZERO);
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let attempt = manager.acquire("dropped:idle-single", &options).await;
        assert!(
            attempt.is_ok(),
            "acquire (timeout 0) of a free lock after 2.5 s idle (server `timeout 1`): \
             {attempt:?}"
        );
    });
}

/// A fenced `try_acquire` (its first try is the acquire script, which issues the token) after
/// the server closed the manager's idle connection: it takes the free lock, with a token.
#[test]
fn a_fenced_try_acquire_after_the_server_closed_an_idle_connection_takes_the_free_lock() {
    let server = RedisServer::start_with(&["--timeout", "1"]);
    let main = test_support::runtime(2);
    main.block_on(async {
        let manager = test_support::connect(&server).await;
        let options = LockOptions::new()
            .ttl(Duration::from_secs(10))
            .fencing(true);
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let attempt = manager.try_acquire("dropped:idle-fenced", &options).await;
        let guard = match attempt {
            Ok(Some(guard)) => guard,
            other => panic!(
                "a fenced try_acquire of a free lock after 2.5 s idle (server `timeout 1`): \
                 {other:?}"
            ),
        };
        assert_eq!(
            guard.fencing_token(),
            Some(1),
            "the first token of the counter"
        );
        guard.release().await.unwrap();
    });
}

/// `try_acquire` of a free lock whose first `SET NX` runs but whose reply is lost with its
/// connection (the proxy drops the reply and cuts that connection). Sent once more, it must
/// find the lock its own and take it, not answer `Ok(None)` ("someone else holds it") for the
/// lock its first send took. 20 rounds: a re-send under another token would race the first
/// send's clean-up, and lose some of them.
#[test]
fn a_try_acquire_whose_reply_was_lost_takes_the_free_lock() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let main = test_support::runtime(2);
    let name = "dropped:try-lost-reply";
    main.block_on(async {
        let manager = LockManager::connect(&proxy.url()).await.unwrap();
        let options = LockOptions::new().ttl(Duration::from_secs(10));
        let mut outcomes = Vec::new();
        for round in 0..20 {
            let key = format!("{name}:{round}");
            proxy.lose_next_reply_to(&format!("lock:{key}"));
            let attempt = manager.try_acquire(&key, &options).await;
            let value_after = server.get(&format!("lock:{key}"));
            assert_eq!(proxy.replies_lost(), round + 1, "the reply was lost");
            let got = matches!(attempt, Ok(Some(_)));
            outcomes.push(format!(
                "{attempt:?} (lock key right after: {value_after:?})"
            ));
            if let Ok(Some(guard)) = attempt {
                guard.release().await.unwrap();
            }
            if !got {
                // Nobody else holds it: the key is freed by the background clean-up.
                tokio::time::sleep(Duration::from_millis(500)).await;
                let later = server.get(&format!("lock:{key}"));
                panic!(
                    "try_acquire of a free lock whose first reply was lost: {outcomes:?}; \
                     nobody else ever took it; the key 0.5 s later: {later:?}"
                );
            }
        }
    });
}

/// Redlock over three masters with an idle-client `timeout` of 1 s: after 2.5 s idle every
/// master has closed the manager's connection. `try_acquire` of a free lock must take it
/// (`docs/reliability.md`: "a `try_acquire` ... that meets it is sent once more on a new
/// connection"), not fail because no master answered.
#[test]
fn a_redlock_try_acquire_after_the_masters_closed_idle_connections_takes_the_free_lock() {
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with(&["--timeout", "1"]))
        .collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let main = test_support::runtime(2);
    main.block_on(async {
        let manager = LockManager::redlock_builder(&urls).connect().await.unwrap();
        let options = LockOptions::new().ttl(Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let attempt = manager
            .try_acquire("dropped:redlock-idle-try", &options)
            .await;
        assert!(
            matches!(attempt, Ok(Some(_))),
            "Redlock try_acquire of a free lock after 2.5 s idle (masters' `timeout 1`): \
             {attempt:?}"
        );
    });
}

fn line_len(server: &RedisServer, name: &str) -> usize {
    let entries: Vec<String> = redis::cmd("LRANGE")
        .arg(keys::named(name).line())
        .arg(0)
        .arg(-1)
        .query(&mut server.conn())
        .unwrap();
    entries.len()
}

/// A waiter's look at the holder's expiry takes the lock (the holder died: its key expires);
/// that look's reply is lost with its connection. Sent once more as a renewal, it finds the
/// lock its own: the waiter holds it, with the fencing token the counter holds, and nothing of
/// the line is left.
#[test]
fn a_look_that_took_the_lock_and_lost_its_reply_holds_it_once() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let main = test_support::runtime(2);
    let name = "dropped:look-lost";
    let key = format!("lock:{name}");
    main.block_on(async {
        let waiter = LockManager::connect(&proxy.url()).await.unwrap();
        let other = test_support::connect(&server).await;
        let options = LockOptions::new()
            .ttl(Duration::from_secs(10))
            .timeout(Duration::from_secs(10))
            .fencing(true);
        let first = other.acquire(name, &options).await.unwrap();
        let first_fence = first.fencing_token().unwrap();
        // The holder dies: its key now expires in 1.2 s.
        let _: () = redis::cmd("PEXPIRE").arg(&key).arg(1200).query(&mut server.conn()).unwrap();
        std::mem::forget(first);
        let waiting = {
            let (waiter, options) = (waiter.clone(), options.clone());
            tokio::spawn(async move { waiter.acquire(name, &options).await })
        };
        test_support::eventually(Duration::from_secs(5), "the waiter in line", || {
            line_len(&server, name) == 1
        })
        .await;
        proxy.lose_next_reply_to(&key);
        let guard = tokio::time::timeout(Duration::from_secs(8), waiting)
            .await
            .expect("acquired in time")
            .unwrap();
        let lost = proxy.replies_lost();
        let guard = guard.unwrap_or_else(|e| panic!("{e:?}, replies lost {lost}"));
        let fence = guard.fencing_token().unwrap();
        let counter: u64 = redis::cmd("GET")
            .arg(keys::named(name).fence())
            .query(&mut server.conn())
            .unwrap_or(0);
        let value = server.get(&key);
        eprintln!("lost {lost} fence {fence} first {first_fence} counter {counter} value {value:?} line {}", line_len(&server, name));
        assert!(fence > first_fence && fence == counter, "fence {fence} counter {counter}");
        assert!(value.is_some());
        guard.release().await.unwrap();
        assert_eq!(server.get(&key), None);
    });
}

/// `docs/reliability.md`: "No call hangs: every Redis call is bounded by the connect/response
/// timeouts; `acquire` returns by its `timeout` plus at most one response timeout."
///
/// A waiter (through a proxy; default timeouts: response 1 s, connect 2 s) waits for a lock
/// held for 30 s, with `timeout` 1.5 s. Just before its deadline the link gets slow (450 ms
/// one way), so its last look, sent at the deadline, is still unanswered 0.7 s later when a
/// blip cuts the connection. A look sent once more on a new connection there, whose handshake
/// and command each take a slow round trip, would return ~2.5 s past the deadline: the look
/// at the deadline is the last, and `acquire` returns when it fails.
#[test]
fn acquire_returns_by_its_timeout_plus_one_response_timeout_through_a_blip() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let main = test_support::runtime(2);
    let name = "dropped:deadline-blip";
    main.block_on(async {
        let holder = test_support::connect(&server).await;
        let waiter = LockManager::connect(&proxy.url()).await.unwrap();
        let held = LockOptions::new().ttl(Duration::from_secs(30));
        let _guard = holder.acquire(name, &held).await.unwrap();
        let timeout = Duration::from_millis(1500);
        let options = LockOptions::new()
            .ttl(Duration::from_secs(10))
            .timeout(timeout);
        let started = Instant::now();
        let waiting = {
            let (waiter, options) = (waiter.clone(), options.clone());
            tokio::spawn(async move {
                let result = waiter.acquire(name, &options).await;
                (result.map(drop), Instant::now())
            })
        };
        test_support::eventually(Duration::from_secs(1), "the waiter in line", || {
            line_len(&server, name) == 1
        })
        .await;
        // The link slows down just before the deadline: the last look, sent at 1.5 s, is
        // answered at ~2.4 s at the earliest.
        tokio::time::sleep_until((started + Duration::from_millis(1400)).into()).await;
        proxy.set_delay(Duration::from_millis(450));
        // A blip while it is in flight.
        tokio::time::sleep_until((started + Duration::from_millis(2200)).into()).await;
        proxy.cut();
        let (result, returned_at) = tokio::time::timeout(Duration::from_secs(15), waiting)
            .await
            .expect("acquire returned")
            .unwrap();
        let past = returned_at.saturating_duration_since(started + timeout);
        assert!(
            past <= Duration::from_millis(1100),
            "acquire (timeout 1.5 s, response timeout 1 s) returned {result:?} {past:?} past \
             its deadline"
        );
    });
}

/// A release within `hold_at_least` (2 s), a second into the section, with a waiter in line,
/// whose reply is lost with its connection: sent once more, it must answer Ok (the first run
/// kept the lock for the line), and the waiter gets the lock at the hold's end — not before,
/// not at the ttl.
#[test]
fn a_hold_release_whose_reply_was_lost_keeps_the_hold() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let main = test_support::runtime(2);
    let name = "dropped:hold-lost";
    let key = format!("lock:{name}");
    main.block_on(async {
        let holder = LockManager::connect(&proxy.url()).await.unwrap();
        let waiter = test_support::connect(&server).await;
        let options = LockOptions::new()
            .ttl(Duration::from_secs(20))
            .timeout(Duration::from_secs(20));
        let held = options.clone().hold_at_least(Duration::from_secs(2));
        let guard = holder.acquire(name, &held).await.unwrap();
        let taken = Instant::now();
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
            line_len(&server, name) == 1
        })
        .await;
        // A second into the section: the release may meet a connection closed for being idle,
        // so it is marked, and sent once more when its connection drops.
        tokio::time::sleep_until((taken + Duration::from_millis(1100)).into()).await;
        proxy.lose_next_reply_to(&key);
        let released = guard.release().await;
        let lost = proxy.replies_lost();
        let value = server.get(&key);
        let got_at = waiting.await.unwrap();
        let after = got_at.saturating_duration_since(taken);
        assert!(
            released.is_ok() && lost == 1,
            "the hold release answered {released:?} (replies lost: {lost}); the key holds {value:?}"
        );
        assert!(after >= Duration::from_millis(1950) && after < Duration::from_secs(4));
    });
}

/// A release with a waiter in line whose reply is lost with its connection, and an extension
/// whose reply is lost: the re-sent extension answers Ok and the lock keeps its new ttl. The
/// release, a moment after the extension (its connection cannot have been closed for being
/// idle), of a lock taken by a first try, is first the short release of a lock held alone,
/// which finds the waiter and changes nothing; its reply lost, the full release follows on a
/// new connection, finds the lock still ours and hands it to the waiter: the release answers
/// Ok, which it now knows, and the waiter holds the lock.
#[test]
fn a_release_and_an_extension_whose_replies_were_lost() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let main = test_support::runtime(2);
    let name = "dropped:release-lost";
    let key = format!("lock:{name}");
    main.block_on(async {
        let holder = LockManager::connect(&proxy.url()).await.unwrap();
        let waiter = test_support::connect(&server).await;
        let options = LockOptions::new()
            .ttl(Duration::from_secs(20))
            .timeout(Duration::from_secs(20));
        let guard = holder.acquire(name, &options).await.unwrap();
        proxy.lose_next_reply_to(&key);
        let extended = guard.extend(Duration::from_secs(25)).await;
        let pttl = server.pttl(&key);
        assert!(
            extended.is_ok() && pttl > 24_000,
            "the extension answered {extended:?}; {pttl} ms left"
        );
        let waiting = {
            let (waiter, options) = (waiter.clone(), options.clone());
            tokio::spawn(async move {
                let guard = waiter.acquire(name, &options).await.unwrap();
                let token = guard.token().to_owned();
                tokio::time::sleep(Duration::from_millis(300)).await;
                let value = guard.release().await;
                (token, value)
            })
        };
        test_support::eventually(Duration::from_secs(5), "the waiter in line", || {
            line_len(&server, name) == 1
        })
        .await;
        proxy.lose_next_reply_to(&key);
        let released = guard.release().await;
        let lost = proxy.replies_lost();
        let value = server.get(&key);
        let (token, waiter_release) = waiting.await.unwrap();
        // The extension's reply and the short release's.
        assert!(
            released.is_ok() && lost == 2,
            "the release whose first reply was lost answered {released:?} (replies lost: {lost})"
        );
        assert_eq!(value.as_deref(), Some(token.as_str()));
        assert!(waiter_release.is_ok());
    });
}

/// The short release of a lock held alone (taken by a first try, nobody in line) whose reply
/// is lost with its connection: it deleted the lock, which the full release that follows cannot
/// tell from a lock lost earlier, so the release reports the Redis error — never a false
/// `Lost` — and the lock is free.
#[test]
fn a_short_release_whose_reply_was_lost_reports_the_error_not_lost() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let main = test_support::runtime(2);
    let name = "dropped:short-release-lost";
    let key = format!("lock:{name}");
    main.block_on(async {
        let holder = LockManager::connect(&proxy.url()).await.unwrap();
        let options = LockOptions::new().ttl(Duration::from_secs(20));
        let guard = holder.acquire(name, &options).await.unwrap();
        proxy.lose_next_reply_to(&key);
        let released = guard.release().await;
        let lost = proxy.replies_lost();
        assert!(
            matches!(released, Err(LockError::Redis(_))) && lost == 1,
            "the release whose reply was lost answered {released:?} (replies lost: {lost})"
        );
        assert!(!server.exists(&key), "the short release deleted the lock");
        let again = holder.try_acquire(name, &options).await.unwrap();
        assert!(again.is_some(), "the lock is free again");
        again.unwrap().release().await.unwrap();
    });
}

/// The short release of a lock an operator broke, whose reply is lost with its connection: the
/// operator's `forced` mark names the holder's token, which proves the lock was still the
/// holder's when it was broken (the mark is written only then), so the short release cannot
/// have removed it: the holder is told `Lost { ForceReleased }`, not a bare Redis error.
#[test]
fn a_short_release_whose_reply_was_lost_after_an_operator_broke_the_lock_says_so() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let main = test_support::runtime(2);
    let name = "dropped:short-release-forced";
    let key = format!("lock:{name}");
    main.block_on(async {
        let holder = LockManager::connect(&proxy.url()).await.unwrap();
        let operator = test_support::connect(&server).await;
        let options = LockOptions::new().ttl(Duration::from_secs(20));
        let guard = holder.acquire(name, &options).await.unwrap();
        assert!(operator_breaks(&operator, name).await);
        proxy.lose_next_reply_to(&key);
        let released = guard.release().await;
        let lost = proxy.replies_lost();
        assert!(
            matches!(
                released,
                Err(LockError::Lost {
                    cause: distlock::LostCause::ForceReleased,
                    ..
                })
            ) && lost == 1,
            "the release whose reply was lost answered {released:?} (replies lost: {lost})"
        );
    });
}

/// The short release of a lock held alone deletes it, its reply lost with its connection; an
/// operator who saw the lock held breaks it before the full release that follows arrives: the
/// lock no longer holds the holder's token, so the operator breaks nothing and writes no
/// `forced` mark, and the full release finds the lock nobody's — the release reports the Redis
/// error, never `Lost` (it did release the lock). The interleaving the `ForceReleased` answer
/// trusted after a lost short reply must not take for an operator's doing.
#[test]
fn a_short_release_whose_reply_was_lost_then_an_operator_break_is_not_force_released() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let main = test_support::runtime(2);
    let name = "dropped:short-release-then-forced";
    let key = format!("lock:{name}");
    main.block_on(async {
        let holder = LockManager::connect(&proxy.url()).await.unwrap();
        let operator = test_support::connect(&server).await;
        let options = LockOptions::new().ttl(Duration::from_secs(20));
        let guard = holder.acquire(name, &options).await.unwrap();
        let info = operator
            .inspect(name)
            .await
            .unwrap()
            .expect("the lock is held");
        // Every hop through the proxy takes 200 ms: the full release, on a new connection,
        // reaches Redis well after the short release has run.
        proxy.set_delay(Duration::from_millis(200));
        proxy.lose_next_reply_to(&key);
        let release = tokio::spawn(guard.release());
        eventually(
            Duration::from_secs(10),
            "the short release to delete the lock",
            || !server.exists(&key),
        )
        .await;
        let broken = operator.force_release(&info).await;
        let forced = keys::named(name).forced();
        let mark = server.get(&forced);
        let released = release.await.unwrap();
        let lost = proxy.replies_lost();
        assert!(
            matches!(broken, Ok(false)),
            "the operator broke a lock already deleted: {broken:?}"
        );
        assert_eq!(mark, None, "a `forced` mark was written for a deleted lock");
        assert!(
            matches!(released, Err(LockError::Redis(_))) && lost == 1,
            "the release whose reply was lost answered {released:?} (replies lost: {lost})"
        );
    });
}

/// The `forced` mark of an earlier lock of the same name (another token, broken by an
/// operator) is still there when a new holder's short release runs and its reply is lost: the
/// mark does not name the new holder, so its release reports the Redis error, not `Lost`.
#[test]
fn a_short_release_whose_reply_was_lost_ignores_an_earlier_holders_forced_mark() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let main = test_support::runtime(2);
    let name = "dropped:short-release-old-mark";
    let key = format!("lock:{name}");
    main.block_on(async {
        let holder = LockManager::connect(&proxy.url()).await.unwrap();
        let operator = test_support::connect(&server).await;
        let options = LockOptions::new().ttl(Duration::from_secs(20));
        let first = holder.acquire(name, &options).await.unwrap();
        assert!(operator_breaks(&operator, name).await);
        let forced = keys::named(name).forced();
        assert!(server.exists(&forced), "the operator's mark is there");
        assert!(matches!(
            first.release().await,
            Err(LockError::Lost {
                cause: distlock::LostCause::ForceReleased,
                ..
            })
        ));
        let guard = holder.acquire(name, &options).await.unwrap();
        assert!(
            server.exists(&forced),
            "the earlier holder's mark is still there"
        );
        proxy.lose_next_reply_to(&key);
        let released = guard.release().await;
        let lost = proxy.replies_lost();
        assert!(
            matches!(released, Err(LockError::Redis(_))) && lost == 1,
            "the release whose reply was lost answered {released:?} (replies lost: {lost})"
        );
        assert!(!server.exists(&key), "the short release deleted the lock");
    });
}

/// A first try whose `SET` ran but whose reply was lost is sent once more (the acquire script,
/// same token); an operator breaks the lock its first send took before the second lands, so the
/// second takes the free lock again under that token, and clears the operator's `forced` mark
/// of it: that token holds the lock anew. The short release of that lock deletes it and its
/// reply is lost: the short release did remove the lock, so the release must report the Redis
/// error, not `Lost { ForceReleased }` from a mark left naming the token.
#[test]
fn a_short_release_whose_reply_was_lost_of_a_lock_retaken_after_a_break_is_not_force_released() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let main = test_support::runtime(2);
    let name = "dropped:short-release-retaken";
    let key = format!("lock:{name}");
    main.block_on(async {
        let holder = LockManager::connect(&proxy.url()).await.unwrap();
        let operator = test_support::connect(&server).await;
        let options = LockOptions::new().ttl(Duration::from_secs(20));
        // Every hop through the proxy takes 50 ms: the first try's second send, on a new
        // connection, reaches Redis well after the operator has broken what its first took.
        proxy.set_delay(Duration::from_millis(50));
        proxy.lose_next_reply_to(&key);
        let attempt = tokio::spawn({
            let holder = holder.clone();
            let options = options.clone();
            async move { holder.try_acquire(name, &options).await }
        });
        eventually(
            Duration::from_secs(10),
            "the first try's SET to run",
            || server.exists(&key),
        )
        .await;
        assert!(operator_breaks(&operator, name).await);
        let guard = attempt
            .await
            .unwrap()
            .unwrap()
            .expect("the second send took the free lock");
        proxy.set_delay(Duration::ZERO);
        assert_eq!(proxy.replies_lost(), 1, "the first try's reply was lost");
        assert_eq!(
            server.get(&key).as_deref(),
            Some(guard.token()),
            "the second send took the lock again under the same token"
        );
        let forced = keys::named(name).forced();
        assert_eq!(
            server.get(&forced),
            None,
            "the second send, which holds the lock anew, cleared the operator's mark of its token"
        );
        // A call on the holder's connection just before the release, which would otherwise
        // count the slow acquisition as idle time and send the marked full release instead.
        assert!(holder.inspect(name).await.unwrap().is_some());
        let short_releases = server.command_count("exists");
        proxy.lose_next_reply_to(&key);
        let released = guard.release().await;
        let lost = proxy.replies_lost();
        assert_eq!(
            server.command_count("exists"),
            short_releases + 1,
            "the short release ran"
        );
        assert!(!server.exists(&key), "the short release deleted the lock");
        assert!(
            matches!(released, Err(LockError::Redis(_))) && lost == 2,
            "the release whose reply was lost answered {released:?} (replies lost: {lost})"
        );
    });
}

/// A release after a section of more than a second (its connection may have been closed for
/// being idle, so it leaves a marker), with a waiter in line, whose reply is lost with its
/// connection: sent once more, it finds its own release in the marker and answers Ok — not
/// `Lost` — and the waiter holds the lock.
#[test]
fn a_release_after_a_long_section_whose_reply_was_lost_is_not_reported_lost() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let main = test_support::runtime(2);
    let name = "dropped:long-release-lost";
    let key = format!("lock:{name}");
    main.block_on(async {
        let holder = LockManager::connect(&proxy.url()).await.unwrap();
        let waiter = test_support::connect(&server).await;
        let options = LockOptions::new()
            .ttl(Duration::from_secs(20))
            .timeout(Duration::from_secs(20));
        let guard = holder.acquire(name, &options).await.unwrap();
        let waiting = {
            let (waiter, options) = (waiter.clone(), options.clone());
            tokio::spawn(async move {
                let guard = waiter.acquire(name, &options).await.unwrap();
                let token = guard.token().to_owned();
                tokio::time::sleep(Duration::from_millis(300)).await;
                (token, guard.release().await)
            })
        };
        test_support::eventually(Duration::from_secs(5), "the waiter in line", || {
            line_len(&server, name) == 1
        })
        .await;
        tokio::time::sleep(Duration::from_millis(1200)).await;
        proxy.lose_next_reply_to(&key);
        let released = guard.release().await;
        let value = server.get(&key);
        let (token, waiter_release) = waiting.await.unwrap();
        assert_eq!(proxy.replies_lost(), 1, "the release's reply was lost");
        assert!(
            released.is_ok(),
            "a release that ran, whose reply was lost, answered {released:?}"
        );
        assert_eq!(
            value.as_deref(),
            Some(token.as_str()),
            "the waiter holds it"
        );
        assert!(waiter_release.is_ok());
    });
}

/// A release after a section of more than a second (so it leaves its `released` marker),
/// whose reply is lost with its connection, while readers take the freed name before it is sent
/// once more: the second run finds the name held to read, and its marker says its first run
/// released the lock. It answers Ok: the lock was ours and was released, not a misuse of the
/// name (`Config`). The link is slow (300 ms each way) so that the readers come in between.
#[test]
fn a_release_whose_reply_was_lost_then_readers_took_the_name_is_ok() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let main = test_support::runtime(2);
    let name = "dropped:release-lost-then-readers";
    let key = keys::default_key(name);
    main.block_on(async {
        let holder = LockManager::connect(&proxy.url()).await.unwrap();
        let readers = test_support::connect(&server).await;
        let write = LockOptions::new().ttl(Duration::from_secs(20));
        let read = write.clone().mode(LockMode::Read);
        // Both scripts cached: a first send answered NOSCRIPT would take nothing.
        let warm = holder.acquire(name, &write).await.unwrap();
        warm.release().await.unwrap();
        let guard = holder.acquire(name, &write).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        proxy.set_delay(Duration::from_millis(300));
        proxy.lose_next_reply_to(&key);
        let releasing = tokio::spawn(async move { guard.release().await });
        eventually(Duration::from_secs(5), "the release's first run", || {
            !server.exists(&key)
        })
        .await;
        let reader = readers.acquire(name, &read).await.unwrap();
        let released = releasing.await.unwrap();
        assert_eq!(proxy.replies_lost(), 1, "the release's reply was lost");
        assert!(
            released.is_ok(),
            "a release that ran, whose reply was lost, found readers at its resend and \
             answered {released:?}"
        );
        assert!(
            reader.is_held().await.unwrap(),
            "the readers' lock is untouched by the resent release"
        );
        reader.release().await.unwrap();
    });
}

/// A lock handed over on a claim (ttl 10 s > the 3 s claim) is confirmed to its full ttl a
/// third into the claim — on the background runtime's connection (`confirm.rs`), not the
/// holder's. The holder's own connection has then carried nothing since the waiter joined the
/// line: with the server's `timeout 1` it may be closed for being idle (here it is closed, by
/// the proxy, at the moment Redis is entitled to: more than a second after its last use).
/// The release comes within a second of the confirmation: what decides whether it may meet a
/// connection closed for being idle is the last use of its own connection, not the lock's last
/// command. It must be sent once more and hand the lock on, not fail and leave the lock to its
/// 10 s ttl (`docs/reliability.md`).
#[test]
fn a_release_soon_after_a_background_confirmation_on_an_idle_closed_connection_reaches_redis() {
    let server = RedisServer::start_with(&["--timeout", "1"]);
    let proxy = FaultProxy::start(server.port());
    let main = test_support::runtime(2);
    let name = "dropped:confirmed-then-idle";
    let key = format!("lock:{name}");
    main.block_on(async {
        let holder = test_support::connect(&server).await;
        let waiter = LockManager::connect(&proxy.url()).await.unwrap();
        let options = LockOptions::new()
            .ttl(Duration::from_secs(10))
            .timeout(Duration::from_secs(20));
        let guard = holder.acquire(name, &options).await.unwrap();
        let waiting = {
            let (waiter, options) = (waiter.clone(), options.clone());
            tokio::spawn(async move { waiter.acquire(name, &options).await.unwrap() })
        };
        test_support::eventually(Duration::from_secs(5), "the waiter in line", || {
            line_len(&server, name) == 1
        })
        .await;
        let joined = Instant::now();
        guard.release().await.unwrap();
        let handed = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("handed over")
            .unwrap();
        // The confirmation (background runtime's connection) sets the full 10 s ttl.
        test_support::eventually(Duration::from_secs(3), "the confirmation", || {
            server.pttl(&key) > 5_000
        })
        .await;
        let confirmed = Instant::now();
        tokio::time::sleep_until((confirmed + Duration::from_millis(600)).into()).await;
        let idle = joined.elapsed();
        assert!(idle > Duration::from_millis(1500));
        // The holder's runtime connection has been idle `idle` (> 1 s): closed, as the
        // server's `timeout 1` may do.
        proxy.cut();
        let released = handed.release().await;
        let left = server.pttl(&key);
        assert!(
            released.is_ok() && left == -2,
            "a release {:?} after the confirmation, on a connection idle {idle:?} (closed), \
             answered {released:?}; the lock's ttl left: {left} ms",
            confirmed.elapsed()
        );
    });
}

/// Redlock over three masters, two of them through proxies. A release whose reply is lost with
/// its connection on two masters (it ran there: the lock is deleted) must not report `Lost`: a
/// second run there would find the lock gone (`QUORUM_RELEASE` has no `released` marker), so
/// it is not sent again, and the release reports that no majority answered (`NoQuorum`).
#[test]
fn a_redlock_release_whose_replies_were_lost_on_a_majority_is_not_reported_lost() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let proxies: Vec<FaultProxy> = servers[..2]
        .iter()
        .map(|server| FaultProxy::start(server.port()))
        .collect();
    let urls = vec![proxies[0].url(), proxies[1].url(), servers[2].url()];
    let main = test_support::runtime(2);
    let name = "dropped:redlock-release-lost";
    let key = format!("lock:{name}");
    main.block_on(async {
        let holder = LockManager::redlock_builder(&urls).connect().await.unwrap();
        let options = LockOptions::new().ttl(Duration::from_secs(20));
        // One release on another key first, so that every master knows the release script.
        // `connect` returns once a majority answered its probe, so a master may not have it yet;
        // there the release's first `EVALSHA` is answered NOSCRIPT without running, and losing
        // that reply would lose a release that never ran, not the one this test is about.
        let warm_up = holder.acquire("dropped:warm-up", &options).await.unwrap();
        warm_up.release().await.unwrap();
        let guard = holder.acquire(name, &options).await.unwrap();
        for proxy in &proxies {
            proxy.lose_next_reply_to(&key);
        }
        let released = guard.release().await;
        let left: Vec<i64> = servers.iter().map(|server| server.pttl(&key)).collect();
        let lost: Vec<usize> = proxies.iter().map(FaultProxy::replies_lost).collect();
        assert_eq!(
            lost,
            vec![1, 1],
            "the release's replies were lost on two masters"
        );
        assert!(
            left.iter().all(|&ms| ms == -2),
            "deleted everywhere: {left:?}"
        );
        assert!(
            matches!(released, Err(LockError::NoQuorum { answered: 1, .. })),
            "a Redlock release that deleted the lock on every master, its replies lost on two, \
             answered {released:?}, not that too few masters answered"
        );
    });
}

/// An operator's forced release whose reply is lost with its connection is sent once more (its
/// `forced` mark tells the second run what the first did): it reports the lock broken — not
/// "not broken", which would send the operator after a lock nobody holds —, the lock is free,
/// and the holder learns it was force-released.
#[test]
fn a_forced_release_whose_reply_was_lost_reports_the_lock_broken() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let main = test_support::runtime(2);
    let name = "dropped:forced-lost";
    let key = format!("lock:{name}");
    main.block_on(async {
        let holder = test_support::connect(&server).await;
        let operator = LockManager::connect(&proxy.url()).await.unwrap();
        let options = LockOptions::new().ttl(Duration::from_secs(30));
        // The forced release's script is loaded by one run first: the reply lost below is
        // that of a run, not of a `NOSCRIPT`.
        let primer = holder.acquire("dropped:primer", &options).await.unwrap();
        let primer_info = operator.inspect("dropped:primer").await.unwrap().unwrap();
        assert!(operator.force_release(&primer_info).await.unwrap());
        drop(primer);
        let guard = holder.acquire(name, &options).await.unwrap();
        let info = operator
            .inspect(name)
            .await
            .unwrap()
            .expect("the lock is held");
        proxy.lose_next_reply_to(&key);
        let broken = operator.force_release(&info).await;
        assert_eq!(
            proxy.replies_lost(),
            1,
            "the forced release's reply was lost"
        );
        assert!(
            matches!(broken, Ok(true)),
            "a forced release that ran, whose reply was lost, answered {broken:?}"
        );
        assert!(!server.exists(&key), "the lock is still there");
        let released = guard.release().await;
        assert!(
            matches!(
                released,
                Err(LockError::Lost {
                    cause: distlock::LostCause::ForceReleased,
                    ..
                })
            ),
            "the holder was told {released:?}"
        );
    });
}

/// A waiter that gives up (its acquisition is dropped) just after its connection broke leaves
/// the line all the same: its leave meets the dropped connection and is sent once more on a new
/// one. Sent only once, it would leave its place in line — a waiter nobody is — for the next
/// release to skip, and the line key alive until the place's lease ran out.
#[test]
fn a_waiter_that_gives_up_after_its_connection_broke_leaves_the_line() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let main = test_support::runtime(2);
    let name = "dropped:leave-after-cut";
    let key = format!("lock:{name}");
    main.block_on(async {
        let holder = test_support::connect(&server).await;
        let leaver = LockManager::connect(&proxy.url()).await.unwrap();
        let options = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .timeout(Duration::from_secs(20));
        let guard = holder.acquire(name, &options).await.unwrap();
        let leaving = {
            let (leaver, options) = (leaver.clone(), options.clone());
            tokio::spawn(async move { leaver.acquire(name, &options).await })
        };
        test_support::eventually(Duration::from_secs(5), "the waiter in line", || {
            line_len(&server, name) == 1
        })
        .await;
        // Just after a renewal, so that the leave, not the next renewal, is what meets the cut.
        tokio::time::sleep(Duration::from_millis(150)).await;
        proxy.cut();
        leaving.abort();
        assert!(leaving.await.unwrap_err().is_cancelled());
        let started = Instant::now();
        test_support::eventually(Duration::from_secs(2), "the place to be left", || {
            line_len(&server, name) == 0
        })
        .await;
        eprintln!("place left {:?} after the cut", started.elapsed());
        assert_eq!(server.get(&key).as_deref(), Some(guard.token()));
        guard.release().await.unwrap();
        assert!(!server.exists(&key));
    });
}

// A first try whose reply was lost with its connection is sent once more; what that second
// send answers — an error included — is the answer the caller gets, as without the fault.

/// A manager through a proxy to a server of its own, the scripts of plain and fenced locks
/// loaded (an `EVALSHA` answered `NOSCRIPT` takes nothing).
async fn proxied_with_scripts_loaded() -> (RedisServer, FaultProxy, LockManager) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let manager = LockManager::connect(&proxy.url()).await.unwrap();
    let ttl = LockOptions::new().ttl(Duration::from_secs(30));
    for options in [ttl.clone(), ttl.fencing(true)] {
        let warm = manager
            .acquire("resend-answer-warm", &options)
            .await
            .unwrap();
        warm.release().await.unwrap();
    }
    (server, proxy, manager)
}

/// `try_acquire(name, options)` as it is, then once more with its first send's reply lost
/// (which the proxy checks it was).
async fn tried_then_tried_with_the_reply_lost(
    proxy: &FaultProxy,
    manager: &LockManager,
    name: &str,
    options: &LockOptions,
) -> [Result<Option<distlock::LockGuard>, LockError>; 2] {
    let plain = manager.try_acquire(name, options).await;
    proxy.lose_next_reply_to(&keys::default_key(name));
    let tried = manager.try_acquire(name, options).await;
    assert_eq!(proxy.replies_lost(), 1);
    [plain, tried]
}

/// A mutex try on a name held as a semaphore: `Config`, the misuse. With the first `SET`'s
/// reply lost, the resend (the acquire script) answers WRONGTYPE, made into `Config`.
#[tokio::test(flavor = "current_thread")]
async fn a_mutex_try_on_a_semaphore_whose_reply_was_lost_is_still_refused_as_misuse() {
    let (_server, proxy, manager) = proxied_with_scripts_loaded().await;
    let ttl = LockOptions::new().ttl(Duration::from_secs(30));
    let _permit = manager
        .acquire("resend-answer-sem", &ttl.clone().permits(3))
        .await
        .unwrap();
    let [plain, tried] =
        tried_then_tried_with_the_reply_lost(&proxy, &manager, "resend-answer-sem", &ttl).await;
    assert!(matches!(plain, Err(LockError::Config(_))), "{plain:?}");
    assert!(
        matches!(tried, Err(LockError::Config(_))),
        "after a lost reply: {tried:?}"
    );
}

/// A fenced writer's try on a name readers hold: `Ok(None)` (busy). With the first send's
/// reply lost, the resend answers WRONGTYPE, which must still lead to the readers' line.
#[tokio::test(flavor = "current_thread")]
async fn a_fenced_writer_try_on_readers_whose_reply_was_lost_is_still_busy() {
    let (_server, proxy, manager) = proxied_with_scripts_loaded().await;
    let ttl = LockOptions::new().ttl(Duration::from_secs(30));
    let _reader = manager
        .acquire("resend-answer-rw", &ttl.clone().mode(LockMode::Read))
        .await
        .unwrap();
    let fenced = ttl.fencing(true);
    let [plain, tried] =
        tried_then_tried_with_the_reply_lost(&proxy, &manager, "resend-answer-rw", &fenced).await;
    assert!(
        matches!(plain, Ok(None)),
        "{:?}",
        plain.map(|g| g.is_some())
    );
    assert!(
        matches!(tried, Ok(None)),
        "after a lost reply: {:?}",
        tried.map(|g| g.is_some())
    );
}

/// A fenced try on a lock key of another type (a list): the WRONGTYPE that names the key.
#[tokio::test(flavor = "current_thread")]
async fn a_fenced_try_on_a_key_of_another_type_whose_reply_was_lost_still_names_it() {
    let (server, proxy, manager) = proxied_with_scripts_loaded().await;
    let fenced = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .fencing(true);
    let _: () = redis::cmd("RPUSH")
        .arg("lock:resend-answer-list")
        .arg("x")
        .query(&mut server.conn())
        .unwrap();
    let [plain, tried] =
        tried_then_tried_with_the_reply_lost(&proxy, &manager, "resend-answer-list", &fenced).await;
    assert!(
        plain.as_ref().is_err(),
        "a list at the lock key: {:?}",
        plain.map(|g| g.is_some())
    );
    let same = match (&plain, &tried) {
        (Err(a), Err(b)) => a.to_string() == b.to_string(),
        _ => false,
    };
    assert!(
        same,
        "plain {:?} vs after a lost reply {:?}",
        plain.map(|g| g.is_some()),
        tried.map(|g| g.is_some())
    );
}
