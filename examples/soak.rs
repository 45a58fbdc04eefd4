//! Bounded soak: mutual exclusion at full speed, across processes, checked exactly.
//!
//! The parent re-executes itself `--processes` times (default 4); each process runs `--tasks`
//! tasks (default 16) that, for `--seconds` (default 30), pick one of `--keys` keys (default 8)
//! at random and run a critical section on it under
//! `#[distributed_lock(key = "soak:{key}", ttl = 5, fencing = true, guard = lock)]`:
//!
//! - a deliberately non-atomic read-modify-write of the key's counter in Redis (GET, yield to
//!   the scheduler, SET + 1): if two holders ever overlapped, one increment would be lost;
//! - a fencing check: the section's fencing token must be strictly greater than the last token
//!   stored for the key (then it stores its own), i.e. the tokens of the writes to a key
//!   strictly increase in commit order.
//!
//! At the end each key's counter must equal the number of sections that completed on that key,
//! exactly. Violations (stale tokens + keys whose count is off) must be 0: the exit code is 1
//! otherwise, or when a section failed (a lock timeout, a Redis error) or a worker failed; 2 when
//! no Redis answers. Everything lives under a fresh `soak:<run id>:` prefix and is deleted at
//! the end.
//!
//! ```text
//! cargo run --release --example soak -- --seconds 10
//! ```

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{distributed_lock, LockError, LockManager};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
/// Workers get this long beyond `--seconds` to finish their last sections and report.
const GRACE: Duration = Duration::from_secs(30);

const USAGE: &str = "\
usage: soak [--seconds N] [--processes N] [--tasks N] [--keys N] [--redis-url URL]

  --seconds N      how long to run (default 30)
  --processes N    worker processes (default 4)
  --tasks N        concurrent tasks in each process (default 16)
  --keys N         keys the tasks share (default 8)
  --redis-url URL  Redis to use (default $REDIS_URL, else redis://127.0.0.1:6379)";

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("Redis command failed: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("the lock came without a fencing token, though `fencing = true` asked for one")]
    NoFencingToken,
}

struct App {
    redis: MultiplexedConnection,
    keys: RunKeys,
}

/// One critical section on `key`. Returns whether the fencing token was in order.
#[distributed_lock(key = "soak:{key}", ttl = 5, fencing = true, guard = lock)]
async fn section(key: &str, app: &App) -> Result<bool, AppError> {
    let token = lock.fencing_token().ok_or(AppError::NoFencingToken)?;
    let mut redis = app.redis.clone();
    let (count, last_token): (Option<u64>, Option<u64>) = redis::pipe()
        .hget(app.keys.counters(), key)
        .hget(app.keys.tokens(), key)
        .query_async(&mut redis)
        .await?;
    // Let every other task run between the read and the write: without the lock, this is
    // where a concurrent section would slip in and an increment would be lost.
    tokio::task::yield_now().await;
    redis::pipe()
        .hset(app.keys.counters(), key, count.unwrap_or(0) + 1)
        .hset(app.keys.tokens(), key, token)
        .exec_async(&mut redis)
        .await?;
    Ok(last_token.is_none_or(|last| token > last))
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("error: {message}\n\n{USAGE}");
            return ExitCode::from(64);
        }
    };
    match &args.worker {
        Some((id, run)) => worker(&args, *id, RunKeys::new(run)).await,
        None => parent(&args).await,
    }
}

// ---------------------------------------------------------------------------------------------
// The parent: starts the workers, then checks every key.

async fn parent(args: &Args) -> ExitCode {
    let mut redis = match connect(&args.redis_url).await {
        Ok(redis) => redis,
        Err(error) => return no_redis(&args.redis_url, &error),
    };
    let keys = RunKeys::new(&run_id());
    println!(
        "soak: {} processes x {} tasks over {} keys for {} s (keys {}*)",
        args.processes, args.tasks, args.keys, args.seconds, keys.base
    );
    let result = run_soak(args, &mut redis, &keys).await;
    if let Err(error) = delete_run_keys(&mut redis, &keys).await {
        eprintln!(
            "warning: could not delete this run's keys ({}*): {error}",
            keys.base
        );
    }
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run_soak(
    args: &Args,
    redis: &mut MultiplexedConnection,
    keys: &RunKeys,
) -> Result<bool, AppError> {
    let started = Instant::now();
    let exe = std::env::current_exe().expect("the path of this executable");
    let mut children = Vec::new();
    for id in 0..args.processes {
        let child = tokio::process::Command::new(&exe)
            .args(["--worker", &id.to_string(), "--run", &keys.run])
            .args(["--tasks", &args.tasks.to_string()])
            .args(["--keys", &args.keys.to_string()])
            .args(["--seconds", &args.seconds.to_string()])
            .env("REDIS_URL", &args.redis_url)
            .kill_on_drop(true)
            .spawn();
        match child {
            Ok(child) => children.push((id, child)),
            Err(error) => {
                eprintln!("error: could not start worker {id}: {error}");
                return Ok(false);
            }
        }
    }
    let mut failed_workers = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.seconds) + GRACE;
    for (id, mut child) in children {
        match tokio::time::timeout_at(deadline, child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => {
                eprintln!("worker {id} failed ({status})");
                failed_workers += 1;
            }
            Ok(Err(error)) => {
                eprintln!("worker {id}: could not wait for it: {error}");
                failed_workers += 1;
            }
            Err(_) => {
                eprintln!("worker {id} overran its time; killing it");
                let _ = child.kill().await;
                failed_workers += 1;
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();

    let counters: HashMap<String, u64> = redis.hgetall(keys.counters()).await?;
    let done: HashMap<String, u64> = redis.hgetall(keys.done()).await?;
    let tokens: HashMap<String, u64> = redis.hgetall(keys.tokens()).await?;
    let stats: HashMap<String, u64> = redis.hgetall(keys.stats()).await?;
    let stat = |name: &str| stats.get(name).copied().unwrap_or(0);

    println!("\n  key    counter  sections  last token");
    let mut mismatched = 0;
    for key in key_names(args.keys) {
        let counter = counters.get(&key).copied().unwrap_or(0);
        let sections = done.get(&key).copied().unwrap_or(0);
        let token = tokens.get(&key).copied().unwrap_or(0);
        let flag = if counter == sections {
            ""
        } else {
            "  <- MISMATCH"
        };
        println!("  {key:<5} {counter:>8}  {sections:>8}  {token:>10}{flag}");
        mismatched += u64::from(counter != sections);
    }
    let sections = stat("sections");
    let stale = stat("stale_tokens");
    let errors = stat("errors");
    let violations = stale + mismatched;
    println!();
    println!("  processes x tasks   {} x {}", args.processes, args.tasks);
    println!("  sections            {sections} in {seconds:.2} s");
    println!(
        "  throughput          {:.0} sections/s",
        sections as f64 / seconds
    );
    println!("  failed sections     {errors}");
    println!("  stale tokens        {stale}");
    println!("  keys miscounted     {mismatched}");
    println!("  violations          {violations}");

    let ok = violations == 0 && errors == 0 && failed_workers == 0 && sections > 0;
    if ok {
        println!("\nOK: every increment survived and fencing tokens only went up.");
    } else {
        let workers = format!("{failed_workers} workers failed");
        println!("\nFAILED: {violations} violations, {errors} failed sections, {workers}");
    }
    Ok(ok)
}

// ---------------------------------------------------------------------------------------------
// A worker process.

#[derive(Debug, Default)]
struct Tally {
    /// Completed sections per key index.
    done: Vec<u64>,
    stale_tokens: u64,
    errors: u64,
}

async fn worker(args: &Args, id: usize, keys: RunKeys) -> ExitCode {
    let manager = LockManager::builder(args.redis_url.as_str())
        .key_prefix(keys.lock_prefix())
        .connect()
        .await;
    let redis = match manager.and_then(distlock::init_with) {
        Ok(()) => connect(&args.redis_url).await.map_err(LockError::from),
        Err(error) => Err(error),
    };
    let redis = match redis {
        Ok(redis) => redis,
        Err(error) => {
            eprintln!("worker {id}: cannot use Redis: {error}");
            return ExitCode::from(2);
        }
    };
    let app = Arc::new(App { redis, keys });
    let names: Arc<[String]> = key_names(args.keys).into();
    let stop = Instant::now() + Duration::from_secs(args.seconds);

    let tasks: Vec<_> = (0..args.tasks)
        .map(|task| {
            let (app, names) = (Arc::clone(&app), Arc::clone(&names));
            let seed = u64::from(std::process::id()) << 16 | task as u64;
            tokio::spawn(hammer(app, names, stop, seed))
        })
        .collect();
    let mut total = Tally {
        done: vec![0; args.keys],
        ..Tally::default()
    };
    let mut panicked = false;
    for task in tasks {
        match task.await {
            Ok(tally) => {
                for (sum, n) in total.done.iter_mut().zip(&tally.done) {
                    *sum += n;
                }
                total.stale_tokens += tally.stale_tokens;
                total.errors += tally.errors;
            }
            Err(error) => {
                eprintln!("worker {id}: a task panicked: {error}");
                panicked = true;
            }
        }
    }

    let sections: u64 = total.done.iter().sum();
    let mut report = redis::pipe();
    for (name, n) in names.iter().zip(&total.done) {
        report.hincr(app.keys.done(), name, *n);
    }
    report
        .hincr(app.keys.stats(), "sections", sections)
        .hincr(app.keys.stats(), "stale_tokens", total.stale_tokens)
        .hincr(app.keys.stats(), "errors", total.errors);
    let mut redis = app.redis.clone();
    if let Err(error) = report.exec_async(&mut redis).await {
        eprintln!("worker {id}: could not report: {error}");
        return ExitCode::FAILURE;
    }
    println!(
        "  worker {id} (pid {}): {sections} sections, {} stale tokens, {} failed",
        std::process::id(),
        total.stale_tokens,
        total.errors
    );
    if panicked {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// One task: sections on random keys until `stop`.
async fn hammer(app: Arc<App>, names: Arc<[String]>, stop: Instant, seed: u64) -> Tally {
    let mut tally = Tally {
        done: vec![0; names.len()],
        ..Tally::default()
    };
    let mut random = seed | 1;
    while Instant::now() < stop {
        // xorshift64: cheap randomness, enough to spread tasks over keys.
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        let index = usize::try_from(random % names.len() as u64).expect("below the count");
        match section(&names[index], &app).await {
            Ok(in_order) => {
                tally.done[index] += 1;
                if !in_order {
                    eprintln!("VIOLATION: a stale fencing token on key {}", names[index]);
                    tally.stale_tokens += 1;
                }
            }
            Err(error) => {
                // Report the first few; a flood of identical lines helps nobody.
                if tally.errors < 3 {
                    eprintln!("section on {} failed: {error}", names[index]);
                }
                tally.errors += 1;
            }
        }
    }
    tally
}

// ---------------------------------------------------------------------------------------------
// Redis helpers, key names, arguments.

async fn connect(url: &str) -> Result<MultiplexedConnection, redis::RedisError> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(2)));
    let client = redis::Client::open(url)?;
    let mut redis = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    let () = redis::cmd("PING").query_async(&mut redis).await?;
    Ok(redis)
}

fn no_redis(url: &str, error: &redis::RedisError) -> ExitCode {
    if error.kind() == redis::ErrorKind::InvalidClientConfig {
        eprintln!("error: `{url}` is not a usable Redis URL ({error}); write redis://host:port");
        return ExitCode::from(2);
    }
    eprintln!(
        "error: no Redis answers at {url} ({error}).\n\n\
         The soak needs a Redis server. Start a throwaway one with\n\n    \
             redis-server --port 6379 --save \"\" --appendonly no\n\n\
         (install it with `apt-get install -y redis-server` or `brew install redis`),\n\
         or point the soak at yours with REDIS_URL=redis://host:port or --redis-url URL."
    );
    ExitCode::from(2)
}

/// Deletes every key of this run, including distlock's helper keys of its locks (which contain
/// the lock key, `{<lock key>}:distlock:...` here; among them the fencing counters, which never
/// expire).
async fn delete_run_keys(
    redis: &mut MultiplexedConnection,
    keys: &RunKeys,
) -> Result<(), redis::RedisError> {
    let pattern = format!("*{}*", keys.base);
    let mut cursor: u64 = 0;
    loop {
        let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(redis)
            .await?;
        if !found.is_empty() {
            let _: usize = redis.del(&found).await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

fn key_names(count: usize) -> Vec<String> {
    (0..count).map(|index| format!("k{index}")).collect()
}

/// The names of one run's keys, all under `soak:<run>:`.
#[derive(Debug, Clone)]
struct RunKeys {
    run: String,
    base: String,
}

impl RunKeys {
    fn new(run: &str) -> Self {
        RunKeys {
            run: run.to_owned(),
            base: format!("soak:{run}:"),
        }
    }
    /// Prefix of the lock keys: key `k3` is locked as `<base>lock:soak:k3`.
    fn lock_prefix(&self) -> String {
        format!("{}lock:", self.base)
    }
    /// Hash key -> counter (the read-modify-write).
    fn counters(&self) -> String {
        format!("{}counters", self.base)
    }
    /// Hash key -> fencing token of the last write.
    fn tokens(&self) -> String {
        format!("{}tokens", self.base)
    }
    /// Hash key -> sections completed (reported by the workers at the end).
    fn done(&self) -> String {
        format!("{}done", self.base)
    }
    /// Hash of the workers' totals: sections, `stale_tokens`, errors.
    fn stats(&self) -> String {
        format!("{}stats", self.base)
    }
}

fn run_id() -> String {
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("{:08x}", random & 0xffff_ffff)
}

#[derive(Debug)]
struct Args {
    seconds: u64,
    processes: usize,
    tasks: usize,
    keys: usize,
    redis_url: String,
    /// Set in worker processes: the worker's number and the run id.
    worker: Option<(usize, String)>,
}

impl Args {
    fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut args = Args {
            seconds: 30,
            processes: 4,
            tasks: 16,
            keys: 8,
            redis_url: std::env::var("REDIS_URL").unwrap_or_else(|_| DEFAULT_REDIS_URL.to_owned()),
            worker: None,
        };
        let (mut worker_id, mut run) = (None, None);
        while let Some(flag) = argv.next() {
            if flag == "-h" || flag == "--help" {
                println!("{USAGE}");
                std::process::exit(0);
            }
            let value = argv.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let count = || match value.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("{flag} takes a positive number, not `{value}`")),
            };
            match flag.as_str() {
                "--seconds" => args.seconds = count()? as u64,
                "--processes" => args.processes = count()?,
                "--tasks" => args.tasks = count()?,
                "--keys" => args.keys = count()?,
                "--redis-url" => args.redis_url = value,
                // Internal: how the parent starts a worker.
                "--worker" => worker_id = Some(value.parse().map_err(|_| "bad --worker")?),
                "--run" => run = Some(value),
                _ => return Err(format!("unknown argument `{flag}`")),
            }
        }
        args.worker = worker_id.zip(run);
        Ok(args)
    }
}
