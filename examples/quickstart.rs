//! Quick start: `cargo run --example quickstart`.
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

// Only the example needs this: REDIS_URL, else 127.0.0.1:6379, else a private redis-server for
// this run. Your program passes its Redis URL to `distlock::init` instead.
#[path = "common/local_redis.rs"]
mod local_redis;

#[tokio::main]
async fn main() -> Result<(), AppError> {
    let redis = local_redis::LocalRedis::or_exit("quickstart").await;
    // Once, at startup: connect, and fail fast if Redis does not answer.
    distlock::init(redis.url()).await?;
    // Three calls for "abc" take turns on its lock; "xyz" has its own and runs alongside.
    let (a, b, c, x) = tokio::join!(
        process_trace("abc"),
        process_trace("abc"),
        process_trace("abc"),
        process_trace("xyz"),
    );
    a.and(b).and(c).and(x)
}
