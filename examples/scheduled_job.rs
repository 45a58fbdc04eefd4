//! A scheduled job that must run on one node of many: three worker processes each start the
//! same job every 2 s on their own clock, and `on_busy = "skip"` with `hold_at_least` makes it
//! run exactly once per period across them.
//!
//! The workers' clocks disagree on purpose: worker 1 runs 300 ms behind worker 0 and worker 2
//! runs 700 ms behind — as hosts whose clocks NTP keeps only roughly in step. Whoever starts a
//! period first runs the job; a late worker finds the lock held and skips. The job itself takes
//! only 50 ms, so without `hold_at_least` the lock would be free again long before the late
//! workers start, and each would run the period again. With `hold_at_least = "1500ms"` the lock
//! stays until 1.5 s after the first start of the period, which covers any clock difference
//! under 1.5 s, and is free again before the next period at 2 s.
//!
//! The parent process re-executes itself three times with `--worker N`, reads what each worker
//! ran, prints which process ran each period, and exits with 1 unless every period ran exactly
//! once (2 when no Redis answers).
//!
//! ```text
//! cargo run --example scheduled_job
//! REDIS_URL=redis://10.0.0.5:6379 cargo run --example scheduled_job -- --periods 10
//! ```

use std::collections::BTreeMap;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlock::{distributed_lock, LockError};

const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
const PERIOD: Duration = Duration::from_secs(2);
const WORKERS: usize = 3;
/// How far behind worker 0's clock each worker's clock runs.
const CLOCK_BEHIND_MS: [u64; WORKERS] = [0, 300, 700];

#[derive(Debug, thiserror::Error)]
enum JobError {
    #[error(transparent)]
    Lock(#[from] LockError),
}

/// The job. One attempt at the lock: if another worker holds it, the body does not run and the
/// call returns `Ok(None)` at once. If this worker gets it, the lock is kept for at least 1.5 s
/// from then, even though the body is done after 50 ms.
#[distributed_lock(
    key = "scheduled_job:{run}:report",
    ttl = 10,
    on_busy = "skip",
    hold_at_least = "1500ms"
)]
async fn send_report(run: &str, period: u32) -> Result<Option<u32>, JobError> {
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(Some(period))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|arg| arg == flag)
            .and_then(|at| args.get(at + 1))
            .cloned()
    };
    let periods: u32 = value("--periods").and_then(|v| v.parse().ok()).unwrap_or(5);
    match value("--worker") {
        Some(worker) => worker_main(
            worker.parse().expect("--worker N"),
            &value("--run").expect("--run ID"),
            value("--start-ms")
                .and_then(|v| v.parse().ok())
                .expect("--start-ms MS"),
            periods,
        ),
        None => parent_main(periods),
    }
}

fn now_ms() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(now.as_millis()).unwrap_or(u64::MAX)
}

/// Starts the workers, collects what each ran, and checks once per period.
fn parent_main(periods: u32) -> ExitCode {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| DEFAULT_REDIS_URL.into());
    // A fresh lock per run, so that runs never meet; the first period starts on a whole
    // period, after the workers have had time to start and connect.
    let run = format!("{:x}", now_ms());
    let step = u64::try_from(PERIOD.as_millis()).unwrap_or(2_000);
    let start_ms = (now_ms() / step + 2) * step;
    let exe = std::env::current_exe().expect("the example's own path");
    let children: Vec<_> = (0..WORKERS)
        .map(|worker| {
            Command::new(&exe)
                .args(["--worker", &worker.to_string(), "--run", &run])
                .args(["--start-ms", &start_ms.to_string()])
                .args(["--periods", &periods.to_string()])
                .env("REDIS_URL", &url)
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a worker process")
        })
        .collect();
    println!("{WORKERS} workers, one job every {PERIOD:?}, {periods} periods; clocks behind worker 0 by {CLOCK_BEHIND_MS:?} ms");

    let mut ran: BTreeMap<u32, Vec<String>> = (0..periods).map(|p| (p, Vec::new())).collect();
    let mut skipped: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    let mut failed = false;
    for child in children {
        let output = child.wait_with_output().expect("wait for a worker");
        if output.status.code() == Some(2) {
            eprintln!("error: no Redis at {url} (start one with: redis-server --save \"\" --appendonly no)");
            return ExitCode::from(2);
        }
        failed |= !output.status.success();
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
                    .map(str::to_owned)
            };
            if let (Some(period), Some(worker), Some(pid)) =
                (field("period"), field("worker"), field("pid"))
            {
                let period: u32 = period.parse().unwrap_or(u32::MAX);
                let who = format!("worker {worker} (pid {pid})");
                if line.starts_with("ran ") {
                    ran.entry(period).or_default().push(who);
                } else {
                    skipped.entry(period).or_default().push(who);
                }
            }
        }
    }
    let list = |who: &[String]| {
        if who.is_empty() {
            "nobody".to_owned()
        } else {
            who.join(", ")
        }
    };
    for (period, runners) in &ran {
        let skippers = skipped.get(period).map_or(&[][..], Vec::as_slice);
        println!(
            "period {period}: ran by {}; skipped by {}",
            list(runners),
            list(skippers)
        );
    }
    let once = ran.values().all(|runners| runners.len() == 1);
    if once && !failed {
        println!("OK: every period ran exactly once");
        ExitCode::SUCCESS
    } else {
        println!("FAILED: a period did not run exactly once, or a worker failed");
        ExitCode::FAILURE
    }
}

/// One worker: at each period's start on its own (late) clock, runs the job.
fn worker_main(worker: usize, run: &str, start_ms: u64, periods: u32) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| DEFAULT_REDIS_URL.into());
        if distlock::init(&url).await.is_err() {
            return ExitCode::from(2);
        }
        let step = u64::try_from(PERIOD.as_millis()).unwrap_or(2_000);
        for period in 0..periods {
            // This worker's clock reads "start of the period" this much later than worker 0's.
            let at = start_ms + u64::from(period) * step + CLOCK_BEHIND_MS[worker];
            tokio::time::sleep(Duration::from_millis(at.saturating_sub(now_ms()))).await;
            let outcome = match send_report(run, period).await {
                Ok(Some(_)) => "ran",
                Ok(None) => "skipped",
                Err(error) => {
                    eprintln!("worker {worker}: period {period}: {error}");
                    return ExitCode::FAILURE;
                }
            };
            println!(
                "{outcome} period={period} worker={worker} pid={}",
                std::process::id()
            );
        }
        ExitCode::SUCCESS
    })
}
