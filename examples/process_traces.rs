//! The main demo: a fleet of workers processes traces, and `#[distributed_lock]` makes sure that
//! no trace is ever processed by two of them at once.
//!
//! The scenario: several API instances receive jobs "process trace X" from a shared queue, with
//! many duplicates (retries, at-least-once delivery). Each job fetches the trace, computes an
//! embedding and saves it. Two workers on the same trace at the same time would waste work and,
//! worse, overwrite each other's save. So the function that handles a trace carries
//! `#[distributed_lock(key = "trace:{trace_id}", ttl = 60)]`: a Redis lock per trace id.
//!
//! What runs:
//! - The parent process connects to Redis, pushes the jobs (`--jobs`, default 2000, over
//!   `--traces` trace ids, default 40: every trace appears 50 times, shuffled) into a Redis list
//!   and re-executes itself `--workers` times (default 4) with `--worker N`.
//! - Each worker process runs `--tasks` tasks (default 4). A task pops the next job (`LPOP`) and
//!   calls `process_trace`, until the list is empty. A shared queue rather than a fixed slice
//!   per worker, because that is how real job queues hand out work: whichever worker is free
//!   takes the next job, so duplicates of a trace really do arrive at different processes at the
//!   same moment.
//! - The parent waits for the workers (killing any that overrun), checks the results and prints
//!   a summary. It exits with 1 if any check failed or any worker failed, with 2 when no
//!   Redis answers, and with 130 when interrupted (Ctrl-C: the workers are stopped too).
//!
//! How exclusivity is checked, independently of the lock:
//! - an in-flight count per trace in Redis, incremented when a section starts and decremented
//!   when it ends: a value above 1 means two workers at once (a violation);
//! - "save" is a deliberately non-atomic read-modify-write of the trace's version (read, pause,
//!   write + 1): two holders at once would lose an update, so at the end every trace's version
//!   must equal its number of jobs exactly.
//!
//! Everything lives under a fresh `process_traces:<run id>:` key prefix, locks included, and the
//! parent deletes it at the end, so runs never interfere with each other or with other data.
//!
//! Which Redis: the one at `REDIS_URL` (or `--redis-url`) if set — if it does not answer, the
//! demo exits with instructions; else the one at 127.0.0.1:6379; else, when `redis-server` is
//! installed, a private one on a free port for this run, stopped at the end and on Ctrl-C
//! (`--start-redis` starts one without looking elsewhere).
//!
//! ```text
//! cargo run --release --example process_traces
//! cargo run --release --example process_traces -- --workers 2 --tasks 8
//! ```

#[path = "common/local_redis.rs"]
mod local_redis;

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use distlock::{distributed_lock, LockError, LockManager};
use local_redis::{redacted, LocalRedis};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

/// The parent kills workers still running after this long: a stuck demo must not hang forever.
const WORKER_DEADLINE: Duration = Duration::from_secs(120);

/// The simulated work of a section: fetch the trace, compute its embedding, save it.
const FETCH: Duration = Duration::from_millis(3);
const EMBED: Duration = Duration::from_millis(10);
const SAVE: Duration = Duration::from_millis(2);

const USAGE: &str = "\
usage: process_traces [--workers N] [--tasks N] [--jobs N] [--traces N] [--redis-url URL]
                      [--start-redis]

  --workers N      worker processes to start (default 4)
  --tasks N        concurrent tasks in each worker (default 4)
  --jobs N         jobs to process (default 2000)
  --traces N       distinct trace ids among the jobs (default 40)
  --redis-url URL  Redis to use (default $REDIS_URL, else redis://127.0.0.1:6379, else a
                   private redis-server started for this run)
  --start-redis    start a private redis-server for this run without looking elsewhere";

/// The application's error type. The lock attribute hands its errors (timeout, Redis down) to
/// the caller as `AppError::from(LockError)`, which `#[from]` provides.
#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("Redis command failed: {0}")]
    Redis(#[from] redis::RedisError),
}

/// What a worker task needs: a connection for the application's own data, and its key names.
struct App {
    redis: MultiplexedConnection,
    keys: RunKeys,
}

/// The outcome of one section, for the statistics.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    sections: u64,
    /// Sections that had to wait because another holder had the trace when they asked.
    waited: u64,
    /// Sections that found another section of the same trace running: must stay 0.
    violations: u64,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, other: Tally) {
        self.sections += other.sections;
        self.waited += other.waited;
        self.violations += other.violations;
    }
}

/// Handles one job: fetch the trace, compute its embedding, save it.
///
/// The attribute takes the Redis lock `<prefix>trace:<trace_id>` before the body runs and
/// releases it after, on every path; so for a given trace, one task in the whole fleet runs
/// this body at a time, and jobs for different traces run in parallel. `asked_at` (when the
/// caller asked for the lock) only serves the statistics.
#[distributed_lock(key = "trace:{trace_id}", ttl = 60)]
async fn process_trace(trace_id: &str, asked_at: u64, app: &App) -> Result<Tally, AppError> {
    let mut redis = app.redis.clone();
    let keys = &app.keys;

    // Check in. Under the lock nobody else can be in: a count above 1 is a violation.
    let (in_flight, previous_end): (i64, Option<u64>) = redis::pipe()
        .hincr(keys.in_flight(), trace_id, 1)
        .hget(keys.last_end(), trace_id)
        .query_async(&mut redis)
        .await?;
    let violations = u64::from(in_flight > 1);
    if violations > 0 {
        eprintln!("VIOLATION: trace {trace_id} is being processed by {in_flight} workers at once");
    }

    tokio::time::sleep(FETCH).await; // fetch the trace
    tokio::time::sleep(EMBED).await; // compute its embedding

    // Save: read the version, pause, write version + 1. Not atomic on purpose: only the lock
    // keeps two savers from both reading N and both writing N + 1.
    let version: Option<u64> = redis.hget(keys.versions(), trace_id).await?;
    tokio::time::sleep(SAVE).await;
    let () = redis
        .hset(keys.versions(), trace_id, version.unwrap_or(0) + 1)
        .await?;

    // Check out, noting when: a later section that asked before this moment had to wait for us.
    redis::pipe()
        .hincr(keys.in_flight(), trace_id, -1)
        .hset(keys.last_end(), trace_id, now_micros())
        .exec_async(&mut redis)
        .await?;

    Ok(Tally {
        sections: 1,
        waited: u64::from(previous_end.is_some_and(|end| end > asked_at)),
        violations,
    })
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
// The parent: prepares the jobs, starts the workers, checks and reports.

async fn parent(args: &Args) -> ExitCode {
    let server =
        match LocalRedis::find_or_start("process_traces", args.redis_url.clone(), args.start_redis)
            .await
        {
            Ok(server) => server,
            Err(code) => return code,
        };
    let mut redis = match connect(server.url()).await {
        Ok(redis) => redis,
        Err(error) => {
            eprintln!(
                "error: cannot use Redis at {}: {error}",
                redacted(server.url())
            );
            return ExitCode::from(2);
        }
    };
    let keys = RunKeys::new(&run_id());
    let jobs = shuffled_jobs(args.jobs, args.traces);
    let mut jobs_per_trace: BTreeMap<&str, u64> = BTreeMap::new();
    for trace_id in &jobs {
        *jobs_per_trace.entry(trace_id.as_str()).or_default() += 1;
    }
    println!(
        "process_traces: {} jobs over {} trace ids, {} worker processes x {} tasks (keys {}*)",
        jobs.len(),
        jobs_per_trace.len(),
        args.workers,
        args.tasks,
        keys.base
    );
    // Interrupted: the fleet is dropped, which kills the workers (`kill_on_drop`).
    let fleet = run_fleet(
        args,
        server.url(),
        redis.clone(),
        &keys,
        &jobs,
        &jobs_per_trace,
    );
    let result = server.until_interrupted(fleet).await;
    // Whatever happened, leave nothing behind in Redis.
    if let Err(error) = delete_run_keys(&mut redis, &keys).await {
        eprintln!(
            "warning: could not delete this run's keys ({}*): {error}",
            keys.base
        );
    }
    match result {
        None => ExitCode::from(130),
        Some(Ok(true)) => ExitCode::SUCCESS,
        Some(Ok(false)) => ExitCode::FAILURE,
        Some(Err(error)) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the workers over the jobs and checks the outcome; `Ok(true)` when every check passed.
async fn run_fleet(
    args: &Args,
    url: &str,
    mut redis: MultiplexedConnection,
    keys: &RunKeys,
    jobs: &[String],
    jobs_per_trace: &BTreeMap<&str, u64>,
) -> Result<bool, AppError> {
    let () = redis.rpush(keys.jobs(), jobs).await?;

    let started = Instant::now();
    let exe = std::env::current_exe().expect("the path of this executable");
    let mut children = Vec::new();
    for id in 0..args.workers {
        let child = tokio::process::Command::new(&exe)
            .args(["--worker", &id.to_string(), "--run", &keys.run])
            .args(["--tasks", &args.tasks.to_string()])
            // By environment rather than argument: a password in the URL stays out of `ps`.
            .env("REDIS_URL", url)
            .kill_on_drop(true)
            .spawn();
        match child {
            Ok(child) => children.push((id, child)),
            Err(error) => {
                eprintln!(
                    "error: could not start worker {id} ({}): {error}",
                    exe.display()
                );
                return Ok(false);
            }
        }
    }

    let mut failed_workers = 0;
    let deadline = tokio::time::Instant::now() + WORKER_DEADLINE;
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
                eprintln!("worker {id} still running after {WORKER_DEADLINE:?}; killing it");
                let _ = child.kill().await;
                failed_workers += 1;
            }
        }
    }
    let elapsed = started.elapsed();

    // The checks, all read back from Redis.
    let stats: HashMap<String, u64> = redis.hgetall(keys.stats()).await?;
    let stat = |name: &str| stats.get(name).copied().unwrap_or(0);
    let (sections, waited, violations) = (stat("sections"), stat("waited"), stat("violations"));
    let versions: HashMap<String, u64> = redis.hgetall(keys.versions()).await?;
    let wrong_versions = jobs_per_trace
        .iter()
        .filter(|(trace_id, jobs)| versions.get(**trace_id) != Some(jobs))
        .count();
    let still_in_flight: HashMap<String, i64> = redis.hgetall(keys.in_flight()).await?;
    let still_in_flight = still_in_flight
        .values()
        .filter(|count| **count != 0)
        .count();
    let locks_left = scan(&mut redis, &format!("{}trace:*", keys.lock_prefix()))
        .await?
        .len();
    let jobs_left: u64 = redis.llen(keys.jobs()).await?;

    let seconds = elapsed.as_secs_f64();
    println!();
    println!("  traces                  {}", jobs_per_trace.len());
    println!("  jobs / sections         {} / {sections}", jobs.len());
    println!(
        "  processes x tasks       {} x {}",
        args.workers, args.tasks
    );
    println!("  sections that waited    {waited} (another worker held their trace)");
    println!("  wall time               {seconds:.2} s");
    println!(
        "  throughput              {:.0} sections/s",
        sections as f64 / seconds
    );
    println!("  lost saves              {wrong_versions} traces");
    println!("  locks left in Redis     {locks_left}");
    println!("  violations              {violations}");

    let mut problems = Vec::new();
    if violations > 0 {
        problems.push(format!(
            "{violations} sections overlapped another on the same trace"
        ));
    }
    if wrong_versions > 0 {
        problems.push(format!(
            "{wrong_versions} traces do not have one save per job"
        ));
    }
    if failed_workers > 0 {
        problems.push(format!("{failed_workers} workers failed"));
    }
    if sections != jobs.len() as u64 || jobs_left > 0 {
        problems.push(format!(
            "{sections} sections for {} jobs ({jobs_left} never taken)",
            jobs.len()
        ));
    }
    if still_in_flight > 0 || locks_left > 0 {
        problems.push(format!(
            "{still_in_flight} traces still marked in flight, {locks_left} locks left held"
        ));
    }
    if problems.is_empty() {
        println!("\nOK: every job ran, and no trace was ever processed by two workers at once.");
        Ok(true)
    } else {
        println!("\nFAILED: {}", problems.join("; "));
        Ok(false)
    }
}

/// `jobs` trace ids over `traces` distinct ones, every trace about equally often, in a
/// shuffled order (fixed seed: every run gets the same queue, so runs compare).
fn shuffled_jobs(jobs: usize, traces: usize) -> Vec<String> {
    let mut queue: Vec<String> = (0..jobs)
        .map(|job| format!("t{:03}", job % traces))
        .collect();
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in (1..queue.len()).rev() {
        // xorshift64: a tiny PRNG, enough to shuffle a demo's queue.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        queue.swap(
            i,
            usize::try_from(state % (i as u64 + 1)).expect("at most i"),
        );
    }
    queue
}

// ---------------------------------------------------------------------------------------------
// A worker process: `--tasks` tasks popping jobs until the queue is empty.

async fn worker(args: &Args, id: usize, keys: RunKeys) -> ExitCode {
    // The global client that every `#[distributed_lock]` function uses. A key prefix of this
    // run's own, so that locks of different runs never meet; `distlock::init(url)` is the same
    // with the default prefix `lock:`.
    let url = args
        .redis_url
        .as_deref()
        .unwrap_or(local_redis::DEFAULT_URL);
    let manager = LockManager::builder(url)
        .key_prefix(keys.lock_prefix())
        .connect()
        .await;
    let installed = manager.and_then(distlock::init_with);
    let redis = match installed {
        Ok(()) => connect(url).await.map_err(LockError::from),
        Err(error) => Err(error),
    };
    let redis = match redis {
        Ok(redis) => redis,
        Err(error) => {
            eprintln!(
                "worker {id}: cannot use Redis at {}: {error}",
                redacted(url)
            );
            return ExitCode::from(2);
        }
    };
    let app = Arc::new(App { redis, keys });

    let started = Instant::now();
    let tasks: Vec<_> = (0..args.tasks)
        .map(|_| tokio::spawn(work_through_queue(Arc::clone(&app))))
        .collect();
    let mut total = Tally::default();
    let mut failed = false;
    for task in tasks {
        match task.await {
            Ok(Ok(tally)) => total += tally,
            Ok(Err(error)) => {
                eprintln!("worker {id}: a task failed: {error}");
                failed = true;
            }
            Err(error) => {
                eprintln!("worker {id}: a task panicked: {error}");
                failed = true;
            }
        }
    }

    // Report to the parent through Redis.
    let mut redis = app.redis.clone();
    let reported: Result<(), redis::RedisError> = redis::pipe()
        .hincr(app.keys.stats(), "sections", total.sections)
        .hincr(app.keys.stats(), "waited", total.waited)
        .hincr(app.keys.stats(), "violations", total.violations)
        .exec_async(&mut redis)
        .await;
    if let Err(error) = reported {
        eprintln!("worker {id}: could not report: {error}");
        failed = true;
    }
    println!(
        "  worker {id} (pid {}): {} sections, {} waited, {} violations, {:.2} s",
        std::process::id(),
        total.sections,
        total.waited,
        total.violations,
        started.elapsed().as_secs_f64()
    );
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// One task: pop a job, process it, repeat until the queue is empty.
async fn work_through_queue(app: Arc<App>) -> Result<Tally, AppError> {
    let mut redis = app.redis.clone();
    let mut tally = Tally::default();
    loop {
        let trace_id: Option<String> = redis.lpop(app.keys.jobs(), None).await?;
        let Some(trace_id) = trace_id else {
            return Ok(tally);
        };
        tally += process_trace(&trace_id, now_micros(), &app).await?;
    }
}

// ---------------------------------------------------------------------------------------------
// Redis helpers, key names, arguments.

/// A connection for the application's own data (not the locks: those go through distlock).
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

/// All keys matching `pattern` (SCAN, so a large shared Redis is never blocked).
async fn scan(
    redis: &mut MultiplexedConnection,
    pattern: &str,
) -> Result<Vec<String>, redis::RedisError> {
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(redis)
            .await?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// Deletes every key of this run: its data, its locks, and the locks' helper keys (which
/// start with `{` and contain the lock key, `{<lock key>}:distlock:...` here, hence the
/// leading `*`).
async fn delete_run_keys(
    redis: &mut MultiplexedConnection,
    keys: &RunKeys,
) -> Result<(), redis::RedisError> {
    let found = scan(redis, &format!("*{}*", keys.base)).await?;
    for chunk in found.chunks(500) {
        let _: usize = redis.del(chunk).await?;
    }
    Ok(())
}

/// The names of one run's keys, all under `process_traces:<run>:`.
#[derive(Debug, Clone)]
struct RunKeys {
    run: String,
    base: String,
}

impl RunKeys {
    fn new(run: &str) -> Self {
        RunKeys {
            run: run.to_owned(),
            base: format!("process_traces:{run}:"),
        }
    }
    /// Prefix of the lock keys: the lock of trace `t042` is `<base>lock:trace:t042`.
    fn lock_prefix(&self) -> String {
        format!("{}lock:", self.base)
    }
    /// List: the queue of jobs (trace ids).
    fn jobs(&self) -> String {
        format!("{}jobs", self.base)
    }
    /// Hash trace id -> sections of that trace running right now.
    fn in_flight(&self) -> String {
        format!("{}in_flight", self.base)
    }
    /// Hash trace id -> saved version (one per job when nothing was lost).
    fn versions(&self) -> String {
        format!("{}versions", self.base)
    }
    /// Hash trace id -> when its last section ended (µs since the epoch).
    fn last_end(&self) -> String {
        format!("{}last_end", self.base)
    }
    /// Hash of the workers' totals: sections, waited, violations.
    fn stats(&self) -> String {
        format!("{}stats", self.base)
    }
}

/// A fresh random id for this run.
fn run_id() -> String {
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("{:08x}", random & 0xffff_ffff)
}

/// Microseconds since the epoch. The workers all run on this machine, so they share the clock
/// that orders "asked for the lock" against "previous holder finished".
fn now_micros() -> u64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX)
}

#[derive(Debug)]
struct Args {
    workers: usize,
    tasks: usize,
    jobs: usize,
    traces: usize,
    /// `--redis-url`, else `REDIS_URL`.
    redis_url: Option<String>,
    start_redis: bool,
    /// Set in worker processes: the worker's number and the run id.
    worker: Option<(usize, String)>,
}

impl Args {
    fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut args = Args {
            workers: 4,
            tasks: 4,
            jobs: 2000,
            traces: 40,
            redis_url: std::env::var("REDIS_URL").ok(),
            start_redis: false,
            worker: None,
        };
        let (mut worker_id, mut run) = (None, None);
        while let Some(flag) = argv.next() {
            if flag == "-h" || flag == "--help" {
                println!("{USAGE}");
                std::process::exit(0);
            }
            if flag == "--start-redis" {
                args.start_redis = true;
                continue;
            }
            let value = argv.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let count = || match value.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("{flag} takes a positive number, not `{value}`")),
            };
            match flag.as_str() {
                "--workers" => args.workers = count()?,
                "--tasks" => args.tasks = count()?,
                "--jobs" => args.jobs = count()?,
                "--traces" => args.traces = count()?,
                "--redis-url" => args.redis_url = Some(value),
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
