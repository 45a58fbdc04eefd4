//! Quick start: `cargo run --example quickstart`. Uses the Redis at `REDIS_URL`, else the one at
//! 127.0.0.1:6379, else starts a private `redis-server` for its run (examples/common).
use std::process::ExitCode;
use std::time::Duration;

use distlock::{distributed_lock, LockError};

// The examples' helper that finds or starts a Redis; your program connects to its own.
#[path = "common/local_redis.rs"]
mod local_redis;

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

async fn run(url: &str) -> Result<(), AppError> {
    // Once, at startup: connect, and fail fast if Redis does not answer.
    distlock::init(url).await?;
    // Three calls for "abc" take turns on its lock; "xyz" has its own and runs alongside.
    let (a, b, c, x) = tokio::join!(
        process_trace("abc"),
        process_trace("abc"),
        process_trace("abc"),
        process_trace("xyz"),
    );
    a.and(b).and(c).and(x)
}

#[tokio::main]
async fn main() -> ExitCode {
    let start = std::env::args().any(|arg| arg == "--start-redis");
    let redis = match local_redis::LocalRedis::find_or_start("quickstart", None, start).await {
        Ok(redis) => redis,
        Err(code) => return code,
    };
    match redis.until_interrupted(run(redis.url())).await {
        Some(Ok(())) => ExitCode::SUCCESS,
        Some(Err(error)) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
        None => ExitCode::from(130),
    }
}
