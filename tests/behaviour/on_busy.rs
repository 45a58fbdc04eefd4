//! `on_busy = "skip" | "fail"` and `hold_at_least` on the attribute, against a real Redis
//! (the global client on the binary's shared server); `scale_out/on_busy.rs` runs them on a
//! Redis Cluster.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use distlock::{distributed_lock, LockError, LockManager, LockOptions};
use tokio::time::Instant;

use crate::traced::{self, Recorder};

static NIGHTLY_RAN: AtomicU32 = AtomicU32::new(0);
static CLEANUP_RAN: AtomicU32 = AtomicU32::new(0);
static CHARGE_RAN: AtomicU32 = AtomicU32::new(0);

#[distributed_lock(key = "nightly:{day}", on_busy = "skip")]
async fn nightly(day: u32) -> Result<Option<u32>, LockError> {
    NIGHTLY_RAN.fetch_add(1, Ordering::SeqCst);
    Ok(Some(day * 10))
}

#[distributed_lock(key = "cleanup:{id}", on_busy = "skip")]
async fn cleanup(id: &str) -> Result<(), LockError> {
    let _ = id;
    CLEANUP_RAN.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "charge:{id}", on_busy = "fail")]
async fn charge(id: &str) -> Result<u32, std::io::Error> {
    let _ = id;
    CHARGE_RAN.fetch_add(1, Ordering::SeqCst);
    Ok(7)
}

#[distributed_lock(
    key = "tick:{id}",
    on_busy = "skip",
    ttl = 10,
    hold_at_least = "1500ms"
)]
async fn tick(id: &str) -> Result<Option<Instant>, LockError> {
    let _ = id;
    Ok(Some(Instant::now()))
}

/// A manager of our own on the global client's server, to hold locks the attribute meets.
async fn other_holder() -> LockManager {
    let server = test_support::global_server().await;
    LockManager::connect(&server.url()).await.unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn skip_returns_none_without_running_the_body_and_traces_the_skip() {
    let _tracing = tracing::subscriber::set_default(Recorder);
    let other = other_holder().await;
    let guard = other
        .acquire("nightly:1", &LockOptions::new())
        .await
        .unwrap();
    let before = NIGHTLY_RAN.load(Ordering::SeqCst);

    let started = Instant::now();
    assert_eq!(nightly(1).await.unwrap(), None);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a skip does not wait"
    );
    assert_eq!(
        NIGHTLY_RAN.load(Ordering::SeqCst),
        before,
        "the body did not run"
    );
    let traced = traced::events().join("\n");
    assert!(
        traced.contains("lock:nightly:1") && traced.contains("skipped"),
        "a debug event records the skip: {traced}"
    );

    guard.release().await.unwrap();
    assert_eq!(nightly(1).await.unwrap(), Some(10));
    assert_eq!(NIGHTLY_RAN.load(Ordering::SeqCst), before + 1);
    assert!(
        !test_support::shared_server().exists("lock:nightly:1"),
        "released after the body"
    );
}

#[tokio::test]
async fn skip_of_a_unit_function_returns_ok_without_running_the_body() {
    let other = other_holder().await;
    let guard = other
        .acquire("cleanup:a", &LockOptions::new())
        .await
        .unwrap();
    let before = CLEANUP_RAN.load(Ordering::SeqCst);
    cleanup("a").await.unwrap();
    assert_eq!(CLEANUP_RAN.load(Ordering::SeqCst), before);
    guard.release().await.unwrap();
    cleanup("a").await.unwrap();
    assert_eq!(CLEANUP_RAN.load(Ordering::SeqCst), before + 1);
}

#[tokio::test]
async fn fail_returns_busy_naming_the_key_without_running_the_body() {
    let other = other_holder().await;
    let guard = other
        .acquire("charge:42", &LockOptions::new())
        .await
        .unwrap();
    let before = CHARGE_RAN.load(Ordering::SeqCst);
    let started = Instant::now();
    let error = charge("42").await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a fail does not wait"
    );
    assert_eq!(error.kind(), std::io::ErrorKind::WouldBlock);
    let inner = error.into_inner().unwrap().downcast::<LockError>().unwrap();
    assert!(
        matches!(&*inner, LockError::Busy { key } if key == "lock:charge:42"),
        "{inner:?}"
    );
    assert!(inner.to_string().contains("on_busy"), "{inner}");
    assert_eq!(CHARGE_RAN.load(Ordering::SeqCst), before);

    guard.release().await.unwrap();
    assert_eq!(charge("42").await.unwrap(), 7);
    assert_eq!(CHARGE_RAN.load(Ordering::SeqCst), before + 1);
}

#[tokio::test]
async fn hold_at_least_makes_a_second_run_within_the_hold_skip() {
    test_support::global_server().await;
    let first = tick("x").await.unwrap().expect("a free lock runs the body");
    let server = test_support::shared_server();
    assert!(
        server.exists("lock:tick:x"),
        "kept after the body for the hold"
    );
    let pttl = server.pttl("lock:tick:x");
    assert!(
        (1..=1_500).contains(&pttl),
        "expires when the hold ends: pttl {pttl}"
    );
    assert_eq!(tick("x").await.unwrap(), None, "within the hold: skipped");
    test_support::eventually(Duration::from_secs(10), "the hold to end", || {
        !server.exists("lock:tick:x")
    })
    .await;
    assert!(first.elapsed() >= Duration::from_millis(1_400));
    assert!(
        tick("x").await.unwrap().is_some(),
        "runs again after the hold"
    );
}
