//! Bad input at run time: names, key prefixes, URLs, durations and servers a
//! careless or unlucky caller hands the manual API. Every one ends in a typed result — the lock
//! works on exactly the key named, or a `LockError::Config` / `LockError::Redis` whose message
//! says what is wrong — promptly, never a panic or a hang; and no lock ever touches the keys of
//! another, whatever the names and prefixes.

use std::fmt::Write as _;
use std::io::Write;
use std::net::TcpListener;
use std::sync::Mutex;
use std::time::Duration;

use distlock::{distributed_lock, LockError, LockManager, LockOptions};
use test_support::{keys, RedisCluster, RedisServer};
use tokio::time::Instant;

const YEAR: Duration = Duration::from_secs(365 * 24 * 60 * 60);

fn options() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(10))
        .timeout(Duration::from_secs(1))
}

#[distributed_lock(key = "user:{name}", ttl = 10, timeout = 1, guard = lock)]
async fn locked_for(name: &str) -> Result<String, LockError> {
    Ok(lock.key().to_owned())
}

/// The same hostile names held as a semaphore: a mutex's one attempt on each is refused as a
/// misuse, an operator's `force_release` breaks its permits (its marks written beside the key,
/// whatever braces the name has) and each holder is told why, and no key is left without an
/// expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_names_held_as_a_semaphore_are_refused_to_a_mutex_and_broken_by_force() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let megabyte = "k".repeat(1 << 20);
    let names: Vec<&str> = vec![
        &megabyte,
        "a\0b",
        "a\r\nSET injected 1\r\n",
        "{",
        "}",
        "{}",
        "}{",
        "x}y{z",
        "{tag}rest",
        "{lock:}:distlock:releases",
        "鍵🔒",
    ];
    let permits = options().permits(2).ttl(Duration::from_secs(60));
    for name in &names {
        let len = name.len();
        let first = manager.acquire(name, &permits).await.unwrap();
        let second = manager.acquire(name, &permits).await.unwrap();
        let tried = manager.try_acquire(name, &options()).await;
        assert!(
            matches!(tried, Err(LockError::Config(_))),
            "a mutex's try on a semaphore named by {len} bytes: {:?}",
            tried.map(|guard| guard.is_some())
        );
        let info = manager.inspect(name).await.unwrap().expect("held");
        assert!(manager.force_release(&info).await.unwrap(), "{len} bytes");
        for told in [
            first.extend(Duration::from_secs(60)).await,
            second.release().await,
        ] {
            assert!(
                matches!(
                    told,
                    Err(LockError::Lost {
                        cause: distlock::LostCause::ForceReleased,
                        ..
                    })
                ),
                "{len} bytes: {told:?}"
            );
        }
        drop(first);
    }
    assert!(!server.exists("injected"), "names are data, never commands");
    assert_eq!(
        server.keys("lock:*"),
        Vec::<String>::new(),
        "every semaphore broken"
    );
    for key in server.keys("*") {
        assert!(server.pttl(&key) > 0, "{key:.80?} has no expiry");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_binary_and_unicode_names_lock_exactly_the_key_they_name() {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let megabyte = "k".repeat(1 << 20);
    let megabyte_unicode = "鍵".repeat((1 << 20) / 3);
    let names: Vec<&str> = vec![
        &megabyte,
        &megabyte_unicode,
        "\0",
        "a\0b",
        "a",
        "a\r\nSET injected 1\r\n",
        "\"'; return 1 --",
        " ",
        "\t\x7f\x1b[31m",
        "*",
        "?[a-z]",
        "{",
        "}",
        "{}",
        "{tag}rest",
        "ключ",
        "鍵🔒",
        "e\u{301}", // e + combining acute: a different key from the precomposed "é"
        "é",
        "\u{202e}txt.exe",
        "\u{feff}bom",
    ];
    let fenced = options().fencing(true);
    let mut guards = Vec::new();
    for name in &names {
        let started = Instant::now();
        let guard = manager
            .acquire(name, &fenced)
            .await
            .unwrap_or_else(|e| panic!("name of {} bytes: {e}", name.len()));
        let key = format!("lock:{name}");
        assert_eq!(guard.key(), key);
        assert_eq!(
            server.get(&key).as_deref(),
            Some(guard.token()),
            "Redis holds exactly the key named ({} bytes)",
            name.len()
        );
        assert_eq!(guard.fencing_token(), Some(1));
        guard.extend(Duration::from_secs(20)).await.unwrap();
        assert!(server.pttl(&key) > 10_000);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{} bytes",
            name.len()
        );
        guards.push(guard);
    }
    // Every name is its own lock: all are held at once, and each refuses a second holder.
    // (Helper keys start with `{`, so `lock:*` matches the lock keys alone.)
    assert_eq!(server.keys("lock:*").len(), names.len());
    for name in &names {
        assert!(manager
            .try_acquire(name, &options())
            .await
            .unwrap()
            .is_none());
    }
    assert!(!server.exists("injected"), "names are data, never commands");
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert_eq!(
        server.keys("lock:*"),
        Vec::<String>::new(),
        "every lock released"
    );
    let counters = server.keys("*");
    assert_eq!(
        counters.len(),
        names.len(),
        "one fencing counter per lock stays"
    );
    for counter in &counters {
        let (word, lock) = test_support::names::helper_owner(counter)
            .unwrap_or_else(|| panic!("{counter:?} is not a helper key"));
        assert_eq!(word, "fence", "{counter:?}");
        assert!(lock.starts_with("lock:"), "{counter:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_puts_a_binary_or_huge_name_into_the_key_unchanged() {
    if !test_support::in_own_process(
        module_path!(),
        "the_attribute_puts_a_binary_or_huge_name_into_the_key_unchanged",
    ) {
        return;
    }
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    distlock::init_with(manager).unwrap();
    let megabyte = "k".repeat(1 << 20);
    for name in ["鍵\0{x}", "a\r\nb", &megabyte] {
        assert_eq!(locked_for(name).await.unwrap(), format!("lock:user:{name}"));
    }
    assert!(!server.exists("lock:user:a\r\nb"), "released");
}

#[tokio::test]
async fn malformed_urls_are_config_errors_that_show_the_form_and_hide_the_password() {
    let config = [
        "nope",
        "http://x",
        "",
        "redis://",
        "redis:///",
        "redis://127.0.0.1:notaport",
        "redis://127.0.0.1:99999",
        "redis://127.0.0.1:6379/notadb",
        "redis://[::1",
        "redis://user:pw@",
    ];
    // (Without the `tls` feature a rediss:// URL is a configuration error too, with a message of
    // its own: `without_the_tls_feature_a_rediss_url_names_the_feature` in tests/behaviour.)
    for url in config {
        let started = Instant::now();
        let error = LockManager::connect(url).await.unwrap_err();
        let message = error.to_string();
        eprintln!("{url:?}: {message}");
        assert!(matches!(error, LockError::Config(_)), "{url:?}: {error:?}");
        assert!(message.contains("is not a Redis URL"), "{message}");
        assert!(
            message.contains("redis://[user:password@]host"),
            "{message}"
        );
        assert!(!message.contains(":pw@"), "a password leaked: {message}");
        assert!(started.elapsed() < Duration::from_millis(100));
    }
}

#[tokio::test]
async fn unreachable_urls_are_redis_errors_within_bounds() {
    let server = RedisServer::start();
    let unreachable = [
        format!("redis://127.0.0.1:{}/", test_support::free_port()),
        "redis+unix:///nonexistent/redis.sock".to_owned(),
        format!("redis://127.0.0.1:{}/99999", server.port()), // no such database
    ];
    for url in unreachable {
        let started = Instant::now();
        let error = LockManager::connect(&url).await.unwrap_err();
        eprintln!("{url:?}: {error} ({:?})", started.elapsed());
        assert!(matches!(error, LockError::Redis(_)), "{url:?}: {error:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}

/// A server and a manager connected to it, for the duration tests below.
async fn server_and_manager() -> (RedisServer, LockManager) {
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    (server, manager)
}

/// A zero, sub-millisecond or over-a-year ttl, and an over-a-year timeout, are `Config` errors
/// from `acquire` and `try_acquire`, refused before any Redis call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_and_enormous_ttls_and_timeouts_are_config_errors_that_never_reach_redis() {
    let (server, manager) = server_and_manager().await;
    let bad_ttls = [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_micros(999),
        YEAR + Duration::from_nanos(1),
        Duration::from_secs(u64::MAX),
        Duration::MAX,
    ];
    for ttl in bad_ttls {
        let bad = options().ttl(ttl);
        for result in [
            manager.acquire("d", &bad).await.map(drop),
            manager.try_acquire("d", &bad).await.map(drop),
        ] {
            match result {
                Err(LockError::Config(message)) => {
                    assert!(message.contains("ttl"), "{message}");
                }
                other => panic!("ttl {ttl:?}: expected a Config error, got {other:?}"),
            }
        }
    }
    for timeout in [YEAR + Duration::from_nanos(1), Duration::MAX] {
        match manager.acquire("d", &options().timeout(timeout)).await {
            Err(LockError::Config(message)) => assert!(message.contains("timeout"), "{message}"),
            other => panic!("timeout {timeout:?}: expected a Config error, got {other:?}"),
        }
    }
    assert_eq!(
        server.keys("*"),
        Vec::<String>::new(),
        "a rejected setting never reaches Redis"
    );
}

/// On a held lock: a bad extension is refused before any Redis call and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_extension_is_refused_and_changes_nothing() {
    let (server, manager) = server_and_manager().await;
    let guard = manager.acquire("d", &options()).await.unwrap();
    for ttl in [Duration::ZERO, Duration::from_micros(500), Duration::MAX] {
        match guard.extend(ttl).await {
            Err(LockError::Config(message)) => assert!(message.contains("ttl"), "{message}"),
            other => panic!("extend({ttl:?}): expected a Config error, got {other:?}"),
        }
    }
    assert!(guard.is_held().await.unwrap());
    assert!(server.pttl("lock:d") > 5_000);
    guard.release().await.unwrap();
}

/// A zero or enormous `connect_timeout` or `response_timeout` is a `Config` error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_and_enormous_builder_timeouts_are_config_errors() {
    let server = RedisServer::start();
    for (name, builder) in [
        (
            "connect_timeout",
            LockManager::builder(server.url()).connect_timeout(Duration::ZERO),
        ),
        (
            "connect_timeout",
            LockManager::builder(server.url()).connect_timeout(Duration::MAX),
        ),
        (
            "response_timeout",
            LockManager::builder(server.url()).response_timeout(Duration::ZERO),
        ),
        (
            "response_timeout",
            LockManager::builder(server.url()).response_timeout(Duration::MAX),
        ),
    ] {
        match builder.connect().await {
            Err(LockError::Config(message)) => assert!(message.contains(name), "{message}"),
            other => panic!("{name}: expected a Config error, got {other:?}"),
        }
    }
}

/// The limits themselves are accepted: a 365-day ttl and timeout, a 1 ms ttl, a zero timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limits_themselves_are_accepted() {
    let (server, manager) = server_and_manager().await;
    let year = manager
        .acquire("year", &options().ttl(YEAR).timeout(YEAR))
        .await
        .unwrap();
    let pttl = server.pttl("lock:year");
    assert!(pttl > 31_535_000_000 && pttl <= 31_536_000_000, "{pttl}");
    year.extend(YEAR).await.unwrap();
    let started = Instant::now();
    let busy = manager
        .acquire("year", &options().timeout(Duration::ZERO))
        .await;
    assert!(matches!(busy, Err(LockError::Timeout { .. })), "{busy:?}");
    assert!(started.elapsed() < Duration::from_secs(1));
    year.release().await.unwrap();
    let blink = manager
        .acquire("blink", &options().ttl(Duration::from_millis(1)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(matches!(blink.release().await, Err(LockError::Lost { .. })));
}

/// `auto_extend` with a ttl too short to keep: the watchdog gives the lock up, no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_extend_with_a_ttl_too_short_to_keep_gives_the_lock_up_without_panicking() {
    let (_server, manager) = server_and_manager().await;
    for millis in [1, 2, 3, 20] {
        let guard = manager
            .acquire(
                "tiny",
                &options()
                    .ttl(Duration::from_millis(millis))
                    .auto_extend(true),
            )
            .await
            .unwrap();
        if millis < 20 {
            tokio::time::timeout(Duration::from_secs(1), guard.lost())
                .await
                .unwrap_or_else(|_| panic!("ttl {millis} ms: the watchdog gave the lock up"));
        } else {
            // 20 ms can be kept (extended every ~7 ms) on an idle machine, or lost on a busy one.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let released = guard.release().await;
        assert!(
            matches!(released, Ok(()) | Err(LockError::Lost { .. })),
            "ttl {millis} ms: {released:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_scripts_gives_a_typed_noperm_error_promptly() {
    let server = RedisServer::start_with(&[
        "--user", "default", "on", "nopass", "~*", "&*", "+@all", "-eval", "-evalsha",
    ]);
    let check = |what: &str, result: Result<(), LockError>, took: Duration, bound: Duration| {
        let error = result.expect_err(what);
        let message = error.to_string();
        eprintln!("{what} ({took:?}): {message}");
        assert!(matches!(error, LockError::Redis(_)), "{what}: {error:?}");
        assert!(message.contains("NoPerm"), "{what}: {message}");
        assert!(message.contains("'evalsha'"), "{what}: {message}");
        assert!(message.contains("lacks a permission"), "{what}: {message}");
        assert!(took < bound, "{what} took {took:?}");
    };

    // `connect` runs the release script once on a probe key: a user who may not run scripts is
    // told at startup, not at the first release.
    let started = Instant::now();
    let result = LockManager::connect(&server.url()).await.map(drop);
    check("connect", result, started.elapsed(), Duration::from_secs(1));

    // Permissions revoked while a lock is held: extend and release fail with the cause, the lock
    // is left to its ttl, and everything works again once they are granted back.
    let server = RedisServer::start();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let guard = manager.acquire("acl", &options()).await.unwrap();
    let token = guard.token().to_owned();
    let acl = |rules: &[&str]| {
        let () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("default")
            .arg(rules)
            .query(&mut server.conn())
            .unwrap();
    };
    acl(&["-eval", "-evalsha"]);
    let started = Instant::now();
    let result = guard.extend(Duration::from_secs(10)).await;
    check("extend", result, started.elapsed(), Duration::from_secs(1));
    assert!(guard.is_held().await.unwrap(), "GET is still allowed");
    let started = Instant::now();
    let result = guard.release().await;
    check("release", result, started.elapsed(), Duration::from_secs(1));
    assert_eq!(server.get("lock:acl"), Some(token), "left to its ttl");
    acl(&["+@all"]);
    let again = manager.acquire("acl2", &options()).await.unwrap();
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_counter_that_cannot_be_incremented_fails_the_acquire_and_leaves_nothing_held() {
    let fenced = options().fencing(true);
    // A corrupt counter (something else wrote the key), then an ACL that denies INCR inside
    // scripts: the lock script fails after its SET, and must undo it.
    let corrupt = RedisServer::start();
    corrupt.set(&keys::named("ledger").fence(), "not a number");
    let no_incr = RedisServer::start_with(&[
        "--user", "default", "on", "nopass", "~*", "&*", "+@all", "-incr",
    ]);
    for (server, cause) in [
        (&corrupt, "not an integer"),
        (&no_incr, "may not run a command of the lock scripts"),
    ] {
        let manager = LockManager::connect(&server.url()).await.unwrap();
        let started = Instant::now();
        let tried = manager.try_acquire("ledger", &fenced).await.map(drop);
        let took = started.elapsed();
        // A timeout far above the bound below: an error that is retried instead of returned at
        // once would take all of it.
        let patient = fenced.clone().timeout(Duration::from_secs(10));
        let waited = manager.acquire("ledger", &patient).await.map(drop);
        let took_waiting = started.elapsed().checked_sub(took).unwrap();
        for (what, result, took) in [
            ("try_acquire", tried, took),
            ("acquire (timeout 10 s)", waited, took_waiting),
        ] {
            eprintln!("{what} ({took:?}): {result:?}");
            let error = result.expect_err(what);
            assert!(matches!(error, LockError::Redis(_)), "{what}: {error:?}");
            assert!(error.to_string().contains(cause), "{what}: {error}");
            assert!(took < Duration::from_secs(3), "{what} took {took:?}");
        }
        assert!(
            !server.exists("lock:ledger"),
            "the failed acquisition left the lock held"
        );
        // Without fencing the same lock works.
        let guard = manager.acquire("ledger", &options()).await.unwrap();
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_key_that_holds_another_type_is_an_error_that_says_so() {
    let server = RedisServer::start();
    // Something else in the application stores a list under the lock's key name.
    let () = redis::cmd("RPUSH")
        .arg("lock:jobs")
        .arg("job-1")
        .query(&mut server.conn())
        .unwrap();
    let manager = LockManager::connect(&server.url()).await.unwrap();
    let started = Instant::now();
    let error = manager
        .acquire("jobs", &options().timeout(Duration::from_secs(5)))
        .await
        .map(drop)
        .expect_err("a list is not a free lock");
    let took = started.elapsed();
    eprintln!("acquire ({took:?}): {error}");
    assert!(matches!(error, LockError::Redis(_)), "{error:?}");
    assert!(
        error.to_string().contains("key prefix of their own"),
        "{error}"
    );
    assert!(
        took < Duration::from_secs(3),
        "reported at once, not at the 5 s deadline: {took:?}"
    );
    let kind: String = redis::cmd("TYPE")
        .arg("lock:jobs")
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(kind, "list", "the application's list is untouched");
}

/// A TCP server on a free port that handles every connection with `serve` on its own thread.
fn fake_server(serve: fn(std::net::TcpStream)) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve(stream));
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_redis_gives_an_error_not_a_hang() {
    let http = fake_server(|mut stream| {
        let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
    });
    let silent = fake_server(|stream| {
        std::thread::sleep(Duration::from_secs(30));
        drop(stream);
    });
    let hangs_up = fake_server(drop);
    for (what, port, hint) in [
        (
            "an HTTP server",
            http,
            "does not speak the Redis protocol; check the host and port",
        ),
        (
            "a server that never answers",
            silent,
            "check that Redis is running and reachable",
        ),
        (
            "a server that hangs up at once",
            hangs_up,
            "check that Redis is running and reachable",
        ),
    ] {
        let started = Instant::now();
        let url = format!("redis://127.0.0.1:{port}/");
        let connect = LockManager::connect(&url);
        let result = tokio::time::timeout(Duration::from_secs(15), connect)
            .await
            .unwrap_or_else(|_| panic!("connecting to {what} hung"));
        let took = started.elapsed();
        let error = result.expect_err(what);
        let message = error.to_string();
        eprintln!("{what} ({took:?}): {message}");
        assert!(matches!(error, LockError::Redis(_)), "{what}: {error:?}");
        assert!(message.contains(hint), "{what}: {message}");
        // The default connect timeout is 2 s, with one reconnect attempt.
        assert!(took < Duration::from_secs(10), "{what}: took {took:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Lock names that look like distlock's own helper keys, and key prefixes
// ---------------------------------------------------------------------------------------------

/// A hand-written lock (or another application) holds `{t}:distlock:waiters` and
/// `{t}:distlock:fence`, the names helpers of the lock `{t}` would get if its key were simply put
/// in braces; distlock's waiting, releasing and fencing on `{t}` must never touch them. Names
/// of that shape, reachable with an empty key prefix, are refused; `a` and `{a}` are two locks
/// with two fencing counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_of_the_helper_shape_are_refused_and_no_lock_touches_another_locks_keys() {
    let server = RedisServer::start();
    let bare = || LockManager::builder(server.url()).key_prefix("").connect();
    let manager = bare().await.unwrap();
    let other_process = bare().await.unwrap();
    let foreign = [
        ("{t}:distlock:waiters", "foreign-1"),
        ("{t}:distlock:fence", "foreign-2"),
    ];
    for (key, token) in foreign {
        server.set_px(key, token, 60_000);
    }
    let untouched = |what: &str| {
        for (key, token) in foreign {
            assert_eq!(
                server.get(key).as_deref(),
                Some(token),
                "{what} changed {key}, a lock distlock does not hold"
            );
            assert!(server.pttl(key) > 50_000, "{what} changed the ttl of {key}");
        }
    };

    // `{t}` contended: the waiter marks its wait, the release wakes it.
    let holder = manager
        .acquire("{t}", &options())
        .await
        .expect("the lock {t}");
    let keys_before = server.keys("*").len();
    let waiter = tokio::spawn(async move { other_process.acquire("{t}", &options()).await });
    test_support::eventually(Duration::from_secs(5), "the waiter's mark", || {
        server.keys("*").len() > keys_before
            || server.get(foreign[0].0).as_deref() != Some(foreign[0].1)
    })
    .await;
    untouched("a waiter on {t}");
    holder.release().await.expect("release of {t}");
    untouched("the release of {t}");
    let second: Option<String> = redis::cmd("SET")
        .arg(foreign[0].0)
        .arg("intruder")
        .arg("NX")
        .arg("PX")
        .arg(60_000)
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(second, None, "a second holder got into {}", foreign[0].0);
    let handed = waiter.await.unwrap().expect("the waiter is handed {t}");
    handed.release().await.unwrap();

    // Fencing on `{t}` counts in a key of its own.
    let fenced = options().fencing(true);
    let guard = manager
        .acquire("{t}", &fenced)
        .await
        .expect("a fenced acquire of {t}");
    assert_eq!(guard.fencing_token(), Some(1));
    guard.release().await.unwrap();
    untouched("fencing on {t}");

    // `a` and `{a}` (the same tag, hence the same slot) are two locks with two counters.
    for name in ["a", "{a}"] {
        let guard = manager.acquire(name, &fenced).await.unwrap();
        assert_eq!(guard.key(), name);
        assert_eq!(
            guard.fencing_token(),
            Some(1),
            "{name}: its first fencing token (a counter shared with the other lock gives 2)"
        );
        guard.release().await.unwrap();
    }

    // The names of that shape are refused, so no lock key can ever be a helper key; so is the
    // empty key. With the default prefix they are ordinary names.
    for name in [
        "{t}:distlock:waiters",
        "{t}:distlock:fence",
        "{}:distlock:waiters",
        "{t}:distlock:other:{t}",
        "",
    ] {
        for result in [
            manager.acquire(name, &options()).await.map(drop),
            manager.try_acquire(name, &options()).await.map(drop),
        ] {
            let error = result.expect_err(name);
            let LockError::Config(message) = &error else {
                panic!("{name:?}: expected LockError::Config, got {error:?}");
            };
            assert!(
                message.contains("use another lock name or key prefix"),
                "{name:?}: {message}"
            );
            let why = if name.is_empty() {
                "empty"
            } else {
                "reserved for distlock's helper keys"
            };
            assert!(message.contains(why), "{name:?}: {message}");
        }
        let default = LockManager::connect(&server.url()).await.unwrap();
        let guard = default
            .try_acquire(name, &options())
            .await
            .unwrap()
            .expect("free under the default prefix");
        assert_eq!(guard.key(), format!("lock:{name}"));
        guard.release().await.unwrap();
    }
    untouched("the refused names");
}

/// The manager's connect probe lives under the key prefix (so an ACL narrowed to the prefix
/// allows it): it must work for every prefix, braces included; a prefix under which every lock
/// key would have the helper shape is refused when connecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_prefix_connects_but_one_that_reserves_every_key_is_refused() {
    let server = RedisServer::start();
    for prefix in [
        "",
        "{",
        "}",
        "{}",
        "{x}",
        "{x}:",
        "{x}:d",
        "{x}:distlock",
        "a}",
        "{a}}",
        "x}{y",
    ] {
        let manager = LockManager::builder(server.url())
            .key_prefix(prefix)
            .connect()
            .await
            .unwrap_or_else(|error| panic!("prefix {prefix:?}: {error}"));
        let guard = manager
            .acquire("job", &options().fencing(true))
            .await
            .unwrap_or_else(|error| panic!("prefix {prefix:?}: {error}"));
        assert_eq!(guard.key(), format!("{prefix}job"));
        assert_eq!(guard.fencing_token(), Some(1));
        guard.release().await.unwrap();
    }
    for prefix in ["{x}:distlock:", "{x}:distlock:waiters", "{}:distlock:x"] {
        let error = LockManager::builder(server.url())
            .key_prefix(prefix)
            .connect()
            .await
            .expect_err(prefix);
        let LockError::Config(message) = &error else {
            panic!("{prefix:?}: expected LockError::Config, got {error:?}");
        };
        assert!(
            message.contains(&format!("key prefix `{prefix}`")),
            "{message}"
        );
        assert!(
            message.contains("reserved for distlock's helper keys"),
            "{message}"
        );
    }
}

/// Every generated name under every prefix, held at once, contended and fenced: no two
/// distinct locks share a key (see `test_support::names::no_two_locks_share_a_key`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_two_locks_share_a_key_whatever_their_names_and_prefixes() {
    let server = RedisServer::start();
    let mut managers = Vec::new();
    for prefix in test_support::names::PREFIXES {
        let connect = || {
            LockManager::builder(server.url())
                .key_prefix(prefix)
                .response_timeout(test_support::names::PATIENT_RESPONSE)
                .connect()
        };
        managers.push((connect().await.unwrap(), connect().await.unwrap()));
    }
    test_support::names::no_two_locks_share_a_key(
        &managers,
        || server.keys("*"),
        |key| server.get(key),
        None,
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Passwords never shown
// ---------------------------------------------------------------------------------------------

/// The secret every password below contains; no output may show it, in any case or encoding.
const SECRET: &str = "S3CR3T";
/// A password with every character that can end a URL's userinfo early: `/`, `@`, `#`, `?`.
const AWKWARD_PASSWORD: &str = "S3CR3T/p@ss#w?rd";
/// The same, percent-encoded for a URL.
const AWKWARD_PASSWORD_ENCODED: &str = "S3CR3T%2Fp%40ss%23w%3Frd";

/// Panics if `text` shows the secret: as written, in another case, or percent-encoded.
fn assert_hidden(what: &str, text: &str) {
    let lower = text.to_ascii_lowercase();
    assert!(
        !lower.contains(&SECRET.to_ascii_lowercase()) && !lower.contains("%53%33cr3t"),
        "{what} shows the password: {text}"
    );
}

/// Every `tracing` event and span field of the process, as text.
static TRACED: Mutex<String> = Mutex::new(String::new());

struct RecordAll;

struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}

impl tracing::Subscriber for RecordAll {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut traced = TRACED.lock().unwrap();
        let _ = write!(traced, "\nspan {}", span.metadata().name());
        span.record(&mut Fields(&mut traced));
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        values.record(&mut Fields(&mut TRACED.lock().unwrap()));
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut traced = TRACED.lock().unwrap();
        traced.push_str("\nevent");
        event.record(&mut Fields(&mut traced));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The `Debug` of a builder of each kind for `url`, and the errors their `connect` returns.
async fn builder_outputs(url: &str) -> Vec<(String, String)> {
    let quick = Duration::from_millis(500);
    let builders = [
        ("builder", LockManager::builder(url)),
        (
            "cluster builder",
            LockManager::cluster_builder(&[url, "redis://127.0.0.1:1"]),
        ),
        (
            "redlock builder",
            LockManager::redlock_builder(&[url, url, url]),
        ),
        // The URL is not a sentinel's: the lookup fails, and its error must hide the password.
        (
            "sentinel builder",
            LockManager::sentinel_builder(&[url], "service").master_login("app", SECRET),
        ),
    ];
    let mut outputs = Vec::new();
    for (kind, builder) in builders {
        outputs.push((format!("Debug of the {kind}"), format!("{builder:?}")));
        let connecting = builder
            .connect_timeout(quick)
            .response_timeout(quick)
            .connect();
        match tokio::time::timeout(Duration::from_secs(10), connecting).await {
            Ok(Ok(manager)) => outputs.push((
                format!("Debug of the {kind}'s manager"),
                format!("{manager:?}"),
            )),
            Ok(Err(error)) => {
                outputs.push((format!("the {kind}'s error"), error.to_string()));
                outputs.push((format!("Debug of the {kind}'s error"), format!("{error:?}")));
            }
            Err(elapsed) => panic!("connecting the {kind} for {url} hung: {elapsed}"),
        }
    }
    outputs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_url_form_shows_its_password_anywhere() {
    if !test_support::in_own_process(module_path!(), "no_url_form_shows_its_password_anywhere") {
        return;
    }
    tracing::subscriber::set_global_default(RecordAll).unwrap();
    let sockets = test_support::unique_temp_dir("sockets");
    let socket = sockets.join("redis.sock");
    let socket_path = socket.to_str().unwrap();
    let server = RedisServer::start_with(&[
        "--user",
        "app",
        "on",
        &format!(">{AWKWARD_PASSWORD}"),
        "~*",
        "&*",
        "+@all",
        "--unixsocket",
        socket_path,
        "--unixsocketperm",
        "700",
    ]);
    let (port, refused) = (server.port(), test_support::free_port());

    // Malformed, unreachable or refused: every form a password can take in a URL.
    let failing = [
        format!("redis://app:{SECRET}@127.0.0.1:{refused}/"),
        format!("redis://:{SECRET}@127.0.0.1:{refused}"),
        format!("redis://{SECRET}@127.0.0.1:{refused}"),
        format!("REDIS://APP:{SECRET}@127.0.0.1:{refused}"),
        format!("valkey://app:{SECRET}@127.0.0.1:{refused}"),
        format!("rediss://app:{SECRET}@127.0.0.1:{refused}"),
        format!("redis://app:pa/ss{SECRET}@127.0.0.1:{refused}"),
        format!("redis://app:12/{SECRET}@127.0.0.1:{refused}"),
        format!("redis://app:p@ss{SECRET}@127.0.0.1:{refused}"),
        format!("redis://app:p#ss{SECRET}@127.0.0.1:{refused}"),
        format!("redis://app:12#{SECRET}@127.0.0.1:{refused}"),
        format!("redis://app:p?ss{SECRET}@127.0.0.1:{refused}"),
        format!("redis://app:pa ss {SECRET}@127.0.0.1:{refused}"),
        format!("redis://app:{SECRET}@[::1]:{refused}/0"),
        format!("redis://app:%53%33CR3T%2F@127.0.0.1:{refused}"),
        format!("redis://app:{SECRET}@127.0.0.1:notaport"),
        format!("redis://app:{SECRET}@"),
        format!("redis://127.0.0.1:{refused}/?password={SECRET}"),
        format!("redis://127.0.0.1:{refused}/?PassWord={SECRET}&protocol=resp3"),
        format!("app:{SECRET}@127.0.0.1:{refused}"),
        format!("redis:app:{SECRET}@127.0.0.1:{refused}"),
        format!("redis+unix:///nonexistent/redis.sock?user=app&pass={SECRET}"),
        format!("redis+unix:///nonexistent/redis.sock?pass=pa&ss{SECRET}&db=0"),
        format!("redis+unix:///nonexistent/redis.sock?pa%73s={SECRET}"),
        format!("unix:///nonexistent/redis.sock?pass={SECRET}#x"),
        format!("unix:///nonexistent/redis.sock?pass=p@ss{SECRET}"),
        // A server that is up, with a wrong password.
        format!("redis://app:wrong{SECRET}@127.0.0.1:{port}/"),
        format!("redis+unix://{socket_path}?user=app&pass=wrong{SECRET}"),
    ];
    // The right password, percent-encoded as it must be: these connect.
    let working = [
        format!("redis://app:{AWKWARD_PASSWORD_ENCODED}@127.0.0.1:{port}/"),
        format!("redis+unix://{socket_path}?user=app&pass={AWKWARD_PASSWORD_ENCODED}"),
        format!("unix://{socket_path}?user=app&pass={AWKWARD_PASSWORD_ENCODED}&db=0"),
    ];
    let error = LockManager::connect(&format!("redis://app:pa/ss{SECRET}@127.0.0.1:{refused}"))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("%2F %3F %23 %40"),
        "a URL cut short by its password says how to write one: {error}"
    );
    for url in failing.iter().chain(&working) {
        for (what, output) in builder_outputs(url).await {
            eprintln!("{url} | {what}: {output}");
            assert_hidden(&format!("{what} for {url}"), &output);
        }
    }
    for url in &working {
        let manager = LockManager::connect(url)
            .await
            .unwrap_or_else(|error| panic!("{url}: {error}"));
        assert_hidden(
            &format!("Debug of the manager for {url}"),
            &format!("{manager:?}"),
        );
    }

    // A cluster whose nodes know the user.
    let cluster = RedisCluster::start(3, 0);
    for node in cluster.nodes() {
        let () = redis::cmd("ACL")
            .arg(&[
                "SETUSER",
                "app",
                "on",
                &format!(">{AWKWARD_PASSWORD}"),
                "~*",
                "&*",
                "+@all",
            ])
            .query(&mut node.conn())
            .unwrap();
    }
    let cluster_urls: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|node| {
            format!(
                "redis://app:{AWKWARD_PASSWORD_ENCODED}@127.0.0.1:{}/",
                node.port()
            )
        })
        .collect();
    let builder = LockManager::cluster_builder(&cluster_urls);
    assert_hidden("Debug of a cluster builder", &format!("{builder:?}"));
    let manager = builder.connect().await.expect("the cluster user logs in");
    assert_hidden("Debug of a cluster manager", &format!("{manager:?}"));
    let guard = manager.acquire("redacted", &options()).await.unwrap();
    guard.release().await.unwrap();

    // Locks taken, contended, and failing with Redis errors once the server is gone: every
    // tracing event on the way.
    let manager = LockManager::connect(&working[0]).await.unwrap();
    let held = manager.acquire("redacted", &options()).await.unwrap();
    let busy = manager
        .acquire("redacted", &options().timeout(Duration::from_millis(300)))
        .await
        .map(drop);
    assert!(matches!(busy, Err(LockError::Timeout { .. })), "{busy:?}");
    drop(held);
    server.kill();
    let error = manager
        .acquire("redacted", &options().timeout(Duration::from_millis(500)))
        .await
        .map(drop)
        .expect_err("the server is gone");
    assert_hidden("the error of a lost server", &format!("{error} {error:?}"));
    let traced = TRACED.lock().unwrap().clone();
    assert!(
        traced.contains("Redis error while acquiring"),
        "the subscriber saw the retries: {traced}"
    );
    assert_hidden("the tracing events", &traced);
    let _ = std::fs::remove_dir_all(&sockets);
}
