//! `#[distributed_lock]` against a real Redis: the key it takes, the errors it hands back, and the
//! release on every way out of the body (normal, `?`, `return`, panic, cancellation).
//!
//! Every test of this binary shares one redis-server and the one global client (`distlock::init`
//! is once per process), each with its own keys; every `#[tokio::test]` has its own runtime.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock::{distributed_lock, LockError, LockGuard, LockManager, LockOptions};
use test_support::{eventually, global_server, shared_server};
use tokio::sync::{oneshot, Barrier};

// ---------------------------------------------------------------------------------------------
// Shared setup
// ---------------------------------------------------------------------------------------------

/// A manager of its own, for a competing holder that is not the global client.
async fn other_manager() -> LockManager {
    LockManager::connect(&shared_server().url())
        .await
        .expect("a second manager connects")
}

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    App(String),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

/// What a body saw of its own lock, read from Redis while the body ran.
#[derive(Debug, Clone, PartialEq)]
struct Observed {
    key: String,
    token: String,
    /// `GET key` from inside the body.
    stored: Option<String>,
}

impl Observed {
    /// Reads the lock `guard` holds from Redis (a blocking local round trip: fine in a test).
    fn of(guard: &LockGuard) -> Observed {
        Observed {
            key: guard.key().to_owned(),
            token: guard.token().to_owned(),
            stored: shared_server().get(guard.key()),
        }
    }

    /// Asserts that the body held the lock `expected_key` with its own token.
    fn assert_held(&self, expected_key: &str) {
        assert_eq!(self.key, expected_key, "the lock key");
        assert_eq!(
            self.stored.as_deref(),
            Some(self.token.as_str()),
            "inside the body, Redis must hold {expected_key} with the guard's token"
        );
        assert_uuid_v4(&self.token);
    }
}

/// A place where a body records what it observed, for callers that lose the return value
/// (error paths, panics, cancellation).
#[derive(Debug, Clone, Default)]
struct Seen(Arc<Mutex<Option<Observed>>>);

impl Seen {
    fn record(&self, guard: &LockGuard) {
        *self.0.lock().unwrap() = Some(Observed::of(guard));
    }

    fn get(&self) -> Option<Observed> {
        self.0.lock().unwrap().clone()
    }

    fn expect(&self) -> Observed {
        self.get().expect("the body ran and recorded its lock")
    }
}

fn assert_uuid_v4(token: &str) {
    // The lock's value: the UUID, then who holds the lock.
    let (token, holder) = token.split_at(36);
    assert!(
        holder.starts_with(";h="),
        "{holder:?} does not name the holder"
    );
    let bytes = token.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if [8, 13, 18, 23].contains(&i) {
            assert_eq!(b, b'-', "token {token:?} is not a UUID");
        } else {
            assert!(b.is_ascii_hexdigit(), "token {token:?} is not a UUID");
        }
    }
    assert_eq!(bytes[14], b'4', "token {token:?} is not a version 4 UUID");
}

// ---------------------------------------------------------------------------------------------
// Key templates
// ---------------------------------------------------------------------------------------------

struct Region {
    name: String,
}

struct Owner {
    region: Region,
    id: u64,
}

struct Order {
    owner: Owner,
    number: u32,
}

#[distributed_lock(key = "attr:brace:{trace_id}", ttl = 30, guard = lock)]
async fn brace_key(trace_id: &str) -> Result<Observed, AppError> {
    Ok(Observed::of(lock))
}

#[distributed_lock(
    key = "attr:fields:{order.owner.region.name}:{order.owner.id}:{order.number}",
    ttl = 30,
    guard = lock
)]
async fn fields_key(order: &Order) -> Result<Observed, AppError> {
    Ok(Observed::of(lock))
}

#[distributed_lock(key = "attr:angle:<trace_id>/<order.owner.id>", ttl = 30, guard = lock)]
async fn angle_key(trace_id: String, order: Order) -> Result<Observed, AppError> {
    Ok(Observed::of(lock))
}

#[distributed_lock(key = "attr:{{literal}}:{id}:}}", ttl = 30, guard = lock)]
async fn escaped_key(id: u64) -> Result<Observed, AppError> {
    Ok(Observed::of(lock))
}

fn order() -> Order {
    Order {
        owner: Owner {
            region: Region {
                name: "eu-west".to_owned(),
            },
            id: 77,
        },
        number: 3,
    }
}

#[tokio::test]
async fn brace_placeholder_key_is_held_during_the_body_and_gone_after() {
    let server = global_server().await;
    let first = brace_key("abc").await.unwrap();
    first.assert_held("lock:attr:brace:abc");
    assert!(
        !server.exists("lock:attr:brace:abc"),
        "the lock must be released before the call returns"
    );

    // A fresh token for every acquisition.
    let second = brace_key("abc").await.unwrap();
    second.assert_held("lock:attr:brace:abc");
    assert_ne!(first.token, second.token, "tokens must never be reused");
    assert!(!server.exists("lock:attr:brace:abc"));
}

#[tokio::test]
async fn field_path_placeholders_are_interpolated() {
    let server = global_server().await;
    let observed = fields_key(&order()).await.unwrap();
    observed.assert_held("lock:attr:fields:eu-west:77:3");
    assert!(!server.exists("lock:attr:fields:eu-west:77:3"));
}

#[tokio::test]
async fn angle_placeholders_are_interpolated() {
    let server = global_server().await;
    let observed = angle_key("xyz".to_owned(), order()).await.unwrap();
    observed.assert_held("lock:attr:angle:xyz/77");
    assert!(!server.exists("lock:attr:angle:xyz/77"));
}

#[tokio::test]
async fn doubled_braces_are_literal_braces() {
    let server = global_server().await;
    let observed = escaped_key(7).await.unwrap();
    observed.assert_held("lock:attr:{literal}:7:}");
    assert!(!server.exists("lock:attr:{literal}:7:}"));
}

// ---------------------------------------------------------------------------------------------
// Errors reach the caller through `From`
// ---------------------------------------------------------------------------------------------

#[distributed_lock(key = "attr:timeout:{id}", ttl = 30, timeout = 0.2)]
async fn short_timeout(id: &str, ran: Arc<AtomicBool>) -> Result<(), AppError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn timeout_reaches_the_caller_through_from() {
    let server = global_server().await;
    let holder = other_manager().await;
    let held = holder
        .acquire("attr:timeout:held", &LockOptions::new())
        .await
        .unwrap();

    let ran = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let result = short_timeout("held", Arc::clone(&ran)).await;
    let elapsed = started.elapsed();

    match result {
        Err(AppError::Lock(LockError::Timeout { key, waited })) => {
            assert_eq!(key, "lock:attr:timeout:held");
            assert!(
                waited >= Duration::from_millis(150),
                "gave up after {waited:?}, before the 200 ms timeout"
            );
        }
        other => panic!("expected AppError::Lock(Timeout), got {other:?}"),
    }
    assert!(
        elapsed < Duration::from_secs(5),
        "a 0.2 s timeout took {elapsed:?}"
    );
    assert!(!ran.load(Ordering::SeqCst), "the body ran without the lock");
    assert_eq!(
        server.get("lock:attr:timeout:held").as_deref(),
        Some(held.token()),
        "the holder's lock must be untouched"
    );
    held.release().await.unwrap();

    // Free now: the same function gets it.
    short_timeout("held", Arc::clone(&ran)).await.unwrap();
    assert!(ran.load(Ordering::SeqCst));
}

#[distributed_lock(key = "attr:io:{id}", ttl = 30, timeout = 0.2)]
async fn io_locked(id: &str) -> std::io::Result<usize> {
    Ok(id.len())
}

#[tokio::test]
async fn io_result_gets_timed_out_kind_on_timeout() {
    global_server().await;
    let holder = other_manager().await;
    let held = holder
        .acquire("attr:io:busy", &LockOptions::new())
        .await
        .unwrap();

    let error = io_locked("busy").await.unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::TimedOut, "{error}");
    let inner = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<LockError>())
        .expect("the io::Error wraps the LockError");
    assert!(
        matches!(inner, LockError::Timeout { key, .. } if key == "lock:attr:io:busy"),
        "{inner:?}"
    );

    held.release().await.unwrap();
    assert_eq!(io_locked("busy").await.unwrap(), 4);
}

// ---------------------------------------------------------------------------------------------
// Release on every way out of the body
// ---------------------------------------------------------------------------------------------

#[distributed_lock(key = "attr:question:{id}", ttl = 30, guard = lock)]
async fn fails_with_question_mark(id: u32, seen: Seen) -> Result<u32, AppError> {
    seen.record(lock);
    let parsed: u32 = "not a number"
        .parse()
        .map_err(|_| AppError::App(format!("parse failed for {id}")))?;
    Ok(parsed)
}

#[tokio::test]
async fn released_after_question_mark_early_return() {
    let server = global_server().await;
    let seen = Seen::default();
    let result = fails_with_question_mark(1, seen.clone()).await;
    assert!(
        matches!(&result, Err(AppError::App(message)) if message == "parse failed for 1"),
        "the body's own error must come back unchanged: {result:?}"
    );
    seen.expect().assert_held("lock:attr:question:1");
    assert!(
        !server.exists("lock:attr:question:1"),
        "the lock must be released before the call returns"
    );
}

#[distributed_lock(key = "attr:return:{id}", ttl = 30, guard = lock)]
async fn returns_early(id: u32, seen: Seen) -> Result<u32, AppError> {
    seen.record(lock);
    if id > 0 {
        return Ok(id * 2);
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
    Ok(0)
}

#[tokio::test]
async fn released_after_return() {
    let server = global_server().await;
    let seen = Seen::default();
    let started = Instant::now();
    assert_eq!(returns_early(21, seen.clone()).await.unwrap(), 42);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "`return` did not return"
    );
    seen.expect().assert_held("lock:attr:return:21");
    assert!(
        !server.exists("lock:attr:return:21"),
        "the lock must be released before the call returns"
    );
}

#[distributed_lock(key = "attr:panic:{id}", ttl = 30, guard = lock)]
async fn panics(id: u32, seen: Seen) -> Result<(), AppError> {
    seen.record(lock);
    assert!(
        id == u32::MAX,
        "deliberate panic in the locked body (id {id})"
    );
    Ok(())
}

#[tokio::test]
async fn released_after_a_panic() {
    let server = global_server().await;
    let seen = Seen::default();
    let joined = tokio::spawn(panics(5, seen.clone())).await;
    let error = joined.expect_err("the body panicked");
    assert!(error.is_panic(), "expected a panic, got {error:?}");
    seen.expect().assert_held("lock:attr:panic:5");
    eventually(
        Duration::from_secs(2),
        "the panicking holder's lock (ttl 30 s) to be released",
        || !server.exists("lock:attr:panic:5"),
    )
    .await;
}

#[distributed_lock(key = "attr:cancel:{id}", ttl = 30, guard = lock)]
async fn sleeps_long(id: u32, seen: Seen) -> Result<(), AppError> {
    seen.record(lock);
    tokio::time::sleep(Duration::from_secs(60)).await;
    Ok(())
}

#[tokio::test]
async fn released_after_cancellation() {
    let server = global_server().await;
    let seen = Seen::default();
    // Boxed so that `drop(call)` below really drops the future (a `pin!` would only drop a
    // reference to it).
    let mut call = Box::pin(sleeps_long(9, seen.clone()));
    // Drive the call until its body runs (acquiring may be slow on a loaded machine), then give
    // it a little longer, and cancel it with a timeout as a caller would.
    let entered = async {
        while seen.get().is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        result = &mut call => panic!("the body should sleep for 60 s, got {result:?}"),
        () = entered => {}
    }
    let timed_out = tokio::time::timeout(Duration::from_millis(100), &mut call).await;
    assert!(timed_out.is_err(), "the call should still be sleeping");
    seen.expect().assert_held("lock:attr:cancel:9");
    assert!(
        server.exists("lock:attr:cancel:9"),
        "held while the call is pending"
    );

    // Cancel: drop the pending future.
    drop(call);
    eventually(
        Duration::from_secs(2),
        "the cancelled holder's lock (ttl 30 s) to be released",
        || !server.exists("lock:attr:cancel:9"),
    )
    .await;
}

#[tokio::test]
async fn released_after_timeout_around_the_call() {
    let server = global_server().await;
    let seen = Seen::default();
    // A plain `tokio::time::timeout` around the call, as callers write it. The first second is
    // for acquiring; if a very slow machine has not entered the body by then, retry longer.
    let mut budget = Duration::from_secs(1);
    loop {
        let result = tokio::time::timeout(budget, sleeps_long(10, seen.clone())).await;
        assert!(result.is_err(), "the body sleeps 60 s: {result:?}");
        if seen.get().is_some() {
            break;
        }
        assert!(budget < Duration::from_secs(16), "the body never started");
        budget *= 2;
    }
    seen.expect().assert_held("lock:attr:cancel:10");
    eventually(
        Duration::from_secs(2),
        "the timed-out holder's lock (ttl 30 s) to be released",
        || !server.exists("lock:attr:cancel:10"),
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// The guard in the body
// ---------------------------------------------------------------------------------------------

#[distributed_lock(key = "attr:extend:{id}", ttl = 5, guard = lock)]
async fn extends(id: u32) -> Result<(i64, i64), AppError> {
    let before = shared_server().pttl(lock.key());
    lock.extend(Duration::from_secs(120)).await?;
    let after = shared_server().pttl(lock.key());
    Ok((before, after))
}

#[tokio::test]
async fn guard_extend_sets_the_remaining_ttl() {
    let server = global_server().await;
    let (before, after) = extends(3).await.unwrap();
    assert!(
        before > 0 && before <= 5_000,
        "pttl {before} before extend: the attribute's ttl = 5 s"
    );
    assert!(
        after > 110_000 && after <= 120_000,
        "pttl {after} after extend(120 s)"
    );
    assert!(!server.exists("lock:attr:extend:3"));
}

#[distributed_lock(key = "attr:expired:{id}", ttl = 0.3, timeout = 5, guard = lock)]
async fn outlives_its_ttl(
    id: u32,
    seen: Seen,
    taken_over: oneshot::Receiver<()>,
) -> Result<u32, AppError> {
    seen.record(lock);
    // Keep working past the ttl until the test has let someone else take the lock.
    let _ = tokio::time::timeout(Duration::from_secs(10), taken_over).await;
    Ok(id + 1)
}

#[tokio::test]
async fn holder_whose_ttl_ran_out_returns_its_result_and_spares_the_new_owner() {
    let server = global_server().await;
    let seen = Seen::default();
    let (taken_over, taken_over_rx) = oneshot::channel();
    let old = tokio::spawn(outlives_its_ttl(7, seen.clone(), taken_over_rx));
    eventually(
        Duration::from_secs(10),
        "the first holder's body to run",
        || seen.get().is_some(),
    )
    .await;
    let old_token = seen.expect().token;

    // The 0.3 s ttl runs out while the body still works; another client takes the lock.
    let other = other_manager().await;
    let new_owner = other
        .acquire(
            "attr:expired:7",
            &LockOptions::new()
                .ttl(Duration::from_secs(30))
                .timeout(Duration::from_secs(10)),
        )
        .await
        .expect("the lock is free once the first holder's ttl ran out");
    assert_ne!(new_owner.token(), old_token);
    taken_over.send(()).unwrap();

    let result = old.await.expect("the first holder did not panic");
    assert!(
        matches!(result, Ok(8)),
        "the body's result must come back even though the lock was lost: {result:?}"
    );
    assert_eq!(
        server.get("lock:attr:expired:7").as_deref(),
        Some(new_owner.token()),
        "the old holder's release must not delete the new owner's lock"
    );
    assert!(new_owner.is_held().await.unwrap());
    new_owner.release().await.unwrap();
    assert!(!server.exists("lock:attr:expired:7"));
}

// ---------------------------------------------------------------------------------------------
// Methods
// ---------------------------------------------------------------------------------------------

struct Account {
    id: u64,
    balance: u64,
}

impl Account {
    #[distributed_lock(key = "attr:account:{self.id}", ttl = 30, guard = lock)]
    async fn balance(&self) -> Result<(u64, Observed), AppError> {
        Ok((self.balance, Observed::of(lock)))
    }

    #[distributed_lock(key = "attr:account:{self.id}", ttl = 30, guard = lock)]
    async fn deposit(&mut self, amount: u64) -> Result<Observed, AppError> {
        self.balance += amount;
        Ok(Observed::of(lock))
    }
}

#[tokio::test]
async fn methods_with_self_placeholders_take_the_lock() {
    let server = global_server().await;
    let mut account = Account {
        id: 41,
        balance: 100,
    };

    let observed = account.deposit(5).await.unwrap();
    observed.assert_held("lock:attr:account:41");
    assert_eq!(account.balance, 105, "the &mut self body ran");
    assert!(!server.exists("lock:attr:account:41"));

    let (balance, observed) = account.balance().await.unwrap();
    assert_eq!(balance, 105);
    observed.assert_held("lock:attr:account:41");
    assert!(!server.exists("lock:attr:account:41"));
}

// ---------------------------------------------------------------------------------------------
// Parallelism
// ---------------------------------------------------------------------------------------------

#[distributed_lock(key = "attr:parallel:{id}", ttl = 30, timeout = 10)]
async fn rendezvous(id: u32, barrier: Arc<Barrier>, patience: Duration) -> Result<u32, AppError> {
    tokio::time::timeout(patience, barrier.wait())
        .await
        .map_err(|_| AppError::App(format!("{id}: nobody else reached the barrier")))?;
    Ok(id)
}

#[tokio::test]
async fn distinct_keys_run_in_parallel() {
    global_server().await;
    let barrier = Arc::new(Barrier::new(2));
    let (a, b) = tokio::join!(
        rendezvous(1, Arc::clone(&barrier), Duration::from_secs(5)),
        rendezvous(2, Arc::clone(&barrier), Duration::from_secs(5)),
    );
    assert!(
        matches!((&a, &b), (Ok(1), Ok(2))),
        "both bodies must be inside at once: {a:?} {b:?}"
    );
}

#[tokio::test]
async fn the_barrier_check_detects_serialised_calls() {
    // Control for the test above: on the *same* key the bodies cannot meet, so the first one
    // gives up at the barrier. (The second may then pass: a cancelled `Barrier::wait` still
    // counts. What matters is that serialised calls cannot both succeed.)
    global_server().await;
    let barrier = Arc::new(Barrier::new(2));
    let (a, b) = tokio::join!(
        rendezvous(3, Arc::clone(&barrier), Duration::from_millis(300)),
        rendezvous(3, Arc::clone(&barrier), Duration::from_millis(300)),
    );
    assert!(
        matches!(&a, Err(AppError::App(_))) || matches!(&b, Err(AppError::App(_))),
        "the same key must serialise the bodies, so one must miss the other: {a:?} {b:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Options not written take the runtime's defaults
// ---------------------------------------------------------------------------------------------

#[distributed_lock(key = "attr:defaults:{id}", guard = lock)]
async fn with_defaults(id: u32) -> Result<i64, AppError> {
    Ok(shared_server().pttl(lock.key()))
}

#[tokio::test]
async fn an_attribute_without_ttl_or_timeout_gets_the_runtime_defaults() {
    let server = global_server().await;
    let defaults = LockOptions::default();

    // ttl: the lock lives for the runtime's default ttl.
    let pttl = with_defaults(1).await.unwrap();
    let default_ttl = i64::try_from(defaults.ttl_duration().as_millis()).unwrap();
    assert!(
        pttl > default_ttl - 10_000 && pttl <= default_ttl,
        "pttl {pttl} with no `ttl` written: the default is {default_ttl} ms"
    );

    // timeout: not a single attempt; it waits for a holder that lets go well within the
    // default timeout.
    let holder = other_manager().await;
    let held = holder
        .acquire("attr:defaults:2", &LockOptions::new())
        .await
        .unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        held.release().await.unwrap();
    });
    with_defaults(2)
        .await
        .expect("waits for the holder, within the default timeout");
    release.await.unwrap();
    assert!(!server.exists("lock:attr:defaults:2"));
}
