// A binary of its own: it installs the global client, and tests the first `init` of a process.
//! The global client (`distlock::init`, `init_with`, `global`) and connecting: once per process,
//! usable from every `#[tokio::test]` runtime and from runtimes built one after another, and
//! clear errors for unreachable or malformed URLs.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use distlock::{distributed_lock, LockError, LockManager, LockOptions};
use test_support::{eventually, free_port, RedisServer};

static SERVER: OnceLock<RedisServer> = OnceLock::new();

fn server() -> &'static RedisServer {
    SERVER.get_or_init(RedisServer::start)
}

/// Whether this binary's one call to `distlock::init` has succeeded.
static INITIALIZED: tokio::sync::Mutex<bool> = tokio::sync::Mutex::const_new(false);

/// Installs the global client on this binary's server. Only this function calls `init` first,
/// so that first call must succeed (a later `init` is the subject of a test of its own).
async fn init_global() -> &'static RedisServer {
    let server = server();
    let mut initialized = INITIALIZED.lock().await;
    if !*initialized {
        distlock::init(&server.url())
            .await
            .expect("the first distlock::init of the process succeeds");
        *initialized = true;
    }
    server
}

/// A locked function on the global client: returns its token after checking that Redis holds
/// the lock with it.
#[distributed_lock(key = "gc:attr:{n}", ttl = 30, timeout = 5, guard = lock)]
async fn locked(n: u32) -> Result<String, LockError> {
    let stored = server().get(lock.key());
    assert_eq!(
        stored.as_deref(),
        Some(lock.token()),
        "{} is held",
        lock.key()
    );
    Ok(lock.token().to_owned())
}

/// Calls `locked(n)` a few times and checks each call released its lock.
async fn use_the_global_client(n: u32) {
    let server = init_global().await;
    let mut tokens = Vec::new();
    for _ in 0..3 {
        tokens.push(locked(n).await.expect("the global client takes the lock"));
        assert!(
            !server.exists(&format!("lock:gc:attr:{n}")),
            "released after the call"
        );
    }
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "a fresh token per acquisition");
}

#[tokio::test]
async fn init_twice_is_already_initialized() {
    let server = init_global().await;

    match distlock::init(&server.url()).await {
        Err(LockError::AlreadyInitialized) => {}
        other => panic!("a second init must be Err(AlreadyInitialized), got {other:?}"),
    }
    let error = distlock::init(&server.url()).await.unwrap_err();
    assert!(
        error.to_string().contains("distlock::init"),
        "the message says what to do: {error}"
    );

    // Even with a URL that could not connect: the check comes first, and fails fast.
    let started = Instant::now();
    assert!(matches!(
        distlock::init("redis://127.0.0.1:1").await,
        Err(LockError::AlreadyInitialized)
    ));
    assert!(started.elapsed() < Duration::from_secs(2));

    // init_with too, and the installed manager stays the first one.
    let other = LockManager::builder(server.url())
        .key_prefix("other:")
        .connect()
        .await
        .unwrap();
    assert!(matches!(
        distlock::init_with(other),
        Err(LockError::AlreadyInitialized)
    ));
    assert_eq!(distlock::global().unwrap().key_prefix(), "lock:");
}

#[tokio::test]
async fn global_works_after_init() {
    let server = init_global().await;
    let manager = distlock::global().expect("initialized");
    let guard = manager
        .acquire("gc:manual", &LockOptions::new())
        .await
        .unwrap();
    assert_eq!(guard.key(), "lock:gc:manual");
    assert_eq!(server.get("lock:gc:manual").as_deref(), Some(guard.token()));

    // The attribute and the manual API share the same global client (and lock).
    let other = LockManager::connect(&server.url()).await.unwrap();
    assert!(other
        .try_acquire("gc:manual", &LockOptions::new())
        .await
        .unwrap()
        .is_none());
    guard.release().await.unwrap();
    assert!(!server.exists("lock:gc:manual"));
}

// Several `#[tokio::test]`s, each with its own runtime, all on the one global client.

#[tokio::test]
async fn global_from_a_first_tokio_test() {
    use_the_global_client(1).await;
}

#[tokio::test]
async fn global_from_a_second_tokio_test() {
    use_the_global_client(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_from_a_multi_thread_tokio_test() {
    use_the_global_client(3).await;
}

#[test]
fn global_works_across_sequential_runtimes() {
    let server = server();

    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    first.block_on(async {
        use_the_global_client(10).await;
        // Leave a lock held by a task that is still running when the runtime goes away.
        let guard = distlock::global()
            .unwrap()
            .acquire(
                "gc:runtime:abandoned",
                &LockOptions::new().ttl(Duration::from_secs(30)),
            )
            .await
            .unwrap();
        tokio::spawn(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        });
        tokio::task::yield_now().await;
    });
    assert!(server.exists("lock:gc:runtime:abandoned"));
    drop(first);

    let second = test_support::runtime(2);
    second.block_on(async {
        // The first runtime (and the connection it drove) is gone; the global still works.
        use_the_global_client(11).await;
        eventually(
            Duration::from_secs(2),
            "the lock of a task dropped with its runtime to be released (ttl 30 s)",
            || !server.exists("lock:gc:runtime:abandoned"),
        )
        .await;
        let guard = distlock::global()
            .unwrap()
            .acquire(
                "gc:runtime:abandoned",
                &LockOptions::new().timeout(Duration::from_secs(5)),
            )
            .await
            .expect("the abandoned lock is free again");
        guard.release().await.unwrap();
    });
    drop(second);

    let third = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    third.block_on(use_the_global_client(12));
}

#[tokio::test]
async fn connecting_to_nothing_fails_fast_with_a_redis_error() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(10), LockManager::connect(&url))
        .await
        .expect("connect must give up within 10 s, not hang");
    let error = result.expect_err("nothing listens on that port");
    assert!(matches!(error, LockError::Redis(_)), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("check that Redis is running and reachable"),
        "the message says what to check: {message}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn malformed_urls_are_config_errors() {
    for url in ["not a url", "http://x", ""] {
        match LockManager::connect(url).await {
            Err(LockError::Config(message)) => assert!(
                message.contains("redis://"),
                "the message shows the expected form: {message}"
            ),
            other => panic!("{url:?}: expected Err(Config), got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_zero_connect_timeout_is_a_config_error() {
    match LockManager::builder(server().url())
        .connect_timeout(Duration::ZERO)
        .connect()
        .await
    {
        Err(LockError::Config(_)) => {}
        other => panic!("zero connect timeout: expected Err(Config), got {other:?}"),
    }
}

#[tokio::test]
async fn timeout_converts_to_io_timed_out() {
    let io: std::io::Error = LockError::Timeout {
        key: "lock:gc:io".into(),
        waited: Duration::from_secs(1),
    }
    .into();
    assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);
    assert!(io.to_string().contains("lock:gc:io"), "{io}");

    // A real one.
    let server = init_global().await;
    let held = distlock::global()
        .unwrap()
        .acquire("gc:io", &LockOptions::new())
        .await
        .unwrap();
    let other = LockManager::connect(&server.url()).await.unwrap();
    let error = other
        .acquire("gc:io", &LockOptions::new().timeout(Duration::ZERO))
        .await
        .unwrap_err();
    let io = std::io::Error::from(error);
    assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);
    assert!(matches!(
        io.get_ref().and_then(|e| e.downcast_ref::<LockError>()),
        Some(LockError::Timeout { key, .. }) if key == "lock:gc:io"
    ));
    held.release().await.unwrap();
}
