//! Self-tests of the test harness in `test-support`: if these fail, no other integration test
//! can be trusted, so each one checks a real outcome of a harness feature.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use test_support::{spawn_worker, wait_all, wait_until, FaultProxy, RedisServer};

/// A sync connection to `url` whose reads give up after `read_timeout`.
fn connect(url: &str, read_timeout: Duration) -> redis::Connection {
    let client = redis::Client::open(url).expect("valid url");
    let conn = client
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
    conn.set_read_timeout(Some(read_timeout)).unwrap();
    conn.set_write_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    conn
}

fn ping(conn: &mut redis::Connection) -> redis::RedisResult<String> {
    redis::cmd("PING").query(conn)
}

/// Whether something accepts TCP connections on `port` of 127.0.0.1.
fn port_is_open(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500)).is_ok()
}

/// Reads from a raw socket until `expected` has arrived or `timeout` passes.
fn read_exactly(stream: &mut TcpStream, expected: &[u8], timeout: Duration) -> std::io::Result<()> {
    stream.set_read_timeout(Some(timeout))?;
    let mut got = vec![0u8; expected.len()];
    stream.read_exact(&mut got)?;
    assert_eq!(got, expected, "unexpected bytes");
    Ok(())
}

#[test]
fn server_starts_and_answers() {
    let server = RedisServer::start();
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
    assert!(server.pid() > 0);
    assert!(server.log_path().exists(), "redis.log was not created");

    let mut conn = server.conn();
    assert_eq!(ping(&mut conn).unwrap(), "PONG");

    server.set("harness:k", "v1");
    assert_eq!(server.get("harness:k").as_deref(), Some("v1"));
    assert!(server.exists("harness:k"));
    assert_eq!(
        server.pttl("harness:k"),
        -1,
        "SET without expiry has no TTL"
    );
    assert_eq!(server.get("harness:missing"), None);
    assert!(!server.exists("harness:missing"));
    assert_eq!(server.pttl("harness:missing"), -2);
    assert!(server.del("harness:k"));
    assert!(!server.exists("harness:k"));
}

#[test]
fn server_has_no_persistence_and_takes_extra_args() {
    let server = RedisServer::start_with(&["--maxmemory", "12345678"]);
    let mut conn = server.conn();
    let config = |conn: &mut redis::Connection, name: &str| -> String {
        let pair: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(name)
            .query(conn)
            .unwrap();
        pair[1].clone()
    };
    assert_eq!(config(&mut conn, "maxmemory"), "12345678");
    assert_eq!(config(&mut conn, "save"), "");
    assert_eq!(config(&mut conn, "appendonly"), "no");
    assert_eq!(config(&mut conn, "bind"), "127.0.0.1");
    assert_eq!(
        std::path::Path::new(&config(&mut conn, "dir")),
        server.dir().canonicalize().unwrap()
    );
}

#[test]
fn acl_users_from_start_with_apply() {
    let server = RedisServer::start_with(&["--user", "app", "on", ">secret", "~app:*", "+@all"]);
    let app_url = format!("redis://app:secret@127.0.0.1:{}/", server.port());
    let mut app = connect(&app_url, Duration::from_secs(5));
    let _: () = redis::cmd("SET")
        .arg("app:x")
        .arg("1")
        .query(&mut app)
        .unwrap();
    let denied: redis::RedisResult<()> = redis::cmd("SET").arg("other:x").arg("1").query(&mut app);
    assert!(denied.is_err(), "the ACL key pattern was not applied");
    // The default user is untouched, so the helpers still work.
    assert_eq!(server.get("app:x").as_deref(), Some("1"));
}

#[test]
fn a_password_protected_server_counts_as_started() {
    let server = RedisServer::start_with(&["--requirepass", "pw"]);
    let unauthenticated = server.try_conn().and_then(|mut conn| ping(&mut conn));
    assert!(
        unauthenticated.is_err(),
        "no password needed: {unauthenticated:?}"
    );
    let url = format!("redis://:pw@127.0.0.1:{}/", server.port());
    assert_eq!(
        ping(&mut connect(&url, Duration::from_secs(5))).unwrap(),
        "PONG"
    );
}

#[test]
fn bad_server_args_panic_with_the_log() {
    let outcome = std::panic::catch_unwind(|| RedisServer::start_with(&["--no-such-option", "1"]));
    let message = match outcome {
        Ok(server) => panic!("a server started with a bad option: {server:?}"),
        Err(payload) => payload.downcast::<String>().map(|s| *s).unwrap_or_default(),
    };
    assert!(message.contains("exited"), "panic message: {message}");
    assert!(
        message.contains("no-such-option"),
        "the log is missing: {message}"
    );
}

#[test]
fn harness_types_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<RedisServer>();
    assert_send_sync::<FaultProxy>();
}

#[test]
fn key_helpers_see_ttl_and_scan() {
    let server = RedisServer::start();
    server.set_px("lock:a", "t", 60_000);
    for i in 0..2500 {
        server.set(&format!("other:{i}"), "x");
    }
    server.set("lock:b", "t");

    let pttl = server.pttl("lock:a");
    assert!((1..=60_000).contains(&pttl), "pttl {pttl}");
    // More keys than one SCAN batch, so the cursor must really be followed.
    assert_eq!(server.keys("lock:*"), vec!["lock:a", "lock:b"]);
    assert_eq!(server.keys("other:*").len(), 2500);

    server.flushall();
    assert!(server.keys("*").is_empty());
}

#[test]
fn command_count_counts_one_get_exactly() {
    let server = RedisServer::start();
    let before = server.command_count("get");
    let mut conn = server.conn();
    let _: Option<String> = redis::cmd("GET").arg("harness:x").query(&mut conn).unwrap();
    assert_eq!(server.command_count("GET"), before + 1);
    assert_eq!(
        server.command_count("evalsha"),
        0,
        "a command never run counts 0"
    );

    server.reset_stats();
    assert_eq!(server.command_count("get"), 0);
}

#[test]
fn pubsub_channels_and_client_count() {
    let server = RedisServer::start();
    let baseline = server.client_count();

    let mut subscriber = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    subscriber.write_all(b"SUBSCRIBE harness:chan\r\n").unwrap();
    // The confirmation proves the subscription is registered before we look.
    let confirmation = b"*3\r\n$9\r\nsubscribe\r\n$12\r\nharness:chan\r\n:1\r\n";
    read_exactly(&mut subscriber, confirmation, Duration::from_secs(5)).unwrap();
    assert_eq!(server.pubsub_channels(), vec!["harness:chan"]);

    let _other = server.conn();
    assert_eq!(server.client_count(), baseline + 2);

    drop(subscriber);
    wait_until(
        Duration::from_secs(5),
        "the subscriber to disconnect",
        || server.pubsub_channels().is_empty(),
    );
}

#[test]
fn restart_keeps_port_and_forgets_data() {
    let server = RedisServer::start();
    server.set("harness:k", "v");
    let (port, pid) = (server.port(), server.pid());

    server.restart();

    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), pid, "restart must start a new process");
    assert_eq!(server.get("harness:k"), None, "data survived a restart");
    let mut conn = connect(&server.url(), Duration::from_secs(5));
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
}

#[test]
fn restart_after_kill_brings_it_back() {
    let server = RedisServer::start();
    server.kill();
    assert!(!server.is_running());
    server.restart();
    assert!(server.is_running());
    assert_eq!(ping(&mut server.conn()).unwrap(), "PONG");
}

#[test]
fn pause_blocks_replies_and_resume_restores_them() {
    let server = RedisServer::start();
    let mut conn = connect(&server.url(), Duration::from_millis(200));
    assert_eq!(ping(&mut conn).unwrap(), "PONG");

    server.pause();
    let started = Instant::now();
    let result = ping(&mut conn);
    assert!(result.is_err(), "a paused server answered: {result:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "the PING failed before its read timeout: {result:?}"
    );

    server.resume();
    // The old connection may hold the late PONG; a fresh one proves the server answers again.
    let mut fresh = connect(&server.url(), Duration::from_secs(5));
    assert_eq!(ping(&mut fresh).unwrap(), "PONG");
}

#[test]
fn kill_makes_connections_fail() {
    let server = RedisServer::start();
    let mut conn = connect(&server.url(), Duration::from_secs(5));
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
    let port = server.port();

    server.kill();

    assert!(!server.is_running());
    assert!(
        ping(&mut conn).is_err(),
        "an established connection survived kill"
    );
    assert!(
        server.try_conn().is_err(),
        "a new connection succeeded after kill"
    );
    assert!(!port_is_open(port));
}

#[test]
fn drop_of_a_paused_server_kills_it() {
    let server = RedisServer::start();
    let (port, dir) = (server.port(), server.dir().to_path_buf());
    server.pause();
    let started = Instant::now();
    drop(server);
    assert!(started.elapsed() < Duration::from_secs(10), "drop hung");
    assert!(!port_is_open(port), "the server still listens after drop");
    assert!(!dir.exists(), "the temp dir survived drop");
}

#[test]
fn proxy_forwards_set_and_get() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}/", proxy.port()));
    assert_eq!(proxy.upstream_port(), server.port());

    let mut conn = connect(&proxy.url(), Duration::from_secs(5));
    let _: () = redis::cmd("SET")
        .arg("via:proxy")
        .arg("yes")
        .query(&mut conn)
        .unwrap();
    let got: String = redis::cmd("GET").arg("via:proxy").query(&mut conn).unwrap();
    assert_eq!(got, "yes");
    assert_eq!(server.get("via:proxy").as_deref(), Some("yes"));
    assert_eq!(proxy.connection_count(), 1);

    // A large value crosses in many chunks and must arrive intact.
    let big = "x".repeat(1 << 20);
    let _: () = redis::cmd("SET")
        .arg("via:big")
        .arg(&big)
        .query(&mut conn)
        .unwrap();
    let back: String = redis::cmd("GET").arg("via:big").query(&mut conn).unwrap();
    assert_eq!(back.len(), big.len());

    drop(conn);
    wait_until(
        Duration::from_secs(5),
        "the proxied connection to close",
        || proxy.connection_count() == 0,
    );
}

#[test]
fn proxy_delay_adds_latency_in_both_directions() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut conn = connect(&proxy.url(), Duration::from_secs(10));

    proxy.set_delay(Duration::from_millis(50));
    let started = Instant::now();
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
    let round_trip = started.elapsed();
    assert!(
        round_trip >= Duration::from_millis(100),
        "round trip {round_trip:?} is shorter than two 50 ms delays"
    );

    proxy.set_delay(Duration::ZERO);
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
}

#[test]
fn proxy_delay_does_not_serialise_chunks() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    proxy.set_delay(Duration::from_millis(200));
    let mut stream = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    stream.set_nodelay(true).unwrap();

    // 20 requests 10 ms apart, each its own chunk. Latency overlaps, so this takes about
    // 0.2 s of sends + 2 x 0.2 s; delaying chunk after chunk would take at least 20 x 0.2 s.
    let started = Instant::now();
    for _ in 0..20 {
        stream.write_all(b"PING\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    read_exactly(
        &mut stream,
        &b"+PONG\r\n".repeat(20),
        Duration::from_secs(10),
    )
    .unwrap();
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(400),
        "{elapsed:?} is shorter than one round trip"
    );
    assert!(
        elapsed < Duration::from_secs(3),
        "{elapsed:?}: delayed chunks queued behind each other"
    );
}

#[test]
fn proxy_stall_holds_bytes_and_unstall_delivers_them() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut stream = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    stream.write_all(b"PING\r\n").unwrap();
    read_exactly(&mut stream, b"+PONG\r\n", Duration::from_secs(5)).unwrap();

    proxy.stall();
    stream.write_all(b"PING\r\n").unwrap();
    let err = read_exactly(&mut stream, b"+PONG\r\n", Duration::from_millis(200))
        .expect_err("a reply crossed a stalled proxy");
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "expected a read timeout, got {err}"
    );
    assert_eq!(
        proxy.connection_count(),
        1,
        "stall must keep the connection open"
    );

    proxy.unstall();
    read_exactly(&mut stream, b"+PONG\r\n", Duration::from_secs(5))
        .expect("the held PING was not delivered after unstall");
}

#[test]
fn proxy_cut_breaks_established_connections() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut conn = connect(&proxy.url(), Duration::from_secs(5));
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
    let server_clients = server.client_count();

    proxy.cut();

    assert!(ping(&mut conn).is_err(), "a cut connection still answered");
    assert_eq!(proxy.connection_count(), 0);
    wait_until(
        Duration::from_secs(5),
        "the server side to be closed too",
        || server.client_count() == server_clients - 1,
    );
    // The proxy itself keeps working for new connections.
    let mut again = connect(&proxy.url(), Duration::from_secs(5));
    assert_eq!(ping(&mut again).unwrap(), "PONG");
}

#[test]
fn proxy_refuse_rejects_new_connections_only() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut existing = connect(&proxy.url(), Duration::from_secs(5));

    proxy.set_refuse(true);
    let client = redis::Client::open(proxy.url()).unwrap();
    assert!(
        client
            .get_connection_with_timeout(Duration::from_secs(5))
            .is_err(),
        "a new connection got through while refusing"
    );
    assert_eq!(
        ping(&mut existing).unwrap(),
        "PONG",
        "refuse broke an existing connection"
    );

    proxy.set_refuse(false);
    let mut fresh = connect(&proxy.url(), Duration::from_secs(5));
    assert_eq!(ping(&mut fresh).unwrap(), "PONG");
}

#[test]
fn proxy_lose_next_reply_runs_the_command_and_drops_its_reply_and_connection() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut conn = connect(&proxy.url(), Duration::from_secs(5));
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
    let server_clients = server.client_count();

    // Armed for a key: a request without it passes untouched and leaves the proxy armed.
    proxy.lose_next_reply_to("lost:counter");
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
    assert!(proxy.is_armed());
    let error = redis::cmd("INCR")
        .arg("lost:counter")
        .query::<i64>(&mut conn)
        .expect_err("the reply was delivered");
    assert!(
        error.is_connection_dropped() || error.is_io_error(),
        "expected the connection to drop, got {error}"
    );
    assert_eq!(
        server.get("lost:counter").as_deref(),
        Some("1"),
        "the command reached the server and ran once"
    );
    assert_eq!(proxy.replies_lost(), 1);
    assert!(!proxy.is_armed(), "the fault fires once");
    wait_until(
        Duration::from_secs(5),
        "the proxied connection to close on both sides",
        || proxy.connection_count() == 0 && server.client_count() == server_clients - 1,
    );

    // One-shot: the next connection and its replies go through.
    let mut again = connect(&proxy.url(), Duration::from_secs(5));
    let n: i64 = redis::cmd("INCR")
        .arg("lost:counter")
        .query(&mut again)
        .unwrap();
    assert_eq!(n, 2);

    // Unfiltered: the very next request loses its reply, whatever it is.
    proxy.lose_next_reply();
    assert!(ping(&mut again).is_err(), "the PING's reply was delivered");
    assert_eq!(proxy.replies_lost(), 2);
    assert_eq!(server.get("lost:counter").as_deref(), Some("2"));
}

#[test]
fn proxy_to_a_dead_upstream_closes_clients() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    server.kill();
    let client = redis::Client::open(proxy.url()).unwrap();
    assert!(client
        .get_connection_with_timeout(Duration::from_secs(5))
        .is_err());
    server.restart();
    let mut conn = connect(&proxy.url(), Duration::from_secs(5));
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
}

#[test]
fn proxy_drop_closes_connections_and_listener() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let port = proxy.port();
    let mut conn = connect(&proxy.url(), Duration::from_secs(5));
    proxy.stall(); // threads parked in a stall must still stop
    let started = Instant::now();
    drop(proxy);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "drop took {:?}",
        started.elapsed()
    );
    assert!(
        ping(&mut conn).is_err(),
        "a connection survived the proxy's drop"
    );
    assert!(!port_is_open(port), "the proxy still listens after drop");
}

/// Worker half of `spawn_worker_runs_workers` and the tests below.
pub(crate) fn harness_worker() {
    let mode =
        std::env::var("DISTLOCK_HARNESS_WORKER").expect("set by the test that starts this worker");
    match mode.as_str() {
        "incr" => {
            let url = std::env::var("DISTLOCK_HARNESS_URL").unwrap();
            let mut conn = connect(&url, Duration::from_secs(5));
            let _: i64 = redis::cmd("INCR")
                .arg("harness:workers")
                .query(&mut conn)
                .unwrap();
        }
        "hang" => std::thread::sleep(Duration::from_secs(120)),
        "fail" => panic!("worker asked to fail"),
        "leak-server" => {
            // Simulates a test process that dies without running destructors.
            let server = RedisServer::start();
            let path = std::env::var("DISTLOCK_HARNESS_PORT_FILE").unwrap();
            std::fs::write(path, server.port().to_string()).unwrap();
            std::mem::forget(server);
        }
        other => panic!("unknown worker mode {other}"),
    }
}

#[test]
fn spawn_worker_runs_workers() {
    let server = RedisServer::start();
    let env = |mode: &str| {
        vec![
            ("DISTLOCK_HARNESS_WORKER", mode.to_string()),
            ("DISTLOCK_HARNESS_URL", server.url()),
        ]
    };
    let mut workers: Vec<_> = (0..3)
        .map(|_| spawn_worker("harness::harness_worker", &env("incr")))
        .collect();
    let mut failing = env("fail");
    failing.push(("RUST_BACKTRACE", "0".into())); // keep the expected panic's output short
    workers.push(spawn_worker("harness::harness_worker", &failing));

    let statuses = wait_all(workers, Duration::from_secs(60));

    assert_eq!(statuses.len(), 4);
    assert!(
        statuses[..3].iter().all(std::process::ExitStatus::success),
        "{statuses:?}"
    );
    assert!(
        !statuses[3].success(),
        "a panicking worker exited successfully"
    );
    assert_eq!(server.get("harness:workers").as_deref(), Some("3"));
}

#[test]
fn wait_all_kills_overrunning_children_and_panics() {
    let hanging = spawn_worker(
        "harness::harness_worker",
        &[("DISTLOCK_HARNESS_WORKER", "hang".into())],
    );
    let pid = hanging.id();
    let started = Instant::now();
    let outcome = std::panic::catch_unwind(|| wait_all(vec![hanging], Duration::from_millis(500)));
    let message = match outcome {
        Ok(statuses) => panic!("wait_all returned {statuses:?} for a hanging child"),
        Err(payload) => payload.downcast::<String>().map(|s| *s).unwrap_or_default(),
    };
    assert!(message.contains("did not exit"), "panic message: {message}");
    assert!(
        message.contains(&pid.to_string()),
        "panic message: {message}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn server_of_a_dead_test_process_is_reaped() {
    let dir = test_support::unique_temp_dir("harness");
    let port_file = dir.join("port");
    let worker = spawn_worker(
        "harness::harness_worker",
        &[
            ("DISTLOCK_HARNESS_WORKER", "leak-server".into()),
            (
                "DISTLOCK_HARNESS_PORT_FILE",
                port_file.display().to_string(),
            ),
        ],
    );
    let statuses = wait_all(vec![worker], Duration::from_secs(60));
    assert!(statuses[0].success(), "worker failed: {statuses:?}");
    let port: u16 = std::fs::read_to_string(&port_file)
        .unwrap()
        .parse()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    wait_until(
        Duration::from_secs(10),
        "the watchdog to kill the orphaned server",
        || !port_is_open(port),
    );
}
