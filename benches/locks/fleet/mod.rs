//! Workload 6, **fleet**: one lock contended by several OS processes, as a fleet of services
//! contends for it, where workload 2 (contend) has every task in one process.
//!
//! A run: `P` worker processes × `T` tasks each, every task doing `S` sections of 1 ms on the
//! same key (spin until acquired + 1 ms, `yield_now` between checks, as in workload 2). Each
//! worker is this bench binary started again with [`worker::WORKER_ENV`] set; it builds its own
//! tokio runtime (multi-thread, one worker thread per CPU, as `#[tokio::main]` does) and its own
//! lock client against the bench's `redis-server`, warms up on a key of its own, and says it is
//! ready; once all are, the bench gives them one start time and they begin together. The
//! configurations (`P`x`T`) are 8x1, 16x1 and 4x2; `S` = 25.
//!
//! Contenders, in rotated order within each round:
//! - `distlock`: `LockManager::acquire` (a timeout that never fires), then `release`;
//! - `SET NX PX + 100 ms poll`: what users write by hand: `SET key token NX PX ttl` until it
//!   answers OK, sleeping 100 ms after each refusal, and the compare-and-delete script to
//!   release; one multiplexed connection per process;
//! - `SET NX PX + 5 ms poll`: the same, polling 20 × as often;
//! - six floors, which are no locks but a ring of tasks handing the turn on with one message
//!   (see [`ring`]): `floor: PUBLISH per turn`, `floor: script per turn` and `floor: script +
//!   join per turn` (the script, and every turn asked for with one `RPUSHX` into a line: the
//!   least Redis work of a lock whose waiters, its releaser asking again among them, take a
//!   place at the back of the line, as every fleet worker here does) through
//!   redis-rs's connections, as distlock sends and waits, and `raw floor: PUBLISH`, `raw floor:
//!   script` and `raw floor: script + join` on sockets the tasks read and write themselves.
//!   distlock's gap and busy fraction are also printed as ratios to each floor's, measured in
//!   the same run: the absolute targets below were set on another machine.
//!
//! Every worker records, per section, its process, its task, and four [`monotonic_ns`] readings:
//! acquire called, acquire returned (`acquired`), release about to be called (`release_start`),
//! release returned. The figures, per configuration and contender (see [`stats`]):
//! - **changes holder / process**: the share of consecutive sections (in the order of
//!   `acquired`) whose task / process differs;
//! - **longest wait**: the longest acquire call, worst round;
//! - **cross-process hand-off gap**: `next.acquired − previous.release_start` over consecutive
//!   sections of different processes: how long the lock sits unused when it moves between
//!   processes, release round trip included; p50 and p99 over all rounds' hand-offs pooled;
//! - **commands per section**: the `INFO commandstats` calls (every command but the bench's own
//!   `INFO`) from the start signal to the last report, over the sections;
//! - **busy fraction**: Σ(`release_start − acquired`) ÷ (last `release_start` − first
//!   `acquired`): the share of the run the lock was in use rather than between holders;
//! - **overlaps**: sections acquired before an earlier one's `release_start`: a broken lock. They
//!   are printed, and fail the bench after the report.
//!
//! Targets (judged on distlock, printed, never asserted but for overlaps): ≥ 90 % of consecutive
//! sections change holder (with one task per process: change process); longest wait ≤ 40 ms at
//! P = 8 and ≤ 80 ms at P = 16; ≤ 6 commands per section at P = 8 and P = 16; cross-process
//! hand-off gap p50 ≤ 0.2 ms; busy fraction ≥ 0.85; no overlap.

pub(crate) mod family;
mod hand_written;
mod processes;
mod render;
mod ring;
mod stats;
mod worker;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use processes::Workers;
use stats::{Aggregate, RoundFigures};
use worker::WorkerSpec;

pub(crate) use worker::run_if_asked as run_worker_if_asked;

// Shared with the rest of the bench, so that every workload takes locks the same way.
use crate::{DISTLOCK, PREFIX, RESPONSE_TIMEOUT, TTL};

/// `CLOCK_MONOTONIC` in nanoseconds.
///
/// The one clock every process of this machine reads alike, so sections recorded by different
/// workers can be put in one order; std's `Instant` reads the same clock but cannot hand its
/// value to another process. Unlike `CLOCK_REALTIME` (`SystemTime`), it never jumps when the
/// wall clock is set, which would invent or hide overlaps.
// The workspace denies `unsafe_code`; reading that clock as a number takes the C call, and std
// offers no safe way to it.
#[allow(unsafe_code)]
pub(crate) fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec for the call's duration.
    let result = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut now) };
    assert_eq!(result, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    let (seconds, nanos) = (u64::try_from(now.tv_sec), u64::try_from(now.tv_nsec));
    let (Ok(seconds), Ok(nanos)) = (seconds, nanos) else {
        panic!("CLOCK_MONOTONIC read a negative time: {now:?}");
    };
    seconds * 1_000_000_000 + nanos
}

/// How a worker takes the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Lock {
    Distlock,
    /// `SET NX PX`, sleeping `interval_ms` after each refusal.
    Poll {
        interval_ms: u64,
    },
    /// No lock, a floor: the [`ring`], handing the turn on as `pass` says, on sockets the
    /// tasks own (`raw`) or through redis-rs's connections.
    Ring {
        pass: ring::Pass,
        raw: bool,
    },
    /// A semaphore, a read-write lock or several keys (see [`family`]).
    Family(family::Family),
    /// The family's poll baseline: what `family::Family::by_hand` says each section takes, by
    /// `SET NX PX`, sleeping `interval_ms` after each refusal.
    FamilyPoll {
        family: family::Family,
        interval_ms: u64,
    },
}

pub(crate) const POLL_100: &str = "SET NX PX + 100 ms poll";
pub(crate) const POLL_5: &str = "SET NX PX + 5 ms poll";
pub(crate) const RING_MESSAGE: &str = "floor: PUBLISH per turn";
pub(crate) const RING_SCRIPT: &str = "floor: script per turn";
pub(crate) const RAW_MESSAGE: &str = "raw floor: PUBLISH";
pub(crate) const RAW_SCRIPT: &str = "raw floor: script";
pub(crate) const RING_SCRIPT_JOIN: &str = "floor: script + join per turn";
pub(crate) const RAW_SCRIPT_JOIN: &str = "raw floor: script + join";

/// Every contender, in report order.
pub(crate) const CONTENDERS: [(&str, Lock); 9] = [
    (DISTLOCK, Lock::Distlock),
    (
        RING_SCRIPT_JOIN,
        Lock::Ring {
            pass: ring::Pass::ScriptThenJoin,
            raw: false,
        },
    ),
    (
        RING_SCRIPT,
        Lock::Ring {
            pass: ring::Pass::Script,
            raw: false,
        },
    ),
    (
        RING_MESSAGE,
        Lock::Ring {
            pass: ring::Pass::Publish,
            raw: false,
        },
    ),
    (
        RAW_SCRIPT_JOIN,
        Lock::Ring {
            pass: ring::Pass::ScriptThenJoin,
            raw: true,
        },
    ),
    (
        RAW_SCRIPT,
        Lock::Ring {
            pass: ring::Pass::Script,
            raw: true,
        },
    ),
    (
        RAW_MESSAGE,
        Lock::Ring {
            pass: ring::Pass::Publish,
            raw: true,
        },
    ),
    (POLL_100, Lock::Poll { interval_ms: 100 }),
    (POLL_5, Lock::Poll { interval_ms: 5 }),
];

/// One configuration: `processes` worker processes × `tasks` tasks each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub processes: usize,
    pub tasks: usize,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.processes, self.tasks)
    }
}

impl std::str::FromStr for Shape {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let parse = |part: Option<&str>| part.and_then(|n| n.trim().parse::<usize>().ok());
        let mut parts = text.split('x');
        match (parse(parts.next()), parse(parts.next()), parts.next()) {
            (Some(processes), Some(tasks), None) if processes > 0 && tasks > 0 => {
                Ok(Shape { processes, tasks })
            }
            _ => Err(format!("{text:?} is not PROCESSESxTASKS (e.g. 8x1)")),
        }
    }
}

/// Counts of the fleet workload.
#[derive(Debug, Clone)]
pub(crate) struct FleetConfig {
    pub shapes: Vec<Shape>,
    /// Sections per task (S).
    pub sections: usize,
    pub rounds: usize,
    pub critical: Duration,
}

impl FleetConfig {
    /// The defaults, each replaced by its variable when set: `DISTLOCK_BENCH_FLEET_SHAPES`
    /// (`8x1,16x1,4x2`), `DISTLOCK_BENCH_FLEET_SECTIONS` (25), `DISTLOCK_BENCH_FLEET_ROUNDS` (5, or
    /// 1 when `quick`).
    pub(crate) fn from_env(quick: bool) -> Self {
        fn var<T: std::str::FromStr>(name: &str) -> Option<T> {
            let text = std::env::var(name).ok()?;
            Some(
                text.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={text:?} is not a valid value")),
            )
        }
        let shapes = std::env::var("DISTLOCK_BENCH_FLEET_SHAPES")
            .unwrap_or_else(|_| "8x1,16x1,4x2".to_owned())
            .split(',')
            .map(|shape| shape.parse().unwrap_or_else(|error| panic!("{error}")))
            .collect();
        FleetConfig {
            shapes,
            sections: var("DISTLOCK_BENCH_FLEET_SECTIONS").unwrap_or(25),
            rounds: var("DISTLOCK_BENCH_FLEET_ROUNDS").unwrap_or(if quick { 1 } else { 5 }),
            critical: Duration::from_millis(1),
        }
    }
}

/// Everything the fleet workload measured: printed by [`FleetReport::render`], and written as
/// the `fleet` member of the bench's JSON.
#[derive(Debug, Serialize)]
pub(crate) struct FleetReport {
    pub configurations: Vec<String>,
    pub sections_per_task: usize,
    pub rounds: usize,
    pub critical_section_us: u128,
    pub definitions: BTreeMap<&'static str, &'static str>,
    pub results: Vec<FleetResult>,
    pub targets: Vec<FleetTarget>,
    /// Overlapping sections over every run, the warm-up runs' too: anything but 0 is a broken
    /// lock.
    pub overlaps: usize,
}

/// One contender in one configuration.
#[derive(Debug, Serialize)]
pub(crate) struct FleetResult {
    pub configuration: String,
    pub processes: usize,
    pub tasks_per_process: usize,
    pub contender: &'static str,
    pub summary: Aggregate,
    /// In the order they ran.
    pub rounds: Vec<RoundFigures>,
}

/// A target of the fleet workload, judged on distlock's figure.
#[derive(Debug, Serialize)]
pub(crate) struct FleetTarget {
    pub configuration: String,
    pub name: String,
    pub unit: &'static str,
    /// distlock's figure; `None` if it did not run.
    pub value: Option<f64>,
    /// `">="`, `"<="`, or `"info"` (shown, not judged: the target names no limit here).
    pub op: &'static str,
    pub limit: Option<f64>,
    pub result: &'static str,
    /// The same figure for the other contenders, for comparison.
    pub others: BTreeMap<&'static str, f64>,
}

/// The definitions written into the JSON, so that its figures can be read without the source.
const DEFINITIONS: [(&str, &str); 10] = [
    ("floors", "not locks: the turn goes round all tasks in a fixed ring, each task telling the next on its own channel, with a plain PUBLISH (floor: PUBLISH per turn) or from a script doing GET, LPOP, SET, PUBLISH (floor: script per turn), and with every turn first asked for by appending an entry to the line with one RPUSHX, as a lock's waiter takes its place (floor: script + join per turn), through redis-rs's connections; the raw floors do the same on sockets their tasks read and write themselves; the turn goes to the first task of every process in turn, then to the second of every process, and so on, so that every turn changes process; the first task of the first process starts with the turn"),
    ("clock", "CLOCK_MONOTONIC nanoseconds, read by every worker process (one clock per machine)"),
    ("section", "acquire, hold 1 ms (spin until acquired + 1 ms, yield_now between checks), release; sections ordered by acquired (acquire returned)"),
    ("holder_changes_pct / process_changes_pct", "consecutive sections whose task / process differs, % of all consecutive pairs; median over rounds"),
    ("longest_wait_ms", "longest acquire call (called -> acquired); worst round"),
    ("gap_p50_ms / gap_p99_ms", "next.acquired - previous.release_start over consecutive sections of different processes; percentiles over all rounds' hand-offs pooled"),
    ("commands_per_section", "INFO commandstats calls (all commands but the bench's INFO; commands run by a script count too, so an EVALSHA whose script calls GET and DEL is 3) from the start signal to the last report, / sections; median over rounds"),
    ("busy_fraction", "sum(release_start - acquired) / (last release_start - first acquired); median over rounds"),
    ("overlaps", "sections whose acquired is before the latest release_start of the sections acquired before them: a broken lock; summed over rounds, warm-up runs included"),
    ("start", "each worker connects and runs one cycle on a key of its own, prints ready; the bench then sends every worker one start time 100 ms ahead and each sleeps until then"),
];

/// Runs every configuration against the Redis at `url`, with the contenders that `includes`
/// accepts (by name).
pub(crate) fn run(url: &str, config: &FleetConfig, includes: impl Fn(&str) -> bool) -> FleetReport {
    let client = redis::Client::open(url).expect("bad Redis URL");
    let mut info = client
        .get_connection()
        .expect("fleet: cannot connect to Redis");
    let contenders: Vec<(&'static str, Lock)> = CONTENDERS
        .into_iter()
        .filter(|(name, _)| includes(name))
        .collect();
    // Not counted: loads every script the contenders use into Redis (distlock's acquire script
    // runs only once contended), so that no counted run pays a one-time `SCRIPT LOAD`.
    let warm_up = Shape {
        processes: 2,
        tasks: 1,
    };
    let mut warm_up_overlaps = 0;
    for (index, (contender, lock)) in contenders.iter().enumerate() {
        let name = format!("bench:fleet:{}:warm-up:{index}", std::process::id());
        let figures = run_once(
            url,
            &mut info,
            warm_up,
            *lock,
            &name,
            WARM_UP_SECTIONS,
            config,
        );
        for detail in &figures.overlap_details {
            eprintln!("fleet warm-up {contender}: OVERLAP: {detail}");
        }
        warm_up_overlaps += figures.overlaps;
    }
    let mut results = Vec::new();
    for &shape in &config.shapes {
        let started = std::time::Instant::now();
        let mut rounds: Vec<Vec<RoundFigures>> = contenders.iter().map(|_| Vec::new()).collect();
        for round in 0..config.rounds {
            for step in 0..contenders.len() {
                let index = (round + step) % contenders.len();
                let name = format!("bench:fleet:{}:{shape}:{index}:{round}", std::process::id());
                let lock = contenders[index].1;
                let figures = run_once(url, &mut info, shape, lock, &name, config.sections, config);
                for detail in &figures.overlap_details {
                    eprintln!("fleet {shape} {}: OVERLAP: {detail}", contenders[index].0);
                }
                rounds[index].push(figures);
            }
        }
        eprintln!(
            "fleet {shape} done in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        for ((contender, _), rounds) in contenders.iter().zip(rounds) {
            results.push(FleetResult {
                configuration: shape.to_string(),
                processes: shape.processes,
                tasks_per_process: shape.tasks,
                contender,
                summary: Aggregate::over(&rounds),
                rounds,
            });
        }
    }
    let targets = targets(&config.shapes, &results);
    FleetReport {
        configurations: config.shapes.iter().map(Shape::to_string).collect(),
        sections_per_task: config.sections,
        rounds: config.rounds,
        critical_section_us: config.critical.as_micros(),
        definitions: DEFINITIONS.into_iter().collect(),
        overlaps: warm_up_overlaps
            + results
                .iter()
                .map(|result| result.summary.overlaps)
                .sum::<usize>(),
        results,
        targets,
    }
}

/// Sections per task of a warm-up run: enough for each of its processes to wait at least once.
const WARM_UP_SECTIONS: usize = 5;

/// One run: `shape.processes` workers taking `lock` on `name`, `sections` per task, started
/// together.
fn run_once(
    url: &str,
    info: &mut redis::Connection,
    shape: Shape,
    lock: Lock,
    name: &str,
    sections: usize,
    config: &FleetConfig,
) -> RoundFigures {
    let (sections, commands) =
        run_sections(url, info, (shape, lock, false), name, sections, config);
    stats::analyse(sections, commands)
}

/// The sections of one run (see [`run_once`]) as the workers recorded them, and the Redis
/// commands of the run by name; with `sleep`, every section is held by sleeping (see
/// `worker::critical_section`).
fn run_sections(
    url: &str,
    info: &mut redis::Connection,
    (shape, lock, sleep): (Shape, Lock, bool),
    name: &str,
    sections: usize,
    config: &FleetConfig,
) -> (Vec<stats::Section>, BTreeMap<String, u64>) {
    let specs: Vec<WorkerSpec> = (0..shape.processes)
        .map(|process| WorkerSpec {
            url: url.to_owned(),
            lock,
            name: name.to_owned(),
            process,
            processes: shape.processes,
            tasks: shape.tasks,
            sections,
            critical_us: u64::try_from(config.critical.as_micros())
                .expect("a section of centuries"),
            sleep,
        })
        .collect();
    let mut workers = Workers::spawn(&specs);
    workers.wait_ready();
    let before = command_calls(info);
    workers.go();
    let reports = workers.reports();
    let after = command_calls(info);
    workers.wait_exit();

    let expected = shape.processes * shape.tasks * sections;
    let mut sections = Vec::with_capacity(expected);
    for (process, report) in reports.into_iter().enumerate() {
        assert_eq!(report.process, process, "fleet: reports came back mixed up");
        sections.extend(report.sections);
    }
    assert_eq!(
        sections.len(),
        expected,
        "fleet: sections missing from the reports"
    );
    let commands = after
        .into_iter()
        .filter(|(command, _)| command != "info")
        .filter_map(|(command, calls)| {
            let delta = calls - before.get(&command).copied().unwrap_or(0);
            (delta > 0).then_some((command, delta))
        })
        .collect();
    (sections, commands)
}

/// Calls so far by command, from `INFO commandstats` (`cmdstat_<name>:calls=N,...`).
fn command_calls(connection: &mut redis::Connection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(connection)
        .expect("fleet: INFO commandstats failed");
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|field| field.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// The targets of every configuration, judged on distlock's figures.
fn targets(shapes: &[Shape], results: &[FleetResult]) -> Vec<FleetTarget> {
    type Pick = fn(&Aggregate) -> f64;
    let mut targets = Vec::new();
    for shape in shapes {
        // With one task per process a change of holder is a change of process, and that is the
        // hand-off that matters between services; with more, a change of task is what FIFO
        // promises.
        let changes: (&'static str, Pick) = if shape.tasks == 1 {
            ("sections that change process", |a| a.process_changes_pct)
        } else {
            ("sections that change holder", |a| a.holder_changes_pct)
        };
        let wait_limit = match shape.processes {
            8 => Some(40.0),
            16 => Some(80.0),
            _ => None,
        };
        let commands_limit = matches!(shape.processes, 8 | 16).then_some(6.0);
        let rows: [(&'static str, &'static str, Pick, &'static str, Option<f64>); 6] = [
            (changes.0, "%", changes.1, ">=", Some(90.0)),
            (
                "longest wait (worst round)",
                "ms",
                |a| a.longest_wait_ms,
                "<=",
                wait_limit,
            ),
            (
                "cross-process hand-off gap p50",
                "ms",
                |a| a.gap_p50_ms,
                "<=",
                Some(0.2),
            ),
            (
                "Redis commands per section",
                "",
                |a| a.commands_per_section,
                "<=",
                commands_limit,
            ),
            ("busy fraction", "", |a| a.busy_fraction, ">=", Some(0.85)),
            (
                "overlapping sections",
                "",
                |a| a.overlaps as f64,
                "<=",
                Some(0.0),
            ),
        ];
        let of_shape: Vec<&FleetResult> = results
            .iter()
            .filter(|result| {
                result.processes == shape.processes && result.tasks_per_process == shape.tasks
            })
            .collect();
        for (name, unit, pick, op, limit) in rows {
            let value = of_shape
                .iter()
                .find(|result| result.contender == DISTLOCK)
                .map(|result| pick(&result.summary));
            let op = if limit.is_some() { op } else { "info" };
            let result = match (value, limit) {
                (None, _) => "SKIP",
                (Some(_), None) => "INFO",
                (Some(value), Some(limit))
                    if (op == ">=" && value >= limit) || (op == "<=" && value <= limit) =>
                {
                    "PASS"
                }
                (Some(_), Some(_)) => "MISS",
            };
            targets.push(FleetTarget {
                configuration: shape.to_string(),
                name: name.to_owned(),
                unit,
                value,
                op,
                limit,
                result,
                others: of_shape
                    .iter()
                    .filter(|result| result.contender != DISTLOCK)
                    .map(|result| (result.contender, pick(&result.summary)))
                    .collect(),
            });
        }
        // How far distlock is from what a message hand-off can do on this machine: the
        // absolute limits above were set on another machine, whose loopback and wake-ups may
        // be faster or slower.
        let summary = |contender: &str| {
            of_shape
                .iter()
                .find(|result| result.contender == contender)
                .map(|result| &result.summary)
        };
        let floors = CONTENDERS
            .iter()
            .filter(|(_, lock)| matches!(lock, Lock::Ring { .. }))
            .map(|(name, _)| *name);
        for floor_name in floors {
            let (Some(distlock), Some(floor)) = (summary(DISTLOCK), summary(floor_name)) else {
                continue;
            };
            let ratios = [
                (
                    format!("gap p50 / {floor_name}'s"),
                    distlock.gap_p50_ms / floor.gap_p50_ms,
                ),
                (
                    format!("busy fraction / {floor_name}'s"),
                    distlock.busy_fraction / floor.busy_fraction,
                ),
            ];
            for (name, value) in ratios {
                targets.push(FleetTarget {
                    configuration: shape.to_string(),
                    name,
                    unit: "",
                    value: Some(value),
                    op: "info",
                    limit: None,
                    result: "INFO",
                    others: BTreeMap::new(),
                });
            }
        }
    }
    targets
}
