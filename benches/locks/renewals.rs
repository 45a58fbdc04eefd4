//! Workload 7, **renewals**: what a waiter's renewal of its place in line costs Redis, with one
//! waiter and with 1 000 waiting on one lock (a fleet's startup herd on one hot key). Every
//! waiter renews once a second, so a renewal whose work grew with the line would make the
//! line's work grow with the square of its waiters.
//!
//! A run: one manager holds the lock (a 120 s ttl, which nothing renews); `N` managers, each
//! with its own connections and hand-off channel as a process has, wait for it (for the floor,
//! one waiter on each of [`FLOOR_LINES`] locks, so that a window counts more than 3 renewals);
//! once all are in line and a second and a half has passed (every place renewed once: a place's first renewal
//! after its join looks for it), the bench reads `INFO commandstats` before and after
//! [`WINDOW`]: Redis's time per `EVALSHA` (a script's time includes the commands it runs), and
//! how many ran. Then the holder releases and every waiter takes the lock in turn and releases
//! it. The row: µs of Redis time per renewal at 1 and at 1 000 waiters, and their ratio.

use std::time::Duration;

use distlock::{LockManager, LockOptions};

use crate::workloads::Bench;
use crate::PREFIX;

/// How long renewals are counted: about three renewals of every waiter.
const WINDOW: Duration = Duration::from_secs(3);
/// The line lengths measured: one waiter (the floor), and a herd.
const LINES: [usize; 2] = [1, 1000];
/// How many locks the floor's single waiters wait on, one line each.
const FLOOR_LINES: usize = 20;

/// Redis time per renewal with `waiters` managers in one line (for one waiter, one in each of
/// [`FLOOR_LINES`] lines), in µs, and the renewals counted.
async fn per_renewal(url: &str, probe: &redis::Client, waiters: usize) -> (f64, u64) {
    let lines = if waiters == 1 { FLOOR_LINES } else { 1 };
    let names: Vec<String> = (0..lines)
        .map(|line| format!("bench:renewals:{waiters}:{line}"))
        .collect();
    let holder = LockManager::connect(url).await.expect("connect");
    let mut held = Vec::with_capacity(lines);
    for name in &names {
        held.push(
            holder
                .acquire(name, &LockOptions::new().ttl(Duration::from_secs(120)))
                .await
                .expect("the bench's own key is free"),
        );
    }
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(600));
    let mut tasks = Vec::with_capacity(waiters * lines);
    for name in &names {
        for _ in 0..waiters {
            let manager = LockManager::connect(url).await.expect("connect");
            let (name, options) = (name.clone(), options.clone());
            tasks.push(tokio::spawn(async move {
                let guard = manager.acquire(&name, &options).await?;
                guard.release().await.map(drop)
            }));
        }
    }
    let mut probe = probe
        .get_multiplexed_async_connection()
        .await
        .expect("the bench's connection");
    for name in &names {
        let line = format!("{{{PREFIX}{name}}}:distlock:line");
        loop {
            let length: usize = redis::cmd("LLEN")
                .arg(&line)
                .query_async(&mut probe)
                .await
                .expect("LLEN");
            if length == waiters {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = evalsha_stats(&mut probe).await;
    tokio::time::sleep(WINDOW).await;
    let after = evalsha_stats(&mut probe).await;
    for guard in held {
        guard.release().await.expect("still held");
    }
    for task in tasks {
        task.await
            .expect("no panic")
            .expect("every waiter takes the lock in turn");
    }
    let (calls, usec) = (after.0 - before.0, after.1 - before.1);
    (usec as f64 / calls.max(1) as f64, calls)
}

/// `calls` and `usec` of `cmdstat_evalsha` (0 before any ran).
async fn evalsha_stats(connection: &mut redis::aio::MultiplexedConnection) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(connection)
        .await
        .expect("INFO commandstats");
    let Some(stats) = info
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:"))
    else {
        return (0, 0);
    };
    let field = |name: &str| -> u64 {
        stats
            .split(',')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .and_then(|value| value.parse().ok())
            .unwrap_or(0)
    };
    (field("calls"), field("usec"))
}

/// Runs the workload and prints its row.
pub(crate) fn renewals(bench: &Bench) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(crate::WORKERS)
        .enable_all()
        .build()
        .expect("a runtime");
    let figures: Vec<(usize, f64, u64)> = runtime.block_on(async {
        let mut figures = Vec::new();
        for waiters in LINES {
            let (micros, calls) = per_renewal(&bench.url, &bench.client, waiters).await;
            figures.push((waiters, micros, calls));
        }
        figures
    });
    println!();
    println!("7. renewals: Redis time per renewal of a place in line (INFO commandstats, EVALSHA usec / calls over {WINDOW:?})");
    for (waiters, micros, calls) in &figures {
        let lines = if *waiters == 1 {
            format!(" (in each of {FLOOR_LINES} lines)")
        } else {
            String::new()
        };
        println!("   line renewal, {waiters:>4} waiters{lines}: {micros:>7.1} us per renewal ({calls} renewals)");
    }
    if let [(_, floor, _), (waiters, herd, _)] = figures.as_slice() {
        println!(
            "   line renewal, {waiters} waiters vs 1: {:.2} x (target: about 1; a renewal that scanned the line grew with its length)",
            herd / floor
        );
    }
    eprintln!(
        "renewals done after {:.1} s",
        bench.started.elapsed().as_secs_f64()
    );
}
