//! Quick start: `cargo run --example quickstart` (needs Redis; set `REDIS_URL` if not local).
use std::time::Duration;

use distlock::{distributed_lock, LockError};

// Your error type needs `From<LockError>`: taking the lock can fail (timeout, Redis down).
#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Lock(#[from] LockError),
}

// The Redis lock `lock:trace:<trace_id>` is taken before the body runs (waiting up to 10 s) and
// released after it, so one worker in the whole fleet at a time runs it for a given trace.
// If the process dies holding it, the lock expires after 60 s.
#[distributed_lock(key = "trace:{trace_id}", ttl = 60)]
async fn process_trace(trace_id: &str) -> Result<(), AppError> {
    println!("{trace_id}: lock held, working");
    tokio::time::sleep(Duration::from_millis(200)).await; // fetch, embed, save...
    println!("{trace_id}: done");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), AppError> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // Once, at startup: connect, and fail fast if Redis does not answer.
    if let Err(error) = distlock::init(&url).await {
        eprintln!("error: {error}\n(start one with: redis-server --save \"\" --appendonly no)");
        std::process::exit(1);
    }
    // Three calls for "abc" take turns on its lock; "xyz" has its own and runs alongside.
    let (a, b, c, x) = tokio::join!(
        process_trace("abc"),
        process_trace("abc"),
        process_trace("abc"),
        process_trace("xyz"),
    );
    for result in [a, b, c, x] {
        result?;
    }
    Ok(())
}
