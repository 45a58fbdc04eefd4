// A binary of its own: it needs a process in which nothing ever installs the global client.
//! Before `distlock::init`: a locked function and `distlock::global()` fail with
//! `LockError::NotInitialized`, whose message says to call `distlock::init`, and the body never
//! runs. Nothing in this binary ever initializes the global client.

use std::sync::atomic::{AtomicUsize, Ordering};

use distlock::{distributed_lock, LockError, LockOptions};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

static BODY_RUNS: AtomicUsize = AtomicUsize::new(0);

#[distributed_lock(key = "uninit:{id}", ttl = 30, timeout = 5)]
async fn locked(id: u32) -> Result<u32, AppError> {
    BODY_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

#[distributed_lock(key = "uninit:io", timeout = 0)]
async fn locked_io() -> std::io::Result<()> {
    BODY_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

fn assert_not_initialized(error: &LockError) {
    assert!(
        matches!(error, LockError::NotInitialized),
        "expected NotInitialized, got {error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("distlock::init"),
        "the message must say to call distlock::init: {message}"
    );
}

#[tokio::test]
async fn a_locked_function_before_init_is_not_initialized() {
    let before = BODY_RUNS.load(Ordering::SeqCst);
    let started = std::time::Instant::now();
    match locked(1).await {
        Err(AppError::Lock(error)) => assert_not_initialized(&error),
        Ok(value) => panic!("the body ran without a lock and returned {value}"),
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "NotInitialized must not wait for the 5 s timeout"
    );
    assert_eq!(
        BODY_RUNS.load(Ordering::SeqCst),
        before,
        "the body must not run"
    );
}

#[tokio::test]
async fn an_io_result_function_before_init_carries_not_initialized() {
    let error = locked_io().await.expect_err("not initialized");
    let inner = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<LockError>())
        .expect("the io::Error wraps the LockError");
    assert_not_initialized(inner);
    assert!(error.to_string().contains("distlock::init"), "{error}");
}

#[test]
fn global_before_init_is_not_initialized() {
    let error = distlock::global().expect_err("nothing was initialized");
    assert_not_initialized(&error);
}

#[test]
fn not_initialized_in_runtimes_built_by_hand() {
    // The check needs no Redis and no particular runtime: runtimes built one after another
    // get the same answer.
    for _ in 0..2 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let result = runtime.block_on(async {
            distlock::global()?
                .acquire("uninit:manual", &LockOptions::new())
                .await
                .map(drop)
        });
        assert_not_initialized(&result.expect_err("not initialized"));
    }
}
