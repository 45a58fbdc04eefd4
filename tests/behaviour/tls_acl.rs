//! TLS (`rediss://`, the `tls` feature) and ACL users.
//!
//! - TLS, only with the `tls` feature: a TLS-only server with a certificate made by the test;
//!   a manager that trusts its CA locks and hands off with wake-ups; one that does not trust it
//!   (system roots, or another CA) is refused with an error that says it is the certificate;
//!   plain text on the TLS port fails within a bound. Without the feature a `rediss://` URL is a
//!   `Config` error naming the feature.
//! - ACL: a user with exactly the document's minimal ACL (read from docs/tls-acl.md, so the document
//!   cannot drift) can do everything distlock does, and every command of that list is used; a
//!   wrong password is an error that says so without showing the password.

use std::time::Duration;

use distlock::{LockError, LockManager, LockOptions};
use test_support::{keys, RedisServer};
use tokio::time::Instant;

/// The `+command` entries of the minimal ACL in docs/tls-acl.md:
/// `ACL SETUSER locker on >secret ~* &* -@all +evalsha ... +ping`.
fn documented_acl_commands() -> Vec<String> {
    let doc = include_str!("../../docs/tls-acl.md");
    let start = doc
        .find("ACL SETUSER locker")
        .expect("docs/tls-acl.md shows the minimal ACL as `ACL SETUSER locker ...`");
    let rule = &doc[start..];
    let rule = &rule[..rule.find('`').expect("the ACL rule ends with a backtick")];
    let commands: Vec<String> = rule
        .split_whitespace()
        .filter_map(|word| word.strip_prefix('+'))
        .map(str::to_owned)
        .collect();
    assert!(
        rule.contains("~*") && rule.contains("&*") && rule.contains("-@all"),
        "the document's rule allows every key and channel and no other command: {rule}"
    );
    assert!(
        !commands.is_empty(),
        "no commands in the document's rule: {rule}"
    );
    commands
}

/// Everything distlock does on the lock `name`, against `url` (as the ACL user): connect, a
/// fenced acquire, `is_held`, `extend`, a contended hand-off woken by the release,
/// `try_acquire`, release, and three managers taking turns (a join in one command). `tls_ca` is
/// the CA to trust for a `rediss://` URL.
async fn everything(url: &str, tls_ca: Option<Vec<u8>>, name: &str) {
    let connect = || {
        let builder = LockManager::builder(url);
        #[cfg(feature = "tls")]
        let builder = match &tls_ca {
            Some(pem) => builder.tls_root_certificate(pem.clone()),
            None => builder,
        };
        #[cfg(not(feature = "tls"))]
        assert!(tls_ca.is_none(), "TLS needs the `tls` feature");
        builder.connect()
    };
    let holder_manager = connect().await.expect("the user connects (PING)");
    let waiter_manager = connect().await.expect("a second manager connects");

    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(10))
        .fencing(true);
    let holder = holder_manager
        .acquire(name, &options)
        .await
        .expect("acquire (EVALSHA / SCRIPT LOAD, SET, INCR)");
    let first_fence = holder.fencing_token().expect("a fencing token");
    assert!(holder.is_held().await.expect("is_held (GET)"));
    holder
        .extend(Duration::from_secs(20))
        .await
        .expect("extend (GET, PEXPIRE)");

    // A waiter that renews its place in line twice (after a second: LPOS, LSET and its lease,
    // ZREMRANGEBYSCORE, ZADD; after two: ZSCORE, LINDEX) and then gives up (LRANGE, LREM).
    // It holds a lock of its own, in whose scope it also looks for a deadlock (its wait
    // records and the looks along the chain: EVALSHA, and inside them HGETALL, HSET).
    let own = waiter_manager
        .acquire(&format!("{name}:own"), &LockOptions::new())
        .await
        .expect("a lock of its own");
    let impatient = own
        .scope(waiter_manager.acquire(name, &options.clone().timeout(Duration::from_millis(2500))))
        .await;
    own.release().await.expect("release its own lock");
    assert!(
        matches!(impatient, Err(LockError::Timeout { .. })),
        "the lock is held: {impatient:?}"
    );

    let waiter = tokio::spawn({
        let (options, name) = (options.clone(), name.to_owned());
        async move {
            let started = Instant::now();
            // Contended: SUBSCRIBE, then a place in line (TIME, RPUSH, PEXPIRE, PTTL).
            let guard = waiter_manager.acquire(&name, &options).await;
            (guard, started.elapsed())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    let released_at = Instant::now();
    holder
        .release()
        .await
        .expect("release (GET, LPOP, SET, INCR, PUBLISH)");
    let (guard, waited) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter finished")
        .unwrap();
    let guard = guard.expect("the waiter gets the lock");
    let after_release = released_at.elapsed();
    eprintln!("{url:.8}...: waiter waited {waited:?}, got it {after_release:?} after the release");
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    assert!(
        after_release < Duration::from_secs(3),
        "with a 30 s ttl only a wake-up explains a hand-off within 3 s: {after_release:?}"
    );
    assert!(guard.fencing_token().expect("a fencing token") > first_fence);
    guard.release().await.expect("release");

    let again = holder_manager
        .try_acquire(name, &LockOptions::new())
        .await
        .expect("try_acquire")
        .expect("free after the release");
    again.release().await.expect("release");

    // Several locks taken together by one script, checked with one `MGET`.
    let together = holder_manager
        .acquire_all(
            &[format!("{name}:all:1"), format!("{name}:all:2")],
            &LockOptions::new(),
        )
        .await
        .expect("acquire_all (EVALSHA)");
    assert!(together.is_held().await.expect("is_held of several (MGET)"));
    together
        .release()
        .await
        .expect("release of several (EVALSHA)");

    let second_manager = connect().await.expect("another manager connects");
    let third_manager = connect().await.expect("a third manager connects");
    taking_turns(
        [&holder_manager, &second_manager, &third_manager],
        &format!("{name}:turns"),
    )
    .await;
}

/// Three managers taking turns on `name` until one of them asks again for the lock with a
/// place behind another waiter a moment ago and a line that is not empty: it joins with one
/// `RPUSHX` (see docs/protocol.md). Each step waits 200 ms for the previous join to land (the
/// ACL user may not read the line).
async fn taking_turns(managers: [&LockManager; 3], name: &str) {
    let [first, second, third] = managers;
    let options = LockOptions::new().timeout(Duration::from_secs(10));
    let settle = || tokio::time::sleep(Duration::from_millis(200));
    let queue = |manager: &LockManager| {
        let (manager, name, options) = (manager.clone(), name.to_owned(), options.clone());
        tokio::spawn(async move { manager.acquire(&name, &options).await })
    };
    // `first` holds; `second`, then `third` (behind `second`) wait.
    let held = first.acquire(name, &options).await.expect("free");
    let second_waiting = queue(second);
    settle().await;
    let third_waiting = queue(third);
    settle().await;
    held.release().await.expect("release (hand-off)");
    let held = second_waiting.await.unwrap().expect("handed over");
    held.release().await.expect("release (hand-off)");
    let held = third_waiting.await.unwrap().expect("handed over");
    // `third` holds, with a place behind another waiter a moment ago; `first` and `second`
    // queue, and `third` asks again after its release: `RPUSHX` behind `second`.
    let first_waiting = queue(first);
    settle().await;
    let second_waiting = queue(second);
    settle().await;
    held.release().await.expect("release (hand-off)");
    let third_waiting = queue(third);
    settle().await;
    for waiting in [first_waiting, second_waiting, third_waiting] {
        waiting
            .await
            .unwrap()
            .expect("served in turn")
            .release()
            .await
            .expect("release");
    }
}

// ---------------------------------------------------------------------------------------------
// ACL users (no TLS needed)
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_with_the_documented_minimal_acl_can_do_everything() {
    let server = RedisServer::start();
    let commands = documented_acl_commands();
    let allowed: Vec<&str> = commands.iter().map(String::as_str).collect();
    let url = server.add_acl_user("locker", "s3cret", &allowed);
    // Only the ACL user runs commands from here on (the helpers below only run INFO), so
    // the command statistics show what distlock needed. (On a server that counts `SCRIPT` as
    // one command, `command_count("script|load")` counts every SCRIPT subcommand: still only
    // the user's SCRIPT LOADs, the one subcommand of SCRIPT its ACL allows.)
    server.reset_stats();

    everything(&url, None, "everything").await;

    // The waiter unsubscribes in the background once it holds the lock.
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.command_count("unsubscribe") == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let unused: Vec<&str> = allowed
        .iter()
        .copied()
        .filter(|command| server.command_count(command) == 0)
        .collect();
    assert!(
        unused.is_empty(),
        "the document's minimal ACL allows commands distlock never ran: {unused:?} (list: {allowed:?})"
    );
    assert_eq!(
        server.keys("lock:*"),
        Vec::<String>::new(),
        "nothing left held"
    );
}

/// The URL of the ACL user `locker` on `server`, allowed the document's minimal ACL but the
/// commands `withheld`, each of which the document lists.
fn acl_user_without(server: &RedisServer, withheld: &[&str]) -> String {
    let commands = documented_acl_commands();
    for command in withheld {
        assert!(
            commands.iter().any(|listed| listed == command),
            "docs/tls-acl.md does not list `+{command}`"
        );
    }
    let allowed: Vec<&str> = commands
        .iter()
        .map(String::as_str)
        .filter(|command| !withheld.contains(command))
        .collect();
    server.add_acl_user("locker", "s3cret", &allowed)
}

/// Starts a server, runs [`everything`] (lock names `name`) as the ACL user of
/// [`acl_user_without`] `withheld`, and checks that no lock is left held; the server and the
/// user's URL, for the test's own checks.
async fn everything_without(withheld: &[&str], name: &str) -> (RedisServer, String) {
    let server = RedisServer::start();
    let url = acl_user_without(&server, withheld);
    everything(&url, None, name).await;
    assert_eq!(server.keys("lock:*"), Vec::<String>::new());
    (server, url)
}

/// A user whose ACL was written from an earlier minimal ACL, without `+rpushx` (the join in one
/// command of a process asking again): distlock joins with the acquire script instead, and
/// everything still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_without_rpushx_still_does_everything() {
    everything_without(&["rpushx"], "without-rpushx").await;
}

/// A user whose ACL was written before distlock kept a lease table beside each line (without
/// `+lindex +lpos +zadd +zscore +zremrangebyscore`): renewals look for their place in the line
/// instead, and everything still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_without_the_lease_table_still_does_everything() {
    let lease_table = ["lindex", "lpos", "zadd", "zscore", "zremrangebyscore"];
    let (server, _) = everything_without(&lease_table, "without-leases").await;
    assert!(
        server.keys(&keys::every("leases")).is_empty(),
        "a lease table was written without ZADD"
    );
}

/// A user whose ACL lacks `+exists`, which the release of a lock nobody waits for reads the
/// line with: everything still works, the manager learns of the refusal from its connect probe,
/// and its releases go to the full release script from then on instead of being refused once
/// per release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_without_exists_still_does_everything_and_stops_asking() {
    let (server, url) = everything_without(&["exists"], "without-exists").await;

    let manager = LockManager::connect(&url).await.expect("the user connects");
    let refused_after_connect = exists_refusals(&server);
    assert!(
        refused_after_connect > 0,
        "the connect probe's release asked for EXISTS and was refused"
    );
    for n in 0..5 {
        let guard = manager
            .acquire(&format!("without-exists:{n}"), &LockOptions::new())
            .await
            .expect("acquire");
        guard
            .release()
            .await
            .expect("the full release script releases it");
    }
    assert_eq!(
        exists_refusals(&server),
        refused_after_connect,
        "a release after the refusal asked for EXISTS again"
    );
    assert_eq!(server.keys("lock:*"), Vec::<String>::new());
}

/// How many times the server refused `EXISTS` to an ACL user, summed over `ACL LOG`.
fn exists_refusals(server: &RedisServer) -> u64 {
    let entries: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("ACL")
        .arg("LOG")
        .arg(1000)
        .query(&mut server.conn())
        .expect("ACL LOG");
    entries
        .iter()
        .filter(|entry| {
            entry.get("object").is_some_and(|object| {
                redis::from_redis_value_ref::<String>(object).is_ok_and(|object| object == "exists")
            })
        })
        .map(|entry| {
            entry
                .get("count")
                .and_then(|count| redis::from_redis_value_ref::<u64>(count).ok())
                .unwrap_or(0)
        })
        .sum()
}

/// The key patterns docs/tls-acl.md says the minimal ACL may be narrowed to: "(`~*` may be narrowed
/// to your prefix, e.g. `~lock:* ~{lock:* ...`".
fn documented_narrowed_key_patterns() -> Vec<String> {
    let doc = include_str!("../../docs/tls-acl.md");
    let start = doc
        .find("may be narrowed to your prefix, e.g. `")
        .expect("docs/tls-acl.md says how to narrow the ACL's keys")
        + "may be narrowed to your prefix, e.g. `".len();
    let patterns = &doc[start..];
    let patterns = &patterns[..patterns
        .find('`')
        .expect("the patterns end with a backtick")];
    patterns.split_whitespace().map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_minimal_acl_narrowed_to_the_key_prefix_as_documented_is_enough() {
    let server = RedisServer::start();
    let commands = documented_acl_commands();
    let allowed: Vec<&str> = commands.iter().map(String::as_str).collect();
    let url = server.add_acl_user("locker", "s3cret", &allowed);
    let patterns = documented_narrowed_key_patterns();
    assert!(
        patterns.iter().all(|pattern| pattern.starts_with('~')),
        "key patterns: {patterns:?}"
    );
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locker")
        .arg("resetkeys")
        .arg(&patterns)
        .query(&mut server.conn())
        .expect("the document's key patterns are valid ACL rules");
    // Connecting (its probe release included), fencing, extend, a woken waiter, release; on a
    // name without braces, one with a hash tag, and one with a `}` but no tag: the three forms
    // of helper keys.
    for name in ["everything", "{user:7}:cart", "order:a}b"] {
        everything(&url, None, name).await;
    }
}

#[tokio::test]
async fn a_wrong_password_says_so_and_never_shows_the_password() {
    let server = RedisServer::start();
    let commands = documented_acl_commands();
    let allowed: Vec<&str> = commands.iter().map(String::as_str).collect();
    server.add_acl_user("locker", "the-right-one", &allowed);
    let password = "Wr0ngPassw0rd";
    let url = format!("redis://locker:{password}@127.0.0.1:{}/", server.port());

    let started = Instant::now();
    let error = LockManager::connect(&url)
        .await
        .expect_err("a wrong password is refused");
    eprintln!("wrong password, after {:?}: {error}", started.elapsed());
    assert!(
        matches!(error, LockError::Redis(_)),
        "expected LockError::Redis, got {error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("user name and password"),
        "the message says to check the user name and password: {message}"
    );
    assert!(
        !message.contains(password) && !format!("{error:?}").contains(password),
        "the password leaked into the error: {message} / {error:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    // Nor into the manager's Debug, had the password been right.
    let right = format!("redis://locker:the-right-one@127.0.0.1:{}/", server.port());
    let manager = LockManager::connect(&right)
        .await
        .expect("the right password works");
    let debug = format!("{manager:?}");
    assert!(!debug.contains("the-right-one"), "{debug}");
}

#[cfg(not(feature = "tls"))]
#[tokio::test]
async fn without_the_tls_feature_a_rediss_url_names_the_feature() {
    let error = LockManager::connect("rediss://127.0.0.1:1")
        .await
        .expect_err("rediss:// needs the tls feature");
    let LockError::Config(message) = &error else {
        panic!("expected LockError::Config, got {error:?}");
    };
    assert!(
        message.starts_with("`rediss://127.0.0.1:1` needs distlock's `tls` feature"),
        "the message names the feature to enable: {message}"
    );
    assert!(
        !message.contains("not a Redis URL"),
        "one thing to do, not a URL said to be wrong: {message}"
    );
}

// ---------------------------------------------------------------------------------------------
// TLS (the `tls` feature)
// ---------------------------------------------------------------------------------------------

/// `rediss://` sentinels are all asked with one login (the only redis-rs client that passes
/// certificates on to the master takes one for every sentinel): sentinel URLs that log in
/// differently are a `Config` error that says what to write, before anything is contacted, and
/// that shows neither password.
#[cfg(feature = "tls")]
#[tokio::test]
async fn tls_sentinels_that_log_in_differently_are_a_config_error_that_says_what_to_write() {
    let urls = [
        "rediss://app:first-s3cret@127.0.0.1:1",
        "rediss://ops:second-s3cret@127.0.0.1:2",
    ];
    let error = LockManager::sentinel_builder(&urls, "locks")
        .connect()
        .await
        .expect_err("the sentinels cannot share one login");
    let LockError::Config(message) = &error else {
        panic!("expected LockError::Config, got {error:?}");
    };
    assert!(
        message.contains("sentinels over TLS must share one login")
            && message.contains("give every sentinel URL the same user and password"),
        "{message}"
    );
    assert!(!message.contains("s3cret"), "{message}");
}

#[cfg(feature = "tls")]
mod tls {
    use std::time::Duration;

    use distlock::{LockError, LockManager, LockOptions};
    use tokio::time::Instant;

    use super::{documented_acl_commands, everything};
    use test_support::{skip_without, unique_temp_dir, Feature, RedisServer, TlsFiles};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_manager_trusting_the_servers_ca_locks_over_tls() {
        if skip_without(
            Feature::Tls,
            "a_manager_trusting_the_servers_ca_locks_over_tls",
        ) {
            return;
        }
        let server = RedisServer::start_tls();
        let manager = LockManager::builder(server.tls_url())
            .tls_root_certificate(server.ca_pem())
            .connect()
            .await
            .expect("connects over TLS, trusting the test's CA");
        let guard = manager
            .acquire("over-tls", &LockOptions::new())
            .await
            .expect("acquire over TLS");
        assert_eq!(
            server.tls_cli(&["GET", "lock:over-tls"]),
            guard.token(),
            "the lock is in the TLS server"
        );
        guard.release().await.expect("release over TLS");
        assert_eq!(server.tls_cli(&["EXISTS", "lock:over-tls"]), "0");

        // Contended hand-off woken by the release (pub/sub over TLS too), with fencing and
        // extension: everything, as the default user.
        everything(&server.tls_url(), Some(server.ca_pem()), "everything").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_acl_user_over_tls() {
        if skip_without(Feature::Tls, "an_acl_user_over_tls") {
            return;
        }
        let server = RedisServer::start_tls();
        let commands = documented_acl_commands();
        let allowed: Vec<&str> = commands.iter().map(String::as_str).collect();
        let url = server.add_acl_user("locker", "s3cret", &allowed);
        assert!(url.starts_with("rediss://locker:"), "{url}");
        everything(&url, Some(server.ca_pem()), "everything").await;
    }

    fn assert_certificate_refused(result: Result<LockManager, LockError>, what: &str) {
        let error = result.expect_err(what);
        let message = error.to_string();
        eprintln!("{what}: {message}");
        assert!(
            matches!(error, LockError::Redis(_)),
            "expected LockError::Redis, got {error:?}"
        );
        assert!(
            message.contains("invalid peer certificate"),
            "the message says the certificate was not accepted: {message}"
        );
        assert!(
            message.contains("tls_root_certificate") && !message.contains("is running"),
            "the advice fits a refused certificate (trust its CA), not a server that is down: \
             {message}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_untrusted_certificate_is_refused_with_a_clear_error() {
        if skip_without(
            Feature::Tls,
            "an_untrusted_certificate_is_refused_with_a_clear_error",
        ) {
            return;
        }
        let server = RedisServer::start_tls();

        // The system roots do not vouch for the test's CA.
        let started = Instant::now();
        assert_certificate_refused(
            LockManager::builder(server.tls_url()).connect().await,
            "without the server's CA the handshake is refused",
        );
        assert!(started.elapsed() < Duration::from_secs(5));

        // Nor does another CA.
        let other_dir = unique_temp_dir("other-ca");
        let other = TlsFiles::generate(&other_dir);
        let started = Instant::now();
        let result = LockManager::builder(server.tls_url())
            .tls_root_certificate(other.ca_pem())
            .connect()
            .await;
        let _ = std::fs::remove_dir_all(&other_dir);
        assert_certificate_refused(result, "trusting another CA the handshake is refused");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn plain_text_on_the_tls_port_fails_without_hanging() {
        if skip_without(
            Feature::Tls,
            "plain_text_on_the_tls_port_fails_without_hanging",
        ) {
            return;
        }
        let server = RedisServer::start_tls();
        let started = Instant::now();
        let result = LockManager::builder(format!("redis://127.0.0.1:{}/", server.port()))
            .connect()
            .await;
        let took = started.elapsed();
        let error = result.expect_err("plain text cannot talk to a TLS-only port");
        eprintln!("plain text on the TLS port failed after {took:?}: {error}");
        assert!(matches!(error, LockError::Redis(_)), "{error:?}");
        // Connect timeout 2 s + response timeout 1 s, and room for a loaded machine.
        assert!(took < Duration::from_secs(6), "{took:?}");
    }
}
