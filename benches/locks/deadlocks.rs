//! Workload 8, **deadlocks**: what deadlock detection costs a waiting section. [`WAITERS`]
//! waiters, each a manager of its own, wait for one held lock over [`WINDOW`], first holding
//! nothing (no detection), then each holding a lock of its own in its guard's scope (each walks
//! every 0.7 s, one hop to a holder that waits for nothing). The row: Redis commands per waiter
//! per second (`INFO commandstats`, every command but the bench's own, those run by scripts
//! included) and the client's CPU time per waiter per second, for both, and the difference per
//! walk.

use std::time::Duration;

use distlock::{LockManager, LockOptions};

use crate::cpu::client_cpu_seconds;
use crate::workloads::Bench;

/// How long commands and CPU are counted: about four walks of every waiter.
const WINDOW: Duration = Duration::from_secs(3);
/// How many waiters wait at once.
const WAITERS: usize = 20;
/// How often a detecting waiter walks (`acquire::deadlock::WALK_EVERY`).
const WALK_EVERY: Duration = Duration::from_millis(700);

/// Commands (but `INFO`) and client CPU seconds over [`WINDOW`] of [`WAITERS`] waiters, each
/// holding a lock of its own in its scope when `holding`.
async fn one_run(url: &str, probe: &redis::Client, holding: bool) -> (u64, f64) {
    let blocked = format!("bench:deadlocks:{holding}");
    let holder = LockManager::connect(url).await.expect("connect");
    let held = holder
        .acquire(&blocked, &LockOptions::new().ttl(Duration::from_secs(120)))
        .await
        .expect("the bench's own key is free");
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(WINDOW + Duration::from_secs(2));
    let mut tasks = Vec::with_capacity(WAITERS);
    for waiter in 0..WAITERS {
        // A manager each, as processes have: every waiter is in the lock's line in Redis
        // (the tasks of one manager wait for their turn in the process first).
        let manager = LockManager::connect(url).await.expect("connect");
        let (options, blocked) = (options.clone(), blocked.clone());
        tasks.push(tokio::spawn(async move {
            let mine = manager
                .acquire(&format!("bench:deadlocks:own:{waiter}"), &options)
                .await
                .expect("the bench's own key is free");
            let wait = manager.acquire(&blocked, &options);
            let waited = if holding {
                mine.scope(wait).await
            } else {
                wait.await
            };
            assert!(waited.is_err(), "the blocked lock stays held");
            mine.release().await.expect("still held");
        }));
    }
    let mut probe = probe
        .get_multiplexed_async_connection()
        .await
        .expect("the bench's connection");
    // Past the first walk (0.4 s) and the line's joins.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (commands_before, cpu_before) = (calls(&mut probe).await, client_cpu_seconds(None));
    tokio::time::sleep(WINDOW).await;
    let (commands_after, cpu_after) = (calls(&mut probe).await, client_cpu_seconds(None));
    for task in tasks {
        task.await.expect("no panic");
    }
    held.release().await.expect("still held");
    let cpu = cpu_after
        .zip(cpu_before)
        .map_or(0.0, |(after, before)| after - before);
    (commands_after - commands_before, cpu)
}

/// Every command's calls in `INFO commandstats` but `INFO`'s (the probe's own).
async fn calls(connection: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(connection)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter(|line| line.starts_with("cmdstat_") && !line.starts_with("cmdstat_info:"))
        .filter_map(|line| {
            line.split(',')
                .find_map(|pair| pair.split(':').nth(1)?.strip_prefix("calls="))
                .and_then(|value| value.parse::<u64>().ok())
        })
        .sum()
}

/// Runs the workload and prints its row.
pub(crate) fn deadlocks(bench: &Bench) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(crate::WORKERS)
        .enable_all()
        .build()
        .expect("a runtime");
    let (plain, detecting) = runtime.block_on(async {
        let plain = one_run(&bench.url, &bench.client, false).await;
        let detecting = one_run(&bench.url, &bench.client, true).await;
        (plain, detecting)
    });
    let per_second = |total: f64| total / WAITERS as f64 / WINDOW.as_secs_f64();
    let walks_per_second = 1.0 / WALK_EVERY.as_secs_f64();
    println!();
    println!("8. deadlocks: a waiting section's cost, holding nothing vs holding a lock (detection), {WAITERS} waiters over {WINDOW:?}");
    for (name, (commands, cpu)) in [("holding nothing", plain), ("holding a lock", detecting)] {
        println!(
            "   {name:>15}: {:>5.2} Redis commands, {:>7.1} us client CPU per waiter per second",
            per_second(commands as f64),
            per_second(cpu) * 1e6
        );
    }
    let extra = per_second(detecting.0 as f64 - plain.0 as f64);
    println!(
        "   detection: {extra:.2} commands per waiter per second, {:.2} per walk (a record renewal, one look; commands run by scripts count)",
        extra / walks_per_second
    );
}
