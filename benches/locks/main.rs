//! Where distlock stands: lock cycle, contention and parallel keys, next to the raw-Redis floor
//! and to rslock, all in one run against one private `redis-server`; and the same cycle over a
//! Redis Cluster and over Redlock, against servers the bench starts as well.
//!
//! ```text
//! cargo bench --bench locks                                # full run (1-2 minutes on 2 cores)
//! DISTLOCK_BENCH_QUICK=1 cargo bench --bench locks         # small counts, for development
//! REDIS_URL=redis://host:6379/ cargo bench --bench locks   # an existing server instead
//! DISTLOCK_BENCH_ONLY=cycle,parallel ...                   # some workloads only
//!                                       (cycle, contend, parallel, backends, fleet)
//! cargo bench --bench locks -- cycle parallel              # the same, as arguments
//! cargo bench --bench locks -- fleet                       # only the fleet workload (~40 s)
//! cargo bench --bench locks -- fleet --quick               # the same, 1 round (~10 s)
//! DISTLOCK_BENCH_CONTENDERS="floor,distlock manual" ...    # some contenders only (profiling)
//! DISTLOCK_BENCH_FLEET_SHAPES=16x1 DISTLOCK_BENCH_FLEET_SECTIONS=50 DISTLOCK_BENCH_FLEET_ROUNDS=3
//!                                                          # fleet configurations and counts
//! ```
//!
//! Prints a table and writes the same numbers, with the machine they came from, to
//! `target/distlock-bench.json` (or `$CARGO_TARGET_DIR/distlock-bench.json`).
//!
//! # Workloads
//!
//! 1. **cycle** — one task, `N` uncontended acquire + release cycles, each on a new key, on a
//!    tokio `current_thread` runtime (the same one for every contender):
//!    - `floor`: raw redis-rs on a multiplexed connection, exactly the commands of a cycle:
//!      `SET key token NX PX 30000`, then the compare-and-delete script by SHA
//!      (`redis::Script::invoke_async`), one after the other;
//!    - `floor with distlock's commands`: the same raw client sending exactly what distlock
//!      sends for an uncontended cycle: `SET NX PX`, then distlock's release script, which also
//!      names the lock's waiters key (whose name is the wake-up channel too). A diagnostic: the
//!      distance from it to distlock is client-side cost only, and from the floor to it the
//!      cost of that extra key;
//!    - `distlock manual`: `manager.acquire(name, &options)` then `guard.release()`;
//!    - `distlock attribute`: a `#[distributed_lock(key = "bench:{i}", ttl = 30)]` function
//!      with an empty body, on the global client (`distlock::init_with`); the manual API uses that
//!      same global manager, so the two differ only by what the attribute adds;
//!    - `rslock`: `LockManager::acquire` then `LockGuard::release`.
//!
//!    Besides the time per cycle, every round reads the CPU time of this process (all threads,
//!    `/proc/self/task/*/schedstat`) and of Redis (`INFO cpu`) before and after, and reports
//!    both per cycle. While workload 1 runs, one `SCHED_IDLE` spinner per CPU keeps the vCPUs
//!    from halting between round trips (see `idle`; `DISTLOCK_BENCH_IDLE_SPIN=0`).
//! 2. **contend** — `W` = 8 tasks on one key, `M` sections each, on a tokio `multi_thread`
//!    runtime with 2 workers. The critical section lasts 1 ms, measured precisely: the holder
//!    spins until `acquired_at + 1 ms`, calling `tokio::task::yield_now()` between checks (a
//!    `tokio::time::sleep` would round up to the next 1 ms timer tick). Per section the bench
//!    records holder, acquire-call start, acquired-at (acquire returned) and release-start
//!    (just before `release()` is called). The **hand-off gap** is
//!    `next.acquired_at − previous.release_start`, only for consecutive sections held by
//!    different tasks: how long the resource sits unused between two holders, including the
//!    release round trip. The **longest wait** is the longest acquire call (start → acquired).
//!    rslock's `acquire` retries by itself (`set_retry(count, delay)`: a random pause in
//!    `0..delay` after each failed attempt); it runs twice, with its documented defaults
//!    (3 tries, 200 ms) and tuned to the 1 ms section (3 tries, 2 ms). A `tokio::sync::Mutex`
//!    handed over by the same tasks, without Redis, shows what the runtime and the machine's
//!    scheduling cost by themselves.
//! 3. **parallel** — 256 tasks, each `K` cycles on keys of its own, through one `LockManager`,
//!    on the same `multi_thread` runtime; the floors do the same on one multiplexed connection
//!    shared by the 256 tasks; rslock (one `LockManager`) for information. CPU per cycle as in 1.
//! 4. **attribute overhead** — workload 1, `distlock attribute` against `distlock manual`.
//! 5. **backends** (row label `5 backends`) — workload 1's `distlock manual` (one task, `N5`
//!    uncontended `manager.acquire(name, &options)` + `guard.release()` cycles on new keys, the
//!    same `current_thread` runtime, idle spinners as in 1) through three managers, each on
//!    servers of its own that the bench starts: `LockManager::builder(url)` on one standalone
//!    server (the private server of 1-3), `LockManager::cluster_builder` on a Redis Cluster of 3
//!    masters without replicas, and `LockManager::redlock_builder` on 5 independent masters
//!    (every option at its default but the response timeout, see `RESPONSE_TIMEOUT`; Redlock's
//!    per-node timeout stays 100 ms). Rows: time per cycle, this process's CPU per cycle, and
//!    Redis's CPU per cycle summed over every node of the backend; then, for cluster and
//!    Redlock, `vs standalone`: the per-round ratio of their time per cycle to standalone's,
//!    whose median is the target (Redlock ≤ 1.5 × standalone, which the concurrent fan-out to
//!    the masters makes possible; cluster informational). Skipped, with a note, under `REDIS_URL`
//!    (it needs servers of its own). Starting the 8 extra servers takes a few seconds; `N5` is
//!    sized so that the whole workload stays under 30 s on 2 cores.
//! 6. **fleet** — one key contended by several OS processes: `P` worker processes (this binary
//!    run again) × `T` tasks × 25 sections of 1 ms, for 8x1, 16x1 and 4x2, each worker with its
//!    own runtime and client, all started together; distlock against a hand-written
//!    `SET NX PX` lock polling every 100 ms (and every 5 ms); 5 rounds (quick: 1) after one
//!    uncounted 2x1 run per contender, contenders in rotated order within a round. Holder and
//!    process changes, longest wait, cross-process hand-off gap, Redis commands per section,
//!    busy fraction, overlaps: see `fleet/mod.rs`. Its figures are tables of their own and the
//!    `fleet` member of the JSON.
//!
//! Every workload runs `R` rounds after a warm-up round; in each round every contender runs
//! once, in an order rotated from round to round, so that drift of the shared machine hits all
//! of them alike. In workload 1 (and so 4), whose contenders are within a few percent of each
//! other, a round goes further: its `N` cycles per contender run in turns of 250 cycles (about
//! 20 ms), the contenders taking turns in rotated order, so that each samples the same moments. A figure is the median over the rounds, with min..max as its spread. A ratio
//! is the median over the rounds of the round's ratio (contenders of one round ran within a
//! second or two of each other, so pairing cancels most of the machine's drift). Targets are
//! judged on these medians, except the longest wait, which is judged on the worst round. A section that starts before the previous one ended fails the
//! run (after the report): the locks must stay locks while being timed.
//!
//! The modules: `contenders` (each lock under test, and the floor), `workloads` (what workloads
//! share beyond their contenders), `statistics` (summaries, percentiles, rotated rounds, hand-off
//! figures), `cpu` (CPU time of this process and of Redis), `report` (the rows, targets and
//! machine, as text and JSON), `fleet` (the workload across processes), `idle` (the idle
//! spinners), `rslock` (the rslock contender); `main` runs the workloads in order.

mod contenders;
mod cpu;
mod fleet;
mod idle;
mod report;
// rslock's public API exists only with its `tokio-comp` feature (enabled in Cargo.toml).
mod rslock;
mod statistics;
mod workloads;

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{LockManager, LockOptions};

use crate::contenders::{next_keys, Contender, Cycler, Floor, NEXT_KEY};
use crate::cpu::{client_cpu_seconds, CpuMeter};
use crate::idle::IdleSpinners;
use crate::report::{
    format_ratio, format_value, load_average, number, push_cycle_rows, push_rows, summary, Machine,
    Row, Target, INFO,
};
use crate::rslock::Rslock;
use crate::statistics::{
    analyse, interleaved_rounds, micros, rounds, PickContend, Summary, CYCLE_BLOCK,
};
use crate::workloads::Backend;

/// The compare-and-delete script of the floor (and of every Redis lock since the Redlock page).
const FLOOR_RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Lock ttl everywhere (distlock's default): long enough never to expire during the bench.
const TTL: Duration = Duration::from_secs(30);
/// Every lock key starts with this (distlock's default prefix, used by all contenders).
const PREFIX: &str = "lock:";
/// Response timeout of the floor's and distlock's connections (their defaults: 500 ms and 1 s).
/// A timer per command either way, so the cost is the same; but a shared machine that stalls
/// for half a second under 256 pipelined tasks must not end the bench. (rslock keeps redis-rs's
/// default; its `acquire` retries on errors, and its release is best effort.)
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Worker threads of the multi-thread runtime (workloads 2 and 3).
const WORKERS: usize = 2;

const FLOOR: &str = "floor";
const FLOOR_SCRIPTS: &str = "floor with distlock's commands";
const MANUAL: &str = "distlock manual";
const ATTRIBUTE: &str = "distlock attribute";
const DISTLOCK: &str = "distlock";
const RSLOCK: &str = "rslock";
const RSLOCK_DEFAULT: &str = "rslock (defaults: 3 x 0..200 ms)";
const RSLOCK_TUNED: &str = "rslock (tuned: 3 x 0..2 ms)";
const IN_PROCESS: &str = "tokio::sync::Mutex (no Redis)";
const STANDALONE: &str = "distlock standalone";
const CLUSTER: &str = "distlock cluster (3 masters)";
const REDLOCK: &str = "distlock redlock (5 masters)";
/// Workload 5's row label (`DISTLOCK_BENCH_ONLY=backends` selects it).
const BACKENDS: &str = "5 backends";

/// Counts of one run.
#[derive(Debug, Clone)]
struct Config {
    rounds: usize,
    cycle_n: usize,
    contend_tasks: usize,
    contend_m: usize,
    critical: Duration,
    parallel_tasks: usize,
    parallel_k: usize,
    /// Cycles per round of workload 5, per backend.
    backends_n: usize,
    /// Workloads to run (`DISTLOCK_BENCH_ONLY=cycle,contend,parallel,backends`; default all).
    only: Option<Vec<String>>,
    /// Contenders to run (`DISTLOCK_BENCH_CONTENDERS=floor,distlock manual`; default all).
    contenders: Option<Vec<String>>,
    fleet: fleet::FleetConfig,
}

impl Config {
    fn from_env() -> Self {
        let quick = std::env::var_os("DISTLOCK_BENCH_QUICK").is_some_and(|v| v != "0")
            || std::env::args().any(|arg| arg == "--quick");
        // `cargo bench --bench locks -- contend`: workloads named as arguments (cargo itself adds
        // `--bench`, a flag).
        let named: Vec<String> = std::env::args()
            .skip(1)
            .filter(|arg| !arg.starts_with('-'))
            .collect();
        let full = Config {
            rounds: 15,
            cycle_n: 5000,
            contend_tasks: 8,
            contend_m: 60,
            critical: Duration::from_millis(1),
            parallel_tasks: 256,
            parallel_k: 50,
            backends_n: 2000,
            only: std::env::var("DISTLOCK_BENCH_ONLY")
                .ok()
                .map(|list| list.split(',').map(|name| name.trim().to_owned()).collect())
                .or((!named.is_empty()).then_some(named)),
            contenders: std::env::var("DISTLOCK_BENCH_CONTENDERS")
                .ok()
                .map(|list| list.split(',').map(|name| name.trim().to_owned()).collect()),
            fleet: fleet::FleetConfig::from_env(quick),
        };
        if quick {
            Config {
                rounds: 3,
                cycle_n: 300,
                contend_m: 10,
                parallel_k: 5,
                backends_n: 200,
                ..full.clone()
            }
        } else {
            full
        }
    }

    fn runs(&self, workload: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|name| name == workload))
    }

    fn includes(&self, contender: &str) -> bool {
        self.contenders
            .as_ref()
            .is_none_or(|names| names.iter().any(|name| name == contender))
    }
}

// ---------------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------------

fn main() {
    // A worker process of the fleet workload: this binary, started again by the bench.
    if fleet::run_worker_if_asked() {
        return;
    }
    let started = Instant::now();
    let config = Config::from_env();
    let load_before = load_average();
    let nproc = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    // Idle spinners (see `idle`) during workload 1 only: one task waiting on one round
    // trip after another leaves the CPUs idle, and a halted vCPU costs 100+ us per wake-up on
    // some VMs. Workloads 2 and 3 keep a CPU busy by themselves, and there, on the VM this was
    // written on, spinners made the tail worse (hand-off gap p99 1.5-2.7 ms with them, 0.7-1.1
    // ms without, 3 A/B pairs): a vCPU that never idles gets preempted by the host instead.
    // DISTLOCK_BENCH_IDLE_SPIN=0 turns them off.
    let spin = std::env::var_os("DISTLOCK_BENCH_IDLE_SPIN").is_none_or(|v| v != "0");
    let mut spinners_running = 0;

    // A private server on a free port (killed when `server` drops), unless REDIS_URL is set.
    let (server, url) = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => (None, url),
        _ => {
            let server = test_support::RedisServer::start();
            let url = server.url();
            (Some(server), url)
        }
    };
    NEXT_KEY.store(u64::from(std::process::id()) << 32, Ordering::Relaxed);
    let client = redis::Client::open(url.as_str()).expect("bad Redis URL");

    // Workload 1 runs on a current_thread runtime, 2 and 3 on a multi_thread one. Every
    // contender has a connection of its own on each runtime (a redis-rs connection is driven
    // by a task of the runtime that made it); distlock's global manager makes one per runtime.
    let single = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("cannot build the current_thread runtime");
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
        .expect("cannot build the multi_thread runtime");

    let redis_version = single.block_on(async {
        let mut connection = client
            .get_multiplexed_async_connection()
            .await
            .expect("cannot connect to Redis");
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut connection)
            .await
            .expect("INFO failed");
        info.lines()
            .find_map(|line| line.strip_prefix("redis_version:"))
            .unwrap_or("unknown")
            .trim()
            .to_owned()
    });
    // `distlock::init(url)` with a longer response timeout (see RESPONSE_TIMEOUT).
    let global = single
        .block_on(
            LockManager::builder(url.as_str())
                .response_timeout(RESPONSE_TIMEOUT)
                .connect(),
        )
        .expect("cannot connect distlock");
    distlock::init_with(global).expect("distlock::init_with failed");
    // `connect` has just loaded distlock's release script: the diagnostic floor sends the same
    // script by its SHA.
    let copy_is_current: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(redis::Script::new(&lock_runtime::release_script_source()).get_hash())
        .query(&mut client.get_connection().expect("cannot connect to Redis"))
        .expect("SCRIPT EXISTS failed");
    assert_eq!(
        copy_is_current,
        [true],
        "the benchmark's floor does not send the release script distlock loads"
    );
    // The manual API uses the global manager too, so it differs from the attribute only in
    // what the attribute adds.
    let manager = distlock::global().expect("initialised above").clone();
    let options = LockOptions::new().ttl(TTL);
    println!(
        "distlock bench: redis {redis_version} at {url} ({}), {} rounds after a warm-up round",
        if server.is_some() {
            "private server"
        } else {
            "REDIS_URL"
        },
        config.rounds
    );
    let mut rows: Vec<Row> = Vec::new();
    let mut meter = CpuMeter::new(&client);

    // ---- 1. cycle (and 4. attribute overhead) -------------------------------------------------
    let mut keys_left = None;
    if config.runs("cycle") {
        if spin {
            let spinners = IdleSpinners::start(nproc);
            spinners_running = spinners.running();
            meter.spinners = Some(spinners);
        }
        let floor = single.block_on(Floor::connect(&client));
        let mut cyclers: Vec<(&'static str, Cycler)> = vec![
            (FLOOR, Cycler::Floor(floor.clone())),
            (FLOOR_SCRIPTS, Cycler::FloorScripts(floor)),
            (MANUAL, Cycler::Manual(manager.clone(), options.clone())),
            (ATTRIBUTE, Cycler::Attribute),
        ];
        cyclers.push((RSLOCK, Cycler::Rslock(Rslock::new(&client, None))));
        cyclers.retain(|(name, _)| config.includes(name));
        let n = config.cycle_n;
        let results = interleaved_rounds(cyclers.len(), config.rounds, n, |contender, count| {
            let first = next_keys(count);
            let cycler = &mut cyclers[contender].1;
            let (elapsed, client_cpu, redis_cpu) = meter.measure(count, || {
                single.block_on(async {
                    let start = Instant::now();
                    cycler.run(first..first + count).await;
                    start.elapsed()
                })
            });
            (micros(elapsed) / count as f64, client_cpu, redis_cpu)
        });
        let names: Vec<_> = cyclers.iter().map(|(name, _)| *name).collect();
        push_cycle_rows(
            &mut rows,
            ("1 cycle", "time per cycle", "us"),
            &names,
            &results,
            RSLOCK,
        );
        keys_left = server.as_ref().map(|server| {
            let keys: i64 = redis::cmd("DBSIZE")
                .query(&mut server.conn())
                .expect("DBSIZE failed");
            keys
        });
        meter.spinners = None; // stops them
        eprintln!("cycle done after {:.1} s", started.elapsed().as_secs_f64());
    }

    // ---- 2. contend -------------------------------------------------------------------------
    let mut overlaps = 0;
    if config.runs("contend") {
        let mut contenders: Vec<(&'static str, Contender)> = vec![
            (DISTLOCK, Contender::Distlock(manager.clone())),
            (
                IN_PROCESS,
                Contender::InProcess(Arc::new(tokio::sync::Mutex::new(()))),
            ),
        ];
        for (name, retry) in [
            (RSLOCK_DEFAULT, None),
            (RSLOCK_TUNED, Some((3, Duration::from_millis(2)))),
        ] {
            contenders.push((name, Contender::Rslock(Rslock::new(&client, retry))));
        }
        contenders.retain(|(name, _)| config.includes(name));
        let mut contend_round = 0u64;
        let results = rounds(contenders.len(), config.rounds, |contender, warm_up| {
            contend_round += 1;
            let name = format!("bench:contend:{}:{contend_round}", std::process::id());
            let m = if warm_up {
                config.contend_m.div_ceil(4)
            } else {
                config.contend_m
            };
            let contender = &contenders[contender].1;
            let (sections, wall) = multi.block_on(async {
                let start = Instant::now();
                let tasks: Vec<_> = (0..config.contend_tasks)
                    .map(|holder| {
                        tokio::spawn(contender.clone().sections(
                            holder,
                            name.clone(),
                            m,
                            config.critical,
                        ))
                    })
                    .collect();
                let mut sections = Vec::new();
                for task in tasks {
                    sections.extend(task.await.expect("a contending task panicked"));
                }
                (sections, start.elapsed())
            });
            analyse(sections, wall)
        });
        overlaps = results.iter().flatten().map(|round| round.overlaps).sum();
        let metrics: [(&'static str, &'static str, PickContend); 5] = [
            ("sections/s", "1/s", |round| round.sections_per_s),
            ("hand-off gap p50", "us", |round| round.gap_p50_us),
            ("hand-off gap p99", "us", |round| round.gap_p99_us),
            ("longest wait", "ms", |round| round.longest_wait_ms),
            ("changed hands", "%", |round| round.changed_hands_pct),
        ];
        for (metric, unit, pick) in metrics {
            let figures: Vec<_> = contenders
                .iter()
                .zip(&results)
                .map(|((name, _), rounds)| (*name, Summary::new(rounds.iter().map(pick).collect())))
                .collect();
            push_rows(
                &mut rows,
                ("2 contend", metric, unit),
                &figures,
                None,
                Some(RSLOCK_DEFAULT),
            );
        }
        eprintln!(
            "contend done after {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }

    // ---- 3. parallel ------------------------------------------------------------------------
    if config.runs("parallel") {
        let floor = multi.block_on(Floor::connect(&client));
        let mut cyclers: Vec<(&'static str, Cycler)> = vec![
            (FLOOR, Cycler::Floor(floor.clone())),
            (FLOOR_SCRIPTS, Cycler::FloorScripts(floor)),
            (DISTLOCK, Cycler::Manual(manager.clone(), options.clone())),
        ];
        cyclers.push((RSLOCK, Cycler::Rslock(Rslock::new(&client, None))));
        cyclers.retain(|(name, _)| config.includes(name));
        let (tasks, k) = (config.parallel_tasks, config.parallel_k);
        let results = rounds(cyclers.len(), config.rounds, |contender, warm_up| {
            let k = if warm_up { k.div_ceil(5) } else { k } as u64;
            let cycler = &cyclers[contender].1;
            let (elapsed, client_cpu, redis_cpu) = meter.measure(tasks as u64 * k, || {
                multi.block_on(async {
                    let start = Instant::now();
                    let handles: Vec<_> = (0..tasks)
                        .map(|_| {
                            let first = next_keys(k);
                            let mut cycler = cycler.clone();
                            tokio::spawn(async move { cycler.run(first..first + k).await })
                        })
                        .collect();
                    for handle in handles {
                        handle.await.expect("a parallel task panicked");
                    }
                    start.elapsed()
                })
            });
            (
                (tasks as u64 * k) as f64 / elapsed.as_secs_f64(),
                client_cpu,
                redis_cpu,
            )
        });
        let names: Vec<_> = cyclers.iter().map(|(name, _)| *name).collect();
        push_cycle_rows(
            &mut rows,
            ("3 parallel", "cycles/s", "1/s"),
            &names,
            &results,
            RSLOCK,
        );
        eprintln!(
            "parallel done after {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }

    // ---- 5. backends -------------------------------------------------------------------------
    // Workload 5's servers stay up until the end, after the runtime that drives the managers'
    // connections (like `server`).
    let mut backend_cluster: Option<test_support::RedisCluster> = None;
    let mut backend_masters: Option<test_support::RedisServers> = None;
    let mut keys_left_backends = None;
    if config.runs("backends") {
        if let Some(standalone) = server.as_ref() {
            let backends_started = Instant::now();
            let mut backends = Vec::new();
            if config.includes(STANDALONE) {
                let builder = LockManager::builder(url.as_str());
                let nodes = std::slice::from_ref(standalone);
                backends.push(Backend::connect(STANDALONE, &single, builder, nodes));
            }
            if config.includes(CLUSTER) {
                let cluster = backend_cluster.insert(test_support::RedisCluster::start(3, 0));
                let builder = LockManager::cluster_builder(&cluster.urls());
                backends.push(Backend::connect(CLUSTER, &single, builder, cluster.nodes()));
            }
            if config.includes(REDLOCK) {
                let masters = backend_masters.insert(test_support::RedisServers::start(5));
                let builder = LockManager::redlock_builder(&masters.urls());
                backends.push(Backend::connect(REDLOCK, &single, builder, masters));
            }
            eprintln!(
                "backends: servers up and managers connected in {:.1} s",
                backends_started.elapsed().as_secs_f64()
            );
            let spinners = spin.then(|| IdleSpinners::start(nproc));
            spinners_running =
                spinners_running.max(spinners.as_ref().map_or(0, IdleSpinners::running));
            let n = config.backends_n;
            let results = rounds(backends.len(), config.rounds, |backend, warm_up| {
                let n = if warm_up { n.div_ceil(10) } else { n } as u64;
                let first = next_keys(n);
                let backend = &mut backends[backend];
                let client_before = client_cpu_seconds(spinners.as_ref());
                let redis_before = backend.redis_cpu_seconds();
                let elapsed = single.block_on(async {
                    let start = Instant::now();
                    backend.cycler.run(first..first + n).await;
                    start.elapsed()
                });
                let client_after = client_cpu_seconds(spinners.as_ref());
                let redis_after = backend.redis_cpu_seconds();
                let per_cycle = |a: Option<f64>, b: Option<f64>| {
                    a.zip(b).map(|(a, b)| (b - a) * 1e6 / n as f64)
                };
                (
                    micros(elapsed) / n as f64,
                    per_cycle(client_before, client_after),
                    per_cycle(redis_before, redis_after),
                )
            });
            drop(spinners);
            keys_left_backends = Some(backends.iter_mut().map(Backend::keys).sum::<i64>());
            let names: Vec<_> = backends.iter().map(|backend| backend.name).collect();
            // Paired ratios: each round's time per cycle over standalone's in the same round.
            let times: Vec<Vec<f64>> = results
                .iter()
                .map(|rounds| rounds.iter().map(|round| round.0).collect())
                .collect();
            let mut ratio_rows = Vec::new();
            if let Some(base) = names.iter().position(|name| *name == STANDALONE) {
                for (index, name) in names.iter().enumerate().filter(|(i, _)| *i != base) {
                    let ratios = times[index]
                        .iter()
                        .zip(&times[base])
                        .map(|(time, base)| time / base)
                        .collect();
                    ratio_rows.push(Row {
                        workload: BACKENDS,
                        contender: name,
                        metric: "vs standalone",
                        unit: "x",
                        summary: Summary::new(ratios),
                        vs_floor: None,
                        vs_rslock: None,
                    });
                }
            }
            push_cycle_rows(
                &mut rows,
                (BACKENDS, "time per cycle", "us"),
                &names,
                &results,
                RSLOCK,
            );
            rows.extend(ratio_rows);
            // The managers go now; their connections' tasks stay idle in `single` until it drops.
            drop(backends);
            eprintln!(
                "backends done after {:.1} s ({:.1} s for this workload)",
                started.elapsed().as_secs_f64(),
                backends_started.elapsed().as_secs_f64()
            );
        } else {
            println!(
                "{BACKENDS} skipped: REDIS_URL is set, and this workload compares servers the bench starts itself"
            );
        }
    }

    // ---- 6. fleet ---------------------------------------------------------------------------
    let fleet = config.runs("fleet").then(|| {
        let report = fleet::run(&url, &config.fleet, |name| config.includes(name));
        eprintln!("fleet done after {:.1} s", started.elapsed().as_secs_f64());
        report
    });

    // ---- targets ----------------------------------------------------------------------------
    let ratio = |a: Option<&Summary>, b: Option<&Summary>| a.zip(b).map(|(a, b)| a.ratio_to(b));
    let cycle = |contender| summary(&rows, "1 cycle", contender, "time per cycle");
    let parallel = |contender| summary(&rows, "3 parallel", contender, "cycles/s");
    let contend = |metric| summary(&rows, "2 contend", DISTLOCK, metric).map(Summary::median);
    let max_wait_ms = 3.0 * config.contend_tasks as f64 * config.critical.as_secs_f64() * 1e3;
    let vs_standalone =
        |contender| summary(&rows, BACKENDS, contender, "vs standalone").map(Summary::median);
    let targets = [
        Target {
            name: "1 cycle: distlock manual / floor",
            value: ratio(cycle(MANUAL), cycle(FLOOR)),
            op: "<=",
            limit: 1.10,
        },
        Target {
            name: "4 attribute overhead: attribute / manual",
            value: ratio(cycle(ATTRIBUTE), cycle(MANUAL)),
            op: "<=",
            limit: 1.03,
        },
        Target {
            name: "1 cycle: rslock / distlock manual",
            value: ratio(cycle(RSLOCK), cycle(MANUAL)),
            op: ">=",
            limit: 1.3,
        },
        Target {
            name: "2 contend: hand-off gap p50 (ms)",
            value: contend("hand-off gap p50").map(|us| us / 1e3),
            op: "<=",
            limit: 0.2,
        },
        Target {
            name: "2 contend: hand-off gap p99 (ms)",
            value: contend("hand-off gap p99").map(|us| us / 1e3),
            op: "<=",
            limit: 1.0,
        },
        Target {
            name: "2 contend: longest wait, worst round (ms)",
            value: summary(&rows, "2 contend", DISTLOCK, "longest wait").map(Summary::max),
            op: "<=",
            limit: max_wait_ms,
        },
        Target {
            name: "2 contend: changed hands (%)",
            value: contend("changed hands"),
            op: ">=",
            limit: 90.0,
        },
        Target {
            name: "3 parallel: distlock / floor",
            value: ratio(parallel(DISTLOCK), parallel(FLOOR)),
            op: ">=",
            limit: 0.85,
        },
        Target {
            name: "5 backends: redlock / standalone",
            value: vs_standalone(REDLOCK),
            op: "<=",
            limit: 1.5,
        },
        Target {
            name: "5 backends: cluster / standalone (info)",
            value: vs_standalone(CLUSTER),
            op: INFO,
            limit: f64::NAN,
        },
    ];
    let machine = Machine::describe(redis_version, load_before);
    let total = started.elapsed();

    // ---- table ------------------------------------------------------------------------------
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{:<10} {:<32} {:<16} {:>10} {:>19} {:>7} {:>8}",
        "workload", "contender", "metric", "median", "min..max", "/floor", "/rslock"
    );
    let _ = writeln!(out, "{}", "-".repeat(108));
    for row in &rows {
        let _ = writeln!(
            out,
            "{:<10} {:<32} {:<16} {:>7} {:<2} {:>19} {:>7} {:>8}",
            row.workload,
            row.contender,
            row.metric,
            format_value(row.summary.median()),
            row.unit,
            format!(
                "{}..{}",
                format_value(row.summary.min()),
                format_value(row.summary.max())
            ),
            format_ratio(row.vs_floor),
            format_ratio(row.vs_rslock),
        );
    }
    let _ = writeln!(
        out,
        "\n{:<44} {:>8} {:>9}  result",
        "target (distlock)", "value", "limit"
    );
    let _ = writeln!(out, "{}", "-".repeat(72));
    for target in &targets {
        let (op, limit) = if target.op == INFO {
            ("", "-".to_owned())
        } else {
            (target.op, format!("{:.2}", target.limit))
        };
        let _ = writeln!(
            out,
            "{:<44} {:>8} {:>2} {:>6}  {}",
            target.name,
            target
                .value
                .map_or_else(|| "-".to_owned(), |value| format!("{value:.3}")),
            op,
            limit,
            target.verdict()
        );
    }
    let _ = writeln!(
        out,
        "note: rslock sends the floor's own two commands for an uncontended cycle, so it can only \
         be ~1.0 x distlock there (a cycle is two round trips for any lock whose release is \
         awaited); the two differ under contention (workload 2)"
    );
    let _ = writeln!(
        out,
        "\ncycle: {} cycles per round; contend: {} tasks x {} sections, {} ms critical section (spin \
         until acquired + 1 ms, yield_now between checks); parallel: {} tasks x {} cycles; {} rounds \
         after a warm-up, every contender once per round in rotated order (workload 1: in turns of \
         {CYCLE_BLOCK} cycles); median and min..max over rounds, ratios are medians of per-round \
         ratios; the longest-wait target is judged on the worst round",
        config.cycle_n,
        config.contend_tasks,
        config.contend_m,
        config.critical.as_secs_f64() * 1e3,
        config.parallel_tasks,
        config.parallel_k,
        config.rounds
    );
    let _ = writeln!(
        out,
        "backends: {} cycles per round per backend (manual API, one task); standalone = the private \
         server, cluster = 3 masters without replicas, redlock = 5 independent masters, all started \
         by the bench; redis CPU summed over every node; vs standalone = median of per-round ratios \
         of time per cycle",
        config.backends_n
    );
    let _ = writeln!(
        out,
        "runtimes: tokio current_thread for 1, 4 and 5, tokio multi_thread with {WORKERS} workers for 2 and 3; \
         idle spinners: {spinners_running} SCHED_IDLE threads keep the CPUs from halting during 1 and 5 \
         (DISTLOCK_BENCH_IDLE_SPIN=0 turns them off)"
    );
    let _ = writeln!(
        out,
        "hand-off gap: next holder's acquired-at - previous holder's release-start, for consecutive \
         sections of different holders"
    );
    if rows.is_empty() {
        // Only the fleet ran (`-- fleet`): an empty table, its skipped targets and notes on
        // workloads that did not run would only hide its own tables.
        out.clear();
    }
    if let Some(fleet) = &fleet {
        out.push_str(&fleet.render());
    }
    let _ = writeln!(
        out,
        "checks: overlapping sections {overlaps} (must be 0); keys left after cycle {}; keys left \
         after backends {}",
        keys_left.map_or_else(|| "not checked".to_owned(), |keys| keys.to_string()),
        keys_left_backends.map_or_else(|| "not checked".to_owned(), |keys| keys.to_string())
    );
    let _ = writeln!(
        out,
        "machine: {} cpus ({}), {}, redis {}, {}; load average {} before, {} after; total {:.1} s",
        machine.nproc,
        machine.cpu,
        machine.os,
        machine.redis_version,
        machine.rustc,
        machine.load_before,
        machine.load_after,
        total.as_secs_f64()
    );
    print!("{out}");

    // ---- JSON -------------------------------------------------------------------------------
    let results: Vec<serde_json::Value> = rows
        .iter()
        .map(|row| {
            serde_json::json!({
                "workload": row.workload,
                "contender": row.contender,
                "metric": row.metric,
                "unit": row.unit,
                "median": number(row.summary.median()),
                "min": number(row.summary.min()),
                "max": number(row.summary.max()),
                "ratio_to_floor": row.vs_floor.map(number),
                "ratio_to_rslock": row.vs_rslock.map(number),
                "rounds": row.summary.by_round.iter().copied().map(number).collect::<Vec<_>>(),
            })
        })
        .collect();
    let targets: Vec<serde_json::Value> = targets
        .iter()
        .map(|target| {
            serde_json::json!({
                "name": target.name,
                "value": target.value.map(number),
                "op": target.op,
                "limit": number(target.limit),
                "result": target.verdict(),
            })
        })
        .collect();
    let json = serde_json::json!({
        "command": "cargo bench --bench locks",
        "machine": {
            "nproc": machine.nproc,
            "cpu": machine.cpu,
            "os": machine.os,
            "redis_server": machine.redis_version,
            "rustc": machine.rustc,
            "load_average_before": machine.load_before,
            "load_average_after": machine.load_after,
        },
        "runtime": {
            "cycle": "tokio current_thread",
            "contend": format!("tokio multi_thread, {WORKERS} workers"),
            "parallel": format!("tokio multi_thread, {WORKERS} workers"),
            "backends": "tokio current_thread",
        },
        "config": {
            "rounds": config.rounds,
            "warm_up_rounds": 1,
            "cycle_n": config.cycle_n,
            "contend_tasks": config.contend_tasks,
            "contend_m": config.contend_m,
            "critical_section_us": u64::try_from(config.critical.as_micros()).unwrap_or(u64::MAX),
            "critical_section": "spin until acquired_at + 1 ms, yield_now between checks",
            "hand_off_gap": "next acquired_at - previous release_start, consecutive sections of different holders",
            "parallel_tasks": config.parallel_tasks,
            "parallel_k": config.parallel_k,
            "backends_n": config.backends_n,
            "backends": "standalone: the private server; cluster: 3 masters, no replicas; redlock: 5 independent masters",
            "redis": if server.is_some() { "private redis-server on a free port" } else { "REDIS_URL" },
            "rslock": true,
            "idle_spinners_during_cycle_and_backends": spinners_running,
        },
        "results": results,
        "targets": targets,
        "checks": {
            "overlapping_sections": overlaps,
            "keys_left_after_cycle": keys_left,
            "keys_left_after_backends": keys_left_backends,
        },
        "fleet": fleet,
        "total_seconds": number(total.as_secs_f64()),
    });
    let json = serde_json::to_string_pretty(&json).expect("the report is plain data");
    let target_dir = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"),
        std::path::PathBuf::from,
    );
    let path = target_dir.join("distlock-bench.json");
    match std::fs::create_dir_all(&target_dir).and_then(|()| std::fs::write(&path, json)) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(error) => eprintln!("could not write {}: {error}", path.display()),
    }

    // The runtimes (and their connections) go before the server does.
    drop(multi);
    drop(single);
    drop(backend_cluster);
    drop(backend_masters);
    drop(server);
    assert_eq!(
        overlaps, 0,
        "a lock let two holders in at once: see the contend rows"
    );
    assert_eq!(
        fleet.as_ref().map_or(0, |fleet| fleet.overlaps),
        0,
        "a lock let two holders in at once: see the fleet's OVERLAP lines and table"
    );
}
