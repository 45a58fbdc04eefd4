//! Where distlock stands: lock cycle, contention and parallel keys, next to the raw-Redis floor
//! and to rslock, all in one run against one private `redis-server`; and the same cycle over a
//! Redis Cluster and over Redlock, against servers the bench starts as well.
//!
//! ```text
//! cargo bench --bench locks                                # full run (1-2 minutes on 2 cores)
//! DISTLOCK_BENCH_QUICK=1 cargo bench --bench locks         # small counts, for development
//! REDIS_URL=redis://host:6379/ cargo bench --bench locks   # an existing server instead
//! DISTLOCK_BENCH_ONLY=cycle,parallel ...                   # some workloads only
//!                                       (cycle, contend, parallel, backends, replicas, fleet, renewals, deadlocks,
//!                                        semaphore, rwlock, transfers)
//! cargo bench --bench locks -- cycle parallel              # the same, as arguments
//! cargo bench --bench locks -- fleet                       # only the fleet workload (~60 s)
//! cargo bench --bench locks -- fleet --quick               # the same, 1 round (~35 s)
//! cargo bench --bench locks -- renewals                    # a renewal at 1 and 1 000 waiters
//! cargo bench --bench locks -- deadlocks                   # deadlock detection's cost per waiter
//! cargo bench --bench locks -- semaphore rwlock transfers  # the lock family across processes
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
//!      sends for an uncontended cycle: `SET NX PX`, then distlock's release of a lock held
//!      alone, which also names the lock's line (it deletes only when nobody waits). A
//!      diagnostic: the distance from it to distlock is client-side cost only, and from the
//!      floor to it the cost of that extra key;
//!    - `floor with distlock's work`: those same commands, with raw redis-rs, built the
//!      cheapest way (sized commands, `EVALSHA` by hash, the value in a reused buffer) and with
//!      none of distlock's structure, plus what distlock's promises make it do on every cycle,
//!      each in its plainest form: a `ConnectionManager` (reconnects by itself) per runtime,
//!      looked up for each command; a lock value naming its holder (UUID, host, pid, time); the
//!      key entered in and taken out of an in-process table with the time its turn lapses (the
//!      line that keeps a process's tasks in order); the process id read at the acquisition and
//!      at the release (the fork check); and a value that would clean up if the cycle were
//!      dropped (cancel safety's bookkeeping). Not a lock: a diagnostic. Its distance to
//!      distlock is what distlock's structure (acquisition machine, cancel-safe attempt,
//!      guard, meters) costs; rslock's to it, whether any lock that keeps those promises could
//!      be as fast as rslock on the machine;
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
//!    `SET NX PX` lock polling every 100 ms (and every 5 ms), and against floors that are
//!    no locks (a ring of tasks handing the turn on with one `PUBLISH`, or with one script doing
//!    an atomic hand-off's `GET`, `LPOP`, `SET`, `PUBLISH`, alone or followed by the `RPUSHX` of
//!    a releaser that asks again; through redis-rs's connections, and raw, on sockets the tasks
//!    read and write themselves); 5 rounds (quick: 1) after one
//!    uncounted 2x1 run per contender, contenders in rotated order within a round. Holder and
//!    process changes, longest wait, cross-process hand-off gap, Redis commands per section,
//!    busy fraction, overlaps: see `fleet/mod.rs`. Its figures are tables of their own and the
//!    `fleet` member of the JSON.
//!
//! 7. **renewals** — the Redis time of one waiter's renewal of its place in line, with 1 and
//!    with 1 000 waiters on one lock, each a manager of its own (see `renewals`); one run, its
//!    row printed after the others.
//!
//!    **deadlocks** (printed after `renewals`) — what deadlock detection costs a waiting
//!    section: 20 waiters on one held lock, holding nothing, then each holding a lock of its own
//!    in its scope; Redis commands and client CPU per waiter per second (see `deadlocks`).
//!
//! 8. **replicas** (row label `8 replicas`) — workload 1's cycle (one task, `N5` cycles per
//!    round, the `current_thread` runtime, idle spinners) against a master with one replica the
//!    bench starts: `floor` (its `SET NX PX` and compare-and-delete), `floor + WAIT 1` (the same
//!    with `WAIT 1 500` pipelined after the `SET`: the acknowledgement itself, by hand),
//!    `distlock, no wait` and `distlock wait_for_replicas(1)` (`manager.acquire` +
//!    `guard.release()`); rows: time per cycle, and the paired ratios `wait_for_replicas` vs the
//!    floor with `WAIT` and vs no wait. Skipped under `REDIS_URL`.
//!
//! 9. **semaphore**, **rwlock**, **transfers** (printed after the fleet) — the fleet's worker
//!    processes (16x1 by default) taking a semaphore of 4 permits, a read-write lock with 90 %
//!    readers (and with every section a writer), or two accounts out of 8 with `acquire_all`,
//!    each next to the mutex and the `floor: script + join per turn` ring in the same rounds:
//!    permit gap, busy permits, throughput, Redis commands per section, and their ratios (see
//!    `fleet::family`).
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
//! The modules: `contenders` (each lock under test, and the floor), `workloads` (one function per
//! workload, and what they share beyond their contenders), `statistics` (summaries, percentiles,
//! rotated rounds, hand-off figures), `cpu` (CPU time of this process and of Redis), `report`
//! (the rows, targets and machine, as text and JSON), `fleet` (the workload across processes),
//! `idle` (the idle spinners), `rslock` (the rslock contender); `main` reads the configuration,
//! starts the server, runs the selected workloads in order and writes the report.

mod contenders;
mod cpu;
mod deadlocks;
mod fleet;
mod idle;
mod renewals;
mod report;
// rslock's public API exists only with its `tokio-comp` feature (enabled in Cargo.toml).
mod rslock;
mod statistics;
mod workloads;

use std::time::{Duration, Instant};

use crate::report::{load_average, Machine, Results};
use crate::workloads::Bench;

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
const FLOOR_WORK: &str = "floor with distlock's work";
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
/// Workload 8's row label and contenders (`DISTLOCK_BENCH_ONLY=replicas` selects it).
const REPLICAS: &str = "8 replicas";
const FLOOR_WAIT: &str = "floor + WAIT 1";
const REPLICAS_NO_WAIT: &str = "distlock, no wait";
const REPLICAS_WAIT: &str = "distlock wait_for_replicas(1)";

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
    family: fleet::family::FamilyConfig,
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
            family: fleet::family::FamilyConfig::from_env(quick),
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

fn main() {
    // A worker process of the fleet workload: this binary, started again by the bench.
    if fleet::run_worker_if_asked() {
        return;
    }
    let started = Instant::now();
    let config = Config::from_env();
    let load_before = load_average();
    let mut bench = Bench::start(&config, started);

    let mut results = Results::default();
    if config.runs("cycle") {
        workloads::cycle(&mut bench, &config, &mut results);
    }
    if config.runs("contend") {
        workloads::contend(&bench, &config, &mut results);
    }
    if config.runs("parallel") {
        workloads::parallel(&mut bench, &config, &mut results);
    }
    if config.runs("backends") {
        workloads::backends(&mut bench, &config, &mut results);
    }
    if config.runs("replicas") {
        workloads::replicas(&mut bench, &config, &mut results);
    }
    if config.runs("fleet") {
        results.fleet = Some(workloads::fleet(&bench, &config));
    }
    let family: Vec<&'static str> = fleet::family::WORKLOADS
        .into_iter()
        .filter(|workload| config.runs(workload))
        .collect();
    if !family.is_empty() {
        results.family = Some(fleet::family::run(
            &bench.url,
            &config.fleet,
            &config.family,
            &family,
        ));
    }
    // Printed at once, after the workloads before it: not part of the report's tables.
    if config.runs("renewals") {
        renewals::renewals(&bench);
    }
    if config.runs("deadlocks") {
        deadlocks::deadlocks(&bench);
    }

    let targets = report::targets(&results.rows, &config);
    let machine = Machine::describe(bench.redis_version.clone(), load_before);
    let total = started.elapsed();
    print!(
        "{}",
        report::render(&config, &results, &targets, &machine, total)
    );
    let private_server = bench.server.is_some();
    report::write_json(&report::json(
        &config,
        &results,
        &targets,
        &machine,
        private_server,
        total,
    ));

    bench.shut_down();
    assert_eq!(
        results.overlaps, 0,
        "a lock let two holders in at once: see the contend rows"
    );
    assert_eq!(
        results.fleet.as_ref().map_or(0, |fleet| fleet.overlaps),
        0,
        "a lock let two holders in at once: see the fleet's OVERLAP lines and table"
    );
    assert_eq!(
        results.family.as_ref().map_or(0, |family| family.overlaps),
        0,
        "a lock of the family let in a section against its rule: see the OVERLAP lines"
    );
}
